"""A fake sysfs with GPUs that the real libudev accepts, and private namespaces to run code over it.

Three parts, each usable alone:

- `FakeSysfs` writes a /sys tree the way the kernel lays it out for PCI GPUs: the PCI function with its
  `uevent`, `subsystem` and `driver` links, its DRM minors `drm/cardN` and `drm/renderDN`, connectors
  (`cardN-DP-1`, which consumers must ignore), and the `/sys/class/drm`, `/sys/bus/pci/devices` and
  `/sys/dev/char` links. GPUs can be added and removed while a process is looking at the tree.
- `SysfsNamespace` runs a long-lived command in a private mount and network namespace (`unshare -m -n`,
  as root) where the fake tree is bind-mounted over /sys, /run/udev is a private tmpfs (with the
  `control` file libudev looks for), and `lo` is up so an HTTP server started there can be scraped
  from another process in the namespace (`SysfsNamespace.run`, which uses `nsenter -t PID -m -n`).
  Nothing in it is visible outside: the mounts are private and netlink multicast stays in its netns.
- `send_udev_event` / `send_kernel_uevent` put a uevent on the NETLINK_KOBJECT_UEVENT bus of the
  caller's network namespace: the first in libudev's monitor format on the "udev" group, exactly as
  systemd-udevd sends it; the second through the kernel's uevent injection (Linux 4.18 and later), so it
  reaches the "kernel" group from port 0 as a real kernel uevent does. They must run inside the
  namespace: `SysfsNamespace.send_uevent` does that, via this file's command line
  (`python tests/fakesysfs.py send-uevent --kind udev|kernel '<json>'`).

The module uses the standard library only, so it can also run as a script inside the namespace.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

DRM_MAJOR = 226
RENDER_MINOR_BASE = 128
PCI_CLASS_VGA = 0x030000
PCI_CLASS_DISPLAY_OTHER = 0x038000
PCI_CLASS_PCI_BRIDGE = 0x060400

NETLINK_KOBJECT_UEVENT = 15
UEVENT_GROUP_KERNEL = 1
UEVENT_GROUP_UDEV = 2
UDEV_MONITOR_MAGIC = 0xFEEDCAFE
# struct monitor_netlink_header in systemd's src/libsystemd/sd-device/device-monitor.c:
# char prefix[8]; then 8 unsigned ints: magic, header_size, properties_off, properties_len,
# filter_subsystem_hash, filter_devtype_hash, filter_tag_bloom_hi, filter_tag_bloom_lo.
# magic and the filter fields are big endian (the kernel's BPF filter reads them), the rest native.
UDEV_HEADER_SIZE = 40
NLMSG_HEADER = struct.Struct("=IHHII")
NLMSG_MIN_TYPE = 0x10
NLMSG_ERROR = 0x2
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4

UeventKind = Literal["udev", "kernel"]


@dataclass(frozen=True)
class FakeGpu:
    """One PCI GPU as the kernel shows it in sysfs. `card`/`render` are DRM minors; None: no such node."""

    pci_address: str
    card: int | None = 1
    render: int | None = RENDER_MINOR_BASE
    driver: str = "i915"
    pci_class: int = PCI_CLASS_VGA
    vendor_id: int = 0x8086
    device_id: int = 0x56A0
    connectors: tuple[str, ...] = ("DP-1",)
    # PCI bridges between the host bridge and the GPU, outermost first (a root port and a switch, say).
    bridges: tuple[str, ...] = ("0000:00:01.0",)

    @property
    def host_bridge(self) -> str:
        domain, bus, _ = (self.bridges[0] if self.bridges else self.pci_address).split(":")
        return f"pci{domain}:{bus}"

    @property
    def devpath(self) -> str:
        """The kernel's DEVPATH of the PCI function: /sys without the /sys prefix."""
        return "/".join(["/devices", self.host_bridge, *self.bridges, self.pci_address])

    @property
    def card_name(self) -> str:
        return f"card{self.card}" if self.card is not None else ""

    @property
    def render_name(self) -> str:
        return f"renderD{self.render}" if self.render is not None else ""

    def minors(self) -> list[tuple[str, int]]:
        """(name, minor) of the DRM minors this GPU has, card first."""
        named = [(self.card_name, self.card), (self.render_name, self.render)]
        return [(name, minor) for name, minor in named if minor is not None]

    def connector_names(self) -> list[str]:
        return [f"{self.card_name}-{connector}" for connector in self.connectors] if self.card is not None else []

    def drm_devpath(self, name: str) -> str:
        """DEVPATH of a DRM minor or connector of this GPU."""
        if name in self.connector_names():
            return f"{self.devpath}/drm/{self.card_name}/{name}"
        return f"{self.devpath}/drm/{name}"


@dataclass(frozen=True)
class Uevent:
    """A uevent as the kernel announces it: ACTION, DEVPATH and SUBSYSTEM plus the device's properties."""

    action: str
    devpath: str
    subsystem: str
    properties: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"action": self.action, "devpath": self.devpath, "subsystem": self.subsystem,
                           "properties": dict(self.properties)})

    @classmethod
    def from_json(cls, text: str) -> Uevent:
        data = json.loads(text)
        return cls(data["action"], data["devpath"], data["subsystem"], data.get("properties", {}))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _symlink(link: Path, target: Path) -> None:
    """A relative symlink, as sysfs has them, so the tree resolves wherever it is mounted."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


def _uevent_text(properties: Mapping[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in properties.items())


class FakeSysfs:
    """A sysfs tree under `root` (the directory that becomes /sys). Holds no state but the path."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def create(cls, root: Path, gpus: Iterable[FakeGpu] = ()) -> FakeSysfs:
        sysfs = cls(root)
        for directory in ("devices/system", "devices/virtual", "bus/pci/devices", "bus/pci/drivers",
                          "class/drm", "dev/char", "dev/block"):
            (root / directory).mkdir(parents=True, exist_ok=True)
        _write(root / "class/drm/version", "drm 1.1.0 20060810\n")
        for gpu in gpus:
            sysfs.add_gpu(gpu)
        return sysfs

    def path(self, devpath: str) -> Path:
        return self.root / devpath.lstrip("/")

    def _add_pci_function(self, devpath: str, address: str, driver: str | None, pci_class: int,
                          vendor_id: int, device_id: int) -> None:
        directory = self.path(devpath)
        directory.mkdir(parents=True, exist_ok=True)
        properties = self.pci_properties(address, driver, pci_class, vendor_id, device_id)
        _write(directory / "uevent", _uevent_text(properties))
        _write(directory / "class", f"0x{pci_class:06x}\n")
        _write(directory / "vendor", f"0x{vendor_id:04x}\n")
        _write(directory / "device", f"0x{device_id:04x}\n")
        _symlink(directory / "subsystem", self.root / "bus/pci")
        if driver:
            (self.root / "bus/pci/drivers" / driver).mkdir(parents=True, exist_ok=True)
            _symlink(directory / "driver", self.root / "bus/pci/drivers" / driver)
            _symlink(self.root / "bus/pci/drivers" / driver / address, directory)
        _symlink(self.root / "bus/pci/devices" / address, directory)

    def _ensure_bridges(self, gpu: FakeGpu) -> None:
        devpath = f"/devices/{gpu.host_bridge}"
        if not (self.path(devpath) / "uevent").exists():
            _write(self.path(devpath) / "uevent", "")
        for bridge in gpu.bridges:
            devpath = f"{devpath}/{bridge}"
            if not (self.path(devpath) / "uevent").exists():
                self._add_pci_function(devpath, bridge, "pcieport", PCI_CLASS_PCI_BRIDGE, 0x8086, 0x7AB8)

    @staticmethod
    def pci_properties(address: str, driver: str | None, pci_class: int, vendor_id: int,
                       device_id: int) -> dict[str, str]:
        """The PCI function's uevent properties, as the kernel's pci_uevent() writes them."""
        properties = {"DRIVER": driver} if driver else {}
        properties |= {
            "PCI_CLASS": f"{pci_class:X}",
            "PCI_ID": f"{vendor_id:04X}:{device_id:04X}",
            "PCI_SUBSYS_ID": f"{vendor_id:04X}:1020",
            "PCI_SLOT_NAME": address,
            "MODALIAS": f"pci:v{vendor_id:08X}d{device_id:08X}sv{vendor_id:08X}sd00001020"
                        f"bc{pci_class >> 16:02X}sc{(pci_class >> 8) & 0xFF:02X}i{pci_class & 0xFF:02X}",
        }
        return properties

    @classmethod
    def gpu_pci_properties(cls, gpu: FakeGpu, *, bound: bool = True) -> dict[str, str]:
        """`gpu`'s PCI uevent properties, with its driver (bound) or without."""
        return cls.pci_properties(gpu.pci_address, gpu.driver if bound else None, gpu.pci_class,
                                  gpu.vendor_id, gpu.device_id)

    @staticmethod
    def drm_properties(gpu: FakeGpu, name: str) -> dict[str, str]:
        """The uevent properties of one DRM minor or connector of `gpu`."""
        for minor_name, minor in gpu.minors():
            if name == minor_name:
                return {"MAJOR": str(DRM_MAJOR), "MINOR": str(minor), "DEVNAME": f"dri/{name}",
                        "DEVTYPE": "drm_minor"}
        if name in gpu.connector_names():
            return {"DEVTYPE": "drm_connector"}
        raise ValueError(f"{gpu.pci_address} has no DRM device {name}")

    def add_gpu(self, gpu: FakeGpu) -> None:
        """Write `gpu` into the tree (the PCI function, its DRM minors and connectors, their links)."""
        self._ensure_bridges(gpu)
        self._add_pci_function(gpu.devpath, gpu.pci_address, gpu.driver, gpu.pci_class, gpu.vendor_id,
                               gpu.device_id)
        for name, minor in gpu.minors():
            directory = self.path(gpu.drm_devpath(name))
            _write(directory / "uevent", _uevent_text(self.drm_properties(gpu, name)))
            _write(directory / "dev", f"{DRM_MAJOR}:{minor}\n")
            _symlink(directory / "subsystem", self.root / "class/drm")
            _symlink(directory / "device", self.path(gpu.devpath))
            _symlink(self.root / "class/drm" / name, directory)
            _symlink(self.root / "dev/char" / f"{DRM_MAJOR}:{minor}", directory)
        for name in gpu.connector_names():
            directory = self.path(gpu.drm_devpath(name))
            _write(directory / "uevent", _uevent_text(self.drm_properties(gpu, name)))
            _write(directory / "status", "connected\n")
            _symlink(directory / "subsystem", self.root / "class/drm")
            _symlink(self.root / "class/drm" / name, directory)

    def remove_gpu(self, gpu: FakeGpu) -> None:
        """Take `gpu` out of the tree, as a hot-unplug does (its bridges stay)."""
        for name, minor in gpu.minors():
            (self.root / "class/drm" / name).unlink(missing_ok=True)
            (self.root / "dev/char" / f"{DRM_MAJOR}:{minor}").unlink(missing_ok=True)
        for name in gpu.connector_names():
            (self.root / "class/drm" / name).unlink(missing_ok=True)
        (self.root / "bus/pci/devices" / gpu.pci_address).unlink(missing_ok=True)
        (self.root / "bus/pci/drivers" / gpu.driver / gpu.pci_address).unlink(missing_ok=True)
        shutil.rmtree(self.path(gpu.devpath), ignore_errors=True)

    def add_uevents(self, gpu: FakeGpu) -> list[Uevent]:
        """The uevents the kernel sends when `gpu` appears and its driver binds, in the kernel's order."""
        events = [Uevent("add", gpu.devpath, "pci", self.gpu_pci_properties(gpu, bound=False))]
        events += [Uevent("add", gpu.drm_devpath(name), "drm", self.drm_properties(gpu, name))
                   for name in [*(name for name, _ in gpu.minors()), *gpu.connector_names()]]
        events.append(Uevent("bind", gpu.devpath, "pci", self.gpu_pci_properties(gpu)))
        return events

    def remove_uevents(self, gpu: FakeGpu) -> list[Uevent]:
        """The uevents the kernel sends when `gpu` is unplugged: DRM devices go first, then the driver."""
        events = [Uevent("remove", gpu.drm_devpath(name), "drm", self.drm_properties(gpu, name))
                  for name in [*gpu.connector_names(), *reversed([name for name, _ in gpu.minors()])]]
        events += [Uevent("unbind", gpu.devpath, "pci", self.gpu_pci_properties(gpu)),
                   Uevent("remove", gpu.devpath, "pci", self.gpu_pci_properties(gpu, bound=False))]
        return events


# --- netlink senders (run them inside a private network namespace) --------------------------------


def murmurhash2(data: bytes, seed: int = 0) -> int:
    """MurmurHash2 (32 bit) as systemd's src/basic/MurmurHash2.c computes it on a little-endian host."""
    m = 0x5BD1E995
    mask = 0xFFFFFFFF
    length = len(data)
    h = (seed ^ length) & mask
    full = length - length % 4
    for offset in range(0, full, 4):
        k = int.from_bytes(data[offset:offset + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = (h * m) & mask
        h ^= k
    tail = data[full:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if len(tail) >= 1:
        h ^= tail[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h


def tag_bloom64(tag: str) -> int:
    """The 64-bit bloom bits of one udev tag (string_bloom64 in device-monitor.c)."""
    hashed = murmurhash2(tag.encode())
    bits = 0
    for shift in (0, 6, 12, 18):
        bits |= 1 << ((hashed >> shift) & 63)
    return bits


def _properties_nulstr(properties: Mapping[str, str]) -> bytes:
    return b"".join(f"{key}={value}".encode() + b"\0" for key, value in properties.items())


def udev_message(properties: Mapping[str, str]) -> bytes:
    """A udev monitor message: libudev's header, then the NUL-separated properties."""
    payload = _properties_nulstr(properties)
    tags: set[str] = set()
    for key in ("TAGS", "CURRENT_TAGS"):
        tags.update(tag for tag in properties.get(key, "").split(":") if tag)
    bloom = 0
    for tag in tags:
        bloom |= tag_bloom64(tag)
    devtype = properties.get("DEVTYPE")
    header = b"libudev\0" + struct.pack(">I", UDEV_MONITOR_MAGIC) + struct.pack(
        "=III", UDEV_HEADER_SIZE, UDEV_HEADER_SIZE, len(payload)
    ) + struct.pack(
        ">IIII",
        murmurhash2(properties["SUBSYSTEM"].encode()),
        murmurhash2(devtype.encode()) if devtype else 0,
        bloom >> 32,
        bloom & 0xFFFFFFFF,
    )
    assert len(header) == UDEV_HEADER_SIZE
    return header + payload


def udev_properties(event: Uevent, seqnum: int) -> dict[str, str]:
    """The properties systemd-udevd broadcasts for `event`: the kernel's, plus what its rules add."""
    properties = {"ACTION": event.action, "DEVPATH": event.devpath, "SUBSYSTEM": event.subsystem}
    properties |= dict(event.properties)
    if "DEVNAME" in properties and not properties["DEVNAME"].startswith("/"):
        properties["DEVNAME"] = f"/dev/{properties['DEVNAME']}"
    properties["SEQNUM"] = str(seqnum)
    properties.setdefault("USEC_INITIALIZED", str(time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000))
    if event.subsystem == "drm" and properties.get("DEVTYPE") == "drm_minor":
        properties.setdefault("TAGS", ":seat:uaccess:")
        properties.setdefault("CURRENT_TAGS", ":seat:uaccess:")
    return properties


def send_fake_uevent(action: str, devpath: str, subsystem: str, properties: Mapping[str, str],
                     seqnum: int | None = None) -> None:
    """Broadcast a udev monitor message to the "udev" netlink group, as systemd-udevd does.

    Run it as root inside a private network namespace: the message reaches every libudev monitor
    of the caller's network namespace, and no other.
    """
    event = Uevent(action, devpath, subsystem, properties)
    number = seqnum if seqnum is not None else time.monotonic_ns() // 1000
    message = udev_message(udev_properties(event, number))
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_KOBJECT_UEVENT) as sock:
        sock.bind((0, 0))
        try:
            sock.sendto(message, (0, UEVENT_GROUP_UDEV))
        except ConnectionRefusedError:
            pass  # a multicast send can report ECONNREFUSED; udevd ignores it too


def send_kernel_uevent(action: str, devpath: str, subsystem: str, properties: Mapping[str, str]) -> None:
    """Have the kernel broadcast a uevent to the "kernel" group of the caller's network namespace.

    Uses uevent injection (lib/kobject_uevent.c, uevent_net_rcv): the kernel appends a SEQNUM and sends
    the message from port 0, so a libudev "kernel" monitor takes it for a real one. Needs CAP_SYS_ADMIN
    over the network namespace; run it inside a private one.
    """
    payload = f"{action}@{devpath}".encode() + b"\0" + _properties_nulstr(
        {"ACTION": action, "DEVPATH": devpath, "SUBSYSTEM": subsystem, **properties}
    )
    message = NLMSG_HEADER.pack(NLMSG_HEADER.size + len(payload), NLMSG_MIN_TYPE,
                                NLM_F_REQUEST | NLM_F_ACK, 1, 0) + payload
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_KOBJECT_UEVENT) as sock:
        sock.bind((0, 0))
        sock.settimeout(5)
        sock.sendto(message, (0, 0))
        reply = sock.recv(65536)
    length, kind, _, _, _ = NLMSG_HEADER.unpack_from(reply)
    if kind == NLMSG_ERROR:
        (error,) = struct.unpack_from("=i", reply, NLMSG_HEADER.size)
        if error:
            raise OSError(-error, f"uevent injection refused: {os.strerror(-error)}")


def send_uevent(event: Uevent, kind: UeventKind = "udev", seqnum: int | None = None) -> None:
    if kind == "udev":
        send_fake_uevent(event.action, event.devpath, event.subsystem, event.properties, seqnum)
    else:
        send_kernel_uevent(event.action, event.devpath, event.subsystem, event.properties)


# --- namespaces ------------------------------------------------------------------------------------

# Runs as `bash -c SETUP bash FAKE_SYS SCRATCH UDEV_CONTROL DEVTMPFS HIDE_LIBUDEV READY_FD COMMAND...` inside
# `unshare --mount --net` (whose default mount propagation is private, so no mount leaks out).
_SETUP_SCRIPT = r"""
set -eu
fake_sys=$1 scratch=$2 udev_control=$3 devtmpfs=$4 hide_libudev=$5 ready_fd=$6
shift 6
ip link set lo up
if [ -n "$fake_sys" ]; then
    mount --bind "$fake_sys" /sys
else
    mount -t tmpfs -o mode=0755 emptysys /sys
fi
if [ ! -d /run/udev ]; then
    # /run is not ours to write on the host: give this namespace a copy-on-write view of it.
    mount -t tmpfs -o mode=0700 nsrun "$scratch"
    mkdir "$scratch/upper" "$scratch/work"
    mount -t overlay overlay -o "lowerdir=/run,upperdir=$scratch/upper,workdir=$scratch/work" /run
    mkdir /run/udev
fi
mount -t tmpfs -o mode=0755 udev /run/udev
mkdir /run/udev/data
if [ "$udev_control" = 1 ]; then
    : > /run/udev/control
fi
if [ "$devtmpfs" = 0 ]; then
    # A /dev like a container's: a plain tmpfs with the few nodes programs expect.
    mount -t tmpfs -o mode=0755 dev /dev
    mknod -m 666 /dev/null c 1 3
    mknod -m 666 /dev/zero c 1 5
    mknod -m 666 /dev/urandom c 1 9
fi
if [ "$hide_libudev" = 1 ]; then
    for library in $(ldconfig -p | sed -n 's/^[[:space:]]*libudev\.so.* => //p'); do
        mount --bind /dev/null "$(readlink -f "$library")"
    done
fi
export SYSTEMD_DEVICE_VERIFY_SYSFS="${SYSTEMD_DEVICE_VERIFY_SYSFS:-0}"
echo ready >&"$ready_fd"
eval "exec $ready_fd>&-"
exec "$@"
"""


class SysfsNamespace:
    """A long-running command in a private mount + network namespace over a fake sysfs.

    In the namespace: /sys is `sysfs.root` (an empty tmpfs when `sysfs` is None), /run/udev is a private
    tmpfs with a `data/` directory and, when `udev_control`, a `control` file (what makes libudev enable
    its "udev" monitor where /dev is not devtmpfs), /dev is the host's devtmpfs or, with
    `devtmpfs=False`, a plain tmpfs as in a container, `lo` is up, and with `hide_libudev` every
    libudev.so is /dev/null. The host's /sys, /run, /dev and network are untouched.

    libudev refuses device paths that are not on sysfs unless SYSTEMD_DEVICE_VERIFY_SYSFS=0 (systemd's
    own tests use it the same way), so the command and everything `run`/`popen` start get that variable
    unless their `env` sets it.

        with SysfsNamespace(FakeSysfs.create(tmp / "sys", gpus), ["vllm-xpu-exporter", ...]) as ns:
            ns.run(["curl", "-s", "http://127.0.0.1:9999/metrics"])   # inside the same namespaces
            ns.hotplug_add(gpu)                                        # tree + uevents
            print(ns.output())                                         # the command's stdout+stderr

    Needs root, unshare, nsenter, mount and ip (util-linux, iproute2).
    """

    def __init__(self, sysfs: FakeSysfs | None, command: Sequence[str] | None = None, *,
                 udev_control: bool = True, devtmpfs: bool = True, hide_libudev: bool = False,
                 env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
                 ready_timeout: float = 10.0) -> None:
        self.sysfs = sysfs
        self.command = list(command) if command else ["sleep", "infinity"]
        self.udev_control = udev_control
        self.devtmpfs = devtmpfs
        self.hide_libudev = hide_libudev
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.ready_timeout = ready_timeout
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._children: list[subprocess.Popen[Any]] = []
        self._seqnums = itertools.count(time.monotonic_ns() // 1000)

    @property
    def process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise RuntimeError("the namespace is not running")
        return self._process

    @property
    def pid(self) -> int:
        """The PID of the command, whose namespaces `run` enters."""
        return self.process.pid

    @property
    def log_path(self) -> Path:
        if self._workdir is None:
            raise RuntimeError("the namespace is not running")
        return Path(self._workdir.name) / "command.log"

    def output(self) -> str:
        """What the command has written so far (stdout and stderr together)."""
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> SysfsNamespace:
        self._workdir = tempfile.TemporaryDirectory(prefix="fakesysfs-ns-")
        scratch = Path(self._workdir.name) / "scratch"
        scratch.mkdir()
        ready_read, ready_write = os.pipe()
        argv = ["unshare", "--mount", "--net", "--", "bash", "-c", _SETUP_SCRIPT, "bash",
                str(self.sysfs.root) if self.sysfs else "", str(scratch),
                "1" if self.udev_control else "0", "1" if self.devtmpfs else "0",
                "1" if self.hide_libudev else "0",
                str(ready_write), *self.command]
        try:
            with open(self.log_path, "wb") as log:
                self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                                 stderr=subprocess.STDOUT, pass_fds=(ready_write,),
                                                 env=self.env, cwd=self.cwd, start_new_session=True)
        finally:
            os.close(ready_write)
        try:
            self._wait_ready(ready_read)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        finally:
            os.close(ready_read)
        return self

    def _wait_ready(self, ready_read: int) -> None:
        readable, _, _ = select.select([ready_read], [], [], self.ready_timeout)
        if not readable or os.read(ready_read, 16) != b"ready\n":
            self.process.poll()
            raise RuntimeError(f"namespace setup failed (exit {self.process.returncode}): {self.output().strip()}")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for child in [*self._children, *([self._process] if self._process else [])]:
            _stop(child)
        self._children.clear()
        self._process = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def _nsenter(self, argv: Sequence[str]) -> list[str]:
        return ["nsenter", "-t", str(self.pid), "-m", "-n", "--", *argv]

    @staticmethod
    def _inner_env(env: Mapping[str, str] | None) -> dict[str, str]:
        return {"SYSTEMD_DEVICE_VERIFY_SYSFS": "0", **(env if env is not None else os.environ)}

    def run(self, argv: Sequence[str], *, timeout: float = 30.0, check: bool = False,
            input: str | None = None, env: Mapping[str, str] | None = None,
            cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run `argv` to completion inside the namespaces; its output is captured as text."""
        return subprocess.run(self._nsenter(argv), capture_output=True, text=True, timeout=timeout,
                              check=check, input=input, env=self._inner_env(env), cwd=cwd)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv` inside the namespaces; it is stopped when the namespace is left."""
        kwargs["env"] = self._inner_env(kwargs.get("env"))
        child = subprocess.Popen(self._nsenter(argv), **kwargs)
        self._children.append(child)
        return child

    def send_uevent(self, event: Uevent, kind: UeventKind = "udev", seqnum: int | None = None) -> None:
        """Broadcast `event` on the namespace's uevent netlink bus, as udevd (`udev`) or the kernel would."""
        argv = [sys.executable, str(Path(__file__).resolve()), "send-uevent", "--kind", kind]
        if kind == "udev":
            argv += ["--seqnum", str(seqnum if seqnum is not None else next(self._seqnums))]
        self.run([*argv, event.to_json()], check=True, timeout=10)

    def hotplug_add(self, gpu: FakeGpu, kind: UeventKind = "udev") -> None:
        """Add `gpu` to the fake tree, then announce it with the uevents the kernel would send."""
        if self.sysfs is None:
            raise RuntimeError("this namespace has no fake sysfs")
        self.sysfs.add_gpu(gpu)
        for event in self.sysfs.add_uevents(gpu):
            self.send_uevent(event, kind)

    def hotplug_remove(self, gpu: FakeGpu, kind: UeventKind = "udev") -> None:
        """Remove `gpu` from the fake tree, then send the uevents of its unplug."""
        if self.sysfs is None:
            raise RuntimeError("this namespace has no fake sysfs")
        self.sysfs.remove_gpu(gpu)
        for event in self.sysfs.remove_uevents(gpu):
            self.send_uevent(event, kind)

    def wait_for_output(self, predicate: Callable[[str], bool], timeout: float = 10.0) -> str:
        """Wait until a line of the command's output satisfies `predicate`; return that line."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.output().splitlines():
                if predicate(line):
                    return line
            if self.process.poll() is not None:
                raise RuntimeError(f"command exited with {self.process.returncode}: {self.output()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no matching output line within {timeout}s; output so far:\n{self.output()}")
            time.sleep(0.05)


def _stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    send = commands.add_parser("send-uevent", help="broadcast a uevent in this network namespace")
    send.add_argument("--kind", choices=("udev", "kernel"), default="udev")
    send.add_argument("--seqnum", type=int)
    send.add_argument("event", help='JSON: {"action", "devpath", "subsystem", "properties"}')
    args = parser.parse_args(argv)
    send_uevent(Uevent.from_json(args.event), args.kind, args.seqnum)


if __name__ == "__main__":
    main()
