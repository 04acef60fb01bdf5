"""Who wrote a container's journal record, from the fields journald itself adds: pure functions.

journald stamps every record with fields taken from the sender's kernel credentials and /proc entries
(`_UID`, `_COMM`, `_EXE`, `_SYSTEMD_UNIT`, ...); every other field (`CONTAINER_NAME`, `PODMAN_EVENT`,
`SYSLOG_IDENTIFIER`, ...) is whatever the sender wrote, and anyone who reaches the system journal (system
users, `nobody`, DynamicUser services; everyone on a volatile journal) can write them. So a record naming a
container is believed only when the trusted fields show it came from the engine:

- Docker (`docker/<name>`): dockerd, i.e. `_UID` 0 and `_SYSTEMD_UNIT` `docker.service` (only root puts a
  process into that unit's cgroup), `_COMM` `dockerd` and `_EXE` a `dockerd` in a system directory.
  Rootless Docker's dockerd (a user's `docker.service`) is not believed.
- Podman's lines: conmon, i.e. `_COMM` `conmon` and `_EXE` a `conmon` in a system directory, running as
  root (`podman/<name>`) or as a rootless user (`podman/<name>@uid<N>`: the user is part of the series'
  identity, so a user's conmon speaks only for that user's containers).
- Podman's `died` events: podman itself (`_COMM` `podman`, `_EXE` a `podman` in a system directory),
  with the same uid rule.

Why all of them: `_COMM` alone is the sender's own choice (`prctl(PR_SET_NAME)`), so it is checked with
`_EXE`, the executable the kernel ran, which only root can place in a system directory. Anyone may still
exec the real `/usr/bin/conmon` or `/usr/bin/podman`, hence the uid in the identity; and dockerd's
records must come from root in docker.service. Everything else is rejected and counted by reason
(`REJECTED_CONTAINER_SENDER`, `REJECTED_PODMAN_EVENT`; `xpu_exporter_journal_entries_rejected_total`).
"""

from __future__ import annotations

SYSTEM_DIRECTORIES = (b"/usr/bin/", b"/usr/sbin/", b"/bin/", b"/sbin/", b"/usr/local/bin/", b"/usr/local/sbin/",
                      b"/usr/libexec/podman/", b"/usr/lib/podman/", b"/usr/libexec/docker/")
"""Where the engines' executables are installed: directories only root can write to."""
DOCKER_SERVICE = b"docker.service"

REJECTED_CONTAINER_SENDER = "container_sender"
"""A record naming a watched container not written by that container's engine (dockerd, conmon)."""
REJECTED_PODMAN_EVENT = "podman_event"
"""A Podman ``died`` event of a watched container not written by podman."""
REJECTION_REASONS = (REJECTED_CONTAINER_SENDER, REJECTED_PODMAN_EVENT)


def system_executable(exe: bytes | None, name: bytes) -> bool:
    """Whether `_EXE` is the executable `name` in one of the SYSTEM_DIRECTORIES."""
    if exe is None:
        return False
    directory, slash, base = exe.rpartition(b"/")
    return bool(slash) and base == name and directory + b"/" in SYSTEM_DIRECTORIES


def uid_of(raw: bytes | None) -> int | None:
    return int(raw) if raw is not None and raw.isdigit() and len(raw) <= 10 else None


def is_dockerd(uid: bytes | None, comm: bytes | None, exe: bytes | None, systemd_unit: bytes | None) -> bool:
    """Whether a record was written by the system's dockerd (see the module's docstring)."""
    return (uid == b"0" and systemd_unit == DOCKER_SERVICE and comm == b"dockerd"
            and system_executable(exe, b"dockerd"))


def conmon_uid(uid: bytes | None, comm: bytes | None, exe: bytes | None) -> int | None:
    """The uid of the conmon that wrote a record (0: root's Podman), or None when conmon did not write it."""
    if comm != b"conmon" or not system_executable(exe, b"conmon"):
        return None
    return uid_of(uid)


def podman_uid(uid: bytes | None, comm: bytes | None, exe: bytes | None) -> int | None:
    """The uid of the podman that wrote an event (0: root's), or None when podman did not write it."""
    if comm != b"podman" or not system_executable(exe, b"podman"):
        return None
    return uid_of(uid)
