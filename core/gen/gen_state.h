/* The sequences of one generation as it goes, shared by the CPU and GPU loops: each
 * sequence's tokens so far, which ended, and the result they fill (gen.h). Internal to
 * core/gen. */
#ifndef STOF_CORE_GEN_STATE_H
#define STOF_CORE_GEN_STATE_H

#include "core/gen/gen.h"

typedef struct gen_state {
    const gen_prompts *p;
    const gen_options *o;
    gen_result *r;
    int64_t *len;        /* [batch] tokens so far: prompt and new */
    int *done;           /* [batch] */
    float *scratch;      /* gen_sample's */
    int32_t *order;
} gen_state;

/* The result's arrays (logits kept when keep_logits) and the state's. */
int gen_state_init(gen_state *s, const gen_prompts *p, const gen_options *o, int64_t vocab,
                   int keep_logits, gen_result *r, stof_error *err);
void gen_state_free(gen_state *s);

int gen_state_all_done(const gen_state *s);
/* The token of sequence b at step t from its row of logits (nothing once it ended). */
void gen_state_emit(gen_state *s, int b, int t, const float *row);
/* The same with the token chosen already (a greedy argmax on the GPU); row may be NULL. */
void gen_state_emit_token(gen_state *s, int b, int t, int32_t tok, const float *row);
/* Token i of sequence b so far (prompt, then new), i < len[b]; its newest. */
int32_t gen_state_token(const gen_state *s, int b, int64_t i);
int32_t gen_state_last(const gen_state *s, int b);

/* The input of g made with init (the attention_mask: GRAPH_INIT_PADDING), or -1. */
int gen_input_of(const graph *g, graph_init_kind init);
/* g takes input_ids [batch, >= need] and gives logits, with an attention_mask input when
 * mask_needed says (1: always, -1: when the prompts do not fill g, 0: never); what names it. */
int gen_check_graph(const graph *g, const char *what, const gen_prompts *p, int64_t need,
                    int mask_needed, stof_error *err);
/* What every run checks first: the context graph's logits (*vocab their width) and length,
 * the prompts, the options. */
int gen_check_run(const gen_model *m, const gen_prompts *p, const gen_options *o,
                  int64_t *vocab, stof_error *err);

/* Checks of the prompts (lengths, ids in the vocabulary). */
int gen_check_prompts(const gen_prompts *p, int64_t vocab, stof_error *err);
/* After a GPU run with o->profile_reps: the decode step's graph and segments timed into r
 * (exec_model_time, exec_model_profile). */
int gen_profile_step(exec_model *xm, const exec_plan *p, int reps, gen_result *r,
                     stof_error *err);
/* GPU: the prompts through the prefill pass (gen_prefill_build) on stream st, filling the
 * caches of `step` (the decode step dec on the executor) up to each prompt's last token, on
 * the forward pass of plan pl (gen_options.forward_plan; NULL: the default scheme). In r:
 * prefilled 0 when the pass cannot take them (a prompt of one token, inputs the pass lacks):
 * then they go through the decode step; prefill_s, the pass's time; prefill_from_plan and
 * prefill_plan_note, what it took of pl. */
int gen_gpu_prefill(exec_ctx *ctx, const gen_model *m, const gen_decoder *dec,
                    const exec_model *step, const gen_prompts *p, const struct plan *pl,
                    CUstream st, gen_result *r, stof_error *err);
/* The longest prompt. */
int gen_longest(const gen_prompts *p);

#endif
