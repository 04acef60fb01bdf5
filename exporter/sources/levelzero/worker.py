"""Level Zero in a child process that the exporter can kill and restart: the parent's side.

Why a child: Debian's loader segfaults on any call after a failed zeInit (a failed init is final for
the process), a driver call can hang in the kernel, and the loader loads its drivers once per process,
so a re-plugged or re-bound GPU needs a fresh process. The child (`vllm_xpu_exporter.sources.levelzero.child`)
makes every Level Zero call; `LevelZeroWorker` starts it, asks it (`vllm_xpu_exporter.sources.levelzero.wire`),
bounds every answer by a timeout, and replaces it when it hangs, dies, loses a device or a GPU changes.
What a read gives: `DeviceMemory` (with the device's telemetry, `vllm_xpu_exporter.sources.levelzero.telemetry`)
and `DeviceProcesses`.
"""

from __future__ import annotations

import enum
import functools
import json
import logging
import os
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, NoReturn, TypeVar

from vllm_xpu_exporter.nodatayet import NoDataYet
from vllm_xpu_exporter.sources.levelzero.binding import (
    DEFAULT_LIBRARY,
    ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE,
    ZE_RESULT_ERROR_DEVICE_LOST,
    ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS,
    ZE_RESULT_ERROR_UNINITIALIZED,
    ZES_MEM_HEALTH_CRITICAL,
    ZES_MEM_HEALTH_DEGRADED,
    ZES_MEM_HEALTH_OK,
    ZES_MEM_HEALTH_REPLACE,
    ZES_MEM_HEALTH_UNKNOWN,
    CoreMemory,
    DeviceIdentity,
    LevelZeroError,
    LoaderUnavailable,
    MemoryModule,
    MemoryModuleProperties,
    ProcessMemory,
)
from vllm_xpu_exporter.sources.levelzero.telemetry import KINDS, DeviceTelemetry, TelemetryReading
from vllm_xpu_exporter.sources.levelzero.wire import MEMORY, NO_TELEMETRY, PROCESSES, error_from_wire, value_from_wire

log = logging.getLogger("vllm_xpu_exporter.levelzero")

# A real driver's zeInit can take seconds; a scrape does not wait for it, the child gets this long.
INIT_DEADLINE_S = 60.0
DEFAULT_TIMEOUT_S = 4.0  # a driver call that takes longer is taken for a hang
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
# A lost device needs a fresh zeInit: these per-device errors make the parent restart the child.
RESTART_CODES = frozenset({ZE_RESULT_ERROR_DEVICE_LOST, ZE_RESULT_ERROR_UNINITIALIZED})
# Why a read has no answer while a child is starting (within INIT_DEADLINE_S): LevelZeroStarting.
STILL_INITIALISING = "Level Zero is still initialising"
JUST_INITIALISED = "Level Zero has just initialised; the next scrape reads it"
INIT_HINTS = {
    ZE_RESULT_ERROR_UNINITIALIZED: " (no Level Zero GPU driver or no GPU: is Intel's compute runtime installed?)",
    ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS: " (no access to /dev/dri/renderD*: run the exporter in the render group)",
    ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE: " (the GPU driver is missing a dependency: check the kernel driver is loaded)",
}



class LevelZeroUnavailable(Exception):
    """Level Zero could not be read at all (no loader, init failed, the child hung or died).

    `error` is the LevelZeroError behind it, function and code as the child saw them, when a Level Zero
    call failed (None when the child hung, died or could not be started)."""

    def __init__(self, message: str, error: LevelZeroError | None = None) -> None:
        super().__init__(message)
        self.error = error


class LevelZeroStarting(LevelZeroUnavailable, NoDataYet):
    """Level Zero has no answer yet: the child is still initialising (within ``INIT_DEADLINE_S``), or has just
    initialised and this read would not have the time left to answer. No data yet, not a failure."""


class WorkerState(enum.Enum):
    """Where the parent's handle on the child is; every read starts from here."""

    IDLE = "idle"  # no child: none started yet, or stopped to be replaced (GPU change, lost device)
    INITIALISING = "initialising"  # a child runs and has not yet said whether Level Zero initialised
    READY = "ready"  # the child initialised Level Zero and answers reads
    BACKING_OFF = "backing off"  # the last child failed; the next one starts when the backoff ends


# The worst memory health of a device's modules counts: ok < unknown < degraded < critical < replace.
_HEALTH_ORDER = (ZES_MEM_HEALTH_OK, ZES_MEM_HEALTH_UNKNOWN, ZES_MEM_HEALTH_DEGRADED, ZES_MEM_HEALTH_CRITICAL,
                 ZES_MEM_HEALTH_REPLACE)


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory as one read saw it; a read that failed part-way keeps what came before.

    `modules` are the modules' properties (empty when they could not be enumerated; their handles are
    the child's). `states` has the state of each module, or is None when a state could not be read.
    `telemetry` comes with the same answer of the child. The figures summed over the modules are worked
    out once, when first asked for."""

    identity: DeviceIdentity
    modules: tuple[MemoryModuleProperties, ...]
    states: tuple[MemoryModule, ...] | None
    error: LevelZeroError | None
    telemetry: DeviceTelemetry = field(default_factory=DeviceTelemetry)
    core: CoreMemory | None = None  # the core API's total and usable memory (no Sysman needed)
    core_error: LevelZeroError | None = None

    @property
    def errors(self) -> tuple[LevelZeroError, ...]:
        """The memory error, the core API's and every telemetry kind's error."""
        errors = [kind.error for kind in self.telemetry.kinds().values()]
        return tuple(error for error in (self.error, self.core_error, *errors) if error is not None)

    @functools.cached_property
    def health(self) -> int | None:
        """The worst zes_mem_health_t of the device-local modules; None unless their states were read."""
        local = self.local_states
        if not local:
            return None
        return max((state.health for state in local),
                   key=lambda health: _HEALTH_ORDER.index(health) if health in _HEALTH_ORDER else 1)

    @functools.cached_property
    def local_states(self) -> tuple[MemoryModule, ...]:
        return tuple(state for state in self.states or () if state.device_local)

    @functools.cached_property
    def total(self) -> int | None:
        """Device-local memory size; None when no device-local module is known."""
        if self.states is not None:
            sizes = [state.size for state in self.local_states]
        else:  # the sizes stand without the states
            sizes = [module.physical_size for module in self.modules if module.device_local]
        return sum(sizes) if sizes else None

    @functools.cached_property
    def free(self) -> int | None:
        """Free device-local memory; None unless the state of every device-local module was read."""
        local = self.local_states
        return sum(state.free for state in local) if local else None

    @functools.cached_property
    def accounting_trusted(self) -> bool:
        """False when the driver cannot report real usage: free == total on every device-local module
        (i915/xe without CAP_PERFMON), or no module state was read."""
        local = self.local_states
        return bool(local) and not all(state.free == state.size for state in local)


@dataclass(frozen=True)
class DeviceProcesses:
    identity: DeviceIdentity
    processes: tuple[ProcessMemory, ...]
    error: LevelZeroError | None

    @property
    def errors(self) -> tuple[LevelZeroError, ...]:
        return () if self.error is None else (self.error,)


Reading = TypeVar("Reading", DeviceMemory, DeviceProcesses)


# ------------------------------------------------------------------------------------------ answers

def _memory_from_wire(identity: DeviceIdentity, reading: dict[str, Any]) -> DeviceMemory:
    states = reading["states"]
    telemetry = DeviceTelemetry({  # a worker without telemetry is sent none: every kind stays empty
        kind.name: TelemetryReading(tuple(value_from_wire(kind.value_type, value) for value in answer["values"] or ()),
                                    _reading_error(answer))
        for kind in KINDS if (answer := reading["telemetry"].get(kind.name))})
    core, core_error = reading.get("core"), reading.get("core_error")
    return DeviceMemory(identity,
                        tuple(MemoryModuleProperties(**module) for module in reading["modules"] or ()),
                        None if states is None else tuple(MemoryModule(**state) for state in states),
                        _reading_error(reading), telemetry,
                        None if core is None else CoreMemory(**core),
                        None if core_error is None else error_from_wire(core_error))


def _processes_from_wire(identity: DeviceIdentity, reading: dict[str, Any]) -> DeviceProcesses:
    return DeviceProcesses(identity, tuple(ProcessMemory(**process) for process in reading["processes"] or ()),
                           _reading_error(reading))


def _reading_error(reading: dict[str, Any]) -> LevelZeroError | None:
    return None if reading["error"] is None else error_from_wire(reading["error"])


# --------------------------------------------------------------------------------------- parent side

class LevelZeroWorker:
    """Parent-side handle on the Level Zero child. Thread-safe; every read is bounded by `timeout`."""

    def __init__(self, library: str = DEFAULT_LIBRARY, timeout: float = DEFAULT_TIMEOUT_S,
                 telemetry: bool = True, spawn: Callable[[bool], Any] | None = None) -> None:
        self.library = library
        # spawn(telemetry): the child started by another process (the privileged reader, which holds the
        # CAP_PERFMON this one has dropped), as much of a Popen as is used here; None: started here
        self.spawn = spawn
        self.timeout = timeout
        self.telemetry = telemetry  # False: memory readings come without telemetry (every kind empty)
        self._lock = threading.Lock()
        self._state = WorkerState.IDLE
        self._child: subprocess.Popen[bytes] | None = None  # INITIALISING, READY
        self._buffer = b""
        self._init_deadline = 0.0  # INITIALISING: when the child is given up
        self._devices: dict[str, DeviceIdentity] = {}  # READY: the child's devices by PCI address
        # the loader's components and versions, as the latest child to initialise said ({}: none said)
        self.loader_versions: dict[str, str] = {}
        self._failure: LevelZeroUnavailable | None = None  # BACKING_OFF: why
        self._retry_at = 0.0  # BACKING_OFF: when the next child may start
        self._backoff = BACKOFF_FIRST_S
        self._stale = threading.Event()  # set from any thread; the next read replaces the child
        self._unreaped: list[subprocess.Popen[bytes]] = []  # killed children no reaper thread could wait for
        self._pending: PendingRead[Any] | None = None  # READY: the request the child is answering

    @property
    def state(self) -> WorkerState:
        return self._state

    def start(self) -> None:
        """Spawn the child now, without waiting, so that the first scrape does not pay for its start.

        A child that cannot be started (EAGAIN under a task limit, EACCES, ENOMEM) is not an error here:
        the scrapes report it, and retry with the usual backoff."""
        with self._lock:
            if self._state is WorkerState.IDLE:
                try:
                    self._spawn()
                except LevelZeroUnavailable:
                    pass

    def gpu_changed(self, action: str, pci_address: str | None) -> None:
        """A GPU was plugged, removed or re-bound: Level Zero sees that only after a fresh init, in a new
        child, which the next read starts. Called on the udev watcher's thread, so it only marks the child
        stale (no lock, no process work); a burst of events before that read makes one restart."""
        if self._stale.is_set():
            log.debug("DRM device %s (%s): Level Zero is already due for re-initialising", action,
                      pci_address or "unknown")
            return
        self._stale.set()
        log.info("DRM device %s (%s): re-initialising Level Zero at the next scrape", action,
                 pci_address or "unknown")

    def read_memory(self) -> list[DeviceMemory]:
        return self.request_memory().result()

    def read_memory_when_ready(self) -> list[DeviceMemory]:
        """read_memory() once the child has initialised (a program that reads once, not a scrape that may come
        back): LevelZeroUnavailable when it cannot, within INIT_DEADLINE_S."""
        while True:
            try:
                return self.read_memory()
            except LevelZeroStarting:
                time.sleep(0.05)

    def read_processes(self) -> list[DeviceProcesses]:
        return self._request(PROCESSES, _processes_from_wire).result()

    def request_memory(self) -> PendingRead[DeviceMemory]:
        """Ask the child for every device's memory and telemetry now, and read the answer later (its
        `result()`): the child works while the caller does something else."""
        return self._request(MEMORY, _memory_from_wire)

    def close(self) -> None:
        with self._lock:
            self._stop_child()

    def _request(self, what: str, from_wire: Callable[[DeviceIdentity, dict[str, Any]], Reading]
                 ) -> PendingRead[Reading]:
        """Send one request; its answer must come within `timeout` all told (the child's init and its
        answer). Reads come one scrape at a time (vllm_xpu_exporter.scrape); the lock orders them against start()
        and close()."""
        with self._lock:
            deadline = time.monotonic() + self.timeout
            if self._pending is not None:
                try:
                    self._answer(self._pending)  # an answer nobody read would be taken for the next one's
                except LevelZeroUnavailable:
                    pass  # the child is given up: _ready() below says why
            if self._stale.is_set():
                self._stale.clear()  # cleared first: an event from now on makes one more restart
                self._stop_child()
                self._backoff = BACKOFF_FIRST_S
            initialised_before = self._state is WorkerState.READY
            self._ready(deadline)
            if not initialised_before and deadline - time.monotonic() < self.timeout / 2:
                # A slow init used up this scrape's time; reading now could only time out and kill it.
                raise LevelZeroStarting(JUST_INITIALISED)
            assert self._child is not None and self._child.stdin is not None
            try:
                self._child.stdin.write(what.encode() + b"\n")
                self._child.stdin.flush()
            except OSError as error:
                self._fail(f"Level Zero child is gone: {error}")
            self._pending = PendingRead(self, from_wire, deadline)
            return self._pending

    def _answer(self, pending: PendingRead[Reading]) -> list[Reading]:
        """The answer to `pending`, the request in flight (lock held)."""
        if pending is not self._pending:
            raise LevelZeroUnavailable("Level Zero was restarted before it answered")
        self._pending = None
        answer = self._receive(pending.deadline)
        if answer is None:
            self._fail(f"Level Zero did not answer within {self.timeout:g}s (driver hang?)")
        try:
            readings = [pending.from_wire(self._devices[reading["pci_address"]], reading)
                        for reading in answer["devices"]]
        except (KeyError, TypeError, ValueError) as error:
            self._fail(f"Level Zero child sent a malformed answer ({type(error).__name__}: {error})")
        if any(error.code in RESTART_CODES for reading in readings for error in reading.errors):
            # Answer this scrape with what there is; the next one re-initialises.
            self._stop_child()
        self._backoff = BACKOFF_FIRST_S
        return readings

    def _ready(self, deadline: float) -> None:
        """Bring the child to READY, or raise LevelZeroUnavailable saying why it is not."""
        if self._state is WorkerState.BACKING_OFF:
            assert self._failure is not None
            if time.monotonic() < self._retry_at:
                raise LevelZeroUnavailable(str(self._failure), self._failure.error)
            self._state, self._failure = WorkerState.IDLE, None
        if self._state is WorkerState.IDLE:
            self._spawn()
        if self._state is WorkerState.INITIALISING:
            ready = self._receive(deadline)
            if ready is None:
                if time.monotonic() < self._init_deadline:
                    raise LevelZeroStarting(STILL_INITIALISING)
                self._fail(f"Level Zero initialisation did not finish within {INIT_DEADLINE_S:g}s (driver hang?)")
            self._devices = self._devices_in(ready)
            self._state = WorkerState.READY

    def _devices_in(self, ready: dict[str, Any]) -> dict[str, DeviceIdentity]:
        """The devices of the child's first message by PCI address; else fail saying why it has none."""
        try:
            if ready["ready"]:
                identities = [DeviceIdentity(**identity) for identity in ready["devices"]]
                loader = ready.get("loader") or {}
                self.loader_versions = {str(name): str(version) for name, version in loader.items()}
                return {identity.pci_address: identity for identity in identities}
            error = error_from_wire(ready["error"])
        except (KeyError, TypeError, ValueError) as malformed:
            self._fail(f"Level Zero child sent a malformed message ({type(malformed).__name__}: {malformed})")
        # LoaderUnavailable's message says what is wrong; a driver's result code may need a hint.
        hint = "" if isinstance(error, LoaderUnavailable) else INIT_HINTS.get(error.code, "")
        self._fail(f"Level Zero initialisation failed: {error}{hint}", error)

    def _spawn(self) -> None:
        package_root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        self._reap_finished()
        try:
            if self.spawn is not None:
                child = self.spawn(self.telemetry)
            else:
                child = subprocess.Popen(
                    [sys.executable, "-m", "vllm_xpu_exporter.sources.levelzero.child", self.library,
                     *([] if self.telemetry else [NO_TELEMETRY])],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                    # `-m` puts the working directory first on the child's sys.path: the gate's is the gated
                    # unit's WorkingDirectory=, which may be its user's
                    cwd="/", start_new_session=True)
        except OSError as error:
            self._fail(f"cannot start the Level Zero child: {error}")
        self._child, self._buffer = child, b""
        self._init_deadline = time.monotonic() + INIT_DEADLINE_S
        self._state = WorkerState.INITIALISING
        try:
            threading.Thread(target=_drain_stderr, args=(child,), daemon=True, name="levelzero-stderr").start()
        except RuntimeError as error:  # "can't start new thread": a task limit; the child goes again
            self._fail(f"cannot start the Level Zero child's stderr reader: {error}")

    def _receive(self, deadline: float) -> dict[str, Any] | None:
        """The child's next message, or None when it has not answered by `deadline` (time.monotonic)."""
        child = self._child
        assert child is not None and child.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(child.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return None
                chunk = os.read(child.stdout.fileno(), 1 << 16)
                if not chunk:
                    self._fail(f"Level Zero child exited unexpectedly ({_describe_exit(child)})")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError:
            self._fail("Level Zero child sent garbage")
        if not isinstance(message, dict):
            self._fail("Level Zero child sent garbage")
        return message

    def _fail(self, message: str, error: LevelZeroError | None = None) -> NoReturn:
        """Give the child up and back off: no new child before the backoff ends."""
        self._stop_child()
        failure = LevelZeroUnavailable(message, error)
        self._state, self._failure = WorkerState.BACKING_OFF, failure
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)
        # The scrape logs the failure once; here only the detail of each retry.
        log.debug("%s (next try in %gs)", message, self._retry_at - time.monotonic())
        raise failure

    def _stop_child(self) -> None:
        """Back to IDLE: the child (if any) is killed, and the next read starts a new one."""
        child, self._child = self._child, None
        self._devices, self._pending = {}, None
        self._state, self._failure = WorkerState.IDLE, None
        if child is None:
            return
        if child.poll() is None:
            child.kill()
        # A child stuck in a driver call can take a while to die: reap it off the scrape path.
        try:
            threading.Thread(target=_reap, args=(child,), daemon=True, name="levelzero-reaper").start()
        except RuntimeError:  # no thread to spare (a task limit): reaped once it has died, at a later spawn
            self._unreaped.append(child)

    def _reap_finished(self) -> None:
        for child in list(self._unreaped):
            if child.poll() is not None:
                self._unreaped.remove(child)
                _close_streams(child)


class PendingRead(Generic[Reading]):
    """A request the Level Zero child is answering; `result()` waits for the answer (or raises
    LevelZeroUnavailable) the first time and gives the same answer every time after."""

    def __init__(self, worker: LevelZeroWorker, from_wire: Callable[[DeviceIdentity, dict[str, Any]], Reading],
                 deadline: float) -> None:
        self._worker = worker
        self.from_wire = from_wire
        self.deadline = deadline
        self._outcome: list[Reading] | LevelZeroUnavailable | None = None

    def result(self) -> list[Reading]:
        if self._outcome is None:
            with self._worker._lock:
                try:
                    self._outcome = self._worker._answer(self)
                except LevelZeroUnavailable as error:
                    self._outcome = error
        if isinstance(self._outcome, LevelZeroUnavailable):
            raise self._outcome
        return self._outcome


def _drain_stderr(child: subprocess.Popen[bytes]) -> None:
    for line in child.stderr:
        log.debug("child: %s", line.decode(errors="replace").rstrip())


def _reap(child: subprocess.Popen[bytes]) -> None:
    child.wait()
    _close_streams(child)


def _close_streams(child: subprocess.Popen[bytes]) -> None:
    for stream in (child.stdin, child.stdout, child.stderr):
        try:
            stream.close()
        except OSError:
            pass


def _describe_exit(child: subprocess.Popen[bytes]) -> str:
    try:
        code = child.wait(timeout=1)
    except subprocess.TimeoutExpired:
        return "still running"
    if getattr(child, "exit_unknown", False) and code == 0:
        return "exited"  # another process's child (privileged reader): its status is that process's
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"

