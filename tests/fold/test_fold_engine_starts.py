"""EngineTracker fed directly with the journal entries of realistic vLLM unit lifecycles
(tests/vllmlogs.py): the unit's own lines and PID 1's records, in journal order, as the journal
reader hands them over (watched units of the selected boot)."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import replace
from itertools import chain
from pathlib import Path

import pytest

import journalgen
from vllm_xpu_exporter.fold import engine_starts
from vllm_xpu_exporter.fold.engine_starts import EngineTracker, UnitView
from vllm_xpu_exporter.fold.start import LATE_LINES_GRACE_USEC, Outcome
from vllm_xpu_exporter.parsers.vllm import FailureReason, StartupPlanOutcome, parse_line
from sizes import GiB, gib, mib
from vllmlogs import (
    CHAT,
    EMBEDDING,
    ERA_VERSIONS,
    REASONS,
    ROLE_INIT_DONE,
    ROLE_PROCESS_EXIT,
    ROLE_ROOT_CAUSE,
    STT,
    Boot,
    BootRace,
    Failure,
    Placed,
    Planned,
    Profiling,
    TrackerEntry,
    VllmRun,
    compose,
    engine_start_lines,
    failure_instant,
    first,
    restart_begins,
    service_runs,
    service_start,
    tracker_entries,
)

pytestmark = pytest.mark.fast  # the pure core (pyproject.toml's markers; `pytest -m fast`)

ORIGIN = 1_747_130_000.0
BOOT_ID = "5d0c8a4e2f1b4c6d9e7f0a1b2c3d4e5f"
UNIT = "vllm-test.service"
OTHER_UNIT = "vllm-other.service"


def one_boot(*planned: Iterable[Planned]) -> list[Placed]:
    return compose(Boot(BOOT_ID, ORIGIN - 30.0, tuple(chain.from_iterable(planned))))


def now_usec() -> int:
    return round(time.time() * 1e6)


def fold(entries: Iterable[TrackerEntry]) -> dict[str, UnitView]:
    """The views a scrape now sees of these entries (long after them: every pending failure settled)."""
    tracker = EngineTracker()
    tracker.extend(entries)
    tracker.settle(now_usec())
    return {view.unit: view for view in tracker.views()}


def fold_placed(placed: Sequence[Placed]) -> dict[str, UnitView]:
    return fold(tracker_entries(placed))


def no_failures() -> dict[str, int]:
    return dict.fromkeys(REASONS, 0)


def failures(**counts: int) -> dict[str, int]:
    return {**no_failures(), **counts}


# --- the problem statement's boot race ----------------------------------------------------------


def test_boot_race_chat_counts_one_kv_cache_too_small_failure_and_one_start(boot_race: BootRace) -> None:
    chat = fold(boot_race.entries())[CHAT]
    assert chat.failures == failures(kv_cache_too_small=1)
    assert chat.starts == 1


def test_boot_race_chat_outcomes_and_failure_reasons_are_enums_valued_as_the_label_strings(boot_race: BootRace) -> None:
    restart = boot_race.chat_restart_usec()
    failed = fold(e for e in boot_race.entries() if e.realtime_usec < restart)[CHAT]
    chat = fold(boot_race.entries())[CHAT]
    assert failed.latest.outcome is Outcome.FAILED
    assert chat.latest.outcome is Outcome.OK and chat.last_success.outcome is Outcome.OK
    assert [type(reason) for reason in chat.failures] == [FailureReason] * len(FailureReason)
    assert [reason.value for reason in chat.failures] == list(REASONS)  # the contract's `reason` label values


def test_boot_race_embedding_and_stt_start_once_without_failures(boot_race: BootRace) -> None:
    views = fold(boot_race.entries())
    for unit in (EMBEDDING, STT):
        assert views[unit].starts == 1
        assert views[unit].failures == no_failures()
        assert views[unit].last_failure_usec is None


def test_boot_race_right_after_the_failure_chat_shows_required_and_available_bytes(boot_race: BootRace) -> None:
    root_cause_usec = boot_race.chat_failure_usec()
    chat = fold(e for e in boot_race.entries() if e.realtime_usec <= root_cause_usec)[CHAT]
    assert chat.failures == failures(kv_cache_too_small=1)
    assert chat.starts == 0
    assert chat.last_failure_usec == root_cause_usec
    assert chat.latest.effective_kv_cache_bytes == gib(2.13)
    assert chat.latest.effective_required_bytes == gib(3.36)
    assert chat.latest.max_model_len == 131072
    assert chat.latest.gpu_memory_utilization == 0.75
    assert chat.latest.max_num_seqs == 3


def test_boot_race_copies_wrappers_and_exit_records_of_the_failure_do_not_count_again(boot_race: BootRace) -> None:
    restart = boot_race.chat_restart_usec()
    chat = fold(e for e in boot_race.entries() if e.realtime_usec < restart)[CHAT]
    assert chat.failures == failures(kv_cache_too_small=1)
    assert chat.starts == 0
    assert chat.latest.effective_kv_cache_bytes == gib(2.13)
    assert chat.latest.effective_required_bytes == gib(3.36)


def test_boot_race_after_the_restart_chat_shows_the_restarts_kv_figures(boot_race: BootRace) -> None:
    chat = fold(boot_race.entries())[CHAT]
    _, restarted = boot_race.chat_runs
    latest = chat.latest
    assert (latest.version, latest.model) == ("0.24.0", "google/gemma-3-4b-it")
    assert latest.effective_kv_cache_bytes == gib(3.25)
    assert latest.effective_kv_cache_tokens == 136_960
    assert latest.max_concurrency == 1.04
    assert latest.effective_required_bytes == pytest.approx(gib(3.25) / 1.04, abs=1)
    assert latest.init_duration_seconds == 38.5
    assert chat.last_success is not None and chat.last_success.init_duration_seconds == restarted.init_seconds
    assert chat.last_failure_usec == boot_race.chat_failure_usec()


def test_boot_race_counts_an_overlap_for_each_of_the_three_units_and_none_for_the_restart(boot_race: BootRace) -> None:
    restart = boot_race.chat_restart_usec()
    before_restart = fold(e for e in boot_race.entries() if e.realtime_usec < restart)
    after_restart = fold(boot_race.entries())
    for unit in (CHAT, EMBEDDING, STT):
        assert before_restart[unit].overlaps == 1, unit
        assert after_restart[unit].overlaps == 1, unit


def test_boot_race_selected_entries_hold_only_the_watched_units_of_the_race_boot(boot_race: BootRace) -> None:
    units = {entry.unit for entry in boot_race.entries()}
    assert units == {CHAT, EMBEDDING, STT}
    # The unwatched unit printed the very failure the chat unit printed.
    assert any("To serve at least one request" in p.planned.message
               for p in boot_race.placed if p.planned.unit == "other-llm.service")


# --- failure reasons, once per failed start ------------------------------------------------------

RECOVERY = dict(kv_cache_gib=4.0, gpu_blocks=None, profiling=Profiling(16225.0, 3481.2, 4102.65))

# (failing start, whether vLLM prints the root cause at least twice)
FAILURE_CASES = {
    "kv_cache_too_small-0.6.3-raw-copy-only": (
        VllmRun("0.6.3.post1", max_model_len=8192, gpu_blocks=400, failure=Failure("kv_cache_too_small")), False),
    "kv_cache_too_small-0.8.3-v0": (
        VllmRun("0.8.3", max_model_len=32768, gpu_blocks=1024, failure=Failure("kv_cache_too_small")), True),
    "kv_cache_too_small-0.10.1.1-profiling": (
        VllmRun("0.10.1.1", gpu_memory_utilization=0.85, max_model_len=16384,
                profiling=Profiling(24480.0, 15316.42, 19800.0),
                failure=Failure("kv_cache_too_small", needed_gib=2.0, estimated_max_model_len=8064)), True),
    "kv_cache_too_small-0.19.1": (
        VllmRun("0.19.1", max_model_len=40960, kv_cache_gib=2.5,
                failure=Failure("kv_cache_too_small", needed_gib=5.62, estimated_max_model_len=18176)), True),
    "kv_cache_too_small-0.34.0": (
        VllmRun("0.34.0", max_model_len=131072, kv_cache_gib=2.13,
                failure=Failure("kv_cache_too_small", needed_gib=3.36, estimated_max_model_len=46528)), True),
    "no_kv_cache_memory-0.7.3-v0": (VllmRun("0.7.3", failure=Failure("no_kv_cache_memory")), True),
    "no_kv_cache_memory-0.11.0-profiling": (
        VllmRun("0.11.0", gpu_memory_utilization=0.5, profiling=Profiling(16225.0, 7695.45, 8412.3),
                failure=Failure("no_kv_cache_memory")), True),
    "no_kv_cache_memory-0.24.0": (VllmRun("0.24.0", kv_cache_gib=-0.37, failure=Failure("no_kv_cache_memory")), True),
    "insufficient_free_memory-0.17.1": (
        VllmRun("0.17.1", gpu_memory_utilization=0.5,
                failure=Failure("insufficient_free_memory", free_gib=3.1, total_gib=23.86)), True),
    "insufficient_free_memory-0.24.0-free-reported-as-zero": (
        VllmRun("0.24.0", failure=Failure("insufficient_free_memory", free_gib=0.0, total_gib=22.71)), True),
    "device_out_of_memory-0.8.3-ipex": (VllmRun("0.8.3", failure=Failure("device_out_of_memory")), True),
    "device_out_of_memory-0.13.0-torch": (VllmRun("0.13.0", failure=Failure("device_out_of_memory")), True),
    "device_out_of_memory-0.24.0-native-api": (
        VllmRun("0.24.0", failure=Failure("device_out_of_memory", form="native_api")), True),
    "memory_query_unsupported-0.9.2-profiling": (
        VllmRun("0.9.2", failure=Failure("memory_query_unsupported",
                                         device_name="Intel(R) Arc(TM) 140T GPU (16GB)")), True),
    "memory_query_unsupported-0.17.1-init-device": (
        VllmRun("0.17.1", failure=Failure("memory_query_unsupported")), True),
    "other-0.9.1-unrecognised-cause": (VllmRun("0.9.1", failure=Failure("other")), False),
    "other-0.13.0-unrecognised-cause": (VllmRun("0.13.0", failure=Failure("other")), False),
    "other-0.15.1-dies-before-vllm-prints": (VllmRun("0.15.1", failure=Failure("other", error=None)), False),
    "other-0.24.0-exec-failed": (VllmRun("0.24.0", failure=Failure("other", error=None, exec_failed=True)), False),
}


def failed_then_restarted(run: VllmRun) -> list[Placed]:
    return one_boot(service_runs(UNIT, [run, replace(run, failure=None, **RECOVERY)], ORIGIN))


@pytest.mark.parametrize("case", list(FAILURE_CASES))
def test_failed_start_counts_once_under_its_reason_and_the_restart_counts_one_start(case: str) -> None:
    run, _ = FAILURE_CASES[case]
    view = fold_placed(failed_then_restarted(run))[UNIT]
    assert view.failures == failures(**{run.failure.reason: 1})
    assert view.starts == 1


@pytest.mark.parametrize("case", [case for case, (_, twice) in FAILURE_CASES.items() if twice])
def test_root_cause_is_printed_at_least_twice_in_the_failed_start(case: str) -> None:
    # The premise of "counted once even though printed twice": the journal really has the copies.
    run, _ = FAILURE_CASES[case]
    placed = failed_then_restarted(run)
    restart = restart_begins(placed, UNIT)
    cause = parse_line(first(placed, UNIT, ROLE_ROOT_CAUSE).planned.message)
    copies = [p for p in placed if p.planned.unit == UNIT and p.realtime_usec < restart
              and not p.planned.from_systemd and parse_line(p.planned.message) == cause]
    assert len(copies) >= 2


@pytest.mark.parametrize("case", list(FAILURE_CASES))
def test_failure_is_timed_at_its_first_root_cause_or_else_where_the_start_ended(case: str) -> None:
    run, _ = FAILURE_CASES[case]
    placed = failed_then_restarted(run)
    assert fold_placed(placed)[UNIT].last_failure_usec == failure_instant(placed, UNIT)


@pytest.mark.parametrize("failure", [Failure("other", error=None), Failure("other", error=None, exec_failed=True)],
                         ids=["python-import-error", "exec-failed-203"])
def test_start_that_dies_before_vllm_prints_anything_counts_other(failure: Failure) -> None:
    placed = one_boot(service_runs(UNIT, [VllmRun("0.24.0", failure=failure)], ORIGIN))
    view = fold_placed(placed)[UNIT]
    assert view.failures == failures(other=1)
    assert view.starts == 0
    assert view.latest is None  # nothing vLLM printed describes this start
    assert view.last_failure_usec == first(placed, UNIT, ROLE_PROCESS_EXIT).realtime_usec


def test_crash_loop_counts_every_failed_start_by_reason_and_the_final_success() -> None:
    runs = [
        VllmRun("0.24.0", kv_cache_gib=2.13, max_model_len=131072,
                failure=Failure("kv_cache_too_small", needed_gib=3.36, estimated_max_model_len=46528)),
        VllmRun("0.24.0", kv_cache_gib=2.2, max_model_len=131072,
                failure=Failure("kv_cache_too_small", needed_gib=3.36, estimated_max_model_len=48000)),
        VllmRun("0.24.0", max_model_len=131072, failure=Failure("insufficient_free_memory", free_gib=2.1)),
        VllmRun("0.24.0", max_model_len=131072, failure=Failure("other", error=None)),
        VllmRun("0.24.0", max_model_len=131072, kv_cache_gib=3.5, kv_cache_tokens=136_960, max_concurrency=1.04),
    ]
    placed = one_boot(service_runs(UNIT, runs, ORIGIN))
    view = fold_placed(placed)[UNIT]
    assert view.failures == failures(kv_cache_too_small=2, insufficient_free_memory=1, other=1)
    assert view.starts == 1
    fourth_exit = [p for p in placed if p.planned.unit == UNIT and p.planned.role == ROLE_PROCESS_EXIT][3]
    assert view.last_failure_usec == fourth_exit.realtime_usec
    assert view.latest.effective_kv_cache_bytes == gib(3.5)


@pytest.mark.parametrize("case", [case for case, (run, _) in FAILURE_CASES.items() if not run.failure.silent])
def test_journal_without_pid1_records_still_counts_each_failed_start_once_and_the_restart(case: str) -> None:
    run, _ = FAILURE_CASES[case]
    entries = [e for e in tracker_entries(failed_then_restarted(run)) if not e.from_systemd]
    view = fold(entries)[UNIT]
    assert view.failures == failures(**{run.failure.reason: 1})
    assert view.starts == 1


def root_cause_offset(run: VllmRun) -> float:
    return next(line.offset for line in engine_start_lines(run, ORIGIN) if line.role == ROLE_ROOT_CAUSE)


@pytest.mark.parametrize("run", [
    VllmRun("0.6.3.post1", max_model_len=8192, gpu_blocks=400, failure=Failure("kv_cache_too_small")),
    VllmRun("0.24.0", max_model_len=131072, kv_cache_gib=2.13,
            failure=Failure("kv_cache_too_small", needed_gib=3.36, estimated_max_model_len=46528)),
], ids=["0.6.3-raw-copy", "0.24.0-logged-and-raw-copies"])
def test_root_cause_stored_just_after_pid1s_exit_record_still_counts_under_its_reason(run: VllmRun) -> None:
    # journald orders a unit's stdout stream and PID 1's records arbitrarily: the dying process's
    # last lines (here: from its root cause on) are stored after "Main process exited".
    failed = service_start(UNIT, run, ORIGIN, restart_counter=1, late_after=root_cause_offset(run))
    restarted = service_start(UNIT, replace(run, failure=None, main_pid=run.main_pid + 1, **RECOVERY),
                              failed.restart_at, job_id=110)
    placed = one_boot(failed.entries, restarted.entries)
    exit_usec = first(placed, UNIT, ROLE_PROCESS_EXIT).realtime_usec
    assert first(placed, UNIT, ROLE_ROOT_CAUSE).realtime_usec > exit_usec  # the premise
    view = fold_placed(placed)[UNIT]
    assert view.failures == failures(kv_cache_too_small=1)
    assert view.starts == 1


def test_root_cause_stored_after_the_restarts_starting_counts_once_under_its_reason() -> None:
    # With systemd's default RestartSec=100ms the failed process's late lines (its _PID is the old
    # main pid) can be stored after the restart's "Starting"; they still belong to the failed start.
    run = VllmRun("0.24.0", max_model_len=131072, kv_cache_gib=2.13,
                  failure=Failure("kv_cache_too_small", needed_gib=3.36, estimated_max_model_len=46528))
    failed = service_start(UNIT, run, ORIGIN, restart_counter=1, restart_sec=0.1,
                           late_after=root_cause_offset(run), late_delay=0.15)
    restarted = service_start(UNIT, replace(run, failure=None, main_pid=run.main_pid + 1, **RECOVERY),
                              failed.restart_at, job_id=110)
    placed = one_boot(failed.entries, restarted.entries)
    assert first(placed, UNIT, ROLE_ROOT_CAUSE).realtime_usec > restart_begins(placed, UNIT)  # the premise
    view = fold_placed(placed)[UNIT]
    assert view.failures == failures(kv_cache_too_small=1)
    assert view.starts == 1


NO_KV_MEMORY_CAUSE = ("(EngineCore pid=77) ERROR 12-02 10:00:30 [core.py:708] ValueError: No available memory for "
                      "the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.")
FREE_MEMORY_CAUSE = ("(EngineCore pid=77) ERROR 12-02 10:00:30 [core.py:946] ValueError: Free memory on device "
                     "xpu:0 (3.1/23.86 GiB) on startup is less than desired GPU memory utilization (0.5, 11.93 GiB). "
                     "Decrease GPU memory utilization or reduce GPU memory used by other processes.")


@pytest.mark.parametrize(("causes", "reason"), [
    ((FREE_MEMORY_CAUSE, NO_KV_MEMORY_CAUSE), "insufficient_free_memory"),
    ((NO_KV_MEMORY_CAUSE, FREE_MEMORY_CAUSE), "no_kv_cache_memory"),
], ids=["free-memory-first", "no-kv-memory-first"])
def test_a_start_printing_two_different_causes_counts_once_under_the_first(causes: tuple[str, str],
                                                                            reason: str) -> None:
    # exporter/parsers/vllm.py's docstring: the first cause is the root cause, later ones change nothing.
    at = round(ORIGIN * 1e6)
    entries = [TrackerEntry(UNIT, at, "", True, journalgen.MESSAGE_ID_UNIT_STARTING, 1),
               TrackerEntry(UNIT, at + 1000, API_LINE + "vLLM API server version 0.24.0", False, "", 77)]
    entries += [TrackerEntry(UNIT, at + 2000 + index, cause, False, "", 77) for index, cause in enumerate(causes)]
    view = fold(entries)[UNIT]
    assert view.failures == failures(**{reason: 1})
    assert view.last_failure_usec == at + 2000


# --- stops ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.8.3", "0.13.0", "0.24.0"])
def test_stop_during_init_counts_neither_a_start_nor_a_failure(version: str) -> None:
    run = VllmRun(version, init_seconds=40.0)
    stopped = service_start(UNIT, run, ORIGIN, stop_after=12.0)
    later = service_start(UNIT, replace(run, main_pid=run.main_pid + 1), ORIGIN + 300.0, job_id=110)
    placed = one_boot(stopped.entries, later.entries)
    after_stop = fold(e for e in tracker_entries(placed) if e.realtime_usec < round((ORIGIN + 300.0) * 1e6))[UNIT]
    assert after_stop.latest is not None  # the stopped start did print (version, settings, ...)
    assert after_stop.failures == no_failures()
    assert after_stop.starts == 0
    view = fold_placed(placed)[UNIT]
    assert view.failures == no_failures()
    assert view.starts == 1


# --- settings and KV figures -----------------------------------------------------------------------


def succeeded(run: VllmRun) -> UnitView:
    return fold_placed(one_boot(service_runs(UNIT, [run], ORIGIN)))[UNIT]


@pytest.mark.parametrize(("version", "given", "expected"), [
    ("0.9.2", None, 0.9),
    ("0.10.1.1", None, 0.9),
    ("0.15.1", None, 0.9),
    ("0.17.1", None, 0.9),
    ("0.19.1", None, 0.9),
    ("0.20.2", None, 0.92),
    ("0.24.0", None, 0.92),
    ("0.24.0", 0.6, 0.6),
    ("0.19.1", 0.45, 0.45),
])
def test_gpu_memory_utilization_is_the_given_value_or_the_releases_default(
        version: str, given: float | None, expected: float) -> None:
    view = succeeded(VllmRun(version, gpu_memory_utilization=given))
    assert view.gpu_memory_utilization == expected


@pytest.mark.parametrize(("version", "given", "utilisation"), [
    ("0.9.2", None, 0.9),
    ("0.10.1.1", 0.85, 0.85),
    ("0.11.0", None, 0.9),
    ("0.13.0", 0.6, 0.6),
    ("0.15.1", None, 0.9),
])
def test_kv_bytes_are_derived_from_the_profiling_lines_on_0_9_2_to_0_15_1(
        version: str, given: float | None, utilisation: float) -> None:
    profiling = Profiling(total_mb=24480.0, model_load_mb=8204.13, peak_mb=9013.4)
    view = succeeded(VllmRun(version, gpu_memory_utilization=given, profiling=profiling))
    # "total GPU memory: 24480.00 MB" x utilisation - "peak memory usage is 9013.40 MB"
    assert view.latest.effective_kv_cache_bytes == round(mib(24480.00) * utilisation - mib(9013.40))


def test_kv_cache_memory_bytes_is_recorded_but_ignored_by_the_xpu_worker_before_0_16() -> None:
    profiling = Profiling(total_mb=16225.0, model_load_mb=3481.2, peak_mb=4102.65)
    view = succeeded(VllmRun("0.11.0", kv_cache_memory_bytes=4 * GiB, profiling=profiling))
    assert view.latest.kv_cache_memory_bytes == 4 * GiB
    assert view.latest.effective_kv_cache_bytes == round(mib(16225.00) * 0.9 - mib(4102.65))


def test_kv_cache_memory_bytes_reservation_is_the_kv_bytes_from_0_16() -> None:
    view = succeeded(VllmRun("0.17.1", kv_cache_memory_bytes=5_713_920_000, kv_cache_tokens=46_336,
                             max_concurrency=1.41))
    assert view.latest.kv_cache_memory_bytes == 5_713_920_000
    assert view.latest.effective_kv_cache_bytes == gib(5.32)  # "reserved 5.32 GiB memory for KV Cache"


@pytest.mark.parametrize(("version", "block_size", "blocks", "tokens"), [
    ("0.6.3.post1", None, 2730, 43_680),  # "# GPU blocks: 2730", Namespace block_size=16
    ("0.7.3", None, 4096, 65_536),  # "# xpu blocks", V0 default block size 16
    ("0.8.3", None, 8192, 131_072),
    ("0.9.1", 32, 1500, 48_000),  # block_size given in the non-default args
])
def test_v0_kv_tokens_are_device_blocks_times_block_size(
        version: str, block_size: int | None, blocks: int, tokens: int) -> None:
    view = succeeded(VllmRun(version, block_size=block_size, gpu_blocks=blocks, max_model_len=16384))
    assert view.latest.effective_kv_cache_tokens == tokens
    assert view.latest.effective_kv_cache_bytes is None  # V0 prints no KV bytes
    assert view.latest.effective_required_bytes is None


@pytest.mark.parametrize("run", [
    VllmRun("0.13.0", gpu_memory_utilization=0.9, profiling=Profiling(24480.0, 13824.5, 14592.25),
            kv_cache_tokens=59_904, max_concurrency=1.83),
    VllmRun("0.17.1", kv_cache_memory_bytes=5_713_920_000, kv_cache_tokens=46_336, max_concurrency=1.41),
    VllmRun("0.24.0", kv_cache_gib=7.25, kv_cache_tokens=52_736, max_concurrency=1.61),
], ids=["0.13.0-profiling", "0.17.1-reserved", "0.24.0-available"])
def test_required_bytes_after_success_are_kv_bytes_divided_by_max_concurrency(run: VllmRun) -> None:
    latest = succeeded(run).latest
    assert latest.max_concurrency == run.max_concurrency
    assert latest.effective_required_bytes == pytest.approx(latest.effective_kv_cache_bytes / run.max_concurrency,
                                                            abs=1)


@pytest.mark.parametrize("version", ERA_VERSIONS)
def test_successful_start_of_every_era_counts_one_start_and_no_failure(version: str) -> None:
    run = VllmRun(version, gpu_memory_utilization=0.8, max_model_len=16384, max_num_seqs=8,
                  kv_cache_gib=5.5, profiling=Profiling(16225.0, 3481.2, 4102.65))
    placed = one_boot(service_runs(UNIT, [run], ORIGIN))
    view = fold_placed(placed)[UNIT]
    assert view.failures == no_failures()
    assert view.starts == 1
    latest = view.latest
    assert (latest.version, latest.model) == (version, run.model)
    assert (latest.gpu_memory_utilization, latest.max_model_len, latest.max_num_seqs) == (0.8, 16384, 8)
    assert latest.effective_kv_cache_tokens == run.tokens
    assert latest.max_concurrency == run.concurrency
    if run.era.prints_init_duration:
        assert latest.init_duration_seconds == run.init_seconds
    assert any(p.planned.role == ROLE_INIT_DONE for p in placed)


# --- overlaps -----------------------------------------------------------------------------------------


def test_start_during_another_units_model_load_overlaps_both_once() -> None:
    first_run, second_run = VllmRun("0.24.0", init_seconds=40.0), VllmRun("0.24.0", main_pid=5000)
    views = fold_placed(one_boot(service_runs(UNIT, [first_run], ORIGIN),
                                 service_runs(OTHER_UNIT, [second_run], ORIGIN + 10.0)))
    assert views[UNIT].overlaps == 1
    assert views[OTHER_UNIT].overlaps == 1


def test_start_after_another_units_first_kv_line_does_not_overlap() -> None:
    first_run = VllmRun("0.24.0", init_seconds=40.0)  # "Available KV cache memory" at ~30 s
    views = fold_placed(one_boot(service_runs(UNIT, [first_run], ORIGIN),
                                 service_runs(OTHER_UNIT, [VllmRun("0.24.0", main_pid=5000)], ORIGIN + 35.0)))
    assert views[UNIT].overlaps == 0
    assert views[OTHER_UNIT].overlaps == 0


# --- determinism -------------------------------------------------------------------------------------


def mixed_journal(race: BootRace) -> list[TrackerEntry]:
    eras = [service_runs(f"vllm-era-{index}.service",
                         [VllmRun(version, max_model_len=8192, gpu_blocks=900, failure=Failure("no_kv_cache_memory"),
                                  kv_cache_gib=-0.2, profiling=Profiling(16225.0, 7695.45, 15000.0)),
                          VllmRun(version, max_model_len=8192, main_pid=6000 + index)],
                         ORIGIN + 200.0 * index)
            for index, version in enumerate(ERA_VERSIONS)]
    return race.entries() + tracker_entries(one_boot(*eras))


def as_data(views: dict[str, UnitView]) -> dict[str, dict]:
    return {unit: dataclasses.asdict(view) for unit, view in views.items()}


def test_folding_the_same_journal_twice_gives_identical_views(boot_race: BootRace) -> None:
    entries = mixed_journal(boot_race)
    assert as_data(fold(entries)) == as_data(fold(list(entries)))


def test_fold_split_at_any_point_and_resumed_gives_the_same_views(boot_race: BootRace) -> None:
    entries = boot_race.entries()
    whole = as_data(fold(entries))
    for split in range(len(entries) + 1):
        tracker = EngineTracker()
        tracker.extend(entries[:split])
        tracker.extend(entries[split:])
        tracker.settle(now_usec())
        assert as_data({view.unit: view for view in tracker.views()}) == whole, split


def test_a_restart_whose_process_reuses_the_failed_ones_pid_is_still_its_own_start() -> None:
    cause = ("(EngineCore pid=77) ERROR 12-02 10:00:30 [core.py:708] ValueError: No available memory for the "
             "cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.")
    entries = []
    for attempt in range(3):
        at = round((ORIGIN + attempt) * 1e6)
        entries += [TrackerEntry(UNIT, at, "", True, journalgen.MESSAGE_ID_UNIT_STARTING, 1),
                    TrackerEntry(UNIT, at + 1000, cause, False, "", 77)]
    view = fold(entries)[UNIT]
    assert view.failures == failures(no_kv_cache_memory=3)


def test_views_change_nothing_and_settle_counts_a_failure_whose_cause_never_came_as_other() -> None:
    at = round(ORIGIN * 1e6)
    exited = at + 2000
    tracker = EngineTracker()
    tracker.extend([TrackerEntry(UNIT, at, "", True, journalgen.MESSAGE_ID_UNIT_STARTING, 1),
                    TrackerEntry(UNIT, at + 1000, API_LINE + "vLLM API server version 0.24.0", False, "", 77),
                    TrackerEntry(UNIT, exited, "", True, journalgen.MESSAGE_ID_UNIT_PROCESS_EXIT, 1)])
    for _ in range(2):  # however late and often it is read, the failure waits for settle()
        [view] = tracker.views()
        assert (view.failures, view.last_failure_usec) == (no_failures(), None)
    tracker.settle(exited + LATE_LINES_GRACE_USEC)
    [view] = tracker.views()
    assert view.failures == no_failures()
    tracker.settle(exited + LATE_LINES_GRACE_USEC + 1)
    [view] = tracker.views()
    assert (view.failures, view.last_failure_usec) == (failures(other=1), exited)


# --- cost ---------------------------------------------------------------------------------------------


def lines_executed(code_files: Collection[str], work: Callable[[], object]) -> int:
    """Lines of Python executed in `code_files` while `work` runs (loop iterations count once each):
    a deterministic measure of the work done there."""
    count = 0

    def in_file(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return in_file

    def calls(frame, event, arg):
        return in_file if frame.f_code.co_filename in code_files else None

    sys.settrace(calls)
    try:
        work()
    finally:
        sys.settrace(None)
    return count


def many_units(count: int, spacing_s: float) -> list[TrackerEntry]:
    """`count` units starting `spacing_s` apart, each with one successful start."""
    return tracker_entries(one_boot(*(service_runs(f"vllm-{index:04d}.service", [VllmRun("0.24.0", main_pid=5000 + index)],
                                                   ORIGIN + index * spacing_s)
                                      for index in range(count))))


@pytest.mark.parametrize("spacing_s", [0.01, 100.0], ids=["all-initialising-together", "one-after-another"])
def test_fold_work_per_entry_does_not_grow_with_the_number_of_units(spacing_s: float) -> None:
    """3,000 units once took 50 s of CPU to catch up: each start looked at every unit for overlaps."""
    fold_files = {str(path) for path in Path(engine_starts.__file__).parent.glob("*.py")}
    per_entry = {}
    for count in (40, 160):
        entries = many_units(count, spacing_s)
        tracker = EngineTracker(max_units=count)
        per_entry[count] = lines_executed(fold_files, lambda: tracker.extend(entries)) / len(entries)
        assert len(list(tracker.views())) == count
    assert per_entry[160] <= 1.02 * per_entry[40], per_entry


def test_overlaps_of_many_units_initialising_together_are_each_counted_once() -> None:
    views = fold_with_cap(many_units(50, 0.01), 50)
    assert {view.overlaps for view in views.values()} == {1}


def test_admit_watches_units_up_to_the_cap_and_counts_the_rest_as_dropped() -> None:
    tracker = EngineTracker(max_units=2)
    assert [tracker.admit(unit) for unit in ("vllm-a.service", "vllm-b.service", "vllm-c.service", "vllm-a.service")] \
        == [True, True, False, True]
    assert tracker.dropped_units == {"vllm-c.service"}


def fold_with_cap(entries: Iterable[TrackerEntry], max_units: int) -> dict[str, UnitView]:
    tracker = EngineTracker(max_units)
    tracker.extend(entries)
    tracker.settle(now_usec())
    return {view.unit: view for view in tracker.views()}


# --- implausible values ------------------------------------------------------------------------------

API_LINE = "(APIServer pid=77) INFO 12-02 10:00:00 [api_server.py:1873] "
CORE_LINE = "(EngineCore pid=77) INFO 12-02 10:00:20 [core.py:210] "


def start_entries(lines: Sequence[str], unit: str = UNIT) -> list[TrackerEntry]:
    at = round(ORIGIN * 1e6)
    return [TrackerEntry(unit, at, "", True, journalgen.MESSAGE_ID_UNIT_STARTING, 1),
            *(TrackerEntry(unit, at + 1000 * (index + 1), line, False, "", 77) for index, line in enumerate(lines))]


GOOD_LINES = (
    API_LINE + "vLLM API server version 0.24.0",
    API_LINE + "non-default args: {'model': 'Qwen/Qwen3-8B', 'max_model_len': 131072, 'gpu_memory_utilization': 0.75}",
    CORE_LINE + "Available KV cache memory: 3.25 GiB",
    CORE_LINE + "Maximum concurrency for 131,072 tokens per request: 0.36x",
    CORE_LINE + "init engine (profile, create kv cache, warmup model) took 42.50 seconds",
)
IMPLAUSIBLE_LINES = (
    API_LINE + "non-default args: {'model': 'z', 'max_model_len': " + "9" * 4000 + "}",
    API_LINE + "non-default args: {'model': 'z', 'gpu_memory_utilization': 1e999}",
    CORE_LINE + "Available KV cache memory: -999999999999999 GiB",
    CORE_LINE + "Maximum concurrency for 131,072 tokens per request: -3.00x",
)


def test_lines_with_implausible_values_are_counted_and_change_nothing() -> None:
    tracker = EngineTracker()
    # the implausible lines come where each could have changed the start: settings before the KV line
    lines = [*GOOD_LINES[:2], *IMPLAUSIBLE_LINES[:2], GOOD_LINES[2], *IMPLAUSIBLE_LINES[2:], *GOOD_LINES[3:]]
    tracker.extend(start_entries(lines))
    assert tracker.rejected_lines == len(IMPLAUSIBLE_LINES)
    assert tracker.first_rejections == {UNIT: parse_line(IMPLAUSIBLE_LINES[0])}
    tracker.settle(round(ORIGIN * 1e6))
    assert as_data({view.unit: view for view in tracker.views()}) == \
        as_data({unit: view for unit, view in fold(start_entries(GOOD_LINES)).items()})


def test_derived_kv_tokens_and_required_bytes_out_of_bounds_are_absent() -> None:
    v0_huge_blocks = [API_LINE + "vLLM API server version 0.8.3",
                      API_LINE + "non-default args: {'model': 'm', 'block_size': 1048576}",
                      CORE_LINE + "# xpu blocks: 1099511627776, # CPU blocks: 4096",
                      CORE_LINE + "init engine (profile, create kv cache, warmup model) took 4.31 seconds"]
    assert fold(start_entries(v0_huge_blocks))[UNIT].last_success.effective_kv_cache_tokens is None
    tiny_concurrency = [API_LINE + "vLLM API server version 0.24.0",
                        CORE_LINE + "Available KV cache memory: 1048576 GiB",
                        CORE_LINE + "Maximum concurrency for 131,072 tokens per request: 0.000000000000001x",
                        CORE_LINE + "init engine (profile, create kv cache, warmup model) took 42.50 seconds"]
    assert fold(start_entries(tiny_concurrency))[UNIT].latest.effective_required_bytes is None


def test_a_view_keeps_what_it_showed_while_the_fold_goes_on(boot_race: BootRace) -> None:
    entries = list(boot_race.entries())
    tracker = EngineTracker()
    tracker.extend(entries[:len(entries) // 2])
    before = {view.unit: view for view in tracker.views()}
    shown = {unit: [dataclasses.asdict(start) for start in (view.latest, view.current) if start is not None]
             for unit, view in before.items()}
    tracker.extend(entries[len(entries) // 2:])
    tracker.settle(now_usec())
    assert {unit: [dataclasses.asdict(start) for start in (view.latest, view.current) if start is not None]
            for unit, view in before.items()} == shown
    assert fold(entries)[CHAT].latest != before[CHAT].latest


def test_a_starts_snapshot_equals_it_field_by_field_and_holds_only_immutable_values(boot_race: BootRace) -> None:
    for view in fold(boot_race.entries()).values():
        start = view.last_success
        assert start is not None
        copy = start.snapshot()
        assert copy is not start
        assert dataclasses.asdict(copy) == dataclasses.asdict(start)
        for field in dataclasses.fields(start):
            hash(getattr(start, field.name))  # an unhashable (mutable) field would need a deep copy


# --- --max-model-len auto: the silent shrink (issue 20) -----------------------------------------------

AUTO_FIT_VERSIONS = ("0.14.1", "0.15.1", "0.17.1", "0.24.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")


@pytest.mark.parametrize("version", AUTO_FIT_VERSIONS)
def test_auto_fit_that_shrank_the_context_records_the_full_and_the_served_length_and_counts_one_shrink(
        version: str) -> None:
    run = VllmRun(version, model_max_len=131072, auto_max_model_len=True, auto_fit_to=46528, kv_cache_gib=2.13,
                  profiling=Profiling(16225.0, 7695.45, 12000.0))
    view = fold_placed(one_boot(service_runs(UNIT, [run], ORIGIN)))[UNIT]
    assert (view.starts, view.failures, view.context_shrinks) == (1, no_failures(), 1)
    latest = view.latest
    assert (latest.requested_max_model_len, latest.max_model_len, latest.context_shrunk) == (131072, 46528, True)


@pytest.mark.parametrize("version", AUTO_FIT_VERSIONS)
def test_auto_fit_that_kept_the_full_context_counts_no_shrink(version: str) -> None:
    run = VllmRun(version, model_max_len=40960, auto_max_model_len=True, kv_cache_gib=7.25)
    view = fold_placed(one_boot(service_runs(UNIT, [run], ORIGIN)))[UNIT]
    assert (view.starts, view.context_shrinks) == (1, 0)
    assert (view.latest.requested_max_model_len, view.latest.max_model_len) == (40960, 40960)


def test_without_auto_fit_the_requested_length_is_the_printed_one_and_nothing_shrinks() -> None:
    view = fold_placed(one_boot(service_runs(UNIT, [VllmRun("0.24.0", max_model_len=32768)], ORIGIN)))[UNIT]
    assert (view.latest.requested_max_model_len, view.latest.max_model_len, view.context_shrinks) == (32768, 32768, 0)


def test_shrinks_count_per_start_and_the_latest_start_decides_the_lengths() -> None:
    shrunk = VllmRun("0.24.0", model_max_len=131072, auto_max_model_len=True, auto_fit_to=46528, kv_cache_gib=2.13)
    runs = [shrunk, replace(shrunk, auto_fit_to=20480, kv_cache_gib=0.94), replace(shrunk, auto_fit_to=None)]
    view = fold_placed(one_boot(*(service_runs(UNIT, [replace(run, main_pid=4000 + index)], ORIGIN + 600.0 * index,
                                               job_id=100 + 10 * index) for index, run in enumerate(runs))))[UNIT]
    assert (view.starts, view.context_shrinks) == (3, 2)
    assert (view.latest.requested_max_model_len, view.latest.max_model_len) == (131072, 131072)


def test_auto_fit_without_room_for_one_token_fails_as_no_kv_cache_memory_and_is_no_shrink() -> None:
    run = VllmRun("0.24.0", model_max_len=131072, auto_max_model_len=True, kv_cache_gib=-0.12,
                  failure=Failure("no_kv_cache_memory"))
    view = fold_placed(one_boot(service_runs(UNIT, [run], ORIGIN)))[UNIT]
    assert view.failures == failures(no_kv_cache_memory=1)
    assert (view.context_shrinks, view.latest.requested_max_model_len) == (0, 131072)


# --- vLLM's own startup plan (0.34) and sleep mode --------------------------------------------------------

PLAN_API = "(APIServer pid=77) INFO 12-02 10:00:00 [api_server.py:1873] "
PLAN_CORE = "(EngineCore pid=77) INFO 12-02 10:00:20 [startup_plan.py:212] "
PLAN_INIT_DONE = CORE_LINE + "init engine (profile, create kv cache, warmup model) took 12.50 s (compilation: 3.10 s)"
PLAN_APPLIED_START = (
    PLAN_API + "non-default args: {'model': 'Qwen/Qwen3-8B', 'max_model_len': 32768}",
    PLAN_CORE + "Applying persisted startup plan (fingerprint 3f9a2c41): kv_cache_memory_bytes=2684354560 (2.50 GiB), "
                "recorded free-memory baseline 14.21 GiB, current 14.85 GiB. Memory profiling will be skipped.",
    CORE_LINE + "Initial free memory 14.85 GiB, reserved 2.5 GiB memory for KV Cache as specified by "
                "kv_cache_memory_bytes config and skipped memory profiling.",
    CORE_LINE + "XPU KV cache size: 18,304 tokens, Maximum concurrency for 32,768 tokens per request: 0.56x",
    PLAN_INIT_DONE,
)
PLAN_FALLBACK_START = (
    PLAN_API + "non-default args: {'model': 'Qwen/Qwen3-8B', 'max_model_len': 32768}",
    PLAN_CORE + "Startup plan not applied: current free memory (9.63 GiB) is below the recorded baseline "
                "(14.21 GiB); falling back to full memory profiling.",
    CORE_LINE + "Available KV cache memory: 1.75 GiB",
    CORE_LINE + "XPU KV cache size: 12,800 tokens, Maximum concurrency for 32,768 tokens per request: 0.39x",
    PLAN_CORE + "Saved startup plan to /var/cache/vllm/startup_plan/startup_plan_3f9a2c41.json",
    PLAN_INIT_DONE,
)


def test_a_start_on_an_applied_startup_plan_records_the_plans_budget_and_no_fallback() -> None:
    view = fold(start_entries(PLAN_APPLIED_START))[UNIT]
    assert (view.starts, view.startup_plan_fallbacks) == (1, 0)
    assert (view.latest.startup_plan, view.latest.startup_plan_bytes) == (StartupPlanOutcome.APPLIED, gib(2.5))


def test_a_start_whose_startup_plan_fell_back_counts_one_fallback_and_records_the_budget_it_saved() -> None:
    view = fold(start_entries(PLAN_FALLBACK_START))[UNIT]
    assert (view.starts, view.failures, view.startup_plan_fallbacks) == (1, no_failures(), 1)
    assert (view.latest.startup_plan, view.latest.startup_plan_bytes) == (StartupPlanOutcome.FALLBACK, gib(1.75))


def test_a_first_start_that_saved_its_plan_is_saved_and_a_start_without_the_plan_has_none() -> None:
    first_start = [line for line in PLAN_FALLBACK_START if "Startup plan not applied" not in line]
    latest = fold(start_entries(first_start))[UNIT].latest
    assert (latest.startup_plan, latest.startup_plan_bytes) == (StartupPlanOutcome.SAVED, gib(1.75))
    plain = fold(start_entries(GOOD_LINES))[UNIT].latest
    assert (plain.startup_plan, plain.startup_plan_bytes) == (None, None)


SLEEP_LINE = "(EngineCore pid=77) INFO 12-02 11:00:00 [gpu_worker.py:142] Sleep mode freed 11.62 GiB memory, " \
             "2.41 GiB memory is still in use."


def test_a_running_engines_sleep_line_records_what_it_freed_and_when_and_counts_nothing() -> None:
    entries = start_entries([*GOOD_LINES, SLEEP_LINE])
    view = fold(entries)[UNIT]
    assert (view.starts, view.failures) == (1, no_failures())
    latest = view.latest
    assert (latest.sleep_freed_bytes, latest.sleep_device_used_bytes, latest.slept_usec) == \
        (gib(11.62), gib(2.41), entries[-1].realtime_usec)


def test_a_sleep_line_of_a_start_still_initialising_is_not_a_sleep() -> None:
    latest = fold(start_entries([*GOOD_LINES[:3], SLEEP_LINE]))[UNIT].latest
    assert (latest.outcome, latest.sleep_freed_bytes, latest.slept_usec) == (None, None, None)
