"""The held-out rule of the planner: for every vLLM release 0.16.0 -> 0.34.0 whose start-up lines the project
parses, and every true KV figure within what vLLM printed of it (2 decimals of GiB, "Cx" with 2 decimals),
the budget the plan writes serves its target under vLLM's own rules.

vLLM's rules are written out here from its source (v1/core/kv_cache_utils.py, the block pool, the worker's
`determine_available_memory`), not taken from the planner: with `--kv-cache-memory-bytes B` the available
KV memory is exactly B; a request of the full length needs cdiv(max_model_len, block_size) pages and a
start whose B is smaller refuses to start; the cache has B // page blocks; block 0 is the null block.
The lines are the ones vLLM prints (tests/vllmlogs.py), folded by the project's own parser and fold."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vllm_xpu_exporter.planner import plans
from vllm_xpu_exporter.fold.engine_starts import EngineTracker
from journalgen import current_boot_id
from vllmlogs import Boot, VllmRun, compose, service_runs, tracker_entries

GiB = 1 << 30
SIXTEEN_GIB = 17179869184
UNIT = "vllm-xpu-model.service"
RELEASES = ("0.16.0", "0.17.1", "0.18.1", "0.19.1", "0.20.2", "0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1",
            "0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")


# --- vLLM's rules, as its source has them -------------------------------------------------------------

def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def vllm_starts(budget: int, page: int, max_model_len: int, block_size: int) -> bool:
    """_check_enough_kv_cache_memory with available = the budget: one full-length request must fit."""
    return budget > 0 and cdiv(max_model_len, block_size) * page <= budget


def usable_blocks(budget: int, page: int) -> int:
    """The KV cache's blocks (available // page_size) less the block pool's null block."""
    return budget // page - 1


# --- a start as vLLM prints it ------------------------------------------------------------------------

def printed_start(version: str, true_kv: int, page: int, block_size: int, max_model_len: int,
                  budget_set: bool) -> tuple[VllmRun, int]:
    """The run whose lines print what vLLM prints of a true KV cache of `true_kv` bytes, and its tokens."""
    blocks = true_kv // page
    tokens = blocks * block_size
    concurrency = blocks / cdiv(max_model_len, block_size)  # printed "%.2fx"
    run = VllmRun(version, gpu_memory_utilization=0.75, max_model_len=max_model_len, max_num_seqs=2,
                  block_size=block_size, kv_cache_gib=true_kv / GiB, kv_cache_tokens=tokens,
                  max_concurrency=concurrency, kv_cache_memory_bytes=true_kv if budget_set else None,
                  weights_gib=2.5)
    return run, tokens


def folded_view(run: VllmRun):
    boot_at = 1_747_044_600.0
    placed = compose(Boot(current_boot_id(), boot_at, tuple(service_runs(UNIT, [run], boot_at + 60))))
    tracker = EngineTracker()
    tracker.extend(tracker_entries(placed))
    [view] = [v for v in tracker.views() if v.unit == UNIT]
    return view


HALF_STEP = GiB // 200  # "%.2f GiB" stands for anything within 0.005 GiB


@st.composite
def starts(draw, version: str):
    block_size = draw(st.sampled_from([16, 32, 64, 128]))
    per_token = draw(st.integers(2048, 160 * 1024))  # bytes of KV per token over every layer
    page = per_token * block_size
    max_model_len = draw(st.integers(256, 131072))
    one_request = cdiv(max_model_len, block_size) * page
    low = max(one_request + page, 64 << 20)  # a KV cache vLLM prints as at least 0.06 GiB
    # a print "X.XX GiB" and a true figure anywhere within its rounding, its edges included
    centi = draw(st.integers(-(-low * 100 // GiB), max(-(-low * 100 // GiB), 1000)))
    offset = draw(st.one_of(st.integers(-HALF_STEP, HALF_STEP),
                            st.sampled_from([-HALF_STEP, -HALF_STEP + 1, 0, HALF_STEP - 1, HALF_STEP])))
    true_kv = max(low, centi * GiB // 100 + offset)
    assume(true_kv <= 10 * GiB)  # below what R 0.75 of 16 GiB asks, with room for the weights
    budget_set = draw(st.booleans())
    return version, true_kv, page, block_size, max_model_len, budget_set


@pytest.mark.fast
@pytest.mark.parametrize("version", RELEASES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), requests=st.integers(1, 4), extra_tokens=st.integers(0, 3 * 131072))
def test_the_planned_budget_serves_its_target_under_vllms_rules(version: str, data, requests: int,
                                                               extra_tokens: int) -> None:
    version, true_kv, page, block_size, max_model_len, budget_set = data.draw(starts(version))
    run, tokens = printed_start(version, true_kv, page, block_size, max_model_len, budget_set)
    view = folded_view(run)
    # full-length requests, sized from the concurrency vLLM printed
    plan = plans.plan_unit(view, "gpu", SIXTEEN_GIB, plans.TargetRequest(requests=requests))
    assert isinstance(plan, plans.UnitPlan), plan
    budget = plan.kv_cache_memory_bytes
    assert vllm_starts(budget, page, max_model_len, block_size)
    assert usable_blocks(budget, page) >= requests * cdiv(max_model_len, block_size)
    # tokens, never below one request
    target = max_model_len + extra_tokens
    plan = plans.plan_unit(view, "gpu", SIXTEEN_GIB, plans.TargetRequest(tokens=target))
    budget = plan.kv_cache_memory_bytes
    assert vllm_starts(budget, page, max_model_len, block_size)
    assert usable_blocks(budget, page) * block_size >= target
    # the default: what the start had, and never less than one full-length request
    plan = plans.plan_unit(view, "gpu", SIXTEEN_GIB)
    budget = plan.kv_cache_memory_bytes
    assert vllm_starts(budget, page, max_model_len, block_size)
    assert usable_blocks(budget, page) * block_size >= max(plan.target.tokens, max_model_len)
    assert usable_blocks(budget, page) >= usable_blocks(true_kv, page)


@pytest.mark.fast
def test_the_issues_start_one_request_of_chat_is_accepted() -> None:
    """The issue's case: true KV 3.2549 GiB printed "3.25", 24,576 B/token; one 131072-token request needs
    2048 blocks of 64 tokens (3,221,225,472 bytes) and the null block."""
    page = 24576 * 64
    run, _ = printed_start("0.24.0", round(3.2549 * GiB), page, 64, 131072, budget_set=False)
    plan = plans.plan_unit(folded_view(run), "gpu", SIXTEEN_GIB, plans.TargetRequest(requests=1))
    assert plan.kv_cache_memory_bytes >= 3_221_225_472 + page
    assert usable_blocks(plan.kv_cache_memory_bytes, page) >= 2048
