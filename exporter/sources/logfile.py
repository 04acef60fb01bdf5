"""One log file followed as its writer rotates it: `LogFile`, the physical lines of a live file and its rotated
predecessors, each once, in the order they were written.

A live file is read through an open descriptor, so a rename does not move the reader: when the live path names
another file (rotated), the reader reads its old file to the end, and once more at the next poll (the kubelet
renames first and has the runtime reopen after, so a few lines can still come), reads the rotated files it has
not read (by inode) oldest first, then the new live file from its start. A file that is gone while read is read
to its end through the descriptor. A live file shorter than what was read (truncated in place) is read again
from its start. Gzipped files are read only in the catch-up: they are the compressed copies of files read before.
A physical line longer than `MAX_LINE_BYTES` and an undecodable gzip stream are skipped and counted (`skipped`);
a gzip bomb is cut (`inflated_cut`). Which files are the rotated ones is the writer's (a container runtime's
`rotated_files`), given as `rotated`.
"""

from __future__ import annotations

import errno
import gzip
import os
import stat
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

MAX_LINE_BYTES = 1 << 20  # a json-file record of a 16 KiB piece is at most ~100 KiB, even all \u escapes
CHUNK_BYTES = 1 << 16
MAX_INFLATED_BYTES = 64 << 20  # of one rotated .gz, at most; and at most INFLATE_RATIO times its size
INFLATE_RATIO = 32  # logs compress 5-20 times; a bomb thousands of times
MIN_INFLATED_BYTES = 1 << 20  # what a small .gz may always inflate to

_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO where a log should be must not hang



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
