"""vllm_xpu_exporter.sources.levelzero.binding against the real Level Zero loader and the fake driver.

Level Zero initialisation is per process (a failed zeInit is final; the driver decides on
Sysman at the first zeInit), so every scenario runs in a fresh Python subprocess (a small
script printing JSON); the pytest process never loads the loader.
"""

from __future__ import annotations

import json
import os
import pickle
import select
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from vllm_xpu_exporter.sources.levelzero.binding import (
    LevelZeroError,
    LoaderUnavailable,
    format_uuid,
    result_name,
)
from fakeze import (
    A770,
    A770_TELEMETRY,
    B580,
    B580_TELEMETRY,
    TELEMETRY_KINDS,
    FakeConfig,
    FakeDevice,
    FakeMemoryModule,
    FakePower,
    FakeProcess,
    FakeRas,
    FakeTemperature,
    GiB,
    MiB,
    default_uuid,
    fake_driver_env,
    write_config,
)

REPOSITORY = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
SCRIPT_TIMEOUT_S = 30

# Defines attempt(call): the call's result as JSON-ready data, or what it raised.
PRELUDE = """
import json, os
from dataclasses import asdict, replace
from pathlib import Path
from vllm_xpu_exporter.sources.levelzero.binding import LevelZero, LevelZeroError

def attempt(call):
    try:
        value = call()
    except LevelZeroError as error:
        return {"raised": type(error).__name__, "function": error.function, "name": error.name,
                "code": error.code, "message": str(error)}
    if isinstance(value, list):
        return [asdict(item) for item in value]
    return asdict(value) if value is not None else None
"""


def child_env(driver: Path | list[Path], config_path: Path, **overrides: str | None) -> dict[str, str]:
    """This environment without Level Zero variables, plus the fake driver's; None removes a variable."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ZE_", "ZES_", "ZET_", "FAKE_ZE_"))}
    env.update(fake_driver_env(driver, config_path))
    env["PYTHONPATH"] = str(TESTS)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_script(script: str, env: dict[str, str]) -> Any:
    """Run PRELUDE + script in a fresh interpreter; it must exit 0 (no crash) and print JSON."""
    completed = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(script)],
        env=env,
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        check=False,
    )
    assert completed.returncode == 0, f"exit status {completed.returncode}\nstderr:\n{completed.stderr}"
    return json.loads(completed.stdout)


def scenario(fake_driver: Path, config_path: Path, config: FakeConfig, script: str, **env: str | None) -> Any:
    write_config(config_path, config)
    return run_script(script, child_env(fake_driver, config_path, **env))


READ_EVERYTHING = """
level_zero = LevelZero()
level_zero.init()
print(json.dumps([
    {"identity": attempt(device.identity), "memory": attempt(device.memory), "processes": attempt(device.processes)}
    for device in level_zero.devices()
]))
"""


def raised(function: str, name: str, code: int) -> dict[str, Any]:
    return {
        "raised": "LevelZeroError",
        "function": function,
        "name": name,
        "code": code,
        "message": f"{function}: {name} (0x{code:08x})",
    }


def memory(size: int, free: int, device_local: bool = True, health: int = 1) -> dict[str, Any]:
    return {"device_local": device_local, "size": size, "free": free, "health": health}


# ------------------------------------------------------------------------------------ devices


def test_two_devices_report_exact_identity_memory_and_processes(fake_driver: Path, config_path: Path) -> None:
    devices = scenario(fake_driver, config_path, FakeConfig(devices=(A770, B580)), READ_EVERYTHING)

    assert devices == [
        {
            "identity": {
                "pci_address": "0000:03:00.0",
                "name": "Intel(R) Arc(TM) A770 Graphics",
                "uuid": "10111213-1415-1617-1819-1a1b1c1d1e1f",
                "driver_version": "1.3.24595",
            },
            "memory": [memory(size=16 * GiB, free=13 * GiB)],
            "processes": [
                {"pid": 1000, "mem_size": 2 * GiB, "shared_size": 0, "engines": 2},
                {"pid": 1001, "mem_size": GiB, "shared_size": 64 * MiB, "engines": 2},
            ],
        },
        {
            "identity": {
                "pci_address": "0000:83:00.0",
                "name": "Intel(R) Arc(TM) B580 Graphics",
                "uuid": "86800be2-0000-0000-8300-000000000000",
                "driver_version": "1.6.32224",
            },
            "memory": [memory(size=12 * GiB, free=11 * GiB)],
            "processes": [{"pid": 2000, "mem_size": GiB, "shared_size": 0, "engines": 0x22}],
        },
    ]
    used = [module["size"] - module["free"] for device in devices for module in device["memory"]]
    assert used == [3 * GiB, 1 * GiB]


def test_module_command_line_prints_the_devices_as_json(fake_driver: Path, config_path: Path) -> None:
    write_config(config_path, FakeConfig(devices=(A770,)))
    completed = subprocess.run(
        [sys.executable, "-m", "vllm_xpu_exporter.sources.levelzero.binding"],
        env=child_env(fake_driver, config_path),
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    output = json.loads(completed.stdout)
    assert output["sysman_only"] is False  # Debian 12's loader 1.8.12 has no zesInit: legacy path
    assert [device["identity"]["pci_address"] for device in output["devices"]] == ["0000:03:00.0"]
    assert output["devices"][0]["memory"] == [memory(size=16 * GiB, free=13 * GiB)]


def test_system_memory_module_is_reported_but_not_device_local(fake_driver: Path, config_path: Path) -> None:
    device = replace(
        A770,
        memory=(FakeMemoryModule(size=16 * GiB, free=13 * GiB), FakeMemoryModule(32 * GiB, 30 * GiB, device_local=False)),
    )
    [result] = scenario(fake_driver, config_path, FakeConfig(devices=(device,)), READ_EVERYTHING)
    assert result["memory"] == [
        memory(size=16 * GiB, free=13 * GiB),
        memory(size=32 * GiB, free=30 * GiB, device_local=False),
    ]


def test_zero_devices_gives_an_empty_device_list(fake_driver: Path, config_path: Path) -> None:
    assert scenario(fake_driver, config_path, FakeConfig(), READ_EVERYTHING) == []


def test_free_equal_to_size_is_reported_as_is(fake_driver: Path, config_path: Path) -> None:
    # What i915/xe report without CAP_PERFMON; the bindings do not second-guess it.
    device = replace(A770, memory=(FakeMemoryModule(size=16 * GiB, free=16 * GiB),))
    [result] = scenario(fake_driver, config_path, FakeConfig(devices=(device,)), READ_EVERYTHING)
    assert result["memory"] == [memory(size=16 * GiB, free=16 * GiB)]


READ_CORE_MEMORY = """
level_zero = LevelZero()
level_zero.init()
print(json.dumps([attempt(device.core_memory) for device in level_zero.devices()]))
"""


def test_the_core_total_is_the_user_mode_drivers_and_the_extension_gives_usable_memory_where_listed(
        fake_driver: Path, config_path: Path) -> None:
    device = replace(A770, memory=(FakeMemoryModule(size=16 * GiB, free=13 * GiB),
                                   FakeMemoryModule(size=32 * GiB, free=30 * GiB, device_local=False)))
    listed = FakeConfig(devices=(device, replace(B580, usable_memory=GiB)), usable_memory_extension=True)
    core = 16 * GiB * 95 // 100
    assert scenario(fake_driver, config_path, listed, READ_CORE_MEMORY) == [
        {"total": core, "usable": 13 * GiB - (16 * GiB - core)}, {"total": 12 * GiB * 95 // 100, "usable": GiB}]
    unlisted = FakeConfig(devices=(device,))
    assert scenario(fake_driver, config_path, unlisted, READ_CORE_MEMORY) == [{"total": core, "usable": None}]


def test_the_core_memory_stands_when_sysmans_memory_state_is_refused(fake_driver: Path, config_path: Path) -> None:
    refused = replace(A770, usable_memory=5 * GiB, memory_state_result="ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS")
    config = FakeConfig(devices=(refused,), usable_memory_extension=True)
    script = """
    level_zero = LevelZero()
    level_zero.init()
    [device] = level_zero.devices()
    print(json.dumps({"memory": attempt(device.memory), "core": attempt(device.core_memory)}))
    """
    result = scenario(fake_driver, config_path, config, script)
    assert result["memory"]["name"] == "ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS"
    assert result["core"] == {"total": 16 * GiB * 95 // 100, "usable": 5 * GiB}


def test_state_size_zero_falls_back_to_physical_size(fake_driver: Path, config_path: Path) -> None:
    device = replace(
        A770, memory=(FakeMemoryModule(size=0, free=5 * GiB, physical_size=8 * GiB, health=2),)
    )
    [result] = scenario(fake_driver, config_path, FakeConfig(devices=(device,)), READ_EVERYTHING)
    assert result["memory"] == [memory(size=8 * GiB, free=5 * GiB, health=2)]


MEMORY_MODULES_SCRIPT = """
level_zero = LevelZero()
level_zero.init()
[device] = level_zero.devices()
modules = attempt(device.memory_modules)
if isinstance(modules, list):  # handles are addresses: not compared
    modules = [{key: value for key, value in module.items() if key != "handle"} for module in modules]
print(json.dumps({"modules": modules, "memory": attempt(device.memory)}))
"""


def test_memory_modules_give_their_properties_while_the_state_query_fails(fake_driver: Path,
                                                                        config_path: Path) -> None:
    device = replace(A770, memory=(FakeMemoryModule(size=15 * GiB, free=5 * GiB, physical_size=16 * GiB),
                                   FakeMemoryModule(size=32 * GiB, free=30 * GiB, device_local=False)),
                     memory_state_result="ZE_RESULT_ERROR_UNSUPPORTED_FEATURE")
    result = scenario(fake_driver, config_path, FakeConfig(devices=(device,)), MEMORY_MODULES_SCRIPT)
    assert result["modules"] == [{"device_local": True, "physical_size": 16 * GiB},
                                 {"device_local": False, "physical_size": 32 * GiB}]
    assert result["memory"] == raised("zesMemoryGetState", "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE", 0x78000003)


def test_failing_memory_module_enumeration_raises_for_modules_and_memory(fake_driver: Path,
                                                                        config_path: Path) -> None:
    device = replace(A770, memory_modules_result="ZE_RESULT_ERROR_UNSUPPORTED_FEATURE")
    result = scenario(fake_driver, config_path, FakeConfig(devices=(device,)), MEMORY_MODULES_SCRIPT)
    expected = raised("zesDeviceEnumMemoryModules", "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE", 0x78000003)
    assert result == {"modules": expected, "memory": expected}


def test_default_uuid_is_derived_from_device_id_and_pci_address(fake_driver: Path, config_path: Path) -> None:
    device = FakeDevice(pci_address="0001:0a:1f.3", device_id=0x56A1)
    [result] = scenario(fake_driver, config_path, FakeConfig(devices=(device,)), READ_EVERYTHING)
    assert result["identity"]["pci_address"] == "0001:0a:1f.3"
    assert result["identity"]["uuid"] == format_uuid(default_uuid("0001:0a:1f.3", 0x56A1))
    assert result["identity"]["uuid"] == "8680a156-0000-0100-0a1f-030000000000"


def test_devices_lists_only_gpus(fake_driver: Path, config_path: Path) -> None:
    cpu = FakeDevice(pci_address="0000:00:02.0", device_type=2)
    script = """
    level_zero = LevelZero()
    level_zero.init()
    print(json.dumps([device.identity().pci_address for device in level_zero.devices()]))
    """
    assert scenario(fake_driver, config_path, FakeConfig(devices=(cpu, A770)), script) == ["0000:03:00.0"]


def test_devices_of_every_driver_are_listed(fake_driver: Path, config_path: Path, tmp_path: Path) -> None:
    second_driver = tmp_path / "libze_fake_second.so"
    shutil.copyfile(fake_driver, second_driver)
    write_config(config_path, FakeConfig(devices=(A770, B580)))
    script = """
    level_zero = LevelZero()
    level_zero.init()
    print(json.dumps([device.identity().pci_address for device in level_zero.devices()]))
    """
    addresses = run_script(script, child_env([fake_driver, second_driver], config_path))
    assert addresses == ["0000:03:00.0", "0000:83:00.0"] * 2


def test_devices_before_init_raises_not_initialized(fake_driver: Path, config_path: Path) -> None:
    script = """
    from vllm_xpu_exporter.sources.levelzero.binding import NotInitialized
    try:
        LevelZero().devices()
        print(json.dumps("no error"))
    except NotInitialized as error:
        print(json.dumps(str(error)))
    """
    message = scenario(fake_driver, config_path, FakeConfig(devices=(A770,)), script)
    assert message == "LevelZero.init() must succeed before devices()"


# ------------------------------------------------------------------------------------ init


@pytest.mark.parametrize(
    ("name", "code"),
    [
        pytest.param("ZE_RESULT_ERROR_UNINITIALIZED", 0x78000001, id="uninitialized"),
        pytest.param("ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS", 0x70010000, id="insufficient_permissions"),
        pytest.param("ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE", 0x70020000, id="dependency_unavailable"),
    ],
)
def test_failed_zeinit_raises_named_error_and_every_later_call_refuses_without_crashing(
    fake_driver: Path, config_path: Path, name: str, code: int
) -> None:
    # The 1.8.12 loader segfaults in zeDriverGet after a failed zeInit: the bindings must never
    # get there, whatever the caller does next. A segfault would fail run_script (exit status).
    script = """
    level_zero = LevelZero()
    outcomes = [attempt(level_zero.init), attempt(level_zero.devices), attempt(level_zero.init)]
    outcomes.append(attempt(LevelZero().init))  # a new object: zeInit returns the cached failure
    print(json.dumps(outcomes))
    """
    outcomes = scenario(fake_driver, config_path, FakeConfig(devices=(A770,), init_result=name), script)
    assert outcomes == [raised("zeInit", name, code)] * 4


def test_init_enables_sysman_even_when_the_caller_did_not(fake_driver: Path, config_path: Path) -> None:
    script = """
    level_zero = LevelZero()
    level_zero.init()
    [device] = level_zero.devices()
    print(json.dumps({"env": os.environ.get("ZES_ENABLE_SYSMAN"), "identity": attempt(device.identity)}))
    """
    result = scenario(fake_driver, config_path, FakeConfig(devices=(A770,)), script, ZES_ENABLE_SYSMAN=None)
    assert result["env"] == "1"
    assert result["identity"]["pci_address"] == "0000:03:00.0"


def test_sysman_calls_raise_uninitialized_when_zeinit_ran_before_sysman_was_enabled(
    fake_driver: Path, config_path: Path
) -> None:
    # Like compute-runtime, the driver decides at the process's first zeInit; the loader caches it.
    script = """
    import ctypes
    assert ctypes.CDLL("libze_loader.so.1").zeInit(0) == 0
    level_zero = LevelZero()
    level_zero.init()
    [device] = level_zero.devices()
    print(json.dumps(attempt(device.identity)))
    """
    outcome = scenario(fake_driver, config_path, FakeConfig(devices=(A770,)), script, ZES_ENABLE_SYSMAN=None)
    assert outcome == raised("zesDeviceGetProperties", "ZE_RESULT_ERROR_UNINITIALIZED", 0x78000001)


# ------------------------------------------------------------------------------------ loader


def test_missing_loader_library_raises_loader_unavailable_naming_library_and_dlopen_error(
    fake_driver: Path, config_path: Path
) -> None:
    script = """
    from vllm_xpu_exporter.sources.levelzero.binding import LoaderUnavailable
    try:
        LevelZero("/nonexistent/libze_loader.so.1")
    except LoaderUnavailable as error:
        print(json.dumps({"message": str(error), "library": error.library,
                          "is_level_zero_error": isinstance(error, LevelZeroError)}))
    """
    result = scenario(fake_driver, config_path, FakeConfig(), script)
    assert result == {
        "message": "cannot load the Level Zero loader /nonexistent/libze_loader.so.1: "
        "/nonexistent/libze_loader.so.1: cannot open shared object file: No such file or directory",
        "library": "/nonexistent/libze_loader.so.1",
        "is_level_zero_error": True,
    }


def test_library_that_is_not_a_loader_raises_loader_unavailable(fake_driver: Path, config_path: Path) -> None:
    script = """
    from vllm_xpu_exporter.sources.levelzero.binding import LoaderUnavailable
    try:
        LevelZero("libc.so.6")
    except LoaderUnavailable as error:
        print(json.dumps(str(error)))
    """
    message = scenario(fake_driver, config_path, FakeConfig(), script)
    assert message.startswith("cannot load the Level Zero loader libc.so.6: not a Level Zero loader: ")
    assert message.endswith("undefined symbol: zeInit")


# ------------------------------------------------------------------------------------ errors mid-run

MID_RUN_SCRIPT = """
from fakeze import FakeConfig, write_config, {devices}
config_path = Path(os.environ["FAKE_ZE_CONFIG"])
level_zero = LevelZero()
level_zero.init()
devices = level_zero.devices()
steps = []
for config in ({configs}):
    write_config(config_path, config)
    steps.append([{{"memory": attempt(device.memory), "identity": attempt(device.identity)}} for device in devices])
print(json.dumps(steps))
"""


def test_memory_state_device_lost_raises_and_recovers_once_removed(fake_driver: Path, config_path: Path) -> None:
    script = MID_RUN_SCRIPT.format(
        devices="A770",
        configs="FakeConfig(devices=(A770,)), "
        "FakeConfig(devices=(replace(A770, memory_state_result='ZE_RESULT_ERROR_DEVICE_LOST'),)), "
        "FakeConfig(devices=(A770,))",
    )
    steps = scenario(fake_driver, config_path, FakeConfig(devices=(A770,)), script)
    assert [step[0]["memory"] for step in steps] == [
        [memory(size=16 * GiB, free=13 * GiB)],
        raised("zesMemoryGetState", "ZE_RESULT_ERROR_DEVICE_LOST", 0x70000001),
        [memory(size=16 * GiB, free=13 * GiB)],
    ]
    assert all(step[0]["identity"]["pci_address"] == "0000:03:00.0" for step in steps)


def test_device_that_disappears_mid_run_raises_device_lost(fake_driver: Path, config_path: Path) -> None:
    script = MID_RUN_SCRIPT.format(devices="A770, B580", configs="FakeConfig(devices=(A770,)),")
    [step] = scenario(fake_driver, config_path, FakeConfig(devices=(A770, B580)), script)
    assert step[0]["memory"] == [memory(size=16 * GiB, free=13 * GiB)]
    assert step[1]["memory"] == raised("zesDeviceEnumMemoryModules", "ZE_RESULT_ERROR_DEVICE_LOST", 0x70000001)
    assert step[1]["identity"] == raised("zesDeviceGetProperties", "ZE_RESULT_ERROR_DEVICE_LOST", 0x70000001)


# ------------------------------------------------------------------------------------ processes


def test_processes_unsupported_feature_raises_while_memory_still_reads(fake_driver: Path, config_path: Path) -> None:
    device = replace(A770, processes_result="ZE_RESULT_ERROR_UNSUPPORTED_FEATURE")
    [result] = scenario(fake_driver, config_path, FakeConfig(devices=(device,)), READ_EVERYTHING)
    assert result["processes"] == raised(
        "zesDeviceProcessesGetState", "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE", 0x78000003
    )
    assert result["memory"] == [memory(size=16 * GiB, free=13 * GiB)]


def five_hundred_processes() -> tuple[FakeProcess, ...]:
    return tuple(
        FakeProcess(pid=10_000 + index, mem_size=(index + 1) * MiB, shared_size=index * 4096, engines=1 + index % 63)
        for index in range(500)
    )


def expected_processes(processes: tuple[FakeProcess, ...]) -> list[dict[str, int]]:
    return [
        {"pid": p.pid, "mem_size": p.mem_size, "shared_size": p.shared_size, "engines": p.engines} for p in processes
    ]


def test_500_processes_are_all_returned_exactly(fake_driver: Path, config_path: Path) -> None:
    processes = five_hundred_processes()
    device = replace(A770, processes=processes)
    [result] = scenario(fake_driver, config_path, FakeConfig(devices=(device,)), READ_EVERYTHING)
    assert result["processes"] == expected_processes(processes)


def test_processes_that_start_between_count_and_read_are_retried(fake_driver: Path, config_path: Path) -> None:
    processes = five_hundred_processes()
    device = replace(A770, processes=processes, processes_count_lag=100)
    [result] = scenario(fake_driver, config_path, FakeConfig(devices=(device,)), READ_EVERYTHING)
    assert result["processes"] == expected_processes(processes)


def test_process_count_that_never_settles_gives_up_with_invalid_size(fake_driver: Path, config_path: Path) -> None:
    device = replace(A770, processes=five_hundred_processes(), processes_count_lag=499)
    [result] = scenario(fake_driver, config_path, FakeConfig(devices=(device,)), READ_EVERYTHING)
    assert result["processes"] == raised("zesDeviceProcessesGetState", "ZE_RESULT_ERROR_INVALID_SIZE", 0x78000008)


# ------------------------------------------------------------------------------------ telemetry

# Every telemetry kind of every device, each read as the exporter's child reads it: enumerated (with the
# properties), then read. Timestamps (the driver's clock) are dropped.
READ_TELEMETRY = """
def read(enumerate, read_one):
    def call():
        return [read_one(component) for component in enumerate()]
    return call

def energy(device):
    domain = device.power_domain()
    return [] if domain is None else [device.energy(domain)]

def untimed(result):
    if isinstance(result, list):
        return [{key: value for key, value in item.items() if key != "timestamp"} for item in result]
    return result

level_zero = LevelZero()
level_zero.init()
print(json.dumps([{key: untimed(attempt(call)) for key, call in {
    "engines": read(device.engine_groups, device.engine_activity),
    "energy": lambda: energy(device),
    "temperatures": read(device.temperature_sensors, device.temperature),
    "frequencies": read(device.frequency_domains, device.frequency),
    "memory_bandwidth": read(device.memory_modules, device.memory_bandwidth),
    "ras": read(device.ras_error_sets, device.ras_errors),
}.items()} for device in level_zero.devices()]))
"""


def placed(on_subdevice: bool = False, subdevice_id: int = 0, **fields: Any) -> dict[str, Any]:
    return {**fields, "on_subdevice": on_subdevice, "subdevice_id": subdevice_id}


def test_every_telemetry_kind_of_two_devices_reads_exactly_what_the_driver_reports(fake_driver: Path,
                                                                                 config_path: Path) -> None:
    a770, b580 = scenario(fake_driver, config_path, FakeConfig(devices=(A770_TELEMETRY, B580_TELEMETRY)),
                          READ_TELEMETRY)
    assert a770["engines"] == [placed(group=group, active_time=active) for group, active in
                               [(0, 90_000_000), (1, 80_000_000), (12, 5_000_000), (2, 2_000_000), (3, 12_500_000),
                                (13, 250_000), (11, 85_000_000), (4, 40_000_000)]]
    assert a770["energy"] == [{"card": True, "energy": 1_500_000_000}]
    assert a770["temperatures"] == [placed(sensor=0, celsius=71.5), placed(sensor=1, celsius=68.0),
                                    placed(sensor=2, celsius=74.0), placed(sensor=3, celsius=40.0)]
    assert a770["frequencies"] == [placed(domain=0, actual=2100.0, throttle_reasons=0b1001),
                                   placed(domain=1, actual=1093.0, throttle_reasons=0),
                                   placed(domain=2, actual=1050.0, throttle_reasons=0)]
    assert a770["memory_bandwidth"] == [{"read_counter": 7_000_000_000, "write_counter": 3_000_000_000,
                                         "max_bandwidth": 560_000_000_000}]
    assert a770["ras"] == [placed(error_type=0, categories=[0, 0, 1, 5, 0, 2, 0]),
                           placed(error_type=1, categories=[1, 0, 0, 0, 0, 0, 0])]

    assert [engine["active_time"] for engine in b580["engines"]] == [30_000_000, 25_000_000, 1_000_000, 3_000_000,
                                                                     4_000_000, 100_000, 26_000_000]
    assert b580["energy"] == [{"card": False, "energy": 800_000_000}], "no card domain: the package's"
    assert [sensor["celsius"] for sensor in b580["temperatures"]] == [55.0, 52.5, 58.0]
    assert [(domain["actual"], domain["throttle_reasons"]) for domain in b580["frequencies"]] == [
        (2850.0, 0), (2375.0, 0b1100000), (1400.0, 0)]
    assert b580["memory_bandwidth"] == [{"read_counter": 1_000_000_000, "write_counter": 500_000_000,
                                         "max_bandwidth": 456_000_000_000}]
    assert [error_set["categories"] for error_set in b580["ras"]] == [[0, 3, 0, 0, 1, 0, 0], [0] * 7]


def test_a_device_without_telemetry_components_reads_empty_lists(fake_driver: Path, config_path: Path) -> None:
    [a770] = scenario(fake_driver, config_path, FakeConfig(devices=(A770,)), READ_TELEMETRY)
    assert {key: value for key, value in a770.items() if key != "memory_bandwidth"} == {
        "engines": [], "energy": [], "temperatures": [], "frequencies": [], "ras": []}
    assert a770["memory_bandwidth"] == raised("zesMemoryGetBandwidth", "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE",
                                              0x78000003)


@pytest.mark.parametrize(("power", "expected"), [
    pytest.param((FakePower(100, subdevice=0), FakePower(300), FakePower(200, card=True)),
                 {"card": True, "energy": 200}, id="card"),
    pytest.param((FakePower(100, subdevice=0), FakePower(300), FakePower(400)),
                 {"card": False, "energy": 300}, id="package-not-on-a-sub-device"),
])
def test_energy_comes_from_the_card_domain_else_the_first_domain_not_on_a_sub_device(
    fake_driver: Path, config_path: Path, power: tuple[FakePower, ...], expected: dict[str, Any]
) -> None:
    [device] = scenario(fake_driver, config_path, FakeConfig(devices=(replace(A770, power=power),)), READ_TELEMETRY)
    assert device["energy"] == [expected]


def test_only_sub_device_power_domains_give_no_energy(fake_driver: Path, config_path: Path) -> None:
    power = (FakePower(100, subdevice=0), FakePower(200, subdevice=1))
    [device] = scenario(fake_driver, config_path, FakeConfig(devices=(replace(A770, power=power),)), READ_TELEMETRY)
    assert device["energy"] == []


def test_components_on_a_sub_device_say_which(fake_driver: Path, config_path: Path) -> None:
    device = replace(A770, temperatures=(FakeTemperature(1, 60.0, subdevice=0), FakeTemperature(1, 65.0, subdevice=1)),
                     ras=(FakeRas(1, (0, 0, 0, 1, 0, 0, 0), subdevice=1),))
    [result] = scenario(fake_driver, config_path, FakeConfig(devices=(device,)), READ_TELEMETRY)
    assert result["temperatures"] == [placed(True, 0, sensor=1, celsius=60.0), placed(True, 1, sensor=1, celsius=65.0)]
    assert result["ras"] == [placed(True, 1, error_type=1, categories=[0, 0, 0, 1, 0, 0, 0])]


def test_ras_counters_are_read_without_clearing_them(fake_driver: Path, config_path: Path) -> None:
    # The fake refuses zesRasGetState(clear=1) with INVALID_ARGUMENT and says so on stderr.
    write_config(config_path, FakeConfig(devices=(A770_TELEMETRY,)))
    completed = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(READ_TELEMETRY)],
                               env=child_env(fake_driver, config_path), cwd=REPOSITORY, capture_output=True,
                               text=True, timeout=SCRIPT_TIMEOUT_S, check=True)
    [device] = json.loads(completed.stdout)
    assert [error_set["categories"] for error_set in device["ras"]] == [[0, 0, 1, 5, 0, 2, 0], [1, 0, 0, 0, 0, 0, 0]]
    assert "clear" not in completed.stderr


READ_FUNCTIONS = {"engines": "zesEngineGetActivity", "power": "zesPowerGetEnergyCounter",
                  "temperature": "zesTemperatureGetState", "frequency": "zesFrequencyGetState",
                  "ras": "zesRasGetState"}
ENUM_FUNCTIONS = {"engines": "zesDeviceEnumEngineGroups", "power": "zesDeviceGetCardPowerDomain",
                  "temperature": "zesDeviceEnumTemperatureSensors", "frequency": "zesDeviceEnumFrequencyDomains",
                  "ras": "zesDeviceEnumRasErrorSets"}
RESULT_KEYS = {"engines": "engines", "power": "energy", "temperature": "temperatures", "frequency": "frequencies",
               "ras": "ras"}


@pytest.mark.parametrize("kind", TELEMETRY_KINDS)
@pytest.mark.parametrize("stage", ["read", "enumeration"])
def test_each_kinds_result_override_fails_exactly_that_kind_with_its_function_and_code(
    fake_driver: Path, config_path: Path, kind: str, stage: str
) -> None:
    override = {kind: "ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS"}
    device = replace(A770_TELEMETRY, **{"telemetry_results" if stage == "read" else "telemetry_enum_results": override})
    [result] = scenario(fake_driver, config_path, FakeConfig(devices=(device,)), READ_TELEMETRY)
    function = (READ_FUNCTIONS if stage == "read" else ENUM_FUNCTIONS)[kind]
    assert result[RESULT_KEYS[kind]] == raised(function, "ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS", 0x70010000)
    healthy = scenario(fake_driver, config_path, FakeConfig(devices=(A770_TELEMETRY,)), READ_TELEMETRY)[0]
    assert {key: value for key, value in result.items() if key != RESULT_KEYS[kind]} == \
        {key: value for key, value in healthy.items() if key != RESULT_KEYS[kind]}


def test_memory_bandwidth_result_override_fails_the_bandwidth_read(fake_driver: Path, config_path: Path) -> None:
    device = replace(A770_TELEMETRY, memory_bandwidth_result="ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS")
    [result] = scenario(fake_driver, config_path, FakeConfig(devices=(device,)), READ_TELEMETRY)
    assert result["memory_bandwidth"] == raised("zesMemoryGetBandwidth", "ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS",
                                                0x70010000)


# ------------------------------------------------------------------------------------ the fake's hangs

HANG_SCRIPTS = {
    "init": """
        level_zero = LevelZero()
        print("calling", flush=True)
        level_zero.init()
    """,
    "memory_state": """
        level_zero = LevelZero()
        level_zero.init()
        [device] = level_zero.devices()
        device.identity(), device.processes()
        print("calling", flush=True)
        device.memory()
    """,
    "processes": """
        level_zero = LevelZero()
        level_zero.init()
        [device] = level_zero.devices()
        device.identity(), device.memory()
        print("calling", flush=True)
        device.processes()
    """,
}


@pytest.mark.parametrize("call", sorted(HANG_SCRIPTS))
def test_fake_driver_hang_option_blocks_exactly_that_call(fake_driver: Path, config_path: Path, call: str) -> None:
    config = FakeConfig(
        devices=(replace(A770, memory_state_hang=call == "memory_state", processes_hang=call == "processes"),),
        init_hang=call == "init",
    )
    write_config(config_path, config)
    child = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(HANG_SCRIPTS[call])],
        env=child_env(fake_driver, config_path),
        cwd=REPOSITORY,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([child.stdout], [], [], SCRIPT_TIMEOUT_S)
        assert ready and child.stdout.readline() == "calling\n", "the calls before the hanging one did not return"
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.5)
    finally:
        child.kill()
        child.communicate()


# ------------------------------------------------------------------------------------ the fake's config


def test_malformed_fake_config_fails_zeinit_with_unknown_and_names_the_line(
    fake_driver: Path, config_path: Path
) -> None:
    config_path.write_text("init_result ZE_RESULT_SUCCESS\ndevice 0000:03:00\n")
    completed = subprocess.run(
        [sys.executable, "-c", PRELUDE + "print(json.dumps(attempt(LevelZero().init)))"],
        env=child_env(fake_driver, config_path),
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout) == raised("zeInit", "ZE_RESULT_ERROR_UNKNOWN", 0x7FFFFFFE)
    assert f"fake_ze: {config_path}:2: device <dddd:bb:dd.f>" in completed.stderr


# ------------------------------------------------------------------------------------ pure helpers


def test_format_uuid_keeps_byte_order_as_lower_case_8_4_4_4_12() -> None:
    assert format_uuid(bytes.fromhex("00AB12CD3456789A0FEDCBA987654321")) == "00ab12cd-3456-789a-0fed-cba987654321"


def test_format_uuid_rejects_wrong_length() -> None:
    with pytest.raises(ValueError, match="16 bytes, got 15"):
        format_uuid(bytes(15))


def test_error_message_names_function_result_and_code() -> None:
    error = LevelZeroError("zesMemoryGetState", 0x70000001)
    assert (error.function, error.code, error.name) == ("zesMemoryGetState", 0x70000001, "ZE_RESULT_ERROR_DEVICE_LOST")
    assert str(error) == "zesMemoryGetState: ZE_RESULT_ERROR_DEVICE_LOST (0x70000001)"


def test_unknown_result_code_gets_a_generic_hex_name() -> None:
    assert result_name(0x78000020) == "ZE_RESULT_0x78000020"
    assert str(LevelZeroError("zesInit", 0x78000020)) == "zesInit: ZE_RESULT_0x78000020 (0x78000020)"


def test_errors_survive_pickling_for_the_trip_between_processes() -> None:
    error = pickle.loads(pickle.dumps(LevelZeroError("zeInit", 0x70010000)))
    assert (error.function, error.code, str(error)) == (
        "zeInit",
        0x70010000,
        "zeInit: ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS (0x70010000)",
    )
    unavailable = pickle.loads(pickle.dumps(LoaderUnavailable("libze_loader.so.1", "no such file")))
    assert (unavailable.library, unavailable.reason, str(unavailable)) == (
        "libze_loader.so.1",
        "no such file",
        "cannot load the Level Zero loader libze_loader.so.1: no such file",
    )
