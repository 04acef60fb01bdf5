"""What a real journal shows about the starts of vLLM units, read straight from `journalctl -o json`
entries (tests/realsystemd.py), independently of the exporter's reader and fold: the yardstick the
exporter's counters are held against.

A start is one invocation of a unit: systemd gives every record of it, PID 1's (`INVOCATION_ID`) and
the unit's output (`_SYSTEMD_INVOCATION_ID`), the same id, and a restart a new one.
* Its init begins when its main process starts: PID 1's "Started" record (for `Type=simple` and
  `Type=exec` systemd writes it once the main process is forked / exec'd, after any
  `ExecStartPre=`); without one, at its first output line.
* Its init ends (for overlaps) at its first KV-cache line, its init-complete line or its failure,
  else at PID 1's record of the main process's exit; an init that has not ended runs on.
* It succeeded if it printed vLLM's init-complete line; it failed if its process exited before, for
  the reason of the first root cause it printed (vLLM's texts), `other` without one.
* Two inits overlap when their spans intersect; each start that overlaps another unit's counts once.
* Only engines initialise. A unit runs an engine once a start of it printed a vLLM line (vLLM's
  logger header, or one of the lines above); it is known to run something else once a start of it,
  before that, printed the exporter's start-up line ("vllm-xpu-exporter V listening on ...") or ran
  ENGINE_GRACE_USEC past its beginning without a vLLM line. A start of an engine unit is an engine
  start, as above. A start of a unit not known either way is one if it prints a vLLM line: from its
  beginning if that line came within ENGINE_GRACE_USEC of it and no exporter line came first, else from
  that line. A start that prints none has no init span (overlaps nothing) and fails (`other`) only if
  its unit is not known to run something else, it printed no exporter line, and its process exited
  within ENGINE_GRACE_USEC of its beginning (an engine that broke before printing: an import error).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from journalgen import MESSAGE_ID_UNIT_PROCESS_EXIT, MESSAGE_ID_UNIT_STARTED
from realsystemd import journal_field

INIT_DONE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took|Application startup complete")
KV_LINE = re.compile(r"Available KV cache memory: |KV cache size: [\d,]+ tokens")
ROOT_CAUSES = (  # the first print of each reason, as vLLM words it
    ("no_kv_cache_memory", re.compile(r"Error: No available memory for the cache blocks")),
    ("kv_cache_too_small", re.compile(r"Error: (To serve at least one request with the|The model's max seq len)")),
    ("insufficient_free_memory", re.compile(r"Error: Free memory on device.* on startup is less than desired GPU")),
    ("device_out_of_memory", re.compile(r"XPU out of memory|UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY")),
    ("memory_query_unsupported", re.compile(r"doesn't support querying the available free memory")),
)
WRAPPER = re.compile(r"Engine core initialization failed|Engine process failed to start")
VLLM_LOGGER = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d ")
EXPORTER_LISTENING = re.compile(r"vllm-xpu-exporter \S+ listening on https?://")
ENGINE_GRACE_USEC = 60_000_000  # --journal.engine-grace's default
GATE_PREFIX = "vllm-xpu-gate: "


@dataclass
class Start:
    unit: str
    invocation: str
    began_usec: int | None = None  # PID 1's "Started"
    first_line_usec: int | None = None  # its first output line but the gate's
    init_ended_usec: int | None = None
    exited_usec: int | None = None
    outcome: str = "initialising"  # "ok", "failed" or "initialising"
    reason: str | None = None
    ended: bool = False  # its outcome is settled: later lines (copies of the cause, requests) do not count
    first_vllm_line_usec: int | None = None
    exporter_line_usec: int | None = None  # the exporter's start-up line, printed before any vLLM line
    engine: bool | None = None  # set by `starts`: an engine start (None: its unit was not known either way)
    init_began_usec: int | None = None  # set by `starts` for an engine start

    @property
    def beginning_usec(self) -> int | None:
        """PID 1's "Started", else its first output line; None for a start whose process never ran (no
        "Started", no line of its own: e.g. stopped while its ExecStartPre= ran)."""
        return self.began_usec if self.began_usec is not None else self.first_line_usec

    @property
    def init_span(self) -> tuple[int, float] | None:
        """(begin, end) of the engine init; None for a start that is no engine start, or whose process
        never ran."""
        if not self.engine or self.init_began_usec is None:
            return None
        end = self.init_ended_usec if self.init_ended_usec is not None else self.exited_usec
        return self.init_began_usec, float("inf") if end is None else end

    @property
    def counts_a_failure(self) -> bool:
        if self.outcome != "failed":
            return False
        if self.engine:
            return True
        if self.engine is False or self.exporter_line_usec is not None:
            return False
        beginning = self.beginning_usec
        return beginning is None or self.exited_usec is None or self.exited_usec - beginning <= ENGINE_GRACE_USEC


def starts(entries: Iterable[Mapping[str, object]]) -> list[Start]:
    """Every start the entries show, in order of appearance."""
    by_invocation: dict[str, Start] = {}
    for entry in sorted(entries, key=lambda e: int(e["__REALTIME_TIMESTAMP"])):
        at = int(entry["__REALTIME_TIMESTAMP"])
        from_pid1 = journal_field(entry, "_PID") == "1"
        invocation = journal_field(entry, "INVOCATION_ID" if from_pid1 else "_SYSTEMD_INVOCATION_ID")
        unit = journal_field(entry, "UNIT" if from_pid1 else "_SYSTEMD_UNIT")
        if not invocation or not unit:
            continue
        start = by_invocation.setdefault(invocation, Start(unit, invocation))
        if from_pid1:
            message_id = journal_field(entry, "MESSAGE_ID")
            if message_id == MESSAGE_ID_UNIT_STARTED and start.began_usec is None:
                start.began_usec = at
            elif message_id == MESSAGE_ID_UNIT_PROCESS_EXIT and start.exited_usec is None:
                start.exited_usec = at
                if not start.ended:
                    start.outcome, start.reason, start.ended = "failed", "other", True
            continue
        message = journal_field(entry, "MESSAGE") or ""
        if message.startswith(GATE_PREFIX):
            continue  # the gate, an ExecStartPre= command: not the start's main process
        if start.first_line_usec is None:
            start.first_line_usec = at
        if start.first_vllm_line_usec is None:
            if _is_vllm_line(message):
                start.first_vllm_line_usec = at
            elif start.exporter_line_usec is None and EXPORTER_LISTENING.search(message):
                start.exporter_line_usec = at
        if start.ended:
            if start.outcome == "failed" and start.reason == "other":
                reason = _root_cause(journal_field(entry, "MESSAGE") or "")
                start.reason = reason or start.reason  # the cause stored after PID 1's exit record
            continue
        reason = _root_cause(message)
        if (KV_LINE.search(message) or INIT_DONE.search(message) or reason or WRAPPER.search(message)) \
                and start.init_ended_usec is None:
            start.init_ended_usec = at
        if reason:
            start.outcome, start.reason, start.ended = "failed", reason, True
        elif WRAPPER.search(message):
            start.outcome, start.reason, start.ended = "failed", "other", True
        elif INIT_DONE.search(message):
            start.outcome, start.ended = "ok", True
    found = list(by_invocation.values())
    _judge_engines(found)
    return found


def _judge_engines(found: list[Start]) -> None:
    """Which starts are engine starts, and when their inits began: unit by unit, start after start."""
    known: dict[str, bool] = {}
    for start in sorted(found, key=lambda start: start.beginning_usec or 0):
        unit_runs_an_engine = known.get(start.unit)
        beginning = start.beginning_usec
        vllm_line = start.first_vllm_line_usec
        if unit_runs_an_engine:
            start.engine, start.init_began_usec = True, beginning
        elif vllm_line is not None:
            within_grace = unit_runs_an_engine is None and start.exporter_line_usec is None and \
                beginning is not None and vllm_line - beginning <= ENGINE_GRACE_USEC
            start.engine, start.init_began_usec = True, beginning if within_grace else vllm_line
        else:
            start.engine = unit_runs_an_engine
        if start.engine:
            known[start.unit] = True
        elif unit_runs_an_engine is None and (start.exporter_line_usec is not None or (
                beginning is not None and (start.exited_usec is None or
                                           start.exited_usec - beginning > ENGINE_GRACE_USEC))):
            known[start.unit] = False


def _is_vllm_line(message: str) -> bool:
    return bool(VLLM_LOGGER.match(message) or INIT_DONE.search(message) or KV_LINE.search(message)
                or _root_cause(message) or WRAPPER.search(message))


def _root_cause(message: str) -> str | None:
    return next((reason for reason, pattern in ROOT_CAUSES if pattern.search(message)), None)


@dataclass(frozen=True)
class UnitCounts:
    starts: int
    failures: Mapping[str, int]  # by reason; only reasons that occurred
    overlaps: int


def counts(entries: Iterable[Mapping[str, object]], units: Iterable[str]) -> dict[str, UnitCounts]:
    """Per unit of `units`: successful starts, failures by reason and overlapped inits, as the journal
    shows them (overlaps among `units` only)."""
    wanted = set(units)
    found = [start for start in starts(entries) if start.unit in wanted]
    overlapped = {start.invocation for start in found
                  if any(other.unit != start.unit and _intersect(start.init_span, other.init_span) for other in found)}
    result = {}
    for unit in sorted(wanted):
        mine = [start for start in found if start.unit == unit]
        result[unit] = UnitCounts(
            starts=sum(start.outcome == "ok" for start in mine),
            failures=dict(Counter(start.reason for start in mine if start.counts_a_failure)),
            overlaps=sum(start.invocation in overlapped for start in mine))
    return result


def _intersect(a: tuple[int, float] | None, b: tuple[int, float] | None) -> bool:
    if a is None or b is None:
        return False
    return a[0] < b[1] and b[0] < a[1]


__all__ = ["Start", "UnitCounts", "counts", "starts"]
