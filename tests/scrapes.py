"""What a scrape says: Prometheus text parsed into samples keyed by (sample name, sorted labels), and
lookups of one sample or of one metric's series."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]


def parse_samples(text: str) -> Samples:
    """{(sample name, sorted labels): value} of a scrape in the text format."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def sample(samples: Mapping, metric: str, **labels: str) -> float | None:
    return samples.get((metric, tuple(sorted(labels.items()))))


def series(samples: Mapping, metric: str) -> dict[Labels, float]:
    return {labels: value for (name, labels), value in samples.items() if name == metric}
