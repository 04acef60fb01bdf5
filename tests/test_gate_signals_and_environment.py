"""The gate as a root process of another user's unit (exporter/gate/cli.py, issue 19): what its environment
may decide, what a stop, a hang-up or a hung Level Zero init do to a waiting gate. Gates run as processes
over a real journal file and the fake Level Zero driver (the `host` of test_gate.py)."""

from __future__ import annotations

import signal
import time

import pytest

from vllm_xpu_exporter.gate.cli import EXIT_TERMINATED, SYSTEM_PATH, distrust_environment, go_duration
from fakeze import FakeConfig, write_config
from journalgen import new_invocation_id, unit_output, unit_starting
from polling import wait_for
from test_gate import CHAT, EMBEDDING, Host, host, main_started  # noqa: F401 (host: the fixture)

PLANTED = {"LD_PRELOAD": "/home/u/evil.so", "LD_LIBRARY_PATH": "/home/u/lib", "PYTHONPATH": "/home/u/py",
           "ZE_ENABLE_ALT_DRIVERS": "/home/u/evil.so", "PATH": "/home/u/venv/bin:/usr/bin"}


def test_an_environment_systemd_handed_over_is_dropped_but_the_invocation_id_and_locale():
    environ = {**PLANTED, "JOURNAL_STREAM": "8:1234", "SYSTEMD_EXEC_PID": "77", "INVOCATION_ID": "ab" * 16,
               "LANG": "C.UTF-8"}
    assert distrust_environment(environ)
    assert environ == {"INVOCATION_ID": "ab" * 16, "LANG": "C.UTF-8", "PATH": SYSTEM_PATH}


def test_an_environment_a_static_env_i_set_is_kept_as_the_command_line_wrote_it():
    """The packaged drop-in: `busybox env -i NAME=VALUE... vllm-xpu-gate`; root wrote every variable."""
    environ = {"ZE_ENABLE_ALT_DRIVERS": "/usr/lib/fake.so", "LD_LIBRARY_PATH": "/nix/store/x-level-zero/lib"}
    assert not distrust_environment(environ)
    assert environ == {"ZE_ENABLE_ALT_DRIVERS": "/usr/lib/fake.so", "LD_LIBRARY_PATH": "/nix/store/x-level-zero/lib"}


def test_started_by_systemd_directly_neither_a_planted_systemctl_nor_a_planted_driver_runs(host: Host):
    """The unit's PATH leads to its user's systemctl and its ZE_ENABLE_ALT_DRIVERS to their driver (here
    the fake one, standing for any library): the gate calls systemctl by absolute path, and its Level
    Zero child gets none of the unit's environment, so it finds no driver and the gate releases saying so."""
    planted = host.tmp / "planted"
    planted.mkdir()
    marker = host.tmp / "planted-systemctl-ran"
    (planted / "systemctl").write_text(f"#!/bin/sh\ntouch {marker}\necho ActiveState=inactive\n")
    (planted / "systemctl").chmod(0o755)
    host.write([unit_output("other.service", "unrelated", host.clock.tick())])
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.75", "--systemctl", "/usr/bin/systemctl",
                         environment={"PATH": f"{planted}:/usr/bin:/bin", "JOURNAL_STREAM": "8:1234"})
    assert code == 0, run.lines
    assert run.saw("warning: started with the unit's environment")
    assert run.saw("warning: cannot read Level Zero (") and run.decision.free_bytes is None, run.lines
    assert not marker.exists(), "the unit's systemctl ran as the gate's user"


def waiting_gate(host: Host, systemctl_active_state: str):
    """A gate waiting for embedding's init; systemctl says the gated unit is in this ActiveState."""
    host.systemctl(ActiveState=systemctl_active_state, SubState="start-pre", InvocationID="")
    other = new_invocation_id()
    host.write([unit_starting(EMBEDDING, host.clock.tick(), invocation_id=other),
                *main_started(EMBEDDING, host.clock, other, 100)])
    run = host.start(CHAT, "--gpu-memory-utilization", "0.75")
    assert wait_for(lambda: run.saw(f"waiting for {EMBEDDING}"), timeout=20), run.lines
    return run


def test_a_stop_while_the_gate_waits_ends_it_with_0_so_the_unit_ends_inactive_not_failed(host: Host):
    """systemd stops a unit in ExecStartPre= with SIGTERM to the gate; exit 0 in that state makes the unit
    inactive (Result=success), where death by the signal made it failed (Result=signal)."""
    run = waiting_gate(host, "deactivating")
    run.process.send_signal(signal.SIGTERM)
    assert run.wait() == 0, run.lines
    assert run.saw(f"{CHAT} is being stopped: not starting it") and run.decision is None, run.lines


def test_sigterm_outside_a_stop_fails_the_start(host: Host):
    run = waiting_gate(host, "activating")
    run.process.send_signal(signal.SIGTERM)
    assert run.wait() == EXIT_TERMINATED, run.lines
    assert run.saw("terminated by SIGTERM") and run.decision is None, run.lines


def test_a_hang_up_does_not_end_a_waiting_gate(host: Host):
    run = waiting_gate(host, "activating")
    run.process.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    assert run.running, run.lines
    run.process.send_signal(signal.SIGTERM)
    run.wait()


@pytest.mark.parametrize("levelzero_timeout", ["1s", "3s"])
def test_a_hung_level_zero_init_holds_the_start_no_longer_than_the_levelzero_timeout(host: Host, levelzero_timeout):
    """zeInit never returns: the gate releases with memory unknown after its own --levelzero.timeout,
    not after the Level Zero child's 60 s init deadline nor its --timeout."""
    write_config(host.tmp / "fake_ze.conf", FakeConfig(init_hang=True))
    host.write([unit_output("other.service", "unrelated", host.clock.tick())])
    began = time.monotonic()
    code, run = host.run(CHAT, "--gpu-memory-utilization", "0.75", "--timeout", "5m",
                         "--levelzero.timeout", levelzero_timeout)
    took = time.monotonic() - began
    assert code == 0, run.lines
    assert run.saw("warning: cannot read Level Zero (") and run.saw("releasing at once"), run.lines
    assert (run.decision.free_bytes, run.decision.needed_bytes) == (None, None)
    assert took < go_duration(levelzero_timeout) + 15, f"held {took:.1f} s"
