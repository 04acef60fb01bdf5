"""Waiting for a state in tests that drive threads or processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 10, interval: float = 0.05) -> T:
    """Poll until predicate() is truthy; returns its last value (falsy once `timeout` seconds passed).
    Not a timing assertion: a deadline for a state."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


class ManualClock:
    """A clock (time.monotonic's stand-in) that stands still until a test sets `now`."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
