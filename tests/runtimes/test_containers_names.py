"""vllm_xpu_exporter.sources.containers: containers' names from the engines' state on disk (fixture directories as
Docker, Podman and the kubelet write them, tests/fakecontainers.py), and what a missing, unreadable, huge or
hostile file gives: no name, the cgroup leaf kept, never an exception."""

from __future__ import annotations

import json
import os

import pytest

from vllm_xpu_exporter.parsers.cgroup import unit_cgroup_of_path
from vllm_xpu_exporter.runtimes import ContainerCgroup
from vllm_xpu_exporter.runtimes.docker import ENGINE as DOCKER
from vllm_xpu_exporter.runtimes.docker import MAX_CONFIG_BYTES as MAX_DOCKER_CONFIG_BYTES
from vllm_xpu_exporter.runtimes.docker import docker_names
from vllm_xpu_exporter.runtimes.podman import MAX_LIST_BYTES as MAX_PODMAN_LIST_BYTES
from vllm_xpu_exporter.runtimes.podman import podman_names
from vllm_xpu_exporter.runtimes.pods import CONTAINERD, CRIO
from vllm_xpu_exporter.sources.containers import ContainerNames, Workload
from fakecontainers import (
    StateDirectories, container_id, docker_cgroupfs_path, docker_systemd_path, kubepods_cgroupfs_path,
    kubepods_systemd_path, pod_uid, podman_path, podman_rootless_path,
)

CID = container_id("chat")
CID2 = container_id("embedding")
UID = pod_uid("chat")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def state(tmp_path) -> StateDirectories:
    return StateDirectories(tmp_path)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def names(state, clock) -> ContainerNames:
    return ContainerNames(**state.names_kwargs(), clock=clock)


def workload_of(names: ContainerNames, path: str) -> Workload:
    unit_cgroup = unit_cgroup_of_path(path)
    assert unit_cgroup is not None
    return names.workload(unit_cgroup.unit, unit_cgroup.container)


def test_a_systemd_unit_keeps_its_name(names):
    assert workload_of(names, "/system.slice/vllm-xpu-chat.service") == Workload("vllm-xpu-chat.service", "systemd")
    assert workload_of(names, "/user.slice/user-1000.slice/session-3.scope") == Workload("session-3.scope")


@pytest.mark.parametrize("path", [docker_systemd_path(CID), docker_cgroupfs_path(CID),
                                  docker_cgroupfs_path(CID) + "/x"])
def test_docker_container_by_name_with_its_compose_project_and_service(names, state, path):
    state.add_compose(CID, "vllm", "chat")
    assert workload_of(names, path) == Workload("docker/vllm-chat-1", "docker", CID, "vllm-chat-1", "vllm", "chat")


def test_the_key_of_a_cgroup_path_is_its_workloads_unit(names, state):
    """`key_of_cgroup_path`: the whole way from a cgroup path to the `unit` label (for callers that have a path)."""
    state.add_docker(CID, "chat")
    assert names.key_of_cgroup_path(docker_systemd_path(CID)) == "docker/chat"
    assert names.key_of_cgroup_path(podman_path(CID)) == f"libpod-{CID}.scope"  # no names found: the leaf
    assert names.key_of_cgroup_path("/system.slice/vllm-xpu-chat.service/payload") == "vllm-xpu-chat.service"
    assert names.key_of_cgroup_path("/") is None


def test_docker_container_without_compose(names, state):
    state.add_docker(CID, "chat")
    assert workload_of(names, docker_systemd_path(CID)) == Workload("docker/chat", "docker", CID, "chat")


@pytest.mark.parametrize(("path", "key"), [(podman_path(CID), "podman/chat"),
                                           (podman_rootless_path(CID), "podman/chat@uid1000")])
def test_podman_container_by_name(names, state, path, key):
    """A rootless user's container has the user in its identity: never root's container of the same name."""
    state.add_podman(CID2, "embedding")
    listed = state.add_podman(CID, "chat")
    if key.endswith("@uid1000"):  # a rootless user's container: named by that user's own list
        os.chown(listed, 1000, 1000)
    assert workload_of(names, path) == Workload(key, "podman", CID, "chat")


PLAN = "io.vllm-xpu.plan.kv-cache-memory-bytes"


@pytest.mark.fast
@pytest.mark.parametrize(("value", "plan"), [("3481927680", 3481927680), ("0", None), ("-5", None), ("1e9", None),
                                             ("9" * 21, None), ("", None)])
def test_a_docker_containers_plan_is_its_label_as_dockerd_recorded_it(names, state, value, plan):
    """The planner's label among Config.Labels of config.v2.json: a positive byte count, else no plan."""
    state.add_docker(CID, "chat", labels={PLAN: value})
    assert workload_of(names, docker_systemd_path(CID)).plan_kv_cache_bytes == plan


@pytest.mark.fast
def test_a_podman_containers_plan_is_its_annotation_in_the_oci_config_its_user_owns(names, state):
    """Podman keeps labels in its database: the plan is the annotation in the container's OCI config.json,
    believed only from the container's own user (a config of another user's is no plan)."""
    state.add_podman(CID, "chat")
    config = state.add_podman_annotations(CID, {PLAN: "3481927680"})
    assert workload_of(names, podman_path(CID)).plan_kv_cache_bytes == 3481927680
    os.chown(config, 1000, 1000)
    assert ContainerNames(**state.names_kwargs()).workload(
        f"libpod-{CID}.scope", ContainerCgroup("podman", CID)).plan_kv_cache_bytes is None


def test_roots_podman_container_has_the_command_its_oci_config_runs(state, clock):
    """`recorded_command` of root's Podman container: its OCI config.json's process.args, as Podman wrote them;
    a config that is not root's gives none."""
    state.add_podman(CID, "chat")
    config = state.add_podman_annotations(CID, {})
    container = ContainerCgroup("podman", CID)
    assert ContainerNames(**state.names_kwargs(), clock=clock).recorded_command(container) == ("vllm", "serve", "m")
    os.chown(config, 1000, 1000)
    assert ContainerNames(**state.names_kwargs(), clock=clock).recorded_command(container) == ()


def test_a_docker_config_names_only_its_owners_container(state, clock, tmp_path):
    """A rootless user's Docker data root holding a config.v2.json for root's container's id names it not;
    the user's own container is named from the user's own file, with the user in its identity."""
    users = tmp_path / "home/alice/.local/share/docker"
    for cid, name in ((CID, "vllm-xpu-chat"), (CID2, "mine")):
        config = users / "containers" / cid / "config.v2.json"
        config.parent.mkdir(parents=True)
        config.write_text(json.dumps({"ID": cid, "Name": f"/{name}"}))
        os.chown(config, 1000, 1000)
    kwargs = state.names_kwargs() | {"docker_roots": (str(users), str(state.docker))}
    names = ContainerNames(**kwargs, clock=clock)
    assert workload_of(names, docker_systemd_path(CID)).unit == f"docker-{CID}.scope"
    rootless = f"/user.slice/user-1000.slice/user@1000.service/user.slice/docker-{CID2}.scope"
    assert workload_of(names, rootless).unit == "docker/mine@uid1000"


def test_a_list_names_only_its_owners_containers(state, clock, tmp_path):
    """A rootless user's containers.json may list any id: it names none of root's containers, and root's list
    none of a user's (each keeps its cgroup leaf)."""
    users = tmp_path / "home/alice/.local/share/containers/storage"
    os.chown(state.add_podman(CID, "vllm-xpu-chat", storage=users), 1000, 1000)  # root's container's id
    state.add_podman(CID2, "vllm-xpu-embedding")  # root's list naming a user's container
    kwargs = state.names_kwargs() | {"podman_storages": (str(users), str(state.podman))}
    names = ContainerNames(**kwargs, clock=clock)
    assert workload_of(names, podman_path(CID)).unit == f"libpod-{CID}.scope"
    assert workload_of(names, podman_rootless_path(CID2)).unit == f"libpod-{CID2}.scope@uid1000"


def test_podman_volatile_list_and_a_second_storage(state, clock, tmp_path):
    rootless = tmp_path / "home/alice/.local/share/containers/storage"
    state.add_podman(CID, "chat", volatile=True)
    os.chown(state.add_podman(CID2, "embedding", storage=rootless), 1000, 1000)
    kwargs = state.names_kwargs() | {"podman_storages": (str(state.podman), str(rootless))}
    names = ContainerNames(**kwargs, clock=clock)
    assert workload_of(names, podman_path(CID)).unit == "podman/chat"
    assert workload_of(names, podman_rootless_path(CID2)).unit == "podman/embedding@uid1000"


@pytest.mark.parametrize("path, runtime", [
    (kubepods_systemd_path(UID, CID), CONTAINERD),
    (kubepods_systemd_path(UID, CID, "crio", qos=None), CRIO),
    (kubepods_systemd_path(UID, CID, "docker", qos="besteffort"), DOCKER),
    (kubepods_cgroupfs_path(UID, CID), CONTAINERD),
    (kubepods_cgroupfs_path(UID, CID, crio=True, qos=None), CRIO),
])
def test_pod_container_from_the_kubelets_log_symlink(names, state, path, runtime):
    assert unit_cgroup_of_path(path).container.engine == runtime
    state.add_pod_container("inference", "vllm-chat-7d9f", UID, "vllm", CID)
    state.add_pod_container("inference", "vllm-chat-7d9f", UID, "proxy", CID2)
    assert workload_of(names, path) == Workload("k8s/inference/vllm-chat-7d9f/vllm", "k8s", CID, "vllm",
                                                namespace="inference", pod="vllm-chat-7d9f", pod_uid=UID)


def test_pod_container_without_a_symlink_named_by_its_pods_only_container_directory(names, state):
    state.add_pod_container("inference", "chat-0", UID, "vllm", CID, link=False)
    assert workload_of(names, kubepods_systemd_path(UID, CID)) == Workload(
        "k8s/inference/chat-0/vllm", "k8s", CID, "vllm", namespace="inference", pod="chat-0", pod_uid=UID)


def test_pod_of_several_containers_without_a_symlink_keeps_the_leaf_and_names_the_pod(names, state):
    state.add_pod_container("inference", "chat-0", UID, "vllm", CID, link=False)
    state.add_pod_container("inference", "chat-0", UID, "proxy", CID2, link=False)
    assert workload_of(names, kubepods_systemd_path(UID, CID)) == Workload(
        f"cri-containerd-{CID}.scope", "k8s", CID, namespace="inference", pod="chat-0", pod_uid=UID)


def test_a_symlink_of_another_pods_uid_is_not_believed(names, state):
    state.add_pod_container("inference", "chat-0", pod_uid("other"), "vllm", CID)
    assert workload_of(names, kubepods_systemd_path(UID, CID)).unit == f"cri-containerd-{CID}.scope"


@pytest.mark.parametrize("path, leaf, kind", [
    (docker_systemd_path(CID), f"docker-{CID}.scope", "docker"),
    (docker_cgroupfs_path(CID), CID, "docker"),
    (podman_path(CID), f"libpod-{CID}.scope", "podman"),
    (kubepods_systemd_path(UID, CID), f"cri-containerd-{CID}.scope", "k8s"),
    (kubepods_cgroupfs_path(UID, CID), CID, "k8s"),
])
def test_nothing_on_disk_keeps_the_cgroup_leaf(names, path, leaf, kind):
    workload = workload_of(names, path)
    assert (workload.unit, workload.kind, workload.container_id, workload.container) == (leaf, kind, CID, "")


def test_missing_state_directories_give_no_names(tmp_path, clock):
    names = ContainerNames(docker_roots=(str(tmp_path / "no"),), podman_storages=(str(tmp_path / "no"),),
                           pod_logs=str(tmp_path / "no"), container_logs=str(tmp_path / "no"), clock=clock)
    for path in (docker_systemd_path(CID), podman_path(CID), kubepods_systemd_path(UID, CID)):
        assert "/" not in workload_of(names, path).unit


HOSTILE_CONFIGS = [
    b"",
    b"not json",
    b"[" * 100_000 + b"]" * 100_000,  # nesting deeper than the parser's recursion
    b'{"Name": "/' + b"9" * 5000 + b'"}',
    b'{"Name": 12}',
    b'{"Name": "/bad name"}',
    b'{"Name": "/a\\nb"}',
    b'{"Name": "/x\\"} 1 {y"}',
    b'{"Name": "/' + b"x" * 300 + b'"}',
    b'{"Name": ["/chat"]}',
    b'"just a string"',
    b'{"ID": "' + CID2.encode() + b'", "Name": "/chat"}',  # another container's file
    b'{"Name": "/chat", "Config": {"Labels": {"com.docker.compose.project": {"x": 1}}}}',
    b'\xff\xfe{"Name": "/chat"}',
    b'{"Name": "/chat", "Name": "/evil\\u0000"}',
]


@pytest.mark.parametrize("data", HOSTILE_CONFIGS, ids=range(len(HOSTILE_CONFIGS)))
def test_hostile_docker_config_never_raises_and_gives_no_bad_name(names, state, data):
    path = state.docker_config(CID)
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    workload = workload_of(names, docker_systemd_path(CID))
    assert workload.unit in (f"docker-{CID}.scope", "docker/chat")
    assert workload.compose_project == ""


def test_hostile_compose_labels_are_left_out(names, state):
    state.add_docker(CID, "chat", {"com.docker.compose.project": 'x"} evil{a="',
                                   "com.docker.compose.service": "a" * 300})
    assert workload_of(names, docker_systemd_path(CID)) == Workload("docker/chat", "docker", CID, "chat")


def test_a_huge_docker_config_is_not_read(names, state):
    state.add_docker(CID, "chat")
    path = state.docker_config(CID)
    with path.open("ab") as file:
        file.truncate(MAX_DOCKER_CONFIG_BYTES + 1)
    assert workload_of(names, docker_systemd_path(CID)).unit == f"docker-{CID}.scope"


def test_a_huge_podman_list_is_not_read(names, state):
    path = state.add_podman(CID, "chat")
    with path.open("ab") as file:
        file.truncate(MAX_PODMAN_LIST_BYTES + 1)
    assert workload_of(names, podman_path(CID)).unit == f"libpod-{CID}.scope"


@pytest.mark.parametrize("make", ["fifo", "directory", "dangling", "device"])
def test_a_config_that_is_no_regular_file_is_not_read(names, state, make):
    path = state.docker_config(CID)
    path.parent.mkdir(parents=True)
    if make == "fifo":
        os.mkfifo(path)
    elif make == "directory":
        path.mkdir()
    elif make == "dangling":
        path.symlink_to(state.base / "nowhere")
    else:
        path.symlink_to("/dev/zero")
    assert workload_of(names, docker_systemd_path(CID)).unit == f"docker-{CID}.scope"


@pytest.mark.parametrize("document", [
    {"id": CID, "names": ["bad name"]}, {"id": CID, "names": "chat"}, {"id": CID, "names": []},
    {"id": CID, "names": [7]}, {"id": CID.upper(), "names": ["chat"]}, {"id": 7, "names": ["chat"]}, "x", None,
])
def test_hostile_podman_entries_give_no_name(names, state, document):
    state.podman_list().write_text(json.dumps([document, {"id": CID2, "names": ["embedding"]}]))
    assert workload_of(names, podman_path(CID)).unit == f"libpod-{CID}.scope"
    assert workload_of(names, podman_path(CID2)).unit == "podman/embedding"


@pytest.mark.parametrize("link", [
    f"chat_inference_vllm-{CID}.log.bak", f"Chat_inference_vllm-{CID}.log", f"chat_in_ference_vllm-{CID}.log",
    f"chat_inference_-{CID}.log", f"chat_inference_vllm-{CID[:60]}.log", "chat_inference_vllm.log",
])
def test_log_symlinks_that_are_not_the_kubelets_give_no_name(names, state, link):
    (state.container_logs / link).symlink_to("/var/log/pods/x/y/0.log")
    assert workload_of(names, kubepods_systemd_path(UID, CID)).unit == f"cri-containerd-{CID}.scope"


def test_names_are_kept_until_refreshed_then_read_again(names, state, clock):
    state.add_docker(CID, "chat")
    assert workload_of(names, docker_systemd_path(CID)).unit == "docker/chat"
    state.add_docker(CID, "chat-renamed")  # docker rename
    assert workload_of(names, docker_systemd_path(CID)).unit == "docker/chat"
    clock.now += 61
    assert workload_of(names, docker_systemd_path(CID)).unit == "docker/chat-renamed"


def test_a_container_not_found_is_looked_up_again_after_the_refresh(names, state, clock):
    assert workload_of(names, podman_path(CID)).unit == f"libpod-{CID}.scope"
    state.add_podman(CID, "chat")
    clock.now += 61
    assert workload_of(names, podman_path(CID)).unit == "podman/chat"
    state.add_pod_container("inference", "chat-0", UID, "vllm", CID2)
    assert workload_of(names, kubepods_systemd_path(UID, CID2)).unit == "k8s/inference/chat-0/vllm"


def test_the_cache_is_bounded(state, clock):
    names = ContainerNames(**state.names_kwargs(), clock=clock, max_cached=3)
    for index in range(10):
        names.workload("x", ContainerCgroup(DOCKER, container_id(str(index))))
    assert len(names._cache) == 3


def test_unreadable_state_is_logged_once_and_gives_no_name(names, state, caplog, monkeypatch):
    state.add_docker(CID, "chat")
    real_open = os.open

    def denied(path, *args, **kwargs):
        if str(path).endswith("config.v2.json"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    caplog.set_level("INFO", logger="vllm_xpu_exporter.containers")
    for seed in ("a", "b", "c"):
        assert workload_of(names, docker_systemd_path(container_id(seed))).unit.startswith("docker-")
    assert len([r for r in caplog.records if "cannot read" in r.getMessage()]) == 1


def test_parsers_alone():
    assert docker_names(json.dumps({"ID": CID, "Name": "/chat"}).encode(), CID).key == "docker/chat"
    assert podman_names(json.dumps([{"id": CID, "names": ["a", "b"]}]).encode()) == {CID: "a"}
    assert podman_names(b"{}") == {}


def test_roots_docker_container_has_the_command_its_engine_recorded_a_rootless_ones_none(state, clock, tmp_path):
    """`recorded_command`: Config.Entrypoint then Config.Cmd of root's container, as dockerd wrote them at its
    creation (the gate's plan for a container); a rootless user's container, whose state that user writes, has
    none; a config whose command is not lists of strings gives none."""
    config = state.add_docker(CID, "chat")
    document = json.loads(config.read_text())
    document["Config"] |= {"Entrypoint": ["python3", "/gate/container_wait.py"],
                           "Cmd": ["--", "vllm", "serve", "--kv-cache-memory-bytes", "5"]}
    config.write_text(json.dumps(document))
    names = ContainerNames(**state.names_kwargs(), clock=clock)
    container = unit_cgroup_of_path(docker_systemd_path(CID)).container
    assert names.recorded_command(container) == ("python3", "/gate/container_wait.py", "--", "vllm", "serve",
                                                 "--kv-cache-memory-bytes", "5")
    users = tmp_path / "home/alice/.local/share/docker"
    mine = users / "containers" / CID2 / "config.v2.json"
    mine.parent.mkdir(parents=True)
    mine.write_text(json.dumps({**document, "ID": CID2, "Name": "/mine"}))
    os.chown(mine, 1000, 1000)
    names = ContainerNames(**state.names_kwargs() | {"docker_roots": (str(users),)}, clock=clock)
    rootless = f"/user.slice/user-1000.slice/user@1000.service/user.slice/docker-{CID2}.scope"
    assert workload_of(names, rootless).unit == "docker/mine@uid1000"
    assert names.recorded_command(unit_cgroup_of_path(rootless).container) == ()
    document["Config"]["Cmd"] = ["serve", 5]
    config.write_text(json.dumps(document))
    assert docker_names(config.read_bytes(), CID).command == ()
