"""Containers' log files as a source of what their engines printed (Docker's `json-file` logs, Podman's
`k8s-file` logs, the CRI log files of the kubelet's pods: each runtime's that keeps them,
`vllm_xpu_exporter.runtimes`), read-only, caught up then followed, as log entries for the same fold.

Usable alone from a Python shell::

    >>> from vllm_xpu_exporter.sources.containerlogs import ContainerLogReader, LogDirectories
    >>> from vllm_xpu_exporter.sources.logs.entry import LogSelection
    >>> selection = LogSelection(container_globs=["*vllm*"], boot="all")
    >>> with ContainerLogReader(selection, LogDirectories(docker_roots=("/var/lib/docker",))) as reader:
    ...     for entry in reader.read_available(100):
    ...         print(entry.unit, entry.message)

Where the files are
    Each container runtime's (`vllm_xpu_exporter.runtimes`: its state module's `log_finder`, for the
    `LogDirectories` keywords it names): Docker's json-file logs in each `docker_roots` root (`--path.docker`),
    `<root>/containers/<id>/<id>-json.log`, its key `docker/<name>` from `config.v2.json` beside it; Podman's
    k8s-file logs in each `podman_storages` storage (`--path.podman`), `<driver>-containers/<id>/userdata/ctr.log`,
    its key `podman/<name>` from the storage's `containers.json`; the kubelet's CRI files under `pods`
    (`--path.pods`), `<pods>/<namespace>_<pod>_<uid>/<container>/<n>.log`, one a restart, key
    `k8s/<namespace>/<pod>/<container>`. Which files are a live file's rotated ones, and how a
    record is parsed, is the runtime's too. A container is watched when the selection's container globs match
    it (`LogSelection.matches_container`: its name, or its key for a glob with `/`).

What an entry is
    One record (`vllm_xpu_exporter.runtimes.LogRecord`): `LogEntry` with the container's key as `unit`, the
    record's own time as `realtime_usec` (the engine's clock, not journald's), its stream, the `partial`
    flag of a piece (a json-file `log` without its newline, a CRI `P`), and as `container_run` its file's run
    (Docker: the container's id, a restart of the same container keeps its id and its file, and vLLM's first
    line tells the runs apart, `vllm_xpu_exporter.fold.container_runs`; the kubelet's: one run a file). A
    container's end, where its runtime's state says it (`LogStream.end`), is handed on as systemd's record of a
    unit's end. With `boot="current"` (the selection's `--journal.boot`) records from before this boot are
    skipped, as the journal reads only the running boot; with `all` or a boot id, every record is read.

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
    Each file is a `vllm_xpu_exporter.sources.logfile.LogFile`, read through an open descriptor across its
    writer's renames, truncations and gzipped copies.

A file that vanishes, bounds
    A container whose directory is gone is read to the end of its open files and dropped; after
    `VANISHED_RETENTION_SECONDS` `forget(key)` is called, so its series go and its place under the cap is free
    (pods come and go with every rollout). A physical line longer than `logfile.MAX_LINE_BYTES`, a record not of
    the file's format (not JSON, not CRI, a bad time) and an undecodable gzip stream are skipped and counted in
    `unreadable_entries`; a record's text is cut at `max_message_chars`. At most
    `runtimes.files.MAX_DIRECTORY_ENTRIES` entries of a directory are looked at. `admit(key)` is asked once per
    container found (the fold's cap, `--journal.max-units`); one refused is not read.

Every failure to read a configured directory raises `ContainerLogError` (an OSError); a container's own
file that cannot be read is skipped (logged once). Single-threaded, like the journal reader.
"""

from __future__ import annotations

import errno
import heapq
import logging
import os
import stat
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType

from vllm_xpu_exporter.runtimes import MAX_TEXT_CHARS, LogFinder, LogStream
from vllm_xpu_exporter.runtimes.registry import RUNTIMES
from vllm_xpu_exporter.sources.logfile import LogFile
from vllm_xpu_exporter.sources.logs.entry import DEFAULT_BATCH, LogEntry, LogSelection, container_end

log = logging.getLogger("vllm_xpu_exporter.containerlogs")

POLL_SECONDS = 1.0
DISCOVER_SECONDS = 5.0
VANISHED_RETENTION_SECONDS = 900.0
FILE_POLL_BYTES = 1 << 20  # read of one file per poll, at most: the rest comes at the next, without waiting
POLL_BYTES = 4 << 20  # read of all files per poll, at most (a container found while following: its history)
BATCH_CHARS = 8 << 20  # text of the records one read_available() returns, at most (and one record)


class ContainerLogError(OSError):
    """A configured log directory cannot be read; str() is the message alone."""

    def __str__(self) -> str:
        return str(self.strerror)


class LogDirectories:
    """Where the container runtimes keep their logs, by the keywords their state modules name (`LOG_LOCATIONS`:
    `docker_roots`, Docker's data roots; `podman_storages`, Podman's storages; `pods`, the kubelet's pod log
    directory); none given: nothing is read."""

    def __init__(self, **locations: object) -> None:
        known = {name for runtime in RUNTIMES for name in runtime.state.LOG_LOCATIONS}
        unknown = set(locations) - known
        if unknown:
            raise TypeError(f"no container runtime keeps its logs at {', '.join(sorted(unknown))}")
        self.locations = {name: tuple(value) if isinstance(value, (list, tuple)) else value
                          for name, value in locations.items() if value}

    def __bool__(self) -> bool:
        return bool(self.locations)

    def __repr__(self) -> str:
        return f"LogDirectories({', '.join(f'{name}={value!r}' for name, value in self.locations.items())})"

    def finders(self) -> list[LogFinder]:
        """Each runtime's finder of its containers' log files in these directories, in the registry's order."""
        finders = []
        for runtime in RUNTIMES:
            locations = {name: self.locations[name] for name in runtime.state.LOG_LOCATIONS if name in self.locations}
            finder = runtime.state.log_finder(locations) if locations else None
            if finder is not None:
                finders.append(finder)
        return finders


def boot_realtime_usec() -> int:
    """When this boot began, in microseconds since the epoch (the realtime clock less CLOCK_BOOTTIME)."""
    return round((time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)) * 1e6)


# --- containers -------------------------------------------------------------------------------------


@dataclass
class _Stream:
    """One log file of a container as its runtime lays it out (`spec`: one run of the container, or all of them),
    and how far it is read."""

    spec: LogStream
    file: LogFile
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
    follows; a `vllm_xpu_exporter.sources.logs.follower.LogReader`. `admit(key)` and `forget(key)` as above."""

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
        self._finders = directories.finders()
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
    def rejected_entries(self) -> dict[str, int]:
        """None: a container's log file is its runtime's own, nobody else writes records into it."""
        return {}

    @property
    def containers(self) -> frozenset[str]:
        """The keys of the containers read."""
        return frozenset(self._containers)

    def open(self) -> None:
        if self._is_open:
            return
        for finder in self._finders:
            for directory in finder.directories():
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

    def read_latest_invocations(self, sufficient: Callable[[list[LogEntry]], bool], *,
                                max_units: int | None = None) -> list[LogEntry] | None:
        """None: a container's lines carry no invocation id, so its latest runs are read with the whole log."""
        return None

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
        for stream in sorted(container.streams.values(), key=lambda s: s.spec.order):
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
        streams = sorted(container.streams.values(), key=lambda s: s.spec.order)
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
        """A container's end as systemd would record a unit's (its main process exited, or it was stopped),
        once, when its runtime's state says it is not running (`LogStream.end`: Docker's config.v2.json): so a
        run that died without a cause vLLM printed counts as failed (`other`), and one stopped during its init
        as stopped, and neither stays initialising."""
        if stream.spec.end is None:
            return None
        ended = stream.spec.end.ended(self._since_usec)
        return None if ended is None else container_end(container.key, ended.realtime_usec, ended.stopped,
                                                          stream.spec.run)

    def _entries(self, container: _Container, stream: _Stream, lines: Iterable[bytes]) -> Iterator[LogEntry]:
        parse, since, key, run, cap = stream.spec.parse, self._since_usec, container.key, stream.spec.run, \
            self.max_message_chars
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

    def _discover(self) -> list[_Container]:
        """Finds containers, restarts and files that appeared, and containers that are gone; returns the
        containers new to the reader (their files are read from their start)."""
        self._next_discovery = self._clock() + self.discover_seconds
        seen: set[str] = set()
        new: list[_Container] = []
        followed = {live: container.key for container in self._containers.values() for live in container.streams}
        for finder in self._finders:
            for found in finder.find(followed):
                if found.key not in self._containers and not (
                        self.selection.matches_container(found.key, found.name) and self._admitted(found.key)):
                    continue
                container = self._container(found.key, found.directory, new)
                seen.add(found.key)
                for spec in found.streams:
                    if spec.live not in container.streams:
                        container.streams[spec.live] = _Stream(spec, LogFile(spec.live, spec.rotated))
        now = self._clock()
        for key, container in self._containers.items():
            if key in seen:
                container.vanished_at = None
            elif container.vanished_at is None:
                container.vanished_at = now  # its files are read to their end and closed (_followed)
        return new

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


def _time(entry: LogEntry) -> int:
    return entry.realtime_usec


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
