"""The seed's three engines as containers of a real dockerd, started together, over repeated cold boots: the
race without the gate, the gate's serial inits, and the planner's budgets with and without the gate.

    python benchmarks/container_boot.py                 # 20 boots of each of the four ways on each engine (as root)
    python benchmarks/container_boot.py --boots 5 --ways gated,planned-gated --engines podman

The host is the boot race's: chat (0.75, 131072 tokens, max_num_seqs 3), embedding (0.07) and stt (0.07) of
one 16 GiB fake GPU (the test-only Level Zero driver, nothing held but the driver's idle reserve), each a
replayed vLLM engine (tests/vllmunit.py) in a container of the test image (tests/containerengines.py: a
dockerd of the run's own, then rootful Podman with runc; the image built from Debian's packages, nothing
pulled) with the host's pids and the log driver whose files the gate service reads (Docker's json-file,
Podman's k8s-file). A boot is a fresh device and three `docker run -d` (`podman run -d`) issued at the same
moment.

The ways:

* `ungated`: each container runs its engine as configured (R only);
* `gated`: each container's entrypoint is the gate's container client (the package bound in read-only, the
  service's socket bound in), then its engine; the service on the host reads the containers' logs
  (--logs.docker, --logs.podman) for their inits' ends;
* `planned`: each engine with the budget of the plan (`--kv-cache-memory-bytes`, tests/bootrace.py's PLANNED:
  chat one full-length request, the small ones a few hundred MiB), no gate;
* `planned-gated`: both; the service admits each by the budget in the command its engine recorded.

Per boot: init failures (an engine's `failed` event; containers are not restarted), overlapping inits (two
engines' spans from `started` to their KV allocation or failure intersect; each engine that overlaps another
counts once) and the seconds from the first `run` to the last engine serving (the engines' own
clock, the host's). Then per way the counts and the median and slowest boot, and the ratio of
`planned-gated` to `planned` (median and slowest), per engine. Exit status 0 when `gated` and
`planned-gated` had no failed init and `gated` no overlap on every engine, else 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from bootrace import IDLE_RESERVED, PLANNED  # noqa: E402
from containerengines import Dockerd, Podman, engine_image  # noqa: E402
from fakeze import SharedDevice, build_fake_driver, fake_driver_env  # noqa: E402
from journalgen import write_journal  # noqa: E402
from polling import wait_for  # noqa: E402
from gateproc import GATE  # noqa: E402
from vllmunit import CHAT, EMBEDDING, SIXTEEN_GIB_GPU, STT, engine_command, read_events  # noqa: E402

WAYS = ("ungated", "gated", "planned", "planned-gated")
GATED = ("gated", "planned-gated")
ENGINES = (CHAT, EMBEDDING, STT)
BUDGETS = {engine.role: PLANNED[f"vllm-xpu-{engine.role}.service"] for engine in ENGINES}
PACKAGE_INSIDE = "/vllm-xpu-gate/vllm_xpu_exporter"
SOCKET_INSIDE = "/run/vllm-xpu-gate"
BOOT_TIMEOUT = 120.0


@dataclasses.dataclass(frozen=True)
class Boot:
    failures: int
    overlaps: int
    seconds: float | None  # None: not every engine served
    failed: tuple[str, ...] = ()  # the engines whose init failed


def container_command(engine, way: str, device: Path, events: Path) -> list[str]:
    planned = BUDGETS[engine.role] if way.startswith("planned") else engine
    command = engine_command(planned, f"vllm-{engine.role}", device_config=device, time_scale=0.1, events=events,
                             python="python3", requests=0)
    if way not in GATED:
        return command
    return ["python3", f"{PACKAGE_INSIDE}/gate/container_wait.py", "--gpu-memory-utilization",
            str(engine.gpu_memory_utilization), "--service-timeout", "20s", "--timeout", "90s", "--", *command]


def init_spans(records: Sequence[dict]) -> dict[str, tuple[float, float]]:
    begun: dict[str, float] = {}
    spans: dict[str, tuple[float, float]] = {}
    for record in records:
        unit, event = record["unit"], record["event"]
        if event == "started":
            begun[unit] = record["at"]
        elif event in ("allocated", "failed") and unit in begun and unit not in spans:
            spans[unit] = (begun[unit], record["at"])
    return spans


def overlapping(spans: dict[str, tuple[float, float]]) -> int:
    return sum(any(other != unit and begin < spans[other][1] and spans[other][0] < end for other in spans)
               for unit, (begin, end) in spans.items())


# How the gate service watches each engine's containers and which log driver they use (the one the service reads)
WATCH = {
    Dockerd.name: lambda engine: ("json-file", ["--journal.containers", "docker/vllm-*", "--logs.docker",
                                            "--path.docker", str(engine.data_root)]),
    Podman.name: lambda engine: ("k8s-file", ["--journal.containers", "podman/vllm-*", "--logs.podman",
                                           "--path.podman", str(engine.storage)]),
}


def one_boot(engine: Dockerd | Podman, way: str, directory: Path, driver: Path) -> Boot:
    device, events, sockets = directory / "ze.conf", directory / "events.jsonl", directory / "gate"
    SharedDevice.create(device, SIXTEEN_GIB_GPU, reserved=IDLE_RESERVED)
    events.unlink(missing_ok=True)
    sockets.mkdir(exist_ok=True)
    names = [f"vllm-{replayed.role}" for replayed in ENGINES]
    engine.remove(*names)
    log_driver, watch = WATCH[engine.name](engine)
    service = None
    if way in GATED:
        service = subprocess.Popen(
            [*GATE, "serve", "--listen", str(sockets / "gate.sock"), "--journal.file",
             str(write_journal(directory / "empty.journal", [])), *watch, "--poll-interval", "50ms"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**fake_driver_env(driver, device), "PATH": "/usr/bin:/bin"})
        if not wait_for(lambda: (sockets / "gate.sock").exists(), timeout=30):
            raise SystemExit("the gate service did not listen within 30 s")
    options = ["-v", f"{REPO}:{REPO}:ro", "-v", f"{REPO / 'exporter'}:{PACKAGE_INSIDE}:ro",
               "-v", f"{sockets}:{SOCKET_INSIDE}", "--env", "PYTHONPATH=/vllm-xpu-gate"]
    try:
        began = time.time()
        threads = [threading.Thread(target=engine.run, args=(f"vllm-{replayed.role}",
                                                              container_command(replayed, way, device, events)),
                                    kwargs={"log_driver": log_driver, "volumes": [directory], "options": options})
                   for replayed in ENGINES]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        def settled() -> bool:
            done = {r["unit"] for r in read_events(events) if r["event"] in ("serving", "failed")}
            return done == set(names)

        wait_for(settled, timeout=BOOT_TIMEOUT, interval=0.1)
        records = read_events(events)
    finally:
        engine.remove(*names)
        if service is not None:
            service.terminate()
            service.wait(10)
    failures = sum(record["event"] == "failed" for record in records)
    serving = [record["at"] for record in records if record["event"] == "serving"]
    seconds = max(serving) - began if len(serving) == len(names) else None
    failed = tuple(sorted(record["unit"] for record in records if record["event"] == "failed"))
    return Boot(failures, overlapping(init_spans(records)), seconds, failed)


def summary(way: str, boots: Sequence[Boot]) -> str:
    served = [boot.seconds for boot in boots if boot.seconds is not None]
    times = (f"all serving after {statistics.median(served):.2f} s median, {max(served):.2f} s slowest"
             if served else "never all serving")
    return (f"{way}: {len(boots)} boots, {sum(b.failures > 0 for b in boots)} with init failures, "
            f"{sum(b.failures for b in boots)} init failures, {sum(b.overlaps for b in boots)} overlapping inits; "
            f"{len(served)} all serving, {times}")


ENGINE_CLASSES = {"docker": Dockerd, "podman": Podman}
ENGINE_NAMES = tuple(ENGINE_CLASSES)


def run_engine(engine: Dockerd | Podman, ways: Sequence[str], boots: int, base: Path, driver: Path) -> bool:
    """Every way's boots on one engine, each boot's line, then the totals and the ratio; whether the claims held."""
    results: dict[str, list[Boot]] = {}
    engine.import_image(engine_image())
    for way in ways:
        results[way] = []
        for number in range(1, boots + 1):
            boot = one_boot(engine, way, base, driver)
            results[way].append(boot)
            seconds = "NOT ALL SERVING" if boot.seconds is None else f"all serving after {boot.seconds:.2f} s"
            failed = f" ({', '.join(boot.failed)})" if boot.failed else ""
            print(f"{engine.name} {way}: boot {number:2d}: {boot.failures} init failures{failed}, {boot.overlaps} "
                  f"overlapping inits, {seconds}", flush=True)
    print()
    for way, way_boots in results.items():
        print(f"{engine.name} {summary(way, way_boots)}")
    planned = [b.seconds for b in results.get("planned", []) if b.seconds is not None]
    gated = [b.seconds for b in results.get("planned-gated", []) if b.seconds is not None]
    if planned and gated:
        print(f"{engine.name} planned-gated / planned: {statistics.median(gated) / statistics.median(planned):.2f} "
              f"median, {max(gated) / max(planned):.2f} slowest")
    print()
    return all(not boot.failures for way in GATED for boot in results.get(way, [])) and \
        all(not boot.overlaps for boot in results.get("gated", []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boots", type=int, default=20)
    parser.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {', '.join(WAYS)}")
    parser.add_argument("--engines", default=",".join(ENGINE_NAMES),
                        help=f"comma-separated, of {', '.join(ENGINE_NAMES)}")
    args = parser.parse_args(argv)
    ways = [way.strip() for way in args.ways.split(",") if way.strip()]
    engines = [name.strip() for name in args.engines.split(",") if name.strip()]
    unknown = sorted(set(ways) - set(WAYS)) + sorted(set(engines) - set(ENGINE_NAMES))
    if unknown or not ways or not engines or args.boots < 1:
        parser.error(f"unknown: {', '.join(unknown)}" if unknown else "want --boots >= 1, a way and an engine")
    held = True
    with tempfile.TemporaryDirectory(prefix="container-boot-") as temporary:
        base = Path(temporary)
        driver = build_fake_driver(base)
        for name in engines:
            with ENGINE_CLASSES[name](base / name) as engine:
                held = run_engine(engine, ways, args.boots, base, driver) and held
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
