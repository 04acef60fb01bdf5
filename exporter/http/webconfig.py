"""The exporter-toolkit web configuration file (`--web.config.file`): TLS, basic auth, headers, rate limit.

This module is the config as loaded (`WebConfig`) and its checks of a request (basic auth, client
certificate SANs, rate limit); `vllm_xpu_exporter.http.loading` reads and validates the file, `vllm_xpu_exporter.http.tls`
builds the TLS context, `vllm_xpu_exporter.http.reloading` follows the file.

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
import secrets
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import bcrypt

_BCRYPT_MAX_PASSWORD_BYTES = 72
_BCRYPT_QUEUE = 2  # of the HTTP server's four workers: two stay free for requests that need no bcrypt


FileState = tuple[int, int, int, int, int] | None  # (device, inode, size, mtime ns, ctime ns); None: no such file


class PasswordChecksBusy(Exception):
    """Too many password checks are under way: the request should be answered 429, to be retried."""


class WebConfigError(ValueError):
    """The web config file cannot be used. The message is one line and names the problem."""


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
    """A loaded web config. Build it with `load_web_config(path)` or `parse_web_config(document, base_dir)`
    (`vllm_xpu_exporter.http.loading`), which validate it and build its TLS context.

    Thread-safe: the HTTP server calls `check_basic_auth` and `allow_request` from many threads.
    """

    def __init__(self, *, tls: TLSServerConfig | None, ssl_context: ssl.SSLContext | None, headers: Mapping[str, str],
                 users: Mapping[str, str], rate_limit: RateLimit | None, http2: bool, source_path: str | None,
                 empty: bool = False, fingerprint: Mapping[str, FileState] | None = None) -> None:
        self.tls = tls
        self.headers: Mapping[str, str] = MappingProxyType(dict(headers))
        self.rate_limit = rate_limit
        self.http2 = http2
        self.source_path = source_path
        self.empty = empty
        self._users = {user: hashed.encode("ascii") for user, hashed in users.items()}
        # The state of every file this config is read from, taken before the file was read (see
        # `vllm_xpu_exporter.http.loading.parse_web_config`).
        self.fingerprint: Mapping[str, FileState] = MappingProxyType(dict(fingerprint or {}))
        self._ssl_context = ssl_context
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
