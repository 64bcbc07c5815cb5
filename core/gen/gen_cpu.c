/* Generation on the CPU reference (gen.h): the prompts' prefill fills each
 * attention layer's KV cache, then each decode step runs the step's graph on
 * the last token of every sequence, its attention against the cache. With
 * recompute, each new token re-runs the model at the full context instead.
 * Sequences that ended still run (their tokens are dropped): the batch keeps
 * its shape on the CPU. */
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/gen/gen.h"
#include "core/gen/gen_state.h"
#include "core/ref/ref.h"

typedef struct cpu_run {
    const gen_model *m;
    const gen_prompts *p;
    const gen_options *o;
    gen_result *r;
    gen_state st;        /* the sequences */
    gen_decoder dec;
    ops_kv_cache *caches; /* [dec.n_layers] */
    int *layer_of_op;    /* prefill op -> cache layer, -1 */
} cpu_run;

/* ---- state -------------------------------------------------------------------------------- */

static void run_free(cpu_run *c) {
    for (int l = 0; c->caches && l < c->dec.n_layers; l++)
        ops_kv_cache_free(&c->caches[l]);
    free(c->caches);
    gen_decoder_free(&c->dec);
    free(c->layer_of_op);
    gen_state_free(&c->st);
}

/* ---- full passes (the prefill, and every step when recomputing) -------------------------- */

/* input_ids and the attention_mask of g [B, S] from the sequences so far (padding repeats the
 * first token: any id of the vocabulary does, the mask hides it). */
static void fill_sequences(const cpu_run *c, const graph *g, ref_values *rv) {
    int ids = graph_find_tensor(g, "input_ids"), am = gen_input_of(g, GRAPH_INIT_PADDING);
    int64_t S = g->tensors[ids].shape[1];
    for (int b = 0; b < c->p->batch; b++)
        for (int64_t s = 0; s < S; s++) {
            int real = s < c->st.len[b];
            rv->data[ids][b * S + s] = (float)gen_state_token(&c->st, b, real ? s : 0);
            if (am >= 0)
                rv->data[am][b * S + s] = (float)real;
        }
}

/* Runs g again on the values in rv (inputs and weights kept, the last output dropped). */
static int rerun(const graph *g, ref_values *rv, const ref_hooks *h, stof_error *err) {
    free(rv->data[g->output]);
    rv->data[g->output] = NULL;
    return ref_execute_hooked(g, rv, h, err);
}

/* Each sequence's next token from the logits row of its last token. */
static void emit_last_rows(cpu_run *c, const graph *g, const ref_values *rv, int t) {
    int64_t S = g->tensors[g->output].shape[1], V = c->r->vocab;
    for (int b = 0; b < c->p->batch; b++)
        gen_state_emit(&c->st, b, t,
                       rv->data[g->output] + ((size_t)b * S + (size_t)c->st.len[b] - 1) * V);
}

/* The prefill's attention layers store their K and V. */
static int store_prefix(void *ctx, const graph *g, int i, const float *const *in,
                        const float *out, stof_error *err) {
    (void)out;
    (void)err;
    cpu_run *c = ctx;
    int l = c->layer_of_op[i];
    if (l >= 0)
        ops_kv_cache_store_prefix(&c->caches[l], in[0], g->tensors[g->ops[i].inputs[0]].shape[1],
                                  g->ops[i].attr.attn.heads, c->st.len);
    return STOF_OK;
}

static int recompute_all(cpu_run *c, stof_error *err) {
    const graph *g = c->m->context;
    ref_values rv;
    int rc = ref_values_init(g, &c->m->weights, &rv, err);
    for (int t = 0; !rc && t < c->o->max_new_tokens && !gen_state_all_done(&c->st); t++) {
        fill_sequences(c, g, &rv);
        rc = rerun(g, &rv, NULL, err);
        if (!rc)
            emit_last_rows(c, g, &rv, t);
        c->r->steps++;
    }
    ref_values_free(&rv);
    return rc;
}

/* ---- the cache and the decode steps --------------------------------------------------------- */

/* The decode step, its caches, and which prefill op fills which. */
static int prepare_cache(cpu_run *c, stof_error *err) {
    int rc = gen_decoder_build(c->m->context, &c->dec, err);
    if (rc)
        return rc;
    const graph *pg = c->m->prefill;
    c->caches = err_calloc((size_t)c->dec.n_layers + 1, sizeof *c->caches, err);
    c->layer_of_op = err_malloc(sizeof *c->layer_of_op * (size_t)(pg->n_ops + 1), err);
    if (!c->caches || !c->layer_of_op)
        return STOF_ERR_NOMEM;
    int l = 0;
    for (int i = 0; i < pg->n_ops; i++) {
        const graph_op *op = &pg->ops[i];
        c->layer_of_op[i] = op->kind == OP_ATTENTION ? l++ : -1;
        if (op->kind == OP_ATTENTION && (l > c->dec.n_layers ||
                                         op->attr.attn.heads != c->dec.layers[l - 1].heads))
            return err_set(err, STOF_ERR_INVALID, "the prefill graph's attention '%s' has no "
                           "match in the context graph: build both from one model", op->name);
    }
    if (l != c->dec.n_layers)
        return err_set(err, STOF_ERR_INVALID, "the prefill graph has %d attention layers, the "
                       "context graph %d: build both from one model", l, c->dec.n_layers);
    for (int k = 0; !rc && k < c->dec.n_layers; k++) {
        const gen_layer *ly = &c->dec.layers[k];
        rc = ops_kv_cache_alloc(&c->caches[k], c->p->batch, ly->cap, ly->kv_heads, ly->head_dim,
                                err);
        c->r->cache_bytes += 2 * sizeof(float) * (size_t)c->p->batch * (size_t)ly->cap *
                             (size_t)ly->kv_heads * (size_t)ly->head_dim;
    }
    return rc;
}

static int prefill(cpu_run *c, stof_error *err) {
    const graph *g = c->m->prefill;
    ref_values rv;
    ref_hooks h = {.ctx = c, .after = store_prefix};
    int rc = ref_values_init(g, &c->m->weights, &rv, err);
    if (!rc) {
        fill_sequences(c, g, &rv);
        rc = rerun(g, &rv, &h, err);
    }
    if (!rc)
        emit_last_rows(c, g, &rv, 0);
    c->r->steps++;
    ref_values_free(&rv);
    return rc;
}

/* A decode attention runs against its layer's cache. */
static int attend_cache(void *ctx, const graph *g, int i, const float *const *in, float *out,
                        int *handled, stof_error *err) {
    cpu_run *c = ctx;
    for (int l = 0; l < c->dec.n_layers; l++)
        if (c->dec.layers[l].op == i) {
            *handled = 1;
            return ops_attention_decode_ref(&g->ops[i].attr.attn, c->dec.layers[l].mask, in[0],
                                            in[1], &c->caches[l], out, err);
        }
    return STOF_OK;
}

static int decode_steps(cpu_run *c, stof_error *err) {
    const graph *g = &c->dec.g;
    ref_values rv;
    ref_hooks h = {.ctx = c, .run = attend_cache};
    int rc = ref_values_init(g, &c->m->weights, &rv, err);
    for (int t = 1; !rc && t < c->o->max_new_tokens && !gen_state_all_done(&c->st); t++) {
        for (int b = 0; b < c->p->batch; b++) {
            rv.data[c->dec.ids][b] = (float)gen_state_last(&c->st, b);
            /* an ended sequence stays at its last position (its tokens are dropped), and
             * its attention is skipped */
            rv.data[c->dec.positions][b] = (float)(c->st.len[b] - 1);
            rv.data[c->dec.attn_positions][b] = c->st.done[b] ? -1.0f : (float)(c->st.len[b] - 1);
        }
        rc = rerun(g, &rv, &h, err);
        for (int b = 0; !rc && b < c->p->batch; b++)
            gen_state_emit(&c->st, b, t, rv.data[g->output] + (size_t)b * c->r->vocab);
        c->r->steps++;
    }
    ref_values_free(&rv);
    return rc;
}

int gen_run_cpu(const gen_model *m, const gen_prompts *p, const gen_options *o,
                int keep_logits, gen_result *r, stof_error *err) {
    memset(r, 0, sizeof *r);
    cpu_run c = {.m = m, .p = p, .o = o, .r = r};
    int64_t vocab;
    int rc = gen_check_run(m, p, o, &vocab, err);
    if (!rc && !o->recompute)
        rc = gen_check_graph(m->prefill, "prefill", p, gen_longest(p), -1, err);
    if (!rc)
        rc = gen_state_init(&c.st, p, o, vocab, keep_logits, r, err);
    if (!rc && o->recompute)
        rc = recompute_all(&c, err);
    else if (!rc)
        rc = prepare_cache(&c, err);
    if (!rc && !o->recompute)
        rc = prefill(&c, err);
    if (!rc && !o->recompute)
        rc = decode_steps(&c, err);
    run_free(&c);
    if (rc)
        gen_result_free(r);
    return rc;
}
