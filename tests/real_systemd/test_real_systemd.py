"""On a real systemd 252 booted as PID 1 of private namespaces (tests/realsystemd.py), replayed vLLM
units that take device memory like vLLM (tests/vllmunit.py) write real journals: what systemd writes
around a start for Type=simple and Type=exec, with and without ExecStartPre=; the exporter's counters
on those journals against what the journal shows (tests/journalfacts.py); the boot race itself.

One boot serves the module; the four unit variants run side by side in it, each on its own fake GPU
and read by its own exporter. The boot-race test boots on its own, a few times.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import journalfacts
from bootrace import race_boot
from exporterproc import RunningExporter
from polling import wait_for
from scrapes import series
from fakeze import SharedDevice, fake_driver_env
from journalgen import (MESSAGE_ID_UNIT_FAILURE_RESULT, MESSAGE_ID_UNIT_PROCESS_EXIT, MESSAGE_ID_UNIT_RESTART_SCHEDULED,
                        MESSAGE_ID_UNIT_STARTED, MESSAGE_ID_UNIT_STARTING, MESSAGE_ID_UNIT_STOPPED)
from realsystemd import CGROUP_ROOT, RealSystemd, host_hierarchies, image_enabled_units, journal_field
from vllmunit import CHAT, EMBEDDING, SIXTEEN_GIB_GPU, STT, Engine, serving_units, unit_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "real-systemd"
TIME_SCALE = 0.1
PRE_START = "/bin/sh -c 'echo pre-start check; sleep 0.3'"
VARIANTS: Mapping[str, tuple[str, tuple[str, ...]]] = {  # name: (Type=, ExecStartPre=)
    "simple": ("simple", ()),
    "exec": ("exec", ()),
    "simple-pre": ("simple", (PRE_START,)),
    "exec-pre": ("exec", (PRE_START,)),
}
# Beside the race's three: one that cannot have its memory (0.9 of the GPU while chat holds 0.75), one
# whose context does not fit its KV cache, one that dies before vLLM prints anything.
BIG = Engine("big", 0.9, 4096, 1.0, 20.0)
LONG = Engine("long", 0.07, 131072, 0.06, 20.0, kv_bytes_per_token=36864, activation_gib=0.05, block_size=16)
BROKEN_START = "/bin/sh -c 'echo \"ModuleNotFoundError: No module named vllm\" >&2; exit 1'"
STEP_TIMEOUT = 30.0
EXPORTER_TIMEOUT = 8.0  # the fold's grace for a failure's late root cause is 5 s
# Fields kept in the saved fixtures: the ones the journal reader and fold use, and the ones that tell
# a start's records apart (the rest is the machine's).
FIXTURE_FIELDS = ("__REALTIME_TIMESTAMP", "_TRANSPORT", "_PID", "_COMM", "_SYSTEMD_UNIT", "_SYSTEMD_INVOCATION_ID",
                  "UNIT", "INVOCATION_ID", "MESSAGE_ID", "MESSAGE", "JOB_TYPE", "JOB_RESULT", "EXIT_CODE",
                  "EXIT_STATUS", "UNIT_RESULT", "N_RESTARTS")


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("booting a real systemd needs root (tests/run runs as root)")


def unit_name(role: str, variant: str) -> str:
    return f"vllm-{role}-{variant}.service"


def variant_glob(variant: str) -> str:
    return f"vllm-*-{variant}.service"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, fake_driver: Path) -> Path:
    require_root()
    directory = tmp_path_factory.mktemp("realsystemd")
    shutil.copy(fake_driver, directory / fake_driver.name)
    return directory


@pytest.fixture(scope="module")
def machine(shared: Path) -> Iterator[RealSystemd]:
    with RealSystemd(shared) as booted:
        yield booted


class Scenario:
    """Per variant, on its own 16 GiB fake GPU: chat and embedding started together (embedding's
    profiling sees chat's weights arrive and fails; systemd restarts it 4 s later, alone), then stt
    alone, then `big`, `long` and `broken` one after the other (each fails). Only starts that begin
    together overlap: with Type=simple the fold's init begins at the first vLLM line, not when the main
    process starts (test_an_init_begins_when_the_main_process_starts), so an overlap decided within
    that delay would make the comparison a coin toss."""

    ROLES = ("chat", "embedding", "stt", "big", "long", "broken")

    def __init__(self, machine: RealSystemd, shared: Path) -> None:
        self.machine = machine
        self.shared = shared
        self.directories = {variant: shared / variant for variant in VARIANTS}

    def config(self, variant: str) -> Path:
        return self.directories[variant] / "ze.conf"

    def events(self, variant: str) -> Path:
        return self.directories[variant] / "events.jsonl"

    def units(self, variant: str) -> list[str]:
        return [unit_name(role, variant) for role in self.ROLES]

    def write(self) -> None:
        for variant, (unit_type, pre) in VARIANTS.items():
            self.directories[variant].mkdir()
            SharedDevice.create(self.config(variant), SIXTEEN_GIB_GPU)
            common = dict(device_config=self.machine.inside(self.config(variant)), unit_type=unit_type,
                          exec_start_pre=pre, time_scale=TIME_SCALE, events=self.machine.inside(self.events(variant)),
                          requests=0)
            for engine, restart in ((CHAT, "on-failure"), (EMBEDDING, "on-failure"), (STT, "on-failure"),
                                    (BIG, "no"), (LONG, "no")):
                self.machine.write_unit(unit_name(engine.role, variant),
                                        unit_file(engine, restart=restart, restart_sec=4.0, **common))
            broken = "\n".join(["[Unit]", "Description=vLLM broken (replayed)", "", "[Service]", f"Type={unit_type}",
                                *[f"ExecStartPre={command}" for command in pre], f"ExecStart={BROKEN_START}", ""])
            self.machine.write_unit(unit_name("broken", variant), broken)
        self.machine.daemon_reload()

    def run(self) -> None:
        self.write()
        self._step(["chat", "embedding"], lambda roles: self._serving(roles))
        self._step(["stt"], lambda roles: self._serving(["chat", "embedding", *roles]))
        for role in ("big", "long", "broken"):
            self._step([role], lambda roles: self._failed(roles))

    def _step(self, roles: list[str], done) -> None:
        self.machine.start(*[unit_name(role, variant) for variant in VARIANTS for role in roles])
        assert wait_for(lambda: done(roles), timeout=STEP_TIMEOUT, interval=0.1), \
            f"timed out after {STEP_TIMEOUT} s waiting for {', '.join(roles)} of every variant"

    def _serving(self, roles: list[str]) -> bool:
        return all({unit_name(role, variant) for role in roles} <= serving_units(self.events(variant))
                   for variant in VARIANTS)

    def _failed(self, roles: list[str]) -> bool:
        units = [unit_name(role, variant) for variant in VARIANTS for role in roles]
        states = self.machine.systemctl("show", "-p", "ActiveState", "--value", *units).stdout.split()
        return states == ["failed"] * len(units)

    def journal(self, variant: str) -> list[dict]:
        return self.machine.journal(*self.units(variant))


@pytest.fixture(scope="module")
def scenario(machine: RealSystemd, shared: Path) -> Scenario:
    played = Scenario(machine, shared)
    played.run()
    machine.sync_journal()
    return played


# ---- the harness ----------------------------------------------------------------------------------


def test_systemd_runs_on_an_overlay_root_in_cgroups_below_the_test_process(machine: RealSystemd):
    """What keeps the host safe: the root is the overlay, the kernel's sysctls are read-only, and systemd's
    cgroups (its own tree, mounted at the namespace's cgroups) lie below the test process's cgroups."""
    assert machine.run("stat", "-f", "-c", "%T", "/").stdout.strip() == "overlayfs"
    assert machine.run("sh", "-c", "echo 1 > /proc/sys/kernel/ns_last_pid", check=False).returncode != 0
    assert "ro" in machine.run("findmnt", "-n", "-o", "OPTIONS", "/proc/sys").stdout.split(",")
    pid1_cgroup = Path(f"/proc/{machine.pid1}/cgroup").read_text()
    for hierarchy in host_hierarchies():
        if hierarchy.options in ("cgroup2", "none,name=systemd"):
            on_host = hierarchy.mountpoint / hierarchy.own_path.lstrip("/")
            mine = [path for path in on_host.glob("realsystemd-*") if (path / "init.scope").is_dir()]
            assert mine, f"systemd's init.scope is not below {on_host}"
            assert not (hierarchy.mountpoint / "init.scope").exists()
    assert "/realsystemd-" in pid1_cgroup
    assert "ro" not in subprocess.run(["findmnt", "-n", "-o", "OPTIONS", str(CGROUP_ROOT)], capture_output=True,
                                      text=True).stdout.split(",")


def test_the_images_enabled_units_do_not_start_yet_a_test_may_start_its_own_of_that_name(machine: RealSystemd):
    """A unit the machine image enables (prometheus.service: tests/run installs Debian's prometheus, whose
    package enables it; docker.service where docker.io is installed) stays down at boot, and is not masked:
    a test may write a unit of that name and start it (tests/real_systemd/test_journal_trust_real_systemd.py runs a
    docker.service of its own, which a mask made fail on every host with docker.io)."""
    enabled = image_enabled_units()
    assert "prometheus.service" in enabled, f"the image enables no prometheus.service (tests/run installs it): {enabled}"
    for unit in enabled:
        state = machine.systemctl("show", "-P", "ActiveState", unit, check=False).stdout.strip()
        assert state in ("inactive", ""), f"{unit}, which the image enables, is {state} in the booted system"
    machine.write_unit("prometheus.service", "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n")
    machine.daemon_reload()
    machine.systemctl("start", "prometheus.service")
    assert machine.systemctl("is-active", "prometheus.service", check=False).stdout.strip() == "active"


def test_shutdown_ends_the_namespace_and_removes_its_cgroups(shared: Path):
    booted = RealSystemd(shared).boot()
    pid1, cgroups = booted.pid1, list(booted._cgroups)
    assert cgroups and all(cgroup.is_dir() for cgroup in cgroups)
    booted.shutdown()
    assert not Path(f"/proc/{pid1}").exists()
    assert not any(cgroup.exists() for cgroup in cgroups)


# ---- what systemd writes ----------------------------------------------------------------------------


def _records(entries: list[dict], unit: str) -> list[tuple[str, str, str]]:
    """(kind, MESSAGE_ID or message, invocation) of a unit's entries in journal order; kind "pid1",
    "pre" (the ExecStartPre command's line) or "main"."""
    rows = []
    for entry in sorted(entries, key=lambda e: int(e["__REALTIME_TIMESTAMP"])):
        if journal_field(entry, "_PID") == "1":
            if journal_field(entry, "UNIT") == unit:
                rows.append(("pid1", journal_field(entry, "MESSAGE_ID"), journal_field(entry, "INVOCATION_ID")))
        elif journal_field(entry, "_SYSTEMD_UNIT") == unit:
            kind = "pre" if journal_field(entry, "MESSAGE") == "pre-start check" else "main"
            rows.append((kind, journal_field(entry, "_PID"), journal_field(entry, "_SYSTEMD_INVOCATION_ID")))
    return rows


def check_what_systemd_writes(entries: list[dict], unit: str, unit_type: str, pre: bool) -> None:
    """The facts of systemd 252 the fold relies on, for one unit that failed once and was restarted."""
    rows = _records(entries, unit)
    invocations = list(dict.fromkeys(invocation for _, _, invocation in rows))
    assert len(invocations) == 2, f"{unit}: one failed start and its restart, got {invocations}"
    for invocation in invocations:
        mine = [row for row in rows if row[2] == invocation]
        pid1 = [message_id for kind, message_id, _ in mine if kind == "pid1"]
        starting = MESSAGE_ID_UNIT_STARTING in pid1
        assert starting == (unit_type == "exec" or pre), f"{unit}: 'Starting' logged: {starting}"
        assert MESSAGE_ID_UNIT_STARTED in pid1
        main_pids = {pid for kind, pid, _ in mine if kind == "main"}
        pre_pids = {pid for kind, pid, _ in mine if kind == "pre"}
        assert len(main_pids) == 1, f"{unit}: the main process's lines carry one _PID: {main_pids}"
        assert len(pre_pids) == (1 if pre else 0) and not pre_pids & main_pids
        if pre:
            kinds = [kind if kind != "pid1" else message_id for kind, message_id, _ in mine]
            assert kinds.index(MESSAGE_ID_UNIT_STARTED) > kinds.index("pre"), \
                f"{unit}: the pre-start command ran before 'Started'"
            assert kinds.index(MESSAGE_ID_UNIT_STARTING) < kinds.index(MESSAGE_ID_UNIT_STARTED)
    first = [message_id for kind, message_id, invocation in rows if kind == "pid1" and invocation == invocations[0]]
    assert first[-4:] == [MESSAGE_ID_UNIT_PROCESS_EXIT, MESSAGE_ID_UNIT_FAILURE_RESULT,
                          MESSAGE_ID_UNIT_RESTART_SCHEDULED, MESSAGE_ID_UNIT_STOPPED], \
        f"{unit}: exit, failed, scheduled restart, stopped close the failed start (all its invocation id)"


@pytest.mark.parametrize("variant", VARIANTS)
def test_what_systemd_writes_around_a_failed_start_and_its_restart(scenario: Scenario, variant: str, update_golden):
    unit_type, pre = VARIANTS[variant]
    unit = unit_name("embedding", variant)
    entries = scenario.machine.journal(unit)
    check_what_systemd_writes(entries, unit, unit_type, bool(pre))
    if update_golden:
        FIXTURES.mkdir(parents=True, exist_ok=True)
        kept = [{name: entry[name] for name in FIXTURE_FIELDS if name in entry} for entry in entries]
        (FIXTURES / f"{variant}.json").write_text("".join(json.dumps(entry) + "\n" for entry in kept))


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_saved_real_journal_shows_the_same(variant: str):
    """The fixture files (journalctl -o json of the embedding unit, rewritten with --update-golden)
    hold what the live test checks."""
    unit_type, pre = VARIANTS[variant]
    entries = [json.loads(line) for line in (FIXTURES / f"{variant}.json").read_text().splitlines()]
    check_what_systemd_writes(entries, unit_name("embedding", variant), unit_type, bool(pre))


# ---- the exporter on real journals -------------------------------------------------------------------


def exporter_counts(samples: Mapping, units: list[str]) -> dict[str, journalfacts.UnitCounts]:
    starts = series(samples, "xpu_unit_engine_starts_total")
    failures = series(samples, "xpu_unit_engine_init_failures_total")
    overlaps = series(samples, "xpu_unit_engine_init_overlaps_total")
    result = {}
    for unit in units:
        by_reason = {dict(labels)["reason"]: int(value) for labels, value in failures.items()
                     if dict(labels)["unit"] == unit and value}
        result[unit] = journalfacts.UnitCounts(starts=int(starts.get((("unit", unit),), 0)), failures=by_reason,
                                               overlaps=int(overlaps.get((("unit", unit),), 0)))
    return result


def scrape_until_equal(exporter: RunningExporter, expected: Mapping[str, journalfacts.UnitCounts],
                       timeout: float = EXPORTER_TIMEOUT) -> dict[str, journalfacts.UnitCounts]:
    """The exporter's counts once they equal `expected` (it reads, then settles late causes for up to
    LATE_LINES_GRACE_USEC), or its last counts at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        got = exporter_counts(exporter.scrape(), list(expected))
        if got == expected or time.monotonic() > deadline:
            return got
        time.sleep(0.25)


def run_exporter(machine: RealSystemd, fake_driver: Path, config: Path, units_glob: str) -> RunningExporter:
    return RunningExporter(["--journal.directory", str(machine.journal_directory), "--journal.units", units_glob,
                            "--no-collector.processes"], env=fake_driver_env(fake_driver, config))


@pytest.mark.parametrize("variant", VARIANTS)
def test_exporter_counts_equal_what_the_real_journal_shows(scenario: Scenario, fake_driver: Path, variant: str):
    """Starts, failures by reason and overlapping inits of chat, embedding, stt, big and long, as the
    exporter counts them from the journal systemd wrote, against the journal read directly."""
    units = [unit_name(role, variant) for role in ("chat", "embedding", "stt", "big", "long")]
    expected = journalfacts.counts(scenario.journal(variant), units)
    assert expected[unit_name("embedding", variant)].failures == {"no_kv_cache_memory": 1}, \
        "the scenario: embedding's first init saw chat's weights arrive"
    assert expected[unit_name("big", variant)].failures == {"insufficient_free_memory": 1}
    assert expected[unit_name("long", variant)].failures == {"kv_cache_too_small": 1}
    overlaps = {unit.split("-")[1]: counts.overlaps for unit, counts in expected.items()}
    assert overlaps["chat"] >= 1 and overlaps["embedding"] >= 1 and overlaps["stt"] == 0, overlaps
    assert overlaps["big"] == overlaps["long"] == 0, overlaps
    with run_exporter(scenario.machine, fake_driver, scenario.config(variant), variant_glob(variant)) as exporter:
        assert scrape_until_equal(exporter, expected) == expected


@pytest.mark.parametrize("variant", [
    "simple",
    "exec",
    "simple-pre",
    "exec-pre",
])
def test_a_start_that_dies_before_vllm_prints_counts_as_other(scenario: Scenario, fake_driver: Path, variant: str):
    unit = unit_name("broken", variant)
    expected = journalfacts.counts(scenario.journal(variant), [unit])
    if expected != {unit: journalfacts.UnitCounts(0, {"other": 1}, 0)}:
        pytest.fail(f"the journal should show one 'other' failure of {unit}: {expected}")
    with run_exporter(scenario.machine, fake_driver, scenario.config(variant), unit) as exporter:
        assert scrape_until_equal(exporter, expected) == expected


def _start_until_serving(machine: RealSystemd, directory: Path,
                         units: list[str]) -> dict[str, journalfacts.UnitCounts]:
    """Start the units written into `machine` together, wait until every one serves, and return what the
    journal shows of them (journalfacts)."""
    machine.daemon_reload()
    machine.start(*units)
    assert wait_for(lambda: serving_units(directory / "events.jsonl") == set(units), timeout=STEP_TIMEOUT,
                    interval=0.1), \
        f"timed out after {STEP_TIMEOUT} s waiting for every unit serving"
    machine.sync_journal()
    return journalfacts.counts(machine.journal(*units), units)


def test_a_unit_waiting_in_its_exec_start_pre_is_not_initialising(machine: RealSystemd, shared: Path,
                                                                   fake_driver: Path):
    """`first` initialises and reaches its KV cache while `second` waits 3 s in its ExecStartPre=: their
    inits do not overlap (second's main process starts after first's KV line)."""
    directory = shared / "pre-start-wait"
    directory.mkdir()
    config = directory / "ze.conf"
    SharedDevice.create(config, SIXTEEN_GIB_GPU)
    small = Engine("small", 0.07, 512, 0.06, 10.0, kv_bytes_per_token=36864, activation_gib=0.05, block_size=16)
    common = dict(device_config=machine.inside(config), unit_type="exec", time_scale=TIME_SCALE,
                  events=machine.inside(directory / "events.jsonl"), requests=0)
    units = ["vllm-first-waits.service", "vllm-second-waits.service"]
    machine.write_unit(units[0], unit_file(small, **common))
    machine.write_unit(units[1], unit_file(small, exec_start_pre=["/bin/sh -c 'echo waiting for the GPU; sleep 3'"],
                                           **common))
    expected = _start_until_serving(machine, directory, units)
    if expected != {unit: journalfacts.UnitCounts(1, {}, 0) for unit in units}:
        pytest.fail(f"the journal should show two successful starts that do not overlap: {expected}")
    with run_exporter(machine, fake_driver, config, "vllm-*-waits.service") as exporter:
        assert scrape_until_equal(exporter, expected, timeout=5) == expected


def test_an_init_begins_when_the_main_process_starts(machine: RealSystemd, shared: Path, fake_driver: Path):
    """Type=simple units started together: `quick` reaches its KV cache while `slow` (3 s of imports
    before vLLM's first line) has not printed yet. Both main processes were initialising together."""
    directory = shared / "simple-start"
    directory.mkdir()
    config = directory / "ze.conf"
    SharedDevice.create(config, SIXTEEN_GIB_GPU)
    quick = Engine("quick", 0.07, 512, 0.06, 10.0, kv_bytes_per_token=36864, activation_gib=0.05, block_size=16)
    slow = dataclasses.replace(quick, role="slow", import_seconds=30.0)
    common = dict(device_config=machine.inside(config), time_scale=TIME_SCALE,
                  events=machine.inside(directory / "events.jsonl"), requests=0)
    units = ["vllm-quick-imports.service", "vllm-slow-imports.service"]
    machine.write_unit(units[0], unit_file(quick, **common))
    machine.write_unit(units[1], unit_file(slow, **common))
    expected = _start_until_serving(machine, directory, units)
    if expected != {unit: journalfacts.UnitCounts(1, {}, 1) for unit in units}:
        pytest.fail(f"the journal should show two successful starts that overlap: {expected}")
    with run_exporter(machine, fake_driver, config, "vllm-*-imports.service") as exporter:
        assert scrape_until_equal(exporter, expected, timeout=5) == expected


# ---- the race --------------------------------------------------------------------------------------

RACE_BOOTS = 2


def test_three_units_started_together_at_boot_race_for_memory(tmp_path: Path):
    """chat 0.75, embedding 0.07 and stt 0.07 of a 16 GiB GPU, enabled and started by systemd at boot
    with Restart=on-failure: inits fail (their profiling charges them with the others' memory) and
    overlap, and the restarts bring every unit up. benchmarks/boot_race.py measures it over 20 boots."""
    require_root()
    outcomes = [race_boot(tmp_path) for _ in range(RACE_BOOTS)]
    for outcome in outcomes:
        assert outcome.settled, f"not every unit came up: {outcome.counts}"
        assert all(counts.starts == 1 for counts in outcome.counts.values())
    assert sum(outcome.failures for outcome in outcomes) > 0
    assert all(outcome.overlaps > 0 for outcome in outcomes)
