/* GEMM segments through cuBLASLt (core/cublaslt_exec.h) on the GPU against
 * an fp64 CPU reference written here.
 *
 * Shapes: every M in {1, 7, 1000, 4096}, N in {768, 2304, 3072}, K in
 * {768, 1024, 3072, 4096}, both weight layouts, fp16 and bf16, each with
 * every epilogue cuBLASLt is asked for ([bias] [gelu_tanh|relu], [bias] add)
 * and the residual added in place (residual == y). Then every algorithm the
 * heuristic offers on one shape (the search times each), strided tensors (x
 * a slice of wider rows, y and the residual inside wider buffers: the gaps
 * must stay untouched), and the errors a launch reports.
 *
 * Inputs are seeded uniform values rounded to the dtype, outputs poisoned
 * with NaN before every launch. Checked: the relative error ||out - ref|| /
 * ||ref|| on the reference rows (every row up to M = 16, else 16 rows: the
 * first, the last, tile edges and random ones) below 1e-2 (fp16) or 2e-2
 * (bf16), and no NaN or infinity anywhere in the output.
 *
 * One line per case, the failures again at the end. Then the top 3
 * heuristic algorithms are timed at M = 4096, N = 3072, K = 768, fp16
 * (median of 20 with CUDA events, informational). Exit 77 with "SKIPPED:
 * <reason>" when there is no GPU. argv[1] = "notime" skips the timing. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/cublaslt_exec.h"
#include "core/util.h"

/* CUDA's libraries map memory where AddressSanitizer keeps its shadow gap,
 * and cuBLASLt keeps process-lifetime allocations: make a sanitizer build
 * of this test run as is. ASAN_OPTIONS and LSAN_OPTIONS still apply on top. */
#if defined(__SANITIZE_ADDRESS__)
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "protect_shadow_gap=0";
}
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
    return "leak:libcublasLt\nleak:libcuda\n";
}
#endif

#define TOL_F16 1e-2
#define TOL_BF16 2e-2
#define NAN_BITS 0x7fff /* a NaN in fp16 and in bf16 */
#define MAX_REF_ROWS 16

/* ---- a recap of the failures ------------------------------------------------------- */

#define RECAP_MAX 40
static char recap[RECAP_MAX][240];
static int n_recap, n_failed_runs, n_runs;

static void recap_add(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void recap_add(const char *fmt, ...) {
    n_failed_runs++;
    if (n_recap == RECAP_MAX)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(recap[n_recap++], sizeof recap[0], fmt, ap);
    va_end(ap);
}

static void recap_print(void) {
    printf("\n%d runs, %d failing%s\n", n_runs, n_failed_runs, n_failed_runs ? ":" : "");
    for (int i = 0; i < n_recap; i++)
        printf("  %s\n", recap[i]);
    if (n_failed_runs > n_recap)
        printf("  ... and %d more (see above)\n", n_failed_runs - n_recap);
}

/* ---- values -------------------------------------------------------------------------- */

static uint16_t to_bits(stof_dtype t, float x) {
    return t == STOF_BF16 ? util_f32_to_bf16(x) : util_f32_to_f16(x);
}

static float from_bits(stof_dtype t, uint16_t b) {
    return t == STOF_BF16 ? util_bf16_to_f32(b) : util_f16_to_f32(b);
}

/* All exponent bits set: infinity or NaN. */
static int nonfinite_bits(stof_dtype t, uint16_t b) {
    const uint16_t e = t == STOF_BF16 ? 0x7f80 : 0x7c00;
    return (b & e) == e;
}

/* n uniform values in [lo, hi) rounded to the dtype, as floats and as bits. */
static void fill(float *x, uint16_t *bits, size_t n, stof_dtype t, util_rng *rng, double lo,
                 double hi) {
    for (size_t i = 0; i < n; i++) {
        bits[i] = to_bits(t, (float)(lo + (hi - lo) * util_rng_double(rng)));
        x[i] = from_bits(t, bits[i]);
    }
}

static double act_ref(fusion_act a, double v) {
    switch (a) {
    case FUSION_ACT_GELU:
        return 0.5 * v * (1.0 + erf(v * 0.70710678118654752440));
    case FUSION_ACT_GELU_TANH:
        return 0.5 * v * (1.0 + tanh(0.79788456080286535588 * (v + 0.044715 * v * v * v)));
    case FUSION_ACT_RELU:
        return v > 0 ? v : 0;
    default:
        return v;
    }
}

static const char *act_label(fusion_act a) {
    static const char *const names[] = {"", "+gelu", "+gelu_tanh", "+relu"};
    return names[a];
}

static double tol_of(stof_dtype t) {
    return t == STOF_BF16 ? TOL_BF16 : TOL_F16;
}

/* The epilogues cuBLASLt is asked for: [bias] [gelu_tanh|relu], [bias] add. */
static const fusion_epilogue epilogues[] = {
    {0, FUSION_ACT_NONE, 0, FUSION_NORM_NONE},      {1, FUSION_ACT_NONE, 0, FUSION_NORM_NONE},
    {0, FUSION_ACT_GELU_TANH, 0, FUSION_NORM_NONE}, {1, FUSION_ACT_GELU_TANH, 0, FUSION_NORM_NONE},
    {0, FUSION_ACT_RELU, 0, FUSION_NORM_NONE},      {1, FUSION_ACT_RELU, 0, FUSION_NORM_NONE},
    {0, FUSION_ACT_NONE, 1, FUSION_NORM_NONE},      {1, FUSION_ACT_NONE, 1, FUSION_NORM_NONE},
};
#define N_EPILOGUES ((int)(sizeof epilogues / sizeof epilogues[0]))

/* ---- comparing ---------------------------------------------------------------------------- */

typedef struct verdict {
    double num, den, max_abs;
    long nonfinite, checked;
    long first_bad; /* element index of the first large error, or -1 */
} verdict;

static void verdict_init(verdict *v) {
    memset(v, 0, sizeof *v);
    v->first_bad = -1;
}

static void verdict_add(verdict *v, float y, double ref, long at) {
    v->checked++;
    if (!isfinite(y)) {
        v->nonfinite++;
        if (v->first_bad < 0)
            v->first_bad = at;
        return;
    }
    double e = fabs(y - ref);
    v->max_abs = e > v->max_abs ? e : v->max_abs;
    v->num += e * e;
    v->den += ref * ref;
    if (v->first_bad < 0 && e > 0.1 + 0.1 * fabs(ref))
        v->first_bad = at;
}

static double verdict_rel(const verdict *v) {
    return v->den > 0 ? sqrt(v->num / v->den) : sqrt(v->num);
}

/* ---- the GPU -------------------------------------------------------------------------------- */

typedef struct gpu {
    cublaslt_exec_ctx *ctx;
    const cuda_driver *drv;
    int dead; /* a sticky CUDA error: the context is unusable */
} gpu;

static int check_cu(gpu *g, CUresult r, const char *what) {
    if (r == CUDA_SUCCESS)
        return 0;
    const char *name = NULL;
    g->drv->GetErrorName(r, &name);
    fprintf(stderr, "CUDA error in %s: %s\n", what, name ? name : "?");
    CHECK_MSG(0, "%s: %s", what, name ? name : "?");
    if (r != CUDA_ERROR_OUT_OF_MEMORY && r != CUDA_ERROR_INVALID_VALUE)
        g->dead = 1;
    return -1;
}

static int dalloc(gpu *g, CUdeviceptr *d, size_t bytes) {
    *d = 0;
    return check_cu(g, g->drv->MemAlloc(d, bytes), "cuMemAlloc");
}

static int upload(gpu *g, CUdeviceptr *d, const void *h, size_t bytes) {
    if (dalloc(g, d, bytes))
        return -1;
    return check_cu(g, g->drv->MemcpyHtoD(*d, h, bytes), "cuMemcpyHtoD");
}

static void dfree(gpu *g, CUdeviceptr *d) {
    if (*d)
        g->drv->MemFree(*d);
    *d = 0;
}

static int poison(gpu *g, CUdeviceptr d, size_t elems) {
    return check_cu(g, g->drv->MemsetD16Async(d, NAN_BITS, elems, 0), "cuMemsetD16Async");
}

/* Waits for the launches and copies elems 16-bit values back. */
static int fetch(gpu *g, uint16_t *h, CUdeviceptr d, size_t elems) {
    if (check_cu(g, g->drv->StreamSynchronize(0), "cuStreamSynchronize (cublasLtMatmul)"))
        return -1;
    return check_cu(g, g->drv->MemcpyDtoH(h, d, elems * 2), "cuMemcpyDtoH");
}

static void fail_case(const char *label, const char *stage, const char *msg) {
    n_runs++;
    printf("%-78s %s FAILED: %s\n", label, stage, msg);
    CHECK_MSG(0, "%s: %s: %s", label, stage, msg);
    recap_add("%s: %s: %.160s", label, stage, msg);
}

/* A plan, or a failed case (recorded) and NULL. */
static cublaslt_exec_plan *make_plan(gpu *g, const gemm_exec_problem *p,
                                     const cublaslt_exec_options *opt, const char *label) {
    cublaslt_exec_plan *plan = NULL;
    stof_error err = {0};
    int rc = cublaslt_exec_plan_create(g->ctx, p, opt, &plan, &err);
    if (rc) {
        fail_case(label, "PLAN", err.msg);
        if (rc == STOF_ERR_CUDA)
            g->dead = 1;
    }
    return plan;
}

static int launch(gpu *g, cublaslt_exec_plan *plan, const gemm_exec_gemm_tensors *t,
                  const char *label) {
    stof_error err = {0};
    int rc = cublaslt_exec_gemm(g->ctx, plan, t, 0, &err);
    if (rc) {
        fail_case(label, "LAUNCH", err.msg);
        if (rc == STOF_ERR_CUDA)
            g->dead = 1;
    }
    return rc;
}

/* One result line; a failure also goes to the recap. */
static void report(const char *label, const verdict *v, long nonfinite_all, double tol,
                   const char *where) {
    double rel = verdict_rel(v);
    int ok = rel < tol && v->nonfinite == 0 && nonfinite_all == 0 && v->checked > 0;
    n_runs++;
    printf("%-78s rel %.2e max %.2e nan %ld/%ld %s\n", label, rel, v->max_abs, nonfinite_all,
           v->checked, ok ? "OK" : "FAIL");
    if (!ok) {
        if (where[0])
            printf("    %s\n", where);
        recap_add("%s: rel %.2e, %ld non-finite", label, rel, nonfinite_all);
    }
    CHECK_MSG(ok, "%s: rel %.3g (tol %.g), %ld non-finite", label, rel, tol, nonfinite_all);
}

/* ---- weights and input sets ------------------------------------------------------------- */

/* The weights of one (N, K, dtype): logical [N][K], uploaded in both layouts. */
typedef struct gweights {
    int N, K;
    stof_dtype dt;
    float *w, *bias;
    CUdeviceptr dw_nk, dw_kn, db;
} gweights;

/* One input set: x and the residual for M rows, the fp64 x w^T of the
 * reference rows. */
typedef struct gset {
    const gweights *wt;
    int M;
    float *x, *res;
    uint16_t *res_bits;
    int n_rows, rows[MAX_REF_ROWS];
    double *acc; /* [n_rows][N] */
    CUdeviceptr dx, dr, dy;
    uint16_t *hy;
} gset;

static int make_weights(gpu *g, gweights *wt, int N, int K, stof_dtype dt, util_rng *rng) {
    memset(wt, 0, sizeof *wt);
    wt->N = N;
    wt->K = K;
    wt->dt = dt;
    size_t nk = (size_t)N * K;
    wt->w = malloc(nk * sizeof *wt->w);
    wt->bias = malloc((size_t)N * sizeof *wt->bias);
    uint16_t *bits = malloc(nk * 2), *t = malloc(nk * 2), *bb = malloc((size_t)N * 2);
    int rc = -1;
    if (wt->w && wt->bias && bits && t && bb) {
        fill(wt->w, bits, nk, dt, rng, -1.0, 1.0);
        fill(wt->bias, bb, (size_t)N, dt, rng, -1.0, 1.0);
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++)
                t[(size_t)k * N + n] = bits[(size_t)n * K + k];
        rc = upload(g, &wt->dw_nk, bits, nk * 2) || upload(g, &wt->dw_kn, t, nk * 2) ||
             upload(g, &wt->db, bb, (size_t)N * 2);
    }
    free(bits);
    free(t);
    free(bb);
    return rc;
}

static void free_weights(gpu *g, gweights *wt) {
    free(wt->w);
    free(wt->bias);
    dfree(g, &wt->dw_nk);
    dfree(g, &wt->dw_kn);
    dfree(g, &wt->db);
}

static int has_row(const gset *s, int r) {
    for (int i = 0; i < s->n_rows; i++)
        if (s->rows[i] == r)
            return 1;
    return 0;
}

/* Every row up to MAX_REF_ROWS; else the first two, the last two, the
 * edges of 64-, 128- and 256-row tiles, and random rows. */
static void pick_rows(gset *s, util_rng *rng) {
    s->n_rows = 0;
    if (s->M <= MAX_REF_ROWS) {
        for (int r = 0; r < s->M; r++)
            s->rows[s->n_rows++] = r;
        return;
    }
    const int fixed[] = {0, 1, s->M - 1, s->M - 2, 63, 64, 127, 128, 255, 256, s->M / 2};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (fixed[i] < s->M && !has_row(s, fixed[i]))
            s->rows[s->n_rows++] = fixed[i];
    while (s->n_rows < MAX_REF_ROWS) {
        int r = (int)(util_rng_double(rng) * s->M);
        if (!has_row(s, r))
            s->rows[s->n_rows++] = r;
    }
}

static int make_set(gpu *g, gset *s, const gweights *wt, int M, util_rng *rng) {
    memset(s, 0, sizeof *s);
    s->wt = wt;
    s->M = M;
    const int N = wt->N, K = wt->K;
    size_t mk = (size_t)M * K, mn = (size_t)M * N;
    s->x = malloc(mk * sizeof *s->x);
    s->res = malloc(mn * sizeof *s->res);
    s->res_bits = malloc(mn * 2);
    s->hy = malloc(mn * 2);
    s->acc = malloc((size_t)MAX_REF_ROWS * N * sizeof *s->acc);
    uint16_t *xb = malloc(mk * 2);
    int rc = -1;
    if (s->x && s->res && s->res_bits && s->hy && s->acc && xb) {
        fill(s->x, xb, mk, wt->dt, rng, -1.0, 1.0);
        fill(s->res, s->res_bits, mn, wt->dt, rng, -1.0, 1.0);
        pick_rows(s, rng);
        for (int i = 0; i < s->n_rows; i++) {
            const float *xr = s->x + (size_t)s->rows[i] * K;
            for (int n = 0; n < N; n++) {
                const float *wr = wt->w + (size_t)n * K;
                double sum = 0.0;
                for (int k = 0; k < K; k++)
                    sum += (double)xr[k] * wr[k];
                s->acc[(size_t)i * N + n] = sum;
            }
        }
        rc = upload(g, &s->dx, xb, mk * 2) || upload(g, &s->dr, s->res_bits, mn * 2) ||
             dalloc(g, &s->dy, mn * 2);
    }
    free(xb);
    return rc;
}

static void free_set(gpu *g, gset *s) {
    free(s->x);
    free(s->res);
    free(s->res_bits);
    free(s->hy);
    free(s->acc);
    dfree(g, &s->dx);
    dfree(g, &s->dr);
    dfree(g, &s->dy);
}

/* Weights and one set over them; on failure both are freed. */
static int make_pair(gpu *g, gweights *wt, gset *s, int M, int N, int K, stof_dtype dt,
                     util_rng *rng) {
    memset(s, 0, sizeof *s);
    if (!make_weights(g, wt, N, K, dt, rng) && !make_set(g, s, wt, M, rng))
        return 0;
    free_set(g, s);
    free_weights(g, wt);
    return -1;
}

/* The reference of reference row i (row r of the set), column n. */
static double reference(const gset *s, const fusion_epilogue *epi, int i, int n) {
    const int N = s->wt->N;
    double ref = s->acc[(size_t)i * N + n];
    if (epi->has_bias)
        ref += s->wt->bias[n];
    ref = act_ref(epi->act, ref);
    if (epi->has_residual)
        ref += s->res[(size_t)s->rows[i] * N + n];
    return ref;
}

/* Checks the packed output in s->hy against the reference. */
static void judge(const gset *s, const fusion_epilogue *epi, const char *label) {
    const int N = s->wt->N;
    const stof_dtype dt = s->wt->dt;
    const size_t mn = (size_t)s->M * N;
    verdict v;
    verdict_init(&v);
    for (int i = 0; i < s->n_rows; i++)
        for (int n = 0; n < N; n++) {
            long at = (long)s->rows[i] * N + n;
            verdict_add(&v, from_bits(dt, s->hy[at]), reference(s, epi, i, n), at);
        }
    long nonfinite = 0;
    for (size_t i = 0; i < mn; i++)
        nonfinite += nonfinite_bits(dt, s->hy[i]);
    char where[160] = "";
    if (v.first_bad >= 0)
        snprintf(where, sizeof where, "first bad: row %ld col %ld = %g", v.first_bad / N,
                 v.first_bad % N, from_bits(dt, s->hy[v.first_bad]));
    report(label, &v, nonfinite, tol_of(dt), where);
}

static void label_of(char *label, size_t n, const gset *s, int kn, const fusion_epilogue *e,
                     int in_place, const char *extra) {
    const gweights *wt = s->wt;
    snprintf(label, n, "cublaslt %s M=%d N=%d K=%d %s %s%s%s%s", stof_dtype_name(wt->dt), s->M,
             wt->N, wt->K, kn ? "W[K,N]" : "W[N,K]", e->has_bias ? "bias" : "-",
             act_label(e->act), e->has_residual ? (in_place ? "+add(in place)" : "+add") : "",
             extra);
}

/* Runs one case on a set with the plan's selected algorithm and checks it.
 * in_place: the residual is y itself (y starts as the residual, not NaN). */
static void run_plan(gpu *g, gset *s, cublaslt_exec_plan *plan, int in_place,
                     const char *label) {
    const gweights *wt = s->wt;
    const gemm_exec_problem *p = &plan->problem;
    size_t mn = (size_t)s->M * wt->N;
    gemm_exec_gemm_tensors t = {.x = s->dx, .w = p->weight_kn ? wt->dw_kn : wt->dw_nk,
                                .bias = wt->db, .residual = in_place ? s->dy : s->dr,
                                .y = s->dy};
    int rc = in_place ? check_cu(g, g->drv->MemcpyHtoD(s->dy, s->res_bits, mn * 2),
                                 "cuMemcpyHtoD(y = residual)")
                      : poison(g, s->dy, mn);
    if (!rc && !launch(g, plan, &t, label) && !fetch(g, s->hy, s->dy, mn))
        judge(s, &p->epi, label);
}

static void run_case(gpu *g, gset *s, int kn, const fusion_epilogue *epi, int in_place) {
    char label[200];
    label_of(label, sizeof label, s, kn, epi, in_place, "");
    gemm_exec_problem p = {.tmpl = FUSION_T_CUBLASLT, .dtype = s->wt->dt, .m = s->M,
                           .n = s->wt->N, .k = s->wt->K, .epi = *epi, .weight_kn = kn};
    cublaslt_exec_plan *plan = make_plan(g, &p, NULL, label);
    if (!plan)
        return;
    run_plan(g, s, plan, in_place, label);
    cublaslt_exec_plan_free(g->ctx, plan);
}

/* ---- the cases ------------------------------------------------------------------------------- */

static void test_shapes(gpu *g, util_rng *rng) {
    static const int Ms[] = {1, 7, 1000, 4096};
    static const int Ns[] = {768, 2304, 3072};
    static const int Ks[] = {768, 1024, 3072, 4096};
    static const stof_dtype dts[] = {STOF_F16, STOF_BF16};
    const fusion_epilogue in_place = {1, FUSION_ACT_NONE, 1, FUSION_NORM_NONE};
    for (int d = 0; d < 2 && !g->dead; d++)
        for (int ni = 0; ni < 3 && !g->dead; ni++)
            for (int ki = 0; ki < 4 && !g->dead; ki++) {
                gweights wt;
                if (make_weights(g, &wt, Ns[ni], Ks[ki], dts[d], rng)) {
                    free_weights(g, &wt);
                    return;
                }
                for (int mi = 0; mi < 4 && !g->dead; mi++) {
                    gset s;
                    if (!make_set(g, &s, &wt, Ms[mi], rng))
                        for (int kn = 0; kn < 2 && !g->dead; kn++) {
                            for (int e = 0; e < N_EPILOGUES && !g->dead; e++)
                                run_case(g, &s, kn, &epilogues[e], 0);
                            if (!g->dead)
                                run_case(g, &s, kn, &in_place, 1);
                        }
                    free_set(g, &s);
                }
                free_weights(g, &wt);
            }
}

/* Every algorithm the heuristic returns (up to 8) on two shapes: the search
 * may pick any of them. */
static void test_algos(gpu *g, util_rng *rng) {
    static const struct { int M, N, K; stof_dtype dt; int kn; fusion_epilogue e; } cases[] = {
        {1000, 2304, 768, STOF_F16, 0, {1, FUSION_ACT_GELU_TANH, 0, FUSION_NORM_NONE}},
        {4096, 768, 3072, STOF_BF16, 1, {1, FUSION_ACT_NONE, 1, FUSION_NORM_NONE}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0] && !g->dead; c++) {
        gweights wt;
        gset s;
        if (make_pair(g, &wt, &s, cases[c].M, cases[c].N, cases[c].K, cases[c].dt, rng))
            return;
        char label[200];
        label_of(label, sizeof label, &s, cases[c].kn, &cases[c].e, 0, " (8 algos)");
        gemm_exec_problem p = {.tmpl = FUSION_T_CUBLASLT, .dtype = cases[c].dt, .m = cases[c].M,
                               .n = cases[c].N, .k = cases[c].K, .epi = cases[c].e,
                               .weight_kn = cases[c].kn};
        cublaslt_exec_options opt = {.n_algos = 8};
        cublaslt_exec_plan *plan = make_plan(g, &p, &opt, label);
        if (plan) {
            printf("heuristic: %d algorithms\n", plan->n_algos);
            for (int a = 0; a < plan->n_algos && !g->dead; a++) {
                stof_error err = {0};
                CHECK_EQ_INT(cublaslt_exec_plan_select(plan, a, &err), STOF_OK);
                char desc[400];
                cublaslt_exec_plan_describe(plan, desc, sizeof desc);
                printf("  %s\n", desc);
                label_of(label, sizeof label, &s, cases[c].kn, &cases[c].e, 0, "");
                snprintf(label + strlen(label), sizeof label - strlen(label), " ALGO=%d", a);
                run_plan(g, &s, plan, 0, label);
            }
            stof_error err = {0};
            CHECK_EQ_INT(cublaslt_exec_plan_select(plan, plan->n_algos, &err),
                         STOF_ERR_UNSUPPORTED);
            CHECK_CONTAINS(err.msg, "heuristic offered");
            cublaslt_exec_plan_free(g->ctx, plan);
        }
        free_set(g, &s);
        free_weights(g, &wt);
    }
}

/* x a slice of [M, XS] rows, y and the residual inside [M, YS] / [M, RS]
 * buffers: the plan's layouts carry the strides; the gaps stay poisoned. */
static void test_strided(gpu *g, util_rng *rng) {
    const int M = 1000, N = 768, K = 1024, XS = 1032, RS = 1536, YS = 2304;
    const stof_dtype dt = STOF_F16;
    gweights wt;
    gset s;
    if (make_pair(g, &wt, &s, M, N, K, dt, rng))
        return;
    size_t nx = (size_t)M * XS, nr = (size_t)M * RS, ny = (size_t)M * YS;
    uint16_t *hx = calloc(nx, 2), *hr = calloc(nr, 2), *hy = malloc(ny * 2);
    uint16_t *packed_x = malloc((size_t)M * K * 2);
    CUdeviceptr dx = 0, dr = 0, dy = 0;
    const fusion_epilogue epi = {1, FUSION_ACT_NONE, 1, FUSION_NORM_NONE};
    char label[200];
    label_of(label, sizeof label, &s, 0, &epi, 0, " strided x/r/y");
    if (hx && hr && hy && packed_x &&
        !check_cu(g, g->drv->MemcpyDtoH(packed_x, s.dx, (size_t)M * K * 2), "cuMemcpyDtoH(x)")) {
        for (int r = 0; r < M; r++) {
            memcpy(hx + (size_t)r * XS, packed_x + (size_t)r * K, (size_t)K * 2);
            memcpy(hr + (size_t)r * RS, s.res_bits + (size_t)r * N, (size_t)N * 2);
        }
        gemm_exec_problem p = {.tmpl = FUSION_T_CUBLASLT, .dtype = dt, .m = M, .n = N, .k = K,
                               .epi = epi};
        cublaslt_exec_options opt = {.strides = {.x = XS, .r = RS, .y = YS}};
        cublaslt_exec_plan *plan = NULL;
        if (!upload(g, &dx, hx, nx * 2) && !upload(g, &dr, hr, nr * 2) &&
            !dalloc(g, &dy, ny * 2) && !poison(g, dy, ny) &&
            (plan = make_plan(g, &p, &opt, label)) != NULL) {
            gemm_exec_gemm_tensors t = {.x = dx, .w = wt.dw_nk, .bias = wt.db, .residual = dr,
                                        .y = dy, .x_row_stride = XS, .r_row_stride = RS,
                                        .y_row_stride = YS};
            if (!launch(g, plan, &t, label) && !fetch(g, hy, dy, ny)) {
                /* the gaps must still be the poison; the rows go to s.hy */
                long touched = 0;
                for (int r = 0; r < M; r++) {
                    memcpy(s.hy + (size_t)r * N, hy + (size_t)r * YS, (size_t)N * 2);
                    for (int c = N; c < YS; c++)
                        touched += hy[(size_t)r * YS + c] != NAN_BITS;
                }
                CHECK_MSG(touched == 0, "%s: %ld elements outside the rows written", label,
                          touched);
                judge(&s, &epi, label);
            }
        }
        cublaslt_exec_plan_free(g->ctx, plan);
    }
    dfree(g, &dx);
    dfree(g, &dr);
    dfree(g, &dy);
    free(hx);
    free(hr);
    free(hy);
    free(packed_x);
    free_set(g, &s);
    free_weights(g, &wt);
}

/* What a launch and a plan refuse, on a live context. */
static void test_errors(gpu *g) {
    stof_error err = {0};
    cublaslt_exec_plan *plan = NULL;
    gemm_exec_problem p = {.tmpl = FUSION_T_CUBLASLT, .dtype = STOF_F16, .m = 64, .n = 768,
                           .k = 768, .epi = {1, FUSION_ACT_GELU, 0, FUSION_NORM_NONE}};
    CHECK_EQ_INT(cublaslt_exec_plan_create(g->ctx, &p, NULL, &plan, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "erf GELU");
    CHECK(plan == NULL);
    p.epi.act = FUSION_ACT_GELU_TANH;
    cublaslt_exec_options opt = {.n_algos = 2, .algo = 2};
    CHECK_EQ_INT(cublaslt_exec_plan_create(g->ctx, &p, &opt, &plan, &err), STOF_ERR_INVALID);
    opt = (cublaslt_exec_options){.align_bytes = 24};
    CHECK_EQ_INT(cublaslt_exec_plan_create(g->ctx, &p, &opt, &plan, &err), STOF_ERR_INVALID);
    CHECK_EQ_INT(cublaslt_exec_plan_create(g->ctx, &p, NULL, &plan, &err), STOF_OK);
    if (!plan)
        return;
    char desc[400];
    cublaslt_exec_plan_describe(plan, desc, sizeof desc);
    printf("plan: %s\n", desc);
    CHECK_CONTAINS(desc, "epilogue=GELU_BIAS");
    CUdeviceptr buf = 0;
    if (!dalloc(g, &buf, (size_t)5 << 20)) { /* x, w (1.1 MiB), bias, y apart */
        gemm_exec_gemm_tensors t = {.x = buf, .w = buf + (1 << 20), .bias = buf + (3 << 20),
                                    .y = buf + (4 << 20)};
        gemm_exec_gemm_tensors u = t;
        u.bias += 2;
        CHECK_EQ_INT(cublaslt_exec_gemm(g->ctx, plan, &u, 0, &err), STOF_ERR_INVALID);
        CHECK_CONTAINS(err.msg, "bias");
        u = t;
        u.y_row_stride = 1536;
        CHECK_EQ_INT(cublaslt_exec_gemm(g->ctx, plan, &u, 0, &err), STOF_ERR_INVALID);
        CHECK_CONTAINS(err.msg, "row stride");
        CHECK_EQ_INT(cublaslt_exec_gemm(g->ctx, plan, &t, 0, &err), STOF_OK);
        check_cu(g, g->drv->StreamSynchronize(0), "cuStreamSynchronize");
        dfree(g, &buf);
    }
    cublaslt_exec_plan_free(g->ctx, plan);
}

/* ---- timing ----------------------------------------------------------------------------------- */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

#define TIME_RUNS 20

/* Median of TIME_RUNS launches of the plan's selected algorithm, ms; < 0 on
 * failure. Each timed launch follows an untimed one, which keeps the GPU
 * busy while the host enqueues the start event and the timed launch: the
 * events then bracket the kernel, not the host's call overhead (which a
 * sanitizer build inflates). */
static double time_plan(gpu *g, cublaslt_exec_plan *plan, const gemm_exec_gemm_tensors *t,
                        CUevent ev[2], char *msg, size_t n) {
    stof_error err = {0};
    float ms[TIME_RUNS];
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++)
        rc = cublaslt_exec_gemm(g->ctx, plan, t, 0, &err);
    for (int i = 0; i < TIME_RUNS && !rc; i++)
        rc = cublaslt_exec_gemm(g->ctx, plan, t, 0, &err) ||
             check_cu(g, g->drv->EventRecord(ev[0], 0), "cuEventRecord") ||
             cublaslt_exec_gemm(g->ctx, plan, t, 0, &err) ||
             check_cu(g, g->drv->EventRecord(ev[1], 0), "cuEventRecord") ||
             check_cu(g, g->drv->EventSynchronize(ev[1]), "cuEventSynchronize") ||
             check_cu(g, g->drv->EventElapsedTime(&ms[i], ev[0], ev[1]), "cuEventElapsedTime");
    if (rc) {
        snprintf(msg, n, "%s", err.msg[0] ? err.msg : "a CUDA call failed");
        return -1.0;
    }
    qsort(ms, TIME_RUNS, sizeof ms[0], cmp_float);
    return ms[TIME_RUNS / 2];
}

static void timing(gpu *g, util_rng *rng) {
    const int M = 4096, N = 3072, K = 768;
    static const fusion_epilogue epis[] = {{0, FUSION_ACT_NONE, 0, FUSION_NORM_NONE},
                                           {1, FUSION_ACT_GELU_TANH, 0, FUSION_NORM_NONE}};
    gweights wt;
    gset s;
    if (make_pair(g, &wt, &s, M, N, K, STOF_F16, rng))
        return;
    CUevent ev[2] = {0, 0};
    if (!check_cu(g, g->drv->EventCreate(&ev[0], CU_EVENT_DEFAULT), "cuEventCreate") &&
        !check_cu(g, g->drv->EventCreate(&ev[1], CU_EVENT_DEFAULT), "cuEventCreate"))
        for (int e = 0; e < 2 && !g->dead; e++)
            for (int kn = 0; kn < 2 && !g->dead; kn++) {
                printf("\ntiming cublaslt fp16 M=%d N=%d K=%d %s %s%s, the heuristic's top 3 "
                       "(median of %d):\n", M, N, K, kn ? "W[K,N]" : "W[N,K]",
                       epis[e].has_bias ? "bias" : "no epilogue", act_label(epis[e].act),
                       TIME_RUNS);
                gemm_exec_problem p = {.tmpl = FUSION_T_CUBLASLT, .dtype = STOF_F16, .m = M,
                                       .n = N, .k = K, .epi = epis[e], .weight_kn = kn};
                cublaslt_exec_options opt = {.n_algos = 3};
                cublaslt_exec_plan *plan = make_plan(g, &p, &opt, "  timing plan");
                if (!plan)
                    continue;
                gemm_exec_gemm_tensors t = {.x = s.dx, .w = kn ? wt.dw_kn : wt.dw_nk,
                                            .bias = wt.db, .y = s.dy};
                for (int a = 0; a < plan->n_algos && !g->dead; a++) {
                    cublaslt_exec_plan_select(plan, a, NULL);
                    char msg[1024] = "", desc[400];
                    double med = time_plan(g, plan, &t, ev, msg, sizeof msg);
                    cublaslt_exec_plan_describe(plan, desc, sizeof desc);
                    if (med < 0)
                        printf("  ALGO=%d: failed: %s\n", a, msg);
                    else
                        printf("  ALGO=%d: %.3f ms  %.1f TFLOP/s  [%s]\n", a, med,
                               2.0 * M * N * K / (med * 1e-3) / 1e12, desc);
                }
                cublaslt_exec_plan_free(g->ctx, plan);
            }
    for (int i = 0; i < 2; i++)
        if (ev[i])
            g->drv->EventDestroy(ev[i]);
    free_set(g, &s);
    free_weights(g, &wt);
}

int main(int argc, char **argv) {
    gpu g = {0};
    stof_error err = {0};
    int rc = cublaslt_exec_ctx_create(0, &g.ctx, &err);
    if (rc == STOF_ERR_NO_DEVICE) {
        printf("SKIPPED: %s\n", err.msg);
        return 77;
    }
    CHECK_MSG(rc == STOF_OK, "context: %s", err.msg);
    if (rc)
        return check_summary("gpu_cublaslt");
    g.drv = g.ctx->drv;
    printf("GPU: %s (%s, %d SMs), cuBLASLt %zu\n", g.ctx->info.name, g.ctx->arch,
           g.ctx->info.sm_count, cublasLtGetVersion());
    int notime = argc > 1 && !strcmp(argv[1], "notime");
    util_rng rng = {20240611};
    double t0 = util_now();
    test_errors(&g);
    if (!g.dead)
        test_algos(&g, &rng);
    if (!g.dead)
        test_strided(&g, &rng);
    if (!g.dead)
        test_shapes(&g, &rng);
    printf("correctness: %.1f s\n", util_now() - t0);
    if (g.dead)
        printf("STOPPED EARLY: a CUDA error left the context unusable (see above); rerun under "
               "compute-sanitizer to locate it\n");
    if (!notime && !g.dead)
        timing(&g, &rng);
    cublaslt_exec_ctx_free(g.ctx);
    recap_print();
    return check_summary("gpu_cublaslt");
}
