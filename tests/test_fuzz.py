"""Fuzzing the pure parsers and the engine fold with hypothesis, on random text and on mutated real input.

- `exporter.parsers.vllm.parse_line` and `exporter.parsers.fdinfo.parse_fdinfo` never raise, take bounded time
  per line, and what they return is well formed: on random text, token soups of real vocabulary, and exact
  real lines (the grammar test tables, the fdinfo fixtures) mutated by inserting, deleting and replacing
  characters, duplicating segments, growing numbers, adding unicode, control characters, NULs, or padding to
  60 KiB.
- `exporter.engines.EngineTracker` never raises on random sequences of real-looking journal entries (PID 1's
  records with every MESSAGE_ID it knows, vLLM lines, whole starts) and its counters never decrease.

Runs are deterministic (derandomized, no example database) and bounded in examples, so the file takes
seconds and CI sees the same examples on every run.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Sequence
from typing import get_args

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.collectors.journal import unit_metrics
from exporter.engines import REASONS, EngineTracker, UnitView
from exporter.parsers import vllm
from exporter.parsers.fdinfo import DrmClient, device_memory_bytes, parse_fdinfo
from exporter.sources.journal import (MESSAGE_ID_SPAWN_FAILED, MESSAGE_ID_UNIT_FAILURE_RESULT,
                                      MESSAGE_ID_UNIT_PROCESS_EXIT, MESSAGE_ID_UNIT_RESOURCES,
                                      MESSAGE_ID_UNIT_RESTART_SCHEDULED, MESSAGE_ID_UNIT_START_FAILED,
                                      MESSAGE_ID_UNIT_STARTED, MESSAGE_ID_UNIT_STARTING, MESSAGE_ID_UNIT_STOPPED,
                                      MESSAGE_ID_UNIT_STOPPING, MESSAGE_ID_UNIT_SUCCESS, JournalEntry)
from fakeprocfs import i915_61_fdinfo, i915_fdinfo, xe_fdinfo
from test_fdinfo import DEPRECATED_MEMORY_KEYS, I915_61, I915_612, NOT_DRM, XE_DOC
from test_vllm_grammar import BARE_MESSAGES, ENVELOPES, EXACT_LINES, NOISE_LINES

FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# One line of either parser takes under 10 ms even at 60 KiB (about 4-7 ms at worst on a 2-core machine); this
# bound catches super-linear behaviour (a regex that backtracks, a quadratic loop); it is not a benchmark.
LINE_BUDGET_S = 0.1
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


def assert_well_formed_event(event: object) -> None:
    if event is None:
        return
    assert isinstance(event, EVENT_TYPES), event
    for field in dataclasses.fields(event):
        value = getattr(event, field.name)
        if isinstance(value, float):
            assert math.isfinite(value), (field.name, event)
    if isinstance(event, vllm.FailureCause):
        assert isinstance(event.reason, vllm.FailureReason)


vllm_lines = st.one_of(
    st.text(max_size=2000),
    token_soup(REAL_VLLM_LINES),
    mutated(REAL_VLLM_LINES),
)


@settings(FUZZ, max_examples=1000)
@given(vllm_lines)
def test_vllm_grammar_never_raises_and_is_bounded_per_line(line: str):
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
        assert all(size is None or (isinstance(size, int) and size >= 0)
                   for size in (region.total, region.resident, region.shared)), region
    assert device_memory_bytes(client) >= 0


@st.composite
def reordered_lines(draw: st.DrawFn, originals: Sequence[str]) -> str:
    """A real fdinfo with its lines dropped, repeated and shuffled."""
    lines = draw(st.sampled_from(originals)).splitlines()
    chosen = draw(st.lists(st.sampled_from(lines), max_size=3 * len(lines)))
    return "\n".join(chosen) + draw(st.sampled_from(("", "\n", "\r\n", "\x00")))


fdinfo_texts = st.one_of(
    st.text(max_size=2000),
    token_soup(REAL_FDINFO),
    mutated(REAL_FDINFO),
    reordered_lines(REAL_FDINFO),
)


@settings(FUZZ, max_examples=1000)
@given(fdinfo_texts)
def test_fdinfo_parser_never_raises_and_is_bounded_per_line(text: str):
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
API = "(APIServer pid=10) INFO 12-02 10:00:00 [api_server.py:1873] "
CORE = "(EngineCore pid=11) INFO 12-02 10:00:20 [gpu_worker.py:456] "
KV_TOO_SMALL = ("ValueError: To serve at least one request with the model's max seq len (131072), (3.36 GiB KV cache "
                "is needed, which is larger than the available KV cache memory (2.13 GiB). Try increasing "
                "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
GOOD_START = (
    API + "vLLM API server version 0.24.0",
    API + "non-default args: {'model': 'Qwen/Qwen3-8B', 'max_model_len': 131072, 'gpu_memory_utilization': 0.75}",
    CORE + "Available KV cache memory: 3.25 GiB",
    "(EngineCore pid=11) INFO 12-02 10:00:21 [kv_cache_utils.py:1286] GPU KV cache size: 47,328 tokens",
    "(EngineCore pid=11) INFO 12-02 10:00:21 [kv_cache_utils.py:1290] Maximum concurrency for 131,072 tokens per "
    "request: 0.36x",
    "(EngineCore pid=11) INFO 12-02 10:00:40 [core.py:210] init engine (profile, create kv cache, warmup model) "
    "took 42.50 seconds",
)
FAILED_START = (
    API + "vLLM API server version 0.24.0",
    API + "non-default args: {'model': 'Qwen/Qwen3-8B', 'max_model_len': 131072, 'gpu_memory_utilization': 0.75}",
    f"(EngineCore pid=11) ERROR 12-02 10:00:30 [core.py:708] {KV_TOO_SMALL}",
    f"(EngineCore pid=11) {KV_TOO_SMALL}",
    "(APIServer pid=10) RuntimeError: Engine core initialization failed. See root cause above. Failed core "
    "proc(s): {}",
)

# (unit, message, MESSAGE_ID or None for a line the unit printed, _PID); timestamps come when entries are made
Written = tuple[str, str, str | None, int | None]

units = st.sampled_from(UNITS)
pids = st.sampled_from((10, 11, 20, 21, 30, 31, None))  # a few processes, so that restarts reuse none or some
pid1_record = st.builds(lambda unit, message_id: (unit, PID1_RECORDS[message_id].format(unit=unit), message_id, 1),
                        units, st.sampled_from(sorted(PID1_RECORDS)))
printed_line = st.builds(lambda unit, line, pid: (unit, line, None, pid), units,
                         st.one_of(st.sampled_from(REAL_VLLM_LINES), mutated(REAL_VLLM_LINES)), pids)


def _whole_start(unit: str, lines: tuple[str, ...], starting: bool, pid: int | None) -> list[Written]:
    """A start as the unit's journal has it: systemd's "Starting" (or not), then vLLM's lines from one process."""
    opening = [(unit, PID1_RECORDS[MESSAGE_ID_UNIT_STARTING].format(unit=unit), MESSAGE_ID_UNIT_STARTING, 1)]
    return (opening if starting else []) + [(unit, line, None, pid) for line in lines]


whole_start = st.builds(_whole_start, units, st.sampled_from((GOOD_START, FAILED_START)), st.booleans(), pids)
journal_stories = st.lists(st.one_of(pid1_record.map(lambda e: [e]), printed_line.map(lambda e: [e]), whole_start),
                           max_size=30).map(lambda blocks: [entry for block in blocks for entry in block])


def as_entries(written: list[Written], steps: list[int]) -> list[JournalEntry]:
    """Journal entries in journal order; realtime mostly rising, sometimes standing or stepping back (entries
    interleaved from several files, a clock set back)."""
    realtime = 1_747_000_000_000_000
    entries = []
    for (unit, message, message_id, pid), step in zip(written, steps):
        realtime += step
        entries.append(JournalEntry(unit=unit, realtime_usec=realtime, monotonic_usec=None, boot_id=BOOT_ID,
                                    message=message, from_systemd=message_id is not None,
                                    message_id=message_id or "", pid=pid))
    return entries


Counters = dict[str, tuple[int, dict[str, int], int]]


def counters(views: list[UnitView]) -> Counters:
    return {view.unit: (view.starts, dict(view.failures), view.overlaps) for view in views}


def assert_rendered(views: list[UnitView]) -> None:
    """The journal collector's families of these views, as a scrape makes them: finite numbers."""
    for family in unit_metrics(views):
        for metric_sample in family.samples:
            assert math.isfinite(metric_sample.value), metric_sample


@settings(FUZZ, max_examples=200)
@given(journal_stories, st.lists(st.integers(-5_000_000, 60_000_000), min_size=256, max_size=256),
       st.integers(1, len(UNITS)))
def test_engine_tracker_never_raises_and_its_counters_never_decrease(written: list[Written], steps: list[int],
                                                                     max_units: int):
    tracker = EngineTracker(max_units)
    before: Counters = {}
    dropped = 0
    for entry in as_entries(written, steps):
        tracker.add(entry)
        views = list(tracker.views(now_usec=entry.realtime_usec))  # as a scrape sees it while following
        now = counters(views)
        assert len(now) <= max_units and not tracker.dropped_units & set(now)
        assert len(tracker.dropped_units) >= dropped
        dropped = len(tracker.dropped_units)
        for unit, (starts, failures, overlaps) in now.items():
            assert set(failures) == set(REASONS) and min(failures.values()) >= 0
            old_starts, old_failures, old_overlaps = before.get(unit, (0, dict.fromkeys(REASONS, 0), 0))
            assert starts >= old_starts and overlaps >= old_overlaps, (unit, entry)
            assert all(failures[reason] >= old_failures[reason] for reason in REASONS), (unit, entry)
        assert set(before) <= set(now), "a watched unit disappeared"
        before = now
        assert_rendered(views)
    assert_rendered(list(tracker.views()))  # and as a scrape long after the last entry sees it
