"""Container engines' state on disk, as Docker, Podman (containers/storage) and the kubelet write it, and the
cgroup paths of their containers, for the container names source (vllm_xpu_exporter.sources.containers).

    <docker root>/containers/<id>/config.v2.json     Docker (moby's container.Container, saved as JSON):
                                                     "ID", "Name" ("/<name>"), "Config": {"Labels": {...}}
    <podman storage>/overlay-containers/containers.json           containers/storage's list:
    <podman storage>/overlay-containers/volatile-containers.json  [{"id", "names": [...], "image", "layer", ...}]
    <pod logs>/<namespace>_<pod>_<uid>/<container>/<restarts>.log  the kubelet's pod log directories
    <container logs>/<pod>_<namespace>_<container>-<id>.log        its symlinks to them

`StateDirectories` makes all four under one directory; the cgroup path functions give each engine's and
driver's cgroup of a container, for tests/fakeprocfs.py's processes.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from pathlib import Path


def container_id(seed: str) -> str:
    """A 64-hex container id, the same for the same seed."""
    return hashlib.sha256(seed.encode()).hexdigest()


def pod_uid(seed: str) -> str:
    """A pod uid (a UUID), the same for the same seed."""
    return str(uuid.UUID(hashlib.md5(seed.encode()).hexdigest()))  # noqa: S324 (a fixture's name, not security)


# cgroup paths, by engine and driver
def docker_systemd_path(cid: str) -> str:
    return f"/system.slice/docker-{cid}.scope"


def docker_cgroupfs_path(cid: str) -> str:
    return f"/docker/{cid}"


def podman_path(cid: str) -> str:
    return f"/machine.slice/libpod-{cid}.scope/container"


def podman_rootless_path(cid: str, uid: int = 1000) -> str:
    return f"/user.slice/user-{uid}.slice/user@{uid}.service/user.slice/libpod-{cid}.scope"


def podman_conmon_path(cid: str) -> str:
    return f"/machine.slice/libpod-conmon-{cid}.scope"


def kubepods_systemd_path(uid: str, cid: str, runtime: str = "cri-containerd", qos: str | None = "burstable") -> str:
    """The kubelet's systemd cgroup driver: `runtime` cri-containerd, crio or docker (dockershim); qos
    burstable, besteffort or None (guaranteed: no QoS slice)."""
    pod = f"pod{uid.replace('-', '_')}"
    if qos is None:
        return f"/kubepods.slice/kubepods-{pod}.slice/{runtime}-{cid}.scope"
    return f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-{pod}.slice/{runtime}-{cid}.scope"


def kubepods_cgroupfs_path(uid: str, cid: str, crio: bool = False, qos: str | None = "burstable") -> str:
    leaf = f"crio-{cid}" if crio else cid
    return f"/kubepods/{qos}/pod{uid}/{leaf}" if qos else f"/kubepods/pod{uid}/{leaf}"


@dataclass
class StateDirectories:
    """Docker's data root, a Podman storage, the kubelet's pod log directories and container log symlinks,
    under `base`; `flags` are the exporter's flags that point at them."""

    base: Path

    def __post_init__(self) -> None:
        self.docker = self.base / "var/lib/docker"
        self.podman = self.base / "var/lib/containers/storage"
        self.pods = self.base / "var/log/pods"
        self.container_logs = self.base / "var/log/containers"
        for directory in (self.docker / "containers", self.podman / "overlay-containers", self.pods,
                          self.container_logs):
            directory.mkdir(parents=True, exist_ok=True)

    @property
    def flags(self) -> list[str]:
        return ["--path.docker", str(self.docker), "--path.podman", str(self.podman), "--path.pods", str(self.pods),
                "--path.container-logs", str(self.container_logs)]

    def names_kwargs(self) -> dict:
        """ContainerNames' keyword arguments for these directories."""
        return {"docker_roots": (str(self.docker),), "podman_storages": (str(self.podman),),
                "pod_logs": str(self.pods), "container_logs": str(self.container_logs)}

    def docker_config(self, cid: str) -> Path:
        return self.docker / "containers" / cid / "config.v2.json"

    def add_docker(self, cid: str, name: str, labels: dict[str, str] | None = None) -> Path:
        """A Docker container's config.v2.json (the fields the exporter reads, among some it does not)."""
        path = self.docker_config(cid)
        path.parent.mkdir(parents=True, exist_ok=True)
        document = {"StreamConfig": {}, "State": {"Running": True, "Pid": 4242}, "ID": cid,
                    "Created": "2025-05-13T10:00:00.000000000Z", "Path": "python3",
                    "Args": ["-m", "vllm.entrypoints.openai.api_server"],
                    "Config": {"Hostname": cid[:12], "Env": ["PATH=/usr/bin"], "Image": "vllm/vllm-openai-xpu",
                               "Labels": labels or {}},
                    "Image": "sha256:" + container_id("image"), "Name": f"/{name}", "RestartCount": 0,
                    "Driver": "overlay2", "HostnamePath": f"/var/lib/docker/containers/{cid}/hostname"}
        path.write_text(json.dumps(document))
        return path

    def add_compose(self, cid: str, project: str, service: str, number: int = 1) -> Path:
        """A container Compose made: named <project>-<service>-<number>, with Compose's labels."""
        return self.add_docker(cid, f"{project}-{service}-{number}", {
            "com.docker.compose.project": project, "com.docker.compose.service": service,
            "com.docker.compose.container-number": str(number), "com.docker.compose.oneoff": "False"})

    def podman_list(self, volatile: bool = False) -> Path:
        name = "volatile-containers.json" if volatile else "containers.json"
        return self.podman / "overlay-containers" / name

    def add_podman(self, cid: str, name: str, volatile: bool = False, storage: Path | None = None) -> Path:
        """A container in containers/storage's list (of `storage`, default this Podman storage)."""
        path = (storage / "overlay-containers" / ("volatile-containers.json" if volatile else "containers.json")
                if storage is not None else self.podman_list(volatile))
        path.parent.mkdir(parents=True, exist_ok=True)
        containers = json.loads(path.read_text()) if path.exists() else []
        containers.append({"id": cid, "names": [name], "image": container_id("image"), "layer": container_id(cid),
                           "metadata": json.dumps({"image-name": "quay.io/vllm/xpu:latest", "name": name}),
                           "created": "2025-05-13T10:00:00.000000000Z", "flags": {"MountLabel": ""}})
        path.write_text(json.dumps(containers))
        return path

    def add_podman_annotations(self, cid: str, annotations: dict[str, str]) -> Path:
        """The container's OCI config.json as Podman writes it (userdata/, its process and its annotations)."""
        path = self.podman_list(False).parent / cid / "userdata" / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"ociVersion": "1.0.2-dev", "process": {"args": ["vllm", "serve", "m"]},
                                    "annotations": {"io.container.manager": "libpod", **annotations}}))
        return path

    def add_pod_container(self, namespace: str, pod: str, uid: str, container: str, cid: str, restarts: int = 0,
                          link: bool = True) -> Path:
        """A pod's container as the kubelet logs it: its log directory and file, and (`link`) the symlink
        to it named by the container's id."""
        directory = self.pods / f"{namespace}_{pod}_{uid}" / container
        directory.mkdir(parents=True, exist_ok=True)
        log = directory / f"{restarts}.log"
        log.touch()
        if link:
            # the kubelet's symlink points at the host's path, which need not exist where the exporter runs
            (self.container_logs / f"{pod}_{namespace}_{container}-{cid}.log").symlink_to(
                f"/var/log/pods/{namespace}_{pod}_{uid}/{container}/{restarts}.log")
        return log
