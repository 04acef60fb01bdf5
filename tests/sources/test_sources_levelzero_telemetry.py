"""The telemetry kinds' rows (exporter/sources/levelzero/telemetry.py): the samples each makes of a device's
readings, pure; what the child reads of each kind is tested through the worker (test_sources_levelzero_worker.py),
and the families served through the exporter (test_collectors_levelzero.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_xpu_exporter.sources.levelzero.binding import (EngineActivity, Frequency, MemoryBandwidth, RasErrors,
                                                         Temperature)
from vllm_xpu_exporter.sources.levelzero.telemetry import KINDS

pytestmark = pytest.mark.fast  # the pure core (pyproject.toml's markers; `pytest -m fast`)

METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def served(kind: str, *values: object) -> dict[tuple[str, tuple[str, ...]], float]:
    """The samples the kind's row makes of these readings: {(family name, label values after device): value}."""
    [row] = [row for row in KINDS if row.name == kind]
    return {(row.families[index].name, labels): value for index, labels, value in row.samples(values)}


def test_a_kind_on_the_device_itself_stands_else_its_sub_devices_are_combined():
    engines = served("engines", EngineActivity(1, True, 0, 3, 0), EngineActivity(1, True, 1, 4, 0),
                     EngineActivity(0, False, 0, 9, 0), EngineActivity(0, True, 0, 1, 0))
    assert engines == {("xpu_engine_active_seconds_total", ("all",)): 9 / 1e6,
                       ("xpu_engine_active_seconds_total", ("compute",)): 7 / 1e6}, \
        "tiles' counters summed; the device's own group wins"
    temperatures = served("temperatures", Temperature(1, True, 0, 60.0), Temperature(1, True, 1, 65.5),
                          Temperature(0, False, 0, 50.0), Temperature(0, True, 1, 70.0))
    assert temperatures == {("xpu_temperature_celsius", ("global",)): 50.0,
                            ("xpu_temperature_celsius", ("gpu",)): 65.5}, \
        "the hottest tile; the device's own sensor wins"
    frequencies = served("frequencies", Frequency(0, True, 0, 1000.0, 0b001), Frequency(0, True, 1, 1200.0, 0b100))
    assert frequencies[("xpu_frequency_hertz", ("gpu",))] == 1200e6, "the fastest tile"
    assert {labels[1] for (name, labels), value in frequencies.items() if name == "xpu_frequency_throttled" and value} \
        == {"average_power", "current"}, "throttled for any tile's reasons"
    ras = served("ras", RasErrors(1, True, 0, (1, 0, 0, 0, 0, 0, 2)), RasErrors(1, True, 1, (0, 0, 0, 3, 0, 0, 1)))
    assert {labels[1]: value for (_, labels), value in ras.items() if value} == {"reset": 1, "compute": 3, "display": 3}
    assert {labels[0] for _, labels in ras} == {"uncorrectable"}


def test_a_frequency_the_driver_does_not_know_has_no_sample_but_its_throttle_reasons_do():
    frequencies = served("frequencies", Frequency(1, False, 0, -1.0, 0b1000))
    assert ("xpu_frequency_hertz", ("memory",)) not in frequencies
    assert frequencies[("xpu_frequency_throttled", ("memory", "thermal"))] == 1


def test_memory_traffic_is_summed_over_modules_and_all_zero_counters_are_no_reading():
    assert served("memory_bandwidth", MemoryBandwidth(5, 1, 100, 0), MemoryBandwidth(7, 2, 100, 0)) == {
        ("xpu_memory_read_bytes_total", ()): 12, ("xpu_memory_write_bytes_total", ()): 3}
    assert served("memory_bandwidth", MemoryBandwidth(0, 0, 0, 0)) == {}
    assert served("memory_bandwidth", MemoryBandwidth(0, 0, 100, 0)) == {
        ("xpu_memory_read_bytes_total", ()): 0, ("xpu_memory_write_bytes_total", ()): 0}, \
        "an idle device with a known maximum bandwidth reads 0"
    assert served("memory_bandwidth") == {}


def test_every_family_of_a_kind_is_documented_with_its_type():
    documented = METRICS_DOC.read_text()
    for kind in KINDS:
        for family in kind.families:
            assert f"| `{family.name}` | {family.type} |" in documented, family.name
