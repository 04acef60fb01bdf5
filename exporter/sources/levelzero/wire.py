"""What the Level Zero child and the exporter say to each other: JSON lines, each a dict, on the child's
stdin and stdout. What crosses is the binding's own dataclasses as dicts (`to_wire`), which the parent
rebuilds (`value_from_wire`):

    child -> {"ready": true, "devices": [DeviceIdentity, ...],           once, after init
              "loader": {COMPONENT: "major.minor.patch", ...}}
             {"ready": false, "error": ERROR}                             then exits
    parent -> "memory" | "processes"
    child -> {"devices": [{"pci_address": ..., "modules": [MemoryModuleProperties, ...] | null,
                           "states": [MemoryModule, ...] | null, "error": ERROR | null,
                           "core": CoreMemory | null, "core_error": ERROR | null,
                           "telemetry": {KIND: {"values": [READING, ...] | null, "error": ERROR | null}, ...}},
                          ...]}
             {"devices": [{"pci_address": ..., "processes": [ProcessMemory, ...] | null,
                           "error": ERROR | null}, ...]}
    ERROR = {"function": ..., "code": ...}  (a LevelZeroError; LoaderUnavailable adds "library", "reason")
    KIND, READING: a row of vllm_xpu_exporter.sources.levelzero.telemetry.KINDS, its name and value_type

A reading with an error carries what was read before the failure: when only zesMemoryGetState failed,
"modules" still lists the modules, sized by their properties (physicalSize), and "states" is null. The
memory answer carries the device telemetry too, so that a scrape costs one round trip; a child started
with NO_TELEMETRY sends an empty "telemetry".
"""

from __future__ import annotations

from typing import Any, TypeVar

from vllm_xpu_exporter.sources.levelzero.binding import LevelZeroError, LoaderUnavailable

NO_TELEMETRY = "--no-telemetry"  # the child's flag for a worker without telemetry
MEMORY = "memory"
PROCESSES = "processes"

Value = TypeVar("Value")


def to_wire(value: Any) -> dict[str, Any]:
    """`dataclasses.asdict` of the binding's readings, which are flat (no dataclass, list or dict in a
    field: tests/sources/test_sources_levelzero_worker.py checks every one), for a fraction of its cost: asdict
    copies every field recursively, which was three quarters of the child's time per scrape."""
    return dict(vars(value))


def value_from_wire(value_type: type[Value], wire: dict[str, Any]) -> Value:
    """The binding's dataclass back from its dict: a tuple field came as a JSON list."""
    return value_type(**{name: tuple(field) if isinstance(field, list) else field for name, field in wire.items()})


def error_to_wire(error: LevelZeroError) -> dict[str, Any]:
    if isinstance(error, LoaderUnavailable):
        return {"function": error.function, "code": error.code, "library": error.library, "reason": error.reason}
    return {"function": error.function, "code": error.code}


def error_from_wire(wire: dict[str, Any]) -> LevelZeroError:
    if "library" in wire:
        return LoaderUnavailable(str(wire["library"]), str(wire["reason"]))
    return LevelZeroError(str(wire["function"]), int(wire["code"]))
