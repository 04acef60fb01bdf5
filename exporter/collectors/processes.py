"""Device memory per systemd unit, the unattributed rest, and whether a unit could restart now.

Per device, the first source that works: DRM fdinfo under --path.procfs (each DRM client counted once),
else Level Zero's process list (zesDeviceProcessesGetState; upstream i915 does not support it).

Per unit and device, also the engine counters of the fdinfo read (busy seconds, xe's cycles and total
cycles). They are sums over the unit's live DRM clients: when a process exits or closes a client, its
share goes with it and the unit's counter goes down, which rate() treats as a counter reset. The
recording rule unit:xpu_unit_engine_busy:ratio (rules/) joins the two drivers' counters into one ratio.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric

from exporter.collector import CollectionError, Collector, ScrapeContext, Source, Sources, register
from exporter.families import CounterFamily, GaugeFamily
from exporter.sources import procfs
from exporter.sources.levelzero_worker import DeviceMemory, DeviceProcesses, LevelZeroUnavailable

if TYPE_CHECKING:
    from exporter.cli import Options

log = logging.getLogger("exporter.processes")

FDINFO = "fdinfo"
LEVELZERO = "levelzero"


@dataclass(frozen=True)
class Attribution:
    """Who holds a device's memory, as one source sees it."""

    source: str
    by_unit: dict[str, int]
    total: int  # all clients of the device, with or without a unit


class ProcessesCollector(Collector):
    name = "processes"

    def __init__(self, procfs_root: str = "/proc", reports_levelzero: bool = False) -> None:
        """`reports_levelzero`: the levelzero collector is disabled, so a Level Zero failure that costs this
        collector its unattributed rest and headroom is reported here, or nowhere."""
        self._reports_levelzero = reports_levelzero
        self._scanner = procfs.DrmClientScanner(procfs_root)
        self._last_device_of_unit: dict[str, str] = {}
        self._warned_unreadable = False

    def stop(self) -> None:
        self._scanner.close()

    def collect(self, context: ScrapeContext) -> Iterator[Metric]:
        problems: list[str] = []
        scan = self._scan(problems)
        devices = self._device_memory(context, problems)
        # fdinfo keys a client without drm-pdev by its DRM minor ("226:N"): not a PCI GPU
        pci_addresses = sorted({d.identity.pci_address for d in devices or ()} |
                               {device for device in (scan.memory_by_device if scan else ())
                                if not device.startswith(f"{procfs.DRM_MAJOR}:")})
        attributions: dict[str, Attribution] = {}
        for pci in pci_addresses:
            attribution = self._from_fdinfo(scan, pci) or self._from_levelzero(context, pci)
            if attribution is None:
                problems.append(f"{pci}: no per-process source works (fdinfo has no memory figures for it and "
                                f"Level Zero's process list failed)")
            else:
                attributions[pci] = attribution

        source = GaugeFamily("xpu_memory_attribution_info",
                                   "Which source attributes the device's memory to processes: fdinfo or levelzero.",
                                   labels=["device", "source"])
        unit_memory = GaugeFamily("xpu_unit_memory_bytes", "Device memory held by all processes of the unit.",
                                        labels=["device", "unit"])
        context.watch_units(unit for attribution in attributions.values() for unit in attribution.by_unit)
        for pci, attribution in attributions.items():
            source.add_metric([pci, attribution.source], 1)
            for unit, held in sorted(attribution.by_unit.items()):
                unit_memory.add_metric([pci, unit], held)
        yield source
        yield unit_memory
        yield from self._engine_use(scan)
        if devices is not None:
            yield from self._against_device_memory(devices, attributions, self._watched_settings(context))
        if problems:
            raise CollectionError("; ".join(problems))

    @staticmethod
    def _engine_use(scan: procfs.ScanResult | None) -> Iterator[Metric]:
        busy = CounterFamily(
            "xpu_unit_engine_busy_seconds_total",
            "Engine busy time of the unit's DRM clients (drm-engine-<engine>, divided by the engine class's "
            "capacity); goes down when a client closes.", labels=["device", "unit", "engine"])
        cycles = CounterFamily(
            "xpu_unit_engine_cycles_total", "GPU cycles the unit's DRM clients kept the engine busy (xe's drm-cycles); "
            "goes down when a client closes.", labels=["device", "unit", "engine"])
        total_cycles = CounterFamily(
            "xpu_unit_engine_total_cycles_total", "The GPU clock the cycles count against (xe's drm-total-cycles), the "
            "largest of the unit's DRM clients.", labels=["device", "unit", "engine"])
        for device, by_unit in sorted((scan.engines_by_device_unit if scan else {}).items()):
            if device.startswith(f"{procfs.DRM_MAJOR}:"):
                continue  # not a PCI GPU (see collect)
            for unit, use in sorted(by_unit.items()):
                for engine, seconds in sorted(use.busy_seconds.items()):
                    busy.add_metric([device, unit, engine], seconds)
                for engine, count in sorted(use.cycles.items()):
                    cycles.add_metric([device, unit, engine], count)
                for engine, count in sorted(use.total_cycles.items()):
                    total_cycles.add_metric([device, unit, engine], count)
        yield from (busy, cycles, total_cycles)

    def _scan(self, problems: list[str]) -> procfs.ScanResult | None:
        try:
            scan = self._scanner.scan()
        except procfs.ProcfsUnavailable as error:
            problems.append(str(error))
            return None
        if scan.unreadable and not self._warned_unreadable:
            self._warned_unreadable = True
            log.warning("%d processes' fdinfo could not be read: give the exporter CAP_SYS_PTRACE and "
                        "CAP_DAC_READ_SEARCH (or run it as root) to see every GPU process", scan.unreadable)
        return scan

    def _device_memory(self, context: ScrapeContext, problems: list[str]) -> list[DeviceMemory] | None:
        """The devices' memory, or None when Level Zero cannot say; without it (or without a device's free
        memory) there is no unattributed rest and no headroom. The levelzero collector reports why, unless
        it is disabled: then this collector does."""
        try:
            devices = context.device_memory()
        except LevelZeroUnavailable as error:
            if self._reports_levelzero:
                problems.append(str(error))
            return None
        if self._reports_levelzero:
            problems.extend(f"{device.identity.pci_address}: {device.error}" for device in devices if device.error)
        return devices

    @staticmethod
    def _from_fdinfo(scan: procfs.ScanResult | None, pci: str) -> Attribution | None:
        if scan is None:
            return None
        if pci in scan.memory_by_device:
            if not scan.memory_keys_seen:
                return None  # clients, but a kernel that prints no memory keys (6.1 i915)
            return Attribution(FDINFO, dict(scan.memory_by_device_unit.get(pci, {})), scan.memory_by_device[pci])
        if scan.unreadable:
            return None  # no client seen, but some processes could not be looked at
        return Attribution(FDINFO, {}, 0)

    def _from_levelzero(self, context: ScrapeContext, pci: str) -> Attribution | None:
        try:
            readings = context.device_processes()
        except LevelZeroUnavailable:
            return None
        reading = next((r for r in readings if r.identity.pci_address == pci), None)
        if reading is None or reading.error:
            return None
        return self._attribute(reading)

    def _attribute(self, reading: DeviceProcesses) -> Attribution:
        by_unit: dict[str, int] = {}
        for process in reading.processes:
            unit = self._scanner.unit_of(process.pid)
            if unit is not None:
                by_unit[unit] = by_unit.get(unit, 0) + process.mem_size
        return Attribution(LEVELZERO, by_unit, sum(p.mem_size for p in reading.processes))

    def _against_device_memory(self, devices: list[DeviceMemory], attributions: dict[str, Attribution],
                               watched: list[tuple[str, float]]) -> Iterator[Metric]:
        unattributed = GaugeFamily("xpu_unattributed_memory_bytes",
                                         "Used device memory that no process accounts for (never negative).",
                                         labels=["device"])
        overcounted = GaugeFamily("xpu_memory_attribution_overcounted",
                                        "1 when the processes' memory adds up to more than the device's used "
                                        "memory (the unattributed rest is then clamped at 0).", labels=["device"])
        headroom = GaugeFamily("xpu_unit_restart_headroom_bytes",
                                     "free + the unit's own memory - ceil(gpu_memory_utilization x total): the "
                                     "free memory vLLM (0.16+) demands at start; negative: a restart now would fail.",
                                     labels=["device", "unit"])
        # Only devices whose free memory was read: no rest or headroom from a figure that is not known.
        memory: dict[str, tuple[int, int]] = {}  # device -> (total, free), each summed over its modules once
        for device in devices:
            total, free = device.total, device.free
            if total is not None and free is not None:
                memory[device.identity.pci_address] = (total, free)
        for pci, attribution in attributions.items():
            if pci not in memory:
                continue
            total, free = memory[pci]
            used = total - free
            unattributed.add_metric([pci], max(0, used - attribution.total))
            overcounted.add_metric([pci], 1 if attribution.total > used else 0)
        gpus = [d.identity.pci_address for d in devices]
        for unit, utilisation in watched:
            pci = self._device_of(unit, attributions, gpus)
            if pci not in memory:
                continue
            total, free = memory[pci]
            own = attributions[pci].by_unit.get(unit, 0) if pci in attributions else 0
            headroom.add_metric([pci, unit], free + own - math.ceil(utilisation * total))
        yield from (unattributed, overcounted, headroom)

    def _watched_settings(self, context: ScrapeContext) -> list[tuple[str, float]]:
        """(unit, gpu_memory_utilization) of the watched units whose setting is known."""
        state = context.journal_state()
        if state is None:
            return []
        return [(view.unit, view.gpu_memory_utilization) for view in state.views
                if view.gpu_memory_utilization is not None]

    def _device_of(self, unit: str, attributions: dict[str, Attribution], gpus: list[str]) -> str | None:
        """The GPU the unit holds (or last held) memory on; on a one-GPU host, that GPU."""
        for pci, attribution in attributions.items():
            if attribution.by_unit.get(unit):
                self._last_device_of_unit[unit] = pci
        pci = self._last_device_of_unit.get(unit)
        if pci in gpus:
            return pci
        return gpus[0] if len(gpus) == 1 else None


@register("processes", "per-unit device memory from processes", needs=[Source.LEVELZERO])
def _processes_collector(options: Options, sources: Sources) -> ProcessesCollector:
    return ProcessesCollector(options.procfs, reports_levelzero="levelzero" not in options.collectors)
