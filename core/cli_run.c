/* `stof run`: a model on the GPU through the executor (core/exec.h), or
 * with --cpu on the fp32 CPU reference.
 *
 * Everything that can be decided without the GPU (the script, the schemes,
 * their segments and templates, the buffers) is checked first, so a bad
 * --scheme gets its reason on any machine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cli.h"
#include "core/exec.h"
#include "core/ref.h"
#include "core/util.h"
#include "fusion/templates.h"
#include "ops/ops.h"

/* Beyond this many FLOPs the CPU reference takes too long to run unasked
 * (a few GFLOP/s in fp32 on one core): --check runs it anyway. */
#define CLI_CHECK_MAX_FLOPS 2e10

/* ---- the CPU reference ------------------------------------------------------------------ */

static int run_cpu(const cli_args *a) {
    graph g;
    lua_api_script info;
    if (cli_load_graph(a, &g, &info))
        return 1;
    stof_error err = {0};
    ref_values rv;
    double t0 = util_now();
    int rc = ref_values_init(&g, a->seed, &rv, &err);
    if (rc == STOF_OK)
        rc = ref_execute(&g, &rv, &err);
    if (rc) {
        fprintf(stderr, "stof: %s\n", err.msg);
        ref_values_free(&rv);
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
    printf("output %s %s: %lld values\n", out->name, graph_shape_str(out, shape, sizeof shape),
           (long long)n);
    printf("checksum: sum %.9e  sum of squares %.9e\n", sum, sum_sq);
    printf("first values:");
    for (int64_t i = 0; i < n && i < 4; i++)
        printf(" %.6f", rv.data[g.output][i]);
    printf("\ntime %.2f s, peak host memory %.1f MB\n", util_now() - t0, rv.peak_bytes / 1e6);
    ref_values_free(&rv);
    graph_free(&g);
    return 0;
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
    lua_api_script info;
    exec_seq *seqs;
    int n_seqs;
    fusion_scheme *schemes;
    exec_plan *plan;
    exec_ctx *ctx;
    exec_model *model;
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
    if (r->have_graph)
        graph_free(&r->g);
}

static int fail(run_state *r, const stof_error *err) {
    fprintf(stderr, "stof: %s\n", err->msg);
    run_free(r);
    return 1;
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
    if (exec_reference(&r->g, a->seed, &r->ref, &err)) {
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

static int run_gpu(const cli_args *a) {
    run_state r;
    memset(&r, 0, sizeof r);
    if (cli_load_graph(a, &r.g, &r.info))
        return 1;
    r.have_graph = 1;
    stof_error err = {0};
    /* everything the CPU can decide, before the GPU */
    stof_dtype dtype;
    if (exec_model_dtype(&r.g, &dtype, &err) || exec_sequences(&r.g, &r.seqs, &r.n_seqs, &err))
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
    int rc = exec_ctx_create(0, &r.ctx, &err);
    if (rc == STOF_ERR_NO_DEVICE) {
        fprintf(stderr, "stof: GPU execution needs a GPU, and this machine has none usable: %s\n"
                "(the CPU reference runs with stof run --cpu SCRIPT)\n", err.msg);
        run_free(&r);
        return 1;
    }
    if (rc)
        return fail(&r, &err);
    const stof_device_info *dev = exec_ctx_device(r.ctx);
    printf("model %s (%s), %s, seed %llu\n", r.g.name, r.info.name,
           stof_dtype_name(r.plan->dtype), (unsigned long long)a->seed);
    printf("device: %s (%s, %d SMs, %.0f GiB)\n", dev->name, exec_ctx_arch(r.ctx),
           dev->sm_count, (double)dev->total_mem / (1 << 30));
    double t0 = util_now();
    if (exec_model_create(r.ctx, r.plan, a->seed, &r.model, &err))
        return fail(&r, &err);
    double setup = util_now() - t0;
    print_plan(&r);
    printf("memory: weights %.1f MB, inputs %.3f MB, activations %.2f MB peak (%d buffers; "
           "largest live set %.2f MB)\n", r.plan->weight_bytes / 1e6, r.plan->input_bytes / 1e6,
           r.plan->arena_bytes / 1e6, r.plan->n_bufs, r.plan->live_bound / 1e6);
    const graph_tensor *out = &r.g.tensors[r.g.output];
    int64_t n = graph_tensor_numel(out);
    r.eager = malloc(sizeof *r.eager * (size_t)n);
    r.replayed = malloc(sizeof *r.replayed * (size_t)n);
    if (!r.eager || !r.replayed) {
        fprintf(stderr, "stof: out of memory\n");
        run_free(&r);
        return 1;
    }
    double eager_ms, graph_ms;
    if (exec_model_run(r.model, &err) || exec_model_output(r.model, r.eager, &err) ||
        exec_model_time(r.model, 0, a->reps, &eager_ms, &err) ||
        exec_model_capture(r.model, &err) ||
        exec_model_time(r.model, 1, a->reps, &graph_ms, &err) ||
        exec_model_replay(r.model, &err) || exec_model_output(r.model, r.replayed, &err))
        return fail(&r, &err);
    double flops = total_flops(&r.g);
    printf("setup %.2f s (kernels compiled or loaded, weights uploaded)\n", setup);
    printf("latency: eager %.3f ms, CUDA graph %.3f ms (median of %d; %.1f TFLOP/s)\n",
           eager_ms, graph_ms, a->reps, graph_ms > 0 ? flops / (graph_ms * 1e-3) * 1e-12 : 0.0);
    int same = memcmp(r.eager, r.replayed, sizeof *r.eager * (size_t)n) == 0;
    double sum, sum_sq;
    ref_checksum(r.eager, n, &sum, &sum_sq);
    char shape[64];
    printf("output %s %s: %lld values; graph replay %s the eager run\n", out->name,
           graph_shape_str(out, shape, sizeof shape), (long long)n,
           same ? "matches" : "DIFFERS FROM");
    printf("checksum: sum %.9e  sum of squares %.9e\n", sum, sum_sq);
    int bad = !same;
    if (!same)
        fprintf(stderr, "stof: the CUDA graph replay gave another output than the eager run\n");
    bad |= check_reference(a, &r, n, flops);
    run_free(&r);
    return bad;
}

int cli_cmd_run(const cli_args *a) {
    return a->cpu ? run_cpu(a) : run_gpu(a);
}
