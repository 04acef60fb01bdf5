"""Collectors: one per source family, each a thin mapping from a source's readings to metric families.

A collector's `collect(scrape)` yields metric families. Raising (after yielding what it could) marks
that collector's run as failed in `xpu_exporter_collector_success`; what it yielded before is kept.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

from prometheus_client.metrics_core import Metric

if TYPE_CHECKING:
    from exporter.scrape import Scrape


class CollectionError(Exception):
    """A collector could not read (all of) its source; the message is one line for the log."""


class Collector(ABC):
    name: ClassVar[str]
    description: ClassVar[str]

    @abstractmethod
    def collect(self, scrape: Scrape) -> Iterator[Metric]:
        """Yield this collector's metric families for one scrape."""

    def start(self) -> None:
        """Begin background work (watchers, followers) once the server is about to serve."""

    def stop(self) -> None:
        """End background work."""
