"""systemd socket activation (--web.systemd-socket): the listening sockets systemd opened for the exporter
(the packaged vllm-xpu-exporter.socket), taken as sd_listen_fds(3) takes them, with the standard library only.

systemd passes them as the file descriptors from 3 on, LISTEN_FDS of them, and names the process they are for in
LISTEN_PID (a child that inherits the environment must not take them). Each must be a listening stream socket of
an IP family: the exporter speaks HTTP over TCP. The variables are removed once read, so that no process the
exporter starts sees them, and the sockets are made close-on-exec.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

SD_LISTEN_FDS_START = 3
_FAMILIES = (socket.AF_INET, socket.AF_INET6)


class ActivationError(Exception):
    """No usable socket from systemd; the message is one line saying why."""


def systemd_sockets(environ: MutableMapping[str, str] | None = None) -> list[socket.socket]:
    """The listening sockets systemd passed to this process, in their order; ActivationError when there are
    none for it or one is not a listening TCP socket (then none is kept open)."""
    environ = os.environ if environ is None else environ
    listen_pid, listen_fds = environ.get("LISTEN_PID"), environ.get("LISTEN_FDS")
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        environ.pop(name, None)
    if listen_pid is None or listen_fds is None:
        raise ActivationError("--web.systemd-socket: no sockets passed by systemd (LISTEN_FDS is not set: start "
                              "the exporter through its .socket unit)")
    if listen_pid != str(os.getpid()):
        raise ActivationError(f"--web.systemd-socket: the sockets systemd passed are for process {listen_pid}, "
                              f"not this one ({os.getpid()})")
    if not (listen_fds.isascii() and listen_fds.isdigit()) or int(listen_fds) == 0:
        raise ActivationError(f"--web.systemd-socket: LISTEN_FDS={listen_fds!r} passes no socket")
    sockets: list[socket.socket] = []
    try:
        for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + int(listen_fds)):
            sockets.append(_listening_tcp_socket(fd))
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _listening_tcp_socket(fd: int) -> socket.socket:
    try:
        sock = socket.socket(fileno=fd)
    except OSError as error:
        raise ActivationError(f"--web.systemd-socket: file descriptor {fd} is not a socket "
                              f"({error.strerror})") from None
    try:
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        if sock.family not in _FAMILIES or sock.type != socket.SOCK_STREAM or not listening:
            raise ActivationError(f"--web.systemd-socket: file descriptor {fd} is not a listening TCP socket "
                                  f"(the .socket unit needs ListenStream= with an address and port)")
        sock.set_inheritable(False)
    except BaseException:
        sock.detach()  # not ours to close: systemd's, or another file
        raise
    return sock
