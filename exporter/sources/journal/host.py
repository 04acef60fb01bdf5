"""What the journal reader needs to know of its own host and process: the running boot's id (``boot="current"``)
and the service unit it runs in (the exporter's and the gate's own unit is never watched)."""

from __future__ import annotations

from pathlib import Path

from vllm_xpu_exporter.parsers.cgroup import unit_of_cgroup_file
from vllm_xpu_exporter.sources.logs.entry import normalize_boot

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
OWN_CGROUP_PATH = "/proc/self/cgroup"


def own_service_unit(cgroup_file_text: str) -> str | None:
    """The service unit a process runs in, from the text of its ``/proc/self/cgroup`` (cgroup v1 or v2;
    inside a cgroup namespace the path may begin with ``..``: ``0::/../system.slice/x.service``); None
    when it runs in no service (a login session's scope, a container's own cgroup, the root)."""
    unit = unit_of_cgroup_file(cgroup_file_text)
    return unit if unit is not None and unit.endswith(".service") else None


def read_own_service_unit(path: str = OWN_CGROUP_PATH) -> str | None:
    """``own_service_unit`` of this process; None also when its cgroup file cannot be read."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    return own_service_unit(text)


def current_boot_id(path: str = BOOT_ID_PATH) -> str:
    """The running kernel's boot id as 32 lower-case hex digits."""
    return normalize_boot(Path(path).read_text().strip())
