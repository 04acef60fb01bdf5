"""PCI addresses, the `device` label of every GPU series: one spelling, `0000:03:00.0`, lower case.

Level Zero gives the address as numbers, DRM fdinfo and udev as text; both go through this module so
that the same GPU gets the same label whichever source saw it.
"""

from __future__ import annotations

import functools

MAX_DOMAIN = 0xFFFFFFFF  # 4 hex digits usually, more behind Intel VMD (10000:e1:00.0)
MAX_BUS = 0xFF
MAX_DEVICE = 0x1F
MAX_FUNCTION = 7
_HEX_DIGITS = frozenset("0123456789abcdef")


def format_pci_address(domain: int, bus: int, device: int, function: int) -> str:
    """The PCI address in sysfs form, lower case: ``0000:03:00.0``."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


@functools.lru_cache(maxsize=256)
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
    if not all(field and _HEX_DIGITS.issuperset(field) for field in fields):
        return None
    domain_n, bus_n, device_n, function_n = (int(field, 16) for field in fields)
    if domain_n > MAX_DOMAIN or bus_n > MAX_BUS or device_n > MAX_DEVICE or function_n > MAX_FUNCTION:
        return None
    return format_pci_address(domain_n, bus_n, device_n, function_n)


def is_sysfs_pci_address(text: str) -> bool:
    """True for a PCI address spelled as sysfs names a PCI device (`0000:03:00.0`, any case), False for
    the other spellings `normalise_pci_address` accepts and for anything else."""
    return normalise_pci_address(text) == text.lower()
