/* Global tokens of a self-attention (Longformer's) on the GPU: the workspace and kernels of
 * kernels/attention_global.cu around the plan's own kernel. See attention_global_abi.cuh. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/base/error.h"
#include "core/exec/attention/mha_exec_internal.h"
#include "kernels/attention_global_abi.cuh"

static int load_kernels(mha_exec_ctx *c, mha_exec_plan *plan, stof_error *err) {
    mha_exec_request r;
    mha_exec_global_request_init(&r, &plan->problem, c->arch);
    gpu_module *mod;
    /* one module, kept by its request with the first kernel named: the others from it */
    int rc = gpu_ctx_function(c, &r.req, STOF_ATTN_GLOBAL_INDEX_KERNEL, 0, &mod, err);
    if (rc)
        return rc;
    plan->global_index = mod->func;
    if ((rc = cuda_check(c->drv, c->drv->ModuleGetFunction(&plan->global_merge, mod->module,
                                                           STOF_ATTN_GLOBAL_KEYS_KERNEL),
                         "cuModuleGetFunction(" STOF_ATTN_GLOBAL_KEYS_KERNEL ")", err)))
        return rc;
    return cuda_check(c->drv, c->drv->ModuleGetFunction(&plan->global_rows, mod->module,
                                                        STOF_ATTN_GLOBAL_ROWS_KERNEL),
                      "cuModuleGetFunction(" STOF_ATTN_GLOBAL_ROWS_KERNEL ")", err);
}

int mha_global_prepare(mha_exec_ctx *c, mha_exec_plan *plan, const mask *folded,
                       stof_error *err) {
    const mha_exec_problem *p = &plan->problem;
    const size_t index_bytes = sizeof(int32_t) * (size_t)p->batch * ((size_t)p->q_len + 1);
    const size_t lse_bytes = sizeof(float) * (size_t)p->batch * (size_t)p->heads * (size_t)p->q_len;
    const size_t lse_at = (index_bytes + 255) / 256 * 256;
    int rc = cuda_check(c->drv, c->drv->MemAlloc(&plan->d_global_index, lse_at + lse_bytes),
                        "cuMemAlloc(attention: global tokens' index and log-sum-exp)", err);
    if (rc) {
        plan->d_global_index = 0;
        return rc;
    }
    plan->d_lse = plan->d_global_index + lse_at;
    if (plan->config.lse) {
        plan->mask_words = folded->words;
        rc = gpu_ctx_upload(c, &plan->d_mask_bits, folded->bits,
                        sizeof(uint64_t) * (size_t)folded->batch * (size_t)folded->q_len *
                            (size_t)folded->words,
                        err);
    }
    return rc ? rc : load_kernels(c, plan, err);
}

static void fill_args(const mha_exec_plan *plan, const mha_exec_tensors *t,
                      stof_attn_global_args *a) {
    const mha_exec_problem *p = &plan->problem;
    memset(a, 0, sizeof *a);
    a->q = (const void *)(uintptr_t)t->q;
    a->k = (const void *)(uintptr_t)t->k;
    a->v = (const void *)(uintptr_t)t->v;
    a->gq = (const void *)(uintptr_t)t->gq;
    a->gk = (const void *)(uintptr_t)t->gk;
    a->gv = (const void *)(uintptr_t)t->gv;
    a->o = (void *)(uintptr_t)t->o;
    a->lse = (const float *)(uintptr_t)plan->d_lse;
    /* an unpadded plan's sequences are whole, whatever t holds (as its main kernel reads it) */
    a->pad_mask = p->padded ? (const stof_i32 *)(uintptr_t)t->pad_mask : NULL;
    a->global_mask = (const stof_i32 *)(uintptr_t)t->global_mask;
    a->index = (stof_i32 *)(uintptr_t)plan->d_global_index;
    a->mask_bits = (const stof_u64 *)(uintptr_t)plan->d_mask_bits;
    a->seq_start = (const stof_i32 *)(uintptr_t)t->seq_start;
    a->row_stride = t->q_row_stride;
    a->batch_stride = t->q_batch_stride;
    a->o_row_stride = t->o_row_stride;
    a->o_batch_stride = t->o_batch_stride;
    a->q_len = p->q_len;
    a->heads = p->heads;
    a->kv_group = p->heads / mha_exec_kv_heads(p);
    a->words = plan->mask_words;
    a->fmt_batch = plan->fmt_batch;
    a->scale_log2 = p->scale * 1.4426950408889634f;
}

/* The kernels read q, k, v and gq, gk, gv with one set of strides: the layout of one
 * packed [B, S, (H + 2 KVH) D] tensor each. */
int mha_global_check(const mha_exec_plan *plan, const mha_exec_tensors *t, stof_error *err) {
    const mha_exec_problem *p = &plan->problem;
    const int64_t hd = (int64_t)p->heads * p->head_dim;
    const int64_t kvd = (int64_t)mha_exec_kv_heads(p) * p->head_dim;
    const size_t e = stof_dtype_size(p->dtype);
    if (!t->global_mask || t->global_mask % 4)
        return err_set(err, STOF_ERR_INVALID, "attention: the plan takes a global_mask: an int32 "
                       "[batch, seq] device array, 4-byte aligned (given 0x%llx)",
                       (unsigned long long)t->global_mask);
    if (!t->gq || t->gq % 16 || t->k != t->q + (CUdeviceptr)(hd * (int64_t)e) ||
        t->v != t->k + (CUdeviceptr)(kvd * (int64_t)e) ||
        t->gk != t->gq + (CUdeviceptr)(hd * (int64_t)e) ||
        t->gv != t->gk + (CUdeviceptr)(kvd * (int64_t)e) ||
        t->k_row_stride != t->q_row_stride || t->v_row_stride != t->q_row_stride ||
        t->k_batch_stride != t->q_batch_stride || t->v_batch_stride != t->q_batch_stride)
        return err_set(err, STOF_ERR_INVALID, "attention: global tokens need q, k, v (and the "
                       "global projections) packed as one [batch, seq, (H + 2 KVH) D] tensor "
                       "each, 16-byte aligned");
    return STOF_OK;
}

int mha_global_launch(mha_exec_ctx *c, const mha_exec_plan *plan, const mha_exec_tensors *t,
                      CUstream s, stof_error *err) {
    const mha_exec_problem *p = &plan->problem;
    stof_attn_global_args args;
    fill_args(plan, t, &args);
    void *params[] = {&args};
    const unsigned index_grid[3] = {(unsigned)p->batch, 1, 1};
    const unsigned index_block[3] = {STOF_ATTN_GLOBAL_INDEX_THREADS, 1, 1};
    const unsigned merge_block[3] = {STOF_ATTN_GLOBAL_WARPS * 32, 1, 1};
    const unsigned merge_grid[3] = {
        (unsigned)((p->q_len + STOF_ATTN_GLOBAL_ROWS - 1) / STOF_ATTN_GLOBAL_ROWS),
        (unsigned)p->heads, (unsigned)p->batch};
    const unsigned rows_block[3] = {STOF_ATTN_GLOBAL_ROW_WARPS * 32, 1, 1};
    const unsigned rows_grid[3] = {STOF_ATTN_GLOBAL_ROW_BLOCKS, (unsigned)p->heads,
                                   (unsigned)p->batch};
    int rc = cuda_launch(c->drv, plan->global_index, index_grid, index_block, 0, s, params,
                         c->pdl, "cuLaunchKernel(attention: global tokens' index)", err);
    if (!rc && plan->config.lse)
        rc = cuda_launch(c->drv, plan->global_merge, merge_grid, merge_block, 0, s, params,
                         c->pdl, "cuLaunchKernel(attention: global keys)", err);
    if (!rc)
        rc = cuda_launch(c->drv, plan->global_rows, rows_grid, rows_block, 0, s, params, c->pdl,
                         "cuLaunchKernel(attention: global rows)", err);
    return rc;
}
