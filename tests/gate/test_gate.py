"""vllm-xpu-gate as real processes: the service (`vllm-xpu-gate serve --listen ...`) over the real Level Zero
loader and the fake driver (tests/fakeze.py) and real journal files (tests/journalgen.py) written and
appended to while units wait, and clients (`vllm-xpu-gate wait`) asking it over its socket. Who asks is
read from the client process's cgroup file, in a fake procfs (tests/fakeprocfs.py) where each client's
pid is put in its unit before the client starts. A few checks of the pure parts (flags, the decision,
leases) run in process."""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import re
import shlex
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from vllm_xpu_exporter.fold.engine_starts import EngineTracker
from vllm_xpu_exporter.parsers import gate as gate_lines
from vllm_xpu_exporter.gate import protocol
from vllm_xpu_exporter.gate.cli import main, parse_client_options, parse_service_options
from vllm_xpu_exporter.gate.decision import CGROUP_GRACE_USEC, HOST, Admission, Lease, decide, lease_over
from vllm_xpu_exporter.gate.service import (MAX_LEASE_FILE_BYTES, SO_PEERPIDFD, Peer, PeerGone, cgroup_populated,
                                             identify_caller, listening_socket, memory_by_device_workload,
                                             parse_saved_leases)
from vllm_xpu_exporter.sources.logs.entry import LogSelection
from vllm_xpu_exporter.parsers.gate import GateDecision
from exporterproc import RunningExporter
from gateattacks import FLOOD
from gateproc import GATE, GateRun
from polling import wait_for
from scrapes import sample
from fakeprocfs import FakeProcfs, xe_fdinfo
from vllm_xpu_exporter.sources.containers import ContainerNames
from vllm_xpu_exporter.sources.procfs import devices_of_units, scan_drm_clients
from fakecontainers import StateDirectories, container_id, docker_systemd_path
from vllm_xpu_exporter.sources.plan_dropins import DROP_IN_NAME, PLAN_FIELD
from fakeze import A770, B580, GiB, FakeConfig, FakeMemoryModule, fake_driver_env, write_config
from journalgen import (Clock, JournalEntrySpec, append_journal, current_boot_id, new_invocation_id, unit_failed,
                        unit_output, unit_process_exited, unit_started, unit_starting, write_journal)
from vllmlogs import TrackerEntry

REPO = Path(__file__).resolve().parents[2]
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

def main_started(unit: str, clock: Clock, invocation: str, pid: int, ratio: float = 0.07,
                 budget: int | None = None) -> list[JournalEntrySpec]:
    """PID 1's "Started" and the engine's first lines: the unit is initialising (`budget`: it runs with
    --kv-cache-memory-bytes)."""
    api = API.format(pid=pid)
    kv = f", 'kv_cache_memory_bytes': {budget}" if budget is not None else ""
    return [unit_started(unit, clock.tick(), invocation_id=invocation),
            unit_output(unit, api + "vLLM API server version 0.24.0", clock.tick(), pid=pid, invocation_id=invocation),
            unit_output(unit, api + f"non-default args: {{'model': 'm', 'gpu_memory_utilization': {ratio}{kv}}}",
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


# --- the service and its clients as processes ------------------------------------------------------

# The client's shell waits for this file before it execs the client (same pid): the test puts the pid in
# its unit (the fake procfs's cgroup file) first, so the service never reads the cgroup of a pid not set.
WAIT_FOR_GO = 'while [ ! -e "$0" ]; do sleep 0.01; done; exec "$@"'


@dataclass
class Host:
    """One GPU (the fake driver), the journal file, a fake procfs and sysfs, the service and its clients."""

    tmp: Path
    driver: Path
    clock: Clock
    runs: list[GateRun] = field(default_factory=list)
    service: GateRun | None = None
    next_pid: int = 50_000

    def __post_init__(self) -> None:
        self.procfs = FakeProcfs(self.tmp / "proc")
        (self.tmp / "sys").mkdir(exist_ok=True)

    @property
    def journal(self) -> Path:
        return self.tmp / "system.journal"

    @property
    def socket(self) -> Path:
        return self.tmp / "gate.sock"

    def gpu(self, free_gib: float = 13.0, *devices: object, size: int = TOTAL) -> None:
        device = dataclasses.replace(A770, memory=(FakeMemoryModule(size=size, free=round(free_gib * GiB)),))
        write_config(self.tmp / "fake_ze.conf", FakeConfig(devices=(device, *devices)))

    def write(self, entries: Sequence[JournalEntrySpec]) -> None:
        if self.journal.exists():
            append_journal(self.journal, entries)
        else:
            write_journal(self.journal, entries)

    def cgroup(self, unit: str, populated: bool) -> None:
        """The unit's cgroup in the fake sysfs (cgroup v2's cgroup.events)."""
        directory = self.tmp / "sys" / "fs" / "cgroup" / "system.slice" / unit
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cgroup.events").write_text(f"populated {int(populated)}\nfrozen 0\n")

    def serve(self, *args: str, journal: Sequence[str] | None = None) -> GateRun:
        if not self.journal.exists() and journal is None:
            self.write([unit_output("other.service", "unrelated", self.clock.tick())])
        env = {**fake_driver_env(self.driver, self.tmp / "fake_ze.conf"), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "LANG": "C.UTF-8"}
        journal_args = journal if journal is not None else ["--journal.file", str(self.journal)]
        command = [*GATE, "serve", "--listen", str(self.socket), *journal_args, "--path.procfs",
                   str(self.procfs.root), "--path.sysfs", str(self.tmp / "sys"), "--poll-interval", "50ms", *args]
        self.service = GateRun("service", subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                           stderr=subprocess.PIPE, env=env, cwd=self.tmp))
        assert wait_for(lambda: self.service.saw("serving on"), timeout=20), self.service.lines
        return self.service

    def stop_service(self) -> None:
        if self.service is not None:
            self.service.process.terminate()
            self.service.wait()

    def start(self, unit: str | None, *args: str, service_timeout: str = "10s", legacy: str | None = None,
              cgroup: str | None = None, command: str = "wait") -> GateRun:
        """A client in `unit` (None: in no unit's cgroup, a login session's) or in `cgroup` (a container's, with
        `unit` its name in the test); `legacy`: run as the 0.2 drop-in's line ran it, `vllm-xpu-gate --unit
        <legacy> ...`; `command`: the client's, `wait` or `wake`."""
        if self.service is None:
            self.serve()
        self.next_pid += 1
        go = self.tmp / f"go-{self.next_pid}"
        form = ["--unit", legacy] if legacy is not None else [command]
        command = ["sh", "-c", WAIT_FOR_GO, str(go), *GATE, *form, "--socket", str(self.socket),
                   "--service-timeout", service_timeout, *args]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin"},
                                   cwd=self.tmp)
        if cgroup is None:
            cgroup = f"/system.slice/{unit}" if unit else "/user.slice/user-1000.slice/session-3.scope"
        self.procfs.add_unit_process(process.pid, cgroup)
        go.touch()
        run = GateRun(unit or "session-3.scope", process)
        self.runs.append(run)
        return run

    def run(self, unit: str | None, *args: str, **kwargs) -> tuple[int, GateRun]:
        gate_run = self.start(unit, *args, **kwargs)
        return gate_run.wait(), gate_run


@pytest.fixture
def host(tmp_path: Path, fake_driver: Path):
    host = Host(tmp_path, fake_driver, Clock(current_boot_id(), realtime_usec=time.time_ns() // 1000 - 60_000_000))
    host.gpu()
    yield host
    for run in host.runs:
        run.stop()
    if host.service is not None:
        host.service.stop()
    for run in host.runs:
        assert all(line.startswith("vllm-xpu-gate: ") for line in run.lines), run.lines
    if host.service is not None:
        print("\n".join(host.service.lines))  # shown when a test fails


# --- flags ------------------------------------------------------------------------------------------

@pytest.mark.fast
@pytest.mark.parametrize("argv", [
    ["wait", "--device", "card0"],
    ["wait", "--gpu-memory-utilization", "0"],
    ["wait", "--gpu-memory-utilization", "1.5"],
    ["wait", "--gpu-memory-utilization", "nan"],
    ["wait", "--timeout", "10"],
    ["wait", "--timeout", "-1m"],
    ["wait", "--timeout", "169h"],
    ["wait", "--timeout", "1" + "0" * 400 + "h"],
    ["wait", "--on-timeout", "later"],
    ["wait", "--socket", "gate.sock"],
    ["wait", "--kv-cache-memory-bytes", "-5"],
    ["wait", "--unit", CHAT],
    ["wake", "--url", "ftp://engine:8000"],
    ["wake", "--url", "http://127.0.0.1:8000/?level=1"],
    ["wake", "--gpu-memory-utilization", "0.5"],
    ["wake", "--timeout", "10"],
    ["serve", "--lease-timeout", "0"],
    ["serve", "--lease-timeout", "1" + "0" * 400 + "h"],
    ["serve", "--poll-interval", "100000000h"],
    ["serve", "--levelzero.timeout", "1e300"],
    ["serve", "--listen", "relative.sock"],
    ["serve", "--journal.directory", "/a", "--journal.file", "/b"],
    ["serve", "--journal.boot", "yesterday"],
    ["serve", "--no-such-flag"],
    ["--unit", CHAT, "--timeout", "10"],  # the 0.2 form's flags are checked as well
], ids=lambda argv: " ".join(argv)[:50])
def test_bad_flags_exit_2_with_one_prefixed_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vllm-xpu-gate"), lines
    assert "error: " in lines[0]


@pytest.mark.fast
def test_an_unknown_command_or_none_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["release"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "vllm-xpu-gate: error: unknown command 'release' (want one of: serve, wait, wake)"]
    assert main([]) == 2


# What the service needs and the client must not pay for at every gated start: the sources (journal reader,
# Level Zero, procfs), the fold, the collectors, the HTTP server, the exporter's flags and the vLLM grammar,
# and the native libraries behind them.
SERVICE_ONLY_PACKAGES = ("vllm_xpu_exporter.sources", "vllm_xpu_exporter.fold", "vllm_xpu_exporter.collectors",
                         "vllm_xpu_exporter.http")
SERVICE_ONLY_MODULES = ("vllm_xpu_exporter.flags", "vllm_xpu_exporter.cli", "vllm_xpu_exporter.parsers.vllm",
                        "vllm_xpu_exporter.gate.service")
SERVICE_ONLY_LIBRARIES = ("libsystemd.so", "libze_loader.so", "libudev.so")


def test_the_client_loads_none_of_the_services_sources_or_the_exporters_flags(tmp_path: Path) -> None:
    """`vllm-xpu-gate wait` runs at every gated start, its interpreter's start on the unit's way: a run of
    it (no service there: it starts its unit ungated at once) loads no source, journal reader, Level Zero
    binding, fold, collector or the exporter's flags, and maps none of their native libraries."""
    program = ("import atexit, sys\n"
               "def report():\n"
               "    print(' '.join(name for name in sys.modules if name.startswith('vllm_xpu_exporter')))\n"
               "    print(open('/proc/self/maps').read())\n"
               "atexit.register(report)\n"
               "from vllm_xpu_exporter.gate.cli import main\n"
               f"sys.exit(main(['wait', '--socket', {str(tmp_path / 'none.sock')!r}, '--service-timeout', '0s']))\n")
    completed = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0 and "started ungated" in completed.stderr, completed.stderr
    modules_line, _, maps = completed.stdout.partition("\n")
    modules = set(modules_line.split())
    assert "vllm_xpu_exporter.gate.client" in modules, modules  # the run was the client's
    loaded = sorted(name for name in modules
                    if name in SERVICE_ONLY_MODULES or name.startswith(tuple(f"{p}." for p in SERVICE_ONLY_PACKAGES))
                    or name in SERVICE_ONLY_PACKAGES)
    assert loaded == [], f"the client loaded the service's modules: {loaded}"
    mapped = sorted({library for library in SERVICE_ONLY_LIBRARIES if library in maps})
    assert mapped == [], f"the client mapped the service's libraries: {mapped}"


@pytest.mark.fast
def test_the_client_takes_go_durations_and_its_units_settings_and_nothing_naming_the_unit() -> None:
    options = parse_client_options(["--device", "0000:03:00.0", "--gpu-memory-utilization", "0.75",
                                    "--timeout", "1m30s", "--on-timeout", "fail", "--kv-cache-memory-bytes", "1024",
                                    "--socket", "/run/x.sock", "--service-timeout", "5s"])
    assert options.request == protocol.Request(90.0, False, 0.75, "0000:03:00.0", 1024)
    assert (options.socket_path, options.service_timeout) == ("/run/x.sock", 5.0)
    defaults = parse_client_options([])
    assert defaults.request == protocol.Request(600.0, True, None, None, None)
    assert (defaults.socket_path, defaults.service_timeout) == ("/run/vllm-xpu-gate/gate.sock", 30.0)


@pytest.mark.fast
def test_the_service_takes_the_exporters_journal_and_levelzero_flags() -> None:
    options = parse_service_options(["--journal.directory", "/j", "--journal.units", "llm-*.service",
                                     "--journal.boot", "all", "--levelzero.library", "libze.so",
                                     "--levelzero.timeout", "2s", "--lease-timeout", "1m", "--poll-interval", "1s"])
    assert (options.selection.directory, options.selection.boot, options.selection.unit_globs) == (
        "/j", "all", ("llm-*.service",))
    assert (options.levelzero_library, options.levelzero_timeout) == ("libze.so", 2.0)
    assert (options.lease_timeout, options.poll_interval, options.listen) == (60.0, 1.0, None)
    assert parse_service_options(["--listen", "/run/g.sock"]).listen == "/run/g.sock"


@pytest.mark.fast
def test_only_system_service_units_are_watched_by_the_service_whatever_the_globs() -> None:
    """`--journal.units vllm*` matches the service's own socket unit and a user's unit or scope of such a
    name: the service watches (waits for, and leases to) only system `.service` units."""
    selection = parse_service_options(["--journal.units", "vllm*"], environ={}).selection
    assert selection.matches_unit(CHAT)
    for unit in ("vllm-xpu-gate.socket", "vllm-squat.scope", f"{CHAT}@uid1000", "vllm-x.slice"):
        assert not selection.matches_unit(unit), unit


@pytest.mark.fast
def test_the_services_max_units_help_names_no_metric_it_does_not_export(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--journal.max-units N watch at most this many units; further ones are not watched" in text
    assert "xpu_exporter_" not in text


@pytest.mark.fast
@pytest.mark.parametrize("data", [
    b"", b"[]", b"{}", b'{"timeout": NaN, "start_on_timeout": true}', b'{"timeout": true, "start_on_timeout": true}',
    b'{"timeout": 1e9, "start_on_timeout": true}', b'{"timeout": 1, "start_on_timeout": 1}',
    b'{"timeout": 1, "start_on_timeout": true, "gpu_memory_utilization": 2}',
    b'{"timeout": 1, "start_on_timeout": true, "device": "card0"}',
    b'{"timeout": 1, "start_on_timeout": true, "kv_cache_memory_bytes": 1.5}', b"[" * 100_000])
def test_the_service_refuses_any_request_but_the_clients(data: bytes) -> None:
    with pytest.raises(protocol.BadRequest):
        protocol.Request.decode(data)


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


def lease(unit: str, device: str = DEVICE, granted: int = 0, needed_bytes: int | None = None,
          absolute: bool = False) -> Lease:
    return Lease(device, unit, f"/system.slice/{unit}", granted, granted + 60_000_000, needed_bytes, absolute)


@pytest.mark.fast
def test_a_unit_known_on_another_gpu_does_not_hold_the_start_back_and_one_of_unknown_device_does() -> None:
    clock = Clock(current_boot_id())
    views = views_of([*main_started(EMBEDDING, clock, new_invocation_id(), 100),
                      *main_started(STT, clock, new_invocation_id(), 200)])
    other_gpu = {EMBEDDING: {B580.pci_address}}
    chat = Admission(CHAT, DEVICE, None, False)
    assert decide(chat, views, [], other_gpu, None).units == (STT,)  # STT's device is unknown: it counts
    assert decide(chat, views, [], {EMBEDDING: {DEVICE}}, None).units == (EMBEDDING, STT)
    embedding = Admission(EMBEDDING, DEVICE, None, False)
    assert decide(embedding, views, [lease(CHAT)], None, None).units == (STT, CHAT)  # and the lease holder
    assert decide(embedding, views, [lease(CHAT, B580.pci_address)], None, None).units == (STT,)
    assert decide(embedding, views, [lease(EMBEDDING)], None, None).units == (STT,)  # its own: no holder
    # Without Level Zero (HOST): every unit counts, whatever GPU it is known on, and every lease
    host_wide = Admission(CHAT, HOST, 0.75, False)
    assert decide(host_wide, views, [lease("vllm-x.service", B580.pci_address)], other_gpu, None).units == (
        EMBEDDING, STT, "vllm-x.service")


@pytest.mark.fast
def test_a_user_unit_of_a_system_units_name_does_not_move_that_units_gpu(tmp_path: Path) -> None:
    """uid 1000's user unit vllm-xpu-embedding.service on the B580 is its own identity: the system unit of
    that name stays on its GPU alone, for the gate and the planner (devices_of_units)."""
    procfs = FakeProcfs(tmp_path)
    procfs.add_unit_process(100, f"/system.slice/{EMBEDDING}").add_drm_fd(xe_fdinfo(client_id=1, pdev=DEVICE,
                                                                                  vram0=GiB))
    procfs.add_unit_process(300, f"/user.slice/user-1000.slice/user@1000.service/app.slice/{EMBEDDING}").add_drm_fd(
        xe_fdinfo(client_id=3, pdev=B580.pci_address, vram0=GiB))
    assert devices_of_units(str(procfs.root)) == {EMBEDDING: {DEVICE}, f"{EMBEDDING}@uid1000": {B580.pci_address}}


@pytest.mark.fast
def test_a_containers_device_memory_is_counted_under_its_key_as_its_lease_names_it(tmp_path: Path) -> None:
    """What a container's processes hold (fdinfo, under its cgroup leaf `docker-<id>.scope`) is the taken
    memory of `docker/<name>`, the key its lease and its logs carry: by the plan, a budgeted start beside a
    container's init counts only what that container has yet to take. A unit keeps its name."""
    procfs = FakeProcfs(tmp_path / "proc")
    chat = container_id("chat")
    procfs.add_unit_process(100, docker_systemd_path(chat)).add_drm_fd(xe_fdinfo(client_id=1, pdev=DEVICE,
                                                                                  vram0=3 * GiB))
    procfs.add_unit_process(200, f"/system.slice/{STT}").add_drm_fd(xe_fdinfo(client_id=2, pdev=DEVICE, vram0=GiB))
    state = StateDirectories(tmp_path / "state")
    state.add_docker(chat, "vllm-chat")
    names = ContainerNames(**state.names_kwargs())
    scan = scan_drm_clients(str(procfs.root))
    assert memory_by_device_workload(scan, names.key_of_cgroup_path) == {DEVICE: {"docker/vllm-chat": 3 * GiB,
                                                                                   STT: GiB}}


@pytest.mark.fast
def test_a_lease_ends_when_its_starts_init_ends_its_cgroup_stays_empty_or_it_times_out() -> None:
    clock = Clock(current_boot_id(), realtime_usec=time.time_ns() // 1000)
    invocation = new_invocation_id()
    now = time.time_ns() // 1000
    held = lease(CHAT, granted=now - 10)
    (before,) = views_of([*main_started(CHAT, Clock(current_boot_id(), realtime_usec=now - 10_000_000),
                                        new_invocation_id(), 50)])
    assert lease_over(held, None, now, None) is None  # not in the journal yet
    assert lease_over(held, before, now, True) is None  # an earlier start's init does not end it
    (running,) = views_of([unit_starting(CHAT, clock.tick(), invocation_id=invocation),
                           *main_started(CHAT, clock, invocation, 100)])
    assert lease_over(held, running, now, True) is None
    assert lease_over(held, running, held.expires_usec, True) == "timed out"
    for ending in (init_completed, init_failed):
        (ended,) = views_of([unit_starting(CHAT, clock.tick(), invocation_id=invocation),
                             *main_started(CHAT, clock, invocation, 100), *ending(CHAT, clock, invocation, 100)])
        assert lease_over(held, ended, now, True) == "its init ended"
    # Between the client's exit and the engine's fork the cgroup is empty: only past the grace does it count
    assert lease_over(held, None, now, False) is None
    assert lease_over(held, None, held.granted_usec + CGROUP_GRACE_USEC, False) == "its unit has no process"
    # ... and only when it stayed empty that long: seen empty a moment ago (a later ExecStartPre= command's exit
    # on a loaded host), it still holds
    later = held.granted_usec + 2 * CGROUP_GRACE_USEC
    assert lease_over(held, None, later, False, empty_since_usec=later - 1) is None
    assert lease_over(held, None, later, False, empty_since_usec=later - CGROUP_GRACE_USEC) == "its unit has no process"
    assert lease_over(held, None, held.granted_usec + CGROUP_GRACE_USEC, None) is None  # cannot be told


@dataclass(frozen=True)
class Reading:
    """A device memory reading as decide() reads it."""

    free: int
    total: int = TOTAL


@pytest.mark.fast
def test_by_the_plan_budgeted_starts_are_admitted_beside_budgeted_inits_when_the_memory_covers_them_all() -> None:
    """Chat (R 0.75, a KV budget) initialises; stt (R 0.07, a budget) may start beside it once free memory
    covers stt's ceil(R x total) plus what chat has yet to take (its own ceil(R x total) less what its
    processes hold); without a budget on either side, or with chat's R unknown, stt waits in order."""
    clock = Clock(current_boot_id())
    budget = 2 * GiB
    views = views_of(main_started(CHAT, clock, new_invocation_id(), 100, ratio=0.75, budget=budget))
    stt = Admission(STT, DEVICE, 0.07, True)
    chat_left = needed(0.75)
    enough = Reading(free=needed(0.07) + chat_left)
    decision = decide(stt, views, [], None, enough)
    assert decision.release and decision.by_plan and decision.needed_bytes == needed(0.07) + chat_left
    short = decide(stt, views, [], None, Reading(free=needed(0.07) + chat_left - 1))
    assert (short.units, short.memory_short, short.waiting_for) == ((), True, (gate_lines.MEMORY,))
    # what chat's processes already hold is no longer to be taken
    taken = decide(stt, views, [], None, Reading(free=needed(0.07) + chat_left - GiB), taken={CHAT: GiB})
    assert taken.release and taken.needed_bytes == needed(0.07) + chat_left - GiB
    # in order: stt has no budget, or chat has none
    assert decide(Admission(STT, DEVICE, 0.07, False), views, [], None, enough).units == (CHAT,)
    unbudgeted = views_of(main_started(CHAT, clock, new_invocation_id(), 100, ratio=0.75))
    assert decide(stt, unbudgeted, [], None, enough).units == (CHAT,)
    # a lease of a released budgeted start counts with the bytes it asked for; one without a budget holds
    released = lease(EMBEDDING, needed_bytes=needed(0.07), absolute=True)
    both = decide(stt, views, [released], None, Reading(free=2 * needed(0.07) + chat_left))
    assert both.release and both.needed_bytes == 2 * needed(0.07) + chat_left
    assert decide(stt, views, [lease(EMBEDDING)], None, enough).units == (CHAT, EMBEDDING)
    # nothing to wait for: the ordinary check, not the plan's
    alone = decide(stt, [], [], None, Reading(free=needed(0.07)))
    assert alone.release and not alone.by_plan


@pytest.mark.fast
def test_a_units_cgroup_is_populated_as_cgroup_v2_or_the_v1_systemd_hierarchy_says(tmp_path: Path) -> None:
    unit = "/system.slice/vllm-xpu-chat.service"
    v2 = tmp_path / "v2" / "fs" / "cgroup"
    (v2 / unit.lstrip("/")).mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu memory\n")
    (v2 / unit.lstrip("/") / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    assert cgroup_populated(str(tmp_path / "v2"), unit) is True
    (v2 / unit.lstrip("/") / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    assert cgroup_populated(str(tmp_path / "v2"), unit) is False
    assert cgroup_populated(str(tmp_path / "v2"), "/system.slice/gone.service") is False  # no such cgroup
    v1 = tmp_path / "v1" / "fs" / "cgroup" / "systemd"
    (v1 / unit.lstrip("/")).mkdir(parents=True)
    (v1 / unit.lstrip("/") / "cgroup.procs").write_text("4242\n")
    assert cgroup_populated(str(tmp_path / "v1"), unit) is True
    (v1 / unit.lstrip("/") / "cgroup.procs").write_text("")
    assert cgroup_populated(str(tmp_path / "v1"), unit) is False
    # outside the service's cgroup namespace, or no cgroup tree at all: cannot be told
    assert cgroup_populated(str(tmp_path / "v2"), "/../../system.slice/x.service") is None
    assert cgroup_populated(str(tmp_path / "none"), unit) is None


# --- releasing and waiting ---------------------------------------------------------------------------

def test_nothing_initialising_and_enough_memory_releases_at_once(host: Host) -> None:
    done = new_invocation_id()
    host.write([*main_started(EMBEDDING, host.clock, done, 100), *init_completed(EMBEDDING, host.clock, done, 100)])
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.75")
    assert code == 0, run.lines
    assert run.decision == GateDecision(False, run.decision.seconds, (), 13 * GiB, needed(0.75)), run.lines
    assert run.lines[-1].startswith("vllm-xpu-gate: released after ")


def test_the_unit_is_the_one_the_callers_cgroup_names_and_a_caller_outside_the_watched_units_waits_for_nothing(
        host: Host) -> None:
    """The service knows the caller by its cgroup: an initialising chat holds embedding back, not itself
    (the caller in chat's cgroup is chat); a caller in a login session is released at once."""
    chat = new_invocation_id()
    host.write([unit_starting(CHAT, host.clock.tick(), invocation_id=chat), *main_started(CHAT, host.clock, chat, 100)])
    code, own = host.run(CHAT, "--gpu-memory-utilization", "0.07")
    assert code == 0 and own.decision.waited_for == (), own.lines
    code, session = host.run(None, "--gpu-memory-utilization", "0.07")
    assert code == 0 and session.saw("session-3.scope is not a watched unit"), session.lines
    other = host.start(EMBEDDING, "--gpu-memory-utilization", "0.07")
    assert wait_for(lambda: other.saw(f"waiting for {CHAT}"), timeout=20), other.lines


# A client that connects, hands its connection to a child and exits; the child keeps the connection open
# until its stdin closes.
HAND_OVER = """
import os, socket, sys
connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
connection.connect(sys.argv[1])
if os.fork():
    os._exit(0)
sys.stdin.read()
"""


def test_a_caller_gone_before_it_is_identified_is_not_taken_for_the_process_that_reuses_its_pid(
        tmp_path: Path) -> None:
    """A real client connects, passes the connection to a child and exits; its pid then names a process of
    chat (the fake procfs's cgroup file). The service, identifying the caller as it accepts, reads that
    cgroup but its pidfd of the caller (SO_PEERPIDFD) shows the caller gone: it tells no unit and
    answers the caller as unidentified (released, no lease for chat)."""
    procfs = FakeProcfs(tmp_path / "proc")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with listener:
        listener.bind(str(tmp_path / "gate.sock"))
        listener.listen(1)
        parent = subprocess.Popen([sys.executable, "-c", HAND_OVER, str(tmp_path / "gate.sock")],
                                  stdin=subprocess.PIPE, cwd=tmp_path)
        try:
            assert parent.wait(20) == 0  # exited and reaped: the pid is free for another process
            procfs.add_unit_process(parent.pid, f"/system.slice/{CHAT}")  # ... which chat's process now has
            connection, _ = listener.accept()
            with connection:
                answer = identify_caller(connection, str(procfs.root), LogSelection())
        finally:
            parent.stdin.close()
    assert isinstance(answer, str) and "cannot tell which unit asks (the process that connected is gone" in answer


def test_without_so_peerpidfd_the_peer_is_its_pid_alone_and_with_it_a_pidfd_of_that_process() -> None:
    """A kernel before 6.5 answers SO_PEERPIDFD with ENOPROTOOPT: the service falls back to the pid
    (docs/security.md says what that leaves open); this kernel gives a pidfd, whose check passes while
    the peer runs and fails once it has exited."""
    class OldKernelSocket:
        def getsockopt(self, level: int, option: int, size: int) -> bytes:
            if option == SO_PEERPIDFD:
                raise OSError(errno.ENOPROTOOPT, os.strerror(errno.ENOPROTOOPT))
            return struct.pack("3i", 4242, 0, 0)

    old = Peer.of(OldKernelSocket())
    assert (old.pid, old.pidfd, old.gone) == (4242, None, None)
    old.check_running()  # nothing can be told: the pid is trusted as before
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with listener, tempfile.TemporaryDirectory() as directory:
        listener.bind(f"{directory}/s")
        listener.listen(1)
        client = subprocess.Popen([sys.executable, "-c", "import socket, sys; s = socket.socket(socket.AF_UNIX); "
                                   "s.connect(sys.argv[1]); sys.stdin.read()", f"{directory}/s"],
                                  stdin=subprocess.PIPE)
        connection, _ = listener.accept()
        with connection:
            peer = Peer.of(connection)
            try:
                assert peer.pid == client.pid and peer.pidfd is not None
                peer.check_running()
                client.stdin.close()
                client.wait(20)
                with pytest.raises(PeerGone):
                    peer.check_running()
            finally:
                peer.close()


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


def plan_drop_ins(tmp: Path, budgets: dict[str, int]) -> Path:
    """Root's plan drop-ins (DIR/UNIT.d/zz-vllm-xpu-plan.conf naming each budget), every directory root's alone:
    the directory for the service's --plans."""
    os.chmod(tmp, 0o755)
    directory = tmp / "plans"
    for unit, budget in budgets.items():
        (directory / f"{unit}.d").mkdir(parents=True, exist_ok=True)
        (directory / f"{unit}.d" / DROP_IN_NAME).write_text(f"[Service]\nLogExtraFields={PLAN_FIELD}={budget}\n")
    for path in [directory, *directory.rglob("*")]:
        os.chmod(path, 0o644 if path.is_file() else 0o755)
    return directory


def test_by_the_plan_a_budgeted_start_goes_beside_a_budgeted_init_and_says_what_it_needed(host: Host) -> None:
    """Chat initialises with a KV budget; stt's client gives its budget, the one root's plan drop-in names: it
    is released while chat's init runs, its "needed" covering both; embedding, without one, waits for chat in
    order."""
    host.serve("--plans", str(plan_drop_ins(host.tmp, {STT: GiB})))
    chat, stt = new_invocation_id(), new_invocation_id()
    host.write([unit_starting(CHAT, host.clock.tick(), invocation_id=chat),
                *main_started(CHAT, host.clock, chat, 100, ratio=0.5, budget=2 * GiB),
                unit_starting(STT, host.clock.tick(), invocation_id=stt)])
    code, run = host.run(STT, "--gpu-memory-utilization", "0.07", "--kv-cache-memory-bytes", str(GiB))
    assert code == 0 and run.decision.waited_for == (), run.lines
    assert run.decision.needed_bytes == needed(0.07) + needed(0.5) and run.decision.free_bytes == 13 * GiB
    other = host.start(EMBEDDING, "--gpu-memory-utilization", "0.07")
    assert wait_for(lambda: other.saw(f"waiting for {CHAT},{STT}"), timeout=20), other.lines  # stt: its lease
    host.write([*init_completed(CHAT, host.clock, chat, 100), *main_started(STT, host.clock, stt, 200),
                *init_completed(STT, host.clock, stt, 200)])
    assert other.wait() == 0 and other.decision.waited_for == (CHAT, STT), other.lines


def test_a_connection_that_never_asks_holds_no_one_back(host: Host) -> None:
    """A process of a watched unit connects and says nothing (or sends half a request): the service answers
    the next client at once; the silent connection is closed after the handshake's bound."""
    host.serve()
    host.procfs.add_unit_process(os.getpid(), f"/system.slice/{STT}")  # the test's connections: stt's
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(str(host.socket))
    half = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    half.connect(str(host.socket))
    half.sendall(b'{"timeout": 600, "start_on')
    try:
        code, run = host.run(CHAT, "--gpu-memory-utilization", "0.07")
        assert code == 0 and run.decision.waited_for == (), run.lines
        with pytest.raises(BlockingIOError):  # answered while the silent connection is still open
            silent.recv(1, socket.MSG_DONTWAIT)
        silent.settimeout(15)
        assert silent.recv(1) == b"", "the silent connection was not closed"
    finally:
        silent.close()
        half.close()


@pytest.mark.parametrize("flooder", ["outside every unit", "a watched unit's process"])
def test_a_flood_of_connections_that_trickle_bytes_holds_no_other_units_start(host: Host, flooder: str) -> None:
    """300 connections from one process sending a byte every half second, as the flood that switched the
    gate off: from a login session, each is answered at once and holds nothing; from a watched unit's
    process (stt's), only that unit's few slots fill. Either way chat's start, waiting at its gate, is
    released at once by the service's decision (not after --service-timeout, ungated)."""
    host.serve()
    stop = host.tmp / "stop-flood"
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, str(host.socket), "300", "0.5", str(stop)],
                             stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=host.tmp)
    try:
        cgroup = "/user.slice/user-65534.slice/session-9.scope" if flooder == "outside every unit" \
            else f"/system.slice/{STT}"
        host.procfs.add_unit_process(flood.pid, cgroup)
        assert flood.stdout.readline() == b"flooding\n"
        time.sleep(1.0)
        chat = new_invocation_id()
        host.write([unit_starting(CHAT, host.clock.tick(), invocation_id=chat)])
        code, run = host.run(CHAT, "--gpu-memory-utilization", "0.07", service_timeout="20s")
        assert code == 0 and run.decision is not None and not run.decision.ungated, run.lines
        assert run.decision.waited_for == () and run.decision.seconds < 5, run.lines
    finally:
        stop.touch()
        output, _ = flood.communicate(timeout=60)
    answered = int(output.split()[-1])
    if flooder == "outside every unit":
        assert answered >= 300, f"only {answered} of the flood's connections were answered"
    else:
        assert not host.service.saw("Traceback"), host.service.lines


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
    host.gpu(free_gib=0.5)
    code, run = host.run(CHAT)
    assert code == 0, run.lines
    assert run.saw(f"no gpu_memory_utilization known for {CHAT}")
    assert (run.decision.waited_for, run.decision.needed_bytes) == ((), None)


# --- never strand a unit -----------------------------------------------------------------------------

def test_journal_that_cannot_be_read_releases_at_once_with_a_warning(host: Host) -> None:
    host.serve(journal=["--journal.directory", str(host.tmp / "missing")])
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.75")
    assert code == 0, run.lines
    assert run.saw("warning: cannot read the journal (journal directory") and run.saw("releasing at once")
    assert run.decision.waited_for == () and run.decision.seconds < 10


@pytest.mark.parametrize("why", ["no loader", "untrusted accounting"])
def test_without_level_zero_memory_is_unchecked_and_inits_still_go_one_at_a_time_per_host(host: Host, why: str) -> None:
    """Level Zero unreadable (or free == total): the service says so and keeps the order: an initialising
    unit holds the start back, whatever GPU it is on; the decision line says memory was unchecked."""
    if why == "no loader":
        host.serve("--levelzero.library", "/nonexistent/libze.so", "--levelzero.timeout", "1s")
    else:
        host.gpu(free_gib=16.0)
    other = new_invocation_id()
    host.write([unit_starting(EMBEDDING, host.clock.tick(), invocation_id=other),
                *main_started(EMBEDDING, host.clock, other, 100)])
    run = host.start(CHAT, "--gpu-memory-utilization", "0.75")
    assert wait_for(lambda: run.saw(f"waiting for {EMBEDDING}"), timeout=20), run.lines
    assert run.saw("memory unchecked: ") and run.saw("one init at a time")
    host.write(init_completed(EMBEDDING, host.clock, other, 100))
    assert run.wait() == 0, run.lines
    assert run.decision.waited_for == (EMBEDDING,) and run.lines[-1].endswith("; memory unchecked")
    assert (run.decision.free_bytes, run.decision.needed_bytes) == (None, None)


def test_several_gpus_need_device_and_a_device_that_is_not_there_is_a_one_line_error(host: Host) -> None:
    host.gpu(13.0, B580)
    code, run = host.run(CHAT)
    assert code == 2 and [line for line in run.lines] == [
        f"vllm-xpu-gate: error: 2 GPUs ({DEVICE}, {B580.pci_address}): the client's --device is required"]
    code, run = host.run(CHAT, "--device", "0000:99:00.0")
    assert code == 2 and len(run.lines) == 1 and "no such GPU" in run.lines[0]
    code, run = host.run(CHAT, "--device", B580.pci_address, "--gpu-memory-utilization", "0.5")
    assert code == 0 and run.decision.free_bytes == 11 * GiB, run.lines


def test_no_service_starts_the_unit_ungated_within_the_bound_with_one_line(host: Host) -> None:
    """No socket at all, then a socket nobody accepts on (a service hung before accepting): one line
    each, exit 0, after about --service-timeout."""
    for listening in (False, True):
        holder = None
        if listening:
            holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            holder.bind(str(host.socket))
            holder.listen(16)  # accepts into the backlog, never answers
        run = GateRun("x", subprocess.Popen([*GATE, "wait", "--socket", str(host.socket), "--service-timeout", "1s"],
                                            stderr=subprocess.PIPE, env={"PYTHONPATH": str(REPO)}))
        host.runs.append(run)
        assert run.wait() == 0
        assert len(run.lines) == 1 and run.lines[0].startswith("vllm-xpu-gate: started ungated after "), run.lines
        assert f"no gate service answered on {host.socket} within 1s" in run.lines[0]
        decision = run.decision
        assert decision.ungated and 1.0 <= decision.seconds < 5, run.lines
        if holder is not None:
            holder.close()
            host.socket.unlink()


def test_a_service_stopped_while_a_unit_waits_lets_it_start_after_the_bound(host: Host) -> None:
    other = new_invocation_id()
    host.write([*main_started(EMBEDDING, host.clock, other, 100)])
    run = host.start(CHAT, "--gpu-memory-utilization", "0.07", service_timeout="1s")
    assert wait_for(lambda: run.saw(f"waiting for {EMBEDDING}"), timeout=20), run.lines
    host.stop_service()
    assert run.wait() == 0, run.lines
    assert run.lines[-1].startswith("vllm-xpu-gate: started ungated after "), run.lines


# --- leases ------------------------------------------------------------------------------------------

def test_three_gated_units_started_together_release_one_after_another(host: Host) -> None:
    """All three print "Starting" at once and their clients start together; each release is followed by that
    unit's init (written to the journal a second later), and only its end releases the next one."""
    units = (CHAT, EMBEDDING, STT)
    invocations = {unit: new_invocation_id() for unit in units}
    host.write([unit_starting(unit, host.clock.tick(), invocation_id=invocations[unit]) for unit in units])
    host.serve("--lease-timeout", "60s")
    runs = {unit: host.start(unit, "--gpu-memory-utilization", "0.07", "--timeout", "60s") for unit in units}
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
    code, first = host.run(EMBEDDING, "--gpu-memory-utilization", "0.07")
    assert code == 0, first.lines
    host.write(main_started(EMBEDDING, host.clock, holder, 100))
    run = host.start(CHAT, "--gpu-memory-utilization", "0.07")
    assert wait_for(lambda: run.saw(f"waiting for {EMBEDDING}"), timeout=20), run.lines
    host.write(killed(EMBEDDING, host.clock, holder))
    assert run.wait() == 0, run.lines
    assert run.decision.waited_for == (EMBEDDING,)


def test_a_lease_whose_holder_never_shows_in_the_journal_holds_until_it_times_out_and_is_never_renewed(
        host: Host) -> None:
    """Embedding's start waits at its gate ("Starting") and is released: its lease holds chat back until
    --lease-timeout, since its main process never shows. Embedding asking again meanwhile (the same start)
    is released at once but gets no second lease: chat goes at the first lease's timeout."""
    host.serve("--lease-timeout", "3s")
    embedding, chat = new_invocation_id(), new_invocation_id()
    host.write([unit_starting(EMBEDDING, host.clock.tick(), invocation_id=embedding),
                unit_starting(CHAT, host.clock.tick(), invocation_id=chat)])
    code, first = host.run(EMBEDDING, "--gpu-memory-utilization", "0.07")
    assert code == 0 and first.decision.waited_for == (), first.lines
    waiting = host.start(CHAT, "--gpu-memory-utilization", "0.07")
    assert wait_for(lambda: waiting.saw(f"waiting for {EMBEDDING}"), timeout=20), waiting.lines
    code, again = host.run(EMBEDDING, "--gpu-memory-utilization", "0.07")
    assert code == 0 and again.saw("had its lease already: none again"), again.lines
    assert waiting.wait() == 0, waiting.lines
    assert waiting.decision.waited_for == (EMBEDDING,), waiting.lines
    assert first.ended is not None and waiting.ended - first.ended < 3.0 + 2.0, "the lease was renewed"
    assert waiting.ended - first.ended >= 2.5, waiting.lines


def test_a_serving_units_own_process_asking_again_and_again_gets_no_lease_and_holds_nobody_back(host: Host) -> None:
    """Chat serves (its main process began, its init completed); a process of chat asks every moment, as
    the squatter did. It is released without a lease each time, so embedding's start, waiting at its gate,
    is released at once, in no case after --lease-timeout."""
    host.serve("--lease-timeout", "30s")
    chat, embedding = new_invocation_id(), new_invocation_id()
    host.write([unit_starting(CHAT, host.clock.tick(), invocation_id=chat), *main_started(CHAT, host.clock, chat, 100),
                *init_completed(CHAT, host.clock, chat, 100)])
    for _ in range(2):
        code, squatter = host.run(CHAT, "--gpu-memory-utilization", "0.01")
        assert code == 0 and squatter.saw("released without a lease"), squatter.lines
    host.write([unit_starting(EMBEDDING, host.clock.tick(), invocation_id=embedding)])
    code, run = host.run(EMBEDDING, "--gpu-memory-utilization", "0.07", "--timeout", "20s")
    assert code == 0 and run.decision.waited_for == () and not run.decision.timed_out, run.lines


def test_starts_whose_wait_timed_out_go_one_at_a_time_in_order(host: Host) -> None:
    """Embedding initialises and never ends; chat and then stt wait at their gates with --timeout 1s. At
    the timeouts chat starts anyway (lease), and stt, timed out too, waits still for chat's start: it
    goes only when chat's init ends, not with chat."""
    host.serve("--lease-timeout", "60s")
    hung, chat, stt = new_invocation_id(), new_invocation_id(), new_invocation_id()
    host.write([unit_starting(EMBEDDING, host.clock.tick(), invocation_id=hung),
                *main_started(EMBEDDING, host.clock, hung, 100),
                unit_starting(CHAT, host.clock.tick(), invocation_id=chat),
                unit_starting(STT, host.clock.tick(), invocation_id=stt)])
    first = host.start(CHAT, "--gpu-memory-utilization", "0.07", "--timeout", "1s")
    assert wait_for(lambda: first.saw(f"waiting for {EMBEDDING}"), timeout=20), first.lines
    second = host.start(STT, "--gpu-memory-utilization", "0.07", "--timeout", "1s")
    assert first.wait() == 0 and first.decision.timed_out, first.lines
    assert wait_for(lambda: second.saw(f"waiting still for {CHAT}"), timeout=20), second.lines
    time.sleep(1.0)
    assert second.running, second.lines
    host.write([*main_started(CHAT, host.clock, chat, 200), *init_completed(CHAT, host.clock, chat, 200)])
    assert second.wait() == 0 and second.decision.timed_out, second.lines


def test_a_lease_outlives_a_restart_of_the_service(host: Host) -> None:
    """Embedding is released (its lease) and the service is stopped before embedding's main process
    begins; the service started again with the same --lease-file still holds chat back for embedding's
    init, and lets it go when that init completes."""
    lease_file = host.tmp / "leases.json"
    host.serve("--lease-file", str(lease_file))
    embedding, chat = new_invocation_id(), new_invocation_id()
    host.write([unit_starting(EMBEDDING, host.clock.tick(), invocation_id=embedding)])
    code, first = host.run(EMBEDDING, "--gpu-memory-utilization", "0.07")
    assert code == 0 and first.decision.waited_for == (), first.lines
    host.stop_service()
    host.serve("--lease-file", str(lease_file))
    host.write([unit_starting(CHAT, host.clock.tick(), invocation_id=chat),
                *main_started(EMBEDDING, host.clock, embedding, 100)])
    run = host.start(CHAT, "--gpu-memory-utilization", "0.07")
    assert wait_for(lambda: run.saw(f"waiting for {EMBEDDING}"), timeout=20), run.lines
    host.write(init_completed(EMBEDDING, host.clock, embedding, 100))
    assert run.wait() == 0 and run.decision.waited_for == (EMBEDDING,), run.lines


@pytest.mark.fast
def test_a_lease_file_of_anything_else_is_refused() -> None:
    for data in (b"", b"[]", b'{"leases": [{"unit": "x"}], "invocations": []}', b'{"leases": [], "invocations": [1]}',
                 b" " * (MAX_LEASE_FILE_BYTES + 1)):
        with pytest.raises(ValueError):
            parse_saved_leases(data)
    lease = Lease(DEVICE, CHAT, f"/system.slice/{CHAT}", 1, 2, None, False, "abc", True)
    assert parse_saved_leases(json.dumps({"leases": [dataclasses.asdict(lease)], "invocations": ["abc"],
                                          "legacy_first_seen": {CHAT: 5}}).encode()) == ([lease], ["abc"], {CHAT: 5})
    with pytest.raises(ValueError):
        parse_saved_leases(b'{"leases": [], "invocations": [], "legacy_first_seen": {"x": "soon"}}')


def test_the_listen_socket_is_made_0666_without_following_a_path_swapped_after_the_bind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--listen in a directory another user can write: right after the socket is bound, that user puts a
    symbolic link to a root-only file where the socket was. The root-only file keeps its mode, and the
    socket (where it was moved) is 0666."""
    victim = tmp_path / "shadow"
    victim.write_text("secret\n")
    victim.chmod(0o600)
    path = tmp_path / "gate.sock"
    real_socket = socket.socket

    class SwappedAfterBind(real_socket):
        def bind(self, address) -> None:
            super().bind(address)
            path.rename(tmp_path / "moved.sock")
            path.symlink_to(victim)

    monkeypatch.setattr(socket, "socket", SwappedAfterBind)
    listener = listening_socket(str(path))
    listener.close()
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "moved.sock").lstat().st_mode) == 0o666


def test_a_lease_of_a_unit_whose_cgroup_stays_empty_or_of_ones_own_unit_blocks_nobody(host: Host) -> None:
    code, first = host.run(EMBEDDING, "--gpu-memory-utilization", "0.07")
    assert code == 0, first.lines
    code, own = host.run(EMBEDDING, "--gpu-memory-utilization", "0.07")  # its restart: its own lease
    assert code == 0 and own.decision.waited_for == (), own.lines
    host.cgroup(EMBEDDING, populated=False)  # stopped before its engine began
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.07")
    assert code == 0 and run.decision.waited_for in ((), (EMBEDDING,)), run.lines
    assert run.decision.seconds < CGROUP_GRACE_USEC / 1e6 + 2, run.lines


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


def test_the_02_form_still_asks_the_service_and_says_to_migrate(host: Host) -> None:
    """`vllm-xpu-gate --unit %n ...` (the 0.2 drop-in) left on a host: a client, --unit ignored."""
    code, legacy = host.run(EMBEDDING, "--journal.units", "vllm*.service", "--lease-directory", "/run/vllm-xpu-gate",
                            "--gpu-memory-utilization", "0.07", legacy=STT)  # --unit is not believed
    assert code == 0, legacy.lines
    assert legacy.lines[0].startswith("vllm-xpu-gate: warning: the 0.2 drop-in's form"), legacy.lines
    assert gate_lines.is_legacy_line(legacy.lines[0])
    assert legacy.decision is not None and not legacy.decision.ungated, legacy.lines


def test_the_02_form_is_refused_once_the_services_legacy_grace_has_passed(host: Host) -> None:
    """With --legacy-grace 0s the service answers the 0.2 form's request with exit 1 and an error line
    naming the fix (systemd fails the start); a 0.3 client of the same unit is answered as before."""
    host.serve("--legacy-grace", "0s")
    code, legacy = host.run(EMBEDDING, "--gpu-memory-utilization", "0.07", legacy=EMBEDDING)
    assert code == 1, legacy.lines
    assert legacy.lines[-1].startswith("vllm-xpu-gate: error: the 0.2 drop-in is refused"), legacy.lines
    code, run = host.run(EMBEDDING, "--gpu-memory-utilization", "0.07")
    assert code == 0 and run.decision is not None, run.lines


# --- the exporter's metrics of the gate's decisions -----------------------------------------------------

def test_the_exporter_counts_the_gates_decisions_it_reads_in_the_units_journal(host: Host) -> None:
    """The client's stderr is the unit's journal (written here as journald would, under the client's pid)."""
    embedding = new_invocation_id()
    host.write([unit_starting(EMBEDDING, host.clock.tick(), invocation_id=embedding),
                *main_started(EMBEDDING, host.clock, embedding, 100)])
    timed_out = host.start(CHAT, "--gpu-memory-utilization", "0.07", "--timeout", "500ms", "--on-timeout", "fail")
    held = host.start(STT, "--gpu-memory-utilization", "0.07", "--timeout", "30s")
    assert timed_out.wait() == 1 and wait_for(lambda: held.saw(f"waiting for {EMBEDDING}"), timeout=20), held.lines
    host.write(init_completed(EMBEDDING, host.clock, embedding, 100))
    assert held.wait() == 0
    ungated = GateRun(EMBEDDING, subprocess.Popen([*GATE, "wait", "--socket", str(host.tmp / "none.sock"),
                                                   "--service-timeout", "500ms"], stderr=subprocess.PIPE,
                                                  env={"PYTHONPATH": str(REPO)}))
    assert ungated.wait() == 0 and ungated.decision.ungated, ungated.lines
    for run in (timed_out, held, ungated):
        invocation = new_invocation_id()
        host.write([unit_starting(run.unit, host.clock.tick(), invocation_id=invocation),
                    *(unit_output(run.unit, line, host.clock.tick(), pid=900, comm="vllm-xpu-gate",
                                  invocation_id=invocation) for line in run.lines)])
    with RunningExporter(["--no-collector.levelzero", "--no-collector.processes", "--journal.file",
                          str(host.journal)]) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and
                           sample(s, "xpu_unit_gate_waits_total", unit=STT) == 1 and s)
        assert samples, exporter.stderr
    assert {unit: sample(samples, "xpu_unit_gate_waits_total", unit=unit) for unit in (CHAT, STT, EMBEDDING)} == {
        CHAT: 1, STT: 1, EMBEDDING: 0}  # an ungated start is no wait
    assert sample(samples, "xpu_unit_gate_wait_seconds_total", unit=EMBEDDING) == 0
    assert {unit: sample(samples, "xpu_unit_gate_timeouts_total", unit=unit) for unit in (CHAT, STT)} == {
        CHAT: 1, STT: 0}
    for run in (timed_out, held):
        assert sample(samples, "xpu_unit_gate_wait_seconds_total", unit=run.unit) == pytest.approx(
            run.decision.seconds)
    assert sample(samples, "xpu_unit_engine_init_overlaps_total", unit=EMBEDDING) == 0
    assert {unit: sample(samples, "xpu_unit_gate_ungated_starts_total", unit=unit) for unit in (CHAT, STT, EMBEDDING)} \
        == {CHAT: 0, STT: 0, EMBEDDING: 1}


@pytest.mark.parametrize("log_format", ["logfmt", "json"])
def test_the_service_logs_as_the_exporter_does_in_the_log_format_asked(host: Host, log_format: str) -> None:
    """--log.format logfmt (the default) or json, each line with ts, level, source and msg, as the exporter's."""
    service = host.serve(*(["--log.format", "json"] if log_format == "json" else []))
    (line,) = [line for line in service.lines if "serving on" in line]
    if log_format == "json":
        fields = json.loads(line)
    else:
        fields = dict(re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', line))
        assert line.startswith("ts=") and fields["msg"].startswith('"vllm-xpu-gate ')
    assert fields["level"] == "info" and fields["source"] == "gate.cli" and fields["ts"].endswith("Z")

