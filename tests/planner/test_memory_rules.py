"""vllm_xpu_exporter.memory_rules: vLLM's memory rules, as the gate, the headroom figure and the planner share them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_xpu_exporter import memory_rules
from vllm_xpu_exporter.memory_rules import KvBlocks

pytestmark = pytest.mark.fast  # the pure core (pyproject.toml's markers; `pytest -m fast`)

GiB = 1 << 30
SIXTEEN_GIB = 17179869184

totals = st.integers(min_value=1, max_value=1 << 50)
ratios = st.floats(min_value=1e-6, max_value=1.0, allow_nan=False)


def test_requested_bytes_is_vllms_float_product_rounded_up() -> None:
    # vLLM: math.ceil(total_memory * gpu_memory_utilization)
    assert memory_rules.requested_bytes(SIXTEEN_GIB, 0.75) == 12884901888
    assert memory_rules.requested_bytes(SIXTEEN_GIB, 0.07) == math.ceil(SIXTEEN_GIB * 0.07)
    assert memory_rules.requested_bytes(SIXTEEN_GIB, 1.0) == SIXTEEN_GIB


@given(totals, ratios)
def test_requested_bytes_matches_vllm_for_any_figures(total: int, ratio: float) -> None:
    assert memory_rules.requested_bytes(total, ratio) == math.ceil(total * ratio)
    assert memory_rules.requested_bytes(total, ratio) == math.ceil(ratio * total)  # the gate's old spelling


def test_restart_headroom() -> None:
    assert memory_rules.restart_headroom_bytes(3 * GiB, 9 * GiB, SIXTEEN_GIB, 0.75) == 0
    assert memory_rules.restart_headroom_bytes(GiB, 0, SIXTEEN_GIB, 0.07) == GiB - math.ceil(SIXTEEN_GIB * 0.07)


def test_a_budget_for_tokens_is_its_whole_blocks_and_the_null_block() -> None:
    kv = KvBlocks(block_size=16, block_bytes=16_000)  # 1000 bytes a token
    assert memory_rules.kv_budget_for_tokens(0, kv) == 16_000  # the null block alone
    assert memory_rules.kv_budget_for_tokens(1, kv) == 32_000
    assert memory_rules.kv_budget_for_tokens(16, kv) == 32_000
    assert memory_rules.kv_budget_for_tokens(17, kv) == 48_000
    assert memory_rules.tokens_for_kv_budget(48_000, kv) == 32 and memory_rules.tokens_for_kv_budget(47_999, kv) == 16


def test_the_issues_low_rate_is_gone() -> None:
    # the true KV 3.2549 GiB printed "3.25" held 2,2xx blocks of 64 tokens at 24,576 B/token; reading the
    # rate at the print's value planned 3,216,393,151 bytes for one 131072-token request, below the
    # 3,221,225,472 vLLM needs
    page = 64 * 24576
    true_kv = round(3.2549 * GiB)
    tokens = true_kv // page * 64
    kv = KvBlocks.of(memory_rules.printed_upper_bound(round(3.25 * GiB)), tokens, 64)
    assert kv.block_bytes >= page
    assert memory_rules.kv_budget_for_tokens(131072, kv) >= 2048 * page + page


def test_printed_bounds_hold_the_true_figure() -> None:
    assert memory_rules.printed_upper_bound(round(3.25 * GiB)) >= 3.255 * GiB
    assert memory_rules.printed_lower_bound(round(3.25 * GiB)) <= 3.245 * GiB
    numerator, denominator = memory_rules.concurrency_lower_bound(1.04)
    assert numerator / denominator == pytest.approx(1.035)


@given(st.integers(1, 1 << 36), st.sampled_from([16, 32, 64, 128]), st.integers(1, 1 << 22), st.integers(0, 1 << 20))
def test_the_block_bound_is_never_below_the_true_page(page: int, block: int, blocks: int, spare: int) -> None:
    true_kv = blocks * page + min(spare, page - 1)  # vLLM takes true_kv // page blocks
    printed = round(round(true_kv / GiB, 2) * GiB)
    kv = KvBlocks.of(memory_rules.printed_upper_bound(printed), blocks * block, block)
    assert kv.block_bytes >= page


@pytest.mark.parametrize("bad", [(0, 1), (1, 0), (-1, 5)])
def test_kv_blocks_need_positive_figures(bad: tuple[int, int]) -> None:
    with pytest.raises(ValueError):
        KvBlocks.of(bad[0], bad[1], 64)


def test_footprint_and_fit() -> None:
    chat = memory_rules.Footprint.of(weights_bytes=8 * GiB, activation_bytes=GiB // 2, non_torch_bytes=GiB // 8,
                               kv_bytes=4 * GiB)
    assert chat.total_bytes == 8 * GiB + GiB // 2 + GiB // 8 + 4 * GiB
    fit = memory_rules.device_fit(SIXTEEN_GIB, 512 << 20, [chat.total_bytes, GiB])
    assert fit.fits and fit.left_bytes == SIXTEEN_GIB - (512 << 20) - chat.total_bytes - GiB
    assert fit.missing_bytes == 0
    crowded = memory_rules.device_fit(SIXTEEN_GIB, 512 << 20, [chat.total_bytes, 3 * GiB])
    assert not crowded.fits and crowded.missing_bytes == -crowded.left_bytes > 0


@given(st.lists(st.integers(0, 1 << 40), max_size=8), totals, st.integers(0, 1 << 32))
def test_fit_is_the_sum_against_total_less_reserve(footprints: list[int], total: int, reserve: int) -> None:
    fit = memory_rules.device_fit(total, reserve, footprints)
    assert fit.fits == (sum(footprints) + reserve <= total)
    assert fit.left_bytes + fit.footprint_bytes + fit.reserve_bytes == total
    assert fit.missing_bytes == (0 if fit.fits else sum(footprints) + reserve - total)


@given(st.integers(1, 1 << 40), st.integers(1, 1 << 40))
def test_utilisation_for_covers_the_footprint_and_is_never_1(footprint: int, total: int) -> None:
    """R below 1 whose request covers the footprint, rounded up to 4 decimals and no more; None when only R >= 1
    would (vLLM could never hold that footprint: a plan must not say R 1)."""
    ratio = memory_rules.utilisation_for(footprint, total)
    if ratio is None:
        assert memory_rules.requested_bytes(total, 0.9999) < footprint
        return
    assert 0 < ratio < 1.0
    assert memory_rules.requested_bytes(total, ratio) >= footprint
    assert ratio <= footprint / total + 0.0001 + 1e-12
