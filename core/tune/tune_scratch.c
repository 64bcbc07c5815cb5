/* Scratch tensors of the segments measured (tune_impl.h): every tensor a
 * segment reads or writes, several copies rotated when one fits in L2,
 * filled from the values kept; the spans of recent segments stay on the
 * device within the backend's budget, least recently used first out. */
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/util.h"
#include "core/io/weights.h"
#include "core/tune/tune_impl.h"

static void scratch_free_one(tune_backend *b, tune_scratch *sc) {
    if (sc->mem)
        b->drv->MemFree(sc->mem);
    free(sc->ptr);
    b->scratch_bytes -= sc->bytes;
}

void tune_scratch_drop_all(tune_backend *b) {
    for (int i = 0; i < b->n_scratch; i++)
        scratch_free_one(b, &b->scratch[i]);
    b->n_scratch = 0;
    b->cur = -1;
}

/* The tensors a launch of segment s touches: inputs made outside it, its
 * result, the stored pre-norm value. Each once; returns the count. */
static int span_tensors(const graph *g, const exec_segment *s, int *list) {
    int n = 0, last = s->first + s->n - 1;
    for (int k = s->first; k <= last; k++) {
        const graph_op *op = &g->ops[k];
        for (int i = 0; i < op->n_inputs; i++) {
            int t = op->inputs[i], seen = 0;
            if (tune_produced_inside(g, t, s->first, last))
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

int tune_is_output_of(const exec_segment *s, int t) {
    return t == s->out || t == s->pre_norm;
}

void tune_span_layout(const tune_backend *b, const graph *g, const exec_segment *s,
                      span_layout *l) {
    l->n = span_tensors(g, s, l->list);
    l->copy_bytes = 0;
    l->inputs = UTIL_HASH_SEED;
    for (int i = 0; i < l->n; i++) {
        const graph_tensor *x = &g->tensors[l->list[i]];
        uint64_t id = tune_tensor_identity(x);
        l->copy_bytes += exec_tensor_span(x);
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

static void stage_slice(void *arg, int k) {
    const stage_job *j = arg;
    size_t lo = j->n * (size_t)k / (size_t)j->slices;
    size_t hi = j->n * (size_t)(k + 1) / (size_t)j->slices;
    weights_store(j->dtype, j->f + lo, (int64_t)(hi - lo),
                  (char *)j->staged + lo * stof_dtype_size(j->dtype));
}

/* Fills tensor t of copy c on the device (f16, bf16, fp32 or int32) from the
 * values kept (computed now when nobody did ahead). */
static int upload_tensor(tune_backend *b, const graph *g, int t, int copy, CUdeviceptr d,
                         void *staged, stof_error *err) {
    const graph_tensor *x = &g->tensors[t];
    value_make vm = {g, t, b->opt.seed + (uint64_t)copy};
    uint64_t key = tune_value_key(g, t, copy);
    void *v;
    int rc = memo_get(b->values, key, tune_make_values, &vm, &v, err);
    if (rc)
        return rc;
    size_t n = (size_t)graph_tensor_numel(x);
    size_t slices = (n + TUNE_STAGE_SLICE - 1) / TUNE_STAGE_SLICE;
    stage_job j = {v, staged, x->dtype, n, slices ? (int)slices : 1};
    task_pool_parallel_for(b->pool, j.slices, stage_slice, &j);
    memo_unpin(b->values, key);
    return cuda_check(b->drv, b->drv->MemcpyHtoD(d, staged, graph_tensor_bytes(x)),
                      "cuMemcpyHtoD", err);
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
            if (!tune_is_output_of(s, l->list[i]))
                rc = upload_tensor(b, g, l->list[i], c, d, staged, err);
            at += exec_tensor_span(&g->tensors[l->list[i]]);
        }
    }
    free(staged);
    /* copies from pageable memory may still be in flight when cuMemcpyHtoD
     * returns, and the backend's stream does not wait for the legacy one */
    return rc ? rc : cuda_check(b->drv, b->drv->CtxSynchronize(NULL), "cuCtxSynchronize", err);
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
        tune_scratch_drop_all(b);
        r = b->drv->MemAlloc(&sc->mem, sc->bytes);
    }
    if (r != CUDA_SUCCESS) {
        sc->mem = 0;
        cuda_check(b->drv, r, "cuMemAlloc", err);
        return err_prefix(err, "scratch tensors of %d copies of %.1f MiB: ", sc->n_copies,
                          (double)sc->bytes / sc->n_copies / 1048576.0);
    }
    return STOF_OK;
}

/* A new span on the device, appended to the kept ones. */
static int scratch_new(tune_backend *b, const graph *g, const exec_segment *s,
                       stof_error *err) {
    span_layout l;
    tune_span_layout(b, g, s, &l);
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

int tune_scratch_find(const tune_backend *b, const exec_segment *s) {
    int last = s->first + s->n - 1;
    for (int i = 0; i < b->n_scratch; i++) {
        const tune_scratch *sc = &b->scratch[i];
        if (sc->first == s->first && sc->last == last && sc->pre_norm == s->pre_norm)
            return i;
    }
    return -1;
}

int tune_scratch_prepare(tune_backend *b, const graph *g, const exec_segment *s,
                         stof_error *err) {
    int i = tune_scratch_find(b, s);
    int rc = STOF_OK;
    if (i >= 0) {
        span_layout l;
        tune_span_layout(b, g, s, &l);
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

const tune_scratch *tune_scratch_current(const tune_backend *b) {
    return &b->scratch[b->cur];
}

