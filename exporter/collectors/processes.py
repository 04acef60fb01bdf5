"""Device memory per systemd unit, the unattributed rest, and whether a unit could restart now.

Per device, the first source that works: DRM fdinfo under --path.procfs (each DRM client counted once),
else Level Zero's process list (zesDeviceProcessesGetState; upstream i915 does not support it). Per unit
and device, the kernel's dmem cgroup controller wins over both: when the unit's cgroup has dmem.current
and it lists the device's VRAM regions, the unit's memory on the device is their sum (a region listed
with 0 is 0 bytes from dmem); a dmem.current that lists no region of the device (its driver registers
none: i915) leaves the unit to the device's other source. The units asked about dmem are those whose
processes hold DRM clients, those of Level Zero's process list when it is read, and those of processes
whose fds the exporter may not read (no CAP_SYS_PTRACE: their cgroup file is world-readable, and dmem
needs no ptrace); a unit known only from dmem is reported on a device where it holds memory (> 0).
`xpu_memory_attribution_info` has one series per source that attributed a unit on the device; the
unattributed rest is used - the units' memory, whatever its source, - what the other source counts for
processes outside any unit.

Per unit and device, also the engine counters of the fdinfo read (busy seconds, xe's cycles and total
cycles). They are sums over the unit's live DRM clients: when a process exits or closes a client, its
share goes with it and the unit's counter goes down, which rate() treats as a counter reset. The
recording rule unit:xpu_unit_engine_busy:ratio (rules/) joins the two drivers' counters into one ratio.

At most --collector.processes.max-units units (default 64, as --journal.max-units) have series of their own
(`choose_units`: units the journal watches first, then those holding the most device memory, a unit kept at
the previous scrape counting double so that units of about the same size do not swap places at every
scrape); the memory of the others is counted in their device's unattributed rest (so the units' series and
the rest still add up to used), their engine counters are dropped, and how many they are is the gauge
xpu_exporter_processes_units_dropped. Desktop sessions, containers or batch jobs each in a scope of their own
can hold DRM clients by the thousand: without the cap each would be a series on every device.

Per watched engine unit on a GPU whose total is known, the plan's figures (vllm_xpu_exporter.planning, the same as
vllm-xpu-plan's): its footprint and planned KV cache, and per GPU their sum, so that a GPU whose units cannot
all run at once shows on the dashboard and alerts. The unit's GPU is the one it holds (or last held) memory
on, or the only one. Beside them, the budget the planner's drop-in gives a unit, read from the drop-in
(vllm_xpu_exporter.sources.unitconfig), so that a plan an override took the command from shows.

Its options (`ProcessesOptions`): the host's /proc and /sys (--path.procfs, --path.sysfs), its unit cap
(--collector.processes.max-units, a flag it adds itself) and whether the levelzero collector is disabled.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from vllm_xpu_exporter.collector import CollectionError, Collector, ScrapeContext, Source, Sources, register
from vllm_xpu_exporter.discovery import Target, VllmTargets
from vllm_xpu_exporter import freememory
from vllm_xpu_exporter import memory as memory_rules
from vllm_xpu_exporter import planning
from vllm_xpu_exporter.families import CounterFamily, GaugeFamily
from vllm_xpu_exporter.flags import absolute_path, container_paths, positive_int
from vllm_xpu_exporter.fold.engine_starts import DEFAULT_MAX_UNITS, UnitView
from vllm_xpu_exporter.parsers.cgroup import ContainerCgroup, unit_cgroup_of_path
from vllm_xpu_exporter.sources import containers, dmem, endpoints, procfs, unitconfig
from vllm_xpu_exporter.sources.containers import ContainerNames, Workload
from vllm_xpu_exporter.sources.levelzero.worker import DeviceMemory, DeviceProcesses, LevelZeroUnavailable

log = logging.getLogger("vllm_xpu_exporter.processes")

DMEM = "dmem"
FDINFO = "fdinfo"
LEVELZERO = "levelzero"
# A unit that had series at the previous scrape ranks as if it held this many times its memory.
KEPT_UNIT_WEIGHT = 2
# Plans kept between scrapes (one per unit and its starts' figures); all dropped at once when full.
PLANS_KEPT = 1024


@dataclass(frozen=True)
class Attribution:
    """Who holds a device's memory, as one source sees it."""

    source: str
    by_unit: dict[str, int]
    total: int  # all clients of the device, with or without a unit
    # unit -> its cgroup paths, for the units this source found (Level Zero's: their pids' cgroup files)
    unit_cgroups: dict[str, set[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceAttribution:
    """Who holds a device's memory, per unit from whichever source served the unit."""

    sources: tuple[str, ...]  # those that attributed memory on the device, sorted
    by_unit: dict[str, int]
    total: int  # the units' memory and what the device's other source counts for processes outside any unit


def attribute_device(fallback: Attribution | None, dmem_of_unit: dict[str, int], holders: set[str]
                     ) -> DeviceAttribution | None:
    """One device's attribution: `fallback` (fdinfo, else Level Zero) per unit, except the units in
    `dmem_of_unit` (unit -> bytes of the device's VRAM regions in its dmem.current). A unit that only dmem
    knows is reported when it holds memory on the device, or when it is one of `holders` (units whose
    processes hold DRM clients on the device). None when neither dmem nor the fallback served the device."""
    if fallback is None and not dmem_of_unit:
        return None
    by_unit: dict[str, int] = {}
    source_of: dict[str, str] = {}
    if fallback is not None:
        by_unit.update(fallback.by_unit)
        source_of.update((unit, fallback.source) for unit in fallback.by_unit)
    for unit, held in dmem_of_unit.items():
        if held > 0 or unit in by_unit or unit in holders:
            by_unit[unit] = held
            source_of[unit] = DMEM
    outside_units = fallback.total - sum(fallback.by_unit.values()) if fallback is not None else 0
    sources = set(source_of.values()) or {fallback.source if fallback is not None else DMEM}
    return DeviceAttribution(tuple(sorted(sources)), by_unit, sum(by_unit.values()) + outside_units)


def choose_units(held: Mapping[str, int], preferred: set[str], kept_before: set[str], max_units: int) -> set[str]:
    """The units of `held` (unit -> device memory over all devices) that keep series of their own: all of
    them when they are at most `max_units`, else `max_units` of them: the `preferred` ones (the journal's
    watched units) first, then those holding the most memory, where a unit of `kept_before` (kept at the
    previous scrape) counts KEPT_UNIT_WEIGHT times its memory and wins a tie; then by name. Deterministic,
    and a unit whose memory wobbles near the cut keeps its place instead of flapping."""
    if len(held) <= max_units:
        return set(held)

    def rank(unit: str) -> tuple[bool, int, bool, str]:
        kept = unit in kept_before
        return unit not in preferred, -held[unit] * (KEPT_UNIT_WEIGHT if kept else 1), not kept, unit

    return set(sorted(held, key=rank)[:max_units])


def workloads_of(unit_cgroups: Mapping[str, Iterable[str]], names: ContainerNames,
                 known: dict[str, ContainerCgroup | None] | None = None) -> dict[str, Workload]:
    """unit (a cgroup leaf, `UnitCgroup.unit`) -> its workload: a systemd unit keeps its name; a container's
    cgroup (`UnitCgroup.container`, read again from the unit's cgroup paths) gets the key of its names
    (`docker/<name>`, `podman/<name>`, `k8s/<namespace>/<pod>/<container>`) when `names` finds them, else keeps
    the leaf. Whatever the state on disk holds, never raises: a failure keeps the leaf. `known`: path ->
    container of the paths read at the previous call, reused, and replaced by those of this call."""
    previous = known.copy() if known is not None else {}
    if known is not None:
        known.clear()
    workloads: dict[str, Workload] = {}
    for unit, paths in unit_cgroups.items():
        container: ContainerCgroup | None = None
        for path in sorted(paths):
            if path in previous:
                found = previous[path]
            else:
                unit_cgroup = unit_cgroup_of_path(path)
                found = unit_cgroup.container if unit_cgroup is not None else None
            if known is not None:
                known[path] = found
            if found is not None:
                container = found
                break
        try:
            workloads[unit] = names.workload(unit, container)
        except Exception:  # noqa: BLE001 (untrusted files on disk must never cost a scrape)
            log.debug("no workload for %s", unit, exc_info=True)
            workloads[unit] = Workload(unit)
    return workloads


def rename_attribution(attribution: DeviceAttribution, workloads: Mapping[str, Workload]) -> DeviceAttribution:
    """The attribution by workload (`Workload.unit`): units of one workload add up."""
    by_unit: dict[str, int] = {}
    for unit, held in attribution.by_unit.items():
        key = workloads[unit].unit if unit in workloads else unit
        by_unit[key] = by_unit.get(key, 0) + held
    return DeviceAttribution(attribution.sources, by_unit, attribution.total)


def rename_engine_use(engines: Mapping[str, Mapping[str, procfs.UnitEngineUse]], workloads: Mapping[str, Workload]
                      ) -> dict[str, dict[str, procfs.UnitEngineUse]]:
    """device -> workload -> engine counters: those of the units of one workload added up as the clients of
    one unit are (busy seconds and cycles summed, total cycles the largest)."""
    renamed: dict[str, dict[str, procfs.UnitEngineUse]] = {}
    for device, by_unit in engines.items():
        by_workload = renamed.setdefault(device, {})
        for unit, use in by_unit.items():
            key = workloads[unit].unit if unit in workloads else unit
            known = by_workload.get(key)
            by_workload[key] = use if known is None else _added(known, use)
    return renamed


def _added(one: procfs.UnitEngineUse, other: procfs.UnitEngineUse) -> procfs.UnitEngineUse:
    use = procfs.UnitEngineUse(dict(one.busy_seconds), dict(one.cycles), dict(one.total_cycles))
    for engine, seconds in other.busy_seconds.items():
        use.busy_seconds[engine] = use.busy_seconds.get(engine, 0.0) + seconds
    for engine, count in other.cycles.items():
        use.cycles[engine] = use.cycles.get(engine, 0) + count
    for engine, count in other.total_cycles.items():
        use.total_cycles[engine] = max(use.total_cycles.get(engine, 0), count)
    return use


def workload_info(workloads: Mapping[str, Workload], kept: set[str]) -> GaugeFamily:
    """xpu_workload_info: one series per unit with series of its own at this scrape (`kept`), = 1, with what
    is known of it; of several units of one workload (a restarted pod's old and new container, both still
    holding the GPU), the first by leaf."""
    info = GaugeFamily("xpu_workload_info",
                       "Who the unit label names: kind (systemd, docker, podman, k8s), the container's id, name and "
                       "Compose project and service, the pod's namespace, name and uid (empty where they do not "
                       "apply or are not known); one series per unit with per-unit series, to join on unit.",
                       labels=list(containers.INFO_LABELS))
    by_key: dict[str, Workload] = {}
    for unit in sorted(workloads):
        by_key.setdefault(workloads[unit].unit, workloads[unit])
    for unit in sorted(kept):
        info.add_metric(by_key.get(unit, Workload(unit)).labels(), 1)
    return info


class ProcessesCollector(Collector):
    name = "processes"

    def __init__(self, procfs_root: str = "/proc", reports_levelzero: bool = False,
                 sysfs_root: str = dmem.DEFAULT_SYSFS, max_units: int = DEFAULT_MAX_UNITS,
                 names: ContainerNames | None = None, targets: VllmTargets | None = None,
                 sd_host_address: str = endpoints.DEFAULT_HOST_ADDRESS,
                 unit_plans: unitconfig.UnitPlans | None = None) -> None:
        """`reports_levelzero`: the levelzero collector is disabled, so a Level Zero failure that costs this
        collector its unattributed rest and headroom is reported here, or nowhere. `max_units`: at most this
        many units have series of their own (see choose_units). `names`: where containers' names are read
        (default: the engines' standard locations). `targets`: where the units' vLLM API endpoints found at each
        scrape are published (/sd/vllm); `sd_host_address` stands for every address of the host's network
        namespace there. `unit_plans`: where the planner's budget of each unit is read (its drop-ins); None: not read."""
        self._unit_plans = unit_plans
        self._reports_levelzero = reports_levelzero
        self._max_units = max_units
        self._kept_units: set[str] = set()
        self._warned_dropped = False
        self._scanner = procfs.DrmClientScanner(procfs_root)
        self._dmem = dmem.DmemReader(sysfs_root)
        self._names = names if names is not None else ContainerNames()
        self._containers_of_paths: dict[str, ContainerCgroup | None] = {}  # the last scrape's (workloads_of)
        self._last_device_of_unit: dict[str, str] = {}
        # a unit's plan by what it is computed from, kept for the next scrape (most scrapes change no start)
        self._plans: dict[tuple[object, ...], planning.UnitPlan | planning.Unplannable] = {}
        self._warned_unreadable = False
        self._targets = targets
        self._endpoints = endpoints.EndpointFinder(procfs_root, host_address=sd_host_address)
        self._readings = freememory.Readings()
        # (unit, start's began_usec) -> free memory at that start as vLLM and the driver saw it
        self._free_at_start: dict[tuple[str, int], freememory.FreeAtStart] = {}

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
        fallbacks = {pci: self._fallback(scan, context, pci) for pci in pci_addresses}
        dmem_by_unit = self._read_dmem(scan, fallbacks.values(), problems)
        # a GPU that neither Level Zero nor fdinfo sees, where dmem says a unit holds memory
        for pci in sorted({pci for by_device in dmem_by_unit.values() for pci, held in by_device.items() if held}
                          - set(fallbacks)):
            fallbacks[pci] = self._fallback(scan, context, pci)
        attributions: dict[str, DeviceAttribution] = {}
        for pci, fallback in sorted(fallbacks.items()):
            holders = set(scan.memory_by_device_unit.get(pci, ())) if scan is not None else set()
            dmem_of_unit = {unit: by_device[pci] for unit, by_device in dmem_by_unit.items() if pci in by_device}
            attribution = attribute_device(fallback, dmem_of_unit, holders)
            if attribution is None:
                problems.append(f"{pci}: no per-process source works (no unit's dmem.current lists it, fdinfo has "
                                f"no memory figures for it and Level Zero's process list failed)")
            else:
                attributions[pci] = attribution
        # From here on a unit is a workload: containers by their names (see workloads_of)
        workloads = self._workloads(scan, fallbacks.values())
        attributions = {pci: rename_attribution(attribution, workloads) for pci, attribution in attributions.items()}
        engines = rename_engine_use(scan.engines_by_device_unit if scan is not None else {}, workloads)

        source = GaugeFamily("xpu_memory_attribution_info",
                             "Which sources attribute the device's memory to units: dmem, fdinfo or levelzero.",
                             labels=["device", "source"])
        unit_memory = GaugeFamily("xpu_unit_memory_bytes", "Device memory held by all processes of the unit.",
                                  labels=["device", "unit"])
        context.watch_units(unit for attribution in attributions.values() for unit in attribution.by_unit)
        kept, dropped = self._choose_units(context, attributions, engines)
        for pci, attribution in attributions.items():
            for name in attribution.sources:
                source.add_metric([pci, name], 1)
            for unit, held in sorted(attribution.by_unit.items()):
                if unit in kept:
                    unit_memory.add_metric([pci, unit], held)
        yield source
        yield unit_memory
        yield from self._engine_use(engines, kept)
        yield workload_info(workloads, kept)
        self._discover(scan, fallbacks.values(), workloads, attributions, kept, devices)
        yield GaugeFamily("xpu_exporter_processes_units_dropped",
                          "Units holding GPU memory or DRM clients at this scrape that have no series of their own "
                          "because of --collector.processes.max-units (their memory is in the unattributed rest).",
                          value=dropped)
        yield CounterFamily("xpu_exporter_container_state_files_cut_total",
                            "Engine state files (config.v2.json, containers.json) not read for their size: over "
                            "their bound, or one container's entry over its bound (those containers keep their "
                            "cgroup names).", value=self._names.cut)
        if devices is not None:
            views = self._watched_views(context)
            yield from self._against_device_memory(devices, attributions, views, kept)
            yield from self._planned(devices, attributions, views)
            yield self._plan_of_units(devices, attributions, views, problems)
            yield self._free_memory_at_start(devices, attributions, views)
        if problems:
            raise CollectionError("; ".join(problems))

    def _choose_units(self, context: ScrapeContext, attributions: dict[str, DeviceAttribution],
                      engines: Mapping[str, Mapping[str, procfs.UnitEngineUse]]) -> tuple[set[str], int]:
        """The units that keep series of their own at this scrape (choose_units), and how many do not."""
        held: dict[str, int] = {}
        for attribution in attributions.values():
            for unit, memory in attribution.by_unit.items():
                held[unit] = held.get(unit, 0) + memory
        for device, by_unit in engines.items():
            if not device.startswith(f"{procfs.DRM_MAJOR}:"):
                for unit in by_unit:
                    held.setdefault(unit, 0)
        kept = choose_units(held, context.journal_matches(held) if len(held) > self._max_units else set(),
                            self._kept_units, self._max_units)
        self._kept_units = kept
        dropped = len(held) - len(kept)
        if dropped and not self._warned_dropped:
            self._warned_dropped = True
            log.warning("%d units hold GPU memory or DRM clients, more than --collector.processes.max-units=%d: "
                        "%d of them have no series of their own, their memory is counted unattributed",
                        len(held), self._max_units, dropped)
        return kept, dropped

    @staticmethod
    def _engine_use(engines: Mapping[str, Mapping[str, procfs.UnitEngineUse]], kept: set[str]) -> Iterator[Metric]:
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
        for device, by_unit in sorted(engines.items()):
            if device.startswith(f"{procfs.DRM_MAJOR}:"):
                continue  # not a PCI GPU (see collect)
            for unit, use in sorted(by_unit.items()):
                if unit not in kept:
                    continue
                for engine, seconds in sorted(use.busy_seconds.items()):
                    busy.add_metric([device, unit, engine], seconds)
                for engine, count in sorted(use.cycles.items()):
                    cycles.add_metric([device, unit, engine], count)
                for engine, count in sorted(use.total_cycles.items()):
                    total_cycles.add_metric([device, unit, engine], count)
        yield from (busy, cycles, total_cycles)

    def _workloads(self, scan: procfs.ScanResult | None, fallbacks: Iterable[Attribution | None]
                   ) -> dict[str, Workload]:
        """The workload of each unit the scan and the fallbacks found (their cgroup leaves), by the
        containers their cgroups name (workloads_of)."""
        return workloads_of(_unit_cgroups(scan, fallbacks), self._names, self._containers_of_paths)

    def _discover(self, scan: procfs.ScanResult | None, fallbacks: Iterable[Attribution | None],
                  workloads: Mapping[str, Workload], attributions: dict[str, DeviceAttribution], kept: set[str],
                  devices: list[DeviceMemory] | None) -> None:
        """Publish the vLLM API endpoint of each unit with series of its own (sources.endpoints): the units'
        cgroups are those their GPU processes are in. A procfs that cannot be read publishes none (the scan
        has said why)."""
        if self._targets is None:
            return
        paths_of = {leaf: paths for leaf, paths in _unit_cgroups(scan, fallbacks).items()
                    if (workloads[leaf].unit if leaf in workloads else leaf) in kept}
        try:
            found = self._endpoints.find(path for paths in paths_of.values() for path in paths)
        except procfs.ProcfsUnavailable:
            found = {}
        gpus = [d.identity.pci_address for d in devices] if devices is not None else sorted(attributions)
        targets = []
        for leaf, paths in sorted(paths_of.items()):
            endpoint = next((found[path] for path in sorted(paths) if path in found), None)
            if endpoint is not None:
                workload = workloads.get(leaf, Workload(leaf))
                targets.append(Target(endpoint, workload, self._device_of(workload.unit, attributions, gpus)))
        self._targets.publish(targets)

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

    def _read_dmem(self, scan: procfs.ScanResult | None, fallbacks: Iterable[Attribution | None],
                   problems: list[str]) -> dict[str, dict[str, int]]:
        """unit -> device -> bytes from dmem, for the units of DRM clients, of processes the scan could not
        read and of Level Zero's process list."""
        unit_cgroups = _unit_cgroups(scan, fallbacks)
        if not unit_cgroups:
            return {}
        reading = self._dmem.read(unit_cgroups)
        problems.extend(reading.problems)
        return reading.by_unit

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

    def _fallback(self, scan: procfs.ScanResult | None, context: ScrapeContext, pci: str) -> Attribution | None:
        """The device's source for the units dmem does not serve: fdinfo, else Level Zero's process list."""
        return self._from_fdinfo(scan, pci) or self._from_levelzero(context, pci)

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
        unit_cgroups: dict[str, set[str]] = {}
        for process in reading.processes:
            unit_cgroup = self._scanner.unit_cgroup_of(process.pid)
            if unit_cgroup is not None:
                by_unit[unit_cgroup.unit] = by_unit.get(unit_cgroup.unit, 0) + process.mem_size
                unit_cgroups.setdefault(unit_cgroup.unit, set()).add(unit_cgroup.path)
        return Attribution(LEVELZERO, by_unit, sum(p.mem_size for p in reading.processes), unit_cgroups)

    def _against_device_memory(self, devices: list[DeviceMemory], attributions: dict[str, DeviceAttribution],
                               views: list[UnitView], kept: set[str]) -> Iterator[Metric]:
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
        memory: dict[str, tuple[int, int]] = {}  # device -> (total, free)
        for device in devices:
            total, free = device.total, device.free
            if total is not None and free is not None:
                memory[device.identity.pci_address] = (total, free)
        for pci, attribution in attributions.items():
            if pci not in memory:
                continue
            total, free = memory[pci]
            used = total - free
            # the memory of units without series of their own (max-units) is part of the unattributed rest
            attributed = attribution.total - sum(held for unit, held in attribution.by_unit.items() if unit not in kept)
            unattributed.add_metric([pci], max(0, used - attributed))
            overcounted.add_metric([pci], 1 if attribution.total > used else 0)
        gpus = [d.identity.pci_address for d in devices]
        for view in views:
            utilisation = view.gpu_memory_utilization
            pci = self._device_of(view.unit, attributions, gpus)
            if utilisation is None or pci not in memory:
                continue
            total, free = memory[pci]
            own = attributions[pci].by_unit.get(view.unit, 0) if pci in attributions else 0
            headroom.add_metric([pci, view.unit], memory_rules.restart_headroom_bytes(free, own, total, utilisation))
        yield from (unattributed, overcounted, headroom)

    def _planned(self, devices: list[DeviceMemory], attributions: dict[str, DeviceAttribution],
                 views: list[UnitView]) -> Iterator[Metric]:
        """The plan's figures (vllm_xpu_exporter.planning) of each engine unit whose GPU and its total are known: the
        KV its target needs and its footprint, and per GPU the sum to hold against its total. The target is
        what the unit's --kv-cache-memory-bytes holds when set, else the planner's default (the KV of
        its last successful start)."""
        footprint = GaugeFamily("xpu_unit_memory_footprint_bytes",
                                "What the unit holds on its GPU serving its target: weights + peak activation + "
                                "non-torch + the planned KV cache (vllm-xpu-plan's figure).", labels=["device", "unit"])
        planned_kv = GaugeFamily("xpu_unit_kv_cache_planned_bytes",
                                 "The KV budget the unit's target needs (whole blocks and vLLM's null block): its "
                                 "--kv-cache-memory-bytes when set, else the KV of its last successful start.",
                                 labels=["device", "unit"])
        device_footprint = GaugeFamily("xpu_device_units_footprint_bytes",
                                       "The footprints of the engine units on the device, summed: above "
                                       "xpu_memory_total_bytes, they cannot all run at once.", labels=["device"])
        totals = {d.identity.pci_address: d.total for d in devices if d.total is not None}
        gpus = [d.identity.pci_address for d in devices]
        summed: dict[str, int] = {}
        for view in views:
            if view.latest is None or view.latest.engine is False:
                continue
            pci = self._device_of(view.unit, attributions, gpus)
            if pci not in totals:
                continue
            plan = self._plan(view, pci, totals[pci])
            if isinstance(plan, planning.Unplannable):
                continue
            footprint.add_metric([pci, view.unit], plan.footprint.total_bytes)
            planned_kv.add_metric([pci, view.unit], plan.kv_cache_memory_bytes)
            summed[pci] = summed.get(pci, 0) + plan.footprint.total_bytes
        for pci, total_footprint in sorted(summed.items()):
            device_footprint.add_metric([pci], total_footprint)
        yield from (footprint, planned_kv, device_footprint)

    def _plan_of_units(self, devices: list[DeviceMemory], attributions: dict[str, DeviceAttribution],
                       views: list[UnitView], problems: list[str]) -> Metric:
        """The budget the planner's drop-in gives each engine unit on a known GPU (sources/unitconfig.py); a
        unit without a plan has no series."""
        family = GaugeFamily("xpu_unit_kv_cache_plan_bytes",
                             "The KV budget vllm-xpu-plan's drop-in gives the unit (the drop-in's file, believed "
                             "only when root wrote it); differs from xpu_unit_kv_cache_budget_bytes when the plan "
                             "is not applied.", labels=["device", "unit"])
        units = [view.unit for view in views if view.latest is not None and view.latest.engine is not False
                 and "/" not in view.unit]  # containers (docker/NAME ...) have no systemd configuration
        if self._unit_plans is None or not units:
            return family
        plans, unread = self._unit_plans.plans(units)
        problems += unread
        gpus = [d.identity.pci_address for d in devices]
        for unit in units:
            pci = self._device_of(unit, attributions, gpus)
            if unit in plans and pci is not None:
                family.add_metric([pci, unit], plans[unit])
        return family

    def _free_memory_at_start(self, devices: list[DeviceMemory], attributions: dict[str, DeviceAttribution],
                              views: list[UnitView]) -> Metric:
        """The free memory each unit's latest start said it saw, and the driver's at the scrape nearest that
        line (vllm_xpu_exporter.freememory): this scrape's reading is kept for the lines to come."""
        family = GaugeFamily("xpu_unit_engine_start_free_memory_bytes",
                             "Free device memory at the unit's latest engine start: as vLLM printed it (seen_by "
                             "vllm), Level Zero's free plus the unit's own memory at the scrape nearest that line "
                             "(levelzero), and the total less the other processes' memory then "
                             "(total_less_attributed).", labels=["device", "unit", "seen_by"])
        now_usec = time.time_ns() // 1000
        for device in devices:
            pci = device.identity.pci_address
            if device.total is not None and device.free is not None and pci in attributions:
                attribution = attributions[pci]
                self._readings.add(pci, freememory.DeviceReading(now_usec, device.free, device.total,
                                                                 dict(attribution.by_unit), attribution.total))
        gpus = [d.identity.pci_address for d in devices]
        for view in views:
            start = view.latest
            if start is None or start.seen_free_bytes is None or start.seen_free_usec is None:
                continue
            pci = self._device_of(view.unit, attributions, gpus)
            if pci is None:
                continue
            key = (view.unit, start.began_usec)
            if key not in self._free_at_start:
                reading = self._readings.nearest(pci, start.seen_free_usec)
                if reading is not None:
                    if len(self._free_at_start) >= PLANS_KEPT:
                        self._free_at_start.clear()
                    self._free_at_start[key] = freememory.free_at_start(view.unit, start.seen_free_bytes, reading)
            compared = self._free_at_start.get(key)
            family.add_metric([pci, view.unit, "vllm"], start.seen_free_bytes)
            if compared is not None:
                family.add_metric([pci, view.unit, "levelzero"], compared.levelzero)
                family.add_metric([pci, view.unit, "total_less_attributed"], compared.total_less_attributed)
        return family

    def _plan(self, view: UnitView, pci: str, total: int) -> planning.UnitPlan | planning.Unplannable:
        """planning.plan_unit, computed again only when what it reads changed: the starts' figures (the
        fold hands out fresh snapshots at every scrape, equal by identity only, so by their fields), the
        GPU and its total."""
        key = (view.unit, pci, total, _fields(view.latest), _fields(view.last_success), _fields(view.last_profiled))
        plan = self._plans.get(key)
        if plan is None:
            plan = planning.plan_unit(view, pci, total, planning.budget_target(view))
            if len(self._plans) >= PLANS_KEPT:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    @staticmethod
    def _watched_views(context: ScrapeContext) -> list[UnitView]:
        return context.engine_views()

    def _device_of(self, unit: str, attributions: dict[str, DeviceAttribution], gpus: list[str]) -> str | None:
        """The GPU the unit holds (or last held) memory on; on a one-GPU host, that GPU."""
        for pci, attribution in attributions.items():
            if attribution.by_unit.get(unit):
                self._last_device_of_unit[unit] = pci
        pci = self._last_device_of_unit.get(unit)
        if pci in gpus:
            return pci
        return gpus[0] if len(gpus) == 1 else None


@dataclass(frozen=True)
class ProcessesOptions:
    """The processes collector's options: `procfs` and `sysfs`, where the host's /proc and /sys are
    (--path.procfs, --path.sysfs); `max_units` (--collector.processes.max-units); `reports_levelzero`: the
    levelzero collector is disabled (see ProcessesCollector); where the container engines' state is, for
    containers' names (--path.docker, --path.podman, --path.pods, --path.container-logs)."""

    procfs: str = "/proc"
    sysfs: str = dmem.DEFAULT_SYSFS
    max_units: int = DEFAULT_MAX_UNITS
    reports_levelzero: bool = False
    docker_roots: tuple[str, ...] = (containers.DEFAULT_DOCKER_ROOT,)
    podman_storages: tuple[str, ...] = (containers.DEFAULT_PODMAN_STORAGE,)
    pod_logs: str = containers.DEFAULT_POD_LOGS
    container_logs: str = containers.DEFAULT_CONTAINER_LOGS
    sd_host_address: str = endpoints.DEFAULT_HOST_ADDRESS
    plans: str = unitconfig.DEFAULT_PLANS_DIRECTORY  # where the planner's drop-ins are (UNIT.d/zz-vllm-xpu-plan.conf)

    @classmethod
    def from_args(cls, args: argparse.Namespace, enabled: frozenset[str]) -> ProcessesOptions:
        """From the parsed command line (its host paths and this collector's own flag) and the names of the
        enabled collectors."""
        return cls(procfs=args.procfs, sysfs=args.sysfs, max_units=args.processes_max_units,
                   reports_levelzero="levelzero" not in enabled, sd_host_address=args.processes_sd_host_address,
                   plans=args.processes_plans,
                   **container_paths(args))  # type: ignore[arg-type]


def add_flags(collectors: argparse._ArgumentGroup) -> None:
    """--collector.processes.max-units (dest processes_max_units), --collector.processes.sd-host-address,
    --collector.processes.plans."""
    collectors.add_argument("--collector.processes.max-units", dest="processes_max_units", type=positive_int,
                            default=DEFAULT_MAX_UNITS, metavar="N",
                            help="at most this many units have per-unit series from processes (units the journal "
                                 "watches first, then those holding the most memory); the memory of the others is "
                                 "counted unattributed, their number in xpu_exporter_processes_units_dropped")
    collectors.add_argument("--collector.processes.sd-host-address", dest="processes_sd_host_address",
                            type=sd_host_address, default=endpoints.DEFAULT_HOST_ADDRESS, metavar="ADDRESS",
                            help="the address /sd/vllm gives for a vLLM server listening on every address of the "
                                 "host's network namespace (default %(default)s: Prometheus on the same host)")
    collectors.add_argument("--collector.processes.plans", dest="processes_plans", type=absolute_path,
                            default=unitconfig.DEFAULT_PLANS_DIRECTORY, metavar="DIR",
                            help=f"where vllm-xpu-plan's drop-ins are, DIR/UNIT.d/{unitconfig.DROP_IN_NAME}, each "
                                 "believed only when root alone can have written it (xpu_unit_kv_cache_plan_bytes; "
                                 "default %(default)s)")


def sd_host_address(value: str) -> str:
    """An IP address or host name (no port, no brackets)."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not an IP address or host name")
    return value


@register("processes", "per-unit device memory from processes", needs=[Source.LEVELZERO],
          add_flags=add_flags, options=ProcessesOptions.from_args)
def _processes_collector(options: ProcessesOptions, sources: Sources) -> ProcessesCollector:
    names = ContainerNames(options.docker_roots, options.podman_storages, options.pod_logs, options.container_logs)
    return ProcessesCollector(options.procfs, reports_levelzero=options.reports_levelzero,
                              sysfs_root=options.sysfs, max_units=options.max_units, names=names,
                              targets=sources.vllm_targets, sd_host_address=options.sd_host_address,
                              unit_plans=unitconfig.UnitPlans(options.plans))


def _unit_cgroups(scan: procfs.ScanResult | None, fallbacks: Iterable[Attribution | None]) -> dict[str, set[str]]:
    """unit (cgroup leaf) -> its cgroup paths, from the scan and the fallbacks (Level Zero's processes)."""
    unit_cgroups: dict[str, set[str]] = {}
    found = [scan.unit_cgroups if scan is not None else {},
             *(fallback.unit_cgroups for fallback in fallbacks if fallback is not None)]
    for cgroups_of_unit in found:
        for unit, paths in cgroups_of_unit.items():
            unit_cgroups.setdefault(unit, set()).update(paths)
    return unit_cgroups


def _fields(start: object | None) -> tuple[object, ...] | None:
    return None if start is None else tuple(vars(start).values())
