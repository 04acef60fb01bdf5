import base64
import logging
import os
import ssl
import threading
import time
from pathlib import Path

import bcrypt
import pytest

import vllm_xpu_exporter.http.reloading
from vllm_xpu_exporter.http.loading import load_web_config, parse_web_config
from vllm_xpu_exporter.http.reloading import ReloadingWebConfig
from vllm_xpu_exporter.http.webconfig import PasswordChecksBusy, WebConfig, WebConfigError
from certs import Pki, make_encrypted_key, make_pki, make_self_signed
from httpclient import authorization
from polling import wait_for
from webconfigs import basic_auth_users, tls_server_config, write_web_config

PASSWORD = "correct horse battery staple"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()


def write_config(directory: Path, text: str, name: str = "web-config.yml") -> str:
    """The config file's path as the exporter is given it: a string."""
    return str(write_web_config(directory, text, name))


def load_error(directory: Path, text: str) -> str:
    path = write_config(directory, text)
    with pytest.raises(WebConfigError) as caught:
        load_web_config(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(path + ": ")
    return message


# ----------------------------------------------------------------------------------------- good configs

def test_empty_file_means_plain_http_without_auth(tmp_path):
    config = load_web_config(write_config(tmp_path, ""))
    assert config.ssl_context() is None
    assert config.check_basic_auth(None)
    assert dict(config.headers) == {}


def test_tls_section_without_certificate_settings_means_plain_http_like_exporter_toolkit(tmp_path):
    config = load_web_config(write_config(tmp_path, "tls_server_config:\n  min_version: TLS13\n"))
    assert config.ssl_context() is None


def test_tls_config_builds_a_server_context_with_toolkit_defaults(tmp_path, pki):
    config = load_web_config(write_config(tmp_path, f"""
tls_server_config:
  cert_file: {pki.server.cert}
  key_file: {pki.server.key}
"""))
    context = config.ssl_context()
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_NONE
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.maximum_version == ssl.TLSVersion.TLSv1_3
    assert context.options & ssl.OP_CIPHER_SERVER_PREFERENCE


def test_relative_paths_are_relative_to_the_config_file_directory(tmp_path, pki):
    directory = pki.server.cert.parent
    config = load_web_config(write_config(directory, f"""
tls_server_config:
  cert_file: {pki.server.cert.name}
  key_file: {pki.server.key.name}
  client_ca_file: {pki.ca_cert.name}
  client_auth_type: RequireAndVerifyClientCert
""", name="relative.yml"))
    assert config.tls is not None
    assert config.tls.cert_file == str(pki.server.cert)
    assert config.tls.client_ca_file == str(pki.ca_cert)
    assert config.ssl_context().verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize("client_auth_type, verify_mode", [
    ("NoClientCert", ssl.CERT_NONE),
    ("RequestClientCert", ssl.CERT_NONE),
    ("VerifyClientCertIfGiven", ssl.CERT_OPTIONAL),
    ("RequireAndVerifyClientCert", ssl.CERT_REQUIRED),
])
def test_client_auth_types_map_to_ssl_verify_modes(tmp_path, pki, client_auth_type, verify_mode):
    ca_line = f"  client_ca_file: {pki.ca_cert}\n" if verify_mode != ssl.CERT_NONE else ""
    config = load_web_config(write_config(tmp_path, f"""
tls_server_config:
  cert_file: {pki.server.cert}
  key_file: {pki.server.key}
  client_auth_type: {client_auth_type}
{ca_line}"""))
    assert config.ssl_context().verify_mode == verify_mode


def test_inline_certificate_key_and_client_ca_are_accepted(tmp_path, pki):
    document = {"tls_server_config": {
        "cert": pki.server.cert.read_text(), "key": pki.server.key.read_text(),
        "client_ca": pki.ca_cert.read_text(), "client_auth_type": "RequireAndVerifyClientCert"}}
    config = parse_web_config(document, str(tmp_path))
    assert config.ssl_context().verify_mode == ssl.CERT_REQUIRED
    assert "PRIVATE KEY" not in repr(config)


def test_versions_cipher_suites_and_curve_are_applied(tmp_path, pki):
    config = load_web_config(write_config(tmp_path, f"""
tls_server_config:
  cert_file: {pki.server.cert}
  key_file: {pki.server.key}
  min_version: TLS12
  max_version: TLS12
  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256]
  prefer_server_cipher_suites: false
  curve_preferences: [CurveP256]
"""))
    context = config.ssl_context()
    assert context.maximum_version == ssl.TLSVersion.TLSv1_2
    tls12_names = {cipher["name"] for cipher in context.get_ciphers() if cipher["protocol"] == "TLSv1.2"}
    assert tls12_names == {"ECDHE-ECDSA-AES128-GCM-SHA256"}
    assert not context.options & ssl.OP_CIPHER_SERVER_PREFERENCE


def test_headers_rate_limit_and_http2_are_read(tmp_path):
    config = load_web_config(write_config(tmp_path, """
http_server_config:
  http2: false
  headers:
    X-Frame-Options: deny
    X-Content-Type-Options: nosniff
    Strict-Transport-Security: max-age=31536000
    Content-Security-Policy: ""
rate_limit:
  interval: 1m30s
  burst: 2
"""))
    assert dict(config.headers) == {"X-Frame-Options": "deny", "X-Content-Type-Options": "nosniff",
                                    "Strict-Transport-Security": "max-age=31536000"}
    assert config.http2 is False
    assert config.rate_limit is not None and config.rate_limit.interval_seconds == 90.0
    assert [config.allow_request() for _ in range(3)] == [True, True, False]


def test_rate_limit_interval_zero_disables_the_limiter(tmp_path):
    config = load_web_config(write_config(tmp_path, "rate_limit:\n  interval: 0\n  burst: 0\n"))
    assert config.rate_limit is None
    assert all(config.allow_request() for _ in range(100))


# ------------------------------------------------------------------------------------------- basic auth

def test_basic_auth_accepts_the_right_password_and_rejects_everything_else(tmp_path):
    config = load_web_config(write_config(tmp_path, f"basic_auth_users:\n  alice: '{HASH}'\n"))
    assert config.check_basic_auth(authorization("alice", PASSWORD))
    assert config.check_basic_auth("basic " + authorization("alice", PASSWORD).split()[1])  # scheme is case-insensitive
    assert not config.check_basic_auth(authorization("alice", "wrong"))
    assert not config.check_basic_auth(authorization("bob", PASSWORD))
    assert not config.check_basic_auth(None)
    assert not config.check_basic_auth("")
    assert not config.check_basic_auth("Bearer abc")
    assert not config.check_basic_auth("Basic not-base64!")
    assert not config.check_basic_auth("Basic " + base64.b64encode(b"no-colon").decode())
    assert not config.check_basic_auth(authorization("alice", PASSWORD + "x" * 80))


def test_htpasswd_2y_hashes_are_accepted(tmp_path):
    hash_2y = "$2y$" + HASH[4:]
    config = load_web_config(write_config(tmp_path, f"basic_auth_users:\n  alice: '{hash_2y}'\n"))
    assert config.check_basic_auth(authorization("alice", PASSWORD))


def test_a_verified_password_is_cached_and_an_unknown_user_still_costs_a_bcrypt(tmp_path):
    slow_hash = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(12)).decode()
    config = load_web_config(write_config(tmp_path, f"basic_auth_users:\n  alice: '{slow_hash}'\n"))

    def timed(header: str) -> tuple[bool, float]:
        start = time.perf_counter()
        result = config.check_basic_auth(header)
        return result, time.perf_counter() - start

    first, first_time = timed(authorization("alice", PASSWORD))
    cached, cached_time = timed(authorization("alice", PASSWORD))
    unknown, unknown_time = timed(authorization("mallory", PASSWORD))
    wrong_after_cache, wrong_time = timed(authorization("alice", "wrong"))
    assert first and cached and not unknown and not wrong_after_cache
    assert cached_time < first_time / 10
    assert unknown_time > first_time / 3
    assert wrong_time > first_time / 3


def test_at_most_two_requests_run_or_wait_for_bcrypt_and_cached_credentials_never_wait(tmp_path):
    slow_hash = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(12)).decode()  # ~0.25 s a check here
    config = load_web_config(write_config(tmp_path, f"basic_auth_users:\n  alice: '{slow_hash}'\n"))
    assert config.check_basic_auth(authorization("alice", PASSWORD))  # verified once: cached from now on
    start = threading.Barrier(6)
    outcomes: list[object] = []

    def wrong_password() -> None:
        start.wait(5)
        try:
            outcomes.append(config.check_basic_auth(authorization("alice", "wrong")))
        except PasswordChecksBusy as busy:
            outcomes.append(type(busy))

    checkers = [threading.Thread(target=wrong_password) for _ in range(6)]
    for checker in checkers:
        checker.start()
    time.sleep(0.05)
    started = time.perf_counter()
    assert config.check_basic_auth(authorization("alice", PASSWORD))
    assert time.perf_counter() - started < 0.05
    for checker in checkers:
        checker.join(10)
    assert sorted(map(str, outcomes)) == sorted(map(str, [False, False] + [PasswordChecksBusy] * 4))


def test_repr_names_users_but_not_their_hashes(tmp_path):
    config = load_web_config(write_config(tmp_path, f"basic_auth_users:\n  alice: '{HASH}'\n"))
    assert "alice" in repr(config)
    assert HASH not in repr(config)
    assert config.basic_auth_users == ("alice",)


# ---------------------------------------------------------------------------------------- client SANs

def test_client_allowed_sans_matches_dns_and_ip_entries(tmp_path, pki):
    config = load_web_config(write_config(tmp_path, f"""
tls_server_config:
  cert_file: {pki.server.cert}
  key_file: {pki.server.key}
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: {pki.ca_cert}
  client_allowed_sans: [scraper.test, "::1"]
"""))
    assert config.client_certificate_allowed({"subjectAltName": (("DNS", "scraper.test"),)})
    assert config.client_certificate_allowed({"subjectAltName": (("IP Address", "0:0:0:0:0:0:0:1\n"),)})
    assert not config.client_certificate_allowed({"subjectAltName": (("DNS", "other.test"),)})
    assert not config.client_certificate_allowed({})


# ------------------------------------------------------------------------------------------ reloading

def test_reloading_config_follows_the_file_and_keeps_the_last_good_one(tmp_path, caplog):
    path = write_config(tmp_path, f"basic_auth_users:\n  alice: '{HASH}'\n")
    reloading = ReloadingWebConfig(load_web_config(path))
    assert reloading.current().basic_auth_users == ("alice",)

    rewrite(path, f"basic_auth_users:\n  bob: '{HASH}'\n")
    assert wait_for(lambda: reloading.current().basic_auth_users == ("bob",))

    rewrite(path, "basic_auth_users: [broken\n")
    assert wait_for(lambda: reloading.current() is not None and "cannot be used" in caplog.text)
    assert reloading.current().basic_auth_users == ("bob",)


_bumps = iter(range(1, 1_000_000))


def rewrite(path: str, text: str) -> None:
    """Rewrites a watched file; its mtime moves on by whole seconds so that the change shows even when
    the file keeps its size within one tick of the file system's clock."""
    Path(path).write_text(text)
    later = time.time_ns() + next(_bumps) * 1_000_000_000
    os.utime(path, ns=(later, later))


def tls_auth_text(pki: Pki, client_auth: bool = True, users: bool = True, tls: bool = True) -> str:
    text = ""
    if tls:
        text += tls_server_config(pki, client_auth_type="RequireAndVerifyClientCert" if client_auth else None)
    if users:
        text += basic_auth_users({"alice": HASH})
    return text


def assert_protected(config: WebConfig) -> None:
    """TLS with required client certificates and alice's password, as the file said at start."""
    assert config.ssl_context() is not None
    assert config.ssl_context().verify_mode == ssl.CERT_REQUIRED
    assert config.basic_auth_users == ("alice",)
    assert not config.check_basic_auth(None)


def test_a_truncated_file_keeps_tls_client_certificates_and_basic_auth(tmp_path, pki, caplog):
    path = write_config(tmp_path, tls_auth_text(pki))
    reloading = ReloadingWebConfig(load_web_config(path))
    rewrite(path, "")
    assert wait_for(lambda: reloading.current() is not None
                    and "the file is empty, keeping the previous one" in caplog.text)
    assert_protected(reloading.current())
    assert any(record.levelno == logging.ERROR for record in caplog.records if "file is empty" in record.message)


@pytest.mark.parametrize("what, text", [
    ("tls-off", lambda pki: tls_auth_text(pki, tls=False)),
    ("client-certificates-off", lambda pki: tls_auth_text(pki, client_auth=False)),
    ("basic-auth-off", lambda pki: tls_auth_text(pki, users=False)),
    ("half-written", lambda pki: "tls_server_config:\n"),
    ("comments-only", lambda pki: "# being rewritten\n"),
])
def test_a_reload_never_drops_tls_or_authentication(tmp_path, pki, caplog, what, text):
    path = write_config(tmp_path, tls_auth_text(pki))
    reloading = ReloadingWebConfig(load_web_config(path))
    rewrite(path, text(pki))
    assert wait_for(lambda: reloading.current() is not None and "keeping the previous one" in caplog.text)
    assert_protected(reloading.current())
    # Once the file is whole again, its changes apply as usual.
    rewrite(path, tls_auth_text(pki).replace("alice", "bob"))
    assert wait_for(lambda: reloading.current().basic_auth_users == ("bob",))
    assert reloading.current().ssl_context().verify_mode == ssl.CERT_REQUIRED


def test_a_reload_cannot_turn_tls_on_for_a_plain_http_listener(tmp_path, pki, caplog):
    path = write_config(tmp_path, f"basic_auth_users:\n  alice: '{HASH}'\n")
    reloading = ReloadingWebConfig(load_web_config(path))
    rewrite(path, tls_auth_text(pki))
    assert wait_for(lambda: reloading.current() is not None and "would turn TLS on" in caplog.text)
    assert reloading.current().ssl_context() is None


def test_a_reload_may_change_certificates_client_ca_and_users(tmp_path, pki):
    other = make_pki(tmp_path / "other")
    path = write_config(tmp_path, tls_auth_text(pki))
    reloading = ReloadingWebConfig(load_web_config(path))
    rewrite(path, tls_auth_text(other).replace("alice", "carol"))
    assert wait_for(lambda: reloading.current().basic_auth_users == ("carol",))
    assert reloading.current().tls.cert_file == str(other.server.cert)
    assert reloading.current().tls.client_ca_file == str(other.ca_cert)
    # A certificate and key replaced in place (a rotation) are picked up too.
    before_rotation = reloading.current()
    rotated = make_pki(tmp_path / "rotated")
    rewrite(str(other.server.cert), rotated.server.cert.read_text())
    rewrite(str(other.server.key), rotated.server.key.read_text())
    # (The certificate alone does not match the old key: only the whole pair loads, as a new config.)
    assert wait_for(lambda: reloading.current() is not before_rotation)


def test_a_change_made_while_the_file_loads_is_loaded_afterwards(tmp_path, monkeypatch):
    """The file is read, and before the load finishes (a slow bcrypt cost, a slow disk) it changes
    again: the newer content must not be mistaken for what was loaded."""
    path = write_config(tmp_path, f"basic_auth_users:\n  alice: '{HASH}'\n")
    reloading = ReloadingWebConfig(load_web_config(path))
    read_done, finish = threading.Event(), threading.Event()
    real_load = vllm_xpu_exporter.http.reloading.load_web_config

    def slow_load(load_path: str) -> WebConfig:
        config = real_load(load_path)
        if not read_done.is_set():
            read_done.set()
            finish.wait(10)
        return config

    monkeypatch.setattr(vllm_xpu_exporter.http.reloading, "load_web_config", slow_load)
    rewrite(path, f"basic_auth_users:\n  bob: '{HASH}'\n")
    threading.Thread(target=reloading.current, daemon=True).start()  # whoever notices the change first
    assert read_done.wait(10)
    rewrite(path, f"basic_auth_users:\n  carol: '{HASH}'\n")
    finish.set()
    assert wait_for(lambda: reloading.current().basic_auth_users == ("carol",)), reloading.current()


def test_requests_are_served_with_the_old_config_while_the_new_one_loads(tmp_path, monkeypatch):
    path = write_config(tmp_path, f"basic_auth_users:\n  alice: '{HASH}'\n")
    reloading = ReloadingWebConfig(load_web_config(path))
    loading, finish = threading.Event(), threading.Event()
    real_load = vllm_xpu_exporter.http.reloading.load_web_config

    def slow_load(load_path: str) -> WebConfig:
        loading.set()
        finish.wait(10)
        return real_load(load_path)

    monkeypatch.setattr(vllm_xpu_exporter.http.reloading, "load_web_config", slow_load)
    rewrite(path, f"basic_auth_users:\n  bob: '{HASH}'\n")
    answers: list[tuple[str, ...]] = []

    def requests() -> None:
        for _ in range(20):
            answers.append(reloading.current().basic_auth_users)

    serving = threading.Thread(target=requests, daemon=True)
    serving.start()
    try:
        assert loading.wait(10), "the change did not start a reload"
        serving.join(2)
        assert not serving.is_alive(), "a request waited for the reload"
        assert answers == [("alice",)] * 20
    finally:
        finish.set()
    assert wait_for(lambda: reloading.current().basic_auth_users == ("bob",))


def test_a_config_with_a_costly_bcrypt_hash_loads_without_hashing(tmp_path):
    """Unknown users are checked against a decoy hash of the highest configured cost; making the decoy
    must not cost a bcrypt run of that cost (cost 16: about 4 s here) on every load."""
    cost_16_hash = bcrypt.gensalt(16).decode() + "x" * 31  # well-formed; no password is ever checked against it
    path = write_config(tmp_path, f"basic_auth_users:\n  alice: '{HASH}'\n  bob: '{cost_16_hash}'\n")
    started = time.perf_counter()
    config = load_web_config(path)
    assert time.perf_counter() - started < 0.5
    assert config.check_basic_auth(authorization("alice", PASSWORD))


def test_the_decoy_hash_has_the_highest_configured_cost_and_matches_no_password(tmp_path):
    slow = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    config = load_web_config(write_config(tmp_path, f"basic_auth_users:\n  alice: '{HASH}'\n  bob: '{slow}'\n"))
    decoy = config._decoy_hash
    assert decoy[:7] == b"$2b$10$" and len(decoy) == 60
    assert not bcrypt.checkpw(PASSWORD.encode(), decoy) and not bcrypt.checkpw(b"", decoy)
    assert decoy != load_web_config(config.source_path)._decoy_hash


# ------------------------------------------------------------------------------------------ bad files

def test_missing_file_is_named(tmp_path):
    path = str(tmp_path / "absent.yml")
    with pytest.raises(WebConfigError, match=r"cannot read .*absent\.yml: No such file or directory"):
        load_web_config(path)


def test_directory_instead_of_file_is_reported(tmp_path):
    with pytest.raises(WebConfigError, match="cannot read .*: Is a directory"):
        load_web_config(str(tmp_path))


def test_invalid_yaml_reports_position_but_not_the_line(tmp_path):
    message = load_error(tmp_path, f"basic_auth_users:\n  alice: '{HASH}'\n  bob: [unclosed\n")
    assert "invalid YAML at line" in message
    assert HASH not in message


def test_duplicate_keys_are_rejected(tmp_path):
    message = load_error(tmp_path, f"basic_auth_users:\n  alice: '{HASH}'\n  alice: '{HASH}'\n")
    assert 'duplicate key "alice" at line 3' in message
    assert HASH not in message


@pytest.mark.parametrize("text, expected", [
    ("- a\n- b\n", "the web config must be a mapping, not a list"),
    ("tls_config: {}\n", 'the web config: unknown key "tls_config"'),
    ("tls_server_config:\n  certfile: x\n", 'tls_server_config: unknown key "certfile"'),
    ("http_server_config:\n  header: {}\n", 'http_server_config: unknown key "header"'),
    ("rate_limit:\n  interval: 1s\n  bursts: 2\n", 'rate_limit: unknown key "bursts"'),
    ("tls_server_config: yes\n", "tls_server_config must be a mapping, not a boolean"),
    ("tls_server_config:\n  cert_file: 42\n", "tls_server_config.cert_file must be a string, not a number"),
    ("tls_server_config:\n  cert_file: a.crt\n", "tls_server_config: key_file (or key) is required"),
    ("tls_server_config:\n  key_file: a.key\n", "tls_server_config: cert_file (or cert) is required"),
    ("tls_server_config:\n  cert_file: a\n  cert: b\n  key_file: c\n", "set cert or cert_file, not both"),
    ("tls_server_config:\n  client_auth_type: Sometimes\n",
     'client_auth_type: unknown value "Sometimes" (expected one of NoClientCert'),
    ("tls_server_config:\n  client_auth_type: RequireAnyClientCert\n",
     "RequireAnyClientCert is not supported: Python's ssl module cannot require a client certificate without"),
    ("tls_server_config:\n  client_auth_type: RequireClientCert\n", "RequireClientCert is not supported"),
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_ca_file: c\n",
     "a client CA is configured but client_auth_type is NoClientCert"),
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_allowed_sans: [x]\n"
     "  client_auth_type: VerifyClientCertIfGiven\n", "client_allowed_sans requires client_auth_type"),
    ("tls_server_config:\n  min_version: TLS14\n", 'min_version: unknown TLS version "TLS14"'),
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS13\n  max_version: TLS12\n",
     "min_version is higher than max_version"),
    ("tls_server_config:\n  cipher_suites: [TLS_MADE_UP_SUITE]\n",
     'unknown or unsupported cipher suite "TLS_MADE_UP_SUITE"'),
    ("tls_server_config:\n  cipher_suites: TLS_AES_128_GCM_SHA256\n", "cipher_suites must be a list of strings"),
    ("tls_server_config:\n  curve_preferences: [CurveP999]\n", 'unknown curve "CurveP999"'),
    ("tls_server_config:\n  curve_preferences: [X25519, CurveP256]\n", "only a single curve is supported"),
    ("tls_server_config:\n  prefer_server_cipher_suites: maybe\n",
     "prefer_server_cipher_suites must be true or false"),
    ("http_server_config:\n  http2: 1\n", "http_server_config.http2 must be true or false, not a number"),
    ("http_server_config:\n  headers:\n    X-Powered-By: me\n", 'http_server_config.headers: unknown key "X-Powered-By"'),
    ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
     'X-Frame-Options: invalid value "allow" (expected one of deny, sameorigin)'),
    ('http_server_config:\n  headers:\n    Content-Security-Policy: "a\\r\\nSet-Cookie: x"\n',
     "Content-Security-Policy: the value must be a single line"),
    ("basic_auth_users: [alice]\n", "basic_auth_users must be a mapping of user to bcrypt hash, not a list"),
    ("basic_auth_users:\n  123: x\n", 'basic_auth_users: user name "123" must be a non-empty string'),
    ("rate_limit:\n  interval: 1 second\n  burst: 1\n", "rate_limit.interval must be a duration"),
    ("rate_limit:\n  interval: 1s\n", "rate_limit.burst must be a whole number of at least 1"),
])
def test_invalid_settings_are_rejected_with_a_message_naming_them(tmp_path, text, expected):
    assert expected in load_error(tmp_path, text)


@pytest.mark.parametrize("secret", [
    "plaintext-password",
    "$1$saltsalt$hashhashhashhash",
    "$2y$03$" + "a" * 53,  # cost below bcrypt's minimum of 4
    "$2y$10$" + "a" * 20,
    "$2y$\u0661\u0660$" + "a" * 53,  # Arabic-Indic digits, which \d took for a cost
])
def test_a_password_that_is_not_a_bcrypt_hash_is_rejected_without_echoing_it(tmp_path, secret):
    message = load_error(tmp_path, f"basic_auth_users:\n  alice: '{secret}'\n")
    assert 'the password of user "alice" is not a bcrypt hash' in message
    assert secret not in message


# ------------------------------------------------------------------------------------ bad cert files

def tls_error(tmp_path: Path, cert: Path | str, key: Path | str, extra: str = "") -> str:
    return load_error(tmp_path, f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n{extra}")


def test_unreadable_cert_file_is_named(tmp_path, pki):
    message = tls_error(tmp_path, tmp_path / "missing.crt", pki.server.key)
    assert f"tls_server_config.cert_file: cannot read {tmp_path / 'missing.crt'}: No such file" in message


def test_unreadable_key_file_is_named(tmp_path, pki):
    message = tls_error(tmp_path, pki.server.cert, tmp_path)
    assert f"tls_server_config.key_file: cannot read {tmp_path}: Is a directory" in message


def test_cert_file_without_a_certificate_is_reported(tmp_path, pki):
    message = tls_error(tmp_path, pki.server.key, pki.server.key)
    assert f"cert_file {pki.server.key}: no PEM certificate found" in message
    assert pki.server.key.read_text().splitlines()[1] not in message


def test_key_file_without_a_key_is_reported(tmp_path, pki):
    message = tls_error(tmp_path, pki.server.cert, pki.server.cert)
    assert f"key_file {pki.server.cert}: no usable PEM private key found" in message


def test_certificate_and_key_that_do_not_match_are_reported(tmp_path, pki):
    other = make_self_signed(tmp_path / "other", "other")
    message = tls_error(tmp_path, pki.server.cert, other.key)
    assert "does not match the certificate" in message


def test_encrypted_key_is_reported_without_prompting(tmp_path, pki):
    encrypted = make_encrypted_key(tmp_path, pki.server.key)
    message = tls_error(tmp_path, pki.server.cert, encrypted)
    assert "the private key is encrypted" in message


def test_unreadable_client_ca_file_is_named(tmp_path, pki):
    message = tls_error(tmp_path, pki.server.cert, pki.server.key,
                        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {tmp_path / 'ca.pem'}\n")
    assert f"client_ca_file: cannot read {tmp_path / 'ca.pem'}" in message


def test_client_ca_file_without_certificates_is_reported(tmp_path, pki):
    message = tls_error(tmp_path, pki.server.cert, pki.server.key,
                        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki.server.key}\n")
    assert f"client_ca_file {pki.server.key}: no PEM certificate found" in message


def test_parse_web_config_reports_without_a_file_prefix(tmp_path):
    with pytest.raises(WebConfigError, match=r"^basic_auth_users must be a mapping"):
        parse_web_config({"basic_auth_users": "alice"}, str(tmp_path))
