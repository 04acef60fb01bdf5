"""The Level Zero worker in this process, its child over the real loader and the fake driver: what crosses the
pipe (the binding's dataclasses, a LevelZeroError's function and code), the worker's states, and GPU changes."""

from __future__ import annotations

import dataclasses
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakeze import (A770, A770_TELEMETRY, B580, B580_TELEMETRY, TELEMETRY_KINDS, FakeConfig, FakeMemoryModule,
                    write_config)
from polling import wait_for
from sizes import GiB, MiB

from vllm_xpu_exporter.sources.levelzero.binding import (
    DeviceIdentity,
    EnergyCounter,
    EngineActivity,
    Frequency,
    LevelZeroError,
    LoaderUnavailable,
    MemoryBandwidth,
    MemoryModule,
    MemoryModuleProperties,
    ProcessMemory,
    RasErrors,
    Temperature,
)
from vllm_xpu_exporter.sources.levelzero.telemetry import DeviceTelemetry
from vllm_xpu_exporter.sources.levelzero.wire import to_wire
from vllm_xpu_exporter.sources.levelzero.worker import DeviceMemory, LevelZeroUnavailable, LevelZeroWorker, WorkerState

UNSUPPORTED_FEATURE = 0x78000003
DEVICE_LOST = 0x70000001
INSUFFICIENT_PERMISSIONS = 0x70010000
A770_IDENTITY = DeviceIdentity("0000:03:00.0", "Intel(R) Arc(TM) A770 Graphics",
                               "10111213-1415-1617-1819-1a1b1c1d1e1f", "1.3.24595")


@pytest.fixture
def configure(level_zero_children: list[subprocess.Popen], config_path: Path):
    """Point this process's children at the fake driver; returns a function that sets its config."""
    return lambda *devices, **options: write_config(config_path, FakeConfig(devices=devices, **options))


@pytest.fixture
def worker() -> Iterator[LevelZeroWorker]:
    worker = LevelZeroWorker(timeout=2.0)
    yield worker
    worker.close()


def read_memory(worker: LevelZeroWorker) -> list | None:
    """The memory reading, or None while the worker says Level Zero is not there yet."""
    try:
        return worker.read_memory()
    except LevelZeroUnavailable:
        return None


def test_a_worker_without_telemetry_reads_memory_and_no_telemetry_kind(configure):
    configure(A770_TELEMETRY)
    worker = LevelZeroWorker(timeout=2.0, telemetry=False)
    try:
        (device,) = worker.read_memory()
    finally:
        worker.close()
    assert (device.total, device.free, device.error) == (16 * GiB, 13 * GiB, None)
    assert device.telemetry == DeviceTelemetry()
    assert device.errors == ()


def test_the_worker_knows_the_loaders_own_version_once_its_child_has_initialised(configure, worker):
    configure(A770)
    assert worker.loader_versions == {}
    worker.read_memory_when_ready()
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", worker.loader_versions["loader"]), worker.loader_versions


def test_readings_are_the_bindings_own_dataclasses_rebuilt_in_the_parent(configure, worker):
    configure(A770, B580)
    (a770, b580) = worker.read_memory()
    assert a770.identity == A770_IDENTITY
    assert a770.modules == (MemoryModuleProperties(handle=a770.modules[0].handle, device_local=True,
                                                   physical_size=16 * GiB),)
    assert a770.states == (MemoryModule(device_local=True, size=16 * GiB, free=13 * GiB, health=1),)
    assert (a770.total, a770.free, a770.error) == (16 * GiB, 13 * GiB, None)
    assert b580.identity.pci_address == "0000:83:00.0"

    processes = {reading.identity.pci_address: reading.processes for reading in worker.read_processes()}
    assert processes["0000:03:00.0"] == (ProcessMemory(1000, 2 * GiB, 0, 2), ProcessMemory(1001, GiB, 64 * MiB, 2))
    assert processes["0000:83:00.0"] == (ProcessMemory(2000, GiB, 0, 0x22),), "the engines cross the pipe too"


def test_a_request_is_answered_when_its_result_is_read_and_the_same_answer_every_time_after(configure, worker):
    configure(A770)
    pending = worker.request_memory()
    configure(dataclasses.replace(A770, memory=(FakeMemoryModule(size=16 * GiB, free=5 * GiB),)))
    (first,) = pending.result()
    assert pending.result() == [first]
    assert first.free in (13 * GiB, 5 * GiB)  # the child may have answered before the change
    (now,) = worker.read_memory()
    assert now.free == 5 * GiB


def test_an_answer_never_read_is_not_taken_for_the_next_requests(configure, worker):
    configure(A770)
    worker.read_memory()
    unread = worker.request_memory()
    assert wait_for(lambda: select.select([worker._child.stdout], [], [], 0)[0])  # the child has answered
    configure(dataclasses.replace(A770, memory=(FakeMemoryModule(size=16 * GiB, free=5 * GiB),)))
    (now,) = worker.read_memory()
    assert now.free == 5 * GiB
    with pytest.raises(LevelZeroUnavailable):
        unread.result()


def test_a_failing_memory_state_keeps_the_sizes_and_the_errors_function_and_code(configure, worker):
    configure(A770, dataclasses.replace(B580, memory_state_result="ZE_RESULT_ERROR_UNSUPPORTED_FEATURE"))
    (a770, b580) = worker.read_memory()
    assert a770.error is None and a770.free == 13 * GiB
    assert isinstance(b580.error, LevelZeroError)
    assert (b580.error.function, b580.error.code) == ("zesMemoryGetState", UNSUPPORTED_FEATURE)
    assert b580.states is None
    assert (b580.total, b580.free) == (12 * GiB, None)
    assert worker.state is WorkerState.READY


def test_a_failing_module_enumeration_keeps_the_identity_and_the_errors_function_and_code(configure, worker):
    configure(dataclasses.replace(A770, memory_modules_result="ZE_RESULT_ERROR_UNSUPPORTED_FEATURE"))
    (a770,) = worker.read_memory()
    assert a770.identity == A770_IDENTITY
    assert (a770.error.function, a770.error.code) == ("zesDeviceEnumMemoryModules", UNSUPPORTED_FEATURE)
    assert (a770.modules, a770.states, a770.total, a770.free) == ((), None, None, None)


def test_a_lost_device_answers_this_read_and_the_next_one_re_initialises(configure, worker, level_zero_children):
    configure(dataclasses.replace(A770, memory_state_result="ZE_RESULT_ERROR_DEVICE_LOST"))
    (a770,) = worker.read_memory()
    assert (a770.error.function, a770.error.code) == ("zesMemoryGetState", DEVICE_LOST)
    assert worker.state is WorkerState.IDLE
    configure(A770)
    (a770,) = worker.read_memory()
    assert a770.free == 13 * GiB and len(level_zero_children) == 2


def test_a_failed_init_carries_the_function_and_code_says_why_and_backs_off(configure, worker, level_zero_children):
    configure(A770, init_result="ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS")
    with pytest.raises(LevelZeroUnavailable) as failed:
        worker.read_memory()
    assert failed.value.error.function in ("zeInit", "zesInit")
    assert failed.value.error.code == INSUFFICIENT_PERMISSIONS
    assert str(failed.value) == (f"Level Zero initialisation failed: {failed.value.error} "
                                 "(no access to /dev/dri/renderD*: run the exporter in the render group)")
    assert worker.state is WorkerState.BACKING_OFF

    with pytest.raises(LevelZeroUnavailable) as again:
        worker.read_memory()
    assert str(again.value) == str(failed.value) and again.value.error.code == INSUFFICIENT_PERMISSIONS
    assert len(level_zero_children) == 1, "no new child within the backoff"


def test_a_missing_loader_is_reported_as_such_without_a_driver_hint(configure):
    configure(A770)
    worker = LevelZeroWorker("/nonexistent/libze_loader.so.1")
    try:
        with pytest.raises(LevelZeroUnavailable) as failed:
            worker.read_memory()
    finally:
        worker.close()
    assert isinstance(failed.value.error, LoaderUnavailable)
    assert failed.value.error.library == "/nonexistent/libze_loader.so.1"
    assert str(failed.value).startswith(
        "Level Zero initialisation failed: cannot load the Level Zero loader /nonexistent/libze_loader.so.1: ")
    assert "kernel driver" not in str(failed.value)


def test_the_worker_goes_from_idle_through_initialising_to_ready_and_back_to_idle(configure, worker):
    configure(A770)
    assert worker.state is WorkerState.IDLE
    worker.start()
    assert worker.state is WorkerState.INITIALISING
    assert wait_for(lambda: read_memory(worker))
    assert worker.state is WorkerState.READY
    worker.close()
    assert worker.state is WorkerState.IDLE


def test_gpu_changes_mark_the_child_stale_and_the_next_read_restarts_it_once(configure, worker, level_zero_children):
    configure(A770)
    assert [device.identity.pci_address for device in worker.read_memory()] == ["0000:03:00.0"]
    configure(A770, B580)
    for action in ("add", "add", "add", "bind"):  # one hot-plug's burst of uevents
        worker.gpu_changed(action, "0000:83:00.0")
    assert len(level_zero_children) == 1 and worker.state is WorkerState.READY, "the caller's thread starts nothing"

    assert [device.identity.pci_address for device in worker.read_memory()] == ["0000:03:00.0", "0000:83:00.0"]
    assert len(level_zero_children) == 2
    worker.read_memory()
    assert len(level_zero_children) == 2, "one restart per burst"


def test_a_gpu_change_does_not_wait_for_a_read_stuck_in_the_driver(configure, worker):
    configure(dataclasses.replace(A770, memory_state_hang=True))
    worker.start()
    reader = threading.Thread(target=read_memory, args=(worker,))
    reader.start()
    try:
        time.sleep(0.5)  # the read is waiting for the hung child, holding the worker
        started = time.monotonic()
        worker.gpu_changed("change", "0000:03:00.0")
        assert time.monotonic() - started < 1.0  # waiting for the hung read would take its timeout (4 s)
    finally:
        reader.join()


# ---------------------------------------------------------------------------------------------- telemetry

def untimed(values: tuple) -> list:
    return [dataclasses.replace(value, timestamp=0) for value in values]


def test_telemetry_crosses_the_pipe_as_the_bindings_dataclasses_with_the_memory_reading(configure, worker):
    configure(A770_TELEMETRY, B580_TELEMETRY)
    (a770, b580) = worker.read_memory()
    telemetry = a770.telemetry
    assert untimed(telemetry["engines"].values) == [EngineActivity(group, False, 0, active, 0) for group, active in
                                                 [(0, 90_000_000), (1, 80_000_000), (12, 5_000_000), (2, 2_000_000),
                                                  (3, 12_500_000), (13, 250_000), (11, 85_000_000)]], \
        "the *_ALL groups only: the single compute engine is not read"
    assert untimed(telemetry["energy"].values) == [EnergyCounter(True, 1_500_000_000, 0)]
    assert telemetry["temperatures"].values == (Temperature(0, False, 0, 71.5), Temperature(1, False, 0, 68.0),
                                             Temperature(2, False, 0, 74.0)), "no minimum sensor"
    assert telemetry["frequencies"].values == (Frequency(0, False, 0, 2100.0, 0b1001), Frequency(1, False, 0, 1093.0, 0),
                                            Frequency(2, False, 0, 1050.0, 0))
    assert untimed(telemetry["memory_bandwidth"].values) == [MemoryBandwidth(7_000_000_000, 3_000_000_000,
                                                                          560_000_000_000, 0)]
    assert telemetry["ras"].values == (RasErrors(0, False, 0, (0, 0, 1, 5, 0, 2, 0)),
                                    RasErrors(1, False, 0, (1, 0, 0, 0, 0, 0, 0)))
    assert all(kind.error is None for kind in telemetry.kinds().values())
    assert [counter.energy for counter in b580.telemetry["energy"].values] == [800_000_000]
    assert [sensor.celsius for sensor in b580.telemetry["temperatures"].values if sensor.sensor == 1] == [52.5]


def test_every_reading_crosses_the_pipe_as_asdict_would_write_it(configure, worker):
    configure(A770_TELEMETRY, B580_TELEMETRY)
    readings = worker.read_memory()
    values = [reading.identity for reading in readings]
    for reading in readings:
        values += [*reading.modules, *reading.states]
        for kind in reading.telemetry.kinds().values():
            values += kind.values
    values += [process for reading in worker.read_processes() for process in reading.processes]
    assert {type(value).__name__ for value in values} >= {
        "DeviceIdentity", "MemoryModuleProperties", "MemoryModule", "EngineActivity", "EnergyCounter", "Temperature",
        "Frequency", "MemoryBandwidth", "RasErrors", "ProcessMemory"}
    for value in values:
        assert to_wire(value) == dataclasses.asdict(value)


def test_a_kind_whose_enumeration_failed_answers_its_error_at_every_read(configure, worker, level_zero_children):
    configure(dataclasses.replace(A770_TELEMETRY, telemetry_enum_results={"ras": "ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS"}))
    for _ in range(2):
        (a770,) = worker.read_memory()
        assert (a770.telemetry["ras"].error.function, a770.telemetry["ras"].error.code) == (
            "zesDeviceEnumRasErrorSets", INSUFFICIENT_PERMISSIONS)
        assert a770.telemetry["ras"].values == ()
        assert [engine.active_time for engine in a770.telemetry["engines"].values
                if engine.group == 1] == [80_000_000]
        assert a770.errors == (a770.telemetry["ras"].error,)
    assert worker.state is WorkerState.READY and len(level_zero_children) == 1


def test_telemetry_is_enumerated_again_only_by_a_new_child(configure, worker, level_zero_children):
    configure(A770_TELEMETRY)
    worker.read_memory()
    doubled = tuple(dataclasses.replace(engine, active_us=2 * engine.active_us) for engine in A770_TELEMETRY.engines)
    configure(dataclasses.replace(A770_TELEMETRY, engines=doubled,
                                  telemetry_enum_results={kind: "ZE_RESULT_ERROR_UNKNOWN" for kind in TELEMETRY_KINDS}))
    (same_child,) = worker.read_memory()
    assert same_child.errors == (), "the first enumeration's components are read again, not enumerated"
    assert [engine.active_time for engine in same_child.telemetry["engines"].values
            if engine.group == 1] == [160_000_000]
    worker.gpu_changed("change", "0000:03:00.0")
    (new_child,) = worker.read_memory()
    assert len(level_zero_children) == 2
    assert {error.function for error in new_child.errors} == {
        "zesDeviceEnumEngineGroups", "zesDeviceGetCardPowerDomain", "zesDeviceEnumTemperatureSensors",
        "zesDeviceEnumFrequencyDomains", "zesDeviceEnumRasErrorSets"}


def test_a_lost_device_in_a_telemetry_read_makes_the_next_read_re_initialise(configure, worker):
    configure(dataclasses.replace(A770_TELEMETRY, telemetry_results={"engines": "ZE_RESULT_ERROR_DEVICE_LOST"}))
    (a770,) = worker.read_memory()
    assert (a770.telemetry["engines"].error.function, a770.telemetry["engines"].error.code) == (
        "zesEngineGetActivity", DEVICE_LOST)
    assert a770.free == 13 * GiB, "this read is answered"
    assert worker.state is WorkerState.IDLE




@pytest.mark.parametrize(("healths", "expected"), [((1, 1), 1), ((1, 0), 0), ((0, 2), 2), ((3, 2), 3), ((4, 3), 4)])
def test_memory_health_is_the_worst_of_the_local_modules(healths, expected):
    states = tuple(MemoryModule(True, GiB, GiB, health) for health in healths)
    reading = DeviceMemory(A770_IDENTITY, (), (*states, MemoryModule(False, GiB, GiB, 4)), None)
    assert reading.health == expected
    assert dataclasses.replace(reading, states=None).health is None


PARENT_SCRIPT = """
from vllm_xpu_exporter.sources.levelzero.worker import LevelZeroWorker
LevelZeroWorker(timeout=600.0).read_memory()  # its child starts, and hangs in zeInit
"""


def level_zero_child_of(parent: int) -> int | None:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent and b"vllm_xpu_exporter.sources.levelzero.child" in cmdline:
            return int(stat.parent.name)
    return None


def test_a_child_hung_in_the_driver_ends_when_the_process_that_started_it_is_killed(configure, tmp_path):
    """zeInit never returns and the parent is killed (no close, no kill of its child): the child, which never
    reads its closed stdin, still ends, instead of staying behind for good."""
    configure(A770, init_hang=True)
    parent = subprocess.Popen([sys.executable, "-c", PARENT_SCRIPT])
    try:
        child = wait_for(lambda: level_zero_child_of(parent.pid), timeout=30, interval=0.1)
        assert child, "the worker started no Level Zero child"
    finally:
        parent.kill()
        parent.wait()

    def ended() -> bool:
        try:
            return Path(f"/proc/{child}/stat").read_text().rsplit(") ", 1)[1].startswith("Z")
        except OSError:
            return True

    assert wait_for(ended, timeout=15, interval=0.1), Path(f"/proc/{child}/status").read_text()[:300]
