/* GEMM segments through cuBLASLt (core/exec/cublaslt/cublaslt_exec.h) on the GPU against
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
#include "gpu_open.h"
#include "core/exec/cublaslt/cublaslt_exec.h"
#include "core/base/util.h"

#define GPU_CTX_TYPE cublaslt_exec_ctx
#include "gpu_gemm_common.h"

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

/* The epilogues cuBLASLt is asked for: [bias] [gelu_tanh|relu], [bias] add. */
static const fusion_epilogue epilogues[] = {
    {0, FUSION_ACT_NONE, 0, FUSION_NORM_NONE},      {1, FUSION_ACT_NONE, 0, FUSION_NORM_NONE},
    {0, FUSION_ACT_GELU_TANH, 0, FUSION_NORM_NONE}, {1, FUSION_ACT_GELU_TANH, 0, FUSION_NORM_NONE},
    {0, FUSION_ACT_RELU, 0, FUSION_NORM_NONE},      {1, FUSION_ACT_RELU, 0, FUSION_NORM_NONE},
    {0, FUSION_ACT_NONE, 1, FUSION_NORM_NONE},      {1, FUSION_ACT_NONE, 1, FUSION_NORM_NONE},
};
#define N_EPILOGUES ((int)(sizeof epilogues / sizeof epilogues[0]))

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

/* ---- weights and input sets ------------------------------------------------------------- */

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
        judge_epilogue(s, &p->epi, label);
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
                judge_epilogue(&s, &epi, label);
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
    GPU_TEST_OPEN(cublaslt_exec_ctx_create, g.ctx, "gpu_cublaslt");
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
