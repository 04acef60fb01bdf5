"""The benchmark hosts: the real exporter process over the fake Level Zero driver, a fixture procfs
(`--path.procfs`) and a journal that gives the units' settings.

- small: 1 device, 3 units (the three-unit host of the problem statement), 6 GPU processes;
- large: 8 devices, 16 units (two per device), 64 GPU processes (four per unit).

Every device has every kind of device telemetry the exporter reads (all seven *_ALL engine groups, a card
power domain, three temperature sensors, three frequency domains, memory bandwidth counters, two RAS error
sets), so that a scrape costs what it costs on a host whose driver gives everything.

Each GPU process holds two DRM clients on its device, one of them also through a dup'd fd (3 DRM
fds, xe fdinfo, sizes in MiB), plus ordinary fds. Besides the GPU processes the procfs holds
`background` processes with ordinary fds only (files, pipes, /dev/null), as any host does: a scan
stats every fd of every process, so they cost scrape time too.

    with bench_host(LARGE, workdir, driver) as host:
        host.exporter.base_url ...
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from exporterproc import RunningExporter  # noqa: E402
from fakeprocfs import FakeProcfs, xe_fdinfo  # noqa: E402
from fakeze import (GiB, MiB, FakeConfig, FakeDevice, FakeEngine, FakeFrequency, FakeMemoryModule,  # noqa: E402
                    FakePower, FakeProcess, FakeRas, FakeTemperature, fake_driver_env, write_config)
from journalgen import Clock, random_boot_id, unit_output, unit_starting, write_journal  # noqa: E402

DEVICE_MEMORY = 16 * GiB
UTILISATIONS = (0.75, 0.07, 0.07, 0.05)


@dataclass(frozen=True)
class HostShape:
    name: str
    devices: int
    units: int
    gpu_processes: int
    background_processes: int
    background_fds: int  # ordinary fds of each background process
    gpu_process_other_fds: int = 20

    def describe(self) -> str:
        text = (f"{self.devices} device{'s' * (self.devices > 1)}, {self.units} units, {self.gpu_processes} GPU "
                f"processes with {3 + self.gpu_process_other_fds} fds each")
        if self.background_processes:
            text += f", {self.background_processes} other processes with {self.background_fds} fds each"
        return text


SMALL = HostShape("small", devices=1, units=3, gpu_processes=6, background_processes=0, background_fds=0)
LARGE = HostShape("large", devices=8, units=16, gpu_processes=64, background_processes=0, background_fds=0)
# The large host with the other processes a real host runs (a procfs scan stats every fd of every process).
LARGE_BUSY = HostShape("large+busy", devices=8, units=16, gpu_processes=64, background_processes=300,
                       background_fds=20)
SHAPES = {shape.name: shape for shape in (SMALL, LARGE, LARGE_BUSY)}


def pci_address(device: int) -> str:
    return f"0000:{0x03 + 0x10 * device:02x}:00.0"


def unit_name(shape: HostShape, unit: int) -> str:
    if shape.units == 3:
        return ("vllm-xpu-chat.service", "vllm-xpu-embedding.service", "vllm-xpu-stt.service")[unit]
    return f"vllm-xpu-{unit:02d}.service"


def device_of_unit(shape: HostShape, unit: int) -> int:
    return unit * shape.devices // shape.units


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    unit: int
    device: int
    memory: int  # device-local bytes over its clients


def gpu_processes(shape: HostShape) -> list[GpuProcess]:
    processes = []
    for index in range(shape.gpu_processes):
        unit = index % shape.units
        processes.append(GpuProcess(pid=10_000 + index, unit=unit, device=device_of_unit(shape, unit),
                                    memory=(256 + 64 * (index % 8)) * MiB))
    return processes


def build_procfs(shape: HostShape, base: Path) -> FakeProcfs:
    tree = FakeProcfs(base)
    client = 0
    for process in gpu_processes(shape):
        entry = tree.add_unit_process(process.pid, f"/system.slice/{unit_name(shape, process.unit)}")
        pdev = pci_address(process.device)
        for share in (3, 1):  # two clients: 3/4 and 1/4 of the process's memory
            client += 1
            entry.add_drm_fd(xe_fdinfo(client_id=client, pdev=pdev, vram0=process.memory * share // 4, unit="MiB"))
        entry.add_drm_fd(xe_fdinfo(client_id=client, pdev=pdev, vram0=process.memory // 4, unit="MiB"))  # dup'd
        entry.add_other_fds(shape.gpu_process_other_fds)
    for index in range(shape.background_processes):
        entry = tree.add_unit_process(20_000 + index, f"/system.slice/other-{index % 40}.service")
        entry.add_other_fds(shape.background_fds)
    return tree


ENGINE_GROUPS_ALL = (0, 1, 2, 3, 11, 12, 13)  # zes_engine_group_t: ALL, COMPUTE_ALL, ..., 3D_ALL
TELEMETRY_FAMILIES = ("xpu_engine_active_seconds_total", "xpu_energy_joules_total", "xpu_temperature_celsius",
                      "xpu_frequency_hertz", "xpu_frequency_throttled", "xpu_memory_read_bytes_total",
                      "xpu_memory_write_bytes_total", "xpu_memory_health", "xpu_ras_errors_total")


def telemetry(device: int) -> dict:
    """Every telemetry kind of one device, with values that differ from device to device."""
    return dict(
        engines=tuple(FakeEngine(group, 1_000_000 * (device + 1) + group) for group in ENGINE_GROUPS_ALL),
        power=(FakePower(energy_uj=3_600_000_000 + device, card=True),),
        temperatures=tuple(FakeTemperature(sensor, 60.0 + device + sensor) for sensor in (0, 1, 2)),
        frequencies=tuple(FakeFrequency(domain, 2000.0 - 100 * domain, throttle=device % 2) for domain in (0, 1, 2)),
        ras=(FakeRas(0, (0, 0, 0, device, 0, 0, 0)), FakeRas(1)),
    )


def fake_config(shape: HostShape) -> FakeConfig:
    by_device: dict[int, list[GpuProcess]] = {}
    for process in gpu_processes(shape):
        by_device.setdefault(process.device, []).append(process)
    devices = []
    for device in range(shape.devices):
        held = by_device.get(device, [])
        used = sum(p.memory for p in held) + 512 * MiB
        devices.append(FakeDevice(
            pci_address=pci_address(device), name="Intel(R) Arc(TM) A770 Graphics", driver_version="1.3.24595",
            memory=(FakeMemoryModule(size=DEVICE_MEMORY, free=DEVICE_MEMORY - used,
                                     bandwidth=(GiB * (device + 1), MiB * (device + 1), 560 * 10**9)),),
            processes=tuple(FakeProcess(p.pid, p.memory) for p in held), **telemetry(device)))
    return FakeConfig(devices=tuple(devices))


def settings_journal(shape: HostShape, path: Path) -> Path:
    """Each unit's latest start as vLLM 0.24 prints it: version, non-default args, KV cache, init done."""
    clock = Clock(random_boot_id())
    entries = []
    for unit in range(shape.units):
        name = unit_name(shape, unit)
        api, core = f"(APIServer pid={100 + unit}) INFO 12-02 10:00:00 ", f"(EngineCore pid={200 + unit}) INFO "
        entries += [
            unit_starting(name, clock.tick()),
            unit_output(name, api + "[api_server.py:1873] vLLM API server version 0.24.0", clock.tick()),
            unit_output(name, api + "[utils.py:326] non-default args: {'model': 'Qwen/Qwen3-8B', 'max_model_len': "
                                    f"32768, 'gpu_memory_utilization': {UTILISATIONS[unit % 4]}}}", clock.tick()),
            unit_output(name, core + "12-02 10:00:20 [gpu_worker.py:456] Available KV cache memory: 3.25 GiB",
                        clock.tick()),
            unit_output(name, core + "12-02 10:00:21 [kv_cache_utils.py:1286] GPU KV cache size: 47,328 tokens",
                        clock.tick()),
            unit_output(name, core + "12-02 10:00:40 [core.py:210] init engine (profile, create kv cache, warmup "
                                     "model) took 42.50 seconds", clock.tick()),
        ]
    return write_journal(path, entries)


@dataclass
class BenchHost:
    shape: HostShape
    procfs: FakeProcfs
    journal_files: list[Path]
    exporter: RunningExporter

    @property
    def pid(self) -> int:
        return self.exporter.process.pid


@contextmanager
def bench_host(shape: HostShape, workdir: Path, driver: Path, extra_journal_files: Sequence[Path] = (),
               exporter_args: Sequence[str] = (),
               exporter_command: Sequence[str] | None = None) -> Iterator[BenchHost]:
    """Build the host under `workdir` (best on a tmpfs, like /proc itself) and run the exporter over it.
    `extra_journal_files` are read too (e.g. a big journal for catch-up, a live one to append to);
    `exporter_command` replaces `python -m vllm_xpu_exporter` (e.g. to start it in a cgroup)."""
    workdir.mkdir(parents=True, exist_ok=True)
    procfs = build_procfs(shape, workdir / "host")
    config = workdir / "fake_ze.conf"
    write_config(config, fake_config(shape))
    journals = [settings_journal(shape, workdir / "settings.journal"), *extra_journal_files]
    args = ["--path.procfs", str(procfs.root), "--journal.boot", "all"]
    for journal in journals:
        args += ["--journal.file", str(journal)]
    exporter = RunningExporter([*args, *exporter_args], env=fake_driver_env(driver, config),
                               command=exporter_command)
    try:
        yield BenchHost(shape, procfs, journals, exporter)
    finally:
        exporter.stop()


def in_memory_directory() -> str | None:
    """/dev/shm when there is one (a fixture procfs on tmpfs, like procfs, is in memory)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else None
