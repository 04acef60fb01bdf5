"""client_python's standard process and Python metrics describe the exporter's own process, read from its
own /proc whatever --path.procfs says (in a container that flag points at the host's /proc)."""

from __future__ import annotations

import os
import platform
import resource
import time
from pathlib import Path

import pytest

from exporterproc import RunningExporter
from fakeprocfs import FakeProcfs
from fakeze import FakeConfig, fake_driver_env, write_config
from scrapes import sample

DECOY_MAX_FDS = 7
DECOY_CPU_SECONDS = 3600


def procfs_with_a_decoy_self(base: Path) -> FakeProcfs:
    """A fake procfs whose `self` (pid 1) has a stat and limits unlike any real exporter: 1 page resident,
    an hour of CPU, started in 1970, 7 fds at most and none open; a collector reading it gets these."""
    procfs = FakeProcfs(base)
    (procfs.root / "stat").write_text("cpu  1 0 1 1 0 0 0 0 0 0\nbtime 1000\n")
    decoy = procfs.add_process(1).path
    fields = ["0"] * 50
    fields[0] = "S"
    fields[11] = str(DECOY_CPU_SECONDS * os.sysconf("SC_CLK_TCK"))  # utime, ticks
    fields[19] = "100"  # starttime, ticks after btime
    fields[20] = "4096"  # vsize, bytes
    fields[21] = "1"  # rss, pages
    (decoy / "stat").write_text(f"1 (decoy) {' '.join(fields)}\n")
    (decoy / "limits").write_text("Limit                     Soft Limit           Hard Limit           Units\n"
                                  f"Max open files            {DECOY_MAX_FDS}                    "
                                  f"{DECOY_MAX_FDS}                    files\n")
    return procfs


@pytest.mark.parametrize("procfs_flag", ["default", "decoy"])
def test_process_and_python_metrics_describe_the_exporters_own_process(tmp_path, fake_driver, config_path,
                                                                        procfs_flag):
    args = []
    if procfs_flag == "decoy":
        args = ["--path.procfs", str(procfs_with_a_decoy_self(tmp_path).root)]
    write_config(config_path, FakeConfig(devices=()))
    launched = time.time()
    with RunningExporter(["--no-collector.journal", *args], env=fake_driver_env(fake_driver, config_path)) as exporter:
        samples = exporter.scrape()
        scraped = time.time()

    resident = sample(samples, "process_resident_memory_bytes")
    assert resident is not None and resident > 1 << 20, "a Python interpreter's resident memory is megabytes"
    assert sample(samples, "process_virtual_memory_bytes") >= resident
    # the kernel's boot time is whole seconds and the wall clock may have been stepped since boot: a wide margin
    assert abs(sample(samples, "process_start_time_seconds") - launched) < 30
    assert 0 <= sample(samples, "process_cpu_seconds_total") <= (scraped - launched) * os.cpu_count() + 1
    assert sample(samples, "process_open_fds") >= 3  # at least stdin, stdout, stderr and the listening socket
    assert sample(samples, "process_max_fds") == resource.getrlimit(resource.RLIMIT_NOFILE)[0]  # inherited
    major, minor, patchlevel = platform.python_version_tuple()
    assert sample(samples, "python_info", version=platform.python_version(),
                  implementation=platform.python_implementation(), major=major, minor=minor,
                  patchlevel=patchlevel) == 1
    assert sample(samples, "python_gc_collections_total", generation="0") is not None
