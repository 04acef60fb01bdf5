"""The argparse pieces every command line of the package shares, importing nothing of the package: so the
gate's client (`vllm-xpu-gate wait`, run at every gated start) parses its flags without loading the
sources that `flags.py` defines the exporter's flags with."""

from __future__ import annotations

import argparse
import os

EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """Bad input gets one line naming the problem and exit status 2, not the whole usage text."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def absolute_path(value: str) -> str:
    if not os.path.isabs(value):
        raise argparse.ArgumentTypeError(f"want an absolute path, got {value!r}")
    return value
