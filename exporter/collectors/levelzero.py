"""Device identity and device-local memory from Level Zero Sysman, DRM node names from udev."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from exporter.collectors import CollectionError, Collector
from exporter.scrape import Scrape
from exporter.sources import udev
from exporter.sources.levelzero_worker import DeviceMemory, LevelZeroWorker

log = logging.getLogger("exporter.levelzero")


class DrmNodeNames:
    """PCI address -> DRM node names, re-read from udev only after a DRM event (or while udev has none)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[str, udev.DrmNodes] | None = None
        self._watched = False
        self._logged_unavailable = False

    def invalidate(self) -> None:
        with self._lock:
            self._names = None

    def set_watched(self, watched: bool) -> None:
        self._watched = watched

    def get(self, pci_address: str) -> udev.DrmNodes:
        with self._lock:
            if self._names is None or not self._watched:
                self._names = self._read()
            return self._names.get(pci_address, udev.DrmNodes("", ""))

    def _read(self) -> dict[str, udev.DrmNodes]:
        try:
            names = udev.drm_nodes_by_pci()
        except udev.UdevUnavailable as error:
            if not self._logged_unavailable:
                log.warning("DRM node names unknown, card and render_node labels stay empty: %s", error)
                self._logged_unavailable = True
            return {}
        self._logged_unavailable = False
        return names


class LevelZeroCollector(Collector):
    name = "levelzero"
    description = "device identity and memory from Level Zero"

    def __init__(self, worker: LevelZeroWorker, watch_udev: bool = True) -> None:
        self._worker = worker
        self._drm_nodes = DrmNodeNames()
        self._untrusted_logged: set[str] = set()
        self._watcher = udev.DrmWatcher(self._on_drm_event) if watch_udev else None

    def start(self) -> None:
        if self._watcher is not None:
            self._drm_nodes.set_watched(self._watcher.start())

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()

    def _on_drm_event(self, action: str, pci_address: str | None) -> None:
        log.info("DRM device %s (%s): re-initialising Level Zero", action, pci_address or "unknown")
        self._drm_nodes.invalidate()
        self._worker.restart()

    def collect(self, scrape: Scrape) -> Iterator[Metric]:
        devices = scrape.device_memory()
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
        untrusted = all(state.free == state.size for state in device.local_states)
        pci = device.identity.pci_address
        if untrusted and pci not in self._untrusted_logged:
            self._untrusted_logged.add(pci)
            log.warning("device %s reports free == total memory: without CAP_PERFMON (or root) i915/xe hide real "
                        "usage; grant the exporter CAP_PERFMON", pci)
        return untrusted
