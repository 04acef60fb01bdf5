"""HTTP(S) requests the way a scraper makes them, for the tests of the web layer and its security:
one request, TLS client contexts, basic-auth headers, and curl; and clients that send huge headers
(tests/http/test_security.py and benchmarks/hostile_bench.py)."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from certs import KeyPair


def request(host: str, port: int, path: str = "/metrics", *, method: str = "GET",
            headers: Mapping[str, str] | None = None, context: ssl.SSLContext | None = None,
            body: bytes | None = None, timeout: float = 10) -> tuple[int, http.client.HTTPMessage, bytes]:
    """(status, headers, body); HTTPS when a TLS `context` is given."""
    if context is None:
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
    else:
        connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    try:
        connection.request(method, path, body=body, headers=dict(headers or {}))
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def client_context(trusted_ca: Path, client: KeyPair | None = None, *,
                   maximum: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    """A scraper's TLS context: trusts `trusted_ca`, presents `client`'s certificate if given, speaks TLS
    up to `maximum`."""
    context = ssl.create_default_context(cafile=str(trusted_ca))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    if maximum is not None:
        context.maximum_version = maximum
    return context


def authorization(user: str, password: str | bytes) -> str:
    """The value of HTTP basic auth's Authorization header (a bytes password is sent as it is)."""
    raw = user.encode() + b":" + (password if isinstance(password, bytes) else password.encode())
    return "Basic " + base64.b64encode(raw).decode()


def basic(user: str, password: str | bytes) -> dict[str, str]:
    """The Authorization header of HTTP basic auth."""
    return {"Authorization": authorization(user, password)}


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["curl", "--silent", "--show-error", "--max-time", "10", *args],
                          capture_output=True, text=True, timeout=30)


def huge_header_request() -> bytes:
    """A request with 95 header lines of 65,000 bytes (6 MB), each under the old 64 KiB line limit."""
    lines = b"".join(b"X-Padding-%03d: " % number + b"a" * 65_000 + b"\r\n" for number in range(95))
    return b"GET /metrics HTTP/1.1\r\nHost: exporter\r\n" + lines + b"\r\n"


def send_huge_headers(host: str, port: int, clients: int, slowly: bool) -> None:
    """`clients` connections that start together and each send `huge_header_request()`: all of it at
    once, or (`slowly`) 64 KiB every 20 ms so that they are all in flight together; returns when every
    client has had its answer or been refused (within a minute)."""
    request = huge_header_request()
    go = threading.Barrier(clients)

    def attack() -> None:
        with socket.create_connection((host, port), timeout=20) as sock:
            go.wait(10)
            try:
                if slowly:
                    for offset in range(0, len(request), 65536):
                        sock.sendall(request[offset:offset + 65536])
                        time.sleep(0.02)
                else:
                    sock.sendall(request)
                sock.recv(65536)
            except OSError:
                pass  # refused part-way: the exporter stopped reading

    threads = [threading.Thread(target=attack, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
