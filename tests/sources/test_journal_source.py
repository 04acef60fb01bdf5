"""vllm_xpu_exporter.sources.journal against real journal files written by systemd-journal-remote."""

from __future__ import annotations

import errno
import itertools
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_xpu_exporter.cli import exporter_journal_selection, parse_options
from vllm_xpu_exporter.sources.journal import JournalError, JournalReader
from vllm_xpu_exporter.sources.journal import JournalSelection
from vllm_xpu_exporter.sources.logs.entry import LogEntry, LogSelection, normalize_boot
from vllm_xpu_exporter.sources.journal import host, reader as journal_source
from vllm_xpu_exporter.sources.journal.binding import LIBSYSTEMD, LibSystemd
from vllm_xpu_exporter.systemd import (
    MESSAGE_ID_UNIT_FAILURE_RESULT,
    MESSAGE_ID_UNIT_PROCESS_EXIT,
    MESSAGE_ID_UNIT_RESTART_SCHEDULED,
    MESSAGE_ID_UNIT_STARTED,
    MESSAGE_ID_UNIT_STARTING,
)
from journalgen import (
    Clock,
    JournalEntrySpec,
    append_journal,
    current_boot_id,
    new_invocation_id,
    random_boot_id,
    rotate_journal,
    systemd_record,
    unit_failed,
    unit_output,
    unit_process_exited,
    unit_restart_scheduled,
    unit_started,
    unit_starting,
    write_journal,
)

WATCHED = ["vllm*.service"]


def reader_for(directory: Path, *, globs: list[str] = WATCHED, boot: str = "current", **kwargs: int) -> JournalReader:
    reader = JournalReader(JournalSelection(directory=str(directory), unit_globs=globs, boot=boot), **kwargs)
    reader.open()
    return reader


def read_all(reader: JournalReader) -> list[LogEntry]:
    entries: list[LogEntry] = []
    while batch := reader.read_available(1000):
        entries.extend(batch)
    return entries


def follow_until(reader: JournalReader, count: int, timeout_s: float = 10.0) -> list[LogEntry]:
    """What a follower gets within ``timeout_s``: wait() then read_available(), until ``count`` entries."""
    entries: list[LogEntry] = []
    deadline = time.monotonic() + timeout_s
    while len(entries) < count and time.monotonic() < deadline:
        if reader.wait(0.2):
            entries.extend(read_all(reader))
    return entries


def messages(entries: list[LogEntry]) -> list[str]:
    return [entry.message for entry in entries]


@pytest.fixture
def clock() -> Clock:
    return Clock(current_boot_id())


@pytest.fixture
def unit_query_never_put_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put off (UNIT_QUERY_SHARE), the query for new units may come after a read that passed a known unit's
    later entry, and the new unit's entries are then back-filled after it (the documented order of
    back-filled entries): tests of the order of a new unit's entries never put it off."""
    monkeypatch.setattr(JournalReader, "UNIT_QUERY_SHARE", 1e9)


def write_journal_whole(path: Path, entries: list) -> Path:
    """A journal file written beside `path`, then moved in whole: a follower never sees it half written."""
    written = write_journal(path.parent.parent / f"{path.parent.name}-{path.name}", entries)
    return written.rename(path)


@pytest.fixture(params=["unit-matches", "boot-filtered"])
def match_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways the reader selects entries: sd-journal matches per unit (few units), or the boot's
    entries filtered by the reader (more than MATCHED_UNITS_MAX units)."""
    if request.param == "boot-filtered":
        monkeypatch.setattr(JournalReader, "MATCHED_UNITS_MAX", 0)
    return request.param


@pytest.mark.usefixtures("match_mode")
def test_glob_selects_matching_units_and_not_other_units_printing_the_same_text(tmp_path: Path, clock: Clock) -> None:
    write_journal(tmp_path / "a.journal", [
        unit_output("vllm-chat.service", "Available KV cache memory: 10.5 GiB", clock.tick()),
        unit_output("other.service", "Available KV cache memory: 10.5 GiB", clock.tick()),
        unit_output("vllm-embed.service", "Available KV cache memory: 2.0 GiB", clock.tick()),
        unit_output("myvllm.service", "Available KV cache memory: 3.0 GiB", clock.tick()),
        unit_output("vllm-chat.socket", "Available KV cache memory: 4.0 GiB", clock.tick()),
    ])
    with reader_for(tmp_path) as reader:
        entries = read_all(reader)
        assert [(e.unit, e.message) for e in entries] == [
            ("vllm-chat.service", "Available KV cache memory: 10.5 GiB"),
            ("vllm-embed.service", "Available KV cache memory: 2.0 GiB"),
        ]
        assert reader.units == {"vllm-chat.service", "vllm-embed.service"}
    with reader_for(tmp_path, globs=["vllm-embed.service", "my*"]) as reader:
        assert [e.unit for e in read_all(reader)] == ["vllm-embed.service", "myvllm.service"]


@pytest.mark.usefixtures("match_mode")
def test_unit_output_and_pid1_records_about_the_unit_are_both_returned_in_order(tmp_path: Path, clock: Clock) -> None:
    unit = "vllm-chat.service"
    write_journal(tmp_path / "a.journal", [
        unit_starting(unit, clock.tick()),
        unit_output(unit, "INFO 05-12 10:11:12 [api_server.py:1] vLLM API server version 0.11.0", clock.tick(), pid=777),
        unit_started(unit, clock.tick()),
        unit_output(unit, "ERROR 05-12 10:11:20 [core.py:708] ValueError: No available memory for the cache blocks.",
                    clock.tick(), pid=778),
        unit_process_exited(unit, clock.tick(), status=1),
        unit_failed(unit, clock.tick()),
        unit_restart_scheduled(unit, clock.tick(), counter=2),
        unit_starting("other.service", clock.tick()),
    ])
    with reader_for(tmp_path) as reader:
        entries = read_all(reader)
    assert [(e.from_systemd, e.message_id, e.pid) for e in entries] == [
        (True, MESSAGE_ID_UNIT_STARTING, 1),
        (False, "", 777),
        (True, MESSAGE_ID_UNIT_STARTED, 1),
        (False, "", 778),
        (True, MESSAGE_ID_UNIT_PROCESS_EXIT, 1),
        (True, MESSAGE_ID_UNIT_FAILURE_RESULT, 1),
        (True, MESSAGE_ID_UNIT_RESTART_SCHEDULED, 1),
    ]
    assert {e.unit for e in entries} == {unit}
    assert entries[0].message == "Starting vllm-chat.service - vLLM server..."
    assert entries[4].message == "vllm-chat.service: Main process exited, code=exited, status=1/FAILURE"
    assert entries[5].message == "vllm-chat.service: Failed with result 'exit-code'."
    assert entries[6].message == "vllm-chat.service: Scheduled restart job, restart counter is at 2."


@pytest.mark.usefixtures("match_mode")
def test_unit_field_written_by_a_process_other_than_pid1_is_not_a_systemd_record(tmp_path: Path, clock: Clock) -> None:
    not_pid1 = systemd_record("vllm-chat.service", "logind says something", "0" * 32, clock.tick(), code_func="x")
    fields = tuple((k, 555 if k == "_PID" else ("systemd-logind.service" if k == "_SYSTEMD_UNIT" else v))
                   for k, v in not_pid1.fields)
    write_journal(tmp_path / "a.journal", [
        JournalEntrySpec(not_pid1.realtime_usec, not_pid1.monotonic_usec, not_pid1.boot_id, fields),
        unit_output("vllm-chat.service", "mine", clock.tick()),
    ])
    with reader_for(tmp_path) as reader:
        assert messages(read_all(reader)) == ["mine"]


def test_timestamps_boot_id_and_pid_come_from_the_entry(tmp_path: Path, clock: Clock) -> None:
    at = clock.tick()
    write_journal(tmp_path / "a.journal", [unit_output("vllm-chat.service", "x", at, pid=31337)])
    with reader_for(tmp_path) as reader:
        (entry,) = read_all(reader)
    assert (entry.realtime_usec, entry.monotonic_usec, entry.boot_id, entry.pid) == (
        at.realtime_usec, at.monotonic_usec, current_boot_id(), 31337)


@pytest.mark.usefixtures("match_mode")
def test_invocation_id_comes_from_systemd_invocation_id_of_output_and_invocation_id_of_pid1_records(
        tmp_path: Path, clock: Clock) -> None:
    unit = "vllm-chat.service"
    first, second = new_invocation_id(), new_invocation_id()
    write_journal(tmp_path / "a.journal", [
        unit_starting(unit, clock.tick(), invocation_id=first),
        unit_output(unit, "first start", clock.tick(), invocation_id=first),
        unit_started(unit, clock.tick(), invocation_id=second),
        unit_output(unit, "second start", clock.tick(), invocation_id=second),
        unit_output(unit, "no invocation id", clock.tick(), invocation_id=""),
    ])
    with reader_for(tmp_path) as reader:
        entries = read_all(reader)
    assert [(e.message, e.invocation_id) for e in entries] == [
        ("Starting vllm-chat.service - vLLM server...", first), ("first start", first),
        ("Started vllm-chat.service - vLLM server.", second), ("second start", second),
        ("no invocation id", "")]


@pytest.fixture
def two_boots(tmp_path: Path) -> tuple[Path, str, str]:
    other = random_boot_id()
    old = Clock(other, realtime_usec=1_700_000_000_000_000)
    now = Clock(current_boot_id())
    write_journal(tmp_path / "a.journal", [
        unit_starting("vllm-chat.service", old.tick()),
        unit_output("vllm-chat.service", "old boot line", old.tick()),
        unit_failed("vllm-chat.service", old.tick()),
        unit_starting("vllm-chat.service", now.tick()),
        unit_output("vllm-chat.service", "this boot line", now.tick()),
    ])
    return tmp_path, other, current_boot_id()


@pytest.mark.usefixtures("match_mode")
def test_boot_current_returns_only_this_kernels_boot(two_boots: tuple[Path, str, str]) -> None:
    directory, _, this = two_boots
    with reader_for(directory, boot="current") as reader:
        entries = read_all(reader)
        assert reader.boot_id == this
    assert [(e.from_systemd, e.message) for e in entries] == [
        (True, "Starting vllm-chat.service - vLLM server..."), (False, "this boot line")]
    assert {e.boot_id for e in entries} == {this}


@pytest.mark.usefixtures("match_mode")
def test_boot_all_returns_every_boot(two_boots: tuple[Path, str, str]) -> None:
    directory, other, this = two_boots
    with reader_for(directory, boot="all") as reader:
        entries = read_all(reader)
        assert reader.boot_id is None
    assert [e.boot_id for e in entries] == [other, other, other, this, this]


def test_boot_id_selects_that_boot_in_plain_or_dashed_form(two_boots: tuple[Path, str, str]) -> None:
    directory, other, _ = two_boots
    dashed = f"{other[:8]}-{other[8:12]}-{other[12:16]}-{other[16:20]}-{other[20:]}".upper()
    for boot in (other, dashed):
        with reader_for(directory, boot=boot) as reader:
            assert messages(read_all(reader)) == [
                "Starting vllm-chat.service - vLLM server...", "old boot line",
                "vllm-chat.service: Failed with result 'exit-code'."]


@pytest.mark.parametrize("bad", ["", "yesterday", "-1", "0123456789abcdef0123456789abcde", "g" * 32])
def test_invalid_boot_is_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid boot"):
        normalize_boot(bad)


def test_selection_rejects_directory_with_files_and_empty_globs() -> None:
    with pytest.raises(ValueError):
        JournalSelection(directory="/x", files=["/y.journal"])
    with pytest.raises(ValueError):
        JournalSelection(unit_globs=[])


def test_binary_message_with_control_and_non_utf8_bytes_is_decoded_with_replacement(tmp_path: Path, clock: Clock) -> None:
    raw = b"\x1b[1;36m(EngineCore_DP0 pid=3052)\x1b[0;0m INFO \xff\xfe bad\x00nul\nsecond line"
    write_journal(tmp_path / "a.journal", [unit_output("vllm-chat.service", raw, clock.tick())])
    with reader_for(tmp_path) as reader:
        (entry,) = read_all(reader)
    assert entry.message == raw.decode("utf-8", "replace")
    assert "\ufffd\ufffd bad\x00nul\nsecond line" in entry.message


def test_entry_without_message_has_empty_message(tmp_path: Path, clock: Clock) -> None:
    write_journal(tmp_path / "a.journal", [unit_output("vllm-chat.service", None, clock.tick())])
    with reader_for(tmp_path) as reader:
        (entry,) = read_all(reader)
    assert entry.message == ""
    assert entry.message_id == ""


def test_60_kib_line_is_returned_whole_and_longer_lines_are_cut_at_the_cap(tmp_path: Path, clock: Clock) -> None:
    line = "INFO " + "".join(f"{i:07d}," for i in range(60 * 1024 // 8))[: 60 * 1024 - 5]
    write_journal(tmp_path / "a.journal", [unit_output("vllm-chat.service", line, clock.tick())])
    with reader_for(tmp_path) as reader:
        (entry,) = read_all(reader)
    assert len(entry.message) == 60 * 1024
    assert entry.message == line
    with reader_for(tmp_path, max_message_bytes=1000) as reader:
        (entry,) = read_all(reader)
    assert entry.message == line[:1000]


def test_glob_matching_nothing_returns_nothing_and_waits_quietly(tmp_path: Path, clock: Clock) -> None:
    write_journal(tmp_path / "a.journal", [unit_output("other.service", "x", clock.tick())])
    with reader_for(tmp_path, globs=["nothing*.service"]) as reader:
        assert read_all(reader) == []
        assert reader.units == frozenset()
        assert reader.wait(0.05) is False


def test_directory_with_several_files_is_read_in_time_order(tmp_path: Path, clock: Clock) -> None:
    moments = [clock.tick() for _ in range(6)]
    write_journal(tmp_path / "one.journal", [unit_output("vllm-a.service", f"a{i}", moments[i]) for i in (0, 2, 4)])
    write_journal(tmp_path / "two.journal", [unit_output("vllm-b.service", f"b{i}", moments[i]) for i in (1, 3, 5)])
    with reader_for(tmp_path) as reader:
        assert messages(read_all(reader)) == ["a0", "b1", "a2", "b3", "a4", "b5"]


def test_file_selection_reads_only_the_given_files(tmp_path: Path, clock: Clock) -> None:
    one = write_journal(tmp_path / "one.journal", [unit_output("vllm-a.service", "in one", clock.tick())])
    write_journal(tmp_path / "two.journal", [unit_output("vllm-a.service", "in two", clock.tick())])
    with JournalReader(JournalSelection(files=[str(one)], unit_globs=WATCHED)) as reader:
        assert messages(read_all(reader)) == ["in one"]


def test_read_available_returns_at_most_max_entries_and_then_the_rest_once(tmp_path: Path, clock: Clock) -> None:
    write_journal(tmp_path / "a.journal", [unit_output("vllm-a.service", f"m{i}", clock.tick()) for i in range(25)]
                  + [unit_output("other.service", "not counted", clock.tick())])
    with reader_for(tmp_path) as reader:
        first = reader.read_available(10)
        assert len(first) == 10
        assert reader.wait(5.0) is True
        rest = read_all(reader)
        assert messages(first + rest) == [f"m{i}" for i in range(25)]


def test_wait_blocks_until_timeout_without_spinning(tmp_path: Path, clock: Clock) -> None:
    write_journal(tmp_path / "a.journal", [unit_output("vllm-a.service", "x", clock.tick())])
    with reader_for(tmp_path) as reader:
        read_all(reader)
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        started = time.monotonic()
        assert reader.wait(0.5) is False
        elapsed = time.monotonic() - started
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    assert 0.45 <= elapsed < 2.0
    assert cpu < 0.1


def test_following_returns_entries_of_a_new_file_after_wait(tmp_path: Path, unit_query_never_put_off: None) -> None:
    # the query never put off and the file moved in whole: the last wait() is then quiet by construction
    # (a query put off wakes it when due; a file still being written, with its last inotify events)
    clock = Clock(current_boot_id())
    write_journal(tmp_path / "a.journal", [unit_output("vllm-a.service", "before", clock.tick())])
    with reader_for(tmp_path) as reader:
        assert messages(read_all(reader)) == ["before"]
        write_journal_whole(tmp_path / "b.journal", [
            unit_output("vllm-a.service", "after 1", clock.tick()),
            unit_output("other.service", "not mine", clock.tick()),
            unit_process_exited("vllm-a.service", clock.tick(), code="killed", status=9),
        ])
        later = follow_until(reader, 2)
        assert messages(later) == ["after 1", "vllm-a.service: Main process exited, code=killed, status=9/KILL"]
        assert reader.wait(0.1) is False


def test_following_returns_entries_appended_to_an_open_file(tmp_path: Path) -> None:
    clock = Clock(current_boot_id())
    path = write_journal(tmp_path / "a.journal", [unit_output("vllm-a.service", "first", clock.tick())])
    with reader_for(tmp_path) as reader:
        assert messages(read_all(reader)) == ["first"]
        append_journal(path, [unit_output("vllm-a.service", "second", clock.tick())])
        assert messages(follow_until(reader, 1)) == ["second"]


@pytest.mark.usefixtures("match_mode")
def test_unit_appearing_after_open_is_picked_up(tmp_path: Path, unit_query_never_put_off: None) -> None:
    clock = Clock(current_boot_id())
    write_journal(tmp_path / "a.journal", [unit_output("vllm-a.service", "a1", clock.tick())])
    with reader_for(tmp_path) as reader:
        assert messages(read_all(reader)) == ["a1"]
        write_journal_whole(tmp_path / "b.journal", [
            unit_starting("vllm-new.service", clock.tick()),
            unit_output("vllm-new.service", "n1", clock.tick()),
            unit_output("vllm-a.service", "a2", clock.tick()),
        ])
        later = follow_until(reader, 3)
        assert [(e.unit, e.message) for e in later] == [
            ("vllm-new.service", "Starting vllm-new.service - vLLM server..."),
            ("vllm-new.service", "n1"),
            ("vllm-a.service", "a2"),
        ]
        assert reader.units == {"vllm-a.service", "vllm-new.service"}


@pytest.mark.usefixtures("match_mode", "unit_query_never_put_off")
def test_new_unit_entries_behind_the_read_position_are_returned_once(tmp_path: Path) -> None:
    clock = Clock(current_boot_id())
    early = clock.tick()
    write_journal(tmp_path / "a.journal", [unit_output("vllm-a.service", f"a{i}", clock.tick()) for i in range(3)])
    with reader_for(tmp_path) as reader:
        assert messages(read_all(reader)) == ["a0", "a1", "a2"]
        # A file holding an entry of a new unit older than everything read so far, then newer ones.
        write_journal_whole(tmp_path / "b.journal", [
            unit_output("vllm-late.service", "late early", early),
            unit_output("vllm-late.service", "late now", clock.tick()),
            unit_output("vllm-a.service", "a3", clock.tick()),
        ])
        later = follow_until(reader, 3)
        assert messages(later) == ["late early", "late now", "a3"]
        assert read_all(reader) == []


def test_rotation_while_following_returns_each_entry_once(tmp_path: Path) -> None:
    clock = Clock(current_boot_id())
    active = tmp_path / "system.journal"
    write_journal(active, [unit_output("vllm-a.service", f"r{i}", clock.tick()) for i in range(3)])
    with reader_for(tmp_path) as reader:
        assert messages(read_all(reader)) == ["r0", "r1", "r2"]
        archived = rotate_journal(active)
        write_journal(active, [unit_output("vllm-a.service", "r3", clock.tick())])
        assert messages(follow_until(reader, 1)) == ["r3"]
        assert archived.exists()
        assert read_all(reader) == []


def test_vacuumed_files_while_following_do_not_stop_the_reader(tmp_path: Path) -> None:
    clock = Clock(current_boot_id())
    old = write_journal(tmp_path / "old.journal", [unit_output("vllm-a.service", f"o{i}", clock.tick()) for i in range(3)])
    with reader_for(tmp_path) as reader:
        assert len(reader.read_available(2)) == 2
        old.unlink()
        write_journal(tmp_path / "new.journal", [unit_output("vllm-a.service", "n0", clock.tick())])
        write_journal(tmp_path / "newer.journal", [unit_output("vllm-b.service", "b0", clock.tick())])
        got = follow_until(reader, 2)
        assert messages(got)[-2:] == ["n0", "b0"]
        assert messages(got)[:-2] in ([], ["o2"])


def test_missing_directory_raises_journal_error_with_one_line_errno_and_function(tmp_path: Path) -> None:
    reader = JournalReader(JournalSelection(directory=str(tmp_path / "nope"), unit_globs=WATCHED))
    with pytest.raises(JournalError) as raised:
        reader.open()
    assert str(raised.value) == f"journal directory {tmp_path / 'nope'} does not exist"
    assert (raised.value.errno, raised.value.function) == (errno.ENOENT, "stat")
    assert not reader.is_open


def test_path_that_is_not_a_directory_raises_journal_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(JournalError, match="is not a directory"):
        JournalReader(JournalSelection(directory=str(tmp_path / "file"), unit_globs=WATCHED)).open()


def test_missing_journal_file_raises_journal_error(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="does not exist"):
        JournalReader(JournalSelection(files=[str(tmp_path / "x.journal")], unit_globs=WATCHED)).open()


def test_directory_that_appears_later_opens_on_retry(tmp_path: Path, clock: Clock) -> None:
    directory = tmp_path / "journal"
    reader = JournalReader(JournalSelection(directory=str(directory), unit_globs=WATCHED))
    with pytest.raises(JournalError):
        reader.open()
    directory.mkdir()
    write_journal(directory / "a.journal", [unit_output("vllm-a.service", "hello", clock.tick())])
    with reader:
        assert messages(read_all(reader)) == ["hello"]


def test_libsystemd_that_cannot_be_loaded_raises_journal_error_naming_dlopen(tmp_path: Path) -> None:
    reader = JournalReader(JournalSelection(directory=str(tmp_path), unit_globs=WATCHED), library="libnot-systemd.so.0")
    with pytest.raises(JournalError) as raised:
        reader.open()
    assert raised.value.function == "dlopen"
    assert str(raised.value).startswith("cannot load libnot-systemd.so.0: ")


def test_a_failed_sd_journal_call_raises_journal_error_with_its_errno_and_function(tmp_path: Path, clock: Clock) -> None:
    write_journal(tmp_path / "a.journal", [unit_output("vllm-a.service", "a0", clock.tick())])
    lib = LibSystemd()
    handle = lib.sd_journal_open_directory(str(tmp_path), 0)
    try:
        with pytest.raises(JournalError) as raised:
            lib.sd_journal_seek_cursor(handle, b"not a cursor")
    finally:
        lib.sd_journal_close(handle)
    assert (raised.value.errno, raised.value.function) == (errno.EINVAL, "sd_journal_seek_cursor")
    assert str(raised.value) == "seeking to the journal cursor failed: Invalid argument"


def test_an_entry_whose_field_cannot_be_read_is_skipped_and_counted(
        tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A field sd-journal cannot read (here: compressed with an algorithm this libsystemd lacks) costs its
    entry, which is counted; it is not read as an empty message, nor does it stop the reader."""

    class SecondMessageUnreadable(LibSystemd):
        def __init__(self, library: str = LIBSYSTEMD) -> None:
            super().__init__(library)
            raw_get_data, message_reads = self.raw_get_data, itertools.count(1)

            def get_data(handle, field, data, size):
                if field == b"MESSAGE" and next(message_reads) == 2:
                    return -errno.EPROTONOSUPPORT
                return raw_get_data(handle, field, data, size)

            self.raw_get_data = get_data

    monkeypatch.setattr(journal_source, "LibSystemd", SecondMessageUnreadable)
    write_journal(tmp_path / "a.journal", [unit_output("vllm-a.service", f"a{i}", clock.tick()) for i in range(3)])
    with reader_for(tmp_path) as reader:
        assert messages(read_all(reader)) == ["a0", "a2"]
        assert reader.unreadable_entries == 1
        assert (reader.last_unreadable.errno, reader.last_unreadable.function) == (
            errno.EPROTONOSUPPORT, "sd_journal_get_data")


def _open_as_nobody(selection: LogSelection) -> str:
    """Open the journal in a child process that dropped root; its outcome as text."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(read_end)
        outcome = "opened"
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            JournalReader(selection).open()
        except JournalError as error:
            outcome = f"unavailable: {error}"
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            outcome = f"other: {error!r}"
        os.write(write_end, outcome.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        outcome = pipe.read().decode()
    os.waitpid(pid, 0)
    return outcome


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    """A directory every user can reach (pytest's tmp_path is under a root-only directory)."""
    path = Path(tempfile.mkdtemp(prefix="journal-source-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_directory_behind_an_untraversable_parent_raises_journal_error(public_tmp: Path) -> None:
    parent = public_tmp / "private"
    (parent / "journal").mkdir(parents=True)
    os.chmod(parent, 0o700)
    outcome = _open_as_nobody(JournalSelection(directory=str(parent / "journal"), unit_globs=WATCHED))
    assert outcome == f"unavailable: journal directory {parent / 'journal'} is not readable: permission denied"


def test_unreadable_directory_raises_journal_error(public_tmp: Path, clock: Clock) -> None:
    directory = public_tmp / "journal"
    directory.mkdir()
    write_journal(directory / "a.journal", [unit_output("vllm-a.service", "x", clock.tick())])
    os.chmod(directory, 0o700)
    outcome = _open_as_nobody(JournalSelection(directory=str(directory), unit_globs=WATCHED))
    assert outcome == f"unavailable: journal directory {directory} is not readable: permission denied"


def test_directory_of_unreadable_journal_files_raises_journal_error(public_tmp: Path, clock: Clock) -> None:
    directory = public_tmp / "journal"
    directory.mkdir()
    path = write_journal(directory / "a.journal", [unit_output("vllm-a.service", "x", clock.tick())])
    os.chmod(directory, 0o755)
    os.chmod(path, 0o600)
    outcome = _open_as_nobody(JournalSelection(directory=str(directory), unit_globs=WATCHED))
    assert outcome.startswith(f"unavailable: no journal file in {directory} is readable: permission denied")


def test_reader_reopens_after_close_and_reads_the_boot_again(tmp_path: Path, clock: Clock) -> None:
    write_journal(tmp_path / "a.journal", [unit_output("vllm-a.service", "x", clock.tick())])
    reader = reader_for(tmp_path)
    assert messages(read_all(reader)) == ["x"]
    reader.close()
    with pytest.raises(RuntimeError):
        reader.read_available(1)
    reader.open()
    assert messages(read_all(reader)) == ["x"]
    reader.close()


def test_machine_id_subdirectories_of_the_directory_are_read(tmp_path: Path, clock: Clock) -> None:
    machine = tmp_path / "5f7c2e0a9b1d4c3e8f6a7b2c1d0e9f8a"
    machine.mkdir()
    write_journal(machine / "system.journal", [unit_output("vllm-a.service", "in machine dir", clock.tick())])
    with reader_for(tmp_path) as reader:
        assert messages(read_all(reader)) == ["in machine dir"]
    shutil.rmtree(machine)


@pytest.mark.usefixtures("match_mode")
def test_new_unit_after_the_read_position_file_was_vacuumed_is_picked_up_without_repeats(
        tmp_path: Path, unit_query_never_put_off: None) -> None:
    clock = Clock(current_boot_id())
    old = write_journal(tmp_path / "old.journal", [unit_output("vllm-a.service", f"o{i}", clock.tick()) for i in range(2)])
    with reader_for(tmp_path) as reader:
        assert messages(read_all(reader)) == ["o0", "o1"]
        old.unlink()
        assert reader.wait(5.0) is True
        write_journal_whole(tmp_path / "new.journal", [
            unit_output("vllm-new.service", "n0", clock.tick()),
            unit_output("vllm-a.service", "a2", clock.tick()),
        ])
        assert messages(follow_until(reader, 2)) == ["n0", "a2"]
        assert read_all(reader) == []


def test_selection_defaults_are_the_system_journal_vllm_units_and_current_boot() -> None:
    selection = JournalSelection()
    assert (selection.directory, selection.files, selection.unit_globs, selection.boot) == (
        None, (), ("vllm*.service",), "current")


def test_file_selection_follows_entries_appended_to_the_file_and_survives_its_deletion(tmp_path: Path) -> None:
    clock = Clock(current_boot_id())
    path = write_journal(tmp_path / "system.journal", [unit_output("vllm-a.service", "first", clock.tick())])
    with JournalReader(JournalSelection(files=[str(path)], unit_globs=WATCHED)) as reader:
        assert messages(read_all(reader)) == ["first"]
        append_journal(path, [unit_output("vllm-a.service", "second", clock.tick())])
        assert messages(follow_until(reader, 1)) == ["second"]
        path.unlink()
        assert follow_until(reader, 1, timeout_s=0.5) == []


# --- cost with many units -----------------------------------------------------------------------


class CountingLibSystemd(LibSystemd):
    """libsystemd counting the match terms in force, the entries stepped on, the MESSAGEs read and the
    queries of unit names (each made ``query_delay_s`` slower, as in a journal of thousands of units)."""

    last: CountingLibSystemd | None = None
    query_delay_s = 0.0

    def __init__(self, library: str = LIBSYSTEMD) -> None:
        super().__init__(library)
        CountingLibSystemd.last = self
        self.terms: list[bytes] = []
        self.steps = 0
        self.messages_read = 0
        self.unit_queries = 0
        raw_next, raw_get_data = self.raw_next, self.raw_get_data

        def counting_next(handle):
            self.steps += 1
            return raw_next(handle)

        def counting_get_data(handle, field, data, size):
            self.messages_read += field == b"MESSAGE"
            return raw_get_data(handle, field, data, size)

        self.raw_next, self.raw_get_data = counting_next, counting_get_data

    def sd_journal_add_match(self, handle, match: bytes) -> None:
        self.terms.append(match)
        super().sd_journal_add_match(handle, match)

    def sd_journal_flush_matches(self, handle) -> None:
        self.terms.clear()
        super().sd_journal_flush_matches(handle)

    def sd_journal_query_unique(self, handle, field: bytes) -> None:
        self.unit_queries += field == b"_SYSTEMD_UNIT"
        time.sleep(self.query_delay_s)
        super().sd_journal_query_unique(handle, field)


@pytest.fixture
def counting_libsystemd(monkeypatch: pytest.MonkeyPatch) -> type[CountingLibSystemd]:
    monkeypatch.setattr(journal_source, "LibSystemd", CountingLibSystemd)
    return CountingLibSystemd


def unit_name(index: int) -> str:
    return f"vllm-{index:04d}.service"


def many_units_journal(path: Path, units: int, clock: Clock, *, others_every: int = 10) -> int:
    """``units`` units starting together, 8 entries each (interleaved as concurrent starts are), and
    an unwatched unit's line every ``others_every`` entries; returns the number of entries written."""
    lines = ["vLLM API server version 0.24.0", "non-default args: {'model': 'Qwen/Qwen3-8B'}",
             "Available KV cache memory: 3.25 GiB", "GPU KV cache size: 47,328 tokens",
             "init engine (profile, create kv cache, warmup model) took 42.50 seconds",
             "Application startup complete."]
    watched = [unit_starting(unit_name(i), clock.tick()) for i in range(units)]
    watched += [unit_output(unit_name(i), line, clock.tick(), pid=1000 + i) for line in lines for i in range(units)]
    watched += [unit_started(unit_name(i), clock.tick()) for i in range(units)]
    entries: list[JournalEntrySpec] = []
    for index, entry in enumerate(watched):
        if index % others_every == 0:
            entries.append(unit_output("nginx.service", "GET / 200", clock.tick()))
        entries.append(entry)
    write_journal(path, entries)
    return len(entries)


def test_match_terms_do_not_grow_with_the_number_of_watched_units(
        tmp_path: Path, clock: Clock, counting_libsystemd: type[CountingLibSystemd]) -> None:
    """sd-journal looks every match term up on each step: 3,000 units as terms took 50 s for 24,000
    entries. The reader steps on each entry of the boot once instead, whatever the number of units."""
    terms = {}
    for units in (100, 300):
        directory = tmp_path / str(units)
        directory.mkdir()
        written = many_units_journal(directory / "system.journal", units, clock)
        with reader_for(directory) as reader:
            entries = read_all(reader)
            assert len(reader.units) == units
        libsystemd = counting_libsystemd.last
        assert len(entries) == units * 8
        assert [e.unit for e in entries[:units]] == [unit_name(i) for i in range(units)]
        assert all(e.from_systemd for e in entries[:units])
        terms[units] = list(libsystemd.terms)
        assert libsystemd.steps <= written + 2
    assert terms[300] == terms[100] == [b"_BOOT_ID=" + current_boot_id().encode()]


def test_few_watched_units_are_matched_so_other_units_entries_are_never_stepped_on(
        tmp_path: Path, clock: Clock, counting_libsystemd: type[CountingLibSystemd]) -> None:
    many_units_journal(tmp_path / "system.journal", 3, clock, others_every=1)
    with reader_for(tmp_path) as reader:
        assert len(read_all(reader)) == 3 * 8
    assert counting_libsystemd.last.steps <= 3 * 8 + 2  # each read_available() that reaches the end steps once more
    assert len(counting_libsystemd.last.terms) == 2 * 3 + 2


@pytest.mark.usefixtures("match_mode")
def test_units_refused_by_admit_are_skipped_without_reading_their_messages(
        tmp_path: Path, clock: Clock, counting_libsystemd: type[CountingLibSystemd]) -> None:
    asked: list[str] = []

    def admit_three(unit: str, when_usec: int | None) -> bool:
        asked.append(unit)
        return len(asked) <= 3

    many_units_journal(tmp_path / "system.journal", 10, clock)
    with reader_for(tmp_path, admit=admit_three) as reader:
        entries = read_all(reader)
    assert asked == [unit_name(i) for i in range(10)]  # once each, in journal order
    assert {e.unit for e in entries} == {unit_name(i) for i in range(3)}
    assert len(entries) == 3 * 8
    assert counting_libsystemd.last.messages_read == len(entries)


def test_a_slow_unit_query_is_not_repeated_on_every_journal_change_and_new_units_still_arrive(
        tmp_path: Path, counting_libsystemd: type[CountingLibSystemd], monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-listing 3,000 unit names on each change of a busy journal took most of a core while following."""
    monkeypatch.setattr(CountingLibSystemd, "query_delay_s", 0.03)  # a query of >= 60 ms: next one in >= 6 s
    clock = Clock(current_boot_id())
    path = write_journal(tmp_path / "a.journal", [unit_output("vllm-a.service", "a0", clock.tick())])
    with reader_for(tmp_path) as reader:
        assert messages(read_all(reader)) == ["a0"]
        libsystemd = counting_libsystemd.last
        queries = libsystemd.unit_queries
        for index in range(1, 6):
            append_journal(path, [unit_output("vllm-a.service", f"a{index}", clock.tick())])
            assert messages(follow_until(reader, 1)) == [f"a{index}"]
        assert libsystemd.unit_queries == queries
        append_journal(path, [unit_output("vllm-new.service", "n0", clock.tick()),
                              unit_output("vllm-a.service", "a6", clock.tick())])
        assert messages(follow_until(reader, 2, timeout_s=20.0)) == ["a6", "n0"]
        assert read_all(reader) == []


# --- the exporter's own unit (issue 19) -------------------------------------------------------------------


@pytest.mark.parametrize(("cgroup_file", "unit"), [
    ("0::/system.slice/vllm-xpu-exporter.service\n", "vllm-xpu-exporter.service"),
    ("0::/../system.slice/vllm-xpu-exporter.service\n", "vllm-xpu-exporter.service"),  # inside a cgroup namespace
    ("0::/../../system.slice/vllm-xpu-exporter.service\n", "vllm-xpu-exporter.service"),
    ("0::/system.slice/vllm-xpu-exporter.service/payload\n", "vllm-xpu-exporter.service"),
    ("12:name=systemd:/system.slice/vllm-xpu-exporter.service\n11:cpu,cpuacct:/\n0::/\n", "vllm-xpu-exporter.service"),
    ("0::/user.slice/user-1000.slice/session-3.scope\n", None),  # run from a shell
    ("0::/docker/0123456789abcdef\n", None),  # a container's own cgroup: no unit
    ("0::/\n", None),  # the root of a private cgroup namespace
    ("", None),
])
def test_own_service_unit_is_the_service_of_the_cgroup_file(cgroup_file: str, unit: str | None) -> None:
    assert host.own_service_unit(cgroup_file) == unit


def test_own_service_unit_of_an_unreadable_cgroup_file_is_none(tmp_path: Path) -> None:
    (tmp_path / "cgroup").write_text("0::/system.slice/vllm-xpu-exporter.service\n")
    assert host.read_own_service_unit(str(tmp_path / "cgroup")) == "vllm-xpu-exporter.service"
    assert host.read_own_service_unit(str(tmp_path / "missing")) is None


@pytest.mark.usefixtures("match_mode")
def test_the_exporters_own_unit_is_never_selected_whatever_the_globs(tmp_path: Path, clock: Clock) -> None:
    own = "vllm-xpu-exporter.service"
    write_journal(tmp_path / "a.journal", [
        unit_started(own, clock.tick()),
        unit_output(own, 'ts=2026-12-02T10:00:00.000Z level=info source=main msg="vllm-xpu-exporter 0.9.0 listening '
                         'on http://[::]:10447/metrics (collectors: journal)"', clock.tick()),
        unit_started("vllm-chat.service", clock.tick()),
        unit_output("vllm-chat.service", "Available KV cache memory: 10.5 GiB", clock.tick()),
        unit_process_exited(own, clock.tick(), status=1),
    ])
    selection = exporter_journal_selection(parse_options(["--journal.directory", str(tmp_path)]), own_unit=own)
    assert not selection.matches_unit(own) and selection.matches_unit("vllm-chat.service")
    with JournalReader(selection) as reader:
        assert [(entry.unit, entry.from_systemd) for entry in read_all(reader)] == [
            ("vllm-chat.service", True), ("vllm-chat.service", False)]
        assert reader.units == {"vllm-chat.service"}
