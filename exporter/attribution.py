"""Who holds each GPU's memory, and what follows from it: the processes collector's reasoning, without I/O.

The collector reads the sources (the procfs scan of DRM clients, Level Zero's devices and process lists, the
units' dmem.current, the containers' names, the units' API endpoints) through its `ScrapeContext` and hands
the readings in; these functions and classes answer with plain values, which the collector turns into metric
families. Nothing here reads a file, a clock or a socket: the tests give it readings and check the answers.

Per device, the units' memory comes from the first source that works: fdinfo (`from_fdinfo`), else Level
Zero's process list (`from_processes`); a unit whose dmem.current lists the device's regions is served by dmem
instead (`attribute_device`). From there on a unit is a workload (`containers_of` finds each unit's
container, whose names the collector reads; `rename_attribution`, `rename_engine_use`): the units of one
container add up. At most so many units keep series of their own
(`choose_units`); the memory of the others counts in the unattributed rest (`device_rests`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vllm_xpu_exporter import memory_rules, start_free_memory
from vllm_xpu_exporter.discovery import Target
from vllm_xpu_exporter.fold.engine_starts import UnitView
from vllm_xpu_exporter.planner import plans
from vllm_xpu_exporter.parsers.cgroup import UnitCgroup, unit_cgroup_of_path
from vllm_xpu_exporter.runtimes import ContainerCgroup
from vllm_xpu_exporter.sources.containers import Workload
from vllm_xpu_exporter.sources.endpoints import Endpoint
from vllm_xpu_exporter.sources.levelzero.worker import DeviceMemory, DeviceProcesses
from vllm_xpu_exporter.sources.procfs import DRM_MAJOR, ScanResult, UnitEngineUse

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


def is_pci_gpu(device: str) -> bool:
    """Whether a device key of the scan is a PCI GPU: fdinfo keys a client without drm-pdev by its DRM minor
    ("226:N")."""
    return not device.startswith(f"{DRM_MAJOR}:")


def gpus_seen(devices: Iterable[DeviceMemory], scan: ScanResult | None) -> list[str]:
    """The PCI addresses of the GPUs Level Zero or the scan sees, sorted."""
    return sorted({device.identity.pci_address for device in devices} |
                  {device for device in (scan.memory_by_device if scan else ()) if is_pci_gpu(device)})


def from_fdinfo(scan: ScanResult | None, pci: str) -> Attribution | None:
    """The device's attribution by the scan's DRM clients; None when the scan cannot tell (no scan, clients
    without memory keys, or none seen while some processes could not be looked at)."""
    if scan is None:
        return None
    if pci in scan.memory_by_device:
        if not scan.memory_keys_seen:
            return None  # clients, but a kernel that prints no memory keys (6.1 i915)
        return Attribution(FDINFO, dict(scan.memory_by_device_unit.get(pci, {})), scan.memory_by_device[pci])
    if scan.unreadable:
        return None  # no client seen, but some processes could not be looked at
    return Attribution(FDINFO, {}, 0)


def from_processes(reading: DeviceProcesses, unit_cgroup_of: Mapping[int, UnitCgroup | None]) -> Attribution:
    """The device's attribution by Level Zero's process list, each pid's unit from `unit_cgroup_of` (pid -> its
    unit's cgroup; None or absent: in no unit)."""
    by_unit: dict[str, int] = {}
    unit_cgroups: dict[str, set[str]] = {}
    for process in reading.processes:
        unit_cgroup = unit_cgroup_of.get(process.pid)
        if unit_cgroup is not None:
            by_unit[unit_cgroup.unit] = by_unit.get(unit_cgroup.unit, 0) + process.mem_size
            unit_cgroups.setdefault(unit_cgroup.unit, set()).add(unit_cgroup.path)
    return Attribution(LEVELZERO, by_unit, sum(p.mem_size for p in reading.processes), unit_cgroups)


def unit_cgroups(scan: ScanResult | None, fallbacks: Iterable[Attribution | None]) -> dict[str, set[str]]:
    """unit (cgroup leaf) -> its cgroup paths, from the scan and the fallbacks (Level Zero's processes)."""
    found_of_unit: dict[str, set[str]] = {}
    found = [scan.unit_cgroups if scan is not None else {},
             *(fallback.unit_cgroups for fallback in fallbacks if fallback is not None)]
    for cgroups_of_unit in found:
        for unit, paths in cgroups_of_unit.items():
            found_of_unit.setdefault(unit, set()).update(paths)
    return found_of_unit


def gpus_only_dmem_sees(dmem_by_unit: Mapping[str, Mapping[str, int]], served: Iterable[str]) -> list[str]:
    """The GPUs, other than `served`, where dmem says a unit holds memory (> 0), sorted."""
    return sorted({pci for by_device in dmem_by_unit.values() for pci, held in by_device.items() if held}
                  - set(served))


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


def attribute_devices(fallbacks: Mapping[str, Attribution | None], dmem_by_unit: Mapping[str, Mapping[str, int]],
                      scan: ScanResult | None) -> tuple[dict[str, DeviceAttribution], list[str]]:
    """Each device's attribution (`attribute_device`), by PCI address in order, and the devices that no source
    served."""
    attributions: dict[str, DeviceAttribution] = {}
    unserved: list[str] = []
    for pci, fallback in sorted(fallbacks.items()):
        holders = set(scan.memory_by_device_unit.get(pci, ())) if scan is not None else set()
        dmem_of_unit = {unit: by_device[pci] for unit, by_device in dmem_by_unit.items() if pci in by_device}
        attribution = attribute_device(fallback, dmem_of_unit, holders)
        if attribution is None:
            unserved.append(pci)
        else:
            attributions[pci] = attribution
    return attributions, unserved


def containers_of(cgroups_of_unit: Mapping[str, Iterable[str]], known: dict[str, ContainerCgroup | None] | None = None
                  ) -> dict[str, ContainerCgroup | None]:
    """unit (a cgroup leaf, `UnitCgroup.unit`) -> the container its cgroup paths name (`UnitCgroup.container`,
    read again from the paths; the first of them, in order, that names one), None for a systemd unit or a
    cgroup that is no container's. `known`: path -> container of the paths read at the previous call, reused,
    and replaced by those of this call."""
    previous = known.copy() if known is not None else {}
    if known is not None:
        known.clear()
    containers: dict[str, ContainerCgroup | None] = {}
    for unit, paths in cgroups_of_unit.items():
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
        containers[unit] = container
    return containers


def rename_attribution(attribution: DeviceAttribution, workloads: Mapping[str, Workload]) -> DeviceAttribution:
    """The attribution by workload (`Workload.unit`): units of one workload add up."""
    by_unit: dict[str, int] = {}
    for unit, held in attribution.by_unit.items():
        key = workloads[unit].unit if unit in workloads else unit
        by_unit[key] = by_unit.get(key, 0) + held
    return DeviceAttribution(attribution.sources, by_unit, attribution.total)


def rename_engine_use(engines: Mapping[str, Mapping[str, UnitEngineUse]], workloads: Mapping[str, Workload]
                      ) -> dict[str, dict[str, UnitEngineUse]]:
    """device -> workload -> engine counters: those of the units of one workload added up as the clients of
    one unit are (busy seconds and cycles summed, total cycles the largest)."""
    renamed: dict[str, dict[str, UnitEngineUse]] = {}
    for device, by_unit in engines.items():
        by_workload = renamed.setdefault(device, {})
        for unit, use in by_unit.items():
            key = workloads[unit].unit if unit in workloads else unit
            known = by_workload.get(key)
            by_workload[key] = use if known is None else _added(known, use)
    return renamed


def _added(one: UnitEngineUse, other: UnitEngineUse) -> UnitEngineUse:
    use = UnitEngineUse(dict(one.busy_seconds), dict(one.cycles), dict(one.total_cycles))
    for engine, seconds in other.busy_seconds.items():
        use.busy_seconds[engine] = use.busy_seconds.get(engine, 0.0) + seconds
    for engine, count in other.cycles.items():
        use.cycles[engine] = use.cycles.get(engine, 0) + count
    for engine, count in other.total_cycles.items():
        use.total_cycles[engine] = max(use.total_cycles.get(engine, 0), count)
    return use


def held_by_unit(attributions: Mapping[str, DeviceAttribution], engines: Mapping[str, Mapping[str, UnitEngineUse]]
                 ) -> dict[str, int]:
    """unit -> its device memory over all devices, for every unit that holds memory or DRM clients on a PCI GPU
    (0 for a unit with clients and no memory)."""
    held: dict[str, int] = {}
    for attribution in attributions.values():
        for unit, memory in attribution.by_unit.items():
            held[unit] = held.get(unit, 0) + memory
    for device, by_unit in engines.items():
        if is_pci_gpu(device):
            for unit in by_unit:
                held.setdefault(unit, 0)
    return held


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


def kept_workloads(workloads: Mapping[str, Workload], kept: Iterable[str]) -> list[Workload]:
    """The workload of each unit of `kept` (a workload key), by key; of several units of one workload (a
    restarted pod's old and new container, both still holding the GPU), the first by leaf."""
    by_key: dict[str, Workload] = {}
    for unit in sorted(workloads):
        by_key.setdefault(workloads[unit].unit, workloads[unit])
    return [by_key.get(unit, Workload(unit)) for unit in sorted(kept)]


class UnitDevices:
    """The GPU each unit holds (or last held) memory on, remembered across scrapes for the units asked about."""

    def __init__(self) -> None:
        self._last: dict[str, str] = {}

    def of(self, unit: str, attributions: Mapping[str, DeviceAttribution], gpus: list[str]) -> str | None:
        """The GPU of `gpus` the unit holds (or last held) memory on; on a one-GPU host, that GPU."""
        for pci, attribution in attributions.items():
            if attribution.by_unit.get(unit):
                self._last[unit] = pci
        pci = self._last.get(unit)
        if pci in gpus:
            return pci
        return gpus[0] if len(gpus) == 1 else None


def systemd_engine_units(views: Iterable[UnitView]) -> list[str]:
    """The watched units that run an engine and are systemd's (a container, `docker/NAME` and the like, has no
    unit files): those a plan's drop-in can be for."""
    return [view.unit for view in views
            if view.latest is not None and view.latest.engine is not False and "/" not in view.unit]


def container_plans(views: Iterable[UnitView], workloads: Mapping[str, Workload]) -> dict[str, int]:
    """The watched containers that run an engine, and the KV budget the planner's label gives each in its
    engine's record of the container (`Workload.plan_kv_cache_bytes`); those without one absent."""
    engines = {view.unit for view in views
               if view.latest is not None and view.latest.engine is not False and "/" in view.unit}
    return {workload.unit: workload.plan_kv_cache_bytes for workload in workloads.values()
            if workload.unit in engines and workload.plan_kv_cache_bytes is not None}


def endpoint_cgroups(cgroups_of_unit: Mapping[str, set[str]], workloads: Mapping[str, Workload], kept: set[str]
                     ) -> dict[str, set[str]]:
    """unit (cgroup leaf) -> its cgroup paths, for the units whose workload keeps series of its own: where
    their API endpoints are looked for."""
    return {leaf: paths for leaf, paths in cgroups_of_unit.items()
            if (workloads[leaf].unit if leaf in workloads else leaf) in kept}


def vllm_targets(paths_of: Mapping[str, set[str]], found: Mapping[str, Endpoint], workloads: Mapping[str, Workload],
                 device_of: UnitDevices, attributions: Mapping[str, DeviceAttribution], gpus: list[str]
                 ) -> list[Target]:
    """The /sd/vllm target of each unit of `paths_of` whose cgroups have an endpoint in `found` (cgroup path ->
    endpoint; of several, the first path's), by leaf."""
    targets = []
    for leaf, paths in sorted(paths_of.items()):
        endpoint = next((found[path] for path in sorted(paths) if path in found), None)
        if endpoint is not None:
            workload = workloads.get(leaf, Workload(leaf))
            targets.append(Target(endpoint, workload, device_of.of(workload.unit, attributions, gpus)))
    return targets


def vllm_totals(devices: Iterable[DeviceMemory]) -> dict[str, int]:
    """device -> the total vLLM multiplies by gpu_memory_utilization: the Level Zero core API's where read, else
    Sysman's (the total a plan's figures are computed with, as the planner does)."""
    found = {}
    for device in devices:
        core = device.core.total if device.core is not None and device.core.total else None
        total = core if core is not None else device.total
        if total is not None:
            found[device.identity.pci_address] = total
    return found


def total_and_free(devices: Iterable[DeviceMemory]) -> dict[str, tuple[int, int]]:
    """device -> (total, free), for the devices whose total and free memory were both read: no rest, headroom
    or reading from a figure that is not known."""
    memory: dict[str, tuple[int, int]] = {}
    for device in devices:
        if device.total is not None and device.free is not None:
            memory[device.identity.pci_address] = (device.total, device.free)
    return memory


def as_vllm_reads(devices: Iterable[DeviceMemory]) -> dict[str, tuple[int, int]]:
    """device -> (total, free) as vLLM reads them on XPU: the Level Zero core API's total (what it multiplies by
    gpu_memory_utilization, ~0.95 of Sysman's) and the usable-memory extension's free, each where read, else
    Sysman's figure; only devices with both a total and a free. What vLLM demands at a start and what it sees
    free are compared with these; what the kernel can give (the rest, a wake) with Sysman's."""
    memory: dict[str, tuple[int, int]] = {}
    for device in devices:
        core = device.core
        total = core.total if core is not None and core.total else device.total
        free = core.usable if core is not None and core.usable is not None else device.free
        if total is not None and free is not None:
            memory[device.identity.pci_address] = (total, free)
    return memory


@dataclass(frozen=True)
class DeviceRest:
    """What no unit with series of its own accounts for on a device."""

    unattributed: int  # used - the attributed memory of the kept units and outside any unit, never negative
    overcounted: bool  # the processes' memory adds up to more than the used memory


def device_rests(memory: Mapping[str, tuple[int, int]], attributions: Mapping[str, DeviceAttribution],
                 kept: set[str]) -> dict[str, DeviceRest]:
    """Per device of `memory` (device -> (total, free)) with an attribution: its rest. The memory of units
    without series of their own (max-units) is part of the unattributed rest."""
    rests: dict[str, DeviceRest] = {}
    for pci, attribution in attributions.items():
        if pci not in memory:
            continue
        total, free = memory[pci]
        used = total - free
        attributed = attribution.total - sum(held for unit, held in attribution.by_unit.items() if unit not in kept)
        rests[pci] = DeviceRest(max(0, used - attributed), attribution.total > used)
    return rests


def restart_headrooms(memory: Mapping[str, tuple[int, int]], attributions: Mapping[str, DeviceAttribution],
                      views: Iterable[UnitView], device_of: UnitDevices, gpus: list[str]
                      ) -> list[tuple[str, str, int]]:
    """(device, unit, headroom bytes) for each unit whose gpu_memory_utilization is known, on its GPU (of
    `gpus`) when that GPU's total and free are known (`memory.restart_headroom_bytes`)."""
    headrooms = []
    for view in views:
        utilisation = view.gpu_memory_utilization
        pci = device_of.of(view.unit, attributions, gpus)
        if utilisation is None or pci not in memory:
            continue
        total, free = memory[pci]
        own = attributions[pci].by_unit.get(view.unit, 0) if pci in attributions else 0
        headrooms.append((pci, view.unit, memory_rules.restart_headroom_bytes(free, own, total, utilisation)))
    return headrooms


@dataclass(frozen=True)
class Wake:
    """A sleeping unit on its GPU and the memory its wake takes back."""

    device: str
    unit: str
    takes_back: int


def sleeping_units(attributions: Mapping[str, DeviceAttribution], views: Iterable[UnitView], device_of: UnitDevices,
                   gpus: list[str]) -> list[Wake]:
    """The units asleep now, on their GPU (of `gpus`): the running engine of the latest start went to sleep
    ("Sleep mode freed X GiB"), has printed no wake since ("It took X seconds to wake up tags") and holds less
    than it freed: a woken engine holds its weights and KV cache again, at least what it freed, so holding less
    is sleeping even where its wake's line was not read. Its wake takes back what it freed."""
    wakes = []
    for view in views:
        start = view.latest
        if start is None or start.asleep_bytes is None:
            continue
        pci = device_of.of(view.unit, attributions, gpus)
        if pci is None:
            continue
        held = attributions[pci].by_unit.get(view.unit, 0) if pci in attributions else 0
        if held < start.sleep_freed_bytes:
            wakes.append(Wake(pci, view.unit, start.sleep_freed_bytes))
    return wakes


def wake_headrooms(memory: Mapping[str, tuple[int, int]], wakes: Iterable[Wake]) -> dict[str, int]:
    """Per device of `memory` (device -> (total, free)): its free memory less what its sleeping units take back
    when they wake; negative: they cannot all wake now."""
    headrooms = {pci: free for pci, (_, free) in memory.items()}
    for wake in wakes:
        if wake.device in headrooms:
            headrooms[wake.device] -= wake.takes_back
    return headrooms


@dataclass(frozen=True)
class PlannedUnit:
    """One engine unit's plan on its GPU: its footprint and the KV its target needs."""

    device: str
    unit: str
    footprint_bytes: int
    kv_cache_bytes: int


class Plans:
    """Each engine unit's plan (`plans.plan_unit`), computed again only when what it reads changed: the
    starts' figures (the fold hands out fresh snapshots at every scrape, equal by identity only, so by their
    fields), the GPU and its total. At most PLANS_KEPT are kept, all dropped at once when full."""

    def __init__(self) -> None:
        self._plans: dict[tuple[object, ...], plans.UnitPlan | plans.Unplannable] = {}

    def plan(self, view: UnitView, pci: str, total: int) -> plans.UnitPlan | plans.Unplannable:
        key = (view.unit, pci, total, _fields(view.latest), _fields(view.last_success), _fields(view.last_profiled))
        plan = self._plans.get(key)
        if plan is None:
            plan = plans.plan_unit(view, pci, total, plans.budget_target(view))
            if len(self._plans) >= PLANS_KEPT:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def planned(self, totals: Mapping[str, int], attributions: Mapping[str, DeviceAttribution],
                views: Iterable[UnitView], device_of: UnitDevices, gpus: list[str]) -> list[PlannedUnit]:
        """The plan of each engine unit whose GPU (of `gpus`) and its total vLLM multiplies (`totals`) are known.
        The target is what the unit's --kv-cache-memory-bytes holds when set, else the planner's default (the KV of
        its last successful start)."""
        planned = []
        for view in views:
            if view.latest is None or view.latest.engine is False:
                continue
            pci = device_of.of(view.unit, attributions, gpus)
            if pci not in totals:
                continue
            plan = self.plan(view, pci, totals[pci])
            if isinstance(plan, plans.Unplannable):
                continue
            planned.append(PlannedUnit(pci, view.unit, plan.footprint.total_bytes, plan.kv_cache_memory_bytes))
        return planned


def starting_or_waiting(view: UnitView) -> bool:
    """Whether the unit's current start is an engine's that has not ended its init: waiting at its gate
    (announced, its main process not begun) or initialising (its outcome not known yet)."""
    current = view.current
    return current is not None and current.outcome is None and current.engine is not False


def admission_free(memory: Mapping[str, tuple[int, int]], attributions: Mapping[str, DeviceAttribution],
                   views: Iterable[UnitView], planned: Iterable[PlannedUnit], device_of: UnitDevices,
                   gpus: list[str], reserve: int = memory_rules.DEFAULT_RESERVE_BYTES) -> dict[str, int]:
    """device -> the bytes a new engine could take on it now: total - what is held now but by the engines
    starting or waiting (the serving engines' observed memory, and any other process's) - what each engine
    starting or waiting will hold (its planned footprint, else ceil(R x total) where its R is known, never less
    than it holds already) - `reserve`. Negative: over-committed. For the devices of `memory` (device ->
    (total, free)) only."""
    footprints = {(unit.device, unit.unit): unit.footprint_bytes for unit in planned}
    admission: dict[str, int] = {}
    for pci, (total, free) in memory.items():
        held_by = attributions[pci].by_unit if pci in attributions else {}
        held_by_starting = will_hold = 0
        for view in views:
            if not starting_or_waiting(view) or device_of.of(view.unit, attributions, gpus) != pci:
                continue
            held = held_by.get(view.unit, 0)
            ratio = view.gpu_memory_utilization
            asked = footprints.get((pci, view.unit),
                                   memory_rules.requested_bytes(total, ratio) if ratio is not None else 0)
            held_by_starting += held
            will_hold += max(asked, held)
        # total - (used - held_by_starting) - will_hold - reserve, used = total - free
        admission[pci] = free + held_by_starting - will_hold - reserve
    return dict(sorted(admission.items()))


def footprints_by_device(planned: Iterable[PlannedUnit]) -> dict[str, int]:
    """device -> its engine units' footprints summed, by device."""
    summed: dict[str, int] = {}
    for unit in planned:
        summed[unit.device] = summed.get(unit.device, 0) + unit.footprint_bytes
    return dict(sorted(summed.items()))


class StartFreeMemory:
    """The free memory each unit's latest start said it saw, against the driver's at the reading nearest that
    line (`start_free_memory`): every reading is kept for the lines to come, and each start's comparison once made."""

    def __init__(self) -> None:
        self._readings = start_free_memory.Readings()
        # (unit, start's began_usec) -> free memory at that start as vLLM and the driver saw it
        self._compared: dict[tuple[str, int], start_free_memory.FreeAtStart] = {}

    def figures(self, now_usec: int, memory: Mapping[str, tuple[int, int]],
                attributions: Mapping[str, DeviceAttribution], views: Iterable[UnitView], device_of: UnitDevices,
                gpus: list[str]) -> list[tuple[str, str, str, int]]:
        """Keep this reading (at `now_usec`) of each device with a known total and free and an attribution, and
        return (device, unit, seen by, bytes) for each unit whose latest start printed its free memory: seen by
        "vllm", and "levelzero" and "total_less_attributed" once a reading near that line is known."""
        for pci, (total, free) in memory.items():
            if pci in attributions:
                attribution = attributions[pci]
                self._readings.add(pci, start_free_memory.DeviceReading(now_usec, free, total,
                                                                        dict(attribution.by_unit), attribution.total))
        figures = []
        for view in views:
            start = view.latest
            if start is None or start.seen_free_bytes is None or start.seen_free_usec is None:
                continue
            pci = device_of.of(view.unit, attributions, gpus)
            if pci is None:
                continue
            key = (view.unit, start.began_usec)
            if key not in self._compared:
                reading = self._readings.nearest(pci, start.seen_free_usec)
                if reading is not None:
                    if len(self._compared) >= PLANS_KEPT:
                        self._compared.clear()
                    self._compared[key] = start_free_memory.free_at_start(view.unit, start.seen_free_bytes, reading)
            compared = self._compared.get(key)
            figures.append((pci, view.unit, "vllm", start.seen_free_bytes))
            if compared is not None:
                figures.append((pci, view.unit, "levelzero", compared.levelzero))
                figures.append((pci, view.unit, "total_less_attributed", compared.total_less_attributed))
        return figures


def _fields(start: object | None) -> tuple[object, ...] | None:
    return None if start is None else tuple(vars(start).values())
