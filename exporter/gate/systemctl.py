"""What the init gate asks systemd (`systemctl show`): a unit's TimeoutStartSec=, its current invocation
id, and whether an invocation's processes are gone. Each answers None when systemctl cannot answer
(`current_invocation` then falls back to $INVOCATION_ID)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

from vllm_xpu_exporter.systemd import parse_timespan

SYSTEMCTL_TIMEOUT_S = 5.0
# systemd's states of a unit whose processes are gone.
UNIT_GONE_ACTIVE_STATES = frozenset({"inactive", "failed"})
UNIT_GONE_SUB_STATES = frozenset({"auto-restart", "dead", "failed"})


def systemctl_show(systemctl: str, unit: str, *properties: str) -> dict[str, str] | None:
    """`systemctl show -p ... unit` as a dict; None when systemctl cannot answer."""
    try:
        completed = subprocess.run([systemctl, "show", *(f"--property={name}" for name in properties), "--", unit],
                                   capture_output=True, text=True, timeout=SYSTEMCTL_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if completed.returncode != 0:
        return None
    values = dict(line.partition("=")[::2] for line in completed.stdout.splitlines() if "=" in line)
    return values if all(name in values for name in properties) else None


def unit_start_timeout(systemctl: str, unit: str) -> float | None:
    """The unit's TimeoutStartSec= in seconds (inf: none); None when systemctl cannot say."""
    shown = systemctl_show(systemctl, unit, "TimeoutStartUSec")
    if shown is None:
        return None
    try:
        return parse_timespan(shown["TimeoutStartUSec"])
    except ValueError:
        return None


def current_invocation(systemctl: str, unit: str, environ: Mapping[str, str] = os.environ) -> str:
    """The unit's current invocation id as systemd says it ('' when unknown). $INVOCATION_ID, which
    systemd sets for ExecStartPre= commands, only when systemctl cannot answer: an `EnvironmentFile=`
    of the unit can override it."""
    shown = systemctl_show(systemctl, unit, "InvocationID")
    if shown is not None and shown["InvocationID"]:
        return shown["InvocationID"]
    return environ.get("INVOCATION_ID", "").strip()


def unit_gone(systemctl: str, unit: str, invocation_id: str) -> bool | None:
    """Whether that invocation of the unit has no process any more per systemd (stopped, failed, waiting
    to restart, or a later invocation runs); None when systemctl cannot say."""
    shown = systemctl_show(systemctl, unit, "ActiveState", "SubState", "InvocationID")
    if shown is None:
        return None
    if invocation_id and shown["InvocationID"] and shown["InvocationID"] != invocation_id:
        return True
    return shown["ActiveState"] in UNIT_GONE_ACTIVE_STATES or shown["SubState"] in UNIT_GONE_SUB_STATES
