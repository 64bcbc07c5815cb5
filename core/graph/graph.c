#include "core/graph/graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/util.h"

void graph_init(graph *g) {
    memset(g, 0, sizeof *g);
    g->output = -1;
    g->current_layer = -1;
}

void graph_free(graph *g) {
    if (!g)
        return;
    for (int i = 0; i < g->n_masks; i++)
        g->mask_release(g->masks[i]);
    free(g->masks);
    free(g->tensors);
    free(g->ops);
    free(g->sources);
    free(g->source_names);
    free(g->name_index);
    free(g->suffix_base);
    free(g->suffix_next);
    graph_init(g);
}

/* Grows *arr (of elem bytes each) so that it holds at least need entries. */
static int grow(void **arr, int *cap, int need, size_t elem, stof_error *err) {
    if (need <= *cap)
        return STOF_OK;
    int ncap = *cap ? *cap * 2 : 64;
    while (ncap < need)
        ncap *= 2;
    void *p = err_realloc(*arr, (size_t)ncap * elem, err);
    if (!p)
        return STOF_ERR_NOMEM;
    *arr = p;
    *cap = ncap;
    return STOF_OK;
}

/* ---- the index of tensor names ----------------------------------------------
 * Open addressing over tensor ids, at most half full: a script that makes
 * tens of thousands of tensors (or thousands under one name) must not spend
 * its time in name look-ups. */

static size_t name_slot(const char *name, int cap) {
    return (size_t)(util_hash_str(UTIL_HASH_SEED, name) & (uint64_t)(cap - 1));
}

static void index_put(graph *g, int id) {
    size_t k = name_slot(g->tensors[id].name, g->name_cap);
    while (g->name_index[k] >= 0)
        k = (k + 1) & (size_t)(g->name_cap - 1);
    g->name_index[k] = id;
}

/* Makes room in the index for one more tensor, rebuilding it when it would
 * be more than half full; index_put adds the tensor once it is written. */
static int index_reserve(graph *g, stof_error *err) {
    if (2 * (g->n_tensors + 1) <= g->name_cap)
        return STOF_OK;
    int cap = g->name_cap ? 2 * g->name_cap : 128;
    int *idx = err_malloc((size_t)cap * sizeof *idx, err);
    if (!idx)
        return STOF_ERR_NOMEM;
    for (int k = 0; k < cap; k++)
        idx[k] = -1;
    free(g->name_index);
    g->name_index = idx;
    g->name_cap = cap;
    for (int i = 0; i < g->n_tensors; i++)
        index_put(g, i);
    return STOF_OK;
}

int graph_find_tensor(const graph *g, const char *name) {
    if (!g->name_cap)
        return -1;
    for (size_t k = name_slot(name, g->name_cap); g->name_index[k] >= 0;
         k = (k + 1) & (size_t)(g->name_cap - 1))
        if (strcmp(g->tensors[g->name_index[k]].name, name) == 0)
            return g->name_index[k];
    return -1;
}

int64_t graph_tensor_numel(const graph_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

size_t graph_tensor_bytes(const graph_tensor *t) {
    return (size_t)graph_tensor_numel(t) * stof_dtype_size(t->dtype);
}

int graph_has_streams(const graph *g) {
    return g->output >= 0 && g->tensors[g->output].dtype != STOF_F32;
}

int graph_tensor_is_stream(const graph *g, int t) {
    return t >= 0 && t < g->n_tensors && g->tensors[t].dtype == STOF_F32 && graph_has_streams(g);
}

const char *graph_shape_str(const graph_tensor *t, char *buf, size_t n) {
    size_t used = 0;
    used += (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < t->ndim && used < n; d++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "",
                                 (long long)t->shape[d]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
    return buf;
}

static int check_shape(const graph_tensor *t, stof_error *err) {
    if (t->ndim < 1 || t->ndim > GRAPH_MAX_DIMS)
        return err_set(err, STOF_ERR_SHAPE, "tensor '%s': rank must be 1..%d, got %d", t->name,
                       GRAPH_MAX_DIMS, t->ndim);
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 1 || t->shape[d] > GRAPH_MAX_DIM_SIZE)
            return err_set(err, STOF_ERR_SHAPE,
                           "tensor '%s': dimension %d must be in 1..%lld, got %lld", t->name, d,
                           (long long)GRAPH_MAX_DIM_SIZE, (long long)t->shape[d]);
        n *= t->shape[d];
        if (n > GRAPH_MAX_TENSOR_ELEMS)
            return err_set(err, STOF_ERR_SHAPE,
                           "tensor '%s': %lld elements or more is beyond what stof handles",
                           t->name, (long long)n);
    }
    return STOF_OK;
}

int graph_add_tensor(graph *g, const graph_tensor *t, int *id, stof_error *err) {
    if (t->name[0] == '\0')
        return err_set(err, STOF_ERR_INVALID, "a tensor needs a name");
    if (graph_find_tensor(g, t->name) >= 0)
        return err_set(err, STOF_ERR_INVALID, "tensor '%s' is already defined", t->name);
    if (t->role != GRAPH_INPUT && t->role != GRAPH_WEIGHT)
        return err_set(err, STOF_ERR_INVALID, "tensor '%s': only inputs and weights are declared",
                       t->name);
    int rc = check_shape(t, err);
    if (rc)
        return rc;
    if ((rc = grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors + 1, sizeof *g->tensors,
                   err)))
        return rc;
    if ((rc = index_reserve(g, err)))
        return rc;
    graph_tensor *dst = &g->tensors[g->n_tensors];
    *dst = *t;
    dst->producer = -1;
    dst->source = 0;
    index_put(g, g->n_tensors);
    *id = g->n_tensors++;
    return STOF_OK;
}

/* The slot of base in the table of suffixes already used (graph.h): the
 * one holding it, or the empty one where it goes. */
static size_t suffix_slot(const graph *g, const char *base) {
    size_t k = name_slot(base, g->suffix_cap);
    while (g->suffix_base[k][0] && strcmp(g->suffix_base[k], base) != 0)
        k = (k + 1) & (size_t)(g->suffix_cap - 1);
    return k;
}

/* Room in the suffix table for one more base (rebuilt when half full). */
static int suffix_reserve(graph *g, stof_error *err) {
    if (2 * (g->n_suffixes + 1) <= g->suffix_cap)
        return STOF_OK;
    graph old = *g;
    int cap = g->suffix_cap ? 2 * g->suffix_cap : 64;
    g->suffix_base = err_calloc((size_t)cap, sizeof *g->suffix_base, err);
    g->suffix_next = err_calloc((size_t)cap, sizeof *g->suffix_next, err);
    if (!g->suffix_base || !g->suffix_next) {
        free(g->suffix_base);
        free(g->suffix_next);
        g->suffix_base = old.suffix_base;
        g->suffix_next = old.suffix_next;
        return STOF_ERR_NOMEM;
    }
    g->suffix_cap = cap;
    for (int i = 0; i < old.suffix_cap; i++)
        if (old.suffix_base[i][0]) {
            size_t k = suffix_slot(g, old.suffix_base[i]);
            memcpy(g->suffix_base[k], old.suffix_base[i], GRAPH_NAME_MAX);
            g->suffix_next[k] = old.suffix_next[i];
        }
    free(old.suffix_base);
    free(old.suffix_next);
    return STOF_OK;
}

/* A unique activation name from the op's name (or kind and index): the
 * base itself, else base#k with k counting on from the last one given, so
 * thousands of ops of one name are named in linear time. */
static int activation_name(graph *g, const graph_op *op, const char *kind_name, char *out,
                           stof_error *err) {
    char base[GRAPH_NAME_MAX];
    if (op->name[0])
        snprintf(base, sizeof base, "%s", op->name);
    else
        snprintf(base, sizeof base, "%s%d", kind_name, g->n_ops);
    snprintf(out, GRAPH_NAME_MAX, "%s", base);
    if (graph_find_tensor(g, out) < 0)
        return STOF_OK;
    int rc = suffix_reserve(g, err);
    if (rc)
        return rc;
    size_t slot = suffix_slot(g, base);
    if (!g->suffix_base[slot][0]) {
        memcpy(g->suffix_base[slot], base, GRAPH_NAME_MAX);
        g->suffix_next[slot] = 1;
        g->n_suffixes++;
    }
    int k = g->suffix_next[slot];
    do
        snprintf(out, GRAPH_NAME_MAX, "%.80s#%d", base, k++);
    while (graph_find_tensor(g, out) >= 0);
    g->suffix_next[slot] = k;
    return STOF_OK;
}

int graph_check_inputs(const graph *g, const graph_op *op, const char *kind_name,
                       stof_error *err) {
    for (int k = 0; k < op->n_inputs; k++)
        if (op->inputs[k] < 0 || op->inputs[k] >= g->n_tensors)
            return err_set(err, STOF_ERR_INVALID, "%s: input %d is not a tensor of this graph",
                           kind_name, k + 1);
    return STOF_OK;
}

int graph_append_op(graph *g, const graph_op *op, const char *kind_name, const graph_tensor *t,
                    int *out_tensor, stof_error *err) {
    int rc = graph_check_inputs(g, op, kind_name, err);
    if (rc)
        return rc;
    graph_tensor out = *t;
    if ((rc = activation_name(g, op, kind_name, out.name, err)))
        return rc;
    out.role = GRAPH_ACTIVATION;
    out.producer = g->n_ops;
    out.line = op->line;
    if ((rc = check_shape(&out, err)))
        return rc;
    if ((rc = grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors + 1, sizeof *g->tensors,
                   err)))
        return rc;
    if ((rc = grow((void **)&g->ops, &g->cap_ops, g->n_ops + 1, sizeof *g->ops, err)))
        return rc;
    if ((rc = index_reserve(g, err)))
        return rc;
    g->tensors[g->n_tensors] = out;
    index_put(g, g->n_tensors);
    graph_op *dst = &g->ops[g->n_ops];
    *dst = *op;
    dst->output = g->n_tensors;
    dst->layer = g->current_layer;
    if (dst->name[0] == '\0')
        snprintf(dst->name, sizeof dst->name, "%s", out.name);
    *out_tensor = g->n_tensors++;
    g->n_ops++;
    return STOF_OK;
}

int graph_add_mask(graph *g, struct mask *m, void (*release)(struct mask *), int *id,
                   stof_error *err) {
    if (g->n_masks > 0 && g->mask_release != release) {
        release(m);
        return err_set(err, STOF_ERR_INTERNAL, "masks of one graph need one release function");
    }
    int rc = grow((void **)&g->masks, &g->cap_masks, g->n_masks + 1, sizeof *g->masks, err);
    if (rc) {
        release(m);
        return rc;
    }
    g->mask_release = release;
    g->masks[g->n_masks] = m;
    *id = g->n_masks++;
    return STOF_OK;
}

int graph_set_output(graph *g, int tensor, stof_error *err) {
    if (tensor < 0 || tensor >= g->n_tensors)
        return err_set(err, STOF_ERR_INVALID, "the output is not a tensor of this graph");
    if (g->tensors[tensor].producer < 0)
        return err_set(err, STOF_ERR_INVALID,
                       "the output '%s' must be computed by an operator, not declared",
                       g->tensors[tensor].name);
    if (g->output >= 0)
        g->tensors[g->output].role = GRAPH_ACTIVATION;
    g->tensors[tensor].role = GRAPH_OUTPUT;
    g->output = tensor;
    return STOF_OK;
}

static int check_source(const graph *g, int tensor, const char *const *parts, int n,
                        stof_error *err) {
    if (tensor < 0 || tensor >= g->n_tensors || g->tensors[tensor].role != GRAPH_WEIGHT)
        return err_set(err, STOF_ERR_INVALID, "only weights are assembled from other tensors");
    const graph_tensor *t = &g->tensors[tensor];
    if (t->source)
        return err_set(err, STOF_ERR_INVALID, "weight '%s' already has its parts", t->name);
    if (n < 1 || n > GRAPH_MAX_SOURCE_PARTS)
        return err_set(err, STOF_ERR_INVALID, "weight '%s': 1 to %d parts, got %d", t->name,
                       GRAPH_MAX_SOURCE_PARTS, n);
    for (int k = 0; k < n; k++) {
        size_t len = strlen(parts[k]);
        if (len == 0 || len >= GRAPH_NAME_MAX)
            return err_set(err, STOF_ERR_INVALID, "weight '%s': part %d needs a name of 1 to %d "
                           "characters", t->name, k + 1, GRAPH_NAME_MAX - 1);
        for (int j = 0; j < k; j++)
            if (strcmp(parts[j], parts[k]) == 0)
                return err_set(err, STOF_ERR_INVALID, "weight '%s': part '%s' is given twice",
                               t->name, parts[k]);
    }
    return STOF_OK;
}

/* The parts' rows: given (each >= 1, adding up to the weight's), or equal shares. */
static int source_rows(const graph_tensor *t, const int64_t *rows, int n, int64_t *out,
                       stof_error *err) {
    int64_t total = t->ndim > 0 ? t->shape[0] : 0, sum = 0;
    for (int k = 0; k < n; k++) {
        out[k] = rows ? rows[k] : total / n;
        if (out[k] < 1)
            return err_set(err, STOF_ERR_INVALID, "weight '%s': part %d of %lld rows", t->name,
                           k + 1, (long long)out[k]);
        sum += out[k];
    }
    if (sum == total)
        return STOF_OK;
    return err_set(err, STOF_ERR_INVALID, "weight '%s' has %lld rows: its %d parts %s %lld",
                   t->name, (long long)total, n, rows ? "add up to" : "cannot share them equally, "
                   "giving", (long long)sum);
}

int graph_set_source(graph *g, int tensor, const char *const *parts, const int64_t *rows, int n,
                     stof_error *err) {
    int64_t part_rows[GRAPH_MAX_SOURCE_PARTS];
    int rc = check_source(g, tensor, parts, n, err);
    if (!rc)
        rc = source_rows(&g->tensors[tensor], rows, n, part_rows, err);
    if (!rc)
        rc = grow((void **)&g->sources, &g->cap_sources, g->n_sources + 1, sizeof *g->sources,
                  err);
    if (!rc)
        rc = grow((void **)&g->source_names, &g->cap_source_names, g->n_source_names + n,
                  sizeof *g->source_names, err);
    if (rc)
        return rc;
    g->sources[g->n_sources] = (graph_source){.tensor = tensor, .first = g->n_source_names,
                                              .n = n};
    memcpy(g->sources[g->n_sources].part_rows, part_rows, sizeof part_rows[0] * (size_t)n);
    for (int k = 0; k < n; k++)
        snprintf(g->source_names[g->n_source_names++], GRAPH_NAME_MAX, "%s", parts[k]);
    g->tensors[tensor].source = ++g->n_sources;
    return STOF_OK;
}

int graph_set_source_rows(graph *g, int tensor, int64_t rows, stof_error *err) {
    if (rows < 1 || rows > GRAPH_MAX_DIM_SIZE)
        return err_set(err, STOF_ERR_INVALID, "a row offset in 1..%lld, got %lld",
                       (long long)GRAPH_MAX_DIM_SIZE, (long long)rows);
    const char *self = tensor >= 0 && tensor < g->n_tensors ? g->tensors[tensor].name : "";
    int rc = graph_set_source(g, tensor, &self, NULL, 1, err);
    if (!rc)
        g->sources[g->n_sources - 1].row_offset = rows;
    return rc;
}

int graph_set_source_transposed(graph *g, int tensor, const char *part, stof_error *err) {
    const graph_tensor *t = tensor >= 0 && tensor < g->n_tensors ? &g->tensors[tensor] : NULL;
    if (t && t->role == GRAPH_WEIGHT && t->ndim != 2) {
        char shape[160];
        return err_set(err, STOF_ERR_INVALID, "weight '%s' is %s: only a 2-D weight is read "
                       "transposed", t->name, graph_shape_str(t, shape, sizeof shape));
    }
    const char *name = part ? part : t ? t->name : "";
    int rc = graph_set_source(g, tensor, &name, NULL, 1, err);
    if (!rc)
        g->sources[g->n_sources - 1].transposed = 1;
    return rc;
}

const graph_source *graph_source_of(const graph *g, int t) {
    int s = g->tensors[t].source;
    return s > 0 && s <= g->n_sources ? &g->sources[s - 1] : NULL;
}

const char *graph_source_part(const graph *g, const graph_source *s, int k) {
    return g->source_names[s->first + k];
}

void graph_begin_layer(graph *g) {
    g->current_layer = g->n_layers++;
}

void graph_end_layer(graph *g) {
    g->current_layer = -1;
}

int graph_validate(const graph *g, stof_error *err) {
    if (g->n_ops == 0)
        return err_set(err, STOF_ERR_INVALID, "the model has no operators");
    if (g->output < 0)
        return err_set(err, STOF_ERR_INVALID, "the model sets no output");
    for (int i = 0; i < g->n_ops; i++) {
        const graph_op *op = &g->ops[i];
        for (int k = 0; k < op->n_inputs; k++) {
            const graph_tensor *t = &g->tensors[op->inputs[k]];
            if (t->producer >= i)
                return err_set(err, STOF_ERR_INTERNAL, "op #%d '%s' reads '%s' before it is made",
                               i, op->name, t->name);
        }
        if (op->kind == OP_ATTENTION && op->attr.attn.mask >= g->n_masks)
            return err_set(err, STOF_ERR_INTERNAL, "op #%d '%s' refers to a missing mask", i,
                           op->name);
    }
    return STOF_OK;
}

const char *stof_dtype_name(stof_dtype t) {
    switch (t) {
    case STOF_F32: return "fp32";
    case STOF_F16: return "fp16";
    case STOF_BF16: return "bf16";
    case STOF_I32: return "int32";
    }
    return "?";
}

size_t stof_dtype_size(stof_dtype t) {
    switch (t) {
    case STOF_F32: return 4;
    case STOF_F16: return 2;
    case STOF_BF16: return 2;
    case STOF_I32: return 4;
    }
    return 0;
}
