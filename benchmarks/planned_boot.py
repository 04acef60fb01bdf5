"""The planner's proof on the seed host (chat, embedding and stt on one 16 GiB GPU): the drop-ins
`vllm-xpu-plan` writes, applied with the gate off, over repeated cold boots of a real systemd, for several
figure sets spread over the rounding range of what vLLM prints; and the default target (no flags) proposing
each unit at the KV it had.

    python benchmarks/planned_boot.py                  # 5 figure sets: observation and plan, 20 planned boots
                                                       # each, 20 without for the first set (as root)
    python benchmarks/planned_boot.py --boots 5 --figure-sets 0,5
    python benchmarks/planned_boot.py --no-baseline    # only the planned boots
    python benchmarks/planned_boot.py --after-race --figure-sets 0 --no-baseline
                                                       # the reported flow: a failing cold boot, then
                                                       # vllm-xpu-plan with no flags, its drop-ins, 20 boots

Figure sets: chat's weights moved by 0, 1, 2.5, 4 and 5 MiB (--figure-sets, MiB), which moves its true KV
cache by as much under the same printed "X.XX GiB": the budget must be taken whatever the true figure within
the print was (a 5 MiB shift made a plan read at the print's value fail every boot).

The host is the boot race's (tests/bootrace.py): chat (0.75, 131072 tokens, max_num_seqs 3), embedding
(0.07) and stt (0.07) of one 16 GiB fake GPU, replayed vLLM 0.24 engines that take memory the way vLLM
accounts it and honour --kv-cache-memory-bytes as vLLM 0.16+ does on XPU (tests/vllmunit.py), each a unit
with Restart=on-failure on a fresh systemd 252 booted as PID 1 of private namespaces
(tests/realsystemd.py). tests/plannedboot.py does the steps:

1. observation: one boot where the units start one after another, each alone (each succeeds: how an
   operator first learns the figures);
2. the planner as shipped on that boot's journal (Level Zero through the fake driver for the GPU's
   total): the default target (no flags) must exit 0 with each unit at the KV its last successful start
   had; then `--requests vllm-xpu-chat.service=1` (one full-length request) as systemd drop-ins written
   into /etc/systemd/system, daemon-reload;
3. --boots cold boots with those drop-ins, the three units enabled so that systemd starts them together,
   no gate: a boot counts when every unit started once, without an init failure, serves and its KV cache
   holds its target (KV bytes >= its planned --kv-cache-memory-bytes, the tokens its block pool serves
   beside vLLM's null block >= its target tokens and one request of its full length, from the engines'
   events); each line also shows the smallest margin of free memory over ceil(R x total) at
   the boot's start checks and of free memory over the KV bytes at its KV allocations (the totals count
   boots where either was short);
4. --baseline (default): as many boots without the drop-ins (the units as they were, ungated), counted
   the same way (tokens against the same targets).

Prints a line per boot, then the counts per figure set. Exit status 0 when the claims hold for every set
(the default target proposed with exit 0, every planned boot counted), else 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import bootrace  # noqa: E402
from fakeze import build_fake_driver  # noqa: E402
from polling import wait_for  # noqa: E402
from vllmunit import read_events  # noqa: E402
from plannedboot import (CHAT, PLANNED_TARGETS, BootVerdict, Observation, UnitVerdict, judge,  # noqa: E402
                         observe, planned_boot)

GiB = 1 << 30
MiB = 1 << 20
FIGURE_SETS_MIB = (0.0, 1.0, 2.5, 4.0, 5.0)


def gib(value: int | None) -> str:
    return "-" if value is None else f"{value / GiB:+.2f} GiB"


def short(unit: str) -> str:
    return unit.removeprefix("vllm-xpu-").removesuffix(".service")


def default_proposed(observation: Observation) -> tuple[bool, str]:
    """Whether the default target (no flags) was proposed as claimed (exit 0, chat at the KV of its last
    successful start), and what says so."""
    run = observation.default
    chat = next((unit for device in run.document().get("devices", []) for unit in device["units"]
                 if unit["unit"] == CHAT), None) if run.stdout else None
    proposed = run.returncode == 0 and chat is not None and "last successful start" in chat["target"]
    text = (f"exit {run.returncode}, chat {chat['kv_cache_memory_bytes']} bytes ({chat['target']})" if chat
            else run.stderr.strip() or f"(no output, exit {run.returncode})")
    return proposed, text


def describe_observation(observation: Observation) -> None:
    starts = ", ".join(f"{short(unit)} {counts.starts} start{'s' * (counts.starts != 1)}"
                       + (f" {dict(counts.failures)}" if counts.failures else "")
                       for unit, counts in observation.counts.items())
    how = "one after another, each alone" if not any(c.failures for c in observation.counts.values()) else \
        "started together, some inits failed"
    print(f"observation ({how}): {starts}")
    proposed, line = default_proposed(observation)
    chat = next((unit for device in observation.default.document().get("devices", [])
                 for unit in device["units"] if unit["unit"] == CHAT), None) if observation.default.stdout else None
    if chat is not None:
        print(f"default target: chat {chat['target_tokens']} tokens ({chat['target']}): KV "
              f"{chat['kv_cache_memory_bytes']} bytes + non-KV {chat['non_kv_bytes']} = {chat['footprint_bytes']} "
              f"({chat['footprint_bytes'] / GiB:.2f} GiB)")
    print(f"default target: planner exit {observation.default.returncode} before any boot: {line}"
          + ("" if proposed else "  (NOT AS CLAIMED)"))
    planned = observation.planned
    argv = planned.argv
    targets = " ".join(argv[argv.index("--systemctl") + 2:-2]) or "no flags"
    print(f"planned ({targets}): planner exit {planned.returncode}; "
          f"drop-ins written: {len(observation.drop_ins)} (exit {observation.written.returncode})")
    for unit, target in observation.targets.items():
        print(f"  {short(unit)}: target {target.tokens} tokens, --kv-cache-memory-bytes {target.kv_bytes}, "
              f"--gpu-memory-utilization {target.gpu_memory_utilization:g}")


def why_not(unit: UnitVerdict) -> str:
    reasons = [f"{unit.failures} failed inits"] if unit.failures else []
    reasons += [f"{unit.starts} starts"] if unit.starts != 1 else []
    reasons += ["not serving"] if not unit.served else []
    reasons += ["KV below target"] if not unit.holds_target else []
    return ", ".join(reasons)


def boot_line(name: str, number: int, verdict: BootVerdict) -> str:
    outcome = verdict.outcome
    units = "; ".join(f"{short(u.unit)} {u.kv_tokens if u.kv_tokens is not None else '-'} tokens"
                      + ("" if u.served_its_target else f" (NOT ITS TARGET: {why_not(u)})")
                      for u in verdict.units.values())
    failed = {short(unit): dict(counts.failures) for unit, counts in outcome.counts.items() if counts.failures}
    return (f"{name}: boot {number:2d}: {'ok ' if verdict.every_unit_served_its_target else 'NO '} "
            f"{outcome.failures} init failures, {outcome.overlaps} overlapping inits, all serving after "
            f"{outcome.seconds:.1f} s" + ("" if outcome.settled else " (NOT SETTLED)")
            + f"; {units}; min free - requested at a start check {gib(verdict.min_start_margin)}, "
            f"free - KV at a KV allocation {gib(verdict.min_allocation_margin)}"
            + (f"  {failed}" if failed else ""))


def boots(name: str, shared: Path, observation: Observation, count: int, *, planned: bool,
          time_scale: float, gate_driver: Path | None = None) -> list[BootVerdict]:
    verdicts = []
    for number in range(1, count + 1):
        outcome = planned_boot(shared, observation if planned else None, time_scale=time_scale,
                               gate_driver=gate_driver)
        verdict = judge(outcome, observation.targets, planned=planned)
        verdicts.append(verdict)
        print(boot_line(name, number, verdict), flush=True)
    return verdicts


def summary(name: str, verdicts: Sequence[BootVerdict], what: str) -> str:
    good = sum(verdict.every_unit_served_its_target for verdict in verdicts)
    with_failures = sum(verdict.outcome.failures > 0 for verdict in verdicts)
    return (f"{name}: {good}/{len(verdicts)} cold boots {what}; {with_failures} with init failures, "
            f"{sum(v.outcome.failures for v in verdicts)} init failures, "
            f"{sum(v.outcome.overlaps for v in verdicts)} overlapping inits, "
            f"{sum(not v.start_checks_passed for v in verdicts)} with a start check short of its request, "
            f"{sum(not v.allocations_fit for v in verdicts)} with a KV cache taken beyond free memory, "
            f"{sum(not v.outcome.settled for v in verdicts)} not settled")


BASE_CHAT = bootrace.RACE_UNITS[CHAT]


def chat_weights_moved(offset_mib: float) -> None:
    """The figure set: chat's weights (and so its true KV cache) moved by `offset_mib` MiB. The race's units
    are read from bootrace.RACE_UNITS at every boot, so the set holds for the observation and its boots."""
    moved = BASE_CHAT.weights_gib + offset_mib * MiB / GiB
    bootrace.RACE_UNITS[CHAT] = dataclasses.replace(BASE_CHAT, weights_gib=moved)


def one_set(offset_mib: float, args: argparse.Namespace, baseline: bool) -> tuple[bool, list[str]]:
    """Observation, plan and boots of one figure set; whether its claims hold, and its summary lines."""
    chat_weights_moved(offset_mib)
    name = f"chat weights +{offset_mib:g} MiB"
    print(f"\n=== figure set: {name}", flush=True)
    with tempfile.TemporaryDirectory(prefix="planned-boot-") as directory:
        shared = Path(directory)
        driver = build_fake_driver(shared)
        observation = observe(shared, driver, time_scale=args.time_scale, after_race=args.after_race,
                              targets=() if args.after_race else PLANNED_TARGETS)
        describe_observation(observation)
        if observation.planned.returncode != 0 or len(observation.drop_ins) != len(observation.targets):
            print(f"the plan did not fit or wrote no drop-ins:\n"
                  f"{observation.planned.stderr}{observation.written.stderr}")
            return False, [f"{name}: NO PLAN"]
        what = "every unit started once and its KV cache held its target (gate off)"
        if args.gated:
            held = compare_gated(shared, driver, observation, args.boots, args.time_scale, time.monotonic()) == 0
            return held, [f"{name}: gate service beside the plan: {'held' if held else 'did NOT hold'} (above)"]
        planned = boots("planned", shared, observation, args.boots, planned=True, time_scale=args.time_scale)
        without = boots("without the drop-ins", shared, observation, args.boots, planned=False,
                        time_scale=args.time_scale) if baseline else []
    proposed, line = default_proposed(observation)
    chat = observation.targets[CHAT]
    lines = [f"{name}: default target (no flags): {line}",
             f"{name}: chat --kv-cache-memory-bytes {chat.kv_bytes} for {chat.tokens} tokens",
             f"{name}: " + summary("planned", planned, what)]
    if without:
        lines.append(f"{name}: " + summary("without the drop-ins (ungated, unplanned)", without, what))
    return proposed and all(v.every_unit_served_its_target for v in planned), lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boots", type=int, default=20)
    parser.add_argument("--figure-sets", default=",".join(f"{o:g}" for o in FIGURE_SETS_MIB),
                        help="MiB to move chat's weights by, one set each (default: %(default)s)")
    parser.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="also boot as many times without the drop-ins, for the first set (default: yes)")
    parser.add_argument("--time-scale", type=float, default=0.1, help="real seconds per replayed vLLM second")
    parser.add_argument("--after-race", action="store_true",
                        help="observe a cold boot in which the units race (some inits fail), and boot with the "
                             "drop-ins of vllm-xpu-plan with no flags (the default target)")
    parser.add_argument("--gated", action="store_true",
                        help="alternate planned boots without and with the gate service (each client given its "
                             "unit's planned R and KV budget), and compare when all units served")
    args = parser.parse_args(argv)
    if args.boots < 1:
        parser.error("--boots must be at least 1")
    try:
        offsets = [float(value) for value in args.figure_sets.split(",")]
    except ValueError:
        parser.error("--figure-sets wants MiB figures separated by commas")
    began = time.monotonic()
    results = [one_set(offset, args, args.baseline and index == 0) for index, offset in enumerate(offsets)]
    print()
    for _, lines in results:
        print("\n".join(lines))
    print(f"({time.monotonic() - began:.0f} s)")
    return 0 if all(ok for ok, _ in results) else 1


RESTART_TIMEOUT_S = 60.0


def restart_race(shared: Path, delays: list[float]):
    """while_up: once all serve, chat's main process is killed (Restart=on-failure starts it again) and
    stt restarted at the same moment; appends how long after the restart stt's engine started (its
    ExecStartPre= and systemd's own work: what it did not wait for chat's init)."""
    chat, stt = "vllm-xpu-chat.service", "vllm-xpu-stt.service"

    def run(machine) -> None:
        events = shared / "events.jsonl"
        before = len(read_events(events))
        began = time.time()
        machine.systemctl("kill", "--kill-whom=main", "--signal=KILL", chat)
        machine.systemctl("restart", "--no-block", stt)
        wait_for(lambda: {record["unit"] for record in read_events(events)[before:]
                          if record["event"] == "serving"} >= {chat, stt}, timeout=RESTART_TIMEOUT_S, interval=0.05)
        started = [record["at"] for record in read_events(events)[before:]
                   if record["unit"] == stt and record["event"] == "started"]
        delays.append(started[0] - began if started else float("inf"))
    return run


def compare_gated(shared: Path, driver: Path, observation: Observation, count: int, time_scale: float,
                  began: float) -> int:
    """Planned boots alternating gate off / gate service on; the claim: with the gate every boot counts
    (each unit once, its KV at its target) and its slowest boot serves within 1.15 x the ungated
    planned boots' slowest, measured in the same run. In each gated boot, once all serve, chat is killed
    and stt restarted at the same moment: stt's engine starts within 2 s (it does not wait for chat's
    init), so it serves within its own init time + 2 s."""
    ungated: list[BootVerdict] = []
    gated_verdicts: list[BootVerdict] = []
    delays: list[float] = []
    for number in range(1, count + 1):
        for name, verdicts, gate_driver in (("planned, gate off", ungated, None),
                                            ("planned, gate service", gated_verdicts, driver)):
            outcome = planned_boot(shared, observation, time_scale=time_scale, gate_driver=gate_driver,
                                   while_up=restart_race(shared, delays) if gate_driver else None)
            verdict = judge(outcome, observation.targets, planned=True)
            verdicts.append(verdict)
            print(boot_line(name, number, verdict)
                  + (f"; chat killed, stt restarted: stt's engine started {delays[-1]:.2f} s after" if gate_driver
                     else ""), flush=True)
    what = "every unit started once and its KV cache held its target"
    print()
    print(summary("planned, gate off", ungated, what))
    print(summary("planned, gate service", gated_verdicts, what))
    slowest = {name: max(v.outcome.seconds for v in verdicts) for name, verdicts in
               (("off", ungated), ("on", gated_verdicts))}
    medians = {name: sorted(v.outcome.seconds for v in verdicts)[len(verdicts) // 2] for name, verdicts in
               (("off", ungated), ("on", gated_verdicts))}
    ratio = slowest["on"] / slowest["off"]
    print(f"all units serving after: gate off median {medians['off']:.1f} s, slowest {slowest['off']:.1f} s; "
          f"gate service median {medians['on']:.1f} s, slowest {slowest['on']:.1f} s; slowest ratio {ratio:.2f} "
          f"(target <= 1.15)")
    print(f"chat killed and stt restarted together: stt's engine started {min(delays):.2f} to {max(delays):.2f} s "
          f"after the restart (target < 2 s)")
    print(f"({time.monotonic() - began:.0f} s)")
    good = all(v.every_unit_served_its_target for v in gated_verdicts)
    return 0 if good and ratio <= 1.15 and max(delays) < 2 else 1


if __name__ == "__main__":
    sys.exit(main())
