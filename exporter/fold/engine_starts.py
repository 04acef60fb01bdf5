"""Engine starts of watched units, folded from their journal: what each start printed, how it ended,
and whether it overlapped another unit's init.

Input is the journal in journal order: the unit's own lines (parsed by `vllm_xpu_exporter.parsers.vllm`; the
lines of the init gate `vllm-xpu-gate`, by `vllm_xpu_exporter.parsers.gate`) and PID 1's records about it.

A *start* is one invocation of the unit. Every record of one start carries the same invocation id
(`_SYSTEMD_INVOCATION_ID` on the unit's output, `INVOCATION_ID` on PID 1's records; a restart gets a
new one): where the journal has it, it says which start an entry belongs to. A start opens on
systemd's "Starting <unit>" record, on its "Started" record when no start of that invocation is open
(a `Type=simple` unit logs only "Started"), or on the first vLLM line of an invocation not seen yet
(`Type=exec` units' first lines can be stored before "Starting"; journals without PID 1's records).
Without invocation ids, a vLLM line opens a start only when none is open. A start ends
- successfully on the init-complete line ("init engine ... took", or uvicorn's "Application startup
  complete" for releases that print no duration);
- as a failure on the first root cause vLLM printed (counted at once, by reason; the copies vLLM
  prints of the same cause and its wrapper lines belong to the same start and do not count again),
  or, when the start dies without a recognised cause, on the terminal wrapper line (reason `other`),
  or on systemd's record of the main process's exit, the unit's failure, a scheduled restart or the
  next "Starting". journald does not order a dying process's last lines against PID 1's records, so
  such a failure waits for its root cause (routed by the process's pid) until the restarted process
  prints, or LATE_LINES_GRACE_USEC has passed, and only then counts as `other`.
A stop requested during init (systemd's "Stopping") ends the start without counting it.

What is deterministic, and what depends on the time of the scrape: the fold reads no clock. Its state
is a function of the entries it was given, in order, and of the times `settle(now_usec)` was called
with; every rule but one uses only the entries' own times (journald's realtime). The exception is the
grace time above: a failed start waiting for its root cause counts as `other` once
LATE_LINES_GRACE_USEC has passed, judged by the time of the unit's next entry or by `settle(now_usec)`,
which the journal follower calls with the wall clock when a scrape reads the state. So a scrape within
the grace time after such a failure shows it not yet counted, and a later one shows it counted. Reading
the same journal again (a restart of the exporter) gives the same counters, but for one case: a root
cause stored within the grace time that the follower read only after a scrape had settled its start as
`other` (the follower lagging the journal by more than the grace time) counts as `other` live and as
its cause when read again.

A start's *init* begins when the unit's main process starts: at systemd's "Started" record or the
start's first vLLM line, whichever comes first. Before that the start may run `ExecStartPre=`
commands, the gate among them: systemd logs "Starting" before they run, they print under their own
`_PID`, and a unit waiting in its gate is not initialising. The gate's lines (`vllm-xpu-gate: ...`)
never begin an init; its decisions count per unit (gate waits, seconds, timeouts).
For the overlap counter an init runs until its first KV-cache line, its init-complete line or its
failure; an init that runs while another watched unit's init runs overlaps, and both are counted once.
For the gate a unit is initialising from the same beginning until its init completes or fails
(`UnitView.initialising_since_usec`): vLLM still allocates during warm-up after the KV-cache line.

*Engine units and possible inits.* The `--journal.units` globs may match units that run no vLLM engine
(the exporter's own unit, a `vllm-proxy.service`); such a unit must not hold gated starts back, count
overlaps or count failures. A unit is an *engine unit* once a start of it printed a vLLM line (one
`vllm_xpu_exporter.parsers.vllm` recognises); it is *known not to be one* once a start of it printed a line
`vllm_xpu_exporter.parsers.services` recognises (the exporter's start-up line) before any vLLM line, or ran
longer than the engine grace (`--journal.engine-grace`, ENGINE_GRACE_USEC by default) after its main
process began without printing one; otherwise it is not known yet (`Start.engine`). A start of an
engine unit is an engine start, as above. A start of a unit known not to be one is no init at all: it
never initialises, overlaps nothing and its failure counts nothing. A start of a unit not known yet is
a *possible init*: for the gate it is initialising from its main process's start until the first of
- its first vLLM line: it is an engine start from then on, whose init began when its main process
  began; its overlaps are judged from then, retroactively (every init that ran since counts);
- a line of `vllm_xpu_exporter.parsers.services`: not an engine, its window ends at once;
- the engine grace after its main process began, judged like the late-lines grace by the time of the
  next entry read or `settle(now_usec)`: not an engine. A vLLM line it prints later still makes it an
  engine start, whose init then begins at that line;
- its end (exit, failure, stop).
A possible init overlaps nothing while it is possible. Its failure counts as for an engine start
(`other` without a cause): a start that dies before its first line, within the grace, may be an engine
that broke before printing (an import error, a missing binary), as a unit's first start after an
upgrade can; one that outlived the grace without a vLLM line, or printed the exporter's line, does not.

A line whose figures are out of the grammar's plausible bounds (`vllm.ImplausibleValue`) is ignored,
as if it had not been printed, and counted in `EngineTracker.rejected_lines`; the first of each unit
is kept in `first_rejections` for the log.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from heapq import merge
from typing import Protocol

from vllm_xpu_exporter.fold.init_windows import InitWindows
from vllm_xpu_exporter.fold.start import LATE_LINES_GRACE_USEC, Outcome, Start, record
from vllm_xpu_exporter.parsers import gate as gate_lines
from vllm_xpu_exporter.parsers import services, vllm
from vllm_xpu_exporter.parsers.vllm import FailureReason
from vllm_xpu_exporter.parsers.workloads import uid_of_identity
from vllm_xpu_exporter.systemd import (MESSAGE_ID_UNIT_FAILURE_RESULT, MESSAGE_ID_UNIT_PROCESS_EXIT,
                              MESSAGE_ID_UNIT_RESTART_SCHEDULED, MESSAGE_ID_UNIT_START_FAILED, MESSAGE_ID_UNIT_STARTED,
                              MESSAGE_ID_UNIT_STARTING, MESSAGE_ID_UNIT_STOPPED, MESSAGE_ID_UNIT_STOPPING,
                              MESSAGE_ID_UNIT_SUCCESS)

DEFAULT_MAX_UNITS = 64
# A unit or container with no entry for this long (journal time) gives up its place under the cap when a new
# one needs it: a flood of names cannot hold the places for ever.
IDLE_FORGET_USEC = 3600 * 1_000_000
MAX_DROPPED_NAMES = 65536  # names remembered as dropped (their count); beyond it the count stops growing

# PID 1's records that mean the unit's process is gone: an open start has failed.
MESSAGE_IDS_START_ENDED = frozenset({MESSAGE_ID_UNIT_START_FAILED, MESSAGE_ID_UNIT_PROCESS_EXIT,
                                     MESSAGE_ID_UNIT_FAILURE_RESULT, MESSAGE_ID_UNIT_RESTART_SCHEDULED})
# PID 1's records after which the start's processes are gone, whatever its outcome.
MESSAGE_IDS_PROCESS_GONE = MESSAGE_IDS_START_ENDED | {MESSAGE_ID_UNIT_STOPPED, MESSAGE_ID_UNIT_SUCCESS}
# How long a start of a unit not known to run vLLM is taken as a possible engine init (holds the gate)
# after its main process began, unless it prints a vLLM line (--journal.engine-grace).
ENGINE_GRACE_USEC = 60_000_000
# Starts remembered per unit by invocation id: lines of older ones are dropped, and the gate asks
# whether a lease's invocation has ended.
REMEMBERED_INVOCATIONS = 16


class Entry(Protocol):
    """What the fold needs of a log entry (vllm_xpu_exporter.sources.logs.entry.LogEntry has it)."""

    unit: str
    realtime_usec: int
    message: str
    from_systemd: bool
    message_id: str
    pid: int | None
    invocation_id: str  # '' when the entry has none


@dataclass(frozen=True)
class UnitView:
    """A unit's metrics as of now: counters over the selected boot, gauges of its latest start."""

    unit: str
    starts: int
    failures: Mapping[FailureReason, int]  # every reason, 0 when none
    last_failure_usec: int | None
    overlaps: int
    latest: Start | None  # the latest start that printed anything
    last_success: Start | None
    current: Start | None = None  # the latest start, printed or not
    invocations_ended: Mapping[str, bool] = field(default_factory=dict)  # recent invocation id -> has ended
    gate_waits: int = 0  # starts the gate held back (timeouts included)
    gate_wait_seconds: float = 0.0  # seconds of every gate decision
    gate_timeouts: int = 0
    context_shrinks: int = 0  # starts whose --max-model-len auto served a shorter context than asked
    # the latest start that sized its KV cache from gpu_memory_utilization (no --kv-cache-memory-bytes)
    # and printed it: its non-KV memory is known, which a start with a budget does not print
    last_profiled: Start | None = None
    device_total_bytes: int | None = None  # the device total a start of it printed last (2 decimals of GiB)
    gate_ungated: int = 0  # starts the gate's client let go without the service's decision
    gate_legacy: int = 0  # starts that ran the 0.2 gate drop-in (root in the unit)
    startup_plan_fallbacks: int = 0  # starts whose vLLM startup plan fell back: free memory below its baseline

    @property
    def gpu_memory_utilization(self) -> float | None:
        return self.latest.effective_gpu_memory_utilization if self.latest else None

    @property
    def initialising_since_usec(self) -> int | None:
        """When the init of the unit's current start began, while it has neither completed nor failed;
        None when the unit is not initialising (also while it waits in its gate, and when the start is
        known not to run a vLLM engine: a possible init's window has ended)."""
        current = self.current
        if current is None or current.outcome is not None or current.engine is False:
            return None
        return current.main_began_usec

    def invocation_ended(self, invocation_id: str) -> bool | None:
        """Whether that start of the unit has ended (init done or failed, stopped, or a later start
        began); None when the journal has not shown it (yet)."""
        return self.invocations_ended.get(invocation_id)


@dataclass
class _Unit:
    name: str
    starts: int = 0
    failures: dict[FailureReason, int] = field(default_factory=lambda: dict.fromkeys(FailureReason, 0))
    last_failure_usec: int | None = None
    overlaps: int = 0
    current: Start | None = None
    previous: Start | None = None  # the start before current: its late lines are routed by pid
    latest: Start | None = None
    last_success: Start | None = None
    last_profiled: Start | None = None
    device_total_bytes: int | None = None
    invocations: dict[str, Start] = field(default_factory=dict)  # the latest REMEMBERED_INVOCATIONS starts
    gate_waits: int = 0
    gate_wait_seconds: float = 0.0
    gate_timeouts: int = 0
    context_shrinks: int = 0
    startup_plan_fallbacks: int = 0
    gate_ungated: int = 0
    gate_legacy: int = 0
    engine: bool | None = None  # a start printed a vLLM line; False: known to run something else
    last_seen_usec: int = 0  # the latest entry's time (EngineTracker: who gives up a place first)

    def view(self) -> UnitView:
        copy = (lambda start: start.snapshot() if start else None)
        ended = {invocation: start is not self.current or start.outcome is not None
                 for invocation, start in self.invocations.items()}
        return UnitView(self.name, self.starts, dict(self.failures), self.last_failure_usec, self.overlaps,
                        copy(self.latest), copy(self.last_success), copy(self.current), ended,
                        self.gate_waits, self.gate_wait_seconds, self.gate_timeouts, self.context_shrinks,
                        copy(self.last_profiled), self.device_total_bytes, self.gate_ungated, self.gate_legacy,
                        self.startup_plan_fallbacks)


class EngineTracker:
    """Folds journal entries of watched units into per-unit engine state. Not thread-safe: `add`,
    `extend`, `settle`, `watch` and `admit` change it, `views` only reads; the journal follower calls
    them all under its lock.

    At most `max_units` systemd units and, apart from them, at most `max_units` containers (keys with a `/`)
    are watched: containers never take a unit's place. Entries of further names are dropped and the names
    counted in `dropped_units`, so a glob that matches too much cannot blow up the series; but when a new
    name needs a place and one of its kind has had no entry for `IDLE_FORGET_USEC` (journal time, the latest
    entry folded), the idlest gives its place up (`forget`, counted in `forgotten_units`),
    so names that flooded the places once do not hold them for ever."""

    def __init__(self, max_units: int = DEFAULT_MAX_UNITS, engine_grace_usec: int | None = None) -> None:
        self._units: dict[str, _Unit] = {}
        self.max_units = max_units
        self.engine_grace_usec = ENGINE_GRACE_USEC if engine_grace_usec is None else engine_grace_usec
        self.dropped_units: set[str] = set()
        self.forgotten_units = 0  # names that gave their place up for a new one (IDLE_FORGET_USEC)
        self._containers = 0  # watched names that are containers' keys
        self._latest_usec = 0  # the latest entry's time: the tracker's clock for idleness
        self._no_room_before_usec = [0, 0]  # by kind (unit 0, container 1): no name is idle before then
        self._windows = InitWindows()  # the overlap windows and possible inits of the watched units' starts
        self.rejected_lines = 0  # lines of watched units ignored for an implausible value
        self.first_rejections: dict[str, vllm.ImplausibleValue] = {}

    def watch(self, unit: str) -> None:
        """Make `unit` known (its counters exist at 0) before anything happened to it."""
        self._unit(unit)

    def forget(self, unit: str) -> None:
        """A unit gone for good (a container removed, with its logs): its counters and starts go, and its
        place under `max_units` is free. An init of it still open overlaps nothing from now on."""
        gone = self._units.pop(unit, None)
        if gone is None:
            return
        self._containers -= "/" in unit
        self._windows.forget(gone)

    def admit(self, unit: str, when_usec: int | None = None) -> bool:
        """Whether `unit`'s entries will be folded: it is watched, or there is room (it is watched now), if
        need be made by forgetting an idle name (`when_usec`: when the name was met, the tracker's clock).
        A unit refused is counted in `dropped_units`; its entries need not be read until asked again."""
        if when_usec is not None and when_usec > self._latest_usec:
            self._latest_usec = when_usec
        return self._unit(unit, when_usec) is not None

    def add(self, entry: Entry) -> None:
        if entry.realtime_usec > self._latest_usec:
            self._latest_usec = entry.realtime_usec
        unit = self._unit(entry.unit, entry.realtime_usec)
        if unit is None:
            return
        if entry.realtime_usec > unit.last_seen_usec:
            unit.last_seen_usec = entry.realtime_usec
        self._windows.next_entry()
        self._settle_unit(unit, entry.realtime_usec)
        self._end_possible_inits_past_grace(entry.realtime_usec)
        if entry.from_systemd:
            self._systemd_record(unit, entry)
            return
        if gate_lines.is_gate_line(entry.message):
            self._gate_line(unit, entry.message)
            return
        event = vllm.parse_line(entry.message) or services.parse_line(entry.message)
        if event is None:
            return
        if isinstance(event, vllm.ImplausibleValue):
            self.rejected_lines += 1
            self.first_rejections.setdefault(unit.name, event)
            return
        start = self._start_of_line(unit, entry, event)
        if start is None:
            return
        if isinstance(event, vllm.SleepFreed):  # a running engine slept; an engine still initialising cannot
            if start.outcome is Outcome.OK:
                record(start, event)
                start.slept_usec = entry.realtime_usec
            return
        if isinstance(event, vllm.Woke):  # and woke
            if start.outcome is Outcome.OK:
                start.woke_usec = entry.realtime_usec
            return
        if start.outcome is not None:
            self._late_line(unit, start, event, entry.realtime_usec)
            return
        pid = entry.pid
        if start.pid is None:
            start.pid = pid
            if unit.previous is not None and unit.previous.pending_since_usec is not None:
                self._count(unit, unit.previous, FailureReason.OTHER, unit.previous.pending_since_usec)
        if isinstance(event, services.NotAnEngine):
            if start.engine is None:
                self._not_an_engine(unit, start)
            self._main_began(unit, start, entry.realtime_usec)
            return
        if not start.engine:
            self._engine_found(unit, start)
        self._main_began(unit, start, entry.realtime_usec)
        start.printed = True
        unit.latest = start
        record(start, event)
        if start.seen_free_usec is None and start.seen_free_bytes is not None:
            start.seen_free_usec = entry.realtime_usec
        if isinstance(event, vllm.MaxModelLenAutoFit) and event.shrunk and not start.context_shrunk:
            start.context_shrunk = True
            unit.context_shrinks += 1
        if isinstance(event, vllm.StartupPlan) and event.outcome is vllm.StartupPlanOutcome.FALLBACK:
            unit.startup_plan_fallbacks += 1
        if isinstance(event, vllm.FailureCause):
            self._end(start, Outcome.FAILED, entry.realtime_usec)
            self._count(unit, start, event.reason, entry.realtime_usec)
        elif isinstance(event, vllm.FailureWrapper) and event.terminal:
            self._end(start, Outcome.FAILED, entry.realtime_usec)
            self._count(unit, start, FailureReason.OTHER, entry.realtime_usec)
        elif isinstance(event, (vllm.EngineInitDone, vllm.ServerReady)):
            self._end(start, Outcome.OK, entry.realtime_usec)
            unit.starts += 1
            unit.last_success = start
        elif isinstance(event, (vllm.KvCacheMemory, vllm.KvCacheCapacity, vllm.KvCacheBlocks)):
            self._windows.close(start)
        if start.device_total_bytes:
            unit.device_total_bytes = start.device_total_bytes
        if isinstance(event, (vllm.KvCacheMemory, vllm.MemoryUsage)) and start.kv_cache_memory_bytes is None \
                and start.kv_cache_bytes is not None:
            unit.last_profiled = start

    def extend(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            self.add(entry)

    def settle(self, now_usec: int) -> None:
        """Count as `other` the failed starts whose root cause has not turned up within the grace time
        before `now_usec` (the wall clock of a scrape, when following), and end the possible inits whose
        engine grace has passed."""
        for unit in self._units.values():
            self._settle_unit(unit, now_usec)
        self._end_possible_inits_past_grace(now_usec)

    def views(self) -> Iterator[UnitView]:
        """Every watched unit's counters and latest starts, by unit name; changes nothing (a failed start
        still waiting for its root cause is not counted yet: `settle` counts it)."""
        for name in sorted(self._units):
            yield self._units[name].view()

    def _unit(self, name: str, now_usec: int | None = None) -> _Unit | None:
        """The watched unit `name`, watched now if there is room (`now_usec`: when it was met; default the
        latest entry's time); None when it is dropped."""
        unit = self._units.get(name)
        if unit is None:
            container = "/" in name
            now = self._latest_usec if now_usec is None else now_usec
            watched = self._containers if container else len(self._units) - self._containers
            if watched >= self.max_units and not self._make_room(container, now):
                if len(self.dropped_units) < MAX_DROPPED_NAMES:
                    self.dropped_units.add(name)
                return None
            unit = self._units[name] = _Unit(name, last_seen_usec=now)
            self._containers += container
        return unit

    def _make_room(self, container: bool, now: int) -> bool:
        """Forget the idlest name of the kind if it has had no entry for IDLE_FORGET_USEC (an init it left open
        for that long is as dead as the rest of it; it overlaps nothing any more). Judged at `now`, when the new
        name was met: a name forgotten for it and met again in an older entry finds no idle place."""
        if now < self._no_room_before_usec[container]:
            return False
        idlest = min((unit for unit in self._units.values() if ("/" in unit.name) == container),
                     key=lambda unit: unit.last_seen_usec)
        if now - idlest.last_seen_usec < IDLE_FORGET_USEC:
            self._no_room_before_usec[container] = idlest.last_seen_usec + IDLE_FORGET_USEC
            return False
        self.forget(idlest.name)
        self.forgotten_units += 1
        return True

    def _start_of_line(self, unit: _Unit, entry: Entry, event: vllm.Event) -> Start | None:
        """The start a vLLM line belongs to, opened if the line begins one; None when the line was taken
        as a late line of the previous start, or belongs to an older one (dropped)."""
        pid = entry.pid
        late = unit.previous
        current = unit.current
        if late is not None and pid is not None and late.pid == pid and current is not None and \
                current.pid != pid and late.awaits_late_lines(entry.realtime_usec):
            # the restart's "Starting" was stored before the failed process's last lines
            self._late_line(unit, late, event, entry.realtime_usec)
            return None
        invocation = entry.invocation_id
        if invocation:
            known = unit.invocations.get(invocation)
            if known is not None:
                if known is current:
                    return current
                if known is late and late.awaits_late_lines(entry.realtime_usec):
                    self._late_line(unit, late, event, entry.realtime_usec)
                return None
            if current is not None and current.outcome is None and not current.invocation_id:
                self._name_invocation(unit, current, invocation)
                return current
            return self._open(unit, entry.realtime_usec, invocation)
        if current is None or (current.outcome is not None and (pid is None or current.pid != pid)
                               and _opens_a_start(event)):
            return self._open(unit, entry.realtime_usec, "")
        return current

    def _systemd_record(self, unit: _Unit, entry: Entry) -> None:
        start = unit.current
        invocation = entry.invocation_id
        message_id = entry.message_id
        same = start is not None and bool(invocation) and start.invocation_id == invocation
        if message_id == MESSAGE_ID_UNIT_STARTING:
            if same and not start.announced:
                start.announced = True  # its first lines were stored before the record (Type=exec)
                return
            if invocation and invocation in unit.invocations and not same:
                return  # a record of an older start
            self._open(unit, entry.realtime_usec, invocation).announced = True
        elif message_id == MESSAGE_ID_UNIT_STARTED:
            if same or (start is not None and start.outcome is None and not (invocation and start.invocation_id)):
                if start.outcome is None:
                    if invocation and not start.invocation_id:
                        self._name_invocation(unit, start, invocation)
                    self._main_began(unit, start, entry.realtime_usec)
                return
            if invocation and invocation in unit.invocations:
                return  # a record of an older start
            if invocation or start is None or start.process_gone:
                # Type=simple: "Started" is the first record of a start; the main process runs
                self._main_began(unit, self._open(unit, entry.realtime_usec, invocation), entry.realtime_usec)
        else:
            if invocation and not same:
                older = unit.invocations.get(invocation)
                if older is not None and message_id in MESSAGE_IDS_PROCESS_GONE:
                    older.process_gone = True
                if older is not None or start is None or start.invocation_id:
                    return  # about another start than the current one
            if start is None:
                return
            if message_id in MESSAGE_IDS_PROCESS_GONE:
                start.process_gone = True
            if start.outcome is None:
                if message_id in MESSAGE_IDS_START_ENDED:
                    self._end(start, Outcome.FAILED, entry.realtime_usec, pending=True)
                elif message_id == MESSAGE_ID_UNIT_STOPPING:
                    self._end(start, Outcome.STOPPED, entry.realtime_usec)

    def _gate_line(self, unit: _Unit, message: str) -> None:
        """A line of the unit's init gate (an ExecStartPre= process): its decisions count per unit, and
        the 0.2 drop-in's warning."""
        if gate_lines.is_legacy_line(message):
            unit.gate_legacy += 1
            return
        decision = gate_lines.parse_line(message)
        if decision is None:
            return
        if decision.ungated:
            unit.gate_ungated += 1
            return
        unit.gate_wait_seconds += decision.seconds
        if decision.held_back or decision.timed_out:
            unit.gate_waits += 1
        if decision.timed_out:
            unit.gate_timeouts += 1

    def _late_line(self, unit: _Unit, start: Start, event: vllm.Event, when_usec: int) -> None:
        """A line of a start that already ended: copies of its cause, wrappers, runtime lines; or its root
        cause, stored after systemd's record of the process's exit (journald does not order the two)."""
        if start.pending_since_usec is None:
            return
        start.late_line_usec = when_usec
        if isinstance(event, vllm.FailureCause):
            record(start, event)
            self._count(unit, start, event.reason, when_usec)
        elif isinstance(event, vllm.FailureWrapper) and event.terminal:
            self._count(unit, start, FailureReason.OTHER, when_usec)

    def _open(self, unit: _Unit, when_usec: int, invocation: str) -> Start:
        """A new start of the unit; its init begins later (`_main_began`)."""
        previous = unit.current
        if previous is not None and previous.outcome is None:
            self._end(previous, Outcome.FAILED, when_usec, pending=True)
        if unit.previous is not None and unit.previous.pending_since_usec is not None:
            self._count(unit, unit.previous, FailureReason.OTHER, unit.previous.pending_since_usec)
        unit.previous = previous
        start = unit.current = Start(began_usec=when_usec, engine=unit.engine)
        if invocation:
            self._name_invocation(unit, start, invocation)
        return start

    @staticmethod
    def _name_invocation(unit: _Unit, start: Start, invocation: str) -> None:
        start.invocation_id = invocation
        unit.invocations[invocation] = start
        if len(unit.invocations) > REMEMBERED_INVOCATIONS:
            del unit.invocations[next(iter(unit.invocations))]

    def _main_began(self, unit: _Unit, start: Start, when_usec: int) -> None:
        """The start's main process runs: an engine start's init begins, and with it the overlap window; a
        start not known to run vLLM becomes a possible init."""
        if start.main_began_usec is not None or start.outcome is not None:
            return
        start.main_began_usec = when_usec
        if start.engine:
            self._windows.open(unit, start)
        elif start.engine is None:
            self._windows.begin_possible(unit, start)

    def _engine_found(self, unit: _Unit, start: Start) -> None:
        """The start printed its first vLLM line: an engine start, and its unit an engine unit. A possible
        init's init began with its main process; a start whose possible window had ended (or of a unit
        known not to run vLLM) begins its init now (`_main_began` follows)."""
        unit.engine = start.engine = True
        if not self._windows.engine_found(unit, start):
            start.main_began_usec = None

    def _not_an_engine(self, unit: _Unit, start: Start) -> None:
        """The start runs no vLLM engine (a services line, or the engine grace passed): its possible window
        ends, and its unit is known not to be an engine unit (unless a start of it printed a vLLM line)."""
        start.engine = False
        if unit.engine is None:
            unit.engine = False
        self._windows.end_possible(start)

    def _end_possible_inits_past_grace(self, now_usec: int) -> None:
        for unit, start in self._windows.end_possible_past_grace(now_usec, self.engine_grace_usec):
            self._not_an_engine(unit, start)

    def _settle_unit(self, unit: _Unit, now_usec: int) -> None:
        """Count as `other` the failed starts whose root cause has not turned up within the grace time."""
        for start in (unit.previous, unit.current):
            if start is not None and start.pending_since_usec is not None and \
                    now_usec - start.pending_since_usec > LATE_LINES_GRACE_USEC:
                self._count(unit, start, FailureReason.OTHER, start.pending_since_usec)

    def _end(self, start: Start, outcome: Outcome, when_usec: int, pending: bool = False) -> None:
        """End a start. A failure systemd reports (exit, failed state) is pending until its cause is known:
        the process's last lines may still come; a start known to run no vLLM engine never counts one."""
        start.outcome = outcome
        self._windows.close(start)
        self._windows.end_possible(start)
        start.pending_since_usec = when_usec if pending and start.engine is not False else None

    @staticmethod
    def _count(unit: _Unit, start: Start, reason: FailureReason, when_usec: int) -> None:
        start.pending_since_usec = None
        unit.failures[reason] += 1
        unit.last_failure_usec = when_usec


def _opens_a_start(event: vllm.Event) -> bool:
    """Lines printed only at the beginning of a start (for journals without systemd's records)."""
    return isinstance(event, (vllm.ServerVersion, vllm.EngineConfig, vllm.Settings, services.NotAnEngine))


MAX_OWNERS = 16
"""Owners (the system, users) with a fold of their own in `OwnedTrackers`; a further user's names are dropped."""


class OwnedTrackers:
    """`EngineTracker`'s interface over one tracker per owner: the system's units and containers, and each
    user's (identities ending in `@uid<N>`: a user manager's units, rootless containers). A user's inits
    never overlap the system's (nor another user's), and a user's names never take the system's places
    under `max_units`: whoever can run a rootless container can make it print an init that never ends, or
    70 of them. Not thread-safe, as EngineTracker."""

    def __init__(self, max_units: int = DEFAULT_MAX_UNITS, engine_grace_usec: int | None = None) -> None:
        self.max_units = max_units
        self.engine_grace_usec = ENGINE_GRACE_USEC if engine_grace_usec is None else engine_grace_usec
        self._trackers: dict[int, EngineTracker] = {}
        self._owner_of: dict[str, EngineTracker | None] = {}  # name -> its owner's tracker (a cache)
        self._dropped: set[str] = set()  # names of owners beyond MAX_OWNERS

    def _tracker(self, unit: str) -> EngineTracker | None:
        tracker = self._owner_of.get(unit)
        if tracker is None and unit not in self._owner_of:
            uid = uid_of_identity(unit)
            tracker = self._trackers.get(uid)
            if tracker is None and (uid == 0 or len(self._trackers) < MAX_OWNERS):
                tracker = self._trackers[uid] = EngineTracker(self.max_units, self.engine_grace_usec)
            if len(self._owner_of) >= 65536:
                self._owner_of.clear()
            self._owner_of[unit] = tracker
        if tracker is None and len(self._dropped) < MAX_DROPPED_NAMES:
            self._dropped.add(unit)
        return tracker

    def admit(self, unit: str, when_usec: int | None = None) -> bool:
        tracker = self._tracker(unit)
        return tracker is not None and tracker.admit(unit, when_usec)

    def add(self, entry: Entry) -> None:
        tracker = self._tracker(entry.unit)
        if tracker is not None:
            tracker.add(entry)

    def extend(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            self.add(entry)

    def watch(self, unit: str) -> None:
        tracker = self._tracker(unit)
        if tracker is not None:
            tracker.watch(unit)

    def forget(self, unit: str) -> None:
        tracker = self._tracker(unit)
        if tracker is not None:
            tracker.forget(unit)

    def settle(self, now_usec: int) -> None:
        for tracker in self._trackers.values():
            tracker.settle(now_usec)

    def views(self) -> Iterator[UnitView]:
        """Every owner's views, by unit name."""
        return merge(*(tracker.views() for tracker in self._trackers.values()), key=lambda view: view.unit)

    @property
    def dropped_units(self) -> set[str]:
        return self._dropped.union(*(tracker.dropped_units for tracker in self._trackers.values()))

    @property
    def forgotten_units(self) -> int:
        return sum(tracker.forgotten_units for tracker in self._trackers.values())

    @property
    def rejected_lines(self) -> int:
        return sum(tracker.rejected_lines for tracker in self._trackers.values())

    @property
    def first_rejections(self) -> dict[str, vllm.ImplausibleValue]:
        return {unit: rejection for tracker in self._trackers.values()
                for unit, rejection in tracker.first_rejections.items()}


def merged_views(view_lists: Iterable[Iterable[UnitView]]) -> list[UnitView]:
    """The units and containers of several folds (the journal's, the container logs'), each once, by name: a
    container both watch (one logs to the journal, files of the same name) shows the view that has a start."""
    views: dict[str, UnitView] = {}
    for view_list in view_lists:
        for view in view_list:
            known = views.get(view.unit)
            if known is None or (known.current is None and view.current is not None):
                views[view.unit] = view
    return [views[unit] for unit in sorted(views)]
