/* The operator table: shape rules and their error messages, costs on
 * hand-worked examples, and every fp32 reference against a direct
 * computation written here along a different path (naive loops, dense
 * score matrices, double accumulation). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/base/error.h"
#include "core/graph/graph.h"
#include "core/base/util.h"
#include "ops/mask.h"
#include "ops/ops.h"

/* ---- helpers: graphs ------------------------------------------------------ */

static int add_tensor(graph *g, const char *name, stof_dtype dtype, const int64_t *shape,
                      int ndim) {
    graph_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.role = GRAPH_INPUT;
    t.dtype = dtype;
    t.ndim = ndim;
    memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    int id = -1;
    stof_error err = {0};
    int rc = graph_add_tensor(g, &t, &id, &err);
    CHECK_MSG(rc == STOF_OK, "adding '%s': %s", name, err.msg);
    return id;
}

/* A shape literal and its rank: DIMS(2, 3, 8) */
#define DIMS(...) \
    (const int64_t[]){__VA_ARGS__}, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
#define TENSOR(g, name, dtype, ...) add_tensor(g, name, dtype, DIMS(__VA_ARGS__))

static graph_op make_op(op_kind kind, const int *inputs, int n) {
    graph_op op;
    memset(&op, 0, sizeof op);
    op.kind = kind;
    op.n_inputs = n;
    memcpy(op.inputs, inputs, (size_t)n * sizeof *inputs);
    op.layer = -1;
    op.attr.attn.mask = -1;
    return op;
}

#define OP(kind, ...) \
    make_op(kind, (const int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)))

/* Adds op; returns its output tensor, or -1 with err filled. */
static int add_op(graph *g, const graph_op *op, stof_error *err) {
    int out = -1;
    err_clear(err);
    return op_add(g, op, &out, err) == STOF_OK ? out : -1;
}

/* Adds op, expecting it to be rejected with code and a message holding each
 * of the NULL-terminated needles. */
static void expect_reject(graph *g, const graph_op *op, int code, const char *const *needles) {
    stof_error err = {0};
    int before = g->n_ops;
    CHECK_EQ_INT(add_op(g, op, &err), -1);
    CHECK_EQ_INT(err.code, code);
    CHECK_EQ_INT(g->n_ops, before);
    for (int k = 0; needles[k]; k++)
        CHECK_CONTAINS(err.msg, needles[k]);
}

#define REJECT(g, op, code, ...) \
    expect_reject(g, op, code, (const char *const[]){__VA_ARGS__, NULL})

static const graph_tensor *output_of(const graph *g, int out) {
    return &g->tensors[out];
}

static int same_shape_as(const graph_tensor *t, const int64_t *shape, int ndim) {
    if (t->ndim != ndim)
        return 0;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d])
            return 0;
    return 1;
}

#define CHECK_SHAPE(t, ...) CHECK(same_shape_as(t, DIMS(__VA_ARGS__)))

/* The op that produced tensor out. */
static const graph_op *producer(const graph *g, int out) {
    return &g->ops[g->tensors[out].producer];
}

/* ---- helpers: numbers ----------------------------------------------------- */

static float *random_floats(util_rng *rng, int64_t n, double lo, double hi) {
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)(lo + (hi - lo) * util_rng_double(rng));
    return p;
}

static double *zeros_d(int64_t n) {
    return calloc((size_t)n, sizeof(double));
}

/* Largest |got - want| / max(1, |want|). */
static double max_rel_err(const float *got, const double *want, int64_t n) {
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double scale = fabs(want[i]) > 1.0 ? fabs(want[i]) : 1.0;
        double e = fabs((double)got[i] - want[i]) / scale;
        if (!(e <= worst)) /* NaN counts as the worst */
            worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

#define TOL 1e-5

/* Runs the reference of the op that made tensor out. */
static float *run_ref(const graph *g, int out, const float *const *in, int expect_rc,
                      stof_error *err) {
    const graph_op *op = producer(g, out);
    float *y = malloc((size_t)graph_tensor_numel(output_of(g, out)) * sizeof *y);
    err_clear(err);
    int rc = op_describe(op->kind)->ref(g, op, in, y, err);
    CHECK_MSG(rc == expect_rc, "ref of %s returned %d (%s)", op->name, rc, err->msg);
    return y;
}

/* ---- the table ------------------------------------------------------------ */

static void test_table(void) {
    static const char *const names[OP_KIND_COUNT] = {
        [OP_GEMM] = "gemm",
        [OP_BIAS] = "bias",
        [OP_ADD] = "add",
        [OP_LAYERNORM] = "layernorm",
        [OP_RMSNORM] = "rmsnorm",
        [OP_GELU] = "gelu",
        [OP_RELU] = "relu",
        [OP_SOFTMAX] = "softmax",
        [OP_EMBEDDING] = "embedding",
        [OP_ATTENTION] = "attention",
        [OP_GLU] = "glu",
        [OP_ROTARY] = "rotary",
        [OP_MASK_ROWS] = "mask_rows",
    };
    for (int k = 0; k < OP_KIND_COUNT; k++) {
        const op_desc *d = op_describe((op_kind)k);
        CHECK_MSG(d != NULL, "kind %d has no row", k);
        if (!d)
            continue;
        CHECK_EQ_INT(d->kind, k);
        CHECK_MSG(strcmp(d->name, names[k]) == 0, "kind %d is '%s'", k, d->name);
        CHECK_EQ_INT(op_kind_from_name(names[k]), k);
        CHECK(d->infer && d->cost && d->ref);
        CHECK(d->min_inputs >= 1 && d->min_inputs <= d->max_inputs &&
              d->max_inputs <= GRAPH_MAX_INPUTS);
        int ci = k == OP_GEMM || k == OP_ATTENTION;
        CHECK_EQ_INT(d->cls, ci ? OP_CLASS_CI : OP_CLASS_MI);
    }
    CHECK(op_describe(OP_KIND_COUNT) == NULL);
    CHECK(op_describe((op_kind)-1) == NULL);
    CHECK_EQ_INT(op_kind_from_name("conv2d"), -1);
    CHECK_EQ_INT(op_kind_from_name("GEMM"), -1);
    CHECK_EQ_INT(op_kind_from_name(NULL), -1);
    CHECK(strcmp(op_class_name(OP_CLASS_CI), "CI") == 0);
    CHECK(strcmp(op_class_name(OP_CLASS_MI), "MI") == 0);
    CHECK_EQ_INT(op_describe(OP_EMBEDDING)->max_inputs, 6);
    CHECK_EQ_INT(op_describe(OP_ATTENTION)->max_inputs, 4);
}

/* ---- gemm and bias -------------------------------------------------------- */

static void test_gemm_shapes(void) {
    graph g;
    graph_init(&g);
    stof_error err = {0};
    int x = TENSOR(&g, "x", STOF_F32, 2, 3, 8);
    int w_nk = TENSOR(&g, "w_nk", STOF_F32, 16, 8);
    int w_kn = TENSOR(&g, "w_kn", STOF_F32, 8, 16);
    graph_op op = OP(OP_GEMM, x, w_nk);
    int y = add_op(&g, &op, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    CHECK_SHAPE(output_of(&g, y), 2, 3, 16);
    CHECK_EQ_INT(output_of(&g, y)->dtype, STOF_F32);

    op = OP(OP_GEMM, x, w_kn);
    op.attr.gemm.weight_kn = 1;
    y = add_op(&g, &op, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    CHECK_SHAPE(output_of(&g, y), 2, 3, 16);

    /* [K, N] weights read as [N, K]: K = 16 does not match x's 8 features */
    op = OP(OP_GEMM, x, w_kn);
    REJECT(&g, &op, STOF_ERR_SHAPE, "gemm", "8 features", "expects 16", "[N, K]");
    op.attr.gemm.weight_kn = 1;
    op.inputs[1] = w_nk;
    REJECT(&g, &op, STOF_ERR_SHAPE, "expects 16", "[K, N]");

    /* the brief's example, with the op's name in front */
    int x768 = TENSOR(&g, "hidden", STOF_F32, 4, 768);
    int w_bad = TENSOR(&g, "w_bad", STOF_F32, 1024, 512);
    op = OP(OP_GEMM, x768, w_bad);
    snprintf(op.name, sizeof op.name, "l0.qkv");
    REJECT(&g, &op, STOF_ERR_SHAPE, "gemm 'l0.qkv': ", "x 'hidden' [4, 768] has 768 features",
           "W 'w_bad' [1024, 512] expects 512");

    int w3 = TENSOR(&g, "w3", STOF_F32, 2, 16, 8);
    op = OP(OP_GEMM, x, w3);
    REJECT(&g, &op, STOF_ERR_SHAPE, "W 'w3'", "rank 2", "got rank 3");

    int ids = TENSOR(&g, "ids", STOF_I32, 2, 3, 8);
    op = OP(OP_GEMM, ids, w_nk);
    REJECT(&g, &op, STOF_ERR_INVALID, "x 'ids'", "fp32, fp16 or bf16", "int32");

    int w16 = TENSOR(&g, "w16", STOF_F16, 16, 8);
    op = OP(OP_GEMM, x, w16);
    REJECT(&g, &op, STOF_ERR_INVALID, "W 'w16' is fp16", "x 'x' is fp32", "must match");

    op = OP(OP_GEMM, x);
    REJECT(&g, &op, STOF_ERR_INVALID, "gemm takes 2 to 2 inputs, got 1");

    /* W computed by the model (here x's product): refused, a weight or an input only */
    int x2 = TENSOR(&g, "x2", STOF_F32, 4, 8);
    op = OP(OP_GEMM, x2, w_nk);
    int made = add_op(&g, &op, &err); /* [4, 16] */
    CHECK_MSG(made >= 0, "%s", err.msg);
    int x16w = TENSOR(&g, "x16w", STOF_F32, 3, 16);
    op = OP(OP_GEMM, x16w, made);
    REJECT(&g, &op, STOF_ERR_UNSUPPORTED, "is computed by the model",
           "a weight (m:weight) or a model input");

    /* half precision flows through */
    int x16 = TENSOR(&g, "x16", STOF_F16, 5, 8);
    op = OP(OP_GEMM, x16, w16);
    y = add_op(&g, &op, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    CHECK_EQ_INT(output_of(&g, y)->dtype, STOF_F16);
    CHECK_SHAPE(output_of(&g, y), 5, 16);
    int xb = TENSOR(&g, "xb", STOF_BF16, 8);
    int wb = TENSOR(&g, "wb", STOF_BF16, 8, 3);
    op = OP(OP_GEMM, xb, wb);
    op.attr.gemm.weight_kn = 1;
    y = add_op(&g, &op, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    CHECK_EQ_INT(output_of(&g, y)->dtype, STOF_BF16);
    CHECK_SHAPE(output_of(&g, y), 3);
    graph_free(&g);
}

/* x [B, S, K] times W stored [N, K] and [K, N] against an fp64 reference; the two layouts'
 * outputs bit for bit the same (each output's sum runs over k in order either way). */
static void check_gemm_ref(int B, int S, int K, int N) {
    graph g;
    graph_init(&g);
    stof_error err = {0};
    util_rng rng = {42};
    int x = TENSOR(&g, "x", STOF_F32, B, S, K);
    int w_nk = TENSOR(&g, "w_nk", STOF_F32, N, K);
    int w_kn = TENSOR(&g, "w_kn", STOF_F32, K, N);
    graph_op op = OP(OP_GEMM, x, w_nk);
    int y_nk = add_op(&g, &op, &err);
    op = OP(OP_GEMM, x, w_kn);
    op.attr.gemm.weight_kn = 1;
    int y_kn = add_op(&g, &op, &err);
    CHECK(y_nk >= 0 && y_kn >= 0);

    float *xs = random_floats(&rng, B * S * K, -1, 1);
    float *ws = random_floats(&rng, N * K, -1, 1);
    float *ws_kn = malloc(sizeof(float) * N * K);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            ws_kn[k * N + n] = ws[n * K + k];
    double *want = zeros_d(B * S * N);
    for (int m = 0; m < B * S; m++)
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++)
                want[m * N + n] += (double)xs[m * K + k] * ws[n * K + k];

    float *got = run_ref(&g, y_nk, (const float *const[]){xs, ws}, STOF_OK, &err);
    float *got_kn = run_ref(&g, y_kn, (const float *const[]){xs, ws_kn}, STOF_OK, &err);
    CHECK_NEAR(max_rel_err(got, want, B * S * N), 0, TOL);
    CHECK_NEAR(max_rel_err(got_kn, want, B * S * N), 0, TOL);
    CHECK_MSG(got && got_kn && memcmp(got, got_kn, sizeof *got * (size_t)(B * S * N)) == 0,
              "gemm [%d, %d] x [%d, %d]: the [N, K] and [K, N] outputs differ", B * S, K, K, N);
    free(got);
    free(got_kn);
    free(want);
    free(ws_kn);
    free(ws);
    free(xs);
    graph_free(&g);
}

static void test_gemm_ref(void) {
    check_gemm_ref(2, 5, 37, 19);  /* 10 rows: one full block of 8 and a tail */
    check_gemm_ref(1, 3, 40, 150); /* [N, K] a tile of outputs at a time: two and a tail */
    check_gemm_ref(1, 1, 8, 1);    /* a decode step's one row, one output */
    check_gemm_ref(5, 14, 20, 70); /* 70 rows: [N, K] transposed whole first */
}

static void test_gemm_cost(void) {
    /* bert-base QKV projection at B = 8, S = 512, fp16 */
    graph g;
    graph_init(&g);
    stof_error err = {0};
    int x = TENSOR(&g, "x", STOF_F16, 8, 512, 768);
    int w = TENSOR(&g, "w", STOF_F16, 2304, 768);
    graph_op op = OP(OP_GEMM, x, w);
    int y = add_op(&g, &op, &err);
    double flops, bytes;
    op_cost(&g, producer(&g, y), &flops, &bytes);
    CHECK_NEAR(flops, 2.0 * 4096 * 2304 * 768, 0);
    CHECK_NEAR(bytes, 2.0 * (4096.0 * 768 + 2304.0 * 768 + 4096.0 * 2304), 0);
    /* the same through the table */
    double f2, b2;
    op_describe(OP_GEMM)->cost(&g, producer(&g, y), &f2, &b2);
    CHECK(f2 == flops && b2 == bytes);
    graph_free(&g);
}

static void test_bias(void) {
    enum { R = 6, N = 10 };
    graph g;
    graph_init(&g);
    stof_error err = {0};
    util_rng rng = {7};
    int x = TENSOR(&g, "x", STOF_F32, 2, 3, N);
    int b = TENSOR(&g, "b", STOF_F32, N);
    int b_short = TENSOR(&g, "b_short", STOF_F32, N - 1);
    int b_2d = TENSOR(&g, "b_2d", STOF_F32, 1, N);
    int b16 = TENSOR(&g, "b16", STOF_F16, N);
    graph_op op = OP(OP_BIAS, x, b);
    int y = add_op(&g, &op, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    CHECK_SHAPE(output_of(&g, y), 2, 3, N);

    op = OP(OP_BIAS, x, b_short);
    REJECT(&g, &op, STOF_ERR_SHAPE, "bias", "b 'b_short' [9]", "must be [10]");
    op = OP(OP_BIAS, x, b_2d);
    REJECT(&g, &op, STOF_ERR_SHAPE, "b 'b_2d' [1, 10]", "must be [10]");
    op = OP(OP_BIAS, x, b16);
    REJECT(&g, &op, STOF_ERR_INVALID, "b 'b16' is fp16");

    float *xs = random_floats(&rng, R * N, -2, 2), *bs = random_floats(&rng, N, -2, 2);
    double *want = zeros_d(R * N);
    for (int r = 0; r < R; r++)
        for (int n = 0; n < N; n++)
            want[r * N + n] = (double)xs[r * N + n] + bs[n];
    float *got = run_ref(&g, y, (const float *const[]){xs, bs}, STOF_OK, &err);
    CHECK_NEAR(max_rel_err(got, want, R * N), 0, TOL);

    double flops, bytes;
    op_cost(&g, producer(&g, y), &flops, &bytes);
    CHECK_NEAR(flops, R * N, 0);
    CHECK_NEAR(bytes, 4.0 * (R * N + N + R * N), 0);
    free(got);
    free(want);
    free(bs);
    free(xs);
    graph_free(&g);
}

/* ---- element-wise --------------------------------------------------------- */

static void test_add(void) {
    enum { N = 24 };
    graph g;
    graph_init(&g);
    stof_error err = {0};
    util_rng rng = {8};
    int a = TENSOR(&g, "a", STOF_F32, 4, 6);
    int b = TENSOR(&g, "b", STOF_F32, 4, 6);
    int c = TENSOR(&g, "c", STOF_F32, 6, 4);
    int d = TENSOR(&g, "d", STOF_F32, 4, 6, 1);
    int h = TENSOR(&g, "h", STOF_BF16, 4, 6);
    graph_op op = OP(OP_ADD, a, b);
    int y = add_op(&g, &op, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    CHECK_SHAPE(output_of(&g, y), 4, 6);
    op = OP(OP_ADD, a, c);
    REJECT(&g, &op, STOF_ERR_SHAPE, "add", "a 'a' [4, 6] and b 'c' [6, 4]", "same shape");
    op = OP(OP_ADD, a, d);
    REJECT(&g, &op, STOF_ERR_SHAPE, "[4, 6, 1]", "same shape");
    op = OP(OP_ADD, a, h);
    REJECT(&g, &op, STOF_ERR_INVALID, "bf16", "must match");

    float *as = random_floats(&rng, N, -1, 1), *bs = random_floats(&rng, N, -1, 1);
    double want[N];
    for (int i = 0; i < N; i++)
        want[i] = (double)as[i] + bs[i];
    float *got = run_ref(&g, y, (const float *const[]){as, bs}, STOF_OK, &err);
    CHECK_NEAR(max_rel_err(got, want, N), 0, TOL);
    double flops, bytes;
    op_cost(&g, producer(&g, y), &flops, &bytes);
    CHECK_NEAR(flops, N, 0);
    CHECK_NEAR(bytes, 3.0 * 4 * N, 0);
    free(got);
    free(bs);
    free(as);
    graph_free(&g);
}

static void test_gelu_helpers(void) {
    /* Phi(1) and the GPT-2 approximation at 1, from the closed forms */
    CHECK_NEAR(op_gelu_erf(1.0f), 0.8413447460685429, 1e-7);
    CHECK_NEAR(op_gelu_tanh(1.0f), 0.8411919906082768, 1e-7);
    CHECK_NEAR(op_gelu_erf(-3.0f), -0.0040496940948903, 1e-9);
    CHECK_NEAR(op_gelu_tanh(-3.0f), -0.0036373920817729, 1e-9);
    CHECK(op_gelu_erf(0.0f) == 0.0f && op_gelu_tanh(0.0f) == 0.0f);
    CHECK_NEAR(op_gelu_erf(10.0f), 10.0, 1e-6);
}

static void test_activations(void) {
    enum { R = 3, N = 17 };
    graph g;
    graph_init(&g);
    stof_error err = {0};
    util_rng rng = {9};
    int x = TENSOR(&g, "x", STOF_F32, R, N);
    int ids = TENSOR(&g, "ids", STOF_I32, R, N);
    int x16 = TENSOR(&g, "x16", STOF_F16, R, N);
    graph_op op = OP(OP_GELU, x);
    int y_erf = add_op(&g, &op, &err);
    op.attr.gelu.tanh = 1;
    int y_tanh = add_op(&g, &op, &err);
    op = OP(OP_RELU, x);
    int y_relu = add_op(&g, &op, &err);
    op = OP(OP_SOFTMAX, x);
    int y_soft = add_op(&g, &op, &err);
    CHECK(y_erf >= 0 && y_tanh >= 0 && y_relu >= 0 && y_soft >= 0);
    CHECK_SHAPE(output_of(&g, y_soft), R, N);

    op_kind unary[] = {OP_GELU, OP_RELU, OP_SOFTMAX};
    for (int k = 0; k < 3; k++) {
        op = OP(unary[k], ids);
        REJECT(&g, &op, STOF_ERR_INVALID, op_describe(unary[k])->name, "x 'ids'", "int32");
        op = OP(unary[k], x16);
        int y = add_op(&g, &op, &err);
        CHECK(y >= 0 && output_of(&g, y)->dtype == STOF_F16);
    }

    float *xs = random_floats(&rng, R * N, -4, 4);
    double want[R * N];
    const double c = sqrt(2.0 / 3.14159265358979323846);
    for (int i = 0; i < R * N; i++)
        want[i] = xs[i] * 0.5 * erfc(-xs[i] / sqrt(2.0));
    float *got = run_ref(&g, y_erf, (const float *const[]){xs}, STOF_OK, &err);
    CHECK_NEAR(max_rel_err(got, want, R * N), 0, TOL);
    free(got);
    for (int i = 0; i < R * N; i++) {
        double v = xs[i];
        want[i] = v / (1.0 + exp(-2.0 * c * (v + 0.044715 * v * v * v)));
    }
    got = run_ref(&g, y_tanh, (const float *const[]){xs}, STOF_OK, &err);
    CHECK_NEAR(max_rel_err(got, want, R * N), 0, TOL);
    free(got);
    for (int i = 0; i < R * N; i++)
        want[i] = xs[i] < 0 ? 0.0 : xs[i];
    got = run_ref(&g, y_relu, (const float *const[]){xs}, STOF_OK, &err);
    CHECK_NEAR(max_rel_err(got, want, R * N), 0, 0);
    free(got);
    /* softmax directly (no max subtraction: inputs are small) */
    for (int r = 0; r < R; r++) {
        double sum = 0.0;
        for (int j = 0; j < N; j++)
            sum += exp(xs[r * N + j]);
        for (int j = 0; j < N; j++)
            want[r * N + j] = exp(xs[r * N + j]) / sum;
    }
    got = run_ref(&g, y_soft, (const float *const[]){xs}, STOF_OK, &err);
    CHECK_NEAR(max_rel_err(got, want, R * N), 0, TOL);
    free(got);
    /* large values must not overflow: a row of 1000s is uniform */
    for (int i = 0; i < R * N; i++)
        xs[i] = 1000.0f + (float)(i % N == 0);
    got = run_ref(&g, y_soft, (const float *const[]){xs}, STOF_OK, &err);
    double e1 = exp(1.0), denom = e1 + (N - 1);
    CHECK_NEAR(got[0], e1 / denom, 1e-6);
    CHECK_NEAR(got[1], 1.0 / denom, 1e-6);
    CHECK(!isnan(got[N - 1]));
    free(got);

    double flops, bytes;
    op_cost(&g, producer(&g, y_erf), &flops, &bytes);
    CHECK_NEAR(flops, 10.0 * R * N, 0);
    CHECK_NEAR(bytes, 2.0 * 4 * R * N, 0);
    op_cost(&g, producer(&g, y_relu), &flops, &bytes);
    CHECK_NEAR(flops, 1.0 * R * N, 0);
    op_cost(&g, producer(&g, y_soft), &flops, &bytes);
    CHECK_NEAR(flops, 5.0 * R * N, 0);
    free(xs);
    graph_free(&g);
}

/* ---- norms ---------------------------------------------------------------- */

static void test_norm_shapes(void) {
    graph g;
    graph_init(&g);
    stof_error err = {0};
    int x = TENSOR(&g, "x", STOF_F32, 2, 5, 8);
    int gamma = TENSOR(&g, "gamma", STOF_F32, 8);
    int beta = TENSOR(&g, "beta", STOF_F32, 8);
    int short_v = TENSOR(&g, "short", STOF_F32, 7);
    int half_v = TENSOR(&g, "half", STOF_F16, 8);
    graph_op ln = OP(OP_LAYERNORM, x, gamma, beta);
    ln.attr.norm.eps = 1e-12f;
    int y = add_op(&g, &ln, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    CHECK_SHAPE(output_of(&g, y), 2, 5, 8);

    graph_op op = ln;
    op.inputs[1] = short_v;
    REJECT(&g, &op, STOF_ERR_SHAPE, "layernorm", "gamma 'short' [7]", "must be [8]");
    op = ln;
    op.inputs[2] = short_v;
    REJECT(&g, &op, STOF_ERR_SHAPE, "beta 'short' [7]");
    op = ln;
    op.inputs[2] = half_v;
    REJECT(&g, &op, STOF_ERR_INVALID, "beta 'half' is fp16");
    op = ln;
    op.attr.norm.eps = 0.0f;
    REJECT(&g, &op, STOF_ERR_INVALID, "eps must be positive", "got 0");
    op.attr.norm.eps = -1e-5f;
    REJECT(&g, &op, STOF_ERR_INVALID, "eps");
    op.attr.norm.eps = NAN;
    REJECT(&g, &op, STOF_ERR_INVALID, "eps");
    op = OP(OP_LAYERNORM, x, gamma);
    op.attr.norm.eps = 1e-5f;
    REJECT(&g, &op, STOF_ERR_INVALID, "layernorm takes 3 to 3 inputs, got 2");

    graph_op rms = OP(OP_RMSNORM, x, gamma);
    rms.attr.norm.eps = 1e-6f;
    y = add_op(&g, &rms, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    op = rms;
    op.inputs[1] = short_v;
    REJECT(&g, &op, STOF_ERR_SHAPE, "rmsnorm", "gamma 'short' [7]", "must be [8]");
    op = rms;
    op.attr.norm.eps = INFINITY;
    REJECT(&g, &op, STOF_ERR_INVALID, "rmsnorm", "eps");

    int x16 = TENSOR(&g, "x16", STOF_BF16, 3, 8);
    int g16 = TENSOR(&g, "g16", STOF_BF16, 8);
    op = OP(OP_RMSNORM, x16, g16);
    op.attr.norm.eps = 1e-6f;
    y = add_op(&g, &op, &err);
    CHECK(y >= 0 && output_of(&g, y)->dtype == STOF_BF16);
    graph_free(&g);
}

static void test_norm_ref(void) {
    enum { R = 6, N = 33 };
    graph g;
    graph_init(&g);
    stof_error err = {0};
    util_rng rng = {10};
    int x = TENSOR(&g, "x", STOF_F32, 2, 3, N);
    int gamma = TENSOR(&g, "gamma", STOF_F32, N);
    int beta = TENSOR(&g, "beta", STOF_F32, N);
    graph_op op = OP(OP_LAYERNORM, x, gamma, beta);
    op.attr.norm.eps = 1e-5f;
    int y_ln = add_op(&g, &op, &err);
    op = OP(OP_RMSNORM, x, gamma);
    op.attr.norm.eps = 1e-6f;
    int y_rms = add_op(&g, &op, &err);
    CHECK(y_ln >= 0 && y_rms >= 0);

    float *xs = random_floats(&rng, R * N, -3, 5);
    float *gs = random_floats(&rng, N, 0.5, 1.5), *bs = random_floats(&rng, N, -1, 1);
    double want[R * N];
    for (int r = 0; r < R; r++) {
        /* one pass, E[x^2] - E[x]^2: another route than the reference's */
        double s = 0, s2 = 0;
        for (int j = 0; j < N; j++) {
            s += xs[r * N + j];
            s2 += (double)xs[r * N + j] * xs[r * N + j];
        }
        double mean = s / N, var = s2 / N - mean * mean;
        for (int j = 0; j < N; j++)
            want[r * N + j] = (xs[r * N + j] - mean) / sqrt(var + 1e-5) * gs[j] + bs[j];
    }
    float *got = run_ref(&g, y_ln, (const float *const[]){xs, gs, bs}, STOF_OK, &err);
    CHECK_NEAR(max_rel_err(got, want, R * N), 0, TOL);
    free(got);
    for (int r = 0; r < R; r++) {
        double s2 = 0;
        for (int j = 0; j < N; j++)
            s2 += (double)xs[r * N + j] * xs[r * N + j];
        double rms = sqrt(s2 / N + 1e-6);
        for (int j = 0; j < N; j++)
            want[r * N + j] = xs[r * N + j] / rms * gs[j];
    }
    got = run_ref(&g, y_rms, (const float *const[]){xs, gs}, STOF_OK, &err);
    CHECK_NEAR(max_rel_err(got, want, R * N), 0, TOL);
    free(got);
    /* a constant row: eps keeps it finite, the output is the shift */
    for (int j = 0; j < N; j++)
        xs[j] = 3.0f;
    got = run_ref(&g, y_ln, (const float *const[]){xs, gs, bs}, STOF_OK, &err);
    CHECK_NEAR(got[0], bs[0], 1e-6);
    CHECK_NEAR(got[N - 1], bs[N - 1], 1e-6);
    free(got);

    double flops, bytes;
    op_cost(&g, producer(&g, y_ln), &flops, &bytes);
    CHECK_NEAR(flops, 8.0 * R * N, 0);
    CHECK_NEAR(bytes, 4.0 * (2 * R * N + 2 * N), 0);
    op_cost(&g, producer(&g, y_rms), &flops, &bytes);
    CHECK_NEAR(flops, 5.0 * R * N, 0);
    CHECK_NEAR(bytes, 4.0 * (2 * R * N + N), 0);
    free(bs);
    free(gs);
    free(xs);
    graph_free(&g);
}

static void test_layernorm_cost_bert(void) {
    graph g;
    graph_init(&g);
    stof_error err = {0};
    int x = TENSOR(&g, "x", STOF_F16, 8, 512, 768);
    int gamma = TENSOR(&g, "gamma", STOF_F16, 768);
    int beta = TENSOR(&g, "beta", STOF_F16, 768);
    graph_op op = OP(OP_LAYERNORM, x, gamma, beta);
    op.attr.norm.eps = 1e-12f;
    int y = add_op(&g, &op, &err);
    CHECK_EQ_INT(output_of(&g, y)->dtype, STOF_F16);
    double flops, bytes, n = 8.0 * 512 * 768;
    op_cost(&g, producer(&g, y), &flops, &bytes);
    CHECK_NEAR(flops, 8 * n, 0);
    CHECK_NEAR(bytes, 2.0 * (2 * n + 2 * 768), 0);
    graph_free(&g);
}

/* ---- embedding ------------------------------------------------------------ */

static void test_embedding_shapes(void) {
    graph g;
    graph_init(&g);
    stof_error err = {0};
    int ids = TENSOR(&g, "ids", STOF_I32, 2, 5);
    int long_ids = TENSOR(&g, "long_ids", STOF_I32, 2, 9);
    int fids = TENSOR(&g, "fids", STOF_F32, 2, 5);
    int ids3 = TENSOR(&g, "ids3", STOF_I32, 2, 5, 1);
    int word = TENSOR(&g, "word", STOF_F32, 11, 6);
    int word1 = TENSOR(&g, "word1", STOF_F32, 66);
    int pos = TENSOR(&g, "pos", STOF_F32, 8, 6);
    int pos5 = TENSOR(&g, "pos5", STOF_F32, 8, 5);
    int type = TENSOR(&g, "type", STOF_F32, 2, 6);
    int type16 = TENSOR(&g, "type16", STOF_F16, 2, 6);

    graph_op bert = OP(OP_EMBEDDING, ids, word, pos, type);
    bert.attr.embedding.has_position = 1;
    bert.attr.embedding.has_type = 1;
    int y = add_op(&g, &bert, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    CHECK_SHAPE(output_of(&g, y), 2, 5, 6);
    CHECK_EQ_INT(output_of(&g, y)->dtype, STOF_F32);

    graph_op t5 = OP(OP_EMBEDDING, ids, word);
    y = add_op(&g, &t5, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    CHECK_SHAPE(output_of(&g, y), 2, 5, 6);

    graph_op op = bert;
    op.inputs[0] = long_ids;
    REJECT(&g, &op, STOF_ERR_SHAPE, "embedding", "ids 'long_ids' [2, 9] have 9 positions",
           "position table 'pos' [8, 6] holds 8");
    op = bert;
    op.inputs[0] = fids;
    REJECT(&g, &op, STOF_ERR_INVALID, "ids 'fids' must be int32, got fp32");
    op = bert;
    op.inputs[0] = ids3;
    REJECT(&g, &op, STOF_ERR_SHAPE, "ids 'ids3'", "rank 2");
    op = bert;
    op.inputs[1] = word1;
    REJECT(&g, &op, STOF_ERR_SHAPE, "word 'word1'", "rank 2");
    op = bert;
    op.inputs[2] = pos5;
    REJECT(&g, &op, STOF_ERR_SHAPE, "position table 'pos5' [8, 5] has width 5",
           "word table 'word' [11, 6] has 6");
    op = bert;
    op.inputs[3] = type16;
    REJECT(&g, &op, STOF_ERR_INVALID, "type 'type16' is fp16");
    op = bert;
    op.n_inputs = 3;
    REJECT(&g, &op, STOF_ERR_INVALID, "call for 4 inputs (ids, word, pos, type), got 3");
    op = t5;
    op.attr.embedding.has_position = 1;
    REJECT(&g, &op, STOF_ERR_INVALID, "call for 3 inputs", "got 2");

    /* GPT-2: word and position tables, fp16 flows */
    int w16 = TENSOR(&g, "w16", STOF_F16, 11, 6);
    int p16 = TENSOR(&g, "p16", STOF_F16, 5, 6);
    op = OP(OP_EMBEDDING, ids, w16, p16);
    op.attr.embedding.has_position = 1;
    y = add_op(&g, &op, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    CHECK_EQ_INT(output_of(&g, y)->dtype, STOF_F16);
    op = OP(OP_EMBEDDING, ids, word, p16);
    op.attr.embedding.has_position = 1;
    REJECT(&g, &op, STOF_ERR_INVALID, "position 'p16' is fp16", "word 'word' is fp32");
    graph_free(&g);
}

static void test_embedding_ref(void) {
    enum { B = 2, S = 5, V = 11, P = 8, T = 2, H = 6 };
    graph g;
    graph_init(&g);
    stof_error err = {0};
    util_rng rng = {11};
    int ids = TENSOR(&g, "ids", STOF_I32, B, S);
    int word = TENSOR(&g, "word", STOF_F32, V, H);
    int pos = TENSOR(&g, "pos", STOF_F32, P, H);
    int type = TENSOR(&g, "type", STOF_F32, T, H);
    graph_op op = OP(OP_EMBEDDING, ids, word, pos, type);
    op.attr.embedding.has_position = 1;
    op.attr.embedding.has_type = 1;
    int y_bert = add_op(&g, &op, &err);
    op = OP(OP_EMBEDDING, ids, word);
    int y_t5 = add_op(&g, &op, &err);
    CHECK(y_bert >= 0 && y_t5 >= 0);

    float id_vals[B * S];
    for (int i = 0; i < B * S; i++)
        id_vals[i] = (float)(util_rng_next(&rng) % V);
    id_vals[3] = V - 1; /* both ends of the vocabulary */
    id_vals[4] = 0;
    float *ws = random_floats(&rng, V * H, -1, 1), *ps = random_floats(&rng, P * H, -1, 1);
    float *ts = random_floats(&rng, T * H, -1, 1);
    double want[B * S * H], want_t5[B * S * H];
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++)
            for (int h = 0; h < H; h++) {
                int id = (int)id_vals[b * S + s], o = (b * S + s) * H + h;
                want_t5[o] = ws[id * H + h];
                want[o] = (double)ws[id * H + h] + ps[s * H + h] + ts[h];
            }
    float *got = run_ref(&g, y_bert, (const float *const[]){id_vals, ws, ps, ts}, STOF_OK, &err);
    CHECK_NEAR(max_rel_err(got, want, B * S * H), 0, TOL);
    free(got);
    got = run_ref(&g, y_t5, (const float *const[]){id_vals, ws}, STOF_OK, &err);
    CHECK_NEAR(max_rel_err(got, want_t5, B * S * H), 0, 0);
    free(got);

    /* ids outside the vocabulary or not integers */
    float saved = id_vals[7];
    id_vals[7] = V;
    free(run_ref(&g, y_t5, (const float *const[]){id_vals, ws}, STOF_ERR_INVALID, &err));
    CHECK_CONTAINS(err.msg, "id 11 at [1, 2] is outside the vocabulary [0, 11)");
    id_vals[7] = -1;
    free(run_ref(&g, y_bert, (const float *const[]){id_vals, ws, ps, ts}, STOF_ERR_INVALID,
                 &err));
    CHECK_CONTAINS(err.msg, "id -1 at [1, 2]");
    id_vals[7] = 2.5f;
    free(run_ref(&g, y_t5, (const float *const[]){id_vals, ws}, STOF_ERR_INVALID, &err));
    CHECK_CONTAINS(err.msg, "id 2.5 at [1, 2] is not an integer");
    id_vals[7] = NAN;
    free(run_ref(&g, y_t5, (const float *const[]){id_vals, ws}, STOF_ERR_INVALID, &err));
    CHECK_CONTAINS(err.msg, "not an integer");
    id_vals[7] = saved;

    /* a type row per token (a sentence pair's second segment): type_ids */
    int tids = TENSOR(&g, "token_type_ids", STOF_I32, B, S);
    op = OP(OP_EMBEDDING, ids, word, pos, type, tids);
    op.attr.embedding.has_position = op.attr.embedding.has_type = 1;
    op.attr.embedding.has_type_ids = 1;
    int y_pair = add_op(&g, &op, &err);
    CHECK_MSG(y_pair >= 0, "%s", err.msg);
    float tid_vals[B * S];
    for (int i = 0; i < B * S; i++)
        tid_vals[i] = (float)(i % S >= 3); /* the last two tokens: segment B */
    double want_pair[B * S * H];
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++)
            for (int h = 0; h < H; h++) {
                int id = (int)id_vals[b * S + s], o = (b * S + s) * H + h;
                want_pair[o] = (double)ws[id * H + h] + ps[s * H + h] + ts[(s >= 3) * H + h];
            }
    got = run_ref(&g, y_pair, (const float *const[]){id_vals, ws, ps, ts, tid_vals}, STOF_OK,
                  &err);
    CHECK_NEAR(max_rel_err(got, want_pair, B * S * H), 0, TOL);
    free(got);
    tid_vals[6] = T;
    free(run_ref(&g, y_pair, (const float *const[]){id_vals, ws, ps, ts, tid_vals},
                 STOF_ERR_INVALID, &err));
    CHECK_CONTAINS(err.msg, "id 2 at [1, 1] is outside the vocabulary [0, 2)");
    int wrong = TENSOR(&g, "wrong_types", STOF_I32, B, S + 1);
    op = OP(OP_EMBEDDING, ids, word, pos, type, wrong);
    op.attr.embedding.has_position = op.attr.embedding.has_type = 1;
    op.attr.embedding.has_type_ids = 1;
    REJECT(&g, &op, STOF_ERR_SHAPE, "token type ids 'wrong_types' [2, 6] must be int32");

    /* cost: 2 adds per element; the ids, the gathered rows (10 word rows,
     * 5 positions, 1 type row) and the output */
    double flops, bytes;
    op_cost(&g, producer(&g, y_bert), &flops, &bytes);
    CHECK_NEAR(flops, 2.0 * B * S * H, 0);
    CHECK_NEAR(bytes, 4.0 * (B * S + (10 + 5 + 1) * H + B * S * H), 0);
    op_cost(&g, producer(&g, y_t5), &flops, &bytes);
    CHECK_NEAR(flops, 0, 0);
    CHECK_NEAR(bytes, 4.0 * (B * S + 10 * H + B * S * H), 0);
    free(ts);
    free(ps);
    free(ws);
    graph_free(&g);
}

/* ---- T5 relative position buckets ---------------------------------------- */

static void test_relpos_bucket(void) {
    /* num_buckets 32, max_distance 128 (T5's defaults). Bidirectional: 16
     * buckets a side, 8 exact; beyond, 8 + (int)(log(rp / 8) / log(16) * 8).
     * Unidirectional: 32 buckets, 16 exact; beyond, 16 + (int)(log(rp / 16) /
     * log(8) * 16). */
    static const struct { int rp, bidir, bucket; } cases[] = {
        {0, 1, 0},     {1, 1, 17},     {-1, 1, 1},     {7, 1, 23},  {-7, 1, 7},
        {8, 1, 24},    /* log(1) = 0: 8 + 0 */
        {10, 1, 24},   /* log(1.25) / log(16) * 8 = 0.64 -> 8 */
        {12, 1, 25},   /* log(1.5) / log(16) * 8 = 1.17 -> 9 */
        {16, 1, 26},   /* log(2) / log(16) * 8 = 2 exactly -> 10 */
        {-16, 1, 10},  {-127, 1, 15}, /* 7.977 -> 15 */
        {-128, 1, 15}, /* 8 -> 16, capped at 15 */
        {200, 1, 31},  {-200, 1, 15}, {1000000, 1, 31},
        {0, 0, 0},     {5, 0, 0}, /* a decoder never looks ahead */
        {-3, 0, 3},    {-15, 0, 15},
        {-16, 0, 16},  /* log(1) = 0 */
        {-20, 0, 17},  /* log(1.25) / log(8) * 16 = 1.72 -> 17 */
        {-32, 0, 21},  /* log(2) / log(8) * 16 = 5.33 -> 21 */
        {-100, 0, 30}, /* log(6.25) / log(8) * 16 = 14.1 -> 30 */
        {-127, 0, 31}, {-128, 0, 31}, {-5000, 0, 31},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int got = op_relpos_bucket(cases[k].rp, cases[k].bidir, 32, 128);
        CHECK_MSG(got == cases[k].bucket, "rp %d bidirectional %d: bucket %d, expected %d",
                  cases[k].rp, cases[k].bidir, got, cases[k].bucket);
    }
    /* extremes stay defined */
    CHECK_EQ_INT(op_relpos_bucket(INT32_MIN, 1, 32, 128), 15);
    CHECK_EQ_INT(op_relpos_bucket(INT32_MAX, 1, 32, 128), 31);
    CHECK_EQ_INT(op_relpos_bucket(INT32_MIN, 0, 32, 128), 31);
}

/* ---- attention ------------------------------------------------------------ */

/* A mask made by hand from a dense 0/1 array [batch][q][k], the way
 * ops/mask.c lays one out: rows of `words` uint64 words. */
static mask *hand_mask(const uint8_t *dense, int batch, int q_len, int k_len) {
    mask *m = calloc(1, sizeof *m);
    m->batch = batch;
    m->q_len = q_len;
    m->k_len = k_len;
    m->words = (k_len + 63) / 64;
    m->bits = calloc((size_t)batch * q_len * m->words, sizeof *m->bits);
    m->desc = strdup("hand-made");
    for (int r = 0; r < batch * q_len; r++)
        for (int j = 0; j < k_len; j++)
            if (dense[(size_t)r * k_len + j])
                m->bits[(size_t)r * m->words + j / 64] |= 1ULL << (j % 64);
    return m;
}

static int add_hand_mask(graph *g, const uint8_t *dense, int batch, int q_len, int k_len) {
    int id = -1;
    stof_error err = {0};
    CHECK_EQ_INT(graph_add_mask(g, hand_mask(dense, batch, q_len, k_len), mask_free, &id, &err),
                 STOF_OK);
    return id;
}

/* A dense mask of all ones, [batch][q][k]. */
static int add_full_mask(graph *g, int batch, int q_len, int k_len) {
    size_t n = (size_t)batch * q_len * k_len;
    uint8_t *dense = malloc(n);
    memset(dense, 1, n);
    int id = add_hand_mask(g, dense, batch, q_len, k_len);
    free(dense);
    return id;
}

static graph_op attention_op(int heads, int head_dim, int q_or_qkv, int kv) {
    graph_op op = kv >= 0 ? OP(OP_ATTENTION, q_or_qkv, kv) : OP(OP_ATTENTION, q_or_qkv);
    op.attr.attn.heads = heads;
    op.attr.attn.head_dim = head_dim;
    op.attr.attn.cross = kv >= 0;
    op.attr.attn.scale = 1.0f / sqrtf((float)head_dim);
    op.attr.attn.mask = -1;
    return op;
}

static void with_relpos(graph_op *op, int table, int buckets, int max_distance, int bidir) {
    op->inputs[op->n_inputs++] = table;
    op->attr.attn.relpos = 1;
    op->attr.attn.relpos_buckets = buckets;
    op->attr.attn.relpos_max_distance = max_distance;
    op->attr.attn.relpos_bidirectional = bidir;
}

static void test_attention_self_shapes(void) {
    enum { B = 2, S = 6, H = 2, D = 4 };
    graph g;
    graph_init(&g);
    stof_error err = {0};
    int qkv = TENSOR(&g, "qkv", STOF_F32, B, S, 3 * H * D);
    int qkv25 = TENSOR(&g, "qkv25", STOF_F32, B, S, 25);
    int qkv2d = TENSOR(&g, "qkv2d", STOF_F32, B * S, 3 * H * D);
    int qkv_i = TENSOR(&g, "qkv_i", STOF_I32, B, S, 3 * H * D);
    int table = TENSOR(&g, "table", STOF_F32, 32, H);
    int table31 = TENSOR(&g, "table31", STOF_F32, 31, H);

    graph_op base = attention_op(H, D, qkv, -1);
    int y = add_op(&g, &base, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    CHECK_SHAPE(output_of(&g, y), B, S, H * D);
    CHECK_EQ_INT(output_of(&g, y)->dtype, STOF_F32);

    graph_op op = base;
    op.inputs[0] = qkv25;
    REJECT(&g, &op, STOF_ERR_SHAPE, "attention", "qkv 'qkv25' [2, 6, 25] has 25 features",
           "2 heads of dim 4 need 3 x H x D = 24");
    /* grouped-query: one K/V head for the two query heads is (2 + 2) x 4 = 16 wide */
    op.attr.attn.kv_heads = 1;
    REJECT(&g, &op, STOF_ERR_SHAPE, "2 query and 1 K/V heads of dim 4 need (H + 2 KVH) x D = 16");
    op.attr.attn.kv_heads = 3;
    REJECT(&g, &op, STOF_ERR_INVALID, "kv_heads must divide heads", "kv_heads = 3");
    op.attr.attn.kv_heads = 0;
    op.inputs[0] = qkv2d;
    REJECT(&g, &op, STOF_ERR_SHAPE, "qkv 'qkv2d'", "rank 3");
    op.inputs[0] = qkv_i;
    REJECT(&g, &op, STOF_ERR_INVALID, "qkv 'qkv_i'", "int32");
    op = base;
    op.attr.attn.heads = 0;
    REJECT(&g, &op, STOF_ERR_INVALID, "heads = 0");
    op = base;
    op.attr.attn.head_dim = -4;
    REJECT(&g, &op, STOF_ERR_INVALID, "head_dim = -4");

    /* scale: any positive finite value (T5: 1.0) */
    float bad_scales[] = {0.0f, -0.125f, NAN, INFINITY};
    for (int k = 0; k < 4; k++) {
        op = base;
        op.attr.attn.scale = bad_scales[k];
        REJECT(&g, &op, STOF_ERR_INVALID, "scale must be positive and finite");
    }
    op = base;
    op.attr.attn.scale = 1.0f;
    CHECK(add_op(&g, &op, &err) >= 0);

    /* input counts */
    op = base;
    op.attr.attn.relpos = 1;
    op.attr.attn.relpos_buckets = 32;
    op.attr.attn.relpos_max_distance = 128;
    REJECT(&g, &op, STOF_ERR_INVALID, "relative position table input is missing");
    op = OP(OP_ATTENTION, qkv, table);
    op.attr.attn = base.attr.attn;
    REJECT(&g, &op, STOF_ERR_INVALID, "self-attention takes 1 input (qkv), got 2");

    /* relpos */
    graph_op rel = base;
    with_relpos(&rel, table, 32, 128, 1);
    y = add_op(&g, &rel, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    op = base;
    with_relpos(&op, table31, 32, 128, 1);
    REJECT(&g, &op, STOF_ERR_SHAPE, "relpos table 'table31' [31, 2] must be [32, 2]");
    op = base;
    with_relpos(&op, table, 31, 128, 1);
    REJECT(&g, &op, STOF_ERR_SHAPE, "must be [31, 2]");
    op = rel;
    op.attr.attn.heads = 4;
    op.attr.attn.head_dim = 2;
    REJECT(&g, &op, STOF_ERR_SHAPE, "must be [32, 4]");
    op = rel;
    op.attr.attn.relpos_buckets = 3;
    REJECT(&g, &op, STOF_ERR_INVALID, "relpos_buckets must be at least 4", "bidirectional");
    op.attr.attn.relpos_bidirectional = 0;
    op.attr.attn.relpos_buckets = 1;
    REJECT(&g, &op, STOF_ERR_INVALID, "at least 2", "unidirectional");
    op = rel;
    op.attr.attn.relpos_max_distance = 8;
    REJECT(&g, &op, STOF_ERR_INVALID, "relpos_max_distance must exceed the 8", "got 8");

    /* masks */
    int ok_shared = add_full_mask(&g, 1, S, S);
    int ok_per_batch = add_full_mask(&g, B, S, S);
    int short_q = add_full_mask(&g, 1, S - 1, S);
    int long_k = add_full_mask(&g, 1, S, S + 1);
    int batch3 = add_full_mask(&g, 3, S, S);
    op = base;
    op.attr.attn.mask = ok_shared;
    CHECK(add_op(&g, &op, &err) >= 0);
    op.attr.attn.mask = ok_per_batch;
    CHECK(add_op(&g, &op, &err) >= 0);
    op.attr.attn.causal = 1;
    CHECK(add_op(&g, &op, &err) >= 0);
    op.attr.attn.mask = short_q;
    REJECT(&g, &op, STOF_ERR_SHAPE, "(hand-made) is 5 x 6 (queries x keys)",
           "6 queries and 6 keys");
    op.attr.attn.mask = long_k;
    REJECT(&g, &op, STOF_ERR_SHAPE, "is 6 x 7");
    op.attr.attn.mask = batch3;
    REJECT(&g, &op, STOF_ERR_SHAPE, "has batch 3 but the attention has batch 2");
    op.attr.attn.mask = 99;
    REJECT(&g, &op, STOF_ERR_INVALID, "mask 99 does not exist");
    int bad_words = add_full_mask(&g, 1, S, S);
    g.masks[bad_words]->words = 2; /* a corrupt mask: 6 keys fit one word */
    op.attr.attn.mask = bad_words;
    REJECT(&g, &op, STOF_ERR_INTERNAL, "has 2 words per row for 6 keys");

    /* half precision flows through */
    int qkv16 = TENSOR(&g, "qkv16", STOF_F16, B, S, 3 * H * D);
    op = base;
    op.inputs[0] = qkv16;
    y = add_op(&g, &op, &err);
    CHECK(y >= 0 && output_of(&g, y)->dtype == STOF_F16);
    with_relpos(&op, table, 32, 128, 1);
    REJECT(&g, &op, STOF_ERR_INVALID, "relpos table 'table' is fp32", "qkv 'qkv16' is fp16");
    graph_free(&g);
}

static void test_attention_cross_shapes(void) {
    enum { B = 2, SQ = 3, SK = 7, H = 2, D = 4 };
    graph g;
    graph_init(&g);
    stof_error err = {0};
    int q = TENSOR(&g, "q", STOF_BF16, B, SQ, H * D);
    int kv = TENSOR(&g, "kv", STOF_BF16, B, SK, 2 * H * D);
    int q9 = TENSOR(&g, "q9", STOF_BF16, B, SQ, 9);
    int kv8 = TENSOR(&g, "kv8", STOF_BF16, B, SK, H * D);
    int kv_b1 = TENSOR(&g, "kv_b1", STOF_BF16, 1, SK, 2 * H * D);
    int kv32 = TENSOR(&g, "kv32", STOF_F32, B, SK, 2 * H * D);
    graph_op base = attention_op(H, D, q, kv);
    int y = add_op(&g, &base, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    CHECK_SHAPE(output_of(&g, y), B, SQ, H * D);
    CHECK_EQ_INT(output_of(&g, y)->dtype, STOF_BF16);

    graph_op op = base;
    op.inputs[0] = q9;
    REJECT(&g, &op, STOF_ERR_SHAPE, "q 'q9' [2, 3, 9] has 9 features", "need 8");
    op = base;
    op.inputs[1] = kv8;
    REJECT(&g, &op, STOF_ERR_SHAPE, "kv 'kv8'", "has 8 features", "need 2 x H x D = 16");
    op.inputs[1] = kv_b1;
    REJECT(&g, &op, STOF_ERR_SHAPE,
           "q 'q' [2, 3, 8] has batch 2 but kv 'kv_b1' [1, 7, 16] has batch 1");
    op.inputs[1] = kv32;
    REJECT(&g, &op, STOF_ERR_INVALID, "kv 'kv32' is fp32");
    op = OP(OP_ATTENTION, q);
    op.attr.attn = base.attr.attn;
    REJECT(&g, &op, STOF_ERR_INVALID, "cross-attention takes 2 inputs (q, kv), got 1");

    /* masks follow Sq x Sk */
    int mask_ok = add_full_mask(&g, 1, SQ, SK);
    int mask_square = add_full_mask(&g, 1, SK, SK);
    op = base;
    op.attr.attn.mask = mask_ok;
    op.attr.attn.causal = 1;
    CHECK(add_op(&g, &op, &err) >= 0);
    op.attr.attn.mask = mask_square;
    REJECT(&g, &op, STOF_ERR_SHAPE, "is 7 x 7", "3 queries and 7 keys");
    graph_free(&g);
}

/* One attention configuration, checked against a dense computation. */
typedef struct attn_case {
    const char *name;
    int batch, sq, sk, heads, dim;
    int cross, causal;
    int mask_batches;     /* 0: no mask, 1: shared, batch: one per batch */
    double density;       /* of the random mask */
    int empty_rows;       /* blank some mask rows (fully masked queries) */
    int relpos, bidir;    /* relpos bias table, 32 buckets, max distance 20 */
    float scale;          /* 0: 1/sqrt(dim) */
    uint64_t seed;
    int kv_heads;         /* 0: heads; fewer: grouped-query attention */
} attn_case;

static int case_kv_heads(const attn_case *c) {
    return c->kv_heads ? c->kv_heads : c->heads;
}

/* allowed[b][i][j] from the mask rows and the causal rule. */
static uint8_t *dense_allowed(const attn_case *c, const uint8_t *mask_dense) {
    uint8_t *allowed = malloc((size_t)c->batch * c->sq * c->sk);
    for (int b = 0; b < c->batch; b++)
        for (int i = 0; i < c->sq; i++)
            for (int j = 0; j < c->sk; j++) {
                int mb = c->mask_batches == 1 ? 0 : b;
                int ok = !mask_dense || mask_dense[((size_t)mb * c->sq + i) * c->sk + j];
                if (c->causal && j > i + (c->sk - c->sq))
                    ok = 0;
                allowed[((size_t)b * c->sq + i) * c->sk + j] = (uint8_t)ok;
            }
    return allowed;
}

/* The textbook form: S = scale Q K^T + bias, -inf where masked, row
 * softmax (a row of -inf gives zeros), O = P V; per batch and head. */
static double *dense_attention(const attn_case *c, const float *q, int q_stride,
                               const float *k, const float *v, int kv_stride,
                               const float *table, const uint8_t *allowed, double scale) {
    int hd = c->heads * c->dim, group = c->heads / case_kv_heads(c);
    double *o = zeros_d((int64_t)c->batch * c->sq * hd);
    double *s = malloc(sizeof(double) * c->sq * c->sk);
    for (int b = 0; b < c->batch; b++)
        for (int h = 0; h < c->heads; h++) {
            for (int i = 0; i < c->sq; i++)
                for (int j = 0; j < c->sk; j++) {
                    double dot = 0;
                    for (int d = 0; d < c->dim; d++)
                        dot += (double)q[(b * c->sq + i) * q_stride + h * c->dim + d] *
                               k[(b * c->sk + j) * kv_stride + h / group * c->dim + d];
                    double bias = table ? table[op_relpos_bucket(j - i, c->bidir, 32, 20) *
                                                    c->heads + h]
                                        : 0.0;
                    s[i * c->sk + j] = allowed[((size_t)b * c->sq + i) * c->sk + j]
                                           ? scale * dot + bias
                                           : -INFINITY;
                }
            for (int i = 0; i < c->sq; i++) {
                double *row = s + i * c->sk, max = -INFINITY, sum = 0;
                for (int j = 0; j < c->sk; j++)
                    max = fmax(max, row[j]);
                if (max == -INFINITY)
                    continue; /* o stays zero */
                for (int j = 0; j < c->sk; j++)
                    sum += row[j] = exp(row[j] - max);
                for (int j = 0; j < c->sk; j++)
                    for (int d = 0; d < c->dim; d++)
                        o[(b * c->sq + i) * hd + h * c->dim + d] +=
                            row[j] / sum *
                            v[(b * c->sk + j) * kv_stride + h / group * c->dim + d];
            }
        }
    free(s);
    return o;
}

static uint8_t *random_mask_dense(const attn_case *c, util_rng *rng) {
    size_t n = (size_t)c->mask_batches * c->sq * c->sk;
    uint8_t *dense = malloc(n);
    for (size_t k = 0; k < n; k++)
        dense[k] = util_rng_double(rng) < c->density;
    if (c->empty_rows) /* row 0 of every stored batch, and row 2 of the last */
        for (int b = 0; b < c->mask_batches; b++) {
            memset(dense + (size_t)b * c->sq * c->sk, 0, (size_t)c->sk);
            if (b == c->mask_batches - 1 && c->sq > 2)
                memset(dense + ((size_t)b * c->sq + 2) * c->sk, 0, (size_t)c->sk);
        }
    return dense;
}

static int64_t count_allowed(const attn_case *c, const uint8_t *allowed) {
    int64_t n = 0;
    for (size_t k = 0; k < (size_t)c->batch * c->sq * c->sk; k++)
        n += allowed[k];
    return n;
}

/* Rows with no allowed key must be exact zeros. */
static void check_empty_rows_zero(const attn_case *c, const uint8_t *allowed, const float *y) {
    int hd = c->heads * c->dim, empty = 0, bad = 0;
    for (int b = 0; b < c->batch; b++)
        for (int i = 0; i < c->sq; i++) {
            const uint8_t *row = allowed + ((size_t)b * c->sq + i) * c->sk;
            if (memchr(row, 1, (size_t)c->sk))
                continue;
            empty++;
            for (int d = 0; d < hd; d++)
                bad += y[(b * c->sq + i) * hd + d] != 0.0f;
        }
    CHECK_MSG(bad == 0, "%s: %d values of fully masked rows are not 0", c->name, bad);
    if (c->empty_rows || (c->causal && c->sq > c->sk))
        CHECK_MSG(empty > 0, "%s: the case was meant to have fully masked rows", c->name);
}

static void run_attention_case(const attn_case *c) {
    graph g;
    graph_init(&g);
    stof_error err = {0};
    util_rng rng = {c->seed};
    int hd = c->heads * c->dim, kvd = case_kv_heads(c) * c->dim;
    int q_stride = c->cross ? hd : hd + 2 * kvd, kv_stride = c->cross ? 2 * kvd : hd + 2 * kvd;
    int q_t = TENSOR(&g, "q", STOF_F32, c->batch, c->sq, q_stride);
    int kv_t = c->cross ? TENSOR(&g, "kv", STOF_F32, c->batch, c->sk, kv_stride) : -1;
    graph_op op = attention_op(c->heads, c->dim, q_t, kv_t);
    op.attr.attn.causal = c->causal;
    op.attr.attn.kv_heads = c->kv_heads;
    if (c->scale > 0)
        op.attr.attn.scale = c->scale;
    int table_t = c->relpos ? TENSOR(&g, "table", STOF_F32, 32, c->heads) : -1;
    if (c->relpos)
        with_relpos(&op, table_t, 32, 20, c->bidir);
    uint8_t *mask_dense = c->mask_batches ? random_mask_dense(c, &rng) : NULL;
    if (mask_dense)
        op.attr.attn.mask = add_hand_mask(&g, mask_dense, c->mask_batches, c->sq, c->sk);
    int y_t = add_op(&g, &op, &err);
    CHECK_MSG(y_t >= 0, "%s: %s", c->name, err.msg);
    if (y_t < 0) {
        free(mask_dense);
        graph_free(&g);
        return;
    }

    /* q, k and v in [-2, 2] so that softmax rows are far from uniform */
    float *qs = random_floats(&rng, (int64_t)c->batch * c->sq * q_stride, -2, 2);
    float *kvs = c->cross ? random_floats(&rng, (int64_t)c->batch * c->sk * kv_stride, -2, 2)
                          : NULL;
    float *ts = c->relpos ? random_floats(&rng, 32 * c->heads, -3, 3) : NULL;
    const float *k = c->cross ? kvs : qs + hd, *v = c->cross ? kvs + kvd : qs + hd + kvd;
    uint8_t *allowed = dense_allowed(c, mask_dense);
    double *want = dense_attention(c, qs, q_stride, k, v, kv_stride, ts, allowed,
                                   op.attr.attn.scale);

    const float *in[3] = {qs, NULL, NULL};
    int n = 1;
    if (c->cross)
        in[n++] = kvs;
    if (c->relpos)
        in[n++] = ts;
    float *got = run_ref(&g, y_t, in, STOF_OK, &err);
    int64_t n_out = (int64_t)c->batch * c->sq * hd;
    double e = max_rel_err(got, want, n_out);
    CHECK_MSG(e <= TOL, "%s: max relative error %g", c->name, e);
    check_empty_rows_zero(c, allowed, got);

    /* the cost counts exactly the allowed pairs */
    double flops, bytes;
    op_cost(&g, producer(&g, y_t), &flops, &bytes);
    double want_flops = 4.0 * c->heads * c->dim * (double)count_allowed(c, allowed);
    CHECK_MSG(flops == want_flops, "%s: %g flops, expected %g", c->name, flops, want_flops);

    free(got);
    free(want);
    free(allowed);
    free(ts);
    free(kvs);
    free(qs);
    free(mask_dense);
    graph_free(&g);
}

static void test_attention_ref(void) {
    static const attn_case cases[] = {
        {"dense", 2, 9, 9, 3, 8, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0},
        {"shared mask", 2, 11, 11, 2, 8, 0, 0, 1, 0.4, 0, 0, 0, 0, 2, 0},
        {"shared mask, 70 keys (2 words a row)", 2, 70, 70, 2, 4, 0, 0, 1, 0.3, 0, 0, 0, 0, 3, 0},
        {"causal", 2, 10, 10, 2, 8, 0, 1, 0, 0, 0, 0, 0, 0, 4, 0},
        {"causal and mask", 1, 67, 67, 1, 8, 0, 1, 1, 0.5, 0, 0, 0, 0, 5, 0},
        {"per-batch masks", 3, 12, 12, 2, 4, 0, 0, 3, 0.35, 0, 0, 0, 0, 6, 0},
        {"fully masked rows (shared)", 2, 8, 8, 2, 4, 0, 0, 1, 0.5, 1, 0, 0, 0, 7, 0},
        {"fully masked rows (per batch, causal)", 2, 8, 8, 2, 4, 0, 1, 2, 0.5, 1, 0, 0, 0, 8, 0},
        {"cross", 2, 5, 13, 2, 8, 1, 0, 0, 0, 0, 0, 0, 0, 9, 0},
        {"cross, causal, Sq < Sk", 2, 5, 13, 2, 8, 1, 1, 0, 0, 0, 0, 0, 0, 10, 0},
        {"cross, causal, Sq > Sk", 2, 9, 4, 2, 8, 1, 1, 0, 0, 0, 0, 0, 0, 11, 0},
        {"cross, per-batch mask, causal", 2, 6, 75, 2, 4, 1, 1, 2, 0.3, 0, 0, 0, 0, 12, 0},
        {"relpos bidirectional, scale 1", 2, 40, 40, 3, 4, 0, 0, 0, 0, 0, 1, 1, 1.0f, 13, 0},
        {"relpos causal decoder, scale 1", 1, 40, 40, 2, 4, 0, 1, 0, 0, 0, 1, 0, 1.0f, 14, 0},
        {"relpos with mask", 2, 30, 30, 2, 4, 0, 0, 1, 0.5, 1, 1, 1, 1.0f, 15, 0},
        {"relpos cross", 2, 7, 30, 2, 4, 1, 0, 0, 0, 0, 1, 1, 0.5f, 16, 0},
        {"grouped-query, causal", 2, 12, 12, 4, 8, 0, 1, 0, 0, 0, 0, 0, 0, 17, 2},
        {"grouped-query, one K/V head, mask", 2, 10, 10, 3, 4, 0, 1, 1, 0.5, 0, 0, 0, 0, 18, 1},
        {"grouped-query cross", 2, 5, 9, 6, 4, 1, 0, 0, 0, 0, 0, 0, 0, 19, 3},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        run_attention_case(&cases[k]);
}

/* Sliding window |i - j| <= 1 over 8 tokens: 8 + 2 * 7 = 22 pairs a batch;
 * with causal, 8 + 7 = 15. */
static void test_attention_cost(void) {
    enum { B = 2, S = 8, H = 12, D = 64 };
    graph g;
    graph_init(&g);
    stof_error err = {0};
    uint8_t band[S * S], per_batch[2 * S * S];
    for (int i = 0; i < S; i++)
        for (int j = 0; j < S; j++)
            band[i * S + j] = abs(i - j) <= 1;
    memset(per_batch, 1, S * S); /* batch 0 full: 64 pairs */
    memcpy(per_batch + S * S, band, S * S);
    int m_band = add_hand_mask(&g, band, 1, S, S);
    int m_per_batch = add_hand_mask(&g, per_batch, 2, S, S);
    int qkv = TENSOR(&g, "qkv", STOF_F16, B, S, 3 * H * D);
    graph_op op = attention_op(H, D, qkv, -1);
    double flops, bytes, per_pair = 4.0 * H * D;
    double io = 2.0 * (B * S * 3 * H * D + B * S * H * D);

    int y = add_op(&g, &op, &err);
    op_cost(&g, producer(&g, y), &flops, &bytes);
    CHECK_NEAR(flops, per_pair * B * S * S, 0);
    CHECK_NEAR(bytes, io, 0);
    op.attr.attn.causal = 1;
    y = add_op(&g, &op, &err);
    op_cost(&g, producer(&g, y), &flops, &bytes);
    CHECK_NEAR(flops, per_pair * B * 36, 0);
    op.attr.attn.mask = m_band;
    op.attr.attn.causal = 0;
    y = add_op(&g, &op, &err);
    op_cost(&g, producer(&g, y), &flops, &bytes);
    CHECK_NEAR(flops, per_pair * B * 22, 0);
    CHECK_NEAR(bytes, io, 0);
    op.attr.attn.causal = 1;
    y = add_op(&g, &op, &err);
    op_cost(&g, producer(&g, y), &flops, &bytes);
    CHECK_NEAR(flops, per_pair * B * 15, 0);
    op.attr.attn.mask = m_per_batch;
    op.attr.attn.causal = 0;
    y = add_op(&g, &op, &err);
    op_cost(&g, producer(&g, y), &flops, &bytes);
    CHECK_NEAR(flops, per_pair * (64 + 22), 0);
    op.attr.attn.causal = 1;
    y = add_op(&g, &op, &err);
    op_cost(&g, producer(&g, y), &flops, &bytes);
    CHECK_NEAR(flops, per_pair * (36 + 15), 0);

    /* cross, causal: Sq = 3, Sk = 6 sees 4 + 5 + 6 keys; Sq = 6, Sk = 3 sees
     * 0, 0, 0, 1, 2, 3; the relpos table is read once too */
    int q3 = TENSOR(&g, "q3", STOF_F16, B, 3, H * D);
    int kv6 = TENSOR(&g, "kv6", STOF_F16, B, 6, 2 * H * D);
    int q6 = TENSOR(&g, "q6", STOF_F16, B, 6, H * D);
    int kv3 = TENSOR(&g, "kv3", STOF_F16, B, 3, 2 * H * D);
    int table = TENSOR(&g, "table", STOF_F16, 32, H);
    op = attention_op(H, D, q3, kv6);
    op.attr.attn.causal = 1;
    y = add_op(&g, &op, &err);
    op_cost(&g, producer(&g, y), &flops, &bytes);
    CHECK_NEAR(flops, per_pair * B * 15, 0);
    CHECK_NEAR(bytes, 2.0 * (B * 3 * H * D + B * 6 * 2 * H * D + B * 3 * H * D), 0);
    op = attention_op(H, D, q6, kv3);
    op.attr.attn.causal = 1;
    with_relpos(&op, table, 32, 128, 1);
    y = add_op(&g, &op, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    op_cost(&g, producer(&g, y), &flops, &bytes);
    CHECK_NEAR(flops, per_pair * B * 6, 0);
    CHECK_NEAR(bytes, 2.0 * (B * 6 * H * D + B * 3 * 2 * H * D + 32 * H + B * 6 * H * D), 0);
    graph_free(&g);
}

/* ---- run-time padding ------------------------------------------------------ */

/* A padded self-attention (an attention_mask input of lengths 7, 3 and 0,
 * with relpos and a causal rule on top) gives what the same attention
 * gives under a hand-made per-batch mask allowing keys j < len and rows
 * i < len: padded rows are zeros, padded keys do not count. */
static void test_attention_padding(void) {
    enum { B = 3, S = 9, H = 2, D = 4 };
    static const int lens[B] = {7, 3, 0};
    for (int causal = 0; causal < 2; causal++) {
        graph g;
        graph_init(&g);
        stof_error err = {0};
        util_rng rng = {21 + (uint64_t)causal};
        int qkv = TENSOR(&g, "qkv", STOF_F32, B, S, 3 * H * D);
        int am = TENSOR(&g, "attention_mask", STOF_I32, B, S);
        int table = TENSOR(&g, "table", STOF_F32, 32, H);
        graph_op op = attention_op(H, D, qkv, -1);
        op.inputs[op.n_inputs++] = am;
        op.attr.attn.padded = 1;
        op.attr.attn.causal = causal;
        with_relpos(&op, table, 32, 20, 1);
        int y = add_op(&g, &op, &err);
        CHECK_MSG(y >= 0, "%s", err.msg);
        uint8_t dense[B * S * S];
        for (int b = 0; b < B; b++)
            for (int i = 0; i < S; i++)
                for (int j = 0; j < S; j++)
                    dense[(b * S + i) * S + j] = i < lens[b] && j < lens[b];
        graph_op ref_op = attention_op(H, D, qkv, -1);
        ref_op.attr.attn.causal = causal;
        ref_op.attr.attn.mask = add_hand_mask(&g, dense, B, S, S);
        with_relpos(&ref_op, table, 32, 20, 1);
        int y_ref = add_op(&g, &ref_op, &err);
        CHECK_MSG(y_ref >= 0, "%s", err.msg);
        float *xs = random_floats(&rng, B * S * 3 * H * D, -2, 2);
        float *ts = random_floats(&rng, 32 * H, -1, 1);
        float am_values[B * S];
        for (int b = 0; b < B; b++)
            for (int s = 0; s < S; s++)
                am_values[b * S + s] = s < lens[b];
        float *got = run_ref(&g, y, (const float *const[]){xs, am_values, ts}, STOF_OK, &err);
        float *want = run_ref(&g, y_ref, (const float *const[]){xs, ts}, STOF_OK, &err);
        int same = got && want;
        for (int k = 0; same && k < B * S * H * D; k++)
            same = got[k] == want[k];
        CHECK_MSG(same, "padded attention (causal %d) differs from the hand-masked one", causal);
        for (int k = 0; got && k < S * H * D; k++) /* batch 2 is all padding: zeros */
            CHECK(got[2 * S * H * D + k] == 0.0f);
        free(got);
        free(want);
        free(xs);
        free(ts);
        graph_free(&g);
    }
}

/* ---- global tokens ---------------------------------------------------------- */

/* Longformer's rule, written out for the test: a global query attends every key of its
 * sequence with the global projections; another query attends its window (|i - j| <= 1),
 * minus the global keys, plus every global key, with the local ones; padded rows are zeros. */
static void longformer_expect(const float *qkv, const float *gqkv, const int *lens,
                              const float *gm, int B, int S, int H, int D, float *y) {
    const int W = 3 * H * D;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < S; i++)
            for (int h = 0; h < H; h++) {
                float *out = y + ((b * S + i) * H + h) * D;
                for (int d = 0; d < D; d++)
                    out[d] = 0.0f;
                if (i >= lens[b])
                    continue;
                const int glob_q = gm[b * S + i] != 0.0f;
                const float *src = glob_q ? gqkv : qkv;
                const float *q = src + (b * S + i) * W + h * D;
                double sc[64], mx = -INFINITY, sum = 0.0, acc[8] = {0};
                int keys[64], n = 0;
                for (int j = 0; j < lens[b]; j++) {
                    const int glob_k = gm[b * S + j] != 0.0f, window = abs(i - j) <= 1;
                    if (!(glob_q || glob_k || window))
                        continue;
                    double dot = 0.0;
                    for (int d = 0; d < D; d++)
                        dot += (double)q[d] * src[(b * S + j) * W + H * D + h * D + d];
                    sc[n] = dot / sqrt((double)D);
                    mx = sc[n] > mx ? sc[n] : mx;
                    keys[n++] = j;
                }
                for (int t = 0; t < n; t++) {
                    const double p = exp(sc[t] - mx);
                    sum += p;
                    for (int d = 0; d < D; d++)
                        acc[d] += p * src[(b * S + keys[t]) * W + 2 * H * D + h * D + d];
                }
                for (int d = 0; d < D; d++)
                    out[d] = (float)(acc[d] / sum);
            }
}

/* The op's reference against that rule: a sliding-window mask, global tokens at the start,
 * inside and at a padded position (ignored, as transformers ignores it), with and without
 * global_qkv (without: the global rows read qkv). */
static void test_attention_global(void) {
    enum { B = 2, S = 12, H = 2, D = 4 };
    static const int lens[B] = {12, 8};
    for (int own = 0; own < 2; own++) {
        graph g;
        graph_init(&g);
        stof_error err = {0};
        util_rng rng = {31 + (uint64_t)own};
        int qkv = TENSOR(&g, "qkv", STOF_F32, B, S, 3 * H * D);
        int am = TENSOR(&g, "attention_mask", STOF_I32, B, S);
        int gm = TENSOR(&g, "global_mask", STOF_I32, B, S);
        int gqkv = TENSOR(&g, "global_qkv", STOF_F32, B, S, 3 * H * D);
        uint8_t dense[S * S];
        for (int i = 0; i < S; i++)
            for (int j = 0; j < S; j++)
                dense[i * S + j] = abs(i - j) <= 1;
        graph_op op = attention_op(H, D, qkv, -1);
        op.attr.attn.mask = add_hand_mask(&g, dense, 1, S, S);
        op.inputs[op.n_inputs++] = am;
        op.attr.attn.padded = 1;
        op.inputs[op.n_inputs++] = gm;
        op.attr.attn.global_keys = 1;
        if (own) {
            op.inputs[op.n_inputs++] = gqkv;
            op.attr.attn.global_qkv = 1;
        }
        int y = add_op(&g, &op, &err);
        CHECK_MSG(y >= 0, "%s", err.msg);
        float *xs = random_floats(&rng, B * S * 3 * H * D, -2, 2);
        float *gs = random_floats(&rng, B * S * 3 * H * D, -2, 2);
        float am_values[B * S], gm_values[B * S] = {0};
        for (int b = 0; b < B; b++)
            for (int s2 = 0; s2 < S; s2++)
                am_values[b * S + s2] = s2 < lens[b];
        gm_values[0] = gm_values[5] = 1;              /* batch 0: positions 0 and 5 */
        gm_values[S + 2] = gm_values[S + 10] = 1;     /* batch 1: 2, and 10 is padding */
        const float *const in[] = {xs, am_values, gm_values, gs};
        float *got = run_ref(&g, y, in, STOF_OK, &err);
        float want[B * S * H * D];
        longformer_expect(xs, own ? gs : xs, lens, gm_values, B, S, H, D, want);
        int close = got != NULL;
        for (int k = 0; close && k < B * S * H * D; k++)
            close = fabsf(got[k] - want[k]) <= 1e-5f;
        CHECK_MSG(close, "global-token attention (own projections %d) differs from the rule",
                  own);
        free(got);
        free(xs);
        free(gs);
        graph_free(&g);
    }
}

static void test_attention_global_rejects(void) {
    graph g;
    graph_init(&g);
    int qkv = TENSOR(&g, "qkv", STOF_F32, 2, 5, 24);
    int gm = TENSOR(&g, "global_mask", STOF_I32, 2, 5);
    int wrong = TENSOR(&g, "wrong", STOF_I32, 2, 4);
    int narrow = TENSOR(&g, "narrow", STOF_F32, 2, 5, 16);
    int q = TENSOR(&g, "q", STOF_F32, 2, 5, 8), kv = TENSOR(&g, "kv", STOF_F32, 2, 6, 16);
    graph_op op = attention_op(2, 4, qkv, -1);
    op.inputs[op.n_inputs++] = wrong;
    op.attr.attn.global_keys = 1;
    REJECT(&g, &op, STOF_ERR_SHAPE, "global_mask 'wrong' [2, 4] must be int32 [2, 5]");
    op.inputs[1] = gm;
    op.inputs[op.n_inputs++] = narrow;
    op.attr.attn.global_qkv = 1;
    REJECT(&g, &op, STOF_ERR_SHAPE, "global_qkv 'narrow' [2, 5, 16] must be shaped as qkv");
    op.n_inputs = 2;
    REJECT(&g, &op, STOF_ERR_INVALID, "takes 3 inputs (qkv, global_mask, global_qkv)");
    op.attr.attn.global_qkv = 0;
    op.attr.attn.causal = 1;
    REJECT(&g, &op, STOF_ERR_UNSUPPORTED, "global tokens are an encoder's");
    op = attention_op(2, 4, q, kv);
    op.inputs[op.n_inputs++] = gm;
    op.attr.attn.global_keys = 1;
    REJECT(&g, &op, STOF_ERR_UNSUPPORTED, "global tokens are an encoder's");
    graph_free(&g);
}

static void test_padding_rejects(void) {
    graph g;
    graph_init(&g);
    int qkv = TENSOR(&g, "qkv", STOF_F32, 2, 5, 24);
    int q = TENSOR(&g, "q", STOF_F32, 2, 5, 8), kv = TENSOR(&g, "kv", STOF_F32, 2, 6, 16);
    int am = TENSOR(&g, "attention_mask", STOF_I32, 2, 5);
    int wrong = TENSOR(&g, "wrong", STOF_I32, 2, 4);
    int as_float = TENSOR(&g, "as_float", STOF_F32, 2, 5);
    graph_op op = attention_op(2, 4, qkv, -1);
    op.inputs[op.n_inputs++] = wrong;
    op.attr.attn.padded = 1;
    REJECT(&g, &op, STOF_ERR_SHAPE, "attention_mask 'wrong' [2, 4] must be int32 [2, 5]");
    op.inputs[1] = as_float;
    REJECT(&g, &op, STOF_ERR_SHAPE, "must be int32 [2, 5]");
    op.n_inputs = 1;
    REJECT(&g, &op, STOF_ERR_INVALID, "takes 2 inputs");
    op = attention_op(2, 4, q, kv);
    op.inputs[op.n_inputs++] = am;
    op.attr.attn.padded = 1;
    REJECT(&g, &op, STOF_ERR_INVALID, "self-attention only");
    /* mask_rows: x [2, 5, 8] masked by [2, 5] */
    graph_op mr = OP(OP_MASK_ROWS, q, wrong);
    REJECT(&g, &mr, STOF_ERR_SHAPE, "mask_rows", "must be int32 [2, 5]");
    mr = OP(OP_MASK_ROWS, q, am);
    stof_error err = {0};
    int y = add_op(&g, &mr, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    CHECK_SHAPE(output_of(&g, y), 2, 5, 8);
    util_rng rng = {5};
    float *xs = random_floats(&rng, 80, -1, 1);
    const float am_values[10] = {1, 1, 1, 0, 0, 1, 0, 0, 0, 0};
    float *got = run_ref(&g, y, (const float *const[]){xs, am_values}, STOF_OK, &err);
    for (int k = 0; got && k < 80; k++)
        CHECK(got[k] == (am_values[k / 8] != 0.0f ? xs[k] : 0.0f));
    free(got);
    free(xs);
    graph_free(&g);
}

/* ---- gated units and rotary embeddings ----------------------------------- */

static void test_glu(void) {
    enum { R = 4, F = 6 };
    graph g;
    graph_init(&g);
    stof_error err = {0};
    util_rng rng = {11};
    int x = TENSOR(&g, "x", STOF_F32, 2, 2, 2 * F);
    int odd = TENSOR(&g, "odd", STOF_F32, 2, 7);
    graph_op op = OP(OP_GLU, odd);
    REJECT(&g, &op, STOF_ERR_SHAPE, "glu", "(7) must be even");
    op = OP(OP_GLU, x);
    op.attr.glu.act = 9;
    REJECT(&g, &op, STOF_ERR_INVALID, "unknown activation 9");
    float *xs = random_floats(&rng, R * 2 * F, -3, 3);
    for (int act = OP_GLU_GELU; act <= OP_GLU_SILU; act++) {
        op = OP(OP_GLU, x);
        op.attr.glu.act = act;
        int y = add_op(&g, &op, &err);
        CHECK_MSG(y >= 0, "%s", err.msg);
        CHECK_SHAPE(output_of(&g, y), 2, 2, F);
        /* act(first half) * second half, by hand */
        double *want = zeros_d(R * F);
        for (int r = 0; r < R; r++)
            for (int j = 0; j < F; j++) {
                double a = xs[r * 2 * F + j], gate = xs[r * 2 * F + F + j];
                double v = act == OP_GLU_GELU ? 0.5 * a * (1.0 + erf(a / sqrt(2.0)))
                           : act == OP_GLU_GELU_TANH
                               ? 0.5 * a * (1.0 + tanh(0.7978845608028654 *
                                                       (a + 0.044715 * a * a * a)))
                               : a / (1.0 + exp(-a));
                want[r * F + j] = v * gate;
            }
        float *got = run_ref(&g, y, (const float *const[]){xs}, STOF_OK, &err);
        CHECK_NEAR(max_rel_err(got, want, R * F), 0, TOL);
        free(got);
        free(want);
    }
    free(xs);
    graph_free(&g);
}

static void set_rotary(graph_op *op, int heads, int kv_heads, int head_dim, float theta) {
    op->attr.rotary.heads = heads;
    op->attr.rotary.kv_heads = kv_heads;
    op->attr.rotary.head_dim = head_dim;
    op->attr.rotary.theta = theta;
}

static void test_rotary(void) {
    enum { B = 2, S = 5, H = 2, KVH = 1, D = 4, N = (H + 2 * KVH) * D };
    graph g;
    graph_init(&g);
    stof_error err = {0};
    util_rng rng = {13};
    int x = TENSOR(&g, "x", STOF_F32, B, S, N);
    int wrong = TENSOR(&g, "wrong", STOF_F32, B, S, N + 4);
    graph_op op = OP(OP_ROTARY, wrong);
    set_rotary(&op, H, KVH, D, 10000.0f);
    REJECT(&g, &op, STOF_ERR_SHAPE, "Q, K and V of 2, 1 and 1 heads of 4 need 16");
    op = OP(OP_ROTARY, x);
    set_rotary(&op, H, KVH, 3, 10000.0f);
    REJECT(&g, &op, STOF_ERR_INVALID, "head_dim must be even");
    set_rotary(&op, 3, 2, D, 10000.0f);
    REJECT(&g, &op, STOF_ERR_INVALID, "heads a multiple of kv_heads");
    set_rotary(&op, H, KVH, D, 1.0f);
    REJECT(&g, &op, STOF_ERR_INVALID, "theta must be above 1");
    set_rotary(&op, H, KVH, D, 100.0f);
    int y = add_op(&g, &op, &err);
    CHECK_MSG(y >= 0, "%s", err.msg);
    CHECK_SHAPE(output_of(&g, y), B, S, N);
    float *xs = random_floats(&rng, B * S * N, -1, 1);
    /* by hand, with D = 4: pairs (0, 2) at frequency 1 and (1, 3) at 100^(-1/2);
     * the Q and K heads rotate, V's stays */
    double *want = zeros_d(B * S * N);
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++)
            for (int h = 0; h < H + 2 * KVH; h++) {
                const float *v = xs + (b * S + s) * N + h * D;
                double *w = want + (b * S + s) * N + h * D;
                for (int j = 0; j < 2; j++) {
                    double f = j == 0 ? 1.0 : 0.1, c = cos(s * f), sn = sin(s * f);
                    int rot = h < H + KVH;
                    w[j] = rot ? v[j] * c - v[j + 2] * sn : v[j];
                    w[j + 2] = rot ? v[j + 2] * c + v[j] * sn : v[j + 2];
                }
            }
    float *got = run_ref(&g, y, (const float *const[]){xs}, STOF_OK, &err);
    CHECK_NEAR(max_rel_err(got, want, B * S * N), 0, TOL);
    free(got);
    free(want);
    free(xs);
    graph_free(&g);
}

int main(void) {
    test_table();
    test_gemm_shapes();
    test_gemm_ref();
    test_gemm_cost();
    test_bias();
    test_add();
    test_gelu_helpers();
    test_activations();
    test_norm_shapes();
    test_norm_ref();
    test_layernorm_cost_bert();
    test_embedding_shapes();
    test_embedding_ref();
    test_relpos_bucket();
    test_attention_self_shapes();
    test_attention_cross_shapes();
    test_attention_ref();
    test_attention_cost();
    test_glu();
    test_rotary();
    test_attention_padding();
    test_attention_global();
    test_attention_global_rejects();
    test_padding_rejects();
    return check_summary("test_ops");
}
