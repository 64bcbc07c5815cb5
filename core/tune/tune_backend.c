/* The auto-tuner (tune_backend.h): checking a candidate's output, the GPU
 * measurement backend of the search, plans to executor plans, tuning on
 * the GPU and offline. */
#include "core/tune/tune_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/exec/exec_impl.h"
#include "core/gpu/kernels.h"
#include "core/base/memo.h"
#include "core/gpu/nvrtc.h"
#include "core/base/task_pool.h"
#include "core/base/util.h"
#include "core/io/weights.h"
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

/* ---- values kept for reuse ------------------------------------------------------------------ */

/* What a tensor's values are made from (tune_tensor_values): a tensor
 * changed in the graph has other values, under another key. */
static uint64_t tensor_identity(const graph_tensor *x) {
    uint64_t h = util_hash_str(UTIL_HASH_SEED, x->name);
    h = util_hash(h, &x->role, sizeof x->role);
    h = util_hash(h, &x->dtype, sizeof x->dtype);
    h = util_hash(h, x->shape, sizeof *x->shape * (size_t)x->ndim);
    h = util_hash(h, &x->init, sizeof x->init);
    h = util_hash(h, &x->init_scale, sizeof x->init_scale);
    return util_hash(h, &x->init_high, sizeof x->init_high);
}

/* The values of tensor t of copy c (seed + c) in a memo of values. */
static uint64_t value_key(const graph *g, int t, int copy) {
    uint64_t h = tensor_identity(&g->tensors[t]);
    h = util_hash(h, &t, sizeof t);
    return util_hash(h, &copy, sizeof copy);
}

typedef struct value_make {
    const graph *g;
    int t;
    uint64_t seed; /* the copy's */
} value_make;

static int make_values(void *arg, void **value, size_t *bytes, stof_error *err) {
    const value_make *vm = arg;
    const graph_tensor *t = &vm->g->tensors[vm->t];
    size_t n = (size_t)graph_tensor_numel(t);
    float *f = err_malloc(sizeof *f * (n ? n : 1), err);
    if (!f)
        return STOF_ERR_NOMEM;
    tune_tensor_values(t, vm->seed, f);
    *value = f;
    *bytes = sizeof *f * n;
    return STOF_OK;
}

/* Where a reference gets the values of its inputs, and threads for the
 * whole-output ops. */
typedef struct ref_source {
    uint64_t seed;
    memo *values;    /* NULL: made for this reference alone */
    task_pool *pool; /* NULL: attention on the caller's thread */
} ref_source;

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

/* The checked rows of a whole tensor x, malloc'd. */
static float *rows_of_values(const graph_tensor *x, const float *full, const tune_reference *ref,
                             stof_error *err) {
    int64_t len = last_dim(x);
    float *rows = err_malloc(sizeof *rows * (size_t)(ref->n_rows * len), err);
    for (int64_t r = 0; rows && r < ref->n_rows; r++)
        memcpy(rows + r * len, full + ref->rows[r] * len, sizeof *rows * (size_t)len);
    return rows;
}

/* The values of outside tensor t as the segment reads them, into *out:
 * whole, or the checked rows of it. Whole values from src->values are
 * borrowed (*pinned set: memo_unpin them); anything else is the caller's to
 * free. */
static int outside_values(const graph *g, int t, const ref_source *src,
                          const tune_reference *ref, int as_rows, float **out, int *pinned,
                          stof_error *err) {
    const graph_tensor *x = &g->tensors[t];
    *pinned = 0;
    *out = NULL;
    float *full = NULL;
    if (src->values) {
        value_make vm = {g, t, src->seed};
        void *v;
        int rc = memo_get(src->values, value_key(g, t, 0), make_values, &vm, &v, err);
        if (rc)
            return rc;
        full = v;
    } else if ((full = err_malloc(sizeof *full * (size_t)graph_tensor_numel(x), err)) != NULL) {
        tune_tensor_values(x, src->seed, full);
    } else {
        return STOF_ERR_NOMEM;
    }
    if (!as_rows) {
        *out = full;
        *pinned = src->values != NULL;
        return STOF_OK;
    }
    *out = rows_of_values(x, full, ref, err);
    if (src->values)
        memo_unpin(src->values, value_key(g, t, 0));
    else
        free(full);
    return *out ? STOF_OK : STOF_ERR_NOMEM;
}

/* Attention's rows in slices on the pool (its reference is the one that
 * costs seconds: every row, every head). */
#define TUNE_ATTENTION_SLICES_PER_THREAD 4

typedef struct attention_slices {
    const graph *g;
    const graph_op *op;
    const float *const *in;
    float *out;
    const int64_t *picks; /* the output's rows (NULL: row i is i) */
    int64_t rows, row_len;
    int n;
    int *rc;
    stof_error *errs;
} attention_slices;

/* Output rows [lo, hi) of slice k: consecutive query rows, or picked ones
 * one at a time. */
static void attention_slice(void *arg, int k) {
    attention_slices *a = arg;
    int64_t lo = a->rows * k / a->n, hi = a->rows * (k + 1) / a->n;
    if (!a->picks) {
        a->rc[k] = ops_attention_ref_rows(a->g, a->op, a->in, lo, hi - lo,
                                          a->out + lo * a->row_len, &a->errs[k]);
        return;
    }
    a->rc[k] = STOF_OK;
    for (int64_t i = lo; i < hi && a->rc[k] == STOF_OK; i++)
        a->rc[k] = ops_attention_ref_rows(a->g, a->op, a->in, a->picks[i], 1,
                                          a->out + i * a->row_len, &a->errs[k]);
}

/* The attention op's output rows into out: every row, or the n_picks rows
 * picks[] (out then holds n_picks rows), in slices on the pool. */
static int attention_parallel(const graph *g, const graph_op *op, const float *const *in,
                              const int64_t *picks, int64_t n_picks, float *out,
                              task_pool *pool, stof_error *err) {
    const graph_tensor *y = &g->tensors[op->output];
    int64_t row_len = last_dim(y), rows = picks ? n_picks : row_len ? rows_of(y) : 0;
    int n = pool ? task_pool_threads(pool) * TUNE_ATTENTION_SLICES_PER_THREAD : 1;
    n = rows < n ? (int)rows : n;
    if (n <= 1 && !picks)
        return op_describe(op->kind)->ref(g, op, in, out, err);
    if (n < 1)
        return STOF_OK;
    int *rc = err_calloc((size_t)n, sizeof *rc, err);
    stof_error *errs = err_calloc((size_t)n, sizeof *errs, err);
    int result = rc && errs ? STOF_OK : STOF_ERR_NOMEM;
    if (!result) {
        attention_slices a = {g, op, in, out, picks, rows, row_len, n, rc, errs};
        if (pool)
            task_pool_parallel_for(pool, n, attention_slice, &a);
        else
            for (int k = 0; k < n; k++)
                attention_slice(&a, k);
        for (int k = 0; k < n && !result; k++)
            if ((result = rc[k]) != STOF_OK && err)
                *err = errs[k];
    }
    free(rc);
    free(errs);
    return result;
}

/* Runs ops first..last of the view (g with the row tensors cut to the
 * checked rows; a lone attention op's tensors whole, its checked rows
 * computed alone) on val[] (per tensor; outside ones already there). */
static int run_ops(const graph *view, const tune_reference *ref, float **val, task_pool *pool,
                   stof_error *err) {
    for (int k = ref->first; k <= ref->last; k++) {
        const graph_op *op = &view->ops[k];
        const float *in[GRAPH_MAX_INPUTS] = {0};
        for (int i = 0; i < op->n_inputs; i++)
            in[i] = val[op->inputs[i]];
        const int picked = op->kind == OP_ATTENTION && ref->rows;
        int64_t numel = picked ? ref->n_rows * ref->row_len
                               : graph_tensor_numel(&view->tensors[op->output]);
        float *y = err_malloc(sizeof *y * (size_t)numel, err);
        if (!y)
            return STOF_ERR_NOMEM;
        val[op->output] = y;
        int rc = op->kind == OP_ATTENTION && (pool || picked)
                     ? attention_parallel(view, op, in, ref->rows, ref->n_rows, y, pool, err)
                     : op_describe(op->kind)->ref(view, op, in, y, err);
        if (rc)
            return err_prefix(err, "CPU reference of op #%d '%s': ", k, op->name);
    }
    return STOF_OK;
}

void tune_check_rows(int64_t m, int64_t n, int64_t *rows) {
    for (int64_t i = 0; i < n; i++) {
        int64_t lo = i * m / n, width = (i + 1) * m / n - lo;
        rows[i] = lo + (i * 37) % width;
    }
    rows[0] = 0;
    rows[n - 1] = m - 1;
}

/* A lone attention op: its rows are query positions, each computed from
 * every key (ops_attention_ref_rows), so a subset of them costs that share
 * of the whole. */
static int lone_attention(const graph *g, int first, int last) {
    return first == last && g->ops[first].kind == OP_ATTENTION;
}

static int choose_rows(const graph *g, int first, int last, tune_reference *ref,
                       stof_error *err) {
    const graph_tensor *y = &g->tensors[g->ops[last].output];
    int64_t m = rows_of(y);
    ref->row_len = last_dim(y);
    ref->n_rows = m;
    int64_t n = lone_attention(g, first, last)    ? TUNE_ATTENTION_CHECK_ROWS
                : rows_separable(g, first, last, m) ? TUNE_CHECK_ROWS
                                                    : m;
    if (m <= n)
        return STOF_OK;
    ref->n_rows = n;
    ref->rows = err_malloc(sizeof *ref->rows * (size_t)n, err);
    if (!ref->rows)
        return STOF_ERR_NOMEM;
    tune_check_rows(m, n, ref->rows);
    return STOF_OK;
}

/* The outside inputs of ops first..last into val[] (borrowed ones marked
 * in pinned[]), the view's row tensors cut to the checked rows. */
static int gather_inputs(const graph *g, graph *view, const ref_source *src,
                         const tune_reference *ref, float **val, int *pinned, stof_error *err) {
    for (int k = ref->first; k <= ref->last; k++) {
        const graph_op *op = &g->ops[k];
        for (int i = 0; i < op->n_inputs; i++) {
            int t = op->inputs[i];
            if (produced_inside(g, t, ref->first, ref->last) || val[t])
                continue;
            /* attention reads every key of its checked rows: whole inputs */
            int as_rows = ref->rows && row_input(op, i) && op->kind != OP_ATTENTION;
            int rc = outside_values(g, t, src, ref, as_rows, &val[t], &pinned[t], err);
            if (rc)
                return rc;
            if (as_rows)
                view_rows(&view->tensors[t], ref->n_rows);
        }
        if (ref->rows && op->kind != OP_ATTENTION)
            view_rows(&view->tensors[op->output], ref->n_rows);
    }
    return STOF_OK;
}

static int reference_compute(const graph *g, int first, int last, int store_pre_norm,
                             const ref_source *src, tune_reference *ref, stof_error *err) {
    memset(ref, 0, sizeof *ref);
    if (first < 0 || last >= g->n_ops || first > last || (store_pre_norm && first == last))
        return err_set(err, STOF_ERR_INVALID, "ops #%d-#%d are not a segment of the graph", first,
                       last);
    *ref = (tune_reference){.first = first, .last = last, .store_pre_norm = store_pre_norm};
    double t0 = util_now();
    graph view = *g; /* shallow: only the tensors are its own */
    view.tensors = err_malloc(sizeof *view.tensors * (size_t)g->n_tensors, err);
    float **val = err_calloc((size_t)g->n_tensors, sizeof *val, err);
    int *pinned = err_calloc((size_t)g->n_tensors, sizeof *pinned, err);
    int rc = view.tensors && val && pinned ? choose_rows(g, first, last, ref, err)
                                           : STOF_ERR_NOMEM;
    if (!rc) {
        memcpy(view.tensors, g->tensors, sizeof *view.tensors * (size_t)g->n_tensors);
        rc = gather_inputs(g, &view, src, ref, val, pinned, err);
    }
    if (!rc)
        rc = run_ops(&view, ref, val, src->pool, err);
    if (!rc) {
        int out = g->ops[last].output, pre = g->ops[last - (store_pre_norm != 0)].output;
        ref->out = val[out];
        val[out] = NULL;
        if (store_pre_norm) {
            ref->pre_norm = val[pre];
            val[pre] = NULL;
        }
    }
    for (int t = 0; val && pinned && t < g->n_tensors; t++) {
        if (pinned[t])
            memo_unpin(src->values, value_key(g, t, 0));
        else
            free(val[t]);
    }
    free(pinned);
    free(val);
    free(view.tensors);
    ref->seconds = util_now() - t0;
    if (rc)
        tune_reference_free(ref);
    return rc;
}

int tune_reference_compute(const graph *g, int first, int last, int store_pre_norm,
                           uint64_t seed, tune_reference *ref, stof_error *err) {
    ref_source src = {seed, NULL, NULL};
    return reference_compute(g, first, last, store_pre_norm, &src, ref, err);
}

/* Bytes a reference holds. */
static size_t reference_bytes(const tune_reference *ref) {
    size_t n = (size_t)(ref->n_rows * ref->row_len) * sizeof(float);
    return n * (ref->pre_norm ? 2 : 1) + (ref->rows ? (size_t)ref->n_rows * sizeof *ref->rows : 0);
}

/* got: the reference's rows of the output (or of the pre-norm values), as
 * it holds them. */
static int reference_compare(const tune_reference *ref, const float *got, int pre_norm,
                             stof_dtype dtype, exec_diff *d, stof_error *err) {
    const float *want = pre_norm ? ref->pre_norm : ref->out;
    if (!want)
        return err_set(err, STOF_ERR_INVALID, "the reference has no %s",
                       pre_norm ? "pre-norm values" : "output");
    return tune_check_output(got, want, ref->n_rows * ref->row_len, dtype, d, err);
}

int tune_reference_check(const tune_reference *ref, const float *full, int pre_norm,
                         stof_dtype dtype, exec_diff *d, stof_error *err) {
    if (!ref->rows)
        return reference_compare(ref, full, pre_norm, dtype, d, err);
    int64_t n = ref->n_rows * ref->row_len;
    float *got = err_malloc(sizeof *got * (size_t)n, err);
    if (!got)
        return STOF_ERR_NOMEM;
    for (int64_t r = 0; r < ref->n_rows; r++)
        memcpy(got + r * ref->row_len, full + ref->rows[r] * ref->row_len,
               sizeof *got * (size_t)ref->row_len);
    int rc = reference_compare(ref, got, pre_norm, dtype, d, err);
    free(got);
    return rc;
}

/* ==== the GPU backend ========================================================================= */

#define TUNE_MAX_REPS 64

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
    CUevent ev[2];
    task_pool *pool;           /* works ahead of the measurements */
    char arch[16];
    mha_device_limits lim;     /* of the kernel plans (lim.arch is arch) */
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
    char problem[sizeof(((stof_error *)0)->msg)];
};

static int drv_check(tune_backend *b, CUresult r, const char *what, stof_error *err) {
    return cuda_check(b->drv, r, what, err);
}

static size_t align_up(size_t x) {
    return (x + EXEC_ALIGN - 1) / EXEC_ALIGN * EXEC_ALIGN;
}

/* ---- what is kept between settings ---------------------------------------------------------- */

static uint64_t span_key(int first, int last, int pre_norm) {
    return (uint64_t)(uint32_t)first | (uint64_t)(uint32_t)last << 24 |
           (uint64_t)(pre_norm != 0) << 48;
}

static void reference_value_free(void *value) {
    tune_reference_free(value);
    free(value);
}

static void scratch_free_one(tune_backend *b, tune_scratch *sc) {
    if (sc->mem)
        b->drv->MemFree(sc->mem);
    free(sc->ptr);
    b->scratch_bytes -= sc->bytes;
}

static void scratch_drop_all(tune_backend *b) {
    for (int i = 0; i < b->n_scratch; i++)
        scratch_free_one(b, &b->scratch[i]);
    b->n_scratch = 0;
    b->cur = -1;
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

/* What is kept belongs to g: another graph starts afresh. */
static int use_graph(tune_backend *b, const graph *g, stof_error *err) {
    if (b->g == g && b->values && b->refs)
        return STOF_OK;
    kept_free(b);
    b->drv->CtxSetCurrent(b->ctx->gemm->cu);
    scratch_drop_all(b);
    b->g = g;
    int rc = memo_create(TUNE_VALUES_KEEP, free, &b->values, err);
    if (!rc)
        rc = memo_create(TUNE_REFERENCES_KEEP, reference_value_free, &b->refs, err);
    return rc;
}

void tune_backend_trim(tune_backend *b) {
    kept_free(b);
    b->drv->CtxSetCurrent(b->ctx->gemm->cu);
    scratch_drop_all(b);
    b->g = NULL;
}

/* ---- scratch tensors ------------------------------------------------------------------------- */

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

static int is_output_of(const exec_segment *s, int t) {
    return t == s->out || t == s->pre_norm;
}

/* The tensors of segment s (list, *n), one copy's bytes, the copies. */
typedef struct span_layout {
    int list[FUSION_MAX_OPS * GRAPH_MAX_INPUTS + 2];
    int n;
    size_t copy_bytes;
    int copies;
    uint64_t inputs; /* the identities of the tensors (tensor_identity) */
} span_layout;

static void layout_of(const tune_backend *b, const graph *g, const exec_segment *s,
                      span_layout *l) {
    l->n = span_tensors(g, s, l->list);
    l->copy_bytes = 0;
    l->inputs = UTIL_HASH_SEED;
    for (int i = 0; i < l->n; i++) {
        const graph_tensor *x = &g->tensors[l->list[i]];
        uint64_t id = tensor_identity(x);
        l->copy_bytes += align_up(graph_tensor_bytes(x));
        l->inputs = util_hash(l->inputs, &id, sizeof id);
    }
    l->copies = copies_for(l->copy_bytes, exec_ctx_device(b->ctx)->l2_bytes);
}

/* float -> the tensor's element type, in slices on the pool. */
typedef struct stage_job {
    const float *f;
    void *staged;
    stof_dtype dtype;
    size_t n;
    int slices;
} stage_job;

#define TUNE_STAGE_SLICE ((size_t)1 << 20)

static void stage_slice(void *arg, int k) {
    const stage_job *j = arg;
    size_t lo = j->n * (size_t)k / (size_t)j->slices;
    size_t hi = j->n * (size_t)(k + 1) / (size_t)j->slices;
    for (size_t i = lo; i < hi; i++) {
        if (j->dtype == STOF_I32)
            ((int32_t *)j->staged)[i] = (int32_t)j->f[i];
        else if (j->dtype == STOF_BF16)
            ((uint16_t *)j->staged)[i] = util_f32_to_bf16(j->f[i]);
        else
            ((uint16_t *)j->staged)[i] = util_f32_to_f16(j->f[i]);
    }
}

/* Fills tensor t of copy c on the device (f16, bf16 or int32) from the
 * values kept (computed now when nobody did ahead). */
static int upload_tensor(tune_backend *b, const graph *g, int t, int copy, CUdeviceptr d,
                         void *staged, stof_error *err) {
    const graph_tensor *x = &g->tensors[t];
    value_make vm = {g, t, b->opt.seed + (uint64_t)copy};
    uint64_t key = value_key(g, t, copy);
    void *v;
    int rc = memo_get(b->values, key, make_values, &vm, &v, err);
    if (rc)
        return rc;
    size_t n = (size_t)graph_tensor_numel(x);
    size_t slices = (n + TUNE_STAGE_SLICE - 1) / TUNE_STAGE_SLICE;
    stage_job j = {v, staged, x->dtype, n, slices ? (int)slices : 1};
    task_pool_parallel_for(b->pool, j.slices, stage_slice, &j);
    memo_unpin(b->values, key);
    return drv_check(b, b->drv->MemcpyHtoD(d, staged, graph_tensor_bytes(x)), "cuMemcpyHtoD", err);
}

/* Every input of every copy uploaded; outputs left as they are. */
static int scratch_fill(tune_backend *b, const graph *g, const exec_segment *s,
                        const span_layout *l, tune_scratch *sc, stof_error *err) {
    size_t most = 1;
    for (int i = 0; i < l->n; i++)
        if ((size_t)graph_tensor_numel(&g->tensors[l->list[i]]) > most)
            most = (size_t)graph_tensor_numel(&g->tensors[l->list[i]]);
    void *staged = err_malloc(most * 4, err);
    int rc = staged ? STOF_OK : STOF_ERR_NOMEM;
    for (int c = 0; !rc && c < sc->n_copies; c++) {
        size_t at = (size_t)c * l->copy_bytes;
        for (int i = 0; !rc && i < l->n; i++) {
            CUdeviceptr d = sc->mem + at;
            sc->ptr[(size_t)c * (size_t)g->n_tensors + (size_t)l->list[i]] = d;
            if (!is_output_of(s, l->list[i]))
                rc = upload_tensor(b, g, l->list[i], c, d, staged, err);
            at += align_up(graph_tensor_bytes(&g->tensors[l->list[i]]));
        }
    }
    free(staged);
    /* copies from pageable memory may still be in flight when cuMemcpyHtoD
     * returns, and the backend's stream does not wait for the legacy one */
    return rc ? rc : drv_check(b, b->drv->CtxSynchronize(NULL), "cuCtxSynchronize", err);
}

/* The least recently used span other than the current one; -1 none. */
static int scratch_victim(const tune_backend *b) {
    int v = -1;
    for (int i = 0; i < b->n_scratch; i++)
        if (i != b->cur && (v < 0 || b->scratch[i].used < b->scratch[v].used))
            v = i;
    return v;
}

static void scratch_evict(tune_backend *b, int i) {
    scratch_free_one(b, &b->scratch[i]);
    b->scratch[i] = b->scratch[--b->n_scratch];
    if (b->cur == b->n_scratch)
        b->cur = i;
}

/* Keeps the spans kept plus `bytes` within scratch_keep. */
static void scratch_make_room(tune_backend *b, size_t bytes) {
    int v;
    while (b->scratch_bytes + bytes > b->scratch_keep && (v = scratch_victim(b)) >= 0)
        scratch_evict(b, v);
}

static int scratch_alloc(tune_backend *b, tune_scratch *sc, stof_error *err) {
    CUresult r = b->drv->MemAlloc(&sc->mem, sc->bytes);
    if (r == CUDA_ERROR_OUT_OF_MEMORY && b->n_scratch > 0) {
        b->cur = -1; /* every span kept goes: the new one must fit */
        scratch_drop_all(b);
        r = b->drv->MemAlloc(&sc->mem, sc->bytes);
    }
    if (r != CUDA_SUCCESS) {
        sc->mem = 0;
        drv_check(b, r, "cuMemAlloc", err);
        return err_prefix(err, "scratch tensors of %d copies of %.1f MiB: ", sc->n_copies,
                          (double)sc->bytes / sc->n_copies / 1048576.0);
    }
    return STOF_OK;
}

/* A new span on the device, appended to the kept ones. */
static int scratch_new(tune_backend *b, const graph *g, const exec_segment *s,
                       stof_error *err) {
    span_layout l;
    layout_of(b, g, s, &l);
    tune_scratch sc = {s->first, s->first + s->n - 1, s->pre_norm, l.inputs, l.copies,
                       l.copy_bytes * (size_t)l.copies, 0, NULL, 0};
    if (b->n_scratch == b->cap_scratch) {
        int cap = b->cap_scratch ? 2 * b->cap_scratch : 8;
        tune_scratch *grown = err_realloc(b->scratch, sizeof *grown * (size_t)cap, err);
        if (!grown)
            return STOF_ERR_NOMEM;
        b->scratch = grown;
        b->cap_scratch = cap;
    }
    scratch_make_room(b, sc.bytes);
    sc.ptr = err_calloc((size_t)sc.n_copies * (size_t)g->n_tensors, sizeof *sc.ptr, err);
    int rc = sc.ptr ? scratch_alloc(b, &sc, err) : STOF_ERR_NOMEM;
    b->scratch_bytes += sc.bytes;
    if (!rc)
        rc = scratch_fill(b, g, s, &l, &sc, err);
    if (rc) {
        scratch_free_one(b, &sc);
        return rc;
    }
    b->scratch[b->n_scratch] = sc;
    b->cur = b->n_scratch++;
    return STOF_OK;
}

static int scratch_find(const tune_backend *b, const exec_segment *s) {
    int last = s->first + s->n - 1;
    for (int i = 0; i < b->n_scratch; i++) {
        const tune_scratch *sc = &b->scratch[i];
        if (sc->first == s->first && sc->last == last && sc->pre_norm == s->pre_norm)
            return i;
    }
    return -1;
}

/* The scratch of segment s becomes current: kept from before, or made
 * (anew when a tensor changed since). */
static int scratch_prepare(tune_backend *b, const graph *g, const exec_segment *s,
                           stof_error *err) {
    int i = scratch_find(b, s);
    int rc = STOF_OK;
    if (i >= 0) {
        span_layout l;
        layout_of(b, g, s, &l);
        if (l.inputs != b->scratch[i].inputs) {
            b->cur = -1;
            scratch_evict(b, i);
            i = -1;
        }
    }
    if (i >= 0) {
        b->cur = i;
        b->stats.scratch_kept++;
    } else {
        double t0 = util_now();
        b->cur = -1; /* the span measured last may go to make room */
        rc = scratch_new(b, g, s, err);
        b->stats.scratch_s += util_now() - t0;
        b->stats.scratch_new++;
    }
    if (!rc)
        b->scratch[b->cur].used = ++b->tick;
    return rc;
}

static const tune_scratch *current(const tune_backend *b) {
    return &b->scratch[b->cur];
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
    b->drv = ctx->drv;
    if (opt)
        b->opt = *opt;
    b->cur = -1;
    snprintf(b->arch, sizeof b->arch, "%s", exec_ctx_arch(ctx));
    mha_exec_device_limits(exec_ctx_device(ctx), b->arch, &b->lim);
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
    b->drv->CtxSetCurrent(b->ctx->gemm->cu);
    if (b->stream)
        b->drv->StreamSynchronize(b->stream);
    scratch_drop_all(b);
    free(b->scratch);
    for (int k = 0; k < 2; k++)
        if (b->ev[k])
            b->drv->EventDestroy(b->ev[k]);
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

const char *tune_backend_last_problem(const tune_backend *b) {
    return b->problem;
}

int tune_backend_threads(const tune_backend *b) {
    return b->pool ? task_pool_threads(b->pool) : 0;
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

static int is_attention(fusion_template_id t);

/* What the executor runs seg with when given no values: under the first
 * template that runs it (executor_template) or under seg->tmpl, that
 * template's default values; for attention the selector's kernel. */
static int default_of(const tune_backend *b, const search_segment *seg, int executor_template,
                      fusion_template_id *tmpl, int *values) {
    int none[FUSION_MAX_PARAMS] = {0};
    exec_segment s;
    exec_choice c;
    int got = 0, rc = STOF_OK;
    segment_of(seg, none, &s);
    s.has_values = 0;
    if (executor_template)
        rc = exec_segment_template(seg->g, s.first, s.n, &s.match, &s.tmpl, NULL);
    s.auto_attention = is_attention(s.tmpl);
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

/* A model that holds only what the launcher rows read: the context, the
 * graph and dtype, the scratch pointers of a copy, the stream. */
static void model_stub(tune_backend *b, const graph *g, exec_plan *xp, exec_model *m) {
    memset(xp, 0, sizeof *xp);
    xp->g = g;
    exec_model_dtype(g, &xp->dtype, NULL);
    memset(m, 0, sizeof *m);
    m->ctx = b->ctx;
    m->plan = xp;
    m->ptr = current(b)->ptr;
    m->stream = b->stream;
    m->ev[0] = b->ev[0];
    m->ev[1] = b->ev[1];
}

static void use_copy(tune_backend *b, exec_model *m, int c) {
    m->ptr = current(b)->ptr + (size_t)c * (size_t)b->g->n_tensors;
}

/* What computing one span's reference needs (memo_compute's argument). */
typedef struct reference_make {
    const graph *g;
    int first, last, pre_norm;
    ref_source src;
} reference_make;

static int make_reference(void *arg, void **value, size_t *bytes, stof_error *err) {
    const reference_make *rm = arg;
    tune_reference *r = err_malloc(sizeof *r, err);
    if (!r)
        return STOF_ERR_NOMEM;
    int rc = reference_compute(rm->g, rm->first, rm->last, rm->pre_norm, &rm->src, r, err);
    if (rc) {
        free(r);
        return rc;
    }
    *value = r;
    *bytes = reference_bytes(r);
    return STOF_OK;
}

static reference_make reference_make_of(const tune_backend *b, const graph *g,
                                        const exec_segment *s) {
    return (reference_make){g, s->first, s->first + s->n - 1, s->pre_norm >= 0,
                            {b->opt.seed, b->values, b->pool}};
}

/* The reference of segment s, computed once (here, or ahead on the pool);
 * pinned: reference_release it. */
static int reference_of(tune_backend *b, const graph *g, const exec_segment *s,
                        const tune_reference **out, stof_error *err) {
    reference_make rm = reference_make_of(b, g, s);
    double t0 = util_now();
    void *v;
    int rc = memo_get(b->refs, span_key(rm.first, rm.last, rm.pre_norm), make_reference, &rm,
                      &v, err);
    b->stats.reference_wait_s += util_now() - t0;
    *out = v;
    return rc;
}

static void reference_release(tune_backend *b, const exec_segment *s) {
    memo_unpin(b->refs, span_key(s->first, s->first + s->n - 1, s->pre_norm >= 0));
}

/* f16 or bf16 -> float, in slices on the pool. */
typedef struct unstage_job {
    const uint16_t *h;
    float *out;
    int bf16;
    size_t n;
    int slices;
} unstage_job;

static void unstage_slice(void *arg, int k) {
    const unstage_job *j = arg;
    size_t lo = j->n * (size_t)k / (size_t)j->slices;
    size_t hi = j->n * (size_t)(k + 1) / (size_t)j->slices;
    for (size_t i = lo; i < hi; i++)
        j->out[i] = j->bf16 ? util_bf16_to_f32(j->h[i]) : util_f16_to_f32(j->h[i]);
}

/* The rows of tensor t (of row_len elements) that ref holds, as floats:
 * every row, or the checked ones, one copy each. */
static int download_rows(tune_backend *b, const graph_tensor *t, CUdeviceptr d,
                         const tune_reference *ref, float *out, stof_error *err) {
    size_t len = (size_t)ref->row_len, n = (size_t)ref->n_rows * len;
    uint16_t *h = err_malloc(n * sizeof *h, err);
    if (!h)
        return STOF_ERR_NOMEM;
    int rc = STOF_OK;
    if (!ref->rows)
        rc = drv_check(b, b->drv->MemcpyDtoH(h, d, n * sizeof *h), "cuMemcpyDtoH", err);
    for (int64_t r = 0; ref->rows && !rc && r < ref->n_rows; r++)
        rc = drv_check(b,
                       b->drv->MemcpyDtoH(h + (size_t)r * len,
                                          d + (CUdeviceptr)((size_t)ref->rows[r] * len * sizeof *h),
                                          len * sizeof *h),
                       "cuMemcpyDtoH", err);
    if (!rc) {
        size_t slices = (n + TUNE_STAGE_SLICE - 1) / TUNE_STAGE_SLICE;
        unstage_job j = {h, out, t->dtype == STOF_BF16, n, slices ? (int)slices : 1};
        task_pool_parallel_for(b->pool, j.slices, unstage_slice, &j);
    }
    free(h);
    return rc;
}

/* Output k (0: the result, 1: the stored pre-norm values) against ref. */
static int check_output(tune_backend *b, exec_model *m, const tune_reference *ref, int t, int k,
                        stof_error *err) {
    const graph_tensor *x = &m->plan->g->tensors[t];
    float *got = err_malloc(sizeof *got * (size_t)(ref->n_rows * ref->row_len), err);
    int rc = got ? download_rows(b, x, m->ptr[t], ref, got, err) : STOF_ERR_NOMEM;
    if (!rc)
        rc = reference_compare(ref, got, k, m->plan->dtype, NULL, err);
    free(got);
    if (rc == STOF_ERR_UNSUPPORTED) {
        b->rejected_now = 1;
        if (k)
            err_prefix(err, "the stored pre-norm values: ");
    }
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
    if (!rc && (rc = reference_of(b, g, s, &ref, err)) == STOF_OK) {
        for (int k = 0; !rc && k < 2; k++)
            if (outs[k] >= 0)
                rc = check_output(b, m, ref, outs[k], k, err);
        reference_release(b, s);
    }
    return rc;
}

/* n launches rotating over the copies. */
static int launch_n(tune_backend *b, exec_model *m, const exec_seg_rt *rt, int n,
                    stof_error *err) {
    for (int i = 0; i < n; i++) {
        const exec_seg_rt *r = &rt[i % current(b)->n_copies];
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
 * TUNE_RUN_MS each (per launch). */
static int time_setting(tune_backend *b, exec_model *m, const exec_seg_rt *rt, double *ms,
                        stof_error *err) {
    int copies = current(b)->n_copies;
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
    int reps = reps_for(b, est * n);
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

/* Plans the kernel of s (compiled ahead, or now) and binds it to every
 * copy of the current scratch. */
static int plan_setting(tune_backend *b, exec_model *m, const exec_segment *s, exec_seg_rt *rt,
                        void **kplan, stof_error *why) {
    const exec_launcher *l = exec_launcher_get(s->tmpl);
    double t0 = util_now();
    int rc = l->plan(m, s, kplan, why);
    if (!rc) /* the kernel plan's tables, uploaded from pageable memory */
        rc = drv_check(b, b->drv->CtxSynchronize(NULL), "cuCtxSynchronize", why);
    for (int c = 0; !rc && c < current(b)->n_copies; c++) {
        rt[c].launcher = l;
        rt[c].kplan = *kplan;
        use_copy(b, m, c);
        rc = l->bind(m, s, &rt[c], why);
    }
    b->stats.plan_s += util_now() - t0;
    return rc;
}

static int measure_setting(tune_backend *b, const graph *g, const exec_segment *s, double *ms,
                           stof_error *why) {
    int rc = drv_check(b, b->drv->CtxSetCurrent(b->ctx->gemm->cu), "cuCtxSetCurrent", why);
    if (!rc)
        rc = scratch_prepare(b, g, s, why);
    if (rc)
        return rc;
    exec_plan xp;
    exec_model m;
    model_stub(b, g, &xp, &m);
    exec_seg_rt rt[TUNE_MAX_COPIES];
    memset(rt, 0, sizeof rt);
    void *kplan = NULL;
    rc = plan_setting(b, &m, s, rt, &kplan, why);
    double t0 = util_now();
    if (!rc && !b->opt.no_check)
        rc = check_setting(b, &m, s, rt, why);
    double t1 = util_now();
    if (!rc)
        rc = time_setting(b, &m, rt, ms, why);
    b->stats.check_s += t1 - t0;
    b->stats.time_s += util_now() - t1;
    if (kplan)
        exec_launcher_get(s->tmpl)->free_plan(&m, kplan);
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
    segment_of(seg, values, &s);
    stof_error why = {0};
    int rc = use_graph(b, g, err);
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

/* ---- working ahead ------------------------------------------------------------------------- */

static nvrtc_cache *cache_of(tune_backend *b, const exec_build *k) {
    return k->attention ? &b->ctx->mha->nvrtc : &b->ctx->gemm->nvrtc;
}

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
        rc = nvrtc_submit(b->pool, tag, cache_of(b, &k[i]), exec_build_request(&k[i]), &why);
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
    memo_fill(j->values, value_key(j->vm.g, j->vm.t, j->copy), make_values, &j->vm, NULL);
    free(j);
}

typedef struct reference_job {
    memo *refs;
    reference_make rm;
} reference_job;

static void reference_job_run(void *arg) {
    reference_job *j = arg;
    memo_fill(j->refs, span_key(j->rm.first, j->rm.last, j->rm.pre_norm), make_reference, &j->rm,
              NULL);
    free(j);
}

/* Queues what a new span needs before its first setting runs: the values
 * of its inputs (unless its scratch is on the device), then its reference. */
static int prepare_span(tune_backend *b, const graph *g, const exec_segment *s,
                        stof_error *err) {
    span_layout l;
    layout_of(b, g, s, &l);
    int on_device = scratch_find(b, s) >= 0;
    for (int c = 0; !on_device && c < l.copies; c++)
        for (int i = 0; i < l.n; i++) {
            int t = l.list[i];
            if (is_output_of(s, t) || memo_known(b->values, value_key(g, t, c)))
                continue;
            value_job *j = err_malloc(sizeof *j, err);
            if (!j)
                return STOF_ERR_NOMEM;
            *j = (value_job){b->values, {g, t, b->opt.seed + (uint64_t)c}, c};
            int rc = task_pool_submit(b->pool, TUNE_TAG_SEARCH, value_job_run, free, j, err);
            if (rc)
                return rc;
        }
    reference_make rm = reference_make_of(b, g, s);
    if (b->opt.no_check || memo_known(b->refs, span_key(rm.first, rm.last, rm.pre_norm)))
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
    int rc = use_graph(b, c[0].seg.g, err);
    task_pool_drop(b->pool, TUNE_TAG_SEARCH);
    exec_segment *spans = rc ? NULL : err_malloc(sizeof *spans * (size_t)n, err);
    int n_spans = 0;
    if (!rc && !spans)
        rc = STOF_ERR_NOMEM;
    for (int i = 0; !rc && i < n; i++) {
        exec_segment s;
        segment_of(&c[i].seg, c[i].values, &s);
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

/* ==== plans =================================================================================== */

/* The executor's segment of graph ops first .. first + n - 1, matched. */
static int segment_at(const graph *g, int first, int n, exec_segment *s, stof_error *err) {
    int ops[FUSION_MAX_OPS] = {0}; /* n <= FUSION_MAX_OPS; zeroed for gcc's -Wmaybe-uninitialized */
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
    weights_source src = weights_source_seeded(seed);
    int rc = exec_model_create(ctx, xp, &src, &m, err);
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

/* ==== tuning on the GPU ======================================================================= */

static mha_device_limits device_limits(const stof_device_info *d, const char *arch) {
    mha_device_limits lim;
    mha_exec_device_limits(d, arch, &lim);
    return lim;
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

/* One setting timed after the search against a segment's result. */
typedef struct refine_item {
    search_seg_result *sg;
    int q;
    exec_segment s;   /* the match its view points to */
    exec_choice choice;
} refine_item;

typedef struct refine_list {
    refine_item *items;
    int n, cap;
} refine_list;

static search_segment refine_view(const refine_ctx *c, const refine_item *it) {
    return (search_segment){c->g, it->q, it->sg->first, it->sg->last, it->s.first,
                            it->s.first + it->s.n - 1, it->choice.tmpl, &it->s.match,
                            it->s.match.dims};
}

/* The candidates of one segment result that differ from it. */
static int refine_collect(refine_ctx *c, int q, search_seg_result *sg, refine_list *l,
                          stof_error *err) {
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
        if (l->n == l->cap) {
            int cap = l->cap ? 2 * l->cap : 32;
            refine_item *grown = err_realloc(l->items, sizeof *grown * (size_t)cap, err);
            if (!grown)
                return STOF_ERR_NOMEM;
            l->items = grown;
            l->cap = cap;
        }
        l->items[l->n++] = (refine_item){sg, q, s, cand[k]};
    }
    return rc;
}

/* The uncached ones, told to the backend in the order they are timed. */
static int refine_prepare(refine_ctx *c, const refine_list *l, stof_error *err) {
    search_candidate *cands = err_malloc(sizeof *cands * (size_t)(l->n ? l->n : 1), err);
    if (!cands)
        return STOF_ERR_NOMEM;
    int n = 0;
    for (int i = 0; i < l->n; i++) {
        search_segment view = refine_view(c, &l->items[i]);
        char sig[SEARCH_SIG_MAX];
        search_segment_signature(&view, sig, sizeof sig);
        const fusion_template *t = fusion_template_get(view.tmpl);
        if (search_cache_contains(c->cache, sig, l->items[i].choice.values, t->n_params))
            continue;
        memset(&cands[n], 0, sizeof cands[n]);
        cands[n].seg = view;
        memcpy(cands[n].values, l->items[i].choice.values, sizeof cands[n].values);
        n++;
    }
    int rc = tune_backend_prepare(c->b, cands, n, err);
    free(cands);
    return rc;
}

static int refine_measure(refine_ctx *c, refine_item *it, stof_error *err) {
    search_segment view = refine_view(c, it);
    const fusion_template *t = fusion_template_get(it->choice.tmpl);
    search_seg_result *sg = it->sg;
    double ms;
    int rc = measure_cached(c->b, c->cache, &view, it->choice.values, &ms,
                            &c->res->extra_measured, err);
    if (!rc && ms < sg->ms) {
        sg->tmpl = it->choice.tmpl;
        sg->n_values = t->n_params;
        memset(sg->values, 0, sizeof sg->values);
        memcpy(sg->values, it->choice.values, sizeof *sg->values * (size_t)t->n_params);
        sg->ms = ms;
        c->res->improved++;
    }
    return rc;
}

/* After the search: every segment's defaults and the selector's choices
 * compete with what the search found, so a plan never loses to the
 * executor's untuned choices for its own scheme. All of them are collected
 * and prepared first (their kernels compile together), then timed. */
static int refine(refine_ctx *c, search_result *r, stof_error *err) {
    refine_list l = {NULL, 0, 0};
    int rc = STOF_OK;
    for (int q = 0; !rc && q < r->n_seqs; q++)
        for (int k = 0; !rc && k < r->seqs[q].n_segs; k++)
            rc = refine_collect(c, q, &r->seqs[q].segs[k], &l, err);
    if (!rc)
        rc = refine_prepare(c, &l, err);
    for (int i = 0; !rc && i < l.n; i++)
        rc = refine_measure(c, &l.items[i], err);
    free(l.items);
    if (rc)
        return rc;
    r->total_ms = 0;
    for (int q = 0; q < r->n_seqs; q++) {
        search_seq_result *sr = &r->seqs[q];
        sr->ms = 0;
        for (int k = 0; k < sr->n_segs; k++)
            sr->ms += sr->segs[k].ms;
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

/* The tuned plan and the all-unfused scheme (planned before, its kernels
 * prepared) end to end; the plan's output against the CPU reference. */
static int end_to_end(exec_ctx *ctx, tune_backend *b, const graph *g, const tune_options *o,
                      const exec_plan *unfused, plan *p, tune_outcome *res, stof_error *err) {
    int reps = o->reps > 0 ? o->reps : 20;
    int64_t n = graph_tensor_numel(&g->tensors[g->output]);
    exec_plan *tuned = NULL;
    float *y = err_malloc(sizeof *y * (size_t)n, err), *ref = NULL;
    int rc = y ? tune_exec_plan(p, g, &tuned, err) : STOF_ERR_NOMEM;
    if (!rc)
        rc = tune_backend_prepare_plan(b, tuned, err);
    if (!rc)
        rc = tune_time_model(ctx, tuned, o->seed, reps, &res->eager_ms, &res->graph_ms, y, err);
    if (!rc)
        rc = tune_time_model(ctx, unfused, o->seed, reps, NULL, &res->unfused_ms, NULL, err);
    int check = o->check > 0 || (o->check == 0 && graph_flops(g) <= TUNE_CHECK_MAX_FLOPS);
    weights_source src = weights_source_seeded(o->seed);
    if (!rc && check && (rc = exec_reference(g, &src, &ref, err)) == STOF_OK) {
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
    const nvrtc_cache *c[2] = {&ctx->gemm->nvrtc, &ctx->mha->nvrtc};
    tune_timing t;
    memset(&t, 0, sizeof t);
    for (int i = 0; i < 2; i++) {
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

static int tune_refine(exec_ctx *ctx, const graph *g, const tune_options *o, tune_state *t,
                       tune_outcome *res, stof_error *err) {
    /* the time limit ran out before the initial scheme was measured: the
     * search finished it past the limit with the segments' defaults, and
     * nothing more is timed before the plan is made */
    if (t->result.stats.measured_past_limit > 0)
        return STOF_OK;
    refine_ctx c = {g, t->seqs, t->backend, t->cache,
                    device_limits(exec_ctx_device(ctx), exec_ctx_arch(ctx)),
                    o->attention_candidates == 0 ? TUNE_ATTENTION_CANDIDATES
                    : o->attention_candidates < 0 ? 0 : o->attention_candidates,
                    res};
    double t0 = util_now();
    int rc = refine(&c, &t->result, err);
    res->timing.refine_s = util_now() - t0;
    return rc;
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
        rc = tune_refine(ctx, g, &o, &t, res, err);
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
        rc = end_to_end(ctx, t.backend, g, &o, t.unfused, out, res, err);
        res->timing.end_to_end_s = util_now() - t1;
    }
    if (t.backend)
        res->backend = tune_backend_get_stats(t.backend);
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

/* ==== tuning offline ========================================================================== */

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

/* The executor segment of result segment k of sequence q, with its setting. */
static int offline_segment(const graph *g, const search_sequence *seqs, const search_result *r,
                           int q, int k, exec_segment *s, stof_error *err) {
    const search_seg_result *sg = &r->seqs[q].segs[k];
    int rc = segment_at(g, seqs[q].firsts[0] + sg->first, sg->last - sg->first + 1, s, err);
    s->tmpl = sg->tmpl;
    s->has_values = 1;
    memcpy(s->values, sg->values, sizeof s->values);
    return rc;
}

/* Every build of the result queued on a pool (*requests: how many). */
static int offline_ahead(const graph *g, const search_sequence *seqs, const search_result *r,
                         const mha_device_limits *lim, nvrtc_cache *cache, task_pool *pool,
                         int *requests, stof_error *err) {
    *requests = 0;
    for (int q = 0; q < r->n_seqs; q++)
        for (int k = 0; k < r->seqs[q].n_segs; k++) {
            exec_segment s;
            exec_build b[EXEC_MAX_BUILDS];
            int n = 0;
            int rc = offline_segment(g, seqs, r, q, k, &s, err);
            if (!rc)
                rc = exec_segment_builds(g, &s, lim, EXEC_BUILDS_ALL, b, &n, err);
            for (int i = 0; !rc && i < n; i++)
                rc = nvrtc_submit(pool, 0, cache, exec_build_request(&b[i]), err);
            if (rc)
                return rc;
            *requests += n;
        }
    return STOF_OK;
}

/* Every kernel of the result (one per segment of each class) into cache:
 * compiled on a pool, then asked for one by one (which reports errors). */
static int offline_compile(const graph *g, const search_sequence *seqs, const search_result *r,
                           const mha_device_limits *lim, nvrtc_cache *cache, int *requests,
                           stof_error *err) {
    task_pool *pool = NULL;
    int rc = task_pool_create(0, &pool, err);
    if (!rc)
        rc = offline_ahead(g, seqs, r, lim, cache, pool, requests, err);
    task_pool_free(pool); /* waits for the compiles under way, drops the rest on failure */
    for (int q = 0; !rc && q < r->n_seqs; q++)
        for (int k = 0; !rc && k < r->seqs[q].n_segs; k++) {
            exec_segment s;
            rc = offline_segment(g, seqs, r, q, k, &s, err);
            if (!rc)
                rc = exec_segment_compile(g, &s, lim, cache, err);
            if (rc)
                return err_prefix(err, "compiling ops #%d-#%d for %s: ", s.first,
                                  s.first + s.n - 1, lim->arch);
        }
    return rc;
}

int tune_offline(const graph *g, const graph_script *script, const char *arch,
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
        rc = plan_from_search(&r, g, seqs, script, NULL, arch, out, err);
    int requests = 0;
    if (!rc)
        rc = offline_compile(g, seqs, &r, &lim, &cache, &requests, err);
    st->compiled = cache.compiled;
    st->disk_hits = cache.disk_hits;
    st->kernels = requests;
    st->memory_hits = requests - cache.compiled - cache.disk_hits; /* asked for again */
    st->seconds = util_now() - t0;
    nvrtc_cache_free(&cache);
    search_result_free(&r);
    free(schemes);
    search_sequences_free(seqs, n_seqs);
    if (rc)
        plan_free(out);
    return rc;
}
