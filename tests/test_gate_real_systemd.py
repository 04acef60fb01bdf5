"""The init gate (`vllm-xpu-gate`, docs/gate.md) on a real systemd 252 booted as PID 1 of private
namespaces (tests/realsystemd.py): the issue's three replayed vLLM units (chat 0.75, embedding 0.07,
stt 0.07 of one 16 GiB fake GPU, Restart=on-failure; tests/bootrace.py), each gated the packaged
drop-in's way, `ExecStartPre=+/bin/busybox env -i ... vllm-xpu-gate --unit %n ...`, run inside the
namespace (its journal, its /run/vllm-xpu-gate), with the fake Level Zero driver (its variables on the
gate's command line, after `env -i`) seeing the GPU the engines take memory from.
Without the gate the same boot fails and overlaps inits (test_real_systemd.py's race test;
benchmarks/boot_race.py compares both over 20 boots).
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest

import journalfacts
from bootrace import (IDLE_RESERVED, RACE_UNITS, BootOutcome, gate_command, gate_environment, gated, gated_with,
                      race_boot)
from fakeze import SharedDevice
from polling import wait_for
from realsystemd import RealSystemd, journal_field, path_inside
from scrapes import series
from test_real_systemd import require_root, run_exporter, scrape_until_equal
from vllmunit import CHAT, EMBEDDING, SIXTEEN_GIB_GPU, read_events, serving_units, unit_file

GATED_BOOTS = 2
RESTART_TIMEOUT = 20.0
STEP_TIMEOUT = 30.0
DECISION = re.compile(r"^vllm-xpu-gate: (?P<kind>released|timed out) after (?P<seconds>[\d.]+)s "
                      r"\((?:waited|waiting) for (?P<waited>[^;]+); free (?P<free>\d+|unknown), "
                      r"needed (?P<needed>\d+|unknown)\)")


class GateDecision(NamedTuple):
    """One gate decision line of a unit's start, as the journal stored it."""

    invocation: str
    at_usec: int  # the journal's realtime of the line
    released: bool  # False: timed out
    seconds: float
    waited: tuple[str, ...]  # () for "nothing"
    free: int | None  # None: unknown
    needed: int | None


def decisions(entries, unit: str) -> list[GateDecision]:
    """Each of the unit's gate decision lines, in journal order."""
    found = []
    for entry in sorted(entries, key=lambda e: int(e["__REALTIME_TIMESTAMP"])):
        if journal_field(entry, "_SYSTEMD_UNIT") != unit:
            continue
        match = DECISION.match(journal_field(entry, "MESSAGE") or "")
        if match:
            waited = tuple(match["waited"].split(","))
            found.append(GateDecision(journal_field(entry, "_SYSTEMD_INVOCATION_ID"),
                                      int(entry["__REALTIME_TIMESTAMP"]), match["kind"] == "released",
                                      float(match["seconds"]), () if waited == ("nothing",) else waited,
                                      _bytes(match["free"]), _bytes(match["needed"])))
    return found


def _bytes(figure: str) -> int | None:
    return None if figure == "unknown" else int(figure)


@pytest.fixture
def shared(tmp_path: Path, fake_driver: Path) -> Path:
    require_root()
    shutil.copy(fake_driver, tmp_path / fake_driver.name)
    return tmp_path


def gated_boot(shared: Path, fake_driver: Path, while_up=None) -> BootOutcome:
    return race_boot(shared, exec_start_pre=gated_with(gate_environment(shared, shared / fake_driver.name)),
                     while_up=while_up)


def test_three_gated_units_started_together_at_boot_neither_fail_nor_overlap(shared: Path, fake_driver: Path):
    """Each boot: every unit serves after one start, no init failed, no two inits overlapped (the
    journal read directly), the gates released one after another (at least two waited), each having
    checked memory with the unit's R (--gpu-memory-utilization: a fresh journal has no earlier start)
    against the GPU's real idle usage, and the exporter on that journal counts the same starts,
    failures and overlaps, and one gate wait per start whose decision line says it waited."""
    units = list(RACE_UNITS)
    seen: dict[str, object] = {}

    def check_exporter(machine: RealSystemd) -> None:
        machine.sync_journal()
        entries = machine.journal(*units)
        expected = journalfacts.counts(entries, units)
        waits = {unit: sum(bool(found.waited) for found in decisions(entries, unit)) for unit in units}

        def gate_waits(samples) -> dict[str, int]:
            return {unit: int(series(samples, "xpu_unit_gate_waits_total").get((("unit", unit),), 0))
                    for unit in units}

        with run_exporter(machine, fake_driver, shared / "ze.conf", "vllm-xpu-*.service") as exporter:
            seen["counts"] = scrape_until_equal(exporter, expected)
            wait_for(lambda: gate_waits(exporter.scrape()) == waits, timeout=5, interval=0.25)
            samples = exporter.scrape()
        seen.update(expected=expected, waits=waits, gate_waits=gate_waits(samples),
                    waited_seconds=series(samples, "xpu_unit_gate_wait_seconds_total"))

    for boot in range(GATED_BOOTS):
        outcome = gated_boot(shared, fake_driver, while_up=check_exporter)
        assert outcome.settled, f"boot {boot}: not every unit came up: {outcome.counts}"
        assert outcome.failures == 0 and outcome.overlaps == 0, f"boot {boot}: {outcome.counts}"
        assert all(counts.starts == 1 for counts in outcome.counts.values()), outcome.counts
        per_unit = {unit: decisions(outcome.entries, unit) for unit in units}
        assert all(len(found) == 1 for found in per_unit.values()), f"one gate decision per start: {per_unit}"
        assert sum(bool(found[0].waited) for found in per_unit.values()) >= 2, \
            f"the gates released together: {per_unit}"
        for unit, (found,) in per_unit.items():
            needed = math.ceil(RACE_UNITS[unit].gpu_memory_utilization * SIXTEEN_GIB_GPU.memory[0].size)
            assert found.needed == needed and needed <= found.free < SIXTEEN_GIB_GPU.memory[0].size, \
                f"{unit}: memory not checked with its R: {found}"
        assert seen["counts"] == seen["expected"], f"boot {boot}: exporter {seen['counts']} != journal"
        assert seen["gate_waits"] == seen["waits"], f"boot {boot}: gate waits {seen['gate_waits']}"
        for unit, count in seen["waits"].items():
            if count:
                assert seen["waited_seconds"].get((("unit", unit),), 0) > 0, f"{unit}: no time waited"


def test_a_chat_restart_while_the_others_serve_is_not_delayed(shared: Path, fake_driver: Path):
    """Once all three serve, `systemctl restart` of chat: its gate finds no init running and no live
    lease (the last holder's init completed), so it releases at once; chat serves again without a
    failure."""
    chat = "vllm-xpu-chat.service"
    seen: dict[str, object] = {}

    def restart_chat(machine: RealSystemd) -> None:
        events = shared / "events.jsonl"
        machine.systemctl("restart", "--no-block", chat)
        assert wait_for(lambda: sum(record["unit"] == chat and record["event"] == "serving"
                                    for record in read_events(events)) >= 2,
                        timeout=RESTART_TIMEOUT, interval=0.1), "chat did not serve again after its restart"
        machine.sync_journal()
        seen["entries"] = machine.journal(*RACE_UNITS)

    outcome = gated_boot(shared, fake_driver, while_up=restart_chat)
    assert outcome.settled and outcome.failures == 0, outcome.counts
    restarted = decisions(seen["entries"], chat)
    assert len(restarted) == 2, f"one gate decision per start of chat: {restarted}"
    assert restarted[-1].waited == () and restarted[-1].seconds < 1.0, f"the restart's gate: {restarted[-1]}"
    counts = journalfacts.counts(seen["entries"], list(RACE_UNITS))
    assert counts[chat].starts == 2 and not counts[chat].failures, counts
    assert sum(unit.overlaps for unit in counts.values()) == 0, counts


def gate_lines(machine: RealSystemd, unit: str) -> list[str]:
    messages = (journal_field(entry, "MESSAGE") or "" for entry in machine.journal(unit))
    return [message for message in messages if message.startswith("vllm-xpu-gate: ")]


def start_chat_then_embedding_waiting_for_it(machine: RealSystemd, events: Path,
                                            chat: str = "vllm-xpu-chat.service",
                                            embedding: str = "vllm-xpu-embedding.service") -> None:
    """Start chat, wait until its engine started, then start embedding and wait until its gate waits for chat."""
    machine.start(chat)
    assert wait_for(lambda: any(record["unit"] == chat and record["event"] == "started"
                                for record in read_events(events)), timeout=STEP_TIMEOUT, interval=0.2), \
        f"timed out after {STEP_TIMEOUT} s waiting for chat's engine to start"
    machine.start(embedding)
    assert wait_for(lambda: any(line.startswith(f"vllm-xpu-gate: waiting for {chat}")
                                for line in gate_lines(machine, embedding)), timeout=STEP_TIMEOUT, interval=0.2), \
        f"timed out after {STEP_TIMEOUT} s waiting for embedding's gate to wait for chat"


def test_a_unit_whose_lease_holder_was_killed_mid_init_starts_after_the_lease_ends(shared: Path, fake_driver: Path):
    """Chat's gate releases and chat holds the lease through a long init; embedding's gate waits for it.
    Chat's main process is SIGKILLed mid-init: its exit in the journal (and systemd's failed state) ends
    the lease, so embedding's gate releases within seconds of the exit, far below the gate's
    --lease-timeout and --timeout, and embedding's init completes. Chat has Restart=no, so the
    released start is embedding's and not chat's restart."""
    chat, embedding = "vllm-xpu-chat.service", "vllm-xpu-embedding.service"
    config, events = shared / "ze.conf", shared / "events.jsonl"
    SharedDevice.create(config, SIXTEEN_GIB_GPU, reserved=IDLE_RESERVED)
    gate = [gate_command(environment=gate_environment(shared, shared / fake_driver.name),
                         extra=["--lease-timeout", "5m"])]
    common = dict(device_config=path_inside(shared, config), events=path_inside(shared, events), requests=0,
                  exec_start_pre=gate)
    long_chat = dataclasses.replace(CHAT, init_seconds=400.0)  # 40 s on the replay's clock: killed long before
    files = {f"/etc/systemd/system/{chat}": unit_file(long_chat, restart="no", **common),
             f"/etc/systemd/system/{embedding}": unit_file(EMBEDDING, **common)}
    with RealSystemd(shared, files=files) as machine:
        start_chat_then_embedding_waiting_for_it(machine, events)
        machine.systemctl("kill", "--kill-whom=main", "--signal=KILL", chat)
        assert wait_for(lambda: embedding in serving_units(events), timeout=STEP_TIMEOUT, interval=0.2), \
            f"timed out after {STEP_TIMEOUT} s waiting for embedding to serve"
        machine.sync_journal()
        entries = machine.journal(chat, embedding)

    (chat_start,) = [start for start in journalfacts.starts(entries) if start.unit == chat]
    assert chat_start.outcome == "failed" and chat_start.exited_usec is not None, chat_start
    assert chat_start.init_ended_usec is None, f"chat was not killed mid-init: {chat_start}"
    (chat_gate,) = decisions(entries, chat)
    assert chat_gate.released and chat_gate.at_usec < chat_start.began_usec
    (embedding_gate,) = decisions(entries, embedding)
    assert embedding_gate.released and chat in embedding_gate.waited, embedding_gate
    assert embedding_gate.at_usec > chat_start.exited_usec, "embedding's gate released before chat's kill"
    assert embedding_gate.at_usec - chat_start.exited_usec < 5_000_000, \
        f"embedding released {(embedding_gate.at_usec - chat_start.exited_usec) / 1e6:.1f} s after chat's exit"
    counts = journalfacts.counts(entries, [chat, embedding])
    assert counts[embedding].starts == 1 and not counts[embedding].failures, counts
    assert counts[chat].failures == {"other": 1} and counts[embedding].overlaps == 0, counts


def test_a_gated_start_waits_for_memory_another_process_holds(shared: Path, fake_driver: Path):
    """Embedding's gate with --gpu-memory-utilization 0.07 needs ceil(0.07 x 16 GiB) free. A process of
    no watched unit (the test, through the fake GPU) holds all but half of that: the gate waits for
    `memory` alone (no init runs) and the engine does not start, where ungated it would fail vLLM's
    free-memory check. Once the memory is given back the gate releases, its decision line says it
    waited for memory and shows free >= needed, and embedding's init completes."""
    embedding = "vllm-xpu-embedding.service"
    config, events = shared / "ze.conf", shared / "events.jsonl"
    device = SharedDevice.create(config, SIXTEEN_GIB_GPU, reserved=IDLE_RESERVED)
    needed = math.ceil(EMBEDDING.gpu_memory_utilization * device.total)
    device.hold("other-process", device.free() - needed // 2)
    files = {f"/etc/systemd/system/{embedding}": unit_file(
        EMBEDDING, device_config=path_inside(shared, config), events=path_inside(shared, events), requests=0,
        exec_start_pre=gated(EMBEDDING, gate_environment(shared, shared / fake_driver.name)))}
    with RealSystemd(shared, files=files) as machine:
        machine.start(embedding)
        assert wait_for(lambda: any(line.startswith("vllm-xpu-gate: waiting for memory ")
                                    for line in gate_lines(machine, embedding)), timeout=STEP_TIMEOUT, interval=0.2), \
            f"timed out after {STEP_TIMEOUT} s waiting for embedding's gate to wait for memory"
        assert not read_events(events), "the engine started while its gate waited for memory"
        device.release("other-process")
        assert wait_for(lambda: embedding in serving_units(events), timeout=STEP_TIMEOUT, interval=0.2), \
            f"timed out after {STEP_TIMEOUT} s waiting for embedding to serve"
        machine.sync_journal()
        entries = machine.journal(embedding)

    (decision,) = decisions(entries, embedding)
    assert decision.released and decision.waited == ("memory",), decision
    assert decision.needed == needed and decision.free >= needed, decision
    (start,) = journalfacts.starts(entries)
    assert decision.at_usec < start.began_usec and start.outcome == "ok", start
