/* Plans and launches of gemm_epilogue, gemm_ln, gemm_chain, mi_chain and
 * embedding (see gemm_exec.h). The settings' feasibility is the template
 * registry's (fusion/templates.c), one place; this file adds only what is
 * particular to the kernels as written (mi_chain's register cap, the warp
 * grid of the tensor-core kernels). */
#include "core/exec/gemm/gemm_exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/gpu/device.h"
#include "core/base/error.h"

/* Dynamic shared memory a kernel gets without opting in. */

/* ---- problems --------------------------------------------------------------------- */

static const char *tmpl_name(fusion_template_id t) {
    const fusion_template *ft = fusion_template_get(t);
    return ft ? ft->name : "?";
}

static int is_ours(fusion_template_id t) {
    return t == FUSION_T_GEMM_EPILOGUE || t == FUSION_T_GEMM_LN || t == FUSION_T_GEMM_CHAIN ||
           t == FUSION_T_MI_CHAIN || t == FUSION_T_EMBEDDING;
}

/* A GEMM's sizes: M in 1..2^31-1, N and K positive multiples of 8. */
static int validate_gemm_sizes(const char *what, int64_t m, int64_t n, int64_t k,
                               stof_error *err) {
    if (m < 1 || m > INT32_MAX || n < 8 || n > INT32_MAX || k < 8 || k > INT32_MAX || n % 8 ||
        k % 8)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "%s: M = %lld, N = %lld, K = %lld: M must be in 1..2^31-1 and "
                       "N, K positive multiples of 8 (16-byte loads)",
                       what, (long long)m, (long long)n, (long long)k);
    return STOF_OK;
}

static int validate_eps(const char *what, float eps, stof_error *err) {
    if (!(isfinite(eps) && eps > 0.0f))
        return err_set(err, STOF_ERR_INVALID, "%s: eps must be positive, got %g", what,
                       (double)eps);
    return STOF_OK;
}

/* A closing norm is the wgmma build's (gemm_exec_check_arch, the template's
 * check); here only what holds for every setting. */
static int validate_gemm(const gemm_exec_problem *p, stof_error *err) {
    int rc = validate_gemm_sizes("gemm_epilogue", p->m, p->n, p->k, err);
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
    return p->epi.norm != FUSION_NORM_NONE ? validate_eps("gemm_epilogue", p->eps, err)
                                           : STOF_OK;
}

static int validate_ln(const gemm_exec_problem *p, stof_error *err) {
    int rc = validate_gemm_sizes("gemm_ln", p->m, p->n, p->k, err);
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
    return validate_eps("gemm_ln", p->eps, err);
}

static int validate_chain(const gemm_exec_problem *p, stof_error *err) {
    if (p->n2 < 8 || p->n2 > INT32_MAX || p->n2 % 8)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "gemm_chain: the output width N2 = %lld must be a positive multiple of 8",
                       (long long)p->n2);
    int rc = validate_gemm_sizes("gemm_chain (first GEMM, N = F)", p->m, p->n, p->k, err);
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

static int validate_mi(const gemm_exec_problem *p, stof_error *err) {
    if (p->m < 1 || p->n < 1 || p->n > INT32_MAX)
        return err_set(err, STOF_ERR_INVALID, "mi_chain: %lld rows of %lld elements",
                       (long long)p->m, (long long)p->n);
    if (p->epi.norm != FUSION_NORM_NONE) {
        int rc = validate_eps("mi_chain", p->eps, err);
        if (rc)
            return rc;
    }
    if (p->store_pre_norm && p->epi.norm == FUSION_NORM_NONE)
        return err_set(err, STOF_ERR_INVALID,
                       "mi_chain: store_pre_norm without a norm (the output is the pre-norm)");
    return STOF_OK;
}

static int validate_embedding(const gemm_exec_problem *p, stof_error *err) {
    /* the bad-id flag holds token + 1 in an int32 */
    if (p->m < 1 || p->m >= INT32_MAX || p->n < 1 || p->n > INT32_MAX || p->seq_len < 1 ||
        p->m % p->seq_len || p->vocab < 1)
        return err_set(err, STOF_ERR_INVALID,
                       "embedding: %lld tokens of width %lld, seq_len %d, vocab %d: tokens must "
                       "be a multiple of seq_len, below 2^31 - 1",
                       (long long)p->m, (long long)p->n, p->seq_len, p->vocab);
    return STOF_OK;
}

int gemm_exec_validate(const gemm_exec_problem *p, stof_error *err) {
    if (!is_ours(p->tmpl))
        return err_set(err, STOF_ERR_INVALID, "gemm_exec runs gemm_epilogue, gemm_ln, "
                       "gemm_chain, mi_chain and embedding, not template %d (%s)", (int)p->tmpl,
                       tmpl_name(p->tmpl));
    if (p->dtype != STOF_F16 && p->dtype != STOF_BF16)
        return err_set(err, STOF_ERR_UNSUPPORTED, "%s: dtype %s (f16 or bf16 only)",
                       tmpl_name(p->tmpl), stof_dtype_name(p->dtype));
    if ((int)p->epi.act < FUSION_ACT_NONE || p->epi.act > FUSION_ACT_RELU ||
        (int)p->epi.norm < FUSION_NORM_NONE || p->epi.norm > FUSION_NORM_RMSNORM)
        return err_set(err, STOF_ERR_INVALID, "%s: unknown activation %d or norm %d",
                       tmpl_name(p->tmpl), (int)p->epi.act, (int)p->epi.norm);
    switch (p->tmpl) {
    case FUSION_T_GEMM_EPILOGUE:
        return validate_gemm(p, err);
    case FUSION_T_GEMM_LN:
        return validate_ln(p, err);
    case FUSION_T_GEMM_CHAIN:
        return validate_chain(p, err);
    case FUSION_T_MI_CHAIN:
        return validate_mi(p, err);
    default:
        return validate_embedding(p, err);
    }
}

void gemm_exec_dims(const gemm_exec_problem *p, fusion_dims *d) {
    memset(d, 0, sizeof *d);
    d->m = p->m;
    d->n = p->n;
    d->k = p->k;
    d->n2 = p->tmpl == FUSION_T_GEMM_CHAIN ? p->n2 : 0;
    d->elem_bytes = (int)stof_dtype_size(p->dtype);
    d->row_reduce = p->tmpl == FUSION_T_GEMM_LN ||
                    ((p->tmpl == FUSION_T_MI_CHAIN || p->tmpl == FUSION_T_GEMM_EPILOGUE) &&
                     p->epi.norm != FUSION_NORM_NONE);
}

/* mi_chain values: ROWS, THREADS, VEC. Elements a thread holds. */
static int64_t mi_per_thread(int64_t n, const int *v) {
    int64_t tpr = v[1] / v[0], chunks = n / v[2];
    return (chunks + tpr - 1) / tpr * v[2];
}

int gemm_exec_check(const gemm_exec_problem *p, const int *values, int smem_limit,
                    stof_error *err) {
    const fusion_template *t = fusion_template_get(p->tmpl);
    if (!is_ours(p->tmpl))
        return gemm_exec_validate(p, err);
    fusion_dims d;
    gemm_exec_dims(p, &d);
    int rc = fusion_template_check(t, &d, values, smem_limit, err);
    if (rc)
        return rc;
    if (p->tmpl == FUSION_T_GEMM_LN || p->tmpl == FUSION_T_GEMM_CHAIN) {
        /* ROWS | BLOCK_M, BLOCK_N | BLOCK_F, BLOCK_K, WARPS: the first GEMM's tile */
        if (!stof_gemm_warps_m(values[0], values[1], values[3]))
            return err_set(err, STOF_ERR_UNSUPPORTED,
                           "%s: %d warps cannot split a %dx%d tile into 16x16 pieces",
                           t->name, values[3], values[0], values[1]);
    }
    if (p->tmpl == FUSION_T_MI_CHAIN) {
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
    }
    return STOF_OK;
}

size_t gemm_exec_smem(const gemm_exec_problem *p, const int *v) {
    const size_t e = stof_dtype_size(p->dtype);
    /* the ring of STAGES x (rows + columns) x BLOCK_K operand tiles */
    const size_t ring = (size_t)stof_gemm_ring_bytes(v[0], v[1], v[2], v[4], (int)e);
    switch (p->tmpl) {
    case FUSION_T_GEMM_EPILOGUE: /* + the wgmma build's alignment and staging */
        return (size_t)stof_gemm_epilogue_smem(v[0], v[1], v[2], v[3], v[4], v[5],
                                               p->epi.norm != FUSION_NORM_NONE, (int)e);
    case FUSION_T_GEMM_LN: /* + the fp32 rows */
        return ring + (size_t)v[0] * (size_t)p->n * sizeof(float);
    case FUSION_T_GEMM_CHAIN: /* + the activated chunk, + two slabs of w2 */
        return ring + (size_t)v[0] * (size_t)v[1] * e +
               2 * (size_t)v[1] * STOF_CHAIN_W2_COLS * e;
    default:
        return 0;
    }
}

/* The largest of 8, 4, 2, 1 dividing n. */
static int widest_vec(int64_t n) {
    int v = 8;
    while (n % v)
        v /= 2;
    return v;
}

/* The first of candidates[from..n-1] that fits an H100 / H200 (227 KiB of
 * shared memory a block), else the last. */
#define GEMM_EXEC_DEFAULT_SMEM (227 * 1024)
static void first_feasible(const gemm_exec_problem *p, const int (*candidates)[5], int n,
                           int from, int *v) {
    for (int i = from; i < n; i++) {
        memcpy(v, candidates[i], sizeof candidates[i]);
        stof_error err = {0};
        if (gemm_exec_check(p, v, GEMM_EXEC_DEFAULT_SMEM, &err) == STOF_OK)
            return;
    }
}

/* gemm_epilogue at a few hundred rows or fewer, where the wgmma build runs:
 * 64 x 32 tiles of one warpgroup, 6 stages, and K split over a cluster
 * until about 192 blocks share the weight's stream (each block keeping at
 * least two slices of K). 128 x 128 tiles would leave most SMs idle: at
 * M = 128, N = 3072 they are 24 blocks. 0 where it does not apply. */
#define GEMM_EXEC_SMALL_M 256
#define GEMM_EXEC_SMALL_M_BLOCKS 192
static int small_m_values(const gemm_exec_problem *p, const char *arch, int *v) {
    const int small[6] = {64, 32, 64, 4, 6, 1};
    if (p->m > GEMM_EXEC_SMALL_M || !arch || !gemm_exec_wgmma(p, small, arch))
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

void gemm_exec_default_values(const gemm_exec_problem *p, const char *arch, int *v) {
    /* gemm_ln: ROWS, BLOCK_N, BLOCK_K, WARPS, STAGES. Many rows: 32-row
     * blocks of 8 warps (16 x 64 warp tiles... as the warp grid picks);
     * fewer rows: 16-row blocks, so that more blocks share the GPU; then
     * shallower rings while the fp32 rows leave too little room. */
    static const int ln[][5] = {{32, 128, 64, 8, 3}, {32, 128, 32, 8, 2}, {16, 128, 64, 4, 3},
                                {16, 128, 32, 4, 2}, {16, 64, 32, 4, 2}};
    /* gemm_chain: BLOCK_M, BLOCK_F, BLOCK_K, WARPS, STAGES. 16 rows a block
     * (more blocks at the small M it is for) unless M is large, 128-feature
     * chunks, 8 warps: 16 x 16 warp tiles in the first GEMM, 8 or 16 output
     * columns a warp of each w2 slab. */
    static const int chain[][5] = {{32, 128, 64, 8, 3}, {16, 128, 64, 8, 3}, {16, 64, 32, 4, 2}};
    memset(v, 0, FUSION_MAX_PARAMS * sizeof *v);
    switch (p->tmpl) {
    case FUSION_T_GEMM_LN:
        first_feasible(p, ln, 5, p->m > 2048 ? 0 : 2, v);
        break;
    case FUSION_T_GEMM_CHAIN:
        first_feasible(p, chain, 3, p->m >= 4096 ? 0 : 1, v);
        break;
    case FUSION_T_GEMM_EPILOGUE:
        if (p->epi.norm != FUSION_NORM_NONE ? norm_values(p, v) : small_m_values(p, arch, v))
            break;
        /* BLOCK_M, BLOCK_N, BLOCK_K, WARPS, STAGES: 128 x 128 tiles of 8 warps.
         * On sm_90 the persistent wgmma build with 64-wide slices in 3 stages
         * (97 KiB: two blocks an SM); elsewhere 64 x 32 warp tiles, 32-wide
         * slices in 3 stages (48 KiB), and small M wastes less with 64-row
         * tiles. */
        static const int hopper[6] = {128, 128, 64, 8, 3, 1};
        if (arch && gemm_exec_wgmma(p, hopper, arch)) {
            memcpy(v, hopper, sizeof hopper);
            break;
        }
        v[0] = p->m <= 64 ? 64 : 128;
        v[1] = 128;
        v[2] = 32;
        v[3] = p->m <= 64 ? 4 : 8;
        v[4] = 3;
        v[5] = 1;
        break;
    case FUSION_T_MI_CHAIN:
        /* ROWS, THREADS, VEC: a warp a row (4 rows a block) while a thread
         * holds at most 32 elements, else whole blocks a row */
        v[2] = widest_vec(p->n);
        v[0] = 4;
        v[1] = 128;
        if (mi_per_thread(p->n, v) > 32) {
            v[0] = 1;
            v[1] = 256;
            if (mi_per_thread(p->n, v) > 32)
                v[1] = 512;
        }
        break;
    case FUSION_T_EMBEDDING:
        v[0] = 256;
        v[1] = widest_vec(p->n);
        break;
    default:
        break;
    }
}

const char *gemm_exec_kernel_name(fusion_template_id t) {
    switch (t) {
    case FUSION_T_GEMM_EPILOGUE:
        return STOF_GEMM_EPILOGUE_KERNEL;
    case FUSION_T_GEMM_LN:
        return STOF_GEMM_LN_KERNEL;
    case FUSION_T_GEMM_CHAIN:
        return STOF_GEMM_CHAIN_KERNEL;
    case FUSION_T_MI_CHAIN:
        return STOF_MI_CHAIN_KERNEL;
    case FUSION_T_EMBEDDING:
        return STOF_EMBEDDING_KERNEL;
    default:
        return NULL;
    }
}

static void add_opt(gemm_exec_request *r, const char *name, long long value) {
    if (r->req.n_options < GEMM_EXEC_MAX_OPTS) {
        snprintf(r->opts[r->req.n_options], sizeof r->opts[0], "-D%s=%lld", name, value);
        r->req.options[r->req.n_options] = r->opts[r->req.n_options];
        r->req.n_options++;
    }
}

int gemm_exec_wgmma(const gemm_exec_problem *p, const int *v, const char *arch) {
    return p->tmpl == FUSION_T_GEMM_EPILOGUE && !p->weight_kn && device_wgmma_arch(arch) &&
           stof_gemm_wgmma_shape(v[0], v[1], v[2], v[3], v[4]);
}

int gemm_exec_check_arch(const gemm_exec_problem *p, const int *v, const char *arch,
                         stof_error *err) {
    const int norm = p->epi.norm != FUSION_NORM_NONE;
    if (p->tmpl != FUSION_T_GEMM_EPILOGUE || (v[5] <= 1 && !norm) ||
        gemm_exec_wgmma(p, v, arch))
        return STOF_OK;
    char what[32];
    snprintf(what, sizeof what, norm ? "a norm" : "SPLIT_K %d", v[5]);
    return err_set(err, STOF_ERR_UNSUPPORTED,
                   "gemm_epilogue: %s runs on the wgmma build, which needs sm_90 and [N, K] "
                   "weights (this is %s%s)",
                   what, arch, p->weight_kn ? " with [K, N] weights" : "");
}

int gemm_exec_cluster(const gemm_exec_problem *p, const int *v) {
    if (p->tmpl != FUSION_T_GEMM_EPILOGUE)
        return 1;
    return v[5] * (p->epi.norm != FUSION_NORM_NONE ? (int)(p->n / v[1]) : 1);
}

void gemm_exec_request_init(gemm_exec_request *r, const gemm_exec_problem *p, const int *values,
                            const char *arch) {
    memset(r, 0, sizeof *r);
    const int wgmma = gemm_exec_wgmma(p, values, arch);
    snprintf(r->arch, sizeof r->arch, "%s%s", arch, wgmma ? "a" : "");
    r->req.arch = r->arch;
    const fusion_template *t = fusion_template_get(p->tmpl);
    r->req.source = t ? t->kernel : "?";
    for (int i = 0; t && i < t->n_params; i++)
        add_opt(r, t->params[i].name, values[i]);
    add_opt(r, "STOF_DTYPE", (int)p->dtype);
    switch (p->tmpl) {
    case FUSION_T_GEMM_EPILOGUE:
        add_opt(r, "WEIGHT_KN", p->weight_kn != 0);
        add_opt(r, "HAS_BIAS", p->epi.has_bias != 0);
        add_opt(r, "ACT", (int)p->epi.act);
        add_opt(r, "HAS_RESIDUAL", p->epi.has_residual != 0);
        if (wgmma)
            add_opt(r, "WGMMA", 1);
        if (p->epi.norm != FUSION_NORM_NONE) {
            add_opt(r, "NORM", (int)p->epi.norm);
            add_opt(r, "NORM_TILES", p->n / values[1]);
            add_opt(r, "STORE_PRE_NORM", p->store_pre_norm != 0);
        }
        break;
    case FUSION_T_GEMM_LN:
        add_opt(r, "ROW_N", p->n);
        add_opt(r, "WEIGHT_KN", p->weight_kn != 0);
        add_opt(r, "HAS_BIAS", p->epi.has_bias != 0);
        add_opt(r, "HAS_RESIDUAL", p->epi.has_residual != 0);
        add_opt(r, "NORM", (int)p->epi.norm);
        add_opt(r, "STORE_PRE_NORM", p->store_pre_norm != 0);
        break;
    case FUSION_T_GEMM_CHAIN:
        add_opt(r, "OUT_N", p->n2);
        add_opt(r, "WEIGHT_KN", p->weight_kn != 0);
        add_opt(r, "HAS_BIAS1", p->epi.has_bias != 0);
        add_opt(r, "ACT", (int)p->epi.act);
        add_opt(r, "HAS_BIAS2", p->epi2.has_bias != 0);
        add_opt(r, "HAS_RESIDUAL", p->epi2.has_residual != 0);
        break;
    case FUSION_T_MI_CHAIN:
        add_opt(r, "ROW_N", p->n);
        add_opt(r, "HAS_BIAS", p->epi.has_bias != 0);
        add_opt(r, "HAS_RESIDUAL", p->epi.has_residual != 0);
        add_opt(r, "ACT", (int)p->epi.act);
        add_opt(r, "NORM", (int)p->epi.norm);
        add_opt(r, "STORE_PRE_NORM", p->store_pre_norm != 0);
        break;
    case FUSION_T_EMBEDDING:
        add_opt(r, "HAS_POS", p->has_position != 0);
        add_opt(r, "HAS_TYPE", p->has_type != 0);
        break;
    default:
        break;
    }
}

/* ---- the GPU context ----------------------------------------------------------------- */

int gemm_exec_ctx_create(int ordinal, gemm_exec_ctx **out, stof_error *err) {
    return gpu_ctx_create(ordinal, out, err);
}

void gemm_exec_ctx_free(gemm_exec_ctx *c) {
    gpu_ctx_free(c);
}

/* The loaded kernel of a request (gpu_ctx_function). */
static int get_function(gemm_exec_ctx *c, const gemm_exec_request *r, const char *name,
                        size_t smem, CUfunction *out, stof_error *err) {
    gpu_module *m;
    int rc = gpu_ctx_function(c, &r->req, name, smem, &m, err);
    if (!rc)
        *out = m->func;
    return rc;
}

/* ---- plans ---------------------------------------------------------------------------- */

static int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

static void set_launch_shape(const gemm_exec_ctx *c, gemm_exec_plan *plan) {
    const gemm_exec_problem *p = &plan->problem;
    const int *v = plan->values;
    plan->grid[1] = plan->grid[2] = plan->block[1] = plan->block[2] = 1;
    switch (p->tmpl) {
    case FUSION_T_GEMM_EPILOGUE: /* a cluster of SPLIT_K blocks a tile, with a norm a
                                  * cluster of such groups a row tile (x has room for 2^31) */
        plan->grid[0] = (unsigned)(ceil_div(p->m, v[0]) * v[5]);
        plan->grid[1] = (unsigned)ceil_div(p->n, v[1]);
        if (p->epi.norm != FUSION_NORM_NONE) {
            plan->grid[0] *= plan->grid[1];
            plan->grid[1] = 1;
        }
        /* the wgmma build adds a warp that issues the copies (gemm_epilogue.cu) */
        plan->block[0] = (unsigned)v[3] * 32 + (gemm_exec_wgmma(p, v, plan->arch) ? 32u : 0u);
        break;
    case FUSION_T_GEMM_LN:    /* ROWS whole rows a block */
    case FUSION_T_GEMM_CHAIN: /* BLOCK_M rows a block */
        plan->grid[0] = (unsigned)ceil_div(p->m, v[0]);
        plan->block[0] = (unsigned)v[3] * 32;
        break;
    case FUSION_T_MI_CHAIN:
        plan->grid[0] = (unsigned)ceil_div(p->m, v[0]);
        plan->block[0] = (unsigned)v[1];
        break;
    default: {
        /* a grid-stride loop: enough blocks to fill the GPU a few times over */
        int64_t blocks = ceil_div(p->m * (p->n / v[1]), v[0]);
        int64_t cap = (int64_t)(c->info.sm_count > 0 ? c->info.sm_count : 132) * 16;
        plan->grid[0] = (unsigned)(blocks < cap ? blocks : cap);
        plan->block[0] = (unsigned)v[0];
        break;
    }
    }
}

int gemm_exec_persistent(const gemm_exec_problem *p, const int *v, const char *arch) {
    return gemm_exec_wgmma(p, v, arch) && v[5] <= 1 && p->epi.norm == FUSION_NORM_NONE;
}

/* A block (cluster 1) or a cluster of the plan's blocks that the GPU cannot
 * hold: the error saying so. */
static int does_not_fit(const gemm_exec_plan *plan, int cluster, stof_error *err) {
    char what[48] = "a block";
    if (cluster > 1)
        snprintf(what, sizeof what, "a cluster of %d blocks", cluster);
    return err_set(err, STOF_ERR_UNSUPPORTED,
                   "%s: %s of %u threads with %zu bytes of shared memory each does not fit on "
                   "this GPU",
                   tmpl_name(plan->problem.tmpl), what, plan->block[0], plan->smem);
}

/* The persistent build's grid: as many blocks as the GPU holds at once (the
 * driver's occupancy for this kernel, block size and shared memory), at
 * most one a tile; each block loops over its tiles. */
static int persistent_grid(gemm_exec_ctx *c, gemm_exec_plan *plan, stof_error *err) {
    int per_sm = 0, rc;
    if ((rc = cuda_check(c->drv,
                         c->drv->OccupancyMaxActiveBlocksPerMultiprocessor(
                             &per_sm, plan->func, (int)plan->block[0], plan->smem),
                         "cuOccupancyMaxActiveBlocksPerMultiprocessor", err)))
        return rc;
    if (per_sm < 1)
        return does_not_fit(plan, 1, err);
    const int64_t tiles = (int64_t)plan->grid[0] * plan->grid[1];
    const int64_t resident = (int64_t)per_sm * (c->info.sm_count > 0 ? c->info.sm_count : 1);
    plan->grid[0] = (unsigned)(tiles < resident ? tiles : resident);
    plan->grid[1] = 1;
    return STOF_OK;
}

/* A cluster of more than 8 blocks needs sm_90's non-portable sizes, and
 * one of any size must fit on the GPU (the blocks of a cluster share one GPC):
 * asked of the driver, so that a setting that cannot launch fails here. */
static int cluster_fits(gemm_exec_ctx *c, const gemm_exec_plan *plan, int cluster,
                        stof_error *err) {
    int rc;
    if (cluster > 8 &&
        (rc = cuda_check(c->drv,
                         c->drv->FuncSetAttribute(
                             plan->func, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                         "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)", err)))
        return rc;
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = (unsigned)cluster;
    attr.value.clusterDim.y = attr.value.clusterDim.z = 1;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = plan->grid[0];
    cfg.gridDimY = plan->grid[1];
    cfg.gridDimZ = plan->grid[2];
    cfg.blockDimX = plan->block[0];
    cfg.blockDimY = plan->block[1];
    cfg.blockDimZ = plan->block[2];
    cfg.sharedMemBytes = (unsigned)plan->smem;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if ((rc = cuda_check(c->drv, c->drv->OccupancyMaxActiveClusters(&clusters, plan->func, &cfg),
                         "cuOccupancyMaxActiveClusters", err)))
        return rc;
    return clusters < 1 ? does_not_fit(plan, cluster, err) : STOF_OK;
}

int gemm_exec_plan_create(gemm_exec_ctx *c, const gemm_exec_problem *p, const int *values,
                          gemm_exec_plan **out, stof_error *err) {
    *out = NULL;
    int rc = gemm_exec_validate(p, err);
    if (rc)
        return rc;
    gemm_exec_plan *plan = err_calloc(1, sizeof *plan, err);
    if (!plan)
        return STOF_ERR_NOMEM;
    plan->problem = *p;
    if (values)
        memcpy(plan->values, values, (size_t)fusion_template_get(p->tmpl)->n_params *
                                         sizeof *values);
    else
        gemm_exec_default_values(p, c->arch, plan->values);
    snprintf(plan->arch, sizeof plan->arch, "%s", c->arch);
    if ((rc = gemm_exec_check_arch(p, plan->values, c->arch, err)) ||
        (rc = gemm_exec_check(p, plan->values, c->info.smem_per_block_optin, err)) ||
        (rc = cuda_check(c->drv, c->drv->CtxSetCurrent(c->cu), "cuCtxSetCurrent", err))) {
        free(plan);
        return rc;
    }
    plan->smem = gemm_exec_smem(p, plan->values);
    set_launch_shape(c, plan);
    gemm_exec_request r;
    gemm_exec_request_init(&r, p, plan->values, c->arch);
    rc = get_function(c, &r, gemm_exec_kernel_name(p->tmpl), plan->smem, &plan->func, err);
    const int cluster = gemm_exec_cluster(p, plan->values);
    if (!rc && cluster > 1)
        rc = cluster_fits(c, plan, cluster, err);
    if (!rc && gemm_exec_persistent(p, plan->values, c->arch))
        rc = persistent_grid(c, plan, err);
    if (!rc && p->tmpl == FUSION_T_EMBEDDING) {
        rc = cuda_check(c->drv, c->drv->MemAlloc(&plan->d_error, sizeof(int32_t)),
                        "cuMemAlloc(embedding error flag)", err);
        const int32_t zero = 0;
        if (!rc)
            rc = cuda_check(c->drv, c->drv->MemcpyHtoD(plan->d_error, &zero, sizeof zero),
                            "cuMemcpyHtoD(embedding error flag)", err);
    }
    if (rc) {
        gemm_exec_plan_free(c, plan);
        return rc;
    }
    *out = plan;
    return STOF_OK;
}

void gemm_exec_plan_free(gemm_exec_ctx *c, gemm_exec_plan *plan) {
    if (!plan)
        return;
    if (plan->d_error) {
        c->drv->CtxSetCurrent(c->cu);
        c->drv->MemFree(plan->d_error);
    }
    free(plan);
}

static const char *act_name(fusion_act a) {
    static const char *const names[] = {"", " gelu", " gelu_tanh", " relu"};
    return (int)a >= 0 && a <= FUSION_ACT_RELU ? names[a] : " ?";
}

size_t gemm_exec_plan_describe(const gemm_exec_plan *plan, char *buf, size_t n) {
    const gemm_exec_problem *p = &plan->problem;
    const fusion_template *t = fusion_template_get(p->tmpl);
    char setting[160];
    int len = 0;
    setting[0] = '\0';
    for (int i = 0; i < t->n_params && len >= 0 && (size_t)len < sizeof setting; i++)
        len += snprintf(setting + len, sizeof setting - (size_t)len, "%s%s=%d", i ? " " : "",
                        t->params[i].name, plan->values[i]);
    /* the ops in the order the kernel applies them */
    const int add_first = p->tmpl == FUSION_T_MI_CHAIN || p->tmpl == FUSION_T_GEMM_LN;
    const int chain = p->tmpl == FUSION_T_GEMM_CHAIN;
    char second[64] = "";
    if (chain)
        snprintf(second, sizeof second, " | gemm N2=%lld%s%s", (long long)p->n2,
                 p->epi2.has_bias ? " bias" : "", p->epi2.has_residual ? " add" : "");
    static const char *const norms[] = {"", " layernorm", " rmsnorm"};
    int k = snprintf(buf, n,
                     "%s %s M=%lld %s=%lld K=%lld%s%s%s%s%s%s%s%s%s [%s] smem=%zuB "
                     "grid=%ux%ux%u block=%u %s%s",
                     t->name, stof_dtype_name(p->dtype), (long long)p->m, chain ? "F" : "N",
                     (long long)p->n, (long long)p->k, p->weight_kn ? " w[K,N]" : "",
                     p->epi.has_bias ? " bias" : "",
                     add_first && p->epi.has_residual ? " add" : "", act_name(p->epi.act),
                     p->tmpl == FUSION_T_GEMM_EPILOGUE && p->epi.has_residual ? " add" : "",
                     norms[p->epi.norm], p->store_pre_norm ? " +pre_norm" : "",
                     p->tmpl == FUSION_T_EMBEDDING
                         ? (p->has_position ? (p->has_type ? " pos type" : " pos")
                                            : (p->has_type ? " type" : ""))
                         : "",
                     second, setting, plan->smem, plan->grid[0], plan->grid[1], plan->grid[2],
                     plan->block[0], plan->arch,
                     gemm_exec_wgmma(p, plan->values, plan->arch) ? " wgmma" : "");
    return k < 0 ? 0 : (size_t)k;
}

/* ---- argument blocks -------------------------------------------------------------------- */

/* A tensor the kernel reads or writes: present, 16-byte aligned, with a row
 * stride (0 = row_len) that is a multiple of 8 and at least row_len. */
static int check_tensor(const char *what, const char *name, CUdeviceptr ptr, int64_t *stride,
                        int64_t row_len, stof_error *err) {
    if (*stride == 0)
        *stride = row_len;
    if (!ptr || ptr % 16 || *stride % 8 || *stride < row_len)
        return err_set(err, STOF_ERR_INVALID,
                       "%s: %s must be a 16-byte aligned device pointer with a row stride that "
                       "is a multiple of 8 elements and at least %lld (pointer 0x%llx, stride "
                       "%lld)",
                       what, name, (long long)row_len, (unsigned long long)ptr,
                       (long long)*stride);
    return STOF_OK;
}

/* A vector or table read whole-row at a time: present and 16-byte aligned. */
static int check_ptr(const char *what, const char *name, CUdeviceptr ptr, stof_error *err) {
    if (!ptr || ptr % 16)
        return err_set(err, STOF_ERR_INVALID,
                       "%s: %s must be a 16-byte aligned device pointer (got 0x%llx)", what, name,
                       (unsigned long long)ptr);
    return STOF_OK;
}

static int wrong_plan(const gemm_exec_plan *plan, fusion_template_id want, stof_error *err) {
    if (plan->problem.tmpl == want)
        return STOF_OK;
    return err_set(err, STOF_ERR_INVALID, "a %s plan launched as %s",
                   tmpl_name(plan->problem.tmpl), tmpl_name(want));
}

#define PTR(d) ((void *)(uintptr_t)(d))

int gemm_exec_gemm_args(const gemm_exec_plan *plan, const gemm_exec_gemm_tensors *t,
                        stof_gemm_args *a, stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    const char *what = "gemm_epilogue";
    gemm_exec_gemm_tensors s = *t;
    const int norm = p->epi.norm != FUSION_NORM_NONE;
    const int layernorm = p->epi.norm == FUSION_NORM_LAYERNORM;
    int rc;
    memset(a, 0, sizeof *a);
    if ((rc = wrong_plan(plan, FUSION_T_GEMM_EPILOGUE, err)) ||
        (rc = check_tensor(what, "x", s.x, &s.x_row_stride, p->k, err)) ||
        (rc = check_tensor(what, "w", s.w, &s.w_row_stride, p->weight_kn ? p->n : p->k, err)) ||
        (rc = check_tensor(what, "y", s.y, &s.y_row_stride, p->n, err)) ||
        (p->epi.has_bias && (rc = check_ptr(what, "bias", s.bias, err))) ||
        (p->epi.has_residual &&
         (rc = check_tensor(what, "residual", s.residual, &s.r_row_stride, p->n, err))) ||
        (norm && (rc = check_ptr(what, "gamma", s.gamma, err))) ||
        (layernorm && (rc = check_ptr(what, "beta", s.beta, err))) ||
        (p->store_pre_norm &&
         (rc = check_tensor(what, "pre_norm", s.pre_norm, &s.p_row_stride, p->n, err))))
        return rc;
    a->x = PTR(s.x);
    a->w = PTR(s.w);
    a->bias = p->epi.has_bias ? PTR(s.bias) : NULL;
    a->residual = p->epi.has_residual ? PTR(s.residual) : NULL;
    a->gamma = norm ? PTR(s.gamma) : NULL;
    a->beta = layernorm ? PTR(s.beta) : NULL;
    a->y = PTR(s.y);
    a->pre_norm = p->store_pre_norm ? PTR(s.pre_norm) : NULL;
    a->x_row_stride = s.x_row_stride;
    a->w_row_stride = s.w_row_stride;
    a->r_row_stride = p->epi.has_residual ? s.r_row_stride : 0;
    a->y_row_stride = s.y_row_stride;
    a->p_row_stride = p->store_pre_norm ? s.p_row_stride : 0;
    a->m = (int32_t)p->m;
    a->n = (int32_t)p->n;
    a->k = (int32_t)p->k;
    a->eps = norm ? p->eps : 0.0f;
    return STOF_OK;
}

int gemm_exec_ln_args(const gemm_exec_plan *plan, const gemm_exec_ln_tensors *t,
                      stof_gemm_ln_args *a, stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    const char *what = "gemm_ln";
    gemm_exec_ln_tensors s = *t;
    const int layernorm = p->epi.norm == FUSION_NORM_LAYERNORM;
    int rc;
    memset(a, 0, sizeof *a);
    if ((rc = wrong_plan(plan, FUSION_T_GEMM_LN, err)) ||
        (rc = check_tensor(what, "x", s.x, &s.x_row_stride, p->k, err)) ||
        (rc = check_tensor(what, "w", s.w, &s.w_row_stride, p->weight_kn ? p->n : p->k, err)) ||
        (rc = check_tensor(what, "y", s.y, &s.y_row_stride, p->n, err)) ||
        (p->epi.has_bias && (rc = check_ptr(what, "bias", s.bias, err))) ||
        (p->epi.has_residual &&
         (rc = check_tensor(what, "residual", s.residual, &s.r_row_stride, p->n, err))) ||
        (rc = check_ptr(what, "gamma", s.gamma, err)) ||
        (layernorm && (rc = check_ptr(what, "beta", s.beta, err))) ||
        (p->store_pre_norm &&
         (rc = check_tensor(what, "pre_norm", s.pre_norm, &s.p_row_stride, p->n, err))))
        return rc;
    a->x = PTR(s.x);
    a->w = PTR(s.w);
    a->bias = p->epi.has_bias ? PTR(s.bias) : NULL;
    a->residual = p->epi.has_residual ? PTR(s.residual) : NULL;
    a->gamma = PTR(s.gamma);
    a->beta = layernorm ? PTR(s.beta) : NULL;
    a->y = PTR(s.y);
    a->pre_norm = p->store_pre_norm ? PTR(s.pre_norm) : NULL;
    a->x_row_stride = s.x_row_stride;
    a->w_row_stride = s.w_row_stride;
    a->r_row_stride = p->epi.has_residual ? s.r_row_stride : 0;
    a->y_row_stride = s.y_row_stride;
    a->p_row_stride = p->store_pre_norm ? s.p_row_stride : 0;
    a->eps = p->eps;
    a->m = (int32_t)p->m;
    a->n = (int32_t)p->n;
    a->k = (int32_t)p->k;
    return STOF_OK;
}

int gemm_exec_chain_args(const gemm_exec_plan *plan, const gemm_exec_chain_tensors *t,
                         stof_gemm_chain_args *a, stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    const char *what = "gemm_chain";
    gemm_exec_chain_tensors s = *t;
    const int kn = p->weight_kn != 0;
    int rc;
    memset(a, 0, sizeof *a);
    if ((rc = wrong_plan(plan, FUSION_T_GEMM_CHAIN, err)) ||
        (rc = check_tensor(what, "x", s.x, &s.x_row_stride, p->k, err)) ||
        (rc = check_tensor(what, "w1", s.w1, &s.w1_row_stride, kn ? p->n : p->k, err)) ||
        (rc = check_tensor(what, "w2", s.w2, &s.w2_row_stride, kn ? p->n2 : p->n, err)) ||
        (rc = check_tensor(what, "y", s.y, &s.y_row_stride, p->n2, err)) ||
        (p->epi.has_bias && (rc = check_ptr(what, "b1", s.b1, err))) ||
        (p->epi2.has_bias && (rc = check_ptr(what, "b2", s.b2, err))) ||
        (p->epi2.has_residual &&
         (rc = check_tensor(what, "residual", s.residual, &s.r_row_stride, p->n2, err))))
        return rc;
    a->x = PTR(s.x);
    a->w1 = PTR(s.w1);
    a->b1 = p->epi.has_bias ? PTR(s.b1) : NULL;
    a->w2 = PTR(s.w2);
    a->b2 = p->epi2.has_bias ? PTR(s.b2) : NULL;
    a->residual = p->epi2.has_residual ? PTR(s.residual) : NULL;
    a->y = PTR(s.y);
    a->x_row_stride = s.x_row_stride;
    a->w1_row_stride = s.w1_row_stride;
    a->w2_row_stride = s.w2_row_stride;
    a->r_row_stride = p->epi2.has_residual ? s.r_row_stride : 0;
    a->y_row_stride = s.y_row_stride;
    a->m = (int32_t)p->m;
    a->k = (int32_t)p->k;
    a->f = (int32_t)p->n;
    a->n = (int32_t)p->n2;
    return STOF_OK;
}

int gemm_exec_mi_args(const gemm_exec_plan *plan, const gemm_exec_mi_tensors *t, stof_mi_args *a,
                      stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    const char *what = "mi_chain";
    gemm_exec_mi_tensors s = *t;
    const int norm = p->epi.norm != FUSION_NORM_NONE;
    int rc;
    memset(a, 0, sizeof *a);
    if ((rc = wrong_plan(plan, FUSION_T_MI_CHAIN, err)) ||
        (rc = check_tensor(what, "x", s.x, &s.x_row_stride, p->n, err)) ||
        (rc = check_tensor(what, "y", s.y, &s.y_row_stride, p->n, err)) ||
        (p->epi.has_bias && (rc = check_ptr(what, "bias", s.bias, err))) ||
        (p->epi.has_residual &&
         (rc = check_tensor(what, "residual", s.residual, &s.r_row_stride, p->n, err))) ||
        (norm && (rc = check_ptr(what, "gamma", s.gamma, err))) ||
        (p->epi.norm == FUSION_NORM_LAYERNORM && (rc = check_ptr(what, "beta", s.beta, err))) ||
        (p->store_pre_norm &&
         (rc = check_tensor(what, "pre_norm", s.pre_norm, &s.p_row_stride, p->n, err))))
        return rc;
    a->x = PTR(s.x);
    a->bias = p->epi.has_bias ? PTR(s.bias) : NULL;
    a->residual = p->epi.has_residual ? PTR(s.residual) : NULL;
    a->gamma = norm ? PTR(s.gamma) : NULL;
    a->beta = p->epi.norm == FUSION_NORM_LAYERNORM ? PTR(s.beta) : NULL;
    a->y = PTR(s.y);
    a->pre_norm = p->store_pre_norm ? PTR(s.pre_norm) : NULL;
    a->rows = p->m;
    a->x_row_stride = s.x_row_stride;
    a->r_row_stride = p->epi.has_residual ? s.r_row_stride : 0;
    a->y_row_stride = s.y_row_stride;
    a->p_row_stride = p->store_pre_norm ? s.p_row_stride : 0;
    a->eps = p->eps;
    return STOF_OK;
}

int gemm_exec_embed_args(const gemm_exec_plan *plan, const gemm_exec_embed_tensors *t,
                         stof_embed_args *a, stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    const char *what = "embedding";
    int rc;
    memset(a, 0, sizeof *a);
    if ((rc = wrong_plan(plan, FUSION_T_EMBEDDING, err)) ||
        (rc = check_ptr(what, "ids", t->ids, err)) ||
        (rc = check_ptr(what, "word", t->word, err)) ||
        (rc = check_ptr(what, "out", t->out, err)) ||
        (p->has_position && (rc = check_ptr(what, "pos", t->pos, err))) ||
        (p->has_type && (rc = check_ptr(what, "type", t->type, err))))
        return rc;
    if (!plan->d_error)
        return err_set(err, STOF_ERR_INVALID, "embedding: the plan has no error flag");
    a->ids = (const int32_t *)PTR(t->ids);
    a->word = PTR(t->word);
    a->pos = p->has_position ? PTR(t->pos) : NULL;
    a->type = p->has_type ? PTR(t->type) : NULL;
    a->out = PTR(t->out);
    a->error = (int32_t *)PTR(plan->d_error);
    a->tokens = p->m;
    a->seq_len = p->seq_len;
    a->hidden = (int32_t)p->n;
    a->vocab = p->vocab;
    return STOF_OK;
}

/* ---- launching ------------------------------------------------------------------------- */

static int launch(gemm_exec_ctx *c, const gemm_exec_plan *plan, void *args, CUstream s,
                  stof_error *err) {
    void *params[] = {args};
    char what[64];
    snprintf(what, sizeof what, "cuLaunchKernel(%s)", tmpl_name(plan->problem.tmpl));
    return cuda_launch_cluster(c->drv, plan->func, plan->grid, plan->block,
                               (unsigned)plan->smem, s, params, c->pdl,
                               (unsigned)gemm_exec_cluster(&plan->problem, plan->values), what,
                               err);
}

/* A tensor map of the wgmma build (gemm_abi.cuh): rows of `cols` 16-bit
 * elements row_stride apart, boxes of box_cols x box_rows in the swizzle of
 * box_cols' 128 or 64 bytes; loads past the tensor read zeros, stores past
 * it are dropped. */
static int encode_map(const cuda_driver *drv, const char *name, const void *ptr, int64_t rows,
                      int64_t cols, int64_t row_stride, int box_cols, int box_rows,
                      stof_attn_tmap *map, stof_error *err) {
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)row_stride * 2};
    const cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows}, unit[2] = {1, 1};
    _Static_assert(sizeof(CUtensorMap) == sizeof(stof_attn_tmap), "tensor map size");
    CUresult r = drv->TensorMapEncodeTiled(
        (CUtensorMap *)map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, (void *)ptr, dims, strides, box,
        unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
        box_cols * 2 == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r == CUDA_SUCCESS)
        return STOF_OK;
    char what[128];
    snprintf(what, sizeof what,
             "cuTensorMapEncodeTiled(gemm_epilogue %s, %lld x %lld, stride %lld)", name,
             (long long)rows, (long long)cols, (long long)row_stride);
    return cuda_check(drv, r, what, err);
}

/* The wgmma build's tensor maps: x and w, and y for the persistent build. */
static int encode_maps(const gemm_exec_ctx *c, const gemm_exec_plan *plan, stof_gemm_args *a,
                       stof_error *err) {
    const gemm_exec_problem *p = &plan->problem;
    const int *v = plan->values;
    int rc = encode_map(c->drv, "x", a->x, p->m, p->k, a->x_row_stride, 64, v[0], &a->tmap_x,
                        err);
    if (!rc)
        rc = encode_map(c->drv, "w", a->w, p->n, p->k, a->w_row_stride, 64, v[1], &a->tmap_w,
                        err);
    if (!rc && gemm_exec_persistent(p, v, plan->arch))
        rc = encode_map(c->drv, "y", a->y, p->m, p->n, a->y_row_stride,
                        stof_gemm_store_cols(v[0], v[1], v[3]), 16, &a->tmap_y, err);
    return rc;
}

int gemm_exec_gemm(gemm_exec_ctx *c, const gemm_exec_plan *plan, const gemm_exec_gemm_tensors *t,
                   CUstream s, stof_error *err) {
    stof_gemm_args a;
    int rc = gemm_exec_gemm_args(plan, t, &a, err);
    if (!rc && gemm_exec_wgmma(&plan->problem, plan->values, plan->arch))
        rc = encode_maps(c, plan, &a, err);
    return rc ? rc : launch(c, plan, &a, s, err);
}

int gemm_exec_gemm_ln(gemm_exec_ctx *c, const gemm_exec_plan *plan,
                      const gemm_exec_ln_tensors *t, CUstream s, stof_error *err) {
    stof_gemm_ln_args a;
    int rc = gemm_exec_ln_args(plan, t, &a, err);
    return rc ? rc : launch(c, plan, &a, s, err);
}

int gemm_exec_gemm_chain(gemm_exec_ctx *c, const gemm_exec_plan *plan,
                         const gemm_exec_chain_tensors *t, CUstream s, stof_error *err) {
    stof_gemm_chain_args a;
    int rc = gemm_exec_chain_args(plan, t, &a, err);
    return rc ? rc : launch(c, plan, &a, s, err);
}

int gemm_exec_mi_chain(gemm_exec_ctx *c, const gemm_exec_plan *plan,
                       const gemm_exec_mi_tensors *t, CUstream s, stof_error *err) {
    stof_mi_args a;
    int rc = gemm_exec_mi_args(plan, t, &a, err);
    return rc ? rc : launch(c, plan, &a, s, err);
}

int gemm_exec_embedding(gemm_exec_ctx *c, const gemm_exec_plan *plan,
                        const gemm_exec_embed_tensors *t, CUstream s, stof_error *err) {
    stof_embed_args a;
    int rc = gemm_exec_embed_args(plan, t, &a, err);
    return rc ? rc : launch(c, plan, &a, s, err);
}

int gemm_exec_embedding_status(gemm_exec_ctx *c, const gemm_exec_plan *plan, CUdeviceptr ids,
                               CUstream s, int64_t *bad_token, stof_error *err) {
    if (bad_token)
        *bad_token = -1;
    int rc = wrong_plan(plan, FUSION_T_EMBEDDING, err);
    if (rc)
        return rc;
    int32_t flag = 0;
    if ((rc = cuda_check(c->drv, c->drv->StreamSynchronize(s), "cuStreamSynchronize", err)) ||
        (rc = cuda_check(c->drv, c->drv->MemcpyDtoH(&flag, plan->d_error, sizeof flag),
                         "cuMemcpyDtoH(embedding error flag)", err)))
        return rc;
    if (flag == 0)
        return STOF_OK;
    int64_t token = (int64_t)flag - 1;
    int32_t id = 0;
    if ((rc = cuda_check(c->drv, c->drv->MemsetD32Async(plan->d_error, 0, 1, s),
                         "cuMemsetD32Async(embedding error flag)", err)) ||
        (rc = cuda_check(c->drv, c->drv->StreamSynchronize(s), "cuStreamSynchronize", err)))
        return rc;
    char id_text[32] = "an id";
    if (ids && ids % 4 == 0 &&
        c->drv->MemcpyDtoH(&id, ids + (CUdeviceptr)token * sizeof id, sizeof id) == CUDA_SUCCESS)
        snprintf(id_text, sizeof id_text, "id %d", (int)id);
    if (bad_token)
        *bad_token = token;
    const gemm_exec_problem *p = &plan->problem;
    return err_set(err, STOF_ERR_INVALID,
                   "embedding: token %lld (batch %lld, position %lld) has %s, outside the "
                   "vocabulary [0, %d); its row was written as zeros",
                   (long long)token, (long long)(token / p->seq_len),
                   (long long)(token % p->seq_len), id_text, p->vocab);
}
