/* Generation on the GPU (gen.h): the decode step's graph on the executor (the default
 * scheme's kernels), each attention against its KV cache, which lives on the device as a
 * weight of the step that its kernel writes. A step is one CUDA graph of its own: the model's
 * pass and the kernel that chooses the tokens, after a copy of whatever inputs the device does
 * not hold already.
 *
 * The prompts go through the prefill pass (gen_gpu_prefill.c), which fills the caches up to
 * each prompt's last token; that token then goes through the first step, whose logits give the
 * first new token. Every step feeds each sequence its next token -- the one it just
 * generated, or a prompt's when the prefill could not take the prompts and they go token by
 * token -- at its position; a sequence whose prompt is all in draws its next token from that
 * step's logits on the GPU, so that one token a sequence comes back: greedy ones by an argmax,
 * sampled ones drawn as the CPU reference's gen_sample draws them, from the same uniform
 * number of (seed, sequence, step), which the step's inputs carry (exec_sample_rows).
 *
 * The chosen tokens are written over the step's own row of ids, so that they are the next
 * step's ids already, and each live sequence's positions are moved on by one on the device
 * (exec_tokens). Each token also goes straight into page-locked host memory, at its sequence's
 * position, so that nothing is copied out after a step: between two greedy steps the stream
 * holds the graphs alone. Where every sequence takes the token it just drew (or has ended),
 * the next step is launched before this one's tokens come back -- its positions and uniform
 * numbers follow from the host's state alone, assuming no sequence draws a stop token -- so
 * that the host's work between steps (the tokens read, the next inputs) runs while the GPU
 * works; its positions are copied in only where they are not those the device moved on to
 * (a sequence ended). A sequence that did draw a stop token goes through that one step more;
 * its output is dropped and its cache past its end is never read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/util.h"
#include "core/exec/exec.h"
#include "core/gen/gen.h"
#include "core/gen/gen_state.h"
#include "core/gpu/cuda_driver.h"
#include "core/plan/plan.h"

/* A step's inputs, on the host and the device alike, for a batch of B: three rows of B int32
 * (each sequence's token, its position, its attention's position: -1 for an ended sequence),
 * then from byte 16 B (8-byte aligned) B doubles, each sequence's uniform number for its draw.
 * step_at: where a row starts, in bytes. */
typedef enum { STEP_IDS, STEP_POSITIONS, STEP_ATTN_POSITIONS, STEP_U, STEP_END } step_input;

static size_t step_at(step_input what, size_t B) {
    static const size_t bytes_before[] = {0, 4, 8, 16, 24}; /* a sequence's, times B */
    return bytes_before[what] * B;
}

/* Two of each step's inputs and kept logits on the host, so that the host reads one step's
 * results while the next step's copies use the other slot. */
#define STEP_SLOTS 2

typedef struct gpu_run {
    const gen_model *m;
    const gen_prompts *p;
    const gen_options *o;
    gen_result *r;
    gen_state st;
    gen_decoder dec;
    exec_ctx *ctx;
    exec_plan *plan;
    exec_model *xm;
    stof_dtype dtype;
    const cuda_driver *drv;
    /* d_in: the step's inputs (as `in`), its ids row overwritten by the tokens chosen and its
     * positions moved on (exec_tokens);
     * d_choice: the token choice's scratch (the sampling kernel's, or the argmax's keys) */
    CUdeviceptr d_in, d_out, d_choice;
    CUstream stream;
    CUgraph step_graph;     /* the model's pass, then the tokens chosen */
    CUgraphExec step_exec;
    CUevent landed[STEP_SLOTS]; /* a slot's step (and its logits' copy out) is done */
    int keep_logits;        /* the logits come back too (gen_result.logits) */
    void *pinned;           /* page-locked host memory of the slots and `chosen` (cuMemAllocHost) */
    int32_t *in[STEP_SLOTS];  /* a step's inputs (step_at), up to in_bytes of them copied a
                               * step (their uniform numbers only for sampled steps) */
    uint16_t *raw[STEP_SLOTS]; /* [batch][vocab] its logits as the model stores them (kept) */
    int32_t *chosen;        /* [batch][chosen_stride] (pinned) the token each step chose for a
                             * sequence, at the position it fed, written by the device */
    CUdeviceptr d_chosen;   /* `chosen` as the device sees it */
    int64_t chosen_stride;  /* positions a sequence can feed: its prompt and new tokens */
    int32_t *moved_on;      /* [2][batch] the positions and attention positions the device
                             * holds after the steps launched (exec_tokens moves them on) */
    size_t in_bytes;
    int64_t *fed;           /* [batch] tokens each sequence has in its cache */
    float *row;             /* [vocab] one of a step's rows of logits as floats */
} gpu_run;

static int sampled(const gpu_run *g) {
    return g->o->temperature > 0.0f;
}

static int alloc_host(gpu_run *g, stof_error *err) {
    size_t B = (size_t)g->p->batch, V = (size_t)g->r->vocab;
    g->in_bytes = sampled(g) ? step_at(STEP_END, B) : step_at(STEP_ATTN_POSITIONS, B) + 4 * B;
    g->fed = err_calloc(B, sizeof *g->fed, err);
    g->moved_on = err_calloc(2 * B, sizeof *g->moved_on, err);
    if (g->keep_logits && !(g->row = err_malloc(sizeof *g->row * V, err)))
        return STOF_ERR_NOMEM;
    return g->fed && g->moved_on ? STOF_OK : STOF_ERR_NOMEM;
}

/* The host memory the steps share with the device, page-locked so that copies run without
 * the host (from pageable memory a copy out would hold the host until the step ends) and the
 * device writes the chosen tokens itself: each slot's inputs and kept logits, then the
 * chosen tokens, 16-byte aligned. */
static int alloc_pinned(gpu_run *g, stof_error *err) {
    size_t B = (size_t)g->p->batch, V = (size_t)g->r->vocab;
    g->chosen_stride = (int64_t)gen_longest(g->p) + g->o->max_new_tokens; /* positions fed */
    size_t in_b = util_align_up(step_at(STEP_END, B), 16);
    size_t raw_b = g->keep_logits ? util_align_up(sizeof **g->raw * B * V, 16) : 0;
    size_t slot_b = in_b + raw_b, chosen_b = sizeof *g->chosen * B * (size_t)g->chosen_stride;
    int rc = cuda_check(g->drv, g->drv->MemAllocHost(&g->pinned, STEP_SLOTS * slot_b + chosen_b),
                        "cuMemAllocHost(the steps' inputs and tokens)", err);
    for (int k = 0; !rc && k < STEP_SLOTS; k++) {
        char *at = (char *)g->pinned + k * slot_b;
        memset(at, 0, in_b);
        g->in[k] = (int32_t *)(void *)at;
        g->raw[k] = raw_b ? (uint16_t *)(void *)(at + in_b) : NULL;
        rc = cuda_check(g->drv, g->drv->EventCreate(&g->landed[k], CU_EVENT_DISABLE_TIMING),
                        "cuEventCreate(step)", err);
    }
    if (rc)
        return rc;
    g->chosen = (int32_t *)(void *)((char *)g->pinned + STEP_SLOTS * slot_b);
    return cuda_check(g->drv, g->drv->MemHostGetDevicePointer(&g->d_chosen, g->chosen, 0),
                      "cuMemHostGetDevicePointer(the chosen tokens)", err);
}

static int alloc_device(gpu_run *g, stof_error *err) {
    size_t B = (size_t)g->p->batch, V = (size_t)g->r->vocab;
    int rc = cuda_check(g->drv, g->drv->MemAlloc(&g->d_in, step_at(STEP_END, B)),
                        "cuMemAlloc(ids, positions)", err);
    if (!rc)
        rc = cuda_check(g->drv, g->drv->MemAlloc(&g->d_out, 2 * B * V), "cuMemAlloc(logits)",
                        err);
    size_t choice = sampled(g) ? 4 * B * V : exec_argmax_scratch_bytes((int)B);
    if (!rc)
        rc = cuda_check(g->drv, g->drv->MemAlloc(&g->d_choice, choice),
                        "cuMemAlloc(the token choice's scratch)", err);
    if (!rc)
        rc = cuda_check(g->drv, g->drv->StreamCreate(&g->stream, CU_STREAM_NON_BLOCKING),
                        "cuStreamCreate", err);
    if (!rc) /* the argmax's keys start as zeros, and each launch leaves them so */
        rc = cuda_check(g->drv, g->drv->MemsetD8Async(g->d_choice, 0, choice, g->stream),
                        "cuMemsetD8Async(the token choice's scratch)", err);
    return rc ? rc : alloc_pinned(g, err);
}

/* The tokens of the step's logits, over its ids row and into `chosen` at the position each
 * sequence fed, its positions moved on: greedy (argmax) or drawn with each sequence's uniform
 * number. An ended sequence (attention position -1) gets none: its id stays, and only feeds
 * the projections, whose row is dropped. */
static int choose_tokens(gpu_run *g, stof_error *err) {
    size_t B = (size_t)g->p->batch;
    exec_tokens to = {.out = g->d_in + step_at(STEP_IDS, B),
                      .live = g->d_in + step_at(STEP_ATTN_POSITIONS, B),
                      .positions = g->d_in + step_at(STEP_POSITIONS, B),
                      .host = g->d_chosen, .host_stride = g->chosen_stride};
    if (!sampled(g))
        return exec_argmax_rows(g->ctx, g->d_out, g->dtype, (int)B, g->r->vocab, g->d_choice, &to,
                                g->stream, err);
    exec_sampling how = {g->o->temperature, g->o->top_k, g->o->top_p};
    return exec_sample_rows(g->ctx, g->d_out, g->dtype, (int)B, g->r->vocab, &how,
                            g->d_in + step_at(STEP_U, B), g->d_choice, &to, g->stream, err);
}

/* The whole step as one CUDA graph of its own, made once: the model's pass and the tokens
 * chosen, so that a step is one launch and at most one copy in (the model's bad-id flags are
 * read once, after the last step). */
static int capture_step(gpu_run *g, stof_error *err) {
    const cuda_driver *drv = g->drv;
    size_t B = (size_t)g->p->batch;
    exec_io in[3] = {{g->dec.ids, g->d_in + step_at(STEP_IDS, B)},
                     {g->dec.positions, g->d_in + step_at(STEP_POSITIONS, B)},
                     {g->dec.attn_positions, g->d_in + step_at(STEP_ATTN_POSITIONS, B)}};
    /* the choosing kernel loaded (compiled or read) before the capture, not inside it: run
     * once on logits and inputs of zeros (it writes chosen[b][0] and moves the positions on
     * to 1: the first step copies every input in) */
    int rc = cuda_check(drv, drv->MemsetD8Async(g->d_out, 0, 2 * B * (size_t)g->r->vocab,
                                                g->stream), "cuMemsetD8Async(logits)", err);
    if (!rc)
        rc = cuda_check(drv, drv->MemsetD8Async(g->d_in, 0, step_at(STEP_END, B), g->stream),
                        "cuMemsetD8Async(inputs)", err);
    if (!rc)
        rc = choose_tokens(g, err);
    if (!rc)
        rc = cuda_check(drv, drv->StreamSynchronize(g->stream), "cuStreamSynchronize", err);
    if (!rc)
        rc = cuda_check(drv, drv->StreamBeginCapture(g->stream,
                                                     CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                        "cuStreamBeginCapture(decode step)", err);
    if (rc)
        return rc;
    rc = exec_model_run_io(g->xm, in, 3, g->d_out, g->stream, err);
    if (!rc)
        rc = choose_tokens(g, err);
    CUgraph captured = NULL; /* the capture ends whatever happened */
    int end = cuda_check(drv, drv->StreamEndCapture(g->stream, &captured),
                         "cuStreamEndCapture(decode step)", rc ? NULL : err);
    g->step_graph = captured;
    rc = rc ? rc : end;
    return rc ? rc : cuda_check(drv, drv->GraphInstantiate(&g->step_exec, captured, 0),
                                "cuGraphInstantiate(decode step)", err);
}

/* The default scheme cuts a step's GEMMs of several rows as a prefill's, into tiles made for
 * thousands of rows; a step has one row a sequence, where cuBLASLt's own choice reads the
 * weights with more blocks. Every gemm_epilogue segment cuBLASLt can run goes to it (the rest
 * keep the default; at batch 1 every GEMM is already gemv's, with the norms and gated units
 * joined): until the step is tuned, the better default. */
static int prefer_cublaslt(exec_plan *xp, const graph *g, stof_error *err) {
    for (int s = 0; s < xp->n_segs; s++) {
        const exec_segment *seg = &xp->segs[s];
        stof_error why = {0};
        if (seg->tmpl != FUSION_T_GEMM_EPILOGUE ||
            exec_segment_supports(g, seg->first, seg->n, &seg->match, FUSION_T_CUBLASLT, &why))
            continue;
        int rc = exec_plan_set_choice(xp, s, FUSION_T_CUBLASLT, NULL, err);
        if (rc)
            return rc;
    }
    return STOF_OK;
}

/* The executor's plan of a tuned step's plan p. The tuner runs the step at position 0 (an input
 * of zeros), where the attention sees one key: its split of the keys is not measured on a real
 * cache, so the planner's stays. */
static int plan_of_tuned(gpu_run *g, const plan *p, stof_error *err) {
    int rc = exec_plan_from_plan(p, &g->dec.g, &g->plan, err);
    for (int s = 0; !rc && s < g->plan->n_segs; s++)
        if (g->plan->segs[s].tmpl == FUSION_T_ATTENTION_DECODE)
            rc = exec_plan_set_choice(g->plan, s, FUSION_T_ATTENTION_DECODE, NULL, err);
    return rc;
}

/* The decode step tuned on the GPU (gen_options.tune_step): the search's plan of its graph. */
static int tuned_plan(gpu_run *g, stof_error *err) {
    if (!g->m->script)
        return err_set(err, STOF_ERR_INVALID, "tuning the decode step needs the model's script");
    plan p;
    tune_outcome res;
    int rc = tune_gpu(g->ctx, &g->dec.g, g->m->script, g->o->tune_step, &p, &res, err);
    if (rc) {
        if (err)
            err_prefix(err, "tuning the decode step: ");
        return rc;
    }
    rc = plan_of_tuned(g, &p, err);
    g->r->tune_s = res.seconds;
    g->r->tuned_step_ms = res.graph_ms;
    g->r->default_step_ms = res.default_ms;
    g->r->tuned_kept_default = res.kept_default;
    plan_free(&p);
    return rc;
}

/* The decode step of a plan (gen_options.step_plan), checked against this device and the
 * step's graph. */
static int given_plan(gpu_run *g, stof_error *err) {
    int rc = plan_check_fits(g->o->step_plan, exec_ctx_device(g->ctx), NULL, &g->dec.g, err);
    if (!rc)
        rc = plan_of_tuned(g, g->o->step_plan, err);
    if (rc && err)
        err_prefix(err, "the plan's decode step: ");
    g->r->step_from_plan = !rc;
    return rc;
}

/* The decode step on the executor, its caches' bytes counted. */
static int prepare(gpu_run *g, stof_error *err) {
    int rc = gen_decoder_build(g->m->context, &g->dec, err);
    if (!rc)
        rc = exec_model_dtype(&g->dec.g, &g->dtype, err);
    if (!rc && g->dtype != STOF_F16 && g->dtype != STOF_BF16)
        rc = err_set(err, STOF_ERR_UNSUPPORTED, "generation on the GPU runs fp16 or bf16 models, "
                     "not %s (the CPU reference runs fp32)", stof_dtype_name(g->dtype));
    if (!rc && g->o->step_plan)
        rc = given_plan(g, err);
    else if (!rc && g->o->tune_step)
        rc = tuned_plan(g, err);
    else if (!rc && !(rc = exec_plan_default(&g->dec.g, &g->plan, err)))
        rc = prefer_cublaslt(g->plan, &g->dec.g, err);
    if (!rc)
        rc = exec_model_create(g->ctx, g->plan, &g->m->weights, &g->xm, err);
    if (!rc) /* the model's own graph, which --profile replays */
        rc = exec_model_capture(g->xm, err);
    for (int l = 0; !rc && l < g->dec.n_layers; l++) {
        const gen_layer *ly = &g->dec.layers[l];
        g->r->cache_bytes += 2 * stof_dtype_size(g->dtype) * (size_t)g->p->batch *
                             (size_t)ly->cap * (size_t)ly->kv_heads * (size_t)ly->head_dim;
    }
    return rc;
}

/* One of slot k's host rows of a step's inputs. */
static void *step_row(gpu_run *g, int k, step_input what) {
    return (char *)g->in[k] + step_at(what, (size_t)g->p->batch);
}

/* Where sequence b stands before a step: the tokens in its cache, whether it ended, its new
 * tokens. ahead: as it will after the step in flight, which feeds its next token and, once
 * its prompt is in, gives it a new one -- unless that is a stop token, which nothing here can
 * know. */
typedef struct {
    int64_t fed;
    int done, n_new;
} seq_view;

static seq_view view_of(const gpu_run *g, int b, int ahead) {
    seq_view v = {g->fed[b], g->st.done[b], g->r->n_new[b]};
    if (ahead && !v.done && ++v.fed >= g->st.len[b])
        v.done = ++v.n_new == g->o->max_new_tokens;
    return v;
}

/* Whether the step after the one in flight can be launched now: every sequence still going
 * then takes the token the step in flight draws (its prompt is in), which its ids row holds
 * on the device by then; and one sequence at least is still going. */
static int can_run_ahead(const gpu_run *g) {
    int going = 0;
    for (int b = 0; b < g->p->batch; b++) {
        if (g->st.done[b])
            continue;
        if (g->fed[b] + 1 < g->st.len[b])
            return 0; /* its next id is a prompt's: the host's */
        going |= !view_of(g, b, 1).done;
    }
    return going;
}

/* Slot k's step inputs: each sequence's position, its attention's (-1 once it ended: no key
 * read, its cache untouched, no draw) and, sampled, its uniform number for its next new
 * token; ahead, as it will stand after the step in flight. Not ahead, its id too: its next
 * token, or an ended one's last again, through the projections. */
static void step_inputs(gpu_run *g, int k, int ahead) {
    int32_t *ids = step_row(g, k, STEP_IDS), *pos = step_row(g, k, STEP_POSITIONS),
            *attn = step_row(g, k, STEP_ATTN_POSITIONS);
    double *u = step_row(g, k, STEP_U);
    for (int b = 0; b < g->p->batch; b++) {
        seq_view v = view_of(g, b, ahead);
        int64_t at = v.done ? v.fed - 1 : v.fed;
        if (!ahead)
            ids[b] = gen_state_token(&g->st, b, at);
        pos[b] = (int32_t)at;
        attn[b] = v.done ? -1 : (int32_t)at;
        if (sampled(g)) /* a greedy step copies no numbers */
            u[b] = gen_uniform(g->o->seed, b, v.n_new);
    }
}

/* Where slot k's inputs start to be copied in: at the ids when the device's row does not hold
 * them (the tokens of the step before), else at the positions unless they are those the
 * device moved on to, else at the uniform numbers of a sampled step; in_bytes: nothing. Then
 * the positions the device holds after slot k's step. */
static size_t copied_from(gpu_run *g, int k, int with_ids) {
    size_t B = (size_t)g->p->batch;
    const int32_t *rows = step_row(g, k, STEP_POSITIONS); /* positions, attention positions */
    size_t from = with_ids ? step_at(STEP_IDS, B)
                  : memcmp(rows, g->moved_on, sizeof *g->moved_on * 2 * B) ? step_at(STEP_POSITIONS, B)
                  : sampled(g) ? step_at(STEP_U, B)
                               : g->in_bytes;
    for (size_t b = 0; b < B; b++) { /* as the chosen tokens' kernel moves them (exec_tokens) */
        int32_t attn = rows[B + b];
        g->moved_on[b] = attn < 0 ? rows[b] : attn + 1;
        g->moved_on[B + b] = attn < 0 ? attn : attn + 1;
    }
    return from;
}

/* Slot k's step onto the stream: what of its inputs the device does not hold yet
 * (copied_from), the graph, its kept logits out, then its event. */
static int launch_step(gpu_run *g, int k, int with_ids, stof_error *err) {
    const cuda_driver *drv = g->drv;
    size_t B = (size_t)g->p->batch, V = (size_t)g->r->vocab;
    size_t from = copied_from(g, k, with_ids);
    int rc = from == g->in_bytes ? STOF_OK
             : cuda_check(drv, drv->MemcpyHtoDAsync(g->d_in + from, (char *)g->in[k] + from,
                                                    g->in_bytes - from, g->stream),
                          "cuMemcpyHtoDAsync(ids, positions)", err);
    if (!rc)
        rc = cuda_check(drv, drv->GraphLaunch(g->step_exec, g->stream), "cuGraphLaunch(decode "
                        "step)", err);
    if (!rc && g->keep_logits)
        rc = cuda_check(drv, drv->MemcpyDtoHAsync(g->raw[k], g->d_out, 2 * B * V, g->stream),
                        "cuMemcpyDtoHAsync(logits)", err);
    return rc ? rc : cuda_check(drv, drv->EventRecord(g->landed[k], g->stream),
                                "cuEventRecord(step)", err);
}

static int wait_step(gpu_run *g, int k, stof_error *err) {
    g->r->steps++;
    return cuda_check(g->drv, g->drv->EventSynchronize(g->landed[k]),
                      "cuEventSynchronize (a kernel of the decode step failed)", err);
}

/* Sequence b's row of slot k's logits as floats (kept logits). */
static const float *logits_row(gpu_run *g, int k, int b) {
    size_t V = (size_t)g->r->vocab;
    const uint16_t *raw = g->raw[k] + (size_t)b * V;
    for (size_t v = 0; v < V; v++)
        g->row[v] = g->dtype == STOF_BF16 ? util_bf16_to_f32(raw[v]) : util_f16_to_f32(raw[v]);
    return g->row;
}

/* After slot k's step: a sequence whose fed token was its last known one takes the token the
 * step chose at the position it fed. */
static void take_step(gpu_run *g, int k) {
    for (int b = 0; b < g->p->batch; b++) {
        if (g->st.done[b])
            continue;
        int64_t at = g->fed[b]++;
        if (g->fed[b] < g->st.len[b])
            continue; /* still feeding its prompt */
        gen_state_emit_token(&g->st, b, g->r->n_new[b], g->chosen[b * g->chosen_stride + at],
                             g->keep_logits ? logits_row(g, k, b) : NULL);
    }
}

/* The steps until every sequence has ended: while one is in flight the next is launched when
 * can_run_ahead allows, else after it. */
static int run_steps(gpu_run *g, stof_error *err) {
    if (gen_state_all_done(&g->st))
        return STOF_OK;
    int k = 0;
    step_inputs(g, k, 0);
    int rc = launch_step(g, k, 1, err);
    while (!rc) {
        int ahead = can_run_ahead(g);
        if (ahead) {
            step_inputs(g, !k, 1);
            rc = launch_step(g, !k, 0, err);
        }
        if (!rc)
            rc = wait_step(g, k, err);
        if (rc)
            break;
        take_step(g, k);
        k = !k;
        if (ahead)
            continue;
        if (gen_state_all_done(&g->st))
            break;
        step_inputs(g, k, 0);
        rc = launch_step(g, k, 1, err);
    }
    return rc;
}

static void run_free(gpu_run *g) {
    if (g->drv) {
        if (g->stream) /* a step may be in flight after an error */
            g->drv->StreamSynchronize(g->stream);
        for (int k = 0; k < STEP_SLOTS; k++)
            if (g->landed[k])
                g->drv->EventDestroy(g->landed[k]);
        if (g->pinned)
            g->drv->MemFreeHost(g->pinned);
        if (g->step_exec)
            g->drv->GraphExecDestroy(g->step_exec);
        if (g->step_graph)
            g->drv->GraphDestroy(g->step_graph);
        if (g->stream)
            g->drv->StreamDestroy(g->stream);
        if (g->d_in)
            g->drv->MemFree(g->d_in);
        if (g->d_out)
            g->drv->MemFree(g->d_out);
        if (g->d_choice)
            g->drv->MemFree(g->d_choice);
    }
    exec_model_free(g->xm);
    exec_plan_free(g->plan);
    gen_decoder_free(&g->dec);
    gen_state_free(&g->st);
    free(g->fed);
    free(g->moved_on);
    free(g->row);
}

int gen_run_gpu(const gen_model *m, exec_ctx *ctx, const gen_prompts *p, const gen_options *o,
                int keep_logits, gen_result *r, stof_error *err) {
    memset(r, 0, sizeof *r);
    gpu_run g = {.m = m, .p = p, .o = o, .r = r, .ctx = ctx, .drv = exec_ctx_driver(ctx),
                 .keep_logits = keep_logits};
    int64_t vocab;
    int rc = o->recompute ? err_set(err, STOF_ERR_UNSUPPORTED, "recompute is the CPU reference's")
                          : gen_check_run(m, p, o, &vocab, err);
    if (!rc)
        rc = gen_state_init(&g.st, p, o, vocab, keep_logits, r, err);
    if (!rc)
        rc = alloc_host(&g, err);
    double t_setup = util_now();
    if (!rc)
        rc = exec_ctx_make_current(ctx, err);
    if (!rc)
        rc = prepare(&g, err);
    if (!rc)
        rc = alloc_device(&g, err);
    if (!rc)
        rc = capture_step(&g, err);
    if (!rc && !o->feed_prompts) {
        rc = gen_gpu_prefill(ctx, m, &g.dec, g.xm, p, o->forward_plan, g.stream, r, err);
        if (rc == STOF_ERR_DEVICE_OOM) { /* the step alone fits: the prompts go through it */
            snprintf(r->prefill_skipped, sizeof r->prefill_skipped, "%.199s",
                     err ? err->msg : "out of device memory");
            rc = STOF_OK;
        }
    }
    for (int b = 0; !rc && r->prefilled && b < p->batch; b++)
        g.fed[b] = p->len[b] - 1; /* its last token goes through the step: the first logits */
    r->setup_s = util_now() - t_setup - r->prefill_s;
    double t0 = util_now();
    if (!rc)
        rc = run_steps(&g, err);
    r->steps_s = util_now() - t0;
    if (!rc)
        rc = exec_model_status(g.xm, err);
    if (!rc && o->profile_reps > 0)
        rc = gen_profile_step(g.xm, g.plan, o->profile_reps, r, err);
    run_free(&g);
    if (rc)
        gen_result_free(r);
    return rc;
}
