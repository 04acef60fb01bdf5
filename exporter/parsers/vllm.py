"""The vLLM startup-log grammar (vLLM 0.6 to 0.34): one journal line in, one event or None out.

The folds feed it every line a watched workload printed, one physical line at a time: a journal entry's
MESSAGE of a unit (`fold/engine_starts.py`) or a container's log record (`fold/container_runs.py`). The parser is stateless: folding events into per-start state is the reducer's job.

Normalisation (`normalise`), in this order:
  * the line is cut to `MAX_LINE_CHARS` (no regex ever sees more);
  * ANSI colour codes are removed (0.10.1-0.15 colour the "(Proc pid=N)" prefix even under systemd);
  * the "(EngineCore_DP0 pid=N) " / "(EngineCore_0 pid=N) " / "(EngineCore pid=N) " /
    "(APIServer pid=N) " prefix (any "(Name pid=N) ") is removed;
  * the logger header is removed: "INFO 05-12 10:11:12 file.py:122] " (0.6-0.7) and
    "INFO 05-12 10:11:12 [file.py:122] " (0.8+, also "[v1/engine/core.py:1195]" relative paths);
  * surrounding whitespace goes (raw traceback copies can be indented);
  * one exception-class prefix goes: "ValueError: ", "RuntimeError: ", "torch.OutOfMemoryError: ".
Every template is then matched at the START of the normalised message, so the same words quoted
inside a request log, or echoed as source code in a traceback frame (`raise ValueError("No
available ...`), do not match. The only exception is UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY, which
SYCL/Level Zero put in the middle of several different messages.

Duplicates: vLLM prints the root cause of a failed start at least twice (logger.exception with a
header, then the raw multiprocessing copy without one; V0 also logs the exception text itself).
After normalisation the copies are the same text, so they parse to EQUAL events (`==`, `hash`).
Deduplication is per start and belongs to the reducer: count a start's failure once, whatever
number of `FailureCause` events it saw. When a start shows different causes, the first one is its
root cause: the first cause ends the start, and the fold (exporter/fold/engine_starts.py) counts it
once, under that cause's reason and with its figures; later causes and wrappers of the same start
change nothing.

Units: vLLM's GiB and the "GB" of 0.7-0.8.0 are 2**30 bytes, its MB are 2**20 bytes. Byte values
are ints, rounded to the nearest byte from the printed figure (3.36 GiB -> round(3.36 * 2**30)).

Plausible values: anything that can write to a unit's stdout can print these lines, so every figure
of an event is checked against `PLAUSIBLE` (one table: field -> bounds) and every text is checked to
be valid UTF-8 before the event is returned. A line with a figure out of range (or not finite) is
ignored as a whole, as if vLLM had not printed it: `parse_line` returns an `ImplausibleValue` naming
the row and field, which the reducer counts instead of recording.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Union

from vllm_xpu_exporter.parsers.bounds import MAX_BYTES, MAX_SECONDS, MAX_TOKENS

__all__ = [
    "MAX_LINE_CHARS",
    "EngineConfig",
    "EngineInitDone",
    "Event",
    "FailureCause",
    "FailureReason",
    "FailureWrapper",
    "GRAMMAR",
    "Bounds",
    "GrammarRow",
    "KvCacheBlocks",
    "KvCacheCapacity",
    "KvCacheMemory",
    "KvMemorySource",
    "ImplausibleValue",
    "MaxModelLenAutoFit",
    "MemoryUsage",
    "ModelWeights",
    "PLAUSIBLE",
    "ProfilingAfter",
    "ProfilingBefore",
    "ServerReady",
    "ServerVersion",
    "Settings",
    "SettingsSource",
    "SleepFreed",
    "StartupPlan",
    "StartupPlanOutcome",
    "Woke",
    "WrapperKind",
    "default_gpu_memory_utilization",
    "kv_cache_bytes_from_profiling",
    "normalise",
    "parse_line",
    "plausible",
]

# No template we need is longer than a few KiB; the cap bounds every regex's work on hostile lines.
MAX_LINE_CHARS = 32 * 1024
# ast.literal_eval of "non-default args" is only tried below this size; above it the per-key
# fallback (linear regex) reads the settings.
_MAX_LITERAL_CHARS = 16 * 1024

_GIB = 1 << 30
_MIB = 1 << 20
_KIB = 1 << 10
_BYTES_PER_UNIT = {"GiB": _GIB, "GB": _GIB, "MiB": _MIB, "MB": _MIB, "KiB": _KIB, "bytes": 1}


# ---------------------------------------------------------------------------------------------
# Event model
# ---------------------------------------------------------------------------------------------


class FailureReason(StrEnum):
    """The contract's `reason` label values. The parser never emits OTHER: the reducer assigns it
    to a failed start for which no `FailureCause` was seen."""

    KV_CACHE_TOO_SMALL = "kv_cache_too_small"
    NO_KV_CACHE_MEMORY = "no_kv_cache_memory"
    INSUFFICIENT_FREE_MEMORY = "insufficient_free_memory"
    DEVICE_OUT_OF_MEMORY = "device_out_of_memory"
    MEMORY_QUERY_UNSUPPORTED = "memory_query_unsupported"
    OTHER = "other"


class SettingsSource(StrEnum):
    NON_DEFAULT_ARGS = "non_default_args"  # only the arguments the user gave (0.9.0+)
    ARGS_NAMESPACE = "args_namespace"  # every argument, defaults included (0.6-0.8)
    SERVER_BANNER = "server_banner"  # the model line of the 0.15+ start-up banner


class KvMemorySource(StrEnum):
    AVAILABLE = "available"  # "Available KV cache memory: X GiB" (profiled budget)
    RESERVED = "reserved"  # kv_cache_memory_bytes reservation, profiling skipped


class StartupPlanOutcome(StrEnum):
    """What vLLM's own startup plan (0.34, VLLM_ENABLE_STARTUP_PLAN=1) did at a start."""

    APPLIED = "applied"  # a saved plan's KV budget was used, memory profiling skipped
    FALLBACK = "fallback"  # free memory was below the plan's baseline: profiled as if there were no plan
    SAVED = "saved"  # a profiled start saved its KV budget and free memory as the plan


class WrapperKind(StrEnum):
    # Engine side; printed BEFORE the traceback that holds the root cause.
    ENGINE_CORE_FAILED_TO_START = "engine_core_failed_to_start"  # 0.8.5+
    ENGINE_CORE_HIT_EXCEPTION = "engine_core_hit_exception"  # 0.7.0-0.8.3
    # Front-end side; printed AFTER the root cause, the last word of a failed start.
    ENGINE_CORE_INIT_FAILED = "engine_core_init_failed"  # "Engine core initialization failed" 0.8.5+
    ENGINE_CORE_PROC_INIT_FAILED = "engine_core_proc_init_failed"  # "EngineCore initialization failed" 0.7.0-0.8.3
    FRONTEND_INIT_FAILED = "frontend_init_failed"  # 0.34
    ENGINE_PROCESS_FAILED_TO_START = "engine_process_failed_to_start"  # V0 0.6.3-0.10


_TERMINAL_WRAPPERS = frozenset(
    {
        WrapperKind.ENGINE_CORE_INIT_FAILED,
        WrapperKind.ENGINE_CORE_PROC_INIT_FAILED,
        WrapperKind.FRONTEND_INIT_FAILED,
        WrapperKind.ENGINE_PROCESS_FAILED_TO_START,
    }
)


@dataclass(frozen=True, slots=True)
class ServerVersion:
    """The API server announced itself: "vLLM API server version X" (0.6-0.14), the banner's
    "version X" line (0.15+), or "vLLM server version X, serving model M" (banner disabled)."""

    version: str
    model: str | None = None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """"Initializing an LLM engine (vX) with config: model='M', ..., max_seq_len=N, ..." (0.6-0.7 V0),
    "Initializing a V0 LLM engine (vX) ..." (0.8-0.10), "Initializing a V1 LLM engine (vX) ..." (0.7+).
    `max_model_len` is the engine's effective maximum model length (printed as max_seq_len)."""

    version: str
    engine: str  # "V0" or "V1"
    model: str | None
    max_model_len: int | None


@dataclass(frozen=True, slots=True)
class Settings:
    """Engine arguments as printed. None = this line did not state the value. With
    NON_DEFAULT_ARGS, an absent key means the release's default applies (see
    `default_gpu_memory_utilization`); with ARGS_NAMESPACE every argument is listed, and None
    means the argument was None (e.g. max_model_len=None: derived from the model)."""

    source: SettingsSource
    model: str | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    kv_cache_memory_bytes: int | None = None
    block_size: int | None = None


@dataclass(frozen=True, slots=True)
class KvCacheMemory:
    """KV-cache bytes of this init: "Available KV cache memory: X GiB" (0.9.1+; on XPU 0.16+; can be
    negative) or "Initial free memory F GiB, reserved K GiB memory for KV Cache as specified by
    kv_cache_memory_bytes config ..." (0.10.2+; on XPU 0.16+)."""

    kv_cache_bytes: int
    source: KvMemorySource
    initial_free_bytes: int | None = None  # RESERVED only


@dataclass(frozen=True, slots=True)
class ProfilingBefore:
    """XPU V1 0.9.2-0.15.1: "Before memory profiling run, total GPU memory: T MB, model load takes
    W MB, free gpu memory is F MB." See `kv_cache_bytes_from_profiling`."""

    total_bytes: int
    model_load_bytes: int
    free_bytes: int


@dataclass(frozen=True, slots=True)
class ProfilingAfter:
    """XPU V1 0.9.2-0.15.1: "After memory profiling run, peak memory usage is P MB,torch mem is ...
    MB, non-torch mem is ... MB, free gpu memory is F MB." See `kv_cache_bytes_from_profiling`."""

    peak_bytes: int
    torch_bytes: int
    non_torch_bytes: int
    free_bytes: int


@dataclass(frozen=True, slots=True)
class ModelWeights:
    """The device memory of the model's weights: "Model loading took W GiB [memory ]and S seconds" (V1
    0.8.3+; "%.4f" to 0.13, format_gib after) or V0's "Loading model weights took W GB|GiB"."""

    weights_bytes: int


@dataclass(frozen=True, slots=True)
class MemoryUsage:
    """The start-up memory summary (gpu_worker.compile_or_warm_up_model; INFO on XPU from 0.26, when no
    kv_cache_memory_bytes is set): "Free memory on device (F/T GiB) on startup. Desired GPU memory
    utilization is (U, R GiB). Actual usage is W GiB for weight, A GiB for peak activation, N GiB for
    non-torch memory, and C GiB for CUDAGraph memory. ..." (0.26-0.27); from 0.28 "X GiB for consumed
    memory (weights + non-torch), A GiB for peak activation, and C GiB for CUDAGraph memory"."""

    activation_bytes: int
    cudagraph_bytes: int
    weights_bytes: int | None = None  # 0.26-0.27
    non_torch_bytes: int | None = None  # 0.26-0.27
    consumed_bytes: int | None = None  # weights + non-torch, 0.28+
    free_bytes: int | None = None  # the free device memory the engine saw at its start ("F/T GiB")
    total_bytes: int | None = None  # the device's total memory ("F/T GiB"), 2 decimals


@dataclass(frozen=True, slots=True)
class KvCacheCapacity:
    """"GPU KV cache size: N tokens" (0.8-0.27, separate line), "Maximum concurrency for L tokens per
    request: Cx" (V0 0.6.3-0.10 and V1 0.8-0.27, separate line), or both on one line
    "GPU|XPU[ + host] KV cache size: N tokens, Maximum concurrency for L tokens per request: Cx"
    (0.28+). Fields a line does not carry are None."""

    tokens: int | None
    max_model_len: int | None
    max_concurrency: float | None
    device: str | None  # "GPU", "XPU", "XPU + host"; None on a concurrency-only line


@dataclass(frozen=True, slots=True)
class KvCacheBlocks:
    """V0: "# GPU blocks: N, # CPU blocks: M" (0.6.x) / "# xpu blocks: N, # CPU blocks: M" (0.7-0.10).
    KV tokens = device_blocks x block size (`Settings.block_size`, else the platform default)."""

    device: str  # as printed: "GPU", "xpu"
    device_blocks: int
    cpu_blocks: int


@dataclass(frozen=True, slots=True)
class MaxModelLenAutoFit:
    """`--max-model-len auto` (max_model_len -1, 0.14+) fitted the context to the KV-cache memory
    (v1/core/kv_cache_utils.py `_auto_fit_max_model_len`; kv_cache_planning.py from 0.33):
    "Auto-fit max_model_len: reduced from X to Y to fit in available GPU memory (A GiB available for
    KV cache)" (0.14-0.31; "... available KV cache memory (A GiB XPU)" 0.32-0.33; "--max-model-len auto
    reduced max_model_len from X to Y (A GiB XPU available for the KV cache)." 0.34), "... full model
    context length X fits in available GPU memory" ("... KV cache memory (A GiB XPU)" 0.32+) or
    "... attention-free model, using derived max_model_len=X". `requested_max_model_len` is the model's full length (what
    was asked), `max_model_len` the length the engine serves; a shrink when the second is smaller."""

    requested_max_model_len: int
    max_model_len: int
    available_bytes: int | None = None  # the KV-cache memory it fitted to, when printed

    @property
    def shrunk(self) -> bool:
        return self.max_model_len < self.requested_max_model_len


@dataclass(frozen=True, slots=True)
class StartupPlan:
    """vLLM's own startup plan (0.34, `VLLM_ENABLE_STARTUP_PLAN=1`; v1/worker/startup_plan.py), one of:
    "Applying persisted startup plan (fingerprint F): kv_cache_memory_bytes=N (G GiB), recorded free-memory
    baseline ..., current .... Memory profiling will be skipped." (APPLIED, the plan's budget);
    "Startup plan not applied: current free memory (X GiB) is below the recorded baseline (Y GiB); falling
    back to full memory profiling." (FALLBACK, the free memory now and at the plan's start);
    "Saved startup plan to PATH" (SAVED: the start's own KV budget became the plan)."""

    outcome: StartupPlanOutcome
    kv_cache_memory_bytes: int | None = None  # APPLIED
    free_bytes: int | None = None  # FALLBACK
    baseline_free_bytes: int | None = None  # FALLBACK


@dataclass(frozen=True, slots=True)
class SleepFreed:
    """"Sleep mode freed X GiB memory, Y GiB memory is still in use." (sleep mode: `POST /sleep?level=1|2`;
    on XPU 0.34). `freed_bytes` is what the engine released (the free memory after its sleep less the free
    memory before it), `device_used_bytes` the device's whole used memory after it (total less free: every
    process's, not the engine's alone). Waking takes `freed_bytes` back (`Woke` says when it is done)."""

    freed_bytes: int
    device_used_bytes: int


@dataclass(frozen=True, slots=True)
class Woke:
    """"It took X seconds to wake up tags {...}." (sleep mode: the executor, once `POST /wake_up` has taken the
    weights and the KV cache back; before it the API server printed "wake up the engine with tags: ..."). The
    wake is over: the engine holds again what its sleep freed. A wake that fails prints no such line."""

    wake_seconds: float


@dataclass(frozen=True, slots=True)
class EngineInitDone:
    """"init engine (profile, create kv cache, warmup model) took X seconds" (V0 0.6.5-0.10, V1 to
    0.19) / "... took X s[ (compilation: C s[ — ...])]" (0.20+). The engine init succeeded."""

    duration_seconds: float
    compilation_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class ServerReady:
    """uvicorn's "Application startup complete." (every release): the API server is serving. The only
    success signal of 0.6.1-0.6.4, which print no init duration."""


@dataclass(frozen=True, slots=True)
class FailureCause:
    """A root cause of a failed engine init, classified. Which optional fields a reason fills:
    kv_cache_too_small: max_model_len; V1 template: needed_bytes, available_bytes (may be negative),
        estimated_max_model_len (when printed); V0 template: kv_cache_tokens (what fits);
    insufficient_free_memory: free_bytes, total_bytes, gpu_memory_utilization, requested_bytes
        (util x total as vLLM printed it), device ("xpu:0"; absent before 0.14);
    device_out_of_memory: requested_bytes ("Tried to allocate"), total_bytes, free_bytes (PyTorch's
        XPU OOM text; nothing for the UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY forms);
    memory_query_unsupported: device (the device name);
    no_kv_cache_memory: nothing."""

    reason: FailureReason
    max_model_len: int | None = None
    needed_bytes: int | None = None
    available_bytes: int | None = None
    estimated_max_model_len: int | None = None
    kv_cache_tokens: int | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    requested_bytes: int | None = None
    device: str | None = None


@dataclass(frozen=True, slots=True)
class FailureWrapper:
    """A wrapper vLLM prints around a failed init; never a reason by itself. `terminal` wrappers come
    from the front end after the root cause and end the failed start; the others are the engine's
    "EngineCore failed to start." / "EngineCore hit an exception" that PRECEDE the root cause."""

    kind: WrapperKind

    @property
    def terminal(self) -> bool:
        return self.kind in _TERMINAL_WRAPPERS


Event = Union[
    ServerVersion,
    EngineConfig,
    Settings,
    KvCacheMemory,
    ProfilingBefore,
    ProfilingAfter,
    ModelWeights,
    MemoryUsage,
    KvCacheCapacity,
    KvCacheBlocks,
    MaxModelLenAutoFit,
    StartupPlan,
    SleepFreed,
    Woke,
    EngineInitDone,
    ServerReady,
    FailureCause,
    FailureWrapper,
]


@dataclass(frozen=True, slots=True)
class ImplausibleValue:
    """A line of a known template that is ignored: its `field` is not a finite number within
    `PLAUSIBLE[field]` (or a text that is not valid UTF-8). Never an event of a start."""

    row: str  # the grammar row whose template the line matched
    field: str


# ---------------------------------------------------------------------------------------------
# Plausible values: one table, field -> bounds
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bounds:
    """The closed range [low, high], or (low, high] when `low_open`. NaN is in no range."""

    low: float
    high: float
    low_open: bool = False

    def admit(self, value: float) -> bool:
        above_low = self.low < value if self.low_open else self.low <= value
        return above_low and value <= self.high


_BYTES = Bounds(0, MAX_BYTES)
# Budgets that vLLM prints negative when the peak exceeded them; the magnitude is still bounded.
_SIGNED_BYTES = Bounds(-MAX_BYTES, MAX_BYTES)
_TOKENS = Bounds(0, MAX_TOKENS)
_SECONDS = Bounds(0, MAX_SECONDS)

# Every int or float field of every event, by name (a field of the same name means the same thing in
# every event). `parse_line` ignores a line with a figure outside its field's bounds.
PLAUSIBLE: Mapping[str, Bounds] = {
    # settings
    "gpu_memory_utilization": Bounds(0, 1, low_open=True),
    "max_model_len": Bounds(1, MAX_TOKENS),
    "requested_max_model_len": Bounds(1, MAX_TOKENS),
    "max_num_seqs": Bounds(1, 1 << 24),
    "kv_cache_memory_bytes": _BYTES,
    "block_size": Bounds(1, 1 << 20),
    # KV-cache memory; "available" can be negative (vLLM then fails or says so)
    "kv_cache_bytes": _SIGNED_BYTES,
    "available_bytes": _SIGNED_BYTES,
    "initial_free_bytes": _BYTES,
    "needed_bytes": _BYTES,
    "requested_bytes": _BYTES,
    "free_bytes": _BYTES,
    "total_bytes": _BYTES,
    # profiling (XPU V1 0.9.2-0.15.1); non-torch = used - torch-allocated, negative when torch counts more
    "model_load_bytes": _BYTES,
    "peak_bytes": _BYTES,
    "torch_bytes": _BYTES,
    "non_torch_bytes": _SIGNED_BYTES,
    # weights and the start-up memory summary (0.26+)
    "weights_bytes": _BYTES,
    "activation_bytes": _BYTES,
    "cudagraph_bytes": _BYTES,
    "consumed_bytes": _SIGNED_BYTES,
    # vLLM's startup plan (0.34) and sleep mode
    "baseline_free_bytes": _BYTES,
    "freed_bytes": _SIGNED_BYTES,  # free after less free before: a co-tenant that grew meanwhile makes it negative
    "device_used_bytes": _BYTES,
    "wake_seconds": _SECONDS,
    # KV-cache capacity
    "tokens": _TOKENS,
    "kv_cache_tokens": _TOKENS,
    "estimated_max_model_len": _TOKENS,
    "max_concurrency": _TOKENS,
    "device_blocks": _TOKENS,
    "cpu_blocks": _TOKENS,
    # init outcome
    "duration_seconds": _SECONDS,
    "compilation_seconds": _SECONDS,
}


def plausible(field: str, value: float) -> bool:
    """Whether `value` is within the bounds of `field` (also for values the reducer derives)."""
    return PLAUSIBLE[field].admit(value)


def _implausible_field(event: Event) -> str | None:
    """The first field of the event that is out of its bounds, or a text that is not valid UTF-8."""
    for field in dataclasses.fields(event):
        value = getattr(event, field.name)
        if isinstance(value, str):
            if not (value.isascii() or _utf8_encodable(value)):
                return field.name
        elif isinstance(value, (int, float)) and not plausible(field.name, value):
            return field.name
    return None


def _utf8_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, e.g. from a '\udcff' escape in a logged dict
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Pure helpers for the reducer
# ---------------------------------------------------------------------------------------------


def kv_cache_bytes_from_profiling(
    total_bytes: int, gpu_memory_utilization: float, peak_bytes: int
) -> int:
    """KV-cache bytes of an XPU V1 init of 0.9.2-0.15.1, which prints no "Available KV cache memory".

    That worker (`v1/worker/xpu_worker.py::determine_available_memory`) budgets
    `total_gpu_memory * gpu_memory_utilization - peak_memory`; feed it
    `ProfilingBefore.total_bytes`, the start's utilisation (given or
    `default_gpu_memory_utilization`) and `ProfilingAfter.peak_bytes`. The result can be negative
    (vLLM then fails with no_kv_cache_memory). Rounded to the nearest byte; the inputs were
    printed to 0.01 MB, so the result is that precise.
    """
    return round(total_bytes * gpu_memory_utilization - peak_bytes)


_VERSION_MAJOR_MINOR = re.compile(r"v?(\d{1,4})\.(\d{1,4})")


def default_gpu_memory_utilization(version: str) -> float | None:
    """The `gpu_memory_utilization` a vLLM release uses when none is given (config/cache.py):
    0.9 through 0.19.x, 0.92 from 0.20.0 (0.34's None resolves to 0.92 on XPU: the extensible
    KV cache that would make it 1.0 is CUDA/ROCm only). None for an unparseable version."""
    match = _VERSION_MAJOR_MINOR.match(version.strip())
    if match is None:
        return None
    major, minor = int(match[1]), int(match[2])
    return 0.9 if (major, minor) < (0, 20) else 0.92


# ---------------------------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PROCESS_PREFIX = re.compile(r"\([A-Za-z][\w.-]{0,63} pid=\d{1,10}\)(?: |$)")
_LOG_HEADER = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})? "
    r"\[?[^\s\]]{1,256}:\d{1,7}\](?: |$)"
)
_LEVEL_INITIALS = frozenset("DIWEC")
_EXCEPTION_CLASS = re.compile(r"[A-Za-z_][\w.]{0,100}(?:Error|Exception): ")


def normalise(message: str) -> str:
    """The message text vLLM logged, without colour, process prefix, log header or exception class."""
    text = message[:MAX_LINE_CHARS]
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    text = text.strip()
    if text.startswith("("):
        prefix = _PROCESS_PREFIX.match(text)
        if prefix is not None:
            text = text[prefix.end() :].lstrip()
    if text[:1] in _LEVEL_INITIALS:
        header = _LOG_HEADER.match(text)
        if header is not None:
            text = text[header.end() :].lstrip()
    exception_class = _EXCEPTION_CLASS.match(text)
    if exception_class is not None:
        text = text[exception_class.end() :]
    return text


# ---------------------------------------------------------------------------------------------
# Value helpers
# ---------------------------------------------------------------------------------------------

# Bounded quantifiers only: no number can be long enough to hit int()'s digit limit.
_NUM = r"-?\d{1,15}(?:\.\d{1,15})?"
_INT = r"\d[\d,]{0,24}"  # "131072" (V0, error texts) or "1,880,320" (V1 token counts)
_SIZE_UNIT = r"bytes|KiB|MiB|GiB"


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _optional_int(text: str | None) -> int | None:
    return None if text is None else _int(text)


def _bytes(number: str, unit: str) -> int:
    return round(float(number) * _BYTES_PER_UNIT[unit])


def _optional_bytes(number: str | None, unit: str | None) -> int | None:
    if number is None or unit is None:
        return None
    return _bytes(number, unit)


def _optional_float(text: str | None) -> float | None:
    return None if text is None else float(text)


# ---------------------------------------------------------------------------------------------
# Settings: "non-default args: {...}" and "args: Namespace(...)"
# ---------------------------------------------------------------------------------------------

_SETTING_KEYS = (
    "model",
    "model_tag",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "kv_cache_memory_bytes",
    "block_size",
)
_KEY_ALTERNATION = "|".join(_SETTING_KEYS)
_SCALAR = r"'[^']{0,4096}'|\"[^\"]{0,4096}\"|[-\w.+]{1,64}"
_DICT_ITEM = re.compile(rf"[{{,]\s?'({_KEY_ALTERNATION})':\s?({_SCALAR})")
_NAMESPACE_ITEM = re.compile(rf"[(,]\s?({_KEY_ALTERNATION})=({_SCALAR})")


def _literal(text: str) -> object:
    """A Python literal, or None when the text is not one (a repr like PosixPath('...'))."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "invalid escape sequence" in a logged string
            return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _scalar_items(pattern: re.Pattern[str], text: str) -> dict[str, object]:
    """First occurrence of each wanted key, its value read as a literal."""
    values: dict[str, object] = {}
    for item in pattern.finditer(text):
        values.setdefault(item[1], _literal(item[2]))
    return values


def _number(value: object) -> float | None:
    """An int or float setting as a float (an int too big for one: inf, which no bounds admit)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _settings_from(values: Mapping[str, object], source: SettingsSource) -> Settings:
    model = values.get("model")
    if not isinstance(model, str):
        model = values.get("model_tag")
    budget = values.get("kv_cache_memory_bytes")
    return Settings(
        source=source,
        model=model if isinstance(model, str) and model else None,
        gpu_memory_utilization=_number(values.get("gpu_memory_utilization")),
        max_model_len=_positive_int(values.get("max_model_len")),
        max_num_seqs=_positive_int(values.get("max_num_seqs")),
        kv_cache_memory_bytes=(
            budget
            if isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0
            else None
        ),
        block_size=_positive_int(values.get("block_size")),
    )


def _non_default_args(match: re.Match[str]) -> Settings:
    text = match["dict"]
    parsed = _literal(text) if len(text) <= _MAX_LITERAL_CHARS else None
    if not isinstance(parsed, dict):
        parsed = _scalar_items(_DICT_ITEM, text)
    return _settings_from(parsed, SettingsSource.NON_DEFAULT_ARGS)


def _args_namespace(match: re.Match[str]) -> Settings:
    return _settings_from(
        _scalar_items(_NAMESPACE_ITEM, match["body"]), SettingsSource.ARGS_NAMESPACE
    )


# ---------------------------------------------------------------------------------------------
# Builders, one per template family
# ---------------------------------------------------------------------------------------------

_MAX_SEQ_LEN = re.compile(r"\bmax_seq_len=(\d{1,12})")


def _engine_config(match: re.Match[str]) -> EngineConfig:
    max_seq_len = _MAX_SEQ_LEN.search(match.string, match.end())
    model = match["model"] if match["model"] is not None else match["model_dq"]
    return EngineConfig(
        version=match["version"],
        engine=match["engine"] or "V0",
        model=model or None,
        max_model_len=int(max_seq_len[1]) if max_seq_len else None,
    )


def _server_version(match: re.Match[str]) -> ServerVersion:
    groups = match.groupdict()
    model = groups.get("model")
    return ServerVersion(version=match["version"], model=model.strip() if model else None)


def _banner_model(match: re.Match[str]) -> Settings:
    return Settings(source=SettingsSource.SERVER_BANNER, model=match["model"].strip())


def _kv_available(match: re.Match[str]) -> KvCacheMemory:
    return KvCacheMemory(_bytes(match["kv"], match["unit"]), KvMemorySource.AVAILABLE)


def _kv_reserved(match: re.Match[str]) -> KvCacheMemory:
    return KvCacheMemory(
        kv_cache_bytes=_bytes(match["kv"], "GiB"),
        source=KvMemorySource.RESERVED,
        initial_free_bytes=_bytes(match["free"], "GiB"),
    )


def _profiling_before(match: re.Match[str]) -> ProfilingBefore:
    return ProfilingBefore(
        total_bytes=_bytes(match["total"], "MB"),
        model_load_bytes=_bytes(match["load"], "MB"),
        free_bytes=_bytes(match["free"], "MB"),
    )


def _profiling_after(match: re.Match[str]) -> ProfilingAfter:
    return ProfilingAfter(
        peak_bytes=_bytes(match["peak"], "MB"),
        torch_bytes=_bytes(match["torch"], "MB"),
        non_torch_bytes=_bytes(match["non_torch"], "MB"),
        free_bytes=_bytes(match["free"], "MB"),
    )


def _model_weights(match: re.Match[str]) -> ModelWeights:
    return ModelWeights(_bytes(match["weights"], match["unit"]))


def _memory_usage(match: re.Match[str]) -> MemoryUsage:
    return MemoryUsage(
        activation_bytes=_bytes(match["activation"] or match["activation_c"], "GiB"),
        cudagraph_bytes=_bytes(match["cudagraph"], "GiB"),
        weights_bytes=_optional_bytes(match["weights"], "GiB"),
        non_torch_bytes=_optional_bytes(match["non_torch"], "GiB"),
        consumed_bytes=_optional_bytes(match["consumed"], "GiB"),
        free_bytes=_bytes(match["free"], "GiB"),
        total_bytes=_bytes(match["total"], "GiB"),
    )


def _startup_plan_applied(match: re.Match[str]) -> StartupPlan:
    return StartupPlan(StartupPlanOutcome.APPLIED, kv_cache_memory_bytes=int(match["budget"]))


def _startup_plan_fallback(match: re.Match[str]) -> StartupPlan:
    return StartupPlan(StartupPlanOutcome.FALLBACK, free_bytes=_bytes(match["free"], "GiB"),
                       baseline_free_bytes=_bytes(match["baseline"], "GiB"))


def _startup_plan_saved(match: re.Match[str]) -> StartupPlan:
    return StartupPlan(StartupPlanOutcome.SAVED)


def _sleep_freed(match: re.Match[str]) -> SleepFreed:
    return SleepFreed(freed_bytes=_bytes(match["freed"], "GiB"), device_used_bytes=_bytes(match["used"], "GiB"))


def _kv_capacity(match: re.Match[str]) -> KvCacheCapacity:
    groups = match.groupdict()
    return KvCacheCapacity(
        tokens=_optional_int(groups.get("tokens")),
        max_model_len=_optional_int(groups.get("len")),
        max_concurrency=_optional_float(groups.get("concurrency")),
        device=groups.get("device"),
    )


def _kv_blocks(match: re.Match[str]) -> KvCacheBlocks:
    return KvCacheBlocks(
        device=match["device"], device_blocks=int(match["blocks"]), cpu_blocks=int(match["cpu"])
    )


def _auto_fit(match: re.Match[str]) -> MaxModelLenAutoFit:
    groups = match.groupdict()
    requested = _int(match["requested"])
    effective = groups.get("effective")
    return MaxModelLenAutoFit(
        requested_max_model_len=requested,
        max_model_len=requested if effective is None else _int(effective),
        available_bytes=_optional_bytes(groups.get("available"), "GiB"),
    )


def _woke(match: re.Match[str]) -> Woke:
    return Woke(float(match["seconds"]))


def _init_done(match: re.Match[str]) -> EngineInitDone:
    return EngineInitDone(float(match["seconds"]), _optional_float(match["compilation"]))


def _server_ready(_match: re.Match[str]) -> ServerReady:
    return ServerReady()


def _kv_too_small_v1(match: re.Match[str]) -> FailureCause:
    return FailureCause(
        FailureReason.KV_CACHE_TOO_SMALL,
        max_model_len=_int(match["len"]),
        needed_bytes=_bytes(match["needed"], match["needed_unit"]),
        available_bytes=_bytes(match["available"], match["available_unit"]),
        estimated_max_model_len=_optional_int(match["estimated"]),
    )


def _kv_too_small_v0(match: re.Match[str]) -> FailureCause:
    return FailureCause(
        FailureReason.KV_CACHE_TOO_SMALL,
        max_model_len=_int(match["len"]),
        kv_cache_tokens=int(match["tokens"]),
    )


def _insufficient_free_memory(match: re.Match[str]) -> FailureCause:
    groups = match.groupdict()
    return FailureCause(
        FailureReason.INSUFFICIENT_FREE_MEMORY,
        free_bytes=_optional_bytes(groups.get("free"), "GiB"),
        total_bytes=_optional_bytes(groups.get("total"), "GiB"),
        gpu_memory_utilization=_optional_float(groups.get("util")),
        requested_bytes=_optional_bytes(groups.get("requested"), "GiB"),
        device=groups.get("device"),
    )


def _xpu_out_of_memory(match: re.Match[str]) -> FailureCause:
    return FailureCause(
        FailureReason.DEVICE_OUT_OF_MEMORY,
        requested_bytes=_optional_bytes(match["requested"], match["requested_unit"]),
        total_bytes=_optional_bytes(match["total"], match["total_unit"]),
        free_bytes=_optional_bytes(match["free"], match["free_unit"]),
    )


def _memory_query_unsupported(match: re.Match[str]) -> FailureCause:
    return FailureCause(FailureReason.MEMORY_QUERY_UNSUPPORTED, device=match["device"])


def _cause(reason: FailureReason) -> Callable[[re.Match[str]], FailureCause]:
    return lambda _match: FailureCause(reason)


def _wrapper(kind: WrapperKind) -> Callable[[re.Match[str]], FailureWrapper]:
    return lambda _match: FailureWrapper(kind)


# ---------------------------------------------------------------------------------------------
# The grammar
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GrammarRow:
    """One template family. `anchors`: literal prefixes of the normalised message that admit the row
    (the cheap pre-check); `pattern` is then matched at the start, or searched anywhere when
    `anywhere` (anchors are then substrings)."""

    name: str
    versions: str
    anchors: tuple[str, ...]
    pattern: re.Pattern[str]
    build: Callable[[re.Match[str]], Event]
    anywhere: bool = False


def _row(
    name: str,
    versions: str,
    anchors: tuple[str, ...],
    pattern: str,
    build: Callable[[re.Match[str]], Event],
    anywhere: bool = False,
) -> GrammarRow:
    return GrammarRow(name, versions, anchors, re.compile(pattern), build, anywhere)


_LOGO = "[▀▄█ ]{1,60}"

# fmt: off
GRAMMAR: tuple[GrammarRow, ...] = (
    # --- identity and settings ---------------------------------------------------------------
    _row("api_server_version", "0.6-0.14",
         ("vLLM API server version ",),
         r"vLLM API server version (?P<version>\S{1,64})",
         _server_version),
    _row("server_version_model", "0.15+ with VLLM_DISABLE_LOG_LOGO",
         ("vLLM server version ",),
         r"vLLM server version (?P<version>[^\s,]{1,64}), serving model (?P<model>\S.{0,1023})",
         _server_version),
    _row("banner_version", "0.15+ start-up banner, version line",
         ("▄", "█", "▀"),
         rf"{_LOGO}version +(?P<version>\S{{1,64}})$",
         _server_version),
    _row("banner_model", "0.15+ start-up banner, model line",
         ("▄", "█", "▀"),
         rf"{_LOGO}model +(?P<model>\S.{{0,1023}})$",
         _banner_model),
    _row("engine_config", "an LLM engine 0.6-0.7 (V0); a V0 LLM engine 0.8-0.10; a V1 LLM engine 0.7+",
         ("Initializing a",),
         r"Initializing (?:an|a (?P<engine>V[01])) LLM engine \(v(?P<version>[^\s)]{1,64})\) "
         r"with config: (?:model=(?:'(?P<model>[^']{0,1024})'|\"(?P<model_dq>[^\"]{0,1024})\"))?",
         _engine_config),
    _row("non_default_args", "0.9.0+",
         ("non-default args: ",),
         r"non-default args: (?P<dict>\{.*)",  # no closing brace needed: the line may be cut
         _non_default_args),
    _row("args_namespace", "0.6-0.8",
         ("args: Namespace(",),
         r"args: Namespace\((?P<body>.*)",
         _args_namespace),
    # --- KV-cache budget ---------------------------------------------------------------------
    _row("available_kv_cache_memory", "0.9.1+ (%.2f to 0.13, format_gib after); XPU 0.16+",
         ("Available KV cache memory: ",),
         rf"Available KV cache memory: (?P<kv>{_NUM}) ?(?P<unit>GiB|GB)",
         _kv_available),
    _row("kv_cache_memory_bytes_reserved", "0.10.2+ ('{K:.2f}GiB' 0.10.2-0.11, '{K} GiB' later); XPU 0.16+",
         ("Initial free memory ",),
         rf"Initial free memory (?P<free>{_NUM}) ?GiB, reserved (?P<kv>{_NUM}) ?GiB memory for KV Cache "
         r"as specified by kv_cache_memory_bytes config",
         _kv_reserved),
    _row("profiling_before", "XPU V1 0.9.2-0.15.1",
         ("Before memory profiling run, ",),
         rf"Before memory profiling run, total GPU memory: (?P<total>{_NUM}) MB, "
         rf"model load takes (?P<load>{_NUM}) MB, free gpu memory is (?P<free>{_NUM}) MB",
         _profiling_before),
    _row("profiling_after", "XPU V1 0.9.2-0.15.1 (no space after 'MB,')",
         ("After memory profiling run, ",),
         rf"After memory profiling run, peak memory usage is (?P<peak>{_NUM}) MB, ?"
         rf"torch mem is (?P<torch>{_NUM}) MB, non-torch mem is (?P<non_torch>{_NUM}) MB, "
         rf"free gpu memory is (?P<free>{_NUM}) MB",
         _profiling_after),
    _row("model_loading_took", "V1 'GiB and' 0.8.3-0.11.0, 'GiB memory and' 0.11.2+ (%.4f to 0.13, format_gib after); "
         "V0 'Loading model weights took' GB 0.6-0.8.0, GiB 0.8.3-0.9.2",
         ("Model loading took ", "Loading model weights took "),
         rf"(?:Model loading|Loading model weights) took (?P<weights>{_NUM}) ?(?P<unit>GiB|GB)\b",
         _model_weights),
    _row("startup_memory_usage", "INFO on XPU 0.26+ (no kv_cache_memory_bytes); 'consumed memory (weights + "
         "non-torch)' 0.28+",
         ("Free memory on device",),
         rf"Free memory on device(?: [^\s(]{{1,64}})? \((?P<free>{_NUM})/(?P<total>{_NUM}) GiB\) on startup\. "
         rf"Desired GPU memory utilization is \([^)]{{0,80}}\)\. Actual usage is (?:"
         rf"(?P<weights>{_NUM}) GiB for weight, (?P<activation>{_NUM}) GiB for peak activation, "
         rf"(?P<non_torch>{_NUM}) GiB for non-torch memory|"
         rf"(?P<consumed>{_NUM}) GiB for consumed memory \(weights \+ non-torch\), "
         rf"(?P<activation_c>{_NUM}) GiB for peak activation)"
         rf",? and (?P<cudagraph>{_NUM}) GiB for CUDAGraph memory",
         _memory_usage),
    _row("kv_cache_size_tokens", "GPU ... 0.8-0.29 (with concurrency 0.28+); XPU/'+ host' 0.30+",
         ("GPU KV cache size: ", "XPU KV cache size: ", "CPU KV cache size: ",
          "GPU + host KV cache size: ", "XPU + host KV cache size: "),
         rf"(?P<device>[A-Z]{{3}}(?: \+ host)?) KV cache size: (?P<tokens>{_INT}) tokens"
         rf"(?:, Maximum concurrency for (?P<len>{_INT}) tokens per request: (?P<concurrency>{_NUM})x)?",
         _kv_capacity),
    _row("max_concurrency", "V0 0.6.3-0.10 (raw int), V1 0.8-0.27 (thousands separators)",
         ("Maximum concurrency for ",),
         rf"Maximum concurrency for (?P<len>{_INT}) tokens per request: (?P<concurrency>{_NUM})x",
         _kv_capacity),
    _row("kv_cache_blocks", "'# GPU blocks' 0.6.x; '# xpu blocks' 0.7-0.10 (V0)",
         ("# ",),
         r"# (?P<device>\w{1,16}) blocks: (?P<blocks>-?\d{1,15}), # CPU blocks: (?P<cpu>-?\d{1,15})",
         _kv_blocks),
    # --- --max-model-len auto (max_model_len -1): the context fitted to the KV cache ------------
    _row("auto_fit_reduced", "0.14-0.31 'GPU memory (A GiB available for KV cache)'; "
         "0.32-0.33 'KV cache memory (A GiB XPU)' ('%s GiB' = format_gib)",
         ("Auto-fit max_model_len: reduced from ",),
         rf"Auto-fit max_model_len: reduced from (?P<requested>{_INT}) to (?P<effective>{_INT}) to fit in "
         rf"available (?:GPU|KV cache) memory(?: \((?P<available>{_NUM}) GiB)?",
         _auto_fit),
    _row("auto_fit_reduced_034", "0.34 (INFO; WARNING '... Requests longer than Y tokens will be rejected.' "
         "below 8192)",
         ("--max-model-len auto reduced max_model_len from ",),
         rf"--max-model-len auto reduced max_model_len from (?P<requested>{_INT}) to (?P<effective>{_INT})"
         rf"(?: \((?P<available>{_NUM}) GiB)?",
         _auto_fit),
    _row("auto_fit_full_length", "0.14-0.31 'in available GPU memory'; 0.32+ 'in available KV cache memory (A GiB XPU)'",
         ("Auto-fit max_model_len: full model context length ",),
         rf"Auto-fit max_model_len: full model context length (?P<requested>{_INT}) fits in available "
         rf"(?:GPU|KV cache) memory(?: \((?P<available>{_NUM}) GiB)?",
         _auto_fit),
    _row("auto_fit_attention_free", "0.14+",
         ("Auto-fit max_model_len: attention-free model, ",),
         rf"Auto-fit max_model_len: attention-free model, using derived max_model_len=(?P<requested>{_INT})",
         _auto_fit),
    # --- vLLM's own startup plan (VLLM_ENABLE_STARTUP_PLAN=1) -----------------------------------
    _row("startup_plan_applied", "0.34 (VLLM_ENABLE_STARTUP_PLAN=1)",
         ("Applying persisted startup plan ",),
         r"Applying persisted startup plan \(fingerprint [^)\s]{1,256}\): kv_cache_memory_bytes=(?P<budget>\d{1,20})\b",
         _startup_plan_applied),
    _row("startup_plan_fallback", "0.34 (VLLM_ENABLE_STARTUP_PLAN=1)",
         ("Startup plan not applied: ",),
         rf"Startup plan not applied: current free memory \((?P<free>{_NUM}) ?GiB\) is below the recorded "
         rf"baseline \((?P<baseline>{_NUM}) ?GiB\)",
         _startup_plan_fallback),
    _row("startup_plan_saved", "0.34 (VLLM_ENABLE_STARTUP_PLAN=1)",
         ("Saved startup plan to ",),
         r"Saved startup plan to \S",
         _startup_plan_saved),
    # --- sleep mode (after the init: the engine's runtime) -------------------------------------
    _row("sleep_mode_freed", "sleep mode (--enable-sleep-mode); XPU 0.34",
         ("Sleep mode freed ",),
         rf"Sleep mode freed (?P<freed>{_NUM}) ?GiB memory, (?P<used>{_NUM}) ?GiB memory is still in use",
         _sleep_freed),
    _row("woke", "sleep mode, the executor's line (every release with sleep mode)",
         ("It took ",),
         rf"It took (?P<seconds>{_NUM}) seconds to wake up tags",
         _woke),
    # --- init outcome ------------------------------------------------------------------------
    _row("init_engine_took", "'seconds' V0 0.6.5-0.10 and V1 to 0.19; ' s[ (compilation: ...)]' 0.20+",
         ("init engine (profile, create kv cache, warmup model) took ",),
         rf"init engine \(profile, create kv cache, warmup model\) took (?P<seconds>{_NUM}) "
         rf"(?:seconds|s)(?: \(compilation: (?P<compilation>{_NUM}) s)?",
         _init_done),
    _row("application_startup_complete", "uvicorn, every release",
         ("INFO:", "Application startup complete."),
         r"(?:INFO: {1,16})?Application startup complete\.",
         _server_ready),
    # --- failure root causes -----------------------------------------------------------------
    _row("kv_too_small_v1", "models's+GB 0.7-0.8.0, GiB 0.8.3-0.21, model's 0.22+; estimate 0.9.1+",
         ("To serve at least one request with the model",),
         rf"To serve at least one request with the models?'s max seq len \((?P<len>{_INT})\), "
         rf"\(?(?P<needed>{_NUM}) (?P<needed_unit>GiB|GB) KV cache is needed, which is larger than "
         rf"the available KV cache memory \((?P<available>{_NUM}) (?P<available_unit>GiB|GB)\)\."
         rf"(?: Based on the available memory, the estimated maximum model length is "
         rf"(?P<estimated>{_INT})\.)?",
         _kv_too_small_v1),
    _row("kv_too_small_v0", "V0 0.6-0.10, V1 0.6.6",
         ("The model's max seq len (",),
         rf"The model's max seq len \((?P<len>{_INT})\) is larger than the maximum number of tokens "
         r"that can be stored in KV cache \((?P<tokens>-?\d{1,15})\)",
         _kv_too_small_v0),
    _row("no_kv_cache_memory", "every release (hint text varies)",
         ("No available memory for the cache blocks.",),
         r"No available memory for the cache blocks\.",
         _cause(FailureReason.NO_KV_CACHE_MEMORY)),
    # The auto-fit twin of "No available memory for the cache blocks": with max_model_len -1 vLLM fits
    # the length before its memory check, so a budget without room for one token (<= 0, or under one
    # block) fails here instead; its only remedy is more memory (no max_model_len is left to lower).
    _row("auto_fit_no_memory", "0.14+ (max_model_len -1)",
         ("Cannot auto-fit max_model_len: not enough GPU memory",),
         r"Cannot auto-fit max_model_len: not enough GPU memory",
         _cause(FailureReason.NO_KV_CACHE_MEMORY)),
    _row("insufficient_free_memory", "no device 0.9.1-0.13 (CUDA); 'device xpu:0' 0.14+ (XPU 0.16+); "
         "external-weights budget 0.32+",
         ("Free memory on device",),
         rf"Free memory on device(?: (?P<device>[^\s(]{{1,64}}))? \((?P<free>{_NUM})/(?P<total>{_NUM}) GiB\)"
         # "is less than" is what makes it the failure: 0.26+ print the same opening in an INFO summary
         # of every successful start ("Free memory on device (F/T GiB) on startup. Desired ...").
         rf"(?: on startup)? is less than [^(]{{0,120}}(?:\((?P<util>{_NUM}), (?P<requested>{_NUM}) GiB\))?",
         _insufficient_free_memory),
    _row("external_weights_exceed_utilization", "0.32+ (external-weights mode)",
         ("Externally held weights on device",),
         r"Externally held weights on device",
         _cause(FailureReason.INSUFFICIENT_FREE_MEMORY)),
    _row("xpu_out_of_memory", "PyTorch XPU caching allocator (torch.OutOfMemoryError)",
         ("XPU out of memory.",),
         rf"XPU out of memory\.(?: Tried to allocate (?P<requested>{_NUM}) (?P<requested_unit>{_SIZE_UNIT})\.)?"
         rf"(?: GPU \d{{1,4}} has a total capacity of (?P<total>{_NUM}) (?P<total_unit>{_SIZE_UNIT}) "
         rf"of which (?P<free>{_NUM}) (?P<free_unit>{_SIZE_UNIT}) is free\.)?",
         _xpu_out_of_memory),
    _row("memory_query_unsupported", "torch.xpu.mem_get_info / getMemoryInfo without the free-memory aspect",
         ("The device (",),
         r"The device \((?P<device>.{1,200}?)\) doesn't support querying the available free memory",
         _memory_query_unsupported),
    # --- failure wrappers --------------------------------------------------------------------
    _row("engine_core_failed_to_start", "0.8.5+ (engine side, before the root cause)",
         ("EngineCore failed to start.",),
         r"EngineCore failed to start\.",
         _wrapper(WrapperKind.ENGINE_CORE_FAILED_TO_START)),
    _row("engine_core_hit_exception", "0.7.0-0.8.3 (engine side, before the root cause)",
         ("EngineCore hit an exception",),
         r"EngineCore hit an exception",
         _wrapper(WrapperKind.ENGINE_CORE_HIT_EXCEPTION)),
    _row("engine_core_init_failed", "0.8.5+ ('Failed core proc(s): {...}' 0.9.0+)",
         ("Engine core initialization failed.",),
         r"Engine core initialization failed\.",
         _wrapper(WrapperKind.ENGINE_CORE_INIT_FAILED)),
    _row("engine_core_proc_init_failed", "0.7.0-0.8.3 ('EngineCore'/'EngineCore_0')",
         ("EngineCore",),
         r"EngineCore(?:_\d{1,4})? initialization failed\.",
         _wrapper(WrapperKind.ENGINE_CORE_PROC_INIT_FAILED)),
    _row("frontend_init_failed", "0.34",
         ("Frontend process failed during engine core initialization",),
         r"Frontend process failed during engine core initialization",
         _wrapper(WrapperKind.FRONTEND_INIT_FAILED)),
    _row("engine_process_failed_to_start", "V0 0.6.3 (bare), 0.6.4-0.10 ('. See stack trace ...')",
         ("Engine process failed to start",),
         r"Engine process failed to start",
         _wrapper(WrapperKind.ENGINE_PROCESS_FAILED_TO_START)),
    # Anywhere in the text: SYCL/UR put the code inside different messages
    # ("Native API failed. Native API returns: 39 (...)", "level_zero backend failed with error: 39 (...)").
    _row("ur_out_of_device_memory", "Level Zero / Unified Runtime, any release",
         ("UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY",),
         r"UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY",
         _cause(FailureReason.DEVICE_OUT_OF_MEMORY),
         anywhere=True),
)
# fmt: on

_START_ANCHORS = tuple(anchor for row in GRAMMAR if not row.anywhere for anchor in row.anchors)
_ANYWHERE_ANCHORS = tuple(anchor for row in GRAMMAR if row.anywhere for anchor in row.anchors)


def _admits(row: GrammarRow, text: str) -> bool:
    if row.anywhere:
        return any(anchor in text for anchor in row.anchors)
    return text.startswith(row.anchors)


def parse_line(message: str) -> Event | ImplausibleValue | None:
    """The event one journal MESSAGE line carries, `ImplausibleValue` when it matched a template but a
    figure is out of bounds (the line is then ignored), or None. Never raises; the work is bounded by
    `MAX_LINE_CHARS` whatever the input."""
    text = normalise(message)
    if not text.startswith(_START_ANCHORS) and not any(a in text for a in _ANYWHERE_ANCHORS):
        return None
    for row in GRAMMAR:
        if not _admits(row, text):
            continue
        match = row.pattern.search(text) if row.anywhere else row.pattern.match(text)
        if match is None:
            continue
        try:
            event = row.build(match)
        except (ValueError, ArithmeticError):
            # A figure out of float/int range; the bounded patterns make this unreachable in
            # practice, and a malformed line must cost a None, never the collector.
            return None
        implausible = _implausible_field(event)
        return event if implausible is None else ImplausibleValue(row.name, implausible)
    return None


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a vLLM version string: "0.6.3.post1" -> (0, 6, 3), "0.10.1.1" ->
    (0, 10, 1, 1), "0.22.1rc1.dev26+g4721bb3aa" -> (0, 22, 1)."""
    parts: list[int] = []
    for part in version.strip().lstrip("v").split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.group() != part:
            break
    return tuple(parts)
