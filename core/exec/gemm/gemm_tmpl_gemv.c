/* gemv's row (kernels/gemv.cu): a GEMM of a few rows with gemm_epilogue's epilogue (bias,
 * activation, residual; no closing norm) or a gated unit (bias, GLU), and ahead of it a norm of
 * x's rows (a pre-norm model's), the weights streamed once. With [N, K] weights its N may be any
 * width (a vocabulary). */
#include <stdio.h>

#include "core/base/error.h"
#include "core/exec/gemm/gemm_template.h"
#include "core/gpu/device.h"

static int validate_gemv(const gemm_exec_problem *p, stof_error *err) {
    if (p->m < 1 || p->m > STOF_GEMV_MAX_M || p->n < 1 || p->n > INT32_MAX || p->k < 8 ||
        p->k > INT32_MAX || p->k % 8 || (p->weight_kn && p->n % 8))
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "gemv: M = %lld, N = %lld, K = %lld: M must be 1..%d, K a positive "
                       "multiple of 8%s",
                       (long long)p->m, (long long)p->n, (long long)p->k, STOF_GEMV_MAX_M,
                       p->weight_kn ? " and N too ([K, N] weights: 16-byte column loads)" : "");
    if (p->epi.norm != FUSION_NORM_NONE || p->store_pre_norm)
        return err_set(err, STOF_ERR_UNSUPPORTED, "gemv: no closing norm (gemm_epilogue and "
                       "gemm_ln have one)");
    if ((int)p->prologue < FUSION_NORM_NONE || p->prologue > FUSION_NORM_RMSNORM)
        return err_set(err, STOF_ERR_INVALID, "gemv: unknown norm %d ahead of the GEMM",
                       (int)p->prologue);
    if (p->glu_act && !gemm_glu_act_name(p->glu_act))
        return err_set(err, STOF_ERR_INVALID, "gemv: GLU activation %d (gelu, gelu tanh or "
                       "silu)", p->glu_act);
    if (p->glu_act && (p->weight_kn || p->n % 2 || p->epi.act != FUSION_ACT_NONE ||
                       p->epi.has_residual))
        return err_set(err, STOF_ERR_UNSUPPORTED, "gemv: a GLU after the GEMM takes [N, K] "
                       "weights, an even N (%lld) and no activation or residual before it",
                       (long long)p->n);
    return p->prologue != FUSION_NORM_NONE ? gemm_validate_eps("gemv", p->eps, err) : STOF_OK;
}

static int no_row_reduce(const gemm_exec_problem *p) {
    (void)p;
    return 0;
}

/* What the default setting stages of x at most: within every architecture's shared memory a
 * block (99 KiB on sm_86 and sm_89), two blocks an SM on sm_90. */
#define GEMV_STAGED_BYTES (96 * 1024)

static int smallest_rows(int64_t m) {
    int rows = 1;
    while (rows < m)
        rows *= 2;
    return rows;
}

/* Enough blocks to keep the memory busy on an H100 / H200 (132 SMs): every row of the block's
 * x in one pass (ROWS >= M) where [N, K]'s staged rows of x stay within GEMV_STAGED_BYTES, and
 * the loads of a whole K in flight where registers allow. [N, K]: one output a warp (two from
 * five rows on, which halves the conversions of x a weight takes, and at one row below a K of
 * 4096; two with a GLU, an output's pair); at one row eight warps a block and eight loads a
 * lane, or for a K of 4096 or more the weights through shared memory: eight stages of 512
 * elements of eight rows, four warps of two rows each (a down projection's 8192: 12.9 -> 9.7 us
 * on an H200, 16.1 -> 12.9 on an H100; at a K of 2048 the stages were slower,
 * bench/RESULTS.md), or before sm_90 (no bulk copies) sixteen loads a lane. At more rows four
 * warps. [K, N]: the widest column slice of 64, 32 or 16 leaving at least 128 blocks, eight
 * warps. */
static void gemv_defaults(const gemm_exec_problem *p, const char *arch, int *v) {
    v[0] = smallest_rows(p->m);
    v[4] = 0;
    /* fewer rows a pass where they are long (16 rows of a down projection's 8192: 256 KiB) */
    while (!p->weight_kn && v[0] > 1 &&
           stof_gemv_smem(v[0], p->m, p->k, (int)stof_dtype_size(p->dtype)) > GEMV_STAGED_BYTES)
        v[0] /= 2;
    if (p->weight_kn) {
        v[1] = 16;
        for (int w = 64; w > 16; w /= 2)
            if (p->n / w >= 128) {
                v[1] = w;
                break;
            }
        v[2] = 8;
        v[3] = v[0] >= 16 ? 4 : 8;
        return;
    }
    if (p->m == 1 && p->k >= 4096 && device_tma_arch(arch)) {
        v[1] = 8;
        v[2] = 4;
        v[3] = 2;
        v[4] = 8;
        return;
    }
    /* with a GLU two features a warp; at one row below a K of 4096 two outputs a warp too
     * (half the warps' reductions and x's conversions a weight: gpt2-124M's step 0.29 -> 0.27
     * ms on an H200, bench/RESULTS.md) */
    const int one_row_pairs = p->m == 1 && p->k < 4096;
    const int outs = p->glu_act || p->m > 4 || one_row_pairs ? 2 : 1;
    v[2] = p->m == 1 ? 8 : 4;
    v[1] = v[2] * outs;
    v[3] = v[0] >= 16 ? 4 : p->m == 1 && outs == 1 && p->k >= 4096 ? 16 : 8;
}

/* The stages' bulk copies and the barriers counting their bytes are sm_90's. */
static int gemv_check_arch(const gemm_exec_problem *p, const int *v, const char *arch,
                           stof_error *err) {
    (void)p;
    if (!v[4] || device_tma_arch(arch))
        return STOF_OK;
    return err_set(err, STOF_ERR_UNSUPPORTED, "gemv: STAGES %d copies the weights by bulk copies, "
                   "which need sm_90 or later (this is %s)", v[4], arch ? arch : "no GPU");
}

static void gemv_defines(gemm_exec_request *r, const gemm_exec_problem *p, const int *v,
                         const char *arch) {
    (void)arch;
    gemm_request_define(r, "WEIGHT_KN", p->weight_kn != 0);
    gemm_request_define(r, "HAS_BIAS", p->epi.has_bias != 0);
    gemm_request_define(r, "ACT", (int)p->epi.act);
    gemm_request_define(r, "HAS_RESIDUAL", p->epi.has_residual != 0);
    gemm_request_define(r, "PROLOGUE_NORM", (int)p->prologue);
    gemm_request_define(r, "GLU", p->glu_act);
    gemm_request_define(r, "STAGES", v[4]);
}

/* What a description adds: the gated unit after the GEMM, named as glu's. */
static void gemv_describe_extra(const gemm_exec_problem *p, char *buf, size_t n) {
    if (p->glu_act)
        snprintf(buf, n, " glu %s", gemm_glu_act_name(p->glu_act));
    else if (n)
        buf[0] = '\0';
}

/* Column slices of BLOCK_N (with a GLU, BLOCK_N / 2 outputs and their pairs), times row groups
 * of ROWS: [K, N], a block each (grid y the row groups); [N, K], the tiles of a persistent grid
 * (one dimension, capped by the plan at the blocks the GPU holds; gemv_persistent). */
static void gemv_launch_shape(const gemm_exec_ctx *c, gemm_exec_plan *plan) {
    (void)c;
    const gemm_exec_problem *p = &plan->problem;
    const int64_t slices = p->glu_act ? gemm_ceil_div(p->n / 2, plan->values[1] / 2)
                                      : gemm_ceil_div(p->n, plan->values[1]);
    const int64_t groups = gemm_ceil_div(p->m, plan->values[0]);
    if (p->weight_kn) {
        plan->grid[0] = (unsigned)slices;
        plan->grid[1] = (unsigned)groups;
    } else {
        plan->grid[0] = (unsigned)(slices * groups);
    }
    /* with stages, one more warp issues the weights' copies */
    plan->block[0] = (unsigned)(plan->values[2] + (plan->values[4] ? 1 : 0)) * 32;
}

/* [N, K]: x's rows of a row group staged in shared memory, ROWS (or M, if fewer) rows of K,
 * then the stages of weights (STAGES > 0). */
static size_t gemv_smem(const gemm_exec_problem *p, const int *v) {
    const int elem = (int)stof_dtype_size(p->dtype);
    return p->weight_kn ? 0
                        : (size_t)(stof_gemv_smem(v[0], p->m, p->k, elem) +
                                   stof_gemv_stages_smem(v[4], v[1], v[3], p->k, elem));
}

static int gemv_persistent(const gemm_exec_problem *p, const int *v, const char *arch) {
    (void)v;
    (void)arch;
    return !p->weight_kn;
}

const gemm_template gemm_template_gemv = {
    .id = FUSION_T_GEMV,
    .kernel = STOF_GEMV_KERNEL,
    .n_name = "N",
    .validate = validate_gemv,
    .check_arch = gemv_check_arch,
    .row_reduce = no_row_reduce,
    .defaults = gemv_defaults,
    .defines = gemv_defines,
    .smem = gemv_smem,
    .launch_shape = gemv_launch_shape,
    .persistent = gemv_persistent,
    .residual_at = GEMM_RESIDUAL_AFTER_ACT,
    .describe_extra = gemv_describe_extra,
};
