"""The planner (`vllm-xpu-plan`, docs/planner.md) on the issue's host, on a real systemd
(tests/realsystemd.py) with the boot race's three replayed units (tests/bootrace.py: chat 0.75 with
131072 tokens and max_num_seqs 3, embedding 0.07, stt 0.07 of one 16 GiB fake GPU; vLLM 0.24, which
honours --kv-cache-memory-bytes on XPU; tests/vllmunit.py):

    observation = observe(shared, fake_driver)       # one boot, the units started one after another
    observation.default.returncode                    # 1: chat's 3 x 131072 tokens do not fit
    verdict = judge(planned_boot(shared, observation), observation.targets)
    verdict.every_unit_served_its_target

1. `observe()`: one boot where the units are installed but not enabled and started one after another,
   each alone once the previous one serves (so each succeeds: how an operator first learns the
   figures). Then the planner as shipped (its console script, else `python -m vllm_xpu_exporter.planner.cli`) runs on the
   host against that boot: `--journal.directory` the namespace's journal, the GPU's total from Level Zero
   (the fake driver, whose config is the same GPU), `--systemctl` a wrapper that runs the namespace's
   systemctl through nsenter. Three runs: the default target as JSON (max_num_seqs x the full model
   length), `targets` as JSON, and `targets` as systemd drop-ins written into the machine's
   /etc/systemd/system (`--format systemd --output-dir`); then `systemctl daemon-reload`, and `systemctl
   cat` shows each unit with its drop-in.
2. `planned_boot()`: a cold boot (race_boot: a fresh systemd, a fresh GPU, the three units enabled so
   that systemd starts them together; no gate) with those drop-ins in /etc/systemd/system.
3. `judge()`: per unit, from the boot's journal (tests/journalfacts.py) and the engines' events: one
   start, no init failure, serving, its KV cache holding its target (tokens >= the planned target; with
   the drop-ins also KV bytes >= the planned budget, and the budget the engine ran with is the plan's),
   free memory at each start check against ceil(R x total), and free memory when each KV cache was
   taken against its bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import journalfacts
from bootrace import (RACE_UNITS, BootOutcome, gate_command, gated, idle_gpu, packaged_drop_in, packaged_gate, race_boot,
                      race_unit_files)
from vllm_xpu_exporter.sources.plan_dropins import DROP_IN_NAME
from fakeze import fake_driver_env
from polling import wait_for
from realsystemd import RealSystemd
from vllmunit import serving_units

CHAT = "vllm-xpu-chat.service"
# One request of chat's full length (131072 tokens): what fits beside the small units on 16 GiB.
PLANNED_TARGETS = ("--requests", f"{CHAT}=1")
STEP_TIMEOUT = 30.0
PLANNER_TIMEOUT = 120.0
SYSTEMCTL_WRAPPER = "systemctl-in-namespace"


def planner_command() -> list[str]:
    """`vllm-xpu-plan` beside this Python (the console script), else the same main() by module."""
    script = Path(sys.executable).with_name("vllm-xpu-plan")
    return [str(script)] if script.exists() else [sys.executable, "-m", "vllm_xpu_exporter.planner"]


@dataclass(frozen=True)
class PlannerRun:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def document(self) -> dict:
        """The plan as JSON (a --format json run)."""
        return json.loads(self.stdout)

    @property
    def does_not_fit(self) -> list[str]:
        """stderr's "GPU ... does not fit: N bytes missing (...)" lines."""
        return [line for line in self.stderr.splitlines() if " does not fit: " in line]


def run_planner(*args: str, env: Mapping[str, str]) -> PlannerRun:
    argv = (*planner_command(), *args)
    completed = subprocess.run(argv, capture_output=True, text=True, timeout=PLANNER_TIMEOUT,
                               env={**os.environ, **env})
    return PlannerRun(tuple(argv), completed.returncode, completed.stdout, completed.stderr)


@dataclass(frozen=True)
class UnitTarget:
    """What the plan sets for a unit: its KV cache holds `tokens` in `kv_bytes` (--kv-cache-memory-bytes)
    beside --gpu-memory-utilization `gpu_memory_utilization`."""

    tokens: int
    kv_bytes: int
    gpu_memory_utilization: float


def unit_targets(document: Mapping) -> dict[str, UnitTarget]:
    return {unit["unit"]: UnitTarget(unit["target_tokens"], unit["kv_cache_memory_bytes"],
                                     unit["gpu_memory_utilization"])
            for device in document["devices"] for unit in device["units"]}


@dataclass(frozen=True)
class Observation:
    counts: Mapping[str, journalfacts.UnitCounts]  # the observation boot's starts, from its journal
    default: PlannerRun  # --format json, the default target
    planned: PlannerRun  # --format json with the targets
    written: PlannerRun  # --format systemd --output-dir with the targets
    drop_ins: Mapping[str, str]  # path inside -> text, as the planner wrote them
    cat: Mapping[str, str]  # `systemctl cat UNIT` after daemon-reload

    @property
    def targets(self) -> dict[str, UnitTarget]:
        return unit_targets(self.planned.document())


def systemctl_wrapper(shared: Path, pid1: int) -> Path:
    """An executable that runs the namespace's systemctl with its arguments (for --systemctl)."""
    nsenter = shutil.which("nsenter") or "/usr/bin/nsenter"
    wrapper = Path(shared) / SYSTEMCTL_WRAPPER
    wrapper.write_text(f'#!/bin/sh\nexec {nsenter} -t {pid1} -a -- systemctl "$@"\n')
    wrapper.chmod(0o755)
    # the planner verifies its drop-ins with the systemd-analyze beside its systemctl: the host's (the same
    # systemd 252; the units' programs are the host's files too)
    analyze = wrapper.with_name("systemd-analyze")
    if not analyze.exists():
        analyze.symlink_to("/usr/bin/systemd-analyze")
    return wrapper


def start_one_after_another(machine: RealSystemd, events: Path, units: Sequence[str]) -> None:
    for unit in units:
        machine.start(unit)
        if not wait_for(lambda: unit in serving_units(events), timeout=STEP_TIMEOUT, interval=0.1):
            raise RuntimeError(f"{unit} did not serve within {STEP_TIMEOUT} s of its start, alone")


def observe(shared: Path, fake_driver: Path, *, targets: Sequence[str] = PLANNED_TARGETS,
            time_scale: float = 0.1, after_race: bool = False) -> Observation:
    """The observation boot and the planner's runs on it (the module docstring, 1). `after_race`: the
    units start together at boot instead (a failing cold boot; Restart=on-failure brings them up), and
    the planner reads that boot."""
    shared = Path(shared)
    config, events = idle_gpu(shared)
    enable = list(RACE_UNITS) if after_race else []
    with RealSystemd(shared, files=race_unit_files(shared, time_scale=time_scale), enable=enable) as machine:
        if after_race:
            if not wait_for(lambda: serving_units(events) == set(RACE_UNITS), timeout=4 * STEP_TIMEOUT, interval=0.1):
                raise RuntimeError("the units did not all serve after the cold boot")
        else:
            start_one_after_another(machine, events, list(RACE_UNITS))
        machine.sync_journal()
        counts = journalfacts.counts(machine.journal(*RACE_UNITS), RACE_UNITS)
        common = ["--journal.directory", str(machine.journal_directory),
                  "--systemctl", str(systemctl_wrapper(shared, machine.pid1))]
        env = fake_driver_env(fake_driver, config)
        default = run_planner(*common, "--format", "json", env=env)
        planned = run_planner(*common, *targets, "--format", "json", env=env)
        written = run_planner(*common, *targets, "--format", "systemd",
                              "--output-dir", str(machine.host_path("/etc/systemd/system")), env=env)
        machine.daemon_reload()
        drop_ins = {}
        for unit in RACE_UNITS:
            inside = f"/etc/systemd/system/{unit}.d/{DROP_IN_NAME}"
            if machine.host_path(inside).exists():
                drop_ins[inside] = machine.host_path(inside).read_text()
        cat = {unit: machine.systemctl("cat", unit).stdout for unit in RACE_UNITS}
    return Observation(counts, default, planned, written, drop_ins, cat)


def planned_boot(shared: Path, observation: Observation | None, *, time_scale: float = 0.1,
                 gate_driver: Path | None = None, while_up=None) -> BootOutcome:
    """A cold boot of the three units started together with the observation's drop-ins (None: without,
    the race as it was); gate off, or with `gate_driver` (the fake driver, a copy in `shared`) the packaged
    gate service and each unit's client given the plan's R and KV budget (`--gpu-memory-utilization`,
    `--kv-cache-memory-bytes`), so the service admits the planned units by the plan. `while_up`: as
    race_boot's."""
    files = dict(observation.drop_ins) if observation else {}
    if gate_driver is None:
        return race_boot(shared, time_scale=time_scale, files=files or None, while_up=while_up)
    targets = observation.targets if observation else {}
    unit_of = {engine: unit for unit, engine in RACE_UNITS.items()}

    def client(engine) -> list[str]:
        target = targets.get(unit_of[engine])
        if target is None:
            return gated(engine)
        return [gate_command(extra=["--gpu-memory-utilization", f"{target.gpu_memory_utilization:g}",
                                    "--kv-cache-memory-bytes", str(target.kv_bytes)])]

    return race_boot(shared, time_scale=time_scale, files={**files, **packaged_drop_in()}, exec_start_pre=client,
                     gate=packaged_gate(shared, gate_driver), while_up=while_up)


@dataclass(frozen=True)
class UnitVerdict:
    unit: str
    starts: int  # successful starts in the boot
    failures: int  # failed inits in the boot
    served: bool
    kv_bytes: int | None  # of the start that serves
    kv_tokens: int | None  # the tokens its block pool serves: whole blocks less vLLM's null block
    budgets: tuple[int | None, ...]  # the --kv-cache-memory-bytes each start ran with (None: none)
    start_margins: tuple[int, ...]  # free - ceil(R x total) at each start check
    allocation_margins: tuple[int, ...]  # free - KV bytes when each start took its KV cache
    holds_target: bool

    @property
    def served_its_target(self) -> bool:
        return self.served and self.starts == 1 and self.failures == 0 and self.holds_target


@dataclass(frozen=True)
class BootVerdict:
    outcome: BootOutcome
    units: Mapping[str, UnitVerdict]

    @property
    def every_unit_served_its_target(self) -> bool:
        return self.outcome.settled and all(unit.served_its_target for unit in self.units.values())

    @property
    def start_checks_passed(self) -> bool:
        """Every start check of the boot saw at least ceil(R x total) free."""
        return all(margin >= 0 for unit in self.units.values() for margin in unit.start_margins)

    @property
    def min_start_margin(self) -> int | None:
        return min((margin for unit in self.units.values() for margin in unit.start_margins), default=None)

    @property
    def min_allocation_margin(self) -> int | None:
        return min((margin for unit in self.units.values() for margin in unit.allocation_margins), default=None)

    @property
    def allocations_fit(self) -> bool:
        """Every KV cache of the boot was taken from memory that was free."""
        return all(margin >= 0 for unit in self.units.values() for margin in unit.allocation_margins)


def judge(outcome: BootOutcome, targets: Mapping[str, UnitTarget], *, planned: bool = True) -> BootVerdict:
    """Each unit of the boot against its target (the KV tokens its block pool serves, beside vLLM's null block,
    and one request of its full length; `planned`: also KV bytes >= the planned budget, and every start ran with
    that budget)."""
    verdicts = {}
    for unit, target in targets.items():
        records = [record for record in outcome.events if record["unit"] == unit]
        serving = [record for record in records if record["event"] == "serving"]
        last = serving[-1] if serving else None
        budgets = tuple(record.get("budget") for record in records if record["event"] == "profiled")
        margins = tuple(record["free"] - record["requested"] for record in records if record["event"] == "baseline")
        allocations = tuple(record["free"] - record["kv_bytes"] for record in records
                            if record["event"] == "allocated")
        kv_bytes, kv_tokens = (last.get("kv_bytes"), last.get("served_tokens")) if last else (None, None)
        holds = kv_tokens is not None and kv_tokens >= target.tokens and bool(last.get("serves_one_request"))
        if planned:
            holds = holds and kv_bytes is not None and kv_bytes >= target.kv_bytes \
                and all(budget == target.kv_bytes for budget in budgets)
        counts = outcome.counts[unit]
        verdicts[unit] = UnitVerdict(unit, counts.starts, sum(counts.failures.values()), last is not None, kv_bytes,
                                     kv_tokens, budgets, margins, allocations, holds)
    return BootVerdict(outcome, verdicts)


__all__ = ["BootVerdict", "CHAT", "Observation", "PLANNED_TARGETS", "PlannerRun", "UnitTarget", "UnitVerdict",
           "judge", "observe", "planned_boot", "planner_command", "run_planner", "unit_targets"]
