/* Building an attention plan from its configuration: the mask format and its upload, the
 * launch shape, the kernel; copying, freeing and describing plans. Which configuration a new
 * plan takes is mha_exec_create.c's. See mha_exec.h. */
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

/* ---- uploading the format -------------------------------------------------------------- */

/* The chunk a plan of cfg splits f at: forced (force_chunk > 0), never
 * (< 0), or mha_exec_split_chunk on the resident slots of lim. */
static int split_chunk_for(const mha_exec_problem *p, const mha_exec_config *cfg,
                           const mask_bsr *f, const mha_device_limits *lim, int force_chunk) {
    if (force_chunk)
        return force_chunk > 0 ? force_chunk : 0;
    return mha_exec_split_chunk(f, p->batch, p->heads, mha_exec_resident_slots(cfg, lim));
}

static int plan_split_chunk(const mha_exec_ctx *c, mha_exec_plan *plan, const mask_bsr *f,
                            int force_chunk) {
    mha_device_limits lim;
    mha_plan_device_limits(c, plan, &lim);
    return split_chunk_for(&plan->problem, &plan->config, f, &lim, force_chunk);
}

int mha_exec_plan_splits(const mha_exec_problem *p, const mask *folded,
                         const mha_exec_config *cfg, const mha_device_limits *lim,
                         int force_chunk, int *splits, stof_error *err) {
    *splits = 0;
    if (cfg->kernel != MHA_KERNEL_BLOCK_WISE)
        return STOF_OK;
    mask_bsr *f = NULL;
    int rc = mask_format_bsr_build(folded, cfg->block_m, cfg->block_n, &f, err);
    if (rc)
        return rc;
    int chunk = split_chunk_for(p, cfg, f, lim, force_chunk);
    for (int b = 0; chunk >= 1 && b < f->batch && !*splits; b++)
        for (int i = 0; i < f->n_block_rows && !*splits; i++)
            *splits = mha_bsr_row_len(f, b, i) > chunk;
    mask_format_bsr_free(f);
    return STOF_OK;
}

/* The work list of a split plan on the device, its workspace, its launch
 * shapes; nothing when no row is cut (config.split stays 0). */
static int upload_split(mha_exec_ctx *c, mha_exec_plan *plan, const mask_bsr *f,
                        int force_chunk, stof_error *err) {
    mha_exec_split *s = NULL;
    int rc = mha_exec_split_build(f, plan_split_chunk(c, plan, f, force_chunk), &s, err);
    if (rc || !s)
        return rc;
    const mha_exec_problem *p = &plan->problem;
    mha_exec_config *cfg = &plan->config;
    cfg->split = 1;
    plan->split_chunk = s->chunk;
    plan->split_rows = s->n_split_rows;
    plan->split_items = s->n_items;
    plan->split_slots = s->n_slots;
    plan->workspace_bytes =
        mha_exec_split_workspace(s, p->batch, p->heads, cfg->block_m, cfg->head_dim);
    /* partial O first ([units][block_m][head_dim] floats), then (m, l) */
    plan->workspace_ml_offset =
        plan->workspace_bytes / ((size_t)cfg->head_dim + 2) * (size_t)cfg->head_dim;
    size_t ptrs = ((size_t)s->fmt_batch + 1) * sizeof(int32_t);
    if (!(rc = gpu_ctx_upload(c, &plan->d_work_ptr, s->work_ptr, ptrs, err)) &&
        !(rc = gpu_ctx_upload(c, &plan->d_work, s->work, (size_t)s->n_items * sizeof *s->work, err)) &&
        !(rc = gpu_ctx_upload(c, &plan->d_split_ptr, s->split_ptr, ptrs, err)) &&
        !(rc = gpu_ctx_upload(c, &plan->d_splits, s->splits, (size_t)s->n_split_rows * sizeof *s->splits,
                      err)))
        rc = cuda_check(c->drv, c->drv->MemAlloc(&plan->d_workspace, plan->workspace_bytes),
                        "cuMemAlloc(attention split workspace)", err);
    if (rc)
        plan->d_workspace = 0;
    plan->grid[0] = (unsigned)s->max_items;
    plan->combine_grid[0] = (unsigned)s->max_split_rows;
    mha_exec_split_free(s);
    return rc;
}

/* The distinct partial-block bitmaps, and always at least one bitmap's
 * worth of words (zeros when there is none): the kernel may read a full
 * block's row of bitmap 0 and discard it (the compiler is free to issue a
 * load ahead of the test that skips it), so that address must be valid. */
static int upload_bitmaps(mha_exec_ctx *c, mha_exec_plan *plan, const mask_bsr *f,
                          stof_error *err) {
    size_t bytes = (size_t)f->bitmap_words * sizeof(uint32_t);
    if (f->n_part_masks > 0)
        return gpu_ctx_upload(c, &plan->d_bitmaps, f->part_masks, bytes * (size_t)f->n_part_masks, err);
    uint32_t *zeros = err_calloc((size_t)f->bitmap_words, sizeof *zeros, err);
    if (!zeros)
        return STOF_ERR_NOMEM;
    int rc = gpu_ctx_upload(c, &plan->d_bitmaps, zeros, bytes, err);
    free(zeros);
    return rc;
}

static int upload_bsr(mha_exec_ctx *c, mha_exec_plan *plan, const mask *folded,
                      int force_chunk, stof_error *err) {
    const mha_exec_config *cfg = &plan->config;
    mask_bsr *f = NULL;
    int rc = mask_format_bsr_build(folded, cfg->block_m, cfg->block_n, &f, err);
    if (rc)
        return rc;
    plan->fmt_batch = f->batch;
    plan->n_loaded_blocks = f->n_load;
    plan->n_partial_blocks = f->n_part;
    plan->n_bitmaps = f->n_part_masks;
    size_t ptrs = (size_t)f->batch * (f->n_block_rows + 1);
    if (!(rc = gpu_ctx_upload(c, &plan->d_row_ptr, f->load_row_ptr, ptrs * sizeof(int32_t), err)) &&
        !(rc = gpu_ctx_upload(c, &plan->d_col_idx, f->load_col_idx, (size_t)f->n_load * sizeof(int32_t),
                      err)) &&
        !(rc = gpu_ctx_upload(c, &plan->d_mask_idx, f->load_mask_idx,
                      (size_t)f->n_load * sizeof(int32_t), err)))
        rc = upload_bitmaps(c, plan, f, err);
    if (!rc)
        rc = upload_split(c, plan, f, force_chunk, err);
    mask_format_bsr_free(f);
    return rc;
}

static int upload_csr(mha_exec_ctx *c, mha_exec_plan *plan, const mask *folded,
                      stof_error *err) {
    mask_csr *f = NULL;
    int rc = mask_format_csr_build(folded, &f, err);
    if (rc)
        return rc;
    plan->fmt_batch = f->batch;
    size_t ptrs = (size_t)f->batch * (f->q_len + 1);
    if (!(rc = gpu_ctx_upload(c, &plan->d_row_ptr, f->row_ptr, ptrs * sizeof(int64_t), err)))
        rc = gpu_ctx_upload(c, &plan->d_col_idx, f->col_idx, (size_t)f->nnz * sizeof(int32_t), err);
    mask_format_csr_free(f);
    return rc;
}

/* bucket[j - i + q_len - 1] for every relative position, then the far runs'
 * ends (relpos_far_runs). */
static int upload_buckets(mha_exec_ctx *c, mha_exec_plan *plan, stof_error *err) {
    const mha_exec_problem *p = &plan->problem;
    size_t n = (size_t)p->q_len + (size_t)p->k_len - 1;
    int32_t *bucket = err_malloc((n + 2) * sizeof *bucket, err);
    if (!bucket)
        return STOF_ERR_NOMEM;
    for (size_t r = 0; r < n; r++)
        bucket[r] = mha_relpos_bucket_at(p, r);
    size_t first_end, last_start;
    mha_relpos_far_runs(p, &first_end, &last_start);
    bucket[n] = (int32_t)first_end;
    bucket[n + 1] = (int32_t)last_start;
    int rc = gpu_ctx_upload(c, &plan->d_relpos_bucket, bucket, (n + 2) * sizeof *bucket, err);
    free(bucket);
    return rc;
}

/* Grids (x over block rows, work items or split rows; y heads; z batch)
 * and blocks. A split plan's grid[0] and combine_grid[0] come from its work
 * list (upload_split). */
static void set_launch_shape(mha_exec_plan *plan) {
    const mha_exec_problem *p = &plan->problem;
    const mha_exec_config *cfg = &plan->config;
    if (cfg->kernel == MHA_KERNEL_BLOCK_WISE) {
        plan->smem = mha_exec_config_smem(cfg);
        if (!cfg->split)
            plan->grid[0] = (unsigned)((p->q_len + cfg->block_m - 1) / cfg->block_m);
        plan->block[0] = (unsigned)cfg->num_warps * 32u;
        if (cfg->split) {
            plan->combine_grid[1] = (unsigned)p->heads;
            plan->combine_grid[2] = (unsigned)p->batch;
            plan->combine_block[0] = STOF_ATTN_COMBINE_THREADS;
            plan->combine_block[1] = plan->combine_block[2] = 1;
        }
    } else {
        int rows = cfg->rows_per_warp * cfg->warps_per_block;
        plan->smem = 0; /* static */
        plan->grid[0] = (unsigned)((p->q_len + rows - 1) / rows);
        plan->block[0] = (unsigned)cfg->warps_per_block * 32u;
    }
    plan->grid[1] = (unsigned)p->heads;
    plan->grid[2] = (unsigned)p->batch;
    plan->block[1] = plan->block[2] = 1;
}

/* Everything a plan needs once its configuration is set: the format on the
 * device, the relpos buckets, the launch shape, the loaded kernel. The one
 * path from a configuration to a runnable plan, analytical or measured. */
int mha_plan_finish(mha_exec_ctx *c, mha_exec_plan *plan, const mask *folded,
                    const mha_exec_force *force, stof_error *err) {
    int rc = mha_exec_config_check(&plan->config, c->info.smem_per_block_optin, err);
    if (!rc && plan->config.wgmma && !device_wgmma_arch(c->arch))
        rc = err_set(err, STOF_ERR_UNSUPPORTED,
                     "attention: the wgmma build runs on sm_90 GPUs only, this one is %s",
                     c->arch);
    if (!rc && plan->config.tma && !device_tma_arch(c->arch))
        rc = err_set(err, STOF_ERR_UNSUPPORTED,
                     "attention: the TMA build runs on sm_90 and later GPUs, this one is %s",
                     c->arch);
    if (!rc)
        rc = plan->config.kernel == MHA_KERNEL_BLOCK_WISE
                 ? upload_bsr(c, plan, folded, force ? force->split_chunk : 0, err)
                 : upload_csr(c, plan, folded, err);
    if (!rc && plan->problem.relpos)
        rc = upload_buckets(c, plan, err);
    if (rc)
        return rc;
    set_launch_shape(plan);
    /* global keys the mask leaves out are merged in through each row's log-sum-exp */
    const mha_exec_problem *p = &plan->problem;
    plan->config.lse = mha_exec_wants_lse(p, folded);
    mha_exec_request r;
    mha_exec_request_init(&r, &plan->config, c->arch);
    rc = mha_get_function(c, &r,
                          plan->config.kernel == MHA_KERNEL_BLOCK_WISE ? STOF_ATTN_BLOCK_KERNEL
                                                                       : STOF_ATTN_ROW_KERNEL,
                          plan->smem, &plan->func, plan->config.split ? &plan->combine : NULL,
                          err);
    return rc || !p->global_keys ? rc : mha_global_prepare(c, plan, folded, err);
}

/* A new plan: a copy of base (problem, mask statistics, arch), no
 * configuration, no device arrays. */
mha_exec_plan *mha_plan_clone(const mha_exec_plan *base, stof_error *err) {
    mha_exec_plan *plan = err_malloc(sizeof *plan, err);
    if (plan)
        *plan = *base;
    return plan;
}

void mha_exec_plan_free(mha_exec_ctx *c, mha_exec_plan *plan) {
    if (!plan)
        return;
    c->drv->CtxSetCurrent(c->cu);
    CUdeviceptr ptrs[] = {plan->d_row_ptr,  plan->d_col_idx,        plan->d_mask_idx,
                          plan->d_bitmaps,  plan->d_relpos_bucket,  plan->d_work_ptr,
                          plan->d_work,     plan->d_split_ptr,      plan->d_splits,
                          plan->d_workspace, plan->d_global_index, plan->d_mask_bits};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        if (ptrs[i])
            c->drv->MemFree(ptrs[i]);
    free(plan);
}

size_t mha_exec_plan_describe(const mha_exec_plan *plan, char *buf, size_t n) {
    const mha_exec_config *cfg = &plan->config;
    char split[160] = "";
    if (cfg->split)
        snprintf(split, sizeof split,
                 "; split %d rows into %d items (chunk %d; %d work items, combine grid "
                 "%ux%ux%u, workspace %zu B)",
                 plan->split_rows, plan->split_slots, plan->split_chunk, plan->split_items,
                 plan->combine_grid[0], plan->combine_grid[1], plan->combine_grid[2],
                 plan->workspace_bytes);
    int k;
    if (cfg->kernel == MHA_KERNEL_BLOCK_WISE)
        k = snprintf(buf, n,
                     "block-wise%s BLOCK_M=%d BLOCK_N=%d warps=%d stages=%d%s "
                     "smem=%zuB grid=%ux%ux%u %s D=%d%s; %d loaded blocks (%d partial, %d "
                     "bitmaps), fmt_batch %d%s; %s",
                     cfg->wgmma ? " wgmma" : "", cfg->block_m, cfg->block_n,
                     cfg->num_warps, cfg->stages, cfg->tma ? " tma" : "",
                     plan->smem,
                     plan->grid[0], plan->grid[1], plan->grid[2], stof_dtype_name(cfg->dtype),
                     cfg->head_dim, cfg->relpos ? " relpos" : "", plan->n_loaded_blocks,
                     plan->n_partial_blocks, plan->n_bitmaps, plan->fmt_batch, split,
                     plan->reason);
    else
        k = snprintf(buf, n,
                     "row-wise rows/warp=%d warps=%d grid=%ux%ux%u %s D=%d%s; %lld allowed "
                     "pairs, fmt_batch %d; %s",
                     cfg->rows_per_warp, cfg->warps_per_block, plan->grid[0], plan->grid[1],
                     plan->grid[2], stof_dtype_name(cfg->dtype), cfg->head_dim,
                     cfg->relpos ? " relpos" : "", (long long)plan->allowed_pairs,
                     plan->fmt_batch, plan->reason);
    return k < 0 ? 0 : (size_t)k;
}
