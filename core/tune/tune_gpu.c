/* Tuning on the GPU (tune_backend.h, tune_gpu): the search measuring
 * through the backend, the refinement, then the plan timed end to end
 * against the executor's default plan (the faster kept) and the all-unfused
 * scheme, and checked against the CPU reference; and the measurement
 * cache's device key. */
#include "core/tune/tune_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/util.h"
#include "core/gpu/kernels.h"
#include "core/gpu/nvrtc.h"
#include "core/tune/tune_impl.h"
#include "ops/ops.h"

static double graph_flops(const graph *g) {
    double sum = 0;
    for (int i = 0; i < g->n_ops; i++) {
        double f, bytes;
        op_cost(g, &g->ops[i], &f, &bytes);
        sum += f;
    }
    return sum;
}

typedef struct tune_state {
    search_sequence *seqs;
    int n_seqs;
    fusion_scheme *initial;
    tune_backend *backend;
    search_cache *cache;
    search_result result;
    exec_plan *unfused;
} tune_state;

static void tune_state_free(tune_state *t) {
    search_result_free(&t->result);
    search_cache_free(t->cache);
    tune_backend_free(t->backend);
    exec_plan_free(t->unfused);
    free(t->initial);
    search_sequences_free(t->seqs, t->n_seqs);
}

/* Replays of an end-to-end timing. */
static int reps_of(const tune_options *o) {
    return o->reps > 0 ? o->reps : 20;
}

/* Plan p on the executor, its kernels prepared, timed by CUDA graph (and
 * eagerly where eager_ms is given), its output into y. */
static int time_plan(exec_ctx *ctx, tune_backend *b, const graph *g, const tune_options *o,
                     const plan *p, double *eager_ms, double *graph_ms, float *y,
                     stof_error *err) {
    exec_plan *xp = NULL;
    int rc = exec_plan_from_plan(p, g, &xp, err);
    if (!rc)
        rc = tune_backend_prepare_plan(b, xp, err);
    if (!rc)
        rc = exec_model_measure(ctx, xp, o->seed, reps_of(o), eager_ms, graph_ms, y, err);
    exec_plan_free(xp);
    return rc;
}

/* The executor's default plan (what runs untuned), its segments timed alone, as a plan in
 * *dp (no search statistics); the backend's memory trimmed again after. STOF_ERR_UNSUPPORTED:
 * a segment of it would not run alone; *same: it is the search's plan (nothing made). */
static int default_plan(exec_ctx *ctx, const graph *g, const graph_script *script,
                        tune_state *t, tune_outcome *res, plan *dp, int *same,
                        stof_error *err) {
    search_result r;
    int rc = tune_default_result(g, t->seqs, t->n_seqs, &t->backend->lim, &r, err);
    if (rc)
        return rc;
    *same = search_result_same_choices(&r, &t->result);
    if (!*same) {
        rc = tune_time_result(t->backend, t->cache, g, t->seqs, &r, res, err);
        tune_backend_trim(t->backend); /* its scratch, again, before the models */
    }
    if (!rc && !*same)
        rc = plan_from_search(&r, g, t->seqs, script, exec_ctx_device(ctx), NULL, dp, err);
    search_result_free(&r);
    return rc;
}

/* The default plan replaces the search's where its graph is at least this much faster: two
 * replays of one plan differ by about 1%, and a tie keeps what the search measured. */
#define TUNE_DEFAULT_MARGIN 0.99

/* The executor's default plan timed by CUDA graph against the tuned plan *p (timed already:
 * res->graph_ms, its output in y); where the default is faster it replaces *p and its output
 * y's (res->kept_default). Not timed (res->default_skipped says why) when the search ran past
 * its time limit, when the search's plan is the default, or when a segment of the default
 * does not run alone. The default's segments timed count in the plan's statistics either way. */
static int keep_faster_default(exec_ctx *ctx, const graph *g, const graph_script *script,
                               const tune_options *o, tune_state *t, plan *p, float *y,
                               int64_t n, tune_outcome *res, stof_error *err) {
    if (t->result.stats.measured_past_limit > 0) {
        snprintf(res->default_skipped, sizeof res->default_skipped, "the time limit ran out "
                 "before the initial scheme was measured");
        return STOF_OK;
    }
    plan dp;
    memset(&dp, 0, sizeof dp);
    stof_error why = {0};
    const long measured = res->extra_measured;
    int same = 0;
    int rc = default_plan(ctx, g, script, t, res, &dp, &same, &why);
    p->stats.settings_measured += res->extra_measured - measured;
    if (rc == STOF_ERR_UNSUPPORTED || (!rc && same)) {
        snprintf(res->default_skipped, sizeof res->default_skipped, "%s",
                 rc ? why.msg : "the search's plan is the default");
        return STOF_OK;
    }
    if (rc)
        return err_set(err, rc, "%s", why.msg);
    float *y_default = err_malloc(sizeof *y_default * (size_t)n, err);
    double eager_ms = 0;
    rc = y_default ? time_plan(ctx, t->backend, g, o, &dp, &eager_ms, &res->default_ms,
                               y_default, err)
                   : STOF_ERR_NOMEM;
    if (!rc && res->default_ms < TUNE_DEFAULT_MARGIN * res->graph_ms) {
        res->kept_default = 1;
        res->graph_ms = res->default_ms;
        res->eager_ms = eager_ms;
        res->segments_ms = dp.latency_ms;
        dp.stats = p->stats;
        plan_free(p);
        *p = dp;
        memset(&dp, 0, sizeof dp);
        memcpy(y, y_default, sizeof *y * (size_t)n);
    }
    plan_free(&dp);
    free(y_default);
    return rc;
}

/* The tuned plan *p timed end to end against the executor's default plan and the all-unfused
 * scheme (planned before, its kernels prepared). The search times segments one by one, apart:
 * a plan of more segments can win there and lose as a whole, where a kernel's start overlaps
 * the end of the one before (a decode step's). So the default plan is timed too, and kept
 * where its graph is faster. The plan kept is checked against the CPU reference. */
static int end_to_end(exec_ctx *ctx, const graph *g, const graph_script *script,
                      const tune_options *o, tune_state *t, plan *p, tune_outcome *res,
                      stof_error *err) {
    int64_t n = graph_tensor_numel(&g->tensors[g->output]);
    float *y = err_malloc(sizeof *y * (size_t)n, err), *ref = NULL;
    stof_dtype dtype = STOF_F16;
    int rc = y ? exec_model_dtype(g, &dtype, err) : STOF_ERR_NOMEM;
    if (!rc)
        rc = time_plan(ctx, t->backend, g, o, p, &res->eager_ms, &res->graph_ms, y, err);
    res->search_graph_ms = res->graph_ms;
    if (!rc)
        rc = keep_faster_default(ctx, g, script, o, t, p, y, n, res, err);
    if (!rc)
        rc = exec_model_measure(ctx, t->unfused, o->seed, reps_of(o), NULL, &res->unfused_ms,
                                NULL, err);
    int check = o->check > 0 || (o->check == 0 && graph_flops(g) <= TUNE_CHECK_MAX_FLOPS);
    weights_source src = weights_source_seeded(o->seed);
    if (!rc && check && (rc = exec_reference(g, &src, &ref, err)) == STOF_OK) {
        exec_compare(y, ref, n, &res->diff);
        res->checked = 1;
        res->check_ok = res->diff.n_nonfinite == 0 &&
                        res->diff.rel_error < tune_tolerance(dtype);
    }
    if (!rc) {
        p->has_end_to_end = 1;
        p->end_to_end = (plan_end_to_end){res->graph_ms, res->eager_ms, res->unfused_ms};
    }
    free(y);
    free(ref);
    return rc;
}

/* Adds n compiles of source taking s seconds to t's line for it. */
static void add_source(tune_timing *t, const char *source, int n, double s) {
    int i = 0;
    while (i < t->n_sources && strcmp(t->by_source[i].source, source) != 0)
        i++;
    if (i == t->n_sources) {
        if (i == NVRTC_MAX_SOURCES)
            return;
        t->by_source[t->n_sources++] = (nvrtc_source_stats){source, 0, 0};
    }
    t->by_source[i].compiled += n;
    t->by_source[i].compile_s += s;
}

/* The NVRTC counters of both kernel caches of ctx, summed, as timing
 * fields; read while no thread compiles. */
static tune_timing compile_counts(const exec_ctx *ctx) {
    const nvrtc_cache *c[EXEC_CTX_CACHES];
    exec_ctx_caches(ctx, c);
    tune_timing t;
    memset(&t, 0, sizeof t);
    for (int i = 0; i < EXEC_CTX_CACHES; i++) {
        t.compiled += c[i]->compiled;
        t.from_disk += c[i]->disk_hits;
        t.memory_hits += c[i]->memory_hits;
        t.compile_failed += c[i]->failed;
        t.ahead += c[i]->ahead;
        t.ahead_used += c[i]->ahead_used;
        t.compile_sum_s += c[i]->compile_s;
        t.compile_wait_s += c[i]->get_s;
        for (int k = 0; k < c[i]->n_sources; k++)
            add_source(&t, c[i]->by_source[k].source, c[i]->by_source[k].compiled,
                       c[i]->by_source[k].compile_s);
        if (c[i]->slowest_s > t.slowest_s) {
            t.slowest_s = c[i]->slowest_s;
            snprintf(t.slowest, sizeof t.slowest, "%s", c[i]->slowest);
        }
    }
    return t;
}

/* What this tuning compiled: the counters now less those before. */
static void compile_delta(tune_timing *t, const tune_timing *before, const tune_timing *now) {
    t->compiled = now->compiled - before->compiled;
    t->from_disk = now->from_disk - before->from_disk;
    t->memory_hits = now->memory_hits - before->memory_hits;
    t->compile_failed = now->compile_failed - before->compile_failed;
    t->ahead = now->ahead - before->ahead;
    t->ahead_used = now->ahead_used - before->ahead_used;
    t->compile_sum_s = now->compile_sum_s - before->compile_sum_s;
    t->compile_wait_s = now->compile_wait_s - before->compile_wait_s;
    t->n_sources = 0;
    for (int i = 0; i < now->n_sources; i++)
        add_source(t, now->by_source[i].source, now->by_source[i].compiled,
                   now->by_source[i].compile_s);
    for (int i = 0; i < before->n_sources; i++)
        add_source(t, before->by_source[i].source, -before->by_source[i].compiled,
                   -before->by_source[i].compile_s);
    /* a maximum: this tuning's only if it rose during it */
    t->slowest_s = now->slowest_s > before->slowest_s ? now->slowest_s : 0;
    snprintf(t->slowest, sizeof t->slowest, "%s", t->slowest_s > 0 ? now->slowest : "");
}

void tune_cache_device_key(const stof_device_info *dev, char *buf, size_t cap) {
    uint64_t h = UTIL_HASH_SEED;
    for (int i = 0; i < kernel_source_count; i++) {
        h = util_hash_str(h, kernel_sources[i].name);
        h = util_hash(h, kernel_sources[i].text, kernel_sources[i].len);
    }
    snprintf(buf, cap, "%s | stof %s %s | kernels %016llx", dev->name, stof_version(),
             stof_build_commit(), (unsigned long long)h);
}

/* 1 when some sequence could not start from the rules' own scheme (the
 * executor cannot run it): then the search must be given the starting
 * schemes; otherwise it picks among the rules' candidates itself. */
static int needs_given_start(const graph *g, const search_sequence *seqs, int n_seqs,
                             int smem_limit, const fusion_scheme *start) {
    for (int q = 0; q < n_seqs; q++) {
        int ops[FUSION_MAX_OPS];
        for (int k = 0; k < seqs[q].n; k++)
            ops[k] = seqs[q].firsts[0] + k;
        search_rules rules = {0, smem_limit};
        fusion_scheme own;
        stof_error ignored = {0};
        if (search_initial_scheme(g, ops, seqs[q].n, &rules, &own, &ignored) ||
            !fusion_scheme_equal(&own, &start[q]))
            return 1;
    }
    return 0;
}

/* Sequences, starting schemes, backend, cache. */
static int tune_setup(exec_ctx *ctx, const graph *g, const tune_options *o, tune_state *t,
                      stof_error *err) {
    const stof_device_info *dev = exec_ctx_device(ctx);
    stof_dtype dtype;
    tune_backend_options bo = {.seed = o->seed};
    int rc = exec_model_dtype(g, &dtype, err);
    if (!rc)
        rc = search_sequences_from_graph(g, &t->seqs, &t->n_seqs, err);
    if (!rc && !(t->initial = err_calloc((size_t)t->n_seqs, sizeof *t->initial, err)))
        rc = STOF_ERR_NOMEM;
    if (!rc)
        rc = tune_initial_schemes(g, t->seqs, t->n_seqs, dev->smem_per_block_optin, t->initial,
                                  err);
    if (!rc)
        rc = tune_backend_create(ctx, &bo, &t->backend, err);
    char key[512];
    tune_cache_device_key(dev, key, sizeof key);
    if (!rc)
        rc = search_cache_open(key, o->cache_path, &t->cache, err);
    return rc;
}

/* The search. The all-unfused plan, timed at the end, is planned first and
 * its kernels queued ahead of everything: a few compiles, done long before
 * the end instead of waited for there. */
static int tune_search(exec_ctx *ctx, const graph *g, const tune_options *o, tune_state *t,
                       tune_outcome *res, stof_error *err) {
    const stof_device_info *dev = exec_ctx_device(ctx);
    int rc = exec_plan_create(g, NULL, &t->unfused, err);
    if (!rc)
        rc = tune_backend_prepare_plan(t->backend, t->unfused, err);
    if (rc)
        return rc;
    search_backend backend = tune_backend_search(t->backend);
    search_options so = {.budget = o->budget, .time_limit_s = o->time_limit_s, .seed = o->seed,
                         .smem_limit = dev->smem_per_block_optin,
                         .initial = needs_given_start(g, t->seqs, t->n_seqs,
                                                      dev->smem_per_block_optin, t->initial)
                                        ? t->initial
                                        : NULL,
                         .cache = t->cache, .progress = o->progress, .cb_ud = o->ud};
    double t0 = util_now();
    rc = search_run(g, t->seqs, t->n_seqs, &backend, &so, &t->result, err);
    res->timing.search_s = util_now() - t0;
    return rc;
}

static int tune_refine(const graph *g, const tune_options *o, tune_state *t,
                       tune_outcome *res, stof_error *err) {
    /* the time limit ran out before the initial scheme was measured: the
     * search finished it past the limit with the segments' defaults, and
     * nothing more is timed before the plan is made */
    if (t->result.stats.measured_past_limit > 0)
        return STOF_OK;
    int n_attention = o->attention_candidates == 0  ? TUNE_ATTENTION_CANDIDATES
                      : o->attention_candidates < 0 ? 0
                                                    : o->attention_candidates;
    double t0 = util_now();
    int rc = tune_refine_result(t->backend, t->cache, g, t->seqs, n_attention, &t->result, res,
                                err);
    res->timing.refine_s = util_now() - t0;
    return rc;
}

void tune_cache_path_default(char *buf, size_t n) {
    nvrtc_cache kc;
    nvrtc_cache_init(&kc, NULL);
    buf[0] = '\0';
    if (kc.dir[0] && nvrtc_make_dirs(kc.dir) == 0)
        snprintf(buf, n, "%s/%s", kc.dir, TUNE_CACHE_FILE);
    nvrtc_cache_free(&kc);
}

int tune_gpu(exec_ctx *ctx, const graph *g, const graph_script *script,
             const tune_options *opt, plan *out, tune_outcome *res, stof_error *err) {
    memset(out, 0, sizeof *out);
    memset(res, 0, sizeof *res);
    tune_options o = *opt;
    double t0 = util_now();
    const stof_device_info *dev = exec_ctx_device(ctx);
    tune_timing before = compile_counts(ctx);
    tune_state t;
    memset(&t, 0, sizeof t);
    int rc = tune_setup(ctx, g, &o, &t, err);
    if (!rc)
        rc = tune_search(ctx, g, &o, &t, res, err);
    if (!rc)
        rc = tune_refine(g, &o, &t, res, err);
    if (t.backend) {
        res->timing.threads = tune_backend_threads(t.backend);
        tune_backend_trim(t.backend); /* host and device memory back before the models */
    }
    if (!rc)
        rc = plan_from_search(&t.result, g, t.seqs, script, dev, NULL, out, err);
    if (!rc) {
        res->search = t.result.stats;
        res->segments_ms = t.result.total_ms;
        out->stats.settings_measured += res->extra_measured;
        double t1 = util_now();
        rc = end_to_end(ctx, g, script, &o, &t, out, res, err);
        res->timing.end_to_end_s = util_now() - t1;
    }
    if (t.backend)
        res->backend = tune_backend_get_stats(t.backend);
    if (t.cache)
        res->cache = search_cache_get_stats(t.cache);
    const char *w = exec_ctx_cache_warning(ctx, &res->kernel_cache_problems);
    snprintf(res->kernel_cache_problem, sizeof res->kernel_cache_problem, "%s", w ? w : "");
    tune_state_free(&t); /* its threads joined: the compile counters are still */
    tune_timing now = compile_counts(ctx);
    compile_delta(&res->timing, &before, &now);
    res->seconds = util_now() - t0;
    out->tuning_s = res->seconds;
    if (!rc && res->checked && !res->check_ok)
        rc = err_set(err, STOF_ERR_INTERNAL,
                     "the tuned plan's output differs from the CPU reference (relative error "
                     "%.3e, %lld non-finite)", res->diff.rel_error,
                     (long long)res->diff.n_nonfinite);
    if (rc)
        plan_free(out);
    return rc;
}

