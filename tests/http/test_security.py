"""Security of the exporter as operators run it: a real `python -m vllm_xpu_exporter` process with a web config
file, scraped by real TLS clients (Python's ssl module and curl).

- TLS with a certificate from the trusted CA; a client that does not trust the server's CA; client
  certificates required (none, one from another CA, the right one); minimum TLS version.
- Basic auth: no credentials, a wrong password, an unknown user, the right password.
- Plain HTTP to the TLS port.
- An invalid web config file is a start-up error: exit status 2 and one line on stderr.
- No secret (password, Authorization header, bcrypt hash, private key) ever appears in the logs, at
  any level, in either log format, nor in start-up errors.
- Label values taken from the journal (unit names, vLLM model names and versions with quotes,
  backslashes, newlines, braces and bytes that are not UTF-8) cannot break the exposition format.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import logging
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import bcrypt
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from certs import Pki, make_encrypted_key, make_self_signed
from exporterproc import REPO, RunningExporter
from httpclient import basic, client_context, curl, request, send_huge_headers
from journalgen import Clock, JournalEntrySpec, random_boot_id, unit_output, unit_starting, write_journal
from polling import wait_for
from taskslimit import TaskLimit, cgroup_of
from webconfigs import basic_auth_users, tls_server_config, write_web_config

NO_COLLECTORS = ("--no-collector.levelzero", "--no-collector.processes", "--no-collector.journal")
USER = "prometheus"
PASSWORD = "Sup3r-s3cret-scrape-passw0rd"
WRONG_PASSWORD = "Wr0ng-guess-of-the-passw0rd"
# Cost 4: bcrypt's minimum, to keep the tests fast; the exporter accepts any cost.
PASSWORD_HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
USERS = basic_auth_users({USER: PASSWORD_HASH})
OPENMETRICS = "application/openmetrics-text;version=1.0.0"


@contextmanager
def exporter_with(directory: Path, config_text: str, *args: str) -> Iterator[RunningExporter]:
    """The exporter with a web config of the given text (and no collectors unless `args` say otherwise)."""
    config = write_web_config(directory, config_text)
    with RunningExporter(["--web.config.file", str(config), *(args or NO_COLLECTORS)]) as exporter:
        yield exporter


@pytest.fixture
def start(tmp_path: Path) -> Iterator:
    """Starts exporters for one test; stops them after it."""
    with ExitStack() as stack:
        yield lambda config_text, *args: stack.enter_context(exporter_with(tmp_path, config_text, *args))


def port_of(exporter: RunningExporter) -> int:
    return urlsplit(exporter.base_url).port


def https_get(exporter: RunningExporter, context: ssl.SSLContext, path: str = "/metrics",
              headers: Mapping[str, str] | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    return request("localhost", port_of(exporter), path, headers=headers, context=context)


def http_get(exporter: RunningExporter, path: str = "/metrics",
             headers: Mapping[str, str] | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    return request("127.0.0.1", port_of(exporter), path, headers=headers)



def assert_serves_metrics(status: int, body: bytes) -> None:
    assert status == 200, body
    names = {family.name for family in parse_text(body.decode())}
    assert "xpu_exporter_build_info" in names


# --- TLS ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_exporter(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[RunningExporter]:
    with exporter_with(tmp_path_factory.mktemp("tls"), tls_server_config(pki)) as exporter:
        yield exporter


def test_tls_with_a_certificate_of_the_trusted_ca_serves_metrics(tls_exporter, pki):
    exporter = tls_exporter
    assert exporter.base_url.startswith("https://")
    status, _, body = https_get(exporter, client_context(pki.ca_cert))
    assert_serves_metrics(status, body)
    result = curl("--cacert", str(pki.ca_cert), f"https://localhost:{port_of(exporter)}/metrics")
    assert result.returncode == 0 and "xpu_exporter_build_info" in result.stdout, result.stderr


def test_a_client_that_does_not_know_the_servers_ca_refuses_it_and_the_server_carries_on(tls_exporter, pki):
    exporter = tls_exporter
    with pytest.raises(ssl.SSLCertVerificationError):
        https_get(exporter, client_context(pki.rogue_ca_cert))
    result = curl("--cacert", str(pki.rogue_ca_cert), f"https://localhost:{port_of(exporter)}/metrics")
    assert result.returncode == 60, result.stderr  # CURLE_PEER_FAILED_VERIFICATION
    assert_serves_metrics(*https_get(exporter, client_context(pki.ca_cert))[::2])


@pytest.fixture(scope="module")
def mtls_exporter(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[RunningExporter]:
    config = tls_server_config(pki, client_auth_type="RequireAndVerifyClientCert")
    with exporter_with(tmp_path_factory.mktemp("mtls"), config) as exporter:
        yield exporter


def test_required_client_certificate_missing_is_refused(mtls_exporter, pki):
    with pytest.raises((ssl.SSLError, ConnectionError)):
        https_get(mtls_exporter, client_context(pki.ca_cert))
    result = curl("--cacert", str(pki.ca_cert), f"https://localhost:{port_of(mtls_exporter)}/metrics")
    assert result.returncode != 0 and "xpu_exporter" not in result.stdout


def test_client_certificate_of_an_unknown_ca_is_refused(mtls_exporter, pki):
    context = client_context(pki.ca_cert, pki.rogue_client)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        https_get(mtls_exporter, context)


def test_client_certificate_of_the_trusted_ca_is_admitted(mtls_exporter, pki):
    status, _, body = https_get(mtls_exporter, client_context(pki.ca_cert, pki.client))
    assert_serves_metrics(status, body)
    result = curl("--cacert", str(pki.ca_cert), "--cert", str(pki.client.cert), "--key", str(pki.client.key),
                  f"https://localhost:{port_of(mtls_exporter)}/metrics")
    assert result.returncode == 0 and "xpu_exporter_build_info" in result.stdout, result.stderr


def test_minimum_tls_version_refuses_older_clients(start, pki):
    exporter = start(tls_server_config(pki, min_version="TLS13"))
    with pytest.raises(ssl.SSLError):
        https_get(exporter, client_context(pki.ca_cert, maximum=ssl.TLSVersion.TLSv1_2))
    assert_serves_metrics(*https_get(exporter, client_context(pki.ca_cert))[::2])


def test_plain_http_to_the_tls_port_gets_400_and_tls_still_works(tls_exporter, pki):
    exporter = tls_exporter
    status, _, body = http_get(exporter)
    assert status == 400
    assert body == b"Client sent an HTTP request to an HTTPS server.\n"
    result = curl("--write-out", "%{http_code}", "--output", "/dev/null", f"http://127.0.0.1:{port_of(exporter)}/")
    assert result.stdout == "400"
    assert_serves_metrics(*https_get(exporter, client_context(pki.ca_cert))[::2])


def test_garbage_instead_of_a_tls_handshake_does_not_stop_the_server(tls_exporter, pki):
    exporter = tls_exporter
    with socket.create_connection(("127.0.0.1", port_of(exporter)), timeout=5) as connection:
        connection.sendall(b"\x16\x03\x01\x00\x05garbage-that-is-no-client-hello")
        connection.settimeout(5)
        try:
            connection.recv(1024)
        except (ConnectionError, TimeoutError):
            pass
    assert_serves_metrics(*https_get(exporter, client_context(pki.ca_cert))[::2])


# --- basic auth -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningExporter]:
    with exporter_with(tmp_path_factory.mktemp("auth"), USERS) as exporter:
        yield exporter


@pytest.mark.parametrize("path", ["/metrics", "/", "/-/healthy"])
def test_no_credentials_get_401_with_a_basic_challenge(auth_exporter, path):
    status, headers, body = http_get(auth_exporter, path)
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Basic")
    assert b"xpu_" not in body


@pytest.mark.parametrize("credentials", [(USER, WRONG_PASSWORD), ("someone-else", PASSWORD), (USER, "")],
                         ids=["wrong-password", "unknown-user", "empty-password"])
def test_wrong_credentials_get_401(auth_exporter, credentials):
    status, _, body = http_get(auth_exporter, headers=basic(*credentials))
    assert status == 401 and b"xpu_" not in body


@pytest.mark.parametrize("header", ["Bearer abc", "Basic !!!not-base64!!!", "Basic " + base64.b64encode(b"no-colon").decode()])
def test_malformed_authorization_gets_401(auth_exporter, header):
    status, _, _ = http_get(auth_exporter, headers={"Authorization": header})
    assert status == 401


def test_the_right_password_gets_metrics(auth_exporter):
    assert_serves_metrics(*http_get(auth_exporter, headers=basic(USER, PASSWORD))[::2])
    result = curl("--user", f"{USER}:{PASSWORD}", f"http://127.0.0.1:{port_of(auth_exporter)}/metrics")
    assert "xpu_exporter_build_info" in result.stdout


def test_basic_auth_over_mutual_tls(start, pki):
    exporter = start(tls_server_config(pki, client_auth_type="RequireAndVerifyClientCert") + USERS)
    context = client_context(pki.ca_cert, pki.client)
    assert https_get(exporter, context)[0] == 401
    assert https_get(exporter, context, headers=basic(USER, WRONG_PASSWORD))[0] == 401
    assert_serves_metrics(*https_get(exporter, context, headers=basic(USER, PASSWORD))[::2])


# --- web config rewritten under a running exporter -----------------------------------------


def tls_and_auth(pki: Pki) -> str:
    return tls_server_config(pki) + USERS


def wait_for_reload_outcome(exporter: RunningExporter, previous_log: str, pki: Pki) -> None:
    """Makes a request (a change is noticed on a request) and waits until the exporter logged what it
    made of the changed file: reloaded, or kept the previous config."""
    for get in (lambda: http_get(exporter), lambda: https_get(exporter, client_context(pki.ca_cert))):
        try:
            get()
        except (OSError, http.client.HTTPException):
            pass
    assert wait_for(lambda: exporter.stderr.count("web config") > previous_log.count("web config")), exporter.stderr


def assert_tls_and_auth_hold(exporter: RunningExporter, pki: Pki) -> None:
    status, _, body = http_get(exporter)
    assert status == 400 and b"xpu_" not in body
    assert https_get(exporter, client_context(pki.ca_cert))[0] == 401
    assert_serves_metrics(*https_get(exporter, client_context(pki.ca_cert), headers=basic(USER, PASSWORD))[::2])


def test_truncating_the_web_config_keeps_tls_and_basic_auth(start, tmp_path, pki):
    exporter = start(tls_and_auth(pki))
    log = exporter.stderr
    (tmp_path / "web-config.yml").write_text("")  # : > web.yml
    wait_for_reload_outcome(exporter, log, pki)
    assert_tls_and_auth_hold(exporter, pki)
    assert "level=error" in exporter.stderr and "the file is empty" in exporter.stderr


def test_rewriting_the_web_config_in_a_loop_never_lets_an_unauthenticated_request_through(start, tmp_path, pki):
    """`while :; do cat good > web.yml; sleep 0.02; done` while a client without TLS nor credentials asks
    for metrics as fast as it can: the file is empty for a moment on every rewrite."""
    good = tls_and_auth(pki)
    exporter = start(good)
    path = tmp_path / "web-config.yml"
    stop = threading.Event()

    def rewrite_loop() -> None:
        while not stop.is_set():
            with open(path, "w") as file:  # truncates, as the shell's > does
                time.sleep(0.001)
                file.write(good)
            time.sleep(0.02)

    writer = threading.Thread(target=rewrite_loop, daemon=True)
    writer.start()
    answers: dict[int, int] = {}
    deadline = time.monotonic() + 4
    try:
        while time.monotonic() < deadline:
            for get in (lambda: http_get(exporter), lambda: https_get(exporter, client_context(pki.ca_cert))):
                try:
                    status = get()[0]
                except (OSError, http.client.HTTPException):
                    status = 0  # refused or reset: not served either
                answers[status] = answers.get(status, 0) + 1
    finally:
        stop.set()
        writer.join(5)
    assert answers.get(200, 0) == 0, answers
    assert sum(answers.values()) > 50, answers
    time.sleep(0.1)
    assert_tls_and_auth_hold(exporter, pki)


def test_a_password_replaced_while_a_slow_config_loads_is_applied(start, tmp_path):
    """A config with a costly bcrypt hash takes a while to load; the file is replaced during the load:
    the replacement must be applied (not mistaken for what was loaded), so the old password stops working."""
    exporter = start(USERS)
    path = tmp_path / "web-config.yml"
    slow_hash = bcrypt.hashpw(WRONG_PASSWORD.encode(), bcrypt.gensalt(14)).decode()
    new_password = "N3w-passw0rd-after-the-rotation"
    new_hash = bcrypt.hashpw(new_password.encode(), bcrypt.gensalt(4)).decode()
    path.write_text(basic_auth_users({USER: slow_hash}))
    trigger = threading.Thread(target=lambda: http_get(exporter, headers=basic(USER, PASSWORD)), daemon=True)
    trigger.start()  # the request that notices the change
    time.sleep(0.3)
    path.write_text(basic_auth_users({USER: new_hash, "someone": new_hash}))
    assert wait_for(lambda: http_get(exporter, headers=basic(USER, new_password))[0] == 200, timeout=15), \
        exporter.stderr
    assert http_get(exporter, headers=basic(USER, PASSWORD))[0] == 401
    trigger.join(15)


def test_a_web_config_change_does_not_hold_up_requests(start, tmp_path):
    """A change used to compute a decoy bcrypt hash of the highest configured cost under the reload lock,
    blocking every request meanwhile (3.4 s at cost 15, 13 s at 17: past Prometheus's scrape timeout)."""
    exporter = start(USERS)
    assert http_get(exporter, headers=basic(USER, PASSWORD))[0] == 200
    costly_hash = bcrypt.gensalt(16).decode() + "x" * 31  # well-formed; its password is never tried here
    (tmp_path / "web-config.yml").write_text(basic_auth_users({USER: PASSWORD_HASH, "operator": costly_hash}))
    slowest = 0.0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        started = time.monotonic()
        assert http_get(exporter, headers=basic(USER, PASSWORD))[0] == 200
        slowest = max(slowest, time.monotonic() - started)
    assert slowest < 1.0, f"a request took {slowest:.1f} s"
    assert "web config reloaded" in exporter.stderr


# --- hostile clients ------------------------------------------------------------------------

# The shipped unit's limits (packaging/vllm-xpu-exporter.service): MemoryMax=512M, TasksMax=64.
TASKS_MAX = 64
PEAK_RSS_LIMIT_MB = 200


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set size (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


@pytest.mark.parametrize("pace", ["at-once", "slowly"])
def test_forty_clients_sending_huge_headers_leave_the_peak_rss_under_200_mb(start, pace):
    """Headers are read before authentication: 40 clients at once, each sending 6 MB of headers (all of
    it at once, or 64 KiB every 20 ms so that they are all in flight together)."""
    exporter = start(USERS)
    send_huge_headers("127.0.0.1", port_of(exporter), clients=40, slowly=pace == "slowly")
    peak = peak_rss_mb(exporter.process.pid)
    assert peak < PEAK_RSS_LIMIT_MB, f"peak RSS {peak:.0f} MB"
    assert_serves_metrics(*http_get(exporter, headers=basic(USER, PASSWORD))[::2])
    assert "Traceback" not in exporter.stderr


def test_idle_and_slowloris_connections_do_not_lock_scrapes_out_under_tasks_max(task_limit: TaskLimit):
    """200 idle TCP connections and 100 that send a header line every half second (never finishing their
    request), under TasksMax=64 emulated with a pids cgroup: scrapes keep being answered."""
    task_limit.set_max(TASKS_MAX)
    command = task_limit.wrap([sys.executable, "-m", "vllm_xpu_exporter"])
    with RunningExporter(list(NO_COLLECTORS), command=command) as exporter:
        assert task_limit.path.name in cgroup_of(exporter.process.pid)
        port = port_of(exporter)
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(200)]
        slow = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(100)]
        stop = threading.Event()

        def trickle() -> None:
            for sock in slow:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: exporter\r\n")
            while not stop.wait(0.5):
                for sock in slow:
                    try:
                        sock.sendall(b"X-Still-There: yes\r\n")
                    except OSError:
                        pass

        trickler = threading.Thread(target=trickle, daemon=True)
        trickler.start()
        try:
            time.sleep(1)
            statuses = []
            for _ in range(20):
                try:
                    statuses.append(http_get(exporter)[0])
                except (OSError, http.client.HTTPException) as error:
                    statuses.append(type(error).__name__)
            assert statuses == [200] * 20, statuses
            assert exporter.process.poll() is None
            assert task_limit.events_max() == 0, "a thread was refused for the task limit"
        finally:
            stop.set()
            trickler.join(5)
            for sock in idle + slow:
                sock.close()
        assert "Traceback" not in exporter.stderr, exporter.stderr[-3000:]


# --- invalid web config files ---------------------------------------------------------------

PLAINTEXT_PASSWORD = "hunter2-plaintext-not-a-hash"
KEY_MARKER = "TOP-SECRET-KEY-MATERIAL-7f3a9c"


def invalid_configs(directory: Path, pki: Pki) -> dict[str, str]:
    garbage_key = directory / "garbage.key"
    garbage_key.write_text(f"-----BEGIN PRIVATE KEY-----\n{KEY_MARKER}\n-----END PRIVATE KEY-----\n")
    other = make_self_signed(directory / "other", "other")
    encrypted = make_encrypted_key(directory, pki.server.key)
    return {
        "not-yaml": "tls_server_config: [cert_file: {\n",
        "not-a-mapping": "- just\n- a list\n",
        "unknown-key": USERS + "basic_auth_user: typo\n",
        "missing-cert-file": f"tls_server_config:\n  cert_file: {directory}/nope.crt\n  key_file: {pki.server.key}\n",
        "cert-without-key": f"tls_server_config:\n  cert_file: {pki.server.cert}\n",
        "key-of-another-cert": f"tls_server_config:\n  cert_file: {other.cert}\n  key_file: {pki.server.key}\n",
        "garbage-key": f"tls_server_config:\n  cert_file: {pki.server.cert}\n  key_file: {garbage_key}\n",
        "encrypted-key": f"tls_server_config:\n  cert_file: {pki.server.cert}\n  key_file: {encrypted}\n",
        "unknown-client-auth-type": tls_server_config(pki, client_auth_type="Sometimes"),
        "unknown-tls-version": tls_server_config(pki, min_version="TLS99"),
        "plaintext-password": f"basic_auth_users:\n  {USER}: {PLAINTEXT_PASSWORD}\n",
        "nested-5000-deep": "".join(" " * depth + "k:\n" for depth in range(5000)),
        "flow-nested-5000-deep": "tls_server_config: " + "[" * 5000 + "]" * 5000 + "\n",
    }


INVALID_CONFIG_NAMES = ["not-yaml", "not-a-mapping", "unknown-key", "missing-cert-file", "cert-without-key",
                        "key-of-another-cert", "garbage-key", "encrypted-key",
                        "unknown-client-auth-type", "unknown-tls-version", "plaintext-password", "nested-5000-deep",
                        "flow-nested-5000-deep"]


def run_to_exit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vllm_xpu_exporter", "--web.listen-address", "127.0.0.1:0", *args],
                          capture_output=True, text=True, timeout=30, cwd=REPO, env={})


@pytest.mark.parametrize("name", INVALID_CONFIG_NAMES)
def test_an_invalid_web_config_is_a_one_line_start_up_error_with_status_2(tmp_path, pki, name):
    config = write_web_config(tmp_path, invalid_configs(tmp_path, pki)[name])
    result = run_to_exit("--web.config.file", str(config), *NO_COLLECTORS)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vllm-xpu-exporter: error: --web.config.file:"), result.stderr
    assert "Traceback" not in result.stderr
    for secret in (PLAINTEXT_PASSWORD, KEY_MARKER, PASSWORD_HASH, *secret_key_lines(pki)):
        assert secret not in result.stderr


@pytest.mark.parametrize("path", ["missing.yml", "."], ids=["missing-file", "a-directory"])
def test_an_unreadable_web_config_file_is_a_one_line_start_up_error(tmp_path, path):
    result = run_to_exit("--web.config.file", str(tmp_path / path), *NO_COLLECTORS)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and "--web.config.file" in result.stderr


def test_a_valid_web_config_is_no_start_up_error(start, pki):
    """The invalid cases above differ from a working configuration by their fault only."""
    exporter = start(tls_server_config(pki, client_auth_type="RequireAndVerifyClientCert", min_version="TLS12") + USERS)
    assert exporter.process.poll() is None


# --- no secret in the logs ------------------------------------------------------------------


def secret_key_lines(pki: Pki) -> list[str]:
    """The base64 body lines of every private key (any one of them in a log would leak key material)."""
    lines = []
    for key in (pki.server.key, pki.client.key, pki.rogue_client.key):
        lines += [line for line in key.read_text().splitlines() if line and not line.startswith("-----")]
    assert lines
    return lines


def secrets(pki: Pki) -> list[str]:
    return [PASSWORD, WRONG_PASSWORD, PASSWORD_HASH, PASSWORD_HASH.split("$")[-1],
            basic(USER, PASSWORD)["Authorization"].split()[1], basic(USER, WRONG_PASSWORD)["Authorization"].split()[1],
            *secret_key_lines(pki)]


@pytest.mark.parametrize("log_format", ["logfmt", "json"])
def test_no_secret_reaches_the_logs_at_debug_level(start, pki, log_format):
    """Debug is the most verbose level (every other level logs a subset of it): every request kind that
    touches a secret is made, with every collector on, and the whole of stderr is searched."""
    exporter = start(tls_server_config(pki, client_auth_type="VerifyClientCertIfGiven") + USERS,
                     "--log.level", "debug", "--log.format", log_format)
    trusted = client_context(pki.ca_cert)
    assert https_get(exporter, trusted, headers=basic(USER, PASSWORD))[0] == 200
    assert https_get(exporter, trusted, headers=basic(USER, WRONG_PASSWORD))[0] == 401
    assert https_get(exporter, trusted, headers={"Authorization": f"Basic {PASSWORD}"})[0] == 401
    assert https_get(exporter, trusted, "/nothing-here", basic(USER, PASSWORD))[0] == 404
    with_client = client_context(pki.ca_cert, pki.client)
    assert https_get(exporter, with_client, headers=basic(USER, PASSWORD))[0] == 200
    with pytest.raises((ssl.SSLError, ConnectionError)):
        https_get(exporter, client_context(pki.ca_cert, pki.rogue_client))
    assert http_get(exporter, headers=basic(USER, PASSWORD))[0] == 400
    exporter.stop()
    log = exporter.stderr
    assert "level=debug" in log or '"level": "debug"' in log, "debug logging was on"
    for secret in secrets(pki):
        assert secret not in log, f"a secret reached the log: {secret[:12]}..."


def test_control_bytes_of_a_request_line_reach_the_debug_log_escaped(start):
    """An attacker's request line must not put raw ESC (terminal control sequences) or CR (a line that
    overwrites the one before on a terminal) into the logfmt log."""
    exporter = start("", "--log.level", "debug", *NO_COLLECTORS)
    for line in (b"GET /\x1b[2J\x1b[31mred HTTP/1.1", b"GET /overwritten\rlevel=error HTTP/1.1",
                 b"GET /bell\x07\x7f\x00 HTTP/1.1"):
        with socket.create_connection(("127.0.0.1", port_of(exporter)), timeout=5) as sock:
            sock.sendall(line + b"\r\nHost: x\r\n\r\n")
            sock.recv(65536)
    assert wait_for(lambda: exporter.stderr.count("/bell") >= 1)
    exporter.stop()
    log = exporter.stderr
    assert "\\u001b[2J\\u001b[31mred" in log and "/overwritten\\rlevel=error" in log, log
    assert "\\u0007\\u007f\\u0000" in log
    for raw in ("\x1b", "\r", "\x07", "\x7f", "\x00"):
        assert raw not in log


def test_logfmt_escapes_control_characters_like_go_logfmt():
    from vllm_xpu_exporter.logformat import LogfmtFormatter
    record = logging.LogRecord("vllm_xpu_exporter.web", logging.DEBUG, __file__, 1, "%s", ("a\x1bb\rc\nd\te\"f\\g=h i\u2028",), None)
    line = LogfmtFormatter().format(record)
    assert line.endswith(' msg="a\\u001bb\\rc\\nd\\te\\"f\\\\g=h i\\u2028"'), line
    record.args = ("plain-value",)
    assert LogfmtFormatter().format(record).endswith(" msg=plain-value")


def test_metrics_never_contain_the_web_config_secrets(start, pki):
    exporter = start(tls_server_config(pki) + USERS, "--log.level", "debug")
    _, _, body = https_get(exporter, client_context(pki.ca_cert), headers=basic(USER, PASSWORD))
    text = body.decode()
    assert "xpu_exporter_build_info" in text
    for secret in secrets(pki):
        assert secret not in text


# --- label values from the journal ----------------------------------------------------------

API = "(APIServer pid=10) INFO 12-02 10:00:00 [api_server.py:1873] "
HOSTILE_UNITS = {
    'vllm-quote"back\\slash}brace{.service': 'vllm-quote"back\\slash}brace{.service',
    "vllm-new\nline=\"x\".service": "vllm-new\nline=\"x\".service",
    b"vllm-not-utf8-\xff\xfe.service": "vllm-not-utf8-\ufffd\ufffd.service",
}
# Read with ast.literal_eval by the exporter: \\\\ is one backslash, \\n a newline, \\x00 NUL.
HOSTILE_ARGS = (b"non-default args: {'model': 'org/m\"odel\\\\with}brace,label=\\\"x\\\"\\nnext\xff# HELP', "
                b"'max_model_len': 4096}")
HOSTILE_MODEL = 'org/m"odel\\with}brace,label="x"\nnext\ufffd# HELP'
HOSTILE_VERSION = '0.24.0"}{\\'


def with_unit_name(entry: JournalEntrySpec, raw: bytes) -> JournalEntrySpec:
    """The entry, its unit renamed to bytes that need not be UTF-8 (journald stores whatever it is given)."""
    renamed = {"_SYSTEMD_UNIT": raw, "_SYSTEMD_CGROUP": b"/system.slice/" + raw, "UNIT": raw}
    return dataclasses.replace(entry, fields=tuple((key, renamed.get(key, value)) for key, value in entry.fields))


def hostile_journal(path: Path) -> Path:
    clock = Clock(random_boot_id())
    entries = []
    for raw_name in HOSTILE_UNITS:
        name = raw_name if isinstance(raw_name, str) else "vllm-placeholder.service"
        unit_entries = [unit_starting(name, clock.tick()),
                        unit_output(name, API + f"vLLM API server version {HOSTILE_VERSION}", clock.tick()),
                        unit_output(name, API.encode() + HOSTILE_ARGS, clock.tick())]
        if isinstance(raw_name, bytes):
            unit_entries = [with_unit_name(entry, raw_name) for entry in unit_entries]
        entries += unit_entries
    return write_journal(path, entries)


@pytest.fixture(scope="module")
def hostile_scrapes(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(text format, OpenMetrics) scrapes of an exporter that read the hostile journal."""
    journal = hostile_journal(tmp_path_factory.mktemp("journal") / "hostile.journal")
    with RunningExporter(["--journal.file", str(journal), "--journal.boot", "all",
                          "--no-collector.levelzero", "--no-collector.processes"]) as exporter:
        text = wait_for(lambda: (t := exporter.scrape_text()) and t.count("xpu_unit_engine_info{") == 3 and t,
                        timeout=20)
        assert text, exporter.scrape_text() + exporter.stderr
        status, _, body = exporter.get("/metrics", headers={"Accept": OPENMETRICS})
        assert status == 200
    return text, body.decode()


def engine_info_labels(families) -> list[dict[str, str]]:
    return [sample.labels for family in families if family.name == "xpu_unit_engine_info"
            for sample in family.samples]


def test_hostile_label_values_round_trip_through_the_text_format(hostile_scrapes):
    labels = engine_info_labels(parse_text(hostile_scrapes[0]))
    assert sorted(label["unit"] for label in labels) == sorted(HOSTILE_UNITS.values())
    assert {label["model"] for label in labels} == {HOSTILE_MODEL}
    assert {label["vllm_version"] for label in labels} == {HOSTILE_VERSION}


def test_hostile_label_values_round_trip_through_openmetrics(hostile_scrapes):
    families = list(parse_openmetrics(hostile_scrapes[1]))
    labels = engine_info_labels(families)
    assert sorted(label["unit"] for label in labels) == sorted(HOSTILE_UNITS.values())
    assert {label["model"] for label in labels} == {HOSTILE_MODEL}
    counters = [sample for family in families if family.name == "xpu_unit_engine_init_failures"
                for sample in family.samples if sample.name.endswith("_total")]
    assert {sample.labels["unit"] for sample in counters} == set(HOSTILE_UNITS.values())


def test_hostile_label_values_add_no_series_or_lines(hostile_scrapes):
    """A newline, quote or brace in a value cannot start a sample line or a comment of its own."""
    text = hostile_scrapes[0]
    prefixes = ("xpu_", "process_", "python_")  # the exporter's own and client_python's standard families
    line_starts = tuple(comment + prefix for comment in ("# HELP ", "# TYPE ", "") for prefix in prefixes)
    for line in text.splitlines():
        assert line.startswith(line_starts), repr(line)
    names = {sample.name for family in parse_text(text) for sample in family.samples}
    assert all(name.startswith(prefixes) for name in names)


def test_hostile_scrape_passes_promtool_check_metrics(hostile_scrapes):
    result = subprocess.run(["promtool", "check", "metrics"], input=hostile_scrapes[0].encode(),
                            capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
