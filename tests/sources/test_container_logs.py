"""Containers' log files as a source (vllm_xpu_exporter.sources.containerlogs): Docker's json-file logs and the
kubelet's CRI files, written as dockerd and the kubelet write them, caught up and followed in process
(rotation, restarts, long lines, vanishing files, hostile lines, the caps), and the seed's boot race as
three Docker containers and as three pods over the exporter as a process: the same failures, KV figures
and overlaps as the systemd units."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from containerlogs import (RACE_CONTAINERS, RACE_POD_KEYS, ContainerLine, DockerHost, PodLogs, by_name,
                           cri_records, json_file_records, race_lines, rfc3339_nano, write_race_docker,
                           write_race_pods)
from vllm_xpu_exporter.fold.container_runs import ContainerRuns
from vllm_xpu_exporter.fold.engine_starts import EngineTracker
from vllm_xpu_exporter.runtimes import parse_rfc3339_usec
from vllm_xpu_exporter.runtimes.docker import parse_json_file_line
from vllm_xpu_exporter.runtimes import parse_cri_line
from vllm_xpu_exporter.parsers.vllm import FailureReason
from vllm_xpu_exporter.sources import containerlogs as containerlogs_source
from vllm_xpu_exporter.sources.containerlogs import ContainerLogReader, LogDirectories
from vllm_xpu_exporter.sources.logfile import MAX_LINE_BYTES
from vllm_xpu_exporter.sources.logs.entry import LogEntry, LogSelection
from vllm_xpu_exporter.nodatayet import NoDataYet
from vllm_xpu_exporter.sources.logs.follower import LogFollower, LogUnreadable
from exporterproc import RunningExporter
from journalgen import container_id, write_journal
from polling import ManualClock, wait_for
from scrapes import sample
from test_journal_containers import figures, systemd_figures
from vllmlogs import CHAT, EMBEDDING, STT, boot_race, journal_specs

ALL = LogSelection(container_globs=("*vllm*",), boot="all")
T0 = 1_747_044_672_000_000


def at(seconds: float) -> int:
    return T0 + round(seconds * 1e6)


def printed(name: str, message: str, seconds: float, run: int = 0, stream: str = "stdout") -> ContainerLine:
    return ContainerLine(at(seconds), 0, name, message, run, "", stream)


def reader(directories: LogDirectories, selection: LogSelection = ALL, **options) -> ContainerLogReader:
    options.setdefault("poll_seconds", 0.0)
    options.setdefault("discover_seconds", 0.0)
    opened = ContainerLogReader(selection, directories, **options)
    opened.open()
    return opened


def read(opened: ContainerLogReader) -> list[LogEntry]:
    entries: list[LogEntry] = []
    while batch := opened.read_available(1000):
        entries += batch
    return entries


def texts(entries: list[LogEntry]) -> list[str]:
    return [entry.message for entry in entries]


# --- the formats (pure) -------------------------------------------------------------------------------


@pytest.mark.fast
def test_rfc3339_times_as_docker_containerd_and_cri_o_write_them():
    assert parse_rfc3339_usec(b"2016-10-06T00:17:09.669794202Z") == 1475713029_669794
    assert parse_rfc3339_usec(b"2016-10-06T00:17:09Z") == 1475713029_000000
    assert parse_rfc3339_usec(b"2016-10-06T02:17:09.5+02:00") == 1475713029_500000
    assert parse_rfc3339_usec(rfc3339_nano(T0, offset_minutes=-330).encode()) == T0
    for bad in (b"", b"2016-13-06T00:17:09Z", b"2016-10-06 00:17:09Z", b"2016-10-06T00:17:09", b"x" * 100):
        assert parse_rfc3339_usec(bad) is None


@pytest.mark.fast
def test_json_file_records_and_their_pieces():
    line = printed("c", "a <tag> & \u00e9" + "y" * 40_000, 1.5, stream="stderr")
    records = json_file_records(line)
    assert len(records) == 3 and b"\\u003ctag\\u003e \\u0026" in records[0]
    parsed = [parse_json_file_line(record.rstrip(b"\n")) for record in records]
    assert [(p.partial, p.stream, p.realtime_usec) for p in parsed] == [(True, "stderr", at(1.5))] * 2 + [
        (False, "stderr", at(1.5))]
    assert "".join(p.text for p in parsed) == line.message
    assert parse_json_file_line(b'{"log":"hi\\r\\n","stream":"stdout","time":"2016-10-06T00:17:09Z"}').text == "hi"
    for bad in (b"", b"not json", b"[1]", b'{"log":1,"stream":"stdout","time":"2016-10-06T00:17:09Z"}',
                b'{"log":"x\\n","stream":"stdin","time":"2016-10-06T00:17:09Z"}',
                b'{"log":"x\\n","stream":"stdout","time":"yesterday"}', b"\xff\xfe", b"[" * 100_000):
        assert parse_json_file_line(bad) is None


@pytest.mark.fast
def test_cri_records_and_their_pieces():
    line = printed("c", "z" * 20_000, 2.0)
    records = cri_records(line)
    parsed = [parse_cri_line(record.rstrip(b"\n")) for record in records]
    assert [p.partial for p in parsed] == [True, False]
    assert "".join(p.text for p in parsed) == line.message
    assert parse_cri_line(b"2016-10-06T00:17:09.669794202Z stdout F") == parse_cri_line(
        b"2016-10-06T00:17:09.669794202Z stdout F ")  # an empty line
    assert parse_cri_line(b"2016-10-06T00:17:09Z stdout F:x hello").text == "hello"
    for bad in (b"", b"garbage", b"2016-10-06T00:17:09Z stdout X hi", b"2016-10-06T00:17:09Z other F hi",
                b"notatime stdout F hi"):
        assert parse_cri_line(bad) is None


@pytest.mark.fast
def test_a_forgotten_container_frees_its_place_and_its_open_init_overlaps_nothing():
    def entry(unit: str, message: str, seconds: float) -> LogEntry:
        return LogEntry(unit, at(seconds), None, "", message, False, "", None, "", f"{unit}-run")

    version = "(APIServer pid=7) INFO 05-12 10:11:13 [api_server.py:1895] vLLM API server version 0.24.0"
    tracker = EngineTracker(max_units=1)
    tracker.extend(ContainerRuns().lines([entry("docker/a", version, 1)]))  # a's init never ends
    assert not tracker.admit("docker/b")
    tracker.forget("docker/a")
    assert tracker.admit("docker/b")
    tracker.extend(ContainerRuns().lines([entry("docker/b", version, 2)]))
    (view,) = tracker.views()
    assert view.unit == "docker/b" and view.overlaps == 0


# --- Docker's json-file logs ----------------------------------------------------------------------------


def test_docker_containers_are_read_by_name_and_only_those_with_json_file_logs(tmp_path):
    host = DockerHost(tmp_path)
    chat = host.add("vllm-chat")
    host.add("vllm-journald", log_driver="journald")
    nginx = host.add("nginx")
    chat.write([printed("vllm-chat", "first", 1), printed("vllm-chat", "second", 2)])
    nginx.write([printed("nginx", "GET /", 1)])
    with reader(LogDirectories(docker_roots=(str(tmp_path),))) as opened:
        entries = read(opened)
    assert [(e.unit, e.message, e.container_run, e.realtime_usec, e.stream) for e in entries] == [
        ("docker/vllm-chat", "first", chat.id, at(1), "stdout"), ("docker/vllm-chat", "second", chat.id, at(2), "stdout")]


def test_appended_lines_are_followed_and_rotation_loses_and_repeats_nothing(tmp_path):
    chat = DockerHost(tmp_path).add("vllm-chat")
    chat.write([printed("vllm-chat", f"line {n}", n) for n in range(3)])
    with reader(LogDirectories(docker_roots=(str(tmp_path),))) as opened:
        assert texts(read(opened)) == ["line 0", "line 1", "line 2"]
        chat.write([printed("vllm-chat", "line 3", 3)])
        chat.rotate()  # line 3 was written, not read yet: it is in .1 now
        chat.write([printed("vllm-chat", "line 4", 4)])
        assert texts(read(opened)) == ["line 3", "line 4"]
        chat.rotate()
        chat.write([printed("vllm-chat", "line 5", 5)])
        chat.rotate()  # two rotations between two reads: .2 and .1 are new to the reader
        chat.write([printed("vllm-chat", "line 6", 6)])
        assert texts(read(opened)) == ["line 5", "line 6"]
        assert texts(read(opened)) == []
    with reader(LogDirectories(docker_roots=(str(tmp_path),))) as opened:  # caught up again: .3 .2 .1 then live
        assert texts(read(opened)) == [f"line {n}" for n in range(7)]


def test_gzipped_rotations_are_read_in_the_catch_up(tmp_path):
    chat = DockerHost(tmp_path).add("vllm-chat")
    for n in range(4):
        chat.write([printed("vllm-chat", f"line {n}", n)])
        chat.rotate(compress=True)
    chat.write([printed("vllm-chat", "line 4", 4)])
    assert sorted(p.name.split("-json.log")[1] for p in chat.directory.glob("*-json.log*")) == [
        "", ".1.gz", ".2.gz", ".3.gz", ".4.gz"]
    with reader(LogDirectories(docker_roots=(str(tmp_path),))) as opened:
        assert texts(read(opened)) == [f"line {n}" for n in range(5)]


def test_a_line_written_in_two_writes_is_read_once_whole(tmp_path):
    chat = DockerHost(tmp_path).add("vllm-chat")
    record = json_file_records(printed("vllm-chat", "whole", 1))[0]
    chat.append_raw(record[:10])
    with reader(LogDirectories(docker_roots=(str(tmp_path),))) as opened:
        assert read(opened) == []
        chat.append_raw(record[10:])
        assert texts(read(opened)) == ["whole"]


def test_much_at_once_is_read_in_bounded_polls_without_waiting(tmp_path, monkeypatch):
    """A poll reads at most FILE_POLL_BYTES of a file and POLL_BYTES of all files (a container found while
    following: of its history); the rest comes at once (wait() does not sleep), in order, each line once."""
    monkeypatch.setattr(containerlogs_source, "FILE_POLL_BYTES", 4096)
    monkeypatch.setattr(containerlogs_source, "POLL_BYTES", 6000)
    host = DockerHost(tmp_path)
    chat = host.add("vllm-chat")
    with reader(LogDirectories(docker_roots=(str(tmp_path),)), poll_seconds=3600) as opened:
        assert read(opened) == []
        opened._next_poll = 0.0  # the next poll is due now; after it, only what is left makes it read again
        chat.write([printed("vllm-chat", f"chat {n}", n) for n in range(300)])
        late = host.add("vllm-late")
        late.write([printed("vllm-late", f"late {n}", n) for n in range(120)])
        got: list[LogEntry] = []
        while opened.wait(0):
            batch = opened.read_available(1000)
            if not batch:
                break
            got += batch
    assert [e.message for e in got if e.unit == "docker/vllm-chat"] == [f"chat {n}" for n in range(300)]
    assert [e.message for e in got if e.unit == "docker/vllm-late"] == [f"late {n}" for n in range(120)]


def test_a_rootless_dockerds_containers_are_their_users(tmp_path):
    """A container of a rootless dockerd's data root (its directory owned by uid 1000) is that user's:
    docker/<name>@uid1000, never root's docker/<name>; its config.v2.json says when it ended only if the
    user owns it."""
    root_host, user_host = DockerHost(tmp_path / "root"), DockerHost(tmp_path / "user")
    root_host.add("vllm-chat").write([printed("vllm-chat", "root's", 1)])
    users = user_host.add("vllm-chat", salt="user")
    users.write([printed("vllm-chat", "the user's", 2)])
    for path in (users.directory, users.directory / "config.v2.json", users.log):
        os.chown(path, 1000, 1000)
    with reader(LogDirectories(docker_roots=(str(tmp_path / "root"), str(tmp_path / "user")))) as opened:
        got = {(e.unit, e.message) for e in read(opened) if not e.from_systemd}
    assert got == {("docker/vllm-chat", "root's"), ("docker/vllm-chat@uid1000", "the user's")}


def podman_container(storage: Path, name: str, lines: list[bytes], log: bool = True) -> Path:
    """A container of a Podman storage as Podman 4.3 lays it out: its name in overlay-containers/containers.json,
    and, with the k8s-file log driver (`log`), conmon's CRI lines in its userdata/ctr.log; its directory."""
    containers = storage / "overlay-containers"
    containers.mkdir(parents=True, exist_ok=True)
    listed = containers / "containers.json"
    entries = json.loads(listed.read_text()) if listed.exists() else []
    cid = container_id(f"podman/{storage}/{name}")
    listed.write_text(json.dumps([*entries, {"id": cid, "names": [name]}]))
    userdata = containers / cid / "userdata"
    userdata.mkdir(parents=True)
    if log:
        (userdata / "ctr.log").write_bytes(b"".join(line + b"\n" for line in lines))
    return containers / cid


@pytest.mark.fast
def test_podman_k8s_file_logs_are_read_by_the_name_its_storage_gives(tmp_path):
    """conmon's k8s-file lines (CRI, the local offset, a line's pieces) of a Podman container, under
    podman/<name>, one run for the container's id; a journald container (no ctr.log) and one the storage's list does not name are not
    read."""
    storage = tmp_path / "storage"
    chat = podman_container(storage, "vllm-chat", [b"2025-05-12T10:11:13.000000000+02:00 stdout F first",
                                                   b"2025-05-12T10:11:14.000000000+02:00 stderr P sec",
                                                   b"2025-05-12T10:11:14.100000000+02:00 stderr F ond"])
    podman_container(storage, "vllm-journald", [], log=False)
    unnamed = storage / "overlay-containers" / ("f" * 64) / "userdata"
    unnamed.mkdir(parents=True)
    (unnamed / "ctr.log").write_bytes(b"2025-05-12T10:11:13.000000000+02:00 stdout F not named\n")
    with reader(LogDirectories(podman_storages=(str(storage),))) as opened:
        entries = [entry for entry in read(opened) if not entry.from_systemd]
    at_13 = parse_rfc3339_usec(b"2025-05-12T08:11:13Z")
    assert [(e.unit, e.message, e.container_run, e.realtime_usec, e.stream, e.partial) for e in entries] == [
        ("podman/vllm-chat", "first", chat.name, at_13, "stdout", False),
        ("podman/vllm-chat", "sec", chat.name, at_13 + 1_000_000, "stderr", True),
        ("podman/vllm-chat", "ond", chat.name, at_13 + 1_100_000, "stderr", False)]


@pytest.mark.fast
def test_a_rootless_podmans_k8s_file_containers_are_their_users(tmp_path):
    """A container of a storage whose list and directory uid 1000 owns is that user's (podman/<name>@uid1000);
    a directory of the user's that root's list names is nobody's (the user may name a directory as root's
    container: it is not believed)."""
    line = b"2025-05-12T10:11:13.000000000+00:00 stdout F %s"
    podman_container(tmp_path / "root", "vllm-chat", [line % b"root's"])
    users = podman_container(tmp_path / "user", "vllm-chat", [line % b"the user's"])
    for path in (users.parent / "containers.json", users, users / "userdata", users / "userdata/ctr.log"):
        os.chown(path, 1000, 1000)
    os.chown(podman_container(tmp_path / "root", "vllm-fake", [line % b"fake"]), 1000, 1000)
    with reader(LogDirectories(podman_storages=(str(tmp_path / "root"), str(tmp_path / "user")))) as opened:
        got = {(e.unit, e.message) for e in read(opened) if not e.from_systemd}
    assert got == {("podman/vllm-chat", "root's"), ("podman/vllm-chat@uid1000", "the user's")}


def test_garbage_and_overlong_lines_are_skipped_and_counted(tmp_path):
    chat = DockerHost(tmp_path).add("vllm-chat")
    chat.write([printed("vllm-chat", "before", 1)])
    chat.append_raw(b"garbage\n{\"log\": 1}\n" + b"[" * 50_000 + b"\n" + b"x" * (MAX_LINE_BYTES + 10) + b"\n")
    chat.write([printed("vllm-chat", "after", 2)])
    with reader(LogDirectories(docker_roots=(str(tmp_path),))) as opened:
        assert texts(read(opened)) == ["before", "after"]
        assert opened.unreadable_entries == 4
        chat.append_raw(b"y" * (MAX_LINE_BYTES + 10))  # overlong while still being written
        read(opened)
        chat.append_raw(b"y" * 100 + b"\n")
        chat.write([printed("vllm-chat", "later", 3)])
        assert texts(read(opened)) == ["later"]
        assert opened.unreadable_entries == 5


def test_records_from_before_this_boot_are_skipped_with_the_current_boot(tmp_path):
    chat = DockerHost(tmp_path).add("vllm-chat")
    now_usec = round(time.time() * 1e6)
    chat.write([ContainerLine(T0, 0, "vllm-chat", "last year", 0), ContainerLine(now_usec, 0, "vllm-chat", "now", 0)])
    with reader(LogDirectories(docker_roots=(str(tmp_path),)),
                LogSelection(container_globs=("*vllm*",), boot="current")) as opened:
        assert texts(read(opened)) == ["now"]


def test_a_removed_container_is_read_to_its_end_then_forgotten(tmp_path):
    host = DockerHost(tmp_path)
    chat = host.add("vllm-chat")
    chat.write([printed("vllm-chat", "one", 1)])
    clock = ManualClock()
    forgotten: list[str] = []
    with reader(LogDirectories(docker_roots=(str(tmp_path),)), clock=clock, forget=forgotten.append,
                vanished_retention_seconds=60) as opened:
        assert texts(read(opened)) == ["one"]
        chat.write([printed("vllm-chat", "its last words", 2)])
        shutil.rmtree(chat.directory)
        assert texts(read(opened)) == ["its last words"]
        clock.now += 30
        assert read(opened) == [] and forgotten == []
        clock.now += 31
        assert read(opened) == [] and forgotten == ["docker/vllm-chat"]
        recreated = host.add("vllm-chat", salt="2")  # compose up again: a new container of the same name
        recreated.write([printed("vllm-chat", "reborn", 100)])
        assert [(e.unit, e.message, e.container_run) for e in read(opened)] == [
            ("docker/vllm-chat", "reborn", recreated.id)]


@pytest.mark.parametrize("stopped", [False, True])
def test_a_docker_container_that_ends_during_its_init_does_not_stay_initialising(tmp_path, stopped):
    """Its config.v2.json says it is not running: a run that died without a cause vLLM printed counts as
    `other` (as a unit's main process exit), one `docker stop` ended as stopped (nothing); its start again
    is a new run."""
    version = "(APIServer pid=7) INFO 05-12 10:11:13 [api_server.py:1895] vLLM API server version 0.24.0"
    chat = DockerHost(tmp_path).add("vllm-chat")
    chat.set_state(running=True, started_usec=at(0))
    chat.write([printed("vllm-chat", version, 1), printed("vllm-chat", "Loading weights...", 2)])
    runs, tracker = ContainerRuns(), EngineTracker()
    with reader(LogDirectories(docker_roots=(str(tmp_path),))) as opened:
        tracker.extend(runs.lines(read(opened)))
        (view,) = tracker.views()
        assert view.initialising_since_usec == at(1)
        chat.set_state(running=False, started_usec=at(0), finished_usec=at(3), stopped=stopped, exit_code=137)
        tracker.extend(runs.lines(read(opened)))
        assert read(opened) == []  # handed on once
        tracker.settle(at(3) + 6_000_000)
        (view,) = tracker.views()
        assert view.initialising_since_usec is None
        assert view.failures[FailureReason.OTHER] == (0 if stopped else 1)
        chat.set_state(running=True, started_usec=at(10))
        chat.write([printed("vllm-chat", version, 11)])
        tracker.extend(runs.lines(read(opened)))
        (view,) = tracker.views()
        assert view.initialising_since_usec == at(11)


def test_containers_beyond_the_cap_are_not_read(tmp_path):
    host = DockerHost(tmp_path)
    for n in range(4):
        host.add(f"vllm-{n}").write([printed(f"vllm-{n}", f"from {n}", n)])
    admitted: list[str] = []

    def admit(key: str) -> bool:
        if len(admitted) < 2:
            admitted.append(key)
            return True
        return False

    with reader(LogDirectories(docker_roots=(str(tmp_path),)), admit=admit) as opened:
        entries = read(opened)
    assert {e.unit for e in entries} == set(admitted) and len(admitted) == 2


# --- the kubelet's CRI files ----------------------------------------------------------------------------


def test_pods_restarts_and_the_kubelets_rotation(tmp_path):
    pods = PodLogs(tmp_path)
    vllm = pods.add("inference", "vllm-chat-0", "vllm", uid="0b7e4bd2-4f3c-4d8e-9c77-7f2ef5c6a111")
    pods.add("inference", "vllm-chat-0-sidecar", "istio-proxy").write(0, [printed("x", "not watched", 1)])
    vllm.write(0, [printed("vllm", f"run 0 line {n}", n) for n in range(2)])
    rotated = vllm.rotate(0, at(2))
    vllm.write(0, [printed("vllm", "written to the renamed file before the reopen", 2.5)])
    with reader(LogDirectories(pods=str(tmp_path))) as opened:
        entries = read(opened)
        assert [(e.unit, e.message, e.container_run) for e in entries] == [
            (vllm.key, "run 0 line 0", f"{vllm.uid}/vllm/0"), (vllm.key, "run 0 line 1", f"{vllm.uid}/vllm/0"),
            (vllm.key, "written to the renamed file before the reopen", f"{vllm.uid}/vllm/0")]
        vllm.reopen(0)
        vllm.write(0, [printed("vllm", "after the reopen", 3)])
        vllm.compress(rotated)
        vllm.write(1, [printed("vllm", "restarted", 10)])  # the kubelet's next restart: 1.log
        assert [(e.message, e.container_run) for e in read(opened)] == [
            ("after the reopen", f"{vllm.uid}/vllm/0"), ("restarted", f"{vllm.uid}/vllm/1")]
        vllm.log(0).unlink()  # the kubelet keeps the latest exited instance's log only
        vllm.write(1, [printed("vllm", "still followed", 11)])
        assert texts(read(opened)) == ["still followed"]


def test_a_rotation_reopened_late_loses_no_line(tmp_path):
    """The kubelet renames, then asks the runtime to reopen: lines written in between land in the renamed
    file, and the reader sees the live path missing for a while."""
    vllm = PodLogs(tmp_path).add("ns", "vllm-0", "vllm")
    vllm.write(0, [printed("vllm", "a", 1)])
    with reader(LogDirectories(pods=str(tmp_path))) as opened:
        assert texts(read(opened)) == ["a"]
        vllm.rotate(0, at(1))
        vllm.write(0, [printed("vllm", "b", 2)])  # into the rotated file
        assert texts(read(opened)) == ["b"]
        vllm.write(0, [printed("vllm", "c", 3)])
        vllm.reopen(0)
        vllm.write(0, [printed("vllm", "d", 4)])
        assert texts(read(opened)) == ["c", "d"]
        assert texts(read(opened)) == []


def test_a_missing_directory_fails_the_source_until_it_appears(tmp_path):
    follower = LogFollower(ALL, open_reader=lambda selection, admit, forget: ContainerLogReader(
        selection, LogDirectories(pods=str(tmp_path / "pods")), admit=admit, forget=forget, poll_seconds=0.1),
        source="container logs")
    follower.start()
    try:
        state = wait_for(lambda: not isinstance((s := follower.state()).error, NoDataYet) and s)
        assert isinstance(state.error, LogUnreadable)
        assert str(state.error) == f"container log directory {tmp_path / 'pods'} does not exist"
        write_race_pods(tmp_path / "pods")
        state = wait_for(lambda: (s := follower.state()).error is None and len(s.views) == 3 and s, timeout=15)
        assert state and {view.unit for view in state.views} == {RACE_POD_KEYS[u] for u in (CHAT, EMBEDDING, STT)}
    finally:
        follower.stop()


# --- the seed's boot race (in process) --------------------------------------------------------------------


def fold(entries: list[LogEntry]) -> dict[str, dict]:
    tracker = EngineTracker()
    tracker.extend(ContainerRuns().lines(entries))
    tracker.settle(round(time.time() * 1e6))
    return {view.unit: figures(view) for view in tracker.views()}


@pytest.mark.parametrize("rotate_every,compress", [(0, False), (7, False), (5, True)])
def test_the_race_as_docker_containers_folds_as_under_systemd(tmp_path, rotate_every, compress):
    write_race_docker(tmp_path, rotate_every=rotate_every, compress=compress)
    with reader(LogDirectories(docker_roots=(str(tmp_path),))) as opened:
        folded = fold(read(opened))
    expected = systemd_figures()
    assert set(folded) == {f"docker/{RACE_CONTAINERS[u]}" for u in (CHAT, EMBEDDING, STT)}
    for unit in (CHAT, EMBEDDING, STT):
        assert folded[f"docker/{RACE_CONTAINERS[unit]}"] == expected[unit], unit


@pytest.mark.parametrize("rotate_every,compress,offset", [(0, False, 0), (6, True, 60), (4, True, -300)])
def test_the_race_as_pods_folds_as_under_systemd(tmp_path, rotate_every, compress, offset):
    write_race_pods(tmp_path, rotate_every=rotate_every, compress=compress, offset_minutes=offset)
    with reader(LogDirectories(pods=str(tmp_path))) as opened:
        folded = fold(read(opened))
    expected = systemd_figures()
    assert set(folded) == {RACE_POD_KEYS[u] for u in (CHAT, EMBEDDING, STT)}
    for unit in (CHAT, EMBEDDING, STT):
        assert folded[RACE_POD_KEYS[unit]] == expected[unit], unit


def test_the_race_followed_line_by_line_folds_as_caught_up(tmp_path):
    """The race written while the reader follows it (each container's lines in their own time order,
    a poll between batches): the same fold as reading it whole."""
    lines, _ = race_lines()
    host = DockerHost(tmp_path)
    containers = {name: host.add(name) for name in RACE_CONTAINERS.values()}
    follower = LogFollower(ALL, open_reader=lambda selection, admit, forget: ContainerLogReader(
        selection, LogDirectories(docker_roots=(str(tmp_path),)), admit=admit, forget=forget, poll_seconds=0.05),
        source="container logs")
    follower.start()
    try:
        assert wait_for(lambda: follower.state().error is None)
        for begin in range(0, len(lines), 25):
            for line in lines[begin:begin + 25]:
                containers[line.name].write([line])
            time.sleep(0.06)
        expected = systemd_figures()
        keys = {f"docker/{RACE_CONTAINERS[u]}": u for u in (CHAT, EMBEDDING, STT)}
        got = wait_for(lambda: (views := {v.unit: figures(v) for v in follower.state().views})
                       and all(views.get(k) == expected[u] for k, u in keys.items()) and views, timeout=15)
        assert got, {v.unit: figures(v) for v in follower.state().views}
    finally:
        follower.stop()


# --- over the exporter ------------------------------------------------------------------------------------

ONLY_JOURNAL = ["--no-collector.levelzero", "--no-collector.processes"]


def unit_series(samples: dict, rename: dict[str, str]) -> dict:
    """The xpu_unit_* samples of the units in `rename`, under their new names."""
    out = {}
    for (name, labels), value in samples.items():
        if not name.startswith("xpu_unit_"):
            continue
        labels = dict(labels)
        if labels.get("unit") in rename:
            labels["unit"] = rename[labels["unit"]]
            out[name, tuple(sorted(labels.items()))] = value
    return out


def caught_up(exporter: RunningExporter) -> dict:
    return wait_for(lambda: (s := exporter.scrape()) and
                    sample(s, "xpu_exporter_collector_success", collector="journal") == 1 and s, timeout=20)


def systemd_samples(tmp_path: Path) -> dict:
    race = boot_race()
    journal = write_journal(tmp_path / "race.journal", journal_specs(race.placed))
    with RunningExporter([*ONLY_JOURNAL, "--journal.file", str(journal), "--journal.boot", race.boot_id]) as exporter:
        return caught_up(exporter)


@pytest.mark.parametrize("engine", ["docker", "pods"])
def test_the_race_as_docker_containers_or_as_pods_over_the_exporter(tmp_path, engine):
    """One exporter each: the containers of one fold overlap each other's inits, as units of one journal do."""
    expected = unit_series(systemd_samples(tmp_path), {u: u for u in (CHAT, EMBEDDING, STT)})
    assert sample(expected, "xpu_unit_engine_init_failures_total", unit=CHAT, reason="kv_cache_too_small") == 1
    assert sample(expected, "xpu_unit_engine_init_overlaps_total", unit=CHAT) >= 1
    empty = write_journal(tmp_path / "empty.journal", [])
    args = [*ONLY_JOURNAL, "--journal.file", str(empty), "--journal.boot", "all"]
    if engine == "docker":
        write_race_docker(tmp_path / "docker", rotate_every=9, compress=True)
        args += ["--path.docker", str(tmp_path / "docker"), "--logs.docker"]
        keys = {f"docker/{RACE_CONTAINERS[u]}": u for u in (CHAT, EMBEDDING, STT)}
    else:
        write_race_pods(tmp_path / "pods", rotate_every=8, compress=True)
        args += ["--path.pods", str(tmp_path / "pods"), "--logs.pods"]
        keys = {RACE_POD_KEYS[u]: u for u in (CHAT, EMBEDDING, STT)}
    with RunningExporter(args) as exporter:
        samples = caught_up(exporter)
    assert unit_series(samples, keys) == expected
    assert sample(samples, "xpu_exporter_journal_units_watched") == 3
    assert sample(samples, "xpu_exporter_container_log_lines_read_total") > 0
    assert sample(samples, "xpu_exporter_container_log_lines_rejected_total") == 0
    units = {dict(labels).get("unit") for _, labels in samples} - {None}
    assert units == set(keys)  # other-llm is not watched


def test_an_unreadable_log_directory_fails_the_collector_and_the_journal_is_still_served(tmp_path):
    race = boot_race()
    journal = write_journal(tmp_path / "race.journal", journal_specs(race.placed))
    args = [*ONLY_JOURNAL, "--journal.file", str(journal), "--journal.boot", race.boot_id,
            "--path.pods", str(tmp_path / "nowhere"), "--logs.pods"]
    with RunningExporter(args) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and
                           sample(s, "xpu_unit_engine_starts_total", unit=CHAT) == 1 and s, timeout=20)
        assert sample(samples, "xpu_exporter_collector_success", collector="journal") == 0
        assert "container log directory" in wait_for(lambda: "does not exist" in exporter.stderr and exporter.stderr)
        os.makedirs(tmp_path / "nowhere")
        assert wait_for(lambda: sample(exporter.scrape(), "xpu_exporter_collector_success", collector="journal") == 1,
                        timeout=20)


def test_by_name_groups_lines():  # keeps the fixture's helper honest
    lines, _ = race_lines()
    assert set(by_name(lines)) == set(RACE_CONTAINERS.values())
