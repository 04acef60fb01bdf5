"""Podman's facts, pure: its cgroups, its key, its state file, its journald driver and its events of an end.

- Cgroups: `/machine.slice/libpod-<id>.scope` (`SCOPE`), a rootless user's below `user@UID.service`, with
  cgroupfs `/libpod_parent/libpod-<id>` (a pod's container: `/libpod_parent/<pod id>/libpod-<id>`). Conmon's
  scope (`libpod-conmon-<id>.scope`) is not the container's.
- Key: `podman/<name>` (`podman_key`), a rootless user's container `podman/<name>@uid<N>`.
- State: the containers/storage library's lists, `<storage>/<driver>-containers/containers.json` and
  `volatile-containers.json`: `[{"id": ..., "names": [...]}]` (`podman_names_of_file`), parsed one container at a
  time: the file's size bounds the CPU, MAX_ENTRY_BYTES and MAX_NAMES the memory.
- k8s-file logs: `<storage>/<driver>-containers/<id>/userdata/ctr.log` (`K8S_FILE_LOG`), the CRI log format.
- The plan and the command: the planner's `runtimes.PLAN_LABEL` among the annotations of the container's OCI
  configuration, `<storage>/<driver>-containers/<id>/userdata/config.json` (`OCI_CONFIG`, `podman_recorded`), and
  the command its process runs (`process.args`): Podman keeps labels in its database only, annotations also
  there.
- journald: conmon writes the container's lines (`CONTAINER_NAME`, `CONTAINER_ID_FULL`; one conmon a start, so
  its pid tells the runs apart); podman itself writes the events, among them `died` (`EXIT_EVENT`: the
  container's process ended), with its events logger `journald`, the default on systemd hosts
  (`SYSLOG_IDENTIFIER=podman`, `PODMAN_TYPE=container`, `PODMAN_NAME`, `PODMAN_ID`, `PODMAN_EXIT_CODE` unless 0).
  A record is believed only from a conmon or podman in a system directory (`conmon_uid`, `podman_uid`), as
  root (`podman/<name>`) or as a rootless user (`podman/<name>@uid<N>`: the user is part of the series'
  identity, so a user's conmon speaks only for that user's containers).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Sequence
from typing import IO

from vllm_xpu_exporter.parsers.workloads import user_suffix
from vllm_xpu_exporter.runtimes import (CONTAINER_ID, ID, PLAN_LABEL, ContainerCgroup, JournalDriver, JournalExitEvent,
                                        container_name_ok, plan_bytes, system_executable, uid_of)
from vllm_xpu_exporter.runtimes.files import json_array_items

KIND = "podman"
ENGINE = "podman"
SCOPE = re.compile(rf"libpod-{ID}(?:\.scope)?")
CGROUPFS_PARENT = "libpod_parent"
# Rootless Podman with the cgroupfs manager (a cgroup v1 or hybrid host): the container's directory, named by its
# id, is below the scope Podman made for itself in the user's manager (user@N.service/user.slice/podman-<pid>.scope)
ROOTLESS_CGROUPFS_PARENT = re.compile(r"podman-[0-9]+\.scope")

MAX_LIST_BYTES = 16 << 20
MAX_ENTRY_BYTES = 64 << 10
MAX_NAMES = 65536
LISTS = ("containers.json", "volatile-containers.json")
DRIVER_SUFFIX = "-containers"  # <driver>-containers directories of one storage (overlay, vfs, btrfs, ...)
K8S_FILE_LOG = "userdata/ctr.log"
"""A container's k8s-file log (CRI log format, written by conmon) in its `<driver>-containers/<id>` directory."""
OCI_CONFIG = "userdata/config.json"
"""The OCI runtime configuration Podman writes for a container (its `process.args`, its `annotations`: those of
`--annotation`), in its `<driver>-containers/<id>` directory."""
MAX_OCI_CONFIG_BYTES = 1 << 20  # ~10 KiB; parsed whole

PODMAN_DIRECTORIES = (b"/usr/libexec/podman/", b"/usr/lib/podman/")
REJECTED_PODMAN_EVENT = "podman_event"
"""A Podman ``died`` event of a watched container not written by podman."""


def container_of_scope(elements: Sequence[str], index: int) -> ContainerCgroup | None:
    match = SCOPE.fullmatch(elements[index])
    return None if match is None else ContainerCgroup(ENGINE, match.group(1))


def container_of_cgroupfs(elements: Sequence[str], index: int) -> ContainerCgroup | None:
    in_parent = elements[index - 1] == CGROUPFS_PARENT
    in_pod = index >= 2 and elements[index - 2] == CGROUPFS_PARENT and CONTAINER_ID.fullmatch(elements[index - 1])
    if (in_parent or in_pod) and (match := SCOPE.fullmatch(elements[index])):
        return ContainerCgroup(ENGINE, match.group(1))
    if ROOTLESS_CGROUPFS_PARENT.fullmatch(elements[index - 1]) and CONTAINER_ID.fullmatch(elements[index]):
        return ContainerCgroup(ENGINE, elements[index])
    return None


def names_container(container: ContainerCgroup) -> bool:
    return container.engine == ENGINE and container.pod_uid is None


def podman_key(name: str, uid: int = 0) -> str | None:
    """`podman/<name>` for a Podman container's name (root's), `podman/<name>@uid<N>` for one of user N's
    (rootless) Podman, or None when it is not a name Podman accepts."""
    if not isinstance(name, str):
        return None
    return f"{KIND}/{name}{user_suffix(uid)}" if container_name_ok(name) else None


def podman_names(data: bytes) -> dict[str, str]:
    """container id -> its first name, from a containers/storage `containers.json` (bytes)."""
    return podman_names_of_file(io.BytesIO(data), len(data))


def podman_names_of_file(stream: IO[bytes], limit: int = MAX_LIST_BYTES,
                         max_entry_bytes: int = MAX_ENTRY_BYTES) -> dict[str, str]:
    """container id -> its first name, from a containers/storage `containers.json`, parsed one container
    at a time: at most `limit` bytes read, `max_entry_bytes` of one container's entry held (StateTooLarge
    beyond either), at most MAX_NAMES names kept; none when it is no JSON array, ValueError when it is
    one cut short or holding what is not JSON."""
    names: dict[str, str] = {}
    for entry in json_array_items(stream, limit, max_entry_bytes):
        if not isinstance(entry, dict):
            continue
        container_id, entry_names = entry.get("id"), entry.get("names")
        if not (isinstance(container_id, str) and CONTAINER_ID.fullmatch(container_id)):
            continue
        if isinstance(entry_names, list) and entry_names and isinstance(entry_names[0], str):
            if len(names) < MAX_NAMES or container_id in names:
                names[container_id] = entry_names[0]
    return names


def podman_recorded(data: bytes) -> tuple[int | None, tuple[str, ...]]:
    """From a container's OCI `config.json` (bytes): the planned KV budget (its PLAN_LABEL annotation; None when
    it has none) and the command its process runs (`process.args`; () when not a list of strings), both as
    Podman wrote them at the container's creation; (None, ()) for anything that is not such a file."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        return None, ()
    if not isinstance(document, dict):
        return None, ()
    annotations, process = document.get("annotations"), document.get("process")
    plan = plan_bytes(annotations.get(PLAN_LABEL)) if isinstance(annotations, dict) else None
    args = process.get("args") if isinstance(process, dict) else None
    command = tuple(args) if isinstance(args, list) and all(isinstance(word, str) for word in args) else ()
    return plan, command


def conmon_uid(uid: bytes | None, comm: bytes | None, exe: bytes | None) -> int | None:
    """The uid of the conmon that wrote a record (0: root's Podman), or None when conmon did not write it.
    `_COMM` alone is the sender's own choice (`prctl(PR_SET_NAME)`), so it is checked with `_EXE`, the
    executable the kernel ran, which only root can place in a system directory; anyone may still exec the
    real conmon, hence the uid in the key."""
    if comm != b"conmon" or not system_executable(exe, b"conmon", PODMAN_DIRECTORIES):
        return None
    return uid_of(uid)


def podman_uid(uid: bytes | None, comm: bytes | None, exe: bytes | None) -> int | None:
    """The uid of the podman that wrote an event (0: root's), or None when podman did not write it."""
    if comm != b"podman" or not system_executable(exe, b"podman", PODMAN_DIRECTORIES):
        return None
    return uid_of(uid)


def _journal_writer(uid: bytes | None, comm: bytes | None, exe: bytes | None,
                    systemd_unit: bytes | None) -> int | None:
    return conmon_uid(uid, comm, exe)


def _journal_run(field: Callable[[bytes], bytes | None], pid: int | None) -> str:
    """The container's id, with conmon's pid: one conmon a start of the container."""
    run = (field(b"CONTAINER_ID_FULL") or field(b"CONTAINER_ID") or b"").decode("ascii", "replace")
    return run if pid is None else f"{run}/{pid}"


EXIT_EVENT = JournalExitEvent(field=b"PODMAN_EVENT", value=b"died", type_field=b"PODMAN_TYPE",
                              type_value=b"container", name_field=b"PODMAN_NAME", id_field=b"PODMAN_ID",
                              writer=podman_uid, rejected=REJECTED_PODMAN_EVENT)
JOURNAL = JournalDriver(writer=_journal_writer, key=podman_key, run=_journal_run, exit_event=EXIT_EVENT)
