"""Fuzzing the pure parsers and the engine fold with hypothesis, on random text and on mutated real input.

- `vllm_xpu_exporter.parsers.vllm.parse_line` and `vllm_xpu_exporter.parsers.fdinfo.parse_fdinfo` never raise, take bounded time
  per line, and what they return is well formed: on random text, token soups of real vocabulary, and exact
  real lines (the grammar test tables, the fdinfo fixtures) mutated by inserting, deleting and replacing
  characters, duplicating segments, growing numbers, adding unicode, control characters, NULs, or padding to
  60 KiB.
- Numbers: real lines with every figure replaced by huge (up to 6,000 digits), infinite, NaN, negative and
  oddly written numbers, and whole lines of nothing but such numbers. Every value the parsers return is
  finite and within its bounds (`vllm_xpu_exporter.parsers.vllm.PLAUSIBLE`, `vllm_xpu_exporter.parsers.fdinfo.MAX_BYTES`),
  and the journal and processes collectors fed with them are exposed (text and OpenMetrics) without an
  exception, each reporting success, every value within bounds.
- `vllm_xpu_exporter.fold.engine_starts.EngineTracker` never raises on random sequences of real-looking journal entries (PID 1's
  records with every MESSAGE_ID it knows, vLLM lines, whole starts) and its counters never decrease.

Runs are deterministic (derandomized, no example database) and bounded in examples, so the file takes
seconds and CI sees the same examples on every run.
"""

from __future__ import annotations

import dataclasses
import math
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import get_args

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from vllm_xpu_exporter.collector import Sources
from vllm_xpu_exporter.collectors.journal import JournalCollector, unit_metrics
from vllm_xpu_exporter.collectors.processes import ProcessesCollector
from vllm_xpu_exporter.fold.engine_starts import EngineTracker, UnitView
from vllm_xpu_exporter.parsers import gate as gate_lines
from vllm_xpu_exporter.parsers import vllm
from vllm_xpu_exporter.parsers.fdinfo import MAX_BYTES, DrmClient, device_memory_bytes, parse_fdinfo
from vllm_xpu_exporter.scrape import ExporterCollector
from vllm_xpu_exporter.sources.logs.entry import LogEntry
from vllm_xpu_exporter.sources.logs.follower import LogState
from vllm_xpu_exporter.systemd import (MESSAGE_ID_SPAWN_FAILED, MESSAGE_ID_UNIT_FAILURE_RESULT, MESSAGE_ID_UNIT_PROCESS_EXIT,
                              MESSAGE_ID_UNIT_RESOURCES, MESSAGE_ID_UNIT_RESTART_SCHEDULED, MESSAGE_ID_UNIT_START_FAILED,
                              MESSAGE_ID_UNIT_STARTED, MESSAGE_ID_UNIT_STARTING, MESSAGE_ID_UNIT_STOPPED,
                              MESSAGE_ID_UNIT_STOPPING, MESSAGE_ID_UNIT_SUCCESS)
from vllm_xpu_exporter.sources.levelzero.binding import DeviceIdentity, MemoryModule, MemoryModuleProperties
from vllm_xpu_exporter.sources.levelzero.worker import DeviceMemory, DeviceProcesses
from vllm_xpu_exporter.sources.procfs import DrmClientScanner
from fakeprocfs import FakeProcfs, i915_61_fdinfo, i915_fdinfo, xe_fdinfo
from scrapes import parse_samples, sample
from test_parsers_fdinfo import DEPRECATED_MEMORY_KEYS, I915_61, I915_612, NOT_DRM, XE_DOC
from test_parsers_vllm import BARE_MESSAGES, ENVELOPES, EXACT_LINES, NOISE_LINES
from vllmlogs import VllmRun, chat_runs, engine_start_lines

FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# A hang detector, not a speed target (benchmarks/ measure speed): a regular expression that backtracks
# catastrophically on these inputs takes minutes, far past this on any machine, however loaded.
LINE_BUDGET_S = 2.0
SIXTY_KIB = 60 * 1024
MAX_MUTATED_CHARS = 70 * 1024

# ----------------------------------------------------------------------------------------- real input

REAL_VLLM_LINES: tuple[str, ...] = tuple(sorted(
    {line for _, _, line, _ in EXACT_LINES}
    | set(NOISE_LINES)
    | {envelope.format(level=level, msg=message) for envelope in ENVELOPES.values()
       for level, message in BARE_MESSAGES}
))
REAL_FDINFO: tuple[str, ...] = (
    XE_DOC, I915_61, I915_612, DEPRECATED_MEMORY_KEYS, NOT_DRM,
    xe_fdinfo(client_id=7, vram0=11 << 30, shared_vram0=1 << 20, unit="MiB"),
    i915_fdinfo(client_id=118, local0=1536 << 20, resident_local0=1 << 30),
    i915_61_fdinfo(client_id=42),
)

# What mutations insert: characters that mean something to the parsers, and ones that mean trouble.
SPICE = (
    "\x00", "\x1b[", "\x1b[1;36m", "\x1b[0;0m", "\ufffd", "█", "▀", "\u202e", "\u0301", "\u2028", "\x85", "\r",
    "\n", "\t", " ", "(", ")", "[", "]", "{", "}", ":", ":\t", "'", '"', ",", ".", "-", "=", "pid=", "GiB", "MiB",
    "KiB", "kB", "GB", " tokens", "x", "e308", "nan", "inf", "١٢", "𝟗", "ß", "İ", "drm-", "drm-total-vram0:\t",
    "ValueError: ", "ERROR 05-12 10:11:12 [core.py:1] ", "(EngineCore_DP0 pid=1) ",
)
HUGE_NUMBERS = (
    "18446744073709551615", "18446744073709551616", "340282366920938463463374607431768211456", "1e309",
    "-1", "-0", "0.0000000000000001", "99999999999999999999.99999999999999999999", "1,2,3,4,5,6,7,8,9,0",
)

fragments = st.one_of(
    st.sampled_from(SPICE),
    st.sampled_from(HUGE_NUMBERS),
    st.builds(lambda digit, count: digit * count, st.sampled_from("90"), st.integers(16, 6000)),
    st.text(max_size=24),
)


# Numbers as a hostile writer would print them: huge, infinite, NaN, negative, oddly written.
ABSURD_NUMBERS = (
    "inf", "-inf", "+inf", "nan", "-nan", "NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e308", "-1e308",
    "1e+308", "1.7976931348623157e+308", "5e-324", "-0", "-0.0", "0", "-1", "-5.00", "-0.25", "1e-15", "0x7fffffff",
    "1_000_000", "١٢٣", "18446744073709551616", "-9223372036854775809", "1125899906842625", "2251799813685248",
)
number_texts = st.one_of(
    st.sampled_from(ABSURD_NUMBERS),
    st.integers(-(10**40), 10**40).map(str),
    st.builds(lambda sign, digit, count: sign + digit * count,
              st.sampled_from(("", "-")), st.sampled_from("19"), st.integers(16, 6000)),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda x: f"{x:.2f}"),
    st.integers(0, 10**30).map(lambda n: f"{n:,}"),
)
_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*")


@st.composite
def renumbered(draw: st.DrawFn, originals: Sequence[str]) -> str:
    """A real line's message with every number in it replaced by a drawn one, in one era's envelope (whose own
    numbers, pid and time, stay well formed: the message is what a hostile writer controls)."""
    message = _NUMBER.sub(lambda _: draw(number_texts), vllm.normalise(draw(st.sampled_from(originals))))
    return draw(st.sampled_from(sorted(ENVELOPES.values()))).format(level="INFO", msg=message)


number_lines = st.lists(number_texts, min_size=1, max_size=40).flatmap(
    lambda numbers: st.sampled_from((" ", ", ", "\t", ": ")).map(lambda separator: separator.join(numbers)))


@st.composite
def mutated(draw: st.DrawFn, originals: Sequence[str]) -> str:
    """An exact real text after one to five random edits."""
    text = draw(st.sampled_from(originals))
    for _ in range(draw(st.integers(1, 5))):
        start = draw(st.integers(0, len(text)))
        end = draw(st.integers(start, min(len(text), start + 200)))
        edit = draw(st.sampled_from(("insert", "delete", "replace", "duplicate", "number", "pad")))
        if edit == "insert":
            text = text[:start] + draw(fragments) + text[start:]
        elif edit == "delete":
            text = text[:start] + text[end:]
        elif edit == "replace":
            text = text[:start] + draw(fragments) + text[end:]
        elif edit == "duplicate":
            text = text[:end] + text[start:end] * draw(st.integers(1, 300)) + text[end:]
        elif edit == "number":
            numbers = list(re.finditer(r"\d+(?:[.,]\d+)*", text))
            if numbers:
                number = numbers[draw(st.integers(0, len(numbers) - 1))]
                text = text[:number.start()] + draw(fragments) + text[number.end():]
        else:  # grow to about 60 KiB around a fragment repeated
            filler = draw(fragments) or "a"
            text = text[:start] + filler * (SIXTY_KIB // len(filler) + 1) + text[start:]
        text = text[:MAX_MUTATED_CHARS]
    return text


def token_soup(originals: Sequence[str]) -> st.SearchStrategy[str]:
    """Random text made of the real texts' own words and separators, in any order."""
    tokens = sorted({token for text in originals for token in re.split(r"(\s+|[()\[\]{}:,'=])", text) if token})
    return st.lists(st.one_of(st.sampled_from(tokens), fragments), max_size=40).map("".join)


def timed(function: Callable[[str], object], text: str, lines: int = 1) -> object:
    """function(text), failing when it took more than LINE_BUDGET_S per line of input."""
    started = time.perf_counter()
    result = function(text)
    took = time.perf_counter() - started
    assert took / lines < LINE_BUDGET_S, f"{took:.3f} s for {len(text)} characters in {lines} lines"
    return result


# --------------------------------------------------------------------------------------- vLLM grammar

EVENT_TYPES = get_args(vllm.Event)


GRAMMAR_ROWS = {row.name for row in vllm.GRAMMAR}


def assert_well_formed_event(event: object) -> None:
    """An event whose every number is finite and within its bounds, or a line rejected for one that is not."""
    if event is None:
        return
    if isinstance(event, vllm.ImplausibleValue):
        assert event.row in GRAMMAR_ROWS, event
        return
    assert isinstance(event, EVENT_TYPES), event
    for field in dataclasses.fields(event):
        value = getattr(event, field.name)
        if isinstance(value, (int, float)):
            assert math.isfinite(value) and vllm.plausible(field.name, value), (field.name, event)
        elif isinstance(value, str):
            value.encode("utf-8")
    if isinstance(event, vllm.FailureCause):
        assert isinstance(event.reason, vllm.FailureReason)


vllm_lines = st.one_of(
    st.text(max_size=2000),
    token_soup(REAL_VLLM_LINES),
    mutated(REAL_VLLM_LINES),
    renumbered(REAL_VLLM_LINES),
    number_lines,
)


@settings(FUZZ, max_examples=1000)
@given(vllm_lines)
def test_vllm_grammar_never_raises_and_is_bounded_per_line(line: str):
    assert_well_formed_event(timed(vllm.parse_line, line))


@settings(FUZZ, max_examples=500)
@given(renumbered(REAL_VLLM_LINES))
def test_vllm_grammar_returns_only_plausible_values_from_lines_of_absurd_numbers(line: str):
    assert_well_formed_event(timed(vllm.parse_line, line))


@settings(FUZZ, max_examples=200)
@given(mutated(REAL_VLLM_LINES), st.sampled_from(sorted(ENVELOPES.values())))
def test_vllm_grammar_never_raises_on_a_mutated_line_in_any_era_envelope(message: str, envelope: str):
    assert_well_formed_event(timed(vllm.parse_line, envelope.format(level="ERROR", msg=message)))


# ------------------------------------------------------------------------------------- DRM fdinfo

_PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]")


def assert_well_formed_client(client: DrmClient | None) -> None:
    if client is None:
        return
    assert isinstance(client, DrmClient) and client.driver
    assert client.pdev is None or _PCI_ADDRESS.fullmatch(client.pdev), client.pdev
    assert client.client_id is None or client.client_id >= 0
    for region in client.memory.values():
        assert all(size is None or (isinstance(size, int) and 0 <= size <= MAX_BYTES)
                   for size in (region.total, region.resident, region.shared)), region
    assert device_memory_bytes(client) >= 0


@st.composite
def reordered_lines(draw: st.DrawFn, originals: Sequence[str]) -> str:
    """A real fdinfo with its lines dropped, repeated and shuffled."""
    lines = draw(st.sampled_from(originals)).splitlines()
    chosen = draw(st.lists(st.sampled_from(lines), max_size=3 * len(lines)))
    return "\n".join(chosen) + draw(st.sampled_from(("", "\n", "\r\n", "\x00")))


_FDINFO_SIZE = re.compile(r"(?m)^(drm-(?:total|shared|resident|memory)-(?!cycles-)[^:\n]+:[ \t]*)[^\n]*$")
size_units = st.sampled_from(("", " KiB", " MiB", " GiB", " kB", " B", "GiB", " TiB"))


@st.composite
def resized(draw: st.DrawFn, originals: Sequence[str]) -> str:
    """A real fdinfo with every memory size replaced by a drawn number and unit."""
    text = draw(st.sampled_from(originals))
    return _FDINFO_SIZE.sub(lambda match: match[1] + draw(number_texts) + draw(size_units), text)


fdinfo_texts = st.one_of(
    st.text(max_size=2000),
    token_soup(REAL_FDINFO),
    mutated(REAL_FDINFO),
    reordered_lines(REAL_FDINFO),
    resized(REAL_FDINFO),
    st.lists(number_lines, max_size=20).map(lambda lines: "drm-driver:\txe\n" + "\n".join(lines)),
)


@settings(FUZZ, max_examples=1000)
@given(fdinfo_texts)
def test_fdinfo_parser_never_raises_and_is_bounded_per_line(text: str):
    assert_well_formed_client(timed(parse_fdinfo, text, lines=max(1, len(text.splitlines()))))


@settings(FUZZ, max_examples=500)
@given(resized(REAL_FDINFO))
def test_fdinfo_parser_returns_only_sizes_within_bounds_from_absurd_numbers(text: str):
    assert_well_formed_client(timed(parse_fdinfo, text, lines=max(1, len(text.splitlines()))))


# ---------------------------------------------------------------------------------------- engine fold

UNITS = ("vllm-xpu-chat.service", "vllm-xpu-embedding.service", "vllm-xpu-stt.service", "vllm-xpu-rerank.service")
BOOT_ID = "5f7c2e0a9b1d4c3e8f6a7b2c1d0e9f8a"
PID1_RECORDS = {  # systemd 252's texts (see tests/journalgen.py); the fold reads only the MESSAGE_ID
    MESSAGE_ID_UNIT_STARTING: "Starting {unit} - vLLM server...",
    MESSAGE_ID_UNIT_STARTED: "Started {unit} - vLLM server.",
    MESSAGE_ID_UNIT_START_FAILED: "Failed to start {unit} - vLLM server.",
    MESSAGE_ID_UNIT_PROCESS_EXIT: "{unit}: Main process exited, code=exited, status=1/FAILURE",
    MESSAGE_ID_UNIT_FAILURE_RESULT: "{unit}: Failed with result 'exit-code'.",
    MESSAGE_ID_UNIT_RESTART_SCHEDULED: "{unit}: Scheduled restart job, restart counter is at 3.",
    MESSAGE_ID_UNIT_STOPPING: "Stopping {unit} - vLLM server...",
    MESSAGE_ID_UNIT_STOPPED: "Stopped {unit} - vLLM server.",
    MESSAGE_ID_UNIT_SUCCESS: "{unit}: Deactivated successfully.",
    MESSAGE_ID_UNIT_RESOURCES: "{unit}: Consumed 1min 2.345s CPU time.",
    MESSAGE_ID_SPAWN_FAILED: "{unit}: Failed at step EXEC spawning /usr/bin/vllm: No such file or directory",
    "": "{unit}: something PID 1 said without a MESSAGE_ID",
}


def read_lines(run: VllmRun) -> tuple[str, ...]:
    """The lines of a realistic start (tests/vllmlogs.py) that the vLLM grammar reads: what whole starts are
    made of (the noise between them is left to the other strategies)."""
    return tuple(line.message for line in engine_start_lines(run, began_at=0.0)
                 if vllm.parse_line(line.message) is not None)


FAILED_START, GOOD_START = map(read_lines, chat_runs())

# (unit, message, MESSAGE_ID or None for a line the unit printed, _PID); timestamps come when entries are made
Written = tuple[str, str, str | None, int | None]

units = st.sampled_from(UNITS)
pids = st.sampled_from((10, 11, 20, 21, 30, 31, None))  # a few processes, so that restarts reuse none or some
pid1_record = st.builds(lambda unit, message_id: (unit, PID1_RECORDS[message_id].format(unit=unit), message_id, 1),
                        units, st.sampled_from(sorted(PID1_RECORDS)))
# the init gate's lines: decisions as it writes them, and a mangled one
GATE_LINES = (gate_lines.format_released(12.5, ["vllm-a.service", "memory"], 1 << 33, 1 << 30),
              gate_lines.format_released(0.1, [], None, None),
              gate_lines.format_timed_out(600.0, ["vllm-b.service"], 1, 2, starting=True),
              "vllm-xpu-gate: released after 1e309s (waited for nothing; free 1, needed 2)")
printed_line = st.builds(lambda unit, line, pid: (unit, line, None, pid), units,
                         st.one_of(st.sampled_from(REAL_VLLM_LINES), mutated(REAL_VLLM_LINES),
                                   renumbered(REAL_VLLM_LINES), number_lines, st.sampled_from(GATE_LINES)), pids)
# invocation ids: none (journals without them), or one of a few, so that entries of one start share one
invocations = st.lists(st.sampled_from(("", "1" * 32, "2" * 32, "3" * 32)), min_size=256, max_size=256)


def _whole_start(unit: str, lines: tuple[str, ...], starting: bool, pid: int | None) -> list[Written]:
    """A start as the unit's journal has it: systemd's "Starting" (or not), then vLLM's lines from one process."""
    opening = [(unit, PID1_RECORDS[MESSAGE_ID_UNIT_STARTING].format(unit=unit), MESSAGE_ID_UNIT_STARTING, 1)]
    return (opening if starting else []) + [(unit, line, None, pid) for line in lines]


whole_start = st.builds(_whole_start, units, st.sampled_from((GOOD_START, FAILED_START)), st.booleans(), pids)
# a whole start whose every figure is a drawn number
renumbered_start = st.builds(
    _whole_start, units,
    st.sampled_from((GOOD_START, FAILED_START)).flatmap(lambda lines: st.tuples(*(renumbered((line,))
                                                                                 for line in lines))),
    st.booleans(), pids)
journal_stories = st.lists(st.one_of(pid1_record.map(lambda e: [e]), printed_line.map(lambda e: [e]), whole_start,
                                     renumbered_start),
                           max_size=30).map(lambda blocks: [entry for block in blocks for entry in block])


def as_entries(written: list[Written], steps: list[int], invocation_ids: list[str] | None = None) -> list[LogEntry]:
    """Journal entries in journal order; realtime mostly rising, sometimes standing or stepping back (entries
    interleaved from several files, a clock set back)."""
    realtime = 1_747_000_000_000_000
    entries = []
    for (unit, message, message_id, pid), step, invocation in zip(written, steps, invocation_ids or [""] * len(steps)):
        realtime += step
        entries.append(LogEntry(unit=unit, realtime_usec=realtime, monotonic_usec=None, boot_id=BOOT_ID,
                                message=message, from_systemd=message_id is not None,
                                message_id=message_id or "", pid=pid, invocation_id=invocation))
    return entries


Counters = dict[str, tuple[int, dict[str, int], int, tuple[int, float, int]]]


def counters(views: list[UnitView]) -> Counters:
    return {view.unit: (view.starts, dict(view.failures), view.overlaps,
                        (view.gate_waits, view.gate_wait_seconds, view.gate_timeouts)) for view in views}


# The journal's gauges and the bounds (vllm_xpu_exporter.parsers.vllm.PLAUSIBLE) of the field each one shows.
GAUGE_FIELDS = {
    "xpu_unit_gpu_memory_utilization_ratio": "gpu_memory_utilization",
    "xpu_unit_max_model_len_tokens": "max_model_len",
    "xpu_unit_max_num_seqs": "max_num_seqs",
    "xpu_unit_kv_cache_budget_bytes": "kv_cache_memory_bytes",
    "xpu_unit_kv_cache_bytes": "kv_cache_bytes",
    "xpu_unit_kv_cache_tokens": "kv_cache_tokens",
    "xpu_unit_kv_cache_required_bytes": "needed_bytes",
    "xpu_unit_kv_cache_max_concurrency": "max_concurrency",
    "xpu_unit_engine_init_duration_seconds": "duration_seconds",
}


def assert_within_bounds(name: str, value: float) -> None:
    assert math.isfinite(value), (name, value)
    if name in GAUGE_FIELDS:
        assert vllm.plausible(GAUGE_FIELDS[name], value), (name, value)


def assert_rendered(views: list[UnitView]) -> None:
    """The journal collector's families of these views, as a scrape makes them: finite numbers in bounds."""
    for family in unit_metrics(views):
        for metric_sample in family.samples:
            assert_within_bounds(family.name, metric_sample.value)


@settings(FUZZ, max_examples=200)
@given(journal_stories, st.lists(st.integers(-5_000_000, 60_000_000), min_size=256, max_size=256),
       st.integers(1, len(UNITS)), invocations)
def test_engine_tracker_never_raises_and_its_counters_never_decrease(written: list[Written], steps: list[int],
                                                                     max_units: int, invocation_ids: list[str]):
    tracker = EngineTracker(max_units)
    before: Counters = {}
    dropped = forgotten = 0
    for entry in as_entries(written, steps, invocation_ids):
        tracker.add(entry)
        tracker.settle(entry.realtime_usec)  # as a scrape sees it while following
        views = list(tracker.views())
        now = counters(views)
        # A name dropped for want of a place may get one later, once an idle one gave it up (its series go:
        # a counter reset, as for any series that goes away).
        assert len(now) <= max_units and (tracker.forgotten_units or not tracker.dropped_units & set(now))
        assert len(tracker.dropped_units) >= dropped
        dropped = len(tracker.dropped_units)
        if tracker.forgotten_units > forgotten:
            forgotten = tracker.forgotten_units
            before = {unit: figures for unit, figures in before.items() if unit in now}
        for unit, (starts, failures, overlaps, gate) in now.items():
            assert set(failures) == set(vllm.FailureReason) and min(failures.values()) >= 0
            old_starts, old_failures, old_overlaps, old_gate = before.get(
                unit, (0, dict.fromkeys(vllm.FailureReason, 0), 0, (0, 0.0, 0)))
            assert starts >= old_starts and overlaps >= old_overlaps, (unit, entry)
            assert all(value >= old for value, old in zip(gate, old_gate)), (unit, entry)
            assert all(failures[reason] >= old_failures[reason] for reason in vllm.FailureReason), (unit, entry)
        assert set(before) <= set(now), "a watched unit disappeared"
        before = now
        assert_rendered(views)
    tracker.settle(round(time.time() * 1e6))  # and as a scrape long after the last entry sees it
    assert_rendered(list(tracker.views()))


# ------------------------------------------------------------------------ collectors fed absurd numbers

DEVICE_TOTAL = 16 << 30


class FixedFollower:
    """What the journal and processes collectors read of a LogFollower: the state of one tracker."""

    def __init__(self, tracker: EngineTracker) -> None:
        self._tracker = tracker

    def state(self) -> LogState:
        self._tracker.settle(round(time.time() * 1e6))
        views = list(self._tracker.views())
        return LogState(views=views, error=None, entries_read=0, dropped_units=len(self._tracker.dropped_units),
                        watched_units=len(views), values_rejected=self._tracker.rejected_lines)

    def watch(self, units: set[str]) -> None:
        pass


class FixedLevelZero:
    """Device memory of every device the fdinfo fixtures name, and empty process lists for them."""

    def __init__(self) -> None:
        clients = (parse_fdinfo(text) for text in REAL_FDINFO)
        self._identities = [DeviceIdentity(pdev, "Intel(R) Arc(TM) A770 Graphics", "0" * 32, "1.6.0")
                            for pdev in sorted({client.pdev for client in clients if client and client.pdev})]

    def request_memory(self) -> SimpleNamespace:
        """What LevelZeroWorker.request_memory returns: the answer, by its result()."""
        memory = [DeviceMemory(identity, (MemoryModuleProperties(0, True, DEVICE_TOTAL),),
                               (MemoryModule(True, DEVICE_TOTAL, DEVICE_TOTAL // 2, 1),), None)
                  for identity in self._identities]
        return SimpleNamespace(result=lambda: memory)

    def read_processes(self) -> list[DeviceProcesses]:
        return [DeviceProcesses(identity, (), None) for identity in self._identities]


def exposed(collectors: list, sources: Sources) -> dict[tuple[str, tuple], float]:
    """One scrape in OpenMetrics (which must not raise) and one in the text format, parsed."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(collectors, sources))
    generate_openmetrics(registry)
    return parse_samples(generate_latest(registry).decode())


@settings(FUZZ, max_examples=100)
@given(journal_stories, st.lists(st.one_of(resized(REAL_FDINFO), st.sampled_from(REAL_FDINFO)), max_size=4))
def test_collectors_fed_absurd_numbers_are_exposed_within_bounds_and_succeed(written: list[Written],
                                                                             fdinfos: list[str]):
    tracker = EngineTracker()
    tracker.extend(as_entries(written, [1000] * len(written)))
    follower = FixedFollower(tracker)
    with tempfile.TemporaryDirectory() as base:
        procfs = FakeProcfs(Path(base))
        procfs.add_process(1)  # init: no DRM client
        for index, text in enumerate(fdinfos):
            unit = UNITS[index % len(UNITS)]
            procfs.add_unit_process(100 + index, f"/system.slice/{unit}").add_drm_fd(text)
        samples = exposed([JournalCollector(), ProcessesCollector()],
                          Sources(levelzero=FixedLevelZero(), journal=follower,  # type: ignore[arg-type]
                                  drm_clients=DrmClientScanner(str(procfs.root))))
    for (name, labels), value in samples.items():
        assert_within_bounds(name, value)
        if name == "xpu_unit_memory_bytes":  # a client's regions each hold at most MAX_BYTES
            assert 0 <= value <= len(fdinfos) * 4 * MAX_BYTES, (name, labels, value)
        if name == "xpu_unattributed_memory_bytes":
            assert 0 <= value <= DEVICE_TOTAL, (name, labels, value)
    assert sample(samples, "xpu_exporter_collector_success", collector="journal") == 1
    assert sample(samples, "xpu_exporter_collector_success", collector="processes") == 1
