"""Right-sizing from the observed load (pure): a KV budget per unit from what vLLM's own series said over a
window, for `vllm-xpu-plan --prometheus URL --window W` (or `--observed FILE`, the same answers saved).

The observations are Prometheus `query_range` answers of the recording rules over vLLM's series
(rules/vllm-xpu-exporter.yaml, docs/discovery.md), one per key of `sources.prometheus.QUERIES` (what the
source asks), sampled every `STEP_SECONDS` there:
KV-cache usage (0-1), requests running, requests waiting for KV capacity, and the preemption rate.

Per unit, with K its KV bytes now (its latest start) and N its max_num_seqs:

- **KV-limited** when, at some sample, it preempted, or requests waited for capacity while fewer than N
  ran (at N running the cap is max_num_seqs, not the KV cache; deferred waiting is not counted). Its demand
  at a sample is what each running request held (usage × K / running) times the requests that wanted to run
  (running + waiting for capacity, at most N); the budget is the peak demand plus `margin`. Applied, the
  trace's usage stays ≤ 1 with at most `margin` (default 5 %) slack over that peak.
- **Not KV-limited**: the budget shrinks to the peak bytes in use (usage × K) plus `margin`, but never below
  one request of its maximum model length (vLLM refuses to start with less) nor above K.

The series come from each unit's own /metrics, which the unit writes: nothing in them is believed beyond what
can be bounded. Usage is clamped to [0, 1] and counts to at least 0; a value that is not a finite number
refuses the whole observation (ObservedError, naming the unit); and a KV-limited unit grows at most to
N × one request of its maximum model length (the most its max_num_seqs requests can ever hold), not at all
when either is unknown. A capped growth is named in the recommendation.

The planner then sizes each budget in whole blocks and checks that the GPU's units still fit
(`vllm_xpu_exporter.planner.plans`): a grown budget that does not fit is reported as the plan's missing bytes.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vllm_xpu_exporter.argparsing import parse_duration
from vllm_xpu_exporter.fold.engine_starts import UnitView
from vllm_xpu_exporter.planner.plans import TargetRequest
from vllm_xpu_exporter.sources.prometheus import QUERIES, ObservedError, add_access_flags

DEFAULT_MARGIN = 0.05
DEFAULT_WINDOW = "24h"


@dataclass(frozen=True)
class Sample:
    """One moment of a unit's load."""

    usage: float
    running: float
    waiting_for_capacity: float
    preempting: bool


@dataclass(frozen=True)
class Recommendation:
    unit: str
    kv_bytes: int  # the budget to plan
    current_bytes: int
    kv_limited: bool
    peak_bytes: int  # peak demand (KV-limited) or peak bytes in use
    capped: str = ""  # why a KV-limited unit's growth stopped below its peak demand; '' when it did not

    @property
    def why(self) -> str:
        if self.kv_limited:
            return (f"KV-limited (preempted or requests waited for capacity below max_num_seqs): peak demand "
                    f"{self.peak_bytes} bytes" + (f", growth capped: {self.capped}" if self.capped else ""))
        return f"peak {self.peak_bytes} bytes in use of {self.current_bytes}"


def parse_observed(answers: Mapping[str, object]) -> dict[str, list[Sample]]:
    """unit -> its samples in time order, from the `query_range` answers by QUERIES key (the API's whole JSON,
    or its `data`). A unit's moment needs all four series; raises ObservedError on anything else."""
    by_name: dict[str, dict[str, dict[float, float]]] = {}
    for name in QUERIES:
        if name not in answers:
            raise ObservedError(f"no {name!r} answer")
        answer = answers[name]
        data = answer.get("data", answer) if isinstance(answer, Mapping) else None
        if not isinstance(data, Mapping) or data.get("resultType") != "matrix":
            raise ObservedError(f"{name!r} is not a query_range (matrix) answer")
        result = data.get("result", [])
        if not isinstance(result, list):
            raise ObservedError(f"{name!r}: its result is not a list of series")
        series: dict[str, dict[float, float]] = {}
        for item in result:
            try:
                unit = item["metric"]["unit"]
                points = {float(at): float(value) for at, value in item["values"]}
            except (KeyError, TypeError, ValueError) as error:
                raise ObservedError(f"{name!r}: a series without unit or values ({error})") from None
            if not isinstance(unit, str):
                raise ObservedError(f"{name!r}: a series whose unit is not a string")
            odd = next(((at, value) for at, value in points.items()
                        if not (math.isfinite(at) and math.isfinite(value))), None)
            if odd is not None:
                raise ObservedError(f"{name!r}: {unit} has a value that is not a finite number ({odd[1]!r} at "
                                    f"{odd[0]!r}): not believed; leave the unit out with --prometheus-selector")
            series.setdefault(unit, {}).update(points)
        by_name[name] = series
    samples: dict[str, list[Sample]] = {}
    for unit, usage in by_name["usage"].items():
        running = by_name["running"].get(unit, {})
        waiting = by_name["waiting_for_capacity"].get(unit, {})
        preemptions = by_name["preemptions"].get(unit, {})
        samples[unit] = [Sample(min(max(usage[at], 0.0), 1.0), max(running[at], 0.0), max(waiting.get(at, 0.0), 0.0),
                                preemptions.get(at, 0.0) > 0)
                         for at in sorted(usage) if at in running]
    return samples


def recommend_unit(unit: str, samples: Sequence[Sample], current_bytes: int, max_num_seqs: int | None,
                   required_bytes: int | None, margin: float = DEFAULT_MARGIN) -> Recommendation | None:
    """A unit's budget from its samples; None without a sample (nothing observed)."""
    if not samples:
        return None
    cap = max_num_seqs if max_num_seqs else math.inf
    limited = [s for s in samples if s.preempting or (s.waiting_for_capacity > 0 and s.running < cap)]
    if limited:
        demand = max(((s.usage * current_bytes / s.running) * min(cap, s.running + s.waiting_for_capacity)
                      for s in samples if s.running > 0), default=0.0)
        peak = max(demand, max(s.usage for s in samples) * current_bytes)
        budget = math.ceil(peak * (1 + margin))
        capped = ""
        if max_num_seqs and required_bytes:
            ceiling = max_num_seqs * required_bytes
            if budget > ceiling:
                budget, capped = ceiling, (f"at max_num_seqs {max_num_seqs} x {required_bytes} bytes "
                                           f"(one request of its maximum model length) = {ceiling} bytes")
        elif budget > current_bytes:
            budget, capped = current_bytes, "not grown: its max_num_seqs or one request's need is not known"
        return Recommendation(unit, max(budget, current_bytes), current_bytes, True, math.ceil(peak), capped)
    peak = math.ceil(max(s.usage for s in samples) * current_bytes)
    budget = max(math.ceil(peak * (1 + margin)), required_bytes or 0)
    return Recommendation(unit, min(budget, current_bytes), current_bytes, False, peak)


def recommend(views: Sequence[UnitView], observed: Mapping[str, Sequence[Sample]],
              margin: float = DEFAULT_MARGIN) -> dict[str, Recommendation]:
    """unit -> its recommendation, for the engine units whose latest start's KV bytes are known and that
    were observed."""
    found = {}
    for view in views:
        start = view.latest
        if start is None or start.engine is False or view.unit not in observed:
            continue
        current = start.effective_kv_cache_bytes
        if not current or current <= 0:
            continue
        recommendation = recommend_unit(view.unit, observed[view.unit], current, start.max_num_seqs,
                                        start.effective_required_bytes, margin)
        if recommendation is not None:
            found[view.unit] = recommendation
    return found


def target_requests(recommendations: Mapping[str, Recommendation]) -> dict[str, TargetRequest]:
    """The planner's targets: each recommended budget."""
    return {unit: TargetRequest(kv_bytes=r.kv_bytes) for unit, r in recommendations.items()}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """vllm-xpu-plan's --prometheus, --window, --prometheus-selector and --observed (dests prometheus, window,
    prometheus_selector, observed)."""
    group = parser.add_argument_group("right-sizing from the observed load (docs/discovery.md)")
    source = group.add_mutually_exclusive_group()
    source.add_argument("--prometheus", default=None, metavar="URL",
                        help="size each unit's budget from what Prometheus saw of its vLLM over --window "
                             "(the recording rules of rules/vllm-xpu-exporter.yaml over the /sd/vllm job)")
    source.add_argument("--observed", default=None, metavar="FILE",
                        help="the same, offline: a JSON object of the query_range answers by name "
                             f"({', '.join(QUERIES)})")
    group.add_argument("--window", type=parse_duration, default=parse_duration(DEFAULT_WINDOW), metavar="DURATION",
                       help=f"with --prometheus: how far back to look (default {DEFAULT_WINDOW})")
    group.add_argument("--prometheus-selector", dest="prometheus_selector", default="", metavar="MATCHERS",
                       help='with --prometheus: label matchers picking this host\'s series, e.g. '
                            'instance="gpu-host:10447"')
    add_access_flags(group)
