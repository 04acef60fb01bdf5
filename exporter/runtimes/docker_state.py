"""Docker's state on disk, read-only: containers' names and ends from `config.v2.json`, their json-file logs.

Each data root (`docker_roots`: `--path.docker`, default /var/lib/docker; repeatable, e.g. for a rootless dockerd)
holds `containers/<id>/config.v2.json` and, with the json-file log driver, `containers/<id>/<id>-json.log`,
rotated by dockerd (`max-size`, `max-file`) to `<id>-json.log.1` (the newest), `.2`, ..., gzipped to `.N.gz`
with `compress`. A container's files are believed only when its own user owns them: root's dockerd writes
root's, a rootless dockerd its user's (`docker/<name>@uid<N>`), and another user's data root may hold a file
for any id it likes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from vllm_xpu_exporter.parsers.workloads import uid_of_identity, user_suffix
from vllm_xpu_exporter.runtimes import (CONTAINER_ID, NOT_FOUND, ContainerCgroup, ContainerExit, LoggedContainer,
                                        LogStream, Names, StateFiles)
from vllm_xpu_exporter.runtimes.docker import (CONFIG, MAX_CONFIG_BYTES, docker_exit, docker_names,
                                               parse_json_file_line, rotated_files)
from vllm_xpu_exporter.runtimes.files import LogFilePerContainer, list_directory, read_small, siblings

DEFAULT_DOCKER_ROOT = "/var/lib/docker"
LOCATIONS: Mapping[str, object] = {"docker_roots": (DEFAULT_DOCKER_ROOT,)}
LOG_LOCATIONS = ("docker_roots",)


def names(container: ContainerCgroup, files: StateFiles, locations: Mapping[str, object]) -> Names:
    """A Docker container's names from a config.v2.json its own user owns."""
    for root in _roots(locations):
        path = os.path.join(root, "containers", container.id, CONFIG)
        data = files.read(path, MAX_CONFIG_BYTES, root, owner=container.uid)
        if data is not None:
            return docker_names(data, container.id)
    return NOT_FOUND


@dataclass
class DockerEnd:
    """A Docker container's end, as its `config.v2.json` says it (dockerd rewrites the file on every start
    and end of the container): `ended()` is the end not handed on yet, once `State.Running` is false
    (`docker.docker_exit`). The file is read again only when its mtime or size changed; the first of
    `configs` that exists is read (one per data root)."""

    configs: tuple[str, ...]
    owner: int = 0  # the container's user: a config of another user's is not its (root's dockerd: 0)
    signature: tuple[int, int] | None = None  # (mtime, size) of the config last read
    exit_usec: int | None = None  # the end already handed on

    def ended(self, since_usec: int = 0) -> ContainerExit | None:
        """The container's end, once, when it is new and not before `since_usec`; else None."""
        for config in self.configs:
            try:
                info = os.stat(config)
            except OSError:
                continue
            if info.st_uid != self.owner:
                continue
            signature = (info.st_mtime_ns, info.st_size)
            if signature == self.signature or info.st_size > MAX_CONFIG_BYTES:
                return None
            self.signature = signature
            data = read_small(config, MAX_CONFIG_BYTES, owner=self.owner)
            ended = docker_exit(data) if data else None
            if ended is None or ended.realtime_usec == self.exit_usec or ended.realtime_usec < since_usec:
                return None
            self.exit_usec = ended.realtime_usec
            return ended
        return None


def exit_watch(container_id: str, locations: Mapping[str, object]) -> DockerEnd | None:
    """Where a root's container's end is read (its config.v2.json in each data root); None without data roots.
    An id that is not a full one (the journal's short `CONTAINER_ID`) gives a watch that never ends."""
    roots = _roots(locations)
    if not roots:
        return None
    if not CONTAINER_ID.fullmatch(container_id):
        return DockerEnd(())
    return DockerEnd(tuple(os.path.join(root, "containers", container_id, CONFIG) for root in roots))


class DockerLogs:
    """The json-file logs of the containers in the data roots `roots`."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots
        self._containers = LogFilePerContainer()

    def directories(self) -> list[str]:
        return [os.path.join(root, "containers") for root in self.roots]

    def find(self, followed: Mapping[str, str]) -> Iterator[LoggedContainer]:
        for directory in self.directories():
            for container_id in filter(CONTAINER_ID.fullmatch, list_directory(directory)):
                container_directory = os.path.join(directory, container_id)
                live = os.path.join(container_directory, f"{container_id}-json.log")

                def stream(key: str, created: int, live: str = live, config: str = os.path.join(
                        container_directory, CONFIG), container_id: str = container_id) -> LogStream:
                    end = DockerEnd((config,), owner=uid_of_identity(key))
                    return LogStream(live, lambda: rotated_files(live, siblings(live)), container_id,
                                     parse_json_file_line, (0, created), end)

                found = self._containers.container(
                    container_id, container_directory, live, followed,
                    lambda: _named(container_directory, container_id), stream)
                if found is not None:
                    yield found
        self._containers.discovered()


def log_finder(locations: Mapping[str, object]) -> DockerLogs | None:
    roots = _roots(locations)
    return DockerLogs(roots) if roots else None


def _named(container_directory: str, container_id: str) -> tuple[str, str] | None:
    """The container's key and name from its config.v2.json (dockerd writes it before the log), of the
    user who owns the container's directory: a rootless dockerd's containers are that user's
    (`docker/<name>@uid<N>`), and only root's dockerd can write into root's data root."""
    try:
        owner = os.stat(container_directory).st_uid
    except OSError:
        return None
    data = read_small(os.path.join(container_directory, CONFIG), MAX_CONFIG_BYTES, owner=owner)
    try:
        found = docker_names(data, container_id) if 0 < len(data) <= MAX_CONFIG_BYTES else None
    except (ValueError, RecursionError):
        found = None
    if found is None or found.key is None:
        return None
    return found.key + user_suffix(owner), found.container


def _roots(locations: Mapping[str, object]) -> tuple[str, ...]:
    return tuple(locations.get("docker_roots") or ())  # type: ignore[call-overload]
