"""The budget vllm-xpu-plan's drop-in gives each unit, as `systemctl show` says it (sources/unitconfig.py):
the parse of its answer, and the reader around a systemctl (a script standing in for it here; the real one on
a real systemd in test_plan_applied_real_systemd.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_xpu_exporter.sources.unitconfig import PLAN_FIELD, UnitConfigError, UnitPlans, parse_show

CHAT, STT = "vllm-xpu-chat.service", "vllm-xpu-stt.service"

# systemctl show prints the Service interface's properties before the Unit interface's (Id=), whatever -p says
SHOWN = (f"LogExtraFields=SOMETHING_ELSE=1\nLogExtraFields={PLAN_FIELD}=3481927680\nId={CHAT}\n\n"
         f"LogExtraFields=\nId={STT}\n")


@pytest.mark.fast
def test_each_units_plan_is_the_budget_of_its_field_and_a_unit_without_one_has_none() -> None:
    assert parse_show(SHOWN) == {CHAT: 3481927680}


@pytest.mark.fast
def test_the_last_field_applied_wins() -> None:
    """An older drop-in's field and the plan's later one: LogExtraFields= accumulates in the drop-ins' order."""
    text = f"LogExtraFields={PLAN_FIELD}=100\nLogExtraFields={PLAN_FIELD}=200\nId={CHAT}\n"
    assert parse_show(text) == {CHAT: 200}


@pytest.mark.fast
@pytest.mark.parametrize("value", ["", "-5", "0", "1e9", "12 34", "١٢٣", "9" * 21, "3481927680x"])
def test_a_budget_that_is_not_a_positive_byte_count_is_no_plan(value: str) -> None:
    assert parse_show(f"LogExtraFields={PLAN_FIELD}={value}\nId={CHAT}\n") == {}


@pytest.mark.fast
def test_a_field_whose_name_only_begins_with_the_plans_is_not_it() -> None:
    assert parse_show(f"LogExtraFields={PLAN_FIELD}_OLD=5\nId={CHAT}\n") == {}


def fake_systemctl(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "systemctl"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def test_the_reader_asks_for_the_units_after_a_double_dash_and_parses_the_answer(tmp_path: Path) -> None:
    args = tmp_path / "args"
    systemctl = fake_systemctl(tmp_path, f"printf '%s\\n' \"$@\" > {args}\ncat <<'EOF'\n{SHOWN}EOF")
    assert UnitPlans(str(systemctl)).plans([STT, CHAT, CHAT]) == {CHAT: 3481927680}
    assert args.read_text().split() == ["show", "--property=Id,LogExtraFields", "--", CHAT, STT]


def test_no_units_asks_nothing(tmp_path: Path) -> None:
    assert UnitPlans(str(tmp_path / "absent")).plans([]) == {}


@pytest.mark.parametrize("body", ["echo 'Failed to connect to bus: No such file or directory' >&2; exit 1", None])
def test_a_systemctl_that_cannot_answer_is_an_error_saying_why(tmp_path: Path, body: str | None) -> None:
    systemctl = fake_systemctl(tmp_path, body) if body else tmp_path / "absent"
    with pytest.raises(UnitConfigError, match="Failed to connect to bus" if body else "No such file"):
        UnitPlans(str(systemctl)).plans([CHAT])
