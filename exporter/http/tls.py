"""The web config's TLS (`tls_server_config`): the names it accepts, as Go's crypto/tls spells them (client
auth types, versions, cipher suites, curves), and `build_ssl_context`, the server-side `ssl.SSLContext` of a
validated section (the differences from Go that Python's `ssl` module forces: `vllm_xpu_exporter.http.webconfig`).
No private key, inline or in a file, appears in an error message.
"""

from __future__ import annotations

import os
import ssl
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from vllm_xpu_exporter.http.webconfig import TLSServerConfig, WebConfigError

CLIENT_AUTH_TYPES = ("NoClientCert", "RequestClientCert", "RequireAnyClientCert", "VerifyClientCertIfGiven",
                     "RequireAndVerifyClientCert")
UNSUPPORTED_CLIENT_AUTH_TYPES = ("RequireAnyClientCert", "RequireClientCert")
VERIFY_MODES = {
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


class _EncryptedKey(Exception):
    pass


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


def build_ssl_context(tls: TLSServerConfig) -> ssl.SSLContext:
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

    context.verify_mode = VERIFY_MODES[tls.client_auth_type]
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
