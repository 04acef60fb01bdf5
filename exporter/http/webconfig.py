"""The exporter-toolkit web configuration file (`--web.config.file`): TLS, basic auth, headers, rate limit.

The format is the one every Prometheus Go exporter reads (prometheus/exporter-toolkit,
docs/web-configuration.md), so one file can serve node_exporter and this exporter alike:

    tls_server_config:
      cert_file: server.crt            # relative paths are relative to the config file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      min_version: TLS12
    http_server_config:
      headers: {X-Content-Type-Options: nosniff}
    basic_auth_users:
      alice: $2y$10$...                # bcrypt hash, e.g. `htpasswd -nBC 10 "" | tr -d ':\\n'`
    rate_limit: {interval: 1s, burst: 20}

Differences from the Go implementation, forced by Python's `ssl` module (each is reported clearly
when the file is loaded, never silently ignored):

- `client_auth_type: RequireAnyClientCert` (and its old spelling `RequireClientCert`) is rejected:
  Python cannot require a client certificate without verifying it against a CA. Use
  `RequireAndVerifyClientCert` with `client_ca_file`.
- `client_auth_type: RequestClientCert` does not ask the client for a certificate (a client CA given
  with it is unused). Go asks but never verifies nor requires one, so exactly the same clients are
  admitted.
- `cipher_suites` accepts Go's names of the TLS 1.0-1.2 suites OpenSSL implements; TLS 1.3 suite names
  are accepted and, as in Go, have no effect (TLS 1.3 suites are not configurable).
- `curve_preferences` accepts a single curve only.
- `http_server_config.http2` is accepted; the exporter serves HTTP/1.1 only.

Secrets (passwords, hashes, private keys) never appear in error messages, logs or `repr`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import secrets
import ssl
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import bcrypt
import yaml

from exporter.durations import parse_go_duration

logger = logging.getLogger("exporter.webconfig")

CLIENT_AUTH_TYPES = ("NoClientCert", "RequestClientCert", "RequireAnyClientCert", "VerifyClientCertIfGiven",
                     "RequireAndVerifyClientCert")
_UNSUPPORTED_CLIENT_AUTH_TYPES = ("RequireAnyClientCert", "RequireClientCert")
_VERIFY_MODES = {
    "": ssl.CERT_NONE,
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

# Go crypto/tls cipher suite names (IANA names) of TLS 1.0-1.2 -> OpenSSL names.
TLS12_CIPHER_SUITES = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    # Go's older spellings of the two ChaCha20 suites.
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
TLS13_CIPHER_SUITES = frozenset({"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"})

CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}

# The headers exporter-toolkit lets a config set, with their allowed values (None: any value).
CONFIGURABLE_HEADERS: Mapping[str, tuple[str, ...] | None] = MappingProxyType({
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
})

_TOP_LEVEL_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
_TLS_KEYS = ("cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type", "client_ca_file",
             "client_allowed_sans", "min_version", "max_version", "cipher_suites", "prefer_server_cipher_suites",
             "curve_preferences")
_HTTP_KEYS = ("http2", "headers")
_RATE_LIMIT_KEYS = ("interval", "burst")

_BCRYPT_HASH = re.compile(r"\$2[aby]\$(?P<cost>\d\d)\$[./A-Za-z0-9]{53}")
_BCRYPT_MAX_PASSWORD_BYTES = 72
_BCRYPT_QUEUE = 2  # of the HTTP server's four workers: two stay free for requests that need no bcrypt


FileState = tuple[int, int, int, int, int] | None  # (device, inode, size, mtime ns, ctime ns); None: no such file


class PasswordChecksBusy(Exception):
    """Too many password checks are under way: the request should be answered 429, to be retried."""


class WebConfigError(ValueError):
    """The web config file cannot be used. The message is one line and names the problem."""


class _EncryptedKey(Exception):
    pass


@dataclass(frozen=True)
class TLSServerConfig:
    """`tls_server_config`, validated. File paths are absolute (resolved against the config's directory)."""

    cert_file: str | None = None
    key_file: str | None = None
    cert: str | None = field(default=None, repr=False)
    key: str | None = field(default=None, repr=False)
    client_ca_file: str | None = None
    client_ca: str | None = field(default=None, repr=False)
    client_auth_type: str = "NoClientCert"
    client_allowed_sans: tuple[str, ...] | None = None
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
    cipher_suites: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True
    curve_preferences: tuple[str, ...] = ()

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(path for path in (self.cert_file, self.key_file, self.client_ca_file) if path)


@dataclass(frozen=True)
class RateLimit:
    """Token bucket: one token every `interval_seconds`, at most `burst` saved up."""

    interval_seconds: float
    burst: int


class _TokenBucket:
    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self._limit = limit
        self._clock = clock
        self._tokens = float(limit.burst)
        self._updated = clock()
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            now = self._clock()
            refill = (now - self._updated) / self._limit.interval_seconds
            self._tokens = min(float(self._limit.burst), self._tokens + refill)
            self._updated = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False


class WebConfig:
    """A loaded web config. Build it with `load_web_config(path)` or `parse_web_config(document, base_dir)`.

    Thread-safe: the HTTP server calls `check_basic_auth` and `allow_request` from many threads.
    """

    def __init__(self, *, tls: TLSServerConfig | None, headers: Mapping[str, str], users: Mapping[str, str],
                 rate_limit: RateLimit | None, http2: bool, source_path: str | None, empty: bool = False,
                 source_fingerprint: Mapping[str, FileState] | None = None) -> None:
        self.tls = tls
        self.headers: Mapping[str, str] = MappingProxyType(dict(headers))
        self.rate_limit = rate_limit
        self.http2 = http2
        self.source_path = source_path
        self.empty = empty
        self._users = {user: hashed.encode("ascii") for user, hashed in users.items()}
        # The state of every file this config is read from, taken before the file was read: a change that
        # lands while the config loads is seen as a change afterwards, never mistaken for what was loaded.
        self.fingerprint: Mapping[str, FileState] = MappingProxyType(
            {**(source_fingerprint or {}), **_file_fingerprint(tls.files if tls else ())})
        self._ssl_context = _build_ssl_context(tls) if tls is not None else None
        # Checked for unknown users so that their answer takes as long as a known user's (no user
        # enumeration by timing).
        self._decoy_hash = _decoy_hash(_highest_cost(self._users)) if self._users else b""
        self._verified: dict[str, bytes] = {}  # user -> sha256 of the password bcrypt last accepted
        self._verified_lock = threading.Lock()
        self._bcrypt_lock = threading.Lock()  # bcrypt is CPU-heavy: one at a time, like exporter-toolkit
        # Requests running or waiting for a bcrypt check; more are turned away rather than made to wait,
        # so that wrong passwords at a high cost cannot hold every HTTP worker.
        self._bcrypt_slots = threading.BoundedSemaphore(_BCRYPT_QUEUE)
        self._bucket = _TokenBucket(rate_limit) if rate_limit is not None else None

    def __repr__(self) -> str:
        return (f"WebConfig(source_path={self.source_path!r}, tls={self.tls!r}, headers={dict(self.headers)!r}, "
                f"users={sorted(self._users)!r}, rate_limit={self.rate_limit!r})")

    @property
    def basic_auth_users(self) -> tuple[str, ...]:
        return tuple(sorted(self._users))

    @property
    def requires_client_certificate(self) -> bool:
        return self.tls is not None and self.tls.client_auth_type == "RequireAndVerifyClientCert"

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server-side TLS context, or None when the config does not enable TLS."""
        return self._ssl_context

    def watched_files(self) -> tuple[str, ...]:
        """The files this config was built from: the config file itself and the files it names."""
        own = (self.source_path,) if self.source_path else ()
        return own + (self.tls.files if self.tls else ())

    def allow_request(self) -> bool:
        """False when the rate limit is exhausted (answer 429)."""
        return self._bucket is None or self._bucket.take()

    def check_basic_auth(self, authorization_header: str | None) -> bool:
        """True when no basic_auth_users are configured, or the header carries a user's right password.
        Raises PasswordChecksBusy when the check needs bcrypt and two other requests already run or wait
        for one (credentials verified before are answered from a cache, without bcrypt)."""
        if not self._users:
            return True
        credentials = _parse_basic_authorization(authorization_header)
        if credentials is None:
            return False
        user, password = credentials
        hashed = self._users.get(user)
        digest = hashlib.sha256(password).digest()
        if hashed is not None and self._was_verified(user, digest):
            return True
        if not self._bcrypt_slots.acquire(blocking=False):
            raise PasswordChecksBusy()
        try:
            with self._bcrypt_lock:
                # Another thread may have verified the same credentials while this one waited.
                if hashed is not None and self._was_verified(user, digest):
                    return True
                matches = _bcrypt_matches(password, hashed if hashed is not None else self._decoy_hash)
        finally:
            self._bcrypt_slots.release()
        if hashed is None or not matches:
            return False
        with self._verified_lock:
            self._verified[user] = digest
        return True

    def _was_verified(self, user: str, digest: bytes) -> bool:
        with self._verified_lock:
            known = self._verified.get(user)
        return known is not None and hmac.compare_digest(known, digest)

    def client_certificate_allowed(self, peer_certificate: Mapping[str, Any] | None) -> bool:
        """Checks `client_allowed_sans` against a verified peer certificate (`SSLSocket.getpeercert()`)."""
        if self.tls is None or self.tls.client_allowed_sans is None:
            return True
        if not peer_certificate:
            return False
        allowed = {_normalise_san(value) for value in self.tls.client_allowed_sans}
        return any(_normalise_san(value) in allowed for _kind, value in peer_certificate.get("subjectAltName", ()))


def _highest_cost(users: Mapping[str, bytes]) -> int:
    return max(int(hashed[4:6]) for hashed in users.values())


_BCRYPT_ALPHABET = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_BCRYPT_DIGEST_CHARS = 31


def _decoy_hash(cost: int) -> bytes:
    """A well-formed bcrypt hash of `cost` that no password matches: a random salt and a random digest.
    Checking a password against it costs what checking a real hash of that cost does (bcrypt derives
    from the salt and cost, then compares), while making it costs nothing: hashing a throw-away password
    instead took 3.4 s at cost 15 on every config change."""
    digest = "".join(secrets.choice(_BCRYPT_ALPHABET) for _ in range(_BCRYPT_DIGEST_CHARS))
    return bcrypt.gensalt(cost) + digest.encode("ascii")


def _bcrypt_matches(password: bytes, hashed: bytes) -> bool:
    if len(password) > _BCRYPT_MAX_PASSWORD_BYTES:
        # bcrypt ignores bytes past 72; refuse such passwords, but only after the same delay as any other.
        bcrypt.checkpw(b"", hashed)
        return False
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:
        return False


def _parse_basic_authorization(header: str | None) -> tuple[str, bytes] | None:
    if not header:
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, colon, password = decoded.partition(b":")
    if not colon:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


def _normalise_san(value: str) -> str:
    value = value.strip()
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return value


# ---------------------------------------------------------------------------------------------- loading

_MAX_YAML_DEPTH = 64  # the format nests 3 deep; PyYAML's composer recurses once per level


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, like Go's yaml.UnmarshalStrict, and documents nested deeper
    than the format ever needs (which would otherwise exhaust Python's recursion limit)."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
        if self._depth >= _MAX_YAML_DEPTH:
            mark = self.peek_event().start_mark
            raise WebConfigError(f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: "
                                 f"nested deeper than {_MAX_YAML_DEPTH} levels")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue
            if key in seen:
                raise WebConfigError(f"duplicate key {_quote(key)} at line {key_node.start_mark.line + 1}")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_web_config(path: str) -> WebConfig:
    """Reads, validates and builds a web config file; raises WebConfigError naming the problem."""
    source_fingerprint = _file_fingerprint((path,))
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except OSError as error:
        raise WebConfigError(f"cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise WebConfigError(f"{path}: not UTF-8 text") from None
    try:
        document = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except WebConfigError as error:
        raise WebConfigError(f"{path}: {error}") from None
    except yaml.MarkedYAMLError as error:
        # Only the position and the parser's own words: the offending line may hold a secret.
        mark = error.problem_mark or error.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise WebConfigError(f"{path}: invalid YAML{where}: {error.problem or error.context}") from None
    except yaml.YAMLError as error:
        raise WebConfigError(f"{path}: invalid YAML: {type(error).__name__}") from None
    try:
        return parse_web_config(document, os.path.dirname(os.path.abspath(path)), source_path=path,
                                source_fingerprint=source_fingerprint)
    except WebConfigError as error:
        raise WebConfigError(f"{path}: {error}") from None


def parse_web_config(document: object, base_dir: str, source_path: str | None = None,
                     source_fingerprint: Mapping[str, FileState] | None = None) -> WebConfig:
    """Validates a parsed YAML document (None for an empty file) and builds the WebConfig."""
    top = _mapping(document, "the web config", _TOP_LEVEL_KEYS, allow_none=True)
    http = _mapping(top.get("http_server_config"), "http_server_config", _HTTP_KEYS, allow_none=True)
    return WebConfig(
        tls=_parse_tls(top.get("tls_server_config"), base_dir),
        headers=_parse_headers(http.get("headers")),
        users=_parse_users(top.get("basic_auth_users")),
        rate_limit=_parse_rate_limit(top.get("rate_limit")),
        http2=_boolean(http.get("http2", True), "http_server_config.http2"),
        source_path=source_path,
        empty=not top,
        source_fingerprint=source_fingerprint,
    )


def _quote(value: object) -> str:
    text = str(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _type_name(value: object) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "nothing"}.get(type(value), type(value).__name__)


def _mapping(value: object, where: str, known_keys: tuple[str, ...], allow_none: bool = False) -> dict[str, Any]:
    if value is None and allow_none:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{where} must be a mapping, not {_type_name(value)}")
    for key in value:
        if key not in known_keys:
            raise WebConfigError(f"{where}: unknown key {_quote(key)} (known: {', '.join(known_keys)})")
    return value


def _string(value: object, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise WebConfigError(f"{where} must be a string, not {_type_name(value)}")
    return value


def _boolean(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise WebConfigError(f"{where} must be true or false, not {_type_name(value)}")
    return value


def _string_list(value: object, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise WebConfigError(f"{where} must be a list of strings")
    return tuple(value)


def _path(value: object, where: str, base_dir: str) -> str | None:
    text = _string(value, where)
    if not text:
        return None
    return os.path.normpath(os.path.join(base_dir, text))


def _parse_tls(value: object, base_dir: str) -> TLSServerConfig | None:
    section = _mapping(value, "tls_server_config", _TLS_KEYS, allow_none=True)
    client_auth_type = _string(section.get("client_auth_type"), "tls_server_config.client_auth_type") or ""
    if client_auth_type in _UNSUPPORTED_CLIENT_AUTH_TYPES:
        raise WebConfigError(
            f"tls_server_config.client_auth_type {client_auth_type} is not supported: Python's ssl module "
            "cannot require a client certificate without verifying it; use RequireAndVerifyClientCert "
            "with client_ca_file")
    if client_auth_type not in _VERIFY_MODES:
        raise WebConfigError(f"tls_server_config.client_auth_type: unknown value {_quote(client_auth_type)} "
                             f"(expected one of {', '.join(CLIENT_AUTH_TYPES)})")
    tls = TLSServerConfig(
        cert_file=_path(section.get("cert_file"), "tls_server_config.cert_file", base_dir),
        key_file=_path(section.get("key_file"), "tls_server_config.key_file", base_dir),
        cert=_string(section.get("cert"), "tls_server_config.cert") or None,
        key=_string(section.get("key"), "tls_server_config.key") or None,
        client_ca_file=_path(section.get("client_ca_file"), "tls_server_config.client_ca_file", base_dir),
        client_ca=_string(section.get("client_ca"), "tls_server_config.client_ca") or None,
        client_auth_type=client_auth_type or "NoClientCert",
        client_allowed_sans=_string_list(section.get("client_allowed_sans"), "tls_server_config.client_allowed_sans"),
        min_version=_tls_version(section.get("min_version"), "min_version", ssl.TLSVersion.TLSv1_2),
        max_version=_tls_version(section.get("max_version"), "max_version", ssl.TLSVersion.TLSv1_3),
        cipher_suites=_cipher_suites(section.get("cipher_suites")),
        prefer_server_cipher_suites=_boolean(section.get("prefer_server_cipher_suites", True),
                                             "tls_server_config.prefer_server_cipher_suites"),
        curve_preferences=_curves(section.get("curve_preferences")),
    )
    # As in exporter-toolkit: a section that names no certificate, key, CA or client auth means plain HTTP.
    if not (tls.cert_file or tls.cert or tls.key_file or tls.key or tls.client_ca_file or tls.client_ca
            or client_auth_type):
        return None
    if tls.cert_file and tls.cert:
        raise WebConfigError("tls_server_config: set cert or cert_file, not both")
    if tls.key_file and tls.key:
        raise WebConfigError("tls_server_config: set key or key_file, not both")
    if tls.client_ca_file and tls.client_ca:
        raise WebConfigError("tls_server_config: set client_ca or client_ca_file, not both")
    if not (tls.cert_file or tls.cert):
        raise WebConfigError("tls_server_config: cert_file (or cert) is required for TLS")
    if not (tls.key_file or tls.key):
        raise WebConfigError("tls_server_config: key_file (or key) is required for TLS")
    if (tls.client_ca_file or tls.client_ca) and tls.client_auth_type == "NoClientCert":
        raise WebConfigError(f"tls_server_config: a client CA is configured but client_auth_type is "
                             f"{tls.client_auth_type}; use RequireAndVerifyClientCert or VerifyClientCertIfGiven")
    if tls.client_allowed_sans is not None and tls.client_auth_type != "RequireAndVerifyClientCert":
        raise WebConfigError("tls_server_config.client_allowed_sans requires client_auth_type "
                             "RequireAndVerifyClientCert")
    if tls.min_version > tls.max_version:
        raise WebConfigError("tls_server_config: min_version is higher than max_version")
    return tls


def _tls_version(value: object, key: str, default: ssl.TLSVersion) -> ssl.TLSVersion:
    name = _string(value, f"tls_server_config.{key}")
    if not name:
        return default
    if name not in TLS_VERSIONS:
        raise WebConfigError(f"tls_server_config.{key}: unknown TLS version {_quote(name)} "
                             f"(expected one of {', '.join(TLS_VERSIONS)})")
    return TLS_VERSIONS[name]


def _cipher_suites(value: object) -> tuple[str, ...]:
    names = _string_list(value, "tls_server_config.cipher_suites") or ()
    for name in names:
        if name not in TLS12_CIPHER_SUITES and name not in TLS13_CIPHER_SUITES:
            raise WebConfigError(f"tls_server_config.cipher_suites: unknown or unsupported cipher suite {_quote(name)} "
                                 "(use Go crypto/tls names, e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)")
    return names


def _curves(value: object) -> tuple[str, ...]:
    names = _string_list(value, "tls_server_config.curve_preferences") or ()
    for name in names:
        if name not in CURVES:
            raise WebConfigError(f"tls_server_config.curve_preferences: unknown curve {_quote(name)} "
                                 f"(expected one of {', '.join(CURVES)})")
    if len(names) > 1:
        raise WebConfigError("tls_server_config.curve_preferences: only a single curve is supported "
                             "(Python's ssl module cannot set a preference list)")
    return names


def _parse_headers(value: object) -> dict[str, str]:
    headers = _mapping(value, "http_server_config.headers", tuple(CONFIGURABLE_HEADERS), allow_none=True)
    result = {}
    for name, header_value in headers.items():
        text = _string(header_value, f"http_server_config.headers.{name}") or ""
        if "\r" in text or "\n" in text:
            raise WebConfigError(f"http_server_config.headers.{name}: the value must be a single line")
        allowed = CONFIGURABLE_HEADERS[name]
        if text and allowed is not None and text not in allowed:
            raise WebConfigError(f"http_server_config.headers.{name}: invalid value {_quote(text)} "
                                 f"(expected one of {', '.join(allowed)})")
        if text:  # blank means unset
            result[name] = text
    return result


def _parse_users(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"basic_auth_users must be a mapping of user to bcrypt hash, not {_type_name(value)}")
    users = {}
    for user, hashed in value.items():
        if not isinstance(user, str) or not user:
            raise WebConfigError(f"basic_auth_users: user name {_quote(user)} must be a non-empty string")
        if ":" in user:
            raise WebConfigError(f"basic_auth_users: user name {_quote(user)} must not contain ':'")
        match = _BCRYPT_HASH.fullmatch(hashed) if isinstance(hashed, str) else None
        if match is None or not 4 <= int(match["cost"]) <= 31:
            raise WebConfigError(f"basic_auth_users: the password of user {_quote(user)} is not a bcrypt hash "
                                 "(expected $2y$, $2b$ or $2a$ followed by the cost, e.g. from htpasswd -nBC 10)")
        users[user] = hashed
    return users


def _parse_rate_limit(value: object) -> RateLimit | None:
    section = _mapping(value, "rate_limit", _RATE_LIMIT_KEYS, allow_none=True)
    interval = _go_duration(section.get("interval", 0), "rate_limit.interval")
    if interval == 0:
        return None
    burst = section.get("burst", 0)
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise WebConfigError("rate_limit.burst must be a whole number of at least 1 when rate_limit.interval is set")
    return RateLimit(interval_seconds=interval, burst=burst)


def _go_duration(value: object, where: str) -> float:
    """Seconds in a Go duration string ("1s", "1m30s", "250ms"); 0 disables."""
    if value == 0 and not isinstance(value, bool):
        return 0.0
    if isinstance(value, str):
        try:
            return parse_go_duration(value)
        except ValueError:
            pass
    raise WebConfigError(f"{where} must be a duration such as 1s, 250ms or 1m30s")


# ------------------------------------------------------------------------------------------ TLS context

@contextmanager
def _pem_file(inline: str | None, path: str | None) -> Iterator[str | None]:
    """Yields a path holding the PEM: the configured file, or a private temporary copy of the inline text."""
    if inline is None:
        yield path
        return
    directory = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.NamedTemporaryFile("w", suffix=".pem", dir=directory, encoding="utf-8") as file:
        file.write(inline)
        file.flush()
        yield file.name


def _read_text(path: str, key: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read()
    except OSError as error:
        raise WebConfigError(f"tls_server_config.{key}: cannot read {path}: {error.strerror or error}") from None


def _refuse_encrypted_key() -> bytes:
    raise _EncryptedKey()


def _build_ssl_context(tls: TLSServerConfig) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with warnings.catch_warnings():
        # Python deprecates TLS 1.0/1.1; a config that asks for them explicitly gets them.
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = tls.min_version
        context.maximum_version = tls.max_version
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    tls12_suites = [TLS12_CIPHER_SUITES[name] for name in tls.cipher_suites if name in TLS12_CIPHER_SUITES]
    if tls12_suites:
        try:
            context.set_ciphers(":".join(dict.fromkeys(tls12_suites)))
        except ssl.SSLError:
            raise WebConfigError("tls_server_config.cipher_suites: none of these suites is available "
                                 "in this OpenSSL build") from None
    if tls.curve_preferences:
        context.set_ecdh_curve(CURVES[tls.curve_preferences[0]])
    context.set_alpn_protocols(["http/1.1"])

    cert_text = tls.cert if tls.cert is not None else _read_text(str(tls.cert_file), "cert_file")
    cert_where = "cert" if tls.cert is not None else f"cert_file {tls.cert_file}"
    key_where = "key" if tls.key is not None else f"key_file {tls.key_file}"
    if tls.key is None:
        _read_text(str(tls.key_file), "key_file")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=cert_text)
    except (ssl.SSLError, ValueError):
        raise WebConfigError(f"tls_server_config.{cert_where}: no PEM certificate found") from None
    with _pem_file(tls.cert, tls.cert_file) as cert_path, _pem_file(tls.key, tls.key_file) as key_path:
        try:
            context.load_cert_chain(str(cert_path), str(key_path), password=_refuse_encrypted_key)
        except _EncryptedKey:
            raise WebConfigError(f"tls_server_config.{key_where}: the private key is encrypted; "
                                 "encrypted keys are not supported") from None
        except ssl.SSLError as error:
            if error.reason == "KEY_VALUES_MISMATCH":
                raise WebConfigError(f"tls_server_config: the private key ({key_where}) does not match "
                                     f"the certificate ({cert_where})") from None
            raise WebConfigError(f"tls_server_config.{key_where}: no usable PEM private key found") from None
        except OSError as error:
            raise WebConfigError(f"tls_server_config: cannot load the certificate and key: "
                                 f"{error.strerror or type(error).__name__}") from None

    context.verify_mode = _VERIFY_MODES[tls.client_auth_type]
    if context.verify_mode != ssl.CERT_NONE:
        if tls.client_ca_file or tls.client_ca:
            ca_text = tls.client_ca if tls.client_ca is not None else _read_text(str(tls.client_ca_file),
                                                                                  "client_ca_file")
            ca_where = "client_ca" if tls.client_ca is not None else f"client_ca_file {tls.client_ca_file}"
            try:
                context.load_verify_locations(cadata=ca_text)
            except (ssl.SSLError, ValueError):
                raise WebConfigError(f"tls_server_config.{ca_where}: no PEM certificate found") from None
        else:
            # Go verifies client certificates against the system roots when no client CA is given.
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    return context


# ------------------------------------------------------------------------------------------- reloading

def _file_state(path: str) -> FileState:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


def _file_fingerprint(paths: tuple[str, ...]) -> dict[str, FileState]:
    return {path: _file_state(path) for path in paths}


_RELOAD_ATTEMPTS = 5


class ReloadingWebConfig:
    """Follows a web config file, as exporter-toolkit does ("read upon every http request").

    `current()` returns the config to use now and never waits: when the file or a certificate, key or CA
    file it names has changed since it was read, the file is loaded again on a thread of its own, and
    requests are served with the previous config until the new one is ready (a load reads files, builds
    the TLS context, and may be slow). What the listener promised at start stays:
    a reload may change certificates, client CAs, users, headers and the rate limit, but a config that
    would turn TLS on or off, stop requiring client certificates or drop basic auth is refused, and so
    is an empty file (a file being rewritten is empty for a moment) or one that does not load. A refused
    config keeps the previous one in force and is logged once as an error, so a certificate rotation
    that is half done never takes the exporter down nor opens it.

    `reload()` (SIGHUP, `systemctl reload`) loads the file at once, changed or not, with the same checks.
    """

    def __init__(self, config: WebConfig) -> None:
        self._config = config
        self._start = config
        self._fingerprint: Mapping[str, FileState] = config.fingerprint
        self._lock = threading.Lock()
        self._apply_lock = threading.Lock()  # one load applies at a time: a request's, or reload()'s
        self._reloading = False
        self._start_failure_logged = False

    def reload(self, occasion: str = "SIGHUP") -> bool:
        """Loads the file now, whether it changed or not, and applies it as a change would be (the same
        refusals); True when the new config is in force. Exactly one line says what happened: info when
        it is in force, else an error, and the previous config stays. Waits for a load that a request
        started, if one is running."""
        path = self._config.source_path
        if path is None:
            logger.info("received %s: the web config was not read from a file, nothing to reload", occasion)
            return False
        with self._apply_lock:
            before = self._config
            try:
                self._fingerprint = self._load_once(path, f"re-read on {occasion}", f" on {occasion}")
            except Exception as error:  # a bug must not take the exporter down on a reload
                logger.error("web config re-read on %s failed, keeping the previous one: %s", occasion,
                             type(error).__name__)
                logger.debug("web config reload failed", exc_info=True)
                return False
            return self._config is not before

    def current(self) -> WebConfig:
        config = self._config
        if config.source_path is not None and self._changed(self._fingerprint):
            self._start_reload(config.source_path)
        return config

    def _start_reload(self, path: str) -> None:
        with self._lock:
            if self._reloading:
                return
            self._reloading = True
        try:
            threading.Thread(target=self._reload, args=(path,), name="web-config-reload", daemon=True).start()
        except RuntimeError as error:  # no thread left (a task limit): the next request tries again
            with self._lock:
                self._reloading = False
            if not self._start_failure_logged:
                self._start_failure_logged = True
                logger.error("web config changed but cannot be reloaded now, keeping the previous one: %s", error)

    def _reload(self, path: str) -> None:
        try:
            for _attempt in range(_RELOAD_ATTEMPTS):
                with self._apply_lock:
                    self._fingerprint = self._load_once(path)
                if not self._changed(self._fingerprint):
                    break
                # A file changed while it was being read: read it again.
        except Exception as error:  # a bug must not stop later reloads
            logger.error("web config reload failed, keeping the previous one: %s", type(error).__name__)
            logger.debug("web config reload failed", exc_info=True)
        finally:
            self._start_failure_logged = False
            with self._lock:
                self._reloading = False

    @staticmethod
    def _changed(fingerprint: Mapping[str, FileState]) -> bool:
        return _file_fingerprint(tuple(fingerprint)) != fingerprint

    def _load_once(self, path: str, what: str = "changed", done: str = "") -> Mapping[str, FileState]:
        """Loads the file and applies it if allowed, with one log line (`what` happened to the file; `done`
        ends the success line); returns the fingerprint to watch from now on, of the files as they were
        before they were read."""
        kept = self._config.fingerprint
        before = _file_fingerprint((path,))
        try:
            config = load_web_config(path)
        except WebConfigError as error:
            logger.error("web config %s but cannot be used, keeping the previous one: %s", what, error)
            return {**kept, **before}
        refusal = self._refusal(config)
        if refusal is not None:
            logger.error("web config %s but %s, keeping the previous one: %s", what, refusal, path)
            return {**kept, **config.fingerprint}
        logger.info("web config reloaded from %s%s", path, done)
        self._config = config
        return config.fingerprint

    def _refusal(self, config: WebConfig) -> str | None:
        """Why `config` may not replace the running one, or None."""
        start = self._start
        if config.empty:
            return "the file is empty"
        if (config.ssl_context() is None) != (start.ssl_context() is None):
            return ("it would turn TLS " + ("off" if start.ssl_context() is not None else "on")
                    + " (the listener's scheme is fixed at start: restart to change it)")
        if start.requires_client_certificate and not config.requires_client_certificate:
            return "it would stop requiring client certificates (restart to change that)"
        if start.basic_auth_users and not config.basic_auth_users:
            return "it would turn basic auth off (restart to change that)"
        return None
