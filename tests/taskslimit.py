"""A task limit for a process and everything it starts, as systemd's TasksMax= sets one: a pids cgroup
(`prlimit --nproc` does nothing for root). Creating a thread or a process beyond the limit fails with
EAGAIN, for real: Python raises RuntimeError("can't start new thread") or BlockingIOError.

    with TaskLimit("demo", 1) as limit:
        subprocess.run(limit.wrap(["python3", "-c", "..."]))   # runs inside the cgroup
        limit.set_max(None)                                    # lift the limit

Needs root and the pids controller (cgroup v1 /sys/fs/cgroup/pids, or v2 with pids enabled).
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

V1_PIDS_ROOT = Path("/sys/fs/cgroup/pids")
V2_ROOT = Path("/sys/fs/cgroup")
_names = itertools.count()


class TaskLimitUnavailable(Exception):
    """No pids cgroup can be made here (not root, or no pids controller)."""


def pids_hierarchy() -> Path:
    """The directory under which a pids cgroup can be created."""
    if os.geteuid() != 0:
        raise TaskLimitUnavailable("creating a cgroup needs root")
    if (V1_PIDS_ROOT / "cgroup.procs").exists():
        return V1_PIDS_ROOT
    controllers = V2_ROOT / "cgroup.controllers"
    if controllers.exists() and "pids" in controllers.read_text().split():
        subtree = V2_ROOT / "cgroup.subtree_control"
        if "pids" not in subtree.read_text().split():
            subtree.write_text("+pids")
        return V2_ROOT
    raise TaskLimitUnavailable("no pids cgroup controller (cgroup v1 pids or v2 with pids)")


class TaskLimit:
    def __init__(self, name: str, max_tasks: int | None) -> None:
        self.path = pids_hierarchy() / f"{name}-{os.getpid()}-{next(_names)}"
        self.path.mkdir()
        self.set_max(max_tasks)

    def set_max(self, max_tasks: int | None) -> None:
        """At most this many tasks (processes and threads) in the cgroup; None: no limit."""
        (self.path / "pids.max").write_text("max" if max_tasks is None else str(max_tasks))

    @property
    def current(self) -> int:
        return int((self.path / "pids.current").read_text())

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run inside the cgroup: a shell moves itself in, then execs it (no fork, so no task is needed)."""
        return ["sh", "-c", f'echo $$ > {self.path / "cgroup.procs"} && exec "$@"', "sh", *argv]

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

    def close(self) -> None:
        remove_cgroup(self.path)

    def __enter__(self) -> TaskLimit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remove_cgroup(path: Path) -> None:
    """Kill what is left in the cgroup `path`, then remove it."""
    deadline = time.monotonic() + 10
    while (pids := (path / "cgroup.procs").read_text().split()) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    path.rmdir()


def cgroup_of(pid: int) -> str:
    """The /proc/PID/cgroup text: shows which cgroup a process is in."""
    return Path(f"/proc/{pid}/cgroup").read_text()
