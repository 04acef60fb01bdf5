"""`vllm-xpu-plan`: size every watched vLLM unit's KV cache so that the units of each GPU fit together.

It reads the journal through the same reader and fold as the exporter and the gate, and the devices'
total memory from Level Zero (its child process) or `--device-memory BYTES` (offline: one GPU of that
size). For each engine unit it takes what its latest start printed (weights, peak activation, non-torch
memory, KV bytes and tokens, block size, lengths, max_num_seqs, vLLM version), works out the KV cache a
target needs in whole blocks and the unit's footprint (`vllm_xpu_exporter.memory`), holds each GPU's footprints
against its total less `--reserve`, and prints the `--kv-cache-memory-bytes` to set per unit: a table,
JSON, systemd drop-ins or a NixOS snippet. docs/planner.md says how and why.

Exit status: 0 every GPU's units fit; 1 some do not (each GPU, unit and the bytes missing named on
stderr); 2 usage (one line).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from vllm_xpu_exporter import __version__, rightsizing
from vllm_xpu_exporter.flags import (EXIT_USAGE, OneLineParser, add_journal_flags, add_levelzero_flags, add_procfs_flag,
                            add_systemctl_flag, check_journal_flags, journal_selection)
from vllm_xpu_exporter.fold.engine_starts import UnitView
from vllm_xpu_exporter.planning import Plan, TargetRequest, UnitPlan, Unplannable, make_plan
from vllm_xpu_exporter.sources import procfs, prometheus

PROG = "vllm-xpu-plan"
EXIT_FITS = 0
EXIT_DOES_NOT_FIT = 1
MiB = 1 << 20
# The driver's and the runtime's own device memory, which no unit's footprint counts (docs/planner.md).
DEFAULT_RESERVE = 512 * MiB
OFFLINE_DEVICE = "offline"
SYSTEMCTL_TIMEOUT_S = 10.0
DROP_IN_NAME = "50-vllm-xpu-plan.conf"
_UTILISATION_FLAG = re.compile(r"\s--gpu[-_]memory[-_]utilization(?:=|\s+)\S+")
_BUDGET_FLAG = re.compile(r"\s--kv[-_]cache[-_]memory[-_]bytes(?:=|\s+)\S+")


# ---------------------------------------------------------------------------------------- the unit's command

def exec_start_from_cat(text: str) -> str | None:
    """The unit's effective ExecStart= command line from `systemctl cat UNIT` (the unit file and its
    drop-ins, in order; an empty ExecStart= resets the list). None unless there is exactly one."""
    commands: list[str] = []
    pending: str | None = None
    for raw in text.splitlines():
        line = raw.strip() if pending is None else raw
        if pending is not None:
            pending += " " + line.strip()
        elif line.startswith("ExecStart="):
            pending = line[len("ExecStart="):]
        else:
            continue
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        value, pending = pending.strip(), None
        if value:
            commands.append(value)
        else:
            commands.clear()
    return commands[0] if len(commands) == 1 else None


def read_exec_start(systemctl: str, unit: str) -> str | None:
    """The unit's command as its files write it (specifiers and quoting kept), or None when systemctl
    cannot say."""
    try:
        completed = subprocess.run([systemctl, "cat", "--", unit], capture_output=True, text=True,
                                   timeout=SYSTEMCTL_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return exec_start_from_cat(completed.stdout) if completed.returncode == 0 else None


def planned_command(command: str, plan: UnitPlan) -> str:
    """The command with the planned flags: any --gpu-memory-utilization / --kv-cache-memory-bytes dropped,
    then --gpu-memory-utilization (the footprint's share: vLLM and the gate still ask that much free at
    start) and --kv-cache-memory-bytes appended."""
    stripped = _BUDGET_FLAG.sub("", _UTILISATION_FLAG.sub("", " " + command)).strip()
    return f"{stripped} {planned_flags(plan)}"


def planned_flags(plan: UnitPlan) -> str:
    return f"--gpu-memory-utilization {plan.gpu_memory_utilization:g} --kv-cache-memory-bytes {plan.kv_cache_memory_bytes}"


# ---------------------------------------------------------------------------------------- output forms

def _gib(value: int) -> str:
    return f"{value / (1 << 30):.2f} GiB"


def render_table(plan: Plan) -> str:
    lines: list[str] = []
    for device in plan.devices:
        fit = device.fit
        state = "fits" if fit.fits else f"DOES NOT FIT: {fit.missing_bytes} bytes ({_gib(fit.missing_bytes)}) missing"
        lines.append(f"GPU {device.device}: total {device.total_bytes} ({_gib(device.total_bytes)}), reserve "
                     f"{device.reserve_bytes}, units {fit.footprint_bytes} ({_gib(fit.footprint_bytes)}), left "
                     f"{fit.left_bytes} ({_gib(fit.left_bytes)}): {state}")
        header = ("UNIT", "VLLM", "TARGET TOKENS", "NON-KV BYTES", "KV BYTES", "FOOTPRINT", "GPU UTIL",
                  "--kv-cache-memory-bytes")
        rows = [header] + [(u.unit, u.version, str(u.target.tokens), str(u.footprint.non_kv_bytes),
                            str(u.footprint.kv_bytes), str(u.footprint.total_bytes), f"{u.gpu_memory_utilization:g}",
                            str(u.kv_cache_memory_bytes)) for u in device.units]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines += ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
        for u in device.units:
            lines.append(f"  {u.unit}: target {u.target.reason}; non-KV {u.non_kv_from}")
            lines += [f"  {u.unit}: note: {note}" for note in u.notes]
    for u in plan.unplannable:
        where = f" (GPU {u.device})" if u.device else ""
        lines.append(f"not plannable: {u.unit}{where}: {u.why}; {u.remedy}")
    return "\n".join(lines) + "\n"


def render_json(plan: Plan) -> str:
    def unit(u: UnitPlan) -> dict[str, object]:
        f = u.footprint
        return {"unit": u.unit, "vllm_version": u.version, "target_tokens": u.target.tokens,
                "target": u.target.reason, "block_size": u.block_size, "kv_bytes_per_token": u.kv_bytes_per_token,
                "weights_bytes": f.weights_bytes, "activation_bytes": f.activation_bytes,
                "non_torch_bytes": f.non_torch_bytes, "non_kv_bytes": f.non_kv_bytes, "non_kv_from": u.non_kv_from,
                "kv_cache_memory_bytes": u.kv_cache_memory_bytes, "footprint_bytes": f.total_bytes,
                "gpu_memory_utilization": u.gpu_memory_utilization, "notes": list(u.notes)}

    def unplannable(u: Unplannable) -> dict[str, object]:
        return {"unit": u.unit, "device": u.device, "why": u.why, "remedy": u.remedy}

    document = {
        "fits": plan.fits,
        "devices": [{"device": d.device, "total_bytes": d.total_bytes, "reserve_bytes": d.reserve_bytes,
                     "footprint_bytes": d.fit.footprint_bytes, "left_bytes": d.fit.left_bytes, "fits": d.fit.fits,
                     "missing_bytes": d.fit.missing_bytes, "units": [unit(u) for u in d.units]}
                    for d in plan.devices],
        "unplannable": [unplannable(u) for u in plan.unplannable],
    }
    return json.dumps(document, indent=2) + "\n"


def drop_in(plan: UnitPlan, command: str | None) -> str:
    """A drop-in for /etc/systemd/system/UNIT.d/ (or `systemctl edit UNIT`): ExecStart= reset, the unit's
    command restated with the planned flags. Without the command: the flags to add, commented."""
    head = [f"# {plan.unit}: written by {PROG} {__version__}: footprint {plan.footprint.total_bytes} bytes "
            f"(KV {plan.kv_cache_memory_bytes} for {plan.target.tokens} tokens)"]
    if command is None:
        return "\n".join([*head, "# the unit's ExecStart= could not be read (systemctl cat): add to its command",
                          f"#   {planned_flags(plan)}", ""])
    return "\n".join([*head, "[Service]", "ExecStart=", f"ExecStart={planned_command(command, plan)}", ""])


def render_nixos(plan: Plan, commands: Mapping[str, str | None]) -> str:
    lines = [f"# {PROG} {__version__}: --kv-cache-memory-bytes per unit", "{ lib, ... }:", "{"]
    for device in plan.devices:
        for u in device.units:
            name = u.unit.removesuffix(".service")
            command = commands.get(u.unit)
            if command is None:
                lines.append(f"  # {u.unit}: command not readable; add to its ExecStart: {planned_flags(u)}")
                continue
            text = planned_command(command, u).replace("\\", "\\\\").replace('"', '\\"').replace("${", "\\${")
            lines.append(f'  systemd.services."{name}".serviceConfig.ExecStart = lib.mkForce "{text}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


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
                                                  "the units of each GPU fit (see docs/planner.md).")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--device-memory", dest="device_memory", type=byte_count, default=None, metavar="BYTES",
                        help="plan offline for one GPU of this total memory (default: every GPU Level Zero reports)")
    parser.add_argument("--reserve", type=byte_count, default=DEFAULT_RESERVE, metavar="BYTES",
                        help=f"memory of each GPU no unit may plan for: the driver's and runtime's own "
                             f"(default {DEFAULT_RESERVE // MiB}MiB)")
    parser.add_argument("--tokens", type=unit_count, action="append", default=[], metavar="UNIT=N",
                        help="the KV cache of UNIT holds N tokens (default: max_num_seqs x the full model length)")
    parser.add_argument("--requests", type=unit_count, action="append", default=[], metavar="UNIT=N",
                        help="the KV cache of UNIT holds N requests of its full model length")
    parser.add_argument("--format", choices=("table", "json", "systemd", "nixos"), default="table")
    parser.add_argument("--output-dir", dest="output_dir", default=None, metavar="DIR",
                        help="with --format systemd: write DIR/UNIT.d/" + DROP_IN_NAME + " per unit")
    add_systemctl_flag(parser, "to read the units' commands with")
    add_journal_flags(parser)
    add_levelzero_flags(parser)
    add_procfs_flag(parser)
    rightsizing.add_flags(parser)
    return parser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_journal_flags(parser, args)
    if args.output_dir is not None and args.format != "systemd":
        parser.error("--output-dir goes with --format systemd")
    if args.device_memory is not None and args.device_memory <= args.reserve:
        parser.error(f"--device-memory {args.device_memory} leaves nothing after --reserve {args.reserve}")
    both = {unit for unit, _ in args.tokens} & {unit for unit, _ in args.requests}
    if both:
        parser.error(f"--tokens and --requests both given for {', '.join(sorted(both))}")
    return args


def read_views(args: argparse.Namespace, timeout: float = 120.0) -> list[UnitView]:
    from vllm_xpu_exporter.sources.journal.follower import STILL_READING, JournalFollower

    follower = JournalFollower(journal_selection(args), args.journal_max_units, latest_invocations=True)
    follower.start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            state = follower.state()
            if state.error is None:
                return state.views
            if state.error != STILL_READING or time.monotonic() >= deadline:
                raise RuntimeError(f"cannot read the journal ({state.error})")
            time.sleep(0.02)
    finally:
        follower.stop(timeout=1.0)


def read_totals(args: argparse.Namespace) -> dict[str, int]:
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
    return {d.identity.pci_address: d.total for d in devices if d.total is not None}


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    args = parse_args(argv)
    try:
        views = read_views(args)
        if args.device_memory is not None:
            totals, placement = {OFFLINE_DEVICE: args.device_memory}, {}
        else:
            totals = read_totals(args)
            if not totals:
                raise RuntimeError("Level Zero reports no GPU; plan offline with --device-memory BYTES")
            placement = procfs.devices_of_units(args.procfs) if len(totals) > 1 else {}
    except RuntimeError as error:
        stderr.write(f"{PROG}: error: {error}\n")
        return EXIT_USAGE
    requests = {unit: TargetRequest(tokens=n) for unit, n in args.tokens}
    requests.update({unit: TargetRequest(requests=n) for unit, n in args.requests})
    if args.prometheus is not None or args.observed is not None:  # right-sizing (docs/discovery.md)
        try:
            observed = rightsizing.recommend(views, rightsizing.parse_observed(prometheus.read_observed(args)))
        except rightsizing.ObservedError as error:
            stderr.write(f"{PROG}: error: {error}\n")
            return EXIT_USAGE
        for r in observed.values():
            stderr.write(f"{PROG}: {r.unit}: {r.why}: budget {r.kv_bytes} bytes (now {r.current_bytes})\n")
        requests = {**rightsizing.target_requests(observed), **requests}
    plan = make_plan(views, totals, placement, args.reserve, requests)
    unknown = sorted(set(requests) - {u.unit for d in plan.devices for u in d.units})
    for unit in unknown:
        stderr.write(f"{PROG}: warning: {unit}: a target was given but the unit was not planned\n")
    if args.format == "table":
        stdout.write(render_table(plan))
    elif args.format == "json":
        stdout.write(render_json(plan))
    else:
        systemctl = args.systemctl
        units = [u for d in plan.devices for u in d.units]
        commands = {u.unit: read_exec_start(systemctl, u.unit) for u in units}
        for unit, command in commands.items():
            if command is None:
                stderr.write(f"{PROG}: warning: {unit}: its ExecStart= could not be read ({systemctl} cat); "
                             f"add to its command: {planned_flags(next(u for u in units if u.unit == unit))}\n")
        if args.format == "nixos":
            stdout.write(render_nixos(plan, commands))
        elif args.output_dir is not None and not plan.fits:
            # drop-ins of a plan that does not fit would make the units fail at start (R up to 1)
            stderr.write(f"{PROG}: nothing written to {args.output_dir}: the plan does not fit\n")
        else:
            for u in units:
                text = drop_in(u, commands[u.unit])
                if args.output_dir is not None:
                    path = Path(args.output_dir) / f"{u.unit}.d" / DROP_IN_NAME
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
                    stdout.write(f"{path}\n")
                else:
                    stdout.write(f"# /etc/systemd/system/{u.unit}.d/{DROP_IN_NAME}\n{text}\n")
    for u in plan.unplannable:
        stderr.write(f"{PROG}: {u.unit}: not plannable: {u.why}; {u.remedy}\n")
    if plan.fits:
        return EXIT_FITS
    for device in plan.devices:
        fit = device.fit
        if not fit.fits:
            units = ", ".join(f"{u.unit} {u.footprint.total_bytes}" for u in device.units)
            stderr.write(f"{PROG}: GPU {device.device} does not fit: {fit.missing_bytes} bytes missing "
                         f"({units}; total {device.total_bytes}, reserve {device.reserve_bytes})\n")
    return EXIT_DOES_NOT_FIT


if __name__ == "__main__":
    sys.exit(main())
