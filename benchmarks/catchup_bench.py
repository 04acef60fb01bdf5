"""Journal catch-up: the exporter's full catch-up against journalctl on the same journal, same run.

    python benchmarks/catchup_bench.py [--sizes 250000 1000000] [--runs 3]

"Ours" is a fresh process that does exactly what the exporter does on start: a LogFollower over
the journal directory (units ``vllm*.service``, boot ``all``) reads every selected entry with the
JournalReader, parses each message with the vLLM grammar and folds it into an EngineTracker; the
process exits once the follower reports it has caught up. "journalctl" is ``journalctl -D DIR -u
'vllm*' -o json > /dev/null``: the same entries (``-u`` also selects PID 1's ``UNIT=`` records),
decoded and printed. Both are timed from spawn to exit (ours includes starting Python and importing
the exporter); runs alternate, and the median run counts. Peak RSS: ours is the process's own
VmHWM, journalctl's its ru_maxrss from wait4(2). A third process, the JournalReader alone (no
grammar, no fold), shows how the catch-up time splits between reading and interpreting.

Unit scaling (``--units 1000 3000``): the same catch-up over journals of N units × 8 entries (all
starting at once), its CPU from creating the follower to caught up, with the default
``--journal.max-units`` (64: the units beyond it are refused) and with a cap above N (all folded).
The catch-up is linear in entries when the CPU ratio of 3,000 to 1,000 units is about 3.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bigjournal import ENTRIES_PER_UNIT, UNIT_GLOB, ensure_journal, ensure_units_journal  # noqa: E402
from measure import median, run_child  # noqa: E402

from vllm_xpu_exporter.fold.engine_starts import DEFAULT_MAX_UNITS  # noqa: E402

CAUGHT_UP_POLL_S = 0.005


@dataclass(frozen=True)
class Side:
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    in_process_s: float | None = None  # ours: from creating the follower to caught up


@dataclass(frozen=True)
class CatchUpResult:
    journal_entries: int
    selected: int
    ours: Side
    journalctl: Side
    reader_only: Side
    fold: dict  # unit -> starts, failures, overlaps (what the catch-up found)

    @property
    def ratio(self) -> float:
        return self.ours.wall_s / self.journalctl.wall_s

    @property
    def entries_per_s(self) -> float:
        return self.selected / self.ours.wall_s


def journalctl_argv(directory: Path) -> list[str]:
    return ["journalctl", "--no-pager", "-D", str(directory), "-u", UNIT_GLOB.removesuffix(".service"), "-o", "json"]


def count_journalctl(directory: Path) -> int:
    """Entries journalctl selects, counted while streaming its output."""
    process = subprocess.Popen(journalctl_argv(directory), stdout=subprocess.PIPE)
    assert process.stdout is not None
    lines = 0
    while chunk := process.stdout.read(1 << 20):
        lines += chunk.count(b"\n")
    if process.wait() != 0:
        raise RuntimeError(f"journalctl exited with {process.returncode}")
    return lines


def child_catch_up(directory: str, max_units: int | None = None) -> None:
    """In the measured child: the follower's catch-up, as the exporter runs it."""
    started = time.perf_counter()
    from vllm_xpu_exporter.sources.journal import open_journal
    from vllm_xpu_exporter.sources.journal import JournalSelection
    from vllm_xpu_exporter.sources.logs.follower import LogFollower

    cpu_started = time.process_time()
    follower = LogFollower(JournalSelection(directory=directory, unit_globs=[UNIT_GLOB], boot="all"),
                           max_units or DEFAULT_MAX_UNITS, open_reader=open_journal, source="journal")
    follower.start()
    while (state := follower.state()).error is not None:
        time.sleep(CAUGHT_UP_POLL_S)
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    fold = {view.unit: {"starts": view.starts, "failures": sum(view.failures.values()), "overlaps": view.overlaps}
            for view in state.views}
    print(json.dumps({"entries": state.entries_read, "seconds": seconds, "cpu_seconds": cpu_seconds,
                      "dropped_units": state.dropped_units, "vm_hwm_mb": _vm_hwm_mb(), "fold": fold}), flush=True)
    # Not follower.stop(): the follower now waits for new entries in 0.5 s slices, and joining it would
    # add that wait to the measured time. The exporter goes on following; this process is done.
    os._exit(0)


def child_read_only(directory: str) -> None:
    """In the measured child: the JournalReader alone, every selected entry decoded, nothing parsed."""
    started = time.perf_counter()
    from vllm_xpu_exporter.sources.journal import JournalReader
    from vllm_xpu_exporter.sources.journal import JournalSelection

    entries = 0
    with JournalReader(JournalSelection(directory=directory, unit_globs=[UNIT_GLOB], boot="all")) as reader:
        while batch := reader.read_available(4096):
            entries += len(batch)
    print(json.dumps({"entries": entries, "seconds": time.perf_counter() - started, "vm_hwm_mb": _vm_hwm_mb(),
                      "fold": {}}))


def _vm_hwm_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) / 1024


def run_ours(directory: Path, mode: str, *extra: str) -> tuple[Side, dict]:
    run = run_child([sys.executable, __file__, mode, str(directory), *extra])
    report = json.loads(run.stdout)
    return Side(run.wall_s, run.cpu_s, report["vm_hwm_mb"], report["seconds"]), report


def run_journalctl(directory: Path) -> Side:
    run = run_child(journalctl_argv(directory), discard_stdout=True)
    return Side(run.wall_s, run.cpu_s, run.max_rss_mb)


def _median_side(runs: list[Side]) -> Side:
    wall = median([run.wall_s for run in runs])
    chosen = min(runs, key=lambda run: abs(run.wall_s - wall))
    return Side(chosen.wall_s, chosen.cpu_s, max(run.peak_rss_mb for run in runs), chosen.in_process_s)


def bench_catch_up(size: int, runs: int, log=print) -> CatchUpResult:
    directory = ensure_journal(size, log=log)
    selected = count_journalctl(directory)
    ours: list[Side] = []
    theirs: list[Side] = []
    fold: dict = {}
    for _ in range(runs):
        side, report = run_ours(directory, "--child-catch-up")
        if report["entries"] != selected:
            raise RuntimeError(f"journalctl selects {selected} entries, the catch-up read {report['entries']}")
        ours.append(side)
        fold = report["fold"]
        theirs.append(run_journalctl(directory))
    reader_only, report = run_ours(directory, "--child-read-only")
    if report["entries"] != selected:
        raise RuntimeError(f"journalctl selects {selected} entries, the reader read {report['entries']}")
    return CatchUpResult(size, selected, _median_side(ours), _median_side(theirs), reader_only, fold)


@dataclass(frozen=True)
class UnitScalingResult:
    units: tuple[int, ...]
    max_units: int | None  # None: the default cap
    cpu_s: dict[int, float]  # units -> catch-up CPU (median of runs), follower created to caught up
    entries_read: dict[int, int]
    dropped_units: dict[int, int]

    @property
    def cap(self) -> str:
        return f"default cap {DEFAULT_MAX_UNITS}" if self.max_units is None else f"cap {self.max_units:,}"

    @property
    def cpu_ratio(self) -> float:
        """CPU with the most units over CPU with the fewest: their ratio when linear."""
        return self.cpu_s[max(self.units)] / self.cpu_s[min(self.units)]


def bench_unit_scaling(units: tuple[int, ...], runs: int, max_units: int | None = None,
                       log=print) -> UnitScalingResult:
    cpu: dict[int, float] = {}
    read: dict[int, int] = {}
    dropped: dict[int, int] = {}
    for count in units:
        directory = ensure_units_journal(count, log=log)
        reports = [run_ours(directory, "--child-catch-up", *(["--max-units", str(max_units)] if max_units else []))[1]
                   for _ in range(runs)]
        cpu[count] = median([report["cpu_seconds"] for report in reports])
        read[count], dropped[count] = reports[0]["entries"], reports[0]["dropped_units"]
        watched = min(count, max_units or DEFAULT_MAX_UNITS)
        if read[count] != watched * ENTRIES_PER_UNIT or dropped[count] != count - watched:
            raise RuntimeError(f"{count} units: read {read[count]} entries and dropped {dropped[count]} units, "
                               f"expected {watched * ENTRIES_PER_UNIT} and {count - watched}")
    return UnitScalingResult(tuple(units), max_units, cpu, read, dropped)


def report_unit_scaling(result: UnitScalingResult, runs: int, log=print) -> None:
    log(f"  catch-up CPU by number of units × {ENTRIES_PER_UNIT} entries, {result.cap}, median of {runs} run(s):")
    for count in result.units:
        log(f"    {count:6,} units: {result.cpu_s[count]:6.2f} s CPU, {result.entries_read[count]:,} entries folded, "
            f"{result.dropped_units[count]:,} units dropped")
    fewest, most = min(result.units), max(result.units)
    log(f"    {most:,} / {fewest:,} units: CPU x{result.cpu_ratio:.2f} "
        f"(x{most / fewest:g} is linear)")


def report(result: CatchUpResult, runs: int, log=print) -> None:
    ours, theirs, reader = result.ours, result.journalctl, result.reader_only
    log(f"  {result.journal_entries:,} entries, {result.selected:,} selected; median of {runs} run(s), "
        f"spawn to exit:")
    log(f"    catch-up (reader+grammar+fold): {ours.wall_s:6.2f} s wall {ours.cpu_s:6.2f} s CPU "
        f"{result.entries_per_s:9,.0f} entries/s  peak RSS {ours.peak_rss_mb:5.1f} MB  "
        f"(in-process {ours.in_process_s:.2f} s)")
    log(f"    journalctl -o json >/dev/null : {theirs.wall_s:6.2f} s wall {theirs.cpu_s:6.2f} s CPU "
        f"{result.selected / theirs.wall_s:9,.0f} entries/s  peak RSS {theirs.peak_rss_mb:5.1f} MB")
    log(f"    JournalReader alone           : {reader.wall_s:6.2f} s wall {reader.cpu_s:6.2f} s CPU "
        f"(in-process {reader.in_process_s:.2f} s): grammar+fold cost "
        f"{ours.in_process_s - reader.in_process_s:+.2f} s")
    log(f"    ratio catch-up/journalctl: {result.ratio:.2f} wall, {ours.cpu_s / theirs.cpu_s:.2f} CPU")
    folded = ", ".join(f"{unit} {f['starts']} starts/{f['failures']} failures/{f['overlaps']} overlaps"
                       for unit, f in sorted(result.fold.items()))
    log(f"    folded: {folded}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[250_000, 1_000_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--units", type=int, nargs="+", help="measure the unit scaling instead, at these units")
    parser.add_argument("--child-catch-up", help=argparse.SUPPRESS)
    parser.add_argument("--child-read-only", help=argparse.SUPPRESS)
    parser.add_argument("--max-units", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_catch_up:
        child_catch_up(args.child_catch_up, args.max_units)
        return 0
    if args.units:
        for max_units in (None, max(args.units)):
            report_unit_scaling(bench_unit_scaling(tuple(args.units), args.runs, max_units), args.runs)
        return 0
    if args.child_read_only:
        child_read_only(args.child_read_only)
        return 0
    for size in args.sizes:
        report(bench_catch_up(size, args.runs), args.runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
