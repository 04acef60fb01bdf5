"""`vllm-xpu-plan`: size every watched vLLM unit's KV cache so that the units of each GPU fit together.

It reads the journal through the same reader and fold as the exporter and the gate, and each device's two
totals from Level Zero (its child process): what the kernel can give (Sysman's) and what vLLM multiplies by
gpu_memory_utilization (the core API's), or `--device-memory BYTES` and `--device-core-memory BYTES` (offline:
one GPU of that size). For each engine unit it takes what its latest start printed (weights, peak activation,
non-torch memory, KV bytes and tokens, block size, lengths, max_num_seqs, vLLM version), works out the KV cache a
target needs in whole blocks and the unit's footprint (`vllm_xpu_exporter.memory_rules`), holds each GPU's
footprints against its total less `--reserve`, and prints the `--kv-cache-memory-bytes` to set per unit, with its
R (a share of the total vLLM multiplies): a table, JSON, systemd drop-ins or a NixOS snippet. docs/planner.md
says how and why.

Exit status: 0 every GPU's units fit and every engine unit was planned; 1 some do not (each GPU and unit
named on stderr in GiB, with the largest target that fits; nothing to paste is printed); 2 usage (one line); 3
nothing was planned, or a unit was left out of the plan (its memory counted at ceil(R x total) with R from a
start of it that says one; when none does, the GPU is not said to fit).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

import yaml

from vllm_xpu_exporter import __version__, attribution
from vllm_xpu_exporter.argparsing import EXIT_USAGE, OneLineParser, absolute_path
from vllm_xpu_exporter.flags import (DefaultsHelpFormatter, add_container_flags, add_container_log_flags,
                                     add_journal_containers_flag, add_journal_flags, add_levelzero_flags,
                                     add_procfs_flag, add_systemctl_flag, check_journal_flags,
                                     container_log_directories, container_paths, journal_container_globs,
                                     journal_selection)
from vllm_xpu_exporter.fold.engine_starts import UnitView
from vllm_xpu_exporter.gate.protocol import BUDGET_VARIABLE, RATIO_VARIABLE
from vllm_xpu_exporter import memory_rules as rules
from vllm_xpu_exporter.parsers import vllm
from vllm_xpu_exporter.planner.plans import (KV_BUDGET_ON_XPU_SINCE, DevicePlan, Plan, TargetRequest, Totals, UnitPlan,
                                             Unplannable, make_plan, needs_ran_on_total, printed_totals)
from vllm_xpu_exporter.planner import containers, execstart, rightsizing
from vllm_xpu_exporter.sources import container_commands, plan_dropins, procfs, prometheus
from vllm_xpu_exporter.planner.execstart import NotEditable, exec_start_from_cat

PROG = "vllm-xpu-plan"
EXIT_FITS = 0
EXIT_DOES_NOT_FIT = 1
# nothing was planned, or a unit that holds GPU memory was left out of the plan: the plan is no proof
EXIT_INCOMPLETE = 3
MiB = 1 << 20
# The driver's and the runtime's own device memory, which no unit's footprint counts (docs/planner.md).
DEFAULT_RESERVE = rules.DEFAULT_RESERVE_BYTES
OFFLINE_DEVICE = "offline"
SYSTEMCTL_TIMEOUT_S = 10.0
# systemd applies a unit's drop-ins in the lexical order of their file names, across all its .d directories:
# "zz-" sorts after `systemctl edit`'s override.conf and the usual NN- names, so the plan's ExecStart= wins
DROP_IN_NAME = plan_dropins.DROP_IN_NAME
# The drop-in names the budget it sets on a line of its own (LogExtraFields=), which the exporter reads from the
# drop-in (xpu_unit_kv_cache_plan_bytes) beside the budget the unit runs with (docs/planner.md "Is the plan
# applied?").
PLAN_FIELD = plan_dropins.PLAN_FIELD
DEFAULT_COMPOSE = "/usr/bin/docker-compose"
DEFAULT_PODMAN = "/usr/bin/podman"
DEFAULT_KUBECTL = "/usr/bin/kubectl"
KUSTOMIZATION = "kustomization.yaml"
JSON_SCHEMA_VERSION = 3  # docs/planner.md "JSON output" lists what each version added


# ---------------------------------------------------------------------------------------- the unit's command

def read_unit(systemctl: str, unit: str) -> str | None:
    """`systemctl cat UNIT`: the unit file and its drop-ins as written (specifiers and quoting kept), or
    None when systemctl cannot say."""
    try:
        completed = subprocess.run([systemctl, "cat", "--", unit], capture_output=True, text=True,
                                   timeout=SYSTEMCTL_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout if completed.returncode == 0 else None


def planned_command(command: str, plan: UnitPlan) -> str:
    """The command with the planned flags: its own --gpu-memory-utilization / --kv-cache-memory-bytes
    words dropped, then --gpu-memory-utilization (the footprint's share: vLLM and the gate still ask that
    much free at start) and --kv-cache-memory-bytes appended. Raises execstart.NotEditable for a command
    whose vLLM flags a drop-in cannot reach."""
    return execstart.planned_command(command, tuple(planned_flags(plan).split()))


def planned_flags(plan: UnitPlan) -> str:
    return " ".join(containers.planned_flags(plan))


# ---------------------------------------------------------------------------------------- output forms

def _gib(value: int) -> str:
    return f"{value / (1 << 30):.2f} GiB"


def render_table(plan: Plan) -> str:
    lines: list[str] = []
    for device in plan.devices:
        fit = device.fit
        state = "fits" if device.fits else f"DOES NOT FIT: {'; '.join(why_not_fitting(device))}"
        lines.append(f"GPU {device.device}: total {device.total_bytes} ({_gib(device.total_bytes)}; vLLM multiplies "
                     f"{device.vllm_total_bytes} ({_gib(device.vllm_total_bytes)})), reserve "
                     f"{device.reserve_bytes}, units {device.planned_bytes} ({_gib(device.planned_bytes)}), left out "
                     f"{device.left_out_bytes} ({_gib(device.left_out_bytes)}), left "
                     f"{fit.left_bytes} ({_gib(fit.left_bytes)}): {state}")
        header = ("UNIT", "VLLM", "TARGET TOKENS", "NON-KV BYTES", "KV BYTES", "FOOTPRINT", "GPU UTIL",
                  "--kv-cache-memory-bytes")
        rows = [header] + [(u.unit, u.version, str(u.target.tokens), str(u.footprint.non_kv_bytes),
                            str(u.footprint.kv_bytes), str(u.footprint.total_bytes), _ratio(u.gpu_memory_utilization),
                            str(u.kv_cache_memory_bytes)) for u in device.units]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines += ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
        for u in device.units:
            lines.append(f"  {u.unit}: target {u.target.reason}; KV from {u.kv_from}; non-KV {u.non_kv_from}")
            lines += [f"  {u.unit}: note: {note}" for note in u.notes]
    for u in plan.unplannable:
        where = f" (GPU {u.device})" if u.device else ""
        lines.append(f"not plannable: {u.unit}{where}: {u.why}; {u.remedy}")
    return "\n".join(lines) + "\n"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def why_not_fitting(device: DevicePlan) -> list[str]:
    """What keeps a GPU's plan from fitting, each in words (empty when it fits)."""
    fit, reasons = device.fit, []
    if not fit.fits:
        reasons.append(f"{fit.missing_bytes} bytes ({_gib(fit.missing_bytes)}) missing")
    reasons += [f"{u.unit}'s footprint {u.footprint.total_bytes} ({_gib(u.footprint.total_bytes)}) is not below "
                f"what vLLM multiplies, {device.vllm_total_bytes}: no --gpu-memory-utilization below 1 covers it"
                for u in device.beyond_one]
    reasons += [f"{u.unit} is left out and its memory is not known (no start of it says its "
                f"gpu_memory_utilization)" for u in device.uncounted]
    return reasons


def render_json(plan: Plan) -> str:
    def unit(u: UnitPlan) -> dict[str, object]:
        f = u.footprint
        return {"unit": u.unit, "vllm_version": u.version, "target_tokens": u.target.tokens,
                "target": u.target.reason, "block_size": u.block_size, "kv_bytes_per_token": u.kv_bytes_per_token,
                "kv_block_bytes": u.kv_blocks.block_bytes if u.kv_blocks else None,
                "kv_request_bytes": u.kv_blocks.request_bytes if u.kv_blocks else None, "kv_from": u.kv_from,
                "weights_bytes": f.weights_bytes, "activation_bytes": f.activation_bytes,
                "non_torch_bytes": f.non_torch_bytes, "non_kv_bytes": f.non_kv_bytes, "non_kv_from": u.non_kv_from,
                "kv_cache_memory_bytes": u.kv_cache_memory_bytes, "footprint_bytes": f.total_bytes,
                "gpu_memory_utilization": u.gpu_memory_utilization, "notes": list(u.notes)}

    def unplannable(u: Unplannable) -> dict[str, object]:
        return {"unit": u.unit, "device": u.device, "why": u.why, "remedy": u.remedy, "held_bytes": u.held_bytes,
                "held_from": u.held_from or None}

    document = {
        "schema_version": JSON_SCHEMA_VERSION,
        "fits": plan.fits,
        "devices": [{"device": d.device, "total_bytes": d.total_bytes, "vllm_total_bytes": d.vllm_total_bytes,
                     "reserve_bytes": d.reserve_bytes,
                     "footprint_bytes": d.planned_bytes, "left_out_bytes": d.left_out_bytes,
                     "left_bytes": d.fit.left_bytes, "fits": d.fits, "does_not_fit": why_not_fitting(d),
                     "missing_bytes": d.fit.missing_bytes, "units": [unit(u) for u in d.units]}
                    for d in plan.devices],
        "unplannable": [unplannable(u) for u in plan.unplannable],
    }
    return json.dumps(document, indent=2) + "\n"


def drop_in(plan: UnitPlan, command: str) -> str:
    """A drop-in for /etc/systemd/system/UNIT.d/ (or `systemctl edit UNIT`): ExecStart= reset, the unit's
    command restated with the planned flags. Raises NotEditable for a command a drop-in cannot fix."""
    head = f"# {plan.unit}: written by {PROG} {__version__}: footprint {plan.footprint.total_bytes} bytes " \
           f"(KV {plan.kv_cache_memory_bytes} for {plan.target.tokens} tokens)"
    return "\n".join([head, "[Service]", "ExecStart=", f"ExecStart={planned_command(command, plan)}",
                      f"LogExtraFields={PLAN_FIELD}={plan.kv_cache_memory_bytes}",
                      f"Environment={RATIO_VARIABLE}={plan.gpu_memory_utilization:g} "
                      f"{BUDGET_VARIABLE}={plan.kv_cache_memory_bytes}", ""])


def render_nixos(plan: Plan) -> str:
    """Per-unit values for a NixOS module that has such options, an attribute set to import (docs/planner.md
    "NixOS" says how to pass them to a module that only takes extra arguments). No command is restated: the
    module keeps writing the unit's command, so nothing freezes today's store paths."""
    lines = [f"# {PROG} {__version__}: per vLLM unit, the KV budget and the gpu_memory_utilization beside it",
             "{"]
    for device in plan.devices:
        for u in device.units:
            name = u.unit.removesuffix(".service").replace("\\", "\\\\").replace('"', '\\"').replace("${", "\\${")
            lines.append(f'  "{name}" = {{ kvCacheMemoryBytes = {u.kv_cache_memory_bytes}; '
                         f'gpuMemoryUtilization = {u.gpu_memory_utilization:g}; }};')
    lines.append("}")
    return "\n".join(lines) + "\n"


def systemd_analyze_beside(systemctl: str) -> str | None:
    """The systemd-analyze of the same systemd as `systemctl` (never one from $PATH), if installed."""
    candidate = Path(systemctl).with_name("systemd-analyze")
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def verify_drop_in(analyze: str, unit: str, unit_text: str, drop_in_text: str) -> str | None:
    """`systemd-analyze verify` on the unit as it will load with the drop-in (its files as `systemctl cat`
    shows them, in order, then the drop-in, which sorts last): None when it loads, else what it said."""
    with tempfile.TemporaryDirectory(prefix="vllm-xpu-plan-") as directory:
        path = Path(directory) / unit
        path.write_text(f"{unit_text.rstrip()}\n# {DROP_IN_NAME}\n{drop_in_text}")
        try:
            completed = subprocess.run([analyze, "verify", "--man=no", "--recursive-errors=no", str(path)],
                                       capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT_S * 3, check=False)
        except (OSError, subprocess.SubprocessError) as error:
            return f"systemd-analyze verify could not run ({error})"
    if completed.returncode == 0:
        return None
    said = " ".join((completed.stderr or completed.stdout).split()).replace(directory, "")
    return f"systemd-analyze verify refuses it: {said}"


def write_atomically(directory: int, name: str, text: str, shown: str) -> None:
    """NAME in the open `directory` (`shown` names it in messages) holds `text` or what it held before, never a
    part: a temporary file in the same directory, synced, renamed over it. A symlink in NAME's place is
    refused: the planner writes where it was told, not where a link points."""
    try:
        if stat.S_ISLNK(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode):
            raise OSError(f"{shown}/{name} is a symlink: not written")
    except FileNotFoundError:
        pass
    temporary = f".{name}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=directory)
    try:
        with os.fdopen(fd, "w") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.rename(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=directory)
        raise
    os.fsync(directory)


def compose_verifier(compose: str) -> Callable[[container_commands.ContainerCommand, str], str | None]:
    """`docker-compose config -q` of the project's own files followed by the override: None when Compose loads
    them, else what it said."""

    def verify(command: container_commands.ContainerCommand, text: str) -> str | None:
        missing = [f for f in command.compose_files if not os.path.isfile(f)]
        if missing:
            return f"its Compose file {missing[0]} cannot be read here: the override is not loaded, so not printed"
        with tempfile.TemporaryDirectory(prefix="vllm-xpu-plan-") as directory:
            override = Path(directory) / "override.yaml"
            override.write_text(text)
            argv = [compose, "-p", command.compose_project]
            if command.compose_directory:
                argv += ["--project-directory", command.compose_directory]
            for f in (*command.compose_files, str(override)):
                argv += ["-f", f]
            try:
                completed = subprocess.run([*argv, "config", "-q"], capture_output=True, text=True,
                                           timeout=SYSTEMCTL_TIMEOUT_S * 6, check=False)
            except (OSError, subprocess.SubprocessError) as error:
                return f"{compose} config could not run ({error})"
            said = " ".join((completed.stderr or completed.stdout).split()).replace(str(override), "the override")
        return None if completed.returncode == 0 else f"{compose} config refuses the override: {said}"

    return verify


# ---------------------------------------------------------------------------------------- command line

def byte_count(value: str) -> int:
    """BYTES: an integer, optionally with a binary unit suffix (KiB, MiB, GiB)."""
    match = re.fullmatch(r"\s*(\d{1,20})\s*(B|KiB|MiB|GiB|TiB)?\s*", value)
    if match is None:
        raise argparse.ArgumentTypeError(f"want a byte count (e.g. 17179869184 or 512MiB), got {value!r}")
    scale = {"B": 1, None: 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}[match[2]]
    return int(match[1]) * scale


def unit_count(value: str) -> tuple[str, int]:
    unit, sep, number = value.partition("=")
    if not sep or not unit.strip() or not number.strip().isdigit() or int(number) <= 0:
        raise argparse.ArgumentTypeError(f"want UNIT=N with N a positive integer, got {value!r}")
    unit = unit.strip()
    return (unit if "." in unit else f"{unit}.service"), int(number)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="Plan every watched vLLM unit's --kv-cache-memory-bytes so that "
                                                  "the units of each GPU fit (see docs/planner.md).",
                           formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--device-memory", dest="device_memory", type=byte_count, default=None, metavar="BYTES",
                        help="plan offline for one GPU of this total memory, the kernel's (Level Zero Sysman's, the "
                             "exporter's xpu_memory_total_bytes): the units' footprints are held against it "
                             "(default: every GPU Level Zero reports)")
    parser.add_argument("--device-core-memory", dest="device_core_memory", type=byte_count, default=None,
                        metavar="BYTES",
                        help="with --device-memory: the total vLLM multiplies by --gpu-memory-utilization on that GPU, "
                             "the Level Zero core API's (the exporter's xpu_memory_core_total_bytes, ~0.95 of "
                             "--device-memory on Intel); every R is a share of it (default: --device-memory)")
    parser.add_argument("--reserve", type=byte_count, default=DEFAULT_RESERVE, metavar="BYTES",
                        help=f"memory of each GPU no unit may plan for: the driver's and runtime's own "
                             f"(default {DEFAULT_RESERVE // MiB}MiB)")
    parser.add_argument("--tokens", type=unit_count, action="append", default=[], metavar="UNIT=N",
                        help="the KV cache of UNIT holds N tokens (default: the KV of its last successful start, "
                             "at least one full-length request)")
    parser.add_argument("--requests", type=unit_count, action="append", default=[], metavar="UNIT=N",
                        help="the KV cache of UNIT holds N requests of its full model length")
    parser.add_argument("--format", choices=("table", "json", "systemd", "nixos", *containers.CONTAINER_FORMATS),
                        default="table",
                        help="table: the plan for a reader; json: the plan for a program; systemd: a drop-in per "
                             "unit (printed, or written with --output-dir); nixos: the same as NixOS options; "
                             "compose: an override per Compose project (Docker's containers); podman: each Podman "
                             "container's create command, planned; kustomize: an overlay patching the pods' "
                             "containers' args")
    parser.add_argument("--output-dir", dest="output_dir", default=None, metavar="DIR",
                        help="with --format systemd: write DIR/UNIT.d/" + DROP_IN_NAME + " per unit; with --format "
                             "kustomize: write the overlay, DIR/" + KUSTOMIZATION)
    parser.add_argument("--compose", type=absolute_path, default=DEFAULT_COMPOSE, metavar="PATH",
                        help="with --format compose: the docker-compose that loads each override before it is printed")
    parser.add_argument("--podman", type=absolute_path, default=DEFAULT_PODMAN, metavar="PATH",
                        help="with --format podman: the podman asked for its containers' create commands")
    parser.add_argument("--kustomize-base", dest="kustomize_base", default=None, metavar="DIR",
                        help="with --format kustomize: the kustomization the pods' containers come from")
    parser.add_argument("--kubectl", type=absolute_path, default=DEFAULT_KUBECTL, metavar="PATH",
                        help="with --format kustomize: the kubectl whose kustomize renders the base and the overlay")
    add_systemctl_flag(parser, "to read the units' commands with")
    journal = add_journal_flags(parser, beyond_max_units=f"further ones are not read, so not planned: {PROG} names "
                                                         f"how many and exits {EXIT_INCOMPLETE}")
    add_journal_containers_flag(journal)
    add_container_log_flags(parser)
    add_levelzero_flags(parser)
    add_container_flags(add_procfs_flag(parser))
    rightsizing.add_flags(parser)
    return parser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_journal_flags(parser, args)
    prometheus.check_access_flags(parser, args)
    if args.output_dir is not None and args.format not in ("systemd", "kustomize"):
        parser.error("--output-dir goes with --format systemd or kustomize")
    if args.format == "kustomize" and (args.output_dir is None or args.kustomize_base is None):
        parser.error("--format kustomize needs --kustomize-base DIR and --output-dir DIR (the overlay's directory)")
    if args.device_memory is not None and args.device_memory <= args.reserve:
        parser.error(f"--device-memory {args.device_memory} leaves nothing after --reserve {args.reserve}")
    if args.device_core_memory is not None and args.device_memory is None:
        parser.error("--device-core-memory goes with --device-memory")
    if args.device_core_memory is not None and not 0 < args.device_core_memory <= args.device_memory:
        parser.error(f"--device-core-memory {args.device_core_memory} is not a total within --device-memory "
                     f"{args.device_memory}")
    both = {unit for unit, _ in args.tokens} & {unit for unit, _ in args.requests}
    if both:
        parser.error(f"--tokens and --requests both given for {', '.join(sorted(both))}")
    return args


def read_views(args: argparse.Namespace, timeout: float = 120.0) -> tuple[list[UnitView], int]:
    """The watched units' views, and how many units the journal holds beyond --journal.max-units (not read)."""
    from vllm_xpu_exporter.sources.journal import open_journal
    from vllm_xpu_exporter.nodatayet import NoDataYet
    from vllm_xpu_exporter.sources.logs.follower import LogFollower

    from vllm_xpu_exporter.sources.containerlogs import ContainerLogReader, LogDirectories
    from vllm_xpu_exporter.sources.logs.entry import LogSelection

    selection = replace(journal_selection(args), container_globs=journal_container_globs(args),
                        container_state=container_paths(args))
    followers = [(LogFollower(selection, args.journal_max_units, open_reader=open_journal, source="journal",
                              latest_invocations=True), "the journal")]
    directories = LogDirectories(**container_log_directories(args))
    if directories:
        logs = LogSelection(unit_globs=selection.unit_globs, container_globs=selection.container_globs,
                            boot=selection.boot, engine_grace_usec=selection.engine_grace_usec)
        followers.append((LogFollower(logs, args.journal_max_units, source="container logs",
                                      open_reader=lambda selection, admit, forget: ContainerLogReader(
                                          selection, directories, admit=admit, forget=forget)),
                          "the containers' log files"))
    views: dict[str, UnitView] = {}
    dropped = 0
    for follower, what in followers:
        follower.start()
        try:
            deadline = time.monotonic() + timeout
            while True:
                state = follower.state()
                if state.error is None:
                    break
                if not isinstance(state.error, NoDataYet) or time.monotonic() >= deadline:
                    raise RuntimeError(f"cannot read {what} ({state.error})")
                time.sleep(0.02)
        finally:
            follower.stop(timeout=1.0)
        views.update({view.unit: view for view in state.views if view.unit not in views})
        dropped += state.dropped_units
    return list(views.values()), dropped


def read_totals(args: argparse.Namespace) -> dict[str, Totals]:
    """Each GPU's two totals from Level Zero: Sysman's (what the kernel can give) and the core API's (what vLLM
    multiplies); where one is not read, the other stands for both."""
    from vllm_xpu_exporter.sources.levelzero.worker import LevelZeroUnavailable, LevelZeroWorker, WorkerState

    worker = LevelZeroWorker(args.levelzero_library, args.levelzero_timeout, telemetry=False)
    worker.start()
    try:
        deadline = time.monotonic() + args.levelzero_timeout
        while True:
            try:
                devices = worker.read_memory()
                break
            except LevelZeroUnavailable as error:
                if worker.state not in (WorkerState.INITIALISING, WorkerState.READY) or time.monotonic() >= deadline:
                    raise RuntimeError(f"cannot read Level Zero ({error}); plan offline with --device-memory BYTES") \
                        from None
                time.sleep(0.05)
    finally:
        worker.close()
    vllm_totals = attribution.vllm_totals(devices)
    totals = {}
    for device in devices:
        vllm_total = vllm_totals.get(device.identity.pci_address)
        if vllm_total is not None:
            memory = device.total if device.total is not None else vllm_total
            totals[device.identity.pci_address] = Totals(memory, vllm_total)
    return totals


def _with_earlier_successes(args: argparse.Namespace, views: list[UnitView]) -> list[UnitView]:
    """The views of the selected boot, each unit's last successful start (and latest profiled start) taken
    from every boot the journal holds when the selected boot has none (e.g. right after a failing cold
    boot): the default target is the KV the unit had when it last started."""
    missing = [v for v in views if v.last_success is None or v.last_profiled is None]
    if not missing or args.journal_boot == "all":
        return views
    every_boot = {v.unit: v for v in read_views(argparse.Namespace(**{**vars(args), "journal_boot": "all"}))[0]}
    merged = []
    for view in views:
        earlier = every_boot.get(view.unit)
        if earlier is not None:
            view = replace(view, last_success=view.last_success or earlier.last_success,
                           last_profiled=view.last_profiled or earlier.last_profiled)
        merged.append(view)
    return merged


def _ran_on_here(args: argparse.Namespace, views: Sequence[UnitView], stderr: TextIO) -> int | None:
    """Planning offline: the total vLLM multiplies on this host's GPU, which the units' starts ran on, when a
    unit's non-KV memory is derived from it (a release that prints no split and a start that printed no total)
    and Level Zero reads exactly one GPU; None otherwise (the total planned for stands in, and the plan says so)."""
    if not any(needs_ran_on_total(v) for v in views if v.latest is not None and v.latest.engine is not False):
        return None
    try:
        here = read_totals(args)
    except RuntimeError:
        return None
    if len(here) != 1:
        return None
    (device, totals), = here.items()
    stderr.write(f"{PROG}: the starts that printed no device total are taken to have run on this host's GPU "
                 f"{device} ({_gib_of(totals.vllm_bytes)} as vLLM multiplies)\n")
    return totals.vllm_bytes


def _agreed_total(printed: Mapping[str, int]) -> int | None:
    """The device total every unit's starts printed (within the print's rounding), at its least; None when
    none printed one or they disagree (several GPUs)."""
    if not printed:
        return None
    low = max(rules.printed_lower_bound(total) for total in printed.values())
    high = min(rules.printed_upper_bound(total) for total in printed.values())
    return low if low <= high else None


def _gib_of(value: int) -> str:
    return f"{value / (1 << 30):.2f} GiB"


def _largest_that_fits(device: DevicePlan, unit: UnitPlan) -> str:
    """The largest --requests / --tokens of `unit` with which its GPU fits, the other units as planned."""
    kv = unit.kv_blocks
    budget = unit.kv_cache_memory_bytes - device.fit.missing_bytes
    if kv is None or kv.max_model_len is None or budget <= 0:
        return "none: it does not fit even with no KV cache"
    requests = rules.requests_for_kv_budget(budget, kv)
    tokens = rules.tokens_for_kv_budget(budget, kv)
    if tokens < kv.max_model_len:
        one_request = rules.kv_budget_for_tokens(kv.max_model_len, kv)
        return f"none: not even one request of {kv.max_model_len} tokens ({_gib_of(one_request)} of KV) fits"
    return f"--requests {unit.unit}={requests} or --tokens {unit.unit}={tokens}"


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    args = parse_args(argv)
    try:
        views, beyond_max_units = read_views(args)
        views = _with_earlier_successes(args, views)
        printed = printed_totals(views)
        ran_on = None
        if args.device_memory is not None:
            core = args.device_core_memory if args.device_core_memory is not None else args.device_memory
            totals, placement = {OFFLINE_DEVICE: Totals(args.device_memory, core)}, {}
            flag = "--device-core-memory" if args.device_core_memory is not None else "--device-memory"
            other = sorted(unit for unit, total in printed.items() if not
                           rules.printed_lower_bound(total) <= core <= rules.printed_upper_bound(total))
            if other:
                stderr.write(f"{PROG}: warning: {flag} {core} ({_gib_of(core)}) is "
                             f"not the total the starts of {', '.join(other)} printed "
                             f"({_gib_of(printed[other[0]])}): planning for another device size (their non-KV figures "
                             f"are their starts' own)\n")
            ran_on = _ran_on_here(args, views, stderr)
        else:
            try:
                totals = read_totals(args)
            except RuntimeError:
                total = _agreed_total(printed)
                if total is None:
                    raise
                stderr.write(f"{PROG}: warning: Level Zero cannot be read: planning for the total the starts printed, "
                             f"{_gib_of(total)} (the least it can stand for)\n")
                totals = {OFFLINE_DEVICE: Totals.same(total)}
            if not totals:
                raise RuntimeError("Level Zero reports no GPU; plan offline with --device-memory BYTES")
            placement = procfs.devices_of_units(args.procfs) if len(totals) > 1 else {}
    except RuntimeError as error:
        stderr.write(f"{PROG}: error: {error}\n")
        return EXIT_USAGE
    engines = {v.unit for v in views if v.latest is not None and v.latest.engine is not False}
    requests = {unit: TargetRequest(tokens=n) for unit, n in args.tokens}
    requests.update({unit: TargetRequest(requests=n) for unit, n in args.requests})
    unknown = sorted(set(requests) - engines)
    if unknown:
        stderr.write(f"{PROG}: error: {', '.join(unknown)}: no vLLM start of it in the journal (a target was given "
                     f"for it; the journal holds {', '.join(sorted(engines)) or 'no vLLM unit'})\n")
        return EXIT_USAGE
    if not engines:
        stderr.write(f"{PROG}: nothing planned: the journal holds no vLLM unit's start-up lines (units matched by "
                     f"--journal.units, boot {args.journal_boot})\n")
        return EXIT_INCOMPLETE
    if args.prometheus is not None or args.observed is not None:  # right-sizing (docs/discovery.md)
        try:
            answers = prometheus.read_observed(args, prometheus.access(args))
            observed = rightsizing.recommend(views, rightsizing.parse_observed(answers))
        except prometheus.ObservedError as error:
            stderr.write(f"{PROG}: error: {error}\n")
            return EXIT_USAGE
        for r in observed.values():
            stderr.write(f"{PROG}: {r.unit}: {r.why}: budget {r.kv_bytes} bytes (now {r.current_bytes})\n")
        given, requests = requests, {**rightsizing.target_requests(observed), **requests}
    plan = make_plan(views, totals, placement, args.reserve, requests, ran_on)
    if not plan.fits and (args.prometheus is not None or args.observed is not None):
        for unit, device in _growth_that_breaks_the_fit(plan, views, totals, placement, args.reserve, requests,
                                                        given, observed):
            r = observed[unit]
            stderr.write(f"{PROG}: {unit}: its right-sized growth ({r.current_bytes} -> {r.kv_bytes} bytes of KV) "
                         f"is what makes GPU {device} not fit: without it the GPU fits\n")
    refused = [u for u in plan.unplannable if u.unit in requests and u.unit in engines and
               vllm_release_ok(views, u.unit)]
    if refused:
        stderr.write(f"{PROG}: error: {refused[0].unit}: {refused[0].why}; {refused[0].remedy}\n")
        return EXIT_USAGE
    if args.format == "table":
        stdout.write(render_table(plan))
    elif args.format == "json":
        stdout.write(render_json(plan))
    elif not plan.fits:
        # what would be pasted or written makes units fail at start (or R >= 1): the reasons follow
        where = f"written to {args.output_dir}" if args.output_dir is not None else "printed"
        stderr.write(f"{PROG}: nothing {where}: the plan does not fit\n")
    elif args.format in containers.CONTAINER_FORMATS:
        code = _write_containers(args, plan, stdout, stderr)
        if code is not None:
            return code
    else:
        code = _write_units(args, plan, stdout, stderr)
        if code is not None:
            return code
    for u in plan.unplannable:
        held = f" (counted at {u.held_from} = {_gib_of(u.held_bytes)})" if u.held_bytes else \
            " (its memory is not known: no start of it says its gpu_memory_utilization)"
        stderr.write(f"{PROG}: {u.unit}: not plannable: {u.why}; {u.remedy}{held if u.device else ''}\n")
    if not plan.fits:
        for device in plan.devices:
            fit = device.fit
            if device.fits:
                continue
            if not fit.fits:
                stderr.write(f"{PROG}: GPU {device.device} does not fit: {_gib_of(fit.missing_bytes)} missing "
                             f"({fit.missing_bytes} bytes; total {_gib_of(device.total_bytes)}, reserve "
                             f"{_gib_of(device.reserve_bytes)}, left out {_gib_of(device.left_out_bytes)})\n")
            for reason in why_not_fitting(device)[0 if fit.fits else 1:]:
                stderr.write(f"{PROG}: GPU {device.device}: {reason}\n")
            for u in device.units:
                stderr.write(f"{PROG}:   {u.unit}: {_gib_of(u.footprint.total_bytes)} (non-KV "
                             f"{_gib_of(u.footprint.non_kv_bytes)} + KV {_gib_of(u.kv_cache_memory_bytes)} for "
                             f"{u.target.reason}); largest that fits: {_largest_that_fits(device, u)}\n")
        if all(device.fit.fits and not device.beyond_one for device in plan.devices):
            return EXIT_INCOMPLETE  # only a left-out unit whose memory is not known: the fit cannot be proven
        return EXIT_DOES_NOT_FIT
    planned = [u for d in plan.devices for u in d.units]
    if not planned or plan.unplannable or beyond_max_units:
        what = []
        if not planned:
            what.append("nothing was planned")
        if plan.unplannable:
            what.append(f"{len(plan.unplannable)} unit(s) left out of the plan "
                        f"({', '.join(u.unit for u in plan.unplannable)})")
        if beyond_max_units:
            what.append(f"{beyond_max_units} unit(s) of the journal not read (beyond --journal.max-units "
                        f"{args.journal_max_units})")
        stderr.write(f"{PROG}: incomplete: {'; '.join(what)}\n")
        return EXIT_INCOMPLETE
    return EXIT_FITS


def _growth_that_breaks_the_fit(plan: Plan, views: Sequence[UnitView], totals: Mapping[str, int],
                                placement: Mapping[str, set[str]], reserve: int, requests: Mapping[str, TargetRequest],
                                given: Mapping[str, TargetRequest],
                                observed: Mapping[str, rightsizing.Recommendation]) -> list[tuple[str, str]]:
    """(unit, GPU) for each right-sized unit that grew and whose growth alone makes its GPU not fit: planned at
    its KV bytes of now instead, the GPU fits."""
    grown = [r for r in observed.values() if r.kv_bytes > r.current_bytes and r.unit not in given]
    blamed = []
    for r in grown:
        as_now = {**requests, r.unit: TargetRequest(kv_bytes=r.current_bytes)}
        without = make_plan(views, totals, placement, reserve, as_now)
        for was, device in zip(plan.devices, without.devices):
            if not was.fit.fits and device.fit.fits and any(u.unit == r.unit for u in device.units):
                blamed.append((r.unit, device.device))
    return blamed


def vllm_release_ok(views: Sequence[UnitView], unit: str) -> bool:
    """Whether the unit's latest start is of a release the plan covers (a target refused for it is a usage error)."""
    view = next(v for v in views if v.unit == unit)
    return bool(view.latest and view.latest.version) and \
        vllm.release(view.latest.version) >= KV_BUDGET_ON_XPU_SINCE


def _write_units(args: argparse.Namespace, plan: Plan, stdout: TextIO, stderr: TextIO) -> int | None:
    """--format systemd / nixos, for a plan that fits: read the units' commands, check every drop-in, then print or
    write them.
    All or nothing: a unit whose drop-in cannot be made (its command unreadable or out of reach, or
    systemd-analyze refusing it) stops the writing with a reason per unit (exit 3). An exit status when
    it must stop."""
    units = [u for d in plan.devices for u in d.units]
    if args.format == "nixos":
        stdout.write(render_nixos(plan))
        return None
    systemctl = args.systemctl
    analyze = systemd_analyze_beside(systemctl)
    texts: dict[str, str] = {}
    refused: list[str] = []
    for u in units:
        if container_commands.is_container(u.unit):
            refused.append(f"{u.unit}: a container, not a systemd unit: use --format compose or podman "
                           f"(docs/planner.md)")
            continue
        unit_text = read_unit(systemctl, u.unit)
        command = exec_start_from_cat(unit_text) if unit_text is not None else None
        if command is None:
            refused.append(f"{u.unit}: its one ExecStart= could not be read ({systemctl} cat); add to its command: "
                           f"{planned_flags(u)}")
            continue
        try:
            text = drop_in(u, command)
        except NotEditable as error:
            refused.append(f"{u.unit}: {error}")
            continue
        problem = verify_drop_in(analyze, u.unit, unit_text, text) if analyze else None
        if problem is not None:
            refused.append(f"{u.unit}: {problem}")
            continue
        texts[u.unit] = text
    if analyze is None:
        stderr.write(f"{PROG}: warning: no systemd-analyze beside {systemctl}: the drop-ins are not verified\n")
    for reason in refused:
        stderr.write(f"{PROG}: not applicable: {reason}\n")
    if refused and args.output_dir is not None:
        stderr.write(f"{PROG}: nothing written to {args.output_dir}: {len(refused)} unit(s) cannot take the plan\n")
        return EXIT_INCOMPLETE
    if args.output_dir is None:
        for unit, text in texts.items():
            stdout.write(f"# /etc/systemd/system/{unit}.d/{DROP_IN_NAME}\n{text}\n")
        return EXIT_INCOMPLETE if refused else None
    # held open once checked, reached only through what nobody but root or this user can change: a link another
    # user may retarget would choose where root writes the drop-ins
    owners = frozenset({0, os.geteuid()})
    try:
        output_dir = plan_dropins.open_trusted_directory(os.path.abspath(args.output_dir), owners, create=True)
    except OSError as error:
        stderr.write(f"{PROG}: error: --output-dir {args.output_dir}: {error}: nothing written\n")
        return EXIT_USAGE
    try:
        for unit, text in texts.items():
            shown = f"{args.output_dir.rstrip('/')}/{unit}.d"
            try:
                unit_dir = plan_dropins.open_below(output_dir, f"{unit}.d", os.O_RDONLY | os.O_DIRECTORY,
                                                 args.output_dir, owners, create=True)
                try:
                    write_atomically(unit_dir, DROP_IN_NAME, text, shown)
                finally:
                    os.close(unit_dir)
            except OSError as error:
                stderr.write(f"{PROG}: error: {unit}: {error}\n")
                return EXIT_USAGE
            stdout.write(f"{shown}/{DROP_IN_NAME}\n")
    finally:
        os.close(output_dir)
    return EXIT_INCOMPLETE if refused else None


def _write_containers(args: argparse.Namespace, plan: Plan, stdout: TextIO, stderr: TextIO) -> int | None:
    """--format compose / podman / kustomize, for a plan that fits: each planned container of the format's runtime,
    its command read from its engine (or the kustomization) and edited, the output loaded where a tool can
    (Compose, kustomize); printed (kustomize: written to --output-dir) only when every container of the runtime
    could take it; each workload not covered is named (exit 3)."""
    runtime = containers.CONTAINER_FORMATS[args.format]
    planned = [u for d in plan.devices for u in d.units]
    refused = [f"{u.unit}: not a {runtime} container: its plan needs "
               f"--format {containers.format_of(u.unit)}" for u in planned
               if container_commands.runtime_of_key(u.unit) != runtime]
    mine = [u for u in planned if container_commands.runtime_of_key(u.unit) == runtime]
    if args.format == "compose":
        commands = {u.unit: container_commands.docker_command(u.unit, container_paths(args)["docker_roots"])
                    for u in mine}
        rendered = containers.render_compose(mine, commands, compose_verifier(args.compose))
    elif args.format == "podman":
        commands = {u.unit: container_commands.podman_command(u.unit, args.podman) for u in mine}
        rendered = containers.render_podman(mine, commands)
    else:
        rendered = _kustomize(args, mine)
    refused += rendered.refused
    for reason in refused:
        stderr.write(f"{PROG}: not applicable: {reason}\n")
    if rendered.refused:
        stderr.write(f"{PROG}: nothing printed or written: {len(rendered.refused)} container(s) cannot take the "
                     f"plan\n")
        return EXIT_INCOMPLETE
    if args.format != "kustomize":
        stdout.write(rendered.text)
        return EXIT_INCOMPLETE if refused else None
    owners = frozenset({0, os.geteuid()})
    try:
        trusted = plan_dropins.open_trusted_directory(os.path.abspath(args.output_dir), owners, create=True)
        try:
            output_dir = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=trusted)  # one that fsync takes
        finally:
            os.close(trusted)
        try:
            write_atomically(output_dir, KUSTOMIZATION, rendered.text, args.output_dir)
        finally:
            os.close(output_dir)
    except OSError as error:
        stderr.write(f"{PROG}: error: --output-dir {args.output_dir}: {error}: nothing written\n")
        return EXIT_USAGE
    stdout.write(f"{args.output_dir.rstrip('/')}/{KUSTOMIZATION}\n")
    return EXIT_INCOMPLETE if refused else None


def _kubectl_kustomize(kubectl: str, directory: str) -> list[object]:
    """The documents `kubectl kustomize DIRECTORY` renders; RuntimeError with what it said when it cannot."""
    try:
        completed = subprocess.run([kubectl, "kustomize", directory], capture_output=True, text=True,
                                   timeout=SYSTEMCTL_TIMEOUT_S * 6, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        raise RuntimeError(f"{kubectl} kustomize could not run ({error})") from None
    if completed.returncode != 0:
        raise RuntimeError(f"{kubectl} kustomize refuses it: {' '.join(completed.stderr.split())[:500]}")
    try:
        return list(yaml.safe_load_all(completed.stdout))
    except yaml.YAMLError as error:
        raise RuntimeError(f"{kubectl} kustomize gave no YAML ({error})") from None


def _kustomize(args: argparse.Namespace, plans: Sequence[UnitPlan]) -> containers.Rendered:
    """The overlay for --output-dir over --kustomize-base, each container's args patched; rendered by kubectl
    kustomize in a directory of its own (the base named relative to it) and each container checked to get the
    planned args, before anything is written."""
    base = os.path.abspath(args.kustomize_base)
    try:
        documents = _kubectl_kustomize(args.kubectl, base)
    except RuntimeError as error:
        return containers.Rendered("", tuple(f"{u.unit}: --kustomize-base {args.kustomize_base}: {error}"
                                             for u in plans))
    patches, refused = [], []
    for u in plans:
        try:
            patches.append(containers.kustomize_patch(u, documents))
        except NotEditable as error:
            refused.append(f"{u.unit}: {error}")
    if refused or not patches:
        return containers.Rendered("", tuple(refused))
    with tempfile.TemporaryDirectory(prefix="vllm-xpu-plan-") as directory:
        Path(directory, KUSTOMIZATION).write_text(
            containers.render_kustomization(patches, os.path.relpath(base, directory)))
        try:
            rendered = _kubectl_kustomize(args.kubectl, directory)
        except RuntimeError as error:
            return containers.Rendered("", tuple(f"{p.unit}: the overlay: {error}" for p in patches))
    wrong = [p.unit for p in patches if containers.applied_args(rendered, p) != p.args]
    if wrong:
        return containers.Rendered("", tuple(f"{unit}: kubectl kustomize does not give it the planned args"
                                             for unit in wrong))
    return containers.Rendered(containers.render_kustomization(
        patches, os.path.relpath(base, os.path.abspath(args.output_dir))), ())
