"""`vllm-xpu-gate`'s command line (docs/gate.md): two commands of one console script.

    vllm-xpu-gate serve [flags]   the gate service (its own unit, packaging/vllm-xpu-gate.service)
    vllm-xpu-gate wait [flags]    the client, a vLLM unit's ExecStartPre= (packaging/vllm-xpu-gate.conf)
    vllm-xpu-gate wake [flags]    the client of a sleeping engine's wake, run in its unit (its ExecReload=)

The 0.2 form, `vllm-xpu-gate --unit %n ...` (which ran as root), still works as `wait` so that a host
upgraded before its drop-ins are replaced keeps its units starting: it says once that --unit and the
service's flags are ignored. Bad flags exit 2 with one line.

`wait` runs at every gated start: this module imports only what the client needs (no source, journal or
Level Zero module, not the exporter's `flags`); `serve` imports the rest when it runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import signal
import sys
from collections.abc import Sequence

from vllm_xpu_exporter import __version__
from vllm_xpu_exporter.durations import parse_go_duration
from vllm_xpu_exporter.argparsing import EXIT_USAGE, OneLineParser, absolute_path
from vllm_xpu_exporter.parsers import gate as gate_lines
from vllm_xpu_exporter.gate.protocol import BUDGET_VARIABLE, DEFAULT_SOCKET, MAX_DURATION_S, RATIO_VARIABLE, Request
from vllm_xpu_exporter.pci import normalise_pci_address

PROG = "vllm-xpu-gate"
DEFAULT_TIMEOUT = "10m"
DEFAULT_SERVICE_TIMEOUT = "30s"
DEFAULT_LEASE_TIMEOUT = "10m"
DEFAULT_POLL_INTERVAL = "100ms"
DEFAULT_LEGACY_GRACE = "24h"
COMMANDS = ("serve", "wait", "wake")
# How long `wake --url` waits for vLLM's answer to POST /wake_up (the lease it was given lasts as long by default).
WAKE_REQUEST_TIMEOUT_S = 600.0


# ----------------------------------------------------------------------------------------- values

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


def byte_count(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 0 < number < 2 ** 63:
        raise argparse.ArgumentTypeError(f"want a positive whole number of bytes, got {value!r}")
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


# ----------------------------------------------------------------------------------------- flags

def add_wait_flags(parser: argparse.ArgumentParser, wake: bool = False) -> None:
    parser.add_argument("--timeout", type=go_duration, default=DEFAULT_TIMEOUT, metavar="DURATION",
                        help=f"give up waiting for a turn after this long (Go duration; default {DEFAULT_TIMEOUT})")
    parser.add_argument("--on-timeout", dest="on_timeout", choices=("start", "fail"), default="start",
                        help=("after --timeout: wake anyway (exit 0, the default) or not (exit 1)" if wake else
                              "after --timeout: let the unit start (exit 0, the default) or fail its start (exit 1)"))
    parser.add_argument("--device", type=pci_address, default=None, metavar="BDF",
                        help="PCI address of the unit's GPU (default: the only GPU; required with several)")
    parser.add_argument("--socket", dest="socket_path", type=absolute_path, default=DEFAULT_SOCKET, metavar="PATH",
                        help=f"the gate service's socket (default {DEFAULT_SOCKET})")
    parser.add_argument("--service-timeout", dest="service_timeout", type=go_duration,
                        default=DEFAULT_SERVICE_TIMEOUT, metavar="DURATION",
                        help=f"when no service answers this long, {'wake' if wake else 'start the unit'} ungated "
                             f"with one line (default {DEFAULT_SERVICE_TIMEOUT})")
    if wake:
        parser.add_argument("--url", type=engine_url, default=None, metavar="URL",
                            help="once admitted, POST URL/wake_up (the engine's own server, e.g. "
                                 "http://127.0.0.1:8000) and exit with its answer (default: only wait, exit 0 "
                                 "when the wake may go)")
        return
    parser.add_argument("--gpu-memory-utilization", dest="gpu_memory_utilization", type=ratio, default=None,
                        metavar="R", help="free memory needed is ceil(R x total) (default: what the unit's latest "
                                          "start printed)")
    parser.add_argument("--kv-cache-memory-bytes", dest="kv_cache_memory_bytes", type=byte_count, default=None,
                        metavar="BYTES", help="the unit's engine runs with this absolute KV budget (vLLM's "
                                              "--kv-cache-memory-bytes): its init may overlap others' that have one "
                                              "too, when the memory covers them all (default: what the unit's "
                                              "latest start printed)")


def build_wait_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=f"{PROG} wait",
                           description="ExecStartPre= of a vLLM unit, run as the unit's user: ask the gate "
                                       "service for a turn and wait (docs/gate.md).")
    add_wait_flags(parser)
    return parser


def build_wake_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=f"{PROG} wake",
                           description="Run in a sleeping vLLM unit (its ExecReload=, as the unit's user): ask the "
                                       "gate service for the wake's turn and wait, then POST /wake_up with --url "
                                       "(docs/gate.md, Sleep and wake).")
    add_wait_flags(parser, wake=True)
    return parser


def engine_url(value: str) -> str:
    """An http(s) URL of the engine's server, without query or fragment."""
    import urllib.parse
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(f"want the engine's http(s) URL, e.g. http://127.0.0.1:8000, got {value!r}")
    return value.rstrip("/")


def build_serve_parser() -> argparse.ArgumentParser:
    from vllm_xpu_exporter.flags import (DefaultsHelpFormatter, add_container_flags, add_container_log_flags,
                                         add_journal_containers_flag, add_journal_flags, add_levelzero_flags,
                                         add_procfs_flag, add_sysfs_flag)
    from vllm_xpu_exporter.logformat import add_log_flags
    parser = OneLineParser(prog=f"{PROG} serve",
                           description="The gate service: follow the journal and Level Zero, and answer the "
                                       "vLLM units' clients on a Unix socket (docs/gate.md).",
                           formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--listen", type=absolute_path, default=None, metavar="PATH",
                        help="bind a Unix socket at this path (default: the socket systemd passes, "
                             "vllm-xpu-gate.socket)")
    parser.add_argument("--lease-timeout", dest="lease_timeout", type=positive_go_duration,
                        default=DEFAULT_LEASE_TIMEOUT, metavar="DURATION",
                        help=f"a release the journal never shows ending stops holding others back after this "
                             f"long (default {DEFAULT_LEASE_TIMEOUT})")
    parser.add_argument("--lease-file", dest="lease_file", type=absolute_path, default=None, metavar="PATH",
                        help="keep the leases in this file, so that they outlive a restart of the service "
                             "(default: leases.json in the RuntimeDirectory= systemd gives the service, "
                             "$RUNTIME_DIRECTORY; without it, in memory only)")
    parser.add_argument("--legacy-grace", dest="legacy_grace", type=go_duration, default=DEFAULT_LEGACY_GRACE,
                        metavar="DURATION",
                        help=f"answer a unit's 0.2 drop-in (ExecStartPre=+... vllm-xpu-gate --unit %%n, root in the "
                             f"unit) as `wait` for this long after the service first saw it this boot, then fail "
                             f"its starts (default {DEFAULT_LEGACY_GRACE}; 0s: at once)")
    parser.add_argument("--poll-interval", dest="poll_interval", type=positive_go_duration,
                        default=DEFAULT_POLL_INTERVAL, metavar="DURATION",
                        help=f"how often waiting units are decided again (default {DEFAULT_POLL_INTERVAL})")
    parser.add_argument("--plans", type=absolute_path, default=None, metavar="DIR",
                        help="where vllm-xpu-plan's drop-ins are, DIR/UNIT.d/zz-vllm-xpu-plan.conf: a start is "
                             "admitted by its KV budget only when root's drop-in there names it (default "
                             "/etc/systemd/system, as the exporter's --collector.processes.plans)")
    add_journal_containers_flag(add_journal_flags(
        parser, beyond_max_units="further ones are not watched (their inits hold no start back)"),
        default="none: no container is gated")
    add_levelzero_flags(parser)
    host = add_procfs_flag(parser)
    add_sysfs_flag(host)
    add_container_flags(host)
    add_container_log_flags(parser)
    add_log_flags(parser)
    return parser


def build_legacy_parser() -> argparse.ArgumentParser:
    """The 0.2 gate's flags: the client's are used, the rest (read by the service now) accepted and ignored."""
    parser = OneLineParser(prog=PROG)
    add_wait_flags(parser)
    parser.add_argument("--unit")
    for flag in ("--lease-directory", "--lease-timeout", "--poll-interval", "--systemctl", "--journal.directory",
                 "--journal.file", "--journal.units", "--journal.max-units", "--journal.boot",
                 "--journal.engine-grace", "--levelzero.library", "--levelzero.timeout", "--path.procfs"):
        parser.add_argument(flag, action="append", dest=f"ignored_{flag.strip('-')}")
    return parser


def wait_request(args: argparse.Namespace, legacy_drop_in: bool = False) -> Request:
    return Request(timeout=args.timeout, start_on_timeout=args.on_timeout == "start",
                   gpu_memory_utilization=args.gpu_memory_utilization, device=args.device,
                   kv_cache_memory_bytes=args.kv_cache_memory_bytes, legacy_drop_in=legacy_drop_in)


def parse_serve_args(argv: Sequence[str]) -> argparse.Namespace:
    from vllm_xpu_exporter.flags import check_journal_flags
    parser = build_serve_parser()
    args = parser.parse_args(argv)
    check_journal_flags(parser, args)
    return args


def parse_service_options(argv: Sequence[str], environ=os.environ):
    return service_options(parse_serve_args(argv), environ)


def service_options(args: argparse.Namespace, environ=os.environ):
    from vllm_xpu_exporter.flags import (container_log_directories, container_paths, journal_container_globs,
                                         journal_selection)
    from vllm_xpu_exporter.gate.service import ServiceOptions, engine_units_only
    # No container by default (unlike the exporter): with containers the first read is the whole boot's, not the
    # units' latest invocations (a container's lines carry no invocation id)
    containers = journal_container_globs(args) if args.journal_containers is not None else ()
    selection = dataclasses.replace(journal_selection(args), container_globs=containers,
                                    container_state=container_paths(args))
    return ServiceOptions(listen=args.listen, selection=engine_units_only(selection),
                          journal_max_units=args.journal_max_units, levelzero_library=args.levelzero_library,
                          levelzero_timeout=args.levelzero_timeout, procfs=args.procfs, sysfs=args.sysfs,
                          lease_timeout=args.lease_timeout, poll_interval=args.poll_interval,
                          lease_file=args.lease_file or runtime_lease_file(environ), legacy_grace=args.legacy_grace,
                          log_directories=container_log_directories(args),
                          **({"plans": args.plans} if args.plans is not None else {}))


def runtime_lease_file(environ) -> str | None:
    """leases.json in the service's first RuntimeDirectory= (systemd sets $RUNTIME_DIRECTORY), if any."""
    directory = environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return f"{directory}/leases.json" if directory.startswith("/") else None


STATED_IN_ENVIRONMENT = ((RATIO_VARIABLE, "gpu_memory_utilization", ratio),
                         (BUDGET_VARIABLE, "kv_cache_memory_bytes", byte_count))


def take_environment(parser: argparse.ArgumentParser, args: argparse.Namespace, environ=os.environ) -> None:
    """Fill the flags not given from the planner's variables; a variable that is not a valid value is an
    error (exit 2, one line), as the flag would be."""
    for variable, name, convert in STATED_IN_ENVIRONMENT:
        value = environ.get(variable)
        if getattr(args, name) is None and value:
            try:
                setattr(args, name, convert(value))
            except argparse.ArgumentTypeError as error:
                parser.error(f"{variable} (the planner's drop-in): {error}")


def parse_wake_options(argv: Sequence[str]):
    """The client options of a wake, and its --url (None: only wait)."""
    from vllm_xpu_exporter.gate.client import ClientOptions
    args = build_wake_parser().parse_args(argv)
    request = Request(timeout=args.timeout, start_on_timeout=args.on_timeout == "start", device=args.device, wake=True)
    return ClientOptions(args.socket_path, args.service_timeout, request), args.url


def parse_client_options(argv: Sequence[str], environ=os.environ):
    from vllm_xpu_exporter.gate.client import ClientOptions
    parser = build_wait_parser()
    args = parser.parse_args(argv)
    take_environment(parser, args, environ)
    return ClientOptions(args.socket_path, args.service_timeout, wait_request(args))


def usage_error(message: str) -> int:
    sys.stderr.write(f"{PROG}: error: {message}\n")
    return EXIT_USAGE


# ------------------------------------------------------------------------------------------ main

def serve(argv: Sequence[str]) -> int:
    from vllm_xpu_exporter.gate.service import Service, listening_socket
    from vllm_xpu_exporter.sources.journal.host import read_own_service_unit
    from vllm_xpu_exporter.sources.privileged import separate_privileges
    from vllm_xpu_exporter.logformat import setup_logging
    args = parse_serve_args(argv)
    options = service_options(args)
    setup_logging(args.log_level, args.log_format)
    own_unit = read_own_service_unit()
    if own_unit is not None:  # vllm-xpu-gate.service matches the default vllm*.service: it is no engine
        options = dataclasses.replace(options, selection=dataclasses.replace(options.selection,
                                                                             excluded_units=(own_unit,)))
    # First: the process answering the socket keeps no capability that reads other processes (this may execve)
    privileged, error = separate_privileges(options.procfs, full_scans=True,
                                            levelzero_library=options.levelzero_library)
    if error is not None:
        sys.stderr.write(f"{PROG}: error: {error}\n")
        return 1
    try:
        listener = listening_socket(options.listen)
    except OSError as error:
        return usage_error(f"cannot listen: {error}")
    service = Service(options, privileged=privileged)
    signal.signal(signal.SIGTERM, lambda signum, frame: service.stop())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    logging.getLogger(__name__).info("%s %s serving on %s", PROG, __version__,
                                     options.listen or "the socket systemd passed")
    try:
        service.serve(listener)
    except KeyboardInterrupt:
        pass
    finally:
        service.close()
    return 0


def wait(argv: Sequence[str]) -> int:
    from vllm_xpu_exporter.gate.client import run_client
    return run_client(parse_client_options(argv))


def wake(argv: Sequence[str]) -> int:
    from vllm_xpu_exporter.gate.client import post_wake_up, run_client
    options, url = parse_wake_options(argv)
    status = run_client(options, terminated_status=1)
    if status != 0 or url is None:
        return status
    return post_wake_up(url, WAKE_REQUEST_TIMEOUT_S)


def legacy(argv: Sequence[str]) -> int:
    from vllm_xpu_exporter.gate.client import ClientOptions, run_client
    args = build_legacy_parser().parse_args(argv)
    sys.stderr.write(f"{gate_lines.LEGACY_WARNING}: run as `vllm-xpu-gate wait`, --unit and the service's flags "
                     f"ignored; replace the drop-in (docs/gate.md, Migrating from 0.2): its \"+\" runs this as root "
                     f"in the unit, and the gate service refuses it after its --legacy-grace\n")
    return run_client(ClientOptions(args.socket_path, args.service_timeout, wait_request(args, legacy_drop_in=True)))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--version", "-V"):
        print(f"{PROG} {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: {PROG} {{serve,wait,wake}} [flags]\n\n  serve  the gate service (its own unit)\n"
              f"  wait   the client, a vLLM unit's ExecStartPre=\n"
              f"  wake   the client of a sleeping engine's wake, in its unit (ExecReload=)\n\n"
              f"`{PROG} COMMAND --help` lists each one's flags (docs/gate.md).")
        return 0 if argv else EXIT_USAGE
    command, rest = argv[0], argv[1:]
    if command == "serve":
        return serve(rest)
    if command == "wait":
        return wait(rest)
    if command == "wake":
        return wake(rest)
    if command.startswith("--"):
        return legacy(argv)
    return usage_error(f"unknown command {command!r} (want one of: {', '.join(COMMANDS)})")
