"""A replayed vLLM engine (0.16 or later) for a systemd unit's ExecStart: it prints what vLLM prints
during an engine start (tests/vllmlogs.py) on a compressed clock, and takes and gives back device
memory on a fake GPU shared with the other units (fakeze.SharedDevice, which rewrites the fake Level
Zero driver's config) the way vLLM's memory accounting does, so that units started together race.

    ExecStart=/usr/bin/python3 /path/tests/vllmunit.py --name %n --device-config /realsystemd/ze.conf \\
              --gpu-memory-utilization 0.75 --max-model-len 131072 --weights-gib 7.87 --init-seconds 40

What happens, at vllmlogs' offsets (seconds after the process started, plus --import-seconds) times
--time-scale:
* 6.6, init_device: requested = ceil(R x total), the total the fake GPU's Level Zero core API reports, as
  vLLM multiplies it on XPU (SIXTEEN_GIB_GPU's is its whole 16 GiB; a module without core_size reports 0.95
  of Sysman's); free memory is Sysman's. If free < requested: vLLM's "Free memory on device
  ... is less than desired GPU memory utilization" failure (insufficient_free_memory). Otherwise this
  free memory is the profiling baseline. The check is the same with --kv-cache-memory-bytes set.
* 6.6 .. 6.6 + 0.3 x init: the weights are loaded, in four steps.
* then profiling (profile_run, which runs with the budget set too): non-torch buffers (--non-torch-gib),
  then the activation peak (--activation-gib).
* 6.1 + 0.6 x init, the profiling moment: vLLM counts every byte that left the device since the
  baseline and is not its own torch memory as its own non-torch memory, so memory other processes
  took meanwhile is charged to it:
      KV = requested - (weights + activation peak + non-torch increase)
  With --kv-cache-memory-bytes N (vLLM 0.16+ on XPU, gpu_worker.determine_available_memory): the
  profile run still runs, but KV = N whatever the device shows, so nothing other processes took is
  charged; vLLM prints "Initial free memory F GiB, reserved N GiB memory for KV Cache as specified by
  kv_cache_memory_bytes config and skipped memory profiling ..." instead of "Available KV cache memory".
  Then it frees the activation. KV <= 0: "No available memory for the cache blocks"; KV (the budget
  too) below what one request of --max-model-len needs (ceil(len / block) x block x
  --kv-bytes-per-token): vLLM's kv_cache_too_small message (check_enough_kv_cache_memory). A failed
  engine prints vLLM's failure output, gives all its memory back and exits 1.
* 0.4 later the KV cache is allocated (KV bytes; the budget when set): KV // (block x
  --kv-bytes-per-token) whole blocks of tokens, which vLLM prints ("GPU KV cache size"); during warm-up the
  activation memory is taken again; at 6.1 + init the init completes and the engine serves, holding its
  memory until SIGTERM.
* What it serves: vLLM's block pool keeps block 0 back as its null block, so N blocks serve N - 1
  (`served_tokens`). The start's check above counts bytes and passes with exactly the blocks of one
  request, but such an engine can never schedule a request of its full length: its `serving` event says
  `serves_one_request: false`, whatever it printed.

vLLM 0.34's own startup plan (`--startup-plan FILE`, VLLM_ENABLE_STARTUP_PLAN=1; not with a budget, which wins):
at init_device, a plan FILE holding {"kv_cache_memory_bytes", "free_memory_baseline"} is applied when the
free memory is at least its baseline: the KV cache is its bytes, as with a budget ("Applying persisted
startup plan ..."); else the start profiles ("Startup plan not applied: ... falling back ..."). A profiled
start that succeeds saves its KV bytes and its free memory at init_device as the plan ("Saved startup plan").

Sleep mode, once serving: SIGUSR1 sleeps at level 1 (weights offloaded to CPU, KV cache discarded), SIGUSR2 at
level 2 (both discarded); either gives back the weights and the KV cache, keeps the non-torch memory, and
prints "Sleep mode freed X GiB memory, Y GiB memory is still in use." (the free memory after less before; the
device's used). SIGHUP wakes (what `POST /wake_up` does): the API server's "wake up the engine with tags: None",
then it takes them back as an init does, in four steps over --wake-seconds (times --time-scale), and prints the
executor's "It took X seconds to wake up tags {...}."; when the device has not enough free at a step, the wake
fails with out-of-memory and the engine exits 1. Repeated signals in the same state do nothing.

`--events FILE` appends one JSON line per decision (started; baseline: free and requested; profiled:
free, others, KV bytes and tokens; allocated: free just before the KV cache was taken; serving: KV
bytes and tokens as printed, the tokens the block pool serves and whether that is one request of the full
length; startup_plan: applied, fallback or saved and its bytes; slept: level, freed; woke; wake_failed: free,
needed; failed: reason) for tests. Only the standard library and the helpers beside this
file: it runs under the system Python.

For the tests' side: `Engine` (a replayed engine's settings; CHAT, EMBEDDING and STT are the issue's
three units on a 16 GiB GPU, SIXTEEN_GIB_GPU), `unit_file()` (its systemd unit), `engine_command()`
(its command line, for a container too) and `read_events()` /
`serving_units()` (what the engines wrote to --events).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakeze import A770, GiB, SharedDevice  # noqa: E402
import vllmlogs  # noqa: E402
from vllmlogs import Failure, UnitLine, VllmRun, engine_start_lines, release  # noqa: E402

SCRIPT = Path(__file__).resolve()
# A770's 16 GiB module, whose core API reports all of it (core_size): the seed host's figures are R x 16 GiB.
# SharedDevice.create replaces its free memory and processes by the shares.
SIXTEEN_GIB_GPU = replace(A770, memory=(replace(A770.memory[0], core_size=A770.memory[0].size),))
INIT_DEVICE_AT = 6.6  # vllmlogs: the line after init_device (or its failure)
WEIGHT_STEPS = 4
SLEEP_SIGNALS = {signal.SIGUSR1: 1, signal.SIGUSR2: 2}
SLEEP_MODE_SIGNALS = (*SLEEP_SIGNALS, signal.SIGHUP)  # blocked from the start, waited for while serving


def load_end(run: VllmRun) -> float:
    return INIT_DEVICE_AT + 0.3 * run.init_seconds


def profiling_moment(run: VllmRun) -> float:
    return 6.1 + 0.6 * run.init_seconds  # the "Available KV cache memory" line


def kv_allocated_at(run: VllmRun) -> float:
    return profiling_moment(run) + 0.4  # the KV-cache size lines


def init_done_at(run: VllmRun) -> float:
    return 6.1 + run.init_seconds


def needed_kv_bytes(max_model_len: int, block_size: int, kv_bytes_per_token: int) -> int:
    """What one request of max_model_len needs (vLLM's max_memory_usage_bytes: whole blocks)."""
    return math.ceil(max_model_len / block_size) * block_size * kv_bytes_per_token


def estimated_max_model_len(kv_bytes: int, block_size: int, kv_bytes_per_token: int) -> int:
    """The longest max_model_len whose whole blocks fit (vLLM's estimate_max_model_len)."""
    return max(0, kv_bytes // (block_size * kv_bytes_per_token) * block_size)


def profiled_outcome(run: VllmRun, requested: int, weights: int, activation: int, non_torch_increase: int) -> VllmRun:
    """The run as vLLM ends it at the profiling moment: its KV bytes, and the failure if they do not do."""
    kv_bytes = requested - (weights + activation + non_torch_increase)
    run = replace(run, kv_cache_gib=kv_bytes / GiB)
    if kv_bytes <= 0:
        return replace(run, failure=Failure("no_kv_cache_memory"))
    block = run.effective_block_size
    needed = needed_kv_bytes(run.effective_max_model_len, block, run.kv_bytes_per_token)
    if kv_bytes < needed:
        estimate = estimated_max_model_len(kv_bytes, block, run.kv_bytes_per_token)
        return replace(run, failure=Failure("kv_cache_too_small", needed_gib=needed / GiB,
                                            estimated_max_model_len=estimate or None))
    return run


def kv_tokens(kv_bytes: int, block_size: int, kv_bytes_per_token: int) -> int:
    """The tokens a KV cache of kv_bytes holds: whole blocks (vLLM's num_blocks x block_size, as it prints)."""
    return max(0, kv_bytes // (block_size * kv_bytes_per_token) * block_size)


# vLLM's block pool takes block 0 as its null block before any request: N blocks serve N - 1.
NULL_BLOCKS = 1


def served_tokens(kv_bytes: int, block_size: int, kv_bytes_per_token: int) -> int:
    """The tokens the block pool can give requests: the cache's whole blocks less the null block."""
    return max(0, kv_bytes // (block_size * kv_bytes_per_token) - NULL_BLOCKS) * block_size


def serves_one_request(kv_bytes: int, max_model_len: int, block_size: int, kv_bytes_per_token: int) -> bool:
    """Whether a request of max_model_len can be scheduled: its whole blocks, beside the null block."""
    return served_tokens(kv_bytes, block_size, kv_bytes_per_token) >= math.ceil(max_model_len / block_size) * block_size


def budgeted_outcome(run: VllmRun, budget: int) -> VllmRun:
    """The run as vLLM ends it at the profiling moment with --kv-cache-memory-bytes `budget`: the KV cache
    is the budget (determine_available_memory returns it after the profile run, measuring nothing), and
    check_enough_kv_cache_memory holds one request of max_model_len against the budget."""
    block = run.effective_block_size
    run = replace(run, kv_cache_gib=budget / GiB, kv_cache_tokens=kv_tokens(budget, block, run.kv_bytes_per_token))
    needed = needed_kv_bytes(run.effective_max_model_len, block, run.kv_bytes_per_token)
    if budget < needed:
        estimate = estimated_max_model_len(budget, block, run.kv_bytes_per_token)
        return replace(run, failure=Failure("kv_cache_too_small", needed_gib=needed / GiB, available_gib=budget / GiB,
                                            estimated_max_model_len=estimate or None))
    return run


@dataclass(frozen=True)
class Engine:
    """A replayed engine's settings (vllmunit's command line)."""

    role: str
    gpu_memory_utilization: float
    max_model_len: int
    weights_gib: float
    init_seconds: float
    kv_bytes_per_token: int = 114688
    activation_gib: float = 0.51
    non_torch_gib: float = 0.12
    block_size: int | None = None
    model: str = "Qwen/Qwen3-1.7B"
    version: str = "0.24.0"
    import_seconds: float = 0.0
    max_num_seqs: int | None = None
    kv_cache_memory_bytes: int | None = None  # --kv-cache-memory-bytes: the KV budget

    def argv(self) -> list[str]:
        argv = ["--version", self.version, "--model", self.model,
                "--gpu-memory-utilization", str(self.gpu_memory_utilization),
                "--max-model-len", str(self.max_model_len),
                "--weights-gib", str(self.weights_gib), "--init-seconds", str(self.init_seconds),
                "--kv-bytes-per-token", str(self.kv_bytes_per_token), "--activation-gib", str(self.activation_gib),
                "--non-torch-gib", str(self.non_torch_gib), "--import-seconds", str(self.import_seconds)]
        optional = (("--block-size", self.block_size), ("--max-num-seqs", self.max_num_seqs),
                    ("--kv-cache-memory-bytes", self.kv_cache_memory_bytes))
        return argv + [word for flag, value in optional if value is not None for word in (flag, str(value))]


# The three units on one 16 GiB GPU. Alone, chat's KV cache is 12 - 7.87 - 0.51 - 0.12 = 3.5 GiB
# against 3.25 GiB needed for 131072 tokens (its max_num_seqs of 3 would need 9.75 GiB); the small ones
# have ~0.9 and ~0.45 GiB for short contexts.
CHAT = Engine("chat", 0.75, 131072, 7.87, 40.0, kv_bytes_per_token=26624, model="google/gemma-3-4b-it",
              max_num_seqs=3)
EMBEDDING = Engine("embedding", 0.07, 512, 0.06, 24.0, kv_bytes_per_token=36864, activation_gib=0.05, block_size=16,
                   model="BAAI/bge-small-en-v1.5")
STT = Engine("stt", 0.07, 448, 0.45, 28.0, kv_bytes_per_token=73728, activation_gib=0.1, model="openai/whisper-small")


def engine_command(engine: Engine, name: str, *, device_config: Path, time_scale: float = 0.1,
                   events: Path | None = None, python: str = sys.executable, requests: int = 2) -> list[str]:
    """The command line of a replayed engine named `name` (its share of the device), for a unit or a container."""
    argv = [python, str(SCRIPT), "--name", name, "--device-config", str(device_config), *engine.argv(),
            "--time-scale", str(time_scale), "--requests", str(requests)]
    return argv + (["--events", str(events)] if events is not None else [])


def unit_file(engine: Engine, *, device_config: Path, unit_type: str = "simple", exec_start_pre: Sequence[str] = (),
              restart: str = "on-failure", restart_sec: float = 1.0, time_scale: float = 0.1,
              events: Path | None = None, python: str = sys.executable, requests: int = 2,
              description: str | None = None, extra_service: Sequence[str] = ()) -> str:
    """The systemd unit of a replayed engine; paths as the unit sees them (inside the namespace)."""
    argv = engine_command(engine, "%n", device_config=device_config, time_scale=time_scale, events=events,
                          python=python, requests=requests)
    service = [f"Type={unit_type}", *[f"ExecStartPre={command}" for command in exec_start_pre],
               "ExecStart=" + " ".join(argv), f"Restart={restart}", f"RestartSec={restart_sec}", *extra_service]
    # No start limit: restarts every RestartSec would hit the default 5 starts in 10 s on this clock.
    return "\n".join(["[Unit]", f"Description={description or f'vLLM {engine.role} (replayed)'}",
                      "StartLimitIntervalSec=0", "", "[Service]", *service, "", "[Install]",
                      "WantedBy=multi-user.target", ""])


class Replay:
    """Prints a run's lines at their offsets times `scale` after `began` (time.monotonic)."""

    def __init__(self, run: VllmRun, began_monotonic: float, began_at: float, scale: float) -> None:
        self.began = began_monotonic
        self.began_at = began_at
        self.scale = scale
        self.lines: list[UnitLine] = engine_start_lines(run, began_at)
        self.printed = 0

    def sleep_until(self, offset: float) -> None:
        delay = self.began + offset * self.scale - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def until(self, offset: float) -> None:
        """Print the lines before `offset`, each at its time, then wait for `offset`."""
        while self.printed < len(self.lines) and self.lines[self.printed].offset < offset:
            line = self.lines[self.printed]
            self.sleep_until(line.offset)
            print(line.message, flush=True)
            self.printed += 1
        if offset != math.inf:
            self.sleep_until(offset)

    def switch(self, run: VllmRun) -> None:
        """Continue with what `run` prints (the outcome is known now); what was printed stays."""
        lines = engine_start_lines(run, self.began_at)
        if [line.message for line in lines[:self.printed]] != [line.message for line in self.lines[:self.printed]]:
            raise RuntimeError("vllmunit: the outcome changed lines already printed")
        self.lines = lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="the unit (%%n): its share of the device's memory")
    parser.add_argument("--device-config", required=True, type=Path, help="the fake driver's config (SharedDevice)")
    parser.add_argument("--version", default="0.24.0")
    parser.add_argument("--model", default="Qwen/Qwen3-1.7B")
    parser.add_argument("--gpu-memory-utilization", type=float, required=True)
    parser.add_argument("--max-model-len", type=int, required=True)
    parser.add_argument("--kv-bytes-per-token", type=int, default=114688)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None,
                        help="the KV budget (vLLM 0.16+ on XPU): KV is this, not requested - non-KV")
    parser.add_argument("--weights-gib", type=float, required=True)
    parser.add_argument("--activation-gib", type=float, default=0.51)
    parser.add_argument("--non-torch-gib", type=float, default=0.12)
    parser.add_argument("--init-seconds", type=float, default=30.0, help="vLLM's init time before compression")
    parser.add_argument("--import-seconds", type=float, default=0.0,
                        help="more time before vLLM's first line (its imports), before compression")
    parser.add_argument("--time-scale", type=float, default=0.1, help="real seconds per replayed second")
    parser.add_argument("--requests", type=int, default=2, help="request log cycles once serving")
    parser.add_argument("--wake-seconds", type=float, default=2.2, help="vLLM's wake time before compression")
    parser.add_argument("--events", type=Path, default=None, help="append JSON lines of decisions here")
    parser.add_argument("--startup-plan", type=Path, default=None,
                        help="vLLM 0.34's startup plan file (VLLM_ENABLE_STARTUP_PLAN=1): applied, or saved")
    args = parser.parse_args(argv)
    if not 0 < args.gpu_memory_utilization <= 1:
        parser.error("--gpu-memory-utilization must be in (0, 1]")
    if args.time_scale <= 0:
        parser.error("--time-scale must be positive")
    if args.kv_cache_memory_bytes is not None and args.kv_cache_memory_bytes <= 0:
        parser.error("--kv-cache-memory-bytes must be positive")
    if args.startup_plan is not None and release(args.version) < (0, 34):
        parser.error("--startup-plan: vLLM's own startup plan came with 0.34")
    if release(args.version) < (0, 16):
        parser.error("--version: the replay models vLLM 0.16 and later (XPU shares the CUDA memory accounting)")
    return args


def main(argv: list[str] | None = None) -> int:
    began, began_at = time.monotonic(), time.time()
    args = parse_args(argv)
    device = SharedDevice(args.device_config)
    events = _EventLog(args.events, args.name)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.pthread_sigmask(signal.SIG_BLOCK, SLEEP_MODE_SIGNALS)  # taken once serving (serve_with_sleep_mode)
    init_seconds = args.init_seconds
    total = device.core_total  # what vLLM multiplies on XPU: the Level Zero core API's; free memory is Sysman's
    run = VllmRun(args.version, model=args.model, gpu_memory_utilization=args.gpu_memory_utilization,
                  max_model_len=args.max_model_len, kv_bytes_per_token=args.kv_bytes_per_token,
                  block_size=args.block_size, total_gib=round(total / GiB, 2), weights_gib=args.weights_gib,
                  init_seconds=round(init_seconds, 2), main_pid=os.getpid(), requests=args.requests,
                  max_num_seqs=args.max_num_seqs, kv_cache_memory_bytes=args.kv_cache_memory_bytes)
    weights, activation = round(args.weights_gib * GiB), round(args.activation_gib * GiB)
    non_torch = round(args.non_torch_gib * GiB)
    requested = math.ceil(args.gpu_memory_utilization * total)
    delay = args.import_seconds * args.time_scale
    replay = Replay(run, began + delay, began_at + delay, args.time_scale)
    events.write("started", init_seconds=init_seconds)
    try:
        replay.until(INIT_DEVICE_AT)
        baseline = device.free()
        events.write("baseline", free=baseline, requested=requested)
        if baseline < requested:
            replay.switch(replace(run, free_gib_at_start=baseline / GiB, failure=Failure(
                "insufficient_free_memory", free_gib=baseline / GiB, total_gib=total / GiB)))
            replay.until(math.inf)
            events.write("failed", reason="insufficient_free_memory")
            return 1
        run = replace(run, free_gib_at_start=round(baseline / GiB, 2))
        plan = read_startup_plan(args.startup_plan) if args.kv_cache_memory_bytes is None else None
        budget = args.kv_cache_memory_bytes
        if args.startup_plan is not None and args.kv_cache_memory_bytes is None:
            outcome = startup_plan_outcome(plan, baseline)
            run = replace(run, startup_plan=outcome)
            if plan is not None:
                run = replace(run, startup_plan_baseline_gib=plan["free_memory_baseline"] / GiB)
            if outcome == "applied":
                budget = plan["kv_cache_memory_bytes"]
                run = replace(run, kv_cache_gib=budget / GiB)
            replay.switch(run)
        step = (load_end(run) - INIT_DEVICE_AT) / WEIGHT_STEPS
        for index in range(1, WEIGHT_STEPS + 1):
            replay.until(INIT_DEVICE_AT + index * step)
            device.hold(args.name, weights * index // WEIGHT_STEPS)
        device.hold(args.name, weights + non_torch)
        replay.until((load_end(run) + profiling_moment(run)) / 2)
        device.hold(args.name, weights + non_torch + activation)
        replay.until(profiling_moment(run))
        free_now = device.free()
        others = (baseline - free_now) - (weights + non_torch + activation)
        if budget is None:
            run = profiled_outcome(run, requested, weights, activation, non_torch + others)
            kv_bytes = round(run.kv_cache_gib * GiB)
        else:
            run, kv_bytes = budgeted_outcome(run, budget), budget
        device.hold(args.name, weights + non_torch)
        events.write("profiled", free=free_now, others=others, kv_bytes=kv_bytes, kv_tokens=run.tokens,
                     budget=budget)
        replay.switch(run)
        if run.failure is not None:
            replay.until(math.inf)
            events.write("failed", reason=run.failure.reason)
            return 1
        if run.startup_plan is not None:
            if run.startup_plan != "applied":
                args.startup_plan.write_text(json.dumps({"kv_cache_memory_bytes": kv_bytes,
                                                         "free_memory_baseline": baseline}))
            events.write("startup_plan", outcome=run.startup_plan, kv_bytes=kv_bytes)
        replay.until(kv_allocated_at(run))
        events.write("allocated", free=device.free(), kv_bytes=kv_bytes)
        device.hold(args.name, weights + non_torch + kv_bytes)
        replay.until((kv_allocated_at(run) + init_done_at(run)) / 2)
        device.hold(args.name, weights + non_torch + kv_bytes + activation)
        replay.until(math.inf)
        block = run.effective_block_size
        events.write("serving", kv_bytes=kv_bytes, kv_tokens=run.tokens,
                     served_tokens=served_tokens(kv_bytes, block, args.kv_bytes_per_token),
                     serves_one_request=serves_one_request(kv_bytes, run.effective_max_model_len, block,
                                                           args.kv_bytes_per_token))
        held = weights + non_torch + kv_bytes + activation
        return serve_with_sleep_mode(device, args.name, run, replay, held, non_torch, events,
                                     args.wake_seconds * args.time_scale)
    finally:
        device.release(args.name)


def read_startup_plan(path: Path | None) -> dict | None:
    """The saved plan, or None when there is none (or it cannot be read: vLLM then profiles)."""
    if path is None:
        return None
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return plan if isinstance(plan, dict) and {"kv_cache_memory_bytes", "free_memory_baseline"} <= set(plan) else None


def startup_plan_outcome(plan: dict | None, free: int) -> str:
    """vLLM 0.34's rule: a saved plan applies only when free memory is at least the baseline it recorded."""
    if plan is None:
        return "saved"
    return "applied" if free >= plan["free_memory_baseline"] else "fallback"




def serve_with_sleep_mode(device: SharedDevice, name: str, run: VllmRun, replay: Replay, held: int, kept: int,
                          events: _EventLog, wake_seconds: float = 0.0) -> int:
    """Serve until SIGTERM; sleep (levels 1 and 2: `held` less the `kept` non-torch memory given back) and wake
    (all of it taken back in steps over `wake_seconds`, or out-of-memory) as the signals ask."""
    asleep = False
    while True:
        number = signal.sigwaitinfo(SLEEP_MODE_SIGNALS).si_signo  # SIGTERM's handler still ends the engine
        if number in SLEEP_SIGNALS and not asleep:
            free_before = device.free()
            device.hold(name, kept)
            free_after = device.free()
            asleep = True
            message = vllmlogs.sleep_message((free_after - free_before) / GiB, (device.total - free_after) / GiB)
            print(vllmlogs.engine_line(run, replay.began_at, time.monotonic() - replay.began, "gpu_worker.py:142",
                                       message).message, flush=True)
            events.write("slept", level=SLEEP_SIGNALS[number], freed=free_after - free_before)
        elif number == signal.SIGHUP and asleep:
            print(vllmlogs.api_line(run, replay.began_at, time.monotonic() - replay.began, "api_server.py:719",
                                    "wake up the engine with tags: None").message, flush=True)
            began = time.monotonic()
            for step in range(1, WEIGHT_STEPS + 1):
                free, needed = device.free(), (held - kept) // WEIGHT_STEPS
                if free < needed:
                    events.write("wake_failed", free=free, needed=needed)
                    print(f"torch.OutOfMemoryError: XPU out of memory. Tried to allocate {needed / GiB:.2f} GiB.",
                          flush=True)
                    return 1
                device.hold(name, kept + (held - kept) * step // WEIGHT_STEPS)
                time.sleep(wake_seconds / WEIGHT_STEPS)
            asleep = False
            took = vllmlogs.wake_message(time.monotonic() - began)
            print(vllmlogs.engine_line(run, replay.began_at, time.monotonic() - replay.began, "abstract.py:330",
                                       took).message, flush=True)
            events.write("woke", free=device.free())


class _EventLog:
    def __init__(self, path: Path | None, unit: str) -> None:
        self.path = path
        self.unit = unit

    def write(self, event: str, **fields: object) -> None:
        if self.path is None:
            return
        record = {"unit": self.unit, "pid": os.getpid(), "invocation": os.environ.get("INVOCATION_ID", ""),
                  "event": event, "at": time.time(), **fields}
        with open(self.path, "a", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")


def read_events(path: Path) -> list[dict]:
    """The records the engines appended to their --events file, in order ([] before the first)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def serving_units(events: Path) -> set[str]:
    """Units whose replayed engine has reached serving."""
    return {record["unit"] for record in read_events(events) if record["event"] == "serving"}


if __name__ == "__main__":
    sys.exit(main())
