"""Which systemd unit a process belongs to, from the text of its `/proc/PID/cgroup` file: pure functions.

`systemd_cgroup_path` picks the cgroup path systemd manages out of the file (cgroup v1, hybrid or v2);
`unit_of_cgroup_path` and `unit_cgroup_of_path` read the unit from that path the way systemd does; and
`unit_of_cgroup_file` does both. The sources read the files: `vllm_xpu_exporter.sources.procfs` other processes'
(`read_unit_cgroup`), the journal reader the exporter's own.

A container's cgroup also says which engine runs it, its id and, under Kubernetes, its pod's uid
(`container_of_cgroup_path`, `UnitCgroup.container`): a container's scope (the unit below the slices, for
the system's manager or a user's) or, outside any unit, its cgroupfs directory, as the container runtimes
name them (`vllm_xpu_exporter.runtimes.registry`: each runtime's `container_of_scope` and
`container_of_cgroupfs`, the first that names it wins). A container that systemd runs as a service (Podman's
quadlets: `/system.slice/x.service/libpod-payload-<id>`) is that service: the unit wins.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vllm_xpu_exporter.parsers.workloads import user_unit
from vllm_xpu_exporter.runtimes import ContainerCgroup
from vllm_xpu_exporter.runtimes.registry import RUNTIMES

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
        if container is None and uid and (container := _cgroupfs_container_below(elements, index)) is not None:
            index += 1
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
    """The container whose systemd scope `elements[index]` is, as the first runtime that names it says."""
    if not elements[index].endswith(".scope"):
        return None
    return next((found for runtime in RUNTIMES
                 if (found := runtime.facts.container_of_scope(elements, index)) is not None), None)


def _cgroupfs_container_below(elements: list[str], index: int) -> ContainerCgroup | None:
    """The container whose cgroupfs directory is the element right below `elements[index]`, a scope a runtime
    made for itself in a user's manager (rootless Podman with the cgroupfs manager:
    `user@N.service/user.slice/podman-<pid>.scope/<id>`), as the first runtime that names it says."""
    if index + 1 >= len(elements):
        return None
    return next((found for runtime in RUNTIMES
                 if (found := runtime.facts.container_of_cgroupfs(elements, index + 1)) is not None), None)


def _cgroupfs_container(elements: list[str]) -> tuple[int, ContainerCgroup] | None:
    """The first container directory of a cgroupfs path (outside any systemd unit), and its index."""
    for index in range(1, len(elements)):
        for runtime in RUNTIMES:
            found = runtime.facts.container_of_cgroupfs(elements, index)
            if found is not None:
                return index, found
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
