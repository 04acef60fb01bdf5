"""One scrape at a time: run every enabled collector, time it, and report on the exporter itself.

Concurrent requests share the scrape in flight (single flight): a request that arrives while a scrape
runs waits for it and serves its families, so the collectors and the sources they read see one scrape
at a time whatever the number of clients.

A collector whose source is still starting (the journal's first read, Level Zero's init: it raises
`vllm_xpu_exporter.nodatayet.NoDataYet`) reports 0 in `xpu_exporter_collector_success` as for a failure,
since its figures are not there; but every start goes through that state, so it is logged at info, not
as a failure's warning (node_exporter's ErrNoData), and its end is not logged as a recovery.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from operator import itemgetter
from typing import NamedTuple

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector as PrometheusCollector

from vllm_xpu_exporter import __version__, buildinfo
from vllm_xpu_exporter.collector import CollectionError, Collector, ScrapeContext, Sources
from vllm_xpu_exporter.families import GaugeFamily, Row, RowFamily
from vllm_xpu_exporter.nodatayet import NoDataYet
from vllm_xpu_exporter.sources.levelzero.worker import LevelZeroUnavailable

log = logging.getLogger("vllm_xpu_exporter.scrape")


class Problem(NamedTuple):
    """Why a collector's run did not work: its error, and whether that is all its source starting."""

    text: str
    no_data_yet: bool  # the collector raised NoDataYet and nothing else went wrong: a state of every start


class _Flight:
    """One scrape's families, shared by every request that asked while it ran."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.families: list[Metric] = []


class ExporterCollector(PrometheusCollector):
    """The one collector registered with prometheus_client; it runs the enabled collectors."""

    def __init__(self, collectors: Sequence[Collector], sources: Sources) -> None:
        self._collectors = tuple(collectors)
        self._sources = sources
        self._lock = threading.Lock()
        self._in_flight: _Flight | None = None
        self._last_problems: dict[str, Problem | None] = {}

    def describe(self) -> list[Metric]:
        # Nothing to describe up front: registering must not run a scrape.
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            flight, leading = self._in_flight, self._in_flight is None
            if leading:
                flight = self._in_flight = _Flight()
        assert flight is not None
        if leading:
            try:
                flight.families = self._scrape()
            finally:
                with self._lock:
                    self._in_flight = None
                flight.done.set()
        else:
            flight.done.wait()
        return iter(flight.families)

    def _scrape(self) -> list[Metric]:
        build_info = GaugeFamily("xpu_exporter_build_info",
                                 "vllm-xpu-exporter's version, the source revision it was built from and its Python.",
                                 labels=["pythonversion", "revision", "version"])
        build_info.add_metric([buildinfo.python_version(), buildinfo.revision(), __version__], 1)
        families: list[Metric] = [build_info]

        success = GaugeFamily("xpu_exporter_collector_success",
                              "1 when the collector's last run worked, else 0.", labels=["collector"])
        duration = GaugeFamily("xpu_exporter_collector_duration_seconds",
                               "How long the collector's last run took.", labels=["collector"])
        context = ScrapeContext(self._sources)
        context.request_device_memory()
        problems: dict[str, Problem | None] = {}
        for collector in self._collectors:
            started = time.perf_counter()
            collected, problems[collector.name] = _run(collector, context)
            duration.add_metric([collector.name], time.perf_counter() - started)
            success.add_metric([collector.name], 0 if problems[collector.name] else 1)
            families += collected
        self._sources.watch_units(unit for collector in self._collectors for unit in collector.units_on_gpus())
        families += [success, duration]
        self._log_transitions(problems)
        return families

    def _log_transitions(self, problems: dict[str, Problem | None]) -> None:
        """Log a failure when it starts or changes, and the recovery; never every scrape. Collectors
        failing for one reason (one source) share one line. No data yet (`Problem.no_data_yet`) is logged
        at info when it begins, and nothing when data comes."""
        previous, self._last_problems = self._last_problems, problems
        started: dict[str, list[str]] = {}
        waiting: dict[str, list[str]] = {}
        for name, problem in problems.items():
            before = previous.get(name)
            if problem == before:
                continue
            if problem is None:
                if before is not None and not before.no_data_yet:
                    log.info("collector %s works again", name)
            else:
                (waiting if problem.no_data_yet else started).setdefault(problem.text, []).append(name)
        for error, names in waiting.items():
            log.info("collector %s has no data yet: %s", ",".join(names), error)
        for error, names in started.items():
            log.warning("collector %s failed: %s", ",".join(names), error)


def _run(collector: Collector, context: ScrapeContext) -> tuple[list[Metric], Problem | None]:
    families: list[Metric] = []
    error_text = None
    no_data_yet = False
    try:
        for family in collector.collect(context):
            families.append(family)
    except Exception as error:  # a failing source costs its own series, never the scrape
        if not isinstance(error, (CollectionError, LevelZeroUnavailable, NoDataYet)):
            log.debug("collector %s raised", collector.name, exc_info=True)
        error_text = str(error) or type(error).__name__
        no_data_yet = isinstance(error, NoDataYet)
    dropped = _drop_unexposable(families)
    texts = [text for text in (error_text, dropped) if text]
    return families, Problem("; ".join(texts), no_data_yet and not dropped) if texts else None


def _drop_unexposable(families: list[Metric]) -> str | None:
    """Drop the samples the exposition could not write, or that are not finite numbers, so that they
    cost their own collector (marked failed) and never the whole scrape; say what was dropped."""
    dropped: list[str] = []
    for family in families:
        if isinstance(family, RowFamily):
            rows = family.rows
            if _rows_exposable(rows):
                continue
            kept_rows = [row for row in rows if _number_exposable(row[1]) and _texts_exposable(row[0])]
            if len(kept_rows) != len(rows):
                dropped.append(f"{len(rows) - len(kept_rows)} samples of {family.name}")
                family.rows = kept_rows
            continue
        samples = family.samples
        kept = [sample for sample in samples
                if _number_exposable(sample.value) and _texts_exposable(sample.labels.values())]
        if len(kept) != len(samples):
            dropped.append(f"{len(samples) - len(kept)} samples of {family.name}")
            family.samples = kept
    if not dropped:
        return None
    return "dropped " + ", ".join(dropped) + ": value not a finite number or label not UTF-8"


def _rows_exposable(rows: list[Row]) -> bool:
    """Whether every row is, checked in a few C loops; False also when some row might not be (the
    sum overflowed, a label is not ASCII): then each row is checked."""
    try:
        # A sum with a nan or an infinity in it is not finite, so a finite sum has none.
        return (math.isfinite(sum(map(itemgetter(1), rows)))
                and "".join(chain.from_iterable(map(itemgetter(0), rows))).isascii())
    except (TypeError, ValueError, OverflowError):  # a value or label of the wrong type; an int too big
        return False


def _number_exposable(value: object) -> bool:
    if type(value) is float:
        return math.isfinite(value)
    try:
        return math.isfinite(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):  # an int of 309+ digits overflows a float
        return False


def _texts_exposable(texts: Iterable[object]) -> bool:
    """Label values come from sources and can be anything: str and UTF-8, else not exposable."""
    return all(type(text) is str and (text.isascii() or _utf8_encodable(text)) for text in texts)


def _utf8_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True

