"""vllm-xpu-gate as real processes: the real Level Zero loader over the fake driver (tests/fakeze.py), real
journal files (tests/journalgen.py) written and appended to while gates wait, a lease directory of its own,
and a PATH with a fake systemctl or none. A few checks of the pure parts (flags, the decision, leases)
run in process."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from vllm_xpu_exporter.fold.engine_starts import EngineTracker
from vllm_xpu_exporter.gate import lines as gate_lines
from vllm_xpu_exporter.gate.cli import MAX_DURATION_S, devices_of_units, parse_options
from vllm_xpu_exporter.gate.decision import decide
from vllm_xpu_exporter.gate.leases import Lease, LeaseDirectory, UnreadableLease, lease_ended
from vllm_xpu_exporter.gate.lines import GateDecision
from vllm_xpu_exporter.systemd import parse_timespan
from exporterproc import RunningExporter
from polling import wait_for
from scrapes import sample
from fakeprocfs import FakeProcfs, xe_fdinfo
from fakeze import A770, B580, GiB, FakeConfig, FakeMemoryModule, fake_driver_env, write_config
from journalgen import (Clock, JournalEntrySpec, append_journal, current_boot_id, new_invocation_id, unit_failed,
                        unit_output, unit_process_exited, unit_started, unit_starting, write_journal)
from vllmlogs import TrackerEntry

REPO = Path(__file__).resolve().parents[1]
CHAT = "vllm-xpu-chat.service"
EMBEDDING = "vllm-xpu-embedding.service"
STT = "vllm-xpu-stt.service"
DEVICE = A770.pci_address
TOTAL = 16 * GiB
API = "(APIServer pid={pid}) INFO 12-02 10:00:00 [api_server.py:1873] "
CORE = "(EngineCore pid={pid}) INFO 12-02 10:00:20 [gpu_worker.py:456] "
CAUSE = ("ValueError: To serve at least one request with the model's max seq len (131072), (3.36 GiB KV cache is "
         "needed, which is larger than the available KV cache memory (2.13 GiB).")


def needed(ratio: float) -> int:
    return math.ceil(ratio * TOTAL)


# --- journal entries of a unit's start -------------------------------------------------------------

def main_started(unit: str, clock: Clock, invocation: str, pid: int, ratio: float = 0.07) -> list[JournalEntrySpec]:
    """PID 1's "Started" and the engine's first lines: the unit is initialising."""
    api = API.format(pid=pid)
    return [unit_started(unit, clock.tick(), invocation_id=invocation),
            unit_output(unit, api + "vLLM API server version 0.24.0", clock.tick(), pid=pid, invocation_id=invocation),
            unit_output(unit, api + f"non-default args: {{'model': 'm', 'gpu_memory_utilization': {ratio}}}",
                        clock.tick(), pid=pid, invocation_id=invocation)]


def init_completed(unit: str, clock: Clock, invocation: str, pid: int) -> list[JournalEntrySpec]:
    core = CORE.format(pid=pid + 1)
    return [unit_output(unit, core + "Available KV cache memory: 1.25 GiB", clock.tick(), pid=pid,
                        invocation_id=invocation),
            unit_output(unit, core + "init engine (profile, create kv cache, warmup model) took 20.50 seconds",
                        clock.tick(), pid=pid, invocation_id=invocation)]


def init_failed(unit: str, clock: Clock, invocation: str, pid: int) -> list[JournalEntrySpec]:
    return [unit_output(unit, f"(EngineCore pid={pid + 1}) ERROR 12-02 10:00:30 [core.py:708] {CAUSE}", clock.tick(),
                        pid=pid, invocation_id=invocation),
            unit_process_exited(unit, clock.tick(), invocation_id=invocation),
            unit_failed(unit, clock.tick(), invocation_id=invocation)]


def killed(unit: str, clock: Clock, invocation: str) -> list[JournalEntrySpec]:
    return [unit_process_exited(unit, clock.tick(), code="killed", status=9, invocation_id=invocation),
            unit_failed(unit, clock.tick(), result="signal", invocation_id=invocation)]


# --- gates as processes ------------------------------------------------------------------------------

@dataclass
class GateRun:
    unit: str
    invocation_id: str
    process: subprocess.Popen[bytes]
    began: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)
    ended: float | None = None

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for raw in self.process.stderr:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))
        self.process.wait()
        self.ended = time.monotonic()

    def wait(self, timeout: float = 30) -> int:
        code = self.process.wait(timeout)
        self._reader.join(5)
        return code

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    @property
    def decision(self) -> GateDecision | None:
        decisions = [parsed for line in self.lines if (parsed := gate_lines.parse_line(line)) is not None]
        assert len(decisions) <= 1, self.lines
        return decisions[0] if decisions else None

    def saw(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def stop(self) -> None:
        if self.running:
            self.process.kill()
        self.wait()


@dataclass
class Host:
    """One GPU (the fake driver), the journal file, the lease directory, and a PATH for the gates."""

    tmp: Path
    driver: Path
    clock: Clock
    runs: list[GateRun] = field(default_factory=list)

    @property
    def journal(self) -> Path:
        return self.tmp / "system.journal"

    @property
    def leases(self) -> Path:
        return self.tmp / "run" / "vllm-xpu-gate"

    @property
    def bin(self) -> Path:
        path = self.tmp / "bin"
        path.mkdir(exist_ok=True)
        return path

    def gpu(self, free_gib: float = 13.0, *devices: object, size: int = TOTAL) -> None:
        device = dataclasses.replace(A770, memory=(FakeMemoryModule(size=size, free=round(free_gib * GiB)),))
        write_config(self.tmp / "fake_ze.conf", FakeConfig(devices=(device, *devices)))

    def write(self, entries: Sequence[JournalEntrySpec]) -> None:
        if self.journal.exists():
            append_journal(self.journal, entries)
        else:
            write_journal(self.journal, entries)

    def systemctl(self, **properties: str) -> None:
        """A fake systemctl whose `show` prints these properties."""
        script = self.bin / "systemctl"
        quoted = " ".join(f"'{name}={value}'" for name, value in properties.items())
        script.write_text(f"#!/bin/sh\nprintf '%s\\n' {quoted}\n")
        script.chmod(0o755)

    def start(self, unit: str, *args: str, invocation_id: str | None = None,
              journal: Sequence[str] | None = None, environment: Mapping[str, str] | None = None) -> GateRun:
        """`environment`: more variables (or others) than the fake driver's and the invocation id."""
        invocation = new_invocation_id() if invocation_id is None else invocation_id
        env = {**fake_driver_env(self.driver, self.tmp / "fake_ze.conf"), "PYTHONPATH": str(REPO),
               "PATH": str(self.bin), "INVOCATION_ID": invocation, "LANG": "C.UTF-8", **(environment or {})}
        journal_args = journal if journal is not None else ["--journal.file", str(self.journal)]
        command = [sys.executable, "-m", "vllm_xpu_exporter.gate", "--unit", unit, *journal_args,
                   "--lease-directory", str(self.leases), "--poll-interval", "50ms",
                   "--systemctl", str(self.bin / "systemctl"), *args]
        run = GateRun(unit, invocation, subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                         stderr=subprocess.PIPE, env=env, cwd=self.tmp))
        self.runs.append(run)
        return run

    def run(self, unit: str, *args: str, **kwargs: object) -> tuple[int, GateRun]:
        gate_run = self.start(unit, *args, **kwargs)
        return gate_run.wait(), gate_run


@pytest.fixture
def host(tmp_path: Path, fake_driver: Path):
    host = Host(tmp_path, fake_driver, Clock(current_boot_id(), realtime_usec=time.time_ns() // 1000 - 60_000_000))
    host.gpu()
    yield host
    for run in host.runs:
        run.stop()
    for run in host.runs:
        assert all(line.startswith("vllm-xpu-gate: ") for line in run.lines), run.lines


# --- flags ------------------------------------------------------------------------------------------

@pytest.mark.fast
@pytest.mark.parametrize("argv", [
    [],
    ["--unit", ""],
    ["--unit", "vllm a.service"],
    ["--unit", CHAT, "--device", "card0"],
    ["--unit", CHAT, "--gpu-memory-utilization", "0"],
    ["--unit", CHAT, "--gpu-memory-utilization", "1.5"],
    ["--unit", CHAT, "--gpu-memory-utilization", "nan"],
    ["--unit", CHAT, "--timeout", "10"],
    ["--unit", CHAT, "--timeout", "-1m"],
    ["--unit", CHAT, "--on-timeout", "later"],
    ["--unit", CHAT, "--lease-timeout", "0"],
    ["--unit", CHAT, "--journal.directory", "/a", "--journal.file", "/b"],
    ["--unit", CHAT, "--journal.boot", "yesterday"],
    ["--unit", CHAT, "--no-such-flag"],
], ids=lambda argv: " ".join(argv) or "no flags")
def test_bad_flags_exit_2_with_one_prefixed_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_options(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vllm-xpu-gate: error: "), lines


@pytest.mark.fast
def test_flags_take_go_durations_the_exporters_journal_and_levelzero_flags_and_systemctl() -> None:
    options = parse_options(["--unit", CHAT, "--device", "0000:03:00.0", "--gpu-memory-utilization", "0.75",
                             "--timeout", "1m30s", "--on-timeout", "fail", "--journal.directory", "/j",
                             "--journal.units", "llm-*.service", "--journal.boot", "all",
                             "--levelzero.library", "libze.so", "--levelzero.timeout", "2s",
                             "--systemctl", "/sbin/systemctl"])
    assert (options.unit, options.device, options.gpu_memory_utilization, options.timeout) == (
        CHAT, "0000:03:00.0", 0.75, 90.0)
    assert not options.start_on_timeout
    assert (options.selection.directory, options.selection.boot) == ("/j", "all")
    assert options.selection.unit_globs == ("llm-*.service", CHAT)  # its own unit is always read
    assert (options.levelzero_library, options.levelzero_timeout) == ("libze.so", 2.0)
    assert options.systemctl == "/sbin/systemctl"
    defaults = parse_options(["--unit", CHAT])
    assert (defaults.timeout, defaults.start_on_timeout, defaults.lease_directory, defaults.systemctl) == (
        600.0, True, "/run/vllm-xpu-gate", "/usr/bin/systemctl")
    assert defaults.selection.unit_globs == ("vllm*.service", CHAT)


# --- the decision, in process ------------------------------------------------------------------------

def views_of(entries: Sequence[JournalEntrySpec]):
    """The fold of entries built by journalgen, without a journal file (fields as the reader decodes them)."""
    tracker = EngineTracker()
    for spec in entries:
        from_systemd = spec.field_value("_PID") == 1
        unit = spec.field_value("UNIT" if from_systemd else "_SYSTEMD_UNIT")
        invocation = spec.field_value("INVOCATION_ID" if from_systemd else "_SYSTEMD_INVOCATION_ID")
        tracker.add(TrackerEntry(str(unit), spec.realtime_usec, str(spec.field_value("MESSAGE") or ""), from_systemd,
                          str(spec.field_value("MESSAGE_ID") or ""), int(spec.field_value("_PID")), str(invocation)))
    return list(tracker.views())


@pytest.mark.fast
def test_a_unit_known_on_another_gpu_does_not_hold_the_start_back_and_one_of_unknown_device_does() -> None:
    clock = Clock(current_boot_id())
    views = views_of([*main_started(EMBEDDING, clock, new_invocation_id(), 100),
                      *main_started(STT, clock, new_invocation_id(), 200)])
    other_gpu = {EMBEDDING: {B580.pci_address}}
    decision = decide(CHAT, DEVICE, views, None, other_gpu, None, None)
    assert decision.units == (STT,)  # STT's device is unknown: it counts on every device
    assert decide(CHAT, DEVICE, views, None, {EMBEDDING: {DEVICE}}, None, None).units == (EMBEDDING, STT)
    assert decide(EMBEDDING, DEVICE, views, CHAT, None, None, None).units == (STT, CHAT)  # and the lease holder


@pytest.mark.fast
def test_units_are_on_the_gpus_their_processes_hold_drm_clients_on_or_their_lease_names(tmp_path: Path) -> None:
    procfs = FakeProcfs(tmp_path)
    procfs.add_unit_process(100, f"/system.slice/{EMBEDDING}").add_drm_fd(xe_fdinfo(client_id=1, pdev=DEVICE,
                                                                                  vram0=GiB))
    procfs.add_unit_process(200, f"/system.slice/{STT}").add_drm_fd(xe_fdinfo(client_id=2, pdev=B580.pci_address))
    lease = Lease(B580.pci_address, CHAT, "", 0, 1, 1)
    assert devices_of_units(str(procfs.root), [lease]) == {
        EMBEDDING: {DEVICE}, STT: {B580.pci_address}, CHAT: {B580.pci_address}}


@pytest.mark.fast
def test_a_user_unit_of_a_system_units_name_does_not_move_that_units_gpu(tmp_path: Path) -> None:
    """uid 1000's user unit vllm-xpu-embedding.service on the B580 is its own identity: the system unit of
    that name stays on its GPU alone, for the gate and the planner (devices_of_units)."""
    procfs = FakeProcfs(tmp_path)
    procfs.add_unit_process(100, f"/system.slice/{EMBEDDING}").add_drm_fd(xe_fdinfo(client_id=1, pdev=DEVICE,
                                                                                  vram0=GiB))
    procfs.add_unit_process(300, f"/user.slice/user-1000.slice/user@1000.service/app.slice/{EMBEDDING}").add_drm_fd(
        xe_fdinfo(client_id=3, pdev=B580.pci_address, vram0=GiB))
    assert devices_of_units(str(procfs.root), []) == {EMBEDDING: {DEVICE}, f"{EMBEDDING}@uid1000": {B580.pci_address}}


@pytest.mark.fast
def test_a_lease_ends_when_the_journal_shows_its_invocation_ended_its_unit_is_gone_or_it_times_out() -> None:
    clock = Clock(current_boot_id(), realtime_usec=time.time_ns() // 1000)
    invocation = new_invocation_id()
    now = time.time_ns() // 1000
    lease = Lease(DEVICE, CHAT, invocation, now, now + 60_000_000, 1)
    running = {view.unit: view for view in views_of([unit_starting(CHAT, clock.tick(), invocation_id=invocation),
                                                     *main_started(CHAT, clock, invocation, 100)])}
    assert lease_ended(lease, {}, now, gone=lambda unit, invocation: None) is None  # not in the journal yet
    assert lease_ended(lease, running, now, gone=lambda unit, invocation: None) is None
    assert lease_ended(lease, running, now, gone=lambda unit, invocation: True) == "its unit is not running"
    assert lease_ended(lease, running, now + 60_000_000, gone=lambda unit, invocation: None) == "timed out"
    for ending in (init_completed, init_failed):
        ended = {view.unit: view for view in views_of([
            unit_starting(CHAT, clock.tick(), invocation_id=invocation), *main_started(CHAT, clock, invocation, 100),
            *ending(CHAT, clock, invocation, 100)])}
        assert lease_ended(lease, ended, now, gone=lambda unit, invocation: None) == "its init ended"


# --- releasing and waiting ---------------------------------------------------------------------------

def test_nothing_initialising_and_enough_memory_releases_at_once_and_leases_the_device(host: Host) -> None:
    done = new_invocation_id()
    host.write([*main_started(EMBEDDING, host.clock, done, 100), *init_completed(EMBEDDING, host.clock, done, 100)])
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.75", invocation_id="c" * 32)
    assert code == 0, run.lines
    assert run.decision == GateDecision(False, run.decision.seconds, (), 13 * GiB, needed(0.75)), run.lines
    assert run.lines[-1].startswith("vllm-xpu-gate: released after ")
    lease = Lease.read(host.leases / f"{DEVICE}.lease")
    assert (lease.unit, lease.invocation_id, lease.device) == (CHAT, "c" * 32, DEVICE)
    assert oct(host.leases.stat().st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("ending", [init_completed, init_failed], ids=["completes", "fails"])
def test_waits_while_another_unit_initialises_and_releases_when_its_init_ends(host: Host, ending) -> None:
    other = new_invocation_id()
    host.write([unit_starting(EMBEDDING, host.clock.tick(), invocation_id=other),
                *main_started(EMBEDDING, host.clock, other, 100)])
    run = host.start(CHAT, "--gpu-memory-utilization", "0.75")
    assert wait_for(lambda: run.saw(f"waiting for {EMBEDDING}"), timeout=20), run.lines
    time.sleep(0.5)
    assert run.running, run.lines
    host.write(ending(EMBEDDING, host.clock, other, 100))
    assert run.wait() == 0, run.lines
    assert run.decision.waited_for == (EMBEDDING,) and not run.decision.timed_out
    assert run.decision.seconds >= 0.5


def test_a_unit_waiting_in_its_own_gate_does_not_hold_another_back(host: Host) -> None:
    waiting = new_invocation_id()
    host.write([unit_starting(EMBEDDING, host.clock.tick(), invocation_id=waiting),
                unit_output(EMBEDDING, "vllm-xpu-gate: waiting for vllm-xpu-stt.service (free 1, needed 2)",
                            host.clock.tick(), pid=90, invocation_id=waiting)])
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.5")
    assert code == 0 and run.decision.waited_for == (), run.lines


def test_waits_for_free_memory_with_r_from_the_units_latest_start(host: Host) -> None:
    earlier = new_invocation_id()
    host.write([*main_started(CHAT, host.clock, earlier, 100, ratio=0.75),
                *init_failed(CHAT, host.clock, earlier, 100)])
    host.gpu(free_gib=10.0)
    run = host.start(CHAT)
    assert wait_for(lambda: run.saw("waiting for memory"), timeout=20), run.lines
    assert run.saw(f"needed {needed(0.75)}")
    host.gpu(free_gib=14.0)
    assert run.wait() == 0, run.lines
    assert run.decision.waited_for == (gate_lines.MEMORY,)
    assert (run.decision.free_bytes, run.decision.needed_bytes) == (14 * GiB, needed(0.75))


def test_with_no_r_known_it_waits_only_for_inits_and_says_so(host: Host) -> None:
    host.write([unit_output("other.service", "unrelated", host.clock.tick())])
    host.gpu(free_gib=0.5)
    code, run = host.run(CHAT)
    assert code == 0, run.lines
    assert run.saw(f"no gpu_memory_utilization known for {CHAT}")
    assert (run.decision.waited_for, run.decision.needed_bytes) == ((), None)


# --- never strand a unit -----------------------------------------------------------------------------

def test_journal_that_cannot_be_read_releases_at_once_with_a_warning(host: Host) -> None:
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.75",
                         journal=["--journal.directory", str(host.tmp / "missing")])
    assert code == 0, run.lines
    assert run.saw("warning: cannot read the journal (journal directory") and run.saw("releasing at once")
    assert run.decision.waited_for == () and run.decision.seconds < 10


def test_level_zero_that_cannot_be_read_releases_at_once_with_a_warning(host: Host) -> None:
    host.write([unit_output("other.service", "unrelated", host.clock.tick())])
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.75", "--levelzero.library", "/nonexistent/libze.so")
    assert code == 0, run.lines
    assert run.saw("warning: cannot read Level Zero (") and run.saw("releasing at once")
    assert (run.decision.free_bytes, run.decision.needed_bytes) == (None, None)


def test_untrusted_memory_accounting_releases_at_once_with_a_warning(host: Host) -> None:
    host.write([unit_output("other.service", "unrelated", host.clock.tick())])
    host.gpu(free_gib=16.0)
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.75")
    assert code == 0, run.lines
    assert run.saw("untrusted memory accounting") and run.saw("releasing at once")


def test_several_gpus_need_device_and_a_device_that_is_not_there_is_a_one_line_error(host: Host) -> None:
    host.write([unit_output("other.service", "unrelated", host.clock.tick())])
    host.gpu(13.0, B580)
    code, run = host.run(CHAT)
    assert code == 2 and [line for line in run.lines] == [
        f"vllm-xpu-gate: error: 2 GPUs ({DEVICE}, {B580.pci_address}): --device is required"]
    code, run = host.run(CHAT, "--device", "0000:99:00.0")
    assert code == 2 and len(run.lines) == 1 and "no such GPU" in run.lines[0]
    code, run = host.run(CHAT, "--device", B580.pci_address, "--gpu-memory-utilization", "0.5")
    assert code == 0 and run.decision.free_bytes == 11 * GiB, run.lines


# --- leases ------------------------------------------------------------------------------------------

def test_three_gated_units_started_together_release_one_after_another(host: Host) -> None:
    """All three print "Starting" at once and their gates start together; each release is followed by that
    unit's init (written to the journal a second later), and only its end releases the next gate."""
    units = (CHAT, EMBEDDING, STT)
    invocations = {unit: new_invocation_id() for unit in units}
    host.write([unit_starting(unit, host.clock.tick(), invocation_id=invocations[unit]) for unit in units])
    runs = {unit: host.start(unit, "--gpu-memory-utilization", "0.07", "--timeout", "60s", "--lease-timeout", "60s",
                             invocation_id=invocations[unit]) for unit in units}
    released: list[str] = []
    for round_number in range(3):
        assert wait_for(lambda: len([run for run in runs.values() if not run.running]) > round_number, timeout=30), \
            {unit: run.lines for unit, run in runs.items()}
        done = [unit for unit, run in runs.items() if not run.running and unit not in released]
        assert len(done) == 1, f"released together: {done}"
        unit = done[0]
        assert runs[unit].wait() == 0
        released.append(unit)
        time.sleep(1.0)  # its init runs: nobody else is released meanwhile
        assert sum(not run.running for run in runs.values()) == round_number + 1
        pid = 1000 * (round_number + 1)
        host.write([*main_started(unit, host.clock, invocations[unit], pid),
                    *init_completed(unit, host.clock, invocations[unit], pid)])
    assert sorted(released) == sorted(units)
    assert runs[released[0]].decision.waited_for == ()
    assert released[0] in runs[released[1]].decision.waited_for
    assert released[1] in runs[released[2]].decision.waited_for


def test_a_unit_whose_lease_holder_was_killed_mid_init_starts_when_the_journal_shows_the_kill(host: Host) -> None:
    holder = new_invocation_id()
    host.write([unit_starting(EMBEDDING, host.clock.tick(), invocation_id=holder)])
    code, first = host.run(EMBEDDING, "--gpu-memory-utilization", "0.07", "--lease-timeout", "60s",
                           invocation_id=holder)
    assert code == 0, first.lines
    host.write(main_started(EMBEDDING, host.clock, holder, 100))
    run = host.start(CHAT, "--gpu-memory-utilization", "0.07")
    assert wait_for(lambda: run.saw(f"waiting for {EMBEDDING}"), timeout=20), run.lines
    host.write(killed(EMBEDDING, host.clock, holder))
    assert run.wait() == 0, run.lines
    assert run.decision.waited_for == (EMBEDDING,)


def test_a_lease_whose_holder_never_shows_in_the_journal_holds_until_it_times_out(host: Host) -> None:
    host.write([unit_output("other.service", "unrelated", host.clock.tick())])
    code, first = host.run(EMBEDDING, "--gpu-memory-utilization", "0.07", "--lease-timeout", "2s")
    assert code == 0, first.lines
    lease = Lease.read(host.leases / f"{DEVICE}.lease")
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.07")
    assert code == 0, run.lines
    assert time.time_ns() // 1000 >= lease.expires_usec
    assert run.decision.waited_for == (EMBEDDING,)


def test_a_stale_lease_of_a_gone_unit_or_of_ones_own_unit_blocks_nobody(host: Host) -> None:
    host.write([unit_output("other.service", "unrelated", host.clock.tick())])
    code, first = host.run(EMBEDDING, "--gpu-memory-utilization", "0.07", "--lease-timeout", "60s")
    assert code == 0, first.lines
    code, own = host.run(EMBEDDING, "--gpu-memory-utilization", "0.07")  # its restart: its own lease
    assert code == 0 and own.decision.waited_for == (), own.lines
    host.systemctl(TimeoutStartUSec="infinity", ActiveState="failed", SubState="failed",
                   InvocationID=first.invocation_id)
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.07")  # systemd says the holder is gone
    assert code == 0 and run.decision.waited_for == (), run.lines


@pytest.mark.parametrize(("on_timeout", "exit_code", "outcome"), [
    ("start", 0, "starting anyway"), ("fail", 1, "failing the start")])
def test_a_timeout_starts_the_unit_with_a_warning_or_fails_it(host: Host, on_timeout: str, exit_code: int,
                                                              outcome: str) -> None:
    other = new_invocation_id()
    host.write([*main_started(EMBEDDING, host.clock, other, 100)])
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.75", "--timeout", "1s", "--on-timeout", on_timeout)
    assert code == exit_code, run.lines
    assert run.lines[-1].startswith("vllm-xpu-gate: timed out after ") and run.lines[-1].endswith(outcome)
    assert run.decision.timed_out and run.decision.waited_for == (EMBEDDING,)
    assert 1.0 <= run.decision.seconds < 10


# --- systemd --------------------------------------------------------------------------------------

@pytest.mark.fast
@pytest.mark.parametrize(("text", "seconds"), [
    ("1min 30s", 90.0), ("5min", 300.0), ("1h 2min 3.500000s", 3723.5), ("100ms", 0.1), ("690", 690.0),
    ("infinity", math.inf)])
def test_time_spans_as_systemctl_shows_them_or_unit_files_set_them(text: str, seconds: float) -> None:
    assert parse_timespan(text) == pytest.approx(seconds)


@pytest.mark.fast
@pytest.mark.parametrize("text", ["", "1 fortnight", "90 s x", "-5s"])
def test_other_time_spans_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_timespan(text)


def test_first_line_warns_when_the_timeout_is_not_below_the_units_timeout_start_sec(host: Host) -> None:
    host.write([unit_output("other.service", "unrelated", host.clock.tick())])
    host.systemctl(TimeoutStartUSec="1min 30s", ActiveState="activating", SubState="start-pre", InvocationID="")
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.07", "--timeout", "10m")
    assert code == 0, run.lines
    assert run.lines[0].startswith("vllm-xpu-gate: warning: --timeout 600s is not below "
                                   f"{CHAT}'s TimeoutStartSec= (90s)"), run.lines
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.07", "--timeout", "1m")
    assert code == 0 and not run.saw("TimeoutStartSec"), run.lines


# --- the exporter's metrics of the gate's decisions -----------------------------------------------------

def test_the_exporter_counts_the_gates_decisions_it_reads_in_the_units_journal(host: Host) -> None:
    """The gate's stderr is the unit's journal (written here as journald would, under the gate's pid)."""
    embedding = new_invocation_id()
    host.write([unit_starting(EMBEDDING, host.clock.tick(), invocation_id=embedding),
                *main_started(EMBEDDING, host.clock, embedding, 100)])
    timed_out = host.start(CHAT, "--gpu-memory-utilization", "0.07", "--timeout", "500ms", "--on-timeout", "fail")
    held = host.start(STT, "--gpu-memory-utilization", "0.07", "--timeout", "30s")
    assert timed_out.wait() == 1 and wait_for(lambda: held.saw(f"waiting for {EMBEDDING}"), timeout=20), held.lines
    host.write(init_completed(EMBEDDING, host.clock, embedding, 100))
    assert held.wait() == 0
    for run in (timed_out, held):
        host.write([unit_starting(run.unit, host.clock.tick(), invocation_id=run.invocation_id),
                    *(unit_output(run.unit, line, host.clock.tick(), pid=900, comm="vllm-xpu-gate",
                                  invocation_id=run.invocation_id) for line in run.lines)])
    with RunningExporter(["--no-collector.levelzero", "--no-collector.processes", "--journal.file",
                          str(host.journal)]) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and
                           sample(s, "xpu_unit_gate_waits_total", unit=STT) == 1 and s)
        assert samples, exporter.stderr
    assert {unit: sample(samples, "xpu_unit_gate_waits_total", unit=unit) for unit in (CHAT, STT, EMBEDDING)} == {
        CHAT: 1, STT: 1, EMBEDDING: 0}
    assert {unit: sample(samples, "xpu_unit_gate_timeouts_total", unit=unit) for unit in (CHAT, STT)} == {
        CHAT: 1, STT: 0}
    for run in (timed_out, held):
        assert sample(samples, "xpu_unit_gate_wait_seconds_total", unit=run.unit) == pytest.approx(
            run.decision.seconds)
    assert sample(samples, "xpu_unit_engine_init_overlaps_total", unit=EMBEDDING) == 0


# --- the lease directory is root's alone ---------------------------------------------------------------

LEASE_FIELDS = {"device": DEVICE, "unit": EMBEDDING, "invocation_id": "", "granted_usec": 1, "gate_pid": 1}


@pytest.mark.fast
@pytest.mark.parametrize("argv", [
    ["--timeout", "169h"],
    ["--timeout", "1" + "0" * 400 + "h"],  # infinite seconds
    ["--lease-timeout", "1" + "0" * 400 + "h"],  # round(inf * 1e6) failed every release
    ["--poll-interval", "100000000h"],  # time.sleep() overflowed
    ["--levelzero.timeout", "1e300"],
    ["--lease-directory", ""],
    ["--lease-directory", "run/vllm-xpu-gate"],  # the lock in the unit's working directory
], ids=lambda argv: " ".join(argv)[:40])
def test_durations_that_would_fail_at_run_time_and_a_relative_lease_directory_exit_2_at_parse_time(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_options(["--unit", CHAT, *argv])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vllm-xpu-gate: error: argument {argv[0]}"), lines
    week = parse_options(["--unit", CHAT, "--timeout", "168h", "--lease-timeout", "168h"])
    assert (week.timeout, week.lease_timeout) == (MAX_DURATION_S, MAX_DURATION_S)


@pytest.mark.parametrize("existing_mode", [None, 0o755], ids=["made", "an earlier version's"])
def test_the_lease_directory_is_0700_and_its_lock_and_lease_are_made_0600(tmp_path: Path,
                                                                          existing_mode: int | None) -> None:
    path = tmp_path / "run" / "vllm-xpu-gate"
    if existing_mode is not None:
        path.mkdir(parents=True)
        path.chmod(existing_mode)
    previous_umask = os.umask(0)  # the modes are the gate's, not the umask's
    directory = LeaseDirectory(str(path))
    try:
        directory.prepare()
        with directory.locked(DEVICE, time.monotonic()) as locked:
            assert locked
            directory.grant(Lease(DEVICE, CHAT, "", 0, 1, 1))
    finally:
        os.umask(previous_umask)
        directory.close()
    modes = {name: stat.S_IMODE(os.lstat(path / name).st_mode) for name in (".", f"{DEVICE}.lock", f"{DEVICE}.lease")}
    assert modes == {".": 0o700, f"{DEVICE}.lock": 0o600, f"{DEVICE}.lease": 0o600}
    assert sorted(os.listdir(path)) == [f"{DEVICE}.lease", f"{DEVICE}.lock"]  # no temporary file left


def test_a_lock_held_by_another_process_is_reported_on_one_line(host: Host) -> None:
    host.write([unit_output("other.service", "unrelated", host.clock.tick())])
    host.leases.mkdir(mode=0o700, parents=True)
    lock = host.leases / f"{DEVICE}.lock"
    with open(lock, "w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        code, run = host.run(CHAT, "--gpu-memory-utilization", "0.07", "--timeout", "1s")
    assert code == 0 and run.decision.timed_out, run.lines
    held = [line for line in run.lines if "is held by another process" in line]
    assert len(held) == 1 and held[0].startswith(f"vllm-xpu-gate: warning: the lock {lock} is held by another "
                                                 f"process"), run.lines


def owned_by_nobody(path: Path) -> None:
    """(chown to another user: the suite runs as root, tests/run)"""
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)


def writable_by(mode: int) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.mkdir()
        path.chmod(mode)
    return make


def symlink_to_a_directory(path: Path) -> None:
    target = path.parent / "elsewhere"
    target.mkdir(mode=0o700)
    path.symlink_to(target)


@pytest.mark.parametrize("make", [owned_by_nobody, writable_by(0o777), writable_by(0o770), symlink_to_a_directory],
                         ids=["owned by another user", "mode 0777", "mode 0770", "a symlink to a directory"])
def test_a_lease_directory_that_is_not_the_gates_users_alone_is_refused_on_one_line(
        host: Host, make: Callable[[Path], None]) -> None:
    host.write([unit_output("other.service", "unrelated", host.clock.tick())])
    host.leases.parent.mkdir(parents=True)
    make(host.leases)
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.07")
    assert code == 0 and run.decision is not None and not run.decision.timed_out, run.lines
    refused = [line for line in run.lines if "cannot use the lease directory" in line]
    assert len(refused) == 1 and "deciding without a lock or lease" in refused[0], run.lines
    assert os.listdir(host.leases) == []  # neither lock nor lease written in it


def test_a_symlink_planted_as_the_lock_creates_nothing_where_it_points(host: Host) -> None:
    host.write([unit_output("other.service", "unrelated", host.clock.tick())])
    host.leases.mkdir(mode=0o700, parents=True)
    target = host.tmp / "target"
    (host.leases / f"{DEVICE}.lock").symlink_to(target)
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.07")
    assert code == 0 and not run.decision.timed_out, run.lines
    assert not target.exists()
    assert sum("cannot use the lease directory" in line for line in run.lines) == 1, run.lines


def plant_symlink_elsewhere(lease: Path) -> None:
    lease.symlink_to(lease.parent.parent / "target")


@pytest.mark.parametrize("plant", [plant_symlink_elsewhere, os.mkfifo, lambda lease: lease.symlink_to("/dev/zero")],
                         ids=["symlink elsewhere", "FIFO", "symlink to /dev/zero"])
def test_a_lease_that_is_not_a_regular_file_is_never_followed_waited_on_or_read(host: Host, plant) -> None:
    host.write([unit_output("other.service", "unrelated", host.clock.tick())])
    host.leases.mkdir(mode=0o700, parents=True)
    plant(host.leases / f"{DEVICE}.lease")
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.07", "--timeout", "1s")
    assert code == 0, run.lines
    assert run.decision.timed_out and run.decision.waited_for == (gate_lines.UNREADABLE_LEASE,), run.lines
    assert run.decision.seconds < 10
    assert not (host.tmp / "target").exists()
    assert Lease.read(host.leases / f"{DEVICE}.lease").unit == CHAT  # replaced by its lease: it starts


@pytest.mark.parametrize("content", [
    json.dumps(LEASE_FIELDS)[:-1] + ', "expires_usec": Infinity}',  # int(inf): OverflowError
    json.dumps(LEASE_FIELDS)[:-1] + ', "expires_usec": NaN}',
    "[" * 100_000,  # RecursionError
    "not json",
    json.dumps({"unit": EMBEDDING}),
    json.dumps({**LEASE_FIELDS, "expires_usec": 1.5}),
    json.dumps({**LEASE_FIELDS, "expires_usec": 2}) + " " * (64 * 1024),  # too big
], ids=["Infinity", "NaN", "deep nesting", "not JSON", "missing fields", "a float", "over 64 KiB"])
def test_a_lease_that_cannot_be_read_holds_for_an_unknown_holder_until_its_file_is_lease_timeout_old(
        tmp_path: Path, content: str) -> None:
    directory = LeaseDirectory(str(tmp_path / "leases"))
    directory.prepare()
    try:
        assert directory.lease(DEVICE, 60.0) is None  # no file: no lease
        path = tmp_path / "leases" / f"{DEVICE}.lease"
        path.write_text(content)
        modified_usec = path.stat().st_mtime_ns // 1000
        lease = directory.lease(DEVICE, 60.0)
        assert directory.leases() == []
    finally:
        directory.close()
    assert isinstance(lease, UnreadableLease) and lease.unit == gate_lines.UNREADABLE_LEASE, lease
    assert lease.expires_usec == modified_usec + 60_000_000
    never_asked = lambda unit, invocation: pytest.fail("systemd asked about an unknown holder")  # noqa: E731
    assert lease_ended(lease, {}, lease.expires_usec - 1, never_asked) is None
    assert lease_ended(lease, {}, lease.expires_usec, never_asked) == "timed out"


def test_an_unreadable_lease_holds_beside_initialising_units_and_ends_when_it_is_lease_timeout_old(
        host: Host) -> None:
    other = new_invocation_id()
    host.write([unit_starting(EMBEDDING, host.clock.tick(), invocation_id=other),
                *main_started(EMBEDDING, host.clock, other, 100)])
    host.leases.mkdir(mode=0o700, parents=True)
    lease = host.leases / f"{DEVICE}.lease"
    lease.write_text(json.dumps(LEASE_FIELDS)[:-1] + ', "expires_usec": Infinity}')
    written = time.time()
    run = host.start(CHAT, "--gpu-memory-utilization", "0.07", "--lease-timeout", "4s")
    assert wait_for(lambda: run.saw(f"waiting for {EMBEDDING},{gate_lines.UNREADABLE_LEASE} "), timeout=20), run.lines
    assert sum("cannot be read" in line for line in run.lines) == 1, run.lines
    host.write(init_completed(EMBEDDING, host.clock, other, 100))
    assert run.wait() == 0, run.lines
    assert run.decision.waited_for == (EMBEDDING, gate_lines.UNREADABLE_LEASE) and not run.decision.timed_out
    assert time.time() - written >= 4.0  # the lease file's age passed --lease-timeout
    assert Lease.read(lease).unit == CHAT
