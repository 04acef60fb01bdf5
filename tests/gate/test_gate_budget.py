"""The budget and R the gate service admits a start by (docs/gate.md, "By the plan"): the ones the unit will run
with now, as root's plan drop-in vouches for them; what the client states (the unit's own process) can only
make it wait longer, and a budget of an earlier start, or of a plan removed or overridden, is not taken.
The real-systemd cases (the plan's drop-in deleted, an override replacing ExecStart=) are in
tests/real_systemd/test_gate_budget_real_systemd.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from journalgen import new_invocation_id, unit_starting
from polling import wait_for
from test_gate import CHAT, STT, GiB, Host, host, init_completed, main_started, plan_drop_ins  # noqa: F401 (fixture)
from vllm_xpu_exporter.fold.engine_starts import Start
from vllm_xpu_exporter.gate.cli import main, parse_client_options
from vllm_xpu_exporter.gate.decision import Figures, figures_now, recorded_figures
from vllm_xpu_exporter.gate.protocol import BUDGET_VARIABLE, RATIO_VARIABLE
from vllm_xpu_exporter.sources.plan_dropins import (DROP_IN_NAME, drop_in_directories, exec_start_overrides,
                                                  parse_environment, plan_environment_now)

PLAN = 3 * GiB


def started(budget: int | None, ratio: float | None = 0.5) -> Start:
    """The unit's latest printed start, with that budget and R."""
    return Start(0, printed=True, version="0.24.0", gpu_memory_utilization=ratio, kv_cache_memory_bytes=budget)


@pytest.mark.fast
@pytest.mark.parametrize("client_ratio, client_budget, plan, overrides, latest, expected", [
    # the plan's drop-in names it, the client says the same, no start yet (a cold boot): by the plan
    (0.5, PLAN, PLAN, [], None, Figures(0.5, PLAN)),
    # the client says nothing: the plan's; its latest start ran with it
    (None, None, PLAN, [], started(PLAN), Figures(0.5, PLAN)),
    # the plan's drop-in was deleted: the latest start's budget is stale
    (0.5, None, None, [], started(PLAN), Figures(0.5, None, "its latest start ran with 3221225472, and no plan "
                                                             "names one now")),
    # the client states a budget no plan of root's names: not believed
    (0.5, PLAN, None, [], started(PLAN), Figures(0.5, None, "3221225472 is stated, but no plan of root's names one "
                                                             "(no plan drop-in)")),
    # a later drop-in replaces the plan's command
    (0.5, PLAN, PLAN, ["/etc/systemd/system/u.service.d/zzz-local.conf"], started(PLAN),
     Figures(0.5, None, "a later drop-in replaces the plan's command (/etc/systemd/system/u.service.d/zzz-local.conf)")),
    # the client and the plan disagree
    (0.5, 2 * GiB, PLAN, [], None, Figures(0.5, None, "the client says 2147483648, the plan 3221225472")),
    # the plan is new: the latest start ran without it, or with another
    (0.5, PLAN, PLAN, [], started(None), Figures(0.5, None, "the plan says 3221225472, its latest start ran with none")),
    (0.5, None, PLAN, [], started(2 * GiB), Figures(0.5, None, "the plan says 3221225472, its latest start ran with "
                                                               "2147483648")),
    # R: the larger of the client's and the latest start's; by the plan only when they agree
    (0.2, PLAN, PLAN, [], started(PLAN, 0.5), Figures(0.5, None, "its gpu_memory_utilization is not one: the "
                                                                 "client 0.2, its latest start 0.5")),
    (0.7, None, None, [], started(None, 0.5), Figures(0.7, None)),
    (None, None, None, [], None, Figures(None, None)),
])
def test_a_budget_counts_only_when_roots_plan_names_it_and_nothing_says_otherwise(
        client_ratio, client_budget, plan, overrides, latest, expected) -> None:
    assert figures_now(client_ratio, client_budget, plan, None, overrides, latest) == expected


@pytest.mark.fast
def test_on_a_cold_boot_a_client_stating_a_lower_r_than_roots_plan_waits_in_order_for_the_plans_r() -> None:
    """No start yet to hold the client's R against: root's drop-in's R (its Environment= line) is, and the larger
    counts."""
    assert figures_now(0.5, PLAN, PLAN, None, [], None, plan_ratio=0.5) == Figures(0.5, PLAN)
    assert figures_now(0.1, PLAN, PLAN, None, [], None, plan_ratio=0.5) == Figures(
        0.5, None, "its gpu_memory_utilization is not one: the client 0.1, the plan 0.5")
    assert figures_now(None, None, PLAN, None, [], None, plan_ratio=0.5) == Figures(0.5, PLAN)


@pytest.mark.fast
def test_the_plans_environment_line_is_read_from_roots_drop_in_only(tmp_path: Path) -> None:
    directory = plan_drop_ins(tmp_path, {CHAT: PLAN})
    drop_in = directory / f"{CHAT}.d" / DROP_IN_NAME
    drop_in.write_text(drop_in.read_text() + f"Environment={RATIO_VARIABLE}=0.7373 {BUDGET_VARIABLE}={PLAN}\n")
    assert parse_environment(drop_in.read_text(), RATIO_VARIABLE) == "0.7373"
    assert plan_environment_now(str(directory), CHAT, RATIO_VARIABLE) == "0.7373"  # the suite runs as root
    os.chmod(drop_in, 0o666)  # writable by anyone: not believed
    assert plan_environment_now(str(directory), CHAT, RATIO_VARIABLE) is None
    assert plan_environment_now(str(directory), STT, RATIO_VARIABLE) is None


@pytest.mark.fast
def test_a_later_drop_in_that_sets_exec_start_overrides_the_plan_in_any_of_systemds_directories(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    unit = "vllm-xpu-chat.service"
    for directory in (etc / f"{unit}.d", run / f"{unit}.d", etc / "vllm-.service.d"):
        directory.mkdir(parents=True)
    (etc / f"{unit}.d" / DROP_IN_NAME).write_text("[Service]\nExecStart=\nExecStart=/usr/bin/vllm serve m\n")
    (etc / f"{unit}.d" / "override.conf").write_text("[Service]\nExecStart=\nExecStart=/usr/bin/other\n")
    (etc / f"{unit}.d" / "zzz-memory.conf").write_text("[Service]\nMemoryMax=1G\n")
    directories = [str(etc), str(run)]
    assert exec_start_overrides(unit, str(etc), directories) == []  # override.conf sorts before the plan's
    (run / f"{unit}.d" / "zzz-local.conf").write_text("[Service]\nExecStart=\nExecStart=/usr/bin/other\n")
    (etc / "vllm-.service.d" / "zzzz-prefix.conf").write_text("[Service]\n  ExecStart=/usr/bin/other\n")
    assert exec_start_overrides(unit, str(etc), directories) == [
        f"{etc}/vllm-.service.d/zzzz-prefix.conf", f"{run}/{unit}.d/zzz-local.conf"]
    # a file of the plan's name elsewhere is not the plan's
    (run / f"{unit}.d" / DROP_IN_NAME).write_text("[Service]\nExecStart=/usr/bin/other\n")
    assert f"{run}/{unit}.d/{DROP_IN_NAME}" in exec_start_overrides(unit, str(etc), directories)


@pytest.mark.fast
def test_a_units_drop_ins_come_from_its_own_its_templates_its_prefixes_and_its_types_directories() -> None:
    assert drop_in_directories("vllm-xpu-chat.service") == [
        "vllm-xpu-chat.service.d", "vllm-xpu-.service.d", "vllm-.service.d", "service.d"]
    assert drop_in_directories("vllm@chat.service") == ["vllm@chat.service.d", "vllm@.service.d", "service.d"]


@pytest.mark.fast
def test_the_client_takes_the_plans_figures_from_its_environment_and_a_flag_wins() -> None:
    environ = {"VLLM_XPU_GATE_KV_CACHE_MEMORY_BYTES": str(PLAN), "VLLM_XPU_GATE_GPU_MEMORY_UTILIZATION": "0.7345"}
    request = parse_client_options([], environ).request
    assert (request.gpu_memory_utilization, request.kv_cache_memory_bytes) == (0.7345, PLAN)
    request = parse_client_options(["--kv-cache-memory-bytes", "5"], environ).request
    assert (request.gpu_memory_utilization, request.kv_cache_memory_bytes) == (0.7345, 5)
    assert parse_client_options([], {}).request.kv_cache_memory_bytes is None


@pytest.mark.fast
def test_a_bad_figure_in_the_environment_is_one_line_and_exit_2(monkeypatch, capsys) -> None:
    monkeypatch.setenv("VLLM_XPU_GATE_KV_CACHE_MEMORY_BYTES", "-1")
    with pytest.raises(SystemExit) as exit_info:
        main(["wait", "--service-timeout", "0s"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "VLLM_XPU_GATE_KV_CACHE_MEMORY_BYTES" in err, err


def test_a_start_whose_plan_was_removed_waits_in_order_though_its_latest_start_had_a_budget(host: Host) -> None:
    """Chat initialises with a budget; stt's latest start ran with one too, but no plan of root's names one now
    (its drop-in was deleted): stt waits for chat in order and says why, instead of going beside it."""
    host.serve("--plans", str(plan_drop_ins(host.tmp, {CHAT: PLAN})))
    earlier, chat, stt = new_invocation_id(), new_invocation_id(), new_invocation_id()
    host.write([unit_starting(STT, host.clock.tick(), invocation_id=earlier),
                *main_started(STT, host.clock, earlier, 300, ratio=0.07, budget=GiB),
                *init_completed(STT, host.clock, earlier, 300),
                unit_starting(CHAT, host.clock.tick(), invocation_id=chat),
                *main_started(CHAT, host.clock, chat, 100, ratio=0.5, budget=PLAN),
                unit_starting(STT, host.clock.tick(), invocation_id=stt)])
    run = host.start(STT, "--gpu-memory-utilization", "0.07")
    assert wait_for(lambda: run.saw(f"waiting for {CHAT}"), timeout=20), run.lines
    assert run.saw("its KV budget is not taken (its latest start ran with 1073741824, and no plan names one now)")
    host.write(init_completed(CHAT, host.clock, chat, 100))
    assert run.wait() == 0 and run.decision.waited_for == (CHAT,), run.lines


@pytest.mark.fast
@pytest.mark.parametrize("command, expected", [
    # the gate's container client before the engine: only the engine's words (after `--`) count
    (["python3", "container_wait.py", "--gpu-memory-utilization", "0.5", "--", "vllm", "serve", "m",
      "--gpu-memory-utilization", "0.75", "--kv-cache-memory-bytes", "3489660928"], (0.75, 3489660928)),
    (["vllm", "serve", "m", "--gpu_memory_utilization=0.07", "--kv_cache_memory_bytes=536870912"],
     (0.07, 536870912)),
    # the last of a flag wins, as in vLLM's parser
    (["vllm", "serve", "--kv-cache-memory-bytes", "1", "--kv-cache-memory-bytes", "2"], (None, 2)),
    # the client's own flags alone are no budget of the engine's
    (["python3", "container_wait.py", "--kv-cache-memory-bytes", "5", "--", "vllm", "serve"], (None, None)),
    # not plain figures: none
    (["vllm", "serve", "--kv-cache-memory-bytes", "8G", "--gpu-memory-utilization", "1.5"], (None, None)),
    (["vllm", "serve", "--kv-cache-memory-bytes"], (None, None)),
    ([], (None, None)),
])
def test_a_containers_recorded_command_gives_its_engines_r_and_budget(command, expected) -> None:
    assert recorded_figures(command) == expected
