/* Planning a model run without the GPU: sequences and their classes,
 * schemes to segments to templates, and the activation buffers' lifetimes
 * and places in one arena. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/exec/exec_impl.h"
#include "ops/ops.h"

/* ---- sequences ------------------------------------------------------------------------------- */

const char *exec_seq_name(const exec_seq *s, char *buf, size_t n) {
    if (s->layer >= 0)
        snprintf(buf, n, "layer %d", s->layer);
    else if (s->n > 1)
        snprintf(buf, n, "ops #%d-#%d outside layers", s->first, s->first + s->n - 1);
    else
        snprintf(buf, n, "op #%d outside layers", s->first);
    return buf;
}

/* ---- templates ----------------------------------------------------------------------------------- */

/* An fp32 tensor in a model of f16 or bf16 (a residual stream kept in fp32) is read and written
 * only by mi_chain: the other kernels take one dtype. */
static int fp32_tensors_fit(const graph *g, int first, int n, fusion_template_id t,
                            stof_error *err) {
    for (int i = first; t != FUSION_T_MI_CHAIN && i < first + n; i++) {
        const graph_op *op = &g->ops[i];
        for (int k = -1; k < op->n_inputs; k++) {
            const int x = k < 0 ? op->output : op->inputs[k];
            if (graph_tensor_is_stream(g, x))
                return err_set(err, STOF_ERR_UNSUPPORTED,
                               "'%s' is fp32 in a %s model (a residual stream): only mi_chain "
                               "reads or writes such a tensor", g->tensors[x].name,
                               stof_dtype_name(g->tensors[g->output].dtype));
        }
    }
    return STOF_OK;
}

int exec_segment_supports(const graph *g, int first, int n, const fusion_match *m,
                          fusion_template_id t, stof_error *err) {
    const exec_launcher *l = exec_launcher_get(t);
    char name[256];
    if (!fusion_match_has(m, t))
        return err_set(err, STOF_ERR_INVALID, "%s does not match template %s",
                       exec_segment_name(g, first, n, name, sizeof name),
                       fusion_template_get(t) ? fusion_template_get(t)->name : "?");
    if (l->missing)
        return err_set(err, STOF_ERR_UNSUPPORTED, "%s on template %s: %s",
                       exec_segment_name(g, first, n, name, sizeof name),
                       fusion_template_get(t)->name, l->missing);
    int rc = fp32_tensors_fit(g, first, n, t, err);
    if (!rc)
        rc = l->supports(g, first, n, m, err);
    if (rc)
        err_prefix(err, "%s on template %s: ", exec_segment_name(g, first, n, name, sizeof name),
                   fusion_template_get(t)->name);
    return rc;
}

/* The order exec_segment_template tries templates in: gemm_ln before gemm_epilogue, so that a
 * GEMM closing with a norm, which both match, gets by default the kernel that runs on every
 * architecture (gemm_epilogue's norm is its sm_90 build's; the search measures both); then by
 * id. gemv goes first for one row (a decode step at batch 1): there it reads the weights with
 * the norm ahead and the gated unit after it joined (one_row_kinds), and a vocabulary's head,
 * whose width no tensor-core template takes but cuBLASLt, faster than cuBLASLt (50257 x 768 fp16
 * from memory on an H200: 28.6 against 37.2 us). At more rows its FMAs bind and the tensor-core
 * templates are faster (bench/RESULTS.md): gemv is left to the search there. */
static void default_order(int gemv_first, fusion_template_id order[FUSION_T_COUNT]) {
    int n = 0;
    if (gemv_first)
        order[n++] = FUSION_T_GEMV;
    order[n++] = FUSION_T_GEMM_LN;
    for (int t = 0; t < FUSION_T_COUNT; t++)
        if (t != FUSION_T_GEMM_LN && !(gemv_first && t == FUSION_T_GEMV))
            order[n++] = (fusion_template_id)t;
}

int exec_segment_template(const graph *g, int first, int n, const fusion_match *m,
                          fusion_template_id *t, stof_error *err) {
    char why[768] = "", name[256];
    size_t len = 0;
    fusion_template_id order[FUSION_T_COUNT];
    default_order(m->dims.m == 1, order);
    for (int i = 0; i < FUSION_T_COUNT; i++) {
        const fusion_template_id k = order[i];
        if (!fusion_match_has(m, (fusion_template_id)k))
            continue;
        /* the launcher's own reason: the segment's name comes once in front */
        const exec_launcher *l = exec_launcher_get((fusion_template_id)k);
        stof_error e = {0};
        if (!l->missing && fp32_tensors_fit(g, first, n, k, &e) == STOF_OK &&
            l->supports(g, first, n, m, &e) == STOF_OK) {
            *t = (fusion_template_id)k;
            return STOF_OK;
        }
        const char *reason = l->missing ? l->missing : e.msg;
        if (len < sizeof why)
            len += (size_t)snprintf(why + len, sizeof why - len, "%s%s", len ? "; " : "",
                                    reason);
    }
    return err_set(err, STOF_ERR_UNSUPPORTED, "%s: no template that matches it can run it: %s",
                   exec_segment_name(g, first, n, name, sizeof name), why);
}

int exec_scheme_check(const graph *g, const exec_seq *seq, const fusion_scheme *s,
                      stof_error *err) {
    int ops[FUSION_MAX_OPS];
    if (seq->n > FUSION_MAX_OPS)
        return err_set(err, STOF_ERR_UNSUPPORTED, "a sequence of %d ops (at most %d)", seq->n,
                       FUSION_MAX_OPS);
    for (int k = 0; k < seq->n; k++)
        ops[k] = seq->first + k;
    fusion_report *rep = err_malloc(sizeof *rep, err);
    if (!rep)
        return STOF_ERR_NOMEM;
    int rc = fusion_scheme_validate(g, ops, seq->n, s, rep, err);
    for (int k = 0; !rc && k < rep->n_segments; k++) {
        fusion_template_id t;
        rc = exec_segment_template(g, seq->first + rep->segs[k].first,
                                   rep->segs[k].last - rep->segs[k].first + 1, &rep->matches[k],
                                   &t, err);
    }
    free(rep);
    return rc;
}

int exec_segment_twin(const exec_plan *p, int s) {
    const exec_segment *x = &p->segs[s];
    for (int k = 0; k < s; k++) {
        const exec_segment *y = &p->segs[k];
        if (p->seqs[y->seq].cls == p->seqs[x->seq].cls && y->index == x->index)
            return k;
    }
    return -1;
}

/* ---- the default scheme ------------------------------------------------------------------------ */

/* fusion_match_segment of ops first .. first + n - 1. */
static int match_span(const graph *g, int first, int n, fusion_match *m) {
    int ops[FUSION_MAX_OPS];
    for (int k = 0; k < n; k++)
        ops[k] = first + k;
    return fusion_match_segment(g, ops, n, m, NULL) == STOF_OK;
}

/* Whether op `next` may join a segment that op `head` opened, by the greedy
 * rule: a GEMM takes bias, activation and add; an MI chain takes bias, add,
 * activation and norm; a rotary op goes into the attention after it (a decode step's: the
 * template check that follows refuses the others). A norm ahead of a GEMM and a gated unit
 * after one join only for one row (one_row_kinds); at more rows they are left to the search. */
static int greedy_joins(op_kind head, op_kind next) {
    int epilogue = next == OP_BIAS || next == OP_ADD || next == OP_GELU || next == OP_RELU;
    if (head == OP_ROTARY)
        return next == OP_ATTENTION;
    if (head == OP_GEMM)
        return epilogue;
    if (op_describe(head)->cls == OP_CLASS_MI && head != OP_EMBEDDING && head != OP_SOFTMAX)
        return epilogue || next == OP_LAYERNORM || next == OP_RMSNORM;
    return 0;
}

static int is_norm(op_kind k) {
    return k == OP_LAYERNORM || k == OP_RMSNORM;
}

/* Whether op head + len is of a kind that may join the segment of ops head .. head + len - 1
 * beyond the greedy rule where the segment runs one row (M = 1, a decode step at batch 1) on
 * gemv (joins checks that): a norm ahead of a GEMM, then the GEMM's epilogue or gated unit.
 * gemv stages the normalized row once a block and reads the weights as it would alone, so the
 * norm's and the gated unit's own kernels and their waits go (on an H200 the Mistral-shaped
 * 1B's step 0.921 -> 0.836 ms, gpt2's 0.428 -> 0.405; at batch 8 gemv's FMAs bind and joined
 * steps were 2.5x slower: bench/RESULTS.md). */
static int one_row_kinds(const graph *g, int head, int len) {
    const op_kind next = g->ops[head + len].kind;
    const int gemm_at = is_norm(g->ops[head].kind) ? 1 : 0;
    if (len == gemm_at) /* the norm: a GEMM after it */
        return next == OP_GEMM;
    return len > gemm_at && g->ops[head + gemm_at].kind == OP_GEMM &&
           (greedy_joins(OP_GEMM, next) || next == OP_GLU);
}

/* Whether op i is a residual add whose sum only the norm after it reads (a post-norm layer:
 * BERT's GEMM, bias, add, LayerNorm). The default scheme leaves such an add to the norm's MI
 * chain, which keeps the sum in fp32 until the norm has read it; a GEMM's epilogue would store
 * it rounded to the dtype first. In bf16 that rounding is what kept bert-base's and
 * roberta-base's default schemes over 1e-2 from transformers' fp32 output while their tuned
 * plans, which split them there, were under. In a pre-norm layer the sum is the residual
 * stream, stored either way, and the GEMM keeps the add. */
static int post_norm_add(const graph *g, int i, int last) {
    if (i + 1 > last || g->ops[i].kind != OP_ADD || !is_norm(g->ops[i + 1].kind))
        return 0;
    fusion_match m;
    return match_span(g, i, 2, &m) && !m.store_pre_norm;
}

/* Whether op head + len joins the segment of ops head .. head + len - 1 of sequence seq: by the
 * greedy rule, or as one_row_kinds says where the longer segment runs one row on gemv; not a
 * post-norm add after a GEMM; and a template runs the longer segment. */
static int joins(const graph *g, const exec_seq *seq, int head, int len) {
    const op_kind kind = g->ops[head].kind;
    const int greedy = greedy_joins(kind, g->ops[head + len].kind);
    if (!greedy && !one_row_kinds(g, head, len))
        return 0;
    if (g->ops[head + (is_norm(kind) && len > 1)].kind == OP_GEMM &&
        post_norm_add(g, head + len, seq->first + seq->n - 1))
        return 0;
    fusion_match m;
    fusion_template_id t;
    return match_span(g, head, len + 1, &m) &&
           exec_segment_template(g, head, len + 1, &m, &t, NULL) == STOF_OK &&
           (greedy || (m.dims.m == 1 && t == FUSION_T_GEMV));
}

int exec_default_scheme(const graph *g, const exec_seq *seq, fusion_scheme *s, stof_error *err) {
    if (seq->n < 1 || seq->n > FUSION_MAX_OPS)
        return err_set(err, STOF_ERR_UNSUPPORTED, "a sequence of %d ops (1 to %d)", seq->n,
                       FUSION_MAX_OPS);
    fusion_segment segs[FUSION_MAX_OPS];
    int n_segs = 0;
    for (int i = 0; i < seq->n;) {
        int head = seq->first + i, len = 1;
        while (i + len < seq->n && joins(g, seq, head, len))
            len++;
        segs[n_segs++] = (fusion_segment){i, i + len - 1};
        i += len;
    }
    return fusion_scheme_from_segments(segs, n_segs, seq->n, s, err);
}

/* ---- plans --------------------------------------------------------------------------------------- */

void exec_plan_free(exec_plan *p) {
    if (!p)
        return;
    free(p->seqs);
    free(p->schemes);
    free(p->segs);
    free(p->bufs);
    free(p->buf_of);
    free(p);
}

static int is_activation(const graph_tensor *t) {
    return t->role == GRAPH_ACTIVATION || t->role == GRAPH_OUTPUT;
}

int exec_model_dtype(const graph *g, stof_dtype *dtype, stof_error *err) {
    *dtype = STOF_F16;
    if (g->output < 0)
        return err_set(err, STOF_ERR_INVALID, "the graph has no output");
    *dtype = g->tensors[g->output].dtype;
    for (int i = 0; *dtype == STOF_F32 && i < g->n_tensors; i++)
        if (g->tensors[i].role == GRAPH_WEIGHT &&
            (g->tensors[i].dtype == STOF_F16 || g->tensors[i].dtype == STOF_BF16))
            return err_set(err, STOF_ERR_UNSUPPORTED,
                           "the output '%s' is fp32 but the weights are %s: a model's output is "
                           "in its dtype (fp32 is for activations such as a residual stream; "
                           "a norm brings it back)", g->tensors[g->output].name,
                           stof_dtype_name(g->tensors[i].dtype));
    if (*dtype != STOF_F16 && *dtype != STOF_BF16)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "the GPU kernels run in f16 or bf16, and this model is %s (set "
                       "dtype=fp16 or bf16)", stof_dtype_name(*dtype));
    for (int i = 0; i < g->n_tensors; i++) {
        const graph_tensor *t = &g->tensors[i];
        if (t->dtype != STOF_I32 && t->dtype != *dtype &&
            !(t->dtype == STOF_F32 && t->role == GRAPH_ACTIVATION))
            return err_set(err, STOF_ERR_UNSUPPORTED,
                           "tensor '%s' is %s but the model runs in %s (the GPU kernels take "
                           "one float dtype, and fp32 only for activations such as a residual "
                           "stream)", t->name, stof_dtype_name(t->dtype),
                           stof_dtype_name(*dtype));
    }
    return STOF_OK;
}

/* The schemes of every sequence (its class's), validated. */
static int plan_schemes(exec_plan *p, const fusion_scheme *given, stof_error *err) {
    char name[96];
    for (int i = 0; i < p->n_seqs; i++) {
        const exec_seq *q = &p->seqs[i];
        const fusion_scheme *s = given ? &given[q->cls] : NULL;
        int rc;
        if (s && s->n > 0) {
            p->schemes[i] = *s;
            rc = exec_scheme_check(p->g, q, s, err);
        } else {
            rc = fusion_scheme_all_unfused(&p->schemes[i], q->n, err);
            if (!rc)
                rc = exec_scheme_check(p->g, q, &p->schemes[i], err);
        }
        if (rc)
            return err_prefix(err, "%s: ", exec_seq_name(q, name, sizeof name));
    }
    return STOF_OK;
}

void exec_segment_init(const graph *g, int first, int n, const fusion_match *m,
                       exec_segment *s) {
    memset(s, 0, sizeof *s);
    s->first = first;
    s->n = n;
    s->match = *m;
    s->out = g->ops[first + n - 1].output;
    /* the closing norm's input, which the template writes besides */
    s->pre_norm = m->store_pre_norm && n > 1 ? g->ops[first + n - 2].output : -1;
}

int exec_segment_at(const graph *g, int first, int n, exec_segment *s, stof_error *err) {
    int ops[FUSION_MAX_OPS] = {0}; /* n <= FUSION_MAX_OPS; zeroed for gcc's -Wmaybe-uninitialized */
    fusion_match m;
    memset(&m, 0, sizeof m);
    for (int k = 0; k < n && k < FUSION_MAX_OPS; k++)
        ops[k] = first + k;
    int rc = fusion_match_segment(g, ops, n, &m, err);
    exec_segment_init(g, first, n, &m, s);
    if (rc)
        s->pre_norm = -1;
    return rc;
}

static int plan_segments(exec_plan *p, stof_error *err) {
    int total = 0;
    for (int i = 0; i < p->n_seqs; i++)
        total += fusion_scheme_count_segments(&p->schemes[i]);
    p->segs = err_calloc((size_t)total, sizeof *p->segs, err);
    if (!p->segs)
        return STOF_ERR_NOMEM;
    const graph *g = p->g;
    fusion_segment fs[FUSION_MAX_OPS];
    for (int i = 0; i < p->n_seqs; i++) {
        const exec_seq *q = &p->seqs[i];
        int n = fusion_scheme_segments(&p->schemes[i], fs, FUSION_MAX_OPS);
        for (int k = 0; k < n; k++) {
            exec_segment *s = &p->segs[p->n_segs++];
            int rc = exec_segment_at(g, q->first + fs[k].first, fs[k].last - fs[k].first + 1, s,
                                     err);
            s->seq = i;
            s->index = k;
            if (!rc)
                rc = exec_segment_template(g, s->first, s->n, &s->match, &s->tmpl, err);
            if (rc)
                return rc;
            s->auto_attention =
                s->tmpl == FUSION_T_ATTENTION_ROW || s->tmpl == FUSION_T_ATTENTION_BLOCK;
        }
    }
    return STOF_OK;
}

/* A buffer for each segment's result (and stored pre-norm input), live from
 * that segment to the last one reading it; the model output to the end. */
static int plan_buffers(exec_plan *p, stof_error *err) {
    const graph *g = p->g;
    p->buf_of = err_malloc(sizeof *p->buf_of * (size_t)g->n_tensors, err);
    p->bufs = err_malloc(sizeof *p->bufs * (size_t)(2 * p->n_segs), err);
    if (!p->buf_of || !p->bufs)
        return STOF_ERR_NOMEM;
    for (int t = 0; t < g->n_tensors; t++)
        p->buf_of[t] = -1;
    for (int s = 0; s < p->n_segs; s++) {
        int made[2] = {p->segs[s].out, p->segs[s].pre_norm};
        for (int k = 0; k < 2; k++) {
            if (made[k] < 0)
                continue;
            p->buf_of[made[k]] = p->n_bufs;
            p->bufs[p->n_bufs++] = (exec_buffer){made[k], s, s,
                                                 exec_tensor_span(&g->tensors[made[k]]),
                                                 0};
        }
    }
    for (int s = 0; s < p->n_segs; s++) {
        const exec_segment *sg = &p->segs[s];
        for (int o = sg->first; o < sg->first + sg->n; o++) {
            const graph_op *op = &g->ops[o];
            for (int i = 0; i < op->n_inputs; i++) {
                int t = op->inputs[i], prod = g->tensors[t].producer;
                if (prod >= sg->first && prod < sg->first + sg->n)
                    continue; /* made inside the segment */
                if (!is_activation(&g->tensors[t]))
                    continue;
                if (p->buf_of[t] < 0)
                    return err_set(err, STOF_ERR_INTERNAL,
                                   "op #%d reads '%s', which no segment writes out", o,
                                   g->tensors[t].name);
                exec_buffer *b = &p->bufs[p->buf_of[t]];
                if (b->last < s)
                    b->last = s;
            }
        }
    }
    if (p->buf_of[g->output] < 0)
        return err_set(err, STOF_ERR_INTERNAL, "no segment writes the model output");
    p->bufs[p->buf_of[g->output]].last = p->n_segs;
    exec_arena_assign(p->bufs, p->n_bufs, &p->arena_bytes, &p->live_bound);
    for (int t = 0; t < g->n_tensors; t++) {
        const graph_tensor *x = &g->tensors[t];
        if (x->role == GRAPH_WEIGHT)
            p->weight_bytes += exec_tensor_span(x);
        else if (x->role == GRAPH_INPUT)
            p->input_bytes += exec_tensor_span(x);
    }
    return STOF_OK;
}

int exec_plan_create(const graph *g, const fusion_scheme *schemes, exec_plan **out,
                     stof_error *err) {
    *out = NULL;
    exec_plan *p = err_calloc(1, sizeof *p, err);
    if (!p)
        return STOF_ERR_NOMEM;
    p->g = g;
    int rc = exec_model_dtype(g, &p->dtype, err);
    if (!rc)
        rc = fusion_sequences(g, &p->seqs, &p->n_seqs, err);
    if (!rc && !(p->schemes = err_calloc((size_t)p->n_seqs, sizeof *p->schemes, err)))
        rc = STOF_ERR_NOMEM;
    if (!rc)
        rc = plan_schemes(p, schemes, err);
    if (!rc)
        rc = plan_segments(p, err);
    if (!rc)
        rc = plan_buffers(p, err);
    if (rc) {
        exec_plan_free(p);
        return rc;
    }
    *out = p;
    return STOF_OK;
}

static int values_in_space(const fusion_template *t, const int *values, stof_error *err) {
    for (int k = 0; k < t->n_params; k++) {
        const fusion_param *q = &t->params[k];
        int ok = 0;
        for (int v = 0; v < q->n_values && !ok; v++)
            ok = q->values[v] == values[k];
        if (!ok)
            return err_set(err, STOF_ERR_INVALID, "%s: %s = %d is not in its space", t->name,
                           q->name, values[k]);
    }
    return STOF_OK;
}

int exec_plan_set_choice(exec_plan *p, int seg, fusion_template_id t, const int *values,
                         stof_error *err) {
    if (seg < 0 || seg >= p->n_segs)
        return err_set(err, STOF_ERR_INVALID, "segment %d does not exist (the plan has %d)", seg,
                       p->n_segs);
    const exec_segment *s = &p->segs[seg];
    const fusion_template *ft = fusion_template_get(t);
    if (!ft)
        return err_set(err, STOF_ERR_INVALID, "template %d does not exist", (int)t);
    int rc = exec_segment_supports(p->g, s->first, s->n, &s->match, t, err);
    if (!rc && values)
        rc = values_in_space(ft, values, err);
    if (rc)
        return rc;
    int cls = p->seqs[s->seq].cls, index = s->index;
    for (int k = 0; k < p->n_segs; k++) {
        exec_segment *x = &p->segs[k];
        if (p->seqs[x->seq].cls != cls || x->index != index)
            continue;
        x->tmpl = t;
        x->auto_attention = 0;
        x->has_values = values != NULL;
        memset(x->values, 0, sizeof x->values);
        if (values)
            memcpy(x->values, values, sizeof *values * (size_t)ft->n_params);
    }
    return STOF_OK;
}

/* ---- the arena ------------------------------------------------------------------------------- */

static int overlaps(const exec_buffer *a, const exec_buffer *b) {
    return a->first <= b->last && b->first <= a->last;
}

/* Larger first; among equals the earlier one, then by index: deterministic. */
static int by_size(const void *pa, const void *pb, void *ctx) {
    const exec_buffer *b = ctx;
    int x = *(const int *)pa, y = *(const int *)pb;
    if (b[x].bytes != b[y].bytes)
        return b[x].bytes > b[y].bytes ? -1 : 1;
    if (b[x].first != b[y].first)
        return b[x].first < b[y].first ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* qsort has no context argument in C11: a small insertion sort does, and
 * buffer counts are a few per segment. */
static void sort_idx(int *idx, int n, int (*cmp)(const void *, const void *, void *), void *ctx) {
    for (int i = 1; i < n; i++) {
        int v = idx[i], j = i;
        while (j > 0 && cmp(&idx[j - 1], &v, ctx) > 0) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = v;
    }
}


/* Earlier first, larger first among those starting together. */
static int by_time(const void *pa, const void *pb, void *ctx) {
    const exec_buffer *b = ctx;
    int x = *(const int *)pa, y = *(const int *)pb;
    if (b[x].first != b[y].first)
        return b[x].first < b[y].first ? -1 : 1;
    if (b[x].bytes != b[y].bytes)
        return b[x].bytes > b[y].bytes ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Places the buffers in `order`, each against those placed before it whose
 * lifetimes overlap its own (near: scratch of n ints). Two rules:
 *   best fit     the smallest gap that holds it, else above everything;
 *   two-sided    at the bottom when it fits there, else as high as it fits
 *                under `limit`, else the lowest gap: buffers that alternate
 *                (a chain) take the two ends of the arena, which reaches the
 *                live bound where best fit leaves holes.
 * Offsets go to off[]; returns the extent. */
static size_t place_all(const exec_buffer *b, int n, const int *order, int two_sided,
                        size_t limit, size_t *off, int *near) {
    size_t extent = 0;
    for (int k = 0; k < n; k++) {
        const exec_buffer *x = &b[order[k]];
        int m = 0;
        for (int j = 0; j < k; j++)
            if (overlaps(x, &b[order[j]]))
                near[m++] = order[j];
        /* sort the neighbours by their offsets (insertion sort: few of them) */
        for (int i = 1; i < m; i++) {
            int v = near[i], j = i;
            while (j > 0 && (off[near[j - 1]] > off[v] ||
                             (off[near[j - 1]] == off[v] && near[j - 1] > v))) {
                near[j] = near[j - 1];
                j--;
            }
            near[j] = v;
        }
        /* best, low, high: SIZE_MAX until found (the open gap on top always fits) */
        size_t end = 0, best = SIZE_MAX, best_gap = 0, low = SIZE_MAX, high = SIZE_MAX;
        for (int j = 0; j <= m; j++) {
            /* the gap [end, top) below neighbour j (above all of them when j == m) */
            size_t top = j < m ? off[near[j]] : SIZE_MAX;
            if (top > end && top - end >= x->bytes) {
                if (low == SIZE_MAX)
                    low = end;
                if (best == SIZE_MAX || top - end < best_gap) {
                    best_gap = top - end;
                    best = end;
                }
                size_t cap = top < limit ? top : limit;
                if (cap >= end + x->bytes)
                    high = cap - x->bytes;
            }
            if (j < m && off[near[j]] + b[near[j]].bytes > end)
                end = off[near[j]] + b[near[j]].bytes;
        }
        size_t at = best;
        if (two_sided)
            at = low == 0 ? 0 : high != SIZE_MAX ? high : low;
        off[order[k]] = at;
        if (at + x->bytes > extent)
            extent = at + x->bytes;
    }
    return extent;
}

void exec_arena_assign(exec_buffer *b, int n, size_t *arena, size_t *bound) {
    *arena = *bound = 0;
    if (n <= 0)
        return;
    /* the live bytes at each buffer's first point: the sum only grows there */
    for (int i = 0; i < n; i++) {
        size_t live = 0;
        for (int j = 0; j < n; j++)
            if (b[j].first <= b[i].first && b[i].first <= b[j].last)
                live += b[j].bytes;
        if (live > *bound)
            *bound = live;
    }
    int *idx = malloc(sizeof *idx * (size_t)n * 2);
    size_t *off = malloc(sizeof *off * (size_t)n * 2);
    if (!idx || !off) {
        /* no room to plan: every buffer a place of its own, still correct */
        free(idx);
        free(off);
        for (int i = 0; i < n; i++) {
            b[i].offset = *arena;
            *arena += b[i].bytes;
        }
        return;
    }
    int *near = idx + n;
    for (int i = 0; i < n; i++)
        idx[i] = i;
    sort_idx(idx, n, by_size, b);
    size_t fit = place_all(b, n, idx, 0, SIZE_MAX, off, near);
    sort_idx(idx, n, by_time, b);
    size_t sided = place_all(b, n, idx, 1, *bound, off + n, near);
    const size_t *pick = sided < fit ? off + n : off;
    *arena = sided < fit ? sided : fit;
    for (int i = 0; i < n; i++)
        b[i].offset = pick[i];
    free(idx);
    free(off);
}

/* Whether sequence seq's first GEMM runs one row (a decode step at batch 1). */
static int one_row_seq(const graph *g, const exec_seq *seq) {
    for (int i = seq->first; i < seq->first + seq->n; i++) {
        fusion_match m;
        if (g->ops[i].kind == OP_GEMM)
            return match_span(g, i, 1, &m) && m.dims.m == 1;
    }
    return 0;
}

int exec_default_schemes(const graph *g, const exec_seq *seqs, int n, fusion_scheme *schemes,
                         stof_error *err) {
    int rc = STOF_OK;
    for (int i = 0; !rc && i < n; i++)
        if ((seqs[i].layer >= 0 || one_row_seq(g, &seqs[i])) && schemes[seqs[i].cls].n == 0)
            rc = exec_default_scheme(g, &seqs[i], &schemes[seqs[i].cls], err);
    return rc;
}

int exec_plan_default(const graph *g, exec_plan **out, stof_error *err) {
    exec_seq *seqs = NULL;
    int n = 0;
    int rc = fusion_sequences(g, &seqs, &n, err);
    fusion_scheme *schemes = rc ? NULL : err_calloc((size_t)n + 1, sizeof *schemes, err);
    if (!rc && !schemes)
        rc = STOF_ERR_NOMEM;
    if (!rc)
        rc = exec_default_schemes(g, seqs, n, schemes, err);
    if (!rc)
        rc = exec_plan_create(g, schemes, out, err);
    free(schemes);
    free(seqs);
    return rc;
}
