"""Level Zero in a child process that the exporter can kill and restart.

Why a child: Debian's loader segfaults on any call after a failed zeInit (a failed init is final for
the process), a driver call can hang in the kernel, and the loader loads its drivers once per process,
so a re-plugged or re-bound GPU needs a fresh process. The child speaks JSON lines on stdin/stdout, and
what crosses is the binding's own dataclasses as dicts (`_to_wire`), which the parent rebuilds:

    child -> {"ready": true, "devices": [DeviceIdentity, ...]}            once, after init
             {"ready": false, "error": ERROR}                             then exits
    parent -> "memory" | "processes"
    child -> {"devices": [{"pci_address": ..., "modules": [MemoryModuleProperties, ...] | null,
                           "states": [MemoryModule, ...] | null, "error": ERROR | null,
                           "telemetry": {KIND: {"values": [READING, ...] | null, "error": ERROR | null}, ...}},
                          ...]}
             {"devices": [{"pci_address": ..., "processes": [ProcessMemory, ...] | null,
                           "error": ERROR | null}, ...]}
    ERROR = {"function": ..., "code": ...}  (a LevelZeroError; LoaderUnavailable adds "library", "reason")
    KIND: READING = "engines": EngineActivity, "energy": EnergyCounter, "temperatures": Temperature,
                    "frequencies": Frequency, "memory_bandwidth": MemoryBandwidth, "ras": RasErrors

A reading with an error carries what was read before the failure: when only zesMemoryGetState failed,
"modules" still lists the modules, sized by their properties (physicalSize), and "states" is null.

The memory answer carries the device telemetry too, so that a scrape costs one round trip. The child
enumerates each telemetry kind's components (engine groups, power domain, sensors, frequency domains, RAS
error sets) once, after init, and reads them at every request; a kind whose enumeration failed answers
that error every time (a new child, after a GPU change or a lost device, enumerates again). A kind's
reading is all or nothing: its values, or the first error. Memory bandwidth is read from the device-local
modules the memory reading has just enumerated.

`python -m vllm_xpu_exporter.sources.levelzero.worker LIBRARY` runs the child side.
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
    ENGINE_GROUPS_ALL,
    FREQUENCY_DOMAINS,
    TEMPERATURE_SENSORS,
    ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE,
    ZE_RESULT_ERROR_DEVICE_LOST,
    ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS,
    ZE_RESULT_ERROR_UNINITIALIZED,
    ZES_MEM_HEALTH_CRITICAL,
    ZES_MEM_HEALTH_DEGRADED,
    ZES_MEM_HEALTH_OK,
    ZES_MEM_HEALTH_REPLACE,
    ZES_MEM_HEALTH_UNKNOWN,
    Device,
    DeviceIdentity,
    EnergyCounter,
    EngineActivity,
    Frequency,
    LevelZero,
    LevelZeroError,
    LoaderUnavailable,
    MemoryBandwidth,
    MemoryModule,
    MemoryModuleProperties,
    ProcessMemory,
    RasErrors,
    Temperature,
)

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


T = TypeVar("T")
Combined = TypeVar("Combined")

# The worst memory health of a device's modules counts: ok < unknown < degraded < critical < replace.
_HEALTH_ORDER = (ZES_MEM_HEALTH_OK, ZES_MEM_HEALTH_UNKNOWN, ZES_MEM_HEALTH_DEGRADED, ZES_MEM_HEALTH_CRITICAL,
                 ZES_MEM_HEALTH_REPLACE)


@dataclass(frozen=True)
class TelemetryReading(Generic[T]):
    """One telemetry kind of one device as one read saw it: every component's reading, or (values empty)
    the error that stopped it. No values and no error: the device has no component of the kind."""

    values: tuple[T, ...] = ()
    error: LevelZeroError | None = None


def _combine_placements(values: tuple[Any, ...], kind_of: Callable[[Any], int],
                        combine: Callable[[list[Any]], Combined]) -> dict[int, Combined]:
    """Per kind (engine group, sensor, domain, error type): the components on the device itself, else those on
    its sub-devices, combined into one figure for the device."""
    on_device: dict[int, list[Any]] = {}
    on_subdevices: dict[int, list[Any]] = {}
    for value in values:
        (on_subdevices if value.on_subdevice else on_device).setdefault(kind_of(value), []).append(value)
    return {kind: combine(on_device.get(kind) or on_subdevices[kind]) for kind in {**on_subdevices, **on_device}}


@dataclass(frozen=True)
class DeviceTelemetry:
    """A device's telemetry as one read saw it, kind by kind. A multi-tile device's components on its
    sub-devices stand for the device only where it has none of that kind itself: counters are then summed,
    temperatures and frequencies are their maximum, and a throttle reason of any tile counts."""

    engines: TelemetryReading[EngineActivity] = field(default_factory=TelemetryReading)
    energy: TelemetryReading[EnergyCounter] = field(default_factory=TelemetryReading)
    temperatures: TelemetryReading[Temperature] = field(default_factory=TelemetryReading)
    frequencies: TelemetryReading[Frequency] = field(default_factory=TelemetryReading)
    memory_bandwidth: TelemetryReading[MemoryBandwidth] = field(default_factory=TelemetryReading)
    ras: TelemetryReading[RasErrors] = field(default_factory=TelemetryReading)

    def kinds(self) -> dict[str, TelemetryReading[Any]]:
        """Every kind by its name in the wire format."""
        return {name: getattr(self, name) for name in _TELEMETRY_FROM_WIRE}

    def engine_active_us(self) -> dict[int, int]:
        """Microseconds busy by zes_engine_group_t."""
        return _combine_placements(self.engines.values, lambda engine: engine.group,
                                   lambda engines: sum(engine.active_time for engine in engines))

    def energy_uj(self) -> int | None:
        """Microjoules of the card's (else the package's) power domain; None without one."""
        return self.energy.values[0].energy if self.energy.values else None

    def temperatures_celsius(self) -> dict[int, float]:
        """Degrees Celsius by zes_temp_sensors_t."""
        return _combine_placements(self.temperatures.values, lambda sensor: sensor.sensor,
                                   lambda sensors: max(sensor.celsius for sensor in sensors))

    def frequencies_mhz(self) -> dict[int, tuple[float, int]]:
        """(actual MHz, negative when unknown; zes_freq_throttle_reason_flags_t) by zes_freq_domain_t."""
        def combine(domains: list[Frequency]) -> tuple[float, int]:
            throttled = 0
            for domain in domains:
                throttled |= domain.throttle_reasons
            return max(domain.actual for domain in domains), throttled
        return _combine_placements(self.frequencies.values, lambda domain: domain.domain, combine)

    def memory_traffic_bytes(self) -> tuple[int, int] | None:
        """(read, write) bytes summed over the device-local modules; None when there are no counters, or when
        every module reports zero traffic and no maximum bandwidth, which is not a reading (a driver bug on
        Arc: level-zero#440)."""
        modules = self.memory_bandwidth.values
        if not any(module.read_counter or module.write_counter or module.max_bandwidth for module in modules):
            return None
        return sum(module.read_counter for module in modules), sum(module.write_counter for module in modules)

    def ras_errors(self) -> dict[int, tuple[int, ...]]:
        """Error counts by zes_ras_error_cat_t, by zes_ras_error_type_t."""
        return _combine_placements(self.ras.values, lambda error_set: error_set.error_type,
                                   lambda sets: tuple(map(sum, zip(*(error_set.categories for error_set in sets)))))


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

    @property
    def errors(self) -> tuple[LevelZeroError, ...]:
        """The memory error and every telemetry kind's error."""
        errors = [kind.error for kind in self.telemetry.kinds().values()]
        return tuple(error for error in (self.error, *errors) if error is not None)

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


# ---------------------------------------------------------------------------------------- wire format

def _to_wire(value: Any) -> dict[str, Any]:
    """`dataclasses.asdict` of the binding's readings, which are flat (no dataclass, list or dict in a
    field: tests/test_sources_levelzero_worker.py checks every one), for a fraction of its cost: asdict
    copies every field recursively, which was three quarters of the child's time per scrape."""
    return dict(vars(value))


def _error_to_wire(error: LevelZeroError) -> dict[str, Any]:
    if isinstance(error, LoaderUnavailable):
        return {"function": error.function, "code": error.code, "library": error.library, "reason": error.reason}
    return {"function": error.function, "code": error.code}


def _error_from_wire(wire: dict[str, Any]) -> LevelZeroError:
    if "library" in wire:
        return LoaderUnavailable(str(wire["library"]), str(wire["reason"]))
    return LevelZeroError(str(wire["function"]), int(wire["code"]))


_TELEMETRY_FROM_WIRE: dict[str, Callable[[dict[str, Any]], Any]] = {
    "engines": lambda value: EngineActivity(**value),
    "energy": lambda value: EnergyCounter(**value),
    "temperatures": lambda value: Temperature(**value),
    "frequencies": lambda value: Frequency(**value),
    "memory_bandwidth": lambda value: MemoryBandwidth(**value),
    "ras": lambda value: RasErrors(**{**value, "categories": tuple(value["categories"])}),
}


def _memory_from_wire(identity: DeviceIdentity, reading: dict[str, Any]) -> DeviceMemory:
    states = reading["states"]
    telemetry = DeviceTelemetry(**{  # a worker without telemetry is sent none: every kind stays empty
        kind: TelemetryReading(tuple(map(from_wire, wire["values"] or ())), _reading_error(wire))
        for kind, from_wire in _TELEMETRY_FROM_WIRE.items() if (wire := reading["telemetry"].get(kind))})
    return DeviceMemory(identity,
                        tuple(MemoryModuleProperties(**module) for module in reading["modules"] or ()),
                        None if states is None else tuple(MemoryModule(**state) for state in states),
                        _reading_error(reading), telemetry)


def _processes_from_wire(identity: DeviceIdentity, reading: dict[str, Any]) -> DeviceProcesses:
    return DeviceProcesses(identity, tuple(ProcessMemory(**process) for process in reading["processes"] or ()),
                           _reading_error(reading))


def _reading_error(reading: dict[str, Any]) -> LevelZeroError | None:
    return None if reading["error"] is None else _error_from_wire(reading["error"])


# ---------------------------------------------------------------------------------------- child side

def _power_domains(device: Device) -> list[Any]:
    domain = device.power_domain()
    return [] if domain is None else [domain]


# Telemetry kind -> (enumerate its components once, read one component). Engine groups, sensors and
# frequency domains are kept only of the kinds the exporter serves: the rest would cost a call each scrape.
_TELEMETRY: dict[str, tuple[Callable[[Device], list[Any]], Callable[[Device, Any], Any]]] = {
    "engines": (lambda device: [group for group in device.engine_groups() if group.group in ENGINE_GROUPS_ALL],
                Device.engine_activity),
    "energy": (_power_domains, Device.energy),
    "temperatures": (lambda device: [sensor for sensor in device.temperature_sensors()
                                     if sensor.sensor in TEMPERATURE_SENSORS], Device.temperature),
    "frequencies": (lambda device: [domain for domain in device.frequency_domains()
                                    if domain.domain in FREQUENCY_DOMAINS], Device.frequency),
    "ras": (Device.ras_error_sets, Device.ras_errors),
}

Components = dict[str, "list[Any] | LevelZeroError"]
NO_TELEMETRY = "--no-telemetry"  # the child's flag for a worker without telemetry


def _enumerate_telemetry(device: Device) -> Components:
    """Each telemetry kind's components of the device, or the error that stopped their enumeration."""
    components: Components = {}
    for kind, (enumerate_kind, _) in _TELEMETRY.items():
        try:
            components[kind] = enumerate_kind(device)
        except LevelZeroError as error:
            components[kind] = error
    return components


def _read_kind(read: Callable[[], list[Any]]) -> dict[str, Any]:
    try:
        return {"values": [_to_wire(value) for value in read()], "error": None}
    except LevelZeroError as error:
        return {"values": None, "error": _error_to_wire(error)}


def _read_memory(device: Device, components: Components | None) -> dict[str, Any]:
    """The device's memory, and with `components` (None: the worker reads no telemetry) its telemetry."""
    reading: dict[str, Any] = {"modules": None, "states": None, "error": None}
    modules: list[MemoryModuleProperties] = []
    try:
        modules = device.memory_modules()
        reading["modules"] = [_to_wire(module) for module in modules]  # the sizes stand if a state fails next
        reading["states"] = [_to_wire(device.memory_state(module)) for module in modules]
    except LevelZeroError as error:
        reading["error"] = _error_to_wire(error)
    reading["telemetry"] = telemetry = {}
    if components is None:
        return reading
    telemetry["memory_bandwidth"] = _read_kind(
        lambda: [device.memory_bandwidth(module) for module in modules if module.device_local])
    for kind, (_, read_one) in _TELEMETRY.items():
        found = components[kind]
        if isinstance(found, LevelZeroError):
            telemetry[kind] = {"values": None, "error": _error_to_wire(found)}
        else:
            telemetry[kind] = _read_kind(lambda: [read_one(device, component) for component in found])
    return reading


def _read_processes(device: Device, components: Components | None) -> dict[str, Any]:
    reading: dict[str, Any] = {"processes": None, "error": None}
    try:
        reading["processes"] = [_to_wire(process) for process in device.processes()]
    except LevelZeroError as error:
        reading["error"] = _error_to_wire(error)
    return reading


_READERS: dict[str, Callable[[Device, Components | None], dict[str, Any]]] = {
    "memory": _read_memory, "processes": _read_processes}


def _child_main(library: str, telemetry: bool = True) -> int:
    out = sys.stdout

    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    try:
        level_zero = LevelZero(library)
        level_zero.init()
        devices = level_zero.devices()
        identities = [device.identity() for device in devices]
    except LevelZeroError as error:
        send({"ready": False, "error": _error_to_wire(error)})
        return 0
    # Enumerated once per init, not per request.
    components = [_enumerate_telemetry(device) if telemetry else None for device in devices]
    send({"ready": True, "devices": [_to_wire(identity) for identity in identities]})

    for request in sys.stdin:
        read = _READERS.get(request.strip())
        if read is None:
            continue
        send({"devices": [{"pci_address": identity.pci_address, **read(device, found)}
                          for device, identity, found in zip(devices, identities, components)]})
    return 0


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

    def read_processes(self) -> list[DeviceProcesses]:
        return self._request("processes", _processes_from_wire).result()

    def request_memory(self) -> PendingRead[DeviceMemory]:
        """Ask the child for every device's memory and telemetry now, and read the answer later (its
        `result()`): the child works while the caller does something else."""
        return self._request("memory", _memory_from_wire)

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
                return {identity.pci_address: identity for identity in identities}
            error = _error_from_wire(ready["error"])
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
                    [sys.executable, "-m", "vllm_xpu_exporter.sources.levelzero.worker", self.library,
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


if __name__ == "__main__":
    raise SystemExit(_child_main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_LIBRARY, NO_TELEMETRY not in sys.argv))
