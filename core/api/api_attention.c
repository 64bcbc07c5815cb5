/* The public GPU API: contexts and masked multi-head attention, over
 * core/mha_exec. */
#include <math.h>
#include <stdlib.h>

#include "core/api/api_internal.h"
#include "core/base/error.h"
#include "core/exec/attention/mha_exec.h"

struct stof_ctx {
    mha_exec_ctx *exec;
};

struct stof_attention {
    stof_ctx *ctx;
    mha_exec_plan *plan;
};

int stof_ctx_create(int device, stof_ctx **out) {
    stof_error err = {0};
    *out = NULL;
    stof_ctx *c = err_calloc(1, sizeof *c, &err);
    if (!c)
        return api_remember(STOF_ERR_NOMEM, &err);
    int rc = mha_exec_ctx_create(device, &c->exec, &err);
    if (rc) {
        free(c);
        return api_remember(rc, &err);
    }
    *out = c;
    return api_remember(STOF_OK, &err);
}

void stof_ctx_free(stof_ctx *ctx) {
    if (!ctx)
        return;
    mha_exec_ctx_free(ctx->exec);
    free(ctx);
}

int stof_ctx_device(const stof_ctx *ctx, stof_device_info *info) {
    *info = ctx->exec->info;
    return STOF_OK;
}

static mha_exec_problem problem_of(const stof_attention_desc *d) {
    mha_exec_problem p = {
        .mask = d->mask ? d->mask->m : NULL,
        .causal = d->causal,
        .batch = d->batch,
        .heads = d->heads,
        .head_dim = d->head_dim,
        .q_len = d->q_len,
        .k_len = d->k_len,
        .dtype = d->dtype,
        .scale = d->scale > 0 ? d->scale : 1.0f / sqrtf((float)(d->head_dim > 0 ? d->head_dim : 1)),
        .relpos = d->relpos_buckets > 0,
        .relpos_buckets = d->relpos_buckets,
        .relpos_max_distance = d->relpos_max_distance,
        .relpos_bidirectional = d->relpos_bidirectional,
        .padded = d->padded,
        .kv_heads = d->kv_heads,
    };
    return p;
}

int stof_attention_plan(stof_ctx *ctx, const stof_attention_desc *desc, stof_attention **out) {
    stof_error err = {0};
    *out = NULL;
    mha_exec_problem p = problem_of(desc);
    mha_exec_force force = {.kernel = (int)desc->kernel, .block_m = desc->block_m,
                            .block_n = desc->block_n, .num_warps = desc->num_warps,
                            .measure = desc->measure, .wgmma = desc->wgmma, .tma = desc->tma};
    stof_attention *a = err_calloc(1, sizeof *a, &err);
    if (!a)
        return api_remember(STOF_ERR_NOMEM, &err);
    int rc = mha_exec_plan_create(ctx->exec, &p, &force, &a->plan, &err);
    if (rc) {
        free(a);
        return api_remember(rc, &err);
    }
    a->ctx = ctx;
    *out = a;
    return api_remember(STOF_OK, &err);
}

void stof_attention_free(stof_attention *a) {
    if (!a)
        return;
    mha_exec_plan_free(a->ctx->exec, a->plan);
    free(a);
}

int stof_attention_describe(const stof_attention *a, char *buf, size_t n) {
    mha_exec_plan_describe(a->plan, buf, n);
    return STOF_OK;
}

int stof_attention_run(stof_attention *a, const stof_attention_io *io, void *stream) {
    stof_error err = {0};
    mha_exec_tensors t = {
        .q = (CUdeviceptr)io->q, .k = (CUdeviceptr)io->k, .v = (CUdeviceptr)io->v,
        .o = (CUdeviceptr)io->o,
        .q_batch_stride = io->q_stride[0], .q_row_stride = io->q_stride[1],
        .k_batch_stride = io->k_stride[0], .k_row_stride = io->k_stride[1],
        .v_batch_stride = io->v_stride[0], .v_row_stride = io->v_stride[1],
        .o_batch_stride = io->o_stride[0], .o_row_stride = io->o_stride[1],
        .relpos_table = (CUdeviceptr)io->relpos_table,
        .pad_mask = (CUdeviceptr)io->attention_mask,
    };
    if (io->seq_start)
        mha_exec_tensors_ragged(&t, (CUdeviceptr)io->seq_start, io->rows);
    int rc = mha_exec_run(a->ctx->exec, a->plan, &t, (CUstream)stream, &err);
    return api_remember(rc, &err);
}
