"""Gauge and counter families for the collectors: prometheus_client's `GaugeMetricFamily` and
`CounterMetricFamily`, keeping each series as a row (label values, value).

prometheus_client builds a `Sample` with a label dict for every `add_metric`, and its encoders then
take every sample's labels apart again. A row costs a tuple; the exposition (vllm_xpu_exporter.http.exposition)
writes a series' name and labels once per label values seen, and the scrape (vllm_xpu_exporter.scrape) checks
a label value once. To anything else a family is an ordinary prometheus_client family: `samples`
gives prometheus_client's very samples (built when asked), and setting it sets the rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

Row = tuple[tuple[str, ...], float]


class RowFamily(Metric):
    """A family of one sample name (`sample_name`) whose series are `rows`: (label values in the order
    of `label_names`, value)."""

    sample_suffix = ""

    def __init__(self, name: str, documentation: str, typ: str, value: float | None = None,
                 labels: Sequence[str] = ()) -> None:
        self.rows: list[Row] = []
        self.label_names = tuple(labels)
        super().__init__(name, documentation, typ)
        self.sample_name = self.name + self.sample_suffix
        if value is not None:
            if self.label_names:
                raise ValueError("Can only specify at most one of value and labels.")
            self.rows.append(((), value))

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self.rows.append((tuple(labels), value))

    @property  # type: ignore[override]
    def samples(self) -> list[Sample]:
        name, label_names = self.sample_name, self.label_names
        return [Sample(name, dict(zip(label_names, values)), value) for values, value in self.rows]

    @samples.setter
    def samples(self, samples: Sequence[Sample]) -> None:
        rows = []
        for sample in samples:
            if (sample.name != self.sample_name or sample.labels.keys() != set(self.label_names)
                    or sample.timestamp is not None or sample.exemplar is not None
                    or sample.native_histogram is not None):
                raise ValueError(f"{sample} is not a series of {self.sample_name}{list(self.label_names)}")
            rows.append((tuple(sample.labels[name] for name in self.label_names), sample.value))
        self.rows = rows


class GaugeFamily(RowFamily):
    """`GaugeMetricFamily(name, documentation, value=None, labels=None)`."""

    def __init__(self, name: str, documentation: str, value: float | None = None,
                 labels: Sequence[str] = ()) -> None:
        super().__init__(name, documentation, "gauge", value, labels)


class CounterFamily(RowFamily):
    """`CounterMetricFamily(name, documentation, value=None, labels=None)`: named with or without
    `_total`, the family without it and its samples with it, as prometheus_client does."""

    sample_suffix = "_total"

    def __init__(self, name: str, documentation: str, value: float | None = None,
                 labels: Sequence[str] = ()) -> None:
        super().__init__(name.removesuffix("_total"), documentation, "counter", value, labels)
