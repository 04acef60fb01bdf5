"""Which of the journal's units and containers are watched, and the sd-journal matches that select their
entries: ``JournalReader`` queries the names when the journal has changed and matches them (the decoder filters
what the matches let through)."""

from __future__ import annotations

import ctypes
import errno
from collections.abc import Callable

from vllm_xpu_exporter.sources.journal.binding import JournalError, LibSystemd
from vllm_xpu_exporter.sources.journal.decoder import FIELD_CONTAINER_NAME, FIELD_SYSTEMD_UNIT, FIELD_UNIT
from vllm_xpu_exporter.sources.journal.selection import JournalSelection
from vllm_xpu_exporter.sources.journal.trust import EXIT_EVENTS


class GlobbedNames(dict):
    """The ``CONTAINER_NAME`` values the container globs may match, decided one value at a time as entries are
    read (a bounded cache of the answers), once the journal holds more than ``names_max`` of them
    (``query_watched_units``):
    a flood of names (anyone can write one) then costs neither memory nor sd-journal matches, and no entry
    of a name met later is missed (the reader reads the boot's entries and filters them itself)."""

    MAX_CACHED = 4096

    def __init__(self, matches: Callable[[str], bool]) -> None:
        super().__init__()
        self._matches = matches
        self._not_matching: set[bytes] = set()

    def get(self, raw: bytes, default: str | None = None) -> str | None:  # type: ignore[override]
        name = dict.get(self, raw)
        if name is not None or raw in self._not_matching:
            return name if name is not None else default
        decoded = raw.decode("utf-8", "replace")
        if len(self) >= self.MAX_CACHED or len(self._not_matching) >= self.MAX_CACHED:
            self.clear()
            self._not_matching.clear()
        if self._matches(decoded):
            self[raw] = decoded
            return decoded
        self._not_matching.add(raw)
        return default

    def __len__(self) -> int:  # always more than sd-journal's matches take: the decoder filters
        return 1 << 30

    def __contains__(self, raw: object) -> bool:
        return isinstance(raw, bytes) and self.get(raw) is not None


def query_watched_units(lib: LibSystemd, handle: ctypes.c_void_p, selection: JournalSelection,
                        names_max: int) -> tuple[dict[bytes, str], dict[bytes, str]]:
    """The watched units' names, and the container names the container globs may match, in the journal (raw
    bytes → str): the distinct values of ``_SYSTEMD_UNIT``, ``UNIT`` and ``CONTAINER_NAME`` (sd_journal_query_unique
    walks each field's values, not the entries). Beyond ``names_max`` container names, ``GlobbedNames``."""
    found: dict[bytes, str] = {}
    containers: dict[bytes, str] = {}
    queries = [(FIELD_SYSTEMD_UNIT, found, selection.matches_unit), (FIELD_UNIT, found, selection.matches_unit)]
    if selection.container_globs:
        queries.append((FIELD_CONTAINER_NAME, containers, selection.may_match_container_name))
    for field_name, into, matches in queries:
        lib.sd_journal_query_unique(handle, field_name)
        skip = len(field_name) + 1
        try:
            while (value := lib.sd_journal_enumerate_unique(handle)) is not None:
                raw = value[skip:]
                name = raw.decode("utf-8", "replace")
                if matches(name):
                    into[raw] = name
                    if into is containers and len(containers) > names_max:
                        containers = GlobbedNames(selection.may_match_container_name)
                        break
        except JournalError as error:
            # Without sd_journal_enumerate_available_unique (systemd < 246), a corrupt file
            # ends the listing: the values found before it are kept.
            if error.errno != errno.EBADMSG:
                raise
    return found, containers

def query_trusted_units(lib: LibSystemd, handle: ctypes.c_void_p, selection: LogSelection, boot_id: str | None,
                        window_usec: int, max_records: int = 65536) -> dict[bytes, str]:
    """The watched units' names that journald vouches for (raw bytes → str): every value of ``_SYSTEMD_UNIT``
    (the unit of the process that wrote the entry), and ``UNIT`` of PID 1's records within ``window_usec``
    before the boot's last one (at most ``max_records`` of them: a unit that has started and printed nothing
    yet). Not every value of ``UNIT``: any process may write that field, and a flood of forged names would
    make a reader of the latest invocations read the whole boot."""
    found: dict[bytes, str] = {}
    skip = len(FIELD_SYSTEMD_UNIT) + 1
    lib.sd_journal_query_unique(handle, FIELD_SYSTEMD_UNIT)
    try:
        while (value := lib.sd_journal_enumerate_unique(handle)) is not None:
            name = value[skip:].decode("utf-8", "replace")
            if selection.matches_unit(name):
                found[value[skip:]] = name
    except JournalError as error:
        if error.errno != errno.EBADMSG:  # as in query_watched_units
            raise
    lib.sd_journal_flush_matches(handle)
    lib.sd_journal_add_match(handle, b"_PID=1")
    if boot_id is not None:
        lib.sd_journal_add_match(handle, b"_BOOT_ID=" + boot_id.encode())
    lib.sd_journal_seek_tail(handle)
    usec = ctypes.c_uint64()
    since = None
    data, size = ctypes.c_void_p(), ctypes.c_size_t()
    for _ in range(max_records):
        if not lib.sd_journal_previous(handle) or lib.raw_get_realtime_usec(handle, ctypes.byref(usec)) < 0:
            break
        if since is None:
            since = usec.value - window_usec
        elif usec.value < since:
            break
        if lib.raw_get_data(handle, FIELD_UNIT, ctypes.byref(data), ctypes.byref(size)) >= 0:
            raw = ctypes.string_at(data.value, size.value)[len(FIELD_UNIT) + 1:]
            name = raw.decode("utf-8", "replace")
            if raw not in found and selection.matches_unit(name):
                found[raw] = name
    lib.sd_journal_flush_matches(handle)
    return found


def apply_matches(lib: LibSystemd, handle: ctypes.c_void_p, units: dict[bytes, str], containers: dict[bytes, str],
                  boot_id: str | None, matched_max: int) -> None:
    """(_SYSTEMD_UNIT=u1 ∨ …) ∨ (_PID=1 ∧ (UNIT=u1 ∨ …)) ∨ (CONTAINER_NAME=c1 ∨ …), and _BOOT_ID=b
    unless all boots.

    sd_journal_add_match: matches of one field are ORed, of different fields ANDed;
    add_disjunction starts an OR branch, add_conjunction ANDs what follows with it all.
    Above ``matched_max`` units and containers, only _BOOT_ID=b (or nothing): the decoder filters.
    """
    lib.sd_journal_flush_matches(handle)
    add = lib.sd_journal_add_match
    if len(units) + len(containers) <= matched_max:
        if units or not containers:
            for raw in sorted(units):
                add(handle, b"_SYSTEMD_UNIT=" + raw)
            lib.sd_journal_add_disjunction(handle)
            add(handle, b"_PID=1")
            for raw in sorted(units):
                add(handle, b"UNIT=" + raw)
            if containers:
                lib.sd_journal_add_disjunction(handle)
        for raw in sorted(containers):
            add(handle, FIELD_CONTAINER_NAME + b"=" + raw)
        for event, _ in EXIT_EVENTS if containers else ():  # runtimes' events of their containers' end
            lib.sd_journal_add_disjunction(handle)
            add(handle, event.field + b"=" + event.value)
            for raw in sorted(containers):
                add(handle, event.name_field + b"=" + raw)
        if boot_id is not None:
            lib.sd_journal_add_conjunction(handle)
    if boot_id is not None:
        add(handle, b"_BOOT_ID=" + boot_id.encode())
