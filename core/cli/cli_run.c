/* `stof run`: a model on the GPU through the executor (core/exec/exec.h), or
 * with --cpu on the fp32 CPU reference.
 *
 * Everything that can be decided without the GPU (the script, the schemes,
 * their segments and templates, the buffers, the --weights and --inputs
 * files against the graph) is checked first, so a bad --scheme or a weight
 * file of another model gets its reason on any machine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cli/cli.h"

#include "core/base/file.h"
#include "core/exec/exec.h"
#include "core/ref/ref.h"
#include "core/io/model_dir.h"
#include "core/io/safetensors.h"
#include "core/base/util.h"
#include "fusion/templates.h"
#include "ops/ops.h"

/* Beyond this many FLOPs the CPU reference takes too long to run unasked
 * (a few GFLOP/s in fp32 on one core): --check runs it anyway. */
#define CLI_CHECK_MAX_FLOPS 2e10

/* ---- values: --weights, --inputs, --save-output ------------------------------------------ */

void cli_values_close(cli_values *v) {
    safetensors_close(v->weights);
    safetensors_close(v->inputs);
    memset(v, 0, sizeof *v);
}

int cli_values_open(const cli_args *a, const graph *g, const char *dir, cli_values *v) {
    memset(v, 0, sizeof *v);
    v->src = weights_source_seeded(a->seed);
    stof_error err = {0};
    /* a model directory brings its weights, unless --weights names others */
    int rc = a->weights                 ? safetensors_open(a->weights, &v->weights, &err)
             : dir && dir[0]             ? model_dir_weights_at(dir, &v->weights, &err)
                                         : STOF_OK;
    if (!rc && a->inputs)
        rc = safetensors_open(a->inputs, &v->inputs, &err);
    v->src.weights = v->weights;
    v->src.inputs = v->inputs;
    if (!rc)
        rc = weights_source_check(&v->src, g, &err);
    if (rc) {
        fprintf(stderr, "stof: %s\n", err.msg);
        cli_values_close(v);
        return 1;
    }
    return 0;
}

/* Where the values came from, when a file gave some. */
static void values_print(const cli_values *v, const graph *g) {
    if (!v->weights && !v->inputs)
        return;
    char line[2048];
    weights_source_describe(&v->src, g, line, sizeof line);
    printf("%s\n", line);
}

/* --save-output: y (the output's values) as one fp32 tensor "output". */
static int save_output(const cli_args *a, const graph *g, const float *y) {
    if (!a->save_output)
        return 0;
    const graph_tensor *out = &g->tensors[g->output];
    safetensors_entry e = {.name = "output", .dtype = SAFETENSORS_F32, .ndim = out->ndim,
                           .data = y};
    for (int d = 0; d < out->ndim; d++)
        e.shape[d] = out->shape[d];
    stof_error err = {0};
    if (safetensors_write(a->save_output, &e, 1, &err)) {
        fprintf(stderr, "stof: --save-output: %s\n", err.msg);
        return 1;
    }
    char shape[64];
    printf("output: wrote %s (\"output\" %s fp32)\n", a->save_output,
           graph_shape_str(out, shape, sizeof shape));
    return 0;
}

/* ---- the CPU reference ------------------------------------------------------------------ */

static int run_cpu(const cli_args *a) {
    graph g;
    graph_script info;
    if (cli_load_graph(a, &g, &info))
        return 1;
    cli_values vals;
    if (cli_values_open(a, &g, info.model_dir, &vals)) {
        graph_free(&g);
        return 1;
    }
    stof_error err = {0};
    ref_values rv;
    double t0 = util_now();
    int rc = ref_values_init(&g, &vals.src, &rv, &err);
    if (rc == STOF_OK)
        rc = ref_execute(&g, &rv, &err);
    if (rc) {
        fprintf(stderr, "stof: %s\n", err.msg);
        ref_values_free(&rv);
        cli_values_close(&vals);
        graph_free(&g);
        return 1;
    }
    const graph_tensor *out = &g.tensors[g.output];
    int64_t n = graph_tensor_numel(out);
    double sum, sum_sq;
    ref_checksum(rv.data[g.output], n, &sum, &sum_sq);
    char shape[64];
    printf("model %s (%s), CPU reference fp32, seed %llu\n", g.name, info.name,
           (unsigned long long)a->seed);
    cli_print_masks(&g);
    values_print(&vals, &g);
    printf("output %s %s: %lld values\n", out->name, graph_shape_str(out, shape, sizeof shape),
           (long long)n);
    printf("checksum: sum %.9e  sum of squares %.9e\n", sum, sum_sq);
    printf("first values:");
    for (int64_t i = 0; i < n && i < 4; i++)
        printf(" %.6f", rv.data[g.output][i]);
    printf("\ntime %.2f s, peak host memory %.1f MB\n", util_now() - t0, rv.peak_bytes / 1e6);
    int bad = save_output(a, &g, rv.data[g.output]);
    ref_values_free(&rv);
    cli_values_close(&vals);
    graph_free(&g);
    return bad;
}

/* ---- schemes from the command line ------------------------------------------------------- */

/* "layers 0-5", "layers 0, 2, 4", "layer 3": the layers of class cls. */
static const char *class_layers(const exec_seq *seqs, int n, int cls, char *buf, size_t cap) {
    int layers[4096], k = 0;
    for (int i = 0; i < n && k < 4096; i++)
        if (seqs[i].cls == cls && seqs[i].layer >= 0)
            layers[k++] = seqs[i].layer;
    int consecutive = 1;
    for (int i = 1; i < k; i++)
        consecutive &= layers[i] == layers[i - 1] + 1;
    if (k == 1)
        snprintf(buf, cap, "layer %d", layers[0]);
    else if (consecutive)
        snprintf(buf, cap, "layers %d-%d", layers[0], layers[k - 1]);
    else {
        size_t len = (size_t)snprintf(buf, cap, "layers");
        for (int i = 0; i < k && len < cap; i++)
            len += (size_t)snprintf(buf + len, cap - len, "%s %d", i ? "," : "", layers[i]);
    }
    return buf;
}

/* One --scheme entry for the class whose first sequence is seqs[rep]. */
static int scheme_for(const graph *g, const exec_seq *seq, const char *text, fusion_scheme *s,
                      stof_error *err) {
    if (strcmp(text, "default") == 0)
        return exec_default_scheme(g, seq, s, err);
    if (strcmp(text, "unfused") == 0)
        return fusion_scheme_all_unfused(s, seq->n, err);
    return fusion_scheme_parse(text, seq->n, s, err);
}

/* schemes[i] for every class representative i: the layers' from --scheme
 * (default scheme without it), the sequences outside layers unfused. */
static int cli_schemes(const cli_args *a, const graph *g, const exec_seq *seqs, int n,
                       fusion_scheme *schemes) {
    int n_classes = 0;
    for (int i = 0; i < n; i++)
        n_classes += seqs[i].layer >= 0 && seqs[i].cls == i;
    if (a->n_schemes > 0 && n_classes == 0) {
        fprintf(stderr, "stof: --scheme: model %s has no layers to apply it to\n", g->name);
        return 1;
    }
    if (a->n_schemes > 1 && a->n_schemes != n_classes) {
        fprintf(stderr, "stof: %d --scheme options, but model %s has %d layer class%s: give "
                "one for all of them or one per class\n", a->n_schemes, g->name, n_classes,
                n_classes == 1 ? "" : "es");
        return 1;
    }
    int c = 0;
    for (int i = 0; i < n; i++) {
        memset(&schemes[i], 0, sizeof schemes[i]);
        if (seqs[i].layer < 0 || seqs[i].cls != i)
            continue;
        const char *text = a->n_schemes == 0 ? "default" : a->schemes[a->n_schemes > 1 ? c : 0];
        c++;
        stof_error err = {0};
        if (scheme_for(g, &seqs[i], text, &schemes[i], &err) ||
            exec_scheme_check(g, &seqs[i], &schemes[i], &err)) {
            char who[128];
            fprintf(stderr, "stof: --scheme %s for %s (%d ops): %s\n", text,
                    class_layers(seqs, n, i, who, sizeof who), seqs[i].n, err.msg);
            return 1;
        }
    }
    return 0;
}

/* ---- the GPU run --------------------------------------------------------------------------- */

typedef struct run_state {
    graph g;
    int have_graph;
    graph_script info;
    exec_seq *seqs;
    int n_seqs;
    fusion_scheme *schemes;
    exec_plan *plan;
    exec_ctx *ctx;
    exec_model *model;
    cli_values vals;
    float *eager, *replayed, *ref;
} run_state;

static void run_free(run_state *r) {
    exec_model_free(r->model);
    exec_ctx_free(r->ctx);
    exec_plan_free(r->plan);
    free(r->seqs);
    free(r->schemes);
    free(r->eager);
    free(r->replayed);
    free(r->ref);
    cli_values_close(&r->vals);
    if (r->have_graph)
        graph_free(&r->g);
}

static int fail(run_state *r, const stof_error *err) {
    fprintf(stderr, "stof: %s\n", err->msg);
    run_free(r);
    return 1;
}

/* Whether the inputs' attention_mask made the pass padding-free (core/exec/exec_pack.h). */
static void print_packing(const run_state *r) {
    int64_t tokens, rows;
    int has_mask = 0;
    for (int t = 0; t < r->g.n_tensors; t++)
        has_mask |= r->g.tensors[t].role == GRAPH_INPUT &&
                    r->g.tensors[t].init == GRAPH_INIT_PADDING;
    const char *refused = exec_model_pack_refused(r->model);
    if (has_mask && *refused)
        printf("padding: padded batches run padded (%s)\n", refused);
    if (!exec_model_packing(r->model, &tokens, &rows))
        return;
    const graph_tensor *out = &r->g.tensors[r->g.output];
    const int64_t padded = out->shape[0] * (out->ndim > 2 ? out->shape[1] : 1);
    printf("padding: %lld of %lld positions are tokens; every segment but the attentions runs "
           "on them alone, packed into %lld rows (STOF_PACK=0: the padded pass)\n",
           (long long)tokens, (long long)padded, (long long)rows);
}

static void print_plan(const run_state *r) {
    const exec_plan *p = r->plan;
    char bin[FUSION_SCHEME_BINARY_MAX], hex[FUSION_SCHEME_HEX_MAX], who[160], desc[640];
    for (int i = 0; i < p->n_seqs; i++) {
        if (p->seqs[i].cls != i)
            continue;
        const exec_seq *q = &p->seqs[i];
        fusion_scheme_format_binary(&p->schemes[i], bin, sizeof bin);
        fusion_scheme_format_hex(&p->schemes[i], hex, sizeof hex);
        if (q->layer >= 0)
            class_layers(p->seqs, p->n_seqs, i, who, sizeof who);
        else
            exec_seq_name(q, who, sizeof who);
        printf("%s (%d ops): scheme %s  %s\n", who, q->n, hex, bin);
        for (int s = 0; s < p->n_segs; s++) {
            const exec_segment *sg = &p->segs[s];
            if (sg->seq != i)
                continue;
            char kinds[256] = "";
            size_t len = 0;
            for (int k = 0; k < sg->n && len < sizeof kinds; k++)
                len += (size_t)snprintf(kinds + len, sizeof kinds - len, "%s%s", k ? " " : "",
                                        op_describe(p->g->ops[sg->first + k].kind)->name);
            exec_model_describe(r->model, s, desc, sizeof desc);
            printf("  #%-4d %-32s %-16s %s\n", sg->first, kinds,
                   fusion_template_get(exec_model_template(r->model, s))->name, desc);
        }
    }
}

static double total_flops(const graph *g) {
    double sum = 0;
    for (int i = 0; i < g->n_ops; i++) {
        double f, b;
        op_cost(g, &g->ops[i], &f, &b);
        sum += f;
    }
    return sum;
}

/* The CPU reference and the comparison; 1 on a mismatch. */
static int check_reference(const cli_args *a, run_state *r, int64_t n, double flops) {
    if (a->check == CLI_CHECK_NEVER) {
        printf("reference: not checked (--no-check)\n");
        return 0;
    }
    if (a->check == CLI_CHECK_AUTO && flops > CLI_CHECK_MAX_FLOPS) {
        printf("reference: skipped, %.0f GFLOP would take long on the CPU (--check runs it)\n",
               flops * 1e-9);
        return 0;
    }
    stof_error err = {0};
    double t0 = util_now();
    if (exec_reference(&r->g, &r->vals.src, &r->ref, &err)) {
        fprintf(stderr, "stof: CPU reference: %s\n", err.msg);
        return 1;
    }
    exec_diff d;
    exec_compare(r->eager, r->ref, n, &d);
    double tol = r->plan->dtype == STOF_BF16 ? 2e-2 : 1e-2;
    int ok = d.n_nonfinite == 0 && d.rel_error < tol;
    printf("reference: relative error %.3e, max abs error %.3e, %lld non-finite (CPU reference "
           "fp32, %.1f s): %s\n", d.rel_error, d.max_abs, (long long)d.n_nonfinite,
           util_now() - t0, ok ? "ok" : "MISMATCH");
    if (!ok)
        fprintf(stderr, "stof: the GPU output differs from the CPU reference (relative error "
                "%.3e, tolerance %.0e)\n", d.rel_error, tol);
    return !ok;
}

/* The recorded times of plan p beside the ones just measured. */
static void compare_with_plan(const plan *p, double eager_ms, double graph_ms) {
    if (!p->device.measured) {
        printf("plan: made offline for %s, unmeasured: nothing recorded to compare with\n",
               p->device.arch);
        return;
    }
    printf("plan: recorded %.3f ms from its segments' times", p->latency_ms);
    if (p->has_end_to_end)
        printf(", %.3f ms by CUDA graph (eager %.3f ms) when tuned", p->end_to_end.graph_ms,
               p->end_to_end.eager_ms);
    double recorded = p->has_end_to_end ? p->end_to_end.graph_ms : p->latency_ms;
    printf("; now %.3f ms by CUDA graph, eager %.3f ms (%+.1f%%)\n", graph_ms, eager_ms,
           recorded > 0 ? 100.0 * (graph_ms - recorded) / recorded : 0.0);
}

/* What plan p recorded for segment index of the sequence whose first op is
 * first, timed alone when tuned; -1 when it has no such record. */
static double recorded_segment_ms(const plan *p, int first, int index) {
    if (!p || !p->device.measured)
        return -1;
    for (int q = 0; q < p->n_sequences; q++)
        for (int i = 0; i < p->sequences[q].n_instances; i++)
            if (p->sequences[q].instances[i] == first)
                return index < p->sequences[q].n_segments ? p->sequences[q].segments[index].ms
                                                          : -1;
    return -1;
}

/* One profile row: segment position k of class cls, summed over the
 * sequences of the class; returns its in-pass milliseconds. */
static double print_profile_row(const run_state *r, const plan *pf, const double *seg_ms,
                                int cls, int k, double total) {
    const exec_plan *p = r->plan;
    double ms = 0, alone = 0;
    int runs = 0, rep = -1;
    for (int s = 0; s < p->n_segs; s++) {
        const exec_segment *sg = &p->segs[s];
        if (p->seqs[sg->seq].cls != cls || sg->index != k)
            continue;
        if (rep < 0)
            rep = s;
        ms += seg_ms[s];
        runs++;
        double rec = recorded_segment_ms(pf, p->seqs[sg->seq].first, k);
        alone = alone < 0 || rec < 0 ? -1 : alone + rec;
    }
    const exec_segment *sg = &p->segs[rep];
    char kinds[256] = "", alone_text[48] = "";
    size_t len = 0;
    for (int o = 0; o < sg->n && len < sizeof kinds; o++)
        len += (size_t)snprintf(kinds + len, sizeof kinds - len, "%s%s", o ? " " : "",
                                op_describe(p->g->ops[sg->first + o].kind)->name);
    if (alone >= 0)
        snprintf(alone_text, sizeof alone_text, "  alone when tuned %.3f ms", alone);
    printf("  #%-4d %-32s %-16s x%-3d %8.3f ms %5.1f%%%s\n", sg->first, kinds,
           fusion_template_get(exec_model_template(r->model, rep))->name, runs, ms,
           total > 0 ? 100 * ms / total : 0.0, alone_text);
    return ms;
}

/* --profile: every segment's time inside the forward pass, one row per
 * segment position of each sequence class (summed over its layers), beside
 * the time the plan pf (may be NULL) recorded for it alone. */
static int print_profile(const cli_args *a, const run_state *r, const plan *pf, double eager_ms,
                         double graph_ms) {
    const exec_plan *p = r->plan;
    stof_error err = {0};
    double *seg_ms = calloc((size_t)(p->n_segs ? p->n_segs : 1), sizeof *seg_ms);
    if (!seg_ms) {
        fprintf(stderr, "stof: out of memory\n");
        return 1;
    }
    if (exec_model_profile(r->model, a->reps, seg_ms, &err)) {
        fprintf(stderr, "stof: --profile: %s\n", err.msg);
        free(seg_ms);
        return 1;
    }
    double total = 0;
    for (int s = 0; s < p->n_segs; s++)
        total += seg_ms[s];
    printf("profile: each segment inside the forward pass (median of %d CUDA-graph replays, an "
           "event between segments)\n", a->reps);
    char who[160];
    for (int i = 0; i < p->n_seqs; i++) {
        if (p->seqs[i].cls != i)
            continue;
        if (p->seqs[i].layer >= 0)
            class_layers(p->seqs, p->n_seqs, i, who, sizeof who);
        else
            exec_seq_name(&p->seqs[i], who, sizeof who);
        printf("%s:\n", who);
        int n_pos = 0;
        for (int s = 0; s < p->n_segs; s++)
            if (p->segs[s].seq == i && p->segs[s].index + 1 > n_pos)
                n_pos = p->segs[s].index + 1;
        for (int k = 0; k < n_pos; k++)
            print_profile_row(r, pf, seg_ms, i, k, total);
    }
    printf("profile: segments add up to %.3f ms; the pass without events: eager %.3f ms, CUDA "
           "graph %.3f ms\n", total, eager_ms, graph_ms);
    free(seg_ms);
    return 0;
}

/* From the GPU context on: the model of r->plan made, run, timed, checked.
 * p (may be NULL) is the plan file it came from, checked against the GPU.
 * Frees r. */
static int run_on_gpu(const cli_args *a, run_state *r, const plan *p, const char *plan_path);

static int run_gpu(const cli_args *a) {
    run_state r;
    memset(&r, 0, sizeof r);
    if (cli_load_graph(a, &r.g, &r.info))
        return 1;
    r.have_graph = 1;
    stof_error err = {0};
    /* everything the CPU can decide, before the GPU */
    stof_dtype dtype;
    if (exec_model_dtype(&r.g, &dtype, &err) || fusion_sequences(&r.g, &r.seqs, &r.n_seqs, &err))
        return fail(&r, &err);
    r.schemes = calloc((size_t)r.n_seqs, sizeof *r.schemes);
    if (!r.schemes) {
        fprintf(stderr, "stof: out of memory\n");
        run_free(&r);
        return 1;
    }
    if (cli_schemes(a, &r.g, r.seqs, r.n_seqs, r.schemes)) {
        run_free(&r);
        return 1;
    }
    if (exec_plan_create(&r.g, r.schemes, &r.plan, &err))
        return fail(&r, &err);
    return run_on_gpu(a, &r, NULL, NULL);
}

static int run_on_gpu(const cli_args *a, run_state *r, const plan *pf, const char *plan_path) {
    stof_error err = {0};
    if (cli_values_open(a, &r->g, r->info.model_dir, &r->vals)) {
        run_free(r);
        return 1;
    }
    int rc = exec_ctx_create(0, &r->ctx, &err);
    if (rc == STOF_ERR_NO_DEVICE) {
        fprintf(stderr, "stof: GPU execution needs a GPU, and this machine has none usable: %s\n"
                "(the CPU reference runs with stof run --cpu SCRIPT)\n", err.msg);
        run_free(r);
        return 1;
    }
    if (rc)
        return fail(r, &err);
    const stof_device_info *dev = exec_ctx_device(r->ctx);
    if (pf && plan_check_fits(pf, dev, NULL, NULL, &err)) {
        fprintf(stderr, "stof: the plan %s does not fit this GPU: %s\n", plan_path, err.msg);
        run_free(r);
        return 1;
    }
    printf("model %s (%s), %s, seed %llu\n", r->g.name, r->info.name,
           stof_dtype_name(r->plan->dtype), (unsigned long long)a->seed);
    printf("device: %s (%s, %d SMs, %.0f GiB)\n", dev->name, exec_ctx_arch(r->ctx),
           dev->sm_count, (double)dev->total_mem / (1 << 30));
    cli_print_masks(&r->g);
    values_print(&r->vals, &r->g);
    double t0 = util_now();
    if (exec_model_create(r->ctx, r->plan, &r->vals.src, &r->model, &err))
        return fail(r, &err);
    double setup = util_now() - t0;
    print_plan(r);
    printf("memory: weights %.1f MB, inputs %.3f MB, activations %.2f MB peak (%d buffers; "
           "largest live set %.2f MB)\n", r->plan->weight_bytes / 1e6, r->plan->input_bytes / 1e6,
           r->plan->arena_bytes / 1e6, r->plan->n_bufs, r->plan->live_bound / 1e6);
    print_packing(r);
    const graph_tensor *out = &r->g.tensors[r->g.output];
    int64_t n = graph_tensor_numel(out);
    r->eager = malloc(sizeof *r->eager * (size_t)n);
    r->replayed = malloc(sizeof *r->replayed * (size_t)n);
    if (!r->eager || !r->replayed) {
        fprintf(stderr, "stof: out of memory\n");
        run_free(r);
        return 1;
    }
    double eager_ms, graph_ms;
    if (exec_model_run(r->model, &err) || exec_model_output(r->model, r->eager, &err) ||
        exec_model_time(r->model, 0, a->reps, &eager_ms, &err) ||
        exec_model_capture(r->model, &err) ||
        exec_model_time(r->model, 1, a->reps, &graph_ms, &err) ||
        exec_model_replay(r->model, &err) || exec_model_output(r->model, r->replayed, &err))
        return fail(r, &err);
    double flops = total_flops(&r->g);
    printf("setup %.2f s (kernels compiled or loaded, weights uploaded)\n", setup);
    int problems = 0;
    const char *w = exec_ctx_cache_warning(r->ctx, &problems);
    cli_warn_cache("kernel cache", problems, w ? w : "");
    printf("latency: eager %.3f ms, CUDA graph %.3f ms (median of %d; %.1f TFLOP/s)\n",
           eager_ms, graph_ms, a->reps, graph_ms > 0 ? flops / (graph_ms * 1e-3) * 1e-12 : 0.0);
    exec_graph_edges ge;
    if (exec_model_graph_edges(r->model, &ge, &err))
        return fail(r, &err);
    printf("CUDA graph: %zu dependencies, %zu of them programmatic (the next kernel may start "
           "before its predecessor ends)\n", ge.edges, ge.programmatic);
    int same = memcmp(r->eager, r->replayed, sizeof *r->eager * (size_t)n) == 0;
    double sum, sum_sq;
    ref_checksum(r->eager, n, &sum, &sum_sq);
    char shape[64];
    printf("output %s %s: %lld values; graph replay %s the eager run\n", out->name,
           graph_shape_str(out, shape, sizeof shape), (long long)n,
           same ? "matches" : "DIFFERS FROM");
    printf("checksum: sum %.9e  sum of squares %.9e\n", sum, sum_sq);
    int bad = !same;
    if (!same)
        fprintf(stderr, "stof: the CUDA graph replay gave another output than the eager run\n");
    bad |= save_output(a, &r->g, r->eager);
    bad |= check_reference(a, r, n, flops);
    if (pf)
        compare_with_plan(pf, eager_ms, graph_ms);
    if (a->profile)
        bad |= print_profile(a, r, pf, eager_ms, graph_ms);
    run_free(r);
    return bad;
}

/* ---- a plan file ------------------------------------------------------------------------------ */

/* The graph of the plan's script with the plan's parameters. */
static int plan_graph(const cli_args *a, const plan *p, run_state *r) {
    if (cli_plan_build(a, p, NULL, 0, &r->g, &r->info))
        return 1;
    r->have_graph = 1;
    stof_error err = {0};
    if (plan_check_fits(p, NULL, &r->info, &r->g, &err)) {
        fprintf(stderr, "stof: the plan %s does not fit %s: %s\n", a->script, r->info.path,
                err.msg);
        return 1;
    }
    return 0;
}

int cli_run_plan(const cli_args *a) {
    if (a->n_params || a->n_schemes || a->cpu) {
        fprintf(stderr, "stof: a plan fixes the script's parameters and schemes and runs on the "
                "GPU: --set, --scheme and --cpu do not go with %s\n", a->script);
        return 2;
    }
    plan p;
    stof_error err = {0};
    if (plan_read(a->script, &p, &err)) {
        fprintf(stderr, "stof: %s\n", err.msg);
        return 1;
    }
    if (cli_check_outputs_dir(a, p.model_dir)) {
        plan_free(&p);
        return 2;
    }
    run_state r;
    memset(&r, 0, sizeof r);
    int rc = plan_graph(a, &p, &r);
    if (!rc && exec_plan_from_plan(&p, &r.g, &r.plan, &err)) {
        fprintf(stderr, "stof: %s: %s\n", a->script, err.msg);
        rc = 1;
    }
    if (rc) {
        run_free(&r);
        plan_free(&p);
        return rc;
    }
    printf("plan %s: %s on %s (%s)\n", a->script, p.script_name,
           p.device.measured ? p.device.name : "no GPU, unmeasured", p.device.arch);
    rc = run_on_gpu(a, &r, &p, a->script);
    plan_free(&p);
    return rc;
}

int cli_cmd_run(const cli_args *a) {
    if (a->cpu && a->profile) {
        fprintf(stderr, "stof: --profile times the GPU's kernels: it does not go with --cpu\n");
        return 1;
    }
    if (cli_is_plan(a->script))
        return cli_run_plan(a);
    return a->cpu ? run_cpu(a) : run_gpu(a);
}
