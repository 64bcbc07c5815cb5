/* Text generation through the public API (include/stof.h): the model rebuilt at the
 * prompts' and at the context's shape from its resolved parameters, then core/gen. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/api/api_internal.h"
#include "core/base/error.h"
#include "core/gen/gen.h"
#include "core/lua/lua_api.h"

static int options_of(const stof_model *m, const stof_generate_options *in, gen_options *o,
                      stof_error *err) {
    *o = gen_options_default(in->max_new_tokens);
    o->temperature = in->temperature;
    o->top_k = in->top_k;
    o->top_p = in->top_p == 0.0f ? 1.0f : in->top_p;
    o->seed = in->seed ? in->seed : 1;
    o->recompute = in->recompute;
    if (!(in->tune_step_s >= 0.0) || in->tune_step_s > 1e7)
        return err_set(err, STOF_ERR_INVALID, "tune_step_s: seconds from 0 (no tuning), got %g",
                       in->tune_step_s);
    if (in->n_stop_tokens < 0 || in->n_stop_tokens > GEN_MAX_STOP ||
        (in->n_stop_tokens && !in->stop_tokens))
        return err_set(err, STOF_ERR_INVALID, "0 to %d stop tokens, got %d", GEN_MAX_STOP,
                       in->n_stop_tokens);
    for (int k = 0; k < in->n_stop_tokens; k++)
        o->stop[o->n_stop++] = in->stop_tokens[k];
    if (in->use_eos)
        gen_options_add_eos(o, m->script.model_dir);
    return STOF_OK;
}

/* The prompts laid out [n][longest] into *ids. */
static int pack(const int32_t *const *prompts, const int *lens, int n, int32_t **ids,
                int *longest, stof_error *err) {
    *ids = NULL;
    *longest = 0;
    for (int b = 0; b < n; b++) {
        if (!prompts[b] || lens[b] < 1)
            return err_set(err, STOF_ERR_INVALID, "prompt %d is empty", b);
        *longest = lens[b] > *longest ? lens[b] : *longest;
    }
    *ids = err_calloc((size_t)n * (size_t)*longest, sizeof **ids, err);
    if (!*ids)
        return STOF_ERR_NOMEM;
    for (int b = 0; b < n; b++)
        memcpy(*ids + (size_t)b * *longest, prompts[b], sizeof **ids * (size_t)lens[b]);
    return STOF_OK;
}

/* device < 0: the CPU reference. On the GPU, a model whose plan holds a decode step for the
 * prompts' batch, with caches long enough, runs that step (its caches of the plan's length)
 * unless the step is to be tuned. */
static int generate(stof_model *m, int device, const gen_prompts *p, const gen_options *in,
                    int32_t *out_tokens, int *out_lens, stof_error *err) {
    gen_options o = *in;
    int64_t context_len = p->stride + o.max_new_tokens - 1;
    const plan_decode *d = device >= 0 && m->has_plan && !o.tune_step
                               ? gen_plan_step(&m->pl, p->batch, context_len, NULL, 0)
                               : NULL;
    if (d) {
        context_len = d->context;
        o.step_plan = d->step;
    }
    if (device >= 0 && m->has_plan) /* the prefill runs the plan's forward pass */
        o.forward_plan = &m->pl;
    graph prefill, context;
    int rc = lua_api_rebuild_at(&m->script, p->batch, p->stride, &prefill, err);
    if (!rc && (rc = lua_api_rebuild_at(&m->script, p->batch, (int)context_len, &context, err)))
        graph_free(&prefill);
    if (rc)
        return rc;
    gen_model gm = {&prefill, &context, {.seed = m->seed, .weights = m->weights}, &m->script};
    gen_result r;
    rc = device < 0 ? gen_run_cpu(&gm, p, &o, 0, &r, err)
                    : gen_run_gpu(&gm, m->ctx, p, &o, 0, &r, err);
    if (!rc) {
        memcpy(out_tokens, r.tokens, sizeof *out_tokens * (size_t)p->batch * (size_t)r.max_new);
        memcpy(out_lens, r.n_new, sizeof *out_lens * (size_t)p->batch);
    }
    gen_result_free(&r);
    graph_free(&prefill);
    graph_free(&context);
    return rc;
}

static int generate_on(stof_model *m, int device, const int32_t *const *prompts,
                       const int *lens, int n, const stof_generate_options *options,
                       int32_t *out_tokens, int *out_lens) {
    stof_error err = {0};
    if (!m || !prompts || !lens || n < 1 || !options || !out_tokens || !out_lens)
        return api_remember(err_set(&err, STOF_ERR_INVALID, "generate: a model, 1 or more "
                                    "prompts with their lengths, options and the outputs are "
                                    "needed"), &err);
    int rc = api_check_weights(m, &err);
    if (!rc && m->bound)
        rc = err_set(&err, STOF_ERR_INVALID, "generation reads the weights from the host "
                     "(a file, or stof_model_set_weights_memory), not from the caller's device "
                     "pointers (stof_model_set_weights_device)");
    gen_options o;
    if (!rc)
        rc = options_of(m, options, &o, &err);
    char cache_path[1100];
    tune_options tune = {.time_limit_s = options->tune_step_s, .seed = o.seed};
    if (!rc && options->tune_step_s > 0 && device < 0)
        rc = err_set(&err, STOF_ERR_INVALID, "tune_step_s tunes the GPU's decode step "
                     "(stof_model_generate), not the CPU reference's");
    if (!rc && options->tune_step_s > 0) {
        tune_cache_path_default(cache_path, sizeof cache_path);
        tune.cache_path = cache_path[0] ? cache_path : NULL;
        o.tune_step = &tune;
    }
    if (!rc && device >= 0)
        rc = api_ensure_ctx(m, device, &err);
    int longest = 0;
    int32_t *ids = NULL;
    if (!rc)
        rc = pack(prompts, lens, n, &ids, &longest, &err);
    if (!rc) {
        gen_prompts p = {n, ids, longest, lens};
        rc = generate(m, device, &p, &o, out_tokens, out_lens, &err);
    }
    free(ids);
    return api_remember(rc, &err);
}

int stof_model_generate_cpu(stof_model *m, const int32_t *const *prompts, const int *lens,
                            int n, const stof_generate_options *options, int32_t *out_tokens,
                            int *out_lens) {
    return generate_on(m, -1, prompts, lens, n, options, out_tokens, out_lens);
}

int stof_model_generate(stof_model *m, int device, const int32_t *const *prompts,
                        const int *lens, int n, const stof_generate_options *options,
                        int32_t *out_tokens, int *out_lens) {
    stof_error err = {0};
    if (device < 0)
        return api_remember(err_set(&err, STOF_ERR_INVALID, "generate: GPU %d (0 or more; "
                                    "stof_model_generate_cpu runs on the CPU)", device), &err);
    return generate_on(m, device, prompts, lens, n, options, out_tokens, out_lens);
}
