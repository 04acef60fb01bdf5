"""Where the reader is in the journal, and how it gets back there: the cursor of its position, the entries of
newly watched units before it (back-filled), and the seek back to it (``JournalReader``: units found while
following, a journal directory that appeared)."""

from __future__ import annotations

import ctypes

from vllm_xpu_exporter.sources.journal.binding import JournalError, LibSystemd
from vllm_xpu_exporter.sources.journal.decoder import Decoder
from vllm_xpu_exporter.sources.logs.entry import LogEntry


def position_cursor(lib: LibSystemd, handle: ctypes.c_void_p, last_returned: LogEntry | None) -> bytes:
    """A cursor of the entry the handle is on (after reaching the end: the last one read).

    If that entry's file was deleted under the handle, sd-journal has no cursor for it; one
    made of the last returned entry's boot id and timestamps (sd_journal_seek_cursor takes
    such partial cursors) locates the same place.
    """
    try:
        return lib.sd_journal_get_cursor(handle)
    except JournalError as error:
        last = last_returned
        if last is None:
            raise JournalError(error.function, error.errno,
                               message=f"the journal read position was lost: {error.strerror}") from None
    cursor = f"b={last.boot_id};t={last.realtime_usec:x}"
    if last.monotonic_usec is not None:
        cursor += f";m={last.monotonic_usec:x}"
    return cursor.encode()


def entries_before(lib: LibSystemd, handle: ctypes.c_void_p, cursor: bytes, decode: Decoder,
                   units: dict[bytes, str], containers: dict[bytes, str]) -> list[LogEntry]:
    """The given units' and containers' entries before ``cursor``, in journal order (moves the handle; the
    handle's matches are to select them)."""
    lib.sd_journal_seek_cursor(handle, cursor)
    found: list[LogEntry] = []
    while lib.sd_journal_previous(handle):
        if lib.sd_journal_test_cursor(handle, cursor):
            continue
        entry = decode(units, containers)
        if entry is not None:
            found.append(entry)
    found.reverse()
    return found


def resume_at(lib: LibSystemd, handle: ctypes.c_void_p, cursor: bytes, cursor_entry_returned: bool) -> bool:
    """Put the handle back on the entry at ``cursor`` or, if that is gone, on the next one; whether the entry
    the handle is then on is selected and not returned yet."""
    lib.sd_journal_seek_cursor(handle, cursor)
    if not lib.sd_journal_next(handle):
        return False
    if lib.sd_journal_test_cursor(handle, cursor):
        return not cursor_entry_returned
    return True  # the cursor's entry was vacuumed; the one the handle is on has not been returned
