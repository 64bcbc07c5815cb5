/* The auto-tuner: the two-stage search (search/search.h) measuring on the
 * GPU, and the plans it makes.
 *
 *   tune backend   search_backend.measure for one segment and one setting:
 *                  the executor's segment bench (exec_bench) plans, binds
 *                  and launches the kernel on scratch tensors of the
 *                  segment's shapes (seeded random values, several copies
 *                  rotated when they fit in L2), checked once against the
 *                  CPU reference of the segment's ops, then timed by CUDA
 *                  events around a captured CUDA graph of back-to-back
 *                  launches (median of repeated runs). A wrong output is
 *                  STOF_ERR_UNSUPPORTED: the cache stores the setting as
 *                  infeasible, so a fast wrong kernel is never chosen.
 *                  search_backend.prepare works ahead on a thread pool
 *                  (core/base/task_pool.h): the kernels of the settings the
 *                  search will measure next are compiled into the NVRTC
 *                  caches, and their segments' input values and CPU
 *                  references computed, while the GPU measures; the
 *                  measurement itself (module loading, launches) stays on
 *                  the caller's thread and finds them ready, or waits for
 *                  the one still under way. References and input values
 *                  are kept per segment (memo.h), the scratch tensors of
 *                  recent segments stay on the device.
 *   tune_gpu       search, then every segment's executor default and (for
 *                  attention) the selector's best candidates timed too, then
 *                  the whole plan timed end to end against the all-unfused
 *                  scheme, checked against the CPU reference, made a plan.
 *   tune_offline   without a GPU: the initial scheme with default settings,
 *                  marked unmeasured, its kernels compiled for an arch into
 *                  the NVRTC cache.
 *
 * Its files and what they share: tune_impl.h.
 * Nothing here prints: progress goes through the search's callback. */
#ifndef STOF_CORE_TUNE_BACKEND_H
#define STOF_CORE_TUNE_BACKEND_H

#include <stdint.h>

#include "core/exec/exec.h"
#include "core/graph/script.h"
#include "core/gpu/nvrtc.h"
#include "core/plan/plan.h"
#include "search/search.h"

/* ---- checking a candidate (CPU) ---------------------------------------------------------- */

/* Relative error ||got - ref|| / ||ref|| a kernel's output may have. */
#define TUNE_TOL_F16 1e-2
#define TUNE_TOL_BF16 2e-2
double tune_tolerance(stof_dtype dtype);

/* STOF_OK when got has no NaN or infinity and is within dtype's tolerance
 * of ref; else STOF_ERR_UNSUPPORTED saying how it is wrong ("wrong output:
 * relative error 3.1e-01 (tolerance 1e-02)"). d (may be NULL) gets the
 * comparison. */
int tune_check_output(const float *got, const float *ref, int64_t n, stof_dtype dtype,
                      exec_diff *d, stof_error *err);

/* The values a lone segment is fed for seed: weights and inputs as the
 * executor's (weights_fill), activations uniform in [-1, 1], rounded to
 * the tensor's dtype. */
void tune_tensor_values(const graph_tensor *t, uint64_t seed, float *out);

/* Rows of a row-wise segment's output compared with the reference: all of
 * them up to this many, else this many spread over them
 * (tune_check_rows), so that the reference of a big GEMM costs a fraction
 * of it. */
#define TUNE_CHECK_ROWS 256
/* The same for a lone attention op's query rows (every key of a checked
 * row is computed: at 16 x 2048 tokens the whole reference took seconds of
 * every thread for each attention segment, and the checks ate the time
 * limit of a tune). */
#define TUNE_ATTENTION_CHECK_ROWS 1024

/* n of m rows (n <= m) into rows[], increasing: the first and the last, and
 * one in each of n equal windows between them, at an offset that walks
 * through the window (37 i mod its width), so that the rows checked take
 * every position within a GEMM tile or a mask block, not only its first. */
void tune_check_rows(int64_t m, int64_t n, int64_t *rows);

/* The CPU reference (ops/ops.h, fp32) of graph ops first..last run alone on
 * tune_tensor_values. A segment of row-wise ops (GEMM, bias, add,
 * activations, norms, softmax) is computed for the checked rows only, a
 * lone attention op for its checked query rows; anything else (embedding)
 * whole. */
typedef struct tune_reference {
    int first, last, store_pre_norm;
    int64_t n_rows;    /* rows computed */
    int64_t *rows;     /* their indices; NULL: every row */
    int64_t row_len;   /* of the output */
    float *out;        /* n_rows x row_len */
    float *pre_norm;   /* the closing norm's input, when store_pre_norm */
    double seconds;    /* wall time it took */
} tune_reference;

int tune_reference_compute(const graph *g, int first, int last, int store_pre_norm,
                           uint64_t seed, tune_reference *ref, stof_error *err);
void tune_reference_free(tune_reference *ref);

/* Compares a whole output (full_rows x row_len, as the GPU wrote it) with
 * the reference's rows: tune_check_output over the rows it holds. */
int tune_reference_check(const tune_reference *ref, const float *full, int pre_norm,
                         stof_dtype dtype, exec_diff *d, stof_error *err);

/* ---- the GPU backend ------------------------------------------------------------------------ */

#define TUNE_WARMUP 2      /* passes over the copies before timing */
#define TUNE_REPS 9        /* timed runs at most: the median counts */
#define TUNE_MIN_REPS 5    /* timed runs at least */
#define TUNE_MEASURE_MS 2.0 /* a setting's timed runs together take about this long, within
                              the bounds above: slow kernels get fewer runs */
#define TUNE_RUN_MS 0.2    /* a timed run launches the kernel until about this long */
#define TUNE_MAX_LAUNCHES 256
#define TUNE_MAX_COPIES 16 /* input copies rotated when a copy fits in L2 */
#define TUNE_MAX_SCRATCH ((size_t)1 << 30) /* bytes for every copy together */
/* Scratch tensors of segments measured before stay on the device up to
 * this many bytes (at most a quarter of the free memory): switching back to
 * a segment uploads nothing. */
#define TUNE_SCRATCH_KEEP ((size_t)8 << 30)
/* Host memory for input values and CPU references kept between settings. */
#define TUNE_VALUES_KEEP ((size_t)4 << 30)
#define TUNE_REFERENCES_KEEP ((size_t)2 << 30)
/* Tags of the backend's work on its pool: what the search said it will
 * measure (superseded by its next prepare), and the kernels of the plans
 * timed end to end. */
#define TUNE_TAG_SEARCH 1
#define TUNE_TAG_PLAN 2

typedef struct tune_backend_options {
    uint64_t seed;  /* input values */
    int reps;       /* timed runs; 0: TUNE_MIN_REPS..TUNE_REPS by the kernel's time */
    int no_check;   /* 1: trust every output (tests of the timing only) */
    int threads;    /* of the pool that works ahead; 0: task_pool_default_threads() */
} tune_backend_options;

typedef struct tune_backend_stats {
    long measured;   /* settings timed */
    long rejected;   /* wrong output: reported STOF_ERR_UNSUPPORTED */
    long failed;     /* could not be built or launched here */
    long references; /* CPU references computed (on any thread) */
    double reference_s; /* their wall time, summed over threads */
    long prepared;   /* settings the search announced (prepare) */
    long prepare_skipped; /* of them, not built ahead: outside the kernel's limits */
    double prepare_s;    /* in prepare, on the caller's thread */
    /* tune_backend_measure on the caller's thread: all of it, and its parts */
    double measure_s;
    double scratch_s;    /* input values waited for, uploaded (new segments only) */
    double plan_s;       /* kernel plans: compiles waited for, modules loaded */
    double check_s;      /* first launch and its comparison with the reference */
    double reference_wait_s; /* of check_s: the reference computed or waited for */
    double time_s;       /* timed launches */
    long scratch_new, scratch_kept; /* segments whose scratch was made / found on the GPU */
    /* the longest single measurement: its wall time, the part of it in
     * kernel plans, and what it measured ("TEMPLATE over ops #A-#B") */
    double longest_s, longest_plan_s;
    char longest[96];
} tune_backend_stats;

typedef struct tune_backend tune_backend;

/* A backend on the executor context ctx (which must outlive it). */
int tune_backend_create(exec_ctx *ctx, const tune_backend_options *opt, tune_backend **out,
                        stof_error *err);
void tune_backend_free(tune_backend *b);
search_backend tune_backend_search(tune_backend *b);
/* The search_backend.measure of b (ud = b). */
int tune_backend_measure(void *ud, const search_segment *seg, const int *values, double *ms,
                         stof_error *err);
/* The search_backend.prepare of b: drops the work of the previous call not
 * started yet, then queues, in order, each setting's kernel builds (those
 * its plan would refuse are skipped) and each new segment's input values
 * and reference. Errors only for out of memory. */
int tune_backend_prepare(void *ud, const search_candidate *c, int n, stof_error *err);
/* Queues the kernel builds of every segment of xp (TUNE_TAG_PLAN), for
 * the models made of it next. */
int tune_backend_prepare_plan(tune_backend *b, const exec_plan *xp, stof_error *err);
/* Frees what is kept for measuring (scratch tensors on the device, input
 * values and references), after waiting for the work under way. */
void tune_backend_trim(tune_backend *b);
tune_backend_stats tune_backend_get_stats(const tune_backend *b);
/* Threads of the pool that works ahead (0: none could be started; then
 * nothing is done ahead). */
int tune_backend_threads(const tune_backend *b);

/* ---- starting schemes ------------------------------------------------------------------------ */

/* The starting scheme of each sequence: the search's rules
 * (search_initial_scheme) when the executor runs every segment of it,
 * else the executor's greedy default scheme. */
int tune_initial_schemes(const graph *g, const search_sequence *seqs, int n_seqs,
                         int smem_limit, fusion_scheme *out, stof_error *err);

/* The executor's default plan (exec_default_schemes, each segment's default
 * setting for lim) as a search result over seqs, its times 0: what runs
 * without a plan, which a tuned plan must beat end to end. On failure *r
 * holds nothing to free. */
int tune_default_result(const graph *g, const search_sequence *seqs, int n_seqs,
                        const mha_device_limits *lim, search_result *r, stof_error *err);

/* ---- tuning on the GPU ----------------------------------------------------------------------- */

/* The device field of the measurement cache's lines: the GPU's name, the
 * stof build and a hash of the embedded kernel sources. A time, or a
 * verdict that a setting cannot run or gives a wrong output, holds only for
 * the kernels and launchers that produced it: another build measures
 * afresh (a kernel fixed, or a template given a launcher, is tried again). */
void tune_cache_device_key(const stof_device_info *dev, char *buf, size_t cap);

/* The measurement cache file stof tune keeps beside the kernel cache (nvrtc_cache's folder,
 * made when missing): TUNE_CACHE_FILE there, or "" when there is no such folder. */
#define TUNE_CACHE_FILE "tune-cache.txt"
void tune_cache_path_default(char *buf, size_t n);

/* Beyond this many FLOPs the end-to-end CPU check is skipped unless asked. */
#define TUNE_CHECK_MAX_FLOPS 2e10
#define TUNE_ATTENTION_CANDIDATES 3

typedef struct tune_options {
    long budget;             /* search measurements; 0: no limit */
    double time_limit_s;     /* search wall clock; 0: no limit */
    uint64_t seed;           /* search order and input values */
    const char *cache_path;  /* the measurement cache file; NULL: memory only */
    int reps;                /* end-to-end runs (median); 0: 20 */
    int check;               /* end-to-end CPU check: 0 when small enough, 1 always, -1 never */
    int attention_candidates; /* the selector's best N timed too; 0: TUNE_ATTENTION_CANDIDATES,
                                 < 0: none */
    void (*progress)(void *ud, const search_progress *p);
    void *ud;
} tune_options;

/* Where a tuning's time went (tune_gpu). */
typedef struct tune_timing {
    double search_s, refine_s, end_to_end_s; /* the phases, wall */
    int threads;               /* of the pool that compiles ahead */
    long compiled;             /* NVRTC compilations, on any thread */
    long from_disk;            /* cubins read from the disk cache */
    long memory_hits;          /* asked for and found in memory */
    long compile_failed;
    long ahead, ahead_used;    /* made ahead of need (compiled or read); of them used */
    double compile_sum_s;      /* NVRTC's time summed over threads */
    double compile_wait_s;     /* the measuring thread in nvrtc_get: compiling itself, or
                                  waiting for a compile under way (the compile time that
                                  was not hidden) */
    nvrtc_source_stats by_source[NVRTC_MAX_SOURCES]; /* compiles per kernel source */
    int n_sources;
    double slowest_s;          /* the slowest compile (0: none), nvrtc_cache.slowest */
    char slowest[200];
} tune_timing;

typedef struct tune_outcome {
    search_stats search;
    tune_backend_stats backend;
    tune_timing timing;
    long extra_measured;     /* defaults and selector candidates timed after the search */
    int improved;            /* segments where one of them beat the search's choice */
    double segments_ms;      /* the plan's forward latency from its segments' times */
    double graph_ms, eager_ms, unfused_ms; /* end to end: the plan kept */
    double search_graph_ms;  /* the search's plan, CUDA graph */
    double default_ms;       /* the executor's default plan, CUDA graph (0: not timed) */
    int kept_default;        /* it was faster than the search's plan, and is the plan */
    char default_skipped[1024]; /* why it was not timed ("" when it was): stof_error.msg */
    int checked;             /* the end-to-end output was compared with the CPU reference */
    exec_diff diff;
    int check_ok;
    double seconds;
    search_cache_stats cache;  /* the measurement cache: lines of its file skipped */
    int kernel_cache_problems; /* the kernel caches' (nvrtc_cache_warning), and the first */
    char kernel_cache_problem[1400];
} tune_outcome;

/* Tunes g on ctx's GPU and fills *out (which the caller plan_free's). On
 * failure *out holds nothing. A tuned plan whose end-to-end output does
 * not match the CPU reference is STOF_ERR_INTERNAL (outcome filled). */
int tune_gpu(exec_ctx *ctx, const graph *g, const graph_script *script,
             const tune_options *opt, plan *out, tune_outcome *res, stof_error *err);

/* ---- tuning offline ---------------------------------------------------------------------------- */

typedef struct tune_offline_stats {
    int kernels;        /* compile requests */
    int compiled;       /* of which NVRTC compiled now */
    int disk_hits, memory_hits;
    double seconds;
    int cache_problems;      /* the kernel cache's (nvrtc_cache_warning), and the first */
    char cache_problem[1400];
} tune_offline_stats;

/* Without a GPU: the initial scheme (tune_initial_schemes) with each
 * segment's default setting for arch (exec_segment_candidates), as a plan
 * marked unmeasured for arch (times 0), and every kernel of it compiled for
 * arch into the NVRTC cache at nvrtc_dir (NULL: the default folder). */
int tune_offline(const graph *g, const graph_script *script, const char *arch,
                 const char *nvrtc_dir, plan *out, tune_offline_stats *st, stof_error *err);

#endif
