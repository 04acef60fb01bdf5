"""Privilege separation (exporter/sources/privileged.py, exporter/capabilities.py) and the bounded fd scans.

A service started with the pod's uid and capabilities (as the DaemonSet and the packaged units give them) keeps them
only in the privileged reader child: the serving process can no longer read a root process's environment, memory or
root directory, nor open a perf event on it, while the reader still walks its fd table and starts the Level Zero
children with CAP_PERFMON. The reader
answers the same scans as the scanner in process, and only the requests of its protocol. A process with very many
fds costs a scan a bounded number of stats, and the skipped ones are counted."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from vllm_xpu_exporter.sources.levelzero.worker import LevelZeroUnavailable, LevelZeroWorker
from vllm_xpu_exporter.sources.privileged import (MAX_CGROUPS, HandedChild, PrivilegedReader, _answer, scan_from_wire,
                                                  scan_to_wire, separate_privileges)
from vllm_xpu_exporter.sources.procfs import DrmClientScanner, ProcfsUnavailable, scan_drm_clients

from fakeprocfs import FakeProcfs, xe_fdinfo
from fakeze import A770, FakeConfig, fake_driver_env, write_config
from polling import ManualClock, wait_for

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parents[1] / "privsepprobe.py"
POD_UID = 10447
POD_CAPABILITIES = "+perfmon,+sys_ptrace,+dac_read_search"
PYTHON = "/usr/bin/python3"  # the probe's user cannot read a venv's interpreter under /root once it drops CAP_DAC_READ_SEARCH
CHAT = "/system.slice/vllm-xpu-chat.service"
CODE = "/system.slice/vllm-xpu-code.service"
MiB = 1 << 20


@pytest.fixture
def root_process():
    """A root process with a secret in its environment, and its stack's address."""
    if os.geteuid() != 0:
        pytest.fail("the probe needs root to take the pod's uid (tests/run runs as root)")
    process = subprocess.Popen(["sleep", "60"], env={"DB_PASSWORD": "hunter2"}, cwd="/")
    try:
        stack = next(line for line in open(f"/proc/{process.pid}/maps") if line.rstrip().endswith("[stack]"))
        yield process.pid, stack.split("-")[0]
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def package():
    """A directory the pod's uid can read without CAP_DAC_READ_SEARCH that holds the package (pytest's tmp_path
    is under a directory of root's, mode 0700)."""
    directory = Path(tempfile.mkdtemp(prefix="privsep-"))
    directory.chmod(0o755)
    (directory / "vllm_xpu_exporter").symlink_to(REPO / "exporter")
    yield directory
    shutil.rmtree(directory)


def probe(mode: str, target: tuple[int, str], package: Path) -> dict:
    argv = ["setpriv", f"--reuid={POD_UID}", f"--regid={POD_UID}", "--clear-groups",
            f"--inh-caps={POD_CAPABILITIES}", f"--ambient-caps={POD_CAPABILITIES}",
            "env", f"PYTHONPATH={package}", PYTHON, str(PROBE), mode, str(target[0]), target[1]]
    completed = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_with_every_capability_kept_the_serving_process_reads_a_root_processs_secrets(root_process, package):
    report = probe("keep", root_process, package)
    assert report["uid"] == POD_UID
    assert (report["environ"], report["mem"], report["root_shadow"], report["perf_event_open"]) == ("ok",) * 4


def test_after_separation_the_serving_process_reads_no_secret_and_the_reader_still_walks_fd_tables(
        root_process, package):
    report = probe("separate", root_process, package)
    assert report["uid"] == POD_UID
    assert report["caps"] == "0"  # CAP_PERFMON too went to the reader, which starts the Level Zero children
    assert (report["environ"], report["mem"], report["root_shadow"]) == ("EACCES", "EACCES", "EACCES")
    assert not report["serving_lists_target_fds"]
    assert report["perf_event_open"] == "EACCES"  # with CAP_PERFMON kept it opened an event on a root process
    # The reader walks the fd tables the serving process cannot: every root process's, the target's among them.
    assert report["reader_unreadable"] < report["serving_unreadable"]


def test_the_reader_answers_the_scan_the_scanner_makes_in_process(tmp_path):
    tree = FakeProcfs(tmp_path)
    tree.add_unit_process(100, CHAT).add_drm_fd(xe_fdinfo(client_id=1, vram0=3 * MiB))
    tree.add_unit_process(200, CODE).add_drm_fd(xe_fdinfo(client_id=2, vram0=MiB))
    tree.add_unreadable_process(300)
    reader = PrivilegedReader(str(tree.root), full_scans=True)
    reader.start()
    try:
        assert reader.scan() == scan_drm_clients(str(tree.root))
        assert reader.scan().memory_by_device_unit == {"0000:03:00.0": {"vllm-xpu-chat.service": 3 * MiB,
                                                                        "vllm-xpu-code.service": MiB}}
    finally:
        reader.close()
    with pytest.raises(ProcfsUnavailable, match="not running"):
        reader.scan()


def test_the_wire_form_of_a_scan_gives_the_scan_back(tmp_path):
    tree = FakeProcfs(tmp_path)
    tree.add_unit_process(100, CHAT).add_drm_fd(xe_fdinfo(client_id=1, vram0=MiB))
    unreadable = tree.add_unit_process(200, CHAT)
    (unreadable.path / "fd").rmdir()
    (unreadable.path / "fd").write_text("")  # listing it fails: the pid is named in the scan
    result = scan_drm_clients(str(tree.root))
    assert result.unreadable_pids == (200,)
    assert scan_from_wire(json.loads(json.dumps(scan_to_wire(result)))) == result


def test_the_reader_answers_only_its_requests(tmp_path):
    tree = FakeProcfs(tmp_path)
    scanner = DrmClientScanner(str(tree.root))

    class NoEndpoints:
        def find(self, paths):
            raise AssertionError("not asked")

    for request in ([], "scan", {"read": "environ", "pid": 1}, {"read": "endpoints", "cgroups": "/"},
                    {"read": "endpoints", "cgroups": ["/x"] * (MAX_CGROUPS + 1)},
                    {"read": "endpoints", "cgroups": ["x" * 5000]}):
        assert set(_answer(request, scanner.scan, NoEndpoints())) == {"refused"}


def test_a_process_with_many_fds_costs_a_walk_its_first_fds_only_and_the_rest_is_counted(tmp_path):
    tree = FakeProcfs(tmp_path)
    process = tree.add_unit_process(100, CHAT)
    process.add_drm_fd(xe_fdinfo(client_id=1, vram0=MiB))  # fd 0: the GPU is opened early
    process.add_other_fds(40)
    late = tree.add_unit_process(200, CODE)
    late.add_other_fds(12)
    late.add_drm_fd(xe_fdinfo(client_id=2, vram0=MiB))  # fd 12: beyond the bound, not seen
    scanner = DrmClientScanner(str(tree.root), young_seconds=0, max_held_fds=0, max_fds_per_process=10)
    result = scanner.scan()
    assert result.fds_skipped == (41 - 10) + (13 - 10)
    assert result.memory_by_device_unit == {"0000:03:00.0": {"vllm-xpu-chat.service": MiB}}


def test_a_scan_walks_processes_until_its_fd_bound_and_the_next_scan_walks_the_rest(tmp_path):
    tree = FakeProcfs(tmp_path)
    for pid, unit in ((100, CHAT), (200, CODE), (300, "/system.slice/vllm-xpu-stt.service")):
        process = tree.add_unit_process(pid, unit)
        process.add_drm_fd(xe_fdinfo(client_id=pid, vram0=MiB))
        process.add_other_fds(9)
    clock = ManualClock()
    scanner = DrmClientScanner(str(tree.root), rescan_seconds=60, young_seconds=0, clock=clock, max_held_fds=0,
                               max_fds_per_scan=15)
    first = scanner.scan()
    assert first.walks_deferred == 1 and first.fds_skipped == 0
    assert set(first.memory_by_device_unit["0000:03:00.0"]) == {"vllm-xpu-chat.service", "vllm-xpu-code.service"}
    clock.now += 1
    second = scanner.scan()  # the two walked are read through their known clients; the third is walked now
    assert second.walks_deferred == 0
    assert len(second.memory_by_device_unit["0000:03:00.0"]) == 3


def test_a_reader_that_dies_fails_the_scans_saying_so_and_is_not_started_again(tmp_path):
    tree = FakeProcfs(tmp_path)
    tree.add_unit_process(100, CHAT).add_drm_fd(xe_fdinfo(client_id=1, vram0=MiB))
    reader = PrivilegedReader(str(tree.root), full_scans=True)
    reader.start()
    try:
        assert reader.scan().clients == 1
        pid = reader.pid
        os.kill(pid, signal.SIGKILL)
        # The request meets a closed pipe, or the answer an end of file: either way the reader is lost.
        with pytest.raises(ProcfsUnavailable, match=r"lost \((it has exited|its pipe failed: Broken pipe)\); restarting"):
            reader.scan()
        with pytest.raises(ProcfsUnavailable, match=r"not running \((it has exited|its pipe failed)"):
            reader.scan()
        assert reader.pid is None
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped
    finally:
        reader.close()


def test_as_root_there_is_nothing_to_separate_and_nothing_is_executed_again(tmp_path):
    assert os.geteuid() == 0, "tests/run runs as root"
    assert separate_privileges(str(tmp_path)) == (None, None)


def test_the_gates_reader_walks_every_process_at_every_scan(tmp_path):
    """The gate asks for whole scans (as scan_drm_clients makes): a unit's process that opens the GPU after the
    previous scan is seen at the next one, not when a walk falls due."""
    tree = FakeProcfs(tmp_path)
    engine = tree.add_unit_process(100, CHAT)
    engine.add_other_fds(3)
    reader = PrivilegedReader(str(tree.root), full_scans=True)
    reader.start()
    try:
        assert reader.scan().clients == 0
        engine.add_drm_fd(xe_fdinfo(client_id=1, vram0=MiB))
        assert reader.scan().memory_by_device_unit == {"0000:03:00.0": {"vllm-xpu-chat.service": MiB}}
    finally:
        reader.close()


def test_the_reader_starts_level_zero_children_for_the_worker(tmp_path, fake_driver, monkeypatch):
    """The serving process keeps no CAP_PERFMON: its Level Zero worker's children are started by the reader, and
    the worker reads them through the pipes the reader hands over, and kills them through a pidfd."""
    config = tmp_path / "ze.conf"
    write_config(config, FakeConfig(devices=(A770,)))
    for name, value in fake_driver_env(fake_driver, config).items():
        monkeypatch.setenv(name, value)
    reader = PrivilegedReader(str(FakeProcfs(tmp_path / "proc").root))
    reader.start()
    worker = LevelZeroWorker(timeout=5.0, telemetry=False, spawn=reader.spawn_levelzero)
    try:
        assert wait_for(lambda: _memory(worker) is not None, timeout=30, interval=0.2)
        assert [reading.identity.pci_address for reading in _memory(worker)] == [A770.pci_address]
        child = worker._child
        assert isinstance(child, HandedChild) and child.pid not in (os.getpid(), reader.pid)
        worker.gpu_changed("change", A770.pci_address)  # the next read replaces the child: killed, a new one started
        assert wait_for(lambda: _memory(worker) is not None, timeout=30, interval=0.2)
        assert worker._child is not child and child.wait(timeout=10) == -signal.SIGKILL
    finally:
        worker.close()
        reader.close()


def _memory(worker: LevelZeroWorker):
    try:
        return worker.read_memory()
    except LevelZeroUnavailable:
        return None
