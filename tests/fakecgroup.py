"""Builds a fake cgroup v2 tree in a directory, laid out like the kernel's, for the dmem source.

    base/sys/fs/cgroup/                      the root: cgroup.controllers (with dmem), dmem.capacity
    base/sys/fs/cgroup/system.slice/x.service/
        cgroup.procs, memory.current, ...    what every cgroup directory holds besides
        dmem.current                         `<region> <bytes>` lines, when the dmem controller is on there

`sysfs` is what to pass as --path.sysfs. The layout is the host's: a process that the exporter sees
from another cgroup namespace has a `/proc/PID/cgroup` path with leading `..` elements
(`0::/../system.slice/x.service`, tests/fakeprocfs.py writes it), while the tree here stays the host's.

`dmem_current` writes the text the kernel prints (kernel/cgroup/dmem.c): one line per registered
region, in every cgroup, 0 for a region the cgroup does not use; xe registers each VRAM tile as
`drm/<pci address>/vram<N>` and its stolen memory as `drm/<pci address>/stolen`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

# What the kernel puts in every non-root cgroup directory besides the dmem files (a few of them).
OTHER_FILES = {"cgroup.procs": "", "cgroup.type": "domain\n", "cgroup.events": "populated 1\nfrozen 0\n",
               "memory.current": "12345678\n", "pids.current": "3\n"}


def xe_regions(pci: str, vram0: int = 0, vram1: int | None = None, stolen: int = 0) -> dict[str, int]:
    """The regions xe registers for one GPU (vram1 only for a GPU of two tiles), with bytes in use."""
    regions = {f"drm/{pci}/vram0": vram0}
    if vram1 is not None:
        regions[f"drm/{pci}/vram1"] = vram1
    regions[f"drm/{pci}/stolen"] = stolen
    return regions


def dmem_current(regions: Mapping[str, int]) -> str:
    """A dmem.current (or dmem.capacity) text: `<region> <bytes>` per region."""
    return "".join(f"{region} {value}\n" for region, value in regions.items())


class FakeCgroupTree:
    """A fake cgroup v2 mount at `base/sys/fs/cgroup` whose dmem controller knows `capacity`'s regions."""

    def __init__(self, base: Path, capacity: Mapping[str, int]) -> None:
        self.sysfs = Path(base) / "sys"
        self.root = self.sysfs / "fs" / "cgroup"
        self.root.mkdir(parents=True)
        self.regions = tuple(capacity)
        (self.root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc dmem\n")
        (self.root / "cgroup.subtree_control").write_text("cpu io memory pids dmem\n")
        (self.root / "dmem.capacity").write_text(dmem_current(capacity))

    def directory(self, path: str) -> Path:
        return self.root / path.strip("/")

    def add_cgroup(self, path: str, dmem: Mapping[str, int] | None = None) -> Path:
        """A cgroup (and its parents); with `dmem`, its dmem.current lists every registered region, those
        not in `dmem` at 0. Without it the cgroup has no dmem.current (the controller is off there)."""
        directory = self.directory(path)
        current = self.root
        for element in path.strip("/").split("/"):
            current = current / element
            if not current.is_dir():
                current.mkdir()
                for name, text in OTHER_FILES.items():
                    (current / name).write_text(text)
        if dmem is not None:
            self.set_dmem(path, dmem)
        return directory

    def set_dmem(self, path: str, dmem: Mapping[str, int]) -> None:
        self.write_dmem_text(path, dmem_current({region: dmem.get(region, 0) for region in self.regions}
                                               | dict(dmem)))

    def write_dmem_text(self, path: str, text: str | bytes) -> None:
        """Any text (or bytes) as the cgroup's dmem.current: for malformed and hostile files."""
        target = self.directory(path) / "dmem.current"
        if isinstance(text, bytes):
            target.write_bytes(text)
        else:
            target.write_text(text)

    def remove_dmem(self, path: str) -> None:
        """The dmem controller is switched off for the cgroup (or the cgroup goes): no dmem.current."""
        (self.directory(path) / "dmem.current").unlink()
