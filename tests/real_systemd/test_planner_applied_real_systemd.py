"""Whether the plan is applied (docs/planner.md "Is the plan applied?"), on a real systemd 252 booted as PID 1
of private namespaces (tests/realsystemd.py), with the packaged exporter unit (its hardening as shipped:
DynamicUser=, ProtectSystem=strict, the system call filter) beside the boot race's three replayed vLLM units
(tests/bootrace.py, tests/vllmunit.py) on one 16 GiB fake GPU:

* chat: the planner's drop-in (`plan.drop_in`, `zz-vllm-xpu-plan.conf`) and after it a local drop-in
  (`zzz-local.conf`) that replaces ExecStart= with the unit's command and a budget of its own: the override
  wins, the plan is not applied;
* embedding: the planner's drop-in alone: applied;
* stt: no plan, a budget in its own command, and its own process writes a journal entry carrying the plan's
  field (any process may write any field that does not begin with `_`).

The exporter, scraped on its port, serves each plan as the drop-in root wrote names it
(xpu_unit_kv_cache_plan_bytes), beside the budget each latest start printed (xpu_unit_kv_cache_budget_bytes),
and the bundled alert's expression, evaluated by promtool over those samples, names chat only. systemd, asked
after the boot, shows the override's command for chat and the plan's field beside it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from bootrace import EXPORTER_UNIT, RACE_UNITS, packaged_exporter, race_boot, race_unit_files
from polling import wait_for
from promql import alerting_rules
from realsystemd import RealSystemd, journal_field, path_inside
from scrapes import sample, series
from test_real_systemd import require_root
from vllm_xpu_exporter import memory_rules
from vllm_xpu_exporter.planner import cli as plan
from vllm_xpu_exporter.planner.plans import Target, UnitPlan
from vllm_xpu_exporter.sources.plan_dropins import PLAN_FIELD
from vllm_xpu_exporter.planner.execstart import exec_start_from_cat
from vllmunit import CHAT, EMBEDDING, STT, needed_kv_bytes

CHAT_UNIT, EMBEDDING_UNIT, STT_UNIT = RACE_UNITS
STEP_TIMEOUT = 30.0


def budget_for_one_request(engine) -> int:
    """One request of the engine's max_model_len in whole blocks, and the null block (the planner's rule)."""
    block = engine.block_size or 64
    return needed_kv_bytes(engine.max_model_len, block, engine.kv_bytes_per_token) + \
        memory_rules.NULL_BLOCKS * block * engine.kv_bytes_per_token


CHAT_PLAN = budget_for_one_request(CHAT)
CHAT_OVERRIDE = CHAT_PLAN + 64 * 64 * CHAT.kv_bytes_per_token  # 64 blocks more: the override's own budget
EMBEDDING_PLAN = budget_for_one_request(EMBEDDING)
STT_OWN = budget_for_one_request(STT)


def planners_drop_in(unit: str, unit_text: str, engine, budget: int) -> str:
    """What `vllm-xpu-plan --format systemd` writes for the unit with this budget (its R kept)."""
    block = engine.block_size or 64
    unit_plan = UnitPlan(unit, "0000:03:00.0", engine.version, Target(engine.max_model_len, "one request"), block,
                         float(engine.kv_bytes_per_token), memory_rules.Footprint(round(8.5 * (1 << 30)), budget),
                         "the test", engine.gpu_memory_utilization)
    command = exec_start_from_cat(unit_text)
    assert command is not None
    return plan.drop_in(unit_plan, command)


FORGE = f"""#!/bin/sh
# the unit's own process writes the plan's field (and PID 1's UNIT=) into the journal
printf 'MESSAGE=a forged plan\\nUNIT={STT_UNIT}\\n{PLAN_FIELD}=1234567\\n' | logger --journald
"""


@pytest.fixture
def shared(tmp_path: Path, fake_driver: Path) -> Path:
    require_root()
    if shutil.which("promtool") is None:
        pytest.fail("promtool not found (tests/run needs Prometheus's promtool)")
    shutil.copy(fake_driver, tmp_path / fake_driver.name)
    return tmp_path


def promtool_finds(samples: dict, tmp_path: Path, expected: dict[str, int]) -> subprocess.CompletedProcess:
    """promtool evaluates the bundled XpuUnitPlanNotApplied expression over the scraped plan and budget series
    and checks that it returns exactly `expected` (unit -> value); returncode 0 when it does."""
    (rule,) = [rule for rule in alerting_rules() if rule["alert"] == "XpuUnitPlanNotApplied"]
    identity = {"instance": "host:10447", "job": "vllm-xpu-exporter"}

    def selector(name: str, labels: dict[str, str]) -> str:
        return name + "{" + ",".join(f'{key}="{value}"' for key, value in labels.items()) + "}"

    input_series = [{"series": selector(name, {**identity, **dict(labels)}), "values": f"{value:.0f}x2"}
                    for name in ("xpu_unit_kv_cache_plan_bytes", "xpu_unit_kv_cache_budget_bytes")
                    for labels, value in series(samples, name).items()]
    exp_samples = [{"labels": selector("", {**identity, "unit": unit}), "value": value}
                   for unit, value in expected.items()]
    test = tmp_path / "plan-not-applied.test.yaml"
    test.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": input_series,
        "promql_expr_test": [{"expr": rule["expr"], "eval_time": "1m", "exp_samples": exp_samples}]}]}))
    return subprocess.run(["promtool", "test", "rules", str(test)], capture_output=True, text=True, timeout=60)


def test_an_override_that_replaces_the_plans_command_shows_and_a_forged_field_does_not(shared: Path,
                                                                                       fake_driver: Path):
    units = race_unit_files(shared)
    stt_unit = f"/etc/systemd/system/{STT_UNIT}"
    units[stt_unit] = units[stt_unit].replace(
        "[Service]\n", f"[Service]\nExecStartPre={path_inside(shared, shared / 'forge.sh')}\n", 1)
    units[stt_unit] = units[stt_unit].replace(
        " --max-model-len 448 ", f" --max-model-len 448 --kv-cache-memory-bytes {STT_OWN} ", 1)
    (shared / "forge.sh").write_text(FORGE)
    (shared / "forge.sh").chmod(0o755)
    chat_text, embedding_text = units[f"/etc/systemd/system/{CHAT_UNIT}"], units[f"/etc/systemd/system/{EMBEDDING_UNIT}"]
    chat_command = exec_start_from_cat(chat_text)
    files = {
        f"/etc/systemd/system/{CHAT_UNIT}.d/{plan.DROP_IN_NAME}": planners_drop_in(CHAT_UNIT, chat_text, CHAT, CHAT_PLAN),
        f"/etc/systemd/system/{CHAT_UNIT}.d/zzz-local.conf":
            f"[Service]\nExecStart=\nExecStart={chat_command} --kv-cache-memory-bytes {CHAT_OVERRIDE}\n",
        f"/etc/systemd/system/{EMBEDDING_UNIT}.d/{plan.DROP_IN_NAME}":
            planners_drop_in(EMBEDDING_UNIT, embedding_text, EMBEDDING, EMBEDDING_PLAN),
        stt_unit: units[stt_unit],
    }
    exporter = packaged_exporter(shared, shared / fake_driver.name)
    seen: dict[str, object] = {}

    def scrape(machine: RealSystemd) -> None:
        seen["shown"] = machine.systemctl("show", "-p", "Id,LogExtraFields,ExecStart", *RACE_UNITS).stdout

        def caught_up() -> bool:
            # the forged field too: a scrape before stt's process wrote it would prove nothing of it. Matched by
            # the field, not by -u: journald may not learn a short-lived logger's unit (no _SYSTEMD_UNIT then)
            seen["forged"] = machine.journal(args=[f"{PLAN_FIELD}=1234567"])
            samples = seen["samples"] = exporter.scrape()
            budgets = series(samples, "xpu_unit_kv_cache_budget_bytes")
            plans = series(samples, "xpu_unit_kv_cache_plan_bytes")
            return bool(seen["forged"]) and len(budgets) == 3 and len(plans) >= 2

        seen["caught_up"] = wait_for(caught_up, timeout=STEP_TIMEOUT, interval=0.5)
        seen["exporter_lines"] = [journal_field(entry, "MESSAGE") for entry in machine.journal(EXPORTER_UNIT)]

    outcome = race_boot(shared, exporter=exporter, while_up=scrape, files=files)
    lines = "\n".join(str(line) for line in seen.get("exporter_lines", []))
    assert outcome.settled, f"not every unit served: {outcome.counts}"
    assert seen["caught_up"], f"{seen.get('samples')}\n{seen.get('shown')}\n{lines}"
    samples = seen["samples"]
    assert seen["forged"], "the unit's own process did not get its forged field into the journal"
    assert sample(samples, "xpu_exporter_collector_success", collector="processes") == 1, lines
    plans = {dict(labels)["unit"]: value for labels, value in series(samples, "xpu_unit_kv_cache_plan_bytes").items()}
    budgets = {dict(labels)["unit"]: value for labels, value in series(samples, "xpu_unit_kv_cache_budget_bytes").items()}
    # chat: the override won (systemd runs its command and budget), the plan's drop-in is still there; embedding:
    # the plan applied; stt: no plan, whatever its own process wrote into the journal
    assert plans == {CHAT_UNIT: CHAT_PLAN, EMBEDDING_UNIT: EMBEDDING_PLAN}, seen["shown"]
    shown = str(seen["shown"])
    assert f"--kv-cache-memory-bytes {CHAT_OVERRIDE} ;" in shown and f"{PLAN_FIELD}={CHAT_PLAN}" in shown, shown
    assert budgets == {CHAT_UNIT: CHAT_OVERRIDE, EMBEDDING_UNIT: EMBEDDING_PLAN, STT_UNIT: STT_OWN}
    assert all(dict(labels)["device"] for labels in series(samples, "xpu_unit_kv_cache_plan_bytes"))
    found = promtool_finds(samples, shared, {CHAT_UNIT: CHAT_PLAN})
    assert found.returncode == 0, found.stdout + found.stderr
