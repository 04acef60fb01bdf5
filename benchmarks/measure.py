"""Measuring processes from outside: CPU time and memory from /proc, wall time and peak RSS of a child
from wait4(2), percentiles, and a keep-alive HTTP scraper."""

from __future__ import annotations

import http.client
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads), from /proc/PID/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may contain spaces and parentheses: split after its closing one.
    fields = text[text.rindex(")") + 2:].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / CLOCK_TICKS


def children(pid: int) -> list[int]:
    """Direct children of a process (every thread's children)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def status_kib(pid: int, key: str) -> int:
    """A `key:  N kB` line of /proc/PID/status (VmRSS, VmHWM, ...), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def rss_mb(pid: int) -> float:
    return status_kib(pid, "VmRSS") / 1024


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (p99 of 1000 values is the 990th smallest)."""
    ordered = sorted(values)
    rank = max(1, -(-int(round(fraction * len(ordered) * 1000)) // 1000))
    return ordered[min(len(ordered), rank) - 1]


def median(values: Sequence[float]) -> float:
    return percentile(values, 0.5)


@dataclass(frozen=True)
class ChildRun:
    wall_s: float
    cpu_s: float
    max_rss_mb: float
    stdout: bytes


def run_child(argv: Sequence[str], *, discard_stdout: bool = False, env: dict[str, str] | None = None) -> ChildRun:
    """Run a process to its end: wall time from spawn to exit, its CPU time and peak RSS (ru_maxrss of
    exactly this child, from wait4)."""
    started = time.perf_counter()
    with open(os.devnull, "wb") as devnull:
        process = subprocess.Popen(list(argv), stdout=devnull if discard_stdout else subprocess.PIPE, env=env)
        output = process.stdout.read() if process.stdout is not None else b""
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited with {process.returncode}")
    return ChildRun(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, output)


class Scraper:
    """GETs over one kept-alive HTTP/1.1 connection, like Prometheus does."""

    def __init__(self, base_url: str, path: str = "/metrics") -> None:
        host_port = base_url.split("://", 1)[1]
        host, _, port = host_port.rpartition(":")
        self.connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=30)
        self.path = path

    def get(self) -> bytes:
        self.connection.request("GET", self.path, headers={"Accept": "text/plain"})
        response = self.connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"scrape answered {response.status}: {body[:200]!r}")
        return body

    def timed(self) -> tuple[float, bytes]:
        started = time.perf_counter()
        body = self.get()
        return time.perf_counter() - started, body

    def close(self) -> None:
        self.connection.close()


def sample_value(body: bytes, series: bytes) -> float | None:
    """The value of one series (``name{labels}`` exactly as the exporter prints it) in a text scrape."""
    start = body.find(b"\n" + series + b" ")
    if start < 0:
        return None
    end = body.find(b"\n", start + 1)
    return float(body[start + len(series) + 2:end])
