"""DRM fdinfo (`/proc/PID/fdinfo/FD` of a DRM file descriptor): pure functions of its text.

The format is the kernel's `Documentation/gpu/drm-usage-stats.rst`: one `key:<tab>value` per line,
`drm-driver` is mandatory, everything else optional. Memory keys are `drm-<kind>-<region>` where kind
is `total`, `shared`, `resident`, `purgeable`, `active` or the deprecated `memory` (an alias of
resident), and values are `<uint>`, `<uint> KiB` or `<uint> MiB` (bytes by default).

Region names by driver and kernel:
- i915, kernel 6.1 (Debian 12): no memory keys at all.
- i915, 6.8+: `system0`, `local0` (discrete VRAM), `stolen-system0`, `stolen-local0` (some trees print
  `system`, `stolen-system`), so regions are recognised by prefix.
- xe: `system`, `gtt`, `vram0`, `vram1`, `stolen`.

Malformed lines are skipped, never raised on. One anchored, linear regular expression picks the lines
worth a look (an xe fdinfo is mostly engine counters), and each of those costs time bounded by
`MAX_LINE_CHARS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A real fdinfo line is well under 200 characters; longer ones are skipped unparsed.
MAX_LINE_CHARS = 512
# 2**64 - 1 has 20 digits.
MAX_UINT_DIGITS = 20

UNIT_BYTES = {"": 1, "B": 1, "KiB": 1 << 10, "kB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
DEVICE_LOCAL_REGION_PREFIXES = ("vram", "local")  # xe, i915

# drm-<kind>-<region> -> field of RegionMemory. "purgeable" and "active" are not kept.
MEMORY_KINDS = {"total": "total", "shared": "shared", "resident": "resident", "memory": "resident"}
# `drm-total-cycles-<engine>` (xe) is an engine counter that happens to share the `drm-total-` prefix.
NOT_MEMORY_KEY_PREFIXES = ("drm-total-cycles-",)
# The lines parse_fdinfo reads: identity and memory keys, whole lines of at most MAX_LINE_CHARS.
_LINES_OF_INTEREST = re.compile(
    r"^drm-(?:driver|pdev|client-id|total-(?!cycles-)|shared-|resident-|memory-)[^\n]{0,%d}$" % (MAX_LINE_CHARS - 4),
    re.MULTILINE)


@dataclass(frozen=True)
class RegionMemory:
    """One memory region of one DRM client, in bytes; None when the driver printed no such key."""

    total: int | None = None
    resident: int | None = None
    shared: int | None = None


@dataclass(frozen=True)
class DrmClient:
    """What one DRM fd's fdinfo says about its client (the open DRM file, shared by dup'd fds)."""

    driver: str
    pdev: str | None  # PCI address, `0000:03:00.0` form, lower case
    client_id: int | None
    memory: dict[str, RegionMemory]  # region name -> sizes; empty when the kernel prints no memory keys


def parse_fdinfo(text: str) -> DrmClient | None:
    """Parse one fdinfo file; None when it is not a DRM client's (no `drm-driver` key)."""
    driver: str | None = None
    pdev: str | None = None
    client_id: int | None = None
    sizes: dict[str, dict[str, int]] = {}
    deprecated_resident: dict[str, int] = {}
    for line in _LINES_OF_INTEREST.findall(text):
        key, colon, raw_value = line.partition(":")
        if not colon:
            continue
        key = key.strip()
        value = raw_value.strip()
        if key == "drm-driver":
            driver = value or None
        elif key == "drm-pdev":
            pdev = normalise_pci_address(value)
        elif key == "drm-client-id":
            client_id = parse_uint(value)
        elif not key.startswith(NOT_MEMORY_KEY_PREFIXES):
            kind, dash, region = key[len("drm-"):].partition("-")
            field = MEMORY_KINDS.get(kind)
            if field is None or not dash or not region:
                continue
            size = parse_size(value)
            if size is None:
                continue
            if kind == "memory":
                deprecated_resident[region] = size
            else:
                sizes.setdefault(region, {})[field] = size
    if driver is None:
        return None
    for region, size in deprecated_resident.items():
        # drm-resident-<region> wins over its deprecated alias when a kernel prints both.
        sizes.setdefault(region, {}).setdefault("resident", size)
    memory = {region: RegionMemory(**fields) for region, fields in sizes.items()}
    return DrmClient(driver=driver, pdev=pdev, client_id=client_id, memory=memory)


def device_memory_bytes(client: DrmClient) -> int:
    """Device-local (VRAM) memory of the client: the sum over its `vram*` (xe) and `local*` (i915) regions.

    Each region counts its `total` when printed, else its `resident`. `total` is what the kernel's
    generic printer always emits, and what Level Zero's own per-process figure (compute-runtime sums
    `drm-total-vram*`) and nvtop report, so the numbers agree with `xpu-smi ps`. It counts buffers
    placed in the region (resident or not) and includes `shared` ones, so a buffer imported by a
    second client counts in both clients.
    """
    bytes_ = 0
    for region, sizes in client.memory.items():
        if region.startswith(DEVICE_LOCAL_REGION_PREFIXES):
            size = sizes.total if sizes.total is not None else sizes.resident
            bytes_ += size or 0
    return bytes_


def has_memory_keys(client: DrmClient) -> bool:
    """True when the kernel prints per-client memory at all (i915 on kernel 6.1 does not)."""
    return bool(client.memory)


def parse_uint(text: str) -> int | None:
    """A decimal unsigned integer of at most 20 ASCII digits, else None."""
    if not text or len(text) > MAX_UINT_DIGITS or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


def parse_size(text: str) -> int | None:
    """`<uint>`, `<uint> KiB`, `<uint> MiB` (also `GiB`, `kB`) in bytes; None when malformed."""
    number, _, unit = text.partition(" ")
    multiplier = UNIT_BYTES.get(unit.strip())
    value = parse_uint(number)
    if multiplier is None or value is None:
        return None
    return value * multiplier


def normalise_pci_address(text: str) -> str | None:
    """`0000:03:00.0` form, lower case, from `0000:03:00.0`, `03:00.0` (domain 0) or the spec's
    `0000:03.00.0` spelling; None when the text is not a PCI address."""
    text = text.strip().lower()
    if len(text) > 32:
        return None
    parts = text.split(":")
    if len(parts) == 3:
        domain, bus, device_function = parts
    elif len(parts) == 2 and parts[1].count(".") == 2:
        domain, (bus, device_function) = parts[0], parts[1].split(".", 1)
    elif len(parts) == 2:
        domain, bus, device_function = "0", parts[0], parts[1]
    else:
        return None
    device, dot, function = device_function.partition(".")
    if not dot:
        return None
    fields = (domain, bus, device, function)
    if not all(field and field.isascii() and is_hex(field) for field in fields):
        return None
    domain_n, bus_n, device_n, function_n = (int(field, 16) for field in fields)
    if domain_n > 0xFFFFFFFF or bus_n > 0xFF or device_n > 0x1F or function_n > 7:
        return None
    return f"{domain_n:04x}:{bus_n:02x}:{device_n:02x}.{function_n:x}"


def is_hex(text: str) -> bool:
    return all(character in "0123456789abcdef" for character in text)
