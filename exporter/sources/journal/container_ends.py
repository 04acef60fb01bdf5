"""The ends of watched containers that log to the journal, handed on among their entries as systemd's records
of a unit's end are among its lines (``JournalReader``, with container globs).

Where a container's end is told is its runtime's (``vllm_xpu_exporter.runtimes``): in its state on disk, read
with the selection's ``container_state`` locations (the runtime's ``exit_watch``: Docker's ``config.v2.json``,
by ``CONTAINER_ID_FULL``, as the container-log source reads it) and handed on as ``container_end``; or in the
journal, as the runtime's own event (``trust.EXIT_EVENTS``: Podman's "died" event, when its events logger is
``journald``), which the decoder returns with the run ``EXIT_RUN`` + its container's id.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from vllm_xpu_exporter.runtimes import ContainerExit, ExitWatch
from vllm_xpu_exporter.runtimes.registry import runtime_of_key
from vllm_xpu_exporter.sources.journal.decoder import EXIT_RUN
from vllm_xpu_exporter.sources.logs.entry import LogEntry, container_end

END_LOOK_SECONDS = 1.0
"""How often, at most, the reader looks at its containers' state for their end."""


@dataclass
class _WatchedRun:
    """A container of the journal whose end its runtime's state tells: its latest run and where its end is read."""

    run: str
    container_id: str
    since_usec: int  # the run's first entry: an end before it is an older run's
    end: ExitWatch


class ContainerEnds:
    """The watched containers' ends among the entries of one read position (a new one when the reader starts
    reading again from the start of the boot)."""

    def __init__(self, container_state: Mapping[str, object]) -> None:
        self._container_state = container_state
        """Where the runtimes' state is (``JournalSelection.container_state``); none: no end is read from it."""
        self._watched: dict[str, _WatchedRun] = {}
        """Watched containers returned so far (by key) whose end is looked for in their state."""
        self._look_due = 0.0
        self._pending: list[tuple[int, str, ContainerExit]] = []
        """Ends read, not handed on yet (their time, key, end), earliest first."""
        self._latest_runs: dict[str, str] = {}
        """The latest run of each watched container returned (a runtime's exit event ends it)."""

    @property
    def next_look(self) -> float | None:
        """When (``time.monotonic()``) the containers' state is to be looked at again for their ends; None while
        none is followed. The reader wakes up for it while it waits on a quiet journal."""
        return self._look_due if self._watched else None

    def among(self, entries: list[LogEntry], *, at_end: bool) -> list[LogEntry]:
        """The entries with the ends of watched containers among them: an end in a container's state is read
        (its runtime's ``exit_watch``) when a new run of it is met, and, once the reader is at the journal's end
        (``at_end``), at most every ``END_LOOK_SECONDS`` (Docker: a stat of one file a container, read when it
        changed); never per entry. An end goes before the first entry later than it (reading a boot's history,
        the container's death comes before the inits that followed it, which then overlap nothing) or, none
        being later, at the end, in the container's latest run then. So a container that died silently during
        its init counts as `other` (unless its cause comes within the grace), one stopped as stopped, and
        neither stays initialising, as with its log files (``vllm_xpu_exporter.sources.containerlogs``).
        A runtime's exit event (selected with the container's name) is such an end where the journal has it:
        it goes in the container's latest run when that run is of the event's container, else it is dropped
        (a container none of whose lines was read)."""
        pending = self._pending
        latest_runs = self._latest_runs
        out: list[LogEntry] = []
        for entry in entries:
            if pending and pending[0][0] < entry.realtime_usec:
                self._hand_on(out, entry.realtime_usec)
            run = entry.container_run
            if not run:
                out.append(entry)
                continue
            if entry.from_systemd:  # a runtime's exit event: in the container's latest run, if it is that one's
                latest = latest_runs.get(entry.unit)
                if latest is not None and latest.split("/", 1)[0] == run[len(EXIT_RUN):]:
                    out.append(replace(entry, container_run=latest))
                continue
            if latest_runs.get(entry.unit) != run:
                latest_runs[entry.unit] = run
                self._run_met(entry.unit, run, entry.realtime_usec)
            out.append(entry)
        if at_end:
            if self._watched and time.monotonic() >= self._look_due:
                self._look_due = time.monotonic() + END_LOOK_SECONDS
                for key, known in self._watched.items():
                    self._look_for_end(key, known)
            self._hand_on(out, None)
        return out

    def _run_met(self, key: str, run: str, realtime_usec: int) -> None:
        """A new run of a container (its id, with what tells its starts apart): its end is looked for, where
        its runtime's state tells it."""
        container_id = run.split("/", 1)[0]
        known = self._watched.get(key)
        if known is not None and known.container_id == container_id:
            end: ExitWatch | None = known.end  # a new start of the same container: its end is the same file's
        else:
            runtime = runtime_of_key(key)
            end = None if runtime is None else runtime.state.exit_watch(container_id, self._container_state)
            if end is None:
                return
        known = self._watched[key] = _WatchedRun(run, container_id, realtime_usec, end)
        self._look_for_end(key, known)

    def _look_for_end(self, key: str, known: _WatchedRun) -> None:
        ended = known.end.ended(known.since_usec)
        if ended is not None:
            self._pending.append((ended.realtime_usec, key, ended))
            self._pending.sort(key=lambda pending: pending[0])

    def _hand_on(self, out: list[LogEntry], before_usec: int | None) -> None:
        """The pending ends earlier than ``before_usec`` (all: None), each in its container's latest run."""
        pending = self._pending
        while pending and (before_usec is None or pending[0][0] < before_usec):
            _, key, ended = pending.pop(0)
            out.append(container_end(key, ended.realtime_usec, ended.stopped, self._watched[key].run))
