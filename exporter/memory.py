"""vLLM's memory rules on one XPU, in one place: what a start asks of the device, what KV a target of tokens
needs, what a unit holds, whether a GPU's units fit. Pure functions of integers (bytes, tokens) and the
`gpu_memory_utilization` ratio; no I/O.

Shared by the init gate (`vllm_xpu_exporter.gate.decision.decide`: the free memory a start needs), the
restart-headroom figure (`vllm_xpu_exporter.collectors.processes`) and the plan (`vllm_xpu_exporter.planning`: the planner and
the exporter's planned figures), so they agree to the byte.

The rules (reference: /work/shared/reference/vllm-logs.md §5, vLLM 0.16+ on XPU):
* a start asks for `math.ceil(total * gpu_memory_utilization)` bytes (`v1/worker/utils.py::request_memory`,
  the same float product, rounded up) and fails at once when less is free;
* its KV budget is that minus its non-KV memory (weights + peak activation + non-torch), unless
  `--kv-cache-memory-bytes` fixes the budget (effective on XPU from 0.16.0);
* the KV cache is allocated in blocks of `block_size` tokens: a target of tokens needs whole blocks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "DeviceFit",
    "KvRate",
    "Footprint",
    "device_fit",
    "kv_bytes_for_tokens",
    "requested_bytes",
    "restart_headroom_bytes",
    "tokens_for_kv_bytes",
    "utilisation_for",
]


def requested_bytes(total_bytes: int, gpu_memory_utilization: float) -> int:
    """The bytes a start with this `gpu_memory_utilization` asks of a device of `total_bytes`: vLLM's own
    `math.ceil(total_memory * gpu_memory_utilization)` (the float product, so 0.07 x 2**34 rounds up the
    way vLLM's does, not as the exact decimal would)."""
    return math.ceil(total_bytes * gpu_memory_utilization)


def restart_headroom_bytes(free_bytes: int, own_bytes: int, total_bytes: int, gpu_memory_utilization: float) -> int:
    """What would be left of the free memory if the unit restarted now: the memory it holds comes back,
    its start asks `requested_bytes` again. Negative: the restart would fail the free-memory check."""
    return free_bytes + own_bytes - requested_bytes(total_bytes, gpu_memory_utilization)


def utilisation_for(footprint_bytes: int, total_bytes: int, decimals: int = 4) -> float:
    """The unit's share of the device, `footprint_bytes / total_bytes` rounded up to `decimals` decimals
    (capped at 1.0), so that its request covers `footprint_bytes`: with `--kv-cache-memory-bytes` set, vLLM still checks at start that
    ceil(total x R) is free, and the gate waits for the same; R = the unit's share says "start when my
    whole footprint is free"."""
    if total_bytes <= 0:
        raise ValueError("total_bytes must be positive")
    scale = 10 ** decimals
    steps = -(-footprint_bytes * scale // total_bytes)  # the exact share, rounded up to the decimals
    while steps < scale and requested_bytes(total_bytes, steps / scale) < footprint_bytes:
        steps += 1  # float rounding of steps / scale
    return min(steps, scale) / scale


@dataclass(frozen=True)
class KvRate:
    """KV bytes per token, as a start showed it: `kv_bytes` of KV cache held `kv_tokens` tokens. Kept as the
    fraction, so no float rounding enters the planned bytes."""

    kv_bytes: int
    kv_tokens: int

    def __post_init__(self) -> None:
        if self.kv_bytes <= 0 or self.kv_tokens <= 0:
            raise ValueError("a KV rate needs positive bytes and tokens")

    @property
    def bytes_per_token(self) -> float:
        return self.kv_bytes / self.kv_tokens


def kv_bytes_for_tokens(tokens: int, block_size: int, rate: KvRate) -> int:
    """The KV bytes `tokens` tokens need: whole blocks of `block_size` tokens, each token at `rate`,
    rounded up to the byte."""
    if tokens < 0 or block_size <= 0:
        raise ValueError("tokens must be >= 0 and block_size > 0")
    blocks = -(-tokens // block_size)
    return -(-(blocks * block_size * rate.kv_bytes) // rate.kv_tokens)


def tokens_for_kv_bytes(kv_bytes: int, block_size: int, rate: KvRate) -> int:
    """The tokens a KV cache of `kv_bytes` holds: the whole blocks that fit (kv_bytes_for_tokens of the
    result is at most `kv_bytes`)."""
    if kv_bytes < 0 or block_size <= 0:
        raise ValueError("kv_bytes must be >= 0 and block_size > 0")
    return kv_bytes * rate.kv_tokens // (block_size * rate.kv_bytes) * block_size


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
