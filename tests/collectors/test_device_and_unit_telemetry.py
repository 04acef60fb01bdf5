"""Issue 13 end to end: with the fake driver serving every telemetry kind on two devices, and fixture fdinfo
(both drivers' engine keys) and dmem for three units, one scrape of the exporter shows every metric of the
contract's sections "Device telemetry" and "Per-unit engine use and memory source", with the values given."""

from __future__ import annotations

import dataclasses

from exporterproc import RunningExporter
from fakecgroup import FakeCgroupTree, xe_regions
from fakeprocfs import XE_DEFAULT_CYCLES, XE_ENGINES, FakeProcfs, i915_fdinfo, xe_fdinfo
from fakeze import A770_TELEMETRY, B580_TELEMETRY, FakeConfig, fake_driver_env, write_config
from polling import wait_for
from scrapes import sample, series
from sizes import GiB
from test_collectors_levelzero import A770_PCI, B580_PCI, TELEMETRY_FAMILIES, assert_configured_telemetry
from test_processes import CHAT, EMBEDDING, STT

UNIT_FAMILIES = {"xpu_unit_engine_busy_seconds_total", "xpu_unit_engine_cycles_total",
                 "xpu_unit_engine_total_cycles_total", "xpu_memory_attribution_info"}
DEVICE_TELEMETRY_FAMILIES = TELEMETRY_FAMILIES | {"xpu_memory_health"}


def with_used(device, used: int):
    module = device.memory[0]
    return dataclasses.replace(device, memory=(dataclasses.replace(module, free=module.size - used),))


def test_one_scrape_shows_every_device_telemetry_and_per_unit_engine_and_memory_source_metric(
        tmp_path, fake_driver, config_path):
    procfs = FakeProcfs(tmp_path)
    cgroups = FakeCgroupTree(tmp_path, {**xe_regions(A770_PCI, vram0=16 * GiB), **xe_regions(B580_PCI, vram0=12 * GiB)})
    # chat on the A770: two xe clients; its cgroup's dmem.current says 10 GiB (its fdinfo only 4)
    chat = procfs.add_unit_process(100, f"/system.slice/{CHAT}")
    chat.add_drm_fd(xe_fdinfo(client_id=1, pdev=A770_PCI, vram0=3 * GiB, cycles={"ccs": 700}, total_cycles=9000))
    chat.add_drm_fd(xe_fdinfo(client_id=2, pdev=A770_PCI, vram0=GiB, cycles={"ccs": 300}, total_cycles=9100))
    cgroups.add_cgroup(f"/system.slice/{CHAT}", xe_regions(A770_PCI, vram0=10 * GiB))
    # stt on the A770, no dmem controller for its cgroup: fdinfo
    procfs.add_unit_process(200, f"/system.slice/{STT}").add_drm_fd(
        xe_fdinfo(client_id=3, pdev=A770_PCI, vram0=GiB, cycles={"ccs": 50}, total_cycles=8000))
    cgroups.add_cgroup(f"/system.slice/{STT}")
    # embedding on the B580 through i915: busy time; no dmem controller for its cgroup either
    procfs.add_unit_process(300, f"/system.slice/{EMBEDDING}").add_drm_fd(
        i915_fdinfo(client_id=4, pdev=B580_PCI, local0=2 * GiB, busy_ns={"compute": 3 * 10**9, "video": 4 * 10**9},
                    capacity={"video": 2}))
    cgroups.add_cgroup(f"/system.slice/{EMBEDDING}")
    write_config(config_path, FakeConfig(devices=(with_used(A770_TELEMETRY, 12 * GiB),
                                                  with_used(B580_TELEMETRY, 3 * GiB))))
    with RunningExporter(["--no-collector.journal", "--path.procfs", str(procfs.root),
                          "--path.sysfs", str(cgroups.sysfs)],
                         env=fake_driver_env(fake_driver, config_path)) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and series(s, "xpu_memory_attribution_info") and s)

    served = {name for name, _ in samples}
    assert DEVICE_TELEMETRY_FAMILIES | UNIT_FAMILIES <= served
    assert sample(samples, "xpu_exporter_collector_success", collector="levelzero") == 1
    assert sample(samples, "xpu_exporter_collector_success", collector="processes") == 1
    assert_configured_telemetry(samples)

    expected_cycles = {}
    for unit, clients, ccs in ((CHAT, 2, 700 + 300), (STT, 1, 50)):
        for engine in XE_ENGINES:
            expected_cycles[(("device", A770_PCI), ("engine", engine), ("unit", unit))] = \
                ccs if engine == "ccs" else clients * XE_DEFAULT_CYCLES
    assert series(samples, "xpu_unit_engine_cycles_total") == expected_cycles
    assert sample(samples, "xpu_unit_engine_total_cycles_total", device=A770_PCI, unit=CHAT, engine="ccs") == 9100
    assert sample(samples, "xpu_unit_engine_total_cycles_total", device=A770_PCI, unit=STT, engine="ccs") == 8000
    busy = series(samples, "xpu_unit_engine_busy_seconds_total")
    assert {dict(labels)["engine"]: value for labels, value in busy.items()} == {
        "compute": 3, "video": 2, "render": 0, "copy": 0, "video-enhance": 0}
    assert {dict(labels)["unit"] for labels in busy} == {EMBEDDING}

    assert set(series(samples, "xpu_memory_attribution_info")) == {
        (("device", A770_PCI), ("source", "dmem")), (("device", A770_PCI), ("source", "fdinfo")),
        (("device", B580_PCI), ("source", "fdinfo"))}
    assert series(samples, "xpu_unit_memory_bytes") == {
        (("device", A770_PCI), ("unit", CHAT)): 10 * GiB, (("device", A770_PCI), ("unit", STT)): GiB,
        (("device", B580_PCI), ("unit", EMBEDDING)): 2 * GiB}
    assert sample(samples, "xpu_unattributed_memory_bytes", device=A770_PCI) == GiB
    assert sample(samples, "xpu_unattributed_memory_bytes", device=B580_PCI) == GiB
