"""The planner's two totals, and its figures against what vLLM does with them.

On Intel the user-mode driver (the Level Zero core API: what vLLM multiplies by gpu_memory_utilization) reports
about 0.95 of what the kernel driver can give (Sysman's total). A plan's R must be a share of the first, its fit
held against the second. Held here:

* a property over every figure the planner reads from vLLM's prints (GiB with 2 decimals, the true values drawn
  anywhere within the rounding): each planned R reproduces, through vLLM's own ceil(total x R) with the core total,
  at least what the unit will hold, and no more than the share rounded up; the non-KV memory comes out no more than
  the KV print's rounding above the true one (the parts printed one by one are each rounded);
* the planner reading Level Zero (the fake driver: core = 0.95 x Sysman) plans R from the core total;
* in the replay (tests/vllmunit.py, plain processes on one fake GPU whose core total is 0.95 of Sysman's: the
  engines multiply the core total, as vLLM does, and see Sysman's free memory): the planned budgets start together,
  each start's check asking at least what the unit then holds; and a plan made offline for another device size
  starts on a fake GPU of that size.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vllmunit
from fakeze import A770, FakeConfig, FakeMemoryModule, SharedDevice, fake_driver_env, write_config
from polling import wait_for
from sizes import GiB
from test_planner import SIXTEEN_GIB, journal  # noqa: F401 (the fixture)
from test_planner_vllm_rules import HALF_STEP, UNIT, folded_view
from test_vllmunit import boot
from vllm_xpu_exporter import memory_rules
from vllm_xpu_exporter.fold.engine_starts import EngineTracker
from vllm_xpu_exporter.planner import plans
from vllmlogs import TrackerEntry, VllmRun

RESERVE = memory_rules.DEFAULT_RESERVE_BYTES


def core_of(sysman: int) -> int:
    """The fake driver's core total for a module of `sysman` bytes (0.95 of it)."""
    return sysman // 100 * 95 + sysman % 100 * 95 // 100


# --- the property --------------------------------------------------------------------------------------

def within_print(draw, printed_gib: float) -> int:
    """A true byte count anywhere a "%.2f GiB" print of `printed_gib` stands for, its edges included."""
    offset = draw(st.one_of(st.integers(-HALF_STEP + 1, HALF_STEP - 1),
                            st.sampled_from([-HALF_STEP + 1, 0, HALF_STEP - 1])))
    return round(printed_gib * GiB) + offset


@st.composite
def profiled_starts(draw):
    """A start that sized its KV cache from R on a GPU whose core total is `core`: the true figures, and the run
    whose lines print them as vLLM does (weights, the 0.26+ summary's 0.51 GiB activation and 0.12 GiB non-torch,
    the KV bytes and the device total: 2 decimals of GiB)."""
    version = draw(st.sampled_from(["0.24.0", "0.26.0", "0.28.0", "0.34.0"]))
    sysman = draw(st.sampled_from([8, 12, 16, 24])) * GiB + draw(st.integers(-64 << 20, 0))
    core = core_of(sysman)
    weights_gib = draw(st.integers(5, 300)) / 100
    activation, non_torch = within_print(draw, 0.51), within_print(draw, 0.12)
    if version >= "0.28":  # one print of the weights and non-torch memory together, "consumed"
        weights = within_print(draw, round(weights_gib + 0.12, 2)) - non_torch
    else:
        weights = within_print(draw, weights_gib)
    non_kv = weights + activation + non_torch
    per_token = draw(st.sampled_from([26624, 36864, 73728]))
    block = 64
    utilisation = draw(st.integers(20, 90)) / 100
    kv = memory_rules.requested_bytes(core, utilisation) - non_kv
    max_model_len = draw(st.sampled_from([448, 2048, 8192]))
    if kv < (max_model_len // block + 2) * block * per_token or kv > 64 * GiB:
        return None
    run = VllmRun(version, gpu_memory_utilization=utilisation, max_model_len=max_model_len, max_num_seqs=2,
                  kv_bytes_per_token=per_token, block_size=block, kv_cache_gib=kv / GiB,
                  total_gib=round(core / GiB, 2), free_gib_at_start=round(core / GiB, 2), weights_gib=weights_gib)
    return run, sysman, core, non_kv, per_token


@pytest.mark.fast
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(start=profiled_starts(), requests=st.integers(1, 3))
def test_every_planned_r_reproduces_vllms_request_with_the_core_total_across_the_prints_rounding(start, requests):
    if start is None:
        return
    run, sysman, core, true_non_kv, per_token = start
    plan = plans.make_plan([folded_view(run)], {"gpu": plans.Totals(sysman, core)}, {}, RESERVE,
                           {UNIT: plans.TargetRequest(requests=requests)})
    [device] = plan.devices
    [unit] = device.units
    assert device.vllm_total_bytes == core and device.total_bytes == sysman
    holds = true_non_kv + unit.kv_cache_memory_bytes  # what the engine will hold with its budget
    ratio = unit.gpu_memory_utilization
    if ratio is None:  # no R below 1 covers it: the GPU is said not to fit
        assert not device.fits and memory_rules.requested_bytes(core, 0.9999) < unit.footprint.total_bytes
        return
    assert 0 < ratio < 1
    assert memory_rules.requested_bytes(core, ratio) >= unit.footprint.total_bytes >= holds
    assert memory_rules.requested_bytes(core, ratio) <= unit.footprint.total_bytes + core // 10_000 + 1
    # the non-KV memory at most the KV print's range above the truth (one print's rounding, not three)
    assert true_non_kv <= unit.footprint.non_kv_bytes <= true_non_kv + 2 * HALF_STEP + 8
    assert device.fits == (device.planned_bytes + RESERVE <= sysman)


@pytest.mark.fast
@pytest.mark.parametrize("version", ["0.26.0", "0.28.0", "0.34.0"])
def test_chats_non_kv_memory_is_one_prints_rounding_above_what_the_replay_held(version: str) -> None:
    """The replayed chat (7.87 + 0.51 + 0.12 GiB, KV 3.5 GiB of 0.75 x 16 GiB) as 0.26+ prints it: the parts'
    upper ends came out 15.4 MiB (0.26) and 10.2 MiB (0.28+) above the 8.5 GiB it held; held to ceil(16 GiB x 0.75)
    less the least "3.5 GiB" stands for, it is that print's half-step above."""
    chat = vllmunit.CHAT
    held = round(chat.weights_gib * GiB) + round(chat.activation_gib * GiB) + round(chat.non_torch_gib * GiB)
    run = VllmRun(version, gpu_memory_utilization=0.75, max_model_len=chat.max_model_len, max_num_seqs=3,
                  kv_bytes_per_token=chat.kv_bytes_per_token, kv_cache_gib=3.5, total_gib=16.0, free_gib_at_start=16.0,
                  weights_gib=chat.weights_gib)
    unit = plans.plan_unit(folded_view(run), "gpu", SIXTEEN_GIB, plans.TargetRequest(requests=1))
    kv = round(3.5 * GiB)
    assert unit.footprint.non_kv_bytes == math.ceil(SIXTEEN_GIB * 0.75) - memory_rules.printed_lower_bound(kv)
    assert 0 <= unit.footprint.non_kv_bytes - held <= kv - memory_rules.printed_lower_bound(kv) + 2  # 5.12 MiB
    assert "held to ceil(total x R) - the KV bytes printed" in unit.non_kv_from


# --- the planner reading Level Zero --------------------------------------------------------------------

def test_reading_level_zero_r_is_a_share_of_the_core_total_and_the_fit_held_against_sysmans(
        journal: Path, fake_driver: Path, config_path: Path) -> None:  # noqa: F811
    """The fake driver's 16 GiB GPU reports a core total of 0.95 x 16 GiB: every R asks, with that total, at
    least the unit's footprint (R from Sysman's 16 GiB asked ~0.8 GiB less of it for chat); the fit is against
    the 16 GiB."""
    gpu = dataclasses.replace(A770, memory=(FakeMemoryModule(size=SIXTEEN_GIB, free=SIXTEEN_GIB - GiB),))
    write_config(config_path, FakeConfig(devices=(gpu,)))
    result = subprocess.run([sys.executable, "-m", "vllm_xpu_exporter.planner", "--journal.file", str(journal),
                             "--requests", "vllm-xpu-chat.service=1", "--format", "json"],
                            capture_output=True, text=True, timeout=120, check=False,
                            env=fake_driver_env(fake_driver, config_path))
    [device] = json.loads(result.stdout)["devices"]
    core = core_of(SIXTEEN_GIB)
    assert (device["total_bytes"], device["vllm_total_bytes"]) == (SIXTEEN_GIB, core), result.stderr
    for unit in device["units"]:
        asked = memory_rules.requested_bytes(core, unit["gpu_memory_utilization"])
        assert unit["footprint_bytes"] <= asked <= unit["footprint_bytes"] + core // 10_000 + 1, unit
    assert device["left_bytes"] == SIXTEEN_GIB - RESERVE - device["footprint_bytes"] - device["left_out_bytes"]


def test_planning_offline_the_starts_that_printed_no_total_are_taken_to_have_run_on_this_hosts_gpu(
        journal: Path, fake_driver: Path, config_path: Path) -> None:  # noqa: F811
    """The seed's 0.24 starts print no device total; planned offline for 24 GiB on a host whose GPU (the fake
    driver's 16 GiB, core 0.95 of it) they ran on, chat's non-KV memory is ceil(that core total x 0.75) - KV, not
    ceil(24 GiB x 0.75) - KV, and stderr says which GPU."""
    write_config(config_path, FakeConfig(devices=(A770,)))
    result = subprocess.run([sys.executable, "-m", "vllm_xpu_exporter.planner", "--journal.file", str(journal),
                             "--device-memory", "24GiB", "--requests", "vllm-xpu-chat.service=1", "--format", "json"],
                            capture_output=True, text=True, timeout=120, check=False,
                            env=fake_driver_env(fake_driver, config_path))
    [device] = json.loads(result.stdout)["devices"]
    chat = next(u for u in device["units"] if u["unit"] == "vllm-xpu-chat.service")
    assert device["total_bytes"] == device["vllm_total_bytes"] == 24 * GiB
    assert chat["non_kv_bytes"] == math.ceil(core_of(SIXTEEN_GIB) * 0.75) - memory_rules.printed_lower_bound(
        round(3.25 * GiB))
    assert f"taken to have run on this host's GPU {A770.pci_address}" in result.stderr


# --- in the replay -------------------------------------------------------------------------------------

# chat at 0.75 of 15.2 GiB would not hold one request alone
SEED = {"vllm-xpu-chat.service": dataclasses.replace(vllmunit.CHAT, gpu_memory_utilization=0.8),
        "vllm-xpu-embedding.service": vllmunit.EMBEDDING, "vllm-xpu-stt.service": vllmunit.STT}
CHAT_ONE_REQUEST = {"vllm-xpu-chat.service": plans.TargetRequest(requests=1)}
ONE_REQUEST_EACH = {unit: plans.TargetRequest(requests=1) for unit in SEED}


def shared_gpu(path: Path, sysman: int) -> SharedDevice:
    """A fake GPU of `sysman` bytes (Sysman's total) whose core total is the driver's 0.95 of it."""
    return SharedDevice.create(path, dataclasses.replace(A770, memory=(FakeMemoryModule(size=sysman, free=sysman),)))


def observe(device: SharedDevice, tmp_path: Path) -> list:
    """Each unit started alone, once, until it serves: the views of what they printed."""
    entries = []
    for index, (unit, engine) in enumerate(SEED.items()):
        process = subprocess.Popen([*vllmunit.engine_command(engine, unit, device_config=device.config_path,
                                                             time_scale=0.01, events=tmp_path / "observed.jsonl",
                                                             requests=0)],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        served = wait_for(lambda: unit in vllmunit.serving_units(tmp_path / "observed.jsonl"), 20, 0.01)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=10)
        assert served, f"{unit} did not serve alone: {output[-2000:]}"
        entries += [TrackerEntry(unit, 1_000_000_000 * (index + 1) + number, line, False, "", process.pid, f"i{index}")
                    for number, line in enumerate(output.splitlines())]
    tracker = EngineTracker()
    tracker.extend(entries)
    return list(tracker.views())


def planned_engines(plan: plans.Plan) -> dict[str, vllmunit.Engine]:
    return {u.unit: dataclasses.replace(SEED[u.unit], kv_cache_memory_bytes=u.kv_cache_memory_bytes,
                                        gpu_memory_utilization=u.gpu_memory_utilization)
            for device in plan.devices for u in device.units}


def boot_together(device: SharedDevice, tmp_path: Path, engines: dict[str, vllmunit.Engine]) -> list[dict]:
    """The units started together (a few ms apart), each until it serves or fails; their events."""
    boot(device, tmp_path, engines, list(engines), [0.0] + [0.005] * (len(engines) - 1), None)
    return vllmunit.read_events(tmp_path / "boot.jsonl")


def held_when_serving(engine: vllmunit.Engine) -> int:
    """What the replayed engine holds once it serves: weights, non-torch, its KV budget and its activation."""
    return round(engine.weights_gib * GiB) + round(engine.non_torch_gib * GiB) + engine.kv_cache_memory_bytes + \
        round(engine.activation_gib * GiB)


def test_the_planned_budgets_start_together_in_the_replay_with_the_two_totals_apart(tmp_path: Path) -> None:
    """16 GiB (Sysman's), 15.2 GiB as vLLM multiplies: every unit serves with its budget, and every start's
    check asked ceil(core x R) of at least what the unit then holds, so the check keeps what the unit takes."""
    device = shared_gpu(tmp_path / "ze.conf", SIXTEEN_GIB)
    plan = plans.make_plan(observe(device, tmp_path), {"gpu": plans.Totals(device.total, device.core_total)}, {},
                           RESERVE, CHAT_ONE_REQUEST)
    assert plan.fits and not plan.unplannable
    engines = planned_engines(plan)
    events = boot_together(device, tmp_path, engines)
    serving = {r["unit"]: r for r in events if r["event"] == "serving"}
    assert set(serving) == set(engines) and not [r for r in events if r["event"] == "failed"], events
    for record in (r for r in events if r["event"] == "baseline"):
        assert record["requested"] >= held_when_serving(engines[record["unit"]]), record
        assert record["requested"] == math.ceil(engines[record["unit"]].gpu_memory_utilization * device.core_total)
    assert all(serving[unit]["kv_bytes"] == engine.kv_cache_memory_bytes and serving[unit]["serves_one_request"]
               for unit, engine in engines.items())


@pytest.mark.parametrize("size_gib", [12.5, 14])
def test_a_plan_made_offline_for_another_device_size_starts_on_a_gpu_of_that_size(tmp_path: Path,
                                                                                 size_gib: float) -> None:
    """The units ran on 16 GiB as vLLM 0.24, which prints no device total on a good start; planned offline for another
    size (one full-length request each), their non-KV memory is ceil(total x R) - KV with the total they ran on
    (this host's GPU), not the size planned for: where the plan says it fits, the units started together on a
    fake GPU of that size serve with their budgets (taken as the size planned for, chat's non-KV came out ~2 GiB
    short on 12.5 GiB and the plan said it fits)."""
    observed_on = shared_gpu(tmp_path / "observed.conf", SIXTEEN_GIB)
    views = observe(observed_on, tmp_path)
    size = round(size_gib * GiB)
    target = shared_gpu(tmp_path / "ze.conf", size)
    plan = plans.make_plan(views, {"offline": plans.Totals(size, core_of(size))}, {}, RESERVE, ONE_REQUEST_EACH,
                           ran_on_bytes=observed_on.core_total)
    assert plan.fits == (size_gib >= 14)  # one request each: ~12.7 GiB with the reserve's 0.5
    assert not plan.unplannable
    if not plan.fits:
        return
    engines = planned_engines(plan)
    events = boot_together(target, tmp_path, engines)
    assert {r["unit"] for r in events if r["event"] == "serving"} == set(engines), events
    assert not [r for r in events if r["event"] == "failed"], events
    for record in (r for r in events if r["event"] == "baseline"):
        assert record["requested"] >= held_when_serving(engines[record["unit"]]), record
