"""How long one procfs scan takes on a busy host. Prints wall time p50/p99 and CPU time per scan for:

1. fixture: a fake procfs (tests/fakeprocfs.py) of 500 processes with 50 fds each, 64 of them GPU
   processes in 16 units (3 DRM fds each: two clients, one of them dup'd) — the whole pipeline;
2. real /proc: this host's /proc after starting 500 extra `sleep` processes holding 50 fds each
   (no GPU here, so no DRM fds: this measures the kernel's cost of the stat every fd needs, which
   dominates a scan).

    python benchmarks/procfs_scan.py [--processes 500] [--fds 50] [--scans 100] [--no-real]

Needs root (the fixture's DRM fds are real device nodes made with mknod).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from vllm_xpu_exporter.sources.procfs import scan_drm_clients  # noqa: E402
from fakeprocfs import FakeProcfs, xe_fdinfo  # noqa: E402

MiB = 1 << 20
GPU_PROCESSES = 64
UNITS = 16
DRM_FDS_PER_GPU_PROCESS = 3


def build(base: Path, processes: int, fds: int) -> FakeProcfs:
    tree = FakeProcfs(base)
    client_id = 0
    for index in range(processes):
        pid = 1000 + index
        if index < GPU_PROCESSES:
            unit = index % UNITS
            process = tree.add_unit_process(pid, f"/system.slice/vllm-{unit}.service")
            for _ in range(2):
                client_id += 1
                process.add_drm_fd(xe_fdinfo(client_id=client_id, vram0=(index + 1) * MiB, unit="MiB"))
            process.add_drm_fd(xe_fdinfo(client_id=client_id, vram0=(index + 1) * MiB, unit="MiB"))
            process.add_other_fds(fds - DRM_FDS_PER_GPU_PROCESS)
        else:
            tree.add_unit_process(pid, f"/system.slice/other-{index}.service").add_other_fds(fds)
    return tree


def percentile(sorted_values: list[float], fraction: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))]


def measure(label: str, scan: Callable[[], object], scans: int) -> None:
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(scans):
        wall, cpu = time.perf_counter(), time.process_time()
        scan()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    walls.sort()
    print(f"{label}: wall per scan p50 {percentile(walls, 0.5) * 1e3:.1f} ms, "
          f"p99 {percentile(walls, 0.99) * 1e3:.1f} ms; cpu per scan mean {statistics.fmean(cpus) * 1e3:.1f} ms")


def bench_fixture(processes: int, fds: int, scans: int) -> None:
    # In memory, like procfs itself, when the host has a tmpfs at /dev/shm.
    in_memory = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="procfs-bench-", dir=in_memory) as base:
        started = time.perf_counter()
        tree = build(Path(base), processes, fds)
        print(f"fixture: {processes} processes x {fds} fds ({GPU_PROCESSES} GPU processes in {UNITS} units), "
              f"built in {time.perf_counter() - started:.1f}s")
        result = scan_drm_clients(str(tree.root))
        assert result.clients == GPU_PROCESSES * 2, result.clients
        assert len(result.memory_by_device_unit["0000:03:00.0"]) == UNITS
        print(f"fixture: {result.processes} processes, {result.drm_fds} DRM fds, {result.clients} clients")
        measure("fixture", lambda: scan_drm_clients(str(tree.root)), scans)


def bench_real_proc(processes: int, fds: int, scans: int) -> None:
    held: list[int] = []
    try:
        while len(held) < fds - 3:  # plus stdin/stdout/stderr
            read_end, write_end = os.pipe()
            held += [read_end, write_end, os.open("/dev/null", os.O_RDONLY), os.open(__file__, os.O_RDONLY)]
        held_fds = held[:fds - 3]
        sleepers = [subprocess.Popen(["sleep", "3600"], pass_fds=held_fds, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL) for _ in range(processes)]
    finally:
        for fd in held:
            os.close(fd)
    try:
        result = scan_drm_clients("/proc")
        print(f"real /proc: {result.processes} processes ({processes} sleepers with {fds} fds each)")
        measure("real /proc", lambda: scan_drm_clients("/proc"), scans)
    finally:
        for sleeper in sleepers:
            sleeper.kill()
        for sleeper in sleepers:
            sleeper.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=500)
    parser.add_argument("--fds", type=int, default=50)
    parser.add_argument("--scans", type=int, default=100)
    parser.add_argument("--no-real", dest="real", action="store_false", help="skip the real /proc run")
    args = parser.parse_args()
    bench_fixture(args.processes, args.fds, args.scans)
    if args.real:
        bench_real_proc(args.processes, args.fds, args.scans)
    return 0


if __name__ == "__main__":
    sys.exit(main())
