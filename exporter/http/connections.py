"""HTTP/1.1 connections for the exporter, with bounded memory, threads and time per client.

One thread runs an event loop (`selectors`) that accepts connections, does TLS handshakes, reads request
heads and sends responses, all without blocking and without a thread per connection. Complete requests go
to a small fixed pool of worker threads, which compute the response and hand it back to the loop. So no
number of idle, slow or hostile clients can take the worker a scrape needs, nor the threads and memory
the process is allowed (`TasksMax=64`, `MemoryMax=512M` in the shipped unit). What a client may cost is
bounded by `ServerLimits`:

- a request head (request line, headers and the blank line ending them) is at most 1 MiB, as in Go's
  net/http (else 431), its request line at most 8 KiB (else 414) and its header lines at most 100
  (else 431); the headers the exporter reads (Authorization, Accept, Accept-Encoding, Connection,
  Content-Length, Transfer-Encoding) are kept, at most 16 KiB of them (else 431), the others are
  checked and dropped;
- all connections' unfinished request heads together hold at most 32 MiB: past that, the connection
  holding the most is answered 431 and closed (a scraper's head is a few hundred bytes);
- a connection must complete its TLS handshake and request head within 10 s of connecting, or of the
  first byte of its next request; a kept-alive connection may stay idle 60 s; a response must be sent
  within 30 s;
- at most 512 connections (fewer when the file descriptor limit is low); at the cap, or when the
  process runs out of file descriptors, one is closed to make room: the oldest of those that have not
  completed a request yet (idle or slow clients, which is what an attack is made of), else the one idle
  longest after a response (a scraper's kept-alive connection is reused at every scrape). A connection
  whose request is being handled is never closed for room.

Requests are parsed strictly: a request line needs a method, a target and an HTTP/1.x version (no
HTTP/0.9), header lines must be `name: value` with a token for a name, and no control bytes are allowed;
anything else gets 400 and the connection is closed. Request bodies are never read: a request that has
one is answered and its connection closed.
"""

from __future__ import annotations

import collections
import email.utils
import errno
import logging
import queue
import re
import resource
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

logger = logging.getLogger("vllm_xpu_exporter.web")


@dataclass(frozen=True)
class ServerLimits:
    max_header_bytes: int = 1 << 20
    max_request_line_bytes: int = 8 << 10
    max_header_lines: int = 100
    max_kept_header_bytes: int = 16 << 10
    max_buffered_bytes: int = 32 << 20
    header_timeout: float = 10.0
    idle_timeout: float = 60.0
    write_timeout: float = 30.0
    workers: int = 4
    max_connections: int = 512


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    version: str
    headers: Mapping[str, str]  # lower-case names; only the headers the exporter reads
    client: str
    line: str  # the request line, for logs
    close: bool  # the connection closes after the response (asked for, HTTP/1.0, or a body not read)


@dataclass(frozen=True)
class Response:
    data: bytes  # status line, headers and body, ready to send
    close: bool


# (SSL context, check of the verified peer certificate) for a new TLS connection; None refuses it.
TLSProvider = Callable[[], "tuple[ssl.SSLContext, Callable[[Any], bool]] | None"]

KEPT_HEADERS = frozenset({"authorization", "accept", "accept-encoding", "connection", "content-length",
                          "transfer-encoding"})
_SINGLE_VALUED = frozenset({"authorization", "content-length"})
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(r"HTTP/(\d)\.(\d)")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # every control byte but HTAB
_TARGET_FORBIDDEN = re.compile(r"[\x00-\x20\x7f]")
_TLS_HANDSHAKE_RECORD = 0x16
_PLAIN_HTTP_TO_TLS_RESPONSE = (b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                               b"Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
_RECV_BYTES = 64 << 10
_ACCEPT_BATCH = 64
_SWEEP_SECONDS = 0.25
_LINGER_SECONDS = 1.0
_LINGER_BYTES = 256 << 10
_LOGGED_LINE_CHARS = 200
_RESERVED_FDS = 64

# Connection states.
_PEEK, _HANDSHAKE, _READING, _DISPATCHED, _WRITING, _LINGERING, _CLOSED = (
    "peek", "handshake", "reading", "dispatched", "writing", "lingering", "closed")


def render_response(status: HTTPStatus, body: bytes, headers: Mapping[str, str], *, server: str, close: bool,
                    head_only: bool = False, keep_alive_header: bool = False) -> bytes:
    """A whole HTTP/1.1 response: status line, Server, Date, `headers`, Connection, body."""
    lines = [f"HTTP/1.1 {status.value} {status.phrase}", f"Server: {server}",
             f"Date: {email.utils.formatdate(usegmt=True)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if close:
        lines.append("Connection: close")
    elif keep_alive_header:
        lines.append("Connection: keep-alive")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body


class _Refusal(Exception):
    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def parse_request_head(head: bytes, client: str, limits: ServerLimits) -> Request:
    """Parses a request head (up to, not including, the empty line); raises _Refusal."""
    first_end = head.find(b"\n")
    if (first_end if first_end >= 0 else len(head)) > limits.max_request_line_bytes + 1:
        raise _Refusal(HTTPStatus.REQUEST_URI_TOO_LONG, "request line too long")
    if head.count(b"\n") > limits.max_header_lines:
        raise _Refusal(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too many header lines")
    lines = head.decode("latin-1").split("\n")
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise _Refusal(HTTPStatus.BAD_REQUEST, "malformed request line" if len(parts) != 2
                       else "no HTTP version (HTTP/0.9 is not supported)")
    method, target, version = parts
    if not _TOKEN.fullmatch(method):
        raise _Refusal(HTTPStatus.BAD_REQUEST, "malformed method")
    if not target or _TARGET_FORBIDDEN.search(target):
        raise _Refusal(HTTPStatus.BAD_REQUEST, "malformed request target")
    match = _VERSION.fullmatch(version)
    if match is None:
        raise _Refusal(HTTPStatus.BAD_REQUEST, "malformed HTTP version")
    if match[1] != "1":
        raise _Refusal(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "unsupported HTTP version")
    headers: dict[str, str] = {}
    kept_bytes = 0
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name):
            # Also a line starting with whitespace: obsolete line folding is refused, as Go does.
            raise _Refusal(HTTPStatus.BAD_REQUEST, "malformed header line")
        value = value.strip(" \t")
        if _CONTROL.search(value):
            raise _Refusal(HTTPStatus.BAD_REQUEST, "control character in a header value")
        key = name.lower()
        if key not in KEPT_HEADERS:
            continue
        kept_bytes += len(value)
        if kept_bytes > limits.max_kept_header_bytes:
            raise _Refusal(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"{name} header too large")
        if key not in headers:
            headers[key] = value
        elif key in _SINGLE_VALUED:
            if headers[key] != value:
                raise _Refusal(HTTPStatus.BAD_REQUEST, f"conflicting {name} headers")
        else:
            headers[key] = f"{headers[key]}, {value}"
    content_length = headers.get("content-length", "0")
    if not content_length.isascii() or not content_length.isdigit():
        raise _Refusal(HTTPStatus.BAD_REQUEST, "malformed Content-Length")
    has_body = "transfer-encoding" in headers or int(content_length) != 0
    connection = {token.strip().lower() for token in headers.get("connection", "").split(",")}
    keep_alive = "close" not in connection if match[2] != "0" else "keep-alive" in connection
    return Request(method=method, target=target, version=version, headers=headers, client=client,
                   line=lines[0], close=not keep_alive or has_body or method not in ("GET", "HEAD"))


def _head_end(buffer: bytearray, start: int) -> tuple[int, int]:
    """(index of the newline ending the last header line, length of the terminator) or (-1, 0)."""
    crlf = buffer.find(b"\n\r\n", start)
    lf = buffer.find(b"\n\n", start, crlf + 2 if crlf >= 0 else len(buffer))
    if lf >= 0:
        return lf, 2
    if crlf >= 0:
        return crlf, 3
    return -1, 0


class _Connection:
    __slots__ = ("sock", "client", "state", "events", "inbuf", "scan_from", "outbuf", "close_after", "deadline",
                 "idle", "lingered", "certificate_allowed", "rank")

    def __init__(self, sock: socket.socket, client: str, state: str, deadline: float) -> None:
        self.sock = sock
        self.client = client
        self.state = state
        self.events = 0
        self.inbuf = bytearray()
        self.scan_from = 0
        self.outbuf: memoryview | bytes = b""
        self.close_after = False
        self.deadline = deadline
        self.idle = False  # kept alive, waiting for the first byte of the next request
        self.lingered = 0
        self.certificate_allowed: Callable[[Any], bool] | None = None
        self.rank: dict[int, _Connection] | None = None  # the eviction order it is in (None: not evictable)


class ConnectionServer:
    """Serves HTTP/1.1 on already listening sockets (one or more: every --web.listen-address), all from one
    event loop; `handle` turns a Request into a Response (it runs on a worker thread and must not raise).
    `tls`: None for plain HTTP, else called for every new connection."""

    def __init__(self, listeners: Sequence[socket.socket], handle: Callable[[Request], Response], *,
                 tls: TLSProvider | None, server_name: str, limits: ServerLimits | None = None) -> None:
        self.limits = limits or ServerLimits()
        self._listeners = tuple(listeners)
        if not self._listeners:
            raise ValueError("no listening socket")
        for listener in self._listeners:
            listener.setblocking(False)
        self._handle = handle
        self._tls = tls
        self._server_name = server_name
        soft_fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        fd_room = self.limits.max_connections if soft_fd_limit == resource.RLIM_INFINITY else soft_fd_limit // 2
        self.max_connections = max(1, min(self.limits.max_connections, fd_room, soft_fd_limit - _RESERVED_FDS))
        self._selector = selectors.DefaultSelector()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        for listener in self._listeners:
            self._selector.register(listener, selectors.EVENT_READ, "listener")
        self._selector.register(self._wake_reader, selectors.EVENT_READ, "waker")
        self._accepting = True
        self._connections: dict[int, _Connection] = {}
        # Eviction orders, oldest first (dicts keep insertion order): connections that have not completed
        # a request (or are closing), then connections that have had a response.
        self._unproven: dict[int, _Connection] = {}
        self._proven: dict[int, _Connection] = {}
        self._buffered = 0  # bytes of request heads held by all connections
        self._completed: collections.deque[tuple[_Connection, Response]] = collections.deque()
        self._soon: collections.deque[Callable[[], None]] = collections.deque()  # call_soon's callbacks
        self._jobs: queue.SimpleQueue[tuple[_Connection, Request] | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._stopping = False
        self._stopped = threading.Event()

    # ------------------------------------------------------------------------------------ life cycle

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._start_workers()
        next_sweep = time.monotonic() + _SWEEP_SECONDS
        try:
            while not self._stopping:
                timeout = max(0.0, min(poll_interval, next_sweep - time.monotonic()))
                for key, mask in self._selector.select(timeout):
                    if key.data == "listener":
                        self._accept(key.fileobj)  # type: ignore[arg-type]
                    elif key.data == "waker":
                        self._drain_waker()
                    else:
                        self._guarded(self._on_event, key.data, mask)
                self._run_soon()
                self._finish_completed()
                now = time.monotonic()
                if now >= next_sweep:
                    self._sweep(now)
                    next_sweep = now + _SWEEP_SECONDS
        finally:
            for connection in list(self._connections.values()):
                self._close(connection)
            for _ in self._workers:
                self._jobs.put(None)
            self._stopped.set()

    def stop(self, wait: bool) -> None:
        """Ends serve_forever (from any thread); with `wait`, returns once it has."""
        self._stopping = True
        self._wake()
        if wait:
            self._stopped.wait()

    def close(self) -> None:
        """Closes the listening sockets (after serve_forever has returned, or when it never ran)."""
        for sock in (*self._listeners, self._wake_reader, self._wake_writer):
            try:
                self._selector.unregister(sock)
            except (KeyError, ValueError):
                pass
            sock.close()
        self._selector.close()

    def _start_workers(self) -> None:
        for number in range(self.limits.workers):
            worker = threading.Thread(target=self._work, name=f"http-worker-{number}", daemon=True)
            try:
                worker.start()
            except RuntimeError as error:  # no thread left under a task limit: serve with fewer
                logger.error("cannot start HTTP worker thread %d of %d: %s", number + 1, self.limits.workers, error)
                break
            self._workers.append(worker)
        if not self._workers:
            logger.error("no HTTP worker thread could be started: requests are handled on the accepting thread")

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Runs `callback` on the loop's thread, between events, soon. Takes no lock and starts no thread,
        so it is safe in a signal handler (which may interrupt the loop's thread anywhere); a callback asked
        for before serve_forever runs when it starts."""
        self._soon.append(callback)
        self._wake()

    def _run_soon(self) -> None:
        while self._soon:
            callback = self._soon.popleft()
            try:
                callback()
            except Exception as error:  # a callback's failure must not stop the server
                logger.error("error in a deferred call: %s", type(error).__name__)
                logger.debug("error in a deferred call", exc_info=True)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            connection, request = job
            self._completed.append((connection, self._respond(request)))
            self._wake()

    def _respond(self, request: Request) -> Response:
        try:
            return self._handle(request)
        except Exception as error:  # the handler's own guard failed: still answer, keep the worker
            logger.error("error serving %s %s: %s", request.method, request.target, type(error).__name__)
            body = b"Internal server error.\n"
            return Response(render_response(HTTPStatus.INTERNAL_SERVER_ERROR, body,
                                            {"Content-Type": "text/plain; charset=utf-8",
                                             "Content-Length": str(len(body))},
                                            server=self._server_name, close=True), close=True)

    def _wake(self) -> None:
        try:
            self._wake_writer.send(b"\0")
        except OSError:  # full (a wake-up is pending anyway) or closed
            pass

    def _drain_waker(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except OSError:
            pass

    # ----------------------------------------------------------------------------------- connections

    def _guarded(self, step: Callable[..., None], connection: _Connection, *args: Any) -> None:
        try:
            step(connection, *args)
        except Exception as error:  # a bug must cost this connection only
            logger.error("error on connection from %s: %s", connection.client, type(error).__name__)
            logger.debug("error on connection from %s", connection.client, exc_info=True)
            self._close(connection)

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                if error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    logger.debug("cannot accept a connection: %s", error.strerror)
                    if not self._evict_oldest("out of file descriptors"):
                        self._pause_accepting()
                    return
                if error.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue
                logger.error("cannot accept a connection: %s", error.strerror or error)
                return
            if len(self._connections) >= self.max_connections and not self._evict_oldest("too many connections"):
                sock.close()
                continue
            self._open(sock, str(address[0]))

    def _pause_accepting(self) -> None:
        if self._accepting:
            for listener in self._listeners:
                self._selector.unregister(listener)
            self._accepting = False

    def _resume_accepting(self) -> None:
        if not self._accepting and not self._stopping:
            for listener in self._listeners:
                self._selector.register(listener, selectors.EVENT_READ, "listener")
            self._accepting = True

    def _open(self, sock: socket.socket, client: str) -> None:
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        deadline = time.monotonic() + self.limits.header_timeout
        connection = _Connection(sock, client, _PEEK if self._tls is not None else _READING, deadline)
        self._connections[id(connection)] = connection
        self._rank(connection, self._unproven)
        self._watch(connection, selectors.EVENT_READ)

    def _rank(self, connection: _Connection, order: dict[int, _Connection] | None) -> None:
        """Moves the connection to the end (the newest) of an eviction order, or out of them (None)."""
        if connection.rank is not None:
            del connection.rank[id(connection)]
        if order is not None:
            order[id(connection)] = connection
        connection.rank = order

    def _evict_oldest(self, why: str) -> bool:
        """Makes room (see the module's doc); False when every connection is being served."""
        for order in (self._unproven, self._proven):
            if order:
                connection = next(iter(order.values()))
                logger.debug("closing the connection from %s to make room: %s", connection.client, why)
                self._close(connection)
                return True
        return False

    def _watch(self, connection: _Connection, events: int) -> None:
        if connection.events == events:
            return
        if connection.events == 0:
            self._selector.register(connection.sock, events, connection)
        elif events == 0:
            self._selector.unregister(connection.sock)
        else:
            self._selector.modify(connection.sock, events, connection)
        connection.events = events

    def _close(self, connection: _Connection) -> None:
        if connection.state == _CLOSED:
            return
        self._watch(connection, 0)
        self._release(connection)
        try:
            # What the client sent and nobody read would make close() reset the connection under the reply.
            socket.socket.recv(connection.sock, _RECV_BYTES, socket.MSG_DONTWAIT)
        except OSError:
            pass
        try:
            connection.sock.close()
        except OSError:
            pass
        connection.state = _CLOSED
        connection.outbuf = b""
        self._rank(connection, None)
        del self._connections[id(connection)]
        self._resume_accepting()

    def _release(self, connection: _Connection) -> None:
        """Drops the connection's unread request bytes."""
        self._buffered -= len(connection.inbuf)
        connection.inbuf = bytearray()
        connection.scan_from = 0

    def _on_event(self, connection: _Connection, _mask: int) -> None:
        if connection.state == _PEEK:
            self._peek(connection)
        elif connection.state == _HANDSHAKE:
            self._handshake(connection)
        elif connection.state == _READING:
            self._read(connection)
        elif connection.state == _WRITING:
            self._write(connection)
        elif connection.state == _LINGERING:
            self._linger(connection)

    def _sweep(self, now: float) -> None:
        self._resume_accepting()
        for connection in list(self._connections.values()):
            if connection.state != _DISPATCHED and now >= connection.deadline:
                logger.debug("closing the connection from %s: %s", connection.client, {
                    _PEEK: "no request in time", _HANDSHAKE: "TLS handshake not done in time",
                    _READING: "idle too long" if connection.idle else "request head not received in time",
                    _WRITING: "response not taken in time", _LINGERING: "closed"}[connection.state])
                self._close(connection)

    # ------------------------------------------------------------------------------------------- TLS

    def _peek(self, connection: _Connection) -> None:
        try:
            first = connection.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(connection)
            return
        if first and first[0] == _TLS_HANDSHAKE_RECORD:
            tls = self._tls() if self._tls is not None else None
            if tls is None:
                self._close(connection)
                return
            context, connection.certificate_allowed = tls
            self._watch(connection, 0)
            try:
                connection.sock = context.wrap_socket(connection.sock, server_side=True,
                                                      do_handshake_on_connect=False)
            except (OSError, ValueError) as error:
                logger.debug("TLS handshake with %s failed: %s", connection.client, error)
                self._close(connection)
                return
            connection.state = _HANDSHAKE
            self._handshake(connection)
            return
        if first:
            logger.debug("plain HTTP (or other non-TLS data) from %s on the TLS port", connection.client)
        if first.isalpha():
            self._send(connection, _PLAIN_HTTP_TO_TLS_RESPONSE, close=True)
        else:
            self._close(connection)

    def _handshake(self, connection: _Connection) -> None:
        sock = connection.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(connection, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._watch(connection, selectors.EVENT_WRITE)
            return
        except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
            logger.debug("TLS handshake with %s failed: %s", connection.client, error)
            self._close(connection)
            return
        allowed = connection.certificate_allowed
        if allowed is not None and not allowed(sock.getpeercert()):
            logger.debug("client certificate of %s has none of the allowed SANs", connection.client)
            self._close(connection)
            return
        connection.state = _READING
        self._watch(connection, selectors.EVENT_READ)
        self._read(connection)  # the handshake's last flight may have brought the request along

    # ---------------------------------------------------------------------------------------- reading

    def _read(self, connection: _Connection) -> None:
        limits = self.limits
        while connection.state == _READING:
            room = limits.max_header_bytes + 1 - len(connection.inbuf)  # one byte past the limit shows it
            try:
                data = connection.sock.recv(max(1, min(_RECV_BYTES, room)))
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                return
            except ssl.SSLWantWriteError:
                self._watch(connection, selectors.EVENT_READ | selectors.EVENT_WRITE)
                return
            except OSError as error:
                logger.debug("connection from %s ended: %s", connection.client, error)
                self._close(connection)
                return
            if not data:
                self._close(connection)
                return
            if connection.idle:
                connection.idle = False
                connection.deadline = time.monotonic() + limits.header_timeout
            connection.inbuf += data
            self._buffered += len(data)
            if self._parse(connection):
                return
            if self._buffered > limits.max_buffered_bytes:
                self._shed_largest()

    def _parse(self, connection: _Connection) -> bool:
        """Takes a complete request head off the buffer and dispatches it (or refuses it); True when the
        connection has left the reading state."""
        buffer = connection.inbuf
        if buffer[:1] in (b"\r", b"\n"):  # empty lines before a request line are ignored (RFC 9112, 2.2)
            blank = len(buffer) - len(buffer.lstrip(b"\r\n"))
            del buffer[:blank]
            self._buffered -= blank
            connection.scan_from = 0
        if not buffer:
            return False
        limits = self.limits
        end, terminator = _head_end(buffer, connection.scan_from)
        if end < 0:
            first_end = buffer.find(b"\n", 0, limits.max_request_line_bytes + 2)
            if first_end < 0 and len(buffer) > limits.max_request_line_bytes + 1:
                self._refuse(connection, HTTPStatus.REQUEST_URI_TOO_LONG, "request line too long", buffer)
                return True
            if len(buffer) >= limits.max_header_bytes:  # the blank line, still to come, counts too
                self._refuse(connection, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large",
                             buffer)
                return True
            connection.scan_from = max(0, len(buffer) - 2)
            return False
        if end + terminator > limits.max_header_bytes:
            self._refuse(connection, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large", buffer)
            return True
        head = bytes(buffer[:end])
        del buffer[:end + terminator]
        self._buffered -= end + terminator
        connection.scan_from = 0
        try:
            request = parse_request_head(head, connection.client, limits)
        except _Refusal as refusal:
            self._refuse(connection, refusal.status, refusal.reason, head)
            return True
        if request.close:
            self._release(connection)  # a body, if any, is not read
        connection.state = _DISPATCHED
        self._rank(connection, None)
        self._watch(connection, 0)
        if self._workers:
            self._jobs.put((connection, request))
        else:
            self._completed.append((connection, self._respond(request)))
        return True

    def _refuse(self, connection: _Connection, status: HTTPStatus, reason: str, head: bytes | bytearray) -> None:
        line = bytes(head[:_LOGGED_LINE_CHARS]).split(b"\n", 1)[0].decode("latin-1")
        logger.debug('%s "%s" %d %s', connection.client, line, status.value, reason)
        body = f"{status.phrase}: {reason}.\n".encode()
        self._send(connection, render_response(status, body, {"Content-Type": "text/plain; charset=utf-8",
                                                               "Content-Length": str(len(body))},
                                               server=self._server_name, close=True), close=True)

    def _shed_largest(self) -> None:
        reading = (connection for connection in self._connections.values() if connection.state == _READING)
        largest = max(reading, key=lambda connection: len(connection.inbuf), default=None)
        if largest is not None:
            self._refuse(largest, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                         "request heads of all connections too large", largest.inbuf)

    # ---------------------------------------------------------------------------------------- writing

    def _finish_completed(self) -> None:
        while self._completed:
            connection, response = self._completed.popleft()
            if connection.state == _DISPATCHED:  # else closed meanwhile (shutdown)
                self._guarded(self._send, connection, response.data, response.close)

    def _send(self, connection: _Connection, data: bytes, close: bool) -> None:
        if close:
            self._release(connection)
        # A connection that is closing goes first if room is needed; one that was answered is now proven.
        self._rank(connection, self._unproven if close else self._proven)
        connection.state = _WRITING
        connection.outbuf = memoryview(data)
        connection.close_after = close
        connection.deadline = time.monotonic() + self.limits.write_timeout
        self._write(connection)

    def _write(self, connection: _Connection) -> None:
        while connection.outbuf:
            try:
                sent = connection.sock.send(connection.outbuf)
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                self._watch(connection, selectors.EVENT_WRITE)
                return
            except ssl.SSLWantReadError:
                self._watch(connection, selectors.EVENT_READ)
                return
            except OSError as error:
                logger.debug("connection from %s ended: %s", connection.client, error)
                self._close(connection)
                return
            connection.outbuf = connection.outbuf[sent:]
        connection.outbuf = b""
        if connection.close_after:
            self._start_lingering(connection)
            return
        connection.state = _READING
        connection.idle = True
        connection.deadline = time.monotonic() + self.limits.idle_timeout
        self._rank(connection, self._proven)  # idle since now
        self._watch(connection, selectors.EVENT_READ)
        if connection.inbuf:  # a pipelined request
            connection.idle = False
            connection.deadline = time.monotonic() + self.limits.header_timeout
            if self._parse(connection):
                return
        self._read(connection)

    def _start_lingering(self, connection: _Connection) -> None:
        """Half-closes and reads what the client still sends for a moment, so that closing does not reset
        the connection before the client has read the response."""
        try:
            socket.socket.shutdown(connection.sock, socket.SHUT_WR)
        except OSError:
            self._close(connection)
            return
        connection.state = _LINGERING
        connection.deadline = time.monotonic() + _LINGER_SECONDS
        self._watch(connection, selectors.EVENT_READ)

    def _linger(self, connection: _Connection) -> None:
        try:
            data = socket.socket.recv(connection.sock, _RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        connection.lingered += len(data)
        if not data or connection.lingered > _LINGER_BYTES:
            self._close(connection)
