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
owned by root, in a directory only root may change), and is resolved once (again only while it is not
believed): a link that someone else could retarget would let them choose which root-owned files are read as
the plans (`trusted_directory`; the planner's `--output-dir` goes through it too). Nothing the unit's
processes print is read: the same field on the unit's own journal entries (journald adds a unit's
`LogExtraFields` to them) is something any process may write itself.

Why not systemd's own view of the unit: systemd 252 puts no `LogExtraFields` on its own records about the
unit ("Started ..."); its per-unit copy for journald (`/run/systemd/units/log-extra-fields:UNIT`) is not
rewritten at a restart; and its bus refuses a `DynamicUser=` client such as the packaged exporter
(dbus-daemon runs with `SYSTEMD_NSS_DYNAMIC_BYPASS=1`, under which dynamic users do not resolve).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
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


def _open_checked(path: str, flags: int, owners: frozenset[int] = ROOT) -> int:
    """`path`, every directory on the way from / checked with _check_owner, none followed if a symlink."""
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        _check_owner("/", os.fstat(fd), owners)
        walked = ""
        parts = [part for part in path.split("/") if part]
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            walked += "/" + part
            try:
                child = os.open(part, (flags if last else os.O_RDONLY | os.O_DIRECTORY) | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UntrustedPath(f"{walked} is a symlink or not a directory") from error
                raise
            os.close(fd)
            fd = child
            _check_owner(walked, os.fstat(fd), owners)
        return fd
    except BaseException:
        os.close(fd)
        raise


def trusted_directory(path: str, owners: frozenset[int] = ROOT) -> str:
    """`path` resolved once, trusted only as a whole: a symlink on it is followed only when nobody but `owners`
    can have made it or can retarget it (the link theirs, in a directory _check_owner passes), and every
    directory of the result that exists passes _check_owner. The result, which has no symlink left, is what
    to use from then on: a link retargeted later is not followed again. Parts that do not exist yet are kept
    as given. Raises UntrustedPath (or the OSError of a part that cannot be looked at)."""
    pending = [part for part in reversed(path.split("/")) if part]
    resolved, links = "/", 0
    while pending:
        part = pending.pop()
        if part == ".":
            continue
        if part == "..":
            resolved = os.path.dirname(resolved)
            continue
        candidate = os.path.join(resolved, part)
        try:
            info = os.lstat(candidate)
        except FileNotFoundError:
            resolved = os.path.join(candidate, *reversed(pending))
            break
        if not stat.S_ISLNK(info.st_mode):
            resolved = candidate
            continue
        links += 1
        if links > MAX_SYMLINKS:
            raise UntrustedPath(f"{path}: more than {MAX_SYMLINKS} symlinks")
        if info.st_uid not in owners:
            raise UntrustedPath(f"{candidate} is a symlink owned by uid {info.st_uid}, not {_owners(owners)}")
        _check_owner(resolved, os.stat(resolved), owners)  # who may swap the link: its directory's writers
        target = os.readlink(candidate)
        if target.startswith("/"):
            resolved = "/"
        pending.extend(part for part in reversed(target.split("/")) if part)
    existing = resolved
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    os.close(_open_checked(existing, os.O_RDONLY | os.O_DIRECTORY, owners))
    return resolved


class UnitPlans:
    """Reads the plan's budget of units from their drop-ins under `directory` (`plans`), each unit's again
    after `reread_seconds`."""

    def __init__(self, directory: str = DEFAULT_PLANS_DIRECTORY, reread_seconds: float = REREAD_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self._base: str | None = None  # the directory resolved, once it is believed
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

    def _resolved(self) -> str | UnitConfigError:
        """The plans directory resolved once (a link on the way retargeted later is not followed); tried
        again at each look-up while it is not believed."""
        if self._base is None:
            try:
                self._base = trusted_directory(self.directory)
            except UntrustedPath as error:
                return UnitConfigError(f"{error}: the plans directory {self.directory} is not believed")
            except OSError as error:
                return UnitConfigError(f"{self.directory}: {error.strerror}")
        return self._base

    def _look_up(self, unit: str) -> int | UnitConfigError | None:
        base = self._resolved()
        if isinstance(base, UnitConfigError):
            return base
        if not os.path.isdir(base):
            return None
        try:
            return self._read(f"{base}/{unit}.d/{DROP_IN_NAME}")
        except UnitConfigError as error:
            return error

    @staticmethod
    def _read(path: str) -> int | None:
        try:
            # O_NONBLOCK: a FIFO root put there is not waited on (and is refused below)
            fd = _open_checked(path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except UntrustedPath as error:
            raise UnitConfigError(f"{error}: its plan is not believed") from error
        except OSError as error:
            raise UnitConfigError(f"{path}: {error.strerror}") from error
        with os.fdopen(fd, "rb") as stream:
            if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                raise UnitConfigError(f"{path} is not a regular file: its plan is not believed")
            return parse_drop_in(stream.read(MAX_DROP_IN_BYTES).decode("utf-8", "replace"))
