"""--web.systemd-socket (vllm_xpu_exporter.http.activation): the exporter as a process started the way systemd
starts a socket-activated service: the listening socket as file descriptor 3, LISTEN_FDS=1 and LISTEN_PID its
own pid (a small launcher sets them, then execs the exporter in its place). A socket that is not a listening
TCP one, or variables meant for another process, stop the start with one line."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Sequence

import pytest

from exporterproc import RunningExporter
from httpclient import request
from vllm_xpu_exporter.http.activation import ActivationError, systemd_sockets

NO_COLLECTORS = ("--no-collector.levelzero", "--no-collector.journal", "--no-collector.processes")


# fd `passed` becomes 3 (inheritable), systemd's variables are set, then the exporter replaces this process
_AS_SYSTEMD_PASSES = """
import os, sys
passed, listen_pid = int(sys.argv[1]), sys.argv[2]
os.dup2(passed, 3)
if passed != 3:
    os.close(passed)
os.environ.update(LISTEN_PID=str(os.getpid()) if listen_pid == "self" else listen_pid, LISTEN_FDS="1")
os.execv(sys.executable, [sys.executable, *sys.argv[3:]])
"""


def exporter_command(fd: int, listen_pid: str = "self") -> list[str]:
    return [sys.executable, "-c", _AS_SYSTEMD_PASSES, str(fd), listen_pid, "-m", "vllm_xpu_exporter",
            "--web.systemd-socket"]


def test_the_exporter_serves_the_socket_systemd_passes_and_binds_nothing_itself():
    with socket.socket() as passed, socket.socket() as unused:
        passed.bind(("127.0.0.1", 0))
        passed.listen()
        unused.bind(("127.0.0.1", 0))  # a port nobody listens on: --web.listen-address must not take it
        own_address = f"127.0.0.1:{unused.getsockname()[1]}"
        unused.close()
        port = passed.getsockname()[1]
        with RunningExporter(NO_COLLECTORS, listen=own_address, command=exporter_command(passed.fileno()),
                             pass_fds=(passed.fileno(),)) as exporter:
            passed.close()  # the exporter's copy alone serves
            status, _, body = request("127.0.0.1", port)
            assert exporter.base_url == f"http://127.0.0.1:{port}"
            with socket.socket() as probe:
                assert probe.connect_ex(("127.0.0.1", int(own_address.rsplit(":", 1)[1]))) != 0
    assert status == 200 and b"xpu_exporter_build_info" in body


def run_failing(command: Sequence[str], fd: int) -> subprocess.CompletedProcess:
    return subprocess.run([*command, *NO_COLLECTORS], capture_output=True, text=True, timeout=30, pass_fds=(fd,))


@pytest.mark.parametrize("kind, expected", [
    ("udp", "file descriptor 3 is not a listening TCP socket"),
    ("not listening", "file descriptor 3 is not a listening TCP socket"),
    ("unix", "file descriptor 3 is not a listening TCP socket"),
    ("file", "file descriptor 3 is not a socket"),
])
def test_a_passed_descriptor_that_is_no_listening_tcp_socket_stops_the_start_with_one_line(tmp_path, kind, expected):
    if kind == "file":
        with open(tmp_path / "f", "w") as file:
            result = run_failing(exporter_command(file.fileno()), file.fileno())
    else:
        family, type_ = {"udp": (socket.AF_INET, socket.SOCK_DGRAM),
                         "not listening": (socket.AF_INET, socket.SOCK_STREAM),
                         "unix": (socket.AF_UNIX, socket.SOCK_STREAM)}[kind]
        with socket.socket(family, type_) as sock:
            if kind == "unix":
                sock.bind(str(tmp_path / "s"))
                sock.listen()
            result = run_failing(exporter_command(sock.fileno()), sock.fileno())
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vllm-xpu-exporter: error: --web.systemd-socket: {expected}"), \
        result.stderr


def test_sockets_meant_for_another_process_are_not_taken():
    with socket.socket() as passed:
        passed.bind(("127.0.0.1", 0))
        passed.listen()
        result = run_failing(exporter_command(passed.fileno(), listen_pid="1"), passed.fileno())
    assert result.returncode == 1
    assert "the sockets systemd passed are for process 1, not this one" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.fast
def test_without_systemds_variables_there_is_nothing_to_take_and_they_are_removed_once_read():
    with pytest.raises(ActivationError, match="LISTEN_FDS is not set"):
        systemd_sockets({})
    environ = {"LISTEN_PID": "1", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "x", "OTHER": "kept"}
    with pytest.raises(ActivationError, match="for process 1"):
        systemd_sockets(environ)
    assert environ == {"OTHER": "kept"}
