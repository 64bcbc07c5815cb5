/* A model's device memory as the executor's rooms share it: allocations that say what they
 * were for when the GPU is out of memory, and an attention_mask input read back and checked.
 * See exec_impl.h. */
#include <stdio.h>

#include "core/base/error.h"
#include "core/exec/exec_impl.h"
#include "core/io/weights.h"

int exec_device_alloc(exec_ctx *c, CUdeviceptr *d, size_t bytes, const char *what,
                      stof_error *err) {
    *d = 0;
    if (bytes == 0)
        return STOF_OK;
    int rc = cuda_check(c->drv, c->drv->MemAlloc(d, bytes), "cuMemAlloc", err);
    if (rc) {
        *d = 0;
        size_t free_b = 0, total_b = 0;
        char have[96] = "";
        if (c->drv->MemGetInfo(&free_b, &total_b) == CUDA_SUCCESS)
            snprintf(have, sizeof have, " (%.1f MiB of %.1f MiB free)", free_b / 1048576.0,
                     total_b / 1048576.0);
        err_prefix(err, "%s of %zu bytes (%.1f MiB)%s: ", what, bytes, bytes / 1048576.0, have);
    }
    return rc;
}

int exec_read_input_mask(exec_model *m, int t, int32_t *host, stof_error *err) {
    const graph_tensor *x = &m->plan->g->tensors[t];
    int rc = cuda_check(m->ctx->drv,
                        m->ctx->drv->MemcpyDtoH(host, m->ptr[t], graph_tensor_bytes(x)),
                        "cuMemcpyDtoH(attention_mask)", err);
    return rc ? rc : weights_check_input_mask(x, host, err);
}
