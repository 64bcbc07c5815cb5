/* The executor on the GPU: memory, uploads, the segments' kernel plans, the
 * forward pass eager and as a CUDA graph, timing, the output; and the
 * comparison with the CPU reference. */
#include "core/exec/exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/exec/exec_impl.h"
#include "core/ref/ref.h"
#include "core/base/util.h"
#include "core/io/weights.h"

/* ---- the context ------------------------------------------------------------------------- */

int exec_ctx_create(int ordinal, exec_ctx **out, stof_error *err) {
    *out = NULL;
    exec_ctx *c = err_calloc(1, sizeof *c, err);
    if (!c)
        return STOF_ERR_NOMEM;
    int rc = gemm_exec_ctx_create(ordinal, &c->gemm, err);
    if (!rc)
        rc = mha_exec_ctx_create(ordinal, &c->mha, err);
    if (rc) {
        exec_ctx_free(c);
        return rc;
    }
    c->drv = c->gemm->drv;
    c->ordinal = ordinal;
    *out = c;
    return STOF_OK;
}

void exec_ctx_free(exec_ctx *c) {
    if (!c)
        return;
    cublaslt_exec_ctx_free(c->lt);
    mha_exec_ctx_free(c->mha);
    gemm_exec_ctx_free(c->gemm);
    free(c);
}

const stof_device_info *exec_ctx_device(const exec_ctx *c) {
    return &c->gemm->info;
}

const char *exec_ctx_arch(const exec_ctx *c) {
    return c->gemm->arch;
}

const cuda_driver *exec_ctx_driver(const exec_ctx *c) {
    return c->drv;
}

int exec_ctx_make_current(exec_ctx *c, stof_error *err) {
    return cuda_check(c->drv, c->drv->CtxSetCurrent(c->gemm->cu), "cuCtxSetCurrent", err);
}

void exec_ctx_limits(const exec_ctx *c, mha_device_limits *lim) {
    mha_exec_device_limits(exec_ctx_device(c), exec_ctx_arch(c), lim);
}

nvrtc_cache *exec_ctx_build_cache(exec_ctx *c, const exec_build *b) {
    return b->attention ? &c->mha->nvrtc : &c->gemm->nvrtc;
}

void exec_ctx_caches(const exec_ctx *c, const nvrtc_cache *out[EXEC_CTX_CACHES]) {
    out[0] = &c->gemm->nvrtc;
    out[1] = &c->mha->nvrtc;
}

const char *exec_ctx_cache_warning(const exec_ctx *c, int *count) {
    const nvrtc_cache *caches[EXEC_CTX_CACHES];
    exec_ctx_caches(c, caches);
    const char *first = NULL;
    *count = 0;
    for (int i = 0; i < EXEC_CTX_CACHES; i++) {
        int n = 0;
        const char *w = nvrtc_cache_warning(caches[i], &n);
        first = first ? first : w;
        *count += n;
    }
    return first;
}

/* ---- memory -------------------------------------------------------------------------------- */

/* Host memory the weights and inputs are staged in: they are filled in
 * groups (tensors in graph order, this many bytes at most unless one tensor
 * alone is bigger), each group copied to the device before the next is
 * filled, so that a big model is never held on the host whole. */
#define EXEC_UPLOAD_GROUP_BYTES ((size_t)64 << 20)

/* The bytes the weights and inputs take in consts: all of them but those
 * bound in place (bound may be NULL), aligned as const_tensors lays them. */
static size_t const_bytes(const exec_plan *p, const CUdeviceptr *bound) {
    const graph *g = p->g;
    size_t span = 0;
    for (int t = 0; t < g->n_tensors; t++) {
        const graph_tensor *x = &g->tensors[t];
        if ((x->role == GRAPH_WEIGHT || x->role == GRAPH_INPUT) && !(bound && bound[t]))
            span += exec_tensor_span(x);
    }
    return span;
}

static int is_zeros(const graph_tensor *x) {
    return x->role == GRAPH_WEIGHT && x->constant && x->init == GRAPH_INIT_ZEROS;
}

/* The weights and inputs of m's graph in graph order (*n of them, the list
 * malloc'd; constant zeros placed but not listed), their places in m->consts
 * set in m->ptr; *span: the bytes they take there, *largest: the most a
 * listed one takes (aligned, both). */
static int const_tensors(exec_model *m, int **list, int *n, size_t *span, size_t *largest,
                         stof_error *err) {
    const graph *g = m->plan->g;
    *n = 0;
    *span = *largest = 0;
    *list = err_malloc(sizeof **list * (size_t)(g->n_tensors ? g->n_tensors : 1), err);
    if (!*list)
        return STOF_ERR_NOMEM;
    for (int t = 0; t < g->n_tensors; t++) {
        const graph_tensor *x = &g->tensors[t];
        if (x->role != GRAPH_WEIGHT && x->role != GRAPH_INPUT)
            continue;
        if (m->bound && m->bound[t]) { /* the caller's, in place */
            m->ptr[t] = m->bound[t];
            continue;
        }
        size_t bytes = exec_tensor_span(x);
        m->ptr[t] = m->consts + *span;
        *span += bytes;
        if (is_zeros(x))
            continue; /* set on the device, not staged on the host */
        (*list)[(*n)++] = t;
        *largest = bytes > *largest ? bytes : *largest;
    }
    return STOF_OK;
}

/* Zeros, whatever the weight file (a norm's missing bias; a KV cache's start), on the device
 * itself: a cache of gigabytes is not staged on the host. */
static int zero_consts(exec_model *m, stof_error *err) {
    const graph *g = m->plan->g;
    int rc = STOF_OK;
    for (int t = 0; !rc && t < g->n_tensors; t++)
        if ((g->tensors[t].role == GRAPH_WEIGHT || g->tensors[t].role == GRAPH_INPUT) &&
            is_zeros(&g->tensors[t]) && !(m->bound && m->bound[t]))
            rc = cuda_check(m->ctx->drv,
                            m->ctx->drv->MemsetD8Async(m->ptr[t], 0,
                                                       graph_tensor_bytes(&g->tensors[t]), 0),
                            "cuMemsetD8Async(zeros)", err);
    return rc ? rc : cuda_check(m->ctx->drv, m->ctx->drv->StreamSynchronize(0),
                                "cuStreamSynchronize(zeros)", err);
}

/* Fills and converts the tensors list[0..n) (weights_source_values_many,
 * into host memory laid out as on the device from the first one's place)
 * and copies each to its place in m->consts. */
static int upload_group(exec_model *m, const weights_source *src, const int *list, int n,
                        char *staged, void **outs, task_pool *pool, stof_error *err) {
    const graph *g = m->plan->g;
    const cuda_driver *drv = m->ctx->drv;
    for (int k = 0; k < n; k++)
        outs[k] = staged + (m->ptr[list[k]] - m->ptr[list[0]]);
    int rc = weights_source_values_many(src, g, list, n, WEIGHTS_STORED, outs, pool, err);
    for (int k = 0; !rc && k < n; k++) {
        const graph_tensor *x = &g->tensors[list[k]];
        rc = cuda_check(drv, drv->MemcpyHtoD(m->ptr[list[k]], outs[k], graph_tensor_bytes(x)),
                        "cuMemcpyHtoD", err);
        if (rc)
            err_prefix(err, "uploading '%s': ", x->name);
    }
    return rc;
}

/* Every input and weight filled and converted on the host, on threads
 * (weights_pool), and copied to its place in m->consts, group by group. */
static int upload_consts(exec_model *m, const weights_source *src, stof_error *err) {
    const graph *g = m->plan->g;
    int *list = NULL, n = 0;
    size_t span = 0, largest = 0;
    int rc = const_tensors(m, &list, &n, &span, &largest, err);
    size_t room = largest > EXEC_UPLOAD_GROUP_BYTES ? largest : EXEC_UPLOAD_GROUP_BYTES;
    room = room < span ? room : span;
    char *staged = rc ? NULL : err_malloc(room + 1, err);
    void **outs = rc ? NULL : err_malloc(sizeof *outs * (size_t)(n ? n : 1), err);
    if (!rc && (!staged || !outs))
        rc = STOF_ERR_NOMEM;
    task_pool *pool = rc ? NULL : weights_pool(g);
    for (int i = 0, next; !rc && i < n; i = next) {
        CUdeviceptr start = m->ptr[list[i]];
        next = i + 1;
        while (next < n &&
               m->ptr[list[next]] - start + exec_tensor_span(&g->tensors[list[next]]) <= room)
            next++;
        rc = upload_group(m, src, list + i, next - i, staged, outs, pool, err);
    }
    task_pool_free(pool);
    free(outs);
    free(staged);
    free(list);
    return rc ? rc : zero_consts(m, err);
}

/* ---- segments' kernels --------------------------------------------------------------------- */

/* Each segment's launcher and kernel plan, shared with its twin (exec_segment_twin) where it
 * has one. */
static int prepare_segments(exec_model *m, stof_error *err) {
    const exec_plan *p = m->plan;
    char name[256], seq[96];
    for (int s = 0; s < p->n_segs; s++) {
        const exec_segment *sg = &p->segs[s];
        exec_seg_rt *rt = &m->rt[s];
        rt->launcher = exec_launcher_get(sg->tmpl);
        int rc = STOF_OK;
        if (rt->launcher->missing) {
            rc = err_set(err, STOF_ERR_UNSUPPORTED, "template %s: %s",
                         fusion_template_get(sg->tmpl)->name, rt->launcher->missing);
        } else {
            int twin = exec_segment_twin(p, s);
            if (twin >= 0) {
                rt->kplan = m->rt[twin].kplan;
            } else {
                rc = rt->launcher->plan(m, sg, &rt->kplan, err);
                rt->owns_kplan = rt->kplan != NULL;
            }
            if (!rc)
                rc = rt->launcher->bind(m, sg, rt, err);
        }
        if (rc)
            return err_prefix(err, "%s, %s: ", exec_seq_name(&p->seqs[sg->seq], seq, sizeof seq),
                              exec_segment_name(p->g, sg->first, sg->n, name, sizeof name));
    }
    return STOF_OK;
}

/* ---- the model ------------------------------------------------------------------------------ */

void exec_model_free(exec_model *m) {
    if (!m)
        return;
    exec_ctx *c = m->ctx;
    const cuda_driver *drv = c->drv;
    drv->CtxSetCurrent(c->gemm->cu);
    if (m->stream)
        drv->StreamSynchronize(m->stream);
    exec_pack_free(m);
    if (m->graph_exec)
        drv->GraphExecDestroy(m->graph_exec);
    if (m->graph)
        drv->GraphDestroy(m->graph);
    if (m->rt)
        for (int s = 0; s < m->plan->n_segs; s++) {
            exec_seg_rt_release(&m->rt[s]);
            if (m->rt[s].owns_kplan)
                m->rt[s].launcher->free_plan(m, m->rt[s].kplan);
        }
    gpu_timer_free(&m->timer);
    exec_prefetch_free(m);
    if (m->stream)
        drv->StreamDestroy(m->stream);
    if (m->arena)
        drv->MemFree(m->arena);
    if (m->consts)
        drv->MemFree(m->consts);
    free(m->rt);
    free(m->ptr);
    free(m);
}

int exec_model_create(exec_ctx *c, const exec_plan *p, const weights_source *src,
                      exec_model **out, stof_error *err) {
    return exec_model_create_bound(c, p, src, NULL, out, err);
}

int exec_model_create_bound(exec_ctx *c, const exec_plan *p, const weights_source *src,
                            const CUdeviceptr *bound, exec_model **out, stof_error *err) {
    *out = NULL;
    int checked = weights_source_check(src, p->g, err);
    if (checked)
        return checked;
    exec_model *m = err_calloc(1, sizeof *m, err);
    if (!m)
        return STOF_ERR_NOMEM;
    m->ctx = c;
    m->plan = p;
    m->bound = bound;
    m->ptr = err_calloc((size_t)p->g->n_tensors, sizeof *m->ptr, err);
    m->rt = err_calloc((size_t)(p->n_segs ? p->n_segs : 1), sizeof *m->rt, err);
    const cuda_driver *drv = c->drv;
    int rc = m->ptr && m->rt ? STOF_OK : STOF_ERR_NOMEM;
    if (!rc)
        rc = cuda_check(drv, drv->CtxSetCurrent(c->gemm->cu), "cuCtxSetCurrent", err);
    if (!rc)
        rc = exec_device_alloc(c, &m->consts, const_bytes(p, bound), "weights and inputs", err);
    if (!rc)
        rc = exec_device_alloc(c, &m->arena, p->arena_bytes, "the activation arena", err);
    if (!rc)
        rc = cuda_check(drv, drv->StreamCreate(&m->stream, CU_STREAM_NON_BLOCKING),
                        "cuStreamCreate", err);
    if (!rc)
        rc = gpu_timer_create(drv, &m->timer, err);
    if (!rc) {
        for (int b = 0; b < p->n_bufs; b++)
            m->ptr[p->bufs[b].tensor] = m->arena + p->bufs[b].offset;
        rc = upload_consts(m, src, err);
    }
    if (!rc)
        rc = prepare_segments(m, err);
    if (!rc)
        rc = exec_prefetch_create(m, err);
    if (!rc)
        rc = exec_pack_create(m, err);
    /* copies from pageable memory (the weights, the kernel plans' tables) may
     * still be in flight when cuMemcpyHtoD returns, and the model's stream
     * does not wait for the legacy stream */
    if (!rc)
        rc = cuda_check(drv, drv->CtxSynchronize(NULL), "cuCtxSynchronize", err);
    if (!rc) /* an attention_mask among the inputs uploaded: its batch runs packed */
        rc = exec_pack_select(m, err);
    if (rc) {
        exec_model_free(m);
        return rc;
    }
    *out = m;
    return STOF_OK;
}

/* Segment s's kernels on the model's stream; errors name the segment. */
static int launch_segment(exec_model *m, int s, stof_error *err) {
    const exec_seg_rt *rt = &m->rt[s];
    int rc = exec_pack_active(m) ? exec_pack_launch(m, s, m->stream, err)
                                 : rt->launcher->launch(m, rt, m->stream, err);
    if (rc) {
        char name[256];
        const exec_segment *sg = &m->plan->segs[s];
        return err_prefix(err, "%s: ",
                          exec_segment_name(m->plan->g, sg->first, sg->n, name, sizeof name));
    }
    return STOF_OK;
}

/* Every segment's kernel on the model's stream, in order. */
static int launch_all(exec_model *m, stof_error *err) {
    int rc = STOF_OK;
    for (int s = 0; !rc && s < m->plan->n_segs; s++)
        rc = launch_segment(m, s, err);
    return rc;
}

/* The same on stream st while it is captured into a graph, with weights asked of L2 ahead
 * on a side branch of the graph (exec_prefetch.c), joined back whatever happened (a capture
 * must not end with a branch left open). */
static int launch_all_captured(exec_model *m, CUstream st, stof_error *err) {
    int rc = STOF_OK;
    for (int s = 0; !rc && s < m->plan->n_segs; s++) {
        const exec_seg_rt *rt = &m->rt[s];
        rc = exec_prefetch_before(m, s, st, err);
        if (!rc)
            rc = exec_pack_active(m) ? exec_pack_launch(m, s, st, err)
                                     : rt->launcher->launch(m, rt, st, err);
    }
    int joined = exec_prefetch_join(m, st, rc ? NULL : err);
    return rc ? rc : joined;
}

static int sync_stream(exec_model *m, stof_error *err) {
    return cuda_check(m->ctx->drv, m->ctx->drv->StreamSynchronize(m->stream),
                      "cuStreamSynchronize (a kernel of the forward pass failed)", err);
}

/* After a pass: the errors its kernels flagged on the device (bad ids). */
static int segments_status(exec_model *m, stof_error *err) {
    /* the padded pass's flags first: a replay inside the caller's capture ran it */
    int rc = STOF_OK;
    for (int s = 0; !rc && s < m->plan->n_segs; s++)
        if (m->rt[s].launcher->status)
            rc = m->rt[s].launcher->status(m, &m->rt[s], err);
    return rc || !exec_pack_active(m) ? rc : exec_pack_status(m, err);
}

int exec_model_status(exec_model *m, stof_error *err) {
    int rc = cuda_check(m->ctx->drv, m->ctx->drv->CtxSetCurrent(m->ctx->gemm->cu),
                        "cuCtxSetCurrent", err);
    if (!rc)
        rc = sync_stream(m, err);
    return rc ? rc : segments_status(m, err);
}

int exec_model_run(exec_model *m, stof_error *err) {
    int rc = cuda_check(m->ctx->drv, m->ctx->drv->CtxSetCurrent(m->ctx->gemm->cu),
                        "cuCtxSetCurrent", err);
    if (!rc)
        rc = launch_all(m, err);
    if (!rc)
        rc = sync_stream(m, err);
    if (!rc)
        rc = segments_status(m, err);
    return rc;
}

/* Records ev on the capturing stream as an event node of the graph (an
 * ordinary record inside a capture only orders the graph's own nodes, and
 * the event cannot be waited for or timed). */
static int record_node(exec_model *m, CUevent ev, stof_error *err) {
    const cuda_driver *drv = m->ctx->drv;
    return cuda_check(drv, drv->EventRecordWithFlags(ev, m->stream, CU_EVENT_RECORD_EXTERNAL),
                      "cuEventRecordWithFlags(external)", err);
}

/* Captures the forward pass with event ev[s] recorded before segment s and
 * ev[n] after the last. */
static int record_segments(exec_model *m, CUevent *ev, stof_error *err) {
    int rc = record_node(m, ev[0], err);
    for (int s = 0; !rc && s < m->plan->n_segs; s++) {
        rc = launch_segment(m, s, err);
        if (!rc)
            rc = record_node(m, ev[s + 1], err);
    }
    return rc;
}

/* One forward pass captured into a CUDA graph: launch_all, or with events
 * ev (not NULL) record_segments, whose events become event nodes. On
 * success *exec replays it and *captured is destroyed with it; on failure
 * nothing is left. */
static int capture_pass(exec_model *m, CUevent *ev, CUgraph *captured, CUgraphExec *exec,
                        stof_error *err) {
    const cuda_driver *drv = m->ctx->drv;
    *captured = NULL;
    *exec = NULL;
    int rc = cuda_check(drv, drv->CtxSetCurrent(m->ctx->gemm->cu), "cuCtxSetCurrent", err);
    if (!rc)
        rc = cuda_check(drv, drv->StreamBeginCapture(m->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                        "cuStreamBeginCapture", err);
    if (rc)
        return rc;
    rc = ev ? record_segments(m, ev, err) : launch_all_captured(m, m->stream, err);
    /* end the capture whatever happened: the stream must not stay capturing */
    int end = cuda_check(drv, drv->StreamEndCapture(m->stream, captured), "cuStreamEndCapture",
                         rc ? NULL : err);
    if (!rc)
        rc = end;
    if (!rc)
        rc = cuda_check(drv, drv->GraphInstantiate(exec, *captured, 0),
                        "cuGraphInstantiateWithFlags", err);
    if (rc) {
        *exec = NULL;
        if (*captured)
            drv->GraphDestroy(*captured);
        *captured = NULL;
    }
    return rc;
}

int exec_model_capture(exec_model *m, stof_error *err) {
    CUgraph *captured;
    CUgraphExec *exec;
    exec_pack_graph_slots(m, &captured, &exec);
    return *exec ? STOF_OK : capture_pass(m, NULL, captured, exec, err);
}

int exec_model_graph_edges(const exec_model *m, exec_graph_edges *out, stof_error *err) {
    const cuda_driver *drv = m->ctx->drv;
    memset(out, 0, sizeof *out);
    CUgraph captured = exec_pack_captured(m);
    if (!captured)
        return err_set(err, STOF_ERR_INVALID, "no CUDA graph captured yet");
    size_t n = 0;
    int rc = cuda_check(drv, drv->GraphGetEdges(captured, NULL, NULL, NULL, &n),
                        "cuGraphGetEdges", err);
    if (rc || n == 0)
        return rc;
    CUgraphNode *from = err_malloc(sizeof *from * n * 2, err);
    CUgraphEdgeData *data = err_calloc(n, sizeof *data, err);
    if (!from || !data)
        rc = STOF_ERR_NOMEM;
    if (!rc)
        rc = cuda_check(drv, drv->GraphGetEdges(captured, from, from + n, data, &n),
                        "cuGraphGetEdges", err);
    for (size_t i = 0; !rc && i < n; i++)
        out->programmatic += data[i].type == CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
    if (!rc)
        out->edges = n;
    free(from);
    free(data);
    return rc;
}

static int replay_async(exec_model *m, stof_error *err) {
    CUgraph *captured;
    CUgraphExec *exec;
    exec_pack_graph_slots(m, &captured, &exec);
    if (!*exec)
        return err_set(err, STOF_ERR_INVALID, "the forward pass was not captured "
                       "(exec_model_capture)");
    return cuda_check(m->ctx->drv, m->ctx->drv->GraphLaunch(*exec, m->stream),
                      "cuGraphLaunch", err);
}

int exec_model_replay(exec_model *m, stof_error *err) {
    int rc = cuda_check(m->ctx->drv, m->ctx->drv->CtxSetCurrent(m->ctx->gemm->cu),
                        "cuCtxSetCurrent", err);
    if (!rc)
        rc = replay_async(m, err);
    return rc ? rc : sync_stream(m, err);
}

/* gpu_timer_work: one forward pass, eager (ud: the model). */
static int pass_eager(void *ud, CUstream st, stof_error *err) {
    (void)st;
    return launch_all(ud, err);
}

/* gpu_timer_work: one replay of the captured forward pass (ud: the model). */
static int pass_replay(void *ud, CUstream st, stof_error *err) {
    (void)st;
    return replay_async(ud, err);
}

int exec_model_time(exec_model *m, int use_graph, int reps, double *median_ms, stof_error *err) {
    *median_ms = 0;
    if (reps < 1)
        return err_set(err, STOF_ERR_INVALID, "timing needs at least one run, got %d", reps);
    const cuda_driver *drv = m->ctx->drv;
    int rc = cuda_check(drv, drv->CtxSetCurrent(m->ctx->gemm->cu), "cuCtxSetCurrent", err);
    if (!rc)
        rc = gpu_timer_median(&m->timer, m->stream, 1, reps, use_graph ? pass_replay : pass_eager,
                              m, median_ms, NULL, err);
    return rc ? rc : sync_stream(m, err);
}

/* Median of column s of a reps x n table (scratch: reps doubles). */
static double column_median(const double *t, int reps, int n, int s, double *scratch) {
    for (int r = 0; r < reps; r++)
        scratch[r] = t[(size_t)r * (size_t)n + (size_t)s];
    return util_median(scratch, reps);
}

/* One replay of the profile graph; row gets each segment's milliseconds. */
static int profile_once(exec_model *m, CUevent *ev, CUgraphExec exec, double *row,
                        stof_error *err) {
    const cuda_driver *drv = m->ctx->drv;
    int n = m->plan->n_segs;
    int rc = cuda_check(drv, drv->GraphLaunch(exec, m->stream), "cuGraphLaunch", err);
    if (!rc)
        rc = cuda_check(drv, drv->EventSynchronize(ev[n]), "cuEventSynchronize", err);
    for (int s = 0; !rc && s < n; s++) {
        float t = 0;
        rc = cuda_check(drv, drv->EventElapsedTime(&t, ev[s], ev[s + 1]), "cuEventElapsedTime",
                        err);
        row[s] = t;
    }
    return rc;
}

int exec_model_profile(exec_model *m, int reps, double *seg_ms, stof_error *err) {
    const exec_plan *p = m->plan;
    const cuda_driver *drv = m->ctx->drv;
    for (int s = 0; s < p->n_segs; s++)
        seg_ms[s] = 0;
    if (reps < 1)
        return err_set(err, STOF_ERR_INVALID, "profiling needs at least one run, got %d", reps);
    int n = p->n_segs;
    CUevent *ev = err_calloc((size_t)n + 1, sizeof *ev, err);
    double *table = err_malloc(sizeof *table * (size_t)reps * (size_t)(n ? n : 1), err);
    double *scratch = err_malloc(sizeof *scratch * (size_t)reps, err);
    CUgraph captured = NULL;
    CUgraphExec exec = NULL;
    int rc = ev && table && scratch ? STOF_OK : STOF_ERR_NOMEM;
    if (!rc)
        rc = cuda_check(drv, drv->CtxSetCurrent(m->ctx->gemm->cu), "cuCtxSetCurrent", err);
    for (int k = 0; !rc && k <= n; k++)
        rc = cuda_check(drv, drv->EventCreate(&ev[k], CU_EVENT_DEFAULT), "cuEventCreate", err);
    if (!rc)
        rc = capture_pass(m, ev, &captured, &exec, err);
    if (!rc) /* warm-up */
        rc = profile_once(m, ev, exec, table, err);
    for (int r = 0; !rc && r < reps; r++)
        rc = profile_once(m, ev, exec, table + (size_t)r * (size_t)n, err);
    if (!rc)
        rc = sync_stream(m, err);
    for (int s = 0; !rc && s < n; s++)
        seg_ms[s] = column_median(table, reps, n, s, scratch);
    if (exec)
        drv->GraphExecDestroy(exec);
    if (captured)
        drv->GraphDestroy(captured);
    for (int k = 0; ev && k <= n; k++)
        if (ev[k])
            drv->EventDestroy(ev[k]);
    free(ev);
    free(table);
    free(scratch);
    return rc;
}

int exec_model_measure(exec_ctx *c, const exec_plan *p, uint64_t seed, int reps,
                       double *eager_ms, double *graph_ms, float *output, stof_error *err) {
    exec_model *m = NULL;
    weights_source src = weights_source_seeded(seed);
    int rc = exec_model_create(c, p, &src, &m, err);
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

int exec_model_output(exec_model *m, float *out, stof_error *err) {
    const graph *g = m->plan->g;
    const graph_tensor *t = &g->tensors[g->output];
    size_t n = (size_t)graph_tensor_numel(t);
    uint16_t *h = err_malloc(n * sizeof *h + 1, err);
    if (!h)
        return STOF_ERR_NOMEM;
    const cuda_driver *drv = m->ctx->drv;
    int rc = cuda_check(drv, drv->CtxSetCurrent(m->ctx->gemm->cu), "cuCtxSetCurrent", err);
    if (!rc)
        rc = sync_stream(m, err);
    if (!rc)
        rc = cuda_check(drv, drv->MemcpyDtoH(h, exec_pack_output(m), n * sizeof *h),
                        "cuMemcpyDtoH(output)", err);
    for (size_t i = 0; !rc && i < n; i++)
        out[i] = t->dtype == STOF_BF16 ? util_bf16_to_f32(h[i]) : util_f16_to_f32(h[i]);
    free(h);
    return rc;
}

fusion_template_id exec_model_template(const exec_model *m, int seg) {
    const exec_seg_rt *rt = &m->rt[seg];
    fusion_template_id planned = m->plan->segs[seg].tmpl;
    return rt->kplan && rt->launcher->actual ? rt->launcher->actual(rt->kplan, planned) : planned;
}

size_t exec_model_describe(const exec_model *m, int seg, char *buf, size_t n) {
    const exec_seg_rt *rt = &m->rt[seg];
    if (!rt->kplan || !rt->launcher->describe) {
        if (n)
            buf[0] = '\0';
        return 0;
    }
    return rt->launcher->describe(rt->kplan, buf, n);
}

/* ---- the CPU reference ---------------------------------------------------------------------- */

int exec_reference(const graph *g, const weights_source *src, float **out, stof_error *err) {
    *out = NULL;
    ref_values rv;
    int rc = ref_values_init(g, src, &rv, err);
    if (rc)
        return rc;
    rc = ref_execute(g, &rv, err);
    if (!rc) {
        /* hand the output over instead of copying it */
        *out = rv.data[g->output];
        rv.data[g->output] = NULL;
    }
    ref_values_free(&rv);
    return rc;
}

void exec_compare(const float *got, const float *ref, int64_t n, exec_diff *d) {
    double diff2 = 0, ref2 = 0;
    memset(d, 0, sizeof *d);
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            d->n_nonfinite++;
            continue;
        }
        double e = (double)got[i] - (double)ref[i];
        diff2 += e * e;
        ref2 += (double)ref[i] * ref[i];
        if (fabs(e) > d->max_abs)
            d->max_abs = fabs(e);
    }
    d->rel_error = ref2 > 0 ? sqrt(diff2 / ref2) : sqrt(diff2);
    if (d->n_nonfinite)
        d->rel_error = INFINITY;
}

/* ---- runs on the caller's tensors -------------------------------------------------------- */

/* `later` waits, on the device, for what is queued on `earlier` so far. */
static int order_streams(const cuda_driver *drv, CUstream earlier, CUstream later,
                         stof_error *err) {
    CUevent ev;
    int rc = cuda_check(drv, drv->EventCreate(&ev, CU_EVENT_DISABLE_TIMING), "cuEventCreate",
                        err);
    if (rc)
        return rc;
    rc = cuda_check(drv, drv->EventRecord(ev, earlier), "cuEventRecord", err);
    if (!rc)
        rc = cuda_check(drv, drv->StreamWaitEvent(later, ev, 0), "cuStreamWaitEvent", err);
    drv->EventDestroy(ev); /* released once the wait is done */
    return rc;
}

static int copy_input(exec_model *m, const exec_io *io, CUstream st, stof_error *err) {
    const cuda_driver *drv = m->ctx->drv;
    const graph_tensor *t = &m->plan->g->tensors[io->tensor];
    size_t bytes = graph_tensor_bytes(t);
    if (io->data)
        return cuda_check(drv, drv->MemcpyDtoDAsync(m->ptr[io->tensor], io->data, bytes, st),
                          "cuMemcpyDtoDAsync(input)", err);
    if (!graph_input_optional(t))
        return err_set(err, STOF_ERR_INVALID, "input '%s' is needed (only an optional input "
                       "may be left out)", t->name);
    /* an attention_mask left out: ones (no padding); another optional input: zeros */
    if (t->init == GRAPH_INIT_PADDING)
        return cuda_check(drv, drv->MemsetD32Async(m->ptr[io->tensor], 1, bytes / 4, st),
                          "cuMemsetD32Async(attention_mask: no padding)", err);
    return cuda_check(drv, drv->MemsetD8Async(m->ptr[io->tensor], 0, bytes, st),
                      "cuMemsetD8Async(an optional input left out: zeros)", err);
}

/* A given attention_mask, read back: right padding, or an error naming the
 * row (the kernels find a row's length by bisection, which only right
 * padding makes exact). The output is not copied out when it is wrong. */
static int check_attention_mask(exec_model *m, int t, stof_error *err) {
    const graph_tensor *x = &m->plan->g->tensors[t];
    if (x->init != GRAPH_INIT_PADDING)
        return STOF_OK;
    int32_t *v = err_malloc(graph_tensor_bytes(x), err);
    int rc = v ? exec_read_input_mask(m, t, v, err) : STOF_ERR_NOMEM;
    free(v);
    return rc;
}

CUdeviceptr exec_model_tensor(const exec_model *m, int t) {
    return t >= 0 && t < m->plan->g->n_tensors ? m->ptr[t] : 0;
}

static int copy_output(exec_model *m, CUdeviceptr out, CUstream st, stof_error *err) {
    const graph *g = m->plan->g;
    if (!out)
        return STOF_OK;
    return cuda_check(m->ctx->drv,
                      m->ctx->drv->MemcpyDtoDAsync(out, exec_pack_output(m),
                                                   graph_tensor_bytes(&g->tensors[g->output]),
                                                   st),
                      "cuMemcpyDtoDAsync(output)", err);
}

/* Inside the caller's stream capture (a CUDA graph of theirs): the copies
 * and every kernel go on their stream, as nodes of their graph; nothing
 * waits. The embedding's bad-id flag is read by the next run outside a
 * capture. */
static int run_io_captured(exec_model *m, const exec_io *in, int n, CUdeviceptr out,
                           CUstream caller, stof_error *err) {
    int rc = STOF_OK;
    exec_pack_off(m); /* the mask is not on the device yet: the padded pass */
    for (int i = 0; !rc && i < n; i++)
        rc = copy_input(m, &in[i], caller, err);
    if (!rc)
        rc = launch_all_captured(m, caller, err);
    return rc ? rc : copy_output(m, out, caller, err);
}

int exec_model_run_io(exec_model *m, const exec_io *in, int n, CUdeviceptr out, CUstream caller,
                      stof_error *err) {
    const cuda_driver *drv = m->ctx->drv;
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    int rc = cuda_check(drv, drv->CtxSetCurrent(m->ctx->gemm->cu), "cuCtxSetCurrent", err);
    if (!rc)
        rc = cuda_check(drv, drv->StreamIsCapturing(caller, &capture), "cuStreamIsCapturing",
                        err);
    if (!rc && capture != CU_STREAM_CAPTURE_STATUS_NONE)
        return run_io_captured(m, in, n, out, caller, err);
    if (!rc)
        rc = order_streams(drv, caller, m->stream, err);
    for (int i = 0; !rc && i < n; i++)
        rc = copy_input(m, &in[i], m->stream, err);
    if (!rc)
        rc = exec_pack_select(m, err); /* checks the attention_mask when the model packs */
    if (!rc)
        rc = exec_model_capture(m, err);
    if (!rc)
        rc = replay_async(m, err);
    if (!rc)
        rc = sync_stream(m, err);
    if (!rc)
        rc = segments_status(m, err);
    for (int i = 0; !rc && !m->pack && i < n; i++)
        if (in[i].data)
            rc = check_attention_mask(m, in[i].tensor, err);
    if (!rc)
        rc = copy_output(m, out, m->stream, err);
    if (!rc)
        rc = order_streams(drv, m->stream, caller, err);
    return rc;
}
