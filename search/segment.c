/* Segments under tuning: their options (template x feasible setting) in a
 * seeded order, and sampling them through the cache and the backend. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/util.h"
#include "search/search_internal.h"

void search_seq_ops(const search_ctx *c, int q, int *ops) {
    for (int k = 0; k < c->seqs[q].n; k++)
        ops[k] = c->seqs[q].firsts[0] + k;
}

static int setting_feasible(const fusion_template *t, const fusion_dims *d, long i, int smem) {
    int values[FUSION_MAX_PARAMS];
    fusion_template_setting(t, i, values);
    return fusion_template_check(t, d, values, smem, NULL) == STOF_OK;
}

int search_match_feasible(const fusion_match *m, int smem_limit) {
    for (int t = 0; t < FUSION_T_COUNT; t++) {
        const fusion_template *tp = fusion_template_get((fusion_template_id)t);
        if (!fusion_match_has(m, (fusion_template_id)t))
            continue;
        for (long i = 0; i < fusion_template_settings(tp); i++)
            if (setting_feasible(tp, &m->dims, i, smem_limit))
                return 1;
    }
    return 0;
}

/* The backend's view of option o of segment s. */
static search_segment seg_view(const search_ctx *c, int q, const search_seg *s, int tmpl) {
    int base = c->seqs[q].firsts[0];
    return (search_segment){c->g, q, s->first, s->last, base + s->first, base + s->last,
                            (fusion_template_id)tmpl, &s->match, s->match.dims};
}

/* Every feasible setting of every matching template. */
static int seg_options(search_ctx *c, search_seg *s, stof_error *err) {
    long total = 0;
    for (int t = 0; t < FUSION_T_COUNT; t++)
        if (fusion_match_has(&s->match, (fusion_template_id)t))
            total += fusion_template_settings(fusion_template_get((fusion_template_id)t));
    s->order = err_malloc(sizeof *s->order * (size_t)(total ? total : 1), err);
    if (!s->order)
        return STOF_ERR_NOMEM;
    for (int t = 0; t < FUSION_T_COUNT; t++) {
        const fusion_template *tp = fusion_template_get((fusion_template_id)t);
        if (!fusion_match_has(&s->match, (fusion_template_id)t))
            continue;
        for (long i = 0; i < fusion_template_settings(tp); i++)
            if (setting_feasible(tp, &s->match.dims, i, c->opt.smem_limit))
                s->order[s->n_order++] = (search_option){t, i};
    }
    return STOF_OK;
}

/* Brings the first option of each template (in the shuffled order) to the
 * front, the rest keeping their order: the first samples of a segment then
 * try every template once. Drawn blindly, a template with few settings
 * (cuBLASLt's 4 against the ~70 of an own GEMM kernel) was often never
 * tried in a short search, and a 768x768 GEMM stayed 2.7x slower than it
 * needed to be. Returns how many options went to the front. */
static int seg_templates_first(search_seg *s) {
    int seen[FUSION_T_COUNT] = {0}, front = 0;
    for (int i = 0; i < s->n_order; i++) {
        int t = s->order[i].tmpl;
        if (seen[t])
            continue;
        seen[t] = 1;
        search_option o = s->order[i];
        memmove(&s->order[front + 1], &s->order[front], sizeof o * (size_t)(i - front));
        s->order[front++] = o;
    }
    return front;
}

/* The index of template tmpl's option with these values in s's order at or
 * after `from`; -1 when there is none. */
static int seg_find_option(const search_seg *s, int from, fusion_template_id tmpl,
                           const int *want) {
    const fusion_template *t = fusion_template_get(tmpl);
    for (int i = from; t && i < s->n_order; i++) {
        int values[FUSION_MAX_PARAMS];
        if (s->order[i].tmpl != (int)tmpl)
            continue;
        fusion_template_setting(t, s->order[i].setting, values);
        if (memcmp(values, want, sizeof *values * (size_t)t->n_params) == 0)
            return i;
    }
    return -1;
}

static void seg_swap(search_seg *s, int i, int j) {
    search_option o = s->order[i];
    s->order[i] = s->order[j];
    s->order[j] = o;
}

/* Swaps each template's default (search_backend.template_default) into the
 * place seg_templates_first gave that template's first option, so a
 * segment's first samples are what the executor would run, one per
 * template, before the random draws. A random first setting of a GEMM
 * template was usually far from its best at small M (24 blocks of 128 x
 * 128 at M = 128), and stage 1 judged fusions by a few such samples. */
static void seg_defaults_first(const search_ctx *c, int q, search_seg *s, int n_front) {
    if (!c->backend.template_default)
        return;
    for (int f = 0; f < n_front; f++) {
        const fusion_template_id tmpl = (fusion_template_id)s->order[f].tmpl;
        int want[FUSION_MAX_PARAMS] = {0};
        search_segment view = seg_view(c, q, s, tmpl);
        if (c->backend.template_default(c->backend.ud, &view, want) != STOF_OK)
            continue;
        const int i = seg_find_option(s, f, tmpl, want);
        if (i > f)
            seg_swap(s, i, f);
    }
}

/* Fisher-Yates with a generator seeded by the run's seed and the segment's
 * signature (under its first template): the same segment always gets the
 * same order within a run, whichever scheme it turns up in. Then every
 * template's first option goes to the front (seg_templates_first), its
 * default where the backend has one (seg_defaults_first). */
static void seg_shuffle(const search_ctx *c, int q, search_seg *s) {
    if (s->n_order < 2)
        return;
    char sig[SEARCH_SIG_MAX];
    search_segment view = seg_view(c, q, s, s->order[0].tmpl);
    search_segment_signature(&view, sig, sizeof sig);
    util_rng r = {util_mix64(c->opt.seed) ^ util_hash_str(UTIL_HASH_SEED, sig)};
    for (int i = s->n_order - 1; i > 0; i--) {
        int j = (int)(util_rng_next(&r) % (uint64_t)(i + 1));
        search_option tmp = s->order[i];
        s->order[i] = s->order[j];
        s->order[j] = tmp;
    }
    seg_defaults_first(c, q, s, seg_templates_first(s));
}

int search_seg_new(search_ctx *c, int q, int first, int last, search_seg **out,
                   stof_error *err) {
    *out = NULL;
    int ops[FUSION_MAX_OPS];
    search_seq_ops(c, q, ops);
    search_seg *s = err_calloc(1, sizeof *s, err);
    if (!s)
        return STOF_ERR_NOMEM;
    *s = (search_seg){.first = first, .last = last, .best_ms = INFINITY, .best = -1};
    int rc = fusion_match_segment(c->g, ops + first, last - first + 1, &s->match, err);
    if (!rc)
        rc = seg_options(c, s, err);
    if (rc) {
        search_seg_free(s);
        return rc;
    }
    seg_shuffle(c, q, s);
    *out = s;
    return STOF_OK;
}

void search_seg_free(search_seg *s) {
    if (!s)
        return;
    free(s->order);
    free(s);
}

/* ---- budget and progress ------------------------------------------------------------- */

int search_exhausted(search_ctx *c) {
    if (c->out_of_budget)
        return 1;
    if (c->opt.budget > 0 && c->stats.measured >= c->opt.budget) {
        c->stats.stopped_by_budget = 1;
        c->out_of_budget = 1;
    } else if (c->opt.time_limit_s > 0 &&
               c->opt.clock(c->opt.clock_ud) - c->t0 >= c->opt.time_limit_s) {
        c->stats.stopped_by_time = 1;
        c->out_of_budget = 1;
    }
    return c->out_of_budget;
}

double search_state_ms(const search_state *st) {
    double ms = 0;
    for (int k = 0; k < st->n_segs; k++)
        ms += st->segs[k]->best_ms;
    return ms;
}

double search_total_ms(const search_ctx *c) {
    double total = 0;
    for (int q = 0; c->states && q < c->n_seqs; q++)
        total += search_state_ms(&c->states[q]) * c->seqs[q].count;
    return total;
}

void search_report(search_ctx *c) {
    if (!c->opt.progress)
        return;
    search_progress p = {c->stage, c->stats.measured, c->stats.cache_hits, search_total_ms(c)};
    c->opt.progress(c->opt.cb_ud, &p);
}

/* ---- preparing ---------------------------------------------------------------------------- */

/* A setting's identity: its signature and values, hashed. */
static uint64_t option_key(const char *sig, const int *values, int n) {
    return util_hash(util_hash_str(UTIL_HASH_SEED, sig), values, sizeof *values * (size_t)n);
}

static int key_in(const uint64_t *keys, int n, uint64_t key) {
    for (int i = 0; i < n; i++)
        if (keys[i] == key)
            return 1;
    return 0;
}

/* The settings of one prepare call and their keys. */
typedef struct prep_batch {
    search_candidate *cand;
    uint64_t *keys;
    int n, cap;
    int covered; /* every one was in the backend's last call */
} prep_batch;

static int batch_add(prep_batch *b, const search_segment *view, const int *values, int n_values,
                     uint64_t key, stof_error *err) {
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        search_candidate *c = err_realloc(b->cand, sizeof *c * (size_t)cap, err);
        if (!c)
            return STOF_ERR_NOMEM;
        b->cand = c;
        uint64_t *k = err_realloc(b->keys, sizeof *k * (size_t)cap, err);
        if (!k)
            return STOF_ERR_NOMEM;
        b->keys = k;
        b->cap = cap;
    }
    search_candidate *c = &b->cand[b->n];
    memset(c, 0, sizeof *c);
    c->seg = *view;
    memcpy(c->values, values, sizeof *values * (size_t)n_values);
    b->keys[b->n++] = key;
    return STOF_OK;
}

/* The uncached options of one item, up to `room` of them in all. */
static int batch_item(search_ctx *c, const search_prep *it, int room, prep_batch *b,
                      stof_error *err) {
    const search_seg *s = it->s;
    int from = it->from > s->cursor ? it->from : s->cursor;
    for (int i = from; i < it->until && i < s->n_order && b->n < room; i++) {
        const search_option *o = &s->order[i];
        const fusion_template *t = fusion_template_get((fusion_template_id)o->tmpl);
        int values[FUSION_MAX_PARAMS];
        fusion_template_setting(t, o->setting, values);
        search_segment view = seg_view(c, it->q, s, o->tmpl);
        char sig[SEARCH_SIG_MAX];
        search_segment_signature(&view, sig, sizeof sig);
        uint64_t key = option_key(sig, values, t->n_params);
        if (search_cache_contains(c->cache, sig, values, t->n_params) ||
            key_in(b->keys, b->n, key))
            continue;
        b->covered &= key_in(c->prepared, c->n_prepared, key);
        int rc = batch_add(b, &view, values, t->n_params, key, err);
        if (rc)
            return rc;
    }
    return STOF_OK;
}

/* The batch's keys become the prepared set. */
static void remember_prepared(search_ctx *c, prep_batch *b) {
    free(c->prepared);
    c->prepared = b->keys;
    c->n_prepared = b->n;
    b->keys = NULL;
}

int search_prepare(search_ctx *c, const search_prep *items, int n, stof_error *err) {
    /* once the budget or the time is spent nothing is measured: preparing
     * would only keep the backend busy */
    if (!c->backend.prepare || (c->out_of_budget && !c->past_limit))
        return STOF_OK;
    long room = SEARCH_PREPARE_MAX;
    if (c->opt.budget > 0 && c->opt.budget - c->stats.measured < room)
        room = c->opt.budget - c->stats.measured;
    prep_batch b = {NULL, NULL, 0, 0, 1};
    int rc = STOF_OK;
    for (int i = 0; !rc && i < n && b.n < room; i++)
        rc = batch_item(c, &items[i], (int)room, &b, err);
    if (!rc && b.n > 0 && !b.covered) {
        rc = c->backend.prepare(c->backend.ud, b.cand, b.n, err);
        if (rc) {
            if (err)
                err->code = rc;
            err_prefix(err, "preparing %d settings: ", b.n);
        } else {
            c->stats.prepare_calls++;
            c->stats.prepared += b.n;
            remember_prepared(c, &b);
        }
    }
    free(b.cand);
    free(b.keys);
    return rc;
}

/* ---- sampling ------------------------------------------------------------------------ */

/* The time of one option: from the cache, else from the backend (and then
 * cached). *ran is 0 when the budget forbade measuring it. */
static int option_ms(search_ctx *c, int q, const search_seg *s, const search_option *o,
                     double *ms, int *ran, stof_error *err) {
    const fusion_template *t = fusion_template_get((fusion_template_id)o->tmpl);
    int values[FUSION_MAX_PARAMS];
    fusion_template_setting(t, o->setting, values);
    search_segment view = seg_view(c, q, s, o->tmpl);
    char sig[SEARCH_SIG_MAX];
    search_segment_signature(&view, sig, sizeof sig);
    *ran = 1;
    if (search_cache_lookup(c->cache, sig, values, t->n_params, ms)) {
        c->stats.cache_hits++;
        return STOF_OK;
    }
    if (!c->past_limit && search_exhausted(c)) {
        *ran = 0;
        return STOF_OK;
    }
    int rc = c->backend.measure(c->backend.ud, &view, values, ms, err);
    c->stats.measured++;
    c->stats.measured_past_limit += c->past_limit;
    if (c->stage == SEARCH_STAGE_SAMPLE)
        c->stats.measured_stage2++;
    else
        c->stats.measured_stage1++;
    if (rc == STOF_ERR_UNSUPPORTED) {
        *ms = INFINITY; /* cannot run here: cached so that it is not tried again */
    } else if (rc) {
        if (err)
            err->code = rc; /* a backend may return a code and leave err->code behind */
        err_prefix(err, "measuring %s over ops #%d-#%d: ", t->name, view.op_first, view.op_last);
        return rc;
    } else if (!(*ms >= 0) || isinf(*ms)) {
        return err_set(err, STOF_ERR_INTERNAL, "the backend timed %s over ops #%d-#%d at %g ms",
                       t->name, view.op_first, view.op_last, *ms);
    }
    return search_cache_store(c->cache, sig, values, t->n_params, *ms, err);
}

int search_seg_sample_to(search_ctx *c, int q, search_seg *s, int until, stof_error *err) {
    /* usually covered by a wider call made before (a state, a level of
     * stage 1, a round of stage 2): then nothing is said again */
    search_prep own = {q, s, s->cursor, until};
    int prc = search_prepare(c, &own, 1, err);
    if (prc)
        return prc;
    while (s->cursor < until && s->cursor < s->n_order) {
        double ms;
        int ran;
        int rc = option_ms(c, q, s, &s->order[s->cursor], &ms, &ran, err);
        if (rc || !ran)
            return rc;
        if (ms < s->best_ms) {
            s->best_ms = ms;
            s->best = s->cursor;
        }
        s->cursor++;
    }
    return STOF_OK;
}

void search_seg_default_next(search_ctx *c, int q, search_seg *s) {
    if (!c->backend.default_setting || s->cursor >= s->n_order)
        return;
    fusion_template_id tmpl;
    int want[FUSION_MAX_PARAMS] = {0};
    search_segment view = seg_view(c, q, s, s->order[s->cursor].tmpl);
    if (c->backend.default_setting(c->backend.ud, &view, &tmpl, want) != STOF_OK)
        return;
    const int i = seg_find_option(s, s->cursor, tmpl, want);
    if (i >= 0)
        seg_swap(s, i, s->cursor);
}
