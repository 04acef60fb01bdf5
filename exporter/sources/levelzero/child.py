"""The Level Zero child: the process that makes every Level Zero call, started and read by
`vllm_xpu_exporter.sources.levelzero.worker.LevelZeroWorker` over the wire format of
`vllm_xpu_exporter.sources.levelzero.wire`.

It initialises Level Zero once, says which devices it sees, then answers each request with every device's
reading. It enumerates each telemetry kind's components (`telemetry.KINDS`: engine groups, power domain,
sensors, frequency domains, RAS error sets) once, after init, and reads them at every request; a kind whose
enumeration failed answers that error every time (a new child, after a GPU change or a lost device, enumerates
again). A kind's reading is all or nothing: its values, or the first error. A kind without components of its
own (memory bandwidth) is read from the device-local modules the memory reading has just enumerated.

`python -m vllm_xpu_exporter.sources.levelzero.child LIBRARY [--no-telemetry]` runs it. It ends when the
process that started it ends, even in a driver call that never returns (a hung `zeInit`), where it would never
read its closed stdin.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from vllm_xpu_exporter.sources.levelzero.binding import (DEFAULT_LIBRARY, Device, LevelZero, LevelZeroError,
                                                         MemoryModuleProperties)
from vllm_xpu_exporter.sources.levelzero.telemetry import KINDS
from vllm_xpu_exporter.sources.levelzero.wire import MEMORY, NO_TELEMETRY, PROCESSES, error_to_wire, to_wire

Components = dict[str, "list[Any] | LevelZeroError"]


def _enumerate_telemetry(device: Device) -> Components:
    """Each telemetry kind's components of the device, or the error that stopped their enumeration."""
    components: Components = {}
    for kind in KINDS:
        if kind.components is None:
            continue
        try:
            components[kind.name] = kind.components(device)
        except LevelZeroError as error:
            components[kind.name] = error
    return components


def _read_kind(read: Callable[[], list[Any]]) -> dict[str, Any]:
    try:
        return {"values": [to_wire(value) for value in read()], "error": None}
    except LevelZeroError as error:
        return {"values": None, "error": error_to_wire(error)}


def _read_memory(device: Device, components: Components | None) -> dict[str, Any]:
    """The device's memory, and with `components` (None: the worker reads no telemetry) its telemetry."""
    reading: dict[str, Any] = {"modules": None, "states": None, "error": None}
    modules: list[MemoryModuleProperties] = []
    try:
        modules = device.memory_modules()
        reading["modules"] = [to_wire(module) for module in modules]  # the sizes stand if a state fails next
        reading["states"] = [to_wire(device.memory_state(module)) for module in modules]
    except LevelZeroError as error:
        reading["error"] = error_to_wire(error)
    reading["core"] = reading["core_error"] = None
    try:  # the core API's figures stand without Sysman (refused without CAP_PERFMON, or not enabled)
        core = device.core_memory()
        reading["core"] = None if core is None else to_wire(core)
    except LevelZeroError as error:
        reading["core_error"] = error_to_wire(error)
    reading["telemetry"] = telemetry = {}
    if components is None:
        return reading
    local_modules = [module for module in modules if module.device_local]
    for kind in KINDS:
        found = local_modules if kind.components is None else components[kind.name]
        if isinstance(found, LevelZeroError):
            telemetry[kind.name] = {"values": None, "error": error_to_wire(found)}
        else:
            telemetry[kind.name] = _read_kind(lambda: [kind.read(device, component) for component in found])
    return reading


def _read_processes(device: Device, components: Components | None) -> dict[str, Any]:
    reading: dict[str, Any] = {"processes": None, "error": None}
    try:
        reading["processes"] = [to_wire(process) for process in device.processes()]
    except LevelZeroError as error:
        reading["error"] = error_to_wire(error)
    return reading


_READERS: dict[str, Callable[[Device, Components | None], dict[str, Any]]] = {
    MEMORY: _read_memory, PROCESSES: _read_processes}


PARENT_POLL_S = 1.0


def end_with_parent(parent: int) -> None:
    """Exit once `parent` is no longer this process's parent (it ended: the child was handed to a reaper). A
    thread of its own: ctypes lets go of the interpreter during a driver call, so this runs beside a call that
    never returns. (PR_SET_PDEATHSIG would follow the parent's thread that started the child, not the parent.)"""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    try:
        threading.Thread(target=watch, daemon=True, name="levelzero-parent-watch").start()
    except RuntimeError:  # no thread to spare (a task limit): the parent's kill still ends it
        pass


def main(library: str, telemetry: bool = True) -> int:
    end_with_parent(os.getppid())
    out = sys.stdout

    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    try:
        level_zero = LevelZero(library)
        level_zero.init()
        devices = level_zero.devices()
        identities = [device.identity() for device in devices]
    except LevelZeroError as error:
        send({"ready": False, "error": error_to_wire(error)})
        return 0
    # Enumerated once per init, not per request.
    components = [_enumerate_telemetry(device) if telemetry else None for device in devices]
    send({"ready": True, "devices": [to_wire(identity) for identity in identities],
          "loader": level_zero.loader_versions()})

    for request in sys.stdin:
        read = _READERS.get(request.strip())
        if read is None:
            continue
        send({"devices": [{"pci_address": identity.pci_address, **read(device, found)}
                          for device, identity, found in zip(devices, identities, components)]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_LIBRARY, NO_TELEMETRY not in sys.argv))
