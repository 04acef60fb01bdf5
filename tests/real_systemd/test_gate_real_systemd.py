"""The init gate (`vllm-xpu-gate`, docs/gate.md) on a real systemd 252 booted as PID 1 of private
namespaces (tests/realsystemd.py): the packaged gate service and socket (packaging/vllm-xpu-gate.service
and .socket, adapted only for the namespace's journal and the fake Level Zero driver: tests/bootrace.py
packaged_gate) and the issue's three replayed vLLM units (chat 0.75, embedding 0.07, stt 0.07 of one
16 GiB fake GPU, Restart=on-failure; tests/bootrace.py), each gated the packaged drop-in's way:
`ExecStartPre=<bin>/vllm-xpu-gate wait ...`, no "+", as the unit's own user, and the packaged [Unit] lines
(Wants= the socket and the service, After= the socket).
Without the gate the same boot fails and overlaps inits (test_real_systemd.py's race test;
benchmarks/boot_race.py compares both over 20 boots).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest

import journalfacts
from bootrace import (GATE_SERVICE, GATE_SOCKET, IDLE_RESERVED, PLANNED, RACE_UNITS, BootOutcome, gate_command,
                      gated, hidden_trees_drop_in, packaged_drop_in, packaged_gate, race_boot)
from fakeze import SharedDevice
from polling import wait_for
from realsystemd import RealSystemd, journal_field, path_inside
from scrapes import series
from test_planner_applied_real_systemd import planners_drop_in
from test_real_systemd import require_root, run_exporter, scrape_until_equal
from vllm_xpu_exporter.sources.plan_dropins import DROP_IN_NAME
from vllmunit import CHAT, EMBEDDING, SIXTEEN_GIB_GPU, STT, read_events, serving_units, unit_file

GATED_BOOTS = 2
RESTART_TIMEOUT = 20.0
STEP_TIMEOUT = 30.0
DECISION = re.compile(r"^vllm-xpu-gate: (?P<kind>released|timed out) after (?P<seconds>[\d.]+)s "
                      r"\((?:waited|waiting) for (?P<waited>[^;]+); free (?P<free>\d+|unknown), "
                      r"needed (?P<needed>\d+|unknown)\)")
UNGATED = re.compile(r"^vllm-xpu-gate: started ungated after (?P<seconds>[\d.]+)s \(")
SERVICE_TIMEOUT_S = 3.0  # the clients' --service-timeout where the service is stopped


class GateDecision(NamedTuple):
    """One gate decision line of a unit's start, as the journal stored it."""

    invocation: str
    at_usec: int  # the journal's realtime of the line
    released: bool  # False: timed out
    seconds: float
    waited: tuple[str, ...]  # () for "nothing"
    free: int | None  # None: unknown
    needed: int | None
    uid: int | None = None  # the writing process's (journald's _UID)


def decisions(entries, unit: str) -> list[GateDecision]:
    """Each of the unit's gate decision lines, in journal order."""
    found = []
    for entry in sorted(entries, key=lambda e: int(e["__REALTIME_TIMESTAMP"])):
        if journal_field(entry, "_SYSTEMD_UNIT") != unit:
            continue
        match = DECISION.match(journal_field(entry, "MESSAGE") or "")
        if match:
            waited = tuple(match["waited"].split(","))
            uid = journal_field(entry, "_UID")
            found.append(GateDecision(journal_field(entry, "_SYSTEMD_INVOCATION_ID"),
                                      int(entry["__REALTIME_TIMESTAMP"]), match["kind"] == "released",
                                      float(match["seconds"]), () if waited == ("nothing",) else waited,
                                      _bytes(match["free"]), _bytes(match["needed"]),
                                      None if uid is None else int(uid)))
    return found


def _bytes(figure: str) -> int | None:
    return None if figure == "unknown" else int(figure)


@pytest.fixture
def shared(tmp_path: Path, fake_driver: Path) -> Path:
    require_root()
    shutil.copy(fake_driver, tmp_path / fake_driver.name)
    return tmp_path


def gated_boot(shared: Path, fake_driver: Path, while_up=None, service_flags=()) -> BootOutcome:
    return race_boot(shared, exec_start_pre=gated, while_up=while_up, files=packaged_drop_in(),
                     gate=packaged_gate(shared, shared / fake_driver.name, service_flags))


def gate_files(shared: Path, fake_driver: Path) -> dict[str, str]:
    return packaged_gate(shared, shared / fake_driver.name)


def test_three_gated_units_started_together_at_boot_neither_fail_nor_overlap(shared: Path, fake_driver: Path):
    """Each boot: every unit serves after one start, no init failed, no two inits overlapped (the
    journal read directly), the service released them one after another (at least two waited), each
    having checked memory with the unit's R (--gpu-memory-utilization: a fresh journal has no earlier
    start) against the GPU's real idle usage; no command of the units runs with "+"; and the exporter on
    that journal counts the same starts, failures and overlaps, and one gate wait per start whose
    decision line says it waited."""
    assert not any("=+" in text for text in [*packaged_drop_in().values(), *(gated(CHAT))])
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
    """Once all three serve, `systemctl restart` of chat: the service finds no init running and no live
    lease (the last holder's init completed), so it releases chat within a second; chat serves again
    without a failure."""
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
    # at most the moment the service's journal follower takes to read the last init's end
    assert restarted[-1].released and restarted[-1].seconds < 1.0, f"the restart's gate: {restarted[-1]}"
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
    """Chat is released and holds the lease through a long init; embedding's client waits for it. Chat's
    main process is SIGKILLed mid-init: its exit in the journal ends the lease, so embedding is released
    within seconds of the exit, far below the service's --lease-timeout and the client's --timeout, and
    embedding's init completes. Chat has Restart=no, so the
    released start is embedding's and not chat's restart."""
    chat, embedding = "vllm-xpu-chat.service", "vllm-xpu-embedding.service"
    config, events = shared / "ze.conf", shared / "events.jsonl"
    SharedDevice.create(config, SIXTEEN_GIB_GPU, reserved=IDLE_RESERVED)
    gate = [gate_command()]
    common = dict(device_config=path_inside(shared, config), events=path_inside(shared, events), requests=0,
                  exec_start_pre=gate)
    long_chat = dataclasses.replace(CHAT, init_seconds=400.0)  # 40 s on the replay's clock: killed long before
    files = {f"/etc/systemd/system/{chat}": unit_file(long_chat, restart="no", **common),
             f"/etc/systemd/system/{embedding}": unit_file(EMBEDDING, **common), **gate_files(shared, fake_driver)}
    with RealSystemd(shared, files=files, enable=[GATE_SOCKET]) as machine:
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
        exec_start_pre=gated(EMBEDDING)), **gate_files(shared, fake_driver)}
    with RealSystemd(shared, files=files, enable=[GATE_SOCKET]) as machine:
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


def test_level_zero_unreadable_three_units_started_together_still_init_one_after_another(shared: Path,
                                                                                          fake_driver: Path):
    """The service cannot load Level Zero (--levelzero.library names no loader): memory goes unchecked,
    and the three units booting together are still released one init at a time: no overlap, no failure,
    each decision line saying memory was unchecked."""
    outcome = gated_boot(shared, fake_driver, service_flags=["--levelzero.library=/nonexistent/libze_loader.so.1",
                                                             "--levelzero.timeout=1s"])
    assert outcome.settled, outcome.counts
    assert outcome.failures == 0 and outcome.overlaps == 0, outcome.counts
    per_unit = {unit: decisions(outcome.entries, unit) for unit in RACE_UNITS}
    assert all(len(found) == 1 and found[0].released for found in per_unit.values()), per_unit
    assert sum(bool(found[0].waited) for found in per_unit.values()) >= 2, f"released together: {per_unit}"
    lines = [journal_field(entry, "MESSAGE") or "" for entry in outcome.entries]
    assert sum(DECISION.match(line) is not None and line.endswith("; memory unchecked") for line in lines) == 3


def test_the_service_stopped_units_still_start_within_the_bound_with_one_line_each(shared: Path, fake_driver: Path):
    """Socket and service stopped (and removed): each gated unit's client finds no socket, writes one line
    (`started ungated ...`) after its --service-timeout, and the unit starts and serves."""
    config, events = shared / "ze.conf", shared / "events.jsonl"
    SharedDevice.create(config, SIXTEEN_GIB_GPU, reserved=IDLE_RESERVED)
    gate = [gate_command(extra=["--service-timeout", f"{SERVICE_TIMEOUT_S:g}s"])]
    files = {f"/etc/systemd/system/{unit}": unit_file(engine, device_config=path_inside(shared, config),
                                                      events=path_inside(shared, events), requests=0,
                                                      exec_start_pre=gate)
             for unit, engine in RACE_UNITS.items()}
    with RealSystemd(shared, files={**files, **packaged_drop_in(), **gate_files(shared, fake_driver)},
                     enable=[GATE_SOCKET]) as machine:
        # and removed, or the drop-in's Wants= would start them again
        machine.systemctl("stop", GATE_SOCKET, GATE_SERVICE)
        machine.run("rm", f"/etc/systemd/system/{GATE_SOCKET}", f"/etc/systemd/system/{GATE_SERVICE}")
        machine.daemon_reload()
        machine.start(*RACE_UNITS)
        assert wait_for(lambda: serving_units(events) == set(RACE_UNITS), timeout=60, interval=0.2), \
            read_events(events)
        machine.sync_journal()
        entries = machine.journal(*RACE_UNITS)
    starts = journalfacts.starts(entries)
    assert {start.unit for start in starts} == set(RACE_UNITS)
    for start in starts:  # ungated, they race as without a gate: a lost race's retry is a start of its own
        gate = [journal_field(entry, "MESSAGE") or "" for entry in entries
                if journal_field(entry, "_SYSTEMD_UNIT") == start.unit
                and journal_field(entry, "_SYSTEMD_INVOCATION_ID") == start.invocation
                and (journal_field(entry, "MESSAGE") or "").startswith("vllm-xpu-gate: ")]
        assert len(gate) == 1, f"{start.unit}: {gate}"
        match = UNGATED.match(gate[0])
        assert match and SERVICE_TIMEOUT_S <= float(match["seconds"]) < SERVICE_TIMEOUT_S + 5, gate


# The engines share a transient user (same User= with DynamicUser=yes: one uid), so that all three can
# take the fake GPU's memory (its ledger is replaced by rename, mode 0600, by whichever engine writes).
REPLAY_USER = ["DynamicUser=yes", "User=vllm-replay", "ReadWritePaths=/realsystemd"]
HARDENED = [*REPLAY_USER, "ProtectSystem=strict", "PrivateTmp=yes", "PrivateNetwork=yes",
            "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX"]


def test_a_hardened_dynamic_user_unit_is_gated_like_any_other(shared: Path, fake_driver: Path):
    """No unit runs as root. Embedding runs with DynamicUser=yes, ProtectSystem=strict, PrivateTmp=yes,
    PrivateNetwork=yes and RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX: its client (its line's _UID
    is the unit's, not root's) reaches the socket, waits for chat's init and is released after it. Stt,
    denied AF_UNIX, says so in one line and starts."""
    chat, embedding, stt = "vllm-xpu-chat.service", "vllm-xpu-embedding.service", "vllm-xpu-stt.service"
    config, events = shared / "ze.conf", shared / "events.jsonl"
    SharedDevice.create(config, SIXTEEN_GIB_GPU, reserved=IDLE_RESERVED)
    events.touch()
    shared.chmod(0o777)  # the transient user writes the engines' events and takes the fake GPU's memory
    for path in shared.iterdir():
        path.chmod(0o777 if path.is_dir() else 0o666)
    common = dict(device_config=path_inside(shared, config), events=path_inside(shared, events), requests=0)
    long_chat = dataclasses.replace(CHAT, init_seconds=60.0)  # 6 s on the replay's clock
    hidden = hidden_trees_drop_in()  # this Python, where DynamicUser='s users cannot reach it (/root)
    files = {f"/etc/systemd/system/{chat}": unit_file(long_chat, exec_start_pre=gated(CHAT), extra_service=REPLAY_USER,
                                                      **common),
             f"/etc/systemd/system/{embedding}": unit_file(EMBEDDING, exec_start_pre=gated(EMBEDDING),
                                                           extra_service=HARDENED, **common),
             f"/etc/systemd/system/{stt}": unit_file(STT, exec_start_pre=gated(STT), extra_service=[
                 *HARDENED[:-1], "RestrictAddressFamilies=AF_INET AF_INET6"], **common),
             **packaged_drop_in(), **gate_files(shared, fake_driver),
             **({f"/etc/systemd/system/{unit}.d/realsystemd.conf": hidden for unit in RACE_UNITS} if hidden else {})}
    with RealSystemd(shared, files=files, enable=[GATE_SOCKET]) as machine:
        start_chat_then_embedding_waiting_for_it(machine, events)
        assert wait_for(lambda: serving_units(events) == {chat, embedding}, timeout=60, interval=0.2), \
            read_events(events)
        machine.start(stt)  # once the others serve: ungated, it would race their inits
        assert wait_for(lambda: serving_units(events) == set(RACE_UNITS), timeout=60, interval=0.2), \
            read_events(events)
        machine.sync_journal()
        entries = machine.journal(chat, embedding, stt)
    (chat_start,) = [start for start in journalfacts.starts(entries) if start.unit == chat]
    (released,) = decisions(entries, embedding)
    assert released.released and chat in released.waited, released
    assert released.at_usec >= chat_start.init_ended_usec, "embedding was released during chat's init"
    assert released.uid not in (None, 0), f"embedding's client ran as uid {released.uid}"
    assert all(found.uid not in (None, 0) for found in decisions(entries, chat)), decisions(entries, chat)
    denied = [journal_field(entry, "MESSAGE") for entry in entries if journal_field(entry, "_SYSTEMD_UNIT") == stt
              and (journal_field(entry, "MESSAGE") or "").startswith("vllm-xpu-gate: ")]
    assert len(denied) == 1 and UNGATED.match(denied[0]) and "may not open a Unix socket" in denied[0], denied



def test_by_the_plan_budgeted_units_init_together_at_boot_and_a_restart_does_not_wait_for_chats_init(
        shared: Path, fake_driver: Path):
    """The three units run with absolute KV budgets, root's plan drop-in naming each (as vllm-xpu-plan writes
    it), each gated with its budget (the client's --kv-cache-memory-bytes), and boot together: the service admits them beside each other (the free
    memory covers every footprint), so their inits overlap, none fails and every KV cache is its budget.
    Then chat is killed while serving and stt restarted at the same moment: stt is admitted beside chat's
    new init, not after it."""
    config, events = shared / "ze.conf", shared / "events.jsonl"
    SharedDevice.create(config, SIXTEEN_GIB_GPU, reserved=IDLE_RESERVED)
    chat, stt = "vllm-xpu-chat.service", "vllm-xpu-stt.service"
    files = {f"/etc/systemd/system/{unit}": unit_file(
        engine, device_config=path_inside(shared, config), events=path_inside(shared, events), requests=0,
        exec_start_pre=gated(engine, ["--kv-cache-memory-bytes", str(engine.kv_cache_memory_bytes)]))
        for unit, engine in PLANNED.items()}
    files.update({f"/etc/systemd/system/{unit}.d/{DROP_IN_NAME}": planners_drop_in(
        unit, files[f"/etc/systemd/system/{unit}"], engine, engine.kv_cache_memory_bytes)
        for unit, engine in PLANNED.items()})
    seen: dict[str, object] = {}
    with RealSystemd(shared, files={**files, **packaged_drop_in(), **gate_files(shared, fake_driver)},
                     enable=[*PLANNED, GATE_SOCKET]) as machine:
        assert wait_for(lambda: serving_units(events) == set(PLANNED), timeout=60, interval=0.1), read_events(events)
        machine.sync_journal()
        seen["boot"] = machine.journal(*PLANNED)
        machine.systemctl("kill", "--kill-whom=main", "--signal=KILL", chat)  # Restart=on-failure starts it again
        machine.systemctl("restart", "--no-block", stt)
        assert wait_for(lambda: sum(record["event"] == "serving" for record in read_events(events)) >= 5,
                        timeout=60, interval=0.1), read_events(events)
        machine.sync_journal()
        seen["after"] = machine.journal(*PLANNED)
    boot = journalfacts.counts(seen["boot"], PLANNED)
    assert all(counts.starts == 1 and not counts.failures for counts in boot.values()), boot
    assert sum(counts.overlaps for counts in boot.values()) >= 2, f"the budgeted inits did not run together: {boot}"
    served = [record for record in read_events(events) if record["event"] == "serving"]
    assert all(record["kv_bytes"] == PLANNED[record["unit"]].kv_cache_memory_bytes for record in served), served
    per_unit = {unit: decisions(seen["boot"], unit) for unit in PLANNED}
    assert all(len(found) == 1 and found[0].released and not any(name in PLANNED for name in found[0].waited)
               for found in per_unit.values()), per_unit
    starts = [start for start in journalfacts.starts(seen["after"]) if start.unit in (chat, stt)]
    chat_restart = [start for start in starts if start.unit == chat][-1]
    stt_restart = [start for start in starts if start.unit == stt][-1]
    assert chat_restart.outcome == "ok" and stt_restart.outcome == "ok", starts
    (stt_decision,) = [found for found in decisions(seen["after"], stt) if found.invocation == stt_restart.invocation]
    assert chat not in stt_decision.waited, stt_decision
    assert stt_restart.init_began_usec is not None and chat_restart.init_ended_usec is not None
    assert stt_restart.init_began_usec < chat_restart.init_ended_usec, "stt's init waited for chat's"
