"""Right-sizing from the observed load (rightsizing.py), replayed: a recorded preemption trace gets a budget
that, applied, keeps its usage at most 1 with at most 10 % slack; an idle trace frees memory and the GPU
still fits; a unit at its max_num_seqs with requests waiting is not KV-limited. And vllm-xpu-plan --observed
offline, its output and its refusals."""

from __future__ import annotations

import json
import math

import pytest

from vllm_xpu_exporter.planner import plans
from vllm_xpu_exporter.planner.rightsizing import Sample, parse_observed, recommend, recommend_unit, target_requests
from vllm_xpu_exporter.sources.prometheus import QUERIES, ObservedError
from journalgen import write_journal
from rightsizedhost import CHAT, EMBEDDING, SIXTEEN_GIB, placed, run_plan, views
from sizes import GiB
from vllmlogs import journal_specs

# the preemption trace: requests that want to run (each holding 45 % of chat's KV cache when it runs), a minute apart
OFFERED = [1, 2, 3, 4, 4, 3, 4, 2, 1, 0, 1, 3, 4, 4, 2]
PER_REQUEST = 0.45


def matrix(series: dict[str, list[float]]) -> dict:
    """A query_range answer: per unit, one value a minute."""
    return {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"unit": unit}, "values": [[1_800_000_000 + 60 * i, repr(float(v))] for i, v in enumerate(values)]}
        for unit, values in series.items()]}}


def preemption_trace() -> dict[str, list[float]]:
    """chat, KV-limited: two requests fit, the others wait for capacity or are preempted."""
    running = [min(c, int(1 / PER_REQUEST)) for c in OFFERED]
    return {"usage": [r * PER_REQUEST for r in running], "running": running,
            "waiting_for_capacity": [c - r for c, r in zip(OFFERED, running)],
            "preemptions": [0.05 if c > r else 0.0 for c, r in zip(OFFERED, running)]}


def idle_trace() -> dict[str, list[float]]:
    """embedding, mostly idle: one request now and then, 5 % of its KV cache at most."""
    return {"usage": [0, 0.05, 0, 0, 0.02, 0], "running": [0, 1, 0, 0, 1, 0], "waiting_for_capacity": [0] * 6,
            "preemptions": [0] * 6}


def answers(traces: dict[str, dict[str, list[float]]]) -> dict:
    return {name: matrix({unit: trace[name] for unit, trace in traces.items()}) for name in QUERIES}


def test_a_preemption_trace_gets_a_budget_that_fits_it_with_at_most_10_percent_slack():
    unit_views = views()
    observed = parse_observed(answers({CHAT: preemption_trace(), EMBEDDING: idle_trace()}))
    (chat,) = [view for view in unit_views if view.unit == CHAT]
    current = chat.latest.effective_kv_cache_bytes
    found = recommend(unit_views, observed)
    assert found[CHAT].kv_limited
    plan = plans.make_plan(unit_views, {"gpu": plans.Totals.same(SIXTEEN_GIB)}, {}, 512 << 20, target_requests(found))
    (planned,) = [u for d in plan.devices for u in d.units if u.unit == CHAT]
    budget = planned.kv_cache_memory_bytes
    demand = [c * PER_REQUEST * current for c in OFFERED]
    # replayed with the budget applied: every moment's requests fit
    assert max(need / budget for need in demand) <= 1
    assert budget <= 1.10 * max(demand)
    assert plan.fits  # re-checked on the GPU: chat's growth is paid for by idle embedding's shrink


def test_an_idle_trace_frees_memory_and_the_gpu_still_fits():
    unit_views = views()
    (embedding,) = [view for view in unit_views if view.unit == EMBEDDING]
    current, required = embedding.latest.effective_kv_cache_bytes, embedding.latest.effective_required_bytes
    found = recommend(unit_views, parse_observed(answers({EMBEDDING: idle_trace()})))
    assert not found[EMBEDDING].kv_limited
    (chat,) = [view for view in unit_views if view.unit == CHAT]
    as_now = {CHAT: plans.TargetRequest(kv_bytes=chat.latest.effective_kv_cache_bytes),
              EMBEDDING: plans.TargetRequest(kv_bytes=current)}
    before = plans.make_plan(unit_views, {"gpu": plans.Totals.same(SIXTEEN_GIB)}, {}, 512 << 20, as_now)
    after = plans.make_plan(unit_views, {"gpu": plans.Totals.same(SIXTEEN_GIB)}, {}, 512 << 20,
                            {**as_now, **target_requests(found)})
    (was,) = [u for d in before.devices for u in d.units if u.unit == EMBEDDING]
    (now,) = [u for d in after.devices for u in d.units if u.unit == EMBEDDING]
    assert now.kv_cache_memory_bytes < was.kv_cache_memory_bytes  # it frees memory
    assert required is not None and found[EMBEDDING].kv_bytes >= required  # never below one max-length request
    assert after.fits and after.devices[0].fit.footprint_bytes < before.devices[0].fit.footprint_bytes


def test_waiting_at_max_num_seqs_is_the_cap_not_the_kv_cache():
    samples = [Sample(usage=0.6, running=4, waiting_for_capacity=3, preempting=False)] * 5
    recommendation = recommend_unit(CHAT, samples, 10 * GiB, max_num_seqs=4, required_bytes=GiB)
    assert not recommendation.kv_limited
    assert 0.6 * 10 * GiB * 1.05 <= recommendation.kv_bytes <= 0.6 * 10 * GiB * 1.05 + 2  # shrinks to peak + 5 %
    # below the cap, a request waiting for capacity is the KV cache's doing: it grows to what 4 requests hold
    limited = recommend_unit(CHAT, [Sample(0.9, 3, 1, False)], 10 * GiB, max_num_seqs=4, required_bytes=4 * GiB)
    demand = 0.9 * 10 * GiB / 3 * 4
    assert limited.kv_limited and demand <= limited.kv_bytes <= 1.1 * demand and not limited.capped


def hostile(usage: float, running: float, waiting: float) -> dict[str, list[float]]:
    """What a unit's own /metrics can make Prometheus hold: any usage, any counts, preempting all along."""
    return {"usage": [usage] * 5, "running": [running] * 5, "waiting_for_capacity": [waiting] * 5,
            "preemptions": [0.1] * 5}


def test_a_usage_over_1_is_believed_as_1_not_as_a_bigger_budget():
    """Chat reports its KV cache 3 times full with one request running: the most one request can hold is
    the whole cache, so its budget is at most that plus the margin (not 3x)."""
    found = recommend(views(), parse_observed(answers({CHAT: hostile(3, 1, 0), EMBEDDING: idle_trace()})))
    assert found[CHAT].kv_limited and found[CHAT].kv_bytes <= found[CHAT].current_bytes * 1.05 + 1


def test_a_kv_limited_units_growth_stops_at_max_num_seqs_requests_of_its_maximum_length_and_says_so():
    (chat,) = [view for view in views() if view.unit == CHAT]
    need = chat.latest.max_num_seqs * chat.latest.effective_required_bytes
    # a fraction of a request running and a thousand waiting: a demand of 400x its cache, were it believed
    found = recommend(views(), parse_observed(answers({CHAT: hostile(1, 0.01, 1000)})))
    assert found[CHAT].kv_bytes == need and "growth capped" in found[CHAT].why and str(need) in found[CHAT].why
    # nothing bounds a unit whose max_num_seqs is not known: it is not grown at all
    kept = recommend_unit(CHAT, [Sample(1, 1, 5, True)], GiB, max_num_seqs=None, required_bytes=GiB)
    assert kept.kv_bytes == GiB and "not grown" in kept.why


def test_negative_counts_are_none_and_preempting_with_nothing_running_keeps_the_budget():
    found = recommend(views(), parse_observed(answers({CHAT: hostile(0.5, -4, -7)})))
    assert found[CHAT].kv_limited and found[CHAT].kv_bytes == found[CHAT].current_bytes


@pytest.mark.parametrize("answers, message", [
    *[(json.loads(json.dumps(answers({CHAT: {**idle_trace(), name: [0, value, 0, 0, 0, 0]}})).replace(
        '"inf"', '"+Inf"')),
       f"{name!r}: {CHAT} has a value that is not a finite number")
      for name in QUERIES for value in (math.nan, math.inf)],
    ({name: {"data": {"resultType": "matrix", "result": {"x": 1}}} for name in QUERIES}, "its result is not a list"),
    ({name: matrix({}) | {"data": {"resultType": "matrix", "result": [
        {"metric": {"unit": ["u"]}, "values": []}]}} for name in QUERIES}, "unit is not a string"),
    ({"usage": {}}, "is not a query_range"),
    ({name: matrix({}) for name in QUERIES if name != "running"}, "no 'running' answer"),
])
def test_observations_that_cannot_be_read_are_refused(answers, message):
    with pytest.raises(ObservedError, match=message):
        parse_observed(answers)


def test_vllm_xpu_plan_observed_offline_plans_the_recommended_budgets(tmp_path):
    journal = write_journal(tmp_path / "system.journal", journal_specs(placed()))
    observed = tmp_path / "observed.json"
    observed.write_text(json.dumps(answers({CHAT: preemption_trace(), EMBEDDING: idle_trace()})))
    result = run_plan(journal, "--observed", str(observed), "--format", "json")
    assert result.returncode == 0, result.stderr
    expected = recommend(views(), parse_observed(json.loads(observed.read_text())))
    plan = plans.make_plan(views(), {"offline": plans.Totals.same(SIXTEEN_GIB)}, {}, 512 << 20, target_requests(expected))
    printed = json.loads(result.stdout)
    budgets = {unit["unit"]: unit["kv_cache_memory_bytes"] for device in printed["devices"] for unit in device["units"]}
    assert budgets == {u.unit: u.kv_cache_memory_bytes for d in plan.devices for u in d.units}
    assert f"{CHAT}: KV-limited" in result.stderr and f"{EMBEDDING}: peak" in result.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    refused = run_plan(journal, "--observed", str(broken))
    assert refused.returncode == 2 and refused.stdout == "" and len(refused.stderr.strip().splitlines()) == 1


def test_vllm_xpu_plan_names_the_unit_whose_growth_breaks_the_fit_and_a_usage_of_40_does_not(tmp_path):
    journal = write_journal(tmp_path / "system.journal", journal_specs(placed()))
    observed = tmp_path / "observed.json"
    observed.write_text(json.dumps(answers({CHAT: hostile(40, 1, 0), EMBEDDING: idle_trace()})))
    believed_as_full = run_plan(journal, "--observed", str(observed))
    assert believed_as_full.returncode == 0, believed_as_full.stderr
    observed.write_text(json.dumps(answers({CHAT: hostile(40, 0.01, 1000), EMBEDDING: idle_trace()})))
    grown_to_its_cap = run_plan(journal, "--observed", str(observed))
    assert grown_to_its_cap.returncode == 1, grown_to_its_cap.stderr
    blamed = [line for line in grown_to_its_cap.stderr.splitlines() if "makes GPU offline not fit" in line]
    assert blamed == [f"vllm-xpu-plan: {CHAT}: its right-sized growth (2147483648 -> 15070060688 bytes of KV) is what "
                      f"makes GPU offline not fit: without it the GPU fits"]
