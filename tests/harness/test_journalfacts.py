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


# --- units that run no vLLM engine (issue 19) ---------------------------------------------------------------

GRACE = journalfacts.ENGINE_GRACE_USEC
VLLM_LINE = "(APIServer pid=4242) INFO 12-02 10:00:00 [api_server.py:1873] vLLM API server version 0.24.0"
DONE = "INFO Application startup complete."
EXPORTER_LINE = ('ts=2026-12-02T10:00:00.000Z level=info source=main msg="vllm-xpu-exporter 0.9.0 listening on '
                 'http://[::]:10447/metrics (collectors: journal)"')


def test_a_proxy_beside_two_engines_overlaps_nothing_and_its_late_crash_is_no_failure():
    entries = [pid1("proxy.service", "p1", 1_000, MESSAGE_ID_UNIT_STARTED),
               output("proxy.service", "p1", 1_100, "proxy: listening on :8000"),
               pid1("a.service", "a1", 1_000_000, MESSAGE_ID_UNIT_STARTED),
               pid1("b.service", "b1", 1_000_500, MESSAGE_ID_UNIT_STARTED),
               output("a.service", "a1", 2_000_000, DONE),
               output("b.service", "b1", 3_000_000, DONE),
               pid1("proxy.service", "p1", GRACE + 30_000_000, MESSAGE_ID_UNIT_PROCESS_EXIT)]
    counts = journalfacts.counts(entries, ["proxy.service", "a.service", "b.service"])
    assert counts["proxy.service"] == journalfacts.UnitCounts(starts=0, failures={}, overlaps=0)
    assert (counts["a.service"].overlaps, counts["b.service"].overlaps) == (1, 1)


def test_the_exporters_start_up_line_makes_it_no_engine_at_once():
    entries = [pid1("x.service", "x1", 1_000, MESSAGE_ID_UNIT_STARTED),
               output("x.service", "x1", 1_100, EXPORTER_LINE),
               pid1("a.service", "a1", 2_000, MESSAGE_ID_UNIT_STARTED),
               output("a.service", "a1", 3_000, DONE),
               pid1("x.service", "x1", 5_000_000, MESSAGE_ID_UNIT_PROCESS_EXIT)]
    counts = journalfacts.counts(entries, ["x.service", "a.service"])
    assert counts["x.service"] == journalfacts.UnitCounts(starts=0, failures={}, overlaps=0)
    assert counts["a.service"].overlaps == 0


def test_a_first_vllm_line_within_the_grace_dates_the_init_from_the_start_and_after_it_from_the_line():
    within = [pid1("x.service", "x1", 1_000, MESSAGE_ID_UNIT_STARTED),
              pid1("a.service", "a1", 1_000_000, MESSAGE_ID_UNIT_STARTED),
              output("a.service", "a1", 2_000_000, DONE),
              output("x.service", "x1", 10_000_000, VLLM_LINE)]
    counts = journalfacts.counts(within, ["x.service", "a.service"])
    assert (counts["x.service"].overlaps, counts["a.service"].overlaps) == (1, 1)
    after = [pid1("x.service", "x1", 1_000, MESSAGE_ID_UNIT_STARTED),
             pid1("a.service", "a1", GRACE + 5_000_000, MESSAGE_ID_UNIT_STARTED),
             output("a.service", "a1", GRACE + 6_000_000, DONE),
             output("x.service", "x1", GRACE + 10_000_000, VLLM_LINE)]
    counts = journalfacts.counts(after, ["x.service", "a.service"])
    assert (counts["x.service"].overlaps, counts["a.service"].overlaps) == (0, 0)


def test_an_unprinted_death_counts_other_within_the_grace_or_for_an_engine_unit_but_not_after_it():
    quick = [pid1("a.service", "a1", 1_000, MESSAGE_ID_UNIT_STARTED),
             pid1("a.service", "a1", 2_000_000, MESSAGE_ID_UNIT_PROCESS_EXIT)]  # an import error
    assert journalfacts.counts(quick, ["a.service"])["a.service"].failures == {"other": 1}
    late = [pid1("a.service", "a1", 1_000, MESSAGE_ID_UNIT_STARTED),
            pid1("a.service", "a1", GRACE + 2_000_000, MESSAGE_ID_UNIT_PROCESS_EXIT)]
    assert journalfacts.counts(late, ["a.service"])["a.service"].failures == {}
    engine = [pid1("a.service", "a0", 1_000, MESSAGE_ID_UNIT_STARTED),
              output("a.service", "a0", 2_000, DONE),
              pid1("a.service", "a0", 3_000, MESSAGE_ID_UNIT_PROCESS_EXIT),
              *[{**entry, "INVOCATION_ID": "a1", "__REALTIME_TIMESTAMP": str(int(entry["__REALTIME_TIMESTAMP"]) + 10_000)}
                for entry in late]]
    assert journalfacts.counts(engine, ["a.service"])["a.service"].failures == {"other": 1}
