"""`/sd/vllm`: the watched units' vLLM API servers as Prometheus HTTP service discovery (`http_sd_configs`).

The processes collector finds, at each scrape, the endpoint of every unit with series of its own
(`vllm_xpu_exporter.sources.endpoints`) and publishes them here with the unit's labels; the route serves the
last published list, first running a scrape when none is younger than `max_age_seconds` (so that
discovery works without anyone scraping /metrics).

The body is http_sd's JSON: a list of groups `{"targets": ["host:port"], "labels": {...}}`, one per unit,
labelled `unit` and `device` as the exporter's own series are, `kind` and the container or pod labels that
`xpu_workload_info` gives (those that are known), `__scheme__` `https` for a server given a certificate, and
`__meta_vllm_xpu_transport` (`tcp` or `unix`), `__meta_vllm_xpu_found_by` (`socket` or `command line`),
`__meta_vllm_xpu_pid`. Prometheus cannot scrape a Unix socket: such a group's target is the socket's path,
which the documented scrape job drops (docs/discovery.md).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vllm_xpu_exporter.sources.containers import INFO_LABELS, Workload
from vllm_xpu_exporter.sources.endpoints import Endpoint

SD_PATH = "/sd/vllm"
CONTENT_TYPE = "application/json"
DEFAULT_MAX_AGE_SECONDS = 30.0


@dataclass(frozen=True)
class Target:
    """One unit's vLLM API endpoint and who the unit is."""

    endpoint: Endpoint
    workload: Workload
    device: str | None


def target_group(target: Target) -> dict[str, object]:
    """The http_sd group of one target."""
    labels = {name: value for name, value in zip(INFO_LABELS, target.workload.labels()) if value}
    if target.device:
        labels["device"] = target.device
    endpoint = target.endpoint
    if endpoint.scheme == "https":
        labels["__scheme__"] = "https"
    labels["__meta_vllm_xpu_transport"] = endpoint.transport
    labels["__meta_vllm_xpu_found_by"] = endpoint.found_by
    labels["__meta_vllm_xpu_pid"] = str(endpoint.pid)
    return {"targets": [endpoint.address], "labels": dict(sorted(labels.items()))}


def render(targets: Sequence[Target]) -> bytes:
    """The http_sd body, groups ordered by unit and address."""
    groups = [target_group(target) for target in
              sorted(targets, key=lambda t: (t.workload.unit, t.endpoint.address))]
    return (json.dumps(groups, indent=1) + "\n").encode("utf-8")


class VllmTargets:
    """The targets the last scrape found, shared between the scrape and the route."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS) -> None:
        self._clock = clock
        self._max_age = max_age_seconds
        self._lock = threading.Lock()
        self._targets: tuple[Target, ...] = ()
        self._published_at: float | None = None

    def publish(self, targets: Sequence[Target]) -> None:
        with self._lock:
            self._targets = tuple(targets)
            self._published_at = self._clock()

    def body(self, refresh: Callable[[], object]) -> bytes:
        """The http_sd body; `refresh` (a scrape, which publishes) runs first when nothing recent is known."""
        with self._lock:
            stale = self._published_at is None or self._clock() - self._published_at > self._max_age
        if stale:
            refresh()
        with self._lock:
            return render(self._targets)
