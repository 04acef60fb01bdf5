"""The README's metric tables are kept true: they name exactly what the exporter serves when every
collector has something to say."""

from __future__ import annotations

import re

from exporterproc import REPO, RunningExporter
from fakeprocfs import FakeProcfs, i915_fdinfo, xe_fdinfo
from fakeze import A770_TELEMETRY, FakeConfig, fake_driver_env, write_config
from journalgen import JournalEntrySpec, random_boot_id, write_journal
from polling import wait_for
from scrapes import sample
from sizes import GiB
from vllmlogs import Boot, VllmRun, chat_runs, compose, journal_specs, service_start

CHAT, EMBEDDING = "vllm-xpu-chat.service", "vllm-xpu-embedding.service"
ORIGIN = 1_747_130_000.0


def every_kind_of_start() -> list[JournalEntrySpec]:
    """A failed then a successful start of chat (a new main pid, as after a real restart), and a start of
    embedding with kv_cache_memory_bytes set, overlapping chat's second init."""
    failed, started = chat_runs()
    first = service_start(CHAT, failed, ORIGIN, restart_counter=1)
    restart = service_start(CHAT, started, first.restart_at, job_id=110)
    embedding = service_start(EMBEDDING, VllmRun("0.24.0", model="BAAI/bge-m3", kv_cache_memory_bytes=GiB),
                              first.restart_at + 1.0, job_id=200)
    entries = first.entries + restart.entries + embedding.entries
    return journal_specs(compose(Boot(random_boot_id(), ORIGIN - 20.0, entries)))


def test_readme_documents_exactly_the_metrics_the_exporter_serves(tmp_path, fake_driver, config_path):
    documented = set(re.findall(r"^\| `((?:xpu|process|python)_[a-z_]+)` \|", (REPO / "README.md").read_text(), re.M))
    write_config(config_path, FakeConfig(devices=(A770_TELEMETRY,)))
    procfs = FakeProcfs(tmp_path)
    procfs.add_unit_process(100, f"/system.slice/{CHAT}").add_drm_fd(xe_fdinfo(client_id=1, vram0=2 * GiB))
    # an i915 client (of an integrated GPU), whose engine counters are busy time, not xe's cycles
    procfs.add_unit_process(200, f"/system.slice/{EMBEDDING}").add_drm_fd(i915_fdinfo(client_id=2, pdev="0000:00:02.0"))
    journal = write_journal(tmp_path / "units.journal", every_kind_of_start())
    with RunningExporter(["--path.procfs", str(procfs.root), "--journal.file", str(journal),
                          "--journal.boot", "all"], env=fake_driver_env(fake_driver, config_path)) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and
                           sample(s, "xpu_exporter_collector_success", collector="journal") == 1 and
                           sample(s, "xpu_exporter_collector_success", collector="processes") == 1 and s)
    served = {name for name, _ in samples}
    assert documented == served
