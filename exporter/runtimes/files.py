"""Reading runtimes' state and log directories, bounded: what every runtime's I/O module shares.

State files are untrusted input (a container's name and labels are chosen by whoever runs it; a path flag may
point anywhere): a file that is missing, not a regular file, larger than its bound or unreadable gives b"" (or
None), never an exception; a FIFO where a file should be never hangs (``OPEN_FILE``).
"""

from __future__ import annotations

import codecs
import errno
import json
import logging
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from typing import IO

from vllm_xpu_exporter.runtimes import LoggedContainer, LogStream, StateTooLarge

log = logging.getLogger("vllm_xpu_exporter.containers")

OPEN_FILE = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO where a file should be must not hang a scrape
MAX_DIRECTORY_ENTRIES = 65536  # of a state or log directory: a node runs at most a few hundred containers
STATE_CHUNK_BYTES = 64 << 10


def read_small(path: str, limit: int, report: Callable[[OSError], None] | None = None,
               too_large: Callable[[], None] | None = None, owner: int | None = None) -> bytes:
    """A regular file of at most `limit` bytes (and of user `owner`, when given); b"" when it is not one or
    cannot be read (`report`, when given, is told why it could not; `too_large` that it is over `limit`)."""
    try:
        fd = os.open(path, OPEN_FILE)
    except OSError as error:
        if report is not None:
            report(error)
        return b""
    try:
        info = os.fstat(fd)
        if owner is not None and info.st_uid != owner:
            log.debug("%s: not owned by uid %d", path, owner)
            return b""
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            log.debug("%s: not a regular file of at most %d bytes", path, limit)
            if stat.S_ISREG(info.st_mode) and too_large is not None:
                too_large()
            return b""
        data = os.read(fd, limit + 1)
    except OSError as error:
        if report is not None:
            report(error)
        return b""
    finally:
        os.close(fd)
    return data if len(data) <= limit else b""


def list_directory(directory: str) -> list[str]:
    """The names in a directory (at most MAX_DIRECTORY_ENTRIES); none when it cannot be listed."""
    try:
        with os.scandir(directory) as entries:
            return [entry.name for _, entry in zip(range(MAX_DIRECTORY_ENTRIES), entries)]
    except OSError:
        return []


def siblings(live: str) -> list[str]:
    """The paths beside file `live` whose names begin with its name and a dot (its rotated files)."""
    directory, name = os.path.split(live)
    try:
        with os.scandir(directory) as entries:
            return [entry.path for _, entry in zip(range(MAX_DIRECTORY_ENTRIES), entries)
                    if entry.name.startswith(name + ".")]
    except OSError:
        return []


def json_array_items(stream: IO[bytes], limit: int, max_item_bytes: int) -> Iterator[object]:
    """The items of the JSON array `stream` holds, one at a time; the text held is at most one item
    (`max_item_bytes`) and a chunk. None when it is no JSON array; ValueError when it is one cut short or
    holding what is not JSON; StateTooLarge beyond `limit` bytes or an item over `max_item_bytes`."""
    decoder = json.JSONDecoder()
    text = codecs.getincrementaldecoder("utf-8")()
    buffer, position, read, begun, at_end = "", 0, 0, False, False
    while True:
        if not at_end:
            chunk = stream.read(STATE_CHUNK_BYTES)
            read += len(chunk)
            if read > limit:
                raise StateTooLarge(f"more than {limit} bytes")
            at_end = not chunk
            buffer = buffer[position:] + text.decode(chunk, final=at_end)
            position = 0
        while True:
            while position < len(buffer) and buffer[position] in " \t\r\n":
                position += 1
            if position == len(buffer):
                break
            if not begun:
                if buffer[position] != "[":
                    return  # JSON of another shape (or none): no items
                begun = True
                position += 1
                continue
            if buffer[position] == "]":
                return
            if buffer[position] == ",":
                position += 1
                continue
            try:
                item, end = decoder.raw_decode(buffer, position)
            except json.JSONDecodeError:
                if at_end:
                    raise ValueError("a JSON array cut short") from None
                if len(buffer) - position > max_item_bytes:
                    raise StateTooLarge(f"an entry of more than {max_item_bytes} bytes") from None
                break  # the item goes on in the next chunk
            if end - position > max_item_bytes:
                raise StateTooLarge(f"an entry of more than {max_item_bytes} bytes")
            position = end
            yield item
        if at_end:
            raise ValueError("a JSON array cut short")


class StateFiles:
    """The reads of runtimes' state a `ContainerNames` makes: files and directories read again only when they
    changed, state files over their bound counted (`cut`), a denied directory logged once. Not thread-safe."""

    def __init__(self) -> None:
        # file or directory -> (its signature, what it maps); re-read when the signature changes
        self._lists: dict[str, tuple[tuple[int, ...], dict]] = {}
        self._reported: set[str] = set()
        self.cut_files = 0
        """State files not read because they, or one container's entry in them, are over their size bound."""

    def read(self, path: str, limit: int, root: str, owner: int | None = None) -> bytes | None:
        """A regular file of at most `limit` bytes (owned by `owner`, if given), else None (a failure to read
        it reported, one too large counted)."""
        return read_small(path, limit, lambda error: self.report(root, path, error),
                          lambda: self.cut(path, f"larger than {limit} bytes"), owner) or None

    def cached(self, path: str, root: str, read: Callable[[str, str], dict]) -> dict:
        """What `read` makes of a file or directory, read again only when its signature (inode, size, change
        and modification times) changed; {} when it cannot be looked at."""
        try:
            info = os.stat(path)
        except OSError as error:
            self.report(root, path, error)
            self._lists.pop(path, None)
            return {}
        signature = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        known = self._lists.get(path)
        if known is not None and known[0] == signature:
            return known[1]
        try:
            mapped = read(path, root)
        except (OSError, ValueError, TypeError, RecursionError, MemoryError) as error:
            log.debug("%s: %s", path, error)
            mapped = {}
        self._lists[path] = (signature, mapped)
        return mapped

    def listing(self, directory: str, root: str) -> list[str]:
        """The names in a directory (at most MAX_DIRECTORY_ENTRIES); a failure to list it reported."""
        names = []
        try:
            with os.scandir(directory) as entries:
                for index, entry in enumerate(entries):
                    if index >= MAX_DIRECTORY_ENTRIES:
                        log.debug("%s: more than %d entries, the rest not read", directory, MAX_DIRECTORY_ENTRIES)
                        break
                    names.append(entry.name)
        except OSError as error:
            self.report(root, directory, error)
        return names

    def cut(self, path: str, why: str) -> None:
        """A state file not read for its size: counted, logged at debug."""
        self.cut_files += 1
        log.debug("container names: %s not read: %s", path, why)

    def report(self, root: str, path: str, error: OSError) -> None:
        """A missing file or directory is normal (an engine not installed, a container gone); a denied one
        is logged once per state directory (`root`), at info, saying what would let the exporter read it."""
        if error.errno in (errno.EACCES, errno.EPERM):
            if root not in self._reported:
                self._reported.add(root)
                log.info("container names: cannot read %s (%s); the exporter needs read access to the engines' "
                         "state (root, or CAP_DAC_READ_SEARCH); the containers keep their cgroup names",
                         path, error.strerror)
        else:
            log.debug("container names: %s: %s", path, error.strerror)


class LogFilePerContainer:
    """The containers of a runtime that writes one log file a container in the container's own directory
    (Docker's json-file, Podman's k8s-file), for a `LogFinder`: each container's key and name looked up once
    and kept by id until a discovery no longer meets the container."""

    def __init__(self) -> None:
        self._names: dict[str, tuple[str, str] | None] = {}  # container id -> (key, name); None: no name
        self._met: set[str] = set()

    def container(self, container_id: str, directory: str, live: str, followed: Mapping[str, str],
                  named: Callable[[], tuple[str, str] | None],
                  stream: Callable[[str, int], LogStream]) -> LoggedContainer | None:
        """The container of `directory` whose log file is `live`: its key alone when `live` is followed already;
        None when there is no such file (another log driver, or not started yet) or `named()` gives no
        (key, name); else with `stream(key, the file's change time in ns)`."""
        self._met.add(container_id)
        known = followed.get(live)
        if known is not None:
            return LoggedContainer(known, "", directory, [])
        if not os.path.exists(live):
            return None
        if container_id not in self._names:
            self._names[container_id] = named()
        found = self._names[container_id]
        if found is None:
            return None
        try:
            created = os.stat(live).st_ctime_ns
        except OSError:
            created = 0
        return LoggedContainer(found[0], found[1], directory, [stream(found[0], created)])

    def discovered(self) -> None:
        """A discovery is done: the names of the containers it did not meet are forgotten."""
        for gone in set(self._names) - self._met:
            del self._names[gone]
        self._met = set()
