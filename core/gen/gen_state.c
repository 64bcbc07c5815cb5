/* The sequences of one generation as it goes: see gen_state.h. */
#include "core/gen/gen_state.h"

#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"

void gen_result_free(gen_result *r) {
    free(r->tokens);
    free(r->n_new);
    free(r->logits);
    free(r->profile);
    memset(r, 0, sizeof *r);
}

int gen_longest(const gen_prompts *p) {
    int most = 0;
    for (int b = 0; b < p->batch; b++)
        most = p->len[b] > most ? p->len[b] : most;
    return most;
}

int gen_check_prompts(const gen_prompts *p, int64_t vocab, stof_error *err) {
    if (p->batch < 1 || !p->ids || !p->len)
        return err_set(err, STOF_ERR_INVALID, "no prompts given");
    for (int b = 0; b < p->batch; b++) {
        if (p->len[b] < 1 || p->len[b] > p->stride)
            return err_set(err, STOF_ERR_INVALID, "prompt %d has %d tokens (1 to %d)", b,
                           p->len[b], p->stride);
        for (int s = 0; s < p->len[b]; s++) {
            int32_t id = p->ids[(size_t)b * p->stride + s];
            if (id < 0 || id >= vocab)
                return err_set(err, STOF_ERR_INVALID, "prompt %d: token %d at %d is outside "
                               "the vocabulary [0, %lld)", b, id, s, (long long)vocab);
        }
    }
    return STOF_OK;
}

int gen_input_of(const graph *g, graph_init_kind init) {
    for (int t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].role == GRAPH_INPUT && g->tensors[t].init == init)
            return t;
    return -1;
}

int gen_check_graph(const graph *g, const char *what, const gen_prompts *p, int64_t need,
                    int mask_needed, stof_error *err) {
    int rc = gen_check_logits(g, err);
    if (rc)
        return rc;
    const graph_tensor *in = &g->tensors[graph_find_tensor(g, "input_ids")];
    if (in->shape[0] != p->batch || in->shape[1] < need)
        return err_set(err, STOF_ERR_INVALID, "the %s graph takes input_ids [%lld, %lld], not "
                       "%d sequences of up to %lld tokens", what, (long long)in->shape[0],
                       (long long)in->shape[1], p->batch, (long long)need);
    int ragged = mask_needed > 0;
    for (int b = 0; b < p->batch && mask_needed < 0; b++)
        ragged |= p->len[b] != in->shape[1];
    if (ragged && gen_input_of(g, GRAPH_INIT_PADDING) < 0)
        return err_set(err, STOF_ERR_UNSUPPORTED, "prompts shorter than the %s graph's %lld "
                       "tokens need its attention_mask input (--set padding=true)", what,
                       (long long)in->shape[1]);
    return STOF_OK;
}

int gen_check_run(const gen_model *m, const gen_prompts *p, const gen_options *o,
                  int64_t *vocab, stof_error *err) {
    const graph *ctx = m->context;
    int64_t need = (int64_t)gen_longest(p) + o->max_new_tokens - 1;
    *vocab = 0;
    int rc = gen_check_graph(ctx, "context", p, need, o->recompute, err);
    if (rc)
        return rc;
    *vocab = ctx->tensors[ctx->output].shape[2];
    rc = gen_check_prompts(p, *vocab, err);
    return rc ? rc : gen_options_check(o, *vocab, err);
}

int gen_state_init(gen_state *s, const gen_prompts *p, const gen_options *o, int64_t vocab,
                   int keep_logits, gen_result *r, stof_error *err) {
    memset(s, 0, sizeof *s);
    s->p = p;
    s->o = o;
    s->r = r;
    int B = p->batch, T = o->max_new_tokens;
    r->batch = B;
    r->max_new = T;
    r->vocab = vocab;
    r->tokens = err_malloc(sizeof *r->tokens * (size_t)B * (size_t)T, err);
    r->n_new = err_calloc((size_t)B, sizeof *r->n_new, err);
    r->logits = keep_logits ? err_calloc((size_t)T * (size_t)B * (size_t)vocab,
                                         sizeof *r->logits, err)
                            : NULL;
    s->len = err_malloc(sizeof *s->len * (size_t)B, err);
    s->done = err_calloc((size_t)B, sizeof *s->done, err);
    s->scratch = err_malloc(sizeof *s->scratch * 2 * (size_t)vocab, err);
    s->order = err_malloc(sizeof *s->order * 2 * (size_t)vocab, err);
    if (!r->tokens || !r->n_new || (keep_logits && !r->logits) || !s->len || !s->done ||
        !s->scratch || !s->order)
        return STOF_ERR_NOMEM;
    for (size_t k = 0; k < (size_t)B * (size_t)T; k++)
        r->tokens[k] = -1;
    for (int b = 0; b < B; b++)
        s->len[b] = p->len[b];
    return STOF_OK;
}

void gen_state_free(gen_state *s) {
    free(s->len);
    free(s->done);
    free(s->scratch);
    free(s->order);
    memset(s, 0, sizeof *s);
}

int gen_state_all_done(const gen_state *s) {
    for (int b = 0; b < s->p->batch; b++)
        if (!s->done[b])
            return 0;
    return 1;
}

void gen_state_emit(gen_state *s, int b, int t, const float *row) {
    if (!s->done[b])
        gen_state_emit_token(s, b, t, gen_sample(s->o, row, s->r->vocab, b, t, s->scratch,
                                                 s->order), row);
}

void gen_state_emit_token(gen_state *s, int b, int t, int32_t tok, const float *row) {
    if (s->done[b])
        return;
    int64_t V = s->r->vocab;
    s->r->tokens[(size_t)b * s->o->max_new_tokens + t] = tok;
    s->r->n_new[b]++;
    s->len[b]++;
    if (s->r->logits && row)
        memcpy(s->r->logits + ((size_t)t * s->p->batch + b) * V, row, sizeof *row * (size_t)V);
    for (int k = 0; k < s->o->n_stop; k++)
        s->done[b] |= tok == s->o->stop[k];
    s->done[b] |= s->r->n_new[b] == s->o->max_new_tokens;
}

int32_t gen_state_token(const gen_state *s, int b, int64_t i) {
    int n_prompt = s->p->len[b];
    return i < n_prompt ? s->p->ids[(size_t)b * s->p->stride + i]
                        : s->r->tokens[(size_t)b * s->o->max_new_tokens + (i - n_prompt)];
}

int32_t gen_state_last(const gen_state *s, int b) {
    return gen_state_token(s, b, s->len[b] - 1);
}
