"""Big, realistic journals for the benchmarks, written by systemd-journal-remote and cached.

    python benchmarks/bigjournal.py 1000000          # make (or find) the cached 1M-entry journal

A journal of ``n`` entries of one boot: ``watched_fraction`` of them about the watched units
(``vllm-*.service``: what they printed and PID 1's records about them), the rest from other units
and the kernel. The watched units live realistic lives: each start prints a vLLM 0.24 startup
(version, non-default args, KV-cache lines, init complete) or a failed one (the KV-cache root cause
printed twice, the wrapper, the process's exit, the unit's failure, a scheduled restart), and while
serving prints request logs and throughput lines, i.e. mostly noise to the grammar. Starts of
different units interleave, so inits overlap. The mix is printed by ``describe()``.

``invocations=True`` (``--invocations``) gives every start its own invocation id, as systemd does (a
restart gets a new one: ``_SYSTEMD_INVOCATION_ID`` on the unit's output, ``INVOCATION_ID`` on PID 1's
records); the default journal keeps one id per unit and boot, as it was first generated (the catch-up
figures of record were measured on it). Both journals hold the same entries otherwise: the ids come from
a random generator of their own.

Journals are cached under ``$XDG_CACHE_HOME/vllm-xpu-exporter/journal-bench`` (default
``~/.cache/vllm-xpu-exporter/journal-bench``), one directory per size; journal-remote rotates at 128 MiB,
so a big journal is several files: read the directory.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from journalgen import (JOURNAL_REMOTE, MACHINE_ID, HOSTNAME, Clock, JournalEntrySpec, Moment,  # noqa: E402
                        export_entry, export_field, new_invocation_id, random_boot_id, unit_failed, unit_output,
                        unit_process_exited, unit_restart_scheduled, unit_started, unit_starting, write_journal)

GENERATOR_VERSION = 2
WATCHED_UNITS = ("vllm-chat.service", "vllm-embed.service", "vllm-stt.service", "vllm-rerank.service")
UNWATCHED_UNITS = ("nginx.service", "cron.service", "ssh.service", "containerd.service", "prometheus.service")
UNIT_GLOB = "vllm*.service"
# Watched entries of one unit between two of its starts (a restart every ~this many lines).
SERVING_LINES_PER_START = 400
FAILED_START_EVERY = 3  # every third start fails (KV cache too small)

API = "(APIServer pid={api}) INFO 12-02 10:00:00 [api_server.py:1873] "
CORE = "(EngineCore pid={core}) INFO 12-02 10:00:20 [gpu_worker.py:456] "
CAUSE = ("ValueError: To serve at least one request with the model's max seq len (131072), (3.36 GiB KV cache is "
         "needed, which is larger than the available KV cache memory (2.13 GiB). Based on the available memory, "
         "the estimated maximum model length is 46528. Try increasing `gpu_memory_utilization` or decreasing "
         "`max_model_len` when initializing the engine.")


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vllm-xpu-exporter" / "journal-bench"


def start_lines(unit: str, pids: tuple[int, int], fails: bool) -> list[str | tuple[str, str]]:
    """What one start of ``unit`` writes, in order: vLLM lines (str) and PID 1's records (kind, unit)."""
    api, core = pids
    utilisation = {0: 0.75, 1: 0.07, 2: 0.07, 3: 0.05}[WATCHED_UNITS.index(unit)]
    lines: list[str | tuple[str, str]] = [
        ("starting", unit),
        API.format(api=api) + "vLLM API server version 0.24.0",
        API.format(api=api) + "non-default args: {'model': 'Qwen/Qwen3-8B', 'max_model_len': 131072, "
                              f"'gpu_memory_utilization': {utilisation}, 'max_num_seqs': 3}}",
        f"(EngineCore pid={core}) INFO 12-02 10:00:05 [gpu_model_runner.py:2653] Model loading took 15.2 GiB "
        f"memory and 12.345678 seconds",
    ]
    if fails:
        return lines + [
            f"(EngineCore pid={core}) ERROR 12-02 10:00:30 [core.py:708] {CAUSE}",
            f"(EngineCore pid={core}) {CAUSE}",
            f"(APIServer pid={api}) RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {}",
            ("exited", unit), ("failed", unit), ("restart", unit),
        ]
    return lines + [
        CORE.format(core=core) + "Available KV cache memory: 3.25 GiB",
        f"(EngineCore pid={core}) INFO 12-02 10:00:21 [kv_cache_utils.py:1286] GPU KV cache size: 47,328 tokens",
        f"(EngineCore pid={core}) INFO 12-02 10:00:21 [kv_cache_utils.py:1290] Maximum concurrency for 131,072 "
        "tokens per request: 0.36x",
        f"(EngineCore pid={core}) INFO 12-02 10:00:40 [core.py:210] init engine (profile, create kv cache, warmup "
        "model) took 42.50 seconds",
        API.format(api=api) + "Starting vLLM API server 0 on http://0.0.0.0:8000",
        f"(APIServer pid={api}) INFO 12-02 10:00:41 [launcher.py:37] Route: /v1/chat/completions, Methods: POST",
        f"(APIServer pid={api}) INFO:     Application startup complete.",
    ]


SERVING_TEMPLATES = (
    '(APIServer pid=%d) INFO:     10.0.%d.%d:%d - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    '(APIServer pid=%d) INFO:     10.0.%d.%d:%d - "GET /metrics HTTP/1.1" 200 OK',
    "(APIServer pid=%d) INFO 12-02 10:%02d:%02d [loggers.py:%d] Engine 000: Avg prompt throughput: 812.4 tokens/s, "
    "Avg generation throughput: 57.3 tokens/s, Running: 3 reqs, Waiting: 0 reqs, GPU KV cache usage: 12.3%%, "
    "Prefix cache hit rate: 45.6%%",
)
OTHER_TEMPLATES = (
    '10.0.%d.%d - - [12/May/2025:10:11:12 +0000] "GET /api/v1/items/%d HTTP/1.1" 200 %d "-" "curl/7.88.1"',
    "pam_unix(cron:session): session opened for user root(uid=%d) by root(uid=%d) job %d size %d",
    "Accepted publickey for deploy from 192.168.%d.%d port %d ssh2: RSA SHA256:%d",
    'time="2025-05-12T10:11:12Z" level=info msg="shim disconnected" id=%d namespace=%d pid=%d exit=%d',
    'caller=compact.go:%d level=info component=tsdb msg="write block" mint=%d maxt=%d ulid=%d',
)


@dataclass
class _UnitLife:
    unit: str
    index: int
    pending: list[str | tuple[str, str]] = field(default_factory=list)
    serving_left: int = 0
    starts: int = 0

    def pids(self) -> tuple[int, int]:
        base = 10_000 + 1000 * self.index + 10 * self.starts
        return base, base + 1


def _record(kind: str, unit: str, at: Moment, invocation_id: str | None = None) -> JournalEntrySpec:
    if kind == "starting":
        return unit_starting(unit, at, invocation_id=invocation_id)
    if kind == "exited":
        return unit_process_exited(unit, at, invocation_id=invocation_id)
    if kind == "failed":
        return unit_failed(unit, at, invocation_id=invocation_id)
    return unit_restart_scheduled(unit, at, invocation_id=invocation_id)


def journal_boot_id(seed: int = 1) -> str:
    """The boot id of the entries of ``journal_stream(..., seed=seed)``."""
    return random_boot_id(random.Random(seed))


def journal_stream(n_entries: int, watched_fraction: float = 0.1, *, seed: int = 1,
                   mix: Counter | None = None, invocations: bool = False,
                   long_invocation: bool = False, forged_names: int = 0) -> Iterator[bytes]:
    """Export-format text of the journal; counts what it wrote into ``mix`` if given. ``invocations``: a
    new invocation id for every start (module docstring). ``long_invocation``: one watched unit, started once,
    serving for the rest of the journal (one invocation holds all its entries). ``forged_names``: every
    unwatched unit's entry also carries ``UNIT=vllm-forged-K.service``, K among that many (any process may
    write that field)."""
    rng = random.Random(seed)
    boot = random_boot_id(rng)
    origin = Moment(0, 0, boot)
    lives = [_UnitLife(unit, index) for index, unit in enumerate(WATCHED_UNITS[:1] if long_invocation
                                                                    else WATCHED_UNITS)]
    invocation_rng = random.Random(seed + 1_000_003)
    invocation_of: dict[str, str | None] = {life.unit: None for life in lives}  # None: one id per unit and boot

    def output_block(life: _UnitLife) -> bytes:
        return b"".join(export_field(k, v) for k, v in unit_output(
            life.unit, None, origin, pid=life.pids()[0], invocation_id=invocation_of[life.unit]).fields)

    def new_start(life: _UnitLife, fails: bool) -> None:
        life.pending = start_lines(life.unit, life.pids(), fails=fails)
        if invocations:
            invocation_of[life.unit] = new_invocation_id(invocation_rng)
            static_watched[life.unit] = output_block(life)

    # Each unit starts at once; later starts happen when its serving lines run out.
    static_watched: dict[str, bytes] = {}
    for life in lives:
        new_start(life, fails=False)
        static_watched[life.unit] = output_block(life)
    static_other = [b"".join(export_field(k, v) for k, v in
                             unit_output(unit, None, origin, pid=500 + index, comm=unit.split(".")[0]).fields)
                    for index, unit in enumerate(UNWATCHED_UNITS)]
    kernel = b"".join(export_field(k, v) for k, v in (
        ("_BOOT_ID", boot), ("_MACHINE_ID", MACHINE_ID), ("_HOSTNAME", HOSTNAME), ("PRIORITY", 6),
        ("SYSLOG_FACILITY", 0), ("SYSLOG_IDENTIFIER", "kernel"), ("_TRANSPORT", "kernel"),
        ("_SOURCE_MONOTONIC_TIMESTAMP", 1)))
    serving = [t.encode() for t in SERVING_TEMPLATES]
    other = [t.encode() for t in OTHER_TEMPLATES]
    count = mix.__setitem__ if mix is not None else None
    randrange = rng.randrange
    threshold = int(watched_fraction * 1_000_000)
    realtime, monotonic = 1_747_000_000_000_000, 5_000_000
    for _ in range(n_entries):
        realtime += randrange(1, 2000)
        monotonic += 1000
        draw = randrange(1_000_000)
        a, b, c, d = randrange(256), randrange(60), randrange(9999), randrange(99999)
        if draw < threshold:
            life = lives[draw % len(lives)]
            if life.pending:
                line = life.pending.pop(0)
                if not life.pending:
                    life.serving_left = (n_entries if long_invocation else
                                         SERVING_LINES_PER_START + randrange(SERVING_LINES_PER_START))
                if count is not None:
                    kind = line[0] if isinstance(line, tuple) else "vllm startup/failure line"
                    mix[f"watched: {kind if kind == 'vllm startup/failure line' else 'PID 1 record'}"] += 1
                if isinstance(line, tuple):
                    yield export_entry(_record(line[0], line[1], Moment(realtime, monotonic, boot),
                                               invocation_of[life.unit]))
                else:
                    header = b"__REALTIME_TIMESTAMP=%d\n__MONOTONIC_TIMESTAMP=%d\n" % (realtime, monotonic)
                    yield header + static_watched[life.unit] + export_field("MESSAGE", line) + b"\n"
                continue
            life.serving_left -= 1
            if life.serving_left <= 0:
                life.starts += 1
                new_start(life, fails=life.starts % FAILED_START_EVERY == 1)
            template = serving[draw % len(serving)]
            message = template % (life.pids()[0], a % 60, b, c)
            if mix is not None:
                mix["watched: vllm serving noise"] += 1
            header = b"__REALTIME_TIMESTAMP=%d\n__MONOTONIC_TIMESTAMP=%d\n" % (realtime, monotonic)
            yield header + static_watched[life.unit] + b"MESSAGE=" + message + b"\n\n"
        elif draw % 10 == 0:
            if mix is not None:
                mix["other: kernel"] += 1
            yield (b"__REALTIME_TIMESTAMP=%d\n__MONOTONIC_TIMESTAMP=%d\n" % (realtime, monotonic) + kernel +
                   b"MESSAGE=i915 0000:03:00.0: [drm] GT0: GuC firmware %d loaded\n\n" % d)
        else:
            which = draw % len(UNWATCHED_UNITS)
            if mix is not None:
                mix["other: unwatched units"] += 1
            forged = b"UNIT=vllm-forged-%d.service\n" % (d % forged_names) if forged_names else b""
            yield (b"__REALTIME_TIMESTAMP=%d\n__MONOTONIC_TIMESTAMP=%d\n" % (realtime, monotonic) +
                   static_other[which] + forged + b"MESSAGE=" + other[which] % (a, b, c, d) + b"\n\n")


def describe(n_entries: int, watched_fraction: float = 0.1) -> Counter:
    """What a journal of this size contains (by regenerating its text without writing it)."""
    mix: Counter = Counter()
    for _ in journal_stream(n_entries, watched_fraction, mix=mix):
        pass
    return mix


def write_journal_directory(directory: Path, n_entries: int, watched_fraction: float = 0.1,
                            invocations: bool = False, long_invocation: bool = False, forged_names: int = 0) -> None:
    """Write the journal into ``directory`` through systemd-journal-remote."""
    output = directory / "bench.journal"
    process = subprocess.Popen([JOURNAL_REMOTE, f"--output={output}", "--split-mode=none", "--compress=yes", "-"],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert process.stdin is not None and process.stderr is not None
    batch: list[bytes] = []
    try:
        for chunk in journal_stream(n_entries, watched_fraction, invocations=invocations,
                                    long_invocation=long_invocation, forged_names=forged_names):
            batch.append(chunk)
            if len(batch) >= 4096:
                process.stdin.write(b"".join(batch))
                batch.clear()
        process.stdin.write(b"".join(batch))
    finally:
        process.stdin.close()
    error = process.stderr.read().decode(errors="replace")
    if process.wait() != 0:
        raise RuntimeError(f"systemd-journal-remote failed ({process.returncode}): {error.strip()}")


def ensure_journal(n_entries: int, watched_fraction: float = 0.1, root: Path | None = None,
                   log=print, invocations: bool = False, long_invocation: bool = False,
                   forged_names: int = 0) -> Path:
    """The directory of the cached journal of ``n_entries`` entries, generated if missing; ``invocations``:
    the journal whose every start has its own invocation id; ``long_invocation``: ``journal_stream``'s."""
    directory = (root or cache_root()) / (f"v{GENERATOR_VERSION}-{n_entries}-{round(watched_fraction * 100)}pct"
                                          + ("-invocations" if invocations else "")
                                          + ("-long" if long_invocation else "")
                                          + (f"-forged{forged_names}" if forged_names else ""))
    marker = directory / "complete"
    if marker.exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.journal*"):
        old.unlink()
    log(f"generating a {n_entries:,}-entry journal in {directory} (once; cached) ...")
    started = time.perf_counter()
    write_journal_directory(directory, n_entries, watched_fraction, invocations, long_invocation, forged_names)
    size = sum(p.stat().st_size for p in directory.glob("*.journal*"))
    log(f"  done in {time.perf_counter() - started:.0f} s, {size / 2**20:.0f} MiB")
    marker.write_text(str(n_entries))
    return directory


UNITS_GENERATOR_VERSION = 1
UNIT_START_LINES = (
    API + "vLLM API server version 0.24.0",
    API + "non-default args: {{'model': 'Qwen/Qwen3-8B', 'max_model_len': 131072, 'gpu_memory_utilization': 0.05}}",
    CORE + "Available KV cache memory: 3.25 GiB",
    "(EngineCore pid={core}) INFO 12-02 10:00:21 [kv_cache_utils.py:1286] GPU KV cache size: 47,328 tokens",
    "(EngineCore pid={core}) INFO 12-02 10:00:40 [core.py:210] init engine (profile, create kv cache, warmup "
    "model) took 42.50 seconds",
    API + "Application startup complete.",
)
ENTRIES_PER_UNIT = len(UNIT_START_LINES) + 2  # with PID 1's "Starting" and "Started"


def units_journal_entries(units: int) -> Iterator[JournalEntrySpec]:
    """``units`` watched units (``vllm-NNNNN.service``) starting at once after a boot, 8 entries each:
    PID 1's "Starting", six vLLM startup lines, "Started"; the starts interleave, as concurrent ones do."""
    clock = Clock(random_boot_id(random.Random(units)))
    names = [f"vllm-{index:05d}.service" for index in range(units)]
    yield from (unit_starting(name, clock.tick()) for name in names)
    for line in UNIT_START_LINES:
        for index, name in enumerate(names):
            api, core = 10_000 + 2 * index, 10_001 + 2 * index
            yield unit_output(name, line.format(api=api, core=core), clock.tick(), pid=api)
    yield from (unit_started(name, clock.tick()) for name in names)


def ensure_units_journal(units: int, root: Path | None = None, log=print) -> Path:
    """The directory of the cached journal of ``units`` units × 8 entries, generated if missing."""
    directory = (root or cache_root()) / f"units-v{UNITS_GENERATOR_VERSION}-{units}"
    marker = directory / "complete"
    if marker.exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    log(f"generating a journal of {units:,} units × {ENTRIES_PER_UNIT} entries in {directory} (once; cached) ...")
    write_journal(directory / "bench.journal", units_journal_entries(units))
    marker.write_text(str(units))
    return directory


def journal_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.journal"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("entries", type=int, nargs="+")
    parser.add_argument("--describe", action="store_true", help="print the mix of entries")
    parser.add_argument("--invocations", action="store_true", help="a new invocation id for every start")
    args = parser.parse_args()
    for n in args.entries:
        print(ensure_journal(n, invocations=args.invocations))
        if args.describe:
            for kind, count in sorted(describe(n).items()):
                print(f"  {kind:32} {count:9,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
