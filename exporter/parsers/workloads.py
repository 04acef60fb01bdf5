"""The `unit` label of a workload: pure functions, shared by the processes collector (who holds the GPU, from
/proc/PID/cgroup) and the journal side (what a container printed), so that memory and KV figures of one workload
join on `unit`.

A systemd unit keeps its own name (`vllm-xpu-chat.service`). A container's key names its runtime and the names
people know it by: `<kind>/<name>` (`docker/<name>`, `podman/<name>`, `k8s/<namespace>/<pod>/<container>`; each
runtime builds its own, `vllm_xpu_exporter.runtimes`), a rootless user's container `<kind>/<name>@uid<N>`.

A unit of a user's service manager (`systemctl --user`, its cgroup below `user@<N>.service`) is
`<unit>@uid<N>` (`user_unit`): never the system unit of the same name, and never matched by a glob written for
system units (`vllm*.service`). A unit name holds at most one `@` and ends in its type's suffix, so no system
unit is ever named so; and `@` is not in a container name either.

A `/` never occurs in a systemd unit name, so a key can never be mistaken for a unit.

Names are untrusted: whoever runs a container chooses its name. A runtime accepts only what it accepts itself
(`vllm_xpu_exporter.runtimes.container_name_ok`; Kubernetes' DNS-1123 labels and subdomains), at most
`MAX_NAME_LENGTH` characters a name, and gives no key otherwise: the caller then keeps what it had (the cgroup's
last element). So a key never holds a quote, a newline, a space or a `/` of its own, and stays short.
"""

from __future__ import annotations

KIND_SYSTEMD = "systemd"
"""The `kind` of a workload that is a systemd unit (the `kind` label of xpu_workload_info); a container's is its
runtime's."""

# Docker names are unbounded; a label value need not be. Kubernetes pod names reach 253.
MAX_NAME_LENGTH = 253

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
