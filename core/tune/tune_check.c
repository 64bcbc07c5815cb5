/* Checking a candidate's output (tune_backend.h), and the values a lone
 * segment is fed and their keys in the memo of values (tune_impl.h). */
#include <string.h>

#include "core/base/error.h"
#include "core/base/util.h"
#include "core/io/weights.h"
#include "core/tune/tune_impl.h"

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

/* ---- the values of a lone segment, kept for reuse ------------------------------------- */

uint64_t tune_tensor_identity(const graph_tensor *x) {
    uint64_t h = util_hash_str(UTIL_HASH_SEED, x->name);
    h = util_hash(h, &x->role, sizeof x->role);
    h = util_hash(h, &x->dtype, sizeof x->dtype);
    h = util_hash(h, x->shape, sizeof *x->shape * (size_t)x->ndim);
    h = util_hash(h, &x->init, sizeof x->init);
    h = util_hash(h, &x->init_scale, sizeof x->init_scale);
    return util_hash(h, &x->init_high, sizeof x->init_high);
}

uint64_t tune_value_key(const graph *g, int t, int copy) {
    uint64_t h = tune_tensor_identity(&g->tensors[t]);
    h = util_hash(h, &t, sizeof t);
    return util_hash(h, &copy, sizeof copy);
}

int tune_make_values(void *arg, void **value, size_t *bytes, stof_error *err) {
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

void tune_check_rows(int64_t m, int64_t n, int64_t *rows) {
    for (int64_t i = 0; i < n; i++) {
        int64_t lo = i * m / n, width = (i + 1) * m / n - lo;
        rows[i] = lo + (i * 37) % width;
    }
    rows[0] = 0;
    rows[n - 1] = m - 1;
}
