"""Where each unit's vLLM API server listens (sources/endpoints.py), over a fixture procfs: sockets in the
process's own network namespace, the command line as fallback, nothing from other programs' listeners; and
over the real /proc, a process of its own network namespace listening (IP_FREEBIND) where it has no address."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_xpu_exporter.sources.endpoints import Endpoint, EndpointFinder, ProcfsUnavailable
from fakeprocfs import CHAT_UNIT, CONTAINER_CGROUP, FakeProcfs, vllm_api_host, xe_fdinfo
from taskslimit import remove_cgroup

CHAT = f"/system.slice/{CHAT_UNIT}"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def addresses(found: dict[str, Endpoint]) -> dict[str, str]:
    return {path: endpoint.address for path, endpoint in found.items()}


def test_every_unit_found_by_its_sockets_and_no_other_listener(tmp_path):
    procfs = FakeProcfs(tmp_path)
    expected = vllm_api_host(procfs)
    found = EndpointFinder(str(procfs.root)).find(expected)
    assert addresses(found) == {path: address for path, address in expected.items() if address}
    assert {path: (e.transport, e.scheme, e.found_by, e.pid) for path, e in found.items()} == {
        CHAT: ("tcp", "http", "socket", 100),
        "/system.slice/vllm-xpu-embedding.service": ("tcp", "http", "socket", 200),
        "/system.slice/vllm-xpu-stt.service": ("unix", "http", "socket", 300),
        CONTAINER_CGROUP: ("tcp", "http", "socket", 500),
    }


def test_other_programs_cgroups_yield_nothing(tmp_path):
    procfs = FakeProcfs(tmp_path)
    vllm_api_host(procfs)
    others = [f"/system.slice/other-{n}.service" for n in range(100)] + ["/system.slice/docker.service"]
    assert EndpointFinder(str(procfs.root)).find(others) == {}


def test_a_wildcard_listener_of_the_hosts_namespace_is_the_host_address(tmp_path):
    procfs = FakeProcfs(tmp_path)
    procfs.add_process(1).set_cmdline("/sbin/init")
    api = procfs.add_unit_process(100, CHAT)
    api.set_cmdline("vllm", "serve", "m", "--port", "8443", "--ssl-certfile", "/etc/c.pem", "--ssl-keyfile", "k")
    api.add_socket_fd(procfs.host_net.add_tcp_listener("::", 8443))
    found = EndpointFinder(str(procfs.root), host_address="192.0.2.10").find([CHAT])
    assert found[CHAT] == Endpoint(100, "https", "tcp", "192.0.2.10:8443", "socket")


def test_the_listener_on_the_command_lines_port_wins_and_the_socket_tells_a_port_the_command_line_does_not(tmp_path):
    procfs = FakeProcfs(tmp_path)
    procfs.add_process(1)
    api = procfs.add_unit_process(100, CHAT)
    api.set_cmdline("vllm", "serve", "m", "--port", "8001")
    procfs.host_net.ipv4 = ("10.1.2.3",)  # the host's own address
    api.add_socket_fd(procfs.host_net.add_tcp_listener("127.0.0.1", 9999))
    api.add_socket_fd(procfs.host_net.add_tcp_listener("10.1.2.3", 8001))
    assert EndpointFinder(str(procfs.root)).find([CHAT])[CHAT].address == "10.1.2.3:8001"
    # a port given in a config file (--config): the command line says the default, the one socket says where
    other = "/system.slice/vllm-b.service"
    api = procfs.add_unit_process(200, other)
    api.set_cmdline("vllm", "serve", "--config", "/etc/vllm/b.yaml")
    api.add_socket_fd(procfs.host_net.add_tcp_listener("127.0.0.1", 8123))
    assert EndpointFinder(str(procfs.root)).find([other])[other].address == "127.0.0.1:8123"


def test_unreadable_fds_fall_back_to_the_command_line(tmp_path):
    procfs = FakeProcfs(tmp_path)
    procfs.add_process(1)
    procfs.host_net.add_tcp_listener("127.0.0.1", 8001)
    api = procfs.add_unit_process(100, CHAT)
    api.set_cmdline("vllm", "serve", "m", "--host", "127.0.0.1", "--port", "8001")
    (api.path / "fd").rmdir()
    (api.path / "fd").write_text("")  # ENOTDIR, as EACCES without CAP_SYS_PTRACE
    stt = "/system.slice/vllm-xpu-stt.service"
    procfs.add_unit_process(300, stt).set_cmdline("vllm", "serve", "m", "--uds", "/run/s.sock")
    found = EndpointFinder(str(procfs.root)).find([CHAT, stt])
    assert found[CHAT] == Endpoint(100, "http", "tcp", "127.0.0.1:8001", "command line")
    assert found[stt] == Endpoint(300, "http", "unix", "/run/s.sock", "command line")


def test_another_namespaces_loopback_is_no_endpoint(tmp_path):
    procfs = FakeProcfs(tmp_path)
    procfs.add_process(1)
    namespace = procfs.add_netns(4026532600, ipv4=("10.88.0.4",))
    api = procfs.add_unit_process(100, CONTAINER_CGROUP)
    api.enter_network_namespace(namespace)
    api.set_cmdline("vllm", "serve", "m", "--host", "127.0.0.1")
    api.add_socket_fd(namespace.add_tcp_listener("127.0.0.1", 8000))
    assert EndpointFinder(str(procfs.root)).find([CONTAINER_CGROUP]) == {}


def test_an_ipv6_only_namespace_gives_its_global_address(tmp_path):
    procfs = FakeProcfs(tmp_path)
    procfs.add_process(1)
    namespace = procfs.add_netns(4026532601, ipv6=("2001:db8::5",))
    api = procfs.add_unit_process(100, CONTAINER_CGROUP)
    api.enter_network_namespace(namespace)
    api.set_cmdline("vllm", "serve", "m")
    api.add_socket_fd(namespace.add_tcp_listener("::", 8000))
    assert EndpointFinder(str(procfs.root)).find([CONTAINER_CGROUP])[CONTAINER_CGROUP].address == "[2001:db8::5]:8000"


def test_found_endpoints_are_kept_while_the_api_server_lives_and_looked_for_again_after(tmp_path):
    procfs = FakeProcfs(tmp_path)
    procfs.add_process(1)
    api = procfs.add_unit_process(100, CHAT)
    api.set_cmdline("vllm", "serve", "m", "--port", "8001")
    api.add_socket_fd(procfs.host_net.add_tcp_listener("127.0.0.1", 8001))
    clock = Clock()
    finder = EndpointFinder(str(procfs.root), rescan_seconds=60, clock=clock)
    assert finder.find([CHAT])[CHAT].address == "127.0.0.1:8001"
    # the same process now says another port: not read again before it is due
    api.set_cmdline("vllm", "serve", "m", "--port", "8002")
    api.add_socket_fd(procfs.host_net.add_tcp_listener("127.0.0.1", 8002))
    clock.now += 30
    assert finder.find([CHAT])[CHAT].address == "127.0.0.1:8001"
    clock.now += 31
    assert finder.find([CHAT])[CHAT].address == "127.0.0.1:8002"
    # a restart: the API server's pid goes, the new one is looked at at once
    procfs.remove_process(100)
    restarted = procfs.add_unit_process(110, CHAT)
    restarted.set_cmdline("vllm", "serve", "m", "--port", "8003")
    restarted.add_socket_fd(procfs.host_net.add_tcp_listener("127.0.0.1", 8003))
    clock.now += 1
    assert finder.find([CHAT])[CHAT] == Endpoint(110, "http", "tcp", "127.0.0.1:8003", "socket")


def test_a_unit_without_an_api_server_is_looked_at_again_when_its_processes_change(tmp_path):
    procfs = FakeProcfs(tmp_path)
    procfs.add_process(1)
    engine = procfs.add_unit_process(101, CHAT)
    engine.add_drm_fd(xe_fdinfo(client_id=1))
    clock = Clock()
    finder = EndpointFinder(str(procfs.root), clock=clock)
    assert finder.find([CHAT]) == {}
    api = procfs.add_unit_process(102, CHAT)
    api.set_cmdline("vllm", "serve", "m")
    api.add_socket_fd(procfs.host_net.add_tcp_listener("0.0.0.0", 8000))
    clock.now += 1
    assert finder.find([CHAT])[CHAT].address == "127.0.0.1:8000"


def test_an_unusable_procfs_raises(tmp_path):
    with pytest.raises(ProcfsUnavailable):
        EndpointFinder(str(tmp_path / "missing")).find([CHAT])


def test_a_young_process_read_before_it_joined_its_units_cgroup_is_read_again(tmp_path):
    procfs = FakeProcfs(tmp_path)
    procfs.add_process(1)
    api = procfs.add_unit_process(100, "/init.scope", started_seconds_ago=0.5)  # forked, not moved yet
    api.set_cmdline("vllm", "serve", "m")
    api.add_socket_fd(procfs.host_net.add_tcp_listener("0.0.0.0", 8000))
    clock = Clock()
    finder = EndpointFinder(str(procfs.root), clock=clock)
    assert finder.find([CHAT]) == {}
    (api.path / "cgroup").write_text(f"0::{CHAT}\n")
    clock.now += 1
    assert finder.find([CHAT])[CHAT].address == "127.0.0.1:8000"


def test_a_command_line_cannot_point_the_target_at_another_host(tmp_path):
    procfs = FakeProcfs(tmp_path)
    procfs.add_process(1)
    namespace = procfs.add_netns(4026532700, ipv4=("10.88.0.9",))
    for pid, host in ((100, "192.0.2.77"), (101, "metadata.internal"), (102, "10.88.0.9")):
        api = procfs.add_unit_process(pid, f"/system.slice/vllm-{pid}.service")
        api.enter_network_namespace(namespace)
        api.set_cmdline("vllm", "serve", "m", "--host", host, "--port", "8000")
        (api.path / "fd").rmdir()
        (api.path / "fd").write_text("")  # its sockets unreadable: the command line is all there is
    found = EndpointFinder(str(procfs.root)).find(f"/system.slice/vllm-{pid}.service" for pid in (100, 101, 102))
    assert addresses(found) == {"/system.slice/vllm-102.service": "10.88.0.9:8000"}


def test_a_socket_on_an_address_its_namespace_does_not_have_is_no_endpoint(tmp_path):
    """IP_FREEBIND lets any process listen on any address: the table then shows an address that is another
    host's or another namespace's, which Prometheus must not be sent to."""
    procfs = FakeProcfs(tmp_path)
    procfs.add_process(1)
    namespace = procfs.add_netns(4026532800, ipv4=("10.88.0.9",))
    for pid, address in ((100, "10.200.0.2"), (101, "10.88.0.9"), (102, "192.0.2.1")):
        api = procfs.add_unit_process(pid, f"/system.slice/vllm-{pid}.service")
        if pid != 102:
            api.enter_network_namespace(namespace)
        api.set_cmdline("vllm", "serve", "m", "--port", "19100")
        api.add_socket_fd((namespace if pid != 102 else procfs.host_net).add_tcp_listener(address, 19100))
    found = EndpointFinder(str(procfs.root)).find(f"/system.slice/vllm-{pid}.service" for pid in (100, 101, 102))
    assert addresses(found) == {"/system.slice/vllm-101.service": "10.88.0.9:19100"}


LISTENER = """\
import os, socket, sys
listener = socket.socket()
listener.setsockopt(socket.SOL_IP, getattr(socket, "IP_FREEBIND", 15), 1)
listener.bind((os.environ["BIND"], 19100))
listener.listen()
print("listening", flush=True)
sys.stdin.read()
"""
SYSTEMD_V1 = Path("/sys/fs/cgroup/systemd")
_units = itertools.count()


def test_a_real_namespace_listening_with_ip_freebind_on_another_namespaces_address_is_not_published(tmp_path):
    """Two units, each a process of its own network namespace (its loopback only, holding also 10.200.0.3):
    one listens on its own 10.200.0.3, the other, with IP_FREEBIND, on 10.200.0.2, an address it does not
    have. Only the first is an endpoint. The real /proc, sockets and cgroups."""
    if not (SYSTEMD_V1 / "cgroup.procs").exists() or os.geteuid() != 0:
        pytest.fail("needs root and the name=systemd cgroup hierarchy (a hybrid host)")
    script = tmp_path / "vllm"  # its command line reads `vllm serve`, as an API server's does
    script.write_text(LISTENER)
    units, processes = {}, []
    slice_ = SYSTEMD_V1 / f"vllm-xpu-freebind-{os.getpid()}-{next(_units)}.slice"
    slice_.mkdir()
    try:
        for bind in ("10.200.0.3", "10.200.0.2"):
            unit = slice_ / f"vllm-xpu-freebind-{bind}.service"
            unit.mkdir()
            units[bind] = unit
            inside = f"ip link set lo up && ip addr add 10.200.0.3/32 dev lo && exec {sys.executable} {script} serve m"
            process = subprocess.Popen(["sh", "-c", f'echo $$ > {unit}/cgroup.procs && exec unshare --net -- '
                                        f'sh -c "{inside}"'], env={**os.environ, "BIND": bind},
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            processes.append(process)
            assert process.stdout.readline() == "listening\n"
        paths = {bind: "/" + str(unit.relative_to(SYSTEMD_V1)) for bind, unit in units.items()}
        found = EndpointFinder("/proc").find(paths.values())
        assert addresses(found) == {paths["10.200.0.3"]: "10.200.0.3:19100"}
        assert found[paths["10.200.0.3"]].found_by == "socket"
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=10)
        for unit in units.values():
            remove_cgroup(unit)
        slice_.rmdir()
