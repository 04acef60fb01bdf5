"""Lines that say a watched unit runs something other than a vLLM engine: one journal line in, the
service it names or None out.

`--journal.units` globs such as `vllm*.service` also match units that never print a vLLM line: the
exporter's own `vllm-xpu-exporter.service`, a `vllm-proxy.service`. A start of a unit that has not
printed a vLLM line yet is only a *possible* engine init (`vllm_xpu_exporter.fold.engine_starts`); a line of this
table, printed before any vLLM line, tells at once that the start is not one, so the gate need not
wait the engine grace for it.

The rows, each matched anywhere in the line (the exporter logs in logfmt or JSON, whose field before
the message varies):

| row | service | the line, as the service writes it |
|---|---|---|
| `exporter_listening` | `vllm-xpu-exporter` | `msg="vllm-xpu-exporter 1.4.0 listening on http://[::]:10447/metrics (collectors: ...)"` (logfmt), `"msg": "vllm-xpu-exporter 1.4.0 listening on ..."` (JSON): `vllm_xpu_exporter.cli.main`'s start-up line |
| `gate_serving` | `vllm-xpu-gate` | `msg="vllm-xpu-gate 0.3.0 serving on /run/vllm-xpu-gate/gate.sock"` (logfmt), `"msg": "vllm-xpu-gate ..."` (JSON), or as the gate's plain lines before its `--log.*` flags said it, `INFO vllm-xpu-gate 0.3.0 serving on ...`: the gate service's start-up line (`vllm-xpu-gate serve`) |
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["GRAMMAR", "NotAnEngine", "ServiceRow", "parse_line"]

MAX_LINE_CHARS = 4096  # the start-up lines are short; no pattern sees more


@dataclass(frozen=True, slots=True)
class NotAnEngine:
    """The unit's start runs `service`, not a vLLM engine (row: the table's row that said so)."""

    service: str
    row: str


@dataclass(frozen=True, slots=True)
class ServiceRow:
    """One line of a service that is not a vLLM engine: `anchor`, a literal the line must contain (the
    cheap pre-check), then `pattern`, searched anywhere in the line."""

    name: str
    service: str
    anchor: str
    pattern: re.Pattern[str]


# fmt: off
GRAMMAR: tuple[ServiceRow, ...] = (
    ServiceRow("exporter_listening", "vllm-xpu-exporter",
               "vllm-xpu-exporter ",
               re.compile(r'(?:\bmsg="|"msg": ")vllm-xpu-exporter [^\s"]{1,64} listening on https?://')),
    ServiceRow("gate_serving", "vllm-xpu-gate",
               "vllm-xpu-gate ",
               re.compile(r'(?:^INFO |\bmsg="|"msg": ")vllm-xpu-gate [^\s"]{1,64} serving on \S')),
)
# fmt: on


def parse_line(message: str) -> NotAnEngine | None:
    """The service a line says its unit runs, or None (most lines: the pre-check costs one `in`)."""
    text = message[:MAX_LINE_CHARS]
    for row in GRAMMAR:
        if row.anchor in text and row.pattern.search(text):
            return NotAnEngine(row.service, row.name)
    return None
