/* After the search (tune_impl.h, tune_refine_result): each segment's
 * executor defaults and, for attention, the selector's best candidates
 * timed through the measurement cache against the search's choice; and
 * every segment of another result timed with its own setting
 * (tune_time_result: the executor's default plan, before it is timed end
 * to end against the tuned one). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/tune/tune_impl.h"

/* A setting's time through the cache, measured when it is not there. */
static int measure_cached(tune_backend *b, search_cache *cache, const search_segment *view,
                          const int *values, double *ms, long *measured, stof_error *err) {
    char sig[SEARCH_SIG_MAX];
    search_segment_signature(view, sig, sizeof sig);
    int n = fusion_template_get(view->tmpl)->n_params;
    if (search_cache_lookup(cache, sig, values, n, ms))
        return STOF_OK;
    int rc = tune_backend_measure(b, view, values, ms, err);
    (*measured)++;
    if (rc == STOF_ERR_UNSUPPORTED)
        *ms = INFINITY;
    else if (rc)
        return rc;
    return search_cache_store(cache, sig, values, n, *ms, err);
}

/* The settings a segment is also tried with after the search: the
 * executor's defaults for the search's template and for the executor's
 * own first choice; for attention the selector's best candidates. */
static int extra_candidates(const graph *g, exec_segment *s, const search_seg_result *sg,
                            const mha_device_limits *lim, int n_attention, exec_choice *out,
                            int cap, int *n, stof_error *err) {
    *n = 0;
    fusion_template_id tmpls[2] = {sg->tmpl, sg->tmpl};
    int n_tmpls = 1;
    if (exec_segment_template(g, s->first, s->n, &s->match, &tmpls[1], NULL) == STOF_OK &&
        tmpls[1] != sg->tmpl && !(tune_is_attention(tmpls[1]) && tune_is_attention(sg->tmpl)))
        n_tmpls = 2;
    for (int k = 0; k < n_tmpls && *n < cap; k++) {
        s->tmpl = tmpls[k];
        s->has_values = 0;
        s->auto_attention = tune_is_attention(tmpls[k]);
        int got = 0;
        stof_error e = {0};
        int rc = exec_segment_candidates(g, s, lim, tune_is_attention(tmpls[k]) ? n_attention : 0,
                                         out + *n, cap - *n, &got, &e);
        if (rc == STOF_ERR_NOMEM)
            return err_set(err, rc, "%s", e.msg);
        *n += rc ? 0 : got; /* a template without defaults offers none */
    }
    return STOF_OK;
}

typedef struct refine_ctx {
    const graph *g;
    const search_sequence *seqs;
    tune_backend *b;
    search_cache *cache;
    mha_device_limits lim;
    int n_attention;
    tune_outcome *res;
} refine_ctx;

/* One setting timed after the search against a segment's result. */
typedef struct refine_item {
    search_seg_result *sg;
    int q;
    exec_segment s;   /* the match its view points to */
    exec_choice choice;
} refine_item;

typedef struct refine_list {
    refine_item *items;
    int n, cap;
} refine_list;

static search_segment refine_view(const refine_ctx *c, const refine_item *it) {
    return (search_segment){c->g, it->q, it->sg->first, it->sg->last, it->s.first,
                            it->s.first + it->s.n - 1, it->choice.tmpl, &it->s.match,
                            it->s.match.dims};
}

static int list_add(refine_list *l, const refine_item *it, stof_error *err) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 32;
        refine_item *grown = err_realloc(l->items, sizeof *grown * (size_t)cap, err);
        if (!grown)
            return STOF_ERR_NOMEM;
        l->items = grown;
        l->cap = cap;
    }
    l->items[l->n++] = *it;
    return STOF_OK;
}

/* The candidates of one segment result that differ from it. */
static int refine_collect(refine_ctx *c, int q, search_seg_result *sg, refine_list *l,
                          stof_error *err) {
    const graph *g = c->g;
    exec_segment s;
    int rc = exec_segment_at(g, c->seqs[q].firsts[0] + sg->first, sg->last - sg->first + 1, &s,
                             err);
    exec_choice cand[2 + MHA_EXEC_MAX_MEASURED];
    int n = 0;
    if (!rc)
        rc = extra_candidates(g, &s, sg, &c->lim, c->n_attention, cand,
                              (int)(sizeof cand / sizeof cand[0]), &n, err);
    for (int k = 0; !rc && k < n; k++) {
        const fusion_template *t = fusion_template_get(cand[k].tmpl);
        if (!fusion_match_has(&s.match, cand[k].tmpl) ||
            (cand[k].tmpl == sg->tmpl &&
             memcmp(cand[k].values, sg->values, sizeof *sg->values * (size_t)t->n_params) == 0))
            continue;
        rc = list_add(l, &(refine_item){sg, q, s, cand[k]}, err);
    }
    return rc;
}

/* The uncached ones, told to the backend in the order they are timed. */
static int refine_prepare(refine_ctx *c, const refine_list *l, stof_error *err) {
    search_candidate *cands = err_malloc(sizeof *cands * (size_t)(l->n ? l->n : 1), err);
    if (!cands)
        return STOF_ERR_NOMEM;
    int n = 0;
    for (int i = 0; i < l->n; i++) {
        search_segment view = refine_view(c, &l->items[i]);
        char sig[SEARCH_SIG_MAX];
        search_segment_signature(&view, sig, sizeof sig);
        const fusion_template *t = fusion_template_get(view.tmpl);
        if (search_cache_contains(c->cache, sig, l->items[i].choice.values, t->n_params))
            continue;
        memset(&cands[n], 0, sizeof cands[n]);
        cands[n].seg = view;
        memcpy(cands[n].values, l->items[i].choice.values, sizeof cands[n].values);
        n++;
    }
    int rc = tune_backend_prepare(c->b, cands, n, err);
    free(cands);
    return rc;
}

static int refine_measure(refine_ctx *c, refine_item *it, stof_error *err) {
    search_segment view = refine_view(c, it);
    const fusion_template *t = fusion_template_get(it->choice.tmpl);
    search_seg_result *sg = it->sg;
    double ms;
    int rc = measure_cached(c->b, c->cache, &view, it->choice.values, &ms,
                            &c->res->extra_measured, err);
    if (!rc && ms < sg->ms) {
        sg->tmpl = it->choice.tmpl;
        sg->n_values = t->n_params;
        memset(sg->values, 0, sizeof sg->values);
        memcpy(sg->values, it->choice.values, sizeof *sg->values * (size_t)t->n_params);
        sg->ms = ms;
        c->res->improved++;
    }
    return rc;
}

/* Each sequence's time from its segments', and the forward pass's. */
static void add_up(search_result *r, const search_sequence *seqs) {
    r->total_ms = 0;
    for (int q = 0; q < r->n_seqs; q++) {
        search_seq_result *sr = &r->seqs[q];
        sr->ms = 0;
        for (int k = 0; k < sr->n_segs; k++)
            sr->ms += sr->segs[k].ms;
        r->total_ms += sr->ms * seqs[q].count;
    }
}

/* Every segment's defaults and the selector's choices compete with what
 * the search found, so a plan never loses to the executor's untuned
 * choices for its own scheme. All of them are collected and prepared first
 * (their kernels compile together), then timed. */
static int refine(refine_ctx *c, search_result *r, stof_error *err) {
    refine_list l = {NULL, 0, 0};
    int rc = STOF_OK;
    for (int q = 0; !rc && q < r->n_seqs; q++)
        for (int k = 0; !rc && k < r->seqs[q].n_segs; k++)
            rc = refine_collect(c, q, &r->seqs[q].segs[k], &l, err);
    if (!rc)
        rc = refine_prepare(c, &l, err);
    for (int i = 0; !rc && i < l.n; i++)
        rc = refine_measure(c, &l.items[i], err);
    free(l.items);
    if (!rc)
        add_up(r, c->seqs);
    return rc;
}

int tune_refine_result(tune_backend *b, search_cache *cache, const graph *g,
                       const search_sequence *seqs, int n_attention, search_result *r,
                       tune_outcome *res, stof_error *err) {
    refine_ctx c = {g, seqs, b, cache, b->lim, n_attention, res};
    return refine(&c, r, err);
}

/* Segment sg's own setting, as an item to time. */
static int own_item(refine_ctx *c, int q, search_seg_result *sg, refine_list *l,
                    stof_error *err) {
    refine_item it;
    memset(&it, 0, sizeof it);
    it.sg = sg;
    it.q = q;
    int rc = exec_segment_at(c->g, c->seqs[q].firsts[0] + sg->first, sg->last - sg->first + 1,
                             &it.s, err);
    it.choice.tmpl = sg->tmpl;
    memcpy(it.choice.values, sg->values, sizeof it.choice.values);
    return rc ? rc : list_add(l, &it, err);
}

int tune_time_result(tune_backend *b, search_cache *cache, const graph *g,
                     const search_sequence *seqs, search_result *r, tune_outcome *res,
                     stof_error *err) {
    refine_ctx c = {g, seqs, b, cache, b->lim, 0, res};
    refine_list l = {NULL, 0, 0};
    int rc = STOF_OK;
    for (int q = 0; !rc && q < r->n_seqs; q++)
        for (int k = 0; !rc && k < r->seqs[q].n_segs; k++)
            rc = own_item(&c, q, &r->seqs[q].segs[k], &l, err);
    if (!rc)
        rc = refine_prepare(&c, &l, err);
    for (int i = 0; !rc && i < l.n; i++) {
        refine_item *it = &l.items[i];
        search_segment view = refine_view(&c, it);
        rc = measure_cached(b, cache, &view, it->choice.values, &it->sg->ms,
                            &res->extra_measured, err);
        if (!rc && !isfinite(it->sg->ms))
            rc = err_set(err, STOF_ERR_UNSUPPORTED, "ops #%d-#%d with their default %s setting "
                         "did not run alone, or gave a wrong output", it->s.first,
                         it->s.first + it->s.n - 1, fusion_template_get(it->choice.tmpl)->name);
    }
    free(l.items);
    if (!rc)
        add_up(r, seqs);
    return rc;
}
