/* Text generation with a decoder: the prompts' prefill, then one decode step
 * per new token, each reading and extending a KV cache.
 *
 *   gen_decoder   the decode step's graph, derived from the model's graph
 *                 at the full context: every op on one token a sequence,
 *                 its positions an input, each attention a decode step with
 *                 a KV cache sized by its mask (a window's ring buffer);
 *   gen_sample    the next token from a row of logits: greedy, or sampled
 *                 with temperature, top-k and top-p from a seeded stream
 *                 per sequence (the same tokens on every run);
 *   gen_run_cpu   the whole generation on the CPU reference: the ground
 *                 truth, and what a machine without a GPU can do. With
 *                 recompute, every token re-runs the whole forward pass with
 *                 no cache: what the cached run must agree with;
 *   gen_run_gpu   the decode steps on the GPU executor, the caches on the
 *                 device.
 *
 * The model's graphs come from the caller (the script built at the prompts'
 * and at the context's length: core/lua is above this room). Prompts are
 * right padded: sequence b's tokens at positions 0 .. len[b] - 1. */
#ifndef STOF_CORE_GEN_H
#define STOF_CORE_GEN_H

#include <stddef.h>
#include <stdint.h>

#include "core/exec/exec.h"
#include "core/graph/graph.h"
#include "core/io/weights.h"
#include "core/tune/tune_backend.h"
#include "ops/kv_cache.h"
#include "stof.h"

#define GEN_MAX_STOP 16

typedef struct gen_options {
    int max_new_tokens;   /* >= 1 */
    float temperature;    /* 0: greedy (the first of the largest logits) */
    int top_k;            /* 0: every token */
    float top_p;          /* (0, 1]; 1: every token */
    uint64_t seed;
    int32_t stop[GEN_MAX_STOP]; /* a sequence ends after it makes one of these */
    int n_stop;
    int recompute;        /* no cache: the whole forward pass again for each token */
    int feed_prompts;     /* GPU: 1 sends the prompts token by token through the decode step
                             instead of the prefill pass */
    const tune_options *tune_step; /* GPU: the decode step tuned first (the search on its
                             graph, tune_gpu), NULL: its default scheme, GEMMs on cuBLASLt */
    const struct plan *forward_plan; /* GPU: the plan the model came from, whose forward pass
                             the prefill runs (exec_plan_from_plan_prefix: its schemes, and
                             its kernels when the prompts' batch and longest length are the
                             plan's); NULL: the default scheme */
    const struct plan *step_plan; /* GPU: the decode step's plan, tuned before (a plan's
                             decode step, stof tune --decode-batch): it must fit the step's
                             graph (the model's context graph at the plan's batch and context)
                             and this device; NULL: tune_step or the default */
    int profile_reps;     /* GPU, > 0: after the run, the decode step timed (gen_result's
                             step_graph_ms and profile), medians of this many replays */
} gen_options;

/* The options' defaults: greedy, seed 1, no stop tokens. */
gen_options gen_options_default(int max_new_tokens);
int gen_options_check(const gen_options *o, int64_t vocab, stof_error *err);
/* The model directory's eos_token_id (one or a list) added to the stop tokens, as many as fit;
 * nothing for "" or a directory without one. */
void gen_options_add_eos(gen_options *o, const char *dir);

typedef struct gen_prompts {
    int batch;
    const int32_t *ids;   /* [batch][stride]: sequence b's tokens first, then anything */
    int stride;
    const int *len;       /* [batch], each >= 1 */
} gen_prompts;

typedef struct gen_result {
    int batch, max_new;
    int32_t *tokens;      /* [batch][max_new]: the new tokens, -1 past a sequence's end */
    int *n_new;           /* [batch] */
    float *logits;        /* [max_new][batch][vocab] when gen_run_cpu is asked to keep them:
                             the logits each token was drawn from (zeros once ended) */
    int64_t vocab;
    size_t cache_bytes;   /* the KV cache's (0 when recomputing) */
    int steps;            /* forward passes run: the CPU's prefill and each decode step (the
                             GPU's prefill pass is not counted: prefilled says it ran; a step
                             launched ahead of a stop token the host had not seen yet is) */
    double setup_s;       /* GPU: the step's plan, kernels and weights made ready (and the
                             prefill's) */
    int prefilled;        /* GPU: 1 when the prompts went through the prefill pass, 0 when
                             token by token through the decode step */
    double prefill_s;     /* GPU: the prefill pass */
    char prefill_skipped[200]; /* GPU: why the prompts went token by token when the prefill
                             pass did not fit in the device's memory ("" otherwise) */
    int prefill_from_plan; /* GPU, prefilled: 0 the default scheme, 1 the forward plan's
                             schemes, 2 its schemes and kernels */
    char prefill_plan_note[200]; /* GPU: why the prefill did not take the forward plan's
                             schemes, or its kernels ("" when it took what it could) */
    int step_from_plan;   /* GPU: the step ran gen_options.step_plan */
    double tune_s;        /* GPU with tune_step: the tuning's time, and the tuned step's */
    double tuned_step_ms; /* graph replay as the tuner measured it */
    double default_step_ms; /* the same of the executor's default step (0: not timed) */
    int tuned_kept_default; /* the default was faster as a whole than the search's step, and
                               is the step run */
    double steps_s;       /* GPU: the steps, the first inputs to the last tokens */
    /* GPU with profile_reps: the decode step's CUDA graph replayed alone (no host work), and
     * its segments timed in place, one row per kind (the ops and the template they run on),
     * summed over the layers, slowest first. */
    double step_graph_ms;
    struct gen_profile_row *profile;
    int n_profile;
} gen_result;

typedef struct gen_profile_row {
    char ops[96];         /* the segment's op kinds, "matmul bias gelu" */
    const char *tmpl;     /* the template's name */
    int count;            /* segments of this kind in the step */
    double ms;            /* their time, summed */
} gen_profile_row;

void gen_result_free(gen_result *r);

/* ---- the decode step ------------------------------------------------------------------ */

typedef struct gen_layer {
    int op;               /* the decode attention's op in gen_decoder.g */
    int source_op;        /* its attention op in the context graph */
    int heads, kv_heads, head_dim;
    const mask *mask;     /* in gen_decoder.g (context x context), or NULL: dense */
    int64_t cap;          /* cache slots: ops_kv_cache_span */
} gen_layer;

typedef struct gen_decoder {
    graph g;              /* batch B, one token a sequence */
    int ids, positions;   /* its input_ids [B, 1] and position_ids [B, 1] */
    int attn_positions;   /* attention_position_ids [B, 1]: the attentions' positions, -1 for
                             a sequence that has ended (its attention skipped, its cache
                             untouched, zeros out) */
    int64_t context;      /* positions 0 .. context - 1 */
    int64_t vocab;        /* the logits' width */
    gen_layer *layers;
    int n_layers;
} gen_decoder;

/* The decode step of `model`, the decoder's graph built at (batch, context);
 * its output must be logits [batch, context, vocab]. An op the step cannot
 * run on one token (cross-attention, a relative position bias, a
 * non-causal attention) is an error naming it. */
int gen_decoder_build(const graph *model, gen_decoder *d, stof_error *err);
/* The prompts' pass that fills the caches of decode step d: the model `prefill` (at the
 * decode step's batch and the longest prompt) up to its last attention, each attention storing
 * its K and V (op_attention.store) into caches named and shaped as d's, its output that last
 * attention's (the logits come from the decode step, fed each prompt's last token). Only the
 * tensors those ops read are in it. */
int gen_prefill_build(const graph *prefill, const gen_decoder *d, graph *out, stof_error *err);
/* That model takes input_ids [B, S] and outputs logits [B, S, vocab] (not hidden states: the
 * error says to build it with its head). */
int gen_check_logits(const graph *model, stof_error *err);
void gen_decoder_free(gen_decoder *d);

/* ---- sampling ------------------------------------------------------------------------------ */

/* The token drawn from row (vocab logits) for sequence b at step t: greedy,
 * or from the distribution the options leave (temperature, then top-k, then
 * top-p), with the stream of (seed, b, t). scratch: 2 * vocab floats, order:
 * 2 * vocab ints. */
int32_t gen_sample(const gen_options *o, const float *row, int64_t vocab, int b, int t,
                   float *scratch, int32_t *order);
/* The uniform number in [0, 1) that sequence b's draw at step t takes from seed. */
double gen_uniform(uint64_t seed, int b, int t);
/* The draw of gen_sample with that number given (o->temperature > 0). */
int32_t gen_sample_uniform(const gen_options *o, const float *row, int64_t vocab, double u01,
                           float *scratch, int32_t *order);

/* ---- a plan's decode steps -------------------------------------------------------------- */

/* The decode step plan pl (may be NULL) holds for `batch` sequences whose caches hold at least
 * `needed` positions (the longest prompt and the new tokens), or NULL, with why the model's
 * own step runs instead in why (a line; why may be NULL). */
const plan_decode *gen_plan_step(const plan *pl, int batch, int64_t needed, char *why,
                                 size_t n);

/* ---- the CPU reference ----------------------------------------------------------------------- */

typedef struct gen_model {
    const graph *prefill;  /* the model at (batch, the longest prompt) */
    const graph *context;  /* the model at (batch, context >= longest prompt + max_new - 1) */
    weights_source weights;
    const graph_script *script; /* where the model came from: a tuned step's plan names it
                                   (NULL: the step cannot be tuned) */
} gen_model;

/* Generates for every prompt; keep_logits fills r->logits. */
int gen_run_cpu(const gen_model *m, const gen_prompts *p, const gen_options *o,
                int keep_logits, gen_result *r, stof_error *err);

/* ---- the GPU ----------------------------------------------------------------------------- */

/* The same on the GPU of ctx: the prompts through the prefill pass (m->prefill up to its last
 * attention, gen_prefill_build) filling the caches on the device, then the decode step on the
 * executor, one CUDA graph a step. The model runs in fp16 or bf16; tokens are drawn as
 * gen_run_cpu draws them (greedy ones by an argmax on the GPU). */
int gen_run_gpu(const gen_model *m, exec_ctx *ctx, const gen_prompts *p, const gen_options *o,
                int keep_logits, gen_result *r, stof_error *err);

#endif
