"""Randomised start/sleep/wake/stop sequences of the seed host's three units (chat 0.75 max_model_len 131072
max_num_seqs 3, embedding 0.07, stt 0.07 of one 16 GiB fake GPU; tests/bootrace.py's RACE_UNITS) on one boot of
a real systemd (tests/realsystemd.py), gated or not. Starting systemd costs ~10 s, a sequence a few: the
sequences share the boot.

    outcome = run_sequences(shared, seed=7, count=10, gate_driver=shared / "libze_fake.so")  # gated
    outcome = run_sequences(shared, seed=7, count=10)                                         # ungated
    outcome.failed_inits, outcome.failed_wakes, outcome.failures_by_sequence

A sequence: every unit takes one operation fitting its state (stopped: start; serving: sleep at level 1 or 2, or
stop; asleep: wake, or stop), chosen by `random.Random(seed)`; what gives memory back (sleeps, stops) goes first,
then what takes it (starts, wakes), each group at random offsets within 1.5 s of one another, and the sequence
ends when each operation has its outcome. Memory given back while another engine profiles is counted by that
engine as its own (its KV cache grows by it, and the unit that gave it back cannot take it back); neither vLLM's
`/sleep` nor a stop asks the gate, so the sequences keep them out of the inits' way. Start is `systemctl start`, stop `systemctl
stop`, sleep SIGUSR1/SIGUSR2 to the engine (vLLM's `POST /sleep?level=1|2`: tests/vllmunit.py), wake `systemctl
reload`: each unit's ExecReload= signals its engine's wake (vLLM's `POST /wake_up`), after `vllm-xpu-gate wake`
when gated, as docs/gate.md's drop-in advises. Gated, the units run the packaged gate service and their
ExecStartPre= client (tests/bootrace.py's `gated`). The outcomes are the engines' own events (--events): an init
that failed, a wake that failed with out-of-memory.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from bootrace import GATE_SOCKET, RACE_UNITS, gate_command, gated, idle_gpu, packaged_drop_in, packaged_gate
from polling import wait_for
from realsystemd import RealSystemd, journal_field, path_inside
from vllmunit import read_events, unit_file

TIME_SCALE = 0.05  # real seconds per replayed second: chat's init takes ~2.3 s
OPERATION_TIMEOUT = 60.0
SPREAD_SECONDS = 1.5  # the operations of a sequence go within this of one another
GATE_TIMEOUT = "60s"
SLEEP_SIGNALS = {1: "SIGUSR1", 2: "SIGUSR2"}
STOPPED, SERVING, ASLEEP = "stopped", "serving", "asleep"
# What gives memory back: ungated by anyone (docs/gate.md, "Sleep and wake"), so a sequence does these first.
GIVE_BACK = ("sleep 1", "sleep 2", "stop")


@dataclass
class SequencesOutcome:
    seed: int
    gate: str  # "ungated", "gated", or "starts gated" (wakes not)
    sequences: list[list[tuple[str, str]]] = field(default_factory=list)  # each one's (unit, operation)
    failures_by_sequence: list[list[str]] = field(default_factory=list)  # each one's failed events, "unit: event"
    events: Sequence[Mapping[str, object]] = ()

    @property
    def failed_inits(self) -> int:
        return sum(event["event"] == "failed" for event in self.events)

    @property
    def failed_wakes(self) -> int:
        return sum(event["event"] == "wake_failed" for event in self.events)

    def summary(self) -> str:
        failing = [f"#{index}: {ops} -> {failures}" for index, (ops, failures)
                   in enumerate(zip(self.sequences, self.failures_by_sequence)) if failures]
        return (f"seed {self.seed}, {self.gate}: {len(self.sequences)} sequences, "
                f"{self.failed_inits} failed inits, {self.failed_wakes} failed wakes; " + "; ".join(failing[:5]))


def unit_files(shared: Path, gated_units: bool, gated_wakes: bool) -> dict[str, str]:
    """RACE_UNITS' unit files (0.34 engines with sleep mode, no restart: a failure stays one) whose ExecReload=
    wakes the engine, after the gate's client when `gated_wakes`; their starts gated when `gated_units`."""
    reload = ([f"ExecReload={gate_command(timeout=GATE_TIMEOUT).replace(' wait ', ' wake ')}"] if gated_wakes
              else []) + ["ExecReload=/bin/kill -HUP $MAINPID"]
    return {f"/etc/systemd/system/{name}": unit_file(
        replace(engine, version="0.34.0"), device_config=path_inside(shared, shared / "ze.conf"),
        exec_start_pre=gated(engine) if gated_units else (), restart="no", time_scale=TIME_SCALE,
        events=path_inside(shared, shared / "events.jsonl"), requests=0, extra_service=reload)
        for name, engine in RACE_UNITS.items()}


def plan(rng: random.Random, states: Mapping[str, str]) -> list[tuple[str, str]]:
    """One sequence: an operation per unit fitting its state, in a random order."""
    operations = []
    for unit in RACE_UNITS:
        state = states[unit]
        if state == STOPPED:
            operations.append((unit, "start"))
        elif state == SERVING:
            operations.append((unit, rng.choice(["sleep 1", "sleep 2", "sleep 1", "stop"])))
        else:
            operations.append((unit, rng.choice(["wake", "wake", "wake", "stop"])))
    rng.shuffle(operations)
    return operations


class _Sequencer:
    def __init__(self, machine: RealSystemd, events: Path) -> None:
        self.machine = machine
        self.events = events

    def _events_after(self, unit: str, index: int) -> list[str]:
        return [str(event["event"]) for event in read_events(self.events)[index:] if event["unit"] == unit]

    def _until_event(self, unit: str, index: int, wanted: set[str]) -> str:
        found: list[str] = []

        def seen() -> bool:
            found[:] = [event for event in self._events_after(unit, index) if event in wanted]
            return bool(found)
        if not wait_for(seen, timeout=OPERATION_TIMEOUT, interval=0.05):
            raise RuntimeError(f"{unit}: none of {sorted(wanted)} within {OPERATION_TIMEOUT} s")
        return found[0]

    def operate(self, unit: str, operation: str, index: int) -> str:
        """Perform the operation and wait for its outcome: the unit's state after it."""
        if operation == "start":
            self.machine.systemctl("start", "--no-block", unit)
            return SERVING if self._until_event(unit, index, {"serving", "failed"}) == "serving" else STOPPED
        if operation == "stop":
            self.machine.systemctl("stop", unit, timeout=OPERATION_TIMEOUT)
            return STOPPED
        if operation.startswith("sleep"):
            self.machine.systemctl("kill", "--kill-who=main", "-s", SLEEP_SIGNALS[int(operation.split()[1])], unit)
            self._until_event(unit, index, {"slept"})
            return ASLEEP
        self.machine.systemctl("reload", "--no-block", unit)
        return SERVING if self._until_event(unit, index, {"woke", "wake_failed"}) == "woke" else STOPPED


def last_lines(machine: RealSystemd, count: int = 8) -> dict[str, list[str]]:
    """Each unit's last lines in the journal (the gate's and the engine's), for a failure's message."""
    machine.sync_journal()
    return {unit: [str(journal_field(entry, "MESSAGE"))[:200] for entry in machine.journal(unit)[-count:]]
            for unit in RACE_UNITS}


def run_sequences(shared: Path, *, seed: int, count: int, gate_driver: Path | None = None,
                  gate_wakes: bool = True) -> SequencesOutcome:
    """`count` sequences on one boot; gated when `gate_driver` (the fake driver, a copy in `shared`) is given: the
    starts, and the wakes unless not `gate_wakes` (the gate as it was before it knew wakes)."""
    shared = Path(shared)
    _, events = idle_gpu(shared)
    gated_units = gate_driver is not None
    files = unit_files(shared, gated_units, gated_units and gate_wakes)
    enable: list[str] = []
    if gated_units:
        files.update({**packaged_drop_in(), **packaged_gate(shared, gate_driver)})
        enable.append(GATE_SOCKET)
    rng = random.Random(seed)
    outcome = SequencesOutcome(seed, "ungated" if not gated_units else "gated" if gate_wakes else "starts gated")
    states = dict.fromkeys(RACE_UNITS, STOPPED)
    with RealSystemd(shared, files=files, enable=enable) as machine:
        sequencer = _Sequencer(machine, events)
        for _ in range(count):
            operations = plan(rng, states)
            offsets = [rng.uniform(0, SPREAD_SECONDS) for _ in operations]
            index = len(read_events(events))
            results: dict[str, str | BaseException] = {}

            def perform(unit: str, operation: str, offset: float) -> None:
                time.sleep(offset)
                try:
                    results[unit] = sequencer.operate(unit, operation, index)
                except BaseException as error:  # reported below, with the seed
                    results[unit] = error
            for gives_back in (True, False):  # the sleeps and stops first, then the starts and wakes
                threads = [threading.Thread(target=perform, args=(*op, offset))
                           for op, offset in zip(operations, offsets) if gives_back == (op[1] in GIVE_BACK)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
            errors = {unit: result for unit, result in results.items() if isinstance(result, BaseException)}
            if errors:
                raise RuntimeError(f"seed {seed}, sequence {len(outcome.sequences)} {operations}: {errors}; the "
                                   f"units' last lines: {last_lines(machine)}")
            states.update(results)
            outcome.sequences.append(operations)
            outcome.failures_by_sequence.append(
                [f"{event['unit']}: {event['event']}" for event in read_events(events)[index:]
                 if event["event"] in ("failed", "wake_failed")])
    outcome.events = read_events(events)
    return outcome


__all__ = ["SequencesOutcome", "TIME_SCALE", "plan", "run_sequences", "unit_files"]
