/* What the GPU kernel tests share: the recap of failures, fp16/bf16 bits,
 * and device buffers (poisoned with NaN before a launch).
 *
 * Include it once, after defining GPU_CTX_TYPE (the planner's context type:
 * gemm_exec_ctx, mha_exec_ctx, cublaslt_exec_ctx) and including that
 * planner's header. Everything is static inline: a test uses what it needs.
 * gpu_gemm_common.h adds what the GEMM tests share. */
#ifndef STOF_TESTS_GPU_COMMON_H
#define STOF_TESTS_GPU_COMMON_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/gpu/cuda_driver.h"
#include "core/base/util.h"
#include "gpu_recap.h"

#ifndef GPU_CTX_TYPE
#error "define GPU_CTX_TYPE before including gpu_common.h"
#endif

#define NAN_BITS 0x7fff /* a NaN in fp16 and in bf16 */

/* ---- values ------------------------------------------------------------------------- */

static inline uint16_t to_bits(stof_dtype t, float x) {
    return t == STOF_BF16 ? util_f32_to_bf16(x) : util_f32_to_f16(x);
}

static inline float from_bits(stof_dtype t, uint16_t b) {
    return t == STOF_BF16 ? util_bf16_to_f32(b) : util_f16_to_f32(b);
}

/* qsort's order of floats, for the medians of timed runs. */
static inline int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* ---- the GPU ------------------------------------------------------------------------- */

typedef struct gpu {
    GPU_CTX_TYPE *ctx;
    const cuda_driver *drv;
    int dead; /* a sticky CUDA error: the context is unusable */
} gpu;

static inline int check_cu(gpu *g, CUresult r, const char *what) {
    if (r == CUDA_SUCCESS)
        return 0;
    const char *name = NULL;
    g->drv->GetErrorName(r, &name);
    fprintf(stderr, "CUDA error in %s: %s\n", what, name ? name : "?");
    CHECK_MSG(0, "%s: %s", what, name ? name : "?");
    if (r != CUDA_ERROR_OUT_OF_MEMORY && r != CUDA_ERROR_INVALID_VALUE)
        g->dead = 1;
    return -1;
}

static inline int dalloc(gpu *g, CUdeviceptr *d, size_t bytes) {
    *d = 0;
    return check_cu(g, g->drv->MemAlloc(d, bytes), "cuMemAlloc");
}

static inline int upload(gpu *g, CUdeviceptr *d, const void *h, size_t bytes) {
    if (dalloc(g, d, bytes))
        return -1;
    return check_cu(g, g->drv->MemcpyHtoD(*d, h, bytes), "cuMemcpyHtoD");
}

static inline void dfree(gpu *g, CUdeviceptr *d) {
    if (*d)
        g->drv->MemFree(*d);
    *d = 0;
}

static inline int poison(gpu *g, CUdeviceptr d, size_t elems) {
    return check_cu(g, g->drv->MemsetD16Async(d, NAN_BITS, elems, 0), "cuMemsetD16Async");
}

/* Waits for the launches and copies elems 16-bit values back. */
static inline int fetch(gpu *g, uint16_t *h, CUdeviceptr d, size_t elems) {
    if (check_cu(g, g->drv->StreamSynchronize(0), "cuStreamSynchronize (after the launch)"))
        return -1;
    return check_cu(g, g->drv->MemcpyDtoH(h, d, elems * 2), "cuMemcpyDtoH");
}

#endif
