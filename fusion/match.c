/* Segments to templates: the dependency checks every fused kernel needs,
 * then the template table's patterns, then the epilogue flags and sizes the
 * chosen kernels are specialised with. */
#include "fusion/match.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/base/error.h"
#include "ops/ops.h"

static const char *kind_of(const graph *g, int op) {
    return op_describe(g->ops[op].kind)->name;
}

static int is_ci(const graph *g, int op) {
    return op_describe(g->ops[op].kind)->cls == OP_CLASS_CI;
}

static int is_norm(const graph *g, int op) {
    return g->ops[op].kind == OP_LAYERNORM || g->ops[op].kind == OP_RMSNORM;
}

/* Position of graph op `op` in the segment, -1 when outside it. */
static int seg_position(const int *ops, int n, int op) {
    for (int k = 0; op >= 0 && k < n; k++)
        if (ops[k] == op)
            return k;
    return -1;
}

static int input_slot(const graph_op *op, int tensor) {
    for (int i = 0; i < op->n_inputs; i++)
        if (op->inputs[i] == tensor)
            return i;
    return -1;
}

/* STOF_ERR_INVALID with "segment #a-#b (kinds): " before the reason. */
static int seg_fail(const graph *g, const int *ops, int n, stof_error *err, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int seg_fail(const graph *g, const int *ops, int n, stof_error *err, const char *fmt, ...) {
    char head[512];
    size_t len = n > 1 ? (size_t)snprintf(head, sizeof head, "segment #%d-#%d (", ops[0], ops[n - 1])
                       : (size_t)snprintf(head, sizeof head, "segment #%d (", ops[0]);
    for (int k = 0; k < n && len < sizeof head; k++)
        len += (size_t)snprintf(head + len, sizeof head - len, "%s%s", k ? " " : "",
                                kind_of(g, ops[k]));
    char reason[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    return err_set(err, STOF_ERR_INVALID, "%s): %s", head, reason);
}

/* ---- dependency checks ------------------------------------------------------------ */

static int check_arguments(const graph *g, const int *ops, int n, stof_error *err) {
    if (n < 1 || n > FUSION_MAX_OPS)
        return err_set(err, STOF_ERR_INVALID, "a segment holds 1 to %d ops, not %d",
                       FUSION_MAX_OPS, n);
    for (int k = 0; k < n; k++)
        if (ops[k] < 0 || ops[k] >= g->n_ops || (k > 0 && ops[k] <= ops[k - 1]))
            return err_set(err, STOF_ERR_INVALID,
                           "segment op %d (#%d) is not a graph op after the one before it", k,
                           ops[k]);
    return STOF_OK;
}

static int check_ci_count(const graph *g, const int *ops, int n, stof_error *err) {
    int ci = 0;
    for (int k = 0; k < n; k++)
        ci += is_ci(g, ops[k]);
    if (ci > 2)
        return seg_fail(g, ops, n, err, "holds %d compute-intensive ops (at most 2)", ci);
    return STOF_OK;
}

/* Op k reads op k-1's output and nothing else made inside the segment (a GEMM's
 * weight operand is never made by an op: ops_gemm_infer refuses it). */
static int check_chain_link(const graph *g, const int *ops, int n, int k, stof_error *err) {
    const graph_op *op = &g->ops[ops[k]];
    int prev = ops[k - 1];
    int slot = input_slot(op, g->ops[prev].output);
    if (slot < 0)
        return seg_fail(g, ops, n, err,
                        "#%d (%s) does not read the output of #%d (%s): the ops of a segment "
                        "must form a chain", ops[k], kind_of(g, ops[k]), prev, kind_of(g, prev));
    for (int i = 0; i < op->n_inputs; i++) {
        int p = seg_position(ops, n, g->tensors[op->inputs[i]].producer);
        if (p >= 0 && p != k - 1)
            return seg_fail(g, ops, n, err,
                            "#%d (%s) reads the output of #%d (%s), which is inside the segment "
                            "but not the op before it", ops[k], kind_of(g, ops[k]), ops[p],
                            kind_of(g, ops[p]));
    }
    return STOF_OK;
}

/* A norm that opens a segment before its GEMM (a prologue: the GEMM normalizes its rows of x
 * as it reads them). */
static int is_prologue_norm(const graph *g, const int *ops, int n, int k) {
    return k == 0 && n > 1 && is_norm(g, ops[0]) && g->ops[ops[1]].kind == OP_GEMM;
}

static int check_norms(const graph *g, const int *ops, int n, stof_error *err) {
    for (int k = 0; k + 1 < n; k++)
        if (is_norm(g, ops[k]) && !is_prologue_norm(g, ops, n, k))
            return seg_fail(g, ops, n, err,
                            "%s #%d in the middle of a segment (a norm can only end one, or "
                            "open one before its GEMM)", kind_of(g, ops[k]), ops[k]);
    return STOF_OK;
}

/* The first op outside the segment that reads tensor t, -1 when none. */
static int outside_reader(const graph *g, const int *ops, int n, int t) {
    for (int j = 0; j < g->n_ops; j++)
        if (seg_position(ops, n, j) < 0 && input_slot(&g->ops[j], t) >= 0)
            return j;
    return -1;
}

/* Intermediates stay on chip, so none may be needed elsewhere; the input
 * of a closing norm may (the caller then needs a template that stores it). */
static int check_escapes(const graph *g, const int *ops, int n, int *store_pre_norm,
                         stof_error *err) {
    *store_pre_norm = 0;
    for (int k = 0; k + 1 < n; k++) {
        int t = g->ops[ops[k]].output;
        int pre_norm = k == n - 2 && is_norm(g, ops[n - 1]);
        if (t == g->output)
            return seg_fail(g, ops, n, err, "the output of #%d (%s) is the model output",
                            ops[k], kind_of(g, ops[k]));
        int j = outside_reader(g, ops, n, t);
        if (j < 0)
            continue;
        if (!pre_norm)
            return seg_fail(g, ops, n, err,
                            "op #%d (%s) outside the segment reads #%d's output (fusing would "
                            "drop it)", j, kind_of(g, j), ops[k]);
        *store_pre_norm = 1;
    }
    return STOF_OK;
}

static int check_dependencies(const graph *g, const int *ops, int n, int *store_pre_norm,
                              stof_error *err) {
    int rc = check_ci_count(g, ops, n, err);
    for (int k = 1; !rc && k < n; k++)
        rc = check_chain_link(g, ops, n, k, err);
    if (!rc)
        rc = check_norms(g, ops, n, err);
    if (!rc)
        rc = check_escapes(g, ops, n, store_pre_norm, err);
    return rc;
}

/* ---- what the kernels are specialised with ------------------------------------------- */

static void fill_epilogues(const graph *g, const int *ops, int n, fusion_match *m) {
    int stage = 0;
    for (int k = 0; k < n; k++) {
        const graph_op *op = &g->ops[ops[k]];
        if (is_prologue_norm(g, ops, n, k)) {
            m->prologue = op->kind == OP_LAYERNORM ? FUSION_NORM_LAYERNORM : FUSION_NORM_RMSNORM;
            continue;
        }
        if (is_ci(g, ops[k])) {
            stage = m->n_ci++ > 0 ? 1 : 0;
            continue;
        }
        fusion_epilogue *e = &m->epi[stage];
        switch (op->kind) {
        case OP_BIAS: e->has_bias = 1; break;
        case OP_ADD: e->has_residual = 1; break;
        case OP_RELU: e->act = FUSION_ACT_RELU; break;
        case OP_GELU: e->act = op->attr.gelu.tanh ? FUSION_ACT_GELU_TANH : FUSION_ACT_GELU; break;
        case OP_LAYERNORM: e->norm = FUSION_NORM_LAYERNORM; break;
        case OP_RMSNORM: e->norm = FUSION_NORM_RMSNORM; break;
        default: break;
        }
    }
}

static int64_t last_dim(const graph_tensor *t) {
    return t->shape[t->ndim - 1];
}

/* Rows and features of op's output. */
static void rows_features(const graph *g, int op, int64_t *m, int64_t *n) {
    const graph_tensor *out = &g->tensors[g->ops[op].output];
    *n = last_dim(out);
    *m = *n ? graph_tensor_numel(out) / *n : 0;
}

static void fill_attention_dims(const graph *g, const graph_op *op, fusion_dims *d) {
    const graph_tensor *out = &g->tensors[op->output];
    const graph_tensor *kv = &g->tensors[op->inputs[op->attr.attn.cross ? 1 : 0]];
    d->batch = (int)out->shape[0];
    d->q_len = (int)out->shape[1];
    d->k_len = (int)kv->shape[1];
    d->heads = op->attr.attn.heads;
    d->kv_heads = op_attention_kv_heads(&op->attr.attn);
    d->head_dim = op->attr.attn.head_dim;
}

static void fill_dims(const graph *g, const int *ops, int n, fusion_dims *d) {
    int ci_seen = 0;
    d->elem_bytes = (int)stof_dtype_size(g->tensors[g->ops[ops[n - 1]].output].dtype);
    rows_features(g, ops[0], &d->m, &d->n);
    for (int k = 0; k < n; k++) {
        const graph_op *op = &g->ops[ops[k]];
        const int prologue = is_prologue_norm(g, ops, n, k);
        d->prologue |= prologue; /* its statistics are the block's own: no row reduction */
        d->row_reduce |= (is_norm(g, ops[k]) && !prologue) || op->kind == OP_SOFTMAX;
        d->gated |= op->kind == OP_GLU && k > 0;
        if (op->kind == OP_ATTENTION)
            fill_attention_dims(g, op, d);
        if (op->kind == OP_ROTARY) {
            d->heads = op->attr.rotary.heads;
            d->head_dim = op->attr.rotary.head_dim;
        }
        if (op->kind != OP_GEMM)
            continue;
        int64_t m, f;
        rows_features(g, ops[k], &m, &f);
        if (ci_seen++ == 0) {
            d->m = m;
            d->n = f;
            d->k = last_dim(&g->tensors[op->inputs[0]]);
            d->weight_kn = op->attr.gemm.weight_kn;
        } else {
            d->n2 = f;
        }
    }
}

/* ---- matching ------------------------------------------------------------------------- */

static unsigned matching_templates(const graph *g, const int *ops, int n, int store_pre_norm) {
    unsigned tokens[FUSION_MAX_OPS], found = 0;
    for (int k = 0; k < n; k++)
        tokens[k] = fusion_op_token(&g->ops[ops[k]]);
    for (int t = 0; t < FUSION_T_COUNT; t++) {
        const fusion_template *tp = fusion_template_get((fusion_template_id)t);
        if (store_pre_norm && !(tp->flags & FUSION_TF_STORES_PRE_NORM))
            continue;
        if (fusion_template_accepts(tp, tokens, n))
            found |= 1u << t;
    }
    return found;
}

int fusion_match_segment(const graph *g, const int *ops, int n, fusion_match *out,
                         stof_error *err) {
    memset(out, 0, sizeof *out);
    int rc = check_arguments(g, ops, n, err);
    if (!rc)
        rc = check_dependencies(g, ops, n, &out->store_pre_norm, err);
    if (rc)
        return rc;
    out->templates = matching_templates(g, ops, n, out->store_pre_norm);
    if (!out->templates)
        return seg_fail(g, ops, n, err, "no template implements it%s",
                        out->store_pre_norm ? " while also writing the norm's input" : "");
    fill_epilogues(g, ops, n, out);
    fill_dims(g, ops, n, &out->dims);
    return STOF_OK;
}

int fusion_match_has(const fusion_match *m, fusion_template_id t) {
    return (int)t >= 0 && t < FUSION_T_COUNT && ((m->templates >> t) & 1u);
}

int fusion_match_count(const fusion_match *m) {
    int c = 0;
    for (int t = 0; t < FUSION_T_COUNT; t++)
        c += fusion_match_has(m, (fusion_template_id)t);
    return c;
}
