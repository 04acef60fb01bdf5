"""Level Zero in a child process that the exporter can kill and restart.

Why a child: Debian's loader segfaults on any call after a failed zeInit (a failed init is final for
the process), a driver call can hang in the kernel, and the loader loads its drivers once per process,
so a re-plugged or re-bound GPU needs a fresh process. The child speaks JSON lines on stdin/stdout:

    child -> {"ready": true, "devices": [identity, ...]}         once, after init
             {"ready": false, "error": "..."}                   then exits
    parent -> "memory" | "processes"
    child -> {"devices": [{"pci_address": ..., "memory": [[device_local, size, free], ...] | null,
                           "error": null | "..."}, ...]}          ("processes": [[pid, mem, shared], ...])

A reading with an error carries what was read before the failure: when only zesMemoryGetState failed,
"memory" still lists the modules, sized by their properties (physicalSize), with free null.

`python -m exporter.sources.levelzero_worker LIBRARY` runs the child side.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn

from exporter.sources.levelzero import DEFAULT_LIBRARY

log = logging.getLogger("exporter.levelzero")

# A real driver's zeInit can take seconds; a scrape does not wait for it, the child gets this long.
INIT_DEADLINE_S = 60.0
DEFAULT_TIMEOUT_S = 4.0  # a driver call that takes longer is taken for a hang
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
# A lost device needs a fresh zeInit: these per-device errors make the parent restart the child.
RESTART_ERRORS = ("ZE_RESULT_ERROR_DEVICE_LOST", "ZE_RESULT_ERROR_UNINITIALIZED")
INIT_HINTS = {
    "ZE_RESULT_ERROR_UNINITIALIZED": " (no Level Zero GPU driver or no GPU: is Intel's compute runtime installed?)",
    "ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS": " (no access to /dev/dri/renderD*: run the exporter in the render group)",
    "ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE": " (the GPU driver is missing a dependency: check the kernel driver is loaded)",
}


class LevelZeroUnavailable(Exception):
    """Level Zero could not be read at all (no loader, init failed, the child hung or died)."""


@dataclass(frozen=True)
class Identity:
    pci_address: str
    name: str
    uuid: str
    driver_version: str


@dataclass(frozen=True)
class MemoryReading:
    device_local: bool
    size: int
    free: int | None  # None: the module's state could not be read


@dataclass(frozen=True)
class ProcessReading:
    pid: int
    mem_size: int
    shared_size: int


@dataclass(frozen=True)
class DeviceMemory:
    identity: Identity
    modules: tuple[MemoryReading, ...]  # empty when they could not be enumerated
    error: str | None

    @property
    def local_modules(self) -> tuple[MemoryReading, ...]:
        return tuple(module for module in self.modules if module.device_local)

    @property
    def total(self) -> int | None:
        """Device-local memory size; None when no device-local module is known."""
        local = self.local_modules
        return sum(module.size for module in local) if local else None

    @property
    def free(self) -> int | None:
        """Free device-local memory; None unless the state of every device-local module was read."""
        frees = [module.free for module in self.local_modules]
        if not frees or None in frees:
            return None
        return sum(frees)


@dataclass(frozen=True)
class DeviceProcesses:
    identity: Identity
    processes: tuple[ProcessReading, ...]
    error: str | None


# ---------------------------------------------------------------------------------------- child side

def _child_main(library: str) -> int:
    from exporter.sources.levelzero import LevelZero, LevelZeroError

    out = sys.stdout

    def send(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    try:
        level_zero = LevelZero(library)
        level_zero.init()
        devices = level_zero.devices()
        identities = [device.identity() for device in devices]
    except LevelZeroError as error:
        send({"ready": False, "error": str(error), "error_name": getattr(error, "name", None)})
        return 0
    send({"ready": True, "devices": [asdict(identity) for identity in identities]})

    def read(device, identity, what: str) -> dict:
        reading: dict = {"pci_address": identity.pci_address, what: None, "error": None, "error_name": None}
        try:
            if what == "memory":
                modules = device.memory_modules()
                # The sizes stand if reading a module's state fails next.
                reading[what] = [[m.device_local, m.physical_size, None] for m in modules]
                reading[what] = [[m.device_local, m.size, m.free] for m in map(device.memory_state, modules)]
            else:
                reading[what] = [[p.pid, p.mem_size, p.shared_size] for p in device.processes()]
        except LevelZeroError as error:
            reading["error"] = str(error)
            reading["error_name"] = error.name
        return reading

    for request in sys.stdin:
        what = request.strip()
        if what not in ("memory", "processes"):
            continue
        send({"devices": [read(device, identity, what) for device, identity in zip(devices, identities)]})
    return 0


# --------------------------------------------------------------------------------------- parent side

class LevelZeroWorker:
    """Parent-side handle on the Level Zero child. Thread-safe; every call is bounded by `timeout`."""

    def __init__(self, library: str = DEFAULT_LIBRARY, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.library = library
        self.timeout = timeout
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._identities: dict[str, Identity] | None = None
        self._failure: str | None = None
        self._retry_at = 0.0
        self._backoff = BACKOFF_FIRST_S
        self._init_deadline = 0.0
        self._unreaped: list[subprocess.Popen[bytes]] = []  # killed children no reaper thread could wait for

    def start(self) -> None:
        """Spawn the child now, without waiting, so that the first scrape does not pay for its start.

        A child that cannot be started (EAGAIN under a task limit, EACCES, ENOMEM) is not an error here:
        the scrapes report it, and retry with the usual backoff."""
        with self._lock:
            if self._child is None and time.monotonic() >= self._retry_at:
                try:
                    self._spawn()
                except LevelZeroUnavailable:
                    pass

    def read_memory(self) -> list[DeviceMemory]:
        identities, readings = self._request("memory")
        return [DeviceMemory(identities[r["pci_address"]],
                             tuple(MemoryReading(bool(local), int(size), None if free is None else int(free))
                                   for local, size, free in r["memory"] or ()),
                             r["error"])
                for r in readings]

    def read_processes(self) -> list[DeviceProcesses]:
        identities, readings = self._request("processes")
        return [DeviceProcesses(identities[r["pci_address"]],
                                tuple(ProcessReading(int(pid), int(mem), int(shared))
                                      for pid, mem, shared in r["processes"] or ()),
                                r["error"])
                for r in readings]

    def restart(self) -> None:
        """Re-initialise Level Zero in a fresh child (a GPU was plugged, removed or re-bound)."""
        with self._lock:
            self._stop_child()
            self._retry_at = 0.0
            self._backoff = BACKOFF_FIRST_S
            try:
                self._spawn()
            except LevelZeroUnavailable:
                pass  # the scrapes report it and retry

    def close(self) -> None:
        with self._lock:
            self._stop_child()

    @contextmanager
    def _locked(self, deadline: float) -> Iterator[None]:
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise LevelZeroUnavailable("Level Zero is busy answering another scrape")
        try:
            yield
        finally:
            self._lock.release()

    def _request(self, what: str) -> tuple[dict[str, Identity], list[dict]]:
        """One answer of the child, within `timeout` all told (waiting for the lock, for the child's
        init and for the answer)."""
        deadline = time.monotonic() + self.timeout
        with self._locked(deadline):
            initialised_before = self._identities is not None
            identities = self._ready(deadline)
            if not initialised_before and deadline - time.monotonic() < self.timeout / 2:
                # A slow init used up this scrape's time; reading now could only time out and kill it.
                raise LevelZeroUnavailable("Level Zero has just initialised; the next scrape reads it")
            try:
                self._child.stdin.write(what.encode() + b"\n")
                self._child.stdin.flush()
            except OSError as error:
                self._fail(f"Level Zero child is gone: {error}")
            answer = self._receive(deadline)
            if answer is None:
                self._fail(f"Level Zero did not answer within {self.timeout:g}s (driver hang?)")
            readings = answer["devices"]
            if any(r["error_name"] in RESTART_ERRORS for r in readings):
                # Answer this scrape with what there is; the next one re-initialises.
                self._stop_child()
            self._backoff = BACKOFF_FIRST_S
            self._failure = None
            return identities, readings

    def _ready(self, deadline: float) -> dict[str, Identity]:
        if self._child is None:
            if time.monotonic() < self._retry_at:
                raise LevelZeroUnavailable(self._failure or "Level Zero is not initialised")
            self._spawn()
        if self._identities is None:
            ready = self._receive(deadline)
            if ready is None:
                if time.monotonic() < self._init_deadline:
                    raise LevelZeroUnavailable("Level Zero is still initialising")
                self._fail(f"Level Zero initialisation did not finish within {INIT_DEADLINE_S:g}s (driver hang?)")
            if not ready.get("ready"):
                hint = INIT_HINTS.get(ready.get("error_name"), "")
                self._fail(f"Level Zero initialisation failed: {ready.get('error')}{hint}")
            self._identities = {d["pci_address"]: Identity(**d) for d in ready["devices"]}
        return self._identities

    def _spawn(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        self._buffer = b""
        self._identities = None
        self._init_deadline = time.monotonic() + INIT_DEADLINE_S
        self._reap_finished()
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "exporter.sources.levelzero_worker", self.library],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                start_new_session=True)
        except OSError as error:
            self._fail(f"cannot start the Level Zero child: {error}")
        try:
            threading.Thread(target=_drain_stderr, args=(self._child,), daemon=True,
                             name="levelzero-stderr").start()
        except RuntimeError as error:  # "can't start new thread": a task limit; the child goes again
            self._fail(f"cannot start the Level Zero child's stderr reader: {error}")

    def _receive(self, deadline: float) -> dict | None:
        """The child's next message, or None when it has not answered by `deadline` (time.monotonic)."""
        child = self._child
        with selectors.DefaultSelector() as selector:
            selector.register(child.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return None
                chunk = os.read(child.stdout.fileno(), 1 << 16)
                if not chunk:
                    self._fail(f"Level Zero child exited unexpectedly ({_describe_exit(child)})")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            self._fail("Level Zero child sent garbage")

    def _fail(self, message: str) -> NoReturn:
        self._stop_child()
        self._failure = message
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)
        # The scrape logs the failure once; here only the detail of each retry.
        log.debug("%s (next try in %gs)", message, self._retry_at - time.monotonic())
        raise LevelZeroUnavailable(message)

    def _stop_child(self) -> None:
        child, self._child = self._child, None
        self._identities = None
        if child is None:
            return
        if child.poll() is None:
            child.kill()
        # A child stuck in a driver call can take a while to die: reap it off the scrape path.
        try:
            threading.Thread(target=_reap, args=(child,), daemon=True, name="levelzero-reaper").start()
        except RuntimeError:  # no thread to spare (a task limit): reaped once it has died, at a later spawn
            self._unreaped.append(child)

    def _reap_finished(self) -> None:
        for child in list(self._unreaped):
            if child.poll() is not None:
                self._unreaped.remove(child)
                _close_streams(child)


def _drain_stderr(child: subprocess.Popen[bytes]) -> None:
    for line in child.stderr:
        log.debug("child: %s", line.decode(errors="replace").rstrip())


def _reap(child: subprocess.Popen[bytes]) -> None:
    child.wait()
    _close_streams(child)


def _close_streams(child: subprocess.Popen[bytes]) -> None:
    for stream in (child.stdin, child.stdout, child.stderr):
        try:
            stream.close()
        except OSError:
            pass


def _describe_exit(child: subprocess.Popen[bytes]) -> str:
    try:
        code = child.wait(timeout=1)
    except subprocess.TimeoutExpired:
        return "still running"
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


if __name__ == "__main__":
    raise SystemExit(_child_main(sys.argv[1] if len(sys.argv) > 1 else "libze_loader.so.1"))
