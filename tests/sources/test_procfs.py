"""The procfs source: whole scans over fake procfs trees (tests/fakeprocfs.py) with real device nodes,
plus the real /proc of this machine. The cgroup -> unit rules are tests/parsers/test_cgroup.py's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from vllm_xpu_exporter.collectors.processes import unreadable_warning
from vllm_xpu_exporter.parsers.cgroup import unit_of_cgroup_file
from vllm_xpu_exporter.parsers.fdinfo import parse_engine_use
from vllm_xpu_exporter.sources import procfs as procfs_source
from vllm_xpu_exporter.sources.procfs import (
    DrmClientScanner,
    ProcfsUnavailable,
    ScanResult,
    UnitEngineUse,
    process_age_seconds,
    read_open_bytes,
    read_unit_cgroup,
    scan_drm_clients,
)
from fakeprocfs import (
    CARD_MINOR,
    FakeProcfs,
    i915_61_fdinfo,
    i915_fdinfo,
    v1_cgroup,
    XE_DEFAULT_CYCLES,
    XE_ENGINES,
    v2_cgroup,
    xe_fdinfo,
)
from polling import ManualClock

KiB = 1 << 10
MiB = 1 << 20
GPU = "0000:03:00.0"
GPU2 = "0000:83:00.0"
CHAT = "/system.slice/vllm-xpu-chat.service"
CODE = "/system.slice/vllm-xpu-code.service"


@pytest.fixture
def tree(tmp_path: Path) -> FakeProcfs:
    return FakeProcfs(tmp_path)


def scan(tree: FakeProcfs) -> ScanResult:
    return scan_drm_clients(str(tree.root))



# --- whole scans -----------------------------------------------------------------------------------

def test_scan_gives_the_cgroups_of_drm_holders_units_and_of_processes_it_could_not_read(tree: FakeProcfs):
    tree.add_unit_process(100, CHAT + "/payload").add_drm_fd(xe_fdinfo(client_id=1, vram0=MiB))
    tree.add_process(101, "0::/../system.slice/vllm-xpu-chat.service\n").add_drm_fd(xe_fdinfo(client_id=2))
    tree.add_unit_process(200, CODE).add_other_fds(3)  # readable, no DRM client: not asked about
    tree.add_unreadable_process(300, v2_cgroup("/system.slice/vllm-xpu-stt.service"))
    tree.add_unreadable_process(301)  # root cgroup: no unit
    result = scan(tree)
    assert result.unreadable == 2
    assert result.unit_cgroups == {
        "vllm-xpu-chat.service": frozenset({CHAT, "/../system.slice/vllm-xpu-chat.service"}),
        "vllm-xpu-stt.service": frozenset({"/system.slice/vllm-xpu-stt.service"}),
    }
    assert result.unit_by_pid == {100: "vllm-xpu-chat.service", 101: "vllm-xpu-chat.service"}


def test_scanner_reads_an_unreadable_processs_cgroup_once_per_walk(tmp_path):
    procfs = FakeProcfs(tmp_path)
    procfs.add_unreadable_process(300, v2_cgroup("/system.slice/vllm-a.service"))
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), rescan_seconds=10, young_seconds=0, clock=clock)
    assert set(scanner.scan().unit_cgroups) == {"vllm-a.service"}
    (procfs.root / "300" / "cgroup").write_text(v2_cgroup("/system.slice/vllm-b.service"))
    clock.now += 1
    assert set(scanner.scan().unit_cgroups) == {"vllm-a.service"}, "read at the walk, not at every scan"
    clock.now += 30
    assert set(scanner.scan().unit_cgroups) == {"vllm-b.service"}

def test_duplicated_fds_of_one_client_count_once(tree: FakeProcfs):
    process = tree.add_unit_process(100, CHAT)
    for _ in range(3):
        process.add_drm_fd(xe_fdinfo(client_id=7, vram0=512 * MiB, unit="MiB"))
    result = scan(tree)
    assert (result.clients, result.drm_fds) == (1, 3)
    assert result.memory_by_device_unit == {GPU: {"vllm-xpu-chat.service": 512 * MiB}}


def test_client_shared_between_processes_counts_once_for_the_lowest_pid(tree: FakeProcfs):
    # Created in descending pid order, so a scan in directory order would meet pid 300 first.
    tree.add_unit_process(300, CODE).add_drm_fd(xe_fdinfo(client_id=7, vram0=1 * MiB))
    tree.add_unit_process(200, CHAT).add_drm_fd(xe_fdinfo(client_id=7, vram0=1 * MiB))
    result = scan(tree)
    assert result.clients == 1
    assert result.memory_by_device_pid == {GPU: {200: 1 * MiB}}
    assert result.memory_by_device_unit == {GPU: {"vllm-xpu-chat.service": 1 * MiB}}
    assert result.unit_by_pid == {200: "vllm-xpu-chat.service"}


def test_distinct_clients_of_one_process_are_summed(tree: FakeProcfs):
    process = tree.add_unit_process(100, CHAT)
    process.add_drm_fd(xe_fdinfo(client_id=1, vram0=3 * MiB))
    process.add_drm_fd(xe_fdinfo(client_id=2, vram0=5 * MiB))
    assert scan(tree).memory_by_device_pid == {GPU: {100: 8 * MiB}}


def test_same_client_id_on_two_devices_is_two_clients(tree: FakeProcfs):
    process = tree.add_unit_process(100, CHAT)
    process.add_drm_fd(i915_fdinfo(client_id=4, pdev=GPU, local0=1 * MiB))
    process.add_drm_fd(i915_fdinfo(client_id=4, pdev=GPU2, local0=2 * MiB), minor=129)
    result = scan(tree)
    assert result.clients == 2
    assert result.memory_by_device_unit == {GPU: {"vllm-xpu-chat.service": 1 * MiB},
                                            GPU2: {"vllm-xpu-chat.service": 2 * MiB}}
    assert result.driver_by_device == {GPU: "i915", GPU2: "i915"}


def test_client_without_pdev_is_keyed_by_device_minor(tree: FakeProcfs):
    process = tree.add_unit_process(100, CHAT)
    process.add_drm_fd(xe_fdinfo(client_id=4, pdev=None, vram0=1 * MiB))
    process.add_drm_fd(xe_fdinfo(client_id=4, pdev=None, vram0=1 * MiB))
    process.add_drm_fd(xe_fdinfo(client_id=4, pdev=None, vram0=2 * MiB), minor=CARD_MINOR)
    result = scan(tree)
    assert result.clients == 2
    assert result.memory_by_device == {"226:128": 1 * MiB, "226:0": 2 * MiB}


def test_without_client_id_every_fd_counts(tree: FakeProcfs):
    process = tree.add_unit_process(100, CHAT)
    process.add_drm_fd(xe_fdinfo(client_id=None, vram0=1 * MiB))
    process.add_drm_fd(xe_fdinfo(client_id=None, vram0=1 * MiB))
    result = scan(tree)
    assert result.clients == 2
    assert result.memory_by_device == {GPU: 2 * MiB}


def test_memory_values_in_bytes_kib_and_mib_are_exact(tree: FakeProcfs):
    tree.add_unit_process(100, CHAT).add_drm_fd(xe_fdinfo(client_id=1, vram0=65536, unit=""))
    tree.add_unit_process(101, CHAT).add_drm_fd(xe_fdinfo(client_id=2, vram0=23992 * KiB, unit="KiB"))
    tree.add_unit_process(102, CHAT).add_drm_fd(xe_fdinfo(client_id=3, vram0=16 * MiB, unit="MiB"))
    assert scan(tree).memory_by_device_pid == {GPU: {100: 65536, 101: 23992 * KiB, 102: 16 * MiB}}


def test_processes_of_one_unit_and_its_sub_cgroups_add_up(tree: FakeProcfs):
    tree.add_unit_process(100, CHAT).add_drm_fd(xe_fdinfo(client_id=1, vram0=1 * MiB))
    tree.add_unit_process(101, CHAT + "/payload").add_drm_fd(xe_fdinfo(client_id=2, vram0=2 * MiB))
    tree.add_process(102, v1_cgroup(CHAT)).add_drm_fd(xe_fdinfo(client_id=3, vram0=4 * MiB))
    tree.add_unit_process(103, CODE).add_drm_fd(xe_fdinfo(client_id=4, vram0=8 * MiB))
    assert scan(tree).memory_by_device_unit == {
        GPU: {"vllm-xpu-chat.service": 7 * MiB, "vllm-xpu-code.service": 8 * MiB}}


def test_process_outside_any_unit_counts_for_the_device_but_no_unit(tree: FakeProcfs):
    tree.add_unit_process(100, CHAT).add_drm_fd(xe_fdinfo(client_id=1, vram0=1 * MiB))
    tree.add_process(101, v2_cgroup("/")).add_drm_fd(xe_fdinfo(client_id=2, vram0=2 * MiB))
    result = scan(tree)
    assert result.memory_by_device_unit == {GPU: {"vllm-xpu-chat.service": 1 * MiB}}
    assert result.memory_by_device == {GPU: 3 * MiB}
    assert result.unit_by_pid == {100: "vllm-xpu-chat.service", 101: None}


def test_session_process_is_attributed_to_its_scope(tree: FakeProcfs):
    tree.add_unit_process(100, "/user.slice/user-1000.slice/session-3.scope").add_drm_fd(
        xe_fdinfo(client_id=1, vram0=1 * MiB))
    assert scan(tree).memory_by_device_unit == {GPU: {"session-3.scope": 1 * MiB}}


def test_i915_kernel_61_has_clients_and_units_but_no_memory_keys(tree: FakeProcfs):
    tree.add_unit_process(100, CHAT).add_drm_fd(i915_61_fdinfo(client_id=1))
    result = scan(tree)
    assert (result.clients, result.memory_keys_seen) == (1, False)
    assert result.memory_by_device_unit == {GPU: {"vllm-xpu-chat.service": 0}}


def test_i915_kernel_612_local0_is_device_memory(tree: FakeProcfs):
    tree.add_unit_process(100, CHAT).add_drm_fd(i915_fdinfo(client_id=1, local0=300 * MiB, system0=7 * MiB))
    result = scan(tree)
    assert result.memory_keys_seen
    assert result.memory_by_device_unit == {GPU: {"vllm-xpu-chat.service": 300 * MiB}}


def test_non_drm_fds_and_non_gpu_processes_are_ignored_without_reading_them(tree: FakeProcfs):
    gpu = tree.add_unit_process(100, CHAT)
    gpu.add_other_fds(9)
    gpu.add_drm_fd(xe_fdinfo(client_id=1, vram0=1 * MiB))
    idle = tree.add_unit_process(101, CODE)
    idle.add_other_fds(6)
    # Were these read, the scan would count them unreadable: the cgroup of a process without DRM
    # clients, and the fdinfo of a non-DRM fd.
    idle.make_cgroup_unreadable()
    (gpu.path / "fdinfo" / "0").unlink()
    (gpu.path / "fdinfo" / "0").mkdir()
    result = scan(tree)
    assert (result.drm_fds, result.clients, result.processes) == (1, 1, 2)
    assert (result.unreadable, result.vanished) == (0, 0)
    assert result.unit_by_pid == {100: "vllm-xpu-chat.service"}


def test_vanished_processes_and_fds_are_counted_and_the_scan_goes_on(tree: FakeProcfs):
    tree.add_vanished_process(50)
    closing = tree.add_unit_process(60, CODE)
    closing.add_drm_fd_without_fdinfo()
    closing.add_dangling_fd()
    exited = tree.add_unit_process(70, CODE)
    exited.add_drm_fd(xe_fdinfo(client_id=9, vram0=4 * MiB))
    exited.remove_cgroup()
    tree.add_unit_process(80, CODE).add_dangling_fd()  # fd churn, not counted
    tree.add_unit_process(100, CHAT).add_drm_fd(xe_fdinfo(client_id=1, vram0=1 * MiB))
    result = scan(tree)
    assert result.vanished == 3
    assert result.unreadable == 0
    assert result.memory_by_device_unit == {GPU: {"vllm-xpu-chat.service": 1 * MiB}}
    assert result.memory_by_device == {GPU: 5 * MiB}
    assert result.unit_by_pid == {70: None, 100: "vllm-xpu-chat.service"}


def test_unreadable_processes_are_counted_and_the_scan_goes_on(tree: FakeProcfs):
    tree.add_unreadable_process(50)
    tree.add_unit_process(60, CODE).add_drm_fd_with_unreadable_fdinfo()
    hidden = tree.add_unit_process(70, CODE)
    hidden.add_drm_fd(xe_fdinfo(client_id=9, vram0=4 * MiB))
    hidden.make_cgroup_unreadable()
    tree.add_unit_process(100, CHAT).add_drm_fd(xe_fdinfo(client_id=1, vram0=1 * MiB))
    result = scan(tree)
    assert (result.unreadable, result.vanished) == (3, 0)
    assert result.memory_by_device_unit == {GPU: {"vllm-xpu-chat.service": 1 * MiB}}
    assert result.unit_by_pid == {70: None, 100: "vllm-xpu-chat.service"}


def test_empty_gpu_host_has_no_clients(tree: FakeProcfs):
    tree.add_unit_process(1, "/init.scope").add_other_fds(5)
    result = scan(tree)
    assert result == ScanResult(processes=1)


@pytest.mark.parametrize("make_root", [
    lambda base: base / "missing",
    lambda base: (base / "file").write_text("") and base / "file",
    lambda base: (base / "empty").mkdir() or base / "empty",
    lambda base: (base / "not-proc").mkdir() or (base / "not-proc" / "self").mkdir() or base / "not-proc",
], ids=["missing", "a-file", "empty-directory", "no-pid-directories"])
def test_unusable_procfs_root_raises_procfs_unavailable(tmp_path: Path, make_root):
    root = make_root(tmp_path)
    with pytest.raises(ProcfsUnavailable):
        scan_drm_clients(str(root))


# --- real permissions and the real /proc ---------------------------------------------------------

@pytest.fixture
def world_readable_tree() -> Iterator[FakeProcfs]:
    base = Path(tempfile.mkdtemp(prefix="fakeprocfs-"))
    base.chmod(0o755)
    try:
        yield FakeProcfs(base)
    finally:
        shutil.rmtree(base)


def scan_as_nobody(procfs: str) -> dict:
    """Runs a scan in a forked child that has dropped root to nobody (65534), as an exporter without
    CAP_SYS_PTRACE/CAP_DAC_READ_SEARCH would."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        status = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            payload = json.dumps(asdict(scan_drm_clients(procfs)), default=str)
            os.write(write_end, payload.encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        payload = reader.read()
    _, wait_status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0, "the unprivileged scan raised"
    return json.loads(payload)


def test_permission_denied_counts_unreadable_for_a_reader_without_privileges(world_readable_tree: FakeProcfs):
    tree = world_readable_tree
    for directory in (tree.root, tree.base / "dev", tree.base / "files"):
        directory.mkdir(exist_ok=True)
        directory.chmod(0o755)
    open_ = tree.add_unit_process(100, CHAT)
    open_.add_drm_fd(xe_fdinfo(client_id=1, vram0=1 * MiB))
    open_.add_other_fds(2)
    private = tree.add_unit_process(200, CODE)
    private.add_other_fds(3)
    private.add_drm_fd(xe_fdinfo(client_id=2, vram0=2 * MiB))
    private.make_private()
    ptrace_denied = tree.add_unit_process(300, CODE)
    ptrace_denied.add_fd_behind_private_directory()
    ptrace_denied.add_fd_behind_private_directory()
    as_root = scan_drm_clients(str(tree.root))
    assert (as_root.clients, as_root.unreadable) == (2, 0)
    as_nobody = scan_as_nobody(str(tree.root))
    assert (as_nobody["clients"], as_nobody["unreadable"], as_nobody["vanished"]) == (1, 2, 0)
    assert as_nobody["memory_by_device_unit"] == {GPU: {"vllm-xpu-chat.service": 1 * MiB}}


def test_real_proc_scans_and_its_totals_are_consistent():
    result = scan_drm_clients("/proc")
    assert result.processes >= 2
    holders = {pid for by_pid in result.memory_by_device_pid.values() for pid in by_pid}
    assert set(result.unit_by_pid) == holders
    assert result.clients >= len(holders)
    for device, by_pid in result.memory_by_device_pid.items():
        assert result.memory_by_device[device] == sum(by_pid.values())
        assert sum(result.memory_by_device_unit[device].values()) <= result.memory_by_device[device]


def test_the_unit_cgroup_on_real_proc_matches_own_cgroup_file():
    expected = unit_of_cgroup_file(Path("/proc/self/cgroup").read_text())
    unit_cgroup = read_unit_cgroup("/proc", os.getpid())
    assert (None if unit_cgroup is None else unit_cgroup.unit) == expected


def test_scanner_agrees_with_a_full_scan(tmp_path):
    procfs = FakeProcfs(tmp_path)
    for pid in (10, 11, 12):
        process = procfs.add_unit_process(pid, f"/system.slice/vllm-{pid}.service")
        process.add_drm_fd(xe_fdinfo(client_id=pid, vram0=pid * 1 << 20))
        process.add_other_fds(3)
    scanner = DrmClientScanner(str(procfs.root))
    assert scanner.scan() == scan_drm_clients(str(procfs.root))
    assert scanner.scan() == scan_drm_clients(str(procfs.root))


def test_scanner_sees_new_processes_at_once_and_new_fds_of_known_ones_after_the_rescan_time(tmp_path):
    procfs = FakeProcfs(tmp_path)
    known = procfs.add_unit_process(10, "/system.slice/vllm-a.service")
    known.add_drm_fd(xe_fdinfo(client_id=1, vram0=MiB))
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), rescan_seconds=10, young_seconds=0, clock=clock)
    assert scanner.scan().memory_by_device["0000:03:00.0"] == MiB

    procfs.add_unit_process(20, "/system.slice/vllm-b.service").add_drm_fd(xe_fdinfo(client_id=2, vram0=2 * MiB))
    known.add_drm_fd(xe_fdinfo(client_id=3, vram0=4 * MiB))
    clock.now += 1
    assert scanner.scan().memory_by_device["0000:03:00.0"] == 3 * MiB  # the new process, not the new fd

    clock.now += 15  # walks are spread over 0.5 to 1.5 times the rescan time
    assert scanner.scan().memory_by_device["0000:03:00.0"] == 7 * MiB


def test_a_young_process_is_walked_at_every_scan_and_a_settled_one_after_the_rescan_time(tmp_path):
    procfs = FakeProcfs(tmp_path)
    young = procfs.add_unit_process(10, "/system.slice/vllm-a.service", started_seconds_ago=5)
    settled = procfs.add_unit_process(20, "/system.slice/vllm-b.service", started_seconds_ago=3600)
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), rescan_seconds=60, young_seconds=60, clock=clock)
    assert scanner.scan().memory_by_device == {}

    clock.now += 15  # the young one opens the GPU after its imports; the settled one opens it too
    young.add_drm_fd(xe_fdinfo(client_id=1, vram0=MiB))
    settled.add_drm_fd(xe_fdinfo(client_id=2, vram0=2 * MiB))
    assert scanner.scan().memory_by_device == {"0000:03:00.0": MiB}, "the settled one is not walked yet"

    clock.now += 90  # walks of settled processes are spread over 30 to 90 s
    assert scanner.scan().memory_by_device == {"0000:03:00.0": 3 * MiB}


def test_a_new_process_under_a_reused_pid_is_young_whatever_the_old_ones_age(tmp_path):
    procfs = FakeProcfs(tmp_path)
    old = procfs.add_unit_process(10, "/system.slice/vllm-a.service", started_seconds_ago=3600)
    old.add_drm_fd(xe_fdinfo(client_id=1, vram0=MiB))
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), rescan_seconds=60, young_seconds=60, clock=clock)
    assert scanner.scan().memory_by_device == {"0000:03:00.0": MiB}
    procfs.remove_process(10)
    new = procfs.add_unit_process(10, "/system.slice/vllm-a.service", started_seconds_ago=1)
    clock.now += 1
    assert scanner.scan().memory_by_device == {}
    new.add_drm_fd(xe_fdinfo(client_id=2, vram0=2 * MiB))
    clock.now += 1
    assert scanner.scan().memory_by_device == {"0000:03:00.0": 2 * MiB}


@pytest.mark.parametrize("stat", ["", "10 (vllm) S 1", "10 (vllm) S " + "x " * 30], ids=["empty", "short", "garbage"])
def test_a_process_whose_age_cannot_be_read_is_walked_at_every_scan(tmp_path, stat: str):
    procfs = FakeProcfs(tmp_path)
    process = procfs.add_unit_process(10, "/system.slice/vllm-a.service")
    (process.path / "stat").write_text(stat)
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), rescan_seconds=60, young_seconds=60, clock=clock)
    assert scanner.scan().memory_by_device == {}
    process.add_drm_fd(xe_fdinfo(client_id=1, vram0=MiB))
    clock.now += 1
    assert scanner.scan().memory_by_device == {"0000:03:00.0": MiB}


def test_the_age_of_a_real_process_is_read_from_real_proc():
    age = process_age_seconds("/proc", os.getpid())
    assert age is not None and 0 <= age < time.clock_gettime(time.CLOCK_BOOTTIME)
    assert process_age_seconds("/proc", os.getpid()) >= age


def test_scanner_rereads_the_memory_of_known_drm_fds_on_every_scan(tmp_path):
    procfs = FakeProcfs(tmp_path)
    process = procfs.add_unit_process(10, "/system.slice/vllm-a.service")
    fd = process.add_drm_fd(xe_fdinfo(client_id=1, vram0=1 << 20))
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), clock=clock)
    scanner.scan()
    (process.path / "fdinfo" / str(fd)).write_text(xe_fdinfo(client_id=1, vram0=5 << 20))
    clock.now += 1
    assert scanner.scan().memory_by_device["0000:03:00.0"] == 5 << 20


def test_scanner_reads_a_known_process_unit_again_at_its_next_walk(tmp_path):
    procfs = FakeProcfs(tmp_path)
    process = procfs.add_unit_process(10, "/system.slice/vllm-a.service")
    process.add_drm_fd(xe_fdinfo(client_id=1, vram0=1 << 20))
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), rescan_seconds=10, young_seconds=0, clock=clock)
    assert scanner.scan().unit_by_pid == {10: "vllm-a.service"}
    (process.path / "cgroup").write_text(v2_cgroup("/system.slice/vllm-b.service"))
    clock.now += 1
    assert scanner.scan().unit_by_pid == {10: "vllm-a.service"}
    clock.now += 15
    assert scanner.scan().unit_by_pid == {10: "vllm-b.service"}


def test_scanner_stops_counting_a_drm_fd_closed_between_its_walks_at_once(tmp_path):
    procfs = FakeProcfs(tmp_path)
    process = procfs.add_unit_process(10, "/system.slice/vllm-a.service")
    process.add_drm_fd(xe_fdinfo(client_id=1, vram0=1 * MiB))
    closing = process.add_drm_fd(xe_fdinfo(client_id=2, vram0=2 * MiB))
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), clock=clock)
    assert scanner.scan().memory_by_device[GPU] == 3 * MiB
    process.close_fd(closing)
    clock.now += 1
    assert scanner.scan() == scan_drm_clients(str(procfs.root))
    assert scanner.scan().memory_by_device[GPU] == 1 * MiB
    scanner.close()


def test_scanner_walks_a_reused_pid_again_at_once_with_its_new_unit(tmp_path):
    procfs = FakeProcfs(tmp_path)
    procfs.add_unit_process(10, "/system.slice/vllm-a.service").add_drm_fd(xe_fdinfo(client_id=1, vram0=1 * MiB))
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), rescan_seconds=10, young_seconds=0, clock=clock)
    assert scanner.scan().unit_by_pid == {10: "vllm-a.service"}
    procfs.remove_process(10)
    procfs.add_unit_process(10, "/system.slice/vllm-b.service").add_drm_fd(xe_fdinfo(client_id=5, vram0=7 * MiB))
    clock.now += 1
    result = scanner.scan()
    assert result.unit_by_pid == {10: "vllm-b.service"}
    assert result.memory_by_device_unit == {GPU: {"vllm-b.service": 7 * MiB}}
    scanner.close()


def test_scanner_walks_a_process_again_when_a_known_fd_now_holds_another_client(tmp_path):
    procfs = FakeProcfs(tmp_path)
    process = procfs.add_unit_process(10, "/system.slice/vllm-a.service")
    first = process.add_drm_fd(xe_fdinfo(client_id=1, vram0=1 * MiB))
    process.add_drm_fd(xe_fdinfo(client_id=1, vram0=1 * MiB))  # the same client through a dup'd fd
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), clock=clock)
    assert (scanner.scan().clients, scanner.scan().drm_fds) == (1, 2)
    process.reopen_drm_fd(first, xe_fdinfo(client_id=3, vram0=4 * MiB))
    clock.now += 1
    result = scanner.scan()
    assert result == scan_drm_clients(str(procfs.root))
    assert (result.clients, result.memory_by_device[GPU]) == (2, 5 * MiB)
    scanner.close()


def test_scanner_counts_unreadable_processes_on_every_scan_not_only_at_their_walks(tmp_path):
    procfs = FakeProcfs(tmp_path)
    procfs.add_unreadable_process(50)
    procfs.add_unit_process(60, CODE).add_drm_fd_with_unreadable_fdinfo()
    procfs.add_unit_process(100, CHAT).add_drm_fd(xe_fdinfo(client_id=1, vram0=1 * MiB))
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), rescan_seconds=10, young_seconds=0, clock=clock)
    assert scanner.scan().unreadable == 2
    clock.now += 1
    assert scanner.scan().unreadable == 2
    scanner.close()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_scanner_keeps_at_most_max_held_fds_open_and_reads_the_other_fdinfo_files_anew(tmp_path):
    procfs = FakeProcfs(tmp_path)
    processes = [procfs.add_unit_process(pid, CHAT) for pid in (10, 11, 12)]
    fds = [process.add_drm_fd(xe_fdinfo(client_id=process.pid, vram0=1 * MiB)) for process in processes]
    before = open_fds()
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), clock=clock, max_held_fds=2)
    assert scanner.scan().memory_by_device[GPU] == 3 * MiB
    assert open_fds() == before + 2
    for process, fd in zip(processes, fds):
        process.reopen_drm_fd(fd, xe_fdinfo(client_id=process.pid, vram0=2 * MiB))
    clock.now += 1
    assert scanner.scan().memory_by_device[GPU] == 6 * MiB
    procfs.remove_process(10)
    clock.now += 1
    assert scanner.scan().memory_by_device[GPU] == 4 * MiB
    assert open_fds() == before + 1
    scanner.close()
    assert open_fds() == before


def test_scanner_unit_of_a_drm_holder_is_read_at_its_walks_and_of_any_other_pid_at_once(tmp_path):
    procfs = FakeProcfs(tmp_path)
    holder = procfs.add_unit_process(10, "/system.slice/vllm-a.service")
    holder.add_drm_fd(xe_fdinfo(client_id=1, vram0=1 * MiB))
    other = procfs.add_unit_process(20, "/system.slice/other-a.service")
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), rescan_seconds=10, young_seconds=0, clock=clock)
    scanner.scan()
    (holder.path / "cgroup").write_text(v2_cgroup("/system.slice/vllm-b.service"))
    (other.path / "cgroup").write_text(v2_cgroup("/system.slice/other-b.service"))
    clock.now += 1
    scanner.scan()
    assert (unit_of(scanner, 10), unit_of(scanner, 20), unit_of(scanner, 99)) == ("vllm-a.service", "other-b.service",
                                                                                None)
    clock.now += 15
    scanner.scan()
    assert unit_of(scanner, 10) == "vllm-b.service"
    scanner.close()


FD_HOLDER = """
import os, sys
os.dup2(os.open(sys.argv[1], os.O_RDONLY), 7)
for step in ("opened", "moved", "closed"):
    print(step, flush=True)
    sys.stdin.readline()
    if step == "opened":
        os.lseek(7, 100, os.SEEK_SET)
    elif step == "moved":
        os.close(7)
"""


def test_an_open_fdinfo_file_of_real_proc_is_written_afresh_per_read_and_fails_once_its_fd_is_gone(tmp_path):
    """What DrmClientScanner relies on: a kept-open /proc/PID/fdinfo/N read at offset 0 gives the text of
    now, and fails (ENOENT) once the process has closed fd N or exited."""
    target = tmp_path / "file"
    target.write_bytes(b"x" * 200)
    child = subprocess.Popen([sys.executable, "-c", FD_HOLDER, str(target)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "opened\n"
        closed_fd = os.open(f"/proc/{child.pid}/fdinfo/7", os.O_RDONLY)
        exited = os.open(f"/proc/{child.pid}/fdinfo/0", os.O_RDONLY)
        assert read_open_bytes(closed_fd, 4096).startswith(b"pos:\t0\n")
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() == "moved\n"
        assert read_open_bytes(closed_fd, 4096).startswith(b"pos:\t100\n")
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() == "closed\n"
        with pytest.raises(FileNotFoundError):
            read_open_bytes(closed_fd, 4096)
        read_open_bytes(exited, 4096)
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(10)
        with pytest.raises(FileNotFoundError):
            read_open_bytes(exited, 4096)
    finally:
        child.kill()
        child.wait()
        for fd in (closed_fd, exited):
            os.close(fd)


def test_scanner_forgets_every_process_while_its_procfs_root_is_gone(tmp_path):
    procfs = FakeProcfs(tmp_path)
    procfs.add_unit_process(10, "/system.slice/vllm-a.service").add_drm_fd(xe_fdinfo(client_id=1, vram0=1 * MiB))
    before = open_fds()
    scanner = DrmClientScanner(str(procfs.root))
    assert unit_of(scanner, 10) == "vllm-a.service"
    scanner.scan()
    procfs.root.rename(tmp_path / "away")
    with pytest.raises(ProcfsUnavailable):
        scanner.scan()
    assert unit_of(scanner, 10) is None
    assert open_fds() == before


def test_scanner_keeps_clients_of_one_id_on_two_devices_without_pdev_apart(tmp_path):
    procfs = FakeProcfs(tmp_path)
    process = procfs.add_unit_process(10, CHAT)
    process.add_drm_fd(xe_fdinfo(client_id=1, pdev=None, vram0=1 * MiB))
    process.add_drm_fd(xe_fdinfo(client_id=1, pdev=None, vram0=2 * MiB), minor=CARD_MINOR)
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), clock=clock)
    scanner.scan()
    clock.now += 1
    assert scanner.scan().memory_by_device == {"226:128": 1 * MiB, "226:0": 2 * MiB}
    scanner.close()


# --- per-unit engine use ------------------------------------------------------------------------

def test_xe_cycles_are_summed_over_a_unit_s_clients_once_each_and_total_cycles_are_the_largest(tree: FakeProcfs):
    api = tree.add_unit_process(100, CHAT)
    engine = tree.add_unit_process(101, CHAT)
    shared = xe_fdinfo(client_id=7, cycles={"ccs": 1000}, total_cycles=50_000)
    for process in (api, engine, engine):  # one client: two fds of one process, one of another
        process.add_drm_fd(shared)
    engine.add_drm_fd(xe_fdinfo(client_id=8, cycles={"ccs": 300, "rcs": 5}, total_cycles=50_100))
    tree.add_unit_process(300, CODE).add_drm_fd(xe_fdinfo(client_id=9, cycles={"ccs": 40}, total_cycles=49_000))
    use = scan(tree).engines_by_device_unit[GPU]
    assert use["vllm-xpu-chat.service"].cycles["ccs"] == 1300
    assert use["vllm-xpu-chat.service"].cycles["rcs"] == 5 + XE_DEFAULT_CYCLES  # client 7 prints the default for rcs
    assert use["vllm-xpu-chat.service"].total_cycles == dict.fromkeys(XE_ENGINES, 50_100)
    assert use["vllm-xpu-chat.service"].busy_seconds == {}
    assert use["vllm-xpu-code.service"] == UnitEngineUse(
        cycles={**dict.fromkeys(XE_ENGINES, XE_DEFAULT_CYCLES), "ccs": 40}, total_cycles=dict.fromkeys(XE_ENGINES, 49_000))


def test_a_client_shared_across_units_counts_for_the_lowest_pid_s_unit_only(tree: FakeProcfs):
    tree.add_unit_process(300, CODE).add_drm_fd(xe_fdinfo(client_id=7, cycles={"ccs": 1000}))
    tree.add_unit_process(200, CHAT).add_drm_fd(xe_fdinfo(client_id=7, cycles={"ccs": 1000}))
    use = scan(tree).engines_by_device_unit[GPU]
    assert list(use) == ["vllm-xpu-chat.service"]
    assert use["vllm-xpu-chat.service"].cycles["ccs"] == 1000


def test_i915_busy_seconds_are_summed_over_clients_each_divided_by_its_capacity(tree: FakeProcfs):
    process = tree.add_unit_process(100, CHAT)
    process.add_drm_fd(i915_fdinfo(client_id=1, busy_ns={"render": 2_000_000_000, "video": 4_000_000_000},
                                   capacity={"video": 2}))
    process.add_drm_fd(i915_fdinfo(client_id=2, busy_ns={"render": 500_000_000, "video": 1_000_000_000}))
    tree.add_process(400, v2_cgroup("/")).add_drm_fd(i915_fdinfo(client_id=3, busy_ns={"render": 10**12}))
    use = scan(tree).engines_by_device_unit
    assert use == {GPU: {"vllm-xpu-chat.service": UnitEngineUse(
        busy_seconds={"render": 2.5, "copy": 0.0, "video": 3.0, "video-enhance": 0.0, "compute": 0.0})}}


def test_a_unit_s_counters_drop_by_the_share_of_a_client_closed_between_two_scans(tmp_path):
    procfs = FakeProcfs(tmp_path)
    process = procfs.add_unit_process(10, CHAT)
    kept = process.add_drm_fd(xe_fdinfo(client_id=1, cycles={"ccs": 100}, total_cycles=1000))
    closing = process.add_drm_fd(xe_fdinfo(client_id=2, cycles={"ccs": 60}, total_cycles=1001))
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), clock=clock)
    assert scanner.scan().engines_by_device_unit[GPU]["vllm-xpu-chat.service"].cycles["ccs"] == 160
    process.close_fd(closing)
    (process.path / "fdinfo" / str(kept)).write_text(xe_fdinfo(client_id=1, cycles={"ccs": 120}, total_cycles=2000))
    clock.now += 1
    use = scanner.scan().engines_by_device_unit[GPU]["vllm-xpu-chat.service"]
    assert (use.cycles["ccs"], use.total_cycles["ccs"]) == (120, 2000)
    scanner.close()


def test_a_running_unit_s_engine_counters_are_in_every_scan_across_walks_and_rereads(tmp_path):
    procfs = FakeProcfs(tmp_path)
    process = procfs.add_unit_process(10, CHAT)
    fds = [process.add_drm_fd(i915_fdinfo(client_id=client, busy_ns={"compute": 0})) for client in (1, 2)]
    process.add_other_fds(3)
    clock = ManualClock()
    # one fdinfo file kept open, the other read by path: both ways of reading
    scanner = DrmClientScanner(str(procfs.root), rescan_seconds=10, young_seconds=0, clock=clock, max_held_fds=1)
    seen = []
    for step in range(1, 40):
        for client, fd in enumerate(fds, 1):
            (process.path / "fdinfo" / str(fd)).write_text(
                i915_fdinfo(client_id=client, busy_ns={"compute": step * 10**9}))
        clock.now += 1.5  # several walks of the process in between
        seen.append(scanner.scan().engines_by_device_unit[GPU]["vllm-xpu-chat.service"].busy_seconds["compute"])
    assert seen == [2.0 * step for step in range(1, 40)]
    scanner.close()


def test_scans_between_walks_read_each_client_through_its_layout_not_the_general_parsers(tmp_path, monkeypatch):
    procfs = FakeProcfs(tmp_path)
    process = procfs.add_unit_process(10, CHAT)
    fds = [process.add_drm_fd(xe_fdinfo(client_id=client, cycles={"ccs": 100})) for client in (1, 2)]
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), clock=clock, max_held_fds=1)
    scanner.scan()
    general = []
    for name in ("parse_fdinfo", "parse_engine_use"):
        parser = getattr(procfs_source, name)
        monkeypatch.setattr(procfs_source, name, lambda text, parser=parser: general.append(text) or parser(text))
    for step in range(1, 4):
        for client, fd in enumerate(fds, 1):
            (process.path / "fdinfo" / str(fd)).write_text(
                xe_fdinfo(client_id=client, vram0=step * MiB, cycles={"ccs": 100 * step}, total_cycles=1000 * step))
        clock.now += 1
        result = scanner.scan()
        use = result.engines_by_device_unit[GPU]["vllm-xpu-chat.service"]
        assert (use.cycles["ccs"], use.total_cycles["ccs"]) == (200 * step, 1000 * step)
        assert result.memory_by_device == {GPU: 2 * step * MiB}
    assert general == []
    scanner.close()


@pytest.mark.parametrize("changed", [
    xe_fdinfo(client_id=1, cycles={"ccs": 500}) + "drm-cycles-xcs:\t5\n",  # a line more
    xe_fdinfo(client_id=1, cycles={"ccs": 500}).replace(f"drm-cycles-rcs:\t{XE_DEFAULT_CYCLES}", "drm-cycles-rcs:\tlots"),
    xe_fdinfo(client_id=1, cycles={"ccs": 500}).replace(f"drm-cycles-rcs:\t{XE_DEFAULT_CYCLES}\n", ""),  # a line less
], ids=["engine-line-added", "engine-line-malformed", "engine-line-removed"])
def test_a_client_whose_lines_change_between_walks_is_read_as_a_full_scan_reads_it(tmp_path, changed: str):
    procfs = FakeProcfs(tmp_path)
    process = procfs.add_unit_process(10, CHAT)
    fd = process.add_drm_fd(xe_fdinfo(client_id=1, cycles={"ccs": 100}))
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), rescan_seconds=10, young_seconds=0, clock=clock)
    scanner.scan()
    (process.path / "fdinfo" / str(fd)).write_text(changed)
    for _ in range(3):  # the read after the change, one more before the walk, one after it
        clock.now += 4
        assert scanner.scan().engines_by_device_unit == scan(procfs).engines_by_device_unit
    use = scan(procfs).engines_by_device_unit[GPU]["vllm-xpu-chat.service"]
    assert use.cycles["ccs"] == 500
    scanner.close()


def test_a_unit_s_busy_seconds_are_summed_in_client_order_whatever_the_layouts_of_its_clients(tmp_path):
    procfs = FakeProcfs(tmp_path)
    # figures whose float sum in another order (by layout, or two clients summed first) differs
    texts = [i915_fdinfo(client_id=1, busy_ns={"video": 9943819748}, capacity={"video": 3}),
             i915_fdinfo(client_id=2, busy_ns={"video": 5559652891}),
             i915_fdinfo(client_id=3, busy_ns={"video": 6185563631}, capacity={"video": 3}),
             i915_fdinfo(client_id=4, busy_ns={"video": 1858884110}, capacity={"video": 3})]
    for pid, text in enumerate(texts, 10):  # clients in the order of their pids
        procfs.add_unit_process(pid, CHAT).add_drm_fd(text)
    expected = 0.0
    for text in texts:
        expected += parse_engine_use(text).busy_seconds["video"]
    clock = ManualClock()
    scanner = DrmClientScanner(str(procfs.root), clock=clock)
    for _ in range(3):  # the walk, then reads through the clients' layouts
        clock.now += 1
        assert scanner.scan().engines_by_device_unit[GPU]["vllm-xpu-chat.service"].busy_seconds["video"] == expected
    scanner.close()


def unit_of(scanner: DrmClientScanner, pid: int) -> str | None:
    unit_cgroup = scanner.unit_cgroup_of(pid)
    return None if unit_cgroup is None else unit_cgroup.unit


def test_the_warning_about_unreadable_processes_names_them_and_fits_who_reads():
    """The pids come from the real scanner (an fd table that cannot be listed), the advice from what the reader
    was: root is never told to run as root."""
    scan = ScanResult(unreadable=7, unreadable_pids=(100, 101, 102, 103, 104))
    for reader in ({}, {"reader_root": True}, {"reader_root": True, "reader_capable": True}):
        line = unreadable_warning(replace(scan, **reader))
        assert "pid 100, 101, 102, 103, 104, ..." in line
        assert ("run it as root" in line) is False
    assert "CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (the packaged units do)" in unreadable_warning(scan)
    assert "bounding set" in unreadable_warning(replace(scan, reader_root=True))
    assert "security module" in unreadable_warning(replace(scan, reader_root=True, reader_capable=True))


def test_a_process_whose_fds_cannot_be_listed_is_named_in_the_scan(tmp_path):
    procfs = FakeProcfs(tmp_path)
    process = procfs.add_unit_process(4242, CHAT)
    (process.path / "fd").rmdir()
    (process.path / "fd").write_text("")  # listing it fails (ENOTDIR): neither gone nor readable
    scan = DrmClientScanner(str(procfs.root)).scan()
    assert (scan.unreadable, scan.unreadable_pids) == (1, (4242,))
    assert scan.reader_root == (os.geteuid() == 0)
    assert "pid 4242)" in unreadable_warning(scan)
