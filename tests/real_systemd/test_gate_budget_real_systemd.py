"""The gate admits by the budget a unit runs with now, not by its previous start's (docs/gate.md, "By the plan"),
on a real systemd 252 booted as PID 1 of private namespaces (tests/realsystemd.py) with the packaged gate
service and socket and the boot race's three replayed vLLM units (tests/bootrace.py, tests/vllmunit.py; chat
0.75, embedding 0.07, stt 0.07 of one 16 GiB fake GPU). Each unit runs with the planner's drop-in
(`zz-vllm-xpu-plan.conf`, as `vllm-xpu-plan --format systemd` writes it: the command restated with the budget,
the budget named for the exporter, the R and budget in the client's environment) and the packaged gate
drop-in's client without flags: the three boot by the plan, beside each other.

Then chat's and embedding's budgets go away, and both are restarted at the same moment:

* `removed`: their plan drop-ins are deleted;
* `overridden`: a later drop-in (`zzz-local.conf`) replaces ExecStart= with the unit's own command, without a
  budget, the plan's drop-in left in place.

Both now size their KV caches from free memory: their inits must not overlap. Before, the service took each
one's budget from its previous start and released both at once "by the plan": they overlapped and embedding
failed (`no_kv_cache_memory`).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

import journalfacts
from bootrace import (GATE_SOCKET, PLANNED, RACE_UNITS, gate_command, idle_gpu, packaged_drop_in, packaged_gate,
                      race_unit_files)
from polling import wait_for
from realsystemd import RealSystemd
from test_gate_real_systemd import decisions
from test_planner_applied_real_systemd import planners_drop_in
from test_real_systemd import require_root
from vllm_xpu_exporter.sources.plan_dropins import DROP_IN_NAME
from vllm_xpu_exporter.planner.execstart import exec_start_from_cat
from vllmunit import read_events, serving_units

CHAT_UNIT, EMBEDDING_UNIT, STT_UNIT = RACE_UNITS
RESTARTED = (CHAT_UNIT, EMBEDDING_UNIT)


@pytest.fixture
def shared(tmp_path: Path, fake_driver: Path) -> Path:
    require_root()
    shutil.copy(fake_driver, tmp_path / fake_driver.name)
    return tmp_path


@pytest.mark.parametrize("how", ["removed", "overridden"])
def test_units_whose_plan_is_gone_restarted_together_init_one_after_the_other(shared: Path, fake_driver: Path,
                                                                              how: str):
    _, events = idle_gpu(shared)
    units = race_unit_files(shared, exec_start_pre=[gate_command()])
    plans = {f"/etc/systemd/system/{unit}.d/{DROP_IN_NAME}": planners_drop_in(
        unit, units[f"/etc/systemd/system/{unit}"], engine, engine.kv_cache_memory_bytes)
        for unit, engine in PLANNED.items()}
    files = {**units, **plans, **packaged_drop_in(), **packaged_gate(shared, shared / fake_driver.name)}
    seen: dict[str, object] = {}
    with RealSystemd(shared, files=files, enable=[*RACE_UNITS, GATE_SOCKET]) as machine:
        assert wait_for(lambda: serving_units(events) == set(RACE_UNITS), timeout=60, interval=0.1), read_events(events)
        machine.sync_journal()
        seen["boot"] = machine.journal(*RACE_UNITS)
        for unit in RESTARTED:
            if how == "removed":
                machine.host_path(f"/etc/systemd/system/{unit}.d/{DROP_IN_NAME}").unlink()
            else:
                command = exec_start_from_cat(units[f"/etc/systemd/system/{unit}"])
                machine.write_file(f"/etc/systemd/system/{unit}.d/zzz-local.conf",
                                   f"[Service]\nExecStart=\nExecStart={command}\n")
        machine.daemon_reload()
        cut_usec = time.time_ns() // 1000
        machine.systemctl("restart", "--no-block", *RESTARTED)
        assert wait_for(lambda: sum(record["event"] == "serving" for record in read_events(events)) >= 5,
                        timeout=60, interval=0.1), read_events(events)
        machine.sync_journal()
        seen["after"] = [entry for entry in machine.journal(*RACE_UNITS)
                         if int(entry["__REALTIME_TIMESTAMP"]) >= cut_usec]
    boot = journalfacts.counts(seen["boot"], RACE_UNITS)
    assert all(counts.starts == 1 and not counts.failures for counts in boot.values()), boot
    assert sum(counts.overlaps for counts in boot.values()) >= 2, f"the planned boot did not go by the plan: {boot}"
    after = journalfacts.counts(seen["after"], RESTARTED)
    assert all(counts.starts == 1 for counts in after.values()), after
    assert sum(sum(counts.failures.values()) for counts in after.values()) == 0, after
    assert sum(counts.overlaps for counts in after.values()) == 0, after
    served = [record for record in read_events(events) if record["event"] == "serving"][3:]
    assert all(record["kv_bytes"] != PLANNED[record["unit"]].kv_cache_memory_bytes for record in served), served
    released = {unit: decisions(seen["after"], unit) for unit in RESTARTED}
    assert all(len(found) == 1 and found[0].released for found in released.values()), released
    # the one released second waited for the first one's init (the first may have met the second's start
    # a moment before that start's client asked, and waited for it that moment: not an overlap)
    first, second = sorted(RESTARTED, key=lambda unit: released[unit][0].at_usec)
    assert first in released[second][0].waited, released
