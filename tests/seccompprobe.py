"""Apply a seccomp profile of the OCI/Kubernetes JSON form (`defaultAction`, `syscalls[].names/action/errnoRet`)
to this process with libseccomp, as a container runtime does for a pod's Localhost profile; then probe what a
process with the exporter pod's uid and capabilities can do to a root process.

    python3 tests/seccompprobe.py PROFILE_JSON|- TARGET_PID   # prints a JSON report; - applies no profile

Run it with the pod's credentials, e.g. `setpriv --reuid=10447 --regid=10447 --clear-groups
--inh-caps=+perfmon,+sys_ptrace,+dac_read_search --ambient-caps=+perfmon,+sys_ptrace,+dac_read_search ...`.
The report: `attach` (PTRACE_ATTACH: "ok" or the errno's name), `vm_read` (process_vm_readv of the target's
stack), `perf_event_open` (a software event on the target), `fdinfo` (how many of the target's /proc/PID/fdinfo files could be read) and `fd_links` (how many of
its /proc/PID/fd links).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import sys

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_KILL_PROCESS = 0x80000000
PR_SET_NO_NEW_PRIVS = 38
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
SYS_PTRACE, SYS_PROCESS_VM_READV, SYS_PERF_EVENT_OPEN = 101, 310, 298  # x86_64
PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK = 1, 0
PERF_ATTR_SIZE = 128
PERF_ATTR_EXCLUDE_KERNEL_HV = (1 << 5) | (1 << 6)  # perf_event_attr's flags: exclude_kernel, exclude_hv


def _action(name: str, errno_ret: int) -> int:
    if name == "SCMP_ACT_ALLOW":
        return SCMP_ACT_ALLOW
    if name == "SCMP_ACT_ERRNO":
        return 0x00050000 | (errno_ret & 0xFFFF)
    if name in ("SCMP_ACT_KILL", "SCMP_ACT_KILL_THREAD"):
        return 0
    if name == "SCMP_ACT_KILL_PROCESS":
        return SCMP_ACT_KILL_PROCESS
    raise ValueError(f"unsupported action {name}")


def apply_profile(profile: dict) -> int:
    """Load the profile's filter for this process (and all it execs); the number of syscall rules added.
    Syscall names this libseccomp does not know are skipped, as runtimes skip them."""
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = (ctypes.c_uint32,)
    lib.seccomp_syscall_resolve_name.argtypes = (ctypes.c_char_p,)
    lib.seccomp_rule_add.argtypes = (ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint)
    lib.seccomp_load.argtypes = (ctypes.c_void_p,)
    context = lib.seccomp_init(_action(profile["defaultAction"], profile.get("defaultErrnoRet", errno.EPERM)))
    added = 0
    for rule in profile.get("syscalls", ()):
        action = _action(rule["action"], rule.get("errnoRet", errno.EPERM))
        for name in rule["names"]:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                continue
            if lib.seccomp_rule_add(context, action, number, 0) == 0:
                added += 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:  # needed to load a filter without CAP_SYS_ADMIN
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if lib.seccomp_load(context) != 0:
        raise OSError(ctypes.get_errno(), "seccomp_load")
    return added


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def perf_event_open(syscall, target: int) -> str:
    """A software event on the target (what sampling its registers and stack would start from): "ok" or the
    errno's name."""
    attr = (ctypes.c_uint8 * PERF_ATTR_SIZE)()
    fields = ctypes.cast(attr, ctypes.POINTER(ctypes.c_uint32))
    fields[0], fields[1] = PERF_TYPE_SOFTWARE, PERF_ATTR_SIZE  # type, size; config 0: CPU clock
    ctypes.cast(ctypes.byref(attr, 40), ctypes.POINTER(ctypes.c_uint64))[0] = PERF_ATTR_EXCLUDE_KERNEL_HV
    fd = syscall(SYS_PERF_EVENT_OPEN, ctypes.byref(attr), ctypes.c_long(target), ctypes.c_long(-1),
                 ctypes.c_long(-1), ctypes.c_ulong(0))
    if fd < 0:
        return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
    os.close(fd)
    return "ok"


def probe(target: int) -> dict[str, object]:
    libc = ctypes.CDLL(None, use_errno=True)
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    report: dict[str, object] = {"uid": os.getuid()}
    if syscall(SYS_PTRACE, ctypes.c_long(PTRACE_ATTACH), ctypes.c_long(target), None, None) == 0:
        report["attach"] = "ok"
        os.waitpid(target, getattr(os, "__WALL", 0x40000000))
        syscall(SYS_PTRACE, ctypes.c_long(PTRACE_DETACH), ctypes.c_long(target), None, None)
    else:
        report["attach"] = errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
    stack = next(line for line in open(f"/proc/{target}/maps") if line.rstrip().endswith("[stack]")) \
        if os.access(f"/proc/{target}/maps", os.R_OK) else None
    buffer = ctypes.create_string_buffer(64)
    local = _IoVec(ctypes.cast(buffer, ctypes.c_void_p), 64)
    address = int(stack.split("-")[0], 16) if stack else 0x400000
    remote = _IoVec(ctypes.c_void_p(address), 64)
    read = syscall(SYS_PROCESS_VM_READV, ctypes.c_long(target), ctypes.byref(local), ctypes.c_ulong(1),
                   ctypes.byref(remote), ctypes.c_ulong(1), ctypes.c_ulong(0))
    report["vm_read"] = "ok" if read > 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
    report["perf_event_open"] = perf_event_open(syscall, target)
    fdinfo = fd_links = 0
    for name in os.listdir(f"/proc/{target}/fdinfo"):
        try:
            with open(f"/proc/{target}/fdinfo/{name}") as file:
                fdinfo += bool(file.read())
            os.readlink(f"/proc/{target}/fd/{name}")
            fd_links += 1
        except OSError:
            continue
    report["fdinfo"], report["fd_links"] = fdinfo, fd_links
    return report


def main() -> None:
    profile, target = sys.argv[1], int(sys.argv[2])
    if profile != "-":
        apply_profile(json.loads(profile))
    print(json.dumps(probe(target)))


if __name__ == "__main__":
    main()
