"""Podman's state on disk, read-only: containers' names from the containers/storage lists, their k8s-file logs.

Each storage (`podman_storages`: `--path.podman`, repeatable, default /var/lib/containers/storage; a rootless
user's is ~/.local/share/containers/storage) holds `<driver>-containers/containers.json` and
`volatile-containers.json`. A container's name is believed only from a list its own user owns: root's containers
from root's lists, a rootless user's from that user's (another user's list may name any id it likes). Its plan
(`podman.podman_recorded`, with the command it runs) only from its OCI `config.json` that user owns.

Logs: with the journald log driver conmon writes a container's lines to the journal, and Podman its ends as
events (`podman.EXIT_EVENT`); with k8s-file (`--log-driver k8s-file`, Podman's default where no journald runs),
conmon writes them in the CRI log format (`runtimes.parse_cri_line`) to the file `podman container inspect`
shows as `LogPath`: `<driver>-containers/<id>/userdata/ctr.log` of the storage, unless the container was
created with `--log-opt path=` (such a file is not found). One file for every start of the container (vLLM's
first line tells the runs apart, as for Docker); conmon's `max-size` replaces the file with a new one, keeping no
predecessor. The file is believed only in a container directory owned by the user whose list names the
container (a rootless user's: `podman/<name>@uid<N>`). Podman keeps a container's state (its end) in its
database, which is not read: a k8s-file container's end is seen from its lines alone.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Mapping

from vllm_xpu_exporter.runtimes import (CONTAINER_ID, NOT_FOUND, ContainerCgroup, ExitWatch, LoggedContainer,
                                        LogStream, Names, StateTooLarge, parse_cri_line)
from vllm_xpu_exporter.runtimes.files import OPEN_FILE, LogFilePerContainer, StateFiles, list_directory
from vllm_xpu_exporter.runtimes.podman import (DRIVER_SUFFIX, K8S_FILE_LOG, LISTS, MAX_LIST_BYTES,
                                               MAX_OCI_CONFIG_BYTES, OCI_CONFIG, podman_key, podman_names_of_file,
                                               podman_recorded)

DEFAULT_PODMAN_STORAGE = "/var/lib/containers/storage"
LOCATIONS: Mapping[str, object] = {"podman_storages": (DEFAULT_PODMAN_STORAGE,)}
LOG_LOCATIONS = ("podman_storages",)
MAX_DRIVERS = 8  # <driver>-containers directories of one storage (overlay, vfs, btrfs, ...)


def names(container: ContainerCgroup, files: StateFiles, locations: Mapping[str, object]) -> Names:
    for storage in tuple(locations.get("podman_storages") or ()):  # type: ignore[call-overload]
        for path in _lists(storage, files):
            owner, found = files.cached(path, storage, lambda path, root: _read_list(path, root, files)) or (None, {})
            name = found.get(container.id) if owner == container.uid else None
            if name:
                key = podman_key(name)
                if key is not None:
                    config = os.path.join(os.path.dirname(path), container.id, OCI_CONFIG)
                    data = files.read(config, MAX_OCI_CONFIG_BYTES, storage, owner=container.uid)
                    plan, command = podman_recorded(data) if data else (None, ())
                    return Names(key, name, command=command, plan_kv_cache_bytes=plan)
    return NOT_FOUND


class PodmanLogs:
    """The k8s-file logs of the containers in the storages `storages`."""

    def __init__(self, storages: tuple[str, ...]) -> None:
        self.storages = storages
        self._containers = LogFilePerContainer()
        self._files = StateFiles()

    def directories(self) -> list[str]:
        return list(self.storages)

    def find(self, followed: Mapping[str, str]) -> Iterator[LoggedContainer]:
        for storage in self.storages:
            try:
                drivers = _driver_directories(storage)
            except OSError:
                continue  # not there yet: no container was created
            for driver in drivers:
                lists: list[tuple[int, dict[str, str]]] = []  # read once a discovery, when a new container needs it

                def named(directory: str, container_id: str, driver: str = driver, storage: str = storage,
                          lists: list = lists) -> tuple[str, str] | None:
                    if not lists:
                        lists.extend(self._list(os.path.join(driver, name), storage) for name in LISTS)
                    return _named(directory, container_id, lists)

                for container_id in filter(CONTAINER_ID.fullmatch, list_directory(driver)):
                    directory = os.path.join(driver, container_id)
                    live = os.path.join(directory, K8S_FILE_LOG)
                    found = self._containers.container(
                        container_id, directory, live, followed, lambda: named(directory, container_id),
                        lambda key, created: LogStream(live, list, container_id, parse_cri_line, (0, created)))
                    if found is not None:
                        yield found
        self._containers.discovered()

    def _list(self, path: str, storage: str) -> tuple[int, dict[str, str]]:
        """(owner, container id -> name) of one of a storage's lists, read again only when it changed."""
        return self._files.cached(path, storage, lambda path, root: _read_list(path, root, self._files)) or (-1, {})


def log_finder(locations: Mapping[str, object]) -> PodmanLogs | None:
    storages = tuple(locations.get("podman_storages") or ())  # type: ignore[call-overload]
    return PodmanLogs(storages) if storages else None


def _named(directory: str, container_id: str, lists: list[tuple[int, dict[str, str]]]) -> tuple[str, str] | None:
    """The container's key and name from a list of its storage owned by the user who owns its directory: root's
    Podman's containers are root's, a rootless Podman's its user's (`podman/<name>@uid<N>`)."""
    try:
        owner = os.stat(directory).st_uid
    except OSError:
        return None
    for list_owner, names_by_id in lists:
        name = names_by_id.get(container_id) if list_owner == owner else None
        key = podman_key(name, owner) if name else None
        if key is not None:
            return key, name
    return None


def exit_watch(container_id: str, locations: Mapping[str, object]) -> ExitWatch | None:
    return None


def _driver_directories(storage: str) -> list[str]:
    """The storage's `<driver>-containers` directories (at most MAX_DRIVERS); OSError when it cannot be listed."""
    with os.scandir(storage) as entries:
        drivers = sorted(entry.name for entry in entries
                         if entry.name.endswith(DRIVER_SUFFIX) and entry.is_dir(follow_symlinks=False))
    return [os.path.join(storage, driver) for driver in drivers[:MAX_DRIVERS]]


def _lists(storage: str, files: StateFiles) -> list[str]:
    try:
        drivers = _driver_directories(storage)
    except OSError as error:
        files.report(storage, storage, error)
        return []
    return [os.path.join(driver, name) for driver in drivers for name in LISTS]


def _read_list(path: str, storage: str, files: StateFiles) -> tuple[int, dict[str, str]] | None:
    """(the file's owner, container id -> name), or None when it cannot be read or is cut (counted)."""
    try:
        fd = os.open(path, OPEN_FILE)
    except OSError as error:
        files.report(storage, path, error)
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        if info.st_size > MAX_LIST_BYTES:
            files.cut(path, f"larger than {MAX_LIST_BYTES} bytes")
            return None
        with os.fdopen(os.dup(fd), "rb") as stream:
            return info.st_uid, podman_names_of_file(stream, MAX_LIST_BYTES)
    except StateTooLarge as error:
        files.cut(path, str(error))
        return None
    finally:
        os.close(fd)
