"""The README's metric tables are kept true: they name exactly what the exporter serves when every
collector has something to say."""

from __future__ import annotations

import re

from exporterproc import REPO, RunningExporter
from fakeprocfs import FakeProcfs, xe_fdinfo
from fakeze import A770, FakeConfig, fake_driver_env, write_config
from journalgen import (Clock, random_boot_id, unit_failed, unit_output, unit_process_exited, unit_starting,
                        write_journal)
from polling import wait_for
from scrapes import sample
from sizes import GiB

CHAT, EMBEDDING = "vllm-xpu-chat.service", "vllm-xpu-embedding.service"
API = "(APIServer pid=10) INFO 12-02 10:00:00 [api_server.py:1873] "
CORE = "(EngineCore pid=11) INFO 12-02 10:00:20 [gpu_worker.py:456] "


def every_kind_of_start(clock: Clock) -> list:
    """A failed then a successful start of chat (a new main pid, as after a real restart), and a start of
    embedding with kv_cache_memory_bytes set, overlapping chat's second init."""
    failure = ("ValueError: To serve at least one request with the model's max seq len (131072), (3.36 GiB KV "
               "cache is needed, which is larger than the available KV cache memory (2.13 GiB).")
    return [
        unit_starting(CHAT, clock.tick()),
        unit_output(CHAT, API + "vLLM API server version 0.24.0", clock.tick()),
        unit_output(CHAT, API + "non-default args: {'model': 'Qwen/Qwen3-8B', 'max_model_len': 131072, "
                                "'gpu_memory_utilization': 0.75, 'max_num_seqs': 3}", clock.tick()),
        unit_output(CHAT, "(EngineCore pid=11) ERROR 12-02 10:00:30 [core.py:708] " + failure, clock.tick()),
        unit_process_exited(CHAT, clock.tick()),
        unit_failed(CHAT, clock.tick()),
        unit_starting(CHAT, clock.tick()),
        unit_starting(EMBEDDING, clock.tick()),
        unit_output(EMBEDDING, API + "vLLM API server version 0.24.0", clock.tick()),
        unit_output(EMBEDDING, API + "non-default args: {'model': 'BAAI/bge-m3', 'kv_cache_memory_bytes': "
                                     "1073741824}", clock.tick()),
        unit_output(CHAT, API + "vLLM API server version 0.24.0", clock.tick(), pid=12),
        unit_output(CHAT, API + "non-default args: {'model': 'Qwen/Qwen3-8B', 'max_model_len': 131072, "
                                "'gpu_memory_utilization': 0.75, 'max_num_seqs': 3}", clock.tick(), pid=12),
        unit_output(CHAT, CORE + "Available KV cache memory: 3.25 GiB", clock.tick(), pid=12),
        unit_output(CHAT, "(EngineCore pid=11) INFO 12-02 10:00:21 [kv_cache_utils.py:1286] GPU KV cache size: "
                          "47,328 tokens", clock.tick(), pid=12),
        unit_output(CHAT, "(EngineCore pid=11) INFO 12-02 10:00:21 [kv_cache_utils.py:1290] Maximum concurrency "
                          "for 131,072 tokens per request: 0.36x", clock.tick(), pid=12),
        unit_output(CHAT, "(EngineCore pid=11) INFO 12-02 10:00:40 [core.py:210] init engine (profile, create kv "
                          "cache, warmup model) took 42.50 seconds", clock.tick(), pid=12),
    ]


def test_readme_documents_exactly_the_metrics_the_exporter_serves(tmp_path, fake_driver, config_path):
    documented = set(re.findall(r"^\| `((?:xpu|process|python)_[a-z_]+)` \|", (REPO / "README.md").read_text(), re.M))
    write_config(config_path, FakeConfig(devices=(A770,)))
    procfs = FakeProcfs(tmp_path)
    procfs.add_unit_process(100, f"/system.slice/{CHAT}").add_drm_fd(xe_fdinfo(client_id=1, vram0=2 * GiB))
    journal = write_journal(tmp_path / "units.journal", every_kind_of_start(Clock(random_boot_id())))
    with RunningExporter(["--path.procfs", str(procfs.root), "--journal.file", str(journal),
                          "--journal.boot", "all"], env=fake_driver_env(fake_driver, config_path)) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and
                           sample(s, "xpu_exporter_collector_success", collector="journal") == 1 and
                           sample(s, "xpu_exporter_collector_success", collector="processes") == 1 and s)
    served = {name for name, _ in samples}
    assert documented == served
