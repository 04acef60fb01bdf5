"""Catch-up speed and memory of the journal source against journalctl, on a big generated journal.

    python benchmarks/journal_catchup.py [--sizes 250000 1000000] [--runs 3]

For each size it generates (once; cached under $XDG_CACHE_HOME/xpu-exporter or ~/.cache) a real
journal of that many entries, 10 % of them about watched units (vllm-chat/vllm-embed.service: their
output and PID 1's records), 90 % from other units and the kernel, written by
systemd-journal-remote. Then it alternates, ``--runs`` times each, in fresh processes:

- ours: JournalReader over the directory, glob ``vllm*.service``, boot ``all``, reading every
  selected entry's fields into JournalEntry objects (the full catch-up of the exporter);
- journalctl: ``journalctl -D DIR -u 'vllm*' -o json > /dev/null`` (the same entries; -u also
  matches PID 1's UNIT= records).

Times are wall-clock from process start to exit (ours includes starting Python), best of the
runs because the machine is shared; CPU is user+sys of the process. Peak RSS is each process's
ru_maxrss, taken with wait4(2), i.e. the RUSAGE_CHILDREN accounting of that one child.
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

WATCHED_FRACTION = 0.1
GENERATOR_VERSION = 1
UNIT_GLOB = "vllm*.service"


@dataclass(frozen=True)
class Run:
    wall_s: float
    cpu_s: float
    max_rss_mb: float
    entries: int | None


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "xpu-exporter" / "journal-bench"


def ensure_journal(n_entries: int, root: Path) -> Path:
    """The directory of a cached ``n_entries`` journal, generated if missing."""
    from journalgen import write_big_journal

    directory = root / f"v{GENERATOR_VERSION}-{n_entries}-{int(WATCHED_FRACTION * 100)}pct"
    marker = directory / "complete"
    if marker.exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.journal*"):
        old.unlink()
    print(f"generating a {n_entries:,}-entry journal in {directory} ...", flush=True)
    started = time.perf_counter()
    write_big_journal(directory / "bench.journal", n_entries, WATCHED_FRACTION)
    size = sum(p.stat().st_size for p in directory.glob("*.journal*"))
    print(f"  done in {time.perf_counter() - started:.1f} s, {size / 2**20:.0f} MiB", flush=True)
    marker.write_text(str(n_entries))
    return directory


def run_measured(argv: list[str], *, stdout: int | None = None) -> tuple[Run, bytes]:
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=stdout if stdout is not None else subprocess.PIPE)
    output = process.stdout.read() if process.stdout is not None else b""
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited with {process.returncode}")
    # ru_maxrss is in KiB on Linux.
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, None), output


def run_ours(directory: Path) -> Run:
    run, output = run_measured([sys.executable, __file__, "--child-read", str(directory)])
    report = json.loads(output)
    # The child's own high-water mark (VmHWM) only counts memory after exec; take the larger.
    return Run(run.wall_s, run.cpu_s, max(run.max_rss_mb, report["vm_hwm_mb"]), report["entries"])


def run_journalctl(directory: Path) -> Run:
    with open(os.devnull, "wb") as devnull:
        run, _ = run_measured(
            ["journalctl", "--no-pager", "-D", str(directory), "-u", "vllm*", "-o", "json"], stdout=devnull.fileno()
        )
    return run


def count_journalctl(directory: Path) -> int:
    """Entries journalctl selects, counted while streaming (the parent stays small: a forked
    child's ru_maxrss starts from the parent's RSS before exec)."""
    process = subprocess.Popen(
        ["journalctl", "--no-pager", "-D", str(directory), "-u", "vllm*", "-o", "json"], stdout=subprocess.PIPE
    )
    assert process.stdout is not None
    lines = 0
    while chunk := process.stdout.read(1 << 20):
        lines += chunk.count(b"\n")
    if process.wait() != 0:
        raise RuntimeError(f"journalctl exited with {process.returncode}")
    return lines


def child_read(directory: str) -> None:
    """Runs in the measured child: a full catch-up, every selected entry decoded."""
    from exporter.sources.journal import JournalReader, JournalSelection

    started = time.perf_counter()
    entries = 0
    message_bytes = 0
    with JournalReader(JournalSelection(directory=directory, unit_globs=[UNIT_GLOB], boot="all")) as reader:
        while batch := reader.read_available(4096):
            entries += len(batch)
            message_bytes += sum(len(entry.message) for entry in batch)
    seconds = time.perf_counter() - started
    status = Path("/proc/self/status").read_text()
    vm_hwm_kib = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))
    print(json.dumps({"entries": entries, "seconds": seconds, "message_bytes": message_bytes,
                      "vm_hwm_mb": vm_hwm_kib / 1024}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[250_000, 1_000_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cache-dir", type=Path, default=cache_root())
    parser.add_argument("--child-read", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_read:
        child_read(args.child_read)
        return 0

    results: dict[int, tuple[Run, Run, float]] = {}
    for size in args.sizes:
        directory = ensure_journal(size, args.cache_dir)
        expected = count_journalctl(directory)
        ours: list[Run] = []
        theirs: list[Run] = []
        for _ in range(args.runs):
            ours.append(run_ours(directory))
            theirs.append(run_journalctl(directory))
        if any(run.entries != expected for run in ours):
            print(f"MISMATCH: journalctl selects {expected} entries, JournalReader {[r.entries for r in ours]}")
            return 1
        best_ours = min(ours, key=lambda r: r.wall_s)
        best_theirs = min(theirs, key=lambda r: r.wall_s)
        peak_ours = max(r.max_rss_mb for r in ours)
        results[size] = (best_ours, best_theirs, peak_ours)
        print(f"\n{size:,} entries, {expected:,} selected (vllm*.service, boot all), best of {args.runs}:")
        print(f"  JournalReader : {best_ours.wall_s:6.2f} s wall  {min(r.cpu_s for r in ours):6.2f} s CPU  "
              f"{expected / best_ours.wall_s:9,.0f} entries/s  peak RSS {max(r.max_rss_mb for r in ours):5.1f} MB")
        print(f"  journalctl    : {best_theirs.wall_s:6.2f} s wall  {min(r.cpu_s for r in theirs):6.2f} s CPU  "
              f"{expected / best_theirs.wall_s:9,.0f} entries/s  peak RSS {max(r.max_rss_mb for r in theirs):5.1f} MB")
        print(f"  ratio ours/journalctl: wall {best_ours.wall_s / best_theirs.wall_s:.2f}  "
              f"CPU {min(r.cpu_s for r in ours) / min(r.cpu_s for r in theirs):.2f}  (target <= 1.0)")
        print(f"  all runs, wall s: ours {[round(r.wall_s, 2) for r in ours]}  "
              f"journalctl {[round(r.wall_s, 2) for r in theirs]}")

    print("\nsummary:")
    for size, (ours_run, theirs_run, peak) in results.items():
        ratio = ours_run.wall_s / theirs_run.wall_s
        print(f"  {size:>9,} entries: ratio {ratio:.2f} ({'met' if ratio <= 1.0 else 'MISSED'})  "
              f"peak RSS {peak:.1f} MB ({'met' if peak < 60 else 'MISSED'}, target < 60)")
    if len(results) > 1:
        rss = [peak for _, _, peak in results.values()]
        print(f"  RSS spread across sizes: {max(rss) - min(rss):.1f} MB (flat if a few MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
