/* The analytical kernel selector against numbers worked out by hand (paper
 * Eq. 1 and Eq. 2), its tie-breaks, infeasible settings and its errors. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/base/error.h"
#include "ops/mha_select.h"

/* ---- test masks (the mask struct filled directly; see test_mask_format.c) ---- */

static mask *tmask_new(int batch, int q_len, int k_len) {
    mask *m = calloc(1, sizeof *m);
    m->batch = batch;
    m->q_len = q_len;
    m->k_len = k_len;
    m->words = (k_len + 63) / 64;
    m->bits = calloc((size_t)batch * q_len * m->words, sizeof(uint64_t));
    return m;
}

static void tmask_free(mask *m) {
    free(m->bits);
    free(m);
}

/* |i - j| <= band in batch b. */
static void tmask_band(mask *m, int b, int band) {
    for (int i = 0; i < m->q_len; i++) {
        uint64_t *row = m->bits + ((size_t)b * m->q_len + i) * m->words;
        for (int j = i - band; j <= i + band; j++)
            if (j >= 0 && j < m->k_len)
                row[j >> 6] |= 1ULL << (j & 63);
    }
}

static mha_problem problem(int batch, int heads, int head_dim, int seq, int dtype_bytes,
                           const mask_bsr *blocks16) {
    mha_problem p = {batch, heads, head_dim, seq, seq, dtype_bytes, blocks16};
    return p;
}

/* Runs the selector on a band mask of seq x seq at 16x16 blocks. */
static int select_band(int seq, int band, mha_selection *s) {
    stof_error err = {0};
    mask *m = tmask_new(1, seq, seq);
    tmask_band(m, 0, band);
    mask_bsr *f = NULL;
    int rc = mask_format_bsr_build(m, 16, 16, &f, &err);
    mha_device_limits lim;
    if (!rc)
        rc = mha_limits_for_arch("sm_80", &lim, &err);
    mha_problem p = problem(8, 12, 64, seq, 2, f);
    if (!rc)
        rc = mha_select(&p, &lim, s, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    mask_format_bsr_free(f);
    tmask_free(m);
    return rc;
}

/* ---- stage 1 (Eq. 1) ---------------------------------------------------------------
 * A band |i - j| <= w loads the 16x16 blocks (i, i + k) whose closest
 * elements are 16|k| - 15 apart, i.e. |k| <= (w + 15) / 16 diagonals. */

static void test_stage1_by_hand(void) {
    mha_selection s;
    /* S = 128, band 11 (= round(sqrt(128))): 8 blocks a side, 3 diagonals,
     * 8 + 2 x 7 = 22 loaded; 22/64 - 1.2/log2(8)^2 = 0.34375 - 0.133333. */
    if (!select_band(128, 11, &s)) {
        CHECK_NEAR(s.loaded_blocks16, 22, 0);
        CHECK_NEAR(s.load_ratio, 0.34375, 1e-12);
        CHECK_NEAR(s.penalty, 1.2 / 9.0, 1e-12);
        CHECK_NEAR(s.threshold, 0.2104166667, 1e-9);
        CHECK_EQ_INT(s.kernel, MHA_KERNEL_BLOCK_WISE);
    }
    /* S = 128, band 0 (the diagonal): 8/64 = 0.125 < 0.133333 -> row-wise. */
    if (!select_band(128, 0, &s)) {
        CHECK_NEAR(s.loaded_blocks16, 8, 0);
        CHECK_NEAR(s.threshold, 0.125 - 1.2 / 9.0, 1e-12);
        CHECK_EQ_INT(s.kernel, MHA_KERNEL_ROW_WISE);
        CHECK_EQ_INT(s.rows_per_warp, 1);
        CHECK_EQ_INT(s.warps_per_block, 4);
    }
    /* S = 4096, band 64: 256 blocks a side, 9 diagonals: 9 x 256 - 2 x (1+2+3+4)
     * = 2284 loaded; 2284/65536 - 1.2/8^2 = 0.0348511 - 0.01875 > 0. */
    if (!select_band(4096, 64, &s)) {
        CHECK_NEAR(s.loaded_blocks16, 2284, 0);
        CHECK_NEAR(s.load_ratio, 2284.0 / 65536.0, 1e-12);
        CHECK_NEAR(s.penalty, 0.01875, 1e-12);
        CHECK_NEAR(s.threshold, 0.0161010742, 1e-9);
        CHECK_EQ_INT(s.kernel, MHA_KERNEL_BLOCK_WISE);
    }
    /* S = 4096, band 16: 3 diagonals, 766 loaded; 0.0116882 - 0.01875 < 0. */
    if (!select_band(4096, 16, &s)) {
        CHECK_NEAR(s.loaded_blocks16, 766, 0);
        CHECK_NEAR(s.threshold, -0.0070617676, 1e-9);
        CHECK_EQ_INT(s.kernel, MHA_KERNEL_ROW_WISE);
    }
    /* Dense at 4096: 1 - 0.01875 = 0.98125, from a mask and with no mask. */
    if (!select_band(4096, 4096, &s)) {
        CHECK_NEAR(s.threshold, 0.98125, 1e-12);
        CHECK_EQ_INT(s.kernel, MHA_KERNEL_BLOCK_WISE);
    }
    mha_problem p = problem(1, 1, 64, 4096, 2, NULL);
    mha_select_stage1(&p, &s);
    CHECK_NEAR(s.threshold, 0.98125, 1e-12);
    /* S <= 16: log2(1) = 0, row-wise without dividing by zero. */
    if (!select_band(16, 16, &s)) {
        CHECK_EQ_INT(s.kernel, MHA_KERNEL_ROW_WISE);
        CHECK_CONTAINS(s.reason, "k_len <= 16");
    }
    if (!select_band(1, 0, &s))
        CHECK_EQ_INT(s.kernel, MHA_KERNEL_ROW_WISE);
}

/* Per-batch masks: the loaded count is the average over batches. Batch 0
 * dense (64 of 64 blocks), batch 1 the diagonal (8): 36 / 64 = 0.5625. */
static void test_stage1_per_batch(void) {
    stof_error err = {0};
    mask *m = tmask_new(2, 128, 128);
    tmask_band(m, 0, 128);
    tmask_band(m, 1, 0);
    mask_bsr *f = NULL;
    CHECK(mask_format_bsr_build(m, 16, 16, &f, &err) == STOF_OK);
    mha_device_limits lim;
    mha_limits_for_arch("sm_90", &lim, &err);
    mha_problem p = problem(2, 4, 64, 128, 2, f);
    mha_selection s;
    CHECK(mha_select(&p, &lim, &s, &err) == STOF_OK);
    CHECK_NEAR(s.loaded_blocks16, 36, 0);
    CHECK_NEAR(s.load_ratio, 0.5625, 1e-12);
    p.batch = 3; /* two stored batches cannot serve three */
    CHECK_EQ_INT(mha_select(&p, &lim, &s, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "the mask has 2 batches, attention has 3");
    mask_format_bsr_free(f);
    tmask_free(m);
}

/* ---- stage 2 (Eq. 2) ---------------------------------------------------------------
 * sm_80: 108 SMs, 164 KiB = 167936 B per SM, 163 KiB = 166912 B per block,
 * 64 warps. head_dim 64 (w + padding = 80), fp16, B = 8, H = 12, S = 1024:
 * SM_NUM x S x H x B = 10616832. */

static const mha_candidate *find(const mha_selection *s, int bm, int bn, int w) {
    for (int i = 0; i < s->n_candidates; i++) {
        const mha_candidate *c = &s->table[i];
        if (c->block_m == bm && c->block_n == bn && c->num_warps == w)
            return c;
    }
    return NULL;
}

static void check_candidate(const mha_selection *s, int bm, int bn, int w, long long req,
                            int blocks, double occ, double score) {
    const mha_candidate *c = find(s, bm, bn, w);
    CHECK_MSG(c != NULL, "(%d, %d, %d) missing", bm, bn, w);
    if (!c)
        return;
    CHECK_EQ_INT(c->req_smem, req);
    CHECK_EQ_INT(c->blocks_per_sm, blocks);
    CHECK_NEAR(c->occ, occ, 1e-12);
    CHECK_NEAR(c->score, score, 1e-6);
    CHECK_EQ_INT(c->verdict, MHA_FEASIBLE);
}

static void test_stage2_by_hand(void) {
    stof_error err = {0};
    mha_device_limits lim;
    CHECK(mha_limits_for_arch("sm_80", &lim, &err) == STOF_OK);
    mha_problem p = problem(8, 12, 64, 1024, 2, NULL);
    mha_selection s;
    CHECK(mha_select(&p, &lim, &s, &err) == STOF_OK);
    CHECK_EQ_INT(s.n_candidates, 64);
    /* (16, 16, 1): ((32 + 16) x 80 + 16 x 32) x 2 = 8704 B; 167936 / 8704 =
     * 19.3 -> 19 blocks (64 / 1 = 64 by warps); OCC = 19/64 = 0.296875;
     * score = 0.296875 x sqrt(10616832 / 16^3) = 0.296875 x sqrt(2592). */
    check_candidate(&s, 16, 16, 1, 8704, 19, 0.296875, 0.296875 * sqrt(2592.0));
    /* (32, 32, 2): (96 x 80 + 32 x 48) x 2 = 18432 B; 9.1 -> 9 blocks;
     * OCC = 2 x 9 / 64 = 0.28125; sqrt(10616832 / 32768) = 18 -> 5.0625. */
    check_candidate(&s, 32, 32, 2, 18432, 9, 0.28125, 5.0625);
    /* (64, 64, 4): (192 x 80 + 64 x 80) x 2 = 40960 B; 4.1 -> 4 blocks
     * (64 / 4 = 16); OCC = 0.25; sqrt(10616832 / 262144) = sqrt(40.5). */
    check_candidate(&s, 64, 64, 4, 40960, 4, 0.25, 0.25 * sqrt(40.5));
    /* (128, 128, 8): (384 x 80 + 128 x 144) x 2 = 98304 B; 1 block;
     * OCC = 8/64; sqrt(10616832 / 2^21) = 2.25 -> 0.28125. */
    check_candidate(&s, 128, 128, 8, 98304, 1, 0.125, 0.28125);
    /* The argmax: (16, 16, 1) at 15.1144 beats (16, 32, 1) at
     * 14/64 x sqrt(1296) = 7.875 and everything with BLOCK_M >= 32. */
    check_candidate(&s, 16, 32, 1, 11776, 14, 14.0 / 64.0, 7.875);
    CHECK(s.best >= 0);
    CHECK_EQ_INT(s.block_m, 16);
    CHECK_EQ_INT(s.block_n, 16);
    CHECK_EQ_INT(s.num_warps, 1);
    CHECK_NEAR(s.table[s.best].score, 15.1144067, 1e-6);
    for (int i = 0; i < s.n_candidates; i++) {
        if (s.table[i].verdict == MHA_FEASIBLE)
            CHECK(s.table[i].score <= s.table[s.best].score);
    }
    /* Warps that would split a 16-row tile are not candidates. */
    CHECK_EQ_INT(find(&s, 16, 64, 2)->verdict, MHA_WARPS_EXCEED_ROWS);
    CHECK_EQ_INT(find(&s, 64, 16, 8)->verdict, MHA_WARPS_EXCEED_ROWS);
    CHECK_EQ_INT(find(&s, 128, 16, 8)->verdict, MHA_FEASIBLE);
    /* Nor are warps owning more than 64 rows (their accumulators spill). */
    CHECK_EQ_INT(find(&s, 128, 16, 1)->verdict, MHA_ROWS_EXCEED_WARPS);
    CHECK_EQ_INT(find(&s, 128, 64, 2)->verdict, MHA_FEASIBLE);
    /* Nor 64 rows of 128 keys a warp: 256 scores a thread. */
    CHECK_EQ_INT(find(&s, 128, 128, 2)->verdict, MHA_SCORES_EXCEED_REGS);
    CHECK_EQ_INT(find(&s, 64, 128, 1)->verdict, MHA_SCORES_EXCEED_REGS);
    CHECK_EQ_INT(find(&s, 128, 128, 4)->verdict, MHA_FEASIBLE);
    CHECK_EQ_INT(find(&s, 64, 64, 1)->verdict, MHA_FEASIBLE);
}

/* fp32 at (128, 128): 98304 x 2 = 196608 B > 166912 B per block on sm_80;
 * head_dim 128 fp16 at (128, 128): (384 x 144 + 18432) x 2 = 147456 B fits
 * sm_80 but not sm_86 (101376 B). */
static void test_infeasible(void) {
    stof_error err = {0};
    mha_device_limits a100, rtx3090;
    mha_limits_for_arch("sm_80", &a100, &err);
    mha_limits_for_arch("sm_86", &rtx3090, &err);
    mha_problem p = problem(8, 12, 64, 1024, 4, NULL);
    mha_candidate c;
    mha_score_candidate(&p, &a100, 128, 128, 8, &c);
    CHECK_EQ_INT(c.req_smem, 196608);
    CHECK_EQ_INT(c.verdict, MHA_SMEM_EXCEEDS_BLOCK);
    p = problem(8, 12, 128, 1024, 2, NULL);
    mha_score_candidate(&p, &a100, 128, 128, 8, &c);
    CHECK_EQ_INT(c.req_smem, 147456);
    CHECK_EQ_INT(c.verdict, MHA_FEASIBLE);
    mha_score_candidate(&p, &rtx3090, 128, 128, 8, &c);
    CHECK_EQ_INT(c.verdict, MHA_SMEM_EXCEEDS_BLOCK);
    /* Too many threads for a device that allows 128 per block. */
    mha_device_limits small = a100;
    small.max_threads_per_block = 128;
    mha_score_candidate(&p, &small, 128, 64, 8, &c);
    CHECK_EQ_INT(c.verdict, MHA_THREADS_EXCEED_LIMIT);
    /* Nothing fits: dense says block-wise, the selector falls back to
     * row-wise and says why. */
    p = problem(1, 1, 4096, 1024, 4, NULL);
    mha_selection s;
    CHECK(mha_select(&p, &rtx3090, &s, &err) == STOF_OK);
    CHECK_EQ_INT(s.best, -1);
    CHECK(s.threshold > 0);
    CHECK_EQ_INT(s.kernel, MHA_KERNEL_ROW_WISE);
    CHECK_CONTAINS(s.reason, "no block-wise setting fits");
}

static void test_tie_breaks(void) {
    mha_candidate a = {32, 64, 2, 1000, 4, 0.5, 1.0, MHA_FEASIBLE};
    mha_candidate b = {64, 16, 1, 1000, 4, 0.5, 1.0, MHA_FEASIBLE};
    CHECK(mha_candidate_compare(&a, &b) > 0); /* larger BLOCK_N */
    CHECK(mha_candidate_compare(&b, &a) < 0);
    b.block_n = 64;
    b.score = 1.0 + 1e-13; /* equal within rounding */
    CHECK(mha_candidate_compare(&b, &a) > 0); /* fewer warps */
    b.num_warps = 2;
    CHECK(mha_candidate_compare(&b, &a) > 0); /* then larger BLOCK_M */
    b.score = 1.01;
    b.block_m = 16;
    CHECK(mha_candidate_compare(&b, &a) > 0); /* a clearly higher score first */
    b.verdict = MHA_SMEM_EXCEEDS_BLOCK;
    CHECK(mha_candidate_compare(&a, &b) > 0); /* feasible before everything */
    CHECK_EQ_INT(mha_candidate_compare(&a, &a), 0);
}

static void test_arch_table(void) {
    stof_error err = {0};
    mha_device_limits l;
    CHECK(mha_limits_for_arch("sm_80", &l, &err) == STOF_OK);
    CHECK(l.sm_count == 108 && l.smem_per_sm == 164 * 1024 && l.smem_per_block == 163 * 1024 &&
          l.max_warps_per_sm == 64 && !strcmp(l.arch, "sm_80"));
    CHECK(mha_limits_for_arch("sm_86", &l, &err) == STOF_OK);
    CHECK(l.sm_count == 82 && l.smem_per_sm == 100 * 1024 && l.smem_per_block == 99 * 1024 &&
          l.max_warps_per_sm == 48);
    CHECK(mha_limits_for_arch("sm_89", &l, &err) == STOF_OK);
    CHECK(l.sm_count == 128 && l.smem_per_sm == 100 * 1024 && l.max_warps_per_sm == 48);
    CHECK(mha_limits_for_arch("sm_90", &l, &err) == STOF_OK);
    CHECK(l.sm_count == 132 && l.smem_per_sm == 228 * 1024 && l.smem_per_block == 227 * 1024 &&
          l.max_warps_per_sm == 64 && l.max_threads_per_block == 1024);
    CHECK_EQ_INT(mha_limits_for_arch("sm_75", &l, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "unknown GPU architecture \"sm_75\": known are sm_80, sm_86, sm_89, sm_90");
    CHECK_EQ_INT(mha_limits_for_arch(NULL, &l, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "(null)");
}

static void test_errors(void) {
    stof_error err = {0};
    mha_device_limits lim;
    mha_limits_for_arch("sm_89", &lim, &err);
    mha_selection s;
    mha_problem p = problem(0, 12, 64, 1024, 2, NULL);
    CHECK_EQ_INT(mha_select(&p, &lim, &s, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "must all be positive");
    p = problem(1, 12, 64, 1024, 3, NULL);
    p.dtype_bytes = 0;
    CHECK_EQ_INT(mha_select(&p, &lim, &s, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "element size");
    p.dtype_bytes = 2;
    mha_device_limits bad = lim;
    bad.sm_count = 0;
    CHECK_EQ_INT(mha_select(&p, &bad, &s, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "device limits must be positive");
    /* The mask given to stage 1 must be at 16x16 and of the right shape. */
    mask *m = tmask_new(1, 128, 128);
    tmask_band(m, 0, 3);
    mask_bsr *f32 = NULL, *f16 = NULL;
    mask_format_bsr_build(m, 32, 32, &f32, &err);
    mask_format_bsr_build(m, 16, 16, &f16, &err);
    p = problem(1, 12, 64, 128, 2, f32);
    CHECK_EQ_INT(mha_select(&p, &lim, &s, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "16x16 blocks, got 32x32");
    p = problem(1, 12, 64, 256, 2, f16);
    CHECK_EQ_INT(mha_select(&p, &lim, &s, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "the mask is 128x128");
    mask_format_bsr_free(f32);
    mask_format_bsr_free(f16);
    tmask_free(m);
}

static void test_format(void) {
    stof_error err = {0};
    mha_device_limits lim;
    mha_limits_for_arch("sm_80", &lim, &err);
    mha_problem p = problem(8, 12, 64, 1024, 2, NULL);
    mha_selection s;
    CHECK(mha_select(&p, &lim, &s, &err) == STOF_OK);
    size_t need = mha_selection_format(&s, NULL, 0);
    char *text = malloc(need + 1);
    CHECK_EQ_INT(mha_selection_format(&s, text, need + 1), need);
    CHECK_EQ_INT(strlen(text), need);
    CHECK_CONTAINS(text, "kernel: block-wise");
    CHECK_CONTAINS(text, "on sm_80: 108 SMs");
    CHECK_CONTAINS(text, "BLOCK_M 16, BLOCK_N 16, num_warps 1 (score 15.1144)");
    CHECK_CONTAINS(text, "     16      16     1         8704        19  0.2969    15.1144  feasible  <- best");
    CHECK_CONTAINS(text, "     16      16     4         8704        16  1.0000    50.9117  warps x 16 > BLOCK_M\n");
    char small[40];
    CHECK_EQ_INT(mha_selection_format(&s, small, sizeof small), need);
    CHECK_EQ_INT(strlen(small), sizeof small - 1);
    CHECK(!strncmp(small, text, sizeof small - 1));
    free(text);
    /* Row-wise: the launch defaults appear, and S <= 16 prints no penalty. */
    p = problem(1, 1, 64, 16, 2, NULL);
    CHECK(mha_select(&p, &lim, &s, &err) == STOF_OK);
    char buf[8192];
    mha_selection_format(&s, buf, sizeof buf);
    CHECK_CONTAINS(buf, "kernel: row-wise");
    CHECK_CONTAINS(buf, "row-wise launch: 1 query row per warp, 4 warps per block");
    CHECK_CONTAINS(buf, "no penalty defined");
}

int main(void) {
    test_stage1_by_hand();
    test_stage1_per_batch();
    test_stage2_by_hand();
    test_infeasible();
    test_tie_breaks();
    test_arch_table();
    test_errors();
    test_format();
    return check_summary("test_mha_select");
}
