"""What the gate's client and service say to each other over the service's Unix socket (docs/gate.md,
"The socket"): one JSON line each way, then the service's lines until its answer.

The client sends one `Request`: how long its unit will wait and what to do then, and the unit's own
settings (R, device, whether it runs with an absolute KV budget); `wake` when it asks for its sleeping engine's
wake (`vllm-xpu-gate wake`) rather than a start. The unit is not in it: the service
reads it from the kernel (the connecting process's cgroup). The service then sends `Say` lines (each a
complete `vllm-xpu-gate: ...` line the client writes to its unit's journal) and one `Answer` (the
decision line and the client's exit status), and closes the connection.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from vllm_xpu_exporter.pci import normalise_pci_address

DEFAULT_SOCKET = "/run/vllm-xpu-gate/gate.sock"
MAX_MESSAGE_BYTES = 4096
# --timeout's cap: a week is past any start, and far larger durations overflow time.sleep().
MAX_DURATION_S = 7 * 24 * 3600.0

# The planner's drop-in states the unit's planned figures to the client in its environment (docs/planner.md):
# the defaults of `vllm-xpu-gate wait --kv-cache-memory-bytes` and `--gpu-memory-utilization`.
BUDGET_VARIABLE = "VLLM_XPU_GATE_KV_CACHE_MEMORY_BYTES"
RATIO_VARIABLE = "VLLM_XPU_GATE_GPU_MEMORY_UTILIZATION"


class BadRequest(ValueError):
    """A request the service refuses (its message says why, on one line)."""


@dataclass(frozen=True)
class Request:
    timeout: float  # seconds the unit waits at most
    start_on_timeout: bool
    gpu_memory_utilization: float | None = None
    device: str | None = None  # PCI address; None: the only GPU
    kv_cache_memory_bytes: int | None = None  # the unit's absolute KV budget, when it runs with one
    legacy_drop_in: bool = False  # the client runs from the 0.2 drop-in's line (root in the unit)
    wake: bool = False  # a wake of the unit's sleeping engine, not a start

    def encode(self) -> bytes:
        fields = {"timeout": self.timeout, "start_on_timeout": self.start_on_timeout,
                  "gpu_memory_utilization": self.gpu_memory_utilization, "device": self.device,
                  "kv_cache_memory_bytes": self.kv_cache_memory_bytes}
        return json.dumps({**fields, **legacy_field(self.legacy_drop_in),
                           **({"wake": True} if self.wake else {})}).encode() + b"\n"

    @classmethod
    def decode(cls, data: bytes) -> Request:
        """The request in one line the client sent; BadRequest for anything else."""
        try:
            fields = json.loads(data, parse_constant=_refuse)
        except (ValueError, RecursionError):
            raise BadRequest("not a gate request (JSON)") from None
        if not isinstance(fields, dict):
            raise BadRequest("not a gate request (an object)")
        timeout = fields.get("timeout")
        if not _number(timeout) or not 0 <= timeout <= MAX_DURATION_S:
            raise BadRequest(f"timeout: want seconds from 0 to {MAX_DURATION_S:g}")
        if not isinstance(fields.get("start_on_timeout"), bool):
            raise BadRequest("start_on_timeout: want true or false")
        ratio = fields.get("gpu_memory_utilization")
        if ratio is not None and (not _number(ratio) or not 0 < ratio <= 1):
            raise BadRequest("gpu_memory_utilization: want a number above 0 and at most 1")
        device = fields.get("device")
        if device is not None and (not isinstance(device, str) or normalise_pci_address(device) is None):
            raise BadRequest("device: want a PCI address")
        budget = fields.get("kv_cache_memory_bytes")
        if budget is not None and (type(budget) is not int or not 0 < budget < 2 ** 63):
            raise BadRequest("kv_cache_memory_bytes: want a positive whole number of bytes")
        wake = fields.get("wake", False)
        if not isinstance(wake, bool):
            raise BadRequest("wake: want true or false")
        return cls(float(timeout), fields["start_on_timeout"], None if ratio is None else float(ratio),
                   None if device is None else normalise_pci_address(device), budget,
                   legacy_drop_in=decode_legacy_field(fields), wake=wake)


def legacy_field(legacy_drop_in: bool) -> dict[str, bool]:
    """The request's `legacy_drop_in`, sent only when true: the 0.3 client's requests stay as they were."""
    return {"legacy_drop_in": True} if legacy_drop_in else {}


def decode_legacy_field(fields: dict) -> bool:
    legacy = fields.get("legacy_drop_in", False)
    if not isinstance(legacy, bool):
        raise BadRequest("legacy_drop_in: want true or false")
    return legacy


def _number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)  # a bool is no number here


def _refuse(name: str) -> None:
    raise ValueError(name)


def say(line: str) -> bytes:
    """A line for the client to write (prefix included)."""
    return json.dumps({"say": line}).encode() + b"\n"


def answer(line: str, exit_status: int) -> bytes:
    """The decision: the line for the client to write, and its exit status."""
    return json.dumps({"answer": line, "exit": exit_status}).encode() + b"\n"


@dataclass(frozen=True)
class Reply:
    line: str
    exit_status: int | None  # None: a line to write, more to come


def parse_reply(data: bytes) -> Reply | None:
    """A line the service sent; None for anything else."""
    try:
        fields = json.loads(data)
    except ValueError:
        return None
    if not isinstance(fields, dict):
        return None
    if isinstance(fields.get("say"), str):
        return Reply(fields["say"], None)
    if isinstance(fields.get("answer"), str) and type(fields.get("exit")) is int:
        return Reply(fields["answer"], fields["exit"])
    return None
