/* The rows of the two memory-bound templates gemm_exec runs: mi_chain
 * (kernels/mi_chain.cu, elementwise ops and a norm over rows) and embedding
 * (kernels/embedding.cu, the table lookups that open a model). */
#include <stdio.h>
#include <string.h>

#include "core/base/error.h"
#include "core/exec/gemm/gemm_template.h"

/* ---- mi_chain -------------------------------------------------------------------------- */

static int validate_mi(const gemm_exec_problem *p, stof_error *err) {
    if (p->m < 1 || p->n < 1 || p->n > INT32_MAX)
        return err_set(err, STOF_ERR_INVALID, "mi_chain: %lld rows of %lld elements",
                       (long long)p->m, (long long)p->n);
    if (p->epi.norm != FUSION_NORM_NONE) {
        int rc = gemm_validate_eps("mi_chain", p->eps, err);
        if (rc)
            return rc;
    }
    if (p->store_pre_norm && p->epi.norm == FUSION_NORM_NONE)
        return err_set(err, STOF_ERR_INVALID,
                       "mi_chain: store_pre_norm without a norm (the output is the pre-norm)");
    if (p->f32 & ~(unsigned)(GEMM_F32_X | GEMM_F32_RESIDUAL | GEMM_F32_PRE_NORM | GEMM_F32_Y) ||
        ((p->f32 & GEMM_F32_RESIDUAL) && !p->epi.has_residual) ||
        ((p->f32 & GEMM_F32_PRE_NORM) && !p->store_pre_norm))
        return err_set(err, STOF_ERR_INVALID, "mi_chain: fp32 tensors 0x%x with%s a residual "
                       "and with%s the norm's input stored", p->f32,
                       p->epi.has_residual ? "" : "out", p->store_pre_norm ? "" : "out");
    return STOF_OK;
}

static int mi_row_reduce(const gemm_exec_problem *p) {
    return p->epi.norm != FUSION_NORM_NONE;
}

/* mi_chain values: ROWS, THREADS, VEC. Elements a thread holds. */
static int64_t mi_per_thread(int64_t n, const int *v) {
    int64_t tpr = v[1] / v[0], chunks = n / v[2];
    return (chunks + tpr - 1) / tpr * v[2];
}

/* A thread keeps its share of a row in registers: at most
 * STOF_MI_MAX_PER_THREAD elements. */
static int mi_check(const gemm_exec_problem *p, const int *values, stof_error *err) {
    if (values[1] % values[0])
        return err_set(err, STOF_ERR_UNSUPPORTED, "mi_chain: THREADS %d are not a multiple "
                       "of ROWS %d", values[1], values[0]);
    int64_t per = mi_per_thread(p->n, values);
    if (per > STOF_MI_MAX_PER_THREAD)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "mi_chain: %d rows on %d threads leave %lld of the %lld elements of a "
                       "row to each thread, more than the %d it keeps in registers",
                       values[0], values[1], (long long)per, (long long)p->n,
                       STOF_MI_MAX_PER_THREAD);
    return STOF_OK;
}

/* ROWS, THREADS, VEC: a warp a row (4 rows a block) while a thread holds at
 * most 32 elements, else whole blocks a row. */
static void mi_defaults(const gemm_exec_problem *p, const char *arch, int *v) {
    (void)arch;
    v[2] = gemm_widest_vec(p->n);
    v[0] = 4;
    v[1] = 128;
    if (mi_per_thread(p->n, v) > 32) {
        v[0] = 1;
        v[1] = 256;
        if (mi_per_thread(p->n, v) > 32)
            v[1] = 512;
    }
}

static void mi_defines(gemm_exec_request *r, const gemm_exec_problem *p, const int *v,
                       const char *arch) {
    (void)v;
    (void)arch;
    gemm_request_define(r, "ROW_N", p->n);
    gemm_request_define(r, "HAS_BIAS", p->epi.has_bias != 0);
    gemm_request_define(r, "HAS_RESIDUAL", p->epi.has_residual != 0);
    gemm_request_define(r, "ACT", (int)p->epi.act);
    gemm_request_define(r, "NORM", (int)p->epi.norm);
    gemm_request_define(r, "STORE_PRE_NORM", p->store_pre_norm != 0);
    /* the tensors kept in fp32 (a residual stream), each its own build */
    gemm_request_define(r, "X_F32", (p->f32 & GEMM_F32_X) != 0);
    gemm_request_define(r, "RESIDUAL_F32", (p->f32 & GEMM_F32_RESIDUAL) != 0);
    gemm_request_define(r, "PRE_NORM_F32", (p->f32 & GEMM_F32_PRE_NORM) != 0);
    gemm_request_define(r, "Y_F32", (p->f32 & GEMM_F32_Y) != 0);
}

/* ROWS rows a block of THREADS threads. */
static void mi_launch_shape(const gemm_exec_ctx *c, gemm_exec_plan *plan) {
    (void)c;
    plan->grid[0] = (unsigned)gemm_ceil_div(plan->problem.m, plan->values[0]);
    plan->block[0] = (unsigned)plan->values[1];
}

const gemm_template gemm_template_mi_chain = {
    .id = FUSION_T_MI_CHAIN,
    .kernel = STOF_MI_CHAIN_KERNEL,
    .n_name = "N",
    .validate = validate_mi,
    .check = mi_check,
    .row_reduce = mi_row_reduce,
    .defaults = mi_defaults,
    .defines = mi_defines,
    .launch_shape = mi_launch_shape,
    .residual_at = GEMM_RESIDUAL_BEFORE_ACT,
};

/* ---- embedding ------------------------------------------------------------------------- */

static int validate_embedding(const gemm_exec_problem *p, stof_error *err) {
    /* the bad-id flag holds token + 1 in an int32 */
    if (p->m < 1 || p->m >= INT32_MAX || p->n < 1 || p->n > INT32_MAX || p->seq_len < 1 ||
        p->m % p->seq_len || p->vocab < 1 || (p->has_type_ids && (!p->has_type ||
                                                                    p->type_vocab < 1)) ||
        (p->has_position_ids && (!p->has_position || p->pos_rows < 1)))
        return err_set(err, STOF_ERR_INVALID,
                       "embedding: %lld tokens of width %lld, seq_len %d, vocab %d: tokens must "
                       "be a multiple of seq_len, below 2^31 - 1",
                       (long long)p->m, (long long)p->n, p->seq_len, p->vocab);
    return STOF_OK;
}

static int embedding_row_reduce(const gemm_exec_problem *p) {
    (void)p;
    return 0;
}

/* THREADS, VEC */
static void embedding_defaults(const gemm_exec_problem *p, const char *arch, int *v) {
    (void)arch;
    gemm_grid_stride_defaults(p->n, v);
}

static void embedding_defines(gemm_exec_request *r, const gemm_exec_problem *p, const int *v,
                              const char *arch) {
    (void)v;
    (void)arch;
    gemm_request_define(r, "HAS_POS", p->has_position != 0);
    gemm_request_define(r, "HAS_TYPE", p->has_type != 0);
    if (p->has_type_ids) /* absent otherwise: the older builds keep their cache keys */
        gemm_request_define(r, "HAS_TYPE_IDS", 1);
    if (p->has_position_ids)
        gemm_request_define(r, "HAS_POS_IDS", 1);
}

/* A grid-stride loop over chunks of VEC: enough blocks to fill the GPU a
 * few times over. */
static void embedding_launch_shape(const gemm_exec_ctx *c, gemm_exec_plan *plan) {
    const gemm_exec_problem *p = &plan->problem;
    gemm_grid_stride_shape(c, plan, p->m * (p->n / plan->values[1]));
}

/* The tables a description adds. */
static void embedding_describe(const gemm_exec_problem *p, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s%s", p->has_position ? " pos" : "", p->has_type ? " type" : "",
             p->has_type_ids ? " type_ids" : "", p->has_position_ids ? " pos_ids" : "");
}

const gemm_template gemm_template_embedding = {
    .id = FUSION_T_EMBEDDING,
    .kernel = STOF_EMBEDDING_KERNEL,
    .n_name = "N",
    .validate = validate_embedding,
    .row_reduce = embedding_row_reduce,
    .defaults = embedding_defaults,
    .defines = embedding_defines,
    .launch_shape = embedding_launch_shape,
    .error_flag = 1,
    .residual_at = GEMM_RESIDUAL_UNSHOWN,
    .describe_extra = embedding_describe,
};
