"""No test changes the host's systemd configuration: a unit or drop-in left in /etc/systemd/system would be
read by every real systemd booted later (its root is an overlay on the host's `/`) and by the host itself,
so one test's leftover makes later tests fail in an order of their own. conftest.py runs every test inside
`unchanged_host_units()`; a test that changes the tree fails, naming what it changed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HOST_UNITS = Path("/etc/systemd/system")


def snapshot(root: Path = HOST_UNITS) -> dict[str, tuple[int, int, int]]:
    """Every path below `root` (links not followed) with its mode, size and modification time. Taken twice per
    test, so one directory read per directory and one lstat per entry, nothing more."""
    found = {}
    pending = [("", str(root))]
    while pending:
        prefix, directory = pending.pop()
        try:
            entries = os.scandir(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue
        with entries:
            for entry in entries:
                try:
                    status = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                path = prefix + entry.name
                found[path] = (status.st_mode, status.st_size, status.st_mtime_ns)
                if entry.is_dir(follow_symlinks=False):
                    pending.append((f"{path}/", entry.path))
    return found


def changes(before: dict[str, tuple[int, int, int]], after: dict[str, tuple[int, int, int]]) -> list[str]:
    return ([f"added {path}" for path in sorted(after.keys() - before.keys())]
            + [f"removed {path}" for path in sorted(before.keys() - after.keys())]
            + [f"changed {path}" for path in sorted(before.keys() & after.keys()) if before[path] != after[path]])


@contextmanager
def unchanged_host_units(root: Path = HOST_UNITS) -> Iterator[None]:
    before = snapshot(root)
    yield
    changed = changes(before, snapshot(root))
    if changed:
        raise AssertionError(f"the test changed the host's {root} (later real-systemd boots would read it): "
                             + ", ".join(changed))
