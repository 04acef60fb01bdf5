"""The planner (`vllm-xpu-plan`, docs/planner.md) proven on a real systemd 252 booted as PID 1 of private
namespaces (tests/realsystemd.py), on the issue's host: the boot race's three replayed vLLM units (chat
0.75 with 131072 tokens and max_num_seqs 3, embedding 0.07, stt 0.07 of one 16 GiB fake GPU,
Restart=on-failure; tests/bootrace.py), vLLM 0.24 engines that honour --kv-cache-memory-bytes
(tests/vllmunit.py). tests/plannedboot.py does the steps: the units started one after another, the
planner as shipped on that journal (the default target, the KV each unit had, fits; one full-length request
of chat planned as systemd drop-ins, verified by systemd-analyze, and applied), then cold boots with the drop-ins and the gate off.
benchmarks/planned_boot.py does the same over 20 boots, beside 20 without the drop-ins; here the boots
are few, and what is asserted is what the plan makes deterministic.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootrace import IDLE_RESERVED, RACE_UNITS, race_boot
from vllm_xpu_exporter.sources.plan_dropins import DROP_IN_NAME
from vllm_xpu_exporter.planner.execstart import exec_start_from_cat
from fakeze import GiB, fake_driver_env
from plannedboot import CHAT, Observation, PlannerRun, judge, observe, planned_boot, run_planner, systemctl_wrapper
from test_real_systemd import require_root
from vllmunit import SIXTEEN_GIB_GPU

PLANNED_BOOTS = 3
TOTAL = SIXTEEN_GIB_GPU.memory[0].size
RESERVE = 512 * 1024 * 1024  # the planner's default --reserve


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_root()
    return tmp_path_factory.mktemp("planned-boot")


@pytest.fixture(scope="module")
def observation(shared: Path, fake_driver: Path) -> Iterator[Observation]:
    driver = shared / fake_driver.name
    shutil.copy(fake_driver, driver)
    yield observe(shared, driver)


def test_the_units_started_one_after_another_each_start_once(observation: Observation):
    """How an operator first learns the figures: each unit alone, so each succeeds."""
    assert {unit: (counts.starts, dict(counts.failures), counts.overlaps)
            for unit, counts in observation.counts.items()} == {unit: (1, {}, 0) for unit in RACE_UNITS}


def test_the_default_target_is_the_kv_each_unit_had_and_the_planner_exits_0(observation: Observation):
    """No flags: each unit's target is the KV cache its last successful start had (chat's 3.5 GiB alone, not
    its max_num_seqs 3 x 131072 tokens, which is printed as information); the plan fits: exit 0."""
    run = observation.default
    assert run.returncode == 0, run.stderr
    (device,) = run.document()["devices"]
    chat = next(unit for unit in device["units"] if unit["unit"] == CHAT)
    assert "last successful start" in chat["target"] and chat["target_tokens"] >= 131072
    assert any("max_num_seqs 3 x 131072 tokens" in note for note in chat["notes"])
    assert abs(chat["kv_cache_memory_bytes"] - round(3.5 * GiB)) < 8 * (1 << 20)
    assert (device["total_bytes"], device["reserve_bytes"]) == (TOTAL, RESERVE) and device["fits"]


def test_the_planned_drop_ins_are_written_and_applied(observation: Observation):
    """`--requests vllm-xpu-chat.service=1 --format systemd --output-dir /etc/systemd/system`, then
    daemon-reload: every unit's effective command (`systemctl cat`) is its own with the planned
    --gpu-memory-utilization and --kv-cache-memory-bytes, and the plan fits."""
    assert observation.planned.returncode == 0, observation.planned.stderr
    assert observation.written.returncode == 0, observation.written.stderr
    targets = observation.targets
    assert set(targets) == set(RACE_UNITS) and targets[CHAT].tokens == 131072
    assert set(observation.drop_ins) == {f"/etc/systemd/system/{unit}.d/{DROP_IN_NAME}" for unit in RACE_UNITS}
    for unit, target in targets.items():
        cat = observation.cat[unit]
        assert f"# /etc/systemd/system/{unit}.d/{DROP_IN_NAME}" in cat, cat
        command = exec_start_from_cat(cat)
        assert command is not None and command.count("--gpu-memory-utilization") == 1, cat
        assert command.endswith(f" --gpu-memory-utilization {target.gpu_memory_utilization:g} "
                                f"--kv-cache-memory-bytes {target.kv_bytes}"), command
        assert "--name %n" in command and "vllmunit.py" in command, command
    footprints = sum(math.ceil(target.gpu_memory_utilization * TOTAL) for target in targets.values())
    assert footprints + IDLE_RESERVED <= TOTAL, "the units' requests do not fit the GPU together"


def test_cold_boots_with_the_drop_ins_and_no_gate_every_unit_serves_its_target(shared: Path,
                                                                               observation: Observation):
    """Each boot: the three units started together by systemd (their inits overlap: no gate orders them),
    each once, no init failure, each serving with the plan's budget and its KV cache holding its target;
    every start check saw at least ceil(R x total) free and every KV cache was taken from free memory."""
    targets = observation.targets
    for boot in range(PLANNED_BOOTS):
        verdict = judge(planned_boot(shared, observation), targets)
        outcome = verdict.outcome
        assert outcome.settled, f"boot {boot}: not every unit came up: {outcome.counts}"
        assert outcome.overlaps >= 2, f"boot {boot}: the units did not start together: {outcome.counts}"
        for unit, found in verdict.units.items():
            assert (found.starts, found.failures) == (1, 0), f"boot {boot}: {found}"
            assert found.budgets == (targets[unit].kv_bytes,), f"boot {boot}: not the plan's budget: {found}"
            assert found.kv_bytes == targets[unit].kv_bytes and found.kv_tokens >= targets[unit].tokens, \
                f"boot {boot}: {found}"
        assert verdict.every_unit_served_its_target, f"boot {boot}: {verdict.units}"
        assert verdict.start_checks_passed and verdict.allocations_fit, f"boot {boot}: {verdict.units}"


def test_after_a_failing_cold_boot_no_flags_proposes_each_unit_at_its_last_good_kv(shared: Path, fake_driver: Path,
                                                                                  observation: Observation):
    """The issue's host as its operator meets it: a cold boot in which the three inits race and some fail
    (Restart=on-failure brings them up later); right after it, `vllm-xpu-plan` with no flags reads that boot,
    proposes each unit at the KV its last successful start had (chat's ~3.2-3.5 GiB, not max_num_seqs 3 x
    131072 tokens), exits 0, and writes drop-ins that systemd-analyze verify accepted."""
    driver = shared / fake_driver.name
    runs: dict[str, PlannerRun] = {}
    out = shared / "after-race-drop-ins"

    def plan_now(machine) -> None:
        common = ["--journal.directory", str(machine.journal_directory),
                  "--systemctl", str(systemctl_wrapper(shared, machine.pid1))]
        env = fake_driver_env(driver, shared / "ze.conf")
        runs["json"] = run_planner(*common, "--format", "json", env=env)
        runs["written"] = run_planner(*common, "--format", "systemd", "--output-dir", str(out), env=env)

    outcome = race_boot(shared, while_up=plan_now)
    assert outcome.settled and outcome.failures > 0, f"the cold boot did not race: {outcome.counts}"
    run = runs["json"]
    assert run.returncode == 0, run.stderr
    (device,) = run.document()["devices"]
    assert device["fits"] and not run.document()["unplannable"]
    served = {record["unit"]: record["kv_bytes"] for record in outcome.events if record["event"] == "serving"}
    for unit in device["units"]:
        assert "last successful start" in unit["target"], unit
        # the budget is the KV the unit's last good start had, within the print's rounding and a block
        assert abs(unit["kv_cache_memory_bytes"] - served[unit["unit"]]) < 8 * (1 << 20), (unit, served)
    written = runs["written"]
    assert written.returncode == 0, written.stderr
    assert "not verified" not in written.stderr and "not applicable" not in written.stderr
    assert sorted(path.name for path in out.iterdir()) == sorted(f"{unit}.d" for unit in RACE_UNITS)
    assert all((out / f"{unit}.d" / DROP_IN_NAME).is_file() for unit in RACE_UNITS)
