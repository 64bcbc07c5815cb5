/* The CPU reference of a segment run alone (tune_backend.h): computed on
 * the checked rows only where the ops allow it, kept per span in the
 * backend's memo of references (tune_impl.h). */
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/util.h"
#include "core/tune/tune_impl.h"
#include "ops/ops.h"

/* Ops whose output row r depends only on row r of their row inputs. */
static int row_wise_kind(op_kind k) {
    return k == OP_GEMM || k == OP_BIAS || k == OP_ADD || k == OP_LAYERNORM || k == OP_RMSNORM ||
           k == OP_GELU || k == OP_RELU || k == OP_SOFTMAX || k == OP_GLU;
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

int tune_produced_inside(const graph *g, int t, int first, int last) {
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
        int rc = memo_get(src->values, tune_value_key(g, t, 0), tune_make_values, &vm, &v, err);
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
        memo_unpin(src->values, tune_value_key(g, t, 0));
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
            if (tune_produced_inside(g, t, ref->first, ref->last) || val[t])
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
            memo_unpin(src->values, tune_value_key(g, t, 0));
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

int tune_reference_compare(const tune_reference *ref, const float *got, int pre_norm,
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
        return tune_reference_compare(ref, full, pre_norm, dtype, d, err);
    int64_t n = ref->n_rows * ref->row_len;
    float *got = err_malloc(sizeof *got * (size_t)n, err);
    if (!got)
        return STOF_ERR_NOMEM;
    for (int64_t r = 0; r < ref->n_rows; r++)
        memcpy(got + r * ref->row_len, full + ref->rows[r] * ref->row_len,
               sizeof *got * (size_t)ref->row_len);
    int rc = tune_reference_compare(ref, got, pre_norm, dtype, d, err);
    free(got);
    return rc;
}

uint64_t tune_span_key(int first, int last, int pre_norm) {
    return (uint64_t)(uint32_t)first | (uint64_t)(uint32_t)last << 24 |
           (uint64_t)(pre_norm != 0) << 48;
}

void tune_reference_value_free(void *value) {
    tune_reference_free(value);
    free(value);
}

int tune_make_reference(void *arg, void **value, size_t *bytes, stof_error *err) {
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

reference_make tune_reference_make_of(const tune_backend *b, const graph *g,
                                      const exec_segment *s) {
    return (reference_make){g, s->first, s->first + s->n - 1, s->pre_norm >= 0,
                            {b->opt.seed, b->values, b->pool}};
}

int tune_reference_of(tune_backend *b, const graph *g, const exec_segment *s,
                      const tune_reference **out, stof_error *err) {
    reference_make rm = tune_reference_make_of(b, g, s);
    double t0 = util_now();
    void *v;
    int rc = memo_get(b->refs, tune_span_key(rm.first, rm.last, rm.pre_norm),
                      tune_make_reference, &rm, &v, err);
    b->stats.reference_wait_s += util_now() - t0;
    *out = v;
    return rc;
}

void tune_reference_release(tune_backend *b, const exec_segment *s) {
    memo_unpin(b->refs, tune_span_key(s->first, s->first + s->n - 1, s->pre_norm >= 0));
}

