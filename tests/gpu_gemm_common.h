/* What the GEMM tests (gpu_gemm, gpu_cublaslt) share on top of
 * gpu_common.h: seeded fills, the fp64 activations, the error verdict and
 * its report line, and the weights and input sets with their fp64 reference
 * rows (every row up to MAX_REF_ROWS, else MAX_REF_ROWS chosen ones). */
#ifndef STOF_TESTS_GPU_GEMM_COMMON_H
#define STOF_TESTS_GPU_GEMM_COMMON_H

#include "fusion/match.h"
#include "gpu_common.h"

#define TOL_F16 1e-2
#define TOL_BF16 2e-2
#define MAX_REF_ROWS 16

/* ---- values ------------------------------------------------------------------------- */

/* n uniform values in [lo, hi) rounded to the dtype, as floats and as bits. */
static inline void fill(float *x, uint16_t *bits, size_t n, stof_dtype t, util_rng *rng,
                        double lo, double hi) {
    for (size_t i = 0; i < n; i++) {
        bits[i] = to_bits(t, (float)(lo + (hi - lo) * util_rng_double(rng)));
        x[i] = from_bits(t, bits[i]);
    }
}

static inline double act_ref(fusion_act a, double v) {
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

static inline const char *act_label(fusion_act a) {
    static const char *const names[] = {"", "+gelu", "+gelu_tanh", "+relu"};
    return names[a];
}

static inline double tol_of(stof_dtype t) {
    return t == STOF_BF16 ? TOL_BF16 : TOL_F16;
}

/* ---- comparing ------------------------------------------------------------------------ */

typedef struct verdict {
    double num, den, max_abs;
    long nonfinite, checked;
    long first_bad; /* element index of the first large error, or -1 */
} verdict;

static inline void verdict_init(verdict *v) {
    memset(v, 0, sizeof *v);
    v->first_bad = -1;
}

static inline void verdict_add(verdict *v, float y, double ref, long at) {
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

static inline double verdict_rel(const verdict *v) {
    return v->den > 0 ? sqrt(v->num / v->den) : sqrt(v->num);
}

/* Non-finite values anywhere in out (the rows not in the reference too). */
static inline long count_nonfinite(const uint16_t *out, size_t n, stof_dtype t) {
    long bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += !isfinite(from_bits(t, out[i]));
    return bad;
}

/* One result line; a failure also goes to the recap. */
static inline void report(const char *label, const verdict *v, long nonfinite_all, double tol,
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

/* ---- GEMM weights and input sets ------------------------------------------------------ */

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

/* Weights uniform in [-range, range) (the bias in [-1, 1)). */
static inline int make_weights_scaled(gpu *g, gweights *wt, int N, int K, stof_dtype dt,
                                      double range, util_rng *rng) {
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
        fill(wt->w, bits, nk, dt, rng, -range, range);
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

static inline int make_weights(gpu *g, gweights *wt, int N, int K, stof_dtype dt,
                               util_rng *rng) {
    return make_weights_scaled(g, wt, N, K, dt, 1.0, rng);
}

static inline void free_weights(gpu *g, gweights *wt) {
    free(wt->w);
    free(wt->bias);
    dfree(g, &wt->dw_nk);
    dfree(g, &wt->dw_kn);
    dfree(g, &wt->db);
}

static inline int has_row(const gset *s, int r) {
    for (int i = 0; i < s->n_rows; i++)
        if (s->rows[i] == r)
            return 1;
    return 0;
}

/* Every row up to MAX_REF_ROWS; else the first two, the last two, the
 * edges of 64-, 128- and 256-row tiles, and random rows. */
static inline void pick_rows(gset *s, util_rng *rng) {
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

static inline int make_set(gpu *g, gset *s, const gweights *wt, int M, util_rng *rng) {
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

static inline void free_set(gpu *g, gset *s) {
    free(s->x);
    free(s->res);
    free(s->res_bits);
    free(s->hy);
    free(s->acc);
    dfree(g, &s->dx);
    dfree(g, &s->dr);
    dfree(g, &s->dy);
}

/* ---- judging a GEMM's output against its epilogue's reference -------------------------- */

/* The reference of reference row i (row rows[i] of the set), column n: x w^T, then the
 * epilogue (bias, activation, residual). */
static inline double epilogue_reference(const gset *s, const fusion_epilogue *epi, int i, int n) {
    const int N = s->wt->N;
    double ref = s->acc[(size_t)i * N + n];
    if (epi->has_bias)
        ref += s->wt->bias[n];
    ref = act_ref(epi->act, ref);
    if (epi->has_residual)
        ref += s->res[(size_t)s->rows[i] * N + n];
    return ref;
}

/* A reference output of the set: reference row i, output n; how: what the caller judges. */
typedef double (*row_reference)(const gset *s, const void *how, int i, int n);

/* Checks the packed output fetched into s->hy, width outputs a row, against ref on the set's
 * reference rows, and reports it (report()). */
static inline void judge_rows(const gset *s, int width, row_reference ref, const void *how,
                              const char *label) {
    const stof_dtype dt = s->wt->dt;
    verdict v;
    verdict_init(&v);
    for (int i = 0; i < s->n_rows; i++)
        for (int n = 0; n < width; n++) {
            long at = (long)s->rows[i] * width + n;
            verdict_add(&v, from_bits(dt, s->hy[at]), ref(s, how, i, n), at);
        }
    char where[160] = "";
    if (v.first_bad >= 0)
        snprintf(where, sizeof where, "first bad: row %ld col %ld = %g", v.first_bad / width,
                 v.first_bad % width, from_bits(dt, s->hy[v.first_bad]));
    report(label, &v, count_nonfinite(s->hy, (size_t)s->M * width, dt), tol_of(dt), where);
}

static inline double epilogue_row_reference(const gset *s, const void *how, int i, int n) {
    return epilogue_reference(s, how, i, n);
}

/* The epilogue's outputs against its reference (judge_rows). */
static inline void judge_epilogue(const gset *s, const fusion_epilogue *epi, const char *label) {
    judge_rows(s, s->wt->N, epilogue_row_reference, epi, label);
}

#endif
