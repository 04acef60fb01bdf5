"""`dmem.current` of a cgroup (the kernel's dmem controller, Linux 6.14+): pure functions of its text.

The kernel (`kernel/cgroup/dmem.c`, `dmemcg_limit_show`) prints one line per registered region, in
every cgroup, whether the cgroup uses the region or not: `<region> <bytes>`, one space between, the
bytes in decimal (`max` for a value at the page counter's limit, which a usage never reaches). The
usage counts the cgroup and its descendants. DRM drivers name their regions `drm/<device>/<name>`:
xe registers each tile's VRAM as `drm/0000:03:00.0/vram0`, `vram1`, … (and stolen memory as
`drm/0000:03:00.0/stolen`, which is not device-local memory here).

Unlike fdinfo, where a kernel prints many keys of its own and a line the exporter does not know is
skipped, the whole file has this one form: a line that is not `<region> <bytes>`, or a figure over
`MAX_BYTES`, makes the file malformed (`DmemFormatError`), and none of its figures is used.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from vllm_xpu_exporter.parsers.fdinfo import MAX_BYTES, MAX_UINT_DIGITS
from vllm_xpu_exporter.pci import normalise_pci_address

# A real line is well under 100 characters (`drm/` + a PCI address + `/vram0` + 20 digits).
MAX_LINE_CHARS = 256
MAX_REGIONS = 256  # regions a file may list; a host has a few per GPU
DRM_REGION_PREFIX = "drm/"
VRAM_REGION_PREFIX = "vram"

_LINE = re.compile(r"(\S{1,%d}) (\d{1,%d})" % (MAX_LINE_CHARS, MAX_UINT_DIGITS))


class DmemFormatError(ValueError):
    """The text is not a `dmem.current` file; the message says where (one line)."""


def parse_dmem_current(text: str) -> dict[str, int]:
    """Region name -> bytes in use by the cgroup and its descendants; raises DmemFormatError."""
    regions: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if number > MAX_REGIONS:
            raise DmemFormatError(f"more than {MAX_REGIONS} regions")
        if len(line) > MAX_LINE_CHARS:
            raise DmemFormatError(f"line {number} is longer than {MAX_LINE_CHARS} characters")
        match = _LINE.fullmatch(line)
        if match is None:
            raise DmemFormatError(f"line {number} is not '<region> <bytes>': {line[:64]!r}")
        region, value = match[1], int(match[2])
        if value > MAX_BYTES:
            raise DmemFormatError(f"line {number}: {value} bytes for {region} is over the plausible {MAX_BYTES}")
        if region in regions:
            raise DmemFormatError(f"line {number}: region {region} listed twice")
        regions[region] = value
    return regions


def vram_by_device(regions: Mapping[str, int]) -> dict[str, int]:
    """PCI address -> bytes of its `drm/<device>/vram<N>` regions, summed, for every device that has such a
    region listed (0 when listed with 0 bytes). Other regions (stolen memory, other subsystems') are not
    device-local memory and are left out."""
    devices: dict[str, int] = {}
    for region, value in regions.items():
        if not region.startswith(DRM_REGION_PREFIX):
            continue
        device, slash, name = region[len(DRM_REGION_PREFIX):].partition("/")
        if not slash or not name.startswith(VRAM_REGION_PREFIX) or not _is_number(name[len(VRAM_REGION_PREFIX):]):
            continue
        pci = normalise_pci_address(device)
        if pci is not None:
            devices[pci] = devices.get(pci, 0) + value
    return devices


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()
