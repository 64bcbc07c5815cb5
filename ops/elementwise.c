/* Element-wise ops: the residual add, the activations (GELU in its exact erf
 * form for BERT and its tanh approximation for GPT-2, ReLU for T5) and the
 * row softmax. */
#include <math.h>

#include "core/base/error.h"
#include "ops/ops_impl.h"

/* ---- add ----------------------------------------------------------------- */

static int same_shape(const graph_tensor *a, const graph_tensor *b) {
    if (a->ndim != b->ndim)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return 0;
    return 1;
}

int ops_add_infer(OPS_INFER_ARGS) {
    const graph_tensor *a = ops_input(g, op, 0), *b = ops_input(g, op, 1);
    const int has_dtype = op->attr.add.has_dtype;
    int rc;
    if ((rc = ops_require_float(op, a, "a", err)) || (rc = ops_require_float(op, b, "b", err)) ||
        (!has_dtype && (rc = ops_require_same_dtype(op, a, "a", b, "b", err))))
        return rc;
    if (has_dtype && !ops_dtype_is_float(op->attr.add.dtype))
        return ops_fail(op, err, STOF_ERR_INVALID, "the sum's dtype must be fp32, fp16 or bf16, "
                        "got %s", stof_dtype_name(op->attr.add.dtype));
    if (!same_shape(a, b)) {
        char as[OPS_TENSOR_STR_MAX], bs[OPS_TENSOR_STR_MAX];
        return ops_fail(op, err, STOF_ERR_SHAPE, "a %s and b %s must have the same shape",
                        ops_tensor_str(a, as, sizeof as), ops_tensor_str(b, bs, sizeof bs));
    }
    ops_copy_shape(out, a);
    if (has_dtype)
        out->dtype = op->attr.add.dtype;
    return STOF_OK;
}

void ops_add_cost(OPS_COST_ARGS) {
    ops_mi_cost(g, op, 1.0, flops, bytes);
}

int ops_add_ref(OPS_REF_ARGS) {
    int64_t n = graph_tensor_numel(ops_input(g, op, 0));
    for (int64_t i = 0; i < n; i++)
        out[i] = in[0][i] + in[1][i];
    return STOF_OK;
}

/* ---- activations: y has x's shape ---------------------------------------- */

int ops_unary_infer(OPS_INFER_ARGS) {
    const graph_tensor *x = ops_input(g, op, 0);
    int rc = ops_require_float(op, x, "x", err);
    if (rc)
        return rc;
    ops_copy_shape(out, x);
    return STOF_OK;
}

float op_gelu_erf(float x) {
    double v = x;
    return (float)(0.5 * v * (1.0 + erf(v * 0.70710678118654752440)));
}

float op_gelu_tanh(float x) {
    const double sqrt_2_over_pi = 0.79788456080286535588;
    double v = x;
    return (float)(0.5 * v * (1.0 + tanh(sqrt_2_over_pi * (v + 0.044715 * v * v * v))));
}

void ops_gelu_cost(OPS_COST_ARGS) {
    ops_mi_cost(g, op, 10.0, flops, bytes);
}

int ops_gelu_ref(OPS_REF_ARGS) {
    int64_t n = graph_tensor_numel(ops_input(g, op, 0));
    if (op->attr.gelu.tanh) {
        for (int64_t i = 0; i < n; i++)
            out[i] = op_gelu_tanh(in[0][i]);
    } else {
        for (int64_t i = 0; i < n; i++)
            out[i] = op_gelu_erf(in[0][i]);
    }
    return STOF_OK;
}

void ops_relu_cost(OPS_COST_ARGS) {
    ops_mi_cost(g, op, 1.0, flops, bytes);
}

int ops_relu_ref(OPS_REF_ARGS) {
    int64_t n = graph_tensor_numel(ops_input(g, op, 0));
    for (int64_t i = 0; i < n; i++)
        out[i] = in[0][i] > 0.0f ? in[0][i] : 0.0f;
    return STOF_OK;
}

/* ---- softmax over the last dim ------------------------------------------- */

void ops_softmax_cost(OPS_COST_ARGS) {
    ops_mi_cost(g, op, 5.0, flops, bytes);
}

/* Subtracting the row max first keeps exp() from overflowing. */
static void softmax_row(const float *x, float *y, int64_t n) {
    float max = x[0];
    for (int64_t j = 1; j < n; j++)
        max = x[j] > max ? x[j] : max;
    double sum = 0.0;
    for (int64_t j = 0; j < n; j++)
        sum += exp((double)x[j] - max);
    for (int64_t j = 0; j < n; j++)
        y[j] = (float)(exp((double)x[j] - max) / sum);
}

int ops_softmax_ref(OPS_REF_ARGS) {
    const graph_tensor *x = ops_input(g, op, 0);
    int64_t rows = ops_rows(x), n = ops_last_dim(x);
    for (int64_t r = 0; r < rows; r++)
        softmax_row(in[0] + r * n, out + r * n, n);
    return STOF_OK;
}
