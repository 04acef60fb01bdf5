"""What a scrape says: Prometheus text parsed into samples keyed by (sample name, sorted labels), and
lookups of one sample or of one metric's series."""

from __future__ import annotations

import re
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]

_DURATION_SAMPLE = re.compile(r"^(xpu_exporter_collector_duration_seconds\{[^}]*\}) \S+$", re.M)
_PROCESS_AND_PYTHON_LINE = re.compile(r"^(?:# (?:HELP|TYPE) )?(?:process|python)_.*\n", re.M)


def parse_samples(text: str) -> Samples:
    """{(sample name, sorted labels): value} of a scrape in the text format."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def sample(samples: Mapping, metric: str, **labels: str) -> float | None:
    return samples.get((metric, tuple(sorted(labels.items()))))


def series(samples: Mapping, metric: str) -> dict[Labels, float]:
    return {labels: value for (name, labels), value in samples.items() if name == metric}


_BUILD_PLACEHOLDERS = {"revision": "REVISION", "pythonversion": "PYTHON"}
_BUILD_LABELS = re.compile(r'(?<=[{,])(revision|pythonversion)="[^"]*"')


def golden_text(text: str) -> str:
    """A scrape's text as the golden files under tests/golden/ hold it: what varies from run to run goes.
    The samples of xpu_exporter_collector_duration_seconds are pinned to 0.0; client_python's process_* and
    python_* families are dropped (they vary by run and by Python; tests/collectors/test_exporter_self_metrics.py checks
    them); xpu_exporter_build_info's revision and Python version are written REVISION and PYTHON
    (tests/cli/test_buildinfo.py checks them)."""
    text = _BUILD_LABELS.sub(lambda match: f'{match.group(1)}="{_BUILD_PLACEHOLDERS[match.group(1)]}"', text)
    return _DURATION_SAMPLE.sub(r"\1 0.0", _PROCESS_AND_PYTHON_LINE.sub("", text))
