"""DRM fdinfo parsing over the texts the xe and i915 kernels print (the drm-usage-stats keys and the drivers' own)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_xpu_exporter.parsers.fdinfo import (
    MAX_BYTES,
    MAX_LINE_CHARS,
    DrmClient,
    EngineUse,
    RegionMemory,
    device_memory_bytes,
    parse_engine_use,
    parse_fdinfo,
)
from fakeprocfs import i915_fdinfo, xe_fdinfo

pytestmark = pytest.mark.fast  # the pure core (pyproject.toml's markers; `pytest -m fast`)

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

# The xe example of the kernel's drm-usage-stats documentation (6.12), with a real fdinfo's head.
XE_DOC = """\
pos:\t0
flags:\t02100002
mnt_id:\t26
ino:\t685
drm-driver:\txe
drm-client-id:\t3
drm-pdev:\t0000:03:00.0
drm-total-system:\t0
drm-shared-system:\t0
drm-active-system:\t0
drm-resident-system:\t0
drm-purgeable-system:\t0
drm-total-gtt:\t192 KiB
drm-shared-gtt:\t0
drm-active-gtt:\t0
drm-resident-gtt:\t192 KiB
drm-total-vram0:\t23992 KiB
drm-shared-vram0:\t16 MiB
drm-active-vram0:\t0
drm-resident-vram0:\t23992 KiB
drm-total-stolen:\t0
drm-shared-stolen:\t0
drm-active-stolen:\t0
drm-resident-stolen:\t0
drm-cycles-rcs:\t28257900
drm-total-cycles-rcs:\t7655183225
drm-cycles-bcs:\t0
drm-total-cycles-bcs:\t7655183225
drm-cycles-ccs:\t9843211
drm-total-cycles-ccs:\t7655183225
drm-engine-capacity-ccs:\t4
"""

# i915 on kernel 6.1 (Debian 12): the driver prints identity and engines only.
I915_61 = """\
pos:\t0
flags:\t02100002
mnt_id:\t26
ino:\t685
drm-driver:\ti915
drm-pdev:\t0000:03:00.0
drm-client-id:\t42
drm-engine-render:\t9288864723 ns
drm-engine-copy:\t2035071108 ns
drm-engine-video:\t0 ns
drm-engine-capacity-video:\t2
drm-engine-video-enhance:\t0 ns
drm-engine-compute:\t0 ns
"""

# i915 on kernel 6.12 (discrete): regions from intel_memory_region.c, keys from drm_print_memory_stats
# with RESIDENT|PURGEABLE; system0 as in the proc(5) patch's example.
I915_612 = """\
pos:\t0
flags:\t02100002
mnt_id:\t26
ino:\t685
drm-driver:\ti915
drm-client-id:\t118
drm-pdev:\t0000:03:00.0
drm-total-system0:\t6044 KiB
drm-shared-system0:\t0
drm-active-system0:\t0
drm-resident-system0:\t6044 KiB
drm-purgeable-system0:\t1688 KiB
drm-total-local0:\t1536 MiB
drm-shared-local0:\t0
drm-active-local0:\t0
drm-resident-local0:\t1024 MiB
drm-purgeable-local0:\t0
drm-total-stolen-system0:\t0
drm-shared-stolen-system0:\t0
drm-active-stolen-system0:\t0
drm-resident-stolen-system0:\t0
drm-purgeable-stolen-system0:\t0
drm-total-stolen-local0:\t8 MiB
drm-shared-stolen-local0:\t0
drm-active-stolen-local0:\t0
drm-resident-stolen-local0:\t8 MiB
drm-purgeable-stolen-local0:\t0
drm-engine-render:\t0 ns
drm-engine-copy:\t0 ns
drm-engine-video:\t0 ns
drm-engine-video-enhance:\t0 ns
drm-engine-compute:\t215876391 ns
"""

# Kernels 5.19-6.4 style (amdgpu and others): only the deprecated drm-memory-<region>, plain bytes.
DEPRECATED_MEMORY_KEYS = """\
drm-driver:\tamdgpu
drm-pdev:\t0000:0c:00.0
drm-client-id:\t5
drm-memory-vram:\t65536
drm-memory-gtt:\t4096 KiB
"""

NOT_DRM = "pos:\t0\nflags:\t0100002\nmnt_id:\t25\nino:\t4242\n"

PARSE_CASES = [
    pytest.param(XE_DOC, DrmClient("xe", "0000:03:00.0", 3, {
        "system": RegionMemory(total=0, resident=0, shared=0),
        "gtt": RegionMemory(total=192 * KiB, resident=192 * KiB, shared=0),
        "vram0": RegionMemory(total=23992 * KiB, resident=23992 * KiB, shared=16 * MiB),
        "stolen": RegionMemory(total=0, resident=0, shared=0),
    }), 23992 * KiB, id="xe-6.12-doc-example"),
    pytest.param(I915_61, DrmClient("i915", "0000:03:00.0", 42, {}), 0, id="i915-6.1-no-memory-keys"),
    pytest.param(I915_612, DrmClient("i915", "0000:03:00.0", 118, {
        "system0": RegionMemory(total=6044 * KiB, resident=6044 * KiB, shared=0),
        "local0": RegionMemory(total=1536 * MiB, resident=1024 * MiB, shared=0),
        "stolen-system0": RegionMemory(total=0, resident=0, shared=0),
        "stolen-local0": RegionMemory(total=8 * MiB, resident=8 * MiB, shared=0),
    }), 1536 * MiB, id="i915-6.12-local0"),
    pytest.param(DEPRECATED_MEMORY_KEYS, DrmClient("amdgpu", "0000:0c:00.0", 5, {
        "vram": RegionMemory(resident=65536),
        "gtt": RegionMemory(resident=4096 * KiB),
    }), 65536, id="deprecated-drm-memory-is-resident"),
]


@pytest.mark.parametrize(("text", "client", "device_memory"), PARSE_CASES)
def test_parse_fdinfo_reads_identity_and_memory_in_bytes(text: str, client: DrmClient, device_memory: int):
    parsed = parse_fdinfo(text)
    assert parsed == client
    assert device_memory_bytes(parsed) == device_memory


def test_fd_without_drm_driver_is_not_a_drm_client():
    assert parse_fdinfo(NOT_DRM) is None
    assert parse_fdinfo("") is None
    assert parse_fdinfo("drm-driver:\t\ndrm-client-id:\t3\n") is None


def test_kernel_61_i915_has_no_memory_keys_and_6_12_has():
    assert not parse_fdinfo(I915_61).memory
    assert parse_fdinfo(I915_612).memory
    assert parse_fdinfo(XE_DOC).memory


def test_xe_total_cycles_keys_are_engine_counters_not_memory():
    client = parse_fdinfo(XE_DOC)
    assert not any(region.startswith("cycles") for region in client.memory)


def test_xe_engine_use_is_cycles_and_total_cycles_by_engine_key():
    assert parse_engine_use(XE_DOC) == EngineUse(
        busy_seconds={},
        cycles={"rcs": 28257900, "bcs": 0, "ccs": 9843211},
        total_cycles={"rcs": 7655183225, "bcs": 7655183225, "ccs": 7655183225})


def test_i915_busy_time_is_seconds_divided_by_the_engine_capacity_when_given():
    use = parse_engine_use(I915_61)
    assert use.busy_seconds == {"render": 9.288864723, "copy": 2.035071108, "video": 0.0,
                                "video-enhance": 0.0, "compute": 0.0}
    assert (use.cycles, use.total_cycles) == ({}, {})
    halved = parse_engine_use("drm-driver:\ti915\ndrm-engine-video:\t3000000000 ns\n"
                              "drm-engine-capacity-video:\t2\n")
    assert halved.busy_seconds == {"video": 1.5}


def test_malformed_engine_lines_are_skipped_and_the_rest_is_read():
    use = parse_engine_use("drm-driver:\ti915\ndrm-engine-render:\tlots ns\ndrm-engine-copy:\t-5 ns\n"
                           "drm-cycles-rcs:\t" + "9" * 21 + "\ndrm-engine-capacity-copy:\t0\n"
                           "drm-engine-video:\t7 ms\ndrm-engine-compute:\t2000000000 ns\n")
    assert use == EngineUse(busy_seconds={"compute": 2.0}, cycles={}, total_cycles={})


def test_memory_only_fdinfo_has_no_engine_use():
    assert parse_engine_use(DEPRECATED_MEMORY_KEYS) == EngineUse({}, {}, {})


def test_resident_key_wins_over_its_deprecated_alias():
    client = parse_fdinfo("drm-driver:\txe\ndrm-memory-vram0:\t1 MiB\ndrm-resident-vram0:\t2 MiB\n")
    assert client.memory["vram0"] == RegionMemory(resident=2 * MiB)
    client = parse_fdinfo("drm-driver:\txe\ndrm-resident-vram0:\t2 MiB\ndrm-memory-vram0:\t1 MiB\n")
    assert client.memory["vram0"] == RegionMemory(resident=2 * MiB)


@pytest.mark.parametrize(("text", "expected"), [
    ("drm-driver:\txe\ndrm-total-vram0:\t4 MiB\ndrm-resident-vram0:\t1 MiB\n", 4 * MiB),
    ("drm-driver:\txe\ndrm-resident-vram0:\t1 MiB\n", 1 * MiB),
    ("drm-driver:\txe\ndrm-total-vram0:\t1 MiB\ndrm-total-vram1:\t2 MiB\n", 3 * MiB),
    ("drm-driver:\ti915\ndrm-total-local0:\t1 MiB\ndrm-total-local1:\t2 MiB\n", 3 * MiB),
    ("drm-driver:\txe\ndrm-total-system:\t1 MiB\ndrm-total-gtt:\t1 MiB\ndrm-total-stolen:\t1 MiB\n", 0),
    ("drm-driver:\ti915\ndrm-total-system0:\t1 MiB\ndrm-total-stolen-local0:\t1 MiB\n", 0),
    ("drm-driver:\txe\ndrm-shared-vram0:\t1 MiB\n", 0),
], ids=["total-preferred-over-resident", "resident-when-no-total", "xe-vram-regions-summed",
        "i915-local-regions-summed", "xe-system-gtt-stolen-not-device-memory",
        "i915-system-and-stolen-local-not-device-memory", "shared-alone-is-not-a-size"])
def test_device_memory_counts_only_vram_and_local_regions(text: str, expected: int):
    assert device_memory_bytes(parse_fdinfo(text)) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("65536", 65536), ("0", 0), ("23992 KiB", 23992 * KiB), ("16 MiB", 16 * MiB), ("3 GiB", 3 * GiB),
    ("7 kB", 7 * KiB), ("1048576 GiB", 2**50), ("1125899906842624", 2**50),
    ("1048577 GiB", None), ("18446744073709551615", None), ("", None), ("KiB", None), ("12 TiB", None), ("-5", None), ("1.5 MiB", None), ("twelve", None),
    ("0x10", None), ("١٢", None), ("1 MiB extra", None), ("123456789012345678901", None),
], ids=lambda value: repr(value))
def test_a_size_is_read_in_its_unit_and_a_malformed_or_implausible_one_is_skipped(text: str, expected: int | None):
    client = parse_fdinfo(f"drm-driver:\txe\ndrm-pdev:\t0000:03:00.0\ndrm-client-id:\t1\ndrm-total-vram0:\t{text}\n")
    region = client.memory.get("vram0")
    assert (region.total if region is not None else None) == expected


def test_malformed_lines_are_skipped_and_the_rest_is_parsed():
    text = (
        "drm-driver:\txe\n"
        "drm-client-id:\tseven\n"
        "drm-pdev:\tnot-an-address\n"
        "drm-total-vram0 23992 KiB\n"  # no colon
        "drm-total-vram0:\ttwelve KiB\n"
        "drm-total-vram0:\t12 TiB\n"
        "drm-total-:\t5\n"  # no region
        "drm-bogus-vram0:\t5\n"
        "drm-resident-vram0:\t2 MiB\n"
        "\x00\xff garbage \t::::\n"
    )
    assert parse_fdinfo(text) == DrmClient("xe", None, None, {"vram0": RegionMemory(resident=2 * MiB)})


def test_a_size_over_a_pebibyte_is_skipped_and_the_region_keeps_its_other_figures():
    text = ("drm-driver:\txe\ndrm-pdev:\t0000:03:00.0\n"
            "drm-total-vram0:\t99999999999999999999 GiB\n"  # 20 digits: 1.07e29 bytes
            "drm-resident-vram0:\t11 GiB\n"
            "drm-memory-vram1:\t18446744073709551615\n"  # 2**64 - 1 bytes
            "drm-total-local0:\t1048576 GiB\n")  # exactly 1 PiB: kept
    client = parse_fdinfo(text)
    assert client.memory == {"vram0": RegionMemory(resident=11 * GiB), "local0": RegionMemory(total=MAX_BYTES)}
    assert device_memory_bytes(client) == 11 * GiB + MAX_BYTES


def test_overlong_line_is_skipped():
    long_value = "9" * MAX_LINE_CHARS
    client = parse_fdinfo(f"drm-driver:\txe\ndrm-total-vram0:\t{long_value}\ndrm-total-vram1:\t1 KiB\n")
    assert client.memory == {"vram1": RegionMemory(total=KiB)}


def test_huge_input_parses_in_linear_time():
    # A million-digit value (int() would refuse it) and 100k junk lines: parsed quickly, no exception.
    text = "drm-driver:\txe\n" + "drm-total-vram0:\t" + "9" * 1_000_000 + "\n" + "drm-x:\t:" * 100_000 + "\n"
    started = time.perf_counter()
    client = parse_fdinfo(text)
    assert time.perf_counter() - started < 2.0
    assert client == DrmClient("xe", None, None, {})


fdinfo_lines = st.one_of(
    st.text(max_size=80),
    st.builds(lambda kind, engine, value: f"drm-{kind}-{engine}:\t{value}",
              st.sampled_from(["engine", "engine-capacity", "cycles", "total-cycles"]),
              st.text(max_size=12), st.text(max_size=24)),
    st.builds(lambda kind, region, value: f"drm-{kind}-{region}:\t{value}",
              st.sampled_from(["total", "shared", "resident", "memory", "active", "purgeable", "total-cycles"]),
              st.text(max_size=12), st.text(max_size=24)),
    st.builds(lambda key, value: f"{key}:{value}",
              st.sampled_from(["drm-driver", "drm-pdev", "drm-client-id"]), st.text(max_size=24)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(fdinfo_lines, max_size=30))
def test_parse_fdinfo_never_raises_and_sizes_are_non_negative(lines: list[str]):
    client = parse_fdinfo("\n".join(lines))
    if client is not None:
        assert client.driver
        assert device_memory_bytes(client) >= 0
        for sizes in client.memory.values():
            assert all(size is None or 0 <= size <= MAX_BYTES for size in (sizes.total, sizes.resident, sizes.shared))
    use = parse_engine_use("\n".join(lines))
    assert all(value >= 0 for counters in (use.busy_seconds, use.cycles, use.total_cycles)
               for value in counters.values())


def test_engine_counters_in_other_than_ascii_digits_are_skipped():
    use = parse_engine_use("drm-cycles-rcs:\t\u0661\u0662\ndrm-total-cycles-rcs:\t7\ndrm-engine-render:\t\u0663 ns\n")
    assert (use.cycles, use.total_cycles, use.busy_seconds) == ({}, {"rcs": 7}, {})
