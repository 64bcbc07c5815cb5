/* One NVRTC compile of an embedded kernel, in this process and without a cache: what a
 * compile is asked (nvrtc_request), and the compile itself. The cache (core/gpu/nvrtc.h) and
 * the worker processes (core/gpu/nvrtc_worker.h) both compile through it. */
#ifndef STOF_CORE_NVRTC_COMPILE_H
#define STOF_CORE_NVRTC_COMPILE_H

#include <stddef.h>

#include "stof.h"

#define NVRTC_MAX_OPTIONS 48

typedef struct nvrtc_request {
    const char *source;  /* file name under kernels/, e.g. "util.cu" */
    const char *arch;    /* "sm_80", "sm_90", "sm_90a" */
    const char *options[NVRTC_MAX_OPTIONS]; /* "-DBLOCK_M=64", ... */
    int n_options;
} nvrtc_request;

/* Compiles req in this process, without any cache (*cubin malloc'ed). Errors carry NVRTC's
 * log. nvrtc_get compiles in a worker process when it can (core/gpu/nvrtc_worker.h) and falls
 * back to this. */
int nvrtc_compile_in_process(const nvrtc_request *req, void **cubin, size_t *size,
                             stof_error *err);

/* "12.9" style NVRTC version, or an error when NVRTC cannot be loaded. */
int nvrtc_version(int *major, int *minor, stof_error *err);

#endif
