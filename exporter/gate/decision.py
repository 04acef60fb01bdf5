"""The init gate's decision, a pure function: what holds a unit's start back on its GPU now (other watched
units initialising there, another unit holding the device's lease, too little free memory), from the
fold's unit views, the lease holder and a Level Zero memory reading."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_xpu_exporter import memory as memory_rules
from vllm_xpu_exporter.fold.engine_starts import UnitView
from vllm_xpu_exporter.gate import lines as gate_lines

if TYPE_CHECKING:
    from vllm_xpu_exporter.sources.levelzero.worker import DeviceMemory


@dataclass(frozen=True)
class Decision:
    """What holds the start back now: units (initialising, or holding the lease) and memory."""

    units: tuple[str, ...]
    memory_short: bool
    free_bytes: int | None
    needed_bytes: int | None

    @property
    def release(self) -> bool:
        return not self.units and not self.memory_short

    @property
    def waiting_for(self) -> tuple[str, ...]:
        return self.units + ((gate_lines.MEMORY,) if self.memory_short else ())


def decide(unit: str, device: str, views: Sequence[UnitView], lease_holder: str | None,
           devices_of_units: Mapping[str, set[str]] | None, memory: DeviceMemory | None,
           gpu_memory_utilization: float | None) -> Decision:
    """The decision for `unit` on `device`. `devices_of_units`: the devices each unit is known to use
    (None: one GPU, every unit is on it); a unit not in it counts on every device."""
    initialising = sorted((view.initialising_since_usec, view.unit) for view in views
                          if view.unit != unit and view.initialising_since_usec is not None
                          and device in (devices_of_units or {}).get(view.unit, {device}))
    units = [name for _, name in initialising]
    if lease_holder is not None and lease_holder != unit and lease_holder not in units:
        units.append(lease_holder)
    free = memory.free if memory is not None else None
    total = memory.total if memory is not None else None
    needed = memory_rules.requested_bytes(total, gpu_memory_utilization) if gpu_memory_utilization and total else None
    return Decision(tuple(units), needed is not None and free is not None and free < needed, free, needed)
