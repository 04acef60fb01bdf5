"""Container runtimes behind one seam: what each runtime is, and where its state and logs are.

A runtime is two modules and one row of ``registry.RUNTIMES``:

- its facts (``docker``, ``podman``, ``pods``): pure functions and tables, the ``RuntimeFacts`` protocol: how its
  containers' cgroups are named (``container_of_scope``, ``container_of_cgroupfs``), which containers it names
  (``names_container``), its key (the ``unit`` label, ``docker/<name>``), the formats of its state and
  log files, how its end is told, and whom journald's trusted fields show as its writer (``JOURNAL``);
- its state (``docker_state``, ``podman_state``, ``pods_state``): the ``RuntimeState`` protocol, the I/O: where
  its state is on disk (``LOCATIONS``: the keyword arguments of ``ContainerNames``, with their defaults), a
  container's names from it (``names``), its containers' log files (``log_finder``) and where its end is read
  (``exit_watch``).

The generic code (``parsers.cgroup``, ``sources.containers``, ``sources.containerlogs``, the journal's decoder,
matches and container ends) asks the registry's rows and never names a runtime. This module holds what the
runtimes share: the protocol, the container id (``CONTAINER_ID``, written here once), and the types they hand on.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from vllm_xpu_exporter.parsers.workloads import MAX_NAME_LENGTH

ID = r"([0-9a-f]{64})"
"""A container's id (64 lower-case hex digits) as a group of a larger pattern."""
CONTAINER_ID = re.compile(ID)
"""A container's id alone (``CONTAINER_ID.fullmatch``)."""

_CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")

MAX_TEXT_CHARS = 64 * 1024
"""A log record's text is cut at this many characters by default."""

SYSTEM_DIRECTORIES = (b"/usr/bin/", b"/usr/sbin/", b"/bin/", b"/sbin/", b"/usr/local/bin/", b"/usr/local/sbin/")
"""Where executables are installed: directories only root can write to (a runtime adds its own libexec)."""


PLAN_LABEL = "io.vllm-xpu.plan.kv-cache-memory-bytes"
"""The label (Docker, Compose) or annotation (Podman) vllm-xpu-plan's container outputs give a container: its
planned KV budget in bytes, as the engine recorded it when root created the container (docs/containers.md, "The
plan: the engine's record of the container")."""
_MAX_PLAN_DIGITS = 20


def plan_bytes(value: object) -> int | None:
    """A PLAN_LABEL's value as a byte count; None when it is not a positive decimal integer."""
    if not (isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= _MAX_PLAN_DIGITS):
        return None
    return int(value) or None


class StateTooLarge(ValueError):
    """A state file, or one entry of it, is over its size bound."""


def system_executable(exe: bytes | None, name: bytes, directories: tuple[bytes, ...] = ()) -> bool:
    """Whether journald's `_EXE` is the executable `name` in one of the SYSTEM_DIRECTORIES or `directories`."""
    if exe is None:
        return False
    directory, slash, base = exe.rpartition(b"/")
    return bool(slash) and base == name and (directory + b"/" in SYSTEM_DIRECTORIES
                                             or directory + b"/" in directories)


def container_name_ok(name: str) -> bool:
    """Whether `name` is a container name as Docker and Podman accept them (`[a-zA-Z0-9][a-zA-Z0-9_.-]*`), of
    at most MAX_NAME_LENGTH characters."""
    return 0 < len(name) <= MAX_NAME_LENGTH and _CONTAINER_NAME.fullmatch(name) is not None


def uid_of(raw: bytes | None) -> int | None:
    """journald's `_UID` as a number, None when absent or not one."""
    return int(raw) if raw is not None and raw.isdigit() and len(raw) <= 10 else None


@dataclass(frozen=True)
class ContainerCgroup:
    """A container as its cgroup names it: the `engine` that runs it (as the cgroup names it: `docker`, `podman`,
    `containerd`, `crio`), its id (64 lower-case hex digits) and, for a pod's container, the pod's uid (as the
    API shows it: with `-`)."""

    engine: str
    id: str
    pod_uid: str | None = None
    uid: int = 0
    """The user whose service manager runs the container (rootless: below `user@<uid>.service`); 0: the system's."""


@dataclass(frozen=True)
class Names:
    """What a runtime's state on disk says of one container (no key: not found)."""

    key: str | None = None
    container: str = ""
    compose_project: str = ""
    compose_service: str = ""
    namespace: str = ""
    pod: str = ""
    command: tuple[str, ...] = ()
    """The command the container runs as its engine recorded it at its creation (Docker: Entrypoint, then
    Cmd; Podman: its OCI configuration's process.args); () when the state keeps none this module reads."""
    plan_kv_cache_bytes: int | None = None
    """The KV budget of the planner's PLAN_LABEL in the engine's record of the container's creation; None: none."""


NOT_FOUND = Names()


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record of a container's log file."""

    realtime_usec: int  # the engine's time of the line (microseconds since the epoch, UTC)
    stream: str  # stdout or stderr
    text: str  # the line, without its newline (a piece: as it was cut)
    partial: bool  # a piece: the line goes on in the stream's next record


@dataclass(frozen=True, slots=True)
class ContainerExit:
    """A container's end, as its runtime's state says it: when its process ended, and whether it was stopped
    (`docker stop`: nothing counts) rather than its process exiting."""

    realtime_usec: int
    stopped: bool


class ExitWatch(Protocol):
    """Where one container's end is read, again and again: `ended()` is the end not handed on yet."""

    def ended(self, since_usec: int = 0) -> ContainerExit | None: ...


@dataclass
class LogStream:
    """One log file of a container as its runtime lays it out."""

    live: str  # the file being written
    rotated: Callable[[], list[str]]  # its rotated predecessors, oldest first
    run: str  # the container's run its records are of (`LogEntry.container_run`)
    parse: Callable[[bytes, int], LogRecord | None]  # one physical line (and the text's cap) into a record
    order: tuple[int, int] = (0, 0)  # among the container's files: restart count, or when created
    end: ExitWatch | None = None  # where the container's end is read, if its state says it


@dataclass
class LoggedContainer:
    """A container found in a runtime's log directories: its key and name, its directory (gone: the container
    is), and its log files found now (already followed ones may be left out)."""

    key: str
    name: str
    directory: str
    streams: list[LogStream]


class LogFinder(Protocol):
    """A runtime's containers' log files under the directories it was made for; keeps what it caches."""

    def directories(self) -> list[str]:
        """The directories that must be readable when the reader opens."""
        ...

    def find(self, followed: Mapping[str, str]) -> Iterator[LoggedContainer]:
        """The containers there now; `followed`: live paths already followed -> their container's key."""
        ...


class StateFiles(Protocol):
    """The bounded, cached reads of state files a runtime's `names` makes (``runtimes.files.StateFiles``)."""

    def read(self, path: str, limit: int, root: str, owner: int | None = None) -> bytes | None: ...

    def cached(self, path: str, root: str, read: Callable[[str, str], dict]) -> dict: ...

    def listing(self, directory: str, root: str) -> list[str]: ...

    def cut(self, path: str, why: str) -> None: ...

    def report(self, root: str, path: str, error: OSError) -> None: ...


@dataclass(frozen=True)
class JournalExitEvent:
    """A runtime's own journal record of a container's end (Podman's `died` event): the field and value that
    say it (`PODMAN_EVENT=died`), another that must hold (`PODMAN_TYPE=container`), the fields naming the
    container and its id, the executable that writes it, and the reason it is counted under when someone
    else wrote it."""

    field: bytes
    value: bytes
    type_field: bytes
    type_value: bytes
    name_field: bytes
    id_field: bytes
    writer: Callable[[bytes | None, bytes | None, bytes | None], int | None]  # (_UID, _COMM, _EXE) -> uid
    rejected: str


@dataclass(frozen=True)
class JournalDriver:
    """How a runtime's log driver writes a container's lines into the journal (`CONTAINER_NAME=`), and whom
    journald's trusted fields must show as their writer.

    `writer(_UID, _COMM, _EXE, _SYSTEMD_UNIT)`: the uid of the runtime's process that wrote the record (0:
    root's; a user's speaks only for that user's containers, whose keys end in `@uid<N>`), None when it did
    not; `key(name, uid)`: the container's key (None: a name the runtime refuses); `run(field, pid)`: the
    container's run from the record's fields (`field(name)` reads one); `exit_event`: the runtime's own
    record of a container's end, if it writes one."""

    writer: Callable[[bytes | None, bytes | None, bytes | None, bytes | None], int | None]
    key: Callable[[str, int], str | None]
    run: Callable[[Callable[[bytes], bytes | None], int | None], str]
    exit_event: JournalExitEvent | None = None


class RuntimeFacts(Protocol):
    """A runtime's pure module."""

    KIND: str
    """Its key's first element and the `kind` label of xpu_workload_info (`docker`)."""
    JOURNAL: JournalDriver | None
    """Its journald log driver, None when it has none."""

    def container_of_scope(self, elements: Sequence[str], index: int) -> ContainerCgroup | None:
        """The container whose systemd scope `elements[index]` is, else None."""
        ...

    def container_of_cgroupfs(self, elements: Sequence[str], index: int) -> ContainerCgroup | None:
        """The container whose cgroupfs directory `elements[index]` is (outside any unit), else None."""
        ...

    def names_container(self, container: ContainerCgroup) -> bool:
        """Whether it names this container (its names come from its state, its kind is its KIND)."""
        ...



class RuntimeState(Protocol):
    """A runtime's I/O module."""

    LOCATIONS: Mapping[str, object]
    """Where its state is: ContainerNames' keyword arguments and their defaults (`docker_roots`)."""
    LOG_LOCATIONS: tuple[str, ...]
    """LogDirectories' keyword arguments naming where its containers' log files are; () when it has none."""

    def names(self, container: ContainerCgroup, files: StateFiles, locations: Mapping[str, object]) -> Names:
        """A container's names from the state under `locations` (LOCATIONS' keywords)."""
        ...

    def log_finder(self, locations: Mapping[str, object]) -> LogFinder | None:
        """Its containers' log files under `locations` (LOG_LOCATIONS' keywords), None when none is given."""
        ...

    def exit_watch(self, container_id: str, locations: Mapping[str, object]) -> ExitWatch | None:
        """Where the end of the container `container_id` is read, None when its state does not say it."""
        ...


_RFC3339 = re.compile(rb"(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?([Zz]|[+-]\d\d:\d\d)")


def parse_rfc3339_usec(text: bytes) -> int | None:
    """An RFC 3339 time (`2016-10-06T00:17:09.669794202Z`, `...+01:00`) as microseconds since the epoch;
    None when `text` is not one (or not a real date)."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(group) for group in match.groups()[:6])
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 60):
        return None
    try:
        seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    fraction = match.group(7) or b""
    usec = int((fraction + b"000000")[:6]) if fraction else 0
    zone = match.group(8)
    if zone not in (b"Z", b"z"):
        sign = 1 if zone[:1] == b"+" else -1
        zone_hours, zone_minutes = int(zone[1:3]), int(zone[4:6])
        if zone_hours > 23 or zone_minutes > 59:
            return None
        seconds -= sign * (zone_hours * 3600 + zone_minutes * 60)
    return seconds * 1_000_000 + usec


_STREAMS = {b"stdout": "stdout", b"stderr": "stderr"}


def parse_cri_line(line: bytes, max_chars: int = MAX_TEXT_CHARS) -> LogRecord | None:
    """A record of a CRI log file (one line, without its newline), or None; its text cut at `max_chars`.

    The CRI log format, of the kubelet's runtimes (containerd, CRI-O) and of conmon's k8s-file (Podman):
    `<RFC 3339 time> <stream> <tags> <text>`, e.g. `2016-10-06T00:17:09.669794202Z stdout F log line`; the first
    tag is `F` (the line is whole, or this is its last piece) or `P` (a piece: the line goes on in the stream's
    next record); more tags, if a runtime ever writes them, follow after `:`. containerd writes UTC (`Z`), CRI-O
    and conmon the local offset (`+01:00`)."""
    parts = line.split(b" ", 3)
    if len(parts) < 3:
        return None
    when, stream, tags = parts[0], parts[1], parts[2]
    text = parts[3] if len(parts) == 4 else b""
    realtime = parse_rfc3339_usec(when)
    stream_name = _STREAMS.get(stream)
    tag = tags.split(b":", 1)[0]
    if realtime is None or stream_name is None or tag not in (b"P", b"F"):
        return None
    decoded = text[:max_chars * 4].decode("utf-8", "replace")[:max_chars]
    if tag == b"F":
        decoded = decoded.rstrip("\r")
    return LogRecord(realtime, stream_name, decoded, tag == b"P")
