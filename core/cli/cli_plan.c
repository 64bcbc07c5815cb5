/* Plans on the command line: `stof plan show PLAN.json` (a plan for a person), and the model of
 * a plan built again (its script found and checked, its parameters, its model directory) for
 * `stof run PLAN.json` and `stof generate PLAN.json`. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/base/file.h"
#include "core/base/util.h"
#include "core/cli/cli.h"
#include "core/io/model_dir.h"
#include "fusion/templates.h"
#include "ops/ops.h"

int cli_is_plan(const char *arg) {
    size_t n = arg ? strlen(arg) : 0;
    return n > 5 && strcmp(arg + n - 5, ".json") == 0;
}

static int readable(const char *path) {
    return path[0] && access(path, R_OK) == 0;
}

/* The plan's script: --script, else where the plan recorded it, else by
 * its name beside the plan file, else in scripts/. */
static int find_script(const cli_args *a, const plan *p, char *out, size_t cap) {
    if (a->script_path) {
        snprintf(out, cap, "%s", a->script_path);
        return 0;
    }
    const char *slash = strrchr(a->script, '/');
    char beside[2048], in_scripts[1024];
    snprintf(beside, sizeof beside, "%.*s%s", slash ? (int)(slash - a->script + 1) : 0,
             a->script, p->script_name);
    snprintf(in_scripts, sizeof in_scripts, "scripts/%s", p->script_name);
    const char *tried[3] = {p->script_path, beside, in_scripts};
    for (int i = 0; i < 3; i++)
        if (readable(tried[i])) {
            snprintf(out, cap, "%s", tried[i]);
            return 0;
        }
    fprintf(stderr, "stof: the plan's script %s was not found (tried %s%s%s, %s): give it with "
            "--script PATH\n", p->script_name, p->script_path, p->script_path[0] ? ", " : "",
            beside, in_scripts);
    return 1;
}

/* The script at path is the one the plan was made for: its bytes hash to
 * the plan's hash. Checked before the script runs: a plan names a file,
 * and what is there now may be anything. */
static int script_matches(const plan *p, const char *path) {
    const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
    if (strcmp(name, p->script_name) != 0) {
        fprintf(stderr, "stof: the plan is for script %s, not %s\n", p->script_name, name);
        return 0;
    }
    char *text = NULL;
    size_t len = 0;
    stof_error err = {0};
    if (file_read(path, "script", FILE_LIMIT_SCRIPT, &text, &len, &err)) {
        fprintf(stderr, "stof: the plan's script: %s\n", err.msg);
        return 0;
    }
    uint64_t hash = util_hash(UTIL_HASH_SEED, text, len);
    free(text);
    if (hash != p->script_hash) {
        fprintf(stderr, "stof: %s is not the script the plan was made for (hash 0x%016" PRIx64
                ", the plan's 0x%016" PRIx64 "): tune again, or give the right one with "
                "--script PATH\n", path, hash, p->script_hash);
        return 0;
    }
    return 1;
}

/* Whether the plan's parameter key is one of extra's "key=value" entries. */
static int overridden(const char *key, const char *const *extra, int n_extra) {
    size_t n = strlen(key);
    for (int i = 0; i < n_extra; i++)
        if (strncmp(extra[i], key, n) == 0 && extra[i][n] == '=')
            return 1;
    return 0;
}

int cli_plan_build(const cli_args *a, const plan *p, const char *const *extra, int n_extra,
                   graph *g, graph_script *info) {
    char path[2048];
    if (find_script(a, p, path, sizeof path) || !script_matches(p, path))
        return 1;
    char kv[GRAPH_SCRIPT_MAX_PARAMS][sizeof p->params[0].key + sizeof p->params[0].value + 2];
    const char *params[GRAPH_SCRIPT_MAX_PARAMS];
    int n = 0;
    for (int i = 0; i < p->n_params; i++) {
        if (overridden(p->params[i].key, extra, n_extra))
            continue;
        snprintf(kv[n], sizeof kv[n], "%s=%s", p->params[i].key, p->params[i].value);
        params[n] = kv[n];
        n++;
    }
    if (n + n_extra > GRAPH_SCRIPT_MAX_PARAMS) {
        fprintf(stderr, "stof: the plan's %d parameters and %d more are over the %d a script "
                "takes\n", n, n_extra, GRAPH_SCRIPT_MAX_PARAMS);
        return 1;
    }
    for (int i = 0; i < n_extra; i++)
        params[n++] = extra[i];
    stof_error err = {0};
    graph_init(g);
    memset(info, 0, sizeof *info);
    model_dir md = {0};
    if (p->model_dir[0] && model_dir_open(p->model_dir, &md, &err)) {
        fprintf(stderr, "stof: the plan's model directory: %s\n", err.msg);
        return 1;
    }
    int rc = lua_api_build_config(path, params, n, md.config, g, info, &err);
    model_dir_free(&md);
    if (rc) {
        fprintf(stderr, "stof: the plan's script: %s\n", err.msg);
        graph_free(g);
        return 1;
    }
    snprintf(info->model_dir, sizeof info->model_dir, "%s", p->model_dir);
    return 0;
}

/* "BLOCK_M=64 BLOCK_N=128 WARPS=4" */
static const char *kernel_params(const plan_kernel *k, char *buf, size_t cap) {
    const fusion_template *t = fusion_template_get(k->tmpl);
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; t && i < t->n_params && i < k->n_values && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s=%d", i ? " " : "", t->params[i].name,
                                k->values[i]);
    return buf;
}

static const char *time_str(const plan *p, double ms, char *buf, size_t cap) {
    if (p->device.measured)
        snprintf(buf, cap, "%.4f ms", ms);
    else
        snprintf(buf, cap, "unmeasured");
    return buf;
}

static void print_header(const plan *p) {
    printf("plan: format %d, made by stof %s (commit %s)\n", p->version, p->stof_version,
           p->stof_commit);
    const plan_device *d = &p->device;
    if (d->measured)
        printf("device: %s (%s, compute capability %d.%d, %d SMs)\n", d->name, d->arch,
               d->cc_major, d->cc_minor, d->sm_count);
    else
        printf("device: none, planned offline for %s: UNMEASURED (default kernel settings, "
               "nothing timed)\n", d->arch);
    printf("script: %s (hash 0x%016llx)%s%s\n", p->script_name,
           (unsigned long long)p->script_hash, p->script_path[0] ? " at " : "", p->script_path);
    printf("params:");
    for (int i = 0; i < p->n_params; i++)
        printf(" %s=%s", p->params[i].key, p->params[i].value);
    printf("\nshapes: batch %lld, seq %lld; inputs", (long long)p->batch, (long long)p->seq);
    for (int i = 0; i < p->n_inputs; i++) {
        printf("%s %s [", i ? "," : "", p->inputs[i].name);
        for (int k = 0; k < p->inputs[i].ndim; k++)
            printf("%s%lld", k ? ", " : "", (long long)p->inputs[i].shape[k]);
        printf("]");
    }
    printf("\n");
    for (int i = 0; i < p->n_masks; i++)
        printf("mask %d: %s (%d x %d, %s, fingerprint 0x%016llx)\n", i, p->masks[i].description,
               p->masks[i].q_len, p->masks[i].k_len,
               p->masks[i].batch == 1 ? "shared by the batch" : "per batch",
               (unsigned long long)p->masks[i].fingerprint);
}

static void print_sequence(const plan *p, int qi) {
    const plan_sequence *q = &p->sequences[qi];
    char bin[FUSION_SCHEME_BINARY_MAX], hex[FUSION_SCHEME_HEX_MAX], t[32], params[160];
    fusion_scheme_format_binary(&q->scheme, bin, sizeof bin);
    fusion_scheme_format_hex(&q->scheme, hex, sizeof hex);
    if (q->layer >= 0)
        printf("sequence %d: layer %d", qi, q->layer);
    else
        printf("sequence %d: ops outside layers", qi);
    printf(", %d ops, %d instance%s (first ops", q->n_ops, q->n_instances,
           q->n_instances == 1 ? "" : "s");
    for (int i = 0; i < q->n_instances && i < 8; i++)
        printf(" #%d", q->instances[i]);
    printf("%s)\n  scheme %s  %s, %d segment%s, %s each\n", q->n_instances > 8 ? " ..." : "",
           hex, bin, q->n_segments, q->n_segments == 1 ? "" : "s",
           time_str(p, q->ms, t, sizeof t));
    for (int k = 0; k < q->n_segments; k++) {
        const plan_segment *s = &q->segments[k];
        char ops[256] = "", span[32];
        size_t len = 0;
        for (int i = 0; i <= s->last - s->first && len < sizeof ops; i++)
            len += (size_t)snprintf(ops + len, sizeof ops - len, "%s%s", i ? " " : "",
                                    op_describe(s->kinds[i])->name);
        int a = q->instances[0] + s->first, b = q->instances[0] + s->last;
        if (a == b)
            snprintf(span, sizeof span, "#%d", a);
        else
            snprintf(span, sizeof span, "#%d-#%d", a, b);
        printf("  %-9s %-28s %-16s %-40s %s\n", span, ops,
               fusion_template_get(s->kernel.tmpl)->name,
               kernel_params(&s->kernel, params, sizeof params), time_str(p, s->ms, t, sizeof t));
    }
}

static void print_times(const plan *p) {
    if (!p->device.measured) {
        printf("latency: unmeasured\n");
        return;
    }
    printf("latency: %.4f ms forward, from the segments' times over every instance\n",
           p->latency_ms);
    if (p->has_end_to_end) {
        const plan_end_to_end *e = &p->end_to_end;
        printf("end to end: CUDA graph %.4f ms, eager %.4f ms; all-unfused %.4f ms", e->graph_ms,
               e->eager_ms, e->unfused_ms);
        if (e->graph_ms > 0)
            printf(" (%.2fx)", e->unfused_ms / e->graph_ms);
        printf("\n");
    }
    const plan_stats *s = &p->stats;
    printf("tuning: %.1f s; %ld settings measured, %ld cache hits, %ld schemes tried, %ld kept, "
           "%d stage-2 rounds\n", p->tuning_s, s->settings_measured, s->cache_hits,
           s->schemes_tried, s->schemes_kept, s->rounds);
    if (s->measured_past_limit > 0)
        printf("not searched: the time limit ran out first; the initial scheme, %ld settings "
               "measured past the limit\n", s->measured_past_limit);
}

/* A decode step's sequences and times, after the model's. */
static void print_decode(const plan_decode *d) {
    const plan *s = d->step;
    printf("decode step, batch %d, caches of %lld positions:", d->batch, (long long)d->context);
    if (s->device.measured && s->has_end_to_end)
        printf(" %.4f ms a step as a CUDA graph when tuned", s->end_to_end.graph_ms);
    else if (!s->device.measured)
        printf(" unmeasured");
    printf("\n");
    for (int i = 0; i < s->n_sequences; i++)
        print_sequence(s, i);
}

void cli_plan_print(const plan *p) {
    print_header(p);
    for (int i = 0; i < p->n_sequences; i++)
        print_sequence(p, i);
    print_times(p);
    for (int i = 0; i < p->n_decode; i++)
        print_decode(&p->decode[i]);
}

int cli_cmd_plan(const cli_args *a) {
    if (!a->sub || strcmp(a->sub, "show") != 0) {
        fprintf(stderr, "stof: %s%s%s: the plan command has one subcommand: stof plan show "
                "PLAN.json\n", a->sub ? "unknown plan subcommand '" : "a subcommand is needed",
                a->sub ? a->sub : "", a->sub ? "'" : "");
        return 2;
    }
    if (!a->script) {
        fprintf(stderr, "stof: stof plan show needs a plan file (PLAN.json)\n");
        return 2;
    }
    plan p;
    stof_error err = {0};
    if (plan_read(a->script, &p, &err)) {
        fprintf(stderr, "stof: %s\n", err.msg);
        return 1;
    }
    printf("%s\n", a->script);
    cli_plan_print(&p);
    plan_free(&p);
    return 0;
}
