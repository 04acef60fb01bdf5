/*
 * fake_ze.c - a test-only Level Zero driver with fake Intel GPUs.
 *
 * The real Level Zero loader (Debian libze1 1.8.12) loads it in place of
 * libze_intel_gpu.so.1 when told to:
 *
 *     ZE_ENABLE_ALT_DRIVERS=/abs/path/libze_fake.so
 *     FAKE_ZE_CONFIG=/abs/path/config.txt
 *     ZES_ENABLE_SYSMAN=1
 *
 * Build: gcc -shared -fPIC -fvisibility=hidden -O1 -Wall -Werror -o libze_fake.so fake_ze.c
 *
 * Like compute-runtime, the zes* (Sysman) calls return ZE_RESULT_ERROR_UNINITIALIZED
 * unless ZES_ENABLE_SYSMAN=1 was in the environment at the process's first successful zeInit.
 *
 * Every call looks at the config file again (it is parsed again when it is
 * another file or was modified), so a test changes the driver's behaviour
 * mid-run by atomically replacing the file (write a temporary file, rename it
 * over the old one). A missing or malformed file makes every call print the
 * reason on stderr and return ZE_RESULT_ERROR_UNKNOWN.
 *
 * CONFIG FORMAT: one directive per line, words separated by blanks. Blank lines
 * and lines starting with '#' are ignored. Numbers are decimal or 0x-hex.
 * <result> is a ze_result_t name (ZE_RESULT_ERROR_DEVICE_LOST) or number (0x70000001).
 *
 *   Global directives, before the first `device` line:
 *     init_result <result>      what zeInit returns (default ZE_RESULT_SUCCESS)
 *     init_hang                 zeInit never returns
 *     usable_memory_extension   the driver lists the usable-memory extension (zeDriverGetExtensionProperties)
 *                               and fills its currUsableMemSize when chained to zeDeviceGetProperties
 *
 *   `device <dddd:bb:dd.f>` starts a device (at most 8); the lines after it describe it:
 *     name <text>               core device name, rest of the line (default "Intel(R) Graphics (FAKE)")
 *     uuid <32 hex digits>      '-' allowed anywhere; default: see default_uuid() below
 *     driver_version <text>     zes_device_properties_t.driverVersion, rest of the line (default "1.3.0-fake")
 *     device_id <n>             PCI device id (default 0x56a0)
 *     device_type <n>           core ze_device_type_t (default 1, GPU; 2 is CPU)
 *     memory <device|system> <size> <free> [physical_size=<n>] [health=<n>] [type=<n>]
 *            [read=<n>] [write=<n>] [max_bandwidth=<n>] [core_size=<n>]
 *                               a memory module (at most 8): <size> and <free> are what
 *                               zesMemoryGetState reports; physical_size (default <size>) is
 *                               zes_mem_properties_t.physicalSize; health a zes_mem_health_t
 *                               (default 1, OK); type a zes_mem_type_t (default GDDR6 for
 *                               device memory, DDR for system memory); read, write and
 *                               max_bandwidth are what zesMemoryGetBandwidth reports (a module
 *                               with none of them: ZE_RESULT_ERROR_UNSUPPORTED_FEATURE); core_size is
 *                               the core API's totalSize of a device module (zeDeviceGetMemoryProperties;
 *                               default 0.95 x <size>, as the user-mode driver reports against the kernel's)
 *     usable_memory <n>         currUsableMemSize (default: the device modules' <free> less what the core
 *                               API keeps back, <size> - core_size, never below 0)
 *     memory_modules_result <r> what zesDeviceEnumMemoryModules returns
 *     memory_state_result <r>   what zesMemoryGetState returns for every module of the device
 *     memory_state_hang         zesMemoryGetState never returns
 *     processes_result <r>      what zesDeviceProcessesGetState returns
 *     processes_hang            zesDeviceProcessesGetState never returns
 *     processes_count_lag <n>   the count query (*pCount == 0) of zesDeviceProcessesGetState
 *                               reports n processes fewer than listed, as if n processes had
 *                               started between the caller's two calls
 *     process <pid> <mem_size> <shared_size> [engines]
 *                               a process using the device (at most 1024 per device);
 *                               engines is a zes_engine_type_flags_t (default 2, COMPUTE)
 *     memory_bandwidth_result <r>  what zesMemoryGetBandwidth returns for every module
 *
 *   Telemetry components (at most 16 of each kind per device); each takes [subdevice=<n>]
 *   (zes_*_properties_t.onSubdevice and subdeviceId; default: on the device itself):
 *     engine <group> <active_us>                 an engine group: zes_engine_group_t, and the
 *                                                activeTime zesEngineGetActivity reports
 *     power <energy_uj> [card]                   a power domain and its energy counter; `card`:
 *                                                zesDeviceGetCardPowerDomain returns it (else that
 *                                                call returns ZE_RESULT_ERROR_UNSUPPORTED_FEATURE)
 *     temperature <sensor> <celsius>             a zes_temp_sensors_t sensor and its reading
 *     frequency <domain> <actual_mhz> [throttle=<flags>]
 *                                                a zes_freq_domain_t domain, its actual frequency and
 *                                                its zes_freq_throttle_reason_flags_t
 *     ras <type> <reset> <programming> <driver> <compute> <non_compute> <cache> <display>
 *                                                a RAS error set (zes_ras_error_type_t) and its counts
 *                                                by category; zesRasGetState refuses to clear them
 *                                                (ZE_RESULT_ERROR_INVALID_ARGUMENT, and says so on stderr)
 *   and, per kind (<kind> = engines, power, temperature, frequency or ras), what its calls return:
 *     <kind>_enum_result <r>    the enumeration (zesDeviceEnumEngineGroups, ...; for power also
 *                               zesDeviceGetCardPowerDomain)
 *     <kind>_result <r>         the reading (zesEngineGetActivity, zesPowerGetEnergyCounter,
 *                               zesTemperatureGetState, zesFrequencyGetState, zesRasGetState)
 *
 * Example:
 *     init_result ZE_RESULT_SUCCESS
 *     device 0000:03:00.0
 *     name Intel(R) Arc(TM) A770 Graphics
 *     memory device 17179869184 13958643712
 *     memory system 34359738368 30000000000
 *     process 1000 268435456 0
 *
 * Handles are addresses inside constant arrays (device i, memory module j of
 * device i, component j of a kind of device i), so a handle keeps meaning
 * "device i" across config changes; a handle whose device (or component)
 * vanished from the config gets ZE_RESULT_ERROR_DEVICE_LOST.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <level_zero/ze_ddi.h>
#include <level_zero/zes_ddi.h>
#include <level_zero/zet_ddi.h>

#include "ze_usablemem.h"

#define MAX_DEVICES 8
#define MAX_MODULES 8
#define MAX_PROCESSES 1024
#define MAX_COMPONENTS 16
#define INTEL_VENDOR_ID 0x8086

struct memory_module {
    int device_local;
    uint64_t size;
    uint64_t free;
    uint64_t physical_size;
    uint64_t core_size;
    uint32_t health;
    uint32_t type;
    int has_bandwidth;
    uint64_t read_bytes, write_bytes, max_bandwidth;
};

/* The telemetry components a device has, by kind. */
enum kind { ENGINES, POWER, TEMPERATURE, FREQUENCY, RAS, KIND_COUNT };
static const char *const kind_names[KIND_COUNT] = { "engines", "power", "temperature", "frequency", "ras" };

struct component {
    uint32_t type;         /* engine group, temperature sensor, frequency domain or RAS error type */
    int on_subdevice;
    uint32_t subdevice_id;
    uint64_t counter;      /* engine: active microseconds; power: energy in microjoules */
    double value;          /* temperature: degrees Celsius; frequency: actual MHz */
    uint32_t throttle;     /* frequency: throttle reasons */
    int card;              /* power: the card's domain */
    uint64_t categories[ZES_MAX_RAS_ERROR_CATEGORY_COUNT]; /* RAS */
};

struct family {
    unsigned count;
    struct component components[MAX_COMPONENTS];
    ze_result_t enum_result;
    ze_result_t read_result;
};

struct process {
    uint32_t pid;
    uint64_t mem_size;
    uint64_t shared_size;
    uint32_t engines;
};

struct device {
    uint32_t pci_domain, pci_bus, pci_device, pci_function;
    char name[ZE_MAX_DEVICE_NAME];
    uint8_t uuid[ZE_MAX_DEVICE_UUID_SIZE];
    int has_uuid;
    char driver_version[ZES_STRING_PROPERTY_SIZE];
    uint32_t device_id;
    uint32_t device_type;
    unsigned module_count;
    struct memory_module modules[MAX_MODULES];
    ze_result_t memory_modules_result;
    ze_result_t memory_state_result;
    int memory_state_hang;
    ze_result_t processes_result;
    int processes_hang;
    uint32_t processes_count_lag;
    unsigned process_count;
    struct process processes[MAX_PROCESSES];
    ze_result_t memory_bandwidth_result;
    struct family families[KIND_COUNT];
    int has_usable_memory;
    uint64_t usable_memory;
};

struct config {
    ze_result_t init_result;
    int init_hang;
    int usable_memory_extension;
    unsigned device_count;
    struct device devices[MAX_DEVICES];
};

/* Handles: distinct addresses that encode an index and never change. */
static const char driver_token;
static const char device_tokens[MAX_DEVICES];
static const char memory_tokens[MAX_DEVICES][MAX_MODULES];
static const char component_tokens[KIND_COUNT][MAX_DEVICES][MAX_COMPONENTS];

/*
 * compute-runtime decides once, at the first successful zeInit of the process, whether
 * Sysman is on (later zeInit calls reach the driver again but change nothing); so does
 * the fake. Besides the parsed config (load_config), this is the only state the fake keeps
 * between calls.
 */
static int sysman_decided;
static int sysman_enabled_at_init;

/* ------------------------------------------------------------------------- */
/* Config parsing                                                            */

#define RESULT_NAME(code) { #code, code }
static const struct { const char *name; ze_result_t code; } result_names[] = {
    RESULT_NAME(ZE_RESULT_SUCCESS),
    RESULT_NAME(ZE_RESULT_NOT_READY),
    RESULT_NAME(ZE_RESULT_ERROR_DEVICE_LOST),
    RESULT_NAME(ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY),
    RESULT_NAME(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY),
    RESULT_NAME(ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET),
    RESULT_NAME(ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE),
    RESULT_NAME(ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS),
    RESULT_NAME(ZE_RESULT_ERROR_NOT_AVAILABLE),
    RESULT_NAME(ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE),
    RESULT_NAME(ZE_RESULT_ERROR_UNINITIALIZED),
    RESULT_NAME(ZE_RESULT_ERROR_UNSUPPORTED_VERSION),
    RESULT_NAME(ZE_RESULT_ERROR_UNSUPPORTED_FEATURE),
    RESULT_NAME(ZE_RESULT_ERROR_INVALID_ARGUMENT),
    RESULT_NAME(ZE_RESULT_ERROR_INVALID_NULL_HANDLE),
    RESULT_NAME(ZE_RESULT_ERROR_INVALID_NULL_POINTER),
    RESULT_NAME(ZE_RESULT_ERROR_INVALID_SIZE),
    RESULT_NAME(ZE_RESULT_ERROR_UNKNOWN),
};

static int parse_number(const char *text, uint64_t *value)
{
    char *end;
    if (text == NULL || *text == '\0' || *text == '-')
        return -1;
    errno = 0;
    *value = strtoull(text, &end, 0);
    return (errno != 0 || *end != '\0') ? -1 : 0;
}

static int parse_u32(const char *text, uint32_t *value)
{
    uint64_t wide;
    if (parse_number(text, &wide) != 0 || wide > UINT32_MAX)
        return -1;
    *value = (uint32_t)wide;
    return 0;
}

static int parse_result(const char *text, ze_result_t *result)
{
    uint32_t code;
    for (size_t i = 0; i < sizeof(result_names) / sizeof(result_names[0]); i++) {
        if (text != NULL && strcmp(text, result_names[i].name) == 0) {
            *result = result_names[i].code;
            return 0;
        }
    }
    if (parse_u32(text, &code) != 0)
        return -1;
    *result = (ze_result_t)code;
    return 0;
}

static int parse_pci_address(const char *text, struct device *device)
{
    int consumed = 0;
    if (text == NULL
        || sscanf(text, "%x:%x:%x.%x%n", &device->pci_domain, &device->pci_bus,
                  &device->pci_device, &device->pci_function, &consumed) != 4
        || text[consumed] != '\0')
        return -1;
    return 0;
}

static int parse_uuid(const char *text, uint8_t uuid[ZE_MAX_DEVICE_UUID_SIZE])
{
    unsigned digits = 0;
    for (; text != NULL && *text != '\0'; text++) {
        if (*text == '-')
            continue;
        if (!isxdigit((unsigned char)*text) || digits == 2 * ZE_MAX_DEVICE_UUID_SIZE)
            return -1;
        int nibble = isdigit((unsigned char)*text) ? *text - '0' : tolower((unsigned char)*text) - 'a' + 10;
        if (digits % 2 == 0)
            uuid[digits / 2] = (uint8_t)(nibble << 4);
        else
            uuid[digits / 2] |= (uint8_t)nibble;
        digits++;
    }
    return digits == 2 * ZE_MAX_DEVICE_UUID_SIZE ? 0 : -1;
}

/*
 * The default UUID mimics compute-runtime's layout: vendor id and device id
 * (little endian), 2 revision bytes (0), PCI domain (little endian), bus,
 * device, function, then zeros. tests/fakeze.py computes the same value.
 */
static void default_uuid(const struct device *device, uint8_t uuid[ZE_MAX_DEVICE_UUID_SIZE])
{
    memset(uuid, 0, ZE_MAX_DEVICE_UUID_SIZE);
    uuid[0] = INTEL_VENDOR_ID & 0xff;
    uuid[1] = INTEL_VENDOR_ID >> 8;
    uuid[2] = device->device_id & 0xff;
    uuid[3] = (device->device_id >> 8) & 0xff;
    uuid[6] = device->pci_domain & 0xff;
    uuid[7] = (device->pci_domain >> 8) & 0xff;
    uuid[8] = (uint8_t)device->pci_bus;
    uuid[9] = (uint8_t)device->pci_device;
    uuid[10] = (uint8_t)device->pci_function;
}

static void copy_text(char *destination, size_t size, const char *text)
{
    snprintf(destination, size, "%s", text != NULL ? text : "");
}

/* memory <device|system> <size> <free> [physical_size=<n>] [health=<n>] [type=<n>] */
static int parse_memory(char *arguments, struct memory_module *module)
{
    char *saveptr = NULL;
    char *location = strtok_r(arguments, " \t", &saveptr);
    char *size = strtok_r(NULL, " \t", &saveptr);
    char *free_bytes = strtok_r(NULL, " \t", &saveptr);
    if (location == NULL || parse_number(size, &module->size) != 0
        || parse_number(free_bytes, &module->free) != 0)
        return -1;
    if (strcmp(location, "device") == 0)
        module->device_local = 1;
    else if (strcmp(location, "system") == 0)
        module->device_local = 0;
    else
        return -1;
    module->physical_size = module->size;
    module->core_size = module->size / 100 * 95 + module->size % 100 * 95 / 100;
    module->health = ZES_MEM_HEALTH_OK;
    module->type = module->device_local ? ZES_MEM_TYPE_GDDR6 : ZES_MEM_TYPE_DDR;
    for (char *option; (option = strtok_r(NULL, " \t", &saveptr)) != NULL;) {
        char *value = strchr(option, '=');
        if (value == NULL)
            return -1;
        *value++ = '\0';
        int status;
        if (strcmp(option, "physical_size") == 0)
            status = parse_number(value, &module->physical_size);
        else if (strcmp(option, "core_size") == 0)
            status = parse_number(value, &module->core_size);
        else if (strcmp(option, "health") == 0)
            status = parse_u32(value, &module->health);
        else if (strcmp(option, "type") == 0)
            status = parse_u32(value, &module->type);
        else if (strcmp(option, "read") == 0)
            status = parse_number(value, &module->read_bytes);
        else if (strcmp(option, "write") == 0)
            status = parse_number(value, &module->write_bytes);
        else if (strcmp(option, "max_bandwidth") == 0)
            status = parse_number(value, &module->max_bandwidth);
        else
            status = -1;
        if (strcmp(option, "read") == 0 || strcmp(option, "write") == 0 || strcmp(option, "max_bandwidth") == 0)
            module->has_bandwidth = 1;
        if (status != 0)
            return -1;
    }
    return 0;
}

/* process <pid> <mem_size> <shared_size> [engines] */
static int parse_process(char *arguments, struct process *process)
{
    char *saveptr = NULL;
    char *pid = strtok_r(arguments, " \t", &saveptr);
    char *mem_size = strtok_r(NULL, " \t", &saveptr);
    char *shared_size = strtok_r(NULL, " \t", &saveptr);
    char *engines = strtok_r(NULL, " \t", &saveptr);
    if (parse_u32(pid, &process->pid) != 0 || parse_number(mem_size, &process->mem_size) != 0
        || parse_number(shared_size, &process->shared_size) != 0
        || strtok_r(NULL, " \t", &saveptr) != NULL)
        return -1;
    process->engines = ZES_ENGINE_TYPE_FLAG_COMPUTE;
    return engines == NULL ? 0 : parse_u32(engines, &process->engines);
}

static int parse_double(const char *text, double *value)
{
    char *end;
    if (text == NULL || *text == '\0')
        return -1;
    errno = 0;
    *value = strtod(text, &end);
    return (errno != 0 || *end != '\0') ? -1 : 0;
}

/*
 * engine <group> <active_us> | power <energy_uj> [card] | temperature <sensor> <celsius>
 * | frequency <domain> <actual_mhz> [throttle=<flags>] | ras <type> <7 counts>; each [subdevice=<n>]
 */
static int parse_component(enum kind kind, char *arguments, struct component *component)
{
    char *saveptr = NULL;
    char *word = strtok_r(arguments, " \t", &saveptr);
    int status = 0;
    memset(component, 0, sizeof(*component));
    switch (kind) {
    case ENGINES:
        status = parse_u32(word, &component->type)
            || parse_number(strtok_r(NULL, " \t", &saveptr), &component->counter);
        break;
    case POWER:
        status = parse_number(word, &component->counter);
        break;
    case TEMPERATURE:
    case FREQUENCY:
        status = parse_u32(word, &component->type)
            || parse_double(strtok_r(NULL, " \t", &saveptr), &component->value);
        break;
    case RAS:
        status = parse_u32(word, &component->type);
        for (unsigned i = 0; status == 0 && i < ZES_MAX_RAS_ERROR_CATEGORY_COUNT; i++)
            status = parse_number(strtok_r(NULL, " \t", &saveptr), &component->categories[i]);
        break;
    default:
        return -1;
    }
    if (status != 0)
        return -1;
    for (char *option; (option = strtok_r(NULL, " \t", &saveptr)) != NULL;) {
        if (kind == POWER && strcmp(option, "card") == 0) {
            component->card = 1;
            continue;
        }
        char *value = strchr(option, '=');
        if (value == NULL)
            return -1;
        *value++ = '\0';
        if (strcmp(option, "subdevice") == 0) {
            component->on_subdevice = 1;
            status = parse_u32(value, &component->subdevice_id);
        } else if (kind == FREQUENCY && strcmp(option, "throttle") == 0) {
            status = parse_u32(value, &component->throttle);
        } else {
            status = -1;
        }
        if (status != 0)
            return -1;
    }
    return 0;
}

static const char *const component_usage[KIND_COUNT] = {
    "engine <group> <active_us> [subdevice=<n>]",
    "power <energy_uj> [card] [subdevice=<n>]",
    "temperature <sensor> <celsius> [subdevice=<n>]",
    "frequency <domain> <actual_mhz> [throttle=<flags>] [subdevice=<n>]",
    "ras <type> <reset> <programming> <driver> <compute> <non_compute> <cache> <display> [subdevice=<n>]",
};
static const char *const component_keywords[KIND_COUNT] = { "engine", "power", "temperature", "frequency", "ras" };

/* A telemetry directive (a component, <kind>_enum_result or <kind>_result); NULL when keyword is none. */
static const char *apply_telemetry_directive(struct device *device, const char *keyword, char *arguments,
                                             int *handled)
{
    char name[64];
    *handled = 1;
    for (int kind = 0; kind < KIND_COUNT; kind++) {
        struct family *family = &device->families[kind];
        if (strcmp(keyword, component_keywords[kind]) == 0) {
            if (family->count == MAX_COMPONENTS)
                return "too many components of this kind";
            return parse_component((enum kind)kind, arguments, &family->components[family->count++]) == 0
                ? NULL : component_usage[kind];
        }
        snprintf(name, sizeof(name), "%s_enum_result", kind_names[kind]);
        if (strcmp(keyword, name) == 0)
            return parse_result(arguments, &family->enum_result) == 0 ? NULL : "<kind>_enum_result <result>";
        snprintf(name, sizeof(name), "%s_result", kind_names[kind]);
        if (strcmp(keyword, name) == 0)
            return parse_result(arguments, &family->read_result) == 0 ? NULL : "<kind>_result <result>";
    }
    if (strcmp(keyword, "memory_bandwidth_result") == 0)
        return parse_result(arguments, &device->memory_bandwidth_result) == 0
            ? NULL : "memory_bandwidth_result <result>";
    *handled = 0;
    return NULL;
}

static void new_device(struct device *device)
{
    memset(device, 0, sizeof(*device));
    copy_text(device->name, sizeof(device->name), "Intel(R) Graphics (FAKE)");
    copy_text(device->driver_version, sizeof(device->driver_version), "1.3.0-fake");
    device->device_id = 0x56a0;
    device->device_type = ZE_DEVICE_TYPE_GPU;
    device->memory_modules_result = ZE_RESULT_SUCCESS;
    device->memory_state_result = ZE_RESULT_SUCCESS;
    device->processes_result = ZE_RESULT_SUCCESS;
    device->memory_bandwidth_result = ZE_RESULT_SUCCESS;
    for (int kind = 0; kind < KIND_COUNT; kind++) {
        device->families[kind].enum_result = ZE_RESULT_SUCCESS;
        device->families[kind].read_result = ZE_RESULT_SUCCESS;
    }
}

/* Applies one directive; returns an error message or NULL. */
static const char *apply_directive(struct config *config, const char *keyword, char *arguments)
{
    struct device *device = config->device_count > 0 ? &config->devices[config->device_count - 1] : NULL;

    if (strcmp(keyword, "usable_memory_extension") == 0) {
        if (device != NULL)
            return "usable_memory_extension must come before the first device";
        config->usable_memory_extension = 1;
        return NULL;
    }
    if (strcmp(keyword, "init_result") == 0 || strcmp(keyword, "init_hang") == 0) {
        if (device != NULL)
            return "init_result and init_hang must come before the first device";
        if (strcmp(keyword, "init_hang") == 0)
            config->init_hang = 1;
        else if (parse_result(arguments, &config->init_result) != 0)
            return "init_result <result>";
        return NULL;
    }
    if (strcmp(keyword, "device") == 0) {
        if (config->device_count == MAX_DEVICES)
            return "too many devices";
        device = &config->devices[config->device_count++];
        new_device(device);
        return parse_pci_address(arguments, device) == 0 ? NULL : "device <dddd:bb:dd.f>";
    }
    if (device == NULL)
        return "unknown global directive (device directives need a `device` line first)";
    if (strcmp(keyword, "name") == 0) {
        copy_text(device->name, sizeof(device->name), arguments);
        return NULL;
    }
    if (strcmp(keyword, "driver_version") == 0) {
        copy_text(device->driver_version, sizeof(device->driver_version), arguments);
        return NULL;
    }
    if (strcmp(keyword, "uuid") == 0) {
        device->has_uuid = 1;
        return parse_uuid(arguments, device->uuid) == 0 ? NULL : "uuid needs 32 hex digits";
    }
    if (strcmp(keyword, "device_id") == 0)
        return parse_u32(arguments, &device->device_id) == 0 ? NULL : "device_id <number>";
    if (strcmp(keyword, "device_type") == 0)
        return parse_u32(arguments, &device->device_type) == 0 ? NULL : "device_type <number>";
    if (strcmp(keyword, "memory") == 0) {
        if (device->module_count == MAX_MODULES)
            return "too many memory modules";
        return parse_memory(arguments, &device->modules[device->module_count++]) == 0
            ? NULL : "memory <device|system> <size> <free> [physical_size=<n>] [health=<n>] [type=<n>]";
    }
    if (strcmp(keyword, "usable_memory") == 0) {
        device->has_usable_memory = 1;
        return parse_number(arguments, &device->usable_memory) == 0 ? NULL : "usable_memory <bytes>";
    }
    if (strcmp(keyword, "memory_modules_result") == 0)
        return parse_result(arguments, &device->memory_modules_result) == 0 ? NULL : "memory_modules_result <result>";
    if (strcmp(keyword, "memory_state_result") == 0)
        return parse_result(arguments, &device->memory_state_result) == 0 ? NULL : "memory_state_result <result>";
    if (strcmp(keyword, "memory_state_hang") == 0) {
        device->memory_state_hang = 1;
        return NULL;
    }
    if (strcmp(keyword, "processes_result") == 0)
        return parse_result(arguments, &device->processes_result) == 0 ? NULL : "processes_result <result>";
    if (strcmp(keyword, "processes_hang") == 0) {
        device->processes_hang = 1;
        return NULL;
    }
    if (strcmp(keyword, "processes_count_lag") == 0)
        return parse_u32(arguments, &device->processes_count_lag) == 0 ? NULL : "processes_count_lag <number>";
    if (strcmp(keyword, "process") == 0) {
        if (device->process_count == MAX_PROCESSES)
            return "too many processes";
        return parse_process(arguments, &device->processes[device->process_count++]) == 0
            ? NULL : "process <pid> <mem_size> <shared_size> [engines]";
    }
    int handled;
    const char *error = apply_telemetry_directive(device, keyword, arguments, &handled);
    return handled ? error : "unknown directive";
}

static void finish_devices(struct config *config)
{
    for (unsigned i = 0; i < config->device_count; i++) {
        struct device *device = &config->devices[i];
        if (!device->has_uuid)
            default_uuid(device, device->uuid);
    }
}

/* Parses the config file at path; returns a config to free(), or NULL after reporting why on stderr. */
static struct config *parse_config(const char *path)
{
    FILE *file = fopen(path, "r");
    if (file == NULL) {
        fprintf(stderr, "fake_ze: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    struct config *config = calloc(1, sizeof(*config));
    char *line = NULL;
    size_t capacity = 0;
    unsigned line_number = 0;
    const char *error = config == NULL ? "out of memory" : NULL;
    while (error == NULL && getline(&line, &capacity, file) != -1) {
        line_number++;
        line[strcspn(line, "\r\n")] = '\0';
        char *keyword = line + strspn(line, " \t");
        if (*keyword == '\0' || *keyword == '#')
            continue;
        char *arguments = keyword + strcspn(keyword, " \t");
        if (*arguments != '\0')
            *arguments++ = '\0';
        arguments += strspn(arguments, " \t");
        size_t length = strlen(arguments);
        while (length > 0 && (arguments[length - 1] == ' ' || arguments[length - 1] == '\t'))
            arguments[--length] = '\0';
        error = apply_directive(config, keyword, arguments);
    }
    free(line);
    fclose(file);
    if (error != NULL) {
        fprintf(stderr, "fake_ze: %s:%u: %s\n", path, line_number, error);
        free(config);
        return NULL;
    }
    finish_devices(config);
    return config;
}

/*
 * The config of $FAKE_ZE_CONFIG as the file is now: parsed again whenever the file is another one
 * (tests replace it atomically, so a new inode) or was modified, else the last parse. The config
 * belongs to this cache: callers hand it back with release_config(), never free() it.
 */
static struct config *cached_config;
static struct stat cached_stat;

static struct config *load_config(void)
{
    const char *path = getenv("FAKE_ZE_CONFIG");
    if (path == NULL) {
        fprintf(stderr, "fake_ze: FAKE_ZE_CONFIG is not set\n");
        return NULL;
    }
    struct stat now;
    if (stat(path, &now) != 0) {
        fprintf(stderr, "fake_ze: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    if (cached_config != NULL && now.st_dev == cached_stat.st_dev && now.st_ino == cached_stat.st_ino
        && now.st_size == cached_stat.st_size && now.st_mtim.tv_sec == cached_stat.st_mtim.tv_sec
        && now.st_mtim.tv_nsec == cached_stat.st_mtim.tv_nsec)
        return cached_config;
    free(cached_config);
    cached_config = parse_config(path);
    cached_stat = now;
    return cached_config;
}

static void release_config(struct config *config)
{
    (void)config;
}

/* ------------------------------------------------------------------------- */
/* Helpers for the entry points                                              */

static void hang_forever(void)
{
    for (;;)
        pause();
}

static int sysman_requested(void)
{
    const char *value = getenv("ZES_ENABLE_SYSMAN");
    return value != NULL && strcmp(value, "1") == 0;
}

static ze_device_handle_t device_handle(unsigned index)
{
    return (ze_device_handle_t)(uintptr_t)&device_tokens[index];
}

static zes_mem_handle_t memory_handle(unsigned device_index, unsigned module_index)
{
    return (zes_mem_handle_t)(uintptr_t)&memory_tokens[device_index][module_index];
}

/* Finds the device of a handle in the current config. */
static ze_result_t find_device(const struct config *config, const void *handle, const struct device **device)
{
    uintptr_t offset = (uintptr_t)handle - (uintptr_t)device_tokens;
    if (handle == NULL || (uintptr_t)handle < (uintptr_t)device_tokens || offset >= MAX_DEVICES)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (offset >= config->device_count)
        return ZE_RESULT_ERROR_DEVICE_LOST;
    *device = &config->devices[offset];
    return ZE_RESULT_SUCCESS;
}

static ze_result_t find_module(const struct config *config, const void *handle,
                               const struct device **device, const struct memory_module **module)
{
    uintptr_t offset = (uintptr_t)handle - (uintptr_t)memory_tokens;
    if (handle == NULL || (uintptr_t)handle < (uintptr_t)memory_tokens || offset >= MAX_DEVICES * MAX_MODULES)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    unsigned device_index = offset / MAX_MODULES, module_index = offset % MAX_MODULES;
    if (device_index >= config->device_count || module_index >= config->devices[device_index].module_count)
        return ZE_RESULT_ERROR_DEVICE_LOST;
    *device = &config->devices[device_index];
    *module = &(*device)->modules[module_index];
    return ZE_RESULT_SUCCESS;
}

static void *component_handle(enum kind kind, unsigned device_index, unsigned index)
{
    return (void *)(uintptr_t)&component_tokens[kind][device_index][index];
}

/* Finds the component of a handle of the given kind in the current config. */
static ze_result_t find_component(const struct config *config, enum kind kind, const void *handle,
                                  const struct device **device, const struct component **component)
{
    const char *base = &component_tokens[kind][0][0];
    uintptr_t offset = (uintptr_t)handle - (uintptr_t)base;
    if (handle == NULL || (uintptr_t)handle < (uintptr_t)base || offset >= MAX_DEVICES * MAX_COMPONENTS)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    unsigned device_index = offset / MAX_COMPONENTS, index = offset % MAX_COMPONENTS;
    if (device_index >= config->device_count || index >= config->devices[device_index].families[kind].count)
        return ZE_RESULT_ERROR_DEVICE_LOST;
    *device = &config->devices[device_index];
    *component = &(*device)->families[kind].components[index];
    return ZE_RESULT_SUCCESS;
}

static uint64_t now_microseconds(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000u;
}

/* The two-call convention: returns how many entries to fill, updates *count. */
static uint32_t entries_to_fill(uint32_t *count, const void *array, uint32_t available)
{
    if (*count == 0 || array == NULL) {
        *count = available;
        return 0;
    }
    if (*count > available)
        *count = available;
    return *count;
}

static void fill_core_properties(const struct device *device, ze_device_properties_t *properties)
{
    ze_structure_type_t stype = properties->stype;
    void *next = properties->pNext;
    memset(properties, 0, sizeof(*properties));
    properties->stype = stype;
    properties->pNext = next;
    properties->type = (ze_device_type_t)device->device_type;
    properties->vendorId = INTEL_VENDOR_ID;
    properties->deviceId = device->device_id;
    properties->coreClockRate = 2400;
    properties->maxMemAllocSize = UINT64_C(4) << 30;
    properties->maxHardwareContexts = 65536;
    properties->numThreadsPerEU = 8;
    properties->physicalEUSimdWidth = 8;
    properties->numEUsPerSubslice = 16;
    properties->numSubslicesPerSlice = 4;
    properties->numSlices = 8;
    properties->timerResolution = 52;
    properties->timestampValidBits = 64;
    properties->kernelTimestampValidBits = 32;
    memcpy(properties->uuid.id, device->uuid, sizeof(properties->uuid.id));
    copy_text(properties->name, sizeof(properties->name), device->name);
}

/* ------------------------------------------------------------------------- */
/* Core entry points                                                         */

static ze_result_t ZE_APICALL fake_zeInit(ze_init_flags_t flags)
{
    (void)flags;
    struct config *config = load_config();
    if (config == NULL)
        return ZE_RESULT_ERROR_UNKNOWN;
    int hang = config->init_hang;
    ze_result_t result = config->init_result;
    release_config(config);
    if (hang)
        hang_forever();
    if (result == ZE_RESULT_SUCCESS && !sysman_decided) {
        sysman_enabled_at_init = sysman_requested();
        sysman_decided = 1;
    }
    return result;
}

static ze_result_t ZE_APICALL fake_zeDriverGet(uint32_t *count, ze_driver_handle_t *drivers)
{
    if (count == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (entries_to_fill(count, drivers, 1) == 1)
        drivers[0] = (ze_driver_handle_t)(uintptr_t)&driver_token;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL fake_zeDriverGetApiVersion(ze_driver_handle_t driver, ze_api_version_t *version)
{
    if (driver == NULL || version == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    *version = ZE_API_VERSION_CURRENT;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL fake_zeDriverGetProperties(ze_driver_handle_t driver, ze_driver_properties_t *properties)
{
    static const uint8_t driver_uuid[ZE_MAX_DRIVER_UUID_SIZE] = "fake_ze driver";
    if (driver == NULL || properties == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    memcpy(properties->uuid.id, driver_uuid, sizeof(driver_uuid));
    properties->driverVersion = 1;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL fake_zeDriverGetExtensionProperties(ze_driver_handle_t driver, uint32_t *count,
                                                                   ze_driver_extension_properties_t *extensions)
{
    if (driver == NULL || count == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct config *config = load_config();
    if (config == NULL)
        return ZE_RESULT_ERROR_UNKNOWN;
    if (entries_to_fill(count, extensions, config->usable_memory_extension ? 1 : 0) == 1) {
        copy_text(extensions[0].name, sizeof(extensions[0].name), ZE_DEVICE_USABLEMEM_SIZE_PROPERTIES_EXT_NAME);
        extensions[0].version = ZE_MAKE_VERSION(1, 0);
    }
    release_config(config);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL fake_zeDeviceGet(ze_driver_handle_t driver, uint32_t *count, ze_device_handle_t *devices)
{
    if (driver == NULL || count == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct config *config = load_config();
    if (config == NULL)
        return ZE_RESULT_ERROR_UNKNOWN;
    uint32_t filled = entries_to_fill(count, devices, config->device_count);
    for (uint32_t i = 0; i < filled; i++)
        devices[i] = device_handle(i);
    release_config(config);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL fake_zeDeviceGetSubDevices(ze_device_handle_t device, uint32_t *count,
                                                         ze_device_handle_t *subdevices)
{
    (void)subdevices;
    if (device == NULL || count == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    *count = 0;
    return ZE_RESULT_SUCCESS;
}

/* currUsableMemSize: the device modules' free memory less what the core API keeps back, unless configured. */
static uint64_t usable_memory(const struct device *device)
{
    if (device->has_usable_memory)
        return device->usable_memory;
    uint64_t usable = 0;
    for (unsigned i = 0; i < device->module_count; i++) {
        const struct memory_module *module = &device->modules[i];
        uint64_t kept = module->size > module->core_size ? module->size - module->core_size : 0;
        if (module->device_local && module->free > kept)
            usable += module->free - kept;
    }
    return usable;
}

/* Fills the extensions chained to pNext that the driver knows (the usable-memory one when listed). */
static void fill_properties_extensions(const struct config *config, const struct device *device, void *next)
{
    for (ze_base_properties_t *extension = next; extension != NULL; extension = extension->pNext) {
        if (config->usable_memory_extension
            && extension->stype == ZE_STRUCTURE_TYPE_DEVICE_USABLEMEM_SIZE_EXT_PROPERTIES)
            ((ze_device_usablemem_size_ext_properties_t *)extension)->currUsableMemSize = usable_memory(device);
    }
}

static ze_result_t ZE_APICALL fake_zeDeviceGetProperties(ze_device_handle_t handle, ze_device_properties_t *properties)
{
    if (properties == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct config *config = load_config();
    if (config == NULL)
        return ZE_RESULT_ERROR_UNKNOWN;
    const struct device *device = NULL;
    ze_result_t result = find_device(config, handle, &device);
    if (result == ZE_RESULT_SUCCESS) {
        fill_core_properties(device, properties);
        fill_properties_extensions(config, device, properties->pNext);
    }
    release_config(config);
    return result;
}

/* The core API lists only device-local memory, as compute-runtime does. */
static ze_result_t ZE_APICALL fake_zeDeviceGetMemoryProperties(ze_device_handle_t handle, uint32_t *count,
                                                               ze_device_memory_properties_t *properties)
{
    if (count == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct config *config = load_config();
    if (config == NULL)
        return ZE_RESULT_ERROR_UNKNOWN;
    const struct device *device = NULL;
    ze_result_t result = find_device(config, handle, &device);
    if (result == ZE_RESULT_SUCCESS) {
        const struct memory_module *local[MAX_MODULES];
        uint32_t local_count = 0;
        for (unsigned i = 0; i < device->module_count; i++)
            if (device->modules[i].device_local)
                local[local_count++] = &device->modules[i];
        uint32_t filled = entries_to_fill(count, properties, local_count);
        for (uint32_t i = 0; i < filled; i++) {
            properties[i].flags = 0;
            properties[i].maxClockRate = 2000;
            properties[i].maxBusWidth = 256;
            properties[i].totalSize = local[i]->core_size;
            copy_text(properties[i].name, sizeof(properties[i].name), "GDDR6");
        }
    }
    release_config(config);
    return result;
}

/* ------------------------------------------------------------------------- */
/* Sysman entry points                                                       */

static ze_result_t ZE_APICALL fake_zesDeviceGetProperties(zes_device_handle_t handle, zes_device_properties_t *properties)
{
    if (!sysman_enabled_at_init)
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (properties == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct config *config = load_config();
    if (config == NULL)
        return ZE_RESULT_ERROR_UNKNOWN;
    const struct device *device = NULL;
    ze_result_t result = find_device(config, handle, &device);
    if (result == ZE_RESULT_SUCCESS) {
        fill_core_properties(device, &properties->core);
        properties->numSubdevices = 0;
        snprintf(properties->serialNumber, sizeof(properties->serialNumber), "SN-FAKE-%04x%02x%02x%x",
                 device->pci_domain, device->pci_bus, device->pci_device, device->pci_function);
        copy_text(properties->boardNumber, sizeof(properties->boardNumber), "unknown");
        copy_text(properties->brandName, sizeof(properties->brandName), "Intel(R) Corporation");
        copy_text(properties->modelName, sizeof(properties->modelName), device->name);
        copy_text(properties->vendorName, sizeof(properties->vendorName), "Intel(R) Corporation");
        copy_text(properties->driverVersion, sizeof(properties->driverVersion), device->driver_version);
    }
    release_config(config);
    return result;
}

static ze_result_t ZE_APICALL fake_zesDevicePciGetProperties(zes_device_handle_t handle, zes_pci_properties_t *properties)
{
    if (!sysman_enabled_at_init)
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (properties == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct config *config = load_config();
    if (config == NULL)
        return ZE_RESULT_ERROR_UNKNOWN;
    const struct device *device = NULL;
    ze_result_t result = find_device(config, handle, &device);
    if (result == ZE_RESULT_SUCCESS) {
        properties->address.domain = device->pci_domain;
        properties->address.bus = device->pci_bus;
        properties->address.device = device->pci_device;
        properties->address.function = device->pci_function;
        properties->maxSpeed.gen = 4;
        properties->maxSpeed.width = 16;
        properties->maxSpeed.maxBandwidth = INT64_C(31504000000);
        properties->haveBandwidthCounters = 0;
        properties->havePacketCounters = 0;
        properties->haveReplayCounters = 0;
    }
    release_config(config);
    return result;
}

static ze_result_t ZE_APICALL fake_zesDeviceEnumMemoryModules(zes_device_handle_t handle, uint32_t *count,
                                                              zes_mem_handle_t *modules)
{
    if (!sysman_enabled_at_init)
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (count == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct config *config = load_config();
    if (config == NULL)
        return ZE_RESULT_ERROR_UNKNOWN;
    const struct device *device = NULL;
    ze_result_t result = find_device(config, handle, &device);
    if (result == ZE_RESULT_SUCCESS)
        result = device->memory_modules_result;
    if (result == ZE_RESULT_SUCCESS) {
        unsigned device_index = (unsigned)(device - config->devices);
        uint32_t filled = entries_to_fill(count, modules, device->module_count);
        for (uint32_t i = 0; i < filled; i++)
            modules[i] = memory_handle(device_index, i);
    }
    release_config(config);
    return result;
}

/* compute-runtime semantics: a too small array is filled and the call returns INVALID_SIZE. */
static ze_result_t ZE_APICALL fake_zesDeviceProcessesGetState(zes_device_handle_t handle, uint32_t *count,
                                                              zes_process_state_t *processes)
{
    if (!sysman_enabled_at_init)
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (count == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct config *config = load_config();
    if (config == NULL)
        return ZE_RESULT_ERROR_UNKNOWN;
    const struct device *device = NULL;
    ze_result_t result = find_device(config, handle, &device);
    int hang = result == ZE_RESULT_SUCCESS && device->processes_hang;
    if (result == ZE_RESULT_SUCCESS && !hang && device->processes_result != ZE_RESULT_SUCCESS)
        result = device->processes_result;
    if (result == ZE_RESULT_SUCCESS && !hang) {
        uint32_t available = device->process_count;
        if (*count == 0 || processes == NULL) {
            *count = available > device->processes_count_lag ? available - device->processes_count_lag : 0;
        } else {
            if (*count < available)
                result = ZE_RESULT_ERROR_INVALID_SIZE;
            else
                *count = available;
            for (uint32_t i = 0; i < *count; i++) {
                processes[i].processId = device->processes[i].pid;
                processes[i].memSize = device->processes[i].mem_size;
                processes[i].sharedSize = device->processes[i].shared_size;
                processes[i].engines = device->processes[i].engines;
            }
        }
    }
    release_config(config);
    if (hang)
        hang_forever();
    return result;
}

static ze_result_t ZE_APICALL fake_zesMemoryGetProperties(zes_mem_handle_t handle, zes_mem_properties_t *properties)
{
    if (!sysman_enabled_at_init)
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (properties == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct config *config = load_config();
    if (config == NULL)
        return ZE_RESULT_ERROR_UNKNOWN;
    const struct device *device = NULL;
    const struct memory_module *module = NULL;
    ze_result_t result = find_module(config, handle, &device, &module);
    if (result == ZE_RESULT_SUCCESS) {
        properties->type = (zes_mem_type_t)module->type;
        properties->onSubdevice = 0;
        properties->subdeviceId = 0;
        properties->location = module->device_local ? ZES_MEM_LOC_DEVICE : ZES_MEM_LOC_SYSTEM;
        properties->physicalSize = module->physical_size;
        properties->busWidth = module->device_local ? 256 : -1;
        properties->numChannels = -1;
    }
    release_config(config);
    return result;
}

static ze_result_t ZE_APICALL fake_zesMemoryGetState(zes_mem_handle_t handle, zes_mem_state_t *state)
{
    if (!sysman_enabled_at_init)
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (state == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct config *config = load_config();
    if (config == NULL)
        return ZE_RESULT_ERROR_UNKNOWN;
    const struct device *device = NULL;
    const struct memory_module *module = NULL;
    ze_result_t result = find_module(config, handle, &device, &module);
    int hang = result == ZE_RESULT_SUCCESS && device->memory_state_hang;
    if (result == ZE_RESULT_SUCCESS && !hang && device->memory_state_result != ZE_RESULT_SUCCESS)
        result = device->memory_state_result;
    if (result == ZE_RESULT_SUCCESS && !hang) {
        state->health = (zes_mem_health_t)module->health;
        state->free = module->free;
        state->size = module->size;
    }
    release_config(config);
    if (hang)
        hang_forever();
    return result;
}

static ze_result_t ZE_APICALL fake_zesMemoryGetBandwidth(zes_mem_handle_t handle, zes_mem_bandwidth_t *bandwidth)
{
    if (!sysman_enabled_at_init)
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (bandwidth == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct config *config = load_config();
    if (config == NULL)
        return ZE_RESULT_ERROR_UNKNOWN;
    const struct device *device = NULL;
    const struct memory_module *module = NULL;
    ze_result_t result = find_module(config, handle, &device, &module);
    if (result == ZE_RESULT_SUCCESS)
        result = device->memory_bandwidth_result;
    if (result == ZE_RESULT_SUCCESS && !module->has_bandwidth)
        result = ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
    if (result == ZE_RESULT_SUCCESS) {
        bandwidth->readCounter = module->read_bytes;
        bandwidth->writeCounter = module->write_bytes;
        bandwidth->maxBandwidth = module->max_bandwidth;
        bandwidth->timestamp = now_microseconds();
    }
    release_config(config);
    return result;
}

/* ------------------------------------------------------------------------- */
/* Sysman telemetry entry points                                             */

/* zesDeviceEnum<Kind>: the two-call convention over the device's components of a kind. */
static ze_result_t enumerate_components(enum kind kind, zes_device_handle_t handle, uint32_t *count, void **handles)
{
    if (!sysman_enabled_at_init)
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (count == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct config *config = load_config();
    if (config == NULL)
        return ZE_RESULT_ERROR_UNKNOWN;
    const struct device *device = NULL;
    ze_result_t result = find_device(config, handle, &device);
    if (result == ZE_RESULT_SUCCESS)
        result = device->families[kind].enum_result;
    if (result == ZE_RESULT_SUCCESS) {
        unsigned device_index = (unsigned)(device - config->devices);
        uint32_t filled = entries_to_fill(count, handles, device->families[kind].count);
        for (uint32_t i = 0; i < filled; i++)
            handles[i] = component_handle(kind, device_index, i);
    }
    release_config(config);
    return result;
}

/*
 * Looks up a component for a Sysman call: returns the config to free() (NULL on failure, *result set).
 * `reading`: the call reads the component's state, so the kind's read_result applies.
 */
static struct config *component_call(enum kind kind, const void *handle, const void *out, int reading,
                                     const struct component **component, ze_result_t *result)
{
    if (!sysman_enabled_at_init) {
        *result = ZE_RESULT_ERROR_UNINITIALIZED;
        return NULL;
    }
    if (out == NULL) {
        *result = ZE_RESULT_ERROR_INVALID_NULL_POINTER;
        return NULL;
    }
    struct config *config = load_config();
    if (config == NULL) {
        *result = ZE_RESULT_ERROR_UNKNOWN;
        return NULL;
    }
    const struct device *device = NULL;
    *result = find_component(config, kind, handle, &device, component);
    if (*result == ZE_RESULT_SUCCESS && reading)
        *result = device->families[kind].read_result;
    if (*result != ZE_RESULT_SUCCESS) {
        release_config(config);
        return NULL;
    }
    return config;
}

static ze_result_t ZE_APICALL fake_zesDeviceEnumEngineGroups(zes_device_handle_t handle, uint32_t *count,
                                                             zes_engine_handle_t *engines)
{
    return enumerate_components(ENGINES, handle, count, (void **)engines);
}

static ze_result_t ZE_APICALL fake_zesEngineGetProperties(zes_engine_handle_t handle,
                                                          zes_engine_properties_t *properties)
{
    const struct component *engine;
    ze_result_t result;
    struct config *config = component_call(ENGINES, handle, properties, 0, &engine, &result);
    if (config != NULL) {
        properties->type = (zes_engine_group_t)engine->type;
        properties->onSubdevice = (ze_bool_t)engine->on_subdevice;
        properties->subdeviceId = engine->subdevice_id;
        release_config(config);
    }
    return result;
}

static ze_result_t ZE_APICALL fake_zesEngineGetActivity(zes_engine_handle_t handle, zes_engine_stats_t *stats)
{
    const struct component *engine;
    ze_result_t result;
    struct config *config = component_call(ENGINES, handle, stats, 1, &engine, &result);
    if (config != NULL) {
        stats->activeTime = engine->counter;
        stats->timestamp = now_microseconds();
        release_config(config);
    }
    return result;
}

static ze_result_t ZE_APICALL fake_zesDeviceEnumPowerDomains(zes_device_handle_t handle, uint32_t *count,
                                                             zes_pwr_handle_t *domains)
{
    return enumerate_components(POWER, handle, count, (void **)domains);
}

static ze_result_t ZE_APICALL fake_zesDeviceGetCardPowerDomain(zes_device_handle_t handle, zes_pwr_handle_t *domain)
{
    if (!sysman_enabled_at_init)
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (domain == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct config *config = load_config();
    if (config == NULL)
        return ZE_RESULT_ERROR_UNKNOWN;
    const struct device *device = NULL;
    ze_result_t result = find_device(config, handle, &device);
    if (result == ZE_RESULT_SUCCESS)
        result = device->families[POWER].enum_result;
    if (result == ZE_RESULT_SUCCESS) {
        const struct family *power = &device->families[POWER];
        unsigned card = 0;
        while (card < power->count && !power->components[card].card)
            card++;
        if (card == power->count) {
            *domain = NULL;
            result = ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
        } else {
            *domain = component_handle(POWER, (unsigned)(device - config->devices), card);
        }
    }
    release_config(config);
    return result;
}

static ze_result_t ZE_APICALL fake_zesPowerGetProperties(zes_pwr_handle_t handle, zes_power_properties_t *properties)
{
    const struct component *domain;
    ze_result_t result;
    struct config *config = component_call(POWER, handle, properties, 0, &domain, &result);
    if (config != NULL) {
        properties->onSubdevice = (ze_bool_t)domain->on_subdevice;
        properties->subdeviceId = domain->subdevice_id;
        properties->canControl = 0;
        properties->isEnergyThresholdSupported = 0;
        properties->defaultLimit = -1;
        properties->minLimit = -1;
        properties->maxLimit = -1;
        release_config(config);
    }
    return result;
}

static ze_result_t ZE_APICALL fake_zesPowerGetEnergyCounter(zes_pwr_handle_t handle,
                                                            zes_power_energy_counter_t *energy)
{
    const struct component *domain;
    ze_result_t result;
    struct config *config = component_call(POWER, handle, energy, 1, &domain, &result);
    if (config != NULL) {
        energy->energy = domain->counter;
        energy->timestamp = now_microseconds();
        release_config(config);
    }
    return result;
}

static ze_result_t ZE_APICALL fake_zesDeviceEnumTemperatureSensors(zes_device_handle_t handle, uint32_t *count,
                                                                   zes_temp_handle_t *sensors)
{
    return enumerate_components(TEMPERATURE, handle, count, (void **)sensors);
}

static ze_result_t ZE_APICALL fake_zesTemperatureGetProperties(zes_temp_handle_t handle,
                                                               zes_temp_properties_t *properties)
{
    const struct component *sensor;
    ze_result_t result;
    struct config *config = component_call(TEMPERATURE, handle, properties, 0, &sensor, &result);
    if (config != NULL) {
        properties->type = (zes_temp_sensors_t)sensor->type;
        properties->onSubdevice = (ze_bool_t)sensor->on_subdevice;
        properties->subdeviceId = sensor->subdevice_id;
        properties->maxTemperature = 105.0;
        properties->isCriticalTempSupported = 0;
        properties->isThreshold1Supported = 0;
        properties->isThreshold2Supported = 0;
        release_config(config);
    }
    return result;
}

static ze_result_t ZE_APICALL fake_zesTemperatureGetState(zes_temp_handle_t handle, double *temperature)
{
    const struct component *sensor;
    ze_result_t result;
    struct config *config = component_call(TEMPERATURE, handle, temperature, 1, &sensor, &result);
    if (config != NULL) {
        *temperature = sensor->value;
        release_config(config);
    }
    return result;
}

static ze_result_t ZE_APICALL fake_zesDeviceEnumFrequencyDomains(zes_device_handle_t handle, uint32_t *count,
                                                                 zes_freq_handle_t *domains)
{
    return enumerate_components(FREQUENCY, handle, count, (void **)domains);
}

static ze_result_t ZE_APICALL fake_zesFrequencyGetProperties(zes_freq_handle_t handle,
                                                             zes_freq_properties_t *properties)
{
    const struct component *domain;
    ze_result_t result;
    struct config *config = component_call(FREQUENCY, handle, properties, 0, &domain, &result);
    if (config != NULL) {
        properties->type = (zes_freq_domain_t)domain->type;
        properties->onSubdevice = (ze_bool_t)domain->on_subdevice;
        properties->subdeviceId = domain->subdevice_id;
        properties->canControl = 0;
        properties->isThrottleEventSupported = 0;
        properties->min = 300.0;
        properties->max = 2400.0;
        release_config(config);
    }
    return result;
}

static ze_result_t ZE_APICALL fake_zesFrequencyGetState(zes_freq_handle_t handle, zes_freq_state_t *state)
{
    const struct component *domain;
    ze_result_t result;
    struct config *config = component_call(FREQUENCY, handle, state, 1, &domain, &result);
    if (config != NULL) {
        state->currentVoltage = -1.0;
        state->request = domain->value;
        state->tdp = -1.0;
        state->efficient = -1.0;
        state->actual = domain->value;
        state->throttleReasons = domain->throttle;
        release_config(config);
    }
    return result;
}

static ze_result_t ZE_APICALL fake_zesDeviceEnumRasErrorSets(zes_device_handle_t handle, uint32_t *count,
                                                             zes_ras_handle_t *sets)
{
    return enumerate_components(RAS, handle, count, (void **)sets);
}

static ze_result_t ZE_APICALL fake_zesRasGetProperties(zes_ras_handle_t handle, zes_ras_properties_t *properties)
{
    const struct component *set;
    ze_result_t result;
    struct config *config = component_call(RAS, handle, properties, 0, &set, &result);
    if (config != NULL) {
        properties->type = (zes_ras_error_type_t)set->type;
        properties->onSubdevice = (ze_bool_t)set->on_subdevice;
        properties->subdeviceId = set->subdevice_id;
        release_config(config);
    }
    return result;
}

/* A reader must never clear the operator's counters: the fake refuses, loudly. */
static ze_result_t ZE_APICALL fake_zesRasGetState(zes_ras_handle_t handle, ze_bool_t clear, zes_ras_state_t *state)
{
    if (clear) {
        fprintf(stderr, "fake_ze: zesRasGetState was asked to clear the RAS error counters\n");
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    }
    const struct component *set;
    ze_result_t result;
    struct config *config = component_call(RAS, handle, state, 1, &set, &result);
    if (config != NULL) {
        memcpy(state->category, set->categories, sizeof(state->category));
        release_config(config);
    }
    return result;
}

/* ------------------------------------------------------------------------- */
/* The 46 ProcAddrTable getters the 1.8.12 loader requires                   */

/*
 * Honouring `version`: the loader passes the API version whose table layout it
 * allocated (1.8.12: 1.4; newer loaders: larger tables). Every entry filled here
 * exists since 1.0, and tables only grow at the end, so writing these fields
 * one by one is in bounds for any 1.x table. Never assign a whole table struct:
 * that would write past the end of an older, smaller table.
 */
static ze_result_t check_table_request(ze_api_version_t version, const void *table)
{
    if (table == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (ZE_MAJOR_VERSION(version) != 1)
        return ZE_RESULT_ERROR_UNSUPPORTED_VERSION;
    return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL zeGetGlobalProcAddrTable(ze_api_version_t version, ze_global_dditable_t *table)
{
    ze_result_t result = check_table_request(version, table);
    if (result == ZE_RESULT_SUCCESS)
        table->pfnInit = fake_zeInit;
    return result;
}

ze_result_t ZE_APICALL zeGetDriverProcAddrTable(ze_api_version_t version, ze_driver_dditable_t *table)
{
    ze_result_t result = check_table_request(version, table);
    if (result == ZE_RESULT_SUCCESS) {
        table->pfnGet = fake_zeDriverGet;
        table->pfnGetApiVersion = fake_zeDriverGetApiVersion;
        table->pfnGetProperties = fake_zeDriverGetProperties;
        table->pfnGetExtensionProperties = fake_zeDriverGetExtensionProperties;
    }
    return result;
}

ze_result_t ZE_APICALL zeGetDeviceProcAddrTable(ze_api_version_t version, ze_device_dditable_t *table)
{
    ze_result_t result = check_table_request(version, table);
    if (result == ZE_RESULT_SUCCESS) {
        table->pfnGet = fake_zeDeviceGet;
        table->pfnGetSubDevices = fake_zeDeviceGetSubDevices;
        table->pfnGetProperties = fake_zeDeviceGetProperties;
        table->pfnGetMemoryProperties = fake_zeDeviceGetMemoryProperties;
    }
    return result;
}

ze_result_t ZE_APICALL zesGetDeviceProcAddrTable(ze_api_version_t version, zes_device_dditable_t *table)
{
    ze_result_t result = check_table_request(version, table);
    if (result == ZE_RESULT_SUCCESS) {
        table->pfnGetProperties = fake_zesDeviceGetProperties;
        table->pfnPciGetProperties = fake_zesDevicePciGetProperties;
        table->pfnEnumMemoryModules = fake_zesDeviceEnumMemoryModules;
        table->pfnProcessesGetState = fake_zesDeviceProcessesGetState;
        table->pfnEnumEngineGroups = fake_zesDeviceEnumEngineGroups;
        table->pfnEnumPowerDomains = fake_zesDeviceEnumPowerDomains;
        table->pfnGetCardPowerDomain = fake_zesDeviceGetCardPowerDomain;
        table->pfnEnumTemperatureSensors = fake_zesDeviceEnumTemperatureSensors;
        table->pfnEnumFrequencyDomains = fake_zesDeviceEnumFrequencyDomains;
        table->pfnEnumRasErrorSets = fake_zesDeviceEnumRasErrorSets;
    }
    return result;
}

ze_result_t ZE_APICALL zesGetMemoryProcAddrTable(ze_api_version_t version, zes_memory_dditable_t *table)
{
    ze_result_t result = check_table_request(version, table);
    if (result == ZE_RESULT_SUCCESS) {
        table->pfnGetProperties = fake_zesMemoryGetProperties;
        table->pfnGetState = fake_zesMemoryGetState;
        table->pfnGetBandwidth = fake_zesMemoryGetBandwidth;
    }
    return result;
}

ze_result_t ZE_APICALL zesGetEngineProcAddrTable(ze_api_version_t version, zes_engine_dditable_t *table)
{
    ze_result_t result = check_table_request(version, table);
    if (result == ZE_RESULT_SUCCESS) {
        table->pfnGetProperties = fake_zesEngineGetProperties;
        table->pfnGetActivity = fake_zesEngineGetActivity;
    }
    return result;
}

ze_result_t ZE_APICALL zesGetPowerProcAddrTable(ze_api_version_t version, zes_power_dditable_t *table)
{
    ze_result_t result = check_table_request(version, table);
    if (result == ZE_RESULT_SUCCESS) {
        table->pfnGetProperties = fake_zesPowerGetProperties;
        table->pfnGetEnergyCounter = fake_zesPowerGetEnergyCounter;
    }
    return result;
}

ze_result_t ZE_APICALL zesGetTemperatureProcAddrTable(ze_api_version_t version, zes_temperature_dditable_t *table)
{
    ze_result_t result = check_table_request(version, table);
    if (result == ZE_RESULT_SUCCESS) {
        table->pfnGetProperties = fake_zesTemperatureGetProperties;
        table->pfnGetState = fake_zesTemperatureGetState;
    }
    return result;
}

ze_result_t ZE_APICALL zesGetFrequencyProcAddrTable(ze_api_version_t version, zes_frequency_dditable_t *table)
{
    ze_result_t result = check_table_request(version, table);
    if (result == ZE_RESULT_SUCCESS) {
        table->pfnGetProperties = fake_zesFrequencyGetProperties;
        table->pfnGetState = fake_zesFrequencyGetState;
    }
    return result;
}

ze_result_t ZE_APICALL zesGetRasProcAddrTable(ze_api_version_t version, zes_ras_dditable_t *table)
{
    ze_result_t result = check_table_request(version, table);
    if (result == ZE_RESULT_SUCCESS) {
        table->pfnGetProperties = fake_zesRasGetProperties;
        table->pfnGetState = fake_zesRasGetState;
    }
    return result;
}

/* The loader needs these to exist and succeed; their tables stay zeroed (NULL entries). */
#define EMPTY_TABLE_GETTER(getter, table_type)                                          \
    ze_result_t ZE_APICALL getter(ze_api_version_t version, table_type *table)          \
    {                                                                                   \
        return check_table_request(version, table);                                     \
    }

EMPTY_TABLE_GETTER(zeGetContextProcAddrTable, ze_context_dditable_t)
EMPTY_TABLE_GETTER(zeGetCommandQueueProcAddrTable, ze_command_queue_dditable_t)
EMPTY_TABLE_GETTER(zeGetCommandListProcAddrTable, ze_command_list_dditable_t)
EMPTY_TABLE_GETTER(zeGetEventProcAddrTable, ze_event_dditable_t)
EMPTY_TABLE_GETTER(zeGetEventPoolProcAddrTable, ze_event_pool_dditable_t)
EMPTY_TABLE_GETTER(zeGetFenceProcAddrTable, ze_fence_dditable_t)
EMPTY_TABLE_GETTER(zeGetImageProcAddrTable, ze_image_dditable_t)
EMPTY_TABLE_GETTER(zeGetKernelProcAddrTable, ze_kernel_dditable_t)
EMPTY_TABLE_GETTER(zeGetMemProcAddrTable, ze_mem_dditable_t)
EMPTY_TABLE_GETTER(zeGetModuleProcAddrTable, ze_module_dditable_t)
EMPTY_TABLE_GETTER(zeGetModuleBuildLogProcAddrTable, ze_module_build_log_dditable_t)
EMPTY_TABLE_GETTER(zeGetPhysicalMemProcAddrTable, ze_physical_mem_dditable_t)
EMPTY_TABLE_GETTER(zeGetSamplerProcAddrTable, ze_sampler_dditable_t)
EMPTY_TABLE_GETTER(zeGetVirtualMemProcAddrTable, ze_virtual_mem_dditable_t)

EMPTY_TABLE_GETTER(zetGetDeviceProcAddrTable, zet_device_dditable_t)
EMPTY_TABLE_GETTER(zetGetContextProcAddrTable, zet_context_dditable_t)
EMPTY_TABLE_GETTER(zetGetCommandListProcAddrTable, zet_command_list_dditable_t)
EMPTY_TABLE_GETTER(zetGetKernelProcAddrTable, zet_kernel_dditable_t)
EMPTY_TABLE_GETTER(zetGetModuleProcAddrTable, zet_module_dditable_t)
EMPTY_TABLE_GETTER(zetGetDebugProcAddrTable, zet_debug_dditable_t)
EMPTY_TABLE_GETTER(zetGetMetricProcAddrTable, zet_metric_dditable_t)
EMPTY_TABLE_GETTER(zetGetMetricGroupProcAddrTable, zet_metric_group_dditable_t)
EMPTY_TABLE_GETTER(zetGetMetricQueryProcAddrTable, zet_metric_query_dditable_t)
EMPTY_TABLE_GETTER(zetGetMetricQueryPoolProcAddrTable, zet_metric_query_pool_dditable_t)
EMPTY_TABLE_GETTER(zetGetMetricStreamerProcAddrTable, zet_metric_streamer_dditable_t)
EMPTY_TABLE_GETTER(zetGetTracerExpProcAddrTable, zet_tracer_exp_dditable_t)

EMPTY_TABLE_GETTER(zesGetDriverProcAddrTable, zes_driver_dditable_t)
EMPTY_TABLE_GETTER(zesGetDiagnosticsProcAddrTable, zes_diagnostics_dditable_t)
EMPTY_TABLE_GETTER(zesGetFabricPortProcAddrTable, zes_fabric_port_dditable_t)
EMPTY_TABLE_GETTER(zesGetFanProcAddrTable, zes_fan_dditable_t)
EMPTY_TABLE_GETTER(zesGetFirmwareProcAddrTable, zes_firmware_dditable_t)
EMPTY_TABLE_GETTER(zesGetLedProcAddrTable, zes_led_dditable_t)
EMPTY_TABLE_GETTER(zesGetPerformanceFactorProcAddrTable, zes_performance_factor_dditable_t)
EMPTY_TABLE_GETTER(zesGetPsuProcAddrTable, zes_psu_dditable_t)
EMPTY_TABLE_GETTER(zesGetSchedulerProcAddrTable, zes_scheduler_dditable_t)
EMPTY_TABLE_GETTER(zesGetStandbyProcAddrTable, zes_standby_dditable_t)

