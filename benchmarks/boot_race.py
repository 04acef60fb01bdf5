"""The boot race over repeated boots of a real systemd: how often the seed host's three units fail their
engine init when systemd starts them together.

    python benchmarks/boot_race.py              # 20 boots without and 20 with the gate, ~15 s each (as root)
    python benchmarks/boot_race.py --boots 5
    python benchmarks/boot_race.py --gate       # only the gated units
    python benchmarks/boot_race.py --no-gate    # only the ungated ones
    python benchmarks/boot_race.py --gate --no-exporter  # the gated units without the exporter unit

Each boot is a fresh systemd 252 as PID 1 of private namespaces (tests/realsystemd.py) with chat
(0.75), embedding (0.07) and stt (0.07) of one 16 GiB fake GPU enabled in multi-user.target
(tests/bootrace.py): replayed vLLM 0.24 engines that take memory the way vLLM accounts it
(tests/vllmunit.py), Restart=on-failure, RestartSec=1 (10 s before the replay's compression). A boot
ends when every unit serves; its failed inits and overlapping inits are read from its journal
(tests/journalfacts.py). Prints one line per boot, then the totals of each configuration.

A configuration is a name and the ExecStartPre= commands put before each unit's engine
(`configurations()`): "without gate", and "with gate": the packaged gate service and socket
(tests/bootrace.py packaged_gate: the console script of the Python running this, reading the namespace's
journal and the same fake GPU) and each unit's client as the packaged drop-in runs it (`ExecStartPre=
vllm-xpu-gate wait --gpu-memory-utilization R ...`, no "+"). The gated boots also enable the packaged exporter unit
(packaging/vllm-xpu-exporter.service, tests/bootrace.py's packaged_exporter: its name matches the
default `vllm*.service` the gates and the exporter watch), as a host runs them; --no-exporter leaves it
out. A boot's line counts the gates that timed out.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from bootrace import BootOutcome, gated, packaged_drop_in, packaged_exporter, packaged_gate, race_boot  # noqa: E402
from fakeze import build_fake_driver  # noqa: E402
from realsystemd import journal_field  # noqa: E402
from vllmunit import Engine  # noqa: E402

GATE_TIMED_OUT = re.compile(r"^vllm-xpu-gate: timed out after ")


@dataclass(frozen=True)
class Configuration:
    name: str
    exec_start_pre: Sequence[str] | Callable[[Engine], Sequence[str]] = ()
    gated: bool = False
    exporter: bool = False  # the packaged exporter unit enabled beside the units


def configurations(args: argparse.Namespace) -> list[Configuration]:
    without = Configuration("without gate")
    with_gate = Configuration("with gate" + (" and exporter unit" if args.exporter else ""), gated=True,
                              exporter=args.exporter)
    return {None: [without, with_gate], True: [with_gate], False: [without]}[args.gate]


def run(configuration: Configuration, boots: int, time_scale: float) -> list[BootOutcome]:
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="boot-race-") as shared:
        exec_start_pre = configuration.exec_start_pre
        driver = build_fake_driver(Path(shared)) if configuration.gated or configuration.exporter else None
        if configuration.gated:  # the clients; the service's Level Zero child loads the fake driver
            exec_start_pre = gated
        for boot in range(1, boots + 1):
            exporter = packaged_exporter(Path(shared), driver) if configuration.exporter else None
            gate = packaged_gate(Path(shared), driver) if configuration.gated else None
            outcome = race_boot(Path(shared), exec_start_pre=exec_start_pre, time_scale=time_scale, exporter=exporter,
                                gate=gate, files=packaged_drop_in() if configuration.gated else None)
            outcomes.append(outcome)
            failed = {unit.removeprefix("vllm-xpu-").removesuffix(".service"): dict(counts.failures)
                      for unit, counts in outcome.counts.items() if counts.failures}
            timeouts = f", {gate_timeouts(outcome)} gate timeouts" if configuration.gated else ""
            print(f"{configuration.name}: boot {boot:2d}: {outcome.failures} init failures, {outcome.overlaps} "
                  f"overlapping inits{timeouts}, all serving after {outcome.seconds:.1f} s"
                  + ("" if outcome.settled else " (NOT SETTLED)") + (f"  {failed}" if failed else ""), flush=True)
    return outcomes


def gate_timeouts(outcome: BootOutcome) -> int:
    """The gates of the boot that timed out (their decision line)."""
    return sum(bool(GATE_TIMED_OUT.match(journal_field(entry, "MESSAGE") or "")) for entry in outcome.entries)


def summary(configuration: Configuration, outcomes: Sequence[BootOutcome]) -> str:
    with_failures = sum(outcome.failures > 0 for outcome in outcomes)
    timeouts = f"{sum(gate_timeouts(o) for o in outcomes)} gate timeouts, " if configuration.gated else ""
    return (f"{configuration.name}: {len(outcomes)} boots, {with_failures} with init failures, "
            f"{sum(o.failures for o in outcomes)} init failures, {sum(o.overlaps for o in outcomes)} overlapping "
            f"inits, {timeouts}{sum(not o.settled for o in outcomes)} not settled")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boots", type=int, default=20)
    parser.add_argument("--gate", action=argparse.BooleanOptionalAction, default=None,
                        help="only the gated units (--gate) or only the ungated ones (--no-gate); default both")
    parser.add_argument("--exporter", action=argparse.BooleanOptionalAction, default=True,
                        help="enable the packaged exporter unit beside the gated units (default: yes)")
    parser.add_argument("--time-scale", type=float, default=0.1, help="real seconds per replayed vLLM second")
    args = parser.parse_args(argv)
    if args.boots < 1:
        parser.error("--boots must be at least 1")
    began = time.monotonic()
    results = [(configuration, run(configuration, args.boots, args.time_scale))
               for configuration in configurations(args)]
    print()
    for configuration, outcomes in results:
        print(summary(configuration, outcomes))
    print(f"({time.monotonic() - began:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
