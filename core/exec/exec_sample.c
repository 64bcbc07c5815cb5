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

/* Values of a row a block of the argmax takes, at least: a few loads a thread, so that a
 * vocabulary's row is spread over tens of SMs. On an H200, 50257 logits, one block a row
 * against parts of 2048: 8.8 -> 6.0 us at 1 row, 9.3 -> 6.4 at 8 rows, but 9.5 -> 11.0 at 64
 * rows (1600 blocks), hence at most ARGMAX_BLOCKS blocks in all. */
#define ARGMAX_PART 2048
#define ARGMAX_BLOCKS 256

static int argmax_parts(int rows, int64_t vocab) {
    int64_t parts = (vocab + ARGMAX_PART - 1) / ARGMAX_PART, most = ARGMAX_BLOCKS / rows;
    parts = parts < most ? parts : most;
    return parts > 1 ? (int)parts : 1;
}

/* What the kernels' tokens_out needs (sample.cu), checked once for both. */
static int check_tokens(const exec_tokens *to, const char *who, stof_error *err) {
    if (!to || !to->out)
        return err_set(err, STOF_ERR_INVALID, "%s: no output for the tokens", who);
    if (to->positions && !to->live)
        return err_set(err, STOF_ERR_INVALID, "%s: positions advanced without live positions",
                       who);
    if (to->host && (!to->positions || to->host_stride < 1))
        return err_set(err, STOF_ERR_INVALID, "%s: tokens into host memory need positions and a "
                       "stride of at least 1 (%lld)", who, (long long)to->host_stride);
    return STOF_OK;
}

size_t exec_argmax_scratch_bytes(int rows) {
    return rows > 0 ? 12 * (size_t)rows : 0;
}

int exec_argmax_rows(exec_ctx *c, CUdeviceptr logits, stof_dtype dtype, int rows, int64_t vocab,
                     CUdeviceptr scratch, const exec_tokens *to, CUstream st, stof_error *err) {
    if (rows < 1 || vocab < 1 || vocab > INT32_MAX || !logits)
        return err_set(err, STOF_ERR_INVALID, "argmax: %d rows of %lld logits", rows,
                       (long long)vocab);
    CUfunction f;
    int rc = check_tokens(to, "argmax", err);
    if (!rc)
        rc = sample_function(c, dtype, "stof_argmax_rows", &f, err);
    if (rc)
        return rc;
    long long n = (long long)vocab;
    const unsigned parts = scratch ? (unsigned)argmax_parts(rows, vocab) : 1;
    exec_tokens sink = *to; /* the kernel's tokens_out, by value */
    void *params[] = {&logits, &n, &sink, &scratch};
    const unsigned grid[3] = {(unsigned)rows, parts, 1}, block[3] = {256, 1, 1};
    return cuda_launch(c->drv, f, grid, block, 0, st, params, c->gemm->pdl,
                       "cuLaunchKernel(argmax)", err);
}

float exec_sample_mass_unit(int64_t vocab) {
    int bits = 0; /* ceil(log2(vocab)) */
    while (bits < 62 && ((int64_t)1 << bits) < vocab)
        bits++;
    return ldexpf(1.0f, 62 - bits);
}

int exec_sample_rows(exec_ctx *c, CUdeviceptr logits, stof_dtype dtype, int rows, int64_t vocab,
                     const exec_sampling *how, CUdeviceptr u, CUdeviceptr prob,
                     const exec_tokens *to, CUstream st, stof_error *err) {
    if (rows < 1 || vocab < 1 || vocab > INT32_MAX || !logits || !u || !prob)
        return err_set(err, STOF_ERR_INVALID, "sampling: %d rows of %lld logits", rows,
                       (long long)vocab);
    if (!(how->temperature > 0.0f) || how->top_k < 0 || !(how->top_p > 0.0f && how->top_p <= 1.0f))
        return err_set(err, STOF_ERR_INVALID, "sampling: temperature %g (> 0), top_k %d (>= 0), "
                       "top_p %g (in (0, 1])", (double)how->temperature, how->top_k,
                       (double)how->top_p);
    CUfunction f;
    int rc = check_tokens(to, "sampling", err);
    if (!rc)
        rc = sample_function(c, dtype, "stof_sample_rows", &f, err);
    if (rc)
        return rc;
    long long n = (long long)vocab;
    float temperature = how->temperature, top_p = how->top_p;
    int top_k = how->top_k;
    float unit = exec_sample_mass_unit(vocab);
    exec_tokens sink = *to; /* the kernel's tokens_out, by value */
    void *params[] = {&logits, &n, &temperature, &top_k, &top_p, &unit, &u, &prob, &sink};
    const unsigned grid[3] = {(unsigned)rows, 1, 1}, block[3] = {1024, 1, 1};
    return cuda_launch(c->drv, f, grid, block, 0, st, params, c->gemm->pdl,
                       "cuLaunchKernel(sample)", err);
}
