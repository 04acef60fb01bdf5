"""Web config files (exporter-toolkit's format) for the tests of TLS and basic auth: the section that
serves the test PKI's server certificate, and the users section."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from certs import Pki


def tls_server_config(pki: Pki, *, client_auth_type: str | None = None, **settings: str) -> str:
    """`tls_server_config` serving `pki`'s server certificate; with a `client_auth_type`, client
    certificates are checked against `pki`'s CA. `settings`: further keys of the section, as YAML."""
    text = f"tls_server_config:\n  cert_file: {pki.server.cert}\n  key_file: {pki.server.key}\n"
    if client_auth_type is not None:
        text += f"  client_auth_type: {client_auth_type}\n  client_ca_file: {pki.ca_cert}\n"
    return text + "".join(f"  {key}: {value}\n" for key, value in settings.items())


def basic_auth_users(hashes: Mapping[str, str]) -> str:
    """`basic_auth_users`: each user with its bcrypt hash."""
    return "basic_auth_users:\n" + "".join(f"  {user}: '{hashed}'\n" for user, hashed in hashes.items())


def write_web_config(directory: Path, text: str, name: str = "web-config.yml") -> Path:
    path = directory / name
    path.write_text(text)
    return path
