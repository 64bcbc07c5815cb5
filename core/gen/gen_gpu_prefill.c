/* The prompts' prefill on the GPU (gen_state.h, gen_gpu_prefill): the model at the prompts'
 * shape up to its last attention (gen_prefill_build), on the executor with the forward pass of
 * the plan the model came from (its schemes, and its kernels at the plan's own shape) or the
 * default scheme, each attention writing its K and V into the decode step's caches. The
 * prefill's weights and caches are the decode step's own device memory, bound by name:
 * nothing is uploaded twice. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/util.h"
#include "core/gen/gen_state.h"
#include "core/gpu/cuda_driver.h"
#include "core/plan/plan.h"

typedef struct prefill_run {
    exec_ctx *ctx;
    const cuda_driver *drv;
    const gen_prompts *p;
    graph g;
    int ids, pad;          /* its input_ids and attention_mask (-1: none) */
    exec_plan *plan;
    exec_model *xm;
    CUdeviceptr *bound;    /* per tensor of g: the decode step's memory of the same name */
    CUdeviceptr d_ids, d_pad;
} prefill_run;

/* Whether the pass can take these prompts: it reads input_ids and at most an attention_mask,
 * and ragged prompts have that mask (right padding, so each sequence's caches get only its
 * own rows). */
static int takes_prompts(const prefill_run *f) {
    if (f->ids < 0)
        return 0;
    for (int t = 0; t < f->g.n_tensors; t++)
        if (f->g.tensors[t].role == GRAPH_INPUT && t != f->ids && t != f->pad)
            return 0;
    int seq = (int)f->g.tensors[f->ids].shape[1];
    for (int b = 0; b < f->p->batch; b++)
        if (f->p->len[b] > seq || (f->p->len[b] < seq && f->pad < 0))
            return 0;
    return 1;
}

static int same_shape(const graph_tensor *a, const graph_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return 0;
    return 1;
}

/* Every weight of the pass that the step has (same name, dtype and shape) bound to the
 * step's memory; the caches must be. */
static int bind_step(prefill_run *f, const gen_decoder *dec, const exec_model *step,
                     stof_error *err) {
    f->bound = err_calloc((size_t)f->g.n_tensors, sizeof *f->bound, err);
    if (!f->bound)
        return STOF_ERR_NOMEM;
    for (int t = 0; t < f->g.n_tensors; t++) {
        const graph_tensor *x = &f->g.tensors[t];
        if (x->role != GRAPH_WEIGHT)
            continue;
        int s = graph_find_tensor(&dec->g, x->name);
        if (s >= 0 && same_shape(x, &dec->g.tensors[s]))
            f->bound[t] = exec_model_tensor(step, s);
        if (!f->bound[t] && strncmp(x->name, "kv_cache.", 9) == 0)
            return err_set(err, STOF_ERR_INTERNAL, "prefill: cache '%s' is not the decode "
                           "step's", x->name);
    }
    return STOF_OK;
}

/* The prompts as the pass's inputs: ids (0 past a prompt's end) and the attention_mask. */
static int upload_prompts(prefill_run *f, stof_error *err) {
    const gen_prompts *p = f->p;
    size_t B = (size_t)p->batch, S = (size_t)f->g.tensors[f->ids].shape[1];
    int32_t *ids = err_calloc(B * S, sizeof *ids, err);
    int32_t *pad = err_calloc(B * S, sizeof *pad, err);
    int rc = ids && pad ? STOF_OK : STOF_ERR_NOMEM;
    for (size_t b = 0; !rc && b < B; b++)
        for (size_t s = 0; s < (size_t)p->len[b]; s++) {
            ids[b * S + s] = p->ids[b * (size_t)p->stride + s];
            pad[b * S + s] = 1;
        }
    if (!rc)
        rc = cuda_check(f->drv, f->drv->MemAlloc(&f->d_ids, 4 * B * S), "cuMemAlloc(prompts)",
                        err);
    if (!rc)
        rc = cuda_check(f->drv, f->drv->MemcpyHtoD(f->d_ids, ids, 4 * B * S),
                        "cuMemcpyHtoD(prompts)", err);
    if (!rc && f->pad >= 0)
        rc = cuda_check(f->drv, f->drv->MemAlloc(&f->d_pad, 4 * B * S),
                        "cuMemAlloc(attention_mask)", err);
    if (!rc && f->pad >= 0)
        rc = cuda_check(f->drv, f->drv->MemcpyHtoD(f->d_pad, pad, 4 * B * S),
                        "cuMemcpyHtoD(attention_mask)", err);
    free(ids);
    free(pad);
    return rc;
}

static void prefill_free(prefill_run *f) {
    if (f->d_ids)
        f->drv->MemFree(f->d_ids);
    if (f->d_pad)
        f->drv->MemFree(f->d_pad);
    exec_model_free(f->xm);
    exec_plan_free(f->plan);
    graph_free(&f->g);
    free(f->bound);
}

/* The pass's executor plan: the forward plan's (schemes; kernels too at its own batch and
 * length on a device it fits), else, saying why in r, the default scheme. */
static int prefill_plan(prefill_run *f, const plan *pl, gen_result *r, stof_error *err) {
    r->prefill_from_plan = 0;
    r->prefill_plan_note[0] = '\0';
    if (!pl)
        return exec_plan_default(&f->g, &f->plan, err);
    int kernels = pl->batch == f->p->batch && pl->seq == f->g.tensors[f->ids].shape[1] &&
                  plan_check_fits(pl, exec_ctx_device(f->ctx), NULL, NULL, NULL) == STOF_OK;
    int taken = 0;
    stof_error why = {0};
    int rc = exec_plan_from_plan_prefix(pl, &f->g, kernels, &f->plan, &taken, &why);
    if (rc && kernels) { /* the plan's kernels do not fit the pass: its schemes alone */
        snprintf(r->prefill_plan_note, sizeof r->prefill_plan_note, "%.199s", why.msg);
        kernels = 0;
        rc = exec_plan_from_plan_prefix(pl, &f->g, 0, &f->plan, &taken, &why);
    }
    if (rc == STOF_OK) {
        r->prefill_from_plan = taken ? 1 + kernels : 0;
        if (!taken)
            snprintf(r->prefill_plan_note, sizeof r->prefill_plan_note,
                     "no layer of the prefill is one of the plan's");
        return STOF_OK;
    }
    snprintf(r->prefill_plan_note, sizeof r->prefill_plan_note, "%.199s", why.msg);
    return exec_plan_default(&f->g, &f->plan, err);
}

int gen_gpu_prefill(exec_ctx *ctx, const gen_model *m, const gen_decoder *dec,
                    const exec_model *step, const gen_prompts *p, const plan *pl, CUstream st,
                    gen_result *r, stof_error *err) {
    r->prefilled = 0;
    r->prefill_s = 0;
    if (gen_longest(p) < 2) /* one token a prompt: the decode step is the whole prefill */
        return STOF_OK;
    prefill_run f = {.ctx = ctx, .drv = exec_ctx_driver(ctx), .p = p};
    int rc = gen_prefill_build(m->prefill, dec, &f.g, err);
    if (rc)
        return rc;
    f.ids = graph_find_tensor(&f.g, "input_ids");
    f.pad = gen_input_of(&f.g, GRAPH_INIT_PADDING);
    if (!takes_prompts(&f)) {
        prefill_free(&f);
        return STOF_OK;
    }
    rc = bind_step(&f, dec, step, err);
    if (!rc)
        rc = prefill_plan(&f, pl, r, err);
    if (!rc)
        rc = exec_model_create_bound(ctx, f.plan, &m->weights, f.bound, &f.xm, err);
    if (!rc)
        rc = upload_prompts(&f, err);
    if (!rc) /* the pass's graph made before it is timed */
        rc = exec_model_capture(f.xm, err);
    if (!rc) /* the prompts' copies from pageable memory have landed before another stream
                reads them */
        rc = cuda_check(f.drv, f.drv->CtxSynchronize(NULL), "cuCtxSynchronize", err);
    double t0 = util_now();
    exec_io in[2] = {{f.ids, f.d_ids}, {f.pad, f.d_pad}};
    if (!rc)
        rc = exec_model_run_io(f.xm, in, f.pad >= 0 ? 2 : 1, 0, st, err);
    if (!rc)
        rc = cuda_check(f.drv, f.drv->StreamSynchronize(st), "cuStreamSynchronize(prefill)",
                        err);
    r->prefill_s = util_now() - t0;
    r->prefilled = !rc;
    prefill_free(&f);
    if (rc && err)
        err_prefix(err, "prefill: ");
    return rc;
}
