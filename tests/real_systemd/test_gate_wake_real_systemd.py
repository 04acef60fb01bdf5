"""The gate holds wakes and inits apart on a real systemd (tests/wakesequences.py): randomised start/sleep/wake/stop
sequences of the seed host's three units on one 16 GiB fake GPU, the replayed 0.34 engines of tests/vllmunit.py
taking and giving back its memory. Gated (the packaged gate service, each unit's ExecStartPre= client and its
ExecReload= `vllm-xpu-gate wake` before the engine's wake) no init and no wake fails; ungated, sequences of the same
seed fail some, so the gated run's zero is the gate's doing (set VLLM_XPU_WAKE_SEED to try another seed). The suite runs SEQUENCES per boot;
benchmarks/wake_sequences.py runs the 100-sequence variant."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from test_real_systemd import require_root
from wakesequences import run_sequences

SEQUENCES = 10
SEED = int(os.environ.get("VLLM_XPU_WAKE_SEED", "20261207"))


@pytest.fixture
def shared(tmp_path: Path, fake_driver: Path) -> Path:
    require_root()
    shutil.copy(fake_driver, tmp_path / fake_driver.name)
    return tmp_path


def test_gated_no_init_and_no_wake_fails_where_the_same_sequences_ungated_fail(shared: Path, fake_driver: Path):
    ungated = run_sequences(shared, seed=SEED, count=SEQUENCES)
    assert ungated.failed_inits + ungated.failed_wakes > 0, f"nothing failed ungated: {ungated.summary()}"
    gated = run_sequences(shared, seed=SEED, count=SEQUENCES, gate_driver=shared / fake_driver.name)
    assert gated.failed_inits == 0 and gated.failed_wakes == 0, gated.summary()
