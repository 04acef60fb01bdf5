"""The gate service against the host's own users and units, on a real systemd 252 (tests/realsystemd.py)
with the packaged gate units (packaging/vllm-xpu-gate.service and .socket) and the seed host's three
gated units (chat R 0.75, max_model_len 131072, max_num_seqs 3; embedding 0.07; stt 0.07; one 16 GiB
fake GPU: tests/bootrace.py, tests/gateattacks.py):

* the flood: uid 65534, outside every unit, 256 connections sending a byte every 3 s;
* the squatter: a serving watched unit whose own process asks for a turn every second;
* both at once, over a few boots; benchmarks/attacked_boot.py runs 20;
* the service killed between a unit's release and its engine's start;
* a `--journal.units vllm*` glob, which matches the service's own socket unit and a scope a user names so;
* the 0.2 drop-in left in place (root in the unit): counted by the exporter, refused after the grace.

Each boot counts overlapping and failed inits from the journal and compares the gate's release times with
the inits' ends there (data, not wall clock).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import journalfacts
from bootrace import GATE_SERVICE, GATE_SOCKET, IDLE_RESERVED, gate_command, gated, packaged_drop_in, packaged_gate
from fakeze import SharedDevice
from gateattacks import attacked_boot
from polling import wait_for
from realsystemd import RealSystemd, journal_field, path_inside
from test_gate_real_systemd import decisions, gate_lines
from scrapes import sample
from test_real_systemd import require_root, run_exporter
from vllmunit import CHAT, EMBEDDING, SIXTEEN_GIB_GPU, read_events, serving_units, unit_file

ATTACKED_BOOTS = 2
RELEASED_WITHIN_USEC = 2_000_000  # of the previous init's end
STEP_TIMEOUT = 30.0


@pytest.fixture
def shared(tmp_path: Path, fake_driver: Path) -> Path:
    require_root()
    shutil.copy(fake_driver, tmp_path / fake_driver.name)
    return tmp_path


def assert_one_after_another(boot) -> None:
    outcome = boot.outcome
    assert outcome.settled, f"not every unit served: {outcome.counts}"
    assert outcome.failures == 0 and outcome.overlaps == 0, outcome.counts
    assert boot.ungated == 0 and boot.timed_out == 0, (boot.ungated, boot.timed_out)
    assert len(boot.releases) == 3 and len(boot.release_lags_usec) == 2, boot.releases
    assert all(0 <= lag <= RELEASED_WITHIN_USEC for lag in boot.release_lags_usec), boot.release_lags_usec


@pytest.mark.parametrize(("flood", "squatter"), [(True, False), (False, True)], ids=["flood", "squatter"])
def test_under_one_attack_the_three_units_are_released_one_after_another(shared: Path, fake_driver: Path,
                                                                       flood: bool, squatter: bool):
    """The flood held every connection slot (the clients started ungated after 30 s, together); the
    squatter renewed its lease for ever (the others timed out, then started together). Now: every unit
    released by the service's decision, one after another, each within 2 s of the previous init's end; no
    init overlaps or fails."""
    assert_one_after_another(attacked_boot(shared, shared / fake_driver.name, flood=flood, squatter=squatter,
                                           service_flags=["--lease-timeout=8s"]))


def test_under_the_flood_and_the_squatter_at_once_the_three_units_boot_one_after_another(shared: Path,
                                                                                      fake_driver: Path):
    for _ in range(ATTACKED_BOOTS):
        assert_one_after_another(attacked_boot(shared, shared / fake_driver.name, flood=True, squatter=True,
                                               service_flags=["--lease-timeout=8s"]))


def test_the_service_killed_between_a_release_and_the_engines_start_keeps_the_lease(shared: Path, fake_driver: Path):
    """Chat's gate releases, then a second ExecStartPre= holds chat's engine back 3 s; meanwhile the service
    is SIGKILLed and embedding starts (its client's connection starts the service again). The new service
    process has chat's lease from its runtime directory: embedding waits for chat's init, released after
    its end; no overlap."""
    chat, embedding = "vllm-xpu-chat.service", "vllm-xpu-embedding.service"
    config, events = shared / "ze.conf", shared / "events.jsonl"
    SharedDevice.create(config, SIXTEEN_GIB_GPU, reserved=IDLE_RESERVED)
    common = dict(device_config=path_inside(shared, config), events=path_inside(shared, events), requests=0)
    files = {f"/etc/systemd/system/{chat}": unit_file(CHAT, exec_start_pre=[*gated(CHAT), "/bin/sleep 3"], **common),
             f"/etc/systemd/system/{embedding}": unit_file(EMBEDDING, exec_start_pre=gated(EMBEDDING), **common),
             **packaged_drop_in(), **packaged_gate(shared, shared / fake_driver.name)}
    with RealSystemd(shared, files=files, enable=[GATE_SOCKET]) as machine:
        machine.start(chat)
        assert wait_for(lambda: any(line.startswith("vllm-xpu-gate: released after ")
                                    for line in gate_lines(machine, chat)), timeout=STEP_TIMEOUT, interval=0.1)
        machine.systemctl("kill", "--signal=KILL", GATE_SERVICE)
        machine.start(embedding)
        assert wait_for(lambda: serving_units(events) == {chat, embedding}, timeout=60, interval=0.2), \
            read_events(events)
        machine.sync_journal()
        entries = machine.journal(chat, embedding, GATE_SERVICE)
    (chat_start,) = [start for start in journalfacts.starts(entries) if start.unit == chat]
    counts = journalfacts.counts(entries, [chat, embedding])
    found = decisions(entries, embedding)
    service = [journal_field(entry, "MESSAGE") for entry in entries
               if journal_field(entry, "_SYSTEMD_UNIT") == GATE_SERVICE]
    assert len(found) == 1, (found, counts, service)
    (released,) = found
    assert released.released and chat in released.waited, released
    assert released.at_usec >= chat_start.init_ended_usec, "embedding was released before chat's init ended"
    assert all(not unit.failures and unit.overlaps == 0 for unit in counts.values()), counts


def test_a_vllm_star_glob_waits_neither_for_the_services_socket_unit_nor_for_a_scope_of_that_name(
        shared: Path, fake_driver: Path):
    """The service given `--journal.units vllm*`: its own socket unit (vllm-xpu-gate.socket) and a scope a
    process starts as vllm-squat.scope match the glob. The scope's process asks for a turn every second;
    then chat and embedding start together. Neither waits for the socket unit or the scope, and the
    scope's process is told it is no watched unit; chat and embedding go one after the other."""
    chat, embedding = "vllm-xpu-chat.service", "vllm-xpu-embedding.service"
    config, events = shared / "ze.conf", shared / "events.jsonl"
    SharedDevice.create(config, SIXTEEN_GIB_GPU, reserved=IDLE_RESERVED)
    common = dict(device_config=path_inside(shared, config), events=path_inside(shared, events), requests=0)
    files = {f"/etc/systemd/system/{unit}": unit_file(engine, exec_start_pre=gated(engine), **common)
             for unit, engine in ((chat, CHAT), (embedding, EMBEDDING))}
    files.update({**packaged_drop_in(), **packaged_gate(shared, shared / fake_driver.name,
                                                        ["--journal.units=vllm*", "--lease-timeout=8s"])})
    ask = gate_command(timeout="25s", extra=["--gpu-memory-utilization", "0.01"])
    with RealSystemd(shared, files=files, enable=[GATE_SOCKET]) as machine:
        # a scope is made for the process that asks for it, from inside the machine's units
        machine.run("systemd-run", "--unit=squat-launcher", "systemd-run", "--scope", "--unit=vllm-squat",
                    "/bin/sh", "-c", f"while :; do {ask}; sleep 1; done")
        assert wait_for(lambda: gate_lines(machine, "vllm-squat.scope"), timeout=STEP_TIMEOUT, interval=0.2)
        machine.start(chat, embedding)
        assert wait_for(lambda: serving_units(events) == {chat, embedding}, timeout=60, interval=0.2), \
            read_events(events)
        machine.sync_journal()
        entries = machine.journal(chat, embedding)
        scope_lines = gate_lines(machine, "vllm-squat.scope")
    for unit in (chat, embedding):
        (found,) = decisions(entries, unit)
        assert found.released and not {"vllm-xpu-gate.socket", "vllm-squat.scope"} & set(found.waited), found
    assert any("vllm-squat.scope is not a watched unit" in line for line in scope_lines), scope_lines
    counts = journalfacts.counts(entries, [chat, embedding])
    assert all(not unit.failures and unit.overlaps == 0 for unit in counts.values()), counts


def test_a_02_drop_in_left_in_place_is_counted_and_refused_after_the_grace(shared: Path, fake_driver: Path):
    """Chat and embedding keep the 0.2 drop-in's line (`ExecStartPre=+<bin>/vllm-xpu-gate --unit %n ...`,
    root in the unit). Under a service with the default --legacy-grace, chat's start runs it as `wait`,
    with the warning line; then, the service restarted with --legacy-grace=0s, embedding's start is
    refused: its client exits 1 with an error line, and systemd fails the start. The exporter on that
    journal counts one such start of each."""
    chat, embedding = "vllm-xpu-chat.service", "vllm-xpu-embedding.service"
    config, events = shared / "ze.conf", shared / "events.jsonl"
    SharedDevice.create(config, SIXTEEN_GIB_GPU, reserved=IDLE_RESERVED)
    common = dict(device_config=path_inside(shared, config), events=path_inside(shared, events), requests=0,
                  restart="no")
    legacy = gate_command().split(" wait ")[0]  # the console script, as the 0.2 drop-in ran it

    def legacy_line(engine) -> str:
        return f"+{legacy} --unit %n --gpu-memory-utilization {engine.gpu_memory_utilization}"

    files = {f"/etc/systemd/system/{unit}": unit_file(engine, exec_start_pre=[legacy_line(engine)], **common)
             for unit, engine in ((chat, CHAT), (embedding, EMBEDDING))}
    files.update({**packaged_drop_in(), **packaged_gate(shared, shared / fake_driver.name)})
    with RealSystemd(shared, files=files, enable=[GATE_SOCKET]) as machine:
        machine.start(chat)
        assert wait_for(lambda: chat in serving_units(events), timeout=60, interval=0.2), read_events(events)
        arguments = machine.host_path("/etc/default/vllm-xpu-gate")
        arguments.write_text(arguments.read_text().replace("VLLM_XPU_GATE_ARGS=", "VLLM_XPU_GATE_ARGS=--legacy-grace=0s "))
        machine.systemctl("restart", GATE_SERVICE)
        machine.start(embedding)
        assert wait_for(lambda: machine.systemctl("is-failed", embedding, check=False).stdout.strip() == "failed",
                        timeout=STEP_TIMEOUT, interval=0.2), gate_lines(machine, embedding)
        chat_lines, embedding_lines = gate_lines(machine, chat), gate_lines(machine, embedding)
        machine.sync_journal()
        with run_exporter(machine, fake_driver, config, "vllm-xpu-*.service") as exporter:
            counted = wait_for(lambda: {unit: sample(exporter.scrape(), "xpu_unit_gate_legacy_starts_total", unit=unit)
                                        for unit in (chat, embedding)} == {chat: 1, embedding: 1}, timeout=20,
                               interval=0.25)
            samples = exporter.scrape()
    assert any(line.startswith("vllm-xpu-gate: warning: the 0.2 drop-in's form") for line in chat_lines), chat_lines
    assert any(line.startswith("vllm-xpu-gate: released after ") for line in chat_lines), chat_lines
    assert any("the 0.2 drop-in is refused" in line for line in embedding_lines), embedding_lines
    assert embedding not in {record["unit"] for record in read_events(events)}, "embedding's engine started"
    assert counted, {unit: sample(samples, "xpu_unit_gate_legacy_starts_total", unit=unit) for unit in (chat, embedding)}
