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

Reading a client again (`FdinfoLayout`): a client prints the same lines in the same order on every read,
only the values change. `FdinfoLayout.learn` turns the lines of one read into one regular expression
over the raw bytes: each engine line with its key written out and its number captured, each run of
lines `parse_fdinfo` reads captured whole, and every other line matched by its key alone. One match of
it gives what the two passes over the text give, in about a third of the time; the parse of the captured
runs is cached like `parse_fdinfo`'s (they seldom change). Each element matches only lines the two
passes would treat the same way, so a read the layout matches parses exactly as the text would; a
read it does not match (a line added, removed or malformed) is parsed the general way.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from vllm_xpu_exporter.pci import normalise_pci_address

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
    r"[ \t]*(?P<number>[0-9]{1,%d})(?:[ \t]+(?P<unit>KiB|MiB|GiB|kB|B))?"
    r")[ \t]*" % (MAX_LINE_CHARS, MAX_UINT_DIGITS))

# The engine lines: `drm-engine-<engine>: <uint> ns`, `drm-engine-capacity-<engine>: <uint>`,
# `drm-cycles-<engine>: <uint>`, `drm-total-cycles-<engine>: <uint>`. Capacity lines match as engine
# `capacity-<engine>`; the unit (` ns`) is optional so they do. Linear: no nested repetition.
_ENGINE_LINE = re.compile(
    r"\ndrm-(engine|cycles|total-cycles)-([^:\s]{1,64}):[ \t]*([0-9]{1,%d})(?:[ \t]+ns)?[ \t]*$"
    % MAX_UINT_DIGITS, re.MULTILINE)
_CAPACITY_PREFIX = "capacity-"


@dataclass(frozen=True)
class EngineUse:
    """The engine counters of one DRM client, by the driver's engine key; empty when it prints none."""

    busy_seconds: Mapping[str, float]  # drm-engine-<engine> / drm-engine-capacity-<engine> (1 when not given)
    cycles: Mapping[str, int]  # xe's drm-cycles-<engine>
    total_cycles: Mapping[str, int]  # xe's drm-total-cycles-<engine>

    def columns(self) -> EngineColumns:
        """The counters as the EngineColumns of one client."""
        return ([(engine, (value,)) for engine, value in self.busy_seconds.items()],
                [(engine, (value,)) for engine, value in self.cycles.items()],
                [(engine, (value,)) for engine, value in self.total_cycles.items()])


# The engine counters of one or more clients (EngineUse's busy seconds, cycles, total cycles), each as
# (engine, the values of the clients in their order) pairs.
EngineColumns = tuple[list[tuple[str, Iterable[float]]], list[tuple[str, Iterable[int]]],
                      list[tuple[str, Iterable[int]]]]


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
    counters: dict[str, dict[str, int]] = {_BUSY_NS: {}, _CAPACITY: {}, _CYCLES: {}, _TOTAL_CYCLES: {}}
    for kind, engine, number in _ENGINE_LINE.findall("\n" + text):
        counter, engine = _engine_counter(kind, engine)
        counters[counter][engine] = int(number)
    capacity = counters[_CAPACITY]
    busy_seconds = {engine: ns / 1e9 / (capacity.get(engine) or 1) for engine, ns in counters[_BUSY_NS].items()}
    return EngineUse(busy_seconds=busy_seconds, cycles=counters[_CYCLES], total_cycles=counters[_TOTAL_CYCLES])


_BUSY_NS, _CAPACITY, _CYCLES, _TOTAL_CYCLES = "busy_ns", "capacity", "cycles", "total_cycles"


def _engine_counter(kind: str, engine: str) -> tuple[str, str]:
    """Which counter of which engine an engine line (`drm-<kind>-<engine>`) gives."""
    if kind == "engine":
        if engine.startswith(_CAPACITY_PREFIX):
            return _CAPACITY, engine[len(_CAPACITY_PREFIX):]
        return _BUSY_NS, engine
    return (_CYCLES if kind == "cycles" else _TOTAL_CYCLES), engine


# FdinfoLayout.learn takes texts of at most this many lines (a real fdinfo has 20 to 60).
MAX_LAYOUT_LINES = 256
# The starts of the lines parse_fdinfo reads (_LINES_OF_INTEREST), and of all the lines either parser may
# read. A layout matches a line by its key (`<key>:` and anything) only when the key starts with none.
_STARTS_OF_INTEREST = ("drm-driver:", "drm-pdev:", "drm-client-id:", "drm-total-", "drm-shared-", "drm-resident-",
                       "drm-memory-")
_READ_STARTS = (*_STARTS_OF_INTEREST, "drm-engine-", "drm-cycles-")
_ANY_REST = rb"[^\n]*\n"


class FdinfoLayout:
    """The lines of one DRM client's fdinfo as one regular expression over the bytes of a read (see the
    module's docstring): `read` a client's fdinfo, then take the `engine_columns` of clients read.

    Each line of the text learnt from is one element, matching only lines the general parsers treat the
    same way: an engine line written out with its number captured (the same key, spacing and unit:
    `_ENGINE_LINE` reads such a line, and that number); a line parse_fdinfo may read matched by its key
    (`drm-total-vram0:` and anything), consecutive ones captured as one run (the runs hold all the lines
    parse_fdinfo may read, and parse_fdinfo of the runs checks them as it checks the whole text); any
    other line matched by its key, unless that key may begin a line either parser reads (then written
    out whole: a malformed engine line with another number may be a well-formed one)."""

    __slots__ = ("_pattern", "_runs", "_numbers", "_count", "_busy", "_cycles", "_total_cycles")

    def __init__(self, elements: tuple[tuple, ...]) -> None:
        parts: list[bytes] = []
        groups = 0
        runs: list[int] = []
        counters: dict[tuple[str, str], int] = {}  # (counter, engine) -> group of its last line
        in_run = False
        for kind, pattern, *counter in elements:
            if kind == _OF_INTEREST and not in_run:
                parts.append(b"(")
                runs.append(groups)
                groups += 1
            elif kind != _OF_INTEREST and in_run:
                parts.append(b")")
            in_run = kind == _OF_INTEREST
            parts.append(pattern)
            if kind == _ENGINE:
                counters[tuple(counter)] = groups  # type: ignore[index]
                groups += 1
        if in_run:
            parts.append(b")")
        self._pattern = re.compile(b"".join(parts))
        self._runs = _tuple_getter(runs)
        # The numbers engine_columns reads of each client: the last line of each counter of each engine
        # (of capacities, those of engines with a busy time).
        counters = {(counter, engine): group for (counter, engine), group in counters.items()
                    if counter != _CAPACITY or (_BUSY_NS, engine) in counters}
        self._numbers = _tuple_getter(list(counters.values()))
        self._count = len(counters)
        position = {counter: index for index, counter in enumerate(counters)}
        self._busy = tuple((engine, index, position.get((_CAPACITY, engine)))
                           for (counter, engine), index in position.items() if counter == _BUSY_NS)
        self._cycles = tuple((engine, index) for (counter, engine), index in position.items() if counter == _CYCLES)
        self._total_cycles = tuple((engine, index) for (counter, engine), index in position.items()
                                   if counter == _TOTAL_CYCLES)

    @staticmethod
    def learn(text: str) -> FdinfoLayout | None:
        """The layout of `text`, one read of a client's fdinfo; None when it is not worth one: not ASCII,
        not ending in a newline, over MAX_LAYOUT_LINES lines, or with a key, or a line written out whole,
        over MAX_LINE_CHARS."""
        if not text.endswith("\n") or not text.isascii() or text.count("\n") > MAX_LAYOUT_LINES:
            return None
        elements: list[tuple] = []
        for line in text[:-1].split("\n"):
            engine_line = _ENGINE_LINE.fullmatch("\n" + line)
            if engine_line is not None:
                start, end = engine_line.span(3)
                pattern = b"%s(\\d{1,%d})%s\n" % (re.escape(line[:start - 1].encode()), MAX_UINT_DIGITS,
                                                  re.escape(line[end - 1:].encode()))
                elements.append((_ENGINE, pattern, *_engine_counter(engine_line[1], engine_line[2])))
                continue
            key, colon, _ = line.partition(":")
            key += colon
            of_interest = line.startswith(_STARTS_OF_INTEREST) and not line.startswith("drm-total-cycles-")
            by_key = colon and (of_interest or not key.startswith(_READ_STARTS))
            written = key if by_key else line
            if len(written) > MAX_LINE_CHARS:
                return None
            elements.append((_OF_INTEREST if of_interest else _OTHER,
                             re.escape(written.encode()) + (_ANY_REST if by_key else b"\n")))
        return _layout(tuple(elements))

    def read(self, data: bytes) -> tuple[DrmClient | None, tuple[bytes, ...]] | None:
        """`parse_fdinfo` of `data` (a read of a client's fdinfo, as bytes), and what the layout captures of
        it for `engine_columns`; None when the lines of `data` are not the layout's."""
        match = self._pattern.fullmatch(data)
        if match is None:
            return None
        captured = match.groups()
        return _parse_runs(self._runs(captured)), captured

    def engine_columns(self, reads: list[tuple[bytes, ...]]) -> EngineColumns:
        """`parse_engine_use` of the texts `read`s came from (given what they captured), by engine."""
        count = self._count
        # numbers[index::count]: one counter of every client read
        numbers = list(map(int, itertools.chain.from_iterable(map(self._numbers, reads))))
        busy = [(engine, [ns / 1e9 for ns in numbers[index::count]] if capacity is None else
                 [ns / 1e9 / (engines or 1) for ns, engines in zip(numbers[index::count], numbers[capacity::count])])
                for engine, index, capacity in self._busy]
        return (busy, [(engine, numbers[index::count]) for engine, index in self._cycles],
                [(engine, numbers[index::count]) for engine, index in self._total_cycles])


# The kinds of layout elements: (_ENGINE, pattern, counter, engine), (_OF_INTEREST, pattern), (_OTHER, pattern).
_ENGINE, _OF_INTEREST, _OTHER = "engine", "of-interest", "other"


@functools.lru_cache(maxsize=64)
def _layout(elements: tuple[tuple, ...]) -> FdinfoLayout:
    return FdinfoLayout(elements)


@functools.lru_cache(maxsize=1024)
def _parse_runs(runs: tuple[bytes, ...]) -> DrmClient | None:
    return parse_fdinfo(b"".join(runs).decode("utf-8", "replace"))


def _tuple_getter(indices: list[int]) -> Callable[[tuple], tuple]:
    """operator.itemgetter, returning a tuple for any number of indices."""
    if len(indices) == 1:
        index = indices[0]
        return lambda items: (items[index],)
    return operator.itemgetter(*indices) if indices else lambda items: ()


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


def parse_uint(text: str) -> int | None:
    """A decimal unsigned integer of at most 20 ASCII digits, else None."""
    if not text or len(text) > MAX_UINT_DIGITS or not (text.isascii() and text.isdigit()):
        return None
    return int(text)
