"""A test marked `fast` that starts a process or opens a connection fails (tests/fastpure.py): pytest runs
over a small test file with the hooks loaded as `-p fastpure`, in a process of its own; and a fast test of
this run sees the hooks in place."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import fastpure
from fastpure import NOT_PURE

HERE = Path(__file__).resolve().parents[1]

INNER = '''
import os, socket, subprocess, sys, threading
import pytest

@pytest.mark.fast
def test_pure():
    assert sorted([3, 1, 2]) == [1, 2, 3]

@pytest.mark.fast
def test_runs_a_subprocess():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.mark.fast
def test_forks():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)

@pytest.mark.fast
def test_binds_a_socket():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))

@pytest.mark.fast
def test_hides_the_failure_of_a_subprocess_in_a_thread():
    def run():
        try:
            subprocess.run(["/nonexistent"])
        except OSError:
            pass
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()

@pytest.fixture
def process():
    return subprocess.run([sys.executable, "-c", "pass"])

@pytest.mark.fast
def test_uses_a_fixture_that_runs_a_subprocess(process):
    pass

def test_not_fast_may_run_a_subprocess():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.fixture(scope="session")
def engine():
    yield
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # stopped at the session's end

def test_not_fast_uses_a_session_fixture_that_stops_a_process(engine):
    pass

@pytest.mark.fast
def test_pure_and_last_while_the_session_fixture_stops_its_process():
    pass
'''


def test_fast_tests_that_start_processes_or_open_sockets_fail_naming_what_they_did(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "fastpure", "-p", "no:cacheprovider", "-rA",
                             "-W", "ignore::pytest.PytestUnknownMarkWarning", "--rootdir", str(tmp_path),
                             "test_inner.py"],
                            cwd=tmp_path, env={"PYTHONPATH": str(HERE), "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=60)
    lines = result.stdout.splitlines()
    outcomes = {line.split()[1].split("::")[-1]: line.split()[0] for line in lines
                if line.startswith(("PASSED ", "FAILED ", "ERROR "))}
    assert outcomes == {
        "test_pure": "PASSED", "test_not_fast_may_run_a_subprocess": "PASSED",
        "test_runs_a_subprocess": "FAILED", "test_forks": "FAILED", "test_binds_a_socket": "FAILED",
        "test_hides_the_failure_of_a_subprocess_in_a_thread": "FAILED",
        "test_uses_a_fixture_that_runs_a_subprocess": "ERROR",
        "test_not_fast_uses_a_session_fixture_that_stops_a_process": "PASSED",
        "test_pure_and_last_while_the_session_fixture_stops_its_process": "PASSED",
    }, result.stdout
    assert f"{NOT_PURE} a subprocess" in result.stdout
    assert f"{NOT_PURE} a fork" in result.stdout
    assert f"{NOT_PURE} a socket bind" in result.stdout


@pytest.mark.fast
def test_a_fast_test_runs_with_processes_and_sockets_watched() -> None:
    # conftest.py takes the hooks: without them `-m fast` would promise purity without checking it.
    assert fastpure.watching()


def test_a_test_not_marked_fast_runs_unwatched() -> None:
    assert not fastpure.watching()
