"""The init gate's decision, pure functions: what holds a unit's start back on its GPU now, from the fold's
unit views, the leases of the units released before it and a Level Zero memory reading; and when a
lease ends.

Two ways to admit a start (docs/gate.md, "How it decides"):

- **In order** (the default): no other watched unit on the device is initialising or holds a lease, and
  free memory is at least ceil(R x total) (`vllm_xpu_exporter.memory_rules.requested_bytes`).
- **By the plan**: when the starting unit and every unit holding it back (initialising, or leased and not
  yet done) run with an absolute KV budget (`--kv-cache-memory-bytes`), none of them sizes its cache from
  free memory, so their inits may overlap: the start is admitted as soon as free memory covers its own
  ceil(R x total) plus what those units have yet to take (each one's ceil(R x total) from its own start,
  less the device memory its processes already hold, when that is known).

A wake (`vllm-xpu-gate wake`, before vLLM's `POST /wake_up`) is admitted as a start is, needing what its sleep
freed instead of ceil(R x total), and its lease holds the others back as an init's does until the engine prints
its wake's end. In every decision a sleeping unit counts at its awake footprint: what its wake takes back is
added to what a start or another wake needs.

With `HOST` as the device (Level Zero cannot be read, so the GPUs cannot be told apart) every unit on
the host counts, and memory is not checked: one init at a time per host.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_xpu_exporter import memory_rules
from vllm_xpu_exporter.fold.engine_starts import UnitView
from vllm_xpu_exporter.fold.start import Start
from vllm_xpu_exporter.parsers import gate as gate_lines
from vllm_xpu_exporter.parsers.workloads import uid_of_identity
from vllm_xpu_exporter.runtimes import plan_bytes

if TYPE_CHECKING:
    from vllm_xpu_exporter.sources.levelzero.worker import DeviceMemory

HOST = "host"  # the device of a decision made without Level Zero: the whole host
# A lease whose unit's cgroup is empty ends only this long after its release: between the client's exit
# and the main process's fork the cgroup is briefly empty.
CGROUP_GRACE_USEC = 3_000_000


@dataclass(frozen=True)
class Lease:
    """A release: the unit holds the device from then until its start's init ends (`lease_over`)."""

    device: str  # PCI address, or HOST
    unit: str
    cgroup_path: str  # the unit's cgroup as the service saw the caller's
    granted_usec: int  # wall clock, as the journal's realtime
    expires_usec: int
    needed_bytes: int | None  # ceil(R x total) of the released start, when known
    absolute_budget: bool  # the start runs with --kv-cache-memory-bytes
    invocation_id: str = ""  # the released start's, when the journal had shown it ("Starting") by then
    timed_out: bool = False  # released when its wait ran out: other timed-out starts wait for it still
    # a wake's lease (needed_bytes: what it takes back; invocation_id: `asleep_invocation`'s key of the sleep),
    # held until the engine says it woke
    wake: bool = False


@dataclass(frozen=True)
class Admission:
    """What is asked: `unit` may start on `device`, needing ceil(R x total) free."""

    unit: str
    device: str
    gpu_memory_utilization: float | None
    absolute_budget: bool
    takes_back: int | None = None  # a wake: what the sleeping engine takes back (needed instead of ceil(R x total))


@dataclass(frozen=True)
class Decision:
    """What holds the start back now: units (initialising, or holding a lease) and memory."""

    units: tuple[str, ...]
    memory_short: bool
    free_bytes: int | None
    needed_bytes: int | None  # this start's ceil(R x total), plus, by the plan, what others have yet to take
    by_plan: bool = False

    @property
    def release(self) -> bool:
        return not self.units and not self.memory_short

    @property
    def waiting_for(self) -> tuple[str, ...]:
        return self.units + ((gate_lines.MEMORY,) if self.memory_short else ())


def lease_over(lease: Lease, view: UnitView | None, now_usec: int, cgroup_populated: bool | None,
               engine_grace_usec: int | None = None, empty_since_usec: int | None = None) -> str | None:
    """Why the lease no longer holds, or None while it does. A unit's lease ends when its cgroup has stayed
    empty for CGROUP_GRACE_USEC (`empty_since_usec`: since when it is seen empty without a break, else since
    the release): between one ExecStartPre= command's exit and the next command's or the engine's fork it is
    empty for a moment, which a loaded host stretches. A container's lease (its key has a `/`) ends as soon as
    its cgroup is empty (its process became the engine: an empty cgroup is a dead container), and, when the
    container printed no vLLM line within `engine_grace_usec` of its release, then (no engine)."""
    if now_usec >= lease.expires_usec:
        return "timed out"
    if lease.wake:
        return _wake_over(lease, view, now_usec, cgroup_populated, empty_since_usec)
    if lease.invocation_id and view is not None and view.invocation_ended(lease.invocation_id):
        return "its init ended"
    current = view.current if view is not None else None
    if current is not None and current.main_began_usec is not None and current.main_began_usec >= lease.granted_usec:
        return "its init ended" if view.initialising_since_usec is None else None
    container = "/" in lease.unit
    empty_since = max(lease.granted_usec, empty_since_usec or 0)
    if cgroup_populated is False and (container or now_usec - empty_since >= CGROUP_GRACE_USEC):
        return "its container has no process" if container else "its unit has no process"
    if container and engine_grace_usec is not None and now_usec - lease.granted_usec >= engine_grace_usec:
        return "it printed no vLLM line within the engine grace (--journal.engine-grace): no engine"
    return None


def _wake_over(lease: Lease, view: UnitView | None, now_usec: int, cgroup_populated: bool | None,
               empty_since_usec: int | None) -> str | None:
    """A wake's lease ends when the engine prints its wake's end, when its start ends (a failed wake kills the
    engine), or when the unit's cgroup stays empty for CGROUP_GRACE_USEC."""
    invocation, _, slept = lease.invocation_id.partition(SLEPT_AT)
    current = view.current if view is not None else None
    if current is None or current.invocation_id != invocation or current.process_gone:
        return "its engine ended"
    if current.woke_usec is not None and slept.isdigit() and current.woke_usec > int(slept):
        return "its wake ended"
    if cgroup_populated is False and now_usec - max(lease.granted_usec, empty_since_usec or 0) >= CGROUP_GRACE_USEC:
        return "its unit has no process"
    return None


SLEPT_AT = "#slept@"


def asleep_invocation(view: UnitView | None) -> str:
    """The wake a sleeping unit may be leased once: its current start's invocation id and when it went to sleep;
    '' when the journal shows the unit serving awake, or not serving."""
    current = view.current if view is not None else None
    if current is None or current.outcome is None or current.asleep_bytes is None or not current.invocation_id:
        return ""
    return f"{current.invocation_id}{SLEPT_AT}{current.slept_usec}"


@dataclass(frozen=True)
class ContainerRun:
    """The process of a container that asks the gate (its client, which becomes the container's engine by
    exec): `invocation_id` names that process (the container's cgroup, its pid and its start, so one
    process is leased once), `began_usec` when it began (wall clock, as the journal's)."""

    invocation_id: str
    began_usec: int
    recorded_command: tuple[str, ...] = ()  # as root's engine recorded it at the container's creation


def recorded_figures(command: Sequence[str]) -> tuple[float | None, int | None]:
    """The `--gpu-memory-utilization` and `--kv-cache-memory-bytes` a container's recorded command gives its
    engine: the words after the gate client's `--` (all of them without one), the last of each flag as
    vLLM's parser takes it (`--flag value`, `--flag=value`, `_` for `-`); None for a flag absent or not a plain
    number."""
    words = list(command)
    if "--" in words:
        words = words[words.index("--") + 1:]
    found: dict[str, str] = {}
    for index, word in enumerate(words):
        name, equals, value = word.partition("=")
        name = name.replace("_", "-")
        if name in ("--gpu-memory-utilization", "--kv-cache-memory-bytes"):
            found[name] = value if equals else (words[index + 1] if index + 1 < len(words) else "")
    ratio_text, budget_text = found.get("--gpu-memory-utilization"), found.get("--kv-cache-memory-bytes")
    try:
        ratio = float(ratio_text) if ratio_text is not None else None
    except ValueError:
        ratio = None
    if ratio is not None and not 0.0 < ratio <= 1.0:
        ratio = None
    return ratio, plan_bytes(budget_text)


def container_waiting_invocation(run: ContainerRun, view: UnitView | None) -> str:
    """A container's start waits at its gate while the container has printed no vLLM start since the process
    that asks began (its entrypoint, before the engine it execs): that process's `invocation_id`; '' when
    the container's logs show a start since (the process is no gate's: a serving engine's, or one it runs)."""
    current = view.current if view is not None else None
    if current is not None and current.main_began_usec is not None and current.main_began_usec >= run.began_usec:
        return ""
    return run.invocation_id


def waiting_invocation(view: UnitView | None) -> str:
    """The invocation id of the unit's start waiting at its gate (systemd announced it, its main process has
    not begun), as PID 1's records in the journal say; '' when the journal has not shown it (yet)."""
    current = view.current if view is not None else None
    if current is None or not current.announced or current.main_began_usec is not None or current.outcome:
        return ""
    return current.invocation_id


def decide(admission: Admission, views: Sequence[UnitView], leases: Iterable[Lease],
           devices_of_units: Mapping[str, set[str]] | None, memory: DeviceMemory | None,
           taken: Mapping[str, int] | None = None) -> Decision:
    """The decision for the admission. `devices_of_units`: the devices each unit is known to use (None:
    one GPU, or HOST: every unit counts); a unit not in it counts on every device. `memory`: the
    device's reading (None: unchecked). `taken`: device memory each unit's processes hold on the device
    (by the plan, what an admitted unit has already taken); None when unknown."""
    device, unit = admission.device, admission.unit

    def on_device(other: str) -> bool:
        return device == HOST or device in (devices_of_units or {}).get(other, {device})

    owner = uid_of_identity(unit)

    def may_hold_back(other: str) -> bool:
        """The system's inits and leases hold every start back, a user's (rootless containers) only that user's:
        whoever runs a rootless container cannot hold the system's starts back with it."""
        return other != unit and uid_of_identity(other) in (0, owner)

    views_by_unit = {view.unit: view for view in views}
    initialising = sorted((view.initialising_since_usec, view.unit) for view in views
                          if may_hold_back(view.unit) and view.initialising_since_usec is not None
                          and on_device(view.unit))
    holders = [name for _, name in initialising]
    held = {lease.unit: lease for lease in leases
            if may_hold_back(lease.unit) and (device == HOST or lease.device in (device, HOST))}
    holders += [name for name in held if name not in holders]
    free = memory.free if memory is not None else None
    total = memory.total if memory is not None else None
    ratio = admission.gpu_memory_utilization
    needed = memory_rules.requested_bytes(total, ratio) if ratio and total else None
    if admission.takes_back is not None:
        needed = admission.takes_back
    if needed is not None:
        needed += _taken_back_by_sleepers(views, lambda other: may_hold_back(other) and on_device(other),
                                          {name for name, lease in held.items() if lease.wake}, total)
    if needed is not None and free is not None and admission.absolute_budget and holders:
        yet_to_take = _yet_to_take(holders, held, views_by_unit, total, taken or {})
        if yet_to_take is not None:
            needed += yet_to_take
            return Decision((), free < needed, free, needed, by_plan=True)
    return Decision(tuple(holders), needed is not None and free is not None and free < needed, free, needed)


def wake_bytes(view: UnitView | None, total: int | None) -> int | None:
    """What the unit's wake takes back while it sleeps: what its sleep line says it freed, at most its own
    ceil(R x total) (vLLM measures the freed memory as the device's free memory after less before, so another
    engine's memory freed meanwhile counts in it; and a unit's line can claim no more than its own share). None
    when it is not asleep."""
    current = view.current if view is not None else None
    freed = current.asleep_bytes if current is not None else None
    if freed is None:
        return None
    ratio = view.gpu_memory_utilization
    return min(freed, memory_rules.requested_bytes(total, ratio)) if ratio and total else freed


def _taken_back_by_sleepers(views: Sequence[UnitView], counts: Callable[[str], bool], waking: set[str],
                            total: int | None) -> int:
    """What the sleeping units that `counts` take back when they wake (`wake_bytes`): each counts at its awake
    footprint. A unit that holds a wake's lease is left out: its lease holds the others back (by the plan, its
    bytes count)."""
    return sum(wake_bytes(view, total) or 0 for view in views if view.unit not in waking and counts(view.unit))


def _yet_to_take(holders: Sequence[str], held: Mapping[str, Lease], views: Mapping[str, UnitView], total: int,
                 taken: Mapping[str, int]) -> int | None:
    """What the holders have yet to take of the device, when every one runs with an absolute KV budget and
    its footprint is known; None otherwise (the start then waits for them in order)."""
    remaining = 0
    for name in holders:
        lease, view = held.get(name), views.get(name)
        latest = view.latest if view is not None else None
        if lease is not None and lease.wake and lease.needed_bytes is not None:
            remaining += lease.needed_bytes  # all of it: what the engine took back so far is not told apart
            continue
        if lease is not None and lease.absolute_budget and lease.needed_bytes is not None:
            footprint = lease.needed_bytes
        elif (latest is not None and _is_current(latest, view) and latest.kv_cache_memory_bytes is not None
              and view.gpu_memory_utilization):
            footprint = memory_rules.requested_bytes(total, view.gpu_memory_utilization)
        else:
            return None
        remaining += max(0, footprint - taken.get(name, 0))
    return remaining


def _is_current(start: Start, view: UnitView) -> bool:
    """Whether the start is the unit's current one: a budget an earlier start printed is not this start's."""
    current = view.current
    return current is not None and (start.invocation_id, start.main_began_usec) == (current.invocation_id,
                                                                                    current.main_began_usec)


@dataclass(frozen=True)
class Figures:
    """The R and the KV budget a start is decided with, and why a budget stated for it is not believed."""

    gpu_memory_utilization: float | None
    kv_cache_memory_bytes: int | None  # believed: the start runs with it now (admission by the plan)
    unverified: str | None = None  # why the budget stated is not believed (the start then waits in order)


def figures_now(client_ratio: float | None, client_budget: int | None, plan_budget: int | None,
                plan_problem: str | None, overrides: Sequence[str], latest: Start | None,
                plan_ratio: float | None = None) -> Figures:
    """What a start is decided with (docs/gate.md, "By the plan"). The budget counts only when root's plan
    drop-in names it (`plan_budget`), no later drop-in replaces the plan's command (`overrides`), and neither
    the client (`client_budget`: the unit's own process, untrusted) nor the unit's latest printed start
    (`latest`) says otherwise; else the start waits in order. The client can so make its unit wait longer,
    never let it in earlier. R: the largest of the client's, the plan's (`plan_ratio`, what root's drop-in
    gives the client) and the latest start's (the larger asks for more free memory); by the plan only when
    they agree."""
    last_ratio = latest.effective_gpu_memory_utilization if latest is not None else None
    last_budget = latest.kv_cache_memory_bytes if latest is not None else None
    known = [ratio for ratio in (client_ratio, plan_ratio, last_ratio) if ratio is not None]
    ratio = max(known) if known else None
    stated = client_budget if client_budget is not None else plan_budget
    why = None
    if stated is None:
        if last_budget is not None:
            why = f"its latest start ran with {last_budget}, and no plan names one now"
    elif plan_budget is None:
        why = f"{stated} is stated, but no plan of root's names one ({plan_problem or 'no plan drop-in'})"
    elif overrides:
        why = f"a later drop-in replaces the plan's command ({', '.join(overrides)})"
    elif client_budget is not None and client_budget != plan_budget:
        why = f"the client says {client_budget}, the plan {plan_budget}"
    elif latest is not None and last_budget != plan_budget:
        why = f"the plan says {plan_budget}, its latest start ran with {last_budget or 'none'}"
    elif len(set(known)) > 1:
        why = f"its gpu_memory_utilization is not one: {_ratios(client_ratio, plan_ratio, last_ratio)}"
    else:
        return Figures(ratio, plan_budget)
    return Figures(ratio, None, why)


def _ratios(client: float | None, plan: float | None, latest: float | None) -> str:
    return ", ".join(f"{who} {ratio:g}" for who, ratio in (("the client", client), ("the plan", plan),
                                                            ("its latest start", latest)) if ratio is not None)
