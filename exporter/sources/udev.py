"""udev source: which DRM nodes (card, render node) belong to which PCI GPU, and when that changes.

Reads sysfs through the real libudev (via pyudev). Usable alone:

    >>> from vllm_xpu_exporter.sources.udev import drm_nodes_by_pci
    >>> drm_nodes_by_pci()
    {'0000:03:00.0': DrmNodes(card='card1', render_node='renderD128')}
"""

from __future__ import annotations

import errno
import logging
import os
import re
import select
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import pyudev

from vllm_xpu_exporter.pci import is_sysfs_pci_address

logger = logging.getLogger("vllm_xpu_exporter.udev")

DRM_CLASS_DIR = "/sys/class/drm"
# libudev (systemd 252) has /sys compiled in; these must exist for it to find any device.
REQUIRED_SYSFS_DIRS = ("/sys/devices", "/sys/class")
PCI_BASE_CLASS_DISPLAY = 0x03
UeventSource = Literal["kernel", "udev"]
DEFAULT_SOURCES: tuple[UeventSource, ...] = ("kernel", "udev")

_DRM_MINOR_NAME = re.compile(r"(card|renderD)[0-9]+")
_RECENT_SEQNUMS = 256


class UdevUnavailable(Exception):
    """libudev or sysfs cannot be used here; `str(error)` is a one-line reason."""


@dataclass(frozen=True)
class DrmNodes:
    """A GPU's DRM minors by name ("card1", "renderD128"); "" when it has none."""

    card: str = ""
    render_node: str = ""


def is_drm_minor_name(name: str) -> bool:
    """True for cardN and renderDN; False for connectors (card1-DP-1), "version" and the like."""
    return _DRM_MINOR_NAME.fullmatch(name) is not None


def pci_address_from_devpath(devpath: str) -> str | None:
    """The PCI address of the nearest PCI device in a sysfs path, lower case, or None.

    Works for devices that are gone (a "remove" uevent's DEVPATH), unlike walking sysfs parents.
    """
    for component in reversed(devpath.split("/")):
        if is_sysfs_pci_address(component):
            return component.lower()
    return None


def _require_sysfs() -> None:
    for directory in REQUIRED_SYSFS_DIRS:
        if not os.path.isdir(directory):
            raise UdevUnavailable(f"sysfs is not mounted at /sys ({directory} does not exist)")


def _drm_minor_names_in_sysfs() -> set[str]:
    try:
        names = os.listdir(DRM_CLASS_DIR)
    except FileNotFoundError:
        return set()  # no DRM driver loaded: no GPU, which is not an error
    except OSError as error:
        raise UdevUnavailable(f"cannot list {DRM_CLASS_DIR}: {error.strerror}") from error
    return {name for name in names if is_drm_minor_name(name)}


def drm_nodes_by_pci(context: pyudev.Context | None = None) -> dict[str, DrmNodes]:
    """Map each PCI GPU address (lower case, "0000:03:00.0") to its DRM card and render node names.

    Enumerates libudev's "drm" subsystem; connectors and DRM devices without a PCI parent are left out.
    A GPU with a card but no render node (or the reverse) gets "" for the missing one.
    Raises UdevUnavailable (never anything else from libudev or sysfs) when libudev cannot be loaded,
    /sys is not usable, or libudev refuses the DRM devices /sys lists (it only accepts a real sysfs).
    """
    try:
        _require_sysfs()
        udev_context = context if context is not None else pyudev.Context()
        minors = [device for device in udev_context.list_devices(subsystem="drm")
                  if is_drm_minor_name(device.sys_name)]
        # Lowest minor first, so that when two cards share a PCI function the first one is kept.
        minors.sort(key=lambda device: (device.device_number, device.sys_name))
        nodes: dict[str, dict[str, str]] = {}
        for device in minors:
            parent = device.find_parent("pci")
            if parent is None:
                logger.debug("DRM device %s has no PCI parent, leaving it out", device.sys_name)
                continue
            address = (parent.properties.get("PCI_SLOT_NAME") or parent.sys_name).lower()
            kind = "card" if device.sys_name.startswith("card") else "render_node"
            nodes.setdefault(address, {}).setdefault(kind, device.sys_name)
        if not minors and (listed := _drm_minor_names_in_sysfs()):
            raise UdevUnavailable(
                f"libudev found no DRM devices although {DRM_CLASS_DIR} lists {', '.join(sorted(listed))} "
                "(libudev only accepts a real sysfs at /sys)"
            )
    except UdevUnavailable:
        raise
    except ImportError as error:  # pyudev's "No library named udev"
        raise UdevUnavailable(f"libudev cannot be loaded: {error}") from error
    except (OSError, ValueError, MemoryError) as error:
        # pyudev turns libudev's errno into OSError (ValueError for EINVAL, MemoryError for ENOMEM);
        # a libudev.so that fails to load is an OSError from ctypes.
        reason = " ".join(str(error).split())
        raise UdevUnavailable(f"libudev cannot read the DRM devices: {reason}") from error
    return {address: DrmNodes(**names) for address, names in sorted(nodes.items())}


def _is_display_class(pci_class: str | None) -> bool:
    try:
        return pci_class is not None and int(pci_class, 16) >> 16 == PCI_BASE_CLASS_DISPLAY
    except ValueError:
        return False


def gpu_change_of(device: pyudev.Device) -> tuple[str, str | None] | None:
    """(action, PCI address) when a uevent concerns a GPU's DRM nodes or driver binding, else None.

    Counted: DRM minors (cardN, renderDN) of any action, and PCI functions of the display class
    (PCI_CLASS 0x03xxxx) of any action (add, remove, bind, unbind, change). The address is None for a
    DRM minor with no PCI device in its path.
    """
    action = device.action or "change"
    if device.subsystem == "drm":
        if not is_drm_minor_name(device.sys_name):
            return None
        return action, pci_address_from_devpath(device.device_path)
    if device.subsystem == "pci" and _is_display_class(device.properties.get("PCI_CLASS")):
        return action, (device.properties.get("PCI_SLOT_NAME") or device.sys_name).lower()
    return None


@dataclass
class _Feed:
    source: UeventSource
    monitor: pyudev.Monitor
    # A second handle on the monitor's socket, to read the socket's state without going through libudev.
    sock: socket.socket


def _open_feed(context: pyudev.Context, source: UeventSource) -> _Feed | str:
    """A started monitor of `source` filtered to drm and pci, or why there cannot be one."""
    try:
        monitor = pyudev.Monitor.from_netlink(context, source=source)
        monitor.filter_by("drm")
        monitor.filter_by("pci")
        monitor.start()
        sock = socket.socket(fileno=os.dup(monitor.fileno()))
    except (OSError, ValueError, MemoryError) as error:
        return f"{source} uevents: {error}"
    _, groups = sock.getsockname()
    if groups == 0:
        sock.close()
        return ("udev uevents: libudev disabled its monitor because udevd does not seem to run "
                "(no /run/udev/control and /dev is not devtmpfs)")
    return _Feed(source, monitor, sock)


class DrmWatcher:
    """Calls `on_change(action, pci_address)` when a GPU's DRM nodes or driver binding change.

    Lets the exporter notice a hot-plugged, removed or re-bound GPU without a restart. `action` is the
    uevent's ("add", "remove", "change", "bind", "unbind"), or "resync" (address None) when the socket
    overflowed and events were lost. The callback runs on the watcher's daemon thread; an exception in
    it is logged and the watching goes on.

    What the kernel sends (drivers/base/dd.c, drivers/gpu/drm/drm_drv.c): unbinding a GPU's driver
    (`echo 0000:03:00.0 > /sys/bus/pci/drivers/i915/unbind`) sends "remove" for its DRM connectors,
    render node and card, then "unbind" for the PCI function; binding sends "add" for the card, render
    node and connectors while the driver probes, then "bind" for the PCI function; a hot-plug adds a
    PCI "add" first and a hot-unplug a PCI "remove" last. So both the drm subsystem (cardN, renderDN;
    connectors are ignored) and the pci subsystem (display-class functions only) are watched: the pci
    events also cover a driver that binds without creating DRM nodes.

    Sources, both watched by default, an event seen from both (same SEQNUM) reported once:
    - "kernel": the kernel's own uevents. Linux 4.18+ sends them into every network namespace owned
      by the initial user namespace, so they also reach a (rootful) container with its own network.
    - "udev": udevd's re-broadcast after its rules ran. Netlink multicast from a process stays in that
      process's network namespace, so only processes in udevd's (the host's) network namespace hear it.
      And libudev (systemd 252, sd-device/device-monitor.c, device_monitor_new_full) gives a udev
      monitor no multicast group at all, so that it silently hears nothing ("The udev service seems
      not to be active, disabling the monitor"), unless /run/udev/control exists or /dev is devtmpfs.
      The watcher detects that and does not count such a monitor as watching.
    In a container: with its own network namespace, the kernel's events work and udevd's never arrive;
    with the host's network (`--network=host`) and the host's /run/udev mounted read-only, both work
    (the mount also gives libudev udevd's database). In a rootless container (network namespace owned
    by a user namespace) neither arrives: GPUs added later are seen only after a restart.

    start() and stop() are meant to be called from one thread.
    """

    def __init__(self, on_change: Callable[[str, str | None], None], *,
                 context: pyudev.Context | None = None,
                 sources: Iterable[UeventSource] = DEFAULT_SOURCES) -> None:
        self._on_change = on_change
        self._context = context
        self._sources = tuple(sources)
        self._thread: threading.Thread | None = None
        self._stop_write: int | None = None
        self._active_sources: tuple[UeventSource, ...] = ()

    @property
    def active_sources(self) -> tuple[UeventSource, ...]:
        """The sources being watched since start() (empty before, or when start() returned False)."""
        return self._active_sources

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> bool:
        """Begin watching; False (after one warning log line) when no source can be watched."""
        if self._thread is not None:
            return True
        feeds: list[_Feed] = []
        problems: list[str] = []
        try:
            context = self._context if self._context is not None else pyudev.Context()
        except (ImportError, OSError) as error:
            problems.append(f"libudev cannot be loaded: {error}")
        else:
            for source in self._sources:
                feed = _open_feed(context, source)
                if isinstance(feed, str):
                    problems.append(feed)
                else:
                    feeds.append(feed)
        stop_pipe: tuple[int, int] | None = None
        if feeds:
            try:
                stop_pipe = os.pipe()
            except OSError as error:
                problems.append(f"cannot create the stop pipe: {error.strerror}")
        if not feeds or stop_pipe is None:
            for feed in feeds:
                feed.sock.close()
            logger.warning("cannot watch GPU hot-plug events, new or re-bound GPUs are seen only after a "
                           "restart: %s", "; ".join(problems) or "no uevent source requested")
            return False
        for problem in problems:
            logger.debug("not watching %s", problem)
        stop_read, stop_write = stop_pipe
        thread = threading.Thread(target=self._run, args=(feeds, stop_read), name="drm-watcher", daemon=True)
        try:
            thread.start()
        except RuntimeError as error:  # "can't start new thread": a task limit
            for fd in stop_pipe:
                os.close(fd)
            for feed in feeds:
                feed.sock.close()
            logger.warning("cannot watch GPU hot-plug events, new or re-bound GPUs are seen only after a "
                           "restart: cannot start the watcher thread: %s", error)
            return False
        self._thread, self._stop_write = thread, stop_write
        self._active_sources = tuple(feed.source for feed in feeds)
        logger.info("watching GPU hot-plug events (%s uevents)", ", ".join(self._active_sources))
        return True

    def stop(self) -> None:
        """Stop watching and wait for the thread to end (it is idle between events, so that is quick)."""
        thread, stop_write = self._thread, self._stop_write
        if thread is None or stop_write is None:
            return
        try:
            os.write(stop_write, b"\0")
            thread.join(timeout=5)
        finally:
            os.close(stop_write)
            self._thread = None
            self._stop_write = None
            self._active_sources = ()

    def _run(self, feeds: list[_Feed], stop_read: int) -> None:
        recent: deque[str] = deque(maxlen=_RECENT_SEQNUMS)
        poller = select.poll()
        by_fd = {feed.monitor.fileno(): feed for feed in feeds}
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        poller.register(stop_read, select.POLLIN)
        try:
            while by_fd:
                for fd, revents in poller.poll():
                    if fd == stop_read:
                        return
                    feed = by_fd[fd]
                    if revents & select.POLLNVAL:
                        logger.warning("stopped watching %s uevents: the socket was closed", feed.source)
                        poller.unregister(fd)
                        del by_fd[fd]
                        continue
                    if revents & select.POLLERR:
                        self._clear_socket_error(feed)
                    self._drain(feed, recent)
        except Exception:
            logger.exception("the GPU hot-plug watcher stopped")
        finally:
            os.close(stop_read)
            for feed in feeds:
                feed.sock.close()

    def _clear_socket_error(self, feed: _Feed) -> None:
        # pyudev's Monitor.poll raises on POLLERR without reading the error, which would leave it
        # pending forever; reading SO_ERROR clears it. ENOBUFS means the kernel dropped uevents.
        error = feed.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error == errno.ENOBUFS:
            logger.warning("%s uevents were lost (receive queue overflowed); asking for a resync", feed.source)
            self._notify("resync", None)
        elif error:
            logger.debug("%s uevent socket error: %s", feed.source, os.strerror(error))

    def _drain(self, feed: _Feed, recent: deque[str]) -> None:
        while True:
            try:
                device = feed.monitor.poll(timeout=0)
            except Exception as error:  # libudev's errno for one unreadable message, as pyudev raises it
                logger.debug("skipping a %s uevent libudev could not read: %s", feed.source, error)
                return
            if device is None:
                return
            change = gpu_change_of(device)
            if change is None:
                continue
            seqnum = device.properties.get("SEQNUM")
            if seqnum:
                if seqnum in recent:
                    continue
                recent.append(seqnum)
            logger.debug("%s uevent: %s %s", feed.source, change[0], device.device_path)
            self._notify(*change)

    def _notify(self, action: str, pci_address: str | None) -> None:
        try:
            self._on_change(action, pci_address)
        except Exception:
            logger.exception("GPU change callback failed for %s %s", action, pci_address)


GpuChangeListener = Callable[[str, str | None], None]


class DrmNodeNames:
    """PCI address -> DRM node names, and GPU hot-plug events for whoever needs them.

    While the hot-plug watcher runs (start() to stop()) the names are read from udev once and again only
    after a GPU change; without it they are read on every get(). Listeners added with subscribe() hear
    each change as `listener(action, pci_address)` on the watcher's thread, so they must be quick and
    must not block (the Level Zero worker only marks its child stale there). One instance serves every
    user: start() and stop() may be called by each of them; the watcher starts once and stops once.
    """

    def __init__(self, watch: bool = True, *, context: pyudev.Context | None = None,
                 sources: Iterable[UeventSource] = DEFAULT_SOURCES) -> None:
        self._lock = threading.Lock()
        self._names: dict[str, DrmNodes] | None = None
        self._listeners: list[GpuChangeListener] = []
        self._watcher = DrmWatcher(self._changed, context=context, sources=sources) if watch else None
        self._started = False
        self._watched = False
        self._logged_unavailable = False

    def subscribe(self, listener: GpuChangeListener) -> None:
        self._listeners.append(listener)

    def start(self) -> None:
        """Watch GPU hot-plug events (once however often it is called; never when built with watch=False)."""
        if self._watcher is not None and not self._started:
            self._started = True
            self._watched = self._watcher.start()

    def stop(self) -> None:
        if self._watcher is not None and self._started:
            self._started = self._watched = False
            self._watcher.stop()

    def get(self, pci_address: str) -> DrmNodes:
        """The node names of the GPU at `pci_address`; empty ones when udev does not know them."""
        with self._lock:
            if self._names is None or not self._watched:
                self._names = self._read()
            return self._names.get(pci_address, DrmNodes())

    def _changed(self, action: str, pci_address: str | None) -> None:
        with self._lock:
            self._names = None
        for listener in self._listeners:
            try:
                listener(action, pci_address)
            except Exception:  # one listener's bug costs neither the others nor the watcher
                logger.exception("GPU change listener %r failed for %s %s", listener, action, pci_address)

    def _read(self) -> dict[str, DrmNodes]:
        try:
            names = drm_nodes_by_pci()
        except UdevUnavailable as error:
            if not self._logged_unavailable:
                logger.warning("DRM node names unknown, card and render_node labels stay empty: %s", error)
                self._logged_unavailable = True
            return {}
        self._logged_unavailable = False
        return names
