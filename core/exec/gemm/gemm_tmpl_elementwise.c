/* The rows of the elementwise templates: glu (kernels/glu.cu, the gate of a
 * GeGLU / SwiGLU MLP), rotary (kernels/rotary.cu, rotary position
 * embeddings of a fused QKV tensor) and mask_rows (kernels/mask_rows.cu,
 * zeros at padded positions). Grid-stride loops over chunks of VEC
 * elements, like embedding. */
#include <math.h>
#include <stdio.h>

#include "core/base/error.h"
#include "core/exec/gemm/gemm_template.h"

static int no_row_reduce(const gemm_exec_problem *p) {
    (void)p;
    return 0;
}

/* ---- glu ------------------------------------------------------------------------------- */

static int validate_glu(const gemm_exec_problem *p, stof_error *err) {
    if (p->m < 1 || p->n < 1 || 2 * p->n > INT32_MAX)
        return err_set(err, STOF_ERR_INVALID, "glu: %lld rows of %lld outputs", (long long)p->m,
                       (long long)p->n);
    if (!gemm_glu_act_name(p->glu_act))
        return err_set(err, STOF_ERR_INVALID, "glu: activation %d (gelu %d, gelu tanh %d or "
                       "silu %d)", p->glu_act, STOF_ACT_GELU, STOF_ACT_GELU_TANH, STOF_ACT_SILU);
    return STOF_OK;
}

/* glu and mask_rows: chunks of a row of n. */
static void row_chunk_defaults(const gemm_exec_problem *p, const char *arch, int *v) {
    (void)arch;
    gemm_grid_stride_defaults(p->n, v);
}

static void glu_defines(gemm_exec_request *r, const gemm_exec_problem *p, const int *v,
                        const char *arch) {
    (void)v;
    (void)arch;
    gemm_request_define(r, "ACT", p->glu_act);
}

static void row_chunk_launch_shape(const gemm_exec_ctx *c, gemm_exec_plan *plan) {
    const gemm_exec_problem *p = &plan->problem;
    gemm_grid_stride_shape(c, plan, p->m * (p->n / plan->values[1]));
}

static void glu_describe(const gemm_exec_problem *p, char *buf, size_t n) {
    snprintf(buf, n, " %s", gemm_glu_act_name(p->glu_act));
}

const gemm_template gemm_template_glu = {
    .id = FUSION_T_GLU,
    .kernel = STOF_GLU_KERNEL,
    .n_name = "F",
    .validate = validate_glu,
    .row_reduce = no_row_reduce,
    .defaults = row_chunk_defaults,
    .defines = glu_defines,
    .launch_shape = row_chunk_launch_shape,
    .residual_at = GEMM_RESIDUAL_UNSHOWN,
    .describe_extra = glu_describe,
};

/* ---- rotary ---------------------------------------------------------------------------- */

static int validate_rotary(const gemm_exec_problem *p, stof_error *err) {
    int h = p->heads, kvh = p->kv_heads, d = p->head_dim;
    if (h < 1 || kvh < 1 || h % kvh || d < 2 || d % 2 || d > 1024)
        return err_set(err, STOF_ERR_INVALID, "rotary: %d heads, %d kv heads of %d: heads a "
                       "multiple of kv heads, head_dim even, at most 1024", h, kvh, d);
    if (p->n != (int64_t)(h + 2 * kvh) * d || p->n > INT32_MAX)
        return err_set(err, STOF_ERR_INVALID, "rotary: rows of %lld, but Q, K and V of %d, %d "
                       "and %d heads of %d make %lld", (long long)p->n, h, kvh, kvh, d,
                       (long long)(h + 2 * kvh) * d);
    if (p->m < 1 || p->seq_len < 1 || p->m % p->seq_len)
        return err_set(err, STOF_ERR_INVALID, "rotary: %lld rows are not whole sequences of %d",
                       (long long)p->m, p->seq_len);
    if (!(isfinite(p->theta) && p->theta > 1.0f))
        return err_set(err, STOF_ERR_INVALID, "rotary: theta must be above 1, got %g",
                       (double)p->theta);
    return STOF_OK;
}

static void rotary_defaults(const gemm_exec_problem *p, const char *arch, int *v) {
    (void)arch;
    gemm_grid_stride_defaults(p->head_dim / 2, v);
}

static void rotary_defines(gemm_exec_request *r, const gemm_exec_problem *p, const int *v,
                           const char *arch) {
    (void)v;
    (void)arch;
    gemm_request_define(r, "HEAD_DIM", p->head_dim);
    if (p->has_position_ids) /* absent otherwise: the older builds keep their cache keys */
        gemm_request_define(r, "HAS_POSITIONS", 1);
}

/* Per row: a unit for VEC pairs of each Q and K head, one for VEC values of
 * the V heads (kernels/rotary.cu). */
static void rotary_launch_shape(const gemm_exec_ctx *c, gemm_exec_plan *plan) {
    const gemm_exec_problem *p = &plan->problem;
    const int vec = plan->values[1];
    int64_t rotated = (int64_t)(p->heads + p->kv_heads) * p->head_dim;
    gemm_grid_stride_shape(c, plan, p->m * (rotated / 2 / vec + (p->n - rotated) / vec));
}

static void rotary_describe(const gemm_exec_problem *p, char *buf, size_t n) {
    snprintf(buf, n, " heads %d/%d x %d theta %g%s", p->heads, p->kv_heads, p->head_dim,
             (double)p->theta, p->has_position_ids ? " positions" : "");
}

const gemm_template gemm_template_rotary = {
    .id = FUSION_T_ROTARY,
    .kernel = STOF_ROTARY_KERNEL,
    .n_name = "N",
    .validate = validate_rotary,
    .row_reduce = no_row_reduce,
    .defaults = rotary_defaults,
    .defines = rotary_defines,
    .launch_shape = rotary_launch_shape,
    .residual_at = GEMM_RESIDUAL_UNSHOWN,
    .describe_extra = rotary_describe,
};

/* ---- mask_rows ------------------------------------------------------------------------- */

static int validate_mask_rows(const gemm_exec_problem *p, stof_error *err) {
    if (p->m < 1 || p->n < 1 || p->n > INT32_MAX)
        return err_set(err, STOF_ERR_INVALID, "mask_rows: %lld rows of %lld elements",
                       (long long)p->m, (long long)p->n);
    return STOF_OK;
}

static void no_defines(gemm_exec_request *r, const gemm_exec_problem *p, const int *v,
                       const char *arch) {
    (void)r;
    (void)p;
    (void)v;
    (void)arch;
}

const gemm_template gemm_template_mask_rows = {
    .id = FUSION_T_MASK_ROWS,
    .kernel = STOF_MASK_ROWS_KERNEL,
    .n_name = "N",
    .validate = validate_mask_rows,
    .row_reduce = no_row_reduce,
    .defaults = row_chunk_defaults,
    .defines = no_defines,
    .launch_shape = row_chunk_launch_shape,
    .residual_at = GEMM_RESIDUAL_UNSHOWN,
};
