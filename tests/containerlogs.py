"""What vLLM containers print, as the container engines store it: in the journal (Docker's and Podman's
``journald`` log driver, through journalgen), in Docker's ``json-file`` logs and in the kubelet's CRI log
files, rotation and long lines included.

The lines are vllmlogs' (the same runs, the same physical lines at the same times as the systemd units of
the seed's boot race); a container's runs are what systemd's starts of a unit were: a failed run is
restarted by the engine's restart policy (the same container: Docker keeps its id and its json-file log, the
kubelet writes the next restart's file).

Usable from a shell::

    >>> race = vllmlogs.boot_race()
    >>> lines = container_lines(race.this_boot(), RACE_CONTAINERS)
    >>> journalgen.write_journal("/tmp/c.journal", journald_specs(lines, race.boot_id, booted_at))
"""

from __future__ import annotations

import gzip
import json
import shutil
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import journalgen
import vllmlogs
from journalgen import JournalEntrySpec, Moment
from vllmlogs import CHAT, EMBEDDING, STT, UNWATCHED, Placed

# The seed's units as containers: what `docker run --name ...` would call them.
RACE_CONTAINERS = {CHAT: "vllm-xpu-chat", EMBEDDING: "vllm-xpu-embedding", STT: "vllm-xpu-stt",
                   UNWATCHED: "other-llm"}


@dataclass(frozen=True)
class ContainerLine:
    """One physical line a container printed (one journal entry, one json-file or CRI record)."""

    realtime_usec: int
    monotonic_usec: int
    name: str  # the container's name (Docker, Podman) or the pod's container's name
    message: str
    run: int  # the container's run: 0 its first start, 1 the restart after it, ...
    role: str = ""  # vllmlogs' role of the line (root cause, init done, ...)
    stream: str = "stdout"


def container_lines(placed: Iterable[Placed], names: Mapping[str, str]) -> list[ContainerLine]:
    """The lines the units of `names` printed (not PID 1's records), as their containers': each start of a
    unit (an invocation) is a run of its container, numbered in order."""
    runs: dict[str, dict[str, int]] = {}
    lines = []
    for entry in placed:
        planned = entry.planned
        if planned.from_systemd or planned.unit not in names:
            continue
        unit_runs = runs.setdefault(planned.unit, {})
        run = unit_runs.setdefault(planned.invocation_id, len(unit_runs))
        lines.append(ContainerLine(entry.realtime_usec, entry.monotonic_usec, names[planned.unit], planned.message,
                                   run, planned.role))
    return lines


def epoch(name: str, run: int) -> str:
    """Docker's CONTAINER_LOG_EPOCH of a run: 64 random hex digits per start of the container."""
    return uuid.uuid5(uuid.NAMESPACE_OID, f"{name}#{run}").hex * 2


def journald_specs(lines: Iterable[ContainerLine], boot_id: str, *, runtime: str = "docker",
                   epochs: bool = True, conmon_pid: int = 2900) -> list[JournalEntrySpec]:
    """The lines as the journald log driver stores them: Docker's (one epoch per run; `epochs=False`: none,
    as Docker before 23) or Podman's (one conmon per run)."""
    return [
        journalgen.container_output(
            line.name, line.message, Moment(line.realtime_usec, line.monotonic_usec, boot_id), runtime=runtime,
            epoch=epoch(line.name, line.run) if epochs else None, conmon_pid=conmon_pid + 100 * line.run,
            stderr=line.stream == "stderr")
        for line in lines
    ]


def by_name(lines: Sequence[ContainerLine]) -> dict[str, list[ContainerLine]]:
    out: dict[str, list[ContainerLine]] = {}
    for line in lines:
        out.setdefault(line.name, []).append(line)
    return out


# --- Docker's json-file logs ------------------------------------------------------------------------

DOCKER_PIECE_BYTES = 16 * 1024  # dockerd's copier cuts a line longer than this (bufio 16 KiB)
CRI_PIECE_BYTES = 16 * 1024  # containerd's default max_container_log_line_size


def rfc3339_nano(realtime_usec: int, offset_minutes: int = 0) -> str:
    """Go's time.RFC3339Nano: nanoseconds without trailing zeros (none at all on a whole second); UTC as `Z`,
    else the offset (CRI-O and conmon write local time)."""
    seconds, usec = divmod(realtime_usec + offset_minutes * 60_000_000, 1_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    fraction = f"{usec * 1000:09d}".rstrip("0")
    if fraction:
        stamp += "." + fraction
    if offset_minutes == 0:
        return stamp + "Z"
    sign = "+" if offset_minutes > 0 else "-"
    hours, minutes = divmod(abs(offset_minutes), 60)
    return f"{stamp}{sign}{hours:02d}:{minutes:02d}"


def _go_json_string(text: str) -> str:
    """A JSON string as Docker's jsonlog writes it: HTML-safe (<, >, & as \\u003c, \\u003e, \\u0026), other
    non-ASCII as UTF-8."""
    return json.dumps(text, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def json_file_records(line: ContainerLine, piece_bytes: int = DOCKER_PIECE_BYTES) -> list[bytes]:
    """One printed line as json-file records: cut into pieces of `piece_bytes` (every piece but the last
    without its newline), each `{"log":...,"stream":...,"time":...}`."""
    data = line.message.encode()
    pieces = [data[i:i + piece_bytes] for i in range(0, len(data), piece_bytes)] or [b""]
    records = []
    for index, piece in enumerate(pieces):
        text = piece.decode(errors="replace") + ("\n" if index == len(pieces) - 1 else "")
        records.append(f'{{"log":{_go_json_string(text)},"stream":"{line.stream}",'
                       f'"time":"{rfc3339_nano(line.realtime_usec)}"}}\n'.encode())
    return records


@dataclass
class DockerContainer:
    """A container's directory under <root>/containers/<id>: config.v2.json and the json-file log."""

    directory: Path
    id: str
    name: str

    @property
    def log(self) -> Path:
        return self.directory / f"{self.id}-json.log"

    def write(self, lines: Iterable[ContainerLine], piece_bytes: int = DOCKER_PIECE_BYTES) -> None:
        with self.log.open("ab") as log:
            for line in lines:
                log.write(b"".join(json_file_records(line, piece_bytes)))

    def set_state(self, *, running: bool, started_usec: int, finished_usec: int | None = None,
                  stopped: bool = False, exit_code: int = 1) -> None:
        """What dockerd checkpoints to config.v2.json when the container starts or ends: State.Running,
        StartedAt, FinishedAt (Go's zero time before it ever ended), ExitCode, and HasBeenManuallyStopped
        after `docker stop`."""
        path = self.directory / "config.v2.json"
        config = json.loads(path.read_text())
        config["State"] = {"Running": running, "Paused": False, "Restarting": False, "OOMKilled": False,
                           "Dead": False, "Pid": 4242 if running else 0, "ExitCode": 0 if running else exit_code,
                           "StartedAt": rfc3339_nano(started_usec),
                           "FinishedAt": rfc3339_nano(finished_usec) if finished_usec else "0001-01-01T00:00:00Z"}
        config["HasBeenManuallyStopped"] = stopped
        path.write_text(json.dumps(config))

    def append_raw(self, data: bytes) -> None:
        with self.log.open("ab") as log:
            log.write(data)

    def rotate(self, max_file: int = 5, compress: bool = False) -> None:
        """dockerd's rotate(): .N-1 -> .N (the last removed), the log -> .1, a new empty log; with compress,
        .1 is then gzipped to .1.gz and removed (older ones are .N.gz already)."""
        extension = ".gz" if compress else ""
        (self.directory / f"{self.log.name}.{max_file - 1}{extension}").unlink(missing_ok=True)
        for number in range(max_file - 1, 1, -1):
            source = self.directory / f"{self.log.name}.{number - 1}{extension}"
            if source.exists():
                source.rename(self.directory / f"{self.log.name}.{number}{extension}")
        self.log.rename(self.directory / f"{self.log.name}.1")
        self.log.touch()
        if compress:
            first = self.directory / f"{self.log.name}.1"
            with first.open("rb") as plain, gzip.open(f"{first}.gz", "wb") as packed:
                shutil.copyfileobj(plain, packed)
            first.unlink()


class DockerHost:
    """Docker's data root as dockerd keeps it: <root>/containers/<64-hex id>/ per container."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "containers").mkdir(parents=True, exist_ok=True)

    def add(self, name: str, *, salt: str = "", labels: Mapping[str, str] | None = None,
            log_driver: str = "json-file") -> DockerContainer:
        container = journalgen.container_id(name, salt)
        directory = self.root / "containers" / container
        directory.mkdir()
        config = {"StreamConfig": {}, "State": {"Running": True}, "ID": container, "Name": f"/{name}",
                  "Config": {"Hostname": container[:12], "Image": "vllm/vllm-openai-xpu:v0.24.0",
                             "Labels": dict(labels or {})},
                  "HostConfig": {"LogConfig": {"Type": log_driver, "Config": {}}},
                  "LogPath": str(directory / f"{container}-json.log") if log_driver == "json-file" else ""}
        (directory / "config.v2.json").write_text(json.dumps(config))
        if log_driver == "json-file":
            (directory / f"{container}-json.log").touch()
        return DockerContainer(directory, container, name)


# --- the kubelet's CRI log files --------------------------------------------------------------------


def cri_records(line: ContainerLine, piece_bytes: int = CRI_PIECE_BYTES, offset_minutes: int = 0) -> list[bytes]:
    """One printed line as CRI records: `<time> <stream> P <piece>` for each piece but the last, `F` for it."""
    data = line.message.encode()
    pieces = [data[i:i + piece_bytes] for i in range(0, len(data), piece_bytes)] or [b""]
    stamp = rfc3339_nano(line.realtime_usec, offset_minutes).encode()
    return [b"%s %s %s %s\n" % (stamp, line.stream.encode(), b"F" if index == len(pieces) - 1 else b"P", piece)
            for index, piece in enumerate(pieces)]


@dataclass
class PodContainer:
    """A pod's container's log directory: <pods>/<namespace>_<pod>_<uid>/<container>/<restart>.log."""

    directory: Path
    namespace: str
    pod: str
    uid: str
    name: str

    @property
    def key(self) -> str:
        return f"k8s/{self.namespace}/{self.pod}/{self.name}"

    def log(self, restart: int) -> Path:
        return self.directory / f"{restart}.log"

    def write(self, restart: int, lines: Iterable[ContainerLine], piece_bytes: int = CRI_PIECE_BYTES,
              offset_minutes: int = 0) -> None:
        with self.log(restart).open("ab") as log:
            for line in lines:
                log.write(b"".join(cri_records(line, piece_bytes, offset_minutes)))

    def rotate(self, restart: int, at_usec: int) -> Path:
        """The kubelet's rotateLatestLog: <n>.log -> <n>.log.<YYYYmmdd-HHMMSS>; the runtime then reopens a
        new <n>.log (`reopen`). Returns the rotated file."""
        rotated = self.directory / f"{restart}.log.{time.strftime('%Y%m%d-%H%M%S', time.gmtime(at_usec // 1_000_000))}"
        self.log(restart).rename(rotated)
        return rotated

    def reopen(self, restart: int) -> None:
        self.log(restart).touch()

    def compress(self, rotated: Path) -> None:
        """The kubelet's compressLog at its next rotation: <rotated>.gz, the plain one removed."""
        with rotated.open("rb") as plain, gzip.open(f"{rotated}.gz", "wb") as packed:
            shutil.copyfileobj(plain, packed)
        rotated.unlink()


class PodLogs:
    """The kubelet's pod log directory (/var/log/pods)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def add(self, namespace: str, pod: str, container: str, *, uid: str | None = None) -> PodContainer:
        uid = uid or str(uuid.uuid5(uuid.NAMESPACE_OID, f"{namespace}/{pod}"))
        directory = self.root / f"{namespace}_{pod}_{uid}" / container
        directory.mkdir(parents=True)
        return PodContainer(directory, namespace, pod, uid, container)


# --- the seed's boot race as containers and pods ------------------------------------------------------

# The seed's units as pods (namespace, pod, container): a Deployment's, two StatefulSets', and a pod whose
# container no default glob matches.
RACE_PODS = {CHAT: ("inference", "vllm-xpu-chat-7d9c5b6f4-x2x7q", "vllm"),
             EMBEDDING: ("inference", "vllm-xpu-embedding-0", "vllm"),
             STT: ("inference", "vllm-xpu-stt-0", "vllm"), UNWATCHED: ("inference", "other-llm-0", "llm")}
RACE_POD_KEYS = {unit: f"k8s/{namespace}/{pod}/{container}" for unit, (namespace, pod, container) in RACE_PODS.items()}


def race_lines() -> tuple[list[ContainerLine], str]:
    """The race boot's lines of the four units as containers', and the boot id."""
    race = vllmlogs.boot_race()
    return container_lines(race.this_boot(), RACE_CONTAINERS), race.boot_id


def long_root_cause(lines: list[ContainerLine], name: str, padding: int = 40_000) -> list[ContainerLine]:
    """The lines, with `name`'s first root cause made longer than two 16 KiB pieces (the traceback's text
    after it, as a real one may be), so the engines cut it."""
    out = []
    done = False
    for line in lines:
        if not done and line.name == name and line.role == vllmlogs.ROLE_ROOT_CAUSE:
            line = replace(line, message=line.message + " " + "x" * padding)
            done = True
        out.append(line)
    return out


def write_race_docker(root: Path, *, rotate_every: int = 0, compress: bool = False) -> dict[str, DockerContainer]:
    """The race as four Docker containers (json-file): chat's restart goes on in the same container and log,
    as Docker's restart policy does; chat's root cause is longer than 16 KiB; with `rotate_every` each log is
    rotated after every that many lines (gzipped with `compress`)."""
    lines, _ = race_lines()
    lines = long_root_cause(lines, RACE_CONTAINERS[CHAT])
    host = DockerHost(root)
    containers = {name: host.add(name) for name in RACE_CONTAINERS.values()}
    for name, own in by_name(lines).items():
        container = containers[name]
        for index, line in enumerate(own, 1):
            container.write([line])
            if rotate_every and index % rotate_every == 0:
                container.rotate(max_file=1000, compress=compress)  # none removed: every line stays to be read
    return containers


def write_race_pods(root: Path, *, rotate_every: int = 0, compress: bool = False,
                    offset_minutes: int = 0) -> dict[str, PodContainer]:
    """The race as four pods of one container each (RACE_PODS): chat's restart is the kubelet's 1.log; chat's root
    cause comes in P pieces; with `rotate_every` each file is rotated (and reopened) after every that many
    lines, the rotated ones before the latest gzipped with `compress`."""
    lines, _ = race_lines()
    lines = long_root_cause(lines, RACE_CONTAINERS[CHAT])
    pods = PodLogs(root)
    containers = {}
    for unit, name in RACE_CONTAINERS.items():
        namespace, pod, container = RACE_PODS[unit]
        containers[name] = pods.add(namespace, pod, container)
    for name, own in by_name(lines).items():
        container = containers[name]
        rotated: list[Path] = []
        for index, line in enumerate(own, 1):
            container.write(line.run, [line], offset_minutes=offset_minutes)
            if rotate_every and index % rotate_every == 0:
                if compress and rotated:
                    container.compress(rotated.pop())
                rotated.append(container.rotate(line.run, line.realtime_usec + index * 1_000_000))
                container.reopen(line.run)
    return containers
