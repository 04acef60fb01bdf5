"""Throw-away PKI for TLS tests, made with the openssl command line tool.

`make_pki(directory)` writes a test CA, a server certificate for localhost / 127.0.0.1 / ::1 signed by
it, a client certificate signed by it, and a second ("rogue") CA with a client certificate of its own,
which the server must not trust. Keys are EC P-256 (fast to make); certificates are valid for two days.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

CLIENT_SAN = "DNS:scraper.test"


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    server: KeyPair
    client: KeyPair
    rogue_ca_cert: Path
    rogue_client: KeyPair


def _openssl(*args: str | Path) -> None:
    result = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def _new_ca(directory: Path, name: str) -> KeyPair:
    ca = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", ca.key, "-out", ca.cert, "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return ca


def _new_leaf(directory: Path, name: str, ca: KeyPair, extensions: str) -> KeyPair:
    leaf = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    csr = directory / f"{name}.csr"
    extfile = directory / f"{name}.ext"
    extfile.write_text(extensions + "\nbasicConstraints=critical,CA:FALSE\n")
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", leaf.key, "-out", csr, "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key, "-CAcreateserial",
             "-out", leaf.cert, "-days", "2", "-extfile", extfile)
    return leaf


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _new_ca(directory, "test-ca")
    rogue_ca = _new_ca(directory, "rogue-ca")
    server = _new_leaf(directory, "server", ca,
                       "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1\nextendedKeyUsage=serverAuth")
    client = _new_leaf(directory, "client", ca, f"subjectAltName={CLIENT_SAN}\nextendedKeyUsage=clientAuth")
    rogue_client = _new_leaf(directory, "rogue-client", rogue_ca,
                             f"subjectAltName={CLIENT_SAN}\nextendedKeyUsage=clientAuth")
    return Pki(ca_cert=ca.cert, server=server, client=client, rogue_ca_cert=rogue_ca.cert,
                   rogue_client=rogue_client)


def make_self_signed(directory: Path, name: str) -> KeyPair:
    """A lone self-signed certificate and key (for cert/key mismatch tests)."""
    directory.mkdir(parents=True, exist_ok=True)
    return _new_ca(directory, name)


def make_encrypted_key(directory: Path, source_key: Path, passphrase: str = "secret-passphrase") -> Path:
    encrypted = directory / f"{source_key.stem}-encrypted.key"
    _openssl("pkey", "-in", source_key, "-out", encrypted, "-aes256", "-passout", f"pass:{passphrase}")
    return encrypted
