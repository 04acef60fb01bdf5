"""The latest invocations of watched units, read backwards from the journal's tail: what the init gate and the
planner start from (``JournalReader.read_latest_invocations`` says when and what; this walks the handle)."""

from __future__ import annotations

import ctypes
import errno
from collections.abc import Callable, Sequence

from vllm_xpu_exporter.sources.journal.binding import JournalError, LibSystemd
from vllm_xpu_exporter.sources.journal.decoder import (FIELD_INVOCATION_ID, FIELD_PID, FIELD_SYSTEMD_INVOCATION_ID,
                                                       FIELD_SYSTEMD_UNIT, FIELD_UNIT, Decoder)
from vllm_xpu_exporter.sources.logs.entry import LogEntry

MAX_INVOCATIONS_BACK = 8
"""``JournalReader.read_latest_invocations`` reads at most this many of a unit's latest invocations."""


class InvocationWalk:
    """Reads watched units' latest invocations on an open journal handle (one thread, as the handle).

    ``match_units(units)`` makes the handle's matches select those units' entries; ``release_pages()`` drops
    the journal's mapped pages, called every ``release_every`` entries read and after each unit."""

    def __init__(self, lib: LibSystemd, handle: ctypes.c_void_p, decode: Decoder, *, boot_id: str | None,
                 match_units: Callable[[dict[bytes, str]], None], release_pages: Callable[[], object],
                 release_every: int) -> None:
        self._lib = lib
        self._handle = handle
        self._decode = decode
        self._boot_id = boot_id
        self._match_units = match_units
        self._release_pages = release_pages
        self._release_every = release_every

    def read(self, units: dict[bytes, str], sufficient: Callable[[list[LogEntry]], bool],
             max_invocations: int) -> tuple[list[LogEntry], bytes] | None:
        """The entries of each unit's latest invocations, in journal order, and the cursor of the units' last
        entry in the journal (the tail, where the reader goes on from); None when they cannot be told
        (``JournalReader.read_latest_invocations`` says when) or the boot has no entry of the units."""
        lib, handle = self._lib, self._handle
        self._match_units(units)
        lib.sd_journal_seek_tail(handle)
        if not lib.sd_journal_previous(handle):
            return None
        tail = lib.sd_journal_get_cursor(handle)
        selected: list[bytes] = []
        self._release_pages()
        for raw in sorted(units):
            invocations = self._latest_of(raw, units[raw], tail, sufficient, max_invocations)
            self._release_pages()  # as the forward read does: the pages are only page cache
            if invocations is None:
                return None
            selected += invocations
        entries = self._entries_of(units, selected, tail)
        self._release_pages()
        return entries, tail

    def _latest_of(self, raw: bytes, name: str, tail: bytes, sufficient: Callable[[list[LogEntry]], bool],
                   max_invocations: int) -> list[bytes] | None:
        """The unit's invocation ids to read, latest first; None: read the boot."""
        lib, handle = self._lib, self._handle
        unit = {raw: name}
        self._match_units(unit)
        lib.sd_journal_seek_cursor(handle, tail)
        if not lib.sd_journal_previous(handle):
            return []  # no entry of the unit in the boot
        chosen: list[bytes] = []
        while True:
            invocation = self._invocation_here(raw)
            if invocation is None or invocation in chosen:
                return None
            chosen.append(invocation)
            entries = self._entries_of(unit, [invocation], tail)
            if not entries:
                return None  # its entries cannot be read
            # after the walk back the handle is on the invocation's first entry
            first = lib.sd_journal_get_cursor(handle)
            if len(chosen) > 1 and sufficient(entries):
                return chosen
            self._match_units(unit)
            lib.sd_journal_seek_cursor(handle, first)
            while (moved := lib.sd_journal_previous(handle)) and lib.sd_journal_test_cursor(handle, first):
                pass
            if not moved:
                return chosen  # the unit's first invocation in the boot
            if len(chosen) >= max_invocations:
                return None

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

    def _entries_of(self, units: dict[bytes, str], invocations: Sequence[bytes], cursor: bytes) -> list[LogEntry]:
        """The entries of these invocations of these units up to the one at ``cursor`` (included), in
        journal order; the handle is left on the earliest one. Matched: (_SYSTEMD_UNIT=u… ∧
        _SYSTEMD_INVOCATION_ID=i…) ∨ (_PID=1 ∧ UNIT=u… ∧ INVOCATION_ID=i…), and _BOOT_ID=b unless all
        boots."""
        lib, handle = self._lib, self._handle
        if not invocations:
            return []
        lib.sd_journal_flush_matches(handle)
        add = lib.sd_journal_add_match
        for raw in sorted(units):
            add(handle, FIELD_SYSTEMD_UNIT + b"=" + raw)
        for invocation in sorted(invocations):
            add(handle, FIELD_SYSTEMD_INVOCATION_ID + b"=" + invocation)
        lib.sd_journal_add_disjunction(handle)
        add(handle, b"_PID=1")
        for raw in sorted(units):
            add(handle, FIELD_UNIT + b"=" + raw)
        for invocation in sorted(invocations):
            add(handle, FIELD_INVOCATION_ID + b"=" + invocation)
        if self._boot_id is not None:
            lib.sd_journal_add_conjunction(handle)
            add(handle, b"_BOOT_ID=" + self._boot_id.encode())
        lib.sd_journal_seek_cursor(handle, cursor)
        found: list[LogEntry] = []
        previous = lib.sd_journal_previous
        decode, release_every = self._decode, self._release_every
        while previous(handle):
            entry = decode(units, {})
            if entry is not None:
                found.append(entry)
                if len(found) % release_every == 0:
                    self._release_pages()
        found.reverse()
        return found
