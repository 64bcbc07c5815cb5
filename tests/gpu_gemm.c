/* gemm_epilogue, gemm_ln, gemm_chain, mi_chain and embedding on the GPU
 * against fp64 CPU references written here, independent of the kernels.
 *
 * gemm_epilogue: every M in {1, 7, 64, 1000, 4096} (none a multiple of
 * every tile), N in {768, 2304, 3072}, K in {768, 1024, 3072, 4096}, both
 * weight layouts, fp16 and bf16, with the plain and one rotating epilogue
 * on five tile settings rotating (on sm_90 the four of whole warpgroups run
 * as the wgmma build with [N, K] weights); then every epilogue the template declares (bias x
 * {none, gelu, gelu_tanh, relu} x add = 16) in both layouts on three shapes
 * (one with N = 776, a multiple of no tile), and the residual added in place
 * (residual == y). Inputs are fresh seeded uniform values rounded to the
 * dtype, outputs poisoned with NaN before every launch. Checked: the relative error ||out - ref|| / ||ref|| on the
 * reference rows (every row up to M = 16, else 16 rows: the first, the last,
 * tile edges and random ones; an fp64 GEMM of every row would take minutes
 * in a sanitizer build) below 1e-2 (fp16) or 2e-2 (bf16), and no NaN or
 * infinity anywhere in the output.
 *
 * gemm_ln: every M in {1, 7, 1000, 4096}, N in {512, 768, 1024}, K in
 * {512, 768, 3072}, fp16 and bf16, four cases each (layernorm and rmsnorm,
 * with and without bias; the residual, the pre-norm store, the weight
 * layout and four tile settings rotating), the pre-norm output checked as
 * well as y, and the residual stream updated in place (y == residual).
 * Weights are scaled by sqrt(3 / K) so that x w^T, bias and residual are of
 * one size. Reference rows and tolerances as for gemm_epilogue.
 *
 * gemm_epilogue closing with a norm (sm_90: its wgmma build over clusters
 * holding whole rows): M in {1, 7, 128, 1000}, N in {512, 768, 1024}, K in
 * {768, 3072}, four cases each as for gemm_ln plus an erf GELU before the
 * residual on some, six tile settings (K whole and split) rotating; same
 * reference and tolerances.
 *
 * gemm_chain (the FFN): M in {1, 16, 100, 512}, (K, F, N) in {(768, 3072,
 * 768), (512, 2048, 512), (1024, 2048, 768)}, fp16 and bf16, every
 * activation with and without the residual (the biases, the weight layout
 * and four settings rotating), and y updated in place; the reference is
 * act(x w1^T + b1) w2^T + b2 + residual in fp64 on the reference rows.
 *
 * mi_chain: bias+add+layernorm, add+layernorm, add+rmsnorm, gelu, the
 * pre-norm store of pre-LN models, bias+gelu_tanh, add+relu, rows of 512,
 * 768 and 1024, 7 and 1000 rows, three thread layouts (a warp a row, a
 * block a row, a sub-warp a row). Every element checked. The same with an fp32
 * residual stream: the stream read as x or as the residual, added to, stored as the norm's
 * input, normalized alone (`gpu_gemm stream` runs these alone).
 *
 * embedding: with and without position and type tables, widths 768 (VEC 8)
 * and 100 (VEC 4); bad ids give zero rows and an error naming the token.
 *
 * One line per case, the failures again at the end. Then gemm_epilogue is
 * timed at BERT-base's FFN shapes (M = 4096 and 128; N, K = 3072, 768 and
 * 768, 3072), fp16, in its default setting and at 4096 rows in six more
 * (STOF_GEMM_TIME_SETTINGS replaces those; see timing()); gemm_ln at
 * M = 4096, N = K = 768 against gemm_epilogue + mi_chain; gemm_chain at
 * M = 128, K = N = 768, F = 3072 against gemm_epilogue twice (medians of
 * 20, informational). Exit 77 with "SKIPPED: <reason>" when there is no GPU.
 * argv[1] = "notime" skips the timing, "timeonly" runs nothing else. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu_open.h"
#include "core/gpu/device.h"
#include "core/exec/gemm/gemm_exec.h"
#include "core/base/util.h"

#define GPU_CTX_TYPE gemm_exec_ctx
#include "gpu_gemm_common.h"

/* BLOCK_M, BLOCK_N, BLOCK_K, WARPS, STAGES */
/* BLOCK_M, BLOCK_N, BLOCK_K, WARPS, STAGES, SPLIT_K. On sm_90 (with [N, K]
 * weights) all but the first are the wgmma build; the last two split K over
 * clusters of 4 and 2 blocks. Elsewhere those two cannot run and are skipped
 * (the plan says so). */
static const int gemm_settings[][6] = {
    {128, 128, 32, 8, 3, 1}, {64, 64, 64, 4, 4, 1}, {128, 256, 64, 8, 4, 1},
    {64, 128, 64, 8, 6, 1},  {128, 128, 64, 8, 3, 1}, {64, 32, 64, 4, 6, 4},
    {128, 64, 64, 8, 4, 2}};
#define N_GEMM_SETTINGS 7
static const int time_settings[][6] = {
    {128, 128, 32, 8, 3, 1}, {128, 128, 64, 8, 3, 1}, {128, 128, 64, 8, 4, 1},
    {128, 256, 64, 8, 3, 1}, {128, 256, 64, 8, 4, 1}, {64, 256, 64, 4, 4, 1}};
#define N_TIME_SETTINGS 6

/* A plan, or a failed case (recorded) and NULL. */
static gemm_exec_plan *make_plan(gpu *g, const gemm_exec_problem *p, const int *values,
                                 const char *label) {
    gemm_exec_plan *plan = NULL;
    stof_error err = {0};
    int rc = gemm_exec_plan_create(g->ctx, p, values, &plan, &err);
    if (rc) {
        n_runs++;
        printf("%-72s PLAN FAILED: %s\n", label, err.msg);
        CHECK_MSG(0, "%s: %s", label, err.msg);
        recap_add("%s: plan: %.160s", label, err.msg);
        if (rc == STOF_ERR_CUDA)
            g->dead = 1;
    }
    return plan;
}

/* ---- gemm_epilogue ----------------------------------------------------------------------- */

/* Runs one gemm_epilogue case on a set and checks it. in_place: the
 * residual is y itself (y starts as the residual instead of NaN). */
static void run_gemm(gpu *g, gset *s, int weight_kn, fusion_epilogue epi, int setting,
                     int in_place) {
    const gweights *wt = s->wt;
    const int N = wt->N;
    char label[160];
    const int *set = gemm_settings[setting];
    gemm_exec_problem p = {.tmpl = FUSION_T_GEMM_EPILOGUE, .dtype = wt->dt, .m = s->M, .n = N,
                           .k = wt->K, .epi = epi, .weight_kn = weight_kn};
    const int wgmma = gemm_exec_wgmma(&p, set, g->ctx->arch);
    snprintf(label, sizeof label, "gemm %s M=%d N=%d K=%d %s %s%s%s %dx%dx%d w%d s%d sk%d%s",
             stof_dtype_name(wt->dt), s->M, N, wt->K, weight_kn ? "W[K,N]" : "W[N,K]",
             epi.has_bias ? "bias" : "-", act_label(epi.act),
             epi.has_residual ? (in_place ? "+add(in place)" : "+add") : "", set[0], set[1],
             set[2], set[3], set[4], set[5], wgmma ? " wgmma" : "");
    if (set[5] > 1 && !wgmma) {
        printf("%-72s skipped: a split of K needs the wgmma build (sm_90, W[N,K])\n", label);
        return;
    }
    gemm_exec_plan *plan = make_plan(g, &p, set, label);
    if (!plan)
        return;
    size_t mn = (size_t)s->M * N;
    gemm_exec_gemm_tensors t = {.x = s->dx, .w = weight_kn ? wt->dw_kn : wt->dw_nk,
                                .bias = wt->db, .residual = in_place ? s->dy : s->dr,
                                .y = s->dy};
    stof_error err = {0};
    int rc = in_place ? check_cu(g, g->drv->MemcpyHtoD(s->dy, s->res_bits, mn * 2),
                                 "cuMemcpyHtoD(y = residual)")
                      : poison(g, s->dy, mn);
    if (!rc && (rc = gemm_exec_gemm(g->ctx, plan, &t, 0, &err)) != STOF_OK) {
        n_runs++;
        printf("%-72s LAUNCH FAILED: %s\n", label, err.msg);
        CHECK_MSG(0, "%s: %s", label, err.msg);
        recap_add("%s: launch: %.160s", label, err.msg);
    }
    if (!rc && !fetch(g, s->hy, s->dy, mn))
        judge_epilogue(s, &epi, label);
    gemm_exec_plan_free(g->ctx, plan);
}

/* The 16 epilogues the template declares: [bias] [gelu|gelu_tanh|relu] [add]. */
static fusion_epilogue epilogue_of(int i) {
    fusion_epilogue e = {0};
    e.has_bias = i & 1;
    e.act = (fusion_act)((i >> 1) & 3);
    e.has_residual = (i >> 3) & 1;
    return e;
}

static void test_gemm_shapes(gpu *g, util_rng *rng) {
    static const int Ms[] = {1, 7, 64, 1000, 4096};
    static const int Ns[] = {768, 2304, 3072};
    static const int Ks[] = {768, 1024, 3072, 4096};
    static const stof_dtype dts[] = {STOF_F16, STOF_BF16};
    int turn = 0;
    for (int d = 0; d < 2 && !g->dead; d++)
        for (int ni = 0; ni < 3 && !g->dead; ni++)
            for (int ki = 0; ki < 4 && !g->dead; ki++) {
                gweights wt;
                if (make_weights(g, &wt, Ns[ni], Ks[ki], dts[d], rng)) {
                    free_weights(g, &wt);
                    return;
                }
                for (int mi = 0; mi < 5 && !g->dead; mi++) {
                    gset s;
                    if (!make_set(g, &s, &wt, Ms[mi], rng))
                        for (int kn = 0; kn < 2 && !g->dead; kn++) {
                            run_gemm(g, &s, kn, epilogue_of(0), turn % N_GEMM_SETTINGS, 0);
                            /* the rotating epilogue: 1..15, never the plain one */
                            run_gemm(g, &s, kn, epilogue_of(1 + turn % 15),
                                     (turn + 1) % N_GEMM_SETTINGS, 0);
                            turn++;
                        }
                    free_set(g, &s);
                }
                free_weights(g, &wt);
            }
}

static void test_gemm_epilogues(gpu *g, util_rng *rng) {
    /* N = 776: no tile's multiple (nor the stores' 32 columns), so the last
     * column tile and the last stored chunk are cut at N */
    static const int shapes[][3] = {{1000, 768, 768}, {7, 2304, 1024}, {1000, 776, 768}};
    static const stof_dtype dts[] = {STOF_F16, STOF_BF16};
    for (int d = 0; d < 2 && !g->dead; d++)
        for (int sh = 0; sh < 3 && !g->dead; sh++) {
            gweights wt;
            gset s;
            if (make_weights(g, &wt, shapes[sh][1], shapes[sh][2], dts[d], rng)) {
                free_weights(g, &wt);
                return;
            }
            if (make_set(g, &s, &wt, shapes[sh][0], rng)) {
                free_set(g, &s);
                free_weights(g, &wt);
                return;
            }
            for (int e = 0; e < 16 && !g->dead; e++)
                for (int kn = 0; kn < 2 && !g->dead; kn++)
                    run_gemm(g, &s, kn, epilogue_of(e), (e + kn) % N_GEMM_SETTINGS, 0);
            fusion_epilogue full = {1, FUSION_ACT_GELU, 1, FUSION_NORM_NONE};
            run_gemm(g, &s, 0, full, 0, 1);
            run_gemm(g, &s, 0, full, 2, 1);
            run_gemm(g, &s, 1, full, 2, 1);
            free_set(g, &s);
            free_weights(g, &wt);
        }
}

/* ---- gemm_ln ------------------------------------------------------------------------------ */

/* ROWS, BLOCK_N, BLOCK_K, WARPS, STAGES. The last (64 fp32 rows of N) fits
 * shared memory for N <= 768 only. */
static const int ln_settings[][5] = {
    {32, 128, 64, 8, 3}, {16, 64, 32, 4, 2}, {16, 128, 64, 8, 3}, {64, 128, 32, 4, 2}};
static const int ln_Ms[] = {1, 7, 1000, 4096};
static const int ln_Ns[] = {512, 768, 1024};
static const int ln_Ks[] = {512, 768, 3072};
static const stof_dtype test_dts[] = {STOF_F16, STOF_BF16};
#define LN_VARIANTS 4

/* Case v of a shape: v picks the norm (bit 0) and the bias (bit 1); the
 * residual, the pre-norm store, the weight layout and the setting rotate
 * with the shape, so that every one meets every M, N and K. */
static void ln_case(int d, int ni, int ki, int mi, int v, gemm_exec_problem *p, int *values) {
    memset(p, 0, sizeof *p);
    p->tmpl = FUSION_T_GEMM_LN;
    p->dtype = test_dts[d];
    p->m = ln_Ms[mi];
    p->n = ln_Ns[ni];
    p->k = ln_Ks[ki];
    p->epi.norm = v & 1 ? FUSION_NORM_RMSNORM : FUSION_NORM_LAYERNORM;
    p->epi.has_bias = (v >> 1) & 1;
    p->epi.has_residual = (mi + ki + v) % 4 != 3;
    p->store_pre_norm = (ni + mi + v) % 2;
    p->weight_kn = (ni + ki + mi + v) % 5 == 4;
    p->eps = v & 1 ? 1e-6f : 1e-5f;
    const int n_settings = p->n <= 768 ? 4 : 3;
    memset(values, 0, FUSION_MAX_PARAMS * sizeof *values);
    memcpy(values, ln_settings[(mi + 2 * ki + ni + v) % n_settings], sizeof ln_settings[0]);
}

/* The norm of one row s[0..N-1] into y (fp64, biased variance). */
static void norm_ref(fusion_norm norm, const double *s, int N, const float *gamma,
                     const float *beta, double eps, double *y) {
    double mean = 0.0, var = 0.0, ms = 0.0;
    for (int n = 0; n < N; n++) {
        mean += s[n];
        ms += s[n] * s[n];
    }
    mean /= N;
    ms /= N;
    for (int n = 0; n < N; n++)
        var += (s[n] - mean) * (s[n] - mean);
    var /= N;
    for (int n = 0; n < N; n++)
        y[n] = norm == FUSION_NORM_LAYERNORM ? (s[n] - mean) / sqrt(var + eps) * gamma[n] + beta[n]
                                             : s[n] / sqrt(ms + eps) * gamma[n];
}

/* gamma [N] in [0.5, 1.5), beta [N] in [-1, 1) (host and device). */
typedef struct lnparams {
    float *gamma, *beta;
    CUdeviceptr dgamma, dbeta;
} lnparams;

static int make_lnparams(gpu *g, lnparams *lp, int N, stof_dtype dt, util_rng *rng) {
    memset(lp, 0, sizeof *lp);
    lp->gamma = malloc((size_t)N * sizeof *lp->gamma);
    lp->beta = malloc((size_t)N * sizeof *lp->beta);
    uint16_t *bits = malloc((size_t)N * 4);
    int rc = -1;
    if (lp->gamma && lp->beta && bits) {
        fill(lp->gamma, bits, (size_t)N, dt, rng, 0.5, 1.5);
        fill(lp->beta, bits + N, (size_t)N, dt, rng, -1.0, 1.0);
        rc = upload(g, &lp->dgamma, bits, (size_t)N * 2) ||
             upload(g, &lp->dbeta, bits + N, (size_t)N * 2);
    }
    free(bits);
    return rc;
}

static void free_lnparams(gpu *g, lnparams *lp) {
    free(lp->gamma);
    free(lp->beta);
    dfree(g, &lp->dgamma);
    dfree(g, &lp->dbeta);
}

static void launch_failed(const char *label, const stof_error *err) {
    n_runs++;
    printf("%-72s LAUNCH FAILED: %s\n", label, err->msg);
    CHECK_MSG(0, "%s: %s", label, err->msg);
    recap_add("%s: launch: %.160s", label, err->msg);
}

/* Launches a GEMM closing with a norm: gemm_ln, or gemm_epilogue's norm
 * build (the same tensors). */
static int launch_norm(gpu *g, const gemm_exec_plan *plan, const gemm_exec_ln_tensors *t,
                       stof_error *err) {
    if (plan->problem.tmpl == FUSION_T_GEMM_LN)
        return gemm_exec_gemm_ln(g->ctx, plan, t, 0, err);
    gemm_exec_gemm_tensors e = {.x = t->x, .w = t->w, .bias = t->bias, .residual = t->residual,
                                .y = t->y, .gamma = t->gamma, .beta = t->beta,
                                .pre_norm = t->pre_norm};
    return gemm_exec_gemm(g->ctx, plan, &e, 0, err);
}

/* One case of a GEMM closing with a norm (gemm_ln, or gemm_epilogue with
 * its activation before the residual) on a set (x, residual and x w^T of
 * the reference rows from make_set); dpre holds M x N. in_place: y is the
 * residual itself. */
static void run_ln(gpu *g, gset *s, const lnparams *lp, CUdeviceptr dpre,
                   const gemm_exec_problem *p, const int *values, int in_place) {
    const gweights *wt = s->wt;
    const int N = wt->N;
    const int ln = p->tmpl == FUSION_T_GEMM_LN;
    char label[200], split[16] = "";
    if (!ln)
        snprintf(split, sizeof split, " sk%d", values[5]);
    snprintf(label, sizeof label, "%s %s M=%d N=%d K=%d %s %s%s%s%s%s %dx%dx%d w%d s%d%s",
             ln ? "gemm_ln" : "gemm+norm", stof_dtype_name(wt->dt), s->M, N, wt->K,
             p->weight_kn ? "W[K,N]" : "W[N,K]", p->epi.has_bias ? "bias" : "-",
             act_label(p->epi.act),
             p->epi.has_residual ? (in_place ? "+add(in place)" : "+add") : "",
             p->epi.norm == FUSION_NORM_LAYERNORM ? "+layernorm" : "+rmsnorm",
             p->store_pre_norm ? "+pre" : "", values[0], values[1], values[2], values[3],
             values[4], split);
    gemm_exec_plan *plan = make_plan(g, p, values, label);
    if (!plan)
        return;
    const size_t mn = (size_t)s->M * N;
    gemm_exec_ln_tensors t = {.x = s->dx, .w = p->weight_kn ? wt->dw_kn : wt->dw_nk,
                              .bias = wt->db, .residual = in_place ? s->dy : s->dr,
                              .gamma = lp->dgamma, .beta = lp->dbeta, .y = s->dy,
                              .pre_norm = dpre};
    stof_error err = {0};
    int rc = in_place ? check_cu(g, g->drv->MemcpyHtoD(s->dy, s->res_bits, mn * 2),
                                 "cuMemcpyHtoD(y = residual)")
                      : poison(g, s->dy, mn);
    rc = rc || poison(g, dpre, mn);
    if (!rc && (rc = launch_norm(g, plan, &t, &err)) != STOF_OK)
        launch_failed(label, &err);
    double *pre = malloc((size_t)N * sizeof *pre), *y = malloc((size_t)N * sizeof *y);
    uint16_t *hpre = malloc(mn * 2);
    if (!rc && pre && y && hpre && !fetch(g, s->hy, s->dy, mn) &&
        (!p->store_pre_norm || !fetch(g, hpre, dpre, mn))) {
        verdict vy, vp;
        verdict_init(&vy);
        verdict_init(&vp);
        for (int i = 0; i < s->n_rows; i++) {
            const int r = s->rows[i];
            for (int n = 0; n < N; n++) {
                pre[n] = s->acc[(size_t)i * N + n];
                if (p->epi.has_bias)
                    pre[n] += wt->bias[n];
                pre[n] = act_ref(p->epi.act, pre[n]);
                if (p->epi.has_residual)
                    pre[n] += s->res[(size_t)r * N + n];
            }
            norm_ref(p->epi.norm, pre, N, lp->gamma, lp->beta, (double)p->eps, y);
            for (int n = 0; n < N; n++) {
                const size_t at = (size_t)r * N + n;
                verdict_add(&vy, from_bits(wt->dt, s->hy[at]), y[n], (long)at);
                if (p->store_pre_norm)
                    verdict_add(&vp, from_bits(wt->dt, hpre[at]), pre[n], (long)at);
            }
        }
        char where[160] = "";
        if (vy.first_bad >= 0)
            snprintf(where, sizeof where, "first bad: row %ld col %ld = %g", vy.first_bad / N,
                     vy.first_bad % N, from_bits(wt->dt, s->hy[vy.first_bad]));
        report(label, &vy, count_nonfinite(s->hy, mn, wt->dt), tol_of(wt->dt), where);
        if (p->store_pre_norm) {
            char lab[220];
            snprintf(lab, sizeof lab, "%s [pre_norm]", label);
            where[0] = '\0';
            if (vp.first_bad >= 0)
                snprintf(where, sizeof where, "first bad: row %ld col %ld = %g",
                         vp.first_bad / N, vp.first_bad % N,
                         from_bits(wt->dt, hpre[vp.first_bad]));
            report(lab, &vp, count_nonfinite(hpre, mn, wt->dt), tol_of(wt->dt), where);
        }
    }
    free(pre);
    free(y);
    free(hpre);
    gemm_exec_plan_free(g->ctx, plan);
}

/* run_ln's case, then (with_in_place, unless the GPU died) the same case
 * with a residual, written in place. */
static void run_ln_and_in_place(gpu *g, gset *s, const lnparams *lp, CUdeviceptr dpre,
                                gemm_exec_problem *p, const int *values, int with_in_place) {
    run_ln(g, s, lp, dpre, p, values, 0);
    if (with_in_place && !g->dead) {
        p->epi.has_residual = 1;
        run_ln(g, s, lp, dpre, p, values, 1);
    }
}

/* Every M x N x K of the lists, both dtypes, LN_VARIANTS cases each (the
 * norms with and without bias); weights scaled by sqrt(3 / K) so that x w^T,
 * the bias and the residual are of one size (a lost term shows). Then the
 * residual updated in place on one shape. */
static void test_gemm_ln(gpu *g, util_rng *rng) {
    for (int d = 0; d < 2 && !g->dead; d++)
        for (int ni = 0; ni < 3 && !g->dead; ni++) {
            const int N = ln_Ns[ni];
            lnparams lp;
            if (make_lnparams(g, &lp, N, test_dts[d], rng)) {
                free_lnparams(g, &lp);
                return;
            }
            for (int ki = 0; ki < 3 && !g->dead; ki++) {
                const int K = ln_Ks[ki];
                gweights wt;
                if (make_weights_scaled(g, &wt, N, K, test_dts[d], sqrt(3.0 / K), rng)) {
                    free_weights(g, &wt);
                    break;
                }
                for (int mi = 0; mi < 4 && !g->dead; mi++) {
                    gset s;
                    CUdeviceptr dpre = 0;
                    if (!make_set(g, &s, &wt, ln_Ms[mi], rng) &&
                        !dalloc(g, &dpre, (size_t)ln_Ms[mi] * N * 2))
                        for (int v = 0; v < LN_VARIANTS && !g->dead; v++) {
                            gemm_exec_problem p;
                            int values[FUSION_MAX_PARAMS];
                            ln_case(d, ni, ki, mi, v, &p, values);
                            run_ln_and_in_place(g, &s, &lp, dpre, &p, values,
                                                ki == 1 && mi == 2 && v == 0);
                        }
                    dfree(g, &dpre);
                    free_set(g, &s);
                }
                free_weights(g, &wt);
            }
            free_lnparams(g, &lp);
        }
}

/* ---- gemm_epilogue closing with a norm (the wgmma build's clusters) ---------------------- */

/* BLOCK_M, BLOCK_N, BLOCK_K, WARPS, STAGES, SPLIT_K: one warpgroup or two
 * (across or along N), K whole or split; clusters of N / BLOCK_N x SPLIT_K
 * blocks (a setting whose cluster N does not fit is passed over). */
static const int norm_settings[][6] = {
    {64, 128, 64, 4, 6, 2}, {64, 64, 64, 4, 6, 1},  {64, 256, 64, 8, 4, 4},
    {128, 128, 64, 8, 4, 1}, {64, 128, 64, 8, 6, 1}, {64, 256, 64, 4, 4, 2}};
#define N_NORM_SETTINGS 6
static const int norm_Ms[] = {1, 7, 128, 1000};
static const int norm_Ks[] = {768, 3072};

/* Case v of a shape of gemm_epilogue closing with a norm: layernorm and
 * rmsnorm, with bias but on v = 3, erf GELU before the residual on one case
 * in four, the residual, the pre-norm store and the dtype varying with the
 * shape; the first setting from a rotating start whose cluster fits N. */
static void norm_case(int ni, int ki, int mi, int v, gemm_exec_problem *p, int *values) {
    *p = (gemm_exec_problem){.tmpl = FUSION_T_GEMM_EPILOGUE, .dtype = test_dts[(ni + ki) % 2],
                             .m = norm_Ms[mi], .n = ln_Ns[ni], .k = norm_Ks[ki]};
    p->epi.norm = v & 1 ? FUSION_NORM_RMSNORM : FUSION_NORM_LAYERNORM;
    p->epi.has_bias = v != 3;
    p->epi.act = (mi + v) % 4 == 2 ? FUSION_ACT_GELU : FUSION_ACT_NONE;
    p->epi.has_residual = (mi + ki + v) % 4 != 3;
    p->store_pre_norm = (ni + mi + v) % 2;
    p->eps = v & 1 ? 1e-6f : 1e-5f;
    memset(values, 0, FUSION_MAX_PARAMS * sizeof *values);
    for (int i = 0; i < N_NORM_SETTINGS; i++) {
        memcpy(values, norm_settings[(ni + 2 * ki + 3 * mi + v + i) % N_NORM_SETTINGS],
               sizeof norm_settings[0]);
        stof_error err = {0};
        if (gemm_exec_check(p, values, 227 * 1024, &err) == STOF_OK)
            return;
    }
}

/* gemm_epilogue's norm on sm_90 only (elsewhere the plan refuses it, which
 * test_gemm_compile checks): every M of norm_Ms, N of the gemm_ln lists and
 * K of norm_Ks, four cases each (norm_case); then the residual updated in
 * place. Same weights, sets and tolerances as gemm_ln. */
static void test_gemm_norm(gpu *g, util_rng *rng) {
    if (!device_wgmma_arch(g->ctx->arch)) {
        printf("%-72s skipped: the norm build runs on sm_90 (this is %s)\n", "gemm+norm",
               g->ctx->arch);
        return;
    }
    for (int ni = 0; ni < 3 && !g->dead; ni++)
        for (int ki = 0; ki < 2 && !g->dead; ki++) {
            const int N = ln_Ns[ni], K = norm_Ks[ki];
            const stof_dtype dt = test_dts[(ni + ki) % 2];
            lnparams lp;
            gweights wt;
            int bad = make_lnparams(g, &lp, N, dt, rng);
            bad = bad || make_weights_scaled(g, &wt, N, K, dt, sqrt(3.0 / K), rng);
            for (int mi = 0; mi < 4 && !bad && !g->dead; mi++) {
                gset s;
                CUdeviceptr dpre = 0;
                if (!make_set(g, &s, &wt, norm_Ms[mi], rng) &&
                    !dalloc(g, &dpre, (size_t)norm_Ms[mi] * N * 2))
                    for (int v = 0; v < 4 && !g->dead; v++) {
                        gemm_exec_problem p;
                        int values[FUSION_MAX_PARAMS];
                        norm_case(ni, ki, mi, v, &p, values);
                        run_ln_and_in_place(g, &s, &lp, dpre, &p, values, mi == 2 && v == 0);
                    }
                dfree(g, &dpre);
                free_set(g, &s);
            }
            free_weights(g, &wt);
            free_lnparams(g, &lp);
        }
}

/* ---- gemm_chain ---------------------------------------------------------------------------- */

/* K, F, N2 (the FFN of BERT-base, of a 512-wide model, and one with K != N2) */
static const int chain_shapes[][3] = {{768, 3072, 768}, {512, 2048, 512}, {1024, 2048, 768}};
static const int chain_Ms[] = {1, 16, 100, 512};
/* BLOCK_M, BLOCK_F, BLOCK_K, WARPS, STAGES. The last (64 rows of N2 over 8
 * warps) stays within the accumulator budget for N2 = 512 only. */
static const int chain_settings[][5] = {
    {16, 128, 64, 8, 3}, {32, 64, 32, 8, 2}, {16, 64, 32, 4, 3}, {64, 128, 64, 8, 2}};
#define CHAIN_VARIANTS 8

/* Case v of a shape: v picks the activation (bits 0-1: none, gelu,
 * gelu_tanh, relu) and the residual (bit 2); the biases, the weight layout
 * and the setting rotate with the shape. */
static void chain_case(int d, int si, int mi, int v, gemm_exec_problem *p, int *values) {
    memset(p, 0, sizeof *p);
    p->tmpl = FUSION_T_GEMM_CHAIN;
    p->dtype = test_dts[d];
    p->m = chain_Ms[mi];
    p->k = chain_shapes[si][0];
    p->n = chain_shapes[si][1];
    p->n2 = chain_shapes[si][2];
    p->epi.act = (fusion_act)(v & 3);
    p->epi.has_bias = (mi + v) % 4 != 0;
    p->epi2.has_bias = (mi + v + si) % 3 != 1;
    p->epi2.has_residual = (v >> 2) & 1;
    p->weight_kn = (si + mi + v) % 5 == 4;
    const int n_settings = p->n2 <= 512 ? 4 : 3;
    memset(values, 0, FUSION_MAX_PARAMS * sizeof *values);
    memcpy(values, chain_settings[(mi + v + 2 * si) % n_settings], sizeof chain_settings[0]);
}

/* One input set of a chain: x [M, K], the residual [M, N2], y, and the raw
 * x w1^T (fp64) of the reference rows. */
typedef struct cset {
    const gweights *w1, *w2;
    int M;
    float *res;
    uint16_t *res_bits, *hy;
    int n_rows, rows[MAX_REF_ROWS];
    double *raw; /* [n_rows][F] */
    CUdeviceptr dx, dr, dy;
} cset;

static int make_cset(gpu *g, cset *s, const gweights *w1, const gweights *w2, int M,
                     util_rng *rng) {
    memset(s, 0, sizeof *s);
    s->w1 = w1;
    s->w2 = w2;
    s->M = M;
    const int K = w1->K, F = w1->N, N2 = w2->N;
    const size_t mk = (size_t)M * K, mn = (size_t)M * N2;
    float *x = malloc(mk * sizeof *x);
    uint16_t *xb = malloc(mk * 2);
    s->res = malloc(mn * sizeof *s->res);
    s->res_bits = malloc(mn * 2);
    s->hy = malloc(mn * 2);
    s->raw = malloc((size_t)MAX_REF_ROWS * F * sizeof *s->raw);
    int rc = -1;
    if (x && xb && s->res && s->res_bits && s->hy && s->raw) {
        fill(x, xb, mk, w1->dt, rng, -1.0, 1.0);
        fill(s->res, s->res_bits, mn, w1->dt, rng, -1.0, 1.0);
        gset picker = {.M = M};
        pick_rows(&picker, rng);
        s->n_rows = picker.n_rows;
        memcpy(s->rows, picker.rows, sizeof s->rows);
        for (int i = 0; i < s->n_rows; i++) {
            const float *xr = x + (size_t)s->rows[i] * K;
            for (int f = 0; f < F; f++) {
                const float *wr = w1->w + (size_t)f * K;
                double sum = 0.0;
                for (int k = 0; k < K; k++)
                    sum += (double)xr[k] * wr[k];
                s->raw[(size_t)i * F + f] = sum;
            }
        }
        rc = upload(g, &s->dx, xb, mk * 2) || upload(g, &s->dr, s->res_bits, mn * 2) ||
             dalloc(g, &s->dy, mn * 2);
    }
    free(x);
    free(xb);
    return rc;
}

static void free_cset(gpu *g, cset *s) {
    free(s->res);
    free(s->res_bits);
    free(s->hy);
    free(s->raw);
    dfree(g, &s->dx);
    dfree(g, &s->dr);
    dfree(g, &s->dy);
}

static void run_chain(gpu *g, cset *s, const gemm_exec_problem *p, const int *values,
                      int in_place) {
    const gweights *w1 = s->w1, *w2 = s->w2;
    const int F = w1->N, N2 = w2->N;
    char label[200];
    snprintf(label, sizeof label,
             "gemm_chain %s M=%d K=%d F=%d N=%d %s %s%s | %s%s %dx%dx%d w%d s%d",
             stof_dtype_name(w1->dt), s->M, w1->K, F, N2, p->weight_kn ? "W[K,N]" : "W[N,K]",
             p->epi.has_bias ? "bias" : "-", act_label(p->epi.act),
             p->epi2.has_bias ? "bias" : "-",
             p->epi2.has_residual ? (in_place ? "+add(in place)" : "+add") : "", values[0],
             values[1], values[2], values[3], values[4]);
    gemm_exec_plan *plan = make_plan(g, p, values, label);
    if (!plan)
        return;
    const size_t mn = (size_t)s->M * N2;
    gemm_exec_chain_tensors t = {.x = s->dx, .w1 = p->weight_kn ? w1->dw_kn : w1->dw_nk,
                                 .b1 = w1->db, .w2 = p->weight_kn ? w2->dw_kn : w2->dw_nk,
                                 .b2 = w2->db, .residual = in_place ? s->dy : s->dr,
                                 .y = s->dy};
    stof_error err = {0};
    int rc = in_place ? check_cu(g, g->drv->MemcpyHtoD(s->dy, s->res_bits, mn * 2),
                                 "cuMemcpyHtoD(y = residual)")
                      : poison(g, s->dy, mn);
    if (!rc && (rc = gemm_exec_gemm_chain(g->ctx, plan, &t, 0, &err)) != STOF_OK)
        launch_failed(label, &err);
    double *h = malloc((size_t)F * sizeof *h);
    if (!rc && h && !fetch(g, s->hy, s->dy, mn)) {
        verdict v;
        verdict_init(&v);
        for (int i = 0; i < s->n_rows; i++) {
            const int r = s->rows[i];
            for (int f = 0; f < F; f++)
                h[f] = act_ref(p->epi.act, s->raw[(size_t)i * F + f] +
                                               (p->epi.has_bias ? w1->bias[f] : 0.0));
            for (int n = 0; n < N2; n++) {
                const float *wr = w2->w + (size_t)n * F;
                double ref = 0.0;
                for (int f = 0; f < F; f++)
                    ref += h[f] * wr[f];
                if (p->epi2.has_bias)
                    ref += w2->bias[n];
                if (p->epi2.has_residual)
                    ref += s->res[(size_t)r * N2 + n];
                verdict_add(&v, from_bits(w1->dt, s->hy[(size_t)r * N2 + n]), ref,
                            (long)r * N2 + n);
            }
        }
        char where[160] = "";
        if (v.first_bad >= 0)
            snprintf(where, sizeof where, "first bad: row %ld col %ld = %g", v.first_bad / N2,
                     v.first_bad % N2, from_bits(w1->dt, s->hy[v.first_bad]));
        report(label, &v, count_nonfinite(s->hy, mn, w1->dt), tol_of(w1->dt), where);
    }
    free(h);
    gemm_exec_plan_free(g->ctx, plan);
}

/* Both weights scaled so that the pre-activation and y have unit-order
 * spread: w1 in +-3 / sqrt(K) (x w1^T of variance ~1, where the
 * activations differ), w2 in +-sqrt(3 / F). */
static int make_chain_weights(gpu *g, gweights *w1, gweights *w2, int si, stof_dtype dt,
                              util_rng *rng) {
    const int K = chain_shapes[si][0], F = chain_shapes[si][1], N2 = chain_shapes[si][2];
    int rc = make_weights_scaled(g, w1, F, K, dt, 3.0 / sqrt((double)K), rng);
    if (rc) {
        memset(w2, 0, sizeof *w2);
        return rc;
    }
    return make_weights_scaled(g, w2, N2, F, dt, sqrt(3.0 / F), rng);
}

/* Every M x shape, both dtypes, CHAIN_VARIANTS cases each (all activations
 * with and without the residual); then y updated in place on one shape. */
static void test_gemm_chain(gpu *g, util_rng *rng) {
    for (int d = 0; d < 2 && !g->dead; d++)
        for (int si = 0; si < 3 && !g->dead; si++) {
            gweights w1, w2;
            if (make_chain_weights(g, &w1, &w2, si, test_dts[d], rng)) {
                free_weights(g, &w1);
                free_weights(g, &w2);
                return;
            }
            for (int mi = 0; mi < 4 && !g->dead; mi++) {
                cset s;
                if (!make_cset(g, &s, &w1, &w2, chain_Ms[mi], rng))
                    for (int v = 0; v < CHAIN_VARIANTS && !g->dead; v++) {
                        gemm_exec_problem p;
                        int values[FUSION_MAX_PARAMS];
                        chain_case(d, si, mi, v, &p, values);
                        run_chain(g, &s, &p, values, 0);
                        if (si == 0 && mi == 2 && v == 5 && !g->dead)
                            run_chain(g, &s, &p, values, 1);
                    }
                free_cset(g, &s);
            }
            free_weights(g, &w1);
            free_weights(g, &w2);
        }
}

/* ---- mi_chain ------------------------------------------------------------------------------- */

typedef struct chain {
    const char *name;
    int bias, res;
    fusion_act act;
    fusion_norm norm;
    int pre;
} chain;

static const chain chains[] = {
    {"bias+add+layernorm", 1, 1, FUSION_ACT_NONE, FUSION_NORM_LAYERNORM, 0},
    {"add+layernorm", 0, 1, FUSION_ACT_NONE, FUSION_NORM_LAYERNORM, 0},
    {"add+rmsnorm", 0, 1, FUSION_ACT_NONE, FUSION_NORM_RMSNORM, 0},
    {"gelu", 0, 0, FUSION_ACT_GELU, FUSION_NORM_NONE, 0},
    {"add+layernorm+pre_norm", 0, 1, FUSION_ACT_NONE, FUSION_NORM_LAYERNORM, 1},
    {"add+rmsnorm+pre_norm", 0, 1, FUSION_ACT_NONE, FUSION_NORM_RMSNORM, 1},
    {"bias+gelu_tanh", 1, 0, FUSION_ACT_GELU_TANH, FUSION_NORM_NONE, 0},
    {"add+relu", 0, 1, FUSION_ACT_RELU, FUSION_NORM_NONE, 0},
};
#define N_CHAINS ((int)(sizeof chains / sizeof chains[0]))

/* ROWS, THREADS, VEC: a warp a row, a block of 8 warps a row, 16 threads a row */
static const int mi_settings[][3] = {{4, 128, 8}, {1, 256, 8}, {8, 128, 2}};
#define N_MI_SETTINGS 3

/* The chain's reference: pre[r][n] (s before the norm) and y. */
static void mi_reference(const chain *c, int rows, int N, const float *x, const float *bias,
                         const float *res, const float *gamma, const float *beta, double eps,
                         double *pre, double *y) {
    for (int r = 0; r < rows; r++) {
        double *s = pre + (size_t)r * N, *out = y + (size_t)r * N;
        for (int n = 0; n < N; n++) {
            double v = x[(size_t)r * N + n];
            if (c->bias)
                v += bias[n];
            if (c->res)
                v += res[(size_t)r * N + n];
            s[n] = act_ref(c->act, v);
        }
        if (c->norm == FUSION_NORM_NONE)
            memcpy(out, s, (size_t)N * sizeof *out);
        else
            norm_ref(c->norm, s, N, gamma, beta, eps, out);
    }
}

static void run_mi(gpu *g, const chain *c, int setting, stof_dtype dt, int rows, int N,
                   const CUdeviceptr *in, CUdeviceptr dy, CUdeviceptr dpre, const double *pre,
                   const double *y, uint16_t *host) {
    char label[160];
    snprintf(label, sizeof label, "mi_chain %s rows=%d N=%d %s ROWS=%d THREADS=%d VEC=%d",
             stof_dtype_name(dt), rows, N, c->name, mi_settings[setting][0],
             mi_settings[setting][1], mi_settings[setting][2]);
    float eps = c->norm == FUSION_NORM_RMSNORM ? 1e-6f : 1e-5f;
    gemm_exec_problem p = {.tmpl = FUSION_T_MI_CHAIN, .dtype = dt, .m = rows, .n = N,
                           .epi = {c->bias, c->act, c->res, c->norm}, .store_pre_norm = c->pre,
                           .eps = eps};
    gemm_exec_plan *plan = make_plan(g, &p, mi_settings[setting], label);
    if (!plan)
        return;
    size_t mn = (size_t)rows * N;
    gemm_exec_mi_tensors t = {.x = in[0], .bias = in[1], .residual = in[2], .gamma = in[3],
                              .beta = in[4], .y = dy, .pre_norm = dpre};
    stof_error err = {0};
    int rc = poison(g, dy, mn) || poison(g, dpre, mn);
    if (!rc && (rc = gemm_exec_mi_chain(g->ctx, plan, &t, 0, &err)) != STOF_OK) {
        n_runs++;
        printf("%-72s LAUNCH FAILED: %s\n", label, err.msg);
        CHECK_MSG(0, "%s: %s", label, err.msg);
        recap_add("%s: launch: %.160s", label, err.msg);
    }
    for (int pass = 0; pass < (c->pre ? 2 : 1) && !rc; pass++) {
        if (fetch(g, host, pass ? dpre : dy, mn))
            break;
        const double *ref = pass ? pre : y;
        verdict v;
        verdict_init(&v);
        for (size_t i = 0; i < mn; i++)
            verdict_add(&v, from_bits(dt, host[i]), ref[i], (long)i);
        char where[160] = "", lab[200];
        if (v.first_bad >= 0)
            snprintf(where, sizeof where, "first bad: row %ld col %ld = %g, ref %g",
                     v.first_bad / N, v.first_bad % N, from_bits(dt, host[v.first_bad]),
                     ref[v.first_bad]);
        snprintf(lab, sizeof lab, "%s%s", label, pass ? " [pre_norm]" : "");
        report(lab, &v, count_nonfinite(host, mn, dt), tol_of(dt), where);
    }
    gemm_exec_plan_free(g->ctx, plan);
}

static void test_mi_chain(gpu *g, util_rng *rng) {
    static const int Ns[] = {512, 768, 1024};
    static const int Rs[] = {7, 1000};
    static const stof_dtype dts[] = {STOF_F16, STOF_BF16};
    for (int d = 0; d < 2 && !g->dead; d++)
        for (int ni = 0; ni < 3 && !g->dead; ni++)
            for (int ri = 0; ri < 2 && !g->dead; ri++) {
                const int N = Ns[ni], rows = Rs[ri];
                const size_t mn = (size_t)rows * N;
                const stof_dtype dt = dts[d];
                float *x = malloc(mn * 4), *res = malloc(mn * 4), *vec = malloc((size_t)N * 12);
                uint16_t *xb = malloc(mn * 2), *rb = malloc(mn * 2), *vb = malloc((size_t)N * 6);
                uint16_t *host = malloc(mn * 2);
                double *pre = malloc(mn * sizeof *pre), *y = malloc(mn * sizeof *y);
                CUdeviceptr in[5] = {0}, dy = 0, dpre = 0;
                if (x && res && vec && xb && rb && vb && host && pre && y) {
                    float *bias = vec, *gamma = vec + N, *beta = vec + 2 * N;
                    fill(x, xb, mn, dt, rng, -2.0, 2.0);
                    fill(res, rb, mn, dt, rng, -2.0, 2.0);
                    fill(bias, vb, (size_t)N, dt, rng, -1.0, 1.0);
                    fill(gamma, vb + N, (size_t)N, dt, rng, 0.5, 1.5);
                    fill(beta, vb + 2 * N, (size_t)N, dt, rng, -1.0, 1.0);
                    if (!upload(g, &in[0], xb, mn * 2) && !upload(g, &in[1], vb, (size_t)N * 2) &&
                        !upload(g, &in[2], rb, mn * 2) &&
                        !upload(g, &in[3], vb + N, (size_t)N * 2) &&
                        !upload(g, &in[4], vb + 2 * N, (size_t)N * 2) &&
                        !dalloc(g, &dy, mn * 2) && !dalloc(g, &dpre, mn * 2))
                        for (int c = 0; c < N_CHAINS && !g->dead; c++) {
                            double eps = chains[c].norm == FUSION_NORM_RMSNORM ? 1e-6 : 1e-5;
                            mi_reference(&chains[c], rows, N, x, bias, res, gamma, beta,
                                         (double)(float)eps, pre, y);
                            for (int s = 0; s < N_MI_SETTINGS && !g->dead; s++)
                                run_mi(g, &chains[c], s, dt, rows, N, in, dy, dpre, pre, y,
                                       host);
                        }
                }
                for (int i = 0; i < 5; i++)
                    dfree(g, &in[i]);
                dfree(g, &dy);
                dfree(g, &dpre);
                free(x);
                free(res);
                free(vec);
                free(xb);
                free(rb);
                free(vb);
                free(host);
                free(pre);
                free(y);
            }
}

/* ---- mi_chain over an fp32 residual stream ------------------------------------------------ */

/* The chains of a pre-norm model whose residual stream is fp32 (GEMM_F32_*): x and res's roles,
 * the stored norm input and y each fp32 or the dtype. */
typedef struct stream_chain {
    const char *name;
    int res;
    fusion_norm norm;
    int pre;
    unsigned f32;
} stream_chain;

static const stream_chain streams[] = {
    {"stream+add+layernorm, stream stored", 1, FUSION_NORM_LAYERNORM, 1,
     GEMM_F32_X | GEMM_F32_PRE_NORM},
    {"stream+add -> stream", 1, FUSION_NORM_NONE, 0, GEMM_F32_X | GEMM_F32_Y},
    {"add -> stream", 1, FUSION_NORM_NONE, 0, GEMM_F32_Y},
    {"layernorm of the stream", 0, FUSION_NORM_LAYERNORM, 0, GEMM_F32_X},
    {"add+stream+rmsnorm, stream stored", 1, FUSION_NORM_RMSNORM, 1,
     GEMM_F32_RESIDUAL | GEMM_F32_PRE_NORM},
};

/* n values for a tensor of role `f32`: fp32 ones off the dtype's grid (what a stream holds),
 * else rounded to dt; x gets the values the kernel reads, dev the upload. */
static int stream_values(gpu *g, int f32, float *x, uint16_t *bits, size_t n, stof_dtype dt,
                         util_rng *rng, CUdeviceptr *dev) {
    fill(x, bits, n, dt, rng, -2.0, 2.0);
    if (!f32)
        return upload(g, dev, bits, n * 2);
    for (size_t i = 0; i < n; i++)
        x[i] += (float)((util_rng_double(rng) - 0.5) * 0.01);
    return upload(g, dev, x, n * 4);
}

/* An output checked against the reference: fp32 (bound 1e-5) or dt. */
static void stream_judge(gpu *g, const char *label, CUdeviceptr d, int f32, stof_dtype dt,
                         size_t mn, int N, const double *ref, void *host) {
    if (fetch(g, host, d, f32 ? 2 * mn : mn))
        return;
    verdict v;
    verdict_init(&v);
    long bad = 0;
    for (size_t i = 0; i < mn; i++) {
        const float y = f32 ? ((float *)host)[i] : from_bits(dt, ((uint16_t *)host)[i]);
        bad += !isfinite(y);
        verdict_add(&v, y, ref[i], (long)i);
    }
    char where[160] = "";
    if (v.first_bad >= 0)
        snprintf(where, sizeof where, "first bad: row %ld col %ld, ref %g", v.first_bad / N,
                 v.first_bad % N, ref[v.first_bad]);
    report(label, &v, bad, f32 ? 1e-5 : tol_of(dt), where);
}

static void run_stream(gpu *g, const stream_chain *c, int setting, stof_dtype dt, int rows,
                       int N, CUdeviceptr dx, CUdeviceptr dres, const CUdeviceptr *dvec,
                       CUdeviceptr dy, CUdeviceptr dpre, const double *pre, const double *y,
                       void *host) {
    char label[200];
    snprintf(label, sizeof label, "mi_chain %s rows=%d N=%d %s ROWS=%d THREADS=%d VEC=%d",
             stof_dtype_name(dt), rows, N, c->name, mi_settings[setting][0],
             mi_settings[setting][1], mi_settings[setting][2]);
    gemm_exec_problem p = {.tmpl = FUSION_T_MI_CHAIN, .dtype = dt, .m = rows, .n = N,
                           .epi = {0, FUSION_ACT_NONE, c->res, c->norm},
                           .store_pre_norm = c->pre, .eps = 1e-5f, .f32 = c->f32};
    gemm_exec_plan *plan = make_plan(g, &p, mi_settings[setting], label);
    if (!plan)
        return;
    size_t mn = (size_t)rows * N;
    gemm_exec_mi_tensors t = {.x = dx, .residual = dres, .gamma = dvec[0], .beta = dvec[1],
                              .y = dy, .pre_norm = dpre};
    stof_error err = {0};
    int rc = poison(g, dy, 2 * mn) || poison(g, dpre, 2 * mn);
    if (!rc && (rc = gemm_exec_mi_chain(g->ctx, plan, &t, 0, &err)) != STOF_OK) {
        n_runs++;
        CHECK_MSG(0, "%s: %s", label, err.msg);
        recap_add("%s: launch: %.160s", label, err.msg);
    }
    if (!rc)
        stream_judge(g, label, dy, (c->f32 & GEMM_F32_Y) != 0, dt, mn, N, y, host);
    if (!rc && c->pre) {
        char lab[220];
        snprintf(lab, sizeof lab, "%s [pre_norm]", label);
        stream_judge(g, lab, dpre, (c->f32 & GEMM_F32_PRE_NORM) != 0, dt, mn, N, pre, host);
    }
    gemm_exec_plan_free(g->ctx, plan);
}

/* mi_chain with an fp32 residual stream: each chain, both dtypes, rows of 768 and 1000 (a
 * partial last chunk at VEC 8 over a warp), 7 and 1000 rows, the three thread layouts; fresh
 * values for each, the outputs poisoned first. */
static void test_mi_stream(gpu *g, util_rng *rng) {
    static const int Ns[] = {768, 1000};
    static const int Rs[] = {7, 1000};
    static const stof_dtype dts[] = {STOF_F16, STOF_BF16};
    const int n_streams = (int)(sizeof streams / sizeof streams[0]);
    for (int d = 0; d < 2 && !g->dead; d++)
        for (int ni = 0; ni < 2 && !g->dead; ni++)
            for (int ri = 0; ri < 2 && !g->dead; ri++)
                for (int c = 0; c < n_streams && !g->dead; c++) {
                    const stream_chain *sc = &streams[c];
                    const int N = Ns[ni], rows = Rs[ri];
                    const size_t mn = (size_t)rows * N;
                    const stof_dtype dt = dts[d];
                    float *x = malloc(mn * 4), *res = malloc(mn * 4), *vec = malloc(N * 8u);
                    uint16_t *bits = malloc(mn * 2), *vb = malloc(N * 4u);
                    void *host = malloc(mn * 4);
                    double *pre = malloc(mn * sizeof *pre), *y = malloc(mn * sizeof *y);
                    CUdeviceptr dx = 0, dres = 0, dvec[2] = {0, 0}, dy = 0, dpre = 0;
                    if (x && res && vec && bits && vb && host && pre && y &&
                        !stream_values(g, sc->f32 & GEMM_F32_X, x, bits, mn, dt, rng, &dx) &&
                        !stream_values(g, sc->f32 & GEMM_F32_RESIDUAL, res, bits, mn, dt, rng,
                                       &dres)) {
                        fill(vec, vb, (size_t)N, dt, rng, 0.5, 1.5);
                        fill(vec + N, vb + N, (size_t)N, dt, rng, -1.0, 1.0);
                        const chain ref = {sc->name, 0, sc->res, FUSION_ACT_NONE, sc->norm,
                                           sc->pre};
                        mi_reference(&ref, rows, N, x, NULL, res, vec, vec + N,
                                     (double)1e-5f, pre, y);
                        if (!upload(g, &dvec[0], vb, N * 2u) &&
                            !upload(g, &dvec[1], vb + N, N * 2u) && !dalloc(g, &dy, mn * 4) &&
                            !dalloc(g, &dpre, mn * 4))
                            for (int s = 0; s < N_MI_SETTINGS && !g->dead; s++)
                                run_stream(g, sc, s, dt, rows, N, dx, dres, dvec, dy, dpre, pre,
                                           y, host);
                    }
                    dfree(g, &dx);
                    dfree(g, &dres);
                    dfree(g, &dvec[0]);
                    dfree(g, &dvec[1]);
                    dfree(g, &dy);
                    dfree(g, &dpre);
                    free(x);
                    free(res);
                    free(vec);
                    free(bits);
                    free(vb);
                    free(host);
                    free(pre);
                    free(y);
                }
}

/* ---- embedding ------------------------------------------------------------------------------ */

#define EMB_BATCH 2
#define EMB_SEQ 128
#define EMB_VOCAB 1000
#define EMB_MAX_POS 512

/* bad: plant two out-of-range ids and expect zero rows and the error;
 * has_type 2: a type row per token (type ids 0 and 1). */
static void run_embedding(gpu *g, stof_dtype dt, int width, int has_pos, int has_type, int bad,
                          util_rng *rng) {
    const int tokens = EMB_BATCH * EMB_SEQ;
    char label[160];
    snprintf(label, sizeof label, "embedding %s B=%d S=%d width=%d%s%s%s", stof_dtype_name(dt),
             EMB_BATCH, EMB_SEQ, width, has_pos ? " +pos" : "",
             has_type == 2 ? " +type ids" : has_type ? " +type" : "", bad ? " (bad ids)" : "");
    gemm_exec_problem p = {.tmpl = FUSION_T_EMBEDDING, .dtype = dt, .m = tokens, .n = width,
                           .seq_len = EMB_SEQ, .vocab = EMB_VOCAB, .has_position = has_pos,
                           .has_type = has_type != 0, .has_type_ids = has_type == 2,
                           .type_vocab = 2};
    gemm_exec_plan *plan = make_plan(g, &p, NULL, label);
    if (!plan)
        return;
    size_t nw = (size_t)EMB_VOCAB * width, np = (size_t)EMB_MAX_POS * width, nt = 2 * width;
    size_t no = (size_t)tokens * width;
    float *w = malloc(nw * 4), *pos = malloc(np * 4), *type = malloc(nt * 4);
    uint16_t *wb = malloc(nw * 2), *pb = malloc(np * 2), *tb = malloc(nt * 2);
    uint16_t *host = malloc(no * 2);
    int32_t ids[EMB_BATCH * EMB_SEQ], types[EMB_BATCH * EMB_SEQ];
    CUdeviceptr did = 0, dw = 0, dp = 0, dt_ = 0, dout = 0, dtid = 0;
    const int bad_a = 5, bad_b = 200;
    if (w && pos && type && wb && pb && tb && host) {
        fill(w, wb, nw, dt, rng, -1.0, 1.0);
        fill(pos, pb, np, dt, rng, -1.0, 1.0);
        fill(type, tb, nt, dt, rng, -1.0, 1.0);
        for (int i = 0; i < tokens; i++) {
            ids[i] = (int32_t)(util_rng_double(rng) * EMB_VOCAB);
            types[i] = has_type == 2 && i % EMB_SEQ >= EMB_SEQ / 3; /* a second segment */
        }
        ids[tokens - 1] = EMB_VOCAB - 1; /* the last row of the table */
        if (bad) {
            ids[bad_a] = EMB_VOCAB + 3;
            ids[bad_b] = -1;
        }
        stof_error err = {0};
        gemm_exec_embed_tensors t;
        int rc = upload(g, &did, ids, sizeof ids) || upload(g, &dw, wb, nw * 2) ||
                 upload(g, &dp, pb, np * 2) || upload(g, &dt_, tb, nt * 2) ||
                 upload(g, &dtid, types, sizeof types) || dalloc(g, &dout, no * 2) ||
                 poison(g, dout, no);
        t = (gemm_exec_embed_tensors){.ids = did, .word = dw, .pos = dp, .type = dt_,
                                      .type_ids = dtid, .out = dout};
        if (!rc && (rc = gemm_exec_embedding(g->ctx, plan, &t, 0, &err)) != STOF_OK) {
            n_runs++;
            printf("%-72s LAUNCH FAILED: %s\n", label, err.msg);
            CHECK_MSG(0, "%s: %s", label, err.msg);
            recap_add("%s: launch: %.160s", label, err.msg);
        }
        if (!rc && !fetch(g, host, dout, no)) {
            verdict v;
            verdict_init(&v);
            for (int i = 0; i < tokens; i++) {
                int zero = ids[i] < 0 || ids[i] >= EMB_VOCAB;
                for (int n = 0; n < width; n++) {
                    double ref = 0.0;
                    if (!zero) {
                        ref = w[(size_t)ids[i] * width + n];
                        if (has_type)
                            ref += type[(size_t)types[i] * width + n];
                        if (has_pos)
                            ref += pos[(size_t)(i % EMB_SEQ) * width + n];
                    }
                    float out = from_bits(dt, host[(size_t)i * width + n]);
                    verdict_add(&v, out, ref, (long)i * width + n);
                    if (zero && out != 0.0f)
                        v.nonfinite++; /* a bad id's row must be exactly zero */
                }
            }
            int64_t bad_token = -1;
            int src = gemm_exec_embedding_status(g->ctx, plan, did, dtid, 0, &bad_token, &err);
            if (bad) {
                CHECK_MSG(src == STOF_ERR_INVALID && (bad_token == bad_a || bad_token == bad_b),
                          "%s: status %d, bad token %lld: %s", label, src, (long long)bad_token,
                          err.msg);
                if (src == STOF_ERR_INVALID)
                    printf("    reported: %s\n", err.msg);
                src = gemm_exec_embedding_status(g->ctx, plan, did, dtid, 0, &bad_token, &err);
                CHECK_MSG(src == STOF_OK, "%s: the flag was not cleared: %s", label, err.msg);
            } else {
                CHECK_MSG(src == STOF_OK, "%s: status: %s", label, err.msg);
            }
            report(label, &v, count_nonfinite(host, no, dt), tol_of(dt), "");
        }
    }
    dfree(g, &did);
    dfree(g, &dw);
    dfree(g, &dp);
    dfree(g, &dt_);
    dfree(g, &dtid);
    dfree(g, &dout);
    free(w);
    free(pos);
    free(type);
    free(wb);
    free(pb);
    free(tb);
    free(host);
    gemm_exec_plan_free(g->ctx, plan);
}

static void test_embedding(gpu *g, util_rng *rng) {
    static const stof_dtype dts[] = {STOF_F16, STOF_BF16};
    static const int widths[] = {768, 100};
    for (int d = 0; d < 2 && !g->dead; d++) {
        for (int wi = 0; wi < 2 && !g->dead; wi++)
            for (int pos = 0; pos < 2 && !g->dead; pos++)
                for (int type = 0; type < 3 && !g->dead; type++)
                    run_embedding(g, dts[d], widths[wi], pos, type, 0, rng);
        if (!g->dead)
            run_embedding(g, dts[d], 768, 1, 1, 1, rng);
    }
}

/* ---- glu and rotary --------------------------------------------------------------------------- */

static double glu_act_ref(int act, double v) {
    if (act == STOF_ACT_SILU)
        return v / (1.0 + exp(-v));
    if (act == STOF_ACT_GELU_TANH)
        return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    return 0.5 * v * (1.0 + erf(v * 0.7071067811865476));
}

/* The reference of one output element of problem p from input x (fp32, the
 * device's rounded inputs), in double. */
static double xy_reference(const gemm_exec_problem *p, const float *x, const int32_t *mask,
                           int64_t r, int64_t n) {
    if (p->tmpl == FUSION_T_MASK_ROWS)
        return mask[r] ? x[r * p->n + n] : 0.0;
    if (p->tmpl == FUSION_T_GLU)
        return glu_act_ref(p->glu_act, x[r * 2 * p->n + n]) * x[r * 2 * p->n + p->n + n];
    const float *row = x + r * p->n;
    int d = p->head_dim, half = d / 2;
    if (n >= (int64_t)(p->heads + p->kv_heads) * d)
        return row[n];
    int64_t head = n / d * d;
    int j = (int)(n % d), pair = j % half;
    double angle = (double)(r % p->seq_len) * pow(p->theta, -2.0 * pair / d);
    double a = row[head + pair], b = row[head + pair + half];
    return j < half ? a * cos(angle) - b * sin(angle) : b * cos(angle) + a * sin(angle);
}


/* One glu, rotary or mask_rows problem at one setting (NULL: the
 * default): fresh inputs (mask_rows: every third row padded, and the
 * last), the output poisoned, every element checked. */
static void run_xy(gpu *g, const gemm_exec_problem *p, const int *values, const char *label,
                   util_rng *rng) {
    gemm_exec_plan *plan = make_plan(g, p, values, label);
    if (!plan)
        return;
    size_t nx = (size_t)(p->m * p->n * (p->tmpl == FUSION_T_GLU ? 2 : 1)), ny = (size_t)(p->m * p->n);
    float *x = malloc(nx * 4);
    uint16_t *xb = malloc(nx * 2), *host = malloc(ny * 2);
    int32_t *mask = malloc((size_t)p->m * sizeof *mask);
    CUdeviceptr dx = 0, dy = 0, dm = 0;
    stof_error err = {0};
    if (x && xb && host && mask) {
        fill(x, xb, nx, p->dtype, rng, -3.0, 3.0);
        for (int64_t r = 0; r < p->m; r++)
            mask[r] = r % 3 != 1 && r != p->m - 1;
        gemm_exec_xy_tensors t = {0};
        int rc = upload(g, &dx, xb, nx * 2) || dalloc(g, &dy, ny * 2) || poison(g, dy, ny) ||
                 upload(g, &dm, mask, (size_t)p->m * sizeof *mask);
        t = (gemm_exec_xy_tensors){.x = dx, .y = dy, .mask = dm};
        if (!rc && (rc = gemm_exec_xy(g->ctx, plan, &t, 0, &err)) != STOF_OK)
            launch_failed(label, &err);
        if (!rc && !fetch(g, host, dy, ny)) {
            verdict v;
            verdict_init(&v);
            for (int64_t r = 0; r < p->m; r++)
                for (int64_t n = 0; n < p->n; n++)
                    verdict_add(&v, from_bits(p->dtype, host[r * p->n + n]),
                                xy_reference(p, x, mask, r, n), (long)(r * p->n + n));
            report(label, &v, count_nonfinite(host, ny, p->dtype), tol_of(p->dtype), "");
        }
    }
    dfree(g, &dx);
    dfree(g, &dy);
    dfree(g, &dm);
    free(x);
    free(xb);
    free(host);
    free(mask);
    gemm_exec_plan_free(g->ctx, plan);
}

/* glu: each activation at F 1152 (ModernBERT-base) and 1004 (VEC 4), the
 * default and a narrow setting. rotary: ModernBERT-base's 12 heads of 64 at
 * positions to 4096, grouped 32/8 heads of 128, odd 3/1 heads of 24; thetas
 * 1e4 and 1.6e5. */
static void test_glu_rotary(gpu *g, util_rng *rng) {
    static const stof_dtype dts[] = {STOF_F16, STOF_BF16};
    static const int acts[] = {STOF_ACT_GELU, STOF_ACT_GELU_TANH, STOF_ACT_SILU};
    static const int heads[][5] = {{12, 12, 64, 2, 4096}, {32, 8, 128, 3, 256}, {3, 1, 24, 5, 64}};
    char label[160];
    for (int d = 0; d < 2 && !g->dead; d++) {
        for (int a = 0; a < 3 && !g->dead; a++)
            for (int f = 0; f < 2 && !g->dead; f++)
                for (int v = 0; v < 2 && !g->dead; v++) {
                    gemm_exec_problem p = {.tmpl = FUSION_T_GLU, .dtype = dts[d], .m = 777,
                                           .n = f ? 1004 : 1152, .glu_act = acts[a]};
                    int narrow[FUSION_MAX_PARAMS] = {64, f ? 2 : 4};
                    snprintf(label, sizeof label, "glu %s M=777 F=%lld act %d%s",
                             stof_dtype_name(p.dtype), (long long)p.n, p.glu_act,
                             v ? " threads 64" : "");
                    run_xy(g, &p, v ? narrow : NULL, label, rng);
                }
        for (int h = 0; h < 3 && !g->dead; h++)
            for (int t = 0; t < 2 && !g->dead; t++) {
                gemm_exec_problem p = {.tmpl = FUSION_T_ROTARY, .dtype = dts[d],
                                       .heads = heads[h][0], .kv_heads = heads[h][1],
                                       .head_dim = heads[h][2], .seq_len = heads[h][4],
                                       .theta = t ? 160000.0f : 10000.0f};
                p.m = (int64_t)heads[h][3] * p.seq_len;
                p.n = (int64_t)(p.heads + 2 * p.kv_heads) * p.head_dim;
                int vals[FUSION_MAX_PARAMS] = {t ? 128 : 256, h == 2 ? (t ? 1 : 4) : 1 << (3 - t)};
                snprintf(label, sizeof label, "rotary %s B=%d S=%d heads %d/%d x %d theta %g "
                         "VEC %d", stof_dtype_name(p.dtype), heads[h][3], p.seq_len, p.heads,
                         p.kv_heads, p.head_dim, (double)p.theta, vals[1]);
                run_xy(g, &p, vals, label, rng);
            }
        for (int w = 0; w < 2 && !g->dead; w++) {
            gemm_exec_problem p = {.tmpl = FUSION_T_MASK_ROWS, .dtype = dts[d], .m = 1001,
                                   .n = w ? 100 : 768};
            snprintf(label, sizeof label, "mask_rows %s M=1001 N=%lld", stof_dtype_name(p.dtype),
                     (long long)p.n);
            run_xy(g, &p, NULL, label, rng);
        }
    }
}

/* ---- timing ----------------------------------------------------------------------------------- */

/* One GEMM shape timed in every setting of the list (and first in the
 * default setting, values NULL): medians of 20 runs after 3 warm-ups. */
static void timing_shape(gpu *g, util_rng *rng, int M, int N, int K, const int (*settings)[6],
                         int n_settings) {
    const int RUNS = 20;
    printf("\ntiming gemm_epilogue fp16 M=%d N=%d K=%d W[N,K], no epilogue (median of %d):\n", M,
           N, K, RUNS);
    gweights wt;
    gset s;
    if (make_weights(g, &wt, N, K, STOF_F16, rng)) {
        free_weights(g, &wt);
        return;
    }
    if (make_set(g, &s, &wt, M, rng)) {
        free_set(g, &s);
        free_weights(g, &wt);
        return;
    }
    CUevent ev[2] = {0, 0};
    if (check_cu(g, g->drv->EventCreate(&ev[0], CU_EVENT_DEFAULT), "cuEventCreate") ||
        check_cu(g, g->drv->EventCreate(&ev[1], CU_EVENT_DEFAULT), "cuEventCreate"))
        goto done;
    for (int st = -1; st < n_settings && !g->dead; st++) {
        gemm_exec_problem p = {.tmpl = FUSION_T_GEMM_EPILOGUE, .dtype = STOF_F16, .m = M, .n = N,
                               .k = K};
        const int *v = st < 0 ? NULL : settings[st];
        gemm_exec_plan *plan = make_plan(g, &p, v, "timing");
        if (!plan)
            continue;
        const int *pv = plan->values;
        char label[96];
        snprintf(label, sizeof label, "  %dx%dx%d w%d s%d k%d%s", pv[0], pv[1], pv[2], pv[3],
                 pv[4], pv[5], v ? "" : " (default)");
        gemm_exec_gemm_tensors t = {.x = s.dx, .w = wt.dw_nk, .y = s.dy};
        stof_error err = {0};
        float ms[20];
        int rc = 0;
        for (int i = 0; i < 3 && !rc; i++)
            rc = gemm_exec_gemm(g->ctx, plan, &t, 0, &err);
        for (int i = 0; i < RUNS && !rc; i++) {
            rc = check_cu(g, g->drv->EventRecord(ev[0], 0), "cuEventRecord") ||
                 gemm_exec_gemm(g->ctx, plan, &t, 0, &err) ||
                 check_cu(g, g->drv->EventRecord(ev[1], 0), "cuEventRecord") ||
                 check_cu(g, g->drv->EventSynchronize(ev[1]), "cuEventSynchronize") ||
                 check_cu(g, g->drv->EventElapsedTime(&ms[i], ev[0], ev[1]),
                          "cuEventElapsedTime");
        }
        if (rc) {
            printf("%s: failed: %s\n", label, err.msg);
        } else {
            qsort(ms, (size_t)RUNS, sizeof ms[0], cmp_float);
            double med = ms[RUNS / 2];
            printf("%-40s %.4f ms  %.1f TFLOP/s\n", label, med,
                   2.0 * M * N * K / (med * 1e-3) / 1e12);
        }
        gemm_exec_plan_free(g->ctx, plan);
    }
done:
    for (int i = 0; i < 2; i++)
        if (ev[i])
            g->drv->EventDestroy(ev[i]);
    free_set(g, &s);
    free_weights(g, &wt);
}

/* BERT-base's FFN shapes at 4096 and at 128 rows. STOF_GEMM_TIME_SETTINGS
 * ("BMxBNxBKwWsSkK ...", e.g. "128x128x64w8s3k1 64x32x64w4s6k4") replaces the
 * list of settings, for exploring. */
static void timing(gpu *g, util_rng *rng) {
    static const int shapes[][3] = {{4096, 3072, 768}, {4096, 768, 3072}, {128, 3072, 768},
                                    {128, 768, 3072}};
    int custom[16][6], n_custom = 0;
    const char *env = getenv("STOF_GEMM_TIME_SETTINGS");
    for (const char *c = env; c && *c && n_custom < 16;) {
        int *v = custom[n_custom], used = 0;
        if (sscanf(c, " %dx%dx%dw%ds%dk%d%n", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &used) <
                6 ||
            used == 0)
            break;
        n_custom++;
        c += used;
    }
    for (int i = 0; i < 4 && !g->dead; i++)
        timing_shape(g, rng, shapes[i][0], shapes[i][1], shapes[i][2],
                     n_custom ? (const int(*)[6])custom : time_settings,
                     n_custom ? n_custom : (shapes[i][0] > 256 ? N_TIME_SETTINGS : 0));
}

/* The fused kernels against their two-kernel equivalents (informational):
 * each line the median of 20 runs of the launch sequence, after 3 warm-up
 * runs. */
#define FUSED_RUNS 20

typedef int (*launch_seq)(gpu *g, void *ud, stof_error *err);

/* Median ms of fn, or a negative value (reported) when it failed. */
static double median_ms(gpu *g, launch_seq fn, void *ud, const char *label) {
    CUevent ev[2] = {0, 0};
    float ms[FUSED_RUNS];
    stof_error err = {0};
    int rc = check_cu(g, g->drv->EventCreate(&ev[0], CU_EVENT_DEFAULT), "cuEventCreate") ||
             check_cu(g, g->drv->EventCreate(&ev[1], CU_EVENT_DEFAULT), "cuEventCreate");
    for (int i = 0; i < 3 && !rc; i++)
        rc = fn(g, ud, &err);
    for (int i = 0; i < FUSED_RUNS && !rc; i++)
        rc = check_cu(g, g->drv->EventRecord(ev[0], 0), "cuEventRecord") || fn(g, ud, &err) ||
             check_cu(g, g->drv->EventRecord(ev[1], 0), "cuEventRecord") ||
             check_cu(g, g->drv->EventSynchronize(ev[1]), "cuEventSynchronize") ||
             check_cu(g, g->drv->EventElapsedTime(&ms[i], ev[0], ev[1]), "cuEventElapsedTime");
    for (int i = 0; i < 2; i++)
        if (ev[i])
            g->drv->EventDestroy(ev[i]);
    if (rc) {
        printf("  %-44s failed: %s\n", label, err.msg);
        return -1.0;
    }
    qsort(ms, FUSED_RUNS, sizeof ms[0], cmp_float);
    printf("  %-44s %.4f ms\n", label, ms[FUSED_RUNS / 2]);
    return ms[FUSED_RUNS / 2];
}

typedef struct one_launch {
    const gemm_exec_plan *plan[2];
    const void *tensors[2];
} one_launch;

static int launch_any(gpu *g, const gemm_exec_plan *plan, const void *t, stof_error *err) {
    switch (plan->problem.tmpl) {
    case FUSION_T_GEMM_EPILOGUE:
        return gemm_exec_gemm(g->ctx, plan, t, 0, err);
    case FUSION_T_GEMM_LN:
        return gemm_exec_gemm_ln(g->ctx, plan, t, 0, err);
    case FUSION_T_GEMM_CHAIN:
        return gemm_exec_gemm_chain(g->ctx, plan, t, 0, err);
    default:
        return gemm_exec_mi_chain(g->ctx, plan, t, 0, err);
    }
}

/* One or two launches in a row (plan[1] NULL: one). */
static int run_seq(gpu *g, void *ud, stof_error *err) {
    const one_launch *l = ud;
    int rc = launch_any(g, l->plan[0], l->tensors[0], err);
    return rc || !l->plan[1] ? rc : launch_any(g, l->plan[1], l->tensors[1], err);
}

static void time_plans(gpu *g, const gemm_exec_plan *a, const void *ta,
                       const gemm_exec_plan *b, const void *tb, const char *label) {
    one_launch l = {{a, b}, {ta, tb}};
    median_ms(g, run_seq, &l, label);
}

static void setting_label(char *buf, size_t n, const char *what, const int *v) {
    snprintf(buf, n, "%s %dx%dx%d w%d s%d", what, v[0], v[1], v[2], v[3], v[4]);
}

/* gemm_ln at M = 4096, N = 768, K = 768 (bias, residual, LayerNorm) against
 * gemm_epilogue (bias + residual) then mi_chain (LayerNorm). */
static void timing_ln(gpu *g, util_rng *rng) {
    const int M = 4096, N = 768, K = 768;
    printf("\ntiming gemm_ln fp16 M=%d N=%d K=%d bias+add+layernorm (median of %d):\n", M, N, K,
           FUSED_RUNS);
    gweights wt;
    gset s;
    lnparams lp;
    memset(&s, 0, sizeof s);
    memset(&lp, 0, sizeof lp);
    CUdeviceptr dtmp = 0;
    int rc = make_weights_scaled(g, &wt, N, K, STOF_F16, sqrt(3.0 / K), rng);
    rc = rc || make_set(g, &s, &wt, M, rng);
    rc = rc || make_lnparams(g, &lp, N, STOF_F16, rng);
    rc = rc || dalloc(g, &dtmp, (size_t)M * N * 2);
    if (!rc) {
        gemm_exec_problem p = {.tmpl = FUSION_T_GEMM_LN, .dtype = STOF_F16, .m = M, .n = N,
                               .k = K, .eps = 1e-5f};
        p.epi = (fusion_epilogue){1, FUSION_ACT_NONE, 1, FUSION_NORM_LAYERNORM};
        gemm_exec_ln_tensors t = {.x = s.dx, .w = wt.dw_nk, .bias = wt.db, .residual = s.dr,
                                  .gamma = lp.dgamma, .beta = lp.dbeta, .y = s.dy};
        for (int st = 0; st < 4 && !g->dead; st++) {
            char label[96];
            setting_label(label, sizeof label, "gemm_ln", ln_settings[st]);
            gemm_exec_plan *plan = make_plan(g, &p, ln_settings[st], label);
            if (plan)
                time_plans(g, plan, &t, NULL, NULL, label);
            gemm_exec_plan_free(g->ctx, plan);
        }
        gemm_exec_problem pg = {.tmpl = FUSION_T_GEMM_EPILOGUE, .dtype = STOF_F16, .m = M,
                                .n = N, .k = K};
        pg.epi = (fusion_epilogue){1, FUSION_ACT_NONE, 1, FUSION_NORM_NONE};
        gemm_exec_problem pm = {.tmpl = FUSION_T_MI_CHAIN, .dtype = STOF_F16, .m = M, .n = N,
                                .eps = 1e-5f};
        pm.epi.norm = FUSION_NORM_LAYERNORM;
        gemm_exec_gemm_tensors tg = {.x = s.dx, .w = wt.dw_nk, .bias = wt.db, .residual = s.dr,
                                     .y = dtmp};
        gemm_exec_mi_tensors tm = {.x = dtmp, .gamma = lp.dgamma, .beta = lp.dbeta, .y = s.dy};
        gemm_exec_plan *a = make_plan(g, &pg, NULL, "gemm_epilogue (default)");
        gemm_exec_plan *b = a ? make_plan(g, &pm, NULL, "mi_chain (default)") : NULL;
        if (a && b) {
            time_plans(g, a, &tg, NULL, NULL, "gemm_epilogue bias+add (default)");
            time_plans(g, b, &tm, NULL, NULL, "mi_chain layernorm (default)");
            time_plans(g, a, &tg, b, &tm, "two kernels: gemm_epilogue + mi_chain");
        }
        gemm_exec_plan_free(g->ctx, a);
        gemm_exec_plan_free(g->ctx, b);
    }
    dfree(g, &dtmp);
    free_lnparams(g, &lp);
    free_set(g, &s);
    free_weights(g, &wt);
}

/* gemm_chain at M = 128, K = N = 768, F = 3072 (bias + gelu, bias + add)
 * against two gemm_epilogue launches through an [M, F] intermediate. */
static void timing_chain(gpu *g, util_rng *rng) {
    const int M = 128, si = 0, K = chain_shapes[si][0], F = chain_shapes[si][1],
              N2 = chain_shapes[si][2];
    printf("\ntiming gemm_chain fp16 M=%d K=%d F=%d N=%d bias+gelu | bias+add (median of %d):\n",
           M, K, F, N2, FUSED_RUNS);
    gweights w1, w2;
    cset s;
    memset(&s, 0, sizeof s);
    CUdeviceptr dh = 0;
    int rc = make_chain_weights(g, &w1, &w2, si, STOF_F16, rng);
    rc = rc || make_cset(g, &s, &w1, &w2, M, rng);
    rc = rc || dalloc(g, &dh, (size_t)M * F * 2);
    if (!rc) {
        gemm_exec_problem p = {.tmpl = FUSION_T_GEMM_CHAIN, .dtype = STOF_F16, .m = M, .n = F,
                               .k = K, .n2 = N2};
        p.epi = (fusion_epilogue){1, FUSION_ACT_GELU, 0, FUSION_NORM_NONE};
        p.epi2 = (fusion_epilogue){1, FUSION_ACT_NONE, 1, FUSION_NORM_NONE};
        gemm_exec_chain_tensors t = {.x = s.dx, .w1 = w1.dw_nk, .b1 = w1.db, .w2 = w2.dw_nk,
                                     .b2 = w2.db, .residual = s.dr, .y = s.dy};
        for (int st = 0; st < 3 && !g->dead; st++) {
            char label[96];
            setting_label(label, sizeof label, "gemm_chain", chain_settings[st]);
            gemm_exec_plan *plan = make_plan(g, &p, chain_settings[st], label);
            if (plan)
                time_plans(g, plan, &t, NULL, NULL, label);
            gemm_exec_plan_free(g->ctx, plan);
        }
        gemm_exec_problem p1 = {.tmpl = FUSION_T_GEMM_EPILOGUE, .dtype = STOF_F16, .m = M,
                                .n = F, .k = K};
        p1.epi = (fusion_epilogue){1, FUSION_ACT_GELU, 0, FUSION_NORM_NONE};
        gemm_exec_problem p2 = {.tmpl = FUSION_T_GEMM_EPILOGUE, .dtype = STOF_F16, .m = M,
                                .n = N2, .k = F};
        p2.epi = (fusion_epilogue){1, FUSION_ACT_NONE, 1, FUSION_NORM_NONE};
        gemm_exec_gemm_tensors t1 = {.x = s.dx, .w = w1.dw_nk, .bias = w1.db, .y = dh};
        gemm_exec_gemm_tensors t2 = {.x = dh, .w = w2.dw_nk, .bias = w2.db, .residual = s.dr,
                                     .y = s.dy};
        gemm_exec_plan *a = make_plan(g, &p1, NULL, "gemm_epilogue 1 (default)");
        gemm_exec_plan *b = a ? make_plan(g, &p2, NULL, "gemm_epilogue 2 (default)") : NULL;
        if (a && b)
            time_plans(g, a, &t1, b, &t2, "two kernels: gemm_epilogue x 2 (default)");
        gemm_exec_plan_free(g->ctx, a);
        gemm_exec_plan_free(g->ctx, b);
    }
    dfree(g, &dh);
    free_cset(g, &s);
    free_weights(g, &w1);
    free_weights(g, &w2);
}

/* ---- compiling ahead ---------------------------------------------------------------------- */

/* The plans compile one kernel at a time; with a disk cache, compiling
 * every variant the test may use on several threads first (each with its
 * own cache on the same folder: files are written under a temporary name
 * and renamed) turns those compiles into disk hits. A superset of the runs
 * below; without a disk cache nothing is done. */
typedef struct warm_item {
    gemm_exec_problem p;
    int values[FUSION_MAX_PARAMS];
    uint64_t key; /* nvrtc_key: a variant listed twice is compiled once */
} warm_item;

typedef struct warm_job {
    const warm_item *items;
    int n, first, stride, failed;
    const char *dir, *arch;
} warm_job;

static void *warm_worker(void *arg) {
    warm_job *j = arg;
    nvrtc_cache c;
    nvrtc_cache_init(&c, j->dir);
    for (int i = j->first; i < j->n; i += j->stride) {
        gemm_exec_request r;
        gemm_exec_request_init(&r, &j->items[i].p, j->items[i].values, j->arch);
        const void *bin;
        size_t size;
        stof_error err = {0};
        j->failed += nvrtc_get(&c, &r.req, &bin, &size, &err) != STOF_OK;
    }
    nvrtc_cache_free(&c);
    return NULL;
}

static void warm_add(warm_item *items, int cap, int *n, const gemm_exec_problem *p,
                     const int *values, const char *arch) {
    if (*n >= cap || (p->tmpl == FUSION_T_GEMM_EPILOGUE && values && values[5] > 1 &&
                      !gemm_exec_wgmma(p, values, arch)))
        return; /* a split of K that cannot run here (run_gemm skips it) */
    warm_item *it = &items[*n];
    it->p = *p;
    if (values)
        memcpy(it->values, values, sizeof it->values);
    else
        gemm_exec_default_values(p, arch, it->values);
    gemm_exec_request r;
    gemm_exec_request_init(&r, &it->p, it->values, arch);
    it->key = nvrtc_key(&r.req);
    for (int i = 0; i < *n; i++)
        if (items[i].key == it->key)
            return;
    (*n)++;
}

#define WARM_THREADS 16

static void compile_ahead(gpu *g) {
    if (!g->ctx->nvrtc.dir[0])
        return;
    enum { CAP = 1536 };
    warm_item *items = calloc(CAP, sizeof *items);
    if (!items)
        return;
    const char *arch = g->ctx->arch;
    int n = 0;
    static const stof_dtype dts[] = {STOF_F16, STOF_BF16};
    for (int d = 0; d < 2; d++) {
        for (int e = 0; e < 16; e++)
            for (int kn = 0; kn < 2; kn++)
                for (int st = 0; st < N_GEMM_SETTINGS; st++) {
                    gemm_exec_problem p = {.tmpl = FUSION_T_GEMM_EPILOGUE, .dtype = dts[d],
                                           .m = 1000, .n = 768, .k = 768,
                                           .epi = epilogue_of(e), .weight_kn = kn};
                    int v[FUSION_MAX_PARAMS] = {0};
                    memcpy(v, gemm_settings[st], sizeof gemm_settings[st]);
                    warm_add(items, CAP, &n, &p, v, arch);
                }
        static const int Ns[] = {512, 768, 1024};
        for (int c = 0; c < N_CHAINS; c++)
            for (int ni = 0; ni < 3; ni++)
                for (int st = 0; st < N_MI_SETTINGS; st++) {
                    gemm_exec_problem p = {.tmpl = FUSION_T_MI_CHAIN, .dtype = dts[d], .m = 7,
                                           .n = Ns[ni],
                                           .epi = {chains[c].bias, chains[c].act, chains[c].res,
                                                   chains[c].norm},
                                           .store_pre_norm = chains[c].pre, .eps = 1e-5f};
                    int v[FUSION_MAX_PARAMS] = {0};
                    memcpy(v, mi_settings[st], sizeof mi_settings[st]);
                    warm_add(items, CAP, &n, &p, v, arch);
                }
        for (int w = 0; w < 2; w++)
            for (int f = 0; f < 4; f++) {
                gemm_exec_problem p = {.tmpl = FUSION_T_EMBEDDING, .dtype = dts[d],
                                       .m = EMB_BATCH * EMB_SEQ, .n = w ? 100 : 768,
                                       .seq_len = EMB_SEQ, .vocab = EMB_VOCAB,
                                       .has_position = f & 1, .has_type = f >> 1};
                warm_add(items, CAP, &n, &p, NULL, arch);
            }
    }
    for (int st = 0; st < N_TIME_SETTINGS; st++) {
        gemm_exec_problem p = {.tmpl = FUSION_T_GEMM_EPILOGUE, .dtype = STOF_F16, .m = 4096,
                               .n = 3072, .k = 768};
        int v[FUSION_MAX_PARAMS] = {0};
        memcpy(v, time_settings[st], sizeof time_settings[st]);
        warm_add(items, CAP, &n, &p, v, arch);
    }
    /* gemm_ln and gemm_chain: exactly the cases their tests run */
    for (int d = 0; d < 2; d++) {
        for (int ni = 0; ni < 3; ni++)
            for (int ki = 0; ki < 3; ki++)
                for (int mi = 0; mi < 4; mi++)
                    for (int v = 0; v < LN_VARIANTS; v++) {
                        gemm_exec_problem p;
                        int vals[FUSION_MAX_PARAMS];
                        ln_case(d, ni, ki, mi, v, &p, vals);
                        warm_add(items, CAP, &n, &p, vals, arch);
                        if (ki == 1 && mi == 2 && v == 0) { /* the in-place run */
                            p.epi.has_residual = 1;
                            warm_add(items, CAP, &n, &p, vals, arch);
                        }
                    }
        for (int ni = 0; d == 0 && ni < 3; ni++) /* norm_case picks its dtype */
            for (int ki = 0; ki < 2; ki++)
                for (int mi = 0; mi < 4; mi++)
                    for (int v = 0; v < 4; v++) {
                        gemm_exec_problem p;
                        int vals[FUSION_MAX_PARAMS];
                        norm_case(ni, ki, mi, v, &p, vals);
                        if (gemm_exec_wgmma(&p, vals, arch))
                            warm_add(items, CAP, &n, &p, vals, arch);
                        if (mi == 2 && v == 0 && gemm_exec_wgmma(&p, vals, arch)) {
                            p.epi.has_residual = 1;
                            warm_add(items, CAP, &n, &p, vals, arch);
                        }
                    }
        for (int si = 0; si < 3; si++)
            for (int mi = 0; mi < 4; mi++)
                for (int v = 0; v < CHAIN_VARIANTS; v++) {
                    gemm_exec_problem p;
                    int vals[FUSION_MAX_PARAMS];
                    chain_case(d, si, mi, v, &p, vals);
                    warm_add(items, CAP, &n, &p, vals, arch);
                }
    }
    double t0 = util_now();
    pthread_t tid[WARM_THREADS];
    warm_job jobs[WARM_THREADS];
    int started = 0, failed = 0;
    for (int i = 0; i < WARM_THREADS; i++) {
        jobs[i] = (warm_job){.items = items, .n = n, .first = i, .stride = WARM_THREADS,
                             .dir = g->ctx->nvrtc.dir, .arch = g->ctx->arch};
        if (pthread_create(&tid[i], NULL, warm_worker, &jobs[i]) != 0)
            warm_worker(&jobs[i]);
        else
            started |= 1 << i;
    }
    for (int i = 0; i < WARM_THREADS; i++) {
        if (started & (1 << i))
            pthread_join(tid[i], NULL);
        failed += jobs[i].failed;
    }
    /* a failure shows again, with its log, when the plan compiles it */
    printf("compiled ahead: %d variants for %s in %.1f s on %d threads (%d failed)\n", n,
           g->ctx->arch, util_now() - t0, WARM_THREADS, failed);
    free(items);
}

int main(int argc, char **argv) {
    gpu g = {0};
    GPU_TEST_OPEN(gemm_exec_ctx_create, g.ctx, "gpu_gemm");
    g.drv = g.ctx->drv;
    printf("GPU: %s (%s, %d SMs, %d B smem/block opt-in)\n", g.ctx->info.name, g.ctx->arch,
           g.ctx->info.sm_count, g.ctx->info.smem_per_block_optin);
    int notime = argc > 1 && !strcmp(argv[1], "notime");
    util_rng rng = {20240611};
    if (argc > 1 && !strcmp(argv[1], "stream")) { /* the fp32 residual stream's chains alone */
        test_mi_stream(&g, &rng);
        gemm_exec_ctx_free(g.ctx);
        recap_print();
        return check_summary("gpu_gemm");
    }
    if (argc > 1 && !strcmp(argv[1], "timeonly")) { /* for a profiler: the timing alone */
        timing(&g, &rng);
        gemm_exec_ctx_free(g.ctx);
        return check_summary("gpu_gemm");
    }
    compile_ahead(&g);
    double t0 = util_now();
    test_embedding(&g, &rng);
    if (!g.dead)
        test_glu_rotary(&g, &rng);
    if (!g.dead)
        test_mi_chain(&g, &rng);
    if (!g.dead)
        test_mi_stream(&g, &rng);
    if (!g.dead)
        test_gemm_epilogues(&g, &rng);
    if (!g.dead)
        test_gemm_shapes(&g, &rng);
    if (!g.dead)
        test_gemm_ln(&g, &rng);
    if (!g.dead)
        test_gemm_norm(&g, &rng);
    if (!g.dead)
        test_gemm_chain(&g, &rng);
    printf("correctness: %.1f s (%d kernels compiled, %d from the disk cache)\n",
           util_now() - t0, g.ctx->nvrtc.compiled, g.ctx->nvrtc.disk_hits);
    if (g.dead)
        printf("STOPPED EARLY: a CUDA error left the context unusable (see above); rerun under "
               "compute-sanitizer to locate it\n");
    if (!notime && !g.dead)
        timing(&g, &rng);
    if (!notime && !g.dead)
        timing_ln(&g, &rng);
    if (!notime && !g.dead)
        timing_chain(&g, &rng);
    gemm_exec_ctx_free(g.ctx);
    recap_print();
    return check_summary("gpu_gemm");
}
