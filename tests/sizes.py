"""Byte sizes in the binary units drivers, fdinfo and vLLM print: GiB and MiB, and `gib()` / `mib()`
for a figure printed with decimals ("3.25 GiB" is round(3.25 x 2**30) bytes)."""

from __future__ import annotations

GiB = 1 << 30
MiB = 1 << 20


def gib(value: float) -> int:
    return round(value * GiB)


def mib(value: float) -> int:
    return round(value * MiB)
