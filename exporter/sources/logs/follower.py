"""The log follower: a source that owns its thread and a log reader, and publishes the fold.

The thread owns the reader (an sd_journal handle belongs to one thread): it reads the selected boot into
a fresh fold (OwnedTrackers: an EngineTracker per owner, the system and each user), publishes it once
caught up, then folds new entries in as they arrive. When the
log cannot be read it retries; a reopened log is read again from the start of the boot into a
new tracker, swapped in once caught up, so counters never count twice.

The reader is whatever ``open_reader`` makes, a ``LogReader``: the journal's
(``vllm_xpu_exporter.sources.journal.open_journal``) or the containers' log files'
(``vllm_xpu_exporter.sources.containerlogs``); ``source`` names it in its state and log lines. Why the log has no
answer now is a ``LogError`` in ``LogState.error``: ``LogUnreadable`` (a failure) or ``LogNotReadYet`` (the
first read under way; also a ``NoDataYet``).

With ``latest_invocations`` (the init gate, the planner) it reads not the whole boot but each watched unit's
latest invocations (the journal reader's ``read_latest_invocations``): back to one that printed a vLLM line
before the latest, so the fold knows the unit runs an engine and has its latest printed start (the gated
unit's gpu_memory_utilization), and whether its current start is initialising and since when, as the whole
boot would say. Its counters (starts, failures, overlaps) cover only what was read: the exporter reads
the whole boot.

Containers' lines (the selection's container globs) go through `ContainerRuns` on their way to the fold:
their pieces joined, each run of a container given an invocation id of its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Protocol, runtime_checkable

from vllm_xpu_exporter.fold.container_runs import ContainerRuns
from vllm_xpu_exporter.fold.engine_starts import DEFAULT_MAX_UNITS, EngineTracker, OwnedTrackers, UnitView
from vllm_xpu_exporter.nodatayet import NoDataYet
from vllm_xpu_exporter.sources.logs.entry import DEFAULT_BATCH, LogEntry, LogSelection

log = logging.getLogger("vllm_xpu_exporter.journal")

RETRY_SECONDS = 2.0
WAIT_SECONDS = 0.5  # how often the follower looks at its stop flag while the log is quiet

@runtime_checkable
class LogReader(Protocol):
    """What the follower reads a log through; the journal's ``JournalReader`` and the containers' log files'
    ``ContainerLogReader`` are such readers. Single-threaded: the follower's thread alone uses it."""

    @property
    def unreadable_entries(self) -> int:
        """Entries skipped as unreadable so far (a plain number: other threads read it)."""
        ...

    @property
    def last_unreadable(self) -> str | OSError | None:
        """Why the latest of them could not be read."""
        ...

    @property
    def rejected_entries(self) -> dict[str, int]:
        """Entries ignored, by reason (a record its writer may not have written); none for a reader that rejects
        nothing."""
        ...

    def open(self) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> LogReader: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...

    def wait(self, timeout_s: float) -> bool:
        """Sleep until entries may have come or `timeout_s` passed; True when they may have."""
        ...

    def read_available(self, max_entries: int = DEFAULT_BATCH) -> list[LogEntry]:
        """Up to `max_entries` entries there are now, without waiting; [] when there are none."""
        ...

    def read_latest_invocations(self, sufficient: Callable[[list[LogEntry]], bool], *,
                                max_units: int | None = None) -> list[LogEntry] | None:
        """The entries of each watched unit's latest invocations, back to one `sufficient` says is enough;
        None when the reader cannot tell them apart (then it reads the whole log)."""
        ...


OpenReader = Callable[[LogSelection, Callable[..., bool], Callable[[str], None]], LogReader]
"""(selection, admit, forget) -> a reader: admit(unit[, when_usec]) asks the fold's cap (when the name was met,
if known), forget(unit) drops a unit gone for good."""


class LogError(Exception):
    """Why a log source has no answer now (``LogState.error``); str() is the message alone."""


class LogUnreadable(LogError):
    """The log cannot be read now: a failure, retried."""


class LogNotReadYet(LogError, NoDataYet):
    """The log is being read the first time: no data yet, a state every start goes through, not a failure."""


@dataclass(frozen=True)
class LogState:
    views: list[UnitView]
    error: LogError | None  # why the log has no answer now: LogUnreadable, or LogNotReadYet while it is first read
    entries_read: int  # entries folded since the follower started, re-reads included (LogFollower._fold)
    dropped_units: int  # units not watched because of the cap
    watched_units: int | None  # None until the log has been read up to now once
    values_rejected: int  # lines ignored for an implausible value (vllm_xpu_exporter.parsers.vllm.PLAUSIBLE)
    unreadable: int = 0  # entries the reader skipped as unreadable (container logs: lines not of their format)
    rejected: dict[str, int] = field(default_factory=dict)  # entries ignored by reason (reader.rejected_entries)


class LogFollower:
    def __init__(self, selection: LogSelection, max_units: int = DEFAULT_MAX_UNITS, *, open_reader: OpenReader,
                 source: str, latest_invocations: bool = False) -> None:
        self.selection = selection
        self.max_units = max_units
        self.latest_invocations = latest_invocations
        self.source = source
        self._open_reader = open_reader
        self.caught_up_from: str | None = None
        """What the latest catch-up read: "latest invocations", or "boot" (the whole selected boot)."""
        self._lock = threading.Lock()
        self._starting = threading.Lock()  # concurrent scrapes retry starting the thread once
        self._tracker: OwnedTrackers | None = None
        self._runs = ContainerRuns()  # the containers' runs of the tracker being filled or followed
        self._error: LogError | None = self._still_reading()
        self._entries_read = 0
        self._unreadable_before = 0  # entries skipped as unreadable by the readers closed since
        self._rejected_before: Counter[str] = Counter()  # entries rejected by the readers closed since
        self._reader: LogReader | None = None  # the thread's reader (its unreadable count is read by state())
        self._units_with_processes: set[str] = set()
        self._warned_of_rejections: set[str] = set()  # follower thread only
        self._warned_of_unreadable = False  # follower thread only
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_retry_at: float | None = None  # set while the thread could not be started

    def start(self) -> None:
        """Start following in a thread; if none can be started now (a task limit), the collector reports
        that and state() tries again every RETRY_SECONDS."""
        thread = threading.Thread(target=self._run, name=f"{self.source.replace(' ', '-')}-follower", daemon=True)
        self._set_error(self._still_reading())
        try:
            thread.start()
        except RuntimeError as error:  # "can't start new thread"
            self._set_error(LogUnreadable(f"cannot start the {self.source} follower thread: {error}"))
            self._start_retry_at = time.monotonic() + RETRY_SECONDS
            return
        self._thread = thread
        self._start_retry_at = None

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._start_retry_at = None
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)

    def state(self) -> LogState:
        """The fold as of now: failed starts whose root cause has not come within the grace time are
        settled by the wall clock (EngineTracker.settle) before their views are taken."""
        retry_at = self._start_retry_at
        if retry_at is not None and time.monotonic() >= retry_at and not self._stop.is_set():
            with self._starting:
                if self._start_retry_at == retry_at:
                    self.start()
        with self._lock:
            tracker = self._tracker
            if tracker is not None:
                tracker.settle(round(time.time() * 1e6))
            views = list(tracker.views()) if tracker is not None else []
            reader = self._reader
            return LogState(views=views, error=self._error, entries_read=self._entries_read,
                            dropped_units=len(tracker.dropped_units) if tracker is not None else 0,
                            watched_units=len(views) if tracker is not None else None,
                            values_rejected=tracker.rejected_lines if tracker is not None else 0,
                            unreadable=self._unreadable_before + (reader.unreadable_entries if reader else 0),
                            rejected=dict(self._rejected_before + Counter(reader.rejected_entries if reader else {})))

    def watch(self, units: set[str]) -> None:
        """Units that currently have GPU processes: those matching the globs are watched even when the
        journal has nothing of them (yet). Containers (keys with a `/`) are watched once their lines are
        met: one may log to the journal, another to files."""
        new = {unit for unit in units if "/" not in unit and self.selection.matches_unit(unit)}
        new -= self._units_with_processes
        if not new:
            return
        with self._lock:
            self._units_with_processes |= new
            for unit in new:
                if self._tracker is not None:
                    self._tracker.watch(unit)

    def _run(self) -> None:
        while not self._stop.is_set():
            tracker = OwnedTrackers(self.max_units, self.selection.engine_grace_usec)
            self._runs = ContainerRuns()
            try:
                # Units beyond the cap are refused when first met: the reader skips their entries.
                reader = self._open_reader(self.selection, partial(self._admit, tracker),
                                           partial(self._forget, tracker))
                with reader:
                    self._reader = reader
                    try:
                        self._catch_up(reader, tracker)
                        self._follow(reader)
                    finally:
                        with self._lock:
                            self._unreadable_before += reader.unreadable_entries
                            self._rejected_before.update(reader.rejected_entries)
                            self._reader = None
            except OSError as error:  # JournalError, ContainerLogError: a message of their own
                self._set_error(LogUnreadable(str(error)))
                self._stop.wait(RETRY_SECONDS)
            except Exception as error:  # never let the thread die: the collector would go silent
                log.debug("%s follower failed", self.source, exc_info=True)
                self._set_error(LogUnreadable(f"{type(error).__name__}: {error}"))
                self._stop.wait(RETRY_SECONDS)

    def _catch_up(self, reader: LogReader, tracker: OwnedTrackers) -> None:
        with self._lock:
            for unit in self._units_with_processes:
                tracker.watch(unit)
        entries = None
        if self.latest_invocations:
            entries = reader.read_latest_invocations(partial(prints_a_vllm_line, tracker.engine_grace_usec),
                                                     max_units=self.max_units,
                                                     init_over=partial(init_over, tracker.engine_grace_usec),
                                                     recent_usec=2 * tracker.engine_grace_usec)
        self.caught_up_from = "boot" if entries is None else "latest invocations"
        for begin in range(0, len(entries or ()), DEFAULT_BATCH):
            if self._stop.is_set():
                return
            self._fold(reader, tracker, entries[begin:begin + DEFAULT_BATCH], published=False)
        while batch := reader.read_available(DEFAULT_BATCH):
            if self._stop.is_set():
                return  # stopping: a half-read log is never published
            self._fold(reader, tracker, batch, published=False)
        with self._lock:
            self._tracker = tracker
            if self._error is not None:
                log.info("%s read up to now: %d watched units", self.source, sum(1 for _ in tracker.views()))
            self._error = None

    def _follow(self, reader: LogReader) -> None:
        tracker = self._tracker
        while not self._stop.is_set():
            if not reader.wait(WAIT_SECONDS):
                continue
            while batch := reader.read_available(DEFAULT_BATCH):
                self._fold(reader, tracker, batch, published=True)

    def _fold(self, reader: LogReader, tracker: OwnedTrackers, batch: list[LogEntry], *,
              published: bool) -> None:
        """Fold a batch the reader returned, and count it: the one count of entries read
        (``LogState.entries_read``, xpu_exporter_journal_entries_read_total), kept across re-reads of
        the journal, so it counts the entries of a re-read boot again. It grows during the catch-up,
        before the tracker is published; a published tracker is folded under the lock the scrapes read
        it with."""
        lines = list(self._runs.lines(batch)) if self.selection.container_globs else batch
        with self._lock:
            self._entries_read += len(batch)
            if published:
                tracker.extend(lines)
        if not published:
            tracker.extend(lines)
        self._warn_of_rejections(tracker)
        self._warn_of_unreadable(reader)

    def _warn_of_rejections(self, tracker: OwnedTrackers) -> None:
        """Once per unit (also across re-reads of the journal): the value is not logged, it may be huge."""
        for unit, rejection in tracker.first_rejections.items():
            if unit not in self._warned_of_rejections:
                self._warned_of_rejections.add(unit)
                log.warning("unit %s printed a %r line whose %s is out of range or not a number; such lines "
                            "are ignored and counted in xpu_exporter_journal_values_rejected_total",
                            unit, rejection.row, rejection.field)

    def _warn_of_unreadable(self, reader: LogReader) -> None:
        """Once: entries sd-journal cannot read are skipped (as journalctl skips them), not waited on; so are
        lines of container logs that are not records of their format."""
        if reader.unreadable_entries and not self._warned_of_unreadable:
            self._warned_of_unreadable = True
            log.warning("skipped %s that cannot be read (%s); such entries are skipped",
                        "a journal entry" if self.source == "journal" else f"an entry of the {self.source}",
                        reader.last_unreadable)

    def _admit(self, tracker: OwnedTrackers, unit: str, when_usec: int | None = None) -> bool:
        with self._lock:
            return tracker.admit(unit, when_usec)

    def _forget(self, tracker: OwnedTrackers, unit: str) -> None:
        """A unit gone for good (a container removed): its series go, its place under the cap is free."""
        with self._lock:
            tracker.forget(unit)
        self._runs.forget(unit)

    def _still_reading(self) -> LogNotReadYet:
        return LogNotReadYet(f"still reading the {self.source}")

    def _set_error(self, error: LogError) -> None:
        with self._lock:
            self._error = error


def prints_a_vllm_line(engine_grace_usec: int, entries: list[LogEntry]) -> bool:
    """Whether the fold takes a line of these entries (one invocation of one unit) as vLLM's: the start
    printed, so its unit runs an engine and its latest printed start is known."""
    tracker = EngineTracker(1, engine_grace_usec)
    tracker.extend(entries)
    return any(view.latest is not None for view in tracker.views())


def init_over(engine_grace_usec: int, entries: list[LogEntry]) -> bool:
    """Whether the init of the start in these entries (the head of one invocation of one unit) has ended: its
    main process began and it is not initialising (done, failed, or known to run no engine). Its later output
    (a serving engine's request lines) changes no decision."""
    tracker = EngineTracker(1, engine_grace_usec)
    tracker.extend(entries)
    return any(view.current is not None and view.current.main_began_usec is not None
               and view.initialising_since_usec is None for view in tracker.views())
