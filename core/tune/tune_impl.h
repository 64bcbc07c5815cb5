/* Inside the tuner (tune_backend.h): the backend's state and what its
 * files share. Not for other modules.
 *
 *   tune_check.c      tolerances, output checks, the values a lone segment
 *                     is fed (and their keys in the memo of values);
 *   tune_reference.c  the CPU reference of a segment, kept per span;
 *   tune_scratch.c    scratch tensors on the device, several copies, kept
 *                     for recent spans;
 *   tune_backend.c    the search's backend: one setting measured through
 *                     the executor's segment bench (exec_bench);
 *   tune_ahead.c      work ahead of the measurements on the pool;
 *   tune_refine.c     after the search: defaults and the selector's
 *                     choices timed against what it found; another
 *                     result's segments timed;
 *   tune_gpu.c        tune_gpu: search, refine, end to end;
 *   tune_offline.c    the initial schemes, plans without a GPU. */
#ifndef STOF_CORE_TUNE_IMPL_H
#define STOF_CORE_TUNE_IMPL_H

#include <stdint.h>

#include "core/base/memo.h"
#include "core/base/task_pool.h"
#include "core/gpu/gpu_timer.h"
#include "core/tune/tune_backend.h"

/* ---- values (tune_check.c) ------------------------------------------------------------------ */

/* What a tensor's values are made from (tune_tensor_values): a tensor
 * changed in the graph has other values, under another key. */
uint64_t tune_tensor_identity(const graph_tensor *x);
/* The values of tensor t of copy c (seed + c) in a memo of values. */
uint64_t tune_value_key(const graph *g, int t, int copy);

typedef struct value_make {
    const graph *g;
    int t;
    uint64_t seed; /* the copy's */
} value_make;

/* memo_compute of a value_make: the tensor's floats. */
int tune_make_values(void *arg, void **value, size_t *bytes, stof_error *err);

/* ---- references (tune_reference.c) ---------------------------------------------------------- */

/* Where a reference gets the values of its inputs, and threads for the
 * whole-output ops. */
typedef struct ref_source {
    uint64_t seed;
    memo *values;    /* NULL: made for this reference alone */
    task_pool *pool; /* NULL: attention on the caller's thread */
} ref_source;

/* Whether tensor t is made by one of ops first..last. */
int tune_produced_inside(const graph *g, int t, int first, int last);

/* got: the reference's rows of the output (or of the pre-norm values), as
 * it holds them. */
int tune_reference_compare(const tune_reference *ref, const float *got, int pre_norm,
                           stof_dtype dtype, exec_diff *d, stof_error *err);

/* The key of a span's reference in the memo of references. */
uint64_t tune_span_key(int first, int last, int pre_norm);
void tune_reference_value_free(void *value);

/* What computing one span's reference needs (memo_compute's argument). */
typedef struct reference_make {
    const graph *g;
    int first, last, pre_norm;
    ref_source src;
} reference_make;

int tune_make_reference(void *arg, void **value, size_t *bytes, stof_error *err);

/* ---- the backend ---------------------------------------------------------------------------- */

#define TUNE_MAX_REPS 64
/* Values converted to or from the device's types in slices of this many. */
#define TUNE_STAGE_SLICE ((size_t)1 << 20)

/* The scratch tensors of one span, n_copies times over. */
typedef struct tune_scratch {
    int first, last, pre_norm;
    uint64_t inputs;           /* the identities of the tensors it was filled from */
    int n_copies;
    size_t bytes;              /* every copy together */
    CUdeviceptr mem;
    CUdeviceptr *ptr;          /* [n_copies][g->n_tensors]: 0 for tensors not there */
    uint64_t used;             /* the tick of its last use */
} tune_scratch;

struct tune_backend {
    exec_ctx *ctx;
    const cuda_driver *drv;
    tune_backend_options opt;
    CUstream stream;
    gpu_timer timer;
    task_pool *pool;           /* works ahead of the measurements */
    mha_device_limits lim;     /* of the kernel plans */
    /* kept between settings, for graph g */
    const graph *g;
    memo *values;              /* float values of (tensor, copy) */
    memo *refs;                /* the tune_reference of a span */
    long refs_done;            /* references computed by memos freed since */
    double refs_done_s;
    tune_scratch *scratch;     /* spans on the device, most recent use last touched */
    int n_scratch, cap_scratch;
    int cur;                   /* the span being measured: index into scratch, -1 none */
    size_t scratch_bytes, scratch_keep;
    uint64_t tick;
    tune_backend_stats stats;
    int rejected_now;          /* the setting being measured gave a wrong output */
};

/* What is kept belongs to g: another graph starts afresh. */
int tune_use_graph(tune_backend *b, const graph *g, stof_error *err);

/* The executor's segment for a search segment and a setting. */
void tune_segment_of(const search_segment *seg, const int *values, exec_segment *s);

int tune_is_attention(fusion_template_id t);

/* The reference of segment s on b's values and pool, computed once (here,
 * or ahead on the pool); pinned: tune_reference_release it. */
reference_make tune_reference_make_of(const tune_backend *b, const graph *g,
                                      const exec_segment *s);
int tune_reference_of(tune_backend *b, const graph *g, const exec_segment *s,
                      const tune_reference **out, stof_error *err);
void tune_reference_release(tune_backend *b, const exec_segment *s);

/* ---- scratch tensors (tune_scratch.c) ------------------------------------------------------- */

/* The tensors of segment s (list, *n), one copy's bytes, the copies. */
typedef struct span_layout {
    int list[FUSION_MAX_OPS * GRAPH_MAX_INPUTS + 2];
    int n;
    size_t copy_bytes;
    int copies;
    uint64_t inputs; /* the identities of the tensors (tune_tensor_identity) */
} span_layout;

void tune_span_layout(const tune_backend *b, const graph *g, const exec_segment *s,
                      span_layout *l);
/* t is written by s (its result or stored pre-norm values). */
int tune_is_output_of(const exec_segment *s, int t);
/* The index of the scratch kept for s's span; -1 none. */
int tune_scratch_find(const tune_backend *b, const exec_segment *s);
/* The scratch of segment s becomes current: kept from before, or made
 * (anew when a tensor changed since). */
int tune_scratch_prepare(tune_backend *b, const graph *g, const exec_segment *s,
                         stof_error *err);
const tune_scratch *tune_scratch_current(const tune_backend *b);
/* Frees every span kept (the context current). */
void tune_scratch_drop_all(tune_backend *b);

/* ---- refining (tune_refine.c) --------------------------------------------------------------- */

/* After the search: every segment's defaults and the selector's choices
 * (its best n_attention) compete with what the search found in r, timed
 * through cache on b; res counts them. */
int tune_refine_result(tune_backend *b, search_cache *cache, const graph *g,
                       const search_sequence *seqs, int n_attention, search_result *r,
                       tune_outcome *res, stof_error *err);
/* Every segment of r timed with its own setting, through cache on b, and
 * r's sums made of them. STOF_ERR_UNSUPPORTED when a segment did not run
 * alone or gave a wrong output. */
int tune_time_result(tune_backend *b, search_cache *cache, const graph *g,
                     const search_sequence *seqs, search_result *r, tune_outcome *res,
                     stof_error *err);

#endif
