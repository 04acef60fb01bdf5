"""The gate's journal read: only the watched units' latest invocations (JournalReader.read_latest_invocations,
LogFollower(latest_invocations=True)) gives the gate the same decision state as the whole boot, on real
journal files written by systemd-journal-remote; journals without invocation ids fall back to the whole boot."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_xpu_exporter.fold.engine_starts import UnitView
from vllm_xpu_exporter.gate.cli import parse_service_options
from vllm_xpu_exporter.gate.service import Service
from vllm_xpu_exporter.gate.decision import Admission, decide
from vllm_xpu_exporter.sources.journal import open_journal
from vllm_xpu_exporter.sources.journal import JournalSelection
from vllm_xpu_exporter.sources.logs.follower import LogFollower, LogState, prints_a_vllm_line
from vllm_xpu_exporter.sources.journal.invocations import MAX_INVOCATIONS_BACK
from vllm_xpu_exporter.sources.journal.reader import JournalReader
from journalgen import (Clock, JournalEntrySpec, append_journal, new_invocation_id, random_boot_id, unit_failed,
                        unit_output, unit_process_exited, unit_restart_scheduled, unit_started, unit_starting,
                        unit_stopped, write_journal)
from polling import wait_for

CHAT = "vllm-chat.service"  # the gated unit
EMBED = "vllm-embed.service"
STT = "vllm-stt.service"
RERANK = "vllm-rerank.service"
PROXY = "vllm-proxy.service"
EXPORTER = "vllm-xpu-exporter.service"
NEW = "vllm-new.service"
API = "(APIServer pid={pid}) INFO 12-02 10:00:00 [api_server.py:1873] "
CORE = "(EngineCore pid={pid}) INFO 12-02 10:00:20 [gpu_worker.py:456] "
CAUSE = ("ValueError: To serve at least one request with the model's max seq len (131072), (3.36 GiB KV cache is "
         "needed, which is larger than the available KV cache memory (2.13 GiB).")
DEVICE = "0000:03:00.0"


class Writer:
    """A boot's entries, units' starts interleaved by the test's order of calls; each start its own invocation."""

    def __init__(self, boot_id: str, seed: int = 7) -> None:
        # 100 s ago; the_boot's last minute is within the engine grace of now: its possible inits still count
        # when the followers settle with the wall clock.
        self.clock = Clock(boot_id, realtime_usec=time.time_ns() // 1000 - 100_000_000)
        self.rng = random.Random(seed)
        self.entries: list[JournalEntrySpec] = []
        self.pids: dict[str, int] = {}

    def pid(self, unit: str) -> int:
        self.pids[unit] = self.pids.get(unit, 1000 + 100 * len(self.pids)) + 2
        return self.pids[unit]

    def noise(self, count: int = 3) -> None:
        for index in range(count):
            self.entries.append(unit_output("nginx.service", f"GET /{index} 200", self.clock.tick(), pid=77,
                                            comm="nginx", invocation_id=new_invocation_id(self.rng)))

    def starting(self, unit: str) -> str:
        invocation = new_invocation_id(self.rng)
        self.entries.append(unit_starting(unit, self.clock.tick(), invocation_id=invocation))
        return invocation

    def line(self, unit: str, invocation: str, text: str, pid: int | None = None) -> None:
        self.entries.append(unit_output(unit, text, self.clock.tick(), pid=pid or self.pids.get(unit, 4242),
                                        invocation_id=invocation))

    def started(self, unit: str, invocation: str, ratio: float | None = None, version: bool = True,
                first_line_after_usec: int = 1000) -> int:
        pid = self.pid(unit)
        self.entries.append(unit_started(unit, self.clock.tick(), invocation_id=invocation))
        self.noise(1)
        self.clock.tick(first_line_after_usec)
        if version:
            self.line(unit, invocation, API.format(pid=pid) + "vLLM API server version 0.24.0", pid)
        if ratio is not None:
            self.line(unit, invocation, API.format(pid=pid) +
                      f"non-default args: {{'model': 'm', 'gpu_memory_utilization': {ratio}}}", pid)
        return pid

    def completed(self, unit: str, invocation: str, pid: int) -> None:
        self.line(unit, invocation, CORE.format(pid=pid + 1) + "Available KV cache memory: 1.25 GiB", pid)
        self.noise(1)
        self.line(unit, invocation, CORE.format(pid=pid + 1) +
                  "init engine (profile, create kv cache, warmup model) took 20.50 seconds", pid)
        for index in range(5):  # serving
            self.line(unit, invocation, f'(APIServer pid={pid}) INFO:     10.0.0.1:{index} - "POST /v1/x" 200 OK', pid)

    def failed(self, unit: str, invocation: str, pid: int, late_copy: bool = True) -> None:
        self.line(unit, invocation, f"(EngineCore pid={pid + 1}) ERROR 12-02 10:00:30 [core.py:708] {CAUSE}", pid)
        self.entries.append(unit_process_exited(unit, self.clock.tick(), invocation_id=invocation))
        self.entries.append(unit_failed(unit, self.clock.tick(), invocation_id=invocation))
        self.entries.append(unit_restart_scheduled(unit, self.clock.tick(), invocation_id=invocation))
        if late_copy:  # journald stores the dying process's last lines after PID 1's records
            self.line(unit, invocation, f"(EngineCore pid={pid + 1}) {CAUSE}", pid)

    def killed(self, unit: str, invocation: str) -> None:
        self.entries.append(unit_process_exited(unit, self.clock.tick(), code="killed", status=9,
                                                invocation_id=invocation))
        self.entries.append(unit_failed(unit, self.clock.tick(), result="signal", invocation_id=invocation))

    def gate_waiting(self, unit: str, invocation: str) -> None:
        self.line(unit, invocation, "vllm-xpu-gate: waiting for vllm-embed.service (free 1, needed 2)", pid=9)


def the_boot(writer: Writer) -> None:
    """Every case of the issue in one boot, the units' starts interleaved."""
    w = writer
    # embed and stt: a first start long before, which a read of the latest invocations need not reach
    for unit, ratio in ((EMBED, 0.3), (STT, 0.3)):
        invocation = w.starting(unit)
        w.completed(unit, invocation, w.started(unit, invocation, ratio=ratio))
        w.entries.append(unit_stopped(unit, w.clock.tick(), invocation_id=invocation))
    # chat (the gated unit): a start that printed its R, a start killed before printing anything, and the
    # current start, waiting in its gate: R comes from the start two before the current one.
    chat_1 = w.starting(CHAT)
    chat_pid = w.started(CHAT, chat_1, ratio=0.75)
    # embed: a completed start, then a restart (new invocation) mid-init
    embed_1 = w.starting(EMBED)
    embed_pid = w.started(EMBED, embed_1, ratio=0.07)
    w.completed(CHAT, chat_1, chat_pid)
    # stt: a completed start, then one whose init failed (its cause copied after PID 1's records)
    stt_1 = w.starting(STT)
    stt_pid = w.started(STT, stt_1, ratio=0.05)
    w.completed(EMBED, embed_1, embed_pid)
    w.completed(STT, stt_1, stt_pid)
    # rerank: a start, stopped, started again (new invocation) and completed; its second start prints no R
    rerank_1 = w.starting(RERANK)
    rerank_pid = w.started(RERANK, rerank_1, ratio=0.06)
    w.completed(RERANK, rerank_1, rerank_pid)
    w.entries.append(unit_stopped(RERANK, w.clock.tick(), invocation_id=rerank_1))
    rerank_2 = w.starting(RERANK)
    # exporter: not an engine (its start-up line); restarted, its current start has printed nothing yet
    exporter_1 = w.starting(EXPORTER)
    w.started(EXPORTER, exporter_1, version=False)
    w.line(EXPORTER, exporter_1, 'level=info msg="vllm-xpu-exporter 1.4.0 listening on http://[::]:10447/metrics '
                                 '(collectors: journal)"')
    rerank_pid = w.started(RERANK, rerank_2)
    w.noise()
    stt_2 = w.starting(STT)
    stt_pid = w.started(STT, stt_2, ratio=0.05)
    chat_2 = w.starting(CHAT)
    w.started(CHAT, chat_2, version=False)
    w.line(CHAT, chat_2, "Traceback (most recent call last):")  # not vLLM's: chat_2 printed nothing of vLLM
    w.killed(CHAT, chat_2)
    w.completed(RERANK, rerank_2, rerank_pid)
    w.failed(STT, stt_2, stt_pid)
    w.entries.append(unit_stopped(EXPORTER, w.clock.tick(), invocation_id=exporter_1))
    exporter_2 = w.starting(EXPORTER)
    w.started(EXPORTER, exporter_2, version=False)
    # embed's restart prints its first line past the engine grace: an engine all the same, since an earlier
    # start of it printed (so its init began at "Started", not at that line)
    embed_2 = w.starting(EMBED)
    embed_pid = w.started(EMBED, embed_2, ratio=0.07, first_line_after_usec=61_000_000)
    # proxy: its only start, a possible init (no line yet)
    proxy_1 = w.starting(PROXY)
    w.started(PROXY, proxy_1, version=False)
    chat_3 = w.starting(CHAT)
    w.gate_waiting(CHAT, chat_3)
    w.noise()


def write_boot(path: Path, boot_id: str) -> Writer:
    """An earlier boot whose chat printed another R (never read), then the boot under test."""
    earlier = Writer(random_boot_id(random.Random(99)), seed=3)
    chat = earlier.starting(CHAT)
    earlier.completed(CHAT, chat, earlier.started(CHAT, chat, ratio=0.5))
    writer = Writer(boot_id)
    the_boot(writer)
    write_journal(path, [*earlier.entries, *writer.entries])
    return writer


def follow(path: Path, boot_id: str, latest_invocations: bool) -> LogFollower:
    follower = LogFollower(JournalSelection(files=[str(path)], unit_globs=["vllm*.service"], boot=boot_id),
                           open_reader=open_journal, source="journal", latest_invocations=latest_invocations)
    follower.start()
    return follower


def caught_up(follower: LogFollower) -> LogState:
    state = wait_for(lambda: (state := follower.state()).error is None and state, timeout=20)
    assert state, "the follower did not catch up"
    return state


def decision_state(views: list[UnitView]) -> dict[str, tuple]:
    """What a gate decides on, per unit: initialising and since when, its current invocation and whether
    it ended, and the unit's gpu_memory_utilization (its latest start that printed)."""
    return {view.unit: (view.initialising_since_usec, view.current.invocation_id if view.current else None,
                        view.current.outcome if view.current else None,
                        view.invocation_ended(view.current.invocation_id) if view.current else None,
                        view.gpu_memory_utilization) for view in views}


def assert_same_decisions(latest: list[UnitView], whole: list[UnitView]) -> None:
    assert decision_state(latest) == decision_state(whole)
    whole_by_unit = {view.unit: view for view in whole}
    for view in latest:  # every invocation read ended or not as the whole boot says
        assert view.invocations_ended.items() <= whole_by_unit[view.unit].invocations_ended.items()
    for unit in whole_by_unit:
        own = {view.unit: view for view in latest}[unit]
        assert decide(Admission(unit, DEVICE, own.gpu_memory_utilization, False), latest, [], None, None) == \
            decide(Admission(unit, DEVICE, whole_by_unit[unit].gpu_memory_utilization, False), whole, [], None, None)


@pytest.fixture
def boot_id() -> str:
    return random_boot_id(random.Random(5))


@pytest.fixture
def followers(tmp_path: Path, boot_id: str) -> Iterator[tuple[Path, Writer, LogFollower, LogFollower]]:
    path = tmp_path / "system.journal"
    writer = write_boot(path, boot_id)
    latest, whole = follow(path, boot_id, True), follow(path, boot_id, False)
    try:
        yield path, writer, latest, whole
    finally:
        latest.stop()
        whole.stop()


def test_the_latest_invocations_give_the_gate_what_the_whole_boot_gives(followers) -> None:
    _, writer, latest, whole = followers
    latest_state, whole_state = caught_up(latest), caught_up(whole)
    assert latest.caught_up_from == "latest invocations" and whole.caught_up_from == "boot"
    assert latest_state.entries_read < whole_state.entries_read
    assert_same_decisions(latest_state.views, whole_state.views)
    state = decision_state(latest_state.views)
    # the cases the boot was written for, as the gate sees them
    assert state[CHAT][0] is None and state[CHAT][4] == 0.75  # waiting in its gate; R from two starts before
    embed_started = next(spec.realtime_usec for spec in reversed(writer.entries)
                         if spec.field_value("UNIT") == EMBED and "Started" in str(spec.field_value("MESSAGE")))
    assert state[EMBED][0] == embed_started and state[EMBED][3] is False  # a restart, mid-init
    assert state[STT][0] is None and state[STT][2] == "failed" and state[STT][3] is True
    assert state[RERANK][0] is None and state[RERANK][2] == "ok" and state[RERANK][4] == 0.92  # 0.24's default
    assert state[EXPORTER][0] is None  # known not to be an engine from its earlier start
    assert state[PROXY][0] is not None  # a possible init, within the engine grace
    assert decide(Admission(CHAT, DEVICE, 0.75, False), latest_state.views, [], None, None).units == (EMBED, PROXY)


def test_after_the_latest_invocations_it_follows_the_journal_as_the_whole_boot_does(followers, boot_id: str) -> None:
    path, _, latest, whole = followers
    before = caught_up(latest).entries_read
    caught_up(whole)
    writer = Writer(boot_id, seed=11)
    writer.clock.realtime_usec = time.time_ns() // 1000 - 5_000_000
    embed = next(view.current.invocation_id for view in caught_up(whole).views if view.unit == EMBED)
    chat = next(view.current.invocation_id for view in caught_up(whole).views if view.unit == CHAT)
    writer.completed(EMBED, embed, 1302)  # embed's init completes
    chat_pid = writer.started(CHAT, chat, ratio=0.8)  # chat's gate released: its engine initialises
    new = writer.starting(NEW)  # a unit not seen before
    writer.started(NEW, new, ratio=0.1)
    append_journal(path, writer.entries)

    def both_read_it() -> bool:
        states = decision_state(caught_up(latest).views), decision_state(caught_up(whole).views)
        return all(NEW in state and state[EMBED][0] is None and state[CHAT][0] for state in states)

    assert wait_for(both_read_it, timeout=20), "the followers did not read the new entries"
    assert_same_decisions(caught_up(latest).views, caught_up(whole).views)
    state = decision_state(caught_up(latest).views)
    assert state[EMBED][0] is None and state[CHAT][0] is not None and state[CHAT][4] == 0.8
    assert state[NEW][0] is not None and chat_pid


def test_a_journal_without_invocation_ids_is_read_whole(tmp_path: Path, boot_id: str) -> None:
    writer = Writer(boot_id)
    the_boot(writer)
    stripped = [JournalEntrySpec(spec.realtime_usec, spec.monotonic_usec, spec.boot_id,
                                 tuple((name, value) for name, value in spec.fields
                                       if name not in ("INVOCATION_ID", "_SYSTEMD_INVOCATION_ID")))
                for spec in writer.entries]
    path = write_journal(tmp_path / "system.journal", stripped)
    latest, whole = follow(path, boot_id, True), follow(path, boot_id, False)
    try:
        latest_state, whole_state = caught_up(latest), caught_up(whole)
        assert latest.caught_up_from == "boot"
        assert latest_state.entries_read == whole_state.entries_read
        assert_same_decisions(latest_state.views, whole_state.views)
    finally:
        latest.stop()
        whole.stop()


def test_a_unit_that_needs_more_than_the_bound_of_invocations_makes_it_read_the_whole_boot(tmp_path: Path,
                                                                                          boot_id: str) -> None:
    writer = Writer(boot_id)
    chat = writer.starting(CHAT)
    writer.completed(CHAT, chat, writer.started(CHAT, chat, ratio=0.75))
    for _ in range(MAX_INVOCATIONS_BACK):  # a crash loop: nothing of vLLM printed
        chat = writer.starting(CHAT)
        writer.started(CHAT, chat, version=False)
        writer.killed(CHAT, chat)
    path = write_journal(tmp_path / "system.journal", writer.entries)
    chats = sum(spec.field_value("_SYSTEMD_UNIT") != "nginx.service" for spec in writer.entries)
    with JournalReader(JournalSelection(files=[str(path)], boot=boot_id)) as reader:
        assert reader.read_latest_invocations(lambda entries: prints_a_vllm_line(60_000_000, entries)) is None
        whole = []
        while batch := reader.read_available():  # the reader reads the whole boot instead
            whole += batch
        assert len(whole) == chats
    latest, full = follow(path, boot_id, True), follow(path, boot_id, False)
    try:
        assert decision_state(caught_up(latest).views) == decision_state(caught_up(full).views)
        assert decision_state(caught_up(latest).views)[CHAT][4] == 0.75
        assert latest.caught_up_from == "boot"
    finally:
        latest.stop()
        full.stop()
    with JournalReader(JournalSelection(files=[str(path)], boot=boot_id)) as reader:  # within the bound: read
        entries = reader.read_latest_invocations(lambda entries: prints_a_vllm_line(60_000_000, entries),
                                                 max_invocations=MAX_INVOCATIONS_BACK + 1)
        assert entries is not None and len(entries) == chats


def test_the_gate_service_follows_the_latest_invocations(followers, boot_id: str) -> None:
    path, _, _, whole = followers
    service = Service(parse_service_options(["--journal.file", str(path), "--journal.boot", boot_id]))
    service.journal.start()
    try:
        assert wait_for(lambda: service.journal.state().error is None, timeout=30)
        assert service.journal.caught_up_from == "latest invocations"
        assert_same_decisions(service.journal.state().views, caught_up(whole).views)
    finally:
        service.journal.stop()
        service.levelzero.close()


def read_both_with_embed_initialising(path: Path, w: Writer, boot_id: str) -> tuple[LogState, LogState]:
    """Embed's start begins last; the journal written, its latest invocations' read (which must be what the
    follower did) and the whole boot's, checked to give the same decisions."""
    embed = w.starting(EMBED)
    w.started(EMBED, embed, ratio=0.07)
    write_journal(path, w.entries)
    latest, whole = follow(path, boot_id, True), follow(path, boot_id, False)
    try:
        latest_state, whole_state = caught_up(latest), caught_up(whole)
    finally:
        latest.stop()
        whole.stop()
    assert latest.caught_up_from == "latest invocations"
    assert_same_decisions(latest_state.views, whole_state.views)
    return latest_state, whole_state


def test_a_unit_serving_long_in_one_invocation_costs_the_first_decision_its_init_not_its_uptime(
        tmp_path: Path, boot_id: str) -> None:
    """Chat has served 6,000 request lines in its one invocation, then failed; embed initialises: the latest
    invocations' read gives the whole boot's decision state, reading PID 1's records, chat's output up to its
    init's end and its last lines (the failure's cause), not the lines between (entries counted, not timed)."""
    path, w = tmp_path / "system.journal", Writer(boot_id)
    chat = w.starting(CHAT)
    chat_pid = w.started(CHAT, chat, ratio=0.75)
    w.completed(CHAT, chat, chat_pid)
    for index in range(6000):
        w.line(CHAT, chat, f'(APIServer pid={chat_pid}) INFO:     10.0.0.1:{index} - "POST /v1/x" 200 OK', chat_pid)
    w.failed(CHAT, chat, chat_pid)
    latest_state, whole_state = read_both_with_embed_initialising(path, w, boot_id)
    state = decision_state(latest_state.views)
    assert state[CHAT][3] is True and state[CHAT][4] == 0.75 and state[EMBED][0] is not None
    assert whole_state.entries_read > 6000
    assert latest_state.entries_read < 600, latest_state.entries_read


def test_forged_unit_names_neither_make_it_read_the_whole_boot_nor_count_as_units(tmp_path: Path,
                                                                                 boot_id: str) -> None:
    """A process of another unit writes 1,000 entries naming 1,000 watched-looking units in UNIT= (any process
    may write that field; only PID 1's records carry it for real), beside chat's 1,000 request lines: the read
    still takes the latest invocations of the real units only (not the whole boot: entries counted), with the
    whole boot's decision state."""
    path, w = tmp_path / "system.journal", Writer(boot_id)
    chat = w.starting(CHAT)
    w.completed(CHAT, chat, w.started(CHAT, chat, ratio=0.75))
    for index in range(1000):
        w.entries.append(unit_output("evil.service", f"forged {index}", w.clock.tick(), pid=666,
                                     extra=[("UNIT", f"vllm-forged-{index}.service")]))
        w.line(CHAT, chat, f'(APIServer pid=1002) INFO:     10.0.0.1:{index} - "POST /v1/x" 200 OK', 1002)
    latest_state, whole_state = read_both_with_embed_initialising(path, w, boot_id)
    assert {view.unit for view in latest_state.views} == {CHAT, EMBED}
    assert latest_state.entries_read < whole_state.entries_read
