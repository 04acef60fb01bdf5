"""The init gate's lease directory (`--lease-directory`, docs/gate.md): per device, `<device>.lock`, which
the one gate deciding holds (flock), and `<device>.lease`, naming the unit released last and its
invocation (`Lease`), until `lease_ended` says it no longer holds. The directory and its files are the
gate's user's (root's) alone; what else is planted there is neither followed nor waited on."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import ClassVar

from vllm_xpu_exporter.fold.engine_starts import UnitView
from vllm_xpu_exporter.gate import lines as gate_lines

LEASE_DIRECTORY_MODE = 0o700
LEASE_FILE_MODE = 0o600
MAX_LEASE_BYTES = 64 * 1024
# Whatever is planted as a lock or lease, root opening it must not follow it elsewhere (a symlink) nor wait
# on it (a FIFO); `open_regular` then refuses anything but a regular file.
OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_regular(name: str | Path, flags: int, dir_fd: int | None = None) -> int:
    """A descriptor of the regular file `name` (made 0600 with O_CREAT); OSError for anything else."""
    descriptor = os.open(name, flags | OPEN_FLAGS, LEASE_FILE_MODE, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError(f"{name} is not a regular file")
    return descriptor


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is no lease's figure")


@dataclass(frozen=True)
class Lease:
    """A device's lease: the unit released last and its invocation, until when it holds at most."""

    device: str
    unit: str
    invocation_id: str
    granted_usec: int  # wall clock, as the journal's realtime
    expires_usec: int
    gate_pid: int

    @classmethod
    def read(cls, path: str | Path, dir_fd: int | None = None) -> Lease | None:
        """The lease in the file, None when there is no file; OSError when it is not a regular file,
        ValueError when it holds no lease (too big, not JSON, other fields)."""
        try:
            descriptor = open_regular(path, os.O_RDONLY, dir_fd)
        except FileNotFoundError:
            return None
        with os.fdopen(descriptor, "rb") as file:
            content = file.read(MAX_LEASE_BYTES + 1)
        if len(content) > MAX_LEASE_BYTES:
            raise ValueError(f"larger than {MAX_LEASE_BYTES} bytes")
        return cls.parse(content)

    @classmethod
    def parse(cls, content: bytes) -> Lease:
        """The lease `write` wrote; ValueError for anything else."""
        try:
            data = json.loads(content, parse_constant=_refuse_constant)
        except RecursionError:
            raise ValueError("nested too deeply") from None
        # each field has the type its annotation names: a float, a bool or null is no lease's
        if not isinstance(data, dict) or any(type(data.get(field.name)).__name__ != field.type
                                             for field in fields(cls)):
            raise ValueError(f"not a lease's fields ({', '.join(field.name for field in fields(cls))})")
        return cls(**{field.name: data[field.name] for field in fields(cls)})


@dataclass(frozen=True)
class UnreadableLease:
    """A lease file the gate cannot read (not a regular file, too big, not a lease). It may be a gate's
    lease gone wrong, so it holds, for an unknown holder, until the file is --lease-timeout old."""

    device: str
    reason: str
    expires_usec: int  # the file's modification time plus --lease-timeout
    unit: ClassVar[str] = gate_lines.UNREADABLE_LEASE


def lease_ended(lease: Lease | UnreadableLease, views: Mapping[str, UnitView], now_usec: int,
                gone: Callable[[str, str], bool | None]) -> str | None:
    """Why the lease no longer holds, or None while it does."""
    if now_usec >= lease.expires_usec:
        return "timed out"
    if isinstance(lease, UnreadableLease):
        return None  # no unit the journal or systemd could say anything about
    view = views.get(lease.unit)
    if view is not None:
        if lease.invocation_id:
            if view.invocation_ended(lease.invocation_id):
                return "its init ended"
        elif view.current is not None and view.current.began_usec >= lease.granted_usec and \
                view.current.outcome is not None:
            return "its init ended"
    if gone(lease.unit, lease.invocation_id):
        return "its unit is not running"
    return None


def directory_refused(status: os.stat_result) -> str | None:
    """Why a lease directory (its lstat) is not the gate's user's alone, or None when it is."""
    if not stat.S_ISDIR(status.st_mode):
        return "not a directory (a symlink to one neither)"
    if status.st_uid != os.geteuid():
        return f"owned by uid {status.st_uid}, not by the gate's user (uid {os.geteuid()})"
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by others (mode {stat.S_IMODE(status.st_mode):04o})"
    return None


class LeaseDirectory:
    """`<directory>/<device>.lock` (flock: one gate decides at a time) and `<device>.lease`, root's alone:
    the directory is 0700 and its files 0600, so no one else can hold a lock, or plant or read a lease.
    Every file is opened in the directory opened once (`prepare`), never by a path through it."""

    def __init__(self, directory: str) -> None:
        self.path = Path(directory)
        self._descriptor: int | None = None

    def prepare(self) -> None:
        """Make the directory (0700) if it does not exist, and open it; OSError (saying why) if it cannot be
        used or is not the gate's user's alone."""
        with contextlib.suppress(FileExistsError):
            self.path.mkdir(mode=LEASE_DIRECTORY_MODE, parents=True)
        status = os.lstat(self.path)
        refused = directory_refused(status)
        if refused is not None:
            raise PermissionError(refused)
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
        descriptor = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | OPEN_FLAGS)
        if not os.path.samestat(os.fstat(descriptor), status):
            os.close(descriptor)
            raise PermissionError("replaced while the gate checked it")
        if stat.S_IMODE(status.st_mode) & ~LEASE_DIRECTORY_MODE:
            os.fchmod(descriptor, LEASE_DIRECTORY_MODE)  # narrowed: earlier versions made it 0755
        self._descriptor = descriptor

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None

    @contextlib.contextmanager
    def locked(self, device: str, deadline: float) -> Iterator[bool]:
        """Hold the device's lock; yields False when it could not be had before `deadline`. OSError when the
        lock is not a regular file."""
        descriptor = open_regular(f"{device}.lock", os.O_RDWR | os.O_CREAT, self._descriptor)
        try:
            while True:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        yield False
                        return
                    time.sleep(0.02)
            yield True
        finally:
            os.close(descriptor)  # releases the lock

    def lease(self, device: str, lease_timeout: float) -> Lease | UnreadableLease | None:
        """The device's lease, None when there is none; one that cannot be read holds until its file is
        `lease_timeout` old."""
        name = f"{device}.lease"
        try:
            return Lease.read(name, self._descriptor)
        except (OSError, ValueError) as error:
            try:
                modified = os.stat(name, dir_fd=self._descriptor, follow_symlinks=False)
            except FileNotFoundError:
                return None  # removed meanwhile
            return UnreadableLease(device, str(error), modified.st_mtime_ns // 1000 + round(lease_timeout * 1e6))

    def leases(self) -> list[Lease]:
        """Every device's lease that can be read."""
        try:
            names = sorted(name for name in os.listdir(self._descriptor) if name.endswith(".lease"))
        except OSError:
            return []
        leases = []
        for name in names:
            with contextlib.suppress(OSError, ValueError):
                if (lease := Lease.read(name, self._descriptor)) is not None:
                    leases.append(lease)
        return leases

    def grant(self, lease: Lease) -> None:
        """Write the lease as a new file (0600) renamed over the device's: a reader sees the old lease or the
        new one, never part of one."""
        name = f"{lease.device}.lease"
        temporary = f".{name}.{secrets.token_hex(8)}.tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | OPEN_FLAGS, LEASE_FILE_MODE,
                             dir_fd=self._descriptor)
        try:
            with os.fdopen(descriptor, "w") as file:
                json.dump(asdict(lease), file)
            os.replace(temporary, name, src_dir_fd=self._descriptor, dst_dir_fd=self._descriptor)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=self._descriptor)
            raise
