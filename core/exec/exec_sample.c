/* Tokens on the GPU (kernels/sample.cu): greedy ones, the largest value of each row of logits,
 * and sampled ones, drawn as the host's gen_sample draws them, so that a decode step hands
 * back a token a sequence rather than its whole row. */
#include <math.h>
#include <stdio.h>

#include "core/base/error.h"
#include "core/exec/exec_impl.h"

/* sample.cu built for dtype, its kernel `name`: the module is loaded (once) by its first
 * kernel, which it then holds as its function, so every kernel is looked up by name. */
static int sample_function(exec_ctx *c, stof_dtype dtype, const char *name, CUfunction *f,
                           stof_error *err) {
    if (dtype != STOF_F16 && dtype != STOF_BF16)
        return err_set(err, STOF_ERR_UNSUPPORTED, "%s: logits in fp16 or bf16, not %s", name,
                       stof_dtype_name(dtype));
    char opt[32];
    snprintf(opt, sizeof opt, "-DSTOF_DTYPE=%d", (int)dtype);
    nvrtc_request req = {.source = "sample.cu", .arch = c->gemm->arch, .options = {opt},
                         .n_options = 1};
    gpu_module *m;
    int rc = gpu_ctx_function(c->gemm, &req, "stof_argmax_rows", 0, &m, err);
    if (rc)
        return rc;
    rc = cuda_check(c->drv, c->drv->ModuleGetFunction(f, m->module, name),
                    "cuModuleGetFunction(sample.cu)", err);
    if (rc && err)
        err_prefix(err, "%s: ", name);
    return rc;
}

int exec_argmax_rows(exec_ctx *c, CUdeviceptr logits, stof_dtype dtype, int rows, int64_t vocab,
                     CUdeviceptr out, CUstream st, stof_error *err) {
    if (rows < 1 || vocab < 1 || vocab > INT32_MAX || !logits || !out)
        return err_set(err, STOF_ERR_INVALID, "argmax: %d rows of %lld logits", rows,
                       (long long)vocab);
    CUfunction f;
    int rc = sample_function(c, dtype, "stof_argmax_rows", &f, err);
    if (rc)
        return rc;
    long long n = (long long)vocab;
    void *params[] = {&logits, &n, &out};
    const unsigned grid[3] = {(unsigned)rows, 1, 1}, block[3] = {256, 1, 1};
    return cuda_launch(c->drv, f, grid, block, 0, st, params, 0,
                       "cuLaunchKernel(argmax)", err);
}

float exec_sample_mass_unit(int64_t vocab) {
    int bits = 0; /* ceil(log2(vocab)) */
    while (bits < 62 && ((int64_t)1 << bits) < vocab)
        bits++;
    return ldexpf(1.0f, 62 - bits);
}

int exec_sample_rows(exec_ctx *c, CUdeviceptr logits, stof_dtype dtype, int rows, int64_t vocab,
                     const exec_sampling *how, CUdeviceptr u, CUdeviceptr live, CUdeviceptr prob,
                     CUdeviceptr out, CUstream st, stof_error *err) {
    if (rows < 1 || vocab < 1 || vocab > INT32_MAX || !logits || !u || !prob || !out)
        return err_set(err, STOF_ERR_INVALID, "sampling: %d rows of %lld logits", rows,
                       (long long)vocab);
    if (!(how->temperature > 0.0f) || how->top_k < 0 || !(how->top_p > 0.0f && how->top_p <= 1.0f))
        return err_set(err, STOF_ERR_INVALID, "sampling: temperature %g (> 0), top_k %d (>= 0), "
                       "top_p %g (in (0, 1])", (double)how->temperature, how->top_k,
                       (double)how->top_p);
    CUfunction f;
    int rc = sample_function(c, dtype, "stof_sample_rows", &f, err);
    if (rc)
        return rc;
    long long n = (long long)vocab;
    float temperature = how->temperature, top_p = how->top_p;
    int top_k = how->top_k;
    float unit = exec_sample_mass_unit(vocab);
    void *params[] = {&logits, &n, &temperature, &top_k, &top_p, &unit, &u, &live, &prob, &out};
    const unsigned grid[3] = {(unsigned)rows, 1, 1}, block[3] = {1024, 1, 1};
    return cuda_launch(c->drv, f, grid, block, 0, st, params, 0,
                       "cuLaunchKernel(sample)", err);
}
