"""Per-process GPU memory from procfs: which processes hold DRM clients, how much device memory each
client holds (DRM fdinfo), and which systemd unit each of those processes belongs to (`/proc/PID/cgroup`,
read by `vllm_xpu_exporter.parsers.cgroup`).

Every function takes the procfs root (`/proc`, or the host's /proc mounted into a container, e.g.
`/host/proc`). Processes and fds come and go during a scan; a single process never makes a scan fail.
Only an unusable root raises `ProcfsUnavailable`.

Reading other users' `/proc/PID/fd` and `/proc/PID/fdinfo` needs root, or CAP_SYS_PTRACE plus
CAP_DAC_READ_SEARCH; without them those processes are counted in `ScanResult.unreadable`. Their
`/proc/PID/cgroup` is world-readable, so their units are still known (`ScanResult.unit_cgroups`): the
dmem cgroup controller (`vllm_xpu_exporter.sources.dmem`) can tell those units' device memory without ptrace.

From a shell: `python -m vllm_xpu_exporter.sources.procfs [/proc]` prints one scan.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import operator
import os
import resource
import stat
import sys
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from vllm_xpu_exporter import capabilities
from vllm_xpu_exporter.parsers.cgroup import UnitCgroup, systemd_cgroup_path, unit_cgroup_of_path
from vllm_xpu_exporter.parsers.fdinfo import DrmClient, EngineColumns, FdinfoLayout, parse_engine_use, parse_fdinfo

log = logging.getLogger("vllm_xpu_exporter.procfs")

DEFAULT_PROCFS = "/proc"  # --path.procfs
DRM_MAJOR = 226
# A DRM fdinfo is ~1-2 KiB and a cgroup file a few hundred bytes; anything bigger is not what we expect.
MAX_FDINFO_BYTES = 64 * 1024
MAX_CGROUP_BYTES = 64 * 1024
MAX_STAT_BYTES = 4096
# /proc/PID/stat: field 22, starttime (in clock ticks after boot), is the 20th after the `(comm)` field.
STAT_STARTTIME_AFTER_COMM = 19
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# One read takes a whole fdinfo or cgroup file; a bigger one takes more.
FIRST_READ_BYTES = 4096
# A process that exits mid-scan makes its /proc entries fail with these; that is normal, not an error.
VANISHED_ERRNOS = frozenset({errno.ENOENT, errno.ESRCH})
DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM})
OPEN_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO (never found in a real procfs, but possible in a bad --path.procfs) must not hang.
OPEN_FILE = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
# A walk looks at a process's lowest-numbered fds only (a vLLM process opens the GPU early, among its first
# few dozen fds), and a scan walks processes until it has looked at this many fds: the rest are walked at
# the next scan. One process with ~20,000 fds used to make every scan stat each of them (~0.9 s).
MAX_FDS_PER_PROCESS = 2048
MAX_FDS_PER_SCAN = 16384
UNREADABLE_PIDS_NAMED = 5  # a warning about unreadable processes names at most this many


class ProcfsUnavailable(Exception):
    """The procfs root itself cannot be used (missing, not a directory, unreadable, or not a proc filesystem)."""


@dataclass
class UnitEngineUse:
    """The engine counters of a unit's DRM clients on one device, by the driver's engine key: busy
    seconds and cycles summed over the clients, total cycles the largest of them. A client that goes
    takes its share with it, so a sum can go down when a process exits or closes a client."""

    busy_seconds: dict[str, float] = field(default_factory=dict)
    cycles: dict[str, int] = field(default_factory=dict)
    total_cycles: dict[str, int] = field(default_factory=dict)

    def add(self, columns: EngineColumns) -> None:
        """Add the counters of one or more clients (`EngineUse.columns()`, `FdinfoLayout.engine_columns`);
        busy seconds are summed in the clients' order."""
        busy_seconds, cycles, total_cycles = columns
        for engine, seconds in busy_seconds:
            self.busy_seconds[engine] = functools.reduce(operator.add, seconds, self.busy_seconds.get(engine, 0.0))
        for engine, counts in cycles:
            self.cycles[engine] = self.cycles.get(engine, 0) + sum(counts)
        for engine, counts in total_cycles:
            self.total_cycles[engine] = max(self.total_cycles.get(engine, 0), *counts)


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
    # unit -> the unit's cgroup paths (`UnitCgroup.path`), for the units of the pids in unit_by_pid and of
    # the processes that could not be read (`unreadable`; their cgroup file is read once per walk).
    unit_cgroups: dict[str, frozenset[str]] = field(default_factory=dict)
    # device -> unit -> engine counters of the unit's clients (each client once, as for memory); a unit
    # whose clients print no engine keys has an empty UnitEngineUse.
    engines_by_device_unit: dict[str, dict[str, UnitEngineUse]] = field(default_factory=dict)
    # device -> `drm-driver` (i915, xe, ...).
    driver_by_device: dict[str, str] = field(default_factory=dict)
    clients: int = 0  # distinct DRM clients
    # DRM fds whose client was read (several may share one client: a process's fds of one client are
    # found at its walk, and the client is read through one of them)
    drm_fds: int = 0
    processes: int = 0  # process directories found
    # Processes not fully examined because a read failed: permission denied (the exporter lacks
    # CAP_SYS_PTRACE/CAP_DAC_READ_SEARCH) or any other error than the process or fd having gone.
    unreadable: int = 0
    unreadable_pids: tuple[int, ...] = ()  # the lowest UNREADABLE_PIDS_NAMED of them, to name in a warning
    # when some were: whether the process that read (this one, or the privileged reader) was root / held both
    # capabilities (False when every process was read)
    reader_root: bool = False
    reader_capable: bool = False
    # Processes that exited, or closed a DRM fd, during the scan: normal, not an error. (Other fds
    # closed between listing and stat are not counted: fds come and go all the time.)
    vanished: int = 0
    # False when DRM clients exist but none has memory keys (kernel 6.1 i915): the memory figures
    # are then all 0 and the caller needs another source. Meaningless when clients == 0.
    memory_keys_seen: bool = False
    # fds beyond MAX_FDS_PER_PROCESS of a process walked in this scan: not looked at (their DRM clients unseen)
    fds_skipped: int = 0
    # processes due for a walk that this scan put off to the next, its MAX_FDS_PER_SCAN fds being looked at
    walks_deferred: int = 0


def scan_drm_clients(procfs: str = DEFAULT_PROCFS) -> ScanResult:
    """Scan every process under `procfs` for DRM clients; see `ScanResult`. Each process's fds are bounded
    (MAX_FDS_PER_PROCESS), not the scan's: no later scan walks what this one would put off."""
    # once: no process's age matters
    scanner = DrmClientScanner(procfs, young_seconds=0, max_held_fds=0, max_fds_per_scan=sys.maxsize)
    try:
        return scanner.scan()
    finally:
        scanner.close()


def devices_of_units(procfs: str = DEFAULT_PROCFS) -> dict[str, set[str]]:
    """unit -> the GPUs its processes hold DRM clients with memory on, from one scan; {} when `procfs` cannot
    be scanned (the gate and the planner then know no unit's GPU)."""
    try:
        return devices_in(scan_drm_clients(procfs))
    except ProcfsUnavailable:
        return {}


def devices_in(scan: ScanResult) -> dict[str, set[str]]:
    """unit -> the GPUs its processes hold DRM clients with memory on, in `scan`."""
    devices: dict[str, set[str]] = {}
    for device, units in scan.memory_by_device_unit.items():
        for unit in units:
            devices.setdefault(unit, set()).add(device)
    return devices


class DrmClientScanner:
    """`scan_drm_clients` for every scrape, without walking every fd of every process each time, and
    re-reading the DRM fds' fdinfo through files it keeps open.

    Finding the DRM fds means a stat of each fd of each process: most of a scan on a busy host. The
    scanner walks a process's fd table at every scan while the process is younger than `young_seconds`
    (a vLLM process opens the GPU some seconds after it starts, after its imports), then after 0.5 to 1.5 times
    `rescan_seconds` (spread by pid, so that walks do not all fall on one scrape; at a 15 s scrape
    interval a settled process is walked at every fourth scrape or so, not at every one); in between
    it reads only the fdinfo of the DRM clients it found, which is what changes: through one fd per
    client (a client's dup'd fds say the same). A DRM fd that a young process opens shows up at the
    next scan, one that a settled process opens within 1.5 × `rescan_seconds`; one it closes, at once.

    The fdinfo files read stay open between scans (at most `max_held_fds`, by default a quarter of the
    soft RLIMIT_NOFILE; they count in process_open_fds) and are re-read with pread at offset 0: the
    kernel generates the text again on each such read. Nothing read is trusted across scans: an open /proc/PID/fdinfo/N
    belongs to the process it was opened in, not to the pid, so once that process has exited (its pid
    reused or not) or closed fd N, the read fails (ENOENT); when N has been reused for another file,
    the text says so (no `drm-driver`, or a `drm-client-id` and `drm-pdev` of its own). Any of these
    walks the process again at once, as if it were new, so a scan sees what a full scan would. (A tree
    that is not procfs cannot fail a read of a removed file: tests/fakeprocfs.py empties a closed fd's
    fdinfo instead, which reads as no DRM fd.) A process's unit (its cgroup file) is read once per walk.

    Each read is parsed afresh, through the layout of the client's fdinfo (`FdinfoLayout`, learnt at
    the walk, or kept from the walk before when it still matches): one regex match instead of the two
    general passes over the text. A read the layout does not match is parsed the general way, and so
    are the client's reads until the process's next walk. The engine counters of a unit's clients read
    with one layout are summed together (`unit_engine_use`).
    Thread-safe (scans are serial).
    """

    def __init__(self, procfs: str = DEFAULT_PROCFS, rescan_seconds: float = 60.0, young_seconds: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, max_held_fds: int | None = None,
                 max_fds_per_process: int = MAX_FDS_PER_PROCESS, max_fds_per_scan: int = MAX_FDS_PER_SCAN) -> None:
        self.procfs = procfs
        self.max_fds_per_process = max_fds_per_process
        self.max_fds_per_scan = max_fds_per_scan
        self.rescan_seconds = rescan_seconds
        self.young_seconds = young_seconds
        self._clock = clock
        self._max_held = default_max_held_fds() if max_held_fds is None else max_held_fds
        self._held = 0
        self._lock = threading.Lock()
        self._processes: dict[int, _Process] = {}
        self._last_layout: FdinfoLayout | None = None  # the layout a new client's fdinfo most likely has
        self._last_cut = (0, 0)  # the last scan's (fds_skipped, walks_deferred), logged when they change

    def scan(self) -> ScanResult:
        with self._lock:
            try:
                pids = list_pids(self.procfs)
            except ProcfsUnavailable:
                self._release_all()  # nothing known of any process holds any more
                raise
            now = self._clock()
            scan = _Scan(self.procfs, self.max_fds_per_process)
            previous, self._processes = self._processes, {}
            try:
                for pid in pids:
                    process = previous.pop(pid, None)
                    if process is not None and now < process.walk_due and self._read(scan, pid, process):
                        if process.unreadable:
                            scan.unreadable.add(pid)  # as at its walk: a process that could not be read still cannot
                    elif scan.fds_examined >= self.max_fds_per_scan:
                        scan.walks_deferred += 1
                        if process is not None:
                            self._release(process)
                        process = _Process(walk_due=now)  # walked at the next scan
                    else:
                        process = self._walk(scan, pid, process, now)
                    self._processes[pid] = process
            finally:
                for gone in previous.values():
                    self._release(gone)
            cut = (scan.fds_skipped, scan.walks_deferred)
            if cut != self._last_cut and any(cut):
                log.warning("DRM client scan bounded: %d fds beyond the first %d of a process not looked at, "
                            "%d processes' walks put off to the next scan (%d fds looked at per scan)",
                            cut[0], self.max_fds_per_process, cut[1], self.max_fds_per_scan)
            self._last_cut = cut
            return scan.result(len(pids), self._processes)


    def unit_cgroup_of(self, pid: int) -> UnitCgroup | None:
        """`unit_of` with the unit's cgroup path."""
        with self._lock:
            process = self._processes.get(pid)
            if process is None or not process.drm_fds:
                try:
                    return read_unit_cgroup(self.procfs, pid)
                except OSError:
                    return None
            return process.unit_cgroup(self.procfs, pid, None)

    def close(self) -> None:
        """Close the fdinfo files kept open; the next scan walks every process again."""
        with self._lock:
            self._release_all()

    def _release_all(self) -> None:
        for process in self._processes.values():
            self._release(process)
        self._processes = {}

    def _walk(self, scan: _Scan, pid: int, previous: _Process | None, now: float) -> _Process:
        if previous is not None:
            self._release(previous)  # keeps its drm_fds' layouts, to try first
        if self.young_seconds > 0 and ((age := process_age_seconds(self.procfs, pid)) is None
                                       or age < self.young_seconds):
            walk_due = now  # starting up: it may open the GPU any moment (or its age is unknown)
        else:
            walk_due = now + self.rescan_seconds * (0.5 + (pid % 16) / 16)
        process = _Process(walk_due)
        drm_fds = scan.drm_fds_of(pid)
        if drm_fds:
            layouts = {drm_fd.fd: drm_fd.layout for drm_fd in previous.drm_fds} if previous is not None else {}
            self._open_fdinfo(scan, pid, process, drm_fds, layouts)
        if pid in scan.unreadable:
            process.unreadable = True
        return process

    def _open_fdinfo(self, scan: _Scan, pid: int, process: _Process, drm_fds: list[tuple[str, int]],
                     layouts: dict[str, FdinfoLayout | None]) -> None:
        try:
            fdinfo_dir = os.open(f"{self.procfs}/{pid}/fdinfo", OPEN_DIRECTORY)
        except OSError as error:
            scan.failed(pid, error)
            return
        by_client: dict[Hashable, _DrmFd] = {}
        clients = []
        try:
            for fd, minor in drm_fds:
                try:
                    handle = os.open(fd, OPEN_FILE, dir_fd=fdinfo_dir)
                except OSError as error:
                    scan.failed(pid, error)
                    continue
                try:
                    data = read_open_bytes(handle, MAX_FDINFO_BYTES)
                except OSError as error:
                    scan.failed(pid, error)
                    os.close(handle)
                    continue
                layout = layouts.get(fd) or self._last_layout
                client, reading, layout = _parse(data, layout, learn=True)
                if client is None:
                    os.close(handle)
                    continue
                drm_fd = _DrmFd(pid, fd, minor, client)
                drm_fd.layout = layout
                if layout is not None:
                    self._last_layout = layout
                known = by_client.get(drm_fd.key)
                if known is not None:
                    # Another fd of a client already read (dup'd): the same kernel object, the same figures.
                    known.fds += 1
                    os.close(handle)
                    continue
                if self._held < self._max_held:
                    self._held += 1
                    drm_fd.handle = handle
                else:
                    os.close(handle)
                by_client[drm_fd.key] = drm_fd
                process.drm_fds.append(drm_fd)
                clients.append((client, reading))
        finally:
            os.close(fdinfo_dir)
        for drm_fd, (client, reading) in zip(process.drm_fds, clients):
            scan.add(pid, drm_fd, client, reading)

    def _read(self, scan: _Scan, pid: int, process: _Process) -> bool:
        """Read the known DRM clients of a process that is not due for a walk into `scan`; False, with
        nothing added, when any of their fds is not what it was (the process is walked again then)."""
        clients = []
        for drm_fd in process.drm_fds:
            handle = drm_fd.handle
            try:
                if handle < 0:
                    data = read_bytes(f"{self.procfs}/{pid}/fdinfo/{drm_fd.fd}", MAX_FDINFO_BYTES)
                else:
                    data = read_open_bytes(handle, MAX_FDINFO_BYTES)
                client, reading, drm_fd.layout = _parse(data, drm_fd.layout, learn=False)
                # Not a DRM fd any more, or another client's: fd N was closed and opened again.
                if client is None or client.client_id != drm_fd.client_id or client.pdev != drm_fd.pdev:
                    return False
                if client.pdev is None and not _same_device(self.procfs, pid, drm_fd):
                    return False
            except OSError:
                return False
            clients.append((client, reading))
        for drm_fd, (client, reading) in zip(process.drm_fds, clients):
            scan.add(pid, drm_fd, client, reading)
        return True

    def _release(self, process: _Process) -> None:
        for drm_fd in process.drm_fds:
            if drm_fd.handle >= 0:
                os.close(drm_fd.handle)
                drm_fd.handle = -1
                self._held -= 1


# One read of a client's fdinfo: its layout's `match` of the bytes, or the text when no layout matched.
Reading = tuple[FdinfoLayout, tuple[bytes, ...]] | str


def _parse(data: bytes, layout: FdinfoLayout | None, learn: bool
           ) -> tuple[DrmClient | None, Reading, FdinfoLayout | None]:
    """The client one read of an fdinfo file shows, the read for its engine counters (`unit_engine_use`),
    and the layout to try on the next read: `layout` when it matched; else the layout of this read if
    `learn` (a walk: layouts are learnt at most once per walk) and it is a DRM client's, else None."""
    if layout is not None:
        read = layout.read(data)
        if read is not None:
            return read[0], (layout, read[1]), layout
    text = data.decode("utf-8", "replace")
    client = parse_fdinfo(text)
    return client, text, FdinfoLayout.learn(text) if learn and client is not None else None


def unit_engine_use(readings: list[Reading]) -> UnitEngineUse:
    """The engine counters of a unit's clients on one device, from one read of each (see `_parse`)."""
    use = UnitEngineUse()
    # Clients read with one layout are added together, in the clients' order.
    for layout, batch in itertools.groupby(readings, key=_layout_of):
        if layout is None:
            for text in batch:
                use.add(parse_engine_use(text).columns())  # type: ignore[arg-type]
        else:
            use.add(layout.engine_columns([parts for _, parts in batch]))  # type: ignore[misc]
    return use


def _layout_of(reading: Reading) -> FdinfoLayout | None:
    return None if isinstance(reading, str) else reading[0]


def default_max_held_fds() -> int:
    """A quarter of the soft limit on open files: the rest stays for connections and journal files."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1024 if soft == resource.RLIM_INFINITY else soft // 4


def _same_device(procfs: str, pid: int, drm_fd: _DrmFd) -> bool:
    """For a client without `drm-pdev`, keyed by its device minor: whether fd N still is that device."""
    target = os.stat(f"{procfs}/{pid}/fd/{drm_fd.fd}")
    return (stat.S_ISCHR(target.st_mode) and os.major(target.st_rdev) == DRM_MAJOR
            and os.minor(target.st_rdev) == drm_fd.minor)


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




def read_unit_cgroup(procfs: str, pid: int) -> UnitCgroup | None:
    """The unit of a process and its cgroup path (see `unit_cgroup_of_path`), raising the OSError of an
    unreadable cgroup file."""
    path = systemd_cgroup_path(read_text(f"{procfs}/{pid}/cgroup", MAX_CGROUP_BYTES))
    return None if path is None else unit_cgroup_of_path(path)


def process_age_seconds(procfs: str, pid: int) -> float | None:
    """How long ago the process started (`starttime` of /proc/PID/stat against CLOCK_BOOTTIME, the
    clock it counts in); None when its stat file cannot be read or parsed."""
    start_ticks = process_start_ticks(procfs, pid)
    return None if start_ticks is None else time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / CLOCK_TICKS


def process_start_ticks(procfs: str, pid: int) -> int | None:
    """When the process started, in clock ticks since boot (`starttime` of /proc/PID/stat): with its pid, what
    tells this process from a later one of the same pid. None when its stat file cannot be read or parsed."""
    try:
        text = read_text(f"{procfs}/{pid}/stat", MAX_STAT_BYTES)
        # The fields after the command name, which is in parentheses and may hold any character.
        return int(text[text.rindex(")") + 2:].split()[STAT_STARTTIME_AFTER_COMM])
    except (OSError, ValueError, IndexError):
        return None


def realtime_usec_of_ticks(start_ticks: int) -> int:
    """The wall clock time (microseconds, as the journal's) of a process's `process_start_ticks`."""
    age_usec = time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1000 - start_ticks * 1_000_000 // CLOCK_TICKS
    return time.time_ns() // 1000 - age_usec


def read_text(path: str, limit: int) -> str:
    """At most `limit` bytes of a file, decoded leniently (process names may be any bytes)."""
    return read_bytes(path, limit).decode("utf-8", "replace")


def read_bytes(path: str, limit: int) -> bytes:
    """At most `limit` bytes of a file."""
    fd = os.open(path, OPEN_FILE)
    try:
        return read_open_bytes(fd, limit)
    finally:
        os.close(fd)


def read_open_bytes(fd: int, limit: int) -> bytes:
    """At most `limit` bytes from the start of an open file (pread: the file offset is not used). Procfs
    files are generated again by each read at offset 0."""
    first = min(limit, FIRST_READ_BYTES)
    data = os.pread(fd, first, 0)
    if len(data) == first:
        chunks = [data]
        size = len(data)
        while size < limit:
            chunk = os.pread(fd, limit - size, size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    return data


class _DrmFd:
    """A DRM client of a process as its walk found it: the fd read for it, its fdinfo file kept open
    (`handle`; -1 when not kept open), how many fds of the process hold the client (dup'd fds), and the
    layout its fdinfo had (None: read the general way until the next walk)."""

    __slots__ = ("fd", "minor", "pdev", "client_id", "device", "key", "handle", "fds", "layout")

    def __init__(self, pid: int, fd: str, minor: int, client: DrmClient) -> None:
        self.fd = fd
        self.minor = minor
        self.pdev = client.pdev
        self.client_id = client.client_id
        self.device = client.pdev or f"{DRM_MAJOR}:{minor}"
        # drm-client-id is unique per device (i915 on 6.1) or globally (6.2+); without one, each fd counts.
        self.key: Hashable = (self.device, self.client_id) if self.client_id is not None else (self.device, pid, fd)
        self.handle = -1
        self.fds = 1
        self.layout: FdinfoLayout | None = None


_UNREAD = object()


class _Process:
    """What a DrmClientScanner knows of one process between two walks of its fd table."""

    __slots__ = ("walk_due", "drm_fds", "unreadable", "_unit")

    def __init__(self, walk_due: float) -> None:
        self.walk_due = walk_due
        self.drm_fds: list[_DrmFd] = []
        self.unreadable = False  # a read failed at the walk for another reason than the process or fd going
        self._unit: object = _UNREAD

    def unit_cgroup(self, procfs: str, pid: int, scan: _Scan | None) -> UnitCgroup | None:
        """The process's unit and its cgroup, read once per walk; a failure is counted in `scan` when it
        happens."""
        if self._unit is _UNREAD:
            try:
                self._unit = read_unit_cgroup(procfs, pid)
            except OSError as error:
                self._unit = None
                if scan is not None:
                    scan.failed(pid, error)
                    self.unreadable = self.unreadable or pid in scan.unreadable
        return self._unit  # type: ignore[return-value]


class _Scan:
    """The state of one scan of a DrmClientScanner."""

    def __init__(self, procfs: str, max_fds_per_process: int = MAX_FDS_PER_PROCESS) -> None:
        self.procfs = procfs
        self.max_fds_per_process = max_fds_per_process
        self.fds_examined = 0
        self.fds_skipped = 0
        self.walks_deferred = 0
        # client -> (device, lowest pid, device memory, the read of its engine counters)
        self.clients: dict[Hashable, tuple[str, int, int, Reading]] = {}
        self.drivers: dict[str, str] = {}
        self.drm_fds = 0
        self.memory_keys_seen = False
        self.unreadable: set[int] = set()
        self.vanished: set[int] = set()

    def failed(self, pid: int, error: OSError) -> None:
        (self.vanished if error.errno in VANISHED_ERRNOS else self.unreadable).add(pid)

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
            if len(fds) > self.max_fds_per_process:
                fds.sort(key=lambda name: (len(name), name))  # numerically, without parsing
                self.fds_skipped += len(fds) - self.max_fds_per_process
                del fds[self.max_fds_per_process:]
            self.fds_examined += len(fds)
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

    def add(self, pid: int, drm_fd: _DrmFd, client: DrmClient, reading: Reading) -> None:
        """A client of process `pid`, read through `drm_fd` (`reading`: see `_parse`)."""
        self.drm_fds += drm_fd.fds
        device = drm_fd.device
        if device not in self.drivers:
            self.drivers[device] = client.driver
        if client.memory:
            self.memory_keys_seen = True
        # Pids are scanned in ascending order, so the first holder seen is the lowest pid.
        if drm_fd.key not in self.clients:
            self.clients[drm_fd.key] = (device, pid, client.device_memory, reading)

    def result(self, processes: int, known: dict[int, _Process]) -> ScanResult:
        memory_by_device_pid: dict[str, dict[int, int]] = {}
        unit_by_pid: dict[int, str | None] = {}  # in ascending pids: clients are added in the order of the scan
        unit_cgroups: dict[str, set[str]] = {}
        readings: dict[str, dict[str, list[Reading]]] = {}
        for device, pid, bytes_, reading in self.clients.values():
            by_pid = memory_by_device_pid.setdefault(device, {})
            by_pid[pid] = by_pid.get(pid, 0) + bytes_
            if pid in unit_by_pid:
                unit = unit_by_pid[pid]
            else:
                unit_cgroup = known[pid].unit_cgroup(self.procfs, pid, self)
                unit = unit_by_pid[pid] = None if unit_cgroup is None else unit_cgroup.unit
                if unit_cgroup is not None:
                    unit_cgroups.setdefault(unit_cgroup.unit, set()).add(unit_cgroup.path)
            if unit is not None:
                readings.setdefault(device, {}).setdefault(unit, []).append(reading)
        for pid in self.unreadable:
            process = known.get(pid)
            unit_cgroup = None if process is None else process.unit_cgroup(self.procfs, pid, None)
            if unit_cgroup is not None:
                unit_cgroups.setdefault(unit_cgroup.unit, set()).add(unit_cgroup.path)
        engines_by_device_unit = {
            device: {unit: unit_engine_use(unit_readings) for unit, unit_readings in by_unit.items()}
            for device, by_unit in readings.items()}
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
            engines_by_device_unit=engines_by_device_unit,
            unit_by_pid=unit_by_pid,
            unit_cgroups={unit: frozenset(paths) for unit, paths in unit_cgroups.items()},
            driver_by_device=dict(self.drivers),
            clients=len(self.clients),
            drm_fds=self.drm_fds,
            processes=processes,
            unreadable=len(self.unreadable),
            unreadable_pids=tuple(sorted(self.unreadable)[:UNREADABLE_PIDS_NAMED]),
            reader_root=bool(self.unreadable) and os.geteuid() == 0,
            reader_capable=bool(self.unreadable) and capabilities.READER_CAPABILITIES <= capabilities.held().get(
                "CapEff", frozenset()),
            vanished=len(self.vanished),
            memory_keys_seen=self.memory_keys_seen,
            fds_skipped=self.fds_skipped,
            walks_deferred=self.walks_deferred,
        )


def main(argv: list[str]) -> int:
    procfs = argv[1] if len(argv) > 1 else DEFAULT_PROCFS
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
