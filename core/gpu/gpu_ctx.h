/* A GPU context for the kernel planners: the device's primary context, its
 * properties, the NVRTC cache and the modules loaded into the context (one
 * per compiled request, loaded once). Shared by the attention and GEMM
 * planners so each does not keep its own copy of this bookkeeping. */
#ifndef STOF_CORE_GPU_CTX_H
#define STOF_CORE_GPU_CTX_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#include "core/gpu/cuda_driver.h"
#include "core/gpu/nvrtc.h"
#include "stof.h"

typedef struct gpu_module {
    uint64_t key;    /* nvrtc_key of the request */
    CUmodule module;
    CUfunction func; /* the kernel named when it was loaded */
    int smem_attr;   /* MAX_DYNAMIC_SHARED_SIZE_BYTES already set to this */
} gpu_module;

typedef struct gpu_ctx {
    const cuda_driver *drv;
    CUdevice dev;
    CUcontext cu;        /* the device's primary context (retained) */
    stof_device_info info;
    char arch[16];       /* "sm_90" */
    nvrtc_cache nvrtc;   /* $STOF_CACHE_DIR or ~/.cache/stof on disk */
    int pdl;             /* launch kernels as programmatic dependent launches: sm_90+
                            unless STOF_PDL=0 (cuda_launch) */
    gpu_module *modules;
    int n_modules, cap_modules;
} gpu_ctx;

/* What every GPU context starts from: the driver, device `ordinal`, its
 * primary context retained and made current, its properties and arch name
 * ("sm_90"). STOF_ERR_NO_DEVICE (with the driver's reason) without a GPU;
 * on failure nothing stays retained. Undone by DevicePrimaryCtxRelease. */
int gpu_device_retain(int ordinal, const cuda_driver **drv, CUdevice *dev, CUcontext *cu,
                      stof_device_info *info, char *arch, size_t arch_cap, stof_error *err);

/* Allocates a context for GPU ordinal and makes its primary context
 * current. STOF_ERR_NO_DEVICE (with the driver's reason) without a GPU. */
int gpu_ctx_create(int ordinal, gpu_ctx **out, stof_error *err);
/* Unloads every module and releases the primary context. NULL is fine. */
void gpu_ctx_free(gpu_ctx *c);

/* The module of req with its kernel `name`: compiled (or found in the NVRTC
 * cache) and loaded once per context; dynamic shared memory above the
 * static 48 KiB is allowed up to smem. *out stays owned by the context. */
int gpu_ctx_function(gpu_ctx *c, const nvrtc_request *req, const char *name, size_t smem,
                     gpu_module **out, stof_error *err);

/* A device copy of n host bytes (at least 16 allocated, so that an empty array is a valid
 * pointer), synchronous; *d is 0 on failure. */
int gpu_ctx_upload(gpu_ctx *c, CUdeviceptr *d, const void *host, size_t n, stof_error *err);

#endif
