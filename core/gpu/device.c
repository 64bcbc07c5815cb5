#include "core/gpu/device.h"

#include <stdio.h>
#include <string.h>

#include "core/gpu/cuda_driver.h"
#include "core/base/error.h"

int device_count(int *n, stof_error *err) {
    const cuda_driver *drv;
    int rc = cuda_driver_get(&drv, err);
    if (rc)
        return rc;
    *n = 0;
    if ((rc = cuda_check(drv, drv->DeviceGetCount(n), "cuDeviceGetCount", err)))
        return rc;
    if (*n == 0)
        return err_set(err, STOF_ERR_NO_DEVICE, "the NVIDIA driver reports no GPU");
    return STOF_OK;
}

static int attribute(const cuda_driver *drv, CUdevice dev, CUdevice_attribute a, int *v,
                     stof_error *err) {
    return cuda_check(drv, drv->DeviceGetAttribute(v, a, dev), "cuDeviceGetAttribute", err);
}

int device_query(int ordinal, stof_device_info *info, stof_error *err) {
    int n, rc = device_count(&n, err);
    if (rc)
        return rc;
    if (ordinal < 0 || ordinal >= n)
        return err_set(err, STOF_ERR_INVALID, "GPU %d does not exist (this machine has %d)",
                       ordinal, n);
    const cuda_driver *drv;
    cuda_driver_get(&drv, err);
    CUdevice dev;
    if ((rc = cuda_check(drv, drv->DeviceGet(&dev, ordinal), "cuDeviceGet", err)))
        return rc;
    memset(info, 0, sizeof *info);
    info->ordinal = ordinal;
    if ((rc = cuda_check(drv, drv->DeviceGetName(info->name, sizeof info->name, dev),
                         "cuDeviceGetName", err)))
        return rc;
    int threads_per_sm = 0;
    struct { CUdevice_attribute a; int *v; } attrs[] = {
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &info->cc_major},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &info->cc_minor},
        {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &info->sm_count},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, &info->smem_per_sm},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &info->smem_per_block_optin},
        {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, &threads_per_sm},
        {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, &info->regs_per_sm},
        {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, &info->l2_bytes},
    };
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++)
        if ((rc = attribute(drv, dev, attrs[i].a, attrs[i].v, err)))
            return rc;
    info->max_warps_per_sm = threads_per_sm / 32;
    return cuda_check(drv, drv->DeviceTotalMem(&info->total_mem, dev), "cuDeviceTotalMem", err);
}

void device_arch_name(const stof_device_info *info, char *buf, size_t n) {
    snprintf(buf, n, "sm_%d%d", info->cc_major, info->cc_minor);
}

int device_wgmma_arch(const char *arch) {
    return arch && strcmp(arch, "sm_90") == 0;
}

int device_tma_arch(const char *arch) {
    int cc = 0;
    char rest = 0;
    return arch && sscanf(arch, "sm_%d%c", &cc, &rest) == 1 && cc >= 90;
}
