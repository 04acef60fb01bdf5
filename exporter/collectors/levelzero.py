"""Device identity, device-local memory and device telemetry from Level Zero Sysman, DRM node names from udev.

A thin mapping: it reads Level Zero (one answer of the Level Zero child carries the memory and the telemetry)
and the node names (udev's DrmNodeNames, built with Level Zero in `cli.build_sources` and wired to its worker)
through the scrape context; it keeps no source.

The telemetry families are those of the rows of `vllm_xpu_exporter.sources.levelzero.telemetry.KINDS`, served
in their order. A telemetry kind the driver does not support, or that needs more privilege than the exporter
has, is absent and logged once (at info, saying what would enable it); it does not make the collector fail.
Any other error of a kind does, as a failing memory query does."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from vllm_xpu_exporter.collector import CollectionError, Collector, ScrapeContext, Source, Sources, register
from vllm_xpu_exporter.families import CounterFamily, GaugeFamily
from vllm_xpu_exporter.sources.levelzero import binding as ze
from vllm_xpu_exporter.sources.levelzero.telemetry import KINDS, DeviceTelemetry, Family, TelemetryKind
from vllm_xpu_exporter.sources.levelzero.worker import DeviceMemory

log = logging.getLogger("vllm_xpu_exporter.levelzero")

HEALTH_STATES = {
    "ok": ze.ZES_MEM_HEALTH_OK,
    "degraded": ze.ZES_MEM_HEALTH_DEGRADED,
    "critical": ze.ZES_MEM_HEALTH_CRITICAL,
    "replace": ze.ZES_MEM_HEALTH_REPLACE,
    "unknown": ze.ZES_MEM_HEALTH_UNKNOWN,
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
        core_total = GaugeFamily("xpu_memory_core_total_bytes",
                                 "Device memory as the Level Zero core API (the user-mode driver) reports it "
                                 "(zeDeviceGetMemoryProperties): the total torch and vLLM multiply by "
                                 "gpu_memory_utilization, about 0.95 of xpu_memory_total_bytes.", labels=["device"])
        usable = GaugeFamily("xpu_memory_usable_bytes",
                             "The device memory usable now, from the core API's usable-memory extension "
                             "(currUsableMemSize, no Sysman nor CAP_PERFMON needed): the free memory vLLM reads; "
                             "only where the driver lists the extension.", labels=["device"])
        failures = []
        for device in devices:
            pci = device.identity.pci_address
            if device.error:
                failures.append(f"{pci}: {device.error}")
            if device.core_error:
                failures.append(f"{pci}: {device.core_error}")
            if device.core is not None:
                core_total.add_metric([pci], device.core.total)
                if device.core.usable is not None:
                    usable.add_metric([pci], device.core.usable)
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
        yield from (info, total, free, used, trusted, health, core_total, usable)
        yield from self._telemetry(devices, failures)
        if failures:
            raise CollectionError("; ".join(failures))

    def _telemetry(self, devices: list[DeviceMemory], failures: list[str]) -> Iterator[Metric]:
        """Every kind of telemetry.KINDS as its row says: its families, in the rows' order, and their samples."""
        families = {kind.name: [_family(family) for family in kind.families] for kind in KINDS}
        for device in devices:
            pci = device.identity.pci_address
            self._check_kinds(pci, device.telemetry, failures)
            for kind in KINDS:
                values = device.telemetry[kind.name].values  # a failed kind has none, so it gives no series
                kind_families = families[kind.name]
                sampled = False
                for index, labels, value in kind.samples(values):
                    kind_families[index].add_metric((pci, *labels), value)
                    sampled = True
                if values and not sampled and kind.no_samples_means:
                    self._log_unavailable(pci, kind, kind.no_samples_means)
        for kind_families in families.values():
            yield from kind_families

    def _check_kinds(self, pci: str, telemetry: DeviceTelemetry, failures: list[str]) -> None:
        """An unsupported or forbidden kind is logged once; any other failure of a kind is the collector's."""
        for kind in KINDS:
            error = telemetry[kind.name].error
            if error is None:
                continue
            if error.code not in UNAVAILABLE:
                failures.append(f"{pci}: {error}")
            elif error.code == ze.ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS:
                self._log_unavailable(pci, kind, f"{error}: the exporter needs {kind.privilege} for them")
            else:
                self._log_unavailable(pci, kind, f"{error}: this GPU or its driver does not have them "
                                      "(a newer kernel or compute-runtime may)")

    def _log_unavailable(self, pci: str, kind: TelemetryKind, why: str) -> None:
        if (pci, kind.name) in self._unavailable_logged:
            return
        self._unavailable_logged.add((pci, kind.name))
        names = [family.name for family in kind.families]
        log.info("device %s: no %s (%s); %s absent", pci, kind.what, why,
                 " and ".join(names) + (" are" if len(names) > 1 else " is"))

    def _untrusted(self, device: DeviceMemory) -> bool:
        untrusted = not device.accounting_trusted
        pci = device.identity.pci_address
        if untrusted and pci not in self._untrusted_logged:
            self._untrusted_logged.add(pci)
            log.warning("device %s reports free == total memory: without CAP_PERFMON (or root) i915/xe hide real "
                        "usage; grant the exporter CAP_PERFMON", pci)
        return untrusted


def _family(family: Family) -> CounterFamily | GaugeFamily:
    kind = CounterFamily if family.type == "counter" else GaugeFamily
    return kind(family.name, family.help, labels=["device", *family.labels])


@register("levelzero", "device identity, memory and telemetry from Level Zero", needs=[Source.LEVELZERO_TELEMETRY])
def _levelzero_collector(options: None, sources: Sources) -> LevelZeroCollector:
    return LevelZeroCollector()
