/* Planning and launching the attention kernels: see mha_exec.h.
 *
 * A plan is built in this order, each step undone by mha_exec_plan_free:
 * validate -> fold causal into the mask -> choose the kernel and its sizes
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

#include "core/gpu/device.h"
#include "core/gpu/gpu_timer.h"
#include "core/base/error.h"
#include "core/base/util.h"
#include "ops/ops.h"

#define MHA_EXEC_MAX_THREADS 1024
#define MHA_EXEC_RELPOS_MID_MAX 2048     /* T5 biases the block-wise kernel keeps in shared memory */
#define MHA_EXEC_MAX_GRID_YZ 65535
#define MHA_EXEC_SMEM_PAD 8              /* elements of padding per shared row */
#define MHA_EXEC_FRAG_REGS 160           /* see mha_exec_block_regs_ok */
#define MHA_EXEC_SMEM_RESERVED 1024      /* shared memory the SM reserves per block (sm_80+) */
#define MHA_EXEC_MAX_CTAS_PER_SM 32      /* resident blocks per SM (sm_80, sm_90) */

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

void mha_exec_request_init(mha_exec_request *r, const mha_exec_config *c, const char *arch) {
    memset(r, 0, sizeof *r);
    mha_exec_config_arch(c, arch, r->arch, sizeof r->arch);
    int n = 0;
    snprintf(r->opts[n++], sizeof r->opts[0], "-DHEAD_DIM=%d", c->head_dim);
    snprintf(r->opts[n++], sizeof r->opts[0], "-DSTOF_DTYPE=%d", (int)c->dtype);
    snprintf(r->opts[n++], sizeof r->opts[0], "-DHAS_RELPOS=%d", c->relpos ? 1 : 0);
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

/* ---- split block rows ------------------------------------------------------------------ */

static int bsr_row_len(const mask_bsr *f, int b, int i) {
    const int64_t base = mask_format_bsr_row_base(f, b);
    return f->load_row_ptr[base + i + 1] - f->load_row_ptr[base + i];
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int mha_exec_split_chunk(const mask_bsr *f, int batch, int heads, int resident) {
    /* the row lengths, sorted: the longest and the typical long one */
    const int n = f->batch * f->n_block_rows;
    int *len = malloc((size_t)(n > 0 ? n : 1) * sizeof *len);
    if (!len || n < 1) {
        free(len);
        return 0; /* no memory: the plain launch is always right */
    }
    for (int b = 0; b < f->batch; b++)
        for (int i = 0; i < f->n_block_rows; i++)
            len[b * f->n_block_rows + i] = bsr_row_len(f, b, i);
    qsort(len, (size_t)n, sizeof *len, cmp_int);
    const int longest = len[n - 1];
    int64_t chunk = len[(int64_t)(n - 1) * MHA_EXEC_SPLIT_TYPICAL_PCT / 100];
    free(len);
    /* heads x every launched batch's loaded blocks, shared over the slots */
    int64_t work = (int64_t)f->n_load * (f->batch == 1 ? batch : 1) * heads;
    int64_t slots = resident > 0 ? resident : 1;
    int64_t per_slot = (work + slots - 1) / slots;
    chunk = chunk > per_slot ? chunk : per_slot;
    if (chunk < MHA_EXEC_SPLIT_MIN_CHUNK)
        chunk = MHA_EXEC_SPLIT_MIN_CHUNK;
    /* worth a second kernel only when the longest row shrinks by a third */
    return 2 * (int64_t)longest >= 3 * chunk ? (int)chunk : 0;
}

void mha_exec_split_free(mha_exec_split *s) {
    if (!s)
        return;
    free(s->work_ptr);
    free(s->work);
    free(s->split_ptr);
    free(s->splits);
    free(s);
}

/* Longest first; then by block row and start: a total order (no two items
 * of a batch share both), so qsort's result is deterministic. */
static int cmp_work(const void *pa, const void *pb) {
    const stof_attn_work *a = pa, *b = pb;
    int la = a->end - a->start, lb = b->end - b->start;
    if (la != lb)
        return la > lb ? -1 : 1;
    if (a->block_row != b->block_row)
        return a->block_row < b->block_row ? -1 : 1;
    return (a->start > b->start) - (a->start < b->start);
}

/* The pieces of a row of len blocks at a chunk: ceil(len / chunk) when it
 * is longer, else 1. */
static int row_pieces(int len, int chunk) {
    return len > chunk ? (len + chunk - 1) / chunk : 1;
}

/* Batch b's items and split rows, appended at s->work[*n], s->splits[*ns]. */
static void split_batch(const mask_bsr *f, int b, int chunk, mha_exec_split *s, int *n, int *ns,
                        int *slot) {
    const int32_t *ptr = f->load_row_ptr + mask_format_bsr_row_base(f, b);
    const int first = *n;
    for (int i = 0; i < f->n_block_rows; i++) {
        const int start = ptr[i], len = ptr[i + 1] - ptr[i];
        const int pieces = row_pieces(len, chunk);
        if (pieces == 1) {
            s->work[(*n)++] = (stof_attn_work){i, start, start + len, -1};
            continue;
        }
        s->splits[(*ns)++] = (stof_attn_split){i, *slot, pieces, 0};
        /* near-equal pieces: sizes differ by at most one, none above chunk */
        for (int k = 0; k < pieces; k++) {
            int lo = start + (int)((int64_t)len * k / pieces);
            int hi = start + (int)((int64_t)len * (k + 1) / pieces);
            s->work[(*n)++] = (stof_attn_work){i, lo, hi, (*slot)++};
        }
    }
    qsort(s->work + first, (size_t)(*n - first), sizeof *s->work, cmp_work);
}

int mha_exec_split_build(const mask_bsr *f, int chunk, mha_exec_split **out, stof_error *err) {
    *out = NULL;
    if (chunk < 1)
        return STOF_OK;
    int64_t n_items = 0, n_split = 0;
    for (int b = 0; b < f->batch; b++)
        for (int i = 0; i < f->n_block_rows; i++) {
            int pieces = row_pieces(bsr_row_len(f, b, i), chunk);
            n_items += pieces;
            n_split += pieces > 1;
        }
    if (!n_split)
        return STOF_OK;
    if (n_items > INT32_MAX)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "attention: %lld work items at chunk %d are too many",
                       (long long)n_items, chunk);
    mha_exec_split *s = err_calloc(1, sizeof *s, err);
    if (!s)
        return STOF_ERR_NOMEM;
    s->fmt_batch = f->batch;
    s->chunk = chunk;
    s->work_ptr = err_malloc(((size_t)f->batch + 1) * sizeof *s->work_ptr, err);
    s->split_ptr = s->work_ptr ? err_malloc(((size_t)f->batch + 1) * sizeof *s->split_ptr, err)
                               : NULL;
    s->work = s->split_ptr ? err_malloc((size_t)n_items * sizeof *s->work, err) : NULL;
    s->splits = s->work ? err_malloc((size_t)n_split * sizeof *s->splits, err) : NULL;
    if (!s->splits) {
        mha_exec_split_free(s);
        return STOF_ERR_NOMEM;
    }
    int n = 0, ns = 0, slot = 0;
    for (int b = 0; b < f->batch; b++) {
        s->work_ptr[b] = n;
        s->split_ptr[b] = ns;
        split_batch(f, b, chunk, s, &n, &ns, &slot);
        if (n - s->work_ptr[b] > s->max_items)
            s->max_items = n - s->work_ptr[b];
        if (ns - s->split_ptr[b] > s->max_split_rows)
            s->max_split_rows = ns - s->split_ptr[b];
    }
    s->work_ptr[f->batch] = n;
    s->split_ptr[f->batch] = ns;
    s->n_items = n;
    s->n_split_rows = ns;
    s->n_slots = slot;
    *out = s;
    return STOF_OK;
}

size_t mha_exec_split_workspace(const mha_exec_split *s, int batch, int heads, int block_m,
                                int head_dim) {
    size_t units = (size_t)(s->fmt_batch == 1 ? batch : 1) * (size_t)s->n_slots * (size_t)heads;
    return units * (size_t)block_m * ((size_t)head_dim + 2) * sizeof(float);
}

/* ---- the GPU context ----------------------------------------------------------------- */

int mha_exec_ctx_create(int ordinal, mha_exec_ctx **out, stof_error *err) {
    return gpu_ctx_create(ordinal, out, err);
}

void mha_exec_ctx_free(mha_exec_ctx *c) {
    gpu_ctx_free(c);
}

/* The loaded kernel of a request (gpu_ctx_function); a SPLIT=1 build also
 * holds the combine kernel, looked up in the same module. */
static int get_function(mha_exec_ctx *c, const mha_exec_request *r, const char *name,
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

static void device_limits(const mha_exec_ctx *c, mha_exec_plan *plan, mha_device_limits *lim) {
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
    *best = rc ? -1 : best_runnable(sel, p, lim->smem_per_block, NULL);
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
static int32_t relpos_bucket_at(const mha_exec_problem *p, size_t r) {
    return op_relpos_bucket((int)r - (p->q_len - 1), p->relpos_bidirectional, p->relpos_buckets,
                            p->relpos_max_distance);
}

/* The last position of the first run of equal buckets and the first of the
 * last run: T5's far distances, one bucket a side (attention_abi.cuh). */
static void relpos_far_runs(const mha_exec_problem *p, size_t *first_end, size_t *last_start) {
    size_t n = (size_t)p->q_len + (size_t)p->k_len - 1;
    int32_t first = relpos_bucket_at(p, 0), last = relpos_bucket_at(p, n - 1);
    size_t e = 0, s = n - 1;
    while (e + 1 < n && relpos_bucket_at(p, e + 1) == first)
        e++;
    while (s > 0 && relpos_bucket_at(p, s - 1) == last)
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
    relpos_far_runs(p, &first_end, &last_start);
    size_t mid = last_start > first_end ? last_start - first_end - 1 : 0;
    if (mid == 0 || mid > MHA_EXEC_RELPOS_MID_MAX)
        return 0;
    int cap = 16;
    while ((size_t)cap < mid)
        cap *= 2;
    return cap;
}

int mha_exec_choose(const mha_exec_problem *p, const mask *folded, const mha_device_limits *lim,
                    const mha_exec_force *force, mha_exec_config *cfg, char *reason,
                    size_t reason_size, stof_error *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg->head_dim = p->head_dim;
    cfg->dtype = p->dtype;
    cfg->relpos = p->relpos;
    cfg->relpos_mid = relpos_mid_capacity(p);
    cfg->rows_per_warp = force && force->rows_per_warp ? force->rows_per_warp : 1;
    cfg->warps_per_block = force && force->warps_per_block ? force->warps_per_block : 4;
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
    if ((rc = run_selector(p, folded, lim, sel, &best, err))) {
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

/* The chunk a plan of cfg splits f at: forced (force_chunk > 0), never
 * (< 0), or mha_exec_split_chunk on the resident slots of lim. */
static int split_chunk_for(const mha_exec_problem *p, const mha_exec_config *cfg,
                           const mask_bsr *f, const mha_device_limits *lim, int force_chunk) {
    if (force_chunk)
        return force_chunk > 0 ? force_chunk : 0;
    int per_sm = mha_exec_block_ctas_per_sm(cfg->block_m, cfg->block_n, cfg->num_warps,
                                            cfg->stages, cfg->head_dim,
                                            (int)stof_dtype_size(cfg->dtype), lim);
    return mha_exec_split_chunk(f, p->batch, p->heads, (per_sm > 0 ? per_sm : 1) * lim->sm_count);
}

static int plan_split_chunk(const mha_exec_ctx *c, mha_exec_plan *plan, const mask_bsr *f,
                            int force_chunk) {
    mha_device_limits lim;
    device_limits(c, plan, &lim);
    return split_chunk_for(&plan->problem, &plan->config, f, &lim, force_chunk);
}

int mha_exec_plan_splits(const mha_exec_problem *p, const mask *folded,
                         const mha_exec_config *cfg, const mha_device_limits *lim,
                         int force_chunk, int *splits, stof_error *err) {
    *splits = 0;
    if (cfg->kernel != MHA_KERNEL_BLOCK_WISE)
        return STOF_OK;
    mask_bsr *f = NULL;
    int rc = mask_format_bsr_build(folded, cfg->block_m, cfg->block_n, &f, err);
    if (rc)
        return rc;
    int chunk = split_chunk_for(p, cfg, f, lim, force_chunk);
    for (int b = 0; chunk >= 1 && b < f->batch && !*splits; b++)
        for (int i = 0; i < f->n_block_rows && !*splits; i++)
            *splits = bsr_row_len(f, b, i) > chunk;
    mask_format_bsr_free(f);
    return STOF_OK;
}

/* The work list of a split plan on the device, its workspace, its launch
 * shapes; nothing when no row is cut (config.split stays 0). */
static int upload_split(mha_exec_ctx *c, mha_exec_plan *plan, const mask_bsr *f,
                        int force_chunk, stof_error *err) {
    mha_exec_split *s = NULL;
    int rc = mha_exec_split_build(f, plan_split_chunk(c, plan, f, force_chunk), &s, err);
    if (rc || !s)
        return rc;
    const mha_exec_problem *p = &plan->problem;
    mha_exec_config *cfg = &plan->config;
    cfg->split = 1;
    plan->split_chunk = s->chunk;
    plan->split_rows = s->n_split_rows;
    plan->split_items = s->n_items;
    plan->split_slots = s->n_slots;
    plan->workspace_bytes =
        mha_exec_split_workspace(s, p->batch, p->heads, cfg->block_m, cfg->head_dim);
    /* partial O first ([units][block_m][head_dim] floats), then (m, l) */
    plan->workspace_ml_offset =
        plan->workspace_bytes / ((size_t)cfg->head_dim + 2) * (size_t)cfg->head_dim;
    size_t ptrs = ((size_t)s->fmt_batch + 1) * sizeof(int32_t);
    if (!(rc = upload(c, &plan->d_work_ptr, s->work_ptr, ptrs, err)) &&
        !(rc = upload(c, &plan->d_work, s->work, (size_t)s->n_items * sizeof *s->work, err)) &&
        !(rc = upload(c, &plan->d_split_ptr, s->split_ptr, ptrs, err)) &&
        !(rc = upload(c, &plan->d_splits, s->splits, (size_t)s->n_split_rows * sizeof *s->splits,
                      err)))
        rc = cuda_check(c->drv, c->drv->MemAlloc(&plan->d_workspace, plan->workspace_bytes),
                        "cuMemAlloc(attention split workspace)", err);
    if (rc)
        plan->d_workspace = 0;
    plan->grid[0] = (unsigned)s->max_items;
    plan->combine_grid[0] = (unsigned)s->max_split_rows;
    mha_exec_split_free(s);
    return rc;
}

/* The distinct partial-block bitmaps, and always at least one bitmap's
 * worth of words (zeros when there is none): the kernel may read a full
 * block's row of bitmap 0 and discard it (the compiler is free to issue a
 * load ahead of the test that skips it), so that address must be valid. */
static int upload_bitmaps(mha_exec_ctx *c, mha_exec_plan *plan, const mask_bsr *f,
                          stof_error *err) {
    size_t bytes = (size_t)f->bitmap_words * sizeof(uint32_t);
    if (f->n_part_masks > 0)
        return upload(c, &plan->d_bitmaps, f->part_masks, bytes * (size_t)f->n_part_masks, err);
    uint32_t *zeros = err_calloc((size_t)f->bitmap_words, sizeof *zeros, err);
    if (!zeros)
        return STOF_ERR_NOMEM;
    int rc = upload(c, &plan->d_bitmaps, zeros, bytes, err);
    free(zeros);
    return rc;
}

static int upload_bsr(mha_exec_ctx *c, mha_exec_plan *plan, const mask *folded,
                      int force_chunk, stof_error *err) {
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
        rc = upload_bitmaps(c, plan, f, err);
    if (!rc)
        rc = upload_split(c, plan, f, force_chunk, err);
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

/* bucket[j - i + q_len - 1] for every relative position, then the far runs'
 * ends (relpos_far_runs). */
static int upload_buckets(mha_exec_ctx *c, mha_exec_plan *plan, stof_error *err) {
    const mha_exec_problem *p = &plan->problem;
    size_t n = (size_t)p->q_len + (size_t)p->k_len - 1;
    int32_t *bucket = err_malloc((n + 2) * sizeof *bucket, err);
    if (!bucket)
        return STOF_ERR_NOMEM;
    for (size_t r = 0; r < n; r++)
        bucket[r] = relpos_bucket_at(p, r);
    size_t first_end, last_start;
    relpos_far_runs(p, &first_end, &last_start);
    bucket[n] = (int32_t)first_end;
    bucket[n + 1] = (int32_t)last_start;
    int rc = upload(c, &plan->d_relpos_bucket, bucket, (n + 2) * sizeof *bucket, err);
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

/* Grids (x over block rows, work items or split rows; y heads; z batch)
 * and blocks. A split plan's grid[0] and combine_grid[0] come from its work
 * list (upload_split). */
static void set_launch_shape(mha_exec_plan *plan) {
    const mha_exec_problem *p = &plan->problem;
    const mha_exec_config *cfg = &plan->config;
    if (cfg->kernel == MHA_KERNEL_BLOCK_WISE) {
        plan->smem = mha_exec_config_smem(cfg);
        if (!cfg->split)
            plan->grid[0] = (unsigned)((p->q_len + cfg->block_m - 1) / cfg->block_m);
        plan->block[0] = (unsigned)cfg->num_warps * 32u;
        if (cfg->split) {
            plan->combine_grid[1] = (unsigned)p->heads;
            plan->combine_grid[2] = (unsigned)p->batch;
            plan->combine_block[0] = STOF_ATTN_COMBINE_THREADS;
            plan->combine_block[1] = plan->combine_block[2] = 1;
        }
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

/* Everything a plan needs once its configuration is set: the format on the
 * device, the relpos buckets, the launch shape, the loaded kernel. The one
 * path from a configuration to a runnable plan, analytical or measured. */
static int plan_finish(mha_exec_ctx *c, mha_exec_plan *plan, const mask *folded,
                       const mha_exec_force *force, stof_error *err) {
    int rc = mha_exec_config_check(&plan->config, c->info.smem_per_block_optin, err);
    if (!rc && plan->config.wgmma && !device_wgmma_arch(c->arch))
        rc = err_set(err, STOF_ERR_UNSUPPORTED,
                     "attention: the wgmma build runs on sm_90 GPUs only, this one is %s",
                     c->arch);
    if (!rc && plan->config.tma && !device_tma_arch(c->arch))
        rc = err_set(err, STOF_ERR_UNSUPPORTED,
                     "attention: the TMA build runs on sm_90 and later GPUs, this one is %s",
                     c->arch);
    if (!rc)
        rc = plan->config.kernel == MHA_KERNEL_BLOCK_WISE
                 ? upload_bsr(c, plan, folded, force ? force->split_chunk : 0, err)
                 : upload_csr(c, plan, folded, err);
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
                        plan->smem, &plan->func, plan->config.split ? &plan->combine : NULL,
                        err);
}

/* A new plan: a copy of base (problem, mask statistics, arch), no
 * configuration, no device arrays. */
static mha_exec_plan *plan_clone(const mha_exec_plan *base, stof_error *err) {
    mha_exec_plan *plan = err_malloc(sizeof *plan, err);
    if (plan)
        *plan = *base;
    return plan;
}

/* The analytical plan: mha_exec_choose's configuration. */
static int plan_analytic(mha_exec_ctx *c, const mha_exec_plan *base, const mask *folded,
                         const mha_device_limits *lim, const mha_exec_force *force,
                         mha_exec_plan **out, stof_error *err) {
    mha_exec_plan *plan = plan_clone(base, err);
    if (!plan)
        return STOF_ERR_NOMEM;
    int rc = mha_exec_choose(&plan->problem, folded, lim, force, &plan->config, plan->reason,
                             sizeof plan->reason, err);
    if (!rc)
        rc = plan_finish(c, plan, folded, force, err);
    if (rc) {
        mha_exec_plan_free(c, plan);
        return rc;
    }
    *out = plan;
    return STOF_OK;
}

/* ---- measuring candidates ------------------------------------------------------------ */

/* Scratch inputs of the problem's shape, batch possibly reduced: packed q,
 * k, v rows of [B, max(Sq, Sk), 3 H D], o [B, Sq, H D]. */
typedef struct mha_scratch {
    CUdeviceptr qkv, o;
    int batch;
    mha_exec_tensors t;
} mha_scratch;

#define MHA_SCRATCH_FILL_ELEMS ((size_t)1 << 19) /* a 1 MiB random block, tiled */

static void scratch_free(mha_exec_ctx *c, mha_scratch *s) {
    if (s->qkv)
        c->drv->MemFree(s->qkv);
    if (s->o)
        c->drv->MemFree(s->o);
    s->qkv = s->o = 0;
}

/* Tiles a host block of uniform [-1, 1) values in the dtype over the
 * buffer: not constant (no degenerate softmax), no NaN, cheap to make. */
static int scratch_fill(mha_exec_ctx *c, CUdeviceptr d, size_t bytes, stof_dtype dtype,
                        stof_error *err) {
    uint16_t *h = err_malloc(MHA_SCRATCH_FILL_ELEMS * sizeof *h, err);
    if (!h)
        return STOF_ERR_NOMEM;
    util_rng rng = {0x5eed};
    for (size_t i = 0; i < MHA_SCRATCH_FILL_ELEMS; i++) {
        float x = (float)(2.0 * util_rng_double(&rng) - 1.0);
        h[i] = dtype == STOF_BF16 ? util_f32_to_bf16(x) : util_f32_to_f16(x);
    }
    int rc = STOF_OK;
    const size_t chunk = MHA_SCRATCH_FILL_ELEMS * sizeof *h;
    for (size_t off = 0; off < bytes && !rc; off += chunk)
        rc = cuda_check(c->drv,
                        c->drv->MemcpyHtoD(d + off, h, bytes - off < chunk ? bytes - off : chunk),
                        "cuMemcpyHtoD(scratch)", err);
    free(h);
    return rc;
}

static int scratch_alloc(mha_exec_ctx *c, const mha_exec_problem *p, mha_scratch *s,
                         stof_error *err) {
    memset(s, 0, sizeof *s);
    const size_t elem = stof_dtype_size(p->dtype);
    const int64_t hd = (int64_t)p->heads * p->head_dim;
    const int rows = p->q_len > p->k_len ? p->q_len : p->k_len;
    const size_t qkv_batch = (size_t)(3 * hd * rows) * elem, o_batch = (size_t)(hd * p->q_len) * elem;
    size_t fit = MHA_EXEC_MEASURE_BYTES / (qkv_batch + o_batch);
    int batch = fit < 1 ? 1 : fit < (size_t)p->batch ? (int)fit : p->batch;
    int rc;
    for (;;) {
        rc = cuda_check(c->drv, c->drv->MemAlloc(&s->qkv, qkv_batch * (size_t)batch),
                        "cuMemAlloc(scratch qkv)", err);
        if (!rc)
            rc = cuda_check(c->drv, c->drv->MemAlloc(&s->o, o_batch * (size_t)batch),
                            "cuMemAlloc(scratch o)", err);
        if (!rc || batch == 1)
            break;
        scratch_free(c, s); /* out of memory: try half the batch */
        batch /= 2;
    }
    if (!rc)
        rc = scratch_fill(c, s->qkv, qkv_batch * (size_t)batch, p->dtype, err);
    if (rc) {
        scratch_free(c, s);
        return rc;
    }
    s->batch = batch;
    mha_exec_tensors *t = &s->t;
    memset(t, 0, sizeof *t);
    t->q = s->qkv;
    t->k = s->qkv + (CUdeviceptr)(hd * (int64_t)elem);
    t->v = s->qkv + (CUdeviceptr)(2 * hd * (int64_t)elem);
    t->o = s->o;
    t->q_row_stride = t->k_row_stride = t->v_row_stride = 3 * hd;
    t->q_batch_stride = t->k_batch_stride = t->v_batch_stride = 3 * hd * rows;
    t->o_row_stride = hd;
    t->o_batch_stride = hd * p->q_len;
    /* the relpos table ([buckets][heads]) reads the start of q: in range */
    t->relpos_table = s->qkv;
    return STOF_OK;
}

/* One timed run of a candidate (gpu_timer_work). */
typedef struct timed_run {
    mha_exec_ctx *ctx;
    const mha_exec_plan *plan;
    const mha_exec_tensors *tensors;
} timed_run;

static int run_candidate(void *ud, CUstream st, stof_error *err) {
    const timed_run *r = ud;
    return mha_exec_run(r->ctx, r->plan, r->tensors, st, err);
}

/* The median time of plan on the scratch inputs, ms: the launches of the
 * first s->batch batches (a shallow copy of the plan with a smaller grid;
 * the format's batches beyond are simply not read). */
static int time_plan(mha_exec_ctx *c, const mha_exec_plan *plan, const mha_scratch *s,
                     float *median, stof_error *err) {
    mha_exec_plan tp = *plan;
    tp.problem.batch = s->batch;
    tp.grid[2] = (unsigned)s->batch;
    tp.combine_grid[2] = (unsigned)s->batch;
    timed_run run = {c, &tp, &s->t};
    gpu_timer timer;
    int rc = gpu_timer_create(c->drv, &timer, err);
    if (rc)
        return rc;
    double ms = 0;
    rc = gpu_timer_median(&timer, NULL, MHA_EXEC_MEASURE_WARMUP, MHA_EXEC_MEASURE_RUNS,
                          run_candidate, &run, &ms, NULL, err);
    gpu_timer_free(&timer);
    if (!rc)
        *median = (float)ms;
    return rc;
}

/* One line naming a configuration, for reasons. */
static void config_name(const mha_exec_config *cfg, char *buf, size_t n) {
    if (cfg->kernel == MHA_KERNEL_BLOCK_WISE)
        snprintf(buf, n, "block %dx%d w%d s%d", cfg->block_m, cfg->block_n, cfg->num_warps,
                 cfg->stages);
    else
        snprintf(buf, n, "row-wise %dx%d", cfg->rows_per_warp, cfg->warps_per_block);
}

/* Builds and times every candidate, keeps the fastest (see mha_exec.h). */
static int plan_measured(mha_exec_ctx *c, const mha_exec_plan *base, const mask *folded,
                         const mha_device_limits *lim, const mha_exec_force *force,
                         mha_exec_plan **out, stof_error *err) {
    mha_exec_config *cands = err_malloc(MHA_EXEC_MAX_MEASURED * sizeof *cands, err);
    if (!cands)
        return STOF_ERR_NOMEM;
    int n = 0;
    char why[256];
    mha_scratch s;
    int rc = mha_exec_candidates(&base->problem, folded, lim, force, cands, MHA_EXEC_MAX_MEASURED,
                                 &n, why, sizeof why, err);
    if (!rc)
        rc = scratch_alloc(c, &base->problem, &s, err);
    if (rc) {
        free(cands);
        return rc;
    }
    mha_exec_plan *best = NULL;
    int timed = 0, dead = 0;
    float best_ms = 0;
    stof_error cerr = {0}; /* the last failing candidate's */
    for (int i = 0; i < n && !dead; i++) {
        mha_exec_plan *cand = plan_clone(base, &cerr);
        if (!cand) {
            rc = STOF_ERR_NOMEM;
            break;
        }
        cand->config = cands[i];
        float ms = 0;
        int crc = plan_finish(c, cand, folded, force, &cerr);
        if (!crc)
            crc = time_plan(c, cand, &s, &ms, &cerr);
        if (crc) {
            /* skip it, unless the context is gone (a sticky launch error) */
            mha_exec_plan_free(c, cand);
            rc = crc;
            dead = crc == STOF_ERR_CUDA && c->drv->CtxSynchronize(NULL) != CUDA_SUCCESS;
            continue;
        }
        timed++;
        if (!best || ms < best_ms) {
            mha_exec_plan_free(c, best);
            best = cand;
            best_ms = ms;
        } else {
            mha_exec_plan_free(c, cand);
        }
    }
    scratch_free(c, &s);
    if (!best || dead) {
        free(cands);
        mha_exec_plan_free(c, best);
        if (!rc)
            return err_set(err, STOF_ERR_UNSUPPORTED, "attention: no candidate to measure");
        *err = cerr;
        return rc;
    }
    best->n_measured = timed;
    best->measured_ms = best_ms;
    best->measured_batch = s.batch;
    char first[48];
    config_name(&cands[0], first, sizeof first);
    char measured[96];
    snprintf(measured, sizeof measured, "measured: fastest of %d, %.3f ms at batch %d", timed,
             best_ms, s.batch);
    /* the analytical reason is cut to what fits beside the measured one */
    size_t used = strlen(measured);
    memcpy(best->reason, measured, used + 1);
    if (snprintf(best->reason + used, sizeof best->reason - used, " (analytical: %s, %s)",
                 first, why) < 0)
        best->reason[used] = '\0';
    free(cands);
    *out = best;
    return STOF_OK;
}

int mha_exec_plan_create(mha_exec_ctx *c, const mha_exec_problem *p, const mha_exec_force *force,
                         mha_exec_plan **out, stof_error *err) {
    *out = NULL;
    int rc = mha_exec_validate(p, err);
    if (rc)
        return rc;
    if ((rc = cuda_check(c->drv, c->drv->CtxSetCurrent(c->cu), "cuCtxSetCurrent", err)))
        return rc;
    mask *folded = NULL;
    if ((rc = mha_exec_fold_mask(p, &folded, err)))
        return rc;
    /* what every candidate plan shares: the problem and the mask's statistics */
    mha_exec_plan base;
    memset(&base, 0, sizeof base);
    base.problem = *p;
    base.problem.mask = NULL; /* not owned: do not keep a pointer that may dangle */
    snprintf(base.mask_desc, sizeof base.mask_desc, "%s", folded->desc ? folded->desc : "?");
    base.allowed_pairs = count_allowed(folded, p->batch);
    mha_device_limits lim;
    device_limits(c, &base, &lim);
    if (force && force->measure > 0)
        rc = plan_measured(c, &base, folded, &lim, force, out, err);
    else
        rc = plan_analytic(c, &base, folded, &lim, force, out, err);
    mask_free(folded);
    if (!rc)
        (*out)->problem.mask = NULL;
    return rc;
}

void mha_exec_plan_free(mha_exec_ctx *c, mha_exec_plan *plan) {
    if (!plan)
        return;
    c->drv->CtxSetCurrent(c->cu);
    CUdeviceptr ptrs[] = {plan->d_row_ptr,  plan->d_col_idx,        plan->d_mask_idx,
                          plan->d_bitmaps,  plan->d_relpos_bucket,  plan->d_work_ptr,
                          plan->d_work,     plan->d_split_ptr,      plan->d_splits,
                          plan->d_workspace};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        if (ptrs[i])
            c->drv->MemFree(ptrs[i]);
    free(plan);
}

size_t mha_exec_plan_describe(const mha_exec_plan *plan, char *buf, size_t n) {
    const mha_exec_config *cfg = &plan->config;
    char split[160] = "";
    if (cfg->split)
        snprintf(split, sizeof split,
                 "; split %d rows into %d items (chunk %d; %d work items, combine grid "
                 "%ux%ux%u, workspace %zu B)",
                 plan->split_rows, plan->split_slots, plan->split_chunk, plan->split_items,
                 plan->combine_grid[0], plan->combine_grid[1], plan->combine_grid[2],
                 plan->workspace_bytes);
    int k;
    if (cfg->kernel == MHA_KERNEL_BLOCK_WISE)
        k = snprintf(buf, n,
                     "block-wise%s BLOCK_M=%d BLOCK_N=%d warps=%d stages=%d%s "
                     "smem=%zuB grid=%ux%ux%u %s D=%d%s; %d loaded blocks (%d partial, %d "
                     "bitmaps), fmt_batch %d%s; %s",
                     cfg->wgmma ? " wgmma" : "", cfg->block_m, cfg->block_n,
                     cfg->num_warps, cfg->stages, cfg->tma ? " tma" : "",
                     plan->smem,
                     plan->grid[0], plan->grid[1], plan->grid[2], stof_dtype_name(cfg->dtype),
                     cfg->head_dim, cfg->relpos ? " relpos" : "", plan->n_loaded_blocks,
                     plan->n_partial_blocks, plan->n_bitmaps, plan->fmt_batch, split,
                     plan->reason);
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
        if (plan->config.split) {
            a->work_ptr = (const stof_i32 *)(uintptr_t)plan->d_work_ptr;
            a->work = (const stof_attn_work *)(uintptr_t)plan->d_work;
            a->split_ptr = (const stof_i32 *)(uintptr_t)plan->d_split_ptr;
            a->splits = (const stof_attn_split *)(uintptr_t)plan->d_splits;
            a->partial_o = (float *)(uintptr_t)plan->d_workspace;
            a->partial_ml = (float *)(uintptr_t)(plan->d_workspace + plan->workspace_ml_offset);
            a->n_slots = plan->split_slots;
        }
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
    if (!ptr || ptr % 16 || batch_stride % 8 || row_stride % 8 || row_stride <= 0 ||
        row_stride > STOF_ATTN_MAX_ROW_STRIDE)
        return err_set(err, STOF_ERR_INVALID,
                       "attention: %s must be a 16-byte aligned device pointer with strides "
                       "that are positive multiples of 8 elements, the row stride at most %lld "
                       "(pointer 0x%llx, batch stride %lld, row stride %lld)",
                       name, (long long)STOF_ATTN_MAX_ROW_STRIDE, (unsigned long long)ptr,
                       (long long)batch_stride, (long long)row_stride);
    return STOF_OK;
}

/* The tensor map of K or V for the TMA build (attention_abi.cuh): 16-bit
 * elements, dims (heads * head_dim, k_len, batches), boxes 64 x BLOCK_N x 1
 * in the 128-byte swizzle, rows outside the tensor read as zeros. A batch
 * stride of 0 (one tensor for every batch) is one batch, *batch_step 0. */
static int encode_kv_map(const cuda_driver *drv, const mha_exec_plan *plan, const char *name,
                         CUdeviceptr ptr, int64_t batch_stride, int64_t row_stride,
                         stof_attn_tmap *map, stof_i32 *batch_step, stof_error *err) {
    const mha_exec_problem *p = &plan->problem;
    const int one = batch_stride == 0 || p->batch == 1;
    const cuuint64_t e = 2, row_bytes = (cuuint64_t)row_stride * e;
    const cuuint64_t dims[3] = {(cuuint64_t)p->heads * (cuuint64_t)p->head_dim,
                                (cuuint64_t)p->k_len, one ? 1 : (cuuint64_t)p->batch};
    const cuuint64_t strides[2] = {row_bytes,
                                   one ? row_bytes * (cuuint64_t)p->k_len
                                       : (cuuint64_t)batch_stride * e};
    const cuuint32_t box[3] = {64, (cuuint32_t)plan->config.block_n, 1};
    const cuuint32_t unit[3] = {1, 1, 1};
    _Static_assert(sizeof(CUtensorMap) == sizeof(stof_attn_tmap), "tensor map size");
    CUresult r = drv->TensorMapEncodeTiled(
        (CUtensorMap *)map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, (void *)(uintptr_t)ptr, dims,
        strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cuTensorMapEncodeTiled(attention %s, batch stride %lld)",
                 name, (long long)batch_stride);
        return cuda_check(drv, r, what, err);
    }
    *batch_step = one ? 0 : 1;
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
    if (plan->config.tma &&
        ((rc = encode_kv_map(c->drv, plan, "k", t->k, t->k_batch_stride, t->k_row_stride,
                             &args.tmap_k, &args.k_tma_batch, err)) ||
         (rc = encode_kv_map(c->drv, plan, "v", t->v, t->v_batch_stride, t->v_row_stride,
                             &args.tmap_v, &args.v_tma_batch, err))))
        return rc;
    void *params[] = {&args};
    rc = cuda_launch(c->drv, plan->func, plan->grid, plan->block, (unsigned)plan->smem, s, params,
                     c->pdl, "cuLaunchKernel(attention)", err);
    if (rc || !plan->config.split)
        return rc;
    return cuda_launch(c->drv, plan->combine, plan->combine_grid, plan->combine_block, 0, s,
                       params, c->pdl, "cuLaunchKernel(attention combine)", err);
}
