/* The launcher table: for each template, whether and how a segment runs on
 * it. The CPU half (supports) reads a segment's ops into the kernel's
 * problem and asks the kernel's own validation; the GPU half plans the
 * kernel, binds the segment's tensors and launches it.
 *
 * Which operand is which comes from the graph, never from op positions
 * alone: the residual of an add is whichever input the chain did not
 * produce. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/exec/exec_impl.h"
#include "ops/ops.h"

/* ---- naming ------------------------------------------------------------------------------ */

const char *exec_segment_name(const graph *g, int first, int n, char *buf, size_t cap) {
    size_t len = n > 1 ? (size_t)snprintf(buf, cap, "segment #%d-#%d (", first, first + n - 1)
                       : (size_t)snprintf(buf, cap, "segment #%d (", first);
    for (int k = 0; k < n && len < cap; k++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", k ? " " : "",
                                op_describe(g->ops[first + k].kind)->name);
    if (len < cap)
        snprintf(buf + len, cap - len, ")");
    return buf;
}

/* The launchers' supports() say why without naming the segment: their
 * callers do (exec_plan.c). */
static int unsupported(stof_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int unsupported(stof_error *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = err_setv(err, STOF_ERR_UNSUPPORTED, fmt, ap);
    va_end(ap);
    return rc;
}

static const graph_tensor *tensor(const graph *g, int t) {
    return &g->tensors[t];
}

static int64_t last_dim(const graph_tensor *t) {
    return t->shape[t->ndim - 1];
}

/* The input of op that its chain predecessor did not produce (an add's
 * residual), -1 when both are the predecessor's. */
static int other_input(const graph_op *op, int prev_out) {
    if (op->inputs[0] != prev_out)
        return op->inputs[0];
    return op->inputs[1] != prev_out ? op->inputs[1] : -1;
}

static int is_act(op_kind k) {
    return k == OP_GELU || k == OP_RELU;
}

static int is_norm(op_kind k) {
    return k == OP_LAYERNORM || k == OP_RMSNORM;
}

/* The STOF_ACT_* code of a GLU op's activation (OP_GLU_*), -1 for an unknown one. */
static int glu_act_code(int act) {
    static const int code[] = {[OP_GLU_GELU] = STOF_ACT_GELU,
                               [OP_GLU_GELU_TANH] = STOF_ACT_GELU_TANH,
                               [OP_GLU_SILU] = STOF_ACT_SILU};
    return act >= 0 && act <= OP_GLU_SILU ? code[act] : -1;
}

/* ---- the GEMM family: gemm_epilogue, cublaslt, gemm_ln, gemm_chain, gemv ------------------- */

/* One GEMM and the epilogue ops after it: the operands each op brings. */
typedef struct gemm_roles {
    int x, w, bias, residual, gamma, beta;
    float eps;
} gemm_roles;

/* Ops first .. first + n - 1: a GEMM, then bias, activation, add and a
 * closing norm as matched (the matcher fixed their order) into r, and the
 * problem of template tmpl with epilogue epi over the GEMM's output. */
static int gemm_read(const graph *g, int first, int n, fusion_template_id tmpl,
                     const fusion_epilogue *epi, gemm_exec_problem *p, gemm_roles *r,
                     stof_error *err) {
    const graph_op *op0 = &g->ops[first];
    const graph_tensor *y = tensor(g, op0->output);
    *r = (gemm_roles){op0->inputs[0], op0->inputs[1], -1, -1, -1, -1, 0.0f};
    int glu_act = 0;
    for (int k = 1; k < n; k++) {
        const graph_op *op = &g->ops[first + k];
        int prev = g->ops[first + k - 1].output;
        if (op->kind == OP_BIAS) {
            r->bias = op->inputs[1];
        } else if (op->kind == OP_ADD && (r->residual = other_input(op, prev)) < 0) {
            return unsupported(err,
                               "#%d adds the GEMM's result to itself (%s adds a residual made "
                               "elsewhere)", first + k, fusion_template_get(tmpl)->name);
        } else if (is_norm(op->kind)) {
            r->gamma = op->inputs[1];
            r->beta = op->kind == OP_LAYERNORM ? op->inputs[2] : -1;
            r->eps = op->attr.norm.eps;
        } else if (op->kind == OP_GLU) {
            glu_act = glu_act_code(op->attr.glu.act);
        }
    }
    memset(p, 0, sizeof *p);
    p->tmpl = tmpl;
    p->dtype = y->dtype;
    p->n = last_dim(y);
    p->m = p->n ? graph_tensor_numel(y) / p->n : 0;
    p->k = last_dim(tensor(g, r->x));
    p->epi = *epi;
    p->weight_kn = op0->attr.gemm.weight_kn;
    p->eps = r->eps;
    p->glu_act = glu_act;
    return STOF_OK;
}

/* gemv with a norm ahead (match.prologue): the norm's input is x, its gain and bias the
 * roles' gamma and beta. */
static int gemv_read_prologue(const graph *g, int first, int n, const fusion_match *m,
                              gemm_exec_problem *p, gemm_roles *r, stof_error *err) {
    const graph_op *norm = &g->ops[first];
    int rc = gemm_read(g, first + 1, n - 1, FUSION_T_GEMV, &m->epi[0], p, r, err);
    if (rc)
        return rc;
    r->x = norm->inputs[0];
    r->gamma = norm->inputs[1];
    r->beta = norm->kind == OP_LAYERNORM ? norm->inputs[2] : -1;
    p->eps = norm->attr.norm.eps;
    p->prologue = m->prologue;
    return STOF_OK;
}

/* gemm_epilogue (gemm [bias] [act] [add] [norm]), cublaslt (gemm [bias]
 * [act] [add]) and gemm_ln (gemm [bias] [add] norm); the norm's input
 * stored when the match says so. */
static int gemm_read_seg(const graph *g, int first, int n, const fusion_match *m,
                         fusion_template_id tmpl, gemm_exec_problem *p, gemm_roles *r,
                         stof_error *err) {
    if (m->prologue != FUSION_NORM_NONE)
        return tmpl == FUSION_T_GEMV ? gemv_read_prologue(g, first, n, m, p, r, err)
                                     : unsupported(err, "%s has no norm ahead of the GEMM",
                                                   fusion_template_get(tmpl)->name);
    int rc = gemm_read(g, first, n, tmpl, &m->epi[0], p, r, err);
    if (!rc && (tmpl == FUSION_T_GEMM_LN || tmpl == FUSION_T_GEMM_EPILOGUE))
        p->store_pre_norm = m->store_pre_norm;
    return rc;
}

/* gemm_chain: gemm [bias] [act] | gemm [bias] [add], the second GEMM
 * reading the first's (activated) result. */
typedef struct chain_roles {
    gemm_roles first, second;
} chain_roles;

static int chain_read(const graph *g, int first, int n, const fusion_match *m,
                      gemm_exec_problem *p, chain_roles *r, stof_error *err) {
    int j = 1;
    while (j < n && g->ops[first + j].kind != OP_GEMM)
        j++;
    if (j >= n)
        return unsupported(err, "gemm_chain needs a second GEMM");
    gemm_exec_problem p2;
    int rc = gemm_read(g, first, j, FUSION_T_GEMM_CHAIN, &m->epi[0], p, &r->first, err);
    if (!rc)
        rc = gemm_read(g, first + j, n - j, FUSION_T_GEMM_CHAIN, &m->epi[1], &p2, &r->second,
                       err);
    if (rc)
        return rc;
    if (p2.weight_kn != p->weight_kn)
        return unsupported(err,
                           "#%d and #%d store their weights differently ([K,N] and [N,K]); "
                           "gemm_chain takes one layout for both", first, first + j);
    if (p2.k != p->n)
        return unsupported(err, "#%d reduces over %lld features, but #%d makes %lld",
                           first + j, (long long)p2.k, first, (long long)p->n);
    p->n2 = p2.n;
    p->epi2 = p2.epi;
    return STOF_OK;
}

static int gemm_supports(const graph *g, int first, int n, const fusion_match *m,
                         stof_error *err) {
    gemm_exec_problem p;
    gemm_roles r;
    int rc = gemm_read_seg(g, first, n, m, FUSION_T_GEMM_EPILOGUE, &p, &r, err);
    return rc ? rc : gemm_exec_validate(&p, err);
}

static int gemv_supports(const graph *g, int first, int n, const fusion_match *m,
                         stof_error *err) {
    gemm_exec_problem p;
    gemm_roles r;
    int rc = gemm_read_seg(g, first, n, m, FUSION_T_GEMV, &p, &r, err);
    return rc ? rc : gemm_exec_validate(&p, err);
}

static int ln_supports(const graph *g, int first, int n, const fusion_match *m,
                       stof_error *err) {
    gemm_exec_problem p;
    gemm_roles r;
    int rc = gemm_read_seg(g, first, n, m, FUSION_T_GEMM_LN, &p, &r, err);
    return rc ? rc : gemm_exec_validate(&p, err);
}

static int chain_supports(const graph *g, int first, int n, const fusion_match *m,
                          stof_error *err) {
    gemm_exec_problem p;
    chain_roles r;
    int rc = chain_read(g, first, n, m, &p, &r, err);
    return rc ? rc : gemm_exec_validate(&p, err);
}

static int lt_supports(const graph *g, int first, int n, const fusion_match *m,
                       stof_error *err) {
    gemm_exec_problem p;
    gemm_roles r;
    int rc = gemm_read_seg(g, first, n, m, FUSION_T_CUBLASLT, &p, &r, err);
    return rc ? rc : cublaslt_exec_validate(&p, err);
}

/* ---- mi_chain: (bias|add)* [act] [norm] ------------------------------------------------------ */

typedef struct mi_roles {
    int x, bias, residual, gamma, beta;
    float eps;
} mi_roles;

/* mi_chain computes x (+ bias) (+ residual), then the activation, then the
 * norm: a chain in another order (an add after the activation), with two of
 * one kind, or with a softmax is not what it computes. */
static int mi_stage(op_kind k) {
    return k == OP_BIAS || k == OP_ADD ? 0 : is_act(k) ? 1 : is_norm(k) ? 2 : -1;
}

static int mi_read(const graph *g, int first, int n, const fusion_match *m,
                   gemm_exec_problem *p, mi_roles *r, stof_error *err) {
    *r = (mi_roles){g->ops[first].inputs[0], -1, -1, -1, -1, 0.0f};
    int stage = 0, acts = 0;
    for (int k = 0; k < n; k++) {
        const graph_op *op = &g->ops[first + k];
        const char *kind = op_describe(op->kind)->name;
        int st = mi_stage(op->kind);
        if (st < 0)
            return unsupported(err, "the mi_chain kernel has no %s", kind);
        if (st < stage)
            return unsupported(err,
                               "#%d (%s) comes after the activation or norm, but the mi_chain "
                               "kernel adds bias and residual first, then activates, then "
                               "normalizes", first + k, kind);
        stage = st;
        int prev = k ? g->ops[first + k - 1].output : -1;
        int *slot = op->kind == OP_BIAS ? &r->bias : op->kind == OP_ADD ? &r->residual : NULL;
        if (slot && *slot >= 0)
            return unsupported(err, "#%d is a second %s (mi_chain takes one)", first + k,
                               kind);
        if (is_act(op->kind) && acts++)
            return unsupported(err, "#%d is a second activation (mi_chain takes one)",
                               first + k);
        if (op->kind == OP_BIAS) {
            r->bias = op->inputs[1];
        } else if (op->kind == OP_ADD) {
            r->residual = k ? other_input(op, prev) : op->inputs[1];
            if (r->residual < 0)
                return unsupported(err, "#%d adds the chain's value to itself", first + k);
        } else if (is_norm(op->kind)) {
            r->gamma = op->inputs[1];
            r->beta = op->kind == OP_LAYERNORM ? op->inputs[2] : -1;
            r->eps = op->attr.norm.eps;
        }
    }
    const graph_tensor *y = tensor(g, g->ops[first + n - 1].output);
    memset(p, 0, sizeof *p);
    p->tmpl = FUSION_T_MI_CHAIN;
    p->dtype = y->dtype;
    if (graph_has_streams(g)) { /* fp32 tensors beside a model of f16 or bf16 */
        p->dtype = g->tensors[g->output].dtype;
        const int out = g->ops[first + n - 1].output;
        const int pre = m->store_pre_norm && n >= 2 ? g->ops[first + n - 2].output : -1;
        p->f32 = (graph_tensor_is_stream(g, r->x) ? GEMM_F32_X : 0u) |
                 (graph_tensor_is_stream(g, r->residual) ? GEMM_F32_RESIDUAL : 0u) |
                 (graph_tensor_is_stream(g, out) ? GEMM_F32_Y : 0u) |
                 (graph_tensor_is_stream(g, pre) ? GEMM_F32_PRE_NORM : 0u);
        if ((r->bias >= 0 && tensor(g, r->bias)->dtype != p->dtype) ||
            (r->gamma >= 0 && tensor(g, r->gamma)->dtype != p->dtype))
            return unsupported(err, "mi_chain: a bias or gain in another dtype than the "
                               "model's %s", stof_dtype_name(p->dtype));
    }
    p->n = last_dim(y);
    p->m = p->n ? graph_tensor_numel(y) / p->n : 0;
    p->epi = m->epi[0];
    p->store_pre_norm = m->store_pre_norm;
    p->eps = r->eps;
    return STOF_OK;
}

static int mi_supports(const graph *g, int first, int n, const fusion_match *m,
                       stof_error *err) {
    gemm_exec_problem p;
    mi_roles r;
    int rc = mi_read(g, first, n, m, &p, &r, err);
    return rc ? rc : gemm_exec_validate(&p, err);
}

/* ---- embedding ------------------------------------------------------------------------------- */

typedef struct embed_roles {
    int ids, word, pos, type, type_ids, pos_ids;
} embed_roles;

static void embed_read(const graph *g, int first, gemm_exec_problem *p, embed_roles *r) {
    const graph_op *op = &g->ops[first];
    const graph_tensor *ids = tensor(g, op->inputs[0]), *y = tensor(g, op->output);
    int has_pos = op->attr.embedding.has_position != 0, has_type = op->attr.embedding.has_type != 0;
    int has_ids = has_type && op->attr.embedding.has_type_ids;
    int has_pos_ids = has_pos && op->attr.embedding.has_position_ids;
    *r = (embed_roles){op->inputs[0], op->inputs[1], has_pos ? op->inputs[2] : -1,
                       has_type ? op->inputs[2 + has_pos] : -1,
                       has_ids ? op->inputs[3 + has_pos] : -1,
                       has_pos_ids ? op->inputs[op->n_inputs - 1] : -1};
    memset(p, 0, sizeof *p);
    p->tmpl = FUSION_T_EMBEDDING;
    p->dtype = y->dtype;
    p->m = graph_tensor_numel(ids);
    p->n = last_dim(y);
    p->seq_len = (int)ids->shape[ids->ndim - 1];
    p->vocab = (int)tensor(g, r->word)->shape[0];
    p->has_position = has_pos;
    p->has_type = has_type;
    p->has_type_ids = has_ids;
    p->has_position_ids = has_pos_ids;
    p->pos_rows = has_pos ? (int)tensor(g, r->pos)->shape[0] : 0;
    p->type_vocab = has_type ? (int)tensor(g, r->type)->shape[0] : 0;
}

static int embed_supports(const graph *g, int first, int n, const fusion_match *m,
                          stof_error *err) {
    gemm_exec_problem p;
    embed_roles r;
    embed_read(g, first, &p, &r);
    return gemm_exec_validate(&p, err);
}

/* ---- glu, rotary and mask_rows: one op a segment, its input to its output ---------------------- */

/* The problem of elementwise op `first`: rows of its output's last dim
 * (mask_rows: B x S rows of the rest), and the op's own attributes. */
static void elementwise_read(const graph *g, int first, gemm_exec_problem *p) {
    const graph_op *op = &g->ops[first];
    const graph_tensor *y = tensor(g, op->output);
    memset(p, 0, sizeof *p);
    p->dtype = y->dtype;
    p->n = last_dim(y);
    if (op->kind == OP_MASK_ROWS)
        p->n = y->ndim >= 2 ? graph_tensor_numel(y) / (y->shape[0] * y->shape[1]) : 0;
    p->m = p->n ? graph_tensor_numel(y) / p->n : 0;
    if (op->kind == OP_GLU) {
        p->tmpl = FUSION_T_GLU;
        p->glu_act = glu_act_code(op->attr.glu.act);
    } else if (op->kind == OP_ROTARY) {
        p->tmpl = FUSION_T_ROTARY;
        p->seq_len = y->ndim == 3 ? (int)y->shape[1] : 0;
        p->heads = op->attr.rotary.heads;
        p->kv_heads = op->attr.rotary.kv_heads;
        p->head_dim = op->attr.rotary.head_dim;
        p->theta = op->attr.rotary.theta;
        p->has_position_ids = op->attr.rotary.has_positions;
    } else {
        p->tmpl = FUSION_T_MASK_ROWS;
    }
}

static int elementwise_supports(const graph *g, int first, int n, const fusion_match *m,
                                stof_error *err) {
    gemm_exec_problem p;
    elementwise_read(g, first, &p);
    return gemm_exec_validate(&p, err);
}

/* ---- the GEMM family on the GPU ---------------------------------------------------------------- */

static int gx_problem(const graph *g, const exec_segment *s, gemm_exec_problem *p,
                      stof_error *err) {
    switch (s->tmpl) {
    case FUSION_T_GEMM_EPILOGUE:
    case FUSION_T_GEMM_LN:
    case FUSION_T_CUBLASLT:
    case FUSION_T_GEMV: {
        gemm_roles r;
        return gemm_read_seg(g, s->first, s->n, &s->match, s->tmpl, p, &r, err);
    }
    case FUSION_T_GEMM_CHAIN: {
        chain_roles r;
        return chain_read(g, s->first, s->n, &s->match, p, &r, err);
    }
    case FUSION_T_MI_CHAIN: {
        mi_roles r;
        return mi_read(g, s->first, s->n, &s->match, p, &r, err);
    }
    case FUSION_T_GLU:
    case FUSION_T_ROTARY:
    case FUSION_T_MASK_ROWS:
        elementwise_read(g, s->first, p);
        return STOF_OK;
    default: {
        embed_roles r;
        embed_read(g, s->first, p, &r);
        return STOF_OK;
    }
    }
}

static int gx_plan_problem(exec_model *m, const exec_segment *s, const gemm_exec_problem *p,
                           void **kplan, stof_error *err) {
    gemm_exec_plan *plan = NULL;
    int rc = gemm_exec_plan_create(m->ctx->gemm, p, s->has_values ? s->values : NULL, &plan,
                                   err);
    *kplan = plan;
    return rc;
}

static int gx_plan(exec_model *m, const exec_segment *s, void **kplan, stof_error *err) {
    gemm_exec_problem p;
    int rc = gx_problem(m->plan->g, s, &p, err);
    return rc ? rc : gx_plan_problem(m, s, &p, kplan, err);
}

static void gx_free(exec_model *m, void *kplan) {
    gemm_exec_plan_free(m->ctx->gemm, kplan);
}

static CUdeviceptr ptr_of(const exec_model *m, int t) {
    return t >= 0 ? m->ptr[t] : 0;
}

static int gemm_bind(exec_model *m, const exec_segment *s, exec_seg_rt *rt, stof_error *err) {
    gemm_exec_problem p;
    gemm_roles r;
    int rc = gemm_read_seg(m->plan->g, s->first, s->n, &s->match, s->tmpl, &p, &r, err);
    if (rc)
        return rc;
    rt->t.gemm = (gemm_exec_gemm_tensors){.x = ptr_of(m, r.x), .w = ptr_of(m, r.w),
                                          .bias = ptr_of(m, r.bias),
                                          .residual = ptr_of(m, r.residual),
                                          .y = ptr_of(m, s->out),
                                          .gamma = ptr_of(m, r.gamma),
                                          .beta = ptr_of(m, r.beta),
                                          .pre_norm = ptr_of(m, s->pre_norm)};
    return STOF_OK;
}

static int gemm_launch(exec_model *m, const exec_seg_rt *rt, CUstream st, stof_error *err) {
    return gemm_exec_gemm(m->ctx->gemm, rt->kplan, &rt->t.gemm, st, err);
}

static int ln_bind(exec_model *m, const exec_segment *s, exec_seg_rt *rt, stof_error *err) {
    gemm_exec_problem p;
    gemm_roles r;
    int rc = gemm_read_seg(m->plan->g, s->first, s->n, &s->match, FUSION_T_GEMM_LN, &p, &r, err);
    if (rc)
        return rc;
    rt->t.ln = (gemm_exec_ln_tensors){.x = ptr_of(m, r.x), .w = ptr_of(m, r.w),
                                      .bias = ptr_of(m, r.bias),
                                      .residual = ptr_of(m, r.residual),
                                      .gamma = ptr_of(m, r.gamma), .beta = ptr_of(m, r.beta),
                                      .y = ptr_of(m, s->out), .pre_norm = ptr_of(m, s->pre_norm)};
    return STOF_OK;
}

static int ln_launch(exec_model *m, const exec_seg_rt *rt, CUstream st, stof_error *err) {
    return gemm_exec_gemm_ln(m->ctx->gemm, rt->kplan, &rt->t.ln, st, err);
}

static int chain_bind(exec_model *m, const exec_segment *s, exec_seg_rt *rt, stof_error *err) {
    gemm_exec_problem p;
    chain_roles r;
    int rc = chain_read(m->plan->g, s->first, s->n, &s->match, &p, &r, err);
    if (rc)
        return rc;
    rt->t.chain = (gemm_exec_chain_tensors){.x = ptr_of(m, r.first.x), .w1 = ptr_of(m, r.first.w),
                                            .b1 = ptr_of(m, r.first.bias),
                                            .w2 = ptr_of(m, r.second.w),
                                            .b2 = ptr_of(m, r.second.bias),
                                            .residual = ptr_of(m, r.second.residual),
                                            .y = ptr_of(m, s->out)};
    return STOF_OK;
}

static int chain_launch(exec_model *m, const exec_seg_rt *rt, CUstream st, stof_error *err) {
    return gemm_exec_gemm_chain(m->ctx->gemm, rt->kplan, &rt->t.chain, st, err);
}

static int mi_bind(exec_model *m, const exec_segment *s, exec_seg_rt *rt, stof_error *err) {
    gemm_exec_problem p;
    mi_roles r;
    int rc = mi_read(m->plan->g, s->first, s->n, &s->match, &p, &r, err);
    if (rc)
        return rc;
    rt->t.mi = (gemm_exec_mi_tensors){.x = ptr_of(m, r.x), .bias = ptr_of(m, r.bias),
                                      .residual = ptr_of(m, r.residual),
                                      .gamma = ptr_of(m, r.gamma), .beta = ptr_of(m, r.beta),
                                      .y = ptr_of(m, s->out), .pre_norm = ptr_of(m, s->pre_norm)};
    return STOF_OK;
}

static int mi_launch(exec_model *m, const exec_seg_rt *rt, CUstream st, stof_error *err) {
    return gemm_exec_mi_chain(m->ctx->gemm, rt->kplan, &rt->t.mi, st, err);
}

static int embed_bind(exec_model *m, const exec_segment *s, exec_seg_rt *rt, stof_error *err) {
    gemm_exec_problem p;
    embed_roles r;
    embed_read(m->plan->g, s->first, &p, &r);
    rt->t.embed = (gemm_exec_embed_tensors){.ids = ptr_of(m, r.ids), .word = ptr_of(m, r.word),
                                            .pos = ptr_of(m, r.pos), .type = ptr_of(m, r.type),
                                            .type_ids = ptr_of(m, r.type_ids),
                                            .pos_ids = ptr_of(m, r.pos_ids),
                                            .out = ptr_of(m, s->out)};
    return STOF_OK;
}

static int embed_launch(exec_model *m, const exec_seg_rt *rt, CUstream st, stof_error *err) {
    return gemm_exec_embedding(m->ctx->gemm, rt->kplan, &rt->t.embed, st, err);
}

static int embed_status(exec_model *m, const exec_seg_rt *rt, stof_error *err) {
    return gemm_exec_embedding_status(m->ctx->gemm, rt->kplan, rt->t.embed.ids,
                                      rt->t.embed.type_ids, m->stream, NULL,
                                      err);
}

static size_t gx_describe(const void *kplan, char *buf, size_t n) {
    return gemm_exec_plan_describe(kplan, buf, n);
}

static fusion_template_id gx_actual(const void *kplan, fusion_template_id planned) {
    return ((const gemm_exec_plan *)kplan)->problem.tmpl;
}

/* ---- cublaslt on the GPU ------------------------------------------------------------------- */

/* The context's cuBLASLt handle, made by the first plan that needs it. */
static int lt_ctx(exec_ctx *c, stof_error *err) {
    return c->lt ? STOF_OK : cublaslt_exec_ctx_create(c->ordinal, &c->lt, err);
}

/* The heuristic's top algorithms; the ALGO parameter picks one of them.
 * An index past what the heuristic offered is STOF_ERR_UNSUPPORTED (the
 * search stores the setting as infeasible). */
static int lt_plan_problem(exec_model *m, const exec_segment *s, const gemm_exec_problem *p,
                           void **kplan, stof_error *err) {
    *kplan = NULL;
    int rc = lt_ctx(m->ctx, err);
    cublaslt_exec_plan *plan = NULL;
    if (!rc)
        rc = cublaslt_exec_plan_create(m->ctx->lt, p, NULL, &plan, err);
    if (!rc && s->has_values)
        rc = cublaslt_exec_plan_select(plan, s->values[0], err);
    if (rc) {
        if (plan)
            cublaslt_exec_plan_free(m->ctx->lt, plan);
        return rc;
    }
    *kplan = plan;
    return STOF_OK;
}

static int lt_plan(exec_model *m, const exec_segment *s, void **kplan, stof_error *err) {
    *kplan = NULL;
    gemm_exec_problem p;
    int rc = gx_problem(m->plan->g, s, &p, err);
    return rc ? rc : lt_plan_problem(m, s, &p, kplan, err);
}

static void lt_free(exec_model *m, void *kplan) {
    cublaslt_exec_plan_free(m->ctx->lt, kplan);
}

static int lt_launch(exec_model *m, const exec_seg_rt *rt, CUstream st, stof_error *err) {
    return cublaslt_exec_gemm(m->ctx->lt, rt->kplan, &rt->t.gemm, st, err);
}

static size_t lt_describe(const void *kplan, char *buf, size_t n) {
    return cublaslt_exec_plan_describe(kplan, buf, n);
}

/* ---- a token-wise segment over packed rows (exec_pack.c) ----------------------------------------- */

int exec_launch_plan_rows(exec_model *m, const exec_segment *s, int64_t rows, void **kplan,
                          stof_error *err) {
    *kplan = NULL;
    gemm_exec_problem p;
    int rc = gx_problem(m->plan->g, s, &p, err);
    if (rc)
        return rc;
    p.m = rows;
    if (s->tmpl == FUSION_T_EMBEDDING || s->tmpl == FUSION_T_ROTARY) {
        /* packed rows are no longer whole sequences: each reads its position */
        p.has_position_ids = s->tmpl == FUSION_T_ROTARY || p.has_position;
        p.seq_len = 1;
    }
    int (*make)(exec_model *, const exec_segment *, const gemm_exec_problem *, void **,
                stof_error *) = s->tmpl == FUSION_T_CUBLASLT ? lt_plan_problem : gx_plan_problem;
    rc = make(m, s, &p, kplan, err);
    if (rc && rc != STOF_ERR_NOMEM && s->has_values) {
        /* the tuned setting does not take this many rows (cuBLASLt's heuristic offers other
         * algorithms for them): the defaults do */
        exec_segment plain = *s;
        plain.has_values = 0;
        err_clear(err);
        rc = make(m, &plain, &p, kplan, err);
    }
    return rc;
}

/* ---- attention ----------------------------------------------------------------------------------- */

static void attn_read(const graph *g, int first, mha_exec_problem *p) {
    const graph_op *op = &g->ops[first];
    const op_attention *a = &op->attr.attn;
    const graph_tensor *y = tensor(g, op->output);
    const graph_tensor *kv = tensor(g, op->inputs[a->cross ? 1 : 0]);
    memset(p, 0, sizeof *p);
    p->mask = a->mask >= 0 && a->mask < g->n_masks ? g->masks[a->mask] : NULL;
    p->causal = a->causal;
    p->batch = (int)y->shape[0];
    p->heads = a->heads;
    p->kv_heads = op_attention_kv_heads(a);
    p->head_dim = a->head_dim;
    p->q_len = (int)y->shape[1];
    p->k_len = (int)kv->shape[1];
    p->dtype = y->dtype;
    p->scale = a->scale;
    p->relpos = a->relpos;
    p->padded = a->padded;
    p->global_keys = a->global_keys;
    p->relpos_buckets = a->relpos_buckets;
    p->relpos_max_distance = a->relpos_max_distance;
    p->relpos_bidirectional = a->relpos_bidirectional;
}

static int attn_supports(const graph *g, int first, int n, const fusion_match *m,
                         stof_error *err) {
    if (g->ops[first].attr.attn.decode)
        return err_set(err, STOF_ERR_UNSUPPORTED, "a decode step runs on attention_decode");
    mha_exec_problem p;
    attn_read(g, first, &p);
    return mha_exec_validate(&p, err);
}

/* The template's parameters as the attention planner's forced choice. */
static void attn_force(const exec_segment *s, mha_exec_force *f) {
    memset(f, 0, sizeof *f);
    if (s->tmpl == FUSION_T_ATTENTION_ROW) {
        f->kernel = MHA_KERNEL_ROW_WISE;
        if (s->has_values) {
            f->rows_per_warp = s->values[0];
            f->warps_per_block = s->values[1];
        }
    } else {
        f->kernel = MHA_KERNEL_BLOCK_WISE;
        if (s->has_values) {
            f->block_m = s->values[0];
            f->block_n = s->values[1];
            f->num_warps = s->values[2];
        }
    }
}

static int attn_plan(exec_model *m, const exec_segment *s, void **kplan, stof_error *err) {
    mha_exec_problem p;
    attn_read(m->plan->g, s->first, &p);
    mha_exec_force f;
    attn_force(s, &f);
    mha_exec_plan *plan = NULL;
    int rc = mha_exec_plan_create(m->ctx->mha, &p, s->auto_attention ? NULL : &f, &plan, err);
    *kplan = plan;
    return rc;
}

static void attn_free(exec_model *m, void *kplan) {
    mha_exec_plan_free(m->ctx->mha, kplan);
}

void exec_seg_rt_release(exec_seg_rt *rt) {
    if (rt->store)
        mha_decode_plan_free(rt->store->plan);
    free(rt->store);
    rt->store = NULL;
}

/* op_attention.store: the store kernel's plan for the op's caches (its last two inputs). */
static int attn_bind_store(exec_model *m, const graph_op *op, const mha_exec_problem *p,
                           exec_seg_rt *rt, stof_error *err) {
    const graph *g = m->plan->g;
    const graph_tensor *k = tensor(g, op->inputs[op->n_inputs - 2]);
    mha_decode_problem dp = {.batch = p->batch, .heads = p->heads, .kv_heads = p->kv_heads,
                             .head_dim = p->head_dim, .dtype = p->dtype,
                             .cap = (int)k->shape[1], .context = (int)k->shape[1],
                             .scale = p->scale};
    exec_seg_rt_release(rt);
    rt->store = err_calloc(1, sizeof *rt->store, err);
    if (!rt->store)
        return STOF_ERR_NOMEM;
    *rt->store = (exec_kv_store){.qkv = ptr_of(m, op->inputs[0]),
                                 .pad_mask = p->padded ? ptr_of(m, op->inputs[1]) : 0,
                                 .k_cache = ptr_of(m, op->inputs[op->n_inputs - 2]),
                                 .v_cache = ptr_of(m, op->inputs[op->n_inputs - 1]),
                                 .seq = p->q_len};
    int rc = mha_decode_plan_create(m->ctx->mha, &dp, &(mha_decode_settings){.splits = 1},
                                    &rt->store->plan, err);
    if (rc)
        exec_seg_rt_release(rt);
    return rc;
}

/* Global tokens: the global_mask, and the global rows' projections (global_qkv's, else
 * the op's qkv). */
static void attn_bind_global(exec_model *m, const graph_op *op, const mha_exec_problem *p,
                             size_t elem, mha_exec_tensors *t) {
    const int at = op_attention_global_input(&op->attr.attn);
    mha_exec_tensors_global(t, ptr_of(m, op->inputs[at]),
                            ptr_of(m, op->inputs[op->attr.attn.global_qkv ? at + 1 : 0]), p,
                            elem);
}

static int attn_bind(exec_model *m, const exec_segment *s, exec_seg_rt *rt, stof_error *err) {
    const graph *g = m->plan->g;
    const graph_op *op = &g->ops[s->first];
    const mha_exec_problem *p = &((const mha_exec_plan *)rt->kplan)->problem;
    size_t elem = stof_dtype_size(p->dtype);
    if (op->attr.attn.cross)
        mha_exec_tensors_cross(&rt->t.attn, ptr_of(m, op->inputs[0]), ptr_of(m, op->inputs[1]),
                               ptr_of(m, s->out), p, elem);
    else
        mha_exec_tensors_packed(&rt->t.attn, ptr_of(m, op->inputs[0]), ptr_of(m, s->out), p,
                                elem);
    if (op->attr.attn.relpos)
        rt->t.attn.relpos_table = ptr_of(m, op->inputs[op->n_inputs - 1]);
    if (op->attr.attn.padded)
        rt->t.attn.pad_mask = ptr_of(m, op->inputs[1]);
    if (op->attr.attn.global_keys)
        attn_bind_global(m, op, p, elem, &rt->t.attn);
    return op->attr.attn.store ? attn_bind_store(m, op, p, rt, err) : STOF_OK;
}

static int attn_launch(exec_model *m, const exec_seg_rt *rt, CUstream st, stof_error *err) {
    int rc = mha_exec_run(m->ctx->mha, rt->kplan, &rt->t.attn, st, err);
    const exec_kv_store *k = rt->store;
    if (!rc && k)
        rc = mha_decode_store(k->plan, k->qkv, k->seq, k->pad_mask, k->k_cache, k->v_cache, st,
                              err);
    return rc;
}

static size_t attn_describe(const void *kplan, char *buf, size_t n) {
    return mha_exec_plan_describe(kplan, buf, n);
}

static fusion_template_id attn_actual(const void *kplan, fusion_template_id planned) {
    return ((const mha_exec_plan *)kplan)->config.kernel == MHA_KERNEL_BLOCK_WISE
               ? FUSION_T_ATTENTION_BLOCK
               : FUSION_T_ATTENTION_ROW;
}

/* ---- a decode step's attention ------------------------------------------------------------------ */

/* A decode segment: the attention op, after the rotary op fused in front when n is 2. */
static void dec_read(const graph *g, int first, int n, mha_decode_problem *p) {
    const graph_op *op = &g->ops[first + n - 1];
    const op_attention *a = &op->attr.attn;
    const graph_tensor *cache = tensor(g, op->inputs[2]);
    const mask *mk = a->mask >= 0 && a->mask < g->n_masks ? g->masks[a->mask] : NULL;
    *p = (mha_decode_problem){.batch = (int)cache->shape[0], .heads = a->heads,
                              .kv_heads = op_attention_kv_heads(a), .head_dim = a->head_dim,
                              .dtype = cache->dtype, .cap = (int)cache->shape[1],
                              .context = mk ? mk->q_len : (int)cache->shape[1], .scale = a->scale,
                              .mask = mk};
    if (n == 2)
        p->rotary_theta = g->ops[first].attr.rotary.theta;
}

/* The kernel rotates what the rotary op would (the template's pattern put it first): the
 * attention's Q and K heads, whole, by the rotary's positions (a step's). */
static int dec_rotary_fits(const graph *g, int first, stof_error *err) {
    const graph_op *r = &g->ops[first], *at = &g->ops[first + 1];
    const op_attention *a = &at->attr.attn;
    if (at->inputs[0] != r->output)
        return err_set(err, STOF_ERR_UNSUPPORTED, "a fused rotary's output is the attention's "
                       "qkv");
    if (!r->attr.rotary.has_positions || r->n_inputs < 2)
        return err_set(err, STOF_ERR_UNSUPPORTED, "a fused rotary turns by a step's positions "
                       "(an input of the op)");
    if (r->attr.rotary.heads != a->heads || r->attr.rotary.kv_heads != op_attention_kv_heads(a) ||
        r->attr.rotary.head_dim != a->head_dim)
        return err_set(err, STOF_ERR_UNSUPPORTED, "a fused rotary rotates the attention's Q and "
                       "K heads (%d and %d of %d), not %d and %d of %d", a->heads,
                       op_attention_kv_heads(a), a->head_dim, r->attr.rotary.heads,
                       r->attr.rotary.kv_heads, r->attr.rotary.head_dim);
    return STOF_OK;
}

static int dec_supports(const graph *g, int first, int n, const fusion_match *m,
                        stof_error *err) {
    (void)m;
    if (!g->ops[first + n - 1].attr.attn.decode)
        return err_set(err, STOF_ERR_UNSUPPORTED, "attention_decode runs decode steps only");
    if (n == 2) {
        int rc = dec_rotary_fits(g, first, err);
        if (rc)
            return rc;
    }
    mha_decode_problem p;
    dec_read(g, first, n, &p);
    return mha_decode_validate(&p, err);
}

static int dec_plan(exec_model *m, const exec_segment *s, void **kplan, stof_error *err) {
    mha_decode_problem p;
    dec_read(m->plan->g, s->first, s->n, &p);
    mha_decode_plan *plan = NULL;
    const mha_decode_settings set = {.splits = s->has_values ? s->values[0] : 0,
                                     .warps = s->has_values ? s->values[1] : 0};
    int rc = mha_decode_plan_create(m->ctx->mha, &p, &set, &plan, err);
    *kplan = plan;
    return rc;
}

static void dec_free(exec_model *m, void *kplan) {
    (void)m;
    mha_decode_plan_free(kplan);
}

static int dec_bind(exec_model *m, const exec_segment *s, exec_seg_rt *rt, stof_error *err) {
    const graph_op *op = &m->plan->g->ops[s->first + s->n - 1];
    /* qkv: the fused rotary's input, else the attention's */
    const graph_op *head = &m->plan->g->ops[s->first];
    rt->t.decode = (mha_decode_tensors){.qkv = ptr_of(m, head->inputs[0]),
                                        .rotary_positions =
                                            s->n == 2 ? ptr_of(m, head->inputs[1]) : 0,
                                        .positions = ptr_of(m, op->inputs[1]),
                                        .k_cache = ptr_of(m, op->inputs[2]),
                                        .v_cache = ptr_of(m, op->inputs[3]),
                                        .o = ptr_of(m, s->out)};
    return STOF_OK;
}

static int dec_launch(exec_model *m, const exec_seg_rt *rt, CUstream st, stof_error *err) {
    return mha_decode_run(rt->kplan, &rt->t.decode, st, err);
}

static size_t dec_describe(const void *kplan, char *buf, size_t n) {
    const mha_decode_plan *pl = kplan;
    int len = snprintf(buf, n, "attention_decode: %d query heads on %d K/V heads of %d, %d "
                       "cache slots of a context of %d, keys split %d ways, %d warps a CTA%s",
                       pl->problem.heads, pl->problem.kv_heads, pl->problem.head_dim,
                       pl->problem.cap, pl->problem.context, pl->splits, pl->warps,
                       pl->problem.rotary_theta > 0.0 ? ", the rotary fused" : "");
    return len < 0 ? 0 : (size_t)len;
}

static fusion_template_id dec_actual(const void *kplan, fusion_template_id planned) {
    (void)kplan;
    return planned;
}

/* glu, rotary and mask_rows: the op's input and output, packed (and
 * mask_rows' mask). */
static int xy_bind(exec_model *m, const exec_segment *s, exec_seg_rt *rt, stof_error *err) {
    const graph_op *op = &m->plan->g->ops[s->first];
    rt->t.xy = (gemm_exec_xy_tensors){.x = ptr_of(m, op->inputs[0]), .y = ptr_of(m, s->out),
                                      .mask = op->n_inputs > 1 ? ptr_of(m, op->inputs[1]) : 0};
    return STOF_OK;
}

static int xy_launch(exec_model *m, const exec_seg_rt *rt, CUstream st, stof_error *err) {
    return gemm_exec_xy(m->ctx->gemm, rt->kplan, &rt->t.xy, st, err);
}

/* ---- the table ------------------------------------------------------------------------------------ */

#define GX(sup, bind, launch, status) \
    {NULL, sup, gx_plan, gx_free, bind, launch, status, gx_describe, gx_actual}
#define ATTN \
    {NULL, attn_supports, attn_plan, attn_free, attn_bind, attn_launch, NULL, attn_describe, \
     attn_actual}

static const exec_launcher launchers[FUSION_T_COUNT] = {
    [FUSION_T_GEMM_EPILOGUE] = GX(gemm_supports, gemm_bind, gemm_launch, NULL),
    [FUSION_T_CUBLASLT] = {NULL, lt_supports, lt_plan, lt_free, gemm_bind, lt_launch, NULL,
                           lt_describe, NULL},
    [FUSION_T_GEMM_LN] = GX(ln_supports, ln_bind, ln_launch, NULL),
    [FUSION_T_GEMM_CHAIN] = GX(chain_supports, chain_bind, chain_launch, NULL),
    [FUSION_T_MI_CHAIN] = GX(mi_supports, mi_bind, mi_launch, NULL),
    [FUSION_T_ATTENTION_ROW] = ATTN,
    [FUSION_T_ATTENTION_BLOCK] = ATTN,
    [FUSION_T_EMBEDDING] = GX(embed_supports, embed_bind, embed_launch, embed_status),
    [FUSION_T_GLU] = GX(elementwise_supports, xy_bind, xy_launch, NULL),
    [FUSION_T_ROTARY] = GX(elementwise_supports, xy_bind, xy_launch, NULL),
    [FUSION_T_MASK_ROWS] = GX(elementwise_supports, xy_bind, xy_launch, NULL),
    [FUSION_T_GEMV] = GX(gemv_supports, gemm_bind, gemm_launch, NULL),
    [FUSION_T_ATTENTION_DECODE] = {NULL, dec_supports, dec_plan, dec_free, dec_bind, dec_launch,
                                   NULL, dec_describe, dec_actual},
};

const exec_launcher *exec_launcher_get(fusion_template_id t) {
    static const exec_launcher unknown = {.missing = "unknown template"};
    return (int)t >= 0 && t < FUSION_T_COUNT ? &launchers[t] : &unknown;
}

int exec_template_implemented(fusion_template_id t) {
    return exec_launcher_get(t)->missing == NULL;
}

/* ---- what the settings code asks (exec_settings.c) --------------------------------------------- */

int exec_launch_is_gemm_family(fusion_template_id t) {
    return exec_launcher_get(t)->plan == gx_plan;
}

int exec_launch_is_attention(fusion_template_id t) {
    return exec_launcher_get(t)->plan == attn_plan;
}

int exec_launch_gemm_problem(const graph *g, const exec_segment *s, gemm_exec_problem *p,
                             stof_error *err) {
    return gx_problem(g, s, p, err);
}

void exec_launch_decode_problem(const graph *g, const exec_segment *s, mha_decode_problem *p) {
    dec_read(g, s->first, s->n, p);
}

void exec_launch_attention_problem(const graph *g, const exec_segment *s, mha_exec_problem *p,
                                   mha_exec_force *f) {
    attn_read(g, s->first, p);
    if (f)
        attn_force(s, f);
}
