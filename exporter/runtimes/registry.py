"""The container runtimes the exporter knows: one row each, its facts and its state (``vllm_xpu_exporter.runtimes``).

Rows are asked in order, and the first that names a container wins: the kubelet's pods come first, since a pod's
container is the pod's whichever engine runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_xpu_exporter.parsers.workloads import KIND_SYSTEMD
from vllm_xpu_exporter.runtimes import ContainerCgroup, RuntimeFacts, RuntimeState
from vllm_xpu_exporter.runtimes import docker, docker_state, podman, podman_state, pods, pods_state


@dataclass(frozen=True)
class Runtime:
    """A runtime's row: its facts (pure) and its state (I/O)."""

    facts: RuntimeFacts
    state: RuntimeState

    @property
    def kind(self) -> str:
        return self.facts.KIND


RUNTIMES: tuple[Runtime, ...] = (
    Runtime(pods, pods_state),
    Runtime(docker, docker_state),
    Runtime(podman, podman_state),
)


def runtime_of(container: ContainerCgroup) -> Runtime | None:
    """The runtime that names this container."""
    return next((runtime for runtime in RUNTIMES if runtime.facts.names_container(container)), None)


def runtime_of_key(key: str) -> Runtime | None:
    """The runtime of a container's key (`docker/<name>`: Docker), None for a unit's name."""
    kind, slash, _ = key.partition("/")
    return next((runtime for runtime in RUNTIMES if runtime.kind == kind), None) if slash else None


def kind_of_key(unit: str) -> str:
    """The kind of a `unit` label value: its runtime's kind for a container's key, else `systemd` (a unit name,
    or a cgroup leaf standing in for one)."""
    runtime = runtime_of_key(unit)
    return KIND_SYSTEMD if runtime is None else runtime.kind


def default_locations() -> dict[str, object]:
    """Where the runtimes' state is by default: ContainerNames' keyword arguments."""
    return {name: default for runtime in RUNTIMES for name, default in runtime.state.LOCATIONS.items()}
