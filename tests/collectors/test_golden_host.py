"""The whole exporter over one fixed host, against one golden file: tests/golden/seed_host.prom.

The host is the seed's: the boot race's journal (tests/vllmlogs.py: chat fails for a too small KV cache
and restarts, embedding and stt start once, all three overlapping; an unwatched unit and a previous boot
around them, which the exporter leaves out), the fake Level Zero driver with an A770 and a B580 serving
every telemetry kind (tests/fakeze.py), and a fixture procfs where the three units and a desktop session
hold the A770's memory through xe DRM clients (tests/fakeprocfs.py). The exporter runs as a process with
every collector (tests/exporterproc.py) and is scraped once it has settled: every collector reports 1 and
the journal's, the processes' and the plan's figures are there.

The golden file is the scrape as it is, but for what varies from run to run (`golden_text`): the samples
of `xpu_exporter_collector_duration_seconds` are pinned to 0.0, and client_python's `process_*` and
`python_*` families are left out (tests/collectors/test_exporter_self_metrics.py checks those). What is pinned on the
host's side: the journal (fixed boot ids and times), the driver's figures, the procfs, and `--path.sysfs`
pointing at an empty directory (no dmem cgroup tree: per-unit memory comes from fdinfo). The version in
`xpu_exporter_build_info` is the exporter's: a release regenerates the golden files.

Regenerate after a deliberate change: `.venv/bin/python -m pytest tests/collectors/test_golden_host.py --update-golden`,
then review `git diff tests/golden/`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from exporterproc import RunningExporter
from fakeprocfs import FakeProcfs, xe_fdinfo
from fakeze import A770_TELEMETRY, B580_TELEMETRY, FakeConfig, fake_driver_env, write_config
from polling import wait_for
from scrapes import golden_text, parse_samples, sample, series
from sizes import GiB, MiB
from vllmlogs import CHAT, EMBEDDING, RACE_BOOT_ID, STT

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "seed_host.prom"
TOTAL = 16 * GiB
HELD = {CHAT: 11 * GiB + 512 * MiB, EMBEDDING: 1 * GiB, STT: 1 * GiB, "session-3.scope": 256 * MiB}
UNATTRIBUTED = 512 * MiB
COLLECTORS = ("journal", "processes", "levelzero")


def seed_host(base: Path, config_path: Path) -> FakeProcfs:
    """The fake driver's configuration and the procfs of the seed host; returns the procfs."""
    procfs = FakeProcfs(base)
    for pid, (unit, held) in enumerate(HELD.items(), start=200):
        cgroup = f"/system.slice/{unit}" if unit.endswith(".service") else f"/user.slice/user-1000.slice/{unit}"
        procfs.add_unit_process(pid, cgroup).add_drm_fd(xe_fdinfo(client_id=pid, vram0=held))
    a770 = dataclasses.replace(A770_TELEMETRY, processes=(), memory=(
        dataclasses.replace(A770_TELEMETRY.memory[0], size=TOTAL, free=TOTAL - sum(HELD.values()) - UNATTRIBUTED),))
    write_config(config_path, FakeConfig(devices=(a770, dataclasses.replace(B580_TELEMETRY, processes=()))))
    return procfs


def settled(exporter: RunningExporter) -> str | None:
    """A scrape's text once every collector reports 1 and the journal's, processes' and plan's figures show."""
    text = exporter.scrape_text()
    samples = parse_samples(text)
    done = (all(sample(samples, "xpu_exporter_collector_success", collector=name) == 1 for name in COLLECTORS)
            and sample(samples, "xpu_unit_engine_init_failures_total", unit=CHAT, reason="kv_cache_too_small") == 1
            and series(samples, "xpu_unit_restart_headroom_bytes")
            and series(samples, "xpu_device_units_footprint_bytes"))
    return text if done else None


def test_the_seed_host_scrapes_exactly_as_the_golden_file(tmp_path: Path, fake_driver: Path, config_path: Path,
                                                          boot_race_journal: Path, update_golden: bool) -> None:
    procfs = seed_host(tmp_path / "host", config_path)
    empty_sysfs = tmp_path / "sys"
    empty_sysfs.mkdir()
    # no plan's drop-in whatever the machine's /etc/systemd/system holds
    with RunningExporter(["--path.procfs", str(procfs.root), "--path.sysfs", str(empty_sysfs),
                          "--journal.file", str(boot_race_journal), "--journal.boot", RACE_BOOT_ID,
                          "--collector.processes.plans", str(tmp_path / "no-plans")],
                         env=fake_driver_env(fake_driver, config_path)) as exporter:
        text = wait_for(lambda: settled(exporter), 30)
        assert text, exporter.stderr
    if update_golden:
        GOLDEN.write_text(golden_text(text))
    assert golden_text(text) == GOLDEN.read_text(), \
        f"the scrape differs from {GOLDEN} (regenerate with --update-golden after a deliberate change)"
