"""CPU of reading a container's rotated .gz that inflates to 256 MiB (a gzip bomb of under 1 MiB), against a
baseline in the same run: the same reader over a rotated .gz of ordinary logs of the same compressed size.

    python benchmarks/gzip_bomb_bench.py [--repeat 3]

The reader inflates at most INFLATE_RATIO times a rotated file's size (at least MIN_INFLATED_BYTES, at most
MAX_INFLATED_BYTES), so the bomb costs about what an ordinary file of its size does; without the bound it
cost ~60 s of CPU. Prints the CPU seconds (user + system of this process) of each, best of `--repeat`.
"""

from __future__ import annotations

import argparse
import gzip
import random
import resource
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from containerlogs import ContainerLine, DockerHost, json_file_records  # noqa: E402
from vllm_xpu_exporter.sources.containerlogs import ContainerLogReader, LogDirectories  # noqa: E402
from vllm_xpu_exporter.sources.logs.entry import LogSelection  # noqa: E402

T0 = 1_747_000_000_000_000


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def write_rotated(root: Path, bomb: bool, compressed_bytes: int | None = None, inflated_mib: int = 256) -> int:
    """A Docker container whose rotated .1.gz is a bomb (one short record repeated to `inflated_mib` MiB) or
    ordinary logs (random throughput lines) up to `compressed_bytes`; and a live line. The .gz's size."""
    container = DockerHost(root).add("vllm-chat")
    rotated = container.directory / f"{container.log.name}.1.gz"
    rng = random.Random(1)
    with gzip.open(rotated, "wb", compresslevel=6) as packed:
        if bomb:
            record = b"".join(json_file_records(ContainerLine(T0, 0, "vllm-chat", "a", 0)))
            for _ in range(inflated_mib):
                packed.write(record * ((1 << 20) // len(record)))
        else:
            n = 0
            while rotated.stat().st_size < compressed_bytes:
                lines = [ContainerLine(T0 + n * 1000 + i, 0, "vllm-chat",
                                       f"Avg prompt throughput: {rng.random() * 900:.1f} tokens/s, "
                                       f"Running: {rng.randrange(4)} reqs", 0) for i in range(2000)]
                packed.write(b"".join(b"".join(json_file_records(line)) for line in lines))
                packed.flush()
                n += 2000
    container.write([ContainerLine(T0 + 10**12, 0, "vllm-chat", "live", 0)])
    return rotated.stat().st_size


def read_cpu(root: Path) -> tuple[float, int]:
    before = cpu_seconds()
    reader = ContainerLogReader(LogSelection(container_globs=("*vllm*",), boot="all"),
                                LogDirectories(docker_roots=(str(root),)), poll_seconds=0.0, discover_seconds=0.0)
    entries = 0
    with reader:
        while batch := reader.read_available(4096):
            entries += len(batch)
    return cpu_seconds() - before, entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    repeat = parser.parse_args().repeat
    with tempfile.TemporaryDirectory() as directory:
        bomb_root, plain_root = Path(directory, "bomb"), Path(directory, "plain")
        size = write_rotated(bomb_root, bomb=True)
        write_rotated(plain_root, bomb=False, compressed_bytes=size)
        bomb = min(read_cpu(bomb_root) for _ in range(repeat))
        plain = min(read_cpu(plain_root) for _ in range(repeat))
        small_root = Path(directory, "small")  # the reported bomb's size: some 255 KiB
        small_size = write_rotated(small_root, bomb=True, inflated_mib=84)
        small = min(read_cpu(small_root) for _ in range(repeat))
    print(f"rotated .gz of {size / 1024:.0f} KiB inflating to 256 MiB: {bomb[0]:.2f} s CPU, {bomb[1]} records")
    print(f"baseline, ordinary logs of the same compressed size: {plain[0]:.2f} s CPU, {plain[1]} records")
    print(f"ratio: {bomb[0] / plain[0]:.2f}")
    print(f"rotated .gz of {small_size / 1024:.0f} KiB inflating to 84 MiB: {small[0]:.2f} s CPU, {small[1]} records")


if __name__ == "__main__":
    main()
