"""The exporter as a real process over the real Level Zero loader and the fake driver, scraped over HTTP."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from exporterproc import RunningExporter
from fakeze import A770, B580, FakeConfig, FakeMemoryModule, fake_driver_env, write_config
from polling import wait_for
from scrapes import sample
from sizes import GiB

GOLDEN = Path(__file__).parent / "golden"
_DURATION_SAMPLE = re.compile(r"^(xpu_exporter_collector_duration_seconds\{[^}]*\}) \S+$", re.M)
_PROCESS_AND_PYTHON_LINE = re.compile(r"^(?:# (?:HELP|TYPE) )?(?:process|python)_.*\n", re.M)
DEVICE_FAMILIES = ("xpu_device_info", "xpu_memory_total_bytes", "xpu_memory_free_bytes", "xpu_memory_used_bytes",
                   "xpu_memory_accounting_trusted")
IDENTITY_AND_TOTAL = {"xpu_device_info", "xpu_memory_total_bytes"}


def start(fake_driver: Path, config_path: Path, config: FakeConfig, *args: str, env: dict | None = None,
          listen: str = "127.0.0.1:0") -> RunningExporter:
    write_config(config_path, config)
    return RunningExporter(["--no-collector.journal", "--no-collector.processes", *args],
                           env={**fake_driver_env(fake_driver, config_path), **(env or {})}, listen=listen)


def normalised(text: str) -> str:
    """Scrape text for golden comparison: durations pinned, client_python's process_* and python_* families
    dropped (they vary run to run and by Python; tests/test_exporter_self_metrics.py checks them)."""
    return _DURATION_SAMPLE.sub(r"\1 0.0", _PROCESS_AND_PYTHON_LINE.sub("", text))


def check_golden(name: str, text: str, update: bool) -> None:
    path = GOLDEN / f"{name}.prom"
    if update:
        path.parent.mkdir(exist_ok=True)
        path.write_text(normalised(text))
    assert normalised(text) == path.read_text(), f"scrape differs from {path} (regenerate with --update-golden)"


def device_series(samples: dict, device: str) -> list:
    return [key for key in samples if ("device", device) in key[1]]


def device_families(samples: dict, device: str) -> set[str]:
    return {name for name, _ in device_series(samples, device)}


def warning_lines(exporter: RunningExporter) -> list[str]:
    return [line for line in exporter.stderr.splitlines() if "level=warn" in line or "level=error" in line]


def test_two_devices_scrape_returns_exactly_the_contract_device_metrics(fake_driver, config_path, update_golden):
    with start(fake_driver, config_path, FakeConfig(devices=(A770, B580))) as exporter:
        text = exporter.scrape_text()
        samples = exporter.scrape()
    check_golden("two_devices", text, update_golden)
    assert sample(samples, "xpu_memory_total_bytes", device="0000:03:00.0") == 16 * GiB
    assert sample(samples, "xpu_memory_used_bytes", device="0000:03:00.0") == 3 * GiB
    assert sample(samples, "xpu_memory_free_bytes", device="0000:03:00.0") == 13 * GiB
    assert sample(samples, "xpu_memory_total_bytes", device="0000:83:00.0") == 12 * GiB
    assert sample(samples, "xpu_memory_used_bytes", device="0000:83:00.0") == 1 * GiB
    assert sample(samples, "xpu_memory_free_bytes", device="0000:83:00.0") == 11 * GiB
    assert sample(samples, "xpu_memory_accounting_trusted", device="0000:03:00.0") == 1
    assert sample(samples, "xpu_device_info", device="0000:03:00.0", name="Intel(R) Arc(TM) A770 Graphics",
                  uuid="10111213-1415-1617-1819-1a1b1c1d1e1f", driver_version="1.3.24595", card="",
                  render_node="") == 1
    assert sample(samples, "xpu_exporter_collector_success", collector="levelzero") == 1
    assert {name for name, _ in samples if name.startswith("xpu_") and not name.startswith("xpu_exporter_")} == \
        set(DEVICE_FAMILIES)


def test_system_memory_modules_are_not_counted_as_device_memory(fake_driver, config_path):
    device = dataclasses.replace(A770, memory=(*A770.memory, FakeMemoryModule(size=64 * GiB, free=60 * GiB,
                                                                              device_local=False)))
    with start(fake_driver, config_path, FakeConfig(devices=(device,))) as exporter:
        samples = exporter.scrape()
    assert sample(samples, "xpu_memory_total_bytes", device="0000:03:00.0") == 16 * GiB
    assert sample(samples, "xpu_memory_used_bytes", device="0000:03:00.0") == 3 * GiB


def test_memory_is_summed_over_a_devices_local_modules(fake_driver, config_path):
    two_tiles = dataclasses.replace(A770, memory=(FakeMemoryModule(size=8 * GiB, free=7 * GiB),
                                                  FakeMemoryModule(size=8 * GiB, free=5 * GiB)))
    with start(fake_driver, config_path, FakeConfig(devices=(two_tiles,))) as exporter:
        samples = exporter.scrape()
    assert sample(samples, "xpu_memory_total_bytes", device="0000:03:00.0") == 16 * GiB
    assert sample(samples, "xpu_memory_free_bytes", device="0000:03:00.0") == 12 * GiB
    assert sample(samples, "xpu_memory_used_bytes", device="0000:03:00.0") == 4 * GiB


def test_zero_devices_is_a_working_collector_with_no_device_series(fake_driver, config_path, update_golden):
    with start(fake_driver, config_path, FakeConfig(devices=())) as exporter:
        text = exporter.scrape_text()
    check_golden("no_devices", text, update_golden)
    assert 'xpu_exporter_collector_success{collector="levelzero"} 1.0' in text
    assert "xpu_device_info{" not in text


def test_free_equal_to_total_marks_accounting_untrusted_and_warns_once_naming_cap_perfmon(fake_driver, config_path):
    blind = dataclasses.replace(A770, memory=(FakeMemoryModule(size=16 * GiB, free=16 * GiB),))
    with start(fake_driver, config_path, FakeConfig(devices=(blind, B580))) as exporter:
        for _ in range(3):
            samples = exporter.scrape()
        warnings = warning_lines(exporter)
    assert sample(samples, "xpu_memory_accounting_trusted", device="0000:03:00.0") == 0
    assert sample(samples, "xpu_memory_accounting_trusted", device="0000:83:00.0") == 1
    assert len(warnings) == 1 and "CAP_PERFMON" in warnings[0] and "0000:03:00.0" in warnings[0]


@pytest.mark.parametrize("scenario, env, args, expected", [
    ("no_driver", {"ZE_ENABLE_ALT_DRIVERS": "/nonexistent/libze_missing.so"}, (), "ZE_RESULT_ERROR_UNINITIALIZED"),
    ("loader_missing", {}, ("--levelzero.library", "/nonexistent/libze_loader.so.1"), "cannot load"),
])
def test_without_a_usable_driver_the_exporter_serves_and_says_so(fake_driver, config_path, update_golden, scenario,
                                                                 env, args, expected):
    with start(fake_driver, config_path, FakeConfig(devices=(A770,)), *args, env=env) as exporter:
        texts = [exporter.scrape_text() for _ in range(3)]
        assert exporter.process.poll() is None
        warnings = warning_lines(exporter)
    check_golden(scenario, texts[-1], update_golden)
    for text in texts:
        assert 'xpu_exporter_collector_success{collector="levelzero"} 0.0' in text
        assert "xpu_memory_free_bytes{" not in text
    assert len(warnings) == 1, warnings
    assert expected in warnings[0]


@pytest.mark.parametrize("init_result", ["ZE_RESULT_ERROR_UNINITIALIZED", "ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS",
                                         "ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE"])
def test_failing_zeinit_never_crashes_and_logs_one_clear_line(fake_driver, config_path, init_result):
    with start(fake_driver, config_path, FakeConfig(devices=(A770,), init_result=init_result)) as exporter:
        for _ in range(3):
            samples = exporter.scrape()
            assert sample(samples, "xpu_exporter_collector_success", collector="levelzero") == 0
        assert exporter.process.poll() is None
        warnings = warning_lines(exporter)
    assert len(warnings) == 1, warnings
    assert init_result in warnings[0] and "Level Zero initialisation failed" in warnings[0]


def test_device_lost_mid_run_drops_that_devices_memory_state_series_and_they_come_back(fake_driver, config_path):
    with start(fake_driver, config_path, FakeConfig(devices=(A770, B580))) as exporter:
        before = exporter.scrape()
        assert sample(before, "xpu_exporter_collector_success", collector="levelzero") == 1

        lost = dataclasses.replace(A770, memory_state_result="ZE_RESULT_ERROR_DEVICE_LOST")
        write_config(config_path, FakeConfig(devices=(lost, B580)))
        during = exporter.scrape()
        assert sample(during, "xpu_exporter_collector_success", collector="levelzero") == 0
        assert device_families(during, "0000:03:00.0") == IDENTITY_AND_TOTAL
        assert sample(during, "xpu_memory_free_bytes", device="0000:83:00.0") == 11 * GiB

        write_config(config_path, FakeConfig(devices=(A770, B580)))
        after = wait_for(lambda: (s := exporter.scrape()) and
                         sample(s, "xpu_exporter_collector_success", collector="levelzero") == 1 and s)
        assert exporter.process.poll() is None
    assert sample(after, "xpu_memory_free_bytes", device="0000:03:00.0") == 13 * GiB
    assert sorted(device_series(after, "0000:03:00.0")) == sorted(device_series(before, "0000:03:00.0"))


@pytest.mark.parametrize("fault, kept", [
    ({"memory_state_result": "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE"}, IDENTITY_AND_TOTAL),
    ({"memory_modules_result": "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE"}, {"xpu_device_info"}),
], ids=["zesMemoryGetState", "zesDeviceEnumMemoryModules"])
def test_failing_memory_query_keeps_the_devices_identity_and_what_still_reads_then_recovers(fake_driver, config_path,
                                                                                          fault, kept):
    failing = dataclasses.replace(B580, **fault)
    with start(fake_driver, config_path, FakeConfig(devices=(A770, failing))) as exporter:
        during = exporter.scrape()
        stderr = exporter.stderr
        write_config(config_path, FakeConfig(devices=(A770, B580)))
        after = exporter.scrape()
    assert sample(during, "xpu_exporter_collector_success", collector="levelzero") == 0
    assert "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE" in stderr and "0000:83:00.0" in stderr
    assert device_families(during, "0000:83:00.0") == kept
    assert sample(during, "xpu_device_info", device="0000:83:00.0", name="Intel(R) Arc(TM) B580 Graphics",
                  uuid="86800be2-0000-0000-8300-000000000000", driver_version="1.6.32224", card="",
                  render_node="") == 1
    if "xpu_memory_total_bytes" in kept:
        assert sample(during, "xpu_memory_total_bytes", device="0000:83:00.0") == 12 * GiB
    assert device_families(during, "0000:03:00.0") == set(DEVICE_FAMILIES)
    assert sample(during, "xpu_memory_used_bytes", device="0000:03:00.0") == 3 * GiB

    assert sample(after, "xpu_exporter_collector_success", collector="levelzero") == 1
    assert device_families(after, "0000:83:00.0") == set(DEVICE_FAMILIES)
    assert sample(after, "xpu_memory_free_bytes", device="0000:83:00.0") == 11 * GiB
    assert sample(after, "xpu_memory_accounting_trusted", device="0000:83:00.0") == 1


def test_a_hanging_driver_call_costs_one_timeout_not_the_exporter(fake_driver, config_path):
    hanging = dataclasses.replace(A770, memory_state_hang=True)
    with start(fake_driver, config_path, FakeConfig(devices=(hanging,)), "--levelzero.timeout", "1s") as exporter:
        exporter.scrape()  # the child starts and its first read hangs
        started = time.monotonic()
        status, _, body = exporter.get("/metrics", timeout=10)
        answered_in = time.monotonic() - started
        assert status == 200
        assert b'xpu_exporter_collector_success{collector="levelzero"} 0.0' in body
        assert answered_in < 5, "a scrape during a hang must be bounded by --levelzero.timeout"

        write_config(config_path, FakeConfig(devices=(A770,)))
        recovered = wait_for(lambda: sample(exporter.scrape(), "xpu_memory_used_bytes", device="0000:03:00.0"),
                             timeout=15)
        assert exporter.process.poll() is None
    assert recovered == 3 * GiB


def test_concurrent_scrapes_all_get_the_same_complete_answer(fake_driver, config_path):
    with start(fake_driver, config_path, FakeConfig(devices=(A770, B580))) as exporter:
        with ThreadPoolExecutor(max_workers=20) as pool:
            results = list(pool.map(lambda _: exporter.scrape(), range(40)))
    for samples in results:
        assert sample(samples, "xpu_exporter_collector_success", collector="levelzero") == 1
        assert sample(samples, "xpu_memory_used_bytes", device="0000:83:00.0") == 1 * GiB


def test_openmetrics_is_served_when_the_scraper_asks_for_it(fake_driver, config_path):
    with start(fake_driver, config_path, FakeConfig(devices=(A770,))) as exporter:
        status, headers, body = exporter.get("/metrics", headers={
            "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"})
        plain_status, plain_headers, _ = exporter.get("/metrics")
        landing_status, _, landing = exporter.get("/")
        missing_status, _, _ = exporter.get("/nothing-here")
    assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")
    assert plain_status == 200 and plain_headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert landing_status == 200 and b'href="/metrics"' in landing
    assert missing_status == 404


def test_serves_on_an_ipv6_listen_address(fake_driver, config_path):
    with start(fake_driver, config_path, FakeConfig(devices=(A770,)), listen="[::1]:0") as exporter:
        assert exporter.base_url.startswith("http://[::1]:")
        samples = exporter.scrape()
    assert sample(samples, "xpu_memory_used_bytes", device="0000:03:00.0") == 3 * GiB


def test_sigterm_stops_the_exporter_cleanly(fake_driver, config_path):
    exporter = start(fake_driver, config_path, FakeConfig(devices=(A770,)))
    exporter.scrape()
    assert exporter.stop(timeout=5) == 0


@pytest.mark.parametrize("golden", sorted(p.name for p in GOLDEN.glob("*.prom")))
def test_golden_files_pass_promtool_check_metrics(golden):
    result = subprocess.run(["promtool", "check", "metrics"], input=(GOLDEN / golden).read_bytes(),
                            capture_output=True)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()

