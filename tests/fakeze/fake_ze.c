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
 * The config file is read again on every call, so a test changes the driver's
 * behaviour mid-run by atomically replacing the file (write a temporary file,
 * rename it over the old one). A missing or malformed file makes every call
 * print the reason on stderr and return ZE_RESULT_ERROR_UNKNOWN.
 *
 * CONFIG FORMAT: one directive per line, words separated by blanks. Blank lines
 * and lines starting with '#' are ignored. Numbers are decimal or 0x-hex.
 * <result> is a ze_result_t name (ZE_RESULT_ERROR_DEVICE_LOST) or number (0x70000001).
 *
 *   Global directives, before the first `device` line:
 *     init_result <result>      what zeInit returns (default ZE_RESULT_SUCCESS)
 *     init_hang                 zeInit never returns
 *
 *   `device <dddd:bb:dd.f>` starts a device (at most 8); the lines after it describe it:
 *     name <text>               core device name, rest of the line (default "Intel(R) Graphics (FAKE)")
 *     uuid <32 hex digits>      '-' allowed anywhere; default: see default_uuid() below
 *     driver_version <text>     zes_device_properties_t.driverVersion, rest of the line (default "1.3.0-fake")
 *     device_id <n>             PCI device id (default 0x56a0)
 *     device_type <n>           core ze_device_type_t (default 1, GPU; 2 is CPU)
 *     memory <device|system> <size> <free> [physical_size=<n>] [health=<n>] [type=<n>]
 *                               a memory module (at most 8): <size> and <free> are what
 *                               zesMemoryGetState reports; physical_size (default <size>) is
 *                               zes_mem_properties_t.physicalSize; health a zes_mem_health_t
 *                               (default 1, OK); type a zes_mem_type_t (default GDDR6 for
 *                               device memory, DDR for system memory)
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
 * device i), so a handle keeps meaning "device i" across config changes; a
 * handle whose device vanished from the config gets ZE_RESULT_ERROR_DEVICE_LOST.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <level_zero/ze_ddi.h>
#include <level_zero/zes_ddi.h>
#include <level_zero/zet_ddi.h>

#define MAX_DEVICES 8
#define MAX_MODULES 8
#define MAX_PROCESSES 1024
#define INTEL_VENDOR_ID 0x8086

struct memory_module {
    int device_local;
    uint64_t size;
    uint64_t free;
    uint64_t physical_size;
    uint32_t health;
    uint32_t type;
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
};

struct config {
    ze_result_t init_result;
    int init_hang;
    unsigned device_count;
    struct device devices[MAX_DEVICES];
};

/* Handles: distinct addresses that encode an index and never change. */
static const char driver_token;
static const char device_tokens[MAX_DEVICES];
static const char memory_tokens[MAX_DEVICES][MAX_MODULES];

/*
 * compute-runtime decides once, at the first successful zeInit of the process, whether
 * Sysman is on (later zeInit calls reach the driver again but change nothing); so does
 * the fake. This is the only state the fake keeps between calls.
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
        else if (strcmp(option, "health") == 0)
            status = parse_u32(value, &module->health);
        else if (strcmp(option, "type") == 0)
            status = parse_u32(value, &module->type);
        else
            status = -1;
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
}

/* Applies one directive; returns an error message or NULL. */
static const char *apply_directive(struct config *config, const char *keyword, char *arguments)
{
    struct device *device = config->device_count > 0 ? &config->devices[config->device_count - 1] : NULL;

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
    return "unknown directive";
}

static void finish_devices(struct config *config)
{
    for (unsigned i = 0; i < config->device_count; i++) {
        struct device *device = &config->devices[i];
        if (!device->has_uuid)
            default_uuid(device, device->uuid);
    }
}

/* Reads $FAKE_ZE_CONFIG; returns a config to free(), or NULL after reporting why on stderr. */
static struct config *load_config(void)
{
    const char *path = getenv("FAKE_ZE_CONFIG");
    if (path == NULL) {
        fprintf(stderr, "fake_ze: FAKE_ZE_CONFIG is not set\n");
        return NULL;
    }
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
    free(config);
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
    free(config);
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

static ze_result_t ZE_APICALL fake_zeDeviceGetProperties(ze_device_handle_t handle, ze_device_properties_t *properties)
{
    if (properties == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct config *config = load_config();
    if (config == NULL)
        return ZE_RESULT_ERROR_UNKNOWN;
    const struct device *device = NULL;
    ze_result_t result = find_device(config, handle, &device);
    if (result == ZE_RESULT_SUCCESS)
        fill_core_properties(device, properties);
    free(config);
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
            properties[i].totalSize = local[i]->physical_size;
            copy_text(properties[i].name, sizeof(properties[i].name), "GDDR6");
        }
    }
    free(config);
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
    free(config);
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
    free(config);
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
    free(config);
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
    free(config);
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
    free(config);
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
    free(config);
    if (hang)
        hang_forever();
    return result;
}

static ze_result_t ZE_APICALL fake_zesMemoryGetBandwidth(zes_mem_handle_t handle, zes_mem_bandwidth_t *bandwidth)
{
    (void)handle;
    (void)bandwidth;
    if (!sysman_enabled_at_init)
        return ZE_RESULT_ERROR_UNINITIALIZED;
    return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
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
EMPTY_TABLE_GETTER(zesGetEngineProcAddrTable, zes_engine_dditable_t)
EMPTY_TABLE_GETTER(zesGetFabricPortProcAddrTable, zes_fabric_port_dditable_t)
EMPTY_TABLE_GETTER(zesGetFanProcAddrTable, zes_fan_dditable_t)
EMPTY_TABLE_GETTER(zesGetFirmwareProcAddrTable, zes_firmware_dditable_t)
EMPTY_TABLE_GETTER(zesGetFrequencyProcAddrTable, zes_frequency_dditable_t)
EMPTY_TABLE_GETTER(zesGetLedProcAddrTable, zes_led_dditable_t)
EMPTY_TABLE_GETTER(zesGetPerformanceFactorProcAddrTable, zes_performance_factor_dditable_t)
EMPTY_TABLE_GETTER(zesGetPowerProcAddrTable, zes_power_dditable_t)
EMPTY_TABLE_GETTER(zesGetPsuProcAddrTable, zes_psu_dditable_t)
EMPTY_TABLE_GETTER(zesGetRasProcAddrTable, zes_ras_dditable_t)
EMPTY_TABLE_GETTER(zesGetSchedulerProcAddrTable, zes_scheduler_dditable_t)
EMPTY_TABLE_GETTER(zesGetStandbyProcAddrTable, zes_standby_dditable_t)
EMPTY_TABLE_GETTER(zesGetTemperatureProcAddrTable, zes_temperature_dditable_t)
