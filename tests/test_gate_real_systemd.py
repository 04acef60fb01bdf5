"""The init gate (`vllm-xpu-gate`, docs/gate.md) on a real systemd 252 booted as PID 1 of private
namespaces (tests/realsystemd.py): the issue's three replayed vLLM units (chat 0.75, embedding 0.07,
stt 0.07 of one 16 GiB fake GPU, Restart=on-failure; tests/bootrace.py), each gated by
`ExecStartPre=+vllm-xpu-gate --unit %n ...` run inside the namespace (its journal, its
/run/vllm-xpu-gate), with the fake Level Zero driver seeing the GPU the engines take memory from.
Without the gate the same boot fails and overlaps inits (test_real_systemd.py's race test;
benchmarks/boot_race.py compares both over 20 boots).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

import journalfacts
from bootrace import RACE_UNITS, BootOutcome, gate_command, gate_environment, race_boot
from realsystemd import RealSystemd, journal_field
from scrapes import series
from test_real_systemd import require_root, run_exporter, scrape_until_equal

GATED_BOOTS = 2
RESTART_TIMEOUT = 20.0
DECISION = re.compile(r"^vllm-xpu-gate: (?:released|timed out) after (?P<seconds>[\d.]+)s \((?:waited|waiting) for "
                      r"(?P<waited>[^;]+);")


def decisions(entries, unit: str) -> list[tuple[str, float, tuple[str, ...]]]:
    """(invocation, seconds, waited for) of each of the unit's gate decision lines, in journal order."""
    found = []
    for entry in sorted(entries, key=lambda e: int(e["__REALTIME_TIMESTAMP"])):
        if journal_field(entry, "_SYSTEMD_UNIT") != unit:
            continue
        match = DECISION.match(journal_field(entry, "MESSAGE") or "")
        if match:
            waited = tuple(match["waited"].split(","))
            found.append((journal_field(entry, "_SYSTEMD_INVOCATION_ID"), float(match["seconds"]),
                          () if waited == ("nothing",) else waited))
    return found


def _serving(events: Path) -> list[dict]:
    if not events.exists():
        return []
    return [record for record in map(json.loads, events.read_text().splitlines()) if record["event"] == "serving"]


@pytest.fixture
def shared(tmp_path: Path, fake_driver: Path) -> Path:
    require_root()
    shutil.copy(fake_driver, tmp_path / fake_driver.name)
    return tmp_path


def gated_boot(shared: Path, fake_driver: Path, while_up=None) -> BootOutcome:
    return race_boot(shared, exec_start_pre=[gate_command()],
                     extra_service=gate_environment(shared, shared / fake_driver.name), while_up=while_up)


def test_three_gated_units_started_together_at_boot_neither_fail_nor_overlap(shared: Path, fake_driver: Path):
    """Each boot: every unit serves after one start, no init failed, no two inits overlapped (the
    journal read directly), the gates released one after another (at least two waited), and the
    exporter on that journal counts the same starts, failures and overlaps, and one gate wait per
    start whose decision line says it waited."""
    units = list(RACE_UNITS)
    seen: dict[str, object] = {}

    def check_exporter(machine: RealSystemd) -> None:
        machine.sync_journal()
        entries = machine.journal(*units)
        expected = journalfacts.counts(entries, units)
        waits = {unit: sum(bool(waited) for _, _, waited in decisions(entries, unit)) for unit in units}
        with run_exporter(machine, fake_driver, shared / "ze.conf", "vllm-xpu-*.service") as exporter:
            seen["counts"] = scrape_until_equal(exporter, expected)
            deadline = time.monotonic() + 5
            while True:
                samples = exporter.scrape()
                gate_waits = {unit: int(series(samples, "xpu_unit_gate_waits_total").get((("unit", unit),), 0))
                              for unit in units}
                if gate_waits == waits or time.monotonic() > deadline:
                    break
                time.sleep(0.25)
            waited_seconds = series(samples, "xpu_unit_gate_wait_seconds_total")
        seen.update(expected=expected, waits=waits, gate_waits=gate_waits, waited_seconds=waited_seconds)

    for boot in range(GATED_BOOTS):
        outcome = gated_boot(shared, fake_driver, while_up=check_exporter)
        assert outcome.settled, f"boot {boot}: not every unit came up: {outcome.counts}"
        assert outcome.failures == 0 and outcome.overlaps == 0, f"boot {boot}: {outcome.counts}"
        assert all(counts.starts == 1 for counts in outcome.counts.values()), outcome.counts
        per_unit = {unit: decisions(outcome.entries, unit) for unit in units}
        assert all(len(found) == 1 for found in per_unit.values()), f"one gate decision per start: {per_unit}"
        assert sum(bool(found[0][2]) for found in per_unit.values()) >= 2, f"the gates released together: {per_unit}"
        assert seen["counts"] == seen["expected"], f"boot {boot}: exporter {seen['counts']} != journal"
        assert seen["gate_waits"] == seen["waits"], f"boot {boot}: gate waits {seen['gate_waits']}"
        for unit, count in seen["waits"].items():
            if count:
                assert seen["waited_seconds"].get((("unit", unit),), 0) > 0, f"{unit}: no time waited"


def test_a_chat_restart_while_the_others_serve_is_not_delayed(shared: Path, fake_driver: Path):
    """Once all three serve, `systemctl restart` of chat: its gate finds no init running and no live
    lease (the last holder's init completed), so it releases at once; chat serves again without a
    failure."""
    chat = "vllm-xpu-chat.service"
    seen: dict[str, object] = {}

    def restart_chat(machine: RealSystemd) -> None:
        events = shared / "events.jsonl"
        machine.systemctl("restart", "--no-block", chat)
        deadline = time.monotonic() + RESTART_TIMEOUT
        while sum(record["unit"] == chat for record in _serving(events)) < 2:
            assert time.monotonic() < deadline, "chat did not serve again after its restart"
            time.sleep(0.1)
        machine.sync_journal()
        seen["entries"] = machine.journal(*RACE_UNITS)

    outcome = gated_boot(shared, fake_driver, while_up=restart_chat)
    assert outcome.settled and outcome.failures == 0, outcome.counts
    restarted = decisions(seen["entries"], chat)
    assert len(restarted) == 2, f"one gate decision per start of chat: {restarted}"
    _, seconds, waited = restarted[-1]
    assert waited == () and seconds < 1.0, f"the restart's gate: {restarted[-1]}"
    counts = journalfacts.counts(seen["entries"], list(RACE_UNITS))
    assert counts[chat].starts == 2 and not counts[chat].failures, counts
    assert sum(unit.overlaps for unit in counts.values()) == 0, counts
