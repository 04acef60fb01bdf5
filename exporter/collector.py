"""What a collector is, how it registers, and what it may read during a scrape.

A collector is a thin mapping from the readings of shared sources to metric families. Each collector
module registers itself with `register` (name, description, default on/off, the sources it needs and a
factory); the command line makes the `--collector.NAME` / `--no-collector.NAME` flags from the registry,
builds the sources the enabled collectors need once (`Sources`), and starts them. During a scrape a
collector reads sources only through its `ScrapeContext`, which reads each source at most once per
scrape, so collectors share readings without ever calling one another.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar, TypeVar

from prometheus_client.metrics_core import Metric

from exporter.sources.levelzero.worker import LevelZeroUnavailable

if TYPE_CHECKING:
    from exporter.cli import Options
    from exporter.sources.journal.follower import JournalFollower, JournalState
    from exporter.sources.levelzero.worker import DeviceMemory, DeviceProcesses, LevelZeroWorker, PendingRead
    from exporter.sources.udev import DrmNodeNames

T = TypeVar("T")


class CollectionError(Exception):
    """A collector could not read (all of) its source; the message is one line for the log."""


class Collector(ABC):
    """`collect(context)` yields metric families. Raising (after yielding what it could) marks the
    collector's run as failed in `xpu_exporter_collector_success`; what it yielded before is kept."""

    name: ClassVar[str]

    @abstractmethod
    def collect(self, context: ScrapeContext) -> Iterator[Metric]:
        """Yield this collector's metric families for one scrape."""

    def start(self) -> None:
        """Begin background work the collector owns, once the server is about to serve."""

    def stop(self) -> None:
        """End background work."""


class Source(StrEnum):
    """The shared sources a collector can need."""

    LEVELZERO = "levelzero"
    LEVELZERO_TELEMETRY = "levelzero telemetry"  # Level Zero, with the telemetry read on every request
    JOURNAL = "journal"


@dataclass
class Sources:
    """The shared sources, built once for the enabled collectors; None: no enabled collector needs it."""

    levelzero: LevelZeroWorker | None = None
    drm_nodes: DrmNodeNames | None = None  # with Level Zero: GPU hot-plug events and DRM node names
    journal: JournalFollower | None = None

    def start(self) -> None:
        if self.journal is not None:
            self.journal.start()
        if self.drm_nodes is not None:
            self.drm_nodes.start()
        if self.levelzero is not None:
            self.levelzero.start()

    def stop(self) -> None:
        if self.journal is not None:
            self.journal.stop()
        if self.drm_nodes is not None:
            self.drm_nodes.stop()
        if self.levelzero is not None:
            self.levelzero.close()


class ScrapeContext:
    """What the collectors of one scrape read: each source at most once, the same answer (or the same
    failure) for every collector of the scrape."""

    def __init__(self, sources: Sources) -> None:
        self._sources = sources
        self._memo: dict[str, tuple[object, BaseException | None]] = {}

    def request_device_memory(self) -> None:
        """Ask Level Zero for the devices' memory now, when it is in use: its child works while the
        collectors that read other sources run, and device_memory() waits only for the rest."""
        if self._sources.levelzero is not None:
            try:
                self._memory_request()
            except LevelZeroUnavailable:
                pass  # remembered: device_memory() raises it for each collector that reads it

    def device_memory(self) -> list[DeviceMemory]:
        return self._once("device_memory", lambda: self._memory_request().result())

    def device_processes(self) -> list[DeviceProcesses]:
        return self._once("device_processes", lambda: self._levelzero().read_processes())

    def journal_state(self) -> JournalState | None:
        """The journal fold's state, or None when the journal is not read (its collector is disabled)."""
        journal = self._sources.journal
        return None if journal is None else self._once("journal_state", journal.state)

    def journal_matches(self, units: Iterable[str]) -> set[str]:
        """Those of `units` the journal watches when they have GPU processes (they match its `--journal.units`
        globs and are not the exporter's own unit); none when the journal is not read."""
        journal = self._sources.journal
        if journal is None:
            return set()
        return {unit for unit in units if journal.selection.matches_unit(unit)}

    def watch_units(self, units: Iterable[str]) -> None:
        """Units that hold GPU memory now: the journal watches those matching its globs even before it
        has seen them."""
        if self._sources.journal is not None:
            self._sources.journal.watch(set(units))

    def _memory_request(self) -> PendingRead[DeviceMemory]:
        return self._once("memory_request", lambda: self._levelzero().request_memory())

    def _levelzero(self) -> LevelZeroWorker:
        if self._sources.levelzero is None:
            raise LevelZeroUnavailable("Level Zero is not in use: no enabled collector needs it")
        return self._sources.levelzero

    def _once(self, key: str, read: Callable[[], T]) -> T:
        if key not in self._memo:
            try:
                self._memo[key] = (read(), None)
            except Exception as error:  # remembered so that the next collector sees the same failure
                self._memo[key] = (None, error)
        value, error = self._memo[key]
        if error is not None:
            raise error
        return value  # type: ignore[return-value]


@dataclass(frozen=True)
class CollectorSpec:
    name: str
    description: str
    needs: frozenset[Source]
    factory: Callable[[Options, Sources], Collector]
    enabled_by_default: bool = True


_registry: dict[str, CollectorSpec] = {}  # filled as the collector modules are imported


def register(name: str, description: str, needs: Iterable[Source] = (), enabled_by_default: bool = True
             ) -> Callable[[Callable[[Options, Sources], Collector]], Callable[[Options, Sources], Collector]]:
    """Decorates a collector's factory: `@register("journal", "...", needs=[Source.JOURNAL])`."""

    def decorate(factory: Callable[[Options, Sources], Collector]) -> Callable[[Options, Sources], Collector]:
        if name in _registry:
            raise ValueError(f"collector {name!r} is registered twice")
        _registry[name] = CollectorSpec(name, description, frozenset(needs), factory, enabled_by_default)
        return factory

    return decorate


def registered() -> tuple[CollectorSpec, ...]:
    """Every registered collector, in the order the collector modules registered them."""
    import exporter.collectors  # noqa: F401  (imported here, not above: the collector modules import this one)

    return tuple(_registry.values())
