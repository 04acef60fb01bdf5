"""vllm-xpu-exporter's benchmark suite: one command, every figure and its target, baselines measured in the
same run.

    python benchmarks/run.py            # the full run (~6 minutes once the journals are cached)
    python benchmarks/run.py --quick    # fewer scrapes, runs and samples; 10 s idle instead of 60 s

Sections (each also runs alone: scrape_bench.py, catchup_bench.py, gate_decision_bench.py, live_bench.py,
hostile_bench.py):

1. scrapes of the real exporter process over the fake Level Zero driver, a fixture procfs and a
   settings journal, at a small host (1 device, 3 units), the large one (8 devices, 64 GPU processes,
   16 units) and the large one with 300 other processes (hosts.py);
2. journal catch-up (reader + vLLM grammar + fold) against journalctl on the same 250k- and 1M-entry
   journals (10 % watched), run alternately; and its CPU over 1,000 and 3,000 units × 8 entries, with the
   default --journal.max-units and with a cap above the units (linear: 3,000 units cost 3× 1,000);
   2b. the init gate's first decision state on the 1M-entry boot (every start its own invocation id): its
   read of the watched units' latest invocations against the read of the whole boot, alternating;
3. the exporter over the large host and the 1M-entry journal: catch-up, RSS after it, idle CPU,
   follow latency;
4. hostile network clients against the exporter over the small host, inside TasksMax=64 (a pids
   cgroup): scrapes under 500 idle and 300 slowloris connections, and the peak RSS while 40 clients
   send 6 MB of headers each.

Needs root (the fixture procfs makes device nodes; the pids cgroup), gcc (the fake driver), systemd-journal-remote and
journalctl. Generated journals are cached under ~/.cache/vllm-xpu-exporter/journal-bench. Exit status 1
when a target is missed.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import catchup_bench  # noqa: E402
import gate_decision_bench  # noqa: E402
import hostile_bench  # noqa: E402
import live_bench  # noqa: E402
import scrape_bench  # noqa: E402
from hosts import LARGE, LARGE_BUSY, SMALL  # noqa: E402

from fakeze import build_fake_driver  # noqa: E402

P99_TARGET_MS = 10.0
CPU_PER_SCRAPE_TARGET_MS = 3.0
CATCH_UP_RATIO_TARGET = 1.0
CATCH_UP_RSS_TARGET_MB = 60.0
RSS_FLAT_TOLERANCE_MB = 5.0
FOLLOW_P99_TARGET_MS = 1000.0
RSS_TARGET_MB = 60.0
IDLE_CPU_TARGET_PERCENT = 0.5
UNIT_SCALING_RATIO_TARGET = 3.5  # CPU of 3,000 units over 1,000: 3 when linear
HOSTILE_P99_TARGET_MS = 100.0
HEADER_ATTACK_RSS_TARGET_MB = 200.0


@dataclass(frozen=True)
class Settings:
    scrapes: int
    catch_up_runs: int
    sizes: tuple[int, ...]
    idle_seconds: float
    follow_samples: int
    hostile_scrapes: int
    units: tuple[int, ...] = (1_000, 3_000)


FULL = Settings(scrapes=1000, catch_up_runs=3, sizes=(250_000, 1_000_000), idle_seconds=60, follow_samples=100,
                hostile_scrapes=300)
QUICK = Settings(scrapes=200, catch_up_runs=1, sizes=(250_000, 1_000_000), idle_seconds=10, follow_samples=20,
                 hostile_scrapes=100)


@dataclass(frozen=True)
class Row:
    figure: str
    value: str
    target: str
    passed: bool | None  # None: no target, shown for context


def machine() -> list[str]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown")
    memory_kib = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                          if line.startswith("MemTotal:")))
    systemd = subprocess.run(["journalctl", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    commit = subprocess.run(["git", "-C", str(HERE.parent), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    return [f"nproc {os.cpu_count()}, CPU {cpu}, memory {memory_kib / 2**20:.1f} GiB, kernel {platform.release()}",
            f"Python {platform.python_version()}, {systemd}, exporter at {commit or 'unknown commit'}"]


def scrape_rows(result: scrape_bench.ScrapeResult, informational: bool = False) -> list[Row]:
    name = result.shape.name
    note = " (beyond the seed host)" if informational else ""
    return [
        Row(f"scrape p50, {name} host", f"{result.p50_ms:.2f} ms", "", None),
        Row(f"scrape p99, {name} host{note}", f"{result.p99_ms:.2f} ms", f"< {P99_TARGET_MS:g} ms",
            result.p99_ms < P99_TARGET_MS),
        Row(f"exporter CPU per scrape, {name} host{note}", f"{result.exporter_cpu_ms:.2f} ms",
            f"< {CPU_PER_SCRAPE_TARGET_MS:g} ms", result.exporter_cpu_ms < CPU_PER_SCRAPE_TARGET_MS),
        Row(f"  + Level Zero child CPU per scrape, {name} host", f"{result.levelzero_child_cpu_ms:.2f} ms", "", None),
    ]


def catch_up_rows(results: list[catchup_bench.CatchUpResult]) -> list[Row]:
    rows: list[Row] = []
    for result in results:
        size = f"{result.journal_entries // 1000}k"
        rows += [
            Row(f"catch-up time, {size} journal ({result.selected:,} selected)",
                f"{result.ours.wall_s:.2f} s", "", None),
            Row(f"journalctl time, {size} journal", f"{result.journalctl.wall_s:.2f} s", "", None),
            Row(f"catch-up / journalctl, {size}", f"{result.ratio:.2f}", f"<= {CATCH_UP_RATIO_TARGET:g}",
                result.ratio <= CATCH_UP_RATIO_TARGET),
            Row(f"catch-up entries/s, {size}", f"{result.entries_per_s:,.0f}", "", None),
            Row(f"catch-up peak RSS, {size}", f"{result.ours.peak_rss_mb:.1f} MB", f"< {CATCH_UP_RSS_TARGET_MB:g} MB",
                result.ours.peak_rss_mb < CATCH_UP_RSS_TARGET_MB),
        ]
    if len(results) > 1:
        peaks = [result.ours.peak_rss_mb for result in results]
        spread = max(peaks) - min(peaks)
        sizes = " vs ".join(f"{result.journal_entries // 1000}k" for result in results)
        rows.append(Row(f"catch-up peak RSS growth, {sizes}", f"{spread:.1f} MB",
                        f"< {RSS_FLAT_TOLERANCE_MB:g} MB (flat)", spread < RSS_FLAT_TOLERANCE_MB))
    return rows


def unit_scaling_rows(result: catchup_bench.UnitScalingResult) -> list[Row]:
    fewest, most = min(result.units), max(result.units)
    entries = catchup_bench.ENTRIES_PER_UNIT
    rows = [Row(f"catch-up CPU, {count:,} units × {entries} entries, {result.cap}", f"{result.cpu_s[count]:.2f} s",
                "", None) for count in result.units]
    rows.append(Row(f"catch-up CPU {most:,} / {fewest:,} units, {result.cap}", f"{result.cpu_ratio:.2f}",
                    f"<= {UNIT_SCALING_RATIO_TARGET:g} (linear: {most / fewest:g})",
                    result.cpu_ratio <= UNIT_SCALING_RATIO_TARGET))
    return rows


def gate_decision_rows(result: gate_decision_bench.GateDecisionResult) -> list[Row]:
    size = f"{result.journal_entries // 1000}k"
    return [
        Row(f"gate's first decision state, {size} boot, latest invocations ({result.latest.entries_read:,} entries)",
            f"{result.latest.in_process_s:.3f} s", f"< {gate_decision_bench.TARGET_S:g} s", result.passed),
        Row(f"gate's first decision state, {size} boot, whole boot ({result.whole.entries_read:,} entries)",
            f"{result.whole.in_process_s:.3f} s", "", None),
        Row(f"latest invocations / whole boot, {size}", f"{result.ratio:.3f}", "", None),
    ]


def live_rows(result: live_bench.LiveResult) -> list[Row]:
    size = f"{result.journal_entries // 1000}k"
    return [
        Row(f"exporter catch-up, {size} journal, spawn to caught up", f"{result.catch_up_s:.2f} s", "", None),
        Row(f"exporter RSS after catch-up ({size})", f"{result.rss_after_mb:.1f} MB", f"< {RSS_TARGET_MB:g} MB",
            result.rss_after_mb < RSS_TARGET_MB),
        Row("exporter peak RSS (VmHWM) during catch-up", f"{result.peak_rss_mb:.1f} MB", "", None),
        Row(f"idle CPU over {result.idle_seconds:.0f} s (exporter + Level Zero child)",
            f"{result.idle_cpu_percent:.3f} %", f"< {IDLE_CPU_TARGET_PERCENT:g} %",
            result.idle_cpu_percent < IDLE_CPU_TARGET_PERCENT),
        Row("follow latency p50", f"{result.follow_p50_ms:.0f} ms", "", None),
        Row("follow latency p99", f"{result.follow_p99_ms:.0f} ms", f"< {FOLLOW_P99_TARGET_MS:g} ms",
            result.follow_p99_ms < FOLLOW_P99_TARGET_MS),
    ]


def hostile_rows(attack: hostile_bench.AttackResult, headers: list[hostile_bench.HeaderResult]) -> list[Row]:
    under = f"{hostile_bench.IDLE_CONNECTIONS} idle + {hostile_bench.SLOWLORIS_CONNECTIONS} slowloris connections"
    rows = [
        Row(f"scrape p50 under {under}", f"{attack.p50_ms:.2f} ms", "", None),
        Row(f"scrape p99 under {under}", f"{attack.p99_ms:.2f} ms", f"< {HOSTILE_P99_TARGET_MS:g} ms",
            attack.p99_ms < HOSTILE_P99_TARGET_MS),
        Row("scrapes failed under that attack", f"{attack.failures} of {attack.scrapes}", "0", attack.failures == 0),
        Row(f"tasks refused under TasksMax={hostile_bench.TASKS_MAX} (peak {attack.tasks_peak})",
            str(attack.tasks_refused), "0", attack.tasks_refused == 0),
    ]
    for result in headers:
        rows.append(Row(f"exporter peak RSS, {hostile_bench.HEADER_CLIENTS} clients x 6 MB of headers {result.pace}",
                        f"{result.peak_rss_mb:.1f} MB", f"< {HEADER_ATTACK_RSS_TARGET_MB:g} MB",
                        result.peak_rss_mb < HEADER_ATTACK_RSS_TARGET_MB))
    return rows


def table(rows: list[Row]) -> str:
    width = max(len(row.figure) for row in rows)
    value_width = max(len(row.value) for row in rows)
    target_width = max(len(row.target) for row in rows + [Row("", "", "target", None)])
    lines = [f"{'figure':{width}}  {'value':>{value_width}}  {'target':{target_width}}  pass",
             f"{'-' * width}  {'-' * value_width}  {'-' * target_width}  ----"]
    for row in rows:
        verdict = "" if row.passed is None else ("yes" if row.passed else "NO")
        lines.append(f"{row.figure:{width}}  {row.value:>{value_width}}  {row.target:{target_width}}  {verdict}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a shorter run (10 s idle, fewer scrapes and samples)")
    parser.add_argument("--scrapes", type=int, help="scrapes per host")
    parser.add_argument("--runs", type=int, help="catch-up runs per journal size")
    parser.add_argument("--idle-seconds", type=float)
    parser.add_argument("--follow-samples", type=int)
    parser.add_argument("--hostile-scrapes", type=int, help="scrapes under the idle and slowloris connections")
    args = parser.parse_args()
    base = QUICK if args.quick else FULL
    settings = Settings(scrapes=args.scrapes or base.scrapes, catch_up_runs=args.runs or base.catch_up_runs,
                        sizes=base.sizes, idle_seconds=args.idle_seconds or base.idle_seconds,
                        follow_samples=args.follow_samples or base.follow_samples,
                        hostile_scrapes=args.hostile_scrapes or base.hostile_scrapes)

    def log(text: str) -> None:
        print(text, flush=True)

    started = time.monotonic()
    log(f"vllm-xpu-exporter benchmarks ({'quick' if args.quick else 'full'} run)")
    for line in machine():
        log(f"  {line}")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-fakeze-") as build:
        driver = build_fake_driver(Path(build))

        log("\n== 1. scrapes: real exporter process, fake Level Zero driver, fixture procfs, settings journal")
        for shape in (SMALL, LARGE, LARGE_BUSY):
            result = scrape_bench.bench_scrapes(shape, driver, settings.scrapes, log=log)
            scrape_bench.report(result, log=log)
            rows += scrape_rows(result, informational=shape is LARGE_BUSY)

        log("\n== 2. journal catch-up (reader + vLLM grammar + fold) vs journalctl, same journals, alternating")
        catch_ups = []
        for size in settings.sizes:
            result = catchup_bench.bench_catch_up(size, settings.catch_up_runs, log=log)
            catchup_bench.report(result, settings.catch_up_runs, log=log)
            catch_ups.append(result)
        rows += catch_up_rows(catch_ups)
        for max_units in (None, max(settings.units)):
            scaling = catchup_bench.bench_unit_scaling(settings.units, settings.catch_up_runs, max_units, log=log)
            catchup_bench.report_unit_scaling(scaling, settings.catch_up_runs, log=log)
            rows += unit_scaling_rows(scaling)

        log("\n== 2b. the init gate's first decision state: latest invocations vs the whole boot, alternating")
        decision = gate_decision_bench.bench_gate_decision(max(settings.sizes), max(3, settings.catch_up_runs),
                                                          log=log)
        gate_decision_bench.report(decision, log=log)
        rows += gate_decision_rows(decision)

        log("\n== 3. the exporter over the large host and the big journal: catch-up, RSS, idle CPU, following")
        live = live_bench.bench_live(max(settings.sizes), settings.idle_seconds, settings.follow_samples, driver,
                                     log=log)
        live_bench.report(live, log=log)
        rows += live_rows(live)

        log(f"\n== 4. hostile network clients, TasksMax={hostile_bench.TASKS_MAX} (pids cgroup), small host")
        attack = hostile_bench.bench_attack(driver, settings.hostile_scrapes, log=log)
        hostile_bench.report_attack(attack, log=log)
        header_results = []
        for pace in ("at once", "slowly"):
            header_results.append(hostile_bench.bench_headers(driver, pace, log=log))
            hostile_bench.report_headers(header_results[-1], log=log)
        rows += hostile_rows(attack, header_results)

    log(f"\n== summary ({time.monotonic() - started:.0f} s)\n")
    log(table(rows))
    missed = [row.figure for row in rows if row.passed is False]
    log(f"\n{len(missed)} target(s) missed" + (": " + "; ".join(missed) if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
