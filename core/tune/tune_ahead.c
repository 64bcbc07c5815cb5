/* Work ahead of the measurements (tune_backend.h, search_backend.prepare):
 * on the backend's pool, the kernels of the settings the search will
 * measure next are compiled into the NVRTC caches, and their segments'
 * input values and CPU references computed, while the GPU measures. */
#include <stdlib.h>

#include "core/base/error.h"
#include "core/base/util.h"
#include "core/gpu/nvrtc.h"
#include "core/tune/tune_impl.h"

/* Queues the kernel builds of segment s; *built 0 when its plan would
 * refuse it (nothing queued). Errors: out of memory. */
static int prepare_kernels(tune_backend *b, const graph *g, const exec_segment *s, int tag,
                           int *built, stof_error *err) {
    exec_build k[EXEC_MAX_BUILDS];
    int n = 0;
    stof_error why = {0};
    int rc = exec_segment_builds(g, s, &b->lim, EXEC_BUILDS_PLANNED, k, &n, &why);
    *built = rc == STOF_OK;
    if (rc)
        return rc == STOF_ERR_NOMEM ? err_set(err, rc, "%s", why.msg) : STOF_OK;
    for (int i = 0; i < n; i++) {
        rc = nvrtc_submit(b->pool, tag, exec_ctx_build_cache(b->ctx, &k[i]),
                          exec_build_request(&k[i]), &why);
        if (rc == STOF_ERR_NOMEM)
            return err_set(err, rc, "%s", why.msg);
    }
    return STOF_OK;
}

typedef struct value_job {
    memo *values;
    value_make vm;
    int copy;
} value_job;

static void value_job_run(void *arg) {
    value_job *j = arg;
    memo_fill(j->values, tune_value_key(j->vm.g, j->vm.t, j->copy), tune_make_values, &j->vm, NULL);
    free(j);
}

typedef struct reference_job {
    memo *refs;
    reference_make rm;
} reference_job;

static void reference_job_run(void *arg) {
    reference_job *j = arg;
    memo_fill(j->refs, tune_span_key(j->rm.first, j->rm.last, j->rm.pre_norm),
              tune_make_reference, &j->rm, NULL);
    free(j);
}

/* Queues what a new span needs before its first setting runs: the values
 * of its inputs (unless its scratch is on the device), then its reference. */
static int prepare_span(tune_backend *b, const graph *g, const exec_segment *s,
                        stof_error *err) {
    span_layout l;
    tune_span_layout(b, g, s, &l);
    int on_device = tune_scratch_find(b, s) >= 0;
    for (int c = 0; !on_device && c < l.copies; c++)
        for (int i = 0; i < l.n; i++) {
            int t = l.list[i];
            if (tune_is_output_of(s, t) || memo_known(b->values, tune_value_key(g, t, c)))
                continue;
            value_job *j = err_malloc(sizeof *j, err);
            if (!j)
                return STOF_ERR_NOMEM;
            *j = (value_job){b->values, {g, t, b->opt.seed + (uint64_t)c}, c};
            int rc = task_pool_submit(b->pool, TUNE_TAG_SEARCH, value_job_run, free, j, err);
            if (rc)
                return rc;
        }
    reference_make rm = tune_reference_make_of(b, g, s);
    if (b->opt.no_check || memo_known(b->refs, tune_span_key(rm.first, rm.last, rm.pre_norm)))
        return STOF_OK;
    reference_job *j = err_malloc(sizeof *j, err);
    if (!j)
        return STOF_ERR_NOMEM;
    *j = (reference_job){b->refs, rm};
    return task_pool_submit(b->pool, TUNE_TAG_SEARCH, reference_job_run, free, j, err);
}

static int span_seen(const exec_segment *spans, int n, const exec_segment *s) {
    for (int i = 0; i < n; i++)
        if (spans[i].first == s->first && spans[i].n == s->n && spans[i].pre_norm == s->pre_norm)
            return 1;
    return 0;
}

int tune_backend_prepare(void *ud, const search_candidate *c, int n, stof_error *err) {
    tune_backend *b = ud;
    if (n <= 0 || !b->pool)
        return STOF_OK;
    double t0 = util_now();
    int rc = tune_use_graph(b, c[0].seg.g, err);
    task_pool_drop(b->pool, TUNE_TAG_SEARCH);
    exec_segment *spans = rc ? NULL : err_malloc(sizeof *spans * (size_t)n, err);
    int n_spans = 0;
    if (!rc && !spans)
        rc = STOF_ERR_NOMEM;
    for (int i = 0; !rc && i < n; i++) {
        exec_segment s;
        tune_segment_of(&c[i].seg, c[i].values, &s);
        int built;
        rc = prepare_kernels(b, c[i].seg.g, &s, TUNE_TAG_SEARCH, &built, err);
        b->stats.prepared++;
        b->stats.prepare_skipped += !built;
        if (!rc && built && !span_seen(spans, n_spans, &s)) {
            spans[n_spans++] = s;
            rc = prepare_span(b, c[i].seg.g, &s, err);
        }
    }
    free(spans);
    b->stats.prepare_s += util_now() - t0;
    return rc;
}

int tune_backend_prepare_plan(tune_backend *b, const exec_plan *xp, stof_error *err) {
    int rc = STOF_OK, built;
    if (!b->pool)
        return STOF_OK;
    for (int k = 0; !rc && k < xp->n_segs; k++)
        rc = prepare_kernels(b, xp->g, &xp->segs[k], TUNE_TAG_PLAN, &built, err);
    return rc;
}

