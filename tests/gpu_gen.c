/* Generation on the GPU (core/gen, gen_run_gpu) against the CPU reference (gen_run_cpu) on the
 * same fp16 models: tiny decoders built from their config.json by the shipped scripts (GPT-2
 * with its head, GPT-Neo's local and global layers, Mistral's grouped-query attention with a
 * sliding window its ring wraps past, Llama), random weights, ragged prompts through the
 * prefill pass that fills the caches, and token by token through the decode step; the step
 * tuned first, and the step of a plan. Every step's logits within fp16's error of the
 * reference's; greedy tokens the same wherever the reference's margin between its two best
 * logits is not a near tie; sampled tokens drawn on the GPU as the host draws them from the
 * step's logits, the same run after run. Exits 77
 * without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "gpu_open.h"
#include "core/exec/exec.h"
#include "core/gen/gen.h"
#include "core/lua/lua_api.h"

#define SCRIPTS STOF_SOURCE_DIR "/scripts/"

enum { BATCH = 3, LONGEST = 9, NEW = 12, CONTEXT = LONGEST + NEW - 1, VOCAB = 301 };
static const int LENS[BATCH] = {9, 4, 1};

typedef struct tiny {
    const char *name, *script, *config;
} tiny;

static const tiny models[] = {
    {"gpt2", "gpt2.lua",
     "{\"model_type\": \"gpt2\", \"architectures\": [\"GPT2LMHeadModel\"], \"n_embd\": 128,"
     " \"n_layer\": 2, \"n_head\": 2, \"vocab_size\": 301, \"n_positions\": 64}"},
    {"gpt-neo", "gpt_neo.lua",
     "{\"model_type\": \"gpt_neo\", \"architectures\": [\"GPTNeoForCausalLM\"],"
     " \"hidden_size\": 128, \"num_layers\": 2, \"num_heads\": 2, \"vocab_size\": 301,"
     " \"max_position_embeddings\": 64, \"window_size\": 6,"
     " \"attention_types\": [[[\"global\", \"local\"], 1]]}"},
    {"mistral", "mistral.lua",
     "{\"model_type\": \"mistral\", \"architectures\": [\"MistralForCausalLM\"],"
     " \"hidden_size\": 128, \"intermediate_size\": 192, \"num_hidden_layers\": 2,"
     " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 64,"
     " \"vocab_size\": 301, \"max_position_embeddings\": 64, \"sliding_window\": 7,"
     " \"tie_word_embeddings\": false}"},
    {"llama", "mistral.lua",
     "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"],"
     " \"hidden_size\": 128, \"intermediate_size\": 192, \"num_hidden_layers\": 1,"
     " \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"vocab_size\": 301,"
     " \"max_position_embeddings\": 64, \"tie_word_embeddings\": true}"},
};

static int build(const tiny *t, int batch, int seq, graph *g, graph_script *info,
                 stof_error *err) {
    char b[32], s[32], path[512];
    snprintf(b, sizeof b, "batch=%d", batch);
    snprintf(s, sizeof s, "seq=%d", seq);
    snprintf(path, sizeof path, SCRIPTS "%s", t->script);
    const char *params[] = {b, s, "dtype=fp16"};
    cJSON *config = cJSON_Parse(t->config);
    graph_init(g);
    int rc = lua_api_build_config(path, params, 3, config, g, info, err);
    cJSON_Delete(config);
    return rc;
}

/* The margin between the two best logits of a row, relative to the row's largest. */
static double margin(const float *row) {
    float a = -INFINITY, b = -INFINITY, big = 0;
    for (int v = 0; v < VOCAB; v++) {
        big = fmaxf(big, fabsf(row[v]));
        if (row[v] > a) {
            b = a;
            a = row[v];
        } else if (row[v] > b) {
            b = row[v];
        }
    }
    return big > 0 ? (a - b) / big : 0;
}

static void compare(const tiny *t, int batch, const gen_result *cpu, const gen_result *gpu) {
    double worst = 0;
    int same = 0, ties = 0, wrong = 0;
    for (int b = 0; b < batch; b++) {
        for (int k = 0; k < NEW; k++) {
            int32_t want = cpu->tokens[b * NEW + k], got = gpu->tokens[b * NEW + k];
            const float *rc = cpu->logits + ((size_t)k * batch + b) * VOCAB;
            const float *rg = gpu->logits + ((size_t)k * batch + b) * VOCAB;
            double num = 0, den = 0;
            for (int v = 0; v < VOCAB; v++) {
                num += ((double)rg[v] - rc[v]) * ((double)rg[v] - rc[v]);
                den += (double)rc[v] * rc[v];
            }
            worst = fmax(worst, den > 0 ? sqrt(num / den) : sqrt(num));
            if (want == got) {
                same++;
                continue;
            }
            /* a near tie may go either way; the rest of the sequence then differs */
            if (margin(rc) < 2e-2)
                ties++;
            else
                wrong++;
            break;
        }
    }
    CHECK_MSG(worst < 2e-2, "%s: step logits differ from the CPU reference by %.2e", t->name,
              worst);
    CHECK_MSG(wrong == 0, "%s: %d sequences' tokens differ where the reference is sure", t->name,
              wrong);
    printf("%-8s GPU (%s, batch %d) against the CPU reference: logits rel <= %.2e, %d tokens "
           "the same, %d near ties, %d wrong; %d GPU steps, KV cache %zu B\n", t->name,
           gpu->step_from_plan ? "a plan's step"
           : gpu->tune_s > 0   ? "tuned step"
           : gpu->prefilled    ? "prefill pass"
                               : "prompts fed",
           batch, worst, same, ties, wrong, gpu->steps, gpu->cache_bytes);
}

/* The decode step from a plan (as stof tune --decode-batch keeps it: here planned offline for
 * this GPU's architecture, its graph's default kernels) and the prefill on the plan's forward
 * pass (planned offline at the prompts' shape: its schemes and kernels): the reference's
 * tokens. */
static void run_plan_step(exec_ctx *ctx, const tiny *t, const gen_model *m,
                          const gen_prompts *p, const gen_options *o, const gen_result *cpu) {
    gen_decoder dec;
    plan step, fwd;
    tune_offline_stats st;
    stof_error err = {0};
    memset(&dec, 0, sizeof dec);
    memset(&step, 0, sizeof step);
    memset(&fwd, 0, sizeof fwd);
    int rc = gen_decoder_build(m->context, &dec, &err);
    if (!rc)
        rc = tune_offline(&dec.g, m->script, exec_ctx_arch(ctx), NULL, &step, &st, &err);
    if (!rc && (rc = tune_offline(m->prefill, m->script, exec_ctx_arch(ctx), NULL, &fwd, &st,
                                  &err)))
        plan_free(&step);
    CHECK_MSG(rc == STOF_OK, "%s: the plans: %s", t->name, err.msg);
    gen_decoder_free(&dec);
    if (rc)
        return;
    gen_options po = *o;
    po.step_plan = &step;
    po.forward_plan = &fwd;
    gen_result r;
    rc = gen_run_gpu(m, ctx, p, &po, 1, &r, &err);
    CHECK_MSG(rc == STOF_OK, "%s GPU, a plan's step: %s", t->name, err.msg);
    if (!rc) {
        CHECK_MSG(r.step_from_plan, "%s: the plan's step was not used", t->name);
        CHECK_MSG(r.prefilled && r.prefill_from_plan == 2, "%s: the prefill ran (%d) and "
                  "took %d of the plan (%s)", t->name, r.prefilled, r.prefill_from_plan,
                  r.prefill_plan_note);
        if (cpu)
            compare(t, BATCH, cpu, &r);
        gen_result_free(&r);
    }
    plan_free(&step);
    plan_free(&fwd);
}

/* Sampled generation: each sequence's token drawn on the GPU from its row of the step's
 * logits. The same seed gives the same tokens run after run, and each token is what
 * gen_sample draws from the logits kept for its step (or, counted, one it draws when its
 * uniform number moves by a rounding: tests/gpu_sample checks those). */
static void run_stops(exec_ctx *ctx, const tiny *t, const gen_model *m, const gen_prompts *p,
                      const gen_options *o, const gen_result *full);

static void run_sampled(exec_ctx *ctx, const tiny *t, const gen_model *m, const gen_prompts *p) {
    gen_options o = gen_options_default(NEW);
    o.temperature = 0.8f;
    o.top_k = 40;
    o.top_p = 0.9f;
    o.seed = 5;
    gen_result one, two;
    stof_error err = {0};
    int r1 = gen_run_gpu(m, ctx, p, &o, 1, &one, &err);
    CHECK_MSG(r1 == STOF_OK, "%s sampled: %s", t->name, err.msg);
    int r2 = gen_run_gpu(m, ctx, p, &o, 0, &two, &err);
    CHECK_MSG(r2 == STOF_OK, "%s sampled again, logits not kept: %s", t->name, err.msg);
    if (!r1 && !r2) {
        CHECK_MSG(memcmp(one.tokens, two.tokens, sizeof *one.tokens * BATCH * NEW) == 0,
                  "%s: the same seed drew other tokens", t->name);
        const int64_t V = one.vocab;
        float *scratch = malloc(sizeof *scratch * 2 * (size_t)V);
        int32_t *order = malloc(sizeof *order * 2 * (size_t)V);
        int drawn = 0, same = 0, edge = 0;
        for (int b = 0; scratch && order && b < BATCH; b++)
            for (int k = 0; k < one.n_new[b]; k++) {
                const float *row = one.logits + ((size_t)k * BATCH + b) * (size_t)V;
                const int32_t tok = one.tokens[(size_t)b * NEW + k];
                const double u = gen_uniform(o.seed, b, k);
                drawn++;
                if (gen_sample(&o, row, V, b, k, scratch, order) == tok) {
                    same++;
                    continue;
                }
                edge += gen_sample_uniform(&o, row, V, u > 1e-9 ? u - 1e-9 : 0.0, scratch,
                                           order) == tok ||
                        gen_sample_uniform(&o, row, V, u + 1e-9 < 1.0 ? u + 1e-9 : u, scratch,
                                           order) == tok;
            }
        CHECK_MSG(drawn > 0 && same + edge == drawn && edge * 10 <= drawn,
                  "%s: %d of %d sampled tokens as gen_sample draws them from their step's "
                  "logits, %d on a boundary", t->name, same, drawn, edge);
        printf("%-8s sampled on the GPU (T 0.8, top-k 40, top-p 0.9): %d tokens, the same run "
               "after run, %d gen_sample's draws from their logits, %d on a boundary\n",
               t->name, drawn, same, edge);
        free(scratch);
        free(order);
    }
    if (!r2) /* drawn with stop tokens: the uniform numbers still copied in after one ends */
        run_stops(ctx, t, m, p, &o, &two);
    if (!r1)
        gen_result_free(&one);
    if (!r2)
        gen_result_free(&two);
}

/* Greedy tokens up to and with the first of the stop tokens, as run sees them. */
static int until_stop(const gen_result *run, int b, const gen_options *o) {
    for (int k = 0; k < run->n_new[b]; k++)
        for (int s = 0; s < o->n_stop; s++)
            if (run->tokens[b * NEW + k] == o->stop[s])
                return k + 1;
    return run->n_new[b];
}

/* Stop tokens: each sequence ends after its first (one while the others go on, then all of
 * them within a few steps: the steps launched before the host sees a stop token are dropped),
 * its tokens those of the run without stops up to there, the rest of its row untouched. */
static void run_stops(exec_ctx *ctx, const tiny *t, const gen_model *m, const gen_prompts *p,
                      const gen_options *o, const gen_result *full) {
    for (int all = 0; all < 2; all++) {
        gen_options so = *o;
        so.n_stop = all ? BATCH : 1;
        for (int b = 0; b < so.n_stop; b++) /* a token each sequence makes early on */
            so.stop[b] = full->tokens[b * NEW + (all ? 1 + b : 2)];
        gen_result r;
        stof_error err = {0};
        int rc = gen_run_gpu(m, ctx, p, &so, 0, &r, &err);
        CHECK_MSG(rc == STOF_OK, "%s GPU, stop tokens: %s", t->name, err.msg);
        if (rc)
            continue;
        int ended = 0;
        for (int b = 0; b < BATCH; b++) {
            const int want = until_stop(full, b, &so);
            ended += want < NEW;
            CHECK_MSG(r.n_new[b] == want &&
                          memcmp(r.tokens + b * NEW, full->tokens + b * NEW,
                                 sizeof *r.tokens * (size_t)want) == 0,
                      "%s: sequence %d with %d stop tokens: %d new tokens, want %d as the run "
                      "without them", t->name, b, so.n_stop, r.n_new[b], want);
            for (int k = want; k < NEW; k++)
                CHECK_MSG(r.tokens[b * NEW + k] == -1, "%s: sequence %d has token %d after its "
                          "stop token", t->name, b, k);
        }
        CHECK_MSG(ended >= 1, "%s: no sequence ended on a stop token", t->name);
        printf("%-8s %s stop tokens (%d): %d of %d sequences ended early as without them, %d "
               "GPU steps\n", t->name, o->temperature > 0.0f ? "drawn," : "greedy,", so.n_stop,
               ended, BATCH, r.steps);
        gen_result_free(&r);
    }
}

/* The ragged batch's other ways (cpu, gpu: the default way's results, NULL where it failed). */
static void run_variants(exec_ctx *ctx, const tiny *t, const gen_model *m, const gen_prompts *p,
                         const gen_options *o, const gen_result *cpu, const gen_result *gpu) {
    stof_error err = {0};
    /* greedy without the logits kept: the tokens chosen on the GPU, the same */
    gen_result fast;
    int rf = gen_run_gpu(m, ctx, p, o, 0, &fast, &err);
    CHECK_MSG(rf == STOF_OK, "%s GPU argmax: %s", t->name, err.msg);
    if (!rf && gpu)
        CHECK_MSG(memcmp(fast.tokens, gpu->tokens, sizeof *fast.tokens * BATCH * NEW) == 0,
                  "%s: the GPU's argmax chose other tokens than the host's", t->name);
    if (!rf)
        gen_result_free(&fast);
    /* the prompts token by token through the decode step instead: the reference's too */
    gen_options fed_o = *o;
    fed_o.feed_prompts = 1;
    gen_result fed;
    int rd = gen_run_gpu(m, ctx, p, &fed_o, 1, &fed, &err);
    CHECK_MSG(rd == STOF_OK, "%s GPU, prompts fed: %s", t->name, err.msg);
    if (!rd && cpu) {
        CHECK_MSG(!fed.prefilled, "%s: prompts fed, yet a prefill ran", t->name);
        compare(t, BATCH, cpu, &fed);
    }
    if (!rd)
        gen_result_free(&fed);
    /* the decode step tuned first (a short search): the reference's tokens still */
    tune_options tune = {.time_limit_s = 3, .seed = 3};
    gen_options tuned_o = *o;
    tuned_o.tune_step = &tune;
    gen_result tuned;
    int rt = gen_run_gpu(m, ctx, p, &tuned_o, 1, &tuned, &err);
    CHECK_MSG(rt == STOF_OK, "%s GPU, step tuned: %s", t->name, err.msg);
    if (!rt && cpu) {
        CHECK_MSG(tuned.tune_s > 0 && tuned.tuned_step_ms > 0, "%s: no tuning recorded",
                  t->name);
        /* where the executor's default step was timed beside the search's, the step kept is
         * not slower than it (a tie within 1% keeps the search's) */
        CHECK_MSG(tuned.default_step_ms == 0 ||
                      0.99 * tuned.tuned_step_ms <= tuned.default_step_ms,
                  "%s: tuned step %.4f ms, the default %.4f ms", t->name, tuned.tuned_step_ms,
                  tuned.default_step_ms);
        CHECK(!tuned.tuned_kept_default || tuned.tuned_step_ms == tuned.default_step_ms);
        compare(t, BATCH, cpu, &tuned);
    }
    if (!rt)
        gen_result_free(&tuned);
    run_plan_step(ctx, t, m, p, o, cpu);
    run_sampled(ctx, t, m, p);
    if (gpu)
        run_stops(ctx, t, m, p, o, gpu);
}

/* The model's ragged batch of BATCH prompts (lens LENS) through every way to generate, or one
 * prompt (batch 1) the default way only: there the step's GEMMs run one row on gemv, each norm
 * joined to the GEMM after it and a gated unit to its GEMM (exec_default_scheme). Every way
 * gives the reference's tokens. */
static void run_model(exec_ctx *ctx, const tiny *t, int batch) {
    graph prefill, context;
    stof_error err = {0};
    graph_script info;
    int rc = build(t, batch, LONGEST, &prefill, NULL, &err);
    if (!rc)
        rc = build(t, batch, CONTEXT, &context, &info, &err);
    CHECK_MSG(rc == STOF_OK, "%s at batch %d: %s", t->name, batch, err.msg);
    if (rc)
        return;
    static const int one_len = LONGEST - 2;
    const int one = batch == 1; /* other weights and prompts than the ragged batch's */
    int32_t ids[BATCH * LONGEST];
    for (int k = 0; k < batch * LONGEST; k++)
        ids[k] = (k * 37 + 11 + one) % VOCAB;
    gen_model m = {&prefill, &context, weights_source_seeded(7 + one), &info};
    gen_prompts p = {batch, ids, LONGEST, batch == 1 ? &one_len : LENS};
    gen_options o = gen_options_default(NEW);
    gen_result cpu, gpu;
    rc = gen_run_cpu(&m, &p, &o, 1, &cpu, &err);
    CHECK_MSG(rc == STOF_OK, "%s CPU: %s", t->name, err.msg);
    int rg = gen_run_gpu(&m, ctx, &p, &o, 1, &gpu, &err);
    CHECK_MSG(rg == STOF_OK, "%s GPU: %s", t->name, err.msg);
    if (!rc && !rg)
        compare(t, batch, &cpu, &gpu);
    CHECK_MSG(rg || gpu.prefilled, "%s: the prompts did not go through the prefill pass",
              t->name);
    if (batch == BATCH)
        run_variants(ctx, t, &m, &p, &o, rc ? NULL : &cpu, rg ? NULL : &gpu);
    if (!rc)
        gen_result_free(&cpu);
    if (!rg)
        gen_result_free(&gpu);
    graph_free(&prefill);
    graph_free(&context);
}

int main(void) {
    exec_ctx *ctx = NULL;
    GPU_TEST_OPEN(exec_ctx_create, ctx, "gpu_gen");
    printf("GPU: %s\n", exec_ctx_device(ctx)->name);
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        run_model(ctx, &models[k], BATCH);
        run_model(ctx, &models[k], 1);
    }
    exec_ctx_free(ctx);
    return check_summary("gpu_gen");
}
