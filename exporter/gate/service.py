"""`vllm-xpu-gate serve`: the gate service (docs/gate.md). One process for the host, its own systemd unit,
no root: it follows the journal once through the same follower and fold as the exporter, reads Level
Zero in a child, keeps each GPU's lease in memory, and answers the clients (`vllm_xpu_exporter.gate.client`)
that connect to its Unix socket.

Who is asking is the kernel's word, never the client's: the connecting process's pid from SO_PEERCRED,
its unit from its cgroup (`/proc/PID/cgroup`, read as the exporter reads it), and where the kernel has
SO_PEERPIDFD a pidfd of that process showing it still ran after the read (`Peer`: else the pid may have
been another process's). A caller outside the watched units, or one that cannot be identified, is
released at once; a watched unit waits its turn (`Waiter`), one wait per unit (a newer
connection of the same unit replaces the older one).

One thread decides for every waiting unit (`Service.decide_round`), in the order they asked, each
poll interval and as soon as a client asks: so two units are never released on one stale view, and the
lease a release grants is seen by the next unit in the same round. How a unit is admitted is
`vllm_xpu_exporter.gate.decision`'s; a lease holds from its release until the journal shows that start's
init ended, the unit's cgroup has been empty past a grace (the unit stopped before its engine began),
or --lease-timeout.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_xpu_exporter import memory as memory_rules
from vllm_xpu_exporter.parsers import gate as gate_lines
from vllm_xpu_exporter.gate import protocol
from vllm_xpu_exporter.gate.decision import HOST, Admission, Decision, Lease, decide, lease_over, waiting_invocation
from vllm_xpu_exporter.sources import procfs
from vllm_xpu_exporter.sources.journal import open_journal
from vllm_xpu_exporter.sources.logs.entry import LogSelection
from vllm_xpu_exporter.nodatayet import NoDataYet
from vllm_xpu_exporter.sources.logs.follower import LogFollower, LogState
from vllm_xpu_exporter.sources.levelzero.worker import DeviceMemory, LevelZeroUnavailable, LevelZeroWorker, WorkerState

if TYPE_CHECKING:
    from vllm_xpu_exporter.sources.privileged import PrivilegedReader

log = logging.getLogger("vllm_xpu_exporter.gate")

SD_LISTEN_FDS_START = 3
MAX_CONNECTIONS = 256  # waiting units and handshakes; beyond it a connection is closed at once
HANDSHAKE_TIMEOUT_S = 5.0
SEND_TIMEOUT_S = 1.0
EXIT_USAGE = 2
STARTING_POLL_S = 0.02  # how often waiting units are decided again while the journal or Level Zero starts


@dataclass(frozen=True)
class ServiceOptions:
    listen: str | None  # a path to bind; None: the socket systemd passes (socket activation)
    selection: LogSelection
    journal_max_units: int
    levelzero_library: str
    levelzero_timeout: float
    procfs: str
    sysfs: str
    lease_timeout: float
    poll_interval: float


@dataclass(eq=False)
class Waiter:
    """A unit waiting for its turn: its connection, what it asked, what it waited for so far."""

    unit: str
    cgroup_path: str
    request: protocol.Request
    connection: socket.socket
    began: float  # monotonic
    waited_for: dict[str, None] = field(default_factory=dict)  # in the order first met
    last: Decision | None = None
    said: set[str] = field(default_factory=set)

    @property
    def deadline(self) -> float:
        return self.began + self.request.timeout

    def send(self, message: bytes) -> bool:
        try:
            self.connection.settimeout(SEND_TIMEOUT_S)
            self.connection.sendall(message)
            return True
        except OSError:
            return False

    def say_once(self, line: str) -> bool:
        if line in self.said:
            return True
        self.said.add(line)
        return self.send(protocol.say(line))

    def gone(self) -> bool:
        """The client closed its end (it was killed, or its unit stopped)."""
        try:
            self.connection.setblocking(False)  # a timeout would make recv wait for it
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def close(self) -> None:
        self.connection.close()


# SO_PEERPIDFD (Linux 6.5): a pidfd of the exact process that connected. Python 3.11 lacks the constant.
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)


class PeerGone(Exception):
    """The process that connected has exited: its pid may be another process's by now."""


@dataclass
class Peer:
    """The process that connected, as the kernel recorded it: its pid (SO_PEERCRED) and, where the kernel
    gives one, a pidfd of that very process (None on kernels before 6.5: the pid is all there is)."""

    pid: int
    pidfd: int | None
    gone: str | None = None  # why the kernel gave no pidfd of a process it knows: it has exited

    @classmethod
    def of(cls, connection: socket.socket) -> Peer:
        pid, _uid, _gid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                    struct.calcsize("3i")))
        try:
            return cls(pid, struct.unpack("i", connection.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4))[0])
        except OSError as error:
            if error.errno == errno.ENOPROTOOPT:  # a kernel before 6.5
                return cls(pid, None)
            return cls(pid, None, f"no pidfd of pid {pid}: {error.strerror or error}")  # ESRCH, EINVAL: exited

    def check_running(self) -> None:
        """PeerGone unless the process is still running (its pidfd turns readable when it exits): a read
        of /proc/PID/... made before this check was of that process, since a pid is not reused while its
        process runs. Without a pidfd (an old kernel) nothing can be told."""
        if self.gone is not None:
            raise PeerGone(self.gone)
        if self.pidfd is None:
            return
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        if poller.poll(0):
            raise PeerGone(f"pid {self.pid} exited after it connected")

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def cgroup_populated(sysfs: str, cgroup_path: str) -> bool | None:
    """Whether the unit's cgroup has processes (cgroup v2 `cgroup.events`, v1 the systemd hierarchy's
    `cgroup.procs`); None when it cannot be told (a path outside the service's cgroup namespace, an
    unreadable file). A cgroup that does not exist has none."""
    if not cgroup_path.startswith("/") or "/../" in f"{cgroup_path}/":
        return None
    root = f"{sysfs}/fs/cgroup"
    try:
        with open(f"{root}{cgroup_path}/cgroup.events", encoding="ascii", errors="replace") as events:
            for line in events:
                name, _, value = line.partition(" ")
                if name == "populated":
                    return value.strip() == "1"
            return None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        with open(f"{root}/systemd{cgroup_path}/cgroup.procs", encoding="ascii") as processes:
            return bool(processes.read(64).strip())
    except FileNotFoundError:
        return False if os.path.isdir(f"{root}/systemd") or os.path.exists(f"{root}/cgroup.controllers") else None
    except OSError:
        return None


def listening_socket(path: str | None, environ=os.environ) -> socket.socket:
    """The socket systemd passed (LISTEN_PID/LISTEN_FDS, socket activation) or, with `path`, a new one
    bound there (mode 0666: any local process may ask; who it is, the kernel says)."""
    if path is None:
        if environ.get("LISTEN_PID") != str(os.getpid()) or int(environ.get("LISTEN_FDS", "0") or 0) < 1:
            raise OSError("no socket passed by systemd (LISTEN_FDS): start it through vllm-xpu-gate.socket, "
                          "or give --listen")
        for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            environ.pop(name, None)
        listener = socket.socket(fileno=SD_LISTEN_FDS_START)
        os.set_inheritable(listener.fileno(), False)
        if listener.family != socket.AF_UNIX or listener.type != socket.SOCK_STREAM:
            raise OSError("the socket systemd passed is not a Unix stream socket (ListenStream= a path)")
        return listener
    if os.path.exists(path) and not os.path.islink(path) and not os.path.isfile(path):
        os.unlink(path)  # a socket left by an earlier run
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    listener.bind(path)
    os.chmod(path, 0o666)
    listener.listen(64)
    return listener


class Service:
    def __init__(self, options: ServiceOptions, *, clock: Callable[[], float] = time.monotonic,
                 privileged: PrivilegedReader | None = None) -> None:
        self.options = options
        self.privileged = privileged  # reads the units' fds when the service separates privileges
        self.clock = clock
        self.began = clock()
        self.journal = LogFollower(options.selection, options.journal_max_units, open_reader=open_journal,
                                   source="journal", latest_invocations=True)
        self.levelzero = LevelZeroWorker(options.levelzero_library, options.levelzero_timeout, telemetry=False,
                                         spawn=None if privileged is None else privileged.spawn_levelzero)
        self.leases: dict[tuple[str, str], Lease] = {}  # (device or HOST, unit) -> the unit's latest release there
        self.waiting: list[Waiter] = []  # decider thread only
        self._arrived: list[Waiter] = []
        self._connections = 0
        self._condition = threading.Condition()
        self._stop = threading.Event()
        self._sources_starting = False  # the last round found the journal unread or Level Zero starting

    # --- lifecycle ---------------------------------------------------------------------------------

    def start_sources(self) -> None:
        self.journal.start()
        self.levelzero.start()

    def serve(self, listener: socket.socket) -> None:
        """Accept connections until stop(); decide in a thread of its own."""
        self.start_sources()
        decider = threading.Thread(target=self._decide_forever, name="gate-decider", daemon=True)
        decider.start()
        listener.settimeout(0.5)
        try:
            while not self._stop.is_set():
                try:
                    connection, _ = listener.accept()
                except TimeoutError:
                    continue
                except OSError as error:
                    log.warning("accept failed: %s", error)
                    time.sleep(0.1)
                    continue
                self.accept(connection)
        finally:
            self.stop()
            decider.join(2.0)
            listener.close()

    def stop(self) -> None:
        self._stop.set()
        with self._condition:
            self._condition.notify_all()

    def close(self) -> None:
        for waiter in [*self.waiting, *self._arrived]:
            waiter.close()
        self.journal.stop(timeout=1.0)
        self.levelzero.close()
        if self.privileged is not None:
            self.privileged.close()

    def accept(self, connection: socket.socket) -> None:
        with self._condition:
            if self._connections >= MAX_CONNECTIONS:
                connection.close()
                return
            self._connections += 1
        try:
            threading.Thread(target=self._handshake, args=(connection,), daemon=True).start()
        except RuntimeError:  # no thread to be had: the client waits its bound and starts ungated
            self._closed(connection)

    def _closed(self, connection: socket.socket) -> None:
        connection.close()
        with self._condition:
            self._connections -= 1

    # --- who asks ----------------------------------------------------------------------------------

    def _handshake(self, connection: socket.socket) -> None:
        """The caller's unit from the kernel, then its request; a waiter for the decider, or an answer now."""
        try:
            waiter = self.identify(connection)
        except Exception as error:  # a bug here must not stop the service
            log.warning("a connection failed: %s: %s", type(error).__name__, error)
            waiter = None
        if waiter is None:
            self._closed(connection)
            return
        with self._condition:
            self._arrived.append(waiter)
            self._condition.notify_all()

    def identify(self, connection: socket.socket) -> Waiter | None:
        """A Waiter for a watched unit's request; None once the connection was answered (or is useless)."""
        peer = Peer.of(connection)
        try:
            return self._identify(connection, peer)
        finally:
            peer.close()

    def _identify(self, connection: socket.socket, peer: Peer) -> Waiter | None:
        connection.settimeout(HANDSHAKE_TIMEOUT_S)
        data = b""
        try:
            while b"\n" not in data and len(data) <= protocol.MAX_MESSAGE_BYTES:
                chunk = connection.recv(protocol.MAX_MESSAGE_BYTES)
                if not chunk:
                    return None
                data += chunk
        except OSError:
            return None
        try:
            request = protocol.Request.decode(data.partition(b"\n")[0])
        except protocol.BadRequest as error:
            self._answer_now(connection, f"{gate_lines.PREFIX}error: {error}", EXIT_USAGE)
            return None
        try:
            caller, why = procfs.read_unit_cgroup(self.options.procfs, peer.pid), "it is in no unit"
        except OSError as error:
            caller, why = None, f"cannot read /proc/{peer.pid}/cgroup: {error.strerror or error}"
        try:
            peer.check_running()  # else that cgroup may be of a process that took the pid over
        except PeerGone as gone:
            caller, why = None, f"the process that connected is gone: {gone}"
        if caller is None:
            self._answer_now(connection, f"{gate_lines.PREFIX}warning: the service cannot tell which unit "
                                         f"asks ({why}): releasing", 0, released=True)
            return None
        if not self.options.selection.matches_unit(caller.unit):
            self._answer_now(connection, f"{gate_lines.PREFIX}{caller.unit} is not a watched unit "
                                         f"(--journal.units): nothing to wait for", 0, released=True)
            return None
        return Waiter(caller.unit, caller.path, request, connection, self.clock())

    def _answer_now(self, connection: socket.socket, line: str, status: int, released: bool = False) -> None:
        try:
            connection.settimeout(SEND_TIMEOUT_S)
            if released:
                connection.sendall(protocol.say(line))
                line = gate_lines.format_released(0.0, [], None, None)
            connection.sendall(protocol.answer(line, status))
        except OSError:
            pass

    # --- deciding ----------------------------------------------------------------------------------

    def _decide_forever(self) -> None:
        while not self._stop.is_set():
            with self._condition:
                if not self._arrived:
                    self._condition.wait(min(self.options.poll_interval, STARTING_POLL_S)
                                         if self._sources_starting else self.options.poll_interval)
                arrived, self._arrived = self._arrived, []
            self._take(arrived)
            try:
                self.decide_round()
            except Exception:  # never let the decider die: every unit would wait its bound
                log.exception("deciding failed")
                time.sleep(self.options.poll_interval)

    def _take(self, arrived: Sequence[Waiter]) -> None:
        for waiter in arrived:
            for older in [other for other in self.waiting if other.unit == waiter.unit]:
                self._finish(older)  # the unit asks again (a new start, a restarted client)
            self.waiting.append(waiter)

    def _finish(self, waiter: Waiter) -> None:
        self.waiting.remove(waiter)
        self._closed(waiter.connection)

    def decide_round(self) -> None:
        """Decide for every waiting unit, in the order they asked."""
        if not self.waiting:
            return
        state = self.journal.state()
        memory = self._memory()
        self._sources_starting = isinstance(state.error, NoDataYet) or memory is None
        self._end_leases(state)
        for waiter in list(self.waiting):
            if waiter.gone():
                self._finish(waiter)
                continue
            status = self._decide_for(waiter, state, memory)
            if status is not None:
                self._finish(waiter)

    def _memory(self) -> list[DeviceMemory] | str | None:
        """Every GPU's memory; a reason (str) when Level Zero cannot be read; None while its child starts."""
        try:
            return self.levelzero.read_memory()
        except LevelZeroUnavailable as error:
            starting = self.levelzero.state in (WorkerState.INITIALISING, WorkerState.READY)
            if starting and self.clock() < self.began + self.options.levelzero_timeout:
                return None
            return str(error)

    def _end_leases(self, state: LogState) -> None:
        now_usec = time.time_ns() // 1000
        views = {view.unit: view for view in state.views} if state.error is None else {}
        for key, lease in list(self.leases.items()):
            populated = cgroup_populated(self.options.sysfs, lease.cgroup_path)
            ended = lease_over(lease, views.get(lease.unit), now_usec, populated)
            if ended is not None:
                log.info("%s's lease on %s ended: %s", lease.unit, lease.device, ended)
                del self.leases[key]

    def _decide_for(self, waiter: Waiter, state: LogState, memory: list[DeviceMemory] | str | None
                    ) -> int | None:
        """Answer the waiter (its exit status) or tell it what it waits for (None)."""
        request = waiter.request
        if state.error is not None and not isinstance(state.error, NoDataYet):
            return self._release(waiter, None, f"cannot read the journal ({state.error}): releasing at once")
        if isinstance(state.error, NoDataYet) or memory is None:
            waiting_on = "the journal to be read" if isinstance(state.error, NoDataYet) else "Level Zero to start"
            if self.clock() >= waiter.deadline:
                return self._time_out(waiter, None)
            return None if waiter.say_once(f"{gate_lines.PREFIX}waiting for {waiting_on}") else EXIT_USAGE
        unchecked: str | None = None
        device: str
        reading: DeviceMemory | None = None
        if isinstance(memory, str):
            device, unchecked = HOST, f"Level Zero cannot be read ({memory})"
        else:
            addresses = [gpu.identity.pci_address for gpu in memory]
            if request.device is None and len(memory) != 1:
                line = (f"{gate_lines.PREFIX}error: {len(memory)} GPUs ({', '.join(addresses)}): the client's "
                        f"--device is required" if memory else None)
                if line is None:
                    device, unchecked = HOST, "Level Zero reports no GPU"
                else:
                    waiter.send(protocol.answer(line, EXIT_USAGE))
                    return EXIT_USAGE
            if unchecked is None:
                device = request.device or addresses[0]
                reading = next((gpu for gpu in memory if gpu.identity.pci_address == device), None)
                if reading is None:
                    waiter.send(protocol.answer(f"{gate_lines.PREFIX}error: --device {device}: no such GPU (GPUs: "
                                                f"{', '.join(addresses) or 'none'})", EXIT_USAGE))
                    return EXIT_USAGE
                if reading.free is None or reading.total is None:
                    unchecked, reading = f"the memory of {device} cannot be read ({reading.error})", None
                elif not reading.accounting_trusted:
                    unchecked, reading = (f"{device} reports free == total (untrusted memory accounting: the "
                                          f"service needs CAP_PERFMON)"), None
        views = {view.unit: view for view in state.views}
        own = views.get(waiter.unit)
        ratio = request.gpu_memory_utilization
        if ratio is None and own is not None:
            ratio = own.gpu_memory_utilization
        budget = request.kv_cache_memory_bytes
        if budget is None and own is not None and own.latest is not None:
            budget = own.latest.kv_cache_memory_bytes
        several = isinstance(memory, list) and len(memory) > 1
        devices = self._devices_of_units() if several and unchecked is None else None
        admission = Admission(waiter.unit, device, ratio, budget is not None)
        taken = self._taken(device) if budget is not None and reading is not None else None
        decision = decide(admission, state.views, self.leases.values(), devices, reading, taken)
        if unchecked is not None:
            waiter.say_once(f"{gate_lines.PREFIX}memory unchecked: {unchecked}; one init at a time"
                            + (" on this host (the GPUs cannot be told apart)" if device == HOST else ""))
        elif ratio is None:
            waiter.say_once(f"{gate_lines.PREFIX}no gpu_memory_utilization known for {waiter.unit} (none given, "
                            f"none in the journal): waiting only for other units' inits")
        if decision.release:
            self._grant(waiter, device, ratio, budget, reading, waiting_invocation(own))
            return self._release(waiter, decision, None, unchecked)
        for reason in decision.waiting_for:
            waiter.waited_for.setdefault(reason, None)
        if self.clock() >= waiter.deadline:
            return self._time_out(waiter, decision, device, ratio, budget, reading, waiting_invocation(own))
        if waiter.last is None or decision.waiting_for != waiter.last.waiting_for:
            waiter.last = decision
            if not waiter.send(protocol.say(f"{gate_lines.PREFIX}waiting for {','.join(decision.waiting_for)} "
                                            f"({gate_lines.figures(decision.free_bytes, decision.needed_bytes)})")):
                return EXIT_USAGE  # the client is gone
        waiter.last = decision
        return None

    def _devices_of_units(self) -> dict[str, set[str]]:
        try:
            devices = procfs.devices_in(self._scan_drm_clients())
        except procfs.ProcfsUnavailable:
            devices = {}
        for lease in self.leases.values():
            if lease.device != HOST:
                devices.setdefault(lease.unit, set()).add(lease.device)
        return devices

    def _scan_drm_clients(self) -> procfs.ScanResult:
        if self.privileged is not None:
            return self.privileged.scan()
        return procfs.scan_drm_clients(self.options.procfs)

    def _taken(self, device: str) -> dict[str, int] | None:
        """Device memory each unit's processes hold on the device (DRM fdinfo); None when unknown."""
        try:
            scan = self._scan_drm_clients()
        except procfs.ProcfsUnavailable:
            return None
        if scan.clients and not scan.memory_keys_seen:
            return None
        return dict(scan.memory_by_device_unit.get(device, {}))

    def _grant(self, waiter: Waiter, device: str, ratio: float | None, budget: int | None,
               reading: DeviceMemory | None, invocation_id: str) -> None:
        now = time.time_ns() // 1000
        needed = None
        if reading is not None and reading.total is not None and ratio is not None:
            needed = memory_rules.requested_bytes(reading.total, ratio)
        self.leases[(device, waiter.unit)] = Lease(device, waiter.unit, waiter.cgroup_path, now,
                                                   now + round(self.options.lease_timeout * 1e6),
                                                   needed, budget is not None, invocation_id)

    def _release(self, waiter: Waiter, decision: Decision | None, warning: str | None,
                 unchecked: str | None = None) -> int:
        if warning is not None:
            waiter.send(protocol.say(f"{gate_lines.PREFIX}warning: {warning}"))
        figures = decision or waiter.last
        line = gate_lines.format_released(self.clock() - waiter.began, list(waiter.waited_for),
                                          figures.free_bytes if figures else None,
                                          figures.needed_bytes if figures else None)
        if unchecked is not None:
            line += "; memory unchecked"
        waiter.send(protocol.answer(line, 0))
        return 0

    def _time_out(self, waiter: Waiter, decision: Decision | None, device: str | None = None,
                  ratio: float | None = None, budget: int | None = None, reading: DeviceMemory | None = None,
                  invocation_id: str = "") -> int:
        starting = waiter.request.start_on_timeout
        if starting and device is not None:  # it starts anyway: the next unit waits for its init like any other
            self._grant(waiter, device, ratio, budget, reading, invocation_id)
        last = decision or waiter.last
        waiting = last.waiting_for if last is not None else ()
        waiter.send(protocol.answer(gate_lines.format_timed_out(
            self.clock() - waiter.began, waiting or list(waiter.waited_for),
            last.free_bytes if last else None, last.needed_bytes if last else None, starting),
            0 if starting else 1))
        return 0 if starting else 1
