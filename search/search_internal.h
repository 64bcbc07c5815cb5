/* Shared by the search/ sources only: the state of one search run and the
 * segments it tunes. */
#ifndef STOF_SEARCH_INTERNAL_H
#define STOF_SEARCH_INTERNAL_H

#include "search/search.h"

typedef struct search_state search_state;

/* One candidate kernel of a segment: a template and a setting of it. */
typedef struct search_option {
    int tmpl;
    long setting; /* index for fusion_template_setting */
} search_option;

/* A segment of a scheme with everything the search knows about it. Its
 * options (the feasible settings of every template that matches) are
 * shuffled once, by the seed and the segment's signature, and sampled in
 * that order without replacement: the first K are stage 1's sample, stage 2
 * continues from there. The same segment met twice gets the same order, so
 * its second visit costs only cache hits. */
typedef struct search_seg {
    int first, last;           /* positions in the sequence */
    fusion_match match;
    search_option *order;
    int n_order, cursor;       /* cursor: the next option to sample */
    double best_ms;            /* INFINITY until a setting ran */
    int best;                  /* index into order; -1 none */
} search_seg;

typedef struct search_ctx {
    const graph *g;
    const search_sequence *seqs;
    int n_seqs;
    search_backend backend;
    search_options opt;        /* defaults filled in */
    search_cache *cache;
    double t0;
    search_stats stats;
    search_stage stage;
    int out_of_budget;         /* the budget or the time limit is spent */
    int past_limit;            /* finishing the initial schemes after the time limit:
                                  measuring and preparing go on regardless */
    struct search_state *states; /* one per sequence, for progress reports */
    /* the settings of the backend's last prepare call (option_key) */
    uint64_t *prepared;
    int n_prepared;
} search_ctx;

/* ---- segment.c ------------------------------------------------------------------ */

/* The graph indices of sequence q's first occurrence, ops[0..n-1]. */
void search_seq_ops(const search_ctx *c, int q, int *ops);

/* Matches positions first..last of sequence q and builds the shuffled
 * option list. STOF_ERR_INVALID when the span is not a valid segment. */
int search_seg_new(search_ctx *c, int q, int first, int last, search_seg **out,
                   stof_error *err);
void search_seg_free(search_seg *s);

/* Samples options until `until` of them have been tried (or none is left,
 * or the budget runs out), updating best_ms. */
int search_seg_sample_to(search_ctx *c, int q, search_seg *s, int until, stof_error *err);

/* Moves the backend's default setting of s (search_backend.default_setting)
 * to s's cursor, to be sampled next; nothing moves when the backend has
 * none or it is not among the options left. */
void search_seg_default_next(search_ctx *c, int q, search_seg *s);

/* ---- preparing (segment.c) ------------------------------------------------------- */

/* A segment whose options from `from` up to `until` (exclusive) the search
 * expects to sample; from is its cursor, or beyond it for a guess at what
 * comes after the settings it samples now. */
typedef struct search_prep {
    int q;
    const search_seg *s;
    int from, until;
} search_prep;

/* Most settings one prepare call names. */
#define SEARCH_PREPARE_MAX 512

/* Hands the backend's prepare the uncached settings of items, in order (at
 * most SEARCH_PREPARE_MAX and what the budget still allows), unless every
 * one of them was in its last call. No-op without a prepare. */
int search_prepare(search_ctx *c, const search_prep *items, int n, stof_error *err);

/* Whether some setting of some matching template passes its check. */
int search_match_feasible(const fusion_match *m, int smem_limit);

/* 1 when the budget or the time limit forbids another measurement. */
int search_exhausted(search_ctx *c);
void search_report(search_ctx *c);
/* One occurrence of st: the sum of its segments' best times. */
double search_state_ms(const search_state *st);
/* The forward latency of the states so far: each sequence's best times
 * times its occurrences. */
double search_total_ms(const search_ctx *c);

/* ---- expand.c / sample.c ------------------------------------------------------------ */

/* The state of one sequence class: its scheme and its segments in order. */
struct search_state {
    fusion_scheme scheme;
    int n_segs;
    search_seg *segs[FUSION_MAX_OPS];
};

/* The state of scheme s: its segments, none sampled yet. */
int search_state_build(search_ctx *c, int q, const fusion_scheme *s, search_state *st,
                       stof_error *err);
/* Samples every segment of st K times (after preparing them together). */
int search_state_sample(search_ctx *c, int q, search_state *st, stof_error *err);
/* The prepare items of st's segments up to K samples each, appended at
 * items[*n]. */
void search_state_prep(const search_ctx *c, int q, const search_state *st, search_prep *items,
                       int *n);
void search_state_free(search_state *st);

int search_expand(search_ctx *c, int q, search_state *st, stof_error *err);
int search_sample(search_ctx *c, search_state *states, stof_error *err);

#endif
