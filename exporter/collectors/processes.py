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
(`attribution.choose_units`: units the journal watches first, then those holding the most device memory, a
unit kept at the previous scrape counting double so that units of about the same size do not swap places at
every scrape); the memory of the others is counted in their device's unattributed rest (so the units' series and
the rest still add up to used), their engine counters are dropped, and how many they are is the gauge
xpu_exporter_processes_units_dropped. Desktop sessions, containers or batch jobs each in a scope of their own
can hold DRM clients by the thousand: without the cap each would be a series on every device.

Per watched engine unit on a GPU whose total is known, the plan's figures (vllm_xpu_exporter.planner.plans, the
same as vllm-xpu-plan's): its footprint and planned KV cache, and per GPU their sum, so that a GPU whose units
cannot all run at once shows on the dashboard and alerts. The unit's GPU is the one it holds (or last held) memory
on, or the only one. Beside them, the budget the planner's drop-in gives a unit, read from the drop-in
(vllm_xpu_exporter.sources.plan_dropins), so that a plan an override took the command from shows.

A thin mapping that reads only: the reasoning is `vllm_xpu_exporter.attribution` (pure); the sources (the DRM
clients' scan under --path.procfs, dmem under --path.sysfs, the containers' names, the units' API endpoints, the
plans' drop-ins, Level Zero) are built with the others (`cli.build_sources`, which also owns the flags that
configure them: --collector.processes.sd-host-address, --collector.processes.plans) and read through the
scrape's `ScrapeContext`. What it finds beyond its metrics it keeps: the units holding GPU memory
(`units_on_gpus`, which the scrape hands to the journal) and the units' vLLM API endpoints (`targets`, which
/sd/vllm serves). Its options (`ProcessesOptions`): its unit cap (--collector.processes.max-units, a flag it
adds itself) and whether the levelzero collector is enabled (when it is not, Level Zero is not used at all).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric

from vllm_xpu_exporter import attribution
from vllm_xpu_exporter.collector import CollectionError, Collector, ScrapeContext, Source, Sources, register
from vllm_xpu_exporter.discovery import VllmTargets
from vllm_xpu_exporter.families import CounterFamily, GaugeFamily
from vllm_xpu_exporter.argparsing import positive_int
from vllm_xpu_exporter.fold.engine_starts import DEFAULT_MAX_UNITS, UnitView
from vllm_xpu_exporter.runtimes import ContainerCgroup
from vllm_xpu_exporter.sources import containers, procfs
from vllm_xpu_exporter.sources.containers import Workload
from vllm_xpu_exporter.sources.levelzero.worker import DeviceMemory, LevelZeroUnavailable
from vllm_xpu_exporter.sources.procfs import UnitEngineUse

log = logging.getLogger("vllm_xpu_exporter.processes")

# What keeps a scrape from being whole: failures as text.
Problems = list[str]


def workload_info(workloads: Mapping[str, Workload], kept: set[str]) -> GaugeFamily:
    """xpu_workload_info: one series per unit with series of its own at this scrape (`kept`), = 1, with what
    is known of it (`attribution.kept_workloads`)."""
    info = GaugeFamily("xpu_workload_info",
                       "Who the unit label names: kind (systemd, docker, podman, k8s), the container's id, name and "
                       "Compose project and service, the pod's namespace, name and uid (empty where they do not "
                       "apply or are not known); one series per unit with per-unit series, to join on unit.",
                       labels=list(containers.INFO_LABELS))
    for workload in attribution.kept_workloads(workloads, kept):
        info.add_metric(workload.labels(), 1)
    return info


class ProcessesCollector(Collector):
    name = "processes"

    def __init__(self, uses_levelzero: bool = True, max_units: int = DEFAULT_MAX_UNITS,
                 targets: VllmTargets | None = None) -> None:
        """`uses_levelzero`: the levelzero collector is enabled; when it is not (--no-collector.levelzero), this
        collector never drives Level Zero either: no device memory (so no unattributed rest and no headroom) and
        no Level Zero process list, only dmem and fdinfo. `max_units`: at most this
        many units have series of their own (see attribution.choose_units). `targets`: where the units' vLLM
        API endpoints found at each scrape are kept (/sd/vllm serves them); None: none are looked for."""
        self._uses_levelzero = uses_levelzero
        self._max_units = max_units
        self._kept_units: set[str] = set()
        self._warned_dropped = False
        self._containers_of_paths: dict[str, ContainerCgroup | None] = {}  # the last scrape's (containers_of)
        self._unit_devices = attribution.UnitDevices()
        self._plans = attribution.Plans()
        self._warned_unreadable = False
        self.targets = targets
        self._start_free_memory = attribution.StartFreeMemory()
        self._units_on_gpus: frozenset[str] = frozenset()

    def units_on_gpus(self) -> frozenset[str]:
        """The units holding memory on a GPU at the last scrape (the journal watches those its globs match)."""
        return self._units_on_gpus

    def collect(self, context: ScrapeContext) -> Iterator[Metric]:
        self._units_on_gpus = frozenset()
        problems: Problems = []
        scan = self._scan(context, problems)
        devices = self._device_memory(context)
        fallbacks = {pci: self._fallback(scan, context, pci) for pci in attribution.gpus_seen(devices or (), scan)}
        dmem_by_unit = self._read_dmem(context, attribution.unit_cgroups(scan, fallbacks.values()), problems)
        for pci in attribution.gpus_only_dmem_sees(dmem_by_unit, fallbacks):
            fallbacks[pci] = self._fallback(scan, context, pci)
        attributions, unserved = attribution.attribute_devices(fallbacks, dmem_by_unit, scan)
        levelzero = "Level Zero's process list failed" if self._uses_levelzero else "Level Zero is not used"
        problems.extend(f"{pci}: no per-process source works (no unit's dmem.current lists it, fdinfo has no memory "
                        f"figures for it and {levelzero})" for pci in unserved)
        # From here on a unit is a workload: containers by their names (see _workloads)
        cgroups_of_unit = attribution.unit_cgroups(scan, fallbacks.values())
        workloads = self._workloads(context, cgroups_of_unit)
        attributions = {pci: attribution.rename_attribution(of_device, workloads)
                        for pci, of_device in attributions.items()}
        engines = attribution.rename_engine_use(scan.engines_by_device_unit if scan is not None else {}, workloads)

        source = GaugeFamily("xpu_memory_attribution_info",
                             "Which sources attribute the device's memory to units: dmem, fdinfo or levelzero.",
                             labels=["device", "source"])
        unit_memory = GaugeFamily("xpu_unit_memory_bytes", "Device memory held by all processes of the unit.",
                                  labels=["device", "unit"])
        self._units_on_gpus = frozenset(unit for of_device in attributions.values() for unit in of_device.by_unit)
        kept, dropped = self._choose_units(context, attribution.held_by_unit(attributions, engines))
        for pci, of_device in attributions.items():
            for name in of_device.sources:
                source.add_metric([pci, name], 1)
            for unit, held in sorted(of_device.by_unit.items()):
                if unit in kept:
                    unit_memory.add_metric([pci, unit], held)
        yield source
        yield unit_memory
        yield from self._engine_use(engines, kept)
        yield workload_info(workloads, kept)
        gpus = [d.identity.pci_address for d in devices] if devices is not None else sorted(attributions)
        self._discover(context, attribution.endpoint_cgroups(cgroups_of_unit, workloads, kept), workloads,
                       attributions, gpus)
        yield GaugeFamily("xpu_exporter_processes_units_dropped",
                          "Units holding GPU memory or DRM clients at this scrape that have no series of their own "
                          "because of --collector.processes.max-units (their memory is in the unattributed rest).",
                          value=dropped)
        yield CounterFamily("xpu_exporter_container_state_files_cut_total",
                            "Engine state files (config.v2.json, containers.json) not read for their size: over "
                            "their bound, or one container's entry over its bound (those containers keep their "
                            "cgroup names).", value=context.container_state_files_cut())
        if devices is not None:
            views = context.engine_views()
            memory = attribution.total_and_free(devices)
            vllm_reads = attribution.as_vllm_reads(devices)
            yield from self._against_device_memory(memory, vllm_reads, attributions, views, kept, gpus)
            planned = self._plans.planned(attribution.vllm_totals(devices), attributions, views, self._unit_devices,
                                          gpus)
            yield from self._planned(planned)
            yield self._admission(memory, attributions, views, planned, gpus)
            yield self._plan_of_units(context, attributions, views, workloads, gpus, problems)
            yield self._free_memory_at_start(vllm_reads, attributions, views, gpus)
        if problems:
            raise CollectionError("; ".join(problems))

    def _choose_units(self, context: ScrapeContext, held: dict[str, int]) -> tuple[set[str], int]:
        """The units that keep series of their own at this scrape (attribution.choose_units), and how many do
        not."""
        kept = attribution.choose_units(held, context.journal_matches(held) if len(held) > self._max_units else set(),
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
    def _engine_use(engines: Mapping[str, Mapping[str, UnitEngineUse]], kept: set[str]) -> Iterator[Metric]:
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
            if not attribution.is_pci_gpu(device):
                continue
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

    def _workloads(self, context: ScrapeContext, cgroups_of_unit: Mapping[str, set[str]]) -> dict[str, Workload]:
        """unit (a cgroup leaf) -> its workload: a systemd unit keeps its name; a container's cgroup gets the key
        of its names (`docker/<name>`, `podman/<name>`, `k8s/<namespace>/<pod>/<container>`) when they are
        found, else keeps the leaf. Whatever the state on disk holds, never raises: a failure keeps the leaf."""
        workloads: dict[str, Workload] = {}
        for unit, container in attribution.containers_of(cgroups_of_unit, self._containers_of_paths).items():
            try:
                workloads[unit] = context.workload(unit, container)
            except Exception:  # noqa: BLE001 (untrusted files on disk must never cost a scrape)
                log.debug("no workload for %s", unit, exc_info=True)
                workloads[unit] = Workload(unit)
        return workloads

    def _discover(self, context: ScrapeContext, paths_of: dict[str, set[str]], workloads: Mapping[str, Workload],
                  attributions: dict[str, attribution.DeviceAttribution], gpus: list[str]) -> None:
        """Publish the vLLM API endpoint of each unit with series of its own (sources.endpoints): `paths_of`,
        the units' cgroups, are those their GPU processes are in. A procfs that cannot be read publishes none
        (the scan has said why)."""
        if self.targets is None:
            return
        try:
            found = context.vllm_endpoints(path for paths in paths_of.values() for path in paths)
        except procfs.ProcfsUnavailable:
            found = {}
        self.targets.publish(attribution.vllm_targets(paths_of, found, workloads, self._unit_devices, attributions,
                                                      gpus))

    def _scan(self, context: ScrapeContext, problems: Problems) -> procfs.ScanResult | None:
        try:
            scan = context.drm_clients()
        except procfs.ProcfsUnavailable as error:
            problems.append(str(error))
            return None
        if scan.unreadable and not self._warned_unreadable:
            self._warned_unreadable = True
            log.warning("%s", unreadable_warning(scan))
        return scan

    def _read_dmem(self, context: ScrapeContext, cgroups_of_unit: dict[str, set[str]], problems: Problems
                   ) -> dict[str, dict[str, int]]:
        """unit -> device -> bytes from dmem, for the units of DRM clients, of processes the scan could not
        read and of Level Zero's process list."""
        if not cgroups_of_unit:
            return {}
        reading = context.dmem(cgroups_of_unit)
        problems.extend(reading.problems)
        return reading.by_unit

    def _device_memory(self, context: ScrapeContext) -> list[DeviceMemory] | None:
        """The devices' memory, or None when Level Zero cannot say or is not used; without it (or without a
        device's free memory) there is no unattributed rest and no headroom. The levelzero collector reports
        why Level Zero cannot say."""
        if not self._uses_levelzero:
            return None
        try:
            return context.device_memory()
        except LevelZeroUnavailable:
            return None

    def _fallback(self, scan: procfs.ScanResult | None, context: ScrapeContext, pci: str
                  ) -> attribution.Attribution | None:
        """The device's source for the units dmem does not serve: fdinfo, else Level Zero's process list."""
        return attribution.from_fdinfo(scan, pci) or self._from_levelzero(context, pci)

    def _from_levelzero(self, context: ScrapeContext, pci: str) -> attribution.Attribution | None:
        if not self._uses_levelzero:
            return None
        try:
            readings = context.device_processes()
        except LevelZeroUnavailable:
            return None
        reading = next((r for r in readings if r.identity.pci_address == pci), None)
        if reading is None or reading.error:
            return None
        return attribution.from_processes(reading, {process.pid: context.unit_cgroup_of(process.pid)
                                                    for process in reading.processes})

    def _against_device_memory(self, memory: dict[str, tuple[int, int]], vllm_reads: dict[str, tuple[int, int]],
                               attributions: dict[str, attribution.DeviceAttribution], views: list[UnitView],
                               kept: set[str], gpus: list[str]) -> Iterator[Metric]:
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
        for pci, rest in attribution.device_rests(memory, attributions, kept).items():
            unattributed.add_metric([pci], rest.unattributed)
            overcounted.add_metric([pci], 1 if rest.overcounted else 0)
        for pci, unit, bytes_ in attribution.restart_headrooms(vllm_reads, attributions, views, self._unit_devices,
                                                               gpus):
            headroom.add_metric([pci, unit], bytes_)
        wake = GaugeFamily("xpu_unit_wake_memory_bytes",
                           "Device memory a sleeping unit (vLLM sleep mode) takes back when it wakes: what it freed "
                           "going to sleep, while it holds less than that.", labels=["device", "unit"])
        wake_headroom = GaugeFamily("xpu_device_wake_headroom_bytes",
                                    "Free device memory less what the sleeping units take back when they wake; "
                                    "negative: they cannot all wake now.", labels=["device"])
        wakes = attribution.sleeping_units(attributions, views, self._unit_devices, gpus)
        for sleeping in wakes:
            wake.add_metric([sleeping.device, sleeping.unit], sleeping.takes_back)
        for pci, bytes_ in attribution.wake_headrooms(memory, wakes).items():
            wake_headroom.add_metric([pci], bytes_)
        yield from (unattributed, overcounted, headroom, wake, wake_headroom)

    def _planned(self, planned: list[attribution.PlannedUnit]) -> Iterator[Metric]:
        """The plan's figures (attribution.Plans) of each engine unit whose GPU and its total are known, and
        per GPU their sum to hold against its total."""
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
        for unit in planned:
            footprint.add_metric([unit.device, unit.unit], unit.footprint_bytes)
            planned_kv.add_metric([unit.device, unit.unit], unit.kv_cache_bytes)
        for pci, total_footprint in attribution.footprints_by_device(planned).items():
            device_footprint.add_metric([pci], total_footprint)
        yield from (footprint, planned_kv, device_footprint)

    def _admission(self, memory: dict[str, tuple[int, int]], attributions: dict[str, attribution.DeviceAttribution],
                   views: list[UnitView], planned: list[attribution.PlannedUnit], gpus: list[str]) -> Metric:
        """What a new engine could take on each device now (attribution.admission_free)."""
        family = GaugeFamily("xpu_device_admission_free_bytes",
                             "What a new engine could take on the device now: total - the memory held but by the "
                             "engines starting or waiting - their planned footprints - the 512 MiB reserve; "
                             "negative: over-committed.", labels=["device"])
        for pci, free in attribution.admission_free(memory, attributions, views, planned, self._unit_devices,
                                                    gpus).items():
            family.add_metric([pci], free)
        return family

    def _plan_of_units(self, context: ScrapeContext, attributions: dict[str, attribution.DeviceAttribution],
                       views: list[UnitView], workloads: Mapping[str, Workload], gpus: list[str],
                       problems: Problems) -> Metric:
        """The budget the planner gives each engine unit or container on a known GPU: a unit's from its drop-in
        (sources/plan_dropins.py), a container's from the planner's label in its engine's record of it
        (runtimes.PLAN_LABEL); one without a plan has no series."""
        family = GaugeFamily("xpu_unit_kv_cache_plan_bytes",
                             "The KV budget vllm-xpu-plan gives the unit: its drop-in's (believed only when root "
                             "wrote it), or a container's plan label as its engine recorded the container's "
                             "creation; differs from xpu_unit_kv_cache_budget_bytes when the plan is not applied.",
                             labels=["device", "unit"])
        units = attribution.systemd_engine_units(views)
        plans, unread = context.unit_plans(units)
        problems += unread
        plans = {**attribution.container_plans(views, workloads), **plans}
        for unit in sorted(plans):
            pci = self._unit_devices.of(unit, attributions, gpus)
            if pci is not None:
                family.add_metric([pci, unit], plans[unit])
        return family

    def _free_memory_at_start(self, memory: dict[str, tuple[int, int]],
                              attributions: dict[str, attribution.DeviceAttribution],
                              views: list[UnitView], gpus: list[str]) -> Metric:
        """The free memory each unit's latest start said it saw, and the driver's at the scrape nearest that
        line (attribution.StartFreeMemory): this scrape's reading is kept for the lines to come."""
        family = GaugeFamily("xpu_unit_engine_start_free_memory_bytes",
                             "Free device memory at the unit's latest engine start: as vLLM printed it (seen_by "
                             "vllm), Level Zero's free plus the unit's own memory at the scrape nearest that line "
                             "(levelzero), and the total less the other processes' memory then "
                             "(total_less_attributed).", labels=["device", "unit", "seen_by"])
        figures = self._start_free_memory.figures(time.time_ns() // 1000, memory,
                                                  attributions, views, self._unit_devices, gpus)
        for pci, unit, seen_by, bytes_ in figures:
            family.add_metric([pci, unit, seen_by], bytes_)
        return family


def unreadable_warning(scan: procfs.ScanResult) -> str:
    """The line that says which processes' fds could not be read and what would let the exporter read them,
    from what the reading process was: without the capabilities, root without them (a bounding set removed
    them), or with both (then something else denies it)."""
    pids = ", ".join(str(pid) for pid in scan.unreadable_pids)
    more = ", ..." if scan.unreadable > len(scan.unreadable_pids) else ""
    what = f"{scan.unreadable} processes' fds or fdinfo could not be read (pid {pids}{more})"
    if scan.reader_capable:
        return (f"{what} although the exporter holds CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH: a security module "
                f"(Yama ptrace_scope 3, AppArmor, SELinux) or the procfs mount's hidepid= denies it")
    if scan.reader_root:
        return (f"{what}: the exporter runs as root without CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (its "
                f"container's or unit's capability bounding set removes them): grant both to see every GPU process")
    return (f"{what}: give the exporter CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (the packaged units do) to see "
            f"every GPU process")


@dataclass(frozen=True)
class ProcessesOptions:
    """The processes collector's options: `max_units` (--collector.processes.max-units); `uses_levelzero`:
    the levelzero collector is enabled (see ProcessesCollector)."""

    max_units: int = DEFAULT_MAX_UNITS
    uses_levelzero: bool = True

    @classmethod
    def from_args(cls, args: argparse.Namespace, enabled: frozenset[str]) -> ProcessesOptions:
        """From the parsed command line (this collector's own flag) and the names of the enabled collectors."""
        return cls(max_units=args.processes_max_units, uses_levelzero="levelzero" in enabled)


def add_flags(collectors: argparse._ArgumentGroup) -> None:
    """--collector.processes.max-units (dest processes_max_units)."""
    collectors.add_argument("--collector.processes.max-units", dest="processes_max_units", type=positive_int,
                            default=DEFAULT_MAX_UNITS, metavar="N",
                            help="at most this many units have per-unit series from processes (units the journal "
                                 "watches first, then those holding the most memory); the memory of the others is "
                                 "counted unattributed, their number in xpu_exporter_processes_units_dropped")


@register("processes", "per-unit device memory from processes",
          needs=[Source.LEVELZERO, Source.DRM_CLIENTS, Source.DMEM, Source.CONTAINER_NAMES, Source.VLLM_ENDPOINTS,
                 Source.UNIT_PLANS],
          add_flags=add_flags, options=ProcessesOptions.from_args)
def _processes_collector(options: ProcessesOptions, sources: Sources) -> ProcessesCollector:
    return ProcessesCollector(options.uses_levelzero, options.max_units, VllmTargets())
