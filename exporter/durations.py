"""Durations written as Go writes them (time.ParseDuration), as the Prometheus tools and the exporter-toolkit
web config take them: "250ms", "4s", "1m30s", "1.5h"; "0" alone is zero."""

from __future__ import annotations

import re

_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration; ValueError for anything else (no sign, no bare number but "0")."""
    text = text.strip()
    if text == "0":
        return 0.0
    if not text or _PART.sub("", text):
        raise ValueError(f"invalid duration {text!r} (e.g. 250ms, 4s, 1m30s)")
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _PART.findall(text))
