"""`vllm-xpu-gate`: an `ExecStartPre=` gate that lets a vLLM unit's engine start only when no other watched
unit on the same GPU is initialising and enough device memory is free, and otherwise waits.

    ExecStartPre=+/bin/busybox env -i /opt/vllm-xpu-exporter/bin/vllm-xpu-gate --unit %n --timeout 10m

(a static `env -i` first: the gate runs as root, and the unit's environment is its user's; docs/security.md).

It reads the same journal through the same fold as the exporter (`JournalFollower` over
`exporter.fold.engine_starts`) to know which watched units are initialising (main process started, init
neither completed nor failed; a unit waiting in its own gate is not), and Level Zero, in a child
(`LevelZeroWorker`), for free and total memory. It needs no running exporter.

Decision, per device: release (exit 0) once no other watched unit on the device is initialising, no other
unit holds the device's lease, and free memory is at least ceil(R x total), R from
--gpu-memory-utilization or what the unit's latest start printed (unknown R: only inits are waited for).
Two gates never release together: each decides holding an flock on `<lease dir>/<device>.lock`, and a
release writes `<lease dir>/<device>.lease` naming the unit and its invocation id (systemd's, from
`systemctl show`; $INVOCATION_ID only when systemctl cannot answer). The lease holds from release until that invocation's init
completes or fails in the journal, the unit's process is gone (the journal or systemctl says so), or the
lease times out (--lease-timeout); a stale lease never blocks anyone, and a unit's own lease never blocks
it. On hosts with several GPUs a unit counts on the devices its processes hold DRM clients on (procfs) or
its lease names; a unit whose device is unknown counts on every device.

A gate that cannot read the journal or Level Zero, or whose device reports untrusted memory accounting,
says so and releases at once: it never strands a unit. After --timeout it exits 0 with a warning
(--on-timeout start, the default) or 1 (fail). Bad flags exit 2 with one line. Every line it writes
(stderr: the unit's journal) begins with "vllm-xpu-gate: "; the decision lines are written and read by
`exporter.parsers.gate`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import json
import logging
import math
import os
import secrets
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import ClassVar, TextIO

from exporter import __version__
from exporter import memory as memory_rules
from exporter.durations import parse_go_duration
from exporter.flags import (EXIT_USAGE, OneLineParser, absolute_path, add_journal_flags, add_levelzero_flags,
                            add_procfs_flag, add_systemctl_flag, check_journal_flags, journal_selection)
from exporter.fold.engine_starts import UnitView
from exporter.parsers import gate as gate_lines
from exporter.pci import normalise_pci_address
from exporter.sources import procfs
from exporter.sources.journal import JournalSelection
from exporter.sources.journal.follower import STILL_READING, JournalFollower, JournalState
from exporter.sources.levelzero.worker import DeviceMemory, LevelZeroUnavailable, LevelZeroWorker, WorkerState
from exporter.systemd import parse_timespan

PROG = "vllm-xpu-gate"
EXIT_RELEASED = 0
EXIT_TIMED_OUT = 1  # --on-timeout fail
EXIT_TERMINATED = 128 + signal.SIGTERM
DEFAULT_TIMEOUT = "10m"
DEFAULT_LEASE_TIMEOUT = "10m"
DEFAULT_LEASE_DIRECTORY = "/run/vllm-xpu-gate"
DEFAULT_POLL_INTERVAL = "500ms"
# --timeout, --lease-timeout, --poll-interval: a week is past any start, and far larger durations overflow
# time.sleep() and the lease's microseconds at run time.
MAX_DURATION_S = 7 * 24 * 3600.0
SYSTEMCTL_TIMEOUT_S = 5.0
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
KEPT_FROM_THE_UNITS_ENVIRONMENT = frozenset({"INVOCATION_ID", "LANG", "LC_ALL", "LC_CTYPE"})
SET_BY_SYSTEMD_FOR_EVERY_COMMAND = frozenset({"JOURNAL_STREAM", "SYSTEMD_EXEC_PID"})
# systemd's states of a unit whose processes are gone.
UNIT_GONE_ACTIVE_STATES = frozenset({"inactive", "failed"})
UNIT_GONE_SUB_STATES = frozenset({"auto-restart", "dead", "failed"})


# ----------------------------------------------------------------------------------------- flags

@dataclass(frozen=True)
class GateOptions:
    unit: str
    device: str | None
    gpu_memory_utilization: float | None
    timeout: float
    start_on_timeout: bool
    selection: JournalSelection
    journal_max_units: int
    levelzero_library: str
    levelzero_timeout: float
    procfs: str
    lease_directory: str
    lease_timeout: float
    poll_interval: float
    systemctl: str


def unit_name(value: str) -> str:
    if not value or any(character.isspace() or character == "/" for character in value):
        raise argparse.ArgumentTypeError(f"not a unit name: {value!r}")
    return value


def pci_address(value: str) -> str:
    address = normalise_pci_address(value)
    if address is None:
        raise argparse.ArgumentTypeError(f"not a PCI address: {value!r} (e.g. 0000:03:00.0)")
    return address


def ratio(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 < number <= 1:
        raise argparse.ArgumentTypeError(f"want a number above 0 and at most 1, got {value!r}")
    return number


def go_duration(value: str) -> float:
    """A Go duration (10m, 1m30s, 500ms), 0 or more, at most MAX_DURATION_S."""
    try:
        seconds = parse_go_duration(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if seconds > MAX_DURATION_S:
        raise argparse.ArgumentTypeError(f"at most 168h (7 days), got {value!r}")
    return seconds


def positive_go_duration(value: str) -> float:
    seconds = go_duration(value)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive, got {value!r}")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description="ExecStartPre= gate for vLLM units: wait until no other watched unit on the GPU is "
                    "initialising and enough memory is free (see docs/gate.md).")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--unit", required=True, type=unit_name, metavar="UNIT",
                        help="the gated unit (%%n in the unit file)")
    parser.add_argument("--device", type=pci_address, default=None, metavar="BDF",
                        help="PCI address of the unit's GPU (default: the only GPU; required with several)")
    parser.add_argument("--gpu-memory-utilization", dest="gpu_memory_utilization", type=ratio, default=None,
                        metavar="R", help="free memory needed is ceil(R x total) (default: what the unit's latest "
                                          "start printed)")
    parser.add_argument("--timeout", type=go_duration, default=DEFAULT_TIMEOUT, metavar="DURATION",
                        help=f"give up waiting after this long (Go duration; default {DEFAULT_TIMEOUT})")
    parser.add_argument("--on-timeout", dest="on_timeout", choices=("start", "fail"), default="start",
                        help="after --timeout: let the unit start (exit 0, the default) or fail its start (exit 1)")
    parser.add_argument("--lease-directory", dest="lease_directory", type=absolute_path,
                        default=DEFAULT_LEASE_DIRECTORY, metavar="DIR",
                        help=f"absolute path of the directory of the per-device lock and lease files, made by the "
                             f"gate and root's alone (default {DEFAULT_LEASE_DIRECTORY})")
    parser.add_argument("--lease-timeout", dest="lease_timeout", type=positive_go_duration,
                        default=DEFAULT_LEASE_TIMEOUT, metavar="DURATION",
                        help=f"a lease the journal never shows ending stops holding after this long "
                             f"(default {DEFAULT_LEASE_TIMEOUT})")
    parser.add_argument("--poll-interval", dest="poll_interval", type=positive_go_duration,
                        default=DEFAULT_POLL_INTERVAL, metavar="DURATION",
                        help=f"how often a waiting gate looks again (default {DEFAULT_POLL_INTERVAL})")
    add_systemctl_flag(parser, "to ask about units' states")
    add_journal_flags(parser)
    add_levelzero_flags(parser)
    add_procfs_flag(parser)
    return parser


def parse_options(argv: Sequence[str] | None = None) -> GateOptions:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_journal_flags(parser, args)
    return GateOptions(
        unit=args.unit,
        device=args.device,
        gpu_memory_utilization=args.gpu_memory_utilization,
        timeout=args.timeout,
        start_on_timeout=args.on_timeout == "start",
        # the unit itself is read whatever the globs: its latest start says its gpu_memory_utilization
        selection=journal_selection(args, extra_units=(args.unit,)),
        journal_max_units=args.journal_max_units,
        levelzero_library=args.levelzero_library,
        levelzero_timeout=args.levelzero_timeout,
        procfs=args.procfs,
        lease_directory=args.lease_directory,
        lease_timeout=args.lease_timeout,
        poll_interval=args.poll_interval,
        systemctl=args.systemctl,
    )


# ---------------------------------------------------------------------------------------- output

class Output:
    """Lines on stderr (the unit's journal), each beginning with "vllm-xpu-gate: "."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._warned: set[str] = set()

    def say(self, text: str) -> None:
        self._stream.write(gate_lines.PREFIX + " ".join(text.splitlines()) + "\n")
        self._stream.flush()

    def warn(self, text: str) -> None:
        self.say(f"warning: {text}")

    def warn_once(self, text: str) -> None:
        """`warn`, unless the same text was already written: a state that lasts is said once, not each poll."""
        if text not in self._warned:
            self._warned.add(text)
            self.warn(text)

    def line(self, line: str) -> None:
        """A line formatted by exporter.parsers.gate (prefix included)."""
        self._stream.write(line + "\n")
        self._stream.flush()


class _PrefixedFormatter(logging.Formatter):
    """The sources' log records (the journal follower's warnings) as gate lines: one line, prefixed."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{gate_lines.PREFIX}{record.levelname.lower()}: " + " ".join(record.getMessage().splitlines())


# ---------------------------------------------------------------------------------------- systemd

def systemctl_show(systemctl: str, unit: str, *properties: str) -> dict[str, str] | None:
    """`systemctl show -p ... unit` as a dict; None when systemctl cannot answer."""
    try:
        completed = subprocess.run([systemctl, "show", *(f"--property={name}" for name in properties), "--", unit],
                                   capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if completed.returncode != 0:
        return None
    values = dict(line.partition("=")[::2] for line in completed.stdout.splitlines() if "=" in line)
    return values if all(name in values for name in properties) else None


def unit_start_timeout(systemctl: str, unit: str) -> float | None:
    """The unit's TimeoutStartSec= in seconds (inf: none); None when systemctl cannot say."""
    shown = systemctl_show(systemctl, unit, "TimeoutStartUSec")
    if shown is None:
        return None
    try:
        return parse_timespan(shown["TimeoutStartUSec"])
    except ValueError:
        return None


def current_invocation(systemctl: str, unit: str, environ: Mapping[str, str] = os.environ) -> str:
    """The unit's current invocation id as systemd says it ('' when unknown). $INVOCATION_ID, which
    systemd sets for ExecStartPre= commands, only when systemctl cannot answer: an `EnvironmentFile=`
    of the unit can override it."""
    shown = systemctl_show(systemctl, unit, "InvocationID")
    if shown is not None and shown["InvocationID"]:
        return shown["InvocationID"]
    return environ.get("INVOCATION_ID", "").strip()


def unit_gone(systemctl: str, unit: str, invocation_id: str) -> bool | None:
    """Whether that invocation of the unit has no process any more per systemd (stopped, failed, waiting
    to restart, or a later invocation runs); None when systemctl cannot say."""
    shown = systemctl_show(systemctl, unit, "ActiveState", "SubState", "InvocationID")
    if shown is None:
        return None
    if invocation_id and shown["InvocationID"] and shown["InvocationID"] != invocation_id:
        return True
    return shown["ActiveState"] in UNIT_GONE_ACTIVE_STATES or shown["SubState"] in UNIT_GONE_SUB_STATES


# ---------------------------------------------------------------------------------------- leases

LEASE_DIRECTORY_MODE = 0o700
LEASE_FILE_MODE = 0o600
MAX_LEASE_BYTES = 64 * 1024
# Whatever is planted as a lock or lease, root opening it must not follow it elsewhere (a symlink) nor wait
# on it (a FIFO); `open_regular` then refuses anything but a regular file.
OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_regular(name: str | Path, flags: int, dir_fd: int | None = None) -> int:
    """A descriptor of the regular file `name` (made 0600 with O_CREAT); OSError for anything else."""
    descriptor = os.open(name, flags | OPEN_FLAGS, LEASE_FILE_MODE, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError(f"{name} is not a regular file")
    return descriptor


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is no lease's figure")


@dataclass(frozen=True)
class Lease:
    """A device's lease: the unit released last and its invocation, until when it holds at most."""

    device: str
    unit: str
    invocation_id: str
    granted_usec: int  # wall clock, as the journal's realtime
    expires_usec: int
    gate_pid: int

    @classmethod
    def read(cls, path: str | Path, dir_fd: int | None = None) -> Lease | None:
        """The lease in the file, None when there is no file; OSError when it is not a regular file,
        ValueError when it holds no lease (too big, not JSON, other fields)."""
        try:
            descriptor = open_regular(path, os.O_RDONLY, dir_fd)
        except FileNotFoundError:
            return None
        with os.fdopen(descriptor, "rb") as file:
            content = file.read(MAX_LEASE_BYTES + 1)
        if len(content) > MAX_LEASE_BYTES:
            raise ValueError(f"larger than {MAX_LEASE_BYTES} bytes")
        return cls.parse(content)

    @classmethod
    def parse(cls, content: bytes) -> Lease:
        """The lease `write` wrote; ValueError for anything else."""
        try:
            data = json.loads(content, parse_constant=_refuse_constant)
        except RecursionError:
            raise ValueError("nested too deeply") from None
        # each field has the type its annotation names: a float, a bool or null is no lease's
        if not isinstance(data, dict) or any(type(data.get(field.name)).__name__ != field.type
                                             for field in fields(cls)):
            raise ValueError(f"not a lease's fields ({', '.join(field.name for field in fields(cls))})")
        return cls(**{field.name: data[field.name] for field in fields(cls)})


@dataclass(frozen=True)
class UnreadableLease:
    """A lease file the gate cannot read (not a regular file, too big, not a lease). It may be a gate's
    lease gone wrong, so it holds, for an unknown holder, until the file is --lease-timeout old."""

    device: str
    reason: str
    expires_usec: int  # the file's modification time plus --lease-timeout
    unit: ClassVar[str] = gate_lines.UNREADABLE_LEASE


def lease_ended(lease: Lease | UnreadableLease, views: Mapping[str, UnitView], now_usec: int,
                gone: Callable[[str, str], bool | None]) -> str | None:
    """Why the lease no longer holds, or None while it does."""
    if now_usec >= lease.expires_usec:
        return "timed out"
    if isinstance(lease, UnreadableLease):
        return None  # no unit the journal or systemd could say anything about
    view = views.get(lease.unit)
    if view is not None:
        if lease.invocation_id:
            if view.invocation_ended(lease.invocation_id):
                return "its init ended"
        elif view.current is not None and view.current.began_usec >= lease.granted_usec and \
                view.current.outcome is not None:
            return "its init ended"
    if gone(lease.unit, lease.invocation_id):
        return "its unit is not running"
    return None


def directory_refused(status: os.stat_result) -> str | None:
    """Why a lease directory (its lstat) is not the gate's user's alone, or None when it is."""
    if not stat.S_ISDIR(status.st_mode):
        return "not a directory (a symlink to one neither)"
    if status.st_uid != os.geteuid():
        return f"owned by uid {status.st_uid}, not by the gate's user (uid {os.geteuid()})"
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by others (mode {stat.S_IMODE(status.st_mode):04o})"
    return None


class LeaseDirectory:
    """`<directory>/<device>.lock` (flock: one gate decides at a time) and `<device>.lease`, root's alone:
    the directory is 0700 and its files 0600, so no one else can hold a lock, or plant or read a lease.
    Every file is opened in the directory opened once (`prepare`), never by a path through it."""

    def __init__(self, directory: str) -> None:
        self.path = Path(directory)
        self._descriptor: int | None = None

    def prepare(self) -> None:
        """Make the directory (0700) if it does not exist, and open it; OSError (saying why) if it cannot be
        used or is not the gate's user's alone."""
        with contextlib.suppress(FileExistsError):
            self.path.mkdir(mode=LEASE_DIRECTORY_MODE, parents=True)
        status = os.lstat(self.path)
        refused = directory_refused(status)
        if refused is not None:
            raise PermissionError(refused)
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
        descriptor = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | OPEN_FLAGS)
        if not os.path.samestat(os.fstat(descriptor), status):
            os.close(descriptor)
            raise PermissionError("replaced while the gate checked it")
        if stat.S_IMODE(status.st_mode) & ~LEASE_DIRECTORY_MODE:
            os.fchmod(descriptor, LEASE_DIRECTORY_MODE)  # narrowed: earlier versions made it 0755
        self._descriptor = descriptor

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None

    @contextlib.contextmanager
    def locked(self, device: str, deadline: float) -> Iterator[bool]:
        """Hold the device's lock; yields False when it could not be had before `deadline`. OSError when the
        lock is not a regular file."""
        descriptor = open_regular(f"{device}.lock", os.O_RDWR | os.O_CREAT, self._descriptor)
        try:
            while True:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        yield False
                        return
                    time.sleep(0.02)
            yield True
        finally:
            os.close(descriptor)  # releases the lock

    def lease(self, device: str, lease_timeout: float) -> Lease | UnreadableLease | None:
        """The device's lease, None when there is none; one that cannot be read holds until its file is
        `lease_timeout` old."""
        name = f"{device}.lease"
        try:
            return Lease.read(name, self._descriptor)
        except (OSError, ValueError) as error:
            try:
                modified = os.stat(name, dir_fd=self._descriptor, follow_symlinks=False)
            except FileNotFoundError:
                return None  # removed meanwhile
            return UnreadableLease(device, str(error), modified.st_mtime_ns // 1000 + round(lease_timeout * 1e6))

    def leases(self) -> list[Lease]:
        """Every device's lease that can be read."""
        try:
            names = sorted(name for name in os.listdir(self._descriptor) if name.endswith(".lease"))
        except OSError:
            return []
        leases = []
        for name in names:
            with contextlib.suppress(OSError, ValueError):
                if (lease := Lease.read(name, self._descriptor)) is not None:
                    leases.append(lease)
        return leases

    def grant(self, lease: Lease) -> None:
        """Write the lease as a new file (0600) renamed over the device's: a reader sees the old lease or the
        new one, never part of one."""
        name = f"{lease.device}.lease"
        temporary = f".{name}.{secrets.token_hex(8)}.tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | OPEN_FLAGS, LEASE_FILE_MODE,
                             dir_fd=self._descriptor)
        try:
            with os.fdopen(descriptor, "w") as file:
                json.dump(asdict(lease), file)
            os.replace(temporary, name, src_dir_fd=self._descriptor, dst_dir_fd=self._descriptor)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=self._descriptor)
            raise


# ---------------------------------------------------------------------------------------- decision

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


def devices_of_units(procfs_root: str, leases: Sequence[Lease]) -> dict[str, set[str]]:
    """unit -> the GPUs its processes hold DRM clients on (DRM fdinfo), and the device of its lease."""
    devices: dict[str, set[str]] = {}
    try:
        scan = procfs.scan_drm_clients(procfs_root)
    except procfs.ProcfsUnavailable:
        scan = None
    for device, units in (scan.memory_by_device_unit.items() if scan else ()):
        for name in units:
            devices.setdefault(name, set()).add(device)
    for lease in leases:
        devices.setdefault(lease.unit, set()).add(lease.device)
    return devices


# ---------------------------------------------------------------------------------------- the gate

class Unavailable(Exception):
    """A source the decision needs cannot be read: the gate releases at once (the message says why)."""


class Gate:
    def __init__(self, options: GateOptions, output: Output) -> None:
        self.options = options
        self.output = output
        self.began = time.monotonic()
        self.deadline = self.began + options.timeout
        # only the watched units' latest invocations, not the whole boot (docs/gate.md, How it decides)
        self.journal = JournalFollower(options.selection, options.journal_max_units, latest_invocations=True)
        self.levelzero = LevelZeroWorker(options.levelzero_library, options.levelzero_timeout, telemetry=False)
        self.leases: LeaseDirectory | None = LeaseDirectory(options.lease_directory)
        self.device: str | None = options.device
        self.gpus: list[str] = []  # every GPU's PCI address
        self.waited_for: dict[str, None] = {}  # in the order first met
        self.last: Decision | None = None

    def run(self) -> int:
        self.journal.start()
        self.levelzero.start()
        try:
            return self._run()
        finally:
            self.journal.stop(timeout=1.0)
            self.levelzero.close()
            if self.leases is not None:
                self.leases.close()

    def _run(self) -> int:
        try:
            self.leases.prepare()
        except OSError as error:
            self._stop_using_lease_directory(error)
        try:
            state = self._journal_read()
            devices = self._first_memory_reading()
        except Unavailable as unavailable:
            self.output.warn(f"{unavailable}: releasing at once")
            return self._release(None)
        memory = self._choose_device(devices)
        if memory is None:
            return EXIT_USAGE
        if not memory.accounting_trusted:
            self.output.warn(f"device {self.device} reports free == total memory (untrusted memory accounting: the "
                             f"gate needs root or CAP_PERFMON, e.g. ExecStartPre=+...): releasing at once")
            return self._release(None)
        ratio = self.options.gpu_memory_utilization
        own = next((view for view in state.views if view.unit == self.options.unit), None)
        if ratio is None and own is not None:
            ratio = own.gpu_memory_utilization
        if ratio is None:
            self.output.say(f"no gpu_memory_utilization known for {self.options.unit} (none given, none in the "
                            f"journal): waiting only for other units' inits")
        while True:
            try:
                decision, released = self._decide_and_maybe_release(ratio)
            except Unavailable as unavailable:
                self.output.warn(f"{unavailable}: releasing at once")
                return self._release(None)
            if released:
                return EXIT_RELEASED
            if decision is not None:
                self._note_wait(decision)
            if time.monotonic() >= self.deadline:
                return self._time_out()
            time.sleep(min(self.options.poll_interval, max(0.0, self.deadline - time.monotonic())))

    # --- sources ---------------------------------------------------------------------------------

    def _journal_read(self) -> JournalState:
        """The fold once the journal has been read up to now; Unavailable if it cannot be read."""
        while True:
            state = self.journal.state()
            if state.error is None:
                return state
            if state.error != STILL_READING:
                raise Unavailable(f"cannot read the journal ({state.error})")
            if time.monotonic() >= self.deadline:
                raise Unavailable(f"the journal was not read within --timeout ({self.options.timeout:g}s)")
            time.sleep(0.02)

    def _first_memory_reading(self) -> list[DeviceMemory]:
        """Level Zero's first reading (its child initialises first, within --levelzero.timeout: a hung
        driver init does not hold the start); Unavailable if it cannot be read."""
        deadline = min(self.deadline, time.monotonic() + self.options.levelzero_timeout)
        while True:
            try:
                return self.levelzero.read_memory()
            except LevelZeroUnavailable as error:
                initialising = self.levelzero.state in (WorkerState.INITIALISING, WorkerState.READY)
                if not initialising or time.monotonic() >= deadline:
                    raise Unavailable(f"cannot read Level Zero ({error})") from None
                time.sleep(0.05)

    def _memory(self) -> DeviceMemory:
        try:
            devices = self.levelzero.read_memory()
        except LevelZeroUnavailable as error:
            raise Unavailable(f"cannot read Level Zero ({error})") from None
        memory = next((reading for reading in devices if reading.identity.pci_address == self.device), None)
        if memory is None or memory.free is None or memory.total is None:
            error = memory.error if memory is not None else "the GPU is gone"
            raise Unavailable(f"cannot read the memory of {self.device} ({error})")
        return memory

    def _choose_device(self, devices: list[DeviceMemory]) -> DeviceMemory | None:
        """The gated GPU's reading; None (after one line) when --device is missing or names no GPU."""
        addresses = self.gpus = [reading.identity.pci_address for reading in devices]
        if self.device is None:
            if len(devices) != 1:
                self.output.say(f"error: {len(devices)} GPUs ({', '.join(addresses) or 'none'}): --device is "
                                f"required" if devices else "error: Level Zero reports no GPU")
                return None
            self.device = addresses[0]
        memory = next((reading for reading in devices if reading.identity.pci_address == self.device), None)
        if memory is None:
            self.output.say(f"error: --device {self.device}: no such GPU (GPUs: {', '.join(addresses) or 'none'})")
        return memory

    # --- deciding --------------------------------------------------------------------------------

    def _decide_and_maybe_release(self, ratio: float | None) -> tuple[Decision | None, bool]:
        assert self.device is not None
        if self.leases is None:
            decision = self._decision(ratio, lease=None)
            if decision.release:
                self._release(decision)
            return decision, decision.release
        try:
            return self._decide_holding_the_lock(ratio)
        except OSError as error:  # nothing but the lock and the lease raises it there
            self._stop_using_lease_directory(error)
            return self._decide_and_maybe_release(ratio)

    def _decide_holding_the_lock(self, ratio: float | None) -> tuple[Decision | None, bool]:
        assert self.leases is not None and self.device is not None
        with self.leases.locked(self.device, min(self.deadline, time.monotonic() + self.options.poll_interval)) \
                as locked:
            if not locked:
                self.output.warn_once(f"the lock {self.leases.path / f'{self.device}.lock'} is held by another "
                                      f"process (another gate deciding, or one that should not hold it): trying "
                                      f"again every --poll-interval until --timeout")
                return None, False
            lease = self.leases.lease(self.device, self.options.lease_timeout)
            if isinstance(lease, UnreadableLease):
                self.output.warn_once(f"the lease {self.leases.path / f'{self.device}.lease'} cannot be read "
                                      f"({lease.reason}): it holds for an unknown holder "
                                      f"({gate_lines.UNREADABLE_LEASE}) until the file is --lease-timeout old")
            decision = self._decision(ratio, lease)
            if decision.release:
                self._grant_lease()
                self._release(decision)
            return decision, decision.release

    def _stop_using_lease_directory(self, error: OSError) -> None:
        self.output.warn(f"cannot use the lease directory {self.options.lease_directory} ({error}): deciding "
                         f"without a lock or lease, so another gate may release at the same time")
        if self.leases is not None:
            self.leases.close()
        self.leases = None

    def _decision(self, ratio: float | None, lease: Lease | UnreadableLease | None) -> Decision:
        state = self.journal.state()
        if state.error is not None:
            raise Unavailable(f"cannot read the journal now ({state.error})")
        views = {view.unit: view for view in state.views}
        # the device's lease is among all the leases: one systemctl each
        gone = functools.cache(functools.partial(unit_gone, self.options.systemctl))
        holder = None
        if lease is not None and lease.unit != self.options.unit and \
                lease_ended(lease, views, now_usec(), gone) is None:
            holder = lease.unit
        memory = self._memory()
        devices = None
        if len(self.gpus) > 1:
            leases = self.leases.leases() if self.leases is not None else []
            live = [other for other in leases if lease_ended(other, views, now_usec(), gone) is None]
            devices = devices_of_units(self.options.procfs, live)
        return decide(self.options.unit, self.device, state.views, holder, devices, memory, ratio)

    def _note_wait(self, decision: Decision) -> None:
        for reason in decision.waiting_for:
            self.waited_for.setdefault(reason, None)
        if self.last is None or decision.waiting_for != self.last.waiting_for:
            self.output.say(f"waiting for {','.join(decision.waiting_for)} "
                            f"({gate_lines.figures(decision.free_bytes, decision.needed_bytes)})")
        self.last = decision

    def _grant_lease(self) -> None:
        assert self.leases is not None and self.device is not None
        now = now_usec()
        invocation = current_invocation(self.options.systemctl, self.options.unit)
        self.leases.grant(Lease(self.device, self.options.unit, invocation, now,
                                now + round(self.options.lease_timeout * 1e6), os.getpid()))

    def _release(self, decision: Decision | None) -> int:
        figures = decision or self.last
        self.output.line(gate_lines.format_released(
            time.monotonic() - self.began, list(self.waited_for),
            figures.free_bytes if figures else None, figures.needed_bytes if figures else None))
        return EXIT_RELEASED

    def _time_out(self) -> int:
        waiting = self.last.waiting_for if self.last is not None else ()
        starting = self.options.start_on_timeout
        if starting and self.leases is not None and self.device is not None:
            try:
                with self.leases.locked(self.device, time.monotonic() + 1.0) as locked:
                    if locked:  # it starts anyway: the next gate waits for its init like any other
                        self._grant_lease()
            except OSError as error:
                self._stop_using_lease_directory(error)
        self.output.line(gate_lines.format_timed_out(
            time.monotonic() - self.began, waiting or list(self.waited_for),
            self.last.free_bytes if self.last else None, self.last.needed_bytes if self.last else None, starting))
        return EXIT_RELEASED if starting else EXIT_TIMED_OUT


def now_usec() -> int:
    return time.time_ns() // 1000


def distrust_environment(environ: MutableMapping[str, str]) -> bool:
    """Started by systemd directly (the variables it gives every command of a unit are there), the gate has
    the gated unit's environment, which the unit's user may write (an `EnvironmentFile=` of theirs): keep
    none of it for what the gate runs (Level Zero's child, systemctl) but the invocation id and the locale,
    and give PATH the system's directories. The packaged drop-in starts the gate through a static `env -i`,
    so its environment is only what that root-owned command line sets, and is kept.
    Whether the environment was the unit's."""
    if not SET_BY_SYSTEMD_FOR_EVERY_COMMAND & environ.keys():
        return False
    for name in [name for name in environ if name not in KEPT_FROM_THE_UNITS_ENVIRONMENT]:
        del environ[name]
    environ["PATH"] = SYSTEM_PATH
    return True


class Stopped(BaseException):
    """SIGTERM: systemd stops the unit while its gate waits (or someone else killed the gate)."""


def _stop(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the gate is already on its way out
    raise Stopped


def stopped(options: GateOptions, output: Output) -> int:
    """Exit 0 when systemd is stopping the unit (a stop is no failure: the unit ends inactive, and its
    engine does not start); otherwise the start fails, as it would have with the gate killed."""
    shown = systemctl_show(options.systemctl, options.unit, "ActiveState")
    if shown is not None and shown["ActiveState"] == "deactivating":
        output.say(f"{options.unit} is being stopped: not starting it")
        return EXIT_RELEASED
    output.say("terminated by SIGTERM while deciding: failing the start")
    return EXIT_TERMINATED


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nothing to reload; a hang-up is no reason to stop deciding
    signal.signal(signal.SIGTERM, _stop)
    untrusted_environment = distrust_environment(os.environ)
    options = parse_options(argv)
    output = Output(sys.stderr)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_PrefixedFormatter())
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
    if untrusted_environment:
        output.warn("started with the unit's environment, not through the packaged drop-in's static `env -i`: "
                    "none of it is passed on, but what it made this interpreter load as root is not undone "
                    "(docs/gate.md, Installing)")
    began = time.monotonic()
    try:
        unit_timeout = unit_start_timeout(options.systemctl, options.unit)
        if unit_timeout is not None and options.timeout >= unit_timeout:
            output.warn(f"--timeout {options.timeout:g}s is not below {options.unit}'s TimeoutStartSec= "
                        f"({unit_timeout:g}s): systemd may kill the start while the gate waits; set TimeoutStartSec= "
                        f"to the gate's timeout plus the unit's own start (see the drop-in in docs/gate.md)")
        return Gate(options, output).run()
    except Stopped:
        return stopped(options, output)
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # never strand a unit on a bug of the gate
        output.warn(f"the gate failed ({type(error).__name__}: {error}): releasing")
        output.line(gate_lines.format_released(time.monotonic() - began, [], None, None))
        return EXIT_RELEASED


if __name__ == "__main__":
    raise SystemExit(main())
