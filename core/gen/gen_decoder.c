/* The graphs of a generation derived from the model's (gen.h): the decode step, and the
 * prefill that fills its caches (at the end of this file).
 *
 * The decode step comes from the model's graph at the full context. Every op of a decoder works on each token by itself except the
 * embedding's and the rotary's positions and the attention, so the step is the
 * same ops on [B, 1] with:
 *   - a position_ids input [B, 1]: the embedding's position rows and the
 *     rotary angles come from it;
 *   - an attention_position_ids input [B, 1]: the attentions' positions, -1
 *     for a sequence that has ended (its attention skipped);
 *   - each attention a decode step (op_attention.decode) with its mask copied
 *     (its rows are the context's positions) and a cache of the mask's span;
 *   - no attention_mask: a step has one real token a sequence, and padding
 *     zeros (mask_rows) pass their input on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/gen/gen.h"
#include "ops/ops.h"

#define GEN_POSITIONS_NAME "position_ids"
/* The attentions' own positions: a sequence's, or -1 for one that has ended (its attention
 * skipped: no key read, its cache untouched, zeros out). */
#define GEN_ATTN_POSITIONS_NAME "attention_position_ids"

typedef struct derive {
    const graph *src;
    graph *out;      /* the graph being made */
    gen_decoder *d;  /* the decode step (made, or being made) */
    int *map;        /* src tensor -> d.g tensor, -1: none */
    int *mask_map;   /* src mask -> d.g mask, -1: not copied yet */
    int batch;
} derive;

static void mask_release(mask *m) {
    mask_free(m);
}

/* An input of the model on one token: [B, S] -> [B, 1]; the attention_mask is dropped. */
static int derive_input(derive *x, int t, stof_error *err) {
    const graph_tensor *s = &x->src->tensors[t];
    if (s->init == GRAPH_INIT_PADDING)
        return STOF_OK;
    if (s->ndim != 2 || s->shape[0] != x->batch)
        return err_set(err, STOF_ERR_UNSUPPORTED, "input '%s' is not [batch, seq]: a decode "
                       "step takes one token a sequence", s->name);
    if (strcmp(s->name, GEN_POSITIONS_NAME) == 0 || strcmp(s->name, GEN_ATTN_POSITIONS_NAME) == 0)
        return err_set(err, STOF_ERR_UNSUPPORTED, "the model has an input named '%s': the "
                       "decode step's own", s->name);
    graph_tensor t1 = *s;
    t1.shape[1] = 1;
    return graph_add_tensor(x->out, &t1, &x->map[t], err);
}

/* A weight as it is, with the checkpoint names it is read from. */
static int derive_weight(derive *x, int t, stof_error *err) {
    int rc = graph_add_tensor(x->out, &x->src->tensors[t], &x->map[t], err);
    const graph_source *s = rc ? NULL : graph_source_of(x->src, t);
    if (!s)
        return rc;
    if (s->row_offset)
        return graph_set_source_rows(x->out, x->map[t], s->row_offset, err);
    if (s->transposed)
        return graph_set_source_transposed(x->out, x->map[t], graph_source_part(x->src, s, 0),
                                           err);
    const char *parts[GRAPH_MAX_SOURCE_PARTS];
    for (int k = 0; k < s->n; k++)
        parts[k] = graph_source_part(x->src, s, k);
    return graph_set_source(x->out, x->map[t], parts, s->part_rows, s->n, err);
}

/* The step's position inputs: the embedding's and the rotary's, and the attentions'. */
static int add_positions(derive *x, stof_error *err) {
    graph_tensor t = {.role = GRAPH_INPUT, .dtype = STOF_I32, .ndim = 2,
                      .shape = {x->batch, 1}, .producer = -1, .init = GRAPH_INIT_ZEROS};
    snprintf(t.name, sizeof t.name, "%s", GEN_POSITIONS_NAME);
    int rc = graph_add_tensor(&x->d->g, &t, &x->d->positions, err);
    snprintf(t.name, sizeof t.name, "%s", GEN_ATTN_POSITIONS_NAME);
    return rc ? rc : graph_add_tensor(&x->d->g, &t, &x->d->attn_positions, err);
}

/* The mask of a source attention, copied once into the step's graph. */
static int derive_mask(derive *x, int id, int *out, stof_error *err) {
    *out = -1;
    if (id < 0)
        return STOF_OK;
    if (x->mask_map[id] >= 0) {
        *out = x->mask_map[id];
        return STOF_OK;
    }
    mask *copy = NULL;
    int rc = mask_copy(x->src->masks[id], &copy, err);
    if (!rc)
        rc = graph_add_mask(x->out, copy, mask_release, &x->mask_map[id], err);
    *out = x->mask_map[id];
    return rc;
}

/* The K (kv 0) or V cache of the step's attention `layer`: a weight of zeros the steps write,
 * [B, cap, KVH, D], named alike in the step and the prefill. */
static int add_cache(derive *x, int layer, const gen_layer *l, stof_dtype dtype, int kv, int *id,
                     stof_error *err) {
    graph_tensor t = {.role = GRAPH_WEIGHT, .dtype = dtype, .ndim = 4,
                      .shape = {x->batch, l->cap, l->kv_heads, l->head_dim}, .producer = -1,
                      .init = GRAPH_INIT_ZEROS, .constant = 1};
    snprintf(t.name, sizeof t.name, "kv_cache.%d.%s", layer, kv ? "v" : "k");
    return graph_add_tensor(x->out, &t, id, err);
}

static int derive_attention(derive *x, int i, graph_op *op, stof_error *err) {
    op_attention *a = &op->attr.attn;
    if (a->cross || a->relpos || !a->causal)
        return err_set(err, STOF_ERR_UNSUPPORTED, "op '%s': a decode step runs causal "
                       "self-attention without a relative position bias, not %s",
                       op->name, a->cross ? "cross-attention" : a->relpos ? "relpos"
                                                                : "attention that sees ahead");
    int rc = derive_mask(x, a->mask, &a->mask, err);
    if (rc)
        return rc;
    a->decode = 1;
    a->padded = 0;
    gen_layer *l = &x->d->layers[x->d->n_layers];
    *l = (gen_layer){.op = x->d->g.n_ops, .source_op = i, .heads = a->heads,
                     .kv_heads = op_attention_kv_heads(a), .head_dim = a->head_dim,
                     .mask = a->mask >= 0 ? x->d->g.masks[a->mask] : NULL};
    l->cap = ops_kv_cache_span(l->mask, x->d->context);
    op->inputs[1] = x->d->attn_positions;
    op->n_inputs = 2;
    for (int kv = 0; kv < 2 && !rc; kv++)
        rc = add_cache(x, x->d->n_layers, l, x->out->tensors[op->inputs[0]].dtype, kv,
                       &op->inputs[op->n_inputs++], err);
    x->d->n_layers++;
    return rc;
}

/* Op i of the source on one token. */
static int derive_op(derive *x, int i, stof_error *err) {
    graph_op op = x->src->ops[i];
    if (op.kind == OP_MASK_ROWS) { /* padding zeros: none in a step */
        x->map[op.output] = x->map[op.inputs[0]];
        return STOF_OK;
    }
    for (int k = 0; k < op.n_inputs; k++) {
        int t = x->map[op.inputs[k]];
        if (t < 0 && !(op.kind == OP_ATTENTION && op.attr.attn.padded && k == 1))
            return err_set(err, STOF_ERR_UNSUPPORTED, "op '%s' reads '%s', which a decode step "
                           "does not have", op.name, x->src->tensors[op.inputs[k]].name);
        op.inputs[k] = t;
    }
    int rc = STOF_OK;
    if (op.n_inputs >= GRAPH_MAX_INPUTS && (op.kind == OP_EMBEDDING || op.kind == OP_ROTARY))
        return err_set(err, STOF_ERR_UNSUPPORTED, "decode step: op '%s' has no room for its "
                       "positions", op.name);
    if (op.kind == OP_ATTENTION)
        rc = derive_attention(x, i, &op, err);
    if (op.kind == OP_EMBEDDING && op.attr.embedding.has_position) {
        op.attr.embedding.has_position_ids = 1;
        op.inputs[op.n_inputs++] = x->d->positions;
    }
    if (op.kind == OP_ROTARY) {
        op.attr.rotary.has_positions = 1;
        op.inputs[op.n_inputs++] = x->d->positions;
    }
    if (!rc)
        rc = op_add(&x->d->g, &op, &x->map[op.output], err);
    return rc ? err_prefix(err, "decode step: ") : STOF_OK;
}

/* The source's layers stay layers (classes of layers for the fusion search). */
static void follow_layer(derive *x, int i, int *open) {
    int layer = x->src->ops[i].layer;
    if (layer == *open)
        return;
    if (*open >= 0)
        graph_end_layer(x->out);
    if (layer >= 0)
        graph_begin_layer(x->out);
    *open = layer;
}

int gen_check_logits(const graph *g, stof_error *err) {
    int ids = graph_find_tensor(g, "input_ids");
    if (ids < 0 || g->output < 0)
        return err_set(err, STOF_ERR_UNSUPPORTED, "generation needs a model with an input "
                       "'input_ids' [batch, seq] and an output");
    const graph_tensor *in = &g->tensors[ids], *out = &g->tensors[g->output];
    if (in->ndim != 2 || in->dtype != STOF_I32 || out->ndim != 3 ||
        out->shape[0] != in->shape[0] || out->shape[1] != in->shape[1])
        return err_set(err, STOF_ERR_UNSUPPORTED, "generation needs logits [batch, seq, vocab] "
                       "for input_ids [batch, seq]; the model's output '%s' is not (a model "
                       "without its language-modelling head: --set head=true)", out->name);
    if (in->init_high > 0 && out->shape[2] != in->init_high)
        return err_set(err, STOF_ERR_UNSUPPORTED, "the output '%s' has %lld features for a "
                       "vocabulary of %lld: not logits (a model without its head: --set "
                       "head=true)", out->name, (long long)out->shape[2],
                       (long long)in->init_high);
    return STOF_OK;
}

static int derive_all(derive *x, int src_ids, stof_error *err) {
    int rc = add_positions(x, err), open = -1;
    for (int t = 0; !rc && t < x->src->n_tensors; t++) {
        graph_role r = x->src->tensors[t].role;
        if (r == GRAPH_INPUT)
            rc = derive_input(x, t, err);
        else if (r == GRAPH_WEIGHT)
            rc = derive_weight(x, t, err);
    }
    x->d->ids = rc ? -1 : x->map[src_ids];
    for (int i = 0; !rc && i < x->src->n_ops; i++) {
        follow_layer(x, i, &open);
        rc = derive_op(x, i, err);
    }
    if (!rc && open >= 0)
        graph_end_layer(&x->d->g);
    if (!rc)
        rc = graph_set_output(&x->d->g, x->map[x->src->output], err);
    return rc;
}

/* x's tensor and mask maps, every entry -1 (none yet). */
static int derive_maps(derive *x, stof_error *err) {
    const graph *src = x->src;
    x->map = err_malloc(sizeof *x->map * (size_t)(src->n_tensors ? src->n_tensors : 1), err);
    x->mask_map = err_malloc(sizeof *x->mask_map * (size_t)(src->n_masks + 1), err);
    if (!x->map || !x->mask_map)
        return STOF_ERR_NOMEM;
    for (int t = 0; t < src->n_tensors; t++)
        x->map[t] = -1;
    for (int k = 0; k < src->n_masks; k++)
        x->mask_map[k] = -1;
    return STOF_OK;
}

int gen_decoder_build(const graph *model, gen_decoder *d, stof_error *err) {
    memset(d, 0, sizeof *d);
    graph_init(&d->g);
    int rc = gen_check_logits(model, err);
    if (rc)
        return rc;
    int ids = graph_find_tensor(model, "input_ids");
    const graph_tensor *out = &model->tensors[model->output];
    d->context = out->shape[1];
    d->vocab = out->shape[2];
    snprintf(d->g.name, sizeof d->g.name, "%.80s.decode", model->name);
    derive x = {.src = model, .out = &d->g, .d = d, .batch = (int)out->shape[0]};
    d->layers = err_calloc((size_t)model->n_ops + 1, sizeof *d->layers, err);
    rc = d->layers ? derive_maps(&x, err) : STOF_ERR_NOMEM;
    if (!rc)
        rc = derive_all(&x, ids, err);
    free(x.map);
    free(x.mask_map);
    if (rc)
        gen_decoder_free(d);
    return rc;
}

void gen_decoder_free(gen_decoder *d) {
    graph_free(&d->g);
    free(d->layers);
    memset(d, 0, sizeof *d);
}

/* ---- the prefill that fills the step's caches ------------------------------------------- */

/* The last attention op of g, or -1. */
static int last_attention(const graph *g) {
    int last = -1;
    for (int i = 0; i < g->n_ops; i++)
        if (g->ops[i].kind == OP_ATTENTION)
            last = i;
    return last;
}

/* Attention `layer` of the prefill: the same op, storing into the step's caches. */
static int prefill_attention(derive *x, int layer, graph_op *op, stof_error *err) {
    op_attention *a = &op->attr.attn;
    const gen_layer *l = layer < x->d->n_layers ? &x->d->layers[layer] : NULL;
    if (!l || l->heads != a->heads || l->kv_heads != op_attention_kv_heads(a) ||
        l->head_dim != a->head_dim)
        return err_set(err, STOF_ERR_INVALID, "prefill: attention '%s' is not the decode "
                       "step's attention %d", op->name, layer);
    if (op->n_inputs + 2 > GRAPH_MAX_INPUTS)
        return err_set(err, STOF_ERR_UNSUPPORTED, "prefill: attention '%s' has no room for its "
                       "caches", op->name);
    int rc = derive_mask(x, a->mask, &a->mask, err);
    a->store = 1;
    for (int kv = 0; kv < 2 && !rc; kv++)
        rc = add_cache(x, layer, l, x->out->tensors[op->inputs[0]].dtype, kv,
                       &op->inputs[op->n_inputs++], err);
    return rc;
}

/* The tensors ops 0 .. last read, added as they are (inputs and weights only). */
static int prefill_tensors(derive *x, int last, stof_error *err) {
    int rc = STOF_OK;
    for (int i = 0; !rc && i <= last; i++) {
        const graph_op *op = &x->src->ops[i];
        for (int k = 0; !rc && k < op->n_inputs; k++) {
            int t = op->inputs[k];
            graph_role r = x->src->tensors[t].role;
            if (x->map[t] >= 0 || (r != GRAPH_INPUT && r != GRAPH_WEIGHT))
                continue;
            rc = r == GRAPH_WEIGHT ? derive_weight(x, t, err)
                                   : graph_add_tensor(x->out, &x->src->tensors[t], &x->map[t],
                                                      err);
        }
    }
    return rc;
}

static int prefill_ops(derive *x, int last, stof_error *err) {
    int rc = prefill_tensors(x, last, err), open = -1, layer = 0;
    for (int i = 0; !rc && i <= last; i++) {
        graph_op op = x->src->ops[i];
        follow_layer(x, i, &open);
        for (int k = 0; k < op.n_inputs; k++)
            op.inputs[k] = x->map[op.inputs[k]];
        if (op.kind == OP_ATTENTION)
            rc = prefill_attention(x, layer++, &op, err);
        if (!rc)
            rc = op_add(x->out, &op, &x->map[op.output], err);
    }
    if (!rc && open >= 0)
        graph_end_layer(x->out);
    if (!rc && layer != x->d->n_layers)
        rc = err_set(err, STOF_ERR_INVALID, "prefill: %d attention ops, the decode step has %d",
                     layer, x->d->n_layers);
    return rc ? rc : graph_set_output(x->out, x->map[x->src->ops[last].output], err);
}

int gen_prefill_build(const graph *prefill, const gen_decoder *d, graph *out, stof_error *err) {
    graph_init(out);
    int last = last_attention(prefill);
    if (last < 0)
        return err_set(err, STOF_ERR_UNSUPPORTED, "prefill: the model has no attention");
    const graph_tensor *y = &prefill->tensors[prefill->ops[last].output];
    snprintf(out->name, sizeof out->name, "%.80s.prefill", prefill->name);
    /* the prefill only reads the step (its layers' caches) */
    derive x = {.src = prefill, .out = out, .d = (gen_decoder *)d, .batch = (int)y->shape[0]};
    int rc = x.batch == d->g.tensors[d->ids].shape[0]
                 ? derive_maps(&x, err)
                 : err_set(err, STOF_ERR_INVALID, "prefill: batch %d, the decode step's %lld",
                           x.batch, (long long)d->g.tensors[d->ids].shape[0]);
    if (!rc)
        rc = prefill_ops(&x, last, err);
    free(x.map);
    free(x.mask_map);
    if (rc)
        graph_free(out);
    return rc;
}
