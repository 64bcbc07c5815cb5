/* Stage 1 (paper §4.4): fusion expansion by depth-first search.
 *
 * From the current scheme the moves are generated in rule order:
 *   compete  a lone op both neighbours could take goes first to the one the
 *            rule prefers (compete_rank), then to the other;
 *   seize    a segment with a CI op takes the nearest op of an MI-only
 *            neighbour of two or more ops;
 *   expand   two neighbouring segments merge, the others untouched;
 *   split    a segment with one CI op and ops after it splits after the CI
 *            op or after any of those ops (not a rule of the paper: the
 *            initial scheme fuses every GEMM with its epilogue, and
 *            without this move a faster unfused pair, say a library GEMM
 *            with its bias and an erf GELU on its own, is never measured).
 * The search descends along the first move that pays: each candidate must be
 * a valid scheme never tried before; its changed segments are sampled K
 * times each (the segments it replaces already were) and it is kept when the
 * best times of the new segments sum below those of the old ones. A move
 * that does not pay is rolled back, restoring the scheme bit for bit, and
 * the next sibling is tried. The stage ends when no move pays, or when the
 * budget runs out in the middle of a candidate (which then does not count).
 * Every scheme tried is remembered, so no scheme is measured twice even when
 * two paths of moves reach it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "ops/ops.h"
#include "search/search_internal.h"

/* ---- the state of one sequence ---------------------------------------------------- */

static int state_samples(const search_ctx *c) {
    return c->opt.samples_per_candidate;
}

int search_state_build(search_ctx *c, int q, const fusion_scheme *s, search_state *st,
                       stof_error *err) {
    memset(st, 0, sizeof *st);
    st->scheme = *s;
    fusion_segment spans[FUSION_MAX_OPS];
    int n = fusion_scheme_segments(s, spans, FUSION_MAX_OPS);
    for (int k = 0; k < n; k++) {
        int rc = search_seg_new(c, q, spans[k].first, spans[k].last, &st->segs[k], err);
        if (rc) {
            search_state_free(st);
            return rc;
        }
        st->n_segs++;
    }
    return STOF_OK;
}

void search_state_prep(const search_ctx *c, int q, const search_state *st, search_prep *items,
                       int *n) {
    for (int k = 0; k < st->n_segs; k++)
        items[(*n)++] = (search_prep){q, st->segs[k], st->segs[k]->cursor, state_samples(c)};
}

int search_state_sample(search_ctx *c, int q, search_state *st, stof_error *err) {
    search_prep items[FUSION_MAX_OPS];
    int n = 0;
    search_state_prep(c, q, st, items, &n);
    int rc = search_prepare(c, items, n, err);
    for (int k = 0; !rc && k < st->n_segs; k++)
        rc = search_seg_sample_to(c, q, st->segs[k], state_samples(c), err);
    return rc;
}

void search_state_free(search_state *st) {
    for (int k = 0; k < st->n_segs; k++)
        search_seg_free(st->segs[k]);
    st->n_segs = 0;
}

/* ---- moves -------------------------------------------------------------------------- */

/* A move as an operation on the scheme: merge at `at`, or move the boundary
 * at `at` to `to`. */
typedef struct stage_move {
    search_move_kind kind;
    int merge;
    int at, to;
} stage_move;

typedef struct move_list {
    int n;
    stage_move m[6 * FUSION_MAX_OPS]; /* compete, seize: 2 an op at most; expand, split: 1 */
} move_list;

static void add_move(move_list *l, search_move_kind kind, int merge, int at, int to) {
    if (l->n < (int)(sizeof l->m / sizeof l->m[0]))
        l->m[l->n++] = (stage_move){kind, merge, at, to};
}

static int seg_len(const search_seg *s) {
    return s->last - s->first + 1;
}

/* Positions first..last form a valid segment. */
static int span_valid(const search_ctx *c, int q, int first, int last) {
    int ops[FUSION_MAX_OPS];
    fusion_match m;
    search_seq_ops(c, q, ops);
    return fusion_match_segment(c->g, ops + first, last - first + 1, &m, NULL) == STOF_OK;
}

/* The compete rule: the segment with only one CI op extends first (it has an
 * epilogue to offer); then an MI-only one; a segment that already carries
 * two GEMMs extends last, its tiles being the most constrained. Equal ranks
 * go left, in graph order. */
static int compete_rank(const search_seg *s) {
    return s->match.n_ci == 1 ? 0 : s->match.n_ci == 0 ? 1 : 2;
}

static void gen_compete(const search_ctx *c, int q, const search_state *st, move_list *l) {
    for (int j = 1; j + 1 < st->n_segs; j++) {
        const search_seg *left = st->segs[j - 1], *lone = st->segs[j], *right = st->segs[j + 1];
        if (seg_len(lone) != 1 || !span_valid(c, q, left->first, lone->last) ||
            !span_valid(c, q, lone->first, right->last))
            continue;
        /* Merging at lone->first joins it to the left; at right->first, to the right. */
        int left_first = compete_rank(left) <= compete_rank(right);
        add_move(l, SEARCH_MOVE_COMPETE, 1, left_first ? lone->first : right->first, 0);
        add_move(l, SEARCH_MOVE_COMPETE, 1, left_first ? right->first : lone->first, 0);
    }
}

static void gen_seize(const search_state *st, move_list *l) {
    for (int j = 0; j + 1 < st->n_segs; j++) {
        const search_seg *a = st->segs[j], *b = st->segs[j + 1];
        if (a->match.n_ci >= 1 && b->match.n_ci == 0 && seg_len(b) >= 2)
            add_move(l, SEARCH_MOVE_SEIZE, 0, b->first, b->first + 1);
        if (b->match.n_ci >= 1 && a->match.n_ci == 0 && seg_len(a) >= 2)
            add_move(l, SEARCH_MOVE_SEIZE, 0, b->first, b->first - 1);
    }
}

static void gen_expand(const search_state *st, move_list *l) {
    for (int j = 1; j < st->n_segs; j++)
        add_move(l, SEARCH_MOVE_EXPAND, 1, st->segs[j]->first, 0);
}

/* The positions of a segment's ops relative to its one CI op: a new
 * boundary anywhere after it. */
static void gen_split(const search_ctx *c, int q, const search_state *st, move_list *l) {
    for (int j = 0; j < st->n_segs; j++) {
        const search_seg *s = st->segs[j];
        if (s->match.n_ci != 1 || seg_len(s) < 2)
            continue;
        int ci = s->first;
        while (ci < s->last && op_describe(c->g->ops[c->seqs[q].firsts[0] + ci].kind)->cls !=
                                   OP_CLASS_CI)
            ci++;
        for (int at = ci + 1; at <= s->last; at++)
            if (span_valid(c, q, s->first, at - 1) && span_valid(c, q, at, s->last))
                add_move(l, SEARCH_MOVE_SPLIT, 0, at, -1);
    }
}

static void gen_moves(const search_ctx *c, int q, const search_state *st, move_list *l) {
    l->n = 0;
    gen_compete(c, q, st, l);
    gen_seize(st, l);
    gen_expand(st, l);
    gen_split(c, q, st, l);
}

static int apply_move(fusion_scheme *s, const stage_move *m) {
    if (m->kind == SEARCH_MOVE_SPLIT)
        return fusion_scheme_split(s, m->at, NULL);
    return m->merge ? fusion_scheme_merge(s, m->at, NULL)
                    : fusion_scheme_move_boundary(s, m->at, m->to, NULL);
}

/* ---- the schemes tried -------------------------------------------------------------- */

typedef struct tried_set {
    fusion_scheme *s; /* canonical forms */
    int n, cap;
} tried_set;

static int tried_has(const tried_set *t, const fusion_scheme *s) {
    fusion_scheme canon = *s;
    fusion_scheme_canonical(&canon);
    for (int i = 0; i < t->n; i++)
        if (fusion_scheme_equal(&t->s[i], &canon))
            return 1;
    return 0;
}

/* 1 when s was tried before; else records it and returns 0. */
static int tried_check_add(tried_set *t, const fusion_scheme *s, stof_error *err, int *rc) {
    if (tried_has(t, s))
        return 1;
    fusion_scheme canon = *s;
    fusion_scheme_canonical(&canon);
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 64;
        fusion_scheme *grown = err_realloc(t->s, sizeof *grown * (size_t)cap, err);
        if (!grown) {
            *rc = STOF_ERR_NOMEM;
            return 1;
        }
        t->s = grown;
        t->cap = cap;
    }
    t->s[t->n++] = canon;
    return 0;
}

/* ---- one candidate ------------------------------------------------------------------- */

/* The candidate's segments: those of the state it keeps, and new ones. */
typedef struct candidate {
    int n_segs;
    search_seg *segs[FUSION_MAX_OPS];
    unsigned char is_new[FUSION_MAX_OPS];
} candidate;

static search_seg *state_find(const search_state *st, int first, int last) {
    for (int k = 0; k < st->n_segs; k++)
        if (st->segs[k]->first == first && st->segs[k]->last == last)
            return st->segs[k];
    return NULL;
}

static void candidate_drop_new(candidate *cd) {
    for (int k = 0; k < cd->n_segs; k++)
        if (cd->is_new[k])
            search_seg_free(cd->segs[k]);
    cd->n_segs = 0;
}

/* Builds the candidate of scheme s and samples its new segments K times
 * (prepared together). *complete is 0 when the budget ran out before they
 * all were. */
static int candidate_build(search_ctx *c, int q, const search_state *st, const fusion_scheme *s,
                           candidate *cd, int *complete, stof_error *err) {
    fusion_segment spans[FUSION_MAX_OPS];
    search_prep items[FUSION_MAX_OPS];
    int n = fusion_scheme_segments(s, spans, FUSION_MAX_OPS), K = state_samples(c), n_items = 0;
    int rc = STOF_OK;
    cd->n_segs = 0;
    *complete = 1;
    for (int k = 0; !rc && k < n; k++) {
        search_seg *old = state_find(st, spans[k].first, spans[k].last);
        cd->is_new[k] = old == NULL;
        cd->segs[k] = old;
        if (!old && (rc = search_seg_new(c, q, spans[k].first, spans[k].last, &cd->segs[k],
                                         err)) == STOF_OK)
            items[n_items++] = (search_prep){q, cd->segs[k], cd->segs[k]->cursor, K};
        if (!rc)
            cd->n_segs++;
    }
    if (!rc)
        rc = search_prepare(c, items, n_items, err);
    for (int k = 0; !rc && k < cd->n_segs; k++) {
        if (cd->is_new[k])
            rc = search_seg_sample_to(c, q, cd->segs[k], K, err);
        int want = K < cd->segs[k]->n_order ? K : cd->segs[k]->n_order;
        *complete &= cd->segs[k]->cursor >= want;
    }
    if (rc)
        candidate_drop_new(cd);
    return rc;
}

static int candidate_holds(const candidate *cd, const search_seg *s) {
    for (int j = 0; j < cd->n_segs; j++)
        if (cd->segs[j] == s)
            return 1;
    return 0;
}

/* Best times of the segments that change: the state's that the candidate
 * drops, and the candidate's new ones. */
static void candidate_compare(const search_state *st, const candidate *cd, double *before,
                              double *after) {
    *before = *after = 0;
    for (int k = 0; k < cd->n_segs; k++)
        if (cd->is_new[k])
            *after += cd->segs[k]->best_ms;
    for (int k = 0; k < st->n_segs; k++)
        if (!candidate_holds(cd, st->segs[k]))
            *before += st->segs[k]->best_ms;
}

/* The candidate becomes the state: the dropped segments are freed. */
static void candidate_commit(search_state *st, candidate *cd, const fusion_scheme *s) {
    for (int k = 0; k < st->n_segs; k++)
        if (!candidate_holds(cd, st->segs[k]))
            search_seg_free(st->segs[k]);
    st->n_segs = cd->n_segs;
    memcpy(st->segs, cd->segs, sizeof *st->segs * (size_t)cd->n_segs);
    st->scheme = *s;
    cd->n_segs = 0;
}

static void report_move(search_ctx *c, int q, const stage_move *m, const fusion_scheme *before,
                        const fusion_scheme *after, double before_ms, double after_ms,
                        int kept) {
    if (c->opt.on_move) {
        search_move mv = {q, m->kind, *before, *after, before_ms, after_ms, kept};
        c->opt.on_move(c->opt.cb_ud, &mv);
    }
    search_report(c);
}

/* Tries one move on st. *kept is set when it paid and now is the state;
 * *stop when the budget ran out. */
static int try_move(search_ctx *c, int q, search_state *st, const stage_move *m,
                    tried_set *tried, candidate *cd, int *kept, int *stop, stof_error *err) {
    int ops[FUSION_MAX_OPS], rc = STOF_OK;
    *kept = 0;
    /* The move is made on a copy: the state's scheme stays as it was, bit
     * for bit, unless the move is kept. */
    fusion_scheme after = st->scheme;
    if (apply_move(&after, m) != STOF_OK || tried_check_add(tried, &after, err, &rc))
        return rc;
    search_seq_ops(c, q, ops);
    if (fusion_scheme_validate(c->g, ops, c->seqs[q].n, &after, NULL, NULL) != STOF_OK)
        return STOF_OK;
    int complete;
    rc = candidate_build(c, q, st, &after, cd, &complete, err);
    if (rc)
        return rc;
    if (!complete) {
        candidate_drop_new(cd);
        *stop = 1;
        return STOF_OK;
    }
    double before_ms, after_ms;
    candidate_compare(st, cd, &before_ms, &after_ms);
    c->stats.schemes_tried++;
    fusion_scheme before = st->scheme;
    *kept = after_ms < before_ms;
    if (*kept) {
        c->stats.schemes_kept++;
        candidate_commit(st, cd, &after);
    } else {
        candidate_drop_new(cd);
    }
    report_move(c, q, m, &before, &after, before_ms, after_ms, *kept);
    return STOF_OK;
}

/* ---- working ahead ------------------------------------------------------------------ */

/* The new segments of the moves of one level, each once. */
typedef struct level_segs {
    search_seg **segs;
    int n, cap;
} level_segs;

static void level_free(level_segs *l) {
    for (int i = 0; i < l->n; i++)
        search_seg_free(l->segs[i]);
    free(l->segs);
}

static int level_has(const level_segs *l, int first, int last) {
    for (int i = 0; i < l->n; i++)
        if (l->segs[i]->first == first && l->segs[i]->last == last)
            return 1;
    return 0;
}

/* The segments move m would add to st (valid and untried moves only). */
static int level_add_move(search_ctx *c, int q, const search_state *st, const stage_move *m,
                          const tried_set *tried, level_segs *l, stof_error *err) {
    int ops[FUSION_MAX_OPS];
    fusion_scheme after = st->scheme;
    search_seq_ops(c, q, ops);
    if (apply_move(&after, m) != STOF_OK || tried_has(tried, &after) ||
        fusion_scheme_validate(c->g, ops, c->seqs[q].n, &after, NULL, NULL) != STOF_OK)
        return STOF_OK;
    fusion_segment spans[FUSION_MAX_OPS];
    int n = fusion_scheme_segments(&after, spans, FUSION_MAX_OPS);
    for (int k = 0; k < n; k++) {
        if (state_find(st, spans[k].first, spans[k].last) ||
            level_has(l, spans[k].first, spans[k].last))
            continue;
        if (l->n == l->cap) {
            int cap = l->cap ? 2 * l->cap : 16;
            search_seg **grown = err_realloc(l->segs, sizeof *grown * (size_t)cap, err);
            if (!grown)
                return STOF_ERR_NOMEM;
            l->segs = grown;
            l->cap = cap;
        }
        int rc = search_seg_new(c, q, spans[k].first, spans[k].last, &l->segs[l->n], err);
        if (rc)
            return rc;
        l->n++;
    }
    return STOF_OK;
}

/* Before the moves of one level are tried, in order: the K first settings
 * of every new segment of every move, so that the backend works on the
 * next moves' kernels while one move is measured. A move that is kept
 * starts a new level, whose call supersedes this one. */
static int prepare_level(search_ctx *c, int q, const search_state *st, const move_list *moves,
                         const tried_set *tried, stof_error *err) {
    if (!c->backend.prepare)
        return STOF_OK;
    level_segs l = {NULL, 0, 0};
    int rc = STOF_OK;
    for (int i = 0; !rc && i < moves->n; i++)
        rc = level_add_move(c, q, st, &moves->m[i], tried, &l, err);
    search_prep *items = rc || l.n == 0 ? NULL : err_malloc(sizeof *items * (size_t)l.n, err);
    if (!rc && l.n > 0 && !items)
        rc = STOF_ERR_NOMEM;
    for (int i = 0; !rc && i < l.n; i++)
        items[i] = (search_prep){q, l.segs[i], l.segs[i]->cursor, state_samples(c)};
    if (!rc && l.n > 0)
        rc = search_prepare(c, items, l.n, err);
    free(items);
    level_free(&l);
    return rc;
}

int search_expand(search_ctx *c, int q, search_state *st, stof_error *err) {
    tried_set tried = {0};
    move_list *moves = err_malloc(sizeof *moves, err);
    candidate *cd = err_malloc(sizeof *cd, err);
    int rc = moves && cd ? STOF_OK : STOF_ERR_NOMEM, stop = 0;
    if (!rc)
        tried_check_add(&tried, &st->scheme, err, &rc);
    for (int progressed = 1; !rc && progressed && !stop;) {
        progressed = 0;
        gen_moves(c, q, st, moves);
        if (!search_exhausted(c))
            rc = prepare_level(c, q, st, moves, &tried, err);
        for (int i = 0; i < moves->n && !rc && !progressed && !stop; i++) {
            if (search_exhausted(c))
                stop = 1;
            else
                rc = try_move(c, q, st, &moves->m[i], &tried, cd, &progressed, &stop, err);
        }
    }
    free(tried.s);
    free(moves);
    free(cd);
    return rc;
}
