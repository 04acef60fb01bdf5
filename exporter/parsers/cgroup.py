"""Which systemd unit a process belongs to, from the text of its `/proc/PID/cgroup` file: pure functions.

`systemd_cgroup_path` picks the cgroup path systemd manages out of the file (cgroup v1, hybrid or v2);
`unit_of_cgroup_path` and `unit_cgroup_of_path` read the unit from that path the way systemd does; and
`unit_of_cgroup_file` does both. The sources read the files: `vllm_xpu_exporter.sources.procfs` other processes'
(`read_unit_cgroup`), the journal reader the exporter's own.

A container's cgroup also says which engine runs it, its id and, under Kubernetes, its pod's uid
(`container_of_cgroup_path`, `UnitCgroup.container`): Docker with the systemd cgroup driver
(`/system.slice/docker-<id>.scope`) or cgroupfs (`/docker/<id>`), Podman (`/machine.slice/libpod-<id>.scope`,
rootless below `user@UID.service`, cgroupfs `/libpod_parent/libpod-<id>`, rootless cgroupfs
`user@UID.service/user.slice/podman-<pid>.scope/<id>`), and the containers of pods
(kubelet with the systemd driver: `/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice/
cri-containerd-<id>.scope`, `crio-<id>.scope` or `docker-<id>.scope`, no QoS slice for guaranteed pods;
cgroupfs: `/kubepods/<qos>/pod<uid>/<id>`). Conmon's scopes (`libpod-conmon-<id>.scope`,
`crio-conmon-<id>.scope`) are not the container. A container that systemd runs as a service (Podman's
quadlets: `/system.slice/x.service/libpod-payload-<id>`) is that service: the unit wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from vllm_xpu_exporter.parsers.workloads import user_unit

# Unit types whose cgroups hold processes. Slices only group other units, so a process's unit is never a slice.
PROCESS_UNIT_SUFFIXES = (".service", ".scope", ".socket", ".mount", ".swap")


def unit_of_cgroup_file(text: str) -> str | None:
    """The systemd unit named by the text of a `/proc/PID/cgroup` file."""
    path = systemd_cgroup_path(text)
    return None if path is None else unit_of_cgroup_path(path)


def systemd_cgroup_path(text: str) -> str | None:
    """The cgroup path systemd manages, from a `/proc/PID/cgroup` file: the `name=systemd` line (cgroup
    v1 and hybrid), else the unified `0::` line (v2). On a v1 host the kernel still prints `0::/`, so
    a `name=systemd` path wins unless it is the root."""
    named: str | None = None
    unified: str | None = None
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, colon, path = rest.partition(":")
        if not colon:
            continue
        if controllers == "name=systemd":
            named = path
        elif hierarchy == "0" and controllers == "":
            unified = path
    if named is not None and named.strip("/") != "":
        return named
    return unified if unified is not None else named


def unit_of_cgroup_path(path: str) -> str | None:
    """The systemd unit a process in cgroup `path` belongs to, the way systemd itself reads the path
    (`cg_path_get_unit`, `cg_path_get_user_unit`): slices are skipped, and the first element below
    them is the unit.

    - `/system.slice/vllm-xpu-chat.service` -> `vllm-xpu-chat.service`.
    - Sub-cgroups a unit creates below itself belong to it, whatever their names:
      `/system.slice/foo.service/payload` -> `foo.service`.
    - User units: the innermost unit, i.e. the one the user's manager runs, not `user@UID.service`, with
      the user in it (`vllm_xpu_exporter.parsers.workloads.user_unit`):
      `/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope` -> `x.scope@uid1000`. So a user
      unit is never the system unit of the same name, nor another user's, and the globs of system units
      (`vllm*.service`) do not match it.
    - Outside any unit (no unit name below the slices, e.g. `/docker/<id>`, a bare slice): the
      cgroup's last element, or a cgroupfs container's own directory when the process is below it
      (`/docker/<id>/sub` -> `<id>`). Login sessions are units: `.../user-1000.slice/session-3.scope`.
    - The root cgroup `/`: None.
    `..` elements (paths seen from inside another cgroup namespace) are skipped, and systemd's cgroup
    escaping (a leading `_`, as in `_cpu.service`) is undone.
    """
    unit_cgroup = unit_cgroup_of_path(path)
    return None if unit_cgroup is None else unit_cgroup.unit


# Container engines, as the cgroup names them.
DOCKER = "docker"
PODMAN = "podman"
CONTAINERD = "containerd"
CRIO = "crio"

_ID = r"([0-9a-f]{64})"
# A container's own cgroup element, by engine: systemd scopes, then cgroupfs leaves (Podman's, CRI-O's).
_CONTAINER_ELEMENTS = (
    (re.compile(rf"docker-{_ID}\.scope"), DOCKER),
    (re.compile(rf"libpod-{_ID}(?:\.scope)?"), PODMAN),
    (re.compile(rf"cri-containerd-{_ID}\.scope"), CONTAINERD),
    (re.compile(rf"crio-{_ID}(?:\.scope)?"), CRIO),
)
_BARE_ID = re.compile(_ID)
_PODMAN_SCOPE = re.compile(r"podman-[0-9]+\.scope")  # rootless Podman's own scope (cgroupfs manager)
# A pod's cgroup: kubepods[-<qos>]-pod<uid>.slice (systemd driver; `_` for the uid's `-`, and a prefix
# when the kubelet's cgroup root is not the top: kind's `kubelet-kubepods-...`), or pod<uid> (cgroupfs).
# Static pods' uids are a hash without dashes.
_POD_SLICE = re.compile(r"(?:[a-z0-9_.-]*-)?kubepods(?:-burstable|-besteffort)?-pod([0-9a-f][0-9a-f_]{0,63})\.slice")
_POD_DIRECTORY = re.compile(r"pod([0-9a-f][0-9a-f-]{0,63})")


@dataclass(frozen=True)
class ContainerCgroup:
    """A container as its cgroup names it: the `engine` that runs it (DOCKER, PODMAN, CONTAINERD, CRIO), its
    id (64 lower-case hex digits) and, for a pod's container, the pod's uid (as the API shows it: with `-`)."""

    engine: str
    id: str
    pod_uid: str | None = None
    uid: int = 0
    """The user whose service manager runs the container (rootless: below `user@<uid>.service`); 0: the system's."""


@dataclass(frozen=True)
class UnitCgroup:
    """A process's systemd unit (`unit_of_cgroup_path`) and the unit's own cgroup: `path` is the process's
    cgroup path cut after the unit's element (`/system.slice/foo.service/payload` ->
    `/system.slice/foo.service`), as /proc/PID/cgroup gives it, so relative to the reader's cgroup
    namespace: it begins with `..` elements when the process is outside that namespace. `container`: the
    container whose cgroup that is (its scope, or its cgroupfs directory), else None."""

    unit: str
    path: str
    container: ContainerCgroup | None = None


def unit_cgroup_of_path(path: str) -> UnitCgroup | None:
    """`unit_of_cgroup_path` with the unit's cgroup path (see `UnitCgroup`)."""
    elements = [element for element in path.strip().split("/") if element not in ("", ".")]
    ups = elements.count("..")
    if ups:
        elements = [element for element in elements if element != ".."]
    if not elements:
        return None
    container = None
    index = _first_unit(elements, 0)
    if index is None:
        found = _cgroupfs_container(elements)
        if found is None:
            index = len(elements) - 1  # outside any unit: the cgroup's last element
        else:
            index, container = found
        unit = elements[index]
    else:
        uid = 0
        if elements[index].startswith("user@") and elements[index].endswith(".service"):
            user_index = _first_unit(elements, index + 1)
            if user_index is not None:
                uid = _user_manager_uid(elements[index])
                index = user_index
        container = _container_scope(elements, index)
        if container is None and uid and (found := _rootless_cgroupfs_container(elements, index)) is not None:
            index, container = found
        unit = elements[index][1:] if elements[index].startswith("_") else elements[index]
        if uid:
            unit = user_unit(unit, uid)
            if container is not None:
                container = replace(container, uid=uid)
    return UnitCgroup(unit, "/" + "/".join([".."] * ups + elements[:index + 1]), container)


def _user_manager_uid(element: str) -> int:
    """N of `user@N.service` (0 when N is no number: then it is no user's manager)."""
    uid = element[len("user@"):-len(".service")]
    return int(uid) if uid.isdigit() and len(uid) <= 10 else 0


def container_of_cgroup_path(path: str) -> ContainerCgroup | None:
    """The container a process in cgroup `path` runs in (see the module's docstring), else None."""
    unit_cgroup = unit_cgroup_of_path(path)
    return None if unit_cgroup is None else unit_cgroup.container


def _container_scope(elements: list[str], index: int) -> ContainerCgroup | None:
    """The container whose systemd scope `elements[index]` is, with its pod's uid when the slice above is
    a pod's."""
    element = elements[index]
    if not element.endswith(".scope"):
        return None
    for pattern, engine in _CONTAINER_ELEMENTS:
        match = pattern.fullmatch(element)
        if match is not None:
            pod = _POD_SLICE.fullmatch(elements[index - 1]) if index > 0 else None
            pod_uid = None if pod is None else pod.group(1).replace("_", "-")
            if pod_uid is None and engine in (CONTAINERD, CRIO):
                return None  # CRI runtimes' containers are pods' containers
            return ContainerCgroup(engine, match.group(1), pod_uid)
    return None


def _rootless_cgroupfs_container(elements: list[str], index: int) -> tuple[int, ContainerCgroup] | None:
    """Rootless Podman with the cgroupfs manager (a cgroup v1 or hybrid host) runs a container in a cgroup named
    by its id below the scope Podman made for itself in the user's manager (`elements[index]`):
    `user@N.service/user.slice/podman-<pid>.scope/<id>`. The container's directory and its index."""
    if not _PODMAN_SCOPE.fullmatch(elements[index]) or index + 1 >= len(elements):
        return None
    match = _BARE_ID.fullmatch(elements[index + 1])
    return None if match is None else (index + 1, ContainerCgroup(PODMAN, match.group(1)))


def _cgroupfs_container(elements: list[str]) -> tuple[int, ContainerCgroup] | None:
    """The first container directory of a cgroupfs path (outside any systemd unit), and its index:
    `docker/<id>`, `libpod_parent/libpod-<id>`, `kubepods[/<qos>]/pod<uid>/<id>` (containerd, Docker) or
    `.../pod<uid>/crio-<id>` (CRI-O)."""
    for index in range(1, len(elements)):
        parent, element = elements[index - 1], elements[index]
        if parent == "docker" and (match := _BARE_ID.fullmatch(element)):
            return index, ContainerCgroup(DOCKER, match.group(1))
        if parent == "libpod_parent" and (match := _CONTAINER_ELEMENTS[1][0].fullmatch(element)):
            return index, ContainerCgroup(PODMAN, match.group(1))
        pod = _POD_DIRECTORY.fullmatch(parent)
        if pod is None or not any(e == "kubepods" or e.endswith("kubepods") for e in elements[:index - 1]):
            continue
        if match := _BARE_ID.fullmatch(element):
            return index, ContainerCgroup(CONTAINERD, match.group(1), pod.group(1))  # or dockershim: alike here
        if match := _CONTAINER_ELEMENTS[3][0].fullmatch(element):
            return index, ContainerCgroup(CRIO, match.group(1), pod.group(1))
    return None


def _first_unit(elements: list[str], start: int) -> int | None:
    """The index of the first element from `start` on after the leading slices, if it names a unit."""
    for index in range(start, len(elements)):
        element = elements[index]
        if element.endswith(".slice"):
            continue
        if element.endswith(PROCESS_UNIT_SUFFIXES):
            return index
        return None
    return None
