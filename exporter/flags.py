"""Flags the exporter, the init gate (`vllm-xpu-gate`) and the planner (`vllm-xpu-plan`) share, defined once:
Level Zero, the journal and the host's procfs, with the argument types they use; and those only the exporter
has, kept beside them because they share their types and defaults (the host's sysfs, the containers' paths
and log files, `--journal.containers`), with the help formatter the exporter's `--help` uses. Each command line
adds what it takes with the functions below, so a flag has one spelling, one default and one check wherever it
is given."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from vllm_xpu_exporter.argparsing import absolute_path, parse_duration, positive_int
from vllm_xpu_exporter.runtimes.docker_state import DEFAULT_DOCKER_ROOT
from vllm_xpu_exporter.runtimes.podman_state import DEFAULT_PODMAN_STORAGE
from vllm_xpu_exporter.runtimes.pods_state import DEFAULT_CONTAINER_LOGS, DEFAULT_POD_LOGS
from vllm_xpu_exporter.sources.containers import distinct
from vllm_xpu_exporter.fold.engine_starts import DEFAULT_MAX_UNITS, ENGINE_GRACE_USEC
from vllm_xpu_exporter.sources.dmem import CGROUP_TREE, DEFAULT_SYSFS
from vllm_xpu_exporter.sources.procfs import DEFAULT_PROCFS
from vllm_xpu_exporter.sources.journal.selection import JournalSelection
from vllm_xpu_exporter.sources.logs.entry import DEFAULT_CONTAINER_GLOBS, DEFAULT_UNIT_GLOBS, normalize_boot
from vllm_xpu_exporter.sources.levelzero.binding import DEFAULT_LIBRARY
from vllm_xpu_exporter.sources.levelzero.worker import DEFAULT_TIMEOUT_S

SYSTEMCTL_LOCATIONS = ("/usr/bin/systemctl", "/bin/systemctl", "/run/current-system/sw/bin/systemctl")
DEFAULT_BOOT = "current"  # --journal.boot: the running kernel's boot
MAX_LEVELZERO_TIMEOUT_S = 86400.0  # a driver call a day long is a hang by any measure


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """`(default: X)` after a flag's help, X written as on the command line: a duration as a duration (4s,
    not 4.0), a switch as on/off, a repeatable flag's values space-separated. No default shown where there
    is none (None, an empty list) or where the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        if "default" in help_text or action.default is argparse.SUPPRESS or not action.option_strings:
            return help_text
        shown = shown_default(action)
        return f"{help_text} (default: {shown})" if shown else help_text


def shown_default(action: argparse.Action) -> str:
    """An action's default as a user would write it; "" when it has none worth showing."""
    default = action.default
    if default is None or default == [] or default == ():
        return ""
    if isinstance(default, bool):
        return "on" if default else "off"
    if action.type in DURATION_TYPES and isinstance(default, (int, float)):
        return format_duration(default)
    if isinstance(default, (list, tuple)):
        return " ".join(str(value) for value in default)
    return str(default).replace("%", "%%")


def format_duration(seconds: float) -> str:
    """Seconds as the shortest Go duration that says them (4s, 1m30s, 250ms, 24h)."""
    milliseconds = round(seconds * 1000)
    if milliseconds % 1000:
        return f"{milliseconds}ms"
    whole = milliseconds // 1000
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{value}{unit}" for value, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if value) or "0s"


def levelzero_timeout(value: str) -> float:
    """`parse_duration`, at most MAX_LEVELZERO_TIMEOUT_S: a read waits in select(), which refuses a timeout
    as large as 1e300 s (every read would fail)."""
    seconds = parse_duration(value)
    if seconds > MAX_LEVELZERO_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"at most 24h, got {value!r}")
    return seconds


DURATION_TYPES = (parse_duration, levelzero_timeout)


def parse_boot(value: str) -> str:
    try:
        return normalize_boot(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_levelzero_flags(parser: argparse.ArgumentParser) -> None:
    """--levelzero.library, --levelzero.timeout (dest levelzero_library, levelzero_timeout)."""
    levelzero = parser.add_argument_group("levelzero")
    levelzero.add_argument("--levelzero.library", dest="levelzero_library", default=DEFAULT_LIBRARY,
                           metavar="LIBRARY", help="Level Zero loader to dlopen")
    levelzero.add_argument("--levelzero.timeout", dest="levelzero_timeout", type=levelzero_timeout,
                           default=DEFAULT_TIMEOUT_S, metavar="DURATION",
                           help="give up on a Level Zero read after this long (driver hang; at most 24h)")


def add_journal_flags(parser: argparse.ArgumentParser,
                      beyond_max_units: str = "as many containers again; further ones are counted in "
                                              "xpu_exporter_journal_units_dropped_total"
                      ) -> argparse._ArgumentGroup:
    """--journal.directory, .file, .units, .max-units, .boot, .engine-grace; check them with
    `check_journal_flags`. `beyond_max_units`: what the program does with units beyond --journal.max-units
    (the exporter counts them in a metric). Returns the journal group."""
    journal = parser.add_argument_group("journal")
    journal.add_argument("--journal.directory", dest="journal_directory", type=os.path.abspath, default=None,
                         metavar="DIR", help="read the journal from this directory instead of the system journal")
    journal.add_argument("--journal.file", dest="journal_files", type=os.path.abspath, action="append", default=[],
                         metavar="FILE", help="read these journal files instead (repeatable)")
    journal.add_argument("--journal.units", dest="journal_units", action="append", default=None, metavar="GLOB",
                         help=f"shell glob of the systemd units whose engine logs are read (repeatable; "
                              f"default {' '.join(DEFAULT_UNIT_GLOBS)})")
    journal.add_argument("--journal.max-units", dest="journal_max_units", type=positive_int,
                         default=DEFAULT_MAX_UNITS,
                         metavar="N", help=f"watch at most this many units; {beyond_max_units}")
    journal.add_argument("--journal.boot", dest="journal_boot", type=parse_boot, default=DEFAULT_BOOT, metavar="BOOT",
                         help="current (this kernel's boot), all, or a boot id")
    journal.add_argument("--journal.engine-grace", dest="journal_engine_grace", type=parse_duration,
                         default=f"{ENGINE_GRACE_USEC // 1_000_000}s", metavar="DURATION",
                         help="a start of a watched unit that has printed no vLLM line yet counts as an engine "
                              "init (holds gated starts back) at most this long after its main process began, "
                              "unless it prints one (a proxy, the exporter itself)")
    return journal


def add_journal_containers_flag(journal: argparse._ArgumentGroup,
                                default: str = " ".join(DEFAULT_CONTAINER_GLOBS)) -> None:
    """--journal.containers (dest journal_containers), in the group `add_journal_flags` returns; read it with
    `journal_container_globs` (the exporter's default), `default`: what the help says when none is given."""
    journal.add_argument("--journal.containers", dest="journal_containers", action="append", default=None,
                         metavar="GLOB",
                         help=f"shell glob of the containers whose engine logs are read: from the journal (Docker's "
                              f"and Podman's journald log driver) and the --logs.* directories; matched against "
                              f"the container's name, or its key (docker/NAME, podman/NAME, "
                              f"k8s/NAMESPACE/POD/CONTAINER) when it has a '/' (repeatable; default "
                              f"{default}; an empty one alone: no container)")


def add_container_log_flags(parser: argparse.ArgumentParser) -> None:
    """--logs.docker, --logs.podman, --logs.pods (dest logs_docker, logs_podman, logs_pods): read containers' log
    files where --path.docker, --path.podman and --path.pods say (`add_container_flags`); read them with
    `container_log_directories`."""
    logs = parser.add_argument_group("container logs")
    logs.add_argument("--logs.docker", dest="logs_docker", action=argparse.BooleanOptionalAction, default=False,
                      help="read the json-file logs of Docker's containers matching --journal.containers "
                           "(PATH/containers/ID/ID-json.log of each --path.docker): their engine starts, failures "
                           "and KV cache, as from the journal")
    logs.add_argument("--logs.podman", dest="logs_podman", action=argparse.BooleanOptionalAction, default=False,
                      help="read the k8s-file logs of Podman's containers matching --journal.containers "
                           "(PATH/<driver>-containers/ID/userdata/ctr.log of each --path.podman): their engine "
                           "starts, failures and KV cache, as from the journal")
    logs.add_argument("--logs.pods", dest="logs_pods", action=argparse.BooleanOptionalAction, default=False,
                      help="read the CRI log files of the pods' containers matching --journal.containers "
                           "(--path.pods/NAMESPACE_POD_UID/CONTAINER/N.log): their engine starts, failures and KV "
                           "cache, as from the journal")


def container_log_directories(args: argparse.Namespace) -> dict[str, object]:
    """Where --logs.docker, --logs.podman and --logs.pods have the containers' logs read, as LogDirectories'
    keyword arguments (Docker's data roots, Podman's storages, the pod log directory; one not asked for: absent)."""
    paths = container_paths(args)
    asked = {"docker_roots": args.logs_docker, "podman_storages": args.logs_podman, "pods": args.logs_pods}
    where = {**paths, "pods": paths["pod_logs"]}
    return {name: where[name] for name, wanted in asked.items() if wanted}


def check_journal_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The checks that involve more than one journal flag (parser.error: exit 2 with one line)."""
    if args.journal_directory and args.journal_files:
        parser.error("--journal.directory and --journal.file cannot be used together")
    if args.journal_units is not None and not all(glob.strip() for glob in args.journal_units):
        parser.error("argument --journal.units: empty glob")


def journal_unit_globs(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(args.journal_units or DEFAULT_UNIT_GLOBS)


def journal_container_globs(args: argparse.Namespace) -> tuple[str, ...]:
    """The --journal.containers globs: the default when none is given; none when only empty ones are."""
    if args.journal_containers is None:
        return DEFAULT_CONTAINER_GLOBS
    return tuple(glob for glob in args.journal_containers if glob.strip())


def journal_engine_grace_usec(args: argparse.Namespace) -> int:
    return round(args.journal_engine_grace * 1e6)


def journal_selection(args: argparse.Namespace, extra_units: Sequence[str] = (),
                      excluded_units: Sequence[str] = ()) -> JournalSelection:
    """The journal the flags select; `extra_units` are watched besides the globs, `excluded_units` never."""
    return JournalSelection(directory=args.journal_directory, files=tuple(args.journal_files),
                        unit_globs=(*journal_unit_globs(args), *extra_units), boot=args.journal_boot,
                        excluded_units=tuple(excluded_units), engine_grace_usec=journal_engine_grace_usec(args))


def add_systemctl_flag(parser: argparse.ArgumentParser, purpose: str) -> None:
    """--systemctl (dest systemctl): by absolute path, never looked up in $PATH, which a unit's environment
    may point into its user's directories (the gate and the planner run as root)."""
    parser.add_argument("--systemctl", type=absolute_path, default=default_systemctl(), metavar="PATH",
                        help=f"the systemctl {purpose} (default: the first of {', '.join(SYSTEMCTL_LOCATIONS)} "
                             f"that exists; never one from $PATH)")


def default_systemctl() -> str:
    return next((path for path in SYSTEMCTL_LOCATIONS if os.path.exists(path)), SYSTEMCTL_LOCATIONS[0])


def add_procfs_flag(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """--path.procfs (dest procfs); returns the group of the host's paths."""
    host = parser.add_argument_group("host")
    host.add_argument("--path.procfs", dest="procfs", default=DEFAULT_PROCFS, metavar="PATH",
                      help="where the host's /proc is mounted")
    return host


def add_sysfs_flag(host: argparse._ArgumentGroup) -> None:
    """--path.sysfs (dest sysfs), in the group `add_procfs_flag` returns."""
    host.add_argument("--path.sysfs", dest="sysfs", default=DEFAULT_SYSFS, metavar="PATH",
                      help=f"where the host's /sys is mounted (the cgroup tree is PATH/{CGROUP_TREE})")


def add_container_flags(host: argparse._ArgumentGroup) -> None:
    """--path.docker, --path.podman (both repeatable), --path.pods, --path.container-logs (dest docker_roots,
    podman_storages, pod_logs, container_logs): where the container engines' state is, for containers' names
    (vllm_xpu_exporter.sources.containers), in the group `add_procfs_flag` returns. Read them with `container_paths`."""
    host.add_argument("--path.docker", dest="docker_roots", action="append", default=None, type=absolute_path,
                      metavar="PATH", help=f"Docker's data root: names of Docker containers from "
                                           f"PATH/containers/ID/config.v2.json (repeatable, e.g. for rootless "
                                           f"Docker; default {DEFAULT_DOCKER_ROOT})")
    host.add_argument("--path.podman", dest="podman_storages", action="append", default=None, type=absolute_path,
                      metavar="PATH", help=f"a Podman storage (graphroot): names of Podman containers from "
                                           f"PATH/<driver>-containers/containers.json (repeatable: add rootless "
                                           f"users' ~/.local/share/containers/storage; default "
                                           f"{DEFAULT_PODMAN_STORAGE})")
    host.add_argument("--path.pods", dest="pod_logs", type=absolute_path, default=DEFAULT_POD_LOGS, metavar="PATH",
                      help="the kubelet's pod log directories (NAMESPACE_POD_UID/CONTAINER/): pods' names by uid")
    host.add_argument("--path.container-logs", dest="container_logs", type=absolute_path,
                      default=DEFAULT_CONTAINER_LOGS, metavar="PATH",
                      help="the kubelet's container log symlinks (POD_NAMESPACE_CONTAINER-ID.log): names of "
                           "pods' containers by id")


def container_paths(args: argparse.Namespace) -> dict[str, object]:
    """The container flags as ContainerNames' keyword arguments (docker_roots, podman_storages, pod_logs,
    container_logs), defaults filled in."""
    return {"docker_roots": distinct(args.docker_roots or (DEFAULT_DOCKER_ROOT,)),
            "podman_storages": distinct(args.podman_storages or (DEFAULT_PODMAN_STORAGE,)),
            "pod_logs": args.pod_logs, "container_logs": args.container_logs}
