/* gemv (kernels/gemv.cu, a GEMM of a few rows) on the GPU against an fp64 CPU reference
 * written here (gpu_gemm_common.h's), independent of the kernel.
 *
 * Shapes: M in {1, 2, 3, 5, 8, 13, 16}; (N, K) in {(768, 768), (2304, 768), (776, 1032),
 * (3072, 2048)} (776 a multiple of no BLOCK_N, 1032 of no 256-element step of the lanes) in
 * both weight layouts, and a vocabulary of 50257 outputs over 768 ([N, K] only: [K, N] needs N
 * a multiple of 8); fp16 and bf16. Each case runs the default setting and one of the explicit
 * ones below in turn (rows split over blocks, 2 to 8 loads in flight, 4 and 8 warps, 1 to 8
 * outputs a warp or 1 to 16 column lanes), with an epilogue rotating over the 16 the template
 * declares ([bias] [gelu|gelu_tanh|relu] [add]), and the residual added in place (y = residual)
 * on some; and a LayerNorm or RMSNorm ahead of the GEMM (the template's prologue: the reference
 * normalizes x in fp64 and rounds it to the dtype, as the norm op stores it), with fresh gains
 * and biases; and a gated unit after the GEMM (SwiGLU, GeGLU: N/2 outputs, each from features j
 * and N/2 + j rounded as the GEMM would store them). Inputs are fresh seeded uniform values rounded to the dtype, outputs poisoned with
 * NaN before every launch; every row and column is checked: relative error below 1e-2 (fp16)
 * or 2e-2 (bf16), no NaN or infinity anywhere.
 *
 * Then the timing (informational; "notime" skips it): gemv's default against cuBLASLt's first
 * heuristic choice and gemm_epilogue's default on a decode step's GEMMs (a Mistral-shaped 1B
 * model's and GPT-2's, their heads included; GPT-2's Conv1D weights are read transposed, so
 * [N, K] too, and two of its shapes [K, N] for that path), fp16, M = 1 and 8: the median of 15 launches, each
 * after 256 MiB written (the weights come from memory, as in a model many times L2's size),
 * with the weights' read rate. Exit 77 with "SKIPPED: <reason>" when
 * there is no GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu_open.h"
#include "core/base/util.h"
#include "core/exec/cublaslt/cublaslt_exec.h"
#include "core/exec/gemm/gemm_exec.h"

#define GPU_CTX_TYPE gemm_exec_ctx
#include "gpu_gemm_common.h"

/* ROWS (0: every row in one block), BLOCK_N, WARPS, UNROLL, STAGES; [N, K] and [K, N] each
 * ([N, K] with stages: chunks of 512 and 1024 elements, one or several rows a block; and two
 * outputs a warp over eight warps, a candidate default at one row). */
static const int nk_settings[][5] = {{0, 4, 4, 8, 0},  {2, 8, 8, 2, 0}, {0, 16, 4, 2, 0},
                                     {4, 64, 8, 2, 0}, {1, 16, 4, 4, 0}, {1, 8, 4, 2, 8},
                                     {0, 16, 8, 4, 8}, {1, 16, 8, 8, 0}};
static const int kn_settings[][5] = {{0, 16, 8, 8, 0}, {2, 8, 4, 2, 0},  {0, 128, 4, 4, 0},
                                     {4, 64, 8, 2, 0}, {1, 32, 8, 8, 0}, {1, 16, 8, 4, 0},
                                     {0, 32, 4, 8, 0}, {2, 16, 4, 4, 0}};
#define N_SETTINGS 8

static fusion_epilogue epilogue_of(int i) {
    fusion_epilogue e = {0};
    e.has_bias = i & 1;
    e.act = (fusion_act)((i >> 1) & 3);
    e.has_residual = (i >> 3) & 1;
    return e;
}

static int pow2_at_least(int m) {
    int r = 1;
    while (r < m)
        r *= 2;
    return r;
}

/* A norm ahead of the GEMM (the template's prologue): its kind, gain and bias (as floats and on
 * the device), and the reference set: the set's x normalized over K with fp64 statistics,
 * rounded to the dtype as the norm op would store it, and its products. The kernel gets the
 * set's x as it is. */
typedef struct prologue {
    fusion_norm kind;
    float eps;
    float *gamma, *beta;
    CUdeviceptr dgamma, dbeta;
    gset ref; /* the set's, but x and acc of the normalized rows */
} prologue;

static int make_prologue(gpu *g, prologue *pr, const gset *s, fusion_norm kind, util_rng *rng) {
    const gweights *wt = s->wt;
    const int N = wt->N, K = wt->K, M = s->M;
    memset(pr, 0, sizeof *pr);
    pr->kind = kind;
    pr->eps = kind == FUSION_NORM_LAYERNORM ? 1e-5f : 1e-6f;
    pr->ref = *s;
    pr->gamma = malloc(sizeof *pr->gamma * (size_t)K);
    pr->beta = malloc(sizeof *pr->beta * (size_t)K);
    pr->ref.x = malloc(sizeof *pr->ref.x * (size_t)M * K);
    pr->ref.acc = malloc(sizeof *pr->ref.acc * (size_t)MAX_REF_ROWS * N);
    uint16_t *gb = malloc((size_t)K * 2), *bb = malloc((size_t)K * 2);
    int rc = -1;
    if (pr->gamma && pr->beta && pr->ref.x && pr->ref.acc && gb && bb) {
        fill(pr->gamma, gb, (size_t)K, wt->dt, rng, 0.5, 1.5);
        fill(pr->beta, bb, (size_t)K, wt->dt, rng, -0.5, 0.5);
        for (int r = 0; r < M; r++) {
            const float *x = s->x + (size_t)r * K;
            double mean = 0.0, sq = 0.0;
            for (int k = 0; kind == FUSION_NORM_LAYERNORM && k < K; k++)
                mean += x[k];
            mean /= K;
            for (int k = 0; k < K; k++)
                sq += (x[k] - mean) * (x[k] - mean);
            const double rstd = 1.0 / sqrt(sq / K + pr->eps);
            for (int k = 0; k < K; k++) {
                double v = (x[k] - mean) * rstd * pr->gamma[k];
                if (kind == FUSION_NORM_LAYERNORM)
                    v += pr->beta[k];
                pr->ref.x[(size_t)r * K + k] = from_bits(wt->dt, to_bits(wt->dt, (float)v));
            }
        }
        for (int i = 0; i < s->n_rows; i++) {
            const float *xr = pr->ref.x + (size_t)s->rows[i] * K;
            for (int n = 0; n < N; n++) {
                const float *wr = wt->w + (size_t)n * K;
                double sum = 0.0;
                for (int k = 0; k < K; k++)
                    sum += (double)xr[k] * wr[k];
                pr->ref.acc[(size_t)i * N + n] = sum;
            }
        }
        rc = upload(g, &pr->dgamma, gb, (size_t)K * 2) || upload(g, &pr->dbeta, bb, (size_t)K * 2);
    }
    free(gb);
    free(bb);
    return rc;
}

static void free_prologue(gpu *g, prologue *pr) {
    free(pr->gamma);
    free(pr->beta);
    free(pr->ref.x);
    free(pr->ref.acc);
    dfree(g, &pr->dgamma);
    dfree(g, &pr->dbeta);
}

/* A gated unit after the GEMM (and its bias): output j of a reference row from features j and
 * N/2 + j, each rounded to the dtype as the GEMM's output would be, act(g) * u. */
static double glu_reference(const gset *s, int has_bias, int act, int i, int j) {
    const int N = s->wt->N, F = N / 2;
    const stof_dtype dt = s->wt->dt;
    double gv = s->acc[(size_t)i * N + j], uv = s->acc[(size_t)i * N + F + j];
    if (has_bias) {
        gv += s->wt->bias[j];
        uv += s->wt->bias[F + j];
    }
    gv = from_bits(dt, to_bits(dt, (float)gv));
    uv = from_bits(dt, to_bits(dt, (float)uv));
    const double a = act == STOF_ACT_SILU ? gv / (1.0 + exp(-gv))
                                          : act_ref(act == STOF_ACT_GELU ? FUSION_ACT_GELU
                                                                         : FUSION_ACT_GELU_TANH,
                                                    gv);
    return a * uv;
}

/* What judge_glu judges: the gated unit's bias and activation. */
typedef struct glu_how {
    int has_bias, act;
} glu_how;

static double glu_row_reference(const gset *s, const void *how, int i, int j) {
    const glu_how *h = how;
    return glu_reference(s, h->has_bias, h->act, i, j);
}

static void judge_glu(const gset *s, int has_bias, int act, const char *label) {
    const glu_how how = {has_bias, act};
    judge_rows(s, s->wt->N / 2, glu_row_reference, &how, label);
}

/* One case: setting -1 is the default; pr a norm ahead of the GEMM, or NULL; glu a gated
 * unit's activation after the GEMM (STOF_ACT_*; then epi only its bias), or 0. */
static void run_case(gpu *g, gset *s, int weight_kn, fusion_epilogue epi, int setting,
                     int in_place, const prologue *pr, int glu) {
    const gweights *wt = s->wt;
    const int N = wt->N, M = s->M;
    if (glu) {
        epi.act = FUSION_ACT_NONE;
        epi.has_residual = 0;
        in_place = 0;
    }
    gemm_exec_problem p = {.tmpl = FUSION_T_GEMV, .dtype = wt->dt, .m = M, .n = N, .k = wt->K,
                           .epi = epi, .weight_kn = weight_kn, .glu_act = glu};
    if (pr) {
        p.prologue = pr->kind;
        p.eps = pr->eps;
    }
    int v[FUSION_MAX_PARAMS] = {0};
    if (setting < 0) {
        gemm_exec_default_values(&p, g->ctx->arch, v);
    } else {
        memcpy(v, (weight_kn ? kn_settings : nk_settings)[setting], sizeof nk_settings[0]);
        if (v[0] == 0 || v[0] >= 2 * M)
            v[0] = pow2_at_least(M);
        if (glu && (v[1] / v[2]) % 2) /* an output's two features in one warp */
            v[1] *= 2;
        /* a setting the host check refuses (a norm's gains take registers too) runs with fewer
         * loads in flight, then fewer outputs a warp: the case still covers a setting other
         * than the default */
        const int smem = g->ctx->info.smem_per_block_optin, min_outs = glu ? 2 : 1;
        stof_error why = {0};
        while (v[3] > 2 && gemm_exec_check(&p, v, smem, &why))
            v[3] /= 2;
        while (!weight_kn && v[1] / v[2] > min_outs && gemm_exec_check(&p, v, smem, &why))
            v[1] /= 2;
    }
    char label[200];
    snprintf(label, sizeof label, "gemv %s M=%d N=%d K=%d %s%s %s%s%s%s r%d n%d w%d u%d s%d%s",
             stof_dtype_name(wt->dt), M, N, wt->K,
             !pr ? "" : pr->kind == FUSION_NORM_LAYERNORM ? "layernorm> " : "rmsnorm> ",
             weight_kn ? "W[K,N]" : "W[N,K]",
             !glu ? "" : glu == STOF_ACT_SILU ? "swiglu " : "geglu ",
             epi.has_bias ? "bias" : "-", act_label(epi.act),
             epi.has_residual ? (in_place ? "+add(in place)" : "+add") : "", v[0], v[1], v[2],
             v[3], v[4], setting < 0 ? " default" : "");
    stof_error err = {0};
    gemm_exec_plan *plan = NULL;
    int rc = gemm_exec_plan_create(g->ctx, &p, v, &plan, &err);
    if (rc) {
        n_runs++;
        printf("%-90s PLAN FAILED: %s\n", label, err.msg);
        CHECK_MSG(0, "%s: %s", label, err.msg);
        recap_add("%s: plan: %.160s", label, err.msg);
        g->dead |= rc == STOF_ERR_CUDA;
        return;
    }
    size_t mn = (size_t)M * (glu ? N / 2 : N);
    gemm_exec_gemm_tensors t = {.x = s->dx, .w = weight_kn ? wt->dw_kn : wt->dw_nk,
                                .bias = wt->db, .residual = in_place ? s->dy : s->dr,
                                .y = s->dy, .gamma = pr ? pr->dgamma : 0,
                                .beta = pr ? pr->dbeta : 0};
    rc = in_place ? check_cu(g, g->drv->MemcpyHtoD(s->dy, s->res_bits, mn * 2),
                             "cuMemcpyHtoD(y = residual)")
                  : poison(g, s->dy, mn);
    if (!rc && (rc = gemm_exec_gemm(g->ctx, plan, &t, 0, &err)) != STOF_OK) {
        n_runs++;
        printf("%-90s LAUNCH FAILED: %s\n", label, err.msg);
        CHECK_MSG(0, "%s: %s", label, err.msg);
        recap_add("%s: launch: %.160s", label, err.msg);
    }
    if (!rc && !fetch(g, s->hy, s->dy, mn)) { /* M <= MAX_REF_ROWS: every row is judged */
        if (glu)
            judge_glu(pr ? &pr->ref : s, epi.has_bias, glu, label);
        else
            judge_epilogue(pr ? &pr->ref : s, &epi, label);
    }
    gemm_exec_plan_free(g->ctx, plan);
}

static void test_shapes(gpu *g, util_rng *rng) {
    static const int Ms[] = {1, 2, 3, 5, 8, 13, 16};
    /* 1000 x 4104: at one row the default reads the weights through stages, K's last chunk
     * of 8 elements, N not a whole count of tiles */
    static const int shapes[][2] = {{768, 768},   {2304, 768},  {776, 1032},
                                    {3072, 2048}, {50257, 768}, {1000, 4104}};
    static const stof_dtype dts[] = {STOF_F16, STOF_BF16};
    int turn = 0;
    for (int d = 0; d < 2 && !g->dead; d++)
        for (int sh = 0; sh < 6 && !g->dead; sh++) {
            gweights wt;
            const int N = shapes[sh][0], K = shapes[sh][1];
            /* weights of about 1 / sqrt(K): outputs of the size of the bias and residual */
            if (make_weights_scaled(g, &wt, N, K, dts[d], sqrt(3.0 / K), rng)) {
                free_weights(g, &wt);
                return;
            }
            for (int mi = 0; mi < 7 && !g->dead; mi++) {
                if (N == 50257 && Ms[mi] != 1 && Ms[mi] != 8)
                    continue; /* the head: a step's batch of 1 and 8 */
                gset s;
                prologue pr;
                memset(&pr, 0, sizeof pr);
                const fusion_norm kind = mi % 2 ? FUSION_NORM_RMSNORM : FUSION_NORM_LAYERNORM;
                if (!make_set(g, &s, &wt, Ms[mi], rng) && !make_prologue(g, &pr, &s, kind, rng))
                    for (int kn = 0; kn < 2 && !g->dead; kn++) {
                        if (kn && N % 8)
                            continue;
                        run_case(g, &s, kn, epilogue_of(turn % 16), -1, 0, NULL, 0);
                        run_case(g, &s, kn, epilogue_of((turn + 5) % 16), turn % N_SETTINGS,
                                 turn % 3 == 0, NULL, 0);
                        /* a norm ahead, default and explicit settings in turn */
                        run_case(g, &s, kn, epilogue_of((turn + 9) % 16),
                                 turn % 2 ? -1 : (turn + 2) % N_SETTINGS, turn % 4 == 1, &pr, 0);
                        /* a gated unit after the GEMM ([N, K], an even N), with or without the
                         * norm ahead */
                        static const int glus[] = {STOF_ACT_SILU, STOF_ACT_GELU,
                                                   STOF_ACT_GELU_TANH};
                        if (!kn && N % 2 == 0)
                            run_case(g, &s, kn, epilogue_of(turn / 2 % 2),
                                     turn % 3 ? -1 : turn / 3 % N_SETTINGS, 0,
                                     turn % 2 ? &pr : NULL, glus[turn / 4 % 3]);
                        turn++;
                    }
                free_prologue(g, &pr);
                free_set(g, &s);
            }
            free_weights(g, &wt);
        }
}

/* ---- timing ---------------------------------------------------------------------------- */

#define TIME_REPS 15
#define FLUSH_BYTES ((size_t)256 << 20) /* past any L2 */

typedef int (*launch_fn)(void *ud, stof_error *err);

/* Median us of one launch with the weights in memory, not in L2 (as in a model whose weights
 * are many times L2): 256 MiB written before each; negative on failure. */
static double time_us(gpu *g, CUdeviceptr flush, launch_fn fn, void *ud) {
    CUevent ev[2] = {0, 0};
    float ms[TIME_REPS];
    stof_error err = {0};
    int rc = check_cu(g, g->drv->EventCreate(&ev[0], CU_EVENT_DEFAULT), "cuEventCreate") ||
             check_cu(g, g->drv->EventCreate(&ev[1], CU_EVENT_DEFAULT), "cuEventCreate");
    for (int i = 0; i < 3 && !rc; i++)
        rc = fn(ud, &err);
    for (int b = 0; b < TIME_REPS && !rc; b++)
        rc = check_cu(g, g->drv->MemsetD8Async(flush, (unsigned char)b, FLUSH_BYTES, 0),
                      "cuMemsetD8Async(flush)") ||
             check_cu(g, g->drv->EventRecord(ev[0], 0), "cuEventRecord") || fn(ud, &err) ||
             check_cu(g, g->drv->EventRecord(ev[1], 0), "cuEventRecord") ||
             check_cu(g, g->drv->EventSynchronize(ev[1]), "cuEventSynchronize") ||
             check_cu(g, g->drv->EventElapsedTime(&ms[b], ev[0], ev[1]), "cuEventElapsedTime");
    for (int i = 0; i < 2; i++)
        if (ev[i])
            g->drv->EventDestroy(ev[i]);
    if (rc) {
        printf("  failed: %s\n", err.msg);
        return -1.0;
    }
    qsort(ms, TIME_REPS, sizeof ms[0], cmp_float);
    return ms[TIME_REPS / 2] * 1000.0;
}

typedef struct own_launch {
    gemm_exec_ctx *ctx;
    gemm_exec_plan *plan;
    const gemm_exec_gemm_tensors *t;
} own_launch;

static int launch_own(void *ud, stof_error *err) {
    own_launch *l = ud;
    return gemm_exec_gemm(l->ctx, l->plan, l->t, 0, err);
}

typedef struct lt_launch {
    cublaslt_exec_ctx *ctx;
    cublaslt_exec_plan *plan;
    const gemm_exec_gemm_tensors *t;
} lt_launch;

static int launch_lt(void *ud, stof_error *err) {
    lt_launch *l = ud;
    return cublaslt_exec_gemm(l->ctx, l->plan, l->t, 0, err);
}

/* One of our templates at its default setting: us a launch, or -1 (and why) when it cannot. */
static double time_own(gpu *g, CUdeviceptr flush, gemm_exec_problem p,
                       const gemm_exec_gemm_tensors *t, char *why, size_t why_n) {
    gemm_exec_plan *plan = NULL;
    stof_error err = {0};
    if (gemm_exec_plan_create(g->ctx, &p, NULL, &plan, &err)) {
        snprintf(why, why_n, "%.60s", err.msg);
        return -1.0;
    }
    own_launch l = {g->ctx, plan, t};
    double us = time_us(g, flush, launch_own, &l);
    gemm_exec_plan_free(g->ctx, plan);
    return us;
}

static double time_lt(gpu *g, CUdeviceptr flush, cublaslt_exec_ctx *lt, gemm_exec_problem p,
                      const gemm_exec_gemm_tensors *t) {
    if (!lt)
        return -1.0;
    p.tmpl = FUSION_T_CUBLASLT;
    cublaslt_exec_plan *plan = NULL;
    stof_error err = {0};
    if (cublaslt_exec_plan_create(lt, &p, NULL, &plan, &err))
        return -1.0;
    lt_launch l = {lt, plan, t};
    double us = time_us(g, flush, launch_lt, &l);
    cublaslt_exec_plan_free(lt, plan);
    return us;
}

typedef struct time_shape {
    const char *what;
    int n, k, weight_kn;
} time_shape;

static void timing(gpu *g, util_rng *rng) {
    static const time_shape shapes[] = {
        {"1B qkv", 3072, 2048, 0},        {"1B o", 2048, 2048, 0},
        {"1B gate+up", 16384, 2048, 0},   {"1B down", 2048, 8192, 0},
        {"1B head", 32000, 2048, 0},      {"gpt2 qkv", 2304, 768, 0},
        {"gpt2 o", 768, 768, 0},          {"gpt2 fc", 3072, 768, 0},
        {"gpt2 proj", 768, 3072, 0},      {"gpt2 head", 50257, 768, 0},
        {"gpt2-large fc", 5120, 1280, 0}, {"[K, N] 2304x768", 2304, 768, 1},
        {"[K, N] 768x3072", 768, 3072, 1},
    };
    static const int Ms[] = {1, 8};
    cublaslt_exec_ctx *lt = NULL;
    CUdeviceptr flush = 0;
    stof_error err = {0};
    if (dalloc(g, &flush, FLUSH_BYTES))
        return;
    if (cublaslt_exec_ctx_create(0, &lt, &err))
        printf("cuBLASLt: %s (its column is empty)\n", err.msg);
    printf("\ntiming, fp16, us a launch, the weights in memory (L2 flushed before each; median "
           "of %d) and the weights' read rate:\n", TIME_REPS);
    printf("  %-14s %2s %6s %6s %6s  %9s %9s %9s  %s\n", "GEMM", "M", "N", "K", "layout",
           "gemv", "cublaslt", "gemm_epi", "gemv GB/s");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0] && !g->dead; i++) {
        const time_shape *sh = &shapes[i];
        gweights wt;
        if (make_weights_scaled(g, &wt, sh->n, sh->k, STOF_F16, sqrt(3.0 / sh->k), rng)) {
            free_weights(g, &wt);
            break;
        }
        for (int mi = 0; mi < 2 && !g->dead; mi++) {
            gset s;
            if (make_set(g, &s, &wt, Ms[mi], rng)) {
                free_set(g, &s);
                continue;
            }
            gemm_exec_problem p = {.tmpl = FUSION_T_GEMV, .dtype = STOF_F16, .m = Ms[mi],
                                   .n = sh->n, .k = sh->k, .weight_kn = sh->weight_kn};
            gemm_exec_gemm_tensors t = {.x = s.dx, .w = sh->weight_kn ? wt.dw_kn : wt.dw_nk,
                                        .y = s.dy};
            char why[64] = "";
            double gv = time_own(g, flush, p, &t, why, sizeof why);
            double lt_us = time_lt(g, flush, lt, p, &t);
            p.tmpl = FUSION_T_GEMM_EPILOGUE;
            char why2[64] = "";
            double ep = time_own(g, flush, p, &t, why2, sizeof why2);
            double bytes = 2.0 * sh->n * sh->k;
            printf("time %-14s %2d %6d %6d %6s  %9.2f %9.2f %9.2f  %6.0f\n", sh->what, Ms[mi],
                   sh->n, sh->k, sh->weight_kn ? "[K,N]" : "[N,K]", gv, lt_us, ep,
                   gv > 0 ? bytes / (gv * 1e3) : 0.0);
            free_set(g, &s);
        }
        free_weights(g, &wt);
    }
    cublaslt_exec_ctx_free(lt);
    dfree(g, &flush);
}

int main(int argc, char **argv) {
    gpu g = {0};
    GPU_TEST_OPEN(gemm_exec_ctx_create, g.ctx, "gpu_gemv");
    g.drv = g.ctx->drv;
    printf("GPU: %s (%s, %d SMs)\n", g.ctx->info.name, g.ctx->arch, g.ctx->info.sm_count);
    util_rng rng = {20261126};
    double t0 = util_now();
    test_shapes(&g, &rng);
    printf("correctness: %.1f s\n", util_now() - t0);
    if (g.dead)
        printf("STOPPED EARLY: a CUDA error left the context unusable (see above)\n");
    if (!(argc > 1 && !strcmp(argv[1], "notime")) && !g.dead)
        timing(&g, &rng);
    gemm_exec_ctx_free(g.ctx);
    recap_print();
    return check_summary("gpu_gemv");
}
