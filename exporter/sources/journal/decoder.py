"""Reading one journal entry of a watched unit or container into a ``LogEntry``: the reader's hot path.

``make_decoder`` makes the function ``JournalReader`` calls on every entry its handle steps to (the forward
read, the back-fill of new units, the latest invocations); the names of the fields it and the reader's
matches read are here too.
"""

from __future__ import annotations

import ctypes
import errno
from collections.abc import Callable

from vllm_xpu_exporter.sources.journal.binding import LibSystemd
from vllm_xpu_exporter.sources.journal.selection import JournalSelection
from vllm_xpu_exporter.sources.journal.trust import DRIVERS, EXIT_EVENTS, REJECTED_CONTAINER_SENDER
from vllm_xpu_exporter.sources.logs.entry import LogEntry
from vllm_xpu_exporter.systemd import MESSAGE_ID_UNIT_PROCESS_EXIT

FIELD_SYSTEMD_UNIT = b"_SYSTEMD_UNIT"
FIELD_UNIT = b"UNIT"
FIELD_MESSAGE = b"MESSAGE"
FIELD_PID = b"_PID"
FIELD_INVOCATION_ID = b"INVOCATION_ID"
FIELD_SYSTEMD_INVOCATION_ID = b"_SYSTEMD_INVOCATION_ID"
FIELD_CONTAINER_NAME = b"CONTAINER_NAME"
EXIT_RUN = "\0died:"
"""The run of a decoded runtime's exit event (then its container's id), until ``ContainerEnds`` names its run."""

Decoder = Callable[[dict[bytes, str], dict[bytes, str]], "LogEntry | None"]
"""Reads the current entry: (watched units, watched container names) -> the entry, or None."""


class _UnreadableField(Exception):
    def __init__(self, result: int) -> None:
        super().__init__(result)
        self.result = result


def make_decoder(lib: LibSystemd, handle: ctypes.c_void_p, selection: JournalSelection, *, max_message_bytes: int,
                 admitted: set[bytes], meet: Callable[[bytes, str], bool],
                 unreadable: Callable[[str, int], None], rejected: dict[str, int]) -> Decoder:
    """A function reading the handle's current entry, or None if it belongs to no watched unit or container.

    Of a watched unit or container not admitted yet (``admitted``: raw unit names and container keys),
    ``meet(raw, name)`` is asked whether to take it (and adds it to ``admitted`` if so). An entry naming a
    watched container that its engine did not write is counted in ``rejected`` by reason (``trust``).

    The hot path of a catch-up: 7-8 foreign calls per entry (5-6 sd_journal_get_data, the
    two timestamps from the entry header, no cursor), everything it touches is a local. An
    entry of no watched unit, or of a refused one, costs one or two sd_journal_get_data (one more,
    ``CONTAINER_NAME``, while containers are watched, and an exit event's field when it has none); a
    container's, four or five more.
    Every result is checked: -ENOENT is an absent field; any other error makes the entry
    unreadable, skipped and told to ``unreadable(function, result)``.
    """
    get_data = lib.raw_get_data
    get_realtime_usec = lib.raw_get_realtime_usec
    get_monotonic_usec = lib.raw_get_monotonic_usec
    string_at = ctypes.string_at
    data, size, usec = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_uint64()
    data_ref, size_ref, usec_ref = ctypes.byref(data), ctypes.byref(size), ctypes.byref(usec)
    boot = (ctypes.c_char * 16)()
    boot_ref = ctypes.byref(boot)
    boot_ids: dict[bytes, str] = {}
    invocation_ids: dict[bytes, str] = {}
    message_cap = max_message_bytes + len(FIELD_MESSAGE) + 1
    entry_type = LogEntry
    absent = -errno.ENOENT
    keys: dict[tuple[bytes, int, int], str] = {}  # (CONTAINER_NAME, driver, writer's uid) -> key; '' not watched

    def optional(name: bytes) -> bytes | None:
        """A field of the current entry, None when absent; _UnreadableField when it cannot be read."""
        result = get_data(handle, name, data_ref, size_ref)
        if result >= 0:
            return string_at(data.value, size.value)[len(name) + 1:]
        if result == absent:
            return None
        raise _UnreadableField(result)

    def reject(reason: str) -> None:
        rejected[reason] = rejected.get(reason, 0) + 1
        return None

    def container(containers: dict[bytes, str], pid: int | None,
                  systemd_unit: bytes | None) -> tuple[str, str, bool] | None:
        """The watched container's key, run and partial flag of the current entry; None when it is none.
        A runtime's exit event of a watched container: its key, and as run ``EXIT_RUN`` + its id."""
        raw_name = optional(FIELD_CONTAINER_NAME)
        event = None
        if raw_name is None:
            for candidate, candidate_driver in EXIT_EVENTS:
                if optional(candidate.field) == candidate.value and \
                        optional(candidate.type_field) == candidate.type_value:
                    event, driver, raw_name = candidate, candidate_driver, optional(candidate.name_field)
                    break
            else:
                return None
        name = None if raw_name is None else containers.get(raw_name)
        if name is None:
            return None
        # Believed only from the runtime, by the fields journald adds (trust.py).
        uid, comm, exe = optional(b"_UID"), optional(b"_COMM"), optional(b"_EXE")
        writer: int | None = None
        if event is not None:
            writer = event.writer(uid, comm, exe)
            if writer is None:
                return reject(event.rejected)
        else:
            for driver in DRIVERS:
                writer = driver.writer(uid, comm, exe, systemd_unit)
                if writer is not None:
                    break
            else:
                return reject(REJECTED_CONTAINER_SENDER)
        cached = (raw_name, id(driver), writer)
        key = keys.get(cached)
        if key is None:
            key = driver.key(name, writer) or ""
            if key and not selection.matches_container(key, name):
                key = ""
            if len(keys) >= 4096:  # a few per name found by the query; bounded all the same
                keys.clear()
            keys[cached] = key
        if not key:
            return None
        raw_key = key.encode()
        if raw_key not in admitted and not meet(raw_key, key):
            return None
        if event is not None:
            return key, EXIT_RUN + (optional(event.id_field) or b"").decode("ascii", "replace"), False
        return key, driver.run(optional, pid), optional(b"CONTAINER_PARTIAL_MESSAGE") == b"true"

    def decode(watched: dict[bytes, str], containers: dict[bytes, str]) -> LogEntry | None:
        pid: int | None = None
        if (result := get_data(handle, b"_PID", data_ref, size_ref)) >= 0:
            text = string_at(data.value, size.value)[5:]
            pid = int(text) if text.isdigit() else None
        elif result != absent:
            return unreadable("sd_journal_get_data", result)
        unit = None
        raw_unit: bytes | None = None
        run: str | None = None  # a container's entry: its run
        partial = False
        from_systemd = pid == 1
        if from_systemd:
            if (result := get_data(handle, b"UNIT", data_ref, size_ref)) >= 0:
                raw_unit = string_at(data.value, size.value)[5:]
                unit = watched.get(raw_unit)
                if unit is not None and raw_unit not in admitted and not meet(raw_unit, unit):
                    return None
            elif result != absent:
                return unreadable("sd_journal_get_data", result)
        if unit is None:
            from_systemd = False
            raw_unit = None
            if (result := get_data(handle, b"_SYSTEMD_UNIT", data_ref, size_ref)) >= 0:
                raw_unit = string_at(data.value, size.value)[14:]
                unit = watched.get(raw_unit)
                if unit is not None and raw_unit not in admitted and not meet(raw_unit, unit):
                    return None
            elif result != absent:
                return unreadable("sd_journal_get_data", result)
            if unit is None:
                if not containers:
                    return None
                try:
                    found = container(containers, pid, raw_unit)
                except _UnreadableField as error:
                    return unreadable("sd_journal_get_data", error.result)
                if found is None:
                    return None
                unit, run, partial = found
        if (result := get_data(handle, b"MESSAGE", data_ref, size_ref)) >= 0:
            length = size.value
            raw = string_at(data.value, length if length < message_cap else message_cap)
            message = raw[8:].decode("utf-8", "replace")
        elif result == absent:
            message = ""
        else:
            return unreadable("sd_journal_get_data", result)
        if run is not None:
            message_id = invocation = ""
            if not partial:  # conmon sends the line with its newline; a TTY's output ends in \r\n
                message = message.rstrip("\r\n")
        else:
            if (result := get_data(handle, b"MESSAGE_ID", data_ref, size_ref)) >= 0:
                message_id = string_at(data.value, size.value)[11:].decode("utf-8", "replace")
            elif result == absent:
                message_id = ""
            else:
                return unreadable("sd_journal_get_data", result)
            invocation_field = b"INVOCATION_ID" if from_systemd else b"_SYSTEMD_INVOCATION_ID"
            if (result := get_data(handle, invocation_field, data_ref, size_ref)) >= 0:
                raw_invocation = string_at(data.value, size.value)[len(invocation_field) + 1:]
                invocation = invocation_ids.get(raw_invocation)
                if invocation is None:
                    if len(invocation_ids) >= 4096:  # one per start; bounded all the same
                        invocation_ids.clear()
                    invocation = invocation_ids[raw_invocation] = raw_invocation.decode("ascii", "replace")
            elif result == absent:
                invocation = ""
            else:
                return unreadable("sd_journal_get_data", result)
        if (result := get_realtime_usec(handle, usec_ref)) < 0:
            return unreadable("sd_journal_get_realtime_usec", result)
        realtime = usec.value
        if get_monotonic_usec(handle, usec_ref, boot_ref) >= 0:
            monotonic: int | None = usec.value
            raw_boot = boot.raw
            boot_id = boot_ids.get(raw_boot)
            if boot_id is None:
                boot_id = boot_ids[raw_boot] = raw_boot.hex()
        else:  # the entry header could not be read again: the boot id from its field
            monotonic = None
            boot_id = ""
            if (result := get_data(handle, b"_BOOT_ID", data_ref, size_ref)) >= 0:
                boot_id = string_at(data.value, size.value)[9:].decode("ascii", "replace")
            elif result != absent:
                return unreadable("sd_journal_get_data", result)
        if run is not None:
            if run.startswith(EXIT_RUN):  # as systemd's record of a unit's main process exit
                return entry_type(unit, realtime, monotonic, boot_id, "", True, MESSAGE_ID_UNIT_PROCESS_EXIT,
                                  None, "", run)
            return entry_type(unit, realtime, monotonic, boot_id, message, False, "", None, "", run, partial)
        return entry_type(unit, realtime, monotonic, boot_id, message, from_systemd, message_id, pid, invocation)

    return decode
