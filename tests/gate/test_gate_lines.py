"""The init gate's lines (exporter/parsers/gate.py): what the gate writes is what the fold reads."""

from __future__ import annotations

import pytest

from vllm_xpu_exporter.parsers.gate import (LEGACY_WARNING, GateDecision, format_released, format_timed_out,
                                          format_ungated, is_gate_line, is_legacy_line, parse_line)
from sizes import GiB

pytestmark = pytest.mark.fast  # the pure core (pyproject.toml's markers; `pytest -m fast`)


@pytest.mark.parametrize(("line", "decision"), [
    (format_released(0.04, [], 13 * GiB, 12 * GiB), GateDecision(False, 0.04, (), 13 * GiB, 12 * GiB)),
    (format_released(12.3, ["vllm-chat.service", "memory"], 8 * GiB, None),
     GateDecision(False, 12.3, ("vllm-chat.service", "memory"), 8 * GiB, None)),
    (format_timed_out(600, ["vllm-chat.service"], None, None, starting=True),
     GateDecision(True, 600.0, ("vllm-chat.service",), None, None)),
    (format_timed_out(1.5, [], 1, 2, starting=False), GateDecision(True, 1.5, (), 1, 2)),
])
def test_the_decisions_the_gate_writes_read_back_the_same(line: str, decision: GateDecision) -> None:
    assert line.startswith("vllm-xpu-gate: ") and is_gate_line(line)
    assert parse_line(line) == decision


def test_the_contract_forms_of_the_decision_lines() -> None:
    assert format_released(12.345, ["a.service", "b.service"], 10, 20) == (
        "vllm-xpu-gate: released after 12.35s (waited for a.service,b.service; free 10, needed 20)")
    assert format_timed_out(600, ["a.service"], 10, 20, starting=True).startswith(
        "vllm-xpu-gate: timed out after 600.00s (waiting for a.service; free 10, needed 20)")


def test_a_wait_is_a_decision_that_held_the_start_back() -> None:
    assert not parse_line(format_released(0.1, [], 1, 1)).held_back
    assert parse_line(format_released(0.1, ["memory"], 1, 2)).held_back


@pytest.mark.parametrize("line", [
    "vllm-xpu-gate: warning: cannot read Level Zero (x): releasing at once",
    "vllm-xpu-gate: waiting for vllm-chat.service (free 1, needed 2)",
    "vllm-xpu-gate: released after 99999999999s (waited for nothing; free 1, needed 2)",
    "vllm-xpu-gate: released after 1s (waited for nothing; free 99999999999999999, needed 2)",
    "INFO vllm-xpu-gate: released after 1.00s (waited for nothing; free 1, needed 2)",
    "released after 1.00s (waited for nothing; free 1, needed 2)",
])
def test_other_lines_out_of_bounds_figures_and_quotes_are_no_decision(line: str) -> None:
    assert parse_line(line) is None


def test_an_ungated_start_reads_back_as_one_without_a_decision() -> None:
    line = format_ungated(30.004, "no gate service answered on /run/vllm-xpu-gate/gate.sock within 30s (refused)")
    assert line == ("vllm-xpu-gate: started ungated after 30.00s (no gate service answered on "
                    "/run/vllm-xpu-gate/gate.sock within 30s (refused))")
    assert parse_line(line) == GateDecision(False, 30.0, (), None, None, ungated=True)
    assert not parse_line(line).held_back
    assert parse_line("vllm-xpu-gate: started ungated after 1e400s (x)") is None


def test_the_02_drop_ins_warning_is_a_legacy_start_and_no_decision() -> None:
    line = (f"{LEGACY_WARNING}: run as `vllm-xpu-gate wait`, --unit and the service's flags ignored; replace the "
            f"drop-in (docs/gate.md, Migrating from 0.2)")
    assert is_legacy_line(line) and parse_line(line) is None
    assert not is_legacy_line("vllm-xpu-gate: warning: cannot read Level Zero (x): releasing at once")
    assert not is_legacy_line("INFO " + line)
