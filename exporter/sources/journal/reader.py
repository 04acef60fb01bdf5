"""The systemd journal as a source of watched units' entries, read through libsystemd with ctypes.

Usable alone from a Python shell::

    >>> from vllm_xpu_exporter.sources.journal import JournalReader
    >>> from vllm_xpu_exporter.sources.logs.entry import LogSelection
    >>> with JournalReader(LogSelection(unit_globs=["vllm*.service"], boot="all")) as reader:
    ...     for entry in reader.read_available(100):
    ...         print(entry.unit, entry.message)

What is selected, for every unit whose name matches one of the globs (``fnmatch``, case-sensitive
like unit names): the entries the unit wrote (``_SYSTEMD_UNIT=<unit>``: its stdout/stderr, its
syslog and native journal messages) and the records systemd itself (PID 1) wrote about the unit
(``_PID=1`` and ``UNIT=<unit>``: start job begun/done/failed, process exited, unit failed, restart
scheduled, stop). User-manager records (``USER_UNIT=``) are not selected: only system units are.

Containers that log to the journal (Docker's and Podman's ``journald`` log driver) are selected by
name: the entries whose ``CONTAINER_NAME`` matches one of the container globs (``container_globs``,
none by default; see ``LogSelection.matches_container``), unless their ``_SYSTEMD_UNIT`` is a
watched unit (a Podman quadlet container's conmon runs in its ``.service``, which keeps them). Such an
entry is believed only when the fields journald adds say its engine wrote it (``trust``: dockerd as root in
docker.service, conmon as root or as a rootless user); it then belongs to the container's key
(``vllm_xpu_exporter.parsers.workloads``): ``podman/<name>`` when root's conmon wrote it,
``podman/<name>@uid<N>`` when user N's did, ``docker/<name>`` when dockerd did. Podman's events of a watched
container's end (``PODMAN_EVENT=died`` and ``PODMAN_NAME=<name>``, its events logger ``journald``), written by
podman itself, are selected too: they end the container's run, as systemd's "Main process exited" record ends
a unit's start. Any other entry naming a watched container is ignored and counted in ``rejected_entries``.

A Docker container's end is not in the journal: with ``docker_roots`` (``--path.docker``) the reader reads
it from the container's ``config.v2.json`` (``CONTAINER_ID_FULL``), as the json-file source does, and hands
it on among the entries as systemd's record of a unit's end (``container_end``; ``_with_docker_ends``).

All of these are sd-journal matches, so libsystemd walks its per-value entry indexes instead of every entry.

Every failure to read the journal raises ``JournalError`` (``vllm_xpu_exporter.sources.journal.binding``),
an OSError that keeps the errno and the failed function's name.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import stat
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType

from vllm_xpu_exporter.parsers.cgroup import unit_of_cgroup_file
from vllm_xpu_exporter.parsers.containerlogs import DockerExit
from vllm_xpu_exporter.parsers.workloads import docker_key, podman_key
from vllm_xpu_exporter.sources.containers import DockerEnd
from vllm_xpu_exporter.sources.journal.trust import (REJECTED_CONTAINER_SENDER, REJECTED_PODMAN_EVENT, conmon_uid,
                                                     is_dockerd)
from vllm_xpu_exporter.sources.journal.trust import podman_uid as podman_uid_of
from vllm_xpu_exporter.sources.journal.binding import (
    LIBSYSTEMD,
    SD_JOURNAL_LOCAL_ONLY,
    SD_JOURNAL_NOP,
    SD_JOURNAL_SYSTEM,
    JournalError,
    LibSystemd,
)
from vllm_xpu_exporter.sources.logs.entry import DEFAULT_BATCH, LogEntry, LogSelection, container_end, normalize_boot
from vllm_xpu_exporter.systemd import MESSAGE_ID_UNIT_PROCESS_EXIT

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
OWN_CGROUP_PATH = "/proc/self/cgroup"
SYSTEM_JOURNAL_DIRECTORIES = ("/run/log/journal", "/var/log/journal")
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024
MAX_INVOCATIONS_BACK = 8
DOCKER_END_SECONDS = 1.0
"""How often, at most, the reader looks at its Docker containers' ``config.v2.json`` for their end."""
"""``JournalReader.read_latest_invocations`` reads at most this many of a unit's latest invocations."""

_HEX32 = re.compile(r"[0-9a-f]{32}")
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
_FIELD_SYSTEMD_UNIT = b"_SYSTEMD_UNIT"
_FIELD_UNIT = b"UNIT"
_FIELD_MESSAGE = b"MESSAGE"
_FIELD_PID = b"_PID"
_FIELD_INVOCATION_ID = b"INVOCATION_ID"
_FIELD_SYSTEMD_INVOCATION_ID = b"_SYSTEMD_INVOCATION_ID"
_FIELD_CONTAINER_NAME = b"CONTAINER_NAME"
_FIELD_PODMAN_EVENT = b"PODMAN_EVENT"
_FIELD_PODMAN_NAME = b"PODMAN_NAME"
PODMAN_DIED = b"died"
"""``PODMAN_EVENT`` of Podman's event of a container's process ending (its events logger ``journald``, the
default on systemd hosts: ``SYSLOG_IDENTIFIER=podman``, ``PODMAN_TYPE=container``, ``PODMAN_NAME``,
``PODMAN_ID``, ``PODMAN_EXIT_CODE`` unless 0)."""
_DIED_RUN = "\0died:"  # the run of a decoded Podman "died" event until _with_container_ends names its run


@dataclass
class _DockerRun:
    """A Docker container of the journal (``docker/<name>``): its latest run and where its end is read."""

    run: str
    container_id: str
    since_usec: int  # the run's first entry: an end before it is an older run's
    end: DockerEnd


Decoder = Callable[[dict[bytes, str], dict[bytes, str]], "LogEntry | None"]
"""Reads the current entry: (watched units, watched container names) -> the entry, or None."""


class _UnreadableField(Exception):
    def __init__(self, result: int) -> None:
        super().__init__(result)
        self.result = result


class _GlobbedNames(dict):
    """The ``CONTAINER_NAME`` values the container globs may match, decided one value at a time as entries are
    read (a bounded cache of the answers), once the journal holds more than ``CONTAINER_NAMES_MAX`` of them:
    a flood of names (anyone can write one) then costs neither memory nor sd-journal matches, and no entry
    of a name met later is missed (the reader reads the boot's entries and filters them itself)."""

    MAX_CACHED = 4096

    def __init__(self, matches: Callable[[str], bool]) -> None:
        super().__init__()
        self._matches = matches
        self._not_matching: set[bytes] = set()

    def get(self, raw: bytes, default: str | None = None) -> str | None:  # type: ignore[override]
        name = dict.get(self, raw)
        if name is not None or raw in self._not_matching:
            return name if name is not None else default
        decoded = raw.decode("utf-8", "replace")
        if len(self) >= self.MAX_CACHED or len(self._not_matching) >= self.MAX_CACHED:
            self.clear()
            self._not_matching.clear()
        if self._matches(decoded):
            self[raw] = decoded
            return decoded
        self._not_matching.add(raw)
        return default

    def __len__(self) -> int:  # always more than sd-journal's matches take: the decoder filters
        return 1 << 30

    def __contains__(self, raw: object) -> bool:
        return isinstance(raw, bytes) and self.get(raw) is not None


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


MADV_DONTNEED = 4
_JOURNAL_MAPPING = re.compile(rb"^([0-9a-f]+)-([0-9a-f]+) r--s .*\.journal~?(?: \(deleted\))?$", re.MULTILINE)


def libc_madvise() -> Callable[[int, int, int], int]:
    """libc's madvise(2): 0, or -1 with errno set."""
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.restype = ctypes.c_int
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return madvise


def release_journal_pages(madvise: Callable[[int, int, int], int], maps_path: str = "/proc/self/maps") -> int:
    """Drop the resident pages of this process's read-only journal file mappings; bytes released.

    sd-journal maps journal files in 8 MiB windows and keeps up to 64 of them mapped, so after
    a catch-up every page it touched (hundreds of MiB for a big journal) counts in the reader's
    RSS although it is only page cache. MADV_DONTNEED on a shared read-only file mapping only
    unmaps the pages from this process: the mapping stays valid and the next access faults the
    (current) page back in from the page cache. The file data is never changed or lost.
    """
    try:
        with open(maps_path, "rb") as maps:
            text = maps.read()
    except OSError:
        return 0
    released = 0
    for match in _JOURNAL_MAPPING.finditer(text):
        start, end = int(match.group(1), 16), int(match.group(2), 16)
        if madvise(start, end - start, MADV_DONTNEED) == 0:
            released += end - start
    return released


def open_journal(selection: LogSelection, admit: Callable[[str, int | None], bool],
                 forget: Callable[[str], None]) -> JournalReader:
    """The journal's reader for a ``LogFollower`` (its ``open_reader``); the journal forgets no unit."""
    return JournalReader(selection, admit=admit)


class JournalReader:
    """Reads the selected units' entries from the journal: catches up, then follows.

    ``open()`` positions before the first selected entry; ``read_available()`` returns what is
    there now, in journal order; ``wait()`` blocks until the journal changes. The consumer
    re-reads the selected boot on start, so no cursor is kept across runs.

    Single-threaded: an sd_journal handle must only ever be used from one thread. Create, use
    and close a reader in the same thread (the journal follower runs it in its own thread).

    Units that appear after ``open()``
        Watched unit names are found with ``sd_journal_query_unique`` on ``_SYSTEMD_UNIT`` and
        ``UNIT`` (it walks each field's distinct values, not the entries) and become matches.
        Whenever the journal has changed (``wait()`` or ``sd_journal_process`` says so), the
        next ``read_available()`` queries again. A new unit's first entries may lie *behind* the
        read position: the journal can grow between the query and the read, so a read can pass
        entries of a unit not matched yet; a file holding older entries can also appear. So,
        for new units only, the reader takes the cursor of the position, matches just the new
        units, walks backwards from the cursor to collect their earlier entries (returned next,
        in journal order among themselves), then matches every unit again and seeks back to the
        cursor, skipping the entry at it. Nothing is returned twice and none of a new unit's
        entries is lost; only back-filled entries come after other units' entries that were
        already returned, although the journal has them earlier. Watched containers are found the
        same way, from the ``CONTAINER_NAME`` values, and back-filled with the new units.

        The query walks every distinct unit name in the journal (3,000 names: ~18 ms), and a busy
        journal changes many times a second; so after a query it is not repeated before
        ``1 / UNIT_QUERY_SHARE`` times its duration has passed. A unit that appears meanwhile is
        picked up then, its earlier entries back-filled as above.

    Rotation, vacuuming and new files are handled by sd-journal (inotify); the position
    survives them because sd-journal locates entries by seqnum, monotonic and realtime
    timestamps, not by file. When a system journal directory that did not exist at ``open()``
    appears (``/var/log/journal`` once the runtime journal is flushed), sd-journal would not
    watch it, so the reader reopens and resumes after its position.

    Many units
        sd-journal evaluates an OR of matches by looking each term up for every entry it steps
        to, so the cost of a step grows with the number of terms: 1,000 watched units made a
        catch-up take 4 s, 3,000 units 50 s. Above ``MATCHED_UNITS_MAX`` watched units and
        containers the reader matches only the boot and picks the watched units' entries itself (two
        fields read per entry, a dictionary look-up), so the cost stays linear in the entries of the boot.

    Admission
        ``admit``, when given, is asked (with the entry's realtime timestamp) once per watched unit,
        when the reader first meets one of its entries (in journal order); a unit it refuses is skipped
        (its entries are not decoded nor returned) for the rest of the batch, at most ``ADMIT_AGAIN_USEC``
        of journal time, then asked again. That is how a consumer's cap on the number of units (the journal
        follower's ``--journal.max-units``) costs nothing for the units beyond it.

    Starting at the latest invocations
        ``read_latest_invocations()``, called first after ``open()``, returns only the entries of
        each watched unit's latest invocations (in journal order) and leaves the reader after the
        journal's last selected entry, to follow from there: what the init gate needs, without
        reading the whole boot. ``None`` when the journal does not allow it (see there); the
        reader then reads from the start of the boot as usual.

    Memory: the reader holds the entries of one batch. The journal's mapped pages (see
    ``release_journal_pages``) are dropped every ``RELEASE_PAGES_EVERY`` entries read and when
    the reader reaches the end, so its RSS does not grow with the size of the journal.
    """

    RELEASE_PAGES_EVERY = 1024
    BATCH_CHARS = 8 << 20
    """A batch of ``read_available()`` ends once its messages hold this many characters (4096 messages of
    ``max_message_bytes`` would hold 256 MiB); the rest comes in the next, without waiting."""
    ADMIT_AGAIN_USEC = 60_000_000
    """A refused unit's entries are skipped without asking ``admit`` again for at most this long (journal time)."""
    MATCHED_UNITS_MAX = 64
    CONTAINER_NAMES_MAX = 256
    """Beyond this many container names the globs may match, the names are not listed: ``_GlobbedNames``."""
    UNIT_QUERY_SHARE = 0.01
    """At most this share of the time goes to looking for new units while following."""
    """Up to this many watched units are sd-journal matches; beyond it the reader filters the boot's entries."""

    def __init__(
        self,
        selection: LogSelection,
        *,
        library: str = LIBSYSTEMD,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        boot_id_path: str = BOOT_ID_PATH,
        admit: Callable[[str, int | None], bool] | None = None,
    ) -> None:
        self.selection = selection
        self._admit = admit
        self.max_message_bytes = max_message_bytes
        self._library_name = library
        self._boot_id_path = boot_id_path
        self._docker_containers = tuple(os.path.join(root, "containers") for root in selection.docker_roots) \
            if selection.container_globs else ()
        self._lib: LibSystemd | None = None
        self._madvise = libc_madvise()
        self._handle = ctypes.c_void_p()
        self._boot_id: str | None = None
        self._missing_roots: tuple[str, ...] = ()
        self._unreadable_entries = 0
        self._rejected_entries: dict[str, int] = {}
        self.last_unreadable: JournalError | None = None
        """Why the latest entry counted in ``unreadable_entries`` could not be read."""
        self._reset_position()

    def _reset_position(self) -> None:
        self._watched: dict[bytes, str] = {}
        """Watched unit names as found in the journal, raw bytes → str."""
        self._containers: dict[bytes, str] = {}
        """``CONTAINER_NAME`` values that may be watched containers' (``may_match_container_name``), raw → str."""
        self._admitted: set[bytes] = set()
        """Watched units met in an entry and admitted: their entries are returned."""
        self._refused: dict[bytes, tuple[int, int]] = {}
        """Watched units met in an entry and refused by ``admit``, with the batch (``_batches``) and the
        entry's time they were refused at: their entries are skipped for the rest of the batch, up to
        ``ADMIT_AGAIN_USEC`` later; then ``admit`` is asked again (a place may have been freed:
        ``vllm_xpu_exporter.fold.engine_starts.IDLE_FORGET_USEC``)."""
        self._batches = 0
        self._units_stale = True
        self._units_query_due = 0.0
        """time.monotonic() before which the unit names are not queried again."""
        self._has_position = False
        """The handle has moved onto an entry (so it has a cursor)."""
        self._current_unreturned = False
        """The handle is on a selected entry that has not been returned yet."""
        self._more_pending = True
        """Entries may be readable without waiting (a batch stopped at max_entries, or just opened)."""
        self._backlog: deque[LogEntry] = deque()
        self._last_forward: LogEntry | None = None
        self._decoder: Decoder | None = None
        self._since_release = 0
        self._docker_runs: dict[str, _DockerRun] = {}
        """Watched Docker containers returned so far (by key), whose end is looked for (``_with_docker_ends``)."""
        self._docker_end_due = 0.0
        self._pending_docker_ends: list[tuple[int, str, DockerExit]] = []
        self._podman_runs: dict[str, str] = {}
        """The latest run of each watched Podman container returned (its "died" event ends it)."""
        """Ends read, not handed on yet (their time, key, end), earliest first."""

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def unreadable_entries(self) -> int:
        """Entries skipped because sd-journal could not read one of their fields or timestamps (a
        field compressed with an algorithm this libsystemd lacks, an I/O error): like journalctl, the
        reader skips such an entry rather than stop at it."""
        return self._unreadable_entries

    @property
    def rejected_entries(self) -> dict[str, int]:
        """Entries naming a watched container that its engine did not write (``trust``), by reason: ignored."""
        return dict(self._rejected_entries)

    @property
    def units(self) -> frozenset[str]:
        """Unit names matching the globs found in the journal so far (in any boot's entries)."""
        return frozenset(self._watched.values())

    @property
    def containers(self) -> frozenset[str]:
        """Container names (``CONTAINER_NAME``) the container globs may match found in the journal so far."""
        return frozenset(self._containers.values())

    @property
    def refused_units(self) -> frozenset[str]:
        """Watched units whose entries are skipped because ``admit`` refused them."""
        return frozenset(raw.decode("utf-8", "replace") for raw in self._refused)

    @property
    def boot_id(self) -> str | None:
        """The boot id entries are restricted to, or None for all boots."""
        return self._boot_id

    @property
    def is_open(self) -> bool:
        return bool(self._handle.value)

    def open(self) -> None:
        """Open the journal, before its first selected entry; JournalError if it cannot be read."""
        if self.is_open:
            return
        if self._lib is None:
            self._lib = LibSystemd(self._library_name)
        boot = self.selection.boot
        if boot == "current":
            try:
                self._boot_id = current_boot_id(self._boot_id_path)
            except OSError as error:
                raise JournalError("open", error.errno or errno.EIO, message=(
                    f"cannot read the current boot id from {self._boot_id_path}: {error}")) from None
            except ValueError as error:
                raise JournalError("read", errno.EINVAL, message=(
                    f"cannot read the current boot id from {self._boot_id_path}: {error}")) from None
        else:
            self._boot_id = None if boot == "all" else boot
        self._open_handle()
        self._reset_position()

    def close(self) -> None:
        if self.is_open and self._lib is not None:
            self._lib.sd_journal_close(self._handle)
        self._handle = ctypes.c_void_p()
        self._decoder = None

    def __enter__(self) -> JournalReader:
        self.open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_lib", None) is not None:
            self.close()

    def _open_handle(self) -> None:
        lib = self._lib
        assert lib is not None
        selection = self.selection
        self._missing_roots = ()
        if selection.files:
            for path in selection.files:
                _check_readable_file(path)
            handle = lib.sd_journal_open_files(selection.files, 0)
        elif selection.directory is not None:
            _check_readable_directory(selection.directory)
            handle = lib.sd_journal_open_directory(selection.directory, 0)
        else:
            existing = [d for d in SYSTEM_JOURNAL_DIRECTORIES if os.path.isdir(d)]
            if not existing:
                raise JournalError("stat", errno.ENOENT, message=(
                    "no system journal: neither " + " nor ".join(SYSTEM_JOURNAL_DIRECTORIES) + " exists"))
            for directory in existing:
                _check_readable_directory(directory)
            handle = lib.sd_journal_open(SD_JOURNAL_LOCAL_ONLY | SD_JOURNAL_SYSTEM)
            self._missing_roots = tuple(d for d in SYSTEM_JOURNAL_DIRECTORIES if d not in existing)
        try:
            # Only compressed fields honour the threshold; longer plain ones are cut in Python.
            lib.sd_journal_set_data_threshold(handle, self.max_message_bytes + len(_FIELD_MESSAGE) + 1)
            # Create the inotify watches now, so that wait() sees every change after open().
            lib.sd_journal_get_fd(handle)
        except JournalError:
            lib.sd_journal_close(handle)
            raise
        self._handle = handle
        self._decoder = None

    def _require_open(self) -> LibSystemd:
        if not self.is_open or self._lib is None:
            raise RuntimeError("JournalReader is not open")
        return self._lib

    # --- reading and following --------------------------------------------------------------

    def wait(self, timeout_s: float) -> bool:
        """Block until the journal may have new entries or ``timeout_s`` passes; True if it may.

        Returns True at once while entries are known to be unread (just opened, or the last
        ``read_available()`` stopped at ``max_entries``). Otherwise blocks in poll(2) on
        sd-journal's inotify descriptor (``sd_journal_wait``, which also honours sd-journal's
        own timeout on file systems without inotify); the GIL is released meanwhile.
        """
        lib = self._require_open()
        if self._more_pending or self._backlog or self._current_unreturned:
            return True
        if self._missing_roots and any(os.path.isdir(d) for d in self._missing_roots):
            self._reopen_at_position()
            return True
        if self._units_stale:  # a unit query was put off: wake up when it is due
            remaining = self._units_query_due - time.monotonic()
            if remaining <= 0:
                return True
            timeout_s = min(timeout_s, remaining)
        if self._docker_runs:  # a look at the Docker containers' end is due
            remaining = self._docker_end_due - time.monotonic()
            if remaining <= 0:
                return True
            timeout_s = min(timeout_s, remaining)
        result = lib.sd_journal_wait(self._handle, max(0, int(timeout_s * 1_000_000)))
        if result == SD_JOURNAL_NOP:
            now = time.monotonic()
            return (self._units_stale and now >= self._units_query_due) or \
                (bool(self._docker_runs) and now >= self._docker_end_due)
        self._units_stale = True
        self._more_pending = True
        return True

    def read_available(self, max_entries: int = DEFAULT_BATCH) -> list[LogEntry]:
        """Up to ``max_entries`` selected entries that are in the journal now, without blocking."""
        lib = self._require_open()
        if max_entries <= 0:
            return []
        self._batches += 1
        if lib.sd_journal_process(self._handle) > SD_JOURNAL_NOP:
            self._units_stale = True
        if self._units_stale and time.monotonic() >= self._units_query_due:
            self._refresh_units()
        out: list[LogEntry] = []
        while self._backlog and len(out) < max_entries:
            out.append(self._backlog.popleft())
        if (self._watched or self._containers) and len(out) < max_entries:
            self._read_forward(out, max_entries)
        else:
            self._more_pending = bool(self._backlog)
        if self._since_release and not self._more_pending:
            release_journal_pages(self._madvise)
            self._since_release = 0
        if self.selection.container_globs:
            out = self._with_container_ends(out)
        return out

    def _with_container_ends(self, entries: list[LogEntry]) -> list[LogEntry]:
        """The entries with the ends of watched Docker containers (journald log driver) among them, as
        systemd's records of a unit's end are among its lines: a container's end is read from its
        ``config.v2.json`` (``vllm_xpu_exporter.sources.containers.DockerEnd``: once its ``State.Running`` is false)
        when a new run of it is met, and at most every ``DOCKER_END_SECONDS`` once the reader is at the
        journal's end (a stat of one file a container, read when it changed); never per entry. An end goes
        before the first entry later than it (reading a boot's history, the container's death comes
        before the inits that followed it, which then overlap nothing) or, none being later, at the end,
        in the container's latest run then. So a container that died silently during its init counts as
        `other` (unless its cause comes within the grace), one ``docker stop`` ended as stopped, and
        neither stays initialising, as with its json-file log (``vllm_xpu_exporter.sources.containerlogs``).
        A Podman container's "died" event (``PODMAN_EVENT=died``, selected with its name) is such an end
        where the journal has it: it goes in the container's latest run when that run is of the event's
        container (``PODMAN_ID``), else it is dropped (a container none of whose lines was read)."""
        pending = self._pending_docker_ends
        podman_runs = self._podman_runs
        docker = bool(self._docker_containers)
        out: list[LogEntry] = []
        for entry in entries:
            if pending and pending[0][0] < entry.realtime_usec:
                self._hand_on_docker_ends(out, entry.realtime_usec)
            run = entry.container_run
            if not run:
                out.append(entry)
                continue
            if entry.from_systemd:  # a Podman container's "died" event: in its latest run, if it is that one's
                latest = podman_runs.get(entry.unit)
                if latest is not None and latest.split("/", 1)[0] == run[len(_DIED_RUN):]:
                    out.append(replace(entry, container_run=latest))
                continue
            if entry.unit.startswith("podman/"):
                podman_runs[entry.unit] = run
            elif docker and entry.unit.startswith("docker/"):
                known = self._docker_runs.get(entry.unit)
                if known is None or known.run != run:
                    self._docker_run_met(entry.unit, run, entry.realtime_usec, known)
            out.append(entry)
        if not self._more_pending and not self._backlog:
            if self._docker_runs and time.monotonic() >= self._docker_end_due:
                self._docker_end_due = time.monotonic() + DOCKER_END_SECONDS
                for key, known in self._docker_runs.items():
                    self._look_for_docker_end(key, known)
            self._hand_on_docker_ends(out, None)
        return out

    def _docker_run_met(self, key: str, run: str, realtime_usec: int, known: _DockerRun | None) -> None:
        """A new run of a Docker container (``CONTAINER_ID_FULL``, with its log epoch): its end is looked for."""
        container_id = run.split("/", 1)[0]
        if known is not None and known.container_id == container_id:
            end = known.end  # a new start of the same container: its end is the same file's
        elif _CONTAINER_ID.fullmatch(container_id):
            end = DockerEnd(tuple(os.path.join(directory, container_id, "config.v2.json")
                                  for directory in self._docker_containers))
        else:
            end = DockerEnd(())  # no CONTAINER_ID_FULL (only a short id): its end cannot be read
        known = self._docker_runs[key] = _DockerRun(run, container_id, realtime_usec, end)
        self._look_for_docker_end(key, known)

    def _look_for_docker_end(self, key: str, known: _DockerRun) -> None:
        ended = known.end.ended(known.since_usec)
        if ended is not None:
            self._pending_docker_ends.append((ended.realtime_usec, key, ended))
            self._pending_docker_ends.sort(key=lambda pending: pending[0])

    def _hand_on_docker_ends(self, out: list[LogEntry], before_usec: int | None) -> None:
        """The pending ends earlier than ``before_usec`` (all: None), each in its container's latest run."""
        pending = self._pending_docker_ends
        while pending and (before_usec is None or pending[0][0] < before_usec):
            _, key, ended = pending.pop(0)
            out.append(container_end(key, ended, self._docker_runs[key].run))

    def _read_forward(self, out: list[LogEntry], max_entries: int) -> None:
        lib = self._lib
        assert lib is not None
        handle = self._handle
        next_entry = lib.raw_next
        decode = self._decoder or self._make_decoder()
        self._decoder = decode
        watched = self._watched
        containers = self._containers
        append = out.append
        last: LogEntry | None = None
        if self._current_unreturned:
            self._current_unreturned = False
            last = decode(watched, containers)
            if last is not None:
                append(last)
        self._more_pending = True
        release_every = self.RELEASE_PAGES_EVERY
        since_release = self._since_release
        chars, max_chars = 0, self.BATCH_CHARS
        while len(out) < max_entries and chars < max_chars:
            result = next_entry(handle)
            if result <= 0:
                if result < 0:
                    raise JournalError.of_result("sd_journal_next", result, "reading the journal")
                self._more_pending = False
                break
            self._has_position = True
            entry = decode(watched, containers)
            if entry is not None:
                append(entry)
                last = entry
                chars += len(entry.message)
                since_release += 1
                if since_release >= release_every:
                    release_journal_pages(self._madvise)
                    since_release = 0
        self._since_release = since_release
        if last is not None:
            self._last_forward = last

    # --- starting at the latest invocations ----------------------------------------------------

    def read_latest_invocations(
        self,
        sufficient: Callable[[list[LogEntry]], bool],
        *,
        max_invocations: int = MAX_INVOCATIONS_BACK,
        max_units: int | None = None,
    ) -> list[LogEntry] | None:
        """The entries of each watched unit's latest invocations, in journal order; then the reader
        follows from the journal's last selected entry (``read_available()`` returns what comes after
        it). Call it first after ``open()``.

        A unit's latest invocation is the one of its last entry (``_SYSTEMD_INVOCATION_ID`` of its
        output, ``INVOCATION_ID`` of PID 1's records about it). From there the reader steps back an
        invocation at a time (the unit's entry just before the earlier one's first entry) until it has
        read, besides the latest, one for which ``sufficient(entries)`` is true (the journal follower:
        one that printed a vLLM line, so the unit is known to run an engine and its latest printed
        start is among those read), or the unit's first invocation in the boot. Every entry of a read
        invocation is returned, also those stored after a later invocation began.

        Returns None, leaving the reader to read from the start of the boot, when that would not give
        the same as the whole boot: an entry where an invocation id is looked for has none (a journal
        of systemd before 232, or made by hand); more than ``max_invocations`` of a unit's invocations
        would be needed; more watched units than ``MATCHED_UNITS_MAX`` or ``max_units`` (the units
        a cap admits depend on the order they are met in the whole boot); or the boot has no entry of
        the watched units. Entries of a unit that carry no invocation id among the read invocations'
        are not read (systemd gives one to every entry of a unit's processes and to PID 1's records of
        a unit that has started).
        """
        lib = self._require_open()
        if self._has_position or self._backlog:
            raise RuntimeError("read_latest_invocations() must be called first after open()")
        handle = self._handle
        if self.selection.container_globs:
            return self._read_whole_boot()  # a container's lines carry no invocation id
        found, _ = self._query_watched_units()
        if not found or len(found) > self.MATCHED_UNITS_MAX or (max_units is not None and len(found) > max_units):
            return self._read_whole_boot()
        self._apply_matches(found)
        lib.sd_journal_seek_tail(handle)
        if not lib.sd_journal_previous(handle):
            return self._read_whole_boot()
        tail = lib.sd_journal_get_cursor(handle)
        decode = self._decoder or self._make_decoder()
        self._decoder = decode
        selected: list[bytes] = []
        release_journal_pages(self._madvise)
        for raw in sorted(found):
            invocations = self._latest_invocations_of(raw, found[raw], tail, sufficient, max_invocations, decode)
            release_journal_pages(self._madvise)  # as the forward read does: the pages are only page cache
            if invocations is None:
                return self._read_whole_boot()
            selected += invocations
        entries = self._invocations_before(found, selected, tail, decode)
        release_journal_pages(self._madvise)
        self._watched = dict(found)
        self._units_stale = False
        self._apply_matches(self._watched)
        self._resume_at(tail, cursor_entry_returned=True)
        self._has_position = True
        self._more_pending = True
        if entries:
            self._last_forward = entries[-1]
        return entries

    def _read_whole_boot(self) -> None:
        """Back to before the first selected entry, as just opened: the next read starts at the boot's start."""
        lib = self._lib
        assert lib is not None
        lib.sd_journal_flush_matches(self._handle)
        lib.sd_journal_seek_head(self._handle)
        self._reset_position()
        return None

    def _latest_invocations_of(
        self, raw: bytes, name: str, tail: bytes, sufficient: Callable[[list[LogEntry]], bool],
        max_invocations: int, decode: Decoder,
    ) -> list[bytes] | None:
        """The unit's invocation ids to read, latest first (read_latest_invocations); None: read the boot."""
        lib = self._lib
        assert lib is not None
        handle = self._handle
        unit = {raw: name}
        self._apply_matches(unit)
        lib.sd_journal_seek_cursor(handle, tail)
        if not lib.sd_journal_previous(handle):
            return []  # no entry of the unit in the boot
        chosen: list[bytes] = []
        while True:
            invocation = self._invocation_here(raw)
            if invocation is None or invocation in chosen:
                return None
            chosen.append(invocation)
            entries = self._invocations_before(unit, [invocation], tail, decode)
            if not entries:
                return None  # its entries cannot be read
            # after the walk back the handle is on the invocation's first entry
            first = lib.sd_journal_get_cursor(handle)
            if len(chosen) > 1 and sufficient(entries):
                return chosen
            self._apply_matches(unit)
            lib.sd_journal_seek_cursor(handle, first)
            while (moved := lib.sd_journal_previous(handle)) and lib.sd_journal_test_cursor(handle, first):
                pass
            if not moved:
                return chosen  # the unit's first invocation in the boot
            if len(chosen) >= max_invocations:
                return None

    def _invocation_here(self, raw_unit: bytes) -> bytes | None:
        """The invocation id of the current entry of the unit (raw bytes); None when it has none."""
        pid = self._field_here(_FIELD_PID)
        if pid == b"1" and self._field_here(_FIELD_UNIT) == raw_unit:
            return self._field_here(_FIELD_INVOCATION_ID) or None
        return self._field_here(_FIELD_SYSTEMD_INVOCATION_ID) or None

    def _field_here(self, field_name: bytes) -> bytes | None:
        lib = self._lib
        assert lib is not None
        data, size = ctypes.c_void_p(), ctypes.c_size_t()
        result = lib.raw_get_data(self._handle, field_name, ctypes.byref(data), ctypes.byref(size))
        if result < 0:
            if result == -errno.ENOENT:
                return None
            raise JournalError.of_result("sd_journal_get_data", result, "reading a journal entry")
        return ctypes.string_at(data.value, size.value)[len(field_name) + 1:]

    def _invocations_before(self, units: dict[bytes, str], invocations: Sequence[bytes], cursor: bytes,
                            decode: Decoder) -> list[LogEntry]:
        """The entries of these invocations of these units up to the one at ``cursor`` (included), in
        journal order; the handle is left on the earliest one. Matched: (_SYSTEMD_UNIT=u… ∧
        _SYSTEMD_INVOCATION_ID=i…) ∨ (_PID=1 ∧ UNIT=u… ∧ INVOCATION_ID=i…), and _BOOT_ID=b unless all
        boots."""
        lib = self._lib
        assert lib is not None
        handle = self._handle
        if not invocations:
            return []
        lib.sd_journal_flush_matches(handle)
        add = lib.sd_journal_add_match
        for raw in sorted(units):
            add(handle, _FIELD_SYSTEMD_UNIT + b"=" + raw)
        for invocation in sorted(invocations):
            add(handle, _FIELD_SYSTEMD_INVOCATION_ID + b"=" + invocation)
        lib.sd_journal_add_disjunction(handle)
        add(handle, b"_PID=1")
        for raw in sorted(units):
            add(handle, _FIELD_UNIT + b"=" + raw)
        for invocation in sorted(invocations):
            add(handle, _FIELD_INVOCATION_ID + b"=" + invocation)
        if self._boot_id is not None:
            lib.sd_journal_add_conjunction(handle)
            add(handle, b"_BOOT_ID=" + self._boot_id.encode())
        lib.sd_journal_seek_cursor(handle, cursor)
        found: list[LogEntry] = []
        previous = lib.sd_journal_previous
        release_every = self.RELEASE_PAGES_EVERY
        while previous(handle):
            entry = decode(units, {})
            if entry is not None:
                found.append(entry)
                if len(found) % release_every == 0:
                    release_journal_pages(self._madvise)
        found.reverse()
        return found

    def _make_decoder(self) -> Decoder:
        """A function reading the current entry, or None if it belongs to no watched unit or container.

        The hot path of a catch-up: 7-8 foreign calls per entry (5-6 sd_journal_get_data, the
        two timestamps from the entry header, no cursor), everything it touches is a local. An
        entry of no watched unit, or of a refused one, costs one or two sd_journal_get_data (one more,
        ``CONTAINER_NAME``, while containers are watched, and ``PODMAN_EVENT`` when it has none); a
        container's, four or five more.
        Every result is checked: -ENOENT is an absent field; any other error makes the entry
        unreadable, skipped and counted (``unreadable_entries``).
        """
        lib = self._lib
        assert lib is not None
        handle = self._handle
        get_data = lib.raw_get_data
        get_realtime_usec = lib.raw_get_realtime_usec
        get_monotonic_usec = lib.raw_get_monotonic_usec
        string_at = ctypes.string_at
        data, size, usec = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_uint64()
        data_ref, size_ref, usec_ref = ctypes.byref(data), ctypes.byref(size), ctypes.byref(usec)
        boot = (ctypes.c_char * 16)()
        boot_ref = ctypes.byref(boot)
        boot_ids: dict[bytes, str] = {}
        invocation_ids: dict[bytes, str] = {}
        message_cap = self.max_message_bytes + len(_FIELD_MESSAGE) + 1
        entry_type = LogEntry
        admitted = self._admitted
        meet = self._meet
        absent = -errno.ENOENT
        unreadable = self._unreadable
        selection = self.selection
        keys: dict[tuple[bytes, int | None], str] = {}  # (CONTAINER_NAME, conmon's uid or None) -> key; '' not watched
        rejected = self._rejected_entries

        def optional(name: bytes) -> bytes | None:
            """A field of the current entry, None when absent; _UnreadableField when it cannot be read."""
            result = get_data(handle, name, data_ref, size_ref)
            if result >= 0:
                return string_at(data.value, size.value)[len(name) + 1:]
            if result == absent:
                return None
            raise _UnreadableField(result)

        def reject(reason: str) -> None:
            rejected[reason] = rejected.get(reason, 0) + 1
            return None

        def container(containers: dict[bytes, str], pid: int | None,
                      systemd_unit: bytes | None) -> tuple[str, str, bool] | None:
            """The watched container's key, run and partial flag of the current entry; None when it is none.
            A Podman "died" event of a watched container: its key, and as run ``_DIED_RUN`` + its id."""
            raw_name = optional(_FIELD_CONTAINER_NAME)
            died = False
            if raw_name is None:
                if optional(_FIELD_PODMAN_EVENT) != PODMAN_DIED or optional(b"PODMAN_TYPE") != b"container":
                    return None
                raw_name, died = optional(_FIELD_PODMAN_NAME), True
            name = None if raw_name is None else containers.get(raw_name)
            if name is None:
                return None
            # Believed only from the engine, by the fields journald adds (trust.py).
            uid, comm, exe = optional(b"_UID"), optional(b"_COMM"), optional(b"_EXE")
            if died:
                podman_uid = podman_uid_of(uid, comm, exe)
                if podman_uid is None:
                    return reject(REJECTED_PODMAN_EVENT)
            else:
                podman_uid = conmon_uid(uid, comm, exe)
                if podman_uid is None and not is_dockerd(uid, comm, exe, systemd_unit):
                    return reject(REJECTED_CONTAINER_SENDER)
            by_conmon = podman_uid is not None
            key = keys.get((raw_name, podman_uid))
            if key is None:
                key = (podman_key(name, podman_uid) if by_conmon else docker_key(name)) or ""
                if key and not selection.matches_container(key, name):
                    key = ""
                if len(keys) >= 4096:  # a few per name found by the query; bounded all the same
                    keys.clear()
                keys[raw_name, podman_uid] = key
            if not key:
                return None
            raw_key = key.encode()
            if raw_key not in admitted and not meet(raw_key, key):
                return None
            if died:
                return key, _DIED_RUN + (optional(b"PODMAN_ID") or b"").decode("ascii", "replace"), False
            run = (optional(b"CONTAINER_ID_FULL") or optional(b"CONTAINER_ID") or b"").decode("ascii", "replace")
            if by_conmon:
                if pid is not None:
                    run = f"{run}/{pid}"  # one conmon per start of the container
            elif (epoch := optional(b"CONTAINER_LOG_EPOCH")) is not None:
                run = f"{run}/{epoch.decode('ascii', 'replace')}"  # one epoch per start (Docker's log driver)
            return key, run, optional(b"CONTAINER_PARTIAL_MESSAGE") == b"true"

        def decode(watched: dict[bytes, str], containers: dict[bytes, str]) -> LogEntry | None:
            pid: int | None = None
            if (result := get_data(handle, b"_PID", data_ref, size_ref)) >= 0:
                text = string_at(data.value, size.value)[5:]
                pid = int(text) if text.isdigit() else None
            elif result != absent:
                return unreadable("sd_journal_get_data", result)
            unit = None
            raw_unit: bytes | None = None
            run: str | None = None  # a container's entry: its run
            partial = False
            from_systemd = pid == 1
            if from_systemd:
                if (result := get_data(handle, b"UNIT", data_ref, size_ref)) >= 0:
                    raw_unit = string_at(data.value, size.value)[5:]
                    unit = watched.get(raw_unit)
                    if unit is not None and raw_unit not in admitted and not meet(raw_unit, unit):
                        return None
                elif result != absent:
                    return unreadable("sd_journal_get_data", result)
            if unit is None:
                from_systemd = False
                raw_unit = None
                if (result := get_data(handle, b"_SYSTEMD_UNIT", data_ref, size_ref)) >= 0:
                    raw_unit = string_at(data.value, size.value)[14:]
                    unit = watched.get(raw_unit)
                    if unit is not None and raw_unit not in admitted and not meet(raw_unit, unit):
                        return None
                elif result != absent:
                    return unreadable("sd_journal_get_data", result)
                if unit is None:
                    if not containers:
                        return None
                    try:
                        found = container(containers, pid, raw_unit)
                    except _UnreadableField as error:
                        return unreadable("sd_journal_get_data", error.result)
                    if found is None:
                        return None
                    unit, run, partial = found
            if (result := get_data(handle, b"MESSAGE", data_ref, size_ref)) >= 0:
                length = size.value
                raw = string_at(data.value, length if length < message_cap else message_cap)
                message = raw[8:].decode("utf-8", "replace")
            elif result == absent:
                message = ""
            else:
                return unreadable("sd_journal_get_data", result)
            if run is not None:
                message_id = invocation = ""
                if not partial:  # conmon sends the line with its newline; a TTY's output ends in \r\n
                    message = message.rstrip("\r\n")
            else:
                if (result := get_data(handle, b"MESSAGE_ID", data_ref, size_ref)) >= 0:
                    message_id = string_at(data.value, size.value)[11:].decode("utf-8", "replace")
                elif result == absent:
                    message_id = ""
                else:
                    return unreadable("sd_journal_get_data", result)
                invocation_field = b"INVOCATION_ID" if from_systemd else b"_SYSTEMD_INVOCATION_ID"
                if (result := get_data(handle, invocation_field, data_ref, size_ref)) >= 0:
                    raw_invocation = string_at(data.value, size.value)[len(invocation_field) + 1:]
                    invocation = invocation_ids.get(raw_invocation)
                    if invocation is None:
                        if len(invocation_ids) >= 4096:  # one per start; bounded all the same
                            invocation_ids.clear()
                        invocation = invocation_ids[raw_invocation] = raw_invocation.decode("ascii", "replace")
                elif result == absent:
                    invocation = ""
                else:
                    return unreadable("sd_journal_get_data", result)
            if (result := get_realtime_usec(handle, usec_ref)) < 0:
                return unreadable("sd_journal_get_realtime_usec", result)
            realtime = usec.value
            if get_monotonic_usec(handle, usec_ref, boot_ref) >= 0:
                monotonic: int | None = usec.value
                raw_boot = boot.raw
                boot_id = boot_ids.get(raw_boot)
                if boot_id is None:
                    boot_id = boot_ids[raw_boot] = raw_boot.hex()
            else:  # the entry header could not be read again: the boot id from its field
                monotonic = None
                boot_id = ""
                if (result := get_data(handle, b"_BOOT_ID", data_ref, size_ref)) >= 0:
                    boot_id = string_at(data.value, size.value)[9:].decode("ascii", "replace")
                elif result != absent:
                    return unreadable("sd_journal_get_data", result)
            if run is not None:
                if run.startswith(_DIED_RUN):  # as systemd's record of a unit's main process exit
                    return entry_type(unit, realtime, monotonic, boot_id, "", True, MESSAGE_ID_UNIT_PROCESS_EXIT,
                                      None, "", run)
                return entry_type(unit, realtime, monotonic, boot_id, message, False, "", None, "", run, partial)
            return entry_type(unit, realtime, monotonic, boot_id, message, from_systemd, message_id, pid, invocation)

        return decode

    def _unreadable(self, function: str, result: int) -> None:
        """Count the current entry as unreadable (``function`` returned ``result``); it is skipped."""
        self._unreadable_entries += 1
        self.last_unreadable = JournalError.of_result(function, result, "reading a journal entry")
        return None

    # --- units, matches, position -----------------------------------------------------------

    def _meet(self, raw: bytes, unit: str) -> bool:
        """An entry of a watched unit not admitted yet (first met, or refused): admit it or not."""
        when = self._realtime_here()
        refused = self._refused.get(raw)
        if refused is not None and refused[0] == self._batches and (
                when is None or when - refused[1] < self.ADMIT_AGAIN_USEC):
            return False
        if self._admit is not None and not self._admit(unit, when):
            if len(self._refused) >= 65536:  # one per name refused; bounded all the same
                self._refused.clear()
            self._refused[raw] = (self._batches, when or 0)
            return False
        self._refused.pop(raw, None)
        self._admitted.add(raw)
        return True

    def _realtime_here(self) -> int | None:
        """The current entry's realtime timestamp (None if it cannot be read): when a name was met."""
        lib = self._lib
        assert lib is not None
        usec = ctypes.c_uint64()
        return usec.value if lib.raw_get_realtime_usec(self._handle, ctypes.byref(usec)) >= 0 else None

    def _refresh_units(self) -> None:
        self._units_stale = False
        found, found_containers = self._query_watched_units()
        new = {raw: name for raw, name in found.items() if raw not in self._watched}
        switched = False  # to _GlobbedNames: the decoder picks containers' entries from the boot's from now on
        if isinstance(found_containers, _GlobbedNames):
            switched = not isinstance(self._containers, _GlobbedNames)
            if switched:
                self._containers = found_containers
            new_containers: dict[bytes, str] = {}
        else:
            new_containers = {raw: name for raw, name in found_containers.items() if raw not in self._containers}
        if not new and not new_containers and not switched:
            return
        lib = self._lib
        assert lib is not None
        if not self._has_position:
            # Nothing has been read: the handle is still before the first entry.
            self._watched.update(new)
            self._containers.update(new_containers)
            self._apply_matches(self._watched, self._containers)
            lib.sd_journal_seek_head(self._handle)
            return
        cursor = self._position_cursor()
        cursor_entry_returned = not self._current_unreturned
        if new or new_containers:
            self._backlog.extend(self._entries_before(cursor, new, new_containers))
        self._watched.update(new)
        self._containers.update(new_containers)
        self._apply_matches(self._watched, self._containers)
        self._resume_at(cursor, cursor_entry_returned)

    def _query_watched_units(self) -> tuple[dict[bytes, str], dict[bytes, str]]:
        """The watched units' names, and the container names the container globs may match, in the journal."""
        lib = self._lib
        assert lib is not None
        began = time.monotonic()
        found: dict[bytes, str] = {}
        containers: dict[bytes, str] = {}
        queries = [(_FIELD_SYSTEMD_UNIT, found, self.selection.matches_unit),
                   (_FIELD_UNIT, found, self.selection.matches_unit)]
        if self.selection.container_globs:
            queries.append((_FIELD_CONTAINER_NAME, containers, self.selection.may_match_container_name))
        for field_name, into, matches in queries:
            lib.sd_journal_query_unique(self._handle, field_name)
            skip = len(field_name) + 1
            try:
                while (value := lib.sd_journal_enumerate_unique(self._handle)) is not None:
                    raw = value[skip:]
                    name = raw.decode("utf-8", "replace")
                    if matches(name):
                        into[raw] = name
                        if into is containers and len(containers) > self.CONTAINER_NAMES_MAX:
                            containers = _GlobbedNames(self.selection.may_match_container_name)
                            break
            except JournalError as error:
                # Without sd_journal_enumerate_available_unique (systemd < 246), a corrupt file
                # ends the listing: the values found before it are kept.
                if error.errno != errno.EBADMSG:
                    raise
        ended = time.monotonic()
        self._units_query_due = ended + (ended - began) / self.UNIT_QUERY_SHARE
        return found, containers

    def _apply_matches(self, units: dict[bytes, str], containers: dict[bytes, str] | None = None) -> None:
        """(_SYSTEMD_UNIT=u1 ∨ …) ∨ (_PID=1 ∧ (UNIT=u1 ∨ …)) ∨ (CONTAINER_NAME=c1 ∨ …), and _BOOT_ID=b
        unless all boots.

        sd_journal_add_match: matches of one field are ORed, of different fields ANDed;
        add_disjunction starts an OR branch, add_conjunction ANDs what follows with it all.
        Above ``MATCHED_UNITS_MAX`` units and containers, only _BOOT_ID=b (or nothing): the decoder filters.
        """
        lib = self._lib
        assert lib is not None
        handle = self._handle
        containers = containers or {}
        lib.sd_journal_flush_matches(handle)
        add = lib.sd_journal_add_match
        if len(units) + len(containers) <= self.MATCHED_UNITS_MAX:
            if units or not containers:
                for raw in sorted(units):
                    add(handle, b"_SYSTEMD_UNIT=" + raw)
                lib.sd_journal_add_disjunction(handle)
                add(handle, b"_PID=1")
                for raw in sorted(units):
                    add(handle, b"UNIT=" + raw)
                if containers:
                    lib.sd_journal_add_disjunction(handle)
            for raw in sorted(containers):
                add(handle, _FIELD_CONTAINER_NAME + b"=" + raw)
            if containers:  # Podman's events of their end
                lib.sd_journal_add_disjunction(handle)
                add(handle, _FIELD_PODMAN_EVENT + b"=" + PODMAN_DIED)
                for raw in sorted(containers):
                    add(handle, _FIELD_PODMAN_NAME + b"=" + raw)
            if self._boot_id is not None:
                lib.sd_journal_add_conjunction(handle)
        if self._boot_id is not None:
            add(handle, b"_BOOT_ID=" + self._boot_id.encode())

    def _position_cursor(self) -> bytes:
        """A cursor of the entry the handle is on (after reaching the end: the last one read).

        If that entry's file was deleted under the handle, sd-journal has no cursor for it; one
        made of the last returned entry's boot id and timestamps (sd_journal_seek_cursor takes
        such partial cursors) locates the same place.
        """
        lib = self._lib
        assert lib is not None
        try:
            return lib.sd_journal_get_cursor(self._handle)
        except JournalError as error:
            last = self._last_forward
            if last is None:
                raise JournalError(error.function, error.errno,
                                   message=f"the journal read position was lost: {error.strerror}") from None
        cursor = f"b={last.boot_id};t={last.realtime_usec:x}"
        if last.monotonic_usec is not None:
            cursor += f";m={last.monotonic_usec:x}"
        return cursor.encode()

    def _entries_before(self, cursor: bytes, units: dict[bytes, str],
                        containers: dict[bytes, str]) -> list[LogEntry]:
        """The given units' and containers' entries before ``cursor``, in journal order (moves the handle)."""
        lib = self._lib
        assert lib is not None
        handle = self._handle
        self._apply_matches(units, containers)
        lib.sd_journal_seek_cursor(handle, cursor)
        decode = self._decoder or self._make_decoder()
        self._decoder = decode
        found: list[LogEntry] = []
        while lib.sd_journal_previous(handle):
            if lib.sd_journal_test_cursor(handle, cursor):
                continue
            entry = decode(units, containers)
            if entry is not None:
                found.append(entry)
        found.reverse()
        return found

    def _resume_at(self, cursor: bytes, cursor_entry_returned: bool) -> None:
        """Put the handle back on the entry at ``cursor`` or, if that is gone, on the next one."""
        lib = self._lib
        assert lib is not None
        handle = self._handle
        lib.sd_journal_seek_cursor(handle, cursor)
        if not lib.sd_journal_next(handle):
            self._current_unreturned = False
        elif lib.sd_journal_test_cursor(handle, cursor):
            self._current_unreturned = not cursor_entry_returned
        else:
            # The cursor's entry was vacuumed; the one the handle is on has not been returned.
            self._current_unreturned = True

    def _reopen_at_position(self) -> None:
        cursor = self._position_cursor() if self._has_position else None
        cursor_entry_returned = not self._current_unreturned
        lib = self._lib
        assert lib is not None
        lib.sd_journal_close(self._handle)
        self._handle = ctypes.c_void_p()
        self._open_handle()
        self._watched, self._containers = self._query_watched_units()
        self._units_stale = False
        self._more_pending = True
        self._current_unreturned = False
        if not self._watched and not self._containers:
            self._has_position = False
            return
        self._apply_matches(self._watched, self._containers)
        if cursor is None:
            return
        self._resume_at(cursor, cursor_entry_returned)


def _check_readable_directory(path: str) -> None:
    """Raise JournalError unless ``path`` is a directory whose journal files we can read."""
    try:
        is_directory = stat.S_ISDIR(os.stat(path).st_mode)
    except FileNotFoundError:
        raise JournalError("stat", errno.ENOENT, message=f"journal directory {path} does not exist") from None
    except OSError as error:
        raise JournalError("stat", error.errno, message=(
            f"journal directory {path} is not readable: {error.strerror.lower()}")) from None
    if not is_directory:
        raise JournalError("stat", errno.ENOTDIR, message=f"journal directory {path} is not a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise JournalError("access", errno.EACCES, message=(
            f"journal directory {path} is not readable: permission denied"))
    journal_files = list(_journal_files_under(path))
    if journal_files and not any(os.access(p, os.R_OK) for p in journal_files):
        raise JournalError("access", errno.EACCES, message=(
            f"no journal file in {path} is readable: permission denied (the reader needs group systemd-journal or adm)"))


def _journal_files_under(path: str) -> Iterable[str]:
    """Journal files in ``path`` and its machine-id subdirectories, where sd-journal looks."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        if entry.name.endswith((".journal", ".journal~")):
            yield entry.path
        elif _HEX32.fullmatch(entry.name) and entry.is_dir():
            try:
                yield from (e.path for e in os.scandir(entry.path) if e.name.endswith((".journal", ".journal~")))
            except OSError:
                continue


def _check_readable_file(path: str) -> None:
    try:
        os.stat(path)
    except FileNotFoundError:
        raise JournalError("stat", errno.ENOENT, message=f"journal file {path} does not exist") from None
    except OSError as error:
        raise JournalError("stat", error.errno, message=(
            f"journal file {path} is not readable: {error.strerror.lower()}")) from None
    if not os.access(path, os.R_OK):
        raise JournalError("access", errno.EACCES, message=f"journal file {path} is not readable: permission denied")
