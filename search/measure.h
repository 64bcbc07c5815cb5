/* The search's one window onto the GPU: "measure this segment with these
 * parameter values", and the cache that makes sure no setting is measured
 * twice, within a run or across runs.
 *
 * The search never times anything itself. A backend (the GPU executor, or a
 * synthetic cost model in the tests) gets a search_segment and one value per
 * template parameter and answers with milliseconds. A backend that answers
 * STOF_ERR_UNSUPPORTED says "this setting cannot run here" (too many
 * registers, a launch failure): the search records it as never-fastest and
 * goes on; any other error stops the search.
 *
 * The cache keys a measurement by
 *   device name | segment signature | parameter values
 * where the signature (search_segment_signature) holds everything about the
 * segment that changes a kernel's time: the template, the op kinds, the
 * sizes, the epilogue flags, and for attention the mask's fingerprint. Two
 * identical layers, or the same segment met again by another scheme in stage
 * 1, share entries.
 *
 * On disk the cache is a text file, one measurement a line,
 *   DEVICE <TAB> SIGNATURE <TAB> V1,V2,... <TAB> MS
 * appended as measurements arrive (and flushed at once, so an interrupted
 * tuning keeps what it paid for). Lines of other devices are kept in the file
 * and ignored. A last line without its newline is an interrupted append and
 * is skipped; any other malformed line is STOF_ERR_FORMAT naming it. */
#ifndef STOF_SEARCH_MEASURE_H
#define STOF_SEARCH_MEASURE_H

#include <stddef.h>

#include "core/graph/graph.h"
#include "fusion/match.h"
#include "fusion/templates.h"

/* What a backend needs to build and time a segment's kernel. */
typedef struct search_segment {
    const graph *g;
    int seq_class;           /* index of the sequence (class) in the search */
    int first, last;         /* positions in the sequence, inclusive */
    int op_first, op_last;   /* graph indices of the same ops (sequences are contiguous) */
    fusion_template_id tmpl;
    const fusion_match *match; /* epilogues, n_ci, store_pre_norm */
    fusion_dims dims;
} search_segment;

/* A setting the search expects to measure: a segment and its values. */
typedef struct search_candidate {
    search_segment seg;           /* seg.match points into the search: valid during the call */
    int values[FUSION_MAX_PARAMS];
} search_candidate;

typedef struct search_backend {
    void *ud;
    /* values: one per parameter of seg->tmpl, in the template's order. */
    int (*measure)(void *ud, const search_segment *seg, const int *values, double *ms,
                   stof_error *err);
    /* Optional (NULL: none). The settings the search expects to measure
     * next, none of them in the cache, in the order it expects to measure
     * them; each call supersedes the ones before. The backend may get ready
     * for them (compile their kernels in the background). Every setting is
     * prepared before it is measured, but a prepared one may never be (the
     * search may take another path, or stop). An error stops the search: a
     * backend returns one only for what stops it (out of memory), never for
     * a setting it cannot build (measure says so). */
    int (*prepare)(void *ud, const search_candidate *c, int n, stof_error *err);
    /* Optional (NULL: none). The setting seg runs with when given none (the
     * executor's default): its template, one of seg->match's but not
     * necessarily seg->tmpl, and its values; STOF_OK when there is one.
     * When the time limit runs out before the initial scheme is measured,
     * the search measures this one first for each segment left. */
    int (*default_setting)(void *ud, const search_segment *seg, fusion_template_id *tmpl,
                           int *values);
    /* Optional (NULL: none). The setting seg->tmpl runs seg with when given
     * none (that template's default); STOF_OK when there is one. A new
     * segment measures each template's default first, before the random
     * draws of its order. */
    int (*template_default)(void *ud, const search_segment *seg, int *values);
} search_backend;

/* Longest signature and key text, terminating zero included. */
#define SEARCH_SIG_MAX 512
#define SEARCH_KEY_MAX (SEARCH_SIG_MAX + FUSION_MAX_PARAMS * 12)

/* The segment's signature (see above); returns the length needed, like
 * snprintf. The template is part of it: the same ops under two templates are
 * two different kernels. */
size_t search_segment_signature(const search_segment *seg, char *buf, size_t cap);

/* ---- the cache -------------------------------------------------------------------- */

typedef struct search_cache search_cache;

typedef struct search_cache_stats {
    long hits, misses;  /* lookups */
    long entries;       /* for this device, loaded and stored */
    long loaded;        /* of which came from the file */
    long skipped;       /* lines of the file that were not read: malformed (each is
                           lost, nothing else: the setting is measured again) */
    char skipped_first[320]; /* the first of them, "FILE:LINE: what is wrong" */
} search_cache_stats;

/* A cache for the named device. path NULL keeps it in memory only; else the
 * file is read (a missing file is an empty cache) and new entries appended.
 * A malformed line (of any device) is skipped and counted in the stats,
 * with the first one's reason, for the caller to report: one bad line
 * costs its measurement, never the run. */
int search_cache_open(const char *device, const char *path, search_cache **out,
                      stof_error *err);
void search_cache_free(search_cache *c);

/* 1 and *ms when (signature, values) was measured; counts a hit or a miss. */
int search_cache_lookup(search_cache *c, const char *signature, const int *values, int n_values,
                        double *ms);
/* 1 when (signature, values) was measured; counts nothing (for looking
 * ahead). */
int search_cache_contains(const search_cache *c, const char *signature, const int *values,
                          int n_values);
/* Records a measurement (INFINITY for a setting that cannot run) and appends
 * it to the file. Storing a key twice is STOF_ERR_INTERNAL: the search must
 * have looked it up first. */
int search_cache_store(search_cache *c, const char *signature, const int *values, int n_values,
                       double ms, stof_error *err);
search_cache_stats search_cache_get_stats(const search_cache *c);

#endif
