"""The `unit` label of a workload that is a container or a pod's container: pure functions, shared by the
processes collector (who holds the GPU, from /proc/PID/cgroup) and the journal side (what a container
printed), so that memory and KV figures of one container join on `unit`.

A systemd unit keeps its own name (`vllm-xpu-chat.service`). A container's key names its engine and the
names people know it by:

- Docker: `docker/<name>` (`docker_key`),
- Podman: `podman/<name>` (`podman_key`); a rootless user's container `podman/<name>@uid<N>`,
- a Kubernetes pod's container: `k8s/<namespace>/<pod>/<container>` (`kubernetes_key`).

A unit of a user's service manager (`systemctl --user`, its cgroup below `user@<N>.service`) is
`<unit>@uid<N>` (`user_unit`): never the system unit of the same name, and never matched by a glob written for
system units (`vllm*.service`). A unit name holds at most one `@` and ends in its type's suffix, so no system
unit is ever named so; and `@` is not in a container name either.

A `/` never occurs in a systemd unit name, so a key can never be mistaken for a unit, and
`kind_of_key` tells the two apart.

Names are untrusted: whoever runs a container chooses its name. Each function accepts only what its
engine accepts itself (Docker's and Podman's `[a-zA-Z0-9][a-zA-Z0-9_.-]*`, Kubernetes' DNS-1123 labels
and subdomains), at most `MAX_NAME_LENGTH` characters a name, and returns None otherwise: the caller then
keeps what it had (the cgroup's last element, as before). So a key never holds a quote, a newline, a
space or a `/` of its own, and stays short.

This API is stable: other modules build keys only through these functions.
"""

from __future__ import annotations

import re

# The `kind` of a workload (the `kind` label of xpu_workload_info).
KIND_SYSTEMD = "systemd"
KIND_DOCKER = "docker"
KIND_PODMAN = "podman"
KIND_KUBERNETES = "k8s"

# Docker names are unbounded; a label value need not be. Kubernetes pod names reach 253.
MAX_NAME_LENGTH = 253

_CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def docker_key(name: str) -> str | None:
    """`docker/<name>` for a Docker container's name (a leading `/`, as in config.v2.json's `Name` and
    the API, is dropped), or None when it is not a name Docker accepts."""
    if not isinstance(name, str):
        return None
    name = name[1:] if name.startswith("/") else name
    return f"{KIND_DOCKER}/{name}" if _container_name_ok(name) else None


def podman_key(name: str, uid: int = 0) -> str | None:
    """`podman/<name>` for a Podman container's name (root's), `podman/<name>@uid<N>` for one of user N's
    (rootless) Podman, or None when it is not a name Podman accepts."""
    if not isinstance(name, str):
        return None
    return f"{KIND_PODMAN}/{name}{user_suffix(uid)}" if _container_name_ok(name) else None


USER_SUFFIX = "@uid"


def user_suffix(uid: int | None) -> str:
    """What ends the identity of a user's unit or rootless container: '' for root's (None, 0)."""
    return f"{USER_SUFFIX}{uid}" if uid else ""


def user_unit(unit: str, uid: int | None) -> str:
    """The identity of a unit user `uid`'s service manager runs: `<unit>@uid<N>` (the unit itself for 0/None)."""
    return unit + user_suffix(uid)


def name_of_key(key: str) -> str:
    """A container key's container name (the last element, without a rootless user's suffix)."""
    name = key.rsplit("/", 1)[-1]
    base, at, uid = name.rpartition(USER_SUFFIX)
    return base if at and uid.isdigit() else name


def uid_of_identity(unit: str) -> int:
    """The user a unit or container identity belongs to (its `@uid<N>` suffix); 0: the system's."""
    _, at, uid = unit.rpartition(USER_SUFFIX)
    return int(uid) if at and uid.isdigit() else 0


def kubernetes_key(namespace: str, pod: str, container: str) -> str | None:
    """`k8s/<namespace>/<pod>/<container>` for a container of a pod, or None unless the namespace and the
    container are DNS-1123 labels (at most 63 characters) and the pod a DNS-1123 subdomain (253)."""
    if not all(isinstance(part, str) for part in (namespace, pod, container)):
        return None
    if not (_dns_label_ok(namespace) and _dns_label_ok(container)):
        return None
    if len(pod) > MAX_NAME_LENGTH or not _DNS_SUBDOMAIN.fullmatch(pod):
        return None
    return f"{KIND_KUBERNETES}/{namespace}/{pod}/{container}"


def kind_of_key(unit: str) -> str:
    """The kind of a `unit` label value: `docker`, `podman` or `k8s` for the keys above, else `systemd`
    (a unit name, or a cgroup leaf standing in for one)."""
    kind, slash, _ = unit.partition("/")
    if slash and kind in (KIND_DOCKER, KIND_PODMAN, KIND_KUBERNETES):
        return kind
    return KIND_SYSTEMD


def _container_name_ok(name: str) -> bool:
    return 0 < len(name) <= MAX_NAME_LENGTH and _CONTAINER_NAME.fullmatch(name) is not None


def _dns_label_ok(name: str) -> bool:
    return 0 < len(name) <= 63 and _DNS_LABEL.fullmatch(name) is not None
