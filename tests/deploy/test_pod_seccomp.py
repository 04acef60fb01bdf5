"""The DaemonSet's pod can read the fdinfo the exporter needs but cannot attach to, or read the memory of, a
root process: a probe run here with the pod's uid (10447) and the capabilities the DaemonSet grants
(PERFMON, SYS_PTRACE, DAC_READ_SEARCH), under the shipped Localhost seccomp profile
(deploy/kubernetes/seccomp-vllm-xpu-exporter.json, applied with libseccomp as a runtime applies it),
fails PTRACE_ATTACH, process_vm_readv and perf_event_open on a root process and still reads its /proc/PID/fdinfo and fd
links; without the profile the same probe attaches (the capabilities alone would allow it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "deploy/kubernetes/seccomp-vllm-xpu-exporter.json"
PROBE = Path(__file__).resolve().parents[1] / "seccompprobe.py"
POD_UID = 10447
POD_CAPABILITIES = "+perfmon,+sys_ptrace,+dac_read_search"
PYTHON = "/usr/bin/python3"  # the probe needs the standard library only; a venv's may be in /root


def probe(target: int, profile: str) -> dict:
    argv = ["setpriv", f"--reuid={POD_UID}", f"--regid={POD_UID}", "--clear-groups",
            f"--inh-caps={POD_CAPABILITIES}", f"--ambient-caps={POD_CAPABILITIES}",
            PYTHON, "-c", PROBE.read_text(), profile, str(target)]
    completed = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd="/")
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


@pytest.fixture
def root_process(tmp_path):
    """A root process holding open files, as a vLLM unit holds its DRM fds."""
    if os.geteuid() != 0:
        pytest.fail("the probe needs root to take the pod's uid (tests/run runs as root)")
    held = tmp_path / "held"
    held.write_text("x")
    with held.open() as file:
        process = subprocess.Popen(["sleep", "60"], stdin=file)
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


def test_without_the_profile_the_pods_capabilities_attach_to_a_root_process(root_process):
    report = probe(root_process, "-")
    assert report["uid"] == POD_UID
    assert report["attach"] == "ok" and report["vm_read"] == "ok" and report["perf_event_open"] == "ok"


def test_under_the_shipped_profile_the_pod_cannot_attach_and_still_reads_fdinfo(root_process):
    profile = json.loads(PROFILE.read_text())
    report = probe(root_process, json.dumps(profile))
    assert report["uid"] == POD_UID
    assert report["attach"] == "EPERM" and report["vm_read"] == "EPERM" and report["perf_event_open"] == "EPERM"
    assert report["fdinfo"] >= 3 and report["fd_links"] >= 3  # stdin, stdout, stderr at least


def test_the_profile_denies_what_sys_ptrace_and_dac_read_search_add_beyond_proc():
    profile = json.loads(PROFILE.read_text())
    denied = {name for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ERRNO" for name in rule["names"]}
    assert {"ptrace", "process_vm_readv", "process_vm_writev", "open_by_handle_at", "pidfd_getfd",
            "perf_event_open"} <= denied
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    assert not denied & {"openat", "read", "readlinkat", "getdents64", "ioctl", "capset"}
