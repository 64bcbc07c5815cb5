/* `stof tune`: the two-stage search on the GPU (core/tune/tune_backend.h), its
 * progress on the terminal, the tuned plan timed end to end, written as
 * JSON. Without a GPU: an unmeasured plan of the initial scheme, with its
 * kernels compiled into the NVRTC cache, and a plain word that nothing was
 * measured. With --decode-batch, a decoder's decode steps are tuned (or
 * planned) after the model and kept in its plan. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cli/cli.h"
#include "core/gen/gen.h"
#include "core/gpu/nvrtc_worker.h"
#include "core/exec/exec.h"
#include "core/gpu/nvrtc.h"
#include "core/tune/tune_backend.h"
#include "core/base/util.h"

#define CLI_TUNE_DEFAULT_ARCH "sm_90"
/* Without a terminal, a progress line at most this often (and at each stage). */
#define CLI_TUNE_LOG_EVERY_S 5.0

/* ---- progress ------------------------------------------------------------------------------- */

typedef struct progress_state {
    int tty;
    int started;
    search_stage stage;
    double t0, last;
} progress_state;

static void on_progress(void *ud, const search_progress *p) {
    progress_state *s = ud;
    double now = util_now();
    int changed = !s->started || p->stage != s->stage;
    if (!s->tty && !changed && now - s->last < CLI_TUNE_LOG_EVERY_S)
        return;
    if (s->tty && changed && s->started)
        putchar('\n'); /* keep the last line of the stage before */
    char best[32] = "-";
    if (isfinite(p->best_ms))
        snprintf(best, sizeof best, "%.4f ms", p->best_ms);
    printf("%s[%7.1f s] %-7s %6ld settings measured, %6ld cache hits, best forward %s%s",
           s->tty ? "\r" : "", now - s->t0, search_stage_name(p->stage), p->measured,
           p->cache_hits, best, s->tty ? "\033[K" : "\n");
    fflush(stdout);
    s->started = 1;
    s->stage = p->stage;
    s->last = now;
}

/* ---- decode steps: --decode-batch ------------------------------------------------------------- */

/* The decode step of the model at (batch, context): its graph, from the model built there. */
static int decode_graph(const graph_script *info, int batch, int context, graph *cg,
                        gen_decoder *dec) {
    stof_error err = {0};
    int rc = lua_api_rebuild_at(info, batch, context, cg, &err);
    if (!rc)
        rc = gen_decoder_build(cg, dec, &err);
    if (rc)
        fprintf(stderr, "stof: --decode-batch %d: %s\n", batch, err.msg);
    return rc;
}

/* The model's positions: the second dimension of its first input of two or more (the token
 * ids). */
static int model_seq(const graph *g) {
    for (int t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].role == GRAPH_INPUT && g->tensors[t].ndim >= 2)
            return (int)g->tensors[t].shape[1];
    return 1;
}

/* The caches' positions of the decode steps: --decode-context, else the model's seq. */
static int decode_context(const cli_args *a, const graph *g) {
    return a->decode_context ? a->decode_context : model_seq(g);
}

/* The tuned plan against the executor's default plan, end to end. */
static void print_default_race(const tune_outcome *o, const char *indent) {
    if (o->kept_default)
        printf("%sthe executor's default plan kept: %.4f ms as a CUDA graph against the "
               "search's plan's %.4f ms\n", indent, o->default_ms, o->search_graph_ms);
    else if (o->default_ms > 0)
        printf("%sthe executor's default plan: %.4f ms as a CUDA graph, the search's plan %.4f "
               "ms\n", indent, o->default_ms, o->search_graph_ms);
    else if (o->default_skipped[0])
        printf("%sthe executor's default plan not timed: %s\n", indent, o->default_skipped);
}

/* Each --decode-batch's step tuned on ctx (NULL: planned offline for arch) and added to p, up
 * to the first that fails (said; 1 returned: the plan keeps the steps made before it). */
static int tune_decode_steps(const cli_args *a, exec_ctx *ctx, const char *arch,
                             const graph_script *info, const tune_options *o, int context,
                             plan *p) {
    for (int i = 0; i < a->n_decode; i++) {
        const int batch = a->decode_batch[i];
        graph cg;
        gen_decoder dec;
        memset(&dec, 0, sizeof dec);
        graph_init(&cg);
        int rc = decode_graph(info, batch, context, &cg, &dec);
        plan step;
        memset(&step, 0, sizeof step);
        stof_error err = {0};
        double seconds = 0, graph_ms = 0;
        tune_outcome res = {0};
        if (!rc && ctx) {
            printf("tuning the decode step for batch %d, caches of %d positions\n", batch,
                   context);
            rc = tune_gpu(ctx, &dec.g, info, o, &step, &res, &err);
            seconds = res.seconds;
            graph_ms = res.graph_ms;
        } else if (!rc) {
            tune_offline_stats st = {0};
            rc = tune_offline(&dec.g, info, arch, NULL, &step, &st, &err);
            seconds = st.seconds;
        }
        if (!rc)
            rc = plan_add_decode(p, batch, context, &step, &err);
        if (rc && err.msg[0])
            fprintf(stderr, "stof: the decode step for batch %d: %s\n", batch, err.msg);
        else if (!rc && ctx) {
            printf("decode step, batch %d: %.4f ms a step as a CUDA graph (tuned in %.1f s)\n",
                   batch, graph_ms, seconds);
            print_default_race(&res, "  ");
        }
        else if (!rc)
            printf("decode step, batch %d: planned offline for %s, unmeasured (%.1f s)\n", batch,
                   arch, seconds);
        plan_free(&step);
        gen_decoder_free(&dec);
        graph_free(&cg);
        if (rc)
            return 1;
    }
    return 0;
}

/* ---- offline -------------------------------------------------------------------------------- */

static int tune_offline_cmd(const cli_args *a, const graph *g, const graph_script *info,
                            const char *why) {
    const char *arch = a->arch ? a->arch : CLI_TUNE_DEFAULT_ARCH;
    printf("%s\n", why);
    printf("planning offline for %s: the initial scheme with default kernel settings; nothing "
           "is measured\n", arch);
    plan p;
    tune_offline_stats st;
    stof_error err = {0};
    if (tune_offline(g, info, arch, NULL, &p, &st, &err)) {
        fprintf(stderr, "stof: %s\n", err.msg);
        return 1;
    }
    int steps_failed = tune_decode_steps(a, NULL, arch, info, NULL, decode_context(a, g), &p);
    if (plan_write(&p, a->output, &err)) {
        fprintf(stderr, "stof: %s\n", err.msg);
        plan_free(&p);
        return 1;
    }
    if (steps_failed) {
        fprintf(stderr, "stof: wrote %s with %d of the %d decode steps asked for\n", a->output,
                p.n_decode, a->n_decode);
        plan_free(&p);
        return 1;
    }
    cli_plan_print(&p);
    printf("kernels for %s: %d (%d compiled now, %d already in the kernel cache), %.1f s\n", arch,
           st.kernels, st.compiled, st.disk_hits + st.memory_hits, st.seconds);
    cli_warn_cache("kernel cache", st.cache_problems, st.cache_problem);
    printf("wrote %s: an UNMEASURED plan for %s. Nothing was measured; run stof tune on a GPU "
           "to tune it\n", a->output, arch);
    plan_free(&p);
    return 0;
}

/* ---- on the GPU -------------------------------------------------------------------------------- */

static void print_outcome(const tune_outcome *o, const plan *p) {
    const search_stats *s = &o->search;
    printf("search: %ld settings measured (stage 1: %ld, stage 2: %ld), %ld cache hits, %ld "
           "schemes tried, %ld kept, %d rounds in %.1f s%s%s\n", s->measured, s->measured_stage1,
           s->measured_stage2, s->cache_hits, s->schemes_tried, s->schemes_kept, s->rounds,
           s->seconds, s->stopped_by_budget ? " (budget spent)" : "",
           s->stopped_by_time ? " (time limit reached)" : "");
    const tune_backend_stats *b = &o->backend;
    printf("measurements: %ld timed, %ld rejected for a wrong output, %ld could not run here; "
           "%ld CPU references\n", b->measured, b->rejected, b->failed, b->references);
    printf("after the search: %ld default and selector settings timed, %d segment%s improved\n",
           o->extra_measured, o->improved, o->improved == 1 ? "" : "s");
    print_default_race(o, "");
    cli_plan_print(p);
    if (o->checked)
        printf("reference: relative error %.3e, max abs error %.3e, %lld non-finite: %s\n",
               o->diff.rel_error, o->diff.max_abs, (long long)o->diff.n_nonfinite,
               o->check_ok ? "ok" : "MISMATCH");
    else
        printf("reference: not checked (big model, or --no-check; --check runs it)\n");
}

/* Where the time went: phases, compiles, measurements, references. */
static void print_time_breakdown(const tune_outcome *o) {
    const tune_timing *t = &o->timing;
    const tune_backend_stats *b = &o->backend;
    const search_stats *s = &o->search;
    printf("time: %.1f s: search %.1f s, defaults and selector %.1f s, end to end %.1f s\n",
           o->seconds, t->search_s, t->refine_s, t->end_to_end_s);
    printf("  kernels: %ld compiled, %ld read from the disk cache, %ld failed; NVRTC %.1f s "
           "summed over %d threads\n", t->compiled, t->from_disk, t->compile_failed,
           t->compile_sum_s, t->threads);
    for (int i = 0; i < t->n_sources; i++)
        if (t->by_source[i].compiled > 0)
            printf("           %-20s %4d compiled, %6.1f s, %.2f s each\n",
                   t->by_source[i].source, t->by_source[i].compiled, t->by_source[i].compile_s,
                   t->by_source[i].compile_s / t->by_source[i].compiled);
    if (t->slowest_s > 0)
        printf("           the slowest: %.1f s, %s\n", t->slowest_s, t->slowest);
    nvrtc_workers_info wi;
    nvrtc_workers_status(&wi);
    if (wi.started > 0)
        printf("           in %ld compiler processes (%ld compiles)%s%s\n", wi.started,
               wi.compiles, wi.why_off[0] ? "; then in this process: " : "", wi.why_off);
    else
        printf("           in this process%s%s\n", wi.why_off[0] ? ": " : "", wi.why_off);
    printf("           %ld made ahead of need, %ld of them used; %ld asked for and found "
           "in memory\n", t->ahead, t->ahead_used, t->memory_hits);
    printf("           %.1f s of compiling not hidden (the measuring thread compiled or "
           "waited)\n", t->compile_wait_s);
    printf("  measuring: %.1f s for %ld settings (%ld timed, %ld wrong, %ld could not run):\n",
           b->measure_s, b->measured + b->rejected + b->failed, b->measured, b->rejected,
           b->failed);
    printf("           scratch %.1f s, kernel plans %.1f s, checks %.1f s (of it %.1f s "
           "waiting for references), timed runs %.1f s\n", b->scratch_s, b->plan_s,
           b->check_s, b->reference_wait_s, b->time_s);
    if (b->longest[0])
        printf("           the longest: %.1f s, %s (%.1f s of it kernel plans)\n", b->longest_s,
               b->longest, b->longest_plan_s);
    printf("  references: %ld computed, %.1f s summed over threads; scratch: %ld segments "
           "uploaded, %ld kept\n", b->references, b->reference_s, b->scratch_new,
           b->scratch_kept);
    printf("  settings: %ld measured, %ld cache hits; %ld announced ahead in %ld batches (%ld "
           "past the kernels' limits)\n", s->measured + o->extra_measured, s->cache_hits,
           b->prepared, s->prepare_calls, b->prepare_skipped);
}

static int tune_gpu_cmd(const cli_args *a, exec_ctx *ctx, const graph *g,
                        const graph_script *info) {
    const stof_device_info *dev = exec_ctx_device(ctx);
    char cache_path[1100];
    tune_cache_path_default(cache_path, sizeof cache_path);
    printf("tuning %s (%s) on %s (%s, %d SMs)\n", g->name, info->name, dev->name,
           exec_ctx_arch(ctx), dev->sm_count);
    char budget[32] = "no budget", limit[32] = "no time limit";
    if (a->budget)
        snprintf(budget, sizeof budget, "budget %ld settings", a->budget);
    if (a->time_limit > 0)
        snprintf(limit, sizeof limit, "time limit %.0f s", a->time_limit);
    printf("%s, %s, seed %llu; measurements cached in %s\n", budget, limit,
           (unsigned long long)a->seed, cache_path[0] ? cache_path : "memory only");
    progress_state ps = {isatty(STDOUT_FILENO), 0, SEARCH_STAGE_INITIAL, util_now(), 0};
    tune_options o = {.budget = a->budget, .time_limit_s = a->time_limit, .seed = a->seed,
                      .cache_path = cache_path[0] ? cache_path : NULL, .reps = a->reps,
                      .check = a->check == CLI_CHECK_ALWAYS  ? 1
                               : a->check == CLI_CHECK_NEVER ? -1
                                                             : 0,
                      .progress = on_progress, .ud = &ps};
    plan p;
    tune_outcome res;
    stof_error err = {0};
    int rc = tune_gpu(ctx, g, info, &o, &p, &res, &err);
    if (ps.tty && ps.started)
        putchar('\n');
    if (rc) {
        if (res.checked && !res.check_ok)
            printf("reference: relative error %.3e, %lld non-finite: MISMATCH\n",
                   res.diff.rel_error, (long long)res.diff.n_nonfinite);
        fprintf(stderr, "stof: %s\n", err.msg);
        return 1;
    }
    print_outcome(&res, &p);
    print_time_breakdown(&res);
    cli_warn_cache("kernel cache", res.kernel_cache_problems, res.kernel_cache_problem);
    cli_warn_cache("measurement cache: a line skipped", (int)res.cache.skipped,
                   res.cache.skipped_first);
    long past = res.search.measured_past_limit;
    if (past > 0)
        fprintf(stderr, "stof: warning: the time limit of %g s ran out before the initial scheme "
                "was measured; it was finished past the limit (%ld more setting%s, the "
                "segments' defaults first) and nothing was searched: the plan is the initial "
                "scheme, untuned. Give a longer --time-limit to tune it\n", a->time_limit, past,
                past == 1 ? "" : "s");
    o.progress = NULL; /* the decode steps say one line each */
    int steps_failed =
        tune_decode_steps(a, ctx, exec_ctx_arch(ctx), info, &o, decode_context(a, g), &p);
    rc = plan_write(&p, a->output, &err);
    if (rc)
        fprintf(stderr, "stof: %s\n", err.msg);
    else if (steps_failed)
        fprintf(stderr, "stof: wrote %s with %d of the %d decode steps asked for\n", a->output,
                p.n_decode, a->n_decode);
    else
        printf("wrote %s (%s in %.1f s)\n", a->output,
               past > 0 ? "NOT searched: the initial scheme, measured" : "tuned", res.seconds);
    plan_free(&p);
    return rc || steps_failed ? 1 : 0;
}

int cli_cmd_tune(const cli_args *a) {
    if (!a->output) {
        fprintf(stderr, "stof: stof tune needs -o PLAN.json, the file to write the plan to\n");
        return 2;
    }
    if (a->cpu || a->n_schemes) {
        fprintf(stderr, "stof: stof tune searches the schemes on the GPU: --cpu and --scheme do "
                "not go with it\n");
        return 2;
    }
    if (a->decode_context && !a->n_decode) {
        fprintf(stderr, "stof: --decode-context sizes the caches of --decode-batch's steps: give "
                "--decode-batch too\n");
        return 2;
    }
    graph g;
    graph_script info;
    if (cli_load_graph(a, &g, &info))
        return 1;
    if (a->n_decode) { /* a model that has no decode step says so before any tuning */
        graph cg;
        gen_decoder dec;
        memset(&dec, 0, sizeof dec);
        graph_init(&cg);
        int bad = decode_graph(&info, a->decode_batch[0],
                               decode_context(a, &g),
                               &cg, &dec);
        gen_decoder_free(&dec);
        graph_free(&cg);
        if (bad) {
            graph_free(&g);
            return 1;
        }
    }
    exec_ctx *ctx = NULL;
    stof_error err = {0};
    int rc = exec_ctx_create(0, &ctx, &err);
    char why[1200];
    if (rc == STOF_ERR_NO_DEVICE) {
        snprintf(why, sizeof why, "no GPU to measure on: %s", err.msg);
        rc = tune_offline_cmd(a, &g, &info, why);
    } else if (rc) {
        fprintf(stderr, "stof: %s\n", err.msg);
        rc = 1;
    } else if (a->arch && strcmp(a->arch, exec_ctx_arch(ctx)) != 0) {
        snprintf(why, sizeof why, "--arch %s is not this GPU's architecture (%s)", a->arch,
                 exec_ctx_arch(ctx));
        rc = tune_offline_cmd(a, &g, &info, why);
    } else {
        rc = tune_gpu_cmd(a, ctx, &g, &info);
    }
    exec_ctx_free(ctx);
    graph_free(&g);
    return rc;
}
