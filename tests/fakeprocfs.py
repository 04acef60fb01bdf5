"""Builds a fake procfs tree in a directory, laid out like the kernel's, for the procfs source.

    base/proc/PID/fd/N       symlink to a real character device node (DRM: major 226) or to a regular
                             file / FIFO / another char device (non-DRM fds); stat() follows it
                             exactly as it follows /proc's magic links
    base/proc/PID/fdinfo/N   the fdinfo text
    base/proc/PID/cgroup     the cgroup file (v2 `0::/path`, or v1/hybrid lines)
    base/proc/PID/cmdline    the arguments, NUL-terminated
    base/proc/PID/fd/N       also `socket:[INODE]` links (sockets), whose inodes the namespace's tables list
    base/proc/PID/net        symlink to its network namespace's tables (base/netns/INODE: tcp, tcp6, unix,
                             fib_trie, if_inet6), the host's unless it entered another; ns/net reads net:[INODE]
    base/proc/self, base/proc/meminfo   non-pid entries a scan must ignore
    base/dev/dri/renderD128  device nodes, made with mknod (needs root, which the tests run as)

Unreadable entries: the tests run as root, which chmod 000 cannot stop, so unreadability is emulated
with errors root does get, raised at once and never blocking: a directory where the fdinfo or cgroup
file should be (EISDIR on read), a regular file where the fd directory should be (ENOTDIR). Vanished
entries (a process exiting mid-scan): an fd entry without its fdinfo, an fd whose link dangles, a pid
directory without an fd directory, a missing cgroup file (all ENOENT, as from a real /proc). Between
scans (`close_fd`, `remove_process`) a closed fd's fdinfo is emptied before it goes: a reader that kept
it open reads no DRM fd, where /proc fails the read.

Also the fdinfo texts the kernels print (`xe_fdinfo`, `i915_fdinfo`, `i915_61_fdinfo`), taken from the
kernel's drm-usage-stats documentation and the xe and i915 drivers' fdinfo code.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DRM_MAJOR = 226
RENDER_MINOR = 128
CARD_MINOR = 0


def v2_cgroup(path: str) -> str:
    """A cgroup v2 (unified) `/proc/PID/cgroup`."""
    return f"0::{path}\n"


def v1_cgroup(path: str) -> str:
    """A cgroup v1 `/proc/PID/cgroup` as systemd on a legacy host writes it (controllers may differ)."""
    return (f"12:pids:{path}\n11:memory:{path}\n10:cpu,cpuacct:{path}\n9:devices:{path}\n"
            f"8:freezer:/\n1:name=systemd:{path}\n0::/\n")


def hybrid_cgroup(path: str) -> str:
    """A cgroup v1 + unified (systemd `hybrid`) `/proc/PID/cgroup`."""
    return f"4:memory:{path}\n3:cpu,cpuacct:{path}\n1:name=systemd:{path}\n0::{path}\n"


def size_text(size: int, unit: str) -> str:
    divisor = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "kB": 1 << 10}[unit]
    if size % divisor:
        raise ValueError(f"{size} bytes is not a whole number of {unit}")
    return f"{size // divisor} {unit}" if unit else str(size // divisor)


def fdinfo_head(driver: str, pdev: str | None, client_id: int | None) -> str:
    lines = ["pos:\t0", "flags:\t02100002", "mnt_id:\t24", "ino:\t1086", f"drm-driver:\t{driver}"]
    if pdev is not None:
        lines.append(f"drm-pdev:\t{pdev}")
    if client_id is not None:
        lines.append(f"drm-client-id:\t{client_id}")
    return "\n".join(lines) + "\n"


XE_ENGINES = ("rcs", "bcs", "vcs", "vecs", "ccs")
XE_DEFAULT_CYCLES = 28257900  # xe_fdinfo's drm-cycles of an engine whose cycles are not given
XE_DEFAULT_TOTAL_CYCLES = 7655183225  # xe_fdinfo's drm-total-cycles when total_cycles is not given
I915_ENGINES = ("render", "copy", "video", "video-enhance", "compute")


def xe_fdinfo(client_id: int | None = 1, pdev: str | None = "0000:03:00.0", vram0: int = 0,
              unit: str = "KiB", shared_vram0: int = 0, system: int = 0, gtt: int = 0,
              cycles: dict[str, int] | None = None, total_cycles: int = XE_DEFAULT_TOTAL_CYCLES) -> str:
    """An xe (kernel 6.8+) fdinfo: regions system, gtt, vram0, stolen; engines as drm-cycles (`cycles`
    per engine, XE_DEFAULT_CYCLES for those not given) and drm-total-cycles (`total_cycles` for every engine)."""
    text = fdinfo_head("xe", pdev, client_id)
    regions = {"system": (system, 0), "gtt": (gtt, 0), "vram0": (vram0, shared_vram0), "stolen": (0, 0)}
    for region, (total, shared) in regions.items():
        text += (f"drm-total-{region}:\t{size_text(total, unit)}\n"
                 f"drm-shared-{region}:\t{size_text(shared, unit)}\n"
                 f"drm-active-{region}:\t0\n"
                 f"drm-resident-{region}:\t{size_text(total, unit)}\n")
        if region == "system":
            text += "drm-purgeable-system:\t0\n"
    for engine in XE_ENGINES:
        busy = (cycles or {}).get(engine, XE_DEFAULT_CYCLES)
        text += f"drm-cycles-{engine}:\t{busy}\ndrm-total-cycles-{engine}:\t{total_cycles}\n"
    text += "drm-engine-capacity-vcs:\t2\n"
    return text


def i915_fdinfo(client_id: int | None = 1, pdev: str | None = "0000:03:00.0", local0: int = 0,
                unit: str = "KiB", system0: int = 0, resident_local0: int | None = None,
                busy_ns: dict[str, int] | None = None, capacity: dict[str, int] | None = None) -> str:
    """An i915 fdinfo of kernel 6.8+ (6.12): regions system0, local0, stolen-system0, stolen-local0;
    drm-engine-<engine> (`busy_ns`, 0 for engines not given), drm-engine-capacity-<engine> as given."""
    text = fdinfo_head("i915", pdev, client_id)
    for engine in I915_ENGINES:
        text += f"drm-engine-{engine}:\t{(busy_ns or {}).get(engine, 0)} ns\n"
    for engine, count in (capacity or {}).items():
        text += f"drm-engine-capacity-{engine}:\t{count}\n"
    regions = {"system0": system0, "local0": local0, "stolen-system0": 0, "stolen-local0": 0}
    for region, total in regions.items():
        resident = resident_local0 if region == "local0" and resident_local0 is not None else total
        text += (f"drm-total-{region}:\t{size_text(total, unit)}\n"
                 f"drm-shared-{region}:\t0\n"
                 f"drm-active-{region}:\t0\n"
                 f"drm-resident-{region}:\t{size_text(resident, unit)}\n"
                 f"drm-purgeable-{region}:\t0\n")
    return text


def i915_61_fdinfo(client_id: int | None = 1, pdev: str | None = "0000:03:00.0") -> str:
    """An i915 fdinfo of kernel 6.1 (Debian 12): engines only, no memory keys."""
    text = fdinfo_head("i915", pdev, client_id)
    for engine in ("render", "copy", "video", "video-enhance", "compute"):
        text += f"drm-engine-{engine}:\t123456 ns\n"
    text += "drm-engine-capacity-video:\t2\n"
    return text


@dataclass
class FakeProcess:
    tree: FakeProcfs
    pid: int
    next_fd: int = 0
    fds: list[int] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.tree.root / str(self.pid)

    def _new_fd(self) -> int:
        fd = self.next_fd
        self.next_fd += 1
        self.fds.append(fd)
        return fd

    def _link(self, fd: int, target: Path) -> None:
        os.symlink(target, self.path / "fd" / str(fd))

    def _fdinfo(self, fd: int, text: str) -> None:
        (self.path / "fdinfo" / str(fd)).write_text(text)

    def add_drm_fd(self, fdinfo: str, minor: int = RENDER_MINOR) -> int:
        """An fd open on DRM device 226:`minor`, with this fdinfo; returns the fd number."""
        fd = self._new_fd()
        self._link(fd, self.tree.device_node(DRM_MAJOR, minor))
        self._fdinfo(fd, fdinfo)
        return fd

    def add_file_fd(self) -> int:
        """A regular-file fd (like a log file or a shared library)."""
        fd = self._new_fd()
        target = self.tree.base / "files" / f"{self.pid}-{fd}"
        target.parent.mkdir(exist_ok=True)
        target.write_text("")
        self._link(fd, target)
        self._fdinfo(fd, "pos:\t0\nflags:\t0100002\nmnt_id:\t25\nino:\t4242\n")
        return fd

    def add_pipe_fd(self) -> int:
        """A FIFO fd; stat() of it never blocks (only opening it would)."""
        fd = self._new_fd()
        target = self.tree.base / "files" / f"{self.pid}-{fd}.fifo"
        target.parent.mkdir(exist_ok=True)
        os.mkfifo(target)
        self._link(fd, target)
        self._fdinfo(fd, "pos:\t0\nflags:\t02\nmnt_id:\t14\nino:\t1234\n")
        return fd

    def add_null_fd(self) -> int:
        """An fd on a character device that is not DRM (1:3, /dev/null)."""
        fd = self._new_fd()
        self._link(fd, self.tree.device_node(1, 3))
        self._fdinfo(fd, "pos:\t0\nflags:\t0100002\nmnt_id:\t24\nino:\t5\n")
        return fd

    def set_started(self, seconds_ago: float) -> None:
        _write_stat(self.path, self.pid, seconds_ago)

    def add_other_fds(self, count: int) -> None:
        """`count` non-DRM fds, a mix of regular files, pipes and /dev/null."""
        adders = (self.add_file_fd, self.add_pipe_fd, self.add_null_fd)
        for index in range(count):
            adders[index % len(adders)]()

    def close_fd(self, fd: int) -> None:
        """The process closes fd `fd`: its fd and fdinfo entries go (see `FakeProcfs.remove_process`
        for what a reader that kept the fdinfo file open sees)."""
        (self.path / "fd" / str(fd)).unlink()
        _empty(self.path / "fdinfo" / str(fd))
        (self.path / "fdinfo" / str(fd)).unlink()
        self.fds.remove(fd)

    def reopen_drm_fd(self, fd: int, fdinfo: str) -> None:
        """The process closes fd `fd` and opens a DRM device again, which gets the same number (the
        lowest free one): the fdinfo entry says what the fd now is."""
        (self.path / "fdinfo" / str(fd)).write_text(fdinfo)

    def add_drm_fd_without_fdinfo(self, minor: int = RENDER_MINOR) -> int:
        """A DRM fd closed between listing fd/ and reading fdinfo/ (vanished)."""
        fd = self._new_fd()
        self._link(fd, self.tree.device_node(DRM_MAJOR, minor))
        return fd

    def add_dangling_fd(self) -> int:
        """An fd closed between listing fd/ and following its link (vanished: ENOENT)."""
        fd = self._new_fd()
        self._link(fd, self.tree.base / "gone" / f"{self.pid}-{fd}")
        return fd

    def add_fd_behind_private_directory(self) -> int:
        """An fd whose link leads into a 0700 directory: following it gives a reader that is not root
        a real EACCES, as /proc does for a process the reader may not ptrace."""
        fd = self._new_fd()
        private = self.tree.base / "private"
        private.mkdir(mode=0o700, exist_ok=True)
        target = private / f"{self.pid}-{fd}"
        target.write_text("")
        self._link(fd, target)
        self._fdinfo(fd, "pos:\t0\nflags:\t0100002\nmnt_id:\t25\nino:\t4243\n")
        return fd

    def add_drm_fd_with_unreadable_fdinfo(self, minor: int = RENDER_MINOR) -> int:
        """A DRM fd whose fdinfo cannot be read (a directory: EISDIR)."""
        fd = self._new_fd()
        self._link(fd, self.tree.device_node(DRM_MAJOR, minor))
        (self.path / "fdinfo" / str(fd)).mkdir()
        return fd

    def make_cgroup_unreadable(self) -> None:
        """The cgroup file becomes a directory (EISDIR on read)."""
        cgroup = self.path / "cgroup"
        cgroup.unlink(missing_ok=True)
        cgroup.mkdir()

    def make_private(self) -> None:
        """Modes /proc gives another user's process (fd/ and fdinfo/ 0500, owned by root here): a reader
        that is not root gets a real EACCES. Root is not stopped by it."""
        (self.path / "fd").chmod(0o500)
        (self.path / "fdinfo").chmod(0o500)

    def set_cmdline(self, *argv: str) -> None:
        """/proc/PID/cmdline: the arguments, each ended by a NUL."""
        (self.path / "cmdline").write_bytes(b"".join(arg.encode() + b"\0" for arg in argv))

    def add_socket_fd(self, inode: int) -> int:
        """An fd on socket `inode`: its link reads `socket:[INODE]` (and stat() of it fails, as a
        dangling link, where /proc would give a socket: neither is a DRM device)."""
        fd = self._new_fd()
        os.symlink(f"socket:[{inode}]", self.path / "fd" / str(fd))
        self._fdinfo(fd, f"pos:\t0\nflags:\t02000002\nmnt_id:\t9\nino:\t{inode}\n")
        return fd

    def enter_network_namespace(self, namespace: FakeNetns) -> None:
        """The process's /proc/PID/net and ns/net are those of `namespace`."""
        for entry in (self.path / "net", self.path / "ns" / "net"):
            if entry.is_symlink():
                entry.unlink()
        (self.path / "ns").mkdir(exist_ok=True)
        os.symlink(namespace.directory, self.path / "net")
        os.symlink(f"net:[{namespace.inode}]", self.path / "ns" / "net")

    def remove_cgroup(self) -> None:
        """The process exited before its cgroup file was read (ENOENT)."""
        (self.path / "cgroup").unlink(missing_ok=True)


def _hex_words(packed: bytes) -> str:
    """An address as net/tcp prints it: each 32-bit word in the host's byte order, in hexadecimal."""
    return "".join(f"{int.from_bytes(packed[i:i + 4], sys.byteorder):08X}" for i in range(0, len(packed), 4))


class FakeNetns:
    """A network namespace's /proc/PID/net tables (tcp, tcp6, unix, fib_trie, if_inet6), written again at
    each change; its processes' `net` links here (`FakeProcess.enter_network_namespace`)."""

    def __init__(self, tree: FakeProcfs, inode: int, ipv4: tuple[str, ...] = (), ipv6: tuple[str, ...] = ()) -> None:
        self.tree = tree
        self.inode = inode
        self.directory = tree.base / "netns" / str(inode)
        self.directory.mkdir(parents=True)
        self.ipv4 = ipv4
        self.ipv6 = ipv6
        self.tcp: list[tuple[str, int, int, int]] = []  # (address, port, state, inode)
        self.unix: list[tuple[int, int, str | None]] = []  # (flags, inode, path)
        self.write()

    def add_tcp_listener(self, address: str, port: int) -> int:
        """A listening TCP socket (IPv4 or IPv6 by the address); returns its inode."""
        inode = self.tree.new_inode()
        self.tcp.append((address, port, 0x0A, inode))
        self.write()
        return inode

    def add_tcp_connection(self, address: str, port: int) -> int:
        """An established TCP connection's socket (state 01), on a local address and port."""
        inode = self.tree.new_inode()
        self.tcp.append((address, port, 0x01, inode))
        self.write()
        return inode

    def add_unix_listener(self, path: str | None) -> int:
        inode = self.tree.new_inode()
        self.unix.append((0x00010000, inode, path))
        self.write()
        return inode

    def add_unix_connection(self, path: str | None) -> int:
        inode = self.tree.new_inode()
        self.unix.append((0, inode, path))
        self.write()
        return inode

    def write(self) -> None:
        header = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout "
                  "inode\n")
        tables = {"tcp": header, "tcp6": header.replace("local_address", "local_address                        ")}
        counts = {"tcp": 0, "tcp6": 0}
        for address, port, state, inode in self.tcp:
            parsed = ipaddress.ip_address(address)
            table = "tcp6" if parsed.version == 6 else "tcp"
            zero = "0" * len(_hex_words(parsed.packed))
            tables[table] += (f"{counts[table]:4d}: {_hex_words(parsed.packed)}:{port:04X} {zero}:0000 {state:02X} "
                              f"00000000:00000000 00:00000000 00000000     0        0 {inode} 1 0000000000000000 "
                              f"100 0 0 10 0\n")
            counts[table] += 1
        unix = "Num       RefCount Protocol Flags    Type St Inode Path\n"
        for flags, inode, path in self.unix:
            unix += f"0000000000000000: 00000002 00000000 {flags:08X} 0001 01 {inode}" + (f" {path}" if path else "") + "\n"
        fib = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n"
        for address in ("127.0.0.1", *self.ipv4):
            fib += f"     |-- {address}\n        /32 host LOCAL\n"
        inet6 = "00000000000000000000000000000001 01 80 10 80       lo\n"
        inet6 += "".join(f"{ipaddress.IPv6Address(a).packed.hex()} 02 40 00 80     eth0\n" for a in self.ipv6)
        for name, text in {**tables, "unix": unix, "fib_trie": fib, "if_inet6": inet6}.items():
            (self.directory / name).write_text(text)


class FakeProcfs:
    """A fake /proc at `base/proc`. `root` is what to pass as the procfs path. Processes are in the host's
    network namespace (`host_net`) unless they enter another (`add_netns`)."""

    def __init__(self, base: Path) -> None:
        self.base = Path(base)
        self.root = self.base / "proc"
        self.root.mkdir(parents=True)
        (self.base / "dev").mkdir()
        (self.root / "meminfo").write_text("MemTotal:       16318412 kB\n")
        os.symlink("1", self.root / "self")
        self.processes: dict[int, FakeProcess] = {}
        self._inodes = 40000
        self.host_net = FakeNetns(self, 4026531840)
        self.netns: dict[int, FakeNetns] = {}

    def new_inode(self) -> int:
        self._inodes += 1
        return self._inodes

    def add_netns(self, inode: int, ipv4: tuple[str, ...] = (), ipv6: tuple[str, ...] = ()) -> FakeNetns:
        """Another network namespace (a container's or a pod's) with these addresses of its own."""
        self.netns[inode] = FakeNetns(self, inode, ipv4, ipv6)
        return self.netns[inode]

    def device_node(self, major: int, minor: int) -> Path:
        """A real character device node major:minor (created once)."""
        node = self.base / "dev" / f"char-{major}-{minor}"
        if not node.exists():
            os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(major, minor))
        return node

    def add_process(self, pid: int, cgroup: str | None = None, started_seconds_ago: float = 3600.0) -> FakeProcess:
        """A process directory with empty fd/ and fdinfo/, this cgroup file text (default: root cgroup),
        and a stat file saying it started `started_seconds_ago` (default: an hour: a settled process)."""
        process = FakeProcess(self, pid)
        (process.path / "fd").mkdir(parents=True)
        (process.path / "fdinfo").mkdir()
        (process.path / "cgroup").write_text(cgroup if cgroup is not None else v2_cgroup("/"))
        (process.path / "comm").write_text(f"process-{pid}\n")
        process.set_started(started_seconds_ago)
        process.set_cmdline(f"process-{pid}")
        process.enter_network_namespace(self.host_net)
        self.processes[pid] = process
        return process

    def add_unit_process(self, pid: int, unit_path: str, started_seconds_ago: float = 3600.0) -> FakeProcess:
        """A process in cgroup v2 path `unit_path`, e.g. `/system.slice/vllm-a.service`."""
        return self.add_process(pid, v2_cgroup(unit_path), started_seconds_ago)

    def remove_process(self, pid: int) -> None:
        """The process exits: its directory goes (and its pid may be used again by add_process).

        A kept-open /proc/PID/fdinfo/N fails to read once fd N is closed or the process has exited
        (it belongs to the process, not to the pid); a removed file here would read back as before. So
        its fdinfo files are emptied first: a reader that kept one open reads no DRM fd there."""
        directory = self.root / str(pid)
        for fdinfo in (directory / "fdinfo").iterdir():
            _empty(fdinfo)
        shutil.rmtree(directory)
        del self.processes[pid]

    def add_vanished_process(self, pid: int) -> None:
        """A pid directory whose fd/ is already gone: the process exited mid-scan (ENOENT)."""
        (self.root / str(pid)).mkdir()

    def add_unreadable_process(self, pid: int, cgroup: str | None = None) -> None:
        """A pid whose fd table cannot be read: `fd` is a regular file (ENOTDIR), as EACCES is to a non-root
        reader. Its cgroup file (world-readable in /proc) says `cgroup` (default: the root cgroup)."""
        path = self.root / str(pid)
        path.mkdir()
        (path / "fd").write_text("")
        (path / "cgroup").write_text(cgroup if cgroup is not None else v2_cgroup("/"))
        _write_stat(path, pid, 3600.0)  # world-readable in /proc, like the cgroup file


def _write_stat(path: Path, pid: int, seconds_ago: float) -> None:
    """/proc/PID/stat with the start time (field 22, clock ticks after boot) `seconds_ago`, at most the
    machine's uptime; the command name has a space and a `)` in it, as a hostile one may."""
    ticks = os.sysconf("SC_CLK_TCK")
    start = max(0, round((time.clock_gettime(time.CLOCK_BOOTTIME) - seconds_ago) * ticks))
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194304", *["0"] * 12, str(start), *["0"] * 32]
    (path / "stat").write_text(f"{pid} (vllm) x) {' '.join(fields)}\n")


def _empty(fdinfo: Path) -> None:
    if fdinfo.is_file():
        fdinfo.write_text("")


CHAT_UNIT, EMBEDDING_UNIT, STT_UNIT = "vllm-xpu-chat.service", "vllm-xpu-embedding.service", "vllm-xpu-stt.service"
CONTAINER_ID = "4f3c2a1b" * 8
CONTAINER_CGROUP = f"/system.slice/docker-{CONTAINER_ID}.scope"
CONTAINER_ADDRESS = "172.17.0.2"


def vllm_api_host(procfs: FakeProcfs, others: int = 300, vram: int = 1 << 30, chat_port: int = 8001) -> dict[str, str]:
    """A host running three vLLM units (API servers on IPv4, on IPv6 and on a Unix socket), a vLLM Docker
    container in a network namespace of its own, a GPU unit that is no vLLM, and `others` listeners of
    other programs, many on vLLM's ports. Each vLLM's engine core holds `vram` bytes of device memory
    through an xe DRM client and listens itself (torch.distributed's TCP store, a ZeroMQ socket), as
    engine cores do. The chat unit's API server listens on 127.0.0.1:`chat_port`. Returns cgroup path -> the endpoint address to be found (empty: none)."""
    host = procfs.host_net
    procfs.add_process(1, v2_cgroup("/init.scope")).set_cmdline("/sbin/init")
    expected = {}

    def engine(pid: int, cgroup: str, client_id: int) -> FakeProcess:
        process = procfs.add_unit_process(pid, cgroup)
        process.set_cmdline("VLLM::EngineCore")
        process.add_drm_fd(xe_fdinfo(client_id=client_id, vram0=vram, unit=""))
        process.add_socket_fd(process_net(process).add_tcp_listener("127.0.0.1", 29500 + pid))
        process.add_socket_fd(process_net(process).add_unix_listener(f"/tmp/zmq-{pid}.ipc"))
        process.add_other_fds(4)
        return process

    def process_net(process: FakeProcess) -> FakeNetns:
        inode = int(os.readlink(process.path / "ns" / "net")[5:-1])
        return host if inode == host.inode else procfs.netns[inode]

    chat = f"/system.slice/{CHAT_UNIT}"
    api = procfs.add_unit_process(100, chat)
    api.set_cmdline("/opt/vllm/bin/python3", "/opt/vllm/bin/vllm", "serve", "org/chat", "--host", "127.0.0.1",
                    "--port", str(chat_port), "--max-num-seqs", "3")
    api.add_socket_fd(host.add_tcp_listener("127.0.0.1", chat_port))
    api.add_socket_fd(host.add_tcp_connection("127.0.0.1", chat_port))  # a client's request
    api.add_other_fds(3)
    engine(101, chat, 101)
    expected[chat] = f"127.0.0.1:{chat_port}"

    embedding = f"/system.slice/{EMBEDDING_UNIT}"
    api = procfs.add_unit_process(200, embedding)
    api.set_cmdline("python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "org/embed", "--host", "::1",
                    "--port", "8002")
    api.add_socket_fd(host.add_tcp_listener("::1", 8002))
    engine(201, embedding, 201)
    expected[embedding] = "[::1]:8002"

    stt = f"/system.slice/{STT_UNIT}"
    api = procfs.add_unit_process(300, stt)
    api.set_cmdline("/usr/bin/vllm", "serve", "org/stt", "--uds", "/run/vllm/stt.sock")
    api.add_socket_fd(host.add_unix_listener("/run/vllm/stt.sock"))
    engine(301, stt, 301)
    expected[stt] = "/run/vllm/stt.sock"

    container_net = procfs.add_netns(4026532500, ipv4=(CONTAINER_ADDRESS,))
    api = procfs.add_unit_process(500, CONTAINER_CGROUP)
    api.enter_network_namespace(container_net)
    api.set_cmdline("python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "org/container")
    api.add_socket_fd(container_net.add_tcp_listener("0.0.0.0", 8000))
    container_engine = procfs.add_unit_process(501, CONTAINER_CGROUP)
    container_engine.enter_network_namespace(container_net)
    container_engine.set_cmdline("VLLM::EngineCore")
    container_engine.add_drm_fd(xe_fdinfo(client_id=501, vram0=vram, unit=""))
    expected[CONTAINER_CGROUP] = f"{CONTAINER_ADDRESS}:8000"
    # Docker's proxy publishing the container's port on the host
    proxy = procfs.add_unit_process(502, "/system.slice/docker.service")
    proxy.set_cmdline("/usr/bin/docker-proxy", "-proto", "tcp", "-host-ip", "0.0.0.0", "-host-port", "8000")
    proxy.add_socket_fd(host.add_tcp_listener("0.0.0.0", 8000))

    ollama = "/system.slice/ollama.service"
    other_gpu = procfs.add_unit_process(600, ollama)
    other_gpu.set_cmdline("/usr/bin/ollama", "serve")
    other_gpu.add_drm_fd(xe_fdinfo(client_id=600, vram0=vram, unit=""))
    other_gpu.add_socket_fd(host.add_tcp_listener("127.0.0.1", 11434))
    expected[ollama] = ""

    addresses = ("0.0.0.0", "127.0.0.1", "::", "::1", "10.0.0.7")
    for index in range(others):
        pid = 1000 + index // 3
        process = procfs.processes.get(pid) or procfs.add_unit_process(pid, f"/system.slice/other-{index // 3}.service")
        if index % 3 == 0:
            process.set_cmdline("/usr/bin/python3", "-m", "http.server", str(8000 + index % 4))
        if index % 5 == 4:
            process.add_socket_fd(host.add_unix_listener(f"/run/other-{index}.sock"))
        else:
            process.add_socket_fd(host.add_tcp_listener(addresses[index % len(addresses)], 8000 + index % 4))
    return expected
