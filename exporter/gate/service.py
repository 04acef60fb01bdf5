"""`vllm-xpu-gate serve`: the gate service (docs/gate.md). One process for the host, its own systemd unit,
no root: it follows the journal once through the same follower and fold as the exporter, reads Level
Zero in a child, keeps each GPU's lease in memory, and answers the clients (`vllm_xpu_exporter.gate.client`)
that connect to its Unix socket.

Who is asking is the kernel's word, never the client's, and is read as the connection is accepted,
before its request: the connecting process's pid and uid from SO_PEERCRED, its unit from its cgroup
(`/proc/PID/cgroup`, read as the exporter reads it), and where the kernel has SO_PEERPIDFD a pidfd of
that process showing it still ran after the read (`Peer`: else the pid may have been another
process's). A caller outside the watched units (system `.service` units only: `EngineUnitSelection`), or
one that cannot be identified, is answered at once and holds nothing; a watched unit's caller takes one
of the `Slots` of its unit and its uid, has HANDSHAKE_TIMEOUT_S in all to send its request, then waits
its turn (`Waiter`), one wait per unit (a newer connection of the same unit replaces the older one).

One thread decides for every waiting unit (`Service.decide_round`), in the order they asked, each
poll interval and as soon as a client asks: so two units are never released on one stale view, and the
lease a release grants is seen by the next unit in the same round. How a unit is admitted is
`vllm_xpu_exporter.gate.decision`'s. A lease is granted only to a start the journal shows waiting at its
gate, once per start (never renewed), and holds from its release until the journal shows that start's
init ended, the unit's cgroup has been empty past a grace (the unit stopped before its engine began),
or --lease-timeout; the leases are kept in --lease-file, so that they outlive the process. Starts whose
wait ran out go one at a time, in order (`_released_after_deadline`).

A container's caller (docs/gate.md, "Containers") is its container's key, from its cgroup and its runtime's
state as the exporter names it (`ContainerNames`), watched when --journal.containers matches it; its start is
the process that asks (`ContainerRun`), leased while the container's logs (the journal, and with --logs.* its
log files) show no vLLM start since that process began; the lease ends as soon as the container's cgroup is
empty, or when it printed no vLLM line within the engine grace.

A wake (`vllm-xpu-gate wake`, docs/gate.md "Sleep and wake") is asked by a process in the sleeping unit's own
cgroup, as a start is (its unit's ExecReload=, say): the same slots bound it, and the same decision admits it,
needing what the engine's sleep freed. Its lease is granted only while the journal shows the unit's engine
asleep, once per sleep, and holds until the engine prints its wake's end ("It took X seconds to wake up tags"),
its start ends, its cgroup stays empty past the grace, or --lease-timeout. A container's wake is refused.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import select
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_xpu_exporter import memory_rules
from vllm_xpu_exporter.parsers import gate as gate_lines
from vllm_xpu_exporter.fold.engine_starts import ENGINE_GRACE_USEC, UnitView, merged_views
from vllm_xpu_exporter.gate import protocol
from vllm_xpu_exporter.gate.decision import (HOST, Admission, ContainerRun, Decision, Figures, Lease,
                                             asleep_invocation, container_waiting_invocation, decide, figures_now,
                                             lease_over, recorded_figures, wake_bytes, waiting_invocation)
from vllm_xpu_exporter.sources import procfs, plan_dropins
from vllm_xpu_exporter.sources.containerlogs import ContainerLogReader, LogDirectories
from vllm_xpu_exporter.sources.containers import ContainerNames
from vllm_xpu_exporter.sources.journal import open_journal
from vllm_xpu_exporter.sources.journal.selection import JournalSelection
from vllm_xpu_exporter.sources.logs.entry import LogSelection
from vllm_xpu_exporter.nodatayet import NoDataYet
from vllm_xpu_exporter.sources.logs.follower import LogFollower, LogState
from vllm_xpu_exporter.sources.levelzero.worker import DeviceMemory, LevelZeroUnavailable, LevelZeroWorker, WorkerState

if TYPE_CHECKING:
    from vllm_xpu_exporter.sources.privileged import PrivilegedReader

log = logging.getLogger("vllm_xpu_exporter.gate")

SD_LISTEN_FDS_START = 3
# Connections of watched units (handshakes and waits; a caller outside them holds none): in all, per unit
# and per uid. Beyond a limit a connection is closed at once.
MAX_CONNECTIONS = 256
MAX_CONNECTIONS_PER_UNIT = 4
MAX_CONNECTIONS_PER_UID = 64
HANDSHAKE_TIMEOUT_S = 3.0  # for the whole request, however it trickles in
# How long a watched unit's caller waits for the journal to show its unit's start waiting at its gate
# (systemd's "Starting" record, read by the follower a moment after the client connected). A caller of a
# unit whose journal shows no such start by then (a serving unit's own process asking) is released
# without a lease: it holds nobody back.
JOURNAL_LAG_S = 2.0
# The newest invocations given a lease, remembered so that none gets a second one.
REMEMBERED_LEASED_INVOCATIONS = 4096
SEND_TIMEOUT_S = 1.0
EXIT_USAGE = 2
STARTING_POLL_S = 0.02  # how often waiting units are decided again while the journal or Level Zero starts


@dataclass(frozen=True)
class ServiceOptions:
    listen: str | None  # a path to bind; None: the socket systemd passes (socket activation)
    selection: JournalSelection
    journal_max_units: int
    levelzero_library: str
    levelzero_timeout: float
    procfs: str
    sysfs: str
    lease_timeout: float
    poll_interval: float
    lease_file: str | None = None  # where the leases outlive the process (--lease-file); None: in memory only
    legacy_grace: float = 24 * 3600.0  # --legacy-grace
    plans: str = plan_dropins.DEFAULT_PLANS_DIRECTORY  # where root's plan drop-ins are (UNIT.d/zz-vllm-xpu-plan.conf)
    # the watched containers' log files (--logs.docker, --logs.podman, --logs.pods: LogDirectories' keywords)
    log_directories: Mapping[str, object] = field(default_factory=dict)


@dataclass(eq=False)
class Waiter:
    """A unit waiting for its turn: its connection, what it asked, what it waited for so far."""

    unit: str
    cgroup_path: str
    request: protocol.Request
    connection: socket.socket
    began: float  # monotonic
    uid: int = -1  # the caller's (SO_PEERCRED): its connection holds one of that uid's slots
    run: ContainerRun | None = None  # a container's caller: the process that asks (None: a unit's)
    began_usec: int = field(default_factory=lambda: time.time_ns() // 1000)  # wall clock, as the journal's
    waited_for: dict[str, None] = field(default_factory=dict)  # in the order first met
    last: Decision | None = None
    said: set[str] = field(default_factory=set)

    @property
    def deadline(self) -> float:
        return self.began + self.request.timeout

    @property
    def deadline_usec(self) -> int:
        return self.began_usec + round(self.request.timeout * 1e6)

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
    """The process that connected, as the kernel recorded it: its pid and uid (SO_PEERCRED) and, where the
    kernel gives one, a pidfd of that very process (None on kernels before 6.5: the pid is all there is)."""

    pid: int
    pidfd: int | None
    gone: str | None = None  # why the kernel gave no pidfd of a process it knows: it has exited
    uid: int = -1

    @classmethod
    def of(cls, connection: socket.socket) -> Peer:
        pid, uid, _gid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                   struct.calcsize("3i")))
        try:
            return cls(pid, struct.unpack("i", connection.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4))[0],
                       uid=uid)
        except OSError as error:
            if error.errno == errno.ENOPROTOOPT:  # a kernel before 6.5
                return cls(pid, None, uid=uid)
            return cls(pid, None, f"no pidfd of pid {pid}: {error.strerror or error}", uid)  # ESRCH, EINVAL: exited

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


@dataclass(frozen=True)
class Caller:
    """A process of a watched unit or container that connected: its unit (a container's key) and cgroup, and
    its uid, as the kernel says; in a container, that process itself (`ContainerRun`)."""

    unit: str
    path: str  # the unit's (the container's) cgroup
    uid: int
    run: ContainerRun | None = None


class Slots:
    """The connections of watched units' callers, bounded in all, per unit and per uid: a unit's processes
    (or one uid's) cannot take the room of the others. Callers outside the watched units hold none."""

    def __init__(self, total: int = MAX_CONNECTIONS, per_unit: int = MAX_CONNECTIONS_PER_UNIT,
                 per_uid: int = MAX_CONNECTIONS_PER_UID) -> None:
        self.total, self.per_unit, self.per_uid = total, per_unit, per_uid
        self.held = 0
        self.of_unit: dict[str, int] = {}
        self.of_uid: dict[int, int] = {}
        self.full: set[str] = set()  # units refused a slot since they last gave one back

    def take(self, unit: str, uid: int) -> bool:
        if (self.held >= self.total or self.of_unit.get(unit, 0) >= self.per_unit
                or self.of_uid.get(uid, 0) >= self.per_uid):
            if unit not in self.full:
                self.full.add(unit)
                log.warning("%s (uid %d) holds all the connections it may: further ones are closed", unit, uid)
            return False
        self.held += 1
        self.of_unit[unit] = self.of_unit.get(unit, 0) + 1
        self.of_uid[uid] = self.of_uid.get(uid, 0) + 1
        return True

    def give_back(self, unit: str, uid: int) -> None:
        self.held -= 1
        self.full.discard(unit)
        for counts, key in ((self.of_unit, unit), (self.of_uid, uid)):
            counts[key] -= 1
            if not counts[key]:
                del counts[key]


def identify_caller(connection: socket.socket, procfs_root: str, selection: LogSelection,
                    names: ContainerNames | None = None) -> Caller | str:
    """The watched unit or container of the process that connected (SO_PEERCRED, then its cgroup; a container's
    key from its cgroup and its runtime's state, `names`, as the exporter's), or the line that answers a caller
    outside them or one that cannot be identified."""
    peer = Peer.of(connection)
    start_ticks = None
    try:
        try:
            caller, why = procfs.read_unit_cgroup(procfs_root, peer.pid), "it is in no unit"
            if caller is not None and caller.container is not None:
                start_ticks = procfs.process_start_ticks(procfs_root, peer.pid)
                if start_ticks is None:
                    caller, why = None, f"cannot read /proc/{peer.pid}/stat"
        except OSError as error:
            caller, why = None, f"cannot read /proc/{peer.pid}/cgroup: {error.strerror or error}"
        try:
            peer.check_running()  # else that cgroup may be of a process that took the pid over
        except PeerGone as gone:
            caller, why = None, f"the process that connected is gone: {gone}"
    finally:
        peer.close()
    if caller is None:
        return f"{gate_lines.PREFIX}warning: the service cannot tell which unit asks ({why}): releasing"
    if caller.container is None or start_ticks is None:
        if not selection.matches_unit(caller.unit):
            return f"{gate_lines.PREFIX}{caller.unit} is not a watched unit (--journal.units): nothing to wait for"
        return Caller(caller.unit, caller.path, peer.uid)
    names = names or ContainerNames()
    key = names.workload(caller.unit, caller.container).unit
    if "/" not in key or not selection.matches_unit(key):  # no key: the runtime's state names no such container
        return (f"{gate_lines.PREFIX}{key} is not a watched container (--journal.containers, the runtime's state "
                f"under --path.*): nothing to wait for")
    run = ContainerRun(f"{caller.path}#{peer.pid}:{start_ticks}", procfs.realtime_usec_of_ticks(start_ticks),
                       names.recorded_command(caller.container))
    return Caller(key, caller.path, peer.uid, run)


def memory_by_device_workload(scan: procfs.ScanResult,
                              key_of_path: Callable[[str], str | None]) -> dict[str, dict[str, int]]:
    """The scan's device memory per cgroup leaf, per workload as leases and logs name it: a container's leaf
    (`docker-<id>.scope`) by its key (`key_of_path`: `docker/<name>`), a unit's by its name."""
    keys = {unit: next(filter(None, map(key_of_path, sorted(paths))), unit) for unit, paths in scan.unit_cgroups.items()}
    by_device: dict[str, dict[str, int]] = {}
    for device, by_unit in scan.memory_by_device_unit.items():
        mine = by_device.setdefault(device, {})
        for unit, size in by_unit.items():
            key = keys.get(unit, unit)
            mine[key] = mine.get(key, 0) + size
    return by_device


def answer_at_once(connection: socket.socket, line: str, status: int = 0, *, close: bool = True) -> None:
    """Answer a caller that has nothing to wait for (status 0: released, with a decision line) or that
    asked wrongly, without waiting on it: a fresh connection's send buffer takes these few lines whole."""
    try:
        connection.setblocking(False)
        if status == 0:
            connection.send(protocol.say(line) + protocol.answer(gate_lines.format_released(0.0, [], None, None), 0))
        else:
            connection.send(protocol.answer(line, status))
        connection.recv(protocol.MAX_MESSAGE_BYTES)  # what it sent: closing on unread data would reset it
    except OSError:
        pass
    if close:
        connection.close()


MAX_LEASE_FILE_BYTES = 1 << 20
_LEASE_FIELDS = {"device": str, "unit": str, "cgroup_path": str, "granted_usec": int, "expires_usec": int,
                 "needed_bytes": (int, type(None)), "absolute_budget": bool, "invocation_id": str,
                 "timed_out": bool, "wake": bool}
_LEASE_FIELDS_BEFORE_WAKES = set(_LEASE_FIELDS) - {"wake"}  # a lease file of a service that knew no wake


def parse_saved_leases(data: bytes) -> tuple[list[Lease], list[str], dict[str, int]]:
    """The leases, leased starts and first 0.2 drop-in starts of a lease file (`Service._save_leases`);
    ValueError for anything else."""
    if len(data) > MAX_LEASE_FILE_BYTES:
        raise ValueError("larger than a lease file")
    document = json.loads(data)
    if not isinstance(document, dict) or not isinstance(document.get("leases"), list) \
            or not isinstance(document.get("invocations"), list):
        raise ValueError("not a lease file")
    leases = []
    for fields in document["leases"]:
        if isinstance(fields, dict) and set(fields) == _LEASE_FIELDS_BEFORE_WAKES:
            fields = {**fields, "wake": False}
        if not isinstance(fields, dict) or set(fields) != set(_LEASE_FIELDS) or not all(
                isinstance(fields[name], kind) for name, kind in _LEASE_FIELDS.items()):
            raise ValueError("a lease of other fields")
        leases.append(Lease(**fields))
    if not all(isinstance(invocation, str) for invocation in document["invocations"]):
        raise ValueError("an invocation id that is no string")
    legacy = document.get("legacy_first_seen", {})
    if not isinstance(legacy, dict) or not all(type(usec) is int for usec in legacy.values()):
        raise ValueError("first 0.2 drop-in starts that are no times")
    return leases, document["invocations"], legacy


def plan_ratio(value: str | None) -> float | None:
    """The R root's plan drop-in gives the client; None when it gives none that is a ratio."""
    try:
        ratio = float(value) if value is not None else None
    except ValueError:
        return None
    return ratio if ratio is not None and 0 < ratio <= 1 else None


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
    directory, name = os.path.split(path)
    # The directory is opened once and the socket made inside it through that descriptor, with its mode set
    # by the umask as it is created: no later step follows a path someone could have swapped meanwhile (a
    # chmod of the path would follow a symbolic link put there to a root file).
    directory_fd = os.open(directory or "/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            if stat.S_ISSOCK(os.stat(name, dir_fd=directory_fd, follow_symlinks=False).st_mode):
                os.unlink(name, dir_fd=directory_fd)  # a socket left by an earlier run
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        umask = os.umask(0o111)  # the socket is created 0666: any local process may ask
        try:
            listener.bind(f"/proc/self/fd/{directory_fd}/{name}")
        except OSError:
            listener.close()
            raise
        finally:
            os.umask(umask)
    finally:
        os.close(directory_fd)
    listener.listen(64)
    return listener


@dataclass(frozen=True)
class EngineUnitSelection(JournalSelection):
    """The service's selection of units: only system `.service` units are possible engines, whatever the
    globs say (`vllm*` matches vllm-xpu-gate.socket, and a user's `vllm-x.service@uid1000`); and the containers
    the container globs match, by their key (a rootless user's with its `@uid<N>`)."""

    def matches_unit(self, unit: str) -> bool:
        return ("/" in unit or unit.endswith(".service")) and super().matches_unit(unit)


def container_log_follower(options: ServiceOptions) -> LogFollower | None:
    """The watched containers' log files (--logs.docker, --logs.podman, --logs.pods) folded as the exporter folds
    them; None when none is given."""
    directories = LogDirectories(**options.log_directories)
    if not directories:
        return None
    selection = options.selection

    def open_reader(selection: LogSelection, admit: Callable[[str], bool],
                    forget: Callable[[str], None]) -> ContainerLogReader:
        return ContainerLogReader(selection, directories, admit=admit, forget=forget)

    return LogFollower(LogSelection(unit_globs=selection.unit_globs, container_globs=selection.container_globs,
                                    boot=selection.boot, engine_grace_usec=selection.engine_grace_usec),
                       options.journal_max_units, open_reader=open_reader, source="container logs")


def engine_units_only(selection: JournalSelection) -> EngineUnitSelection:
    return EngineUnitSelection(**{name.name: getattr(selection, name.name) for name in dataclasses.fields(selection)})


class Service:
    def __init__(self, options: ServiceOptions, *, clock: Callable[[], float] = time.monotonic,
                 privileged: PrivilegedReader | None = None) -> None:
        self.options = options
        self.privileged = privileged  # reads the units' fds when the service separates privileges
        self.clock = clock
        self.began = clock()
        self.journal = LogFollower(options.selection, options.journal_max_units, open_reader=open_journal,
                                   source="journal", latest_invocations=True)
        self.container_logs = container_log_follower(options)
        self.levelzero = LevelZeroWorker(options.levelzero_library, options.levelzero_timeout, telemetry=False,
                                         spawn=None if privileged is None else privileged.spawn_levelzero)
        self.container_names = ContainerNames(**options.selection.container_state)
        self.leases: dict[tuple[str, str], Lease] = {}  # (device or HOST, unit) -> the unit's latest release there
        self._empty_since: dict[tuple[str, str], int] = {}  # a lease's key -> since when its cgroup is seen empty
        self.leased_invocations: dict[str, None] = {}  # the starts given a lease, oldest first
        self.legacy_first_seen: dict[str, int] = {}  # unit -> when a start of it first ran the 0.2 drop-in (usec)
        self.lease_file = options.lease_file
        self._load_leases()
        self.waiting: list[Waiter] = []  # decider thread only
        self._arrived: list[Waiter] = []
        self.slots = Slots()  # guarded by _condition
        self._condition = threading.Condition()
        self._stop = threading.Event()
        self._sources_starting = False  # the last round found the journal unread or Level Zero starting

    # --- lifecycle ---------------------------------------------------------------------------------

    def start_sources(self) -> None:
        self.journal.start()
        if self.container_logs is not None:
            self.container_logs.start()
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
        if self.container_logs is not None:
            self.container_logs.stop(timeout=1.0)
        self.levelzero.close()
        if self.privileged is not None:
            self.privileged.close()

    def accept(self, connection: socket.socket) -> None:
        """Who connected, from the kernel, before a byte is read: a caller outside the watched units (or one
        that cannot be identified) is answered at once and holds no slot; a watched unit's caller takes one
        of its unit's and its uid's slots and is read by a thread of its own, for HANDSHAKE_TIMEOUT_S in all."""
        try:
            caller = self.identify(connection)
        except Exception as error:  # a bug here must not stop the service
            log.warning("a connection failed: %s: %s", type(error).__name__, error)
            connection.close()
            return
        if isinstance(caller, str):
            answer_at_once(connection, caller)
            return
        with self._condition:
            taken = self.slots.take(caller.unit, caller.uid)
        if not taken:
            connection.close()
            return
        try:
            threading.Thread(target=self._handshake, args=(connection, caller), daemon=True).start()
        except RuntimeError:  # no thread to be had: the client waits its bound and starts ungated
            self._closed(connection, caller)

    def _closed(self, connection: socket.socket, caller: Caller | Waiter) -> None:
        connection.close()
        with self._condition:
            self.slots.give_back(caller.unit, caller.uid)

    # --- who asks ----------------------------------------------------------------------------------

    def identify(self, connection: socket.socket) -> Caller | str:
        return identify_caller(connection, self.options.procfs, self.options.selection, self.container_names)

    def _handshake(self, connection: socket.socket, caller: Caller) -> None:
        """The watched caller's request, then a waiter for the decider (or an answer now)."""
        try:
            waiter = self._read_request(connection, caller)
        except Exception as error:  # a bug here must not stop the service
            log.warning("a connection failed: %s: %s", type(error).__name__, error)
            waiter = None
        if waiter is None:
            self._closed(connection, caller)
            return
        with self._condition:
            self._arrived.append(waiter)
            self._condition.notify_all()

    def _read_request(self, connection: socket.socket, caller: Caller) -> Waiter | None:
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        data = b""
        try:
            while b"\n" not in data and len(data) <= protocol.MAX_MESSAGE_BYTES:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                connection.settimeout(remaining)
                chunk = connection.recv(protocol.MAX_MESSAGE_BYTES)
                if not chunk:
                    return None
                data += chunk
        except OSError:
            return None
        try:
            request = protocol.Request.decode(data.partition(b"\n")[0])
        except protocol.BadRequest as error:
            answer_at_once(connection, f"{gate_lines.PREFIX}error: {error}", EXIT_USAGE, close=False)
            return None
        return Waiter(caller.unit, caller.path, request, connection, self.clock(), uid=caller.uid, run=caller.run)

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
            if waiter.request.legacy_drop_in and self._refuse_legacy(waiter):
                self._closed(waiter.connection, waiter)
                continue
            for older in [other for other in self.waiting if other.unit == waiter.unit]:
                self._finish(older)  # the unit asks again (a new start, a restarted client)
            self.waiting.append(waiter)

    def _refuse_legacy(self, waiter: Waiter) -> bool:
        """A start through the 0.2 drop-in: answered as any other within --legacy-grace of the first such
        start of the unit the service saw (this boot: the lease file's life), then refused (exit 1)."""
        now = time.time_ns() // 1000
        first = self.legacy_first_seen.setdefault(waiter.unit, now)
        if first == now:
            self._save_leases()
        if now - first < self.options.legacy_grace * 1e6:
            return False
        waiter.send(protocol.answer(f"{gate_lines.PREFIX}error: the 0.2 drop-in is refused ({waiter.unit} has run it "
                                    f"for {(now - first) / 1e6:.0f}s, --legacy-grace {self.options.legacy_grace:g}s): "
                                    f"replace it by the 0.3 drop-in (docs/gate.md, Migrating from 0.2)", 1))
        return True

    def _finish(self, waiter: Waiter) -> None:
        self.waiting.remove(waiter)
        self._closed(waiter.connection, waiter)

    def decide_round(self) -> None:
        """Decide for every waiting unit, in the order they asked."""
        if not self.waiting:
            return
        state = self._log_state()
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

    def _log_state(self) -> LogState:
        """The journal's fold and, with --logs.*, the container log files' (the exporter's two followers), their
        units and containers each once (`merged_views`); the first error of either."""
        state = self.journal.state()
        if self.container_logs is None:
            return state
        files = self.container_logs.state()
        return dataclasses.replace(state, views=merged_views((state.views, files.views)),
                                   error=state.error or files.error)

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
            if populated is False:
                self._empty_since.setdefault(key, now_usec)
            else:
                self._empty_since.pop(key, None)
            ended = lease_over(lease, views.get(lease.unit), now_usec, populated, self._engine_grace_usec,
                               self._empty_since.get(key))
            if ended is not None:
                log.info("%s's lease on %s ended: %s", lease.unit, lease.device, ended)
                del self.leases[key]
                self._empty_since.pop(key, None)
                self._save_leases()

    def _load_leases(self) -> None:
        """The leases and leased starts an earlier run of the service saved (--lease-file): a start released
        just before the service stopped holds the others back as if it had not."""
        if self.lease_file is None:
            return
        try:
            with open(self.lease_file, "rb") as saved:
                leases, invocations, legacy = parse_saved_leases(saved.read(MAX_LEASE_FILE_BYTES + 1))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as error:
            log.warning("ignoring the saved leases in %s: %s", self.lease_file, error)
            return
        self.leases = {(lease.device, lease.unit): lease for lease in leases}
        self.leased_invocations = dict.fromkeys(invocations[-REMEMBERED_LEASED_INVOCATIONS:])
        self.legacy_first_seen = legacy
        if leases:
            log.info("leases kept from the service's last run: %s",
                     ", ".join(f"{lease.unit} on {lease.device}" for lease in leases))

    def _save_leases(self) -> None:
        if self.lease_file is None:
            return
        temporary = f"{self.lease_file}.new"
        try:
            with open(temporary, "w", encoding="utf-8") as out:
                out.write(json.dumps({"leases": [dataclasses.asdict(lease) for lease in self.leases.values()],
                                      "invocations": list(self.leased_invocations),
                                      "legacy_first_seen": self.legacy_first_seen}))
            os.replace(temporary, self.lease_file)
        except OSError as error:
            log.warning("cannot save the leases in %s: %s", self.lease_file, error)

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
        if request.wake:
            return self._decide_wake(waiter, state, device, reading, unchecked, own, memory)
        figures = self.figures(waiter, own)
        ratio, budget = figures.gpu_memory_utilization, figures.kv_cache_memory_bytes
        if figures.unverified is not None:
            waiter.say_once(f"{gate_lines.PREFIX}its KV budget is not taken ({figures.unverified}): in order")
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
            invocation = self._waiting_invocation(waiter, own)
            if not invocation and self.clock() < waiter.began + JOURNAL_LAG_S:
                return None  # its start's "Starting" may not have been read yet
            granted = self._grant(waiter, device, ratio, budget, reading, invocation)
            return self._release(waiter, decision, None if granted else self._no_lease(waiter, invocation), unchecked)
        for reason in decision.waiting_for:
            waiter.waited_for.setdefault(reason, None)
        if self.clock() >= waiter.deadline:
            if request.start_on_timeout:
                later = self._released_after_deadline(waiter, admission, state.views, devices)
                if later:
                    waiter.say_once(f"{gate_lines.PREFIX}timed out; waiting still for {','.join(later)}, "
                                    f"released after this wait ran out (timed-out starts go one at a time)")
                    return None
            return self._time_out(waiter, decision, device, ratio, budget, reading,
                                  self._waiting_invocation(waiter, own))
        return self._tell_waiting(waiter, decision)

    def _decide_wake(self, waiter: Waiter, state: LogState, device: str, reading: DeviceMemory | None,
                     unchecked: str | None, own: UnitView | None, memory: list[DeviceMemory] | str) -> int | None:
        """A wake: answered at once without a lease unless the journal shows the unit's engine asleep, then
        admitted as a start is, needing what its sleep freed; its lease holds the others back until it woke."""
        if waiter.run is not None:
            waiter.send(protocol.answer(f"{gate_lines.PREFIX}error: {waiter.unit}: a container's wake is not gated "
                                        f"(only a systemd unit's)", EXIT_USAGE))
            return EXIT_USAGE
        wake = asleep_invocation(own)
        if not wake and self.clock() < waiter.began + JOURNAL_LAG_S:
            return None  # its sleep's line may not have been read yet
        if not wake:
            return self._release(waiter, None, f"the journal shows no sleeping engine of {waiter.unit}: released "
                                               f"without a lease (it holds nobody back)")
        takes_back = wake_bytes(own, reading.total if reading is not None else None)
        several = isinstance(memory, list) and len(memory) > 1
        devices = self._devices_of_units() if several and unchecked is None else None
        admission = Admission(waiter.unit, device, None, True, takes_back)
        decision = decide(admission, state.views, self.leases.values(), devices, reading,
                          self._taken(device) if reading is not None else None)
        if unchecked is not None:
            waiter.say_once(f"{gate_lines.PREFIX}memory unchecked: {unchecked}; one init or wake at a time")
        if decision.release:
            granted = self._grant(waiter, device, None, None, reading, wake, wake_bytes=takes_back)
            return self._release(waiter, decision, None if granted else f"this sleep of {waiter.unit} had its wake's "
                                                                        f"lease already: none again", unchecked)
        for reason in decision.waiting_for:
            waiter.waited_for.setdefault(reason, None)
        if self.clock() >= waiter.deadline:
            if waiter.request.start_on_timeout:
                self._grant(waiter, device, None, None, reading, wake, True, takes_back)
            return self._time_out(waiter, decision)
        return self._tell_waiting(waiter, decision)

    def _tell_waiting(self, waiter: Waiter, decision: Decision) -> int | None:
        """Say what the waiter waits for when that changed; EXIT_USAGE when its client is gone."""
        if waiter.last is None or decision.waiting_for != waiter.last.waiting_for:
            waiter.last = decision
            if not waiter.send(protocol.say(f"{gate_lines.PREFIX}waiting for {','.join(decision.waiting_for)} "
                                            f"({gate_lines.figures(decision.free_bytes, decision.needed_bytes)})")):
                return EXIT_USAGE  # the client is gone
        waiter.last = decision
        return None

    @staticmethod
    def _waiting_invocation(waiter: Waiter, own: UnitView | None) -> str:
        """The start of the waiter's unit or container that waits at its gate; '' when none is seen."""
        return waiting_invocation(own) if waiter.run is None else container_waiting_invocation(waiter.run, own)

    @property
    def _engine_grace_usec(self) -> int:
        grace = self.options.selection.engine_grace_usec
        return ENGINE_GRACE_USEC if grace is None else grace

    def figures(self, waiter: Waiter, own: UnitView | None) -> Figures:
        """The R and the budget the unit's start will run with now, as far as root's plan drop-in and the
        journal vouch for them (`figures_now`): what the client states can only make it wait longer. A
        container's plan is the command root's engine recorded when it was created (the planner's Compose and
        Podman outputs put the budget there); a rootless user's container, whose state is the user's to write,
        has none and waits in order."""
        if waiter.run is not None:
            ratio, budget = recorded_figures(waiter.run.recorded_command)
            problem = ("its engine recorded no command of root's" if not waiter.run.recorded_command
                       else "its recorded command sets no --kv-cache-memory-bytes")
            return figures_now(waiter.request.gpu_memory_utilization, waiter.request.kv_cache_memory_bytes, budget,
                               problem, [], own.latest if own is not None else None, ratio)
        plan_budget, problem = plan_dropins.plan_budget_now(self.options.plans, waiter.unit)
        overrides = plan_dropins.exec_start_overrides(waiter.unit, self.options.plans) if plan_budget else []
        return figures_now(waiter.request.gpu_memory_utilization, waiter.request.kv_cache_memory_bytes, plan_budget,
                           problem, overrides, own.latest if own is not None else None,
                           plan_ratio(plan_dropins.plan_environment_now(self.options.plans, waiter.unit,
                                                                      protocol.RATIO_VARIABLE)))

    def _devices_of_units(self) -> dict[str, set[str]]:
        devices: dict[str, set[str]] = {}
        try:
            by_device = memory_by_device_workload(self._scan_drm_clients(), self.container_names.key_of_cgroup_path)
        except procfs.ProcfsUnavailable:
            by_device = {}
        for device, by_workload in by_device.items():
            for workload in by_workload:
                devices.setdefault(workload, set()).add(device)
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
        return memory_by_device_workload(scan, self.container_names.key_of_cgroup_path).get(device, {})

    def _released_after_deadline(self, waiter: Waiter, admission: Admission, views: Sequence[UnitView],
                                 devices: dict[str, set[str]] | None) -> tuple[str, ...]:
        """The units that hold the timed-out waiter back still: those released because their own wait ran
        out, and those released or beginning their init after its own wait ran out. What else held it, it
        no longer waits for. So timed-out starts go one at a time, in the order they asked."""
        late_views = [view for view in views if (view.initialising_since_usec or 0) >= waiter.deadline_usec]
        late_leases = [lease for lease in self.leases.values()
                       if lease.timed_out or lease.granted_usec >= waiter.deadline_usec]
        return decide(admission, late_views, late_leases, devices, None).units

    def _grant(self, waiter: Waiter, device: str, ratio: float | None, budget: int | None,
               reading: DeviceMemory | None, invocation_id: str, timed_out: bool = False,
               wake_bytes: int | None = None) -> bool:
        """Lease the device to the waiter's start: only a start the journal shows waiting at its gate
        (`invocation_id`), and only once per start, never renewed; or, with `wake_bytes` (what it takes back), to
        its wake (`invocation_id`: the sleep's key, `asleep_invocation`), once per sleep. Whether it leased."""
        if not invocation_id or invocation_id in self.leased_invocations:
            return False
        now = time.time_ns() // 1000
        needed = wake_bytes
        if reading is not None and reading.total is not None and ratio is not None:
            needed = memory_rules.requested_bytes(reading.total, ratio)
        self.leases[(device, waiter.unit)] = Lease(device, waiter.unit, waiter.cgroup_path, now,
                                                   now + round(self.options.lease_timeout * 1e6),
                                                   needed, budget is not None or wake_bytes is not None,
                                                   invocation_id, timed_out, wake_bytes is not None)
        self.leased_invocations[invocation_id] = None
        while len(self.leased_invocations) > REMEMBERED_LEASED_INVOCATIONS:
            del self.leased_invocations[next(iter(self.leased_invocations))]
        self._save_leases()
        return True

    @staticmethod
    def _no_lease(waiter: Waiter, invocation_id: str) -> str:
        if waiter.run is not None and not invocation_id:
            return (f"{waiter.unit} has printed vLLM's lines since the process that asks began (no start waits at "
                    f"its gate): released without a lease (it holds nobody back)")
        if invocation_id:
            return f"this start of {waiter.unit} ({invocation_id}) had its lease already: none again"
        return (f"the journal shows no start of {waiter.unit} waiting at its gate: released without a lease "
                f"(it holds nobody back)")

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
            self._grant(waiter, device, ratio, budget, reading, invocation_id, timed_out=True)
        last = decision or waiter.last
        waiting = last.waiting_for if last is not None else ()
        waiter.send(protocol.answer(gate_lines.format_timed_out(
            self.clock() - waiter.began, waiting or list(waiter.waited_for),
            last.free_bytes if last else None, last.needed_bytes if last else None, starting),
            0 if starting else 1))
        return 0 if starting else 1
