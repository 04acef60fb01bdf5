"""vllm_xpu_exporter.parsers.cgroup: containers and pods' containers from the cgroup paths the engines and the kubelet
make (Docker's systemd and cgroupfs drivers, Podman rootful, rootless and cgroupfs, containerd, CRI-O and
dockershim under kubepods with either driver), and what is not a container (conmon, quadlet payloads)."""

from __future__ import annotations

import pytest

from vllm_xpu_exporter.parsers.cgroup import container_of_cgroup_path, unit_cgroup_of_path, unit_of_cgroup_file
from vllm_xpu_exporter.runtimes import ContainerCgroup
from vllm_xpu_exporter.runtimes.docker import ENGINE as DOCKER
from vllm_xpu_exporter.runtimes.podman import ENGINE as PODMAN
from vllm_xpu_exporter.runtimes.pods import CONTAINERD, CRIO
from fakeprocfs import hybrid_cgroup, v1_cgroup, v2_cgroup

pytestmark = pytest.mark.fast  # the pure core (pyproject.toml's markers; `pytest -m fast`)

ID = "4f2a9c0e3d1b5a6978c4e2f1a0b9d8c7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1"
ID2 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
UID = "7d3f2a1c-9b8e-4c6d-a5f4-3e2d1c0b9a87"
UID_ = UID.replace("-", "_")
STATIC_UID = "5a2e6b0f1c9d8e7a6b5c4d3e2f1a0b9c"  # a static pod's uid: the kubelet's hash of its manifest


@pytest.mark.parametrize(("path", "unit", "unit_path", "container"), [
    # Docker, systemd cgroup driver (the default with systemd and cgroup v2)
    (f"/system.slice/docker-{ID}.scope", f"docker-{ID}.scope", f"/system.slice/docker-{ID}.scope",
     ContainerCgroup(DOCKER, ID)),
    (f"/system.slice/docker-{ID}.scope/init", f"docker-{ID}.scope", f"/system.slice/docker-{ID}.scope",
     ContainerCgroup(DOCKER, ID)),
    # seen from a container with a cgroup namespace of its own (the exporter's own container)
    (f"/../../system.slice/docker-{ID}.scope", f"docker-{ID}.scope", f"/../../system.slice/docker-{ID}.scope",
     ContainerCgroup(DOCKER, ID)),
    # rootless Docker (systemd driver, in the user's manager)
    (f"/user.slice/user-1000.slice/user@1000.service/user.slice/docker-{ID}.scope", f"docker-{ID}.scope@uid1000",
     f"/user.slice/user-1000.slice/user@1000.service/user.slice/docker-{ID}.scope",
     ContainerCgroup(DOCKER, ID, uid=1000)),
    # Docker, cgroupfs driver; a process in a sub-cgroup of the container is the container's
    (f"/docker/{ID}", ID, f"/docker/{ID}", ContainerCgroup(DOCKER, ID)),
    (f"/docker/{ID}/payload", ID, f"/docker/{ID}", ContainerCgroup(DOCKER, ID)),
    # Podman, rootful, rootless, in a pod of its own, with its container's sub-cgroup, cgroupfs manager
    (f"/machine.slice/libpod-{ID}.scope", f"libpod-{ID}.scope", f"/machine.slice/libpod-{ID}.scope",
     ContainerCgroup(PODMAN, ID)),
    (f"/machine.slice/libpod-{ID}.scope/container", f"libpod-{ID}.scope", f"/machine.slice/libpod-{ID}.scope",
     ContainerCgroup(PODMAN, ID)),
    (f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope", f"libpod-{ID}.scope@uid1000",
     f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope",
     ContainerCgroup(PODMAN, ID, uid=1000)),
    (f"/machine.slice/machine-libpod_pod_{ID2}.slice/libpod-{ID}.scope", f"libpod-{ID}.scope",
     f"/machine.slice/machine-libpod_pod_{ID2}.slice/libpod-{ID}.scope", ContainerCgroup(PODMAN, ID)),
    (f"/libpod_parent/libpod-{ID}", f"libpod-{ID}", f"/libpod_parent/libpod-{ID}", ContainerCgroup(PODMAN, ID)),
    # a Podman pod's container (podman kube play, podman pod create), cgroupfs manager: below the pod's directory
    (f"/libpod_parent/{ID2}/libpod-{ID}", f"libpod-{ID}", f"/libpod_parent/{ID2}/libpod-{ID}",
     ContainerCgroup(PODMAN, ID)),
    # rootless Podman, cgroupfs manager (as real Podman 4.3 runs on a hybrid host): the container's cgroup is
    # its id, below the scope Podman made for itself in the user's manager (name=systemd hierarchy)
    (f"/user.slice/user-4711.slice/user@4711.service/user.slice/podman-242.scope/{ID}", f"{ID}@uid4711",
     f"/user.slice/user-4711.slice/user@4711.service/user.slice/podman-242.scope/{ID}",
     ContainerCgroup(PODMAN, ID, uid=4711)),
    # kubelet, systemd driver: burstable, besteffort, guaranteed (no QoS slice); containerd, CRI-O, dockershim
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope",
     f"cri-containerd-{ID}.scope",
     f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope",
     ContainerCgroup(CONTAINERD, ID, UID)),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{ID}.scope",
     f"crio-{ID}.scope",
     f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{ID}.scope",
     ContainerCgroup(CRIO, ID, UID)),
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope", f"cri-containerd-{ID}.scope",
     f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope", ContainerCgroup(CONTAINERD, ID, UID)),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{ID}.scope",
     f"docker-{ID}.scope",
     f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{ID}.scope",
     ContainerCgroup(DOCKER, ID, UID)),
    (f"/kubepods.slice/kubepods-pod{STATIC_UID}.slice/crio-{ID}.scope", f"crio-{ID}.scope",
     f"/kubepods.slice/kubepods-pod{STATIC_UID}.slice/crio-{ID}.scope", ContainerCgroup(CRIO, ID, STATIC_UID)),
    # kind and other nodes whose kubelet cgroup root is not the top
    (f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope", f"cri-containerd-{ID}.scope",
     f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope", ContainerCgroup(CONTAINERD, ID, UID)),
    # kubelet, cgroupfs driver: containerd (and dockershim) name the directory by the id, CRI-O crio-<id>
    (f"/kubepods/burstable/pod{UID}/{ID}", ID, f"/kubepods/burstable/pod{UID}/{ID}",
     ContainerCgroup(CONTAINERD, ID, UID)),
    (f"/kubepods/pod{UID}/{ID}", ID, f"/kubepods/pod{UID}/{ID}", ContainerCgroup(CONTAINERD, ID, UID)),
    (f"/kubepods/besteffort/pod{UID}/crio-{ID}", f"crio-{ID}", f"/kubepods/besteffort/pod{UID}/crio-{ID}",
     ContainerCgroup(CRIO, ID, UID)),
    (f"/kubepods/burstable/pod{UID}/{ID}/sub", ID, f"/kubepods/burstable/pod{UID}/{ID}",
     ContainerCgroup(CONTAINERD, ID, UID)),
], ids=lambda value: repr(value)[:80])
def test_containers_from_their_cgroup_paths(path, unit, unit_path, container):
    unit_cgroup = unit_cgroup_of_path(path)
    assert unit_cgroup is not None
    assert (unit_cgroup.unit, unit_cgroup.path, unit_cgroup.container) == (unit, unit_path, container)
    assert container_of_cgroup_path(path) == container
    # re-reading the unit's own cgroup path (what the scans keep) finds the same container
    assert container_of_cgroup_path(unit_path) == container


@pytest.mark.parametrize(("path", "unit"), [
    # conmon, Podman's and CRI-O's container monitor, holds no GPU and is not the container
    (f"/machine.slice/libpod-conmon-{ID}.scope", f"libpod-conmon-{ID}.scope"),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{ID}.scope",
     f"crio-conmon-{ID}.scope"),
    (f"/kubepods/burstable/pod{UID}/crio-conmon-{ID}", f"crio-conmon-{ID}"),
    # quadlet: Podman's container in a systemd service is that service (the unit wins)
    (f"/system.slice/vllm-chat.service/libpod-payload-{ID}", "vllm-chat.service"),
    (f"/system.slice/vllm-chat.service/libpod-{ID}.scope", "vllm-chat.service"),
    (f"/user.slice/user-1000.slice/user@1000.service/app.slice/vllm-chat.service/libpod-payload-{ID}",
     "vllm-chat.service@uid1000"),
    # a CRI runtime's scope outside any pod, ids that are not 64 hex digits, a pod without kubepods above
    (f"/system.slice/cri-containerd-{ID}.scope", f"cri-containerd-{ID}.scope"),
    (f"/system.slice/crio-{ID}.scope", f"crio-{ID}.scope"),
    ("/system.slice/docker-4f2a9c.scope", "docker-4f2a9c.scope"),
    (f"/system.slice/docker-{ID.upper()}.scope", f"docker-{ID.upper()}.scope"),
    (f"/system.slice/docker-{ID}0.scope", f"docker-{ID}0.scope"),
    ("/docker/4f2a9c", "4f2a9c"),
    ("/kubepods/burstable/pod1234/4f2a9c", "4f2a9c"),
    (f"/somewhere/pod{UID}/{ID}", ID),
    (f"/system.slice/docker-{ID}.service", f"docker-{ID}.service"),
    (f"/docker.slice/{ID}", ID),
    # Podman's own scope: the container's id below it, not the scope, is the container; not a user's manager
    ("/user.slice/user-4711.slice/user@4711.service/user.slice/podman-242.scope", "podman-242.scope@uid4711"),
    (f"/system.slice/podman-242.scope/{ID}", "podman-242.scope"),
    # plain units and sessions
    ("/system.slice/vllm-xpu-chat.service", "vllm-xpu-chat.service"),
    ("/user.slice/user-1000.slice/session-3.scope", "session-3.scope"),
    ("/system.slice/docker.service", "docker.service"),
], ids=lambda value: repr(value)[:80])
def test_no_container(path, unit):
    unit_cgroup = unit_cgroup_of_path(path)
    assert unit_cgroup is not None
    assert unit_cgroup.unit == unit
    assert unit_cgroup.container is None


@pytest.mark.parametrize("text", [v2_cgroup, v1_cgroup, hybrid_cgroup], ids=["v2", "v1", "hybrid"])
def test_container_scope_in_every_cgroup_file_layout(text):
    assert unit_of_cgroup_file(text(f"/system.slice/docker-{ID}.scope")) == f"docker-{ID}.scope"


def test_any_path_gives_a_unit_or_none_and_only_well_formed_containers():
    """Paths put together from the elements above, and from bytes no engine writes, never raise; a container
    found always has a 64-hex id, and a pod uid only under kubepods."""
    import random
    elements = ["system.slice", "user.slice", "user-1000.slice", "user@1000.service", "machine.slice", "docker",
                "kubepods", "kubepods.slice", "burstable", f"pod{UID}", f"kubepods-burstable-pod{UID_}.slice",
                f"docker-{ID}.scope", f"libpod-{ID}.scope", f"libpod-conmon-{ID}.scope", f"cri-containerd-{ID}.scope",
                f"crio-{ID}", ID, "libpod_parent", "..", ".", "", "x.service", "a\nb", "ä", "0::", ":"]
    rng = random.Random(22)
    for _ in range(5000):
        path = "/" + "/".join(rng.choice(elements) for _ in range(rng.randint(0, 7)))
        unit_cgroup = unit_cgroup_of_path(path)
        if unit_cgroup is not None and unit_cgroup.container is not None:
            assert unit_cgroup.container.id == ID
            assert unit_cgroup.container.pod_uid in (None, UID)
            assert unit_cgroup.container.pod_uid is None or "kubepods" in path
