"""vLLM's memory rules on one XPU, in one place: what a start asks of the device, what KV a target of tokens
needs, what a unit holds, whether a GPU's units fit. Pure functions of integers (bytes, tokens) and the
`gpu_memory_utilization` ratio; no I/O.

Shared by the init gate (`vllm_xpu_exporter.gate.decision.decide`: the free memory a start needs), the
restart-headroom figure (`vllm_xpu_exporter.collectors.processes`) and the plan (`vllm_xpu_exporter.planner.plans`: the planner and
the exporter's planned figures), so they agree to the byte.

The rules (vLLM 0.16+ on XPU, as read in its source; docs/planner.md):
* a start asks for `math.ceil(total * gpu_memory_utilization)` bytes (`v1/worker/utils.py::request_memory`,
  the same float product, rounded up) and fails at once when less is free;
* its KV budget is that minus its non-KV memory (weights + peak activation + non-torch), unless
  `--kv-cache-memory-bytes` fixes the budget (effective on XPU from 0.16.0);
* the KV cache is allocated in blocks of `block_size` tokens (a page of every layer's KV): vLLM takes
  `budget // page` blocks, checks that one request of the full length (`cdiv(max_model_len, block_size)`
  pages) fits, and its block pool keeps block 0 back as the null block;
* what vLLM prints is rounded ("%.2f GiB": +-0.005 GiB; "Cx": +-0.005): a budget is planned from the
  end of that range that makes it large enough, so vLLM takes it whatever the true figure was.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "DEFAULT_RESERVE_BYTES",
    "DeviceFit",
    "KvBlocks",
    "Footprint",
    "NULL_BLOCKS",
    "blocks_for_tokens",
    "concurrency_lower_bound",
    "device_fit",
    "kv_budget_for_requests",
    "kv_budget_for_tokens",
    "printed_lower_bound",
    "printed_upper_bound",
    "requested_bytes",
    "requests_for_kv_budget",
    "restart_headroom_bytes",
    "tokens_for_kv_budget",
    "utilisation_for",
]

DEFAULT_RESERVE_BYTES = 512 << 20
"""Device memory no engine's footprint counts: the driver's and the Level Zero / SYCL runtime's own, with room
for the rounding of vLLM's prints (docs/planner.md "The reserve"): the planner's --reserve default, and what the
admission account keeps back."""


def requested_bytes(total_bytes: int, gpu_memory_utilization: float) -> int:
    """The bytes a start with this `gpu_memory_utilization` asks of a device of `total_bytes`: vLLM's own
    `math.ceil(total_memory * gpu_memory_utilization)` (the float product, so 0.07 x 2**34 rounds up the
    way vLLM's does, not as the exact decimal would)."""
    return math.ceil(total_bytes * gpu_memory_utilization)


def restart_headroom_bytes(free_bytes: int, own_bytes: int, total_bytes: int, gpu_memory_utilization: float) -> int:
    """What would be left of the free memory if the unit restarted now: the memory it holds comes back,
    its start asks `requested_bytes` again. Negative: the restart would fail the free-memory check."""
    return free_bytes + own_bytes - requested_bytes(total_bytes, gpu_memory_utilization)


def utilisation_for(footprint_bytes: int, total_bytes: int, decimals: int = 4) -> float | None:
    """The unit's share of the device, `footprint_bytes / total_bytes` rounded up to `decimals` decimals, so
    that its request covers `footprint_bytes`: with `--kv-cache-memory-bytes` set, vLLM still checks at start
    that ceil(total x R) is free, and the gate waits for the same; R = the unit's share says "start when my
    whole footprint is free". `total_bytes` is the total vLLM multiplies (the Level Zero core total on XPU).
    None when no R below 1 covers the footprint: such a unit cannot be given its footprint by vLLM."""
    if total_bytes <= 0:
        raise ValueError("total_bytes must be positive")
    scale = 10 ** decimals
    # the exact share, rounded up to the decimals (never beyond the last R below 1, whose ceil may still cover it)
    steps = min(-(-footprint_bytes * scale // total_bytes), scale - 1)
    while steps < scale and requested_bytes(total_bytes, steps / scale) < footprint_bytes:
        steps += 1  # float rounding of steps / scale
    return steps / scale if steps < scale else None


# vLLM's block pool keeps block 0 back as its null block: a budget of N blocks serves N - 1.
NULL_BLOCKS = 1


GiB = 1 << 30


def _half_step(unit: int, decimals: int) -> int:
    """Half the step of a print with `decimals` decimals of `unit` bytes, rounded up, plus the byte the
    print's reading back to bytes may have rounded away."""
    return -(-unit // (2 * 10 ** decimals)) + 1


def printed_upper_bound(printed: int, unit: int = GiB, decimals: int = 2) -> int:
    """The largest true byte count a print of `decimals` decimals of `unit` ("%.2f GiB": +-0.005 GiB)
    can stand for, `printed` being the print read back to bytes."""
    return printed + _half_step(unit, decimals)


def printed_lower_bound(printed: int, unit: int = GiB, decimals: int = 2) -> int:
    """The smallest true byte count such a print can stand for (never below 0)."""
    return max(0, printed - _half_step(unit, decimals))


def concurrency_lower_bound(printed: float, decimals: int = 2) -> tuple[int, int]:
    """The smallest concurrency a "%.2fx" print can stand for, as a fraction (numerator, denominator)."""
    scale = 10 ** decimals
    return 2 * round(printed * scale) - 1, 2 * scale


@dataclass(frozen=True)
class KvBlocks:
    """What a start's KV cache shows of its blocks, as upper bounds vLLM's true figures never exceed:
    `block_bytes`, one block of `block_size` tokens over every layer (its page size), and `request_bytes`,
    one request of the full length `max_model_len` (None when the start printed no concurrency)."""

    block_size: int
    block_bytes: int
    max_model_len: int | None = None
    request_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_bytes <= 0:
            raise ValueError("a KV block needs a positive size in tokens and bytes")

    @property
    def bytes_per_token(self) -> float:
        return self.block_bytes / self.block_size

    @classmethod
    def of(cls, kv_bytes_max: int, kv_tokens: int, block_size: int, max_model_len: int | None = None,
           concurrency_min: tuple[int, int] | None = None) -> KvBlocks:
        """From a start whose KV cache was at most `kv_bytes_max` bytes and held `kv_tokens` tokens (its
        whole blocks): a block is at most kv_bytes_max x block_size / kv_tokens bytes (vLLM takes
        available // page_size blocks, so blocks x page_size <= available). `concurrency_min`, the
        concurrency printed for `max_model_len` at its lowest (a fraction numerator, denominator):
        a full-length request is at most kv_bytes_max / concurrency, which holds for models whose KV
        is not linear in tokens too."""
        if kv_bytes_max <= 0 or kv_tokens <= 0:
            raise ValueError("a KV cache needs positive bytes and tokens")
        block_bytes = kv_bytes_max * block_size // kv_tokens
        block_bytes = max(1, block_bytes)
        request_bytes = None
        if concurrency_min is not None and concurrency_min[0] > 0 and max_model_len:
            # vLLM's concurrency is blocks / blocks of one request (older: tokens / length); the blocks of
            # one request at the block's bound cover the second form, and are ~ the first for models whose
            # tokens are derived from the concurrency
            request_bytes = max(kv_bytes_max * concurrency_min[1] // concurrency_min[0],
                                blocks_for_tokens(max_model_len, block_size) * block_bytes)
        return cls(block_size, block_bytes, max_model_len, request_bytes)


def blocks_for_tokens(tokens: int, block_size: int) -> int:
    if tokens < 0 or block_size <= 0:
        raise ValueError("tokens must be >= 0 and block_size > 0")
    return -(-tokens // block_size)


def kv_budget_for_tokens(tokens: int, kv: KvBlocks) -> int:
    """The --kv-cache-memory-bytes under which vLLM serves `tokens` tokens: their whole blocks and the
    null block, each at its upper bound."""
    return (blocks_for_tokens(tokens, kv.block_size) + NULL_BLOCKS) * kv.block_bytes


def kv_budget_for_requests(requests: int, kv: KvBlocks) -> int:
    """The budget under which vLLM serves `requests` requests of the full length at once: from the
    concurrency it printed when it did, else from the blocks of `requests` x the length."""
    if kv.request_bytes is not None:
        return requests * kv.request_bytes + NULL_BLOCKS * kv.block_bytes
    if kv.max_model_len is None:
        raise ValueError("no maximum model length known")
    return kv_budget_for_tokens(requests * kv.max_model_len, kv)


def tokens_for_kv_budget(kv_bytes: int, kv: KvBlocks) -> int:
    """The tokens a budget of `kv_bytes` surely holds: its whole blocks at their upper bound, less the
    null block."""
    if kv_bytes < 0:
        raise ValueError("kv_bytes must be >= 0")
    return max(0, kv_bytes // kv.block_bytes - NULL_BLOCKS) * kv.block_size


def requests_for_kv_budget(kv_bytes: int, kv: KvBlocks) -> int:
    """The full-length requests a budget of `kv_bytes` surely serves at once."""
    if kv.request_bytes is not None:
        return max(0, kv_bytes - NULL_BLOCKS * kv.block_bytes) // kv.request_bytes
    if kv.max_model_len is None:
        raise ValueError("no maximum model length known")
    return tokens_for_kv_budget(kv_bytes, kv) // (blocks_for_tokens(kv.max_model_len, kv.block_size) * kv.block_size)


@dataclass(frozen=True)
class Footprint:
    """What a unit holds on its GPU once it serves: its non-KV memory and its KV cache. `non_kv_bytes` is
    weights + peak activation + non-torch (split in `weights_bytes` etc. where the release printed it)."""

    non_kv_bytes: int
    kv_bytes: int
    weights_bytes: int | None = None
    activation_bytes: int | None = None
    non_torch_bytes: int | None = None

    @property
    def total_bytes(self) -> int:
        return self.non_kv_bytes + self.kv_bytes

    @classmethod
    def of(cls, weights_bytes: int, activation_bytes: int, non_torch_bytes: int, kv_bytes: int) -> Footprint:
        return cls(weights_bytes + activation_bytes + non_torch_bytes, kv_bytes, weights_bytes, activation_bytes,
                   non_torch_bytes)


@dataclass(frozen=True)
class DeviceFit:
    """A GPU's units against its memory: `total_bytes` less `reserve_bytes` (the driver's and other
    processes' own memory) is what the units may use."""

    total_bytes: int
    reserve_bytes: int
    footprint_bytes: int  # the units' footprints, summed

    @property
    def usable_bytes(self) -> int:
        return self.total_bytes - self.reserve_bytes

    @property
    def left_bytes(self) -> int:
        """What is left after the units (negative: they do not fit)."""
        return self.usable_bytes - self.footprint_bytes

    @property
    def fits(self) -> bool:
        return self.left_bytes >= 0

    @property
    def missing_bytes(self) -> int:
        return max(0, -self.left_bytes)


def device_fit(total_bytes: int, reserve_bytes: int, footprints: Iterable[int]) -> DeviceFit:
    return DeviceFit(total_bytes, reserve_bytes, sum(footprints))
