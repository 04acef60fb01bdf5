"""vllm_xpu_exporter.memory: vLLM's memory rules, as the gate, the headroom figure and the planner share them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_xpu_exporter import memory
from vllm_xpu_exporter.memory import KvRate

pytestmark = pytest.mark.fast  # the pure core (pyproject.toml's markers; `pytest -m fast`)

GiB = 1 << 30
SIXTEEN_GIB = 17179869184

totals = st.integers(min_value=1, max_value=1 << 50)
ratios = st.floats(min_value=1e-6, max_value=1.0, allow_nan=False)


def test_requested_bytes_is_vllms_float_product_rounded_up() -> None:
    # vLLM: math.ceil(total_memory * gpu_memory_utilization)
    assert memory.requested_bytes(SIXTEEN_GIB, 0.75) == 12884901888
    assert memory.requested_bytes(SIXTEEN_GIB, 0.07) == math.ceil(SIXTEEN_GIB * 0.07)
    assert memory.requested_bytes(SIXTEEN_GIB, 1.0) == SIXTEEN_GIB


@given(totals, ratios)
def test_requested_bytes_matches_vllm_for_any_figures(total: int, ratio: float) -> None:
    assert memory.requested_bytes(total, ratio) == math.ceil(total * ratio)
    assert memory.requested_bytes(total, ratio) == math.ceil(ratio * total)  # the gate's old spelling


def test_restart_headroom() -> None:
    assert memory.restart_headroom_bytes(3 * GiB, 9 * GiB, SIXTEEN_GIB, 0.75) == 0
    assert memory.restart_headroom_bytes(GiB, 0, SIXTEEN_GIB, 0.07) == GiB - math.ceil(SIXTEEN_GIB * 0.07)


def test_kv_bytes_for_tokens_rounds_up_to_whole_blocks() -> None:
    rate = KvRate(kv_bytes=16 * 1000, kv_tokens=16)  # 1000 bytes a token
    assert memory.kv_bytes_for_tokens(0, 16, rate) == 0
    assert memory.kv_bytes_for_tokens(1, 16, rate) == 16_000
    assert memory.kv_bytes_for_tokens(16, 16, rate) == 16_000
    assert memory.kv_bytes_for_tokens(17, 16, rate) == 32_000


def test_kv_bytes_for_tokens_of_a_printed_start() -> None:
    # vLLM 0.24 serving gemma-3-4b: "Available KV cache memory: 3.25 GiB", "GPU KV cache size: 136,960 tokens"
    rate = KvRate(round(3.25 * GiB), 136_960)
    planned = memory.kv_bytes_for_tokens(131072, 64, rate)
    assert planned == math.ceil(131072 * round(3.25 * GiB) / 136_960)
    assert planned < round(3.25 * GiB)


@given(st.integers(0, 1 << 24), st.integers(1, 1024), st.integers(1, 1 << 40), st.integers(1, 1 << 30))
def test_kv_bytes_cover_the_target_in_whole_blocks(tokens: int, block: int, kv_bytes: int, kv_tokens: int) -> None:
    rate = KvRate(kv_bytes, kv_tokens)
    planned = memory.kv_bytes_for_tokens(tokens, block, rate)
    blocks = math.ceil(tokens / block)
    # exact: the smallest byte count at least whole blocks x the rate
    assert planned * kv_tokens >= blocks * block * kv_bytes
    assert (planned - 1) * kv_tokens < blocks * block * kv_bytes
    # monotone in the target
    assert memory.kv_bytes_for_tokens(tokens + 1, block, rate) >= planned


@pytest.mark.parametrize("bad", [(0, 1), (1, 0), (-1, 5)])
def test_kv_rate_needs_positive_figures(bad: tuple[int, int]) -> None:
    with pytest.raises(ValueError):
        KvRate(*bad)


def test_footprint_and_fit() -> None:
    chat = memory.Footprint.of(weights_bytes=8 * GiB, activation_bytes=GiB // 2, non_torch_bytes=GiB // 8,
                               kv_bytes=4 * GiB)
    assert chat.total_bytes == 8 * GiB + GiB // 2 + GiB // 8 + 4 * GiB
    fit = memory.device_fit(SIXTEEN_GIB, 512 << 20, [chat.total_bytes, GiB])
    assert fit.fits and fit.left_bytes == SIXTEEN_GIB - (512 << 20) - chat.total_bytes - GiB
    assert fit.missing_bytes == 0
    crowded = memory.device_fit(SIXTEEN_GIB, 512 << 20, [chat.total_bytes, 3 * GiB])
    assert not crowded.fits and crowded.missing_bytes == -crowded.left_bytes > 0


@given(st.lists(st.integers(0, 1 << 40), max_size=8), totals, st.integers(0, 1 << 32))
def test_fit_is_the_sum_against_total_less_reserve(footprints: list[int], total: int, reserve: int) -> None:
    fit = memory.device_fit(total, reserve, footprints)
    assert fit.fits == (sum(footprints) + reserve <= total)
    assert fit.left_bytes + fit.footprint_bytes + fit.reserve_bytes == total
    assert fit.missing_bytes == (0 if fit.fits else sum(footprints) + reserve - total)


@given(st.integers(1, 1 << 40), st.integers(1, 1 << 40))
def test_utilisation_for_covers_the_footprint(footprint: int, total: int) -> None:
    ratio = memory.utilisation_for(footprint, total)
    assert 0 < ratio <= 1.0
    if footprint <= total:
        assert memory.requested_bytes(total, ratio) >= footprint
        # the share rounded up to 4 decimals, not more
        assert ratio <= footprint / total + 0.0001 + 1e-12
    else:
        assert ratio == 1.0
