"""What a collector is, how it registers, and what it may read during a scrape.

A collector is a thin mapping from the readings of shared sources to metric families. Each collector
module registers itself with `register`: name, description, default on/off, the sources it needs, its own
flags (`--collector.NAME.OPTION`, added by `add_flags`), how its own options are made from the parsed
command line (`options`), and a factory that builds it from those options and the sources. A collector
never sees the whole command line, and this module imports neither the command line nor any collector:
the command line (`vllm_xpu_exporter.cli`) imports the collectors (`vllm_xpu_exporter.collectors`), makes the
`--collector.NAME` / `--no-collector.NAME` flags and each collector's own from the registry, builds the
sources the enabled collectors need once (`Sources`), and starts them. During a scrape a collector reads
sources only through its `ScrapeContext`, which reads each source at most once per scrape, so collectors
share readings without ever calling one another; none writes to a source: what a collector finds that a
source needs (the units on GPUs, which the journal watches) the scrape hands on after every collector ran
(`Sources.watch_units`).
"""

from __future__ import annotations

import argparse
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from prometheus_client.metrics_core import Metric

from vllm_xpu_exporter.fold.engine_starts import UnitView, merged_views
from vllm_xpu_exporter.sources.containers import Workload
from vllm_xpu_exporter.sources.dmem import DmemReading
from vllm_xpu_exporter.sources.levelzero.worker import LevelZeroUnavailable
from vllm_xpu_exporter.sources.procfs import ProcfsUnavailable
from vllm_xpu_exporter.sources.udev import DrmNodes

if TYPE_CHECKING:
    from vllm_xpu_exporter.parsers.cgroup import UnitCgroup
    from vllm_xpu_exporter.runtimes import ContainerCgroup
    from vllm_xpu_exporter.sources.containers import ContainerNames
    from vllm_xpu_exporter.sources.dmem import DmemReader
    from vllm_xpu_exporter.sources.endpoints import Endpoint, EndpointFinder
    from vllm_xpu_exporter.sources.logs.follower import LogFollower, LogState
    from vllm_xpu_exporter.sources.plan_dropins import UnitPlans
    from vllm_xpu_exporter.sources.levelzero.worker import DeviceMemory, DeviceProcesses, LevelZeroWorker, PendingRead
    from vllm_xpu_exporter.sources.privileged import PrivilegedReader, RemoteDrmClientScanner, RemoteEndpointFinder
    from vllm_xpu_exporter.sources.procfs import DrmClientScanner, ScanResult
    from vllm_xpu_exporter.sources.udev import DrmNodeNames

T = TypeVar("T")
O = TypeVar("O")  # a collector's own options


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

    def units_on_gpus(self) -> Iterable[str]:
        """The units this collector found holding GPU memory at its last run: the scrape hands them to the
        sources after every collector ran (`Sources.watch_units`); a collector never writes to a source."""
        return ()


class Source(StrEnum):
    """The shared sources a collector can need."""

    LEVELZERO = "levelzero"
    LEVELZERO_TELEMETRY = "levelzero telemetry"  # Level Zero, with the telemetry read on every request
    JOURNAL = "journal"
    DRM_CLIENTS = "drm clients"  # the processes' DRM clients and cgroups under --path.procfs
    DMEM = "dmem"  # the units' dmem.current under --path.sysfs
    CONTAINER_NAMES = "container names"  # the container engines' state on disk (--path.docker, ...)
    VLLM_ENDPOINTS = "vllm endpoints"  # the units' vLLM API endpoints, from their processes' sockets
    UNIT_PLANS = "unit plans"  # the budgets vllm-xpu-plan's drop-ins give the units (--collector.processes.plans)


@dataclass
class Sources:
    """The shared sources, built once for the enabled collectors; None: no enabled collector needs it."""

    levelzero: LevelZeroWorker | None = None
    drm_nodes: DrmNodeNames | None = None  # with Level Zero: GPU hot-plug events and DRM node names
    journal: LogFollower | None = None
    container_logs: LogFollower | None = None  # with the journal: containers' log files (--logs.*), if any
    drm_clients: DrmClientScanner | RemoteDrmClientScanner | None = None
    dmem: DmemReader | None = None
    container_names: ContainerNames | None = None
    vllm_endpoints: EndpointFinder | RemoteEndpointFinder | None = None
    # the child that reads other processes' fds for the two above, when the service separates privileges
    privileged: PrivilegedReader | None = None
    unit_plans: UnitPlans | None = None

    def start(self) -> None:
        if self.journal is not None:
            self.journal.start()
        if self.container_logs is not None:
            self.container_logs.start()
        if self.drm_nodes is not None:
            self.drm_nodes.start()
        if self.levelzero is not None:
            self.levelzero.start()

    def watch_units(self, units: Iterable[str]) -> None:
        """Units that hold GPU memory now (what the collectors found, handed on by the scrape): the journal
        watches those matching its globs even before it has seen them."""
        if self.journal is not None:
            self.journal.watch(set(units))

    def stop(self) -> None:
        if self.journal is not None:
            self.journal.stop()
        if self.container_logs is not None:
            self.container_logs.stop()
        if self.drm_nodes is not None:
            self.drm_nodes.stop()
        if self.levelzero is not None:
            self.levelzero.close()
        if self.drm_clients is not None:
            self.drm_clients.close()
        if self.privileged is not None:
            self.privileged.close()


class ScrapeContext:
    """What the collectors of one scrape read: each source at most once, the same answer (or the same
    failure) for every collector of the scrape. A read that takes what to read from the collector (dmem's
    units, a process's unit, a container's names, the endpoints of some cgroups) is made as asked."""

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

    def journal_state(self) -> LogState | None:
        """The journal fold's state, or None when the journal is not read (its collector is disabled)."""
        journal = self._sources.journal
        return None if journal is None else self._once("journal_state", journal.state)

    def container_logs_state(self) -> LogState | None:
        """The fold of the containers' log files, or None when none are read (no --logs.*)."""
        follower = self._sources.container_logs
        return None if follower is None else self._once("container_logs_state", follower.state)

    def engine_views(self) -> list[UnitView]:
        """Every watched unit's and container's engine view, from the journal's fold and the container logs'
        (`merged_views`): one list for every collector, so a container read from log files has the series a
        unit or a journald container has."""
        states = [state for state in (self.journal_state(), self.container_logs_state()) if state is not None]
        return self._once("engine_views", lambda: merged_views(state.views for state in states))

    def journal_matches(self, units: Iterable[str]) -> set[str]:
        """Those of `units` the journal watches when they have GPU processes (they match its `--journal.units`
        globs and are not the exporter's own unit); none when the journal is not read."""
        journal = self._sources.journal
        if journal is None:
            return set()
        return {unit for unit in units if journal.selection.matches_unit(unit)}

    def drm_nodes(self, pci_address: str) -> DrmNodes:
        """The DRM node names (card, render node) of the GPU at `pci_address`, from udev; empty ones when udev
        does not know them or is not read."""
        names = self._sources.drm_nodes
        return DrmNodes() if names is None else names.get(pci_address)

    def drm_clients(self) -> ScanResult:
        """The processes' DRM clients under --path.procfs: one scan per scrape. Raises ProcfsUnavailable when
        the procfs root cannot be read, or when no enabled collector needs the scan."""
        return self._once("drm_clients", lambda: self._drm_client_scanner().scan())

    def unit_cgroup_of(self, pid: int) -> UnitCgroup | None:
        """The unit (and cgroup path) of process `pid`, as the DRM clients' scan reads it; None when not known
        or not read."""
        scanner = self._sources.drm_clients
        return None if scanner is None else scanner.unit_cgroup_of(pid)

    def dmem(self, cgroups_of_unit: Mapping[str, Iterable[str]]) -> DmemReading:
        """The dmem.current of these units (unit -> its cgroup paths); nothing when dmem is not read."""
        reader = self._sources.dmem
        return DmemReading() if reader is None else reader.read(cgroups_of_unit)

    def workload(self, unit: str, container: ContainerCgroup | None) -> Workload:
        """Who cgroup leaf `unit` is: its container's names from the engines' state on disk (None: no
        container's, the leaf's own name); the leaf when containers' names are not read."""
        names = self._sources.container_names
        return Workload(unit) if names is None else names.workload(unit, container)

    def container_state_files_cut(self) -> int:
        """How many engine state files the containers' names have not read for their size (so far)."""
        names = self._sources.container_names
        return 0 if names is None else names.cut

    def vllm_endpoints(self, cgroup_paths: Iterable[str]) -> dict[str, Endpoint]:
        """cgroup path -> its vLLM API endpoint, for those of `cgroup_paths` that run one; none when endpoints
        are not looked for. Raises ProcfsUnavailable when --path.procfs cannot be listed."""
        finder = self._sources.vllm_endpoints
        return {} if finder is None else finder.find(cgroup_paths)

    def unit_plans(self, units: Iterable[str]) -> tuple[dict[str, int], list[str]]:
        """unit -> the KV budget its plan's drop-in names (units without one absent), and a line for each drop-in
        not believed; nothing when the plans are not read."""
        plans = self._sources.unit_plans
        return ({}, []) if plans is None else plans.plans(units)

    def _drm_client_scanner(self) -> DrmClientScanner | RemoteDrmClientScanner:
        if self._sources.drm_clients is None:
            raise ProcfsUnavailable("the processes' DRM clients are not read: no enabled collector needs them")
        return self._sources.drm_clients

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


Factory = Callable[[O, Sources], Collector]  # the collector, from its own options and the shared sources
AddFlags = Callable[[argparse._ArgumentGroup], None]  # adds its own flags to the command line's collectors group
MakeOptions = Callable[[argparse.Namespace, frozenset[str]], O]  # its options: parsed flags, enabled collectors


def no_flags(collectors: argparse._ArgumentGroup) -> None:
    """A collector without flags of its own."""


def no_options(args: argparse.Namespace, enabled: frozenset[str]) -> None:
    """A collector without options: its factory gets None."""


@dataclass(frozen=True)
class CollectorSpec(Generic[O]):
    """A registered collector: what `register` was given."""

    name: str
    description: str
    needs: frozenset[Source]
    factory: Factory[O]
    add_flags: AddFlags = no_flags
    options: MakeOptions[O] = no_options
    enabled_by_default: bool = True


_registry: dict[str, CollectorSpec[Any]] = {}  # filled as the collector modules are imported


def register(name: str, description: str, needs: Iterable[Source] = (), enabled_by_default: bool = True, *,
             add_flags: AddFlags = no_flags, options: MakeOptions[O] = no_options
             ) -> Callable[[Factory[O]], Factory[O]]:
    """Decorates a collector's factory: `@register("journal", "...", needs=[Source.JOURNAL])`. A collector with
    options of its own also gives `add_flags(group)`, which adds its `--collector.NAME.OPTION` flags to the
    collectors group, and `options(args, enabled)`, which makes its options from the parsed command line and
    the names of the enabled collectors; its factory then gets those options (else None)."""

    def decorate(factory: Factory[O]) -> Factory[O]:
        if name in _registry:
            raise ValueError(f"collector {name!r} is registered twice")
        _registry[name] = CollectorSpec(name, description, frozenset(needs), factory, add_flags, options,
                                        enabled_by_default)
        return factory

    return decorate


def registered() -> tuple[CollectorSpec[Any], ...]:
    """Every registered collector, in the order they registered: those of the collector modules imported so far
    (importing `vllm_xpu_exporter.collectors`, as the command line does, registers the bundled ones)."""
    return tuple(_registry.values())
