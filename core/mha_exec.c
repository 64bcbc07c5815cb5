/* Planning and launching the attention kernels: see mha_exec.h.
 *
 * A plan is built in this order, each step undone by mha_exec_plan_free:
 * validate -> fold causal into the mask -> choose the kernel and its sizes
 * (mha_select, or forced) -> build the mask format for those sizes -> upload
 * it -> compile (NVRTC, cached) and load the kernel (cached per context). */
#include "core/mha_exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/device.h"
#include "core/error.h"
#include "ops/ops.h"

#define MHA_EXEC_STATIC_SMEM (48 * 1024) /* more needs the opt-in attribute */
#define MHA_EXEC_MAX_THREADS 1024
#define MHA_EXEC_MAX_GRID_YZ 65535
#define MHA_EXEC_SMEM_PAD 8              /* elements of padding per shared row */
#define MHA_EXEC_FRAG_REGS 160           /* see mha_exec_block_regs_ok */

/* ---- problems ----------------------------------------------------------------- */

int mha_exec_head_dim_supported(int head_dim) {
    return head_dim == 32 || head_dim == 64 || head_dim == 80 || head_dim == 128;
}

static int check_relpos(const mha_exec_problem *p, stof_error *err) {
    if (!p->relpos)
        return STOF_OK;
    int per_side = p->relpos_bidirectional ? p->relpos_buckets / 2 : p->relpos_buckets;
    if (per_side / 2 < 1)
        return err_set(err, STOF_ERR_INVALID,
                       "attention: relpos_buckets must be at least %d for %s buckets, got %d",
                       p->relpos_bidirectional ? 4 : 2,
                       p->relpos_bidirectional ? "bidirectional" : "unidirectional",
                       p->relpos_buckets);
    if (p->relpos_max_distance <= per_side / 2)
        return err_set(err, STOF_ERR_INVALID,
                       "attention: relpos_max_distance must exceed the %d exactly bucketed "
                       "distances, got %d",
                       per_side / 2, p->relpos_max_distance);
    return STOF_OK;
}

static int check_mask_shape(const mha_exec_problem *p, stof_error *err) {
    const mask *m = p->mask;
    if (!m)
        return STOF_OK;
    if (m->q_len != p->q_len || m->k_len != p->k_len)
        return err_set(err, STOF_ERR_SHAPE,
                       "attention: the mask (%s) is %d x %d (queries x keys) but the attention "
                       "has %d queries and %d keys",
                       m->desc ? m->desc : "?", m->q_len, m->k_len, p->q_len, p->k_len);
    if (m->batch != 1 && m->batch != p->batch)
        return err_set(err, STOF_ERR_SHAPE,
                       "attention: the mask (%s) has batch %d but the attention has batch %d "
                       "(a mask has batch 1, shared, or one per batch)",
                       m->desc ? m->desc : "?", m->batch, p->batch);
    return STOF_OK;
}

int mha_exec_validate(const mha_exec_problem *p, stof_error *err) {
    if (!p)
        return err_set(err, STOF_ERR_INVALID, "attention: no problem given");
    if (p->batch < 1 || p->heads < 1 || p->q_len < 1 || p->k_len < 1)
        return err_set(err, STOF_ERR_INVALID,
                       "attention: batch %d, heads %d, q_len %d, k_len %d must all be positive",
                       p->batch, p->heads, p->q_len, p->k_len);
    if (p->batch > MHA_EXEC_MAX_GRID_YZ || p->heads > MHA_EXEC_MAX_GRID_YZ)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "attention: batch %d and heads %d must not exceed %d (grid limits)",
                       p->batch, p->heads, MHA_EXEC_MAX_GRID_YZ);
    if (p->q_len > MASK_MAX_LEN || p->k_len > MASK_MAX_LEN)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "attention: q_len %d and k_len %d must not exceed %d", p->q_len,
                       p->k_len, MASK_MAX_LEN);
    if (!mha_exec_head_dim_supported(p->head_dim))
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "attention: head_dim %d is not supported by the GPU kernels (supported: "
                       MHA_EXEC_HEAD_DIMS ")",
                       p->head_dim);
    if (p->dtype != STOF_F16 && p->dtype != STOF_BF16)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "attention: the GPU kernels run in f16 or bf16, not %s",
                       stof_dtype_name(p->dtype));
    if (!isfinite(p->scale))
        return err_set(err, STOF_ERR_INVALID, "attention: scale %g is not finite",
                       (double)p->scale);
    int rc = check_relpos(p, err);
    return rc ? rc : check_mask_shape(p, err);
}

/* ---- the causal fold ------------------------------------------------------------- */

static int build_pattern(mask_kind kind, const mha_exec_problem *p, mask **out,
                         stof_error *err) {
    mask_spec *s = mask_spec_new(kind);
    if (!s)
        return err_set(err, STOF_ERR_NOMEM, "out of host memory (mask spec)");
    int rc = mask_build(s, p->batch, p->q_len, p->k_len, out, err);
    mask_spec_free(s);
    return rc;
}

static int set_desc(mask *m, const char *a, const char *b, stof_error *err) {
    size_t n = strlen(a) + strlen(b) + 16;
    char *d = err_malloc(n, err);
    if (!d)
        return STOF_ERR_NOMEM;
    snprintf(d, n, "intersect(%s, %s)", a, b);
    free(m->desc);
    m->desc = d;
    return STOF_OK;
}

/* A copy of user AND the (shared) causal rows. */
static int intersect_causal(const mask *user, const mask *causal, mask **out, stof_error *err) {
    mask *m = NULL;
    int rc = mask_alloc(user->batch, user->q_len, user->k_len, &m, err);
    if (rc)
        return rc;
    for (int b = 0; b < user->batch; b++) {
        for (int i = 0; i < user->q_len; i++) {
            const uint64_t *u = mask_row(user, b, i), *c = mask_row(causal, b, i);
            uint64_t *dst = m->bits + ((int64_t)b * m->q_len + i) * m->words;
            for (int w = 0; w < m->words; w++)
                dst[w] = u[w] & c[w];
        }
    }
    if ((rc = set_desc(m, user->desc ? user->desc : "?", causal->desc, err))) {
        mask_free(m);
        return rc;
    }
    *out = m;
    return STOF_OK;
}

static int clone_mask(const mask *src, mask **out, stof_error *err) {
    mask *m = NULL;
    int rc = mask_alloc(src->batch, src->q_len, src->k_len, &m, err);
    if (rc)
        return rc;
    memcpy(m->bits, src->bits,
           (size_t)src->batch * (size_t)src->q_len * (size_t)src->words * sizeof(uint64_t));
    size_t n = strlen(src->desc ? src->desc : "") + 1;
    char *d = err_malloc(n, err);
    if (!d) {
        mask_free(m);
        return STOF_ERR_NOMEM;
    }
    memcpy(d, src->desc ? src->desc : "", n);
    free(m->desc);
    m->desc = d;
    m->fingerprint = src->fingerprint;
    *out = m;
    return STOF_OK;
}

int mha_exec_fold_mask(const mha_exec_problem *p, mask **out, stof_error *err) {
    *out = NULL;
    int rc = mha_exec_validate(p, err);
    if (rc)
        return rc;
    if (!p->causal)
        return p->mask ? clone_mask(p->mask, out, err) : build_pattern(MASK_DENSE_ALL, p, out, err);
    mask *causal = NULL;
    if ((rc = build_pattern(MASK_CAUSAL, p, &causal, err)))
        return rc;
    if (!p->mask) {
        *out = causal;
        return STOF_OK;
    }
    rc = intersect_causal(p->mask, causal, out, err);
    mask_free(causal);
    if (!rc)
        (*out)->fingerprint = mask_compute_fingerprint(*out);
    return rc;
}

/* ---- kernel configurations ----------------------------------------------------------- */

size_t mha_exec_block_smem(int block_m, int block_n, int head_dim, int dtype_bytes) {
    return ((size_t)block_m + 4 * (size_t)block_n) * ((size_t)head_dim + MHA_EXEC_SMEM_PAD) *
           (size_t)dtype_bytes;
}

/* Per thread, the block-wise kernel holds O (rows/16 x head_dim/2 fp32
 * registers) and S (rows/16 x block_n/2); past MHA_EXEC_FRAG_REGS of those
 * ptxas spills on sm_90 (measured with -Xptxas -v over the settings of the
 * selector's table; kernels/attention_block.cu keeps Q in registers only
 * when it still fits). */
int mha_exec_block_regs_ok(int block_m, int block_n, int num_warps, int head_dim) {
    if (num_warps < 1 || block_m % num_warps)
        return 0;
    int tiles = block_m / num_warps / 16;
    return tiles * (head_dim / 2 + block_n / 2) <= MHA_EXEC_FRAG_REGS;
}

static int is_block_size(int v) {
    return v >= MASK_FORMAT_BLOCK_QUANTUM && v <= MASK_FORMAT_MAX_BLOCK &&
           v % MASK_FORMAT_BLOCK_QUANTUM == 0;
}

static int check_block_config(const mha_exec_config *c, int smem_limit, stof_error *err) {
    if (!is_block_size(c->block_m) || !is_block_size(c->block_n))
        return err_set(err, STOF_ERR_INVALID,
                       "attention: BLOCK_M %d and BLOCK_N %d must be multiples of %d up to %d",
                       c->block_m, c->block_n, MASK_FORMAT_BLOCK_QUANTUM, MASK_FORMAT_MAX_BLOCK);
    if (c->num_warps < 1 || c->num_warps * 32 > MHA_EXEC_MAX_THREADS ||
        c->block_m % (c->num_warps * 16))
        return err_set(err, STOF_ERR_INVALID,
                       "attention: %d warps cannot split BLOCK_M %d into whole 16-row tiles",
                       c->num_warps, c->block_m);
    if (c->head_dim % 16)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "attention: the block-wise kernel needs head_dim a multiple of 16, got %d",
                       c->head_dim);
    size_t smem = mha_exec_block_smem(c->block_m, c->block_n, c->head_dim,
                                      (int)stof_dtype_size(c->dtype));
    if (smem_limit > 0 && smem > (size_t)smem_limit)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "attention: BLOCK_M %d, BLOCK_N %d, head_dim %d need %zu B of shared "
                       "memory, the device allows %d B per block",
                       c->block_m, c->block_n, c->head_dim, smem, smem_limit);
    return STOF_OK;
}

int mha_exec_config_check(const mha_exec_config *c, int smem_limit, stof_error *err) {
    if (!mha_exec_head_dim_supported(c->head_dim))
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "attention: head_dim %d is not supported (supported: " MHA_EXEC_HEAD_DIMS
                       ")",
                       c->head_dim);
    if (c->dtype != STOF_F16 && c->dtype != STOF_BF16)
        return err_set(err, STOF_ERR_UNSUPPORTED, "attention: dtype %s is not f16 or bf16",
                       stof_dtype_name(c->dtype));
    if (c->kernel == MHA_KERNEL_BLOCK_WISE)
        return check_block_config(c, smem_limit, err);
    if (c->kernel != MHA_KERNEL_ROW_WISE)
        return err_set(err, STOF_ERR_INVALID, "attention: unknown kernel kind %d", (int)c->kernel);
    if (c->rows_per_warp < 1 || c->rows_per_warp > 64 || c->warps_per_block < 1 ||
        c->warps_per_block * 32 > MHA_EXEC_MAX_THREADS)
        return err_set(err, STOF_ERR_INVALID,
                       "attention: row-wise needs 1..64 rows a warp and 1..32 warps a block, got "
                       "%d and %d",
                       c->rows_per_warp, c->warps_per_block);
    return STOF_OK;
}

void mha_exec_request_init(mha_exec_request *r, const mha_exec_config *c, const char *arch) {
    memset(r, 0, sizeof *r);
    snprintf(r->arch, sizeof r->arch, "%s", arch);
    int n = 0;
    snprintf(r->opts[n++], sizeof r->opts[0], "-DHEAD_DIM=%d", c->head_dim);
    snprintf(r->opts[n++], sizeof r->opts[0], "-DSTOF_DTYPE=%d", (int)c->dtype);
    snprintf(r->opts[n++], sizeof r->opts[0], "-DHAS_RELPOS=%d", c->relpos ? 1 : 0);
    if (c->kernel == MHA_KERNEL_BLOCK_WISE) {
        snprintf(r->opts[n++], sizeof r->opts[0], "-DBLOCK_M=%d", c->block_m);
        snprintf(r->opts[n++], sizeof r->opts[0], "-DBLOCK_N=%d", c->block_n);
        snprintf(r->opts[n++], sizeof r->opts[0], "-DNUM_WARPS=%d", c->num_warps);
    } else {
        snprintf(r->opts[n++], sizeof r->opts[0], "-DROWS_PER_WARP=%d", c->rows_per_warp);
        snprintf(r->opts[n++], sizeof r->opts[0], "-DWARPS_PER_BLOCK=%d", c->warps_per_block);
    }
    r->req.source = c->kernel == MHA_KERNEL_BLOCK_WISE ? "attention_block.cu" : "attention_row.cu";
    r->req.arch = r->arch;
    for (int i = 0; i < n; i++)
        r->req.options[i] = r->opts[i];
    r->req.n_options = n;
}

/* ---- the GPU context ----------------------------------------------------------------- */

int mha_exec_ctx_create(int ordinal, mha_exec_ctx **out, stof_error *err) {
    *out = NULL;
    mha_exec_ctx *c = err_calloc(1, sizeof *c, err);
    if (!c)
        return STOF_ERR_NOMEM;
    int rc = cuda_driver_get(&c->drv, err);
    if (!rc)
        rc = device_query(ordinal, &c->info, err);
    if (!rc)
        rc = cuda_check(c->drv, c->drv->DeviceGet(&c->dev, ordinal), "cuDeviceGet", err);
    if (!rc)
        rc = cuda_check(c->drv, c->drv->DevicePrimaryCtxRetain(&c->cu, c->dev),
                        "cuDevicePrimaryCtxRetain", err);
    if (rc) {
        free(c);
        return rc;
    }
    if ((rc = cuda_check(c->drv, c->drv->CtxSetCurrent(c->cu), "cuCtxSetCurrent", err))) {
        c->drv->DevicePrimaryCtxRelease(c->dev);
        free(c);
        return rc;
    }
    device_arch_name(&c->info, c->arch, sizeof c->arch);
    nvrtc_cache_init(&c->nvrtc, NULL);
    *out = c;
    return STOF_OK;
}

void mha_exec_ctx_free(mha_exec_ctx *c) {
    if (!c)
        return;
    c->drv->CtxSetCurrent(c->cu);
    for (int i = 0; i < c->n_modules; i++)
        c->drv->ModuleUnload(c->modules[i].module);
    free(c->modules);
    nvrtc_cache_free(&c->nvrtc);
    c->drv->DevicePrimaryCtxRelease(c->dev);
    free(c);
}

/* The loaded kernel of a request: compiled (or found in the NVRTC cache),
 * loaded once per context, its shared memory limit raised when needed. */
static int get_function(mha_exec_ctx *c, const mha_exec_request *r, const char *name,
                        size_t smem, CUfunction *out, stof_error *err) {
    uint64_t key = nvrtc_key(&r->req);
    mha_exec_module *m = NULL;
    for (int i = 0; i < c->n_modules && !m; i++)
        if (c->modules[i].key == key)
            m = &c->modules[i];
    int rc;
    if (!m) {
        if (c->n_modules == c->cap_modules) {
            int cap = c->cap_modules ? 2 * c->cap_modules : 8;
            mha_exec_module *p = err_realloc(c->modules, (size_t)cap * sizeof *p, err);
            if (!p)
                return STOF_ERR_NOMEM;
            c->modules = p;
            c->cap_modules = cap;
        }
        const void *cubin;
        size_t size;
        if ((rc = nvrtc_get(&c->nvrtc, &r->req, &cubin, &size, err)))
            return rc;
        mha_exec_module fresh = {.key = key};
        if ((rc = cuda_check(c->drv, c->drv->ModuleLoadData(&fresh.module, cubin),
                             "cuModuleLoadData", err)))
            return rc;
        if ((rc = cuda_check(c->drv, c->drv->ModuleGetFunction(&fresh.func, fresh.module, name),
                             "cuModuleGetFunction", err))) {
            c->drv->ModuleUnload(fresh.module);
            return rc;
        }
        m = &c->modules[c->n_modules++];
        *m = fresh;
    }
    if (smem > MHA_EXEC_STATIC_SMEM && (size_t)m->smem_attr < smem) {
        if ((rc = cuda_check(c->drv,
                             c->drv->FuncSetAttribute(
                                 m->func, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem),
                             "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", err)))
            return rc;
        m->smem_attr = (int)smem;
    }
    *out = m->func;
    return STOF_OK;
}

/* ---- choosing the kernel ------------------------------------------------------------- */

static void device_limits(const mha_exec_ctx *c, mha_exec_plan *plan, mha_device_limits *lim) {
    snprintf(plan->arch, sizeof plan->arch, "%s", c->arch);
    lim->sm_count = c->info.sm_count;
    lim->smem_per_sm = c->info.smem_per_sm;
    lim->smem_per_block = c->info.smem_per_block_optin;
    lim->max_warps_per_sm = c->info.max_warps_per_sm;
    lim->max_threads_per_block = MHA_EXEC_MAX_THREADS;
    lim->arch = plan->arch;
}

/* The selector's most preferred feasible setting that this kernel also runs
 * well: real shared memory within the device's limit, no register spills.
 * -1 when there is none. */
static int best_runnable(const mha_selection *s, const mha_exec_problem *p, int smem_limit) {
    int best = -1;
    for (int i = 0; i < s->n_candidates; i++) {
        const mha_candidate *c = &s->table[i];
        if (c->verdict != MHA_FEASIBLE ||
            !mha_exec_block_regs_ok(c->block_m, c->block_n, c->num_warps, p->head_dim) ||
            mha_exec_block_smem(c->block_m, c->block_n, p->head_dim,
                                (int)stof_dtype_size(p->dtype)) > (size_t)smem_limit)
            continue;
        if (best < 0 || mha_candidate_compare(c, &s->table[best]) > 0)
            best = i;
    }
    return best;
}

/* Runs the selector on the folded mask; *best is the setting to use (-1: none). */
static int run_selector(const mha_exec_problem *p, const mask *folded,
                        const mha_device_limits *lim, mha_selection *sel, int *best,
                        stof_error *err) {
    mask_bsr *blocks16 = NULL;
    int rc = mask_format_bsr_build(folded, MHA_SELECT_STAGE1_BLOCK, MHA_SELECT_STAGE1_BLOCK,
                                   &blocks16, err);
    if (rc)
        return rc;
    mha_problem mp = {.batch = p->batch, .heads = p->heads, .head_dim = p->head_dim,
                      .q_len = p->q_len, .k_len = p->k_len,
                      .dtype_bytes = (int)stof_dtype_size(p->dtype), .blocks16 = blocks16};
    rc = mha_select(&mp, lim, sel, err);
    mask_format_bsr_free(blocks16);
    *best = rc ? -1 : best_runnable(sel, p, lim->smem_per_block);
    return rc;
}

int mha_exec_choose(const mha_exec_problem *p, const mask *folded, const mha_device_limits *lim,
                    const mha_exec_force *force, mha_exec_config *cfg, char *reason,
                    size_t reason_size, stof_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg->head_dim = p->head_dim;
    cfg->dtype = p->dtype;
    cfg->relpos = p->relpos;
    cfg->rows_per_warp = force && force->rows_per_warp ? force->rows_per_warp : 1;
    cfg->warps_per_block = force && force->warps_per_block ? force->warps_per_block : 4;
    int forced = force && force->kernel >= 0;
    if (forced) {
        cfg->kernel = (mha_kernel)force->kernel;
        cfg->block_m = force->block_m;
        cfg->block_n = force->block_n;
        cfg->num_warps = force->num_warps;
        snprintf(reason, reason_size, "forced");
        if (cfg->kernel != MHA_KERNEL_BLOCK_WISE || cfg->block_m)
            return STOF_OK;
    }
    mha_selection *sel = err_malloc(sizeof *sel, err);
    if (!sel)
        return STOF_ERR_NOMEM;
    int best = -1;
    int rc = run_selector(p, folded, lim, sel, &best, err);
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
    return STOF_OK;
}

/* ---- uploading the format -------------------------------------------------------------- */

/* Device copy of n bytes (at least 16 are allocated, so empty arrays still
 * give a valid pointer). */
static int upload(mha_exec_ctx *c, CUdeviceptr *d, const void *host, size_t n, stof_error *err) {
    int rc = cuda_check(c->drv, c->drv->MemAlloc(d, n < 16 ? 16 : n), "cuMemAlloc", err);
    if (rc) {
        *d = 0;
        return rc;
    }
    if (n)
        rc = cuda_check(c->drv, c->drv->MemcpyHtoD(*d, host, n), "cuMemcpyHtoD", err);
    return rc;
}

static int upload_bsr(mha_exec_ctx *c, mha_exec_plan *plan, const mask *folded,
                      stof_error *err) {
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
    if (!(rc = upload(c, &plan->d_row_ptr, f->load_row_ptr, ptrs * sizeof(int32_t), err)) &&
        !(rc = upload(c, &plan->d_col_idx, f->load_col_idx, (size_t)f->n_load * sizeof(int32_t),
                      err)) &&
        !(rc = upload(c, &plan->d_mask_idx, f->load_mask_idx,
                      (size_t)f->n_load * sizeof(int32_t), err)))
        rc = upload(c, &plan->d_bitmaps, f->part_masks,
                    (size_t)f->n_part_masks * f->bitmap_words * sizeof(uint32_t), err);
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
    if (!(rc = upload(c, &plan->d_row_ptr, f->row_ptr, ptrs * sizeof(int64_t), err)))
        rc = upload(c, &plan->d_col_idx, f->col_idx, (size_t)f->nnz * sizeof(int32_t), err);
    mask_format_csr_free(f);
    return rc;
}

/* bucket[j - i + q_len - 1] for every relative position, by op_relpos_bucket. */
static int upload_buckets(mha_exec_ctx *c, mha_exec_plan *plan, stof_error *err) {
    const mha_exec_problem *p = &plan->problem;
    size_t n = (size_t)p->q_len + (size_t)p->k_len - 1;
    int32_t *bucket = err_malloc(n * sizeof *bucket, err);
    if (!bucket)
        return STOF_ERR_NOMEM;
    for (size_t r = 0; r < n; r++)
        bucket[r] = op_relpos_bucket((int)r - (p->q_len - 1), p->relpos_bidirectional,
                                     p->relpos_buckets, p->relpos_max_distance);
    int rc = upload(c, &plan->d_relpos_bucket, bucket, n * sizeof *bucket, err);
    free(bucket);
    return rc;
}

static int64_t count_allowed(const mask *m, int batch) {
    int64_t n = 0;
    for (int b = 0; b < m->batch; b++)
        for (int i = 0; i < m->q_len; i++)
            n += mask_row_count_range(mask_row(m, b, i), 0, m->k_len);
    return m->batch == 1 ? n * batch : n;
}

static void set_launch_shape(mha_exec_plan *plan) {
    const mha_exec_problem *p = &plan->problem;
    const mha_exec_config *cfg = &plan->config;
    if (cfg->kernel == MHA_KERNEL_BLOCK_WISE) {
        plan->smem = mha_exec_block_smem(cfg->block_m, cfg->block_n, cfg->head_dim,
                                         (int)stof_dtype_size(cfg->dtype));
        plan->grid[0] = (unsigned)((p->q_len + cfg->block_m - 1) / cfg->block_m);
        plan->block[0] = (unsigned)cfg->num_warps * 32u;
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

static int plan_build(mha_exec_ctx *c, mha_exec_plan *plan, const mha_exec_force *force,
                      stof_error *err) {
    mask *folded = NULL;
    int rc = mha_exec_fold_mask(&plan->problem, &folded, err);
    if (rc)
        return rc;
    snprintf(plan->mask_desc, sizeof plan->mask_desc, "%s", folded->desc ? folded->desc : "?");
    plan->allowed_pairs = count_allowed(folded, plan->problem.batch);
    mha_device_limits lim;
    device_limits(c, plan, &lim);
    if (!(rc = mha_exec_choose(&plan->problem, folded, &lim, force, &plan->config, plan->reason,
                               sizeof plan->reason, err)) &&
        !(rc = mha_exec_config_check(&plan->config, c->info.smem_per_block_optin, err))) {
        rc = plan->config.kernel == MHA_KERNEL_BLOCK_WISE ? upload_bsr(c, plan, folded, err)
                                                          : upload_csr(c, plan, folded, err);
    }
    mask_free(folded);
    if (!rc && plan->problem.relpos)
        rc = upload_buckets(c, plan, err);
    if (rc)
        return rc;
    set_launch_shape(plan);
    mha_exec_request r;
    mha_exec_request_init(&r, &plan->config, c->arch);
    return get_function(c, &r,
                        plan->config.kernel == MHA_KERNEL_BLOCK_WISE ? STOF_ATTN_BLOCK_KERNEL
                                                                     : STOF_ATTN_ROW_KERNEL,
                        plan->smem, &plan->func, err);
}

int mha_exec_plan_create(mha_exec_ctx *c, const mha_exec_problem *p, const mha_exec_force *force,
                         mha_exec_plan **out, stof_error *err) {
    *out = NULL;
    int rc = mha_exec_validate(p, err);
    if (rc)
        return rc;
    if ((rc = cuda_check(c->drv, c->drv->CtxSetCurrent(c->cu), "cuCtxSetCurrent", err)))
        return rc;
    mha_exec_plan *plan = err_calloc(1, sizeof *plan, err);
    if (!plan)
        return STOF_ERR_NOMEM;
    plan->problem = *p;
    if ((rc = plan_build(c, plan, force, err))) {
        mha_exec_plan_free(c, plan);
        return rc;
    }
    plan->problem.mask = NULL; /* not owned: do not keep a pointer that may dangle */
    *out = plan;
    return STOF_OK;
}

void mha_exec_plan_free(mha_exec_ctx *c, mha_exec_plan *plan) {
    if (!plan)
        return;
    c->drv->CtxSetCurrent(c->cu);
    CUdeviceptr ptrs[] = {plan->d_row_ptr, plan->d_col_idx, plan->d_mask_idx, plan->d_bitmaps,
                          plan->d_relpos_bucket};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        if (ptrs[i])
            c->drv->MemFree(ptrs[i]);
    free(plan);
}

size_t mha_exec_plan_describe(const mha_exec_plan *plan, char *buf, size_t n) {
    const mha_exec_config *cfg = &plan->config;
    int k;
    if (cfg->kernel == MHA_KERNEL_BLOCK_WISE)
        k = snprintf(buf, n,
                     "block-wise BLOCK_M=%d BLOCK_N=%d warps=%d smem=%zuB grid=%ux%ux%u "
                     "%s D=%d%s; %d loaded blocks (%d partial, %d bitmaps), fmt_batch %d; %s",
                     cfg->block_m, cfg->block_n, cfg->num_warps, plan->smem, plan->grid[0],
                     plan->grid[1], plan->grid[2], stof_dtype_name(cfg->dtype), cfg->head_dim,
                     cfg->relpos ? " relpos" : "", plan->n_loaded_blocks, plan->n_partial_blocks,
                     plan->n_bitmaps, plan->fmt_batch, plan->reason);
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

/* ---- launching ------------------------------------------------------------------------ */

void mha_exec_tensors_packed(mha_exec_tensors *t, CUdeviceptr qkv, CUdeviceptr o,
                             const mha_exec_problem *p, size_t elem_bytes) {
    int64_t hd = (int64_t)p->heads * p->head_dim;
    memset(t, 0, sizeof *t);
    t->q = qkv;
    t->k = qkv + (CUdeviceptr)(hd * (int64_t)elem_bytes);
    t->v = qkv + (CUdeviceptr)(2 * hd * (int64_t)elem_bytes);
    t->o = o;
    t->q_row_stride = t->k_row_stride = t->v_row_stride = 3 * hd;
    t->q_batch_stride = t->k_batch_stride = t->v_batch_stride = 3 * hd * p->q_len;
    t->o_row_stride = hd;
    t->o_batch_stride = hd * p->q_len;
}

void mha_exec_tensors_cross(mha_exec_tensors *t, CUdeviceptr q, CUdeviceptr kv, CUdeviceptr o,
                            const mha_exec_problem *p, size_t elem_bytes) {
    int64_t hd = (int64_t)p->heads * p->head_dim;
    memset(t, 0, sizeof *t);
    t->q = q;
    t->k = kv;
    t->v = kv + (CUdeviceptr)(hd * (int64_t)elem_bytes);
    t->o = o;
    t->q_row_stride = hd;
    t->q_batch_stride = hd * p->q_len;
    t->k_row_stride = t->v_row_stride = 2 * hd;
    t->k_batch_stride = t->v_batch_stride = 2 * hd * p->k_len;
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
    } else {
        a->row_ptr = (const stof_i64 *)(uintptr_t)plan->d_row_ptr;
        a->col_idx = (const stof_i32 *)(uintptr_t)plan->d_col_idx;
    }
    a->relpos_table = (const void *)(uintptr_t)t->relpos_table;
    a->relpos_bucket = (const stof_i32 *)(uintptr_t)plan->d_relpos_bucket;
    a->q_len = p->q_len;
    a->k_len = p->k_len;
    a->heads = p->heads;
    a->fmt_batch = plan->fmt_batch;
    a->scale_log2 = p->scale * 1.4426950408889634f;
    a->relpos_buckets = p->relpos_buckets;
    a->relpos_max_distance = p->relpos_max_distance;
    a->relpos_bidirectional = p->relpos_bidirectional;
}

/* 16-byte vector accesses need 16-byte aligned rows. */
static int check_tensor(const char *name, CUdeviceptr ptr, int64_t batch_stride,
                        int64_t row_stride, stof_error *err) {
    if (!ptr || ptr % 16 || batch_stride % 8 || row_stride % 8 || row_stride <= 0)
        return err_set(err, STOF_ERR_INVALID,
                       "attention: %s must be a 16-byte aligned device pointer with strides "
                       "that are positive multiples of 8 elements (pointer 0x%llx, batch stride "
                       "%lld, row stride %lld)",
                       name, (unsigned long long)ptr, (long long)batch_stride,
                       (long long)row_stride);
    return STOF_OK;
}

int mha_exec_run(mha_exec_ctx *c, const mha_exec_plan *plan, const mha_exec_tensors *t,
                 CUstream s, stof_error *err) {
    int rc;
    if ((rc = check_tensor("q", t->q, t->q_batch_stride, t->q_row_stride, err)) ||
        (rc = check_tensor("k", t->k, t->k_batch_stride, t->k_row_stride, err)) ||
        (rc = check_tensor("v", t->v, t->v_batch_stride, t->v_row_stride, err)) ||
        (rc = check_tensor("o", t->o, t->o_batch_stride, t->o_row_stride, err)))
        return rc;
    if (plan->problem.relpos && !t->relpos_table)
        return err_set(err, STOF_ERR_INVALID,
                       "attention: the plan has a relative position bias but no table was given");
    stof_attn_args args;
    mha_exec_fill_args(plan, t, &args);
    void *params[] = {&args};
    return cuda_check(c->drv,
                      c->drv->LaunchKernel(plan->func, plan->grid[0], plan->grid[1], plan->grid[2],
                                           plan->block[0], plan->block[1], plan->block[2],
                                           (unsigned)plan->smem, s, params, NULL),
                      "cuLaunchKernel(attention)", err);
}
