"""The procfs socket tables and vLLM API servers' command lines (parsers/sockets.py)."""

from __future__ import annotations

import pytest

from vllm_xpu_exporter.parsers.sockets import (ApiCommand, InetListener, global_ipv6_addresses, inet_listeners,
                                               local_ipv4_addresses, socket_inode, unix_listeners, vllm_api_command)

pytestmark = pytest.mark.fast

# As a little-endian host's kernel prints them (each 32-bit word in host order).
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 51234 1 0000000000000000 100 0 0 10 0
   1: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 51235 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F41 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 51236 1 0000000000000000 20 4 30 10 -1
   3: 0200A8C0:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 0 1 0000000000000000 100 0 0 10 0
   4: garbage
"""
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F42 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 61234 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000000000000:1F43 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 61235 1 0000000000000000 100 0 0 10 0
   2: B80D0120000000000000000001000000:1F44 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 61236 1 0000000000000000 100 0 0 10 0
"""
UNIX = """\
Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 71234 /run/vllm/stt.sock
0000000000000000: 00000002 00000000 00010000 0001 01 71235 @/tmp/.X11-unix/X0
0000000000000000: 00000003 00000000 00000000 0001 03 71236 /run/vllm/stt.sock
0000000000000000: 00000002 00000000 00010000 0002 01 71237 /run/dgram.sock
0000000000000000: 00000002 00000000 00010000 0001 01 71238
0000000000000000: 00000002 00000000 00010000 0001 01 71239 /run/with space.sock
"""


def test_listening_tcp_sockets_by_inode_with_their_addresses():
    assert inet_listeners(TCP, ipv6=False, byteorder="little") == {51234: InetListener("127.0.0.1", 8001),
                                                                   51235: InetListener("0.0.0.0", 8000)}
    assert inet_listeners(TCP6, ipv6=True, byteorder="little") == {
        61234: InetListener("::1", 8002), 61235: InetListener("::", 8003), 61236: InetListener("2001:db8::1", 8004)}


def test_a_big_endian_kernels_words_give_the_same_addresses():
    big_endian_tcp = "header\n   0: 7F000001:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 51234\n"
    big_endian_tcp6 = ("header\n   0: 20010DB8000000000000000000000001:1F44 00000000000000000000000000000000:0000 0A "
                       "00000000:00000000 00:00000000 00000000     0        0 61236\n")
    assert inet_listeners(big_endian_tcp, ipv6=False, byteorder="big") == {51234: InetListener("127.0.0.1", 8001)}
    assert inet_listeners(big_endian_tcp6, ipv6=True, byteorder="big") == {61236: InetListener("2001:db8::1", 8004)}


def test_listening_unix_stream_sockets_with_a_path():
    assert unix_listeners(UNIX) == {71234: "/run/vllm/stt.sock", 71235: "@/tmp/.X11-unix/X0",
                                    71239: "/run/with space.sock"}


@pytest.mark.parametrize("link, inode", [("socket:[12345]", 12345), ("pipe:[12345]", None),
                                         ("/dev/dri/renderD128", None), ("socket:[]", None), ("socket:[1]x", None)])
def test_socket_links(link, inode):
    assert socket_inode(link) == inode


def test_a_namespaces_own_addresses():
    fib_trie = ("Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n"
                "     +-- 127.0.0.0/8 2 0 2\n        |-- 127.0.0.1\n           /32 host LOCAL\n"
                "     |-- 172.17.0.2\n        /32 link BROADCAST\n        /32 host LOCAL\n"
                "     |-- 172.17.255.255\n        /32 link BROADCAST\n"
                "Local:\n     |-- 172.17.0.2\n        /32 host LOCAL\n")
    assert local_ipv4_addresses(fib_trie) == ["172.17.0.2"]
    if_inet6 = ("00000000000000000000000000000001 01 80 10 80       lo\n"
                "fe800000000000000042acfffe110002 02 40 20 80     eth0\n"
                "20010db8000000000000000000000005 02 40 00 80     eth0\n")
    assert global_ipv6_addresses(if_inet6) == ["2001:db8::5"]


@pytest.mark.parametrize("argv, command", [
    (["/opt/vllm/bin/python3", "/opt/vllm/bin/vllm", "serve", "org/model", "--port", "8001", "--host", "127.0.0.1"],
     ApiCommand("127.0.0.1", 8001, None, False)),
    (["vllm", "serve", "m", "--port=9000", "--ssl-keyfile", "k.pem", "--ssl-certfile=c.pem"],
     ApiCommand(None, 9000, None, True)),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], ApiCommand(None, 8000, None, False)),
    (["python3", "-m", "vllm.entrypoints.cli.main", "serve", "m", "--uds", "/run/v.sock"],
     ApiCommand(None, 8000, "/run/v.sock", False)),
    (["vllm", "serve", "m", "--port", "8001", "--port", "8002"], ApiCommand(None, 8002, None, False)),
    (["VLLM::EngineCore"], None),
    (["python3", "-m", "vllm.entrypoints.cli.main", "bench", "serve"], None),
    (["vllm", "chat", "--url", "http://x:8000"], None),
    (["nginx", "-g", "daemon off;"], None),
    (["vllm", "serve", "m", "--port", "http"], None),
    (["vllm", "serve", "m", "--port", "70000"], None),
    ([], None),
])
def test_api_server_command_lines(argv, command):
    assert vllm_api_command(argv) == command
