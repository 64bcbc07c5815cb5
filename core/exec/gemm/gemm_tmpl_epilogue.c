/* gemm_epilogue's row (kernels/gemm_epilogue.cu): a GEMM with bias,
 * activation, residual and, on the wgmma build, a closing norm. Also what
 * only this template has: the wgmma build and its persistent variant, the
 * split of K over a cluster, and their architecture checks. */
#include <stdio.h>
#include <string.h>

#include "core/base/error.h"
#include "core/exec/gemm/gemm_template.h"
#include "core/gpu/device.h"

/* A closing norm is the wgmma build's (gemm_exec_check_arch, the template's
 * check); here only what holds for every setting. */
static int validate_epilogue(const gemm_exec_problem *p, stof_error *err) {
    int rc = gemm_validate_sizes("gemm_epilogue", p->m, p->n, p->k, err);
    if (rc)
        return rc;
    if (p->store_pre_norm && p->epi.norm == FUSION_NORM_NONE)
        return err_set(err, STOF_ERR_INVALID,
                       "gemm_epilogue: store_pre_norm without a norm (the output is the "
                       "pre-norm)");
    if (p->epi.norm != FUSION_NORM_NONE && p->weight_kn)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "gemm_epilogue: a norm runs on the wgmma build, which takes [N, K] "
                       "weights (this one is [K, N]; gemm_ln takes both)");
    return p->epi.norm != FUSION_NORM_NONE ? gemm_validate_eps("gemm_epilogue", p->eps, err)
                                           : STOF_OK;
}

static int epilogue_row_reduce(const gemm_exec_problem *p) {
    return p->epi.norm != FUSION_NORM_NONE;
}

/* ---- the wgmma build ------------------------------------------------------------- */

static int epilogue_wgmma(const gemm_exec_problem *p, const int *v, const char *arch) {
    return p->tmpl == FUSION_T_GEMM_EPILOGUE && !p->weight_kn && device_wgmma_arch(arch) &&
           stof_gemm_wgmma_shape(v[0], v[1], v[2], v[3], v[4]);
}

/* The persistent wgmma build: no split of K, no norm. */
static int epilogue_persistent(const gemm_exec_problem *p, const int *v, const char *arch) {
    return epilogue_wgmma(p, v, arch) && v[5] <= 1 && p->epi.norm == FUSION_NORM_NONE;
}

static int epilogue_check_arch(const gemm_exec_problem *p, const int *v, const char *arch,
                               stof_error *err) {
    const int norm = p->epi.norm != FUSION_NORM_NONE;
    if ((v[5] <= 1 && !norm) || epilogue_wgmma(p, v, arch))
        return STOF_OK;
    char what[32];
    snprintf(what, sizeof what, norm ? "a norm" : "SPLIT_K %d", v[5]);
    return err_set(err, STOF_ERR_UNSUPPORTED,
                   "gemm_epilogue: %s runs on the wgmma build, which needs sm_90 and [N, K] "
                   "weights (this is %s%s)",
                   what, arch, p->weight_kn ? " with [K, N] weights" : "");
}

/* A cluster of SPLIT_K blocks a tile, times N / BLOCK_N with a norm (whole
 * rows a cluster). */
static int epilogue_cluster(const gemm_exec_problem *p, const int *v) {
    return v[5] * (p->epi.norm != FUSION_NORM_NONE ? (int)(p->n / v[1]) : 1);
}

/* ---- default settings -------------------------------------------------------------- */

/* gemm_epilogue at a few hundred rows or fewer, where the wgmma build runs:
 * 64 x 32 tiles of one warpgroup, 6 stages, and K split over a cluster
 * until about 192 blocks share the weight's stream (each block keeping at
 * least two slices of K). 128 x 128 tiles would leave most SMs idle: at
 * M = 128, N = 3072 they are 24 blocks. 0 where it does not apply. */
#define GEMM_EXEC_SMALL_M 256
#define GEMM_EXEC_SMALL_M_BLOCKS 192
static int small_m_values(const gemm_exec_problem *p, const char *arch, int *v) {
    const int small[6] = {64, 32, 64, 4, 6, 1};
    if (p->m > GEMM_EXEC_SMALL_M || !arch || !epilogue_wgmma(p, small, arch))
        return 0;
    memcpy(v, small, sizeof small);
    const int64_t tiles = ((p->m + 63) / 64) * ((p->n + 31) / 32), slices = (p->k + 63) / 64;
    while (v[5] < 4 && tiles * v[5] < GEMM_EXEC_SMALL_M_BLOCKS && slices >= 4 * v[5])
        v[5] *= 2;
    return 1;
}

/* gemm_epilogue closing with a norm (the wgmma build): 64-row tiles of one
 * warpgroup at a few hundred rows or fewer (128 rows of two above), 6
 * stages (4 where the ring would not fit), the first of 128, 64 and 256
 * columns whose cluster has room, and K split over it while fewer than
 * about 192 blocks run, the cluster keeps room and every block at least
 * four slices: at M = 128, N = K = 768 that is 24 blocks of 64 x 128, K in
 * halves. 0 where no setting fits. */
static int norm_values(const gemm_exec_problem *p, int *v) {
    static const int widths[] = {128, 64, 256};
    const int64_t slices = (p->k + 63) / 64;
    const int small = p->m <= GEMM_EXEC_SMALL_M;
    for (int i = 0; i < 3; i++) {
        const int s[6] = {small ? 64 : 128, widths[i], 64, small ? 4 : 8, 6, 1};
        memcpy(v, s, sizeof s);
        if (p->n % v[1] || p->n / v[1] > STOF_GEMM_MAX_CLUSTER)
            continue;
        const int64_t tiles = p->n / v[1], blocks = (p->m + v[0] - 1) / v[0] * tiles;
        while (v[5] < 8 && blocks * v[5] < GEMM_EXEC_SMALL_M_BLOCKS &&
               tiles * v[5] * 2 <= STOF_GEMM_MAX_CLUSTER && slices >= 8 * v[5] &&
               (stof_gemm_wgmma_cols(v[0], v[1], v[3]) / 8) % (v[5] * 2) == 0)
            v[5] *= 2;
        stof_error err = {0};
        if (gemm_exec_check(p, v, GEMM_EXEC_DEFAULT_SMEM, &err) == STOF_OK)
            return 1;
        v[4] = 4;
        if (gemm_exec_check(p, v, GEMM_EXEC_DEFAULT_SMEM, &err) == STOF_OK)
            return 1;
    }
    return 0;
}

static void epilogue_defaults(const gemm_exec_problem *p, const char *arch, int *v) {
    if (p->epi.norm != FUSION_NORM_NONE ? norm_values(p, v) : small_m_values(p, arch, v))
        return;
    /* BLOCK_M, BLOCK_N, BLOCK_K, WARPS, STAGES: 128 x 128 tiles of 8 warps.
     * On sm_90 the persistent wgmma build with 64-wide slices in 3 stages
     * (97 KiB: two blocks an SM); elsewhere 64 x 32 warp tiles, 32-wide
     * slices in 3 stages (48 KiB), and small M wastes less with 64-row
     * tiles. */
    static const int hopper[6] = {128, 128, 64, 8, 3, 1};
    if (arch && epilogue_wgmma(p, hopper, arch)) {
        memcpy(v, hopper, sizeof hopper);
        return;
    }
    v[0] = p->m <= 64 ? 64 : 128;
    v[1] = 128;
    v[2] = 32;
    v[3] = p->m <= 64 ? 4 : 8;
    v[4] = 3;
    v[5] = 1;
}

/* ---- compiling and launching ---------------------------------------------------------- */

static void epilogue_defines(gemm_exec_request *r, const gemm_exec_problem *p, const int *v,
                             const char *arch) {
    gemm_request_define(r, "WEIGHT_KN", p->weight_kn != 0);
    gemm_request_define(r, "HAS_BIAS", p->epi.has_bias != 0);
    gemm_request_define(r, "ACT", (int)p->epi.act);
    gemm_request_define(r, "HAS_RESIDUAL", p->epi.has_residual != 0);
    if (epilogue_wgmma(p, v, arch))
        gemm_request_define(r, "WGMMA", 1);
    if (p->epi.norm != FUSION_NORM_NONE) {
        gemm_request_define(r, "NORM", (int)p->epi.norm);
        gemm_request_define(r, "NORM_TILES", p->n / v[1]);
        gemm_request_define(r, "STORE_PRE_NORM", p->store_pre_norm != 0);
    }
}

/* The ring, the wgmma build's slack and staging (gemm_abi.cuh). */
static size_t epilogue_smem(const gemm_exec_problem *p, const int *v) {
    return (size_t)stof_gemm_epilogue_smem(v[0], v[1], v[2], v[3], v[4], v[5],
                                           p->epi.norm != FUSION_NORM_NONE,
                                           (int)stof_dtype_size(p->dtype));
}

/* A cluster of SPLIT_K blocks a tile, with a norm a cluster of such groups a
 * row tile (x has room for 2^31). The persistent build's grid is cut to what
 * the GPU holds once the kernel is loaded (gemm_plan.c). */
static void epilogue_launch_shape(const gemm_exec_ctx *c, gemm_exec_plan *plan) {
    (void)c;
    const gemm_exec_problem *p = &plan->problem;
    const int *v = plan->values;
    plan->grid[0] = (unsigned)(gemm_ceil_div(p->m, v[0]) * v[5]);
    plan->grid[1] = (unsigned)gemm_ceil_div(p->n, v[1]);
    if (p->epi.norm != FUSION_NORM_NONE) {
        plan->grid[0] *= plan->grid[1];
        plan->grid[1] = 1;
    }
    /* the wgmma build adds a warp that issues the copies (gemm_epilogue.cu) */
    plan->block[0] = (unsigned)v[3] * 32 + (epilogue_wgmma(p, v, plan->arch) ? 32u : 0u);
}

const gemm_template gemm_template_epilogue = {
    .id = FUSION_T_GEMM_EPILOGUE,
    .kernel = STOF_GEMM_EPILOGUE_KERNEL,
    .n_name = "N",
    .validate = validate_epilogue,
    .check_arch = epilogue_check_arch,
    .row_reduce = epilogue_row_reduce,
    .defaults = epilogue_defaults,
    .defines = epilogue_defines,
    .smem = epilogue_smem,
    .launch_shape = epilogue_launch_shape,
    .cluster = epilogue_cluster,
    .wgmma = epilogue_wgmma,
    .persistent = epilogue_persistent,
    .residual_at = GEMM_RESIDUAL_AFTER_ACT,
};
