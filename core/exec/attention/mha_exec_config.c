/* The attention planner's problems and configurations: validation, the
 * causal fold, the kernels' shared memory, depth and register limits, the
 * checks of a configuration and its NVRTC request. See mha_exec.h.
 *
 * The planner across its files (mha_exec_*.c): a plan is built in this
 * order, each step undone by mha_exec_plan_free: validate -> fold causal into the mask -> choose the kernel and its sizes
 * (mha_select, or forced) -> build the mask format for those sizes -> upload
 * it (with the work list and workspace when long block rows are split) ->
 * compile (NVRTC, cached) and load the kernel (cached per context).
 * A measured plan (force->measure) runs the last three steps for each
 * candidate configuration (plan_finish, the one path for both), times them
 * on scratch inputs and keeps the fastest. */
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
    if (p->kv_heads < 0 || p->heads % mha_exec_kv_heads(p))
        return err_set(err, STOF_ERR_INVALID,
                       "attention: kv_heads %d must divide heads %d (grouped-query attention)",
                       p->kv_heads, p->heads);
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
    if (p->global_keys && (p->q_len != p->k_len || p->causal || p->relpos))
        return err_set(err, STOF_ERR_UNSUPPORTED, "attention: global tokens are an encoder "
                       "self-attention's (q_len = k_len, not causal, no relpos), not %d queries "
                       "of %d keys%s%s", p->q_len, p->k_len, p->causal ? ", causal" : "",
                       p->relpos ? ", with relpos" : "");
    if (p->padded && p->q_len != p->k_len)
        return err_set(err, STOF_ERR_UNSUPPORTED, "attention: an attention_mask pads "
                       "self-attention (q_len = k_len), not %d queries of %d keys", p->q_len,
                       p->k_len);
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

size_t mha_exec_block_smem(int block_m, int tile_n, int stages, int head_dim, int dtype_bytes) {
    return ((size_t)block_m + 2 * (size_t)stages * (size_t)tile_n) *
           ((size_t)head_dim + MHA_EXEC_SMEM_PAD) * (size_t)dtype_bytes;
}

int mha_exec_tma_shape(const mha_exec_config *c) {
    return c->kernel == MHA_KERNEL_BLOCK_WISE && c->head_dim % 64 == 0 &&
           (!c->wgmma || c->head_dim == 64) && stof_dtype_size(c->dtype) == 2;
}

size_t mha_exec_config_smem(const mha_exec_config *c) {
    size_t e = stof_dtype_size(c->dtype), relpos = (size_t)c->relpos_mid * sizeof(float);
    if (c->tma)
        return 1024 + 2 * (size_t)c->stages * (size_t)c->block_n * (size_t)c->head_dim * e +
               (size_t)c->block_m * ((size_t)c->head_dim + MHA_EXEC_SMEM_PAD) * e + relpos +
               8 * (size_t)c->stages;
    return mha_exec_block_smem(c->block_m, c->block_n, c->stages, c->head_dim, (int)e) +
           relpos;
}

int mha_exec_block_ctas_per_sm(int block_m, int tile_n, int num_warps, int stages, int head_dim,
                               int dtype_bytes, const mha_device_limits *lim) {
    size_t smem = mha_exec_block_smem(block_m, tile_n, stages, head_dim, dtype_bytes);
    if (num_warps < 1 || smem > (size_t)lim->smem_per_block)
        return 0;
    size_t by_smem = (size_t)lim->smem_per_sm / (smem + MHA_EXEC_SMEM_RESERVED);
    int by_warps = lim->max_warps_per_sm / num_warps;
    int n = by_smem < (size_t)by_warps ? (int)by_smem : by_warps;
    return n < MHA_EXEC_MAX_CTAS_PER_SM ? n : MHA_EXEC_MAX_CTAS_PER_SM;
}

int mha_exec_resident_slots(const mha_exec_config *c, const mha_device_limits *lim) {
    int per_sm = mha_exec_block_ctas_per_sm(c->block_m, c->block_n, c->num_warps, c->stages,
                                            c->head_dim, (int)stof_dtype_size(c->dtype), lim);
    return (per_sm > 0 ? per_sm : 1) * lim->sm_count;
}

/* Registers are left out: they are known only after compiling, and at the
 * settings the selector runs (mha_exec_block_regs_ok) shared memory is
 * what limits residency once the ring is deeper than 2. */
int mha_exec_auto_stages(int block_m, int tile_n, int num_warps, int head_dim, int dtype_bytes,
                         const mha_device_limits *lim) {
    /* Resident blocks first, depth second: on an H200 a deeper ring that
     * costs resident blocks was slower (16x16 w1: 1.76 ms at 2 stages, 1.84
     * at 3, 1.97 at 4 for BigBird 16x12x4096), and one that costs none was
     * no faster (64x32 w4: 1.59 / 1.60 / 1.61 ms) -- so a deeper ring is
     * taken only when it keeps every resident block (and at least two, so
     * that one block's prologue and epilogue overlap another's loop). */
    int best = MHA_EXEC_MIN_STAGES, best_ctas = -1;
    for (int s = MHA_EXEC_MIN_STAGES; s <= MHA_EXEC_MAX_STAGES; s++) {
        int ctas = mha_exec_block_ctas_per_sm(block_m, tile_n, num_warps, s, head_dim,
                                              dtype_bytes, lim);
        if (ctas >= 1 && ctas >= best_ctas && (s == MHA_EXEC_MIN_STAGES || ctas >= 2)) {
            best = s;
            best_ctas = ctas;
        }
    }
    return best;
}

/* Per thread, the block-wise kernel holds O (rows/16 x head_dim/2 fp32
 * registers) and S (rows/16 x tile_n/2); past MHA_EXEC_FRAG_REGS of those
 * ptxas spills on sm_90 (measured with -Xptxas -v over the settings of the
 * selector's table; kernels/attention_block.cu keeps Q in registers only
 * when it still fits). */
int mha_exec_block_regs_ok(int block_m, int tile_n, int num_warps, int head_dim) {
    if (num_warps < 1 || block_m % num_warps)
        return 0;
    int tiles = block_m / num_warps / 16;
    return tiles * (head_dim / 2 + tile_n / 2) <= MHA_EXEC_FRAG_REGS;
}

static int is_block_size(int v) {
    return v >= MASK_FORMAT_BLOCK_QUANTUM && v <= MASK_FORMAT_MAX_BLOCK &&
           v % MASK_FORMAT_BLOCK_QUANTUM == 0;
}

void mha_exec_config_arch(const mha_exec_config *c, const char *arch, char *out, size_t n) {
    int wg = c->kernel == MHA_KERNEL_BLOCK_WISE && c->wgmma && device_wgmma_arch(arch);
    snprintf(out, n, "%s%s", arch, wg ? "a" : "");
}

/* The wgmma build's shapes: whole warpgroups of 16-row warps, and N of the
 * two products (the tile's keys, head_dim) among the instruction shapes it
 * has (kernels/wgmma.cuh). */
static int check_wgmma_config(const mha_exec_config *c, stof_error *err) {
    if (c->block_m % 64 || c->num_warps * 16 != c->block_m)
        return err_set(err, STOF_ERR_INVALID,
                       "attention: the wgmma build needs BLOCK_M a multiple of 64 and 16 rows "
                       "a warp, got BLOCK_M %d with %d warps",
                       c->block_m, c->num_warps);
    int tn = c->block_n;
    if (tn != 16 && tn != 32 && tn != 64 && tn != 128)
        return err_set(err, STOF_ERR_INVALID,
                       "attention: the wgmma build takes tiles of 16, 32, 64 or 128 keys "
                       "(BLOCK_N), got %d",
                       tn);
    if (c->head_dim != 32 && c->head_dim != 64 && c->head_dim != 80 && c->head_dim != 128)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "attention: the wgmma build takes head_dim 32, 64, 80 or 128, got %d",
                       c->head_dim);
    if (c->stages < MHA_EXEC_WGMMA_MIN_STAGES)
        return err_set(err, STOF_ERR_INVALID,
                       "attention: the wgmma build pipelines at least %d K/V stages (one block's "
                       "P V overlaps the next one's softmax), got %d",
                       MHA_EXEC_WGMMA_MIN_STAGES, c->stages);
    return STOF_OK;
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
    if (c->stages < MHA_EXEC_MIN_STAGES || c->stages > MHA_EXEC_MAX_STAGES)
        return err_set(err, STOF_ERR_INVALID,
                       "attention: the block-wise kernel pipelines %d to %d K/V stages, got %d",
                       MHA_EXEC_MIN_STAGES, MHA_EXEC_MAX_STAGES, c->stages);
    int rc = c->wgmma ? check_wgmma_config(c, err) : STOF_OK;
    if (rc)
        return rc;
    if (c->tma && !mha_exec_tma_shape(c))
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "attention: the TMA build takes head_dim a multiple of 64 (with wgmma: "
                       "64), got head_dim %d%s",
                       c->head_dim, c->wgmma ? " with wgmma" : "");
    size_t smem = mha_exec_config_smem(c);
    if (smem_limit > 0 && smem > (size_t)smem_limit)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "attention: BLOCK_M %d, BLOCK_N %d, %d stages, head_dim %d "
                       "need %zu B of shared memory, the device allows %d B per block",
                       c->block_m, c->block_n, c->stages, c->head_dim, smem, smem_limit);
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

int mha_exec_wants_lse(const mha_exec_problem *p, const mask *folded) {
    if (!p->global_keys || !folded)
        return 0;
    /* a key left out: the first row that is not full says so (a window's first row does) */
    for (int b = 0; b < folded->batch; b++)
        for (int i = 0; i < folded->q_len; i++)
            if (mask_row_count_range(mask_row(folded, b, i), 0, folded->k_len) < folded->k_len)
                return 1;
    return 0;
}

void mha_exec_global_request_init(mha_exec_request *r, const mha_exec_problem *p,
                                  const char *arch) {
    memset(r, 0, sizeof *r);
    snprintf(r->arch, sizeof r->arch, "%s", arch);
    snprintf(r->opts[0], sizeof r->opts[0], "-DHEAD_DIM=%d", p->head_dim);
    snprintf(r->opts[1], sizeof r->opts[0], "-DSTOF_DTYPE=%d", (int)p->dtype);
    r->req.source = "attention_global.cu";
    r->req.arch = r->arch;
    r->req.options[0] = r->opts[0];
    r->req.options[1] = r->opts[1];
    r->req.n_options = 2;
}

void mha_exec_request_init(mha_exec_request *r, const mha_exec_config *c, const char *arch) {
    memset(r, 0, sizeof *r);
    mha_exec_config_arch(c, arch, r->arch, sizeof r->arch);
    int n = 0;
    snprintf(r->opts[n++], sizeof r->opts[0], "-DHEAD_DIM=%d", c->head_dim);
    snprintf(r->opts[n++], sizeof r->opts[0], "-DSTOF_DTYPE=%d", (int)c->dtype);
    snprintf(r->opts[n++], sizeof r->opts[0], "-DHAS_RELPOS=%d", c->relpos ? 1 : 0);
    if (c->padded) /* absent otherwise: unpadded builds keep their cache keys */
        snprintf(r->opts[n++], sizeof r->opts[0], "-DPADDING=1");
    if (c->lse) /* likewise */
        snprintf(r->opts[n++], sizeof r->opts[0], "-DLSE=1");
    if (c->kernel == MHA_KERNEL_BLOCK_WISE) {
        snprintf(r->opts[n++], sizeof r->opts[0], "-DBLOCK_M=%d", c->block_m);
        snprintf(r->opts[n++], sizeof r->opts[0], "-DBLOCK_N=%d", c->block_n);
        snprintf(r->opts[n++], sizeof r->opts[0], "-DNUM_WARPS=%d", c->num_warps);
        snprintf(r->opts[n++], sizeof r->opts[0], "-DSTAGES=%d", c->stages);
        if (c->relpos && c->relpos_mid)
            snprintf(r->opts[n++], sizeof r->opts[0], "-DRELPOS_MID=%d", c->relpos_mid);
        if (c->split) /* absent otherwise: the plain build keeps its cache key */
            snprintf(r->opts[n++], sizeof r->opts[0], "-DSPLIT=1");
        if (c->wgmma)
            snprintf(r->opts[n++], sizeof r->opts[0], "-DWGMMA=1");
        if (c->tma)
            snprintf(r->opts[n++], sizeof r->opts[0], "-DTMA=1");
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
