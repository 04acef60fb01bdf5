"""Level Zero (oneAPI) Sysman bindings over ctypes, in the style of NVML's Python binding.

The ctypes Structures mirror the headers of Debian 12's libze-dev 1.8.12 (spec 1.4,
``/usr/include/level_zero``) field by field;
``tests/sources/test_sources_levelzero_binding_layout.py`` compiles against those headers and fails on any drift. :class:`LoaderLibrary` has one thin method
per C entry point, named after it, and turns every result other than ZE_RESULT_SUCCESS
into :class:`LevelZeroError`. :class:`LevelZero` and :class:`Device` are the public
entry points::

    level_zero = LevelZero()          # raises LoaderUnavailable if the loader cannot be opened
    level_zero.init()                 # raises LevelZeroError; after a failure the object is dead
    for device in level_zero.devices():
        print(device.identity(), device.memory(), device.processes())
        print([device.engine_activity(group) for group in device.engine_groups()])  # and so on for telemetry

Initialisation takes one of two paths and never mixes them in a process:

* the loader exports ``zesInit`` (spec >= 1.5): ``zesInit(0)`` -> ``zesDriverGet`` -> ``zesDeviceGet``;
* otherwise (Debian 12's loader 1.8.12) the legacy path: ``ZES_ENABLE_SYSMAN=1`` is put in the
  environment (the driver reads it during the first ``zeInit``), then ``zeInit(0)`` ->
  ``zeDriverGet`` -> ``zeDeviceGet``.

A failed ``zeInit`` is final for the process (the loader keeps returning the failure),
and the 1.8.12 loader crashes in ``zeDriverGet`` after a failed ``zeInit``. So a failed
:meth:`LevelZero.init` is final: the object refuses every further call, and retrying
means starting a new process. Run Level Zero work in a child process that can be killed
and restarted; this module only needs the standard library and is cheap to import.

Exceptions: :class:`LevelZeroError` for a failed call (``.function``, ``.code``, ``.name``);
its subclass :class:`LoaderUnavailable` when the loader library cannot be loaded at all
(``function`` "dlopen", ``code`` ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE, and a message naming
the library and the dlopen error). :class:`NotInitialized` (a RuntimeError) is a programming
error: devices() before init().

Run ``python -m vllm_xpu_exporter.sources.levelzero.binding [--library PATH]`` to print what the
bindings see as JSON.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Sequence

from vllm_xpu_exporter.pci import format_pci_address

DEFAULT_LIBRARY = "libze_loader.so.1"

# ---------------------------------------------------------------------------------------------
# Constants (values from the installed ze_api.h / zes_api.h; the layout test checks every
# module-level name starting with ZE_ or ZES_ against the headers)

ZE_MAX_DEVICE_NAME = 256
ZE_MAX_DEVICE_UUID_SIZE = 16
ZE_MAX_EXTENSION_NAME = 256
ZES_STRING_PROPERTY_SIZE = 64

ZE_RESULT_SUCCESS = 0
ZE_RESULT_NOT_READY = 1
ZE_RESULT_ERROR_DEVICE_LOST = 0x70000001
ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY = 0x70000002
ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY = 0x70000003
ZE_RESULT_ERROR_MODULE_BUILD_FAILURE = 0x70000004
ZE_RESULT_ERROR_MODULE_LINK_FAILURE = 0x70000005
ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET = 0x70000006
ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE = 0x70000007
ZE_RESULT_EXP_ERROR_DEVICE_IS_NOT_VERTEX = 0x7FF00001
ZE_RESULT_EXP_ERROR_VERTEX_IS_NOT_DEVICE = 0x7FF00002
ZE_RESULT_EXP_ERROR_REMOTE_DEVICE = 0x7FF00003
ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS = 0x70010000
ZE_RESULT_ERROR_NOT_AVAILABLE = 0x70010001
ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE = 0x70020000
ZE_RESULT_WARNING_DROPPED_DATA = 0x70020001
ZE_RESULT_ERROR_UNINITIALIZED = 0x78000001
ZE_RESULT_ERROR_UNSUPPORTED_VERSION = 0x78000002
ZE_RESULT_ERROR_UNSUPPORTED_FEATURE = 0x78000003
ZE_RESULT_ERROR_INVALID_ARGUMENT = 0x78000004
ZE_RESULT_ERROR_INVALID_NULL_HANDLE = 0x78000005
ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE = 0x78000006
ZE_RESULT_ERROR_INVALID_NULL_POINTER = 0x78000007
ZE_RESULT_ERROR_INVALID_SIZE = 0x78000008
ZE_RESULT_ERROR_UNSUPPORTED_SIZE = 0x78000009
ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT = 0x7800000A
ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT = 0x7800000B
ZE_RESULT_ERROR_INVALID_ENUMERATION = 0x7800000C
ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION = 0x7800000D
ZE_RESULT_ERROR_UNSUPPORTED_IMAGE_FORMAT = 0x7800000E
ZE_RESULT_ERROR_INVALID_NATIVE_BINARY = 0x7800000F
ZE_RESULT_ERROR_INVALID_GLOBAL_NAME = 0x78000010
ZE_RESULT_ERROR_INVALID_KERNEL_NAME = 0x78000011
ZE_RESULT_ERROR_INVALID_FUNCTION_NAME = 0x78000012
ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION = 0x78000013
ZE_RESULT_ERROR_INVALID_GLOBAL_WIDTH_DIMENSION = 0x78000014
ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX = 0x78000015
ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE = 0x78000016
ZE_RESULT_ERROR_INVALID_KERNEL_ATTRIBUTE_VALUE = 0x78000017
ZE_RESULT_ERROR_INVALID_MODULE_UNLINKED = 0x78000018
ZE_RESULT_ERROR_INVALID_COMMAND_LIST_TYPE = 0x78000019
ZE_RESULT_ERROR_OVERLAPPING_REGIONS = 0x7800001A
ZE_RESULT_WARNING_ACTION_REQUIRED = 0x7800001B
ZE_RESULT_ERROR_UNKNOWN = 0x7FFFFFFE

#: ze_result_t code -> its name in the installed ze_api.h
RESULT_NAMES: MappingProxyType[int, str] = MappingProxyType(
    {code: name for name, code in dict(globals()).items() if name.startswith("ZE_RESULT_")}
)

ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES = 0x3
ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES = 0x7
# The usable-memory core extension (spec 1.15; compute-runtime 26.18 and later answer it): chained to
# ze_device_properties_t.pNext, listed by zeDriverGetExtensionProperties under its name.
ZE_STRUCTURE_TYPE_DEVICE_USABLEMEM_SIZE_EXT_PROPERTIES = 0x00020041
USABLE_MEMORY_EXTENSION = "ZE_extension_device_usablemem_size_properties"
ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES = 0x1
ZES_STRUCTURE_TYPE_PCI_PROPERTIES = 0x2
ZES_STRUCTURE_TYPE_MEM_PROPERTIES = 0xB
ZES_STRUCTURE_TYPE_PROCESS_STATE = 0x16
ZES_STRUCTURE_TYPE_MEM_STATE = 0x1E
ZES_STRUCTURE_TYPE_ENGINE_PROPERTIES = 0x5
ZES_STRUCTURE_TYPE_FREQ_PROPERTIES = 0x9
ZES_STRUCTURE_TYPE_POWER_PROPERTIES = 0xD
ZES_STRUCTURE_TYPE_RAS_PROPERTIES = 0xF
ZES_STRUCTURE_TYPE_TEMP_PROPERTIES = 0x14
ZES_STRUCTURE_TYPE_FREQ_STATE = 0x1B
ZES_STRUCTURE_TYPE_RAS_STATE = 0x22

ZE_DEVICE_TYPE_GPU = 1

ZES_MEM_LOC_DEVICE = 1

ZES_MEM_HEALTH_UNKNOWN = 0
ZES_MEM_HEALTH_OK = 1
ZES_MEM_HEALTH_DEGRADED = 2
ZES_MEM_HEALTH_CRITICAL = 3
ZES_MEM_HEALTH_REPLACE = 4

# zes_engine_group_t: the groups that combine every engine of a kind (the *_SINGLE ones are left out)
ZES_ENGINE_GROUP_ALL = 0
ZES_ENGINE_GROUP_COMPUTE_ALL = 1
ZES_ENGINE_GROUP_MEDIA_ALL = 2
ZES_ENGINE_GROUP_COPY_ALL = 3
ZES_ENGINE_GROUP_3D_RENDER_COMPUTE_ALL = 11
ZES_ENGINE_GROUP_RENDER_ALL = 12
ZES_ENGINE_GROUP_3D_ALL = 13

# zes_temp_sensors_t: the maximum-temperature sensors (the *_MIN ones are left out)
ZES_TEMP_SENSORS_GLOBAL = 0
ZES_TEMP_SENSORS_GPU = 1
ZES_TEMP_SENSORS_MEMORY = 2

ZES_FREQ_DOMAIN_GPU = 0
ZES_FREQ_DOMAIN_MEMORY = 1
# ZES_FREQ_DOMAIN_MEDIA of later headers (and pyzes); the installed spec 1.4 header has no media domain.
FREQ_DOMAIN_MEDIA = 2

# zes_freq_throttle_reason_flag_t
ZES_FREQ_THROTTLE_REASON_FLAG_AVE_PWR_CAP = 1 << 0
ZES_FREQ_THROTTLE_REASON_FLAG_BURST_PWR_CAP = 1 << 1
ZES_FREQ_THROTTLE_REASON_FLAG_CURRENT_LIMIT = 1 << 2
ZES_FREQ_THROTTLE_REASON_FLAG_THERMAL_LIMIT = 1 << 3
ZES_FREQ_THROTTLE_REASON_FLAG_PSU_ALERT = 1 << 4
ZES_FREQ_THROTTLE_REASON_FLAG_SW_RANGE = 1 << 5
ZES_FREQ_THROTTLE_REASON_FLAG_HW_RANGE = 1 << 6

ZES_RAS_ERROR_TYPE_CORRECTABLE = 0
ZES_RAS_ERROR_TYPE_UNCORRECTABLE = 1
# zes_ras_error_cat_t: the index of each category in zes_ras_state_t.category
ZES_RAS_ERROR_CAT_RESET = 0
ZES_RAS_ERROR_CAT_PROGRAMMING_ERRORS = 1
ZES_RAS_ERROR_CAT_DRIVER_ERRORS = 2
ZES_RAS_ERROR_CAT_COMPUTE_ERRORS = 3
ZES_RAS_ERROR_CAT_NON_COMPUTE_ERRORS = 4
ZES_RAS_ERROR_CAT_CACHE_ERRORS = 5
ZES_RAS_ERROR_CAT_DISPLAY_ERRORS = 6
ZES_MAX_RAS_ERROR_CATEGORY_COUNT = 7

# How often zesDeviceProcessesGetState is retried when processes appear between the count
# query and the read (ZE_RESULT_ERROR_INVALID_SIZE); the array doubles on every retry.
PROCESS_READ_ATTEMPTS = 5


def result_name(code: int) -> str:
    """The ze_result_t name of ``code``; unknown codes get ``ZE_RESULT_0x........``."""
    return RESULT_NAMES.get(code, f"ZE_RESULT_0x{code:08x}")


# ---------------------------------------------------------------------------------------------
# Exceptions


class LevelZeroError(Exception):
    """A Level Zero call returned something other than ZE_RESULT_SUCCESS."""

    def __init__(self, function: str, code: int) -> None:
        self.function = function
        self.code = code
        self.name = result_name(code)
        super().__init__(f"{function}: {self.name} (0x{code:08x})")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.function, self.code))


class LoaderUnavailable(LevelZeroError):
    """The Level Zero loader library cannot be loaded (missing file, not a loader, ...).

    A LevelZeroError, so one ``except LevelZeroError`` covers "no Level Zero"; as no
    Level Zero call was made, ``function`` is "dlopen" and ``code`` is
    ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE. ``library`` and ``reason`` (the dlopen error)
    say what failed, and so does the message.
    """

    def __init__(self, library: str, reason: str) -> None:
        super().__init__("dlopen", ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE)
        self.library = library
        self.reason = reason
        self.args = (f"cannot load the Level Zero loader {library}: {reason}",)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.library, self.reason))


class NotInitialized(RuntimeError):
    """LevelZero.devices() was called before a successful LevelZero.init()."""


# ---------------------------------------------------------------------------------------------
# Structures (installed headers, spec 1.4). Enums are 32 bits; ze_bool_t is uint8_t.

_ze_enum = ctypes.c_uint32
_ze_bool_t = ctypes.c_uint8


class ze_device_uuid_t(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint8 * ZE_MAX_DEVICE_UUID_SIZE)]


class ze_device_properties_t(ctypes.Structure):
    _fields_ = [
        ("stype", _ze_enum),
        ("pNext", ctypes.c_void_p),
        ("type", _ze_enum),
        ("vendorId", ctypes.c_uint32),
        ("deviceId", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("subdeviceId", ctypes.c_uint32),
        ("coreClockRate", ctypes.c_uint32),
        ("maxMemAllocSize", ctypes.c_uint64),
        ("maxHardwareContexts", ctypes.c_uint32),
        ("maxCommandQueuePriority", ctypes.c_uint32),
        ("numThreadsPerEU", ctypes.c_uint32),
        ("physicalEUSimdWidth", ctypes.c_uint32),
        ("numEUsPerSubslice", ctypes.c_uint32),
        ("numSubslicesPerSlice", ctypes.c_uint32),
        ("numSlices", ctypes.c_uint32),
        ("timerResolution", ctypes.c_uint64),
        ("timestampValidBits", ctypes.c_uint32),
        ("kernelTimestampValidBits", ctypes.c_uint32),
        ("uuid", ze_device_uuid_t),
        ("name", ctypes.c_char * ZE_MAX_DEVICE_NAME),
    ]


class ze_device_memory_properties_t(ctypes.Structure):
    _fields_ = [
        ("stype", _ze_enum),
        ("pNext", ctypes.c_void_p),
        ("flags", ctypes.c_uint32),
        ("maxClockRate", ctypes.c_uint32),
        ("maxBusWidth", ctypes.c_uint32),
        ("totalSize", ctypes.c_uint64),
        ("name", ctypes.c_char * ZE_MAX_DEVICE_NAME),
    ]


class ze_device_usablemem_size_ext_properties_t(ctypes.Structure):
    _fields_ = [
        ("stype", _ze_enum),
        ("pNext", ctypes.c_void_p),
        ("currUsableMemSize", ctypes.c_uint64),
    ]


class ze_driver_extension_properties_t(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * ZE_MAX_EXTENSION_NAME),
        ("version", ctypes.c_uint32),
    ]


# The loader's own versions (ze_loader.h; Debian 12's loader 1.8.12 has them): "loader" and each layer it loaded
ZEL_COMPONENT_STRING_SIZE = 64


class zel_version_t(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_int),
        ("minor", ctypes.c_int),
        ("patch", ctypes.c_int),
    ]


class zel_component_version_t(ctypes.Structure):
    _fields_ = [
        ("component_name", ctypes.c_char * ZEL_COMPONENT_STRING_SIZE),
        ("spec_version", ctypes.c_uint32),
        ("component_lib_version", zel_version_t),
    ]


class zes_device_properties_t(ctypes.Structure):
    _fields_ = [
        ("stype", _ze_enum),
        ("pNext", ctypes.c_void_p),
        ("core", ze_device_properties_t),
        ("numSubdevices", ctypes.c_uint32),
        ("serialNumber", ctypes.c_char * ZES_STRING_PROPERTY_SIZE),
        ("boardNumber", ctypes.c_char * ZES_STRING_PROPERTY_SIZE),
        ("brandName", ctypes.c_char * ZES_STRING_PROPERTY_SIZE),
        ("modelName", ctypes.c_char * ZES_STRING_PROPERTY_SIZE),
        ("vendorName", ctypes.c_char * ZES_STRING_PROPERTY_SIZE),
        ("driverVersion", ctypes.c_char * ZES_STRING_PROPERTY_SIZE),
    ]


class zes_pci_address_t(ctypes.Structure):
    _fields_ = [
        ("domain", ctypes.c_uint32),
        ("bus", ctypes.c_uint32),
        ("device", ctypes.c_uint32),
        ("function", ctypes.c_uint32),
    ]


class zes_pci_speed_t(ctypes.Structure):
    _fields_ = [
        ("gen", ctypes.c_int32),
        ("width", ctypes.c_int32),
        ("maxBandwidth", ctypes.c_int64),
    ]


class zes_pci_properties_t(ctypes.Structure):
    _fields_ = [
        ("stype", _ze_enum),
        ("pNext", ctypes.c_void_p),
        ("address", zes_pci_address_t),
        ("maxSpeed", zes_pci_speed_t),
        ("haveBandwidthCounters", _ze_bool_t),
        ("havePacketCounters", _ze_bool_t),
        ("haveReplayCounters", _ze_bool_t),
    ]


class zes_mem_properties_t(ctypes.Structure):
    _fields_ = [
        ("stype", _ze_enum),
        ("pNext", ctypes.c_void_p),
        ("type", _ze_enum),
        ("onSubdevice", _ze_bool_t),
        ("subdeviceId", ctypes.c_uint32),
        ("location", _ze_enum),
        ("physicalSize", ctypes.c_uint64),
        ("busWidth", ctypes.c_int32),
        ("numChannels", ctypes.c_int32),
    ]


class zes_mem_state_t(ctypes.Structure):
    _fields_ = [
        ("stype", _ze_enum),
        ("pNext", ctypes.c_void_p),
        ("health", _ze_enum),
        ("free", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
    ]


class zes_process_state_t(ctypes.Structure):
    _fields_ = [
        ("stype", _ze_enum),
        ("pNext", ctypes.c_void_p),
        ("processId", ctypes.c_uint32),
        ("memSize", ctypes.c_uint64),
        ("sharedSize", ctypes.c_uint64),
        ("engines", ctypes.c_uint32),
    ]


class zes_mem_bandwidth_t(ctypes.Structure):
    _fields_ = [
        ("readCounter", ctypes.c_uint64),
        ("writeCounter", ctypes.c_uint64),
        ("maxBandwidth", ctypes.c_uint64),
        ("timestamp", ctypes.c_uint64),
    ]


class zes_engine_properties_t(ctypes.Structure):
    _fields_ = [
        ("stype", _ze_enum),
        ("pNext", ctypes.c_void_p),
        ("type", _ze_enum),
        ("onSubdevice", _ze_bool_t),
        ("subdeviceId", ctypes.c_uint32),
    ]


class zes_engine_stats_t(ctypes.Structure):
    _fields_ = [
        ("activeTime", ctypes.c_uint64),
        ("timestamp", ctypes.c_uint64),
    ]


class zes_power_properties_t(ctypes.Structure):
    _fields_ = [
        ("stype", _ze_enum),
        ("pNext", ctypes.c_void_p),
        ("onSubdevice", _ze_bool_t),
        ("subdeviceId", ctypes.c_uint32),
        ("canControl", _ze_bool_t),
        ("isEnergyThresholdSupported", _ze_bool_t),
        ("defaultLimit", ctypes.c_int32),
        ("minLimit", ctypes.c_int32),
        ("maxLimit", ctypes.c_int32),
    ]


class zes_power_energy_counter_t(ctypes.Structure):
    _fields_ = [
        ("energy", ctypes.c_uint64),
        ("timestamp", ctypes.c_uint64),
    ]


class zes_temp_properties_t(ctypes.Structure):
    _fields_ = [
        ("stype", _ze_enum),
        ("pNext", ctypes.c_void_p),
        ("type", _ze_enum),
        ("onSubdevice", _ze_bool_t),
        ("subdeviceId", ctypes.c_uint32),
        ("maxTemperature", ctypes.c_double),
        ("isCriticalTempSupported", _ze_bool_t),
        ("isThreshold1Supported", _ze_bool_t),
        ("isThreshold2Supported", _ze_bool_t),
    ]


class zes_freq_properties_t(ctypes.Structure):
    _fields_ = [
        ("stype", _ze_enum),
        ("pNext", ctypes.c_void_p),
        ("type", _ze_enum),
        ("onSubdevice", _ze_bool_t),
        ("subdeviceId", ctypes.c_uint32),
        ("canControl", _ze_bool_t),
        ("isThrottleEventSupported", _ze_bool_t),
        ("min", ctypes.c_double),
        ("max", ctypes.c_double),
    ]


class zes_freq_state_t(ctypes.Structure):
    _fields_ = [
        ("stype", _ze_enum),
        ("pNext", ctypes.c_void_p),
        ("currentVoltage", ctypes.c_double),
        ("request", ctypes.c_double),
        ("tdp", ctypes.c_double),
        ("efficient", ctypes.c_double),
        ("actual", ctypes.c_double),
        ("throttleReasons", ctypes.c_uint32),
    ]


class zes_ras_properties_t(ctypes.Structure):
    _fields_ = [
        ("stype", _ze_enum),
        ("pNext", ctypes.c_void_p),
        ("type", _ze_enum),
        ("onSubdevice", _ze_bool_t),
        ("subdeviceId", ctypes.c_uint32),
    ]


class zes_ras_state_t(ctypes.Structure):
    _fields_ = [
        ("stype", _ze_enum),
        ("pNext", ctypes.c_void_p),
        ("category", ctypes.c_uint64 * ZES_MAX_RAS_ERROR_CATEGORY_COUNT),
    ]


#: Every Structure above; each class is named after its C type (the layout test walks this).
STRUCTURES: tuple[type[ctypes.Structure], ...] = (
    ze_device_uuid_t,
    ze_device_properties_t,
    ze_device_memory_properties_t,
    ze_device_usablemem_size_ext_properties_t,
    ze_driver_extension_properties_t,
    zel_version_t,
    zel_component_version_t,
    zes_device_properties_t,
    zes_pci_address_t,
    zes_pci_speed_t,
    zes_pci_properties_t,
    zes_mem_properties_t,
    zes_mem_state_t,
    zes_process_state_t,
    zes_mem_bandwidth_t,
    zes_engine_properties_t,
    zes_engine_stats_t,
    zes_power_properties_t,
    zes_power_energy_counter_t,
    zes_temp_properties_t,
    zes_freq_properties_t,
    zes_freq_state_t,
    zes_ras_properties_t,
    zes_ras_state_t,
)

# ---------------------------------------------------------------------------------------------
# Entry points: name -> argument types. All return ze_result_t.

_COUNT = ctypes.POINTER(ctypes.c_uint32)
_HANDLES = ctypes.POINTER(ctypes.c_void_p)

_REQUIRED_FUNCTIONS: MappingProxyType[str, tuple[Any, ...]] = MappingProxyType(
    {
        "zeInit": (ctypes.c_uint32,),
        "zeDriverGet": (_COUNT, _HANDLES),
        "zeDeviceGet": (ctypes.c_void_p, _COUNT, _HANDLES),
        "zeDeviceGetProperties": (ctypes.c_void_p, ctypes.POINTER(ze_device_properties_t)),
        "zeDeviceGetMemoryProperties": (ctypes.c_void_p, _COUNT, ctypes.POINTER(ze_device_memory_properties_t)),
        "zeDriverGetExtensionProperties": (ctypes.c_void_p, _COUNT, ctypes.POINTER(ze_driver_extension_properties_t)),
        "zesDeviceGetProperties": (ctypes.c_void_p, ctypes.POINTER(zes_device_properties_t)),
        "zesDevicePciGetProperties": (ctypes.c_void_p, ctypes.POINTER(zes_pci_properties_t)),
        "zesDeviceEnumMemoryModules": (ctypes.c_void_p, _COUNT, _HANDLES),
        "zesMemoryGetProperties": (ctypes.c_void_p, ctypes.POINTER(zes_mem_properties_t)),
        "zesMemoryGetState": (ctypes.c_void_p, ctypes.POINTER(zes_mem_state_t)),
        "zesDeviceProcessesGetState": (ctypes.c_void_p, _COUNT, ctypes.POINTER(zes_process_state_t)),
        # Device telemetry: in every loader since spec 1.0
        "zesMemoryGetBandwidth": (ctypes.c_void_p, ctypes.POINTER(zes_mem_bandwidth_t)),
        "zesDeviceEnumEngineGroups": (ctypes.c_void_p, _COUNT, _HANDLES),
        "zesEngineGetProperties": (ctypes.c_void_p, ctypes.POINTER(zes_engine_properties_t)),
        "zesEngineGetActivity": (ctypes.c_void_p, ctypes.POINTER(zes_engine_stats_t)),
        "zesDeviceEnumPowerDomains": (ctypes.c_void_p, _COUNT, _HANDLES),
        "zesPowerGetProperties": (ctypes.c_void_p, ctypes.POINTER(zes_power_properties_t)),
        "zesPowerGetEnergyCounter": (ctypes.c_void_p, ctypes.POINTER(zes_power_energy_counter_t)),
        "zesDeviceEnumTemperatureSensors": (ctypes.c_void_p, _COUNT, _HANDLES),
        "zesTemperatureGetProperties": (ctypes.c_void_p, ctypes.POINTER(zes_temp_properties_t)),
        "zesTemperatureGetState": (ctypes.c_void_p, ctypes.POINTER(ctypes.c_double)),
        "zesDeviceEnumFrequencyDomains": (ctypes.c_void_p, _COUNT, _HANDLES),
        "zesFrequencyGetProperties": (ctypes.c_void_p, ctypes.POINTER(zes_freq_properties_t)),
        "zesFrequencyGetState": (ctypes.c_void_p, ctypes.POINTER(zes_freq_state_t)),
        "zesDeviceEnumRasErrorSets": (ctypes.c_void_p, _COUNT, _HANDLES),
        "zesRasGetProperties": (ctypes.c_void_p, ctypes.POINTER(zes_ras_properties_t)),
        "zesRasGetState": (ctypes.c_void_p, _ze_bool_t, ctypes.POINTER(zes_ras_state_t)),
    }
)

# Looked up in the loader when it is opened, used only when there: zesDeviceGetCardPowerDomain is newer than
# the rest of the power API (Debian 12's loader 1.8.12 has it; its drivers need not).
_OPTIONAL_FUNCTIONS: MappingProxyType[str, tuple[Any, ...]] = MappingProxyType(
    {
        "zesDeviceGetCardPowerDomain": (ctypes.c_void_p, _HANDLES),
        "zelLoaderGetVersions": (ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(zel_component_version_t)),
    }
)

# Spec >= 1.5 only; Debian 12's loader 1.8.12 lacks them.
_SYSMAN_INIT_FUNCTIONS: MappingProxyType[str, tuple[Any, ...]] = MappingProxyType(
    {
        "zesInit": (ctypes.c_uint32,),
        "zesDriverGet": (_COUNT, _HANDLES),
        "zesDeviceGet": (ctypes.c_void_p, _COUNT, _HANDLES),
    }
)


def _load_library(library: str) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(library)
    except OSError as error:
        raise LoaderUnavailable(library, str(error)) from None


def _bind(library: ctypes.CDLL, name: str, argtypes: Sequence[Any]) -> Callable[..., int]:
    prototype = ctypes.CFUNCTYPE(ctypes.c_uint32, *argtypes)
    return prototype((name, library))


class LoaderLibrary:
    """The Level Zero loader opened with ctypes: one thin method per C entry point.

    Handles are plain ints (``void*``). Enumerations follow the two-call convention and
    return lists. Every method raises LevelZeroError on a non-success result.
    Use LevelZero rather than this class: it enforces the initialisation rules.
    """

    def __init__(self, library: str = DEFAULT_LIBRARY) -> None:
        self.library = library
        handle = _load_library(library)
        try:
            self._functions = {name: _bind(handle, name, args) for name, args in _REQUIRED_FUNCTIONS.items()}
        except AttributeError as error:
            raise LoaderUnavailable(library, f"not a Level Zero loader: {error}") from None
        self.has_sysman_init = all(hasattr(handle, name) for name in _SYSMAN_INIT_FUNCTIONS)
        if self.has_sysman_init:
            for name, args in _SYSMAN_INIT_FUNCTIONS.items():
                self._functions[name] = _bind(handle, name, args)
        for name, args in _OPTIONAL_FUNCTIONS.items():
            if hasattr(handle, name):
                self._functions[name] = _bind(handle, name, args)

    def has(self, name: str) -> bool:
        """Whether the loader exports the entry point `name` (the optional ones may be missing)."""
        return name in self._functions

    def _call(self, name: str, *arguments: Any) -> None:
        code = self._functions[name](*arguments)
        if code != ZE_RESULT_SUCCESS:
            raise LevelZeroError(name, code)

    def _enumerate(self, name: str, *leading: Any) -> list[int]:
        count = ctypes.c_uint32(0)
        self._call(name, *leading, ctypes.byref(count), None)
        if count.value == 0:
            return []
        handles = (ctypes.c_void_p * count.value)()
        self._call(name, *leading, ctypes.byref(count), handles)
        return [handle for handle in handles[: count.value] if handle]

    def zeInit(self, flags: int = 0) -> None:
        self._call("zeInit", flags)

    def zeDriverGet(self) -> list[int]:
        return self._enumerate("zeDriverGet")

    def zeDeviceGet(self, driver: int) -> list[int]:
        return self._enumerate("zeDeviceGet", driver)

    def zeDeviceGetProperties(self, device: int, extension: ctypes.Structure | None = None
                              ) -> ze_device_properties_t:
        """The core properties; `extension` (a properties extension, its stype set) is chained to pNext and
        filled by the driver too."""
        properties = ze_device_properties_t(stype=ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES)
        if extension is not None:
            properties.pNext = ctypes.cast(ctypes.pointer(extension), ctypes.c_void_p)
        self._call("zeDeviceGetProperties", device, ctypes.byref(properties))
        return properties

    def zeDeviceGetMemoryProperties(self, device: int) -> list[ze_device_memory_properties_t]:
        """The device's memories as the core API (the user-mode driver) sees them: device-local memory only."""
        count = ctypes.c_uint32(0)
        self._call("zeDeviceGetMemoryProperties", device, ctypes.byref(count), None)
        properties = (ze_device_memory_properties_t * count.value)()
        for entry in properties:
            entry.stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES
        if count.value:
            self._call("zeDeviceGetMemoryProperties", device, ctypes.byref(count), properties)
        return list(properties[: count.value])

    def zeDriverGetExtensionProperties(self, driver: int) -> list[str]:
        """The names of the extensions the driver supports."""
        count = ctypes.c_uint32(0)
        self._call("zeDriverGetExtensionProperties", driver, ctypes.byref(count), None)
        extensions = (ze_driver_extension_properties_t * count.value)()
        if count.value:
            self._call("zeDriverGetExtensionProperties", driver, ctypes.byref(count), extensions)
        return [_text(extension.name) for extension in extensions[: count.value]]

    def zelLoaderGetVersions(self) -> dict[str, str]:
        """The loader's components (its own, "loader", and each layer it loaded) -> "major.minor.patch"; empty
        when the loader does not export the call."""
        if not self.has("zelLoaderGetVersions"):
            return {}
        count = ctypes.c_size_t(0)
        self._call("zelLoaderGetVersions", ctypes.byref(count), None)
        versions = (zel_component_version_t * count.value)()
        if count.value:
            self._call("zelLoaderGetVersions", ctypes.byref(count), versions)
        return {_text(component.component_name): _version_text(component.component_lib_version)
                for component in versions[: count.value]}

    def zesInit(self, flags: int = 0) -> None:
        self._call("zesInit", flags)

    def zesDriverGet(self) -> list[int]:
        return self._enumerate("zesDriverGet")

    def zesDeviceGet(self, driver: int) -> list[int]:
        return self._enumerate("zesDeviceGet", driver)

    def zesDeviceGetProperties(self, device: int) -> zes_device_properties_t:
        properties = zes_device_properties_t(stype=ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES)
        properties.core.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES
        self._call("zesDeviceGetProperties", device, ctypes.byref(properties))
        return properties

    def zesDevicePciGetProperties(self, device: int) -> zes_pci_properties_t:
        properties = zes_pci_properties_t(stype=ZES_STRUCTURE_TYPE_PCI_PROPERTIES)
        self._call("zesDevicePciGetProperties", device, ctypes.byref(properties))
        return properties

    def zesDeviceEnumMemoryModules(self, device: int) -> list[int]:
        return self._enumerate("zesDeviceEnumMemoryModules", device)

    def zesMemoryGetProperties(self, memory: int) -> zes_mem_properties_t:
        properties = zes_mem_properties_t(stype=ZES_STRUCTURE_TYPE_MEM_PROPERTIES)
        self._call("zesMemoryGetProperties", memory, ctypes.byref(properties))
        return properties

    def zesMemoryGetState(self, memory: int) -> zes_mem_state_t:
        state = zes_mem_state_t(stype=ZES_STRUCTURE_TYPE_MEM_STATE)
        self._call("zesMemoryGetState", memory, ctypes.byref(state))
        return state

    def zesMemoryGetBandwidth(self, memory: int) -> zes_mem_bandwidth_t:
        bandwidth = zes_mem_bandwidth_t()
        self._call("zesMemoryGetBandwidth", memory, ctypes.byref(bandwidth))
        return bandwidth

    def zesDeviceEnumEngineGroups(self, device: int) -> list[int]:
        return self._enumerate("zesDeviceEnumEngineGroups", device)

    def zesEngineGetProperties(self, engine: int) -> zes_engine_properties_t:
        properties = zes_engine_properties_t(stype=ZES_STRUCTURE_TYPE_ENGINE_PROPERTIES)
        self._call("zesEngineGetProperties", engine, ctypes.byref(properties))
        return properties

    def zesEngineGetActivity(self, engine: int) -> zes_engine_stats_t:
        stats = zes_engine_stats_t()
        self._call("zesEngineGetActivity", engine, ctypes.byref(stats))
        return stats

    def zesDeviceEnumPowerDomains(self, device: int) -> list[int]:
        return self._enumerate("zesDeviceEnumPowerDomains", device)

    def zesDeviceGetCardPowerDomain(self, device: int) -> int | None:
        """The card's power domain; None when the driver returns no handle. Check has() first: the loader
        may not export it."""
        power = ctypes.c_void_p()
        self._call("zesDeviceGetCardPowerDomain", device, ctypes.byref(power))
        return power.value

    def zesPowerGetProperties(self, power: int) -> zes_power_properties_t:
        properties = zes_power_properties_t(stype=ZES_STRUCTURE_TYPE_POWER_PROPERTIES)
        self._call("zesPowerGetProperties", power, ctypes.byref(properties))
        return properties

    def zesPowerGetEnergyCounter(self, power: int) -> zes_power_energy_counter_t:
        energy = zes_power_energy_counter_t()
        self._call("zesPowerGetEnergyCounter", power, ctypes.byref(energy))
        return energy

    def zesDeviceEnumTemperatureSensors(self, device: int) -> list[int]:
        return self._enumerate("zesDeviceEnumTemperatureSensors", device)

    def zesTemperatureGetProperties(self, sensor: int) -> zes_temp_properties_t:
        properties = zes_temp_properties_t(stype=ZES_STRUCTURE_TYPE_TEMP_PROPERTIES)
        self._call("zesTemperatureGetProperties", sensor, ctypes.byref(properties))
        return properties

    def zesTemperatureGetState(self, sensor: int) -> float:
        temperature = ctypes.c_double()
        self._call("zesTemperatureGetState", sensor, ctypes.byref(temperature))
        return temperature.value

    def zesDeviceEnumFrequencyDomains(self, device: int) -> list[int]:
        return self._enumerate("zesDeviceEnumFrequencyDomains", device)

    def zesFrequencyGetProperties(self, domain: int) -> zes_freq_properties_t:
        properties = zes_freq_properties_t(stype=ZES_STRUCTURE_TYPE_FREQ_PROPERTIES)
        self._call("zesFrequencyGetProperties", domain, ctypes.byref(properties))
        return properties

    def zesFrequencyGetState(self, domain: int) -> zes_freq_state_t:
        state = zes_freq_state_t(stype=ZES_STRUCTURE_TYPE_FREQ_STATE)
        self._call("zesFrequencyGetState", domain, ctypes.byref(state))
        return state

    def zesDeviceEnumRasErrorSets(self, device: int) -> list[int]:
        return self._enumerate("zesDeviceEnumRasErrorSets", device)

    def zesRasGetProperties(self, ras: int) -> zes_ras_properties_t:
        properties = zes_ras_properties_t(stype=ZES_STRUCTURE_TYPE_RAS_PROPERTIES)
        self._call("zesRasGetProperties", ras, ctypes.byref(properties))
        return properties

    def zesRasGetState(self, ras: int) -> zes_ras_state_t:
        """The error counters, never cleared (clear = 0): clearing is the operator's decision, not a reader's."""
        state = zes_ras_state_t(stype=ZES_STRUCTURE_TYPE_RAS_STATE)
        self._call("zesRasGetState", ras, 0, ctypes.byref(state))
        return state

    def zesDeviceProcessesGetState(self, device: int) -> list[zes_process_state_t]:
        """All processes using the device.

        The process count can grow between the count query and the read; the driver then
        returns ZE_RESULT_ERROR_INVALID_SIZE. The count is queried again and the array
        doubled, at most PROCESS_READ_ATTEMPTS times.
        """
        capacity = 0
        for _ in range(PROCESS_READ_ATTEMPTS):
            count = ctypes.c_uint32(0)
            self._call("zesDeviceProcessesGetState", device, ctypes.byref(count), None)
            if count.value == 0:
                return []
            capacity = max(count.value, 2 * capacity)
            processes = (zes_process_state_t * capacity)()
            for process in processes:
                process.stype = ZES_STRUCTURE_TYPE_PROCESS_STATE
            filled = ctypes.c_uint32(capacity)
            code = self._functions["zesDeviceProcessesGetState"](device, ctypes.byref(filled), processes)
            if code == ZE_RESULT_ERROR_INVALID_SIZE:
                continue
            if code != ZE_RESULT_SUCCESS:
                raise LevelZeroError("zesDeviceProcessesGetState", code)
            return list(processes[: min(filled.value, capacity)])
        raise LevelZeroError("zesDeviceProcessesGetState", ZE_RESULT_ERROR_INVALID_SIZE)


# ---------------------------------------------------------------------------------------------
# Public API


@dataclass(frozen=True)
class DeviceIdentity:
    pci_address: str  # "0000:03:00.0"
    name: str  # the core device name
    uuid: str  # 8-4-4-4-12 lower-case hex, bytes in driver order
    driver_version: str  # zes_device_properties_t.driverVersion as reported


@dataclass(frozen=True)
class MemoryModuleProperties:
    """A memory module as zesMemoryGetProperties describes it; read its state with Device.memory_state()."""

    handle: int  # zes_mem_handle_t
    device_local: bool  # location == ZES_MEM_LOC_DEVICE; False for system memory
    physical_size: int  # bytes


@dataclass(frozen=True)
class MemoryModule:
    device_local: bool  # location == ZES_MEM_LOC_DEVICE; False for system memory
    size: int  # bytes: zes_mem_state_t.size, or physicalSize when the state says 0
    free: int  # bytes, as the driver reports it
    health: int  # zes_mem_health_t


@dataclass(frozen=True)
class CoreMemory:
    """The device's memory as the Level Zero core API (the user-mode driver) reports it: what torch and vLLM
    read. Its total is about 0.95 of Sysman's (the kernel driver's usable memory)."""

    total: int  # bytes: zeDeviceGetMemoryProperties' totalSize, summed (what vLLM multiplies by its utilisation)
    usable: int | None  # bytes: the usable-memory extension's currUsableMemSize (vLLM's free); None: not listed


@dataclass(frozen=True)
class ProcessMemory:
    pid: int
    mem_size: int  # device memory allocated by the process, bytes
    shared_size: int  # shared device memory mapped into the process, bytes
    engines: int  # zes_engine_type_flags_t


@dataclass(frozen=True)
class MemoryBandwidth:
    """zesMemoryGetBandwidth of one memory module."""

    read_counter: int  # bytes read since an arbitrary start
    write_counter: int  # bytes written since an arbitrary start
    max_bandwidth: int  # bytes per second; 0 when the driver does not know
    timestamp: int  # microseconds; only for differences between readings of the same module


# Device telemetry. Each kind has a description (the handle and its properties, enumerated once) and a
# reading of one moment; a reading repeats where its component sits (on a sub-device or the device itself).


@dataclass(frozen=True)
class EngineGroup:
    handle: int  # zes_engine_handle_t
    group: int  # zes_engine_group_t
    on_subdevice: bool
    subdevice_id: int


@dataclass(frozen=True)
class EngineActivity:
    group: int  # zes_engine_group_t
    on_subdevice: bool
    subdevice_id: int
    active_time: int  # microseconds the group was busy, a monotonic counter
    timestamp: int  # microseconds; only for differences between readings of the same group


@dataclass(frozen=True)
class PowerDomain:
    handle: int  # zes_pwr_handle_t
    card: bool  # the card's domain (zesDeviceGetCardPowerDomain); else the package's (not on a sub-device)


@dataclass(frozen=True)
class EnergyCounter:
    card: bool
    energy: int  # microjoules, a monotonic counter
    timestamp: int  # microseconds; only for differences between readings of the same domain


@dataclass(frozen=True)
class TemperatureSensor:
    handle: int  # zes_temp_handle_t
    sensor: int  # zes_temp_sensors_t
    on_subdevice: bool
    subdevice_id: int


@dataclass(frozen=True)
class Temperature:
    sensor: int  # zes_temp_sensors_t
    on_subdevice: bool
    subdevice_id: int
    celsius: float


@dataclass(frozen=True)
class FrequencyDomain:
    handle: int  # zes_freq_handle_t
    domain: int  # zes_freq_domain_t
    on_subdevice: bool
    subdevice_id: int


@dataclass(frozen=True)
class Frequency:
    domain: int  # zes_freq_domain_t
    on_subdevice: bool
    subdevice_id: int
    actual: float  # MHz; negative when the driver does not know
    throttle_reasons: int  # zes_freq_throttle_reason_flags_t


@dataclass(frozen=True)
class RasErrorSet:
    handle: int  # zes_ras_handle_t
    error_type: int  # zes_ras_error_type_t
    on_subdevice: bool
    subdevice_id: int


@dataclass(frozen=True)
class RasErrors:
    error_type: int  # zes_ras_error_type_t
    on_subdevice: bool
    subdevice_id: int
    categories: tuple[int, ...]  # error count by zes_ras_error_cat_t, ZES_MAX_RAS_ERROR_CATEGORY_COUNT of them


def format_uuid(uuid: bytes) -> str:
    """16 UUID bytes, in the given order, as lower-case hex 8-4-4-4-12."""
    if len(uuid) != ZE_MAX_DEVICE_UUID_SIZE:
        raise ValueError(f"a Level Zero UUID has {ZE_MAX_DEVICE_UUID_SIZE} bytes, got {len(uuid)}")
    text = uuid.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _version_text(version: zel_version_t) -> str:
    return f"{version.major}.{version.minor}.{version.patch}"


def _text(value: bytes) -> str:
    return value.decode("utf-8", errors="replace")


class Device:
    """One GPU. Obtained from LevelZero.devices(); each method queries the driver anew."""

    def __init__(self, library: LoaderLibrary, handle: int, core: bool = False,
                 usable_memory_extension: bool = False) -> None:
        self._library = library
        self.handle = handle
        self._core = core  # a core handle (zeInit's path): the core API answers for it
        self._usable_memory_extension = usable_memory_extension  # its driver lists USABLE_MEMORY_EXTENSION

    def __repr__(self) -> str:
        return f"Device(handle=0x{self.handle:x})"

    def identity(self) -> DeviceIdentity:
        properties = self._library.zesDeviceGetProperties(self.handle)
        address = self._library.zesDevicePciGetProperties(self.handle).address
        return DeviceIdentity(
            pci_address=format_pci_address(address.domain, address.bus, address.device, address.function),
            name=_text(properties.core.name),
            uuid=format_uuid(bytes(properties.core.uuid.id)),
            driver_version=_text(properties.driverVersion),
        )

    def memory(self) -> list[MemoryModule]:
        """Every memory module with its state: memory_modules(), then memory_state() of each."""
        return [self.memory_state(module) for module in self.memory_modules()]

    def memory_modules(self) -> list[MemoryModuleProperties]:
        """The memory modules and their properties, without their state (which can fail on its own)."""
        modules = []
        for handle in self._library.zesDeviceEnumMemoryModules(self.handle):
            properties = self._library.zesMemoryGetProperties(handle)
            modules.append(
                MemoryModuleProperties(
                    handle=handle,
                    device_local=properties.location == ZES_MEM_LOC_DEVICE,
                    physical_size=properties.physicalSize,
                )
            )
        return modules

    def core_memory(self) -> CoreMemory | None:
        """The core API's view of the device's memory (needs no Sysman, nor CAP_PERFMON); None on the zesInit
        path, whose Sysman handles the core API does not take."""
        if not self._core:
            return None
        total = sum(memory.totalSize for memory in self._library.zeDeviceGetMemoryProperties(self.handle))
        usable = None
        if self._usable_memory_extension:
            extension = ze_device_usablemem_size_ext_properties_t(
                stype=ZE_STRUCTURE_TYPE_DEVICE_USABLEMEM_SIZE_EXT_PROPERTIES)
            self._library.zeDeviceGetProperties(self.handle, extension)
            usable = extension.currUsableMemSize
        return CoreMemory(total=total, usable=usable)

    def memory_state(self, module: MemoryModuleProperties) -> MemoryModule:
        state = self._library.zesMemoryGetState(module.handle)
        return MemoryModule(
            device_local=module.device_local,
            size=state.size or module.physical_size,
            free=state.free,
            health=state.health,
        )

    def memory_bandwidth(self, module: MemoryModuleProperties) -> MemoryBandwidth:
        bandwidth = self._library.zesMemoryGetBandwidth(module.handle)
        return MemoryBandwidth(read_counter=bandwidth.readCounter, write_counter=bandwidth.writeCounter,
                               max_bandwidth=bandwidth.maxBandwidth, timestamp=bandwidth.timestamp)

    def engine_groups(self) -> list[EngineGroup]:
        """Every engine group, of any zes_engine_group_t (the *_ALL ones combine every engine of a kind)."""
        groups = []
        for handle in self._library.zesDeviceEnumEngineGroups(self.handle):
            properties = self._library.zesEngineGetProperties(handle)
            groups.append(EngineGroup(handle, properties.type, bool(properties.onSubdevice), properties.subdeviceId))
        return groups

    def engine_activity(self, group: EngineGroup) -> EngineActivity:
        stats = self._library.zesEngineGetActivity(group.handle)
        return EngineActivity(group.group, group.on_subdevice, group.subdevice_id, stats.activeTime, stats.timestamp)

    def power_domain(self) -> PowerDomain | None:
        """The card's power domain where the loader and the driver have one, else the first domain that is not
        on a sub-device (the package); None when the device has neither."""
        if self._library.has("zesDeviceGetCardPowerDomain"):
            try:
                card = self._library.zesDeviceGetCardPowerDomain(self.handle)
            except LevelZeroError as error:
                if error.code != ZE_RESULT_ERROR_UNSUPPORTED_FEATURE:
                    raise
            else:
                if card:
                    return PowerDomain(card, card=True)
        for handle in self._library.zesDeviceEnumPowerDomains(self.handle):
            if not self._library.zesPowerGetProperties(handle).onSubdevice:
                return PowerDomain(handle, card=False)
        return None

    def energy(self, domain: PowerDomain) -> EnergyCounter:
        counter = self._library.zesPowerGetEnergyCounter(domain.handle)
        return EnergyCounter(domain.card, counter.energy, counter.timestamp)

    def temperature_sensors(self) -> list[TemperatureSensor]:
        sensors = []
        for handle in self._library.zesDeviceEnumTemperatureSensors(self.handle):
            properties = self._library.zesTemperatureGetProperties(handle)
            sensors.append(TemperatureSensor(handle, properties.type, bool(properties.onSubdevice),
                                             properties.subdeviceId))
        return sensors

    def temperature(self, sensor: TemperatureSensor) -> Temperature:
        celsius = self._library.zesTemperatureGetState(sensor.handle)
        return Temperature(sensor.sensor, sensor.on_subdevice, sensor.subdevice_id, celsius)

    def frequency_domains(self) -> list[FrequencyDomain]:
        domains = []
        for handle in self._library.zesDeviceEnumFrequencyDomains(self.handle):
            properties = self._library.zesFrequencyGetProperties(handle)
            domains.append(FrequencyDomain(handle, properties.type, bool(properties.onSubdevice),
                                           properties.subdeviceId))
        return domains

    def frequency(self, domain: FrequencyDomain) -> Frequency:
        state = self._library.zesFrequencyGetState(domain.handle)
        return Frequency(domain.domain, domain.on_subdevice, domain.subdevice_id, state.actual, state.throttleReasons)

    def ras_error_sets(self) -> list[RasErrorSet]:
        sets = []
        for handle in self._library.zesDeviceEnumRasErrorSets(self.handle):
            properties = self._library.zesRasGetProperties(handle)
            sets.append(RasErrorSet(handle, properties.type, bool(properties.onSubdevice), properties.subdeviceId))
        return sets

    def ras_errors(self, error_set: RasErrorSet) -> RasErrors:
        """The set's error counters as they stand; never clears them."""
        state = self._library.zesRasGetState(error_set.handle)
        return RasErrors(error_set.error_type, error_set.on_subdevice, error_set.subdevice_id, tuple(state.category))

    def processes(self) -> list[ProcessMemory]:
        return [
            ProcessMemory(
                pid=process.processId,
                mem_size=process.memSize,
                shared_size=process.sharedSize,
                engines=process.engines,
            )
            for process in self._library.zesDeviceProcessesGetState(self.handle)
        ]


class LevelZero:
    """Entry point: open the loader, init() once, then list devices().

    The constructor loads the library (LoaderUnavailable if it cannot). init() raises
    LevelZeroError; after a failed init() every later init() or devices() raises that
    same error again without calling into Level Zero, because the loader cannot recover
    within the process (see the module docstring).
    """

    def __init__(self, library: str = DEFAULT_LIBRARY) -> None:
        self._library = LoaderLibrary(library)
        self._drivers: list[int] | None = None
        self._init_failure: LevelZeroError | None = None

    @property
    def library(self) -> str:
        return self._library.library

    @property
    def sysman_only(self) -> bool:
        """True when the loader has zesInit and init() takes the zesInit path."""
        return self._library.has_sysman_init

    def loader_versions(self) -> dict[str, str]:
        """The loader's components and their versions (`LoaderLibrary.zelLoaderGetVersions`); the loader fills
        them at initialisation, so ask after init(). Empty when the loader cannot say."""
        try:
            return self._library.zelLoaderGetVersions()
        except LevelZeroError:
            return {}

    def init(self) -> None:
        """Initialise Level Zero Sysman; idempotent after success, final after failure."""
        self._raise_if_failed()
        if self._drivers is not None:
            return
        try:
            if self.sysman_only:
                self._library.zesInit(0)
                self._drivers = self._library.zesDriverGet()
            else:
                # The driver reads ZES_ENABLE_SYSMAN during the process's first zeInit.
                os.environ["ZES_ENABLE_SYSMAN"] = "1"
                self._library.zeInit(0)
                self._drivers = self._library.zeDriverGet()
        except LevelZeroError as error:
            self._init_failure = error
            raise

    def devices(self) -> list[Device]:
        """The GPUs (core device type GPU) of every driver."""
        self._raise_if_failed()
        if self._drivers is None:
            raise NotInitialized("LevelZero.init() must succeed before devices()")
        core = not self.sysman_only
        extension = core and self._lists_usable_memory_extension()
        return [Device(self._library, handle, core, extension)
                for handle in self._device_handles() if self._is_gpu(handle)]

    def _lists_usable_memory_extension(self) -> bool:
        """Whether a driver lists the usable-memory extension (a driver that cannot say: no)."""
        assert self._drivers is not None
        try:
            return any(USABLE_MEMORY_EXTENSION in self._library.zeDriverGetExtensionProperties(driver)
                       for driver in self._drivers)
        except LevelZeroError:
            return False

    def _device_handles(self) -> list[int]:
        get = self._library.zesDeviceGet if self.sysman_only else self._library.zeDeviceGet
        assert self._drivers is not None
        return [device for driver in self._drivers for device in get(driver)]

    def _is_gpu(self, device: int) -> bool:
        # Sysman handles from zesDeviceGet are not core handles: ask Sysman on that path.
        if self.sysman_only:
            return self._library.zesDeviceGetProperties(device).core.type == ZE_DEVICE_TYPE_GPU
        return self._library.zeDeviceGetProperties(device).type == ZE_DEVICE_TYPE_GPU

    def _raise_if_failed(self) -> None:
        if self._init_failure is not None:
            raise LevelZeroError(self._init_failure.function, self._init_failure.code)


# ---------------------------------------------------------------------------------------------
# Command line: print what the bindings see


def _error_json(error: LevelZeroError) -> dict[str, Any]:
    return {"function": error.function, "code": error.code, "name": error.name, "message": str(error)}


def _device_json(device: Device) -> dict[str, Any]:
    from dataclasses import asdict

    def energy() -> EnergyCounter | None:
        domain = device.power_domain()
        return None if domain is None else device.energy(domain)

    readers: tuple[tuple[str, Callable[[], Any]], ...] = (
        ("identity", device.identity),
        ("memory", device.memory),
        ("core_memory", device.core_memory),
        ("processes", device.processes),
        ("memory_bandwidth", lambda: [device.memory_bandwidth(module) for module in device.memory_modules()]),
        ("engines", lambda: [device.engine_activity(group) for group in device.engine_groups()]),
        ("energy", energy),
        ("temperatures", lambda: [device.temperature(sensor) for sensor in device.temperature_sensors()]),
        ("frequencies", lambda: [device.frequency(domain) for domain in device.frequency_domains()]),
        ("ras", lambda: [device.ras_errors(error_set) for error_set in device.ras_error_sets()]),
    )
    result: dict[str, Any] = {}
    for key, read in readers:
        try:
            value = read()
            if isinstance(value, list):
                result[key] = [asdict(item) for item in value]
            else:
                result[key] = None if value is None else asdict(value)
        except LevelZeroError as error:
            result[key] = {"error": _error_json(error)}
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Print the devices, their memory, processes and telemetry as JSON; exit 1 if Level Zero is unusable."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m vllm_xpu_exporter.sources.levelzero.binding", description=main.__doc__)
    parser.add_argument("--library", default=DEFAULT_LIBRARY, help="Level Zero loader to dlopen")
    arguments = parser.parse_args(argv)
    try:
        level_zero = LevelZero(arguments.library)
        level_zero.init()
        devices = level_zero.devices()
    except LoaderUnavailable as error:
        print(json.dumps({"error": {"loader_unavailable": str(error)}}))
        return 1
    except LevelZeroError as error:
        print(json.dumps({"error": _error_json(error)}))
        return 1
    print(json.dumps({"sysman_only": level_zero.sysman_only, "devices": [_device_json(d) for d in devices]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
