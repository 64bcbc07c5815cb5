/* The auto-tuner (tune_backend.h): checking a candidate's output, the GPU
 * measurement backend of the search, plans to executor plans, tuning on
 * the GPU and offline. */
#include "core/tune_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/exec_impl.h"
#include "core/kernels.h"
#include "core/nvrtc.h"
#include "core/util.h"
#include "core/weights.h"
#include "ops/mha_select.h"
#include "ops/ops.h"

/* ==== checking a candidate ==================================================================== */

double tune_tolerance(stof_dtype dtype) {
    return dtype == STOF_BF16 ? TUNE_TOL_BF16 : TUNE_TOL_F16;
}

int tune_check_output(const float *got, const float *ref, int64_t n, stof_dtype dtype,
                      exec_diff *d, stof_error *err) {
    exec_diff local;
    if (!d)
        d = &local;
    exec_compare(got, ref, n, d);
    double tol = tune_tolerance(dtype);
    if (d->n_nonfinite)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "wrong output: %lld of %lld values are NaN or infinite",
                       (long long)d->n_nonfinite, (long long)n);
    if (!(d->rel_error < tol))
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "wrong output: relative error %.2e against the CPU reference (tolerance "
                       "%.0e)", d->rel_error, tol);
    return STOF_OK;
}

void tune_tensor_values(const graph_tensor *t, uint64_t seed, float *out) {
    if (t->role == GRAPH_WEIGHT || t->role == GRAPH_INPUT) {
        weights_fill(t, seed, out);
        return;
    }
    /* an activation made by an earlier segment: values of the size a norm
     * or an attention output has */
    graph_tensor a = *t;
    a.init = GRAPH_INIT_UNIFORM;
    a.init_scale = 1.0f;
    weights_fill(&a, seed, out);
}

/* ---- the reference of a segment ------------------------------------------------------------ */

/* Ops whose output row r depends only on row r of their row inputs. */
static int row_wise_kind(op_kind k) {
    return k == OP_GEMM || k == OP_BIAS || k == OP_ADD || k == OP_LAYERNORM || k == OP_RMSNORM ||
           k == OP_GELU || k == OP_RELU || k == OP_SOFTMAX;
}

/* Input i of a row-wise op follows the output's rows (x, an add's operands)
 * rather than being a whole weight (W, bias, gain). */
static int row_input(const graph_op *op, int i) {
    return i == 0 || op->kind == OP_ADD;
}

static int64_t last_dim(const graph_tensor *t) {
    return t->shape[t->ndim - 1];
}

static int64_t rows_of(const graph_tensor *t) {
    int64_t n = last_dim(t);
    return n ? graph_tensor_numel(t) / n : 0;
}

static int produced_inside(const graph *g, int t, int first, int last) {
    int p = g->tensors[t].producer;
    return p >= first && p <= last;
}

/* Whether the segment's reference can be taken on a subset of rows: only
 * row-wise ops, every row input with the output's row count. */
static int rows_separable(const graph *g, int first, int last, int64_t m) {
    for (int k = first; k <= last; k++) {
        const graph_op *op = &g->ops[k];
        if (!row_wise_kind(op->kind))
            return 0;
        for (int i = 0; i < op->n_inputs; i++)
            if (row_input(op, i) && rows_of(&g->tensors[op->inputs[i]]) != m)
                return 0;
    }
    return 1;
}

void tune_reference_free(tune_reference *ref) {
    free(ref->rows);
    free(ref->out);
    free(ref->pre_norm);
    memset(ref, 0, sizeof *ref);
}

/* A tensor of the view with only the checked rows: [n_rows, row length]. */
static void view_rows(graph_tensor *t, int64_t n_rows) {
    int64_t len = last_dim(t);
    t->ndim = 2;
    memset(t->shape, 0, sizeof t->shape);
    t->shape[0] = n_rows;
    t->shape[1] = len;
}

/* The values of outside tensor t as the segment reads them: whole, or the
 * checked rows of it. */
static float *outside_values(const graph *g, int t, uint64_t seed, const tune_reference *ref,
                             int as_rows, stof_error *err) {
    const graph_tensor *x = &g->tensors[t];
    float *full = err_malloc(sizeof *full * (size_t)graph_tensor_numel(x), err);
    if (!full)
        return NULL;
    tune_tensor_values(x, seed, full);
    if (!as_rows)
        return full;
    int64_t len = last_dim(x);
    float *rows = err_malloc(sizeof *rows * (size_t)(ref->n_rows * len), err);
    for (int64_t r = 0; rows && r < ref->n_rows; r++)
        memcpy(rows + r * len, full + ref->rows[r] * len, sizeof *rows * (size_t)len);
    free(full);
    return rows;
}

/* Runs ops first..last of the view (g with the row tensors cut to the
 * checked rows) on val[] (per tensor; outside ones already there). */
static int run_ops(const graph *view, int first, int last, float **val, stof_error *err) {
    for (int k = first; k <= last; k++) {
        const graph_op *op = &view->ops[k];
        const float *in[GRAPH_MAX_INPUTS] = {0};
        for (int i = 0; i < op->n_inputs; i++)
            in[i] = val[op->inputs[i]];
        float *y = err_malloc(sizeof *y * (size_t)graph_tensor_numel(&view->tensors[op->output]),
                              err);
        if (!y)
            return STOF_ERR_NOMEM;
        val[op->output] = y;
        int rc = op_describe(op->kind)->ref(view, op, in, y, err);
        if (rc)
            return err_prefix(err, "CPU reference of op #%d '%s': ", k, op->name);
    }
    return STOF_OK;
}

static int choose_rows(const graph *g, int first, int last, tune_reference *ref,
                       stof_error *err) {
    const graph_tensor *y = &g->tensors[g->ops[last].output];
    int64_t m = rows_of(y);
    ref->row_len = last_dim(y);
    ref->n_rows = m;
    if (m <= TUNE_CHECK_ROWS || !rows_separable(g, first, last, m))
        return STOF_OK;
    ref->n_rows = TUNE_CHECK_ROWS;
    ref->rows = err_malloc(sizeof *ref->rows * TUNE_CHECK_ROWS, err);
    if (!ref->rows)
        return STOF_ERR_NOMEM;
    for (int64_t i = 0; i < TUNE_CHECK_ROWS; i++)
        ref->rows[i] = i * (m - 1) / (TUNE_CHECK_ROWS - 1);
    return STOF_OK;
}

int tune_reference_compute(const graph *g, int first, int last, int store_pre_norm,
                           uint64_t seed, tune_reference *ref, stof_error *err) {
    memset(ref, 0, sizeof *ref);
    if (first < 0 || last >= g->n_ops || first > last || (store_pre_norm && first == last))
        return err_set(err, STOF_ERR_INVALID, "ops #%d-#%d are not a segment of the graph", first,
                       last);
    *ref = (tune_reference){.first = first, .last = last, .store_pre_norm = store_pre_norm};
    double t0 = util_cpu_now();
    graph view = *g; /* shallow: only the tensors are its own */
    view.tensors = err_malloc(sizeof *view.tensors * (size_t)g->n_tensors, err);
    float **val = err_calloc((size_t)g->n_tensors, sizeof *val, err);
    int rc = view.tensors && val ? choose_rows(g, first, last, ref, err) : STOF_ERR_NOMEM;
    if (!rc)
        memcpy(view.tensors, g->tensors, sizeof *view.tensors * (size_t)g->n_tensors);
    for (int k = first; !rc && k <= last; k++) {
        const graph_op *op = &g->ops[k];
        for (int i = 0; !rc && i < op->n_inputs; i++) {
            int t = op->inputs[i];
            if (produced_inside(g, t, first, last) || val[t])
                continue;
            int as_rows = ref->rows && row_input(op, i);
            if (!(val[t] = outside_values(g, t, seed, ref, as_rows, err)))
                rc = STOF_ERR_NOMEM;
            else if (as_rows)
                view_rows(&view.tensors[t], ref->n_rows);
        }
        if (ref->rows)
            view_rows(&view.tensors[op->output], ref->n_rows);
    }
    if (!rc)
        rc = run_ops(&view, first, last, val, err);
    if (!rc) {
        int out = g->ops[last].output, pre = g->ops[last - (store_pre_norm != 0)].output;
        ref->out = val[out];
        val[out] = NULL;
        if (store_pre_norm) {
            ref->pre_norm = val[pre];
            val[pre] = NULL;
        }
    }
    for (int t = 0; val && t < g->n_tensors; t++)
        free(val[t]);
    free(val);
    free(view.tensors);
    ref->seconds = util_cpu_now() - t0;
    if (rc)
        tune_reference_free(ref);
    return rc;
}

int tune_reference_check(const tune_reference *ref, const float *full, int pre_norm,
                         stof_dtype dtype, exec_diff *d, stof_error *err) {
    const float *want = pre_norm ? ref->pre_norm : ref->out;
    int64_t n = ref->n_rows * ref->row_len;
    if (!want)
        return err_set(err, STOF_ERR_INVALID, "the reference has no %s",
                       pre_norm ? "pre-norm values" : "output");
    if (!ref->rows)
        return tune_check_output(full, want, n, dtype, d, err);
    float *got = err_malloc(sizeof *got * (size_t)n, err);
    if (!got)
        return STOF_ERR_NOMEM;
    for (int64_t r = 0; r < ref->n_rows; r++)
        memcpy(got + r * ref->row_len, full + ref->rows[r] * ref->row_len,
               sizeof *got * (size_t)ref->row_len);
    int rc = tune_check_output(got, want, n, dtype, d, err);
    free(got);
    return rc;
}

/* ==== the GPU backend ============================================================================ */

#define TUNE_REF_SLOTS 4
#define TUNE_MAX_REPS 64

/* The scratch tensors of the span measured last, n_copies times over. */
typedef struct tune_scratch {
    const graph *g;
    int first, last, pre_norm; /* first -1: empty */
    int n_copies;
    size_t copy_bytes;
    CUdeviceptr mem;
    CUdeviceptr *ptr;          /* [n_copies][g->n_tensors]: 0 for tensors not there */
} tune_scratch;

struct tune_backend {
    exec_ctx *ctx;
    const cuda_driver *drv;
    tune_backend_options opt;
    CUstream stream;
    CUevent ev[2];
    tune_scratch scratch;
    const graph *ref_graph;    /* of the references kept */
    tune_reference refs[TUNE_REF_SLOTS];
    int next_ref;
    tune_backend_stats stats;
    int rejected_now;          /* the setting being measured gave a wrong output */
    char problem[sizeof(((stof_error *)0)->msg)];
};

static int drv_check(tune_backend *b, CUresult r, const char *what, stof_error *err) {
    return cuda_check(b->drv, r, what, err);
}

static size_t align_up(size_t x) {
    return (x + EXEC_ALIGN - 1) / EXEC_ALIGN * EXEC_ALIGN;
}

static void scratch_release(tune_backend *b) {
    tune_scratch *s = &b->scratch;
    if (s->mem)
        b->drv->MemFree(s->mem);
    free(s->ptr);
    memset(s, 0, sizeof *s);
    s->first = -1;
}

/* The tensors a launch of segment s touches: inputs made outside it, its
 * result, the stored pre-norm value. Each once; returns the count. */
static int span_tensors(const graph *g, const exec_segment *s, int *list) {
    int n = 0, last = s->first + s->n - 1;
    for (int k = s->first; k <= last; k++) {
        const graph_op *op = &g->ops[k];
        for (int i = 0; i < op->n_inputs; i++) {
            int t = op->inputs[i], seen = 0;
            if (produced_inside(g, t, s->first, last))
                continue;
            for (int j = 0; j < n && !seen; j++)
                seen = list[j] == t;
            if (!seen)
                list[n++] = t;
        }
    }
    list[n++] = s->out;
    if (s->pre_norm >= 0)
        list[n++] = s->pre_norm;
    return n;
}

/* Copies rotated so that the next launch's data has left L2: together at
 * least twice L2, when one copy is smaller than it. */
static int copies_for(size_t bytes, int l2) {
    if (l2 <= 0 || bytes == 0 || bytes >= (size_t)l2)
        return 1;
    size_t n = (2 * (size_t)l2 + bytes - 1) / bytes + 1;
    if (n > TUNE_MAX_COPIES)
        n = TUNE_MAX_COPIES;
    if (n * bytes > TUNE_MAX_SCRATCH)
        n = TUNE_MAX_SCRATCH / bytes;
    return n < 1 ? 1 : (int)n;
}

/* Fills tensor t of copy c on the device (f16, bf16 or int32). */
static int upload_values(tune_backend *b, const graph_tensor *t, uint64_t seed, CUdeviceptr d,
                         float *f, void *staged, stof_error *err) {
    size_t n = (size_t)graph_tensor_numel(t);
    tune_tensor_values(t, seed, f);
    for (size_t i = 0; i < n; i++) {
        if (t->dtype == STOF_I32)
            ((int32_t *)staged)[i] = (int32_t)f[i];
        else if (t->dtype == STOF_BF16)
            ((uint16_t *)staged)[i] = util_f32_to_bf16(f[i]);
        else
            ((uint16_t *)staged)[i] = util_f32_to_f16(f[i]);
    }
    return drv_check(b, b->drv->MemcpyHtoD(d, staged, graph_tensor_bytes(t)), "cuMemcpyHtoD", err);
}

static int is_output_of(const exec_segment *s, int t) {
    return t == s->out || t == s->pre_norm;
}

/* The scratch of segment s: kept when it is the span measured last. */
static int scratch_prepare(tune_backend *b, const graph *g, const exec_segment *s,
                           stof_error *err) {
    tune_scratch *sc = &b->scratch;
    int last = s->first + s->n - 1;
    if (sc->mem && sc->g == g && sc->first == s->first && sc->last == last &&
        sc->pre_norm == s->pre_norm)
        return STOF_OK;
    scratch_release(b);
    int list[FUSION_MAX_OPS * GRAPH_MAX_INPUTS + 2];
    int n = span_tensors(g, s, list);
    size_t bytes = 0, most = 1;
    for (int i = 0; i < n; i++) {
        const graph_tensor *t = &g->tensors[list[i]];
        bytes += align_up(graph_tensor_bytes(t));
        if ((size_t)graph_tensor_numel(t) > most)
            most = (size_t)graph_tensor_numel(t);
    }
    int copies = copies_for(bytes, exec_ctx_device(b->ctx)->l2_bytes);
    sc->ptr = err_calloc((size_t)copies * (size_t)g->n_tensors, sizeof *sc->ptr, err);
    float *f = err_malloc(most * sizeof *f, err);
    void *staged = err_malloc(most * 4, err);
    int rc = sc->ptr && f && staged ? STOF_OK : STOF_ERR_NOMEM;
    if (!rc && (rc = drv_check(b, b->drv->MemAlloc(&sc->mem, bytes * (size_t)copies),
                               "cuMemAlloc", err)) != STOF_OK) {
        sc->mem = 0;
        err_prefix(err, "scratch tensors of %d copies of %.1f MiB: ", copies, bytes / 1048576.0);
    }
    for (int c = 0; !rc && c < copies; c++) {
        size_t at = (size_t)c * bytes;
        for (int i = 0; !rc && i < n; i++) {
            const graph_tensor *t = &g->tensors[list[i]];
            CUdeviceptr d = sc->mem + at;
            sc->ptr[(size_t)c * (size_t)g->n_tensors + (size_t)list[i]] = d;
            if (!is_output_of(s, list[i]))
                rc = upload_values(b, t, b->opt.seed + (uint64_t)c, d, f, staged, err);
            at += align_up(graph_tensor_bytes(t));
        }
    }
    free(f);
    free(staged);
    /* copies from pageable memory may still be in flight when cuMemcpyHtoD
     * returns, and the backend's stream does not wait for the legacy one */
    if (!rc)
        rc = drv_check(b, b->drv->CtxSynchronize(NULL), "cuCtxSynchronize", err);
    if (rc) {
        scratch_release(b);
        return rc;
    }
    sc->g = g;
    sc->first = s->first;
    sc->last = last;
    sc->pre_norm = s->pre_norm;
    sc->n_copies = copies;
    sc->copy_bytes = bytes;
    return STOF_OK;
}

int tune_backend_create(exec_ctx *ctx, const tune_backend_options *opt, tune_backend **out,
                        stof_error *err) {
    *out = NULL;
    tune_backend *b = err_calloc(1, sizeof *b, err);
    if (!b)
        return STOF_ERR_NOMEM;
    b->ctx = ctx;
    b->drv = ctx->drv;
    if (opt)
        b->opt = *opt;
    b->scratch.first = -1;
    int rc = drv_check(b, b->drv->CtxSetCurrent(ctx->gemm->cu), "cuCtxSetCurrent", err);
    if (!rc)
        rc = drv_check(b, b->drv->StreamCreate(&b->stream, CU_STREAM_NON_BLOCKING),
                       "cuStreamCreate", err);
    for (int k = 0; !rc && k < 2; k++)
        rc = drv_check(b, b->drv->EventCreate(&b->ev[k], CU_EVENT_DEFAULT), "cuEventCreate", err);
    if (rc) {
        tune_backend_free(b);
        return rc;
    }
    *out = b;
    return STOF_OK;
}

void tune_backend_free(tune_backend *b) {
    if (!b)
        return;
    b->drv->CtxSetCurrent(b->ctx->gemm->cu);
    if (b->stream)
        b->drv->StreamSynchronize(b->stream);
    scratch_release(b);
    for (int k = 0; k < 2; k++)
        if (b->ev[k])
            b->drv->EventDestroy(b->ev[k]);
    if (b->stream)
        b->drv->StreamDestroy(b->stream);
    for (int i = 0; i < TUNE_REF_SLOTS; i++)
        tune_reference_free(&b->refs[i]);
    free(b);
}

search_backend tune_backend_search(tune_backend *b) {
    return (search_backend){b, tune_backend_measure};
}

tune_backend_stats tune_backend_get_stats(const tune_backend *b) {
    return b->stats;
}

const char *tune_backend_last_problem(const tune_backend *b) {
    return b->problem;
}

/* ---- one measurement ------------------------------------------------------------------------- */

/* The executor's segment for a search segment and a setting. */
static void segment_of(const search_segment *seg, const int *values, exec_segment *s) {
    const graph *g = seg->g;
    const fusion_template *t = fusion_template_get(seg->tmpl);
    memset(s, 0, sizeof *s);
    s->first = seg->op_first;
    s->n = seg->op_last - seg->op_first + 1;
    s->match = *seg->match;
    s->tmpl = seg->tmpl;
    s->has_values = 1;
    memcpy(s->values, values, sizeof *values * (size_t)(t ? t->n_params : 0));
    s->out = g->ops[seg->op_last].output;
    s->pre_norm = s->match.store_pre_norm && s->n > 1 ? g->ops[seg->op_last - 1].output : -1;
}

/* A model that holds only what the launcher rows read: the context, the
 * graph and dtype, the scratch pointers of a copy, the stream. */
static void model_stub(tune_backend *b, const graph *g, exec_plan *xp, exec_model *m) {
    memset(xp, 0, sizeof *xp);
    xp->g = g;
    exec_model_dtype(g, &xp->dtype, NULL);
    memset(m, 0, sizeof *m);
    m->ctx = b->ctx;
    m->plan = xp;
    m->ptr = b->scratch.ptr;
    m->stream = b->stream;
    m->ev[0] = b->ev[0];
    m->ev[1] = b->ev[1];
}

static void use_copy(tune_backend *b, exec_model *m, int c) {
    m->ptr = b->scratch.ptr + (size_t)c * (size_t)b->scratch.g->n_tensors;
}

/* The reference of segment s, computed once and kept for its next settings. */
static int reference_of(tune_backend *b, const graph *g, const exec_segment *s,
                        const tune_reference **out, stof_error *err) {
    int last = s->first + s->n - 1, pre = s->pre_norm >= 0;
    if (b->ref_graph != g) {
        for (int i = 0; i < TUNE_REF_SLOTS; i++)
            tune_reference_free(&b->refs[i]);
        b->ref_graph = g;
    }
    for (int i = 0; i < TUNE_REF_SLOTS; i++) {
        const tune_reference *r = &b->refs[i];
        if (r->out && r->first == s->first && r->last == last && r->store_pre_norm == pre) {
            *out = r;
            return STOF_OK;
        }
    }
    tune_reference *r = &b->refs[b->next_ref];
    b->next_ref = (b->next_ref + 1) % TUNE_REF_SLOTS;
    tune_reference_free(r);
    int rc = tune_reference_compute(g, s->first, last, pre, b->opt.seed, r, err);
    if (rc)
        return rc;
    b->stats.references++;
    b->stats.reference_s += r->seconds;
    *out = r;
    return STOF_OK;
}

/* Tensor t of copy 0 as floats. */
static int download(tune_backend *b, const graph_tensor *t, CUdeviceptr d, float *out,
                    stof_error *err) {
    size_t n = (size_t)graph_tensor_numel(t);
    uint16_t *h = err_malloc(n * sizeof *h, err);
    if (!h)
        return STOF_ERR_NOMEM;
    int rc = drv_check(b, b->drv->MemcpyDtoH(h, d, n * sizeof *h), "cuMemcpyDtoH", err);
    for (size_t i = 0; !rc && i < n; i++)
        out[i] = t->dtype == STOF_BF16 ? util_bf16_to_f32(h[i]) : util_f16_to_f32(h[i]);
    free(h);
    return rc;
}

/* One launch on copy 0 compared with the CPU reference. Outputs are set to
 * NaN first: a kernel that writes nothing must not pass on the values an
 * earlier setting left there. */
static int check_setting(tune_backend *b, exec_model *m, const exec_segment *s,
                         const exec_seg_rt *rt, stof_error *err) {
    const graph *g = m->plan->g;
    int outs[2] = {s->out, s->pre_norm};
    use_copy(b, m, 0);
    int rc = STOF_OK;
    for (int k = 0; !rc && k < 2; k++)
        if (outs[k] >= 0)
            rc = drv_check(b, b->drv->MemsetD16Async(m->ptr[outs[k]], 0xffff,
                                                     (size_t)graph_tensor_numel(&g->tensors[outs[k]]),
                                                     b->stream),
                           "cuMemsetD16Async", err);
    if (!rc)
        rc = rt[0].launcher->launch(m, &rt[0], b->stream, err);
    if (!rc)
        rc = drv_check(b, b->drv->StreamSynchronize(b->stream), "cuStreamSynchronize", err);
    if (!rc && rt[0].launcher->status)
        rc = rt[0].launcher->status(m, &rt[0], err);
    const tune_reference *ref = NULL;
    if (!rc)
        rc = reference_of(b, g, s, &ref, err);
    for (int k = 0; !rc && k < 2; k++) {
        if (outs[k] < 0)
            continue;
        const graph_tensor *t = &g->tensors[outs[k]];
        float *got = err_malloc(sizeof *got * (size_t)graph_tensor_numel(t), err);
        rc = got ? download(b, t, m->ptr[outs[k]], got, err) : STOF_ERR_NOMEM;
        if (!rc)
            rc = tune_reference_check(ref, got, k, m->plan->dtype, NULL, err);
        free(got);
        if (rc == STOF_ERR_UNSUPPORTED) {
            b->rejected_now = 1;
            if (k)
                err_prefix(err, "the stored pre-norm values: ");
        }
    }
    return rc;
}

/* n launches rotating over the copies. */
static int launch_n(tune_backend *b, exec_model *m, const exec_seg_rt *rt, int n,
                    stof_error *err) {
    for (int i = 0; i < n; i++) {
        const exec_seg_rt *r = &rt[i % b->scratch.n_copies];
        int rc = r->launcher->launch(m, r, b->stream, err);
        if (rc)
            return rc;
    }
    return STOF_OK;
}

/* Milliseconds between two events around n launches (or one replay of ge). */
static int timed(tune_backend *b, exec_model *m, const exec_seg_rt *rt, int n, CUgraphExec ge,
                 double *ms, stof_error *err) {
    float t = 0;
    int rc = drv_check(b, b->drv->EventRecord(b->ev[0], b->stream), "cuEventRecord", err);
    if (!rc)
        rc = ge ? drv_check(b, b->drv->GraphLaunch(ge, b->stream), "cuGraphLaunch", err)
                : launch_n(b, m, rt, n, err);
    if (!rc)
        rc = drv_check(b, b->drv->EventRecord(b->ev[1], b->stream), "cuEventRecord", err);
    if (!rc)
        rc = drv_check(b, b->drv->EventSynchronize(b->ev[1]), "cuEventSynchronize", err);
    if (!rc)
        rc = drv_check(b, b->drv->EventElapsedTime(&t, b->ev[0], b->ev[1]),
                       "cuEventElapsedTime", err);
    *ms = t;
    return rc;
}

/* The n launches as one CUDA graph: back to back on the GPU, without the
 * CPU's launch rate in the way. NULL when capturing fails (timed eagerly). */
static CUgraphExec capture(tune_backend *b, exec_model *m, const exec_seg_rt *rt, int n,
                           CUgraph *captured) {
    *captured = NULL;
    if (b->drv->StreamBeginCapture(b->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) !=
        CUDA_SUCCESS)
        return NULL;
    int rc = launch_n(b, m, rt, n, NULL);
    CUgraph g = NULL;
    CUresult end = b->drv->StreamEndCapture(b->stream, &g);
    CUgraphExec ge = NULL;
    if (rc || end != CUDA_SUCCESS || !g ||
        b->drv->GraphInstantiate(&ge, g, 0) != CUDA_SUCCESS) {
        if (g)
            b->drv->GraphDestroy(g);
        return NULL;
    }
    *captured = g;
    return ge;
}

static int cmp_double(const void *a, const void *c) {
    double x = *(const double *)a, y = *(const double *)c;
    return x < y ? -1 : x > y;
}

/* Warm-up, a first estimate, then the median over reps runs of about
 * TUNE_RUN_MS each (per launch). */
static int time_setting(tune_backend *b, exec_model *m, const exec_seg_rt *rt, double *ms,
                        stof_error *err) {
    int copies = b->scratch.n_copies;
    double est;
    int rc = launch_n(b, m, rt, copies * TUNE_WARMUP, err);
    if (!rc)
        rc = timed(b, m, rt, copies, NULL, &est, err);
    if (rc)
        return rc;
    est /= copies;
    double want = est > 0 ? ceil(TUNE_RUN_MS / est) : TUNE_MAX_LAUNCHES;
    int n = want < TUNE_MAX_LAUNCHES ? (int)want : TUNE_MAX_LAUNCHES;
    n = (n + copies - 1) / copies * copies;
    CUgraph cg;
    CUgraphExec ge = capture(b, m, rt, n, &cg);
    int reps = b->opt.reps > 0 ? b->opt.reps : TUNE_REPS;
    reps = reps < TUNE_MAX_REPS ? reps : TUNE_MAX_REPS;
    double t[TUNE_MAX_REPS], warm;
    rc = timed(b, m, rt, n, ge, &warm, err);
    for (int r = 0; !rc && r < reps; r++) {
        rc = timed(b, m, rt, n, ge, &t[r], err);
        t[r] /= n;
    }
    if (ge)
        b->drv->GraphExecDestroy(ge);
    if (cg)
        b->drv->GraphDestroy(cg);
    if (rc)
        return rc;
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    *ms = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    return STOF_OK;
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
    snprintf(b->problem, sizeof b->problem, "%s", why->msg);
    return err_set(err, STOF_ERR_UNSUPPORTED, "%s", why->msg);
}

int tune_backend_measure(void *ud, const search_segment *seg, const int *values, double *ms,
                         stof_error *err) {
    tune_backend *b = ud;
    const graph *g = seg->g;
    *ms = 0;
    b->rejected_now = 0;
    exec_segment s;
    segment_of(seg, values, &s);
    stof_error why = {0};
    int rc = exec_segment_supports(g, s.first, s.n, &s.match, s.tmpl, &why);
    if (rc)
        return give_up(b, rc, &why, err);
    if ((rc = drv_check(b, b->drv->CtxSetCurrent(b->ctx->gemm->cu), "cuCtxSetCurrent", err)) ||
        (rc = scratch_prepare(b, g, &s, err)))
        return rc;
    exec_plan xp;
    exec_model m;
    model_stub(b, g, &xp, &m);
    const exec_launcher *l = exec_launcher_get(s.tmpl);
    exec_seg_rt rt[TUNE_MAX_COPIES];
    memset(rt, 0, sizeof rt);
    void *kplan = NULL;
    rc = l->plan(&m, &s, &kplan, &why);
    if (!rc) /* the kernel plan's tables, uploaded from pageable memory */
        rc = drv_check(b, b->drv->CtxSynchronize(NULL), "cuCtxSynchronize", &why);
    for (int c = 0; !rc && c < b->scratch.n_copies; c++) {
        rt[c].launcher = l;
        rt[c].kplan = kplan;
        use_copy(b, &m, c);
        rc = l->bind(&m, &s, &rt[c], &why);
    }
    if (!rc && !b->opt.no_check)
        rc = check_setting(b, &m, &s, rt, &why);
    if (!rc)
        rc = time_setting(b, &m, rt, ms, &why);
    if (kplan)
        l->free_plan(&m, kplan);
    if (rc)
        return give_up(b, rc, &why, err);
    b->stats.measured++;
    return STOF_OK;
}

/* ==== plans ======================================================================================= */

/* The executor's segment of graph ops first .. first + n - 1, matched. */
static int segment_at(const graph *g, int first, int n, exec_segment *s, stof_error *err) {
    int ops[FUSION_MAX_OPS];
    memset(s, 0, sizeof *s);
    for (int k = 0; k < n; k++)
        ops[k] = first + k;
    s->first = first;
    s->n = n;
    s->out = g->ops[first + n - 1].output;
    int rc = fusion_match_segment(g, ops, n, &s->match, err);
    s->pre_norm = !rc && s->match.store_pre_norm && n > 1 ? g->ops[first + n - 2].output : -1;
    return rc;
}

static exec_seq exec_seq_of(const search_sequence *q) {
    return (exec_seq){q->layer, q->firsts[0], q->n, 0};
}

int tune_initial_schemes(const graph *g, const search_sequence *seqs, int n_seqs,
                         int smem_limit, fusion_scheme *out, stof_error *err) {
    for (int q = 0; q < n_seqs; q++) {
        int ops[FUSION_MAX_OPS];
        for (int k = 0; k < seqs[q].n; k++)
            ops[k] = seqs[q].firsts[0] + k;
        search_rules rules = {0, smem_limit};
        exec_seq es = exec_seq_of(&seqs[q]);
        int rc = search_initial_scheme(g, ops, seqs[q].n, &rules, &out[q], err);
        if (!rc && exec_scheme_check(g, &es, &out[q], NULL) != STOF_OK)
            rc = exec_default_scheme(g, &es, &out[q], err);
        if (rc)
            return rc;
    }
    return STOF_OK;
}

static int exec_seq_at(const exec_seq *seqs, int n, int first) {
    for (int i = 0; i < n; i++)
        if (seqs[i].first == first)
            return i;
    return -1;
}

/* schemes[cls] for every class the plan's sequences cover. */
static int plan_schemes(const plan *p, const exec_seq *seqs, int n, fusion_scheme *schemes,
                        stof_error *err) {
    for (int q = 0; q < p->n_sequences; q++) {
        const plan_sequence *ps = &p->sequences[q];
        for (int k = 0; k < ps->n_instances; k++) {
            int i = exec_seq_at(seqs, n, ps->instances[k]);
            if (i < 0 || seqs[i].n != ps->n_ops)
                return err_set(err, STOF_ERR_MISMATCH,
                               "sequence %d of the plan (%d ops at #%d) is not a sequence of "
                               "the graph", q, ps->n_ops, ps->instances[k]);
            fusion_scheme *s = &schemes[seqs[i].cls];
            if (s->n == 0)
                *s = ps->scheme;
            else if (!fusion_scheme_same_segments(s, &ps->scheme))
                return err_set(err, STOF_ERR_MISMATCH,
                               "the plan gives identical layers two schemes (sequence %d)", q);
        }
    }
    return STOF_OK;
}

/* Each segment of the plan's sequences: its template and parameters. */
static int plan_choices(const plan *p, exec_plan *xp, stof_error *err) {
    for (int q = 0; q < p->n_sequences; q++) {
        const plan_sequence *ps = &p->sequences[q];
        int i = exec_seq_at(xp->seqs, xp->n_seqs, ps->instances[0]);
        for (int k = 0; k < ps->n_segments; k++) {
            int seg = -1;
            for (int j = 0; j < xp->n_segs && seg < 0; j++)
                if (xp->segs[j].seq == i && xp->segs[j].index == k)
                    seg = j;
            const plan_kernel *pk = &ps->segments[k].kernel;
            int rc = seg < 0 ? err_set(err, STOF_ERR_INTERNAL, "segment %d is not planned", k)
                             : exec_plan_set_choice(xp, seg, pk->tmpl, pk->values, err);
            if (rc)
                return err_prefix(err, "the plan's sequence %d, segment %d: ", q, k);
        }
    }
    return STOF_OK;
}

int tune_exec_plan(const plan *p, const graph *g, exec_plan **out, stof_error *err) {
    *out = NULL;
    exec_seq *seqs = NULL;
    int n = 0;
    int rc = exec_sequences(g, &seqs, &n, err);
    fusion_scheme *schemes = rc ? NULL : err_calloc((size_t)n, sizeof *schemes, err);
    if (!rc && !schemes)
        rc = STOF_ERR_NOMEM;
    if (!rc)
        rc = plan_schemes(p, seqs, n, schemes, err);
    if (!rc)
        rc = exec_plan_create(g, schemes, out, err);
    if (!rc && (rc = plan_choices(p, *out, err)) != STOF_OK) {
        exec_plan_free(*out);
        *out = NULL;
    }
    free(seqs);
    free(schemes);
    return rc;
}

int tune_time_model(exec_ctx *ctx, const exec_plan *xp, uint64_t seed, int reps,
                    double *eager_ms, double *graph_ms, float *output, stof_error *err) {
    exec_model *m = NULL;
    int rc = exec_model_create(ctx, xp, seed, &m, err);
    if (!rc)
        rc = exec_model_run(m, err);
    if (!rc && output)
        rc = exec_model_output(m, output, err);
    if (!rc && eager_ms)
        rc = exec_model_time(m, 0, reps, eager_ms, err);
    if (!rc)
        rc = exec_model_capture(m, err);
    if (!rc && graph_ms)
        rc = exec_model_time(m, 1, reps, graph_ms, err);
    exec_model_free(m);
    return rc;
}

/* ==== tuning on the GPU =========================================================================== */

static mha_device_limits device_limits(const stof_device_info *d, const char *arch) {
    return (mha_device_limits){d->sm_count, d->smem_per_sm, d->smem_per_block_optin,
                               d->max_warps_per_sm, 1024, arch};
}

/* A setting's time through the cache, measured when it is not there. */
static int measure_cached(tune_backend *b, search_cache *cache, const search_segment *view,
                          const int *values, double *ms, long *measured, stof_error *err) {
    char sig[SEARCH_SIG_MAX];
    search_segment_signature(view, sig, sizeof sig);
    int n = fusion_template_get(view->tmpl)->n_params;
    if (search_cache_lookup(cache, sig, values, n, ms))
        return STOF_OK;
    int rc = tune_backend_measure(b, view, values, ms, err);
    (*measured)++;
    if (rc == STOF_ERR_UNSUPPORTED)
        *ms = INFINITY;
    else if (rc)
        return rc;
    return search_cache_store(cache, sig, values, n, *ms, err);
}

static int is_attention(fusion_template_id t) {
    return t == FUSION_T_ATTENTION_ROW || t == FUSION_T_ATTENTION_BLOCK;
}

/* The settings a segment is also tried with after the search: the
 * executor's defaults for the search's template and for the executor's
 * own first choice; for attention the selector's best candidates. */
static int extra_candidates(const graph *g, exec_segment *s, const search_seg_result *sg,
                            const mha_device_limits *lim, int n_attention, exec_choice *out,
                            int cap, int *n, stof_error *err) {
    *n = 0;
    fusion_template_id tmpls[2] = {sg->tmpl, sg->tmpl};
    int n_tmpls = 1;
    if (exec_segment_template(g, s->first, s->n, &s->match, &tmpls[1], NULL) == STOF_OK &&
        tmpls[1] != sg->tmpl && !(is_attention(tmpls[1]) && is_attention(sg->tmpl)))
        n_tmpls = 2;
    for (int k = 0; k < n_tmpls && *n < cap; k++) {
        s->tmpl = tmpls[k];
        s->has_values = 0;
        s->auto_attention = is_attention(tmpls[k]);
        int got = 0;
        stof_error e = {0};
        int rc = exec_segment_candidates(g, s, lim, is_attention(tmpls[k]) ? n_attention : 0,
                                         out + *n, cap - *n, &got, &e);
        if (rc == STOF_ERR_NOMEM)
            return err_set(err, rc, "%s", e.msg);
        *n += rc ? 0 : got; /* a template without defaults offers none */
    }
    return STOF_OK;
}

typedef struct refine_ctx {
    const graph *g;
    const search_sequence *seqs;
    tune_backend *b;
    search_cache *cache;
    mha_device_limits lim;
    int n_attention;
    tune_outcome *res;
} refine_ctx;

static int refine_segment(refine_ctx *c, int q, search_seg_result *sg, stof_error *err) {
    const graph *g = c->g;
    exec_segment s;
    int rc = segment_at(g, c->seqs[q].firsts[0] + sg->first, sg->last - sg->first + 1, &s, err);
    exec_choice cand[2 + MHA_EXEC_MAX_MEASURED];
    int n = 0;
    if (!rc)
        rc = extra_candidates(g, &s, sg, &c->lim, c->n_attention, cand,
                              (int)(sizeof cand / sizeof cand[0]), &n, err);
    for (int k = 0; !rc && k < n; k++) {
        const fusion_template *t = fusion_template_get(cand[k].tmpl);
        if (!fusion_match_has(&s.match, cand[k].tmpl) ||
            (cand[k].tmpl == sg->tmpl &&
             memcmp(cand[k].values, sg->values, sizeof *sg->values * (size_t)t->n_params) == 0))
            continue;
        search_segment view = {g, q, sg->first, sg->last, s.first, s.first + s.n - 1,
                               cand[k].tmpl, &s.match, s.match.dims};
        double ms;
        rc = measure_cached(c->b, c->cache, &view, cand[k].values, &ms, &c->res->extra_measured,
                            err);
        if (!rc && ms < sg->ms) {
            sg->tmpl = cand[k].tmpl;
            sg->n_values = t->n_params;
            memset(sg->values, 0, sizeof sg->values);
            memcpy(sg->values, cand[k].values, sizeof *sg->values * (size_t)t->n_params);
            sg->ms = ms;
            c->res->improved++;
        }
    }
    return rc;
}

/* After the search: every segment's defaults and the selector's choices
 * compete with what the search found, so a plan never loses to the
 * executor's untuned choices for its own scheme. */
static int refine(refine_ctx *c, search_result *r, stof_error *err) {
    r->total_ms = 0;
    for (int q = 0; q < r->n_seqs; q++) {
        search_seq_result *sr = &r->seqs[q];
        sr->ms = 0;
        for (int k = 0; k < sr->n_segs; k++) {
            int rc = refine_segment(c, q, &sr->segs[k], err);
            if (rc)
                return rc;
            sr->ms += sr->segs[k].ms;
        }
        r->total_ms += sr->ms * c->seqs[q].count;
    }
    return STOF_OK;
}

static double graph_flops(const graph *g) {
    double sum = 0;
    for (int i = 0; i < g->n_ops; i++) {
        double f, bytes;
        op_cost(g, &g->ops[i], &f, &bytes);
        sum += f;
    }
    return sum;
}

/* The tuned plan and the all-unfused scheme end to end; the plan's output
 * against the CPU reference. */
static int end_to_end(exec_ctx *ctx, const graph *g, const tune_options *o, plan *p,
                      tune_outcome *res, stof_error *err) {
    int reps = o->reps > 0 ? o->reps : 20;
    int64_t n = graph_tensor_numel(&g->tensors[g->output]);
    exec_plan *tuned = NULL, *unfused = NULL;
    float *y = err_malloc(sizeof *y * (size_t)n, err), *ref = NULL;
    int rc = y ? tune_exec_plan(p, g, &tuned, err) : STOF_ERR_NOMEM;
    if (!rc)
        rc = tune_time_model(ctx, tuned, o->seed, reps, &res->eager_ms, &res->graph_ms, y, err);
    if (!rc)
        rc = exec_plan_create(g, NULL, &unfused, err);
    if (!rc)
        rc = tune_time_model(ctx, unfused, o->seed, reps, NULL, &res->unfused_ms, NULL, err);
    int check = o->check > 0 || (o->check == 0 && graph_flops(g) <= TUNE_CHECK_MAX_FLOPS);
    if (!rc && check && (rc = exec_reference(g, o->seed, &ref, err)) == STOF_OK) {
        exec_compare(y, ref, n, &res->diff);
        res->checked = 1;
        res->check_ok = res->diff.n_nonfinite == 0 &&
                        res->diff.rel_error < tune_tolerance(tuned->dtype);
    }
    if (!rc) {
        p->has_end_to_end = 1;
        p->end_to_end = (plan_end_to_end){res->graph_ms, res->eager_ms, res->unfused_ms};
    }
    exec_plan_free(tuned);
    exec_plan_free(unfused);
    free(y);
    free(ref);
    return rc;
}

typedef struct tune_state {
    search_sequence *seqs;
    int n_seqs;
    fusion_scheme *initial;
    tune_backend *backend;
    search_cache *cache;
    search_result result;
} tune_state;

static void tune_state_free(tune_state *t) {
    search_result_free(&t->result);
    search_cache_free(t->cache);
    tune_backend_free(t->backend);
    free(t->initial);
    search_sequences_free(t->seqs, t->n_seqs);
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

int tune_gpu(exec_ctx *ctx, const graph *g, const lua_api_script *script,
             const tune_options *opt, plan *out, tune_outcome *res, stof_error *err) {
    memset(out, 0, sizeof *out);
    memset(res, 0, sizeof *res);
    tune_options o = *opt;
    double t0 = util_now();
    const stof_device_info *dev = exec_ctx_device(ctx);
    tune_state t;
    memset(&t, 0, sizeof t);
    int rc = tune_setup(ctx, g, &o, &t, err);
    if (!rc) {
        search_backend backend = tune_backend_search(t.backend);
        search_options so = {.budget = o.budget, .time_limit_s = o.time_limit_s, .seed = o.seed,
                             .smem_limit = dev->smem_per_block_optin,
                             .initial = needs_given_start(g, t.seqs, t.n_seqs,
                                                          dev->smem_per_block_optin, t.initial)
                                            ? t.initial
                                            : NULL,
                             .cache = t.cache, .progress = o.progress, .cb_ud = o.ud};
        rc = search_run(g, t.seqs, t.n_seqs, &backend, &so, &t.result, err);
    }
    if (!rc) {
        refine_ctx rc_ctx = {g, t.seqs, t.backend, t.cache,
                             device_limits(dev, exec_ctx_arch(ctx)),
                             o.attention_candidates == 0 ? TUNE_ATTENTION_CANDIDATES
                             : o.attention_candidates < 0 ? 0 : o.attention_candidates,
                             res};
        rc = refine(&rc_ctx, &t.result, err);
    }
    if (!rc)
        rc = search_plan_fill(&t.result, g, t.seqs, script, dev, NULL, out, err);
    if (!rc) {
        res->search = t.result.stats;
        res->segments_ms = t.result.total_ms;
        out->stats.settings_measured += res->extra_measured;
        rc = end_to_end(ctx, g, &o, out, res, err);
    }
    if (t.backend)
        res->backend = tune_backend_get_stats(t.backend);
    res->seconds = util_now() - t0;
    out->tuning_s = res->seconds;
    if (!rc && res->checked && !res->check_ok)
        rc = err_set(err, STOF_ERR_INTERNAL,
                     "the tuned plan's output differs from the CPU reference (relative error "
                     "%.3e, %lld non-finite)", res->diff.rel_error,
                     (long long)res->diff.n_nonfinite);
    tune_state_free(&t);
    if (rc)
        plan_free(out);
    return rc;
}

/* ==== tuning offline ================================================================================ */

/* The starting schemes with every segment's default setting for lim. */
static int offline_result(const graph *g, const search_sequence *seqs, int n_seqs,
                          const fusion_scheme *schemes, const mha_device_limits *lim,
                          search_result *r, stof_error *err) {
    memset(r, 0, sizeof *r);
    r->seqs = err_calloc((size_t)n_seqs, sizeof *r->seqs, err);
    if (!r->seqs)
        return STOF_ERR_NOMEM;
    r->n_seqs = n_seqs;
    for (int q = 0; q < n_seqs; q++) {
        search_seq_result *sr = &r->seqs[q];
        fusion_segment spans[FUSION_MAX_OPS];
        int n = fusion_scheme_segments(&schemes[q], spans, FUSION_MAX_OPS);
        sr->scheme = schemes[q];
        fusion_scheme_canonical(&sr->scheme);
        if (!(sr->segs = err_calloc((size_t)n, sizeof *sr->segs, err)))
            return STOF_ERR_NOMEM;
        sr->n_segs = n;
        for (int k = 0; k < n; k++) {
            exec_segment s;
            exec_choice c;
            int got = 0;
            int rc = segment_at(g, seqs[q].firsts[0] + spans[k].first,
                                spans[k].last - spans[k].first + 1, &s, err);
            if (!rc)
                rc = exec_segment_template(g, s.first, s.n, &s.match, &s.tmpl, err);
            s.auto_attention = is_attention(s.tmpl);
            if (!rc)
                rc = exec_segment_candidates(g, &s, lim, 0, &c, 1, &got, err);
            if (rc)
                return rc;
            const fusion_template *t = fusion_template_get(c.tmpl);
            sr->segs[k] = (search_seg_result){spans[k].first, spans[k].last, c.tmpl,
                                              t->n_params, {0}, 0.0};
            memcpy(sr->segs[k].values, c.values, sizeof c.values);
        }
    }
    return STOF_OK;
}

/* Every kernel of the result (one per segment of each class) into cache. */
static int offline_compile(const graph *g, const search_sequence *seqs, const search_result *r,
                           const mha_device_limits *lim, nvrtc_cache *cache, stof_error *err) {
    for (int q = 0; q < r->n_seqs; q++)
        for (int k = 0; k < r->seqs[q].n_segs; k++) {
            const search_seg_result *sg = &r->seqs[q].segs[k];
            exec_segment s;
            int rc = segment_at(g, seqs[q].firsts[0] + sg->first, sg->last - sg->first + 1, &s,
                                err);
            s.tmpl = sg->tmpl;
            s.has_values = 1;
            memcpy(s.values, sg->values, sizeof s.values);
            if (!rc)
                rc = exec_segment_compile(g, &s, lim, cache, err);
            if (rc)
                return err_prefix(err, "compiling ops #%d-#%d for %s: ", s.first,
                                  s.first + s.n - 1, lim->arch);
        }
    return STOF_OK;
}

int tune_offline(const graph *g, const lua_api_script *script, const char *arch,
                 const char *nvrtc_dir, plan *out, tune_offline_stats *st, stof_error *err) {
    memset(out, 0, sizeof *out);
    memset(st, 0, sizeof *st);
    double t0 = util_now();
    mha_device_limits lim;
    stof_dtype dtype;
    search_sequence *seqs = NULL;
    int n_seqs = 0;
    fusion_scheme *schemes = NULL;
    search_result r;
    memset(&r, 0, sizeof r);
    nvrtc_cache cache;
    nvrtc_cache_init(&cache, nvrtc_dir);
    int rc = mha_limits_for_arch(arch, &lim, err);
    if (!rc)
        rc = exec_model_dtype(g, &dtype, err);
    if (!rc)
        rc = search_sequences_from_graph(g, &seqs, &n_seqs, err);
    if (!rc && !(schemes = err_calloc((size_t)n_seqs, sizeof *schemes, err)))
        rc = STOF_ERR_NOMEM;
    if (!rc)
        rc = tune_initial_schemes(g, seqs, n_seqs, lim.smem_per_block, schemes, err);
    if (!rc)
        rc = offline_result(g, seqs, n_seqs, schemes, &lim, &r, err);
    if (!rc)
        rc = search_plan_fill(&r, g, seqs, script, NULL, arch, out, err);
    if (!rc)
        rc = offline_compile(g, seqs, &r, &lim, &cache, err);
    st->compiled = cache.compiled;
    st->disk_hits = cache.disk_hits;
    st->memory_hits = cache.memory_hits;
    st->kernels = cache.compiled + cache.disk_hits + cache.memory_hits;
    st->seconds = util_now() - t0;
    nvrtc_cache_free(&cache);
    search_result_free(&r);
    free(schemes);
    search_sequences_free(seqs, n_seqs);
    if (rc)
        plan_free(out);
    return rc;
}
