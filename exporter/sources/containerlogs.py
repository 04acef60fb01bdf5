"""Containers' log files as a source of what their engines printed: Docker's `json-file` logs and the CRI
log files of the kubelet's pods, read-only, caught up then followed, as log entries for the same fold.

Usable alone from a Python shell::

    >>> from vllm_xpu_exporter.sources.containerlogs import ContainerLogReader, LogDirectories
    >>> from vllm_xpu_exporter.sources.logs.entry import LogSelection
    >>> selection = LogSelection(container_globs=["*vllm*"], boot="all")
    >>> with ContainerLogReader(selection, LogDirectories(docker_roots=("/var/lib/docker",))) as reader:
    ...     for entry in reader.read_available(100):
    ...         print(entry.unit, entry.message)

Where the files are
    Docker (each `docker_roots` root, `--path.docker`): `<root>/containers/<id>/<id>-json.log`, rotated by
    dockerd (`max-size`, `max-file`) to `<id>-json.log.1` (the newest), `.2`, ..., gzipped to `.N.gz`
    with `compress`; the container's name from `config.v2.json` beside it (`Name`; a name Docker would
    refuse, or no readable config, and the container is not read). Key `docker/<name>`.
    Kubernetes (`pods`, `--path.pods`): `<pods>/<namespace>_<pod>_<uid>/<container>/<n>.log`, `n` the
    container's restart count: each restart writes a new file, and the kubelet keeps the previous one. The
    kubelet rotates `<n>.log` to `<n>.log.<YYYYmmdd-HHMMSS>` and gzips the older rotated files to `.gz`
    at its next rotation. Key `k8s/<namespace>/<pod>/<container>`.
    A container is watched when the selection's container globs match it
    (`LogSelection.matches_container`: its name, or its key for a glob with `/`).

What an entry is
    One record (`vllm_xpu_exporter.parsers.containerlogs`): `LogEntry` with the container's key as `unit`, the
    record's own time as `realtime_usec` (the engine's clock, not journald's), its stream, the `partial`
    flag of a piece (a json-file `log` without its newline, a CRI `P`), and as `container_run` the
    container's id (Docker: a restart of the same container keeps its id and its file, and vLLM's first line
    tells the runs apart, `vllm_xpu_exporter.fold.container_runs`) or `<pod uid>/<container>/<n>` (one run a file).
    With `boot="current"` (the selection's `--journal.boot`) records from before this boot are skipped, as
    the journal reads only the running boot; with `all` or a boot id, every record is read.

Catch-up, then following, by polling
    `read_available()` first returns every watched container's records, its rotated files oldest first
    (gzipped ones too) then the live file, the containers' records merged by time (each container's in
    file order). Then every `POLL_SECONDS` it reads what was appended to each live file, and looks for new
    containers, restarts and vanished ones every `DISCOVER_SECONDS`. Polling rather than inotify: a
    second's delay is nothing against a scrape interval, a poll costs two system calls a followed file
    (a read that finds nothing, a stat of the live path), and it needs no watch per pod directory, none of
    inotify's limits and nothing special for rotations, host paths mounted into a container or file systems
    without inotify.

Rotation: no record lost or read twice
    A live file is read through an open descriptor, so a rename does not move the reader: when the live
    path names another file (rotated), the reader reads its old file to the end, and once more at the next
    poll (the kubelet renames first and has the runtime reopen after, so a few lines can still come), reads
    the rotated files it has not read (by inode) oldest first, then the new live file from its start. A
    file that is gone while read is read to its end through the descriptor. A live file shorter than what
    was read (truncated in place) is read again from its start. Gzipped files are read only in the catch-up:
    they are the compressed copies of files read before (one rotated and gzipped within a poll interval,
    which neither engine does, would be missed).

A file that vanishes, bounds
    A container whose directory is gone is read to the end of its open files and dropped; after
    `VANISHED_RETENTION_SECONDS` `forget(key)` is called, so its series go and its place under the cap is
    free (pods come and go with every rollout). A physical line longer than `MAX_LINE_BYTES`, a record not
    of the file's format (not JSON, not CRI, a bad time) and an undecodable gzip stream are skipped and
    counted in `unreadable_entries`; a record's text is cut at `max_message_chars`. At most
    `MAX_DIRECTORY_ENTRIES` entries of a directory are looked at. `admit(key)` is asked once per container
    found (the fold's cap, `--journal.max-units`); one refused is not read.

Every failure to read a configured directory raises `ContainerLogError` (an OSError); a container's own
file that cannot be read is skipped (logged once). Single-threaded, like the journal reader.
"""

from __future__ import annotations

import errno
import gzip
import heapq
import logging
import os
import re
import stat
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType

from vllm_xpu_exporter.parsers.containerlogs import MAX_TEXT_CHARS, LogRecord, parse_cri_line, parse_json_file_line
from vllm_xpu_exporter.parsers.workloads import kubernetes_key, uid_of_identity, user_suffix
from vllm_xpu_exporter.sources.containers import MAX_DOCKER_CONFIG_BYTES, DockerEnd, docker_names
from vllm_xpu_exporter.sources.containers import read_small as _read_small
from vllm_xpu_exporter.sources.logs.entry import DEFAULT_BATCH, LogEntry, LogSelection, container_end

log = logging.getLogger("vllm_xpu_exporter.containerlogs")

POLL_SECONDS = 1.0
DISCOVER_SECONDS = 5.0
VANISHED_RETENTION_SECONDS = 900.0
MAX_LINE_BYTES = 1 << 20  # a json-file record of a 16 KiB piece is at most ~100 KiB, even all \u escapes
MAX_DIRECTORY_ENTRIES = 65536
CHUNK_BYTES = 1 << 16
FILE_POLL_BYTES = 1 << 20  # read of one file per poll, at most: the rest comes at the next, without waiting
POLL_BYTES = 4 << 20  # read of all files per poll, at most (a container found while following: its history)
BATCH_CHARS = 8 << 20  # text of the records one read_available() returns, at most (and one record)
MAX_INFLATED_BYTES = 64 << 20  # of one rotated .gz, at most; and at most INFLATE_RATIO times its size
INFLATE_RATIO = 32  # logs compress 5-20 times; a bomb thousands of times
MIN_INFLATED_BYTES = 1 << 20  # what a small .gz may always inflate to

_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
_POD_DIRECTORY = re.compile(r"([^_/]+)_([^_/]+)_([0-9a-f][0-9a-f-]{0,63})")
_RESTART_LOG = re.compile(r"(\d{1,9})\.log")
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO where a log should be must not hang


class ContainerLogError(OSError):
    """A configured log directory cannot be read; str() is the message alone."""

    def __str__(self) -> str:
        return str(self.strerror)


@dataclass(frozen=True)
class LogDirectories:
    """Where the container engines keep their logs: Docker data roots (their `containers/`), the kubelet's
    pod log directory; none given: nothing is read."""

    docker_roots: tuple[str, ...] = ()
    pods: str | None = None

    def __bool__(self) -> bool:
        return bool(self.docker_roots or self.pods)


def boot_realtime_usec() -> int:
    """When this boot began, in microseconds since the epoch (the realtime clock less CLOCK_BOOTTIME)."""
    return round((time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)) * 1e6)


# --- one log file as its writer rotates it ---------------------------------------------------------


@dataclass
class _Open:
    fd: int
    identity: tuple[int, int]  # st_dev, st_ino
    offset: int = 0
    pending: bytearray = field(default_factory=bytearray)  # the unfinished physical line
    discarding: bool = False  # the physical line is over MAX_LINE_BYTES: its rest is skipped


class LogFile:
    """A live log file and its rotated predecessors (`rotated()`: their paths, oldest first). Yields the
    physical lines (without newline) in the order they were written, each once; counts those skipped."""

    def __init__(self, live: str, rotated: Callable[[], list[str]]) -> None:
        self.live = live
        self._rotated = rotated
        self._current: _Open | None = None
        self._draining: _Open | None = None
        self._read: set[tuple[int, int]] = set()  # rotated files read whole, by identity
        self.skipped = 0  # lines over MAX_LINE_BYTES, damaged gzip files, gzip files cut (inflated_cut)
        self.inflated_cut = 0  # rotated .gz files whose inflated bytes went over their bound: the rest unread
        self.unreadable: OSError | None = None  # the latest error opening or reading one of its files

    @property
    def is_open(self) -> bool:
        return self._current is not None or self._draining is not None

    def catch_up(self) -> Iterator[bytes]:
        """Every line there is now, a chunk at a time: the rotated files oldest first (gzipped too), then the
        live one, which stays open."""
        for path in self._rotated():
            if path.endswith(".gz"):
                yield from self._gzipped(path)
            else:
                yield from self._plain(path)
        opened = self._open(self.live)
        if opened is not None:
            self._current = opened
            yield from self._lines(opened)

    def poll(self) -> Iterator[bytes]:
        """The lines written since the last read, across rotations; a file new to the reader is read from
        its start (its plain rotated files too). Lazily: the caller takes what its budget allows and the
        rest from the same iterator at its next poll (a file's lines in order, only one chunk's held)."""
        if self._draining is not None:  # the file renamed at the previous poll, read to its end
            yield from self._lines(self._draining, final=True)
            self._close(self._draining)
            self._draining = None
        current = self._current
        if current is not None:
            yield from self._lines(current)
        try:
            info = os.stat(self.live)
        except OSError:
            return  # renamed and not reopened yet, or gone: the directory says which
        if current is not None and (info.st_dev, info.st_ino) == current.identity:
            if info.st_size < current.offset:  # truncated in place: read it again
                self._close(current)
                self._current = None
                yield from self._open_live()
            return
        if current is not None:  # rotated: read the old one to its end again next time, then the files between
            self._read.add(current.identity)
            self._draining, self._current = current, None
        present: set[tuple[int, int]] = set()
        for path in self._rotated():
            if not path.endswith(".gz"):
                yield from self._plain(path, present)
        self._read &= present  # files gone no longer need remembering
        yield from self._open_live()

    def close(self) -> list[bytes]:
        """The file is gone for good: what is left in its open files; they are closed."""
        return list(self.closing())

    def closing(self) -> Iterator[bytes]:
        """`close()`, lazily: what is left in its open files, each closed once read to its end."""
        for attribute in ("_draining", "_current"):
            opened = getattr(self, attribute)
            if opened is not None:
                yield from self._lines(opened, final=True)
                self._close(opened)
                setattr(self, attribute, None)

    def _open_live(self) -> Iterator[bytes]:
        opened = self._open(self.live)
        if opened is None:
            return
        self._current = opened
        yield from self._lines(opened)

    def _open(self, path: str) -> _Open | None:
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError as error:
            if error.errno != errno.ENOENT:
                self.unreadable = error
            return None
        try:
            info = os.fstat(fd)
        except OSError as error:
            os.close(fd)
            self.unreadable = error
            return None
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            return None
        return _Open(fd, (info.st_dev, info.st_ino))

    def _plain(self, path: str, present: set[tuple[int, int]] | None = None) -> Iterator[bytes]:
        """A rotated file's lines, a chunk at a time, unless it was read already (or is open: the one just
        rotated)."""
        opened = self._open(path)
        if opened is None:
            return
        try:
            if present is not None:
                present.add(opened.identity)
            if opened.identity in self._read or any(
                    other is not None and other.identity == opened.identity for other in (self._current, self._draining)):
                return
            self._read.add(opened.identity)
            yield from self._lines(opened, final=True)
        finally:
            self._close(opened)

    def _gzipped(self, path: str) -> Iterator[bytes]:
        opened = self._open(path)
        if opened is None:
            return
        try:
            size = os.fstat(opened.fd).st_size
            # a gzip bomb is cut, not inflated
            budget = min(MAX_INFLATED_BYTES, max(MIN_INFLATED_BYTES, INFLATE_RATIO * size))
            with os.fdopen(os.dup(opened.fd), "rb") as raw, gzip.GzipFile(fileobj=raw) as stream:
                while chunk := stream.read(min(CHUNK_BYTES, budget + 1)):
                    budget -= len(chunk)
                    if budget < 0:
                        self.skipped += 1
                        self.inflated_cut += 1
                        return
                    yield from self._split(opened, chunk)
            if opened.pending and not opened.discarding:
                yield bytes(opened.pending)
        except (OSError, EOFError, zlib.error):
            self.skipped += 1  # damaged, or still being written: what it held was read before it
        finally:
            self._close(opened)

    def _drain(self, opened: _Open, final: bool = False) -> list[bytes]:
        """The whole lines from `opened`'s position to its end; with `final`, its unfinished last line too."""
        return list(self._lines(opened, final))

    def _lines(self, opened: _Open, final: bool = False) -> Iterator[bytes]:
        while True:
            try:
                chunk = os.read(opened.fd, CHUNK_BYTES)
            except OSError as error:
                self.unreadable = error
                break
            if not chunk:
                break
            opened.offset += len(chunk)
            yield from self._split(opened, chunk)
        if final and opened.pending and not opened.discarding:
            yield bytes(opened.pending)
            opened.pending.clear()

    def _split(self, opened: _Open, chunk: bytes) -> list[bytes]:
        parts = chunk.split(b"\n")
        lines: list[bytes] = []
        for part in parts[:-1]:
            if opened.discarding:  # the end of an overlong line
                opened.discarding = False
                continue
            if opened.pending:
                opened.pending += part
                part = bytes(opened.pending)
                opened.pending.clear()
            if len(part) <= MAX_LINE_BYTES:
                lines.append(part)
            else:
                self.skipped += 1
        last = parts[-1]
        if last and not opened.discarding:
            opened.pending += last
            if len(opened.pending) > MAX_LINE_BYTES:
                self.skipped += 1
                opened.pending.clear()
                opened.discarding = True
        return lines

    @staticmethod
    def _close(opened: _Open) -> None:
        try:
            os.close(opened.fd)
        except OSError:
            pass


def docker_rotated(live: str) -> list[str]:
    """dockerd's rotated files of `live`, oldest first: `live.N[.gz]`, the highest N the oldest; of a plain
    and a gzipped `.N` (dockerd gzips `.1` after a rotation, then removes it), the plain one."""
    numbered: dict[int, str] = {}
    for path in _siblings(live):
        suffix = path[len(live) + 1:]
        number = suffix[:-3] if suffix.endswith(".gz") else suffix
        if number.isdigit() and len(number) <= 9 and (int(number) not in numbered or not path.endswith(".gz")):
            numbered[int(number)] = path
    return [numbered[number] for number in sorted(numbered, reverse=True)]


def kubelet_rotated(live: str) -> list[str]:
    """The kubelet's rotated files of `live`, oldest first: `live.<YYYYmmdd-HHMMSS>[.gz]` (not `.tmp`);
    a gzipped and a plain copy of the same file: the plain one (the kubelet removes it once gzipped)."""
    stamped: dict[str, str] = {}
    for path in _siblings(live):
        suffix = path[len(live) + 1:]
        stamp = suffix[:-3] if suffix.endswith(".gz") else suffix
        if re.fullmatch(r"\d{8}-\d{6}", stamp) and (stamp not in stamped or not path.endswith(".gz")):
            stamped[stamp] = path
    return [stamped[stamp] for stamp in sorted(stamped)]


def _siblings(live: str) -> list[str]:
    directory, name = os.path.split(live)
    try:
        with os.scandir(directory) as entries:
            return [entry.path for _, entry in zip(range(MAX_DIRECTORY_ENTRIES), entries)
                    if entry.name.startswith(name + ".")]
    except OSError:
        return []


# --- containers -------------------------------------------------------------------------------------


@dataclass
class _Stream:
    """One log file of a container and what its records are: one run of the container, or all of them."""

    file: LogFile
    run: str
    parse: Callable[[bytes, int], LogRecord | None]
    order: tuple[int, int] = (0, 0)  # the order of the container's files: restart count, or when created
    end: DockerEnd | None = None  # Docker: its config.v2.json, whose State says when the container ended
    polling: Iterator[bytes] | None = None  # the file's poll() under way: what a poll's budget left unread
    closing: bool = False  # the file is gone for good: `polling` reads what is left in its open files


@dataclass
class _Container:
    key: str
    directory: str  # gone: the container is
    streams: dict[str, _Stream] = field(default_factory=dict)  # by live path
    vanished_at: float | None = None
    catching_up: Iterator[LogEntry] | None = None  # found while following: its history, a budget a poll


class ContainerLogReader:
    """Reads the watched containers' log files (`LogDirectories`) as `LogEntry`s: catches up, then
    follows. The interface `LogFollower` uses (`vllm_xpu_exporter.sources.logs.follower`): open/close, `wait`,
    `read_available`, `unreadable_entries`/`last_unreadable`; `admit(key)` and `forget(key)` as above."""

    def __init__(self, selection: LogSelection, directories: LogDirectories, *,
                 admit: Callable[[str], bool] | None = None, forget: Callable[[str], None] | None = None,
                 max_message_chars: int = MAX_TEXT_CHARS, poll_seconds: float = POLL_SECONDS,
                 discover_seconds: float = DISCOVER_SECONDS,
                 vanished_retention_seconds: float = VANISHED_RETENTION_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.selection = selection
        self.directories = directories
        self._admit = admit
        self._forget = forget
        self.max_message_chars = max_message_chars
        self.poll_seconds = poll_seconds
        self.discover_seconds = discover_seconds
        self.vanished_retention_seconds = vanished_retention_seconds
        self._clock = clock
        self._containers: dict[str, _Container] = {}
        self._refused: set[str] = set()
        self._docker_names: dict[str, tuple[str, str] | None] = {}  # container id -> (key, name); None: no name
        self._since_usec = 0
        self._is_open = False
        self._caught_up = False
        self._catching_up: Iterator[LogEntry] | None = None
        self._pending: deque[LogEntry] = deque()
        self._next_poll = 0.0
        self._next_discovery = 0.0
        self._behind = False  # the last poll left records to read now
        self._polls = 0  # polls made: which container goes first at the next
        self._unreadable = 0
        self._skipped_before = 0  # lines skipped in files no longer followed
        self._unreadable_total = 0
        self.last_unreadable: str | None = None
        self._reported: set[str] = set()

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def unreadable_entries(self) -> int:
        """Lines skipped: not a record of their file's format, longer than MAX_LINE_BYTES, or in a
        damaged gzip file. As of the latest `read_available()` (a plain number: other threads read it)."""
        return self._unreadable_total

    def _count_unreadable(self) -> None:
        self._unreadable_total = self._unreadable + self._skipped_before + sum(
            stream.file.skipped for container in self._containers.values() for stream in container.streams.values())

    @property
    def containers(self) -> frozenset[str]:
        """The keys of the containers read."""
        return frozenset(self._containers)

    def open(self) -> None:
        if self._is_open:
            return
        for directory in self._configured_directories():
            _check_readable_directory(directory)
        self._since_usec = boot_realtime_usec() if self.selection.boot == "current" else 0
        self._is_open = True
        self._discover()

    def close(self) -> None:
        for container in self._containers.values():
            for stream in container.streams.values():
                stream.file.close()
        self._containers.clear()
        self._is_open = False

    def __enter__(self) -> ContainerLogReader:
        self.open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # --- reading ----------------------------------------------------------------------------------

    def wait(self, timeout_s: float) -> bool:
        """Sleep until the next poll is due or `timeout_s` passes; True when records may be there."""
        if self._pending or not self._caught_up or self._behind:
            return True
        remaining = self._next_poll - self._clock()
        if remaining > timeout_s:
            time.sleep(timeout_s)
            return False
        if remaining > 0:
            time.sleep(remaining)
        return True

    def read_available(self, max_entries: int = DEFAULT_BATCH) -> list[LogEntry]:
        """Up to `max_entries` records there are now, without waiting."""
        if not self._is_open:
            raise RuntimeError("ContainerLogReader is not open")
        out: list[LogEntry] = []
        if not self._caught_up:
            if self._catching_up is None:
                self._catching_up = heapq.merge(*(self._catch_up(c) for c in list(self._containers.values())),
                                                key=_time)
            chars = 0
            for entry in self._catching_up:
                out.append(entry)
                chars += len(entry.message)
                if len(out) >= max_entries or chars >= BATCH_CHARS:
                    break
            else:
                self._catching_up = None
                self._caught_up = True
                self._next_poll = self._clock() + self.poll_seconds
            self._count_unreadable()
            return out
        if not self._pending and (self._behind or self._clock() >= self._next_poll):
            self._poll()
            self._count_unreadable()
        while self._pending and len(out) < max_entries:
            out.append(self._pending.popleft())
        return out

    def _poll(self) -> None:
        now = self._clock()
        self._next_poll = now + self.poll_seconds
        if now >= self._next_discovery:
            for container in self._discover():
                container.catching_up = self._catch_up(container)
        self._behind = False
        batches = []
        budget = [POLL_BYTES]  # for all files; one at most FILE_POLL_BYTES (the rest at the next poll)
        containers = list(self._containers.values())
        first = self._polls % len(containers) if containers else 0  # who goes first (and may use the budget up)
        self._polls += 1
        for container in containers[first:] + containers[:first]:
            if container.catching_up is not None:
                batch = _take_entries(container.catching_up, min(FILE_POLL_BYTES, budget[0]))
                budget[0] -= sum(len(entry.message) for entry in batch)
                if batch.done:
                    container.catching_up = None
                else:
                    self._behind = True
                batches.append(batch)
            else:
                batches.append(self._followed(container, budget))
        self._pending.extend(heapq.merge(*batches, key=_time))
        self._forget_vanished(now)

    def _catch_up(self, container: _Container) -> Iterator[LogEntry]:
        for stream in sorted(container.streams.values(), key=lambda s: s.order):
            yield from self._entries(container, stream, stream.file.catch_up())
            ended = self._ended(container, stream)
            if ended is not None:
                yield ended
        self._report(container)

    def _followed(self, container: _Container, budget: list[int]) -> list[LogEntry]:
        """What the container's files have new, as far as `budget` (bytes left for this poll, spent here) and
        FILE_POLL_BYTES a file allow; a file gone for good (the container's directory is gone, or
        a later file of the container's exists: the kubelet removed an old restart's) is read to its end and
        closed."""
        entries: list[LogEntry] = []
        streams = sorted(container.streams.values(), key=lambda s: s.order)
        for index, stream in enumerate(streams):
            if stream.polling is None:
                stream.polling = stream.file.poll()
            lines, done = _take_lines(stream.polling, min(FILE_POLL_BYTES, budget[0]))
            budget[0] -= sum(len(line) + 1 for line in lines)
            entries += self._entries(container, stream, lines)
            if not done:
                self._behind = True
                continue
            stream.polling = None
            if stream.closing:  # read to the end of its files: it goes
                self._skipped_before += stream.file.skipped
                del container.streams[stream.file.live]
                continue
            if container.vanished_at is not None or (index + 1 < len(streams) and not os.path.exists(stream.file.live)):
                # gone: what is left in its open files is read within the budgets too, then it goes
                stream.closing, stream.polling = True, stream.file.closing()
                self._behind = True
                continue
            ended = self._ended(container, stream)
            if ended is not None:
                entries.append(ended)
        self._report(container)
        return entries

    def _ended(self, container: _Container, stream: _Stream) -> LogEntry | None:
        """A Docker container's end as systemd would record a unit's (its main process exited, or it was
        stopped), once, when its config.v2.json says it is not running: so a run that died without a
        cause vLLM printed counts as failed (`other`), and one `docker stop` ended during its init as
        stopped, and neither stays initialising."""
        if stream.end is None:
            return None
        ended = stream.end.ended(self._since_usec)
        return None if ended is None else container_end(container.key, ended, stream.run)

    def _entries(self, container: _Container, stream: _Stream, lines: Iterable[bytes]) -> Iterator[LogEntry]:
        parse, since, key, run, cap = stream.parse, self._since_usec, container.key, stream.run, self.max_message_chars
        for line in lines:
            record = parse(line, cap)
            if record is None:
                if line.strip():
                    self._unreadable += 1
                    self.last_unreadable = f"a line of {stream.file.live} that is not a record of its format"
                continue
            if record.realtime_usec < since:
                continue
            yield LogEntry(key, record.realtime_usec, None, "", record.text, False, "", None, "", run,
                           record.partial, record.stream)

    def _report(self, container: _Container) -> None:
        for stream in container.streams.values():
            error = stream.file.unreadable
            if error is not None and stream.file.live not in self._reported:
                self._reported.add(stream.file.live)
                log.warning("cannot read the log of %s (%s: %s); the exporter needs read access to the engines' "
                            "log files (root, or CAP_DAC_READ_SEARCH)", container.key, stream.file.live,
                            error.strerror or error)

    # --- finding containers ---------------------------------------------------------------------------

    def _configured_directories(self) -> list[str]:
        directories = [os.path.join(root, "containers") for root in self.directories.docker_roots]
        if self.directories.pods:
            directories.append(self.directories.pods)
        return directories

    def _discover(self) -> list[_Container]:
        """Finds containers, restarts and files that appeared, and containers that are gone; returns the
        containers new to the reader (their files are read from their start)."""
        self._next_discovery = self._clock() + self.discover_seconds
        seen: set[str] = set()
        new: list[_Container] = []
        for root in self.directories.docker_roots:
            self._discover_docker(os.path.join(root, "containers"), seen, new)
        if self.directories.pods:
            self._discover_pods(self.directories.pods, seen, new)
        now = self._clock()
        for key, container in self._containers.items():
            if key in seen:
                container.vanished_at = None
            elif container.vanished_at is None:
                container.vanished_at = now  # its files are read to their end and closed (_followed)
        return new

    def _discover_docker(self, directory: str, seen: set[str], new: list[_Container]) -> None:
        listed = [name for name in _list_directory(directory) if _CONTAINER_ID.fullmatch(name)]
        for gone in set(self._docker_names) - set(listed):
            del self._docker_names[gone]
        for name in listed:
            container_directory = os.path.join(directory, name)
            live = os.path.join(container_directory, f"{name}-json.log")
            known = next((c for c in self._containers.values() if live in c.streams), None)
            if known is not None:
                seen.add(known.key)
                continue
            if not os.path.exists(live):
                continue  # another log driver (journald, local), or not started yet
            if name not in self._docker_names:
                self._docker_names[name] = self._docker_name(container_directory, name)
            named = self._docker_names[name]
            if named is None:
                continue
            key, container_name = named
            if not self.selection.matches_container(key, container_name) or not self._admitted(key):
                continue
            container = self._container(key, container_directory, new)
            seen.add(key)
            try:
                created = os.stat(live).st_ctime_ns
            except OSError:
                created = 0
            container.streams[live] = _Stream(LogFile(live, partial(docker_rotated, live)), name,
                                              parse_json_file_line, (0, created),
                                              end=DockerEnd((os.path.join(container_directory, "config.v2.json"),),
                                                            owner=uid_of_identity(key)))

    def _docker_name(self, container_directory: str, container_id: str) -> tuple[str, str] | None:
        """The container's key and name from its config.v2.json (dockerd writes it before the log), of the
        user who owns the container's directory: a rootless dockerd's containers are that user's
        (`docker/<name>@uid<N>`), and only root's dockerd can write into root's data root."""
        try:
            owner = os.stat(container_directory).st_uid
        except OSError:
            return None
        data = _read_small(os.path.join(container_directory, "config.v2.json"), MAX_DOCKER_CONFIG_BYTES,
                           owner=owner)
        try:
            names = docker_names(data, container_id) if 0 < len(data) <= MAX_DOCKER_CONFIG_BYTES else None
        except (ValueError, RecursionError):
            names = None
        if names is None or names.key is None:
            return None
        return names.key + user_suffix(owner), names.container

    def _discover_pods(self, directory: str, seen: set[str], new: list[_Container]) -> None:
        for pod_directory in _list_directory(directory):
            match = _POD_DIRECTORY.fullmatch(pod_directory)
            if match is None:
                continue
            namespace, pod, uid = match.groups()
            pod_path = os.path.join(directory, pod_directory)
            for container_name in _list_directory(pod_path):
                key = kubernetes_key(namespace, pod, container_name)
                if key is None or not self.selection.matches_container(key, container_name):
                    continue
                if not self._admitted(key):
                    continue
                container_path = os.path.join(pod_path, container_name)
                container = self._container(key, container_path, new)
                seen.add(key)
                for file_name in _list_directory(container_path):
                    restart = _RESTART_LOG.fullmatch(file_name)
                    live = os.path.join(container_path, file_name)
                    if restart is None or live in container.streams:
                        continue
                    number = int(restart.group(1))
                    container.streams[live] = _Stream(LogFile(live, partial(kubelet_rotated, live)),
                                                      f"{uid}/{container_name}/{number}", parse_cri_line, (number, 0))

    def _container(self, key: str, directory: str, new: list[_Container]) -> _Container:
        container = self._containers.get(key)
        if container is None:
            container = self._containers[key] = _Container(key, directory)
            if self._caught_up:
                new.append(container)
        return container

    def _admitted(self, key: str) -> bool:
        if key in self._containers:
            return True
        if key in self._refused:
            return False
        if self._admit is not None and not self._admit(key):
            self._refused.add(key)
            return False
        return True

    def _forget_vanished(self, now: float) -> None:
        for key in [k for k, c in self._containers.items()
                    if c.vanished_at is not None and now - c.vanished_at >= self.vanished_retention_seconds]:
            container = self._containers.pop(key)
            for stream in container.streams.values():
                stream.file.close()
                self._skipped_before += stream.file.skipped
            if self._forget is not None:
                self._forget(key)


class _Taken(list):
    done = False  # the iterator taken from is exhausted


def _take_lines(lines: Iterator[bytes], budget: int) -> tuple[list[bytes], bool]:
    """Lines of `lines` until `budget` bytes are taken (the line that crosses it included); and whether
    `lines` is exhausted."""
    taken: list[bytes] = []
    while budget > 0:
        line = next(lines, None)
        if line is None:
            return taken, True
        taken.append(line)
        budget -= len(line) + 1
    return taken, False


def _take_entries(entries: Iterator[LogEntry], budget: int) -> _Taken:
    """Entries of `entries` until `budget` characters of text are taken; `.done` when it is exhausted."""
    taken = _Taken()
    while budget > 0:
        entry = next(entries, None)
        if entry is None:
            taken.done = True
            return taken
        taken.append(entry)
        budget -= len(entry.message) + 1
    return taken


def partial(function: Callable[[str], list[str]], live: str) -> Callable[[], list[str]]:
    return lambda: function(live)


def _time(entry: LogEntry) -> int:
    return entry.realtime_usec


def _list_directory(directory: str) -> list[str]:
    try:
        with os.scandir(directory) as entries:
            return [entry.name for _, entry in zip(range(MAX_DIRECTORY_ENTRIES), entries)]
    except OSError:
        return []


def _check_readable_directory(path: str) -> None:
    try:
        is_directory = stat.S_ISDIR(os.stat(path).st_mode)
    except FileNotFoundError:
        raise ContainerLogError(errno.ENOENT, f"container log directory {path} does not exist") from None
    except OSError as error:
        raise ContainerLogError(error.errno, f"container log directory {path} is not readable: "
                                             f"{(error.strerror or str(error)).lower()}") from None
    if not is_directory:
        raise ContainerLogError(errno.ENOTDIR, f"container log directory {path} is not a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise ContainerLogError(errno.EACCES, f"container log directory {path} is not readable: permission "
                                              f"denied (the exporter needs root or CAP_DAC_READ_SEARCH)")
