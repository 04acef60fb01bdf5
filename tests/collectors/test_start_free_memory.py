"""The free-memory truth check: vLLM's figure at a start against Level Zero's at that moment (start_free_memory.py
pure, and the exporter as a process over the fake Level Zero driver and a replayed journal, its figures then
evaluated by the bundled alert under promtool)."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from pathlib import Path

import yaml

from vllm_xpu_exporter.start_free_memory import DeviceReading, Readings, free_at_start
from exporterproc import RunningExporter
from fakeprocfs import FakeProcfs
from fakeze import A770, FakeConfig, FakeMemoryModule, fake_driver_env, write_config
from journalgen import Clock, random_boot_id, write_journal
from polling import wait_for
from scrapes import series
from sizes import GiB
from vllmlogs import Failure, VllmRun, unit_start

REPO = Path(__file__).resolve().parents[2]
CHAT, EMBEDDING = "vllm-xpu-chat.service", "vllm-xpu-embedding.service"
DEVICE = A770.pci_address


def reading(at_seconds: float, free: int = 20 * GiB, by_unit: dict[str, int] | None = None) -> DeviceReading:
    by_unit = by_unit or {}
    return DeviceReading(int(at_seconds * 1e6), free, 24 * GiB, by_unit, sum(by_unit.values()) + GiB)


def test_the_reading_nearest_the_line_within_the_window_stands_for_its_moment():
    readings = Readings(keep_seconds=300)
    for at in (100, 115, 130):
        readings.add(DEVICE, reading(at, free=at * GiB))
    assert readings.nearest(DEVICE, int(112e6)).free == 115 * GiB
    assert readings.nearest(DEVICE, int(189e6), within_seconds=60).free == 130 * GiB
    assert readings.nearest(DEVICE, int(191e6), within_seconds=60) is None
    assert readings.nearest("0000:83:00.0", int(112e6)) is None
    readings.add(DEVICE, reading(500))  # the old ones go
    assert readings.nearest(DEVICE, int(115e6), within_seconds=1000).at_usec == int(500e6)


def test_the_driver_figures_count_the_units_own_memory_as_free_for_it():
    compared = free_at_start(CHAT, 0, reading(0, free=10 * GiB, by_unit={CHAT: 6 * GiB, EMBEDDING: 2 * GiB}))
    assert (compared.vllm, compared.levelzero, compared.total_less_attributed) == (0, 16 * GiB, 21 * GiB)


def replayed_starts(path: Path) -> Path:
    """Two starts of vLLM 0.31 a few seconds ago: chat failing on "Free memory on device xpu:0 (0.0/22.71 GiB)",
    embedding started with 19.7 GiB free printed in its start-up summary (within 2 % of the driver's 20 GiB)."""
    clock = Clock(random_boot_id(), realtime_usec=time.time_ns() // 1000 - 20_000_000)
    entries = unit_start(CHAT, VllmRun("0.31.0", gpu_memory_utilization=0.75,
                                       failure=Failure("insufficient_free_memory", free_gib=0.0, total_gib=22.71)),
                         clock)
    entries += unit_start(EMBEDDING, VllmRun("0.31.0", gpu_memory_utilization=0.07, free_gib_at_start=19.7,
                                             total_gib=22.71), clock)
    return write_journal(path, entries)


def test_a_start_that_saw_no_free_memory_on_an_idle_card_fires_and_one_within_2_percent_does_not(tmp_path,
                                                                                                 fake_driver):
    # vLLM's total is the core API's (22.71 GiB), below Sysman's: the check holds vLLM's figures against the core's
    device = dataclasses.replace(A770, memory=(FakeMemoryModule(size=round(23.9 * GiB), free=20 * GiB,
                                                                core_size=round(22.71 * GiB)),))
    config = tmp_path / "fakeze.json"
    write_config(config, FakeConfig(devices=(device,)))
    procfs = FakeProcfs(tmp_path / "host")
    procfs.add_process(1)
    journal = replayed_starts(tmp_path / "units.journal")
    with RunningExporter(["--path.procfs", str(procfs.root), "--journal.file", str(journal), "--journal.boot", "all"],
                         env=fake_driver_env(fake_driver, config)) as exporter:
        def compared():
            found = series(exporter.scrape(), "xpu_unit_engine_start_free_memory_bytes")
            return found if len(found) == 6 else None

        found = wait_for(compared, timeout=30)
    assert found, "no driver figures for the two starts"
    figures = {(dict(labels)["unit"], dict(labels)["seen_by"]): value for labels, value in found.items()}
    assert figures == {
        (CHAT, "vllm"): 0, (CHAT, "levelzero"): 20 * GiB, (CHAT, "total_less_attributed"): round(22.71 * GiB),
        (EMBEDDING, "vllm"): round(19.7 * GiB), (EMBEDDING, "levelzero"): 20 * GiB,
        (EMBEDDING, "total_less_attributed"): round(22.71 * GiB)}
    assert {dict(labels)["device"] for labels in found} == {DEVICE}
    # the bundled alert over these very figures, as Prometheus would scrape them
    input_series = [{"series": "xpu_unit_engine_start_free_memory_bytes{%s}" % ",".join(
        f'{name}="{value}"' for name, value in [*labels, ("instance", "gpu-host:10447"), ("job", "vllm-xpu-exporter")]),
        "values": f"{int(value)}x10"} for labels, value in found.items()]
    alert = 'ALERTS{alertname="XpuUnitFreeMemoryMisread",alertstate="firing"}'
    test = {"rule_files": [str(REPO / "rules" / "vllm-xpu-exporter.yaml")], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": input_series, "promql_expr_test": [
                {"expr": alert, "eval_time": "5m", "exp_samples": [{"labels": (
                    'ALERTS{alertname="XpuUnitFreeMemoryMisread",alertstate="firing",severity="warning",'
                    f'instance="gpu-host:10447",job="vllm-xpu-exporter",device="{DEVICE}",unit="{CHAT}"}}'),
                 "value": 1}]}]}]}
    path = tmp_path / "free-memory.test.yaml"
    path.write_text(yaml.safe_dump(test))
    checked = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
