/* Greedy tokens on the GPU: the largest value of each row of logits (kernels/sample.cu), so a
 * decode step hands back a token a sequence rather than its whole row. */
#include <stdio.h>

#include "core/base/error.h"
#include "core/exec/exec_impl.h"

int exec_argmax_rows(exec_ctx *c, CUdeviceptr logits, stof_dtype dtype, int rows, int64_t vocab,
                     CUdeviceptr out, CUstream st, stof_error *err) {
    if (dtype != STOF_F16 && dtype != STOF_BF16)
        return err_set(err, STOF_ERR_UNSUPPORTED, "argmax: logits in fp16 or bf16, not %s",
                       stof_dtype_name(dtype));
    if (rows < 1 || vocab < 1 || vocab > INT32_MAX || !logits || !out)
        return err_set(err, STOF_ERR_INVALID, "argmax: %d rows of %lld logits", rows,
                       (long long)vocab);
    char opt[32];
    snprintf(opt, sizeof opt, "-DSTOF_DTYPE=%d", (int)dtype);
    nvrtc_request req = {.source = "sample.cu", .arch = c->gemm->arch, .options = {opt},
                         .n_options = 1};
    gpu_module *m;
    int rc = gpu_ctx_function(c->gemm, &req, "stof_argmax_rows", 0, &m, err);
    if (rc)
        return rc;
    long long n = (long long)vocab;
    void *params[] = {&logits, &n, &out};
    const unsigned grid[3] = {(unsigned)rows, 1, 1}, block[3] = {256, 1, 1};
    return cuda_launch(c->drv, m->func, grid, block, 0, st, params, 0,
                       "cuLaunchKernel(argmax)", err);
}
