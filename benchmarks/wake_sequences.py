"""The gate and vLLM's sleep mode: 100 randomised start/sleep/wake/stop sequences of the seed host's three units
(chat 0.75, embedding 0.07, stt 0.07 of one 16 GiB fake GPU) per configuration, each configuration on one boot of
a real systemd (tests/wakesequences.py), from the same seed (each operation fits its unit's state, so the
configurations part ways after the first failure). Prints each configuration's failed
inits and failed wakes and the sequences that had them.

    python benchmarks/wake_sequences.py                   # 100 sequences, seed 20261207 (as root; ~5 min each)
    python benchmarks/wake_sequences.py --sequences 30 --seed 7
    python benchmarks/wake_sequences.py --only gated

Configurations: "ungated" (no gate), "starts gated" (the packaged gate service and each unit's ExecStartPre=
client, the wakes not asked: the gate before it knew wakes) and "gated" (the wakes asked too: each unit's
ExecReload= runs `vllm-xpu-gate wake` before it signals its engine's wake). tests/real_systemd/test_gate_wake_real_systemd.py
runs 10 sequences of that seed ungated and gated.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from fakeze import build_fake_driver  # noqa: E402
from wakesequences import run_sequences  # noqa: E402

CONFIGURATIONS = ("ungated", "starts gated", "gated")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=100)
    parser.add_argument("--seed", type=int, default=20261207)
    parser.add_argument("--only", choices=CONFIGURATIONS, default=None)
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="run in DIR/<configuration> and keep it (the engines' events, the fake GPU's ledger)")
    args = parser.parse_args(argv)
    if args.sequences < 1:
        parser.error("--sequences must be at least 1")
    for configuration in [args.only] if args.only else CONFIGURATIONS:
        with tempfile.TemporaryDirectory(prefix="wake-sequences-") as directory:
            shared = Path(directory) if args.keep is None else args.keep / configuration.replace(" ", "-")
            shared.mkdir(parents=True, exist_ok=True)
            (shared / "driver").mkdir()
            driver = build_fake_driver(shared / "driver")
            shutil.copy(driver, shared / driver.name)
            began = time.monotonic()
            outcome = run_sequences(shared, seed=args.seed, count=args.sequences,
                                    gate_driver=None if configuration == "ungated" else shared / driver.name,
                                    gate_wakes=configuration == "gated")
            print(f"{outcome.summary()} ({time.monotonic() - began:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
