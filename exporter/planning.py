"""The plan of each vLLM unit on its GPU, from what its latest start printed (its journal view): the KV cache a
target needs in whole blocks, the unit's footprint, and whether each GPU's units fit. Pure: views and byte
counts in, plans out. The planner (`vllm-xpu-plan`, vllm_xpu_exporter.plan) prints it; the processes collector exposes
its figures per unit and device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vllm_xpu_exporter import memory as rules
from vllm_xpu_exporter.fold.engine_starts import Start, UnitView
from vllm_xpu_exporter.parsers import vllm

# --kv-cache-memory-bytes: absent before 0.10.2; on XPU the budget takes effect from 0.16.0 (the XPU
# worker of 0.9.2-0.15.1 never reads it).
KV_BUDGET_FLAG_SINCE = (0, 10, 2)
KV_BUDGET_ON_XPU_SINCE = (0, 16)
# The XPU platform's block size when none is given (V1).
XPU_DEFAULT_BLOCK_SIZE = 64


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
    gpu_memory_utilization: float  # what to set beside the budget: the footprint's share of the device
    notes: tuple[str, ...] = ()

    @property
    def kv_cache_memory_bytes(self) -> int:
        return self.footprint.kv_bytes


@dataclass(frozen=True)
class Unplannable:
    unit: str
    device: str | None
    why: str
    remedy: str


@dataclass
class DevicePlan:
    device: str
    total_bytes: int
    reserve_bytes: int
    units: list[UnitPlan] = field(default_factory=list)
    unplannable: list[Unplannable] = field(default_factory=list)

    @property
    def fit(self) -> rules.DeviceFit:
        return rules.device_fit(self.total_bytes, self.reserve_bytes, (u.footprint.total_bytes for u in self.units))


@dataclass
class Plan:
    devices: list[DevicePlan]
    unplaced: list[Unplannable]  # units whose GPU is not known

    @property
    def fits(self) -> bool:
        return all(device.fit.fits for device in self.devices)

    @property
    def unplannable(self) -> list[Unplannable]:
        return [*self.unplaced, *(u for device in self.devices for u in device.unplannable)]


@dataclass(frozen=True)
class TargetRequest:
    """A target other than the default (max_num_seqs requests of the full length): `tokens`, `requests` of the
    full length, or what a KV budget of `kv_bytes` holds."""

    tokens: int | None = None
    requests: int | None = None
    kv_bytes: int | None = None


def budget_target(view: UnitView) -> TargetRequest | None:
    """The exporter's target for a unit: what its --kv-cache-memory-bytes holds when its latest start set one
    (a plan applied: the budget is the target the operator chose), else None, the planner's default."""
    budget = view.latest.kv_cache_memory_bytes if view.latest is not None else None
    return TargetRequest(kv_bytes=budget) if budget else None


def _kv_figures(view: UnitView) -> tuple[Start, int, int] | None:
    """The start whose KV bytes and tokens are both known (the latest, else the last successful one)."""
    for start in (view.latest, view.last_success):
        if start is None:
            continue
        kv_bytes, kv_tokens = start.effective_kv_cache_bytes, start.effective_kv_cache_tokens
        if kv_bytes is not None and kv_tokens and kv_bytes > 0:
            return start, kv_bytes, kv_tokens
    return None


def _non_kv(start: Start, kv_bytes: int, total_bytes: int) -> tuple[rules.Footprint, str, tuple[str, ...]] | None:
    """The start's non-KV memory (a footprint with no KV yet), where the figure comes from, and notes."""
    if start.activation_bytes is not None and start.weights_bytes is not None and start.non_torch_bytes is not None \
            and start.consumed_bytes is None:
        return (rules.Footprint.of(start.weights_bytes, start.activation_bytes, start.non_torch_bytes, 0),
                "printed: weights + peak activation + non-torch", ())
    if start.activation_bytes is not None and start.consumed_bytes is not None:
        return (rules.Footprint(start.consumed_bytes + start.activation_bytes, 0, activation_bytes=start.activation_bytes),
                "printed: consumed (weights + non-torch) + peak activation", ())
    utilisation = start.effective_gpu_memory_utilization
    if start.kv_cache_memory_bytes is None and utilisation is not None and start.kv_cache_bytes is not None:
        non_kv = rules.requested_bytes(total_bytes, utilisation) - kv_bytes
        note = ("this release prints no split of the non-KV memory: it is ceil(total x gpu_memory_utilization) - "
                "the KV bytes it printed (weights + peak activation + non-torch as one figure)")
        return rules.Footprint(non_kv, 0, weights_bytes=start.weights_bytes), "derived: requested - KV", (note,)
    if start.weights_bytes is not None:
        note = ("its latest start had --kv-cache-memory-bytes set and printed no activation or non-torch figure: "
                "only its weights are counted, --reserve has to cover the rest")
        return rules.Footprint(start.weights_bytes, 0, weights_bytes=start.weights_bytes), "weights only", (note,)
    return None


def _target(unit: str, start: Start, kv_tokens: int, block_size: int, rate: rules.KvRate,
            request: TargetRequest | None) -> Target | Unplannable:
    length = start.requested_max_model_len
    if request is not None and request.kv_bytes is not None:
        return Target(rules.tokens_for_kv_bytes(request.kv_bytes, block_size, rate),
                      f"its --kv-cache-memory-bytes {request.kv_bytes}")
    if request is not None and request.tokens is not None:
        return Target(request.tokens, f"--tokens {request.tokens}")
    if request is not None and request.requests is not None:
        if length is None:
            return Unplannable(unit, None, "its latest start printed no maximum model length",
                               "give the target in tokens (--tokens UNIT=N)")
        return Target(request.requests * length, f"--requests {request.requests} x {length} tokens")
    if start.max_num_seqs is not None and length is not None:
        return Target(start.max_num_seqs * length, f"max_num_seqs {start.max_num_seqs} x {length} tokens")
    return Target(kv_tokens, "max_num_seqs not given: the KV tokens its latest start had")


def plan_unit(view: UnitView, device: str, total_bytes: int, request: TargetRequest | None = None) -> UnitPlan | Unplannable:
    """The plan of one unit on a device of `total_bytes`, or why it cannot be planned."""
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
    start, kv_bytes, kv_tokens = figures
    non_kv = _non_kv(start, kv_bytes, total_bytes)
    if non_kv is None:
        return Unplannable(unit, device, "its latest start printed neither its weights nor its "
                                         "gpu_memory_utilization's budget",
                           "let it start once without --kv-cache-memory-bytes")
    base, non_kv_from, notes = non_kv
    block_size = start.block_size or XPU_DEFAULT_BLOCK_SIZE
    rate = rules.KvRate(kv_bytes, kv_tokens)
    target = _target(unit, start, kv_tokens, block_size, rate, request)
    if isinstance(target, Unplannable):
        return Unplannable(unit, device, target.why, target.remedy)
    kv_needed = rules.kv_bytes_for_tokens(target.tokens, block_size, rate)
    footprint = rules.Footprint(base.non_kv_bytes, kv_needed, base.weights_bytes, base.activation_bytes,
                                base.non_torch_bytes)
    if start is not latest:
        notes = (*notes, "its latest start printed no KV size: the figures are its last successful start's")
    return UnitPlan(unit, device, version, target, block_size, rate.bytes_per_token, footprint, non_kv_from,
                    rules.utilisation_for(footprint.total_bytes, total_bytes), notes)


def make_plan(views: Sequence[UnitView], totals: Mapping[str, int], devices_of_units: Mapping[str, set[str]],
              reserve_bytes: int, requests: Mapping[str, TargetRequest]) -> Plan:
    """Every engine unit's plan. `totals`: device -> total bytes; a unit goes on the device
    `devices_of_units` names, or on the only device when there is one."""
    plans = {device: DevicePlan(device, total, reserve_bytes) for device, total in totals.items()}
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
        result = plan_unit(view, device, totals[device], requests.get(view.unit))
        if isinstance(result, Unplannable):
            plans[device].unplannable.append(result)
        else:
            plans[device].units.append(result)
    return Plan(list(plans.values()), unplaced)
