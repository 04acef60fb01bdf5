"""The command a watched container runs, as its engine keeps it, for the planner's container outputs
(`vllm-xpu-plan --format compose|podman`, vllm_xpu_exporter.planner.containers).

- Docker: `containers/<id>/config.v2.json` of a data root (`--path.docker`), the one whose `Name` is the
  container's and whose owner is the container's user (root's dockerd writes root's; a rootless dockerd its
  user's): `Config.Cmd` (what Compose's `command:` sets), `Config.Entrypoint`, and the Compose labels (project,
  service, the files and directory of the project). Only the planner's own user's containers: the labels of a
  rootless user's container name files that user chose.
- Podman: the command that created the container, `podman container inspect`'s `Config.CreateCommand` (Podman
  4.3 keeps it in its database only), asked of the given podman as the user running the planner, so only for
  that user's containers (root's `podman/NAME`, or `podman/NAME@uid<N>` when the planner runs as N).

A container whose command cannot be read is returned as the reason, never guessed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from vllm_xpu_exporter.parsers.workloads import USER_SUFFIX, uid_of_identity
from vllm_xpu_exporter.runtimes.docker import CONFIG, MAX_CONFIG_BYTES
from vllm_xpu_exporter.runtimes.files import read_small

COMPOSE_PROJECT = "com.docker.compose.project"
COMPOSE_SERVICE = "com.docker.compose.service"
COMPOSE_FILES = "com.docker.compose.project.config_files"  # comma-separated, as Compose 1.29 and 2 write it
COMPOSE_DIRECTORY = "com.docker.compose.project.working_dir"
PODMAN_TIMEOUT_S = 30.0
MAX_CONTAINERS_SCANNED = 4096


@dataclass(frozen=True)
class ContainerCommand:
    """A container's command as its engine keeps it (`runtime`: docker or podman)."""

    key: str
    runtime: str
    name: str
    cmd: tuple[str, ...] = ()  # Docker: Config.Cmd
    entrypoint: tuple[str, ...] = ()  # Docker: Config.Entrypoint
    compose_project: str = ""
    compose_service: str = ""
    compose_files: tuple[str, ...] = ()
    compose_directory: str = ""
    create_command: tuple[str, ...] = ()  # Podman: the command line that created it


def runtime_of_key(key: str) -> str:
    """The runtime of a workload's key: `docker`, `podman`, `k8s` (its first part), `systemd` for a unit."""
    runtime, slash, _ = key.partition("/")
    return runtime if slash else "systemd"


def is_container(key: str) -> bool:
    return runtime_of_key(key) != "systemd"


def runtime_and_name(key: str) -> tuple[str, str, int] | None:
    """(runtime, container name, uid) of a `docker/NAME[@uidN]` or `podman/NAME[@uidN]` key; None otherwise."""
    runtime, slash, rest = key.partition("/")
    if not slash or runtime not in ("docker", "podman") or "/" in rest:
        return None
    name, at, _ = rest.partition(USER_SUFFIX)
    return (runtime, name, uid_of_identity(key)) if name else None


def _strings(value: object) -> tuple[str, ...] | None:
    if value is None:
        return ()
    if isinstance(value, list) and all(isinstance(word, str) for word in value):
        return tuple(value)
    return None


def docker_command_of_config(data: bytes, name: str) -> ContainerCommand | str:
    """The command in a Docker `config.v2.json` (bytes) of container `name`; a reason when it is not its file or
    holds no command. ValueError when it is not JSON."""
    document = json.loads(data)
    if not isinstance(document, dict) or document.get("Name") not in (name, f"/{name}"):
        return "not its config.v2.json"
    config = document.get("Config")
    if not isinstance(config, dict):
        return "its config.v2.json has no Config"
    cmd, entrypoint = _strings(config.get("Cmd")), _strings(config.get("Entrypoint"))
    labels = config.get("Labels") if isinstance(config.get("Labels"), dict) else {}
    if cmd is None or entrypoint is None or not (cmd or entrypoint):
        return "its config.v2.json holds no command"

    def label(name: str) -> str:
        value = labels.get(name)
        return value if isinstance(value, str) else ""

    files = tuple(path for path in label(COMPOSE_FILES).split(",") if path)
    return ContainerCommand(key="", runtime="docker", name=name, cmd=cmd, entrypoint=entrypoint,
                            compose_project=label(COMPOSE_PROJECT), compose_service=label(COMPOSE_SERVICE),
                            compose_files=files, compose_directory=label(COMPOSE_DIRECTORY))


def _own_container(key: str, runtime: str) -> tuple[str, int] | str:
    """(name, uid) of `runtime`'s container `key` when it is the planner's own user's, else why not. Another user's
    is not read: its state is that user's to write (a Compose container's labels name the files the planner would
    load), never root's to follow."""
    parsed = runtime_and_name(key)
    if parsed is None or parsed[0] != runtime:
        return f"not a {runtime} container's key"
    _, name, uid = parsed
    if uid != os.geteuid():
        return f"a container of uid {uid}: run the planner as that user to plan it"
    return name, uid


def docker_command(key: str, roots: Sequence[str]) -> ContainerCommand | str:
    """Docker container `key`'s command from the first data root holding a config.v2.json of that name owned by
    the container's user; a reason when none does."""
    own = _own_container(key, "docker")
    if isinstance(own, str):
        return own
    name, uid = own
    for root in roots:
        directory = os.path.join(root, "containers")
        try:
            with os.scandir(directory) as entries:
                ids = [entry.name for _, entry in zip(range(MAX_CONTAINERS_SCANNED), entries)]
        except OSError:
            continue
        for container_id in ids:
            data = read_small(os.path.join(directory, container_id, CONFIG), MAX_CONFIG_BYTES, owner=uid)
            if not data:
                continue
            try:
                found = docker_command_of_config(data, name)
            except (ValueError, RecursionError):
                continue
            if isinstance(found, ContainerCommand):
                return ContainerCommand(**{**found.__dict__, "key": key})
    return f"no config.v2.json of container {name} owned by uid {uid} under {', '.join(roots) or 'no data root'}"


def podman_command(key: str, podman: str) -> ContainerCommand | str:
    """Podman container `key`'s create command from `podman container inspect` (as this user); a reason when it
    cannot be had."""
    own = _own_container(key, "podman")
    if isinstance(own, str):
        return own
    name, _ = own
    try:
        completed = subprocess.run([podman, "container", "inspect", "--format", "{{json .Config.CreateCommand}}",
                                    "--", name], capture_output=True, text=True, timeout=PODMAN_TIMEOUT_S,
                                   check=False)
    except (OSError, subprocess.SubprocessError) as error:
        return f"{podman} container inspect could not run ({error})"
    if completed.returncode != 0:
        return f"{podman} container inspect {name} failed: {' '.join(completed.stderr.split())[:300]}"
    try:
        words = _strings(json.loads(completed.stdout))
    except ValueError:
        words = None
    if not words:
        return f"podman keeps no create command of {name} (made by podman kube play, or by the API)"
    return ContainerCommand(key=key, runtime="podman", name=name, create_command=words)
