"""The kubelet's pods on disk, read-only: pods' containers' names from the kubelet's log symlinks and pod log
directories, and their CRI log files.

- Names: the container log symlinks `<pod>_<namespace>_<container>-<id>.log` (`container_logs`:
  `--path.container-logs`, default /var/log/containers), whose target also names the pod's uid (read, not
  followed: the target is a host path); failing that, the pod log directories `<namespace>_<pod>_<uid>/<container>/`
  (`pod_logs`: `--path.pods`, default /var/log/pods) name the pod by its uid, and the container when the pod has
  only one.
- Logs (`pods`, `--logs.pods`): `<pods>/<namespace>_<pod>_<uid>/<container>/<n>.log`, one file a run of the
  container (`n`: its restart count; the kubelet keeps the previous one), each its own run
  `<pod uid>/<container>/<n>`. A pod's container's end is in no state the kubelet writes: none is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

from vllm_xpu_exporter.runtimes import (NOT_FOUND, ContainerCgroup, ExitWatch, LoggedContainer, LogStream, Names,
                                        StateFiles, parse_cri_line)
from vllm_xpu_exporter.runtimes.files import MAX_DIRECTORY_ENTRIES, list_directory, siblings
from vllm_xpu_exporter.runtimes.pods import (LOG_LINK, POD_DIRECTORY, RESTART_LOG, kubernetes_key, rotated_files,
                                             uid_of_link_target)

DEFAULT_POD_LOGS = "/var/log/pods"
DEFAULT_CONTAINER_LOGS = "/var/log/containers"
LOCATIONS: Mapping[str, object] = {"pod_logs": DEFAULT_POD_LOGS, "container_logs": DEFAULT_CONTAINER_LOGS}
LOG_LOCATIONS = ("pods",)


def names(container: ContainerCgroup, files: StateFiles, locations: Mapping[str, object]) -> Names:
    """A pod's container's names: from its log symlink (by id, checked against the pod's uid), else from its
    pod's log directory (by the pod's uid)."""
    container_logs, pod_logs = str(locations["container_logs"]), str(locations["pod_logs"])
    pod_uid = container.pod_uid
    links = files.cached(container_logs, container_logs, lambda path, root: _read_log_links(path, root, files))
    found = links.get(container.id)
    if found is not None:
        namespace, pod, name, link = found
        uid = _uid_of_link(os.path.join(container_logs, link), namespace, pod, name)
        if uid is None or uid == pod_uid:
            key = kubernetes_key(namespace, pod, name)
            if key is not None:
                return Names(key, name, namespace=namespace, pod=pod)
    pods = files.cached(pod_logs, pod_logs, lambda path, root: _read_pod_directories(path, root, files))
    pod_directory = pods.get(pod_uid)
    if pod_directory is None:
        return NOT_FOUND
    namespace, pod, directory = pod_directory
    containers = _container_directories(os.path.join(pod_logs, directory), pod_logs, files)
    name = containers[0] if len(containers) == 1 else ""
    key = kubernetes_key(namespace, pod, name) if name else None
    return Names(key, name if key else "", namespace=namespace, pod=pod)


def exit_watch(container_id: str, locations: Mapping[str, object]) -> ExitWatch | None:
    return None


class PodLogs:
    """The CRI log files of the pods' containers under the pod log directory `pods`."""

    def __init__(self, pods: str) -> None:
        self.pods = pods

    def directories(self) -> list[str]:
        return [self.pods]

    def find(self, followed: Mapping[str, str]) -> Iterator[LoggedContainer]:
        for pod_directory in list_directory(self.pods):
            match = POD_DIRECTORY.fullmatch(pod_directory)
            if match is None:
                continue
            namespace, pod, uid = match.groups()
            pod_path = os.path.join(self.pods, pod_directory)
            for container_name in list_directory(pod_path):
                key = kubernetes_key(namespace, pod, container_name)
                if key is None:
                    continue
                container_path = os.path.join(pod_path, container_name)
                streams = []
                for file_name in list_directory(container_path):
                    restart = RESTART_LOG.fullmatch(file_name)
                    live = os.path.join(container_path, file_name)
                    if restart is None or live in followed:
                        continue
                    number = int(restart.group(1))
                    streams.append(LogStream(live, lambda live=live: rotated_files(live, siblings(live)),
                                             f"{uid}/{container_name}/{number}", parse_cri_line, (number, 0)))
                yield LoggedContainer(key, container_name, container_path, streams)


def log_finder(locations: Mapping[str, object]) -> PodLogs | None:
    pods = locations.get("pods")
    return PodLogs(str(pods)) if pods else None


def _read_log_links(directory: str, root: str, files: StateFiles) -> dict[str, tuple[str, str, str, str]]:
    """container id -> (namespace, pod, container, the symlink's name) from the kubelet's symlinks."""
    links: dict[str, tuple[str, str, str, str]] = {}
    for name in files.listing(directory, root):
        match = LOG_LINK.fullmatch(name)
        if match is None:
            continue
        pod, namespace, container, container_id = match.groups()
        if kubernetes_key(namespace, pod, container) is None:
            continue
        links[container_id] = (namespace, pod, container, name)
    return links


def _read_pod_directories(directory: str, root: str, files: StateFiles) -> dict[str, tuple[str, str, str]]:
    """pod uid -> (namespace, pod, directory name) from the kubelet's pod log directories."""
    pods: dict[str, tuple[str, str, str]] = {}
    for name in files.listing(directory, root):
        match = POD_DIRECTORY.fullmatch(name)
        if match is not None and kubernetes_key(match.group(1), match.group(2), "c") is not None:
            pods[match.group(3)] = (match.group(1), match.group(2), name)
    return pods


def _container_directories(directory: str, root: str, files: StateFiles) -> list[str]:
    names = []
    try:
        with os.scandir(directory) as entries:
            for index, entry in enumerate(entries):
                if index >= MAX_DIRECTORY_ENTRIES:
                    break
                if entry.is_dir(follow_symlinks=False) and kubernetes_key("n", "p", entry.name) is not None:
                    names.append(entry.name)
    except OSError as error:
        files.report(root, directory, error)
    return sorted(names)


def _uid_of_link(path: str, namespace: str, pod: str, container: str) -> str | None:
    try:
        target = os.readlink(path)
    except OSError:
        return None
    return uid_of_link_target(target, namespace, pod, container)
