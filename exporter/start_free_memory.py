"""The free-memory truth check (pure): the free device memory an engine said it saw at its start, against
what the driver said at that moment.

vLLM sizes its KV cache from the free memory its runtime reports at start (0.16+ demands free ≥
gpu_memory_utilization × total); a runtime that misreports it (free = 0 on an idle card, as some XPU driver
and runtime releases did) fails the start, or sizes the cache wrong. The journal has vLLM's figure (the
start-up summary "Free memory on device (F/T GiB) on startup", the insufficient-free-memory failure, the
reserved-budget line); Level Zero has the driver's, read at each scrape. The scrape nearest the line, within
`MATCH_SECONDS`, stands for "that moment": its free memory plus what the unit itself held then (the engine
prints its line after it took memory: the start-up summary after loading its weights and KV cache), and its
total less what every other process held then (the attributed rest). A start read from the journal long
after its line (a catch-up) has no driver figure.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

MATCH_SECONDS = 60.0  # a driver reading this close to vLLM's line stands for the moment it printed
KEEP_SECONDS = 300.0  # readings kept per device (the journal may fold a line some scrapes after it was written)
MAX_READINGS = 256  # per device, whatever the scrape rate


@dataclass(frozen=True)
class DeviceReading:
    """One scrape's view of a device: wall-clock time, free and total bytes (Level Zero), each unit's memory
    on it and all processes' memory the per-process sources see (`attributed_total`)."""

    at_usec: int
    free: int
    total: int
    by_unit: Mapping[str, int]
    attributed_total: int


@dataclass(frozen=True)
class FreeAtStart:
    """Free memory at a start, as vLLM saw it and as the driver did: Level Zero's free plus the unit's own,
    and the total less what the other processes held."""

    vllm: int
    levelzero: int
    total_less_attributed: int


def free_at_start(unit: str, seen_by_vllm: int, reading: DeviceReading) -> FreeAtStart:
    own = reading.by_unit.get(unit, 0)
    others = max(0, reading.attributed_total - own)
    return FreeAtStart(seen_by_vllm, reading.free + own, max(0, reading.total - others))


class Readings:
    """The devices' recent readings, oldest first."""

    def __init__(self, keep_seconds: float = KEEP_SECONDS) -> None:
        self._keep_usec = int(keep_seconds * 1e6)
        self._by_device: dict[str, deque[DeviceReading]] = {}

    def add(self, device: str, reading: DeviceReading) -> None:
        readings = self._by_device.setdefault(device, deque(maxlen=MAX_READINGS))
        readings.append(reading)
        while readings and readings[0].at_usec < reading.at_usec - self._keep_usec:
            readings.popleft()

    def nearest(self, device: str, at_usec: int, within_seconds: float = MATCH_SECONDS) -> DeviceReading | None:
        """The reading of `device` closest in time to `at_usec`, if one is within `within_seconds`."""
        best = min(self._by_device.get(device, ()), key=lambda reading: abs(reading.at_usec - at_usec), default=None)
        if best is None or abs(best.at_usec - at_usec) > within_seconds * 1e6:
            return None
        return best
