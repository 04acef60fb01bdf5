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

Malformed lines are skipped, never raised on, and so are sizes over `MAX_BYTES` (a 20-digit figure in
GiB would otherwise be 10**29 bytes). One anchored regular expression picks the lines of
interest (an xe fdinfo is mostly engine counters), another without nested repetition splits each of
them; lines over `MAX_LINE_CHARS` are skipped, so the time is linear in the text. The parse of the
picked lines is cached: they seldom change between reads, while the engine counters always do.

Engine keys (`parse_engine_use`, read on every read, uncached): `drm-engine-<engine>: <uint> ns` (busy
time; i915 and most drivers), `drm-engine-capacity-<engine>: <uint>` (how many engines of the class the
busy time is counted over), and xe's `drm-cycles-<engine>` / `drm-total-cycles-<engine>`. `<engine>`
is the driver's own key (`render`, `copy`, `video`, `video-enhance`, `compute` on i915; `rcs`, `bcs`,
`vcs`, `vecs`, `ccs` on xe).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from exporter.pci import normalise_pci_address

# A real fdinfo line is well under 200 characters; longer ones are skipped unparsed.
MAX_LINE_CHARS = 512
# 2**64 - 1 has 20 digits.
MAX_UINT_DIGITS = 20
# 1 PiB: far above any device's memory (the grammar of vLLM's lines uses the same bound).
MAX_BYTES = 1 << 50

UNIT_BYTES = {"": 1, "B": 1, "KiB": 1 << 10, "kB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
DEVICE_LOCAL_REGION_PREFIXES = ("vram", "local")  # xe, i915

# drm-<kind>-<region> -> field of RegionMemory. "purgeable" and "active" are not kept.
MEMORY_KINDS = {"total": "total", "shared": "shared", "resident": "resident", "memory": "resident"}
# The lines parse_fdinfo looks at: identity and memory keys (not xe's engine counters
# `drm-total-cycles-<engine>`), whole lines of at most MAX_LINE_CHARS. Matched in "\n" + text: a literal
# first character lets the regex engine jump from line to line (twice as fast as `^` with MULTILINE).
_LINES_OF_INTEREST = re.compile(
    r"\ndrm-(?:driver:|pdev:|client-id:|total-(?!cycles-)|shared-|resident-|memory-)[^\n]{0,%d}$"
    % (MAX_LINE_CHARS - 14), re.MULTILINE)
# One such line split into its parts: identity keys, and memory keys with a well-formed size (not xe's
# engine counter `drm-total-cycles-<engine>`, which shares the `drm-total-` prefix). No nested repetition.
_LINE = re.compile(
    r"drm-(?:"
    r"(?P<ident>driver|pdev|client-id):[ \t]*(?P<value>[^\n]{0,%d}?)"
    r"|(?P<kind>total|shared|resident|memory)-(?!cycles-)(?P<region>[^:\s]{1,64}):"
    r"[ \t]*(?P<number>\d{1,%d})(?:[ \t]+(?P<unit>KiB|MiB|GiB|kB|B))?"
    r")[ \t]*" % (MAX_LINE_CHARS, MAX_UINT_DIGITS))

# The engine lines: `drm-engine-<engine>: <uint> ns`, `drm-engine-capacity-<engine>: <uint>`,
# `drm-cycles-<engine>: <uint>`, `drm-total-cycles-<engine>: <uint>`. Capacity lines match as engine
# `capacity-<engine>`; the unit (` ns`) is optional so they do. Linear: no nested repetition.
_ENGINE_LINE = re.compile(
    r"\ndrm-(engine|cycles|total-cycles)-([^:\s]{1,64}):[ \t]*(\d{1,%d})(?:[ \t]+ns)?[ \t]*$"
    % MAX_UINT_DIGITS, re.MULTILINE)
_CAPACITY_PREFIX = "capacity-"


@dataclass(frozen=True)
class EngineUse:
    """The engine counters of one DRM client, by the driver's engine key; empty when it prints none."""

    busy_seconds: Mapping[str, float]  # drm-engine-<engine> / drm-engine-capacity-<engine> (1 when not given)
    cycles: Mapping[str, int]  # xe's drm-cycles-<engine>
    total_cycles: Mapping[str, int]  # xe's drm-total-cycles-<engine>


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
    memory: Mapping[str, RegionMemory]  # region name -> sizes; empty when the kernel prints no memory keys

    @functools.cached_property
    def device_memory(self) -> int:
        """`device_memory_bytes(self)`, worked out once: parse_fdinfo returns the same client for the same
        lines, read after read."""
        return device_memory_bytes(self)


def parse_fdinfo(text: str) -> DrmClient | None:
    """Parse one fdinfo file; None when it is not a DRM client's (no `drm-driver` key)."""
    # A busy client's fdinfo changes on every read (engine counters), the lines read here seldom do.
    return _parse_lines(tuple(_LINES_OF_INTEREST.findall("\n" + text)))


@functools.lru_cache(maxsize=1024)
def _parse_lines(lines: tuple[str, ...]) -> DrmClient | None:
    driver: str | None = None
    pdev: str | None = None
    client_id: int | None = None
    sizes: dict[str, dict[str, int]] = {}
    deprecated_resident: dict[str, int] = {}
    for line in lines:
        match = _LINE.fullmatch(line, 1)  # after the "\n" the line was matched with
        if match is None:
            continue
        ident, kind = match["ident"], match["kind"]
        if ident == "driver":
            driver = match["value"] or None
        elif ident == "pdev":
            pdev = normalise_pci_address(match["value"])
        elif ident == "client-id":
            client_id = parse_uint(match["value"])
        elif kind is not None:
            size = int(match["number"]) * UNIT_BYTES[match["unit"] or ""]
            if size > MAX_BYTES:
                continue
            if kind == "memory":
                deprecated_resident[match["region"]] = size
            else:
                sizes.setdefault(match["region"], {})[MEMORY_KINDS[kind]] = size
    if driver is None:
        return None
    for region, size in deprecated_resident.items():
        # drm-resident-<region> wins over its deprecated alias when a kernel prints both.
        sizes.setdefault(region, {}).setdefault("resident", size)
    memory = MappingProxyType({region: RegionMemory(**fields) for region, fields in sizes.items()})
    return DrmClient(driver=driver, pdev=pdev, client_id=client_id, memory=memory)


def parse_engine_use(text: str) -> EngineUse:
    """The engine counters of one fdinfo file (see the module's docstring); malformed lines are skipped."""
    busy_ns: dict[str, int] = {}
    capacity: dict[str, int] = {}
    cycles: dict[str, int] = {}
    total_cycles: dict[str, int] = {}
    for kind, engine, number in _ENGINE_LINE.findall("\n" + text):
        if kind == "engine":
            if engine.startswith(_CAPACITY_PREFIX):
                capacity[engine[len(_CAPACITY_PREFIX):]] = int(number)
            else:
                busy_ns[engine] = int(number)
        elif kind == "cycles":
            cycles[engine] = int(number)
        else:
            total_cycles[engine] = int(number)
    busy_seconds = {engine: ns / 1e9 / (capacity.get(engine) or 1) for engine, ns in busy_ns.items()}
    return EngineUse(busy_seconds=busy_seconds, cycles=cycles, total_cycles=total_cycles)


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
    """`<uint>`, `<uint> KiB`, `<uint> MiB` (also `GiB`, `kB`) in bytes; None when malformed or over
    `MAX_BYTES`."""
    number, _, unit = text.partition(" ")
    multiplier = UNIT_BYTES.get(unit.strip())
    value = parse_uint(number)
    if multiplier is None or value is None or value * multiplier > MAX_BYTES:
        return None
    return value * multiplier
