"""vllm_xpu_exporter.http.exposition writes exactly the bytes prometheus_client's encoders write: for the exporter's own
metrics (the golden scrapes), for every Accept header Prometheus sends, and for random families
(hypothesis) with names, labels and values that need escaping or that the encoders refuse."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import exposition as client_exposition
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Exemplar

from vllm_xpu_exporter.http.exposition import choose_encoder, generate_openmetrics, generate_text
from vllm_xpu_exporter.families import CounterFamily, GaugeFamily, RowFamily
from vllm_xpu_exporter.http.server import ExporterServer
from httpclient import request

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
ACCEPT_HEADERS = {
    "none": "",
    "text": "text/plain",
    "text-0.0.4": "text/plain;version=0.0.4",
    "text-1.0.0-utf8": "text/plain;version=1.0.0;escaping=allow-utf-8",
    "text-1.0.0-underscores": "text/plain;version=1.0.0;escaping=underscores",
    "text-1.0.0-dots": "text/plain;version=1.0.0;escaping=dots",
    "text-1.0.0-values": "text/plain;version=1.0.0;escaping=values",
    "openmetrics": "application/openmetrics-text",
    "prometheus-2": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "prometheus-3": "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
                    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;"
                    "q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1",
    "openmetrics-dots": "application/openmetrics-text;version=1.0.0;escaping=dots",
    "openmetrics-values": "application/openmetrics-text;version=1.0.0;escaping=values",
}


class Families:
    """A registry that yields the same families on every collect."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def golden_families(name: str) -> Families:
    return Families(list(text_string_to_metric_families((GOLDEN / name).read_text())))


def outcome(encoder, registry) -> tuple[str, object]:
    try:
        return "bytes", encoder(registry)
    except Exception as error:  # both encoders must refuse the same families
        return "error", type(error)


def refuse(_registry) -> bytes:
    raise AssertionError("a family was left to prometheus_client")


@pytest.mark.fast
@pytest.mark.parametrize("golden", sorted(path.name for path in GOLDEN.glob("*.prom")))
@pytest.mark.parametrize("accept", ACCEPT_HEADERS.values(), ids=ACCEPT_HEADERS.keys())
def test_the_exporters_metrics_are_written_as_prometheus_client_writes_them(golden: str, accept: str):
    registry = golden_families(golden)
    ours, our_type = choose_encoder(accept)
    theirs, their_type = client_exposition.choose_encoder(accept)
    assert our_type == their_type
    assert ours(registry) == theirs(registry)


@pytest.mark.fast
@pytest.mark.parametrize("golden", sorted(path.name for path in GOLDEN.glob("*.prom")))
def test_every_family_the_exporter_serves_is_written_without_prometheus_client(golden: str):
    registry = golden_families(golden)
    assert generate_text(registry, fallback=refuse) == client_exposition.generate_latest(registry)
    assert generate_openmetrics(registry, fallback=refuse).endswith(b"# EOF\n")


def as_row_family(family: Metric) -> Metric:
    """The golden family as the exporter's collectors build it (vllm_xpu_exporter.families), where it is one."""
    kinds = {"gauge": GaugeFamily, "counter": CounterFamily}
    label_names = sorted({name for sample in family.samples for name in sample.labels})
    if family.type not in kinds or any(sample.labels.keys() != set(label_names) for sample in family.samples):
        return family
    rows = kinds[family.type](family.name, family.documentation, labels=label_names)
    rows.samples = family.samples
    return rows


@pytest.mark.fast
@pytest.mark.parametrize("golden", sorted(path.name for path in GOLDEN.glob("*.prom")))
@pytest.mark.parametrize("accept", ACCEPT_HEADERS.values(), ids=ACCEPT_HEADERS.keys())
def test_the_exporters_row_families_are_written_as_prometheus_client_writes_them(golden: str, accept: str):
    registry = golden_families(golden)
    rows = Families([as_row_family(family) for family in registry.families])
    assert sum(isinstance(family, RowFamily) for family in rows.families) > len(rows.families) // 2
    ours, _ = choose_encoder(accept)
    theirs, _ = client_exposition.choose_encoder(accept)
    assert ours(rows) == theirs(registry)
    assert ours(rows) == ours(rows)  # the second time from the series kept from the first
    assert generate_text(rows, fallback=refuse) == client_exposition.generate_latest(registry)


@pytest.mark.fast
def test_a_row_familys_labels_are_written_in_name_order_as_prometheus_client_writes_them():
    family = CounterFamily("requests_total", "Help.", labels=["z", "b", "m"])
    family.add_metric(["1", "2", "3"], 4)
    registry = Families([family])
    assert generate_text(registry, fallback=refuse) == client_exposition.generate_latest(registry)
    assert b'requests_total{b="2",m="3",z="1"} 4.0' in generate_text(registry, fallback=refuse)


@pytest.mark.fast
def test_a_row_family_with_more_series_than_are_kept_is_written_right_every_time():
    family = GaugeFamily("xpu_many", "Help.", labels=["unit", "device"])
    for index in range(10_000):
        family.add_metric([f"u{index}.service", "0000:03:00.0"], index)
    registry = Families([family])
    expected = client_exposition.generate_latest(registry)
    assert [generate_text(registry, fallback=refuse) for _ in range(2)] == [expected, expected]


@pytest.mark.parametrize("accept", ACCEPT_HEADERS.values(), ids=ACCEPT_HEADERS.keys())
def test_the_server_answers_with_the_bytes_and_content_type_of_prometheus_client(accept: str):
    registry = golden_families("two_devices.prom")
    server = ExporterServer("127.0.0.1:0", "/metrics", registry)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        status, headers, body = request("127.0.0.1", server.server_addresses[0][1], headers={"Accept": accept})
    finally:
        server.shutdown()
        thread.join(5)
    encoder, content_type = client_exposition.choose_encoder(accept)
    assert (status, headers["Content-Type"], body) == (200, content_type, encoder(registry))


@pytest.mark.fast
@pytest.mark.parametrize("accept", ["text/plain;version=1.0.0;escaping=dots",
                                    "application/openmetrics-text;version=1.0.0;escaping=values"])
def test_escaping_schemes_that_rename_plain_names_are_left_to_prometheus_client(accept: str):
    # A name the exposition writes as it is, which dots (an underscore doubled) and values (U__ and each
    # character's code) rename: written by prometheus_client.
    registry = Families([family("xpu_plain_name", [("xpu_plain_name", {"some_label": "v"}, 1)])])
    (ours, our_type), (theirs, their_type) = choose_encoder(accept), client_exposition.choose_encoder(accept)
    assert (our_type, ours(registry)) == (their_type, theirs(registry))


def family(name: str, samples: list[tuple], documentation: str = "Help.", kind: str = "gauge",
           unit: str = "") -> Metric:
    built = Metric(name, documentation, kind, unit)
    for sample in samples:
        built.add_sample(*sample)
    return built


EDGE_CASES = {
    "reserved label name": family("a", [("a", {"__name": "v", "b": "w"}, 1)]),
    "label name with a colon": family("a", [("a", {"x:y": "v"}, 1)]),
    "metric name with a colon": family("x:y", [("x:y", {}, 1)]),
    "metric name with a leading digit": family("9lives", [("9lives", {}, 1)]),
    "non-ASCII names": family("größe", [("größe", {"gerät": "ä"}, 1)]),
    "escapes in help and label values": family("a", [("a", {"b": 'q"uote\\back\nline'}, 1)], 'Say "x"\\\n.'),
    "counter with created": family("c", [("c_total", {}, 3), ("c_created", {}, 1.7e9)], kind="counter"),
    "gauge histogram sums": family("g", [("g_bucket", {"le": "+Inf"}, 2), ("g_gcount", {}, 2), ("g_gsum", {}, 5)],
                                   kind="gaugehistogram"),
    "timestamp": family("a", [("a", {}, 1, 1.7e9)]),
    "exemplar": family("c", [("c_total", {}, 3, None, Exemplar({"trace": "x"}, 1.0))], kind="counter"),
    "unit": family("size_bytes", [("size_bytes", {}, 1)], unit="bytes"),
    "info, stateset, unknown": family("i", [("i_info", {"v": "1"}, 1)], kind="info"),
    "big and special values": family("a", [("a", {"k": str(i)}, v) for i, v in enumerate(
        [17179869184, -17179869184, 1e16, 1234567.0, 0.1, math.inf, -math.inf, math.nan, True, 0])]),
    "value no encoder writes": family("a", [("a", {}, None)]),
    "int too big for a float": family("a", [("a", {}, 10 ** 400)]),
    "label value that is not text": family("a", [("a", {"k": 5}, 1)]),
    "no samples": family("a", []),
}


@pytest.mark.fast
@pytest.mark.parametrize("accept", ACCEPT_HEADERS.values(), ids=ACCEPT_HEADERS.keys())
@pytest.mark.parametrize("case", EDGE_CASES.values(), ids=EDGE_CASES.keys())
def test_families_that_need_escaping_or_cannot_be_written_come_out_as_prometheus_client_has_them(case: Metric,
                                                                                                 accept: str):
    registry = Families([case, family("after", [("after", {"z": "1", "a": "2"}, 1)])])
    ours, _ = choose_encoder(accept)
    theirs, _ = client_exposition.choose_encoder(accept)
    assert outcome(ours, registry) == outcome(theirs, registry)


@pytest.mark.fast
@settings(derandomize=True, database=None, deadline=None, max_examples=1000)
@given(st.one_of(st.integers(min_value=-(1 << 60), max_value=1 << 60), st.sampled_from(
    [999_999, 1_000_000, -999_999, -1_000_000, 10 ** 15, 10 ** 16 - 1, 10 ** 16, (1 << 53) - 1, 1 << 53, -(1 << 53),
     1 - (1 << 53), 0, -1, 1000, 123_456_789])))
def test_integer_values_are_written_as_prometheus_client_writes_them(value: int):
    registry = Families([family("a", [("a", {}, value)])])
    assert generate_text(registry, fallback=refuse) == client_exposition.generate_latest(registry)


PLAIN_NAMES = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True)
NAMES = st.one_of(PLAIN_NAMES, PLAIN_NAMES, PLAIN_NAMES, st.sampled_from(["x:y", "__x", "9lives", "a-b", "é"]),
                  st.text(min_size=1, max_size=12))
LABEL_NAMES = st.one_of(PLAIN_NAMES, PLAIN_NAMES, st.sampled_from(["__name", "__", "x:y", "9a"]),
                        st.text(min_size=1, max_size=8))
DOCUMENTATION = st.one_of(st.sampled_from(['Say "bytes".', "back\\slash", "two\nlines", ""]), st.text(max_size=20))
LABEL_VALUES = st.one_of(st.sampled_from(["0000:03:00.0", 'a"b', "back\\slash", "new\nline", ""]), st.text(max_size=12))
RARELY = st.sampled_from([False] * 7 + [True])
NUMBERS = st.one_of(st.integers(min_value=-(1 << 70), max_value=1 << 70), st.floats(),
                    st.sampled_from([math.inf, -math.inf, math.nan, 1e16, 1234567.0, 0.1, 17179869184]))
# Now and then a value no encoder writes (None; an int too big for a float).
VALUES = st.one_of(*[NUMBERS] * 7, st.sampled_from([None, 10 ** 400]))


@st.composite
def families(draw) -> Metric:
    name = draw(NAMES)
    family = Metric(name, draw(DOCUMENTATION), draw(st.sampled_from(
        ["gauge", "counter", "info", "summary", "histogram", "stateset", "unknown", "gaugehistogram"])),
        draw(st.sampled_from(["", "", "bytes"])))
    for _ in range(draw(st.integers(0, 4))):
        suffix = draw(st.sampled_from(["", "", "", "_total", "_created", "_gsum", "_gcount", "_bucket", "_info"]))
        labels = draw(st.dictionaries(LABEL_NAMES, LABEL_VALUES, max_size=4))
        timestamp = draw(st.floats(0, 2e9)) if draw(RARELY) else None
        exemplar = (Exemplar(draw(st.dictionaries(LABEL_NAMES, LABEL_VALUES, max_size=1)), draw(VALUES))
                    if draw(RARELY) else None)
        family.add_sample(family.name + suffix, labels, draw(VALUES), timestamp, exemplar)
    return family


def assert_written_or_refused_as_prometheus_client_does(drawn: list[Metric], accept: str) -> None:
    """All the families together, and each alone, give what prometheus_client gives for them."""
    ours, _ = choose_encoder(accept)
    theirs, _ = client_exposition.choose_encoder(accept)
    for registry in [Families(drawn), *(Families([family]) for family in drawn)]:
        assert outcome(ours, registry) == outcome(theirs, registry)


@settings(derandomize=True, database=None, deadline=None, max_examples=1500)
@given(st.lists(families(), max_size=3), st.sampled_from(sorted(ACCEPT_HEADERS.values())))
def test_random_families_are_written_or_refused_as_prometheus_client_does(drawn: list[Metric], accept: str):
    assert_written_or_refused_as_prometheus_client_does(drawn, accept)


@st.composite
def row_families(draw) -> Metric:
    # Mostly names the exposition writes itself; now and then one left to prometheus_client.
    kind = draw(st.sampled_from([GaugeFamily, CounterFamily]))
    label_names = draw(st.one_of(st.lists(PLAIN_NAMES, unique=True, min_size=2, max_size=3),
                                 st.lists(LABEL_NAMES, unique=True, max_size=3)))
    family = kind(draw(st.one_of(*[PLAIN_NAMES] * 4, NAMES)), draw(DOCUMENTATION), labels=label_names)
    for _ in range(draw(st.integers(0, 4))):
        family.add_metric(draw(st.lists(LABEL_VALUES, min_size=len(label_names), max_size=len(label_names))),
                          draw(VALUES))
    return family


@settings(derandomize=True, database=None, deadline=None, max_examples=1000)
@given(st.lists(row_families(), max_size=3), st.sampled_from(sorted(ACCEPT_HEADERS.values())))
def test_random_row_families_are_written_or_refused_as_prometheus_client_does(drawn: list[Metric], accept: str):
    assert_written_or_refused_as_prometheus_client_does(drawn, accept)
