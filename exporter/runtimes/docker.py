"""Docker's facts, pure: its cgroups, its key, its state file, its log format, its end, its journald driver.

- Cgroups: with the systemd cgroup driver `/system.slice/docker-<id>.scope` (`SCOPE`), with cgroupfs
  `/docker/<id>`. A rootless dockerd's are below its user's `user@<uid>.service`.
- Key: `docker/<name>` (`docker_key`); a rootless user's container `docker/<name>@uid<N>`.
- State: `<root>/containers/<id>/config.v2.json` (`docker_names`: `Name`, `/<name>`, the labels Compose sets
  and the planner's `runtimes.PLAN_LABEL`; `docker_exit`: `State`, its end).
- Logs: the `json-file` driver (`<root>/containers/<id>/<id>-json.log`): one JSON object a line,
  `{"log":"<text>\\n","stream":"stdout","time":"2025-05-12T10:11:13.204051812Z"}` (an `attrs` object besides
  with the driver's `labels`/`env` options). dockerd cuts a line longer than 16 KiB into pieces; every piece but
  the last has no `\\n` at the end of its `log` (`parse_json_file_line`).
- journald: the `journald` log driver writes `CONTAINER_NAME`, `CONTAINER_ID_FULL` and `CONTAINER_LOG_EPOCH`
  (one a start); a record is believed only from the system's dockerd (`is_dockerd`).

Everything read is untrusted (a container's name and labels are chosen by whoever runs it; a file may be damaged):
each function returns None (or no names) for what Docker itself would not write, and never raises but ValueError
for a file that is not JSON (`docker_names`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

from vllm_xpu_exporter.parsers.workloads import user_suffix
from vllm_xpu_exporter.runtimes import (CONTAINER_ID, ID, MAX_TEXT_CHARS, NOT_FOUND, PLAN_LABEL, ContainerCgroup,
                                        ContainerExit, JournalDriver, LogRecord, Names, container_name_ok,
                                        parse_rfc3339_usec, plan_bytes, system_executable)

KIND = "docker"
ENGINE = "docker"
SCOPE = re.compile(rf"docker-{ID}\.scope")
CGROUPFS_PARENT = "docker"

MAX_CONFIG_BYTES = 1 << 20
"""A config.v2.json is a few KiB (its environment and labels), parsed whole: 1 MiB of JSON makes at most ~25 MB
of Python objects."""
CONFIG = "config.v2.json"

COMPOSE_PROJECT = "com.docker.compose.project"
COMPOSE_SERVICE = "com.docker.compose.service"
# Compose's project names are [a-z0-9][a-z0-9_-]*, its service names [a-zA-Z0-9._-]+; these labels can be
# set by hand to anything, so anything else is left out.
_LABEL_VALUE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,252}")

_STREAMS = {b"stdout": "stdout", b"stderr": "stderr"}

DOCKERD_DIRECTORIES = (b"/usr/libexec/docker/",)
DOCKER_SERVICE = b"docker.service"


def container_of_scope(elements: Sequence[str], index: int) -> ContainerCgroup | None:
    match = SCOPE.fullmatch(elements[index])
    return None if match is None else ContainerCgroup(ENGINE, match.group(1))


def container_of_cgroupfs(elements: Sequence[str], index: int) -> ContainerCgroup | None:
    if elements[index - 1] == CGROUPFS_PARENT and (match := CONTAINER_ID.fullmatch(elements[index])):
        return ContainerCgroup(ENGINE, match.group(0))
    return None


def names_container(container: ContainerCgroup) -> bool:
    return container.engine == ENGINE and container.pod_uid is None


def docker_key(name: str, uid: int = 0) -> str | None:
    """`docker/<name>` for a Docker container's name (a leading `/`, as in config.v2.json's `Name` and the API,
    is dropped; `@uid<N>` after it for user N's rootless dockerd), or None when it is not a name Docker accepts."""
    if not isinstance(name, str):
        return None
    name = name[1:] if name.startswith("/") else name
    return f"{KIND}/{name}{user_suffix(uid)}" if container_name_ok(name) else None


def docker_names(data: bytes, container_id: str) -> Names:
    """The names in a Docker `config.v2.json` (bytes) of container `container_id`; ValueError when not JSON."""
    document = json.loads(data)
    if not isinstance(document, dict):
        return NOT_FOUND
    if document.get("ID", container_id) != container_id:
        return NOT_FOUND  # another container's file
    name = document.get("Name")
    key = docker_key(name) if isinstance(name, str) else None
    if key is None:
        return NOT_FOUND
    config = document.get("Config")
    labels = config.get("Labels") if isinstance(config, dict) else None
    if not isinstance(labels, dict):
        labels = {}
    return Names(key, name.lstrip("/"), _label_value(labels.get(COMPOSE_PROJECT)),
                 _label_value(labels.get(COMPOSE_SERVICE)), command=_recorded_command(config),
                 plan_kv_cache_bytes=plan_bytes(labels.get(PLAN_LABEL)))


def docker_exit(data: bytes) -> ContainerExit | None:
    """The end of a Docker container that is not running (`State.Running` false and `FinishedAt` after
    `StartedAt`), from its `config.v2.json` (bytes): when its process ended, and whether `docker stop` ended it
    (`HasBeenManuallyStopped`); None while it runs, before it ever ended, or for anything that is not such a
    file."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        return None
    state = document.get("State") if isinstance(document, dict) else None
    if not isinstance(state, dict) or state.get("Running") is not False or state.get("Restarting") is True:
        return None
    started, finished = state.get("StartedAt"), state.get("FinishedAt")
    if not (isinstance(started, str) and isinstance(finished, str)):
        return None
    started_usec = parse_rfc3339_usec(started.encode("ascii", "replace"))
    finished_usec = parse_rfc3339_usec(finished.encode("ascii", "replace"))
    if started_usec is None or finished_usec is None or finished_usec < started_usec:
        return None
    return ContainerExit(finished_usec, document.get("HasBeenManuallyStopped") is True)


def parse_json_file_line(line: bytes, max_chars: int = MAX_TEXT_CHARS) -> LogRecord | None:
    """A record of Docker's json-file log (one line, without its newline), or None; its text cut at
    `max_chars` characters."""
    try:
        document = json.loads(line)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if not isinstance(document, dict):
        return None
    text, stream, when = document.get("log"), document.get("stream"), document.get("time")
    if not (isinstance(text, str) and isinstance(stream, str) and isinstance(when, str)):
        return None
    realtime = parse_rfc3339_usec(when.encode("ascii", "replace"))
    stream_name = _STREAMS.get(stream.encode("ascii", "replace"))
    if realtime is None or stream_name is None:
        return None
    partial = not text.endswith("\n")
    if not partial:
        text = text[:-1].rstrip("\r")  # a TTY's output ends in \r\n
    return LogRecord(realtime, stream_name, text[:max_chars], partial)


def rotated_files(live: str, siblings: Sequence[str]) -> list[str]:
    """dockerd's rotated files of `live` among `siblings`, oldest first: `live.N[.gz]`, the highest N the
    oldest; of a plain and a gzipped `.N` (dockerd gzips `.1` after a rotation, then removes it), the plain."""
    numbered: dict[int, str] = {}
    for path in siblings:
        suffix = path[len(live) + 1:]
        number = suffix[:-3] if suffix.endswith(".gz") else suffix
        if number.isdigit() and len(number) <= 9 and (int(number) not in numbered or not path.endswith(".gz")):
            numbered[int(number)] = path
    return [numbered[number] for number in sorted(numbered, reverse=True)]


def is_dockerd(uid: bytes | None, comm: bytes | None, exe: bytes | None, systemd_unit: bytes | None) -> bool:
    """Whether a record was written by the system's dockerd: `_UID` 0 and `_SYSTEMD_UNIT` `docker.service`
    (only root puts a process into that unit's cgroup), `_COMM` `dockerd` and `_EXE` a `dockerd` in a system
    directory. A rootless dockerd (a user's `docker.service`) is not believed."""
    return (uid == b"0" and systemd_unit == DOCKER_SERVICE and comm == b"dockerd"
            and system_executable(exe, b"dockerd", DOCKERD_DIRECTORIES))


def _journal_writer(uid: bytes | None, comm: bytes | None, exe: bytes | None,
                    systemd_unit: bytes | None) -> int | None:
    return 0 if is_dockerd(uid, comm, exe, systemd_unit) else None


def _journal_run(field: Callable[[bytes], bytes | None], pid: int | None) -> str:
    """The container's id (`CONTAINER_ID_FULL`, else the short `CONTAINER_ID`), with its log epoch: one a start."""
    run = (field(b"CONTAINER_ID_FULL") or field(b"CONTAINER_ID") or b"").decode("ascii", "replace")
    epoch = field(b"CONTAINER_LOG_EPOCH")
    return run if epoch is None else f"{run}/{epoch.decode('ascii', 'replace')}"


JOURNAL = JournalDriver(writer=_journal_writer, key=docker_key, run=_journal_run)


def _recorded_command(config: object) -> tuple[str, ...]:
    """`Config.Entrypoint` then `Config.Cmd` (each absent, null or a list of strings); () for anything else."""
    if not isinstance(config, dict):
        return ()
    parts = [config.get(part) for part in ("Entrypoint", "Cmd")]
    if not all(part is None or (isinstance(part, list) and all(isinstance(word, str) for word in part))
               for part in parts):
        return ()
    return tuple(word for part in parts if part for word in part)


def _label_value(value: object) -> str:
    return value if isinstance(value, str) and _LABEL_VALUE.fullmatch(value) else ""
