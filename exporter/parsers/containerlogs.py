"""The log files container engines write, one record a line: pure functions of a line's bytes.

- Docker's `json-file` driver (`/var/lib/docker/containers/<id>/<id>-json.log`): one JSON object a line,
  `{"log":"<text>\\n","stream":"stdout","time":"2025-05-12T10:11:13.204051812Z"}` (an `attrs` object
  besides with the driver's `labels`/`env` options). dockerd cuts a line longer than 16 KiB into pieces;
  every piece but the last has no `\\n` at the end of its `log`.
- The CRI format the kubelet's runtimes write (`/var/log/pods/<namespace>_<pod>_<uid>/<container>/<n>.log`,
  containerd, CRI-O): `<RFC 3339 time> <stream> <tags> <text>`, e.g.
  `2016-10-06T00:17:09.669794202Z stdout F log line`; the first tag is `F` (the line is whole, or this is
  its last piece) or `P` (a piece: the line goes on in the stream's next record); more tags, if a
  runtime ever writes them, follow after `:`. containerd writes UTC (`Z`), CRI-O and conmon the local
  offset (`+01:00`).

Both are untrusted (a container prints what it likes; the file may be damaged or not a log at all):
`parse_json_file_line` and `parse_cri_line` return None for anything that is not a record of their format,
and never raise. A record's text is cut at `max_chars` characters.
"""

from __future__ import annotations

import calendar
import json
import re
from dataclasses import dataclass

MAX_TEXT_CHARS = 64 * 1024

_RFC3339 = re.compile(rb"(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?([Zz]|[+-]\d\d:\d\d)")
_STREAMS = {b"stdout": "stdout", b"stderr": "stderr"}


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record of a container's log file."""

    realtime_usec: int  # the engine's time of the line (microseconds since the epoch, UTC)
    stream: str  # stdout or stderr
    text: str  # the line, without its newline (a piece: as it was cut)
    partial: bool  # a piece: the line goes on in the stream's next record


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


def parse_json_file_line(line: bytes, max_chars: int = MAX_TEXT_CHARS) -> LogRecord | None:
    """A record of Docker's json-file log (one line, without its newline), or None."""
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


def parse_cri_line(line: bytes, max_chars: int = MAX_TEXT_CHARS) -> LogRecord | None:
    """A record of a CRI log file (one line, without its newline), or None."""
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


@dataclass(frozen=True, slots=True)
class DockerExit:
    """A Docker container's end, from its `config.v2.json`: when its process ended (`State.FinishedAt`),
    and whether `docker stop` ended it (`HasBeenManuallyStopped`)."""

    realtime_usec: int
    stopped: bool


def docker_exit(data: bytes) -> DockerExit | None:
    """The end of a Docker container that is not running (`State.Running` false and `FinishedAt` after
    `StartedAt`), from its `config.v2.json` (bytes); None while it runs, before it ever ended, or for
    anything that is not such a file."""
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
    return DockerExit(finished_usec, document.get("HasBeenManuallyStopped") is True)
