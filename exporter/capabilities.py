"""The process's Linux capabilities: which it holds, and lowering them for good.

The packaged services start with CAP_PERFMON, CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (ambient, from their
units; in the pod, from the DaemonSet). CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH are for the privileged
reader (`vllm_xpu_exporter.sources.privileged`), a child that inherits them; the process that faces the
network or the gate's socket then lowers its own (`keep_only`), so that no code running in it can read
another process's memory, environment or root directory. It keeps CAP_PERFMON alone, for the Level Zero
child it starts (again after a hang or a GPU change), which needs it for the devices' real free memory.

Capabilities are per thread: `keep_only` must run while the process has one thread, and refuses otherwise.
capset(2) may always lower the effective, permitted and inheritable sets; the kernel then lowers the
ambient set to match; no_new_privs is set, so that no later execve (setuid or file capabilities) can raise
them again. The bounding set stays (lowering it needs CAP_SETPCAP); what is not permitted, with
no_new_privs, it cannot give back.
"""

from __future__ import annotations

import ctypes
import os

CAP_DAC_READ_SEARCH = 2
CAP_SYS_PTRACE = 19
CAP_PERFMON = 38
# What the privileged reader keeps: a process permitted neither has nothing to separate.
READER_CAPABILITIES = frozenset({CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE})
# What the serving process keeps, for the Level Zero child.
SERVING_CAPABILITIES = frozenset({CAP_PERFMON})

_LINUX_CAPABILITY_VERSION_3 = 0x20080522
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4


class CapabilityError(Exception):
    """The capabilities could not be dropped (more than one thread, or a call failed)."""


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


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


def keep_only(kept: frozenset[int], inherited: bool = False) -> None:
    """Keep only `kept` (which must be permitted) in the effective and permitted sets, and, when
    `inherited`, in the inheritable and ambient sets (what this process starts later inherits them; else
    those sets are cleared); set no_new_privs. Single-threaded processes only; raises CapabilityError when
    it cannot, or when other capabilities are left."""
    threads = os.listdir("/proc/self/task")
    if len(threads) != 1:
        raise CapabilityError(f"cannot drop capabilities with {len(threads)} threads running (they are per thread)")
    libc = ctypes.CDLL(None, use_errno=True)
    header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    for capability in kept:
        word, bit = divmod(capability, 32)
        data[word].effective |= 1 << bit
        data[word].permitted |= 1 << bit
        if inherited:
            data[word].inheritable |= 1 << bit
    # The kernel lowers every ambient capability that is not left both permitted and inheritable.
    if libc.capset(ctypes.byref(header), data) != 0:
        raise CapabilityError(f"capset: {os.strerror(ctypes.get_errno())}")
    if not inherited and libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        raise CapabilityError(f"prctl(PR_CAP_AMBIENT_CLEAR_ALL): {os.strerror(ctypes.get_errno())}")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise CapabilityError(f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
    allowed = {"CapPrm": kept, "CapEff": kept, "CapInh": kept if inherited else frozenset(),
               "CapAmb": kept if inherited else frozenset()}
    left = {name: sorted(held_now - allowed[name]) for name, held_now in held().items() if name in allowed}
    left = {name: caps for name, caps in left.items() if caps}
    if left:
        raise CapabilityError(f"capabilities left after dropping them: {left}")
