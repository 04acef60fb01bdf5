"""One HTTP(S) request the way a scraper makes it, for the tests of the web layer and its security."""

from __future__ import annotations

import base64
import http.client
import ssl
from collections.abc import Mapping


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


def basic(user: str, password: str) -> dict[str, str]:
    """The Authorization header of HTTP basic auth."""
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
