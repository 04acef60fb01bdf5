"""tests/journalfacts.py, the yardstick of the real-systemd tests, on hand-written journal entries."""

from __future__ import annotations

import journalfacts
from journalgen import MESSAGE_ID_UNIT_PROCESS_EXIT, MESSAGE_ID_UNIT_STARTED


def pid1(unit: str, invocation: str, at: int, message_id: str) -> dict[str, str]:
    return {"__REALTIME_TIMESTAMP": str(at), "_PID": "1", "UNIT": unit, "INVOCATION_ID": invocation,
            "MESSAGE_ID": message_id, "MESSAGE": ""}


def output(unit: str, invocation: str, at: int, message: str) -> dict[str, str]:
    return {"__REALTIME_TIMESTAMP": str(at), "_PID": "4242", "_SYSTEMD_UNIT": unit,
            "_SYSTEMD_INVOCATION_ID": invocation, "MESSAGE": message}


def test_a_start_whose_process_never_ran_fails_and_overlaps_nothing():
    entries = [pid1("a.service", "a1", 1_000, MESSAGE_ID_UNIT_STARTED),
               output("a.service", "a1", 1_100, "INFO loading"),
               pid1("b.service", "b1", 1_200, MESSAGE_ID_UNIT_PROCESS_EXIT),  # its ExecStartPre= could not run
               output("a.service", "a1", 9_000, "INFO Application startup complete.")]
    counts = journalfacts.counts(entries, ["a.service", "b.service"])
    assert counts["a.service"] == journalfacts.UnitCounts(starts=1, failures={}, overlaps=0)
    assert counts["b.service"] == journalfacts.UnitCounts(starts=0, failures={"other": 1}, overlaps=0)


def test_inits_of_two_units_that_run_at_once_overlap():
    entries = [pid1("a.service", "a1", 1_000, MESSAGE_ID_UNIT_STARTED),
               pid1("b.service", "b1", 1_500, MESSAGE_ID_UNIT_STARTED),
               output("a.service", "a1", 2_000, "INFO Application startup complete."),
               output("b.service", "b1", 3_000, "INFO Application startup complete.")]
    counts = journalfacts.counts(entries, ["a.service", "b.service"])
    assert (counts["a.service"].overlaps, counts["b.service"].overlaps) == (1, 1)
