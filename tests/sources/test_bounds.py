"""Every engine state file and container log is read within a fixed memory bound: the exporter, run in a
512M memory cgroup, stays under 200 MB of resident memory with a 16 MiB hostile containers.json, a 1 MiB
hostile config.v2.json, and three containers printing short lines as fast as they can; a rotated .gz that
inflates to 256 MiB is cut at its bound (its CPU cost: benchmarks/bench_container_logs.py). Each cut is
counted."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from pathlib import Path

import pytest

from containerlogs import DockerHost, json_file_records
from exporterproc import RunningExporter
from fakeprocfs import FakeProcfs, xe_fdinfo
from fakeze import A770, FakeConfig, FakeMemoryModule, fake_driver_env, write_config
from journalgen import container_id, write_journal
from memorylimit import MemoryLimit, peak_rss
from polling import wait_for
from scrapes import sample
from sizes import GiB, MiB
from test_container_logs import ALL, printed, read, reader
from vllm_xpu_exporter.sources import logfile
from vllm_xpu_exporter.sources.containerlogs import LogDirectories
from vllm_xpu_exporter.runtimes.docker import MAX_CONFIG_BYTES as MAX_DOCKER_CONFIG_BYTES
from vllm_xpu_exporter.runtimes.podman import MAX_LIST_BYTES as MAX_PODMAN_LIST_BYTES

LIMIT = 512 << 20
RSS_BOUND = 200 << 20
ROOTLESS = container_id("rootless")
ROOTFUL = container_id("rootful")
DOCKER = container_id("docker")


def objects_bomb(prefix: bytes, suffix: bytes, size: int) -> bytes:
    """JSON of `size` bytes that is mostly empty objects: the most Python objects per byte json.loads makes."""
    count = (size - len(prefix) - len(suffix)) // 3
    return prefix + b"{}," * (count - 1) + b"{}" + suffix


def exporter_in(limit: MemoryLimit, args: list[str], env: dict | None = None) -> RunningExporter:
    import sys
    return RunningExporter(args, env=env, command=limit.wrap([sys.executable, "-m", "vllm_xpu_exporter"]))


def test_hostile_state_files_are_read_within_the_memory_bound(tmp_path, fake_driver, config_path):
    """A rootless user's 16 MiB containers.json of one container with millions of names, root's one
    container per 16 KiB entry, and a 1 MiB config.v2.json of empty objects: the exporter serves, under 200 MB,
    and counts the files it did not read."""
    procfs = FakeProcfs(tmp_path)
    paths = {ROOTLESS: f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ROOTLESS}.scope",
             ROOTFUL: f"/machine.slice/libpod-{ROOTFUL}.scope", DOCKER: f"/system.slice/docker-{DOCKER}.scope"}
    for pid, (cid, path) in enumerate(paths.items(), start=100):
        procfs.add_unit_process(pid, path).add_drm_fd(xe_fdinfo(client_id=pid, vram0=GiB))
    users = tmp_path / "home/u/.local/share/containers/storage/overlay-containers"
    users.mkdir(parents=True)
    (users / "containers.json").write_bytes(objects_bomb(
        f'[{{"id": "{ROOTLESS}", "names": ['.encode(), b"]}]", MAX_PODMAN_LIST_BYTES))
    os.chown(users / "containers.json", 1000, 1000)
    rootful = tmp_path / "storage/overlay-containers"
    rootful.mkdir(parents=True)
    entry = objects_bomb(f'{{"id": "{ROOTFUL}", "names": ["vllm-chat"], "x": ['.encode(), b"]}", 16 << 10)
    (rootful / "containers.json").write_bytes(b"[" + b",".join([entry] * (MAX_PODMAN_LIST_BYTES // len(entry) - 1))
                                              + b"]")
    docker = tmp_path / "docker/containers" / DOCKER
    docker.mkdir(parents=True)
    (docker / "config.v2.json").write_bytes(objects_bomb(
        f'{{"ID": "{DOCKER}", "Name": "/vllm-docker", "Env": ['.encode(), b"]}", MAX_DOCKER_CONFIG_BYTES))
    device = dataclasses.replace(A770, memory=(FakeMemoryModule(size=16 * GiB, free=12 * GiB),))
    write_config(config_path, FakeConfig(devices=(device,)))
    journal = write_journal(tmp_path / "empty.journal", [])
    args = ["--path.procfs", str(procfs.root), "--journal.file", str(journal), "--journal.boot", "all",
            "--path.podman", str(users.parent), "--path.podman", str(rootful.parent),
            "--path.docker", str(tmp_path / "docker")]
    with MemoryLimit("bounds", LIMIT) as limit:
        with exporter_in(limit, args, fake_driver_env(fake_driver, config_path)) as exporter:
            samples = wait_for(lambda: (s := exporter.scrape()) and
                               sample(s, "xpu_exporter_collector_success", collector="processes") == 1 and s)
            peak = peak_rss(exporter.process.pid)
        assert limit.oom_kills() == 0
    assert peak < RSS_BOUND, peak
    units = {dict(labels)["unit"] for (name, labels) in samples if name == "xpu_unit_memory_bytes"}
    # the rootless list's one entry is over its bound; root's 16 KiB entries are read one at a time
    assert units == {f"libpod-{ROOTLESS}.scope@uid1000", "podman/vllm-chat", "docker/vllm-docker"}
    assert sample(samples, "xpu_exporter_container_state_files_cut_total") == 1


def test_containers_printing_as_fast_as_they_can_are_followed_within_the_memory_bound(tmp_path):
    """Three json-file containers each append 24 MiB of short lines at once while followed: a poll reads
    at most FILE_POLL_BYTES of a file and POLL_BYTES of all, so the exporter stays under 200 MB."""
    host = DockerHost(tmp_path / "docker")
    containers = [host.add(f"vllm-{n}") for n in range(3)]
    for container in containers:
        container.write([printed(container.name, "started", 0)])
    journal = write_journal(tmp_path / "empty.journal", [])
    args = ["--no-collector.levelzero", "--no-collector.processes", "--journal.file", str(journal),
            "--journal.boot", "all", "--path.docker", str(tmp_path / "docker"), "--logs.docker"]
    line_records = 24 << 20
    with MemoryLimit("bounds", LIMIT) as limit:
        with exporter_in(limit, args) as exporter:
            wait_for(lambda: (s := exporter.scrape()) and
                     sample(s, "xpu_exporter_container_log_lines_read_total") == 3 and s, timeout=20)
            written = 0
            for container in containers:
                record = b"".join(json_file_records(printed(container.name, "x" * 8, 1)))
                copies = line_records // len(record)
                container.append_raw(record * copies)
                written += copies
            samples = wait_for(lambda: (s := exporter.scrape()) and
                               sample(s, "xpu_exporter_container_log_lines_read_total") == 3 + written and s,
                               timeout=240)
            peak = peak_rss(exporter.process.pid)
        assert limit.oom_kills() == 0
    assert samples and peak < RSS_BOUND, peak


def test_a_rotated_gzip_bomb_is_cut_and_the_live_file_still_read(tmp_path):
    """A rotated .gz of under 1 MiB inflating to 256 MiB: at most INFLATE_RATIO times its size is inflated (the
    rest is counted as skipped), and the live file's line comes after it."""
    host = DockerHost(tmp_path)
    chat = host.add("vllm-chat")
    record = b"".join(json_file_records(printed("vllm-chat", "a", 1)))
    rotated = chat.directory / f"{chat.log.name}.1.gz"
    with gzip.open(rotated, "wb", compresslevel=9) as packed:
        for _ in range((256 << 20) // (1 << 20)):
            packed.write(record * ((1 << 20) // len(record)))
    assert rotated.stat().st_size < 1 << 20  # deflate packs a repeated record some 340 times
    chat.write([printed("vllm-chat", "live", 2)])
    with reader(LogDirectories(docker_roots=(str(tmp_path),))) as opened:
        got = read(opened)
        assert got[-1].message == "live"
        inflated = (len(got) - 1) * len(record)
        assert inflated <= logfile.INFLATE_RATIO * rotated.stat().st_size + len(record)
        assert opened.unreadable_entries == 1
