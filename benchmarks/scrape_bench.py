"""Full scrapes of the real exporter process: wall time per scrape (p50/p99) over one kept-alive HTTP
connection, and the CPU time the exporter process spends per scrape (utime+stime from /proc/PID/stat
before and after the scrapes; its Level Zero child, which does the driver calls, reported apart).

    python benchmarks/scrape_bench.py [--host small|large] [--scrapes 1000] [--baseline REV [--runs N]]

With `--baseline REV` the exporter of git revision REV of this repository (its `exporter/` package,
with this tree's interpreter and packages) scrapes the same host too, in turn with this tree's, N
times each, and the CPU per scrape of the two is given as a ratio: the one figure of a scrape that
holds still on a machine whose speed moves between runs (docs/development/benchmarks.md, "Re-measured later the
same day"). REV's scrapes are not checked for what REV does not serve.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hosts import (REPO, SHAPES, TELEMETRY_FAMILIES, HostShape, bench_host, in_memory_directory,  # noqa: E402
                   unit_name)
from measure import Scraper, children, cpu_seconds, median, percentile, sample_value  # noqa: E402

from fakeze import build_fake_driver  # noqa: E402

WARM_UP_SCRAPES = 20
COLLECTORS = ("levelzero", "processes", "journal")


@dataclass(frozen=True)
class ScrapeResult:
    shape: HostShape
    scrapes: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    exporter_cpu_ms: float  # per scrape
    levelzero_child_cpu_ms: float  # per scrape
    body_bytes: int
    samples: int
    collector_ms: dict[str, float]  # median of xpu_exporter_collector_duration_seconds per collector


def wait_ready(scraper: Scraper, timeout: float = 60) -> bytes:
    """A scrape in which every collector succeeded (Level Zero initialised, the journal read)."""
    deadline = time.monotonic() + timeout
    while True:
        body = scraper.get()
        if all(sample_value(body, f'xpu_exporter_collector_success{{collector="{name}"}}'.encode()) == 1
               for name in COLLECTORS):
            return body
        if time.monotonic() > deadline:
            raise RuntimeError("the exporter's collectors did not all succeed:\n" + body.decode(errors="replace"))
        time.sleep(0.05)


def check_body(shape: HostShape, body: bytes) -> None:
    """The scrape shows what the host holds: else the timing would be of a broken exporter."""
    for unit in range(shape.units):
        if f'unit="{unit_name(shape, unit)}"'.encode() not in body:
            raise RuntimeError(f"unit {unit_name(shape, unit)} missing from the scrape")
    memory_series = body.count(b"\nxpu_unit_memory_bytes{")
    headroom_series = body.count(b"\nxpu_unit_restart_headroom_bytes{")
    if memory_series != shape.units or headroom_series != shape.units:
        raise RuntimeError(f"{memory_series} unit memory and {headroom_series} headroom series, want {shape.units}")
    if body.count(b"\nxpu_memory_free_bytes{") != shape.devices:
        raise RuntimeError("not every device has its memory series")
    for family in TELEMETRY_FAMILIES:
        if len(set(re.findall(rb"\n" + family.encode() + rb'\{[^}]*device="([^"]+)"', body))) != shape.devices:
            raise RuntimeError(f"not every device has {family}")


def bench_scrapes(shape: HostShape, driver: Path, scrapes: int, log=print,
                  baseline: Path | None = None) -> ScrapeResult:
    """`scrapes` timed scrapes of this tree's exporter, or of the one whose package is under `baseline`
    (see `export_exporter`)."""
    # `env -C` runs the package (and its Level Zero child, started the same way) from there: the directory
    # on sys.path comes before the editable install of this tree.
    command = None if baseline is None else ["env", "-C", str(baseline), sys.executable, "-m",
                                             baseline_package(baseline)]
    check = check_body if baseline is None else lambda shape, body: None
    with tempfile.TemporaryDirectory(prefix=f"bench-{shape.name}-", dir=in_memory_directory()) as workdir:
        log(f"scrape, {shape.name} host ({shape.describe()}): building and starting the exporter"
            f"{'' if baseline is None else ' of the baseline'} ...")
        with bench_host(shape, Path(workdir), driver, exporter_command=command) as host:
            scraper = Scraper(host.exporter.base_url)
            try:
                body = wait_ready(scraper)
                check(shape, body)
                for _ in range(WARM_UP_SCRAPES):
                    scraper.get()
                child_pids = children(host.pid)
                cpu_before = cpu_seconds(host.pid)
                child_before = sum(cpu_seconds(pid) for pid in child_pids)
                walls = []
                bodies = []
                for _ in range(scrapes):
                    wall, body = scraper.timed()
                    walls.append(wall)
                    bodies.append(body)
                cpu_after = cpu_seconds(host.pid)
                child_after = sum(cpu_seconds(pid) for pid in child_pids)
                check(shape, body)
                if sorted(children(host.pid)) != sorted(child_pids):
                    raise RuntimeError("the Level Zero child was restarted during the scrapes")
            finally:
                scraper.close()
    return ScrapeResult(
        shape=shape, scrapes=scrapes,
        p50_ms=percentile(walls, 0.5) * 1e3, p99_ms=percentile(walls, 0.99) * 1e3, max_ms=max(walls) * 1e3,
        exporter_cpu_ms=(cpu_after - cpu_before) / scrapes * 1e3,
        levelzero_child_cpu_ms=(child_after - child_before) / scrapes * 1e3,
        body_bytes=len(body), samples=sum(1 for line in body.splitlines() if line and not line.startswith(b"#")),
        collector_ms={name: median([collector_seconds(body, name) for body in bodies]) * 1e3 for name in COLLECTORS})


def collector_seconds(body: bytes, name: str) -> float:
    value = sample_value(body, f'xpu_exporter_collector_duration_seconds{{collector="{name}"}}'.encode())
    if value is None:
        raise RuntimeError(f"no duration of collector {name} in the scrape")
    return value


def report(result: ScrapeResult, log=print) -> None:
    log(f"  {result.scrapes} scrapes: p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms, "
        f"max {result.max_ms:.2f} ms; CPU per scrape: exporter {result.exporter_cpu_ms:.2f} ms, "
        f"its Level Zero child {result.levelzero_child_cpu_ms:.2f} ms; "
        f"{result.samples} samples, {result.body_bytes:,} bytes")
    log("    wall time inside the exporter by collector (median): " +
        ", ".join(f"{name} {ms:.2f} ms" for name, ms in result.collector_ms.items()))


def export_exporter(revision: str, into: Path) -> None:
    """The `exporter/` folder of git revision `revision` of this repository, written under `into` by the
    import name that revision uses: `exporter` up to 0.2, `vllm_xpu_exporter` after (the folder is mapped)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", revision, "exporter"],
                             capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"scrape_bench: no exporter/ at revision {revision!r}: "
                         f"{archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    for link in (into / "exporter").rglob("*"):
        if link.is_symlink() and not link.exists():  # a file shipped from outside exporter/ (the runbook)
            target = (Path("/") / link.relative_to(into).parent / link.readlink()).resolve().relative_to("/")
            link.unlink()
            link.write_bytes(subprocess.run(["git", "-C", str(REPO), "show", f"{revision}:{target}"],
                                            capture_output=True, check=True).stdout)
    if "vllm_xpu_exporter" in (into / "exporter" / "__main__.py").read_text():
        (into / "exporter").rename(into / "vllm_xpu_exporter")


def baseline_package(baseline: Path) -> str:
    """The import name of the package `export_exporter` wrote under `baseline`."""
    return "vllm_xpu_exporter" if (baseline / "vllm_xpu_exporter").is_dir() else "exporter"


def compare(shape: HostShape, driver: Path, scrapes: int, revision: str, baseline: Path, runs: int,
            log=print) -> None:
    """This tree's exporter and the baseline's over one host, in turn, `runs` times each; the ratio of their
    median CPU per scrape."""
    ours, theirs = [], []
    for _ in range(runs):
        ours.append(bench_scrapes(shape, driver, scrapes, log=log))
        report(ours[-1], log=log)
        theirs.append(bench_scrapes(shape, driver, scrapes, log=log, baseline=baseline))
        report(theirs[-1], log=log)
    ours_ms = median([result.exporter_cpu_ms for result in ours])
    theirs_ms = median([result.exporter_cpu_ms for result in theirs])
    log(f"  exporter CPU per scrape, {shape.name} host: this tree {ours_ms:.2f} ms, {revision} {theirs_ms:.2f} ms "
        f"(medians of {runs}); ratio {ours_ms / theirs_ms:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", choices=tuple(SHAPES), action="append")
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--baseline", metavar="REV", help="also scrape the exporter of this git revision, in turn")
    parser.add_argument("--runs", type=int, default=2, help="with --baseline: runs of each exporter per host")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-fakeze-") as build:
        driver = build_fake_driver(Path(build))
        baseline = None
        if args.baseline is not None:
            baseline = Path(build) / "baseline"
            baseline.mkdir()
            export_exporter(args.baseline, baseline)
        for name in args.host or tuple(SHAPES):
            if baseline is None:
                report(bench_scrapes(SHAPES[name], driver, args.scrapes))
            else:
                compare(SHAPES[name], driver, args.scrapes, args.baseline, baseline, args.runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
