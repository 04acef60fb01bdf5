"""A memory limit for a process and everything it starts, as systemd's MemoryMax= sets one: a memory cgroup
(cgroup v1 /sys/fs/cgroup/memory, or v2 with the memory controller). Beyond the limit the kernel reclaims,
then OOM-kills inside the cgroup, for real.

    with MemoryLimit("demo", 512 << 20) as limit:
        subprocess.run(limit.wrap(["python3", "-c", "..."]))   # runs inside the cgroup
        limit.oom_kills()                                      # how many processes the kernel killed there

Needs root. `peak_rss(pid)` reads a process's own high-water mark of resident memory (VmHWM), which
counts what it held, not the page cache the cgroup also charges.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from taskslimit import remove_cgroup

V1_MEMORY_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup")
_names = itertools.count()


class MemoryLimitUnavailable(Exception):
    """No memory cgroup can be made here (not root, or no memory controller)."""


def _hierarchy() -> tuple[Path, bool]:
    """The directory under which a memory cgroup can be created, and whether it is cgroup v2."""
    if os.geteuid() != 0:
        raise MemoryLimitUnavailable("creating a cgroup needs root")
    if (V1_MEMORY_ROOT / "cgroup.procs").exists():
        return V1_MEMORY_ROOT, False
    controllers = V2_ROOT / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        subtree = V2_ROOT / "cgroup.subtree_control"
        if "memory" not in subtree.read_text().split():
            subtree.write_text("+memory")
        return V2_ROOT, True
    raise MemoryLimitUnavailable("no memory cgroup controller (cgroup v1 memory or v2 with memory)")


class MemoryLimit:
    def __init__(self, name: str, limit_bytes: int) -> None:
        root, self.v2 = _hierarchy()
        self.path = root / f"{name}-{os.getpid()}-{next(_names)}"
        self.path.mkdir()
        (self.path / ("memory.max" if self.v2 else "memory.limit_in_bytes")).write_text(str(limit_bytes))

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run inside the cgroup: a shell moves itself in, then execs it (same pid)."""
        return ["sh", "-c", f'echo $$ > {self.path / "cgroup.procs"} && exec "$@"', "sh", *argv]

    def oom_kills(self) -> int:
        """Processes the kernel killed in the cgroup for its limit."""
        if self.v2:
            events = (self.path / "memory.events").read_text()
            return next((int(line.split()[1]) for line in events.splitlines() if line.startswith("oom_kill ")), 0)
        control = (self.path / "memory.oom_control").read_text()
        return next((int(line.split()[1]) for line in control.splitlines() if line.startswith("oom_kill ")), 0)

    def close(self) -> None:
        remove_cgroup(self.path)

    def __enter__(self) -> MemoryLimit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def peak_rss(pid: int) -> int:
    """The most resident memory process `pid` has held, in bytes (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no VmHWM for {pid}")
