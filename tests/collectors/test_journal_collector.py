"""The journal collector in a real exporter process over real journal files: following, restarts,
bad input, unreadable journals."""

from __future__ import annotations

import shutil
from pathlib import Path

from exporterproc import RunningExporter
from journalgen import (Clock, append_journal, random_boot_id, unit_failed, unit_output, unit_process_exited,
                        unit_starting, write_journal)
from polling import wait_for
from scrapes import sample, series
from vllmlogs import chat_runs, unit_start

CHAT = "vllm-xpu-chat.service"
API = "(APIServer pid=10) INFO 12-02 10:00:00 [api_server.py:1873] "
CORE = "(EngineCore pid=11) INFO 12-02 10:00:20 [gpu_worker.py:456] "
ONLY_JOURNAL = ("--no-collector.levelzero", "--no-collector.processes")
FAILED, STARTED = chat_runs()


def unit_samples(samples: dict) -> dict:
    return {key: value for key, value in samples.items() if key[0].startswith("xpu_unit_")}


def journal_exporter(*args: str) -> RunningExporter:
    return RunningExporter([*ONLY_JOURNAL, "--journal.boot", "all", *args])


def caught_up(exporter: RunningExporter, timeout: float = 10) -> dict:
    return wait_for(lambda: (s := exporter.scrape()) and
                    sample(s, "xpu_exporter_collector_success", collector="journal") == 1 and s, timeout=timeout)


def journal_directory_appears(directory: Path) -> None:
    """The journal directory is created at once, holding a journal with CHAT's failed start."""
    staging = directory.with_name("staging")
    staging.mkdir()
    write_journal(staging / "system.journal", unit_start(CHAT, FAILED, Clock(random_boot_id())))
    shutil.copytree(staging, directory)


def test_new_entries_are_followed_and_a_restarted_exporter_agrees(tmp_path):
    clock = Clock(random_boot_id())
    journal = write_journal(tmp_path / "system.journal", unit_start(CHAT, FAILED, clock))
    with journal_exporter("--journal.file", str(journal)) as exporter:
        first = caught_up(exporter)
        assert sample(first, "xpu_unit_engine_init_failures_total", unit=CHAT, reason="kv_cache_too_small") == 1
        assert sample(first, "xpu_unit_engine_starts_total", unit=CHAT) == 0

        append_journal(journal, unit_start(CHAT, STARTED, clock))
        followed = wait_for(lambda: (s := exporter.scrape()) and
                            sample(s, "xpu_unit_engine_starts_total", unit=CHAT) == 1 and s)
        assert followed, exporter.stderr
    with journal_exporter("--journal.file", str(journal)) as restarted:
        again = caught_up(restarted)
    assert unit_samples(again) == unit_samples(followed)
    assert sample(again, "xpu_unit_engine_init_failures_total", unit=CHAT, reason="kv_cache_too_small") == 1
    assert sample(again, "xpu_unit_kv_cache_bytes", unit=CHAT) == round(3.25 * 2**30)
    assert sample(again, "xpu_unit_kv_cache_tokens", unit=CHAT) == 47328
    assert sample(again, "xpu_unit_engine_init_duration_seconds", unit=CHAT) == 42.5


def test_every_reason_of_every_watched_unit_exists_at_zero(tmp_path):
    clock = Clock(random_boot_id())
    units = ["vllm-xpu-embedding.service", "vllm-xpu-stt.service"]
    journal = write_journal(tmp_path / "j.journal", 
                            [entry for unit in units for entry in unit_start(unit, STARTED, clock)])
    with journal_exporter("--journal.file", str(journal)) as exporter:
        samples = caught_up(exporter)
    failures = series(samples, "xpu_unit_engine_init_failures_total")
    assert len(failures) == 2 * 6 and set(failures.values()) == {0}
    assert {dict(labels)["reason"] for labels in failures} == {
        "kv_cache_too_small", "no_kv_cache_memory", "insufficient_free_memory", "device_out_of_memory",
        "memory_query_unsupported", "other"}
    for unit in units:
        assert sample(samples, "xpu_unit_engine_starts_total", unit=unit) == 1


def test_unwatched_units_printing_the_same_failure_do_not_count(tmp_path):
    clock = Clock(random_boot_id())
    journal = write_journal(tmp_path / "j.journal", unit_start("other-llm.service", FAILED, clock))
    with journal_exporter("--journal.file", str(journal)) as exporter:
        samples = caught_up(exporter)
    assert unit_samples(samples) == {}


def test_entries_of_another_boot_are_not_read(tmp_path):
    this_boot, other_boot = random_boot_id(), random_boot_id()
    journal = write_journal(tmp_path / "j.journal",
                            unit_start(CHAT, FAILED, Clock(other_boot)) +
                            unit_start(CHAT, STARTED, Clock(this_boot, realtime_usec=1_747_100_000_000_000)))
    with RunningExporter([*ONLY_JOURNAL, "--journal.file", str(journal), "--journal.boot", this_boot]) as exporter:
        samples = caught_up(exporter)
    assert sample(samples, "xpu_unit_engine_starts_total", unit=CHAT) == 1
    assert sample(samples, "xpu_unit_engine_init_failures_total", unit=CHAT, reason="kv_cache_too_small") == 0


def test_hostile_messages_are_survived_and_do_not_disturb_counting(tmp_path):
    clock = Clock(random_boot_id())
    hostile = [
        unit_output(CHAT, b"\xff\xfe not utf-8 \x80 ValueError: No available memory", clock.tick()),
        unit_output(CHAT, b"binary\x00MESSAGE\x01field\x02", clock.tick()),
        unit_output(CHAT, None, clock.tick()),
        unit_output(CHAT, "(EngineCore pid=1) INFO 12-02 10:00:00 [core.py:1] " + "x(" * 30_000, clock.tick()),
        unit_output(CHAT, "Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s",
                    clock.tick()),
    ]
    journal = write_journal(tmp_path / "j.journal", hostile + unit_start(CHAT, FAILED, clock))
    with journal_exporter("--journal.file", str(journal), "--journal.units", "vllm*.service",
                          "--journal.units", "nothing-matches-*.service") as exporter:
        samples = caught_up(exporter)
        assert exporter.process.poll() is None
    assert sample(samples, "xpu_unit_engine_init_failures_total", unit=CHAT, reason="kv_cache_too_small") == 1
    assert sum(series(samples, "xpu_unit_engine_init_failures_total").values()) == 1


def test_a_missing_journal_directory_is_reported_and_recovered_from(tmp_path):
    directory = tmp_path / "journal"
    with journal_exporter("--journal.directory", str(directory)) as exporter:
        samples = exporter.scrape()
        assert sample(samples, "xpu_exporter_collector_success", collector="journal") == 0
        assert exporter.process.poll() is None

        journal_directory_appears(directory)
        recovered = caught_up(exporter, timeout=20)
    assert recovered, exporter.stderr
    assert sample(recovered, "xpu_unit_engine_init_failures_total", unit=CHAT, reason="kv_cache_too_small") == 1


def test_a_journal_file_deleted_while_followed_keeps_the_counters(tmp_path):
    clock = Clock(random_boot_id())
    journal = write_journal(tmp_path / "j.journal", unit_start(CHAT, FAILED, clock))
    with journal_exporter("--journal.file", str(journal)) as exporter:
        caught_up(exporter)
        journal.unlink()
        samples = [exporter.scrape() for _ in range(3)][-1]
        assert exporter.process.poll() is None
    assert sample(samples, "xpu_unit_engine_init_failures_total", unit=CHAT, reason="kv_cache_too_small") == 1


def test_a_start_that_dies_before_vllm_prints_anything_counts_as_other(tmp_path):
    clock = Clock(random_boot_id())
    journal = write_journal(tmp_path / "j.journal", [unit_starting(CHAT, clock.tick()),
                                                     unit_process_exited(CHAT, clock.tick()),
                                                     unit_failed(CHAT, clock.tick())])
    with journal_exporter("--journal.file", str(journal)) as exporter:
        samples = caught_up(exporter)
    assert sample(samples, "xpu_unit_engine_init_failures_total", unit=CHAT, reason="other") == 1
    assert sample(samples, "xpu_unit_engine_last_failure_timestamp_seconds", unit=CHAT) is not None


def test_units_beyond_the_cap_are_dropped_and_counted(tmp_path):
    clock = Clock(random_boot_id())
    units = ["vllm-a.service", "vllm-b.service", "vllm-c.service"]
    journal = write_journal(tmp_path / "j.journal", 
                            [entry for unit in units for entry in unit_start(unit, STARTED, clock)])
    with journal_exporter("--journal.file", str(journal), "--journal.max-units", "2") as exporter:
        samples = caught_up(exporter)
    watched = {dict(labels)["unit"] for labels in series(samples, "xpu_unit_engine_starts_total")}
    assert watched == {"vllm-a.service", "vllm-b.service"}
    assert sample(samples, "xpu_exporter_journal_units_watched") == 2
    assert sample(samples, "xpu_exporter_journal_units_dropped_total") == 1


def test_units_watched_counts_the_units_matching_the_globs_and_not_the_others(tmp_path):
    clock = Clock(random_boot_id())
    entries = (unit_start("vllm-xpu-embedding.service", STARTED, clock) + unit_start(CHAT, FAILED, clock) +
               unit_start("other-llm.service", FAILED, clock) + unit_start("vllm-xpu-stt.service", STARTED, clock))
    journal = write_journal(tmp_path / "j.journal", entries)
    with journal_exporter("--journal.file", str(journal)) as exporter:
        samples = caught_up(exporter)
    assert sample(samples, "xpu_exporter_journal_units_watched") == 3


def test_globs_matching_no_unit_give_zero_watched_units_and_a_working_collector(tmp_path):
    clock = Clock(random_boot_id())
    journal = write_journal(tmp_path / "j.journal",
                            unit_start(CHAT, STARTED, clock) + unit_start("other-llm.service", FAILED, clock))
    with journal_exporter("--journal.file", str(journal), "--journal.units", "vllm-xpu-chat") as exporter:
        samples = caught_up(exporter)
    assert sample(samples, "xpu_exporter_collector_success", collector="journal") == 1
    assert sample(samples, "xpu_exporter_journal_units_watched") == 0


def test_units_watched_is_absent_while_the_journal_was_never_read(tmp_path):
    """Not 0: that would say the globs match nothing, when the exporter does not know yet."""
    directory = tmp_path / "journal"
    with journal_exporter("--journal.directory", str(directory)) as exporter:
        unreadable = exporter.scrape()
        journal_directory_appears(directory)
        recovered = caught_up(exporter, timeout=20)
    assert sample(unreadable, "xpu_exporter_collector_success", collector="journal") == 0
    assert sample(unreadable, "xpu_exporter_journal_units_watched") is None
    assert recovered, exporter.stderr
    assert sample(recovered, "xpu_exporter_journal_units_watched") == 1


def test_entries_of_units_beyond_the_cap_are_not_read(tmp_path):
    """The cap bounds the work, not only the series: a refused unit's entries are skipped by the reader."""
    boot_id = random_boot_id()
    units = [f"vllm-{index:03d}.service" for index in range(200)]
    # All started together: 200 starts one after the other would last longer than the hour after which an
    # idle unit gives its place up to a new one. The first five met keep their places.
    starts = [entry for unit in units for entry in unit_start(unit, STARTED, Clock(boot_id))]
    journal = write_journal(tmp_path / "j.journal", sorted(starts, key=lambda entry: entry.realtime_usec))
    clock = Clock(boot_id)
    with journal_exporter("--journal.file", str(journal), "--journal.max-units", "5") as exporter:
        samples = caught_up(exporter)
    watched = {dict(labels)["unit"] for labels in series(samples, "xpu_unit_engine_starts_total")}
    assert watched == set(units[:5])
    assert sample(samples, "xpu_exporter_journal_units_dropped_total") == 195
    assert sample(samples, "xpu_exporter_journal_entries_read_total") == 5 * len(unit_start(units[0], STARTED, clock))


EMBEDDING = "vllm-xpu-embedding.service"


def test_a_setting_of_4000_digits_is_ignored_and_counted_and_metrics_are_served_also_after_a_restart(tmp_path):
    clock = Clock(random_boot_id())
    attack = API + "non-default args: {'model': 'z', 'max_model_len': " + "9" * 4000 + "}"
    journal = write_journal(tmp_path / "j.journal", unit_start(CHAT, STARTED, clock) + [
        unit_starting(EMBEDDING, clock.tick()),
        unit_output(EMBEDDING, API + "vLLM API server version 0.24.0", clock.tick(), pid=31),
        unit_output(EMBEDDING, attack, clock.tick(), pid=31),
    ])
    for _ in ("first run", "restarted: the journal is read again"):
        with journal_exporter("--journal.file", str(journal)) as exporter:
            status, _, body = exporter.get("/metrics")
            assert status == 200, body
            samples = caught_up(exporter)
            stderr = exporter.stderr
        assert sample(samples, "xpu_exporter_journal_values_rejected_total") == 1
        assert sample(samples, "xpu_unit_engine_starts_total", unit=CHAT) == 1
        assert sample(samples, "xpu_unit_max_model_len_tokens", unit=CHAT) == 131072
        assert sample(samples, "xpu_unit_max_model_len_tokens", unit=EMBEDDING) is None
        assert sample(samples, "xpu_unit_engine_info", unit=EMBEDDING, vllm_version="0.24.0", model="") == 1
        assert stderr.count(f"unit {EMBEDDING} printed a 'non_default_args' line whose max_model_len") == 1
        assert "9" * 100 not in stderr


def start_printing(unit: str, clock: Clock, version: str, lines: list[str], pid: int) -> list:
    return [unit_starting(unit, clock.tick()),
            unit_output(unit, API + f"vLLM API server version {version}", clock.tick(), pid=pid),
            *(unit_output(unit, CORE + line, clock.tick(), pid=pid) for line in lines)]


ARGS = "non-default args: {'model': 'm', 'max_model_len': 131072, 'gpu_memory_utilization': 0.75}"
INIT_DONE = "init engine (profile, create kv cache, warmup model) took 10.00 seconds"
# unit: (vLLM version, what its start printed after the version line); one absurd line in each
ABSURD_STARTS = {
    # XPU V1 0.9.2-0.15.1: KV bytes come from the profiling lines x the utilisation
    "vllm-inf-utilisation.service": ("0.10.2", [
        "non-default args: {'model': 'm', 'gpu_memory_utilization': 1e999}",
        "Before memory profiling run, total GPU memory: 24480.00 MB, model load takes 8204.13 MB, free gpu memory "
        "is 16147.87 MB.",
        "After memory profiling run, peak memory usage is 9013.40 MB,torch mem is 8204.13 MB, non-torch mem is "
        "128.00 MB, free gpu memory is 15338.60 MB.",
        INIT_DONE]),
    "vllm-negative-utilisation.service": ("0.24.0", [
        "non-default args: {'model': 'm', 'gpu_memory_utilization': -0.5}",
        "Available KV cache memory: 3.25 GiB", INIT_DONE]),
    "vllm-negative-kv.service": ("0.24.0", [ARGS, "Available KV cache memory: -999999999999999 GiB", INIT_DONE]),
    "vllm-absurd-required.service": ("0.24.0", [
        ARGS, "ValueError: To serve at least one request with the model's max seq len (131072), (999999999999999 "
              "GiB KV cache is needed, which is larger than the available KV cache memory (2.13 GiB).",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"]),
    "vllm-negative-duration.service": ("0.24.0", [
        ARGS, "Available KV cache memory: 3.25 GiB",
        "init engine (profile, create kv cache, warmup model) took -5.00 seconds"]),
}


def test_absurd_values_are_ignored_and_counted_and_cost_no_other_series(tmp_path):
    clock = Clock(random_boot_id())
    entries = unit_start(CHAT, STARTED, clock)
    for pid, (unit, (version, lines)) in enumerate(ABSURD_STARTS.items(), start=100):
        entries += start_printing(unit, clock, version, lines, pid)
    journal = write_journal(tmp_path / "j.journal", entries)
    with journal_exporter("--journal.file", str(journal)) as exporter:
        samples = caught_up(exporter)
    assert samples, "the journal collector failed"
    assert sample(samples, "xpu_exporter_journal_values_rejected_total") == len(ABSURD_STARTS)
    # the good unit: every series as printed
    assert sample(samples, "xpu_unit_gpu_memory_utilization_ratio", unit=CHAT) == 0.75
    assert sample(samples, "xpu_unit_kv_cache_bytes", unit=CHAT) == round(3.25 * 2**30)
    assert sample(samples, "xpu_unit_engine_init_duration_seconds", unit=CHAT) == 42.5
    # each absurd line is ignored, as if vLLM had not printed it
    assert sample(samples, "xpu_unit_gpu_memory_utilization_ratio", unit="vllm-inf-utilisation.service") == 0.9
    assert sample(samples, "xpu_unit_kv_cache_bytes", unit="vllm-inf-utilisation.service") == \
        round(round(24480.00 * 2**20) * 0.9 - round(9013.40 * 2**20))
    assert sample(samples, "xpu_unit_gpu_memory_utilization_ratio", unit="vllm-negative-utilisation.service") == 0.92
    assert sample(samples, "xpu_unit_kv_cache_bytes", unit="vllm-negative-kv.service") is None
    assert sample(samples, "xpu_unit_kv_cache_required_bytes", unit="vllm-absurd-required.service") is None
    assert sample(samples, "xpu_unit_engine_init_failures_total", unit="vllm-absurd-required.service",
                  reason="other") == 1
    assert sample(samples, "xpu_unit_engine_init_duration_seconds", unit="vllm-negative-duration.service") is None
    for (name, labels), value in samples.items():
        if name.startswith("xpu_unit_"):
            assert abs(value) <= 2**50, (name, labels, value)
        if name in ("xpu_unit_engine_init_duration_seconds", "xpu_unit_gpu_memory_utilization_ratio"):
            assert value >= 0, (name, labels, value)
