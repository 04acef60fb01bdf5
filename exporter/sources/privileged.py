"""The privileged reader: the only process of a service that keeps its capabilities.

Other users' `/proc/PID/fd` and `/proc/PID/fdinfo` need those capabilities, which also open
`/proc/PID/mem`, `/proc/PID/environ` and `/proc/PID/root/...` of every process. So the exporter and the gate,
when they start with them (and not as root), start this child first and then drop them
(`separate_privileges`: lowered in the ambient set, then the service's command line executed again, which
keeps only the ambient set; `vllm_xpu_exporter.capabilities`): the process that faces the network or the
gate's socket holds neither, and the child, which faces nothing but its parent's pipe, does only what the
parent may ask. It reads fixed shapes of path under the procfs root it was started with (`fd/`, `fdinfo/`,
`cgroup`, `stat`, `cmdline`, `ns/net`, `net/*`), through `DrmClientScanner` and `EndpointFinder`, and answers
figures: never a file, a path the parent names, or a byte of another process's memory or environment. It
also holds CAP_PERFMON, for the one other thing it does: starting the Level Zero children the parent's
`LevelZeroWorker` asks for (with the library given at its start; they get CAP_PERFMON alone), whose pipes
and a pidfd it passes back over a socket pair (`spawn_levelzero`, `HandedChild`).

The protocol: JSON lines on the child's stdin and stdout, one answer per request, in order.

    parent -> {"read": "scan"}
    child  -> {"scan": SCAN}  |  {"unavailable": MESSAGE}     (ProcfsUnavailable)
    parent -> {"read": "endpoints", "cgroups": [PATH, ...]}   (at most MAX_CGROUPS paths of MAX_PATH_CHARS)
    child  -> {"endpoints": {PATH: ENDPOINT, ...}}  |  {"unavailable": MESSAGE}
    child  -> {"refused": MESSAGE}                            (any other line)

and on the socket pair (SOCK_SEQPACKET), for a Level Zero child:

    parent -> {"telemetry": BOOL}
    child  -> {"pid": PID} with SCM_RIGHTS [pidfd, stdin, stdout, stderr]  |  {"error": MESSAGE}

SCAN is a `ScanResult` as `scan_to_wire` writes it; ENDPOINT an `Endpoint`'s fields.

The child cannot be started again once the parent has dropped its capabilities: when it exits, or does not
answer within the timeout twice in a row (a read stuck in the kernel), its reads fail with ProcfsUnavailable
saying so (the processes collector reports it in `xpu_exporter_collector_success`), until the service is
restarted.

`python -m vllm_xpu_exporter.sources.privileged --procfs PROCFS [--host-address ADDRESS] [--full-scans]`
runs the child side.
"""

from __future__ import annotations

import argparse
import array
import functools
import json
import logging
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

from vllm_xpu_exporter import capabilities
from vllm_xpu_exporter.parsers.cgroup import UnitCgroup
from vllm_xpu_exporter.sources.endpoints import DEFAULT_HOST_ADDRESS, Endpoint, EndpointFinder
from vllm_xpu_exporter.sources.levelzero.binding import DEFAULT_LIBRARY
from vllm_xpu_exporter.sources.levelzero.wire import NO_TELEMETRY
from vllm_xpu_exporter.sources.procfs import (DEFAULT_PROCFS, DrmClientScanner, ProcfsUnavailable, ScanResult,
                                              UnitEngineUse, read_unit_cgroup, scan_drm_clients)

log = logging.getLogger("vllm_xpu_exporter.privileged")

DEFAULT_TIMEOUT_S = 10.0  # a scan of a busy host takes tens of milliseconds; a bounded one far less than this
MAX_CGROUPS = 4096
MAX_PATH_CHARS = 4096
MAX_REQUEST_BYTES = 1 << 24
# The serving process's new image finds its reader here: "PID:WRITE_FD:READ_FD:SPAWN_FD".
READER_ENV = "VLLM_XPU_PRIVILEGED_READER"


def should_separate() -> bool:
    """Whether this process has reader capabilities to give to a child and drop: not as root (uid 0 reads
    root's processes without any capability, so there is nothing to separate)."""
    return os.geteuid() != 0 and bool(capabilities.permitted() & capabilities.READER_CAPABILITIES)


def separate_privileges(procfs: str, *, host_address: str = DEFAULT_HOST_ADDRESS, full_scans: bool = False,
                        levelzero_library: str = DEFAULT_LIBRARY) -> tuple[PrivilegedReader | None, str | None]:
    """Called first thing by a service's `main`, before it opens, binds or starts anything. When this process
    holds the reader's capabilities (`should_separate`): start the reader child, lower every capability in
    the ambient set, and execve this same command line again, handing the child on in READER_ENV; the new
    process image holds no capability. In that new image (READER_ENV set), or when there is nothing to
    separate: (the reader handed on, or None; None) at once. (None, a line saying what failed) when the
    separation cannot be made: the service must not serve with the capabilities."""
    handed_on = os.environ.pop(READER_ENV, None)
    if handed_on is not None:
        left = capabilities.permitted() & capabilities.SEPARATED_CAPABILITIES
        if left:
            return None, f"capabilities {sorted(left)} still held after lowering them"
        try:
            return PrivilegedReader.handed_on(handed_on, procfs), None
        except (ValueError, OSError):
            return None, f"{READER_ENV} is malformed"
    if not should_separate():
        return None, None
    reader = PrivilegedReader(procfs, host_address=host_address, full_scans=full_scans,
                              levelzero_library=levelzero_library)
    try:
        reader.start(hand_on=True)
        capabilities.lower_ambient(capabilities.SEPARATED_CAPABILITIES)
    except (OSError, capabilities.CapabilityError) as error:
        reader.close()
        return None, f"cannot separate privileges: {error}"
    try:
        os.execve(sys.executable, sys.orig_argv, dict(os.environ, **{READER_ENV: reader.hand_on()}))
    except OSError as error:
        reader.close()
        return None, f"cannot separate privileges: execve {sys.executable}: {error.strerror or error}"
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------------------------- wire

def scan_to_wire(scan: ScanResult) -> dict[str, Any]:
    return {
        "memory_by_device_unit": scan.memory_by_device_unit,
        "memory_by_device": scan.memory_by_device,
        "memory_by_device_pid": {device: [[pid, size] for pid, size in by_pid.items()]
                                 for device, by_pid in scan.memory_by_device_pid.items()},
        "unit_by_pid": [[pid, unit] for pid, unit in scan.unit_by_pid.items()],
        "unit_cgroups": {unit: sorted(paths) for unit, paths in scan.unit_cgroups.items()},
        "engines_by_device_unit": {
            device: {unit: {"busy_seconds": use.busy_seconds, "cycles": use.cycles, "total_cycles": use.total_cycles}
                     for unit, use in by_unit.items()}
            for device, by_unit in scan.engines_by_device_unit.items()},
        "driver_by_device": scan.driver_by_device,
        "clients": scan.clients, "drm_fds": scan.drm_fds, "processes": scan.processes,
        "unreadable": scan.unreadable, "unreadable_pids": list(scan.unreadable_pids),
        "reader_root": scan.reader_root, "reader_capable": scan.reader_capable,
        "vanished": scan.vanished, "memory_keys_seen": scan.memory_keys_seen,
        "fds_skipped": scan.fds_skipped, "walks_deferred": scan.walks_deferred,
    }


def scan_from_wire(wire: dict[str, Any]) -> ScanResult:
    return ScanResult(
        memory_by_device_unit=wire["memory_by_device_unit"],
        memory_by_device=wire["memory_by_device"],
        memory_by_device_pid={device: {int(pid): int(size) for pid, size in pairs}
                              for device, pairs in wire["memory_by_device_pid"].items()},
        unit_by_pid={int(pid): unit for pid, unit in wire["unit_by_pid"]},
        unit_cgroups={unit: frozenset(paths) for unit, paths in wire["unit_cgroups"].items()},
        engines_by_device_unit={device: {unit: UnitEngineUse(**use) for unit, use in by_unit.items()}
                                for device, by_unit in wire["engines_by_device_unit"].items()},
        driver_by_device=wire["driver_by_device"],
        clients=wire["clients"], drm_fds=wire["drm_fds"], processes=wire["processes"],
        unreadable=wire["unreadable"], unreadable_pids=tuple(int(pid) for pid in wire["unreadable_pids"]),
        reader_root=bool(wire["reader_root"]), reader_capable=bool(wire["reader_capable"]),
        vanished=wire["vanished"], memory_keys_seen=wire["memory_keys_seen"],
        fds_skipped=wire["fds_skipped"], walks_deferred=wire["walks_deferred"],
    )


# ----------------------------------------------------------------------------------------- child side

def _answer(request: Any, scan: Callable[[], ScanResult], finder: EndpointFinder) -> dict[str, Any]:
    if not isinstance(request, dict):
        return {"refused": "a request is a JSON object"}
    try:
        if request.get("read") == "scan":
            return {"scan": scan_to_wire(scan())}
        if request.get("read") == "endpoints":
            paths = request.get("cgroups")
            if (not isinstance(paths, list) or len(paths) > MAX_CGROUPS
                    or not all(isinstance(path, str) and 0 < len(path) <= MAX_PATH_CHARS for path in paths)):
                return {"refused": f"cgroups: a list of at most {MAX_CGROUPS} paths of at most {MAX_PATH_CHARS} "
                                   "characters"}
            return {"endpoints": {path: vars(endpoint) for path, endpoint in finder.find(paths).items()}}
    except ProcfsUnavailable as error:
        return {"unavailable": str(error)}
    except Exception as error:  # a bug costs this answer, not the child the service cannot start again
        return {"unavailable": f"the privileged reader failed: {type(error).__name__}: {error}"}
    return {"refused": "unknown request"}


def _child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="vllm_xpu_exporter.sources.privileged")
    parser.add_argument("--procfs", default=DEFAULT_PROCFS)
    parser.add_argument("--host-address", default=DEFAULT_HOST_ADDRESS)
    parser.add_argument("--full-scans", action="store_true", help="walk every process at every scan")
    parser.add_argument("--levelzero-library", default=DEFAULT_LIBRARY)
    parser.add_argument("--spawn-fd", type=int, help="the socket on which the parent asks for Level Zero children")
    args = parser.parse_args(argv)
    # Its lines (a bounded scan) go to the service's stderr, the journal under systemd.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="privileged reader: %(message)s")
    # What it starts (the Level Zero children) gets CAP_PERFMON alone; it keeps the others for itself.
    capabilities.lower_ambient(capabilities.READER_CAPABILITIES)
    if args.spawn_fd is not None:
        channel = socket.socket(fileno=args.spawn_fd)
        threading.Thread(target=_spawn_levelzero_children, args=(channel, args.levelzero_library), daemon=True,
                         name="levelzero-spawner").start()
    # --full-scans: every scan walks every process, as scan_drm_clients does (the gate's decisions).
    scan = functools.partial(scan_drm_clients, args.procfs) if args.full_scans else DrmClientScanner(args.procfs).scan
    finder = EndpointFinder(args.procfs, host_address=args.host_address)
    out = sys.stdout
    for line in sys.stdin.buffer:
        if len(line) > MAX_REQUEST_BYTES:
            answer: dict[str, Any] = {"refused": "request too long"}
        else:
            try:
                request = json.loads(line)
            except ValueError:
                answer = {"refused": "not JSON"}
            else:
                answer = _answer(request, scan, finder)
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


def _spawn_levelzero_children(channel: socket.socket, library: str) -> None:
    """Start a Level Zero child for each request on `channel` ({"telemetry": bool}), with the library this
    reader was started with, and send its pipes and a pidfd back: the child is this process's (it reaps it),
    its use the parent's. Ends when the parent closes the channel."""
    children: list[subprocess.Popen[bytes]] = []
    while True:
        request = channel.recv(4096)
        if not request:
            return
        children = [child for child in children if child.poll() is None]  # reaped
        try:
            telemetry = json.loads(request).get("telemetry") is True
        except (ValueError, AttributeError):
            channel.send(json.dumps({"error": "malformed request"}).encode())
            continue
        ours: list[int] = []
        try:
            stdin_read, stdin_write = os.pipe()
            stdout_read, stdout_write = os.pipe()
            stderr_read, stderr_write = os.pipe()
            ours = [stdin_read, stdin_write, stdout_read, stdout_write, stderr_read, stderr_write]
            child = subprocess.Popen(
                [sys.executable, "-m", "vllm_xpu_exporter.sources.levelzero.child", library,
                 *([] if telemetry else [NO_TELEMETRY])],
                stdin=stdin_read, stdout=stdout_write, stderr=stderr_write, cwd="/", start_new_session=True)
            children.append(child)
            pidfd = os.pidfd_open(child.pid)
            ours.append(pidfd)
            channel.sendmsg([json.dumps({"pid": child.pid}).encode()],
                            [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                              array.array("i", [pidfd, stdin_write, stdout_read, stderr_read]))])
        except OSError as error:
            channel.send(json.dumps({"error": error.strerror or str(error)}).encode())
        finally:
            for fd in ours:
                os.close(fd)


# ---------------------------------------------------------------------------------------- parent side

class PrivilegedReader:
    """Parent-side handle on the privileged child: `start()`, then `scan()` and `find_endpoints()`. Thread-safe
    (requests are serial)."""

    def __init__(self, procfs: str = DEFAULT_PROCFS, host_address: str = DEFAULT_HOST_ADDRESS,
                 full_scans: bool = False, timeout: float = DEFAULT_TIMEOUT_S,
                 levelzero_library: str = DEFAULT_LIBRARY) -> None:
        self.procfs = procfs
        self.host_address = host_address
        self.full_scans = full_scans
        self.timeout = timeout
        self.levelzero_library = levelzero_library
        self._lock = threading.Lock()
        self._spawn_lock = threading.Lock()
        self._pid: int | None = None
        self._write_fd = self._read_fd = -1
        self._spawn_channel: socket.socket | None = None
        self._buffer = b""
        self._unanswered = 0  # requests that timed out: their answers come first
        self._lost: str | None = None  # why the child is gone for good

    @classmethod
    def handed_on(cls, handle: str, procfs: str) -> PrivilegedReader:
        """The reader a previous image of this process started (`hand_on()`'s handle); ValueError if malformed."""
        pid, write_fd, read_fd, spawn_fd = (int(part) for part in handle.split(":"))
        reader = cls(procfs)
        reader._pid, reader._write_fd, reader._read_fd = pid, write_fd, read_fd
        for fd in (write_fd, read_fd, spawn_fd):
            os.set_inheritable(fd, False)
        reader._spawn_channel = socket.socket(fileno=spawn_fd)
        return reader

    def start(self, hand_on: bool = False) -> None:
        """Start the child; raises OSError when it cannot. It inherits this process's ambient capabilities.
        `hand_on`: its pipes survive this process's execve."""
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        to_child_read, self._write_fd = os.pipe()
        self._read_fd, from_child_write = os.pipe()
        self._spawn_channel, child_channel = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._pid = subprocess.Popen(
                [sys.executable, "-m", "vllm_xpu_exporter.sources.privileged", "--procfs", self.procfs,
                 "--host-address", self.host_address, *(["--full-scans"] if self.full_scans else []),
                 "--levelzero-library", self.levelzero_library, "--spawn-fd", str(child_channel.fileno())],
                stdin=to_child_read, stdout=from_child_write, env=env, cwd="/",
                pass_fds=(child_channel.fileno(),)).pid
        except OSError:
            os.close(self._write_fd)
            os.close(self._read_fd)
            self._spawn_channel.close()
            self._write_fd = self._read_fd = -1
            self._spawn_channel = None
            raise
        finally:
            os.close(to_child_read)
            os.close(from_child_write)
            child_channel.close()
        if hand_on:
            for fd in (self._write_fd, self._read_fd, self._spawn_channel.fileno()):
                os.set_inheritable(fd, True)

    def hand_on(self) -> str:
        assert self._spawn_channel is not None
        return f"{self._pid}:{self._write_fd}:{self._read_fd}:{self._spawn_channel.fileno()}"

    def spawn_levelzero(self, telemetry: bool) -> HandedChild:
        """A Level Zero child (`LevelZeroWorker`'s), started by the reader with CAP_PERFMON, which this process
        has not: its pipes and a pidfd. Raises OSError when it cannot be started."""
        with self._spawn_lock:
            channel = self._spawn_channel
            if channel is None:
                raise OSError(f"the privileged reader is not running ({self._lost or 'not started'})")
            channel.settimeout(self.timeout)
            try:
                channel.send(json.dumps({"telemetry": telemetry}).encode())
                message, ancillary, _, _ = channel.recvmsg(4096, socket.CMSG_SPACE(4 * array.array("i").itemsize))
            except TimeoutError:
                raise OSError(f"the privileged reader did not start it within {self.timeout:g}s") from None
        fds = array.array("i")
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
        try:
            answer = json.loads(message)
            if len(fds) != 4 or "pid" not in answer:
                raise OSError(answer.get("error", "malformed answer") if isinstance(answer, dict) else "malformed")
        except (ValueError, OSError) as error:
            for fd in fds:
                os.close(fd)
            raise OSError(f"the privileged reader did not start it: {error}") from None
        return HandedChild(int(answer["pid"]), *fds)

    @property
    def pid(self) -> int | None:
        return self._pid

    def scan(self) -> ScanResult:
        answer = self._ask({"read": "scan"}, "scan")
        try:
            return scan_from_wire(answer)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ProcfsUnavailable(f"the privileged reader sent a malformed scan ({type(error).__name__})") from None

    def find_endpoints(self, cgroup_paths: Iterable[str]) -> dict[str, Endpoint]:
        answer = self._ask({"read": "endpoints", "cgroups": sorted(set(cgroup_paths))}, "endpoints")
        try:
            return {path: Endpoint(**fields) for path, fields in answer.items()}
        except (TypeError, AttributeError) as error:
            raise ProcfsUnavailable(f"the privileged reader sent malformed endpoints ({type(error).__name__})") \
                from None

    def close(self) -> None:
        with self._lock:
            self._stop("closed")

    def _stop(self, why: str) -> None:
        pid, self._pid = self._pid, None
        self._lost = self._lost or why
        if pid is None:
            return
        if self._spawn_channel is not None:
            self._spawn_channel.close()
            self._spawn_channel = None
        for fd in (self._write_fd, self._read_fd):
            os.close(fd)
        self._write_fd = self._read_fd = -1
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass  # reaped already
        except ProcessLookupError:
            pass

    def _ask(self, request: dict[str, Any], key: str) -> Any:
        with self._lock:
            if self._pid is None:
                raise ProcfsUnavailable(f"the privileged reader is not running ({self._lost or 'not started'}); "
                                        "restarting the service starts it again")
            deadline = time.monotonic() + self.timeout
            try:
                data = json.dumps(request).encode() + b"\n"
                while data:
                    data = data[os.write(self._write_fd, data):]
                while self._unanswered:  # answers to requests given up on: late, not for this one
                    if self._receive(deadline) is None:
                        return self._unanswered_request()
                    self._unanswered -= 1
                answer = self._receive(deadline)
            except OSError as error:
                self._lose(f"its pipe failed: {error.strerror or error}")
            if answer is None:
                return self._unanswered_request()
        if key in answer:
            return answer[key]
        if "unavailable" in answer:
            raise ProcfsUnavailable(str(answer["unavailable"]))
        raise ProcfsUnavailable(f"the privileged reader refused the request: {answer.get('refused', answer)}")

    def _unanswered_request(self) -> Any:
        self._unanswered += 1
        if self._unanswered > 1:
            self._lose(f"it answered no request within {self.timeout:g}s twice")
        raise ProcfsUnavailable(f"the privileged reader did not answer within {self.timeout:g}s")

    def _receive(self, deadline: float) -> dict[str, Any] | None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._read_fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return None
                chunk = os.read(self._read_fd, 1 << 20)
                if not chunk:
                    self._lose("it has exited")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            self._lose("it sent garbage")
        return message

    def _lose(self, why: str) -> NoReturn:
        """Give the child up for good (lock held): it cannot be started again without the capabilities."""
        self._stop(why)
        log.error("the privileged reader is lost: %s; per-unit memory from fdinfo is unavailable until the "
                  "service restarts", why)
        raise ProcfsUnavailable(f"the privileged reader is lost ({why}); restarting the service starts it again")


class HandedChild:
    """A Level Zero child the reader started for this process, as much of `subprocess.Popen` as
    `LevelZeroWorker` uses: its pipes, and a pidfd to tell when it has exited and to kill it. It is the
    reader's child: the reader reaps it, and its exit status is not known here (`exit_unknown`)."""

    exit_unknown = True

    def __init__(self, pid: int, pidfd: int, stdin: int, stdout: int, stderr: int) -> None:
        self.pid = pid
        self._pidfd = pidfd
        self.stdin = os.fdopen(stdin, "wb")
        self.stdout = os.fdopen(stdout, "rb")
        self.stderr = os.fdopen(stderr, "rb")
        self.returncode: int | None = None
        self._killed = False

    def poll(self) -> int | None:
        if self.returncode is None and self._pidfd >= 0 and select.select([self._pidfd], [], [], 0)[0]:
            self._exited()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired("levelzero worker", timeout or 0)
            self._exited()
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            self._killed = True
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass  # exited (and reaped) already

    def _exited(self) -> None:
        self.returncode = -signal.SIGKILL if self._killed else 0
        os.close(self._pidfd)
        self._pidfd = -1


class RemoteDrmClientScanner:
    """`DrmClientScanner`'s interface, answered by the privileged reader."""

    def __init__(self, reader: PrivilegedReader) -> None:
        self.reader = reader
        self.procfs = reader.procfs

    def scan(self) -> ScanResult:
        return self.reader.scan()

    def unit_cgroup_of(self, pid: int) -> UnitCgroup | None:
        try:  # /proc/PID/cgroup is readable by all: no need to ask
            return read_unit_cgroup(self.procfs, pid)
        except OSError:
            return None

    def close(self) -> None:
        """The reader is closed by its owner, which may share it."""


class RemoteEndpointFinder:
    """`EndpointFinder`'s interface, answered by the privileged reader."""

    def __init__(self, reader: PrivilegedReader) -> None:
        self.reader = reader

    def find(self, cgroup_paths: Iterable[str]) -> dict[str, Endpoint]:
        return self.reader.find_endpoints(cgroup_paths)


if __name__ == "__main__":
    raise SystemExit(_child_main(sys.argv[1:]))
