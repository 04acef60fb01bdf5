"""The replayed vLLM engine of the real-systemd tests (tests/vllmunit.py) and the shared fake GPU it
takes memory on (fakeze.SharedDevice), run as plain processes: vLLM's accounting (requested = ceil(R x
total), the start-up check, KV = requested - weights - activation - non-torch increase, other
processes' memory charged as non-torch; with --kv-cache-memory-bytes the same start-up check but KV =
the budget, checked against one request), vLLM's own failure lines, memory given back on exit."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import vllmunit
from vllm_xpu_exporter import memory_rules
from vllm_xpu_exporter.fold.engine_starts import EngineTracker
from vllm_xpu_exporter.fold.start import Outcome
from vllm_xpu_exporter.parsers import vllm
from fakeze import GiB, SharedDevice
from polling import wait_for
from vllmlogs import TrackerEntry
from vllmunit import CHAT, EMBEDDING, SIXTEEN_GIB_GPU, STT, VllmRun

SCRIPT = Path(vllmunit.__file__)


@pytest.fixture
def device(tmp_path: Path) -> SharedDevice:
    return SharedDevice.create(tmp_path / "ze.conf", SIXTEEN_GIB_GPU)


def start_engine(device: SharedDevice, tmp_path: Path, engine=CHAT, time_scale: float = 0.01,
                 name: str = "vllm-chat.service") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPT), "--name", name, "--device-config", str(device.config_path),
                             *engine.argv(), "--time-scale", str(time_scale), "--requests", "0",
                             "--events", str(tmp_path / "events.jsonl")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def events(tmp_path: Path) -> list[dict]:
    return vllmunit.read_events(tmp_path / "events.jsonl")


def wait_for_event(tmp_path: Path, event: str, timeout: float = 10) -> dict:
    found = wait_for(lambda: [record for record in events(tmp_path) if record["event"] == event], timeout, 0.005)
    assert found, f"no {event!r} event within {timeout} s: {events(tmp_path)}"
    return found[0]


def failure_causes(output: str) -> list[vllm.FailureCause]:
    parsed = (vllm.parse_line(line) for line in output.splitlines())
    return [event for event in parsed if isinstance(event, vllm.FailureCause)]


def test_an_engine_alone_gets_its_kv_cache_holds_its_requested_memory_and_gives_it_back(device, tmp_path):
    engine = start_engine(device, tmp_path)
    try:
        wait_for_event(tmp_path, "serving")
        requested = math.ceil(0.75 * 16 * GiB)
        assert device.held() == {"vllm-chat.service": requested}
        assert device.free() == 16 * GiB - requested
    finally:
        engine.send_signal(signal.SIGTERM)
        output, _ = engine.communicate(timeout=10)
    assert engine.returncode == 0
    assert device.held() == {}
    assert "Available KV cache memory: 3.5 GiB" in output  # 12 - 7.87 - 0.51 - 0.12
    assert "init engine (profile, create kv cache, warmup model) took 40.00 s" in output


def test_memory_another_process_takes_during_profiling_is_charged_to_the_engine(device, tmp_path):
    """1 GiB taken by someone else between the engine's start-up snapshot and its profiling moment
    leaves it 2.5 GiB of KV cache, under the 3.25 GiB 131072 tokens need: vLLM's kv_cache_too_small."""
    engine = start_engine(device, tmp_path, time_scale=0.03)
    wait_for_event(tmp_path, "baseline")
    device.hold("intruder", GiB)
    output, _ = engine.communicate(timeout=10)
    assert engine.returncode == 1
    assert device.held() == {"intruder": GiB}
    profiled = wait_for_event(tmp_path, "profiled")
    assert profiled["others"] == GiB and profiled["kv_bytes"] == round(2.5 * GiB)
    causes = set(failure_causes(output))
    assert [(cause.reason, cause.needed_bytes, cause.available_bytes) for cause in causes] == \
        [(vllm.FailureReason.KV_CACHE_TOO_SMALL, round(3.25 * GiB), round(2.5 * GiB))]
    assert ("ValueError: To serve at least one request with the model's max seq len (131072), (3.25 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (2.5 GiB). Based on the available memory, "
            "the estimated maximum model length is 100800. Try increasing `gpu_memory_utilization`") in output


def test_an_engine_that_cannot_have_its_requested_memory_at_start_fails_at_once(device, tmp_path):
    device.hold("other", 5 * GiB)
    engine = start_engine(device, tmp_path)
    output, _ = engine.communicate(timeout=10)
    assert engine.returncode == 1
    assert device.held() == {"other": 5 * GiB}
    assert "ValueError: Free memory on device xpu:0 (11.0/16.0 GiB) on startup is less than desired GPU memory " \
           "utilization (0.75, 12.0 GiB)." in output
    assert [cause.reason for cause in set(failure_causes(output))] == [vllm.FailureReason.INSUFFICIENT_FREE_MEMORY]
    assert [record["event"] for record in events(tmp_path)] == ["started", "baseline", "failed"]


@pytest.mark.parametrize(("others_gib", "reason"), [
    (0.0, None),
    (0.2, None),  # 3.3 GiB left, 3.25 needed
    (1.0, "kv_cache_too_small"),
    (4.0, "no_kv_cache_memory"),  # -0.5 GiB: vLLM says there is no memory for the cache blocks
])
def test_profiling_outcome_follows_vllm(others_gib, reason):
    run = VllmRun("0.24.0", gpu_memory_utilization=0.75, max_model_len=131072, kv_bytes_per_token=26624)
    requested = 12 * GiB
    weights, activation, non_torch = round(7.87 * GiB), round(0.51 * GiB), round(0.12 * GiB)
    outcome = vllmunit.profiled_outcome(run, requested, weights, activation, non_torch + round(others_gib * GiB))
    assert outcome.kv_cache_gib == pytest.approx(3.5 - others_gib)
    assert (outcome.failure.reason if outcome.failure else None) == reason


def test_one_request_needs_whole_blocks():
    assert vllmunit.needed_kv_bytes(131072, 64, 26624) == round(3.25 * GiB)
    assert vllmunit.needed_kv_bytes(500, 16, 36864) == 512 * 36864
    assert vllmunit.estimated_max_model_len(round(2.5 * GiB), 64, 26624) == 100800


def test_shared_device_free_memory_is_total_minus_the_shares_and_the_driver_config_lists_them(device, tmp_path):
    chat, embedding = os.getpid(), os.getppid()  # live processes: a dead holder's share is dropped
    device.hold("vllm-chat.service", 8 * GiB, pid=chat)
    device.hold("vllm-embedding.service", GiB, pid=embedding)
    assert device.free() == 7 * GiB
    config = device.config_path.read_text().splitlines()
    assert f"memory device {16 * GiB} {7 * GiB} health=1 core_size={16 * GiB}" in config
    assert f"process {chat} {8 * GiB} 0 2" in config and f"process {embedding} {GiB} 0 2" in config
    device.release("vllm-chat.service")
    assert device.held() == {"vllm-embedding.service": GiB}


def test_the_share_of_a_process_killed_without_giving_it_back_is_dropped(device, tmp_path):
    """As the kernel driver frees a dead process's memory: a replayed engine SIGKILLed mid-init."""
    engine = start_engine(device, tmp_path, engine=EMBEDDING, time_scale=0.05, name="vllm-embedding.service")
    wait_for_event(tmp_path, "baseline")
    assert wait_for(device.held, timeout=10, interval=0.01)
    engine.kill()
    engine.wait()
    assert device.held() == {}
    assert device.free() == 16 * GiB


# --- --kv-cache-memory-bytes (vLLM 0.16+ on XPU) ------------------------------------------------------

ONE_REQUEST = round(3.25 * GiB)  # chat's 131072 tokens: 2048 blocks of 64 x 26624 bytes
ONE_BLOCK = 64 * 26624  # and the null block the block pool keeps back
CHAT_WEIGHTS, CHAT_NON_TORCH, CHAT_ACTIVATION = round(7.87 * GiB), round(0.12 * GiB), round(0.51 * GiB)


def test_with_a_budget_the_kv_cache_is_the_budget_even_when_another_process_took_memory_during_profiling(
        device, tmp_path):
    """The case that charges the engine 1 GiB without a budget (kv_cache_too_small above): with
    --kv-cache-memory-bytes vLLM still profiles, but the KV cache is the budget, so what the intruder took
    is not charged; vLLM prints the budget's line instead of "Available KV cache memory"."""
    budgeted = dataclasses.replace(CHAT, kv_cache_memory_bytes=ONE_REQUEST)
    engine = start_engine(device, tmp_path, engine=budgeted, time_scale=0.03)
    try:
        wait_for_event(tmp_path, "baseline")
        device.hold("intruder", GiB)
        serving = wait_for_event(tmp_path, "serving")
        assert device.held() == {"intruder": GiB,
                                 "vllm-chat.service": CHAT_WEIGHTS + CHAT_NON_TORCH + ONE_REQUEST + CHAT_ACTIVATION}
    finally:
        engine.send_signal(signal.SIGTERM)
        output, _ = engine.communicate(timeout=10)
    profiled = wait_for_event(tmp_path, "profiled")
    assert profiled["others"] == GiB and profiled["budget"] == ONE_REQUEST
    assert (serving["kv_bytes"], serving["kv_tokens"]) == (ONE_REQUEST, 131072)
    # vLLM's start check passes with exactly one request's blocks, but block 0 is the null block: 2047 serve
    assert (serving["served_tokens"], serving["serves_one_request"]) == (131008, False)
    assert "Initial free memory 16.0 GiB, reserved 3.25 GiB memory for KV Cache as specified by " \
           "kv_cache_memory_bytes config and skipped memory profiling." in output
    assert "Available KV cache memory" not in output and "GPU KV cache size: 131,072 tokens" in output
    assert "'kv_cache_memory_bytes': 3489660928" in output and not failure_causes(output)


def test_a_budget_below_one_request_fails_with_kv_cache_too_small(device, tmp_path):
    """check_enough_kv_cache_memory holds one request of max_model_len against the budget: 3 GiB < 3.25 GiB."""
    budgeted = dataclasses.replace(CHAT, kv_cache_memory_bytes=3 * GiB)
    engine = start_engine(device, tmp_path, engine=budgeted)
    output, _ = engine.communicate(timeout=10)
    assert engine.returncode == 1
    assert device.held() == {}
    assert [record["event"] for record in events(tmp_path)] == ["started", "baseline", "profiled", "failed"]
    assert events(tmp_path)[-1]["reason"] == "kv_cache_too_small"
    assert "reserved 3.0 GiB memory for KV Cache as specified by kv_cache_memory_bytes config" in output
    causes = set(failure_causes(output))
    assert [(cause.reason, cause.needed_bytes, cause.available_bytes) for cause in causes] == \
        [(vllm.FailureReason.KV_CACHE_TOO_SMALL, ONE_REQUEST, 3 * GiB)]
    assert "which is larger than the available KV cache memory (3.0 GiB). Based on the available memory, the " \
           "estimated maximum model length is 120960." in output


def test_with_a_budget_the_start_still_needs_ceil_r_total_free(device, tmp_path):
    """init_device's request_memory does not look at the budget: 11 GiB free < ceil(0.75 x 16 GiB) fails."""
    device.hold("other", 5 * GiB)
    engine = start_engine(device, tmp_path, engine=dataclasses.replace(CHAT, kv_cache_memory_bytes=ONE_REQUEST))
    output, _ = engine.communicate(timeout=10)
    assert engine.returncode == 1
    assert [cause.reason for cause in set(failure_causes(output))] == [vllm.FailureReason.INSUFFICIENT_FREE_MEMORY]
    assert [record["event"] for record in events(tmp_path)] == ["started", "baseline", "failed"]
    assert events(tmp_path)[1]["requested"] == math.ceil(0.75 * 16 * GiB)


@pytest.mark.parametrize(("budget", "tokens", "reason"), [
    (ONE_REQUEST, 131072, None),
    (ONE_REQUEST + 1703935, 131072, None),  # a block's bytes less one: no further block
    (round(9.75 * GiB), 3 * 131072, None),
    (ONE_REQUEST - 1, 131008, "kv_cache_too_small"),
])
def test_budgeted_outcome_is_the_budget_in_whole_blocks(budget, tokens, reason):
    run = VllmRun("0.24.0", gpu_memory_utilization=0.75, max_model_len=131072, kv_bytes_per_token=26624,
                  kv_cache_memory_bytes=budget)
    outcome = vllmunit.budgeted_outcome(run, budget)
    assert (outcome.tokens, outcome.failure.reason if outcome.failure else None) == (tokens, reason)


def test_the_exporters_fold_reads_what_a_budgeted_engine_prints(device, tmp_path):
    """The replay's output with the budget, folded as the journal reader hands it over: the budget, the
    reserved KV bytes (as printed: GiB with 2 decimals), the tokens and max_num_seqs of a successful start."""
    budget = round(9.75 * GiB)
    engine = start_engine(device, tmp_path, engine=dataclasses.replace(CHAT, kv_cache_memory_bytes=budget,
                                                                       gpu_memory_utilization=0.99))
    try:
        wait_for_event(tmp_path, "serving")
    finally:
        engine.send_signal(signal.SIGTERM)
        output, _ = engine.communicate(timeout=10)
    tracker = EngineTracker()
    tracker.extend(TrackerEntry("vllm-chat.service", 1_000_000 + index, line, False, "", engine.pid, "invocation-1")
                   for index, line in enumerate(output.splitlines()))
    (view,) = tracker.views()
    latest = view.latest
    assert latest.outcome is Outcome.OK
    assert (latest.kv_cache_memory_bytes, latest.effective_kv_cache_bytes, latest.effective_kv_cache_tokens) == \
        (budget, budget, 3 * 131072)
    assert latest.max_num_seqs == 3 and latest.requested_max_model_len == 131072


@pytest.mark.parametrize(("budget", "served", "serves"), [
    (ONE_REQUEST, 131008, False),  # exactly cdiv(131072, 64) blocks: vLLM starts, but the null block leaves 2047
    (ONE_REQUEST + ONE_BLOCK - 1, 131008, False),  # a block's bytes less one: no further block
    (ONE_REQUEST + ONE_BLOCK, 131072, True),
])
def test_the_replayed_block_pool_keeps_the_null_block_back(budget, served, serves):
    assert vllmunit.served_tokens(budget, 64, 26624) == served
    assert vllmunit.serves_one_request(budget, 131072, 64, 26624) is serves
    run = VllmRun("0.24.0", gpu_memory_utilization=0.75, max_model_len=131072, kv_bytes_per_token=26624,
                  kv_cache_memory_bytes=budget)
    assert vllmunit.budgeted_outcome(run, budget).failure is None  # the start's own check counts bytes only


@pytest.mark.parametrize("engine", [CHAT, EMBEDDING, STT], ids=lambda engine: engine.role)
def test_a_planner_that_forgot_the_null_block_plans_budgets_the_replayed_engine_cannot_serve(engine, monkeypatch):
    """The planner's one-request budget, from the replayed engine's exact figures, serves a full-length request
    in the replay's block pool; the same planner without the null block (NULL_BLOCKS 0) does not."""
    block = engine.block_size or 64
    kv = memory_rules.KvBlocks(block, block * engine.kv_bytes_per_token, engine.max_model_len)
    planned = memory_rules.kv_budget_for_requests(1, kv)
    assert vllmunit.serves_one_request(planned, engine.max_model_len, block, engine.kv_bytes_per_token)
    monkeypatch.setattr(memory_rules, "NULL_BLOCKS", 0)
    forgetful = memory_rules.kv_budget_for_requests(1, kv)
    assert forgetful < planned
    assert not vllmunit.serves_one_request(forgetful, engine.max_model_len, block, engine.kv_bytes_per_token)


# --- vLLM 0.34's own startup plan and sleep mode ---------------------------------------------------------

CHAT_034 = dataclasses.replace(CHAT, version="0.34.0")


def start_planned(device: SharedDevice, tmp_path: Path, plan: Path, engine=CHAT_034) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPT), "--name", "vllm-chat.service", "--device-config",
                             str(device.config_path), *engine.argv(), "--time-scale", "0.01", "--requests", "0",
                             "--events", str(tmp_path / "events.jsonl"), "--startup-plan", str(plan)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def plan_events(tmp_path: Path) -> list[tuple[str, int]]:
    return [(record["outcome"], record["kv_bytes"]) for record in events(tmp_path) if record["event"] == "startup_plan"]


def run_until_serving(process: subprocess.Popen, tmp_path: Path, count: int) -> str:
    assert wait_for(lambda: len([r for r in events(tmp_path) if r["event"] == "serving"]) >= count, 20, 0.01), \
        events(tmp_path)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=10)
    return output


def test_the_startup_plan_is_saved_alone_applied_alone_and_falls_back_beside_a_co_tenant(device, tmp_path):
    plan = tmp_path / "startup_plan.json"
    first = run_until_serving(start_planned(device, tmp_path, plan), tmp_path, 1)
    saved_bytes = plan_events(tmp_path)[0][1]
    assert plan_events(tmp_path) == [("saved", saved_bytes)] and "Saved startup plan to" in first
    second = run_until_serving(start_planned(device, tmp_path, plan), tmp_path, 2)
    assert plan_events(tmp_path)[1] == ("applied", saved_bytes)
    assert any(isinstance(vllm.parse_line(line), vllm.StartupPlan) for line in second.splitlines())
    device.hold("vllm-other.service", GiB // 2)  # a co-tenant that started first: free below the baseline
    third = run_until_serving(start_planned(device, tmp_path, plan), tmp_path, 3)
    # profiled again: memory the co-tenant held before the start is not charged, so the KV cache is the same,
    # but the plan is saved anew with the lower baseline
    assert plan_events(tmp_path)[2] == ("fallback", saved_bytes) and "Startup plan not applied" in third
    assert json.loads(plan.read_text())["free_memory_baseline"] == device.free()
    device.release("vllm-other.service")
    run_until_serving(start_planned(device, tmp_path, plan), tmp_path, 4)
    assert plan_events(tmp_path)[3] == ("applied", saved_bytes)


def test_an_explicit_budget_wins_over_the_startup_plan(device, tmp_path):
    plan = tmp_path / "startup_plan.json"
    plan.write_text('{"kv_cache_memory_bytes": 1, "free_memory_baseline": 0}')
    budgeted = dataclasses.replace(CHAT_034, kv_cache_memory_bytes=4 * GiB)
    output = run_until_serving(start_planned(device, tmp_path, plan, budgeted), tmp_path, 1)
    assert plan_events(tmp_path) == [] and "startup plan" not in output.lower()
    assert wait_for_event(tmp_path, "serving")["kv_bytes"] == 4 * GiB


@pytest.mark.parametrize("level, signum", [(1, signal.SIGUSR1), (2, signal.SIGUSR2)])
def test_sleep_gives_back_weights_and_kv_cache_and_wake_takes_them_again_printing_vllms_wake_line(device, tmp_path,
                                                                                                   level, signum):
    engine = start_engine(device, tmp_path, CHAT_034)
    try:
        wait_for_event(tmp_path, "serving")
        awake = device.free()
        engine.send_signal(signum)
        slept = wait_for_event(tmp_path, "slept")
        assert slept["level"] == level and device.free() - awake == slept["freed"] > CHAT.weights_gib * GiB
        engine.send_signal(signal.SIGHUP)
        wait_for_event(tmp_path, "woke")
        assert device.free() == awake
    finally:
        engine.send_signal(signal.SIGTERM)
        output, _ = engine.communicate(timeout=10)
    [line] = [event for event in map(vllm.parse_line, output.splitlines()) if isinstance(event, vllm.SleepFreed)]
    assert abs(line.freed_bytes - slept["freed"]) <= 0.005 * GiB
    assert [event for event in map(vllm.parse_line, output.splitlines()) if isinstance(event, vllm.Woke)]


def test_a_wake_after_a_co_tenant_took_the_memory_fails_with_out_of_memory(device, tmp_path):
    engine = start_engine(device, tmp_path, CHAT_034)
    wait_for_event(tmp_path, "serving")
    engine.send_signal(signal.SIGUSR1)
    wait_for_event(tmp_path, "slept")
    device.hold("vllm-other.service", device.free() - GiB)  # took what the sleeping engine released
    engine.send_signal(signal.SIGHUP)
    failed = wait_for_event(tmp_path, "wake_failed")
    assert failed["free"] < failed["needed"]
    assert engine.wait(timeout=10) == 1
    output, _ = engine.communicate()
    assert any(isinstance(cause, vllm.FailureCause) and cause.reason is vllm.FailureReason.DEVICE_OUT_OF_MEMORY
               for cause in map(vllm.parse_line, output.splitlines()))


# --- the seed host's three units over 20 randomly ordered boots: vLLM's own plan against the project's ---------

SEED_UNITS = {"vllm-xpu-chat.service": dataclasses.replace(CHAT, version="0.34.0"),
              "vllm-xpu-embedding.service": dataclasses.replace(EMBEDDING, version="0.34.0"),
              "vllm-xpu-stt.service": dataclasses.replace(STT, version="0.34.0")}
BOOTS = 20


def solo_kv_bytes(engine) -> int:
    """The KV cache an engine gets alone on the 16 GiB GPU (vLLM's requested less its non-KV memory)."""
    return math.ceil(engine.gpu_memory_utilization * 16 * GiB) - round(
        (engine.weights_gib + engine.activation_gib + engine.non_torch_gib) * GiB)


def projects_plan(engine):
    """The engine as the project's planner sets it: a one-request KV budget (whole blocks and the null block)
    and R = its footprint's share of the device, so that it starts whatever the order."""
    block = engine.block_size or 64
    budget = memory_rules.kv_budget_for_requests(1, memory_rules.KvBlocks(block, block * engine.kv_bytes_per_token,
                                                              engine.max_model_len))
    footprint = budget + round((engine.weights_gib + engine.activation_gib + engine.non_torch_gib) * GiB)
    return dataclasses.replace(engine, kv_cache_memory_bytes=budget,
                               gpu_memory_utilization=memory_rules.utilisation_for(footprint, 16 * GiB))


def boot(device: SharedDevice, tmp_path: Path, engines: dict, order: list[str], gaps: list[float],
         plans: Path | None) -> dict[str, dict]:
    """One boot: the units started in `order`, `gaps` seconds apart, each until it serves or fails; what each
    did (its startup-plan outcome, its serving or failed event), then every engine stopped."""
    log = tmp_path / "boot.jsonl"
    log.unlink(missing_ok=True)
    processes = []
    for unit, gap in zip(order, gaps):
        time.sleep(gap)
        plan = [] if plans is None else ["--startup-plan", str(plans / f"{unit}.json")]
        processes.append(subprocess.Popen([sys.executable, str(SCRIPT), "--name", unit, "--device-config",
                                           str(device.config_path), *engines[unit].argv(), "--time-scale", "0.01",
                                           "--requests", "0", "--events", str(log), *plan],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    ended = wait_for(lambda: (done := {r["unit"]: r for r in vllmunit.read_events(log)
                                       if r["event"] in ("serving", "failed")}) and len(done) == len(order) and done,
                     30, 0.01)
    outcomes = {r["unit"]: r["outcome"] for r in vllmunit.read_events(log) if r["event"] == "startup_plan"}
    for process in processes:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
    assert ended, vllmunit.read_events(log)
    return {unit: {**record, "plan": outcomes.get(unit)} for unit, record in ended.items()}


def raced(result: dict[str, dict], engines: dict) -> list[str]:
    """The units of a boot that failed, fell back to profiling, or serve less KV cache than the one they need
    (their budget) or, without one, than they get alone."""
    return [unit for unit, record in result.items()
            if record["event"] == "failed" or record["plan"] == "fallback"
            or record["kv_bytes"] < (engines[unit].kv_cache_memory_bytes or solo_kv_bytes(engines[unit]))]


@pytest.mark.parametrize("plan", ["vllm", "project"])
def test_over_20_random_boots_vllms_own_plan_races_and_the_projects_plan_never_does(device, tmp_path, plan):
    """vLLM 0.34's own plan (VLLM_ENABLE_STARTUP_PLAN=1, saved on the first boot) falls back whenever another
    unit started first and keeps whatever a racing boot saved; the project's budgets start every unit whole in
    any order."""
    chooser = random.Random(36)
    engines = SEED_UNITS if plan == "vllm" else {unit: projects_plan(engine) for unit, engine in SEED_UNITS.items()}
    plans = tmp_path / "plans" if plan == "vllm" else None
    if plans is not None:
        plans.mkdir()
    bad = []
    for _ in range(BOOTS):
        order = chooser.sample(list(engines), len(engines))
        result = boot(device, tmp_path, engines, order, [0.0] + [chooser.uniform(0, 0.15) for _ in order[1:]], plans)
        bad.append(raced(result, engines))
    raced_boots = sum(1 for units in bad if units)
    if plan == "vllm":
        assert raced_boots > 0, bad
    else:
        assert raced_boots == 0, bad
