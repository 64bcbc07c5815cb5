/* The calibrated cost model of the attention kernels without a GPU: the
 * cost file and its errors, the block counts it derives from the 16 x 16
 * grid against the formats the kernels get, the launch arithmetic, and the
 * planner's choice by it (and by Eq. 1, 2 where it has no costs or is
 * switched off). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/exec/attention/mha_exec.h"
#include "core/exec/attention/mha_exec_cost.h"
#include "ops/mask.h"
#include "ops/mask_format.h"

static mask *make_mask(const char *text, int batch, int q, int k) {
    mask *m = NULL;
    stof_error err = {0};
    if (mask_build_text(text, batch, q, k, &m, &err))
        fprintf(stderr, "mask %s: %s\n", text, err.msg);
    return m;
}

/* ---- the file ----------------------------------------------------------------------- */

static void expect_parse_error(const char *text, const char *needle) {
    mha_cost_table t;
    stof_error err = {0};
    CHECK_EQ_INT(mha_cost_parse(text, "costs.txt", &t, &err), STOF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, needle);
    CHECK(t.entries == NULL && t.n == 0);
}

static void test_parse(void) {
    mha_cost_table t;
    stof_error err = {0};
    const char *ok = "# comment\n\n"
                     "sm_90 64 block 64 32 4 1.5 0.25 0.5 3 0.75 1 # trailing comment\n"
                     "sm_90 128 block 64 32 4 2 0.5 1 4 1.5 2\n"
                     "sm_90 64 row 1 4 0 0.1 0.001 0.001 2 0.01 0.01\n";
    CHECK_EQ_INT(mha_cost_parse(ok, "costs.txt", &t, &err), STOF_OK);
    CHECK_EQ_INT(t.n, 3);
    CHECK(t.entries[0].kernel == MHA_KERNEL_BLOCK_WISE && t.entries[0].block_n == 32);
    CHECK_NEAR(t.entries[0].thr_part, 0.5, 0);
    CHECK(t.entries[2].kernel == MHA_KERNEL_ROW_WISE && t.entries[2].warps_per_block == 4);
    CHECK(mha_cost_has_arch(&t, "sm_90") && !mha_cost_has_arch(&t, "sm_80"));

    mha_cost_entry e;
    CHECK(mha_cost_lookup(&t, "sm_90", 64, MHA_KERNEL_BLOCK_WISE, 64, 32, 4, &e));
    CHECK_NEAR(e.thr_full, 0.25, 0);
    /* 80 is nearer 64: its block costs scale by 80 / 64 */
    CHECK(mha_cost_lookup(&t, "sm_90", 80, MHA_KERNEL_BLOCK_WISE, 64, 32, 4, &e));
    CHECK_NEAR(e.thr_full, 0.25 * 80 / 64, 1e-12);
    CHECK_NEAR(e.thr_tile, 1.5, 0);
    CHECK_EQ_INT(e.head_dim, 80);
    /* 96 is as near to both: the larger head size's, scaled down */
    CHECK(mha_cost_lookup(&t, "sm_90", 96, MHA_KERNEL_BLOCK_WISE, 64, 32, 4, &e));
    CHECK_NEAR(e.lat_full, 1.5 * 96 / 128, 1e-12);
    CHECK_NEAR(e.lat_part, 2.0 * 96 / 128, 1e-12);
    CHECK(mha_cost_lookup(&t, "sm_90", 64, MHA_KERNEL_ROW_WISE, 1, 4, 0, &e));
    /* another row-wise geometry takes the per-pair and per-key costs of the measured one */
    CHECK(mha_cost_lookup(&t, "sm_90", 64, MHA_KERNEL_ROW_WISE, 2, 8, 0, &e));
    CHECK(e.rows_per_warp == 2 && e.warps_per_block == 8);
    CHECK_NEAR(e.thr_full, 0.001, 0);
    CHECK(!mha_cost_lookup(&t, "sm_90", 64, MHA_KERNEL_BLOCK_WISE, 64, 64, 4, &e));
    CHECK(!mha_cost_lookup(&t, "sm_80", 64, MHA_KERNEL_BLOCK_WISE, 64, 32, 4, &e));
    mha_cost_table_free(&t);

    expect_parse_error("sm_90 64 block 64 32 4 1 1 1 1 1\n", "costs.txt:1: expected ARCH");
    expect_parse_error("\nsm_90 64 tile 64 32 4 1 1 1 1 1 1\n", "costs.txt:2: kernel 'tile'");
    expect_parse_error("gpu 64 block 64 32 4 1 1 1 1 1 1\n", "ARCH 'gpu'");
    expect_parse_error("sm_90 64 block 64 32 4 1 -1 1 1 1 1\n", "THR_FULL is -1");
    expect_parse_error("sm_90 64 block 64 32 4 1 1 1 nan 1 1\n", "LAT_TILE is nan");
    expect_parse_error("sm_90 64 block 60 32 4 1 1 1 1 1 1\n", "block 60x32");
    expect_parse_error("sm_90 0 block 64 32 4 1 1 1 1 1 1\n", "HEAD_DIM 0");
    expect_parse_error("sm_90 64 row 1 4 2 1 1 1 1 1 1\n", "row-wise");
    expect_parse_error("sm_90 64 block 64 32 4 1 1 1 1 1 1 7\n", "text after the 12 fields");
    expect_parse_error("sm_90 64 block 64 32 4 1 1 1 1 1 1\nsm_90 64 block 64 32 4 2 2 2 2 2 2\n",
                       "costs.txt:2: the setting of this line is given twice");
    char long_line[700];
    memset(long_line, 'x', sizeof long_line - 1);
    long_line[sizeof long_line - 1] = '\0';
    expect_parse_error(long_line, "costs.txt:1: line of 699 bytes");

    /* the library's own file parses */
    CHECK_EQ_INT(mha_cost_builtin(&t, &err), STOF_OK);
    mha_cost_table_free(&t);
}

/* ---- block counts ------------------------------------------------------------------- */

/* The grid's counts at (bm, bn) against mask_format_bsr_build's; g is
 * shared across calls, so its merged rows are reused and replaced. */
static void check_counts(const mask *m, mha_cost_grid *g, int bm, int bn) {
    stof_error err = {0};
    mask_bsr *f = NULL;
    CHECK_EQ_INT(mask_format_bsr_build(m, bm, bn, &f, &err), STOF_OK);
    if (!f)
        return;
    int *loaded = malloc((size_t)f->n_block_rows * sizeof *loaded);
    int *full = malloc((size_t)f->n_block_rows * sizeof *full);
    int bad = 0;
    for (int b = 0; b < f->batch; b++) {
        CHECK_EQ_INT(mha_cost_grid_rows(g, b, bm, bn, loaded, full, &err), STOF_OK);
        const int64_t base = mask_format_bsr_row_base(f, b);
        for (int i = 0; i < f->n_block_rows; i++) {
            int want_load = f->load_row_ptr[base + i + 1] - f->load_row_ptr[base + i];
            int want_full = f->full_row_ptr[base + i + 1] - f->full_row_ptr[base + i];
            bad += loaded[i] != want_load || full[i] != want_full;
        }
    }
    CHECK_MSG(bad == 0, "%s at %dx%d: %d block rows differ", m->desc, bm, bn, bad);
    free(loaded);
    free(full);
    mask_format_bsr_free(f);
}

static void test_counts(void) {
    const char *texts[] = {"bigbird", "sliding_window{band=40}", "causal",
                           "random{rate=0.3,block=16,seed=5}", "dilated",
                           "key_padding{lengths=[100,37,200]}",
                           "per_batch(causal, longformer, global{width=3})"};
    const int sizes[] = {16, 32, 64, 128, 48};
    stof_error err = {0};
    for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        mask *m = make_mask(texts[t], 3, 200, 232); /* neither a multiple of 64 */
        mask_bsr *b16 = NULL;
        mha_cost_grid g;
        CHECK(m && mask_format_bsr_build(m, 16, 16, &b16, &err) == STOF_OK);
        CHECK(b16 && mha_cost_grid_build(m, b16, &g, &err) == STOF_OK);
        /* BLOCK_M outer, then inner (the merged rows replaced at every call) */
        for (int i = 0; b16 && i < 5; i++)
            for (int j = 0; j < 5; j++)
                check_counts(m, &g, sizes[i], sizes[j]);
        for (int i = 0; b16 && i < 5; i++)
            for (int j = 0; j < 5; j++)
                check_counts(m, &g, sizes[j], sizes[i]);
        int loaded[32], full[32];
        CHECK_EQ_INT(mha_cost_grid_rows(&g, 0, 8, 16, loaded, full, &err), STOF_ERR_INVALID);
        CHECK_CONTAINS(err.msg, "block 8x16 is not made of 16 x 16 cells");
        CHECK_EQ_INT(mha_cost_grid_rows(&g, 0, 16, 0, loaded, full, &err), STOF_ERR_INVALID);
        if (b16)
            mha_cost_grid_free(&g);
        mask_format_bsr_free(b16);
        mask_free(m);
    }
}

/* ---- the launch --------------------------------------------------------------------- */

static mha_cost_entry block_entry(int bm, int bn, double thr_tile, double thr_full,
                                  double thr_part, double lat_tile, double lat_full,
                                  double lat_part) {
    return (mha_cost_entry){.arch = "sm_90", .head_dim = 64, .kernel = MHA_KERNEL_BLOCK_WISE,
                            .block_m = bm, .block_n = bn, .num_warps = 4,
                            .thr_tile = thr_tile, .thr_full = thr_full, .thr_part = thr_part,
                            .lat_tile = lat_tile, .lat_full = lat_full, .lat_part = lat_part};
}

static void with_grid(const char *text, int batch, int q, int k, mha_cost_grid *g, mask **m) {
    stof_error err = {0};
    mask_bsr *b16 = NULL;
    *m = make_mask(text, batch, q, k);
    CHECK(*m && mask_format_bsr_build(*m, 16, 16, &b16, &err) == STOF_OK);
    CHECK(b16 && mha_cost_grid_build(*m, b16, g, &err) == STOF_OK);
    mask_format_bsr_free(b16);
}

static void test_predict(void) {
    mha_cost_grid g;
    mask *m;
    /* dense 512 x 512: 8 block rows of 8 full 64 x 64 blocks, 2 x 3 copies = 48 tiles */
    with_grid("union(causal, global{width=512})", 1, 512, 512, &g, &m);
    mha_cost_entry e = block_entry(64, 64, 1, 2, 3, 5, 1, 9);
    /* 48 tiles on 10 SMs: 5 on the busiest, each 1 + 8 x 2 = 17 */
    CHECK_NEAR(mha_cost_predict(&e, &g, 2, 3, 10, 0, 0), 5 * 17.0, 1e-9);
    /* on 100 SMs the slowest tile's latency (5 + 8) bounds it, not its 17 of throughput */
    e.lat_tile = 50;
    CHECK_NEAR(mha_cost_predict(&e, &g, 2, 3, 100, 0, 0), 58.0, 1e-9);
    mha_cost_grid_free(&g);
    mask_free(m);

    /* causal: rows of 1..8 blocks, the diagonal partial at 64 x 64: row i has i full
     * blocks and one partial; on 1 SM the sum */
    with_grid("causal", 1, 512, 512, &g, &m);
    e = block_entry(64, 64, 1, 2, 3, 0, 0, 0);
    double sum = 0;
    for (int i = 0; i < 8; i++)
        sum += 1 + 2.0 * i + 3;
    CHECK_NEAR(mha_cost_predict(&e, &g, 1, 1, 1, 0, 0), sum, 1e-9);
    /* 2 SMs: in launch order (row 0 first), each to the least loaded: 4 8 16 ... | 6 10 ...
     * -> 40 / 48 */
    double load[2] = {0, 0};
    for (int i = 0; i < 8; i++) {
        int s = load[1] < load[0];
        load[s] += 1 + 2.0 * i + 3;
    }
    CHECK_NEAR(mha_cost_predict(&e, &g, 1, 1, 2, 0, 0), fmax(load[0], load[1]), 1e-9);
    /* alone on 100 SMs: the last row's 7 full blocks and its diagonal one, at their own
     * latencies */
    e = block_entry(64, 64, 0, 0, 0, 1, 2, 5);
    CHECK_NEAR(mha_cost_predict(&e, &g, 1, 1, 100, 0, 0), 1 + 7 * 2.0 + 5, 1e-9);
    /* one SM, the longest row launched last. Row i costs 4 + 2i of throughput (load 88 in
     * all) and 6 + 4i of latency. The last starts when its predecessor would run alone:
     * load 70 before it, less that one's latency 30 less its throughput 16: 56; it ends
     * 34 later, at 90, after the load */
    e = block_entry(64, 64, 1, 2, 3, 0, 4, 6);
    CHECK_NEAR(mha_cost_predict(&e, &g, 1, 1, 1, 0, 0), 90.0, 1e-9);
    mha_cost_grid_free(&g);
    mask_free(m);

    /* Longformer's global rows: a plan that splits them (resident slots given) is
     * predicted faster than one that walks them whole */
    with_grid("longformer{global=64,band=64}", 1, 4096, 4096, &g, &m);
    e = block_entry(64, 64, 1, 1, 1, 2, 0.5, 0.5);
    double whole = mha_cost_predict(&e, &g, 1, 1, 132, 0, 0);
    double split = mha_cost_predict(&e, &g, 1, 1, 132, 132 * 4, 0);
    CHECK_MSG(split < whole, "split %g, whole %g", split, whole);
    /* a forced chunk: never (-1) is the whole launch; 8 blocks cuts the 64-block global
     * row into 8 pieces of 8 (one SM each: 1 + 8 x 1 of throughput, over their 2 + 8 x 0.5
     * of latency) and pays the combine kernel's latency (2) once */
    CHECK_NEAR(mha_cost_predict(&e, &g, 1, 1, 132, 132 * 4, -1), whole, 1e-9);
    CHECK_NEAR(mha_cost_predict(&e, &g, 1, 1, 132, 0, 8), 1 + 8 * 1.0 + 2, 1e-9);
    CHECK(whole >= 2 + 64 * 0.5); /* the global row's 64 blocks, alone */
    mha_cost_grid_free(&g);
    mask_free(m);

    /* row-wise: tiles of 4 rows, throughput by pairs, latency by the longest row */
    with_grid("causal", 1, 8, 8, &g, &m);
    mha_cost_entry r = {.arch = "sm_90", .head_dim = 64, .kernel = MHA_KERNEL_ROW_WISE,
                        .rows_per_warp = 1, .warps_per_block = 4, .thr_tile = 1,
                        .thr_full = 1, .thr_part = 1, .lat_tile = 0, .lat_full = 0,
                        .lat_part = 0};
    /* rows 0-3: 1+2+3+4 = 10 pairs, rows 4-7: 26; one SM: 1 + 10 + 1 + 26 */
    CHECK_NEAR(mha_cost_predict(&r, &g, 1, 1, 1, 0, 0), 38.0, 1e-9);
    r.lat_tile = 100;
    r.lat_full = 10;
    CHECK_NEAR(mha_cost_predict(&r, &g, 1, 1, 8, 0, 0), 100 + 8 * 10.0, 1e-9);
    mha_cost_grid_free(&g);
    mask_free(m);
}

/* ---- the planner's choice ----------------------------------------------------------- */

static void choose(const char *arch, const char *mask_text, int batch, int seq,
                   mha_exec_config *cfg, char *reason) {
    stof_error err = {0};
    mha_device_limits lim;
    CHECK_EQ_INT(mha_limits_for_arch(arch, &lim, &err), STOF_OK);
    mask *m = make_mask(mask_text, 1, seq, seq), *folded = NULL;
    mha_exec_problem p = {.mask = m, .batch = batch, .heads = 12, .head_dim = 64,
                          .q_len = seq, .k_len = seq, .dtype = STOF_F16, .scale = 0.125f};
    CHECK(m && mha_exec_fold_mask(&p, &folded, &err) == STOF_OK);
    CHECK_EQ_INT(mha_exec_choose(&p, folded, &lim, NULL, cfg, reason, 256, &err), STOF_OK);
    mask_free(folded);
    mask_free(m);
}

/* The ranking: fastest first, a forced build or depth leaves it to Eq. 1, 2, a
 * forced split changes the prediction, the cap keeps the fastest. */
static void rank_checks(void) {
    stof_error err = {0};
    mha_device_limits lim;
    CHECK_EQ_INT(mha_limits_for_arch("sm_90", &lim, &err), STOF_OK);
    mask *m = make_mask("longformer", 1, 2048, 2048), *folded = NULL;
    mha_exec_problem p = {.mask = m, .batch = 1, .heads = 12, .head_dim = 64, .q_len = 2048,
                          .k_len = 2048, .dtype = STOF_F16, .scale = 0.125f};
    CHECK(m && mha_exec_fold_mask(&p, &folded, &err) == STOF_OK);
    mha_exec_ranked all[MHA_EXEC_MAX_RANKED], few[3];
    int n = 0, k = 0;
    CHECK_EQ_INT(mha_exec_model_rank(&p, folded, &lim, NULL, all, MHA_EXEC_MAX_RANKED, &n, &err),
                 STOF_OK);
    CHECK(n > 10);
    int sorted = 1;
    for (int i = 1; i < n; i++)
        sorted &= all[i - 1].us <= all[i].us;
    CHECK(sorted);
    CHECK_EQ_INT(mha_exec_model_rank(&p, folded, &lim, NULL, few, 3, &k, &err), STOF_OK);
    CHECK(k == 3 && few[0].us == all[0].us && few[2].us == all[2].us);
    mha_exec_force f = {.kernel = -1, .wgmma = -1};
    CHECK_EQ_INT(mha_exec_model_rank(&p, folded, &lim, &f, few, 3, &k, &err), STOF_OK);
    CHECK_EQ_INT(k, 0);
    f = (mha_exec_force){.kernel = MHA_KERNEL_BLOCK_WISE};
    CHECK_EQ_INT(mha_exec_model_rank(&p, folded, &lim, &f, all, MHA_EXEC_MAX_RANKED, &n, &err),
                 STOF_OK);
    int rows = 0;
    for (int i = 0; i < n; i++)
        rows += all[i].cfg.kernel == MHA_KERNEL_ROW_WISE;
    CHECK(n > 10 && rows == 0);
    /* a forced row-wise geometry is still ranked (the measured geometry's costs) */
    f = (mha_exec_force){.kernel = -1, .rows_per_warp = 2};
    CHECK_EQ_INT(mha_exec_model_rank(&p, folded, &lim, &f, all, MHA_EXEC_MAX_RANKED, &n, &err),
                 STOF_OK);
    rows = 0;
    for (int i = 0; i < n; i++)
        rows += all[i].cfg.kernel == MHA_KERNEL_ROW_WISE && all[i].cfg.rows_per_warp == 2;
    CHECK_EQ_INT(rows, 1);
    mask_free(folded);
    mask_free(m);
}

/* The library's costs cover every setting the planner ranks on sm_90, at every head size
 * the kernels are built for: a setting without costs would silently drop out of the
 * ranking. */
static void test_builtin_coverage(void) {
    mha_cost_table t;
    stof_error err = {0};
    mha_device_limits lim;
    CHECK_EQ_INT(mha_cost_builtin(&t, &err), STOF_OK);
    CHECK_EQ_INT(mha_limits_for_arch("sm_90", &lim, &err), STOF_OK);
    if (!mha_cost_has_arch(&t, "sm_90")) {
        mha_cost_table_free(&t);
        return;
    }
    const int dims[] = {32, 64, 80, 128}, sizes[] = {16, 32, 64, 128}, warps[] = {1, 2, 4, 8};
    int missing = 0, ranked = 0;
    for (int d = 0; d < 4; d++) {
        mha_problem p = {.batch = 1, .heads = 1, .head_dim = dims[d], .q_len = 256,
                         .k_len = 256, .dtype_bytes = 2};
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                for (int w = 0; w < 4; w++) {
                    mha_candidate c;
                    mha_score_candidate(&p, &lim, sizes[i], sizes[j], warps[w], &c);
                    if (c.verdict != MHA_FEASIBLE ||
                        !mha_exec_block_regs_ok(sizes[i], sizes[j], warps[w], dims[d]) ||
                        mha_exec_block_smem(sizes[i], sizes[j], MHA_EXEC_MIN_STAGES, dims[d],
                                            2) > (size_t)lim.smem_per_block)
                        continue;
                    ranked++;
                    int found = 0; /* a line of this very head size, not a scaled neighbour */
                    for (int k = 0; k < t.n && !found; k++) {
                        const mha_cost_entry *e = &t.entries[k];
                        found = e->kernel == MHA_KERNEL_BLOCK_WISE && e->head_dim == dims[d] &&
                                e->block_m == sizes[i] && e->block_n == sizes[j] &&
                                e->num_warps == warps[w] && strcmp(e->arch, "sm_90") == 0;
                    }
                    CHECK_MSG(found, "no sm_90 costs for block %dx%d w%d at head size %d",
                              sizes[i], sizes[j], warps[w], dims[d]);
                    missing += !found;
                }
        mha_cost_entry e;
        CHECK(mha_cost_lookup(&t, "sm_90", dims[d], MHA_KERNEL_ROW_WISE, 1, 4, 0, &e));
    }
    CHECK(ranked > 80 && missing == 0);
    mha_cost_table_free(&t);
}

static void test_choose(void) {
    mha_cost_table t;
    stof_error err = {0};
    CHECK_EQ_INT(mha_cost_builtin(&t, &err), STOF_OK);
    int calibrated = mha_cost_has_arch(&t, "sm_90");
    mha_cost_table_free(&t);
    mha_exec_config cfg;
    char reason[256];
    choose("sm_90", "bigbird", 16, 2048, &cfg, reason);
    if (calibrated)
        CHECK_CONTAINS(reason, "cost model (sm_90, attention_cost.txt)");
    else
        CHECK_CONTAINS(reason, "selector:");
    if (calibrated)
        rank_checks();
    setenv("STOF_ATTENTION_MODEL", "paper", 1);
    choose("sm_90", "bigbird", 16, 2048, &cfg, reason);
    CHECK_CONTAINS(reason, "selector:");
    unsetenv("STOF_ATTENTION_MODEL");
    /* an architecture without costs keeps to Eq. 1, 2 */
    CHECK_EQ_INT(mha_cost_builtin(&t, &err), STOF_OK);
    int sm86 = mha_cost_has_arch(&t, "sm_86");
    mha_cost_table_free(&t);
    if (!sm86) {
        choose("sm_86", "bigbird", 16, 2048, &cfg, reason);
        CHECK_CONTAINS(reason, "selector:");
    }
}

int main(void) {
    test_parse();
    test_counts();
    test_predict();
    test_builtin_coverage();
    test_choose();
    return check_summary("test_attention_cost");
}
