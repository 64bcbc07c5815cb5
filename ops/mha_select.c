/* Eq. 1 (row-wise or block-wise) and Eq. 2 (block sizes and warps) of the
 * paper, on plain numbers: the 16x16 block format of the mask and the device
 * limits. See mha_select.h for the formulas and the choices made where the
 * paper leaves them open. */
#include "ops/mha_select.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/base/error.h"

/* Stage 2 search space: powers of two that are multiples of 16. */
static const int block_sizes[] = {16, 32, 64, 128};
static const int warp_counts[] = {1, 2, 4, 8};
#define N_BLOCK_SIZES ((int)(sizeof block_sizes / sizeof block_sizes[0]))
#define N_WARP_COUNTS ((int)(sizeof warp_counts / sizeof warp_counts[0]))

/* Row-wise defaults: one warp walks one query row's allowed keys. */
#define ROW_WISE_ROWS_PER_WARP 1
#define ROW_WISE_WARPS_PER_BLOCK 4

#define WARP_SIZE 32
#define KIB 1024

/* ---- architectures ------------------------------------------------------------ */

/* Datasheet values (CUDA occupancy tables): shared memory per SM and the
 * opt-in maximum per block, both in bytes. */
static const mha_device_limits known_archs[] = {
    {108, 164 * KIB, 163 * KIB, 64, 1024, "sm_80"}, /* A100 */
    {82, 100 * KIB, 99 * KIB, 48, 1024, "sm_86"},   /* RTX 3090 */
    {128, 100 * KIB, 99 * KIB, 48, 1024, "sm_89"},  /* RTX 4090 */
    {132, 228 * KIB, 227 * KIB, 64, 1024, "sm_90"}, /* H100 SXM */
};
#define N_KNOWN_ARCHS ((int)(sizeof known_archs / sizeof known_archs[0]))

int mha_limits_for_arch(const char *arch, mha_device_limits *out, stof_error *err) {
    for (int i = 0; arch && i < N_KNOWN_ARCHS; i++) {
        if (!strcmp(arch, known_archs[i].arch)) {
            *out = known_archs[i];
            return STOF_OK;
        }
    }
    char names[128] = "";
    for (int i = 0; i < N_KNOWN_ARCHS; i++) {
        size_t len = strlen(names);
        snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "", known_archs[i].arch);
    }
    return err_set(err, STOF_ERR_INVALID, "unknown GPU architecture \"%s\": known are %s",
                   arch ? arch : "(null)", names);
}

/* ---- validation ----------------------------------------------------------------- */

static int check_problem(const mha_problem *p, stof_error *err) {
    if (p->batch < 1 || p->heads < 1 || p->head_dim < 1 || p->q_len < 1 || p->k_len < 1)
        return err_set(err, STOF_ERR_INVALID,
                       "mha select: batch %d, heads %d, head_dim %d, q_len %d, k_len %d must "
                       "all be positive",
                       p->batch, p->heads, p->head_dim, p->q_len, p->k_len);
    if (p->dtype_bytes < 1 || p->dtype_bytes > 8)
        return err_set(err, STOF_ERR_INVALID, "mha select: element size %d bytes is not 1..8",
                       p->dtype_bytes);
    const mask_bsr *f = p->blocks16;
    if (!f)
        return STOF_OK;
    if (f->block_m != MHA_SELECT_STAGE1_BLOCK || f->block_n != MHA_SELECT_STAGE1_BLOCK)
        return err_set(err, STOF_ERR_INVALID,
                       "mha select: Eq. 1 needs the mask at 16x16 blocks, got %dx%d", f->block_m,
                       f->block_n);
    if (f->q_len != p->q_len || f->k_len != p->k_len)
        return err_set(err, STOF_ERR_INVALID,
                       "mha select: the mask is %dx%d but attention is %d queries x %d keys",
                       f->q_len, f->k_len, p->q_len, p->k_len);
    if (f->batch != 1 && f->batch != p->batch)
        return err_set(err, STOF_ERR_INVALID,
                       "mha select: the mask has %d batches, attention has %d", f->batch,
                       p->batch);
    return STOF_OK;
}

static int check_limits(const mha_device_limits *l, stof_error *err) {
    if (l->sm_count < 1 || l->smem_per_sm < 1 || l->smem_per_block < 1 ||
        l->max_warps_per_sm < 1 || l->max_threads_per_block < WARP_SIZE)
        return err_set(err, STOF_ERR_INVALID,
                       "mha select: device limits must be positive (%d SMs, %d B smem per SM, "
                       "%d B per block, %d warps per SM, %d threads per block)",
                       l->sm_count, l->smem_per_sm, l->smem_per_block, l->max_warps_per_sm,
                       l->max_threads_per_block);
    return STOF_OK;
}

/* ---- stage 1: Eq. 1 ------------------------------------------------------------- */

mha_kernel mha_select_stage1(const mha_problem *p, mha_selection *out) {
    int rows = (p->q_len + MHA_SELECT_STAGE1_BLOCK - 1) / MHA_SELECT_STAGE1_BLOCK;
    int cols = (p->k_len + MHA_SELECT_STAGE1_BLOCK - 1) / MHA_SELECT_STAGE1_BLOCK;
    const mask_bsr *f = p->blocks16;
    out->n_block_rows16 = rows;
    out->n_block_cols16 = cols;
    /* load_row_ptr[rows] of each stored batch is its loaded count; the total
     * over batches divided by their number is the average. */
    out->loaded_blocks16 = f ? (double)f->n_load / f->batch : (double)rows * cols;
    out->load_ratio = out->loaded_blocks16 / ((double)rows * cols);
    if (cols <= 1) {
        out->penalty = INFINITY;
        out->threshold = -INFINITY;
        out->reason = "k_len <= 16 (log2 of one block column is 0): row-wise";
        return out->kernel = MHA_KERNEL_ROW_WISE;
    }
    double lg = log2((double)cols);
    out->penalty = MHA_SELECT_TAU / (lg * lg);
    out->threshold = out->load_ratio - out->penalty;
    if (out->threshold < 0) {
        out->reason = "threshold < 0: few loaded 16x16 blocks, row-wise";
        return out->kernel = MHA_KERNEL_ROW_WISE;
    }
    out->reason = "threshold >= 0: block-wise";
    return out->kernel = MHA_KERNEL_BLOCK_WISE;
}

/* ---- stage 2: Eq. 2 ------------------------------------------------------------- */

static int64_t req_smem_bytes(const mha_problem *p, int block_m, int block_n) {
    int64_t w = (int64_t)p->head_dim + MHA_SELECT_PADDING;
    int64_t elems = (2LL * block_m + block_n) * w +
                    (int64_t)block_m * (block_n + MHA_SELECT_PADDING);
    return elems * p->dtype_bytes;
}

static mha_verdict candidate_verdict(const mha_device_limits *lim, const mha_candidate *c) {
    if (c->num_warps * MHA_SELECT_ROWS_PER_WARP_TILE > c->block_m)
        return MHA_WARPS_EXCEED_ROWS;
    if (c->block_m > c->num_warps * MHA_SELECT_MAX_ROWS_PER_WARP)
        return MHA_ROWS_EXCEED_WARPS;
    if (c->block_m / c->num_warps * c->block_n / WARP_SIZE > MHA_SELECT_MAX_SCORES_PER_THREAD)
        return MHA_SCORES_EXCEED_REGS;
    if (c->num_warps * WARP_SIZE > lim->max_threads_per_block)
        return MHA_THREADS_EXCEED_LIMIT;
    if (c->req_smem > lim->smem_per_block)
        return MHA_SMEM_EXCEEDS_BLOCK;
    if (c->blocks_per_sm < 1)
        return MHA_NO_OCCUPANCY;
    return MHA_FEASIBLE;
}

void mha_score_candidate(const mha_problem *p, const mha_device_limits *lim, int block_m,
                         int block_n, int num_warps, mha_candidate *out) {
    memset(out, 0, sizeof *out);
    out->block_m = block_m;
    out->block_n = block_n;
    out->num_warps = num_warps;
    out->req_smem = req_smem_bytes(p, block_m, block_n);
    /* Whole thread blocks per SM, by shared memory and by warps. */
    int64_t by_smem = lim->smem_per_sm / out->req_smem;
    int64_t by_warps = lim->max_warps_per_sm / num_warps;
    out->blocks_per_sm = (int)(by_smem < by_warps ? by_smem : by_warps);
    out->occ = (double)num_warps * out->blocks_per_sm / lim->max_warps_per_sm;
    /* One product and one quotient, so settings with equal BLOCK_M^2 BLOCK_N
     * get bit-identical scores and the tie-breaks decide. */
    double work = (double)lim->sm_count * p->q_len * p->heads * p->batch;
    double area = (double)block_m * block_m * block_n;
    out->score = out->occ * sqrt(work / area);
    out->verdict = candidate_verdict(lim, out);
}

int mha_candidate_compare(const mha_candidate *a, const mha_candidate *b) {
    int fa = a->verdict == MHA_FEASIBLE, fb = b->verdict == MHA_FEASIBLE;
    if (fa != fb)
        return fa - fb;
    double scale = fmax(fabs(a->score), fabs(b->score));
    if (fabs(a->score - b->score) > 1e-9 * scale)
        return a->score > b->score ? 1 : -1;
    if (a->block_n != b->block_n)
        return a->block_n > b->block_n ? 1 : -1;
    if (a->num_warps != b->num_warps)
        return a->num_warps < b->num_warps ? 1 : -1;
    if (a->block_m != b->block_m)
        return a->block_m > b->block_m ? 1 : -1;
    return 0;
}

/* Fills the table with every setting and picks the best feasible one. */
static void select_stage2(const mha_problem *p, const mha_device_limits *lim,
                          mha_selection *out) {
    out->n_candidates = 0;
    out->best = -1;
    for (int i = 0; i < N_BLOCK_SIZES; i++) {
        for (int j = 0; j < N_BLOCK_SIZES; j++) {
            for (int k = 0; k < N_WARP_COUNTS; k++) {
                mha_candidate *c = &out->table[out->n_candidates];
                mha_score_candidate(p, lim, block_sizes[i], block_sizes[j], warp_counts[k], c);
                if (c->verdict == MHA_FEASIBLE &&
                    (out->best < 0 || mha_candidate_compare(c, &out->table[out->best]) > 0))
                    out->best = out->n_candidates;
                out->n_candidates++;
            }
        }
    }
    if (out->best >= 0) {
        out->block_m = out->table[out->best].block_m;
        out->block_n = out->table[out->best].block_n;
        out->num_warps = out->table[out->best].num_warps;
    }
}

int mha_select(const mha_problem *p, const mha_device_limits *lim, mha_selection *out,
               stof_error *err) {
    memset(out, 0, sizeof *out);
    out->best = -1;
    int rc = check_problem(p, err);
    if (!rc)
        rc = check_limits(lim, err);
    if (rc)
        return rc;
    out->problem = *p;
    out->problem.blocks16 = NULL;
    out->limits = *lim;
    out->rows_per_warp = ROW_WISE_ROWS_PER_WARP;
    out->warps_per_block = ROW_WISE_WARPS_PER_BLOCK;
    mha_select_stage1(p, out);
    select_stage2(p, lim, out);
    if (out->kernel == MHA_KERNEL_BLOCK_WISE && out->best < 0) {
        out->kernel = MHA_KERNEL_ROW_WISE;
        out->reason = "threshold >= 0, but no block-wise setting fits the device: row-wise";
    }
    return STOF_OK;
}

/* ---- names and text ------------------------------------------------------------- */

const char *mha_kernel_name(mha_kernel k) {
    return k == MHA_KERNEL_BLOCK_WISE ? "block-wise" : "row-wise";
}

const char *mha_verdict_name(mha_verdict v) {
    switch (v) {
    case MHA_FEASIBLE: return "feasible";
    case MHA_WARPS_EXCEED_ROWS: return "warps x 16 > BLOCK_M";
    case MHA_ROWS_EXCEED_WARPS: return "BLOCK_M / warps > 64 rows per warp";
    case MHA_THREADS_EXCEED_LIMIT: return "too many threads";
    case MHA_SMEM_EXCEEDS_BLOCK: return "smem > per-block limit";
    case MHA_NO_OCCUPANCY: return "no block fits an SM";
    case MHA_SCORES_EXCEED_REGS: return "rows per warp x BLOCK_N / 32 > 128 scores a thread";
    }
    return "unknown";
}

/* snprintf into a buffer that keeps counting past its end. */
typedef struct text_out {
    char *buf;
    size_t n, len;
} text_out;

static void text_printf(text_out *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_printf(text_out *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = t->len < t->n ? t->n - t->len : 0;
    int k = vsnprintf(room ? t->buf + t->len : NULL, room, fmt, ap);
    va_end(ap);
    if (k > 0)
        t->len += (size_t)k;
}

static void format_stage1(const mha_selection *s, text_out *t) {
    text_printf(t, "kernel: %s (%s)\n", mha_kernel_name(s->kernel), s->reason);
    text_printf(t, "stage 1 (Eq. 1): %.6g of %d x %d blocks of 16x16 loaded, ratio %.6f",
                s->loaded_blocks16, s->n_block_rows16, s->n_block_cols16, s->load_ratio);
    if (isinf(s->penalty))
        text_printf(t, "; k_len <= 16, no penalty defined\n");
    else
        text_printf(t, " - penalty %.1f / log2(%d)^2 = %.6f -> threshold %.6f\n", MHA_SELECT_TAU,
                    s->n_block_cols16, s->penalty, s->threshold);
}

static void format_stage2(const mha_selection *s, text_out *t) {
    const mha_device_limits *l = &s->limits;
    const mha_problem *p = &s->problem;
    text_printf(t,
                "stage 2 (Eq. 2) on %s: %d SMs, %d B smem/SM, %d B smem/block, %d warps/SM; "
                "batch %d, heads %d, head_dim %d, q_len %d, %d-byte elements\n",
                l->arch ? l->arch : "(unnamed device)", l->sm_count, l->smem_per_sm,
                l->smem_per_block, l->max_warps_per_sm, p->batch, p->heads, p->head_dim,
                p->q_len, p->dtype_bytes);
    if (s->best >= 0)
        text_printf(t, "best block-wise setting: BLOCK_M %d, BLOCK_N %d, num_warps %d (score %.4f)\n",
                    s->block_m, s->block_n, s->num_warps, s->table[s->best].score);
    else
        text_printf(t, "best block-wise setting: none fits the device\n");
    text_printf(t, "%7s %7s %5s %12s %9s %7s %10s  %s\n", "BLOCK_M", "BLOCK_N", "warps",
                "req_SMEM(B)", "blocks/SM", "OCC", "score", "verdict");
    for (int i = 0; i < s->n_candidates; i++) {
        const mha_candidate *c = &s->table[i];
        text_printf(t, "%7d %7d %5d %12lld %9d %7.4f %10.4f  %s%s\n", c->block_m, c->block_n,
                    c->num_warps, (long long)c->req_smem, c->blocks_per_sm, c->occ, c->score,
                    mha_verdict_name(c->verdict), i == s->best ? "  <- best" : "");
    }
}

size_t mha_selection_format(const mha_selection *s, char *buf, size_t n) {
    text_out t = {buf, n, 0};
    if (n)
        buf[0] = '\0';
    format_stage1(s, &t);
    if (s->kernel == MHA_KERNEL_ROW_WISE)
        text_printf(&t, "row-wise launch: %d query row per warp, %d warps per block\n",
                    s->rows_per_warp, s->warps_per_block);
    format_stage2(s, &t);
    return t.len;
}
