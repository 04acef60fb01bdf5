"""Where each watched unit's vLLM API server listens, from procfs: its processes' listening sockets, read in
their own network namespace, and their command line as the fallback. Never from an environment variable
(a unit's environment is its own to say anything in).

For a unit's cgroup (the paths `/proc/PID/cgroup` gives, as `vllm_xpu_exporter.parsers.cgroup` reads them):

1. its processes are those whose cgroup file names that path (every pid's cgroup file is read once, again
   while the process is young (it may not have joined its unit's cgroup yet), and then about every ten
   `rescan_seconds`: a settled host costs one directory listing and a few reads);
2. the API server is the lowest pid whose command line starts vLLM's OpenAI-compatible server
   (`vllm_xpu_exporter.parsers.sockets.vllm_api_command`): the engine core, its workers and anything
   else in the unit are not, whatever they listen on;
3. its sockets are the `socket:[INODE]` links of its `/proc/PID/fd`, matched against `net/tcp`, `net/tcp6`
   and `net/unix` of `/proc/PID/net`, which the kernel answers for that process's network namespace: the
   listener on the command line's port (or `--uds` path) wins, else the only TCP listener it has;
4. a listener on one address is published only when that address is the namespace's own (loopback, or one
   its tables list): with IP_FREEBIND a process may listen on any address, another host's or another
   namespace's, and must not send Prometheus there (the check of the command line's `--host`, step 5);
   an address of every interface (`0.0.0.0`, `::`) is `host_address` in the host's network namespace (the
   one of the lowest pid under --path.procfs, PID 1 on a host) and the namespace's own address in any
   other (a container's or a pod's, from its `net/fib_trie` or `net/if_inet6`); a loopback address of
   another namespace cannot be reached from outside it and yields no endpoint;
5. when the sockets say nothing (its fds unreadable without CAP_SYS_PTRACE, or not listening yet), the
   command line's `--host`/`--port`/`--uds` are used (`found_by` "command line"), a `--host` only when it is
   an address of the process's own network namespace (loopback, or one its tables list): a command line is
   the unit's to write, and must not send Prometheus to another host.

What is found for a unit is kept while its API server's pid lives, and looked for again after
`rescan_seconds`: most calls cost a listing of the pids and a cgroup file read per new pid.
"""

from __future__ import annotations

import ipaddress
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from vllm_xpu_exporter.parsers.sockets import (ApiCommand, InetListener, global_ipv6_addresses, inet_listeners,
                                               local_ipv4_addresses, socket_inode, unix_listeners,
                                               vllm_api_command)
from vllm_xpu_exporter.sources.procfs import (DEFAULT_PROCFS, ProcfsUnavailable, list_pids, process_age_seconds,
                                              read_bytes, read_text, read_unit_cgroup)

MAX_CMDLINE_BYTES = 64 * 1024
MAX_NET_TABLE_BYTES = 16 * 1024 * 1024  # a host's net/tcp with tens of thousands of sockets
MAX_SMALL_TABLE_BYTES = 1024 * 1024
DEFAULT_RESCAN_SECONDS = 60.0
DEFAULT_HOST_ADDRESS = "127.0.0.1"
YOUNG_SECONDS = 10.0  # a process younger than this may not have joined its unit's cgroup yet
SETTLED_RESCAN_FACTOR = 10  # a settled process's cgroup file is read again after ~10 x rescan_seconds
WILDCARDS = frozenset({"0.0.0.0", "::"})

__all__ = ["Endpoint", "EndpointFinder", "ProcfsUnavailable"]


@dataclass(frozen=True)
class Endpoint:
    """A unit's vLLM API endpoint: `address` is `host:port` (`[v6]:port`) for TCP, the socket's path for a Unix
    socket; `found_by` is "socket" or "command line"."""

    pid: int
    scheme: str
    transport: str
    address: str
    found_by: str


class EndpointFinder:
    """`find(cgroup_paths)`: the endpoint of each of those cgroups that runs a vLLM API server. Thread-safe
    (calls are serial)."""

    def __init__(self, procfs: str = DEFAULT_PROCFS, host_address: str = DEFAULT_HOST_ADDRESS,
                 rescan_seconds: float = DEFAULT_RESCAN_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.procfs = procfs
        self.host_address = host_address
        self.rescan_seconds = rescan_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._cgroup_of: dict[int, tuple[str | None, float]] = {}  # pid -> (cgroup path, read again at)
        self._found: dict[str, _Found] = {}  # cgroup path -> what was found, until due

    def find(self, cgroup_paths: Iterable[str]) -> dict[str, Endpoint]:
        """cgroup path -> its endpoint, for those of `cgroup_paths` whose processes run a vLLM API server;
        raises ProcfsUnavailable when --path.procfs cannot be listed."""
        wanted = set(cgroup_paths)
        with self._lock:
            pids = list_pids(self.procfs)
            now = self._clock()
            members = self._members(pids, wanted, now)
            found: dict[str, Endpoint] = {}
            tables = _Tables(self.procfs)
            for path in sorted(wanted):
                endpoint = self._endpoint(path, members.get(path, []), tables, pids[0], now)
                if endpoint is not None:
                    found[path] = endpoint
            for path in set(self._found) - wanted:
                del self._found[path]
            return found

    def _members(self, pids: list[int], wanted: set[str], now: float) -> dict[str, list[int]]:
        """cgroup path -> its pids (ascending), for the wanted paths; each pid's cgroup file is read when
        it is new, and again once due (a process moved to another cgroup after its fork)."""
        cgroup_of, self._cgroup_of = self._cgroup_of, {}
        members: dict[str, list[int]] = {}
        for pid in pids:
            known = cgroup_of.get(pid)
            if known is None or now >= known[1]:
                try:
                    unit_cgroup = read_unit_cgroup(self.procfs, pid)
                except OSError:
                    unit_cgroup = None
                # A process joins its unit's cgroup before it execs, so its cgroup holds once it runs: read
                # again at the next call while it is young (forked, maybe not moved yet), else seldom
                age = process_age_seconds(self.procfs, pid) if known is None else None
                young = known is None and (age is None or age < YOUNG_SECONDS)
                known = (None if unit_cgroup is None else unit_cgroup.path,
                         now if young else now + SETTLED_RESCAN_FACTOR * self.rescan_seconds * (0.5 + (pid % 16) / 16))
            self._cgroup_of[pid] = known
            if known[0] in wanted:
                members.setdefault(known[0], []).append(pid)
        return members

    def _endpoint(self, path: str, pids: list[int], tables: _Tables, host_pid: int, now: float) -> Endpoint | None:
        kept = self._found.get(path)
        if kept is not None and now < kept.due:
            if kept.api_pid is not None and kept.api_pid in pids:
                return kept.endpoint
            if kept.api_pid is None and kept.pids == tuple(pids):
                return None  # the same processes, none of them an API server
        api_pid, endpoint = self._look(pids, tables, host_pid)
        self._found[path] = _Found(api_pid, endpoint, now + self.rescan_seconds, tuple(pids))
        return endpoint

    def _look(self, pids: list[int], tables: _Tables, host_pid: int) -> tuple[int | None, Endpoint | None]:
        for pid in pids:
            try:
                argv = read_bytes(f"{self.procfs}/{pid}/cmdline", MAX_CMDLINE_BYTES).decode("utf-8", "replace")
            except OSError:
                continue
            command = vllm_api_command(argv.rstrip("\0").split("\0"))
            if command is not None:
                return pid, self._locate(pid, command, tables, host_pid)
        return None, None

    def _locate(self, pid: int, command: ApiCommand, tables: _Tables, host_pid: int) -> Endpoint | None:
        scheme = "https" if command.https else "http"
        inodes = self._socket_inodes(pid)
        namespace = tables.namespace_of(pid)
        if command.uds is not None:
            paths = {tables.unix(pid, namespace).get(inode) for inode in inodes} - {None}
            if command.uds in paths or not paths:
                return Endpoint(pid, scheme, "unix", command.uds, "socket" if paths else "command line")
            return Endpoint(pid, scheme, "unix", sorted(paths)[0], "socket")  # type: ignore[type-var]
        listeners = [listener for inode in sorted(inodes)
                     if (listener := tables.inet(pid, namespace).get(inode)) is not None]
        chosen = _choose(listeners, command)
        if chosen is None:
            host = _own_address(command.host, pid, namespace, tables)
            if host is None:
                return None
            chosen, found_by = InetListener(host, command.port), "command line"
        else:
            found_by = "socket"
        host = self._reachable_host(chosen.address, pid, namespace, tables, host_pid)
        if host is None:
            return None
        address = f"[{host}]:{chosen.port}" if ":" in host else f"{host}:{chosen.port}"
        return Endpoint(pid, scheme, "tcp", address, found_by)

    def _reachable_host(self, address: str, pid: int, namespace: str | None, tables: _Tables,
                        host_pid: int) -> str | None:
        in_host_namespace = namespace is None or namespace == tables.namespace_of(host_pid)
        if address not in WILDCARDS:
            if _own_address(address, pid, namespace, tables) is None:
                return None  # bound with IP_FREEBIND to an address its namespace does not have: someone else's
            if not in_host_namespace and (address.startswith("127.") or address == "::1" or address == "localhost"):
                return None  # another namespace's loopback: nothing outside it reaches it
            return address
        if in_host_namespace:
            return self.host_address
        ipv4 = tables.ipv4_addresses(pid, namespace)
        if ipv4:
            return ipv4[0]  # `::` without IPV6_V6ONLY takes IPv4 too, and a container's IPv4 is the one routed
        ipv6 = tables.ipv6_addresses(pid, namespace) if address == "::" else []
        return ipv6[0] if ipv6 else None

    def _socket_inodes(self, pid: int) -> set[int]:
        """The inodes of the process's sockets; none when its fds cannot be read."""
        inodes: set[int] = set()
        try:
            fd_dir = os.open(f"{self.procfs}/{pid}/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return inodes
        try:
            for fd in os.listdir(fd_dir):
                try:
                    inode = socket_inode(os.readlink(fd, dir_fd=fd_dir))
                except OSError:
                    continue
                if inode is not None:
                    inodes.add(inode)
        except OSError:
            pass
        finally:
            os.close(fd_dir)
        return inodes


def _own_address(host: str | None, pid: int, namespace: str | None, tables: _Tables) -> str | None:
    """The command line's --host, when it is an address of the process's own network namespace: every
    address, `localhost`, a loopback address or one the namespace has. A command line is the unit's to
    write: it must not send Prometheus to another host's port. None for anything else (another address, a
    host name)."""
    if host is None or host in WILDCARDS:
        return "0.0.0.0"
    if host == "localhost":
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if address.is_loopback:
        return str(address)
    own = tables.ipv4_addresses(pid, namespace) if address.version == 4 else tables.ipv6_addresses(pid, namespace)
    return str(address) if str(address) in own else None


def _choose(listeners: list[InetListener], command: ApiCommand) -> InetListener | None:
    """The listener on the command line's port (the one on its --host first), else the only one."""
    on_port = [listener for listener in listeners if listener.port == command.port]
    if on_port:
        for listener in on_port:
            if command.host is not None and listener.address == command.host:
                return listener
        return on_port[0]
    return listeners[0] if len(set(listeners)) == 1 else None


@dataclass(frozen=True)
class _Found:
    """What was found for a cgroup: its API server's pid (None: none of `pids` is one) and endpoint."""

    api_pid: int | None
    endpoint: Endpoint | None
    due: float
    pids: tuple[int, ...]


class _Tables:
    """The network tables of one `find`, read once per network namespace (through any of its processes)."""

    def __init__(self, procfs: str) -> None:
        self.procfs = procfs
        self._namespaces: dict[int, str | None] = {}
        self._read: dict[tuple[str | None, str], object] = {}

    def namespace_of(self, pid: int) -> str | None:
        if pid not in self._namespaces:
            try:
                self._namespaces[pid] = os.readlink(f"{self.procfs}/{pid}/ns/net")
            except OSError:
                self._namespaces[pid] = None
        return self._namespaces[pid]

    def inet(self, pid: int, namespace: str | None) -> dict[int, InetListener]:
        return self._once(namespace, pid, "inet", lambda: {
            **inet_listeners(self._text(pid, "tcp", MAX_NET_TABLE_BYTES), ipv6=False),
            **inet_listeners(self._text(pid, "tcp6", MAX_NET_TABLE_BYTES), ipv6=True)})

    def unix(self, pid: int, namespace: str | None) -> dict[int, str]:
        return self._once(namespace, pid, "unix", lambda: unix_listeners(self._text(pid, "unix", MAX_NET_TABLE_BYTES)))

    def ipv4_addresses(self, pid: int, namespace: str | None) -> list[str]:
        return self._once(namespace, pid, "ipv4",
                          lambda: local_ipv4_addresses(self._text(pid, "fib_trie", MAX_SMALL_TABLE_BYTES)))

    def ipv6_addresses(self, pid: int, namespace: str | None) -> list[str]:
        return self._once(namespace, pid, "ipv6",
                          lambda: global_ipv6_addresses(self._text(pid, "if_inet6", MAX_SMALL_TABLE_BYTES)))

    def _once(self, namespace: str | None, pid: int, what: str, read: Callable[[], object]):  # type: ignore[no-untyped-def]
        # a namespace not known (ns/net unreadable) is read per process
        key = (namespace if namespace is not None else f"pid {pid}", what)
        if key not in self._read:
            self._read[key] = read()
        return self._read[key]

    def _text(self, pid: int, table: str, limit: int) -> str:
        try:
            return read_text(f"{self.procfs}/{pid}/net/{table}", limit)
        except OSError:
            return ""
