"""Command line: flags in the style of the Prometheus Go exporters, then serve until SIGTERM/SIGINT; SIGHUP
re-reads the web config file.

The top of the exporter: it imports the collectors (`vllm_xpu_exporter.collectors` registers them), makes each one's
`--[no-]collector.NAME` switch and own flags from the registry, gives each its own options (never `Options`
itself) and builds the enabled ones. It builds every source they need (`build_sources`) and owns the flags of
those sources, the two named after the processes collector included (`add_processes_source_flags`)."""

from __future__ import annotations

import argparse
import gc
import ipaddress
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

import vllm_xpu_exporter.collectors  # noqa: F401  (registers the bundled collectors)
from vllm_xpu_exporter import __version__, discovery
from vllm_xpu_exporter.collector import Collector, CollectorSpec, Source, Sources, registered
from vllm_xpu_exporter.collectors.processes import ProcessesCollector
from vllm_xpu_exporter.discovery import VllmTargets
from vllm_xpu_exporter.fold.engine_starts import DEFAULT_MAX_UNITS, ENGINE_GRACE_USEC
from vllm_xpu_exporter.argparsing import EXIT_USAGE, OneLineParser, absolute_path
from vllm_xpu_exporter.flags import (DEFAULT_BOOT, DefaultsHelpFormatter, add_container_flags,
                                     add_container_log_flags, add_journal_containers_flag, add_journal_flags,
                                     add_levelzero_flags, add_procfs_flag, add_sysfs_flag, check_journal_flags,
                                     container_log_directories, container_paths, journal_container_globs,
                                     journal_engine_grace_usec, journal_unit_globs)
from vllm_xpu_exporter.http.activation import ActivationError, systemd_sockets
from vllm_xpu_exporter.http.loading import load_web_config
from vllm_xpu_exporter.http.server import (Document, ExporterServer, check_distinct_listen_addresses,
                                            parse_listen_address)
from vllm_xpu_exporter.http.webconfig import WebConfigError
from vllm_xpu_exporter.shipped import print_shipped
from vllm_xpu_exporter.logformat import DEFAULT_FORMAT, DEFAULT_LEVEL, add_log_flags, setup_logging
from vllm_xpu_exporter.scrape import ExporterCollector
from vllm_xpu_exporter.sources.journal import JournalSelection, open_journal, read_own_service_unit
from vllm_xpu_exporter.sources.containerlogs import ContainerLogReader, LogDirectories
from vllm_xpu_exporter.runtimes.docker_state import DEFAULT_DOCKER_ROOT
from vllm_xpu_exporter.runtimes.podman_state import DEFAULT_PODMAN_STORAGE
from vllm_xpu_exporter.runtimes.pods_state import DEFAULT_CONTAINER_LOGS, DEFAULT_POD_LOGS
from vllm_xpu_exporter.sources.containers import ContainerNames
from vllm_xpu_exporter.sources.logs.entry import DEFAULT_CONTAINER_GLOBS, DEFAULT_UNIT_GLOBS, LogSelection
from vllm_xpu_exporter.sources.logs.follower import LogFollower
from vllm_xpu_exporter.sources.dmem import DEFAULT_SYSFS, DmemReader
from vllm_xpu_exporter.sources.endpoints import DEFAULT_HOST_ADDRESS, EndpointFinder
from vllm_xpu_exporter.sources.levelzero.binding import DEFAULT_LIBRARY
from vllm_xpu_exporter.sources.levelzero.worker import DEFAULT_TIMEOUT_S, LevelZeroWorker
from vllm_xpu_exporter.sources.privileged import (PrivilegedReader, RemoteDrmClientScanner, RemoteEndpointFinder,
                                                  separate_privileges)
from vllm_xpu_exporter.sources.procfs import DEFAULT_PROCFS, DrmClientScanner
from vllm_xpu_exporter.sources.udev import DrmNodeNames
from vllm_xpu_exporter.sources.plan_dropins import DEFAULT_PLANS_DIRECTORY, DROP_IN_NAME, UnitPlans

log = logging.getLogger("vllm_xpu_exporter.main")

DEFAULT_PORT = 10447
DEFAULT_TELEMETRY_PATH = "/metrics"
DEFAULT_MAX_REQUESTS = 40  # node_exporter's


def _default_collector_options() -> Mapping[str, object]:
    return parse_options([]).collector_options


@dataclass(frozen=True)
class Options:
    """The command line, parsed. `collector_options`: each registered collector's own options (what its
    registration makes of the command line; None for a collector without options), by name."""

    listen_addresses: tuple[str, ...] = (f":{DEFAULT_PORT}",)
    telemetry_path: str = DEFAULT_TELEMETRY_PATH
    web_config_file: str | None = None
    systemd_socket: bool = False  # --web.systemd-socket: serve the sockets systemd passes (LISTEN_FDS)
    exporter_metrics: bool = True  # the exporter's own process_* and python_* (--web.disable-exporter-metrics)
    max_requests: int = DEFAULT_MAX_REQUESTS  # --web.max-requests
    collectors: frozenset[str] = frozenset(spec.name for spec in registered() if spec.enabled_by_default)
    levelzero_library: str = DEFAULT_LIBRARY
    levelzero_timeout: float = DEFAULT_TIMEOUT_S
    journal_directory: str | None = None
    journal_files: tuple[str, ...] = ()
    journal_units: tuple[str, ...] = DEFAULT_UNIT_GLOBS
    journal_containers: tuple[str, ...] = DEFAULT_CONTAINER_GLOBS
    journal_boot: str = DEFAULT_BOOT
    journal_max_units: int = DEFAULT_MAX_UNITS
    journal_engine_grace_usec: int = ENGINE_GRACE_USEC
    docker_roots: tuple[str, ...] = (DEFAULT_DOCKER_ROOT,)  # --path.docker: also where journald containers end
    podman_storages: tuple[str, ...] = (DEFAULT_PODMAN_STORAGE,)  # --path.podman
    pod_logs: str = DEFAULT_POD_LOGS  # --path.pods
    container_logs: str = DEFAULT_CONTAINER_LOGS  # --path.container-logs
    # --logs.docker, --logs.podman, --logs.pods: where containers' log files are read (LogDirectories' keywords)
    log_directories: Mapping[str, object] = field(default_factory=dict)
    procfs: str = DEFAULT_PROCFS
    sysfs: str = DEFAULT_SYSFS
    # --collector.processes.sd-host-address (for the endpoint finder): the address /sd/vllm gives for a vLLM server
    # listening on every address of the host's namespace
    sd_host_address: str = DEFAULT_HOST_ADDRESS
    plans_directory: str = DEFAULT_PLANS_DIRECTORY  # --collector.processes.plans: where vllm-xpu-plan's drop-ins are
    log_level: str = DEFAULT_LEVEL
    log_format: str = DEFAULT_FORMAT
    collector_options: Mapping[str, object] = field(default_factory=_default_collector_options)


def telemetry_path(value: str) -> str:
    if not value.startswith("/") or any(c.isspace() for c in value):
        raise argparse.ArgumentTypeError(f"invalid path {value!r}: must start with / and contain no spaces")
    return value


def non_negative_int(value: str) -> int:
    if not (value.isascii() and value.isdigit()):
        raise argparse.ArgumentTypeError(f"want a whole number, 0 or more, got {value!r}")
    return int(value)


def listen_address(value: str) -> str:
    try:
        parse_listen_address(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def add_processes_source_flags(collectors: argparse._ArgumentGroup) -> None:
    """The flags of the sources built here for the processes collector, named after it (as its users know them):
    --collector.processes.sd-host-address (the endpoints' finder), --collector.processes.plans (the plans'
    drop-ins)."""
    collectors.add_argument("--collector.processes.sd-host-address", dest="processes_sd_host_address",
                            type=sd_host_address, default=DEFAULT_HOST_ADDRESS, metavar="ADDRESS",
                            help="the address /sd/vllm gives for a vLLM server listening on every address of the "
                                 "host's network namespace (default %(default)s: Prometheus on the same host)")
    collectors.add_argument("--collector.processes.plans", dest="processes_plans", type=absolute_path,
                            default=DEFAULT_PLANS_DIRECTORY, metavar="DIR",
                            help=f"where vllm-xpu-plan's drop-ins are, DIR/UNIT.d/{DROP_IN_NAME}, each "
                                 "believed only when root alone can have written it (xpu_unit_kv_cache_plan_bytes; "
                                 "default %(default)s)")


def sd_host_address(value: str) -> str:
    """An IP address or host name (no port, no brackets)."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not an IP address or host name")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vllm-xpu-exporter",
        description="Prometheus exporter for Intel GPUs (Level Zero) shared by vLLM servers run as systemd units, "
                    "containers (Docker, Podman) or pods (Kubernetes): device memory, memory per unit, KV-cache "
                    "allocation and engine-init failures from the journal or the containers' logs.",
        epilog="`vllm-xpu-exporter print NAME` prints the rules, the dashboard or a systemd unit the package "
               "ships (`vllm-xpu-exporter print --help` lists them). `vllm-xpu-exporter selfcheck` checks what "
               "the exporter reads on this host against a second source, one line per check, and exits 1 when "
               "one differs (`vllm-xpu-exporter selfcheck --help`).",
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--version", action="version", version=f"vllm-xpu-exporter {__version__}")

    web = parser.add_argument_group("web")
    web.add_argument("--web.listen-address", dest="listen_addresses", type=listen_address, action="append",
                     default=None, metavar="ADDRESS",
                     help=f"host:port to serve on ([::1]:PORT and 127.0.0.1:PORT forms; :PORT for all interfaces); "
                          f"repeatable: every address is served (default: :{DEFAULT_PORT})")
    web.add_argument("--web.telemetry-path", dest="telemetry_path", type=telemetry_path,
                     default=DEFAULT_TELEMETRY_PATH, metavar="PATH", help="path under which to expose metrics")
    web.add_argument("--web.config.file", dest="web_config_file", default=None, metavar="FILE",
                     help="exporter-toolkit web configuration (YAML) for TLS and basic auth (default: none, plain "
                          "HTTP without authentication)")
    web.add_argument("--web.systemd-socket", dest="systemd_socket", action="store_true",
                     help="serve the listening sockets systemd passes (socket activation: LISTEN_FDS, the packaged "
                          "vllm-xpu-exporter.socket) instead of --web.listen-address")
    web.add_argument("--web.disable-exporter-metrics", dest="disable_exporter_metrics", action="store_true",
                     help="leave out the exporter's own process_* and python_* metrics (xpu_exporter_* stay)")
    web.add_argument("--web.max-requests", dest="max_requests", type=non_negative_int, default=DEFAULT_MAX_REQUESTS,
                     metavar="N", help="at most this many metrics requests at once, more get 503; 0: no limit")

    collectors = parser.add_argument_group("collectors")
    collectors.add_argument("--collector.disable-defaults", dest="collector_disable_defaults", action="store_true",
                            help="every collector off unless its --collector.NAME is given")
    for spec in registered():
        collectors.add_argument(f"--collector.{spec.name}", dest=f"collector_{spec.name}",
                                default=None, action=argparse.BooleanOptionalAction,
                                help=f"enable the {spec.name} collector: {spec.description} (default: "
                                     f"{'on' if spec.enabled_by_default else 'off'})")
    # BooleanOptionalAction spells the negation --no-collector.X, exactly the Prometheus form.
    for spec in registered():
        spec.add_flags(collectors)  # the collector's own --collector.NAME.OPTION flags, after every switch
    add_processes_source_flags(collectors)

    add_levelzero_flags(parser)
    add_journal_containers_flag(add_journal_flags(parser))
    host = add_procfs_flag(parser)
    add_sysfs_flag(host)
    add_container_flags(host)
    add_container_log_flags(parser)

    add_log_flags(parser)
    return parser


def parse_options(argv: Sequence[str] | None = None) -> Options:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_journal_flags(parser, args)
    try:
        check_distinct_listen_addresses(args.listen_addresses or ())
    except ValueError as error:
        parser.error(f"argument --web.listen-address: {error}")
    enabled = enabled_collectors(args)
    return Options(
        listen_addresses=tuple(args.listen_addresses or (f":{DEFAULT_PORT}",)),
        telemetry_path=args.telemetry_path,
        web_config_file=args.web_config_file,
        systemd_socket=args.systemd_socket,
        exporter_metrics=not args.disable_exporter_metrics,
        max_requests=args.max_requests,
        collectors=enabled,
        levelzero_library=args.levelzero_library,
        levelzero_timeout=args.levelzero_timeout,
        journal_directory=args.journal_directory,
        journal_files=tuple(args.journal_files),
        journal_units=journal_unit_globs(args),
        journal_containers=journal_container_globs(args),
        journal_boot=args.journal_boot,
        journal_max_units=args.journal_max_units,
        journal_engine_grace_usec=journal_engine_grace_usec(args),
        **container_paths(args),  # type: ignore[arg-type]
        log_directories=container_log_directories(args),
        procfs=args.procfs,
        sysfs=args.sysfs,
        sd_host_address=args.processes_sd_host_address,
        plans_directory=args.processes_plans,
        log_level=args.log_level,
        log_format=args.log_format,
        collector_options={spec.name: spec.options(args, enabled) for spec in registered()},
    )


def enabled_collectors(args: argparse.Namespace) -> frozenset[str]:
    """The collectors switched on: each its --[no-]collector.NAME when given, else its default, or off with
    --collector.disable-defaults."""
    def enabled(spec: CollectorSpec) -> bool:
        given = getattr(args, f"collector_{spec.name}")
        if given is not None:
            return bool(given)
        return spec.enabled_by_default and not args.collector_disable_defaults
    return frozenset(spec.name for spec in registered() if enabled(spec))


def build_sources(options: Options, needs: set[Source], privileged: PrivilegedReader | None = None) -> Sources:
    """The shared sources the enabled collectors need, not started. `privileged`: the reader of other processes'
    fds (`separate_privileges`), which then reads them instead of this process."""
    sources = Sources(privileged=privileged)
    if needs & {Source.LEVELZERO, Source.LEVELZERO_TELEMETRY}:
        sources.levelzero = LevelZeroWorker(options.levelzero_library, options.levelzero_timeout,
                                            telemetry=Source.LEVELZERO_TELEMETRY in needs,
                                            spawn=None if privileged is None else privileged.spawn_levelzero)
        sources.drm_nodes = DrmNodeNames()
        sources.drm_nodes.subscribe(sources.levelzero.gpu_changed)  # a GPU plugged, removed or re-bound: re-init
    if Source.JOURNAL in needs:
        sources.journal = LogFollower(exporter_journal_selection(options), options.journal_max_units,
                                      open_reader=open_journal, source="journal")
        directories = LogDirectories(**options.log_directories)
        if directories:
            sources.container_logs = container_log_follower(options, directories)
    if Source.DRM_CLIENTS in needs:
        sources.drm_clients = (DrmClientScanner(options.procfs) if sources.privileged is None
                               else RemoteDrmClientScanner(sources.privileged))
    if Source.DMEM in needs:
        sources.dmem = DmemReader(options.sysfs)
    if Source.CONTAINER_NAMES in needs:
        sources.container_names = ContainerNames(**container_state(options))
    if Source.VLLM_ENDPOINTS in needs:
        sources.vllm_endpoints = (EndpointFinder(options.procfs, host_address=options.sd_host_address)
                                  if sources.privileged is None else RemoteEndpointFinder(sources.privileged))
    if Source.UNIT_PLANS in needs:
        sources.unit_plans = UnitPlans(options.plans_directory)
    return sources


def container_state(options: Options) -> dict[str, object]:
    """Where the container runtimes' state is (--path.docker, --path.podman, --path.pods, --path.container-logs),
    as ContainerNames' keyword arguments."""
    return {"docker_roots": options.docker_roots, "podman_storages": options.podman_storages,
            "pod_logs": options.pod_logs, "container_logs": options.container_logs}


def container_log_follower(options: Options, directories: LogDirectories) -> LogFollower:
    """The containers' log files (--logs.docker, --logs.podman, --logs.pods) folded as the journal is, by a
    follower of their own; the journal collector serves both."""
    selection = LogSelection(unit_globs=options.journal_units, container_globs=options.journal_containers,
                             boot=options.journal_boot, engine_grace_usec=options.journal_engine_grace_usec)

    def open_reader(selection: LogSelection, admit: Callable[[str], bool],
                    forget: Callable[[str], None]) -> ContainerLogReader:
        return ContainerLogReader(selection, directories, admit=admit, forget=forget)

    return LogFollower(selection, options.journal_max_units, open_reader=open_reader, source="container logs")


def exporter_journal_selection(options: Options, own_unit: str | None = None) -> JournalSelection:
    """The journal the options select, without the exporter's own unit (`own_unit`, else the service of
    /proc/self/cgroup): the default glob vllm*.service matches vllm-xpu-exporter.service, and its starts
    are no engine's."""
    selection = JournalSelection(
        directory=options.journal_directory, files=options.journal_files, unit_globs=options.journal_units,
        container_globs=options.journal_containers, boot=options.journal_boot,
        engine_grace_usec=options.journal_engine_grace_usec, container_state=container_state(options))
    own_unit = own_unit or read_own_service_unit()
    if own_unit is None:
        return selection
    if selection.matches_unit(own_unit):
        log.info("not watching the exporter's own unit %s, which --journal.units matches", own_unit)
    else:
        log.debug("the exporter runs in %s, which is never watched", own_unit)
    return replace(selection, excluded_units=(own_unit,))


def needed_sources(options: Options) -> set[Source]:
    """What the enabled collectors need, Level Zero only with the levelzero collector: --no-collector.levelzero
    keeps the exporter off the driver (a hanging or crashing one, no device access at all), whichever collector
    could also use it."""
    needs = {need for spec in registered() if spec.name in options.collectors for need in spec.needs}
    if "levelzero" not in options.collectors:
        needs -= {Source.LEVELZERO, Source.LEVELZERO_TELEMETRY}
    return needs


def unusable_procfs(options: Options) -> str | None:
    """Why --path.procfs cannot be read, when a collector reads it (as node_exporter, which does not start
    when its procfs cannot be opened); None when it can be listed or no collector reads it."""
    if not needed_sources(options) & {Source.DRM_CLIENTS, Source.VLLM_ENDPOINTS}:
        return None
    try:
        os.listdir(options.procfs)
    except OSError as error:
        return f"--path.procfs: cannot list {options.procfs}: {error.strerror}"
    return None


def build_registry(options: Options, privileged: PrivilegedReader | None = None
                   ) -> tuple[CollectorRegistry, Sources, list[Collector]]:
    """prometheus_client's registry with the exporter's collector over the enabled collectors, and the
    standard process and Python collectors; the sources and collectors are returned not started."""
    enabled = [spec for spec in registered() if spec.name in options.collectors]
    sources = build_sources(options, needed_sources(options), privileged)
    collectors = [spec.factory(options.collector_options[spec.name], sources) for spec in enabled]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(collectors, sources))
    if options.exporter_metrics:
        # process_*: the exporter's own process, so its own /proc, never --path.procfs (the host's /proc in a
        # container)
        ProcessCollector(proc="/proc", registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return registry, sources, collectors


def documents(registry: CollectorRegistry, collectors: Sequence[Collector]) -> dict[str, Document]:
    """The routes besides /metrics: /sd/vllm, the units' vLLM API servers the processes collector found (a scrape
    first when none is recent; none when that collector is disabled)."""
    targets = next((collector.targets for collector in collectors
                    if isinstance(collector, ProcessesCollector) and collector.targets is not None), VllmTargets())

    def sd_vllm() -> tuple[bytes, str]:
        return targets.body(refresh=lambda: list(registry.collect())), discovery.CONTENT_TYPE

    return {discovery.SD_PATH: sd_vllm}


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["print"]:
        return print_shipped(argv[1:])
    if argv[:1] == ["selfcheck"]:
        from vllm_xpu_exporter import selfcheck  # the planner's journal reading, only for this command
        return selfcheck.main(argv[1:])
    # SIGHUP (systemctl reload) never kills the exporter: ignored until the server can reload on it (before
    # any child is started, so no child inherits the ignoring).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    options = parse_options(argv)
    setup_logging(options.log_level, options.log_format)
    error = unusable_procfs(options)
    if error is not None:
        print(f"vllm-xpu-exporter: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    # First: the process serving the network keeps no capability that reads other processes (this may execve)
    privileged, error = separate_privileges(options.procfs, host_address=options.sd_host_address,
                                            levelzero_library=options.levelzero_library)
    if error is not None:
        print(f"vllm-xpu-exporter: error: {error}", file=sys.stderr)
        return 1

    web_config = None
    if options.web_config_file:
        try:
            web_config = load_web_config(options.web_config_file)
        except WebConfigError as error:
            print(f"vllm-xpu-exporter: error: --web.config.file: {error}", file=sys.stderr)
            return EXIT_USAGE

    try:
        activated = systemd_sockets() if options.systemd_socket else []
    except ActivationError as error:
        print(f"vllm-xpu-exporter: error: {error}", file=sys.stderr)
        return 1
    registry, sources, collectors = build_registry(options, privileged)
    try:
        server = ExporterServer(options.listen_addresses, options.telemetry_path, registry, web_config,
                                documents=documents(registry, collectors), max_requests=options.max_requests,
                                listening_sockets=activated)
    except OSError as error:  # ListenError: names the address that failed
        print(f"vllm-xpu-exporter: error: {error}", file=sys.stderr)
        return 1

    def stop(signum: int, _frame: object) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        server.stop_serving()

    def reload(_signum: int, _frame: object) -> None:
        server.request_reload("SIGHUP")  # no lock, no log here: the serving thread does it

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, reload)

    sources.start()
    for collector in collectors:
        collector.start()
    # What start-up made lives as long as the process: keep it out of every later collection, and
    # collect the young generation less often (a scrape makes a few thousand short-lived objects).
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    scheme = "https" if web_config is not None and web_config.ssl_context() is not None else "http"
    urls = [f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}{options.telemetry_path}"
            for host, port in server.server_addresses]
    log.info("vllm-xpu-exporter %s listening on %s (collectors: %s)", __version__, " and ".join(urls),
             ",".join(sorted(options.collectors)) or "none")
    try:
        server.serve_forever()
    finally:
        server.shutdown()
        for collector in collectors:
            collector.stop()
        sources.stop()
    return 0
