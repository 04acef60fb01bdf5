"""The suite on several workers (pytest-xdist; tests/run runs two, `tests/run -n 0` none): tests that use
something of the whole host run one after another on one worker, the others wherever a worker is free.

Host-wide are the tests under real_systemd/ (each boots a systemd as PID 1 of private namespaces, with
cgroups, container engines and timed replayed engines that another boot beside them would slow) and any
test that takes a fixture of the whole host: `task_limit` (a pids cgroup of a fixed name) and the real
container engines (`engine_image`, `dockerd`, `podman`). `--dist loadgroup` sends the tests of one
`xdist_group` to one worker; conftest.py's collection hook calls group_host_wide."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

HOST_GROUP = "host"
HOST_FOLDERS = ("real_systemd/",)
HOST_FIXTURES = frozenset({"task_limit", "engine_image", "dockerd", "podman"})


def host_wide(nodeid: str, fixturenames: Iterable[str]) -> bool:
    path = nodeid.split("::", 1)[0]
    return any(f"/{folder}" in f"/{path}" for folder in HOST_FOLDERS) or not HOST_FIXTURES.isdisjoint(fixturenames)


def group_host_wide(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Puts the host-wide `items` in one xdist group (conftest.py's collection hook), where xdist runs."""
    if not config.pluginmanager.has_plugin("xdist"):
        return
    for item in items:
        if host_wide(item.nodeid, item.fixturenames):
            item.add_marker(pytest.mark.xdist_group(HOST_GROUP))
