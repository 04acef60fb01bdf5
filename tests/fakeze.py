"""Test helper for the fake Level Zero driver in tests/fakeze/fake_ze.c.

The real Level Zero loader loads the fake driver when a process starts with the
environment from :func:`fake_driver_env`. The driver reads its config file on every
call, so a test can change its behaviour mid-run with :func:`write_config` (atomic).

    driver = build_fake_driver(tmp_dir)                     # once per test session
    write_config(config_path, FakeConfig(devices=(A770, B580)))
    env = {**os.environ, **fake_driver_env(driver, config_path)}
    subprocess.run([...], env=env)                          # a fresh process per scenario

Level Zero initialisation is per process (a failed zeInit is final): run every scenario
in a fresh process, never in the pytest process itself.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from sizes import GiB, MiB

FAKE_DRIVER_SOURCE = Path(__file__).resolve().parent / "fakeze" / "fake_ze.c"
FAKE_DRIVER_NAME = "libze_fake.so"
COMPILE_COMMAND = ("gcc", "-shared", "-fPIC", "-fvisibility=hidden", "-O1", "-Wall", "-Werror")

INTEL_VENDOR_ID = 0x8086
DEFAULT_NAME = "Intel(R) Graphics (FAKE)"
DEFAULT_DRIVER_VERSION = "1.3.0-fake"
DEFAULT_DEVICE_ID = 0x56A0
ZE_DEVICE_TYPE_GPU = 1
ZE_DEVICE_TYPE_CPU = 2
ZES_MEM_HEALTH_OK = 1
ZES_ENGINE_TYPE_FLAG_COMPUTE = 2
ZES_ENGINE_GROUP_ALL = 0
ZES_ENGINE_GROUP_COMPUTE_ALL = 1
ZES_ENGINE_GROUP_MEDIA_ALL = 2
ZES_ENGINE_GROUP_COPY_ALL = 3
ZES_ENGINE_GROUP_COMPUTE_SINGLE = 4
ZES_ENGINE_GROUP_3D_RENDER_COMPUTE_ALL = 11
ZES_ENGINE_GROUP_RENDER_ALL = 12
ZES_ENGINE_GROUP_3D_ALL = 13
ZES_TEMP_SENSORS_GLOBAL = 0
ZES_TEMP_SENSORS_GPU = 1
ZES_TEMP_SENSORS_MEMORY = 2
ZES_TEMP_SENSORS_GLOBAL_MIN = 3
ZES_FREQ_DOMAIN_GPU = 0
ZES_FREQ_DOMAIN_MEMORY = 1
ZES_FREQ_DOMAIN_MEDIA = 2  # later headers than the installed 1.4 one
ZES_RAS_ERROR_TYPE_CORRECTABLE = 0
ZES_RAS_ERROR_TYPE_UNCORRECTABLE = 1

Result = str | int
"""A ze_result_t: its name ("ZE_RESULT_ERROR_DEVICE_LOST") or its number."""


@dataclass(frozen=True)
class FakeMemoryModule:
    """A memory module; size and free are what zesMemoryGetState reports."""

    size: int
    free: int
    device_local: bool = True
    physical_size: int | None = None  # zes_mem_properties_t.physicalSize; None: same as size
    health: int = ZES_MEM_HEALTH_OK
    type: int | None = None  # zes_mem_type_t; None: GDDR6 for device memory, DDR for system memory
    # (readCounter, writeCounter, maxBandwidth) of zesMemoryGetBandwidth; None: ZE_RESULT_ERROR_UNSUPPORTED_FEATURE
    bandwidth: tuple[int, int, int] | None = None
    # zeDeviceGetMemoryProperties' totalSize of a device module (the core API's, what vLLM multiplies);
    # None: floor(0.95 x size), as the user-mode driver reports against the kernel's
    core_size: int | None = None


@dataclass(frozen=True)
class FakeProcess:
    pid: int
    mem_size: int
    shared_size: int = 0
    engines: int = ZES_ENGINE_TYPE_FLAG_COMPUTE


@dataclass(frozen=True)
class FakeEngine:
    group: int  # zes_engine_group_t
    active_us: int  # zes_engine_stats_t.activeTime
    subdevice: int | None = None  # None: on the device itself


@dataclass(frozen=True)
class FakePower:
    energy_uj: int  # zes_power_energy_counter_t.energy
    card: bool = False  # the domain zesDeviceGetCardPowerDomain returns
    subdevice: int | None = None


@dataclass(frozen=True)
class FakeTemperature:
    sensor: int  # zes_temp_sensors_t
    celsius: float
    subdevice: int | None = None


@dataclass(frozen=True)
class FakeFrequency:
    domain: int  # zes_freq_domain_t
    actual_mhz: float
    throttle: int = 0  # zes_freq_throttle_reason_flags_t
    subdevice: int | None = None


@dataclass(frozen=True)
class FakeRas:
    type: int  # zes_ras_error_type_t
    # counts by zes_ras_error_cat_t: reset, programming, driver, compute, non_compute, cache, display
    categories: tuple[int, int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0, 0)
    subdevice: int | None = None


#: The telemetry kinds of the fake driver, as its config names them.
TELEMETRY_KINDS = ("engines", "power", "temperature", "frequency", "ras")


@dataclass(frozen=True)
class FakeDevice:
    pci_address: str  # "0000:03:00.0"
    name: str = DEFAULT_NAME
    uuid: bytes | None = None  # 16 bytes; None: default_uuid(pci_address, device_id)
    driver_version: str = DEFAULT_DRIVER_VERSION
    device_id: int = DEFAULT_DEVICE_ID
    device_type: int = ZE_DEVICE_TYPE_GPU
    memory: Sequence[FakeMemoryModule] = ()
    processes: Sequence[FakeProcess] = ()
    memory_modules_result: Result = "ZE_RESULT_SUCCESS"  # zesDeviceEnumMemoryModules
    memory_state_result: Result = "ZE_RESULT_SUCCESS"
    memory_state_hang: bool = False
    # currUsableMemSize of the usable-memory extension (FakeConfig.usable_memory_extension); None: the device
    # modules' free less what the core API keeps back (size - core size), as usable_memory() in fake_ze.c
    usable_memory: int | None = None
    processes_result: Result = "ZE_RESULT_SUCCESS"
    processes_hang: bool = False
    # The count query reports this many processes fewer than listed, as if they had
    # started between the caller's two calls of zesDeviceProcessesGetState.
    processes_count_lag: int = 0
    # Telemetry: none by default (the driver then lists no component of the kind).
    engines: Sequence[FakeEngine] = ()
    power: Sequence[FakePower] = ()
    temperatures: Sequence[FakeTemperature] = ()
    frequencies: Sequence[FakeFrequency] = ()
    ras: Sequence[FakeRas] = ()
    memory_bandwidth_result: Result = "ZE_RESULT_SUCCESS"  # zesMemoryGetBandwidth
    # What the reading of a kind returns (zesEngineGetActivity, zesPowerGetEnergyCounter, zesTemperatureGetState,
    # zesFrequencyGetState, zesRasGetState), and what its enumeration returns (zesDeviceEnum...), by kind
    # (TELEMETRY_KINDS): {"ras": "ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS"}
    telemetry_results: Mapping[str, Result] = field(default_factory=dict)
    telemetry_enum_results: Mapping[str, Result] = field(default_factory=dict)


@dataclass(frozen=True)
class FakeConfig:
    devices: Sequence[FakeDevice] = ()
    init_result: Result = "ZE_RESULT_SUCCESS"
    init_hang: bool = False
    usable_memory_extension: bool = False  # the driver lists (and answers) the usable-memory core extension


A770 = FakeDevice(
    pci_address="0000:03:00.0",
    name="Intel(R) Arc(TM) A770 Graphics",
    uuid=bytes(range(0x10, 0x20)),
    driver_version="1.3.24595",
    device_id=0x56A0,
    memory=(FakeMemoryModule(size=16 * GiB, free=13 * GiB),),
    processes=(FakeProcess(pid=1000, mem_size=2 * GiB), FakeProcess(pid=1001, mem_size=GiB, shared_size=64 * MiB)),
)
"""0000:03:00.0, 16 GiB, 3 GiB used by two processes."""

B580 = FakeDevice(
    pci_address="0000:83:00.0",
    name="Intel(R) Arc(TM) B580 Graphics",
    driver_version="1.6.32224",
    device_id=0xE20B,
    memory=(FakeMemoryModule(size=12 * GiB, free=11 * GiB),),
    processes=(FakeProcess(pid=2000, mem_size=GiB, engines=0x22),),
)
"""0000:83:00.0, 12 GiB, 1 GiB used by one process; default (derived) UUID."""

A770_TELEMETRY = replace(
    A770,
    memory=(FakeMemoryModule(size=16 * GiB, free=13 * GiB, bandwidth=(7_000_000_000, 3_000_000_000, 560_000_000_000)),),
    engines=(FakeEngine(ZES_ENGINE_GROUP_ALL, 90_000_000), FakeEngine(ZES_ENGINE_GROUP_COMPUTE_ALL, 80_000_000),
             FakeEngine(ZES_ENGINE_GROUP_RENDER_ALL, 5_000_000), FakeEngine(ZES_ENGINE_GROUP_MEDIA_ALL, 2_000_000),
             FakeEngine(ZES_ENGINE_GROUP_COPY_ALL, 12_500_000), FakeEngine(ZES_ENGINE_GROUP_3D_ALL, 250_000),
             FakeEngine(ZES_ENGINE_GROUP_3D_RENDER_COMPUTE_ALL, 85_000_000),
             FakeEngine(ZES_ENGINE_GROUP_COMPUTE_SINGLE, 40_000_000)),
    power=(FakePower(energy_uj=1_500_000_000, card=True), FakePower(energy_uj=1_200_000_000)),
    temperatures=(FakeTemperature(ZES_TEMP_SENSORS_GLOBAL, 71.5), FakeTemperature(ZES_TEMP_SENSORS_GPU, 68.0),
                  FakeTemperature(ZES_TEMP_SENSORS_MEMORY, 74.0), FakeTemperature(ZES_TEMP_SENSORS_GLOBAL_MIN, 40.0)),
    frequencies=(FakeFrequency(ZES_FREQ_DOMAIN_GPU, 2100.0, throttle=0b0001001),
                 FakeFrequency(ZES_FREQ_DOMAIN_MEMORY, 1093.0), FakeFrequency(ZES_FREQ_DOMAIN_MEDIA, 1050.0)),
    ras=(FakeRas(ZES_RAS_ERROR_TYPE_CORRECTABLE, (0, 0, 1, 5, 0, 2, 0)),
         FakeRas(ZES_RAS_ERROR_TYPE_UNCORRECTABLE, (1, 0, 0, 0, 0, 0, 0))),
)
"""A770 with every telemetry kind: every *_ALL engine group (and one single one, not reported), a card and a
package power domain, the three maximum temperature sensors (and a minimum one, not reported), the GPU, memory and
media frequency domains (the GPU throttled by average power and thermal limits), memory bandwidth counters and both
RAS error sets."""

B580_TELEMETRY = replace(
    B580,
    memory=(FakeMemoryModule(size=12 * GiB, free=11 * GiB, bandwidth=(1_000_000_000, 500_000_000, 456_000_000_000)),),
    engines=(FakeEngine(ZES_ENGINE_GROUP_ALL, 30_000_000), FakeEngine(ZES_ENGINE_GROUP_COMPUTE_ALL, 25_000_000),
             FakeEngine(ZES_ENGINE_GROUP_RENDER_ALL, 1_000_000), FakeEngine(ZES_ENGINE_GROUP_MEDIA_ALL, 3_000_000),
             FakeEngine(ZES_ENGINE_GROUP_COPY_ALL, 4_000_000), FakeEngine(ZES_ENGINE_GROUP_3D_ALL, 100_000),
             FakeEngine(ZES_ENGINE_GROUP_3D_RENDER_COMPUTE_ALL, 26_000_000)),
    power=(FakePower(energy_uj=800_000_000),),
    temperatures=(FakeTemperature(ZES_TEMP_SENSORS_GLOBAL, 55.0), FakeTemperature(ZES_TEMP_SENSORS_GPU, 52.5),
                  FakeTemperature(ZES_TEMP_SENSORS_MEMORY, 58.0)),
    frequencies=(FakeFrequency(ZES_FREQ_DOMAIN_GPU, 2850.0), FakeFrequency(ZES_FREQ_DOMAIN_MEMORY, 2375.0, throttle=0b1100000),
                 FakeFrequency(ZES_FREQ_DOMAIN_MEDIA, 1400.0)),
    ras=(FakeRas(ZES_RAS_ERROR_TYPE_CORRECTABLE, (0, 3, 0, 0, 1, 0, 0)),
         FakeRas(ZES_RAS_ERROR_TYPE_UNCORRECTABLE, (0, 0, 0, 0, 0, 0, 0))),
)
"""B580 with every telemetry kind and values other than A770_TELEMETRY's: no card power domain (the package's
serves), the memory domain throttled by the software and hardware ranges."""


def default_uuid(pci_address: str, device_id: int = DEFAULT_DEVICE_ID) -> bytes:
    """The UUID the fake driver gives a device without `uuid` (mirrors default_uuid() in fake_ze.c)."""
    domain, bus, device, function = parse_pci_address(pci_address)
    return (
        INTEL_VENDOR_ID.to_bytes(2, "little")
        + (device_id & 0xFFFF).to_bytes(2, "little")
        + bytes(2)
        + (domain & 0xFFFF).to_bytes(2, "little")
        + bytes([bus & 0xFF, device & 0xFF, function & 0xFF])
        + bytes(5)
    )


def parse_pci_address(pci_address: str) -> tuple[int, int, int, int]:
    """'0000:03:00.0' -> (domain, bus, device, function)."""
    domain, bus, rest = pci_address.split(":")
    device, function = rest.split(".")
    return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)


def render_config(config: FakeConfig) -> str:
    """The config file text in fake_ze.c's line format."""
    lines = [f"init_result {_result(config.init_result)}"]
    if config.init_hang:
        lines.append("init_hang")
    if config.usable_memory_extension:
        lines.append("usable_memory_extension")
    for device in config.devices:
        lines += _render_device(device)
    return "\n".join(lines) + "\n"


def write_config(path: Path, config: FakeConfig) -> None:
    """Write the config atomically (temporary file + rename): the driver may read it at any time."""
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            os.fchmod(file.fileno(), 0o644)  # readable by every user, as a real driver's files
            file.write(render_config(config))
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


class SharedDevice:
    """One fake GPU whose memory several processes take and give back, as vLLM engines do: each
    holder's share (by name, with its pid) is kept in a ledger beside the driver's config, and every
    change rewrites the config so that free = total - sum of the shares, each holder listed as a
    process with its share.

    The ledger (`<config>.ledger.json`) is read and written under an exclusive flock of
    `<config>.lock`: the config itself is replaced by rename on every write, so it cannot carry the
    lock. Shares of processes that died without giving their memory back (killed) are dropped at
    the next change, as the kernel driver frees a dead process's memory; only processes of the
    caller's pid namespace can be checked, so each share records its namespace.

        device = SharedDevice.create(config_path, A770)     # the test, once
        SharedDevice(config_path).hold("vllm-chat.service", 8 * GiB)  # a replayed engine
    """

    def __init__(self, config_path: Path) -> None:
        self.config_path = Path(config_path)
        self.ledger_path = self.config_path.with_name(self.config_path.name + ".ledger.json")
        self.lock_path = self.config_path.with_name(self.config_path.name + ".lock")

    @classmethod
    def create(cls, config_path: Path, device: FakeDevice, reserved: int = 0) -> SharedDevice:
        """Start a ledger for `device` (its first memory module is the shared memory; its `free` and
        `processes` are replaced by the shares), with nothing held. `reserved`: bytes in use with
        nothing running (a real GPU's driver keeps some; free == total reads as untrusted accounting)."""
        if not device.memory:
            raise ValueError("the device needs a memory module")
        shared = cls(config_path)
        shared.lock_path.touch()
        with shared._locked():
            shared._write({"device": _device_to_json(device), "held": {}, "reserved": int(reserved)})
        return shared

    @property
    def total(self) -> int:
        return self._read()["device"]["memory"][0]["size"]

    @property
    def core_total(self) -> int:
        """The shared module's total as the Level Zero core API reports it (zeDeviceGetMemoryProperties): its
        core_size, else 0.95 of its size, as the fake driver computes it."""
        module = self._read()["device"]["memory"][0]
        size = module["size"]
        return module["core_size"] if module.get("core_size") is not None else size // 100 * 95 + size % 100 * 95 // 100

    def free(self) -> int:
        with self._locked():
            return _free(self._current())

    def held(self) -> dict[str, int]:
        """Bytes held, by holder."""
        with self._locked():
            return {name: share["bytes"] for name, share in self._current()["held"].items()}

    def hold(self, holder: str, nbytes: int, pid: int | None = None) -> int:
        """Set `holder`'s share to `nbytes` (0 gives it all back); returns the free memory after."""
        with self._locked():
            ledger = self._current()
            if nbytes > 0:
                ledger["held"][holder] = {"bytes": int(nbytes), "pid": os.getpid() if pid is None else pid,
                                          "pid_namespace": _pid_namespace()}
            else:
                ledger["held"].pop(holder, None)
            self._write(ledger)
            return _free(ledger)

    def release(self, holder: str) -> int:
        return self.hold(holder, 0)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict:
        return json.loads(self.ledger_path.read_text())

    def _current(self) -> dict:
        """The ledger without the shares of dead processes (written back when there were some)."""
        ledger = self._read()
        if _drop_dead_holders(ledger):
            self._write(ledger)
        return ledger

    def _write(self, ledger: dict) -> None:
        write_config(self.config_path, FakeConfig(devices=(_device_with_shares(ledger),)))
        descriptor, temporary = tempfile.mkstemp(dir=self.ledger_path.parent, prefix=f".{self.ledger_path.name}.")
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                json.dump(ledger, file)
            os.replace(temporary, self.ledger_path)
        except BaseException:
            os.unlink(temporary)
            raise


def _pid_namespace() -> str:
    return os.readlink("/proc/self/ns/pid")


def _drop_dead_holders(ledger: dict) -> bool:
    namespace = _pid_namespace()
    dead = [name for name, share in ledger["held"].items()
            if share["pid_namespace"] == namespace and not Path(f"/proc/{share['pid']}").exists()]
    for name in dead:
        del ledger["held"][name]
    return bool(dead)


def _free(ledger: dict) -> int:
    held = sum(share["bytes"] for share in ledger["held"].values())
    return max(0, ledger["device"]["memory"][0]["size"] - ledger.get("reserved", 0) - held)


def _device_with_shares(ledger: dict) -> FakeDevice:
    device = _device_from_json(ledger["device"])
    memory = replace(device.memory[0], free=_free(ledger))
    processes = tuple(FakeProcess(pid=share["pid"], mem_size=share["bytes"]) for share in ledger["held"].values())
    return replace(device, memory=(memory, *device.memory[1:]), processes=processes)


def _device_to_json(device: FakeDevice) -> dict:
    fields = {name: getattr(device, name) for name in ("pci_address", "name", "driver_version", "device_id",
                                                       "device_type")}
    fields["uuid"] = device.uuid.hex() if device.uuid is not None else None
    fields["memory"] = [{"size": module.size, "device_local": module.device_local, "core_size": module.core_size}
                        for module in device.memory]
    return fields


def _device_from_json(fields: dict) -> FakeDevice:
    memory = tuple(FakeMemoryModule(size=module["size"], free=module["size"], device_local=module["device_local"],
                                    core_size=module.get("core_size")) for module in fields["memory"])
    uuid = bytes.fromhex(fields["uuid"]) if fields["uuid"] is not None else None
    return FakeDevice(pci_address=fields["pci_address"], name=fields["name"], uuid=uuid,
                      driver_version=fields["driver_version"], device_id=fields["device_id"],
                      device_type=fields["device_type"], memory=memory)


def build_fake_driver(directory: Path) -> Path:
    """Compile fake_ze.c into directory/libze_fake.so with gcc; returns its absolute path."""
    output = Path(directory).resolve() / FAKE_DRIVER_NAME
    command = [*COMPILE_COMMAND, "-o", str(output), str(FAKE_DRIVER_SOURCE)]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"building the fake Level Zero driver failed: {' '.join(command)}\n{completed.stderr}")
    return output


def fake_driver_env(driver_path: Path | Sequence[Path], config_path: Path) -> dict[str, str]:
    """Environment that makes the real loader use the fake driver(s) with this config.

    Several driver paths (copies of the library under different names) make the loader
    see several drivers.
    """
    paths = [driver_path] if isinstance(driver_path, (str, os.PathLike)) else list(driver_path)
    return {
        "ZE_ENABLE_ALT_DRIVERS": ",".join(str(Path(path).resolve()) for path in paths),
        "FAKE_ZE_CONFIG": str(Path(config_path).resolve()),
        "ZES_ENABLE_SYSMAN": "1",
    }


def _result(result: Result) -> str:
    if isinstance(result, int):
        return f"0x{result:08x}"
    if not result.startswith("ZE_RESULT_"):
        raise ValueError(f"not a ze_result_t name: {result!r}")
    return result


def _line_text(value: str, what: str) -> str:
    if "\n" in value or "\r" in value or value != value.strip() or not value:
        raise ValueError(f"{what} must be one line without surrounding blanks: {value!r}")
    return value


def _render_device(device: FakeDevice) -> list[str]:
    parse_pci_address(device.pci_address)
    lines = [
        f"device {device.pci_address}",
        f"name {_line_text(device.name, 'name')}",
        f"driver_version {_line_text(device.driver_version, 'driver_version')}",
        f"device_id 0x{device.device_id:04x}",
        f"device_type {device.device_type}",
    ]
    if device.uuid is not None:
        if len(device.uuid) != 16:
            raise ValueError(f"uuid must have 16 bytes, got {len(device.uuid)}")
        lines.append(f"uuid {device.uuid.hex()}")
    for module in device.memory:
        location = "device" if module.device_local else "system"
        options = [f"health={module.health}"]
        if module.physical_size is not None:
            options.append(f"physical_size={module.physical_size}")
        if module.type is not None:
            options.append(f"type={module.type}")
        if module.bandwidth is not None:
            read, write, max_bandwidth = module.bandwidth
            options += [f"read={read}", f"write={write}", f"max_bandwidth={max_bandwidth}"]
        if module.core_size is not None:
            options.append(f"core_size={module.core_size}")
        lines.append(f"memory {location} {module.size} {module.free} {' '.join(options)}")
    if device.usable_memory is not None:
        lines.append(f"usable_memory {device.usable_memory}")
    lines.append(f"memory_modules_result {_result(device.memory_modules_result)}")
    lines.append(f"memory_state_result {_result(device.memory_state_result)}")
    if device.memory_state_hang:
        lines.append("memory_state_hang")
    lines.append(f"processes_result {_result(device.processes_result)}")
    if device.processes_hang:
        lines.append("processes_hang")
    if device.processes_count_lag:
        lines.append(f"processes_count_lag {device.processes_count_lag}")
    lines += [
        f"process {process.pid} {process.mem_size} {process.shared_size} {process.engines}"
        for process in device.processes
    ]
    lines.append(f"memory_bandwidth_result {_result(device.memory_bandwidth_result)}")
    lines += [f"engine {engine.group} {engine.active_us}{_subdevice(engine.subdevice)}" for engine in device.engines]
    lines += [f"power {power.energy_uj}{' card' if power.card else ''}{_subdevice(power.subdevice)}"
              for power in device.power]
    lines += [f"temperature {sensor.sensor} {sensor.celsius!r}{_subdevice(sensor.subdevice)}"
              for sensor in device.temperatures]
    lines += [f"frequency {domain.domain} {domain.actual_mhz!r} throttle={domain.throttle}{_subdevice(domain.subdevice)}"
              for domain in device.frequencies]
    for error_set in device.ras:
        if len(error_set.categories) != 7:
            raise ValueError(f"a RAS error set has 7 category counts, got {len(error_set.categories)}")
        lines.append(f"ras {error_set.type} {' '.join(map(str, error_set.categories))}{_subdevice(error_set.subdevice)}")
    for results, suffix in ((device.telemetry_results, "result"), (device.telemetry_enum_results, "enum_result")):
        for kind, result in results.items():
            if kind not in TELEMETRY_KINDS:
                raise ValueError(f"not a telemetry kind: {kind!r} (one of {', '.join(TELEMETRY_KINDS)})")
            lines.append(f"{kind}_{suffix} {_result(result)}")
    return lines


def _subdevice(subdevice: int | None) -> str:
    return "" if subdevice is None else f" subdevice={subdevice}"


__all__ = [
    "A770",
    "A770_TELEMETRY",
    "B580",
    "B580_TELEMETRY",
    "FakeConfig",
    "FakeDevice",
    "FakeEngine",
    "FakeFrequency",
    "FakeMemoryModule",
    "FakePower",
    "FakeProcess",
    "FakeRas",
    "FakeTemperature",
    "GiB",
    "SharedDevice",
    "MiB",
    "build_fake_driver",
    "default_uuid",
    "fake_driver_env",
    "parse_pci_address",
    "render_config",
    "write_config",
]
