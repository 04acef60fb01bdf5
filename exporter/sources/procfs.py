"""Per-process GPU memory from procfs: which processes hold DRM clients, how much device memory each
client holds (DRM fdinfo), and which systemd unit each of those processes belongs to (`/proc/PID/cgroup`).

Every function takes the procfs root (`/proc`, or the host's /proc mounted into a container, e.g.
`/host/proc`). Processes and fds come and go during a scan; a single process never makes a scan fail.
Only an unusable root raises `ProcfsUnavailable`.

Reading other users' `/proc/PID/fd` and `/proc/PID/fdinfo` needs root, or CAP_SYS_PTRACE plus
CAP_DAC_READ_SEARCH; without them those processes are counted in `ScanResult.unreadable`.

From a shell: `python -m exporter.sources.procfs [/proc]` prints one scan.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from exporter.parsers.fdinfo import DrmClient, device_memory_bytes, has_memory_keys, parse_fdinfo

DRM_MAJOR = 226
# A DRM fdinfo is ~1-2 KiB and a cgroup file a few hundred bytes; anything bigger is not what we expect.
MAX_FDINFO_BYTES = 64 * 1024
MAX_CGROUP_BYTES = 64 * 1024
# Unit types whose cgroups hold processes. Slices only group other units, so a process's unit is never a slice.
PROCESS_UNIT_SUFFIXES = (".service", ".scope", ".socket", ".mount", ".swap")
# A process that exits mid-scan makes its /proc entries fail with these; that is normal, not an error.
VANISHED_ERRNOS = frozenset({errno.ENOENT, errno.ESRCH})
DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM})
OPEN_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO (never found in a real procfs, but possible in a bad --path.procfs) must not hang.
OPEN_FILE = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK


class ProcfsUnavailable(Exception):
    """The procfs root itself cannot be used (missing, not a directory, unreadable, or not a proc filesystem)."""


@dataclass(frozen=True)
class ScanResult:
    """One pass over all processes. `device` keys are PCI addresses (`0000:03:00.0`) taken from
    `drm-pdev`; a client whose fdinfo has no `drm-pdev` (non-PCI DRM devices only) is keyed
    `226:<minor>` instead. Each DRM client counts once, for the lowest pid that holds it."""

    # device -> unit -> device-local bytes of the clients held by the unit's processes. A unit whose
    # processes hold clients on the device is present even at 0 bytes (e.g. no memory keys: kernel 6.1 i915).
    memory_by_device_unit: dict[str, dict[str, int]] = field(default_factory=dict)
    # device -> device-local bytes of all clients, including those of processes without a unit.
    memory_by_device: dict[str, int] = field(default_factory=dict)
    # device -> pid -> device-local bytes of the clients attributed to that pid.
    memory_by_device_pid: dict[str, dict[int, int]] = field(default_factory=dict)
    # pid -> systemd unit, for every pid in memory_by_device_pid; None: root cgroup or cgroup file unreadable.
    unit_by_pid: dict[int, str | None] = field(default_factory=dict)
    # device -> `drm-driver` (i915, xe, ...).
    driver_by_device: dict[str, str] = field(default_factory=dict)
    clients: int = 0  # distinct DRM clients
    drm_fds: int = 0  # DRM fds whose fdinfo was parsed (several may share one client)
    processes: int = 0  # process directories found
    # Processes not fully examined because a read failed: permission denied (the exporter lacks
    # CAP_SYS_PTRACE/CAP_DAC_READ_SEARCH) or any other error than the process or fd having gone.
    unreadable: int = 0
    # Processes that exited, or closed a DRM fd, during the scan: normal, not an error. (Other fds
    # closed between listing and stat are not counted: fds come and go all the time.)
    vanished: int = 0
    # False when DRM clients exist but none has memory keys (kernel 6.1 i915): the memory figures
    # are then all 0 and the caller needs another source. Meaningless when clients == 0.
    memory_keys_seen: bool = False


def scan_drm_clients(procfs: str = "/proc") -> ScanResult:
    """Scan every process under `procfs` for DRM clients; see `ScanResult`."""
    pids = list_pids(procfs)
    scan = _Scan(procfs)
    for pid in pids:
        scan.process(pid, scan.drm_fds_of(pid))
    return scan.result(len(pids))


class DrmClientScanner:
    """`scan_drm_clients` for every scrape, without walking every fd of every process each time.

    Finding the DRM fds means a stat of each fd of each process: most of a scan on a busy host. The
    scanner remembers which fds of a process are DRM fds. A process it has not seen is walked at once;
    a known one again after 0.5 to 1.5 times `rescan_seconds` (spread by pid, so that walks do not all
    fall on one scrape); in between only its DRM fds' fdinfo is read, which is what changes (its unit,
    from its cgroup file, is read again at its next walk too). So a DRM fd that an already known
    process opens shows up within 1.5 × `rescan_seconds`. Thread-safe (scans are serial).
    """

    def __init__(self, procfs: str = "/proc", rescan_seconds: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.procfs = procfs
        self.rescan_seconds = rescan_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._drm_fds: dict[int, tuple[float, list[tuple[str, int]]]] = {}  # pid -> (walk due, DRM fds)
        self._units: dict[int, str | None] = {}  # pid -> unit, read again at the pid's next walk

    def scan(self) -> ScanResult:
        with self._lock:
            pids = list_pids(self.procfs)
            now = self._clock()
            scan = _Scan(self.procfs, self._units)
            known: dict[int, tuple[float, list[tuple[str, int]]]] = {}
            for pid in pids:
                due, drm_fds = self._drm_fds.get(pid, (now, []))
                if now >= due:
                    drm_fds = scan.drm_fds_of(pid)
                    due = now + self.rescan_seconds * (0.5 + (pid % 16) / 16)
                    self._units.pop(pid, None)
                known[pid] = (due, drm_fds)
                scan.process(pid, drm_fds)
            self._drm_fds = known
            result = scan.result(len(pids))
            self._units = dict(result.unit_by_pid)
            return result


def list_pids(procfs: str) -> list[int]:
    """The pids under `procfs`, ascending; raises ProcfsUnavailable when there are none to be found."""
    try:
        names = os.listdir(procfs)
    except OSError as error:
        raise ProcfsUnavailable(f"cannot list {procfs}: {error.strerror}") from error
    pids = sorted(int(name) for name in names if name.isascii() and name.isdigit())
    if not pids:
        raise ProcfsUnavailable(f"{procfs} holds no process directories: not a proc filesystem")
    return pids


def unit_of_pid(procfs: str, pid: int) -> str | None:
    """The systemd unit of a process (see `unit_of_cgroup_path`); None when it is in the root cgroup or
    its cgroup file cannot be read (the process vanished, or permission denied)."""
    try:
        return unit_of_cgroup_file(read_text(f"{procfs}/{pid}/cgroup", MAX_CGROUP_BYTES))
    except OSError:
        return None


def unit_of_cgroup_file(text: str) -> str | None:
    """The systemd unit named by the text of a `/proc/PID/cgroup` file."""
    path = systemd_cgroup_path(text)
    return None if path is None else unit_of_cgroup_path(path)


def systemd_cgroup_path(text: str) -> str | None:
    """The cgroup path systemd manages, from a `/proc/PID/cgroup` file: the `name=systemd` line (cgroup
    v1 and hybrid), else the unified `0::` line (v2). On a v1 host the kernel still prints `0::/`, so
    a `name=systemd` path wins unless it is the root."""
    named: str | None = None
    unified: str | None = None
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, colon, path = rest.partition(":")
        if not colon:
            continue
        if controllers == "name=systemd":
            named = path
        elif hierarchy == "0" and controllers == "":
            unified = path
    if named is not None and named.strip("/") != "":
        return named
    return unified if unified is not None else named


def unit_of_cgroup_path(path: str) -> str | None:
    """The systemd unit a process in cgroup `path` belongs to, the way systemd itself reads the path
    (`cg_path_get_unit`, `cg_path_get_user_unit`): slices are skipped, and the first element below
    them is the unit.

    - `/system.slice/vllm-xpu-chat.service` -> `vllm-xpu-chat.service`.
    - Sub-cgroups a unit creates below itself belong to it, whatever their names:
      `/system.slice/foo.service/payload` -> `foo.service`.
    - User units: the innermost unit, i.e. the one the user's manager runs, not `user@UID.service`:
      `/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope` -> `x.scope`. These are user
      units (`systemctl --user`), so the same unit name run by two users is one name here.
    - Outside any unit (no unit name below the slices, e.g. `/docker/<id>`, a bare slice): the
      cgroup's last element. Login sessions are units: `.../user-1000.slice/session-3.scope`.
    - The root cgroup `/`: None.
    `..` elements (paths seen from inside another cgroup namespace) are skipped, and systemd's cgroup
    escaping (a leading `_`, as in `_cpu.service`) is undone.
    """
    elements = [element for element in path.strip().split("/") if element not in ("", ".", "..")]
    if not elements:
        return None
    unit, below = _first_unit(elements)
    if unit is None:
        return elements[-1]
    if unit.startswith("user@") and unit.endswith(".service"):
        user_unit, _ = _first_unit(below)
        if user_unit is not None:
            return user_unit
    return unit


def _first_unit(elements: list[str]) -> tuple[str | None, list[str]]:
    """The first element after the leading slices, if it names a unit, and the elements below it."""
    for index, element in enumerate(elements):
        if element.endswith(".slice"):
            continue
        if element.endswith(PROCESS_UNIT_SUFFIXES):
            return (element[1:] if element.startswith("_") else element), elements[index + 1:]
        return None, []
    return None, []


def read_text(path: str, limit: int, dir_fd: int | None = None) -> str:
    """At most `limit` bytes of a file, decoded leniently (process names may be any bytes)."""
    fd = os.open(path, OPEN_FILE, dir_fd=dir_fd)
    try:
        chunks: list[bytes] = []
        size = 0
        while size < limit:
            chunk = os.read(fd, limit - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


@dataclass(frozen=True)
class _HeldClient:
    device: str
    pid: int
    device_memory: int


class _Scan:
    """The state of one scan; only `scan_drm_clients` uses it."""

    def __init__(self, procfs: str, known_units: dict[int, str | None] | None = None) -> None:
        self.procfs = procfs
        self.known_units = known_units or {}
        self.clients: dict[Hashable, _HeldClient] = {}
        self.drivers: dict[str, str] = {}
        self.drm_fds = 0
        self.memory_keys_seen = False
        self.unreadable: set[int] = set()
        self.vanished: set[int] = set()

    def failed(self, pid: int, error: OSError) -> None:
        (self.vanished if error.errno in VANISHED_ERRNOS else self.unreadable).add(pid)

    def process(self, pid: int, drm_fds: list[tuple[str, int]]) -> None:
        if not drm_fds:
            return
        try:
            fdinfo_dir = os.open(f"{self.procfs}/{pid}/fdinfo", OPEN_DIRECTORY)
        except OSError as error:
            self.failed(pid, error)
            return
        try:
            for fd, minor in drm_fds:
                try:
                    text = read_text(fd, MAX_FDINFO_BYTES, dir_fd=fdinfo_dir)
                except OSError as error:
                    self.failed(pid, error)
                    continue
                client = parse_fdinfo(text)
                if client is not None:
                    self.add(pid, fd, minor, client)
        finally:
            os.close(fdinfo_dir)

    def drm_fds_of(self, pid: int) -> list[tuple[str, int]]:
        """(fd, device minor) of the process's fds that are DRM character devices."""
        try:
            fd_dir = os.open(f"{self.procfs}/{pid}/fd", OPEN_DIRECTORY)
        except OSError as error:
            self.failed(pid, error)
            return []
        drm_fds = []
        try:
            fds = os.listdir(fd_dir)
            for fd in fds:
                try:
                    # Follows the fd's magic link to the file it has open, wherever it is mounted.
                    target = os.stat(fd, dir_fd=fd_dir)
                except OSError as error:
                    if error.errno in VANISHED_ERRNOS:
                        continue  # fds open and close all the time; one closed since the listing is no news
                    self.failed(pid, error)
                    if error.errno in DENIED_ERRNOS:
                        break  # the kernel checks access per process: the other fds are denied too
                    continue
                if stat.S_ISCHR(target.st_mode) and os.major(target.st_rdev) == DRM_MAJOR:
                    drm_fds.append((fd, os.minor(target.st_rdev)))
        except OSError as error:
            self.failed(pid, error)
        finally:
            os.close(fd_dir)
        return drm_fds

    def add(self, pid: int, fd: str, minor: int, client: DrmClient) -> None:
        self.drm_fds += 1
        device = client.pdev or f"{DRM_MAJOR}:{minor}"
        # drm-client-id is unique per device (i915 on 6.1) or globally (6.2+); without one, each fd counts.
        key: Hashable = (device, client.client_id) if client.client_id is not None else (device, pid, fd)
        self.drivers.setdefault(device, client.driver)
        self.memory_keys_seen = self.memory_keys_seen or has_memory_keys(client)
        # Pids are scanned in ascending order, so the first holder seen is the lowest pid.
        if key not in self.clients:
            self.clients[key] = _HeldClient(device, pid, device_memory_bytes(client))

    def unit_of(self, pid: int) -> str | None:
        if pid in self.known_units:
            return self.known_units[pid]
        try:
            return unit_of_cgroup_file(read_text(f"{self.procfs}/{pid}/cgroup", MAX_CGROUP_BYTES))
        except OSError as error:
            self.failed(pid, error)
            return None

    def result(self, processes: int) -> ScanResult:
        memory_by_device_pid: dict[str, dict[int, int]] = {}
        for held in self.clients.values():
            by_pid = memory_by_device_pid.setdefault(held.device, {})
            by_pid[held.pid] = by_pid.get(held.pid, 0) + held.device_memory
        unit_by_pid = {pid: self.unit_of(pid) for pid in sorted({held.pid for held in self.clients.values()})}
        memory_by_device_unit: dict[str, dict[str, int]] = {}
        memory_by_device: dict[str, int] = {}
        for device, by_pid in memory_by_device_pid.items():
            by_unit = memory_by_device_unit.setdefault(device, {})
            memory_by_device[device] = sum(by_pid.values())
            for pid, bytes_ in by_pid.items():
                unit = unit_by_pid[pid]
                if unit is not None:
                    by_unit[unit] = by_unit.get(unit, 0) + bytes_
        return ScanResult(
            memory_by_device_unit=memory_by_device_unit,
            memory_by_device=memory_by_device,
            memory_by_device_pid=memory_by_device_pid,
            unit_by_pid=unit_by_pid,
            driver_by_device=dict(self.drivers),
            clients=len(self.clients),
            drm_fds=self.drm_fds,
            processes=processes,
            unreadable=len(self.unreadable),
            vanished=len(self.vanished),
            memory_keys_seen=self.memory_keys_seen,
        )


def main(argv: list[str]) -> int:
    procfs = argv[1] if len(argv) > 1 else "/proc"
    try:
        result = scan_drm_clients(procfs)
    except ProcfsUnavailable as error:
        print(f"procfs unavailable: {error}", file=sys.stderr)
        return 1
    for name, value in vars(result).items():
        print(f"{name}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
