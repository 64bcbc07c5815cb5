/* Measured attention plans: scratch inputs, the timing of a candidate
 * (core/gpu/gpu_timer) and the choice of the fastest. See mha_exec.h. */
#include "core/exec/attention/mha_exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/exec/attention/mha_exec_internal.h"
#include "core/gpu/device.h"
#include "core/base/error.h"
#include "core/base/util.h"
#include "ops/ops.h"
#include "core/gpu/gpu_timer.h"

/* ---- measuring candidates ------------------------------------------------------------ */

/* Scratch inputs of the problem's shape, batch possibly reduced: packed q,
 * k, v rows of [B, max(Sq, Sk), 3 H D], o [B, Sq, H D]. */
typedef struct mha_scratch {
    CUdeviceptr qkv, o, pad; /* pad: an attention_mask of ones, when padded */
    int batch;
    mha_exec_tensors t;
} mha_scratch;

#define MHA_SCRATCH_FILL_ELEMS ((size_t)1 << 19) /* a 1 MiB random block, tiled */

static void scratch_free(mha_exec_ctx *c, mha_scratch *s) {
    if (s->qkv)
        c->drv->MemFree(s->qkv);
    if (s->o)
        c->drv->MemFree(s->o);
    if (s->pad)
        c->drv->MemFree(s->pad);
    s->qkv = s->o = s->pad = 0;
}

/* Tiles a host block of uniform [-1, 1) values in the dtype over the
 * buffer: not constant (no degenerate softmax), no NaN, cheap to make. */
static int scratch_fill(mha_exec_ctx *c, CUdeviceptr d, size_t bytes, stof_dtype dtype,
                        stof_error *err) {
    uint16_t *h = err_malloc(MHA_SCRATCH_FILL_ELEMS * sizeof *h, err);
    if (!h)
        return STOF_ERR_NOMEM;
    util_rng rng = {0x5eed};
    for (size_t i = 0; i < MHA_SCRATCH_FILL_ELEMS; i++) {
        float x = (float)(2.0 * util_rng_double(&rng) - 1.0);
        h[i] = dtype == STOF_BF16 ? util_f32_to_bf16(x) : util_f32_to_f16(x);
    }
    int rc = STOF_OK;
    const size_t chunk = MHA_SCRATCH_FILL_ELEMS * sizeof *h;
    for (size_t off = 0; off < bytes && !rc; off += chunk)
        rc = cuda_check(c->drv,
                        c->drv->MemcpyHtoD(d + off, h, bytes - off < chunk ? bytes - off : chunk),
                        "cuMemcpyHtoD(scratch)", err);
    free(h);
    return rc;
}

static int scratch_alloc(mha_exec_ctx *c, const mha_exec_problem *p, mha_scratch *s,
                         stof_error *err) {
    memset(s, 0, sizeof *s);
    const size_t elem = stof_dtype_size(p->dtype);
    const int64_t hd = (int64_t)p->heads * p->head_dim;
    const int64_t kvd = (int64_t)mha_exec_kv_heads(p) * p->head_dim, width = hd + 2 * kvd;
    const int rows = p->q_len > p->k_len ? p->q_len : p->k_len;
    const size_t qkv_batch = (size_t)(width * rows) * elem, o_batch = (size_t)(hd * p->q_len) * elem;
    size_t fit = MHA_EXEC_MEASURE_BYTES / (qkv_batch + o_batch);
    int batch = fit < 1 ? 1 : fit < (size_t)p->batch ? (int)fit : p->batch;
    int rc;
    for (;;) {
        rc = cuda_check(c->drv, c->drv->MemAlloc(&s->qkv, qkv_batch * (size_t)batch),
                        "cuMemAlloc(scratch qkv)", err);
        if (!rc)
            rc = cuda_check(c->drv, c->drv->MemAlloc(&s->o, o_batch * (size_t)batch),
                            "cuMemAlloc(scratch o)", err);
        if (!rc || batch == 1)
            break;
        scratch_free(c, s); /* out of memory: try half the batch */
        batch /= 2;
    }
    if (!rc)
        rc = scratch_fill(c, s->qkv, qkv_batch * (size_t)batch, p->dtype, err);
    /* padded: every token real, the work of the unpadded batch */
    size_t pad_elems = (size_t)batch * (size_t)p->q_len;
    if (!rc && p->padded)
        rc = cuda_check(c->drv, c->drv->MemAlloc(&s->pad, pad_elems * 4),
                        "cuMemAlloc(scratch attention_mask)", err);
    if (!rc && p->padded)
        rc = cuda_check(c->drv, c->drv->MemsetD32Async(s->pad, 1, pad_elems, 0),
                        "cuMemsetD32Async(scratch attention_mask)", err);
    if (rc) {
        scratch_free(c, s);
        return rc;
    }
    s->batch = batch;
    mha_exec_tensors *t = &s->t;
    memset(t, 0, sizeof *t);
    t->q = s->qkv;
    t->k = s->qkv + (CUdeviceptr)(hd * (int64_t)elem);
    t->v = s->qkv + (CUdeviceptr)((hd + kvd) * (int64_t)elem);
    t->o = s->o;
    t->q_row_stride = t->k_row_stride = t->v_row_stride = width;
    t->q_batch_stride = t->k_batch_stride = t->v_batch_stride = width * rows;
    t->o_row_stride = hd;
    t->o_batch_stride = hd * p->q_len;
    /* the relpos table ([buckets][heads]) reads the start of q: in range */
    t->relpos_table = s->qkv;
    t->pad_mask = s->pad;
    return STOF_OK;
}

/* One timed run of a candidate (gpu_timer_work). */
typedef struct timed_run {
    mha_exec_ctx *ctx;
    const mha_exec_plan *plan;
    const mha_exec_tensors *tensors;
} timed_run;

static int run_candidate(void *ud, CUstream st, stof_error *err) {
    const timed_run *r = ud;
    return mha_run_main(r->ctx, r->plan, r->tensors, st, err); /* global tokens: none */
}

/* The median time of plan on the scratch inputs, ms: the launches of the
 * first s->batch batches (a shallow copy of the plan with a smaller grid;
 * the format's batches beyond are simply not read). */
static int time_plan(mha_exec_ctx *c, const mha_exec_plan *plan, const mha_scratch *s,
                     float *median, stof_error *err) {
    mha_exec_plan tp = *plan;
    tp.problem.batch = s->batch;
    tp.grid[2] = (unsigned)s->batch;
    tp.combine_grid[2] = (unsigned)s->batch;
    timed_run run = {c, &tp, &s->t};
    gpu_timer timer;
    int rc = gpu_timer_create(c->drv, &timer, err);
    if (rc)
        return rc;
    double ms = 0;
    rc = gpu_timer_median(&timer, NULL, MHA_EXEC_MEASURE_WARMUP, MHA_EXEC_MEASURE_RUNS,
                          run_candidate, &run, &ms, NULL, err);
    gpu_timer_free(&timer);
    if (!rc)
        *median = (float)ms;
    return rc;
}

/* One line naming a configuration, for reasons. */
static void config_name(const mha_exec_config *cfg, char *buf, size_t n) {
    if (cfg->kernel == MHA_KERNEL_BLOCK_WISE)
        snprintf(buf, n, "block %dx%d w%d s%d", cfg->block_m, cfg->block_n, cfg->num_warps,
                 cfg->stages);
    else
        snprintf(buf, n, "row-wise %dx%d", cfg->rows_per_warp, cfg->warps_per_block);
}

/* Builds and times every candidate, keeps the fastest (see mha_exec.h). */
int mha_plan_measured(mha_exec_ctx *c, const mha_exec_plan *base, const mask *folded,
                      const mha_device_limits *lim, const mha_exec_force *force,
                      mha_exec_plan **out, stof_error *err) {
    mha_exec_config *cands = err_malloc(MHA_EXEC_MAX_MEASURED * sizeof *cands, err);
    if (!cands)
        return STOF_ERR_NOMEM;
    int n = 0;
    char why[256];
    mha_scratch s;
    int rc = mha_exec_candidates(&base->problem, folded, lim, force, cands, MHA_EXEC_MAX_MEASURED,
                                 &n, why, sizeof why, err);
    if (!rc)
        rc = scratch_alloc(c, &base->problem, &s, err);
    if (rc) {
        free(cands);
        return rc;
    }
    mha_exec_plan *best = NULL;
    int timed = 0, dead = 0;
    float best_ms = 0;
    stof_error cerr = {0}; /* the last failing candidate's */
    for (int i = 0; i < n && !dead; i++) {
        mha_exec_plan *cand = mha_plan_clone(base, &cerr);
        if (!cand) {
            rc = STOF_ERR_NOMEM;
            break;
        }
        cand->config = cands[i];
        float ms = 0;
        int crc = mha_plan_finish(c, cand, folded, force, &cerr);
        if (!crc)
            crc = time_plan(c, cand, &s, &ms, &cerr);
        if (crc) {
            /* skip it, unless the context is gone (a sticky launch error) */
            mha_exec_plan_free(c, cand);
            rc = crc;
            dead = crc == STOF_ERR_CUDA && c->drv->CtxSynchronize(NULL) != CUDA_SUCCESS;
            continue;
        }
        timed++;
        if (!best || ms < best_ms) {
            mha_exec_plan_free(c, best);
            best = cand;
            best_ms = ms;
        } else {
            mha_exec_plan_free(c, cand);
        }
    }
    scratch_free(c, &s);
    if (!best || dead) {
        free(cands);
        mha_exec_plan_free(c, best);
        if (!rc)
            return err_set(err, STOF_ERR_UNSUPPORTED, "attention: no candidate to measure");
        *err = cerr;
        return rc;
    }
    best->n_measured = timed;
    best->measured_ms = best_ms;
    best->measured_batch = s.batch;
    char first[48];
    config_name(&cands[0], first, sizeof first);
    char measured[96];
    snprintf(measured, sizeof measured, "measured: fastest of %d, %.3f ms at batch %d", timed,
             best_ms, s.batch);
    /* the analytical reason is cut to what fits beside the measured one */
    size_t used = strlen(measured);
    memcpy(best->reason, measured, used + 1);
    if (snprintf(best->reason + used, sizeof best->reason - used, " (analytical: %s, %s)",
                 first, why) < 0)
        best->reason[used] = '\0';
    free(cands);
    *out = best;
    return STOF_OK;
}
