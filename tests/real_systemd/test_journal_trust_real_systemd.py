"""On a real journald (systemd 252 booted by tests/realsystemd.py): what a sender can and cannot choose of
a container's journal record. `nobody` with `logger --journald`, and a process of `nobody` that renamed
itself `conmon` (prctl) and writes to journald's socket, forge a failed init, a never-ending init and a
Podman death of root's container: all ignored and counted. The engines' own records (stand-ins installed
where the engines live, so journald stamps `_COMM`/`_EXE` as for them: a copy of logger as
/usr/bin/dockerd run by docker.service, as /usr/bin/conmon and /usr/bin/podman run as root and as uid 1000)
are believed, root's and uid 1000's Podman containers of one name kept apart."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from polling import wait_for
from realsystemd import RealSystemd
from vllm_xpu_exporter.parsers.vllm import FailureReason
from vllm_xpu_exporter.sources.journal import open_journal
from vllm_xpu_exporter.sources.journal import JournalSelection
from vllm_xpu_exporter.runtimes import podman
from vllm_xpu_exporter.sources.journal import trust
from vllm_xpu_exporter.sources.logs.follower import LogFollower

VERSION = "(APIServer pid=7) INFO 05-12 10:11:13 [api_server.py:1895] vLLM API server version 0.24.0"
KV_TOO_SMALL = ("(EngineCore pid=9) ValueError: To serve at least one request with the model's max seq len "
                "(131072), 3.36 GiB KV cache is needed, which is larger than the available KV cache memory "
                "(2.13 GiB).")
INIT_DONE = ("(EngineCore pid=9) INFO 05-12 10:11:40 [core.py:210] init engine (profile, create kv cache, "
             "warmup model) took 12.50 s")
ROOTS_ID = "a" * 64
USERS_ID = "b" * 64
# Sends one record to journald's socket, optionally renamed first (prctl PR_SET_NAME), and stays alive a
# moment: journald reads _COMM and _EXE from /proc after the record arrives, and leaves them out for a sender
# already gone.
SEND = r"""
import ctypes, socket, sys, time
if sys.argv[1]:
    ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.sendto("\n".join(sys.argv[2:]).encode() + b"\n", "/run/systemd/journal/socket")
time.sleep(0.3)
"""
FLOOD = r"""
import json, socket
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
for fields in json.load(open("/tmp/flood.json")):
    sock.sendto("\n".join(fields).encode() + b"\n", "/run/systemd/journal/socket")
"""
PYTHON = os.path.realpath("/usr/bin/python3")  # the Debian interpreter the booted image runs


def container_fields(name: str, message: str, container: str) -> list[str]:
    return [f"MESSAGE={message}", f"CONTAINER_NAME={name}", f"CONTAINER_ID_FULL={container}",
            f"CONTAINER_ID={container[:12]}", f"SYSLOG_IDENTIFIER={name}"]


def died_fields(name: str, container: str) -> list[str]:
    return [f"MESSAGE=container died {container}", "SYSLOG_IDENTIFIER=podman", "PODMAN_EVENT=died",
            "PODMAN_TYPE=container", f"PODMAN_NAME={name}", f"PODMAN_ID={container}", "PODMAN_EXIT_CODE=137"]


class Senders:
    def __init__(self, machine: RealSystemd) -> None:
        self.machine = machine
        for engine in ("dockerd", "conmon", "podman"):  # journald stamps _EXE=/usr/bin/<engine>, _COMM=<engine>
            target = machine.host_path(f"/usr/bin/{engine}")
            shutil.copy(PYTHON, target)
            os.chmod(target, 0o755)
        machine.write_file("/tmp/send.py", SEND)
        os.chmod(machine.host_path("/tmp/send.py"), 0o644)

    def engine(self, executable: str, fields: list[str], *, uid: int = 0, unit: str | None = None) -> None:
        """The engine's executable sends the record, as root in `unit` or as `uid` in a transient service."""
        argv = [f"/usr/bin/{executable}", "/tmp/send.py", "", *fields]
        if unit is not None:
            quoted = " ".join(f'"{arg}"' for arg in argv)
            self.machine.write_unit(unit, f"[Service]\nType=oneshot\nExecStart={quoted}\n")
            self.machine.daemon_reload()
            self.machine.systemctl("start", unit)
            return
        self.machine.run("systemd-run", "--quiet", "--wait", f"--uid={uid}", *argv)

    def nobody_logger(self, fields: list[str]) -> None:
        self.machine.run("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "logger", "--journald",
                         input="\n".join(fields) + "\n")

    def nobody_flood(self, records: list[list[str]]) -> None:
        """nobody sends many records at once (one process)."""
        self.machine.write_file("/tmp/flood.json", json.dumps(records))
        os.chmod(self.machine.host_path("/tmp/flood.json"), 0o644)
        self.machine.run("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PYTHON, "-c", FLOOD)

    def nobody_renamed_conmon(self, fields: list[str]) -> None:
        self.machine.run("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                         PYTHON, "/tmp/send.py", "conmon", *fields)


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealSystemd]:
    if os.geteuid() != 0:
        pytest.fail("booting a real systemd needs root (tests/run runs as root)")
    # docker.service is the test's own stand-in (Senders.engine); where the image has Debian's docker.io enabled,
    # the boot would mask that name (and Debian's unit does not start: its docker.socket stays masked)
    with RealSystemd(tmp_path_factory.mktemp("trust")) as booted:
        yield booted


def fold(machine: RealSystemd):
    machine.sync_journal()
    follower = LogFollower(JournalSelection(directory=str(machine.journal_directory),
                                        container_globs=("*vllm*",), boot="all"),
                           open_reader=open_journal, source="journal")
    follower.start()
    try:
        state = wait_for(lambda: (s := follower.state()).error is None and s, timeout=30)
        assert state, follower.state().error
        return state, {view.unit: view for view in state.views}
    finally:
        follower.stop()


def test_forged_container_records_are_ignored_and_the_engines_believed(machine: RealSystemd):
    senders = Senders(machine)
    forgers = (senders.nobody_logger, senders.nobody_renamed_conmon)
    # Forged by nobody, as logger and as a process renamed conmon: a failed init of a container that does not
    # exist, an init that never ends; then 70 forged names.
    for forge in forgers:
        forge(container_fields("vllm-ghost", VERSION, "d" * 64))
        forge(container_fields("vllm-ghost", KV_TOO_SMALL, "d" * 64))
        forge(container_fields("vllm-never", VERSION, "e" * 64))
    senders.nobody_flood([container_fields(f"vllm-flood{n}", VERSION, f"{n:064x}") for n in range(70)])
    # A copy of dockerd run by nobody, and root's dockerd outside docker.service.
    senders.engine("dockerd", container_fields("vllm-ghost", KV_TOO_SMALL, "d" * 64), uid=65534)
    senders.engine("dockerd", container_fields("vllm-ghost", KV_TOO_SMALL, "d" * 64))
    # A real unit starts after the never-ending forged init and the flood: its series are there, and it
    # overlapped nothing.
    machine.write_file("/tmp/real-unit.sh", f"echo '{VERSION}'\necho '{INIT_DONE}'\n")
    machine.write_unit("vllm-xpu-chat.service", "[Service]\nType=oneshot\nExecStart=/bin/sh /tmp/real-unit.sh\n")
    machine.daemon_reload()
    machine.systemctl("start", "vllm-xpu-chat.service")
    # journald stamps a unit's output when it reads the stream, which may be after records sent to its socket
    # later: the engines send theirs once the unit's init end is in, so that nothing of theirs overlaps it
    assert wait_for(lambda: machine.sync_journal() or any(
        entry.get("MESSAGE") == INIT_DONE for entry in machine.journal("vllm-xpu-chat.service")), timeout=30)
    # The engines: dockerd's failed init of docker/vllm-chat; root's and uid 1000's Podman vllm-embed.
    senders.engine("dockerd", container_fields("vllm-chat", VERSION, "c" * 64), unit="docker.service")
    senders.engine("dockerd", container_fields("vllm-chat", KV_TOO_SMALL, "c" * 64), unit="docker.service")
    senders.engine("conmon", container_fields("vllm-embed", VERSION, ROOTS_ID))
    senders.engine("conmon", container_fields("vllm-embed", VERSION, USERS_ID), uid=1000)
    senders.engine("podman", died_fields("vllm-embed", USERS_ID), uid=1000)
    # Forged deaths of root's real Podman container (its id is readable in /proc/PID/cgroup).
    for forge in forgers:
        forge(died_fields("vllm-embed", ROOTS_ID))

    forged = machine.journal(args=["CONTAINER_NAME=vllm-ghost"])
    # A sender chooses its _COMM, not its _UID (logger may be gone before journald reads its _COMM).
    assert {(entry.get("_COMM", "logger"), entry["_UID"]) for entry in forged} == {
        ("logger", "65534"), ("conmon", "65534"), ("dockerd", "65534"), ("dockerd", "0")}

    state, views = fold(machine)
    assert sorted(views) == ["docker/vllm-chat", "podman/vllm-embed", "podman/vllm-embed@uid1000",
                             "vllm-xpu-chat.service"]
    assert views["vllm-xpu-chat.service"].starts == 1 and views["vllm-xpu-chat.service"].overlaps == 0
    assert views["docker/vllm-chat"].failures[FailureReason.KV_CACHE_TOO_SMALL] == 1
    assert views["podman/vllm-embed"].failures[FailureReason.OTHER] == 0
    assert views["podman/vllm-embed"].initialising_since_usec is not None
    assert views["podman/vllm-embed@uid1000"].initialising_since_usec is None  # its own podman's death ended it
    assert state.rejected == {trust.REJECTED_CONTAINER_SENDER: 3 * 2 + 2 + 70, podman.REJECTED_PODMAN_EVENT: 2}
