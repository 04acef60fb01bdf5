"""How fast the gate service releases a start that nothing holds back, on a journal whose watched units
have run long in their current invocations, with forged `UNIT=` names in it; against the same service on
a small journal, in the same run.

    python benchmarks/gate_latency_bench.py [--entries 1000000] [--requests 300]

The journal (written by systemd-journal-remote, cached beside bigjournal.py's): four watched units
(`vllm-bench-N.service`), each started once ("Starting", "Started", a vLLM 0.24 start-up through init
complete, one invocation id each) and serving since, printing throughput lines in that same invocation
until the journal holds `--entries` entries; plus 65 entries a local user wrote with `UNIT=vllm-forged-N.service`
(any process may set `UNIT=`; they are not PID 1's). The baseline journal is the same with 1,000
entries.

For each journal: `vllm-xpu-gate serve --listen` (its console script, as packaged, over the fake Level
Zero driver of tests/fakeze with one 16 GiB GPU, 13 GiB free) is started and waited for until it has
read the journal; then `--requests` requests are made one after another by this process (its pid put in
the watched unit `vllm-bench-new.service` in a fake procfs): connect, send the client's request (R 0.07),
read until the answer. Timed: connect to answer (what a client waits once it runs), p50 and p99; and
the service's catch-up (its start to its first answer). Every answer must be a release that waited for
nothing, or the run fails. Then a few client processes (`vllm-xpu-gate wait`, Python's start included)
for the whole ExecStartPre= cost.

Target: p99 under 100 ms with 1,000,000 entries.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from bigjournal import cache_root  # noqa: E402
from fakeze import A770, FakeConfig, FakeMemoryModule, build_fake_driver, fake_driver_env, write_config  # noqa: E402
from journalgen import (HOSTNAME, JOURNAL_REMOTE, MACHINE_ID, export_field, new_invocation_id,  # noqa: E402
                        random_boot_id)
from vllm_xpu_exporter.gate import protocol  # noqa: E402
from vllm_xpu_exporter.systemd import MESSAGE_ID_UNIT_STARTED, MESSAGE_ID_UNIT_STARTING  # noqa: E402
from vllm_xpu_exporter.parsers import gate as gate_lines  # noqa: E402

TARGET_P99_S = 0.100
BASELINE_ENTRIES = 1_000
FORGED_UNITS = 65
UNITS = [f"vllm-bench-{index}.service" for index in range(4)]
ASKING_UNIT = "vllm-bench-new.service"
GENERATOR_VERSION = 1
GIB = 1 << 30
START_LINES = (
    "(APIServer pid={pid}) INFO 12-02 10:00:00 [api_server.py:1873] vLLM API server version 0.24.0",
    "(APIServer pid={pid}) INFO 12-02 10:00:00 [utils.py:233] non-default args: {{'model': 'm', "
    "'gpu_memory_utilization': 0.07}}",
    "(EngineCore pid={core}) INFO 12-02 10:00:20 [gpu_worker.py:456] Available KV cache memory: 0.9 GiB",
    "(EngineCore pid={core}) INFO 12-02 10:00:40 [core.py:210] init engine (profile, create kv cache, warmup "
    "model) took 20.50 seconds",
    "(APIServer pid={pid}) INFO:     Application startup complete.",
)
SERVING = ("(APIServer pid={pid}) INFO 12-02 10:{m:02d}:{s:02d} [loggers.py:123] Engine 000: Avg prompt throughput: "
           "{a}.0 tokens/s, Avg generation throughput: {b}.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV "
           "cache usage: 1.{c}%, Prefix cache hit rate: 0.0%")


def _entry(realtime: int, monotonic: int, fields: list[tuple[str, object]]) -> bytes:
    return b"".join([b"__REALTIME_TIMESTAMP=%d\n__MONOTONIC_TIMESTAMP=%d\n" % (realtime, monotonic),
                     *(export_field(name, value) for name, value in fields), b"\n"])


def journal_stream(entries: int, boot: str) -> Iterator[bytes]:
    rng = random.Random(entries)
    invocations = {unit: new_invocation_id(rng) for unit in UNITS}
    common = [("_BOOT_ID", boot), ("_MACHINE_ID", MACHINE_ID), ("_HOSTNAME", HOSTNAME), ("PRIORITY", 6)]
    realtime, monotonic = time.time_ns() // 1000 - entries * 1000 - 10_000_000, 5_000_000

    def pid1(unit: str, message: str, message_id: str) -> list[tuple[str, object]]:
        return [*common, ("_PID", 1), ("_UID", 0), ("_COMM", "systemd"), ("_TRANSPORT", "journal"),
                ("SYSLOG_IDENTIFIER", "systemd"), ("MESSAGE_ID", message_id), ("UNIT", unit),
                ("INVOCATION_ID", invocations[unit]), ("MESSAGE", message)]

    def output(unit: str, index: int, message: str) -> list[tuple[str, object]]:
        return [*common, ("_PID", 10_000 + 10 * index), ("_UID", 0), ("_COMM", "python3"), ("_TRANSPORT", "stdout"),
                ("SYSLOG_IDENTIFIER", "python3"), ("_SYSTEMD_UNIT", unit), ("_SYSTEMD_INVOCATION_ID", invocations[unit]),
                ("_SYSTEMD_CGROUP", f"/system.slice/{unit}"), ("MESSAGE", message)]

    written = 0
    for index, unit in enumerate(UNITS):
        realtime += 1000
        monotonic += 1000
        yield _entry(realtime, monotonic, pid1(unit, f"Starting {unit}...", MESSAGE_ID_UNIT_STARTING))
        realtime += 1000
        monotonic += 1000
        yield _entry(realtime, monotonic, pid1(unit, f"Started {unit}.", MESSAGE_ID_UNIT_STARTED))
        for line in START_LINES:
            realtime += 1000
            monotonic += 1000
            yield _entry(realtime, monotonic, output(unit, index, line.format(pid=10_000 + 10 * index,
                                                                               core=10_001 + 10 * index)))
        written += 2 + len(START_LINES)
    for forged in range(FORGED_UNITS):  # a local user's entries naming units: not PID 1's, not these units'
        realtime += 1000
        monotonic += 1000
        yield _entry(realtime, monotonic, [*common, ("_PID", 31337), ("_UID", 1000), ("_COMM", "logger"),
                                           ("_TRANSPORT", "journal"), ("UNIT", f"vllm-forged-{forged}.service"),
                                           ("MESSAGE", f"Started vllm-forged-{forged}.service.")])
    written += FORGED_UNITS
    while written < entries:
        index = written % len(UNITS)
        realtime += rng.randrange(1, 2000)
        monotonic += 1000
        yield _entry(realtime, monotonic, output(UNITS[index], index, SERVING.format(
            pid=10_000 + 10 * index, m=rng.randrange(60), s=rng.randrange(60), a=rng.randrange(999),
            b=rng.randrange(999), c=rng.randrange(9))))
        written += 1


def ensure_journal(entries: int, log=print) -> tuple[Path, str]:
    """The cached journal directory of `entries` entries and its boot id."""
    boot = random_boot_id(random.Random(entries))
    directory = cache_root() / f"gate-latency-v{GENERATOR_VERSION}-{entries}"
    if (directory / "complete").exists():
        return directory, boot
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.journal*"):
        old.unlink()
    log(f"generating a {entries:,}-entry journal in {directory} (once; cached) ...")
    process = subprocess.Popen([JOURNAL_REMOTE, f"--output={directory / 'bench.journal'}", "--split-mode=none",
                                "--compress=yes", "-"], stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    batch: list[bytes] = []
    for chunk in journal_stream(entries, boot):
        batch.append(chunk)
        if len(batch) >= 4096:
            process.stdin.write(b"".join(batch))
            batch.clear()
    process.stdin.write(b"".join(batch))
    process.stdin.close()
    if process.wait() != 0:
        raise RuntimeError(f"systemd-journal-remote failed: {process.stderr.read().decode(errors='replace')}")
    (directory / "complete").write_text(str(entries))
    return directory, boot


@dataclass(frozen=True)
class LatencyResult:
    entries: int
    catch_up_s: float  # the service's start to its first answer
    p50_s: float
    p99_s: float
    client_process_s: float  # median of `vllm-xpu-gate wait` processes, spawn to exit

    @property
    def passed(self) -> bool:
        return self.p99_s < TARGET_P99_S


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def ask(path: str) -> tuple[float, str]:
    """One request as the client makes it: seconds from connect to the answer, and the answer's line."""
    started = time.perf_counter()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(path)
        connection.sendall(protocol.Request(60.0, True, 0.07).encode())
        buffer = b""
        while True:
            chunk = connection.recv(65536)
            if not chunk:
                raise RuntimeError(f"the service closed the connection: {buffer!r}")
            buffer += chunk
            for line in buffer.split(b"\n")[:-1]:
                reply = protocol.parse_reply(line)
                if reply is not None and reply.exit_status is not None:
                    return time.perf_counter() - started, reply.line


def measure(directory: Path, boot: str, entries: int, requests: int, work: Path, driver: Path) -> LatencyResult:
    procfs = work / f"proc-{entries}"
    (procfs / str(os.getpid())).mkdir(parents=True, exist_ok=True)
    (procfs / str(os.getpid()) / "cgroup").write_text(f"0::/system.slice/{ASKING_UNIT}\n")
    path = str(work / f"gate-{entries}.sock")
    config = work / "ze.conf"
    script = Path(sys.executable).with_name("vllm-xpu-gate")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "vllm_xpu_exporter.gate"]
    started = time.perf_counter()
    service = subprocess.Popen([*command, "serve", "--listen", path, "--journal.directory", str(directory),
                                "--journal.boot", boot, "--path.procfs", str(procfs)],
                               env={**os.environ, **fake_driver_env(driver, config), "PYTHONPATH": str(REPO)},
                               stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                _, line = ask(path)
                break
            except OSError:
                time.sleep(0.01)
        catch_up = time.perf_counter() - started
        seconds = []
        for _ in range(requests):
            took, line = ask(path)
            decision = gate_lines.parse_line(line)
            if decision is None or decision.timed_out or decision.waited_for:
                raise RuntimeError(f"not a release that waited for nothing: {line}")
            seconds.append(took)
        clients = []
        for _ in range(5):  # the whole ExecStartPre=: a client process, in no unit here (released at once)
            began = time.perf_counter()
            subprocess.run([*command, "wait", "--socket", path], check=True, capture_output=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
            clients.append(time.perf_counter() - began)
    finally:
        service.terminate()
        service.wait(10)
    return LatencyResult(entries, catch_up, percentile(seconds, 0.5), percentile(seconds, 0.99),
                         percentile(clients, 0.5))


def bench_gate_latency(entries: int, requests: int, log=print) -> tuple[LatencyResult, LatencyResult]:
    big = ensure_journal(entries, log=log)
    small = ensure_journal(BASELINE_ENTRIES, log=log)
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        (work / "driver").mkdir()
        driver = build_fake_driver(work / "driver")
        device = dataclasses.replace(A770, memory=(FakeMemoryModule(size=16 * GIB, free=13 * GIB),))
        write_config(work / "ze.conf", FakeConfig(devices=(device,)))
        baseline = measure(*small, BASELINE_ENTRIES, requests, work, driver)
        measured = measure(*big, entries, requests, work, driver)
    return baseline, measured


def report(baseline: LatencyResult, measured: LatencyResult, log=print) -> None:
    for result in (baseline, measured):
        log(f"  {result.entries:>9,} entries ({FORGED_UNITS} forged UNIT= names): release p50 "
            f"{result.p50_s * 1000:6.2f} ms, p99 {result.p99_s * 1000:6.2f} ms (connect to answer); service "
            f"catch-up {result.catch_up_s:6.2f} s; a client process {result.client_process_s * 1000:5.0f} ms "
            f"spawn to exit")
    log(f"  target: p99 < {TARGET_P99_S * 1000:g} ms at {measured.entries:,} entries: "
        f"{'met' if measured.passed else 'MISSED'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    baseline, measured = bench_gate_latency(args.entries, args.requests)
    report(baseline, measured)
    print(json.dumps({"baseline": baseline.__dict__, "measured": measured.__dict__}))
    return 0 if measured.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
