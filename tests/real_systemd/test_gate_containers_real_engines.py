"""The gate for containers on a real engine (Debian 12's rootful Podman, tests/containerengines.py): the
containers' entrypoint is the gate's container client (exporter/gate/container_wait.py, the project's package
bound in read-only, run by the image's own python3: nothing of the project installed in the image), the
service's socket bound in at its default path. Every time compared is one the containers or the engine wrote
(a container's own clock at its release, Podman's record of a container's end): no wall-clock assert.

What the service sees of Podman's containers here is their cgroups and Podman's state (the k8s-file log
driver: no log of theirs is read), so a released container holds its lease until its cgroup empties: the
lease the tests end by killing it. Docker's containers (json-file, read with --logs.docker) are the replayed
vLLM engines of tests/vllmunit.py, whose inits the service sees end in their own logs. A user's rootless
Podman runs in a booted systemd (tests/realsystemd.py), the service inside it.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from containerengines import Dockerd, Podman
from fakeze import A770, GiB, FakeConfig, FakeMemoryModule, SharedDevice, fake_driver_env, write_config
from journalgen import write_journal
from polling import wait_for
from realsystemd import RealSystemd
from test_containers_real_engines import ROOTLESS_UID, inside, rootless_podman  # noqa: F401 (the fixture)
from gateproc import GATE, GateRun
from vllmunit import CHAT, EMBEDDING, SIXTEEN_GIB_GPU, engine_command, read_events

REPO = Path(__file__).resolve().parents[2]
PACKAGE_INSIDE = "/vllm-xpu-gate/vllm_xpu_exporter"  # where docs/gate.md binds the package in
CLIENT = ["python3", f"{PACKAGE_INSIDE}/gate/container_wait.py", "--gpu-memory-utilization", "0.07",
          "--service-timeout", "20s"]
SOCKET_INSIDE = "/run/vllm-xpu-gate"
# What a released container runs: its release time by its own clock, then it stays (as an engine in its init)
RELEASED = ["python3", "-c", "import time; print('released at', time.time(), flush=True); time.sleep(600)"]


@pytest.fixture
def gate(tmp_path: Path, podman: Podman, fake_driver: Path) -> Iterator[Path]:
    """The gate service on the host, watching Podman's containers named vllm-*; the directory of its socket."""
    sockets = tmp_path / "gate"
    sockets.mkdir()
    config = tmp_path / "fake_ze.conf"
    write_config(config, FakeConfig(devices=(dataclasses.replace(
        A770, memory=(FakeMemoryModule(size=16 * GiB, free=13 * GiB),)),)))
    journal = write_journal(tmp_path / "empty.journal", [])
    service = GateRun("service", subprocess.Popen(
        [*GATE, "serve", "--listen", str(sockets / "gate.sock"), "--journal.file", str(journal),
         "--journal.containers", "podman/vllm-*", "--path.podman", str(podman.storage), "--poll-interval", "50ms"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**fake_driver_env(fake_driver, config), "PATH": "/usr/bin:/bin"}))
    assert wait_for(lambda: service.saw("serving on"), timeout=20), service.lines
    names = ("vllm-a", "vllm-b", "toolbox")
    podman.remove(*names)
    try:
        yield sockets
    finally:
        podman.remove(*names)
        service.stop()
        print("\n".join(service.lines))  # shown when a test fails


def gated(podman: Podman, sockets: Path, name: str, command: list[str]) -> None:
    podman.run(name, command, log_driver="k8s-file", options=[
        "-v", f"{REPO / 'exporter'}:{PACKAGE_INSIDE}:ro", "-v", f"{sockets}:{SOCKET_INSIDE}"])


def logs(podman: Podman, name: str) -> str:
    completed = subprocess.run([*podman.command(), "logs", name], capture_output=True, text=True)
    return completed.stdout + completed.stderr


def released_at(podman: Podman, name: str) -> float | None:
    found = re.search(r"released at (\d+\.\d+)", logs(podman, name))
    return float(found.group(1)) if found else None


def test_a_container_killed_in_its_init_releases_its_lease_to_the_next_within_2_s(gate: Path, podman: Podman):
    """vllm-a goes through the gate (its lease) and runs; vllm-b waits for `podman/vllm-a`; vllm-a is killed:
    vllm-b's engine starts within 2 s of vllm-a's end as Podman recorded it."""
    gated(podman, gate, "vllm-a", [*CLIENT, "--", *RELEASED])
    assert wait_for(lambda: released_at(podman, "vllm-a"), timeout=60, interval=0.2), logs(podman, "vllm-a")
    gated(podman, gate, "vllm-b", [*CLIENT, "--", *RELEASED])
    assert wait_for(lambda: "waiting for podman/vllm-a" in logs(podman, "vllm-b"), timeout=60, interval=0.2), \
        logs(podman, "vllm-b")
    podman.cli("kill", "vllm-a")
    assert wait_for(lambda: released_at(podman, "vllm-b"), timeout=30, interval=0.2), logs(podman, "vllm-b")
    ended = podman.inspect("vllm-a", "{{.State.FinishedAt.Unix}}.{{printf \"%09d\" .State.FinishedAt.Nanosecond}}")
    assert 0 <= released_at(podman, "vllm-b") - float(ended) < 2.0, (ended, logs(podman, "vllm-b"))
    assert "waited for podman/vllm-a" in logs(podman, "vllm-b"), logs(podman, "vllm-b")


def test_a_container_that_is_no_watched_engine_and_holds_the_socket_delays_nobody(gate: Path, podman: Podman):
    """toolbox (no vLLM engine: outside --journal.containers) keeps a connection to the socket open and asks
    through the client: it is answered at once and leases nothing, so vllm-a, asking next, goes at once."""
    program = ("import socket, subprocess, sys\n"
               "held = socket.socket(socket.AF_UNIX)\n"
               f"held.connect('{SOCKET_INSIDE}/gate.sock')\n"
               f"subprocess.run({CLIENT!r} + ['--', 'true'])\n"
               "print('asked', flush=True)\n"
               "held.recv(1 << 16)\n"
               "import time; time.sleep(600)\n")
    gated(podman, gate, "toolbox", ["python3", "-c", program])
    assert wait_for(lambda: "asked" in logs(podman, "toolbox"), timeout=60, interval=0.2), logs(podman, "toolbox")
    assert "podman/toolbox is not a watched container" in logs(podman, "toolbox"), logs(podman, "toolbox")
    gated(podman, gate, "vllm-a", [*CLIENT, "--", *RELEASED])
    assert wait_for(lambda: released_at(podman, "vllm-a"), timeout=60, interval=0.2), logs(podman, "vllm-a")
    assert "waited for nothing" in logs(podman, "vllm-a"), logs(podman, "vllm-a")


def test_two_replayed_engines_started_together_in_containers_through_the_gate_do_not_overlap_their_inits(
        tmp_path: Path, dockerd: Dockerd, fake_driver: Path):
    """chat and embedding (tests/vllmunit.py's replay on the fake GPU), Docker containers of the json-file log
    driver started together, each through the gate's client: the service, reading their logs (--logs.docker),
    lets one begin its init only once the other's has ended, as the engines' own events say; both serve."""
    device = tmp_path / "device"
    device.mkdir()
    config, events = device / "ze.conf", device / "events.jsonl"
    SharedDevice.create(config, SIXTEEN_GIB_GPU)
    sockets = tmp_path / "gate"
    sockets.mkdir()
    service = GateRun("service", subprocess.Popen(
        [*GATE, "serve", "--listen", str(sockets / "gate.sock"), "--journal.file",
         str(write_journal(tmp_path / "empty.journal", [])), "--journal.containers", "docker/vllm-*",
         "--logs.docker", "--path.docker", str(dockerd.data_root), "--poll-interval", "50ms"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**fake_driver_env(fake_driver, config), "PATH": "/usr/bin:/bin"}))
    names = [f"vllm-{engine.role}" for engine in (CHAT, EMBEDDING)]
    dockerd.remove(*names)
    try:
        assert wait_for(lambda: service.saw("serving on"), timeout=20), service.lines
        for engine in (CHAT, EMBEDDING):
            command = engine_command(engine, f"vllm-{engine.role}", device_config=config, time_scale=0.1,
                                     events=events, python="python3", requests=0)
            dockerd.run(f"vllm-{engine.role}", [*CLIENT[:2], "--gpu-memory-utilization",
                                                str(engine.gpu_memory_utilization), "--service-timeout", "20s", "--",
                                                *command],
                        log_driver="json-file", volumes=[device], options=[
                            "-v", f"{REPO}:{REPO}:ro", "-v", f"{REPO / 'exporter'}:{PACKAGE_INSIDE}:ro",
                            "-v", f"{sockets}:{SOCKET_INSIDE}", "--env", "PYTHONPATH=/vllm-xpu-gate"])
        assert wait_for(lambda: {record["unit"] for record in read_events(events) if record["event"] == "serving"}
                        == set(names), timeout=90, interval=0.2), (read_events(events), service.lines)
        at = {(record["unit"], record["event"]): record["at"] for record in read_events(events)}
        first, second = sorted(names, key=lambda name: at[name, "started"])
        assert at[first, "serving"] <= at[second, "started"], read_events(events)
        assert not any(record["event"] == "failed" for record in read_events(events)), read_events(events)
        logs = subprocess.run([*dockerd.command(), "logs", second], capture_output=True, text=True).stderr
        assert f"waited for docker/{first}" in logs, logs
    finally:
        dockerd.remove(*names)
        service.stop()
        print("\n".join(service.lines))  # shown when a test fails


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealSystemd]:
    """A booted systemd (a user's service manager for rootless Podman, a journald for its logs)."""
    with RealSystemd(tmp_path_factory.mktemp("rootless-gate")) as booted:
        yield booted


def test_a_rootless_users_container_asks_under_its_own_key_never_as_the_systems(machine: RealSystemd,
                                                                                 rootless_podman: Podman):
    """A user's rootless Podman container vllm-chat (below the user's user@UID.service) asks the service (run
    inside the booted system, where its pids are the container's): the service names it
    `podman/vllm-chat@uid<UID>`, the key the exporter gives it, not root's `podman/vllm-chat`."""
    sockets = machine.shared / "gate"
    sockets.mkdir()
    sockets.chmod(0o755)
    service = GateRun("service", subprocess.Popen(
        [*inside(machine), *GATE, "serve", "--listen", str(machine.inside(sockets / "gate.sock")),
         "--journal.directory", "/run/log/journal", "--journal.containers", "podman/none-*",
         "--path.podman", str(rootless_podman.storage)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    try:
        assert wait_for(lambda: service.saw("serving on"), timeout=30), service.lines
        rootless_podman.remove("vllm-chat")
        rootless_podman.run("vllm-chat", [*CLIENT, "--", "true"], log_driver="journald", options=[
            "-v", f"{REPO / 'exporter'}:{PACKAGE_INSIDE}:ro", "-v", f"{machine.inside(sockets)}:{SOCKET_INSIDE}"])

        def printed() -> str:  # what conmon sent the system journal for the container
            return machine.run("journalctl", "--no-pager", "-o", "cat", "CONTAINER_NAME=vllm-chat").stdout

        assert wait_for(lambda: "released after" in printed(), timeout=60, interval=0.3), printed()
        assert f"podman/vllm-chat@uid{ROOTLESS_UID} is not a watched container" in printed(), printed()
    finally:
        rootless_podman.remove("vllm-chat")
        service.stop()
        print("\n".join(service.lines))  # shown when a test fails
