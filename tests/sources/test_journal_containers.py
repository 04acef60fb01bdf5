"""Containers logging to the journal (Docker's and Podman's journald log driver), read from real journal
files: selected by name, keyed docker/<name> or podman/<name>, their runs told apart, their long lines
joined, and folded as units are: the seed's three units as three containers give the same failures, KV
figures and overlaps as under systemd."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from containerlogs import RACE_CONTAINERS, DockerHost, container_lines, epoch, journald_specs
from vllm_xpu_exporter.fold.container_runs import ContainerRuns
from vllm_xpu_exporter.fold.engine_starts import EngineTracker, UnitView
from vllm_xpu_exporter.parsers.vllm import FailureReason
from vllm_xpu_exporter.sources.journal import JournalReader, open_journal
from vllm_xpu_exporter.sources.journal import JournalSelection
from vllm_xpu_exporter.sources.logs.entry import LogEntry
from vllm_xpu_exporter.sources.logs.follower import LogFollower
from exporterproc import RunningExporter
from journalgen import (Clock, Moment, append_journal, container_id, container_output, podman_died, random_boot_id,
                        unit_output, write_journal)
from polling import wait_for
from scrapes import sample
from vllmlogs import CHAT, EMBEDDING, STT, boot_race

CONTAINERS = ("*vllm*",)
KEYS = {unit: f"docker/{name}" for unit, name in RACE_CONTAINERS.items()}


def read_all(reader: JournalReader) -> list[LogEntry]:
    entries: list[LogEntry] = []
    while batch := reader.read_available(1000):
        entries.extend(batch)
    return entries


def open_reader(path: Path, boot: str = "all", containers=CONTAINERS, units=("vllm*.service",)) -> JournalReader:
    reader = JournalReader(JournalSelection(files=[str(path)], unit_globs=units, container_globs=containers,
                                        boot=boot))
    reader.open()
    return reader


def follow(path: Path, *, containers=CONTAINERS, max_units: int = 64, boot: str = "all",
           docker_roots=()) -> list[UnitView]:
    follower = LogFollower(JournalSelection(files=[str(path)], container_globs=containers, boot=boot,
                                        container_state={"docker_roots": docker_roots}), max_units,
                           open_reader=open_journal, source="journal")
    follower.start()
    try:
        state = wait_for(lambda: (s := follower.state()).error is None and s, timeout=20)
        assert state, follower.state().error
        return state.views
    finally:
        follower.stop()


def figures(view: UnitView) -> dict:
    """What the metrics of a unit say: counters, the latest start's settings and KV figures."""
    latest, success = view.latest, view.last_success
    return {
        "starts": view.starts, "failures": dict(view.failures), "overlaps": view.overlaps,
        "last_failure_usec": view.last_failure_usec, "context_shrinks": view.context_shrinks,
        "version": latest and latest.version, "model": latest and latest.model,
        "gpu_memory_utilization": latest and latest.effective_gpu_memory_utilization,
        "max_model_len": latest and latest.max_model_len, "max_num_seqs": latest and latest.max_num_seqs,
        "kv_cache_bytes": latest and latest.effective_kv_cache_bytes,
        "required_bytes": latest and latest.effective_required_bytes,
        "max_concurrency": latest and latest.max_concurrency,
        "kv_cache_tokens": success and success.effective_kv_cache_tokens,
        "init_duration_seconds": success and success.init_duration_seconds,
    }


def systemd_figures() -> dict[str, dict]:
    """The seed's boot race folded as the journal reader hands its units' entries over."""
    race = boot_race()
    tracker = EngineTracker()
    tracker.extend(race.entries())
    tracker.settle(round(time.time() * 1e6))
    return {view.unit: figures(view) for view in tracker.views()}


def race_journal(tmp_path: Path, **options) -> tuple[Path, str]:
    race = boot_race()
    lines = container_lines(race.this_boot(), RACE_CONTAINERS)
    return write_journal(tmp_path / "containers.journal", journald_specs(lines, race.boot_id, **options)), race.boot_id


# --- selection ------------------------------------------------------------------------------


def test_docker_and_podman_lines_are_read_under_their_keys_with_their_runs(tmp_path):
    clock = Clock(random_boot_id())
    chat, proxy = container_id("vllm-chat"), container_id("vllm-proxy")
    path = write_journal(tmp_path / "x.journal", [
        container_output("vllm-chat", "docker line", clock.tick(), container=chat, epoch="e1"),
        container_output("vllm-embed", "podman line", clock.tick(), runtime="podman", conmon_pid=3001),
        container_output("nginx", "not watched", clock.tick()),
        unit_output("vllm-stt.service", "unit line", clock.tick()),
        container_output("vllm-chat", "after a restart", clock.tick(), container=chat, epoch="e2"),
        container_output("vllm-chat", "an older Docker: no epoch", clock.tick(), container=proxy, epoch=None),
    ])
    with open_reader(path) as reader:
        entries = read_all(reader)
    assert [(e.unit, e.message, e.container_run, e.pid, e.invocation_id) for e in entries if "/" in e.unit] == [
        ("docker/vllm-chat", "docker line", f"{chat}/e1", None, ""),
        ("podman/vllm-embed", "podman line", f"{container_id('vllm-embed')}/3001", None, ""),  # conmon's newline gone
        ("docker/vllm-chat", "after a restart", f"{chat}/e2", None, ""),
        ("docker/vllm-chat", "an older Docker: no epoch", proxy, None, ""),
    ]
    assert [e.unit for e in entries if "/" not in e.unit] == ["vllm-stt.service"]


def test_without_container_globs_no_container_is_read(tmp_path):
    clock = Clock(random_boot_id())
    path = write_journal(tmp_path / "x.journal", [container_output("vllm-chat", "docker line", clock.tick()),
                                                  unit_output("vllm-stt.service", "unit line", clock.tick())])
    with open_reader(path, containers=()) as reader:
        assert [e.unit for e in read_all(reader)] == ["vllm-stt.service"]


def test_globs_with_a_slash_match_the_key_and_others_the_name(tmp_path):
    clock = Clock(random_boot_id())
    path = write_journal(tmp_path / "x.journal", [
        container_output("chat", "d", clock.tick()),
        container_output("chat", "p", clock.tick(), runtime="podman"),
        container_output("vllm-stt", "d2", clock.tick()),
    ])
    with open_reader(path, containers=("podman/*",)) as reader:
        assert [(e.unit, e.message) for e in read_all(reader)] == [("podman/chat", "p")]
    with open_reader(path, containers=("vllm*", "docker/ch*")) as reader:
        assert [(e.unit, e.message) for e in read_all(reader)] == [("docker/chat", "d"), ("docker/vllm-stt", "d2")]


def test_a_quadlet_containers_lines_stay_its_units_when_the_unit_is_watched(tmp_path):
    """Podman quadlet: conmon runs in the unit's cgroup, so its lines carry _SYSTEMD_UNIT=<unit>.service."""
    clock = Clock(random_boot_id())
    path = write_journal(tmp_path / "x.journal", [
        container_output("systemd-vllm-chat", "from the quadlet", clock.tick(), runtime="podman",
                         systemd_unit="vllm-chat.service"),
    ])
    with open_reader(path) as reader:
        assert [(e.unit, e.container_run) for e in read_all(reader)] == [("vllm-chat.service", "")]
    with open_reader(path, units=("nothing*.service",)) as reader:
        assert [e.unit for e in read_all(reader)] == ["podman/systemd-vllm-chat"]


def test_a_name_no_engine_accepts_is_not_watched(tmp_path):
    clock = Clock(random_boot_id())
    path = write_journal(tmp_path / "x.journal", [container_output("vllm chat\"evil", "x", clock.tick()),
                                                  container_output("vllm-ok", "y", clock.tick())])
    with open_reader(path) as reader:
        assert [e.unit for e in read_all(reader)] == ["docker/vllm-ok"]


def test_a_container_that_appears_while_followed_is_read_from_its_first_line(tmp_path):
    clock = Clock(random_boot_id())
    path = write_journal(tmp_path / "x.journal", [unit_output("vllm-stt.service", "unit line", clock.tick())])
    with open_reader(path) as reader:
        assert [e.message for e in read_all(reader)] == ["unit line"]
        append_journal(path, [container_output("vllm-chat", "first", clock.tick()),
                              container_output("vllm-chat", "second", clock.tick()),
                              unit_output("vllm-stt.service", "unit again", clock.tick())])
        got: list[str] = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            reader.wait(0.2)
            time.sleep(0.05)
            got += [e.message for e in read_all(reader)]
        assert sorted(got) == ["first", "second", "unit again"]
        assert reader.containers == {"vllm-chat"}


def test_containers_beyond_max_units_are_dropped_and_counted(tmp_path):
    clock = Clock(random_boot_id())
    path = write_journal(tmp_path / "x.journal", [
        container_output(f"vllm-{n}", "vLLM API server version 0.24.0", clock.tick()) for n in range(5)])
    follower = LogFollower(JournalSelection(files=[str(path)], container_globs=CONTAINERS, boot="all"), 3,
                           open_reader=open_journal, source="journal")
    follower.start()
    try:
        state = wait_for(lambda: (s := follower.state()).error is None and s)
        assert [view.unit for view in state.views] == ["docker/vllm-0", "docker/vllm-1", "docker/vllm-2"]
        assert state.dropped_units == 2
    finally:
        follower.stop()


# --- the seed's boot race -------------------------------------------------------------------


def test_the_seeds_units_as_docker_containers_fold_as_under_systemd(tmp_path):
    path, _ = race_journal(tmp_path)
    expected = systemd_figures()
    views = {view.unit: view for view in follow(path)}
    assert set(views) == {KEYS[CHAT], KEYS[EMBEDDING], KEYS[STT]}  # other-llm matches no glob
    for unit in (CHAT, EMBEDDING, STT):
        assert figures(views[KEYS[unit]]) == expected[unit], unit
    chat = figures(views[KEYS[CHAT]])
    assert chat["failures"][FailureReason.KV_CACHE_TOO_SMALL] == 1 and chat["starts"] == 1
    assert sum(figures(view)["overlaps"] for view in views.values()) >= 2


def test_runs_are_told_apart_by_vllm_without_dockers_log_epoch(tmp_path):
    """Docker before 23 writes no CONTAINER_LOG_EPOCH: a restart keeps the container's id, and only the
    restarted vLLM's first line says a new run began."""
    path, _ = race_journal(tmp_path, epochs=False)
    expected = systemd_figures()
    views = {view.unit: figures(view) for view in follow(path)}
    for unit in (CHAT, EMBEDDING, STT):
        assert views[KEYS[unit]] == expected[unit], unit


def test_the_seeds_units_as_podman_containers_fold_as_under_systemd(tmp_path):
    path, _ = race_journal(tmp_path, runtime="podman")
    expected = systemd_figures()
    views = {view.unit: figures(view) for view in follow(path)}
    for unit in (CHAT, EMBEDDING, STT):
        assert views[f"podman/{RACE_CONTAINERS[unit]}"] == expected[unit], unit


def test_long_lines_cut_by_the_log_driver_are_joined(tmp_path):
    """The 0.24 chat's failure, its root cause cut in three pieces (CONTAINER_PARTIAL_MESSAGE=true on all
    but the last), as dockerd writes a line longer than 16 KiB."""
    race = boot_race()
    lines = [line for line in container_lines(race.this_boot(), RACE_CONTAINERS) if line.name == "vllm-xpu-chat"]
    cause = next(index for index, line in enumerate(lines) if line.role == "root_cause")
    text = lines[cause].message
    cuts = (len(text) // 3, 2 * len(text) // 3)
    pieces = [text[:cuts[0]], text[cuts[0]:cuts[1]], text[cuts[1]:]]
    specs = []
    for index, printed in enumerate(lines):
        if index != cause:
            specs += journald_specs([printed], race.boot_id)
            continue
        for number, piece in enumerate(pieces):  # a microsecond apart, as dockerd sends them
            at = Moment(printed.realtime_usec + number, printed.monotonic_usec + number, race.boot_id)
            specs.append(container_output(printed.name, piece, at, epoch=epoch(printed.name, printed.run),
                                          partial=number < 2))
    path = write_journal(tmp_path / "pieces.journal", specs)
    (chat,) = follow(path)
    assert chat.failures[FailureReason.KV_CACHE_TOO_SMALL] == 1
    assert chat.last_failure_usec == lines[cause].realtime_usec  # the first piece's time


# --- a Docker container's end: its config.v2.json ------------------------------------------------


def silent_death_journal(tmp_path: Path) -> tuple[Path, DockerHost, Clock]:
    """vllm-chat (journald log driver) begins its init and prints nothing more; vllm-embed's init begins
    a minute later."""
    clock = Clock(random_boot_id())
    path = write_journal(tmp_path / "x.journal", [
        container_output("vllm-chat", VERSION, clock.tick(), epoch="e1"),
        container_output("vllm-chat", "Loading weights took 3.1 seconds", clock.tick(), epoch="e1"),
    ])
    return path, DockerHost(tmp_path / "docker"), clock


@pytest.mark.parametrize("stopped", [False, True])
def test_a_journald_docker_container_that_dies_in_its_init_does_not_stay_initialising(tmp_path, stopped):
    """Its config.v2.json (under --path.docker) says it is not running since FinishedAt: its run ends
    there, `other` (as a unit's main process exit) or, after `docker stop`, stopped; a later container's
    init does not overlap it."""
    path, host, clock = silent_death_journal(tmp_path)
    chat = host.add("vllm-chat", log_driver="journald")
    began = clock.realtime_usec
    chat.set_state(running=False, started_usec=began - 10_000_000, finished_usec=clock.tick(1_000_000).realtime_usec,
                   stopped=stopped, exit_code=137)
    append_journal(path, [container_output("vllm-embed", VERSION, clock.tick(60_000_000), epoch="e1")])
    views = {view.unit: view for view in follow(path, docker_roots=(str(host.root),))}
    assert views["docker/vllm-chat"].initialising_since_usec is None
    assert views["docker/vllm-chat"].failures.get(FailureReason.OTHER, 0) == (0 if stopped else 1)
    assert views["docker/vllm-embed"].initialising_since_usec == clock.realtime_usec
    assert sum(view.overlaps for view in views.values()) == 0


def test_a_journald_docker_containers_end_goes_to_its_latest_run(tmp_path):
    """Restarted by Docker (a new log epoch) and dead again: the end FinishedAt is the second run's; the
    first counted `other` when the second began."""
    path, host, clock = silent_death_journal(tmp_path)
    append_journal(path, [container_output("vllm-chat", VERSION, clock.tick(5_000_000), epoch="e2")])
    chat = host.add("vllm-chat", log_driver="journald")
    chat.set_state(running=False, started_usec=clock.realtime_usec - 1000,
                   finished_usec=clock.tick(1_000_000).realtime_usec)
    (view,) = follow(path, docker_roots=(str(host.root),))
    assert view.initialising_since_usec is None
    assert view.failures[FailureReason.OTHER] == 2
    assert view.last_failure_usec == clock.realtime_usec


def test_without_its_config_a_journald_docker_containers_silent_death_is_not_seen(tmp_path):
    """No --path.docker (or the container's directory not there): it stays initialising, as before."""
    path, host, clock = silent_death_journal(tmp_path)
    append_journal(path, [container_output("vllm-embed", VERSION, clock.tick(60_000_000), epoch="e1")])
    views = {view.unit: view for view in follow(path, docker_roots=(str(host.root),))}
    assert views["docker/vllm-chat"].initialising_since_usec is not None
    assert sum(view.overlaps for view in views.values()) >= 1


def test_a_journald_docker_containers_end_is_seen_while_the_journal_is_quiet(tmp_path):
    """Followed: the end is read at most every DOCKER_END_SECONDS, although no entry comes; read once."""
    path, host, clock = silent_death_journal(tmp_path)
    chat = host.add("vllm-chat", log_driver="journald")
    chat.set_state(running=True, started_usec=clock.realtime_usec - 10_000_000)
    follower = LogFollower(JournalSelection(files=[str(path)], container_globs=CONTAINERS, boot="all",
                                        container_state={"docker_roots": (str(host.root),)}), 64,
                           open_reader=open_journal, source="journal")
    follower.start()
    try:
        state = wait_for(lambda: (s := follower.state()).error is None and s, timeout=20)
        assert state and state.views[0].initialising_since_usec is not None
        chat.set_state(running=False, started_usec=clock.realtime_usec - 10_000_000,
                       finished_usec=clock.tick(1_000_000).realtime_usec)
        (view,) = wait_for(lambda: (v := follower.state().views) and v[0].initialising_since_usec is None and v)
        assert view.failures[FailureReason.OTHER] == 1
        time.sleep(1.5)  # looked at again, unchanged: not handed on twice
        assert follower.state().views[0].failures[FailureReason.OTHER] == 1
    finally:
        follower.stop()


@pytest.mark.parametrize("matched", [True, False])
def test_a_podman_container_that_dies_in_its_init_does_not_stay_initialising(tmp_path, monkeypatch, matched):
    """Podman's "died" event (events logger journald) ends the run it belongs to: `other`, and a later
    container's init does not overlap it; one of another container of the name (recreated), or of a
    container not watched, ends nothing. Selected by sd-journal matches, or by the reader itself (more
    than MATCHED_UNITS_MAX units and containers)."""
    if not matched:
        monkeypatch.setattr(JournalReader, "MATCHED_UNITS_MAX", 0)
    clock = Clock(random_boot_id())
    old = container_id("vllm-chat", "old")
    path = write_journal(tmp_path / "x.journal", [
        podman_died("vllm-chat", clock.tick(), container=old),  # a container of that name before: no line read
        container_output("vllm-chat", VERSION, clock.tick(), runtime="podman", conmon_pid=3001),
        container_output("vllm-chat", "Loading weights took 3.1 seconds", clock.tick(), runtime="podman",
                         conmon_pid=3001),
        podman_died("nginx", clock.tick()),
        podman_died("vllm-chat", clock.tick(), container=old),  # not the run's container
        podman_died("vllm-chat", clock.tick(1_000_000)),
        container_output("vllm-embed", VERSION, clock.tick(60_000_000), runtime="podman", conmon_pid=3002),
    ])
    with open_reader(path) as reader:
        ends = [(e.unit, e.container_run) for e in read_all(reader) if e.from_systemd]
    assert ends == [("podman/vllm-chat", f"{container_id('vllm-chat')}/3001")]
    views = {view.unit: view for view in follow(path)}
    assert views["podman/vllm-chat"].initialising_since_usec is None
    assert views["podman/vllm-chat"].failures[FailureReason.OTHER] == 1
    assert views["podman/vllm-embed"].initialising_since_usec == clock.realtime_usec
    assert sum(view.overlaps for view in views.values()) == 0


# --- the runs of a container (pure) ---------------------------------------------------------


def line(message: str, run: str = "c1/e1", *, partial: bool = False, stream: str = "", at: int = 0,
         unit: str = "docker/vllm") -> LogEntry:
    return LogEntry(unit, at, None, "", message, False, "", None, "", run, partial, stream)


VERSION = "(APIServer pid=7) INFO 05-12 10:11:13 [api_server.py:1895] vLLM API server version 0.24.0"
CONFIG = ("(EngineCore pid=9) INFO 05-12 10:11:19 [core.py:76] Initializing a V1 LLM engine (v0.24.0) with "
          "config: model='m', speculative_config=None")


@pytest.mark.fast
def test_a_run_begins_at_a_new_server_version_or_a_new_container_run():
    runs = ContainerRuns()
    got = [entry.invocation_id for entry in runs.lines([
        line(VERSION), line(CONFIG), line("x"), line(CONFIG),  # a second engine core: the same run
        line(VERSION), line("y"),  # the restarted server
        line("z", run="c1/e2"), line(VERSION, run="c1/e2"),  # a new epoch: its first server version stays in it
        line(VERSION, run="c2"),  # a new container
    ])]
    assert got == ["c1/e1#0", "c1/e1#0", "c1/e1#0", "c1/e1#0", "c1/e1#1", "c1/e1#1", "c1/e2#0", "c1/e2#0", "c2#0"]


@pytest.mark.fast
def test_without_a_server_an_engine_config_begins_a_run():
    runs = ContainerRuns()
    got = [entry.invocation_id for entry in runs.lines([line(CONFIG), line("x"), line(CONFIG), line(VERSION),
                                                        line(CONFIG), line(VERSION)])]
    assert got == ["c1/e1#0", "c1/e1#0", "c1/e1#1", "c1/e1#2", "c1/e1#2", "c1/e1#3"]


@pytest.mark.fast
def test_pieces_are_joined_per_stream_and_capped():
    runs = ContainerRuns(max_line_chars=10)
    out = list(runs.lines([
        line("abc", partial=True, stream="stdout", at=1), line("ERR", stream="stderr", at=2),
        line("defgh", partial=True, stream="stdout", at=3), line("ijklmnop", stream="stdout", at=4),
        line("whole", stream="stdout", at=5),
    ]))
    assert [(e.message, e.realtime_usec, e.partial) for e in out] == [
        ("ERR", 2, False), ("abcdefghij", 1, False), ("whole", 5, False)]


@pytest.mark.fast
def test_pieces_left_when_the_run_changes_are_passed_on_in_their_run():
    runs = ContainerRuns()
    out = list(runs.lines([line("dying mid-li", partial=True), line(VERSION, run="c1/e2")]))
    assert [(e.message, e.invocation_id) for e in out] == [("dying mid-li", "c1/e1#0"), (VERSION, "c1/e2#0")]


@pytest.mark.fast
def test_units_entries_pass_through_unchanged():
    entry = LogEntry("vllm.service", 1, 1, "b" * 32, VERSION, False, "", 42, "i" * 32)
    assert list(ContainerRuns().lines([entry])) == [entry]


# --- over the exporter ----------------------------------------------------------------------


def test_the_exporter_serves_containers_from_the_journal_by_their_keys(tmp_path):
    path, _ = race_journal(tmp_path)
    args = ["--no-collector.levelzero", "--no-collector.processes", "--journal.boot", "all", "--journal.file",
            str(path)]
    with RunningExporter(args) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and
                           sample(s, "xpu_exporter_collector_success", collector="journal") == 1 and s)
        assert sample(samples, "xpu_unit_engine_init_failures_total", unit="docker/vllm-xpu-chat",
                      reason="kv_cache_too_small") == 1
        assert sample(samples, "xpu_unit_engine_starts_total", unit="docker/vllm-xpu-embedding") == 1
        assert sample(samples, "xpu_exporter_journal_units_watched") == 3
    with RunningExporter([*args, "--journal.containers="]) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and
                           sample(s, "xpu_exporter_collector_success", collector="journal") == 1 and s)
        assert sample(samples, "xpu_exporter_journal_units_watched") == 0
