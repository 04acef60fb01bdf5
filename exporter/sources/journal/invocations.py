"""The latest invocations of watched units, read backwards from the journal's tail: what the init gate and the
planner start from (``JournalReader.read_latest_invocations`` says when and what; this walks the handle)."""

from __future__ import annotations

import ctypes
import errno
from collections.abc import Callable

from vllm_xpu_exporter.sources.journal.binding import JournalError, LibSystemd
from vllm_xpu_exporter.sources.journal.decoder import (FIELD_INVOCATION_ID, FIELD_PID, FIELD_SYSTEMD_INVOCATION_ID,
                                                       FIELD_SYSTEMD_UNIT, FIELD_UNIT, Decoder)
from vllm_xpu_exporter.sources.logs.entry import LogEntry

MAX_INVOCATIONS_BACK = 8
"""``JournalReader.read_latest_invocations`` reads at most this many of a unit's latest invocations."""
HEAD_CHUNK = 256
"""An invocation's output is read from its start in chunks of this many entries, doubled until its init ended."""
TAIL_ENTRIES = 256
"""... and these many of its last entries (after its init's end)."""


class InvocationWalk:
    """Reads watched units' latest invocations on an open journal handle (one thread, as the handle).

    ``match_units(units)`` makes the handle's matches select those units' entries; ``release_pages()`` drops
    the journal's mapped pages, called every ``release_every`` entries read and after each unit."""

    def __init__(self, lib: LibSystemd, handle: ctypes.c_void_p, decode: Decoder, *, boot_id: str | None,
                 match_units: Callable[[dict[bytes, str]], None], release_pages: Callable[[], object],
                 release_every: int, init_over: Callable[[list[LogEntry]], bool] | None = None) -> None:
        self._lib = lib
        self._handle = handle
        self._decode = decode
        self._boot_id = boot_id
        self._match_units = match_units
        self._release_pages = release_pages
        self._release_every = release_every
        self._init_over = init_over
        self._tail_usec = 0

    def read(self, units: dict[bytes, str], sufficient: Callable[[list[LogEntry]], bool],
             max_invocations: int) -> tuple[list[LogEntry], bytes] | None:
        """The entries of each unit's latest invocations that a decision needs (``_entries_of_invocation``), in
        journal order, and the cursor of the units' last entry in the journal (the tail, where the reader goes on
        from); None when they cannot be told (``JournalReader.read_latest_invocations`` says when) or the boot
        has no entry of the units."""
        lib, handle = self._lib, self._handle
        self._match_units(units)
        lib.sd_journal_seek_tail(handle)
        if not lib.sd_journal_previous(handle):
            return None
        tail = lib.sd_journal_get_cursor(handle)
        usec = ctypes.c_uint64()
        if lib.raw_get_realtime_usec(handle, ctypes.byref(usec)) < 0:
            return None
        self._tail_usec = usec.value
        selected: list[LogEntry] = []
        self._release_pages()
        for raw in sorted(units):
            entries = self._latest_of(raw, units[raw], tail, sufficient, max_invocations)
            self._release_pages()  # as the forward read does: the pages are only page cache
            if entries is None:
                return None
            selected += entries
        return in_journal_order(selected), tail

    def _latest_of(self, raw: bytes, name: str, tail: bytes, sufficient: Callable[[list[LogEntry]], bool],
                   max_invocations: int) -> list[LogEntry] | None:
        """The entries of the unit's invocations to read, in journal order; None: read the boot."""
        lib, handle = self._lib, self._handle
        unit = {raw: name}
        self._match_units(unit)
        lib.sd_journal_seek_cursor(handle, tail)
        if not lib.sd_journal_previous(handle):
            return []  # no entry of the unit in the boot
        chosen: list[bytes] = []
        entries: list[LogEntry] = []
        while True:
            invocation = self._invocation_here(raw)
            if invocation is None or invocation in chosen:
                return None
            chosen.append(invocation)
            found = self._entries_of_invocation(unit, invocation)
            first = self._first_cursor(unit, invocation)
            if not found or first is None:
                return None  # its entries cannot be read
            entries = found + entries
            if len(chosen) > 1 and sufficient(found):
                return entries
            self._match_units(unit)
            lib.sd_journal_seek_cursor(handle, first)
            while (moved := lib.sd_journal_previous(handle)) and lib.sd_journal_test_cursor(handle, first):
                pass
            if not moved:
                return entries  # the unit's first invocation in the boot
            if len(chosen) >= max_invocations:
                return None

    def _entries_of_invocation(self, unit: dict[bytes, str], invocation: bytes) -> list[LogEntry]:
        """What a decision needs of one invocation, in journal order, however long it ran: PID 1's records of it,
        its output from its first entry until ``init_over`` says its init has ended (read in growing chunks),
        and the last ``TAIL_ENTRIES`` of its output (a late failure's cause). The output between the init's
        end and those (a serving engine's request lines) is not read."""
        pid1 = self._read_matching(unit, invocation, systemd=True, forward=True, limit=None)
        head: list[LogEntry] = []
        limit, whole = HEAD_CHUNK, False
        while True:
            head = self._read_matching(unit, invocation, systemd=False, forward=True, limit=limit)
            whole = len(head) < limit
            if whole or (self._init_over is not None and self._init_over(in_journal_order(pid1 + head))):
                break
            limit *= 2
        head_end = None if whole else self._lib.sd_journal_get_cursor(self._handle)
        tail: list[LogEntry] = []
        if head_end is not None:
            tail = self._read_matching(unit, invocation, systemd=False, forward=False, limit=TAIL_ENTRIES,
                                       stop_at=head_end)
        return in_journal_order(pid1 + head + tail)

    def _read_matching(self, unit: dict[bytes, str], invocation: bytes, *, systemd: bool, forward: bool,
                       limit: int | None, stop_at: bytes | None = None) -> list[LogEntry]:
        """The invocation's PID 1 records (``systemd``) or output, from its first entry forward or from its last
        (up to the tail) back, at most ``limit``, up to the entry at ``stop_at`` (excluded); journal order."""
        lib, handle = self._lib, self._handle
        lib.sd_journal_flush_matches(handle)
        add = lib.sd_journal_add_match
        (raw,) = unit
        if systemd:
            for match in (b"_PID=1", FIELD_UNIT + b"=" + raw, FIELD_INVOCATION_ID + b"=" + invocation):
                add(handle, match)
        else:
            for match in (FIELD_SYSTEMD_UNIT + b"=" + raw, FIELD_SYSTEMD_INVOCATION_ID + b"=" + invocation):
                add(handle, match)
        if self._boot_id is not None:
            add(handle, b"_BOOT_ID=" + self._boot_id.encode())
        found: list[LogEntry] = []
        if forward:
            lib.sd_journal_seek_head(handle)
            step = lib.sd_journal_next
        else:
            lib.sd_journal_seek_tail(handle)
            step = lib.sd_journal_previous
        while (limit is None or len(found) < limit) and step(handle):
            if stop_at is not None and lib.sd_journal_test_cursor(handle, stop_at):
                break
            entry = self._decode(unit, {})
            if entry is None:
                continue
            if entry.realtime_usec > self._tail_usec:
                if forward:
                    break
                continue  # written after the tail: the reader reads it when it goes on
            found.append(entry)
            if len(found) % self._release_every == 0:
                self._release_pages()
        if not forward:
            found.reverse()
        return found

    def _first_cursor(self, unit: dict[bytes, str], invocation: bytes) -> bytes | None:
        """The cursor of the invocation's first entry (its output or PID 1's records); the handle left on it."""
        lib, handle = self._lib, self._handle
        lib.sd_journal_flush_matches(handle)
        add = lib.sd_journal_add_match
        (raw,) = unit
        add(handle, FIELD_SYSTEMD_UNIT + b"=" + raw)
        add(handle, FIELD_SYSTEMD_INVOCATION_ID + b"=" + invocation)
        lib.sd_journal_add_disjunction(handle)
        for match in (b"_PID=1", FIELD_UNIT + b"=" + raw, FIELD_INVOCATION_ID + b"=" + invocation):
            add(handle, match)
        if self._boot_id is not None:
            lib.sd_journal_add_conjunction(handle)
            add(handle, b"_BOOT_ID=" + self._boot_id.encode())
        lib.sd_journal_seek_head(handle)
        return lib.sd_journal_get_cursor(handle) if lib.sd_journal_next(handle) else None

    def _invocation_here(self, raw_unit: bytes) -> bytes | None:
        """The invocation id of the current entry of the unit (raw bytes); None when it has none."""
        pid = self._field_here(FIELD_PID)
        if pid == b"1" and self._field_here(FIELD_UNIT) == raw_unit:
            return self._field_here(FIELD_INVOCATION_ID) or None
        return self._field_here(FIELD_SYSTEMD_INVOCATION_ID) or None

    def _field_here(self, field_name: bytes) -> bytes | None:
        data, size = ctypes.c_void_p(), ctypes.c_size_t()
        result = self._lib.raw_get_data(self._handle, field_name, ctypes.byref(data), ctypes.byref(size))
        if result < 0:
            if result == -errno.ENOENT:
                return None
            raise JournalError.of_result("sd_journal_get_data", result, "reading a journal entry")
        return ctypes.string_at(data.value, size.value)[len(field_name) + 1:]


def in_journal_order(entries: list[LogEntry]) -> list[LogEntry]:
    """Entries read apart (units, PID 1's records and output, an invocation's head and tail) in the order journald
    stored them: by the boot's monotonic clock when they are all of one boot (the wall clock may step), else by
    the wall clock; a stable sort, so entries of one read keep their order on a tie."""
    if entries and all(entry.monotonic_usec is not None and entry.boot_id == entries[0].boot_id for entry in entries):
        return sorted(entries, key=lambda entry: entry.monotonic_usec)
    return sorted(entries, key=lambda entry: entry.realtime_usec)
