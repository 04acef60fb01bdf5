"""Podman's state on disk, read-only: containers' names from the containers/storage lists.

Each storage (`podman_storages`: `--path.podman`, repeatable, default /var/lib/containers/storage; a rootless
user's is ~/.local/share/containers/storage) holds `<driver>-containers/containers.json` and
`volatile-containers.json`. A container's name is believed only from a list its own user owns: root's containers
from root's lists, a rootless user's from that user's (another user's list may name any id it likes). Podman
writes its containers' lines to the journal (conmon), not to files this module reads, and its ends as events
(`podman.EXIT_EVENT`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from vllm_xpu_exporter.runtimes import (NOT_FOUND, ContainerCgroup, ExitWatch, LogFinder, Names, StateFiles,
                                        StateTooLarge)
from vllm_xpu_exporter.runtimes.files import OPEN_FILE
from vllm_xpu_exporter.runtimes.podman import DRIVER_SUFFIX, LISTS, MAX_LIST_BYTES, podman_key, podman_names_of_file

DEFAULT_PODMAN_STORAGE = "/var/lib/containers/storage"
LOCATIONS: Mapping[str, object] = {"podman_storages": (DEFAULT_PODMAN_STORAGE,)}
LOG_LOCATIONS: tuple[str, ...] = ()
MAX_DRIVERS = 8  # <driver>-containers directories of one storage (overlay, vfs, btrfs, ...)


def names(container: ContainerCgroup, files: StateFiles, locations: Mapping[str, object]) -> Names:
    for storage in tuple(locations.get("podman_storages") or ()):  # type: ignore[call-overload]
        for path in _lists(storage, files):
            owner, found = files.cached(path, storage, lambda path, root: _read_list(path, root, files)) or (None, {})
            name = found.get(container.id) if owner == container.uid else None
            if name:
                key = podman_key(name)
                if key is not None:
                    return Names(key, name)
    return NOT_FOUND


def log_finder(locations: Mapping[str, object]) -> LogFinder | None:
    return None


def exit_watch(container_id: str, locations: Mapping[str, object]) -> ExitWatch | None:
    return None


def _lists(storage: str, files: StateFiles) -> list[str]:
    try:
        with os.scandir(storage) as entries:
            drivers = sorted(entry.name for entry in entries
                             if entry.name.endswith(DRIVER_SUFFIX) and entry.is_dir(follow_symlinks=False))
    except OSError as error:
        files.report(storage, storage, error)
        return []
    return [os.path.join(storage, driver, name) for driver in drivers[:MAX_DRIVERS] for name in LISTS]


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
