"""The exporter as it runs on a host, over the big journal: its catch-up, its memory after it, its CPU
while idle, and how soon a new journal entry shows in /metrics.

    python benchmarks/live_bench.py [--size 1000000] [--idle-seconds 60] [--follow-samples 100]

The exporter runs over the large host (8 devices, 16 units, hosts.py), reading the cached big journal
(bigjournal.py) plus a live journal file that this benchmark appends to with systemd-journal-remote,
as journald appends to system.journal. In order:

1. catch-up: from spawning the exporter to its log line saying the journal is read (confirmed by a
   scrape showing the journal collector's success);
2. RSS after catch-up: VmRSS of the exporter process (and of its Level Zero child) once caught up,
   and the exporter's VmHWM (its peak, during catch-up);
3. idle CPU: utime+stime of the exporter and its child over `--idle-seconds` without any scrape, as
   a share of one core;
4. follow latency: a unit's failed engine start (PID 1's "Starting" record and vLLM's KV-cache root
   cause) is appended; the time from spawning the writer to the failure counter in /metrics showing
   it, polled back to back over a kept-alive connection. The writer's own run time (spawn, write,
   close) is part of it and reported apart.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bigjournal import ensure_journal, journal_files  # noqa: E402
from hosts import LARGE, bench_host, in_memory_directory, unit_name  # noqa: E402
from measure import Scraper, children, cpu_seconds, median, percentile, rss_mb, sample_value, status_kib  # noqa: E402

from fakeze import build_fake_driver  # noqa: E402
from journalgen import Clock, append_journal, random_boot_id, unit_output, unit_starting, write_journal  # noqa: E402

CAUGHT_UP_LOG = re.compile(r"journal read up to now")
CAUSE = ("(EngineCore pid=77) ERROR 12-02 10:00:30 [core.py:708] ValueError: To serve at least one request with "
         "the model's max seq len (32768), (3.36 GiB KV cache is needed, which is larger than the available KV cache "
         "memory (2.13 GiB). Based on the available memory, the estimated maximum model length is 46528. Try "
         "increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
SETTLE_S = 2.0


@dataclass(frozen=True)
class LiveResult:
    journal_entries: int
    catch_up_s: float
    rss_after_mb: float
    rss_after_anon_mb: float  # of which anonymous memory (the rest: mapped files, libraries and journal pages)
    peak_rss_mb: float
    child_rss_mb: float
    idle_seconds: float
    idle_cpu_percent: float  # exporter + its Level Zero child, of one core
    idle_cpu_exporter_percent: float
    follow_p50_ms: float
    follow_p99_ms: float
    follow_max_ms: float
    writer_p50_ms: float
    follow_samples: int


def failures_series(unit: str) -> bytes:
    return f'xpu_unit_engine_init_failures_total{{reason="kv_cache_too_small",unit="{unit}"}}'.encode()


def wait_caught_up(host, scraper: Scraper, started: float, timeout: float = 300) -> float:
    """Seconds from spawn to the journal read; by the exporter's log line, else by polling scrapes."""
    deadline = started + timeout
    while time.perf_counter() < deadline:
        if CAUGHT_UP_LOG.search(host.exporter.stderr):
            caught_up = time.perf_counter() - started
            break
        if host.exporter.process.poll() is not None:
            raise RuntimeError(f"the exporter exited:\n{host.exporter.stderr}")
        time.sleep(0.01)
    else:
        raise RuntimeError("the exporter did not catch up with the journal")
    body = scraper.get()
    if sample_value(body, b'xpu_exporter_collector_success{collector="journal"}') != 1:
        raise RuntimeError("the exporter logged it caught up, but its journal collector does not succeed")
    return caught_up


def bench_live(size: int, idle_seconds: float, follow_samples: int, driver: Path, log=print) -> LiveResult:
    big = journal_files(ensure_journal(size, log=log))
    with tempfile.TemporaryDirectory(prefix="bench-live-", dir=in_memory_directory()) as workdir:
        # One boot and clock for the whole live file, stamped now, as journald would: entries that sort
        # before the reader's position (older, or of another boot) would not be followed.
        clock = Clock(random_boot_id(), realtime_usec=time.time_ns() // 1000,
                      monotonic_usec=time.monotonic_ns() // 1000)
        live = write_journal(Path(workdir) / "live.journal",
                             [unit_output("cron.service", "live journal opened", clock.tick())])
        log(f"live: large host ({LARGE.describe()}), {size:,}-entry journal: starting the exporter ...")
        started = time.perf_counter()
        with bench_host(LARGE, Path(workdir) / "host", driver, extra_journal_files=[*big, live]) as host:
            scraper = Scraper(host.exporter.base_url)
            try:
                catch_up = wait_caught_up(host, scraper, started)
                log(f"  caught up in {catch_up:.2f} s; settling, then {idle_seconds:g} s idle ...")
                time.sleep(SETTLE_S)
                child_pids = children(host.pid)
                rss_after = rss_mb(host.pid)
                rss_after_anon = status_kib(host.pid, "RssAnon") / 1024
                peak = status_kib(host.pid, "VmHWM") / 1024
                child_rss = sum(rss_mb(pid) for pid in child_pids)
                scraper.close()  # idle means no connection either
                cpu_before, child_before = cpu_seconds(host.pid), sum(cpu_seconds(p) for p in child_pids)
                idle_started = time.perf_counter()
                time.sleep(idle_seconds)
                idle_wall = time.perf_counter() - idle_started
                cpu_idle = cpu_seconds(host.pid) - cpu_before
                child_idle = sum(cpu_seconds(p) for p in child_pids) - child_before
                log(f"  following: {follow_samples} failed starts appended ...")
                scraper = Scraper(host.exporter.base_url)
                try:
                    latencies, writers = follow_latency(Path(live), scraper, follow_samples, clock)
                except RuntimeError as error:
                    raise RuntimeError(f"{error}\nthe exporter's log:\n{host.exporter.stderr[-4000:]}") from None
            finally:
                scraper.close()
    return LiveResult(
        journal_entries=size, catch_up_s=catch_up, rss_after_mb=rss_after, rss_after_anon_mb=rss_after_anon,
        peak_rss_mb=peak,
        child_rss_mb=child_rss, idle_seconds=idle_wall,
        idle_cpu_percent=(cpu_idle + child_idle) / idle_wall * 100, idle_cpu_exporter_percent=cpu_idle / idle_wall * 100,
        follow_p50_ms=percentile(latencies, 0.5) * 1e3, follow_p99_ms=percentile(latencies, 0.99) * 1e3,
        follow_max_ms=max(latencies) * 1e3, writer_p50_ms=median(writers) * 1e3, follow_samples=follow_samples)


def follow_latency(live: Path, scraper: Scraper, samples: int, clock: Clock,
                   timeout: float = 10) -> tuple[list[float], list[float]]:
    rng = random.Random(7)
    latencies: list[float] = []
    writers: list[float] = []
    for index in range(samples):
        unit = unit_name(LARGE, index % LARGE.units)
        series = failures_series(unit)
        before = sample_value(scraper.get(), series)
        if before is None:
            raise RuntimeError(f"{series.decode()} is not in /metrics")
        time.sleep(rng.uniform(0.05, 0.25))  # not in step with the follower's 0.5 s wait
        written = time.perf_counter()
        clock.realtime_usec, clock.monotonic_usec = time.time_ns() // 1000, time.monotonic_ns() // 1000
        append_journal(live, [unit_starting(unit, clock.tick()), unit_output(unit, CAUSE, clock.tick(), pid=77)])
        writers.append(time.perf_counter() - written)
        while (value := sample_value(scraper.get(), series)) == before:
            if time.perf_counter() - written > timeout:
                raise RuntimeError(f"the failure of {unit} did not show in /metrics within {timeout:g} s")
        if value != before + 1:
            raise RuntimeError(f"{series.decode()} went from {before} to {value}, want +1")
        latencies.append(time.perf_counter() - written)
    return latencies, writers


def report(result: LiveResult, log=print) -> None:
    log(f"  catch-up of the {result.journal_entries:,}-entry journal by the exporter (spawn to caught up): "
        f"{result.catch_up_s:.2f} s")
    log(f"  RSS after catch-up: exporter {result.rss_after_mb:.1f} MB ({result.rss_after_anon_mb:.1f} MB anonymous; "
        f"peak VmHWM {result.peak_rss_mb:.1f} MB), its Level Zero child {result.child_rss_mb:.1f} MB")
    log(f"  idle CPU over {result.idle_seconds:.0f} s: {result.idle_cpu_percent:.3f} % of a core "
        f"(exporter {result.idle_cpu_exporter_percent:.3f} %, the rest its Level Zero child)")
    log(f"  follow latency, {result.follow_samples} entries: p50 {result.follow_p50_ms:.0f} ms, "
        f"p99 {result.follow_p99_ms:.0f} ms, max {result.follow_max_ms:.0f} ms "
        f"(of which the writer, systemd-journal-remote, p50 {result.writer_p50_ms:.0f} ms)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--follow-samples", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-fakeze-") as build:
        driver = build_fake_driver(Path(build))
        report(bench_live(args.size, args.idle_seconds, args.follow_samples, driver))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
