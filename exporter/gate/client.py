"""`vllm-xpu-gate wait`: the client a vLLM unit's `ExecStartPre=` runs, as the unit's own user (docs/gate.md).

It asks the gate service for a turn over the service's Unix socket (`vllm_xpu_exporter.gate.protocol`),
writes the service's lines to stderr (the unit's journal) and exits with the status the service
answers: 0 the unit may start, 1 its wait ran out with --on-timeout fail. It tells the service nothing
about which unit it is: the service reads that from the kernel.

It never strands its unit. When no service answers within --service-timeout (no socket, nothing
listening, a service that accepts and says nothing, or one gone mid-wait and not back in time), or the
unit may not open a Unix socket at all (`RestrictAddressFamilies=` without AF_UNIX), it writes one
line (`started ungated ...`, which the exporter counts as an ungated start) and exits 0.

It imports only the standard library, the protocol and the gate's line grammar (no source, no journal,
no Level Zero): it runs in every gated start.
"""

from __future__ import annotations

import errno
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from vllm_xpu_exporter.parsers import gate as gate_lines
from vllm_xpu_exporter.gate.protocol import MAX_MESSAGE_BYTES, Request, parse_reply

EXIT_STARTING = 0
RETRY_SECONDS = 0.25
# socket() errors that mean the unit may not use AF_UNIX (RestrictAddressFamilies=, a seccomp filter).
DENIED = frozenset({errno.EAFNOSUPPORT, errno.EPERM, errno.EACCES, errno.EPROTONOSUPPORT})


@dataclass(frozen=True)
class ClientOptions:
    socket_path: str
    service_timeout: float  # how long the client waits for a service that does not answer
    request: Request


class Ungated(Exception):
    """No decision can be had: the unit starts without one (the message says why)."""


class _Connection:
    """One connection to the service: the request sent, the replies read line by line."""

    def __init__(self, path: str, request: Request) -> None:
        try:
            self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        except OSError as error:
            if error.errno in DENIED:
                raise Ungated(f"this unit may not open a Unix socket ({error.strerror}: AF_UNIX is not in its "
                              f"RestrictAddressFamilies=, or a system call filter denies it)") from None
            raise
        try:
            self.socket.settimeout(1.0)
            self.socket.connect(path)
            try:
                self.socket.sendall(request.encode())
            except (BrokenPipeError, ConnectionResetError):
                pass  # the service answered before it read the request (nothing to wait for): read it
        except BaseException:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self._buffer = b""

    def close(self) -> None:
        self.socket.close()

    def read_line(self, deadline: float) -> bytes | None:
        """The next line the service sent; None when it closed the connection; TimeoutError at `deadline`."""
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_MESSAGE_BYTES:
                return None  # no service sends that: take it as a broken connection
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            readable, _, _ = select.select([self.socket], [], [], min(remaining, 1.0))
            if not readable:
                continue
            chunk = self.socket.recv(MAX_MESSAGE_BYTES)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line


class Client:
    def __init__(self, options: ClientOptions, write: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self.write = write
        self.clock = clock
        self.began = clock()

    def run(self) -> int:
        try:
            return self._ask()
        except Ungated as ungated:
            self.write(gate_lines.format_ungated(self.clock() - self.began, str(ungated)))
            return EXIT_STARTING

    def _ask(self) -> int:
        options = self.options
        # The service bounds the wait by the request's timeout; the client adds the time a service may
        # take to answer at all, so a service that dies mid-wait costs at most that much more.
        last_contact = self.began
        overall = self.began + options.request.timeout + options.service_timeout
        why = "no answer"
        while True:
            if self.clock() >= min(overall, last_contact + options.service_timeout):
                raise Ungated(f"no gate service answered on {options.socket_path} within "
                              f"{options.service_timeout:g}s ({why})")
            try:
                connection = _Connection(options.socket_path, options.request)
            except OSError as error:
                why = error.strerror or type(error).__name__
                time.sleep(RETRY_SECONDS)
                continue
            try:
                status, last_contact, why = self._converse(connection, last_contact, overall)
            finally:
                connection.close()
            if status is not None:
                return status
            time.sleep(RETRY_SECONDS)

    def _converse(self, connection: _Connection, last_contact: float, overall: float
                  ) -> tuple[int | None, float, str]:
        """Read the service's replies until its answer (its exit status), or until the connection ends
        or the service falls silent (None, to try again)."""
        answered = False
        while True:
            deadline = overall if answered else min(overall, last_contact + self.options.service_timeout)
            try:
                data = connection.read_line(deadline)
            except TimeoutError:
                return None, last_contact, "it accepted the connection but said nothing"
            except OSError as error:
                return None, last_contact, f"the connection broke: {error.strerror or error}"
            if data is None:
                return None, self.clock() if answered else last_contact, "the service closed the connection"
            reply = parse_reply(data)
            if reply is None:
                return None, last_contact, "it sent something else than the gate's replies"
            answered = True
            last_contact = self.clock()
            self.write(reply.line if reply.line.startswith(gate_lines.PREFIX) else gate_lines.PREFIX + reply.line)
            if reply.exit_status is not None:
                return (reply.exit_status if reply.exit_status in (0, 1, 2) else EXIT_STARTING), last_contact, ""


def post_wake_up(url: str, timeout: float, stream: TextIO = sys.stderr) -> int:
    """`wake --url`: POST URL/wake_up, vLLM's wake of its sleeping engine (its server needs
    VLLM_SERVER_DEV_MODE=1); 0 when it answered 2xx, else 1 with one line."""
    import urllib.error
    import urllib.request
    write = writer(stream)
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{url}/wake_up", data=b"", method="POST"),
                                    timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as error:
        status = error.code
    except (OSError, ValueError) as error:
        write(f"{gate_lines.PREFIX}error: POST {url}/wake_up: {getattr(error, 'reason', None) or error}")
        return 1
    if 200 <= status < 300:
        return 0
    write(f"{gate_lines.PREFIX}error: POST {url}/wake_up answered HTTP {status}")
    return 1


def writer(stream: TextIO) -> Callable[[str], None]:
    def write(line: str) -> None:
        stream.write(" ".join(line.splitlines()) + "\n")
        stream.flush()
    return write


class _Terminated(BaseException):
    pass


def _terminate(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Terminated


def run_client(options: ClientOptions, stream: TextIO = sys.stderr, terminated_status: int = EXIT_STARTING) -> int:
    """The client's process: SIGTERM (systemd stopping the unit while it waits) ends the wait with exit 0,
    so the stopped unit ends inactive rather than failed; its engine does not start. `terminated_status`:
    the exit status then (a container's client, which starts the engine itself on 0, gives another)."""
    write = writer(stream)
    began = time.monotonic()
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        return Client(options, write).run()
    except _Terminated:
        write(f"{gate_lines.PREFIX}terminated while waiting (the unit is being stopped): not waiting any more")
        return terminated_status
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # never strand a unit on a bug of the client
        write(gate_lines.format_ungated(time.monotonic() - began, f"the client failed: {type(error).__name__}: {error}"))
        return EXIT_STARTING
