"""The seed incident (tests/vllmlogs.py's boot race) on the seed host's GPU, its three vLLM engines run as
systemd units, as Docker containers logging to the journal and to json-file logs, as Podman containers
(journald) and as pods (containerd, CRI-O): every series the exporter derives for a unit exists, with the same
values, for the same engine as each kind of container, the processes collector's too (restart headroom,
planned KV cache, footprint), read from the journal's fold or the container logs' alike."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from containerlogs import (RACE_CONTAINERS, RACE_POD_KEYS, DockerHost, container_lines, journald_specs,
                           write_race_docker, write_race_pods)
from exporterproc import RunningExporter
from fakecontainers import docker_systemd_path, kubepods_cgroupfs_path, kubepods_systemd_path, podman_path
from fakeprocfs import FakeProcfs, xe_fdinfo
from fakeze import A770, FakeConfig, FakeMemoryModule, fake_driver_env, write_config
from journalgen import container_id, write_journal
from polling import wait_for
from scrapes import Samples, sample, series
from sizes import GiB, MiB
from vllmlogs import CHAT, EMBEDDING, STT, boot_race, journal_specs

TOTAL = 16 * GiB
HELD = {CHAT: 11 * GiB + 512 * MiB, EMBEDDING: 1 * GiB, STT: 1 * GiB}
UNATTRIBUTED = 512 * MiB
DERIVED = ("xpu_unit_restart_headroom_bytes", "xpu_unit_kv_cache_planned_bytes", "xpu_unit_memory_footprint_bytes")


@dataclasses.dataclass
class Setup:
    cgroups: dict[str, str]  # unit -> the cgroup of its engine's processes
    keys: dict[str, str]  # the series' unit label -> the unit it stands for
    args: list[str]


def units(tmp: Path) -> Setup:
    race = boot_race()
    journal = write_journal(tmp / "race.journal", journal_specs(race.placed))
    return Setup({unit: f"/system.slice/{unit}" for unit in HELD}, {unit: unit for unit in HELD},
                 ["--journal.file", str(journal), "--journal.boot", race.boot_id])  # the race's boot, as below


def docker(log_driver: str) -> callable:
    def make(tmp: Path) -> Setup:
        race = boot_race()
        if log_driver == "json-file":
            containers = write_race_docker(tmp / "docker")
            ids = {unit: containers[RACE_CONTAINERS[unit]].id for unit in HELD}
            args = ["--journal.file", str(write_journal(tmp / "empty.journal", [])), "--logs.docker"]
        else:
            host = DockerHost(tmp / "docker")
            ids = {unit: host.add(RACE_CONTAINERS[unit], log_driver="journald").id for unit in HELD}
            lines = container_lines(race.this_boot(), RACE_CONTAINERS)
            args = ["--journal.file", str(write_journal(tmp / "race.journal", journald_specs(lines, race.boot_id)))]
        return Setup({unit: docker_systemd_path(ids[unit]) for unit in HELD},
                     {f"docker/{RACE_CONTAINERS[unit]}": unit for unit in HELD},
                     [*args, "--path.docker", str(tmp / "docker")])
    return make


def podman(tmp: Path) -> Setup:
    race = boot_race()
    storage = tmp / "storage"
    (storage / "overlay-containers").mkdir(parents=True)
    (storage / "overlay-containers/containers.json").write_text(json.dumps(
        [{"id": container_id(RACE_CONTAINERS[unit]), "names": [RACE_CONTAINERS[unit]]} for unit in HELD]))
    lines = container_lines(race.this_boot(), RACE_CONTAINERS)
    journal = write_journal(tmp / "race.journal", journald_specs(lines, race.boot_id, runtime="podman"))
    return Setup({unit: podman_path(container_id(RACE_CONTAINERS[unit])) for unit in HELD},
                 {f"podman/{RACE_CONTAINERS[unit]}": unit for unit in HELD},
                 ["--journal.file", str(journal), "--path.podman", str(storage)])


def pods(runtime: str) -> callable:
    def make(tmp: Path) -> Setup:
        containers = write_race_pods(tmp / "pods")
        (tmp / "links").mkdir()
        cgroups = {}
        for unit in HELD:
            uid, cid = containers[RACE_CONTAINERS[unit]].uid, container_id(f"pod/{unit}")
            cgroups[unit] = (kubepods_systemd_path(uid, cid) if runtime == "containerd"
                             else kubepods_cgroupfs_path(uid, cid, crio=True, qos=None))
        return Setup(cgroups, {RACE_POD_KEYS[unit]: unit for unit in HELD},
                     ["--journal.file", str(write_journal(tmp / "empty.journal", [])), "--logs.pods",
                      "--path.pods", str(tmp / "pods"), "--path.container-logs", str(tmp / "links")])
    return make


SETUPS = {"units": units, "docker-journald": docker("journald"), "docker-json-file": docker("json-file"),
          "podman-journald": podman, "pods-containerd": pods("containerd"), "pods-crio": pods("crio")}


def scrape(tmp: Path, setup: Setup, fake_driver: Path, config_path: Path) -> Samples:
    procfs = FakeProcfs(tmp / "proc")
    for index, (unit, held) in enumerate(HELD.items()):
        pid = 200 + 10 * index
        procfs.add_unit_process(pid, setup.cgroups[unit]).add_drm_fd(xe_fdinfo(client_id=pid, vram0=held))
    used = sum(HELD.values()) + UNATTRIBUTED
    device = dataclasses.replace(A770, memory=(FakeMemoryModule(size=TOTAL, free=TOTAL - used),))
    write_config(config_path, FakeConfig(devices=(device,)))
    (tmp / "sys").mkdir()
    args = ["--path.procfs", str(procfs.root), "--path.sysfs", str(tmp / "sys"), "--journal.boot", "all",
            *setup.args]
    with RunningExporter(args, env=fake_driver_env(fake_driver, config_path)) as exporter:
        samples = wait_for(lambda: (s := exporter.scrape()) and
                           sample(s, "xpu_exporter_collector_success", collector="journal") == 1 and
                           sample(s, "xpu_exporter_collector_success", collector="processes") == 1 and
                           len(series(s, "xpu_unit_restart_headroom_bytes")) >= len(HELD) and s, 30)
        assert samples, exporter.stderr
    return samples


def unit_series(samples: Samples, keys: dict[str, str]) -> dict:
    """Every series with a `unit` label of the three engines, under the units' names."""
    out = {}
    for (name, labels), value in samples.items():
        unit = dict(labels).get("unit")
        if unit in keys and name != "xpu_workload_info":
            out[name, tuple(sorted({**dict(labels), "unit": keys[unit]}.items()))] = value
    return out


@pytest.fixture(scope="module")
def units_series(tmp_path_factory, fake_driver) -> dict:
    tmp = tmp_path_factory.mktemp("units")
    return unit_series(scrape(tmp, units(tmp), fake_driver, tmp / "ze.conf"), {unit: unit for unit in HELD})


@pytest.mark.parametrize("engine", [name for name in SETUPS if name != "units"])
def test_every_series_of_the_units_exists_with_the_same_value_for_each_kind_of_container(
        tmp_path, fake_driver, config_path, units_series, engine):
    assert {name for name, _ in units_series} >= set(DERIVED)
    for family in DERIVED:
        assert {dict(labels)["unit"] for name, labels in units_series if name == family} == set(HELD), family
    setup = SETUPS[engine](tmp_path)
    assert unit_series(scrape(tmp_path, setup, fake_driver, config_path), setup.keys) == units_series
