"""Per-unit device memory, the unattributed rest and restart headroom: the exporter as a process over the
fake Level Zero driver, a fixture procfs (--path.procfs) and a real journal that gives the units' settings."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from exporterproc import RunningExporter
from fakeprocfs import FakeProcfs, i915_61_fdinfo, i915_fdinfo, xe_fdinfo
from fakeze import A770, B580, FakeConfig, FakeMemoryModule, FakeProcess, fake_driver_env, write_config
from journalgen import Clock, random_boot_id, write_journal
from polling import wait_for
from scrapes import sample, series
from sizes import GiB, MiB
from vllmlogs import VllmRun, unit_start

DEVICE = "0000:03:00.0"
TOTAL = 16 * GiB
CORE_TOTAL = TOTAL * 95 // 100  # the fake driver's core API total: what vLLM multiplies by its utilisation
CHAT, EMBEDDING, STT = "vllm-xpu-chat.service", "vllm-xpu-embedding.service", "vllm-xpu-stt.service"
UTILISATION = {CHAT: 0.75, EMBEDDING: 0.07, STT: 0.07}


def settings_journal(path: Path, utilisation_of: dict[str, float] = UTILISATION) -> Path:
    """Each unit's start as vLLM 0.24 prints it, with the unit's gpu_memory_utilization among its non-default
    args."""
    clock = Clock(random_boot_id())
    entries = []
    for unit, utilisation in utilisation_of.items():
        entries += unit_start(unit, VllmRun("0.24.0", model="m", gpu_memory_utilization=utilisation), clock)
    return write_journal(path, entries)


def three_unit_host(procfs: FakeProcfs, chat_running: bool, others_hold: int) -> dict[str, int]:
    """Processes of the three units (and one outside any service) holding device memory through xe DRM
    clients; returns the memory each unit should be attributed."""
    expected = {EMBEDDING: others_hold, STT: others_hold, "session-3.scope": 256 * MiB}
    if chat_running:
        api = procfs.add_unit_process(100, f"/system.slice/{CHAT}")
        engine = procfs.add_unit_process(101, f"/system.slice/{CHAT}")
        # one client, seen through three fds in two processes: counted once
        for process in (api, engine, engine):
            process.add_drm_fd(xe_fdinfo(client_id=7, vram0=11 * GiB))
        engine.add_drm_fd(xe_fdinfo(client_id=8, vram0=GiB))
        engine.add_other_fds(5)
        expected[CHAT] = 12 * GiB
    for pid, unit in ((200, EMBEDDING), (300, STT)):
        process = procfs.add_unit_process(pid, f"/system.slice/{unit}")
        process.add_drm_fd(xe_fdinfo(client_id=pid, vram0=others_hold, unit="MiB"))
    desktop = procfs.add_process(400, "0::/user.slice/user-1000.slice/session-3.scope\n")
    desktop.add_drm_fd(xe_fdinfo(client_id=400, vram0=256 * MiB))
    return expected


def start_exporter(tmp_path: Path, fake_driver: Path, config_path: Path, procfs: FakeProcfs, used: int,
                   device=A770, *args: str, other_devices=(),
                   utilisation_of: dict[str, float] = UTILISATION,
                   init_result: str = "ZE_RESULT_SUCCESS") -> RunningExporter:
    device = dataclasses.replace(device, memory=(FakeMemoryModule(size=TOTAL, free=TOTAL - used),))
    write_config(config_path, FakeConfig(devices=(device, *other_devices), init_result=init_result))
    journal = settings_journal(tmp_path / "units.journal", utilisation_of)
    return RunningExporter(["--path.procfs", str(procfs.root), "--journal.file", str(journal),
                            "--journal.boot", "all", *args], env=fake_driver_env(fake_driver, config_path))


def settled(exporter: RunningExporter) -> dict:
    """A scrape once the journal is read (headroom needs the units' settings)."""
    return wait_for(lambda: (s := exporter.scrape()) and
                    sample(s, "xpu_exporter_collector_success", collector="journal") == 1 and
                    series(s, "xpu_unit_restart_headroom_bytes") and s)


@pytest.mark.parametrize("chat_running, others_hold, unattributed", [
    (True, 1 * GiB, 512 * MiB),   # all three up
    (False, 2 * GiB, 512 * MiB),  # chat failed; the other two hold more than their share
])
def test_three_unit_host_memory_unattributed_and_headroom(tmp_path, fake_driver, config_path, chat_running,
                                                          others_hold, unattributed):
    procfs = FakeProcfs(tmp_path)
    expected = three_unit_host(procfs, chat_running, others_hold)
    used = sum(expected.values()) + unattributed
    free = TOTAL - used
    with start_exporter(tmp_path, fake_driver, config_path, procfs, used) as exporter:
        samples = settled(exporter)
    units = {dict(labels)["unit"]: value for labels, value in series(samples, "xpu_unit_memory_bytes").items()}
    assert units == expected
    assert sample(samples, "xpu_unattributed_memory_bytes", device=DEVICE) == used - sum(expected.values())
    assert sample(samples, "xpu_memory_attribution_info", device=DEVICE, source="fdinfo") == 1
    assert sample(samples, "xpu_memory_attribution_overcounted", device=DEVICE) == 0
    for unit, utilisation in UTILISATION.items():
        headroom = sample(samples, "xpu_unit_restart_headroom_bytes", device=DEVICE, unit=unit)
        assert headroom == free + expected.get(unit, 0) - math.ceil(utilisation * CORE_TOTAL)
    chat_headroom = sample(samples, "xpu_unit_restart_headroom_bytes", device=DEVICE, unit=CHAT)
    assert (chat_headroom < 0) == (free + expected.get(CHAT, 0) < 0.75 * TOTAL)
    assert (chat_headroom < 0) == (not chat_running)
    assert sample(samples, "xpu_exporter_collector_success", collector="processes") == 1


def test_level_zero_process_list_is_used_where_fdinfo_has_no_memory_figures(tmp_path, fake_driver, config_path):
    procfs = FakeProcfs(tmp_path)
    for pid, unit in ((100, CHAT), (101, CHAT), (200, EMBEDDING)):
        procfs.add_unit_process(pid, f"/system.slice/{unit}").add_drm_fd(i915_61_fdinfo(client_id=pid))
    device = dataclasses.replace(A770, processes=(FakeProcess(100, 8 * GiB), FakeProcess(101, 4 * GiB),
                                                  FakeProcess(200, 1 * GiB)))
    with start_exporter(tmp_path, fake_driver, config_path, procfs, 14 * GiB, device) as exporter:
        samples = settled(exporter)
    assert sample(samples, "xpu_memory_attribution_info", device=DEVICE, source="levelzero") == 1
    assert sample(samples, "xpu_unit_memory_bytes", device=DEVICE, unit=CHAT) == 12 * GiB
    assert sample(samples, "xpu_unit_memory_bytes", device=DEVICE, unit=EMBEDDING) == 1 * GiB
    assert sample(samples, "xpu_unattributed_memory_bytes", device=DEVICE) == 1 * GiB


def test_processes_adding_up_to_more_than_used_are_clamped_and_flagged(tmp_path, fake_driver, config_path):
    procfs = FakeProcfs(tmp_path)
    procfs.add_unit_process(100, f"/system.slice/{CHAT}").add_drm_fd(xe_fdinfo(client_id=1, vram0=8 * GiB))
    with start_exporter(tmp_path, fake_driver, config_path, procfs, 4 * GiB) as exporter:
        samples = settled(exporter)
    assert sample(samples, "xpu_unattributed_memory_bytes", device=DEVICE) == 0
    assert sample(samples, "xpu_memory_attribution_overcounted", device=DEVICE) == 1


def test_hundreds_of_gpu_processes_make_one_series_per_unit(tmp_path, fake_driver, config_path):
    procfs = FakeProcfs(tmp_path)
    units = [CHAT, EMBEDDING, STT]
    for index in range(500):
        process = procfs.add_unit_process(1000 + index, f"/system.slice/{units[index % 3]}")
        process.add_drm_fd(xe_fdinfo(client_id=1000 + index, vram0=MiB))
    with start_exporter(tmp_path, fake_driver, config_path, procfs, 2 * GiB) as exporter:
        samples = settled(exporter)
    memory = series(samples, "xpu_unit_memory_bytes")
    assert len(memory) == 3
    assert sum(memory.values()) == 500 * MiB


def test_unreadable_fdinfo_and_unsupported_process_list_fail_only_this_collector(tmp_path, fake_driver,
                                                                                  config_path):
    procfs = FakeProcfs(tmp_path)
    procfs.add_unit_process(100, f"/system.slice/{CHAT}").add_drm_fd_with_unreadable_fdinfo()
    procfs.add_unreadable_process(101)
    device = dataclasses.replace(A770, processes_result="ZE_RESULT_ERROR_UNSUPPORTED_FEATURE")
    with start_exporter(tmp_path, fake_driver, config_path, procfs, 3 * GiB, device) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and
                           sample(s, "xpu_exporter_collector_success", collector="journal") == 1 and s)
        stderr = exporter.stderr
    assert sample(samples, "xpu_exporter_collector_success", collector="processes") == 0
    assert sample(samples, "xpu_exporter_collector_success", collector="levelzero") == 1
    assert sample(samples, "xpu_memory_used_bytes", device=DEVICE) == 3 * GiB
    assert series(samples, "xpu_unit_memory_bytes") == {}
    assert "no per-process source works" in stderr and "Level Zero's process list failed" in stderr
    assert "processes' fds or fdinfo could not be read (pid 100, 101)" in stderr
    assert "CAP_SYS_PTRACE" in stderr


def test_device_whose_free_memory_cannot_be_read_has_no_unattributed_rest_and_its_units_no_headroom(
        tmp_path, fake_driver, config_path):
    procfs = FakeProcfs(tmp_path)
    expected = three_unit_host(procfs, chat_running=True, others_hold=GiB)  # every unit on DEVICE
    used = sum(expected.values())
    unreadable = dataclasses.replace(A770, memory_state_result="ZE_RESULT_ERROR_UNSUPPORTED_FEATURE")
    with start_exporter(tmp_path, fake_driver, config_path, procfs, used, unreadable,
                        other_devices=(B580,)) as exporter:
        during = wait_for(lambda: (s := exporter.scrape()) and
                          len(series(s, "xpu_unit_gpu_memory_utilization_ratio")) == len(UTILISATION) and s)
        write_config(config_path, FakeConfig(devices=(
            dataclasses.replace(A770, memory=(FakeMemoryModule(size=TOTAL, free=TOTAL - used),)), B580)))
        after = settled(exporter)
    assert sample(during, "xpu_exporter_collector_success", collector="levelzero") == 0
    assert sample(during, "xpu_exporter_collector_success", collector="processes") == 1
    assert sample(during, "xpu_unit_memory_bytes", device=DEVICE, unit=CHAT) == expected[CHAT]
    assert sample(during, "xpu_unattributed_memory_bytes", device=DEVICE) is None
    assert sample(during, "xpu_memory_attribution_overcounted", device=DEVICE) is None
    assert sample(during, "xpu_unattributed_memory_bytes", device=B580.pci_address) == 1 * GiB
    # the units hold memory on DEVICE only: no headroom computed against the other GPU
    assert series(during, "xpu_unit_restart_headroom_bytes") == {}

    assert sample(after, "xpu_unattributed_memory_bytes", device=DEVICE) == 0
    assert sample(after, "xpu_unit_restart_headroom_bytes", device=DEVICE, unit=CHAT) == \
        TOTAL - used + expected[CHAT] - math.ceil(UTILISATION[CHAT] * CORE_TOTAL)


def test_an_absurd_utilisation_of_one_unit_costs_no_series_of_the_others(tmp_path, fake_driver, config_path):
    procfs = FakeProcfs(tmp_path)
    expected = three_unit_host(procfs, chat_running=True, others_hold=GiB)
    used = sum(expected.values()) + 512 * MiB
    free = TOTAL - used
    with start_exporter(tmp_path, fake_driver, config_path, procfs, used,
                        utilisation_of={**UTILISATION, CHAT: 1e308}) as exporter:
        samples = settled(exporter)
    assert sample(samples, "xpu_exporter_collector_success", collector="processes") == 1
    assert sample(samples, "xpu_exporter_journal_values_rejected_total") == 1
    assert sample(samples, "xpu_unattributed_memory_bytes", device=DEVICE) == 512 * MiB
    for unit in (EMBEDDING, STT):
        assert sample(samples, "xpu_unit_restart_headroom_bytes", device=DEVICE, unit=unit) == \
            free + expected[unit] - math.ceil(UTILISATION[unit] * CORE_TOTAL)
    # chat's settings line is ignored: its release's default applies (0.92 for 0.24)
    assert sample(samples, "xpu_unit_restart_headroom_bytes", device=DEVICE, unit=CHAT) == \
        free + expected[CHAT] - math.ceil(0.92 * CORE_TOTAL)


def test_an_fdinfo_size_of_20_digits_in_gib_is_skipped_for_the_regions_other_figures(tmp_path, fake_driver,
                                                                                       config_path):
    procfs = FakeProcfs(tmp_path)
    hostile = xe_fdinfo(client_id=7, vram0=11 * GiB).replace(
        f"drm-total-vram0:\t{11 * GiB // 1024} KiB", "drm-total-vram0:\t99999999999999999999 GiB")
    assert "99999999999999999999 GiB" in hostile
    procfs.add_unit_process(100, f"/system.slice/{CHAT}").add_drm_fd(hostile)
    procfs.add_unit_process(200, f"/system.slice/{EMBEDDING}").add_drm_fd(xe_fdinfo(client_id=8, vram0=GiB))
    with start_exporter(tmp_path, fake_driver, config_path, procfs, 13 * GiB) as exporter:
        samples = settled(exporter)
    assert sample(samples, "xpu_exporter_collector_success", collector="processes") == 1
    assert sample(samples, "xpu_unit_memory_bytes", device=DEVICE, unit=CHAT) == 11 * GiB  # its resident figure
    assert sample(samples, "xpu_unit_memory_bytes", device=DEVICE, unit=EMBEDDING) == GiB
    assert sample(samples, "xpu_unattributed_memory_bytes", device=DEVICE) == GiB


def test_without_the_levelzero_collector_level_zero_is_never_driven_and_units_come_from_fdinfo(
        tmp_path, fake_driver, config_path):
    """A driver whose zeInit hangs: with --no-collector.levelzero nothing waits on it, the processes collector
    works from fdinfo alone (no unattributed rest nor headroom without the device's figures) and says nothing
    of Level Zero."""
    procfs = FakeProcfs(tmp_path)
    expected = three_unit_host(procfs, chat_running=True, others_hold=GiB)
    write_config(config_path, FakeConfig(devices=(A770,), init_hang=True))
    journal = settings_journal(tmp_path / "units.journal")
    with RunningExporter(["--path.procfs", str(procfs.root), "--journal.file", str(journal), "--journal.boot", "all",
                          "--no-collector.levelzero", "--levelzero.timeout", "1s"],
                         env=fake_driver_env(fake_driver, config_path)) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and
                           sample(s, "xpu_exporter_collector_success", collector="journal") == 1 and s)
        stderr = exporter.stderr
    assert sample(samples, "xpu_exporter_collector_success", collector="processes") == 1
    assert sample(samples, "xpu_exporter_collector_success", collector="levelzero") is None
    assert sample(samples, "xpu_unit_memory_bytes", device=DEVICE, unit=CHAT) == expected[CHAT]
    assert series(samples, "xpu_unattributed_memory_bytes") == {}
    assert "Level Zero" not in stderr, stderr


def test_engine_use_per_unit_device_and_engine_key_of_both_drivers_and_a_client_closed_between_scrapes(
        tmp_path, fake_driver, config_path):
    procfs = FakeProcfs(tmp_path)
    other = B580.pci_address
    chat = procfs.add_unit_process(100, f"/system.slice/{CHAT}")
    chat.add_drm_fd(xe_fdinfo(client_id=1, cycles={"ccs": 700}, total_cycles=9000))
    closing = chat.add_drm_fd(xe_fdinfo(client_id=2, cycles={"ccs": 300}, total_cycles=9100))
    procfs.add_unit_process(101, f"/system.slice/{CHAT}").add_drm_fd(
        i915_fdinfo(client_id=5, pdev=other, busy_ns={"compute": 3 * 10**9, "video": 4 * 10**9},
                    capacity={"video": 2}))
    procfs.add_unit_process(200, f"/system.slice/{EMBEDDING}").add_drm_fd(
        xe_fdinfo(client_id=3, cycles={"ccs": 50}, total_cycles=8000))
    with start_exporter(tmp_path, fake_driver, config_path, procfs, 2 * GiB, other_devices=(B580,)) as exporter:
        before = wait_for(lambda: (s := exporter.scrape()) and series(s, "xpu_unit_engine_cycles_total") and s)
        chat.close_fd(closing)
        after = exporter.scrape()
    for samples, chat_ccs in ((before, 1000), (after, 700)):
        assert sample(samples, "xpu_unit_engine_cycles_total", device=DEVICE, unit=CHAT, engine="ccs") == chat_ccs
        assert sample(samples, "xpu_unit_engine_cycles_total", device=DEVICE, unit=EMBEDDING, engine="ccs") == 50
        assert sample(samples, "xpu_unit_engine_total_cycles_total", device=DEVICE, unit=EMBEDDING,
                      engine="ccs") == 8000
        assert sample(samples, "xpu_unit_engine_busy_seconds_total", device=other, unit=CHAT, engine="compute") == 3
        assert sample(samples, "xpu_unit_engine_busy_seconds_total", device=other, unit=CHAT, engine="video") == 2
        assert sample(samples, "xpu_unit_engine_cycles_total", device=other, unit=CHAT, engine="ccs") is None
        assert sample(samples, "xpu_unit_engine_busy_seconds_total", device=DEVICE, unit=CHAT, engine="ccs") is None
    assert sample(before, "xpu_unit_engine_total_cycles_total", device=DEVICE, unit=CHAT, engine="ccs") == 9100
    assert sample(after, "xpu_unit_engine_total_cycles_total", device=DEVICE, unit=CHAT, engine="ccs") == 9000
    engines = {dict(labels)["engine"] for labels in series(after, "xpu_unit_engine_cycles_total")}
    assert engines == {"rcs", "bcs", "vcs", "vecs", "ccs"}


def scopes_host(procfs: FakeProcfs, scopes: int) -> dict[str, int]:
    """The three vLLM units holding little (1 MiB each) and `scopes` transient scopes, each a process with a
    DRM client holding (1 + index % 100) x 64 KiB; returns each unit's memory."""
    held = {}
    for pid, unit in ((100, CHAT), (200, EMBEDDING), (300, STT)):
        procfs.add_unit_process(pid, f"/system.slice/{unit}").add_drm_fd(xe_fdinfo(client_id=pid, vram0=MiB))
        held[unit] = MiB
    for index in range(scopes):
        unit = f"run-u{index}.scope"
        memory = (1 + index % 100) * 64 * 1024
        procfs.add_unit_process(10_000 + index, f"/system.slice/{unit}").add_drm_fd(
            xe_fdinfo(client_id=10_000 + index, vram0=memory))
        held[unit] = memory
    return held


def test_thousands_of_scopes_holding_drm_clients_make_at_most_max_units_series(tmp_path, fake_driver, config_path):
    """Issue 19: 3,000 scopes each with a DRM client made 3,002 series. At most --collector.processes.max-units
    (default 64) units have series: the watched vLLM units first, then the largest; the rest is unattributed,
    so the units' series and the rest still add up to used, and the dropped units are counted."""
    procfs = FakeProcfs(tmp_path)
    held = scopes_host(procfs, 3000)
    unattributed = 512 * MiB
    used = sum(held.values()) + unattributed
    with start_exporter(tmp_path, fake_driver, config_path, procfs, used) as exporter:
        first = settled(exporter)
        second = exporter.scrape()
    for samples in (first, second):
        memory = {dict(labels)["unit"]: value for labels, value in series(samples, "xpu_unit_memory_bytes").items()}
        assert len(memory) == 64
        assert {CHAT, EMBEDDING, STT} <= set(memory)  # watched first, though they hold the least
        # then the 61 scopes holding the most: 30 of 6400 KiB, 30 of 6336 KiB, one of 6272 KiB (by name)
        largest = sorted((unit for unit in held if unit.endswith(".scope")), key=lambda unit: (-held[unit], unit))
        assert set(memory) - {CHAT, EMBEDDING, STT} == set(largest[:61])
        assert largest[60] == "run-u1097.scope" and held[largest[60]] == 98 * 64 * 1024
        assert all(memory[unit] == held[unit] for unit in memory)
        assert sample(samples, "xpu_exporter_processes_units_dropped") == 3003 - 64
        rest = sample(samples, "xpu_unattributed_memory_bytes", device=DEVICE)
        assert rest == used - sum(memory.values())
        assert rest + sum(memory.values()) == used
        assert sample(samples, "xpu_memory_attribution_overcounted", device=DEVICE) == 0
        assert sample(samples, "xpu_exporter_collector_success", collector="processes") == 1
        assert len([name for name, _ in samples if name.startswith("xpu_unit_engine_cycles_total")]) == 64 * 5
    assert series(first, "xpu_unit_memory_bytes") == series(second, "xpu_unit_memory_bytes")


def test_a_lower_max_units_and_no_unit_dropped_under_it(tmp_path, fake_driver, config_path):
    procfs = FakeProcfs(tmp_path)
    held = scopes_host(procfs, 10)
    used = sum(held.values()) + GiB
    with start_exporter(tmp_path, fake_driver, config_path, procfs, used,
                        A770, "--collector.processes.max-units", "5") as exporter:
        capped = settled(exporter)
    memory = {dict(labels)["unit"]: value for labels, value in series(capped, "xpu_unit_memory_bytes").items()}
    # the three watched units, then the two largest scopes (run-u9: 640 KiB, run-u8: 576 KiB)
    assert set(memory) == {CHAT, EMBEDDING, STT, "run-u9.scope", "run-u8.scope"}
    assert sample(capped, "xpu_exporter_processes_units_dropped") == 8
    assert sample(capped, "xpu_unattributed_memory_bytes", device=DEVICE) == used - sum(memory.values())
    with start_exporter(tmp_path, fake_driver, config_path, procfs, used) as exporter:
        all_units = settled(exporter)
    assert len(series(all_units, "xpu_unit_memory_bytes")) == 13
    assert sample(all_units, "xpu_exporter_processes_units_dropped") == 0
    assert sample(all_units, "xpu_unattributed_memory_bytes", device=DEVICE) == GiB


def test_a_user_unit_of_a_system_units_name_is_a_unit_of_its_own(tmp_path, fake_driver, config_path):
    """uid 1000's user unit vllm-xpu-chat.service holding 6 GiB neither adds to the system unit of that name
    (4 GiB) nor turns its negative restart headroom positive: it is vllm-xpu-chat.service@uid1000, and no
    --journal.units glob of system units matches it."""
    procfs = FakeProcfs(tmp_path)
    system = procfs.add_unit_process(100, f"/system.slice/{CHAT}")
    system.add_drm_fd(xe_fdinfo(client_id=1, vram0=4 * GiB))
    user = procfs.add_unit_process(
        500, f"/user.slice/user-1000.slice/user@1000.service/app.slice/{CHAT}")
    user.add_drm_fd(xe_fdinfo(client_id=2, vram0=6 * GiB))
    used = 10 * GiB + 512 * MiB
    with start_exporter(tmp_path, fake_driver, config_path, procfs, used,
                        utilisation_of={CHAT: 0.75}) as exporter:
        samples = settled(exporter)
    units = {dict(labels)["unit"]: value for labels, value in series(samples, "xpu_unit_memory_bytes").items()}
    assert units == {CHAT: 4 * GiB, f"{CHAT}@uid1000": 6 * GiB}
    headroom = sample(samples, "xpu_unit_restart_headroom_bytes", device=DEVICE, unit=CHAT)
    assert headroom == (TOTAL - used) + 4 * GiB - math.ceil(0.75 * CORE_TOTAL) < 0
    assert {dict(labels)["unit"] for labels in series(samples, "xpu_unit_engine_starts_total")} == {CHAT}


def test_seventy_user_units_of_watched_names_do_not_push_a_system_unit_out(tmp_path, fake_driver, config_path):
    """70 user units vllm-u<n>.service (uid 1000), each holding more than the real unit: they are no watched
    units (the system glob does not match vllm-u<n>.service@uid1000), so the real unit keeps its memory series
    and its place in the journal's fold."""
    procfs = FakeProcfs(tmp_path)
    system = procfs.add_unit_process(100, f"/system.slice/{CHAT}")
    system.add_drm_fd(xe_fdinfo(client_id=1, vram0=64 * MiB))
    for n in range(70):
        user = procfs.add_unit_process(1000 + n, f"/user.slice/user-1000.slice/user@1000.service/app.slice/"
                                                 f"vllm-u{n}.service")
        user.add_drm_fd(xe_fdinfo(client_id=10 + n, vram0=128 * MiB))
    used = 64 * MiB + 70 * 128 * MiB
    with start_exporter(tmp_path, fake_driver, config_path, procfs, used, utilisation_of={CHAT: 0.75}) as exporter:
        samples = settled(exporter)
    memory = {dict(labels)["unit"]: value for labels, value in series(samples, "xpu_unit_memory_bytes").items()}
    assert memory[CHAT] == 64 * MiB and len(memory) == 64
    assert {dict(labels)["unit"] for labels in series(samples, "xpu_unit_engine_starts_total")} == {CHAT}


def test_a_unit_holding_gpu_memory_is_watched_by_the_journal_before_it_logs_anything(tmp_path, fake_driver,
                                                                                     config_path):
    """The units the processes collector finds on a GPU are handed to the journal after the scrape: one its globs
    match has its engine series at 0 though the journal has no line of it; a scope outside the globs has none."""
    procfs = FakeProcfs(tmp_path / "proc")
    three_unit_host(procfs, chat_running=True, others_hold=GiB)
    silent = "vllm-xpu-silent.service"
    procfs.add_unit_process(500, f"/system.slice/{silent}").add_drm_fd(xe_fdinfo(client_id=500, vram0=GiB))
    with start_exporter(tmp_path, fake_driver, config_path, procfs, used=15 * GiB) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and
                           sample(s, "xpu_unit_engine_starts_total", unit=silent) is not None and s)
        assert sample(samples, "xpu_unit_engine_starts_total", unit=silent) == 0
        assert sample(samples, "xpu_unit_memory_bytes", device=DEVICE, unit=silent) == GiB
        assert sample(samples, "xpu_unit_engine_starts_total", unit="session-3.scope") is None
