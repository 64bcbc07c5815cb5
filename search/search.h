/* The two-stage search of fusion schemes and kernel parameters (paper §4.4).
 *
 *   initial scheme   rules over network sizes, op classes and dependencies
 *                    (init.c, search_initial_scheme)
 *   stage 1          DFS over expand / seize / compete / split moves; a move is kept
 *                    only when the best of K sampled settings of the changed
 *                    segments beats the best of K of the segments it replaces,
 *                    else rolled back (expand.c)
 *   stage 2          reward-based sampling of the parameters of the chosen
 *                    scheme: equal shares first, then more samples to the
 *                    segments whose best time improved most (sample.c)
 *
 * Every measurement goes through the backend and the cache (measure.h), so
 * the same code tunes on a GPU and under a synthetic cost model in tests,
 * and a setting is never measured twice. Before measuring, the search tells
 * a backend that wants it (search_backend.prepare) what it will measure
 * next, as wide as it can see: the initial states together, every move of a
 * stage-1 level, a stage-2 round and a guess at the next one; a GPU backend
 * compiles those kernels in parallel meanwhile. This changes neither what
 * is measured nor in which order. The search prints nothing; it reports
 * through the progress and move callbacks. */
#ifndef STOF_SEARCH_SEARCH_H
#define STOF_SEARCH_SEARCH_H

#include <stdint.h>

#include "fusion/scheme.h"
#include "search/measure.h"

/* ---- sequences ---------------------------------------------------------------- */

/* One sequence class: a layer and the layers identical to it, or a run of
 * ops outside layers. Only the first occurrence is measured; the latency
 * counts every occurrence. */
typedef struct search_sequence {
    int layer;   /* the representative layer, -1 for a run outside layers */
    int n;       /* ops */
    int count;   /* occurrences */
    int *firsts; /* graph index of each occurrence's first op, in graph order */
} search_sequence;

/* The classes of g (fusion_sequences) in graph order of their first
 * occurrence. */
int search_sequences_from_graph(const graph *g, search_sequence **out, int *n_out,
                                stof_error *err);
void search_sequences_free(search_sequence *seqs, int n);

/* ---- options --------------------------------------------------------------------- */

typedef enum search_stage {
    SEARCH_STAGE_INITIAL = 0,
    SEARCH_STAGE_EXPAND,
    SEARCH_STAGE_SAMPLE,
    SEARCH_STAGE_DONE
} search_stage;

const char *search_stage_name(search_stage s);

typedef struct search_progress {
    search_stage stage;
    long measured;     /* backend calls so far */
    long cache_hits;
    double best_ms;    /* forward latency of the best choice so far */
} search_progress;

typedef enum search_move_kind {
    SEARCH_MOVE_EXPAND = 0, /* merge two neighbouring segments */
    SEARCH_MOVE_SEIZE,      /* a segment with a CI op takes an op of an MI-only neighbour */
    SEARCH_MOVE_COMPETE,    /* a lone op goes to the neighbour the rule prefers */
    SEARCH_MOVE_SPLIT       /* a segment with one CI op parts from ops after it */
} search_move_kind;

/* One stage-1 candidate, as tried. */
typedef struct search_move {
    int seq;                 /* index of the sequence class */
    search_move_kind kind;
    fusion_scheme before, after;
    double before_ms, after_ms; /* best of K of the changed segments, each side */
    int kept;
} search_move;

/* The rule-based initial scheme fuses CI+CI chains only up to this many
 * tokens (rows of the GEMMs): paper §3 finds GEMM+GEMM fusion pays at small
 * batch x sequence, where one GEMM alone cannot fill the GPU and the
 * intermediate's round trip through memory dominates. */
#define SEARCH_CHAIN_MAX_TOKENS 512
#define SEARCH_DEFAULT_K 4
#define SEARCH_DEFAULT_PATIENCE 3
/* A stage-2 round counts as a gain when it saves at least this fraction of
 * the forward latency: below it, a "gain" is as likely a lucky measurement
 * (timing noise of microsecond kernels is of that order) as a better
 * setting, and chasing it kept tuning of small shapes going for 20 rounds. */
#define SEARCH_DEFAULT_MIN_GAIN 0.005
/* Shared memory a block may use when settings are checked (H100 opt-in). */
#define SEARCH_DEFAULT_SMEM 232448

typedef struct search_options {
    long budget;               /* most backend measurements; 0: no limit */
    double time_limit_s;       /* wall clock from the start; 0: no limit */
    uint64_t seed;
    int samples_per_candidate; /* K of stage 1; 0: SEARCH_DEFAULT_K */
    int round_samples;         /* stage-2 measurements a round; 0: 2 per segment */
    int patience;              /* stage 2 stops after this many rounds without gain;
                                  0: SEARCH_DEFAULT_PATIENCE */
    double min_gain;           /* the least fraction of the forward latency a round must
                                  save to count as a gain; 0: SEARCH_DEFAULT_MIN_GAIN;
                                  < 0: any saving counts */
    int chain_max_tokens;      /* 0: SEARCH_CHAIN_MAX_TOKENS; < 0: never fuse chains */
    int smem_limit;            /* bytes; 0: SEARCH_DEFAULT_SMEM */
    int skip_expand;           /* 1: keep the initial scheme (stage 2 only) */
    /* One scheme per sequence to start stage 1 from instead of the rules'
     * (a plan to refine, or a test's start); each must be valid. */
    const fusion_scheme *initial;
    search_cache *cache;       /* NULL: a memory cache for this run */
    /* The wall clock, in seconds (NULL: util_now). Tests pass a fake one. */
    double (*clock)(void *ud);
    void *clock_ud;
    /* Called at each stage change, after each stage-1 candidate and after
     * each stage-2 round. May be NULL. */
    void (*progress)(void *ud, const search_progress *p);
    void (*on_move)(void *ud, const search_move *m);
    void *cb_ud;
} search_options;

/* ---- results ---------------------------------------------------------------------- */

typedef struct search_seg_result {
    int first, last; /* positions in the sequence */
    fusion_template_id tmpl;
    int n_values;
    int values[FUSION_MAX_PARAMS];
    double ms;
} search_seg_result;

typedef struct search_seq_result {
    fusion_scheme scheme;
    int n_segs;
    search_seg_result *segs;
    double ms;               /* one occurrence: the sum over its segments */
} search_seq_result;

typedef struct search_stats {
    long measured;       /* backend calls */
    long measured_stage1, measured_stage2;
    long cache_hits;
    long schemes_tried;  /* initial schemes and valid stage-1 candidates */
    long schemes_kept;
    int rounds;          /* stage 2 */
    long prepare_calls;  /* the backend's prepare calls */
    long prepared;       /* settings named in them */
    int stopped_by_budget, stopped_by_time;
    /* settings measured after the time limit ran out to give every segment
     * of the initial schemes one that runs: > 0 when the limit was too
     * short to search (the result is the initial schemes, unsearched) */
    long measured_past_limit;
    double seconds;
} search_stats;

typedef struct search_result {
    int n_seqs;
    search_seq_result *seqs; /* in the order of the sequences given */
    double total_ms;         /* sum over sequences of ms x count */
    search_stats stats;
} search_result;

void search_result_free(search_result *r);
/* Whether a and b choose the same schemes, templates and values (their times aside). */
int search_result_same_choices(const search_result *a, const search_result *b);

/* ---- running ------------------------------------------------------------------------ */

/* initial -> stage 1 -> stage 2 over every sequence. On failure *out holds
 * nothing to free. When the time limit runs out before every segment of the
 * initial schemes has a measured setting that runs, each segment left is
 * measured anyway, past the limit (the backend's default setting first,
 * then the next of its order until one runs), and the result is the
 * initial schemes (stats.measured_past_limit > 0). A budget that runs out
 * first is STOF_ERR_INVALID: it counts measurements, and these would
 * exceed it. */
int search_run(const graph *g, const search_sequence *seqs, int n_seqs,
               const search_backend *backend, const search_options *opt, search_result *out,
               stof_error *err);

/* The rule-based initial scheme of ops[0..n-1] (graph indices); always valid
 * (the all-unfused scheme when nothing else is). */
typedef struct search_rules {
    int chain_max_tokens; /* as in search_options (0: the default) */
    int smem_limit;
} search_rules;

int search_initial_scheme(const graph *g, const int *ops, int n, const search_rules *rules,
                          fusion_scheme *out, stof_error *err);

/* Stage-2 shares: splits total samples over n segments. reward[i] >= 0 is
 * the time segment i saved last round, room[i] how many unmeasured settings
 * it has left, round the round number (rotates who gets remainders of an
 * equal split). With no reward an equal split; else half equal and half in
 * proportion to reward. No share exceeds its room. */
void search_allocate(const double *reward, const int *room, int n, int total, int round,
                     int *share);

#endif
