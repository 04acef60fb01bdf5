"""Device identity and device-local memory from Level Zero Sysman, DRM node names from udev.

A thin mapping: it reads Level Zero through the scrape context, and node names from udev's DrmNodeNames,
a source built, wired to the Level Zero worker and started with the other sources (exporter.collector)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from exporter.collector import CollectionError, Collector, ScrapeContext, Source, Sources, register
from exporter.sources import udev
from exporter.sources.levelzero_worker import DeviceMemory

if TYPE_CHECKING:
    from exporter.cli import Options

log = logging.getLogger("exporter.levelzero")


class LevelZeroCollector(Collector):
    name = "levelzero"

    def __init__(self, drm_nodes: udev.DrmNodeNames) -> None:
        self._drm_nodes = drm_nodes
        self._untrusted_logged: set[str] = set()

    def collect(self, context: ScrapeContext) -> Iterator[Metric]:
        devices = context.device_memory()
        info = GaugeMetricFamily("xpu_device_info", "GPU identity; card and render_node from udev, empty when unknown.",
                                 labels=["device", "name", "uuid", "driver_version", "card", "render_node"])
        total = GaugeMetricFamily("xpu_memory_total_bytes",
                                  "Device-local memory size, summed over the device's local memory modules.",
                                  labels=["device"])
        free = GaugeMetricFamily("xpu_memory_free_bytes", "Free device-local memory, as the driver reports it.",
                                 labels=["device"])
        used = GaugeMetricFamily("xpu_memory_used_bytes", "Device-local memory in use: total minus free.",
                                 labels=["device"])
        trusted = GaugeMetricFamily("xpu_memory_accounting_trusted",
                                    "0 when the driver cannot report real usage (free == total on every module: "
                                    "the exporter lacks CAP_PERFMON), else 1.", labels=["device"])
        failures = []
        for device in devices:
            pci = device.identity.pci_address
            if device.error:
                failures.append(f"{pci}: {device.error}")
            nodes = self._drm_nodes.get(pci)
            info.add_metric([pci, device.identity.name, device.identity.uuid, device.identity.driver_version,
                             nodes.card, nodes.render_node], 1)
            # No stale numbers: a figure that could not be read this scrape has no series.
            if device.total is not None:
                total.add_metric([pci], device.total)
            if device.total is not None and device.free is not None:
                free.add_metric([pci], device.free)
                used.add_metric([pci], device.total - device.free)
                trusted.add_metric([pci], 0 if self._untrusted(device) else 1)
        yield from (info, total, free, used, trusted)
        if failures:
            raise CollectionError("; ".join(failures))

    def _untrusted(self, device: DeviceMemory) -> bool:
        untrusted = not device.accounting_trusted
        pci = device.identity.pci_address
        if untrusted and pci not in self._untrusted_logged:
            self._untrusted_logged.add(pci)
            log.warning("device %s reports free == total memory: without CAP_PERFMON (or root) i915/xe hide real "
                        "usage; grant the exporter CAP_PERFMON", pci)
        return untrusted


@register("levelzero", "device identity and memory from Level Zero", needs=[Source.LEVELZERO])
def _levelzero_collector(options: Options, sources: Sources) -> LevelZeroCollector:
    assert sources.drm_nodes is not None, "built with Level Zero"
    return LevelZeroCollector(sources.drm_nodes)
