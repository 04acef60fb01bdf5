"""Device memory per systemd unit from the kernel's dmem cgroup controller (Linux 6.14+).

Where the controller is enabled for a unit's slice (`+dmem` in the slice's `cgroup.subtree_control`),
the unit's cgroup has `dmem.current`: the device memory its processes (and those of its sub-cgroups)
have allocated, per region, as the kernel itself accounts it (`vllm_xpu_exporter.parsers.dmem`). Reading it
needs no privilege (cgroup files are world-readable), where DRM fdinfo needs CAP_SYS_PTRACE, and it
counts memory that no fdinfo shows.

The cgroup tree is `<sysfs>/fs/cgroup` (`--path.sysfs`, default `/sys`). A unit's cgroup path comes
from `/proc/PID/cgroup` (`vllm_xpu_exporter.parsers.cgroup.UnitCgroup`), which is relative to the reader's
cgroup namespace:

- on the host (or a container sharing the host's cgroup namespace) it is the directory's path in the
  tree: `/system.slice/vllm-xpu-chat.service`;
- from a container with a cgroup namespace of its own, a host unit's path climbs out of the namespace
  first: `/../system.slice/vllm-xpu-chat.service`, and where the namespace's root sits in the host's
  tree is not known. Then the unit's directory is looked for by name in the tree (the host's tree,
  mounted at `<sysfs>/fs/cgroup`): the one directory whose path ends with the elements after the `..`s.
  The walk runs once for every unit not yet located, and its answer is kept: a directory found is
  kept as long as the unit is asked for, one not found (or found more than once) is looked for again
  after `relocate_seconds`.

`dmem.current` itself is read afresh on every read, one small file per unit (per distinct cgroup
directory). From a shell: `python -m vllm_xpu_exporter.sources.dmem /sys CGROUP_PATH...`.
"""

from __future__ import annotations

import errno
import functools
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from vllm_xpu_exporter.parsers.dmem import DmemFormatError, parse_dmem_current, vram_by_device
from vllm_xpu_exporter.sources.procfs import read_text

log = logging.getLogger("vllm_xpu_exporter.dmem")

DEFAULT_SYSFS = "/sys"
CGROUP_TREE = "fs/cgroup"
DMEM_CURRENT = "dmem.current"
CONTROLLERS = "cgroup.controllers"
DMEM_CONTROLLER = "dmem"
# A real dmem.current is a line per registered region: well under 1 KiB on any host.
MAX_DMEM_CURRENT_BYTES = 64 * 1024
# How long a unit not found in the tree (from another cgroup namespace) waits before it is looked for again.
RELOCATE_SECONDS = 60.0
# Bounds of one walk of the tree: a host has hundreds of cgroups, not tens of thousands.
MAX_WALK_DIRECTORIES = 20_000
MAX_WALK_DEPTH = 32
ABSENT_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR})


@dataclass(frozen=True)
class DmemReading:
    """One read of the units' dmem.current files."""

    # unit -> device (PCI address) -> bytes of the device's VRAM regions held by the unit's cgroups, for
    # the devices whose regions the unit's dmem.current lists (0: listed, nothing in use). A unit whose
    # cgroup has no dmem.current (the controller is not enabled there, or the cgroup is gone), whose
    # cgroup is not found, or whose file is malformed, is absent.
    by_unit: dict[str, dict[str, int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # one line each: malformed or unreadable files


@dataclass
class _Located:
    directory: str | None  # None: not found, or found more than once
    retry_at: float


class DmemReader:
    """Reads the dmem.current of units' cgroups under `<sysfs>/fs/cgroup`; see the module. Not
    thread-safe: reads are serial (one scrape at a time)."""

    def __init__(self, sysfs: str = DEFAULT_SYSFS, relocate_seconds: float = RELOCATE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root = os.path.join(sysfs, CGROUP_TREE)
        self.relocate_seconds = relocate_seconds
        self._clock = clock
        self._located: dict[str, _Located] = {}  # cgroup path -> its directory in the tree
        self._logged: set[str] = set()  # what has been logged once

    def read(self, unit_cgroups: Mapping[str, Iterable[str]]) -> DmemReading:
        """`unit_cgroups`: unit -> its cgroup paths as /proc/PID/cgroup gives them (a unit may have several:
        user units of one name run by two users). A unit counts only when every one of its cgroups has
        dmem.current, and a device only when every one of them lists the device's regions."""
        reading = DmemReading()
        if not unit_cgroups or not self._controller_available():
            return reading
        units = {unit: frozenset(paths) for unit, paths in unit_cgroups.items()}
        files = self._files(frozenset().union(*units.values()))
        vram_of_file: dict[str, Mapping[str, int] | None] = {}  # None: no usable dmem.current
        for unit, paths in sorted(units.items()):
            unit_files = {files[path] for path in paths}
            if None in unit_files or not unit_files:
                continue
            for file in unit_files - vram_of_file.keys():
                vram_of_file[file] = self._read(file, reading.problems)  # type: ignore[arg-type]
            figures = [vram_of_file[file] for file in unit_files]
            if any(vram is None for vram in figures):
                continue
            common = set(figures[0]).intersection(*figures[1:])  # type: ignore[arg-type]
            reading.by_unit[unit] = {device: sum(vram[device] for vram in figures)  # type: ignore[index]
                                     for device in sorted(common)}
        return reading

    def _controller_available(self) -> bool:
        """Whether the tree's root offers the dmem controller: one small read, where a kernel before 6.14, a
        cgroup v1 or hybrid host's /sys/fs/cgroup, or a wrong --path.sysfs would cost a failed open per unit."""
        try:
            controllers = read_text(f"{self.root}/{CONTROLLERS}", MAX_DMEM_CURRENT_BYTES)
        except OSError:
            return False
        return DMEM_CONTROLLER in controllers.split()

    @staticmethod
    def _read(file: str, problems: list[str]) -> Mapping[str, int] | None:
        try:
            text = read_text(file, MAX_DMEM_CURRENT_BYTES)
        except OSError as error:
            if error.errno not in ABSENT_ERRNOS:  # absent: the controller is off there, or the unit stopped
                problems.append(f"cannot read {file}: {error.strerror}")
            return None
        try:
            if len(text) >= MAX_DMEM_CURRENT_BYTES:
                raise DmemFormatError(f"larger than {MAX_DMEM_CURRENT_BYTES} bytes")
            return _vram_of_text(text)
        except DmemFormatError as error:
            problems.append(f"{file}: malformed: {error}")
            return None

    def _files(self, paths: frozenset[str]) -> dict[str, str | None]:
        """cgroup path -> the dmem.current file of its directory in the tree (None: no such directory)."""
        now = self._clock()
        located: dict[str, _Located] = {}
        # paths from another cgroup namespace to look for -> their elements after the `..`s
        due: dict[str, tuple[str, ...]] = {}
        for path in paths:
            known = self._located.get(path)
            if known is not None and (known.directory is not None or now < known.retry_at):
                located[path] = known
                continue
            elements = [element for element in path.split("/") if element not in ("", ".")]
            tail = elements[len(elements) - elements[::-1].index(".."):] if ".." in elements else elements
            if not tail:
                located[path] = _Located(None, math.inf)  # the root cgroup, or above it: no unit there
            elif ".." not in elements:
                located[path] = _Located(os.path.join(self.root, *elements), math.inf)
            else:
                due[path] = tuple(tail)
        if due:
            for path, directory in self._walk(due).items():
                located[path] = _Located(directory, now + self.relocate_seconds)
        self._located = located  # only the paths still asked for
        return {path: None if entry.directory is None else f"{entry.directory}/{DMEM_CURRENT}"
                for path, entry in located.items()}

    def _walk(self, wanted: dict[str, tuple[str, ...]]) -> dict[str, str | None]:
        """The one directory under the root whose path ends with each wanted tail, else None."""
        paths_by_name: dict[str, list[str]] = {}
        for path, tail in wanted.items():
            paths_by_name.setdefault(tail[-1], []).append(path)
        matches: dict[str, list[str]] = {path: [] for path in wanted}
        stack: list[tuple[str, tuple[str, ...]]] = [(self.root, ())]
        visited = 0
        while stack:
            directory, elements = stack.pop()
            visited += 1
            if visited > MAX_WALK_DIRECTORIES:
                self._log_once("walk", logging.WARNING, "stopped looking for units' cgroups after %d directories "
                               "of %s", MAX_WALK_DIRECTORIES, self.root)
                break
            try:
                entries = os.scandir(directory)
            except OSError:
                continue  # removed since it was listed, or not a directory tree at all
            with entries:
                for entry in entries:
                    try:
                        if not entry.is_dir(follow_symlinks=False):
                            continue
                    except OSError:
                        continue
                    child = (*elements, entry.name)
                    for path in paths_by_name.get(entry.name, ()):
                        tail = wanted[path]
                        if child[-len(tail):] == tail:
                            matches[path].append(entry.path)
                    if len(child) < MAX_WALK_DEPTH:
                        stack.append((entry.path, child))
        found: dict[str, str | None] = {}
        for path, candidates in matches.items():
            found[path] = candidates[0] if len(candidates) == 1 else None
            if not candidates:
                self._log_once("missing", logging.INFO, "cgroup %s (a unit outside the exporter's cgroup namespace) "
                               "is not under %s: mount the host's cgroup tree there (--path.sysfs) for per-unit "
                               "memory from the dmem controller", path, self.root)
            elif len(candidates) > 1:
                self._log_once("ambiguous", logging.INFO, "cgroup %s (a unit outside the exporter's cgroup "
                               "namespace) matches %d directories under %s; its memory is not read from dmem",
                               path, len(candidates), self.root)
        return found

    def _log_once(self, what: str, level: int, message: str, *args: object) -> None:
        if what not in self._logged:
            self._logged.add(what)
            log.log(level, message, *args)


@functools.lru_cache(maxsize=256)
def _vram_of_text(text: str) -> Mapping[str, int]:
    """`vram_by_device(parse_dmem_current(text))`, kept for texts read again: a unit's figures change only
    when it allocates or frees device memory."""
    return MappingProxyType(vram_by_device(parse_dmem_current(text)))


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(f"usage: {argv[0]} SYSFS CGROUP_PATH...  (e.g. /sys /system.slice/vllm-xpu-chat.service)",
              file=sys.stderr)
        return 2
    paths = argv[2:]
    reading = DmemReader(argv[1]).read({path: [path] for path in paths})
    for path in paths:
        print(f"{path}: {reading.by_unit.get(path, 'no dmem.current')}")
    for problem in reading.problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
