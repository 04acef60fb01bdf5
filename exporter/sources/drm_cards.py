"""The DRM cards as sysfs shows them (`<sysfs>/class/drm/cardN`): the PCI function each card belongs to, the
kernel driver bound to it (`i915`, `xe`), the function's PCI vendor and device ids, and the device memory size
where the kernel exposes one.

Upstream i915 and xe expose no device memory size in sysfs: both give it through an ioctl, and in debugfs as text
that changes between kernels, which is not read here. Intel's out-of-tree i915 backport has
`cardN/lmem_total_bytes`, and xe trees that have it give each tile's `device/tileN/physical_vram_size_bytes`. Both
are read where they exist, and the card says which it found.

Plain files and links, read once per call; `--path.sysfs` points it at a host's /sys mounted elsewhere (libudev,
which `vllm_xpu_exporter.sources.udev` uses, only takes the real /sys). From a shell:
`python -m vllm_xpu_exporter.sources.drm_cards [/sys]`.
"""

from __future__ import annotations

import glob
import os
import re
import sys
from dataclasses import dataclass

from vllm_xpu_exporter.pci import is_sysfs_pci_address
from vllm_xpu_exporter.sources.procfs import read_text

CLASS_DRM = "class/drm"
_CARD = re.compile(r"card[0-9]+")
MAX_ATTRIBUTE_BYTES = 4096
# Where a kernel exposes the device memory's size, relative to the card's directory
XE_TILE_VRAM = "device/tile*/physical_vram_size_bytes"
I915_LMEM_TOTAL = "lmem_total_bytes"


class DrmCardsUnavailable(Exception):
    """`<sysfs>/class/drm` cannot be listed; `str(error)` says why in one line."""


@dataclass(frozen=True)
class DrmCard:
    name: str  # "card1"
    pci_address: str | None  # "0000:03:00.0"; None: the card has no PCI parent
    driver: str | None  # the kernel driver bound to the PCI function; None: none bound
    vendor_id: int | None
    device_id: int | None
    memory_bytes: int | None = None  # the device memory size the kernel exposes; None: it exposes none
    memory_files: str | None = None  # which files gave it (XE_TILE_VRAM, I915_LMEM_TOTAL)


def read_drm_cards(sysfs: str = "/sys") -> list[DrmCard]:
    """Every cardN under `<sysfs>/class/drm`, by name; [] when there is no such directory (no DRM driver
    loaded). Raises DrmCardsUnavailable when it exists and cannot be listed."""
    directory = os.path.join(sysfs, CLASS_DRM)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as error:
        raise DrmCardsUnavailable(f"cannot list {directory}: {error.strerror}") from None
    cards = sorted((name for name in names if _CARD.fullmatch(name)), key=lambda name: int(name[4:]))
    return [_card(os.path.join(directory, name), name) for name in cards]


def _card(path: str, name: str) -> DrmCard:
    device = os.path.join(path, "device")
    function = os.path.basename(os.path.realpath(device))
    pci_address = function.lower() if is_sysfs_pci_address(function) else None
    try:
        driver: str | None = os.path.basename(os.readlink(os.path.join(device, "driver")))
    except OSError:  # no driver bound (or no such card any more)
        driver = None
    memory_bytes, memory_files = _memory(path)
    return DrmCard(name, pci_address, driver, _integer(os.path.join(device, "vendor"), 16),
                   _integer(os.path.join(device, "device"), 16), memory_bytes, memory_files)


def _memory(path: str) -> tuple[int | None, str | None]:
    for pattern in (XE_TILE_VRAM, I915_LMEM_TOTAL):
        sizes = [_integer(file, 0) for file in sorted(glob.glob(os.path.join(glob.escape(path), pattern)))]
        known = [size for size in sizes if size is not None]
        if known:
            return sum(known), pattern
    return None, None


def _attribute(path: str) -> str | None:
    try:
        return read_text(path, MAX_ATTRIBUTE_BYTES).strip()
    except OSError:
        return None


def _integer(path: str, base: int) -> int | None:
    """The attribute as a number (`base` 16: "0x8086"; 0: a decimal or 0x-prefixed size), None when unreadable."""
    text = _attribute(path)
    try:
        return int(text, base) if text is not None else None
    except ValueError:
        return None


def main(argv: list[str]) -> int:
    try:
        cards = read_drm_cards(argv[0] if argv else "/sys")
    except DrmCardsUnavailable as error:
        print(error, file=sys.stderr)
        return 1
    for card in cards:
        print(card)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
