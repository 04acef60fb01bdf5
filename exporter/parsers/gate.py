"""The lines `vllm-xpu-gate`'s client writes (stderr, so the gated unit's journal), written and read here:
the gate formats them, the journal fold (`vllm_xpu_exporter.fold.engine_starts`) parses them, and neither
imports the other.

Every line the gate writes begins with `PREFIX`, so the engine fold never mistakes one for the engine's
output, and the process that printed it for the unit's main process. Two lines are decisions, one per
run of the gate; the journal fold turns them into the gate metrics:

    vllm-xpu-gate: released after 12.30s (waited for vllm-chat.service,memory; free 8589934592, needed 1202590843)
    vllm-xpu-gate: timed out after 600.00s (waiting for vllm-chat.service; free 8589934592, needed unknown); starting anyway

A 0.2 drop-in left in place (`ExecStartPre=+... vllm-xpu-gate --unit %n ...`, root in the unit) makes the
client say so first, a *legacy start* (`is_legacy_line`):

    vllm-xpu-gate: warning: the 0.2 drop-in's form (vllm-xpu-gate --unit ...): run as `vllm-xpu-gate wait`, ...

A third decision line says the client found no gate service to ask (or could not reach one) and let the unit start
without a decision, an *ungated start*:

    vllm-xpu-gate: started ungated after 30.00s (no gate service answered on /run/vllm-xpu-gate/gate.sock: ...)

"waited for" lists what held the start back: the units whose init ran (or whose lease was held),
`unreadable-lease` when the device's lease file could not be read (its holder is unknown), and `memory`
when free memory was short; `nothing` when the gate did not hold the start back. Byte figures
are `unknown` when the gate could not know them (no Level Zero reading, no gpu_memory_utilization).
Every other line (warnings, progress) starts with the prefix too and is a `GateLine` without a decision.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# The vLLM grammar's bounds: anything in the unit can print a gate-like line.
from vllm_xpu_exporter.parsers.bounds import MAX_BYTES, MAX_SECONDS

PREFIX = "vllm-xpu-gate: "
NOTHING = "nothing"
MEMORY = "memory"
UNREADABLE_LEASE = "unreadable-lease"  # the holder of a lease file the gate cannot read
UNKNOWN = "unknown"
LEGACY_WARNING = f"{PREFIX}warning: the 0.2 drop-in's form (vllm-xpu-gate --unit ...)"
MAX_LINE_CHARS = 4096


@dataclass(frozen=True, slots=True)
class GateDecision:
    """A gate's decision. `held_back`: the gate waited for something (`waited_for` is not empty)."""

    timed_out: bool
    seconds: float
    waited_for: tuple[str, ...]  # unit names, UNREADABLE_LEASE and MEMORY
    free_bytes: int | None
    needed_bytes: int | None
    ungated: bool = False  # the client started its unit without the service's decision

    @property
    def held_back(self) -> bool:
        return bool(self.waited_for)


@dataclass(frozen=True, slots=True)
class GateRow:
    """One line the gate writes: a name, its template, and how a match becomes a decision."""

    name: str
    pattern: re.Pattern[str]
    timed_out: bool


_SECONDS = r"(?P<seconds>\d{1,9}(?:\.\d{1,9})?)"
_WAITED = r"(?P<waited>[^;()]{1,4096})"
_BYTES = rf"free (?P<free>\d{{1,16}}|{UNKNOWN}), needed (?P<needed>\d{{1,16}}|{UNKNOWN})"

GRAMMAR: tuple[GateRow, ...] = (
    GateRow("released", re.compile(rf"released after {_SECONDS}s \(waited for {_WAITED}; {_BYTES}\)"), False),
    GateRow("timed_out", re.compile(rf"timed out after {_SECONDS}s \(waiting for {_WAITED}; {_BYTES}\)"), True),
    GateRow("ungated", re.compile(rf"started ungated after {_SECONDS}s \("), False),
)


def is_gate_line(message: str) -> bool:
    return message.startswith(PREFIX)


def is_legacy_line(message: str) -> bool:
    """The client's warning that it runs from the 0.2 drop-in's line (a legacy start)."""
    return message.startswith(LEGACY_WARNING)


def parse_line(message: str) -> GateDecision | None:
    """The decision a gate line states, or None (not a decision, or figures out of bounds)."""
    if not message.startswith(PREFIX):
        return None
    text = message[len(PREFIX):MAX_LINE_CHARS]
    for row in GRAMMAR:
        match = row.pattern.match(text)
        if match is None:
            continue
        seconds = float(match["seconds"])
        if seconds > MAX_SECONDS:
            return None
        if row.name == "ungated":
            return GateDecision(False, seconds, (), None, None, ungated=True)
        free, needed = _optional_bytes(match["free"]), _optional_bytes(match["needed"])
        if seconds > MAX_SECONDS or any(value is not None and value > MAX_BYTES for value in (free, needed)):
            return None
        waited = match["waited"].strip()
        waited_for = () if waited == NOTHING else tuple(part.strip() for part in waited.split(",") if part.strip())
        return GateDecision(row.timed_out, seconds, waited_for, free, needed)
    return None


def format_released(seconds: float, waited_for: Sequence[str], free_bytes: int | None,
                    needed_bytes: int | None) -> str:
    return (f"{PREFIX}released after {seconds:.2f}s (waited for {_waited(waited_for)}; "
            f"{figures(free_bytes, needed_bytes)})")


def format_timed_out(seconds: float, waiting_for: Sequence[str], free_bytes: int | None, needed_bytes: int | None,
                     starting: bool) -> str:
    outcome = "starting anyway" if starting else "failing the start"
    return (f"{PREFIX}timed out after {seconds:.2f}s (waiting for {_waited(waiting_for)}; "
            f"{figures(free_bytes, needed_bytes)}); {outcome}")


def format_ungated(seconds: float, reason: str) -> str:
    return f"{PREFIX}started ungated after {seconds:.2f}s ({' '.join(reason.splitlines())})"


def _waited(names: Sequence[str]) -> str:
    return ",".join(names) if names else NOTHING


def figures(free_bytes: int | None, needed_bytes: int | None) -> str:
    show = (lambda value: UNKNOWN if value is None else str(value))
    return f"free {show(free_bytes)}, needed {show(needed_bytes)}"


def _optional_bytes(text: str) -> int | None:
    return None if text == UNKNOWN else int(text)
