/* search_run: the initial schemes, stage 1, stage 2 and the result; and the
 * sequence classes of a graph. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/util.h"
#include "search/search_internal.h"

const char *search_stage_name(search_stage s) {
    switch (s) {
    case SEARCH_STAGE_INITIAL: return "initial";
    case SEARCH_STAGE_EXPAND: return "expand";
    case SEARCH_STAGE_SAMPLE: return "sample";
    case SEARCH_STAGE_DONE: return "done";
    }
    return "?";
}

/* ---- sequences ---------------------------------------------------------------------- */

void search_sequences_free(search_sequence *seqs, int n) {
    for (int i = 0; seqs && i < n; i++)
        free(seqs[i].firsts);
    free(seqs);
}

/* Groups the graph's sequences by class: class k holds every sequence whose
 * cls is its first sequence, in graph order. class_of maps a sequence that
 * starts a class (cls == itself) to that class's index. */
static int sequences_fill(const fusion_seq *runs, int n_runs, int *class_of,
                          search_sequence *seqs, int *n_out, stof_error *err) {
    int n = 0;
    for (int r = 0; r < n_runs; r++) {
        if (runs[r].cls == r) {
            search_sequence *s = &seqs[n];
            *s = (search_sequence){runs[r].layer, runs[r].n, 0, NULL};
            class_of[r] = n++;
            s->firsts = err_malloc(sizeof *s->firsts * (size_t)n_runs, err);
            if (!s->firsts) {
                *n_out = n;
                return STOF_ERR_NOMEM;
            }
        }
        search_sequence *s = &seqs[class_of[runs[r].cls]];
        s->firsts[s->count++] = runs[r].first;
    }
    *n_out = n;
    return STOF_OK;
}

int search_sequences_from_graph(const graph *g, search_sequence **out, int *n_out,
                                stof_error *err) {
    *out = NULL;
    *n_out = 0;
    fusion_seq *runs = NULL;
    int n_runs = 0, n = 0;
    int rc = fusion_sequences(g, &runs, &n_runs, err);
    if (rc)
        return rc;
    int *class_of = err_malloc(sizeof *class_of * (size_t)n_runs, err);
    search_sequence *seqs = err_calloc((size_t)n_runs, sizeof *seqs, err);
    rc = class_of && seqs ? STOF_OK : STOF_ERR_NOMEM;
    for (int r = 0; !rc && r < n_runs; r++)
        if (runs[r].n > FUSION_MAX_OPS)
            rc = err_set(err, STOF_ERR_UNSUPPORTED, "a sequence of %d ops from #%d (at most %d)",
                         runs[r].n, runs[r].first, FUSION_MAX_OPS);
    if (!rc)
        rc = sequences_fill(runs, n_runs, class_of, seqs, &n, err);
    free(runs);
    free(class_of);
    if (rc) {
        search_sequences_free(seqs, n);
        return rc;
    }
    *out = seqs;
    *n_out = n;
    return STOF_OK;
}

/* ---- results ---------------------------------------------------------------------------- */

void search_result_free(search_result *r) {
    for (int q = 0; r->seqs && q < r->n_seqs; q++)
        free(r->seqs[q].segs);
    free(r->seqs);
    memset(r, 0, sizeof *r);
}

int search_result_same_choices(const search_result *a, const search_result *b) {
    if (a->n_seqs != b->n_seqs)
        return 0;
    for (int q = 0; q < a->n_seqs; q++) {
        const search_seq_result *x = &a->seqs[q], *y = &b->seqs[q];
        if (!fusion_scheme_equal(&x->scheme, &y->scheme) || x->n_segs != y->n_segs)
            return 0;
        for (int k = 0; k < x->n_segs; k++)
            if (x->segs[k].tmpl != y->segs[k].tmpl ||
                memcmp(x->segs[k].values, y->segs[k].values, sizeof x->segs[k].values) != 0)
                return 0;
    }
    return 1;
}

static int seg_result(const search_ctx *c, int q, const search_seg *s, search_seg_result *out,
                      stof_error *err) {
    if (s->best < 0)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "no setting of ops #%d-#%d could run (%d of %d tried)",
                       c->seqs[q].firsts[0] + s->first, c->seqs[q].firsts[0] + s->last,
                       s->cursor, s->n_order);
    const search_option *o = &s->order[s->best];
    const fusion_template *t = fusion_template_get((fusion_template_id)o->tmpl);
    *out = (search_seg_result){s->first, s->last, t->id, t->n_params, {0}, s->best_ms};
    fusion_template_setting(t, o->setting, out->values);
    return STOF_OK;
}

static int seq_result(const search_ctx *c, int q, const search_state *st, search_seq_result *out,
                      stof_error *err) {
    out->scheme = st->scheme;
    fusion_scheme_canonical(&out->scheme);
    out->segs = err_calloc((size_t)st->n_segs, sizeof *out->segs, err);
    if (!out->segs)
        return STOF_ERR_NOMEM;
    out->n_segs = st->n_segs;
    for (int k = 0; k < st->n_segs; k++) {
        int rc = seg_result(c, q, st->segs[k], &out->segs[k], err);
        if (rc)
            return rc;
        out->ms += out->segs[k].ms;
    }
    return STOF_OK;
}

static int build_result(search_ctx *c, search_result *out, stof_error *err) {
    out->seqs = err_calloc((size_t)c->n_seqs, sizeof *out->seqs, err);
    if (!out->seqs)
        return STOF_ERR_NOMEM;
    out->n_seqs = c->n_seqs;
    for (int q = 0; q < c->n_seqs; q++) {
        int rc = seq_result(c, q, &c->states[q], &out->seqs[q], err);
        if (rc)
            return rc;
        out->total_ms += out->seqs[q].ms * c->seqs[q].count;
    }
    return STOF_OK;
}

/* ---- the stages ---------------------------------------------------------------------------- */

static double default_clock(void *ud) {
    return util_now();
}

static void fill_defaults(search_options *o) {
    if (o->samples_per_candidate <= 0)
        o->samples_per_candidate = SEARCH_DEFAULT_K;
    if (o->patience <= 0)
        o->patience = SEARCH_DEFAULT_PATIENCE;
    if (o->min_gain == 0)
        o->min_gain = SEARCH_DEFAULT_MIN_GAIN;
    if (o->smem_limit <= 0)
        o->smem_limit = SEARCH_DEFAULT_SMEM;
    if (!o->clock)
        o->clock = default_clock;
}

static int check_arguments(const graph *g, const search_sequence *seqs, int n_seqs,
                           const search_backend *b, stof_error *err) {
    if (!g || !seqs || n_seqs < 1 || !b || !b->measure)
        return err_set(err, STOF_ERR_INVALID, "search_run needs a graph, sequences and a backend");
    for (int q = 0; q < n_seqs; q++) {
        const search_sequence *s = &seqs[q];
        if (s->n < 1 || s->n > FUSION_MAX_OPS || s->count < 1 || !s->firsts ||
            s->firsts[0] < 0 || s->firsts[0] + s->n > g->n_ops)
            return err_set(err, STOF_ERR_INVALID, "sequence %d (%d ops from #%d) is not in the graph",
                           q, s->n, s->firsts ? s->firsts[0] : -1);
    }
    return STOF_OK;
}

/* A segment of the initial schemes still without a setting that runs,
 * with options left to try. */
static int seg_unfinished(const search_seg *s) {
    return s->best < 0 && s->cursor < s->n_order;
}

/* When the time limit ran out before every segment of the initial schemes
 * had a setting that runs, the segments left get one anyway, past the
 * limit: the backend's default setting first (all of them prepared in one
 * call), then the next of their order until one runs. A limit too short to
 * search still gives a plan, of the initial schemes unsearched. Not for a
 * spent budget: it counts measurements, and these would exceed it. */
static int finish_initial(search_ctx *c, stof_error *err) {
    if (!c->stats.stopped_by_time || c->stats.stopped_by_budget)
        return STOF_OK;
    int total = 0;
    for (int q = 0; q < c->n_seqs; q++)
        total += c->states[q].n_segs;
    search_prep *items = err_malloc(sizeof *items * (size_t)(total + 1), err);
    if (!items)
        return STOF_ERR_NOMEM;
    int n = 0;
    for (int q = 0; q < c->n_seqs; q++)
        for (int k = 0; k < c->states[q].n_segs; k++) {
            search_seg *s = c->states[q].segs[k];
            if (!seg_unfinished(s))
                continue;
            search_seg_default_next(c, q, s);
            items[n++] = (search_prep){q, s, s->cursor, s->cursor + 1};
        }
    c->past_limit = 1;
    int rc = n ? search_prepare(c, items, n, err) : STOF_OK;
    for (int q = 0; q < c->n_seqs; q++)
        for (int k = 0; k < c->states[q].n_segs; k++) {
            search_seg *s = c->states[q].segs[k];
            while (!rc && seg_unfinished(s))
                rc = search_seg_sample_to(c, q, s, s->cursor + 1, err);
        }
    c->past_limit = 0;
    free(items);
    return rc;
}

/* The budget must at least give every initial segment one setting. */
static int check_initial_measured(const search_ctx *c, stof_error *err) {
    for (int q = 0; q < c->n_seqs; q++)
        for (int k = 0; k < c->states[q].n_segs; k++) {
            const search_seg *s = c->states[q].segs[k];
            if (s->cursor == 0 && s->n_order > 0)
                return err_set(err, STOF_ERR_INVALID,
                               "the %s ran out before the initial scheme was measured (%ld "
                               "settings measured)",
                               c->stats.stopped_by_time ? "time limit" : "budget",
                               c->stats.measured);
        }
    return STOF_OK;
}

/* The scheme stage 1 starts from: the caller's, or the rules'. alt gets the
 * rules' scheme without CI+CI chains when that differs (*has_alt = 1). */
static int initial_scheme(search_ctx *c, int q, const int *ops, fusion_scheme *s,
                          fusion_scheme *alt, int *has_alt, stof_error *err) {
    *has_alt = 0;
    if (!c->opt.initial) {
        search_rules rules = {c->opt.chain_max_tokens, c->opt.smem_limit};
        int rc = search_initial_scheme(c->g, ops, c->seqs[q].n, &rules, s, err);
        if (rc || rules.chain_max_tokens < 0)
            return rc;
        search_rules no_chains = {-1, c->opt.smem_limit};
        rc = search_initial_scheme(c->g, ops, c->seqs[q].n, &no_chains, alt, err);
        *has_alt = !rc && !fusion_scheme_equal(s, alt);
        return rc;
    }
    *s = c->opt.initial[q];
    int rc = fusion_scheme_validate(c->g, ops, c->seqs[q].n, s, NULL, err);
    if (rc)
        err_prefix(err, "the initial scheme of sequence %d: ", q);
    return rc;
}

/* The paper fuses CI+CI chains first at small batch x seq, a rule of thumb
 * whose pay-off depends on the GPU and the chain kernel (on an H200 the
 * fused FFN measured 5x slower than two GEMMs at 128 tokens), and stage 1
 * only ever merges segments, so it could never undo a bad chain. Both
 * starting points are therefore measured and the faster one is kept. */
static int settle_initial_state(search_ctx *c, int q, search_state *alt, int has_alt,
                                stof_error *err) {
    int rc = search_state_sample(c, q, &c->states[q], err);
    if (rc || !has_alt)
        return rc;
    if ((rc = search_state_sample(c, q, alt, err)) != STOF_OK)
        return rc;
    if (search_state_ms(alt) < search_state_ms(&c->states[q])) {
        search_state_free(&c->states[q]);
        c->states[q] = *alt;
        memset(alt, 0, sizeof *alt);
    }
    return STOF_OK;
}

/* Every starting state of every sequence, unsampled; then all their
 * segments prepared in one call, in the order they are sampled. */
static int build_initial_states(search_ctx *c, const fusion_scheme *schemes,
                                const int *has_alt, search_state *alts, stof_error *err) {
    int rc = STOF_OK;
    for (int q = 0; !rc && q < c->n_seqs; q++) {
        rc = search_state_build(c, q, &schemes[2 * q], &c->states[q], err);
        c->stats.schemes_tried++;
        if (!rc && has_alt[q]) {
            rc = search_state_build(c, q, &schemes[2 * q + 1], &alts[q], err);
            c->stats.schemes_tried++;
        }
    }
    int total = 0;
    for (int q = 0; q < c->n_seqs; q++)
        total += c->states[q].n_segs + alts[q].n_segs;
    search_prep *items = rc ? NULL : err_malloc(sizeof *items * (size_t)(total + 1), err);
    if (!rc && !items)
        rc = STOF_ERR_NOMEM;
    int n = 0;
    for (int q = 0; !rc && q < c->n_seqs; q++) {
        search_state_prep(c, q, &c->states[q], items, &n);
        search_state_prep(c, q, &alts[q], items, &n);
    }
    if (!rc)
        rc = search_prepare(c, items, n, err);
    free(items);
    return rc;
}

/* Every initial scheme is settled before anything is measured, so that a
 * bad one given by the caller costs no measurement. */
static int stage_initial(search_ctx *c, stof_error *err) {
    c->stage = SEARCH_STAGE_INITIAL;
    fusion_scheme *schemes = err_calloc((size_t)c->n_seqs * 2, sizeof *schemes, err);
    int *has_alt = err_calloc((size_t)c->n_seqs, sizeof *has_alt, err);
    search_state *alts = err_calloc((size_t)c->n_seqs, sizeof *alts, err);
    int rc = schemes && has_alt && alts ? STOF_OK : STOF_ERR_NOMEM;
    for (int q = 0; !rc && q < c->n_seqs; q++) {
        int ops[FUSION_MAX_OPS];
        search_seq_ops(c, q, ops);
        rc = initial_scheme(c, q, ops, &schemes[2 * q], &schemes[2 * q + 1], &has_alt[q], err);
    }
    if (!rc)
        rc = build_initial_states(c, schemes, has_alt, alts, err);
    for (int q = 0; !rc && q < c->n_seqs; q++)
        rc = settle_initial_state(c, q, &alts[q], has_alt[q], err);
    for (int q = 0; alts && q < c->n_seqs; q++)
        search_state_free(&alts[q]);
    free(alts);
    free(schemes);
    free(has_alt);
    if (!rc)
        rc = finish_initial(c, err);
    if (rc)
        return rc;
    search_report(c);
    return check_initial_measured(c, err);
}

static int run_stages(search_ctx *c, stof_error *err) {
    int rc = stage_initial(c, err);
    c->stage = SEARCH_STAGE_EXPAND;
    for (int q = 0; !rc && !c->opt.skip_expand && q < c->n_seqs; q++)
        rc = search_expand(c, q, &c->states[q], err);
    if (rc)
        return rc;
    c->stage = SEARCH_STAGE_SAMPLE;
    search_report(c);
    return search_sample(c, c->states, err);
}

int search_run(const graph *g, const search_sequence *seqs, int n_seqs,
               const search_backend *backend, const search_options *opt, search_result *out,
               stof_error *err) {
    memset(out, 0, sizeof *out);
    int rc = check_arguments(g, seqs, n_seqs, backend, err);
    if (rc)
        return rc;
    search_ctx c = {.g = g, .seqs = seqs, .n_seqs = n_seqs, .backend = *backend};
    if (opt)
        c.opt = *opt;
    fill_defaults(&c.opt);
    c.t0 = c.opt.clock(c.opt.clock_ud);
    c.cache = c.opt.cache;
    if (!c.cache && (rc = search_cache_open("memory", NULL, &c.cache, err)) != STOF_OK)
        return rc;
    c.states = err_calloc((size_t)n_seqs, sizeof *c.states, err);
    rc = c.states ? run_stages(&c, err) : STOF_ERR_NOMEM;
    c.stage = SEARCH_STAGE_DONE;
    c.stats.seconds = c.opt.clock(c.opt.clock_ud) - c.t0;
    if (!rc)
        rc = build_result(&c, out, err);
    if (!rc) {
        out->stats = c.stats;
        search_report(&c);
    }
    for (int q = 0; c.states && q < n_seqs; q++)
        search_state_free(&c.states[q]);
    free(c.states);
    free(c.prepared);
    if (c.cache != c.opt.cache)
        search_cache_free(c.cache);
    if (rc)
        search_result_free(out);
    return rc;
}
