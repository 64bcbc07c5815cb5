#include "core/gpu/gpu_ctx.h"

#include <stdlib.h>
#include <string.h>

#include "core/gpu/device.h"
#include "core/base/error.h"

#define GPU_CTX_STATIC_SMEM (48 * 1024) /* more needs the opt-in attribute */

int gpu_device_retain(int ordinal, const cuda_driver **drv, CUdevice *dev, CUcontext *cu,
                      stof_device_info *info, char *arch, size_t arch_cap, stof_error *err) {
    int rc = cuda_driver_get(drv, err);
    if (!rc)
        rc = device_query(ordinal, info, err);
    if (!rc)
        rc = cuda_check(*drv, (*drv)->DeviceGet(dev, ordinal), "cuDeviceGet", err);
    if (!rc)
        rc = cuda_check(*drv, (*drv)->DevicePrimaryCtxRetain(cu, *dev),
                        "cuDevicePrimaryCtxRetain", err);
    if (rc)
        return rc;
    if ((rc = cuda_check(*drv, (*drv)->CtxSetCurrent(*cu), "cuCtxSetCurrent", err))) {
        (*drv)->DevicePrimaryCtxRelease(*dev);
        return rc;
    }
    device_arch_name(info, arch, arch_cap);
    return STOF_OK;
}

int gpu_ctx_create(int ordinal, gpu_ctx **out, stof_error *err) {
    *out = NULL;
    gpu_ctx *c = err_calloc(1, sizeof *c, err);
    if (!c)
        return STOF_ERR_NOMEM;
    int rc = gpu_device_retain(ordinal, &c->drv, &c->dev, &c->cu, &c->info, c->arch,
                               sizeof c->arch, err);
    if (rc) {
        free(c);
        return rc;
    }
    nvrtc_cache_init(&c->nvrtc, NULL);
    /* Hopper and newer start each kernel while the one before it drains
     * (launch latency hidden, ~100 kernels a forward pass at small sizes) */
    const char *pdl = getenv("STOF_PDL");
    c->pdl = c->info.cc_major >= 9 && !(pdl && strcmp(pdl, "0") == 0);
    *out = c;
    return STOF_OK;
}

void gpu_ctx_free(gpu_ctx *c) {
    if (!c)
        return;
    c->drv->CtxSetCurrent(c->cu);
    for (int i = 0; i < c->n_modules; i++)
        c->drv->ModuleUnload(c->modules[i].module);
    free(c->modules);
    nvrtc_cache_free(&c->nvrtc);
    c->drv->DevicePrimaryCtxRelease(c->dev);
    free(c);
}

static gpu_module *find_module(gpu_ctx *c, uint64_t key) {
    for (int i = 0; i < c->n_modules; i++)
        if (c->modules[i].key == key)
            return &c->modules[i];
    return NULL;
}

static int load_module(gpu_ctx *c, const nvrtc_request *req, uint64_t key, const char *name,
                       gpu_module **out, stof_error *err) {
    if (c->n_modules == c->cap_modules) {
        int cap = c->cap_modules ? 2 * c->cap_modules : 16;
        gpu_module *p = err_realloc(c->modules, (size_t)cap * sizeof *p, err);
        if (!p)
            return STOF_ERR_NOMEM;
        c->modules = p;
        c->cap_modules = cap;
    }
    const void *cubin;
    size_t size;
    int rc = nvrtc_get(&c->nvrtc, req, &cubin, &size, err);
    if (rc)
        return rc;
    gpu_module fresh = {.key = key};
    if ((rc = cuda_check(c->drv, c->drv->ModuleLoadData(&fresh.module, cubin),
                         "cuModuleLoadData", err)))
        return rc;
    if ((rc = cuda_check(c->drv, c->drv->ModuleGetFunction(&fresh.func, fresh.module, name),
                         "cuModuleGetFunction", err))) {
        c->drv->ModuleUnload(fresh.module);
        return rc;
    }
    *out = &c->modules[c->n_modules++];
    **out = fresh;
    return STOF_OK;
}

int gpu_ctx_function(gpu_ctx *c, const nvrtc_request *req, const char *name, size_t smem,
                     gpu_module **out, stof_error *err) {
    uint64_t key = nvrtc_key(req);
    gpu_module *m = find_module(c, key);
    int rc;
    if (!m && (rc = load_module(c, req, key, name, &m, err)))
        return rc;
    if (smem > GPU_CTX_STATIC_SMEM && (size_t)m->smem_attr < smem) {
        if ((rc = cuda_check(c->drv,
                             c->drv->FuncSetAttribute(
                                 m->func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem),
                             "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", err)))
            return rc;
        m->smem_attr = (int)smem;
    }
    *out = m;
    return STOF_OK;
}

int gpu_ctx_upload(gpu_ctx *c, CUdeviceptr *d, const void *host, size_t n, stof_error *err) {
    int rc = cuda_check(c->drv, c->drv->MemAlloc(d, n < 16 ? 16 : n), "cuMemAlloc", err);
    if (rc) {
        *d = 0;
        return rc;
    }
    if (n)
        rc = cuda_check(c->drv, c->drv->MemcpyHtoD(*d, host, n), "cuMemcpyHtoD", err);
    return rc;
}
