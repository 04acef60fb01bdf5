"""vllm_xpu_exporter.families: the collectors' row families are, to prometheus_client and to anything reading
`samples`, the families prometheus_client builds from the same calls."""

from __future__ import annotations

import pytest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.samples import Sample

from vllm_xpu_exporter.families import CounterFamily, GaugeFamily

pytestmark = pytest.mark.fast  # the pure core (pyproject.toml's markers; `pytest -m fast`)

PAIRS = {"gauge": (GaugeFamily, GaugeMetricFamily), "counter": (CounterFamily, CounterMetricFamily)}


@pytest.mark.parametrize("name", ["xpu_thing_total", "xpu_thing"])
@pytest.mark.parametrize("ours, theirs", PAIRS.values(), ids=PAIRS.keys())
def test_a_row_family_equals_prometheus_clients_family_built_by_the_same_calls(ours, theirs, name: str):
    built = [kind(name, "Help.", labels=["device", "unit"]) for kind in (ours, theirs)]
    for family in built:
        family.add_metric(["0000:03:00.0", "a.service"], 1)
        family.add_metric(("0000:03:00.0", "b.service"), 2.5)
    row, client = built
    assert (row.name, row.type, row.samples) == (client.name, client.type, client.samples)
    assert row == client


@pytest.mark.parametrize("ours, theirs", PAIRS.values(), ids=PAIRS.keys())
def test_a_row_family_with_one_value_equals_prometheus_clients(ours, theirs):
    assert ours("xpu_x_total", "Help.", value=7) == theirs("xpu_x_total", "Help.", value=7)


def test_setting_a_row_familys_samples_sets_its_rows():
    family = CounterFamily("xpu_x", "Help.", labels=["unit"])
    family.add_metric(["a.service"], 1)
    family.add_metric(["b.service"], 2)
    family.samples = family.samples[1:]
    assert family.rows == [(("b.service",), 2)]


@pytest.mark.parametrize("sample", [Sample("xpu_x", {"unit": "a"}, 1), Sample("xpu_x_total", {"device": "a"}, 1),
                                    Sample("xpu_x_total", {"unit": "a"}, 1, 1.7e9)],
                         ids=["other sample name", "other labels", "timestamp"])
def test_a_sample_that_is_not_a_series_of_the_row_family_is_refused(sample: Sample):
    family = CounterFamily("xpu_x", "Help.", labels=["unit"])
    with pytest.raises(ValueError):
        family.samples = [sample]
    assert family.rows == []
