"""A client's fdinfo read again through the layout learnt from its first read (FdinfoLayout): every later read
is what the general parsers read, or the layout declines it. The long property run over random layouts and their
changed reads is no `fast` test (pyproject.toml's markers); the others are."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_xpu_exporter.parsers.fdinfo import (
    MAX_LAYOUT_LINES,
    MAX_LINE_CHARS,
    DrmClient,
    EngineUse,
    FdinfoLayout,
    parse_engine_use,
    parse_fdinfo,
)
from fakeprocfs import i915_fdinfo, xe_fdinfo
from test_parsers_fdinfo import DEPRECATED_MEMORY_KEYS, I915_61, I915_612, XE_DOC, MiB


def general_parse(data: bytes) -> tuple[DrmClient | None, EngineUse]:
    text = data.decode("utf-8", "replace")
    return parse_fdinfo(text), parse_engine_use(text)


def layout_parse(layout: FdinfoLayout, data: bytes) -> tuple[DrmClient | None, EngineUse] | None:
    """What `layout` reads of `data`, in the general parsers' types; None when it does not match."""
    read = layout.read(data)
    if read is None:
        return None
    client, captured = read
    busy, cycles, total_cycles = layout.engine_columns([captured])
    return client, EngineUse({engine: value for engine, (value,) in busy},
                             {engine: value for engine, (value,) in cycles},
                             {engine: value for engine, (value,) in total_cycles})


def with_other_numbers(text: str) -> str:
    """`text` with every number after a key's colon changed (keys such as `vram0` kept)."""
    def change(line: str) -> str:
        key, colon, value = line.partition(":")
        return key + colon + re.sub(r"\d+", lambda number: str(int(number[0]) * 3 + 7), value)
    return "\n".join(change(line) for line in text.split("\n"))


REAL_FDINFO = [XE_DOC, I915_61, I915_612, DEPRECATED_MEMORY_KEYS,
               xe_fdinfo(client_id=5, vram0=3 * MiB, cycles={"ccs": 99}),
               i915_fdinfo(client_id=6, local0=2 * MiB, busy_ns={"render": 5 * 10**9}, capacity={"render": 2})]


@pytest.mark.fast
@pytest.mark.parametrize("text", REAL_FDINFO)
def test_a_layout_reads_later_reads_of_its_client_as_the_general_parsers_do(text: str):
    layout = FdinfoLayout.learn(text)
    assert layout is not None
    for later in (text, with_other_numbers(text), with_other_numbers(with_other_numbers(text))):
        assert layout_parse(layout, later.encode()) == general_parse(later.encode())


@pytest.mark.fast
@pytest.mark.parametrize("changed", [
    XE_DOC + "drm-cycles-vcs:\t5\n",  # an engine line added
    XE_DOC.replace("drm-cycles-bcs:\t0\n", ""),  # one removed
    XE_DOC.replace("drm-cycles-bcs:\t0", "drm-cycles-bcs:\tlots"),  # malformed
    XE_DOC.replace("drm-cycles-bcs:\t0", "drm-cycles-bcs:\t" + "9" * 21),  # over 20 digits
    XE_DOC.replace("drm-cycles-bcs:\t0", "drm-cycles-bcs: 0 ns"),  # other spacing and unit
    XE_DOC.replace("drm-active-gtt:\t0", "drm-cycles-gtt:\t0"),  # another line now an engine line
    XE_DOC.replace("drm-total-gtt:\t192 KiB", "drm-total-gtt:\t" + "9" * MAX_LINE_CHARS),  # overlong
    XE_DOC.replace("drm-cycles-bcs:\t0", "drm-cycles-bcs:\t\u0663"),  # a digit, but not ASCII
    XE_DOC.rstrip("\n"),  # the last line unterminated
], ids=["engine-line-added", "engine-line-removed", "malformed-number", "too-many-digits", "other-spacing",
        "other-line-now-engine-line", "overlong-line", "non-ascii-digit", "unterminated"])
def test_a_layout_reads_a_text_with_other_lines_the_general_way_or_not_at_all(changed: str):
    layout = FdinfoLayout.learn(XE_DOC)
    read = layout_parse(layout, changed.encode())
    assert read is None or read == general_parse(changed.encode())


@pytest.mark.fast
def test_a_layout_does_not_take_lines_it_did_not_learn():
    layout = FdinfoLayout.learn(XE_DOC)
    assert layout.read((XE_DOC + "drm-cycles-vcs:\t5\n").encode()) is None
    assert layout.read(XE_DOC.replace("drm-cycles-bcs:\t0", "drm-cycles-bcs:\tlots").encode()) is None
    assert layout.read(XE_DOC.replace("drm-active-gtt:\t0", "drm-cycles-gtt:\t0").encode()) is None


@pytest.mark.fast
@pytest.mark.parametrize("line", ["drm-cycles-bcs:\t0", "drm-total-cycles-rcs:\t7655183225",
                                  "drm-engine-capacity-ccs:\t4"])
def test_a_malformed_engine_line_learnt_is_not_read_as_another_line_once_well_formed(line: str):
    key, _, _ = line.partition("\t")
    malformed = XE_DOC.replace(line, key + "\tlots")
    layout = FdinfoLayout.learn(malformed)
    assert layout_parse(layout, malformed.encode()) == general_parse(malformed.encode())
    assert layout.read(XE_DOC.encode()) is None  # the line counts now: not the layout's


@pytest.mark.fast
def test_a_layout_is_learnt_from_ascii_texts_of_whole_lines_only():
    assert FdinfoLayout.learn(XE_DOC.replace("drm-driver:\txe", "drm-driver:\tx\u00e9")) is None
    assert FdinfoLayout.learn(XE_DOC.rstrip("\n")) is None
    assert FdinfoLayout.learn("drm-driver:\txe\n" + "x:\t1\n" * MAX_LAYOUT_LINES) is None
    assert FdinfoLayout.learn("drm-driver:\txe\n" + "x" * (MAX_LINE_CHARS + 1) + ":\t1\n") is None


@pytest.mark.fast
def test_a_layout_sums_engine_columns_of_several_reads_in_their_order():
    text = i915_fdinfo(client_id=1, busy_ns={"render": 10**9, "video": 3 * 10**9}, capacity={"video": 2})
    layout = FdinfoLayout.learn(text)
    reads = [layout.read(with_other_numbers(text).encode())[1], layout.read(text.encode())[1]]
    busy, cycles, total_cycles = layout.engine_columns(reads)
    uses = [parse_engine_use(with_other_numbers(text)), parse_engine_use(text)]
    assert {engine: list(seconds) for engine, seconds in busy} == {
        engine: [use.busy_seconds[engine] for use in uses] for engine in uses[0].busy_seconds}
    assert (cycles, total_cycles) == ([], [])


layout_keys = st.sampled_from([
    "drm-driver", "drm-pdev", "drm-client-id", "drm-total-vram0", "drm-shared-gtt", "drm-resident-system",
    "drm-memory-vram0", "drm-active-vram0", "drm-purgeable-system", "drm-cycles-rcs", "drm-total-cycles-rcs",
    "drm-engine-render", "drm-engine-capacity-render", "drm-engine-video", "drm-engine-capacity-video",
    "drm-total-cycles-", "drm-engine-", "drm-total-", "pos", "flags", "drm-x"])
ascii_text = st.text(st.characters(max_codepoint=127), max_size=16)
numbers = st.one_of(st.integers(0, 10**6), st.integers(0, 10**21)).map(str)
layout_values = st.one_of(
    ascii_text, numbers,
    st.builds("{}{}".format, numbers, st.sampled_from(["", " ns", "  ns ", "\tns", " KiB", " ms", " "])))
layout_lines = st.one_of(
    st.builds("{}{}{}".format, st.one_of(layout_keys, ascii_text), st.sampled_from([":\t", ": ", ":", "\t", ""]),
              layout_values),
    st.builds("drm-{}-{}:\t{}{}".format, st.sampled_from(["engine", "engine-capacity", "cycles", "total-cycles"]),
              st.sampled_from(["rcs", "ccs", "render", "video"]), numbers, st.sampled_from(["", " ns"])),
    ascii_text)


@st.composite
def changed_lines(draw, lines: list[str]) -> bytes:
    """`lines` after a client's next read: numbers changed (mostly), lines replaced, added or removed,
    bytes broken."""
    changes = ["same", "number"] if draw(st.booleans()) else ["same", "number", "value", "line", "gone", "added"]
    changed = []
    for line in lines:
        key, colon, value = line.partition(":")
        change = draw(st.sampled_from(changes))
        if change == "number":
            changed.append(key + colon + re.sub(r"\d+", lambda _: draw(numbers), value))
        elif change == "value":
            changed.append(key + colon + draw(st.sampled_from(["\t", " ", ""])) + draw(layout_values))
        elif change == "line":
            changed.append(draw(layout_lines))
        elif change != "gone":
            changed.append(line)
        if change == "added":
            changed.append(draw(layout_lines))
    data = ("\n".join(changed) + draw(st.sampled_from(["\n", "\n", ""]))).encode()
    if draw(st.integers(0, 3)) == 0:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xc3", "\u0663".encode()])) + data[at:]
    return data


@settings(max_examples=500, deadline=None)
@given(st.lists(layout_lines, min_size=1, max_size=25), st.data())
def test_a_layout_never_reads_a_text_otherwise_than_the_general_parsers(lines: list[str], data):
    text = "\n".join(lines) + "\n"
    layout = FdinfoLayout.learn(text)
    if layout is None:
        assert not text.isascii() or len(text.split("\n")) > MAX_LAYOUT_LINES or \
            any(len(line) > MAX_LINE_CHARS for line in lines)
        return
    assert layout_parse(layout, text.encode()) == general_parse(text.encode())
    later = data.draw(changed_lines(lines))
    read = layout_parse(layout, later)
    assert read is None or read == general_parse(later)
