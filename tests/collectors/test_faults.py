"""The fault matrix: the exporter as a real process running all three collectors — levelzero over the fake
driver, journal over a real journal directory, processes over a fixture procfs — with one fault at a time.

For every fault: the exporter stays up and serves, the collectors that do not read the faulty source keep
reporting success 1 with their series, the failing one reports 0 (and says why on stderr), and all of them
report again once the fault ends.
"""

from __future__ import annotations

import dataclasses
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from exporterproc import REPO, RunningExporter
from fakeprocfs import FakeProcfs, i915_61_fdinfo, xe_fdinfo
from fakeze import A770, B580, FakeConfig, fake_driver_env, write_config
from journalgen import (Clock, append_journal, current_boot_id, rotate_journal, unit_output, write_big_journal,
                        write_journal)
from polling import wait_for
from scrapes import Samples, parse_samples, sample
from sizes import GiB
from taskslimit import TaskLimit
from vllmlogs import chat_runs, unit_start

from vllm_xpu_exporter.sources.levelzero.worker import LevelZeroUnavailable, LevelZeroWorker

CHAT = "vllm-xpu-chat.service"
DEVICE_A, DEVICE_B = A770.pci_address, B580.pci_address
HEALTHY = FakeConfig(devices=(A770, B580))
COLLECTORS = ("levelzero", "processes", "journal")
LEVELZERO_ONLY = frozenset({"levelzero"})
DEVICE_FAMILIES = ("xpu_device_info", "xpu_memory_total_bytes", "xpu_memory_free_bytes", "xpu_memory_used_bytes",
                   "xpu_memory_accounting_trusted")
IDENTITY_AND_TOTAL = frozenset({"xpu_device_info", "xpu_memory_total_bytes"})

LEVELZERO_TIMEOUT_S = 1.0  # --levelzero.timeout where a driver call hangs (elsewhere the default, 4 s)
SCRAPE_MARGIN_S = 3.0  # the bound is "within its timeout"; this is the allowance for a slow CI machine
EXIT_DEADLINE_S = 2.0  # SIGTERM to exit, as the issue demands
RECOVERY_S = 25.0  # deadline for a state after a fault ends (Level Zero retries back off: 1, 2, 4 s ...)

BIG_JOURNAL_ENTRIES = 200_000
BIG_JOURNAL_VERSION = 1  # bump when the generated journal changes, so the cache is rebuilt

FAILED, STARTED = chat_runs()  # CHAT's starts: kv_cache_too_small, then up
RESTARTED = dataclasses.replace(STARTED, main_pid=STARTED.main_pid + 1)  # up again, in new processes


# ------------------------------------------------------------------------------------------ the host

@dataclass
class Host:
    """What the exporter under test reads: the fake driver and its config, a journal directory, a procfs."""

    driver: Path
    config_path: Path
    journal_dir: Path
    procfs: FakeProcfs
    clock: Clock

    def configure(self, config: FakeConfig) -> None:
        write_config(self.config_path, config)

    def exporter(self, *args: str, journal_dir: Path | None = None, command: list[str] | None = None,
                 env: dict[str, str] | None = None) -> RunningExporter:
        """The exporter with all collectors (and the default --levelzero.timeout unless `args` set it)."""
        return RunningExporter(["--path.procfs", str(self.procfs.root),
                                "--journal.directory", str(journal_dir or self.journal_dir), *args],
                               env={**fake_driver_env(self.driver, self.config_path), **(env or {})},
                               command=command)


def build_host(tmp_path: Path, driver: Path, config_path: Path, fdinfo_memory_keys: bool = True) -> Host:
    """Two GPUs (A770: 3 GiB used by CHAT's two processes, B580: 1 GiB used), CHAT's journal with one failed and
    one good start, and CHAT's processes 1000/1001 holding A770 memory: with xe fdinfo memory figures, or with
    kernel 6.1 i915 fdinfo (no memory keys), so that Level Zero's process list is the per-unit source."""
    write_config(config_path, HEALTHY)
    clock = Clock(current_boot_id())
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    write_journal(journal_dir / "system.journal", unit_start(CHAT, FAILED, clock) + unit_start(CHAT, STARTED, clock))
    procfs = FakeProcfs(tmp_path / "host")
    for pid, client, memory in ((1000, 1, 2 * GiB), (1001, 2, GiB)):
        process = procfs.add_unit_process(pid, f"/system.slice/{CHAT}")
        process.add_drm_fd(xe_fdinfo(client_id=client, vram0=memory) if fdinfo_memory_keys
                           else i915_61_fdinfo(client_id=client))
        process.add_other_fds(3)
    return Host(driver, config_path, journal_dir, procfs, clock)


@pytest.fixture
def host(tmp_path: Path, fake_driver: Path, config_path: Path) -> Host:
    return build_host(tmp_path, fake_driver, config_path)


# ------------------------------------------------------------------------------------ what is reported

def success(samples: Samples) -> dict[str, float | None]:
    return {name: sample(samples, "xpu_exporter_collector_success", collector=name) for name in COLLECTORS}


def device_families(samples: Samples, device: str) -> set[str]:
    """The levelzero collector's families that have a series of the device."""
    return {name for name, labels in samples if name in DEVICE_FAMILIES and ("device", device) in labels}


def series_present(samples: Samples, collector: str, *, starts: int = 1,
                   devices: tuple[str, ...] = (DEVICE_A, DEVICE_B)) -> bool:
    """The collector's figures of the fixture host are in the scrape, with their values."""
    if collector == "levelzero":
        expected = {DEVICE_A: 3 * GiB, DEVICE_B: GiB}
        return all(sample(samples, "xpu_memory_used_bytes", device=device) == expected[device] for device in devices)
    if collector == "processes":
        return sample(samples, "xpu_unit_memory_bytes", device=DEVICE_A, unit=CHAT) == 3 * GiB
    return (sample(samples, "xpu_unit_engine_init_failures_total", unit=CHAT, reason="kv_cache_too_small") == 1
            and sample(samples, "xpu_unit_engine_starts_total", unit=CHAT) == starts)


def reporting(samples: Samples, collector: str, **expected: Any) -> bool:
    return success(samples)[collector] == 1 and series_present(samples, collector, **expected)


def all_reporting(samples: Samples, **journal: Any) -> bool:
    return all(reporting(samples, name, **(journal if name == "journal" else {})) for name in COLLECTORS)


def scrape_until(exporter: RunningExporter, state: Callable[[Samples], bool], what: str,
                 timeout: float = RECOVERY_S) -> Samples:
    """The first scrape in which `state` holds; fails naming `what`, with the last scrape's success and stderr."""
    last: list[Samples] = [{}]

    def check() -> Samples | None:
        last[0] = exporter.scrape()
        return last[0] if state(last[0]) else None

    found = wait_for(check, timeout=timeout)
    assert found, f"never {what}: last success {success(last[0])}\n{exporter.stderr}"
    return found


def assert_isolated(samples: Samples, failing: frozenset[str], absent_devices: tuple[str, ...] = (),
                    partly_read: Mapping[str, frozenset[str]] | None = None) -> None:
    """The failing collectors report 0, every other one reports 1 with its series, the devices that
    cannot be read have no series at all, and those read in part only the families of what was read (no
    stale numbers)."""
    assert {name for name, value in success(samples).items() if value == 0} == failing, success(samples)
    for name in set(COLLECTORS) - failing:
        assert reporting(samples, name), f"{name} stopped reporting: {success(samples)}"
    for device in absent_devices:
        assert not device_families(samples, device), f"stale series of {device}"
    for device, kept in (partly_read or {}).items():
        assert device_families(samples, device) == kept, f"{device} should have only {sorted(kept)}"


def fault_holds(failing: frozenset[str]) -> Callable[[Samples], bool]:
    def state(samples: Samples) -> bool:
        values = success(samples)
        return all(values[name] == (0 if name in failing else 1) for name in COLLECTORS)
    return state


def timed_scrape(exporter: RunningExporter) -> tuple[float, Samples]:
    started = time.monotonic()
    samples = exporter.scrape()
    return time.monotonic() - started, samples


# ---------------------------------------------------------------------------------- Level Zero faults

@dataclass(frozen=True)
class LevelZeroFault:
    name: str
    config: FakeConfig  # the fake driver's config while the fault lasts
    absent_devices: tuple[str, ...]  # no series at all while the fault lasts
    from_start: bool  # zeInit runs once per child: its errors are present when the exporter starts
    logged: str  # what stderr says about it
    partly_read: Mapping[str, frozenset[str]] = field(default_factory=dict)  # device -> the families it keeps

    def __str__(self) -> str:
        return self.name


def _a770(**changes: Any) -> FakeConfig:
    return FakeConfig(devices=(dataclasses.replace(A770, **changes), B580))


LEVEL_ZERO_FAULTS = [
    *(LevelZeroFault(f"zeinit-{result.removeprefix('ZE_RESULT_ERROR_').lower()}",
                     FakeConfig(devices=(A770, B580), init_result=result), (DEVICE_A, DEVICE_B),
                     from_start=True, logged=result)
      for result in ("ZE_RESULT_ERROR_UNINITIALIZED", "ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS",
                     "ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE")),
    LevelZeroFault("device-lost-mid-run", _a770(memory_state_result="ZE_RESULT_ERROR_DEVICE_LOST"),
                   (), from_start=False, logged="ZE_RESULT_ERROR_DEVICE_LOST",
                   partly_read={DEVICE_A: IDENTITY_AND_TOTAL}),
    LevelZeroFault("memory-query-unsupported", _a770(memory_state_result="ZE_RESULT_ERROR_UNSUPPORTED_FEATURE"),
                   (), from_start=False, logged="ZE_RESULT_ERROR_UNSUPPORTED_FEATURE",
                   partly_read={DEVICE_A: IDENTITY_AND_TOTAL}),
    LevelZeroFault("memory-modules-unsupported", _a770(memory_modules_result="ZE_RESULT_ERROR_UNSUPPORTED_FEATURE"),
                   (), from_start=False, logged="ZE_RESULT_ERROR_UNSUPPORTED_FEATURE",
                   partly_read={DEVICE_A: frozenset({"xpu_device_info"})}),
]


@pytest.mark.parametrize("fault", LEVEL_ZERO_FAULTS, ids=str)
def test_level_zero_fault_fails_only_the_levelzero_collector_and_it_recovers(host: Host, fault: LevelZeroFault):
    if fault.from_start:
        host.configure(fault.config)
    with host.exporter() as exporter:
        if not fault.from_start:
            scrape_until(exporter, all_reporting, "reported healthy before the fault")
            host.configure(fault.config)
        scrape_until(exporter, fault_holds(LEVELZERO_ONLY), f"showed the fault {fault}")
        for _ in range(3):  # not one lucky scrape: it holds while the fault lasts
            during = exporter.scrape()
            assert_isolated(during, LEVELZERO_ONLY, fault.absent_devices, fault.partly_read)
        if DEVICE_B not in fault.absent_devices:
            assert series_present(during, "levelzero", devices=(DEVICE_B,)), "the healthy GPU lost its series"

        host.configure(HEALTHY)
        scrape_until(exporter, all_reporting, f"recovered from {fault}")
        assert exporter.process.poll() is None
    assert fault.logged in exporter.stderr


def test_absent_loader_fails_only_the_levelzero_collector_until_it_is_installed(host: Host, tmp_path: Path):
    loader = tmp_path / "lib" / "libze_loader.so.1"
    loader.parent.mkdir()
    with host.exporter("--levelzero.library", str(loader)) as exporter:
        scrape_until(exporter, fault_holds(LEVELZERO_ONLY), "showed the missing loader")
        for _ in range(3):
            during = exporter.scrape()
            assert_isolated(during, LEVELZERO_ONLY, (DEVICE_A, DEVICE_B))

        loader.symlink_to(installed_loader())
        scrape_until(exporter, all_reporting, "used the loader once installed")
        assert exporter.process.poll() is None
    assert "cannot load" in exporter.stderr


def installed_loader() -> Path:
    """The real Level Zero loader's path, as the dynamic linker's cache knows it."""
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    for line in listing.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.startswith("libze_loader.so.1 "):
            return Path(path)
    raise AssertionError(f"libze_loader.so.1 is not installed (ldconfig -p):\n{listing}")


# ------------------------------------------------------------------------------------- hanging calls

HANG_FLAGS = ("--levelzero.timeout", f"{LEVELZERO_TIMEOUT_S:g}s")
_ABANDONED = re.compile(r"Level Zero did not answer within \S+ \(driver hang\?\) \(next try in")


def scrapes_through_hangs(exporter: RunningExporter, hits: int = 2) -> list[tuple[float, Samples]]:
    """Timed scrapes until the Level Zero child has been abandoned `hits` times for not answering (the worker's
    debug line says so each time): the first hang, and one more after the child was restarted."""
    scrapes = []
    deadline = time.monotonic() + RECOVERY_S
    while len(_ABANDONED.findall(exporter.stderr)) < hits and time.monotonic() < deadline:
        scrapes.append(timed_scrape(exporter))
    assert len(_ABANDONED.findall(exporter.stderr)) >= hits, exporter.stderr
    return scrapes


def slowest(scrapes: list[tuple[float, Samples]]) -> float:
    return max(took for took, _ in scrapes)


def test_hanging_memory_query_costs_one_timeout_per_scrape_and_nothing_else(host: Host):
    with host.exporter(*HANG_FLAGS, "--log.level", "debug") as exporter:
        scrape_until(exporter, all_reporting, "reported healthy before the hang")
        host.configure(_a770(memory_state_hang=True))
        scrapes = scrapes_through_hangs(exporter)
        assert slowest(scrapes) < LEVELZERO_TIMEOUT_S + SCRAPE_MARGIN_S, [took for took, _ in scrapes]
        for _, during in scrapes:
            assert_isolated(during, LEVELZERO_ONLY, (DEVICE_A, DEVICE_B))

        host.configure(HEALTHY)  # the hung child is abandoned; a fresh one reads the driver that answers again
        scrape_until(exporter, all_reporting, "recovered from the hang")
        assert exporter.process.poll() is None


def test_hanging_zeinit_costs_one_timeout_per_scrape_and_nothing_else(host: Host):
    # A child hung in zeInit is given up only after the worker's 60 s init deadline: no recovery waited for here.
    host.configure(FakeConfig(devices=(A770, B580), init_hang=True))
    with host.exporter(*HANG_FLAGS) as exporter:
        scrape_until(exporter, fault_holds(LEVELZERO_ONLY), "showed the hung zeInit")
        scrapes = [timed_scrape(exporter) for _ in range(3)]  # every one waits for the hung init
        assert slowest(scrapes) < LEVELZERO_TIMEOUT_S + SCRAPE_MARGIN_S, [took for took, _ in scrapes]
        for _, during in scrapes:
            assert_isolated(during, LEVELZERO_ONLY, (DEVICE_A, DEVICE_B))
        assert exporter.process.poll() is None
    assert "Level Zero is still initialising" in exporter.stderr


def test_hanging_process_list_fails_only_the_processes_collector_within_the_timeout(tmp_path: Path,
                                                                                   fake_driver: Path,
                                                                                   config_path: Path):
    host = build_host(tmp_path, fake_driver, config_path, fdinfo_memory_keys=False)
    with host.exporter(*HANG_FLAGS, "--log.level", "debug") as exporter:
        healthy = scrape_until(exporter, all_reporting, "reported healthy before the hang")
        assert sample(healthy, "xpu_memory_attribution_info", device=DEVICE_A, source="levelzero") == 1

        host.configure(_a770(processes_hang=True))
        scrapes = scrapes_through_hangs(exporter)
        assert slowest(scrapes) < LEVELZERO_TIMEOUT_S + SCRAPE_MARGIN_S, [took for took, _ in scrapes]
        # The first scrape after the change reads memory from the healthy child, then hangs on the process list:
        # only the processes collector fails. (After that, while the abandoned child's retry backs off, Level
        # Zero is unavailable to both until a fresh child reads memory again.)
        assert_isolated(scrapes[0][1], frozenset({"processes"}))
        for _, during in scrapes:
            assert success(during)["processes"] == 0 and reporting(during, "journal")
            assert sample(during, "xpu_unit_memory_bytes", device=DEVICE_A, unit=CHAT) is None

        host.configure(HEALTHY)
        scrape_until(exporter, all_reporting, "recovered from the hang")
        assert exporter.process.poll() is None


# ------------------------------------------------------------------------------------- journal faults

def counters_never_decrease(history: list[Samples]) -> None:
    """Across consecutive scrapes, no counter of the journal collector went down."""
    for before, after in zip(history, history[1:]):
        for key, value in before.items():
            if key[0].endswith("_total") and key[0].startswith(("xpu_unit_", "xpu_exporter_journal_")):
                assert after.get(key, value) >= value, (key, value, after.get(key))


@pytest.mark.parametrize("change", ["deleted", "rotated", "vacuumed"])
def test_journal_files_changing_under_the_follower_keep_counters_and_new_entries_arrive(host: Host, change: str):
    active = host.journal_dir / "system.journal"
    if change == "vacuumed":  # the failed start in an archived file, the good one in the active file
        write_journal(active, unit_start(CHAT, FAILED, host.clock))
        rotate_journal(active)
        write_journal(active, unit_start(CHAT, STARTED, host.clock))
    with host.exporter() as exporter:
        history = [scrape_until(exporter, all_reporting, "reported healthy before the change")]
        if change == "deleted":
            active.unlink()
        elif change == "rotated":
            rotate_journal(active)
        else:
            for archived in host.journal_dir.glob("*@*.journal"):
                archived.unlink()
        history += [exporter.scrape() for _ in range(3)]
        for during in history:
            assert all_reporting(during), success(during)

        new_entries = unit_start(CHAT, RESTARTED, host.clock)
        if change == "vacuumed":
            append_journal(active, new_entries)
        else:
            write_journal(active, new_entries)
        history.append(scrape_until(exporter, lambda s: reporting(s, "journal", starts=2),
                                    f"read the entries written after the journal was {change}"))
        history += [exporter.scrape() for _ in range(3)]
        assert exporter.process.poll() is None
    for after in history[-4:]:
        assert all_reporting(after, starts=2), success(after)  # nothing read twice, nothing lost
    counters_never_decrease(history)


API = "(APIServer pid=40) INFO 12-02 10:00:00 [api_server.py:1873] "
CORE = "(EngineCore pid=41) INFO 12-02 10:00:20 "
HOSTILE_LINES = (
    (40, API + "non-default args: {'model': 'z', 'max_model_len': " + "9" * 4000 + "}"),  # once blanked /metrics
    (40, API + "non-default args: {'model': 'z', 'gpu_memory_utilization': 1e999}"),
    (41, CORE + "[gpu_worker.py:456] Available KV cache memory: 99999999999999.00 GiB"),
    (41, CORE + "[core.py:210] init engine (profile, create kv cache, warmup model) took -5.00 seconds"),
    (41, "9" * 30_000),
)


def test_hostile_journal_lines_and_fdinfo_while_following_cost_only_themselves(host: Host):
    """What anything writing to a watched unit's output, or a hostile procfs, can feed a running exporter: every
    collector keeps reporting its series, the absurd values are counted, none is served."""
    with host.exporter() as exporter:
        scrape_until(exporter, all_reporting, "reported healthy before the hostile input")
        append_journal(host.journal_dir / "system.journal",
                       [unit_output(CHAT, line, host.clock.tick(), pid=pid) for pid, line in HOSTILE_LINES])
        hostile_fdinfo = xe_fdinfo(client_id=3).replace("drm-total-vram0:\t0 KiB",
                                                         "drm-total-vram0:\t99999999999999999999 GiB")
        assert "99999999999999999999 GiB" in hostile_fdinfo
        host.procfs.add_unit_process(1002, f"/system.slice/{CHAT}").add_drm_fd(hostile_fdinfo)
        after = scrape_until(exporter, lambda s: all_reporting(s) and
                             (sample(s, "xpu_exporter_journal_values_rejected_total") or 0) >= 4,
                             "counted the hostile lines while every collector reports")
        assert exporter.process.poll() is None
    assert sample(after, "xpu_unit_max_model_len_tokens", unit=CHAT) == 131072
    assert sample(after, "xpu_unit_gpu_memory_utilization_ratio", unit=CHAT) == 0.75
    assert sample(after, "xpu_unit_kv_cache_bytes", unit=CHAT) == round(3.25 * GiB)
    assert sample(after, "xpu_unit_engine_init_duration_seconds", unit=CHAT) == 42.5
    assert all(abs(value) < 2 ** 50 for value in after.values())


def without_file_permission_override() -> list[str]:
    """The exporter's command line as root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (dropped from the
    bounding set, so the Level Zero child has neither): files are then checked against their modes as for any
    user, while the interpreter and packages under root's 0700 home stay readable, as they would not to
    another uid."""
    return ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", "--",
            sys.executable, "-m", "vllm_xpu_exporter"]


def chown_tree(root: Path, uid: int, gid: int) -> None:
    for path in (root, *root.rglob("*")):
        os.chown(path, uid, gid)


def test_unreadable_journal_directory_fails_only_the_journal_collector_until_it_is_readable(host: Host):
    nobody = 65534
    chown_tree(host.journal_dir, nobody, nobody)  # the journal belongs to someone else, mode 0700: no access
    host.journal_dir.chmod(0o700)
    with host.exporter(command=without_file_permission_override()) as exporter:
        scrape_until(exporter, fault_holds(frozenset({"journal"})), "showed the unreadable journal")
        for _ in range(3):
            during = exporter.scrape()
            assert_isolated(during, frozenset({"journal"}))
            assert sample(during, "xpu_unit_engine_starts_total", unit=CHAT) is None

        chown_tree(host.journal_dir, 0, 0)  # the operator gives the exporter access
        scrape_until(exporter, all_reporting, "read the journal once it was readable")
        assert exporter.process.poll() is None
    assert "permission denied" in exporter.stderr


def test_missing_procfs_root_fails_only_the_processes_collector_until_it_is_back(host: Host):
    moved = host.procfs.root.with_name("proc-away")
    with host.exporter() as exporter:
        scrape_until(exporter, all_reporting, "reported healthy before procfs went away")
        host.procfs.root.rename(moved)
        scrape_until(exporter, fault_holds(frozenset({"processes"})), "showed the missing procfs")
        for _ in range(3):
            during = exporter.scrape()
            assert_isolated(during, frozenset({"processes"}))
            assert sample(during, "xpu_unit_memory_bytes", device=DEVICE_A, unit=CHAT) is None

        moved.rename(host.procfs.root)
        scrape_until(exporter, all_reporting, "recovered once procfs was back")
        assert exporter.process.poll() is None
    assert str(host.procfs.root) in exporter.stderr


def big_journal_directory() -> Path:
    """A journal directory of BIG_JOURNAL_ENTRIES entries, all of watched units (so that catching up takes
    seconds), cached under $XDG_CACHE_HOME/vllm-xpu-exporter: made once (about 10 s), reused by later runs."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-xpu-exporter"
    directory = cache / f"faults-catch-up-{BIG_JOURNAL_ENTRIES}-v{BIG_JOURNAL_VERSION}"
    if not directory.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cache, prefix=".faults-catch-up-"))
        try:
            write_big_journal(staging / "system.journal", BIG_JOURNAL_ENTRIES, watched_fraction=1.0)
            staging.rename(directory)
        except OSError:
            if not directory.is_dir():  # else a concurrent run has just made it
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return directory


def test_sigterm_during_catch_up_of_a_big_journal_exits_cleanly_within_two_seconds(host: Host):
    big = big_journal_directory()
    exporter = host.exporter("--journal.boot", "all", journal_dir=big)
    try:
        catching_up = scrape_until(
            exporter, lambda s: success(s)["journal"] == 0 and
            0 < (sample(s, "xpu_exporter_journal_entries_read_total") or 0) < BIG_JOURNAL_ENTRIES,
            "was seen catching up")
        assert_isolated(catching_up, frozenset({"journal"}))  # still reading, and saying so

        exporter.process.send_signal(signal.SIGTERM)
        status = exporter.process.wait(EXIT_DEADLINE_S)  # TimeoutExpired: not out within the deadline
    finally:
        exporter.stop()
    assert status == 0, exporter.stderr
    log = exporter.stderr
    assert "received SIGTERM, shutting down" in log
    caught_up_at = log.find("journal read up to now")
    assert caught_up_at == -1 or caught_up_at > log.find("received SIGTERM"), "the catch-up finished before SIGTERM"


# ------------------------------------------------------------------------------------------ HTTP load

def test_two_hundred_concurrent_scrapes_are_all_answered_completely(host: Host):
    clients = 200
    with host.exporter() as exporter:
        scrape_until(exporter, all_reporting, "reported healthy")
        together = threading.Barrier(clients)

        def scrape(_: int) -> tuple[int, bytes]:
            together.wait(30)
            status, _headers, body = exporter.get("/metrics", timeout=60)
            return status, body

        with ThreadPoolExecutor(max_workers=clients) as pool:
            answers = list(pool.map(scrape, range(clients)))
        assert exporter.process.poll() is None
    assert [status for status, _ in answers] == [200] * clients
    parsed = [parse_samples(body.decode()) for _, body in answers]
    incomplete = [success(samples) for samples in parsed if not all_reporting(samples)]
    assert incomplete == [], f"{len(incomplete)} of {clients} scrapes incomplete, e.g. {incomplete[:3]}"


def test_a_slow_client_holding_a_half_sent_request_does_not_stop_others_scraping(host: Host):
    with host.exporter() as exporter:
        scrape_until(exporter, all_reporting, "reported healthy")
        address = urllib.parse.urlsplit(exporter.base_url)
        slow = socket.create_connection((address.hostname, address.port), timeout=20)
        silent = socket.create_connection((address.hostname, address.port), timeout=20)
        try:
            slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: slow\r\n")  # no blank line: the request is unfinished
            for _ in range(5):
                assert all_reporting(exporter.scrape())
            slow.sendall(b"Connection: close\r\n\r\n")  # the slow client finishes and is answered in full
            reply = http.client.HTTPResponse(slow)
            reply.begin()
            assert reply.status == 200
            assert all_reporting(parse_samples(reply.read().decode()))
        finally:
            slow.close()
            silent.close()
        assert exporter.process.poll() is None


# ------------------------------------------------------------------------------ start-up under limits

def scrape_answered(exporter: RunningExporter) -> Samples | None:
    """One scrape, or None when the connection is refused for want of a thread (the task limit is tight)."""
    try:
        return exporter.scrape()
    except (OSError, http.client.HTTPException):
        return None


def test_start_up_with_no_task_to_spare_serves_reports_the_sources_that_need_one_and_recovers(
        host: Host, task_limit: TaskLimit):
    """Under a pids cgroup no thread nor process can be started (EAGAIN): the journal follower, the GPU
    hot-plug watcher, the Level Zero child and its stderr reader. The exporter must serve anyway."""
    task_limit.set_max(1)
    with host.exporter(command=task_limit.wrap([sys.executable, "-m", "vllm_xpu_exporter"])) as exporter:
        assert exporter.process.poll() is None, exporter.stderr
        task_limit.set_max(2)  # the exporter and one thread: a connection's, one at a time
        limited = wait_for(lambda: (s := scrape_answered(exporter)) and
                           fault_holds(frozenset({"levelzero", "journal"}))(s) and s, timeout=RECOVERY_S)
        assert limited, exporter.stderr
        for _ in range(2):
            assert (s := wait_for(lambda: scrape_answered(exporter))) and success(s)["levelzero"] == 0
        assert reporting(limited, "processes")

        task_limit.set_max(None)
        scrape_until(exporter, all_reporting, "recovered once the task limit was lifted")

        task_limit.set_max(1)  # not even a thread to stop the server with
        exporter.process.send_signal(signal.SIGTERM)
        status = exporter.process.wait(EXIT_DEADLINE_S)
    log = exporter.stderr
    assert status == 0, log
    assert "Traceback" not in log
    assert log.count("cannot start the Level Zero child: [Errno 11] Resource temporarily unavailable") == 1, log
    assert log.count("cannot start the journal follower thread: can't start new thread") == 1, log


def test_a_level_zero_child_that_cannot_be_executed_fails_only_the_levelzero_collector_until_it_can(
        host: Host, tmp_path: Path):
    """sys.executable is what the child runs: a file the exporter may not execute (EACCES) at start-up."""
    interpreter = Path(os.path.realpath(sys.executable))
    not_executable = tmp_path / "bin" / "python3"
    not_executable.parent.mkdir()
    not_executable.write_text("not a program\n")
    not_executable.chmod(0o644)
    # argv[0] names the file, so Python takes it for sys.executable; its own libraries come from its prefix.
    command = ["bash", "-c", 'exec -a "$0" "$@"', str(not_executable), str(interpreter), "-m", "vllm_xpu_exporter"]
    # The interpreter itself, not the venv's: neither the venv's site-packages nor the editable install's
    # finder is set up for it, so both come through PYTHONPATH (the package by its import name).
    site_packages = sysconfig.get_paths()["purelib"]
    package_root = tmp_path / "import"
    package_root.mkdir()
    (package_root / "vllm_xpu_exporter").symlink_to(REPO / "exporter")
    with host.exporter(command=command,
                       env={"PYTHONPATH": os.pathsep.join([str(package_root), site_packages])}) as exporter:
        during = scrape_until(exporter, fault_holds(LEVELZERO_ONLY), "showed the child that cannot be executed")
        assert_isolated(during, LEVELZERO_ONLY, (DEVICE_A, DEVICE_B))

        not_executable.unlink()
        not_executable.symlink_to(interpreter)
        scrape_until(exporter, all_reporting, "started the child once it could be executed")
        assert exporter.process.poll() is None
    assert "cannot start the Level Zero child: [Errno 13] Permission denied" in exporter.stderr


def test_a_level_zero_child_whose_threads_cannot_start_is_killed_reaped_later_and_retried(
        level_zero_children: list[subprocess.Popen], config_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The child started, but its stderr reader (and then the reaper of the killed child) cannot: a task limit
    reached between the two, which a cgroup cannot arrange deterministically, so Thread.start is refused here."""
    write_config(config_path, HEALTHY)
    real_start = threading.Thread.start

    def start_refused_for_the_child(thread: threading.Thread) -> None:
        if thread.name in ("levelzero-stderr", "levelzero-reaper"):
            raise RuntimeError("can't start new thread")
        real_start(thread)

    worker = LevelZeroWorker()
    try:
        with monkeypatch.context() as refusing:
            refusing.setattr(threading.Thread, "start", start_refused_for_the_child)
            with pytest.raises(LevelZeroUnavailable, match="stderr reader: can't start new thread"):
                worker.read_memory()
        (first,) = level_zero_children
        assert wait_for(lambda: first.poll() is not None), "the child without a stderr reader was not killed"

        def memory_read() -> list | None:
            try:
                return worker.read_memory()
            except LevelZeroUnavailable:
                return None  # within the backoff

        devices = wait_for(memory_read, timeout=RECOVERY_S)
        assert [device.identity.pci_address for device in devices] == [DEVICE_A, DEVICE_B]
        assert len(level_zero_children) == 2
        assert first.stdout.closed, "the killed child was never reaped"
    finally:
        worker.close()
