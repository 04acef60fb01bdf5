"""One start of a watched unit: what its lines said, and the KV-cache and memory figures worked out from them.

`record` is the one place where a parsed vLLM line (`vllm_xpu_exporter.parsers.vllm`) becomes a start's fields:
a new line that changes a start is one case there (and, if it adds a figure, one field of `Start`). When a
start begins, ends and overlaps another is the fold's state machine (`vllm_xpu_exporter.fold.engine_starts`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from vllm_xpu_exporter.parsers import vllm
from vllm_xpu_exporter.parsers.vllm import FailureReason, StartupPlanOutcome

# journald stores a dying process's last lines and PID 1's record of its exit in no defined order
# (systemd#32716): a start systemd says failed waits this long for its root cause before it counts
# as `other`.
LATE_LINES_GRACE_USEC = 5_000_000
# vLLM V0 prints "# xpu blocks" and no token count; its CacheConfig default block size is 16.
V0_DEFAULT_BLOCK_SIZE = 16


class Outcome(StrEnum):
    """How a start ended."""

    OK = "ok"  # the engine initialised
    FAILED = "failed"  # counted by its FailureReason once the cause is known (or LATE_LINES_GRACE_USEC passed)
    STOPPED = "stopped"  # stopped on request during init: not a failure


@dataclass(eq=False)
class Start:
    """What one start of a unit printed, and how it ended."""

    began_usec: int
    printed: bool = False
    version: str | None = None
    model: str | None = None
    gpu_memory_utilization: float | None = None  # as given; None: the release default
    max_model_len: int | None = None  # the length the engine serves (after --max-model-len auto's fit)
    auto_fit_requested_max_model_len: int | None = None  # the model's full length, when auto-fit printed it
    context_shrunk: bool = False  # auto-fit served a shorter context than the model's full length
    max_num_seqs: int | None = None
    kv_cache_memory_bytes: int | None = None
    block_size: int | None = None
    kv_cache_bytes: int | None = None
    kv_cache_tokens: int | None = None
    kv_blocks: int | None = None
    max_concurrency: float | None = None
    required_bytes: int | None = None
    profiled_total_bytes: int | None = None
    profiled_peak_bytes: int | None = None
    # the non-KV memory, where the release prints it (the planner's footprint): "Model loading took"
    # (XPU 0.9.2-0.15.1: "model load takes"), and the 0.26+ start-up summary's peak activation and
    # non-torch (0.28+: weights + non-torch as one consumed figure); XPU 0.9.2-0.15.1's profiling non-torch
    weights_bytes: int | None = None
    activation_bytes: int | None = None
    non_torch_bytes: int | None = None
    consumed_bytes: int | None = None
    cudagraph_bytes: int | None = None
    device_total_bytes: int | None = None  # the device's total memory as the start printed it (2 decimals of GiB)
    init_duration_seconds: float | None = None
    # the free device memory the engine said it saw at its start, and when it printed it (the 0.26+ start-up
    # summary, the insufficient-free-memory failure, or the reserved-budget line of kv_cache_memory_bytes)
    seen_free_bytes: int | None = None
    seen_free_usec: int | None = None
    # vLLM's own startup plan (0.34): applied, else fell back, else saved; the budget it applied; whether it saved
    startup_plan: StartupPlanOutcome | None = None
    startup_plan_applied_bytes: int | None = None
    startup_plan_saved: bool = False
    # sleep mode, after the init: the latest "Sleep mode freed" line of this start, and when it came
    sleep_freed_bytes: int | None = None
    sleep_device_used_bytes: int | None = None
    slept_usec: int | None = None
    woke_usec: int | None = None  # its latest wake's end ("It took X seconds to wake up tags")
    pid: int | None = None  # the main process (journald's _PID of the unit's output)
    invocation_id: str = ""  # systemd's invocation id of the start; '' when the journal has none
    announced: bool = False  # systemd's "Starting" record of this start was read
    main_began_usec: int | None = None  # the main process started: the init began (None: not yet)
    process_gone: bool = False  # PID 1 said the start's processes are gone (exited, failed, stopped)
    outcome: Outcome | None = None  # None while initialising
    pending_since_usec: int | None = None  # failed per systemd; counted once its cause is known or late
    late_line_usec: int | None = None  # when a line of this start last came after its end
    initialising: bool = False  # the overlap window: from main_began_usec to the first KV line, done or failure
    overlapped: bool = False
    engine: bool | None = None  # runs a vLLM engine; None: not known yet (a possible init), False: does not

    def snapshot(self) -> Start:
        """A copy that the fold's later changes to this start do not reach. Every field holds an
        immutable value, so copying the instance's dict is a full copy (and ~30 times cheaper than
        dataclasses.replace, which a scrape did for every unit's starts)."""
        copy = object.__new__(Start)
        copy.__dict__.update(self.__dict__)
        return copy

    @property
    def asleep_bytes(self) -> int | None:
        """What the engine's wake takes back while it sleeps (it went to sleep, has not printed a wake since and
        still runs); None when it is awake or gone."""
        if self.slept_usec is None or self.process_gone or not self.sleep_freed_bytes or self.sleep_freed_bytes <= 0:
            return None
        if self.woke_usec is not None and self.woke_usec >= self.slept_usec:
            return None
        return self.sleep_freed_bytes

    def awaits_late_lines(self, now_usec: int) -> bool:
        """Whether lines of this start's process may still arrive: its failure waits for its cause, or
        its cause came late just now (the copies vLLM prints follow)."""
        return self.pending_since_usec is not None or (
            self.late_line_usec is not None and now_usec - self.late_line_usec <= LATE_LINES_GRACE_USEC)

    @property
    def requested_max_model_len(self) -> int | None:
        """What the start asked for: the model's full length when `--max-model-len auto` fitted it
        (auto-fit's "reduced from X"), else the maximum model length it printed."""
        if self.auto_fit_requested_max_model_len is not None:
            return self.auto_fit_requested_max_model_len
        return self.max_model_len

    @property
    def effective_gpu_memory_utilization(self) -> float | None:
        if self.gpu_memory_utilization is not None:
            return self.gpu_memory_utilization
        return vllm.default_gpu_memory_utilization(self.version) if self.version else None

    @property
    def effective_kv_cache_bytes(self) -> int | None:
        if self.kv_cache_bytes is not None:
            return self.kv_cache_bytes
        utilisation = self.effective_gpu_memory_utilization
        if None not in (self.profiled_total_bytes, self.profiled_peak_bytes, utilisation):
            return vllm.kv_cache_bytes_from_profiling(self.profiled_total_bytes, utilisation,
                                                      self.profiled_peak_bytes)
        return None

    @property
    def startup_plan_bytes(self) -> int | None:
        """The KV budget of vLLM's startup plan this start ran on (applied) or saved (its own KV budget)."""
        if self.startup_plan is StartupPlanOutcome.APPLIED:
            return self.startup_plan_applied_bytes
        return self.effective_kv_cache_bytes if self.startup_plan_saved else None

    @property
    def effective_kv_cache_tokens(self) -> int | None:
        if self.kv_cache_tokens is not None:
            return self.kv_cache_tokens
        if self.kv_blocks is not None:
            tokens = self.kv_blocks * (self.block_size or V0_DEFAULT_BLOCK_SIZE)
            return tokens if vllm.plausible("kv_cache_tokens", tokens) else None
        return None

    @property
    def effective_required_bytes(self) -> int | None:
        if self.required_bytes is not None:
            return self.required_bytes
        kv_bytes = self.effective_kv_cache_bytes
        if self.outcome is Outcome.OK and kv_bytes is not None and self.max_concurrency:
            required = math.ceil(kv_bytes / self.max_concurrency)
            return required if vllm.plausible("needed_bytes", required) else None
        return None


def record(start: Start, event: vllm.Event) -> None:
    """Copy what a line says into the start it belongs to."""
    match event:
        case vllm.ServerVersion(version=version, model=model):
            start.version = version
            start.model = model or start.model
        case vllm.EngineConfig(version=version, model=model, max_model_len=max_model_len):
            start.version = version
            start.model = model or start.model
            start.max_model_len = max_model_len or start.max_model_len
        case vllm.Settings():
            for name in ("model", "gpu_memory_utilization", "max_model_len", "max_num_seqs",
                         "kv_cache_memory_bytes", "block_size"):
                value = getattr(event, name)
                if value is not None and (name != "max_model_len" or start.max_model_len is None):
                    setattr(start, name, value)
        case vllm.KvCacheMemory(kv_cache_bytes=kv_cache_bytes):
            start.kv_cache_bytes = kv_cache_bytes
            if start.seen_free_bytes is None:
                start.seen_free_bytes = event.initial_free_bytes
        case vllm.ProfilingBefore(total_bytes=total_bytes, model_load_bytes=model_load_bytes):
            start.profiled_total_bytes = total_bytes
            start.weights_bytes = start.weights_bytes or model_load_bytes
        case vllm.ProfilingAfter(peak_bytes=peak_bytes, non_torch_bytes=non_torch_bytes):
            start.profiled_peak_bytes = peak_bytes
            start.non_torch_bytes = non_torch_bytes
        case vllm.ModelWeights(weights_bytes=weights_bytes):
            start.weights_bytes = weights_bytes
        case vllm.MemoryUsage():
            start.activation_bytes = event.activation_bytes
            start.cudagraph_bytes = event.cudagraph_bytes
            start.weights_bytes = event.weights_bytes if event.weights_bytes is not None else start.weights_bytes
            start.non_torch_bytes = event.non_torch_bytes if event.non_torch_bytes is not None else start.non_torch_bytes
            start.consumed_bytes = event.consumed_bytes
            if start.seen_free_bytes is None:
                start.seen_free_bytes = event.free_bytes
            start.device_total_bytes = event.total_bytes or start.device_total_bytes
        case vllm.KvCacheCapacity(tokens=tokens, max_model_len=max_model_len, max_concurrency=concurrency):
            start.kv_cache_tokens = tokens if tokens is not None else start.kv_cache_tokens
            start.max_concurrency = concurrency if concurrency is not None else start.max_concurrency
            start.max_model_len = start.max_model_len or max_model_len
        case vllm.MaxModelLenAutoFit(requested_max_model_len=requested, max_model_len=max_model_len):
            start.auto_fit_requested_max_model_len = requested
            start.max_model_len = max_model_len  # the effective length; earlier lines printed the full one
        case vllm.StartupPlan(outcome=StartupPlanOutcome.APPLIED):
            start.startup_plan = StartupPlanOutcome.APPLIED
            start.startup_plan_applied_bytes = event.kv_cache_memory_bytes
        case vllm.StartupPlan(outcome=StartupPlanOutcome.FALLBACK):
            start.startup_plan = StartupPlanOutcome.FALLBACK
        case vllm.StartupPlan(outcome=StartupPlanOutcome.SAVED):
            start.startup_plan_saved = True
            start.startup_plan = start.startup_plan or StartupPlanOutcome.SAVED
        case vllm.SleepFreed(freed_bytes=freed, device_used_bytes=used):
            start.sleep_freed_bytes = freed
            start.sleep_device_used_bytes = used
        case vllm.KvCacheBlocks(device_blocks=blocks):
            start.kv_blocks = blocks
        case vllm.EngineInitDone(duration_seconds=seconds):
            start.init_duration_seconds = seconds
        case vllm.FailureCause():
            start.max_model_len = start.max_model_len or event.max_model_len
            if event.reason is FailureReason.INSUFFICIENT_FREE_MEMORY and start.seen_free_bytes is None:
                start.seen_free_bytes = event.free_bytes
            start.device_total_bytes = event.total_bytes or start.device_total_bytes
            if event.available_bytes is not None:
                start.kv_cache_bytes = event.available_bytes
            if event.needed_bytes is not None:
                start.required_bytes = event.needed_bytes
            if event.gpu_memory_utilization is not None and start.gpu_memory_utilization is None:
                start.gpu_memory_utilization = event.gpu_memory_utilization
