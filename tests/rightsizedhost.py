"""The right-sizing tests' host: chat and embedding, each with one vLLM 0.24 start, in a journal on a 16 GiB GPU;
the units' views from it; vllm-xpu-plan run on such a journal (tests/planner/test_planner_rightsizing.py,
tests/sources/test_sources_prometheus.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vllm_xpu_exporter.fold.engine_starts import EngineTracker
from journalgen import current_boot_id
from sizes import GiB
from vllmlogs import Boot, VllmRun, compose, service_runs, tracker_entries

REPO = Path(__file__).resolve().parents[1]
CHAT, EMBEDDING = "vllm-xpu-chat.service", "vllm-xpu-embedding.service"
SIXTEEN_GIB = 16 * GiB
RUNS = {CHAT: VllmRun("0.24.0", gpu_memory_utilization=0.5, max_model_len=32768, max_num_seqs=4, kv_cache_gib=2.0),
        EMBEDDING: VllmRun("0.24.0", gpu_memory_utilization=0.3, max_model_len=8192, max_num_seqs=2,
                           kv_cache_gib=3.36, main_pid=5000)}


def placed() -> list:
    """The units' starts as journal entries of the current boot."""
    boot_at = 1_747_044_600.0
    entries = []
    for index, (unit, run) in enumerate(RUNS.items()):
        entries += service_runs(unit, [run], boot_at + 60 + index * 0.001, job_id=120 + index)
    return compose(Boot(current_boot_id(), boot_at, tuple(entries)))


def views() -> list:
    tracker = EngineTracker()
    tracker.extend(tracker_entries(placed()))
    return list(tracker.views())


def run_plan(journal: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """vllm-xpu-plan on `journal`, the GPU given as 16 GiB."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "vllm_xpu_exporter.planner", "--journal.file", str(journal),
                           "--device-memory", str(SIXTEEN_GIB), *args],
                          capture_output=True, text=True, timeout=120, env=env, check=False)
