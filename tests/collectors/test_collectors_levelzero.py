"""The exporter as a real process over the real Level Zero loader and the fake driver, scraped over HTTP."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from exporterproc import RunningExporter
from fakeze import (A770, A770_TELEMETRY, B580, B580_TELEMETRY, TELEMETRY_KINDS, FakeConfig, FakeEngine,
                    FakeMemoryModule, fake_driver_env, write_config)
from polling import wait_for
from scrapes import golden_text, sample
from sizes import GiB


GOLDEN = Path(__file__).resolve().parents[1] / "golden"
# The contract's device metrics, and the core API's total added to them (its usable memory only where listed).
DEVICE_FAMILIES = ("xpu_device_info", "xpu_memory_total_bytes", "xpu_memory_free_bytes", "xpu_memory_used_bytes",
                   "xpu_memory_accounting_trusted", "xpu_memory_health", "xpu_memory_core_total_bytes")
# The contract's "Device telemetry" section, by the fake driver's kind that serves each metric.
TELEMETRY_FAMILIES_BY_KIND = {
    "engines": {"xpu_engine_active_seconds_total"},
    "power": {"xpu_energy_joules_total"},
    "temperature": {"xpu_temperature_celsius"},
    "frequency": {"xpu_frequency_hertz", "xpu_frequency_throttled"},
    "memory_bandwidth": {"xpu_memory_read_bytes_total", "xpu_memory_write_bytes_total"},
    "ras": {"xpu_ras_errors_total"},
}
TELEMETRY_FAMILIES = set().union(*TELEMETRY_FAMILIES_BY_KIND.values())
IDENTITY_AND_TOTAL = {"xpu_device_info", "xpu_memory_total_bytes", "xpu_memory_core_total_bytes"}  # the core API's reads without Sysman


def start(fake_driver: Path, config_path: Path, config: FakeConfig, *args: str, env: dict | None = None,
          listen: str = "127.0.0.1:0") -> RunningExporter:
    write_config(config_path, config)
    return RunningExporter(["--no-collector.journal", "--no-collector.processes", *args],
                           env={**fake_driver_env(fake_driver, config_path), **(env or {})}, listen=listen)


def check_golden(name: str, text: str, update: bool) -> None:
    path = GOLDEN / f"{name}.prom"
    if update:
        path.parent.mkdir(exist_ok=True)
        path.write_text(golden_text(text))
    assert golden_text(text) == path.read_text(), f"scrape differs from {path} (regenerate with --update-golden)"


def device_series(samples: dict, device: str) -> list:
    return [key for key in samples if ("device", device) in key[1]]


def device_families(samples: dict, device: str) -> set[str]:
    return {name for name, _ in device_series(samples, device)}


def warning_lines(exporter: RunningExporter) -> list[str]:
    return [line for line in exporter.stderr.splitlines() if "level=warn" in line or "level=error" in line]


def info_lines(exporter: RunningExporter, containing: str) -> list[str]:
    return [line for line in exporter.stderr.splitlines() if "level=info" in line and containing in line]


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


A770_PCI, B580_PCI = "0000:03:00.0", "0000:83:00.0"
SEVERITIES = ("correctable", "uncorrectable")
CATEGORIES = ("reset", "programming", "driver", "compute", "non_compute", "cache", "display")
REASONS = ("average_power", "burst_power", "current", "thermal", "psu", "software_range", "hardware_range")
HEALTH_STATES = ("ok", "degraded", "critical", "replace", "unknown")


def assert_configured_telemetry(samples: dict) -> None:
    """Every telemetry metric of A770_TELEMETRY (A770_PCI) and B580_TELEMETRY (B580_PCI) has the values the
    fake driver was configured with, in base units."""
    engines = {"all": (90, 30), "compute": (80, 25), "render": (5, 1), "media": (2, 3), "copy": (12.5, 4),
               "3d": (0.25, 0.1), "3d_render_compute": (85, 26)}
    for engine, expected in engines.items():
        assert (sample(samples, "xpu_engine_active_seconds_total", device=A770_PCI, engine=engine),
                sample(samples, "xpu_engine_active_seconds_total", device=B580_PCI, engine=engine)) == expected
    assert len([key for key in samples if key[0] == "xpu_engine_active_seconds_total"]) == 14, \
        "the single compute engine group of A770 is not an engine label"
    assert sample(samples, "xpu_energy_joules_total", device=A770_PCI) == 1500, "the card's domain"
    assert sample(samples, "xpu_energy_joules_total", device=B580_PCI) == 800, "no card domain: the package's"
    for sensor, expected in {"global": (71.5, 55.0), "gpu": (68.0, 52.5), "memory": (74.0, 58.0)}.items():
        assert (sample(samples, "xpu_temperature_celsius", device=A770_PCI, sensor=sensor),
                sample(samples, "xpu_temperature_celsius", device=B580_PCI, sensor=sensor)) == expected
    assert len([key for key in samples if key[0] == "xpu_temperature_celsius"]) == 6, "no minimum sensors"
    for domain, expected in {"gpu": (2.1e9, 2.85e9), "memory": (1.093e9, 2.375e9), "media": (1.05e9, 1.4e9)}.items():
        assert (sample(samples, "xpu_frequency_hertz", device=A770_PCI, domain=domain),
                sample(samples, "xpu_frequency_hertz", device=B580_PCI, domain=domain)) == expected
    throttled = {(device, domain, reason): sample(samples, "xpu_frequency_throttled", device=device, domain=domain,
                                                  reason=reason)
                 for device in (A770_PCI, B580_PCI) for domain in ("gpu", "memory", "media") for reason in REASONS}
    assert {key for key, value in throttled.items() if value == 1} == {
        (A770_PCI, "gpu", "average_power"), (A770_PCI, "gpu", "thermal"),
        (B580_PCI, "memory", "software_range"), (B580_PCI, "memory", "hardware_range")}
    assert set(throttled.values()) == {0, 1}
    assert sample(samples, "xpu_memory_read_bytes_total", device=A770_PCI) == 7e9
    assert sample(samples, "xpu_memory_write_bytes_total", device=A770_PCI) == 3e9
    assert sample(samples, "xpu_memory_read_bytes_total", device=B580_PCI) == 1e9
    assert sample(samples, "xpu_memory_write_bytes_total", device=B580_PCI) == 5e8
    for device in (A770_PCI, B580_PCI):
        assert {state: sample(samples, "xpu_memory_health", device=device, state=state) for state in HEALTH_STATES} \
            == {"ok": 1, "degraded": 0, "critical": 0, "replace": 0, "unknown": 0}
    ras = {(device, severity, category): sample(samples, "xpu_ras_errors_total", device=device, severity=severity,
                                                category=category)
           for device in (A770_PCI, B580_PCI) for severity in SEVERITIES for category in CATEGORIES}
    assert {key: value for key, value in ras.items() if value} == {
        (A770_PCI, "correctable", "driver"): 1, (A770_PCI, "correctable", "compute"): 5,
        (A770_PCI, "correctable", "cache"): 2, (A770_PCI, "uncorrectable", "reset"): 1,
        (B580_PCI, "correctable", "programming"): 3, (B580_PCI, "correctable", "non_compute"): 1}


def test_every_telemetry_metric_of_two_devices_has_the_drivers_values_in_base_units(fake_driver, config_path,
                                                                                   update_golden):
    with start(fake_driver, config_path, FakeConfig(devices=(A770_TELEMETRY, B580_TELEMETRY))) as exporter:
        text = exporter.scrape_text()
        samples = exporter.scrape()
        stderr = exporter.stderr
    check_golden("telemetry_two_devices", text, update_golden)
    assert sample(samples, "xpu_exporter_collector_success", collector="levelzero") == 1
    for device in (A770_PCI, B580_PCI):
        assert device_families(samples, device) == set(DEVICE_FAMILIES) | TELEMETRY_FAMILIES

    assert_configured_telemetry(samples)
    assert "level=info" not in stderr.split("listening on", 1)[1], "nothing unavailable to log"


def without(device, kind: str, result: str, enumeration: bool = False):
    """The device with the kind's reading (or enumeration) answering `result`."""
    if kind == "memory_bandwidth":
        return dataclasses.replace(device, memory_bandwidth_result=result)
    field = "telemetry_enum_results" if enumeration else "telemetry_results"
    return dataclasses.replace(device, **{field: {kind: result}})


@pytest.mark.parametrize("kind", [*TELEMETRY_KINDS, "memory_bandwidth"])
def test_an_unsupported_kind_is_absent_logged_once_and_the_collector_still_succeeds(fake_driver, config_path, kind):
    unsupported = without(B580_TELEMETRY, kind, "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE")
    with start(fake_driver, config_path, FakeConfig(devices=(A770_TELEMETRY, unsupported))) as exporter:
        scrapes = [exporter.scrape() for _ in range(3)]
        logged = info_lines(exporter, "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE")
        warnings = warning_lines(exporter)
    for samples in scrapes:
        assert sample(samples, "xpu_exporter_collector_success", collector="levelzero") == 1
        assert device_families(samples, B580_PCI) == set(DEVICE_FAMILIES) | TELEMETRY_FAMILIES - \
            TELEMETRY_FAMILIES_BY_KIND[kind]
        assert device_families(samples, A770_PCI) == set(DEVICE_FAMILIES) | TELEMETRY_FAMILIES
    assert len(logged) == 1 and B580_PCI in logged[0], logged
    assert all(name in logged[0] for name in TELEMETRY_FAMILIES_BY_KIND[kind])
    assert "does not have them" in logged[0]
    assert warnings == []


@pytest.mark.parametrize("enumeration", [False, True], ids=["zesRasGetState", "zesDeviceEnumRasErrorSets"])
def test_ras_without_permission_is_absent_and_says_root_would_read_it(fake_driver, config_path, enumeration):
    forbidden = without(A770_TELEMETRY, "ras", "ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS", enumeration)
    with start(fake_driver, config_path, FakeConfig(devices=(forbidden, B580_TELEMETRY))) as exporter:
        scrapes = [exporter.scrape() for _ in range(3)]
        logged = info_lines(exporter, "xpu_ras_errors_total")
    for samples in scrapes:
        assert sample(samples, "xpu_exporter_collector_success", collector="levelzero") == 1
        assert "xpu_ras_errors_total" not in device_families(samples, A770_PCI)
        assert sample(samples, "xpu_ras_errors_total", device=B580_PCI, severity="correctable",
                      category="programming") == 3
        assert sample(samples, "xpu_engine_active_seconds_total", device=A770_PCI, engine="compute") == 80
    assert len(logged) == 1, logged
    function = "zesDeviceEnumRasErrorSets" if enumeration else "zesRasGetState"
    assert f"{function}: ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS" in logged[0]
    assert "needs root" in logged[0] and A770_PCI in logged[0]


def test_any_other_telemetry_error_fails_the_collector_and_costs_only_that_kind(fake_driver, config_path):
    broken = without(B580_TELEMETRY, "temperature", "ZE_RESULT_ERROR_UNKNOWN")
    with start(fake_driver, config_path, FakeConfig(devices=(A770_TELEMETRY, broken))) as exporter:
        samples = exporter.scrape()
        stderr = exporter.stderr
    assert sample(samples, "xpu_exporter_collector_success", collector="levelzero") == 0
    assert device_families(samples, B580_PCI) == set(DEVICE_FAMILIES) | TELEMETRY_FAMILIES - \
        {"xpu_temperature_celsius"}
    assert "zesTemperatureGetState: ZE_RESULT_ERROR_UNKNOWN" in stderr and B580_PCI in stderr


def test_a_failing_memory_state_drops_memory_health_and_fails_the_collector(fake_driver, config_path):
    failing = dataclasses.replace(B580_TELEMETRY, memory_state_result="ZE_RESULT_ERROR_UNSUPPORTED_FEATURE")
    with start(fake_driver, config_path, FakeConfig(devices=(A770_TELEMETRY, failing))) as exporter:
        samples = exporter.scrape()
    assert sample(samples, "xpu_exporter_collector_success", collector="levelzero") == 0
    assert "xpu_memory_health" not in device_families(samples, B580_PCI)
    assert sample(samples, "xpu_memory_read_bytes_total", device=B580_PCI) == 1e9, "bandwidth reads without the state"
    assert sample(samples, "xpu_memory_health", device=A770_PCI, state="ok") == 1


def test_memory_health_is_the_worst_state_of_the_devices_local_modules(fake_driver, config_path):
    degraded = dataclasses.replace(A770, memory=(FakeMemoryModule(size=8 * GiB, free=7 * GiB),
                                                 FakeMemoryModule(size=8 * GiB, free=6 * GiB, health=3),
                                                 FakeMemoryModule(64 * GiB, 60 * GiB, device_local=False, health=4)))
    with start(fake_driver, config_path, FakeConfig(devices=(degraded,))) as exporter:
        samples = exporter.scrape()
    assert {state: sample(samples, "xpu_memory_health", device=A770_PCI, state=state) for state in HEALTH_STATES} \
        == {"ok": 0, "degraded": 0, "critical": 1, "replace": 0, "unknown": 0}


def test_all_zero_memory_bandwidth_counters_are_not_served_and_logged_once(fake_driver, config_path):
    # level-zero#440: on Arc zesMemoryGetBandwidth succeeds with every counter and maxBandwidth 0.
    zeros = dataclasses.replace(A770_TELEMETRY, memory=(FakeMemoryModule(size=16 * GiB, free=13 * GiB,
                                                                         bandwidth=(0, 0, 0)),))
    with start(fake_driver, config_path, FakeConfig(devices=(zeros,))) as exporter:
        scrapes = [exporter.scrape() for _ in range(3)]
        logged = info_lines(exporter, "level-zero#440")
    for samples in scrapes:
        assert sample(samples, "xpu_exporter_collector_success", collector="levelzero") == 1
        assert not {"xpu_memory_read_bytes_total", "xpu_memory_write_bytes_total"} & device_families(samples, A770_PCI)
    assert len(logged) == 1


def test_engine_groups_only_on_sub_devices_are_summed_for_the_device(fake_driver, config_path):
    two_tiles = dataclasses.replace(A770, engines=(FakeEngine(1, 3_000_000, subdevice=0),
                                                   FakeEngine(1, 4_500_000, subdevice=1),
                                                   FakeEngine(0, 9_000_000), FakeEngine(0, 1_000_000, subdevice=0)))
    with start(fake_driver, config_path, FakeConfig(devices=(two_tiles,))) as exporter:
        samples = exporter.scrape()
    assert sample(samples, "xpu_engine_active_seconds_total", device=A770_PCI, engine="compute") == 7.5
    assert sample(samples, "xpu_engine_active_seconds_total", device=A770_PCI, engine="all") == 9, \
        "the device's own group, not its tiles'"


def test_telemetry_is_enumerated_once_per_init_and_read_at_every_scrape(fake_driver, config_path):
    with start(fake_driver, config_path, FakeConfig(devices=(A770_TELEMETRY,))) as exporter:
        first = exporter.scrape()
        # Enumerating again would now fail; reading gives the new values.
        busier = dataclasses.replace(
            A770_TELEMETRY, telemetry_enum_results={kind: "ZE_RESULT_ERROR_UNKNOWN" for kind in TELEMETRY_KINDS},
            engines=tuple(dataclasses.replace(engine, active_us=engine.active_us * 2)
                          for engine in A770_TELEMETRY.engines))
        write_config(config_path, FakeConfig(devices=(busier,)))
        second = exporter.scrape()
    assert sample(first, "xpu_engine_active_seconds_total", device=A770_PCI, engine="compute") == 80
    assert sample(second, "xpu_exporter_collector_success", collector="levelzero") == 1
    assert sample(second, "xpu_engine_active_seconds_total", device=A770_PCI, engine="compute") == 160, \
        "read at every scrape"
    assert device_families(second, A770_PCI) == device_families(first, A770_PCI)


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


def test_a_scrape_while_level_zero_initialises_has_no_data_yet_and_logs_no_warning(fake_driver, config_path):
    # Every start goes through this: the first scrape can come before zeInit returns (here it never does).
    with start(fake_driver, config_path, FakeConfig(devices=(A770,), init_hang=True),
               "--levelzero.timeout", "1s") as exporter:
        samples = exporter.scrape()
        assert sample(samples, "xpu_exporter_collector_success", collector="levelzero") == 0
        assert not device_families(samples, "0000:03:00.0")
        assert warning_lines(exporter) == []
        assert info_lines(exporter, "collector levelzero has no data yet: Level Zero is still initialising")


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
    ({"memory_modules_result": "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE"}, {"xpu_device_info", "xpu_memory_core_total_bytes"}),
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



# --- the two totals, and the usable-memory core extension ------------------------------------------

def test_the_core_total_is_served_apart_from_sysmans_and_is_the_drivers_smaller_figure(fake_driver, config_path):
    with start(fake_driver, config_path, FakeConfig(devices=(A770, B580))) as exporter:
        samples = exporter.scrape()
    for pci, size in ((A770_PCI, 16 * GiB), (B580_PCI, 12 * GiB)):
        assert sample(samples, "xpu_memory_total_bytes", device=pci) == size
        assert sample(samples, "xpu_memory_core_total_bytes", device=pci) == size * 95 // 100
    assert "xpu_memory_usable_bytes" not in device_families(samples, A770_PCI), "the driver lists no extension"


def test_with_sysmans_memory_state_refused_the_usable_memory_extension_still_gives_free_memory(
        fake_driver, config_path):
    """Without CAP_PERFMON (zesMemoryGetState refused here), the core API's extension still answers: free memory
    where the driver lists it, the core total always."""
    refused = dataclasses.replace(A770, memory_state_result="ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS",
                                  usable_memory=11 * GiB)
    with start(fake_driver, config_path, FakeConfig(devices=(refused, B580), usable_memory_extension=True)) \
            as exporter:
        samples = exporter.scrape()
    assert sample(samples, "xpu_memory_free_bytes", device=A770_PCI) is None
    assert sample(samples, "xpu_memory_usable_bytes", device=A770_PCI) == 11 * GiB
    assert sample(samples, "xpu_memory_core_total_bytes", device=A770_PCI) == 16 * GiB * 95 // 100
    # B580 answers both: its usable memory is Sysman's free less what the core API keeps back
    assert sample(samples, "xpu_memory_usable_bytes", device=B580_PCI) == \
        sample(samples, "xpu_memory_free_bytes", device=B580_PCI) - (12 * GiB - 12 * GiB * 95 // 100)
