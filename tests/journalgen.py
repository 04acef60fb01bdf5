"""Real systemd journal files for tests, written by systemd-journal-remote from export-format text.

The export format (systemd.io/JOURNAL_EXPORT_FORMATS) is ``FIELD=value\\n`` per field and a blank
line after each entry; a value that is not plain text (newlines, control bytes, invalid UTF-8) is
written binary-safe as ``FIELD\\n`` + 64-bit little-endian length + bytes + ``\\n``.
``__REALTIME_TIMESTAMP``, ``__MONOTONIC_TIMESTAMP`` and ``_BOOT_ID`` become the entry header.

Entries are built the way journald and systemd 252 write them: a unit's stdout lines
(``_TRANSPORT=stdout``, ``PRIORITY=6``, ``_SYSTEMD_UNIT=``) and PID 1's records about a unit
(``_PID=1``, ``_TRANSPORT=journal``, ``UNIT=``, ``MESSAGE_ID=``) with the texts systemd 252 uses.

Usable from a shell: ``write_journal("/tmp/x.journal", [unit_output("vllm.service", "hi", ...)])``.
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

JOURNAL_REMOTE = "/usr/lib/systemd/systemd-journal-remote"
MACHINE_ID = "5f7c2e0a9b1d4c3e8f6a7b2c1d0e9f8a"
HOSTNAME = "xpu-host"

MESSAGE_ID_UNIT_STARTING = "7d4958e842da4a758f6c1cdc7b36dcc5"
MESSAGE_ID_UNIT_STARTED = "39f53479d3a045ac8e11786248231fbf"
MESSAGE_ID_UNIT_START_FAILED = "be02cf6855d2428ba40df7e9d022f03d"
MESSAGE_ID_UNIT_PROCESS_EXIT = "98e322203f7a4ed290d09fe03c09fe15"
MESSAGE_ID_UNIT_FAILURE_RESULT = "d9b373ed55a64feb8242e02dbe79a49c"
MESSAGE_ID_UNIT_RESTART_SCHEDULED = "5eb03494b6584870a536b337290809b3"
MESSAGE_ID_UNIT_STOPPING = "de5b426a63be47a7b6ac3eaac82e2f6f"
MESSAGE_ID_UNIT_STOPPED = "9d1aaa27d60140bd96365438aad20286"

# exit_status_to_string(status, EXIT_STATUS_FULL) and signal_to_string() of systemd 252, the
# statuses a service's main process ends with in practice.
EXIT_STATUS_NAMES = {
    0: "SUCCESS",
    1: "FAILURE",
    2: "INVALIDARGUMENT",
    3: "NOTIMPLEMENTED",
    4: "NOPERMISSION",
    5: "NOTINSTALLED",
    6: "NOTCONFIGURED",
    7: "NOTRUNNING",
    200: "CHDIR",
    203: "EXEC",
    217: "USER",
}
SIGNAL_NAMES = {1: "HUP", 2: "INT", 6: "ABRT", 9: "KILL", 11: "SEGV", 15: "TERM"}

Value = str | bytes | int


@dataclass(frozen=True)
class JournalEntrySpec:
    """One journal entry to write: header timestamps, boot id, and its fields in order."""

    realtime_usec: int
    monotonic_usec: int
    boot_id: str
    fields: tuple[tuple[str, Value], ...] = field(default=())

    def field_value(self, name: str) -> Value | None:
        return next((value for key, value in self.fields if key == name), None)


def random_boot_id(rng: random.Random | None = None) -> str:
    return (rng or random.Random()).getrandbits(128).to_bytes(16, "big").hex()


def current_boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")


@dataclass(frozen=True)
class Moment:
    """When an entry was written: its header timestamps and boot."""

    realtime_usec: int
    monotonic_usec: int
    boot_id: str


class Clock:
    """Moments of one boot, ``step_usec`` apart unless told otherwise."""

    def __init__(self, boot_id: str, realtime_usec: int = 1_747_000_000_000_000,
                 monotonic_usec: int = 5_000_000, step_usec: int = 1000) -> None:
        self.boot_id = boot_id
        self.realtime_usec = realtime_usec
        self.monotonic_usec = monotonic_usec
        self.step_usec = step_usec

    def tick(self, usec: int | None = None) -> Moment:
        step = self.step_usec if usec is None else usec
        self.realtime_usec += step
        self.monotonic_usec += step
        return Moment(self.realtime_usec, self.monotonic_usec, self.boot_id)


def _invocation_id(unit: str, boot_id: str) -> str:
    """The default invocation id: one per unit and boot. Real systemd gives every start of a unit its
    own (a restart gets a new one): pass ``invocation_id=`` (e.g. ``new_invocation_id()``) to the
    builders of one start to write that; ``invocation_id=""`` writes none."""
    return uuid.uuid5(uuid.NAMESPACE_OID, unit + boot_id).hex


def new_invocation_id(rng: random.Random | None = None) -> str:
    """An invocation id as systemd makes them: 128 random bits as 32 hex digits."""
    return (rng or random.Random()).getrandbits(128).to_bytes(16, "big").hex()


def unit_output(
    unit: str,
    message: str | bytes | None,
    at: Moment,
    *,
    pid: int = 4242,
    comm: str = "python3",
    syslog_identifier: str | None = None,
    message_id: str | None = None,
    extra: Iterable[tuple[str, Value]] = (),
    invocation_id: str | None = None,
) -> JournalEntrySpec:
    """A line the unit printed on stdout/stderr, as journald stores it (``message=None``: no MESSAGE).
    ``pid``: the printing process (an ``ExecStartPre=`` command has its own, the main process another)."""
    fields: list[tuple[str, Value]] = [
        ("_BOOT_ID", at.boot_id),
        ("_MACHINE_ID", MACHINE_ID),
        ("_HOSTNAME", HOSTNAME),
        ("PRIORITY", 6),
        ("SYSLOG_FACILITY", 3),
        ("_UID", 0),
        ("_GID", 0),
        ("_CAP_EFFECTIVE", "1ffffffffff"),
        ("_TRANSPORT", "stdout"),
        ("_STREAM_ID", uuid.uuid5(uuid.NAMESPACE_OID, f"{unit}{pid}{at.boot_id}").hex),
        ("SYSLOG_IDENTIFIER", syslog_identifier or comm),
        ("_PID", pid),
        ("_COMM", comm),
        ("_EXE", f"/usr/bin/{comm}"),
        ("_CMDLINE", f"/usr/bin/{comm} -m vllm.entrypoints.openai.api_server"),
        ("_SYSTEMD_CGROUP", f"/system.slice/{unit}"),
        ("_SYSTEMD_UNIT", unit),
        ("_SYSTEMD_SLICE", "system.slice"),
    ]
    invocation = _invocation_id(unit, at.boot_id) if invocation_id is None else invocation_id
    if invocation:
        fields.append(("_SYSTEMD_INVOCATION_ID", invocation))
    if message_id is not None:
        fields.append(("MESSAGE_ID", message_id))
    if message is not None:
        fields.append(("MESSAGE", message))
    fields.extend(extra)
    return JournalEntrySpec(at.realtime_usec, at.monotonic_usec, at.boot_id, tuple(fields))


def systemd_record(
    unit: str,
    message: str,
    message_id: str,
    at: Moment,
    *,
    priority: int = 6,
    code_func: str,
    code_file: str = "src/core/unit.c",
    extra: Iterable[tuple[str, Value]] = (),
    invocation_id: str | None = None,
) -> JournalEntrySpec:
    """A record PID 1 wrote about ``unit`` (log_unit_struct() in systemd 252)."""
    invocation = _invocation_id(unit, at.boot_id) if invocation_id is None else invocation_id
    fields: list[tuple[str, Value]] = [
        ("_BOOT_ID", at.boot_id),
        ("_MACHINE_ID", MACHINE_ID),
        ("_HOSTNAME", HOSTNAME),
        ("PRIORITY", priority),
        ("SYSLOG_FACILITY", 3),
        ("SYSLOG_IDENTIFIER", "systemd"),
        ("_UID", 0),
        ("_GID", 0),
        ("_TRANSPORT", "journal"),
        ("_CAP_EFFECTIVE", "1ffffffffff"),
        ("_PID", 1),
        ("_COMM", "systemd"),
        ("_EXE", "/usr/lib/systemd/systemd"),
        ("_CMDLINE", "/sbin/init"),
        ("_SYSTEMD_CGROUP", "/init.scope"),
        ("_SYSTEMD_UNIT", "init.scope"),
        ("_SYSTEMD_SLICE", "-.slice"),
        ("CODE_FILE", code_file),
        ("CODE_FUNC", code_func),
        ("MESSAGE_ID", message_id),
        ("UNIT", unit),
        *((("INVOCATION_ID", invocation),) if invocation else ()),
        *extra,
        ("MESSAGE", message),
        ("_SOURCE_REALTIME_TIMESTAMP", at.realtime_usec),
    ]
    return JournalEntrySpec(at.realtime_usec, at.monotonic_usec, at.boot_id, tuple(fields))


DOCKERD_PID = 812


def container_id(name: str, salt: str = "") -> str:
    """A 64-hex-digit container id, the same for the same name and salt (a recreated container: another salt)."""
    return (uuid.uuid5(uuid.NAMESPACE_OID, f"{name}/{salt}").hex + uuid.uuid5(uuid.NAMESPACE_URL, f"{name}/{salt}").hex)


def container_output(
    name: str,
    message: str,
    at: Moment,
    *,
    runtime: str = "docker",
    container: str | None = None,
    epoch: str | None = "",
    conmon_pid: int = 2900,
    partial: bool = False,
    stderr: bool = False,
    image: str = "vllm/vllm-openai-xpu:v0.24.0",
    systemd_unit: str | None = None,
    extra: Iterable[tuple[str, Value]] = (),
) -> JournalEntrySpec:
    """A line a container printed, as the ``journald`` log driver stores it.

    ``runtime="docker"``: dockerd's daemon/logger/journald (Docker 23+): MESSAGE without its newline,
    PRIORITY 6 (stdout) or 3 (stderr), CONTAINER_ID (12), CONTAINER_ID_FULL, CONTAINER_NAME,
    CONTAINER_TAG and SYSLOG_IDENTIFIER (the tag, by default the short id), IMAGE_NAME,
    CONTAINER_LOG_EPOCH (``epoch``: one per start of the container; '' makes one from the id, None writes
    none, as Docker before 23), CONTAINER_LOG_ORDINAL, CONTAINER_PARTIAL_MESSAGE=true on a piece of a line
    cut at 16 KiB; sent by dockerd (``_PID`` dockerd's, ``_SYSTEMD_UNIT=docker.service``).
    ``runtime="podman"``: conmon's ctr_logging.c: MESSAGE with its newline, CONTAINER_ID_FULL, PRIORITY,
    CONTAINER_ID, CONTAINER_NAME, SYSLOG_IDENTIFIER (the name), CONTAINER_PARTIAL_MESSAGE=true; sent by
    the container's conmon (``conmon_pid``: one per start), in ``libpod-conmon-<id>.scope``, or in a
    quadlet's ``systemd_unit``."""
    full = container or container_id(name)
    short = full[:12]
    priority = 3 if stderr else 6
    if runtime == "docker":
        fields: list[tuple[str, Value]] = [
            ("_BOOT_ID", at.boot_id), ("_MACHINE_ID", MACHINE_ID), ("_HOSTNAME", HOSTNAME),
            ("PRIORITY", priority), ("_UID", 0), ("_GID", 0), ("_CAP_EFFECTIVE", "1ffffffffff"),
            ("_TRANSPORT", "journal"), ("_PID", DOCKERD_PID), ("_COMM", "dockerd"), ("_EXE", "/usr/bin/dockerd"),
            ("_CMDLINE", "/usr/bin/dockerd -H fd:// --containerd=/run/containerd/containerd.sock"),
            ("_SYSTEMD_CGROUP", "/system.slice/docker.service"), ("_SYSTEMD_UNIT", systemd_unit or "docker.service"),
            ("_SYSTEMD_SLICE", "system.slice"),
            ("_SYSTEMD_INVOCATION_ID", uuid.uuid5(uuid.NAMESPACE_OID, "docker.service" + at.boot_id).hex),
            ("CONTAINER_ID", short), ("CONTAINER_ID_FULL", full), ("CONTAINER_NAME", name),
            ("CONTAINER_TAG", short), ("SYSLOG_IDENTIFIER", short), ("IMAGE_NAME", image),
        ]
        if epoch is not None:
            fields.append(("CONTAINER_LOG_EPOCH", epoch or uuid.uuid5(uuid.NAMESPACE_OID, full).hex * 2))
            fields.append(("CONTAINER_LOG_ORDINAL", at.realtime_usec % 1_000_000 + 1))
        fields.append(("SYSLOG_TIMESTAMP", f"{at.realtime_usec}"))
        if partial:
            fields.append(("CONTAINER_PARTIAL_MESSAGE", "true"))
        fields.append(("MESSAGE", message))
    elif runtime == "podman":
        scope = systemd_unit or f"libpod-conmon-{full}.scope"
        fields = [
            ("_BOOT_ID", at.boot_id), ("_MACHINE_ID", MACHINE_ID), ("_HOSTNAME", HOSTNAME),
            ("_UID", 0), ("_GID", 0), ("_CAP_EFFECTIVE", "1ffffffffff"), ("_TRANSPORT", "journal"),
            ("_PID", conmon_pid), ("_COMM", "conmon"), ("_EXE", "/usr/bin/conmon"),
            ("_CMDLINE", f"/usr/bin/conmon --api-version 1 -c {full} -u {full} -n {name} --log-driver journald"),
            ("_SYSTEMD_CGROUP", f"/machine.slice/{scope}" if systemd_unit is None else f"/system.slice/{scope}"),
            ("_SYSTEMD_UNIT", scope), ("_SYSTEMD_SLICE", "machine.slice" if systemd_unit is None else "system.slice"),
            ("MESSAGE", message if partial else message + "\n"),
            ("CONTAINER_ID_FULL", full), ("PRIORITY", priority), ("CONTAINER_ID", short),
            ("CONTAINER_NAME", name), ("SYSLOG_IDENTIFIER", name),
        ]
        if partial:
            fields.append(("CONTAINER_PARTIAL_MESSAGE", "true"))
    else:
        raise ValueError(f"unknown runtime {runtime!r}")
    fields.extend(extra)
    return JournalEntrySpec(at.realtime_usec, at.monotonic_usec, at.boot_id, tuple(fields))


def podman_died(name: str, at: Moment, *, container: str | None = None, exit_code: int = 137,
                unit: str = "session-3.scope") -> JournalEntrySpec:
    """Podman's event of a container's process ending, as its journald events logger writes it
    (libpod/events/journal_linux.go: SYSLOG_IDENTIFIER=podman, PODMAN_EVENT=died, PODMAN_TYPE=container,
    PODMAN_TIME, PODMAN_IMAGE, PODMAN_NAME, PODMAN_ID, PODMAN_EXIT_CODE unless 0), sent by the podman
    process that saw it end (the cleanup process, in the caller's scope)."""
    full = container or container_id(name)
    fields: list[tuple[str, Value]] = [
        ("_BOOT_ID", at.boot_id), ("_MACHINE_ID", MACHINE_ID), ("_HOSTNAME", HOSTNAME), ("_UID", 0), ("_GID", 0),
        ("_TRANSPORT", "journal"), ("_PID", 4100), ("_COMM", "podman"), ("_EXE", "/usr/bin/podman"),
        ("_SYSTEMD_UNIT", unit), ("PRIORITY", 6), ("SYSLOG_IDENTIFIER", "podman"),
        ("MESSAGE", f"container died {full} (image=vllm/vllm-openai-xpu:v0.24.0, name={name})"),
        ("PODMAN_EVENT", "died"), ("PODMAN_TYPE", "container"), ("PODMAN_TIME", f"{at.realtime_usec}"),
        ("PODMAN_IMAGE", "vllm/vllm-openai-xpu:v0.24.0"), ("PODMAN_NAME", name), ("PODMAN_ID", full),
    ]
    if exit_code:
        fields.append(("PODMAN_EXIT_CODE", exit_code))
    return JournalEntrySpec(at.realtime_usec, at.monotonic_usec, at.boot_id, tuple(fields))


def _status_unit(unit: str, description: str | None) -> str:
    # StatusUnitFormat=combined, the default since systemd 250.
    return f"{unit} - {description}" if description else unit


def unit_starting(unit: str, at: Moment, *, description: str | None = "vLLM server", job_id: int = 100,
                  invocation_id: str | None = None) -> JournalEntrySpec:
    """'Starting <unit> - <description>...'"""
    return systemd_record(
        unit, f"Starting {_status_unit(unit, description)}...", MESSAGE_ID_UNIT_STARTING, at,
        code_file="src/core/job.c", code_func="job_emit_start_message",
        extra=(("JOB_ID", job_id), ("JOB_TYPE", "start")), invocation_id=invocation_id,
    )


def unit_started(unit: str, at: Moment, *, description: str | None = "vLLM server", job_id: int = 100,
                 invocation_id: str | None = None) -> JournalEntrySpec:
    """'Started <unit> - <description>.'"""
    return systemd_record(
        unit, f"Started {_status_unit(unit, description)}.", MESSAGE_ID_UNIT_STARTED, at,
        code_file="src/core/job.c", code_func="job_emit_done_message",
        extra=(("JOB_ID", job_id), ("JOB_TYPE", "start"), ("JOB_RESULT", "done")),
        invocation_id=invocation_id,
    )


def unit_process_exited(
    unit: str, at: Moment, *, status: int = 1, code: str = "exited", kind: str = "Main process",
    command: str = "python3", invocation_id: str | None = None,
) -> JournalEntrySpec:
    """'<unit>: Main process exited, code=exited, status=1/FAILURE' (code: exited, killed, dumped)."""
    if code == "exited":
        status_name = EXIT_STATUS_NAMES.get(status, "n/a")
    else:
        status_name = SIGNAL_NAMES.get(status, "n/a")
    success = code == "exited" and status == 0
    return systemd_record(
        unit, f"{unit}: {kind} exited, code={code}, status={status}/{status_name}" + (" (success)" if success else ""),
        MESSAGE_ID_UNIT_PROCESS_EXIT, at, priority=7 if success else 5, code_func="unit_log_process_exit",
        extra=(("COMMAND", command), ("EXIT_CODE", code), ("EXIT_STATUS", status)),
        invocation_id=invocation_id,
    )


def unit_failed(unit: str, at: Moment, *, result: str = "exit-code",
                invocation_id: str | None = None) -> JournalEntrySpec:
    """``<unit>: Failed with result 'exit-code'.``: the unit entered the failed state."""
    return systemd_record(
        unit, f"{unit}: Failed with result '{result}'.", MESSAGE_ID_UNIT_FAILURE_RESULT, at,
        priority=4, code_func="unit_log_failure", extra=(("UNIT_RESULT", result),), invocation_id=invocation_id,
    )


def unit_restart_scheduled(unit: str, at: Moment, *, counter: int = 1,
                           invocation_id: str | None = None) -> JournalEntrySpec:
    """'<unit>: Scheduled restart job, restart counter is at N.'"""
    return systemd_record(
        unit, f"{unit}: Scheduled restart job, restart counter is at {counter}.", MESSAGE_ID_UNIT_RESTART_SCHEDULED, at,
        code_file="src/core/service.c", code_func="service_enter_restart", extra=(("N_RESTARTS", counter),),
        invocation_id=invocation_id,
    )


def unit_stopped(unit: str, at: Moment, *, description: str | None = "vLLM server", job_id: int = 101,
                 invocation_id: str | None = None) -> JournalEntrySpec:
    """'Stopped <unit> - <description>.'"""
    return systemd_record(
        unit, f"Stopped {_status_unit(unit, description)}.", MESSAGE_ID_UNIT_STOPPED, at,
        code_file="src/core/job.c", code_func="job_emit_done_message",
        extra=(("JOB_ID", job_id), ("JOB_TYPE", "stop"), ("JOB_RESULT", "done")),
        invocation_id=invocation_id,
    )


# --- export format --------------------------------------------------------------------------


def _needs_binary_form(value: bytes) -> bool:
    if any(byte < 0x20 and byte != 0x09 for byte in value):
        return True
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _as_bytes(value: Value) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8")


def export_field(name: str, value: Value) -> bytes:
    data = _as_bytes(value)
    key = name.encode("ascii")
    if _needs_binary_form(data):
        return key + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
    return key + b"=" + data + b"\n"


def export_entry(entry: JournalEntrySpec) -> bytes:
    parts = [
        b"__REALTIME_TIMESTAMP=%d\n" % entry.realtime_usec,
        b"__MONOTONIC_TIMESTAMP=%d\n" % entry.monotonic_usec,
    ]
    has_boot = False
    for name, value in entry.fields:
        has_boot = has_boot or name == "_BOOT_ID"
        parts.append(export_field(name, value))
    if not has_boot:
        parts.append(export_field("_BOOT_ID", entry.boot_id))
    parts.append(b"\n")
    return b"".join(parts)


def export_stream(entries: Iterable[JournalEntrySpec]) -> Iterator[bytes]:
    for entry in entries:
        yield export_entry(entry)


# --- journal files --------------------------------------------------------------------------


def _run_journal_remote(output: Path, write: Callable[[IO[bytes]], None]) -> None:
    if output.suffix != ".journal":
        raise ValueError(f"systemd-journal-remote wants an output name ending in .journal, got {output}")
    process = subprocess.Popen(
        [JOURNAL_REMOTE, f"--output={output}", "--split-mode=none", "--compress=yes", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stderr is not None
    try:
        write(process.stdin)
    finally:
        process.stdin.close()
    error = process.stderr.read().decode(errors="replace")
    if process.wait() != 0:
        raise RuntimeError(f"systemd-journal-remote failed ({process.returncode}): {error.strip()}")


def write_journal(path: str | os.PathLike[str], entries: Iterable[JournalEntrySpec]) -> Path:
    """Write ``entries`` to a new journal file ``path`` (must end in .journal; replaced if present)."""
    output = Path(path)
    output.unlink(missing_ok=True)
    _run_journal_remote(output, lambda stream: _write_all(stream, entries))
    return output


def append_journal(path: str | os.PathLike[str], entries: Iterable[JournalEntrySpec]) -> Path:
    """Append ``entries`` to the existing journal file ``path``, as journald appends to system.journal."""
    output = Path(path)
    if not output.exists():
        raise FileNotFoundError(output)
    _run_journal_remote(output, lambda stream: _write_all(stream, entries))
    return output


def rotate_journal(path: str | os.PathLike[str]) -> Path:
    """Archive ``path`` the way journald rotates: rename it to ``<name>@<id>-<seq>-<time>.journal``.

    Returns the archived name; a later ``write_journal(path, ...)`` makes the new active file.
    """
    source = Path(path)
    archived = source.with_name(f"{source.stem}@{uuid.uuid4().hex}-0000000000000001-{os.getpid():016x}.journal")
    source.rename(archived)
    return archived


def _write_all(stream: IO[bytes], entries: Iterable[JournalEntrySpec]) -> None:
    for chunk in export_stream(entries):
        stream.write(chunk)


# --- big journals for benchmarks ------------------------------------------------------------

WATCHED_BENCH_UNITS = ("vllm-chat.service", "vllm-embed.service")
UNWATCHED_BENCH_UNITS = ("nginx.service", "cron.service", "ssh.service", "containerd.service", "prometheus.service")


def _static_block(fields: Iterable[tuple[str, Value]]) -> bytes:
    return b"".join(export_field(name, value) for name, value in fields)


def big_journal_stream(n_entries: int, watched_fraction: float = 0.1, *, seed: int = 1,
                       boot_id: str | None = None) -> Iterator[bytes]:
    """Export text of ``n_entries`` realistic entries; ``watched_fraction`` are about vllm*.service units.

    Fast: each process's constant fields are pre-encoded once; per entry only the timestamps
    and MESSAGE are formatted. Of the watched entries, 2 % are PID 1's records about the unit.
    """
    rng = random.Random(seed)
    boot = boot_id or random_boot_id(rng)
    templates_watched: list[bytes] = []
    origin = Moment(0, 0, boot)
    for unit in WATCHED_BENCH_UNITS:
        spec = unit_output(unit, None, origin, pid=3000 + len(unit))
        templates_watched.append(_static_block(spec.fields))
    templates_systemd = []
    for unit in WATCHED_BENCH_UNITS:
        spec = unit_restart_scheduled(unit, origin, counter=1)
        static = [(k, v) for k, v in spec.fields if k not in ("MESSAGE", "_SOURCE_REALTIME_TIMESTAMP")]
        templates_systemd.append((unit, _static_block(static)))
    templates_other = []
    for index, unit in enumerate(UNWATCHED_BENCH_UNITS):
        spec = unit_output(unit, None, origin, pid=500 + index, comm=unit.split(".")[0])
        templates_other.append(_static_block(spec.fields))
    kernel = _static_block([("_BOOT_ID", boot), ("_MACHINE_ID", MACHINE_ID), ("_HOSTNAME", HOSTNAME),
                            ("PRIORITY", 6), ("SYSLOG_FACILITY", 0), ("SYSLOG_IDENTIFIER", "kernel"),
                            ("_TRANSPORT", "kernel"), ("_SOURCE_MONOTONIC_TIMESTAMP", 1)])
    vllm_lines = [
        b"(EngineCore pid=%d) INFO 05-12 10:11:%02d [gpu_worker.py:%d] Available KV cache memory: %d.%02d GiB",
        b"(APIServer pid=%d) INFO 05-12 10:11:%02d [loggers.py:%d] Engine 000: Avg prompt throughput: %d.%d tokens/s",
        b"(EngineCore pid=%d) INFO 05-12 10:11:%02d [kv_cache_utils.py:%d] GPU KV cache size: %d,%03d tokens",
        b"(APIServer pid=%d) INFO 05-12 10:11:%02d [launcher.py:%d] Route: /v1/chat/completions, Methods: %d%d",
    ]
    other_lines = [
        b'10.0.%d.%d - - [12/May/2025:10:11:12 +0000] "GET /api/v1/items/%d HTTP/1.1" 200 %d "-" "curl/7.88.1"',
        b"pam_unix(cron:session): session opened for user root(uid=%d) by root(uid=%d) job %d size %d",
        b"Accepted publickey for deploy from 192.168.%d.%d port %d ssh2: RSA SHA256:%d",
        b'time="2025-05-12T10:11:12Z" level=info msg="shim disconnected" id=%d namespace=%d pid=%d exit=%d',
        b"caller=compact.go:%d level=info component=tsdb msg=\"write block\" mint=%d maxt=%d ulid=%d",
    ]
    realtime = 1_747_000_000_000_000
    monotonic = 5_000_000
    random_int = rng.randrange
    watched_threshold = int(watched_fraction * 1_000_000)
    for _ in range(n_entries):
        realtime += random_int(1, 2000)
        monotonic += 1000
        header = b"__REALTIME_TIMESTAMP=%d\n__MONOTONIC_TIMESTAMP=%d\n" % (realtime, monotonic)
        draw = random_int(1_000_000)
        a, b, c, d = random_int(256), random_int(60), random_int(9999), random_int(99999)
        if draw < watched_threshold:
            which = draw % len(WATCHED_BENCH_UNITS)
            if draw % 50 == 0:
                unit, static = templates_systemd[which]
                message = b"%s: Scheduled restart job, restart counter is at %d." % (unit.encode(), a)
                yield header + static + b"MESSAGE=" + message + b"\n\n"
            else:
                message = vllm_lines[draw % 4] % (a, b, c, d, b % 100)
                yield header + templates_watched[which] + b"MESSAGE=" + message + b"\n\n"
        elif draw % 10 == 0:
            yield header + kernel + b"MESSAGE=i915 0000:03:00.0: [drm] GT0: GuC firmware %d loaded\n\n" % d
        else:
            which = draw % len(UNWATCHED_BENCH_UNITS)
            message = other_lines[which] % (a, b, c, d)
            yield header + templates_other[which] + b"MESSAGE=" + message + b"\n\n"


def write_big_journal(path: str | os.PathLike[str], n_entries: int, watched_fraction: float = 0.1,
                      *, seed: int = 1) -> Path:
    """A journal of ``n_entries`` entries in file ``path`` (journal-remote rotates it at 128 MiB,
    so a big one becomes several files next to ``path``: read the directory)."""
    output = Path(path)
    output.unlink(missing_ok=True)

    def write(stream: IO[bytes]) -> None:
        batch: list[bytes] = []
        for chunk in big_journal_stream(n_entries, watched_fraction, seed=seed):
            batch.append(chunk)
            if len(batch) >= 2048:
                stream.write(b"".join(batch))
                batch.clear()
        stream.write(b"".join(batch))

    _run_journal_remote(output, write)
    return output
