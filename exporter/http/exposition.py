"""/metrics in the Prometheus text format and in OpenMetrics: the bytes prometheus_client writes, sooner.

prometheus_client's encoders spend more time per sample than building the sample took: they format
with `str.format`, validate and escape every name of every sample (in OpenMetrics with underscore
escaping, one character at a time) and turn every value into a float and back into text. Here a
label pair is escaped once per scrape however many samples carry it, and an integer value is written
without the float round trip. `choose_encoder` picks the encoder prometheus_client picks for
the request's Accept header; where prometheus_client's content type is the text format or OpenMetrics
with names escaped with underscores or left as they are (what Prometheus asks for) it returns one of
the encoders here instead, which write the same bytes for every family whose metric, sample and label
names need no escaping and whose samples carry no timestamp, exemplar or native histogram (every family
the exporter serves). Any other family is written by prometheus_client's own encoder, family by family,
so the output is always byte for byte prometheus_client's (tests/http/test_http_exposition.py compares them).

Of prometheus_client only names that every release from the declared floor on has alike are used
(tests/deploy/test_floors.py runs the fast tier at the floors): its two `generate_latest`, `choose_encoder` and
the content type it answers with (what the scrape's client reads too), the families' classes and
`floatToGoString`, which its encoders write floats with. Never the shape of the encoder `choose_encoder`
returns or the constants of its escaping schemes, which came and moved between releases (with 0.17 to
0.22, which have none, this module failed to import).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable

from prometheus_client import exposition as client_exposition
from prometheus_client.core import Metric, Sample
from prometheus_client.openmetrics import exposition as client_openmetrics
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from vllm_xpu_exporter.families import RowFamily

# Names every escaping scheme but "dots" leaves as they are, in both formats. Not `:` (OpenMetrics with
# underscores escapes sample names as label names) and no label name starting with `__` (reserved:
# quoted with allow-utf-8).
_PLAIN_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_PLAIN_LABEL_NAME = re.compile(r"(?!__)[a-zA-Z_][a-zA-Z0-9_]*")
# None: a content type without a scheme, for which prometheus_client escapes with underscores.
_SCHEMES_KEEPING_PLAIN_NAMES = (None, "underscores", "allow-utf-8")
# Integers below 2**53 are floats exactly, and repr writes them without an exponent (it does from 1e16).
_EXACT_INT = 1 << 53
_MAX_SERIES_PER_FAMILY = 4096
# The text format's renaming of OpenMetrics types, as prometheus_client's generate_latest does it.
_TEXT_TYPES = {"counter": ("_total", "counter"), "info": ("_info", "gauge"), "stateset": ("", "gauge"),
               "gaugehistogram": ("", "histogram"), "unknown": ("", "untyped")}

Encoder = Callable[[Collector], bytes]


def choose_encoder(accept_header: str | None) -> tuple[Encoder, str]:
    """prometheus_client's `choose_encoder`, with this module's encoders where its content type says they apply."""
    encoder, content_type = client_exposition.choose_encoder(accept_header or "")
    media_type, *parameters = (part.strip() for part in content_type.split(";"))
    escaping = dict(parameter.partition("=")[::2] for parameter in parameters).get("escaping")
    if escaping not in _SCHEMES_KEEPING_PLAIN_NAMES:
        return encoder, content_type
    if media_type == "text/plain":
        return functools.partial(generate_text, fallback=encoder), content_type
    if media_type == "application/openmetrics-text":
        return functools.partial(generate_openmetrics, fallback=encoder), content_type
    return encoder, content_type


def generate_text(registry: Collector, fallback: Encoder = client_exposition.generate_latest) -> bytes:
    """The text format (0.0.4) of the registry's families; `fallback` writes those this module does not."""
    return _generate(registry, _text_family, fallback, "")


def generate_openmetrics(registry: Collector,
                         fallback: Encoder = client_openmetrics.generate_latest) -> bytes:
    """OpenMetrics text of the registry's families; `fallback` writes those this module does not."""
    return _generate(registry, _openmetrics_family, fallback, "# EOF\n")


def restricted(registry: Collector, names: Iterable[str]) -> Collector:
    """The registry's families restricted to the samples named in `names`: `/metrics?name[]=a&name[]=b`,
    as prometheus_client's `restricted_registry` serves it. A name is a sample's name as written, so a
    counter is asked for as `x_total` (`x` matches none of its samples) and a histogram's parts as
    `h_bucket`, `h_count`, `h_sum`; a family keeps the samples asked for and is left out without any.
    Unlike prometheus_client (which collects its collectors in no set order and drops a filtered
    family's unit), the families keep the registry's order and their units."""
    return _Restricted(registry, frozenset(names))


class _Restricted:
    def __init__(self, registry: Collector, names: frozenset[str]) -> None:
        self._registry = registry
        self._names = names

    def collect(self) -> Iterable[Metric]:
        names = self._names
        for family in self._registry.collect():
            if isinstance(family, RowFamily):  # one sample name: all of it or nothing, left as it is
                if family.sample_name in names:
                    yield family
                continue
            samples = [sample for sample in family.samples if sample.name in names]
            if samples:
                kept = Metric(family.name, family.documentation, family.type, family.unit)
                kept.samples = samples
                yield kept


class _NotPlain(Exception):
    """A family this module leaves to prometheus_client."""


class _OneFamily:
    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterable[Metric]:
        return [self._family]


def _generate(registry: Collector, write_family: Callable[[list[str], Metric, dict], None], fallback: Encoder,
              trailer: str) -> bytes:
    output: list[str] = []
    label_pairs: dict[tuple[str, str], str] = {}  # (name, value) -> name="escaped value", for this call
    for family in registry.collect():
        mark = len(output)
        try:
            write_family(output, family, label_pairs)
        except Exception:  # written by prometheus_client instead, which also raises what it raises
            del output[mark:]
            text = fallback(_OneFamily(family)).decode("utf-8")
            output.append(text[:len(text) - len(trailer)] if trailer else text)
    output.append(trailer)
    return "".join(output).encode("utf-8")


def _text_family(output: list[str], family: Metric, label_pairs: dict[tuple[str, str], str]) -> None:
    name = _plain(family.name)
    suffix, kind = _TEXT_TYPES.get(family.type, ("", family.type))
    documentation = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
    output.append(f"# HELP {name}{suffix} {documentation}\n# TYPE {name}{suffix} {kind}\n")
    if isinstance(family, RowFamily):
        _write_rows(output, family)
    else:
        # Samples the text format moves into a gauge family of their own: prometheus_client's business.
        _write_samples(output, family.samples, label_pairs, (name + "_created", name + "_gsum", name + "_gcount"))


def _openmetrics_family(output: list[str], family: Metric, label_pairs: dict[tuple[str, str], str]) -> None:
    name = _plain(family.name)
    documentation = _escape(family.documentation)
    output.append(f"# HELP {name} {documentation}\n# TYPE {name} {family.type}\n")
    if family.unit:
        output.append(f"# UNIT {name} {family.unit}\n")
    if isinstance(family, RowFamily):
        _write_rows(output, family)
    else:
        _write_samples(output, family.samples, label_pairs, ())


def _write_rows(output: list[str], family: RowFamily) -> None:
    append = output.append
    name, label_names = _plain(family.sample_name), family.label_names
    series = _series_of(name, label_names)
    for values, value in family.rows:
        text = f"{value}.0" if value.__class__ is int and -1_000_000 < value < 1_000_000 else _go_float(value)
        append(f"{series.get(values) or _new_series(series, name, label_names, values)} {text}\n")


@functools.lru_cache(maxsize=1024)
def _series_of(name: str, label_names: tuple[str, ...]) -> dict[tuple[str, ...], str]:
    """label values -> `name{label="value",...}` of one family, kept across scrapes: a host's series
    seldom change (their values are not kept)."""
    return {}


def _new_series(series: dict[tuple[str, ...], str], name: str, label_names: tuple[str, ...],
                values: tuple[str, ...]) -> str:
    """`name{label="value",...}`, labels sorted by name, as prometheus_client writes them."""
    if len(series) >= _MAX_SERIES_PER_FAMILY:
        series.clear()  # series come and go (units, devices): keep the ones of now
    pairs = ",".join([f'{_plain_label(label)}="{_escape(value)}"' for label, value in sorted(zip(label_names, values))])
    written = series[values] = f"{name}{{{pairs}}}" if label_names else name
    return written


def _write_samples(output: list[str], samples: list[Sample], label_pairs: dict[tuple[str, str], str],
                   moved: tuple[str, ...]) -> None:
    append = output.append
    names: set[str] = set()  # sample names of the family found plain
    for sample in samples:
        name = sample.name
        if name not in names:
            if name in moved:
                raise _NotPlain(name)
            names.add(_plain(name))
        if sample.timestamp is not None or sample.exemplar is not None or sample.native_histogram is not None:
            raise _NotPlain(name)
        value = sample.value
        text = f"{value}.0" if value.__class__ is int and -1_000_000 < value < 1_000_000 else _go_float(value)
        labels = sample.labels
        if not labels:
            append(f"{name} {text}\n")
        elif len(labels) == 1:
            (label,) = labels.items()
            append(f"{name}{{{label_pairs.get(label) or _label_pair(label, label_pairs)}}} {text}\n")
        else:
            pairs = ",".join([label_pairs.get(label) or _label_pair(label, label_pairs)
                              for label in sorted(labels.items())])
            append(f"{name}{{{pairs}}} {text}\n")


def _label_pair(label: tuple[str, str], label_pairs: dict[tuple[str, str], str]) -> str:
    pair = label_pairs[label] = f'{_plain_label(label[0])}="{_escape(label[1])}"'
    return pair


def _go_float(value: float) -> str:
    """prometheus_client's floatToGoString, without its float round trip for integers (byte sizes,
    counts) that a float holds exactly."""
    if value.__class__ is int and -_EXACT_INT < value < _EXACT_INT:
        if value < 1_000_000:
            return f"{value}.0"
        digits = str(value)  # what repr(float(value)) holds before its ".0"; Go writes it with an exponent
        return f"{(digits[0] + '.' + digits[1:]).rstrip('0.')}e+{len(digits) - 1:02d}"
    return floatToGoString(value)


def _escape(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


@functools.lru_cache(maxsize=4096)
def _plain(name: str) -> str:
    if _PLAIN_NAME.fullmatch(name) is None:
        raise _NotPlain(name)
    return name


@functools.lru_cache(maxsize=4096)
def _plain_label(name: str) -> str:
    if _PLAIN_LABEL_NAME.fullmatch(name) is None:
        raise _NotPlain(name)
    return name
