"""The gate admits a sleeping engine's wake as it admits a start (`vllm-xpu-gate wake`, run in the unit's own
cgroup before vLLM's `POST /wake_up`), as real processes: the service over the fake Level Zero driver and real
journal files, the clients asking over its socket (tests/gate/test_gate.py's `Host`). A few checks of the pure parts
(the decision, the lease's end, the lease file) run in process."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vllm_xpu_exporter.gate import protocol
from vllm_xpu_exporter.gate.decision import Admission, Lease, asleep_invocation, decide, lease_over
from vllm_xpu_exporter.gate.service import parse_saved_leases
from vllm_xpu_exporter.parsers import gate as gate_lines
from fakeze import GiB
from journalgen import (Clock, current_boot_id, new_invocation_id, unit_output, unit_process_exited, unit_starting,
                        unit_stopped)
from polling import wait_for
from test_gate import (CHAT, CORE, DEVICE, EMBEDDING, STT, Host, host, init_completed, main_started,  # noqa: F401
                       needed, views_of)

FREED = "Sleep mode freed 11.62 GiB memory, 2.41 GiB memory is still in use."
WOKE = "It took 2.204117 seconds to wake up tags {'weights', 'kv_cache'}."
FREED_BYTES = round(11.62 * GiB)


def serving(host: Host, unit: str, pid: int, ratio: float = 0.75) -> str:
    """The unit started and serves (its init completed): its invocation id."""
    invocation = new_invocation_id()
    host.write([unit_starting(unit, host.clock.tick(), invocation_id=invocation),
                *main_started(unit, host.clock, invocation, pid, ratio),
                *init_completed(unit, host.clock, invocation, pid)])
    return invocation


def engine_says(host: Host, unit: str, invocation: str, pid: int, message: str) -> None:
    host.write([unit_output(unit, CORE.format(pid=pid + 1) + message, host.clock.tick(), pid=pid,
                            invocation_id=invocation)])


def asleep(host: Host, unit: str, pid: int, ratio: float = 0.75) -> str:
    invocation = serving(host, unit, pid, ratio)
    engine_says(host, unit, invocation, pid, FREED)
    return invocation


# --- as processes --------------------------------------------------------------------------------------------

def test_a_wake_waits_while_another_unit_initialises_and_goes_when_its_init_ends(host: Host) -> None:
    chat = asleep(host, CHAT, 100)
    embedding = new_invocation_id()
    host.write([unit_starting(EMBEDDING, host.clock.tick(), invocation_id=embedding),
                *main_started(EMBEDDING, host.clock, embedding, 200)])
    wake = host.start(CHAT, command="wake")
    assert wait_for(lambda: wake.saw(f"waiting for {EMBEDDING}"), timeout=20), wake.lines
    time.sleep(0.5)
    assert wake.running, wake.lines
    host.write(init_completed(EMBEDDING, host.clock, embedding, 200))
    assert wake.wait() == 0, wake.lines
    assert wake.decision.waited_for == (EMBEDDING,) and wake.decision.needed_bytes == FREED_BYTES, wake.lines
    assert chat


def test_a_start_waits_while_a_wake_holds_its_lease_and_goes_when_vllm_prints_the_wakes_end(host: Host) -> None:
    chat = asleep(host, CHAT, 100)
    code, wake = host.run(CHAT, command="wake")
    assert code == 0 and wake.decision.waited_for == (), wake.lines
    stt = new_invocation_id()
    host.write([unit_starting(STT, host.clock.tick(), invocation_id=stt)])
    start = host.start(STT, "--gpu-memory-utilization", "0.07")
    assert wait_for(lambda: start.saw(f"waiting for {CHAT}"), timeout=20), start.lines
    time.sleep(0.5)
    assert start.running, start.lines
    engine_says(host, CHAT, chat, 100, WOKE)
    assert start.wait() == 0, start.lines
    assert start.decision.waited_for == (CHAT,), start.lines


def test_a_wake_ends_its_lease_when_the_engine_dies_of_it(host: Host) -> None:
    chat = asleep(host, CHAT, 100)
    code, _ = host.run(CHAT, command="wake")
    assert code == 0
    host.write([unit_starting(STT, host.clock.tick(), invocation_id=new_invocation_id())])
    start = host.start(STT, "--gpu-memory-utilization", "0.07")
    assert wait_for(lambda: start.saw(f"waiting for {CHAT}"), timeout=20), start.lines
    host.write([unit_process_exited(CHAT, host.clock.tick(), code="exited", status=1, invocation_id=chat),
                unit_stopped(CHAT, host.clock.tick(), invocation_id=chat)])
    assert start.wait() == 0, start.lines
    assert start.decision.waited_for == (CHAT,), start.lines


def test_an_awake_units_wake_again_and_again_gets_no_lease_and_holds_nobody_back(host: Host) -> None:
    """Chat serves awake (or has woken): its processes asking for wakes are released without a lease, so a
    start waiting at its gate goes at once. A sleep is leased once: asking again for the same sleep gets none."""
    host.serve("--lease-timeout", "30s")
    serving(host, CHAT, 100)
    for _ in range(2):
        code, squatter = host.run(CHAT, command="wake")
        assert code == 0 and squatter.saw("no sleeping engine"), squatter.lines
    host.write([unit_starting(STT, host.clock.tick(), invocation_id=new_invocation_id())])
    code, start = host.run(STT, "--gpu-memory-utilization", "0.07", "--timeout", "20s")
    assert code == 0 and start.decision.waited_for == () and not start.decision.timed_out, start.lines


def test_a_sleep_is_leased_one_wake(host: Host) -> None:
    asleep(host, CHAT, 100)
    code, first = host.run(CHAT, command="wake")
    assert code == 0 and not first.saw("warning"), first.lines
    code, again = host.run(CHAT, command="wake")
    assert code == 0 and again.saw("had its wake's lease already: none again"), again.lines


def test_a_sleeping_unit_counts_at_its_awake_footprint_in_a_starts_memory(host: Host) -> None:
    """13 GiB free, chat asleep (its wake takes 11.62 GiB back): stt's start of R 0.15 (2.4 GiB) would fit the
    free memory, not beside chat's wake: it waits for memory."""
    asleep(host, CHAT, 100)
    host.write([unit_starting(STT, host.clock.tick(), invocation_id=new_invocation_id())])
    code, start = host.run(STT, "--gpu-memory-utilization", "0.15", "--timeout", "2s", "--on-timeout", "fail")
    assert code == 1 and start.decision.timed_out, start.lines
    assert start.decision.waited_for == (gate_lines.MEMORY,), start.lines
    assert start.decision.needed_bytes == needed(0.15) + FREED_BYTES, start.lines


class _Engine(BaseHTTPRequestHandler):
    """vLLM's server as far as a wake goes: POST /wake_up answered with `status`."""

    status = 200
    asked: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        type(self).asked.append(self.path)
        self.send_response(self.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("status, exit_code", [(200, 0), (500, 1)])
def test_wake_with_url_posts_wake_up_once_admitted_and_exits_with_vllms_answer(host: Host, status: int,
                                                                            exit_code: int) -> None:
    handler = type("Engine", (_Engine,), {"status": status, "asked": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        asleep(host, CHAT, 100)
        code, wake = host.run(CHAT, "--url", f"http://127.0.0.1:{server.server_port}/", command="wake")
    finally:
        server.shutdown()
    assert code == exit_code and handler.asked == ["/wake_up"], wake.lines
    assert wake.decision is not None and not wake.decision.timed_out, wake.lines
    assert wake.saw("answered HTTP 500") == (status == 500), wake.lines


# --- pure parts ----------------------------------------------------------------------------------------------

@pytest.mark.fast
def test_the_wake_request_is_a_field_the_service_reads_and_refuses_when_it_is_no_boolean() -> None:
    request = protocol.Request(10.0, True, wake=True)
    assert protocol.Request.decode(request.encode()) == request
    assert "wake" not in json.loads(protocol.Request(10.0, True).encode())  # a start's request is as it was
    with pytest.raises(protocol.BadRequest, match="wake"):
        protocol.Request.decode(b'{"timeout": 1, "start_on_timeout": true, "wake": "yes"}')


@pytest.mark.fast
def test_a_wake_is_leased_only_while_the_journal_shows_the_engine_asleep_once_per_sleep() -> None:
    awake = views_of(_entries(CHAT, sleep=False))
    asleep_now = views_of(_entries(CHAT, sleep=True))
    woken = views_of(_entries(CHAT, sleep=True, woke=True))
    assert asleep_invocation(awake[0]) == "" and asleep_invocation(woken[0]) == ""
    key = asleep_invocation(asleep_now[0])
    assert key.startswith(asleep_now[0].current.invocation_id + "#slept@")


@pytest.mark.fast
def test_a_wakes_lease_ends_at_the_wake_line_the_engines_end_or_its_timeout_not_at_its_inits_end() -> None:
    views = views_of(_entries(CHAT, sleep=True))
    view = views[0]
    lease = Lease(DEVICE, CHAT, f"/system.slice/{CHAT}", granted_usec=0, expires_usec=10 ** 18,
                  needed_bytes=FREED_BYTES, absolute_budget=True, invocation_id=asleep_invocation(view), wake=True)
    assert lease_over(lease, view, 1, True) is None  # its init ended long ago: no matter
    woken = views_of(_entries(CHAT, sleep=True, woke=True, invocation=view.current.invocation_id))[0]
    assert lease_over(lease, woken, 1, True) == "its wake ended"
    other = Lease(**{**lease.__dict__, "invocation_id": "another start#slept@1"})
    assert lease_over(other, view, 1, True) == "its engine ended"
    assert lease_over(lease, view, 10 ** 18, True) == "timed out"


@pytest.mark.fast
def test_a_wake_needs_what_its_sleep_freed_and_every_other_sleeping_units_wake_besides() -> None:
    views = views_of([*_entries(CHAT, sleep=True), *_entries(STT, sleep=True, pid=300)])

    class Reading:
        total, free = 16 * GiB, 12 * GiB
    decision = decide(Admission(STT, DEVICE, None, True, takes_back=GiB), views, [], None, Reading)
    assert decision.needed_bytes == GiB + FREED_BYTES and not decision.release


@pytest.mark.fast
def test_a_sleeping_unit_counts_at_most_its_own_share_whatever_its_sleep_line_says_it_freed() -> None:
    """vLLM's "freed" is the device's free memory after less before: another engine's memory freed meanwhile
    (two units sleeping together) counts in it. STT (R 0.07) says it freed 11.62 GiB: it counts ceil(0.07 x total)."""
    views = views_of(_entries(STT, sleep=True, ratio=0.07))

    class Reading:
        total, free = 16 * GiB, 14 * GiB
    decision = decide(Admission(CHAT, DEVICE, 0.75, False), views, [], None, Reading)
    assert decision.needed_bytes == needed(0.75) + needed(0.07) and decision.release


@pytest.mark.fast
def test_a_lease_file_of_a_service_that_knew_no_wake_is_read() -> None:
    lease = {"device": DEVICE, "unit": CHAT, "cgroup_path": "/system.slice/x", "granted_usec": 1, "expires_usec": 2,
             "needed_bytes": None, "absolute_budget": False, "invocation_id": "i", "timed_out": False}
    leases, _, _ = parse_saved_leases(json.dumps({"leases": [lease], "invocations": []}).encode())
    assert leases == [Lease(**lease)] and not leases[0].wake


def _entries(unit: str, *, sleep: bool, woke: bool = False, pid: int = 100, invocation: str | None = None,
             ratio: float = 0.75):
    clock = Clock(current_boot_id(), realtime_usec=1_800_000_000_000_000)
    invocation = invocation or new_invocation_id()
    entries = [unit_starting(unit, clock.tick(), invocation_id=invocation),
               *main_started(unit, clock, invocation, pid, ratio), *init_completed(unit, clock, invocation, pid)]
    core = CORE.format(pid=pid + 1)
    if sleep:
        entries.append(unit_output(unit, core + FREED, clock.tick(), pid=pid, invocation_id=invocation))
    if woke:
        entries.append(unit_output(unit, core + WOKE, clock.tick(), pid=pid, invocation_id=invocation))
    return entries
