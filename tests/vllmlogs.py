"""What a vLLM systemd unit prints during one engine start, exactly as it lands in the journal, and
PID 1's records around it: realistic unit lifecycles for tests of the journal collector.

Layers, each usable alone from a Python shell::

    >>> run = VllmRun("0.24.0", gpu_memory_utilization=0.75, max_model_len=131072, kv_cache_gib=3.25)
    >>> for line in engine_start_lines(run, began_at=1_747_044_672.0)[:3]:
    ...     print(line.offset, line.pid, line.message)
    >>> failed = replace(run, kv_cache_gib=2.13, failure=Failure("kv_cache_too_small", needed_gib=3.36))
    >>> planned = service_runs("vllm-chat.service", [failed, run], at=1_747_044_672.0)
    >>> placed = compose(Boot("3c1f0a9e5b7d4e2f8a6c0b1d2e3f4a5b", 1_747_044_660.0, tuple(planned)))
    >>> journalgen.write_journal("/tmp/x.journal", journal_specs(placed))

* `engine_start_lines(run, began_at)`: the physical lines of one engine start (`VllmRun`): its
  seconds after the process started, the journal `_PID`, the MESSAGE; one journal entry each.
* `service_start` / `service_runs`: a run wrapped in the records PID 1 writes about the unit
  (Starting, Started, Main process exited, Failed with result, Scheduled restart, Stopped), built
  with journalgen's builders; `service_runs` chains a unit's restarts.
* `compose(*boots)`: several units' entries interleaved by time into one journal entry list
  (`Placed`), per boot; `journal_specs` turns it into journalgen specs, `tracker_entries` into the
  entries the journal reader hands to `vllm_xpu_exporter.fold.engine_starts.EngineTracker`.
* `unit_start(unit, run, clock)`: one start written on a journalgen Clock, after what the test wrote
  before; `chat_runs()`: a failed and a good start of a chat unit to write with it.
* `boot_race()`: the problem statement's three-unit boot race on one 16 GiB-class GPU.

What the lines look like, by release (as each release's logging code writes them):
* header `INFO 05-12 10:11:12 file.py:122] ` before 0.8, `[file.py:122]` from 0.8;
* the "(Proc pid=N) " prefix: none before 0.10.1 (V0, and V1 TP=1 up to 0.10.0); `EngineCore_0`
  in 0.10.1.x, `EngineCore_DP0` 0.10.2-0.17, `EngineCore` from 0.18; `APIServer` from 0.10.1.
  Before 0.31 it is added by wrapping stdout/stderr, so every physical line has it (raw tracebacks
  too); from 0.31 it is part of the log format, so raw stderr output (tracebacks, uvicorn, tqdm)
  has none;
* ANSI colour around the prefix under systemd: `ESC[1;36m` 0.10.1-0.11, `ESC[0;36m` 0.12-0.15;
* journald splits on newlines, strips trailing whitespace and keeps leading indentation.
* Every line of a unit has the same `_PID`: journald takes it from the stdout stream's peer, the
  unit's main process (the API server); an EngineCore child's pid only shows inside its prefix.

Figures are modelled as vLLM prints them: GiB to 2 decimals ("%.2f" before 0.14, then
`format_gib` = str(round(x, 2))), profiling MB to 2 decimals, concurrency "%.2fx".
"""

from __future__ import annotations

import fnmatch
import math
import re
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import NamedTuple

import journalgen
from vllm_xpu_exporter.parsers.vllm import release
from journalgen import JournalEntrySpec, Moment
from sizes import GiB, MiB

REASONS = (
    "kv_cache_too_small",
    "no_kv_cache_memory",
    "insufficient_free_memory",
    "device_out_of_memory",
    "memory_query_unsupported",
    "other",
)
CYAN_BOLD, CYAN, RESET = "\x1b[1;36m", "\x1b[0;36m", "\x1b[0;0m"
DOCS_URL = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"
UNRECOGNISED_ERROR = "RuntimeError: UR backend failed. UR backend returns:40 (UR_RESULT_ERROR_OUT_OF_RESOURCES)"

# Roles of the lines tests look up (the contract's instants), never parsed from the text.
ROLE_ROOT_CAUSE = "root_cause"  # the first print of a recognised root cause
ROLE_TERMINAL = "terminal"  # the front end's last word on a failed start
ROLE_INIT_DONE = "init_done"  # the line that says the engine init succeeded
ROLE_PROCESS_EXIT = "process_exit"  # PID 1's "Main process exited" record


# One release per row of the reference's format tables (§2.1, §2.2, §3, §11).
ERA_VERSIONS = (
    "0.6.3.post1",  # V0, "file.py:N]" header, "# GPU blocks", no init duration, raw traceback only
    "0.7.3",  # V0, no brackets, "# xpu blocks", logger.exception copy
    "0.8.3",  # V0, "[file.py:N]" header, args: Namespace
    "0.9.1",  # V0 XPU, non-default args
    "0.9.2",  # V1 XPU, no prefix, profiling lines instead of "Available KV cache memory"
    "0.10.1.1",  # (EngineCore_0 pid=N) + colour
    "0.11.0",  # (EngineCore_DP0 pid=N) + bold colour, profiling lines
    "0.13.0",  # (EngineCore_DP0 pid=N) + colour, docs URL in the failure texts
    "0.15.1",  # banner, last release with profiling lines
    "0.17.1",  # Available KV cache memory on XPU, "Free memory on device xpu:0" check, no colour
    "0.19.1",  # (EngineCore pid=N), "took N seconds", default utilisation 0.9
    "0.24.0",  # "took N s (compilation: C s)", "model's", default utilisation 0.92
    "0.26.0",  # the INFO start-up memory summary on XPU
    "0.28.0",  # combined "GPU KV cache size: ..., Maximum concurrency ..." line
    "0.30.0",  # "XPU KV cache size"
    "0.33.0",  # prefix in the log format: raw tracebacks unprefixed
    "0.34.0",  # "failed frontend proc(s)", the 0.34 kv_cache_too_small hint
)


def default_gpu_memory_utilization(version: str) -> float:
    """vLLM's own default (config/cache.py): 0.9 through 0.19, 0.92 from 0.20."""
    return 0.9 if release(version) < (0, 20) else 0.92


@dataclass(frozen=True)
class Era:
    """How a release prints: the switches of the reference's format tables."""

    release: tuple[int, ...]

    def _at_least(self, *version: int) -> bool:
        return self.release >= version

    @property
    def v1(self) -> bool:  # XPU runs V1 from 0.9.2
        return self._at_least(0, 9, 2)

    @property
    def brackets(self) -> bool:
        return self._at_least(0, 8)

    @property
    def prefixed(self) -> bool:
        return self.v1 and self._at_least(0, 10, 1)

    @property
    def prefix_in_format(self) -> bool:
        return self._at_least(0, 31)

    @property
    def core_name(self) -> str:
        if not self._at_least(0, 10, 2):
            return "EngineCore_0"
        return "EngineCore_DP0" if not self._at_least(0, 18) else "EngineCore"

    @property
    def process_name(self) -> str:
        """multiprocessing's name of the engine process ("Process <name>:" above its traceback)."""
        return self.core_name if self.v1 else "SpawnProcess-1"

    @property
    def colour(self) -> str | None:
        if self.prefixed and not self._at_least(0, 12):
            return CYAN_BOLD
        if self.prefixed and not self._at_least(0, 16):
            return CYAN
        return None

    @property
    def python(self) -> str:
        return "3.12" if self.v1 else "3.10"

    @property
    def namespace_args(self) -> bool:  # "args: Namespace(...)" before 0.9, "non-default args" after
        return not self._at_least(0, 9)

    @property
    def banner(self) -> bool:
        return self._at_least(0, 15)

    @property
    def profiling_lines(self) -> bool:  # the XPU V1 worker's own budget, 0.9.2-0.15.1
        return self.v1 and not self._at_least(0, 16)

    @property
    def available_kv_line(self) -> bool:
        return self._at_least(0, 16)

    @property
    def combined_kv_line(self) -> bool:
        return self._at_least(0, 28)

    @property
    def kv_device(self) -> str:
        return "XPU" if self._at_least(0, 30) else "GPU"

    @property
    def startup_summary(self) -> bool:  # INFO "Free memory on device (F/T GiB) on startup. Desired ..."
        return self._at_least(0, 26)

    @property
    def format_gib(self) -> bool:
        return self._at_least(0, 14)

    @property
    def init_duration_in_s(self) -> bool:
        return self._at_least(0, 20)

    @property
    def prints_init_duration(self) -> bool:
        return self._at_least(0, 6, 5)

    @property
    def default_block_size(self) -> int:
        return 64 if self.v1 else 16


@dataclass(frozen=True)
class Profiling:
    """The XPU V1 worker's (0.9.2-0.15.1) "Before/After memory profiling run" figures, MB as printed.
    vLLM budgets KV as total x gpu_memory_utilization - peak and prints no KV bytes."""

    total_mb: float = 16225.0
    model_load_mb: float = 7695.45
    peak_mb: float = 8412.3
    non_torch_mb: float = 128.0

    @property
    def free_before_mb(self) -> float:
        return round(self.total_mb - self.model_load_mb - self.non_torch_mb, 2)

    @property
    def free_after_mb(self) -> float:
        return round(self.total_mb - self.peak_mb, 2)

    def kv_cache_bytes(self, gpu_memory_utilization: float) -> int:
        return round(round(self.total_mb * MiB) * gpu_memory_utilization - round(self.peak_mb * MiB))


@dataclass(frozen=True)
class Failure:
    """How a start fails. `reason` is a contract reason; which figures matter:
    kv_cache_too_small: needed_gib, estimated_max_model_len (V1; the available figure is the run's
        KV, or `available_gib`); V0 prints the tokens that fit (`VllmRun.gpu_blocks` x block size);
    no_kv_cache_memory: the run's KV figure should be <= 0 (V1) / gpu_blocks 0 (V0);
    insufficient_free_memory: free_gib, total_gib (and the run's utilisation);
    device_out_of_memory: allocate_gib, total_gib, free_gib; `form` "torch" (PyTorch XPU allocator,
        default on V1), "ipex" (IPEX RuntimeError, default on V0) or "native_api" (UR error 39);
    memory_query_unsupported: device_name;
    other: `error` is the unrecognised exception line vLLM prints; error=None: the process dies
        before vLLM prints anything (a Python import error); exec_failed: ExecStart cannot even run
        (status 203/EXEC), nothing printed at all."""

    reason: str
    needed_gib: float = 4.0
    available_gib: float | None = None
    estimated_max_model_len: int | None = None
    free_gib: float = 3.1
    total_gib: float = 15.91
    allocate_gib: float = 2.0
    form: str = ""
    device_name: str = "Intel(R) Arc(TM) A770 Graphics"
    error: str | None = UNRECOGNISED_ERROR
    exec_failed: bool = False

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"unknown failure reason {self.reason!r}")

    @property
    def silent(self) -> bool:
        """The process dies before vLLM prints anything."""
        return self.reason == "other" and (self.error is None or self.exec_failed)


@dataclass(frozen=True)
class VllmRun:
    """One engine start of a vLLM unit: its settings, the KV figures it prints and its outcome.

    None for gpu_memory_utilization / max_model_len / max_num_seqs / kv_cache_memory_bytes /
    block_size: not given (the release's default applies). KV figures, by era:
    * V0 (<=0.9.1): `gpu_blocks` ("# xpu blocks"); default derived from kv_cache_gib;
    * 0.9.2-0.15.1: `profiling` (KV bytes = total x util - peak);
    * 0.16+: `kv_cache_gib` ("Available KV cache memory"), or the kv_cache_memory_bytes reservation;
    * V1 tokens / concurrency: `kv_cache_tokens` / `max_concurrency`, derived from the KV bytes
      with `kv_bytes_per_token` when None.
    """

    version: str
    model: str = "Qwen/Qwen3-1.7B"
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    model_max_len: int = 40960  # the model's own maximum, used when max_model_len is not given
    # --max-model-len auto (max_model_len -1, 0.14+): vLLM fits the model's length to the KV cache;
    # auto_fit_to: the length it fits to (None: the model's full length fits)
    auto_max_model_len: bool = False
    auto_fit_to: int | None = None
    max_num_seqs: int | None = None
    kv_cache_memory_bytes: int | None = None
    block_size: int | None = None
    kv_bytes_per_token: int = 114688
    kv_cache_gib: float = 4.0
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    gpu_blocks: int | None = None
    cpu_blocks: int = 2048
    profiling: Profiling = field(default_factory=Profiling)
    free_gib_at_start: float = 15.42
    total_gib: float = 15.91
    weights_gib: float = 3.21
    cudagraph_gib: float = 0.0  # the start-up summary's "C GiB for CUDAGraph memory" (0.26+)
    init_seconds: float = 32.05
    compilation_seconds: float | None = None
    failure: Failure | None = None
    main_pid: int = 4242
    requests: int = 2  # request / throughput cycles logged after a successful start
    # vLLM 0.34's own startup plan (VLLM_ENABLE_STARTUP_PLAN=1): "applied" (kv_cache_gib is the plan's budget,
    # profiling skipped), "fallback" (free memory below startup_plan_baseline_gib: profiled, then saved) or
    # "saved" (a profiled start with no plan yet); None: off
    startup_plan: str | None = None
    startup_plan_baseline_gib: float = 15.42
    # sleep mode: the engine went to sleep after its requests, freeing this much (None: it did not)
    sleep_freed_gib: float | None = None
    sleep_device_used_gib: float = 2.41

    @property
    def era(self) -> Era:
        return Era(release(self.version))

    def __post_init__(self) -> None:
        if self.auto_max_model_len and (self.era.release < (0, 14) or self.max_model_len is not None):
            raise ValueError("--max-model-len auto is 0.14+ and replaces max_model_len")

    @property
    def config_max_model_len(self) -> int:
        """The length the start-up lines print: the given one, else the model's (auto-fit comes later)."""
        return self.max_model_len or self.model_max_len

    @property
    def effective_max_model_len(self) -> int:
        """The length the engine serves: auto-fit's when it reduced it."""
        if self.auto_max_model_len and self.auto_fit_to is not None:
            return self.auto_fit_to
        return self.config_max_model_len

    @property
    def effective_block_size(self) -> int:
        return self.block_size or self.era.default_block_size

    @property
    def effective_gpu_memory_utilization(self) -> float:
        if self.gpu_memory_utilization is not None:
            return self.gpu_memory_utilization
        return default_gpu_memory_utilization(self.version)

    @property
    def reserves_kv_cache(self) -> bool:
        """kv_cache_memory_bytes is honoured (on XPU from 0.16; earlier the XPU worker ignores it)."""
        return self.kv_cache_memory_bytes is not None and self.era.available_kv_line

    @property
    def skips_profiling(self) -> bool:
        """The KV budget is fixed before the init (kv_cache_memory_bytes, or an applied startup plan)."""
        return self.reserves_kv_cache or self.startup_plan == "applied"

    @property
    def startup_plan_bytes(self) -> int:
        """The KV budget the startup plan applied or saved, exact."""
        return round(self.kv_cache_gib * GiB)

    @property
    def kv_cache_bytes(self) -> int | None:
        """The KV-cache bytes of this start as the printed figures give them (None on V0)."""
        era = self.era
        if not era.v1:
            return None
        if era.profiling_lines:
            return self.profiling.kv_cache_bytes(self.effective_gpu_memory_utilization)
        if self.reserves_kv_cache:
            return round(round(self.kv_cache_memory_bytes / GiB, 2) * GiB)
        if self.startup_plan == "applied":
            return round(round(self.kv_cache_gib, 2) * GiB)
        return round(self.kv_cache_gib * GiB)

    @property
    def device_blocks(self) -> int:
        """V0's "# xpu blocks"."""
        if self.gpu_blocks is not None:
            return self.gpu_blocks
        per_block = self.kv_bytes_per_token * self.effective_block_size
        return max(0, round(self.kv_cache_gib * GiB) // per_block)

    @property
    def tokens(self) -> int:
        if not self.era.v1:
            return self.device_blocks * self.effective_block_size
        if self.kv_cache_tokens is not None:
            return self.kv_cache_tokens
        block = self.effective_block_size
        return max(0, (self.kv_cache_bytes or 0) // (self.kv_bytes_per_token * block) * block)

    @property
    def concurrency(self) -> float:
        if self.max_concurrency is not None:
            return self.max_concurrency
        return round(self.tokens / self.effective_max_model_len, 2)


class UnitLine(NamedTuple):
    """One physical line of the unit's output: one journal entry."""

    offset: float  # seconds after the unit's main process started
    pid: int  # the entry's _PID: the main process
    message: str
    role: str = ""


# ---------------------------------------------------------------------------------------------
# Message templates by release
# ---------------------------------------------------------------------------------------------


def _gib(value: float, era: Era) -> str:
    return str(round(value, 2)) if era.format_gib else f"{value:.2f}"


def _size(value_gib: float) -> str:
    """c10's format_size, as the PyTorch allocator prints sizes."""
    return f"{value_gib:.2f} GiB" if value_gib >= 1 else f"{value_gib * 1024:.2f} MiB"


def kv_cache_too_small_message(era: Era, max_model_len: int, needed_gib: float, available_gib: float,
                               estimated: int | None) -> str:
    """The V1 "To serve at least one request ..." text of a release (0.9.1+ forms)."""
    models = "model's" if era.release >= (0, 22) else "models's"
    head = (f"To serve at least one request with the {models} max seq len ({max_model_len}), "
            f"({_gib(needed_gib, era)} GiB KV cache is needed, which is larger than the available KV "
            f"cache memory ({_gib(available_gib, era)} GiB).")
    estimate = (f"Based on the available memory, the estimated maximum model length is {estimated}. "
                if estimated else "")
    see = f" See {DOCS_URL} for more details."
    if era.release < (0, 14):
        text = (head + (" " + estimate if estimate else " ")
                + "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
                "initializing the engine.")
        return text + see if era.release >= (0, 13) else text
    if era.release < (0, 22):
        hint = ("Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
                "initializing the engine.")
    elif era.release < (0, 34):
        hint = ("Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU "
                "backend) or decreasing `max_model_len` when initializing the engine.")
    else:
        hint = ("Try increasing `gpu_memory_utilization` when initializing the engine (this flag also "
                "controls CPU memory reservation on the CPU backend, despite its name). Decreasing "
                "`max_model_len` also reduces what is needed.")
    return f"{head} {estimate}{hint}{see}"


def kv_cache_too_small_v0_message(max_model_len: int, tokens: int) -> str:
    return (f"The model's max seq len ({max_model_len}) is larger than the maximum number of tokens "
            f"that can be stored in KV cache ({tokens}). Try increasing `gpu_memory_utilization` or "
            "decreasing `max_model_len` when initializing the engine.")


def no_kv_cache_memory_message(era: Era) -> str:
    if era.release < (0, 13):
        return ("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                "when initializing the engine.")
    if era.release < (0, 22):
        return ("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                f"when initializing the engine. See {DOCS_URL} for more details.")
    return ("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            "initializing the engine (this flag also controls CPU memory reservation on the CPU "
            f"backend, despite its name). See {DOCS_URL} for more details.")


def auto_fit_no_memory_message(era: Era) -> str:
    """--max-model-len auto when not one token fits (raised before the "No available memory" check)."""
    if era.release < (0, 34):
        hint = "Try increasing `gpu_memory_utilization`."
    else:
        hint = ("Try increasing `gpu_memory_utilization` when initializing the engine (this flag also controls CPU "
                "memory reservation on the CPU backend, despite its name).")
    return f"Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single token. {hint}"


def auto_fit_line(run: VllmRun) -> tuple[str, str, str]:
    """(level, file:line, message) of --max-model-len auto's fit (v1/core/kv_cache_utils.py
    `_auto_fit_max_model_len` 0.14-0.32, kv_cache_planning.py 0.33+), printed after the KV-cache
    memory line and before the KV-cache size lines."""
    era = run.era
    full, fitted = run.config_max_model_len, run.effective_max_model_len
    memory = str(round((run.kv_cache_bytes or 0) / GiB, 2))  # format_gib
    where = "kv_cache_planning.py:1405" if era.release >= (0, 33) else "kv_cache_utils.py:1443"
    if era.release < (0, 32):
        if fitted >= full:
            return "INFO", where, f"Auto-fit max_model_len: full model context length {full} fits in available GPU memory"
        return ("INFO", where, f"Auto-fit max_model_len: reduced from {full} to {fitted} to fit in available GPU "
                f"memory ({memory} GiB available for KV cache)")
    device_memory = f"{memory} GiB {era.kv_device}"
    if fitted >= full:
        return ("INFO", where, f"Auto-fit max_model_len: full model context length {full} fits in available KV "
                f"cache memory ({device_memory})")
    if era.release < (0, 34):
        return ("INFO", where, f"Auto-fit max_model_len: reduced from {full} to {fitted} to fit in available KV "
                f"cache memory ({device_memory})")
    text = f"--max-model-len auto reduced max_model_len from {full} to {fitted} ({device_memory} available for the KV cache)."
    if fitted >= 8192:  # AUTO_FIT_SHORT_MAX_MODEL_LEN
        return "INFO", "kv_cache_planning.py:1494", text
    return ("WARNING", "kv_cache_planning.py:1505", f"{text} Requests longer than {fitted} tokens will be rejected. "
            "Increase `gpu_memory_utilization` or set --max-model-len explicitly.")


def insufficient_free_memory_message(era: Era, free_gib: float, total_gib: float, utilisation: float) -> str:
    device = " xpu:0" if era.release >= (0, 14) else ""
    requested = round(total_gib * utilisation, 2)
    return (f"Free memory on device{device} ({round(free_gib, 2)}/{round(total_gib, 2)} GiB) on startup "
            f"is less than desired GPU memory utilization ({utilisation}, {requested} GiB). Decrease GPU "
            "memory utilization or reduce GPU memory used by other processes.")


def device_out_of_memory_message(failure: Failure, v1: bool) -> str:
    """The exception line (class included)."""
    form = failure.form or ("torch" if v1 else "ipex")
    if form == "native_api":
        return "RuntimeError: Native API failed. Native API returns: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)"
    allocated = max(failure.total_gib - failure.free_gib - 0.3, 0.0)
    if form == "ipex":
        return (f"RuntimeError: XPU out of memory. Tried to allocate {_size(failure.allocate_gib)} (GPU 0; "
                f"{_size(failure.total_gib)} total capacity; {_size(allocated)} already allocated; "
                f"{_size(allocated + 0.2)} reserved in total by PyTorch)")
    return (f"torch.OutOfMemoryError: XPU out of memory. Tried to allocate {_size(failure.allocate_gib)}. "
            f"GPU 0 has a total capacity of {_size(failure.total_gib)} of which {_size(failure.free_gib)} "
            f"is free. Of the allocated memory {_size(allocated)} is allocated by PyTorch, and "
            f"{_size(0.2)} is reserved by PyTorch but unallocated. Please use `empty_cache` to release "
            "all unoccupied cached memory.")


def memory_query_unsupported_message(device_name: str) -> str:
    return (f"RuntimeError: The device ({device_name}) doesn't support querying the available free "
            "memory. You can file an issue at https://github.com/pytorch/pytorch/issues to help us "
            "prioritize its implementation.")


def startup_summary_message(run: VllmRun) -> str:
    """The INFO line of gpu_worker.compile_or_warm_up_model, printed on XPU from 0.26 (after the KV
    lines, before "init engine ... took") when kv_cache_memory_bytes is not set."""
    utilisation = run.effective_gpu_memory_utilization
    requested = round(run.total_gib * utilisation, 2)
    kv_gib = round((run.kv_cache_bytes or 0) / GiB, 2)
    activation, cuda_graph = 0.51, run.cudagraph_gib
    if run.era.release >= (0, 28):
        usage = (f"Actual usage is {round(run.weights_gib + 0.12, 2)} GiB for consumed memory (weights + "
                 f"non-torch), {activation} GiB for peak activation, and {cuda_graph} GiB for CUDAGraph memory.")
    else:
        usage = (f"Actual usage is {run.weights_gib} GiB for weight, {activation} GiB for peak activation, "
                 f"0.12 GiB for non-torch memory, and {cuda_graph} GiB for CUDAGraph memory.")
    fit = math.floor(kv_gib * GiB * 0.98)
    full = math.floor((kv_gib + round(run.free_gib_at_start - requested, 2)) * GiB)
    return (f"Free memory on device ({run.free_gib_at_start}/{run.total_gib} GiB) on startup. Desired GPU "
            f"memory utilization is ({utilisation}, {requested} GiB). {usage} Replace gpu_memory_utilization "
            f"config with `--kv-cache-memory={fit}` ({round(fit / GiB, 2)} GiB) to fit into requested memory, "
            f"or `--kv-cache-memory={full}` ({round(full / GiB, 2)} GiB) to fully utilize gpu memory. "
            f"Current kv cache memory in use is {kv_gib} GiB.")


# ---------------------------------------------------------------------------------------------
# Tracebacks
# ---------------------------------------------------------------------------------------------

Frame = tuple[str, int, str, str | None]  # file (relative to site-packages/vllm unless absolute), line, function, source


def _frames_text(era: Era, frames: Sequence[Frame], exception: str, *, header: bool = True) -> str:
    site = f"/opt/vllm/lib/python{era.python}/site-packages"
    lines = ["Traceback (most recent call last):"] if header else []
    for path, lineno, function, source in frames:
        if path.startswith("{site}"):
            where = path.replace("{site}", site)
        elif path.startswith(("/", "<")) or path.endswith(".pyx"):
            where = path
        else:
            where = f"{site}/vllm/{path}"
        lines.append(f'  File "{where}", line {lineno}, in {function}')
        if source is not None:
            lines.append(f"    {source}")
            # Python 3.11+ marks the failing expression when it is not the whole line.
            if era.python >= "3.11" and " = " in source and not source.startswith("raise"):
                start = source.index(" = ") + 3
                lines.append("    " + " " * start + "^" * (len(source) - start))
    lines.append(exception)
    return "\n".join(lines)


def _v1_stage(failure: Failure, era: Era) -> str:
    if failure.reason in ("kv_cache_too_small", "no_kv_cache_memory"):
        return "kv_config"
    if failure.reason == "insufficient_free_memory" or (
            failure.reason == "memory_query_unsupported" and era.available_kv_line):
        return "init_device"
    return "profile"


def _v1_engine_frames(era: Era, failure: Failure) -> list[Frame]:
    worker = "v1/worker/gpu_worker.py" if era.available_kv_line else "v1/worker/xpu_worker.py"
    frames: list[Frame] = [
        ("v1/engine/core.py", 1103, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
        ("v1/engine/core.py", 825, "__init__", "super().__init__("),
    ]
    stage = _v1_stage(failure, era)
    if stage == "init_device":
        frames += [
            ("v1/engine/core.py", 98, "__init__", "self.model_executor = executor_class(vllm_config)"),
            ("v1/executor/abstract.py", 101, "__init__", "self._init_executor()"),
            ("v1/executor/uniproc_executor.py", 47, "_init_executor", "self.driver_worker.init_device()"),
            ("v1/worker/worker_base.py", 326, "init_device", "self.worker.init_device()  # type: ignore"),
        ]
        if failure.reason == "insufficient_free_memory":
            frames += [
                (worker, 239, "init_device", "self.requested_memory = request_memory(init_snapshot, self.cache_config)"),
                ("v1/worker/utils.py", 385, "request_memory", "raise ValueError("),
            ]
        else:
            frames += [
                (worker, 230, "init_device", "self.init_snapshot = init_snapshot = MemorySnapshot(device=self.device)"),
                ("utils/mem_utils.py", 118, "measure", "self.free_memory, self.total_memory = current_platform.mem_get_info(self.device_)"),
                ("{site}/torch/xpu/memory.py", 194, "mem_get_info", "return torch._C._xpu_getMemoryInfo(device)"),
            ]
        return frames
    frames.append(("v1/engine/core.py", 117, "__init__",
                   "num_gpu_blocks, num_cpu_blocks, kv_cache_config = self._initialize_kv_caches("))
    if stage == "kv_config":
        return frames + [
            ("v1/engine/core.py", 247, "_initialize_kv_caches", "kv_cache_configs = get_kv_cache_configs("),
            ("v1/core/kv_cache_utils.py", 1401, "get_kv_cache_configs", "check_enough_kv_cache_memory("),
            ("v1/core/kv_cache_utils.py", 702, "check_enough_kv_cache_memory", "raise ValueError("),
        ]
    frames += [
        ("v1/engine/core.py", 206, "_initialize_kv_caches",
         "available_gpu_memory = self.model_executor.determine_available_memory()"),
        ("v1/executor/abstract.py", 76, "determine_available_memory", 'return self.collective_rpc("determine_available_memory")'),
        ("v1/executor/uniproc_executor.py", 58, "collective_rpc", "answer = run_method(self.driver_worker, method, args, kwargs)"),
        ("{site}/torch/utils/_contextlib.py", 116, "decorate_context", "return func(*args, **kwargs)"),
    ]
    if failure.reason == "memory_query_unsupported":
        return frames + [
            (worker, 104, "determine_available_memory", "free_gpu_memory, total_gpu_memory = torch.xpu.mem_get_info()"),
            ("{site}/torch/xpu/memory.py", 194, "mem_get_info", "return torch._C._xpu_getMemoryInfo(device)"),
        ]
    return frames + [
        (worker, 117, "determine_available_memory", "self.model_runner.profile_run()"),
        ("v1/worker/gpu_model_runner.py", 2615, "profile_run", "hidden_states, last_hidden_states = self._dummy_run("),
        ("{site}/torch/nn/modules/module.py", 1773, "_wrapped_call_impl", "return self._call_impl(*args, **kwargs)"),
        ("model_executor/layers/linear.py", 565, "forward", "output_parallel = self.quant_method.apply(self, input_, bias)"),
    ]


def _v1_api_frames(era: Era) -> list[Frame]:
    return [
        ("/opt/vllm/bin/vllm", 10, "<module>", "sys.exit(main())"),
        ("entrypoints/cli/main.py", 54, "main", "args.dispatch_function(args)"),
        ("entrypoints/cli/serve.py", 57, "cmd", "uvloop.run(run_server(args))"),
        ("{site}/uvloop/__init__.py", 109, "run", "return __asyncio.run("),
        (f"/usr/lib/python{era.python}/asyncio/runners.py", 195, "run", "return runner.run(main)"),
        (f"/usr/lib/python{era.python}/asyncio/runners.py", 118, "run", "return self._loop.run_until_complete(task)"),
        ("uvloop/loop.pyx", 1518, "uvloop.loop.Loop.run_until_complete", None),
        ("entrypoints/openai/api_server.py", 1884, "run_server", "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)"),
        ("entrypoints/openai/api_server.py", 178, "build_async_engine_client_from_engine_args", "async_llm = AsyncLLM.from_vllm_config("),
        ("v1/engine/async_llm.py", 117, "__init__", "self.engine_core = EngineCoreClient.make_async_mp_client("),
        ("v1/engine/core_client.py", 408, "__init__", "with launch_core_engines(vllm_config, executor_class,"),
        (f"/usr/lib/python{era.python}/contextlib.py", 144, "__exit__", "next(self.gen)"),
        ("v1/engine/utils.py", 732, "launch_core_engines", "wait_for_engine_startup("),
        ("v1/engine/utils.py", 785, "wait_for_engine_startup", "raise RuntimeError("),
    ]


def _v1_terminal_message(era: Era, failed: bool = True) -> str:
    procs = f"{{'{era.core_name}': 1}}" if failed else "{}"
    text = f"RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {procs}"
    return text + ", failed frontend proc(s): {}" if era.release >= (0, 34) else text


def _v0_engine_frames(era: Era, failure: Failure) -> list[Frame]:
    frames: list[Frame] = [
        ("engine/multiprocessing/engine.py", 379, "run_mp_engine", "engine = MQLLMEngine.from_engine_args(engine_args=engine_args,"),
        ("engine/multiprocessing/engine.py", 136, "from_engine_args", "return cls("),
        ("engine/multiprocessing/engine.py", 78, "__init__", "self.engine = LLMEngine(*args, **kwargs)"),
        ("engine/llm_engine.py", 339, "__init__", "self._initialize_kv_caches()"),
    ]
    executor = "executor/executor_base.py" if era.release >= (0, 7) else "executor/gpu_executor.py"
    if failure.reason in ("kv_cache_too_small", "no_kv_cache_memory"):
        source = ('raise ValueError("No available memory for the cache blocks. "'
                  if failure.reason == "no_kv_cache_memory" else "raise ValueError(")
        return frames + [
            ("engine/llm_engine.py", 487, "_initialize_kv_caches", "self.model_executor.initialize_cache(num_gpu_blocks, num_cpu_blocks)"),
            (executor, 127, "initialize_cache", "self.driver_worker.initialize_cache(num_gpu_blocks, num_cpu_blocks)"),
            ("worker/worker.py", 266, "initialize_cache", "raise_if_cache_size_invalid(num_gpu_blocks,"),
            ("worker/worker.py", 493, "raise_if_cache_size_invalid", source),
        ]
    return frames + [
        ("engine/llm_engine.py", 474, "_initialize_kv_caches", "self.model_executor.determine_num_available_blocks())"),
        (executor, 110, "determine_num_available_blocks", "return self.driver_worker.determine_num_available_blocks()"),
        ("{site}/torch/utils/_contextlib.py", 116, "decorate_context", "return func(*args, **kwargs)"),
        ("worker/xpu_worker.py", 116, "determine_num_available_blocks", "self.model_runner.profile_run()"),
        ("worker/xpu_model_runner.py", 523, "profile_run", "self.execute_model(model_input, kv_caches, intermediate_tensors)"),
    ]


def _v0_api_frames(era: Era) -> list[Frame]:
    return [
        ("<frozen runpy>", 196, "_run_module_as_main", None),
        ("<frozen runpy>", 86, "_run_code", None),
        ("entrypoints/openai/api_server.py", 774, "<module>", "uvloop.run(run_server(args))"),
        ("{site}/uvloop/__init__.py", 82, "run", "return loop.run_until_complete(wrapper())"),
        ("uvloop/loop.pyx", 1517, "uvloop.loop.Loop.run_until_complete", None),
        ("entrypoints/openai/api_server.py", 741, "run_server", "async with build_async_engine_client(args) as engine_client:"),
        (f"/usr/lib/python{era.python}/contextlib.py", 199, "__aenter__", "return await anext(self.gen)"),
        ("entrypoints/openai/api_server.py", 118, "build_async_engine_client", "async with build_async_engine_client_from_engine_args("),
        ("entrypoints/openai/api_server.py", 223, "build_async_engine_client_from_engine_args", "raise RuntimeError("),
    ]


# ---------------------------------------------------------------------------------------------
# One engine start
# ---------------------------------------------------------------------------------------------

API, CORE = "api", "core"


class _Output:
    """Accumulates a run's physical lines with each era's header, prefix and colour."""

    def __init__(self, run: VllmRun, began_at: float) -> None:
        self.run = run
        self.era = run.era
        self.began_at = began_at
        self.api_pid = run.main_pid
        self.core_pid = run.main_pid + 173
        self.lines: list[UnitLine] = []

    def _prefix(self, process: str) -> str:
        if not self.era.prefixed:
            return ""
        name, pid = ("APIServer", self.api_pid) if process == API else (self.era.core_name, self.core_pid)
        text = f"({name} pid={pid})"
        if self.era.colour:
            text = f"{self.era.colour}{text}{RESET}"
        return text + " "

    def log(self, offset: float, process: str, level: str, where: str, message: str) -> None:
        """A logger record: every physical line repeats the header (NewLineFormatter)."""
        stamp = time.strftime("%m-%d %H:%M:%S", time.gmtime(self.began_at + offset))
        location = f"[{where}]" if self.era.brackets else f"{where}]"
        head = f"{self._prefix(process)}{level} {stamp} {location} "
        for line in message.split("\n"):
            self._emit(offset, head + line)

    def raw(self, offset: float, process: str, text: str) -> None:
        """Raw stdout/stderr (tracebacks, uvicorn, tqdm): prefixed only by the pre-0.31 stream wrapper."""
        prefix = "" if self.era.prefix_in_format else self._prefix(process)
        for line in text.split("\n"):
            self._emit(offset, prefix + line)

    def unprefixed(self, offset: float, text: str) -> None:
        """Output of a process vLLM never decorates (multiprocessing's resource tracker, the interpreter)."""
        for line in text.split("\n"):
            self._emit(offset, line)

    def mark_last(self, role: str) -> None:
        self.mark(len(self.lines) - 1, role)

    def mark(self, index: int, role: str) -> None:
        self.lines[index] = self.lines[index]._replace(role=role)

    def _emit(self, offset: float, message: str) -> None:
        # journald splits on newlines and strips trailing whitespace.
        self.lines.append(UnitLine(round(offset, 6), self.api_pid, message.rstrip()))


def _namespace_args(run: VllmRun) -> str:
    era = run.era
    block_size = run.block_size if run.block_size is not None else (16 if era.release < (0, 7) else None)
    max_num_seqs = run.max_num_seqs if run.max_num_seqs is not None else (256 if era.release < (0, 8) else None)
    utilisation = run.effective_gpu_memory_utilization
    return (f"args: Namespace(subparser='serve', model_tag={run.model!r}, config='', host='0.0.0.0', port=8000, "
            "uvicorn_log_level='info', allow_credentials=False, allowed_origins=['*'], api_key=None, "
            f"lora_modules=None, chat_template=None, model={run.model!r}, task='auto', tokenizer=None, "
            f"download_dir=None, load_format='auto', dtype='float16', kv_cache_dtype='auto', "
            f"max_model_len={run.max_model_len!r}, device='xpu', block_size={block_size!r}, "
            f"swap_space=4, cpu_offload_gb=0, gpu_memory_utilization={utilisation!r}, "
            f"num_gpu_blocks_override=None, max_num_batched_tokens=None, max_num_seqs={max_num_seqs!r}, "
            "enforce_eager=True, disable_log_stats=False, disable_log_requests=False, "
            "dispatch_function=<function serve at 0x7f3a2c1e5b40>)")


def _non_default_args(run: VllmRun) -> str:
    args: dict[str, object] = {}
    if run.era.release >= (0, 10):
        args["model_tag"] = run.model
    args["host"] = "0.0.0.0"
    args["model"] = run.model
    if run.max_model_len is not None:
        args["max_model_len"] = run.max_model_len
    if run.auto_max_model_len:
        args["max_model_len"] = -1  # engine/arg_utils.py human_readable_int_or_auto("auto")
    if run.block_size is not None:
        args["block_size"] = run.block_size
    if run.gpu_memory_utilization is not None:
        args["gpu_memory_utilization"] = run.gpu_memory_utilization
    if run.kv_cache_memory_bytes is not None and run.era.release >= (0, 10, 2):
        args["kv_cache_memory_bytes"] = run.kv_cache_memory_bytes
    if run.max_num_seqs is not None:
        args["max_num_seqs"] = run.max_num_seqs
    args["enforce_eager"] = True
    return f"non-default args: {args!r}"


def _engine_config(run: VllmRun) -> str:
    era = run.era
    version = f"v{run.version}"
    if era.v1:
        return (f"Initializing a V1 LLM engine ({version}) with config: model={run.model!r}, speculative_config=None, "
                f"tokenizer={run.model!r}, skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
                "tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, "
                f"max_seq_len={run.config_max_model_len}, download_dir=None, load_format=auto, "
                "tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1, "
                "disable_custom_all_reduce=True, quantization=None, enforce_eager=True, kv_cache_dtype=auto, "
                "device_config=xpu, observability_config=ObservabilityConfig(show_hidden_metrics_for_version=None, "
                f"otlp_traces_endpoint=None, collect_detailed_traces=None), seed=0, served_model_name={run.model}, "
                "enable_prefix_caching=True, enable_chunked_prefill=True, pooler_config=None, "
                'compilation_config={"level":0,"debug_dump_path":"","cache_dir":"","backend":"",'
                '"custom_ops":["none"],"splitting_ops":[],"use_inductor":true,"compile_sizes":[],'
                '"cudagraph_mode":0,"max_capture_size":0,"local_cache_dir":null}')
    phrase = "an LLM engine" if era.release < (0, 8) else "a V0 LLM engine"
    return (f"Initializing {phrase} ({version}) with config: model={run.model!r}, speculative_config=None, "
            f"tokenizer={run.model!r}, skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
            "override_neuron_config=None, rope_scaling=None, rope_theta=None, tokenizer_revision=None, "
            f"trust_remote_code=False, dtype=torch.float16, max_seq_len={run.effective_max_model_len}, "
            "download_dir=None, load_format=LoadFormat.AUTO, tensor_parallel_size=1, pipeline_parallel_size=1, "
            "disable_custom_all_reduce=False, quantization=None, enforce_eager=True, kv_cache_dtype=auto, "
            "quantization_param_path=None, device_config=xpu, "
            "decoding_config=DecodingConfig(guided_decoding_backend='outlines'), "
            "observability_config=ObservabilityConfig(otlp_traces_endpoint=None, collect_model_forward_time=False, "
            f"collect_model_execute_time=False), seed=0, served_model_name={run.model}, use_v2_block_manager=True, "
            "num_scheduler_steps=1, chunked_prefill_enabled=False multi_step_stream_outputs=True, "
            "enable_prefix_caching=False, use_async_output_proc=True, use_cached_outputs=True, "
            "mm_processor_kwargs=None, pooler_config=None)")


def _banner(run: VllmRun) -> str:
    return "\n".join([
        "",
        "       █     █     █▄   ▄█",
        f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {run.version}",
        f"  █▄█▀ █     █     █     █  model   {run.model}",
        "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀",
        "",
    ])


def _weights_line(run: VllmRun, load_seconds: float) -> str:
    era = run.era
    if not era.v1:
        unit = "GB" if era.release < (0, 8, 3) else "GiB"
        return f"Loading model weights took {run.weights_gib:.4f} {unit}"
    if era.release < (0, 11, 1):
        return f"Model loading took {run.weights_gib:.4f} GiB and {load_seconds:.6f} seconds"
    if era.release < (0, 14):
        return f"Model loading took {run.weights_gib:.4f} GiB memory and {load_seconds:.6f} seconds"
    return f"Model loading took {round(run.weights_gib, 2)} GiB memory and {load_seconds:.6f} seconds"


def _init_done_line(run: VllmRun) -> str:
    text = f"init engine (profile, create kv cache, warmup model) took {run.init_seconds:.2f}"
    if not run.era.init_duration_in_s:
        return text + " seconds"
    if run.compilation_seconds is not None:
        return text + f" s (compilation: {run.compilation_seconds:.2f} s)"
    return text + " s"


def _failure_exception(run: VllmRun, failure: Failure) -> str:
    """The exception line vLLM's traceback ends with (class included)."""
    era = run.era
    reason = failure.reason
    if reason == "kv_cache_too_small":
        if not era.v1:
            return "ValueError: " + kv_cache_too_small_v0_message(run.effective_max_model_len, run.tokens)
        available = failure.available_gib
        if available is None:
            available = round((run.kv_cache_bytes or 0) / GiB, 2)
        return "ValueError: " + kv_cache_too_small_message(
            era, run.effective_max_model_len, failure.needed_gib, available, failure.estimated_max_model_len)
    if reason == "no_kv_cache_memory":
        if run.auto_max_model_len:
            return "ValueError: " + auto_fit_no_memory_message(era)
        return "ValueError: " + no_kv_cache_memory_message(era)
    if reason == "insufficient_free_memory":
        return "ValueError: " + insufficient_free_memory_message(
            era, failure.free_gib, failure.total_gib, run.effective_gpu_memory_utilization)
    if reason == "device_out_of_memory":
        return device_out_of_memory_message(failure, era.v1)
    if reason == "memory_query_unsupported":
        return memory_query_unsupported_message(failure.device_name)
    return failure.error or UNRECOGNISED_ERROR


def _print_failure(out: _Output, offset: float, failure: Failure) -> None:
    """vLLM's output for a failed engine init (reference §2.3): the logged copy, the raw
    multiprocessing copy and the front end's traceback with its wrapper."""
    run, era = out.run, out.era
    exception = _failure_exception(run, failure)
    recognised = failure.reason != "other"
    if era.v1:
        frames = _v1_engine_frames(era, failure)
        out.log(offset, CORE, "ERROR", "core.py:1129",
                "EngineCore failed to start.\n" + _frames_text(era, frames, exception))
        if recognised:
            out.mark_last(ROLE_ROOT_CAUSE)
        raw_frames = [
            (f"/usr/lib/python{era.python}/multiprocessing/process.py", 314, "_bootstrap", "self.run()"),
            (f"/usr/lib/python{era.python}/multiprocessing/process.py", 108, "run",
             "self._target(*self._args, **self._kwargs)"),
            ("v1/engine/core.py", 1133, "run_engine_core", "raise e"),
            *frames,
        ]
        out.raw(offset + 0.01, CORE, f"Process {era.process_name}:\n" + _frames_text(era, raw_frames, exception))
        out.raw(offset + 0.9, API, _frames_text(era, _v1_api_frames(era), _v1_terminal_message(era)))
        out.mark_last(ROLE_TERMINAL)
        out.unprefixed(offset + 1.2, (
            f"/usr/lib/python{era.python}/multiprocessing/resource_tracker.py:279: UserWarning: resource_tracker: "
            "There appear to be 1 leaked shared_memory objects to clean up at shutdown\n"
            "  warnings.warn('resource_tracker: There appear to be %d '"))
        return
    frames = _v0_engine_frames(era, failure)
    mp_head = [
        (f"/usr/lib/python{era.python}/multiprocessing/process.py", 314, "_bootstrap", "self.run()"),
        (f"/usr/lib/python{era.python}/multiprocessing/process.py", 108, "run",
         "self._target(*self._args, **self._kwargs)"),
    ]
    if era.release >= (0, 6, 4):
        # run_mp_engine: logger.exception(e) -- the exception text is the header line.
        text = exception.split(": ", 1)[1] if ": " in exception else exception
        header_line = len(out.lines)
        out.log(offset, CORE, "ERROR", "engine.py:366", text + "\n" + _frames_text(era, frames, exception))
        if recognised:
            out.mark(header_line, ROLE_ROOT_CAUSE)
        mp_frames = [*mp_head, ("engine/multiprocessing/engine.py", 390, "run_mp_engine", "raise e"), *frames]
        terminal = "RuntimeError: Engine process failed to start. See stack trace for the root cause."
    else:
        mp_frames = [*mp_head, *frames]
        terminal = "RuntimeError: Engine process failed to start"
    out.raw(offset + 0.01, CORE, f"Process {era.process_name}:\n" + _frames_text(era, mp_frames, exception))
    if era.release < (0, 6, 4) and recognised:
        out.mark_last(ROLE_ROOT_CAUSE)
    out.raw(offset + 0.9, API, _frames_text(era, _v0_api_frames(era), terminal))
    out.mark_last(ROLE_TERMINAL)


def _print_import_error(out: _Output) -> None:
    """The interpreter's own traceback: the process dies before vLLM prints anything."""
    out.unprefixed(0.8, _frames_text(out.era, [
        ("/opt/vllm/bin/vllm", 5, "<module>", "from vllm.entrypoints.cli.main import main"),
        ("__init__.py", 12, "<module>", "from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs"),
        ("engine/arg_utils.py", 21, "<module>", "import torch"),
        ("{site}/torch/__init__.py", 405, "<module>", "from torch._C import *  # noqa: F403"),
    ], "ImportError: libze_loader.so.1: cannot open shared object file: No such file or directory"))


def _print_serving(out: _Output, offset: float) -> None:
    """Request logs and throughput after a successful start; one request quotes a failure text."""
    run, era = out.run, out.era
    for index in range(run.requests):
        at = offset + 10.0 * (index + 1)
        if index == 0:
            prompt = ("Why does vLLM say: To serve at least one request with the model's max seq len (131072), "
                      "(3.36 GiB KV cache is needed, which is larger than the available KV cache memory (2.13 GiB).")
            out.log(at - 0.2, API, "INFO", "logger.py:39",
                    f"Received request chatcmpl-3f9a{index:04d}: prompt: {prompt!r}, params: "
                    "SamplingParams(n=1, temperature=0.7, max_tokens=512), prompt_token_ids: None, lora_request: None.")
        out.raw(at, API, f'INFO:     127.0.0.1:{51234 + index} - "POST /v1/chat/completions HTTP/1.1" 200 OK')
        if era.v1:
            out.log(at + 0.5, API, "INFO", "loggers.py:123",
                    f"Engine 000: Avg prompt throughput: {52.3 + index:.1f} tokens/s, Avg generation throughput: "
                    f"{38.1 + index:.1f} tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.2%, "
                    "Prefix cache hit rate: 0.0%")
        else:
            out.log(at + 0.5, API, "INFO", "metrics.py:351",
                    f"Avg prompt throughput: {52.3 + index:.1f} tokens/s, Avg generation throughput: "
                    f"{38.1 + index:.1f} tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, "
                    "GPU KV cache usage: 1.2%, CPU KV cache usage: 0.0%.")
    if run.sleep_freed_gib is not None:
        out.log(offset + 10.0 * run.requests + 5.0, CORE, "INFO", "gpu_worker.py:142",
                sleep_message(run.sleep_freed_gib, run.sleep_device_used_gib))


def sleep_message(freed_gib: float, device_used_gib: float) -> str:
    """What the engine logs after it went to sleep (sleep mode): the memory it freed, the device's still used."""
    return f"Sleep mode freed {freed_gib:.2f} GiB memory, {device_used_gib:.2f} GiB memory is still in use."


def wake_message(seconds: float) -> str:
    """What the executor logs once a wake (`POST /wake_up`) took the engine's memory back."""
    return f"It took {seconds:.6f} seconds to wake up tags {{'weights', 'kv_cache'}}."


def api_line(run: VllmRun, began_at: float, offset: float, where: str, message: str) -> UnitLine:
    """One INFO line of the run's API server at `offset` (for what a replay decides later: a wake's request)."""
    out = _Output(run, began_at)
    out.log(offset, API, "INFO", where, message)
    return out.lines[0]


def engine_line(run: VllmRun, began_at: float, offset: float, where: str, message: str) -> UnitLine:
    """One INFO line of the run's engine core at `offset`, in its era's format (for what a replay decides later:
    a sleep)."""
    out = _Output(run, began_at)
    out.log(offset, CORE, "INFO", where, message)
    return out.lines[0]


def _kv_lines(out: _Output, at: float) -> None:
    run, era = out.run, out.era
    tokens = f"{run.tokens:,}" if era.v1 else str(run.tokens)
    length = f"{run.effective_max_model_len:,}"
    concurrency = f"Maximum concurrency for {length} tokens per request: {run.concurrency:.2f}x"
    if era.combined_kv_line:
        out.log(at, CORE, "INFO", "kv_cache_utils.py:1287", f"{era.kv_device} KV cache size: {tokens} tokens, {concurrency}")
    else:
        out.log(at, CORE, "INFO", "kv_cache_utils.py:1087", f"GPU KV cache size: {tokens} tokens")
        out.log(at, CORE, "INFO", "kv_cache_utils.py:1091", concurrency)


def engine_start_lines(run: VllmRun, began_at: float) -> list[UnitLine]:
    """The unit's output for one engine start, its process started at Unix time `began_at`."""
    out = _Output(run, began_at)
    failure = run.failure
    if failure is not None and failure.silent:
        if not failure.exec_failed:
            _print_import_error(out)
        return out.lines
    if run.era.v1:
        _v1_start(out, failure)
    else:
        _v0_start(out, failure)
    return out.lines


def _v1_start(out: _Output, failure: Failure | None) -> None:
    run, era = out.run, out.era
    if era.banner:
        out.log(1.2, API, "INFO", "utils.py:299", _banner(run))
    else:
        out.log(1.2, API, "INFO", "api_server.py:1895", f"vLLM API server version {run.version}")
    out.log(1.2, API, "INFO", "utils.py:328", _non_default_args(run))
    out.log(5.0, API, "INFO", "model.py:1510", f"Using max model len {run.config_max_model_len}")
    if era.release >= (0, 10):
        out.log(5.9, CORE, "INFO", "core.py:654", "Waiting for init message from front-end.")
    out.log(6.1, CORE, "INFO", "core.py:76", _engine_config(run))
    out.log(6.3, CORE, "INFO", "parallel_state.py:1208",
            "rank 0 in world size 1 is assigned as DP rank 0, PP rank 0, TP rank 0, EP rank 0")
    stage = _v1_stage(failure, era) if failure is not None else None
    if stage == "init_device":
        _print_failure(out, 6.6, failure)
        return
    out.log(6.6, CORE, "INFO", "gpu_model_runner.py:2338", f"Starting to load model {run.model}...")
    load = 6.6 + 0.3 * run.init_seconds
    out.raw(7.0, CORE, "Loading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]")
    out.raw(load - 0.2, CORE, "Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:03<00:00,  1.52s/it]\n")
    out.log(load - 0.1, CORE, "INFO", "default_loader.py:267", f"Loading weights took {load - 7.1:.2f} seconds")
    out.log(load, CORE, "INFO", "gpu_model_runner.py:2392", _weights_line(run, load - 6.6))
    if stage == "profile":
        _print_failure(out, load + 2.0, failure)
        return
    budget = 6.1 + 0.6 * run.init_seconds
    if era.profiling_lines:
        profiling = run.profiling
        out.log(budget - 1.0, CORE, "INFO", "xpu_worker.py:104",
                f"Before memory profiling run, total GPU memory: {profiling.total_mb:.2f} MB, model load takes "
                f"{profiling.model_load_mb:.2f} MB, free gpu memory is {profiling.free_before_mb:.2f} MB.")
        out.log(budget, CORE, "INFO", "xpu_worker.py:139",
                f"After memory profiling run, peak memory usage is {profiling.peak_mb:.2f} MB,torch mem is "
                f"{profiling.model_load_mb:.2f} MB, non-torch mem is {profiling.non_torch_mb:.2f} MB, free gpu "
                f"memory is {profiling.free_after_mb:.2f} MB.")
    elif run.skips_profiling:
        if run.startup_plan == "applied":
            out.log(budget - 0.5, CORE, "INFO", "startup_plan.py:212",
                    f"Applying persisted startup plan (fingerprint 3f9a2c41d0b7e6a5): kv_cache_memory_bytes="
                    f"{run.startup_plan_bytes} ({run.kv_cache_gib:.2f} GiB), recorded free-memory baseline "
                    f"{run.startup_plan_baseline_gib:.2f} GiB, current {run.free_gib_at_start:.2f} GiB. Memory "
                    "profiling will be skipped.")
        reserved = run.kv_cache_gib if run.startup_plan == "applied" else run.kv_cache_memory_bytes / GiB
        out.log(budget, CORE, "INFO", "gpu_worker.py:276",
                f"Initial free memory {run.free_gib_at_start} GiB, reserved "
                f"{round(reserved, 2)} GiB memory for KV Cache as specified by "
                "kv_cache_memory_bytes config and skipped memory profiling. This does not respect the "
                "gpu_memory_utilization config. Only use kv_cache_memory_bytes config when you want manual "
                "control of KV cache memory size. If OOM'ed, check the difference of initial free memory "
                "between the current run and the previous run where kv_cache_memory_bytes is suggested and "
                "update it correspondingly.")
    else:
        if run.startup_plan == "fallback":
            out.log(budget - 0.5, CORE, "INFO", "startup_plan.py:198",
                    f"Startup plan not applied: current free memory ({run.free_gib_at_start:.2f} GiB) is below the "
                    f"recorded baseline ({run.startup_plan_baseline_gib:.2f} GiB); falling back to full memory "
                    "profiling.")
        out.log(budget, CORE, "INFO", "gpu_worker.py:298", f"Available KV cache memory: {_gib(run.kv_cache_gib, era)} GiB")
    if run.auto_max_model_len and not (failure is not None and failure.reason == "no_kv_cache_memory"):
        out.log(budget + 0.3, CORE, *auto_fit_line(run))
    if stage == "kv_config":
        _print_failure(out, budget + 0.4, failure)
        return
    _kv_lines(out, budget + 0.4)
    if run.startup_plan in ("fallback", "saved"):
        out.log(budget + 0.5, CORE, "INFO", "startup_plan.py:251",
                "Saved startup plan to /var/cache/vllm/startup_plan/startup_plan_3f9a2c41d0b7e6a5.json")
    if era.startup_summary and not run.skips_profiling:
        out.log(6.1 + 0.9 * run.init_seconds, CORE, "INFO", "gpu_worker.py:436", startup_summary_message(run))
    done = 6.1 + run.init_seconds
    out.log(done, CORE, "INFO", "core.py:210", _init_done_line(run))
    out.mark_last(ROLE_INIT_DONE)
    if (0, 9) <= era.release < (0, 11, 1):
        out.log(done + 0.3, API, "INFO", "loggers.py:142", "Engine 000: vllm cache_config_info with initialization "
                f"after num_gpu_blocks is: {run.tokens // run.effective_block_size}")
    _print_api_ready(out, done + 0.5)


def _v0_start(out: _Output, failure: Failure | None) -> None:
    run, era = out.run, out.era
    out.log(1.0, API, "INFO", "api_server.py:528", f"vLLM API server version {run.version}")
    out.log(1.0, API, "INFO", "api_server.py:529", _namespace_args(run) if era.namespace_args else _non_default_args(run))
    out.log(3.0, CORE, "INFO", "llm_engine.py:237", _engine_config(run))
    out.raw(3.6, CORE, "Loading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]")
    load = 3.0 + 0.4 * run.init_seconds
    out.raw(load - 0.2, CORE, "Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:02<00:00,  1.10s/it]\n")
    out.log(load, CORE, "INFO", "xpu_model_runner.py:414", _weights_line(run, load - 3.0))
    if failure is not None and failure.reason not in ("kv_cache_too_small", "no_kv_cache_memory"):
        _print_failure(out, load + 1.5, failure)
        return
    budget = 3.0 + 0.6 * run.init_seconds
    executor = "executor_base.py" if era.release >= (0, 7) else "gpu_executor.py"
    device = "xpu" if era.release >= (0, 7) else "GPU"
    blocks = 0 if failure is not None and failure.reason == "no_kv_cache_memory" else run.device_blocks
    out.log(budget, CORE, "INFO", f"{executor}:122", f"# {device} blocks: {blocks}, # CPU blocks: {run.cpu_blocks}")
    if era.release >= (0, 6, 3):
        concurrency = blocks * run.effective_block_size / run.effective_max_model_len
        out.log(budget, CORE, "INFO", f"{executor}:126",
                f"Maximum concurrency for {run.effective_max_model_len} tokens per request: {concurrency:.2f}x")
    if failure is not None:
        _print_failure(out, budget + 0.3, failure)
        return
    done = 3.0 + run.init_seconds
    if era.prints_init_duration:
        out.log(done, CORE, "INFO", "llm_engine.py:448", _init_done_line(run))
        out.mark_last(ROLE_INIT_DONE)
    _print_api_ready(out, done + 0.5)


def _print_api_ready(out: _Output, at: float) -> None:
    era = out.era
    if era.v1 and era.release >= (0, 10):
        out.log(at, API, "INFO", "api_server.py:1692", "Supported_tasks: ['generate']")
    server = "Starting vLLM API server 0 on" if era.v1 else "Starting vLLM API server on"
    out.log(at, API, "INFO", "api_server.py:1971", f"{server} http://0.0.0.0:8000")
    out.log(at, API, "INFO", "launcher.py:36", "Available routes are:")
    for route, methods in (("/v1/models", "GET"), ("/v1/chat/completions", "POST"), ("/metrics", "GET")):
        out.log(at, API, "INFO", "launcher.py:44", f"Route: {route}, Methods: {methods}")
    out.raw(at + 0.1, API, f"INFO:     Started server process [{out.api_pid}]\nINFO:     Waiting for application startup.")
    out.raw(at + 0.2, API, "INFO:     Application startup complete.")
    if not era.prints_init_duration:
        out.mark_last(ROLE_INIT_DONE)
    _print_serving(out, at + 0.2)


# ---------------------------------------------------------------------------------------------
# PID 1's records and composition
# ---------------------------------------------------------------------------------------------

_PLACEHOLDER = Moment(0, 0, "0" * 32)


@dataclass(frozen=True)
class Planned:
    """One journal entry at a Unix time: a unit's line (pid = its main process) or PID 1's record
    about the unit (pid 1). `build` makes the journalgen spec once the moment is known."""

    at: float
    unit: str
    message: str
    pid: int
    message_id: str = ""
    role: str = ""
    build: Callable[[Moment], JournalEntrySpec] = field(default=None, compare=False, repr=False)  # type: ignore[assignment]
    invocation_id: str = ""

    @property
    def from_systemd(self) -> bool:
        return self.pid == 1


def _systemd(at: float, unit: str, build: Callable[[Moment], JournalEntrySpec], role: str = "") -> Planned:
    spec = build(_PLACEHOLDER)
    return Planned(at, unit, str(spec.field_value("MESSAGE")), 1, str(spec.field_value("MESSAGE_ID")), role, build,
                   str(spec.field_value("INVOCATION_ID")))


def _unit_stopping(unit: str, at: Moment, *, description: str | None = "vLLM server", job_id: int = 101,
                   invocation_id: str | None = None) -> JournalEntrySpec:
    """'Stopping <unit> - <description>...' (systemd 252, job_emit_start_message for JOB_STOP)."""
    name = f"{unit} - {description}" if description else unit
    return journalgen.systemd_record(
        unit, f"Stopping {name}...", journalgen.MESSAGE_ID_UNIT_STOPPING, at,
        code_file="src/core/job.c", code_func="job_emit_start_message",
        extra=(("JOB_ID", job_id), ("JOB_TYPE", "stop")), invocation_id=invocation_id,
    )


def start_invocation_id(unit: str, at: float, job_id: int) -> str:
    """The invocation id of the start of `unit` at `at` (every start has its own, as systemd gives them)."""
    return uuid.uuid5(uuid.NAMESPACE_OID, f"{unit}/{at!r}/{job_id}").hex


class _Invocation:
    """journalgen's builders of one start: each entry carries the start's invocation id."""

    def __init__(self, invocation_id: str) -> None:
        self._invocation_id = invocation_id

    def __getattr__(self, name: str) -> Callable[..., JournalEntrySpec]:
        return partial(getattr(journalgen, name), invocation_id=self._invocation_id)


@dataclass(frozen=True)
class ServiceStart:
    entries: tuple[Planned, ...]
    exited_at: float | None  # when the main process exited (None: still running)
    restart_at: float | None  # when systemd begins the scheduled restart (None: none scheduled)


def service_start(unit: str, run: VllmRun, at: float, *, job_id: int = 100, restart_counter: int | None = None,
                  restart_sec: float = 10.0, stop_after: float | None = None, late_after: float | None = None,
                  late_delay: float = 0.002, description: str | None = "vLLM server") -> ServiceStart:
    """One start of `unit` by systemd at Unix time `at`: Starting/Started, the run's output, and, when
    it fails, the main process's exit, the unit's failure and (restart_counter given) the scheduled
    restart with its "Stopped". `stop_after`: an operator stops the unit that many seconds in; the
    output stops there and vLLM's reaction to SIGTERM follows the Stopping record.

    `late_after`: journald reads a unit's stdout stream and PID 1's native-socket records in no
    defined order (systemd/systemd#32716, #25932), so the last lines of a dying process can be
    stored after PID 1's "Main process exited" / "Failed with result" records. The failed run's
    lines printed `late_after` seconds or more into the run land `late_delay` seconds after them
    (with systemd's default RestartSec=100ms, possibly after the restart's "Starting")."""
    invocation = start_invocation_id(unit, at, job_id)
    of_start = _Invocation(invocation)
    entries = [
        _systemd(at, unit, partial(of_start.unit_starting, unit, description=description, job_id=job_id)),
        _systemd(at + 0.002, unit, partial(of_start.unit_started, unit, description=description, job_id=job_id)),
    ]
    began = at + 0.004
    lines = engine_start_lines(run, began)
    if stop_after is not None:
        lines = [line for line in lines if line.offset < stop_after]
    late: list[UnitLine] = []
    if late_after is not None and run.failure is not None:
        late = [line for line in lines if line.offset >= late_after]
    for line in lines[:len(lines) - len(late)]:
        entries.append(Planned(began + line.offset, unit, line.message, line.pid, "", line.role,
                               partial(of_start.unit_output, unit, line.message, pid=line.pid), invocation))
    if stop_after is not None:
        stopping = began + stop_after
        entries.append(_systemd(stopping, unit, partial(_unit_stopping, unit, description=description,
                                                        job_id=job_id + 1, invocation_id=invocation)))
        if run.era.v1:
            # The engine core exits on SIGTERM; the front end, still waiting for it, reports it.
            out = _Output(run, began)
            out.raw(stop_after + 0.3, API, _frames_text(run.era, _v1_api_frames(run.era), _v1_terminal_message(run.era, failed=False)))
            for line in out.lines:
                entries.append(Planned(began + line.offset, unit, line.message, line.pid, "", "",
                                       partial(of_start.unit_output, unit, line.message, pid=line.pid),
                                       invocation))
        exited = stopping + 0.6
        entries += [
            _systemd(exited, unit, partial(of_start.unit_process_exited, unit, status=1), ROLE_PROCESS_EXIT),
            _systemd(exited + 0.001, unit, partial(of_start.unit_failed, unit)),
            _systemd(exited + 0.002, unit, partial(of_start.unit_stopped, unit, description=description, job_id=job_id + 1)),
        ]
        return ServiceStart(tuple(entries), exited, None)
    if run.failure is None:
        return ServiceStart(tuple(entries), None, None)
    last = lines[-1].offset if lines else 0.0
    exited = began + last + (0.3 if lines else 0.002)
    status = 203 if run.failure.exec_failed else 1
    entries += [
        _systemd(exited, unit, partial(of_start.unit_process_exited, unit, status=status), ROLE_PROCESS_EXIT),
        _systemd(exited + 0.001, unit,
                 partial(of_start.unit_failed, unit, result="exit-code")),
    ]
    for index, line in enumerate(late):
        entries.append(Planned(exited + late_delay + index * 1e-6, unit, line.message, line.pid, "", line.role,
                               partial(of_start.unit_output, unit, line.message, pid=line.pid), invocation))
    if restart_counter is None:
        return ServiceStart(tuple(entries), exited, None)
    restart = exited + restart_sec
    entries += [
        _systemd(restart, unit, partial(of_start.unit_restart_scheduled, unit, counter=restart_counter)),
        _systemd(restart + 0.001, unit, partial(of_start.unit_stopped, unit, description=description, job_id=job_id)),
    ]
    return ServiceStart(tuple(entries), exited, restart + 0.002)


def service_runs(unit: str, runs: Sequence[VllmRun], at: float, *, restart_sec: float = 10.0,
                 job_id: int = 100, description: str | None = "vLLM server") -> list[Planned]:
    """A unit's consecutive starts: each failed run but the last is restarted by systemd
    (Restart=on-failure, RestartSec=restart_sec); each restart gets a new main pid."""
    entries: list[Planned] = []
    when = at
    for index, run in enumerate(runs):
        more = index + 1 < len(runs)
        if index:
            run = replace(run, main_pid=run.main_pid + 1000 * index)
        start = service_start(unit, run, when, job_id=job_id + 10 * index,
                              restart_counter=index + 1 if more else None, restart_sec=restart_sec,
                              description=description)
        entries += start.entries
        if more:
            if start.restart_at is None:
                raise ValueError(f"run {index} of {unit} does not fail, so nothing restarts it")
            when = start.restart_at
    return entries


@dataclass(frozen=True)
class Boot:
    boot_id: str
    booted_at: float  # Unix time of the kernel's boot: monotonic zero
    entries: tuple[Planned, ...]


@dataclass(frozen=True)
class Placed:
    """A planned entry at its place in the journal."""

    planned: Planned
    realtime_usec: int
    monotonic_usec: int
    boot_id: str

    def spec(self) -> JournalEntrySpec:
        return self.planned.build(Moment(self.realtime_usec, self.monotonic_usec, self.boot_id))


def compose(*boots: Boot) -> list[Placed]:
    """All boots' entries in journal order: boots by boot time, entries by time (ties keep the
    order given). Realtime stamps strictly increase, as one journald writes them."""
    placed: list[Placed] = []
    last_usec = 0
    for boot in sorted(boots, key=lambda b: b.booted_at):
        booted_usec = round(boot.booted_at * 1_000_000)
        order = sorted(range(len(boot.entries)), key=lambda i: (boot.entries[i].at, i))
        for index in order:
            entry = boot.entries[index]
            usec = max(round(entry.at * 1_000_000), last_usec + 1)
            last_usec = usec
            placed.append(Placed(entry, usec, usec - booted_usec, boot.boot_id))
    return placed


def journal_specs(placed: Iterable[Placed]) -> list[JournalEntrySpec]:
    return [entry.spec() for entry in placed]


@dataclass(frozen=True)
class TrackerEntry:
    """What vllm_xpu_exporter.fold.engine_starts.EngineTracker reads of a journal entry."""

    unit: str
    realtime_usec: int
    message: str
    from_systemd: bool
    message_id: str
    pid: int  # _PID: the unit's main process, or 1
    invocation_id: str = ""  # _SYSTEMD_INVOCATION_ID / INVOCATION_ID; '' for journals without it


def tracker_entries(placed: Iterable[Placed], *, boot_id: str | None = None,
                    unit_globs: Sequence[str] = ("vllm*.service",)) -> list[TrackerEntry]:
    """The entries the journal reader hands over: watched units only, of one boot (None: all)."""
    return [
        TrackerEntry(p.planned.unit, p.realtime_usec, p.planned.message, p.planned.from_systemd, p.planned.message_id,
                     p.planned.pid, p.planned.invocation_id)
        for p in placed
        if (boot_id is None or p.boot_id == boot_id)
        and any(fnmatch.fnmatchcase(p.planned.unit, glob) for glob in unit_globs)
    ]


def first(placed: Iterable[Placed], unit: str, role: str, *, after_usec: int = -1) -> Placed:
    """The first entry of `unit` with `role` after a time (StopIteration if none)."""
    return next(p for p in placed if p.planned.unit == unit and p.planned.role == role and p.realtime_usec > after_usec)


def restart_begins(placed: Iterable[Placed], unit: str, number: int = 2) -> int:
    """realtime of the unit's number-th "Starting" record (the 2nd: systemd's first restart)."""
    starting = [p for p in placed if p.planned.unit == unit and p.planned.from_systemd
                and p.planned.message_id == journalgen.MESSAGE_ID_UNIT_STARTING]
    return starting[number - 1].realtime_usec


def failure_instant(placed: Iterable[Placed], unit: str) -> int:
    """When the unit's first failed start failed: the first print of a recognised root cause, else
    the front end's terminal wrapper, else PID 1's record of the main process's exit."""
    placed = list(placed)
    for role in (ROLE_ROOT_CAUSE, ROLE_TERMINAL, ROLE_PROCESS_EXIT):
        try:
            return first(placed, unit, role).realtime_usec
        except StopIteration:
            continue
    raise ValueError(f"{unit} has no failed start")


# ---------------------------------------------------------------------------------------------
# Starts on a journalgen Clock, for tests that build a journal entry by entry
# ---------------------------------------------------------------------------------------------


def unit_start(unit: str, run: VllmRun, clock: journalgen.Clock, **options: object) -> list[JournalEntrySpec]:
    """One start of `unit` (`service_start`, with its `options`) as journal entries from `clock`'s next
    tick on, in `clock`'s boot; the clock ends at the start's last entry, so what the test writes next
    comes after it."""
    at = (clock.realtime_usec + clock.step_usec) / 1e6
    booted_at = (clock.realtime_usec - clock.monotonic_usec) / 1e6
    placed = compose(Boot(clock.boot_id, booted_at, service_start(unit, run, at, **options).entries))
    clock.realtime_usec, clock.monotonic_usec = placed[-1].realtime_usec, placed[-1].monotonic_usec
    return journal_specs(placed)


def chat_runs() -> tuple[VllmRun, VllmRun]:
    """A chat unit's start that fails (kv_cache_too_small: 2.13 GiB available, 3.36 GiB needed) and one
    that comes up (3.25 GiB, 47,328 tokens, 0.36x, init 42.50 s, a new main pid): vLLM 0.24 serving
    Qwen3-8B with max_model_len 131072, gpu_memory_utilization 0.75 and max_num_seqs 3."""
    started = VllmRun("0.24.0", model="Qwen/Qwen3-8B", gpu_memory_utilization=0.75, max_model_len=131072,
                      max_num_seqs=3, kv_cache_gib=3.25, kv_cache_tokens=47_328, max_concurrency=0.36,
                      init_seconds=42.5, main_pid=3402)
    failed = replace(started, kv_cache_gib=2.13, main_pid=3401,
                     failure=Failure("kv_cache_too_small", needed_gib=3.36, estimated_max_model_len=46528))
    return failed, started


# ---------------------------------------------------------------------------------------------
# The problem statement's boot race
# ---------------------------------------------------------------------------------------------

CHAT = "vllm-xpu-chat.service"
EMBEDDING = "vllm-xpu-embedding.service"
STT = "vllm-xpu-stt.service"
UNWATCHED = "other-llm.service"
LEGACY = "vllm-xpu-legacy.service"  # only in the previous boot
RACE_ORIGIN = 1_747_044_672.0  # 2025-05-12 10:11:12 UTC: the units start, 14.2 s after boot
RACE_BOOT_ID = "3c1f0a9e5b7d4e2f8a6c0b1d2e3f4a5b"
PREVIOUS_BOOT_ID = "9a8b7c6d5e4f40312a1b2c3d4e5f6a7b"
RACE_VERSION = "0.24.0"
GPU_TOTAL_GIB = 15.91  # a 16 GiB-class Arc


def race_chat_runs() -> tuple[VllmRun, VllmRun]:
    """The chat unit's failed boot start and its lone restart (the problem statement's figures)."""
    failed = VllmRun(
        RACE_VERSION, model="google/gemma-3-4b-it", gpu_memory_utilization=0.75, max_model_len=131072,
        max_num_seqs=3, kv_cache_gib=2.13, total_gib=GPU_TOTAL_GIB, free_gib_at_start=15.42, weights_gib=8.58,
        init_seconds=40.0, main_pid=2301,
        failure=Failure("kv_cache_too_small", needed_gib=3.36, estimated_max_model_len=46528),
    )
    restarted = replace(failed, kv_cache_gib=3.25, kv_cache_tokens=136_960, max_concurrency=1.04,
                        init_seconds=38.5, compilation_seconds=12.75, failure=None, requests=3)
    return failed, restarted


def race_embedding_run() -> VllmRun:
    return VllmRun(RACE_VERSION, model="BAAI/bge-small-en-v1.5", gpu_memory_utilization=0.07, max_model_len=512,
                   kv_cache_gib=0.61, kv_bytes_per_token=36864, block_size=16, total_gib=GPU_TOTAL_GIB,
                   weights_gib=0.06, init_seconds=24.0, compilation_seconds=6.1, main_pid=2302)


def race_stt_run() -> VllmRun:
    return VllmRun(RACE_VERSION, model="openai/whisper-small", gpu_memory_utilization=0.07, max_model_len=448,
                   kv_cache_gib=0.38, kv_bytes_per_token=73728, total_gib=GPU_TOTAL_GIB, weights_gib=0.45,
                   init_seconds=28.0, compilation_seconds=9.4, main_pid=2303)


@dataclass(frozen=True)
class BootRace:
    placed: tuple[Placed, ...]
    boot_id: str
    previous_boot_id: str
    chat_runs: tuple[VllmRun, VllmRun]
    embedding_run: VllmRun
    stt_run: VllmRun

    def entries(self) -> list[TrackerEntry]:
        """The race boot's entries of the watched (vllm*.service) units, as the reader selects them."""
        return tracker_entries(self.placed, boot_id=self.boot_id)

    def this_boot(self) -> list[Placed]:
        """The race boot's entries, of every unit."""
        return [p for p in self.placed if p.boot_id == self.boot_id]

    def chat_failure_usec(self) -> int:
        """When chat's init failed: the first print of its root cause."""
        return first(self.this_boot(), CHAT, ROLE_ROOT_CAUSE).realtime_usec

    def chat_restart_usec(self) -> int:
        """When systemd began chat's restart: its second "Starting" record of the race boot."""
        return restart_begins(self.this_boot(), CHAT)

    def split_at_chat_restart(self) -> tuple[list[Placed], list[Placed]]:
        """The journal before chat's restart (both boots), and from the restart on: to replay it live."""
        restart = self.chat_restart_usec()
        return ([p for p in self.placed if p.realtime_usec < restart],
                [p for p in self.placed if p.realtime_usec >= restart])


def boot_race(origin: float = RACE_ORIGIN) -> BootRace:
    """Three units started by systemd in the same second on one GPU: embedding and stt init fine;
    chat fails (kv_cache_too_small, "(2.13 GiB)" available, 3.36 GiB needed), is restarted 10 s after
    its exit and succeeds with 3.25 GiB. Around it: an unwatched unit printing the same failure,
    request and throughput noise, and a previous boot of the same units (plus one only there), a day
    earlier. `origin`: when the units start (a recent one makes the failure recent to a live exporter)."""
    chat_failed, chat_restarted = race_chat_runs()
    embedding, stt = race_embedding_run(), race_stt_run()
    race = [
        *service_runs(CHAT, [chat_failed, chat_restarted], origin, job_id=120),
        *service_runs(EMBEDDING, [embedding], origin + 0.001, job_id=121),
        *service_runs(STT, [stt], origin + 0.002, job_id=122),
        *service_runs(UNWATCHED, [replace(chat_failed, main_pid=2304)], origin + 0.003, job_id=123,
                      description="Another LLM"),
    ]
    day = 86_400.0
    previous = [
        *service_runs(CHAT, [replace(chat_restarted, version="0.23.0", kv_cache_gib=4.02, kv_cache_tokens=None,
                                     max_concurrency=None, main_pid=1301)], origin - day, job_id=120),
        *service_runs(EMBEDDING, [replace(embedding, kv_cache_gib=-0.12, main_pid=1302,
                                          failure=Failure("no_kv_cache_memory")), replace(embedding, main_pid=1302)],
                      origin - day + 0.001, job_id=121),
        *service_runs(LEGACY, [VllmRun("0.19.1", main_pid=1305)], origin - day + 0.005, job_id=125),
    ]
    placed = compose(Boot(PREVIOUS_BOOT_ID, origin - day - 14.2, tuple(previous)),
                     Boot(RACE_BOOT_ID, origin - 14.2, tuple(race)))
    return BootRace(tuple(placed), RACE_BOOT_ID, PREVIOUS_BOOT_ID, (chat_failed, chat_restarted), embedding, stt)
