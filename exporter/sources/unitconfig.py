"""The KV budget vllm-xpu-plan's drop-in gives each watched unit, as systemd has the unit loaded.

The planner's drop-in (`zz-vllm-xpu-plan.conf`) restates the unit's command with `--kv-cache-memory-bytes N`
and sets `LogExtraFields=VLLM_XPU_PLAN_KV_CACHE_MEMORY_BYTES=N` beside it. A later drop-in or an edit that
replaces `ExecStart=` takes the command away from the plan, but leaves that list setting unless it resets it too:
so the unit's `LogExtraFields` property says what the plan gives it, and the budget its latest start printed
says what it runs with (`XpuUnitPlanNotApplied`).

Who may say so: only whoever writes the unit's configuration (root, or the NixOS module). It is read from
systemd, over its bus, with `systemctl show --property=Id,LogExtraFields` (readable by any user): systemd
answers from the configuration it loaded, nothing the unit's processes print reaches it. The same field on
the unit's own journal entries is never read: journald adds it to them, but any process may also write a
field of that name itself. systemd 252 adds no LogExtraFields to its own records about the unit ("Started
..."), and its per-unit state file for journald (`/run/systemd/units/log-extra-fields:UNIT`) is not rewritten
at a restart, so neither can stand in for the property.

After `daemon-reload` the property is the new configuration's even before the unit restarts: a plan written
and loaded but not yet started shows as not applied, which it is.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable

PLAN_FIELD = "VLLM_XPU_PLAN_KV_CACHE_MEMORY_BYTES"
"""The field of the plan's `LogExtraFields=`: the budget in bytes, a decimal integer."""
SYSTEMD_RUNNING = "/run/systemd/system"
"""Exists while systemd runs the host (sd_booted(3))."""
SHOW_TIMEOUT_S = 5.0
MAX_BUDGET_DIGITS = 20


class UnitConfigError(OSError):
    """systemctl could not say (not found, timed out, failed)."""


def systemd_runs_host(marker: str = SYSTEMD_RUNNING) -> bool:
    return os.path.isdir(marker)


def parse_show(text: str) -> dict[str, int]:
    """unit -> the plan's budget, from `systemctl show --property=Id,LogExtraFields UNIT...` (one block per
    unit, blocks apart by an empty line, one `LogExtraFields=` line per field). A unit whose fields hold no
    well-formed budget has none; where several drop-ins set it, the last one applied wins."""
    plans: dict[str, int] = {}
    prefix = f"LogExtraFields={PLAN_FIELD}="
    for block in text.split("\n\n"):
        unit, budget = None, None
        for line in block.splitlines():
            if line.startswith("Id="):
                unit = line[3:]
            elif line.startswith(prefix):
                value = line[len(prefix):]
                if value.isascii() and value.isdigit() and len(value) <= MAX_BUDGET_DIGITS and int(value) > 0:
                    budget = int(value)
        if unit and budget is not None:
            plans[unit] = budget
    return plans


class UnitPlans:
    """Reads the plan's budget of units from systemd (`plans`), with the systemctl at `systemctl`."""

    def __init__(self, systemctl: str) -> None:
        self.systemctl = systemctl

    def plans(self, units: Iterable[str]) -> dict[str, int]:
        """unit -> the budget its loaded configuration's plan gives it; units without a plan are absent.
        Raises UnitConfigError when systemctl cannot answer."""
        names = sorted(set(units))
        if not names:
            return {}
        try:
            completed = subprocess.run([self.systemctl, "show", "--property=Id,LogExtraFields", "--", *names],
                                       capture_output=True, text=True, timeout=SHOW_TIMEOUT_S, check=False,
                                       stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as error:
            raise UnitConfigError(f"{self.systemctl} show: {error}") from error
        if completed.returncode != 0:
            said = " ".join(completed.stderr.split())[:200]
            raise UnitConfigError(f"{self.systemctl} show exited {completed.returncode}: {said}")
        return parse_show(completed.stdout)
