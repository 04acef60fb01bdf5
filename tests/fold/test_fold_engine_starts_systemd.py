"""The engine fold on journal files shaped the way systemd 252 writes them (as measured on Debian 12's
systemd booted as PID 1 of private namespaces), read by the journal reader:

- `Type=simple`: PID 1 logs only "Started"; `Type=exec`: the process's first lines can be stored
  before "Starting", then "Started";
- with an `ExecStartPre=` command (the init gate): "Starting" is logged before the command runs, the
  command prints under its own `_PID`, the main process under another, then "Started";
- every record of one start carries the same invocation id (`_SYSTEMD_INVOCATION_ID` on output,
  `INVOCATION_ID` on PID 1's records); a restart gets a new one.

A start's init begins when its main process starts; a unit waiting in its gate is not initialising.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from vllm_xpu_exporter.fold import engine_starts
from vllm_xpu_exporter.fold.engine_starts import EngineTracker, UnitView
from vllm_xpu_exporter.fold.start import Outcome
from vllm_xpu_exporter.parsers import gate as gate_lines
from vllm_xpu_exporter.sources.journal import JournalReader
from vllm_xpu_exporter.sources.journal import JournalSelection
from vllm_xpu_exporter.sources.logs.entry import LogEntry
from journalgen import (Clock, JournalEntrySpec, Moment, current_boot_id, new_invocation_id, unit_failed,
                        unit_output, unit_process_exited, unit_restart_scheduled, unit_started, unit_starting,
                        unit_stopped, write_journal)
from sizes import GiB

CHAT = "vllm-xpu-chat.service"
EMBEDDING = "vllm-xpu-embedding.service"
STT = "vllm-xpu-stt.service"
API = "(APIServer pid={pid}) INFO 12-02 10:00:00 [api_server.py:1873] "
CORE = "(EngineCore pid={pid}) INFO 12-02 10:00:20 [gpu_worker.py:456] "
CAUSE = ("ValueError: To serve at least one request with the model's max seq len (131072), (3.36 GiB KV cache is "
         "needed, which is larger than the available KV cache memory (2.13 GiB). Based on the available memory, "
         "the estimated maximum model length is 46528. Try increasing `gpu_memory_utilization` or decreasing "
         "`max_model_len` when initializing the engine.")
SHAPES = [("simple", False), ("exec", False), ("simple", True), ("exec", True)]
SHAPE_IDS = ["simple", "exec", "simple+ExecStartPre", "exec+ExecStartPre"]


@dataclass
class Recorded:
    """One start as written: its entries and the instants the tests look up."""

    entries: list[JournalEntrySpec]
    invocation_id: str
    first_usec: int  # the start's first entry
    main_began_usec: int  # when the main process started: "Started", or its first line if stored earlier
    kv_usec: int
    ended_usec: int | None  # init done or failure; None: still initialising


def main_lines(unit: str, pid: int, utilisation: float, *, fail: bool) -> list[tuple[str, str]]:
    """(role, message) of a vLLM 0.24 engine start: identity, settings, KV cache, then done or failed."""
    api, core = API.format(pid=pid), CORE.format(pid=pid + 1)
    lines = [("version", api + "vLLM API server version 0.24.0"),
             ("args", api + f"non-default args: {{'model': 'Qwen/Qwen3-8B', 'max_model_len': 131072, "
                            f"'gpu_memory_utilization': {utilisation}}}")]
    if fail:
        return lines + [("kv", f"(EngineCore pid={pid + 1}) ERROR 12-02 10:00:30 [core.py:708] {CAUSE}"),
                        ("end", f"(APIServer pid={pid}) RuntimeError: Engine core initialization failed. See root "
                                f"cause above. Failed core proc(s): {{}}")]
    return lines + [("kv", core + "Available KV cache memory: 3.25 GiB"),
                    ("end", core + "init engine (profile, create kv cache, warmup model) took 42.50 seconds")]


def one_start(unit: str, clock: Clock, service_type: str, pre: bool, *, pid: int, utilisation: float = 0.75,
              fail: bool = False, gate_lines: tuple[str, ...] = ("vllm-xpu-gate: released after 0.10s (waited for "
                                                                 "nothing; free 16000000000, needed 12000000000)",),
              gate_wait_usec: int = 1000, init_usec: int = 1000, finished: bool = True,
              invocation_ids: bool = True) -> Recorded:
    """The entries of one start of `unit` in the order systemd 252 stores them for its Type= and
    ExecStartPre=; the gate (pid - 100) prints `gate_lines`, the main process is `pid`.
    `invocation_ids=False`: a journal without them (the fields left out)."""
    invocation = new_invocation_id() if invocation_ids else ""
    entries: list[JournalEntrySpec] = []
    instants: dict[str, int] = {}

    def add(build: Callable[[Moment], JournalEntrySpec], name: str = "", step: int | None = None) -> None:
        at = clock.tick(step)
        instants.setdefault(name, at.realtime_usec)
        entries.append(build(at))

    def line(message: str) -> Callable[[Moment], JournalEntrySpec]:
        return lambda at: unit_output(unit, message, at, pid=pid, invocation_id=invocation)

    lines = main_lines(unit, pid, utilisation, fail=fail)
    if not finished:
        lines = lines[:-1]
    if pre:
        add(lambda at: unit_starting(unit, at, invocation_id=invocation), "first")
        for index, text in enumerate(gate_lines):
            add(lambda at, text=text: unit_output(unit, text, at, pid=pid - 100, comm="vllm-xpu-gate",
                                                  invocation_id=invocation),
                step=gate_wait_usec if index == len(gate_lines) - 1 else None)
    if service_type == "exec":
        # the main process's first lines are stored before PID 1's "Starting" (and "Started")
        add(line(lines[0][1]), "main")
        if not pre:
            add(lambda at: unit_starting(unit, at, invocation_id=invocation))
        add(lambda at: unit_started(unit, at, invocation_id=invocation))
    else:
        add(lambda at: unit_started(unit, at, invocation_id=invocation), "main")
        add(line(lines[0][1]))
    for role, message in lines[1:]:
        add(line(message), role, step=init_usec if role == "end" else None)
    if fail:
        add(lambda at: unit_process_exited(unit, at, invocation_id=invocation))
        add(lambda at: unit_failed(unit, at, invocation_id=invocation))
    instants.setdefault("first", instants["main"])
    return Recorded(entries, invocation, instants["first"], instants["main"], instants["kv"], instants.get("end"))


def restart(unit: str, clock: Clock, failed: Recorded, counter: int = 1) -> list[JournalEntrySpec]:
    """Restart=on-failure: the scheduled restart and "Stopped" of the failed invocation."""
    return [unit_restart_scheduled(unit, clock.tick(100_000), counter=counter, invocation_id=failed.invocation_id),
            unit_stopped(unit, clock.tick(), invocation_id=failed.invocation_id)]


def read_journal(tmp_path: Path, entries: list[JournalEntrySpec]) -> list[LogEntry]:
    write_journal(tmp_path / "system.journal", entries)
    with JournalReader(JournalSelection(directory=str(tmp_path), unit_globs=["vllm*.service"])) as reader:
        read: list[LogEntry] = []
        while batch := reader.read_available(1000):
            read.extend(batch)
    return read


def fold(tmp_path: Path, entries: list[JournalEntrySpec]) -> dict[str, UnitView]:
    tracker = EngineTracker()
    tracker.extend(read_journal(tmp_path, entries))
    tracker.settle(round(time.time() * 1e6))
    return {view.unit: view for view in tracker.views()}


@pytest.fixture
def clock() -> Clock:
    return Clock(current_boot_id(), realtime_usec=round(time.time() * 1e6) - 3_600_000_000)


@pytest.mark.parametrize(("service_type", "pre"), SHAPES, ids=SHAPE_IDS)
def test_each_shape_is_one_successful_start_whose_init_began_when_its_main_process_started(
        tmp_path: Path, clock: Clock, service_type: str, pre: bool) -> None:
    recorded = one_start(CHAT, clock, service_type, pre, pid=4000)
    view = fold(tmp_path, recorded.entries)[CHAT]
    assert (view.starts, sum(view.failures.values()), view.overlaps) == (1, 0, 0)
    assert view.current is not None
    assert (view.current.began_usec, view.current.main_began_usec, view.current.invocation_id) == (
        recorded.first_usec, recorded.main_began_usec, recorded.invocation_id)
    assert view.current.pid == 4000  # the main process, never the ExecStartPre= command
    assert view.initialising_since_usec is None  # the init completed
    assert view.invocation_ended(recorded.invocation_id) is True


@pytest.mark.parametrize(("service_type", "pre"), SHAPES, ids=SHAPE_IDS)
def test_each_shape_failing_then_restarted_counts_one_failure_and_one_start(
        tmp_path: Path, clock: Clock, service_type: str, pre: bool) -> None:
    failed = one_start(CHAT, clock, service_type, pre, pid=4000, fail=True)
    restarted = one_start(CHAT, clock, service_type, pre, pid=5000)
    view = fold(tmp_path, [*failed.entries, *restart(CHAT, clock, failed), *restarted.entries])[CHAT]
    assert view.starts == 1
    assert {reason.value: count for reason, count in view.failures.items() if count} == {"kv_cache_too_small": 1}
    assert view.current.invocation_id == restarted.invocation_id
    assert view.current.main_began_usec == restarted.main_began_usec


def test_without_invocation_ids_a_type_simple_restart_is_told_apart_by_pid1_records(
        tmp_path: Path, clock: Clock) -> None:
    failed = one_start(CHAT, clock, "simple", False, pid=4000, fail=True, invocation_ids=False)
    restarted = one_start(CHAT, clock, "simple", False, pid=5000, invocation_ids=False)
    view = fold(tmp_path, [*failed.entries, *restart(CHAT, clock, failed), *restarted.entries])[CHAT]
    assert view.starts == 1
    assert {reason.value: count for reason, count in view.failures.items() if count} == {"kv_cache_too_small": 1}
    assert view.current.main_began_usec == restarted.main_began_usec


@pytest.mark.parametrize(("service_type", "pre"), SHAPES, ids=SHAPE_IDS)
def test_a_unit_is_initialising_from_its_main_process_start_until_init_completes_not_only_until_its_kv_line(
        tmp_path: Path, clock: Clock, service_type: str, pre: bool) -> None:
    running = one_start(CHAT, clock, service_type, pre, pid=4000, finished=False)
    view = fold(tmp_path, running.entries)[CHAT]
    assert view.initialising_since_usec == running.main_began_usec
    assert view.invocation_ended(running.invocation_id) is False
    assert view.current.outcome is None and not view.current.initialising  # the overlap window ended at the KV line


@pytest.mark.parametrize("service_type", ["simple", "exec"])
def test_a_unit_waiting_in_its_gate_is_not_initialising_and_does_not_overlap_a_running_init(
        tmp_path: Path, clock: Clock, service_type: str) -> None:
    waiting = unit_starting(EMBEDDING, clock.tick(), invocation_id=(invocation := new_invocation_id()))
    gate_line = unit_output(EMBEDDING, "vllm-xpu-gate: waiting for vllm-xpu-chat.service", clock.tick(), pid=3900,
                            invocation_id=invocation)
    chat = one_start(CHAT, clock, service_type, False, pid=4000)
    views = fold(tmp_path, [waiting, gate_line, *chat.entries])
    assert views[EMBEDDING].current is not None and views[EMBEDDING].current.outcome is None
    assert views[EMBEDDING].initialising_since_usec is None
    assert (views[CHAT].overlaps, views[EMBEDDING].overlaps) == (0, 0)


def interleave(*starts: list[JournalEntrySpec]) -> list[JournalEntrySpec]:
    return sorted((entry for entries in starts for entry in entries), key=lambda entry: entry.realtime_usec)


@pytest.mark.parametrize("service_type", ["simple", "exec"])
def test_three_gated_units_started_together_and_released_one_after_another_do_not_overlap(
        tmp_path: Path, clock: Clock, service_type: str) -> None:
    """All three print "Starting" at the same instant and wait in their gates; each is released when the
    previous one's init completed. Before the fold began inits at "Starting", this counted 3 overlaps."""
    starts = []
    for index, unit in enumerate((CHAT, EMBEDDING, STT)):
        unit_clock = Clock(clock.boot_id, clock.realtime_usec + index, clock.monotonic_usec + index, step_usec=1000)
        released_after = 10_000 * index + 1000  # each released after the previous init's end
        starts.append(one_start(unit, unit_clock, service_type, True, pid=4000 + 1000 * index,
                                gate_wait_usec=released_after, init_usec=3000).entries)
    views = fold(tmp_path, interleave(*starts))
    assert {unit: view.overlaps for unit, view in views.items()} == {CHAT: 0, EMBEDDING: 0, STT: 0}
    assert {unit: view.starts for unit, view in views.items()} == {CHAT: 1, EMBEDDING: 1, STT: 1}


def test_three_units_whose_inits_run_together_each_overlap_once(tmp_path: Path, clock: Clock) -> None:
    starts = []
    for index, unit in enumerate((CHAT, EMBEDDING, STT)):
        unit_clock = Clock(clock.boot_id, clock.realtime_usec + index, clock.monotonic_usec + index, step_usec=1000)
        starts.append(one_start(unit, unit_clock, "simple", True, pid=4000 + 1000 * index, init_usec=50_000).entries)
    views = fold(tmp_path, interleave(*starts))
    assert {unit: view.overlaps for unit, view in views.items()} == {CHAT: 1, EMBEDDING: 1, STT: 1}


def test_gate_decisions_count_waits_seconds_and_timeouts_per_unit_and_other_gate_lines_nothing(
        tmp_path: Path, clock: Clock) -> None:
    held = gate_lines.format_released(12.5, [EMBEDDING, gate_lines.MEMORY], 8 * GiB, 12 * GiB)
    not_held = gate_lines.format_released(0.25, [], 16 * GiB, 12 * GiB)
    timed_out = gate_lines.format_timed_out(600.0, [EMBEDDING], None, None, starting=True)
    first = one_start(CHAT, clock, "simple", True, pid=4000, gate_lines=("vllm-xpu-gate: waiting for "
                                                                        f"{EMBEDDING} (initialising)", held))
    second = one_start(CHAT, clock, "simple", True, pid=5000, gate_lines=(not_held,))
    third = one_start(CHAT, clock, "exec", True, pid=6000, gate_lines=(timed_out,))
    view = fold(tmp_path, [*first.entries, *second.entries, *third.entries])[CHAT]
    assert (view.gate_waits, view.gate_wait_seconds, view.gate_timeouts) == (2, 612.75, 1)
    assert view.starts == 3 and sum(view.failures.values()) == 0


def test_lines_of_an_older_invocation_never_land_in_the_current_start(tmp_path: Path, clock: Clock) -> None:
    failed = one_start(CHAT, clock, "simple", False, pid=4000, fail=True)
    restarted = one_start(CHAT, clock, "simple", False, pid=5000, finished=False)
    stray = unit_output(CHAT, CORE.format(pid=4001) + "init engine (profile, create kv cache, warmup model) took "
                        "1.00 seconds", clock.tick(), pid=4000, invocation_id=failed.invocation_id)
    view = fold(tmp_path, [*failed.entries, *restart(CHAT, clock, failed), *restarted.entries, stray])[CHAT]
    assert view.starts == 0 and view.current.outcome is None
    assert view.initialising_since_usec == restarted.main_began_usec


def test_a_gate_killed_while_waiting_ends_the_start_as_an_other_failure_and_never_initialised(
        tmp_path: Path, clock: Clock) -> None:
    invocation = new_invocation_id()
    entries = [unit_starting(CHAT, clock.tick(), invocation_id=invocation),
               unit_output(CHAT, "vllm-xpu-gate: waiting", clock.tick(), pid=3900, invocation_id=invocation),
               unit_process_exited(CHAT, clock.tick(), kind="Control process", code="killed", status=15,
                                   invocation_id=invocation),
               unit_failed(CHAT, clock.tick(), result="signal", invocation_id=invocation)]
    view = fold(tmp_path, entries)[CHAT]
    assert view.current.outcome is Outcome.FAILED and view.invocation_ended(invocation) is True
    assert view.current.main_began_usec is None
    assert {reason.value: count for reason, count in view.failures.items() if count} == {"other": 1}


# --- units that run no vLLM engine (issue 19) ---------------------------------------------------------------

PROXY = "vllm-proxy.service"
EXPORTER = "vllm-xpu-exporter.service"
EXPORTER_LISTENING = ('ts=2026-12-02T10:00:00.000Z level=info source=main msg="vllm-xpu-exporter 0.9.0 listening on '
                      'http://[::]:10447/metrics (collectors: journal,levelzero,processes)"')
GRACE_USEC = engine_starts.ENGINE_GRACE_USEC


def fold_until(tmp_path: Path, entries: list[JournalEntrySpec], *now_usecs: int) -> list[dict[str, UnitView]]:
    """The views a scrape sees at each of `now_usecs` (ascending), the entries up to then read."""
    read = read_journal(tmp_path, entries)
    tracker = EngineTracker()
    views = []
    folded = 0
    for now in now_usecs:
        while folded < len(read) and read[folded].realtime_usec <= now:
            tracker.add(read[folded])
            folded += 1
        tracker.settle(now)
        views.append({view.unit: view for view in tracker.views()})
    return views


def clock_at(clock: Clock, realtime_usec: int) -> Clock:
    """A clock of the same boot at `realtime_usec` (its monotonic time to match)."""
    return Clock(clock.boot_id, realtime_usec, realtime_usec - (clock.realtime_usec - clock.monotonic_usec))


def non_engine_start(unit: str, clock: Clock, lines: tuple[str, ...], *, pid: int, exit_after_usec: int | None = None,
                     status: int = 1) -> Recorded:
    """A Type=simple start of a unit that prints `lines` (no vLLM line); its main process exits with
    `status` `exit_after_usec` after "Started" (None: it keeps running)."""
    invocation = new_invocation_id()
    started = clock.tick()
    entries = [unit_started(unit, started, invocation_id=invocation)]
    entries += [unit_output(unit, line, clock.tick(), pid=pid, invocation_id=invocation) for line in lines]
    if exit_after_usec is not None:
        clock.realtime_usec, clock.monotonic_usec = started.realtime_usec, started.monotonic_usec
        entries += [unit_process_exited(unit, clock.tick(exit_after_usec), code="killed", status=status,
                                        invocation_id=invocation),
                    unit_failed(unit, clock.tick(), result="signal", invocation_id=invocation)]
    return Recorded(entries, invocation, started.realtime_usec, started.realtime_usec, 0, None)


def test_a_proxy_beside_two_vllm_units_overlaps_nothing_fails_nothing_and_holds_the_gate_only_for_the_grace(
        tmp_path: Path, clock: Clock) -> None:
    proxy = non_engine_start(PROXY, clock, ("proxy: listening on :8000",), pid=3000,
                             exit_after_usec=GRACE_USEC + 30_000_000, status=11)
    chat_clock = clock_at(clock, proxy.main_began_usec + 1_000_000)
    embedding_clock = clock_at(clock, proxy.main_began_usec + 1_000_500)
    chat = one_start(CHAT, chat_clock, "simple", False, pid=4000, init_usec=20_000_000)
    embedding = one_start(EMBEDDING, embedding_clock, "simple", False, pid=5000, init_usec=20_000_000)
    entries = interleave(proxy.entries, chat.entries, embedding.entries)
    within, after = fold_until(tmp_path, entries, proxy.main_began_usec + GRACE_USEC,
                               proxy.main_began_usec + GRACE_USEC + 1)
    assert within[PROXY].initialising_since_usec == proxy.main_began_usec  # a possible init holds the gate
    assert after[PROXY].initialising_since_usec is None
    views = fold(tmp_path, entries)
    assert {unit: view.overlaps for unit, view in views.items()} == {PROXY: 0, CHAT: 1, EMBEDDING: 1}
    assert {unit: sum(view.failures.values()) for unit, view in views.items()} == {PROXY: 0, CHAT: 0, EMBEDDING: 0}
    assert views[PROXY].latest is None and views[PROXY].current.engine is False


def test_the_exporters_start_up_line_ends_its_window_at_once_and_its_crash_counts_no_failure(
        tmp_path: Path, clock: Clock) -> None:
    exporter = non_engine_start(EXPORTER, clock, (EXPORTER_LISTENING,), pid=3000, exit_after_usec=5_000_000)
    chat = one_start(CHAT, clock_at(clock, exporter.main_began_usec + 2_000_000), "simple", False, pid=4000)
    entries = interleave(exporter.entries, chat.entries)
    listening_usec = exporter.main_began_usec + 1000
    (at_once,) = fold_until(tmp_path, entries, listening_usec)
    assert at_once[EXPORTER].initialising_since_usec is None
    views = fold(tmp_path, entries)
    assert (views[EXPORTER].overlaps, views[CHAT].overlaps) == (0, 0)
    assert sum(views[EXPORTER].failures.values()) == 0 and views[EXPORTER].current.outcome is Outcome.FAILED


def test_a_first_vllm_line_within_the_grace_makes_a_possible_init_an_engine_start_overlapping_from_its_main_start(
        tmp_path: Path, clock: Clock) -> None:
    """The unit downloads its model for 10 s, printing no vLLM line; chat's whole init runs meanwhile."""
    slow = non_engine_start(STT, clock, ("downloading Qwen/Qwen3-8B ...",), pid=3000)
    chat = one_start(CHAT, clock_at(clock, slow.main_began_usec + 1_000_000), "simple", False, pid=4000,
                     init_usec=3_000_000)
    first_vllm_line = unit_output(STT, API.format(pid=3000) + "vLLM API server version 0.24.0",
                                  clock_at(clock, slow.main_began_usec + 10_000_000).tick(0), pid=3000,
                                  invocation_id=slow.invocation_id)
    entries = interleave(slow.entries, chat.entries, [first_vllm_line])
    before, after = fold_until(tmp_path, entries, first_vllm_line.realtime_usec - 1, first_vllm_line.realtime_usec)
    assert (before[STT].overlaps, before[CHAT].overlaps) == (0, 0)  # a possible init overlaps nothing
    assert (after[STT].overlaps, after[CHAT].overlaps) == (1, 1)
    assert after[STT].initialising_since_usec == slow.main_began_usec
    assert after[STT].current.engine is True


def test_a_first_vllm_line_after_the_grace_begins_the_init_at_that_line(tmp_path: Path, clock: Clock) -> None:
    slow = non_engine_start(STT, clock, ("downloading Qwen/Qwen3-8B ...",), pid=3000)
    late = slow.main_began_usec + GRACE_USEC + 10_000_000
    first_vllm_line = unit_output(STT, API.format(pid=3000) + "vLLM API server version 0.24.0",
                                  clock_at(clock, late).tick(0), pid=3000, invocation_id=slow.invocation_id)
    (view,) = fold_until(tmp_path, [*slow.entries, first_vllm_line], late)
    assert view[STT].initialising_since_usec == late and view[STT].current.engine is True


def test_a_known_engine_units_start_that_dies_unprinted_after_the_grace_still_counts_other(
        tmp_path: Path, clock: Clock) -> None:
    """Today's behaviour for units with history: an engine unit's start is an engine start from "Started"."""
    served = one_start(CHAT, clock, "simple", False, pid=4000)
    hung = non_engine_start(CHAT, clock, (), pid=5000, exit_after_usec=GRACE_USEC + 60_000_000, status=9)
    views = fold_until(tmp_path, [*served.entries, *hung.entries], hung.main_began_usec + GRACE_USEC + 1,
                       round(time.time() * 1e6))
    assert views[0][CHAT].initialising_since_usec == hung.main_began_usec
    assert {reason.value: count for reason, count in views[1][CHAT].failures.items() if count} == {"other": 1}


# --- place in the tree --------------------------------------------------------------------------------


def test_the_fold_imports_no_source_and_no_collector() -> None:
    """The fold sits between the vLLM grammar and the collectors: the journal reader feeds it and the
    collectors read it, but it needs neither (systemd's MESSAGE_IDs come from vllm_xpu_exporter.systemd). Asked of a
    fresh interpreter, a subprocess: hence here, not among tests/fold/test_fold_engine_starts.py's pure ones."""
    code = ("import json, sys, vllm_xpu_exporter.fold.engine_starts; "
            "print(json.dumps(sorted(name for name in sys.modules if name.startswith('vllm_xpu_exporter'))))")
    imported = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                         check=True).stdout)
    assert "vllm_xpu_exporter.fold.engine_starts" in imported
    assert not [name for name in imported if name.startswith(("vllm_xpu_exporter.sources", "vllm_xpu_exporter.collectors"))], imported
