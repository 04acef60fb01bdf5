"""The journal's files: whether the reader may read them (a clear error before sd-journal's), and the pages of
them it has mapped, dropped so that its memory does not grow with the journal."""

from __future__ import annotations

import ctypes
import errno
import os
import re
import stat
from collections.abc import Callable, Iterable

from vllm_xpu_exporter.sources.journal.binding import JournalError

SYSTEM_JOURNAL_DIRECTORIES = ("/run/log/journal", "/var/log/journal")
_HEX32 = re.compile(r"[0-9a-f]{32}")
MADV_DONTNEED = 4
_JOURNAL_MAPPING = re.compile(rb"^([0-9a-f]+)-([0-9a-f]+) r--s .*\.journal~?(?: \(deleted\))?$", re.MULTILINE)


def libc_madvise() -> Callable[[int, int, int], int]:
    """libc's madvise(2): 0, or -1 with errno set."""
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.restype = ctypes.c_int
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return madvise


def release_journal_pages(madvise: Callable[[int, int, int], int], maps_path: str = "/proc/self/maps") -> int:
    """Drop the resident pages of this process's read-only journal file mappings; bytes released.

    sd-journal maps journal files in 8 MiB windows and keeps up to 64 of them mapped, so after
    a catch-up every page it touched (hundreds of MiB for a big journal) counts in the reader's
    RSS although it is only page cache. MADV_DONTNEED on a shared read-only file mapping only
    unmaps the pages from this process: the mapping stays valid and the next access faults the
    (current) page back in from the page cache. The file data is never changed or lost.
    """
    try:
        with open(maps_path, "rb") as maps:
            text = maps.read()
    except OSError:
        return 0
    released = 0
    for match in _JOURNAL_MAPPING.finditer(text):
        start, end = int(match.group(1), 16), int(match.group(2), 16)
        if madvise(start, end - start, MADV_DONTNEED) == 0:
            released += end - start
    return released


def check_readable_directory(path: str) -> None:
    """Raise JournalError unless ``path`` is a directory whose journal files we can read."""
    try:
        is_directory = stat.S_ISDIR(os.stat(path).st_mode)
    except FileNotFoundError:
        raise JournalError("stat", errno.ENOENT, message=f"journal directory {path} does not exist") from None
    except OSError as error:
        raise JournalError("stat", error.errno, message=(
            f"journal directory {path} is not readable: {error.strerror.lower()}")) from None
    if not is_directory:
        raise JournalError("stat", errno.ENOTDIR, message=f"journal directory {path} is not a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise JournalError("access", errno.EACCES, message=(
            f"journal directory {path} is not readable: permission denied"))
    journal_files = list(_journal_files_under(path))
    if journal_files and not any(os.access(p, os.R_OK) for p in journal_files):
        raise JournalError("access", errno.EACCES, message=(
            f"no journal file in {path} is readable: permission denied (the reader needs group systemd-journal or adm)"))


def _journal_files_under(path: str) -> Iterable[str]:
    """Journal files in ``path`` and its machine-id subdirectories, where sd-journal looks."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        if entry.name.endswith((".journal", ".journal~")):
            yield entry.path
        elif _HEX32.fullmatch(entry.name) and entry.is_dir():
            try:
                yield from (e.path for e in os.scandir(entry.path) if e.name.endswith((".journal", ".journal~")))
            except OSError:
                continue


def check_readable_file(path: str) -> None:
    try:
        os.stat(path)
    except FileNotFoundError:
        raise JournalError("stat", errno.ENOENT, message=f"journal file {path} does not exist") from None
    except OSError as error:
        raise JournalError("stat", error.errno, message=(
            f"journal file {path} is not readable: {error.strerror.lower()}")) from None
    if not os.access(path, os.R_OK):
        raise JournalError("access", errno.EACCES, message=f"journal file {path} is not readable: permission denied")
