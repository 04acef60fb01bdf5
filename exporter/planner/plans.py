"""The plan of each vLLM unit on its GPU, from what its latest start printed (its journal view): the KV cache a
target needs in whole blocks, the unit's footprint, and whether each GPU's units fit. Pure: views and byte
counts in, plans out. The planner (`vllm-xpu-plan`, vllm_xpu_exporter.planner.cli) prints it; the processes collector exposes
its figures per unit and device.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from vllm_xpu_exporter import memory_rules as rules
from vllm_xpu_exporter.fold.engine_starts import UnitView
from vllm_xpu_exporter.fold.start import Outcome, Start
from vllm_xpu_exporter.parsers import vllm
from vllm_xpu_exporter.parsers.vllm import StartupPlanOutcome

# --kv-cache-memory-bytes: absent before 0.10.2; on XPU the budget takes effect from 0.16.0 (the XPU
# worker of 0.9.2-0.15.1 never reads it).
KV_BUDGET_FLAG_SINCE = (0, 10, 2)
KV_BUDGET_ON_XPU_SINCE = (0, 16)
# The XPU platform's block size when none is given (V1).
XPU_DEFAULT_BLOCK_SIZE = 64


@dataclass(frozen=True)
class Totals:
    """A GPU's two totals: `memory_bytes`, what the kernel can give (Level Zero Sysman's total), which the units'
    footprints are held against; `vllm_bytes`, what vLLM multiplies by gpu_memory_utilization (the Level Zero core
    total, ~0.95 of Sysman's on Intel), which every R and ceil(R x total) is computed with."""

    memory_bytes: int
    vllm_bytes: int

    @classmethod
    def same(cls, total_bytes: int) -> Totals:
        return cls(total_bytes, total_bytes)


@dataclass(frozen=True)
class Target:
    """What a unit's KV cache must hold: `tokens`, and how that was chosen."""

    tokens: int
    reason: str


@dataclass(frozen=True)
class UnitPlan:
    unit: str
    device: str
    version: str
    target: Target
    block_size: int
    kv_bytes_per_token: float
    footprint: rules.Footprint
    non_kv_from: str  # where the non-KV figure comes from
    # what to set beside the budget: the footprint's share of the total vLLM multiplies; None when no R below 1
    # covers it (the unit cannot be given its footprint: its GPU does not fit)
    gpu_memory_utilization: float | None
    notes: tuple[str, ...] = ()
    kv_from: str = ""  # where the KV figures come from
    kv_blocks: rules.KvBlocks | None = None  # the blocks' upper bounds the budget was sized with

    @property
    def kv_cache_memory_bytes(self) -> int:
        return self.footprint.kv_bytes


@dataclass(frozen=True)
class Unplannable:
    unit: str
    device: str | None
    why: str
    remedy: str
    held_bytes: int | None = None  # what it asks of its GPU, ceil(R x total), when its R is known
    held_from: str = ""  # where its R comes from


@dataclass
class DevicePlan:
    device: str
    total_bytes: int  # what the kernel can give (Sysman's total): the footprints are held against it
    vllm_total_bytes: int  # what vLLM multiplies by R (the core total): every R is a share of it
    reserve_bytes: int
    units: list[UnitPlan] = field(default_factory=list)
    unplannable: list[Unplannable] = field(default_factory=list)

    @property
    def planned_bytes(self) -> int:
        """The planned units' footprints, summed."""
        return sum(u.footprint.total_bytes for u in self.units)

    @property
    def left_out_bytes(self) -> int:
        """What the units left out of the plan ask of the GPU (ceil(R x total) each, where R is known)."""
        return sum(u.held_bytes or 0 for u in self.unplannable)

    @property
    def fit(self) -> rules.DeviceFit:
        return rules.device_fit(self.total_bytes, self.reserve_bytes, (self.planned_bytes, self.left_out_bytes))

    @property
    def beyond_one(self) -> list[UnitPlan]:
        """The units whose footprint no R below 1 covers: vLLM can never give them what they hold."""
        return [u for u in self.units if u.gpu_memory_utilization is None]

    @property
    def uncounted(self) -> list[Unplannable]:
        """The units left out whose memory is not known: the GPU's sum cannot be held against its total."""
        return [u for u in self.unplannable if u.held_bytes is None]

    @property
    def fits(self) -> bool:
        """The footprints and what the units left out ask fit the GPU's total less the reserve, every unit's R
        is below 1, and no unit's memory is unknown."""
        return self.fit.fits and not self.beyond_one and not self.uncounted


@dataclass
class Plan:
    devices: list[DevicePlan]
    unplaced: list[Unplannable]  # units whose GPU is not known

    @property
    def fits(self) -> bool:
        return all(device.fits for device in self.devices)

    @property
    def unplannable(self) -> list[Unplannable]:
        return [*self.unplaced, *(u for device in self.devices for u in device.unplannable)]


@dataclass(frozen=True)
class TargetRequest:
    """A target other than the default (the KV the unit's last successful start had): `tokens`,
    `requests` of the full length, or what a KV budget of `kv_bytes` holds (the budget itself)."""

    tokens: int | None = None
    requests: int | None = None
    kv_bytes: int | None = None


def budget_target(view: UnitView) -> TargetRequest | None:
    """The exporter's target for a unit: what its --kv-cache-memory-bytes holds when its latest start set one
    (a plan applied: the budget is the target the operator chose), else None, the planner's default."""
    budget = view.latest.kv_cache_memory_bytes if view.latest is not None else None
    return TargetRequest(kv_bytes=budget) if budget else None


def _kv_figures(view: UnitView) -> tuple[Start, rules.KvBlocks, str] | None:
    """The start whose KV bytes and tokens are both known (the latest, else the last successful one), its
    blocks at their upper bounds, and where its KV bytes come from."""
    for start in (view.latest, view.last_success):
        if start is None:
            continue
        kv_tokens = start.effective_kv_cache_tokens
        if start.kv_cache_memory_bytes:
            kv_bytes_max, source = start.kv_cache_memory_bytes, "its --kv-cache-memory-bytes (exact)"
        elif start.kv_cache_bytes is not None and start.kv_cache_bytes > 0:
            kv_bytes_max = rules.printed_upper_bound(start.kv_cache_bytes)
            source = "the KV bytes it printed (2 decimals of GiB: their upper end)"
        else:
            continue
        if not kv_tokens:
            continue
        block_size = start.block_size or XPU_DEFAULT_BLOCK_SIZE
        length = start.max_model_len
        concurrency = rules.concurrency_lower_bound(start.max_concurrency) if start.max_concurrency else None
        return start, rules.KvBlocks.of(kv_bytes_max, kv_tokens, block_size, length, concurrency), source
    return None


def _profiled(view: UnitView) -> Start | None:
    """The latest start whose non-KV memory is known: it sized its KV cache from gpu_memory_utilization."""
    candidates = [s for s in (view.latest, view.last_success, view.last_profiled)
                  if s is not None and not s.kv_cache_memory_bytes and s.kv_cache_bytes is not None]
    # a start that lost a race measured other units' memory as its own non-torch memory: a successful
    # start's figure first
    return max(candidates, key=lambda s: (s.outcome is Outcome.OK, s.began_usec)) if candidates else None


def _printed_total(view: UnitView) -> int | None:
    """The device total the unit's starts printed (2 decimals of GiB), the latest that printed one."""
    starts = [s for s in (view.latest, view.last_success, view.last_profiled) if s is not None and s.device_total_bytes]
    return max(starts, key=lambda s: s.began_usec).device_total_bytes if starts else view.device_total_bytes


def needs_ran_on_total(view: UnitView) -> bool:
    """Whether the unit's non-KV memory comes from ceil(total x R) with a total no start of it printed: only the
    GPU it ran on can say that total."""
    return _profiled(view) is not None and _printed_total(view) is None


def printed_totals(views: Sequence[UnitView]) -> dict[str, int]:
    """unit -> the device total its starts printed, for the units that printed one."""
    return {v.unit: total for v in views if (total := _printed_total(v)) is not None}


def _ran_on(view: UnitView, total_bytes: int, ran_on_bytes: int | None) -> tuple[int, bool]:
    """The total the unit's starts multiplied by their gpu_memory_utilization, at its largest, and whether it is
    only assumed. A total the starts printed (2 decimals of GiB) stands for the device they ran on: the total
    planned for, or `ran_on_bytes` (the GPU they ran on, when the plan is for another size), when within its
    rounding (the same device size: exact), else its upper end. Without a printed total: `ran_on_bytes`, else the
    total planned for, which is right only if they ran on a device of that size."""
    printed = _printed_total(view)
    if printed:
        low, high = rules.printed_lower_bound(printed), rules.printed_upper_bound(printed)
        exact = next((t for t in (total_bytes, ran_on_bytes) if t is not None and low <= t <= high), None)
        return (exact if exact is not None else high), False
    if ran_on_bytes is not None:
        return ran_on_bytes, False
    return total_bytes, True


def _requested_less_kv(start: Start, ran_on: int) -> int | None:
    """What a start that sized its KV cache from gpu_memory_utilization kept besides its KV cache, at most:
    ceil(total x R) - the least its printed KV bytes stand for: its non-KV memory (from 0.34 with an estimate of
    its CUDA graphs); None when the start did not size its KV cache so (a budget, vLLM's own startup plan applied)."""
    utilisation = start.effective_gpu_memory_utilization
    if utilisation is None or start.kv_cache_memory_bytes or start.startup_plan is StartupPlanOutcome.APPLIED \
            or not start.kv_cache_bytes or start.kv_cache_bytes <= 0:
        return None
    return rules.requested_bytes(ran_on, utilisation) - rules.printed_lower_bound(start.kv_cache_bytes)


def _non_kv(view: UnitView, total_bytes: int,
            ran_on_bytes: int | None = None) -> tuple[rules.Footprint, str, tuple[str, ...]] | None:
    """The unit's non-KV memory (a footprint with no KV yet) from the latest start that printed it, at the
    upper end of what was printed, where the figure comes from, and notes. CUDA-graph memory (0.34 on XPU
    takes it from the budget too) is counted in it. The parts printed one by one (0.26+) are each rounded, so
    their sum is held against the requested memory less the KV bytes (one rounding), the smaller kept."""
    up = rules.printed_upper_bound
    start = _profiled(view)
    latest = view.latest
    older = start is not None and latest is not None and start is not latest and \
        start.began_usec != latest.began_usec
    where = " (an earlier start: the latest had --kv-cache-memory-bytes set)" if older else ""
    if start is not None:
        ran_on, assumed = _ran_on(view, total_bytes, ran_on_bytes)
        requested_less_kv = _requested_less_kv(start, ran_on)
        graphs = up(start.cudagraph_bytes) if start.cudagraph_bytes else 0
        # the graphs on top: 0.34 takes only an estimate of them out of the requested memory
        derived = requested_less_kv + graphs if requested_less_kv is not None else None
        printed = None
        if start.activation_bytes is not None and start.consumed_bytes is not None:
            printed = rules.Footprint(up(start.consumed_bytes) + up(start.activation_bytes) + graphs, 0,
                                      activation_bytes=up(start.activation_bytes))
            what = "printed: consumed (weights + non-torch) + peak activation + CUDA graphs"
        elif None not in (start.activation_bytes, start.weights_bytes, start.non_torch_bytes):
            base = rules.Footprint.of(up(start.weights_bytes), up(start.activation_bytes),
                                      up(start.non_torch_bytes), 0)
            printed = rules.Footprint(base.non_kv_bytes + graphs, 0, base.weights_bytes, base.activation_bytes,
                                      base.non_torch_bytes)
            what = "printed: weights + peak activation + non-torch + CUDA graphs"
        if printed is not None:
            if derived is not None and not assumed and 0 < derived < printed.non_kv_bytes:
                return (replace(printed, non_kv_bytes=derived),
                        what + ", held to ceil(total x R) - the KV bytes printed" + where, ())
            return printed, what + where, ()
        if derived is not None:
            if derived <= 0:
                return None
            printed_total = _printed_total(view)
            note = ("this release prints no split of the non-KV memory: it is ceil(total x gpu_memory_utilization) - "
                    "the KV bytes it printed (weights + peak activation + non-torch as one figure), with the total "
                    + (f"its starts printed ({printed_total / rules.GiB:.2f} GiB)" if printed_total else
                       f"of the GPU it ran on ({ran_on / rules.GiB:.2f} GiB)" if not assumed else
                       "planned for: right only if its starts ran on a device of that size"))
            return rules.Footprint(derived, 0, weights_bytes=start.weights_bytes), "derived: requested - KV" + where, \
                (note,)
    weights = next((s.weights_bytes for s in (latest, view.last_success) if s is not None and s.weights_bytes), None)
    if weights is not None:
        note = ("no start of it sized its KV cache from gpu_memory_utilization: only its weights are counted, "
                "--reserve has to cover the rest")
        return rules.Footprint(up(weights), 0, weights_bytes=up(weights)), "weights only", (note,)
    return None


def _printed_need(view: UnitView, start: Start) -> int | None:
    """The KV bytes a start of the unit said one request of its full length needs (a failed start's "To serve at
    least one request ... (X GiB KV cache is needed"), as printed, when that start asked for the same length as
    `start`."""
    needs = [s.required_bytes for s in (view.latest, view.last_success, view.last_profiled)
             if s is not None and s.required_bytes and s.requested_max_model_len == start.requested_max_model_len]
    return max(needs) if needs else None


def _target(unit: str, view: UnitView, start: Start, kv: rules.KvBlocks,
            request: TargetRequest | None) -> tuple[Target, int] | Unplannable:
    """The target and the budget that serves it under vLLM's rules."""
    length = start.requested_max_model_len
    one_request = rules.kv_budget_for_tokens(length, kv) if length else None
    if request is not None and request.kv_bytes is not None:
        return Target(rules.tokens_for_kv_budget(request.kv_bytes, kv),
                      f"its --kv-cache-memory-bytes {request.kv_bytes}"), request.kv_bytes
    if request is not None and request.tokens is not None:
        if length is not None and request.tokens < length:
            return Unplannable(unit, None, f"--tokens {request.tokens} is below one request of its maximum model "
                                           f"length ({length} tokens), which vLLM refuses to start with",
                               f"give at least --tokens {unit}={length}")
        reason = f"--tokens {request.tokens}"
        held = start.effective_kv_cache_tokens or 0
        if request.tokens > held:
            reason += (f" (extrapolated beyond the {held} tokens its start held, at the bytes per token it showed: a "
                       "model whose KV is not linear in tokens may need more; --requests is sized from the "
                       "concurrency vLLM printed)")
        return Target(request.tokens, reason), rules.kv_budget_for_tokens(request.tokens, kv)
    if length is None:
        return Unplannable(unit, None, "its latest start printed no maximum model length",
                           "give the target in tokens (--tokens UNIT=N)")
    if request is not None and request.requests is not None:
        if kv.request_bytes is not None and start.max_model_len == length:
            return (Target(request.requests * length, f"--requests {request.requests} x {length} tokens (from the "
                                                      f"concurrency vLLM printed)"),
                    rules.kv_budget_for_requests(request.requests, kv))
        return (Target(request.requests * length, f"--requests {request.requests} x {length} tokens"),
                rules.kv_budget_for_tokens(request.requests * length, kv))
    good = view.last_success
    if good is not None and good.effective_kv_cache_tokens:
        # what it had: its blocks less the null block, the same bytes again
        tokens = good.effective_kv_cache_tokens - kv.block_size
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(good.began_usec / 1e6))
        if tokens >= length:
            return (Target(tokens, f"the KV its last successful start had (began {when})"),
                    rules.kv_budget_for_tokens(tokens, kv))
        return (Target(length, f"one request of {length} tokens (its last successful start, began {when}, had less)"),
                one_request)
    return Target(length, f"one request of {length} tokens (no successful start of it in the journal)"), one_request


def plan_unit(view: UnitView, device: str, total_bytes: int, request: TargetRequest | None = None,
              ran_on_bytes: int | None = None) -> UnitPlan | Unplannable:
    """The plan of one unit on a device whose total vLLM multiplies is `total_bytes` (the Level Zero core total),
    or why it cannot be planned. `ran_on_bytes`: that total of the GPU the unit's starts ran on, when the plan is
    for another device and known."""
    unit, latest = view.unit, view.latest
    if latest is None or not latest.version:
        return Unplannable(unit, device, "its latest start printed no vLLM version",
                           "let it start once so that the journal holds its start-up lines")
    version = latest.version
    if vllm.release(version) < KV_BUDGET_ON_XPU_SINCE:
        missing = "has no --kv-cache-memory-bytes" if vllm.release(version) < KV_BUDGET_FLAG_SINCE else \
            "ignores --kv-cache-memory-bytes on XPU"
        return Unplannable(unit, device, f"vLLM {version} {missing} (effective on XPU from 0.16.0)",
                           "upgrade it to vLLM 0.16.0 or later; until then size it with --gpu-memory-utilization")
    figures = _kv_figures(view)
    if figures is None:
        return Unplannable(unit, device, "no start of it printed both its KV-cache bytes and tokens (it never got "
                                         "past profiling)",
                           "let it start once with a setting that fits (e.g. alone on the GPU, or a smaller "
                           "--max-model-len), or give it --kv-cache-memory-bytes by hand")
    start, kv, kv_from = figures
    non_kv = _non_kv(view, total_bytes, ran_on_bytes)
    if non_kv is None:
        return Unplannable(unit, device, "its latest start printed neither its weights nor its "
                                         "gpu_memory_utilization's budget",
                           "let it start once without --kv-cache-memory-bytes")
    base, non_kv_from, notes = non_kv
    target = _target(unit, view, start, kv, request)
    if isinstance(target, Unplannable):
        return Unplannable(unit, device, target.why, target.remedy)
    target, kv_needed = target
    need = _printed_need(view, start)
    floor = rules.printed_upper_bound(need) + kv.block_bytes if need is not None else 0
    if (request is None or request.kv_bytes is None) and kv_needed < floor:
        kv_needed = floor
        notes = (*notes, f"raised to what a start of it said one request of {start.requested_max_model_len} tokens "
                         f"needs ({need / rules.GiB:.2f} GiB printed, at its upper end) and the null block: vLLM "
                         f"refuses to start with less")
    footprint = rules.Footprint(base.non_kv_bytes, kv_needed, base.weights_bytes, base.activation_bytes,
                                base.non_torch_bytes)
    if start is not latest:
        notes = (*notes, "its latest start printed no KV size: the figures are its last successful start's")
    if start.max_num_seqs is not None and start.requested_max_model_len is not None:
        notes = (*notes, f"for information: max_num_seqs {start.max_num_seqs} x {start.requested_max_model_len} "
                         f"tokens would be {start.max_num_seqs * start.requested_max_model_len} tokens")
    return UnitPlan(unit, device, version, target, kv.block_size, kv.bytes_per_token, footprint, non_kv_from,
                    rules.utilisation_for(footprint.total_bytes, total_bytes), notes, kv_from, kv)


def _declared(view: UnitView, vllm_total: int) -> tuple[int, str] | None:
    """What a unit left out of the plan asks of its GPU, ceil(R x total), with R from its latest start that says
    it (printed, or its release's default), and which start that is; None when no start says it."""
    for start, which in ((view.latest, "its latest start"), (view.last_success, "its last successful start"),
                         (view.last_profiled, "its last profiled start")):
        utilisation = start.effective_gpu_memory_utilization if start is not None else None
        if utilisation is None:
            continue
        requested = rules.requested_bytes(vllm_total, utilisation)
        if start.kv_cache_memory_bytes and start.weights_bytes:  # a budget holds the KV whatever R asks
            budgeted = rules.printed_upper_bound(start.weights_bytes) + start.kv_cache_memory_bytes
            if budgeted > requested:
                return budgeted, f"its weights + its --kv-cache-memory-bytes, of {which}"
        return requested, f"ceil(R x total), R {utilisation:g} of {which}"
    return None


def make_plan(views: Sequence[UnitView], totals: Mapping[str, Totals], devices_of_units: Mapping[str, set[str]],
              reserve_bytes: int, requests: Mapping[str, TargetRequest], ran_on_bytes: int | None = None) -> Plan:
    """Every engine unit's plan. `totals`: device -> its two totals; a unit goes on the device `devices_of_units`
    names, or on the only device when there is one. `ran_on_bytes`: the total vLLM multiplied on the GPU the
    units' starts ran on, when the plan is for another device (offline) and it is known."""
    plans = {device: DevicePlan(device, total.memory_bytes, total.vllm_bytes, reserve_bytes)
             for device, total in totals.items()}
    unplaced: list[Unplannable] = []
    for view in sorted(views, key=lambda v: v.unit):
        if view.latest is None or view.latest.engine is False:
            continue
        known = sorted(devices_of_units.get(view.unit, set()) & set(totals))
        if len(totals) == 1:
            device = next(iter(totals))
        elif len(known) == 1:
            device = known[0]
        else:
            why = "its GPU is not known (no process of it holds a GPU now)" if not known else \
                f"it holds memory on several GPUs ({', '.join(known)})"
            unplaced.append(Unplannable(view.unit, None, why, "plan it alone with --device-memory BYTES"))
            continue
        vllm_total = totals[device].vllm_bytes
        result = plan_unit(view, device, vllm_total, requests.get(view.unit), ran_on_bytes)
        if isinstance(result, Unplannable):
            held, held_from = _declared(view, vllm_total) or (None, "")
            plans[device].unplannable.append(replace(result, held_bytes=held, held_from=held_from))
        else:
            plans[device].units.append(result)
    return Plan(list(plans.values()), unplaced)
