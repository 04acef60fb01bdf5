"""vllm-xpu-plan --prometheus against a Prometheus that asks for credentials (sources/prometheus.py `access`): a
real HTTPS server on 127.0.0.1 with a certificate of the test CA (certs.make_pki), answering only requests with
the right basic auth or bearer token and the tenant's header. Secrets come from files, never from the command
line; what cannot be read or is refused is one line and exit 2."""

from __future__ import annotations

import base64
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from journalgen import write_journal
from rightsizedhost import CHAT, placed, run_plan
from test_sources_prometheus import answer, send_json
from vllmlogs import journal_specs

USER, PASSWORD, TOKEN, TENANT = "planner", "s3cret pass", "tok-3f9a", "team-a"


class Secured(BaseHTTPRequestHandler):
    """Answers query_range only to Basic USER:PASSWORD or Bearer TOKEN with X-Scope-OrgID: TENANT; 401 else.
    `seen` keeps each request's Authorization and X-Scope-OrgID."""

    seen: list[tuple[str | None, str | None]] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        authorization, tenant = self.headers.get("Authorization"), self.headers.get("X-Scope-OrgID")
        type(self).seen.append((authorization, tenant))
        allowed = {f"Basic {base64.b64encode(f'{USER}:{PASSWORD}'.encode()).decode()}", f"Bearer {TOKEN}"}
        if authorization not in allowed or tenant != TENANT:
            send_json(self, 401, {"status": "error", "error": "unauthorized"})
        else:
            send_json(self, 200, answer(CHAT, 0.5))

    def log_message(self, *args):
        pass


@pytest.fixture
def secured(pki):
    """The URL of the HTTPS server (its certificate for 127.0.0.1 by the test CA)."""
    Secured.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Secured)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server.cert, pki.server.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def journal(tmp_path):
    return write_journal(tmp_path / "system.journal", journal_specs(placed()))


def secret_file(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


def test_basic_auth_from_a_file_over_tls_of_the_given_ca_with_the_tenants_header_is_answered(secured, journal,
                                                                                             tmp_path, pki):
    result = run_plan(journal, "--prometheus", secured, "--format", "json", "--prometheus.ca-file", str(pki.ca_cert),
                      "--prometheus.username", USER,
                      "--prometheus.password-file", secret_file(tmp_path, "password", PASSWORD + "\n"),
                      "--prometheus.header", f"X-Scope-OrgID={TENANT}")
    assert result.returncode == 0, result.stderr
    assert any(unit["unit"] == CHAT for device in json.loads(result.stdout)["devices"] for unit in device["units"])
    assert len(Secured.seen) == 4 and all(authorization.startswith("Basic ") and tenant == TENANT
                                          for authorization, tenant in Secured.seen)


def test_a_bearer_token_from_a_file_is_sent(secured, journal, tmp_path, pki):
    result = run_plan(journal, "--prometheus", secured, "--format", "json", "--prometheus.ca-file", str(pki.ca_cert),
                      "--prometheus.bearer-token-file", secret_file(tmp_path, "token", f"  {TOKEN}\n"),
                      "--prometheus.header", f"X-Scope-OrgID={TENANT}")
    assert result.returncode == 0, result.stderr
    assert Secured.seen and all(seen == (f"Bearer {TOKEN}", TENANT) for seen in Secured.seen)


@pytest.mark.parametrize("wrong", ["password", "tenant"])
def test_refused_credentials_are_one_line_naming_the_status_and_the_flags(secured, journal, tmp_path, pki, wrong):
    result = run_plan(journal, "--prometheus", secured, "--prometheus.ca-file", str(pki.ca_cert),
                      "--prometheus.username", USER,
                      "--prometheus.password-file",
                      secret_file(tmp_path, "password", "wrong" if wrong == "password" else PASSWORD),
                      "--prometheus.header", f"X-Scope-OrgID={'team-b' if wrong == 'tenant' else TENANT}")
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert len(result.stderr.splitlines()) == 1 and "HTTP 401" in result.stderr \
        and "--prometheus.password-file" in result.stderr, result.stderr


@pytest.mark.parametrize("ca", ["system", "rogue"])
def test_a_server_certificate_not_of_the_given_ca_is_refused_before_any_credential_is_sent(secured, journal,
                                                                                          tmp_path, pki, ca):
    result = run_plan(journal, "--prometheus", secured,
                      *(["--prometheus.ca-file", str(pki.rogue_ca_cert)] if ca == "rogue" else []),
                      "--prometheus.bearer-token-file", secret_file(tmp_path, "token", TOKEN))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in result.stderr and TOKEN not in result.stderr
    assert Secured.seen == []


@pytest.mark.parametrize("flags, said", [
    (["--prometheus.header", "Authorization=Bearer tok"], "a secret is not taken on the command line"),
    (["--prometheus.header", "cookie=session=1"], "a secret is not taken on the command line"),
    (["--prometheus.header", "X-Scope-OrgID"], "want NAME=VALUE"),
    (["--prometheus.header", "Bad Name=1"], "want NAME=VALUE"),
    (["--prometheus.username", USER], "--prometheus.username and --prometheus.password-file go together"),
    (["--prometheus.username", "a:b", "--prometheus.password-file", "/dev/null"], "no ':'"),
    (["--prometheus.username", USER, "--prometheus.password-file", "/dev/null",
      "--prometheus.bearer-token-file", "/dev/null"], "not both"),
], ids=["authorization header", "cookie header", "no value", "bad name", "user without password",
        "colon in user", "basic and bearer"])
def test_bad_access_flags_are_one_line_and_exit_2_before_any_request(secured, journal, flags, said):
    result = run_plan(journal, "--prometheus", secured, *flags)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and said in result.stderr, result.stderr
    assert Secured.seen == []


def test_access_flags_without_prometheus_are_refused(journal, tmp_path):
    result = run_plan(journal, "--prometheus.bearer-token-file", secret_file(tmp_path, "token", TOKEN))
    assert result.returncode == 2 and "--prometheus.bearer-token-file goes with --prometheus" in result.stderr


@pytest.mark.parametrize("case", ["missing", "empty", "not a CA file"])
def test_a_secret_or_ca_file_that_cannot_be_used_is_one_line_and_no_request(secured, journal, tmp_path, case):
    token = {"missing": str(tmp_path / "absent"), "empty": secret_file(tmp_path, "empty-token", "\n"),
             "not a CA file": secret_file(tmp_path, "token", TOKEN)}[case]
    extra = ["--prometheus.ca-file", secret_file(tmp_path, "ca.pem", "no certificate")] if case == "not a CA file" \
        else []
    result = run_plan(journal, "--prometheus", secured, "--prometheus.bearer-token-file", token, *extra)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert {"missing": "No such file", "empty": "empty",
            "not a CA file": "not a readable PEM file"}[case] in result.stderr, result.stderr
    assert Secured.seen == []
