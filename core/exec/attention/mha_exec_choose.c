/* Choosing the attention kernel: the GPU context and its kernel loader,
 * the selector (ops/mha_select), the build of a configuration, the
 * candidates of a measured plan. See mha_exec.h. */
#include "core/exec/attention/mha_exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/exec/attention/mha_exec_cost.h"
#include "core/exec/attention/mha_exec_internal.h"
#include "core/gpu/device.h"
#include "core/base/error.h"
#include "core/base/util.h"
#include "ops/ops.h"

/* ---- the GPU context ----------------------------------------------------------------- */

int mha_exec_ctx_create(int ordinal, mha_exec_ctx **out, stof_error *err) {
    return gpu_ctx_create(ordinal, out, err);
}

void mha_exec_ctx_free(mha_exec_ctx *c) {
    gpu_ctx_free(c);
}

/* The loaded kernel of a request (gpu_ctx_function); a SPLIT=1 build also
 * holds the combine kernel, looked up in the same module. */
int mha_get_function(mha_exec_ctx *c, const mha_exec_request *r, const char *name,
                     size_t smem, CUfunction *out, CUfunction *combine, stof_error *err) {
    gpu_module *m;
    int rc = gpu_ctx_function(c, &r->req, name, smem, &m, err);
    if (rc)
        return rc;
    if (combine && (rc = cuda_check(c->drv,
                                    c->drv->ModuleGetFunction(combine, m->module,
                                                              STOF_ATTN_COMBINE_KERNEL),
                                    "cuModuleGetFunction(combine)", err)))
        return rc;
    *out = m->func;
    return STOF_OK;
}

/* ---- choosing the kernel ------------------------------------------------------------- */

void mha_exec_device_limits(const stof_device_info *info, const char *arch,
                            mha_device_limits *lim) {
    *lim = (mha_device_limits){info->sm_count, info->smem_per_sm, info->smem_per_block_optin,
                               info->max_warps_per_sm, MHA_EXEC_MAX_THREADS, arch};
}

void mha_plan_device_limits(const mha_exec_ctx *c, mha_exec_plan *plan,
                            mha_device_limits *lim) {
    snprintf(plan->arch, sizeof plan->arch, "%s", c->arch);
    mha_exec_device_limits(&c->info, plan->arch, lim);
}

/* A feasible setting of Eq. 2 that this kernel also runs well: real shared
 * memory (at the shallowest ring) within the device's limit, no register
 * spills. */
static int runnable(const mha_candidate *c, const mha_exec_problem *p, int smem_limit) {
    return c->verdict == MHA_FEASIBLE &&
           mha_exec_block_regs_ok(c->block_m, c->block_n, c->num_warps, p->head_dim) &&
           mha_exec_block_smem(c->block_m, c->block_n, MHA_EXEC_MIN_STAGES, p->head_dim,
                               (int)stof_dtype_size(p->dtype)) <= (size_t)smem_limit;
}

/* The selector's most preferred runnable setting not yet taken (taken may
 * be NULL); -1 when there is none. */
static int best_runnable(const mha_selection *s, const mha_exec_problem *p, int smem_limit,
                         const unsigned char *taken) {
    int best = -1;
    for (int i = 0; i < s->n_candidates; i++) {
        const mha_candidate *c = &s->table[i];
        if ((taken && taken[i]) || !runnable(c, p, smem_limit))
            continue;
        if (best < 0 || mha_candidate_compare(c, &s->table[best]) > 0)
            best = i;
    }
    return best;
}

/* Runs the selector on the folded mask; *best is the setting to use (-1:
 * none). keep16 (may be NULL) receives the 16 x 16 format it read, for the
 * caller to free. */
static int run_selector(const mha_exec_problem *p, const mask *folded,
                        const mha_device_limits *lim, mha_selection *sel, int *best,
                        mask_bsr **keep16, stof_error *err) {
    mask_bsr *blocks16 = NULL;
    int rc = mask_format_bsr_build(folded, MHA_SELECT_STAGE1_BLOCK, MHA_SELECT_STAGE1_BLOCK,
                                   &blocks16, err);
    if (rc)
        return rc;
    mha_problem mp = {.batch = p->batch, .heads = p->heads, .head_dim = p->head_dim,
                      .q_len = p->q_len, .k_len = p->k_len,
                      .dtype_bytes = (int)stof_dtype_size(p->dtype), .blocks16 = blocks16};
    rc = mha_select(&mp, lim, sel, err);
    *best = rc ? -1 : best_runnable(sel, p, lim->smem_per_block, NULL);
    if (keep16 && !rc)
        *keep16 = blocks16;
    else
        mask_format_bsr_free(blocks16);
    return rc;
}

/* The block-wise pipeline depth: forced, or mha_exec_auto_stages. */
static void set_stages(mha_exec_config *cfg, const mha_exec_force *force,
                       const mha_device_limits *lim) {
    if (cfg->kernel != MHA_KERNEL_BLOCK_WISE)
        cfg->stages = 0;
    else if (force && force->stages)
        cfg->stages = force->stages;
    else
        cfg->stages = mha_exec_auto_stages(cfg->block_m, cfg->block_n, cfg->num_warps,
                                           cfg->head_dim, (int)stof_dtype_size(cfg->dtype), lim);
    if (cfg->wgmma && !(force && force->stages) && cfg->stages < MHA_EXEC_WGMMA_MIN_STAGES)
        cfg->stages = MHA_EXEC_WGMMA_MIN_STAGES;
}

/* Whether the automatic build of a block-wise cfg (sizes set) is the wgmma
 * one: on sm_90, one block a tile and a head size that is a multiple of 64
 * (the swizzled tiles), where the configuration passes its checks at its
 * (raised or forced) depth, i.e. whole warpgroups of 16-row warps and a
 * ring of at least MHA_EXEC_WGMMA_MIN_STAGES. There it ran dense
 * 16x12x2048 tiles at 363 against 185 TFLOP/s (128x64, 8 warps) and 354
 * against 225 (64x64, 4 warps) on an H200. */
static int wgmma_by_default(const mha_exec_config *cfg, const mha_exec_force *force,
                            const mha_device_limits *lim) {
    if (!lim || !device_wgmma_arch(lim->arch) || cfg->head_dim % 64)
        return 0;
    mha_exec_config t = *cfg;
    t.wgmma = 1;
    t.tma = 0;
    set_stages(&t, force, lim);
    stof_error ignored = {0};
    return mha_exec_config_check(&t, lim->smem_per_block, &ignored) == STOF_OK;
}

/* The build (force->wgmma: 1 wgmma, -1 mma.sync, 0 wgmma_by_default; then
 * force->tma: 1 TMA, -1 cp.async, 0 TMA where the device has it and the
 * shape takes it) and the pipeline depth of a configuration whose sizes
 * are set. */
static void set_build(mha_exec_config *cfg, const mha_exec_force *force,
                      const mha_device_limits *lim) {
    int want = force ? force->wgmma : 0;
    cfg->wgmma = cfg->kernel == MHA_KERNEL_BLOCK_WISE && cfg->block_m &&
                 (want > 0 || (want == 0 && wgmma_by_default(cfg, force, lim)));
    int want_tma = force ? force->tma : 0;
    cfg->tma = cfg->block_m && mha_exec_tma_shape(cfg) &&
               (want_tma > 0 || (want_tma == 0 && lim && device_tma_arch(lim->arch)));
    set_stages(cfg, force, lim);
}

/* The bucket of position r = j - i + q_len - 1, by op_relpos_bucket. */
int32_t mha_relpos_bucket_at(const mha_exec_problem *p, size_t r) {
    return op_relpos_bucket((int)r - (p->q_len - 1), p->relpos_bidirectional, p->relpos_buckets,
                            p->relpos_max_distance);
}

/* The last position of the first run of equal buckets and the first of the
 * last run: T5's far distances, one bucket a side (attention_abi.cuh). */
void mha_relpos_far_runs(const mha_exec_problem *p, size_t *first_end, size_t *last_start) {
    size_t n = (size_t)p->q_len + (size_t)p->k_len - 1;
    int32_t first = mha_relpos_bucket_at(p, 0), last = mha_relpos_bucket_at(p, n - 1);
    size_t e = 0, s = n - 1;
    while (e + 1 < n && mha_relpos_bucket_at(p, e + 1) == first)
        e++;
    while (s > 0 && mha_relpos_bucket_at(p, s - 1) == last)
        s--;
    *first_end = e;
    *last_start = s;
}

/* The capacity of the block-wise kernel's shared table of the biases
 * between the far runs (-DRELPOS_MID): the count rounded up to a power of
 * two (few builds), 0 where there is none or it would be large (the kernel
 * then reads those biases from global memory). */
static int relpos_mid_capacity(const mha_exec_problem *p) {
    if (!p->relpos || p->q_len < 1 || p->k_len < 1)
        return 0;
    size_t first_end, last_start;
    mha_relpos_far_runs(p, &first_end, &last_start);
    size_t mid = last_start > first_end ? last_start - first_end - 1 : 0;
    if (mid == 0 || mid > MHA_EXEC_RELPOS_MID_MAX)
        return 0;
    int cap = 16;
    while ((size_t)cap < mid)
        cap *= 2;
    return cap;
}

/* The plain block-wise setting (bm, bn, w) on top of base (head_dim,
 * dtype, relpos), in the automatic build (set_build) at the forced or
 * automatic depth. */
static mha_exec_config block_config(const mha_exec_config *base, int bm, int bn, int w,
                                    const mha_exec_force *force, const mha_device_limits *lim) {
    mha_exec_config c = *base;
    c.kernel = MHA_KERNEL_BLOCK_WISE;
    c.block_m = bm;
    c.block_n = bn;
    c.num_warps = w;
    set_build(&c, force, lim);
    return c;
}

/* The model's time of cfg (sizes and build set) on the grid's mask, in us;
 * -1 when the table has no cost for it. Block-wise plans split long rows
 * on the resident slots of cfg, as mha_plan_finish does. */
static double model_time(const mha_cost_table *t, mha_cost_grid *g, const mha_exec_problem *p,
                         const mha_exec_config *cfg, const mha_exec_force *force,
                         const mha_device_limits *lim) {
    const int block = cfg->kernel == MHA_KERNEL_BLOCK_WISE;
    mha_cost_entry e;
    if (!mha_cost_lookup(t, lim->arch, p->head_dim, cfg->kernel,
                         block ? cfg->block_m : cfg->rows_per_warp,
                         block ? cfg->block_n : cfg->warps_per_block, block ? cfg->num_warps : 0,
                         &e))
        return -1;
    return mha_cost_predict(&e, g, p->batch, p->heads, lim->sm_count,
                            block ? mha_exec_resident_slots(cfg, lim) : 0,
                            force ? force->split_chunk : 0);
}

/* Keeps a ranked setting: appended, or in place of the slowest kept when
 * the list is full and it is faster. */
static void rank(mha_exec_ranked *out, int cap, int *n, const mha_exec_config *c, double us) {
    if (us < 0 || cap < 1)
        return;
    if (*n < cap) {
        out[(*n)++] = (mha_exec_ranked){*c, us};
        return;
    }
    int slowest = 0;
    for (int i = 1; i < *n; i++)
        slowest = out[i].us > out[slowest].us ? i : slowest;
    if (us < out[slowest].us)
        out[slowest] = (mha_exec_ranked){*c, us};
}

/* Fastest first; ties as Eq. 2 breaks them (the larger BLOCK_N, fewer warps,
 * the larger BLOCK_M), block-wise before row-wise: a total order. */
static int by_time(const void *pa, const void *pb) {
    const mha_exec_ranked *a = pa, *b = pb;
    if (a->us != b->us)
        return (a->us > b->us) - (a->us < b->us);
    if (a->cfg.kernel != b->cfg.kernel)
        return a->cfg.kernel == MHA_KERNEL_BLOCK_WISE ? -1 : 1;
    if (a->cfg.block_n != b->cfg.block_n)
        return a->cfg.block_n > b->cfg.block_n ? -1 : 1;
    if (a->cfg.num_warps != b->cfg.num_warps)
        return a->cfg.num_warps < b->cfg.num_warps ? -1 : 1;
    return (a->cfg.block_m < b->cfg.block_m) - (a->cfg.block_m > b->cfg.block_m);
}

/* The settings the model ranks: the selector's table where runnable (in
 * the automatic build), then the row-wise kernel unless block-wise is
 * forced. */
static int rank_settings(const mha_exec_problem *p, const mask *folded,
                         const mha_device_limits *lim, const mha_exec_force *force,
                         const mha_exec_config *base, const mha_cost_table *t,
                         mha_exec_ranked *out, int cap, int *n, stof_error *err) {
    mha_selection *sel = err_malloc(sizeof *sel, err);
    if (!sel)
        return STOF_ERR_NOMEM;
    mask_bsr *blocks16 = NULL;
    mha_cost_grid g;
    int best = -1;
    int rc = run_selector(p, folded, lim, sel, &best, &blocks16, err);
    if (!rc)
        rc = mha_cost_grid_build(folded, blocks16, &g, err);
    mask_format_bsr_free(blocks16);
    for (int i = 0; !rc && i < sel->n_candidates; i++) {
        const mha_candidate *k = &sel->table[i];
        if (!runnable(k, p, lim->smem_per_block))
            continue;
        mha_exec_config c = block_config(base, k->block_m, k->block_n, k->num_warps, force, lim);
        stof_error ignored = {0};
        if (mha_exec_config_check(&c, lim->smem_per_block, &ignored) == STOF_OK)
            rank(out, cap, n, &c, model_time(t, &g, p, &c, force, lim));
    }
    if (!rc && !(force && force->kernel == MHA_KERNEL_BLOCK_WISE)) {
        mha_exec_config c = *base;
        c.kernel = MHA_KERNEL_ROW_WISE;
        if (!force || !force->rows_per_warp)
            c.rows_per_warp = sel->rows_per_warp;
        if (!force || !force->warps_per_block)
            c.warps_per_block = sel->warps_per_block;
        rank(out, cap, n, &c, model_time(t, &g, p, &c, force, lim));
    }
    if (!rc)
        mha_cost_grid_free(&g);
    free(sel);
    qsort(out, (size_t)*n, sizeof *out, by_time);
    return rc;
}

/* The base configuration of a problem: what every candidate shares. */
static void base_config(const mha_exec_problem *p, const mha_exec_force *force,
                        mha_exec_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->head_dim = p->head_dim;
    cfg->dtype = p->dtype;
    cfg->relpos = p->relpos;
    cfg->padded = p->padded;
    cfg->relpos_mid = relpos_mid_capacity(p);
    cfg->rows_per_warp = force && force->rows_per_warp ? force->rows_per_warp : 1;
    cfg->warps_per_block = force && force->warps_per_block ? force->warps_per_block : 4;
}

int mha_exec_model_rank(const mha_exec_problem *p, const mask *folded,
                        const mha_device_limits *lim, const mha_exec_force *force,
                        mha_exec_ranked *out, int cap, int *n, stof_error *err) {
    *n = 0;
    const char *env = getenv("STOF_ATTENTION_MODEL");
    if ((env && strcmp(env, "paper") == 0) || !lim || !lim->arch)
        return STOF_OK;
    /* the costs are the automatic builds': a forced build or depth is not one of them */
    if (force && (force->wgmma || force->tma || force->stages))
        return STOF_OK;
    mha_cost_table t;
    int rc = mha_cost_builtin(&t, err);
    if (rc)
        return rc;
    mha_exec_config base;
    base_config(p, force, &base);
    if (mha_cost_has_arch(&t, lim->arch))
        rc = rank_settings(p, folded, lim, force, &base, &t, out, cap, n, err);
    mha_cost_table_free(&t);
    return rc;
}

/* "block 64x64 w4 wgmma" or "row 1x4". */
static void short_setting(const mha_exec_config *c, char *out, size_t n) {
    if (c->kernel == MHA_KERNEL_BLOCK_WISE)
        snprintf(out, n, "block %dx%d w%d%s", c->block_m, c->block_n, c->num_warps,
                 c->wgmma ? " wgmma" : "");
    else
        snprintf(out, n, "row %dx%d", c->rows_per_warp, c->warps_per_block);
}

/* The calibrated model's choice (mha_exec_model_rank): 1 with cfg and
 * reason set; 0 when it has no costs for this device or is switched off
 * (the caller keeps to Eq. 1 and 2); an error. */
static int model_choose(const mha_exec_problem *p, const mask *folded,
                        const mha_device_limits *lim, const mha_exec_force *force,
                        mha_exec_config *cfg, char *reason, size_t reason_size,
                        stof_error *err) {
    mha_exec_ranked *r = err_malloc(MHA_EXEC_MAX_RANKED * sizeof *r, err);
    if (!r)
        return STOF_ERR_NOMEM;
    int n = 0;
    int rc = mha_exec_model_rank(p, folded, lim, force, r, MHA_EXEC_MAX_RANKED, &n, err);
    if (rc || n == 0) {
        free(r);
        return rc;
    }
    *cfg = r[0].cfg;
    char first[48], second[48] = "none";
    short_setting(&r[0].cfg, first, sizeof first);
    if (n > 1)
        short_setting(&r[1].cfg, second, sizeof second);
    snprintf(reason, reason_size, "cost model (%s, %s): %s %.1f us predicted; next %s %.1f us",
             lim->arch, MHA_COST_FILE, first, r[0].us, second, n > 1 ? r[1].us : 0.0);
    free(r);
    return 1;
}

int mha_exec_choose(const mha_exec_problem *p, const mask *folded, const mha_device_limits *lim,
                    const mha_exec_force *force, mha_exec_config *cfg, char *reason,
                    size_t reason_size, stof_error *err) {
    base_config(p, force, cfg);
    int forced = force && force->kernel >= 0;
    if (forced) {
        cfg->kernel = (mha_kernel)force->kernel;
        cfg->block_m = force->block_m;
        cfg->block_n = force->block_n;
        cfg->num_warps = force->num_warps;
        snprintf(reason, reason_size, "forced");
        if (cfg->kernel != MHA_KERNEL_BLOCK_WISE || cfg->block_m) {
            set_build(cfg, force, lim);
            return STOF_OK;
        }
    }
    int model = model_choose(p, folded, lim, force, cfg, reason, reason_size, err);
    if (model < 0)
        return model;
    if (model == 1)
        return STOF_OK;
    mha_selection *sel = err_malloc(sizeof *sel, err);
    if (!sel)
        return STOF_ERR_NOMEM;
    int best = -1;
    int rc = run_selector(p, folded, lim, sel, &best, NULL, err);
    if (rc) {
        free(sel);
        return rc;
    }
    int skipped = best != sel->best;
    if (!forced) {
        cfg->kernel = best < 0 ? MHA_KERNEL_ROW_WISE : sel->kernel;
        if (!force || !force->rows_per_warp)
            cfg->rows_per_warp = sel->rows_per_warp;
        if (!force || !force->warps_per_block)
            cfg->warps_per_block = sel->warps_per_block;
        snprintf(reason, reason_size, "selector: %s (threshold %.3f)%s", sel->reason,
                 sel->threshold,
                 skipped && sel->kernel == MHA_KERNEL_BLOCK_WISE
                     ? "; Eq. 2's best setting would spill registers or overflow smem"
                     : "");
    } else {
        snprintf(reason, reason_size, "forced block-wise, sizes by Eq. 2%s",
                 skipped ? " (skipping settings that spill or overflow smem)" : "");
    }
    if (best >= 0) {
        cfg->block_m = sel->table[best].block_m;
        cfg->block_n = sel->table[best].block_n;
        cfg->num_warps = sel->table[best].num_warps;
    }
    free(sel);
    if (cfg->kernel == MHA_KERNEL_BLOCK_WISE && best < 0)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "attention: no block-wise setting fits the device for head_dim %d",
                       p->head_dim);
    set_build(cfg, force, lim);
    return STOF_OK;
}

static int same_config(const mha_exec_config *a, const mha_exec_config *b) {
    if (a->kernel != b->kernel)
        return 0;
    if (a->kernel == MHA_KERNEL_BLOCK_WISE)
        return a->block_m == b->block_m && a->block_n == b->block_n &&
               a->num_warps == b->num_warps && a->stages == b->stages && a->wgmma == b->wgmma &&
               a->tma == b->tma;
    return a->rows_per_warp == b->rows_per_warp && a->warps_per_block == b->warps_per_block;
}

/* Appends c unless it is already there or the list is full. */
static void add_candidate(mha_exec_config *out, int cap, int *n, const mha_exec_config *c) {
    for (int i = 0; i < *n; i++)
        if (same_config(&out[i], c))
            return;
    if (*n < cap)
        out[(*n)++] = *c;
}

int mha_exec_candidates(const mha_exec_problem *p, const mask *folded,
                        const mha_device_limits *lim, const mha_exec_force *force,
                        mha_exec_config *out, int cap, int *n, char *reason, size_t reason_size,
                        stof_error *err) {
    *n = 0;
    mha_exec_config first;
    int rc = mha_exec_choose(p, folded, lim, force, &first, reason, reason_size, err);
    if (rc)
        return rc;
    add_candidate(out, cap, n, &first);
    if (force && force->kernel >= 0 &&
        (force->kernel != MHA_KERNEL_BLOCK_WISE || force->block_m))
        return STOF_OK; /* nothing left to choose */
    mha_selection *sel = err_malloc(sizeof *sel, err);
    unsigned char taken[MHA_SELECT_MAX_CANDIDATES] = {0};
    int best = -1;
    if (!sel)
        return STOF_ERR_NOMEM;
    if ((rc = run_selector(p, folded, lim, sel, &best, NULL, err))) {
        free(sel);
        return rc;
    }
    int wanted = force ? force->measure : 0;
    for (int k = 0; k < wanted; k++) {
        int i = best_runnable(sel, p, lim->smem_per_block, taken);
        if (i < 0)
            break;
        taken[i] = 1;
        mha_exec_config c = block_config(&first, sel->table[i].block_m, sel->table[i].block_n,
                                         sel->table[i].num_warps, force, lim);
        add_candidate(out, cap, n, &c);
    }
    free(sel);
    static const int fixed[MHA_EXEC_MEASURE_N_FIXED][3] = MHA_EXEC_MEASURE_FIXED;
    for (int k = 0; k < MHA_EXEC_MEASURE_N_FIXED; k++) {
        mha_exec_config c = block_config(&first, fixed[k][0], fixed[k][1], fixed[k][2], force,
                                         lim);
        stof_error ignored = {0};
        if (mha_exec_config_check(&c, lim->smem_per_block, &ignored) == STOF_OK &&
            mha_exec_block_regs_ok(c.block_m, c.block_n, c.num_warps, c.head_dim))
            add_candidate(out, cap, n, &c);
    }
    return STOF_OK;
}
