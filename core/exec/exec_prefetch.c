/* Weights asked of L2 ahead of the kernels that read them, in a pass captured into a CUDA graph
 * (a decode step's, the model's own): before segment s is launched, a side branch of the graph
 * that starts once segment s - 1 has finished asks L2 for the largest GEMM weight of segment
 * s + lead (kernels/util.cu's stof_prefetch_l2), so that its bytes stream from memory while the
 * kernels in between run. At one token a sequence most kernels are short and each GEMM's first
 * reads wait on memory: a GEMM of 12 MB took 9.5 us from memory and 5.4 us from L2
 * (tests/gpu_gemv, H200). The side branch joins the caller's stream at the end of the pass
 * (when it forked at all: a stream that never joined the capture cannot be waited on).
 *
 * Off by default. A first version, which asked for a segment's largest weight of any kind (so an
 * attention's K cache too, a decode step's weight), made decode steps on an H200 (32 tokens after
 * prompts of 128, graph replay): gpt2-124M 0.419 -> 0.392 ms at batch 1 and 0.456 -> 0.425 at
 * batch 8 with a lead of 1, no better with 2 or 4; a Mistral-shaped 1B 0.993 -> 0.995 with 1 but
 * 1.058 with 2 and 1.101 with 4 (prefetched lines pushed out of L2 before their kernel reads
 * them). Asking for a cache's first bytes helps no one (they are a few sequences' rows, mostly not
 * yet written), so only GEMM weights are asked for now. Measured so, on an H200 (32 tokens after
 * prompts of 128, ms a step, off -> a lead of 1): the 1B 0.972 -> 0.993 at batch 1 and 0.977 ->
 * 1.018 at batch 8, gpt2-124M 0.429 -> 0.433 and 0.465 -> 0.463; asking only beside segments that
 * read under 4 or 16 MB of weights themselves (the norms, the attention) did no better (1.006 on
 * the 1B, 0.428-0.432 on gpt2). So it stays off. sm_90 and later (bulk prefetch); STOF_PREFETCH=N
 * sets a lead (0: none). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/exec/exec_impl.h"

/* The most a prefetch asks for: under L2's size (50 MB on an H100 or H200), so that it does
 * not push out what the kernels in between read. */
#define PREFETCH_MAX_BYTES ((int64_t)24 << 20)
#define PREFETCH_DEFAULT_LEAD 0

struct exec_prefetch {
    int lead;          /* 1 .. segments */
    int forked;        /* this pass forked the side stream into the capture */
    CUstream side;
    CUevent fork, join;
    CUfunction fn;
    CUdeviceptr *at;   /* per segment: its largest weight, 0 for none */
    int64_t *bytes;
};

/* STOF_PREFETCH: a lead of 0 to `segments` (0: none); the default when unset or not a
 * number. */
static int lead_of_env(int segments) {
    const char *v = getenv("STOF_PREFETCH");
    char *end;
    long n = v && *v ? strtol(v, &end, 10) : -1;
    if (!v || !*v || *end || n < 0)
        return PREFETCH_DEFAULT_LEAD;
    return n < segments ? (int)n : segments;
}

/* Segment s's largest GEMM weight (cut to PREFETCH_MAX_BYTES and 16-byte pieces). */
static void largest_weight(const exec_model *m, int s, CUdeviceptr *at, int64_t *bytes) {
    const graph *g = m->plan->g;
    const exec_segment *sg = &m->plan->segs[s];
    *at = 0;
    *bytes = 0;
    for (int i = sg->first; i < sg->first + sg->n; i++) {
        if (g->ops[i].kind != OP_GEMM)
            continue;
        const int w = g->ops[i].inputs[1];
        const graph_tensor *t = &g->tensors[w];
        int64_t b = (int64_t)graph_tensor_bytes(t);
        if (t->role == GRAPH_WEIGHT && b > *bytes && m->ptr[w]) {
            *at = m->ptr[w];
            *bytes = b;
        }
    }
    if (*bytes > PREFETCH_MAX_BYTES)
        *bytes = PREFETCH_MAX_BYTES;
    *bytes &= ~(int64_t)15;
    if (*at % 16 || *bytes == 0)
        *at = 0;
}

int exec_prefetch_create(exec_model *m, stof_error *err) {
    const int lead = lead_of_env(m->plan->n_segs);
    if (lead == 0 || m->ctx->gemm->info.cc_major < 9)
        return STOF_OK;
    const cuda_driver *drv = m->ctx->drv;
    exec_prefetch *pf = err_calloc(1, sizeof *pf, err);
    const int n = m->plan->n_segs;
    if (!pf)
        return STOF_ERR_NOMEM;
    m->prefetch = pf;
    pf->lead = lead;
    pf->at = err_calloc((size_t)n + 1, sizeof *pf->at, err);
    pf->bytes = err_calloc((size_t)n + 1, sizeof *pf->bytes, err);
    if (!pf->at || !pf->bytes)
        return STOF_ERR_NOMEM;
    for (int s = 0; s < n; s++)
        largest_weight(m, s, &pf->at[s], &pf->bytes[s]);
    nvrtc_request req = {.source = "util.cu", .arch = m->ctx->gemm->arch};
    gpu_module *mod;
    int rc = gpu_ctx_function(m->ctx->gemm, &req, "stof_prefetch_l2", 0, &mod, err);
    if (!rc)
        pf->fn = mod->func;
    if (!rc)
        rc = cuda_check(drv, drv->StreamCreate(&pf->side, CU_STREAM_NON_BLOCKING),
                        "cuStreamCreate(prefetch)", err);
    if (!rc)
        rc = cuda_check(drv, drv->EventCreate(&pf->fork, CU_EVENT_DISABLE_TIMING),
                        "cuEventCreate(prefetch)", err);
    if (!rc)
        rc = cuda_check(drv, drv->EventCreate(&pf->join, CU_EVENT_DISABLE_TIMING),
                        "cuEventCreate(prefetch)", err);
    return rc;
}

void exec_prefetch_free(exec_model *m) {
    exec_prefetch *pf = m->prefetch;
    if (!pf)
        return;
    const cuda_driver *drv = m->ctx->drv;
    if (pf->fork)
        drv->EventDestroy(pf->fork);
    if (pf->join)
        drv->EventDestroy(pf->join);
    if (pf->side)
        drv->StreamDestroy(pf->side);
    free(pf->at);
    free(pf->bytes);
    free(pf);
    m->prefetch = NULL;
}

int exec_prefetch_before(exec_model *m, int s, CUstream caller, stof_error *err) {
    exec_prefetch *pf = m->prefetch;
    const int target = s + (pf ? pf->lead : 0);
    if (!pf || target >= m->plan->n_segs || !pf->at[target])
        return STOF_OK;
    const cuda_driver *drv = m->ctx->drv;
    CUdeviceptr base = pf->at[target];
    long long bytes = pf->bytes[target];
    pf->forked = 1;
    void *params[] = {&base, &bytes};
    /* a 16 KiB piece a thread, 32 threads a block: the pieces spread over the SMs */
    const unsigned grid[3] = {(unsigned)((bytes + (32 << 14) - 1) / (32 << 14)), 1, 1},
                   block[3] = {32, 1, 1};
    int rc = cuda_check(drv, drv->EventRecord(pf->fork, caller), "cuEventRecord(prefetch)", err);
    if (!rc)
        rc = cuda_check(drv, drv->StreamWaitEvent(pf->side, pf->fork, 0),
                        "cuStreamWaitEvent(prefetch)", err);
    return rc ? rc : cuda_launch(drv, pf->fn, grid, block, 0, pf->side, params, 0,
                                 "cuLaunchKernel(prefetch)", err);
}

int exec_prefetch_join(exec_model *m, CUstream caller, stof_error *err) {
    exec_prefetch *pf = m->prefetch;
    if (!pf || !pf->forked)
        return STOF_OK;
    pf->forked = 0;
    const cuda_driver *drv = m->ctx->drv;
    int rc = cuda_check(drv, drv->EventRecord(pf->join, pf->side), "cuEventRecord(prefetch)",
                        err);
    return rc ? rc : cuda_check(drv, drv->StreamWaitEvent(caller, pf->join, 0),
                                "cuStreamWaitEvent(prefetch)", err);
}
