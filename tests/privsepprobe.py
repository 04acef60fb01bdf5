"""What code running in a service's serving process can read of a root process, after the service's start-up
(`separate`: the privileged reader started, then the serving process's capabilities lowered, as the exporter's
and the gate's `main` do) or without it (`keep`: the service as it was, every capability kept).

    python3 tests/privsepprobe.py separate|keep TARGET_PID STACK_ADDRESS_HEX   # prints a JSON report

The report: `uid`; `environ`, `mem` (a pread of TARGET's stack through /proc/PID/mem) and `root_shadow`
(/proc/PID/root/etc/shadow), `perf_event_open` (an event on TARGET, which CAP_PERFMON alone allows, where
no system call filter denies it): "ok" or the errno's name; `caps`: the serving process's permitted set (hex);
`serving_lists_target_fds`: whether the serving process can walk TARGET's fd table; `serving_unreadable` and
`reader_unreadable`: how many processes' fd tables the serving process, and the privileged reader's scan, could
not walk.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import sys


def attempt(read) -> str:
    try:
        read()
    except OSError as error:
        return errno.errorcode.get(error.errno, str(error.errno))
    return "ok"


def read_stack(target: int, stack: int) -> None:
    fd = os.open(f"/proc/{target}/mem", os.O_RDONLY)
    try:
        if not os.pread(fd, 64, stack):
            raise OSError(errno.EIO, "nothing read")
    finally:
        os.close(fd)


def main() -> None:
    mode, target = sys.argv[1], int(sys.argv[2])
    stack = int(sys.argv[3], 16)
    from vllm_xpu_exporter import capabilities
    from vllm_xpu_exporter.sources import procfs
    from vllm_xpu_exporter.sources.privileged import PrivilegedReader, separate_privileges
    from seccompprobe import perf_event_open  # this script's directory is first on sys.path

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long

    if mode == "separate":
        reader, error = separate_privileges("/proc", full_scans=True)  # executes this probe again, separated
        if error is not None or reader is None:
            raise SystemExit(error or "nothing to separate: run the probe with the reader's capabilities, not as root")
    else:
        reader = PrivilegedReader("/proc", full_scans=True)
        reader.start()
    own = procfs._Scan("/proc")  # the serving process's own walk of every fd table
    for pid in procfs.list_pids("/proc"):
        own.drm_fds_of(pid)
    report = {
        "uid": os.getuid(),
        "caps": format(sum(1 << bit for bit in capabilities.permitted()), "x"),
        "environ": attempt(lambda: open(f"/proc/{target}/environ", "rb").read()),
        "mem": attempt(lambda: read_stack(target, stack)),
        "root_shadow": attempt(lambda: open(f"/proc/{target}/root/etc/shadow", "rb").read()),
        "perf_event_open": perf_event_open(libc.syscall, target),
        "serving_lists_target_fds": target not in own.unreadable,
    }
    report["serving_unreadable"] = len(own.unreadable)
    report["reader_unreadable"] = reader.scan().unreadable
    reader.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
