"""The names of the containers that hold the GPU, read-only from the engines' state on disk: no Docker socket,
no API, no gRPC.

A process's cgroup says which engine runs its container, the container's id and, for a pod's container, the
pod's uid (`vllm_xpu_exporter.parsers.cgroup.ContainerCgroup`). `ContainerNames.workload` turns that into a `Workload`:
the `unit` label value (`vllm_xpu_exporter.parsers.workloads`: `docker/<name>`, `podman/<name>`,
`k8s/<namespace>/<pod>/<container>`) and the details of `xpu_workload_info`. The names come from:

- Docker: `<root>/containers/<id>/config.v2.json` (root `--path.docker`, default /var/lib/docker): `Name`
  (`/<name>`), and the labels Compose sets, `Config.Labels["com.docker.compose.project"]` and
  `["com.docker.compose.service"]`.
- Podman: `<storage>/<driver>-containers/containers.json` and `volatile-containers.json` (storage
  `--path.podman`, repeatable, default /var/lib/containers/storage; a rootless user's is
  ~/.local/share/containers/storage): the containers/storage library's list, `[{"id": ..., "names": [...]}]`.
- Kubernetes: the kubelet's container log symlinks `<pod>_<namespace>_<container>-<id>.log`
  (`--path.container-logs`, default /var/log/containers), whose target `.../<namespace>_<pod>_<uid>/<container>/
  N.log` also names the pod's uid; failing that, the pod log directories `<namespace>_<pod>_<uid>/<container>/`
  (`--path.pods`, default /var/log/pods) name the pod by its uid, and the container when the pod has only one.

Those files are untrusted input (a container's name and labels are chosen by whoever runs it; a path flag may
point anywhere): a file that is missing, not a regular file, larger than its bound, unreadable, not JSON or
not of the expected shape, or a name the engine itself would refuse, gives no name, never an exception, and
the workload keeps its cgroup leaf as `unit`. What is found is kept per container for REFRESH_SECONDS (a
renamed Docker container shows its new name within that), at most MAX_CACHED containers; a container not
found is looked up again after the same time.
"""

from __future__ import annotations

import codecs
import errno
import io
import json
import logging
import os
import re
import stat
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO

from vllm_xpu_exporter.parsers.cgroup import DOCKER, PODMAN, ContainerCgroup
from vllm_xpu_exporter.parsers.containerlogs import DockerExit, docker_exit
from vllm_xpu_exporter.parsers.workloads import (
    KIND_DOCKER, KIND_KUBERNETES, KIND_PODMAN, KIND_SYSTEMD, docker_key, kubernetes_key, podman_key, user_suffix,
)

log = logging.getLogger("vllm_xpu_exporter.containers")

DEFAULT_DOCKER_ROOT = "/var/lib/docker"
DEFAULT_PODMAN_STORAGE = "/var/lib/containers/storage"
DEFAULT_POD_LOGS = "/var/log/pods"
DEFAULT_CONTAINER_LOGS = "/var/log/containers"

# A config.v2.json is a few KiB (its environment and labels), parsed whole: 1 MiB of JSON makes at most
# ~25 MB of Python objects. A containers.json is about 1 KiB a container and is parsed one container at a
# time (`podman_names_of_file`): its size bounds the CPU, MAX_PODMAN_ENTRY_BYTES and MAX_PODMAN_NAMES the memory.
MAX_DOCKER_CONFIG_BYTES = 1 << 20
MAX_PODMAN_LIST_BYTES = 16 << 20
MAX_PODMAN_ENTRY_BYTES = 64 << 10
MAX_PODMAN_NAMES = 65536
STATE_CHUNK_BYTES = 64 << 10
MAX_DIRECTORY_ENTRIES = 65536  # of a log directory: a node runs at most a few hundred containers
MAX_PODMAN_DRIVERS = 8  # <driver>-containers directories of one storage (overlay, vfs, btrfs, ...)
REFRESH_SECONDS = 60.0
MAX_CACHED = 4096

COMPOSE_PROJECT = "com.docker.compose.project"
COMPOSE_SERVICE = "com.docker.compose.service"
# Compose's project names are [a-z0-9][a-z0-9_-]*, its service names [a-zA-Z0-9._-]+; these labels can be
# set by hand to anything, so anything else is left out.
_LABEL_VALUE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,252}")
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
# <pod>_<namespace>_<container>-<id>.log: none of the names can hold `_`.
_LOG_LINK = re.compile(r"([^_/]+)_([^_/]+)_([^_/]+)-([0-9a-f]{64})\.log")
# <namespace>_<pod>_<uid>
_POD_DIRECTORY = re.compile(r"([^_/]+)_([^_/]+)_([0-9a-f][0-9a-f-]{0,63})")

OPEN_FILE = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO where a file should be must not hang a scrape

# The labels of xpu_workload_info, in the order of Workload's fields.
INFO_LABELS = ("unit", "kind", "container_id", "container", "compose_project", "compose_service", "namespace",
               "pod", "pod_uid")


@dataclass(frozen=True)
class Workload:
    """Who holds the GPU: `unit`, the label value of every per-unit series (a systemd unit's name, a
    container's key, or the cgroup's leaf when a container's names are not found); `kind`: `systemd`,
    `docker`, `podman` or `k8s` (what the cgroup says, found names or not); the rest as found, empty where
    they do not apply or are not known."""

    unit: str
    kind: str = KIND_SYSTEMD
    container_id: str = ""
    container: str = ""
    compose_project: str = ""
    compose_service: str = ""
    namespace: str = ""
    pod: str = ""
    pod_uid: str = ""

    def labels(self) -> list[str]:
        """The label values of xpu_workload_info, in INFO_LABELS' order."""
        return [self.unit, self.kind, self.container_id, self.container, self.compose_project, self.compose_service,
                self.namespace, self.pod, self.pod_uid]


@dataclass(frozen=True)
class _Names:
    """What the state on disk says of one container (empty: not found)."""

    key: str | None = None
    container: str = ""
    compose_project: str = ""
    compose_service: str = ""
    namespace: str = ""
    pod: str = ""


_NOT_FOUND = _Names()


class ContainerNames:
    """Names of containers by their cgroup's `ContainerCgroup`, from the engines' state directories (see the
    module's docstring). Called from scrapes, which are serial; not thread-safe."""

    def __init__(self, docker_roots: Sequence[str] = (DEFAULT_DOCKER_ROOT,),
                 podman_storages: Sequence[str] = (DEFAULT_PODMAN_STORAGE,),
                 pod_logs: str = DEFAULT_POD_LOGS, container_logs: str = DEFAULT_CONTAINER_LOGS,
                 clock: Callable[[], float] = time.monotonic, refresh_seconds: float = REFRESH_SECONDS,
                 max_cached: int = MAX_CACHED) -> None:
        self.docker_roots = tuple(docker_roots)
        self.podman_storages = tuple(podman_storages)
        self.pod_logs = pod_logs
        self.container_logs = container_logs
        self._clock = clock
        self._refresh = refresh_seconds
        self._max_cached = max_cached
        self._cache: OrderedDict[ContainerCgroup, tuple[float, _Names]] = OrderedDict()
        # file or directory -> (its signature, what it maps); re-read when the signature changes
        self._lists: dict[str, tuple[tuple[int, ...], dict]] = {}
        self._reported: set[str] = set()
        self.cut = 0
        """State files not read because they, or one container's entry in them, are over their size bound
        (`xpu_exporter_container_state_files_cut_total`)."""

    def workload(self, unit: str, container: ContainerCgroup | None) -> Workload:
        """The workload of cgroup leaf `unit` (`UnitCgroup.unit`) and its container (None: a systemd unit
        or a cgroup that is no container's, which keep their name). Never raises for what is on disk."""
        if container is None:
            return Workload(unit)
        kind = _kind(container)
        names = self._names(container)
        key = names.key and names.key + user_suffix(container.uid)  # a rootless user's: never root's
        return Workload(key or unit, kind, container.id, names.container, names.compose_project,
                        names.compose_service, names.namespace, names.pod, container.pod_uid or "")

    def _names(self, container: ContainerCgroup) -> _Names:
        now = self._clock()
        cached = self._cache.get(container)
        if cached is not None and now < cached[0]:
            self._cache.move_to_end(container)
            return cached[1]
        try:
            names = self._look_up(container)
        except (OSError, ValueError, TypeError, RecursionError, MemoryError) as error:  # hostile or broken state
            log.debug("no names for container %s: %s", container.id, error)
            names = _NOT_FOUND
        self._cache[container] = (now + self._refresh, names)
        self._cache.move_to_end(container)
        while len(self._cache) > self._max_cached:
            self._cache.popitem(last=False)
        return names

    def _look_up(self, container: ContainerCgroup) -> _Names:
        if container.pod_uid is not None:
            return self._pod_container(container.id, container.pod_uid)
        if container.engine == DOCKER:
            return self._docker(container.id, container.uid)
        if container.engine == PODMAN:
            return self._podman(container.id, container.uid)
        return _NOT_FOUND

    def _docker(self, container_id: str, uid: int) -> _Names:
        """A Docker container's names from a config.v2.json its own user owns (root's dockerd writes root's,
        a rootless dockerd its user's): another user's data root may hold a file for any id it likes."""
        for root in self.docker_roots:
            path = os.path.join(root, "containers", container_id, "config.v2.json")
            data = self._read(path, MAX_DOCKER_CONFIG_BYTES, root, owner=uid)
            if data is None:
                continue
            return docker_names(data, container_id)
        return _NOT_FOUND

    def _podman(self, container_id: str, uid: int) -> _Names:
        """A Podman container's name from a list its own user owns: root's containers from root's lists, a
        rootless user's from that user's (another user's list may name any id it likes)."""
        for storage in self.podman_storages:
            for path in self._podman_lists(storage):
                owner, names = self._cached_list(path, storage, self._read_podman_list) or (None, {})
                name = names.get(container_id) if owner == uid else None
                if name:
                    key = podman_key(name)
                    if key is not None:
                        return _Names(key, name)
        return _NOT_FOUND

    def _podman_lists(self, storage: str) -> list[str]:
        try:
            with os.scandir(storage) as entries:
                drivers = sorted(entry.name for entry in entries
                                 if entry.name.endswith("-containers") and entry.is_dir(follow_symlinks=False))
        except OSError as error:
            self._report(storage, storage, error)
            return []
        return [os.path.join(storage, driver, name) for driver in drivers[:MAX_PODMAN_DRIVERS]
                for name in ("containers.json", "volatile-containers.json")]

    def _read_podman_list(self, path: str, storage: str) -> tuple[int, dict[str, str]] | None:
        """(the file's owner, container id -> name), or None when it cannot be read or is cut (counted)."""
        try:
            fd = os.open(path, OPEN_FILE)
        except OSError as error:
            self._report(storage, path, error)
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return None
            if info.st_size > MAX_PODMAN_LIST_BYTES:
                self._cut(path, f"larger than {MAX_PODMAN_LIST_BYTES} bytes")
                return None
            with os.fdopen(os.dup(fd), "rb") as stream:
                return info.st_uid, podman_names_of_file(stream, MAX_PODMAN_LIST_BYTES)
        except StateTooLarge as error:
            self._cut(path, str(error))
            return None
        finally:
            os.close(fd)

    def _cut(self, path: str, why: str) -> None:
        """A state file not read for its size: counted (`cut`), logged at debug."""
        self.cut += 1
        log.debug("container names: %s not read: %s", path, why)

    def _pod_container(self, container_id: str, pod_uid: str) -> _Names:
        links = self._cached_list(self.container_logs, self.container_logs, self._read_log_links)
        found = links.get(container_id)
        if found is not None:
            namespace, pod, name, link = found
            uid = _uid_of_link(os.path.join(self.container_logs, link), namespace, pod, name)
            if uid is None or uid == pod_uid:
                key = kubernetes_key(namespace, pod, name)
                if key is not None:
                    return _Names(key, name, namespace=namespace, pod=pod)
        pod_directory = self._cached_list(self.pod_logs, self.pod_logs, self._read_pod_directories).get(pod_uid)
        if pod_directory is None:
            return _NOT_FOUND
        namespace, pod, directory = pod_directory
        containers = self._container_directories(os.path.join(self.pod_logs, directory))
        name = containers[0] if len(containers) == 1 else ""
        key = kubernetes_key(namespace, pod, name) if name else None
        return _Names(key, name if key else "", namespace=namespace, pod=pod)

    def _read_log_links(self, directory: str, root: str) -> dict[str, tuple[str, str, str, str]]:
        """container id -> (namespace, pod, container, the symlink's name) from the kubelet's symlinks."""
        links: dict[str, tuple[str, str, str, str]] = {}
        for name in self._list(directory, root):
            match = _LOG_LINK.fullmatch(name)
            if match is None:
                continue
            pod, namespace, container, container_id = match.groups()
            if kubernetes_key(namespace, pod, container) is None:
                continue
            links[container_id] = (namespace, pod, container, name)
        return links

    def _read_pod_directories(self, directory: str, root: str) -> dict[str, tuple[str, str, str]]:
        """pod uid -> (namespace, pod, directory name) from the kubelet's pod log directories."""
        pods: dict[str, tuple[str, str, str]] = {}
        for name in self._list(directory, root):
            match = _POD_DIRECTORY.fullmatch(name)
            if match is not None and kubernetes_key(match.group(1), match.group(2), "c") is not None:
                pods[match.group(3)] = (match.group(1), match.group(2), name)
        return pods

    def _container_directories(self, directory: str) -> list[str]:
        names = []
        try:
            with os.scandir(directory) as entries:
                for index, entry in enumerate(entries):
                    if index >= MAX_DIRECTORY_ENTRIES:
                        break
                    if entry.is_dir(follow_symlinks=False) and kubernetes_key("n", "p", entry.name) is not None:
                        names.append(entry.name)
        except OSError as error:
            self._report(self.pod_logs, directory, error)
        return sorted(names)

    def _list(self, directory: str, root: str) -> list[str]:
        names = []
        try:
            with os.scandir(directory) as entries:
                for index, entry in enumerate(entries):
                    if index >= MAX_DIRECTORY_ENTRIES:
                        log.debug("%s: more than %d entries, the rest not read", directory, MAX_DIRECTORY_ENTRIES)
                        break
                    names.append(entry.name)
        except OSError as error:
            self._report(root, directory, error)
        return names

    def _cached_list(self, path: str, root: str, read: Callable[[str, str], dict]) -> dict:
        """What `read` makes of a file or directory, read again only when its signature (inode, size, change
        and modification times) changed; {} when it cannot be looked at."""
        try:
            info = os.stat(path)
        except OSError as error:
            self._report(root, path, error)
            self._lists.pop(path, None)
            return {}
        signature = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        known = self._lists.get(path)
        if known is not None and known[0] == signature:
            return known[1]
        try:
            mapped = read(path, root)
        except (OSError, ValueError, TypeError, RecursionError, MemoryError) as error:
            log.debug("%s: %s", path, error)
            mapped = {}
        self._lists[path] = (signature, mapped)
        return mapped

    def _read(self, path: str, limit: int, root: str, owner: int | None = None) -> bytes | None:
        """A regular file of at most `limit` bytes (owned by `owner`, if given), else None (a failure to read
        it reported, one too large counted)."""
        return read_small(path, limit, lambda error: self._report(root, path, error),
                          lambda: self._cut(path, f"larger than {limit} bytes"), owner) or None

    def _report(self, root: str, path: str, error: OSError) -> None:
        """A missing file or directory is normal (an engine not installed, a container gone); a denied one
        is logged once per state directory (`root`), at info, saying what would let the exporter read it."""
        if error.errno in (errno.EACCES, errno.EPERM):
            if root not in self._reported:
                self._reported.add(root)
                log.info("container names: cannot read %s (%s); the exporter needs read access to the engines' "
                         "state (root, or CAP_DAC_READ_SEARCH); the containers keep their cgroup names",
                         path, error.strerror)
        else:
            log.debug("container names: %s: %s", path, error.strerror)


def read_small(path: str, limit: int, report: Callable[[OSError], None] | None = None,
               too_large: Callable[[], None] | None = None, owner: int | None = None) -> bytes:
    """A regular file of at most `limit` bytes (and of user `owner`, when given); b"" when it is not one or
    cannot be read (`report`, when given, is told why it could not; `too_large` that it is over `limit`)."""
    try:
        fd = os.open(path, OPEN_FILE)
    except OSError as error:
        if report is not None:
            report(error)
        return b""
    try:
        info = os.fstat(fd)
        if owner is not None and info.st_uid != owner:
            log.debug("%s: not owned by uid %d", path, owner)
            return b""
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            log.debug("%s: not a regular file of at most %d bytes", path, limit)
            if stat.S_ISREG(info.st_mode) and too_large is not None:
                too_large()
            return b""
        data = os.read(fd, limit + 1)
    except OSError as error:
        if report is not None:
            report(error)
        return b""
    finally:
        os.close(fd)
    return data if len(data) <= limit else b""


@dataclass
class DockerEnd:
    """A Docker container's end, as its `config.v2.json` says it (dockerd rewrites the file on every start
    and end of the container): `ended()` is the end not handed on yet, once `State.Running` is false
    (`vllm_xpu_exporter.parsers.containerlogs.docker_exit`). The file is read again only when its mtime or size
    changed; the first of `configs` that exists is read (one per --path.docker root). Used by both sources
    of what a Docker container printed: its json-file log (`vllm_xpu_exporter.sources.containerlogs`) and the
    journal (`vllm_xpu_exporter.sources.journal.reader`, the journald log driver)."""

    configs: tuple[str, ...]
    owner: int = 0  # the container's user: a config of another user's is not its (root's dockerd: 0)
    signature: tuple[int, int] | None = None  # (mtime, size) of the config last read
    exit_usec: int | None = None  # the end already handed on

    def ended(self, since_usec: int = 0) -> DockerExit | None:
        """The container's end, once, when it is new and not before `since_usec`; else None."""
        for config in self.configs:
            try:
                info = os.stat(config)
            except OSError:
                continue
            if info.st_uid != self.owner:
                continue
            signature = (info.st_mtime_ns, info.st_size)
            if signature == self.signature or info.st_size > MAX_DOCKER_CONFIG_BYTES:
                return None
            self.signature = signature
            data = read_small(config, MAX_DOCKER_CONFIG_BYTES, owner=self.owner)
            ended = docker_exit(data) if data else None
            if ended is None or ended.realtime_usec == self.exit_usec or ended.realtime_usec < since_usec:
                return None
            self.exit_usec = ended.realtime_usec
            return ended
        return None


def docker_names(data: bytes, container_id: str) -> _Names:
    """The names in a Docker `config.v2.json` (bytes) of container `container_id`."""
    document = json.loads(data)
    if not isinstance(document, dict):
        return _NOT_FOUND
    if document.get("ID", container_id) != container_id:
        return _NOT_FOUND  # another container's file
    name = document.get("Name")
    key = docker_key(name) if isinstance(name, str) else None
    if key is None:
        return _NOT_FOUND
    config = document.get("Config")
    labels = config.get("Labels") if isinstance(config, dict) else None
    if not isinstance(labels, dict):
        labels = {}
    return _Names(key, name.lstrip("/"), _label_value(labels.get(COMPOSE_PROJECT)),
                  _label_value(labels.get(COMPOSE_SERVICE)))


class StateTooLarge(ValueError):
    """A state file, or one entry of it, is over its size bound."""


def podman_names(data: bytes) -> dict[str, str]:
    """container id -> its first name, from a containers/storage `containers.json` (bytes)."""
    return podman_names_of_file(io.BytesIO(data), len(data))


def podman_names_of_file(stream: IO[bytes], limit: int = MAX_PODMAN_LIST_BYTES,
                         max_entry_bytes: int = MAX_PODMAN_ENTRY_BYTES) -> dict[str, str]:
    """container id -> its first name, from a containers/storage `containers.json`, parsed one container
    at a time: at most `limit` bytes read, `max_entry_bytes` of one container's entry held (StateTooLarge
    beyond either), at most MAX_PODMAN_NAMES names kept; none when it is no JSON array, ValueError when it is
    one cut short or holding what is not JSON."""
    names: dict[str, str] = {}
    for entry in _json_array_items(stream, limit, max_entry_bytes):
        if not isinstance(entry, dict):
            continue
        container_id, entry_names = entry.get("id"), entry.get("names")
        if not (isinstance(container_id, str) and _CONTAINER_ID.fullmatch(container_id)):
            continue
        if isinstance(entry_names, list) and entry_names and isinstance(entry_names[0], str):
            if len(names) < MAX_PODMAN_NAMES or container_id in names:
                names[container_id] = entry_names[0]
    return names


def _json_array_items(stream: IO[bytes], limit: int, max_item_bytes: int) -> Iterator[object]:
    """The items of the JSON array `stream` holds, one at a time; the text held is at most one item
    (`max_item_bytes`) and a chunk."""
    decoder = json.JSONDecoder()
    text = codecs.getincrementaldecoder("utf-8")()
    buffer, position, read, begun, at_end = "", 0, 0, False, False
    while True:
        if not at_end:
            chunk = stream.read(STATE_CHUNK_BYTES)
            read += len(chunk)
            if read > limit:
                raise StateTooLarge(f"more than {limit} bytes")
            at_end = not chunk
            buffer = buffer[position:] + text.decode(chunk, final=at_end)
            position = 0
        while True:
            while position < len(buffer) and buffer[position] in " \t\r\n":
                position += 1
            if position == len(buffer):
                break
            if not begun:
                if buffer[position] != "[":
                    return  # JSON of another shape (or none): no items
                begun = True
                position += 1
                continue
            if buffer[position] == "]":
                return
            if buffer[position] == ",":
                position += 1
                continue
            try:
                item, end = decoder.raw_decode(buffer, position)
            except json.JSONDecodeError:
                if at_end:
                    raise ValueError("a JSON array cut short") from None
                if len(buffer) - position > max_item_bytes:
                    raise StateTooLarge(f"an entry of more than {max_item_bytes} bytes") from None
                break  # the item goes on in the next chunk
            if end - position > max_item_bytes:
                raise StateTooLarge(f"an entry of more than {max_item_bytes} bytes")
            position = end
            yield item
        if at_end:
            raise ValueError("a JSON array cut short")


def _uid_of_link(path: str, namespace: str, pod: str, container: str) -> str | None:
    """The pod uid in a log symlink's target `.../<namespace>_<pod>_<uid>/<container>/N.log` (read, not
    followed: the target is a host path), None when it does not say."""
    try:
        target = os.readlink(path)
    except OSError:
        return None
    parts = target.rstrip("/").split("/")
    if len(parts) < 3 or parts[-2] != container:
        return None
    match = _POD_DIRECTORY.fullmatch(parts[-3])
    if match is None or match.group(1) != namespace or match.group(2) != pod:
        return None
    return match.group(3)


def _label_value(value: object) -> str:
    return value if isinstance(value, str) and _LABEL_VALUE.fullmatch(value) else ""


def _kind(container: ContainerCgroup) -> str:
    if container.pod_uid is not None:
        return KIND_KUBERNETES
    return KIND_PODMAN if container.engine == PODMAN else KIND_DOCKER


def distinct(paths: Iterable[str]) -> tuple[str, ...]:
    """The paths in their order, each once (a flag given twice reads its directory once)."""
    return tuple(dict.fromkeys(paths))
