"""Who holds each GPU's memory (`vllm_xpu_exporter.attribution`): the processes collector's reasoning over
readings given by hand, in process. The collector through the exporter is tests/collectors/test_processes.py,
tests/collectors/test_dmem.py and the containers' tests."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from vllm_xpu_exporter.fold.start import Start
from vllm_xpu_exporter.attribution import (DMEM, FDINFO, LEVELZERO, Attribution, DeviceAttribution, DeviceRest,
                                           PlannedUnit, StartFreeMemory, UnitDevices, Wake, admission_free,
                                           as_vllm_reads, attribute_device, attribute_devices, choose_units,
                                           container_plans, containers_of, device_rests, endpoint_cgroups,
                                           footprints_by_device, from_fdinfo, from_processes, gpus_only_dmem_sees,
                                           gpus_seen, held_by_unit, kept_workloads, rename_attribution,
                                           rename_engine_use, restart_headrooms, sleeping_units, total_and_free,
                                           unit_cgroups, vllm_targets, wake_headrooms)
from vllm_xpu_exporter.parsers.cgroup import UnitCgroup
from vllm_xpu_exporter.runtimes import ContainerCgroup
from vllm_xpu_exporter.runtimes.docker import ENGINE as DOCKER
from vllm_xpu_exporter.sources.containers import Workload
from vllm_xpu_exporter.sources.endpoints import Endpoint
from vllm_xpu_exporter.sources.levelzero.binding import (CoreMemory, DeviceIdentity, MemoryModule, MemoryModuleProperties,
                                                         ProcessMemory)
from vllm_xpu_exporter.sources.levelzero.worker import DeviceMemory, DeviceProcesses
from vllm_xpu_exporter.sources.procfs import ScanResult, UnitEngineUse

pytestmark = pytest.mark.fast  # the pure core (pyproject.toml's markers; `pytest -m fast`)

GPU, OTHER_GPU = "0000:03:00.0", "0000:04:00.0"
CHAT, STT = "vllm-xpu-chat.service", "vllm-xpu-stt.service"
ID = "4f2a9c0e3d1b5a6978c4e2f1a0b9d8c7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1"
DOCKER_LEAF, DOCKER_PATH = f"docker-{ID}.scope", f"/system.slice/docker-{ID}.scope"


def device_memory(pci: str, total: int | None = 1000, free: int = 400) -> DeviceMemory:
    identity = DeviceIdentity(pci, "Intel(R) Arc(TM) A770 Graphics", "0" * 32, "1.6.0")
    if total is None:
        return DeviceMemory(identity, (), None, None)
    return DeviceMemory(identity, (MemoryModuleProperties(0, True, total),), (MemoryModule(True, total, free, 1),),
                        None)


def attributed(by_unit: dict[str, int], total: int | None = None) -> DeviceAttribution:
    return DeviceAttribution((FDINFO,), by_unit, sum(by_unit.values()) if total is None else total)


def test_fdinfo_attributes_a_device_only_when_its_clients_print_memory_and_every_process_was_seen():
    scan = ScanResult(memory_by_device_unit={GPU: {CHAT: 300}}, memory_by_device={GPU: 350}, memory_keys_seen=True)
    assert from_fdinfo(scan, GPU) == Attribution(FDINFO, {CHAT: 300}, 350)
    assert from_fdinfo(scan, OTHER_GPU) == Attribution(FDINFO, {}, 0)  # every process seen: no client there
    assert from_fdinfo(ScanResult(memory_by_device={GPU: 0}, memory_keys_seen=False), GPU) is None  # 6.1 i915
    assert from_fdinfo(ScanResult(unreadable=3), OTHER_GPU) is None
    assert from_fdinfo(None, GPU) is None


def test_level_zeros_process_list_is_attributed_by_each_pids_unit_and_counts_every_process_in_the_total():
    identity = DeviceIdentity(GPU, "A770", "0" * 32, "1.6.0")
    reading = DeviceProcesses(identity, (ProcessMemory(10, 100, 0, 0), ProcessMemory(11, 50, 0, 0),
                                         ProcessMemory(12, 7, 0, 0)), None)
    cgroups = {10: UnitCgroup(CHAT, f"/system.slice/{CHAT}"), 11: UnitCgroup(CHAT, f"/system.slice/{CHAT}"), 12: None}
    assert from_processes(reading, cgroups) == Attribution(LEVELZERO, {CHAT: 150}, 157,
                                                           {CHAT: {f"/system.slice/{CHAT}"}})


def test_dmem_serves_the_units_it_lists_and_the_fallback_the_others():
    fallback = Attribution(FDINFO, {CHAT: 300, STT: 20}, 350)  # 30 bytes outside any unit
    result = attribute_device(fallback, {CHAT: 280, "idle.service": 0, "holder.service": 0}, {"holder.service"})
    assert result == DeviceAttribution((DMEM, FDINFO), {CHAT: 280, STT: 20, "holder.service": 0}, 330)
    assert attribute_device(None, {CHAT: 5}, set()) == DeviceAttribution((DMEM,), {CHAT: 5}, 5)
    assert attribute_device(None, {}, set()) is None
    assert attribute_device(Attribution(FDINFO, {}, 0), {}, set()) == DeviceAttribution((FDINFO,), {}, 0)


def test_devices_are_attributed_in_order_and_those_no_source_serves_are_named():
    scan = ScanResult(memory_by_device_unit={GPU: {STT: 0}})
    attributions, unserved = attribute_devices({OTHER_GPU: None, GPU: Attribution(FDINFO, {CHAT: 9}, 9)},
                                               {STT: {GPU: 0}}, scan)
    assert list(attributions) == [GPU] and unserved == [OTHER_GPU]
    assert attributions[GPU].by_unit == {CHAT: 9, STT: 0}  # STT holds clients there: reported at 0 from dmem
    assert gpus_only_dmem_sees({CHAT: {GPU: 5, OTHER_GPU: 4}, STT: {"0000:05:00.0": 0}}, [GPU]) == [OTHER_GPU]


def test_the_gpus_seen_are_level_zeros_and_the_scans_pci_devices_not_drm_minors():
    scan = ScanResult(memory_by_device={OTHER_GPU: 1, "226:128": 1})
    assert gpus_seen([device_memory(GPU)], scan) == [GPU, OTHER_GPU]
    assert gpus_seen([], None) == []


def test_a_units_cgroups_come_from_the_scan_and_from_level_zeros_processes():
    scan = ScanResult(unit_cgroups={CHAT: frozenset({"/a"})})
    found = unit_cgroups(scan, [None, Attribution(LEVELZERO, {}, 0, {CHAT: {"/b"}, STT: {"/c"}})])
    assert found == {CHAT: {"/a", "/b"}, STT: {"/c"}}


def test_a_containers_cgroup_names_its_container_and_known_paths_are_reused_then_forgotten():
    known: dict[str, ContainerCgroup | None] = {}
    containers = containers_of({DOCKER_LEAF: {DOCKER_PATH}, CHAT: {f"/system.slice/{CHAT}"}}, known)
    assert containers == {DOCKER_LEAF: ContainerCgroup(DOCKER, ID), CHAT: None}
    assert known == {DOCKER_PATH: ContainerCgroup(DOCKER, ID), f"/system.slice/{CHAT}": None}
    known[DOCKER_PATH] = None  # what the previous call found is what this one takes
    assert containers_of({DOCKER_LEAF: {DOCKER_PATH}}, known) == {DOCKER_LEAF: None}
    assert known == {DOCKER_PATH: None}


def test_the_units_of_one_workload_add_up_memory_and_engine_counters():
    workloads = {"a.scope": Workload("docker/chat", "docker"), "b.scope": Workload("docker/chat", "docker")}
    renamed = rename_attribution(DeviceAttribution((FDINFO,), {"a.scope": 3, "b.scope": 4, CHAT: 5}, 20), workloads)
    assert renamed == DeviceAttribution((FDINFO,), {"docker/chat": 7, CHAT: 5}, 20)
    one = UnitEngineUse({"render": 1.5}, {"render": 10}, {"render": 100})
    other = UnitEngineUse({"render": 0.5, "copy": 1.0}, {"render": 5}, {"render": 120})
    engines = rename_engine_use({GPU: {"a.scope": one, "b.scope": other}}, workloads)
    assert engines == {GPU: {"docker/chat": UnitEngineUse({"render": 2.0, "copy": 1.0}, {"render": 15},
                                                          {"render": 120})}}
    assert one == UnitEngineUse({"render": 1.5}, {"render": 10}, {"render": 100})  # the scan's own is untouched


def test_units_with_memory_or_clients_on_a_pci_gpu_compete_for_series():
    engines = {GPU: {"idle.scope": UnitEngineUse()}, "226:0": {"display.scope": UnitEngineUse()}}
    held = held_by_unit({GPU: attributed({CHAT: 3}), OTHER_GPU: attributed({CHAT: 4})}, engines)
    assert held == {CHAT: 7, "idle.scope": 0}


def test_which_units_keep_series_watched_first_then_largest_and_no_flapping_near_the_cut():
    held = {"vllm-a.service": 1, "big.scope": 100, "mid.scope": 50, "small.scope": 10, "b.scope": 10, "a.scope": 10}
    assert choose_units(held, set(), set(), 10) == set(held)
    kept = choose_units(held, {"vllm-a.service"}, set(), 3)
    assert kept == {"vllm-a.service", "big.scope", "mid.scope"}
    # mid.scope shrinks a little below a newcomer: it keeps its place (a kept unit counts double) ...
    held |= {"mid.scope": 40, "new.scope": 60}
    assert choose_units(held, {"vllm-a.service"}, kept, 3) == kept
    # ... until the newcomer holds more than twice as much
    held["new.scope"] = 81
    assert choose_units(held, {"vllm-a.service"}, kept, 3) == {"vllm-a.service", "big.scope", "new.scope"}
    # ties: the unit kept before, then by name
    ties = {"c.scope": 0, "b.scope": 0, "a.scope": 0}
    assert choose_units(ties, set(), set(), 2) == {"a.scope", "b.scope"}
    assert choose_units(ties, set(), {"c.scope"}, 2) == {"a.scope", "c.scope"}

def test_the_workload_info_of_kept_units_is_the_first_by_leaf_of_each_workload():
    workloads = {"b.scope": Workload("docker/chat", "docker", "b"), "a.scope": Workload("docker/chat", "docker", "a")}
    assert kept_workloads(workloads, {"docker/chat", CHAT}) == [Workload("docker/chat", "docker", "a"), Workload(CHAT)]


def test_a_units_gpu_is_the_one_it_last_held_memory_on_or_the_only_one():
    devices = UnitDevices()
    assert devices.of(CHAT, {GPU: attributed({CHAT: 0})}, [GPU, OTHER_GPU]) is None
    assert devices.of(CHAT, {GPU: attributed({CHAT: 0})}, [GPU]) == GPU  # the only GPU
    assert devices.of(CHAT, {OTHER_GPU: attributed({CHAT: 8})}, [GPU, OTHER_GPU]) == OTHER_GPU
    assert devices.of(CHAT, {}, [GPU, OTHER_GPU]) == OTHER_GPU  # stopped: the GPU it last held memory on
    assert devices.of(CHAT, {}, [GPU]) == GPU  # that GPU is gone


def test_the_unattributed_rest_counts_dropped_units_and_is_clamped_when_overcounted():
    memory = total_and_free([device_memory(GPU, 1000, 400), device_memory(OTHER_GPU, 1000, 900),
                             device_memory("0000:05:00.0", None)])
    assert memory == {GPU: (1000, 400), OTHER_GPU: (1000, 900)}
    attributions = {GPU: attributed({CHAT: 300, "dropped.scope": 50}, 400), OTHER_GPU: attributed({STT: 150}),
                    "0000:05:00.0": attributed({STT: 1})}
    # GPU: 600 used, 400 attributed of which 50 to a unit without series: 250 unattributed
    assert device_rests(memory, attributions, {CHAT, STT}) == {GPU: DeviceRest(250, False),
                                                               OTHER_GPU: DeviceRest(0, True)}


def test_vllms_view_of_a_device_is_the_core_total_and_usable_memory_where_read_else_sysmans():
    sysman_only = device_memory(GPU, 1000, 400)
    core_total = dataclasses.replace(device_memory(OTHER_GPU, 1000, 400), core=CoreMemory(950, None))
    both = dataclasses.replace(device_memory("0000:05:00.0", 1000, 400), core=CoreMemory(950, 350))
    refused = dataclasses.replace(device_memory("0000:06:00.0", None), core=CoreMemory(950, 300))
    assert as_vllm_reads([sysman_only, core_total, both, refused]) == {
        GPU: (1000, 400), OTHER_GPU: (950, 400), "0000:05:00.0": (950, 350), "0000:06:00.0": (950, 300)}
    assert total_and_free([sysman_only, core_total, both, refused]) == {
        GPU: (1000, 400), OTHER_GPU: (1000, 400), "0000:05:00.0": (1000, 400)}


def test_restart_headroom_is_free_plus_own_less_the_request_on_the_units_gpu():
    memory = {GPU: (1000, 400)}
    views = [SimpleNamespace(unit=CHAT, gpu_memory_utilization=0.75),
             SimpleNamespace(unit=STT, gpu_memory_utilization=None),
             SimpleNamespace(unit="elsewhere.service", gpu_memory_utilization=0.5)]
    attributions = {GPU: attributed({CHAT: 300})}
    assert restart_headrooms(memory, attributions, views, UnitDevices(), [GPU]) == [
        (GPU, CHAT, 400 + 300 - 750), (GPU, "elsewhere.service", 400 + 0 - 500)]
    # two GPUs, one of unknown free memory: a unit holding nothing has no GPU, so no headroom
    assert restart_headrooms(memory, attributions, views, UnitDevices(), [GPU, OTHER_GPU]) == [(GPU, CHAT, -50)]


def slept(unit: str, freed: int | None, process_gone: bool = False, woke: bool = False) -> SimpleNamespace:
    """A unit's view whose latest start ran and, with `freed`, went to sleep freeing that much (and printed its
    wake's end after, with `woke`)."""
    start = Start(0, slept_usec=None if freed is None else 1, sleep_freed_bytes=freed, process_gone=process_gone,
                  woke_usec=2 if woke else None)
    return SimpleNamespace(unit=unit, latest=start)


def test_a_unit_that_slept_and_holds_less_than_it_freed_is_asleep_and_its_wake_takes_back_what_it_freed():
    views = [slept(CHAT, 600), slept(STT, 200), slept("awake.service", None), slept("woken.service", 100),
             slept("stopped.service", 300, process_gone=True)]
    attributions = {GPU: attributed({CHAT: 90, STT: 40, "awake.service": 500, "woken.service": 150})}
    wakes = sleeping_units(attributions, views, UnitDevices(), [GPU])
    assert wakes == [Wake(GPU, CHAT, 600), Wake(GPU, STT, 200)]
    # free 700: chat and stt take back 800 together
    assert wake_headrooms({GPU: (1000, 700), OTHER_GPU: (1000, 900)}, wakes) == {GPU: -100, OTHER_GPU: 900}


def test_a_unit_that_printed_its_wakes_end_is_awake_whatever_its_memory_shows():
    attributions = {GPU: attributed({CHAT: 90})}
    assert sleeping_units(attributions, [slept(CHAT, 600, woke=True)], UnitDevices(), [GPU]) == []


def test_a_sleeping_unit_on_a_gpu_it_cannot_be_placed_on_has_no_wake():
    # two GPUs and the unit holds nothing on either: no GPU is known for it
    assert sleeping_units({GPU: attributed({})}, [slept(CHAT, 600)], UnitDevices(), [GPU, OTHER_GPU]) == []


def test_endpoints_are_looked_for_in_the_kept_units_cgroups_and_published_with_their_gpu():
    workloads = {DOCKER_LEAF: Workload("docker/chat", "docker", ID)}
    paths_of = endpoint_cgroups({DOCKER_LEAF: {DOCKER_PATH}, CHAT: {"/chat"}, "dropped.scope": {"/d"}}, workloads,
                                {"docker/chat", CHAT})
    assert paths_of == {DOCKER_LEAF: {DOCKER_PATH}, CHAT: {"/chat"}}
    endpoint = Endpoint(7, "http", "tcp", "127.0.0.1:8000", "socket")
    targets = vllm_targets(paths_of, {DOCKER_PATH: endpoint}, workloads, UnitDevices(),
                           {GPU: attributed({"docker/chat": 5})}, [GPU, OTHER_GPU])
    assert [(t.endpoint, t.workload.unit, t.device) for t in targets] == [(endpoint, "docker/chat", GPU)]


def test_the_footprints_of_a_gpus_units_are_summed_per_gpu():
    planned = [PlannedUnit(OTHER_GPU, CHAT, 5, 1), PlannedUnit(GPU, STT, 2, 1), PlannedUnit(OTHER_GPU, STT, 3, 1)]
    assert footprints_by_device(planned) == {GPU: 2, OTHER_GPU: 8}


def engine(unit: str, outcome: str | None, ratio: float | None = None, engine_: bool | None = True) -> SimpleNamespace:
    """A view whose current start ended with `outcome` (None: waiting at its gate or initialising)."""
    return SimpleNamespace(unit=unit, gpu_memory_utilization=ratio,
                           current=SimpleNamespace(outcome=outcome, engine=engine_))


def test_admission_is_free_less_the_starting_engines_plans_beyond_what_they_hold_and_the_reserve():
    """1000 total, 400 free: chat serves (300, observed), another process holds 150, stt initialises holding 150
    of its planned 200, embedding waits at its gate holding nothing (planned 100), `big` waits with no plan at
    R 0.05 (ceil(50)); a failed start and a start known to run no engine ask nothing."""
    memory = {GPU: (1000, 400)}
    views = [engine(CHAT, "ok", 0.3), engine(STT, None), engine("embedding.service", None),
             engine("big.service", None, 0.05), engine("failed.service", "failed", 0.5),
             engine("proxy.service", None, 0.5, engine_=False)]
    attributions = {GPU: attributed({CHAT: 300, STT: 150, "other.scope": 150})}
    planned = [PlannedUnit(GPU, STT, 200, 1), PlannedUnit(GPU, "embedding.service", 100, 1),
               PlannedUnit(GPU, CHAT, 900, 1)]  # a serving engine counts as observed, not as planned
    # total - (held by all but the starting: 300 + 150) - (200 + 100 + 50) - reserve
    assert admission_free(memory, attributions, views, planned, UnitDevices(), [GPU], reserve=10) == {
        GPU: 1000 - 450 - 350 - 10}
    # a starting engine already holding more than its plan counts at what it holds
    grown = {GPU: attributed({CHAT: 300, STT: 250, "other.scope": 150})}
    assert admission_free({GPU: (1000, 300)}, grown, views, planned, UnitDevices(), [GPU], reserve=10) == {
        GPU: 1000 - 450 - (250 + 100 + 50) - 10}


def test_admission_counts_an_engine_on_its_own_gpu_only_and_may_go_negative():
    memory = {GPU: (1000, 100), OTHER_GPU: (1000, 1000)}
    attributions = {GPU: attributed({CHAT: 900}), OTHER_GPU: attributed({})}
    views = [engine(CHAT, None, 0.95)]
    assert admission_free(memory, attributions, views, [], UnitDevices(), [GPU, OTHER_GPU], reserve=0) == {
        GPU: 1000 - 0 - 950, OTHER_GPU: 1000}
    assert admission_free({GPU: (1000, 0)}, {GPU: attributed({"x.scope": 1000})}, [], [], UnitDevices(), [GPU],
                          reserve=512) == {GPU: -512}


def test_the_free_memory_at_a_start_is_compared_with_the_reading_nearest_vllms_line_and_kept():
    start = SimpleNamespace(seen_free_bytes=900, seen_free_usec=1_000_000_000, began_usec=999_000_000)
    views = [SimpleNamespace(unit=CHAT, latest=start), SimpleNamespace(unit=STT, latest=None)]
    free_memory = StartFreeMemory()
    # the chat unit holds 300 of 450 attributed: levelzero is free + own, total_less_attributed total - others
    at_start = free_memory.figures(1_000_000_000 + 5_000_000, {GPU: (1000, 500)}, {GPU: attributed({CHAT: 300}, 450)},
                                   views, UnitDevices(), [GPU])
    assert at_start == [(GPU, CHAT, "vllm", 900), (GPU, CHAT, "levelzero", 500 + 300),
                        (GPU, CHAT, "total_less_attributed", 1000 - 150)]
    # an hour later, with other figures: the comparison made at the start is kept
    later = free_memory.figures(1_000_000_000 + 3_600_000_000, {GPU: (1000, 100)}, {GPU: attributed({CHAT: 800})},
                                views, UnitDevices(), [GPU])
    assert later == at_start
    # no reading near the line: vLLM's figure alone
    assert StartFreeMemory().figures(1_000_000_000 + 3_600_000_000, {GPU: (1000, 100)}, {GPU: attributed({CHAT: 800})},
                                     views, UnitDevices(), [GPU]) == [(GPU, CHAT, "vllm", 900)]


def test_a_containers_plan_is_served_for_a_watched_container_that_runs_an_engine():
    """The plan of each workload's record (`Workload.plan_kv_cache_bytes`) for the containers whose latest start
    is an engine's; a unit's plan is its drop-in's (not from here), a container known to run no engine, one not
    watched (no view) and one without a plan have none."""
    def view(unit: str, engine_: bool | None = True) -> SimpleNamespace:
        return SimpleNamespace(unit=unit, latest=SimpleNamespace(engine=engine_))

    workloads = {"a.scope": Workload("docker/chat", DOCKER, "a", plan_kv_cache_bytes=3481927680),
                 "b.scope": Workload("docker/chat", DOCKER, "a", plan_kv_cache_bytes=3481927680),
                 "c.scope": Workload("docker/proxy", DOCKER, "c", plan_kv_cache_bytes=5),
                 "d.scope": Workload("docker/unwatched", DOCKER, "d", plan_kv_cache_bytes=5),
                 "e.scope": Workload("podman/stt", "podman", "e"),
                 CHAT: Workload(CHAT, plan_kv_cache_bytes=7)}
    views = [view("docker/chat"), view("docker/proxy", engine_=False), view("podman/stt"), view(CHAT)]
    assert container_plans(views, workloads) == {"docker/chat": 3481927680}
