"""`vllm-xpu-exporter selfcheck`: the verdicts over readings built in process (fast), and the command as a user runs
it: the real Level Zero loader with the fake driver (tests/fakeze/), a fake sysfs and procfs tree (--path.sysfs,
--path.procfs) and journal files written by systemd-journal-remote, on a host whose figures agree (exit 0), one
whose figures disagree (exit 1), and one with no GPU at all (everything unverified, exit 0)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fakeprocfs import FakeProcfs, v2_cgroup, xe_fdinfo
from fakesysfs import FakeGpu, FakeSysfs
from fakeze import A770, FakeConfig, FakeMemoryModule, fake_driver_env, write_config
from journalgen import current_boot_id, write_journal
from sizes import GiB
from vllmlogs import Boot, compose, journal_specs, race_chat_runs, service_runs

from vllm_xpu_exporter import selfcheck
from vllm_xpu_exporter.fold.engine_starts import UnitView
from vllm_xpu_exporter.fold.start import Start
from vllm_xpu_exporter.selfcheck import Readings, Verdict
from vllm_xpu_exporter.sources.drm_cards import DrmCard, read_drm_cards
from vllm_xpu_exporter.sources.levelzero.binding import CoreMemory, DeviceIdentity, MemoryModule
from vllm_xpu_exporter.sources.levelzero.worker import DeviceMemory
from vllm_xpu_exporter.sources.procfs import ScanResult

ADDRESS = "0000:03:00.0"
CHAT = "vllm-xpu-chat.service"
CORE_TOTAL = 16 * GiB * 95 // 100  # what the fake driver's core API reports for a 16 GiB module (floor 0.95 x)


def device(*, size: int = 16 * GiB, free: int = 13 * GiB, core: int | None = CORE_TOTAL,
           usable: int | None = None) -> DeviceMemory:
    identity = DeviceIdentity(ADDRESS, "Intel(R) Arc(TM) A770 Graphics", "10111213-1415-1617-1819-1a1b1c1d1e1f",
                              "1.3.24595")
    return DeviceMemory(identity, (), (MemoryModule(True, size, free, 1),), None,
                        core=None if core is None else CoreMemory(core, usable))


def card(memory: int | None = None) -> DrmCard:
    return DrmCard("card1", ADDRESS, "xe", 0x8086, 0x56A0, memory,
                   None if memory is None else "device/tile*/physical_vram_size_bytes")


def verdicts(readings: Readings) -> dict[str, Verdict]:
    return {check.name: check.verdict for check in selfcheck.checks(readings)}


@pytest.mark.fast
def test_the_core_total_agrees_at_0_95_of_sysman_and_differs_at_0_80():
    assert selfcheck.core_total_check(device()).verdict is Verdict.OK
    assert "ratio=0.950" in selfcheck.core_total_check(device()).line()
    assert selfcheck.core_total_check(device(core=16 * GiB * 8 // 10)).verdict is Verdict.DIFFERS
    # the zesInit path reads no core total: said, not guessed
    unread = selfcheck.core_total_check(device(core=None))
    assert unread.verdict is Verdict.UNVERIFIED and "zesInit" in unread.why


@pytest.mark.fast
def test_free_memory_is_unverified_without_cap_perfmon_or_the_extension_and_differs_when_usable_exceeds_free():
    assert selfcheck.free_memory_check(device(usable=12 * GiB)).verdict is Verdict.OK
    assert selfcheck.free_memory_check(device(usable=14 * GiB)).verdict is Verdict.DIFFERS
    untrusted = selfcheck.free_memory_check(device(free=16 * GiB, usable=12 * GiB))
    assert untrusted.verdict is Verdict.UNVERIFIED and "CAP_PERFMON" in untrusted.why
    no_extension = selfcheck.free_memory_check(device())
    assert no_extension.verdict is Verdict.UNVERIFIED and "usablemem" in no_extension.why


@pytest.mark.fast
def test_fdinfo_above_the_used_memory_differs_and_below_it_names_the_unattributed_rest():
    def scan(bytes_: int) -> ScanResult:
        return ScanResult(memory_by_device={ADDRESS: bytes_}, driver_by_device={ADDRESS: "xe"}, clients=1,
                          memory_keys_seen=True)

    agrees = selfcheck.fdinfo_used_check(device(), scan(2 * GiB), "6.12.0", "")
    assert agrees.verdict is Verdict.OK and agrees.figures["unattributed"] == "1.000GiB"
    assert selfcheck.fdinfo_used_check(device(), scan(5 * GiB), "6.12.0", "").verdict is Verdict.DIFFERS
    old_kernel = selfcheck.fdinfo_used_check(device(), replace(scan(0), memory_keys_seen=False), "6.1.0", "")
    assert old_kernel.verdict is Verdict.UNVERIFIED and "6.1.0" in old_kernel.why and "6.8" in old_kernel.why


@pytest.mark.fast
def test_sysfs_memory_is_unverified_where_the_kernel_exposes_none_and_checked_where_it_does():
    assert selfcheck.sysfs_memory_check(device(), card()).verdict is Verdict.UNVERIFIED
    assert selfcheck.sysfs_memory_check(device(), card(16 * GiB)).verdict is Verdict.OK
    assert selfcheck.sysfs_memory_check(device(), card(8 * GiB)).verdict is Verdict.DIFFERS


@pytest.mark.fast
def test_a_gpu_level_zero_lists_without_a_drm_card_differs_and_a_card_level_zero_misses_is_unverified():
    missing = verdicts(Readings(devices=[device()], cards=[replace(card(), pci_address="0000:83:00.0")]))
    assert missing[f"sysfs.driver[{ADDRESS}]"] is Verdict.DIFFERS
    assert missing["sysfs.driver[0000:83:00.0]"] is Verdict.UNVERIFIED


@pytest.mark.fast
def test_with_no_source_answering_every_check_is_unverified_with_its_reason():
    found = selfcheck.checks(Readings(devices_error="no GPU", cards=[], scan_error="no /proc",
                                      views_error="cannot read the journal"))
    assert {check.verdict for check in found} == {Verdict.UNVERIFIED}
    assert all(check.why for check in found)
    assert [check.name for check in found] == ["levelzero", "sysfs.drm", "fdinfo", "vllm"]


def unit_view(*, kv: int, utilisation: float, printed_total: int | None) -> UnitView:
    start = Start(began_usec=1, printed=True, version="0.26.0", gpu_memory_utilization=utilisation,
                  kv_cache_bytes=kv, device_total_bytes=printed_total)
    return UnitView(CHAT, starts=1, failures={}, last_failure_usec=None, overlaps=0, latest=start,
                    last_success=start)


@pytest.mark.fast
def test_a_kv_cache_beyond_its_utilisations_share_of_the_core_total_differs():
    fits = verdicts(Readings(devices=[device()], views=[unit_view(kv=3 * GiB, utilisation=0.5, printed_total=None)]))
    assert fits[f"vllm.kv[{CHAT}]"] is Verdict.OK and fits[f"vllm.total[{CHAT}]"] is Verdict.UNVERIFIED
    too_big = selfcheck.checks(Readings(devices=[device()],
                                        views=[unit_view(kv=8 * GiB, utilisation=0.5, printed_total=CORE_TOTAL)]))
    (kv_check,) = [check for check in too_big if check.name == f"vllm.kv[{CHAT}]"]
    assert kv_check.verdict is Verdict.DIFFERS and kv_check.figures["share"] == "7.600GiB"


@pytest.mark.fast
def test_on_several_gpus_a_unit_is_held_against_the_gpu_whose_total_it_printed():
    assert selfcheck.core_total_of_unit(12 * GiB, [CORE_TOTAL, 11 * GiB]) == 11 * GiB
    assert selfcheck.core_total_of_unit(None, [CORE_TOTAL, 11 * GiB]) is None
    assert selfcheck.core_total_of_unit(None, [CORE_TOTAL]) == CORE_TOTAL


@pytest.mark.fast
def test_a_check_line_is_verdict_name_figures_and_why_apart_by_two_spaces():
    line = selfcheck.Check(Verdict.OK, "memory.total[0000:03:00.0]", {"core": "15.200GiB", "ratio": "0.950"},
                           "why it holds").line()
    assert line == "ok          memory.total[0000:03:00.0]  core=15.200GiB ratio=0.950  why it holds"


# --------------------------------------------------------------------------------------- the command, on a host

def chat_journal(path: Path, total_gib: float) -> Path:
    """The chat unit's start as vLLM 0.26 prints it (the start-up summary gives the device total), in this boot."""
    _, started = race_chat_runs()
    run = replace(started, version="0.26.0", total_gib=total_gib)
    boot_at = 1_747_044_600.0
    placed = compose(Boot(current_boot_id(), boot_at, tuple(service_runs(CHAT, [run], boot_at + 60))))
    return write_journal(path, journal_specs(placed))


def host_tree(tmp_path: Path, *, fdinfo_vram: int, sysfs_vram: int | None) -> tuple[Path, Path]:
    """A fake /sys with the A770 bound to xe (and, given, its tile's physical VRAM) and a fake /proc whose chat
    process holds an xe client of `fdinfo_vram` bytes."""
    gpu = FakeGpu(ADDRESS, driver="xe")
    sysfs = FakeSysfs.create(tmp_path / "sys", [gpu])
    if sysfs_vram is not None:
        tile = sysfs.path(gpu.devpath) / "tile0"
        tile.mkdir()
        (tile / "physical_vram_size_bytes").write_text(f"{sysfs_vram}\n")
    procfs = FakeProcfs(tmp_path / "host")
    chat = procfs.add_process(4242, v2_cgroup(f"/system.slice/{CHAT}"))
    chat.add_drm_fd(xe_fdinfo(client_id=7, pdev=ADDRESS, vram0=fdinfo_vram))
    return sysfs.root, procfs.root


def run_selfcheck(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vllm_xpu_exporter", "selfcheck", *args],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=120, check=False)


def check_lines(output: str) -> dict[str, tuple[str, str]]:
    """check name -> (verdict, the whole line)."""
    lines = [line for line in output.splitlines() if not line.startswith("#")]
    return {line.split()[1]: (line.split()[0], line) for line in lines}


def test_on_a_host_whose_figures_agree_every_check_is_ok_and_it_exits_0(tmp_path: Path, fake_driver: Path) -> None:
    config = tmp_path / "fakeze.conf"
    write_config(config, FakeConfig(devices=(A770,), usable_memory_extension=True))
    sysfs, procfs = host_tree(tmp_path, fdinfo_vram=2 * GiB, sysfs_vram=16 * GiB)
    journal = chat_journal(tmp_path / "chat.journal", total_gib=round(CORE_TOTAL / GiB, 2))

    done = run_selfcheck(fake_driver_env(fake_driver, config), "--path.sysfs", str(sysfs), "--path.procfs",
                         str(procfs), "--journal.file", str(journal))

    assert done.returncode == 0, done.stdout + done.stderr
    found = check_lines(done.stdout)
    assert {name: verdict for name, (verdict, _) in found.items()} == {
        f"memory.total[{ADDRESS}]": "ok", f"memory.free[{ADDRESS}]": "ok", f"sysfs.driver[{ADDRESS}]": "ok",
        f"sysfs.memory[{ADDRESS}]": "ok", f"fdinfo.used[{ADDRESS}]": "ok", f"fdinfo.driver[{ADDRESS}]": "ok",
        f"vllm.total[{CHAT}]": "ok", f"vllm.kv[{CHAT}]": "ok"}
    assert "ratio=0.950" in found[f"memory.total[{ADDRESS}]"][1]
    assert "fdinfo=2.000GiB sysman_used=3.000GiB unattributed=1.000GiB" in found[f"fdinfo.used[{ADDRESS}]"][1]
    assert "kv=3.250GiB utilisation=0.75" in found[f"vllm.kv[{CHAT}]"][1]
    header = dict(line[2:].split(": ", 1) for line in done.stdout.splitlines()
                  if line.startswith("# ") and ": " in line)
    assert header["level-zero-driver"] == f"{ADDRESS} {A770.driver_version}"
    assert header["level-zero-loader"].startswith("loader ")  # the real loader says its own version
    assert header["kernel"] == os.uname().release and header["python"] == sys.version.split()[0]
    assert header["summary"] == "8 ok, 0 differs, 0 unverified"


def test_figures_that_disagree_are_named_and_it_exits_1(tmp_path: Path, fake_driver: Path) -> None:
    config = tmp_path / "fakeze.conf"
    # the core API reports 0.80 of Sysman's total, the clients hold 5 GiB of 3 used, vLLM printed 15.91 GiB
    a770 = replace(A770, memory=(FakeMemoryModule(size=16 * GiB, free=13 * GiB, core_size=16 * GiB * 8 // 10),))
    write_config(config, FakeConfig(devices=(a770,)))
    sysfs, procfs = host_tree(tmp_path, fdinfo_vram=5 * GiB, sysfs_vram=None)
    journal = chat_journal(tmp_path / "chat.journal", total_gib=15.91)

    done = run_selfcheck(fake_driver_env(fake_driver, config), "--path.sysfs", str(sysfs), "--path.procfs",
                         str(procfs), "--journal.file", str(journal))

    assert done.returncode == 1, done.stdout + done.stderr
    found = {name: verdict for name, (verdict, _) in check_lines(done.stdout).items()}
    assert found[f"memory.total[{ADDRESS}]"] == "differs"
    assert found[f"fdinfo.used[{ADDRESS}]"] == "differs"
    assert found[f"vllm.total[{CHAT}]"] == "differs"
    assert found[f"sysfs.memory[{ADDRESS}]"] == "unverified"  # xe without the tile's size file
    assert found[f"memory.free[{ADDRESS}]"] == "unverified"  # no usable-memory extension listed
    assert done.stderr == ""


def test_with_no_gpu_every_check_is_unverified_and_it_exits_0(tmp_path: Path) -> None:
    sysfs = FakeSysfs.create(tmp_path / "sys").root
    procfs = FakeProcfs(tmp_path / "host").root
    journal = write_journal(tmp_path / "empty.journal", [])

    # the real loader with no driver to load: no GPU
    done = run_selfcheck({"ZE_ENABLE_ALT_DRIVERS": str(tmp_path / "no-such-driver.so")}, "--path.sysfs",
                         str(sysfs), "--path.procfs", str(procfs), "--journal.file", str(journal))

    assert done.returncode == 0, done.stdout + done.stderr
    found = check_lines(done.stdout)
    assert {verdict for verdict, _ in found.values()} == {"unverified"}
    assert "ZE_RESULT_ERROR_UNINITIALIZED" in found["levelzero"][1]
    assert "no DRM card" in found["sysfs.drm"][1]
    assert "no watched unit" in found["vllm"][1]


def test_help_says_that_a_differing_check_exits_1_and_a_bad_flag_is_one_line_and_2() -> None:
    shown = run_selfcheck({}, "--help")
    assert shown.returncode == 0 and "1 when one differs" in " ".join(shown.stdout.split())
    bad = run_selfcheck({}, "--path.nope", "x")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_the_drm_cards_source_reads_a_fake_sysfs(tmp_path: Path) -> None:
    gpu = FakeGpu(ADDRESS, driver="i915", device_id=0x56A0)
    sysfs = FakeSysfs.create(tmp_path / "sys", [gpu, FakeGpu("0000:83:00.0", card=2, render=129, driver="xe",
                                                              device_id=0xE20B, bridges=("0000:80:01.0",))])
    (sysfs.path(gpu.drm_devpath("card1")) / "lmem_total_bytes").write_text(f"{16 * GiB}\n")
    assert read_drm_cards(str(sysfs.root)) == [
        DrmCard("card1", ADDRESS, "i915", 0x8086, 0x56A0, 16 * GiB, "lmem_total_bytes"),
        DrmCard("card2", "0000:83:00.0", "xe", 0x8086, 0xE20B)]
    assert read_drm_cards(str(tmp_path / "nowhere")) == []
