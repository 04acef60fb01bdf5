"""The gate service's catch-up on a big boot (what it reads once, at its start, before its first decision):
its read of the watched units' latest invocations against the read of the whole boot, on the same
journal, in the same run. Its decisions after that read no journal (benchmarks/gate_latency_bench.py).

    python benchmarks/gate_decision_bench.py [--size 1000000] [--runs 5]

The journal is bigjournal.py's (10 % of the entries about four watched ``vllm-*.service`` units, a
restart every ~400-800 of their lines, every third start failing) with ``--invocations``: every start
has its own invocation id, as systemd gives them. Each run is a fresh process that does what
``vllm-xpu-gate serve --journal.directory DIR --journal.boot BOOT`` does before its first decision: the
service's flags parsed into its journal selection, a ``LogFollower`` over it, and the wait until the
follower has read the journal up to now. "latest invocations" is
the gate's follower (``latest_invocations=True``), "whole boot" the exporter's read of every entry of the
boot. Runs alternate; the medians count. Timed: from creating the follower to its first state without an
error (in process, what the gate waits before it can decide), and spawn to exit (Python's start and the
imports included). Both reads must give the same decision state (initialising units and since when,
every unit's current invocation and whether it ended, its gpu_memory_utilization), or the run fails.

With ``--long-invocation`` one watched unit starts once and serves: 90 % of the journal's entries are in its one
invocation (a unit serving since boot), the case where a read of whole invocations grows with uptime. With
``--forged-names N`` the other units' entries also name N watched-looking units in ``UNIT=`` (any process may
write that field).

Target: the latest-invocations read under 1 s (in process) on 1M entries.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bigjournal import ensure_journal, journal_boot_id  # noqa: E402
from measure import median, run_child  # noqa: E402

REPO = HERE.parent
GATED_UNIT = "vllm-chat.service"
TARGET_S = 1.0
MODES = ("latest invocations", "whole boot")
POLL_S = 0.002


@dataclass(frozen=True)
class ModeResult:
    mode: str
    in_process_s: float  # median: follower created to its first state without an error
    wall_s: float  # median: spawn to exit
    cpu_s: float  # median
    peak_rss_mb: float  # the largest of the runs
    entries_read: int
    caught_up_from: str


@dataclass(frozen=True)
class GateDecisionResult:
    journal_entries: int
    runs: int
    latest: ModeResult
    whole: ModeResult
    decision_state: dict  # unit -> what the gate decides on (equal in both modes)

    @property
    def ratio(self) -> float:
        """Latest-invocations over whole-boot time, in process."""
        return self.latest.in_process_s / self.whole.in_process_s

    @property
    def passed(self) -> bool:
        return self.latest.in_process_s < TARGET_S and self.latest.caught_up_from == "latest invocations"


def child(directory: str, boot: str, mode: str) -> None:
    """In the measured child: the gate's journal read up to its first decision."""
    from vllm_xpu_exporter.gate.cli import parse_service_options
    from vllm_xpu_exporter.sources.journal import open_journal
    from vllm_xpu_exporter.sources.logs.follower import LogFollower

    options = parse_service_options(["--journal.directory", directory, "--journal.boot", boot])
    started = time.perf_counter()
    follower = LogFollower(options.selection, options.journal_max_units, open_reader=open_journal,
                           source="journal", latest_invocations=mode == "latest invocations")
    follower.start()
    while (state := follower.state()).error is not None:
        time.sleep(POLL_S)
    seconds = time.perf_counter() - started
    decision = {view.unit: [view.initialising_since_usec,
                            view.current.invocation_id if view.current else None,
                            view.invocation_ended(view.current.invocation_id) if view.current else None,
                            view.gpu_memory_utilization] for view in state.views}
    status = Path("/proc/self/status").read_text()
    hwm = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) / 1024
    print(json.dumps({"seconds": seconds, "entries": state.entries_read, "from": follower.caught_up_from,
                      "decision": decision, "vm_hwm_mb": hwm}), flush=True)
    os._exit(0)  # the follower now follows; joining it would add its wait


def bench_gate_decision(size: int, runs: int, log=print, long_invocation: bool = False,
                        forged_names: int = 0) -> GateDecisionResult:
    directory = ensure_journal(size, watched_fraction=0.9 if long_invocation else 0.1, log=log, invocations=True,
                               long_invocation=long_invocation, forged_names=forged_names)
    boot = journal_boot_id()
    samples: dict[str, list[tuple[float, float, float, float]]] = {mode: [] for mode in MODES}
    reports: dict[str, dict] = {}
    for _ in range(runs):
        for mode in MODES:
            run = run_child([sys.executable, __file__, "--child", str(directory), boot, mode],
                            env={**os.environ, "PYTHONPATH": str(REPO)})
            report = json.loads(run.stdout)
            samples[mode].append((report["seconds"], run.wall_s, run.cpu_s, report["vm_hwm_mb"]))
            if mode in reports and reports[mode]["decision"] != report["decision"]:
                raise RuntimeError(f"{mode}: two runs gave different decision states")
            reports[mode] = report
    if reports[MODES[0]]["decision"] != reports[MODES[1]]["decision"]:
        raise RuntimeError(f"the reads give different decision states:\n  {reports[MODES[0]]['decision']}\n  "
                           f"{reports[MODES[1]]['decision']}")

    def result(mode: str) -> ModeResult:
        runs_of = samples[mode]
        return ModeResult(mode, median([s[0] for s in runs_of]), median([s[1] for s in runs_of]),
                          median([s[2] for s in runs_of]), max(s[3] for s in runs_of), reports[mode]["entries"],
                          reports[mode]["from"])

    return GateDecisionResult(size, runs, result(MODES[0]), result(MODES[1]), reports[MODES[0]]["decision"])


def report(result: GateDecisionResult, log=print) -> None:
    log(f"  {result.journal_entries:,}-entry boot, gate of {GATED_UNIT}; median of {result.runs} run(s) each, "
        f"alternating:")
    for side in (result.latest, result.whole):
        log(f"    {side.mode:18}: {side.in_process_s:6.3f} s to the first decision state (in process), "
            f"{side.wall_s:6.3f} s spawn to exit, {side.cpu_s:6.2f} s CPU, {side.entries_read:7,} entries folded, "
            f"peak RSS {side.peak_rss_mb:5.1f} MB")
    log(f"    ratio latest invocations / whole boot: {result.ratio:.3f} in process "
        f"({result.whole.in_process_s / result.latest.in_process_s:.1f}x faster), "
        f"{result.latest.wall_s / result.whole.wall_s:.3f} spawn to exit")
    log("    same decision state: " + ", ".join(
        f"{unit} {'initialising' if state[0] else 'not initialising'}, R {state[3]}"
        for unit, state in sorted(result.decision_state.items())))
    if result.latest.caught_up_from != "latest invocations":
        log(f"    the gate's follower read the {result.latest.caught_up_from}, not the latest invocations")
    log(f"    target: latest invocations < {TARGET_S:g} s: {'met' if result.passed else 'MISSED'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="journal entries (default 1,000,000)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--long-invocation", action="store_true",
                        help="one watched unit started once and serving: 90 %% of the entries in one invocation")
    parser.add_argument("--forged-names", type=int, default=0, metavar="N",
                        help="the unwatched units' entries also carry UNIT=vllm-forged-K.service, K among N")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    result = bench_gate_decision(args.size, args.runs, long_invocation=args.long_invocation,
                                 forged_names=args.forged_names)
    report(result)
    return 0 if result.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
