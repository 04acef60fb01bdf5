"""End to end over every vLLM format era: realistic unit lifecycles (tests/vllmlogs.py) written to
REAL journal files by systemd-journal-remote, read by the exporter running as a process
(--journal.file, no Level Zero, no processes collector), its /metrics scraped over HTTP."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import journalgen
from exporterproc import RunningExporter
from polling import wait_for
from scrapes import sample, series
from sizes import GiB, gib, mib
from vllmlogs import (
    CHAT,
    EMBEDDING,
    LEGACY,
    REASONS,
    STT,
    UNWATCHED,
    Boot,
    BootRace,
    Failure,
    Placed,
    Profiling,
    VllmRun,
    compose,
    failure_instant,
    journal_specs,
    service_runs,
)

ERA_ORIGIN = 1_747_200_000.0
ERA_BOOT_ID = "7e6d5c4b3a2940f18e7d6c5b4a392817"
JOURNAL_METRICS = (
    "xpu_unit_gpu_memory_utilization_ratio",
    "xpu_unit_max_model_len_tokens",
    "xpu_unit_max_num_seqs",
    "xpu_unit_kv_cache_budget_bytes",
    "xpu_unit_kv_cache_bytes",
    "xpu_unit_kv_cache_tokens",
    "xpu_unit_kv_cache_required_bytes",
    "xpu_unit_kv_cache_max_concurrency",
    "xpu_unit_engine_starts_total",
    "xpu_unit_engine_last_failure_timestamp_seconds",
    "xpu_unit_engine_init_duration_seconds",
    "xpu_unit_engine_init_overlaps_total",
)


@dataclass(frozen=True)
class Expected:
    """The journal metrics of a unit after its runs; None: the series is absent."""

    version: str
    model: str
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int | None
    kv_cache_budget_bytes: int | None
    kv_cache_bytes: int | None
    kv_cache_tokens: int | None
    kv_cache_max_concurrency: float | None
    init_duration_seconds: float | None
    failures: Mapping[str, int]
    starts: int = 1
    overlaps: int = 0
    required_bytes: float | None = field(default=None)  # None: KV bytes / concurrency when both known

    def required(self) -> float | None:
        if self.required_bytes is not None:
            return self.required_bytes
        if self.kv_cache_bytes is None or not self.kv_cache_max_concurrency:
            return None
        return self.kv_cache_bytes / self.kv_cache_max_concurrency


@dataclass(frozen=True)
class EraCase:
    runs: tuple[VllmRun, ...]  # a failed start, then systemd's restart that succeeds
    expected: Expected


def fails(reason: str) -> dict[str, int]:
    return {**dict.fromkeys(REASONS, 0), reason: 1}


# fmt: off
ERA_CASES: dict[str, EraCase] = {
    "0.6.3-v0-no-brackets-raw-traceback": EraCase(
        (VllmRun("0.6.3.post1", model="Qwen/Qwen2.5-7B-Instruct", gpu_memory_utilization=0.45, max_model_len=8192,
                 gpu_blocks=400, failure=Failure("kv_cache_too_small")),
         VllmRun("0.6.3.post1", model="Qwen/Qwen2.5-7B-Instruct", gpu_memory_utilization=0.45, max_model_len=8192,
                 gpu_blocks=2730)),
        # Namespace prints max_num_seqs=256 and block_size=16; 0.6.3 prints no init duration.
        Expected("0.6.3.post1", "Qwen/Qwen2.5-7B-Instruct", 0.45, 8192, 256, None, None, 43_680, 5.33, None,
                 fails("kv_cache_too_small"))),
    "0.7.3-v0-xpu-blocks": EraCase(
        (VllmRun("0.7.3", model="Qwen/Qwen2.5-3B-Instruct", max_model_len=32768, failure=Failure("no_kv_cache_memory")),
         VllmRun("0.7.3", model="Qwen/Qwen2.5-3B-Instruct", max_model_len=32768, gpu_blocks=4096, init_seconds=18.42)),
        Expected("0.7.3", "Qwen/Qwen2.5-3B-Instruct", 0.9, 32768, 256, None, None, 65_536, 2.0, 18.42,
                 fails("no_kv_cache_memory"))),
    "0.8.3-v0-brackets-namespace": EraCase(
        (VllmRun("0.8.3", model="meta-llama/Llama-3.2-1B-Instruct", gpu_memory_utilization=0.6, model_max_len=131072,
                 max_num_seqs=64, failure=Failure("device_out_of_memory")),
         VllmRun("0.8.3", model="meta-llama/Llama-3.2-1B-Instruct", gpu_memory_utilization=0.6, model_max_len=131072,
                 max_num_seqs=64, gpu_blocks=8192, init_seconds=12.5)),
        Expected("0.8.3", "meta-llama/Llama-3.2-1B-Instruct", 0.6, 131072, 64, None, None, 131_072, 1.0, 12.5,
                 fails("device_out_of_memory"))),
    "0.9.1-v0-xpu-non-default-args": EraCase(
        (VllmRun("0.9.1", model="Qwen/Qwen2.5-1.5B-Instruct", gpu_memory_utilization=0.5, max_model_len=16384,
                 block_size=32, failure=Failure("other")),
         VllmRun("0.9.1", model="Qwen/Qwen2.5-1.5B-Instruct", gpu_memory_utilization=0.5, max_model_len=16384,
                 block_size=32, gpu_blocks=1500, init_seconds=9.87)),
        Expected("0.9.1", "Qwen/Qwen2.5-1.5B-Instruct", 0.5, 16384, None, None, None, 48_000, 2.93, 9.87,
                 fails("other"))),
    "0.9.2-v1-unprefixed-profiling": EraCase(
        (VllmRun("0.9.2", model="Qwen/Qwen3-4B", max_model_len=32768,
                 failure=Failure("memory_query_unsupported", device_name="Intel(R) Arc(TM) 140T GPU (16GB)")),
         VllmRun("0.9.2", model="Qwen/Qwen3-4B", max_model_len=32768, profiling=Profiling(16225.0, 7695.45, 8412.3),
                 kv_cache_tokens=45_056, max_concurrency=1.38, init_seconds=35.2)),
        Expected("0.9.2", "Qwen/Qwen3-4B", 0.9, 32768, None, None, round(mib(16225.00) * 0.9 - mib(8412.30)),
                 45_056, 1.38, 35.2, fails("memory_query_unsupported"))),
    "0.10.1.1-EngineCore_0-colour": EraCase(
        (VllmRun("0.10.1.1", model="meta-llama/Llama-3.1-8B-Instruct", gpu_memory_utilization=0.85,
                 max_model_len=16384, max_num_seqs=8, profiling=Profiling(24480.0, 15316.42, 19800.0),
                 failure=Failure("kv_cache_too_small", needed_gib=2.0, estimated_max_model_len=8064)),
         VllmRun("0.10.1.1", model="meta-llama/Llama-3.1-8B-Instruct", gpu_memory_utilization=0.85,
                 max_model_len=16384, max_num_seqs=8, profiling=Profiling(24480.0, 15316.42, 16011.9),
                 kv_cache_tokens=36_864, max_concurrency=2.25, init_seconds=48.3)),
        Expected("0.10.1.1", "meta-llama/Llama-3.1-8B-Instruct", 0.85, 16384, 8, None,
                 round(mib(24480.00) * 0.85 - mib(16011.90)), 36_864, 2.25, 48.3, fails("kv_cache_too_small"))),
    "0.11.0-EngineCore_DP0-bold-colour-ignored-kv-bytes": EraCase(
        (VllmRun("0.11.0", model="Qwen/Qwen3-4B", gpu_memory_utilization=0.8, max_model_len=8192,
                 kv_cache_memory_bytes=4 * GiB, profiling=Profiling(16225.0, 7695.45, 13200.0),
                 failure=Failure("no_kv_cache_memory")),
         VllmRun("0.11.0", model="Qwen/Qwen3-4B", gpu_memory_utilization=0.8, max_model_len=8192,
                 kv_cache_memory_bytes=4 * GiB, profiling=Profiling(16225.0, 7695.45, 8412.3),
                 kv_cache_tokens=31_232, max_concurrency=3.81, init_seconds=27.6)),
        Expected("0.11.0", "Qwen/Qwen3-4B", 0.8, 8192, None, 4 * GiB, round(mib(16225.00) * 0.8 - mib(8412.30)),
                 31_232, 3.81, 27.6, fails("no_kv_cache_memory"))),
    "0.13.0-EngineCore_DP0-colour": EraCase(
        (VllmRun("0.13.0", model="mistralai/Mistral-7B-Instruct-v0.3", gpu_memory_utilization=0.9,
                 max_model_len=32768, max_num_seqs=16, profiling=Profiling(24480.0, 13824.5, 14592.25),
                 failure=Failure("device_out_of_memory", allocate_gib=2.0, total_gib=23.91, free_gib=1.02)),
         VllmRun("0.13.0", model="mistralai/Mistral-7B-Instruct-v0.3", gpu_memory_utilization=0.9,
                 max_model_len=32768, max_num_seqs=16, profiling=Profiling(24480.0, 13824.5, 14592.25),
                 kv_cache_tokens=59_904, max_concurrency=1.83, init_seconds=41.7)),
        Expected("0.13.0", "mistralai/Mistral-7B-Instruct-v0.3", 0.9, 32768, 16, None,
                 round(mib(24480.00) * 0.9 - mib(14592.25)), 59_904, 1.83, 41.7, fails("device_out_of_memory"))),
    "0.15.1-banner-profiling": EraCase(
        (VllmRun("0.15.1", max_model_len=40960, failure=Failure("other", error=None)),
         VllmRun("0.15.1", max_model_len=40960, profiling=Profiling(16225.0, 3481.2, 4102.65),
                 kv_cache_tokens=45_056, max_concurrency=1.1, init_seconds=30.0)),
        Expected("0.15.1", "Qwen/Qwen3-1.7B", 0.9, 40960, None, None, round(mib(16225.00) * 0.9 - mib(4102.65)),
                 45_056, 1.1, 30.0, fails("other"))),
    "0.17.1-available-kv-free-memory-check": EraCase(
        (VllmRun("0.17.1", model="Qwen/Qwen3-8B", gpu_memory_utilization=0.5, max_model_len=32768, total_gib=23.86,
                 failure=Failure("insufficient_free_memory", free_gib=3.1, total_gib=23.86)),
         VllmRun("0.17.1", model="Qwen/Qwen3-8B", gpu_memory_utilization=0.5, max_model_len=32768, total_gib=23.86,
                 kv_cache_gib=6.42, kv_cache_tokens=46_784, max_concurrency=1.43, init_seconds=52.8)),
        Expected("0.17.1", "Qwen/Qwen3-8B", 0.5, 32768, None, None, gib(6.42), 46_784, 1.43, 52.8,
                 fails("insufficient_free_memory"))),
    "0.19.1-EngineCore-kv-cache-memory-bytes": EraCase(
        (VllmRun("0.19.1", model="Qwen/Qwen3-14B", gpu_memory_utilization=0.88, max_model_len=40960, max_num_seqs=4,
                 kv_cache_memory_bytes=GiB,
                 failure=Failure("kv_cache_too_small", needed_gib=6.25, estimated_max_model_len=6544)),
         VllmRun("0.19.1", model="Qwen/Qwen3-14B", gpu_memory_utilization=0.88, max_model_len=40960, max_num_seqs=4,
                 kv_cache_memory_bytes=7 * GiB, kv_cache_tokens=45_824, max_concurrency=1.12, init_seconds=63.1)),
        Expected("0.19.1", "Qwen/Qwen3-14B", 0.88, 40960, 4, 7 * GiB, 7 * GiB, 45_824, 1.12, 63.1,
                 fails("kv_cache_too_small"))),
    "0.24.0-EngineCore-compilation": EraCase(
        (VllmRun("0.24.0", model="Qwen/Qwen3-4B-Instruct-2507", max_model_len=32768, kv_cache_gib=-0.37,
                 failure=Failure("no_kv_cache_memory")),
         VllmRun("0.24.0", model="Qwen/Qwen3-4B-Instruct-2507", max_model_len=32768, kv_cache_gib=7.25,
                 kv_cache_tokens=52_736, max_concurrency=1.61, init_seconds=45.12, compilation_seconds=20.31)),
        Expected("0.24.0", "Qwen/Qwen3-4B-Instruct-2507", 0.92, 32768, None, None, gib(7.25), 52_736, 1.61, 45.12,
                 fails("no_kv_cache_memory"))),
    "0.26.0-startup-memory-summary": EraCase(
        (VllmRun("0.26.0", model="Qwen/Qwen3-0.6B", gpu_memory_utilization=0.3, max_model_len=8192, kv_cache_gib=0.56,
                 failure=Failure("kv_cache_too_small", needed_gib=0.88, estimated_max_model_len=5120)),
         VllmRun("0.26.0", model="Qwen/Qwen3-0.6B", gpu_memory_utilization=0.3, max_model_len=8192, kv_cache_gib=1.62,
                 kv_cache_tokens=15_104, max_concurrency=1.84, init_seconds=21.7)),
        Expected("0.26.0", "Qwen/Qwen3-0.6B", 0.3, 8192, None, None, gib(1.62), 15_104, 1.84, 21.7,
                 fails("kv_cache_too_small"))),
    "0.28.0-combined-kv-line": EraCase(
        (VllmRun("0.28.0", model="google/gemma-3-12b-it", gpu_memory_utilization=0.9, max_model_len=16384,
                 failure=Failure("device_out_of_memory", form="native_api")),
         VllmRun("0.28.0", model="google/gemma-3-12b-it", gpu_memory_utilization=0.9, max_model_len=16384,
                 kv_cache_gib=3.1, kv_cache_tokens=24_832, max_concurrency=1.52, init_seconds=58.0)),
        Expected("0.28.0", "google/gemma-3-12b-it", 0.9, 16384, None, None, gib(3.1), 24_832, 1.52, 58.0,
                 fails("device_out_of_memory"))),
    "0.30.0-xpu-kv-cache-size": EraCase(
        (VllmRun("0.30.0", model="Qwen/Qwen3-8B", gpu_memory_utilization=0.9, max_model_len=32768, total_gib=22.71,
                 failure=Failure("insufficient_free_memory", free_gib=0.0, total_gib=22.71)),
         VllmRun("0.30.0", model="Qwen/Qwen3-8B", gpu_memory_utilization=0.9, max_model_len=32768, total_gib=22.71,
                 kv_cache_gib=4.5, kv_cache_tokens=32_768, max_concurrency=1.0, init_seconds=49.9)),
        Expected("0.30.0", "Qwen/Qwen3-8B", 0.9, 32768, None, None, gib(4.5), 32_768, 1.0, 49.9,
                 fails("insufficient_free_memory"))),
    "0.33.0-prefix-in-format-unprefixed-tracebacks": EraCase(
        (VllmRun("0.33.0", model="/srv/models/Qwen3-0.6B", max_model_len=16384, max_num_seqs=32, kv_cache_gib=0.2,
                 failure=Failure("kv_cache_too_small", needed_gib=1.75, estimated_max_model_len=1824)),
         VllmRun("0.33.0", model="/srv/models/Qwen3-0.6B", max_model_len=16384, max_num_seqs=32, kv_cache_gib=2.34,
                 kv_cache_tokens=21_760, max_concurrency=1.33, init_seconds=3.1)),
        Expected("0.33.0", "/srv/models/Qwen3-0.6B", 0.92, 16384, 32, None, gib(2.34), 21_760, 1.33, 3.1,
                 fails("kv_cache_too_small"))),
    "0.34.0-frontend-procs": EraCase(
        (VllmRun("0.34.0", model="Qwen/Qwen3-32B-AWQ", gpu_memory_utilization=0.95, max_model_len=8192,
                 failure=Failure("other")),
         VllmRun("0.34.0", model="Qwen/Qwen3-32B-AWQ", gpu_memory_utilization=0.95, max_model_len=8192,
                 kv_cache_gib=1.95, kv_cache_tokens=8_192, max_concurrency=1.0, init_seconds=71.4,
                 compilation_seconds=33.2)),
        Expected("0.34.0", "Qwen/Qwen3-32B-AWQ", 0.95, 8192, None, None, gib(1.95), 8_192, 1.0, 71.4, fails("other"))),
}
# fmt: on


def era_unit(name: str) -> str:
    return f"vllm-era-{name.split('-')[0]}.service"


def exporter_args(path: Path, boot: str) -> list[str]:
    return ["--journal.file", str(path), "--journal.boot", boot, "--no-collector.levelzero",
            "--no-collector.processes"]


def journal_ready(exporter: RunningExporter) -> dict:
    """A scrape taken once the journal collector has caught up (its success gauge is 1)."""
    samples = wait_for(lambda: (lambda s: s if sample(s, "xpu_exporter_collector_success", collector="journal") == 1
                                else None)(exporter.scrape()), timeout=20)
    assert samples, f"the journal collector never caught up:\n{exporter.stderr}"
    return samples


def unit_journal_metrics(samples: Mapping, unit: str) -> dict[str, object]:
    """Every journal metric of `unit` in one scrape; absent series are None."""
    metrics: dict[str, object] = {name: sample(samples, name, unit=unit) for name in JOURNAL_METRICS}
    metrics["xpu_unit_engine_info"] = {
        (labels["vllm_version"], labels["model"]): value
        for labels, value in ((dict(key), value) for key, value in series(samples, "xpu_unit_engine_info").items())
        if labels["unit"] == unit
    }
    metrics["xpu_unit_engine_init_failures_total"] = {
        labels["reason"]: value
        for labels, value in ((dict(key), value)
                              for key, value in series(samples, "xpu_unit_engine_init_failures_total").items())
        if labels["unit"] == unit
    }
    return metrics


def approx_or_none(value: float | None, tolerance: float) -> object:
    return None if value is None else pytest.approx(value, abs=tolerance)


def expected_journal_metrics(expected: Expected, last_failure_usec: int | None) -> dict[str, object]:
    return {
        "xpu_unit_engine_info": {(expected.version, expected.model): 1.0},
        "xpu_unit_gpu_memory_utilization_ratio": expected.gpu_memory_utilization,
        "xpu_unit_max_model_len_tokens": expected.max_model_len,
        "xpu_unit_max_num_seqs": expected.max_num_seqs,
        "xpu_unit_kv_cache_budget_bytes": expected.kv_cache_budget_bytes,
        "xpu_unit_kv_cache_bytes": expected.kv_cache_bytes,
        "xpu_unit_kv_cache_tokens": expected.kv_cache_tokens,
        "xpu_unit_kv_cache_required_bytes": approx_or_none(expected.required(), 1),
        "xpu_unit_kv_cache_max_concurrency": expected.kv_cache_max_concurrency,
        "xpu_unit_engine_starts_total": expected.starts,
        "xpu_unit_engine_init_failures_total": dict(expected.failures),
        "xpu_unit_engine_last_failure_timestamp_seconds": approx_or_none(
            None if last_failure_usec is None else last_failure_usec / 1e6, 1e-3),
        "xpu_unit_engine_init_duration_seconds": expected.init_duration_seconds,
        "xpu_unit_engine_init_overlaps_total": expected.overlaps,
    }


@pytest.fixture(scope="module")
def eras(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[Placed]]:
    """One journal holding every era's unit, each unit two hours after the previous one; one
    exporter reads it and is scraped once."""
    planned = []
    for index, (name, case) in enumerate(ERA_CASES.items()):
        planned += service_runs(era_unit(name), case.runs, ERA_ORIGIN + 7200.0 * index, job_id=200 + 20 * index)
    placed = compose(Boot(ERA_BOOT_ID, ERA_ORIGIN - 20.0, tuple(planned)))
    path = journalgen.write_journal(tmp_path_factory.mktemp("eras") / "eras.journal", journal_specs(placed))
    with RunningExporter(exporter_args(path, "all")) as exporter:
        return journal_ready(exporter), placed


@pytest.mark.parametrize("name", list(ERA_CASES))
def test_era_journal_metrics_equal_what_the_unit_printed(name: str, eras: tuple[dict, list[Placed]]) -> None:
    samples, placed = eras
    unit = era_unit(name)
    expected = expected_journal_metrics(ERA_CASES[name].expected, failure_instant(placed, unit))
    assert unit_journal_metrics(samples, unit) == expected


def test_every_era_unit_is_watched_and_nothing_else(eras: tuple[dict, list[Placed]]) -> None:
    samples, _ = eras
    units = {dict(labels)["unit"] for labels in series(samples, "xpu_unit_engine_starts_total")}
    assert units == {era_unit(name) for name in ERA_CASES}


# --- the problem statement's boot race ----------------------------------------------------------


def test_boot_race_end_to_end(boot_race: BootRace, boot_race_journal: Path) -> None:
    with RunningExporter(exporter_args(boot_race_journal, boot_race.boot_id)) as exporter:
        samples = journal_ready(exporter)
    _, restarted = boot_race.chat_runs
    chat = Expected("0.24.0", "google/gemma-3-4b-it", 0.75, 131072, 3, None, gib(3.25), 136_960, 1.04, 38.5,
                    fails("kv_cache_too_small"), overlaps=1)
    assert unit_journal_metrics(samples, CHAT) == expected_journal_metrics(chat, boot_race.chat_failure_usec())
    embedding, stt = boot_race.embedding_run, boot_race.stt_run
    for unit, run in ((EMBEDDING, embedding), (STT, stt)):
        expected = Expected("0.24.0", run.model, 0.07, run.max_model_len, None, None, gib(run.kv_cache_gib),
                            run.tokens, run.concurrency, run.init_seconds, dict.fromkeys(REASONS, 0), overlaps=1)
        assert unit_journal_metrics(samples, unit) == expected_journal_metrics(expected, None), unit


def test_boot_race_unwatched_unit_and_the_other_boot_are_not_reported(boot_race: BootRace,
                                                                      boot_race_journal: Path) -> None:
    with RunningExporter(exporter_args(boot_race_journal, boot_race.boot_id)) as exporter:
        samples = journal_ready(exporter)
    units = {dict(labels).get("unit") for (name, labels) in samples if name.startswith("xpu_unit_")}
    assert units == {CHAT, EMBEDDING, STT}
    assert UNWATCHED not in units and LEGACY not in units


def test_boot_race_with_every_boot_counts_the_other_boots_starts_too(boot_race: BootRace,
                                                                     boot_race_journal: Path) -> None:
    with RunningExporter(exporter_args(boot_race_journal, "all")) as exporter:
        samples = journal_ready(exporter)
    assert sample(samples, "xpu_unit_engine_starts_total", unit=CHAT) == 2
    assert sample(samples, "xpu_unit_engine_starts_total", unit=LEGACY) == 1
    assert sample(samples, "xpu_unit_engine_init_failures_total", unit=EMBEDDING, reason="no_kv_cache_memory") == 1
    assert sample(samples, "xpu_unit_engine_init_failures_total", unit=CHAT, reason="kv_cache_too_small") == 1


def test_boot_race_followed_live_shows_the_failures_figures_then_the_restarts(boot_race: BootRace,
                                                                              tmp_path: Path) -> None:
    before, after = boot_race.split_at_chat_restart()
    path = journalgen.write_journal(tmp_path / "live.journal", journal_specs(before))
    with RunningExporter(exporter_args(path, boot_race.boot_id)) as exporter:
        failed = journal_ready(exporter)
        assert unit_journal_metrics(failed, CHAT) == {
            "xpu_unit_engine_info": {("0.24.0", "google/gemma-3-4b-it"): 1.0},
            "xpu_unit_gpu_memory_utilization_ratio": 0.75,
            "xpu_unit_max_model_len_tokens": 131072,
            "xpu_unit_max_num_seqs": 3,
            "xpu_unit_kv_cache_budget_bytes": None,
            "xpu_unit_kv_cache_bytes": gib(2.13),
            "xpu_unit_kv_cache_tokens": None,  # no successful init yet
            "xpu_unit_kv_cache_required_bytes": gib(3.36),
            "xpu_unit_kv_cache_max_concurrency": None,  # the failed init printed none
            "xpu_unit_engine_starts_total": 0,
            "xpu_unit_engine_init_failures_total": fails("kv_cache_too_small"),
            "xpu_unit_engine_last_failure_timestamp_seconds": pytest.approx(boot_race.chat_failure_usec() / 1e6, abs=1e-3),
            "xpu_unit_engine_init_duration_seconds": None,
            "xpu_unit_engine_init_overlaps_total": 1,
        }
        journalgen.append_journal(path, journal_specs(after))
        restarted = wait_for(lambda: (lambda s: s if sample(s, "xpu_unit_engine_starts_total", unit=CHAT) == 1
                                      else None)(exporter.scrape()), timeout=15)
        assert restarted, f"the restart never showed:\n{exporter.stderr}"
    assert sample(restarted, "xpu_unit_kv_cache_bytes", unit=CHAT) == gib(3.25)
    assert sample(restarted, "xpu_unit_kv_cache_required_bytes", unit=CHAT) == pytest.approx(gib(3.25) / 1.04, abs=1)
    assert sample(restarted, "xpu_unit_kv_cache_tokens", unit=CHAT) == 136_960
    assert sample(restarted, "xpu_unit_engine_init_failures_total", unit=CHAT, reason="kv_cache_too_small") == 1
    assert sample(restarted, "xpu_unit_engine_init_overlaps_total", unit=CHAT) == 1


# --- --max-model-len auto: the silent shrink (issue 20) -------------------------------------------

AUTO_FIT_ORIGIN = 1_747_400_000.0
AUTO_FIT_BOOT_ID = "2b3c4d5e6f7a48b9a0c1d2e3f4a5b6c7"
# Every release that prints auto-fit's lines (0.14+), one text form each: 'GPU memory' 0.14-0.31, 'KV cache
# memory (A GiB XPU)' 0.32-0.33, '--max-model-len auto reduced ...' 0.34 (a WARNING below 8192 tokens).
AUTO_FIT_RUNS = {
    "0.14.1": VllmRun("0.14.1", model_max_len=131072, auto_max_model_len=True, auto_fit_to=46528,
                      profiling=Profiling(16225.0, 7695.45, 12000.0)),
    "0.15.1": VllmRun("0.15.1", model_max_len=40960, auto_max_model_len=True,
                      profiling=Profiling(16225.0, 3481.2, 4102.65)),
    "0.17.1": VllmRun("0.17.1", model_max_len=131072, auto_max_model_len=True, auto_fit_to=46528, kv_cache_gib=2.13),
    "0.24.0": VllmRun("0.24.0", model_max_len=40960, auto_max_model_len=True, auto_fit_to=18176, kv_cache_gib=2.5),
    "0.31.0": VllmRun("0.31.0", model_max_len=40960, auto_max_model_len=True, kv_cache_gib=7.25),
    "0.32.0": VllmRun("0.32.0", model_max_len=131072, auto_max_model_len=True, auto_fit_to=46528, kv_cache_gib=2.13),
    "0.33.0": VllmRun("0.33.0", model_max_len=40960, auto_max_model_len=True, kv_cache_gib=7.25),
    "0.34.0": VllmRun("0.34.0", model_max_len=40960, auto_max_model_len=True, auto_fit_to=4096, kv_cache_gib=0.5),
}


def auto_fit_unit(version: str) -> str:
    return f"vllm-auto-{version}.service"


@pytest.fixture(scope="module")
def auto_fit_scrape(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each release's auto-fit start in its own unit of one real journal, read by one exporter."""
    planned = []
    for index, (version, run) in enumerate(AUTO_FIT_RUNS.items()):
        planned += service_runs(auto_fit_unit(version), [run], AUTO_FIT_ORIGIN + 3600.0 * index, job_id=400 + index)
    placed = compose(Boot(AUTO_FIT_BOOT_ID, AUTO_FIT_ORIGIN - 20.0, tuple(planned)))
    path = journalgen.write_journal(tmp_path_factory.mktemp("auto-fit") / "auto.journal", journal_specs(placed))
    with RunningExporter(exporter_args(path, "all")) as exporter:
        return journal_ready(exporter)


@pytest.mark.parametrize("version", list(AUTO_FIT_RUNS))
def test_auto_fit_serves_the_requested_and_the_effective_length_and_counts_the_shrink(
        version: str, auto_fit_scrape: dict) -> None:
    run, unit = AUTO_FIT_RUNS[version], auto_fit_unit(version)
    shrunk = run.auto_fit_to is not None
    assert {
        "requested": sample(auto_fit_scrape, "xpu_unit_max_model_len_requested_tokens", unit=unit),
        "effective": sample(auto_fit_scrape, "xpu_unit_max_model_len_tokens", unit=unit),
        "shrinks": sample(auto_fit_scrape, "xpu_unit_context_shrinks_total", unit=unit),
        "concurrency_for": sample(auto_fit_scrape, "xpu_unit_kv_cache_max_concurrency", unit=unit),
        "starts": sample(auto_fit_scrape, "xpu_unit_engine_starts_total", unit=unit),
    } == {
        "requested": run.model_max_len,
        "effective": run.auto_fit_to if shrunk else run.model_max_len,
        "shrinks": 1 if shrunk else 0,
        "concurrency_for": run.concurrency,
        "starts": 1,
    }


def test_every_era_unit_counts_no_shrink_and_requests_what_it_printed(eras: tuple[dict, list[Placed]]) -> None:
    samples, _ = eras
    for name, case in ERA_CASES.items():
        unit = era_unit(name)
        assert sample(samples, "xpu_unit_context_shrinks_total", unit=unit) == 0, name
        assert sample(samples, "xpu_unit_max_model_len_requested_tokens", unit=unit) == case.expected.max_model_len, name


# vLLM 0.34's own startup plan (VLLM_ENABLE_STARTUP_PLAN=1), one unit per outcome, and sleep mode after a start.
STARTUP_PLAN_ORIGIN = AUTO_FIT_ORIGIN + 86400.0
STARTUP_PLAN_RUNS = {
    "applied": VllmRun("0.34.0", model_max_len=131072, auto_max_model_len=True, auto_fit_to=46528, kv_cache_gib=2.13,
                       startup_plan="applied", startup_plan_baseline_gib=9.8),
    "fallback": VllmRun("0.34.0", kv_cache_gib=3.25, startup_plan="fallback", free_gib_at_start=9.63,
                        startup_plan_baseline_gib=15.42),
    "saved": VllmRun("0.34.0", kv_cache_gib=7.25, startup_plan="saved", sleep_freed_gib=10.46),
}


@pytest.fixture(scope="module")
def startup_plan_scrape(tmp_path_factory: pytest.TempPathFactory) -> dict:
    planned = []
    for index, (outcome, run) in enumerate(STARTUP_PLAN_RUNS.items()):
        planned += service_runs(f"vllm-plan-{outcome}.service", [run], STARTUP_PLAN_ORIGIN + 3600.0 * index,
                                job_id=500 + index)
    placed = compose(Boot(AUTO_FIT_BOOT_ID, STARTUP_PLAN_ORIGIN - 20.0, tuple(planned)))
    path = journalgen.write_journal(tmp_path_factory.mktemp("startup-plan") / "plan.journal", journal_specs(placed))
    with RunningExporter(exporter_args(path, "all")) as exporter:
        return journal_ready(exporter)


@pytest.mark.parametrize("outcome", list(STARTUP_PLAN_RUNS))
def test_the_startup_plans_outcome_budget_and_fallbacks_are_served_per_unit(outcome: str,
                                                                            startup_plan_scrape: dict) -> None:
    run, unit = STARTUP_PLAN_RUNS[outcome], f"vllm-plan-{outcome}.service"
    states = {state: sample(startup_plan_scrape, "xpu_unit_startup_plan_state", unit=unit, state=state)
              for state in ("applied", "fallback", "saved")}
    assert states == {state: float(state == outcome) for state in states}
    assert sample(startup_plan_scrape, "xpu_unit_startup_plan_bytes", unit=unit) == \
        (run.startup_plan_bytes if outcome == "applied" else run.kv_cache_bytes)
    assert sample(startup_plan_scrape, "xpu_unit_startup_plan_fallbacks_total", unit=unit) == \
        (1 if outcome == "fallback" else 0)
    assert sample(startup_plan_scrape, "xpu_unit_engine_starts_total", unit=unit) == 1


def test_a_unit_that_went_to_sleep_serves_what_it_freed_and_one_that_did_not_serves_no_sleep(
        startup_plan_scrape: dict) -> None:
    slept = STARTUP_PLAN_RUNS["saved"]
    assert sample(startup_plan_scrape, "xpu_unit_sleep_freed_bytes", unit="vllm-plan-saved.service") == \
        round(slept.sleep_freed_gib * GiB)
    assert sample(startup_plan_scrape, "xpu_unit_sleep_device_used_bytes", unit="vllm-plan-saved.service") == \
        round(slept.sleep_device_used_gib * GiB)
    assert sample(startup_plan_scrape, "xpu_unit_sleep_timestamp_seconds", unit="vllm-plan-saved.service") > \
        STARTUP_PLAN_ORIGIN + 2 * 3600.0
    assert sample(startup_plan_scrape, "xpu_unit_sleep_freed_bytes", unit="vllm-plan-applied.service") is None
