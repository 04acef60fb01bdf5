"""The systemd journal as a source of watched units' entries, read through libsystemd with ctypes.

Usable alone from a Python shell::

    >>> from vllm_xpu_exporter.sources.journal import JournalReader
    >>> from vllm_xpu_exporter.sources.journal import JournalSelection
    >>> with JournalReader(JournalSelection(unit_globs=["vllm*.service"], boot="all")) as reader:
    ...     for entry in reader.read_available(100):
    ...         print(entry.unit, entry.message)

What is selected, for every unit whose name matches one of the globs (``fnmatch``, case-sensitive
like unit names): the entries the unit wrote (``_SYSTEMD_UNIT=<unit>``: its stdout/stderr, its
syslog and native journal messages) and the records systemd itself (PID 1) wrote about the unit
(``_PID=1`` and ``UNIT=<unit>``: start job begun/done/failed, process exited, unit failed, restart
scheduled, stop). User-manager records (``USER_UNIT=``) are not selected: only system units are.

Containers that log to the journal (a container runtime's ``journald`` log driver,
``vllm_xpu_exporter.runtimes.JournalDriver``) are selected by name: the entries whose ``CONTAINER_NAME``
matches one of the container globs (``container_globs``, none by default; see
``LogSelection.matches_container``), unless their ``_SYSTEMD_UNIT`` is a watched unit (a Podman quadlet
container's conmon runs in its ``.service``, which keeps them). Such an entry is believed only when the fields
journald adds say its runtime wrote it (``trust``); it then belongs to the container's key, as the runtime
makes it from the name and the writer's uid (``podman/<name>@uid<N>`` when user N's conmon wrote it). A
runtime's own events of a watched container's end (``trust.EXIT_EVENTS``: Podman's ``PODMAN_EVENT=died``),
are selected too: they end the container's run, as systemd's "Main process exited" record ends a unit's
start. Any other entry naming a watched container is ignored and counted in ``rejected_entries``.

A container's end its runtime does not write to the journal (Docker's) is read from its state on disk, with
the selection's ``container_state``, as the container-log source does, and handed on among the entries as
systemd's record of a unit's end (``container_ends``).

All of these are sd-journal matches, so libsystemd walks its per-value entry indexes instead of every entry.

Every failure to read the journal raises ``JournalError`` (``vllm_xpu_exporter.sources.journal.binding``),
an OSError that keeps the errno and the failed function's name.
"""

from __future__ import annotations

import ctypes
import errno
import os
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from types import TracebackType

from vllm_xpu_exporter.sources.journal.binding import (
    LIBSYSTEMD,
    SD_JOURNAL_LOCAL_ONLY,
    SD_JOURNAL_NOP,
    SD_JOURNAL_SYSTEM,
    JournalError,
    LibSystemd,
)
from vllm_xpu_exporter.sources.journal.container_ends import ContainerEnds
from vllm_xpu_exporter.sources.journal.decoder import FIELD_MESSAGE, Decoder, make_decoder
from vllm_xpu_exporter.sources.journal.files import (SYSTEM_JOURNAL_DIRECTORIES, check_readable_directory,
                                                     check_readable_file, libc_madvise, release_journal_pages)
from vllm_xpu_exporter.sources.journal.host import BOOT_ID_PATH, current_boot_id
from vllm_xpu_exporter.sources.journal.invocations import MAX_INVOCATIONS_BACK, InvocationWalk
from vllm_xpu_exporter.sources.journal.matches import (GlobbedNames, apply_matches, query_trusted_units,
                                                       query_watched_units)
from vllm_xpu_exporter.sources.journal.position import entries_before, position_cursor, resume_at
from vllm_xpu_exporter.sources.journal.selection import JournalSelection
from vllm_xpu_exporter.sources.logs.entry import DEFAULT_BATCH, LogEntry

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024
RECENT_USEC = 120_000_000
"""``read_latest_invocations``: PID 1's records this recent name units that may have printed nothing yet."""


def open_journal(selection: JournalSelection, admit: Callable[[str, int | None], bool],
                 forget: Callable[[str], None]) -> JournalReader:
    """The journal's reader for a ``LogFollower`` (its ``open_reader``); the journal forgets no unit."""
    return JournalReader(selection, admit=admit)


class JournalReader:
    """Reads the selected units' and containers' entries from the journal: catches up, then follows.

    ``open()`` positions before the first selected entry; ``read_available()`` returns what is
    there now, in journal order; ``wait()`` blocks until the journal changes. The consumer
    re-reads the selected boot on start, so no cursor is kept across runs.

    Single-threaded: an sd_journal handle must only ever be used from one thread. Create, use
    and close a reader in the same thread (a ``LogFollower`` runs it in its own thread).

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
        of journal time, then asked again. That is how a consumer's cap on the number of units (the
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
    """Up to this many watched units are sd-journal matches; beyond it the reader filters the boot's entries."""
    CONTAINER_NAMES_MAX = 256
    """Beyond this many container names the globs may match, the names are not listed: ``GlobbedNames``."""
    UNIT_QUERY_SHARE = 0.01
    """At most this share of the time goes to looking for new units while following."""

    def __init__(
        self,
        selection: JournalSelection,
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
        self._container_state = selection.container_state if selection.container_globs else {}
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
        self._container_ends = ContainerEnds(self._container_state)

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
                check_readable_file(path)
            handle = lib.sd_journal_open_files(selection.files, 0)
        elif selection.directory is not None:
            check_readable_directory(selection.directory)
            handle = lib.sd_journal_open_directory(selection.directory, 0)
        else:
            existing = [d for d in SYSTEM_JOURNAL_DIRECTORIES if os.path.isdir(d)]
            if not existing:
                raise JournalError("stat", errno.ENOENT, message=(
                    "no system journal: neither " + " nor ".join(SYSTEM_JOURNAL_DIRECTORIES) + " exists"))
            for directory in existing:
                check_readable_directory(directory)
            handle = lib.sd_journal_open(SD_JOURNAL_LOCAL_ONLY | SD_JOURNAL_SYSTEM)
            self._missing_roots = tuple(d for d in SYSTEM_JOURNAL_DIRECTORIES if d not in existing)
        try:
            # Only compressed fields honour the threshold; longer plain ones are cut in Python.
            lib.sd_journal_set_data_threshold(handle, self.max_message_bytes + len(FIELD_MESSAGE) + 1)
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
        ends_look = self._container_ends.next_look
        if ends_look is not None:  # a look at the containers' state for their end is due
            remaining = ends_look - time.monotonic()
            if remaining <= 0:
                return True
            timeout_s = min(timeout_s, remaining)
        result = lib.sd_journal_wait(self._handle, max(0, int(timeout_s * 1_000_000)))
        if result == SD_JOURNAL_NOP:
            now = time.monotonic()
            return (self._units_stale and now >= self._units_query_due) or \
                (ends_look is not None and now >= ends_look)
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
            out = self._container_ends.among(out, at_end=not self._more_pending and not self._backlog)
        return out

    def _read_forward(self, out: list[LogEntry], max_entries: int) -> None:
        lib = self._lib
        assert lib is not None
        handle = self._handle
        next_entry = lib.raw_next
        decode = self._decoder or self._make_decoder()
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
        init_over: Callable[[list[LogEntry]], bool] | None = None,
        recent_usec: int = RECENT_USEC,
    ) -> list[LogEntry] | None:
        """The entries of each watched unit's latest invocations, in journal order; then the reader
        follows from the journal's last selected entry (``read_available()`` returns what comes after
        it). Call it first after ``open()``.

        A unit's latest invocation is the one of its last entry (``_SYSTEMD_INVOCATION_ID`` of its
        output, ``INVOCATION_ID`` of PID 1's records about it). From there the reader steps back an
        invocation at a time (the unit's entry just before the earlier one's first entry) until it has
        read, besides the latest, one for which ``sufficient(entries)`` is true (the journal follower:
        one that printed a vLLM line, so the unit is known to run an engine and its latest printed
        start is among those read), or the unit's first invocation in the boot. The entries read of an
        invocation are returned also when stored after a later invocation began.

        Of each invocation only what a decision needs is read, however long it ran: PID 1's records of it, its
        output from its start until ``init_over(entries)`` says its init has ended, and its last few entries
        (``InvocationWalk``); without ``init_over``, its whole output.

        The units are those journald vouches for (``query_trusted_units``): the writers' ``_SYSTEMD_UNIT``, and
        the ``UNIT`` of PID 1's records within ``recent_usec`` of the journal's end (a unit started that has
        printed nothing yet; the follower gives twice its engine grace), never any process's ``UNIT=``.

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
        if self.selection.container_globs:
            return self._read_whole_boot()  # a container's lines carry no invocation id
        found = query_trusted_units(lib, self._handle, self.selection, self._boot_id, recent_usec)
        if not found or len(found) > self.MATCHED_UNITS_MAX or (max_units is not None and len(found) > max_units):
            return self._read_whole_boot()
        walk = InvocationWalk(lib, self._handle, self._decoder or self._make_decoder(), boot_id=self._boot_id,
                              match_units=self._apply_matches,
                              release_pages=partial(release_journal_pages, self._madvise),
                              release_every=self.RELEASE_PAGES_EVERY, init_over=init_over)
        read = walk.read(found, sufficient, max_invocations)
        if read is None:
            return self._read_whole_boot()
        entries, tail = read
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

    def _make_decoder(self) -> Decoder:
        """The decoder of the open handle (``make_decoder``), kept until the handle or the position changes."""
        assert self._lib is not None
        self._decoder = make_decoder(self._lib, self._handle, self.selection, max_message_bytes=self.max_message_bytes,
                                     admitted=self._admitted, meet=self._meet, unreadable=self._unreadable,
                                     rejected=self._rejected_entries)
        return self._decoder

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
        switched = False  # to GlobbedNames: the decoder picks containers' entries from the boot's from now on
        if isinstance(found_containers, GlobbedNames):
            switched = not isinstance(self._containers, GlobbedNames)
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
        cursor = position_cursor(lib, self._handle, self._last_forward)
        cursor_entry_returned = not self._current_unreturned
        if new or new_containers:
            self._apply_matches(new, new_containers)
            self._backlog.extend(entries_before(lib, self._handle, cursor, self._decoder or self._make_decoder(),
                                                new, new_containers))
        self._watched.update(new)
        self._containers.update(new_containers)
        self._apply_matches(self._watched, self._containers)
        self._resume_at(cursor, cursor_entry_returned)

    def _query_watched_units(self) -> tuple[dict[bytes, str], dict[bytes, str]]:
        """``query_watched_units``; the next query is put off by ``1 / UNIT_QUERY_SHARE`` times its duration."""
        began = time.monotonic()
        found = query_watched_units(self._require_open(), self._handle, self.selection, self.CONTAINER_NAMES_MAX)
        ended = time.monotonic()
        self._units_query_due = ended + (ended - began) / self.UNIT_QUERY_SHARE
        return found

    def _apply_matches(self, units: dict[bytes, str], containers: dict[bytes, str] | None = None) -> None:
        """Select the entries of these units and containers from now on (``apply_matches``)."""
        apply_matches(self._require_open(), self._handle, units, containers or {}, self._boot_id,
                      self.MATCHED_UNITS_MAX)

    def _resume_at(self, cursor: bytes, cursor_entry_returned: bool) -> None:
        """Put the handle back on the entry at ``cursor`` (``resume_at``)."""
        self._current_unreturned = resume_at(self._require_open(), self._handle, cursor, cursor_entry_returned)

    def _reopen_at_position(self) -> None:
        cursor = position_cursor(self._require_open(), self._handle, self._last_forward) if self._has_position else None
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
