"""Listening sockets and vLLM API servers' command lines, as procfs shows them (pure: no file is read here).

- `/proc/PID/net/tcp` and `tcp6`: one line per socket of the reader's network namespace, the local
  address in hexadecimal (each 32-bit word of the address in the host's byte order, the port big-endian),
  the state (`0A`: listening) and the socket's inode (`inet_listeners`).
- `/proc/PID/net/unix`: flags `00010000` (accepting connections) on a listening stream socket, its path
  last (`@` first for an abstract name; none for an unnamed socket) (`unix_listeners`).
- `/proc/PID/fd/N` links to `socket:[INODE]` for a socket (`socket_inode`).
- `/proc/PID/net/fib_trie` and `if_inet6`: the namespace's own addresses, for a server listening on every
  address of a network namespace that is not the exporter's (`local_ipv4_addresses`, `global_ipv6_addresses`).
- `/proc/PID/cmdline`: a vLLM OpenAI-compatible API server (`vllm serve MODEL`, `python -m
  vllm.entrypoints.openai.api_server`) and its `--host`, `--port` (8000 by default), `--uds` and
  `--ssl-certfile` (served over https) flags (`vllm_api_command`).
"""

from __future__ import annotations

import ipaddress
import re
import sys
from dataclasses import dataclass

TCP_LISTEN = 0x0A
UNIX_ACCEPTING = 0x00010000  # __SO_ACCEPTCON
UNIX_STREAM = 1
VLLM_DEFAULT_PORT = 8000  # vLLM's --port default in every release with the OpenAI-compatible server
_SOCKET_LINK = re.compile(r"socket:\[(\d{1,20})\]")
# python -m <module> forms that start the OpenAI-compatible API server
_API_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main")
# flags whose value the command line may hold in the next argument; the rest take none
_VALUE_FLAGS = {"--host", "--port", "--uds", "--ssl-certfile", "--ssl-keyfile"}


@dataclass(frozen=True)
class InetListener:
    """A listening TCP socket: its local address (`0.0.0.0` or `::` for every address) and port."""

    address: str
    port: int


@dataclass(frozen=True)
class ApiCommand:
    """What an API server's command line says of where it listens: `host` None for every address, `uds` a
    Unix socket's path (then no TCP port is served), `https` when given a certificate."""

    host: str | None
    port: int
    uds: str | None
    https: bool


def socket_inode(link: str) -> int | None:
    """The inode of `socket:[INODE]` (what readlink of a socket's /proc/PID/fd/N gives), else None."""
    match = _SOCKET_LINK.fullmatch(link)
    return int(match[1]) if match else None


def inet_listeners(text: str, ipv6: bool, byteorder: str = sys.byteorder) -> dict[int, InetListener]:
    """inode -> listener, for the listening sockets of a `net/tcp` (ipv6 False) or `net/tcp6` table printed by
    a kernel of `byteorder` (this host's); other states, malformed lines and inode 0 (a socket whose inode is
    not known) are skipped."""
    listeners: dict[int, InetListener] = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        try:
            if int(fields[3], 16) != TCP_LISTEN:
                continue
            address_hex, port_hex = fields[1].split(":")
            inode = int(fields[9])
            address = _hex_address(address_hex, ipv6, byteorder)
            port = int(port_hex, 16)
        except ValueError:
            continue
        if inode:
            listeners[inode] = InetListener(address, port)
    return listeners


def _hex_address(text: str, ipv6: bool, byteorder: str) -> str:
    """An address of a net/tcp table: 32-bit words, each printed in the kernel's byte order."""
    if len(text) != (32 if ipv6 else 8):
        raise ValueError(f"bad address {text!r}")
    packed = b"".join(int(text[i:i + 8], 16).to_bytes(4, byteorder) for i in range(0, len(text), 8))
    return str(ipaddress.IPv6Address(packed) if ipv6 else ipaddress.IPv4Address(packed))


def unix_listeners(text: str) -> dict[int, str]:
    """inode -> path of the listening stream sockets of a `net/unix` table that have a path (abstract names
    start with `@`)."""
    listeners: dict[int, str] = {}
    for line in text.splitlines()[1:]:
        fields = line.split(None, 7)
        if len(fields) < 8:
            continue  # no path: an unnamed socket, which nothing can connect to by name
        try:
            flags, kind, inode = int(fields[3], 16), int(fields[4], 16), int(fields[6])
        except ValueError:
            continue
        if flags & UNIX_ACCEPTING and kind == UNIX_STREAM and inode:
            listeners[inode] = fields[7]
    return listeners


def local_ipv4_addresses(fib_trie: str) -> list[str]:
    """The namespace's own IPv4 addresses, loopback excluded, from its `net/fib_trie` (an address line
    `|-- A.B.C.D` followed by `/32 host LOCAL`), in order, each once."""
    found: list[str] = []
    last = None
    for line in fib_trie.splitlines():
        stripped = line.strip()
        if stripped.startswith("|-- "):
            last = stripped[4:]
        elif stripped == "/32 host LOCAL" and last is not None:
            try:
                address = ipaddress.IPv4Address(last)
            except ValueError:
                continue
            if not address.is_loopback and str(address) not in found:
                found.append(str(address))
    return found


def global_ipv6_addresses(if_inet6: str) -> list[str]:
    """The namespace's global-scope IPv6 addresses (scope 00) from its `net/if_inet6`, in order."""
    found: list[str] = []
    for line in if_inet6.splitlines():
        fields = line.split()
        if len(fields) < 6 or len(fields[0]) != 32 or fields[3] != "00":
            continue
        try:
            address = str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))
        except ValueError:
            continue
        if address not in found:
            found.append(address)
    return found


def vllm_api_command(argv: list[str]) -> ApiCommand | None:
    """The API server's listening flags when `argv` (a /proc/PID/cmdline split at NULs) starts vLLM's
    OpenAI-compatible server, else None (an engine core, a worker, any other program). The last of a
    repeated flag wins, as with argparse."""
    if not _is_api_server(argv):
        return None
    values: dict[str, str] = {}
    index = 0
    while index < len(argv):
        argument = argv[index]
        name, equals, value = argument.partition("=")
        if name in _VALUE_FLAGS:
            if not equals:
                if index + 1 >= len(argv):
                    break
                index += 1
                value = argv[index]
            values[name] = value
        index += 1
    try:
        port = int(values.get("--port", VLLM_DEFAULT_PORT))
    except ValueError:
        return None
    if not 0 < port < 65536:
        return None
    host = values.get("--host") or None
    return ApiCommand(host=host, port=port, uds=values.get("--uds") or None,
                      https=bool(values.get("--ssl-certfile")))


def _is_api_server(argv: list[str]) -> bool:
    if not argv:
        return False
    for index, argument in enumerate(argv[:4]):
        base = argument.rsplit("/", 1)[-1]
        if base == "vllm" and index + 1 < len(argv) and argv[index + 1] == "serve":
            return True  # the vllm console script, run directly or by an interpreter
        if argument == "-m" and index + 1 < len(argv) and argv[index + 1] in _API_MODULES:
            module = argv[index + 1]
            return module != "vllm.entrypoints.cli.main" or "serve" in argv[index + 2:index + 3]
    return False
