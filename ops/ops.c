/* The operator table: one row per op kind, and the checks the families share.
 *
 * Cost convention. FLOPs count multiply and add as two for the
 * compute-intensive ops (GEMM: 2*M*N*K; attention: 4*D per allowed
 * (query, key) pair and head, QK^T plus PV). Memory-intensive ops are charged
 * a fixed number per output element, a rough count of the arithmetic a kernel
 * does, used only to rank them against each other and to report throughput:
 *   bias, add, relu: 1    gelu: 10 (erf or tanh with its polynomial)
 *   softmax: 5 (max, subtract, exp, sum, scale)
 *   layernorm: 8 (mean, centre, square, sum, scale, gain, shift)
 *   rmsnorm: 5 (square, sum, scale, gain)
 *   embedding: one add per extra table (position, type) per element.
 * Bytes are the fewest a kernel must move: each input read once and the output
 * written once, in the tensors' dtypes (embedding reads only the rows it
 * gathers; see embedding.c). */
#include "ops/ops_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/base/error.h"

static const op_desc op_table[OP_KIND_COUNT] = {
    [OP_GEMM] = {OP_GEMM, "gemm", OP_CLASS_CI, 2, 2,
        ops_gemm_infer, ops_gemm_cost, ops_gemm_ref},
    [OP_BIAS] = {OP_BIAS, "bias", OP_CLASS_MI, 2, 2,
        ops_bias_infer, ops_bias_cost, ops_bias_ref},
    [OP_ADD] = {OP_ADD, "add", OP_CLASS_MI, 2, 2,
        ops_add_infer, ops_add_cost, ops_add_ref},
    [OP_LAYERNORM] = {OP_LAYERNORM, "layernorm", OP_CLASS_MI, 3, 3,
        ops_layernorm_infer, ops_layernorm_cost, ops_layernorm_ref},
    [OP_RMSNORM] = {OP_RMSNORM, "rmsnorm", OP_CLASS_MI, 2, 2,
        ops_rmsnorm_infer, ops_rmsnorm_cost, ops_rmsnorm_ref},
    [OP_GELU] = {OP_GELU, "gelu", OP_CLASS_MI, 1, 1,
        ops_unary_infer, ops_gelu_cost, ops_gelu_ref},
    [OP_RELU] = {OP_RELU, "relu", OP_CLASS_MI, 1, 1,
        ops_unary_infer, ops_relu_cost, ops_relu_ref},
    [OP_SOFTMAX] = {OP_SOFTMAX, "softmax", OP_CLASS_MI, 1, 1,
        ops_unary_infer, ops_softmax_cost, ops_softmax_ref},
    /* ids, word, then position, type and type ids when the attributes say so */
    [OP_EMBEDDING] = {OP_EMBEDDING, "embedding", OP_CLASS_MI, 2, 6,
        ops_embedding_infer, ops_embedding_cost, ops_embedding_ref},
    /* qkv, or q and kv (cross), the attention_mask when padded, then the relative
     * position table when relpos */
    [OP_ATTENTION] = {OP_ATTENTION, "attention", OP_CLASS_CI, 1, 4,
        ops_attention_infer, ops_attention_cost, ops_attention_ref},
    [OP_GLU] = {OP_GLU, "glu", OP_CLASS_MI, 1, 1,
        ops_glu_infer, ops_glu_cost, ops_glu_ref},
    [OP_ROTARY] = {OP_ROTARY, "rotary", OP_CLASS_MI, 1, 2,
        ops_rotary_infer, ops_rotary_cost, ops_rotary_ref},
    [OP_MASK_ROWS] = {OP_MASK_ROWS, "mask_rows", OP_CLASS_MI, 2, 2,
        ops_mask_rows_infer, ops_mask_rows_cost, ops_mask_rows_ref},
};

const op_desc *op_describe(op_kind kind) {
    if ((int)kind < 0 || kind >= OP_KIND_COUNT || !op_table[kind].name)
        return NULL;
    return &op_table[kind];
}

int op_kind_from_name(const char *name) {
    if (!name)
        return -1;
    for (int k = 0; k < OP_KIND_COUNT; k++)
        if (op_table[k].name && strcmp(op_table[k].name, name) == 0)
            return k;
    return -1;
}

const char *op_class_name(op_class c) {
    switch (c) {
    case OP_CLASS_CI: return "CI";
    case OP_CLASS_MI: return "MI";
    }
    return "?";
}

void op_cost(const graph *g, const graph_op *op, double *flops, double *bytes) {
    const op_desc *d = op_describe(op->kind);
    *flops = 0;
    *bytes = 0;
    if (d)
        d->cost(g, op, flops, bytes);
}

/* ---- shared checks ------------------------------------------------------- */

const graph_tensor *ops_input(const graph *g, const graph_op *op, int k) {
    return &g->tensors[op->inputs[k]];
}

const graph_tensor *ops_output(const graph *g, const graph_op *op) {
    return &g->tensors[op->output];
}

int ops_fail(const graph_op *op, stof_error *err, int code, const char *fmt, ...) {
    char msg[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const op_desc *d = op_describe(op->kind);
    const char *kind = d ? d->name : "op";
    if (op->name[0])
        return err_set(err, code, "%s '%s': %s", kind, op->name, msg);
    return err_set(err, code, "%s: %s", kind, msg);
}

const char *ops_tensor_str(const graph_tensor *t, char *buf, size_t n) {
    char shape[96];
    snprintf(buf, n, "'%s' %s", t->name, graph_shape_str(t, shape, sizeof shape));
    return buf;
}

int ops_dtype_is_float(stof_dtype t) {
    return t == STOF_F32 || t == STOF_F16 || t == STOF_BF16;
}

int ops_require_float(const graph_op *op, const graph_tensor *t, const char *role,
                      stof_error *err) {
    if (ops_dtype_is_float(t->dtype))
        return STOF_OK;
    return ops_fail(op, err, STOF_ERR_INVALID, "%s '%s' must be fp32, fp16 or bf16, got %s", role,
                    t->name, stof_dtype_name(t->dtype));
}

int ops_require_rank(const graph_op *op, const graph_tensor *t, const char *role, int min_rank,
                     int max_rank, stof_error *err) {
    if (t->ndim >= min_rank && t->ndim <= max_rank)
        return STOF_OK;
    char ts[OPS_TENSOR_STR_MAX];
    if (min_rank == max_rank)
        return ops_fail(op, err, STOF_ERR_SHAPE, "%s %s must have rank %d, got rank %d", role,
                        ops_tensor_str(t, ts, sizeof ts), min_rank, t->ndim);
    return ops_fail(op, err, STOF_ERR_SHAPE, "%s %s must have rank %d to %d, got rank %d", role,
                    ops_tensor_str(t, ts, sizeof ts), min_rank, max_rank, t->ndim);
}

int ops_require_vector(const graph_op *op, const graph_tensor *t, const char *role, int64_t n,
                       stof_error *err) {
    if (t->ndim == 1 && t->shape[0] == n)
        return STOF_OK;
    char ts[OPS_TENSOR_STR_MAX];
    return ops_fail(op, err, STOF_ERR_SHAPE, "%s %s must be [%lld], one value per feature", role,
                    ops_tensor_str(t, ts, sizeof ts), (long long)n);
}

int ops_require_same_dtype(const graph_op *op, const graph_tensor *a, const char *a_role,
                           const graph_tensor *b, const char *b_role, stof_error *err) {
    if (a->dtype == b->dtype)
        return STOF_OK;
    return ops_fail(op, err, STOF_ERR_INVALID, "%s '%s' is %s but %s '%s' is %s; they must match",
                    b_role, b->name, stof_dtype_name(b->dtype), a_role, a->name,
                    stof_dtype_name(a->dtype));
}

void ops_copy_shape(graph_tensor *out, const graph_tensor *t) {
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof out->shape);
}

int64_t ops_last_dim(const graph_tensor *t) {
    return t->shape[t->ndim - 1];
}

int64_t ops_rows(const graph_tensor *t) {
    int64_t rows = 1;
    for (int d = 0; d + 1 < t->ndim; d++)
        rows *= t->shape[d];
    return rows;
}

double ops_io_bytes(const graph *g, const graph_op *op) {
    double bytes = (double)graph_tensor_bytes(ops_output(g, op));
    for (int k = 0; k < op->n_inputs; k++)
        bytes += (double)graph_tensor_bytes(ops_input(g, op, k));
    return bytes;
}

void ops_mi_cost(const graph *g, const graph_op *op, double flops_per_element, double *flops,
                 double *bytes) {
    *flops = flops_per_element * (double)graph_tensor_numel(ops_output(g, op));
    *bytes = ops_io_bytes(g, op);
}

int op_add(graph *g, const graph_op *op, int *out_tensor, stof_error *err) {
    const op_desc *d = op_describe(op->kind);
    if (!d)
        return err_set(err, STOF_ERR_INVALID, "unknown operator kind %d", (int)op->kind);
    if (op->n_inputs < d->min_inputs || op->n_inputs > d->max_inputs)
        return err_set(err, STOF_ERR_INVALID, "%s takes %d to %d inputs, got %d", d->name,
                       d->min_inputs, d->max_inputs, op->n_inputs);
    int rc = graph_check_inputs(g, op, d->name, err);
    if (rc)
        return rc;
    graph_tensor out;
    memset(&out, 0, sizeof out);
    if ((rc = d->infer(g, op, &out, err)))
        return rc;
    return graph_append_op(g, op, d->name, &out, out_tensor, err);
}
