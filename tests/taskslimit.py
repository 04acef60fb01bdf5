"""A task limit the way systemd's `TasksMax=` sets one: a pids cgroup with `pids.max`, joined by the process
before it starts (so every thread and child it makes counts). `prlimit --nproc` would not do: it does
nothing for root.

    with tasks_max(64) as limit:
        RunningExporter(args, command=[*limit.command_prefix, sys.executable, "-m", "exporter"])

`command_prefix` is a shell that writes its own pid to the cgroup's `cgroup.procs` and then execs the command, so
the command runs with the same pid, inside the cgroup from its first instruction. Works with the pids
controller of cgroup v2 (enabled in the root's subtree_control if need be) or of cgroup v1; needs root.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


class TasksLimitUnavailable(RuntimeError):
    pass


def _pids_hierarchy() -> Path:
    """The directory under which a child cgroup with a pids.max can be made."""
    controllers = CGROUP_ROOT / "cgroup.controllers"
    if controllers.exists():  # cgroup v2 mounted at /sys/fs/cgroup
        if "pids" not in controllers.read_text().split():
            raise TasksLimitUnavailable("the cgroup v2 hierarchy has no pids controller")
        subtree = CGROUP_ROOT / "cgroup.subtree_control"
        if "pids" not in subtree.read_text().split():
            subtree.write_text("+pids")
        return CGROUP_ROOT
    v1 = CGROUP_ROOT / "pids"
    if (v1 / "cgroup.procs").exists():  # hybrid or legacy layout: the v1 pids hierarchy
        return v1
    raise TasksLimitUnavailable("no pids cgroup controller is mounted under /sys/fs/cgroup")


@dataclass(frozen=True)
class TasksLimit:
    path: Path  # the cgroup's directory

    @property
    def command_prefix(self) -> list[str]:
        """Runs the command that follows inside the cgroup, with the shell's pid."""
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.path)]

    def peak(self) -> int | None:
        """The most tasks the cgroup has held (pids.peak; None on kernels without it)."""
        try:
            return int((self.path / "pids.peak").read_text())
        except (OSError, ValueError):
            return None

    def events_max(self) -> int:
        """How many times a fork or thread creation was refused for the limit (pids.events `max`)."""
        for line in (self.path / "pids.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "max":
                return int(value)
        return 0


@contextmanager
def tasks_max(limit: int) -> Iterator[TasksLimit]:
    """A fresh pids cgroup limited to `limit` tasks. Raises TasksLimitUnavailable when no pids cgroup can
    be made here (not root, no controller)."""
    if os.geteuid() != 0:
        raise TasksLimitUnavailable("making a cgroup needs root")
    try:
        cgroup = _pids_hierarchy() / f"vllm-xpu-exporter-test-{uuid.uuid4().hex[:12]}"
        cgroup.mkdir()
    except OSError as error:
        raise TasksLimitUnavailable(f"cannot make a pids cgroup: {error}") from None
    try:
        (cgroup / "pids.max").write_text(str(limit))
        yield TasksLimit(cgroup)
    finally:
        deadline = time.monotonic() + 10
        while (cgroup / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)  # the command is being stopped by its owner
        try:
            cgroup.rmdir()
        except OSError:
            pass


def cgroup_of(pid: int) -> str:
    """The /proc/PID/cgroup text: shows which cgroup a process is in."""
    return Path(f"/proc/{pid}/cgroup").read_text()
