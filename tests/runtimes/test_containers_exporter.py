"""Containers and pods as workloads, over the whole exporter: the seed host's three vLLM units and a desktop
session (tests/collectors/test_golden_host.py) hold the A770's memory through xe DRM clients, once as systemd units,
then as three Docker Compose containers (systemd and cgroupfs cgroup drivers), three Podman containers
(rootful and rootless), and three pods (containerd with the systemd driver, CRI-O with cgroupfs). The state
directories are written as the engines and the kubelet write them (tests/fakecontainers.py). Every case
gives the same per-workload memory, unattributed rest and engine counters as the systemd case, under the
names people know (`docker/vllm-chat-1`, `k8s/inference/vllm-chat-…/vllm`), with xpu_workload_info; a
missing or hostile state file keeps the cgroup leaf."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from exporterproc import RunningExporter
from fakecontainers import (
    StateDirectories, container_id, docker_cgroupfs_path, docker_systemd_path, kubepods_cgroupfs_path,
    kubepods_systemd_path, pod_uid, podman_conmon_path, podman_path, podman_rootless_path,
)
from fakeprocfs import FakeProcfs, xe_fdinfo
from fakeze import A770_TELEMETRY, B580_TELEMETRY, FakeConfig, fake_driver_env, write_config
from polling import wait_for
from scrapes import Samples, sample, series
from sizes import GiB, MiB

DEVICE = "0000:03:00.0"
TOTAL = 16 * GiB
UNATTRIBUTED = 512 * MiB
SESSION = "session-3.scope"
# the seed's units, by service name, and what each holds (tests/collectors/test_golden_host.py's HELD)
HELD = {"chat": 11 * GiB + 512 * MiB, "embedding": 1 * GiB, "stt": 1 * GiB}
SESSION_HELD = 256 * MiB
INFO = ("unit", "kind", "container_id", "container", "compose_project", "compose_service", "namespace", "pod",
        "pod_uid")


@dataclasses.dataclass
class Host:
    procfs: FakeProcfs
    state: StateDirectories
    # service -> (the unit label expected, the xpu_workload_info labels expected)
    expected: dict[str, tuple[str, dict[str, str]]]


def info(unit: str, kind: str, **labels: str) -> dict[str, str]:
    return {name: "" for name in INFO} | {"unit": unit, "kind": kind} | labels


def systemd(state: StateDirectories, service: str, cid: str) -> tuple[str, str, dict[str, str]]:
    unit = f"vllm-xpu-{service}.service"
    return f"/system.slice/{unit}", unit, info(unit, "systemd")


def compose(path_of: Callable[[str], str]) -> Callable:
    def make(state: StateDirectories, service: str, cid: str) -> tuple[str, str, dict[str, str]]:
        state.add_compose(cid, "vllm", service)
        name = f"vllm-{service}-1"
        return path_of(cid), f"docker/{name}", info(f"docker/{name}", "docker", container_id=cid, container=name,
                                                   compose_project="vllm", compose_service=service)
    return make


def podman(path_of: Callable[[str], str], uid: int = 0) -> Callable:
    """Root's Podman (`uid` 0), or user `uid`'s rootless one: the user's own list names its containers, and
    the user is part of their identity."""
    def make(state: StateDirectories, service: str, cid: str) -> tuple[str, str, dict[str, str]]:
        listed = state.add_podman(cid, f"vllm-{service}")
        os.chown(listed, uid, uid)
        key = f"podman/vllm-{service}" + (f"@uid{uid}" if uid else "")
        return path_of(cid), key, info(key, "podman", container_id=cid, container=f"vllm-{service}")
    return make


def pod(path_of: Callable[[str, str], str]) -> Callable:
    def make(state: StateDirectories, service: str, cid: str) -> tuple[str, str, dict[str, str]]:
        uid, name = pod_uid(service), f"vllm-{service}-5d8c7b9f4-x2x7q"
        state.add_pod_container("inference", name, uid, "vllm", cid)
        state.add_pod_container("inference", name, uid, "metrics-proxy", container_id(f"{service}-proxy"))
        key = f"k8s/inference/{name}/vllm"
        return path_of(uid, cid), key, info(key, "k8s", container_id=cid, container="vllm", namespace="inference",
                                            pod=name, pod_uid=uid)
    return make


ENGINES = {
    "systemd": systemd,
    "docker-systemd": compose(docker_systemd_path),
    "docker-cgroupfs": compose(docker_cgroupfs_path),
    "podman": podman(podman_path),
    "podman-rootless": podman(podman_rootless_path, uid=1000),
    "k8s-containerd-systemd": pod(lambda uid, cid: kubepods_systemd_path(uid, cid)),
    "k8s-crio-cgroupfs": pod(lambda uid, cid: kubepods_cgroupfs_path(uid, cid, crio=True, qos=None)),
}


def seed_host(base: Path, config_path: Path, engine: str) -> Host:
    """The seed host's memory, its units run by `engine`: each service's API and engine processes (the
    engine holding the DRM client), and for Podman its conmon (no GPU)."""
    procfs, state = FakeProcfs(base / "host"), StateDirectories(base / "state")
    expected = {}
    for index, (service, held) in enumerate(HELD.items()):
        cid = container_id(service)
        path, unit, labels = ENGINES[engine](state, service, cid)
        pid = 200 + 10 * index
        procfs.add_unit_process(pid, path)
        procfs.add_unit_process(pid + 1, path).add_drm_fd(xe_fdinfo(client_id=pid, vram0=held,
                                                                     cycles={"ccs": 1000 * (index + 1)}))
        if engine.startswith("podman"):
            procfs.add_unit_process(pid + 2, podman_conmon_path(cid))
        expected[service] = (unit, labels)
    procfs.add_unit_process(400, f"/user.slice/user-1000.slice/{SESSION}").add_drm_fd(
        xe_fdinfo(client_id=400, vram0=SESSION_HELD))
    used = sum(HELD.values()) + SESSION_HELD + UNATTRIBUTED
    a770 = dataclasses.replace(A770_TELEMETRY, processes=(), memory=(
        dataclasses.replace(A770_TELEMETRY.memory[0], size=TOTAL, free=TOTAL - used),))
    write_config(config_path, FakeConfig(devices=(a770, dataclasses.replace(B580_TELEMETRY, processes=()))))
    return Host(procfs, state, expected)


def scrape_host(host: Host, tmp_path: Path, fake_driver: Path, config_path: Path, *args: str) -> Samples:
    empty_sysfs = tmp_path / "sys"
    empty_sysfs.mkdir(exist_ok=True)
    with RunningExporter(["--path.procfs", str(host.procfs.root), "--path.sysfs", str(empty_sysfs),
                          "--no-collector.journal", *host.state.flags, *args],
                         env=fake_driver_env(fake_driver, config_path)) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and
                           sample(s, "xpu_exporter_collector_success", collector="processes") == 1 and
                           series(s, "xpu_unit_memory_bytes") and s, 30)
        assert samples, exporter.stderr
    return samples


def by_unit(samples: Samples, metric: str, **labels: str) -> dict[str, float]:
    return {dict(key)["unit"]: value for key, value in series(samples, metric).items()
            if all(dict(key).get(name) == wanted for name, wanted in labels.items())}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_the_seed_host_as_containers_and_pods_gives_the_systemd_figures_under_their_names(
        tmp_path, fake_driver, config_path, engine):
    host = seed_host(tmp_path, config_path, engine)
    samples = scrape_host(host, tmp_path, fake_driver, config_path)
    unit_of = {service: unit for service, (unit, _) in host.expected.items()}
    assert by_unit(samples, "xpu_unit_memory_bytes", device=DEVICE) == {
        **{unit_of[service]: held for service, held in HELD.items()}, SESSION: SESSION_HELD}
    assert sample(samples, "xpu_unattributed_memory_bytes", device=DEVICE) == UNATTRIBUTED
    assert by_unit(samples, "xpu_unit_engine_cycles_total", device=DEVICE, engine="ccs") == {
        **{unit_of[service]: 1000 * (index + 1) for index, service in enumerate(HELD)}, SESSION: 28257900}
    workloads = {labels for labels in series(samples, "xpu_workload_info")}
    assert workloads == {tuple(sorted(labels.items())) for _, labels in host.expected.values()} | {
        tuple(sorted(info(SESSION, "systemd").items()))}
    assert all(value == 1 for value in series(samples, "xpu_workload_info").values())


@pytest.mark.parametrize("spoil", ["missing", "hostile", "huge"])
def test_missing_or_hostile_state_keeps_the_cgroup_leaf(tmp_path, fake_driver, config_path, spoil):
    host = seed_host(tmp_path, config_path, "docker-systemd")
    chat = container_id("chat")
    config = host.state.docker_config(chat)
    if spoil == "missing":
        config.unlink()
    elif spoil == "hostile":
        config.write_text('{"ID": "%s", "Name": "/chat\\"} 1\\n# evil{x=\\"", "Config": {"Labels": '
                          '{"com.docker.compose.project": "[[[["}}}' % chat)
    else:
        config.write_bytes(b"[" * (4 << 20))
    samples = scrape_host(host, tmp_path, fake_driver, config_path)
    memory = by_unit(samples, "xpu_unit_memory_bytes", device=DEVICE)
    assert memory[f"docker-{chat}.scope"] == HELD["chat"]
    assert memory["docker/vllm-embedding-1"] == HELD["embedding"]
    assert info(f"docker-{chat}.scope", "docker", container_id=chat) in [
        dict(labels) for labels in series(samples, "xpu_workload_info")]


def test_the_info_series_follows_the_units_kept_by_max_units(tmp_path, fake_driver, config_path):
    host = seed_host(tmp_path, config_path, "k8s-containerd-systemd")
    samples = scrape_host(host, tmp_path, fake_driver, config_path, "--collector.processes.max-units", "2")
    kept = set(by_unit(samples, "xpu_unit_memory_bytes", device=DEVICE))
    assert kept == {host.expected["chat"][0], host.expected["embedding"][0]}  # the most memory; embedding < stt by name
    assert {dict(labels)["unit"] for labels in series(samples, "xpu_workload_info")} == kept
    assert sample(samples, "xpu_exporter_processes_units_dropped") == 2
