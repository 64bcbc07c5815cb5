/* The search's GPU backend (tune_backend.h): one setting of one segment
 * measured through the executor's segment bench (exec_bench) on scratch
 * tensors, checked once against the CPU reference, then timed. */
#include "core/tune/tune_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/util.h"
#include "core/tune/tune_impl.h"

/* The attention planner's templates: their settings come from the selector (auto_attention). */
int tune_is_attention(fusion_template_id t) {
    return t == FUSION_T_ATTENTION_ROW || t == FUSION_T_ATTENTION_BLOCK;
}

/* Values and references (the work on them done first). */
static void kept_free(tune_backend *b) {
    task_pool_drop(b->pool, TUNE_TAG_SEARCH);
    task_pool_wait(b->pool);
    if (b->refs) {
        memo_stats st = memo_get_stats(b->refs);
        b->refs_done += st.computed;
        b->refs_done_s += st.compute_s;
    }
    memo_free(b->refs);
    memo_free(b->values);
    b->refs = b->values = NULL;
}

int tune_use_graph(tune_backend *b, const graph *g, stof_error *err) {
    if (b->g == g && b->values && b->refs)
        return STOF_OK;
    kept_free(b);
    exec_ctx_make_current(b->ctx, NULL);
    tune_scratch_drop_all(b);
    b->g = g;
    int rc = memo_create(TUNE_VALUES_KEEP, free, &b->values, err);
    if (!rc)
        rc = memo_create(TUNE_REFERENCES_KEEP, tune_reference_value_free, &b->refs, err);
    return rc;
}

void tune_backend_trim(tune_backend *b) {
    kept_free(b);
    exec_ctx_make_current(b->ctx, NULL);
    tune_scratch_drop_all(b);
    b->g = NULL;
}

/* ---- the backend ----------------------------------------------------------------------------- */

/* A quarter of the free device memory, at most TUNE_SCRATCH_KEEP. */
static size_t scratch_keep_for(tune_backend *b) {
    size_t free_bytes = 0, total = 0;
    if (b->drv->MemGetInfo(&free_bytes, &total) != CUDA_SUCCESS)
        return TUNE_SCRATCH_KEEP / 8;
    return free_bytes / 4 < TUNE_SCRATCH_KEEP ? free_bytes / 4 : TUNE_SCRATCH_KEEP;
}

int tune_backend_create(exec_ctx *ctx, const tune_backend_options *opt, tune_backend **out,
                        stof_error *err) {
    *out = NULL;
    tune_backend *b = err_calloc(1, sizeof *b, err);
    if (!b)
        return STOF_ERR_NOMEM;
    b->ctx = ctx;
    b->drv = exec_ctx_driver(ctx);
    if (opt)
        b->opt = *opt;
    b->cur = -1;
    exec_ctx_limits(ctx, &b->lim);
    int rc = exec_ctx_make_current(ctx, err);
    if (!rc)
        rc = cuda_check(b->drv, b->drv->StreamCreate(&b->stream, CU_STREAM_NON_BLOCKING),
                        "cuStreamCreate", err);
    if (!rc)
        rc = gpu_timer_create(b->drv, &b->timer, err);
    if (rc) {
        tune_backend_free(b);
        return rc;
    }
    /* without threads (none could be started) nothing is done ahead */
    stof_error no_pool = {0};
    if (task_pool_create(b->opt.threads, &b->pool, &no_pool) != STOF_OK)
        b->pool = NULL;
    b->scratch_keep = scratch_keep_for(b);
    *out = b;
    return STOF_OK;
}

void tune_backend_free(tune_backend *b) {
    if (!b)
        return;
    task_pool_free(b->pool); /* its tasks use the memos and the NVRTC caches */
    b->pool = NULL;
    kept_free(b);
    exec_ctx_make_current(b->ctx, NULL);
    if (b->stream)
        b->drv->StreamSynchronize(b->stream);
    tune_scratch_drop_all(b);
    free(b->scratch);
    gpu_timer_free(&b->timer);
    if (b->stream)
        b->drv->StreamDestroy(b->stream);
    free(b);
}

static int default_setting(void *ud, const search_segment *seg, fusion_template_id *tmpl,
                           int *values);
static int template_default(void *ud, const search_segment *seg, int *values);

search_backend tune_backend_search(tune_backend *b) {
    return (search_backend){.ud = b, .measure = tune_backend_measure,
                            .prepare = tune_backend_prepare,
                            .default_setting = default_setting,
                            .template_default = template_default};
}

tune_backend_stats tune_backend_get_stats(const tune_backend *b) {
    tune_backend_stats st = b->stats;
    st.references = b->refs_done;
    st.reference_s = b->refs_done_s;
    if (b->refs) {
        memo_stats ms = memo_get_stats(b->refs);
        st.references += ms.computed;
        st.reference_s += ms.compute_s;
    }
    return st;
}

int tune_backend_threads(const tune_backend *b) {
    return b->pool ? task_pool_threads(b->pool) : 0;
}

/* ---- one measurement ------------------------------------------------------------------------- */

void tune_segment_of(const search_segment *seg, const int *values, exec_segment *s) {
    const fusion_template *t = fusion_template_get(seg->tmpl);
    exec_segment_init(seg->g, seg->op_first, seg->op_last - seg->op_first + 1, seg->match, s);
    s->tmpl = seg->tmpl;
    s->has_values = 1;
    memcpy(s->values, values, sizeof *values * (size_t)(t ? t->n_params : 0));
}

/* What the executor runs seg with when given no values: under the first
 * template that runs it (executor_template) or under seg->tmpl, that
 * template's default values; for attention the selector's kernel. */
static int default_of(const tune_backend *b, const search_segment *seg, int executor_template,
                      fusion_template_id *tmpl, int *values) {
    int none[FUSION_MAX_PARAMS] = {0};
    exec_segment s;
    exec_choice c;
    int got = 0, rc = STOF_OK;
    tune_segment_of(seg, none, &s);
    s.has_values = 0;
    if (executor_template)
        rc = exec_segment_template(seg->g, s.first, s.n, &s.match, &s.tmpl, NULL);
    s.auto_attention = tune_is_attention(s.tmpl);
    if (!rc)
        rc = exec_segment_candidates(seg->g, &s, &b->lim, 0, &c, 1, &got, NULL);
    if (!rc && got < 1)
        rc = STOF_ERR_UNSUPPORTED;
    if (rc)
        return rc;
    *tmpl = c.tmpl;
    memcpy(values, c.values, sizeof c.values);
    return STOF_OK;
}

/* search_backend.default_setting: as an offline plan has it. The search
 * measures it when the time limit leaves no room to. */
static int default_setting(void *ud, const search_segment *seg, fusion_template_id *tmpl,
                           int *values) {
    return default_of(ud, seg, 1, tmpl, values);
}

/* search_backend.template_default: seg->tmpl's default values (for
 * attention, the selector's choice, which may be the other attention
 * template: then none). */
static int template_default(void *ud, const search_segment *seg, int *values) {
    fusion_template_id tmpl;
    int rc = default_of(ud, seg, 0, &tmpl, values);
    return rc || tmpl == seg->tmpl ? rc : STOF_ERR_UNSUPPORTED;
}

/* f16, bf16 or fp32 (a residual stream) -> float, in slices on the pool. */
typedef struct unstage_job {
    const void *h;
    float *out;
    stof_dtype dtype;
    size_t n;
    int slices;
} unstage_job;

static void unstage_slice(void *arg, int k) {
    const unstage_job *j = arg;
    size_t lo = j->n * (size_t)k / (size_t)j->slices;
    size_t hi = j->n * (size_t)(k + 1) / (size_t)j->slices;
    const uint16_t *h = j->h;
    for (size_t i = lo; i < hi; i++)
        j->out[i] = j->dtype == STOF_F32    ? ((const float *)j->h)[i]
                    : j->dtype == STOF_BF16 ? util_bf16_to_f32(h[i])
                                            : util_f16_to_f32(h[i]);
}

/* The rows of tensor t (of row_len elements) that ref holds, as floats:
 * every row, or the checked ones, one copy each. */
static int download_rows(tune_backend *b, const graph_tensor *t, CUdeviceptr d,
                         const tune_reference *ref, float *out, stof_error *err) {
    size_t len = (size_t)ref->row_len, n = (size_t)ref->n_rows * len;
    const size_t e = stof_dtype_size(t->dtype);
    unsigned char *h = err_malloc(n * e, err);
    if (!h)
        return STOF_ERR_NOMEM;
    int rc = STOF_OK;
    if (!ref->rows)
        rc = cuda_check(b->drv, b->drv->MemcpyDtoH(h, d, n * e), "cuMemcpyDtoH", err);
    for (int64_t r = 0; ref->rows && !rc && r < ref->n_rows; r++) {
        CUdeviceptr row = d + (CUdeviceptr)((size_t)ref->rows[r] * len * e);
        rc = cuda_check(b->drv, b->drv->MemcpyDtoH(h + (size_t)r * len * e, row, len * e),
                        "cuMemcpyDtoH", err);
    }
    if (!rc) {
        size_t slices = (n + TUNE_STAGE_SLICE - 1) / TUNE_STAGE_SLICE;
        unstage_job j = {h, out, t->dtype, n, slices ? (int)slices : 1};
        task_pool_parallel_for(b->pool, j.slices, unstage_slice, &j);
    }
    free(h);
    return rc;
}

/* Output k (0: the result, 1: the stored pre-norm values) of copy 0
 * against ref. */
static int check_output(tune_backend *b, const graph *g, const tune_reference *ref, int t, int k,
                        stof_error *err) {
    const graph_tensor *x = &g->tensors[t];
    stof_dtype dtype;
    exec_model_dtype(g, &dtype, NULL);
    float *got = err_malloc(sizeof *got * (size_t)(ref->n_rows * ref->row_len), err);
    int rc = got ? download_rows(b, x, tune_scratch_current(b)->ptr[t], ref, got, err)
                 : STOF_ERR_NOMEM;
    if (!rc)
        rc = tune_reference_compare(ref, got, k, dtype, NULL, err);
    free(got);
    if (rc == STOF_ERR_UNSUPPORTED) {
        b->rejected_now = 1;
        if (k)
            err_prefix(err, "the stored pre-norm values: ");
    }
    return rc;
}

/* One launch on copy 0 (exec_bench_check_run) compared with the CPU
 * reference. */
static int check_setting(tune_backend *b, exec_bench *bench, const graph *g,
                         const exec_segment *s, stof_error *err) {
    int outs[2] = {s->out, s->pre_norm};
    int rc = exec_bench_check_run(bench, err);
    const tune_reference *ref = NULL;
    if (!rc && (rc = tune_reference_of(b, g, s, &ref, err)) == STOF_OK) {
        for (int k = 0; !rc && k < 2; k++)
            if (outs[k] >= 0)
                rc = check_output(b, g, ref, outs[k], k, err);
        tune_reference_release(b, s);
    }
    return rc;
}

/* Timed runs for a run of run_ms: the caller's count, else enough for
 * about TUNE_MEASURE_MS in all, within TUNE_MIN_REPS..TUNE_REPS. */
static int reps_for(const tune_backend *b, double run_ms) {
    int reps = b->opt.reps;
    if (reps <= 0) {
        double want = run_ms > 0 ? ceil(TUNE_MEASURE_MS / run_ms) : TUNE_REPS;
        reps = want < TUNE_MIN_REPS ? TUNE_MIN_REPS : want > TUNE_REPS ? TUNE_REPS : (int)want;
    }
    return reps < TUNE_MAX_REPS ? reps : TUNE_MAX_REPS;
}

/* Warm-up, a first estimate, then the median over reps runs of about
 * TUNE_RUN_MS each (per launch), the runs captured as a CUDA graph. */
static int time_setting(tune_backend *b, exec_bench *bench, double *ms, stof_error *err) {
    int copies = tune_scratch_current(b)->n_copies;
    double est;
    int rc = exec_bench_launch(bench, copies * TUNE_WARMUP, err);
    if (!rc)
        rc = exec_bench_time_once(bench, &b->timer, copies, &est, err);
    if (rc)
        return rc;
    est /= copies;
    double want = est > 0 ? ceil(TUNE_RUN_MS / est) : TUNE_MAX_LAUNCHES;
    int n = want < TUNE_MAX_LAUNCHES ? (int)want : TUNE_MAX_LAUNCHES;
    n = (n + copies - 1) / copies * copies;
    double run_ms;
    rc = exec_bench_time(bench, &b->timer, n, reps_for(b, est * n), &run_ms, err);
    if (!rc)
        *ms = run_ms / n;
    return rc;
}

/* A setting that did not work out: STOF_ERR_UNSUPPORTED (the search caches
 * it as never fastest) while the GPU context still works, else the error
 * itself (the search stops). */
static int give_up(tune_backend *b, int rc, const stof_error *why, stof_error *err) {
    if (rc == STOF_ERR_NOMEM) {
        if (err && err != why)
            *err = *why;
        return rc;
    }
    if (b->drv->CtxSynchronize(NULL) != CUDA_SUCCESS)
        return err_set(err, STOF_ERR_CUDA, "%s (the GPU context is no longer usable)", why->msg);
    if (b->rejected_now)
        b->stats.rejected++;
    else
        b->stats.failed++;
    return err_set(err, STOF_ERR_UNSUPPORTED, "%s", why->msg);
}

static int measure_setting(tune_backend *b, const graph *g, const exec_segment *s, double *ms,
                           stof_error *why) {
    int rc = exec_ctx_make_current(b->ctx, why);
    if (!rc)
        rc = tune_scratch_prepare(b, g, s, why);
    if (rc)
        return rc;
    const tune_scratch *sc = tune_scratch_current(b);
    exec_bench *bench = NULL;
    double t0 = util_now();
    /* the kernel plan: compiled ahead, or now */
    rc = exec_bench_create(b->ctx, g, s, sc->ptr, sc->n_copies, b->stream, &bench, why);
    b->stats.plan_s += util_now() - t0;
    double t1 = util_now();
    if (!rc && !b->opt.no_check)
        rc = check_setting(b, bench, g, s, why);
    double t2 = util_now();
    if (!rc)
        rc = time_setting(b, bench, ms, why);
    b->stats.check_s += t2 - t1;
    b->stats.time_s += util_now() - t2;
    exec_bench_free(bench);
    return rc;
}

/* Counts one measurement's wall time dt (plan_dt of it in kernel plans),
 * remembering the longest: with a time limit, it is what the search can
 * overrun the limit by. */
static void note_duration(tune_backend *b, const exec_segment *s, double dt, double plan_dt) {
    b->stats.measure_s += dt;
    if (dt <= b->stats.longest_s)
        return;
    b->stats.longest_s = dt;
    b->stats.longest_plan_s = plan_dt;
    snprintf(b->stats.longest, sizeof b->stats.longest, "%s over ops #%d-#%d",
             fusion_template_get(s->tmpl)->name, s->first, s->first + s->n - 1);
}

int tune_backend_measure(void *ud, const search_segment *seg, const int *values, double *ms,
                         stof_error *err) {
    tune_backend *b = ud;
    const graph *g = seg->g;
    double t0 = util_now(), plan0 = b->stats.plan_s;
    *ms = 0;
    b->rejected_now = 0;
    exec_segment s;
    tune_segment_of(seg, values, &s);
    stof_error why = {0};
    int rc = tune_use_graph(b, g, err);
    if (rc)
        return rc;
    rc = exec_segment_supports(g, s.first, s.n, &s.match, s.tmpl, &why);
    if (!rc)
        rc = measure_setting(b, g, &s, ms, &why);
    note_duration(b, &s, util_now() - t0, b->stats.plan_s - plan0);
    if (rc)
        return give_up(b, rc, &why, err);
    b->stats.measured++;
    return STOF_OK;
}

