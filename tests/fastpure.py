"""A test marked `fast` (the pure core: pyproject.toml's markers) that starts a process or connects or binds a
socket fails, naming what it did: the mark stays true as tests change. conftest.py takes these hooks;
`pytest -p fastpure` loads them anywhere else (tests/harness/test_fastpure.py).

What is watched, in setup, call and teardown of a fast test (but the last test's teardown, where the session's
fixtures end too): subprocess.Popen, os.fork, os.posix_spawn(p),
os.system, and socket connect, connect_ex and bind (the network, systemd's and udev's sockets). The calls
still happen; the test fails after them, whatever its code made of them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

NOT_PURE = "a test marked fast started"


@contextmanager
def no_processes_or_sockets(seen: list[str]) -> Iterator[None]:
    """Records in `seen` every process started (subprocess, fork, posix_spawn, os.system) and every socket
    connected or bound meanwhile, by this thread or one started meanwhile (not by threads an earlier test left
    running); they still happen, so that the test fails on them rather than on an error its code caught."""
    earlier = {thread.ident for thread in threading.enumerate()} - {threading.get_ident()}

    def noting(what: str, original: Callable[..., object]) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            if threading.get_ident() not in earlier:
                seen.append(what)
            return original(*args, **kwargs)
        call.watched_by_fastpure = True  # type: ignore[attr-defined]
        return call

    patched = [(subprocess.Popen, "_execute_child", "a subprocess"), (os, "fork", "a fork"),
               (os, "posix_spawn", "a posix_spawn"), (os, "posix_spawnp", "a posix_spawn"),
               (os, "system", "os.system"), (socket.socket, "connect", "a socket connect"),
               (socket.socket, "connect_ex", "a socket connect"), (socket.socket, "bind", "a socket bind")]
    own = [(owner, name, vars(owner).get(name)) for owner, name, _ in patched]  # None: inherited (socket's)
    for owner, name, what in patched:
        setattr(owner, name, noting(what, getattr(owner, name)))
    try:
        yield
    finally:
        for owner, name, original in own:
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def watching() -> bool:
    """Whether processes and sockets are watched now (in a fast test, with these hooks loaded)."""
    return getattr(os.fork, "watched_by_fastpure", False) and getattr(subprocess.Popen._execute_child,
                                                                     "watched_by_fastpure", False)


def _kept_pure(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("fast") is None:
        return (yield)
    seen: list[str] = []
    with no_processes_or_sockets(seen):
        result = yield
    if seen:
        raise AssertionError(f"{NOT_PURE} {', '.join(sorted(set(seen)))}: it is not the pure "
                             f"core (no subprocess, systemd, network or fake driver); take its mark off")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _kept_pure(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _kept_pure(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if nextitem is None:  # the session's fixtures end here too, those of the tests before it (a dockerd stopped)
        return (yield)
    return (yield from _kept_pure(item))
