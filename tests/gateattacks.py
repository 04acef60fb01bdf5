"""The attacks on the gate service of the issue's hosts, on a real systemd (tests/realsystemd.py) with the
packaged gate units (tests/bootrace.py): processes that try to switch the gate off or hold other units'
starts back, and a boot of the seed host's three gated units under them.

    FLOOD                  a script (stdlib only): COUNT connections to the socket, a byte on each every
                           INTERVAL seconds, reconnecting those the service answered or closed; with a
                           STOP path, it ends once that exists and prints how many were answered
    start_flood(machine)   that script as uid 65534 outside every unit (nsenter, not through systemd)
    squatter_unit()        a watched unit that serves (its engine printed its init) and whose own
                           process asks for a turn again and again
    attacked_boot(...)     the three gated units started together under the flood, the squatter or both

Used by tests/real_systemd/test_gate_attacks_real_systemd.py and benchmarks/attacked_boot.py.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import journalfacts
from bootrace import (GATE_SOCKET, RACE_UNITS, BootOutcome, gate_command, gated, idle_gpu, packaged_drop_in,
                      packaged_gate, race_unit_files)
from polling import wait_for
from realsystemd import RealSystemd, journal_field
from vllmunit import read_events, serving_units

SOCKET = "/run/vllm-xpu-gate/gate.sock"
SQUATTER = "vllm-xpu-squatter.service"
SERVE_TIMEOUT = 60.0

FLOOD = """
import os, socket, sys, time
path, count, interval = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
stop = sys.argv[4] if len(sys.argv) > 4 else None
answered = 0
def connect():
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(path)
    connection.setblocking(False)
    return connection
connections = [connect() for _ in range(count)]
print("flooding", flush=True)
while stop is None or not os.path.exists(stop):
    for index, connection in enumerate(connections):
        try:
            if connection.recv(4096, socket.MSG_PEEK):
                answered += 1
                connection.close()
                connections[index] = connect()
                continue
        except BlockingIOError:
            pass
        except OSError:
            connection.close()
            connections[index] = connect()
            continue
        try:
            connection.send(b"{")
        except OSError:
            connection.close()
            connections[index] = connect()
    time.sleep(interval)
print(answered, flush=True)
"""


def start_flood(machine: RealSystemd, count: int = 256, interval: float = 3.0) -> subprocess.Popen:
    """FLOOD as uid 65534 (nobody) in no unit of the machine: a child of nsenter, in the cgroup the test
    runs in. Returns once its connections are open; it ends with the machine."""
    flood = subprocess.Popen(["nsenter", "-t", str(machine.pid1), "-a", "--", "setpriv", "--reuid=65534",
                              "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", FLOOD, SOCKET, str(count),
                              str(interval)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    line = flood.stdout.readline()
    if line != b"flooding\n":
        flood.kill()
        raise RuntimeError(f"the flood did not start: {line!r}")
    return flood


# What a served vLLM engine prints (its version, then its init's end): the fold takes the unit for an
# engine whose init completed, so it serves and initialises no more.
SERVED_LINES = ("(APIServer pid=7) INFO 12-02 10:00:00 [api_server.py:1873] vLLM API server version 0.24.0",
                "(EngineCore pid=8) INFO 12-02 10:00:20 [gpu_worker.py:456] Available KV cache memory: 1.25 GiB",
                "(EngineCore pid=8) INFO 12-02 10:00:20 [core.py:210] init engine (profile, create kv cache, "
                "warmup model) took 0.10 seconds")


def squatter_unit(interval: float = 1.0) -> str:
    """A watched unit that serves, whose own process then asks for a turn every `interval` seconds with a
    tiny R and a long timeout, for ever (the squatter)."""
    echo = "; ".join(f"echo '{line}'" for line in SERVED_LINES)
    ask = gate_command(timeout="25s", extra=["--gpu-memory-utilization", "0.01"])
    return "\n".join(["[Unit]", "Description=a serving unit whose process asks for turns",
                      "[Service]", f"ExecStart=/bin/sh -c \"{echo}; while :; do {ask}; sleep {interval:g}; done\"",
                      ""])


@dataclass(frozen=True)
class AttackedBoot:
    outcome: BootOutcome
    releases: Mapping[str, int]  # unit -> realtime usec of its gate's "released" line
    # each release after the first: its time minus the end of the previous unit's init (its init-complete line)
    release_lags_usec: Sequence[int]
    ungated: int  # starts of the three units whose client found no service
    timed_out: int


def attacked_boot(shared: Path, fake_driver_copy: Path, *, flood: bool, squatter: bool,
                  service_flags: Sequence[str] = ()) -> AttackedBoot:
    """A fresh machine with the packaged gate (its socket enabled), the three race units gated (each with
    its R) and, first, the attackers; then the three started together. Read back once all serve."""
    _, events = idle_gpu(shared)
    files = {**race_unit_files(shared, exec_start_pre=gated), **packaged_drop_in(),
             **packaged_gate(shared, fake_driver_copy, service_flags)}
    enable = [GATE_SOCKET]
    if squatter:
        files[f"/etc/systemd/system/{SQUATTER}"] = squatter_unit()
        enable.append(SQUATTER)
    with RealSystemd(shared, files=files, enable=enable) as machine:
        if squatter and not wait_for(lambda: _released_lines(machine.journal(SQUATTER)) >= 1, timeout=30,
                                     interval=0.2):
            raise RuntimeError("the squatter was never answered")
        flooder = start_flood(machine) if flood else None
        began = time.time()
        machine.start(*RACE_UNITS)
        settled = wait_for(lambda: serving_units(events) == set(RACE_UNITS), timeout=SERVE_TIMEOUT, interval=0.1)
        seconds = time.time() - began
        machine.sync_journal()
        entries = machine.journal(*RACE_UNITS)
        if flooder is not None:
            flooder.kill()
    outcome = BootOutcome(journalfacts.counts(entries, RACE_UNITS), settled, seconds, entries, read_events(events))
    messages = [(journal_field(entry, "_SYSTEMD_UNIT"), int(entry["__REALTIME_TIMESTAMP"]),
                 journal_field(entry, "MESSAGE") or "") for entry in entries]
    releases = {unit: at for unit, at, message in messages if message.startswith("vllm-xpu-gate: released after ")}
    init_ends = {unit: at for unit, at, message in messages if journalfacts.INIT_DONE.search(message)}
    order = sorted(releases, key=releases.get)
    lags = [releases[unit] - init_ends[previous] for previous, unit in zip(order, order[1:])
            if init_ends.get(previous) is not None]
    return AttackedBoot(outcome, releases, lags,
                        sum(message.startswith("vllm-xpu-gate: started ungated") for _, _, message in messages),
                        sum(message.startswith("vllm-xpu-gate: timed out") for _, _, message in messages))


def _released_lines(entries) -> int:
    return sum((journal_field(entry, "MESSAGE") or "").startswith("vllm-xpu-gate: released after ")
               for entry in entries)
