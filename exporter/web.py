"""The exporter's HTTP server: metrics, landing page, health, TLS and basic auth from the web config.

Standard library only (`http.server.ThreadingHTTPServer`): one daemon thread per connection, each with
a socket timeout, so concurrent scrapes run side by side and a slow or silent client holds up nobody
but itself. TLS handshakes happen in the connection's own thread, never in the accept loop.

Access logs go to the `exporter.web` logger at debug level; nothing is written to stderr directly.
"""

from __future__ import annotations

import errno
import gzip
import html
import ipaddress
import logging
import re
import socket
import socketserver
import ssl
import sys
import threading
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import Any, Callable
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import gzip_accepted

from exporter import __version__
from exporter.exposition import choose_encoder
from exporter.webconfig import ReloadingWebConfig, WebConfig

logger = logging.getLogger("exporter.web")

CONNECTION_TIMEOUT_SECONDS = 30.0
HEALTH_PATH = "/-/healthy"
_ALLOWED_METHODS = ("GET", "HEAD")
_TLS_HANDSHAKE_RECORD = 0x16
_PLAIN_HTTP_TO_TLS_RESPONSE = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                               b"Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
_HOSTNAME = re.compile(r"(?=.{1,253}\.?$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")
_LISTEN_FORMS = "expected host:port, e.g. :9999, 0.0.0.0:9999, 127.0.0.1:9999, [::1]:9999 or localhost:9999"


def parse_listen_address(value: str) -> tuple[str, int]:
    """Splits a Go-style listen address into (host, port); host "" means all interfaces.

    IPv6 literals come without brackets: "[::1]:9999" -> ("::1", 9999). Raises ValueError (one line).
    """
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or value[end + 1:end + 2] != ":":
            raise ValueError(f"invalid listen address {value!r}: an IPv6 address in brackets must be followed "
                             f"by :port, e.g. [::1]:9999")
        host, port_text = value[:end + 1], value[end + 2:]
    else:
        host, colon, port_text = value.rpartition(":")
        if not colon:
            raise ValueError(f"invalid listen address {value!r}: no port ({_LISTEN_FORMS})")
    if not port_text.isascii() or not port_text.isdigit() or len(port_text) > 5 or int(port_text) > 65535:
        raise ValueError(f"invalid listen address {value!r}: the port must be a number from 0 to 65535")
    port = int(port_text)
    if host.startswith("["):
        literal = host[1:-1]
        try:
            ipaddress.IPv6Address(literal)
        except ValueError:
            raise ValueError(f"invalid listen address {value!r}: {literal!r} is not an IPv6 address") from None
        return literal, port
    if ":" in host or "[" in host or "]" in host:
        raise ValueError(f"invalid listen address {value!r}: IPv6 addresses need brackets, e.g. [::1]:{port}")
    if host == "":
        return "", port
    if all(label.isdigit() for label in host.split(".")):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"invalid listen address {value!r}: {host!r} is not an IPv4 address") from None
        return host, port
    if not _HOSTNAME.fullmatch(host):
        raise ValueError(f"invalid listen address {value!r}: {host!r} is not a host name or IP address "
                         f"({_LISTEN_FORMS})")
    return host, port


def _listening_socket(host: str, port: int) -> socket.socket:
    if host in ("", "::"):
        try:
            return _bind(socket.AF_INET6, ("::", port), dual_stack=True)
        except OSError as error:
            if host == "::" or error.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT):
                raise
            logger.debug("IPv6 is unavailable (%s), listening on IPv4 only", error.strerror)
        return _bind(socket.AF_INET, ("0.0.0.0", port))
    candidates = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    # Like Go, a host name that resolves to both families is served on its IPv4 address.
    candidates.sort(key=lambda info: info[0] != socket.AF_INET)
    last_error: OSError | None = None
    for family, _type, _proto, _name, address in candidates:
        try:
            return _bind(family, address)
        except OSError as error:
            last_error = error
    raise last_error or OSError(errno.EADDRNOTAVAIL, f"{host} has no address")


def _bind(family: int, address: tuple[Any, ...], dual_stack: bool = False) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    return sock


def _landing_page(title: str, telemetry_path: str) -> bytes:
    title_html = html.escape(title)
    path_html = html.escape(telemetry_path, quote=True)
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>{title_html}</title></head>\n"
            f"<body>\n<h1>{title_html}</h1>\n<p>Prometheus exporter for Intel GPUs shared by vLLM systemd units."
            f"</p>\n<ul>\n<li><a href=\"{path_html}\">Metrics</a></li>\n"
            f"<li><a href=\"{HEALTH_PATH}\">Health</a></li>\n</ul>\n</body>\n</html>\n").encode("utf-8")


class _Site:
    """What the handlers serve: shared, read-only after construction (the web config reloads itself)."""

    def __init__(self, telemetry_path: str, registry: CollectorRegistry, web_config: WebConfig | None,
                 landing_page_title: str) -> None:
        self.telemetry_path = telemetry_path
        self.registry = registry
        self.landing_page = _landing_page(landing_page_title, telemetry_path)
        self._web_config = ReloadingWebConfig(web_config) if web_config is not None else None

    def web_config(self) -> WebConfig | None:
        return self._web_config.current() if self._web_config is not None else None


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a scraper reuses its connection (and TLS session)
    # Headers and body go out in two writes; with Nagle on, the body waits for the client's delayed ACK
    # of the headers (40 ms on Linux) on every kept-alive request.
    disable_nagle_algorithm = True
    server_version = f"vllm-xpu-exporter/{__version__}"
    sys_version = ""
    server: _HTTPServer
    _extra_headers: Mapping[str, str] = MappingProxyType({})
    _replied = False

    def __getattr__(self, name: str) -> Callable[[], None]:
        # BaseHTTPRequestHandler calls do_<METHOD>; route every method through one place so that any
        # method but GET and HEAD gets 405 (not the stdlib's 501).
        if name.startswith("do_"):
            return self._handle
        raise AttributeError(name)

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        logger.debug("%s %s", self.address_string(), format % args)

    def end_headers(self) -> None:
        for name, value in self._extra_headers.items():
            self.send_header(name, value)
        super().end_headers()

    def _handle(self) -> None:
        self._replied = False
        try:
            self._route()
        except (ConnectionError, TimeoutError):
            raise
        except Exception as error:  # a bug must cost this request only, and tell the client nothing
            logger.error("error serving %s %s: %s", self.command, self.path, type(error).__name__)
            logger.debug("error serving %s %s", self.command, self.path, exc_info=True)
            self.close_connection = True
            if not self._replied:
                self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, b"Internal server error.\n")

    def _route(self) -> None:
        site = self.server.site
        config = site.web_config()
        if config is not None:
            self._extra_headers = config.headers
        if self.command not in _ALLOWED_METHODS or self._has_body():
            # The body is never read; closing keeps it from being parsed as the next request.
            self.close_connection = True
        if config is not None and not config.allow_request():
            self._reply(HTTPStatus.TOO_MANY_REQUESTS, b"Too many requests.\n")
            return
        if config is not None and not config.check_basic_auth(self.headers.get("Authorization")):
            self._reply(HTTPStatus.UNAUTHORIZED, b"Unauthorized.\n", {"WWW-Authenticate": "Basic"})
            return
        url = urlsplit(self.path)
        if url.path == site.telemetry_path:
            handler = self._metrics
        elif url.path == "/":
            handler = self._landing_page
        elif url.path == HEALTH_PATH:
            handler = self._healthy
        else:
            self._reply(HTTPStatus.NOT_FOUND, b"Not found.\n")
            return
        if self.command not in _ALLOWED_METHODS:
            self._reply(HTTPStatus.METHOD_NOT_ALLOWED, f"Method {self.command} not allowed.\n".encode(),
                        {"Allow": ", ".join(_ALLOWED_METHODS)})
            return
        handler(url.query)

    def _has_body(self) -> bool:
        return bool(self.headers.get("Transfer-Encoding")) or self.headers.get("Content-Length", "0").strip() != "0"

    def _metrics(self, _query: str) -> None:
        site = self.server.site
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        try:
            body = encoder(site.registry)
        except Exception as error:
            logger.error("collecting metrics failed: %s: %s", type(error).__name__, error)
            logger.debug("collecting metrics failed", exc_info=True)
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, b"An error has occurred while collecting metrics.\n")
            return
        headers = {"Vary": "Accept, Accept-Encoding"}
        if gzip_accepted(self.headers.get("Accept-Encoding", "")):
            body = gzip.compress(body, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        self._reply(HTTPStatus.OK, body, headers, content_type=content_type)

    def _landing_page(self, _query: str) -> None:
        self._reply(HTTPStatus.OK, self.server.site.landing_page, content_type="text/html; charset=utf-8")

    def _healthy(self, _query: str) -> None:
        self._reply(HTTPStatus.OK, b"OK")

    def _reply(self, status: HTTPStatus, body: bytes, headers: Mapping[str, str] | None = None,
               content_type: str = "text/plain; charset=utf-8") -> None:
        self._replied = True
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, listening_socket: socket.socket, site: _Site) -> None:
        self.address_family = listening_socket.family
        # BaseServer, not TCPServer: the socket is already bound and listening.
        socketserver.BaseServer.__init__(self, listening_socket.getsockname(), _RequestHandler)
        self.socket = listening_socket
        self.site = site
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        connection = request
        self._track(connection, True)
        try:
            request.settimeout(CONNECTION_TIMEOUT_SECONDS)
            config = self.site.web_config()
            context = config.ssl_context() if config is not None else None
            if config is not None and context is not None:
                secured = self._tls_handshake(request, client_address, context, config)
                if secured is None:
                    return
                self._track(request, False)
                connection = secured
                self._track(connection, True)
            self.finish_request(connection, client_address)
        except Exception:
            self.handle_error(connection, client_address)
        finally:
            self._track(connection, False)
            self.shutdown_request(connection)

    def _tls_handshake(self, request: socket.socket, client_address: Any, context: ssl.SSLContext,
                       config: WebConfig) -> ssl.SSLSocket | None:
        try:
            first = request.recv(1, socket.MSG_PEEK)
            if first and first[0] != _TLS_HANDSHAKE_RECORD:
                logger.debug("plain HTTP (or other non-TLS data) from %s on the TLS port", client_address[0])
                if first.isalpha():
                    request.settimeout(1.0)
                    request.recv(65536)  # so that closing does not reset the connection under the reply
                    request.sendall(_PLAIN_HTTP_TO_TLS_RESPONSE)
                return None
            if not first:
                return None
            secured = context.wrap_socket(request, server_side=True)
        except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
            logger.debug("TLS handshake with %s failed: %s", client_address[0], error)
            return None
        if not config.client_certificate_allowed(secured.getpeercert()):
            logger.debug("client certificate of %s has none of the allowed SANs", client_address[0])
            secured.close()
            return None
        return secured

    def _track(self, connection: socket.socket, active: bool) -> None:
        with self._connections_lock:
            if active:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def close_connections(self) -> None:
        """Ends every open connection (idle keep-alive ones included) so their threads finish."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                # The plain socket call, also for TLS sockets: this runs outside the connection's thread.
                socket.socket.shutdown(connection, socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError, ssl.SSLError)):
            logger.debug("connection from %s ended: %s", client_address[0], error)
        else:
            logger.error("error on connection from %s: %s", client_address[0], type(error).__name__)
            logger.debug("error on connection from %s", client_address[0], exc_info=True)


class ExporterServer:
    """Serves `registry` at `telemetry_path` on `listen_address` (see parse_listen_address).

    Binds in the constructor: an unusable address raises the system's OSError (EADDRINUSE,
    EADDRNOTAVAIL, socket.gaierror...) unchanged, and a malformed one ValueError. `serve_forever()` serves until
    `shutdown()` (which may be called from any thread, also before or without serve_forever).
    """

    def __init__(self, listen_address: str, telemetry_path: str, registry: CollectorRegistry,
                 web_config: WebConfig | None = None, landing_page_title: str = "vllm-xpu-exporter") -> None:
        if not telemetry_path.startswith("/"):
            raise ValueError(f"invalid telemetry path {telemetry_path!r}: it must start with '/'")
        host, port = parse_listen_address(listen_address)
        listening_socket = _listening_socket(host, port)
        self._httpd = _HTTPServer(listening_socket, _Site(telemetry_path, registry, web_config, landing_page_title))
        self._state_lock = threading.Lock()
        self._serving = False
        self._closed = False

    @property
    def server_address(self) -> tuple[str, int]:
        """The bound (host, port); host "::" when listening dual-stack on all interfaces."""
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        with self._state_lock:
            if self._closed:
                return
            self._serving = True
        self._httpd.serve_forever(poll_interval)

    def shutdown(self) -> None:
        """Stops serve_forever, closes the listening socket and ends open connections. Idempotent."""
        with self._state_lock:
            serving, self._closed = self._serving, True
        if serving:
            self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.close_connections()
