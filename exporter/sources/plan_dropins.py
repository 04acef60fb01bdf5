"""The KV budget vllm-xpu-plan's drop-in gives each watched unit, read from the drop-in itself.

The planner's drop-in, `DIR/UNIT.d/zz-vllm-xpu-plan.conf` (`/etc/systemd/system` by default), restates the
unit's command with `--kv-cache-memory-bytes N` and names the budget again on a line of its own,
`LogExtraFields=VLLM_XPU_PLAN_KV_CACHE_MEMORY_BYTES=N`. A later drop-in or an edit that replaces `ExecStart=`,
or a unit not restarted since, runs without it: the budget its latest start printed then differs from the
file's (`XpuUnitPlanNotApplied`).

Who may say so: only root. The file is believed only when nobody else can have written it or put it there:
every directory from `/` down to it owned by root and writable by no one else (a directory others may write
to must be sticky, so that they cannot replace root's entries), the unit's directory and the file opened
without following symlinks, the file a regular file owned by root and writable by no one else. A file that
fails this is reported, not read; the other units' are read as usual. The directory given
(`--collector.processes.plans`) may itself be reached through symlinks, but only through root's (each link
owned by root, in a directory only root may change): a link that someone else could retarget would let them
choose which root-owned files are read as the plans. It is opened one directory at a time and held open
(again only while it is missing or not believed), and every drop-in is opened relative to it: no path is
resolved again as a string (`open_trusted_directory`; the planner's `--output-dir` goes through it too, so
`/proc/PID/root/...` is the directory in that process's mount namespace). Nothing the unit's
processes print is read: the same field on the unit's own journal entries (journald adds a unit's
`LogExtraFields` to them) is something any process may write itself.

Why not systemd's own view of the unit: systemd 252 puts no `LogExtraFields` on its own records about the
unit ("Started ..."); its per-unit copy for journald (`/run/systemd/units/log-extra-fields:UNIT`) is not
rewritten at a restart; and its bus refuses a `DynamicUser=` client such as the packaged exporter
(dbus-daemon runs with `SYSTEMD_NSS_DYNAMIC_BYPASS=1`, under which dynamic users do not resolve).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import stat
import struct
import time
import weakref
from collections.abc import Callable, Iterable

PLAN_FIELD = "VLLM_XPU_PLAN_KV_CACHE_MEMORY_BYTES"
"""The field of the plan's `LogExtraFields=`: the budget in bytes, a decimal integer."""
DROP_IN_NAME = "zz-vllm-xpu-plan.conf"
"""The planner's drop-in in each unit's `UNIT.d` directory (sorts after `override.conf`)."""
DEFAULT_PLANS_DIRECTORY = "/etc/systemd/system"
# How long a unit's drop-in, once read, stands for the plan: a plan written or taken away shows within this
# (its alert waits ten minutes), and a scrape does not walk every unit's path from / again.
REREAD_SECONDS = 30.0
MAX_DROP_IN_BYTES = 64 * 1024
MAX_BUDGET_DIGITS = 20
MAX_SYMLINKS = 40  # as the kernel allows on one path
ROOT = frozenset({0})
_PROC_SUPER_MAGIC = 0x9FA0
_libc = ctypes.CDLL(None, use_errno=True)
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\@-]{1,250}\.service")


class UnitConfigError(OSError):
    """A plan's file that is not believed (who may have written it), or cannot be read."""


class UntrustedPath(UnitConfigError):
    """A path someone other than its trusted owners may have made or can swap (one line: which part, why)."""


def parse_drop_in(text: str) -> int | None:
    """The budget the drop-in's `LogExtraFields=VLLM_XPU_PLAN_KV_CACHE_MEMORY_BYTES=N` names (the last such
    line), or None when it names none that is a positive byte count."""
    budget = None
    prefix = f"LogExtraFields={PLAN_FIELD}="
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(prefix):
            value = line[len(prefix):]
            ok = value.isascii() and value.isdigit() and len(value) <= MAX_BUDGET_DIGITS and int(value) > 0
            budget = int(value) if ok else None
    return budget


def _check_owner(path: str, info: os.stat_result, owners: frozenset[int] = ROOT) -> None:
    if info.st_uid not in owners:
        raise UntrustedPath(f"{path} is owned by uid {info.st_uid}, not {_owners(owners)}")
    writable_by_others = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable_by_others and not (stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX):
        raise UntrustedPath(f"{path} is writable by others than {_owners(owners)} "
                            f"(mode {stat.S_IMODE(info.st_mode):o})")


def _owners(owners: frozenset[int]) -> str:
    return " or ".join("root" if uid == 0 else f"uid {uid}" for uid in sorted(owners))


def _on_procfs(fd: int) -> bool:
    """Whether the open directory `fd` is of procfs, whose symlinks the kernel makes (`/proc/PID/root`)."""
    buffer = ctypes.create_string_buffer(256)  # a struct statfs; its first member is f_type, a C long
    if _libc.fstatfs(fd, buffer) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return struct.unpack_from("l", buffer)[0] == _PROC_SUPER_MAGIC


def _open_root(owners: frozenset[int]) -> int:
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        _check_owner("/", os.fstat(fd), owners)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_entry(directory: int, part: str, flags: int, create: bool) -> int:
    """`part` of the open `directory` with `flags` (and O_NOFOLLOW), made a directory first if it is missing
    and `create`."""
    try:
        return os.open(part, flags | os.O_NOFOLLOW, dir_fd=directory)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):  # made meanwhile: checked as any
        os.mkdir(part, 0o755, dir_fd=directory)
    return os.open(part, flags | os.O_NOFOLLOW, dir_fd=directory)


def open_trusted_directory(path: str, owners: frozenset[int] = ROOT, *, create: bool = False) -> int:
    """An O_PATH descriptor of the directory the absolute `path` names, trusted only as a whole and held from
    then on: walked from `/` one part at a time, each opened relative to its parent's descriptor without
    following symlinks, every directory passing _check_owner. A symlink on the way is followed only when
    nobody but `owners` can have made it or can retarget it (the link theirs, in a directory that passed):
    its target walked the same way, or, for procfs's own links (`/proc/PID/root`), opened by the kernel
    relative to its directory, which lands where the link points (in the process's mount namespace, which
    the link's text cannot name). No string is resolved again, so a link retargeted later is not followed.
    `create`: missing directories are made (mode 755). Raises UntrustedPath, or the OSError of a part that
    cannot be opened (FileNotFoundError: a part is missing and not `create`)."""
    walked = [(_open_root(owners), "/")]  # the directories the walk stands in, for `..`
    try:
        pending = [part for part in reversed(path.split("/")) if part]
        links = 0
        while pending:
            part = pending.pop()
            if part == ".":
                continue
            if part == "..":
                if len(walked) > 1:
                    os.close(walked.pop()[0])
                continue
            parent, name = walked[-1]
            name = os.path.join(name, part)
            entry: int | None = _open_entry(parent, part, os.O_PATH, create)
            try:
                info = os.fstat(entry)
                if not stat.S_ISLNK(info.st_mode):
                    if not stat.S_ISDIR(info.st_mode):
                        raise UntrustedPath(f"{name} is not a directory")
                    _check_owner(name, info, owners)
                    walked.append((entry, name))
                    entry = None
                    continue
                links += 1
                if links > MAX_SYMLINKS:
                    raise UntrustedPath(f"{path}: more than {MAX_SYMLINKS} symlinks")
                if info.st_uid not in owners:
                    raise UntrustedPath(f"{name} is a symlink owned by uid {info.st_uid}, not {_owners(owners)}")
                if _on_procfs(parent):
                    walked.append((os.open(part, os.O_PATH | os.O_DIRECTORY, dir_fd=parent), name))
                    _check_owner(name, os.fstat(walked[-1][0]), owners)
                    continue
                target = os.readlink("", dir_fd=entry)
                if target.startswith("/"):
                    for fd, _ in walked:
                        os.close(fd)
                    walked = [(_open_root(owners), "/")]
                pending.extend(part for part in reversed(target.split("/")) if part)
            finally:
                if entry is not None:
                    os.close(entry)
        return walked.pop()[0]
    finally:
        for fd, _ in walked:
            os.close(fd)


def open_below(directory: int, relative: str, flags: int, shown: str, owners: frozenset[int] = ROOT, *,
               create: bool = False) -> int:
    """The file `relative` names in the open, trusted `directory` (`shown` names it in messages), opened with
    `flags`: every part opened without following symlinks, each passing _check_owner (`create`: directories
    made where missing)."""
    fd = os.dup(directory)
    try:
        parts = [part for part in relative.split("/") if part]
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            shown = f"{shown.rstrip('/')}/{part}"
            try:
                child = _open_entry(fd, part, flags if last else os.O_PATH | os.O_DIRECTORY, create)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UntrustedPath(f"{shown} is a symlink or not a directory") from error
                raise
            os.close(fd)
            fd = child
            _check_owner(shown, os.fstat(fd), owners)
        return fd
    except BaseException:
        os.close(fd)
        raise


class UnitPlans:
    """Reads the plan's budget of units from their drop-ins under `directory` (`plans`), each unit's again
    after `reread_seconds`."""

    def __init__(self, directory: str = DEFAULT_PLANS_DIRECTORY, reread_seconds: float = REREAD_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self._base: int | None = None  # the directory's descriptor, once it is believed
        self._reread_seconds = reread_seconds
        self._clock = clock
        # unit -> (when read, its budget, None for no plan, or why its drop-in is not believed)
        self._read_units: dict[str, tuple[float, int | UnitConfigError | None]] = {}

    def plans(self, units: Iterable[str]) -> tuple[dict[str, int], list[str]]:
        """unit -> the budget its plan's drop-in names (units without one are absent, as is every unit when the
        directory does not exist), and a line for each drop-in not believed or not read."""
        now = self._clock()
        asked = {unit for unit in units if _UNIT_NAME.fullmatch(unit)}
        self._read_units = {unit: known for unit, known in self._read_units.items()
                            if unit in asked and now - known[0] < self._reread_seconds}
        plans: dict[str, int] = {}
        problems: list[str] = []
        for unit in sorted(asked):
            if unit not in self._read_units:
                self._read_units[unit] = (now, self._look_up(unit))
            found = self._read_units[unit][1]
            if isinstance(found, UnitConfigError):
                problems.append(str(found))
            elif found is not None:
                plans[unit] = found
        return plans, problems

    def _opened(self) -> int | UnitConfigError | None:
        """The plans directory's descriptor, opened once it is believed and held (a link on the way retargeted
        later is not followed); opened again at each look-up while it is missing or not believed."""
        if self._base is None:
            try:
                self._base = open_trusted_directory(os.path.abspath(self.directory))
            except OSError as error:
                return _problem(error, self.directory, f"the plans directory {self.directory}")
            weakref.finalize(self, os.close, self._base)
        return self._base

    def drop_in_text(self, unit: str) -> str | None:
        """The unit's plan drop-in as root wrote it, read now; None when there is none or it is not believed."""
        found = self._read_text(unit)
        return found if isinstance(found, str) else None

    def _look_up(self, unit: str) -> int | UnitConfigError | None:
        found = self._read_text(unit)
        return parse_drop_in(found) if isinstance(found, str) else found

    def _read_text(self, unit: str) -> str | UnitConfigError | None:
        base = self._opened()
        if base is None or isinstance(base, UnitConfigError):
            return base
        shown = f"{self.directory.rstrip('/')}/{unit}.d/{DROP_IN_NAME}"
        try:
            # O_NONBLOCK: a FIFO root put there is not waited on (and is refused below)
            fd = open_below(base, f"{unit}.d/{DROP_IN_NAME}", os.O_RDONLY | os.O_NONBLOCK, self.directory)
        except OSError as error:
            return _problem(error, shown, "its plan")
        with os.fdopen(fd, "rb") as stream:
            if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                return UnitConfigError(f"{shown} is not a regular file: its plan is not believed")
            return stream.read(MAX_DROP_IN_BYTES).decode("utf-8", "replace")


def _problem(error: OSError, shown: str, what: str) -> UnitConfigError | None:
    """A part missing is no plan (None); else one line: why `what` is not believed, or `shown` not read."""
    if isinstance(error, FileNotFoundError):
        return None
    if isinstance(error, UntrustedPath):
        return UnitConfigError(f"{error}: {what} is not believed")
    return UnitConfigError(f"{shown}: {error.strerror}")


# --- what the init gate asks of a unit's configuration (docs/gate.md, "By the plan") ------------------

# systemd's search path of system units (systemd.unit(5)): a drop-in of a unit in any of them counts, all
# of them applied in the lexical order of their file names.
SYSTEM_UNIT_DIRECTORIES = ("/etc/systemd/system.control", "/run/systemd/system.control", "/run/systemd/transient",
                           "/run/systemd/generator.early", "/etc/systemd/system", "/etc/systemd/system.attached",
                           "/run/systemd/system", "/run/systemd/system.attached", "/run/systemd/generator",
                           "/usr/local/lib/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system",
                           "/run/systemd/generator.late")


def plan_budget_now(directory: str, unit: str) -> tuple[int | None, str | None]:
    """The budget the unit's plan drop-in names, read now (no reread time: a plan just removed is gone), as
    `UnitPlans` believes it; and why it is not believed, or None."""
    plans, problems = UnitPlans(directory, reread_seconds=0.0).plans([unit])
    return plans.get(unit), (problems[0] if problems else None)


def parse_environment(text: str, name: str) -> str | None:
    """The value the drop-in's `Environment=` lines give `name` (the last one), or None."""
    value = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Environment="):
            for word in line[len("Environment="):].split():
                if word.startswith(f"{name}="):
                    value = word[len(name) + 1:]
    return value


def plan_environment_now(directory: str, unit: str, name: str) -> str | None:
    """What the unit's plan drop-in gives `name` in its environment (the planner's figures for the gate's
    client), read now and believed as `UnitPlans` believes the budget. None when there is no such drop-in,
    value, or belief."""
    text = UnitPlans(directory, reread_seconds=0.0).drop_in_text(unit)
    return None if text is None else parse_environment(text, name)


def drop_in_directories(unit: str) -> list[str]:
    """The `.d` directory names systemd reads drop-ins of `unit` from: its own, its template's
    (`name@.service.d`), and those of each dash-prefix of its name and of its type (`vllm-.service.d`,
    `service.d`)."""
    name, _, kind = unit.rpartition(".")
    names = [f"{unit}.d"]
    if "@" in name:
        names.append(f"{name.partition('@')[0]}@.{kind}.d")
    parts = name.partition("@")[0].split("-")
    names += [f"{'-'.join(parts[:count])}-.{kind}.d" for count in range(len(parts) - 1, 0, -1)]
    names.append(f"{kind}.d")
    return names


def exec_start_overrides(unit: str, plans_directory: str = DEFAULT_PLANS_DIRECTORY,
                         directories: Iterable[str] = SYSTEM_UNIT_DIRECTORIES) -> list[str]:
    """Drop-ins of the unit that set `ExecStart=` and are applied after the plan's (a name sorting after
    DROP_IN_NAME, or another file of that name than the plan's in `plans_directory`): the unit then runs
    another command than the plan's. A file that cannot be read counts as one (the gate then waits in order:
    the safe side)."""
    own = os.path.realpath(f"{plans_directory}/{unit}.d/{DROP_IN_NAME}")
    found = []
    for directory in directories:
        for name in drop_in_directories(unit):
            path = f"{directory}/{name}"
            try:
                entries = os.listdir(path)
            except OSError:
                continue
            for entry in sorted(entries):
                if not entry.endswith(".conf") or entry < DROP_IN_NAME:
                    continue
                if entry == DROP_IN_NAME and os.path.realpath(f"{path}/{entry}") == own:
                    continue
                try:  # O_NONBLOCK: a FIFO there is not waited on
                    with os.fdopen(os.open(f"{path}/{entry}", os.O_RDONLY | os.O_NONBLOCK), "rb") as stream:
                        text = stream.read(MAX_DROP_IN_BYTES).decode("utf-8", "replace")
                except OSError:
                    found.append(f"{path}/{entry}")
                    continue
                if any(line.strip().startswith("ExecStart=") for line in text.splitlines()):
                    found.append(f"{path}/{entry}")
    return found
