"""`vllm-xpu-exporter selfcheck`: on the host it runs on, hold what the exporter reads from one source against
what another says of the same thing, and print, one line per check, what it could verify and what it could not.

Every figure comes from the exporter's own sources, read once: Level Zero through its child process
(`sources.levelzero.worker`), the DRM cards in sysfs (`sources.drm_cards`), the DRM clients' fdinfo
(`sources.procfs`), and the watched units' latest starts from the journal (the planner's reader, over the same
fold as the exporter's). `checks` is pure: it takes those readings and returns the verdicts.

Output (docs/configuration.md, "selfcheck"): a header of `# key: value` lines (the versions), then one line per
check, `VERDICT  CHECK  FIGURES  WHY` (fields apart by two spaces or more; figures `key=value` joined by single
spaces, `-` when none), then a `# summary:` line. Exit status: 0 when no check differs, 1 when one does, 2 on a
bad flag.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import metadata

from vllm_xpu_exporter import __version__, buildinfo
from vllm_xpu_exporter.argparsing import OneLineParser
from vllm_xpu_exporter.fold.engine_starts import UnitView
from vllm_xpu_exporter.logformat import add_log_flags, setup_logging
from vllm_xpu_exporter.flags import (DefaultsHelpFormatter, add_container_flags, add_container_log_flags,
                                     add_journal_containers_flag, add_journal_flags, add_levelzero_flags,
                                     add_procfs_flag, add_sysfs_flag, check_journal_flags)
from vllm_xpu_exporter.planner.cli import read_views
from vllm_xpu_exporter.sources.drm_cards import (I915_LMEM_TOTAL, XE_TILE_VRAM, DrmCard, DrmCardsUnavailable,
                                                 read_drm_cards)
from vllm_xpu_exporter.sources.levelzero.worker import DeviceMemory, LevelZeroUnavailable, LevelZeroWorker
from vllm_xpu_exporter.sources.procfs import DrmClientScanner, ProcfsUnavailable, ScanResult

PROG = "vllm-xpu-exporter selfcheck"
EXIT_AGREES = 0
EXIT_DIFFERS = 1
GiB = 1 << 30
# Intel's user-mode driver reports about 0.95 of the kernel's (Sysman's) total to the core API; outside this
# window one of the two totals is not what it seems
CORE_TO_SYSMAN_RATIO = (0.90, 1.0)
# Two readings of free or used memory taken a moment apart: what a busy GPU may move between them
READINGS_SLACK_RATIO = 0.01
# vLLM prints GiB with two decimals: a printed figure agrees with one within a hundredth of a GiB
PRINTED_GIB_SLACK = GiB // 100
INTEL_DRIVERS = ("i915", "xe")
FDINFO_MEMORY_KERNELS = "i915 and xe print device memory in fdinfo from Linux 6.8 (the generic keys from 6.5)"


class Verdict(StrEnum):
    OK = "ok"  # the two sources agree, within the stated tolerance
    DIFFERS = "differs"  # they do not: one of them is wrong on this host
    UNVERIFIED = "unverified"  # one side could not be read: the line says why


@dataclass(frozen=True)
class Check:
    verdict: Verdict
    name: str
    figures: dict[str, str] = field(default_factory=dict)
    why: str = ""

    def line(self) -> str:
        figures = " ".join(f"{key}={value}" for key, value in self.figures.items()) or "-"
        return f"{self.verdict.value:<10}  {self.name}  {figures}  {self.why}"


@dataclass(frozen=True)
class Readings:
    """What the sources answered; each `*_error` is why its source gave no answer (its value is then empty)."""

    devices: Sequence[DeviceMemory] = ()
    devices_error: str | None = None
    cards: Sequence[DrmCard] = ()
    cards_error: str | None = None
    scan: ScanResult | None = None
    scan_error: str | None = None
    views: Sequence[UnitView] = ()
    views_error: str | None = None
    kernel: str = ""


def gib(value: int) -> str:
    return f"{value / GiB:.3f}GiB"


def ratio(numerator: int, denominator: int) -> str:
    return f"{numerator / denominator:.3f}" if denominator else "-"


def checks(readings: Readings) -> list[Check]:
    return [*levelzero_checks(readings), *sysfs_checks(readings), *fdinfo_checks(readings),
            *vllm_checks(readings)]


def levelzero_checks(readings: Readings) -> list[Check]:
    if readings.devices_error is not None:
        return [Check(Verdict.UNVERIFIED, "levelzero", why=f"Level Zero did not answer: {readings.devices_error}")]
    if not readings.devices:
        return [Check(Verdict.UNVERIFIED, "levelzero", {"devices": "0"}, "Level Zero lists no GPU")]
    found: list[Check] = []
    for device in readings.devices:
        found += [core_total_check(device), free_memory_check(device)]
    return found


def core_total_check(device: DeviceMemory) -> Check:
    """The core API's total (what vLLM multiplies by its utilisation) against Sysman's (the kernel's)."""
    name = f"memory.total[{device.identity.pci_address}]"
    core = device.core.total if device.core is not None else None
    sysman = device.total
    if core is None:
        reason = device.core_error or "the loader took the zesInit path, whose handles the core API does not take"
        return Check(Verdict.UNVERIFIED, name, {"sysman": gib(sysman)} if sysman else {},
                     f"the core API's total was not read: {reason}")
    if not sysman:
        reason = device.error or "no device-local memory module"
        return Check(Verdict.UNVERIFIED, name, {"core": gib(core)}, f"Sysman's total was not read: {reason}")
    figures = {"core": gib(core), "sysman": gib(sysman), "ratio": ratio(core, sysman)}
    low, high = CORE_TO_SYSMAN_RATIO
    if low <= core / sysman <= high:
        return Check(Verdict.OK, name, figures, f"the core total is {low:.2f}-{high:.2f} of Sysman's, as Intel's "
                                                "user-mode driver keeps about 5% back")
    return Check(Verdict.DIFFERS, name, figures, f"the core total should be {low:.2f}-{high:.2f} of Sysman's")


def free_memory_check(device: DeviceMemory) -> Check:
    """Sysman's free memory against the usable-memory extension's (vLLM's free), where each answers."""
    name = f"memory.free[{device.identity.pci_address}]"
    usable = device.core.usable if device.core is not None else None
    free, total = device.free, device.total
    figures = {key: gib(value) for key, value in (("sysman_free", free), ("usable", usable)) if value is not None}
    if free is None or total is None:
        reason = device.error or "no device-local memory module"
        return Check(Verdict.UNVERIFIED, name, figures, f"Sysman's memory state was not read: {reason}")
    if not device.accounting_trusted:
        return Check(Verdict.UNVERIFIED, name, figures,
                     "Sysman reports free == total: the kernel gives real usage only to CAP_PERFMON (run as root)")
    if usable is None:
        return Check(Verdict.UNVERIFIED, name, figures, "the driver does not list the usable-memory extension "
                                                        "(ZE_extension_device_usablemem_size_properties): only "
                                                        "Sysman answers")
    figures["ratio"] = ratio(usable, free)
    if usable <= free + READINGS_SLACK_RATIO * total:
        return Check(Verdict.OK, name, figures, "the usable memory is within Sysman's free, as the user-mode "
                                                "driver keeps part of the total back")
    return Check(Verdict.DIFFERS, name, figures, "the usable-memory extension says more is free than Sysman does")


def sysfs_checks(readings: Readings) -> list[Check]:
    if readings.cards_error is not None:
        return [Check(Verdict.UNVERIFIED, "sysfs.drm", why=readings.cards_error)]
    if not readings.cards and not readings.devices:
        return [Check(Verdict.UNVERIFIED, "sysfs.drm", {"cards": "0"}, "no DRM card in sysfs (no GPU driver loaded)")]
    cards: dict[str, DrmCard] = {}
    for card in readings.cards:  # lowest card first: the GPU's primary one
        if card.pci_address is not None:
            cards.setdefault(card.pci_address, card)
    found: list[Check] = []
    checked: set[str] = set()
    for device in readings.devices:
        address = device.identity.pci_address
        card = cards.get(address)
        if card is None:
            found.append(Check(Verdict.DIFFERS, f"sysfs.driver[{address}]", why="Level Zero lists this GPU, "
                                                                              "sysfs has no DRM card of it"))
            continue
        checked.add(address)
        found += [driver_check(address, card, known_to_levelzero=True), sysfs_memory_check(device, card)]
    unlisted = [card for address, card in cards.items() if address not in checked]
    unlisted += [card for card in readings.cards if card.pci_address is None]
    found += [driver_check(card.pci_address or card.name, card, known_to_levelzero=False,
                           levelzero_error=readings.devices_error) for card in unlisted]
    return found


def driver_check(where: str, card: DrmCard, *, known_to_levelzero: bool, levelzero_error: str | None = None
                 ) -> Check:
    figures = {"card": card.name, "driver": card.driver or "none"}
    if card.vendor_id is not None and card.device_id is not None:
        figures["pci_id"] = f"{card.vendor_id:04x}:{card.device_id:04x}"
    name = f"sysfs.driver[{where}]"
    if not known_to_levelzero:
        why = (f"Level Zero did not answer: {levelzero_error}" if levelzero_error is not None
               else "Level Zero does not list this card's GPU")
        return Check(Verdict.UNVERIFIED, name, figures, why)
    if card.driver in INTEL_DRIVERS:
        return Check(Verdict.OK, name, figures, f"the GPU Level Zero lists is bound to {card.driver}")
    return Check(Verdict.DIFFERS, name, figures, "the GPU Level Zero lists is bound to neither i915 nor xe")


def sysfs_memory_check(device: DeviceMemory, card: DrmCard) -> Check:
    """Sysman's total against the device memory size the kernel exposes in sysfs, where it exposes one."""
    name = f"sysfs.memory[{device.identity.pci_address}]"
    sysman = device.total
    figures = {"sysman": gib(sysman)} if sysman is not None else {}
    if card.memory_bytes is None:
        return Check(Verdict.UNVERIFIED, name, figures,
                     f"{card.driver or 'the driver'} exposes no device memory size in sysfs (neither {XE_TILE_VRAM} "
                     f"nor {I915_LMEM_TOTAL}; upstream i915 and xe give it by ioctl, and in debugfs, not read "
                     "here)")
    figures["sysfs"] = gib(card.memory_bytes)
    if sysman is None:
        return Check(Verdict.UNVERIFIED, name, figures, f"Sysman's total was not read: {device.error}")
    figures["ratio"] = ratio(sysman, card.memory_bytes)
    if CORE_TO_SYSMAN_RATIO[0] * card.memory_bytes <= sysman <= card.memory_bytes:
        return Check(Verdict.OK, name, figures, f"Sysman's total is within the memory sysfs gives "
                                                f"({card.memory_files})")
    return Check(Verdict.DIFFERS, name, figures, f"Sysman's total should be {CORE_TO_SYSMAN_RATIO[0]:.2f}-1.00 of "
                                                 f"the memory sysfs gives ({card.memory_files})")


def fdinfo_checks(readings: Readings) -> list[Check]:
    if readings.scan is None:
        return [Check(Verdict.UNVERIFIED, "fdinfo", why=f"/proc was not read: {readings.scan_error}")]
    scan = readings.scan
    hint = "" if scan.reader_root else " (run as root)"
    unread = f"; processes not read: {scan.unreadable}{hint}" if scan.unreadable else ""
    if not readings.devices:
        why = "Level Zero did not answer" if readings.devices_error is not None else "Level Zero lists no GPU"
        return [Check(Verdict.UNVERIFIED, "fdinfo", {"clients": str(scan.clients)}, f"{why}: nothing to hold the "
                                                                                    f"clients' memory against{unread}")]
    drivers = {card.pci_address: card.driver for card in readings.cards}
    found: list[Check] = []
    for device in readings.devices:
        found.append(fdinfo_used_check(device, scan, readings.kernel, unread))
        address = device.identity.pci_address
        printed, bound = scan.driver_by_device.get(address), drivers.get(address)
        if printed is not None and bound is not None:
            verdict = Verdict.OK if printed == bound else Verdict.DIFFERS
            found.append(Check(verdict, f"fdinfo.driver[{address}]", {"fdinfo": printed, "sysfs": bound},
                               "the clients' drm-driver is the driver sysfs has bound" if verdict is Verdict.OK
                               else "the clients' drm-driver is not the driver sysfs has bound"))
    return found


def fdinfo_used_check(device: DeviceMemory, scan: ScanResult, kernel: str, unread: str) -> Check:
    """The DRM clients' device memory (drm-total-*, else drm-resident-*, of the vram*/local* regions, each
    client once) against the device's used memory as Sysman reports it."""
    address = device.identity.pci_address
    name = f"fdinfo.used[{address}]"
    clients = scan.memory_by_device.get(address)
    figures = {} if clients is None else {"fdinfo": gib(clients)}
    if clients is None:
        return Check(Verdict.UNVERIFIED, name, figures, f"no process holds a DRM client of this GPU{unread}")
    if not scan.memory_keys_seen:
        return Check(Verdict.UNVERIFIED, name, figures, f"the kernel ({kernel}) prints no memory keys in DRM "
                                                        f"fdinfo: {FDINFO_MEMORY_KERNELS}")
    free, total = device.free, device.total
    if free is None or total is None or not device.accounting_trusted:
        return Check(Verdict.UNVERIFIED, name, figures, "Sysman's used memory is not real here (not read, or free "
                                                        "== total without CAP_PERFMON)")
    used = total - free
    figures["sysman_used"] = gib(used)
    if clients <= used + READINGS_SLACK_RATIO * total:
        figures["unattributed"] = gib(max(used - clients, 0))
        return Check(Verdict.OK, name, figures, f"the clients hold no more than the device's used memory (the rest "
                                                f"is the kernel's and the driver's own, or clients not read){unread}")
    return Check(Verdict.DIFFERS, name, figures, f"the clients' fdinfo sums to more than the device's used "
                                                 f"memory{unread}")


def vllm_checks(readings: Readings) -> list[Check]:
    if readings.views_error is not None:
        return [Check(Verdict.UNVERIFIED, "vllm", why=readings.views_error)]
    started = [view for view in readings.views if view.latest is not None and view.latest.engine is not False]
    if not started:
        return [Check(Verdict.UNVERIFIED, "vllm", {"units": "0"},
                      "no watched unit's vLLM start in the journal (--journal.units, --journal.boot)")]
    cores = [device.core.total for device in readings.devices if device.core is not None]
    found: list[Check] = []
    for view in sorted(started, key=lambda view: view.unit):
        assert view.latest is not None
        printed = view.latest.device_total_bytes
        core = core_total_of_unit(printed, cores)
        found += [printed_total_check(view, printed, core, readings), kv_cache_check(view, core, cores)]
    return found


def core_total_of_unit(printed: int | None, cores: Sequence[int]) -> int | None:
    """The core total of the GPU a unit ran on: the only GPU's, else the one nearest the total the unit printed
    (None when it printed none)."""
    if len(cores) == 1:
        return cores[0]
    if printed is None or not cores:
        return None
    return min(cores, key=lambda core: abs(core - printed))


def printed_total_check(view: UnitView, printed: int | None, core: int | None, readings: Readings) -> Check:
    """The device total the unit's latest start printed against the core API's total now."""
    name = f"vllm.total[{view.unit}]"
    assert view.latest is not None
    version = view.latest.version or "unknown"
    if printed is None:
        return Check(Verdict.UNVERIFIED, name, {"vllm": version}, "this start printed no device total (vLLM "
                                                                  "prints it on XPU in 0.9.2-0.15.1 and from 0.26)")
    figures = {"vllm": version, "printed": gib(printed)}
    if core is None:
        return Check(Verdict.UNVERIFIED, name, figures, "the core API's total was not read: "
                                                        f"{readings.devices_error or 'no GPU answered it'}")
    figures["core"] = gib(core)
    if abs(printed - core) <= PRINTED_GIB_SLACK:
        return Check(Verdict.OK, name, figures, "vLLM printed the total Level Zero's core API reports now")
    return Check(Verdict.DIFFERS, name, figures, "vLLM printed a device total Level Zero's core API does not "
                                                 "report now")


def kv_cache_check(view: UnitView, core: int | None, cores: Sequence[int]) -> Check:
    """The KV cache the unit's latest start printed against its gpu_memory_utilization x the core total now."""
    name = f"vllm.kv[{view.unit}]"
    start = view.latest
    assert start is not None
    kv, utilisation = start.kv_cache_bytes, view.gpu_memory_utilization
    figures = {}
    if kv is not None:
        figures["kv"] = gib(kv)
    if utilisation is not None:
        figures["utilisation"] = f"{utilisation:g}"
    if kv is None:
        return Check(Verdict.UNVERIFIED, name, figures, "this start printed no KV cache figure")
    if start.kv_cache_memory_bytes:
        figures["kv_cache_memory_bytes"] = gib(start.kv_cache_memory_bytes)
        return Check(Verdict.UNVERIFIED, name, figures, "the start set --kv-cache-memory-bytes: its KV cache is "
                                                        "that budget, not a share of the total")
    if utilisation is None:
        return Check(Verdict.UNVERIFIED, name, figures, "the start's gpu_memory_utilization is not known")
    if core is None:
        why = ("several GPUs and no device total printed: which one the unit ran on is not known" if cores
               else "the core API's total was not read")
        return Check(Verdict.UNVERIFIED, name, figures, why)
    share = round(utilisation * core)
    figures |= {"share": gib(share), "core": gib(core)}
    if kv <= share + PRINTED_GIB_SLACK:
        return Check(Verdict.OK, name, figures, "the KV cache fits in gpu_memory_utilization x the core total")
    return Check(Verdict.DIFFERS, name, figures, "the KV cache is larger than gpu_memory_utilization x the core "
                                                 "total Level Zero reports now")


# ---------------------------------------------------------------------------------------------------- reading

def read_devices(library: str, timeout: float) -> tuple[list[DeviceMemory], dict[str, str], str | None]:
    """Level Zero's devices' memory, the loader's versions, and why there are none (None: it answered)."""
    worker = LevelZeroWorker(library, timeout, telemetry=False)
    worker.start()
    try:
        return worker.read_memory_when_ready(), worker.loader_versions, None
    except LevelZeroUnavailable as error:
        return [], worker.loader_versions, str(error)
    finally:
        worker.close()


def read_scan(procfs: str) -> tuple[ScanResult | None, str | None]:
    scanner = DrmClientScanner(procfs)
    try:
        return scanner.scan(), None
    except ProcfsUnavailable as error:
        return None, str(error)
    finally:
        scanner.close()


def read_readings(args: argparse.Namespace) -> tuple[Readings, dict[str, str]]:
    devices, loader, devices_error = read_devices(args.levelzero_library, args.levelzero_timeout)
    try:
        cards, cards_error = read_drm_cards(args.sysfs), None
    except DrmCardsUnavailable as error:
        cards, cards_error = [], str(error)
    scan, scan_error = read_scan(args.procfs)
    try:
        views, views_error = read_views(args)[0], None
    except (RuntimeError, OSError) as error:
        views, views_error = [], str(error)
    return Readings(devices, devices_error, cards, cards_error, scan, scan_error, views, views_error,
                    platform.release()), loader


def header(readings: Readings, loader: dict[str, str], library: str) -> list[str]:
    try:
        client = metadata.version("prometheus-client")
    except metadata.PackageNotFoundError:
        client = "not installed"
    components = ", ".join(f"{name} {version}" for name, version in sorted(loader.items()))
    drivers = ", ".join(f"{device.identity.pci_address} {device.identity.driver_version}"
                        for device in readings.devices)
    return [f"# {PROG}",
            f"# exporter: {__version__} (revision {buildinfo.revision()})",
            f"# python: {platform.python_version()}",
            f"# kernel: {readings.kernel}",
            f"# level-zero-loader: {components or 'unknown (it says its version once initialised)'} ({library})",
            f"# level-zero-driver: {drivers or 'unknown'}",
            f"# prometheus-client: {client}"]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG, formatter_class=DefaultsHelpFormatter,
        description="Hold what the exporter reads on this host against a second source (Level Zero's core and "
                    "Sysman totals and free memory, the DRM cards in sysfs, the DRM clients' fdinfo, what the "
                    "watched vLLM units printed at their latest start) and print one line per check: ok, differs "
                    "or unverified, its figures and why; paste it into a report.",
        epilog=f"Exit status: {EXIT_AGREES} when no check differs (unverified ones included), {EXIT_DIFFERS} when "
               "one differs, 2 on a bad flag. Run it as the exporter's user, or as root to read every process and "
               "Sysman's real usage (CAP_PERFMON).")
    add_levelzero_flags(parser)
    journal = add_journal_flags(parser, beyond_max_units="further ones are not checked")
    add_journal_containers_flag(journal)
    add_container_log_flags(parser)
    host = add_procfs_flag(parser)
    add_sysfs_flag(host)
    add_container_flags(host)
    add_log_flags(parser)
    # the report is standard output, and says what could not be read; the sources' own logs only when they warn
    parser.set_defaults(log_level="warn")
    return parser


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_journal_flags(parser, args)
    setup_logging(args.log_level, args.log_format)
    readings, loader = read_readings(args)
    found = checks(readings)
    lines = header(readings, loader, args.levelzero_library) + [check.line() for check in found]
    counts = {verdict: sum(check.verdict is verdict for check in found) for verdict in Verdict}
    lines.append("# summary: " + ", ".join(f"{count} {verdict.value}" for verdict, count in counts.items()))
    sys.stdout.write("\n".join(lines) + "\n")
    return EXIT_DIFFERS if counts[Verdict.DIFFERS] else EXIT_AGREES
