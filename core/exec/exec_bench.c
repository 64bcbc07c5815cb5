/* One segment alone on scratch tensors (exec.h, exec_bench): its kernel
 * planned and bound through the launcher row, launched, timed. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/exec/exec_impl.h"

struct exec_bench {
    exec_ctx *ctx;
    const graph *g;
    exec_segment s;
    const exec_launcher *launcher;
    void *kplan;
    /* A model that holds only what the launcher rows read: the context, the
     * graph and dtype, the addresses of one copy, the stream. */
    exec_plan plan;
    exec_model model;
    const CUdeviceptr *ptr; /* [n_copies][g->n_tensors], the caller's */
    int n_copies;
    exec_seg_rt *rt;        /* per copy */
};

static void use_copy(exec_bench *b, int c) {
    /* the launcher rows only read the model's addresses */
    b->model.ptr = (CUdeviceptr *)(uintptr_t)(b->ptr + (size_t)c * (size_t)b->g->n_tensors);
}

void exec_bench_free(exec_bench *b) {
    if (!b)
        return;
    for (int c = 0; b->rt && c < b->n_copies; c++)
        exec_seg_rt_release(&b->rt[c]);
    if (b->kplan)
        b->launcher->free_plan(&b->model, b->kplan);
    free(b->rt);
    free(b);
}

/* The kernel plan (compiled ahead, or now) bound to every copy. */
static int bench_plan(exec_bench *b, stof_error *err) {
    const cuda_driver *drv = b->ctx->drv;
    int rc = b->launcher->plan(&b->model, &b->s, &b->kplan, err);
    if (!rc) /* the kernel plan's tables, uploaded from pageable memory */
        rc = cuda_check(drv, drv->CtxSynchronize(NULL), "cuCtxSynchronize", err);
    for (int c = 0; !rc && c < b->n_copies; c++) {
        b->rt[c].launcher = b->launcher;
        b->rt[c].kplan = b->kplan;
        use_copy(b, c);
        rc = b->launcher->bind(&b->model, &b->s, &b->rt[c], err);
    }
    return rc;
}

int exec_bench_create(exec_ctx *c, const graph *g, const exec_segment *s, const CUdeviceptr *ptr,
                      int n_copies, CUstream st, exec_bench **out, stof_error *err) {
    *out = NULL;
    const exec_launcher *l = exec_launcher_get(s->tmpl);
    if (l->missing)
        return err_set(err, STOF_ERR_UNSUPPORTED, "template %s: %s",
                       fusion_template_get(s->tmpl) ? fusion_template_get(s->tmpl)->name : "?",
                       l->missing);
    if (n_copies < 1)
        return err_set(err, STOF_ERR_INVALID, "a bench needs at least one copy, got %d",
                       n_copies);
    exec_bench *b = err_calloc(1, sizeof *b, err);
    if (!b)
        return STOF_ERR_NOMEM;
    *b = (exec_bench){.ctx = c, .g = g, .s = *s, .launcher = l, .ptr = ptr, .n_copies = n_copies};
    b->plan.g = g;
    exec_model_dtype(g, &b->plan.dtype, NULL);
    b->model.ctx = c;
    b->model.plan = &b->plan;
    b->model.stream = st;
    use_copy(b, 0);
    b->rt = err_calloc((size_t)n_copies, sizeof *b->rt, err);
    int rc = b->rt ? bench_plan(b, err) : STOF_ERR_NOMEM;
    if (rc) {
        exec_bench_free(b);
        return rc;
    }
    *out = b;
    return STOF_OK;
}

int exec_bench_launch(exec_bench *b, int n, stof_error *err) {
    for (int i = 0; i < n; i++) {
        const exec_seg_rt *r = &b->rt[i % b->n_copies];
        int rc = r->launcher->launch(&b->model, r, b->model.stream, err);
        if (rc)
            return rc;
    }
    return STOF_OK;
}

int exec_bench_check_run(exec_bench *b, stof_error *err) {
    const cuda_driver *drv = b->ctx->drv;
    CUstream st = b->model.stream;
    int outs[2] = {b->s.out, b->s.pre_norm};
    use_copy(b, 0);
    int rc = STOF_OK;
    /* every byte 0xff: NaN in f16, bf16 and fp32 (a residual stream) alike */
    for (int k = 0; !rc && k < 2; k++)
        if (outs[k] >= 0)
            rc = cuda_check(drv,
                            drv->MemsetD8Async(b->model.ptr[outs[k]], 0xff,
                                               graph_tensor_bytes(&b->g->tensors[outs[k]]), st),
                            "cuMemsetD8Async", err);
    if (!rc)
        rc = b->launcher->launch(&b->model, &b->rt[0], st, err);
    if (!rc)
        rc = cuda_check(drv, drv->StreamSynchronize(st), "cuStreamSynchronize", err);
    if (!rc && b->launcher->status)
        rc = b->launcher->status(&b->model, &b->rt[0], err);
    return rc;
}

/* gpu_timer_work: n launches of a bench. */
typedef struct bench_work {
    exec_bench *b;
    int n;
    CUgraphExec replay; /* NULL: launched eagerly */
} bench_work;

static int bench_run(void *ud, CUstream st, stof_error *err) {
    const bench_work *w = ud;
    if (w->replay)
        return cuda_check(w->b->ctx->drv, w->b->ctx->drv->GraphLaunch(w->replay, st),
                          "cuGraphLaunch", err);
    return exec_bench_launch(w->b, w->n, err);
}

int exec_bench_time_once(exec_bench *b, gpu_timer *t, int n, double *ms, stof_error *err) {
    bench_work w = {b, n, NULL};
    return gpu_timer_once(t, b->model.stream, bench_run, &w, ms, err);
}

/* The n launches as one CUDA graph; NULL when capturing fails. */
static CUgraphExec capture(exec_bench *b, int n, CUgraph *captured) {
    const cuda_driver *drv = b->ctx->drv;
    CUstream st = b->model.stream;
    *captured = NULL;
    if (drv->StreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) != CUDA_SUCCESS)
        return NULL;
    int rc = exec_bench_launch(b, n, NULL);
    CUgraph g = NULL;
    CUresult end = drv->StreamEndCapture(st, &g);
    CUgraphExec ge = NULL;
    if (rc || end != CUDA_SUCCESS || !g || drv->GraphInstantiate(&ge, g, 0) != CUDA_SUCCESS) {
        if (g)
            drv->GraphDestroy(g);
        return NULL;
    }
    *captured = g;
    return ge;
}

int exec_bench_time(exec_bench *b, gpu_timer *t, int n, int reps, double *median_ms,
                    stof_error *err) {
    const cuda_driver *drv = b->ctx->drv;
    CUgraph captured;
    bench_work w = {b, n, capture(b, n, &captured)};
    int rc = gpu_timer_median(t, b->model.stream, 1, reps, bench_run, &w, median_ms, NULL, err);
    if (w.replay)
        drv->GraphExecDestroy(w.replay);
    if (captured)
        drv->GraphDestroy(captured);
    return rc;
}
