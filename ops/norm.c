/* Normalization over the last dim: LayerNorm (BERT, GPT-2; biased variance as
 * PyTorch) and RMSNorm (T5: no centring, no shift). Row statistics are
 * accumulated in double so the reference is not the weak link in a
 * comparison. */
#include <math.h>

#include "core/base/error.h"
#include "ops/ops_impl.h"

/* eps keeps rows of equal values from dividing by zero, so it must be > 0. */
static int check_eps(const graph_op *op, stof_error *err) {
    float eps = op->attr.norm.eps;
    if (isfinite(eps) && eps > 0.0f)
        return STOF_OK;
    return ops_fail(op, err, STOF_ERR_INVALID, "eps must be positive and finite, got %g",
                    (double)eps);
}

/* x [..., N] and one gain (and shift) vector [N] per feature; n_params is the
 * number of vectors after x. The output has the gain's dtype: x's, or f16 / bf16 where x is an
 * fp32 residual stream. */
static int norm_infer(const graph *g, const graph_op *op, int n_params, graph_tensor *out,
                      stof_error *err) {
    static const char *const roles[] = {"gamma", "beta"};
    const graph_tensor *x = ops_input(g, op, 0), *gain = ops_input(g, op, 1);
    int rc;
    if ((rc = ops_require_float(op, x, "x", err)) || (rc = check_eps(op, err)))
        return rc;
    for (int k = 0; k < n_params; k++) {
        const graph_tensor *p = ops_input(g, op, 1 + k);
        if ((rc = ops_require_float(op, p, roles[k], err)))
            return rc;
        /* gamma: x's dtype, unless x is an fp32 stream; beta: gamma's */
        if (k == 1)
            rc = ops_require_same_dtype(op, gain, roles[0], p, roles[1], err);
        else if (x->dtype != STOF_F32)
            rc = ops_require_same_dtype(op, x, "x", p, roles[0], err);
        if (rc || (rc = ops_require_vector(op, p, roles[k], ops_last_dim(x), err)))
            return rc;
    }
    ops_copy_shape(out, x);
    out->dtype = gain->dtype;
    return STOF_OK;
}

/* ---- layernorm ----------------------------------------------------------- */

int ops_layernorm_infer(OPS_INFER_ARGS) {
    return norm_infer(g, op, 2, out, err);
}

void ops_layernorm_cost(OPS_COST_ARGS) {
    ops_mi_cost(g, op, 8.0, flops, bytes);
}

static void layernorm_row(const float *x, const float *gamma, const float *beta, float eps,
                          float *y, int64_t n) {
    double mean = 0.0;
    for (int64_t j = 0; j < n; j++)
        mean += x[j];
    mean /= (double)n;
    double var = 0.0;
    for (int64_t j = 0; j < n; j++)
        var += (x[j] - mean) * (x[j] - mean);
    var /= (double)n;
    double inv_std = 1.0 / sqrt(var + eps);
    for (int64_t j = 0; j < n; j++)
        y[j] = (float)((x[j] - mean) * inv_std * gamma[j] + beta[j]);
}

int ops_layernorm_ref(OPS_REF_ARGS) {
    const graph_tensor *x = ops_input(g, op, 0);
    int64_t rows = ops_rows(x), n = ops_last_dim(x);
    for (int64_t r = 0; r < rows; r++)
        layernorm_row(in[0] + r * n, in[1], in[2], op->attr.norm.eps, out + r * n, n);
    return STOF_OK;
}

/* ---- rmsnorm ------------------------------------------------------------- */

int ops_rmsnorm_infer(OPS_INFER_ARGS) {
    return norm_infer(g, op, 1, out, err);
}

void ops_rmsnorm_cost(OPS_COST_ARGS) {
    ops_mi_cost(g, op, 5.0, flops, bytes);
}

static void rmsnorm_row(const float *x, const float *gamma, float eps, float *y, int64_t n) {
    double sum_sq = 0.0;
    for (int64_t j = 0; j < n; j++)
        sum_sq += (double)x[j] * x[j];
    double inv_rms = 1.0 / sqrt(sum_sq / (double)n + eps);
    for (int64_t j = 0; j < n; j++)
        y[j] = (float)(x[j] * inv_rms * gamma[j]);
}

int ops_rmsnorm_ref(OPS_REF_ARGS) {
    const graph_tensor *x = ops_input(g, op, 0);
    int64_t rows = ops_rows(x), n = ops_last_dim(x);
    for (int64_t r = 0; r < rows; r++)
        rmsnorm_row(in[0] + r * n, in[1], op->attr.norm.eps, out + r * n, n);
    return STOF_OK;
}
