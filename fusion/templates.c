/* The template table (one row each) and the feasibility checks of their
 * parameter spaces.
 *
 * The shared-memory models below count what each kernel keeps resident:
 * the pipelined operand tiles (STAGES copies) plus whatever a template holds
 * for a whole row block. They are the kernels' contract: a kernel must not
 * need more than its model says. The register check is coarse on purpose:
 * fp32 accumulators beyond FUSION_MAX_ACC_REGS a thread leave too little of
 * the 255 registers for operand fragments and addresses, and spill. */
#include "fusion/templates.h"

#include <stdio.h>
#include <string.h>

#include "core/base/error.h"
#include "kernels/attention_decode_abi.cuh"
#include "kernels/gemm_abi.cuh"
#include "ops/mha_select.h"
#include "ops/ops.h"

#define FUSION_MAX_ACC_REGS 128

/* ---- checks ------------------------------------------------------------------ */

static int check_smem(const char *what, int64_t bytes, int limit, stof_error *err) {
    if (bytes > limit)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "%s needs %lld bytes of shared memory (limit %d)", what, (long long)bytes,
                       limit);
    return STOF_OK;
}

/* rows x cols fp32 accumulators spread over the threads of `warps` warps. */
static int check_acc_regs(const char *what, int64_t rows, int64_t cols, int warps,
                          stof_error *err) {
    int64_t per_thread = rows * cols / ((int64_t)warps * 32);
    if (per_thread > FUSION_MAX_ACC_REGS)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "%s: %lld x %lld accumulators over %d warps are %lld registers a thread "
                       "(at most %d)", what, (long long)rows, (long long)cols, warps,
                       (long long)per_thread, FUSION_MAX_ACC_REGS);
    return STOF_OK;
}

static int check_divides(const char *name, int v, int64_t n, stof_error *err) {
    if (n % v != 0)
        return err_set(err, STOF_ERR_UNSUPPORTED, "%s %d does not divide the row of %lld", name,
                       v, (long long)n);
    return STOF_OK;
}

/* A split of K over a cluster of SPLIT_K blocks (gemm_epilogue.cu): the
 * wgmma build's, each block of the cluster finishing an equal share of the
 * warpgroup's 8-column tiles, its fp32 partials parked in the operand ring. */
static int gemm_split_check(const fusion_dims *d, const int *v, stof_error *err) {
    if (v[5] == 1)
        return STOF_OK;
    const int cols = stof_gemm_wgmma_cols(v[0], v[1], v[3]);
    if (!stof_gemm_wgmma_shape(v[0], v[1], v[2], v[3], v[4]) || (cols / 8) % v[5] ||
        (int64_t)v[0] * v[1] * 4 > stof_gemm_ring_bytes(v[0], v[1], v[2], v[4], d->elem_bytes))
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "SPLIT_K %d: a split of K runs on the wgmma build (BLOCK_K 64, 3 or more "
                       "stages, whole warpgroups) whose warpgroup's column tiles it divides, "
                       "not %dx%dx%d on %d warps",
                       v[5], v[0], v[1], v[2], v[3]);
    return STOF_OK;
}

/* A closing norm (gemm_epilogue.cu's wgmma build): a cluster of SPLIT_K
 * blocks for each of the N / BLOCK_N column tiles holds whole rows. */
static int gemm_norm_check(const fusion_dims *d, const int *v, stof_error *err) {
    if (d->n % v[1] || d->n / v[1] * v[5] > STOF_GEMM_MAX_CLUSTER ||
        !stof_gemm_wgmma_shape(v[0], v[1], v[2], v[3], v[4]))
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "a norm over rows of %lld needs a cluster holding whole rows: the wgmma "
                       "build (BLOCK_K 64, 3 or more stages, whole warpgroups), BLOCK_N "
                       "dividing the row and at most %d blocks (N / BLOCK_N x SPLIT_K), not "
                       "%dx%dx%d on %d warps with SPLIT_K %d",
                       (long long)d->n, STOF_GEMM_MAX_CLUSTER, v[0], v[1], v[2], v[3], v[5]);
    return STOF_OK;
}

/* BLOCK_M, BLOCK_N, BLOCK_K, WARPS, STAGES, SPLIT_K. A setting of whole
 * warpgroups may run as the wgmma build, whose tiles start on a 1024-byte
 * boundary (gemm_abi.cuh): it counts the slack for that on every
 * architecture, the persistent build's staging buffers, and with a norm
 * the statistics' static arrays. */
static int gemm_epilogue_check(const fusion_dims *d, const int *v, int limit, stof_error *err) {
    int64_t smem = stof_gemm_epilogue_smem(v[0], v[1], v[2], v[3], v[4], v[5], d->row_reduce,
                                           d->elem_bytes) +
                   (d->row_reduce ? STOF_GEMM_NORM_SMEM : 0);
    char what[96];
    snprintf(what, sizeof what, "%dx%dx%d tiles in %d stages", v[0], v[1], v[2], v[4]);
    int rc = check_smem(what, smem, limit, err);
    if (!rc)
        rc = check_acc_regs(what, v[0], v[1], v[3], err);
    if (!rc)
        rc = gemm_split_check(d, v, err);
    return rc || !d->row_reduce ? rc : gemm_norm_check(d, v, err);
}

/* ROWS, BLOCK_N, BLOCK_K, WARPS, STAGES. A block owns ROWS whole output rows
 * and keeps them in fp32 until the norm has its statistics. */
static int gemm_ln_check(const fusion_dims *d, const int *v, int limit, stof_error *err) {
    int64_t smem = stof_gemm_ln_smem(v[0], v[1], v[2], v[4], d->n, d->elem_bytes);
    char what[128];
    snprintf(what, sizeof what, "%d rows of %lld (and %dx%dx%d tiles in %d stages)", v[0],
             (long long)d->n, v[0], v[1], v[2], v[4]);
    int rc = check_smem(what, smem, limit, err);
    return rc ? rc : check_acc_regs(what, v[0], v[1], v[3], err);
}

/* BLOCK_M, BLOCK_F, BLOCK_K, WARPS, STAGES. A block computes a chunk of
 * BLOCK_F intermediate features for its rows, activates it in shared memory
 * and multiplies it into the [BLOCK_M, n2] output it keeps in registers;
 * W2's chunk streams through two buffers of STOF_CHAIN_W2_COLS columns. */
static int gemm_chain_check(const fusion_dims *d, const int *v, int limit, stof_error *err) {
    int64_t smem = stof_gemm_chain_smem(v[0], v[1], v[2], v[4], d->elem_bytes);
    char what[128];
    snprintf(what, sizeof what, "%d rows in %d-feature chunks (%d stages)", v[0], v[1], v[4]);
    int rc = check_smem(what, smem, limit, err);
    return rc ? rc : check_acc_regs(what, v[0], d->n2, v[3], err);
}

/* ROWS, THREADS, VEC. A row reduction (norm, softmax) keeps its rows in
 * fp32 between the statistics and the output pass. */
static int mi_chain_check(const fusion_dims *d, const int *v, int limit, stof_error *err) {
    int rc = check_divides("VEC", v[2], d->n, err);
    if (rc || !d->row_reduce)
        return rc;
    char what[96];
    snprintf(what, sizeof what, "%d rows of %lld", v[0], (long long)d->n);
    return check_smem(what, (int64_t)v[0] * d->n * 4, limit, err);
}

/* BLOCK_M, BLOCK_N, WARPS: the selector's own model (Eq. 2), one place. */
static int attention_block_check(const fusion_dims *d, const int *v, int limit,
                                 stof_error *err) {
    mha_problem p = {d->batch, d->heads, d->head_dim, d->q_len, d->k_len, d->elem_bytes, NULL};
    mha_device_limits lim = {1, limit, limit, 64, 1024, NULL};
    mha_candidate c;
    mha_score_candidate(&p, &lim, v[0], v[1], v[2], &c);
    if (c.verdict != MHA_FEASIBLE)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "%dx%d blocks with %d warps: %s (needs %lld bytes of shared "
                       "memory, limit %d)", v[0], v[1], v[2], mha_verdict_name(c.verdict),
                       (long long)c.req_smem, limit);
    return STOF_OK;
}

/* THREADS, VEC */
static int embedding_check(const fusion_dims *d, const int *v, int limit, stof_error *err) {
    return check_divides("VEC", v[1], d->n, err);
}

/* THREADS, VEC: a thread's VEC outputs of one row (glu, mask_rows). */
static int glu_check(const fusion_dims *d, const int *v, int limit, stof_error *err) {
    (void)limit;
    return check_divides("VEC", v[1], d->n, err);
}

/* THREADS, VEC: a thread rotates VEC pairs of one head, so VEC divides half
 * a head (and then the V heads it copies too). */
static int rotary_check(const fusion_dims *d, const int *v, int limit, stof_error *err) {
    (void)limit;
    if (d->head_dim < 2 || (d->head_dim / 2) % v[1])
        return err_set(err, STOF_ERR_UNSUPPORTED, "VEC %d does not divide half of head_dim %d",
                       v[1], d->head_dim);
    return STOF_OK;
}

/* ROWS, BLOCK_N, WARPS, UNROLL, STAGES (kernels/gemv.cu): at most STOF_GEMV_MAX_M rows
 * (beyond, the tensor-core templates read the weights as well and compute faster), ROWS below
 * twice M (more would only idle accumulators), BLOCK_N the warps' whole outputs ([N, K]: 1 to 8
 * a warp) or whole 16-byte column lanes dividing a warp ([K, N]: BLOCK_N / 8 of them), the
 * accumulators and the loads in flight within about 160 registers (100 at 16 warps, whose
 * 512 threads get at most 128 registers each), [K, N]'s partial sums
 * within 48 KiB of static shared memory, [N, K]'s staged rows of x (normalized where a norm
 * comes first) and its stages of weights (STAGES > 0: [N, K] only, a producer lane a row of a
 * tile, so BLOCK_N up to 32) within the block's shared memory. */
static int gemv_check(const fusion_dims *d, const int *v, int limit, stof_error *err) {
    const int rows = v[0], block_n = v[1], warps = v[2], unroll = v[3], stages = v[4];
    const int regs = warps > 8 ? 100 : 160; /* the model's count; the kernel takes about 24 more */
    if (d->m > STOF_GEMV_MAX_M)
        return err_set(err, STOF_ERR_UNSUPPORTED, "%lld rows (it runs up to %d)",
                       (long long)d->m, STOF_GEMV_MAX_M);
    if (rows >= 2 * d->m)
        return err_set(err, STOF_ERR_UNSUPPORTED, "ROWS %d for %lld rows", rows, (long long)d->m);
    if (stages && (d->weight_kn || block_n > 32))
        return err_set(err, STOF_ERR_UNSUPPORTED, "STAGES %d: [N, K] weights and BLOCK_N up to "
                       "32 (BLOCK_N %d%s)", stages, block_n, d->weight_kn ? ", [K, N]" : "");
    if (d->weight_kn) {
        const int lanes = block_n / 8;
        if (block_n % 8 || 32 % lanes)
            return err_set(err, STOF_ERR_UNSUPPORTED, "BLOCK_N %d with [K, N] weights: 8, 16, "
                           "32, 64 or 128 (16-byte column lanes dividing a warp)", block_n);
        if (rows * 8 + unroll * 4 > regs)
            return err_set(err, STOF_ERR_UNSUPPORTED, "ROWS %d x 8 sums and UNROLL %d loads: "
                           "over %d registers (%d warps)", rows, unroll, regs, warps);
        return check_smem("gemv's partial sums", (int64_t)warps * rows * block_n * 4,
                          48 * 1024, err);
    }
    const int outs = block_n / warps;
    if (block_n % warps || outs < 1 || outs > 8)
        return err_set(err, STOF_ERR_UNSUPPORTED, "BLOCK_N %d over %d warps: 1 to 8 outputs a "
                       "warp", block_n, warps);
    if (d->gated && outs % 2)
        return err_set(err, STOF_ERR_UNSUPPORTED, "BLOCK_N %d over %d warps with a GLU: an "
                       "even count of features a warp (each output's two)", block_n, warps);
    if (rows * outs + unroll * outs * 4 + outs * 8 > regs)
        return err_set(err, STOF_ERR_UNSUPPORTED, "ROWS %d x %d outputs, UNROLL %d: over %d "
                       "registers (%d warps)", rows, outs, unroll, regs, warps);
    /* beside the staged rows and weights, the kernel's static statistics (two floats a row)
     * and its stages' two barriers each */
    return check_smem(stages ? "gemv's staged rows of x and stages of weights"
                             : "gemv's staged rows of x",
                      stof_gemv_smem(rows, d->m, d->k, d->elem_bytes) +
                          stof_gemv_stages_smem(stages, block_n, unroll, d->k, d->elem_bytes) +
                          8LL * rows + 16LL * stages,
                      limit, err);
}

/* SPLITS, WARPS (kernels/attention_decode.cu): a CTA's shared memory holds every warp's O of
 * each query head it serves. The plan may give a CTA fewer than all of a K/V head's query
 * heads (core/exec/attention/mha_decode.c), which this check, knowing no SM count, cannot
 * tell: it counts all of them, and the planner's default warps follow it. */
static int attention_decode_check(const fusion_dims *d, const int *v, int limit,
                                  stof_error *err) {
    (void)limit;
    const int group = d->kv_heads > 0 ? d->heads / d->kv_heads : d->heads;
    return check_smem("attention_decode's partial outputs",
                      STOF_DECODE_SMEM_BYTES((int64_t)v[1], group, d->head_dim),
                      STOF_DECODE_SMEM_LIMIT, err);
}

/* ---- the table ---------------------------------------------------------------- */

#define TOK(k) FUSION_TOK(OP_##k)
#define ACT (TOK(GELU) | FUSION_TOK_GELU_TANH | TOK(RELU))
#define NORM (TOK(LAYERNORM) | TOK(RMSNORM))
#define ONE(t) {(t), FUSION_ONE}
#define OPT(t) {(t), FUSION_OPT}
#define ANY(t) {(t), FUSION_ANY}
#define PATTERN(...) {sizeof((fusion_slot[]){__VA_ARGS__}) / sizeof(fusion_slot), {__VA_ARGS__}}
#define PARAM(name, ...) {name, sizeof((int[]){__VA_ARGS__}) / sizeof(int), {__VA_ARGS__}}

static const fusion_template template_table[FUSION_T_COUNT] = {
    [FUSION_T_GEMM_EPILOGUE] = {FUSION_T_GEMM_EPILOGUE, "gemm_epilogue", "gemm_epilogue.cu",
        FUSION_TF_STORES_PRE_NORM,
        1, {PATTERN(ONE(TOK(GEMM)), OPT(TOK(BIAS)), OPT(ACT), OPT(TOK(ADD)), OPT(NORM))},
        6, {PARAM("BLOCK_M", 64, 128), PARAM("BLOCK_N", 32, 64, 128, 256),
            PARAM("BLOCK_K", 32, 64), PARAM("WARPS", 4, 8), PARAM("STAGES", 2, 3, 4, 6, 8),
            PARAM("SPLIT_K", 1, 2, 4, 8)},
        gemm_epilogue_check, 5},
    [FUSION_T_CUBLASLT] = {FUSION_T_CUBLASLT, "cublaslt", "cublaslt", 0,
        2, {PATTERN(ONE(TOK(GEMM)), OPT(TOK(BIAS)), OPT(TOK(RELU) | FUSION_TOK_GELU_TANH)),
            PATTERN(ONE(TOK(GEMM)), OPT(TOK(BIAS)), ONE(TOK(ADD)))},
        /* Which of cublasLtMatmulAlgoGetHeuristic's answers to run. */
        1, {PARAM("ALGO", 0, 1, 2, 3)},
        NULL},
    [FUSION_T_GEMM_LN] = {FUSION_T_GEMM_LN, "gemm_ln", "gemm_ln.cu", FUSION_TF_STORES_PRE_NORM,
        1, {PATTERN(ONE(TOK(GEMM)), OPT(TOK(BIAS)), OPT(TOK(ADD)), ONE(NORM))},
        5, {PARAM("ROWS", 16, 32, 64), PARAM("BLOCK_N", 64, 128), PARAM("BLOCK_K", 32, 64),
            PARAM("WARPS", 4, 8), PARAM("STAGES", 2, 3)},
        gemm_ln_check},
    [FUSION_T_GEMM_CHAIN] = {FUSION_T_GEMM_CHAIN, "gemm_chain", "gemm_chain.cu", 0,
        1, {PATTERN(ONE(TOK(GEMM)), OPT(TOK(BIAS)), OPT(ACT), ONE(TOK(GEMM)), OPT(TOK(BIAS)),
                    OPT(TOK(ADD)))},
        5, {PARAM("BLOCK_M", 16, 32, 64), PARAM("BLOCK_F", 32, 64, 128), PARAM("BLOCK_K", 32, 64),
            PARAM("WARPS", 4, 8), PARAM("STAGES", 2, 3)},
        gemm_chain_check},
    [FUSION_T_MI_CHAIN] = {FUSION_T_MI_CHAIN, "mi_chain", "mi_chain.cu", FUSION_TF_STORES_PRE_NORM,
        1, {PATTERN(ANY(TOK(BIAS) | TOK(ADD) | ACT | TOK(SOFTMAX)), OPT(NORM))},
        3, {PARAM("ROWS", 1, 2, 4, 8), PARAM("THREADS", 64, 128, 256, 512),
            PARAM("VEC", 1, 2, 4, 8)},
        mi_chain_check},
    [FUSION_T_ATTENTION_ROW] = {FUSION_T_ATTENTION_ROW, "attention_row", "attention_row.cu", 0,
        1, {PATTERN(ONE(TOK(ATTENTION)))},
        2, {PARAM("ROWS_PER_WARP", 1, 2, 4), PARAM("WARPS_PER_BLOCK", 2, 4, 8)},
        NULL},
    [FUSION_T_ATTENTION_BLOCK] = {FUSION_T_ATTENTION_BLOCK, "attention_block",
        "attention_block.cu", 0,
        1, {PATTERN(ONE(TOK(ATTENTION)))},
        3, {PARAM("BLOCK_M", 16, 32, 64, 128), PARAM("BLOCK_N", 16, 32, 64, 128),
            PARAM("WARPS", 1, 2, 4, 8)},
        attention_block_check},
    [FUSION_T_EMBEDDING] = {FUSION_T_EMBEDDING, "embedding", "embedding.cu", 0,
        1, {PATTERN(ONE(TOK(EMBEDDING)))},
        2, {PARAM("THREADS", 64, 128, 256), PARAM("VEC", 1, 2, 4, 8)},
        embedding_check},
    [FUSION_T_GLU] = {FUSION_T_GLU, "glu", "glu.cu", 0,
        1, {PATTERN(ONE(TOK(GLU)))},
        2, {PARAM("THREADS", 64, 128, 256), PARAM("VEC", 1, 2, 4, 8)},
        glu_check},
    [FUSION_T_ROTARY] = {FUSION_T_ROTARY, "rotary", "rotary.cu", 0,
        1, {PATTERN(ONE(TOK(ROTARY)))},
        2, {PARAM("THREADS", 64, 128, 256), PARAM("VEC", 1, 2, 4, 8)},
        rotary_check},
    /* SPLITS: the CTAs a sequence's keys are split over (kernels/attention_decode.cu); the
     * planner picks them when the setting is not given. WARPS: a CTA's (plans before it: 4).
     * A rotary op in front is fused: the kernel rotates Q and the new key itself. */
    [FUSION_T_ATTENTION_DECODE] = {FUSION_T_ATTENTION_DECODE, "attention_decode",
        "attention_decode.cu", 0,
        1, {PATTERN(OPT(TOK(ROTARY)), ONE(TOK(ATTENTION)))},
        2, {PARAM("SPLITS", 1, 2, 4, 8, 16, 32, 64), PARAM("WARPS", 4, 8)},
        attention_decode_check, 1},
    /* a few rows (a decode step's): the weights streamed once, each by one thread; a norm
     * ahead of the GEMM (a pre-norm model's) applied to the rows of x as they are read; a
     * gated unit after it (GeGLU, SwiGLU) taking each output's two features in one warp */
    [FUSION_T_GEMV] = {FUSION_T_GEMV, "gemv", "gemv.cu", 0,
        2, {PATTERN(OPT(NORM), ONE(TOK(GEMM)), OPT(TOK(BIAS)), OPT(ACT), OPT(TOK(ADD))),
            PATTERN(OPT(NORM), ONE(TOK(GEMM)), OPT(TOK(BIAS)), ONE(TOK(GLU)))},
        5, {PARAM("ROWS", 1, 2, 4, 8, 16), PARAM("BLOCK_N", 4, 8, 16, 32, 64, 128),
            PARAM("WARPS", 4, 8, 16), PARAM("UNROLL", 2, 4, 8, 16), PARAM("STAGES", 0, 8)},
        gemv_check, 4},
    [FUSION_T_MASK_ROWS] = {FUSION_T_MASK_ROWS, "mask_rows", "mask_rows.cu", 0,
        1, {PATTERN(ONE(TOK(MASK_ROWS)))},
        2, {PARAM("THREADS", 64, 128, 256), PARAM("VEC", 1, 2, 4, 8)},
        glu_check},
};

const fusion_template *fusion_template_get(fusion_template_id id) {
    return (int)id >= 0 && id < FUSION_T_COUNT ? &template_table[id] : NULL;
}

const fusion_template *fusion_template_find(const char *name) {
    for (int t = 0; t < FUSION_T_COUNT; t++)
        if (strcmp(template_table[t].name, name) == 0)
            return &template_table[t];
    return NULL;
}

/* ---- patterns ------------------------------------------------------------------ */

unsigned fusion_op_token(const graph_op *op) {
    if (op->kind == OP_GELU && op->attr.gelu.tanh)
        return FUSION_TOK_GELU_TANH;
    return FUSION_TOK(op->kind);
}

/* Backtracking over the slots; patterns are a handful of slots long. */
static int pattern_match(const fusion_pattern *p, int slot, const unsigned *tok, int i, int n) {
    if (slot == p->n_slots)
        return i == n;
    const fusion_slot *s = &p->slots[slot];
    int fits = i < n && (tok[i] & s->tokens);
    switch (s->repeat) {
    case FUSION_ONE:
        return fits && pattern_match(p, slot + 1, tok, i + 1, n);
    case FUSION_OPT:
        return (fits && pattern_match(p, slot + 1, tok, i + 1, n)) ||
               pattern_match(p, slot + 1, tok, i, n);
    case FUSION_ANY:
        return (fits && pattern_match(p, slot, tok, i + 1, n)) ||
               pattern_match(p, slot + 1, tok, i, n);
    }
    return 0;
}

int fusion_template_accepts(const fusion_template *t, const unsigned *tokens, int n) {
    for (int a = 0; a < t->n_alts; a++)
        if (pattern_match(&t->alts[a], 0, tokens, 0, n))
            return 1;
    return 0;
}

/* Appends s at *len when it fits; *len counts the full length regardless. */
static void str_append(char *buf, size_t cap, size_t *len, const char *s) {
    size_t n = strlen(s);
    if (*len < cap)
        snprintf(buf + *len, cap - *len, "%s", s);
    *len += n;
}

static void slot_str(const fusion_slot *s, char *buf, size_t cap, size_t *len) {
    str_append(buf, cap, len, s->repeat == FUSION_OPT ? "[" : s->repeat == FUSION_ANY ? "(" : "");
    int first = 1;
    for (int k = 0; k <= OP_KIND_COUNT; k++) {
        if (!(s->tokens & (1u << k)))
            continue;
        str_append(buf, cap, len, first ? "" : "|");
        str_append(buf, cap, len, k == OP_KIND_COUNT ? "gelu_tanh" : op_describe(k)->name);
        first = 0;
    }
    str_append(buf, cap, len, s->repeat == FUSION_OPT ? "]" : s->repeat == FUSION_ANY ? ")*" : "");
}

size_t fusion_template_pattern_str(const fusion_template *t, char *buf, size_t cap) {
    size_t len = 0;
    if (cap > 0)
        buf[0] = '\0';
    for (int a = 0; a < t->n_alts; a++) {
        str_append(buf, cap, &len, a ? "; " : "");
        for (int k = 0; k < t->alts[a].n_slots; k++) {
            str_append(buf, cap, &len, k ? " " : "");
            slot_str(&t->alts[a].slots[k], buf, cap, &len);
        }
    }
    return len;
}

/* ---- settings -------------------------------------------------------------------- */

long fusion_template_settings(const fusion_template *t) {
    long count = 1;
    for (int p = 0; p < t->n_params; p++)
        count *= t->params[p].n_values;
    return count;
}

void fusion_template_setting(const fusion_template *t, long index, int *values) {
    for (int p = t->n_params - 1; p >= 0; p--) {
        const fusion_param *q = &t->params[p];
        values[p] = q->values[index % q->n_values];
        index /= q->n_values;
    }
}

static int param_has(const fusion_param *q, int v) {
    for (int i = 0; i < q->n_values; i++)
        if (q->values[i] == v)
            return 1;
    return 0;
}

int fusion_template_check(const fusion_template *t, const fusion_dims *d, const int *values,
                          int smem_limit, stof_error *err) {
    for (int p = 0; p < t->n_params; p++)
        if (!param_has(&t->params[p], values[p]))
            return err_set(err, STOF_ERR_INVALID, "%s: %s = %d is not in its space", t->name,
                           t->params[p].name, values[p]);
    if (!t->check)
        return STOF_OK;
    int rc = t->check(d, values, smem_limit, err);
    if (rc)
        err_prefix(err, "%s: ", t->name);
    return rc;
}
