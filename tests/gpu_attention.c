/* The attention kernels on the GPU against an fp64 CPU reference.
 *
 * For fp16 and bf16, head_dim 64 and 128, every mask case below runs through
 * the row-wise kernel, the planner's own choice, the block-wise kernel at
 * Eq. 2's sizes and at fixed (BLOCK_M, BLOCK_N, NUM_WARPS) settings, with a
 * K/V pipeline of 2 stages and of 3 and 4 (STAGES), and with long block rows
 * split into work items (mha_exec_force.split_chunk: forced at chunks of 2,
 * 3 and 4 loaded blocks so that most cases cut rows; the SPLIT=1 build and
 * its combine kernel); one case also through a measured plan
 * (mha_exec_force.measure: candidates timed on scratch). Inputs
 * are fresh seeded uniform [-1, 1] values rounded to the dtype; the output
 * is poisoned with NaN before every launch. Checked per run: relative error
 * ||out - ref|| / ||ref|| (< 5e-3 fp16, < 2e-2 bf16), every element finite,
 * rows with no allowed key exactly zero. The "padded" cases pass a run-time
 * attention_mask of the given lengths (-DPADDING=1 builds): keys past a
 * sequence's length are masked, its padded rows must be zeros; each such run is
 * repeated in the ragged layout (the sequences' rows one after another, then
 * RAGGED_TAIL rows of large values that must not count): the same values on
 * the real rows, and no row outside the sequences written. The "GQA" cases
 * (grouped-query attention) give K and V fewer heads than Q (kv_heads): query
 * head h reads K/V head h / (heads / kv_heads). One line per run, so a remote log
 * says what is wrong. Then the block-wise kernel is timed at one big shape
 * at several settings and depths, and a measured plan is made there, and
 * split rows off vs automatic at Longformer and BigBird (1, 4096) and
 * (8, 1024) (informational; every output is spot-checked on sampled rows).
 *
 * Exit 77 with "SKIPPED: <reason>" when there is no GPU. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu_open.h"
#include "core/exec/attention/mha_exec.h"
#include "core/base/util.h"
#include "ops/mask.h"
#include "ops/ops.h"

#define GPU_CTX_TYPE mha_exec_ctx
#include "gpu_common.h"

#define TOL_F16 5e-3
#define TOL_BF16 2e-2

/* ---- one test case ------------------------------------------------------------------- */

typedef enum mask_source { SRC_NONE, SRC_SPEC, SRC_EMPTY_ROWS } mask_source;

typedef struct tcase {
    const char *name;
    mask_source src;
    const char *spec; /* SRC_SPEC: text form */
    int batch, heads, q_len, k_len;
    int causal, cross;
    int relpos, bidirectional; /* T5 bias: 32 buckets, max distance 128 */
    float scale;               /* 0: 1/sqrt(head_dim); negative: the kernels' pre-scaled path */
    int shared_kv;             /* cross only: one K, V for every batch (batch stride 0) */
    const int *pad;            /* a run-time attention_mask of these lengths, one a batch */
    int kv_heads;              /* grouped-query attention: K/V heads (dividing heads); 0: heads */
    int n_global;              /* global tokens (Longformer's): the first n_global positions of
                                  global_positions under q_len, in every batch (those past a
                                  sequence's length are padding), with their own Q, K, V */
} tcase;

static const int global_positions[] = {0, 5, 6, 63, 64, 127, 200, 331, 332, 500, 777, 999};

static int case_kv_heads(const tcase *tc) {
    return tc->kv_heads > 0 ? tc->kv_heads : tc->heads;
}

static const int pad_3[] = {257, 100, 1}, pad_2[] = {1000, 333}, pad_0[] = {0, 64};

static const tcase cases[] = {
    {"full", SRC_NONE, NULL, 2, 2, 257, 257, 0, 0, 0, 0, 0, 0, NULL, 0, 0},
    {"full", SRC_NONE, NULL, 2, 2, 128, 128, 0, 0, 0, 0, 0, 0, NULL, 0, 0},
    {"causal", SRC_NONE, NULL, 2, 2, 257, 257, 1, 0, 0, 0, 0, 0, NULL, 0, 0},
    {"sliding_window{}", SRC_SPEC, "sliding_window{}", 2, 2, 1000, 1000, 0, 0, 0, 0, 0, 0, NULL, 0, 0},
    {"sliding_window{} S512", SRC_SPEC, "sliding_window{}", 1, 2, 512, 512, 0, 0, 0, 0, 0, 0,
     NULL, 0, 0},
    {"dilated{}", SRC_SPEC, "dilated{}", 2, 2, 512, 512, 0, 0, 0, 0, 0, 0, NULL, 0, 0},
    {"longformer{}", SRC_SPEC, "longformer{}", 2, 2, 1024, 1024, 0, 0, 0, 0, 0, 0, NULL, 0, 0},
    {"bigbird{}", SRC_SPEC, "bigbird{}", 2, 2, 1024, 1024, 0, 0, 0, 0, 0, 0, NULL, 0, 0},
    {"scattered", SRC_SPEC, "union(random{rate=0.3, block=8}, sliding_window{})", 2, 2, 257,
     257, 0, 0, 0, 0, 0, 0, NULL, 0, 0},
    {"scattered+causal", SRC_SPEC, "union(random{rate=0.3, block=8}, sliding_window{})", 1, 2,
     100, 100, 1, 0, 0, 0, 0, 0, NULL, 0, 0},
    {"empty rows (dense)", SRC_EMPTY_ROWS, NULL, 1, 3, 128, 128, 0, 0, 0, 0, 0, 0, NULL, 0, 0},
    {"key_padding [0,77]", SRC_SPEC, "key_padding{lengths=[0, 77]}", 2, 2, 100, 100, 0, 0, 0, 0,
     0, 0, NULL, 0, 0},
    {"key_padding [100,37,1]", SRC_SPEC, "key_padding{lengths=[100, 37, 1]}", 3, 2, 100, 100, 0,
     0, 0, 0, 0, 0, NULL, 0, 0},
    {"per_batch(sliding,bigbird)", SRC_SPEC, "per_batch(sliding_window{band=8}, bigbird{})", 2, 2,
     257, 257, 0, 0, 0, 0, 0, 0, NULL, 0, 0},
    {"sliding+causal", SRC_SPEC, "sliding_window{}", 1, 2, 128, 128, 1, 0, 0, 0, 0, 0, NULL, 0, 0},
    {"cross full", SRC_NONE, NULL, 2, 2, 100, 257, 0, 1, 0, 0, 0, 0, NULL, 0, 0},
    {"cross bigbird+causal", SRC_SPEC, "bigbird{}", 1, 2, 128, 512, 1, 1, 0, 0, 0, 0, NULL, 0, 0},
    {"cross causal Sq>Sk", SRC_NONE, NULL, 1, 2, 257, 100, 1, 1, 0, 0, 0, 0, NULL, 0, 0},
    {"T5 relpos causal", SRC_NONE, NULL, 2, 2, 257, 257, 1, 0, 1, 0, 1.0f, 0, NULL, 0, 0},
    {"T5 relpos bidir longformer", SRC_SPEC, "longformer{}", 1, 2, 512, 512, 0, 0, 1, 1, 1.0f, 0,
     NULL, 0, 0},
    {"T5 relpos cross", SRC_NONE, NULL, 1, 2, 100, 300, 0, 1, 1, 1, 1.0f, 0, NULL, 0, 0},
    {"T5 relpos bidir bigbird", SRC_SPEC, "bigbird{}", 1, 2, 1024, 1024, 0, 0, 1, 1, 1.0f, 0,
     NULL, 0, 0},
    {"bigbird{} scale<0", SRC_SPEC, "bigbird{}", 1, 2, 300, 300, 0, 0, 0, 0, -0.125f, 0, NULL, 0, 0},
    {"cross shared kv bigbird", SRC_SPEC, "bigbird{}", 3, 2, 100, 300, 0, 1, 0, 0, 0, 1, NULL, 0, 0},
    {"padded full [257,100,1]", SRC_NONE, NULL, 3, 2, 257, 257, 0, 0, 0, 0, 0, 0, pad_3, 0, 0},
    {"padded sliding_window{} [1000,333]", SRC_SPEC, "sliding_window{}", 2, 2, 1000, 1000, 0, 0,
     0, 0, 0, 0, pad_2, 0, 0},
    {"padded bigbird{} [257,100,1]", SRC_SPEC, "bigbird{}", 3, 2, 257, 257, 0, 0, 0, 0, 0, 0,
     pad_3, 0, 0},
    {"padded causal [0,64]", SRC_NONE, NULL, 2, 2, 128, 128, 1, 0, 0, 0, 0, 0, pad_0, 0, 0},
    {"padded T5 relpos bidir [1000,333]", SRC_NONE, NULL, 2, 2, 1000, 1000, 0, 0, 1, 1, 1.0f, 0,
     pad_2, 0, 0},
    /* grouped-query attention: query head h reads K/V head h / (heads / kv_heads) */
    {"GQA causal H4 KV2", SRC_NONE, NULL, 2, 4, 257, 257, 1, 0, 0, 0, 0, 0, NULL, 2, 0},
    {"GQA sliding_window{} H4 KV1", SRC_SPEC, "sliding_window{}", 2, 4, 1000, 1000, 0, 0, 0, 0, 0,
     0, NULL, 1, 0},
    {"GQA padded bigbird{} H4 KV2 [257,100,1]", SRC_SPEC, "bigbird{}", 3, 4, 257, 257, 0, 0, 0, 0,
     0, 0, pad_3, 2, 0},
    {"GQA cross full H4 KV2", SRC_NONE, NULL, 2, 4, 100, 257, 0, 1, 0, 0, 0, 0, NULL, 2, 0},
    /* global tokens: the window's row log-sum-exp, the merge of the global keys it left out,
     * the global rows; under a dense mask the global rows only */
    {"global sliding_window{} G9 [1000,333]", SRC_SPEC, "sliding_window{}", 2, 2, 1000, 1000, 0,
     0, 0, 0, 0, 0, pad_2, 0, 9},
    {"global longformer{} G12", SRC_SPEC, "longformer{}", 1, 2, 1024, 1024, 0, 0, 0, 0, 0, 0,
     NULL, 0, 12},
    {"global full G4 [257,100,1]", SRC_NONE, NULL, 3, 2, 257, 257, 0, 0, 0, 0, 0, 0, pad_3, 0, 4},
    {"GQA global sliding_window{band=8} G7 H4 KV2", SRC_SPEC, "sliding_window{band=8}", 2, 4,
     257, 257, 0, 0, 0, 0, 0, 0, pad_3 + 1, 2, 7},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* Kernel settings run on every case. */
typedef struct setting {
    const char *name;
    int kernel; /* -1 auto */
    int block_m, block_n, num_warps;
    int stages;  /* 0: automatic */
    int measure; /* > 0: a measured plan */
    int split;   /* mha_exec_force.split_chunk: 0 automatic, -1 never, N chunks of N */
    int wgmma;   /* the wgmma build (sm_90 only; elsewhere the plan is refused: SKIP) */
    int tma;     /* mma.sync builds: 0 automatic (K, V by TMA on sm_90+), -1 cp.async */
} setting;

/* The fixed block-wise settings run the plain kernel (split -1); "auto" and
 * "eq2" split as the library does by default; the "c" settings force every
 * block row longer than 2, 3 or 4 loaded blocks to be cut (the split build
 * and the combine kernel on every case: fully masked rows, per-batch
 * masks, cross-attention, relpos). */
static const setting settings[] = {
    {"row", MHA_KERNEL_ROW_WISE, 0, 0, 0, 0, 0, 0, 0, 0},
    {"auto", -1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"eq2", MHA_KERNEL_BLOCK_WISE, 0, 0, 0, 0, 0, 0, 0, 0},
    {"64x64w4", MHA_KERNEL_BLOCK_WISE, 64, 64, 4, 2, 0, -1, 0, 0},
    {"128x64w4", MHA_KERNEL_BLOCK_WISE, 128, 64, 4, 2, 0, -1, 0, 0},
    {"64x32w4", MHA_KERNEL_BLOCK_WISE, 64, 32, 4, 2, 0, -1, 0, 0},
    {"128x128w8", MHA_KERNEL_BLOCK_WISE, 128, 128, 8, 2, 0, -1, 0, 0},
    {"16x16w1s4", MHA_KERNEL_BLOCK_WISE, 16, 16, 1, 4, 0, -1, 0, 0},
    {"64x32w4s3", MHA_KERNEL_BLOCK_WISE, 64, 32, 4, 3, 0, -1, 0, 0},
    {"64x64w4c2", MHA_KERNEL_BLOCK_WISE, 64, 64, 4, 2, 0, 2, 0, 0},
    {"64x32w4c4", MHA_KERNEL_BLOCK_WISE, 64, 32, 4, 2, 0, 4, 0, 0},
    {"16x16w1c4", MHA_KERNEL_BLOCK_WISE, 16, 16, 1, 2, 0, 4, 0, 0},
    {"128x64w4c3", MHA_KERNEL_BLOCK_WISE, 128, 64, 4, 2, 0, 3, 0, 0},
    {"eq2c2", MHA_KERNEL_BLOCK_WISE, 0, 0, 0, 0, 0, 2, 0, 0},
    {"wg64x64", MHA_KERNEL_BLOCK_WISE, 64, 64, 4, 3, 0, -1, 1, 0},
    {"wg64x16s3", MHA_KERNEL_BLOCK_WISE, 64, 16, 4, 3, 0, -1, 1, 0},
    {"wg128x64s3", MHA_KERNEL_BLOCK_WISE, 128, 64, 8, 3, 0, -1, 1, 0},
    {"wg64x32c3", MHA_KERNEL_BLOCK_WISE, 64, 32, 4, 3, 0, 3, 1, 0},
    /* on sm_90 the settings above take TMA where they can; these keep cp.async */
    {"64x64w4cp", MHA_KERNEL_BLOCK_WISE, 64, 64, 4, 2, 0, -1, 0, -1},
    {"32x32w2s3cp", MHA_KERNEL_BLOCK_WISE, 32, 32, 2, 3, 0, -1, 0, -1},
    {"16x16w1s4cp", MHA_KERNEL_BLOCK_WISE, 16, 16, 1, 4, 0, -1, 0, -1},
    {"64x32w4c4cp", MHA_KERNEL_BLOCK_WISE, 64, 32, 4, 2, 0, 4, 0, -1},
    /* and these TMA at other depths and shapes */
    {"32x32w2s4", MHA_KERNEL_BLOCK_WISE, 32, 32, 2, 4, 0, -1, 0, 0},
    {"32x32w1s3c3", MHA_KERNEL_BLOCK_WISE, 32, 32, 1, 3, 0, 3, 0, 0},
};
#define N_SETTINGS ((int)(sizeof settings / sizeof settings[0]))

/* A measured plan, run on one cross-attention case (Sk > Sq: the scratch
 * buffers' rows) for fp16 D=64; its candidates split at chunk 2 too. */
static const setting measured_settings[] = {
    {"measure2", -1, 0, 0, 0, 0, 2, 0, 0, 0},
    {"measure2c2", -1, 0, 0, 0, 0, 2, 2, 0, 0},
};
#define MEASURED_CASE "cross bigbird+causal"

static mha_exec_force force_of(const setting *s) {
    mha_exec_force f = {.kernel = s->kernel, .block_m = s->block_m, .block_n = s->block_n,
                        .num_warps = s->num_warps, .stages = s->stages, .measure = s->measure,
                        .split_chunk = s->split, .tma = s->tma,
                        /* explicit either way: mma.sync settings stay mma.sync on sm_90 */
                        .wgmma = s->wgmma ? 1 : -1};
    return f;
}

/* The library's defaults (a NULL force) for the automatic setting. */
static const mha_exec_force *force_or_null(const setting *s, const mha_exec_force *f) {
    return s->kernel < 0 && !s->measure && !s->split ? NULL : f;
}

/* runs whose plan split block rows (the combine kernel ran) */
static int n_split_runs;

/* ---- host data --------------------------------------------------------------------------- */

/* Inputs as the dtype's values (float, exactly representable) in the
 * reference's own layout, q [B][Sq][H][D], k and v [B][Sk][KVH][D], and the
 * reference output. */
typedef struct data {
    int B, H, KVH, Sq, Sk, D;
    stof_dtype dtype;
    float *q, *k, *v, *table; /* table [buckets][H] */
    float *gq, *gk, *gv;      /* the global rows' projections, when tc->n_global */
    int32_t *gm;              /* the global_mask [B][Sq] */
    double *ref;              /* [B][Sq][H][D] */
    unsigned char *empty;     /* [B][Sq]: no allowed key */
} data;

static void fill_random(float *x, size_t n, stof_dtype t, util_rng *rng) {
    for (size_t i = 0; i < n; i++)
        x[i] = from_bits(t, to_bits(t, (float)(2.0 * util_rng_double(rng) - 1.0)));
}

#define RELPOS_BUCKETS 32
#define RELPOS_MAX_DISTANCE 128

/* ---- the fp64 reference ---------------------------------------------------------------- */

/* A global token: flagged and within its sequence (one past it is padding). */
static int is_global(const tcase *tc, const data *d, int b, int i) {
    return d->gm && d->gm[(size_t)b * d->Sq + i] && (!tc->pad || i < tc->pad[b]);
}

static int allowed(const tcase *tc, const data *d, const mask *m, int b, int i, int j) {
    if (tc->pad && (i >= tc->pad[b] || j >= tc->pad[b]))
        return 0; /* a padded row sees nothing (zeros); padded keys do not count */
    if (is_global(tc, d, b, i) || is_global(tc, d, b, j))
        return 1; /* a global query sees every key; every query sees the global keys */
    if (m && !mask_get(m, b, i, j))
        return 0;
    return !tc->causal || j <= i + (tc->k_len - tc->q_len);
}

/* Scores, mask and causal, softmax, P V: plain loops, independent of the
 * kernels' formats and of the planner's fold. */
static void reference(const tcase *tc, const mask *m, float scale, data *d) {
    double *s = malloc((size_t)d->Sk * sizeof *s);
    int group = d->H / d->KVH; /* query heads per K/V head */
    for (int b = 0; b < d->B; b++)
        for (int i = 0; i < d->Sq; i++) {
            int any = 0;
            for (int j = 0; j < d->Sk && !any; j++)
                any = allowed(tc, d, m, b, i, j);
            d->empty[(size_t)b * d->Sq + i] = !any;
            for (int h = 0; h < d->H; h++) {
                double *out = d->ref + (((size_t)b * d->Sq + i) * d->H + h) * d->D;
                for (int x = 0; x < d->D; x++)
                    out[x] = 0.0;
                if (!any)
                    continue;
                const int glob = is_global(tc, d, b, i); /* its own projections */
                const float *qs = glob ? d->gq : d->q, *ks = glob ? d->gk : d->k;
                const float *vs = glob ? d->gv : d->v;
                const float *q = qs + (((size_t)b * d->Sq + i) * d->H + h) * d->D;
                int kh = h / group;
                double mx = -INFINITY;
                for (int j = 0; j < d->Sk; j++) {
                    if (!allowed(tc, d, m, b, i, j))
                        continue;
                    const float *k = ks + (((size_t)b * d->Sk + j) * d->KVH + kh) * d->D;
                    double dot = 0.0;
                    for (int x = 0; x < d->D; x++)
                        dot += (double)q[x] * k[x];
                    s[j] = scale * dot;
                    if (tc->relpos) {
                        int bucket = op_relpos_bucket(j - i, tc->bidirectional, RELPOS_BUCKETS,
                                                      RELPOS_MAX_DISTANCE);
                        s[j] += d->table[bucket * d->H + h];
                    }
                    mx = s[j] > mx ? s[j] : mx;
                }
                double sum = 0.0;
                for (int j = 0; j < d->Sk; j++) {
                    if (!allowed(tc, d, m, b, i, j))
                        continue;
                    double p = exp(s[j] - mx);
                    sum += p;
                    const float *v = vs + (((size_t)b * d->Sk + j) * d->KVH + kh) * d->D;
                    for (int x = 0; x < d->D; x++)
                        out[x] += p * v[x];
                }
                for (int x = 0; x < d->D; x++)
                    out[x] /= sum;
            }
        }
    free(s);
}

/* ---- masks ------------------------------------------------------------------------------- */

/* Random 20 % pairs, every fifth row (and all of row 1) empty: empty rows
 * inside otherwise partial blocks. */
static int empty_rows_mask(const tcase *tc, mask **out, stof_error *err) {
    size_t n = (size_t)tc->q_len * tc->k_len;
    uint8_t *dense = malloc(n);
    util_rng rng = {77};
    for (int i = 0; i < tc->q_len; i++)
        for (int j = 0; j < tc->k_len; j++)
            dense[(size_t)i * tc->k_len + j] =
                (i % 5 != 0 && i != 1) && util_rng_double(&rng) < 0.2;
    int rc = mask_from_dense(dense, 1, tc->q_len, tc->k_len, "random 20% with empty rows", out,
                             err);
    free(dense);
    return rc;
}

static int case_mask(const tcase *tc, mask **out, stof_error *err) {
    *out = NULL;
    if (tc->src == SRC_NONE)
        return STOF_OK;
    if (tc->src == SRC_EMPTY_ROWS)
        return empty_rows_mask(tc, out, err);
    return mask_build_text(tc->spec, tc->batch, tc->q_len, tc->k_len, out, err);
}

/* ---- device buffers ------------------------------------------------------------------- */

typedef struct dbufs {
    CUdeviceptr q, kv, o, table; /* q == kv region for self-attention (packed qkv) */
    CUdeviceptr pad;             /* the attention_mask [B, Sq] int32, padded cases */
    CUdeviceptr gkv, gm;         /* global tokens: packed global Q, K, V; the global_mask */
    size_t o_elems;
    /* the ragged layout (padded self-attention cases): the same tensors, sequences one after
     * another, then RAGGED_TAIL rows; seq_start [B + 1] */
    CUdeviceptr kv_r, gkv_r, o_r, start;
    int64_t rows_r;
} dbufs;

#define RAGGED_TAIL 37
#define RAGGED_TAIL_VALUE 512.0f /* large enough to show if a tail key were weighed */

static int upload_bits(gpu *g, CUdeviceptr *d, const uint16_t *h, size_t n) {
    return upload(g, d, h, n * 2);
}

/* Q (unless qd is 0), K and V packed [rows, qd + 2 KVH D] on the device: row r holds token
 * src[r] (b Sk + position; packed, Sq == Sk, so token r of q too), or where src is NULL
 * token r, and where src[r] < 0 RAGGED_TAIL_VALUE, alternating in sign. */
static int upload_rows(gpu *g, const data *d, const float *q, const float *k, const float *v,
                       size_t qd, const int64_t *src, size_t rows, CUdeviceptr *out) {
    size_t hd = (size_t)d->H * d->D, kvd = (size_t)d->KVH * d->D;
    size_t width = qd + 2 * kvd;
    uint16_t *kv = malloc(rows * width * 2);
    if (!kv)
        return -1;
    for (size_t r = 0; r < rows; r++) {
        uint16_t *row = kv + r * width;
        const int64_t t = src ? src[r] : (int64_t)r;
        if (t < 0) {
            for (size_t x = 0; x < width; x++)
                row[x] = to_bits(d->dtype, x % 2 ? -RAGGED_TAIL_VALUE : RAGGED_TAIL_VALUE);
            continue;
        }
        for (size_t x = 0; x < qd; x++)
            row[x] = to_bits(d->dtype, q[t * hd + x]);
        for (size_t x = 0; x < kvd; x++) {
            row[qd + x] = to_bits(d->dtype, k[t * kvd + x]);
            row[qd + kvd + x] = to_bits(d->dtype, v[t * kvd + x]);
        }
    }
    int rc = upload_bits(g, out, kv, rows * width);
    free(kv);
    return rc;
}

static int upload_packed(gpu *g, const data *d, const float *q, const float *k, const float *v,
                         size_t qd, CUdeviceptr *out) {
    return upload_rows(g, d, q, k, v, qd, NULL, (size_t)d->B * d->Sk, out);
}

/* A sequence's length in a padded case (lengths past q_len are whole sequences). */
static int case_length(const tcase *tc, int b) {
    return tc->pad[b] < tc->q_len ? tc->pad[b] : tc->q_len;
}

/* The ragged tensors of a padded self-attention case (see dbufs). */
static int upload_ragged(gpu *g, const tcase *tc, const data *d, dbufs *db) {
    int64_t tokens = 0;
    for (int b = 0; b < d->B; b++)
        tokens += case_length(tc, b);
    const int64_t rows = tokens + RAGGED_TAIL;
    int64_t *src = malloc(sizeof *src * (size_t)rows);
    int32_t *start = malloc(sizeof *start * ((size_t)d->B + 1));
    if (!src || !start) {
        free(src);
        free(start);
        return -1;
    }
    int64_t r = 0;
    for (int b = 0; b < d->B; b++) {
        start[b] = (int32_t)r;
        for (int i = 0; i < case_length(tc, b); i++)
            src[r++] = (int64_t)b * d->Sk + i;
    }
    start[d->B] = (int32_t)r;
    for (; r < rows; r++)
        src[r] = -1;
    const size_t hd = (size_t)d->H * d->D;
    int rc = upload_rows(g, d, d->q, d->k, d->v, hd, src, (size_t)rows, &db->kv_r);
    if (!rc && tc->n_global)
        rc = upload_rows(g, d, d->gq, d->gk, d->gv, hd, src, (size_t)rows, &db->gkv_r);
    if (!rc)
        rc = upload(g, &db->start, start, sizeof *start * ((size_t)d->B + 1));
    if (!rc)
        rc = check_cu(g, g->drv->MemAlloc(&db->o_r, (size_t)rows * hd * 2), "cuMemAlloc(o_r)");
    db->rows_r = rows;
    free(src);
    free(start);
    return rc;
}

/* Self-attention: qkv [B, S, (H + 2 KVH) D], per token Q's H heads, then K's
 * and V's KVH heads; cross: q [B, Sq, H, D], kv [B, Sk, 2, KVH, D]. */
static int upload_inputs(gpu *g, const tcase *tc, const data *d, dbufs *db) {
    size_t hd = (size_t)d->H * d->D;
    size_t qd = tc->cross ? 0 : hd; /* Q's columns, first in a packed row */
    int rc = upload_packed(g, d, d->q, d->k, d->v, qd, &db->kv);
    if (!rc && tc->n_global)
        rc = upload_packed(g, d, d->gq, d->gk, d->gv, qd, &db->gkv);
    if (!rc && tc->n_global)
        rc = upload(g, &db->gm, d->gm, (size_t)d->B * d->Sq * sizeof *d->gm);
    if (rc)
        return rc;
    if (tc->cross) {
        size_t nq = (size_t)d->B * d->Sq * hd;
        uint16_t *q = malloc(nq * 2);
        for (size_t i = 0; i < nq; i++)
            q[i] = to_bits(d->dtype, d->q[i]);
        rc = upload_bits(g, &db->q, q, nq);
        free(q);
        if (rc)
            return rc;
    }
    if (tc->relpos) {
        uint16_t t[RELPOS_BUCKETS * 16];
        for (int i = 0; i < RELPOS_BUCKETS * d->H; i++)
            t[i] = to_bits(d->dtype, d->table[i]);
        if (upload_bits(g, &db->table, t, (size_t)RELPOS_BUCKETS * d->H))
            return -1;
    }
    if (tc->pad) {
        int32_t *am = malloc((size_t)d->B * d->Sq * sizeof *am);
        for (int b = 0; b < d->B; b++)
            for (int i = 0; i < d->Sq; i++)
                am[(size_t)b * d->Sq + i] = i < tc->pad[b];
        rc = upload(g, &db->pad, am, (size_t)d->B * d->Sq * sizeof *am);
        free(am);
        if (rc)
            return rc;
    }
    if (tc->pad && !tc->cross && (rc = upload_ragged(g, tc, d, db)))
        return rc;
    db->o_elems = (size_t)d->B * d->Sq * hd;
    return check_cu(g, g->drv->MemAlloc(&db->o, db->o_elems * 2), "cuMemAlloc(o)");
}

static void free_bufs(gpu *g, dbufs *db) {
    CUdeviceptr p[] = {db->q,   db->kv,   db->o,   db->table, db->pad,
                       db->gkv, db->gm,   db->kv_r, db->gkv_r, db->o_r, db->start};
    for (int i = 0; i < 11; i++)
        if (p[i])
            g->drv->MemFree(p[i]);
    memset(db, 0, sizeof *db);
}

static void case_tensors(const tcase *tc, const mha_exec_problem *p, const dbufs *db,
                         mha_exec_tensors *t) {
    if (tc->cross)
        mha_exec_tensors_cross(t, db->q, db->kv, db->o, p, 2);
    else
        mha_exec_tensors_packed(t, db->kv, db->o, p, 2);
    if (tc->shared_kv)
        t->k_batch_stride = t->v_batch_stride = 0;
    t->relpos_table = db->table;
    t->pad_mask = db->pad;
    if (tc->n_global)
        mha_exec_tensors_global(t, db->gm, db->gkv, p, 2);
}

/* The same in the ragged layout. */
static void case_tensors_ragged(const tcase *tc, const mha_exec_problem *p, const dbufs *db,
                                mha_exec_tensors *t) {
    mha_exec_tensors_packed(t, db->kv_r, db->o_r, p, 2);
    t->relpos_table = db->table;
    t->pad_mask = db->pad;
    if (tc->n_global)
        mha_exec_tensors_global(t, db->gm, db->gkv_r, p, 2);
    mha_exec_tensors_ragged(t, db->start, db->rows_r);
}

/* ---- comparing ----------------------------------------------------------------------------- */

typedef struct verdict {
    double rel, max_abs;
    long nonfinite, nonzero_empty;
    long written_outside; /* ragged layout: elements of rows outside the sequences written */
} verdict;

static verdict compare(const data *d, const uint16_t *out) {
    verdict r = {0};
    double num = 0, den = 0;
    size_t hd = (size_t)d->H * d->D;
    for (int b = 0; b < d->B; b++)
        for (int i = 0; i < d->Sq; i++) {
            int empty = d->empty[(size_t)b * d->Sq + i];
            for (size_t x = 0; x < hd; x++) {
                size_t at = ((size_t)b * d->Sq + i) * hd + x;
                float y = from_bits(d->dtype, out[at]);
                double ref = d->ref[at];
                if (!isfinite(y)) {
                    r.nonfinite++;
                    continue;
                }
                if (empty && y != 0.0f)
                    r.nonzero_empty++;
                double e = fabs(y - ref);
                r.max_abs = e > r.max_abs ? e : r.max_abs;
                num += e * e;
                den += ref * ref;
            }
        }
    r.rel = den > 0 ? sqrt(num / den) : sqrt(num);
    return r;
}

/* Where the first bad values are, for the log of a failing run. */
static void print_first_errors(const data *d, const uint16_t *out, double tol) {
    size_t hd = (size_t)d->H * d->D;
    int shown = 0;
    for (int b = 0; b < d->B && shown < 4; b++)
        for (int i = 0; i < d->Sq && shown < 4; i++)
            for (int h = 0; h < d->H && shown < 4; h++) {
                double num = 0, den = 0;
                int nan = 0;
                for (int x = 0; x < d->D; x++) {
                    size_t at = ((size_t)b * d->Sq + i) * hd + (size_t)h * d->D + x;
                    float y = from_bits(d->dtype, out[at]);
                    nan |= !isfinite(y);
                    num += (y - d->ref[at]) * (y - d->ref[at]);
                    den += d->ref[at] * d->ref[at];
                }
                double rel = den > 0 ? sqrt(num / den) : sqrt(num);
                if (nan || rel > 4 * tol) {
                    size_t at = ((size_t)b * d->Sq + i) * hd + (size_t)h * d->D;
                    printf("    first bad rows: b=%d i=%d h=%d%s rel %.3g  out[0..1] = %g %g  "
                           "ref[0..1] = %g %g\n",
                           b, i, h, d->empty[(size_t)b * d->Sq + i] ? " (empty row)" : "", rel,
                           from_bits(d->dtype, out[at]), from_bits(d->dtype, out[at + 1]),
                           d->ref[at], d->ref[at + 1]);
                    shown++;
                }
            }
}

/* ---- running one case --------------------------------------------------------------------- */

static void setting_label(const setting *s, const mha_exec_plan *plan, char *buf, size_t n) {
    const mha_exec_config *c = &plan->config;
    char g[16] = "";
    if (c->tma)
        snprintf(g, sizeof g, ",tma");
    if (c->kernel == MHA_KERNEL_ROW_WISE)
        snprintf(buf, n, "%s:row(%dx%d)", s->name, c->rows_per_warp, c->warps_per_block);
    else if (c->split)
        snprintf(buf, n, "%s:%s(%d,%d,%d,s%d%s,c%d/%d)", s->name, c->wgmma ? "wg" : "blk",
                 c->block_m, c->block_n, c->num_warps, c->stages, g, plan->split_chunk,
                 plan->split_rows);
    else
        snprintf(buf, n, "%s:%s(%d,%d,%d,s%d%s)", s->name, c->wgmma ? "wg" : "blk", c->block_m,
                 c->block_n, c->num_warps, c->stages, g);
}

static mha_exec_problem case_problem(const tcase *tc, const mask *m, stof_dtype t, int D) {
    mha_exec_problem p = {.mask = m, .causal = tc->causal, .batch = tc->batch,
                          .heads = tc->heads, .head_dim = D, .q_len = tc->q_len,
                          .k_len = tc->k_len, .dtype = t,
                          .scale = tc->scale != 0 ? tc->scale : 1.0f / sqrtf((float)D),
                          .relpos = tc->relpos, .relpos_buckets = RELPOS_BUCKETS,
                          .relpos_max_distance = RELPOS_MAX_DISTANCE,
                          .relpos_bidirectional = tc->bidirectional,
                          .padded = tc->pad != NULL, .kv_heads = tc->kv_heads,
                          .global_keys = tc->n_global > 0};
    return p;
}

/* The ragged run's output rows back in the padded layout (zeros at padding, as the
 * reference has them); the elements of rows outside the sequences that are not the poison. */
static long unpack_ragged(const tcase *tc, const data *d, const uint16_t *ragged, uint16_t poison,
                          uint16_t *out) {
    const size_t hd = (size_t)d->H * d->D;
    size_t r = 0;
    memset(out, 0, (size_t)d->B * d->Sq * hd * 2);
    for (int b = 0; b < d->B; b++)
        for (int i = 0; i < case_length(tc, b); i++, r++)
            memcpy(out + ((size_t)b * d->Sq + i) * hd, ragged + r * hd, hd * 2);
    long written = 0;
    for (size_t x = r * hd; x < (r + RAGGED_TAIL) * hd; x++)
        written += ragged[x] != poison;
    return written;
}

/* One run of plan in the padded layout or the ragged one (the output poisoned first),
 * checked against the reference. Nonzero when the context may be unusable. */
static int run_layout(gpu *g, const tcase *tc, const mha_exec_plan *plan, const char *label,
                      const mha_exec_problem *p, const data *d, const dbufs *db, int ragged,
                      uint16_t *out) {
    const char *dt = stof_dtype_name(p->dtype);
    const char *layout = ragged ? " ragged" : "";
    mha_exec_tensors t;
    if (ragged)
        case_tensors_ragged(tc, p, db, &t);
    else
        case_tensors(tc, p, db, &t);
    const CUdeviceptr o = ragged ? db->o_r : db->o;
    const size_t o_elems = ragged ? (size_t)db->rows_r * p->heads * p->head_dim : db->o_elems;
    uint16_t *host = ragged ? malloc(o_elems * 2) : out;
    stof_error err = {0};
    uint16_t nan = p->dtype == STOF_BF16 ? 0x7fc0 : 0x7e00;
    int rc, bad = !host || check_cu(g, g->drv->MemsetD16Async(o, nan, o_elems, 0), "poison o");
    if (!bad && (rc = mha_exec_run(g->ctx, plan, &t, 0, &err))) {
        CHECK_MSG(0, "launch %s%s: %s", label, layout, err.msg);
        printf("%-24s FAIL (launch%s: %s)\n", label, layout, err.msg);
        recap_add("%s %s D=%d %s%s: launch failed: %.120s", label, dt, p->head_dim, tc->name,
                  layout, err.msg);
        bad = 1;
    }
    if (!bad)
        bad = check_cu(g, g->drv->CtxSynchronize(NULL), "kernel execution (cuCtxSynchronize)");
    if (!bad)
        bad = check_cu(g, g->drv->MemcpyDtoH(host, o, o_elems * 2), "cuMemcpyDtoH(o)");
    if (bad) {
        char desc[600];
        mha_exec_plan_describe(plan, desc, sizeof desc);
        printf("%-24s %-5s D=%-3d %-28s FAIL (CUDA error%s) plan: %s\n", label, dt, p->head_dim,
               tc->name, layout, desc);
        recap_add("%s %s D=%d %s%s: CUDA error (context lost)", label, dt, p->head_dim, tc->name,
                  layout);
        if (ragged)
            free(host);
        return -1;
    }
    long outside = 0;
    if (ragged) {
        outside = unpack_ragged(tc, d, host, nan, out);
        free(host);
    }
    double tol = p->dtype == STOF_BF16 ? TOL_BF16 : TOL_F16;
    verdict v = compare(d, out);
    v.written_outside = outside;
    int pass = v.rel < tol && v.nonfinite == 0 && v.nonzero_empty == 0 && !v.written_outside;
    printf("%-24s %-5s D=%-3d %-28s B=%d H=%d Sq=%-4d Sk=%-4d%s rel=%.2e max=%.2e", label, dt,
           p->head_dim, tc->name, p->batch, p->heads, p->q_len, p->k_len, layout, v.rel,
           v.max_abs);
    if (v.nonfinite)
        printf(" nonfinite=%ld", v.nonfinite);
    if (v.nonzero_empty)
        printf(" nonzero-in-empty-rows=%ld", v.nonzero_empty);
    if (v.written_outside)
        printf(" written-outside-the-sequences=%ld", v.written_outside);
    if (plan->n_measured)
        printf(" (fastest of %d: %.3f ms)", plan->n_measured, plan->measured_ms);
    printf(" %s\n", pass ? "PASS" : "FAIL");
    CHECK_MSG(pass, "%s %s D=%d %s%s: rel %.3g (tol %.g), %ld non-finite, %ld non-zero in empty "
              "rows, %ld written outside the sequences",
              label, dt, p->head_dim, tc->name, layout, v.rel, tol, v.nonfinite, v.nonzero_empty,
              v.written_outside);
    if (!pass) {
        recap_add("%s %s D=%d %s B=%d H=%d Sq=%d Sk=%d%s: rel %.2e max %.2e nonfinite %ld "
                  "nonzero-empty %ld outside %ld",
                  label, dt, p->head_dim, tc->name, p->batch, p->heads, p->q_len, p->k_len,
                  layout, v.rel, v.max_abs, v.nonfinite, v.nonzero_empty, v.written_outside);
        char desc[600];
        mha_exec_plan_describe(plan, desc, sizeof desc);
        printf("    plan: %s\n", desc);
        print_first_errors(d, out, tol);
    }
    return 0;
}

static void run_setting(gpu *g, const tcase *tc, const setting *s, const mha_exec_problem *p,
                        const data *d, const dbufs *db, uint16_t *out) {
    const char *dt = stof_dtype_name(p->dtype);
    mha_exec_force force = force_of(s);
    mha_exec_plan *plan = NULL;
    stof_error err = {0};
    int rc = mha_exec_plan_create(g->ctx, p, force_or_null(s, &force), &plan, &err);
    if (rc == STOF_ERR_UNSUPPORTED && s->block_m) {
        printf("%-24s %-5s D=%-3d %-28s B=%d H=%d Sq=%-4d Sk=%-4d SKIP (%s)\n", s->name, dt,
               p->head_dim, tc->name, p->batch, p->heads, p->q_len, p->k_len, err.msg);
        return;
    }
    CHECK_MSG(rc == STOF_OK, "plan %s %s D=%d %s: %s", s->name, dt, p->head_dim, tc->name,
              err.msg);
    if (rc) {
        printf("%-24s %-5s D=%-3d %-28s FAIL (plan: %s)\n", s->name, dt, p->head_dim, tc->name,
               err.msg);
        recap_add("%s %s D=%d %s: plan failed: %.120s", s->name, dt, p->head_dim, tc->name,
                  err.msg);
        if (rc == STOF_ERR_CUDA)
            g->dead = 1;
        return;
    }
    char label[64];
    setting_label(s, plan, label, sizeof label);
    n_split_runs += plan->config.split;
    if (!run_layout(g, tc, plan, label, p, d, db, 0, out) && db->start)
        run_layout(g, tc, plan, label, p, d, db, 1, out);
    mha_exec_plan_free(g->ctx, plan);
}

static void data_free(data *d) {
    free(d->q);
    free(d->k);
    free(d->v);
    free(d->table);
    free(d->gq);
    free(d->gk);
    free(d->gv);
    free(d->gm);
    free(d->ref);
    free(d->empty);
}

static void run_case(gpu *g, const tcase *tc, stof_dtype dtype, int D, uint64_t seed,
                     const setting *list, int n_list) {
    mask *m = NULL;
    stof_error err = {0};
    int rc = case_mask(tc, &m, &err);
    CHECK_MSG(rc == STOF_OK, "mask %s: %s", tc->name, err.msg);
    if (rc)
        return;
    data d = {.B = tc->batch, .H = tc->heads, .KVH = case_kv_heads(tc), .Sq = tc->q_len,
              .Sk = tc->k_len, .D = D, .dtype = dtype};
    size_t nq = (size_t)d.B * d.Sq * d.H * D, nk = (size_t)d.B * d.Sk * d.KVH * D;
    d.q = malloc(nq * sizeof *d.q);
    d.k = malloc(nk * sizeof *d.k);
    d.v = malloc(nk * sizeof *d.v);
    d.table = malloc((size_t)RELPOS_BUCKETS * d.H * sizeof *d.table);
    d.ref = malloc(nq * sizeof *d.ref);
    d.empty = malloc((size_t)d.B * d.Sq);
    util_rng rng = {seed};
    fill_random(d.q, nq, dtype, &rng);
    fill_random(d.k, nk, dtype, &rng);
    fill_random(d.v, nk, dtype, &rng);
    if (tc->shared_kv) /* every batch reads batch 0's K and V: the reference sees copies */
        for (int b = 1; b < d.B; b++) {
            memcpy(d.k + (size_t)b * (nk / d.B), d.k, nk / d.B * sizeof *d.k);
            memcpy(d.v + (size_t)b * (nk / d.B), d.v, nk / d.B * sizeof *d.v);
        }
    fill_random(d.table, (size_t)RELPOS_BUCKETS * d.H, dtype, &rng);
    if (tc->n_global) {
        d.gq = malloc(nq * sizeof *d.gq);
        d.gk = malloc(nk * sizeof *d.gk);
        d.gv = malloc(nk * sizeof *d.gv);
        d.gm = calloc((size_t)d.B * d.Sq, sizeof *d.gm);
        fill_random(d.gq, nq, dtype, &rng);
        fill_random(d.gk, nk, dtype, &rng);
        fill_random(d.gv, nk, dtype, &rng);
        int n = 0;
        for (size_t i = 0; i < sizeof global_positions / sizeof global_positions[0]; i++)
            if (global_positions[i] < d.Sq && n < tc->n_global) {
                n++;
                for (int b = 0; b < d.B; b++)
                    d.gm[(size_t)b * d.Sq + global_positions[i]] = 1;
            }
    }
    mha_exec_problem p = case_problem(tc, m, dtype, D);
    reference(tc, m, p.scale, &d);

    dbufs db = {0};
    uint16_t *out = malloc(nq * 2);
    if (upload_inputs(g, tc, &d, &db) == 0)
        for (int s = 0; s < n_list && !g->dead; s++)
            run_setting(g, tc, &list[s], &p, &d, &db, out);
    free(out);
    free_bufs(g, &db);
    data_free(&d);
    mask_free(m);
}

/* ---- timing ------------------------------------------------------------------------------ */

/* Informational: the block-wise kernel at one big shape (BigBird (16,
 * 4096)) at several settings and depths, and split rows off vs automatic at
 * the shapes with long global rows. 12 heads x 64, fp16. */
#define TIME_H 12
#define TIME_D 64
#define TIME_MAX_S 4096
#define TIME_WARMUP 5
#define TIME_RUNS 20
#define SPOT_ROWS 48

typedef struct tshape {
    const char *spec;
    int B, S;
} tshape;

/* The reference of one (b, h, i) row of the packed fp16 input, in fp64. */
static double spot_row_error(const mask *m, const tshape *sh, const uint16_t *qkv,
                             const uint16_t *o, int b, int h, int i, float scale) {
    size_t hd = (size_t)TIME_H * TIME_D;
    const int S = sh->S;
    const uint16_t *q = qkv + ((size_t)b * S + i) * 3 * hd + (size_t)h * TIME_D;
    double s[TIME_MAX_S], mx = -INFINITY, acc[TIME_D] = {0}, sum = 0;
    for (int j = 0; j < S; j++) {
        if (!mask_get(m, b, i, j))
            continue;
        const uint16_t *k = qkv + ((size_t)b * S + j) * 3 * hd + hd + (size_t)h * TIME_D;
        double dot = 0;
        for (int x = 0; x < TIME_D; x++)
            dot += (double)util_f16_to_f32(q[x]) * util_f16_to_f32(k[x]);
        s[j] = scale * dot;
        mx = s[j] > mx ? s[j] : mx;
    }
    for (int j = 0; j < S; j++) {
        if (!mask_get(m, b, i, j))
            continue;
        const uint16_t *v = qkv + ((size_t)b * S + j) * 3 * hd + 2 * hd + (size_t)h * TIME_D;
        double p = exp(s[j] - mx);
        sum += p;
        for (int x = 0; x < TIME_D; x++)
            acc[x] += p * util_f16_to_f32(v[x]);
    }
    double num = 0, den = 0;
    const uint16_t *y = o + ((size_t)b * S + i) * hd + (size_t)h * TIME_D;
    for (int x = 0; x < TIME_D; x++) {
        double ref = sum > 0 ? acc[x] / sum : 0.0;
        double e = util_f16_to_f32(y[x]) - ref;
        num += e * e;
        den += ref * ref;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void time_setting(gpu *g, const setting *s, const mha_exec_problem *p, const mask *m,
                         const tshape *sh, const uint16_t *h_qkv, CUdeviceptr qkv, CUdeviceptr o,
                         uint16_t *h_o) {
    mha_exec_force force = force_of(s);
    mha_exec_plan *plan = NULL;
    stof_error err = {0};
    double t_plan = util_now();
    int rc = mha_exec_plan_create(g->ctx, p, force_or_null(s, &force), &plan, &err);
    t_plan = util_now() - t_plan;
    if (rc) {
        printf("timing %-10s: no plan (%s)\n", s->name, err.msg);
        CHECK_MSG(rc == STOF_ERR_UNSUPPORTED, "timing plan %s: %s", s->name, err.msg);
        return;
    }
    char label[64], desc[600];
    setting_label(s, plan, label, sizeof label);
    mha_exec_plan_describe(plan, desc, sizeof desc);
    mha_exec_tensors t;
    mha_exec_tensors_packed(&t, qkv, o, p, 2);
    CUevent ev[2 * TIME_RUNS];
    int nev = 0;
    for (int i = 0; i < 2 * TIME_RUNS; i++, nev++)
        if (check_cu(g, g->drv->EventCreate(&ev[i], CU_EVENT_DEFAULT), "cuEventCreate"))
            break;
    float ms[TIME_RUNS];
    int ok = nev == 2 * TIME_RUNS;
    for (int i = 0; ok && i < TIME_WARMUP; i++)
        ok = mha_exec_run(g->ctx, plan, &t, 0, &err) == STOF_OK;
    for (int i = 0; ok && i < TIME_RUNS; i++) {
        ok = !check_cu(g, g->drv->EventRecord(ev[2 * i], 0), "cuEventRecord") &&
             mha_exec_run(g->ctx, plan, &t, 0, &err) == STOF_OK &&
             !check_cu(g, g->drv->EventRecord(ev[2 * i + 1], 0), "cuEventRecord");
    }
    ok = ok && !check_cu(g, g->drv->CtxSynchronize(NULL), "timing runs (cuCtxSynchronize)");
    for (int i = 0; ok && i < TIME_RUNS; i++)
        ok = !check_cu(g, g->drv->EventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]),
                       "cuEventElapsedTime");
    for (int i = 0; i < nev; i++)
        g->drv->EventDestroy(ev[i]);
    if (!ok) {
        printf("timing %-24s FAILED: %s\n", label, err.msg);
        recap_add("timing %s: %.150s", label, err.msg);
        CHECK_MSG(0, "timing %s: %s", label, err.msg);
        mha_exec_plan_free(g->ctx, plan);
        return;
    }
    qsort(ms, TIME_RUNS, sizeof ms[0], cmp_float);
    float med = ms[TIME_RUNS / 2];
    double flops = 4.0 * p->heads * p->head_dim * (double)plan->allowed_pairs;
    /* spot check: sampled rows against fp64, the first rows (global ones) among them */
    size_t n_o = (size_t)sh->B * sh->S * TIME_H * TIME_D;
    double worst = 0;
    if (!check_cu(g, g->drv->MemcpyDtoH(h_o, o, n_o * 2), "cuMemcpyDtoH(o)")) {
        util_rng rng = {99};
        for (int r = 0; r < SPOT_ROWS; r++) {
            int b = (int)(util_rng_next(&rng) % (uint64_t)sh->B);
            int h = (int)(util_rng_next(&rng) % TIME_H);
            int i = r < 4 ? r : (int)(util_rng_next(&rng) % (uint64_t)sh->S);
            double e = spot_row_error(m, sh, h_qkv, h_o, b, h, i, p->scale);
            worst = e > worst ? e : worst;
        }
    }
    printf("timing %-24s median %.3f ms (min %.3f), %.1f TFLOP/s useful, spot-check worst row "
           "rel %.2e\n        plan: %s\n",
           label, med, ms[0], flops / (med * 1e-3) / 1e12, worst, desc);
    if (plan->n_measured)
        printf("        measured plan: %d candidates timed in %.2f s of planning, chosen "
               "%.3f ms at batch %d\n",
               plan->n_measured, t_plan, plan->measured_ms, plan->measured_batch);
    CHECK_MSG(worst < 4 * TOL_F16, "timing shape %s: sampled rows wrong (rel %.3g)", label, worst);
    if (!(worst < 4 * TOL_F16))
        recap_add("timing shape %s: sampled rows wrong (rel %.3g)", label, worst);
    mha_exec_plan_free(g->ctx, plan);
}

/* A measured plan is remembered for its problem on this device: the next
 * plan with nothing forced takes it; measure -1 and STOF_ATTENTION_WISDOM=0
 * keep to the analytical choice. */
static void test_wisdom(gpu *g) {
    if (!g->ctx->nvrtc.dir[0]) {
        printf("wisdom: SKIPPED (no kernel cache folder to remember in)\n");
        return;
    }
    stof_error err = {0};
    mask_spec *spec = NULL;
    mask *m = NULL;
    if (mask_spec_parse("bigbird{seed=7}", &spec, &err) || mask_build(spec, 1, 768, 768, &m, &err)) {
        CHECK_MSG(0, "wisdom mask: %s", err.msg);
        mask_spec_free(spec);
        return;
    }
    mha_exec_problem p = {.mask = m, .batch = 2, .heads = 4, .head_dim = 64, .q_len = 768,
                          .k_len = 768, .dtype = STOF_F16, .scale = 0.125f};
    mha_exec_force measured = {.kernel = -1, .measure = 3};
    mha_exec_force analytic = {.kernel = -1, .measure = -1};
    mha_exec_plan *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    int rc = mha_exec_plan_create(g->ctx, &p, &measured, &a, &err);
    CHECK_MSG(rc == STOF_OK, "wisdom: measured plan: %s", err.msg);
    if (!rc)
        rc = mha_exec_plan_create(g->ctx, &p, NULL, &b, &err);
    CHECK_MSG(rc == STOF_OK, "wisdom: remembered plan: %s", err.msg);
    if (!rc) {
        const mha_exec_config *x = &a->config, *y = &b->config;
        int same = x->kernel == y->kernel && x->block_m == y->block_m &&
                   x->block_n == y->block_n && x->num_warps == y->num_warps &&
                   x->rows_per_warp == y->rows_per_warp && x->wgmma == y->wgmma &&
                   x->tma == y->tma;
        printf("wisdom: measured %s\n        then, nothing forced: %s\n", a->reason, b->reason);
        CHECK_MSG(same && strncmp(b->reason, "remembered", 10) == 0,
                  "wisdom: the measured choice was not taken again");
        rc = mha_exec_plan_create(g->ctx, &p, &analytic, &c, &err);
        CHECK_MSG(rc == STOF_OK && strncmp(c->reason, "remembered", 10) != 0,
                  "wisdom: measure -1 did not keep to the analytical choice");
        setenv("STOF_ATTENTION_WISDOM", "0", 1);
        rc = mha_exec_plan_create(g->ctx, &p, NULL, &d, &err);
        unsetenv("STOF_ATTENTION_WISDOM");
        CHECK_MSG(rc == STOF_OK && strncmp(d->reason, "remembered", 10) != 0,
                  "wisdom: STOF_ATTENTION_WISDOM=0 still took the remembered choice");
    }
    mha_exec_plan_free(g->ctx, a);
    mha_exec_plan_free(g->ctx, b);
    mha_exec_plan_free(g->ctx, c);
    mha_exec_plan_free(g->ctx, d);
    mask_free(m);
    mask_spec_free(spec);
}

/* Every setting of list at one shape, on random fp16 inputs. */
static void time_shape(gpu *g, const tshape *sh, const setting *list, int n_list) {
    stof_error err = {0};
    mask_spec *spec = NULL;
    mask *m = NULL;
    if (mask_spec_parse(sh->spec, &spec, &err) || mask_build(spec, sh->B, sh->S, sh->S, &m, &err)) {
        CHECK_MSG(0, "timing mask %s: %s", sh->spec, err.msg);
        mask_spec_free(spec);
        return;
    }
    mask_spec_free(spec);
    size_t n_qkv = (size_t)sh->B * sh->S * 3 * TIME_H * TIME_D;
    size_t n_o = (size_t)sh->B * sh->S * TIME_H * TIME_D;
    uint16_t *h_qkv = malloc(n_qkv * 2), *h_o = malloc(n_o * 2);
    util_rng rng = {2024};
    for (size_t i = 0; i < n_qkv; i++)
        h_qkv[i] = util_f32_to_f16((float)(2.0 * util_rng_double(&rng) - 1.0));
    CUdeviceptr qkv = 0, o = 0;
    if (!upload_bits(g, &qkv, h_qkv, n_qkv) &&
        !check_cu(g, g->drv->MemAlloc(&o, n_o * 2), "cuMemAlloc(o)")) {
        mha_exec_problem p = {.mask = m, .batch = sh->B, .heads = TIME_H, .head_dim = TIME_D,
                              .q_len = sh->S, .k_len = sh->S, .dtype = STOF_F16,
                              .scale = 0.125f};
        printf("\ntiming: B=%d H=%d S=%d D=%d %s fp16, median of %d after %d warm-up "
               "(informational)\n",
               sh->B, TIME_H, sh->S, TIME_D, sh->spec, TIME_RUNS, TIME_WARMUP);
        for (int i = 0; i < n_list && !g->dead; i++)
            time_setting(g, &list[i], &p, m, sh, h_qkv, qkv, o, h_o);
    }
    if (qkv)
        g->drv->MemFree(qkv);
    if (o)
        g->drv->MemFree(o);
    free(h_qkv);
    free(h_o);
    mask_free(m);
}

static void timing(gpu *g) {
    static const setting timed[] = {
        {"auto", -1, 0, 0, 0, 0, 0, 0, 0, 0},
        {"eq2", MHA_KERNEL_BLOCK_WISE, 0, 0, 0, 0, 0, 0, 0, 0},
        {"16x16w1s2", MHA_KERNEL_BLOCK_WISE, 16, 16, 1, 2, 0, 0, 0, 0},
        {"16x16w1s3", MHA_KERNEL_BLOCK_WISE, 16, 16, 1, 3, 0, 0, 0, 0},
        {"16x16w1s4", MHA_KERNEL_BLOCK_WISE, 16, 16, 1, 4, 0, 0, 0, 0},
        {"64x32w4s2", MHA_KERNEL_BLOCK_WISE, 64, 32, 4, 2, 0, 0, 0, 0},
        {"64x32w4s3", MHA_KERNEL_BLOCK_WISE, 64, 32, 4, 3, 0, 0, 0, 0},
        {"64x32w4s4", MHA_KERNEL_BLOCK_WISE, 64, 32, 4, 4, 0, 0, 0, 0},
        {"64x64w4s2", MHA_KERNEL_BLOCK_WISE, 64, 64, 4, 2, 0, 0, 0, 0},
        {"64x64w4s3", MHA_KERNEL_BLOCK_WISE, 64, 64, 4, 3, 0, 0, 0, 0},
        {"128x64w4", MHA_KERNEL_BLOCK_WISE, 128, 64, 4, 0, 0, 0, 0, 0},
        {"128x128w8", MHA_KERNEL_BLOCK_WISE, 128, 128, 8, 0, 0, 0, 0, 0},
        {"64x128w4", MHA_KERNEL_BLOCK_WISE, 64, 128, 4, 0, 0, 0, 0, 0},
        {"row", MHA_KERNEL_ROW_WISE, 0, 0, 0, 0, 0, 0, 0, 0},
        {"measure6", -1, 0, 0, 0, 0, 6, 0, 0, 0},
        {"wg64x32", MHA_KERNEL_BLOCK_WISE, 64, 32, 4, 0, 0, 0, 1, 0},
        {"wg64x64", MHA_KERNEL_BLOCK_WISE, 64, 64, 4, 0, 0, 0, 1, 0},
        {"wg64x128", MHA_KERNEL_BLOCK_WISE, 64, 128, 4, 0, 0, 0, 1, 0},
        {"wg128x32w8", MHA_KERNEL_BLOCK_WISE, 128, 32, 8, 0, 0, 0, 1, 0},
        {"wg128x64w8", MHA_KERNEL_BLOCK_WISE, 128, 64, 8, 0, 0, 0, 1, 0},
        {"wg128x128w8", MHA_KERNEL_BLOCK_WISE, 128, 128, 8, 0, 0, 0, 1, 0},
        {"32x32w2", MHA_KERNEL_BLOCK_WISE, 32, 32, 2, 0, 0, 0, 0, 0},
        {"32x32w2cp", MHA_KERNEL_BLOCK_WISE, 32, 32, 2, 0, 0, 0, 0, -1},
        {"32x32w2s3", MHA_KERNEL_BLOCK_WISE, 32, 32, 2, 3, 0, 0, 0, 0},
        {"32x32w2s3cp", MHA_KERNEL_BLOCK_WISE, 32, 32, 2, 3, 0, 0, 0, -1},
        {"32x32w2s4", MHA_KERNEL_BLOCK_WISE, 32, 32, 2, 4, 0, 0, 0, 0},
        {"32x32w1", MHA_KERNEL_BLOCK_WISE, 32, 32, 1, 0, 0, 0, 0, 0},
        {"32x32w1s3", MHA_KERNEL_BLOCK_WISE, 32, 32, 1, 3, 0, 0, 0, 0},
        {"64x32w4cp", MHA_KERNEL_BLOCK_WISE, 64, 32, 4, 0, 0, 0, 0, -1},
        {"128x32w8", MHA_KERNEL_BLOCK_WISE, 128, 32, 8, 0, 0, 0, 0, 0},
        {"64x32w2", MHA_KERNEL_BLOCK_WISE, 64, 32, 2, 0, 0, 0, 0, 0},
    };
    const tshape big = {"bigbird{}", 16, 4096};
    time_shape(g, &big, timed, (int)(sizeof timed / sizeof timed[0]));

    /* the same kernel on an all-allowed mask: its dense throughput, the
     * ceiling a sparse mask can approach */
    static const setting dense_timed[] = {
        {"32x32w2", MHA_KERNEL_BLOCK_WISE, 32, 32, 2, 0, 0, 0, 0, 0},
        {"32x32w2cp", MHA_KERNEL_BLOCK_WISE, 32, 32, 2, 0, 0, 0, 0, -1},
        {"128x64w4cp", MHA_KERNEL_BLOCK_WISE, 128, 64, 4, 0, 0, 0, 0, -1},
        {"64x64w4", MHA_KERNEL_BLOCK_WISE, 64, 64, 4, 0, 0, 0, 0, 0},
        {"128x64w4", MHA_KERNEL_BLOCK_WISE, 128, 64, 4, 0, 0, 0, 0, 0},
        {"64x128w4", MHA_KERNEL_BLOCK_WISE, 64, 128, 4, 0, 0, 0, 0, 0},
        {"128x128w8", MHA_KERNEL_BLOCK_WISE, 128, 128, 8, 0, 0, 0, 0, 0},
        {"wg64x64", MHA_KERNEL_BLOCK_WISE, 64, 64, 4, 0, 0, 0, 1, 0},
        {"wg64x128", MHA_KERNEL_BLOCK_WISE, 64, 128, 4, 0, 0, 0, 1, 0},
        {"wg128x64w8", MHA_KERNEL_BLOCK_WISE, 128, 64, 8, 0, 0, 0, 1, 0},
        {"wg128x128w8", MHA_KERNEL_BLOCK_WISE, 128, 128, 8, 0, 0, 0, 1, 0},
        {"wg128x128w8s3", MHA_KERNEL_BLOCK_WISE, 128, 128, 8, 3, 0, 0, 1, 0},
        {"32x64w2", MHA_KERNEL_BLOCK_WISE, 32, 64, 2, 0, 0, 0, 0, 0},
    };
    const tshape dense = {"full{}", 16, 4096};
    time_shape(g, &dense, dense_timed, (int)(sizeof dense_timed / sizeof dense_timed[0]));

    /* split rows: off vs automatic, same kernel settings */
    static const setting split_timed[] = {
        {"auto-nosplit", -1, 0, 0, 0, 0, 0, -1, 0, 0},
        {"auto", -1, 0, 0, 0, 0, 0, 0, 0, 0},
        {"64x64w4-nosplit", MHA_KERNEL_BLOCK_WISE, 64, 64, 4, 0, 0, -1, 0, 0},
        {"64x64w4", MHA_KERNEL_BLOCK_WISE, 64, 64, 4, 0, 0, 0, 0, 0},
        {"64x32w4-nosplit", MHA_KERNEL_BLOCK_WISE, 64, 32, 4, 0, 0, -1, 0, 0},
        {"64x32w4", MHA_KERNEL_BLOCK_WISE, 64, 32, 4, 0, 0, 0, 0, 0},
    };
    static const tshape split_shapes[] = {
        {"longformer{}", 1, 4096},
        {"bigbird{}", 1, 4096},
        {"longformer{}", 8, 1024},
        {"bigbird{}", 8, 1024},
    };
    for (size_t i = 0; i < sizeof split_shapes / sizeof split_shapes[0] && !g->dead; i++)
        time_shape(g, &split_shapes[i], split_timed,
                   (int)(sizeof split_timed / sizeof split_timed[0]));
}

/* ---- main ------------------------------------------------------------------------------- */

/* ---- every setting of the template's parameter space --------------------------------- */

/* The search may force any (BLOCK_M, BLOCK_N, WARPS) of the attention_block
 * template, with stages and splitting left automatic as a tuned plan runs
 * them: every one of them on a T5 decoder's causal self-attention with the
 * unidirectional relative-position bias, at two sizes (the larger one a
 * t5-base decoder at batch 8). */
static const tcase sweep_cases[] = {
    {"sweep T5 decoder", SRC_NONE, NULL, 2, 2, 300, 300, 1, 0, 1, 0, 1.0f, 0, NULL, 0, 0},
    {"sweep T5 decoder B8 H12", SRC_NONE, NULL, 8, 12, 512, 512, 1, 0, 1, 0, 1.0f, 0, NULL, 0, 0},
};

/* only: a setting's name ("128x16w1") to run that one alone, or NULL. */
static void sweep_template(gpu *g, int big, const char *only, uint64_t *seed) {
    static const int sizes[] = {16, 32, 64, 128}, warps[] = {1, 2, 4, 8};
    static char names[64][32]; /* at most 4 x 4 x 4 settings */
    setting list[64];
    int n = 0;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            for (int w = 0; w < 4; w++) {
                if (warps[w] * 16 > sizes[i] ||
                    sizes[i] > warps[w] * MHA_SELECT_MAX_ROWS_PER_WARP ||
                    sizes[i] / warps[w] * sizes[j] / 32 > MHA_SELECT_MAX_SCORES_PER_THREAD)
                    continue; /* refused by the template (mha_select) */
                snprintf(names[n], sizeof names[n], "%dx%dw%d", sizes[i], sizes[j], warps[w]);
                if (only && strcmp(only, names[n]) != 0)
                    continue;
                list[n] = (setting){names[n], MHA_KERNEL_BLOCK_WISE, sizes[i], sizes[j],
                                    warps[w], 0, 0, 0, 0, 0};
                n++;
            }
    for (int c = 0; c < (big ? 2 : 1) && !g->dead; c++)
        run_case(g, &sweep_cases[c], STOF_F16, 64, (*seed)++, list, n);
}

int main(int argc, char **argv) {
    gpu g = {0};
    GPU_TEST_OPEN(mha_exec_ctx_create, g.ctx, "gpu_attention");
    g.drv = g.ctx->drv;
    printf("GPU: %s (%s, %d SMs, %d B smem/block opt-in)\n", g.ctx->info.name, g.ctx->arch,
           g.ctx->info.sm_count, g.ctx->info.smem_per_block_optin);
    /* argv[1] = "quick": fp16, D=64 only; "notime": skip the timing; "time": only it;
     * "global": the global-token cases only (below) */
    int quick = argc > 1 && !strcmp(argv[1], "quick");
    /* "sweep [SETTING]": only the template sweep, at both sizes (one setting,
     * "64x32w2", when named) */
    int sweep = argc > 1 && !strcmp(argv[1], "sweep");
    int notime = argc > 1 && (!strcmp(argv[1], "notime") || quick || sweep);
    /* "time": the timing alone */
    if (argc > 1 && !strcmp(argv[1], "time")) {
        timing(&g);
        mha_exec_ctx_free(g.ctx);
        return check_summary("gpu_attention");
    }
    static const stof_dtype dtypes[] = {STOF_F16, STOF_BF16};
    static const int dims[] = {64, 128};
    double t0 = util_now();
    uint64_t seed = 1;
    /* "global": the global-token cases alone, both dtypes, head sizes 64, 128 and 80 */
    if (argc > 1 && !strcmp(argv[1], "global")) {
        static const int gdims[] = {64, 128, 80};
        for (int di = 0; di < 2 && !g.dead; di++)
            for (int hi = 0; hi < 3 && !g.dead; hi++)
                for (int c = 0; c < N_CASES && !g.dead; c++)
                    if (cases[c].n_global)
                        run_case(&g, &cases[c], dtypes[di], gdims[hi], seed++, settings,
                                 N_SETTINGS);
        mha_exec_ctx_free(g.ctx);
        recap_print();
        return check_summary("gpu_attention");
    }
    for (int di = 0; di < (quick ? 1 : 2) && !g.dead && !sweep; di++)
        for (int hi = 0; hi < (quick ? 1 : 2) && !g.dead; hi++)
            for (int c = 0; c < N_CASES && !g.dead; c++)
                run_case(&g, &cases[c], dtypes[di], dims[hi], seed++, settings, N_SETTINGS);
    /* the other head sizes: the row kernel's short last round of dims
     * (D = 80: 40 pairs), other shared-memory pitches */
    static const char *extra_cases[] = {"scattered", "cross causal Sq>Sk"};
    for (int e = 0; e < 2 && !quick && !sweep && !g.dead; e++)
        for (int c = 0; c < N_CASES; c++)
            if (!strcmp(cases[c].name, extra_cases[e])) {
                run_case(&g, &cases[c], STOF_F16, 80, seed++, settings, N_SETTINGS);
                run_case(&g, &cases[c], STOF_BF16, 32, seed++, settings, N_SETTINGS);
            }
    sweep_template(&g, sweep, sweep && argc > 2 ? argv[2] : NULL, &seed);
    for (int c = 0; c < N_CASES && !g.dead && !sweep; c++)
        if (!strcmp(cases[c].name, MEASURED_CASE))
            run_case(&g, &cases[c], STOF_F16, 64, seed++, measured_settings, 2);
    if (!g.dead && !sweep)
        test_wisdom(&g);
    printf("correctness: %.1f s (%d kernels compiled, %d from the disk cache); %d runs split "
           "block rows\n",
           util_now() - t0, g.ctx->nvrtc.compiled, g.ctx->nvrtc.disk_hits, n_split_runs);
    /* the forced chunks cut rows in most cases: the split path must have run */
    CHECK_MSG(g.dead || sweep || n_split_runs >= (quick ? 20 : 200), "only %d runs split block rows",
              n_split_runs);
    if (g.dead)
        printf("STOPPED EARLY: a CUDA error left the context unusable (see above); rerun under "
               "compute-sanitizer to locate it\n");
    if (!notime && !g.dead)
        timing(&g);
    mha_exec_ctx_free(g.ctx);
    recap_print();
    return check_summary("gpu_attention");
}
