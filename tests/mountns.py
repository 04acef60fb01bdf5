"""A process in a mount namespace of its own, with a tmpfs over one directory: the same path names two
directories, the host's and the namespace's (reached from the host as /proc/PID/root/PATH)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

READY = "mounted"


@contextmanager
def tmpfs_in_own_mount_namespace(directory: Path) -> Iterator[int]:
    """The PID of a process (`unshare --mount`, root's) that sees an empty root-owned tmpfs (mode 755) at
    `directory`; the host's `directory` stays as it is. Killed on leaving."""
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed")
    script = f'mount -t tmpfs -o mode=755 vllm-xpu-test "$1" && echo {READY} && exec sleep 600'
    process = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                                str(directory)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        if line != READY:
            process.kill()
            pytest.fail(f"no tmpfs in a mount namespace of its own: {process.communicate()[1].strip()}")
        yield process.pid
    finally:
        process.kill()
        process.wait()
