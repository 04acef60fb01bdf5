"""Container records of the journal are believed only from their engines, by the fields journald adds
(`vllm_xpu_exporter.sources.journal.trust`): forged lines, inits, failures and Podman deaths written by
anyone else (a sender chooses CONTAINER_NAME, PODMAN_EVENT and its own `_COMM`) are ignored and counted
by reason; root's and a rootless user's Podman containers of one name are two identities. Real journal
files (systemd-journal-remote, which keeps the trusted fields as given); tests/real_systemd/test_journal_trust_real_systemd.py
shows the same senders on a real journald."""

from __future__ import annotations

from pathlib import Path

import pytest

from journalgen import (Clock, JournalEntrySpec, append_journal, container_id, container_output, podman_died,
                        random_boot_id, unit_output, write_journal)
from polling import wait_for
from vllm_xpu_exporter.fold.engine_starts import UnitView
from vllm_xpu_exporter.parsers.vllm import FailureReason
from vllm_xpu_exporter.sources.journal import JournalReader, open_journal
from vllm_xpu_exporter.sources.journal import JournalSelection
from vllm_xpu_exporter.runtimes import docker, podman
from vllm_xpu_exporter.sources.journal import trust
from vllm_xpu_exporter.sources.logs.follower import LogFollower, LogState

VERSION = "(APIServer pid=7) INFO 05-12 10:11:13 [api_server.py:1895] vLLM API server version 0.24.0"
KV_TOO_SMALL = ("(EngineCore pid=9) ValueError: To serve at least one request with the model's max seq len "
                "(131072), 3.36 GiB KV cache is needed, which is larger than the available KV cache memory "
                "(2.13 GiB). Based on the available memory, the estimated maximum model length is 83040. Try "
                "increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
NOBODY = {"_UID": 65534, "_GID": 65534, "_COMM": "logger", "_EXE": "/usr/bin/logger",
          "_SYSTEMD_UNIT": "session-3.scope", "_SYSTEMD_CGROUP": "/user.slice/user-65534.slice/session-3.scope"}


def sent_by(spec: JournalEntrySpec, **fields) -> JournalEntrySpec:
    """The entry with the trusted fields journald would have added for another sender."""
    replaced = [(name, fields.pop(name)) if name in fields else (name, value) for name, value in spec.fields]
    return JournalEntrySpec(spec.realtime_usec, spec.monotonic_usec, spec.boot_id,
                            tuple(replaced + list(fields.items())))


def follow(path: Path, *, containers=("*vllm*",)) -> LogState:
    follower = LogFollower(JournalSelection(files=[str(path)], container_globs=containers, boot="all"),
                           open_reader=open_journal, source="journal")
    follower.start()
    try:
        state = wait_for(lambda: (s := follower.state()).error is None and s, timeout=20)
        assert state, follower.state().error
        return state
    finally:
        follower.stop()


def views_of(state: LogState) -> dict[str, UnitView]:
    return {view.unit: view for view in state.views}


FORGERS = {
    "nobody with logger --journald": NOBODY,
    "renamed conmon (prctl), another executable": {**NOBODY, "_COMM": "conmon", "_EXE": "/usr/bin/python3.11"},
    "a copy of conmon in /tmp": {**NOBODY, "_COMM": "conmon", "_EXE": "/tmp/conmon"},
    "renamed dockerd": {**NOBODY, "_COMM": "dockerd", "_EXE": "/usr/bin/python3.11"},
    "the real dockerd run by a user": {**NOBODY, "_COMM": "dockerd", "_EXE": "/usr/bin/dockerd",
                                       "_SYSTEMD_UNIT": "docker.service"},
    "dockerd as root outside docker.service": {"_UID": 0, "_COMM": "dockerd", "_EXE": "/usr/bin/dockerd",
                                               "_SYSTEMD_UNIT": "other.service"},
    "a root service renamed dockerd in docker.service": {"_UID": 0, "_COMM": "dockerd", "_EXE": "/usr/bin/sh",
                                                          "_SYSTEMD_UNIT": "docker.service"},
}


@pytest.mark.parametrize("sender", FORGERS)
def test_a_forged_container_failure_is_ignored_and_counted(tmp_path, sender):
    """XpuUnitEngineInitFailed for a container that does not exist: a failed init written under a watched
    container's name by anyone but its engine counts nothing, and is counted as rejected."""
    clock = Clock(random_boot_id())
    path = write_journal(tmp_path / "x.journal", [
        sent_by(container_output("vllm-chat", VERSION, clock.tick()), **FORGERS[sender]),
        sent_by(container_output("vllm-chat", KV_TOO_SMALL, clock.tick()), **FORGERS[sender]),
    ])
    state = follow(path)
    assert views_of(state) == {}
    assert state.rejected == {trust.REJECTED_CONTAINER_SENDER: 2}


def test_a_forged_init_that_never_ends_overlaps_no_real_start(tmp_path):
    """A forged container init that never ends would make every later start of a real unit overlap it."""
    clock = Clock(random_boot_id())
    path = write_journal(tmp_path / "x.journal", [
        sent_by(container_output("vllm-chat", VERSION, clock.tick()), **NOBODY),
        unit_output("vllm-xpu-chat.service", VERSION, clock.tick(1_000_000)),
    ])
    state = follow(path)
    assert list(views_of(state)) == ["vllm-xpu-chat.service"]
    assert views_of(state)["vllm-xpu-chat.service"].overlaps == 0


@pytest.mark.parametrize("sender", ["renamed conmon", "nobody's real podman", "renamed podman"])
def test_a_forged_podman_death_ends_no_real_container(tmp_path, sender):
    """A process renamed conmon (or the real podman run by another user) writing a `died` event of root's
    real Podman container (its id is readable in /proc/PID/cgroup) neither fails nor ends its init."""
    forger = {"renamed conmon": {**NOBODY, "_COMM": "conmon", "_EXE": "/usr/bin/python3.11"},
              "nobody's real podman": {**NOBODY, "_COMM": "podman", "_EXE": "/usr/bin/podman"},
              "renamed podman": {**NOBODY, "_COMM": "podman", "_EXE": "/usr/bin/python3.11"}}[sender]
    clock = Clock(random_boot_id())
    path = write_journal(tmp_path / "x.journal", [
        container_output("vllm-chat", VERSION, clock.tick(), runtime="podman", conmon_pid=3001),
        sent_by(podman_died("vllm-chat", clock.tick()), **forger),
    ])
    state = follow(path)
    view = views_of(state)["podman/vllm-chat"]
    assert view.failures[FailureReason.OTHER] == 0
    assert view.initialising_since_usec is not None
    if sender == "nobody's real podman":  # believed for nobody's own container of that name: none of its lines read
        assert state.rejected == {}
    else:
        assert state.rejected == {podman.REJECTED_PODMAN_EVENT: 1}


def test_the_engines_own_records_are_believed(tmp_path):
    """dockerd in docker.service, root's conmon and podman: lines, and Podman's death, as before."""
    clock = Clock(random_boot_id())
    path = write_journal(tmp_path / "x.journal", [
        container_output("vllm-chat", VERSION, clock.tick()),
        container_output("vllm-chat", KV_TOO_SMALL, clock.tick()),
        container_output("vllm-embed", VERSION, clock.tick(), runtime="podman", conmon_pid=3001),
        podman_died("vllm-embed", clock.tick(1_000_000)),
    ])
    state = follow(path)
    views = views_of(state)
    assert views["docker/vllm-chat"].failures[FailureReason.KV_CACHE_TOO_SMALL] == 1
    assert views["podman/vllm-embed"].failures[FailureReason.OTHER] == 1
    assert state.rejected == {}


def test_root_and_rootless_podman_containers_of_one_name_are_two_identities(tmp_path):
    """Root's and uid 1000's `vllm-chat`: podman/vllm-chat and podman/vllm-chat@uid1000, each with its own
    starts; the user's died event ends only the user's container."""
    clock = Clock(random_boot_id())
    users = container_id("vllm-chat", "uid1000")
    rootless = {"_UID": 1000, "_GID": 1000, "_SYSTEMD_UNIT": "user@1000.service",
                "_SYSTEMD_USER_UNIT": f"libpod-conmon-{users}.scope"}
    path = write_journal(tmp_path / "x.journal", [
        container_output("vllm-chat", VERSION, clock.tick(), runtime="podman", conmon_pid=3001),
        sent_by(container_output("vllm-chat", VERSION, clock.tick(), runtime="podman", conmon_pid=4001,
                                 container=users), **rootless),
        sent_by(podman_died("vllm-chat", clock.tick(1_000_000), container=users), **rootless),
    ])
    state = follow(path)
    views = views_of(state)
    assert sorted(views) == ["podman/vllm-chat", "podman/vllm-chat@uid1000"]
    assert views["podman/vllm-chat@uid1000"].failures[FailureReason.OTHER] == 1
    assert views["podman/vllm-chat"].failures[FailureReason.OTHER] == 0
    assert views["podman/vllm-chat"].initialising_since_usec is not None
    assert state.rejected == {}


@pytest.mark.fast
@pytest.mark.parametrize(("exe", "trusted"), [
    (b"/usr/bin/conmon", True), (b"/usr/libexec/podman/conmon", True), (b"/usr/local/bin/conmon", True),
    (b"/tmp/conmon", False), (b"/usr/bin/../../tmp/conmon", False), (b"/home/u/bin/conmon", False),
    (b"conmon", False), (b"/usr/bin/conmon (deleted)", False), (None, False), (b"/usr/bin/conmon2", False),
    (b"/usr/lib/podman/conmon", True), (b"/usr/libexec/docker/conmon", False),  # each engine's own libexec
])
def test_only_a_conmon_in_a_system_directory_is_conmon(exe, trusted):
    assert (podman.conmon_uid(b"0", b"conmon", exe) == 0) is trusted
    assert podman.conmon_uid(b"0", b"python3", exe) is None


@pytest.mark.fast
def test_dockerd_is_root_in_docker_service_running_dockerd():
    assert docker.is_dockerd(b"0", b"dockerd", b"/usr/bin/dockerd", b"docker.service")
    assert not docker.is_dockerd(b"1000", b"dockerd", b"/usr/bin/dockerd", b"docker.service")
    assert not docker.is_dockerd(b"0", b"dockerd", b"/usr/bin/dockerd", b"user@1000.service")
    assert not docker.is_dockerd(b"0", b"dockerd", b"/usr/bin/dockerd", None)
    assert not docker.is_dockerd(None, b"dockerd", b"/usr/bin/dockerd", b"docker.service")
    assert not docker.is_dockerd(b"0", b"containerd", b"/usr/bin/dockerd", b"docker.service")
    assert docker.is_dockerd(b"0", b"dockerd", b"/usr/libexec/docker/dockerd", b"docker.service")
    assert not docker.is_dockerd(b"0", b"dockerd", b"/usr/libexec/podman/dockerd", b"docker.service")


# --- places: units first, idle names forgotten -------------------------------------------------------

ROOTLESS = {"_UID": 1000, "_GID": 1000, "_SYSTEMD_UNIT": "user@1000.service"}
HOUR_USEC = 3600 * 1_000_000


def test_seventy_names_then_a_real_unit_its_series_present(tmp_path):
    """70 forged container names (nobody), then 70 that a rootless user's own conmon really writes (believed,
    as that user's): neither takes a systemd unit's place; the real unit started later has its series."""
    clock = Clock(random_boot_id())
    path = write_journal(tmp_path / "x.journal", [
        *(sent_by(container_output(f"vllm-f{n}", VERSION, clock.tick()), **NOBODY) for n in range(70)),
        *(sent_by(container_output(f"vllm-u{n}", VERSION, clock.tick(), runtime="podman"), **ROOTLESS)
          for n in range(70)),
        unit_output("vllm-xpu-chat.service", VERSION, clock.tick()),
        unit_output("vllm-xpu-chat.service", KV_TOO_SMALL, clock.tick()),
    ])
    state = follow(path)
    views = views_of(state)
    assert views["vllm-xpu-chat.service"].failures[FailureReason.KV_CACHE_TOO_SMALL] == 1
    assert sum("@uid1000" in unit for unit in views) == 64
    assert state.dropped_units == 6
    assert state.rejected == {trust.REJECTED_CONTAINER_SENDER: 70}


def test_names_not_seen_for_an_hour_give_their_place_to_a_new_container(tmp_path):
    """A flood of 64 names once (root's Podman containers: a user's have places of their own) does not hold
    the places for ever: an hour later another real container gets the place of the idlest of them (the
    flood's series go: counted as forgotten)."""
    clock = Clock(random_boot_id())
    path = write_journal(tmp_path / "x.journal", [
        *(container_output(f"vllm-u{n}", VERSION, clock.tick(), runtime="podman") for n in range(64)),
        container_output("vllm-chat", VERSION, clock.tick(HOUR_USEC - 64 * 1000 - 1)),  # u0 seen within the hour
        # u0 idle for an hour now; the reader asks again for a name refused that long ago
        container_output("vllm-chat", VERSION, clock.tick(JournalReader.ADMIT_AGAIN_USEC)),
        container_output("vllm-chat", KV_TOO_SMALL, clock.tick()),
    ])
    state = follow(path)
    views = views_of(state)
    assert views["docker/vllm-chat"].failures[FailureReason.KV_CACHE_TOO_SMALL] == 1
    assert "podman/vllm-u0" not in views and len(views) == 64
    # chat's first line found no place; u0's own line, folded after u0 gave its place up, finds none either
    assert state.dropped_units == 2


def test_a_rootless_users_containers_neither_overlap_nor_displace_the_systems(tmp_path):
    """uid 1000's own conmon (believed, as that user's) prints 64 inits that never end: root's Docker container
    started after them still gets a place, and neither it nor a system unit counts an overlap with them."""
    clock = Clock(random_boot_id())
    path = write_journal(tmp_path / "x.journal", [
        *(sent_by(container_output(f"vllm-u{n}", VERSION, clock.tick(), runtime="podman"), **ROOTLESS)
          for n in range(64)),
        container_output("vllm-chat", VERSION, clock.tick()),
        container_output("vllm-chat", KV_TOO_SMALL, clock.tick()),
        unit_output("vllm-xpu-stt.service", VERSION, clock.tick()),
    ])
    views = views_of(follow(path))
    assert views["docker/vllm-chat"].failures[FailureReason.KV_CACHE_TOO_SMALL] == 1
    assert views["docker/vllm-chat"].overlaps == 0 and views["vllm-xpu-stt.service"].overlaps == 0
    assert sum("@uid1000" in unit for unit in views) == 64


def test_a_flood_of_container_names_is_not_listed_and_no_real_containers_line_is_missed(tmp_path, monkeypatch):
    """More container names than CONTAINER_NAMES_MAX in the journal (anyone can write one): the reader stops
    listing them (no memory, no sd-journal match per name) and picks containers' entries from the boot's
    itself, so a real container met before, and one met while following, are read whole."""
    monkeypatch.setattr(JournalReader, "CONTAINER_NAMES_MAX", 8)
    clock = Clock(random_boot_id())
    path = write_journal(tmp_path / "x.journal", [
        *(sent_by(container_output(f"vllm-f{n}", VERSION, clock.tick()), **NOBODY) for n in range(20)),
        container_output("vllm-chat", VERSION, clock.tick()),
    ])
    reader = JournalReader(JournalSelection(files=[str(path)], container_globs=("*vllm*",), boot="all"))
    with reader:
        entries = []
        while batch := reader.read_available(1000):
            entries += batch
        assert [(e.unit, e.message) for e in entries] == [("docker/vllm-chat", VERSION)]
        append_journal(path, [
            *(sent_by(container_output(f"vllm-g{n}", VERSION, clock.tick()), **NOBODY) for n in range(20)),
            container_output("vllm-late", VERSION, clock.tick()),
            container_output("vllm-chat", KV_TOO_SMALL, clock.tick()),
        ])
        later = wait_for(lambda: reader.wait(0.1) and reader.read_available(1000), timeout=10)
        assert [(e.unit, e.message) for e in later] == [("docker/vllm-late", VERSION),
                                                        ("docker/vllm-chat", KV_TOO_SMALL)]
        assert len(reader.containers) <= 3  # the cache of the globs' answers: the real names met
        assert reader.rejected_entries == {trust.REJECTED_CONTAINER_SENDER: 40}
