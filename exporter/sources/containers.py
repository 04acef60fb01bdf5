"""The names of the containers that hold the GPU, read-only from the container runtimes' state on disk: no
Docker socket, no API, no gRPC.

A process's cgroup says which engine runs its container, the container's id and, for a pod's container, the
pod's uid (`vllm_xpu_exporter.runtimes.ContainerCgroup`). `ContainerNames.workload` turns that into a `Workload`:
the `unit` label value (the runtime's key: `docker/<name>`, `podman/<name>`, `k8s/<namespace>/<pod>/<container>`)
and the details of `xpu_workload_info`. Which runtime names a container, and where its state is, is the
runtimes' (`vllm_xpu_exporter.runtimes.registry`): each row's `names` reads its own state files, under the
locations given as ContainerNames' keyword arguments (each runtime's `LOCATIONS`, with their defaults).
`key_of_cgroup_path` is the whole way from a cgroup path to its workload's `unit`.

Those files are untrusted input (a container's name and labels are chosen by whoever runs it; a path flag may
point anywhere): a file that is missing, not a regular file, larger than its bound, unreadable, not JSON or
not of the expected shape, or a name the engine itself would refuse, gives no name, never an exception, and
the workload keeps its cgroup leaf as `unit`. What is found is kept per container for REFRESH_SECONDS (a
renamed Docker container shows its new name within that), at most MAX_CACHED containers; a container not
found is looked up again after the same time.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from vllm_xpu_exporter.parsers.cgroup import unit_cgroup_of_path
from vllm_xpu_exporter.parsers.workloads import KIND_SYSTEMD, user_suffix
from vllm_xpu_exporter.runtimes import NOT_FOUND, ContainerCgroup, Names
from vllm_xpu_exporter.runtimes.files import StateFiles
from vllm_xpu_exporter.runtimes.registry import Runtime, default_locations, runtime_of

log = logging.getLogger("vllm_xpu_exporter.containers")

REFRESH_SECONDS = 60.0
MAX_CACHED = 4096

# The labels of xpu_workload_info, in the order of Workload's fields.
INFO_LABELS = ("unit", "kind", "container_id", "container", "compose_project", "compose_service", "namespace",
               "pod", "pod_uid")


@dataclass(frozen=True)
class Workload:
    """Who holds the GPU: `unit`, the label value of every per-unit series (a systemd unit's name, a
    container's key, or the cgroup's leaf when a container's names are not found); `kind`: `systemd` or the
    container's runtime's (`docker`, `podman`, `k8s`: what the cgroup says, found names or not); the rest as
    found, empty where they do not apply or are not known."""

    unit: str
    kind: str = KIND_SYSTEMD
    container_id: str = ""
    container: str = ""
    compose_project: str = ""
    compose_service: str = ""
    namespace: str = ""
    pod: str = ""
    pod_uid: str = ""
    plan_kv_cache_bytes: int | None = None  # the planner's budget in the engine's record of the container (no label)

    def labels(self) -> list[str]:
        """The label values of xpu_workload_info, in INFO_LABELS' order."""
        return [self.unit, self.kind, self.container_id, self.container, self.compose_project, self.compose_service,
                self.namespace, self.pod, self.pod_uid]


class ContainerNames:
    """Names of containers by their cgroup's `ContainerCgroup`, from the runtimes' state (see the module's
    docstring); `locations`: where each runtime's state is (its `LOCATIONS`' keywords: `docker_roots`,
    `podman_storages`, `pod_logs`, `container_logs`), the defaults for those not given. Called from scrapes,
    which are serial; not thread-safe."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, refresh_seconds: float = REFRESH_SECONDS,
                 max_cached: int = MAX_CACHED, **locations: object) -> None:
        defaults = default_locations()
        unknown = set(locations) - set(defaults)
        if unknown:
            raise TypeError(f"no container runtime's state is at {', '.join(sorted(unknown))}")
        self.locations = {**defaults, **{name: _tuple_of(value) for name, value in locations.items()}}
        self._clock = clock
        self._refresh = refresh_seconds
        self._max_cached = max_cached
        self._cache: OrderedDict[ContainerCgroup, tuple[float, Names]] = OrderedDict()
        self._files = StateFiles()

    @property
    def cut(self) -> int:
        """State files not read because they, or one container's entry in them, are over their size bound
        (`xpu_exporter_container_state_files_cut_total`)."""
        return self._files.cut_files

    def workload(self, unit: str, container: ContainerCgroup | None) -> Workload:
        """The workload of cgroup leaf `unit` (`UnitCgroup.unit`) and its container (None: a systemd unit
        or a cgroup that is no container's, which keep their name). Never raises for what is on disk."""
        runtime = None if container is None else runtime_of(container)
        if container is None or runtime is None:
            return Workload(unit)
        names = self._names(container, runtime)
        key = names.key and names.key + user_suffix(container.uid)  # a rootless user's: never root's
        return Workload(key or unit, runtime.kind, container.id, names.container, names.compose_project,
                        names.compose_service, names.namespace, names.pod, container.pod_uid or "",
                        names.plan_kv_cache_bytes if key else None)

    def recorded_command(self, container: ContainerCgroup) -> tuple[str, ...]:
        """The command root's engine recorded for `container` when it was created (`Names.command`); () when
        its state keeps none, and for a rootless user's container, whose state is that user's to write."""
        runtime = runtime_of(container)
        if runtime is None or container.uid != 0:
            return ()
        return self._names(container, runtime).command

    def key_of_cgroup_path(self, path: str) -> str | None:
        """The `unit` label of the workload whose cgroup path (as /proc/PID/cgroup gives it) this is: a systemd
        unit's name, a container's key, or the cgroup's leaf when its names are not found; None for `/`."""
        unit_cgroup = unit_cgroup_of_path(path)
        return None if unit_cgroup is None else self.workload(unit_cgroup.unit, unit_cgroup.container).unit

    def _names(self, container: ContainerCgroup, runtime: Runtime) -> Names:
        now = self._clock()
        cached = self._cache.get(container)
        if cached is not None and now < cached[0]:
            self._cache.move_to_end(container)
            return cached[1]
        try:
            names = runtime.state.names(container, self._files, self.locations)
        except (OSError, ValueError, TypeError, RecursionError, MemoryError) as error:  # hostile or broken state
            log.debug("no names for container %s: %s", container.id, error)
            names = NOT_FOUND
        self._cache[container] = (now + self._refresh, names)
        self._cache.move_to_end(container)
        while len(self._cache) > self._max_cached:
            self._cache.popitem(last=False)
        return names


def _tuple_of(value: object) -> object:
    """A location given as a list (a repeatable flag's) as a tuple; a single path as it is."""
    return tuple(value) if isinstance(value, (list, tuple)) else value


def distinct(paths: Iterable[str]) -> tuple[str, ...]:
    """The paths in their order, each once (a flag given twice reads its directory once)."""
    return tuple(dict.fromkeys(paths))
