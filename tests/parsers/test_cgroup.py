"""vllm_xpu_exporter.parsers.cgroup: the systemd unit of a process from its `/proc/PID/cgroup` text (cgroup v1,
hybrid and v2 files as tests/fakeprocfs.py writes them), and the unit's cgroup path."""

from __future__ import annotations

import pytest

from vllm_xpu_exporter.parsers.cgroup import systemd_cgroup_path, unit_cgroup_of_path, unit_of_cgroup_file, unit_of_cgroup_path
from fakeprocfs import hybrid_cgroup, v1_cgroup, v2_cgroup

CHAT = "/system.slice/vllm-xpu-chat.service"


@pytest.mark.parametrize(("path", "unit"), [
    ("/system.slice/vllm-xpu-chat.service", "vllm-xpu-chat.service"),
    ("/system.slice/vllm@chat.service", "vllm@chat.service"),
    ("/system.slice/foo.service/payload", "foo.service"),
    ("/system.slice/foo.service/payload/deeper", "foo.service"),
    ("/system.slice/foo.service/worker.scope", "foo.service"),
    ("/system.slice/foo.socket", "foo.socket"),
    ("/system.slice/system-vllm.slice/vllm@a.service", "vllm@a.service"),
    ("/user.slice/user-1000.slice/session-3.scope", "session-3.scope"),
    # a user's manager's units: the user in their identity, never the system unit of the same name
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope", "x.scope@uid1000"),
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service", "vllm.service@uid1000"),
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service/sub", "vllm.service@uid1000"),
    ("/user.slice/user-0.slice/user@0.service/app.slice/vllm.service", "vllm.service"),  # root's: as root's
    ("/user.slice/user-1000.slice/user@1000.service", "user@1000.service"),
    ("/user.slice/user-1000.slice/user@1000.service/not-a-unit", "user@1000.service"),
    ("/init.scope", "init.scope"),
    ("/machine.slice/libpod-4f2a.scope/container", "libpod-4f2a.scope"),
    ("/docker/4f2a9c", "4f2a9c"),
    ("/kubepods/burstable/pod1234/4f2a9c", "4f2a9c"),
    ("/user.slice", "user.slice"),
    ("/../../system.slice/vllm-xpu-chat.service", "vllm-xpu-chat.service"),
    ("/system.slice/_cpu.service", "cpu.service"),
    ("/", None),
    ("", None),
    ("/..", None),
], ids=lambda value: repr(value))
def test_unit_of_cgroup_path(path: str, unit: str | None):
    assert unit_of_cgroup_path(path) == unit


@pytest.mark.parametrize(("path", "unit", "unit_path"), [
    ("/system.slice/vllm-xpu-chat.service", "vllm-xpu-chat.service", "/system.slice/vllm-xpu-chat.service"),
    ("/system.slice/foo.service/payload/deeper", "foo.service", "/system.slice/foo.service"),
    ("/system.slice/system-vllm.slice/vllm@a.service", "vllm@a.service",
     "/system.slice/system-vllm.slice/vllm@a.service"),
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service/sub", "vllm.service@uid1000",
     "/user.slice/user-1000.slice/user@1000.service/app.slice/vllm.service"),
    ("/user.slice/user-1000.slice/user@1000.service/not-a-unit", "user@1000.service",
     "/user.slice/user-1000.slice/user@1000.service"),
    ("/docker/4f2a9c", "4f2a9c", "/docker/4f2a9c"),
    ("/../system.slice/vllm-xpu-chat.service", "vllm-xpu-chat.service", "/../system.slice/vllm-xpu-chat.service"),
    ("/../../system.slice/foo.service/payload", "foo.service", "/../../system.slice/foo.service"),
    ("//system.slice/./_cpu.service/", "cpu.service", "/system.slice/_cpu.service"),
], ids=lambda value: repr(value))
def test_unit_cgroup_is_the_path_cut_after_the_units_element_keeping_its_climb_out_of_the_namespace(
        path: str, unit: str, unit_path: str):
    unit_cgroup = unit_cgroup_of_path(path)
    assert unit_cgroup is not None
    assert (unit_cgroup.unit, unit_cgroup.path) == (unit, unit_path)
    assert unit_of_cgroup_path(path) == unit


@pytest.mark.parametrize(("text", "path"), [
    (v2_cgroup(CHAT), CHAT),
    (v1_cgroup(CHAT), CHAT),
    (hybrid_cgroup(CHAT), CHAT),
    ("1:name=systemd:/\n0::/system.slice/foo.service\n", "/system.slice/foo.service"),
    ("4:memory:/system.slice/foo.service\n", None),
    ("", None),
    ("garbage\n::\n", None),
    ("0::/\n", "/"),
], ids=["v2", "v1-prefers-name-systemd-over-0::/", "hybrid", "root-name-systemd-falls-back-to-unified",
        "controllers-only", "empty", "garbage", "root"])
def test_systemd_cgroup_path_prefers_name_systemd_then_unified(text: str, path: str | None):
    assert systemd_cgroup_path(text) == path


def test_unit_of_cgroup_file_on_v1_host_uses_name_systemd_line():
    assert unit_of_cgroup_file(v1_cgroup(CHAT)) == "vllm-xpu-chat.service"
    assert unit_of_cgroup_file(v2_cgroup("/")) is None
