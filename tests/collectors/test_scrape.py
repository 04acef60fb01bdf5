"""One scrape over collectors that misbehave: a sample whose value is not a finite number (or that no
exposition format can carry) costs its own collector's series and marks that collector failed; the
other collectors' series are served."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from vllm_xpu_exporter.collector import CollectionError, Collector, ScrapeContext, Sources
from vllm_xpu_exporter.families import GaugeFamily
from vllm_xpu_exporter.scrape import ExporterCollector
from vllm_xpu_exporter.collectors.journal import JournalCollector
from vllm_xpu_exporter.nodatayet import NoDataYet
from vllm_xpu_exporter.sources.logs.follower import LogError, LogNotReadYet, LogState, LogUnreadable
from vllm_xpu_exporter.sources.levelzero.worker import (JUST_INITIALISED, STILL_INITIALISING, LevelZeroStarting,
                                                        LevelZeroUnavailable)
from scrapes import parse_samples

pytestmark = pytest.mark.fast  # the pure core (pyproject.toml's markers; `pytest -m fast`)


# The exporter's collectors build vllm_xpu_exporter.families' row families; any other collector prometheus_client's.
FAMILY_KINDS = {"row family": GaugeFamily, "prometheus_client family": GaugeMetricFamily}


@pytest.fixture(params=FAMILY_KINDS.values(), ids=FAMILY_KINDS.keys())
def gauge_family(request: pytest.FixtureRequest) -> type:
    return request.param


class Yields(Collector):
    """A collector whose one family (of class `kind`) holds the given (label value, value) samples."""

    def __init__(self, name: str, samples: list[tuple[str, object]], kind: type = GaugeFamily) -> None:
        self.name = name
        self._samples = samples
        self._kind = kind

    def collect(self, context: ScrapeContext) -> Iterator[Metric]:
        family = self._kind(f"test_{self.name}_value", "A test gauge.", labels=["unit"])
        for unit, value in self._samples:
            family.add_metric([unit], value)  # type: ignore[arg-type]
        yield family


NOT_FINITE_NUMBERS = {
    "int-of-4000-digits": 10**4000,
    "infinity": math.inf,
    "minus-infinity": -math.inf,
    "nan": math.nan,
    "text": "12 GiB",
    "none": None,
}


def served(*collectors: Collector) -> dict[str, dict[tuple, float]]:
    """{family: {labels: value}} of one text exposition (which must not raise) and the same check in
    OpenMetrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(collectors, Sources()))
    generate_openmetrics(registry)
    families: dict[str, dict[tuple, float]] = {}
    for (name, labels), value in parse_samples(generate_latest(registry).decode()).items():
        families.setdefault(name, {})[labels] = value
    return families


@pytest.mark.parametrize("value", list(NOT_FINITE_NUMBERS.values()), ids=list(NOT_FINITE_NUMBERS))
def test_a_value_that_is_not_a_finite_number_costs_only_its_sample_and_marks_its_collector_failed(
        value: object, gauge_family: type):
    families = served(Yields("bad", [("good.service", 1), ("bad.service", value)], gauge_family),
                      Yields("other", [("good.service", 2)]))
    assert families["test_bad_value"] == {(("unit", "good.service"),): 1.0}
    assert families["test_other_value"] == {(("unit", "good.service"),): 2.0}
    success = families["xpu_exporter_collector_success"]
    assert success == {(("collector", "bad"),): 0.0, (("collector", "other"),): 1.0}


def test_a_label_value_that_is_not_utf8_encodable_costs_only_its_sample_and_marks_its_collector_failed(
        gauge_family: type):
    families = served(Yields("bad", [("good.service", 1), ("lone-surrogate-\udcff.service", 3)], gauge_family),
                      Yields("other", [("good.service", 2)]))
    assert families["test_bad_value"] == {(("unit", "good.service"),): 1.0}
    assert families["test_other_value"] == {(("unit", "good.service"),): 2.0}
    assert families["xpu_exporter_collector_success"][(("collector", "bad"),)] == 0.0


def test_exposable_values_of_every_numeric_type_are_served_unchanged(gauge_family: type):
    families = served(Yields("fine", [("int.service", 2**53), ("float.service", -0.25), ("bool.service", True)],
                             gauge_family))
    assert families["test_fine_value"] == {(("unit", "int.service"),): 2.0**53,
                                           (("unit", "float.service"),): -0.25,
                                           (("unit", "bool.service"),): 1.0}
    assert families["xpu_exporter_collector_success"] == {(("collector", "fine"),): 1.0}


@pytest.mark.parametrize("label", [5, ["list.service"], None], ids=["int", "unhashable", "none"])
def test_a_label_value_that_is_not_text_costs_only_its_sample_and_marks_its_collector_failed(
        label: object, gauge_family: type):
    families = served(Yields("bad", [("good.service", 1), (label, 3)], gauge_family))  # type: ignore[list-item]
    assert families["test_bad_value"] == {(("unit", "good.service"),): 1.0}
    assert families["xpu_exporter_collector_success"][(("collector", "bad"),)] == 0.0


def test_a_label_value_that_is_utf8_but_not_ascii_is_served(gauge_family: type):
    families = served(Yields("fine", [("café.service", 1), ("big.service", 1e308), ("bigger.service", 1e308)],
                             gauge_family))
    assert families["test_fine_value"] == {(("unit", "café.service"),): 1.0, (("unit", "big.service"),): 1e308,
                                           (("unit", "bigger.service"),): 1e308}
    assert families["xpu_exporter_collector_success"] == {(("collector", "fine"),): 1.0}


class RecordingLevelZero:
    """A Level Zero source that records when it is asked and when its answer is read."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def request_memory(self) -> RecordingLevelZero:
        self.log.append("Level Zero asked")
        return self

    def result(self) -> list:
        self.log.append("Level Zero answer read")
        return []


class Logs(Collector):
    def __init__(self, name: str, log: list[str], reads_device_memory: bool = False) -> None:
        self.name, self._log, self._reads = name, log, reads_device_memory

    def collect(self, context: ScrapeContext) -> Iterator[Metric]:
        self._log.append(f"{self.name} ran")
        if self._reads:
            context.device_memory()
        return iter(())


def test_a_scrape_asks_level_zero_first_and_reads_its_answer_when_a_collector_needs_it():
    log: list[str] = []
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector([Logs("journal", log), Logs("levelzero", log, reads_device_memory=True)],
                                        Sources(levelzero=RecordingLevelZero(log))))  # type: ignore[arg-type]
    generate_latest(registry)
    assert log == ["Level Zero asked", "journal ran", "levelzero ran", "Level Zero answer read"]


# --- no data yet: a source still starting --------------------------------------------------------------


class Raises(Collector):
    """A collector that raises the next of `errors` at each scrape (None: works)."""

    def __init__(self, name: str, errors: list[Exception | None]) -> None:
        self.name, self._errors = name, errors

    def collect(self, context: ScrapeContext) -> Iterator[Metric]:
        error = self._errors.pop(0)
        if error is not None:
            raise error
        return iter(())


# What the journal collector raises during the follower's first read, and what the levelzero collector lets
# through while the Level Zero child initialises.
STARTING = {
    "journal-first-read": NoDataYet("still reading the journal"),
    "levelzero-initialising": LevelZeroStarting(STILL_INITIALISING),
    "levelzero-just-initialised": LevelZeroStarting(JUST_INITIALISED),
}


def scrapes(collector: Collector, count: int) -> list[float]:
    """The collector's success at each of `count` scrapes."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector([collector], Sources()))
    return [parse_samples(generate_latest(registry).decode())[("xpu_exporter_collector_success",
                                                               (("collector", collector.name),))]
            for _ in range(count)]


def scrape_log(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(record.levelno, record.getMessage()) for record in caplog.records if record.name == "vllm_xpu_exporter.scrape"]


@pytest.mark.parametrize("error", list(STARTING.values()), ids=list(STARTING))
def test_a_source_still_starting_reports_0_and_logs_no_data_yet_at_info_not_a_warning(
        error: Exception, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="vllm_xpu_exporter.scrape"):
        assert scrapes(Raises("starting", [error, error, None, None]), 4) == [0, 0, 1, 1]
    assert scrape_log(caplog) == [(logging.INFO, f"collector starting has no data yet: {error}")]


def test_a_failure_after_no_data_yet_warns_and_its_end_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    failed = CollectionError("cannot open the journal: Permission denied")
    with caplog.at_level(logging.DEBUG, logger="vllm_xpu_exporter.scrape"):
        assert scrapes(Raises("journal", [STARTING["journal-first-read"], failed, None]), 3) == [0, 0, 1]
    assert scrape_log(caplog) == [
        (logging.INFO, f"collector journal has no data yet: {STARTING['journal-first-read']}"),
        (logging.WARNING, f"collector journal failed: {failed}"),
        (logging.INFO, "collector journal works again"),
    ]


@pytest.mark.parametrize("error", [CollectionError(str(error)) for error in STARTING.values()] +
                         [LevelZeroUnavailable(STILL_INITIALISING)], ids=[*STARTING, "levelzero-unavailable"])
def test_a_failure_that_says_what_no_data_yet_says_is_still_a_failure(
        error: Exception, caplog: pytest.LogCaptureFixture) -> None:
    """No data yet is the type a source raises (NoDataYet), not its words: the same words in a failure warn."""
    with caplog.at_level(logging.DEBUG, logger="vllm_xpu_exporter.scrape"):
        assert scrapes(Raises("source", [error]), 1) == [0]
    assert scrape_log(caplog) == [(logging.WARNING, f"collector source failed: {error}")]


def test_no_data_yet_with_a_sample_dropped_is_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    class StartingWithAnUnexposableSample(Collector):
        name = "starting"

        def collect(self, context: ScrapeContext) -> Iterator[Metric]:
            yield from Yields("starting", [("a", math.nan)]).collect(context)
            raise NoDataYet("still reading the journal")

    with caplog.at_level(logging.DEBUG, logger="vllm_xpu_exporter.scrape"):
        assert scrapes(StartingWithAnUnexposableSample(), 1) == [0]
    assert [level for level, _ in scrape_log(caplog)] == [logging.WARNING]


class Following:
    """What the journal collector reads of a LogFollower: a state with this error."""

    def __init__(self, error: LogError | None) -> None:
        self.error = error

    def state(self) -> LogState:
        return LogState(views=[], error=self.error, entries_read=0, dropped_units=0, watched_units=None,
                        values_rejected=0)


@pytest.mark.parametrize("journal, container_logs, expected", [
    (LogNotReadYet("still reading the journal"), None, (NoDataYet, "still reading the journal")),
    (None, LogNotReadYet("still reading the container logs"), (NoDataYet, "still reading the container logs")),
    (LogNotReadYet("still reading the journal"), LogUnreadable("container log directory /x does not exist"),
     (CollectionError, "container log directory /x does not exist")),
    (LogUnreadable("cannot open the journal"), LogUnreadable("still reading the container logs"),
     (CollectionError, "cannot open the journal; still reading the container logs")),
], ids=["journal-first-read", "container-logs-first-read", "a-failure-beside-a-first-read", "words-are-no-type"])
def test_the_journal_collector_has_no_data_yet_only_while_its_sources_are_first_read_and_none_failed(
        journal, container_logs, expected) -> None:
    sources = Sources(journal=Following(journal),  # type: ignore[arg-type]
                      container_logs=Following(container_logs))  # type: ignore[arg-type]
    with pytest.raises(Exception) as raised:
        list(JournalCollector().collect(ScrapeContext(sources)))
    assert (type(raised.value), str(raised.value)) == expected


def test_a_failure_at_the_first_scrape_is_still_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    failed = LevelZeroUnavailable("Level Zero initialisation failed: zeInit: ZE_RESULT_ERROR_UNINITIALIZED")
    with caplog.at_level(logging.DEBUG, logger="vllm_xpu_exporter.scrape"):
        assert scrapes(Raises("levelzero", [failed]), 1) == [0]
    assert scrape_log(caplog) == [(logging.WARNING, f"collector levelzero failed: {failed}")]
