"""Device identity, device-local memory and device telemetry from Level Zero Sysman, DRM node names from udev.

A thin mapping: it reads Level Zero (one answer of the Level Zero child carries the memory and the telemetry)
and the node names (udev's DrmNodeNames, built with Level Zero in `cli.build_sources` and wired to its worker)
through the scrape context; it keeps no source.

A telemetry kind the driver does not support, or that needs more privilege than the exporter has, is absent
and logged once (at info, saying what would enable it); it does not make the collector fail. Any other error
of a kind does, as a failing memory query does."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from vllm_xpu_exporter.collector import CollectionError, Collector, ScrapeContext, Source, Sources, register
from vllm_xpu_exporter.families import CounterFamily, GaugeFamily
from vllm_xpu_exporter.sources.levelzero import binding as ze
from vllm_xpu_exporter.sources.levelzero.worker import DeviceMemory, DeviceTelemetry

log = logging.getLogger("vllm_xpu_exporter.levelzero")

ENGINES = {
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
HEALTH_STATES = {
    "ok": ze.ZES_MEM_HEALTH_OK,
    "degraded": ze.ZES_MEM_HEALTH_DEGRADED,
    "critical": ze.ZES_MEM_HEALTH_CRITICAL,
    "replace": ze.ZES_MEM_HEALTH_REPLACE,
    "unknown": ze.ZES_MEM_HEALTH_UNKNOWN,
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

MICRO_PER_UNIT = 1e6  # µs per s, µJ per J (divided by, not multiplied by 1e-6: 100000 µs is 0.1 s exactly)
HZ_PER_MHZ = 1e6

# Telemetry kind -> (what it gives, its metrics, the privilege that reads it: for the log line of a permission
# error). compute-runtime on Linux wants CAP_SYS_ADMIN for engine activity (compute-runtime#707); where it
# refuses anything else, root reads it.
KIND_METRICS = {
    "engines": ("engine activity", "xpu_engine_active_seconds_total", "CAP_SYS_ADMIN (or root)"),
    "energy": ("energy", "xpu_energy_joules_total", "root"),
    "temperatures": ("temperatures", "xpu_temperature_celsius", "root"),
    "frequencies": ("frequencies", "xpu_frequency_hertz and xpu_frequency_throttled", "root"),
    "memory_bandwidth": ("memory bandwidth", "xpu_memory_read_bytes_total and xpu_memory_write_bytes_total", "root"),
    "ras": ("RAS error counters", "xpu_ras_errors_total", "root"),
}
UNAVAILABLE = frozenset({ze.ZE_RESULT_ERROR_UNSUPPORTED_FEATURE, ze.ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS})


class LevelZeroCollector(Collector):
    name = "levelzero"

    def __init__(self) -> None:
        self._untrusted_logged: set[str] = set()
        self._unavailable_logged: set[tuple[str, str]] = set()  # (device, kind)

    def collect(self, context: ScrapeContext) -> Iterator[Metric]:
        devices = context.device_memory()
        info = GaugeFamily("xpu_device_info", "GPU identity; card and render_node from udev, empty when unknown.",
                           labels=["device", "name", "uuid", "driver_version", "card", "render_node"])
        total = GaugeFamily("xpu_memory_total_bytes",
                            "Device-local memory size, summed over the device's local memory modules.",
                            labels=["device"])
        free = GaugeFamily("xpu_memory_free_bytes", "Free device-local memory, as the driver reports it.",
                           labels=["device"])
        used = GaugeFamily("xpu_memory_used_bytes", "Device-local memory in use: total minus free.",
                           labels=["device"])
        trusted = GaugeFamily("xpu_memory_accounting_trusted",
                              "0 when the driver cannot report real usage (free == total on every module: "
                              "the exporter lacks CAP_PERFMON), else 1.", labels=["device"])
        health = GaugeFamily("xpu_memory_health",
                             "1 for the device-local memory's health state (the worst of its modules), else 0.",
                             labels=["device", "state"])
        failures = []
        for device in devices:
            pci = device.identity.pci_address
            if device.error:
                failures.append(f"{pci}: {device.error}")
            nodes = context.drm_nodes(pci)
            info.add_metric([pci, device.identity.name, device.identity.uuid, device.identity.driver_version,
                             nodes.card, nodes.render_node], 1)
            # No stale numbers: a figure that could not be read this scrape has no series.
            if device.total is not None:
                total.add_metric([pci], device.total)
            if device.total is not None and device.free is not None:
                free.add_metric([pci], device.free)
                used.add_metric([pci], device.total - device.free)
                trusted.add_metric([pci], 0 if self._untrusted(device) else 1)
            if device.health is not None:
                for state, value in HEALTH_STATES.items():
                    health.add_metric([pci, state], 1 if device.health == value else 0)
        yield from (info, total, free, used, trusted, health)
        yield from self._telemetry(devices, failures)
        if failures:
            raise CollectionError("; ".join(failures))

    def _telemetry(self, devices: list[DeviceMemory], failures: list[str]) -> Iterator[Metric]:
        engine = CounterFamily("xpu_engine_active_seconds_total",
                               "Busy time of the engine group (every engine of its kind, zesEngineGetActivity).",
                               labels=["device", "engine"])
        energy = CounterFamily("xpu_energy_joules_total",
                               "Energy of the card's (else the package's) power domain (zesPowerGetEnergyCounter).",
                               labels=["device"])
        temperature = GaugeFamily("xpu_temperature_celsius", "Temperature of the sensor (the maximum it covers).",
                                  labels=["device", "sensor"])
        frequency = GaugeFamily("xpu_frequency_hertz", "Actual frequency of the domain.",
                                labels=["device", "domain"])
        throttled = GaugeFamily("xpu_frequency_throttled",
                                "1 while the driver reports the domain's frequency limited for the reason, else 0.",
                                labels=["device", "domain", "reason"])
        read = CounterFamily("xpu_memory_read_bytes_total", "Bytes read from device-local memory (zesMemoryGetBandwidth).",
                             labels=["device"])
        write = CounterFamily("xpu_memory_write_bytes_total",
                              "Bytes written to device-local memory (zesMemoryGetBandwidth).", labels=["device"])
        ras = CounterFamily("xpu_ras_errors_total", "RAS errors of the severity and category since the driver loaded.",
                            labels=["device", "severity", "category"])
        for device in devices:
            pci = device.identity.pci_address
            telemetry = device.telemetry  # a failed kind has no values, so it gives no series
            self._check_kinds(pci, telemetry, failures)
            for group, active_us in sorted(telemetry.engine_active_us().items()):
                if group in ENGINES:
                    engine.add_metric([pci, ENGINES[group]], active_us / MICRO_PER_UNIT)
            energy_uj = telemetry.energy_uj()
            if energy_uj is not None:
                energy.add_metric([pci], energy_uj / MICRO_PER_UNIT)
            for sensor, celsius in sorted(telemetry.temperatures_celsius().items()):
                if sensor in SENSORS:
                    temperature.add_metric([pci, SENSORS[sensor]], celsius)
            for domain, (actual_mhz, reasons) in sorted(telemetry.frequencies_mhz().items()):
                if domain not in DOMAINS:
                    continue
                if actual_mhz >= 0:  # negative: the driver does not know
                    frequency.add_metric([pci, DOMAINS[domain]], actual_mhz * HZ_PER_MHZ)
                for reason, flag in THROTTLE_REASONS.items():
                    throttled.add_metric([pci, DOMAINS[domain], reason], 1 if reasons & flag else 0)
            traffic = telemetry.memory_traffic_bytes()
            if traffic is not None:
                read.add_metric([pci], traffic[0])
                write.add_metric([pci], traffic[1])
            elif telemetry.memory_bandwidth.values:
                self._log_unavailable(pci, "memory_bandwidth", "every module reports 0 bytes and no maximum "
                                      "bandwidth, which is a driver bug (Arc: level-zero#440), not a reading")
            for error_type, counts in sorted(telemetry.ras_errors().items()):
                if error_type in SEVERITIES:
                    for category, index in CATEGORIES.items():
                        ras.add_metric([pci, SEVERITIES[error_type], category], counts[index])
        yield from (engine, energy, temperature, frequency, throttled, read, write, ras)

    def _check_kinds(self, pci: str, telemetry: DeviceTelemetry, failures: list[str]) -> None:
        """An unsupported or forbidden kind is logged once; any other failure of a kind is the collector's."""
        for kind, reading in telemetry.kinds().items():
            error = reading.error
            if error is None:
                continue
            if error.code not in UNAVAILABLE:
                failures.append(f"{pci}: {error}")
            elif error.code == ze.ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS:
                self._log_unavailable(pci, kind, f"{error}: the exporter needs {KIND_METRICS[kind][2]} for them")
            else:
                self._log_unavailable(pci, kind, f"{error}: this GPU or its driver does not have them "
                                      "(a newer kernel or compute-runtime may)")

    def _log_unavailable(self, pci: str, kind: str, why: str) -> None:
        if (pci, kind) in self._unavailable_logged:
            return
        self._unavailable_logged.add((pci, kind))
        what, metrics, _ = KIND_METRICS[kind]
        log.info("device %s: no %s (%s); %s absent", pci, what, why, metrics + (" are" if " and " in metrics else " is"))

    def _untrusted(self, device: DeviceMemory) -> bool:
        untrusted = not device.accounting_trusted
        pci = device.identity.pci_address
        if untrusted and pci not in self._untrusted_logged:
            self._untrusted_logged.add(pci)
            log.warning("device %s reports free == total memory: without CAP_PERFMON (or root) i915/xe hide real "
                        "usage; grant the exporter CAP_PERFMON", pci)
        return untrusted


@register("levelzero", "device identity, memory and telemetry from Level Zero", needs=[Source.LEVELZERO_TELEMETRY])
def _levelzero_collector(options: None, sources: Sources) -> LevelZeroCollector:
    return LevelZeroCollector()
