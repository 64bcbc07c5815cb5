/* `stof generate`: token ids from a decoder, on the GPU or the CPU reference (core/gen).
 *
 * The model is built twice from one script: as given, at the prompts' batch
 * and longest length (the prefill), and with the parameters it resolved at
 * the full context (the decode step and its masks). From a plan (stof tune
 * --decode-batch), the model is the plan's, and its decode step for the
 * prompts' batch runs with caches of the plan's context. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/base/error.h"
#include "core/base/file.h"
#include "core/cli/cli.h"
#include "core/gen/gen.h"

typedef struct prompts {
    int batch, stride;
    int32_t *ids;   /* [batch][stride] */
    int *len;
} prompts;

static void prompts_free(prompts *p) {
    free(p->ids);
    free(p->len);
    memset(p, 0, sizeof *p);
}

/* The ids of one prompt's text ("1,2,3" or "1 2 3") appended as row p->batch; what names it
 * in messages. */
static int add_prompt(prompts *p, const char *text, const char *what) {
    int n = 0, cap = 16;
    int32_t *row = malloc(sizeof *row * (size_t)cap);
    const char *s = text;
    while (row) {
        while (*s == ',' || *s == ' ' || *s == '\t' || *s == '\r')
            s++;
        if (!*s || *s == '\n')
            break;
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "stof: %s: '%.*s' is not a token id (ids are non-negative "
                    "integers, separated by commas or spaces)\n", what,
                    (int)strcspn(s, ", \t\r\n") < 20 ? (int)strcspn(s, ", \t\r\n") : 20, s);
            free(row);
            return 1;
        }
        if (n == cap)
            row = realloc(row, sizeof *row * (size_t)(cap *= 2));
        if (row)
            row[n++] = (int32_t)v;
        s = end;
    }
    if (row && n == 0) {
        fprintf(stderr, "stof: %s has no token ids\n", what);
        free(row);
        return 1;
    }
    int32_t *ids = row ? realloc(p->ids, sizeof *ids * (size_t)(p->stride + n)) : NULL;
    int *len = ids ? realloc(p->len, sizeof *len * (size_t)(p->batch + 1)) : NULL;
    if (ids)
        p->ids = ids;
    if (len)
        p->len = len;
    if (!row || !ids || !len) {
        free(row);
        fprintf(stderr, "stof: out of host memory\n");
        return 1;
    }
    /* rows are stored [batch][n] for now; pack_prompts gives them one stride */
    memcpy(p->ids + (size_t)p->stride, row, sizeof *row * (size_t)n);
    p->stride += n;
    p->len[p->batch++] = n;
    free(row);
    return 0;
}

/* The prompts, concatenated by add_prompt, laid out [batch][longest]. */
static int pack_prompts(prompts *p) {
    int longest = 0;
    for (int b = 0; b < p->batch; b++)
        longest = p->len[b] > longest ? p->len[b] : longest;
    int32_t *packed = calloc((size_t)p->batch * (size_t)longest, sizeof *packed);
    if (!packed) {
        fprintf(stderr, "stof: out of host memory\n");
        return 1;
    }
    size_t at = 0;
    for (int b = 0; b < p->batch; b++) {
        memcpy(packed + (size_t)b * longest, p->ids + at, sizeof *packed * (size_t)p->len[b]);
        at += (size_t)p->len[b];
    }
    free(p->ids);
    p->ids = packed;
    p->stride = longest;
    return 0;
}

/* --prompt texts, and the lines of --prompt-ids (blank lines and # comments skipped). */
static int read_prompts(const cli_args *a, prompts *p) {
    memset(p, 0, sizeof *p);
    char what[1100];
    for (int k = 0; k < a->n_prompts; k++) {
        snprintf(what, sizeof what, "--prompt %d", k + 1);
        if (add_prompt(p, a->prompts[k], what))
            return 1;
    }
    if (a->prompt_file) {
        char *text = NULL;
        size_t len = 0;
        stof_error err = {0};
        if (file_read(a->prompt_file, "prompt ids", 64u << 20, &text, &len, &err)) {
            fprintf(stderr, "stof: %s\n", err.msg);
            return 1;
        }
        int line = 1, rc = 0;
        for (char *s = text; *s && !rc; line++) {
            char *eol = strchr(s, '\n');
            const char *t = s + strspn(s, " \t\r");
            if (*t != '#' && *t != '\n' && *t) {
                snprintf(what, sizeof what, "%.1024s:%d", a->prompt_file, line);
                rc = add_prompt(p, s, what);
            }
            s = eol ? eol + 1 : s + strlen(s);
        }
        free(text);
        if (rc)
            return 1;
    }
    if (p->batch == 0) {
        fprintf(stderr, "stof: generate needs prompts: --prompt \"1,2,3\" or --prompt-ids FILE\n");
        return 1;
    }
    return pack_prompts(p);
}

/* The options, with the config's eos_token_id among the stop tokens unless --ignore-eos. */
static gen_options options_of(const cli_args *a, const char *dir) {
    gen_options o = gen_options_default(a->max_new_tokens);
    o.temperature = (float)a->temperature;
    o.top_k = a->top_k;
    o.top_p = (float)a->top_p;
    o.seed = a->seed;
    o.recompute = a->recompute;
    o.profile_reps = a->profile && !a->cpu ? a->reps : 0;
    for (int k = 0; k < a->n_stops; k++)
        o.stop[o.n_stop++] = a->stops[k];
    if (!a->ignore_eos)
        gen_options_add_eos(&o, dir);
    return o;
}

/* The model at (batch, seq), from the one built as given; says what went wrong. */
static int rebuild(const graph_script *info, int batch, int seq, graph *g) {
    stof_error err = {0};
    if (lua_api_rebuild_at(info, batch, seq, g, &err) == STOF_OK)
        return 0;
    fprintf(stderr, "stof: %s\n", err.msg);
    return 1;
}

static void print_stop(const gen_options *o) {
    if (!o->n_stop)
        return;
    printf(", stops at");
    for (int k = 0; k < o->n_stop; k++)
        printf(" %d", o->stop[k]);
}

/* --profile: the decode step's graph alone, then its segments by kind, slowest first. */
static void print_profile(const gen_result *r) {
    double total = 0;
    for (int k = 0; k < r->n_profile; k++)
        total += r->profile[k].ms;
    printf("profile: the decode step as a CUDA graph %.3f ms (no host work); its segments "
           "in place add up to %.3f ms (an event between segments):\n", r->step_graph_ms, total);
    for (int k = 0; k < r->n_profile; k++) {
        const gen_profile_row *w = &r->profile[k];
        printf("  %-36s %-18s x%-3d %8.3f ms %5.1f%%\n", w->ops, w->tmpl, w->count, w->ms,
               total > 0 ? 100 * w->ms / total : 0.0);
    }
}

static void print_result(const prompts *p, const gen_options *o, const gen_result *r,
                         double seconds, const char *where) {
    printf("generate: %d sequence%s, %s", p->batch, p->batch == 1 ? "" : "s",
           o->temperature == 0.0f ? "greedy" : "sampled");
    if (o->temperature != 0.0f)
        printf(" (temperature %g, top-k %d, top-p %g, seed %llu)", (double)o->temperature,
               o->top_k, (double)o->top_p, (unsigned long long)o->seed);
    print_stop(o);
    printf("\n");
    int total = 0;
    char prefill_text[320];
    static const char *const from_plan[3] = {"the default scheme", "the plan's schemes",
                                               "the plan's schemes and kernels"};
    if (r->prefilled)
        snprintf(prefill_text, sizeof prefill_text, "the prefill pass %.3f ms (%s%s%.160s)",
                 1e3 * r->prefill_s, from_plan[r->prefill_from_plan],
                 r->prefill_plan_note[0] ? ": " : "", r->prefill_plan_note);
    else if (r->prefill_skipped[0])
        snprintf(prefill_text, sizeof prefill_text, "token by token through the step (the "
                 "prefill pass did not fit: %.200s)", r->prefill_skipped);
    else
        snprintf(prefill_text, sizeof prefill_text, "token by token through the step");
    for (int b = 0; b < p->batch; b++) {
        printf("sequence %d:", b);
        for (int s = 0; s < p->len[b]; s++)
            printf("%s%d", s ? "," : " ", p->ids[(size_t)b * p->stride + s]);
        printf(" |");
        for (int t = 0; t < r->n_new[b]; t++)
            printf("%s%d", t ? "," : " ", r->tokens[(size_t)b * r->max_new + t]);
        printf("\n");
        total += r->n_new[b];
    }
    printf("%s: %d forward passes, %d new tokens in %.3f s (%.1f tokens/s, %.2f ms a pass)",
           where, r->steps, total, seconds, seconds > 0 ? total / seconds : 0.0,
           r->steps ? 1e3 * seconds / r->steps : 0.0);
    if (o->recompute)
        printf(", no cache: the whole pass for every token\n");
    else
        printf(", KV cache %.1f KiB\n", (double)r->cache_bytes / 1024.0);
    if (r->steps_s > 0)
        printf("GPU: setup %.2f s (kernels, weights); prompts: %s; the steps %.3f s: %.3f ms "
               "a step, %.1f new tokens/s\n", r->setup_s, prefill_text, r->steps_s,
               1e3 * r->steps_s / r->steps, total / r->steps_s);
    if (r->tune_s > 0)
        printf("decode step tuned in %.1f s: %.3f ms as a CUDA graph when the tuner measured it"
               "%s\n", r->tune_s, r->tuned_step_ms,
               r->tuned_kept_default ? " (the default step: the search's was slower as a whole)"
                                     : "");
    if (r->step_from_plan)
        printf("decode step: the plan's for a batch of %d (%s)\n", p->batch,
               o->step_plan->device.measured ? "tuned" : "planned offline, unmeasured");
    if (r->n_profile)
        print_profile(r);
}

/* The caches' positions, and the plan's decode step the GPU runs (o->step_plan): the one pl
 * holds for the prompts' batch when its caches hold the context needed, else none (said). */
static int64_t plan_step(const cli_args *a, const plan *pl, const prompts *p, int64_t needed,
                         const exec_ctx *ctx, gen_options *o) {
    if (!pl)
        return needed;
    char why[512];
    const plan_decode *d = gen_plan_step(pl, p->batch, needed, why, sizeof why);
    if (!ctx) {
        if (pl->n_decode)
            printf("the plan's decode steps are the GPU's; the CPU reference runs its model\n");
    } else if (a->tune_step > 0) {
        printf("--tune-step: the decode step tuned again, not taken from the plan\n");
    } else if (!d) {
        printf("%s: the default step\n", why);
    } else {
        o->step_plan = d->step;
        return d->context;
    }
    return needed;
}

/* prefill: the model at the prompts' batch and longest length, as loaded; ctx: the GPU, or
 * NULL for the CPU reference; pl: the plan the model came from, or NULL. */
static int generate(const cli_args *a, const graph_script *info, const prompts *p,
                    const graph *prefill, const cli_values *v, exec_ctx *ctx, const plan *pl) {
    gen_options o = options_of(a, info->model_dir);
    o.forward_plan = ctx ? pl : NULL; /* the prefill runs the plan's forward pass */
    graph context;
    int64_t positions = plan_step(a, pl, p, p->stride + o.max_new_tokens - 1, ctx, &o);
    if (rebuild(info, p->batch, (int)positions, &context))
        return 1;
    cli_print_masks(&context);
    gen_model m = {prefill, &context, v->src, info};
    char cache_path[1100];
    tune_options tune = {.time_limit_s = a->tune_step, .seed = a->seed, .reps = a->reps};
    if (a->tune_step > 0 && ctx) {
        tune_cache_path_default(cache_path, sizeof cache_path);
        tune.cache_path = cache_path[0] ? cache_path : NULL;
        o.tune_step = &tune;
        printf("tuning the decode step for %g s (measurements cached in %s)\n", a->tune_step,
               cache_path[0] ? cache_path : "memory only");
    }
    gen_prompts gp = {p->batch, p->ids, p->stride, p->len};
    gen_result r;
    stof_error err = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = ctx ? gen_run_gpu(&m, ctx, &gp, &o, 0, &r, &err)
                 : gen_run_cpu(&m, &gp, &o, 0, &r, &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    char where[300];
    if (ctx)
        snprintf(where, sizeof where, "GPU %.200s (%s)", exec_ctx_device(ctx)->name,
                 stof_dtype_name(prefill->tensors[prefill->output].dtype));
    else
        snprintf(where, sizeof where, "CPU reference (fp32)");
    if (rc)
        fprintf(stderr, "stof: %s\n", err.msg);
    else
        print_result(p, &o, &r, (double)(t1.tv_sec - t0.tv_sec) +
                                    (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9, where);
    gen_result_free(&r);
    graph_free(&context);
    return rc != 0;
}

/* The GPU, or NULL with the reason said. */
static exec_ctx *open_gpu(void) {
    exec_ctx *ctx = NULL;
    stof_error err = {0};
    int rc = exec_ctx_create(0, &ctx, &err);
    if (rc == STOF_ERR_NO_DEVICE)
        fprintf(stderr, "stof: no GPU (%s): --cpu runs the generation on the CPU reference\n",
                err.msg);
    else if (rc)
        fprintf(stderr, "stof: %s\n", err.msg);
    return rc ? NULL : ctx;
}

int cli_cmd_generate(const cli_args *a) {
    if (a->recompute && !a->cpu) {
        fprintf(stderr, "stof: --recompute is the CPU reference's (add --cpu)\n");
        return 1;
    }
    if (a->tune_step > 0 && a->cpu) {
        fprintf(stderr, "stof: --tune-step tunes the GPU's decode step (not with --cpu)\n");
        return 1;
    }
    const int from_plan = cli_is_plan(a->script);
    if (from_plan && a->n_params) {
        fprintf(stderr, "stof: a plan fixes the model's parameters: --set does not go with %s\n",
                a->script);
        return 2;
    }
    plan pl;
    memset(&pl, 0, sizeof pl);
    stof_error err = {0};
    if (from_plan && plan_read(a->script, &pl, &err)) {
        fprintf(stderr, "stof: %s\n", err.msg);
        return 1;
    }
    prompts p;
    exec_ctx *ctx = NULL;
    int rc = read_prompts(a, &p);
    if (!rc && !a->cpu && !(ctx = open_gpu()))
        rc = 1;
    /* the model as given (or as the plan has it), at the prompts' shape: the prefill */
    cli_args at = *a;
    char batch[32], seq[32];
    snprintf(batch, sizeof batch, "batch=%d", p.batch);
    snprintf(seq, sizeof seq, "seq=%d", p.stride);
    const char *shape[2] = {batch, seq};
    if (!rc && at.n_params + 2 > GRAPH_SCRIPT_MAX_PARAMS) {
        fprintf(stderr, "stof: at most %d --set parameters\n", GRAPH_SCRIPT_MAX_PARAMS - 2);
        rc = 1;
    }
    if (!rc) {
        at.params[at.n_params++] = batch;
        at.params[at.n_params++] = seq;
    }
    graph prefill;
    graph_script info;
    memset(&info, 0, sizeof info);
    cli_values v;
    if (!rc && !(rc = from_plan ? cli_plan_build(a, &pl, shape, 2, &prefill, &info)
                                : cli_load_graph(&at, &prefill, &info))) {
        if (!(rc = cli_values_open(a, &prefill, info.model_dir, &v))) {
            rc = generate(a, &info, &p, &prefill, &v, ctx, from_plan ? &pl : NULL);
            cli_values_close(&v);
        }
        graph_free(&prefill);
    }
    exec_ctx_free(ctx);
    prompts_free(&p);
    plan_free(&pl);
    return rc;
}
