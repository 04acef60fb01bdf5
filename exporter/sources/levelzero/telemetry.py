"""Device telemetry from Level Zero Sysman: each kind declared once, as one row of `KINDS`.

A row holds everything about a kind: how the Level Zero child finds its components (once per init) and reads
one of them (`vllm_xpu_exporter.sources.levelzero.child`), the binding's dataclass that one reading is (it
crosses the pipe as that dataclass's fields, `vllm_xpu_exporter.sources.levelzero.wire`), the metric families
it gives and their samples (the levelzero collector builds and fills them, in the order of the rows), and the
privilege a driver may want for it (said in the log line of a permission error).

A multi-tile device's components on its sub-devices stand for the device only where it has none of that kind
itself (`_combined`): counters are then summed, temperatures and frequencies are their maximum, and a throttle
reason of any tile counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from vllm_xpu_exporter.sources.levelzero import binding as ze
from vllm_xpu_exporter.sources.levelzero.binding import (Device, EnergyCounter, EngineActivity, Frequency,
                                                         LevelZeroError, MemoryBandwidth, RasErrors, Temperature)

T = TypeVar("T")
Combined = TypeVar("Combined")

MICRO_PER_UNIT = 1e6  # µs per s, µJ per J (divided by, not multiplied by 1e-6: 100000 µs is 0.1 s exactly)
HZ_PER_MHZ = 1e6


@dataclass(frozen=True)
class Family:
    """A metric family a kind gives, as the collector builds it: every family has a `device` label first."""

    type: str  # "counter" or "gauge"
    name: str
    help: str
    labels: tuple[str, ...] = ()  # after `device`


# One sample of a kind's families: (the family's index in TelemetryKind.families, label values after `device`, value)
Sample = tuple[int, tuple[str, ...], float]


@dataclass(frozen=True)
class TelemetryKind:
    """One telemetry kind: what the child calls, what crosses the pipe, and the metrics it becomes."""

    name: str  # in the wire format, and a key of DeviceTelemetry
    what: str  # for the log: "device 0000:03:00.0: no <what> (...)"
    value_type: type  # the binding's dataclass of one component's reading
    # The device's components of the kind, enumerated once per init; None: the device-local memory modules
    # that the memory reading of the same request enumerated.
    components: Callable[[Device], list[Any]] | None
    read: Callable[[Device, Any], Any]  # one component's reading
    families: tuple[Family, ...]
    samples: Callable[[tuple[Any, ...]], Iterable[Sample]]  # the device's samples from its readings of the kind
    privilege: str = "root"  # what reads it where the driver refuses the exporter
    # When readings give no sample, why that is no reading (logged once per device); None: not logged.
    no_samples_means: str | None = None


@dataclass(frozen=True)
class TelemetryReading(Generic[T]):
    """One telemetry kind of one device as one read saw it: every component's reading, or (values empty)
    the error that stopped it. No values and no error: the device has no component of the kind."""

    values: tuple[T, ...] = ()
    error: LevelZeroError | None = None


NO_READING: TelemetryReading[Any] = TelemetryReading()


@dataclass(frozen=True)
class DeviceTelemetry:
    """A device's telemetry as one read saw it, by kind name (a worker that reads no telemetry has none)."""

    readings: Mapping[str, TelemetryReading[Any]] = field(default_factory=dict, hash=False)

    def __getitem__(self, kind: str) -> TelemetryReading[Any]:
        return self.readings.get(kind, NO_READING)

    def kinds(self) -> dict[str, TelemetryReading[Any]]:
        """Every kind of KINDS by its name, in their order."""
        return {kind.name: self[kind.name] for kind in KINDS}


def _combined(values: tuple[Any, ...], kind_of: Callable[[Any], int],
              combine: Callable[[list[Any]], Combined]) -> list[tuple[int, Combined]]:
    """Per kind (engine group, sensor, domain, error type), in its order: the components on the device itself,
    else those on its sub-devices, combined into one figure for the device."""
    on_device: dict[int, list[Any]] = {}
    on_subdevices: dict[int, list[Any]] = {}
    for value in values:
        (on_subdevices if value.on_subdevice else on_device).setdefault(kind_of(value), []).append(value)
    return sorted((kind, combine(on_device.get(kind) or on_subdevices[kind]))
                  for kind in {**on_subdevices, **on_device})


# --------------------------------------------------------------------------------------------------- the kinds

ENGINES = {  # zes_engine_group_t -> label: the groups that combine every engine of a kind
    ze.ZES_ENGINE_GROUP_ALL: "all",
    ze.ZES_ENGINE_GROUP_COMPUTE_ALL: "compute",
    ze.ZES_ENGINE_GROUP_RENDER_ALL: "render",
    ze.ZES_ENGINE_GROUP_MEDIA_ALL: "media",
    ze.ZES_ENGINE_GROUP_COPY_ALL: "copy",
    ze.ZES_ENGINE_GROUP_3D_ALL: "3d",
    ze.ZES_ENGINE_GROUP_3D_RENDER_COMPUTE_ALL: "3d_render_compute",
}
SENSORS = {ze.ZES_TEMP_SENSORS_GLOBAL: "global", ze.ZES_TEMP_SENSORS_GPU: "gpu", ze.ZES_TEMP_SENSORS_MEMORY: "memory"}
DOMAINS = {ze.ZES_FREQ_DOMAIN_GPU: "gpu", ze.ZES_FREQ_DOMAIN_MEMORY: "memory", ze.FREQ_DOMAIN_MEDIA: "media"}
THROTTLE_REASONS = {
    "average_power": ze.ZES_FREQ_THROTTLE_REASON_FLAG_AVE_PWR_CAP,
    "burst_power": ze.ZES_FREQ_THROTTLE_REASON_FLAG_BURST_PWR_CAP,
    "current": ze.ZES_FREQ_THROTTLE_REASON_FLAG_CURRENT_LIMIT,
    "thermal": ze.ZES_FREQ_THROTTLE_REASON_FLAG_THERMAL_LIMIT,
    "psu": ze.ZES_FREQ_THROTTLE_REASON_FLAG_PSU_ALERT,
    "software_range": ze.ZES_FREQ_THROTTLE_REASON_FLAG_SW_RANGE,
    "hardware_range": ze.ZES_FREQ_THROTTLE_REASON_FLAG_HW_RANGE,
}
SEVERITIES = {ze.ZES_RAS_ERROR_TYPE_CORRECTABLE: "correctable", ze.ZES_RAS_ERROR_TYPE_UNCORRECTABLE: "uncorrectable"}
CATEGORIES = {  # label -> index in zes_ras_state_t.category
    "reset": ze.ZES_RAS_ERROR_CAT_RESET,
    "programming": ze.ZES_RAS_ERROR_CAT_PROGRAMMING_ERRORS,
    "driver": ze.ZES_RAS_ERROR_CAT_DRIVER_ERRORS,
    "compute": ze.ZES_RAS_ERROR_CAT_COMPUTE_ERRORS,
    "non_compute": ze.ZES_RAS_ERROR_CAT_NON_COMPUTE_ERRORS,
    "cache": ze.ZES_RAS_ERROR_CAT_CACHE_ERRORS,
    "display": ze.ZES_RAS_ERROR_CAT_DISPLAY_ERRORS,
}


def _engine_samples(values: tuple[EngineActivity, ...]) -> Iterator[Sample]:
    for group, active_us in _combined(values, lambda engine: engine.group,
                                      lambda engines: sum(engine.active_time for engine in engines)):
        if group in ENGINES:
            yield 0, (ENGINES[group],), active_us / MICRO_PER_UNIT


def _power_domains(device: Device) -> list[ze.PowerDomain]:
    """The card's power domain, else the package's (Device.power_domain): one at most."""
    domain = device.power_domain()
    return [] if domain is None else [domain]


def _energy_samples(values: tuple[EnergyCounter, ...]) -> Iterator[Sample]:
    for counter in values[:1]:
        yield 0, (), counter.energy / MICRO_PER_UNIT


def _temperature_samples(values: tuple[Temperature, ...]) -> Iterator[Sample]:
    for sensor, celsius in _combined(values, lambda sensor: sensor.sensor,
                                     lambda sensors: max(sensor.celsius for sensor in sensors)):
        if sensor in SENSORS:
            yield 0, (SENSORS[sensor],), celsius


def _frequency_samples(values: tuple[Frequency, ...]) -> Iterator[Sample]:
    def combine(domains: list[Frequency]) -> tuple[float, int]:
        throttled = 0
        for domain in domains:
            throttled |= domain.throttle_reasons
        return max(domain.actual for domain in domains), throttled

    for domain, (actual_mhz, reasons) in _combined(values, lambda domain: domain.domain, combine):
        if domain not in DOMAINS:
            continue
        if actual_mhz >= 0:  # negative: the driver does not know
            yield 0, (DOMAINS[domain],), actual_mhz * HZ_PER_MHZ
        for reason, flag in THROTTLE_REASONS.items():
            yield 1, (DOMAINS[domain], reason), 1 if reasons & flag else 0


def _memory_traffic_samples(values: tuple[MemoryBandwidth, ...]) -> Iterator[Sample]:
    """Read and written bytes summed over the device-local modules; none when every module reports zero traffic
    and no maximum bandwidth, which is not a reading (a driver bug on Arc: level-zero#440)."""
    if any(module.read_counter or module.write_counter or module.max_bandwidth for module in values):
        yield 0, (), sum(module.read_counter for module in values)
        yield 1, (), sum(module.write_counter for module in values)


def _ras_samples(values: tuple[RasErrors, ...]) -> Iterator[Sample]:
    def combine(sets: list[RasErrors]) -> tuple[int, ...]:
        return tuple(map(sum, zip(*(error_set.categories for error_set in sets))))

    for error_type, counts in _combined(values, lambda error_set: error_set.error_type, combine):
        if error_type in SEVERITIES:
            for category, index in CATEGORIES.items():
                yield 0, (SEVERITIES[error_type], category), counts[index]


# The kinds, in the order the collector serves their families. Engine groups, sensors and frequency domains are
# kept only of the kinds served (their label maps above): the rest would cost a driver call each scrape.
# compute-runtime on Linux wants CAP_SYS_ADMIN for engine activity (compute-runtime#707); where it refuses
# anything else, root reads it.
KINDS: tuple[TelemetryKind, ...] = (
    TelemetryKind(
        "engines", "engine activity", EngineActivity,
        lambda device: [group for group in device.engine_groups() if group.group in ENGINES], Device.engine_activity,
        (Family("counter", "xpu_engine_active_seconds_total",
                "Busy time of the engine group (every engine of its kind, zesEngineGetActivity).", ("engine",)),),
        _engine_samples, privilege="CAP_SYS_ADMIN (or root)"),
    TelemetryKind(
        "energy", "energy", EnergyCounter, _power_domains, Device.energy,
        (Family("counter", "xpu_energy_joules_total",
                "Energy of the card's (else the package's) power domain (zesPowerGetEnergyCounter)."),),
        _energy_samples),
    TelemetryKind(
        "temperatures", "temperatures", Temperature,
        lambda device: [sensor for sensor in device.temperature_sensors() if sensor.sensor in SENSORS],
        Device.temperature,
        (Family("gauge", "xpu_temperature_celsius", "Temperature of the sensor (the maximum it covers).",
                ("sensor",)),),
        _temperature_samples),
    TelemetryKind(
        "frequencies", "frequencies", Frequency,
        lambda device: [domain for domain in device.frequency_domains() if domain.domain in DOMAINS],
        Device.frequency,
        (Family("gauge", "xpu_frequency_hertz", "Actual frequency of the domain.", ("domain",)),
         Family("gauge", "xpu_frequency_throttled",
                "1 while the driver reports the domain's frequency limited for the reason, else 0.",
                ("domain", "reason"))),
        _frequency_samples),
    TelemetryKind(
        "memory_bandwidth", "memory bandwidth", MemoryBandwidth, None, Device.memory_bandwidth,
        (Family("counter", "xpu_memory_read_bytes_total",
                "Bytes read from device-local memory (zesMemoryGetBandwidth)."),
         Family("counter", "xpu_memory_write_bytes_total",
                "Bytes written to device-local memory (zesMemoryGetBandwidth).")),
        _memory_traffic_samples,
        no_samples_means="every module reports 0 bytes and no maximum bandwidth, which is a driver bug "
                         "(Arc: level-zero#440), not a reading"),
    TelemetryKind(
        "ras", "RAS error counters", RasErrors, Device.ras_error_sets, Device.ras_errors,
        (Family("counter", "xpu_ras_errors_total", "RAS errors of the severity and category since the driver loaded.",
                ("severity", "category")),),
        _ras_samples),
)
