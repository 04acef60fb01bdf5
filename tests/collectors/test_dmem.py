"""Per-unit device memory from the kernel's dmem cgroup controller: the dmem.current parser, the reader over
fixture cgroup trees of both layouts (tests/fakecgroup.py), and the processes collector's attribution with
dmem beside fdinfo, in the exporter process over the fake Level Zero driver and a fixture procfs."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from vllm_xpu_exporter.parsers.dmem import DmemFormatError, parse_dmem_current, vram_by_device
from vllm_xpu_exporter.sources import dmem
from vllm_xpu_exporter.sources.dmem import DmemReader
from exporterproc import RunningExporter
from fakecgroup import FakeCgroupTree, dmem_current, xe_regions
from fakeprocfs import FakeProcfs, i915_fdinfo, v2_cgroup, xe_fdinfo
from fakeze import A770, B580
from polling import ManualClock, wait_for
from scrapes import sample, series
from sizes import GiB, MiB
from test_processes import CHAT, DEVICE, EMBEDDING, STT, CORE_TOTAL, TOTAL, UTILISATION, settled, start_exporter

OTHER = B580.pci_address
CAPACITY = {**xe_regions(DEVICE, vram0=8 * GiB, vram1=8 * GiB, stolen=64 * MiB),
            **xe_regions(OTHER, vram0=12 * GiB, stolen=32 * MiB)}


@pytest.fixture
def cgroups(tmp_path: Path) -> FakeCgroupTree:
    return FakeCgroupTree(tmp_path, CAPACITY)


# --- the parser -------------------------------------------------------------------------------------

@pytest.mark.fast
def test_dmem_current_as_the_kernel_prints_it_gives_each_devices_vram_summed_over_tiles():
    text = ("drm/0000:03:00.0/vram0 1073741824\ndrm/0000:03:00.0/vram1 536870912\ndrm/0000:03:00.0/stolen 8650752\n"
            "drm/0000:83:00.0/vram0 0\ndrm/0000:83:00.0/stolen 0\n")
    regions = parse_dmem_current(text)
    assert regions["drm/0000:03:00.0/stolen"] == 8650752
    assert vram_by_device(regions) == {DEVICE: GiB + 512 * MiB, OTHER: 0}


@pytest.mark.fast
def test_regions_that_are_not_a_drm_devices_vram_are_not_device_memory():
    regions = parse_dmem_current("drm/0000:03:00.0/stolen 4096\nttm/whatever 4096\ndrm/not-a-pci/vram0 4096\n"
                                 "drm/0000:03:00.0/vramx 4096\ndrm/0000:03:00.0 4096\ndrm/0000:03:00.0/vram0 0\n")
    assert vram_by_device(regions) == {DEVICE: 0}
    assert vram_by_device(parse_dmem_current("")) == {}


@pytest.mark.fast
def test_pci_addresses_of_regions_are_given_in_the_device_labels_spelling():
    assert vram_by_device(parse_dmem_current("drm/0000:AF:00.0/vram0 4096\n")) == {"0000:af:00.0": 4096}


@pytest.mark.fast
@pytest.mark.parametrize("text, complaint", [
    ("drm/0000:03:00.0/vram0 99999999999999999999\n", "over the plausible"),
    ("drm/0000:03:00.0/vram0 123456789012345678901\n", "is not '<region> <bytes>'"),
    ("drm/0000:03:00.0/vram0 max\n", "is not '<region> <bytes>'"),
    ("drm/0000:03:00.0/vram0 -4096\n", "is not '<region> <bytes>'"),
    ("drm/0000:03:00.0/vram0\t4096\n", "is not '<region> <bytes>'"),
    ("drm/0000:03:00.0/vram0 4096 extra\n", "is not '<region> <bytes>'"),
    ("drm/0000:03:00.0/vram0 1 GiB\n", "is not '<region> <bytes>'"),
    ("drm/0000:03:00.0/vram0 4096\n\n", "line 2 is not"),
    ("drm/0000:03:00.0/vram0 4096\ndrm/0000:03:00.0/vram0 4096\n", "listed twice"),
    ("x" * 300 + " 1\n", "longer than"),
    ("".join(f"drm/0000:03:00.0/vram{n} 1\n" for n in range(300)), "more than 256 regions"),
    ("\x00\x01\x02 garbage\xff\n", "is not '<region> <bytes>'"),
], ids=["20-digits-over-bound", "21-digits", "max", "negative", "tab", "extra-field", "unit", "empty-line",
        "duplicate", "long-line", "too-many-regions", "binary"])
def test_a_malformed_dmem_current_is_one_clear_error(text, complaint):
    with pytest.raises(DmemFormatError, match=complaint) as raised:
        parse_dmem_current(text)
    assert "\n" not in str(raised.value)


# --- the reader ---------------------------------------------------------------------------------------

def test_host_layout_reads_the_units_own_directory_including_its_sub_cgroups(cgroups):
    cgroups.add_cgroup(f"/system.slice/{CHAT}", xe_regions(DEVICE, vram0=3 * GiB, vram1=GiB, stolen=MiB))
    cgroups.add_cgroup(f"/system.slice/{CHAT}/payload", xe_regions(DEVICE, vram0=GiB))  # counted in its parent's
    cgroups.add_cgroup(f"/system.slice/{EMBEDDING}")  # the controller is off for it
    reading = DmemReader(str(cgroups.sysfs)).read({
        CHAT: [f"/system.slice/{CHAT}"], EMBEDDING: [f"/system.slice/{EMBEDDING}"],
        STT: [f"/system.slice/{STT}"]})  # no such cgroup (any more)
    assert reading.by_unit == {CHAT: {DEVICE: 4 * GiB, OTHER: 0}}
    assert reading.problems == []


def test_namespaced_view_finds_the_units_directory_by_name_once_and_reads_it_every_time(cgroups, monkeypatch):
    cgroups.add_cgroup("/system.slice/docker-4f2a.scope")  # the exporter's own container
    cgroups.add_cgroup(f"/system.slice/{CHAT}", xe_regions(DEVICE, vram0=2 * GiB))
    cgroups.add_cgroup(f"/system.slice/{EMBEDDING}", xe_regions(OTHER, vram0=GiB))
    walked = []
    real_scandir = dmem.os.scandir
    monkeypatch.setattr(dmem.os, "scandir", lambda path: walked.append(path) or real_scandir(path))
    reader = DmemReader(str(cgroups.sysfs))
    units = {CHAT: ["/../system.slice/" + CHAT], EMBEDDING: ["/../../" + EMBEDDING]}
    assert reader.read(units).by_unit == {CHAT: {DEVICE: 2 * GiB, OTHER: 0}, EMBEDDING: {DEVICE: 0, OTHER: GiB}}
    assert walked, "found by a walk of the tree"
    walked.clear()
    cgroups.set_dmem(f"/system.slice/{CHAT}", xe_regions(DEVICE, vram0=5 * GiB))
    assert reader.read(units).by_unit[CHAT] == {DEVICE: 5 * GiB, OTHER: 0}, "dmem.current read afresh"
    assert walked == [], "no walk once located"


def test_a_namespaced_unit_not_in_the_tree_is_looked_for_again_only_after_a_while(cgroups):
    clock = ManualClock()
    reader = DmemReader(str(cgroups.sysfs), relocate_seconds=60, clock=clock)
    units = {CHAT: ["/../system.slice/" + CHAT]}
    assert reader.read(units).by_unit == {}
    cgroups.add_cgroup(f"/system.slice/{CHAT}", xe_regions(DEVICE, vram0=GiB))
    clock.now += 30
    assert reader.read(units).by_unit == {}
    clock.now += 31
    assert reader.read(units).by_unit == {CHAT: {DEVICE: GiB, OTHER: 0}}


def test_a_namespaced_unit_found_twice_in_the_tree_is_not_read_from_dmem(cgroups):
    cgroups.add_cgroup(f"/system.slice/{CHAT}", xe_regions(DEVICE, vram0=GiB))
    # a nested systemd container's own unit of the same name
    cgroups.add_cgroup(f"/machine.slice/libpod-9c.scope/container/system.slice/{CHAT}", xe_regions(DEVICE, vram0=MiB))
    reader = DmemReader(str(cgroups.sysfs))
    assert reader.read({CHAT: ["/../system.slice/" + CHAT]}).by_unit == {}
    # a longer path tells them apart
    assert reader.read({CHAT: ["/../../machine.slice/libpod-9c.scope/container/system.slice/" + CHAT]}).by_unit == \
        {CHAT: {DEVICE: MiB, OTHER: 0}}


def test_a_unit_counts_only_when_each_of_its_cgroups_has_dmem_current(cgroups):
    first = "/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service"
    second = "/user.slice/user-1001.slice/user@1001.service/app.slice/vllm.service"
    cgroups.add_cgroup(first, xe_regions(DEVICE, vram0=GiB))
    cgroups.add_cgroup(second, xe_regions(DEVICE, vram0=2 * GiB))
    reader = DmemReader(str(cgroups.sysfs))
    assert reader.read({"vllm.service": [first, second]}).by_unit == {"vllm.service": {DEVICE: 3 * GiB, OTHER: 0}}
    cgroups.remove_dmem(second)
    assert reader.read({"vllm.service": [first, second]}).by_unit == {}


def test_a_malformed_file_costs_only_its_unit_and_says_which_file(cgroups):
    cgroups.add_cgroup(f"/system.slice/{CHAT}", xe_regions(DEVICE, vram0=GiB))
    cgroups.add_cgroup(f"/system.slice/{EMBEDDING}")
    cgroups.write_dmem_text(f"/system.slice/{EMBEDDING}", "drm/0000:03:00.0/vram0 99999999999999999999 GiB\n")
    cgroups.add_cgroup(f"/system.slice/{STT}")
    (cgroups.directory(f"/system.slice/{STT}") / "dmem.current").mkdir()  # unreadable: EISDIR
    reading = DmemReader(str(cgroups.sysfs)).read({unit: [f"/system.slice/{unit}"] for unit in (CHAT, EMBEDDING, STT)})
    assert reading.by_unit == {CHAT: {DEVICE: GiB, OTHER: 0}}
    assert len(reading.problems) == 2
    assert f"{EMBEDDING}/dmem.current: malformed: line 1" in reading.problems[0]
    assert f"cannot read {cgroups.directory(f'/system.slice/{STT}')}/dmem.current" in reading.problems[1]


def test_an_oversized_file_is_malformed_without_being_read_whole(cgroups):
    cgroups.add_cgroup(f"/system.slice/{CHAT}")
    cgroups.write_dmem_text(f"/system.slice/{CHAT}", "drm/0000:03:00.0/vram0 1\n" * 1_000_000)
    reading = DmemReader(str(cgroups.sysfs)).read({CHAT: [f"/system.slice/{CHAT}"]})
    assert reading.by_unit == {}
    assert reading.problems == [f"{cgroups.directory(f'/system.slice/{CHAT}')}/dmem.current: malformed: larger "
                                f"than {dmem.MAX_DMEM_CURRENT_BYTES} bytes"]


def test_paths_that_name_no_cgroup_below_the_root_are_not_read(cgroups):
    (cgroups.root / "dmem.current").write_text(dmem_current(xe_regions(DEVICE, vram0=GiB)))
    reading = DmemReader(str(cgroups.sysfs)).read({"a": ["/"], "b": ["/.."], "c": [""]})
    assert reading.by_unit == {}


# --- the processes collector ----------------------------------------------------------------------------

def start_with_dmem(tmp_path: Path, fake_driver: Path, config_path: Path, procfs: FakeProcfs,
                    cgroups: FakeCgroupTree, used: int, device=A770, **options) -> RunningExporter:
    """test_processes.start_exporter, with `cgroups` as the host's sysfs."""
    return start_exporter(tmp_path, fake_driver, config_path, procfs, used, device, "--path.sysfs",
                          str(cgroups.sysfs), **options)

def sources_of(samples: dict, device: str) -> set[str]:
    return {dict(labels)["source"] for labels in series(samples, "xpu_memory_attribution_info")
            if dict(labels)["device"] == device}


@pytest.mark.parametrize("cgroup_of", [
    lambda unit: v2_cgroup(f"/system.slice/{unit}"),
    lambda unit: v2_cgroup(f"/../system.slice/{unit}"),
], ids=["host", "container-namespace"])
def test_one_device_with_units_from_dmem_and_fdinfo(tmp_path, fake_driver, config_path, cgroup_of):
    procfs = FakeProcfs(tmp_path)
    cgroups = FakeCgroupTree(tmp_path, CAPACITY)
    # chat: dmem says 10 GiB (over two tiles) where its fdinfo shows 6 GiB
    procfs.add_process(100, cgroup_of(CHAT)).add_drm_fd(xe_fdinfo(client_id=1, vram0=6 * GiB))
    cgroups.add_cgroup(f"/system.slice/{CHAT}", xe_regions(DEVICE, vram0=8 * GiB, vram1=2 * GiB))
    # embedding: no dmem controller for its cgroup: fdinfo
    procfs.add_process(200, cgroup_of(EMBEDDING)).add_drm_fd(xe_fdinfo(client_id=2, vram0=GiB))
    cgroups.add_cgroup(f"/system.slice/{EMBEDDING}")
    # stt: a DRM client, and its dmem.current lists the device with 0: 0 bytes from dmem
    procfs.add_process(300, cgroup_of(STT)).add_drm_fd(xe_fdinfo(client_id=3, vram0=512 * MiB))
    cgroups.add_cgroup(f"/system.slice/{STT}", {})
    used = 10 * GiB + GiB + 2 * GiB
    with start_with_dmem(tmp_path, fake_driver, config_path, procfs, cgroups, used) as exporter:
        samples = settled(exporter)
    held = {CHAT: 10 * GiB, EMBEDDING: GiB, STT: 0}
    assert {dict(labels)["unit"]: value for labels, value in series(samples, "xpu_unit_memory_bytes").items()} == held
    assert sources_of(samples, DEVICE) == {"dmem", "fdinfo"}
    assert sample(samples, "xpu_unattributed_memory_bytes", device=DEVICE) == used - sum(held.values())
    assert sample(samples, "xpu_memory_attribution_overcounted", device=DEVICE) == 0
    for unit, utilisation in UTILISATION.items():
        assert sample(samples, "xpu_unit_restart_headroom_bytes", device=DEVICE, unit=unit) == \
            TOTAL - used + held[unit] - math.ceil(utilisation * CORE_TOTAL)
    assert sample(samples, "xpu_exporter_collector_success", collector="processes") == 1


def test_a_unit_whose_dmem_current_goes_falls_back_to_fdinfo_and_comes_back(tmp_path, fake_driver, config_path):
    procfs = FakeProcfs(tmp_path)
    cgroups = FakeCgroupTree(tmp_path, CAPACITY)
    procfs.add_unit_process(100, f"/system.slice/{CHAT}").add_drm_fd(xe_fdinfo(client_id=1, vram0=6 * GiB))
    cgroups.add_cgroup(f"/system.slice/{CHAT}", xe_regions(DEVICE, vram0=7 * GiB))
    with start_with_dmem(tmp_path, fake_driver, config_path, procfs, cgroups, 8 * GiB) as exporter:
        scrapes = [settled(exporter)]
        cgroups.remove_dmem(f"/system.slice/{CHAT}")
        scrapes.append(exporter.scrape())
        cgroups.set_dmem(f"/system.slice/{CHAT}", xe_regions(DEVICE, vram0=7 * GiB))
        scrapes.append(exporter.scrape())
    expected = [(7 * GiB, {"dmem"}), (6 * GiB, {"fdinfo"}), (7 * GiB, {"dmem"})]
    assert [(sample(s, "xpu_unit_memory_bytes", device=DEVICE, unit=CHAT), sources_of(s, DEVICE))
            for s in scrapes] == expected
    assert [sample(s, "xpu_unattributed_memory_bytes", device=DEVICE) for s in scrapes] == [GiB, 2 * GiB, GiB]
    assert all(sample(s, "xpu_exporter_collector_success", collector="processes") == 1 for s in scrapes)


def test_a_hostile_dmem_current_is_reported_and_its_unit_falls_back_to_fdinfo(tmp_path, fake_driver, config_path):
    procfs = FakeProcfs(tmp_path)
    cgroups = FakeCgroupTree(tmp_path, CAPACITY)
    procfs.add_unit_process(100, f"/system.slice/{CHAT}").add_drm_fd(xe_fdinfo(client_id=1, vram0=6 * GiB))
    cgroups.add_cgroup(f"/system.slice/{CHAT}")
    cgroups.write_dmem_text(f"/system.slice/{CHAT}", b"drm/0000:03:00.0/vram0 18446744073709551615\n\xff\xfe\n")
    procfs.add_unit_process(200, f"/system.slice/{EMBEDDING}").add_drm_fd(xe_fdinfo(client_id=2, vram0=GiB))
    cgroups.add_cgroup(f"/system.slice/{EMBEDDING}", xe_regions(DEVICE, vram0=2 * GiB))
    with start_with_dmem(tmp_path, fake_driver, config_path, procfs, cgroups, 8 * GiB) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and
                           sample(s, "xpu_exporter_collector_success", collector="journal") == 1 and s)
        stderr = exporter.stderr
    assert sample(samples, "xpu_exporter_collector_success", collector="processes") == 0
    assert sample(samples, "xpu_unit_memory_bytes", device=DEVICE, unit=CHAT) == 6 * GiB
    assert sample(samples, "xpu_unit_memory_bytes", device=DEVICE, unit=EMBEDDING) == 2 * GiB
    assert sources_of(samples, DEVICE) == {"dmem", "fdinfo"}
    assert sample(samples, "xpu_unattributed_memory_bytes", device=DEVICE) == 0
    problem = [line for line in stderr.splitlines() if "dmem.current: malformed" in line]
    assert problem and f"{CHAT}/dmem.current: malformed: line 1" in problem[0]
    assert "Traceback" not in stderr


def test_without_ptrace_dmem_gives_the_memory_of_units_whose_fds_cannot_be_read(tmp_path, fake_driver,
                                                                                config_path):
    procfs = FakeProcfs(tmp_path)
    cgroups = FakeCgroupTree(tmp_path, CAPACITY)
    procfs.add_unreadable_process(100, v2_cgroup(f"/system.slice/{CHAT}/payload"))
    procfs.add_unreadable_process(101, v2_cgroup(f"/system.slice/{CHAT}"))
    cgroups.add_cgroup(f"/system.slice/{CHAT}/payload", xe_regions(DEVICE, vram0=5 * GiB))
    cgroups.set_dmem(f"/system.slice/{CHAT}", xe_regions(DEVICE, vram0=5 * GiB))
    procfs.add_unreadable_process(200, v2_cgroup("/system.slice/sshd.service"))  # no device memory: not reported
    cgroups.add_cgroup("/system.slice/sshd.service", {})
    procfs.add_unreadable_process(300, v2_cgroup(f"/system.slice/{STT}"))  # on the other GPU
    cgroups.add_cgroup(f"/system.slice/{STT}", xe_regions(OTHER, vram0=GiB))
    no_process_list = {"processes_result": "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE"}
    with start_with_dmem(tmp_path, fake_driver, config_path, procfs, cgroups, 6 * GiB,
                         dataclasses.replace(A770, **no_process_list),
                         other_devices=(dataclasses.replace(B580, **no_process_list),)) as exporter:
        samples = settled(exporter)
        stderr = exporter.stderr
    assert series(samples, "xpu_unit_memory_bytes") == {
        (("device", DEVICE), ("unit", CHAT)): 5 * GiB, (("device", OTHER), ("unit", STT)): GiB}
    assert sources_of(samples, DEVICE) == sources_of(samples, OTHER) == {"dmem"}
    assert sample(samples, "xpu_unattributed_memory_bytes", device=DEVICE) == GiB
    assert sample(samples, "xpu_exporter_collector_success", collector="processes") == 1
    assert "CAP_SYS_PTRACE" in stderr  # fdinfo (and engine use) still need it


def test_a_dmem_current_that_lists_no_region_of_the_device_leaves_the_unit_to_fdinfo(tmp_path, fake_driver,
                                                                                        config_path):
    procfs = FakeProcfs(tmp_path)
    cgroups = FakeCgroupTree(tmp_path, xe_regions(DEVICE, vram0=16 * GiB))  # only the xe GPU registers regions
    chat = procfs.add_unit_process(100, f"/system.slice/{CHAT}")
    chat.add_drm_fd(xe_fdinfo(client_id=1, vram0=GiB))
    chat.add_drm_fd(i915_fdinfo(client_id=2, pdev=OTHER, local0=3 * GiB))
    cgroups.add_cgroup(f"/system.slice/{CHAT}", xe_regions(DEVICE, vram0=2 * GiB))
    with start_with_dmem(tmp_path, fake_driver, config_path, procfs, cgroups, 2 * GiB,
                         other_devices=(B580,)) as exporter:
        samples = settled(exporter)
    assert sample(samples, "xpu_unit_memory_bytes", device=DEVICE, unit=CHAT) == 2 * GiB
    assert sample(samples, "xpu_unit_memory_bytes", device=OTHER, unit=CHAT) == 3 * GiB
    assert (sources_of(samples, DEVICE), sources_of(samples, OTHER)) == ({"dmem"}, {"fdinfo"})


def test_a_tree_whose_root_does_not_offer_the_dmem_controller_is_not_read(cgroups):
    cgroups.add_cgroup(f"/system.slice/{CHAT}", xe_regions(DEVICE, vram0=GiB))
    reader = DmemReader(str(cgroups.sysfs))
    assert reader.read({CHAT: [f"/system.slice/{CHAT}"]}).by_unit == {CHAT: {DEVICE: GiB, OTHER: 0}}
    (cgroups.root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")  # a kernel before 6.14
    assert reader.read({CHAT: [f"/system.slice/{CHAT}"]}).by_unit == {}
    (cgroups.root / "cgroup.controllers").unlink()  # not a cgroup v2 mount (v1 or hybrid host)
    assert reader.read({CHAT: [f"/system.slice/{CHAT}"]}).by_unit == {}
