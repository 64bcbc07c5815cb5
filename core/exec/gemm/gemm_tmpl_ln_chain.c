/* The rows of the two fused GEMMs of mma.sync warps: gemm_ln
 * (kernels/gemm_ln.cu, a GEMM closed by LayerNorm/RMSNorm over whole rows)
 * and gemm_chain (kernels/gemm_chain.cu, two GEMMs through an activation,
 * the FFN). */
#include <stdio.h>
#include <string.h>

#include "core/base/error.h"
#include "core/exec/gemm/gemm_template.h"

/* ---- shared by both ------------------------------------------------------------------ */

/* ROWS | BLOCK_M, BLOCK_N | BLOCK_F, BLOCK_K, WARPS: the first GEMM's tile
 * must split into 16 x 16 pieces over the warps. */
static int warp_grid_check(const gemm_exec_problem *p, const int *v, stof_error *err) {
    if (!stof_gemm_warps_m(v[0], v[1], v[3]))
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "%s: %d warps cannot split a %dx%d tile into 16x16 pieces",
                       gemm_template_name(p->tmpl), v[3], v[0], v[1]);
    return STOF_OK;
}

/* ROWS | BLOCK_M rows a block, WARPS warps. */
static void row_block_launch_shape(const gemm_exec_ctx *c, gemm_exec_plan *plan) {
    (void)c;
    plan->grid[0] = (unsigned)gemm_ceil_div(plan->problem.m, plan->values[0]);
    plan->block[0] = (unsigned)plan->values[3] * 32;
}

/* ---- gemm_ln ------------------------------------------------------------------------- */

static int validate_ln(const gemm_exec_problem *p, stof_error *err) {
    int rc = gemm_validate_sizes("gemm_ln", p->m, p->n, p->k, err);
    if (rc)
        return rc;
    if (p->epi.norm == FUSION_NORM_NONE)
        return err_set(err, STOF_ERR_INVALID,
                       "gemm_ln: the epilogue must close with layernorm or rmsnorm (without a "
                       "norm it is gemm_epilogue)");
    if (p->epi.act != FUSION_ACT_NONE)
        return err_set(err, STOF_ERR_INVALID,
                       "gemm_ln: no activation between the GEMM and its norm (gemm [bias] [add] "
                       "norm)");
    return gemm_validate_eps("gemm_ln", p->eps, err);
}

static int ln_row_reduce(const gemm_exec_problem *p) {
    (void)p;
    return 1;
}

/* ROWS, BLOCK_N, BLOCK_K, WARPS, STAGES. Many rows: 32-row blocks of 8
 * warps (16 x 64 warp tiles... as the warp grid picks); fewer rows: 16-row
 * blocks, so that more blocks share the GPU; then shallower rings while the
 * fp32 rows leave too little room. */
static void ln_defaults(const gemm_exec_problem *p, const char *arch, int *v) {
    (void)arch;
    static const int ln[][5] = {{32, 128, 64, 8, 3}, {32, 128, 32, 8, 2}, {16, 128, 64, 4, 3},
                                {16, 128, 32, 4, 2}, {16, 64, 32, 4, 2}};
    gemm_first_feasible(p, ln, 5, p->m > 2048 ? 0 : 2, v);
}

static void ln_defines(gemm_exec_request *r, const gemm_exec_problem *p, const int *v,
                       const char *arch) {
    (void)v;
    (void)arch;
    gemm_request_define(r, "ROW_N", p->n);
    gemm_request_define(r, "WEIGHT_KN", p->weight_kn != 0);
    gemm_request_define(r, "HAS_BIAS", p->epi.has_bias != 0);
    gemm_request_define(r, "HAS_RESIDUAL", p->epi.has_residual != 0);
    gemm_request_define(r, "NORM", (int)p->epi.norm);
    gemm_request_define(r, "STORE_PRE_NORM", p->store_pre_norm != 0);
}

/* The ring + the fp32 rows (gemm_abi.cuh). */
static size_t ln_smem(const gemm_exec_problem *p, const int *v) {
    return (size_t)stof_gemm_ln_smem(v[0], v[1], v[2], v[4], p->n,
                                     (int)stof_dtype_size(p->dtype));
}

const gemm_template gemm_template_ln = {
    .id = FUSION_T_GEMM_LN,
    .kernel = STOF_GEMM_LN_KERNEL,
    .n_name = "N",
    .validate = validate_ln,
    .check = warp_grid_check,
    .row_reduce = ln_row_reduce,
    .defaults = ln_defaults,
    .defines = ln_defines,
    .smem = ln_smem,
    .launch_shape = row_block_launch_shape,
    .residual_at = GEMM_RESIDUAL_BEFORE_ACT,
};

/* ---- gemm_chain ---------------------------------------------------------------------- */

static int validate_chain(const gemm_exec_problem *p, stof_error *err) {
    if (p->n2 < 8 || p->n2 > INT32_MAX || p->n2 % 8)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "gemm_chain: the output width N2 = %lld must be a positive multiple of 8",
                       (long long)p->n2);
    int rc = gemm_validate_sizes("gemm_chain (first GEMM, N = F)", p->m, p->n, p->k, err);
    if (rc)
        return rc;
    if ((int)p->epi2.act < FUSION_ACT_NONE || p->epi2.act > FUSION_ACT_RELU ||
        (int)p->epi2.norm < FUSION_NORM_NONE || p->epi2.norm > FUSION_NORM_RMSNORM)
        return err_set(err, STOF_ERR_INVALID, "gemm_chain: unknown activation %d or norm %d",
                       (int)p->epi2.act, (int)p->epi2.norm);
    if (p->epi.norm != FUSION_NORM_NONE || p->epi2.norm != FUSION_NORM_NONE ||
        p->store_pre_norm)
        return err_set(err, STOF_ERR_INVALID, "gemm_chain has no norm (gemm [bias] [act] gemm "
                       "[bias] [add])");
    if (p->epi.has_residual)
        return err_set(err, STOF_ERR_INVALID,
                       "gemm_chain: a residual is added after the second GEMM only (epi2)");
    if (p->epi2.act != FUSION_ACT_NONE)
        return err_set(err, STOF_ERR_INVALID,
                       "gemm_chain: the activation comes between the GEMMs only (epi)");
    return STOF_OK;
}

static int chain_row_reduce(const gemm_exec_problem *p) {
    (void)p;
    return 0;
}

/* BLOCK_M, BLOCK_F, BLOCK_K, WARPS, STAGES. 16 rows a block (more blocks at
 * the small M it is for) unless M is large, 128-feature chunks, 8 warps:
 * 16 x 16 warp tiles in the first GEMM, 8 or 16 output columns a warp of
 * each w2 slab. */
static void chain_defaults(const gemm_exec_problem *p, const char *arch, int *v) {
    (void)arch;
    static const int chain[][5] = {{32, 128, 64, 8, 3}, {16, 128, 64, 8, 3}, {16, 64, 32, 4, 2}};
    gemm_first_feasible(p, chain, 3, p->m >= 4096 ? 0 : 1, v);
}

static void chain_defines(gemm_exec_request *r, const gemm_exec_problem *p, const int *v,
                          const char *arch) {
    (void)v;
    (void)arch;
    gemm_request_define(r, "OUT_N", p->n2);
    gemm_request_define(r, "WEIGHT_KN", p->weight_kn != 0);
    gemm_request_define(r, "HAS_BIAS1", p->epi.has_bias != 0);
    gemm_request_define(r, "ACT", (int)p->epi.act);
    gemm_request_define(r, "HAS_BIAS2", p->epi2.has_bias != 0);
    gemm_request_define(r, "HAS_RESIDUAL", p->epi2.has_residual != 0);
}

/* The ring + the activated chunk + two slabs of w2 (gemm_abi.cuh). */
static size_t chain_smem(const gemm_exec_problem *p, const int *v) {
    return (size_t)stof_gemm_chain_smem(v[0], v[1], v[2], v[4], (int)stof_dtype_size(p->dtype));
}

/* The second GEMM's part of a description. */
static void chain_describe(const gemm_exec_problem *p, char *buf, size_t n) {
    snprintf(buf, n, " | gemm N2=%lld%s%s", (long long)p->n2, p->epi2.has_bias ? " bias" : "",
             p->epi2.has_residual ? " add" : "");
}

const gemm_template gemm_template_chain = {
    .id = FUSION_T_GEMM_CHAIN,
    .kernel = STOF_GEMM_CHAIN_KERNEL,
    .n_name = "F",
    .validate = validate_chain,
    .check = warp_grid_check,
    .row_reduce = chain_row_reduce,
    .uses_n2 = 1,
    .defaults = chain_defaults,
    .defines = chain_defines,
    .smem = chain_smem,
    .launch_shape = row_block_launch_shape,
    .residual_at = GEMM_RESIDUAL_UNSHOWN,
    .describe_extra = chain_describe,
};
