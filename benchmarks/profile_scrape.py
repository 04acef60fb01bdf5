"""Where a scrape's time goes: py-spy samples the real exporter process while it is scraped in a loop.

    pip install py-spy
    python benchmarks/profile_scrape.py [--host large] [--seconds 20] [--gil] [--out /tmp/scrape.txt]

Prints the functions with the most samples (own time and with callees); `--out` keeps py-spy's raw
collapsed stacks (flamegraph.pl / speedscope read them).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hosts import SHAPES, bench_host, in_memory_directory  # noqa: E402
from measure import Scraper  # noqa: E402
from scrape_bench import wait_ready  # noqa: E402

from fakeze import build_fake_driver  # noqa: E402


def summarise(collapsed: str, top: int = 25) -> str:
    """Own and cumulative sample counts per function from py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    lines = [f"{samples} samples of the thread serving scrapes and the others (idle threads are not sampled)",
             "", "own time:"]
    lines += [f"  {count / samples:6.1%}  {frame}" for frame, count in own.most_common(top)]
    lines += ["", "with callees:"]
    lines += [f"  {count / samples:6.1%}  {frame}" for frame, count in total.most_common(top)]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", choices=tuple(SHAPES), default="large")
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--gil", action="store_true",
                        help="sample only while a thread holds the GIL: Python's own time, not its waits")
    args = parser.parse_args()
    # pip puts py-spy beside the interpreter, which need not be on PATH (.venv/bin/python benchmarks/...).
    py_spy = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    if py_spy is None:
        sys.exit(f"profile_scrape: no py-spy beside {sys.executable} or on PATH: pip install py-spy")
    with tempfile.TemporaryDirectory(prefix="bench-profile-", dir=in_memory_directory()) as workdir:
        driver = build_fake_driver(Path(workdir))
        with bench_host(SHAPES[args.host], Path(workdir) / "host", driver) as host:
            scraper = Scraper(host.exporter.base_url)
            wait_ready(scraper)
            stop = threading.Event()

            def scrape_forever() -> None:
                while not stop.is_set():
                    scraper.get()

            thread = threading.Thread(target=scrape_forever, daemon=True)
            thread.start()
            out = args.out or Path(workdir) / "collapsed.txt"
            subprocess.run([py_spy, "record", "--pid", str(host.pid), "--duration", str(args.seconds),
                            "--rate", str(args.rate), "--format", "raw", "--nonblocking", "--output", str(out),
                            *(["--gil"] if args.gil else [])],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            stop.set()
            thread.join()
            scraper.close()
            print(summarise(out.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
