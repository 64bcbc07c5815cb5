/* Launching an attention plan: tensors, the argument block, the TMA maps
 * and the launches (kernel, then the split rows' combine). See mha_exec.h. */
#include "core/exec/attention/mha_exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/exec/attention/mha_exec_internal.h"
#include "core/gpu/device.h"
#include "core/base/error.h"
#include "core/base/util.h"
#include "ops/ops.h"

/* ---- launching ------------------------------------------------------------------------ */

void mha_exec_tensors_packed(mha_exec_tensors *t, CUdeviceptr qkv, CUdeviceptr o,
                             const mha_exec_problem *p, size_t elem_bytes) {
    int64_t hd = (int64_t)p->heads * p->head_dim;
    int64_t kvd = (int64_t)mha_exec_kv_heads(p) * p->head_dim, width = hd + 2 * kvd;
    memset(t, 0, sizeof *t);
    t->q = qkv;
    t->k = qkv + (CUdeviceptr)(hd * (int64_t)elem_bytes);
    t->v = qkv + (CUdeviceptr)((hd + kvd) * (int64_t)elem_bytes);
    t->o = o;
    t->q_row_stride = t->k_row_stride = t->v_row_stride = width;
    t->q_batch_stride = t->k_batch_stride = t->v_batch_stride = width * p->q_len;
    t->o_row_stride = hd;
    t->o_batch_stride = hd * p->q_len;
}

void mha_exec_tensors_ragged(mha_exec_tensors *t, CUdeviceptr seq_start, int64_t rows) {
    t->q_batch_stride = t->k_batch_stride = t->v_batch_stride = t->o_batch_stride = 0;
    t->seq_start = seq_start;
    t->ragged_rows = rows;
}

void mha_exec_tensors_global(mha_exec_tensors *t, CUdeviceptr global_mask, CUdeviceptr gqkv,
                             const mha_exec_problem *p, size_t elem_bytes) {
    mha_exec_tensors g;
    mha_exec_tensors_packed(&g, gqkv, t->o, p, elem_bytes);
    t->global_mask = global_mask;
    t->gq = g.q;
    t->gk = g.k;
    t->gv = g.v;
}

void mha_exec_tensors_cross(mha_exec_tensors *t, CUdeviceptr q, CUdeviceptr kv, CUdeviceptr o,
                            const mha_exec_problem *p, size_t elem_bytes) {
    int64_t hd = (int64_t)p->heads * p->head_dim;
    int64_t kvd = (int64_t)mha_exec_kv_heads(p) * p->head_dim;
    memset(t, 0, sizeof *t);
    t->q = q;
    t->k = kv;
    t->v = kv + (CUdeviceptr)(kvd * (int64_t)elem_bytes);
    t->o = o;
    t->q_row_stride = hd;
    t->q_batch_stride = hd * p->q_len;
    t->k_row_stride = t->v_row_stride = 2 * kvd;
    t->k_batch_stride = t->v_batch_stride = 2 * kvd * p->k_len;
    t->o_row_stride = hd;
    t->o_batch_stride = hd * p->q_len;
}

void mha_exec_fill_args(const mha_exec_plan *plan, const mha_exec_tensors *t,
                        stof_attn_args *a) {
    const mha_exec_problem *p = &plan->problem;
    memset(a, 0, sizeof *a);
    a->q = (const void *)(uintptr_t)t->q;
    a->k = (const void *)(uintptr_t)t->k;
    a->v = (const void *)(uintptr_t)t->v;
    a->o = (void *)(uintptr_t)t->o;
    a->q_batch_stride = t->q_batch_stride;
    a->q_row_stride = t->q_row_stride;
    a->k_batch_stride = t->k_batch_stride;
    a->k_row_stride = t->k_row_stride;
    a->v_batch_stride = t->v_batch_stride;
    a->v_row_stride = t->v_row_stride;
    a->o_batch_stride = t->o_batch_stride;
    a->o_row_stride = t->o_row_stride;
    if (plan->config.kernel == MHA_KERNEL_BLOCK_WISE) {
        a->load_row_ptr = (const stof_i32 *)(uintptr_t)plan->d_row_ptr;
        a->load_col_idx = (const stof_i32 *)(uintptr_t)plan->d_col_idx;
        a->load_mask_idx = (const stof_i32 *)(uintptr_t)plan->d_mask_idx;
        a->part_masks = (const stof_u32 *)(uintptr_t)plan->d_bitmaps;
        if (plan->config.split) {
            a->work_ptr = (const stof_i32 *)(uintptr_t)plan->d_work_ptr;
            a->work = (const stof_attn_work *)(uintptr_t)plan->d_work;
            a->split_ptr = (const stof_i32 *)(uintptr_t)plan->d_split_ptr;
            a->splits = (const stof_attn_split *)(uintptr_t)plan->d_splits;
            a->partial_o = (float *)(uintptr_t)plan->d_workspace;
            a->partial_ml = (float *)(uintptr_t)(plan->d_workspace + plan->workspace_ml_offset);
            a->n_slots = plan->split_slots;
        }
    } else {
        a->row_ptr = (const stof_i64 *)(uintptr_t)plan->d_row_ptr;
        a->col_idx = (const stof_i32 *)(uintptr_t)plan->d_col_idx;
    }
    a->relpos_table = (const void *)(uintptr_t)t->relpos_table;
    a->pad_mask = (const stof_i32 *)(uintptr_t)t->pad_mask;
    a->seq_start = (const stof_i32 *)(uintptr_t)t->seq_start;
    a->lse = plan->config.lse ? (float *)(uintptr_t)plan->d_lse : NULL;
    a->relpos_bucket = (const stof_i32 *)(uintptr_t)plan->d_relpos_bucket;
    a->q_len = p->q_len;
    a->k_len = p->k_len;
    a->heads = p->heads;
    a->kv_group = p->heads / mha_exec_kv_heads(p);
    a->fmt_batch = plan->fmt_batch;
    a->scale_log2 = p->scale * 1.4426950408889634f;
    a->relpos_buckets = p->relpos_buckets;
    a->relpos_max_distance = p->relpos_max_distance;
    a->relpos_bidirectional = p->relpos_bidirectional;
}

/* 16-byte vector accesses need 16-byte aligned rows. */
static int check_tensor(const char *name, CUdeviceptr ptr, int64_t batch_stride,
                        int64_t row_stride, stof_error *err) {
    if (!ptr || ptr % 16 || batch_stride % 8 || row_stride % 8 || row_stride <= 0 ||
        row_stride > STOF_ATTN_MAX_ROW_STRIDE)
        return err_set(err, STOF_ERR_INVALID,
                       "attention: %s must be a 16-byte aligned device pointer with strides "
                       "that are positive multiples of 8 elements, the row stride at most %lld "
                       "(pointer 0x%llx, batch stride %lld, row stride %lld)",
                       name, (long long)STOF_ATTN_MAX_ROW_STRIDE, (unsigned long long)ptr,
                       (long long)batch_stride, (long long)row_stride);
    return STOF_OK;
}

/* The tensor map of K or V for the TMA build (attention_abi.cuh): 16-bit
 * elements, dims (kv_heads * head_dim, rows, batches), boxes 64 x BLOCK_N x 1
 * in the 128-byte swizzle, rows outside the tensor read as zeros. A batch
 * stride of 0 (one tensor for every batch, or the ragged layout's rows) is
 * one batch, *batch_step 0. rows: k_len, or a ragged tensor's rows. */
static int encode_kv_map(const cuda_driver *drv, const mha_exec_plan *plan, const char *name,
                         CUdeviceptr ptr, int64_t batch_stride, int64_t row_stride, int64_t rows,
                         stof_attn_tmap *map, stof_i32 *batch_step, stof_error *err) {
    const mha_exec_problem *p = &plan->problem;
    const int one = batch_stride == 0 || p->batch == 1;
    const cuuint64_t e = 2, row_bytes = (cuuint64_t)row_stride * e;
    const cuuint64_t dims[3] = {(cuuint64_t)mha_exec_kv_heads(p) * (cuuint64_t)p->head_dim,
                                (cuuint64_t)rows, one ? 1 : (cuuint64_t)p->batch};
    const cuuint64_t strides[2] = {row_bytes,
                                   one ? row_bytes * (cuuint64_t)rows
                                       : (cuuint64_t)batch_stride * e};
    const cuuint32_t box[3] = {64, (cuuint32_t)plan->config.block_n, 1};
    const cuuint32_t unit[3] = {1, 1, 1};
    _Static_assert(sizeof(CUtensorMap) == sizeof(stof_attn_tmap), "tensor map size");
    CUresult r = drv->TensorMapEncodeTiled(
        (CUtensorMap *)map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, (void *)(uintptr_t)ptr, dims,
        strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cuTensorMapEncodeTiled(attention %s, batch stride %lld)",
                 name, (long long)batch_stride);
        return cuda_check(drv, r, what, err);
    }
    *batch_step = one ? 0 : 1;
    return STOF_OK;
}

/* The ragged layout takes a padded self-attention plan, no batch strides and rows that
 * fit 32-bit row numbers. */
static int check_ragged(const mha_exec_plan *plan, const mha_exec_tensors *t, stof_error *err) {
    const mha_exec_problem *p = &plan->problem;
    if (!t->seq_start)
        return STOF_OK;
    if (!p->padded || p->q_len != p->k_len || t->seq_start % 4)
        return err_set(err, STOF_ERR_INVALID, "attention: the ragged layout (seq_start) needs a "
                       "self-attention plan padded by an attention_mask, and a 4-byte aligned "
                       "int32 array");
    if (t->q_batch_stride || t->k_batch_stride || t->v_batch_stride || t->o_batch_stride ||
        t->ragged_rows < 1 || t->ragged_rows > INT32_MAX)
        return err_set(err, STOF_ERR_INVALID, "attention: a ragged layout's batch strides must "
                       "be 0 and its rows 1 to 2^31 - 1 (given %lld)",
                       (long long)t->ragged_rows);
    return STOF_OK;
}

int mha_run_main(mha_exec_ctx *c, const mha_exec_plan *plan, const mha_exec_tensors *t,
                 CUstream s, stof_error *err) {
    int rc;
    if ((rc = check_tensor("q", t->q, t->q_batch_stride, t->q_row_stride, err)) ||
        (rc = check_tensor("k", t->k, t->k_batch_stride, t->k_row_stride, err)) ||
        (rc = check_tensor("v", t->v, t->v_batch_stride, t->v_row_stride, err)) ||
        (rc = check_tensor("o", t->o, t->o_batch_stride, t->o_row_stride, err)))
        return rc;
    if (plan->problem.padded && ((!t->pad_mask && !t->seq_start) || t->pad_mask % 4))
        return err_set(err, STOF_ERR_INVALID,
                       "attention: the plan takes sequences' lengths: an attention_mask (int32, "
                       "4-byte aligned) or the ragged layout's seq_start, and neither was given");
    if (plan->problem.relpos && !t->relpos_table)
        return err_set(err, STOF_ERR_INVALID,
                       "attention: the plan has a relative position bias but no table was given");
    if ((rc = check_ragged(plan, t, err)))
        return rc;
    stof_attn_args args;
    mha_exec_fill_args(plan, t, &args);
    const int64_t rows = t->seq_start ? t->ragged_rows : plan->problem.k_len;
    if (plan->config.tma &&
        ((rc = encode_kv_map(c->drv, plan, "k", t->k, t->k_batch_stride, t->k_row_stride, rows,
                             &args.tmap_k, &args.k_tma_batch, err)) ||
         (rc = encode_kv_map(c->drv, plan, "v", t->v, t->v_batch_stride, t->v_row_stride, rows,
                             &args.tmap_v, &args.v_tma_batch, err))))
        return rc;
    void *params[] = {&args};
    rc = cuda_launch(c->drv, plan->func, plan->grid, plan->block, (unsigned)plan->smem, s, params,
                     c->pdl, "cuLaunchKernel(attention)", err);
    if (rc || !plan->config.split)
        return rc;
    return cuda_launch(c->drv, plan->combine, plan->combine_grid, plan->combine_block, 0, s,
                       params, c->pdl, "cuLaunchKernel(attention combine)", err);
}

int mha_exec_run(mha_exec_ctx *c, const mha_exec_plan *plan, const mha_exec_tensors *t,
                 CUstream s, stof_error *err) {
    const int global = plan->problem.global_keys;
    int rc = global ? mha_global_check(plan, t, err) : STOF_OK;
    if (!rc)
        rc = mha_run_main(c, plan, t, s, err);
    return rc || !global ? rc : mha_global_launch(c, plan, t, s, err);
}
