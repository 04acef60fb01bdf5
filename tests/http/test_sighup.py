"""SIGHUP (`systemctl reload`, ExecReload=/bin/kill -HUP $MAINPID): the exporter process re-reads its web
config file and never dies of it (issue 19: SIGHUP's default action killed it, and Restart=on-failure
left it down). A config that does not load, or would drop what the listener promised, keeps the previous
one in force with one log line."""

from __future__ import annotations

import signal
from pathlib import Path

import bcrypt
import pytest

from exporterproc import RunningExporter
from httpclient import basic
from polling import wait_for
from webconfigs import basic_auth_users, write_web_config

ONLY_THE_EXPORTER = ("--no-collector.levelzero", "--no-collector.journal", "--no-collector.processes")
ALICE, BOB = ("alice", "alice-password"), ("bob", "bob-password")


def hashed(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


def status(exporter: RunningExporter, user: tuple[str, str] | None) -> int:
    return exporter.get("/metrics", headers=basic(*user) if user else None)[0]


def hang_up(exporter: RunningExporter, log_line: str, times: int = 1) -> None:
    """Sends SIGHUP and waits until the exporter has logged `log_line` `times` times in all."""
    exporter.process.send_signal(signal.SIGHUP)
    wait_for(lambda: exporter.stderr.count(log_line) >= times or exporter.process.poll() is not None)
    assert exporter.process.poll() is None, f"SIGHUP killed the exporter:\n{exporter.stderr}"


def test_sighup_without_a_web_config_keeps_serving_and_says_there_is_nothing_to_reload():
    with RunningExporter(ONLY_THE_EXPORTER) as exporter:
        for times in (1, 2):
            hang_up(exporter, "received SIGHUP: no --web.config.file, nothing to reload", times)
            assert status(exporter, None) == 200
        assert exporter.stop() == 0


def test_sighup_puts_a_changed_web_config_in_force(tmp_path: Path):
    config = write_web_config(tmp_path, basic_auth_users({ALICE[0]: hashed(ALICE[1])}))
    with RunningExporter([*ONLY_THE_EXPORTER, "--web.config.file", str(config)]) as exporter:
        assert (status(exporter, ALICE), status(exporter, BOB)) == (200, 401)
        write_web_config(tmp_path, basic_auth_users({BOB[0]: hashed(BOB[1])}))
        hang_up(exporter, f"web config reloaded from {config} on SIGHUP")
        # in force from the first request after the line, without the request having to notice the change
        assert (status(exporter, BOB), status(exporter, ALICE), status(exporter, None)) == (200, 401, 401)
        hang_up(exporter, f"web config reloaded from {config} on SIGHUP", 2)  # unchanged: read again, still fine
        assert status(exporter, BOB) == 200
        assert exporter.stderr.count("web config reloaded") == 2
        assert exporter.stop() == 0


@pytest.mark.parametrize("broken, said", [
    ("basic_auth_users: [alice\n", "web config re-read on SIGHUP but cannot be used, keeping the previous one"),
    ("tls_config: {}\n", "web config re-read on SIGHUP but cannot be used, keeping the previous one"),
    ("", "web config re-read on SIGHUP but the file is empty, keeping the previous one"),
    ("http_server_config: {headers: {X-Frame-Options: deny}}\n",
     "web config re-read on SIGHUP but it would turn basic auth off (restart to change that), keeping the "
     "previous one"),
])
def test_sighup_with_a_broken_web_config_keeps_the_previous_one_and_logs_one_line(tmp_path: Path, broken: str,
                                                                                 said: str):
    config = write_web_config(tmp_path, basic_auth_users({ALICE[0]: hashed(ALICE[1])}))
    with RunningExporter([*ONLY_THE_EXPORTER, "--web.config.file", str(config)]) as exporter:
        logged_before = exporter.stderr.count("\n")
        write_web_config(tmp_path, broken)
        hang_up(exporter, said)
        for _ in range(3):  # later requests see no change since the refused read: no further line
            assert (status(exporter, ALICE), status(exporter, None)) == (200, 401)
        new_lines = exporter.stderr.splitlines()[logged_before:]
        assert [line for line in new_lines if "web config" in line] == [line for line in new_lines if said in line]
        assert len([line for line in new_lines if "web config" in line]) == 1
        assert all("alice" not in line for line in new_lines)  # secrets never in a log line
        # once fixed, SIGHUP puts the fixed file in force
        write_web_config(tmp_path, basic_auth_users({BOB[0]: hashed(BOB[1])}))
        hang_up(exporter, "on SIGHUP")
        wait_for(lambda: f"web config reloaded from {config}" in exporter.stderr)
        assert (status(exporter, BOB), status(exporter, ALICE)) == (200, 401)
        assert exporter.stop() == 0

