"""The exporter over a fake sysfs, in private namespaces: DRM node names from real libudev, and GPUs that
are plugged or unplugged while it runs appear and disappear with a fresh Level Zero init."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from exporterproc import REPO
from fakesysfs import FakeGpu, FakeSysfs, SysfsNamespace
from fakeze import A770, B580, FakeConfig, fake_driver_env, write_config
from polling import wait_for
from scrapes import parse_samples, sample

A770_SYSFS = FakeGpu("0000:03:00.0", card=1, render=128)
B580_SYSFS = FakeGpu("0000:83:00.0", card=2, render=129, driver="xe", device_id=0xE20B, bridges=("0000:80:01.0",))
SCRAPE = """
import sys, time, urllib.request
for _ in range(200):
    try:
        sys.stdout.write(urllib.request.urlopen("http://127.0.0.1:10447/metrics", timeout=10).read().decode())
        break
    except OSError:
        time.sleep(0.05)
"""


def scrape(ns: SysfsNamespace) -> dict:
    text = ns.run([sys.executable, "-c", SCRAPE], timeout=30).stdout
    assert text, ns.output()
    return parse_samples(text)


def device_info(samples: dict) -> dict[str, tuple[str, str]]:
    return {dict(labels)["device"]: (dict(labels)["card"], dict(labels)["render_node"])
            for (name, labels) in samples if name == "xpu_device_info"}


@pytest.fixture
def exporter_ns(tmp_path: Path, fake_driver: Path, config_path: Path):
    write_config(config_path, FakeConfig(devices=(A770,)))
    command = [sys.executable, "-m", "vllm_xpu_exporter", "--no-collector.journal", "--no-collector.processes"]
    env = {**fake_driver_env(fake_driver, config_path), "PATH": "/usr/bin:/bin"}
    with SysfsNamespace(FakeSysfs.create(tmp_path / "sys", [A770_SYSFS]), command, env=env, cwd=REPO) as ns:
        ns.wait_for_output(lambda line: "listening on" in line)
        yield ns


def test_device_info_carries_the_card_and_render_node_udev_knows(exporter_ns):
    samples = scrape(exporter_ns)
    assert device_info(samples) == {"0000:03:00.0": ("card1", "renderD128")}


def test_a_hotplugged_gpu_appears_and_an_unplugged_one_disappears_without_a_restart(exporter_ns, config_path):
    assert set(device_info(scrape(exporter_ns))) == {"0000:03:00.0"}
    exporter_pid = exporter_ns.pid

    write_config(config_path, FakeConfig(devices=(A770, B580)))
    exporter_ns.hotplug_add(B580_SYSFS)
    plugged = wait_for(lambda: (s := scrape(exporter_ns)) and "0000:83:00.0" in device_info(s) and s)
    assert device_info(plugged) == {"0000:03:00.0": ("card1", "renderD128"), "0000:83:00.0": ("card2", "renderD129")}
    assert sample(plugged, "xpu_memory_total_bytes", device="0000:83:00.0") == B580.memory[0].size

    write_config(config_path, FakeConfig(devices=(A770,)))
    exporter_ns.hotplug_remove(B580_SYSFS)
    unplugged = wait_for(lambda: (s := scrape(exporter_ns)) and "0000:83:00.0" not in device_info(s) and s)
    assert set(device_info(unplugged)) == {"0000:03:00.0"}
    assert sample(unplugged, "xpu_exporter_collector_success", collector="levelzero") == 1
    assert exporter_ns.pid == exporter_pid and exporter_ns.process.poll() is None
    assert "re-initialising Level Zero" in exporter_ns.output()


def test_a_rebound_gpu_gets_a_fresh_level_zero_init(exporter_ns, config_path):
    before = scrape(exporter_ns)
    renamed = dataclasses.replace(A770, driver_version="1.3.99999")
    write_config(config_path, FakeConfig(devices=(renamed,)))
    assert sample(scrape(exporter_ns), "xpu_device_info", device="0000:03:00.0", name=A770.name,
                  uuid="10111213-1415-1617-1819-1a1b1c1d1e1f", driver_version="1.3.99999", card="card1",
                  render_node="renderD128") is None, "identity is read once per Level Zero init"

    exporter_ns.hotplug_remove(A770_SYSFS)
    exporter_ns.hotplug_add(A770_SYSFS)
    rebound = wait_for(lambda: sample(s := scrape(exporter_ns), "xpu_device_info", device="0000:03:00.0",
                                      name=A770.name, uuid="10111213-1415-1617-1819-1a1b1c1d1e1f",
                                      driver_version="1.3.99999", card="card1", render_node="renderD128") and s)
    assert rebound, exporter_ns.output()
    assert before != rebound
