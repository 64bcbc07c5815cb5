/* Padding at run time: the attention_mask a batch of sequences of different
 * lengths comes with (transformers' convention, 1 = token, 0 = padding,
 * each row right-padded: its ones first).
 *
 *   mask_rows  x [B, S, ...], mask [B, S] int32 -> x where mask[b, s] != 0,
 *              zeros elsewhere: the defined output at padded positions.
 *
 * The attention's own use of the mask (keys past a row's length masked,
 * padded query rows zero) is in attention.c; ops_padding_length is the
 * length both read off a row. */
#include "core/base/error.h"
#include "ops/ops_impl.h"

int64_t ops_padding_length(const float *row, int64_t seq) {
    int64_t n = 0;
    while (n < seq && row[n] != 0.0f)
        n++;
    return n;
}

int ops_mask_rows_infer(OPS_INFER_ARGS) {
    const graph_tensor *x = ops_input(g, op, 0), *m = ops_input(g, op, 1);
    int rc = ops_require_float(op, x, "x", err);
    if (!rc)
        rc = ops_require_rank(op, x, "x", 2, GRAPH_MAX_DIMS, err);
    if (!rc)
        rc = ops_require_rank(op, m, "mask", 2, 2, err);
    if (rc)
        return rc;
    char xs[OPS_TENSOR_STR_MAX], ms[OPS_TENSOR_STR_MAX];
    if (m->dtype != STOF_I32 || m->shape[0] != x->shape[0] || m->shape[1] != x->shape[1])
        return ops_fail(op, err, STOF_ERR_SHAPE, "mask %s must be int32 [%lld, %lld], the first "
                        "two dims of x %s", ops_tensor_str(m, ms, sizeof ms),
                        (long long)x->shape[0], (long long)x->shape[1],
                        ops_tensor_str(x, xs, sizeof xs));
    ops_copy_shape(out, x);
    return STOF_OK;
}

void ops_mask_rows_cost(OPS_COST_ARGS) {
    ops_mi_cost(g, op, 1.0, flops, bytes);
}

int ops_mask_rows_ref(OPS_REF_ARGS) {
    const graph_tensor *x = ops_input(g, op, 0);
    int64_t positions = x->shape[0] * x->shape[1];
    int64_t per = graph_tensor_numel(x) / positions;
    for (int64_t p = 0; p < positions; p++)
        for (int64_t k = 0; k < per; k++)
            out[p * per + k] = in[1][p] != 0.0f ? in[0][p * per + k] : 0.0f;
    return STOF_OK;
}
