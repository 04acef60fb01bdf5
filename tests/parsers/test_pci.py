"""PCI addresses: the one spelling of the `device` label, from Level Zero's numbers and from fdinfo and udev text."""

from __future__ import annotations

import pytest

from vllm_xpu_exporter.pci import format_pci_address, is_sysfs_pci_address, normalise_pci_address

pytestmark = pytest.mark.fast  # the pure core (pyproject.toml's markers; `pytest -m fast`)


def test_format_pci_address_is_lower_case_sysfs_form() -> None:
    assert format_pci_address(0, 0x83, 0, 0) == "0000:83:00.0"
    assert format_pci_address(0x10000, 0xAB, 0x1F, 7) == "10000:ab:1f.7"


@pytest.mark.parametrize(("text", "expected"), [
    ("0000:03:00.0", "0000:03:00.0"),
    ("0000:0A:1f.7", "0000:0a:1f.7"),
    ("03:00.0", "0000:03:00.0"),
    ("0000:03.00.0", "0000:03:00.0"),
    ("10000:e1:00.0", "10000:e1:00.0"),
    (" 0000:03:00.0 ", "0000:03:00.0"),
    ("0000:03:00", None), ("0000:100:00.0", None), ("0000:03:20.0", None), ("0000:03:00.8", None),
    ("pci-0000:03:00.0", None), ("", None), ("0000:03:00.0:1", None), ("zzzz:03:00.0", None),
    ("0000:0٣:00.0", None),
], ids=lambda value: repr(value))
def test_pci_address_is_normalised_or_rejected(text: str, expected: str | None) -> None:
    assert normalise_pci_address(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("0000:03:00.0", True), ("0000:0A:1F.7", True), ("10000:e1:00.0", True),
    ("03:00.0", False), ("0000:03.00.0", False), (" 0000:03:00.0", False), ("000:03:00.0", False),
    ("pci0000:00", False), ("card1", False), ("1-1:1.0", False), ("0:0:0:0", False),
], ids=lambda value: repr(value))
def test_only_the_sysfs_spelling_names_a_pci_device_in_a_sysfs_path(text: str, expected: bool) -> None:
    assert is_sysfs_pci_address(text) is expected
