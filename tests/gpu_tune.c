/* The auto-tuner on the GPU (core/tune/tune_backend.h), on bert-small (preset
 * small, batch 2, seq 128, bigbird mask):
 *   - the backend alone: a segment's default setting is checked against the
 *     CPU reference and timed (its reference computed once for every
 *     setting of the segment); when the inputs change under a kept reference,
 *     the output no longer matches and the setting is rejected
 *     (STOF_ERR_UNSUPPORTED, counted): a wrong kernel never gets a time;
 *     gemm_ln, gemm_chain and cublaslt segments measure (a cuBLASLt ALGO
 *     past the heuristic's answers is STOF_ERR_UNSUPPORTED, not an error);
 *   - tune_gpu with a small budget: the plan's end-to-end latency (CUDA
 *     graph) beats or equals the all-unfused scheme's (within 5 % noise),
 *     its output matches the CPU reference;
 *   - the plan written and read back fits this GPU and the script, and
 *     running it reproduces the tuned latency within 15 % (or 0.02 ms) and
 *     matches the CPU reference (relative error < 1e-2);
 *   - tuning again on the same measurement cache takes every earlier
 *     measurement from it, and finds a plan at least as fast by its
 *     segments' times.
 *
 * argv[1] = budget (default 60). Exit 77 with "SKIPPED: <reason>" when
 * there is no GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "gpu_open.h"
#include "core/exec/exec.h"
#include "core/lua/lua_api.h"
#include "core/tune/tune_backend.h"
#include "core/base/util.h"
#include "search/search.h"

#define SCRIPTS STOF_SOURCE_DIR "/scripts/"
#define SEED 1
#define REPS 20
#define TOL 1e-2

static void on_progress(void *ud, const search_progress *p) {
    printf("  [%s] %ld measured, %ld cache hits, best %.4f ms\n", search_stage_name(p->stage),
           p->measured, p->cache_hits, p->best_ms);
}

/* ---- the backend alone -------------------------------------------------------------------- */

/* The search's view of graph ops first..last on template t. */
static int view_of(const graph *g, int first, int last, fusion_template_id t, fusion_match *m,
                   search_segment *v) {
    int ops[FUSION_MAX_OPS];
    for (int k = first; k <= last; k++)
        ops[k - first] = k;
    if (fusion_match_segment(g, ops, last - first + 1, m, NULL) != STOF_OK)
        return 1;
    *v = (search_segment){g, 0, 0, last - first, first, last, t, m, m->dims};
    return 0;
}

/* Graph ops first..last on template t: the first settings that the
 * template's check passes are measured until one runs (checked against the
 * CPU reference, timed). 0 when one did. */
static int measure_some(tune_backend *b, exec_ctx *ctx, const graph *g, int first, int last,
                        fusion_template_id t, const char *what) {
    fusion_match m;
    search_segment v;
    if (first < 0 || view_of(g, first, last, t, &m, &v)) {
        CHECK_MSG(0, "%s: no segment at #%d-#%d on %s", what, first, last,
                  fusion_template_get(t)->name);
        return 1;
    }
    const fusion_template *ft = fusion_template_get(t);
    int values[FUSION_MAX_PARAMS], tries = 0;
    stof_error err = {0};
    char last_err[sizeof err.msg] = "no feasible setting";
    for (long k = 0; k < fusion_template_settings(ft) && tries < 64; k++) {
        fusion_template_setting(ft, k, values);
        if (fusion_template_check(ft, &m.dims, values, exec_ctx_device(ctx)->smem_per_block_optin,
                                  NULL) != STOF_OK)
            continue;
        tries++;
        double ms = 0;
        int rc = tune_backend_measure(b, &v, values, &ms, &err);
        if (rc == STOF_OK) {
            CHECK(ms > 0 && ms < 100);
            printf("  %s #%d-#%d on %s (setting %ld): %.4f ms\n", what, first, last, ft->name,
                   k, ms);
            return 0;
        }
        CHECK_MSG(rc == STOF_ERR_UNSUPPORTED, "%s: %s", what, err.msg);
        snprintf(last_err, sizeof last_err, "%s", err.msg);
        if (rc != STOF_ERR_UNSUPPORTED)
            return 1;
    }
    CHECK_MSG(0, "%s on %s: no setting ran (%s)", what, ft->name, last_err);
    return 1;
}

/* The first op i >= from whose kinds from there on are kinds[0..n-1]. */
static int find_ops(const graph *g, int from, const op_kind *kinds, int n) {
    for (int i = from; i + n <= g->n_ops; i++) {
        int k = 0;
        while (k < n && g->ops[i + k].kind == kinds[k])
            k++;
        if (k == n)
            return i;
    }
    return -1;
}

static void test_backend(exec_ctx *ctx, graph *g) {
    tune_backend *b = NULL;
    stof_error err = {0};
    tune_backend_options bo = {.seed = SEED};
    int rc = tune_backend_create(ctx, &bo, &b, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc)
        return;
    /* the first GEMM and its bias (the QKV projection) */
    int first = -1;
    for (int i = 0; i + 1 < g->n_ops && first < 0; i++)
        if (g->ops[i].kind == OP_GEMM && g->ops[i + 1].kind == OP_BIAS)
            first = i;
    fusion_match m;
    search_segment v;
    CHECK(first >= 0 && view_of(g, first, first + 1, FUSION_T_GEMM_EPILOGUE, &m, &v) == 0);
    const fusion_template *t = fusion_template_get(FUSION_T_GEMM_EPILOGUE);
    int values[FUSION_MAX_PARAMS];
    double ms = 0, ms2 = 0;
    fusion_template_setting(t, 0, values);
    for (long s = 0; s < fusion_template_settings(t); s++) {
        fusion_template_setting(t, s, values);
        if (fusion_template_check(t, &m.dims, values, exec_ctx_device(ctx)->smem_per_block_optin,
                                  NULL) == STOF_OK)
            break;
    }
    rc = tune_backend_measure(b, &v, values, &ms, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    CHECK(ms > 0 && ms < 100);
    tune_backend_stats st = tune_backend_get_stats(b);
    CHECK_EQ_INT(st.measured, 1);
    CHECK_EQ_INT(st.references, 1);
    printf("  gemm bias #%d-#%d: %.4f ms, reference %.2f s\n", first, first + 1, ms,
           st.reference_s);
    /* another setting of the same segment: the same reference */
    int other[FUSION_MAX_PARAMS];
    for (long s = fusion_template_settings(t) - 1; s >= 0; s--) {
        fusion_template_setting(t, s, other);
        if (fusion_template_check(t, &m.dims, other, exec_ctx_device(ctx)->smem_per_block_optin,
                                  NULL) == STOF_OK)
            break;
    }
    rc = tune_backend_measure(b, &v, other, &ms2, &err);
    CHECK_MSG(rc == STOF_OK || rc == STOF_ERR_UNSUPPORTED, "%s", err.msg);
    CHECK_EQ_INT(tune_backend_get_stats(b).references, 1);

    /* the inputs change under the kept reference: the output is wrong now
     * and the setting is rejected. Measuring another segment first makes
     * the backend upload the segment's inputs again. */
    int bias = g->ops[first + 1].inputs[1];
    graph_tensor saved = g->tensors[bias];
    fusion_match m2;
    search_segment v2;
    int ln = -1;
    for (int i = first + 2; i < g->n_ops && ln < 0; i++)
        if (g->ops[i].kind == OP_LAYERNORM)
            ln = i;
    CHECK(ln > 0 && view_of(g, ln, ln, FUSION_T_MI_CHAIN, &m2, &v2) == 0);
    int mi[FUSION_MAX_PARAMS];
    fusion_template_setting(fusion_template_get(FUSION_T_MI_CHAIN), 0, mi);
    rc = tune_backend_measure(b, &v2, mi, &ms2, &err);
    CHECK_MSG(rc == STOF_OK || rc == STOF_ERR_UNSUPPORTED, "%s", err.msg);
    g->tensors[bias].init = GRAPH_INIT_UNIFORM;
    g->tensors[bias].init_scale = 50.0f;
    long rejected = tune_backend_get_stats(b).rejected;
    CHECK_EQ_INT(tune_backend_measure(b, &v, values, &ms2, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "wrong output");
    CHECK_EQ_INT(tune_backend_get_stats(b).rejected, rejected + 1);
    printf("  rejected as expected: %s\n", err.msg);
    g->tensors[bias] = saved;

    /* gemm_ln (gemm bias add layernorm), gemm_chain (the FFN) and cuBLASLt
     * (the QKV projection, whose reference is still kept) measured */
    static const op_kind ln_ops[] = {OP_GEMM, OP_BIAS, OP_ADD, OP_LAYERNORM};
    static const op_kind ffn_ops[] = {OP_GEMM, OP_BIAS, OP_GELU, OP_GEMM, OP_BIAS};
    int at = find_ops(g, first, ln_ops, 4);
    measure_some(b, ctx, g, at, at + 3, FUSION_T_GEMM_LN, "gemm bias add layernorm");
    at = find_ops(g, first, ffn_ops, 5);
    measure_some(b, ctx, g, at, at + 4, FUSION_T_GEMM_CHAIN, "gemm bias gelu gemm bias");
    measure_some(b, ctx, g, first, first + 1, FUSION_T_CUBLASLT, "gemm bias");
    /* an ALGO past what the heuristic offered is infeasible, never an error */
    fusion_match m3;
    search_segment v3;
    if (view_of(g, first, first + 1, FUSION_T_CUBLASLT, &m3, &v3) == 0) {
        int algo[FUSION_MAX_PARAMS] = {3};
        rc = tune_backend_measure(b, &v3, algo, &ms2, &err);
        CHECK_MSG(rc == STOF_OK || rc == STOF_ERR_UNSUPPORTED, "cublaslt ALGO 3: %s", err.msg);
        printf("  cublaslt ALGO 3: %s\n", rc ? err.msg : "ran");
    }
    tune_backend_free(b);
}

/* ---- tuning -------------------------------------------------------------------------------- */

static void check_against_reference(const graph *g, const float *y, const char *what) {
    float *ref = NULL;
    stof_error err = {0};
    weights_source seeded = weights_source_seeded(SEED);
    int rc = exec_reference(g, &seeded, &ref, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc)
        return;
    exec_diff d;
    exec_compare(y, ref, graph_tensor_numel(&g->tensors[g->output]), &d);
    printf("  %s: relative error %.3e against the CPU reference\n", what, d.rel_error);
    CHECK_MSG(d.n_nonfinite == 0 && d.rel_error < TOL, "%s: relative error %.3e", what,
              d.rel_error);
    free(ref);
}

/* A plan kept as the executor's default holds its schemes (tune_default_result's). */
static void check_default_kept(const graph *g, const plan *p) {
    search_sequence *seqs = NULL;
    int n_seqs = 0;
    stof_error err = {0};
    mha_device_limits lim;
    search_result r;
    memset(&r, 0, sizeof r);
    int rc = search_sequences_from_graph(g, &seqs, &n_seqs, &err);
    if (!rc)
        rc = mha_limits_for_arch(p->device.arch, &lim, &err);
    if (!rc)
        rc = tune_default_result(g, seqs, n_seqs, &lim, &r, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    CHECK(rc || p->n_sequences == n_seqs);
    for (int q = 0; !rc && q < n_seqs && q < p->n_sequences; q++)
        CHECK_MSG(fusion_scheme_equal(&p->sequences[q].scheme, &r.seqs[q].scheme) &&
                      p->sequences[q].n_segments == r.seqs[q].n_segs,
                  "sequence %d: the plan kept is not the default's scheme", q);
    search_result_free(&r);
    search_sequences_free(seqs, n_seqs);
}

static void test_tune(exec_ctx *ctx, const graph *g, const graph_script *script, long budget) {
    char cache_path[] = "/tmp/stof-gpu-tune-XXXXXX";
    int fd = mkstemp(cache_path);
    CHECK(fd >= 0);
    if (fd >= 0)
        close(fd);
    tune_options o = {.budget = budget, .time_limit_s = 240, .seed = SEED,
                      .cache_path = cache_path, .reps = REPS, .check = 1,
                      .progress = on_progress};
    plan p;
    tune_outcome res;
    stof_error err = {0};
    double t0 = util_now();
    int rc = tune_gpu(ctx, g, script, &o, &p, &res, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc) {
        unlink(cache_path);
        return;
    }
    printf("  tuned in %.1f s: %ld measured (%ld timed, %ld rejected, %ld could not run), %ld "
           "after the search (%d improved)\n", util_now() - t0, res.search.measured,
           res.backend.measured, res.backend.rejected, res.backend.failed, res.extra_measured,
           res.improved);
    printf("  segments %.4f ms; end to end: graph %.4f ms, eager %.4f ms; all-unfused %.4f ms\n",
           res.segments_ms, res.graph_ms, res.eager_ms, res.unfused_ms);
    const tune_timing *tm = &res.timing;
    printf("  kernels: %ld compiled (%.1f s summed over %d threads), %ld from disk; %ld made "
           "ahead, %ld used; %.1f s not hidden; %ld settings announced in %ld batches\n",
           tm->compiled, tm->compile_sum_s, tm->threads, tm->from_disk, tm->ahead,
           tm->ahead_used, tm->compile_wait_s, res.backend.prepared, res.search.prepare_calls);
    CHECK(res.search.measured > 0 && res.search.measured <= budget);
    /* the search announced what it measured; kernels were made ahead and used */
    CHECK(res.search.prepare_calls > 0 && res.backend.prepared >= res.search.measured);
    CHECK(tm->threads >= 1 && tm->ahead_used <= tm->ahead);
    CHECK(tm->compiled + tm->from_disk == 0 || tm->ahead_used > 0);
    CHECK(res.backend.measure_s > 0 && res.backend.time_s > 0 &&
          res.backend.time_s <= res.backend.measure_s);
    CHECK(p.device.measured && p.latency_ms > 0 && p.has_end_to_end);
    CHECK(res.checked && res.check_ok && res.diff.rel_error < TOL);
    CHECK_MSG(res.graph_ms <= res.unfused_ms * 1.05, "tuned %.4f ms, all-unfused %.4f ms",
              res.graph_ms, res.unfused_ms);
    /* the executor's default plan timed too, and the faster of it and the search's kept */
    printf("  the search's plan %.4f ms, the executor's default %.4f ms%s%s\n",
           res.search_graph_ms, res.default_ms, res.kept_default ? ": the default kept" : "",
           res.default_skipped);
    CHECK_MSG(res.default_ms > 0 || res.default_skipped[0], "the default plan neither timed "
              "nor said why not");
    CHECK(res.graph_ms == (res.kept_default ? res.default_ms : res.search_graph_ms));
    CHECK(res.default_ms == 0 || 0.99 * res.graph_ms <= res.default_ms);
    CHECK(p.end_to_end.graph_ms == res.graph_ms && p.latency_ms == res.segments_ms);
    if (res.kept_default)
        check_default_kept(g, &p);

    /* written, read back, run again */
    char plan_path[] = "/tmp/stof-gpu-plan-XXXXXX";
    fd = mkstemp(plan_path);
    if (fd >= 0)
        close(fd);
    plan back;
    CHECK_EQ_INT(plan_write(&p, plan_path, &err), STOF_OK);
    rc = plan_read(plan_path, &back, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    unlink(plan_path);
    if (!rc) {
        rc = plan_check_fits(&back, exec_ctx_device(ctx), script, g, &err);
        CHECK_MSG(rc == STOF_OK, "%s", err.msg);
        exec_plan *xp = NULL;
        rc = exec_plan_from_plan(&back, g, &xp, &err);
        CHECK_MSG(rc == STOF_OK, "%s", err.msg);
        int64_t n = graph_tensor_numel(&g->tensors[g->output]);
        float *y = malloc(sizeof *y * (size_t)n);
        double eager = 0, graph_ms = 0;
        if (!rc) {
            rc = exec_model_measure(ctx, xp, SEED, REPS, &eager, &graph_ms, y, &err);
            CHECK_MSG(rc == STOF_OK, "%s", err.msg);
        }
        if (!rc) {
            double recorded = back.end_to_end.graph_ms;
            printf("  plan read back: graph %.4f ms (recorded %.4f ms), eager %.4f ms\n",
                   graph_ms, recorded, eager);
            CHECK_MSG(fabs(graph_ms - recorded) <= fmax(0.15 * recorded, 0.02),
                      "replayed %.4f ms, recorded %.4f ms", graph_ms, recorded);
            check_against_reference(g, y, "plan read back");
        }
        free(y);
        exec_plan_free(xp);
        plan_free(&back);
    }

    /* the same tuning again: what the first one measured comes from the
     * cache file (the budget then goes to settings it did not reach) */
    plan again;
    tune_outcome res2;
    rc = tune_gpu(ctx, g, script, &o, &again, &res2, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (!rc) {
        printf("  again on the cache: %ld measured, %ld cache hits, %ld after the search\n",
               res2.search.measured, res2.search.cache_hits, res2.extra_measured);
        CHECK(res2.search.cache_hits >= res.search.measured);
        CHECK(again.latency_ms <= p.latency_ms * 1.05);
        plan_free(&again);
    }
    plan_free(&p);
    unlink(cache_path);
}

int main(int argc, char **argv) {
    long budget = argc > 1 ? strtol(argv[1], NULL, 10) : 60;
    exec_ctx *ctx = NULL;
    GPU_TEST_OPEN(exec_ctx_create, ctx, "gpu_tune");
    stof_error err = {0};
    int rc;
    static const char *const params[] = {"preset=small", "batch=2", "seq=128", "mask=bigbird"};
    graph g;
    graph_script script;
    graph_init(&g);
    rc = lua_api_build(SCRIPTS "bert.lua", params, 4, &g, &script, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (!rc) {
        printf("bert-small b2 s128 bigbird on %s, budget %ld\n", exec_ctx_device(ctx)->name,
               budget);
        test_backend(ctx, &g);
        test_tune(ctx, &g, &script, budget > 0 ? budget : 60);
        graph_free(&g);
    }
    exec_ctx_free(ctx);
    return check_summary("gpu_tune");
}
