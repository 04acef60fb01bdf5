"""Reading and validating the web config file (`--web.config.file`, the format: `vllm_xpu_exporter.http.webconfig`):
`load_web_config` reads the file as strict YAML (no duplicate keys, bounded nesting), `parse_web_config`
validates every key and value against what exporter-toolkit accepts and builds the `WebConfig`, its TLS
context included. A file that cannot be used raises `WebConfigError`: one line naming the problem,
never a secret.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import yaml

from vllm_xpu_exporter.durations import parse_go_duration
from vllm_xpu_exporter.http.tls import (CLIENT_AUTH_TYPES, CURVES, TLS12_CIPHER_SUITES, TLS13_CIPHER_SUITES, TLS_VERSIONS,
                               UNSUPPORTED_CLIENT_AUTH_TYPES, VERIFY_MODES, build_ssl_context)
from vllm_xpu_exporter.http.webconfig import FileState, RateLimit, TLSServerConfig, WebConfig, WebConfigError

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

_BCRYPT_HASH = re.compile(r"\$2[aby]\$(?P<cost>[0-9]{2})\$[./A-Za-z0-9]{53}")

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
    source_fingerprint = file_fingerprint((path,))
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
    tls = _parse_tls(top.get("tls_server_config"), base_dir)
    headers = _parse_headers(http.get("headers"))
    users = _parse_users(top.get("basic_auth_users"))
    rate_limit = _parse_rate_limit(top.get("rate_limit"))
    http2 = _boolean(http.get("http2", True), "http_server_config.http2")
    # The state of every file this config is read from, taken before the file was read: a change that
    # lands while the config loads is seen as a change afterwards, never mistaken for what was loaded.
    fingerprint = {**(source_fingerprint or {}), **file_fingerprint(tls.files if tls else ())}
    return WebConfig(
        tls=tls,
        ssl_context=build_ssl_context(tls) if tls is not None else None,
        headers=headers,
        users=users,
        rate_limit=rate_limit,
        http2=http2,
        source_path=source_path,
        empty=not top,
        fingerprint=fingerprint,
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
    if client_auth_type in UNSUPPORTED_CLIENT_AUTH_TYPES:
        raise WebConfigError(
            f"tls_server_config.client_auth_type {client_auth_type} is not supported: Python's ssl module "
            "cannot require a client certificate without verifying it; use RequireAndVerifyClientCert "
            "with client_ca_file")
    if client_auth_type not in VERIFY_MODES:
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


def _file_state(path: str) -> FileState:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


def file_fingerprint(paths: tuple[str, ...]) -> dict[str, FileState]:
    """Each file's state now: taken before the files are read, and again to tell a change since."""
    return {path: _file_state(path) for path in paths}
