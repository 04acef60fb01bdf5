"""The gate's client as a process of a vLLM unit (exporter/gate/client.py): what a stop, a hang-up do to a
waiting client, and what a hung Level Zero init does to the service's decision. Clients and the service
run as processes over a real journal file and the fake Level Zero driver (the `host` of test_gate.py).
What the unit's environment can and cannot reach is shown on a real systemd
(test_gate_environment_real_systemd.py)."""

from __future__ import annotations

import signal
import time

import pytest

from vllm_xpu_exporter.gate.cli import go_duration
from fakeze import FakeConfig, write_config
from journalgen import new_invocation_id, unit_starting
from polling import wait_for
from test_gate import CHAT, EMBEDDING, Host, host, main_started  # noqa: F401 (host: the fixture)


def waiting_client(host: Host):
    """A client waiting for embedding's init."""
    other = new_invocation_id()
    host.write([unit_starting(EMBEDDING, host.clock.tick(), invocation_id=other),
                *main_started(EMBEDDING, host.clock, other, 100)])
    run = host.start(CHAT, "--gpu-memory-utilization", "0.75")
    assert wait_for(lambda: run.saw(f"waiting for {EMBEDDING}"), timeout=20), run.lines
    return run


def test_a_stop_while_the_client_waits_ends_it_with_0_so_the_unit_ends_inactive_not_failed(host: Host):
    """systemd stops a unit in ExecStartPre= with SIGTERM to the client; exit 0 then makes the unit
    inactive (Result=success), where death by the signal made it failed (Result=signal)."""
    run = waiting_client(host)
    run.process.send_signal(signal.SIGTERM)
    assert run.wait() == 0, run.lines
    assert run.lines[-1] == ("vllm-xpu-gate: terminated while waiting (the unit is being stopped): not waiting any "
                             "more") and run.decision is None, run.lines


def test_a_hang_up_does_not_end_a_waiting_client(host: Host):
    run = waiting_client(host)
    run.process.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    assert run.running, run.lines
    run.process.send_signal(signal.SIGTERM)
    run.wait()


@pytest.mark.parametrize("levelzero_timeout", ["1s", "3s"])
def test_a_hung_level_zero_init_holds_the_start_no_longer_than_the_levelzero_timeout(host: Host, levelzero_timeout):
    """zeInit never returns: the service decides with memory unchecked after its --levelzero.timeout, not
    after the Level Zero child's 60 s init deadline nor the client's --timeout."""
    write_config(host.tmp / "fake_ze.conf", FakeConfig(init_hang=True))
    host.serve("--levelzero.timeout", levelzero_timeout)
    began = time.monotonic()
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.75", "--timeout", "5m")
    took = time.monotonic() - began
    assert code == 0, run.lines
    assert run.saw("memory unchecked: Level Zero cannot be read ("), run.lines
    assert (run.decision.free_bytes, run.decision.needed_bytes) == (None, None)
    assert took < go_duration(levelzero_timeout) + 15, f"held {took:.1f} s"
