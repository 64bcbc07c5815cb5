#include "core/gpu/cuda_driver.h"

#include <dlfcn.h>
#include <stdio.h>
#include <pthread.h>
#include <string.h>

#include "core/base/error.h"

/* The driver is one per process, as the CUDA runtime's is: loaded once under
 * pthread_once and read-only afterwards. */
static cuda_driver g_driver;
static int g_status = STOF_ERR_NO_DEVICE;
static char g_reason[512];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

static int resolve_all(void *lib) {
    get_proc_fn get_proc = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
    if (!get_proc) {
        snprintf(g_reason, sizeof g_reason,
                 "the NVIDIA driver is too old: cuGetProcAddress_v2 is missing (CUDA %d.%d "
                 "or newer is needed)", CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
        return STOF_ERR_NO_DEVICE;
    }
#define CUDA_DRIVER_RESOLVE(field, sym, decl)                                           \
    {                                                                                   \
        void *p = NULL;                                                                 \
        CUdriverProcAddressQueryResult q;                                               \
        if (get_proc(sym, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS \
            || !p) {                                                                    \
            snprintf(g_reason, sizeof g_reason,                                         \
                     "the NVIDIA driver does not provide %s for CUDA %d", sym, CUDA_VERSION); \
            return STOF_ERR_NO_DEVICE;                                                  \
        }                                                                               \
        memcpy(&g_driver.field, &p, sizeof p);                                          \
    }
    CUDA_DRIVER_FUNCS(CUDA_DRIVER_RESOLVE)
#undef CUDA_DRIVER_RESOLVE
    return STOF_OK;
}

static void load_driver(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(g_reason, sizeof g_reason,
                 "no NVIDIA driver on this machine (libcuda.so.1 could not be opened)");
        return;
    }
    if (resolve_all(lib) != STOF_OK) {
        dlclose(lib);
        return;
    }
    CUresult rc = g_driver.Init(0);
    if (rc != CUDA_SUCCESS) {
        const char *name = NULL;
        g_driver.GetErrorName(rc, &name);
        snprintf(g_reason, sizeof g_reason, "the NVIDIA driver found no usable GPU (cuInit: %s)",
                 name ? name : "unknown error");
        return;
    }
    g_driver.DriverGetVersion(&g_driver.version);
    g_status = STOF_OK;
}

int cuda_driver_get(const cuda_driver **out, stof_error *err) {
    pthread_once(&g_once, load_driver);
    if (g_status != STOF_OK) {
        *out = NULL;
        return err_set(err, g_status, "%s", g_reason);
    }
    *out = &g_driver;
    return STOF_OK;
}

int cuda_check(const cuda_driver *drv, CUresult rc, const char *what, stof_error *err) {
    if (rc == CUDA_SUCCESS)
        return STOF_OK;
    const char *name = NULL, *text = NULL;
    if (drv) {
        drv->GetErrorName(rc, &name);
        drv->GetErrorString(rc, &text);
    }
    int code = rc == CUDA_ERROR_OUT_OF_MEMORY ? STOF_ERR_DEVICE_OOM : STOF_ERR_CUDA;
    return err_set(err, code, "%s failed: %s (%s)", what, name ? name : "?", text ? text : "?");
}

int cuda_launch(const cuda_driver *drv, CUfunction f, const unsigned *grid, const unsigned *block,
                unsigned smem, CUstream s, void **params, int pdl, const char *what,
                stof_error *err) {
    return cuda_launch_cluster(drv, f, grid, block, smem, s, params, pdl, 1, what, err);
}

int cuda_launch_cluster(const cuda_driver *drv, CUfunction f, const unsigned *grid,
                        const unsigned *block, unsigned smem, CUstream s, void **params, int pdl,
                        unsigned cluster_x, const char *what, stof_error *err) {
    if (!pdl && cluster_x <= 1)
        return cuda_check(drv,
                          drv->LaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1],
                                            block[2], smem, s, params, NULL),
                          what, err);
    CUlaunchAttribute attr[2];
    unsigned n_attrs = 0;
    memset(attr, 0, sizeof attr);
    if (pdl) {
        attr[n_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr[n_attrs++].value.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_x > 1) {
        attr[n_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attr[n_attrs].value.clusterDim.x = cluster_x;
        attr[n_attrs].value.clusterDim.y = 1;
        attr[n_attrs++].value.clusterDim.z = 1;
    }
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = grid[0];
    cfg.gridDimY = grid[1];
    cfg.gridDimZ = grid[2];
    cfg.blockDimX = block[0];
    cfg.blockDimY = block[1];
    cfg.blockDimZ = block[2];
    cfg.sharedMemBytes = smem;
    cfg.hStream = s;
    cfg.attrs = attr;
    cfg.numAttrs = n_attrs;
    return cuda_check(drv, drv->LaunchKernelEx(&cfg, f, params, NULL), what, err);
}
