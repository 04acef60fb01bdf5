"""The exporter under hostile network clients, inside the shipped unit's TasksMax=64 (a pids cgroup with
pids.max 64, as systemd makes it; tests/taskslimit.py), over the small host (hosts.py, every collector on).

    python benchmarks/hostile_bench.py [--scrapes 300]

1. Scrapes under 500 idle TCP connections and 300 slowloris ones (a request line, then one header line
   a second, never the blank line that ends the head). The attackers run in a process of their own and
   reconnect at once whenever the exporter closes one of their connections, so the pressure never lets
   up. A scraper like Prometheus's (one kept-alive connection; a GET sent on a connection the server
   has closed meanwhile is retried once on a new one, as Go's HTTP client does) scrapes every 50 ms:
   wall time per scrape (p50/p99/max) and how many failed.
2. Peak RSS: 40 clients at once each send a request with 6 MB of headers (95 lines of 65,000 bytes),
   all of it at once or 64 KiB every 20 ms; the exporter's VmHWM afterwards, a fresh exporter each time.

Needs root (the cgroup, the fixture procfs's device nodes) and gcc (the fake Level Zero driver).
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing
import os
import resource
import selectors
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hosts import SMALL, BenchHost, bench_host, in_memory_directory  # noqa: E402
from measure import Scraper, percentile, status_kib  # noqa: E402
from scrape_bench import wait_ready  # noqa: E402

from fakeze import build_fake_driver  # noqa: E402
from httpclient import send_huge_headers  # noqa: E402
from taskslimit import TaskLimit  # noqa: E402

TASKS_MAX = 64
IDLE_CONNECTIONS = 500
SLOWLORIS_CONNECTIONS = 300
SCRAPE_INTERVAL_S = 0.05
SLOWLORIS_INTERVAL_S = 1.0
HEADER_CLIENTS = 40


@dataclass(frozen=True)
class AttackResult:
    scrapes: int
    failures: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    retried: int  # scrapes sent again on a new connection after the server had closed the kept-alive one
    attacker_connects: int
    threads: int  # the exporter's threads at the end
    tasks_peak: int | None  # pids.peak of the cgroup: the exporter and its Level Zero child, all threads
    tasks_refused: int  # forks and thread starts refused for the limit (pids.events max)


@dataclass(frozen=True)
class HeaderResult:
    pace: str
    peak_rss_mb: float
    rss_before_mb: float


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))


def attack(host: str, port: int, idle: int, slow: int, stop: multiprocessing.synchronize.Event,
           connects: multiprocessing.sharedctypes.Synchronized) -> None:
    """Holds `idle` silent and `slow` slowloris connections open until `stop`, reconnecting at once."""
    raise_fd_limit()
    selector = selectors.DefaultSelector()

    def open_one(slowloris: bool) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.connect_ex((host, port))
        selector.register(sock, selectors.EVENT_READ, [slowloris, False])  # [slowloris, request line sent]
        with connects.get_lock():
            connects.value += 1

    def reopen(key: selectors.SelectorKey) -> None:
        selector.unregister(key.fileobj)
        key.fileobj.close()
        open_one(key.data[0])

    for number in range(idle + slow):
        open_one(number >= idle)
    next_trickle = time.monotonic()
    while not stop.is_set():
        for key, _mask in selector.select(0.1):
            try:
                data = key.fileobj.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                reopen(key)
        if time.monotonic() >= next_trickle:
            next_trickle += SLOWLORIS_INTERVAL_S
            for key in list(selector.get_map().values()):
                slowloris, started = key.data
                if not slowloris:
                    continue
                line = b"X-Still-There: yes\r\n" if started else b"GET /metrics HTTP/1.1\r\nHost: exporter\r\n"
                try:
                    key.fileobj.send(line)
                    key.data[1] = True
                except BlockingIOError:
                    pass
                except OSError:
                    if key.data[1]:
                        reopen(key)
    for key in list(selector.get_map().values()):
        key.fileobj.close()


class RetryingScraper:
    """One kept-alive connection; a request on a connection the server closed while it was idle is sent
    again on a new one (once), as Go's net/http client does for GET."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.connection = http.client.HTTPConnection(host, port, timeout=10)
        self.retried = 0

    def get(self) -> None:
        for attempt in range(2):
            try:
                self.connection.request("GET", "/metrics", headers={"Accept": "text/plain"})
                response = self.connection.getresponse()
                body = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.connection.close()
                if attempt:
                    raise
                self.retried += 1
                continue
            if response.status != 200:
                raise RuntimeError(f"scrape answered {response.status}: {body[:200]!r}")
            return

    def close(self) -> None:
        self.connection.close()


def address_of(host: BenchHost) -> tuple[str, int]:
    """(address, port) of the exporter, once every collector has succeeded."""
    ready = Scraper(host.exporter.base_url)
    wait_ready(ready)
    ready.close()
    address, _, port = host.exporter.base_url.split("://", 1)[1].rpartition(":")
    return address, int(port)


def thread_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@contextmanager
def limited_small_host(driver: Path) -> Iterator[tuple[BenchHost, TaskLimit]]:
    with TaskLimit("vllm-xpu-exporter-bench", TASKS_MAX) as limit, \
            tempfile.TemporaryDirectory(prefix="bench-hostile-", dir=in_memory_directory()) as workdir, \
            bench_host(SMALL, Path(workdir), driver,
                       exporter_command=limit.wrap([sys.executable, "-m", "vllm_xpu_exporter"])) as host:
        yield host, limit


def bench_attack(driver: Path, scrapes: int, log=print) -> AttackResult:
    raise_fd_limit()
    log(f"scrapes under {IDLE_CONNECTIONS} idle and {SLOWLORIS_CONNECTIONS} slowloris connections, "
        f"TasksMax={TASKS_MAX}, small host ...")
    with limited_small_host(driver) as (host, limit):
        address, port = address_of(host)
        stop = multiprocessing.Event()
        connects = multiprocessing.Value("q", 0)
        attacker = multiprocessing.Process(target=attack, args=(address, port, IDLE_CONNECTIONS,
                                                                 SLOWLORIS_CONNECTIONS, stop, connects))
        attacker.start()
        scraper = RetryingScraper(address, port)
        walls: list[float] = []
        failures = 0
        try:
            time.sleep(2)  # the attackers' connections are all open
            for _ in range(scrapes):
                if not attacker.is_alive():
                    raise RuntimeError("the attacking process died")
                started = time.perf_counter()
                try:
                    scraper.get()
                except (OSError, http.client.HTTPException, RuntimeError) as error:
                    failures += 1
                    log(f"  scrape failed: {type(error).__name__}: {error}")
                    scraper.close()
                    scraper = RetryingScraper(address, port)
                walls.append(time.perf_counter() - started)
                time.sleep(SCRAPE_INTERVAL_S)
            threads, peak, refused = thread_count(host.pid), limit.peak(), limit.events_max()
        finally:
            stop.set()
            attacker.join(10)
            scraper.close()
        if host.exporter.process.poll() is not None:
            raise RuntimeError("the exporter exited under the attack:\n" + host.exporter.stderr[-2000:])
    return AttackResult(scrapes=scrapes, failures=failures, p50_ms=percentile(walls, 0.5) * 1e3,
                        p99_ms=percentile(walls, 0.99) * 1e3, max_ms=max(walls) * 1e3, retried=scraper.retried,
                        attacker_connects=connects.value, threads=threads, tasks_peak=peak, tasks_refused=refused)


def bench_headers(driver: Path, pace: str, log=print) -> HeaderResult:
    log(f"peak RSS, {HEADER_CLIENTS} clients sending 6 MB of headers {pace}, TasksMax={TASKS_MAX}, small host ...")
    with limited_small_host(driver) as (host, _limit):
        address, port = address_of(host)
        rss_before = status_kib(host.pid, "VmRSS") / 1024
        send_huge_headers(address, port, HEADER_CLIENTS, slowly=pace != "at once")
        peak = status_kib(host.pid, "VmHWM") / 1024
        check = Scraper(host.exporter.base_url)
        check.get()
        check.close()
    return HeaderResult(pace=pace, peak_rss_mb=peak, rss_before_mb=rss_before)


def report_attack(result: AttackResult, log=print) -> None:
    log(f"  {result.scrapes} scrapes, {result.failures} failed: p50 {result.p50_ms:.2f} ms, "
        f"p99 {result.p99_ms:.2f} ms, max {result.max_ms:.2f} ms; {result.retried} resent on a new connection "
        f"after the kept-alive one was closed; the attackers connected {result.attacker_connects:,} times; "
        f"exporter threads {result.threads}, cgroup tasks peak {result.tasks_peak} of {TASKS_MAX}, "
        f"{result.tasks_refused} refused")


def report_headers(result: HeaderResult, log=print) -> None:
    log(f"  peak RSS (VmHWM) {result.peak_rss_mb:.1f} MB (RSS before the attack {result.rss_before_mb:.1f} MB)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-fakeze-") as build:
        driver = build_fake_driver(Path(build))
        report_attack(bench_attack(driver, args.scrapes))
        for pace in ("at once", "slowly"):
            report_headers(bench_headers(driver, pace))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
