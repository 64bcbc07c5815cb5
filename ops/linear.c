/* The linear family: GEMM (y = x W^T for nn.Linear weights [N, K], y = x W for
 * weights stored [K, N], kn = true) and the bias add that follows it. */
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/util.h"
#include "ops/ops_impl.h"

/* ---- gemm ---------------------------------------------------------------- */

/* Reduction length K and output features N of W, by its storage order. */
static void gemm_weight_dims(const graph_op *op, const graph_tensor *w, int64_t *k, int64_t *n) {
    int kn = op->attr.gemm.weight_kn;
    *k = kn ? w->shape[0] : w->shape[1];
    *n = kn ? w->shape[1] : w->shape[0];
}

int ops_gemm_infer(OPS_INFER_ARGS) {
    const graph_tensor *x = ops_input(g, op, 0), *w = ops_input(g, op, 1);
    int rc;
    if ((rc = ops_require_float(op, x, "x", err)) || (rc = ops_require_float(op, w, "W", err)) ||
        (rc = ops_require_same_dtype(op, x, "x", w, "W", err)) ||
        (rc = ops_require_rank(op, w, "W", 2, 2, err)))
        return rc;
    /* The GPU's GEMM kernels load W before they wait for the kernel before them (a
     * programmatic dependent launch), which holds only for what no kernel of the run writes. */
    if (w->role != GRAPH_WEIGHT && w->role != GRAPH_INPUT) {
        char ws[OPS_TENSOR_STR_MAX];
        return ops_fail(op, err, STOF_ERR_UNSUPPORTED,
                        "W %s is computed by the model; W must be a weight (m:weight) or a "
                        "model input", ops_tensor_str(w, ws, sizeof ws));
    }
    int64_t k, n;
    gemm_weight_dims(op, w, &k, &n);
    if (ops_last_dim(x) != k) {
        char xs[OPS_TENSOR_STR_MAX], ws[OPS_TENSOR_STR_MAX];
        return ops_fail(op, err, STOF_ERR_SHAPE,
                        "x %s has %lld features but W %s expects %lld (W is stored %s)",
                        ops_tensor_str(x, xs, sizeof xs), (long long)ops_last_dim(x),
                        ops_tensor_str(w, ws, sizeof ws), (long long)k,
                        op->attr.gemm.weight_kn ? "[K, N]" : "[N, K]");
    }
    ops_copy_shape(out, x);
    out->shape[out->ndim - 1] = n;
    return STOF_OK;
}

void ops_gemm_cost(OPS_COST_ARGS) {
    const graph_tensor *x = ops_input(g, op, 0);
    double m = (double)ops_rows(x), k = (double)ops_last_dim(x);
    double n = (double)ops_last_dim(ops_output(g, op));
    *flops = 2.0 * m * n * k;
    *bytes = ops_io_bytes(g, op);
}

/* Rows of x that share one row of W (N floats) while it is in cache. */
#define GEMM_ROW_BLOCK 8
/* A fixed-length inner loop: at -O2 the compiler vectorizes only loops whose
 * trip count needs no remainder handling. */
#define AXPY_CHUNK 16

/* y[0, n) += a * w[0, n) */
static void axpy(float a, const float *restrict w, float *restrict y, int64_t n) {
    int64_t j = 0;
    for (; j + AXPY_CHUNK <= n; j += AXPY_CHUNK)
        for (int t = 0; t < AXPY_CHUNK; t++)
            y[j + t] += a * w[j + t];
    for (; j < n; j++)
        y[j] += a * w[j];
}

/* y[m, n] = sum_k x[m, k] w[k, n] (y's rows ldy apart), in i-k-j order: the inner loop runs
 * over contiguous rows of w and y. */
static void gemm_rows_kn(const float *x, const float *w, float *y, int64_t ldy, int64_t m,
                         int64_t n, int64_t k) {
    for (int64_t i = 0; i < m; i++)
        memset(y + i * ldy, 0, (size_t)n * sizeof *y);
    for (int64_t m0 = 0; m0 < m; m0 += GEMM_ROW_BLOCK) {
        int64_t m1 = m0 + GEMM_ROW_BLOCK < m ? m0 + GEMM_ROW_BLOCK : m;
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t i = m0; i < m1; i++)
                axpy(x[i * k + kk], w + kk * n, y + i * ldy, n);
    }
}

/* Outputs a tile of gemm_rows_nk_tiled, and the rows of x up to which it runs: there W [N, K]
 * is transposed a tile of outputs at a time into a buffer that stays in cache, instead of whole
 * into memory first, which pays for itself only over many rows (gcc -O2, 2-core x86-64: one row
 * of a 50257 x 768 head 58 against 165 ms, 8 rows of 3072 x 768 6.1 against 11.4, 64 rows of
 * 768 x 3072 23.0 against 24.1; 1024 rows of it 480 against 403). */
#define GEMM_N_TILE 64
#define GEMM_TILED_ROWS 64

/* y[m, n] = sum_k x[m, k] w[n, k] for W stored [N, K], GEMM_N_TILE outputs at a time: their
 * rows of w transposed into buf [k, GEMM_N_TILE], then gemm_rows_kn on that slice of y (each
 * output's sum over k in the same order, so the same bits as a [K, N] weight gives). */
static void gemm_rows_nk_tiled(const float *x, const float *w, float *y, int64_t m, int64_t n,
                               int64_t k, float *buf) {
    for (int64_t n0 = 0; n0 < n; n0 += GEMM_N_TILE) {
        const int64_t nt = n - n0 < GEMM_N_TILE ? n - n0 : GEMM_N_TILE;
        util_transpose_f32(w + n0 * k, buf, nt, k);
        gemm_rows_kn(x, buf, y + n0, n, m, nt, k);
    }
}

int ops_gemm_ref(OPS_REF_ARGS) {
    const graph_tensor *x = ops_input(g, op, 0), *w = ops_input(g, op, 1);
    int64_t m = ops_rows(x), k, n;
    gemm_weight_dims(op, w, &k, &n);
    if (op->attr.gemm.weight_kn) {
        gemm_rows_kn(in[0], in[1], out, n, m, n, k);
        return STOF_OK;
    }
    /* nn.Linear stores W [N, K]: transposed, a tile of outputs at a time for a few rows, else
     * whole up front, so that the hot loop runs on contiguous memory. */
    const int tiled = m <= GEMM_TILED_ROWS;
    float *w_kn = err_malloc((size_t)((tiled ? GEMM_N_TILE : n) * k) * sizeof *w_kn, err);
    if (!w_kn)
        return STOF_ERR_NOMEM;
    if (tiled) {
        gemm_rows_nk_tiled(in[0], in[1], out, m, n, k, w_kn);
    } else {
        util_transpose_f32(in[1], w_kn, n, k);
        gemm_rows_kn(in[0], w_kn, out, n, m, n, k);
    }
    free(w_kn);
    return STOF_OK;
}

/* ---- bias ---------------------------------------------------------------- */

int ops_bias_infer(OPS_INFER_ARGS) {
    const graph_tensor *x = ops_input(g, op, 0), *b = ops_input(g, op, 1);
    int rc;
    if ((rc = ops_require_float(op, x, "x", err)) || (rc = ops_require_float(op, b, "b", err)) ||
        (rc = ops_require_same_dtype(op, x, "x", b, "b", err)) ||
        (rc = ops_require_vector(op, b, "b", ops_last_dim(x), err)))
        return rc;
    ops_copy_shape(out, x);
    return STOF_OK;
}

void ops_bias_cost(OPS_COST_ARGS) {
    ops_mi_cost(g, op, 1.0, flops, bytes);
}

int ops_bias_ref(OPS_REF_ARGS) {
    const graph_tensor *x = ops_input(g, op, 0);
    int64_t rows = ops_rows(x), n = ops_last_dim(x);
    const float *b = in[1];
    for (int64_t r = 0; r < rows; r++) {
        const float *x_row = in[0] + r * n;
        float *y_row = out + r * n;
        for (int64_t j = 0; j < n; j++)
            y_row[j] = x_row[j] + b[j];
    }
    return STOF_OK;
}
