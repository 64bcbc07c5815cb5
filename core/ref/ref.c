#include "core/ref/ref.h"

#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/io/weights.h"
#include "ops/ops.h"

int ref_values_init(const graph *g, const weights_source *src, ref_values *rv, stof_error *err) {
    memset(rv, 0, sizeof *rv);
    int rc = weights_source_check(src, g, err);
    if (rc)
        return rc;
    rv->data = err_calloc((size_t)g->n_tensors, sizeof *rv->data, err);
    if (!rv->data)
        return STOF_ERR_NOMEM;
    rv->n = g->n_tensors;
    int *list = err_malloc(sizeof *list * (size_t)(g->n_tensors ? g->n_tensors : 1), err);
    void **outs = err_malloc(sizeof *outs * (size_t)(g->n_tensors ? g->n_tensors : 1), err);
    rc = list && outs ? STOF_OK : STOF_ERR_NOMEM;
    int n = 0;
    size_t live = 0;
    for (int i = 0; !rc && i < g->n_tensors; i++) {
        const graph_tensor *t = &g->tensors[i];
        if (t->role != GRAPH_INPUT && t->role != GRAPH_WEIGHT)
            continue;
        size_t bytes = (size_t)graph_tensor_numel(t) * sizeof(float);
        rv->data[i] = err_malloc(bytes, err);
        if (!rv->data[i]) {
            rc = STOF_ERR_NOMEM;
            err_prefix(err, "reference values for '%s': ", t->name);
        }
        list[n] = i;
        outs[n++] = rv->data[i];
        live += bytes;
    }
    if (!rc) {
        task_pool *pool = weights_pool(g);
        rc = weights_source_values_many(src, g, list, n, WEIGHTS_FLOAT, outs, pool, err);
        task_pool_free(pool);
    }
    free(list);
    free(outs);
    if (rc) {
        ref_values_free(rv);
        return rc;
    }
    rv->peak_bytes = live;
    return STOF_OK;
}

void ref_values_free(ref_values *rv) {
    if (!rv->data)
        return;
    for (int i = 0; i < rv->n; i++)
        free(rv->data[i]);
    free(rv->data);
    memset(rv, 0, sizeof *rv);
}

/* last_use[t] = index of the last op reading activation t (-1: never read). */
static int *last_uses(const graph *g, stof_error *err) {
    int *last = err_malloc((size_t)g->n_tensors * sizeof *last, err);
    if (!last)
        return NULL;
    for (int t = 0; t < g->n_tensors; t++)
        last[t] = -1;
    for (int i = 0; i < g->n_ops; i++)
        for (int k = 0; k < g->ops[i].n_inputs; k++)
            last[g->ops[i].inputs[k]] = i;
    return last;
}

static size_t tensor_floats_bytes(const graph *g, int t) {
    return (size_t)graph_tensor_numel(&g->tensors[t]) * sizeof(float);
}

static int run_op(const graph *g, int i, ref_values *rv, const ref_hooks *h, stof_error *err) {
    const graph_op *op = &g->ops[i];
    const graph_tensor *out = &g->tensors[op->output];
    const float *in[GRAPH_MAX_INPUTS] = {0};
    for (int k = 0; k < op->n_inputs; k++) {
        in[k] = rv->data[op->inputs[k]];
        if (!in[k])
            return err_set(err, STOF_ERR_INTERNAL, "op #%d '%s': input '%s' is not computed", i,
                           op->name, g->tensors[op->inputs[k]].name);
    }
    float *y = err_malloc((size_t)graph_tensor_numel(out) * sizeof(float), err);
    if (!y)
        return err_prefix(err, "op #%d '%s': ", i, op->name);
    int handled = 0, rc = STOF_OK;
    if (h && h->run)
        rc = h->run(h->ctx, g, i, in, y, &handled, err);
    if (!rc && !handled)
        rc = op_describe(op->kind)->ref(g, op, in, y, err);
    if (!rc && h && h->after)
        rc = h->after(h->ctx, g, i, in, y, err);
    if (rc) {
        free(y);
        return err_prefix(err, "op #%d '%s': ", i, op->name);
    }
    rv->data[op->output] = y;
    return STOF_OK;
}

int ref_execute(const graph *g, ref_values *rv, stof_error *err) {
    return ref_execute_hooked(g, rv, NULL, err);
}

int ref_execute_hooked(const graph *g, ref_values *rv, const ref_hooks *h, stof_error *err) {
    int *last = last_uses(g, err);
    if (!last)
        return STOF_ERR_NOMEM;
    size_t live = 0;
    for (int t = 0; t < g->n_tensors; t++)
        if (rv->data[t])
            live += tensor_floats_bytes(g, t);
    int rc = STOF_OK;
    for (int i = 0; i < g->n_ops && rc == STOF_OK; i++) {
        if ((rc = run_op(g, i, rv, h, err)))
            break;
        live += tensor_floats_bytes(g, g->ops[i].output);
        if (live > rv->peak_bytes)
            rv->peak_bytes = live;
        /* free activations nobody reads any more (never the output) */
        for (int k = 0; k < g->ops[i].n_inputs; k++) {
            int t = g->ops[i].inputs[k];
            if (last[t] == i && g->tensors[t].role == GRAPH_ACTIVATION && rv->data[t]) {
                free(rv->data[t]);
                rv->data[t] = NULL;
                live -= tensor_floats_bytes(g, t);
            }
        }
    }
    free(last);
    return rc;
}

void ref_checksum(const float *x, int64_t n, double *sum, double *sum_sq) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
    }
    *sum = s;
    *sum_sq = s2;
}
