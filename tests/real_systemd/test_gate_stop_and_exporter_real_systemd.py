"""The init gate (`vllm-xpu-gate`) on a real systemd 252 (tests/realsystemd.py), with the packaged gate
service and socket:
* `systemctl stop` of a unit whose client waits ends the unit inactive (Result=success), not failed, and
  its engine never starts;
* the packaged exporter unit (packaging/vllm-xpu-exporter.service, enabled beside the three gated race
  units of tests/bootrace.py, watching the default `vllm*.service`, which matches its own name) holds no
  gate back: no gate times out, none fails, no inits overlap, and the exporter counts no series of its
  own unit.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

import pytest

from bootrace import (EXPORTER_UNIT, GATE_SERVICE, GATE_SOCKET, IDLE_RESERVED, RACE_UNITS, REPO, gate_command, gated,
                      packaged_drop_in, packaged_exporter, packaged_gate, race_boot, showing_hidden_trees)
from fakeze import SharedDevice
from polling import wait_for
from realsystemd import RealSystemd, journal_field, path_inside
from scrapes import series
from test_gate_real_systemd import decisions, gate_lines, start_chat_then_embedding_waiting_for_it
from test_real_systemd import require_root
from vllmunit import CHAT, EMBEDDING, SIXTEEN_GIB_GPU, read_events, unit_file

STEP_TIMEOUT = 30.0
GATE_TIMEOUT = 60.0  # gate_command's --timeout
SERVED_WITHIN = 30.0  # every race unit serves this long after boot, far below GATE_TIMEOUT


@pytest.fixture
def shared(tmp_path: Path, fake_driver: Path) -> Path:
    require_root()
    shutil.copy(fake_driver, tmp_path / fake_driver.name)
    return tmp_path


def stop_while_the_gate_waits(shared: Path, fake_driver: Path, gate: str) -> dict[str, object]:
    """Chat's gate releases and chat holds the lease through a long init; embedding's gate (`gate`, its
    ExecStartPre=) waits for it; then `systemctl stop` embedding. What systemd, the journal and the
    engines' events show after the stop."""
    chat, embedding = "vllm-xpu-chat.service", "vllm-xpu-embedding.service"
    config, events = shared / "ze.conf", shared / "events.jsonl"
    SharedDevice.create(config, SIXTEEN_GIB_GPU, reserved=IDLE_RESERVED)
    common = dict(device_config=path_inside(shared, config), events=path_inside(shared, events), requests=0)
    long_chat = dataclasses.replace(CHAT, init_seconds=4000.0)  # 400 s on the replay's clock: still initialising
    files = {f"/etc/systemd/system/{chat}": unit_file(long_chat, restart="no", exec_start_pre=[gate_command()],
                                                      **common),
             f"/etc/systemd/system/{embedding}": unit_file(EMBEDDING, exec_start_pre=[gate], **common),
             **packaged_gate(shared, shared / fake_driver.name)}
    with RealSystemd(shared, files=files, enable=[GATE_SOCKET]) as machine:
        start_chat_then_embedding_waiting_for_it(machine, events)
        began = time.monotonic()
        machine.systemctl("stop", embedding, timeout=STEP_TIMEOUT)
        stop_seconds = time.monotonic() - began
        shown = machine.systemctl("show", "-p", "ActiveState,SubState,Result", embedding).stdout
        state = dict(line.partition("=")[::2] for line in shown.splitlines() if "=" in line)
        machine.sync_journal()
        lines = gate_lines(machine, embedding)
        chat_state = machine.systemctl("is-active", chat, check=False).stdout.strip()
    return {"state": state, "lines": lines, "stop_seconds": stop_seconds, "chat": chat_state,
            "embedding_events": [record for record in read_events(events) if record["unit"] == embedding]}


def test_a_stop_while_the_gate_waits_leaves_the_unit_inactive_not_failed(shared: Path, fake_driver: Path):
    """`systemctl stop` of embedding while its client waits for chat's init: systemd SIGTERMs the client
    (the ExecStartPre= control process), which says so and exits 0, so the unit ends inactive/dead with
    Result=success (a client dying of the SIGTERM would leave it failed, Result=signal); the stop does
    not wait for systemd's TimeoutStopSec=, embedding's engine never started, and chat's init goes on."""
    gate = gate_command(extra=["--gpu-memory-utilization", str(EMBEDDING.gpu_memory_utilization)])
    seen = stop_while_the_gate_waits(shared, fake_driver, gate)
    assert seen["state"] == {"ActiveState": "inactive", "SubState": "dead", "Result": "success"}, seen
    assert "vllm-xpu-gate: terminated while waiting (the unit is being stopped): not waiting any more" in \
        seen["lines"], seen["lines"]
    assert not any(line.startswith("vllm-xpu-gate: released") for line in seen["lines"]), seen["lines"]
    assert seen["embedding_events"] == [], f"embedding's engine started: {seen['embedding_events']}"
    assert seen["stop_seconds"] < 10, f"the stop took {seen['stop_seconds']:.1f} s"
    assert seen["chat"] == "active", seen


@pytest.mark.parametrize("clone", ["/var/tmp/clone", "/tmp/clone", "/home/user/clone", "/root/clone"])
def test_a_clone_the_packaged_units_sandboxing_hides_is_shown_to_it_read_only(clone: str):
    """The packaged unit's PrivateTmp=yes hides /tmp and /var/tmp, its ProtectHome=yes /home and /root: a
    clone there (its .venv inside it) is bound read-only into the unit by the harness's drop-in, the unit
    itself unchanged; a clone under /srv needs no drop-in."""
    unit = (REPO / "packaging/vllm-xpu-exporter.service").read_text()
    drop_in = showing_hidden_trees(unit, {clone, f"{clone}/.venv", "/usr"})
    assert f"BindReadOnlyPaths={clone}\n" in drop_in
    assert ("ProtectHome=tmpfs" in drop_in) == clone.startswith(("/home/", "/root/"))
    assert showing_hidden_trees(unit, {"/srv/clone", "/srv/clone/.venv", "/usr"}) == ""


def test_the_packaged_exporter_unit_holds_no_gate_back_at_boot(shared: Path, fake_driver: Path):
    """The three race units, each gated with the DEFAULT unit globs (vllm*.service), enabled beside the
    packaged exporter unit (vllm-xpu-exporter.service: its name matches those globs, and the exporter
    watches the default globs too), all started together at boot: the exporter's start is no engine
    start (its start-up line ends its window at once), so no gate waits its timeout. No init fails, none
    overlaps, the gates release one after another (at least two waited), every unit serves within
    SERVED_WITHIN of the boot, and the packaged exporter, scraped on its port, counts 0 overlaps for each
    unit and has no series of its own unit."""
    units = list(RACE_UNITS)
    exporter = packaged_exporter(shared, shared / fake_driver.name)
    seen: dict[str, object] = {}

    def scrape(machine: RealSystemd) -> None:
        seen["exporter_state"] = machine.systemctl("show", "-p", "ActiveState,SubState,Result,NRestarts",
                                                   EXPORTER_UNIT).stdout
        seen["exporter_lines"] = [journal_field(entry, "MESSAGE") for entry in machine.journal(EXPORTER_UNIT)]

        def caught_up() -> bool:
            samples = exporter.scrape()
            seen["samples"] = samples
            starts = series(samples, "xpu_unit_engine_starts_total")
            return all(starts.get((("unit", unit),), 0) >= 1 for unit in units)

        seen["caught_up"] = wait_for(caught_up, timeout=STEP_TIMEOUT, interval=0.5)

    outcome = race_boot(shared, exec_start_pre=gated, exporter=exporter, while_up=scrape, files=packaged_drop_in(),
                        gate=packaged_gate(shared, shared / fake_driver.name))
    lines = "\n".join(str(line) for line in seen.get("exporter_lines", []))
    assert outcome.settled, f"not every unit served within the settle timeout: {outcome.counts}\n{lines}"
    assert outcome.failures == 0 and outcome.overlaps == 0, outcome.counts
    per_unit = {unit: decisions(outcome.entries, unit) for unit in units}
    assert all(len(found) == 1 for found in per_unit.values()), f"one gate decision per start: {per_unit}"
    assert all(found[0].released for found in per_unit.values()), f"a gate timed out: {per_unit}"
    assert sum(bool(found[0].waited) for found in per_unit.values()) >= 2, f"the gates released together: {per_unit}"
    assert outcome.seconds < SERVED_WITHIN, f"served {outcome.seconds:.1f} s after boot: {per_unit}"
    assert max(found[0].seconds for found in per_unit.values()) < SERVED_WITHIN, per_unit
    assert "ActiveState=active" in seen["exporter_state"] and "NRestarts=0" in seen["exporter_state"], \
        f"{seen['exporter_state']}\n{lines}"
    assert seen["caught_up"], f"the exporter did not count the three starts: {seen.get('samples')}\n{lines}"
    samples = seen["samples"]
    overlaps = series(samples, "xpu_unit_engine_init_overlaps_total")
    # the gate service's unit matches vllm*.service too: watched, no engine, no overlap
    assert {labels: value for labels, value in overlaps.items() if ("unit", EXPORTER_UNIT) not in labels} == \
        {(("unit", unit),): 0 for unit in [*units, GATE_SERVICE]}, overlaps
    own = [key for key in samples if ("unit", EXPORTER_UNIT) in key[1]]
    assert own == [], f"the exporter has series of its own unit: {own}"
