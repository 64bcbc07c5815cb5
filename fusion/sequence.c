/* The op sequences of a graph that schemes apply to, and which layers are
 * identical so that they can share one scheme (and one tuning). */
#include "fusion/scheme.h"

#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"

int fusion_layer_ops(const graph *g, int layer, int *idx, int max) {
    int count = 0;
    for (int i = 0; i < g->n_ops; i++) {
        if (g->ops[i].layer != layer)
            continue;
        if (count < max)
            idx[count] = i;
        count++;
    }
    return count;
}

int fusion_graph_sequences(const graph *g, fusion_seq *out, int max) {
    int count = 0;
    for (int i = 0; i < g->n_ops; i++) {
        if (i > 0 && g->ops[i].layer == g->ops[i - 1].layer) {
            if (count - 1 < max)
                out[count - 1].n++;
            continue;
        }
        if (count < max)
            out[count] = (fusion_seq){g->ops[i].layer, i, 1, count};
        count++;
    }
    return count;
}

/* ---- identity ------------------------------------------------------------- */

/* Whether a tensor is a model input, an activation or the model output does
 * not change a kernel; whether it is a weight is kept, to stay strict. */
static int tensors_alike(const graph_tensor *a, const graph_tensor *b) {
    if ((a->role == GRAPH_WEIGHT) != (b->role == GRAPH_WEIGHT) || a->dtype != b->dtype ||
        a->ndim != b->ndim)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return 0;
    return 1;
}

/* The attributes that change what a kernel computes. Compared field by field
 * rather than with memcmp: the union's unused bytes are not defined. */
static int attrs_equal(const graph_op *a, const graph_op *b) {
    switch (a->kind) {
    case OP_GEMM:
        return a->attr.gemm.weight_kn == b->attr.gemm.weight_kn;
    case OP_ADD:
        return a->attr.add.has_dtype == b->attr.add.has_dtype &&
               (!a->attr.add.has_dtype || a->attr.add.dtype == b->attr.add.dtype);
    case OP_LAYERNORM:
    case OP_RMSNORM:
        return a->attr.norm.eps == b->attr.norm.eps;
    case OP_GELU:
        return a->attr.gelu.tanh == b->attr.gelu.tanh;
    case OP_GLU:
        return a->attr.glu.act == b->attr.glu.act;
    case OP_ROTARY: /* layers of other rotary thetas are other classes */
        return a->attr.rotary.heads == b->attr.rotary.heads &&
               a->attr.rotary.kv_heads == b->attr.rotary.kv_heads &&
               a->attr.rotary.head_dim == b->attr.rotary.head_dim &&
               a->attr.rotary.theta == b->attr.rotary.theta &&
               a->attr.rotary.has_positions == b->attr.rotary.has_positions;
    case OP_EMBEDDING:
        return a->attr.embedding.has_position == b->attr.embedding.has_position &&
               a->attr.embedding.has_type == b->attr.embedding.has_type &&
               a->attr.embedding.has_type_ids == b->attr.embedding.has_type_ids &&
               a->attr.embedding.has_position_ids == b->attr.embedding.has_position_ids;
    case OP_ATTENTION: {
        const op_attention *x = &a->attr.attn, *y = &b->attr.attn;
        return x->heads == y->heads && op_attention_kv_heads(x) == op_attention_kv_heads(y) &&
               x->head_dim == y->head_dim && x->cross == y->cross &&
               x->causal == y->causal && x->mask == y->mask && x->scale == y->scale &&
               x->relpos == y->relpos && x->relpos_buckets == y->relpos_buckets &&
               x->relpos_max_distance == y->relpos_max_distance &&
               x->relpos_bidirectional == y->relpos_bidirectional && x->padded == y->padded &&
               x->decode == y->decode;
    }
    default:
        return 1;
    }
}

/* Position in seq of the op that produced tensor t, -1 when made outside. */
static int producer_position(const graph *g, int t, const int *seq, int n) {
    int p = g->tensors[t].producer;
    for (int k = 0; p >= 0 && k < n; k++)
        if (seq[k] == p)
            return k;
    return -1;
}

/* 1 when op seq[k]'s output is read outside the sequence or is the model
 * output. Part of identity because it decides which segments may fuse: an
 * intermediate needed elsewhere cannot stay on chip. */
static int output_escapes(const graph *g, const int *seq, int n, int k) {
    int t = g->ops[seq[k]].output;
    if (t == g->output)
        return 1;
    for (int j = 0; j < g->n_ops; j++) {
        const graph_op *op = &g->ops[j];
        for (int i = 0; i < op->n_inputs; i++)
            if (op->inputs[i] == t && producer_position(g, g->ops[j].output, seq, n) < 0)
                return 1;
    }
    return 0;
}

static int ops_alike(const graph *g, const int *a, const int *b, int n, int k) {
    const graph_op *x = &g->ops[a[k]], *y = &g->ops[b[k]];
    if (x->kind != y->kind || x->n_inputs != y->n_inputs || !attrs_equal(x, y) ||
        !tensors_alike(&g->tensors[x->output], &g->tensors[y->output]) ||
        output_escapes(g, a, n, k) != output_escapes(g, b, n, k))
        return 0;
    for (int i = 0; i < x->n_inputs; i++) {
        int tx = x->inputs[i], ty = y->inputs[i];
        if (!tensors_alike(&g->tensors[tx], &g->tensors[ty]) ||
            producer_position(g, tx, a, n) != producer_position(g, ty, b, n))
            return 0;
    }
    return 1;
}

int fusion_layers_identical(const graph *g, const int *a, int na, const int *b, int nb) {
    if (na != nb)
        return 0;
    for (int k = 0; k < na; k++)
        if (!ops_alike(g, a, b, na, k))
            return 0;
    return 1;
}

/* The ops of every layer, in one allocation: ops of layer L start at
 * start[L] and run to start[L + 1]. */
static int layer_table(const graph *g, int **ops, int **start, stof_error *err) {
    *ops = err_malloc(sizeof **ops * (size_t)(g->n_ops + 1), err);
    *start = err_malloc(sizeof **start * (size_t)(g->n_layers + 1), err);
    if (!*ops || !*start) {
        free(*ops);
        free(*start);
        return STOF_ERR_NOMEM;
    }
    int at = 0;
    for (int L = 0; L < g->n_layers; L++) {
        (*start)[L] = at;
        at += fusion_layer_ops(g, L, *ops + at, g->n_ops - at);
    }
    (*start)[g->n_layers] = at;
    return STOF_OK;
}

int fusion_layer_classes(const graph *g, int *cls, stof_error *err) {
    int *ops, *start;
    int rc = layer_table(g, &ops, &start, err);
    if (rc)
        return rc;
    for (int L = 0; L < g->n_layers; L++) {
        cls[L] = L;
        for (int P = 0; P < L; P++) {
            /* Only representatives need comparing: identity is transitive. */
            if (cls[P] != P)
                continue;
            if (fusion_layers_identical(g, ops + start[P], start[P + 1] - start[P], ops + start[L],
                                        start[L + 1] - start[L])) {
                cls[L] = P;
                break;
            }
        }
    }
    free(ops);
    free(start);
    return STOF_OK;
}

/* Each sequence's class from the layers' (cls[L]: the first layer identical
 * to L): the first sequence of that layer, or the sequence itself when that
 * layer has none before it. */
static int class_sequences(const graph *g, fusion_seq *seqs, int n, const int *cls,
                           stof_error *err) {
    int *first_seq = err_malloc(sizeof *first_seq * (size_t)(g->n_layers + 1), err);
    if (!first_seq)
        return STOF_ERR_NOMEM;
    for (int L = 0; L < g->n_layers; L++)
        first_seq[L] = -1;
    for (int i = 0; i < n; i++) {
        int L = seqs[i].layer;
        if (L < 0)
            continue;
        if (first_seq[L] < 0)
            first_seq[L] = i;
        seqs[i].cls = first_seq[cls[L]] >= 0 ? first_seq[cls[L]] : i;
    }
    free(first_seq);
    return STOF_OK;
}

int fusion_sequences(const graph *g, fusion_seq **out, int *n, stof_error *err) {
    *out = NULL;
    *n = 0;
    int count = fusion_graph_sequences(g, NULL, 0);
    if (count == 0)
        return err_set(err, STOF_ERR_INVALID, "the graph has no ops");
    fusion_seq *seqs = err_malloc(sizeof *seqs * (size_t)count, err);
    int *cls = err_malloc(sizeof *cls * (size_t)(g->n_layers + 1), err);
    int rc = seqs && cls ? STOF_OK : STOF_ERR_NOMEM;
    if (!rc)
        rc = fusion_layer_classes(g, cls, err);
    if (!rc) {
        fusion_graph_sequences(g, seqs, count);
        rc = class_sequences(g, seqs, count, cls, err);
    }
    free(cls);
    if (rc) {
        free(seqs);
        return rc;
    }
    *out = seqs;
    *n = count;
    return STOF_OK;
}
