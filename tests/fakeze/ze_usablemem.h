/*
 * The usable-memory core extension of Level Zero spec 1.15 (ze_api.h of loaders from 2025 on), for the
 * older installed headers that lack it. Shared by the fake driver and the binding's layout test.
 */
#ifndef FAKEZE_USABLEMEM_H
#define FAKEZE_USABLEMEM_H

#include <stdint.h>
#include <level_zero/ze_api.h>

#ifndef ZE_DEVICE_USABLEMEM_SIZE_PROPERTIES_EXT_NAME
#define ZE_DEVICE_USABLEMEM_SIZE_PROPERTIES_EXT_NAME "ZE_extension_device_usablemem_size_properties"
#define ZE_STRUCTURE_TYPE_DEVICE_USABLEMEM_SIZE_EXT_PROPERTIES ((ze_structure_type_t)0x00020041)
typedef struct _ze_device_usablemem_size_ext_properties_t {
    ze_structure_type_t stype;
    void *pNext;
    uint64_t currUsableMemSize;
} ze_device_usablemem_size_ext_properties_t;
#endif

#endif
