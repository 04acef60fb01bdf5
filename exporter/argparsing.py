"""The argparse pieces every command line of the package shares, importing nothing of the package but the
Go durations: so the gate's client (`vllm-xpu-gate wait`, run at every gated start) parses its flags without
loading the sources that `flags.py` defines the exporter's flags with, and a collector or the planner takes
an argument type without importing the command line's flags."""

from __future__ import annotations

import argparse
import os

from vllm_xpu_exporter.durations import parse_go_duration

EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """Bad input gets one line naming the problem and exit status 2, not the whole usage text."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def absolute_path(value: str) -> str:
    if not os.path.isabs(value):
        raise argparse.ArgumentTypeError(f"want an absolute path, got {value!r}")
    return value


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise argparse.ArgumentTypeError(f"want a positive whole number, got {value!r}")
    return number


def parse_duration(value: str) -> float:
    """A Go duration as the Prometheus tools take them (500ms, 4s, 1m30s), or a bare number of seconds."""
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parse_go_duration(value)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"duration must be positive, got {value!r}")
    return seconds
