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
fails this is reported, not read; the other units' are read as usual. The directory given (`--collector.processes.plans`) may itself be reached
through symlinks, resolved first and then checked the same way. Nothing the unit's processes print is read:
the same field on the unit's own journal entries (journald adds a unit's `LogExtraFields` to them) is
something any process may write itself.

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
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\@-]{1,250}\.service")


class UnitConfigError(OSError):
    """A plan's file that is not believed (who may have written it), or cannot be read."""


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


def _check_owner(path: str, info: os.stat_result) -> None:
    if info.st_uid != 0:
        raise UnitConfigError(f"{path} is owned by uid {info.st_uid}, not root: its plan is not believed")
    writable_by_others = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable_by_others and not (stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX):
        raise UnitConfigError(f"{path} is writable by others than root (mode {stat.S_IMODE(info.st_mode):o}): "
                              f"its plan is not believed")


def _open_checked(path: str, flags: int) -> int:
    """`path`, every directory on the way from / checked with _check_owner, none followed if a symlink."""
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        _check_owner("/", os.fstat(fd))
        walked = ""
        parts = [part for part in path.split("/") if part]
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            walked += "/" + part
            try:
                child = os.open(part, (flags if last else os.O_RDONLY | os.O_DIRECTORY) | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnitConfigError(f"{walked} is a symlink or not a directory: its plan is not believed") \
                        from error
                raise
            os.close(fd)
            fd = child
            _check_owner(walked, os.fstat(fd))
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

    def _look_up(self, unit: str) -> int | UnitConfigError | None:
        base = os.path.realpath(self.directory)
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
        except UnitConfigError:
            raise
        except OSError as error:
            raise UnitConfigError(f"{path}: {error.strerror}") from error
        with os.fdopen(fd, "rb") as stream:
            if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                raise UnitConfigError(f"{path} is not a regular file: its plan is not believed")
            return parse_drop_in(stream.read(MAX_DROP_IN_BYTES).decode("utf-8", "replace"))


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
    client), read now, believed as `UnitPlans` believes the budget but stricter: the directory is not
    resolved through symlinks either. None when there is no such drop-in, value, or belief."""
    try:
        fd = _open_checked(f"{directory}/{unit}.d/{DROP_IN_NAME}", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:  # UnitConfigError included
        return None
    with os.fdopen(fd, "rb") as stream:
        if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
            return None
        return parse_environment(stream.read(MAX_DROP_IN_BYTES).decode("utf-8", "replace"), name)


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
