"""`vllm-xpu-gate`'s command line and main loop (docs/gate.md; how the gate decides: `vllm_xpu_exporter.gate`).

Its flags (`GateOptions`), the lines it writes (`Output`), `Gate`, which reads the journal and Level Zero,
decides (`vllm_xpu_exporter.gate.decision`) holding the device's lock, grants the lease (`vllm_xpu_exporter.gate.leases`) and
releases or times out, and `main`: SIGTERM, the unit's environment when it is started without the drop-in's
`env -i`, and a release on any bug of the gate.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import os
import signal
import sys
import time
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import TextIO

from vllm_xpu_exporter import __version__
from vllm_xpu_exporter.durations import parse_go_duration
from vllm_xpu_exporter.flags import (EXIT_USAGE, OneLineParser, absolute_path, add_journal_flags, add_levelzero_flags,
                            add_procfs_flag, add_systemctl_flag, check_journal_flags, journal_selection)
from vllm_xpu_exporter.gate import lines as gate_lines
from vllm_xpu_exporter.gate.decision import Decision, decide
from vllm_xpu_exporter.gate.leases import Lease, LeaseDirectory, UnreadableLease, lease_ended
from vllm_xpu_exporter.gate.systemctl import current_invocation, systemctl_show, unit_gone, unit_start_timeout
from vllm_xpu_exporter.pci import normalise_pci_address
from vllm_xpu_exporter.sources import procfs
from vllm_xpu_exporter.sources.journal import JournalSelection
from vllm_xpu_exporter.sources.journal.follower import STILL_READING, JournalFollower, JournalState
from vllm_xpu_exporter.sources.levelzero.worker import DeviceMemory, LevelZeroUnavailable, LevelZeroWorker, WorkerState

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
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
KEPT_FROM_THE_UNITS_ENVIRONMENT = frozenset({"INVOCATION_ID", "LANG", "LC_ALL", "LC_CTYPE"})
SET_BY_SYSTEMD_FOR_EVERY_COMMAND = frozenset({"JOURNAL_STREAM", "SYSTEMD_EXEC_PID"})


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
        """A line formatted by vllm_xpu_exporter.gate.lines (prefix included)."""
        self._stream.write(line + "\n")
        self._stream.flush()


class _PrefixedFormatter(logging.Formatter):
    """The sources' log records (the journal follower's warnings) as gate lines: one line, prefixed."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{gate_lines.PREFIX}{record.levelname.lower()}: " + " ".join(record.getMessage().splitlines())


# ---------------------------------------------------------------------------------------- the gate

def devices_of_units(procfs_root: str, leases: Sequence[Lease]) -> dict[str, set[str]]:
    """unit -> the GPUs its processes hold DRM clients on (DRM fdinfo), and the device of its lease."""
    devices = procfs.devices_of_units(procfs_root)
    for lease in leases:
        devices.setdefault(lease.unit, set()).add(lease.device)
    return devices


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
