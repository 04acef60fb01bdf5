"""The process's Linux capabilities: which it holds, and what it passes on through execve.

The packaged services start with CAP_PERFMON, CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH as ambient capabilities
(from their units' `AmbientCapabilities=`; in the pod, from the entry point). A process that is not root keeps
across execve only its ambient set (Python has no file capabilities), so capabilities are dropped without
capset(2), which the units' `SystemCallFilter=~@privileged` denies: lower them in the ambient set
(`lower_ambient`, a prctl), forbid new privileges (so that no setuid or file-capability program, like the pod's
entry point, can give them back), and execve. `vllm_xpu_exporter.sources.privileged` does that for the serving
process (all three, once its reader child is started), and the reader for the Level Zero children it starts
(CAP_PERFMON alone).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable

CAP_DAC_READ_SEARCH = 2
CAP_SYS_PTRACE = 19
CAP_PERFMON = 38
# What the privileged reader keeps: a process permitted neither has nothing to separate.
READER_CAPABILITIES = frozenset({CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE})
# What the serving process gives up, all to the reader: CAP_PERFMON goes on to the Level Zero children the reader
# starts (the devices' real free memory).
SEPARATED_CAPABILITIES = frozenset({CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE, CAP_PERFMON})

PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_LOWER = 3


class CapabilityError(Exception):
    """A capability could not be lowered."""


def held(status_path: str = "/proc/self/status") -> dict[str, frozenset[int]]:
    """The process's capability sets by their /proc name: CapInh, CapPrm, CapEff, CapBnd, CapAmb."""
    sets: dict[str, frozenset[int]] = {}
    with open(status_path, encoding="ascii", errors="replace") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name.startswith("Cap"):
                mask = int(value.strip(), 16)
                sets[name] = frozenset(bit for bit in range(64) if mask >> bit & 1)
    return sets


def permitted() -> frozenset[int]:
    return held().get("CapPrm", frozenset())


def lower_ambient(capabilities: Iterable[int]) -> None:
    """Lower `capabilities` in the ambient set and forbid new privileges: the next execve keeps none of them.
    Per thread, like every capability set: call it in the thread that execs (or between fork and exec)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in capabilities:
        if libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_LOWER, capability, 0, 0) != 0:
            raise CapabilityError(f"prctl(PR_CAP_AMBIENT_LOWER, {capability}): {os.strerror(ctypes.get_errno())}")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise CapabilityError(f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
