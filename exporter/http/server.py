"""The exporter's HTTP server: metrics, landing page, health, TLS and basic auth from the web config.

Connections, TLS handshakes and request parsing are `vllm_xpu_exporter.http.connections`'s (an event loop and a small
fixed pool of workers, with bounded memory and time per client); this module serves the routes.

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
import ssl
import threading
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry

from vllm_xpu_exporter import __version__
from vllm_xpu_exporter.http.connections import ConnectionServer, Request, Response, ServerLimits, render_response
from vllm_xpu_exporter.http.exposition import choose_encoder, restricted
from vllm_xpu_exporter.http.reloading import ReloadingWebConfig
from vllm_xpu_exporter.http.runbook import RUNBOOK_PATH, runbook_page
from vllm_xpu_exporter.http.webconfig import PasswordChecksBusy, WebConfig

logger = logging.getLogger("vllm_xpu_exporter.web")

HEALTH_PATH = "/-/healthy"
READY_PATH = "/-/ready"
SERVER_NAME = f"vllm-xpu-exporter/{__version__}"
_ALLOWED_METHODS = ("GET", "HEAD")
_HOSTNAME = re.compile(r"(?=.{1,253}\.?$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")
_HEX_LABEL = re.compile(r"0[xX][0-9A-Fa-f]*")
# A route besides /metrics: path -> what makes its body and content type for each request (e.g. /sd/vllm).
Document = Callable[[], tuple[bytes, str]]
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
    if _ends_in_a_number(host):
        # The resolver reads such a name as an IPv4 address in another form (inet_aton: 0x7f.1, 127.1,
        # 2130706433 are all 127.0.0.1), which hides what is listened on: only dotted quads are taken.
        raise ValueError(f"invalid listen address {value!r}: {host!r} is not an IPv4 address in dotted-quad "
                         f"form nor a host name ({_LISTEN_FORMS})")
    if not _HOSTNAME.fullmatch(host):
        raise ValueError(f"invalid listen address {value!r}: {host!r} is not a host name or IP address "
                         f"({_LISTEN_FORMS})")
    return host, port


def _bind_all(listen_address: str | Sequence[str]) -> list[socket.socket]:
    addresses = [listen_address] if isinstance(listen_address, str) else list(listen_address)
    endpoints = [parse_listen_address(address) for address in addresses]
    check_distinct_listen_addresses(addresses)
    bound: list[socket.socket] = []
    try:
        for address, (host, port) in zip(addresses, endpoints):
            try:
                bound.append(_listening_socket(host, port))
            except OSError as error:
                raise ListenError(address, error) from error
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    return bound


class ListenError(OSError):
    """A listen address that cannot be served: `address` as given, errno and strerror as the system said."""

    def __init__(self, address: str, error: OSError) -> None:
        super().__init__(error.errno, error.strerror or str(error))
        self.address = address

    def __str__(self) -> str:
        return f"cannot listen on {self.address}: {self.strerror}"


def check_distinct_listen_addresses(addresses: Sequence[str]) -> None:
    """ValueError naming the first address given twice (the same host and port, however written); port 0
    (any free port) may repeat."""
    seen: dict[tuple[str, int], str] = {}
    for address in addresses:
        host, port = parse_listen_address(address)
        key = ("" if host in ("", "::") else host.lower().rstrip("."), port)
        if port and key in seen:
            same = "" if seen[key] == address else f" (as {seen[key]})"
            raise ValueError(f"listen address {address} given twice{same}")
        seen[key] = address


def _ends_in_a_number(host: str) -> bool:
    """True for a name whose last label is a number, decimal or hexadecimal (WHATWG URL's "ends in a
    number"): no host name ends so, every IPv4 form does."""
    labels = host.split(".")
    if len(labels) > 1 and labels[-1] == "":
        labels.pop()
    last = labels[-1]
    return last.isdigit() or _HEX_LABEL.fullmatch(last) is not None


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


_QVALUE = re.compile(r"0(?:\.\d{0,3})?|1(?:\.0{0,3})?")


def gzip_accepted(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header asks for gzip: `gzip` (or `x-gzip`) listed with a q-value above 0
    (RFC 9110, 12.5.3; `gzip;q=0` refuses it). A wildcard does not: the body goes uncompressed, as
    before; an element with an invalid q-value is ignored."""
    accepted = False
    for element in accept_encoding.split(","):
        coding, *parameters = (part.strip() for part in element.split(";"))
        if coding.lower() not in ("gzip", "x-gzip"):
            continue
        q = 1.0
        for parameter in parameters:
            name, _, value = parameter.partition("=")
            if name.strip().lower() == "q":
                q = float(value) if _QVALUE.fullmatch(value.strip()) else -1.0
        if q == 0:
            return False
        accepted = accepted or q > 0
    return accepted


def _landing_page(title: str, telemetry_path: str) -> bytes:
    title_html = html.escape(title)
    path_html = html.escape(telemetry_path, quote=True)
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>{title_html}</title></head>\n"
            f"<body>\n<h1>{title_html}</h1>\n<p>Prometheus exporter for Intel GPUs shared by vLLM servers run as systemd units, "
            "containers or pods."
            f"</p>\n<ul>\n<li><a href=\"{path_html}\">Metrics</a></li>\n"
            f"<li><a href=\"{RUNBOOK_PATH}\">Runbook</a></li>\n"
            f"<li><a href=\"{HEALTH_PATH}\">Health</a></li>\n"
            f"<li><a href=\"{READY_PATH}\">Ready</a></li>\n</ul>\n</body>\n</html>\n").encode("utf-8")


class _Site:
    """What the handlers serve: shared, read-only after construction (the web config reloads itself)."""

    def __init__(self, telemetry_path: str, registry: CollectorRegistry, web_config: WebConfig | None,
                 landing_page_title: str, documents: Mapping[str, Document] | None = None,
                 max_requests: int = 0) -> None:
        self.telemetry_path = telemetry_path
        # --web.max-requests: metrics requests served at once; 0: no limit
        self.max_requests = max_requests
        self.scrape_slots = threading.BoundedSemaphore(max_requests) if max_requests else None
        self.registry = registry
        runbook = runbook_page()
        self.documents: dict[str, Document] = {RUNBOOK_PATH: lambda: (runbook, "text/html; charset=utf-8"),
                                               **(documents or {})}
        self.landing_page = _landing_page(landing_page_title, telemetry_path)
        # Decided once: a reload may change certificates, never whether the listener speaks TLS.
        self.tls = web_config is not None and web_config.ssl_context() is not None
        self._web_config = ReloadingWebConfig(web_config) if web_config is not None else None

    def web_config(self) -> WebConfig | None:
        return self._web_config.current() if self._web_config is not None else None

    def reload_web_config(self, occasion: str) -> None:
        """Re-reads the web config file now (ReloadingWebConfig.reload); one log line either way."""
        if self._web_config is None:
            logger.info("received %s: no --web.config.file, nothing to reload", occasion)
        else:
            self._web_config.reload(occasion)

    def tls_for_new_connection(self) -> tuple[ssl.SSLContext, Callable[[Any], bool]] | None:
        config = self.web_config()
        context = config.ssl_context() if config is not None else None
        if config is None or context is None:  # cannot happen: a reload never turns TLS off; fail closed
            return None
        return context, config.client_certificate_allowed


class _Handler:
    """Turns a parsed request into a whole response; runs on the HTTP worker threads."""

    def __init__(self, site: _Site) -> None:
        self._site = site

    def __call__(self, request: Request) -> Response:
        try:
            return self._route(request)
        except Exception as error:  # a bug must cost this request only, and tell the client nothing
            logger.error("error serving %s %s: %s", request.method, request.target, type(error).__name__)
            logger.debug("error serving %s %s", request.method, request.target, exc_info=True)
            return self._reply(request, None, HTTPStatus.INTERNAL_SERVER_ERROR, b"Internal server error.\n",
                               close=True)

    def _route(self, request: Request) -> Response:
        site = self._site
        config = site.web_config()
        if config is not None and not config.allow_request():
            return self._reply(request, config, HTTPStatus.TOO_MANY_REQUESTS, b"Too many requests.\n")
        try:
            authenticated = config is None or config.check_basic_auth(request.headers.get("authorization"))
        except PasswordChecksBusy:
            return self._reply(request, config, HTTPStatus.TOO_MANY_REQUESTS,
                               b"Too many password checks under way, retry.\n", {"Retry-After": "1"})
        if not authenticated:
            return self._reply(request, config, HTTPStatus.UNAUTHORIZED, b"Unauthorized.\n",
                               {"WWW-Authenticate": "Basic"})
        url = urlsplit(request.target)
        if url.path == site.telemetry_path:
            handler = self._metrics
        elif url.path == "/":
            handler = self._landing_page
        elif url.path in (HEALTH_PATH, READY_PATH):
            handler = self._healthy
        elif url.path in site.documents:
            handler = self._document
        else:
            return self._reply(request, config, HTTPStatus.NOT_FOUND, b"Not found.\n")
        if request.method not in _ALLOWED_METHODS:
            return self._reply(request, config, HTTPStatus.METHOD_NOT_ALLOWED,
                               f"Method {request.method} not allowed.\n".encode(),
                               {"Allow": ", ".join(_ALLOWED_METHODS)})
        return handler(request, config)

    def _metrics(self, request: Request, config: WebConfig | None) -> Response:
        slots = self._site.scrape_slots
        if slots is None:
            return self._scrape(request, config)
        if not slots.acquire(blocking=False):
            return self._reply(request, config, HTTPStatus.SERVICE_UNAVAILABLE,
                               f"Limit of concurrent requests reached ({self._site.max_requests}), try again "
                               f"later.\n".encode(), {"Retry-After": "1"})
        try:
            return self._scrape(request, config)
        finally:
            slots.release()

    def _scrape(self, request: Request, config: WebConfig | None) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        registry = self._site.registry
        # ?name[]=a&name[]=b: only those samples, as prometheus_client's own servers do (an empty value is
        # no name: parse_qs drops it); other parameters are ignored.
        names = parse_qs(urlsplit(request.target).query).get("name[]")
        if names:
            registry = restricted(registry, names)
        try:
            body = encoder(registry)
        except Exception as error:
            logger.error("collecting metrics failed: %s: %s", type(error).__name__, error)
            logger.debug("collecting metrics failed", exc_info=True)
            return self._reply(request, config, HTTPStatus.INTERNAL_SERVER_ERROR,
                               b"An error has occurred while collecting metrics.\n")
        headers = {"Vary": "Accept, Accept-Encoding"}
        if gzip_accepted(request.headers.get("accept-encoding", "")):
            body = gzip.compress(body, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        return self._reply(request, config, HTTPStatus.OK, body, headers, content_type=content_type)

    def _landing_page(self, request: Request, config: WebConfig | None) -> Response:
        return self._reply(request, config, HTTPStatus.OK, self._site.landing_page,
                           content_type="text/html; charset=utf-8")

    def _document(self, request: Request, config: WebConfig | None) -> Response:
        body, content_type = self._site.documents[urlsplit(request.target).path]()
        return self._reply(request, config, HTTPStatus.OK, body, content_type=content_type)

    def _healthy(self, request: Request, config: WebConfig | None) -> Response:
        return self._reply(request, config, HTTPStatus.OK, b"OK")

    @staticmethod
    def _reply(request: Request, config: WebConfig | None, status: HTTPStatus, body: bytes,
               headers: Mapping[str, str] | None = None, content_type: str = "text/plain; charset=utf-8",
               close: bool = False) -> Response:
        close = close or request.close
        all_headers = {"Content-Type": content_type, "Content-Length": str(len(body)), **(headers or {}),
                       **(config.headers if config is not None else {})}
        logger.debug('%s "%s" %d %d', request.client, request.line, status.value, len(body))
        data = render_response(status, body, all_headers, server=SERVER_NAME, close=close,
                               head_only=request.method == "HEAD",
                               keep_alive_header=not close and request.version == "HTTP/1.0")
        return Response(data, close)


class ExporterServer:
    """Serves `registry` at `telemetry_path` on `listen_address` (see parse_listen_address), or on each of
    several addresses (as exporter-toolkit serves every --web.listen-address).

    `listening_sockets`: sockets already listening (systemd's, `http.activation`), served instead of binding
    `listen_address`. `max_requests`: metrics requests served at once (--web.max-requests), more get 503; 0: no
    limit beyond the workers' number.

    Binds in the constructor: an unusable address raises ListenError, an OSError that names the address and
    keeps the system's errno and text (EADDRINUSE, EADDRNOTAVAIL, socket.gaierror...); a malformed one, or
    one given twice, ValueError. `serve_forever()` serves until
    `shutdown()` (which may be called from any thread, also before or without serve_forever).
    """

    def __init__(self, listen_address: str | Sequence[str], telemetry_path: str, registry: CollectorRegistry,
                 web_config: WebConfig | None = None, landing_page_title: str = "vllm-xpu-exporter",
                 limits: ServerLimits | None = None, documents: Mapping[str, Document] | None = None,
                 max_requests: int = 0, listening_sockets: Sequence[socket.socket] = ()) -> None:
        if not telemetry_path.startswith("/"):
            raise ValueError(f"invalid telemetry path {telemetry_path!r}: it must start with '/'")
        if documents and telemetry_path in documents:
            raise ValueError(f"invalid telemetry path {telemetry_path!r}: the exporter serves another document there")
        listening_sockets = list(listening_sockets) or _bind_all(listen_address)
        site = _Site(telemetry_path, registry, web_config, landing_page_title, documents, max_requests)
        self._site = site
        self._server_addresses = [bound.getsockname() for bound in listening_sockets]
        self._connections = ConnectionServer(listening_sockets, _Handler(site),
                                             tls=site.tls_for_new_connection if site.tls else None,
                                             server_name=SERVER_NAME, limits=limits)
        self._state_lock = threading.Lock()
        self._serving = False
        self._closed = False

    @property
    def server_addresses(self) -> list[tuple[str, int]]:
        """Every bound (host, port), in the order of the listen addresses; host "::" when listening dual-stack on
        all interfaces."""
        return [(str(address[0]), int(address[1])) for address in self._server_addresses]

    @property
    def limits(self) -> ServerLimits:
        return self._connections.limits

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        with self._state_lock:
            if self._closed:
                return
            self._serving = True
        self._connections.serve_forever(poll_interval)

    def request_reload(self, occasion: str = "SIGHUP") -> None:
        """Re-reads the web config file soon, on the serving thread: safe in a signal handler (no lock, no
        thread). A config that does not load or would change what the listener promised is refused, the
        previous one stays in force; one line is logged either way."""
        self._connections.call_soon(lambda: self._site.reload_web_config(occasion))

    def stop_serving(self) -> None:
        """Makes serve_forever return soon, without waiting: safe in a signal handler of the thread that
        serves (it needs no thread, so it works under a task limit too). shutdown() then closes."""
        self._connections.stop(wait=False)

    def shutdown(self) -> None:
        """Stops serve_forever, closes the listening socket and ends open connections. Idempotent."""
        with self._state_lock:
            serving, closed, self._closed = self._serving, self._closed, True
        if closed:
            return
        self._connections.stop(wait=serving)
        self._connections.close()
