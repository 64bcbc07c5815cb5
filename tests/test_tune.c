/* The auto-tuner without a GPU (core/tune/tune_backend.h):
 *   - the check a candidate passes before its time counts: a wrong output,
 *     NaN or infinity is STOF_ERR_UNSUPPORTED (the search caches it as
 *     infeasible), within the fp16 / bf16 tolerance it passes;
 *   - the CPU reference of a lone segment: a big GEMM segment on a subset
 *     of rows, equal to the same sums done by hand; attention whole; the
 *     pre-norm values of a GPT-2 residual segment; the row check finds a
 *     wrong or NaN checked row;
 *   - the offline tune (stof tune without a GPU, as a function): a plan
 *     marked unmeasured that reads back, fits a compute capability 9.0
 *     device (not an 8.0 one), turns into an executor plan with its
 *     choices, and whose kernels are in the NVRTC cache afterwards: a second
 *     offline tune compiles nothing;
 *   - the starting schemes run on implemented templates for every script;
 *   - the kernel builds a setting's plan needs, known without the GPU (what
 *     the tuner compiles ahead): a setting the plan refuses builds nothing,
 *     block-wise attention builds its split kernel exactly when the plan's
 *     own rule (mha_exec_split_chunk, mha_exec_split_build) cuts rows;
 *   - a plan's end-to-end times and script path round-trip through JSON. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/base/error.h"
#include "core/exec/exec.h"
#include "core/gen/gen.h"
#include "core/lua/lua_api.h"
#include "core/tune/tune_backend.h"
#include "ops/ops.h"
#include "search/search.h"

#define SCRIPTS STOF_SOURCE_DIR "/scripts/"

typedef struct model {
    graph g;
    graph_script script;
} model;

static int model_load(model *m, const char *script, const char *const *params, int n) {
    stof_error err = {0};
    graph_init(&m->g);
    int rc = lua_api_build(script, params, n, &m->g, &m->script, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", script, err.msg);
    return rc;
}

static void model_free(model *m) {
    graph_free(&m->g);
}

/* The first op of `kind` at or after op `from`. */
static int find_op(const graph *g, op_kind kind, int from) {
    for (int i = from; i < g->n_ops; i++)
        if (g->ops[i].kind == kind)
            return i;
    return -1;
}

/* ==== the output check ========================================================================= */

static void test_check_output(void) {
    enum { N = 1000 };
    static float ref[N], got[N];
    for (int i = 0; i < N; i++)
        ref[i] = got[i] = sinf(0.1f * (float)i) + 0.5f;
    stof_error err = {0};
    exec_diff d;
    CHECK_EQ_INT(tune_check_output(got, ref, N, STOF_F16, &d, &err), STOF_OK);
    CHECK(d.rel_error == 0 && d.n_nonfinite == 0);

    /* fp16-sized noise passes, a wrong value fails */
    for (int i = 0; i < N; i++)
        got[i] = ref[i] * (1.0f + ((i % 2) ? 2e-3f : -2e-3f));
    CHECK_EQ_INT(tune_check_output(got, ref, N, STOF_F16, NULL, &err), STOF_OK);
    for (int i = 0; i < N; i++)
        got[i] = ref[i] * 1.1f;
    CHECK_EQ_INT(tune_check_output(got, ref, N, STOF_F16, &d, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "wrong output: relative error");
    CHECK(d.rel_error > 0.05);

    /* 1.5 % is wrong for fp16 but within bf16's tolerance */
    for (int i = 0; i < N; i++)
        got[i] = ref[i] * 1.015f;
    CHECK_EQ_INT(tune_check_output(got, ref, N, STOF_F16, NULL, &err), STOF_ERR_UNSUPPORTED);
    CHECK_EQ_INT(tune_check_output(got, ref, N, STOF_BF16, NULL, &err), STOF_OK);
    CHECK(tune_tolerance(STOF_F16) == TUNE_TOL_F16 && tune_tolerance(STOF_BF16) == TUNE_TOL_BF16);

    /* one NaN among correct values, one infinity */
    memcpy(got, ref, sizeof got);
    got[N / 2] = NAN;
    CHECK_EQ_INT(tune_check_output(got, ref, N, STOF_F16, &d, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "NaN");
    CHECK_EQ_INT(d.n_nonfinite, 1);
    got[N / 2] = INFINITY;
    CHECK_EQ_INT(tune_check_output(got, ref, N, STOF_BF16, NULL, &err), STOF_ERR_UNSUPPORTED);

    /* all zeros where the reference is not: a kernel that wrote nothing */
    memset(got, 0, sizeof got);
    CHECK_EQ_INT(tune_check_output(got, ref, N, STOF_F16, NULL, &err), STOF_ERR_UNSUPPORTED);
}

/* ==== segment references ======================================================================== */

static float *values_of(const graph *g, int t, uint64_t seed) {
    float *v = malloc(sizeof *v * (size_t)graph_tensor_numel(&g->tensors[t]));
    tune_tensor_values(&g->tensors[t], seed, v);
    return v;
}

/* BERT's FFN up-projection (gemm bias gelu) at 512 tokens: the reference
 * holds TUNE_CHECK_ROWS rows spread over all of them, each the sums done
 * here by hand. */
static void test_reference_rows(void) {
    static const char *const params[] = {"preset=small", "batch=4", "seq=128"};
    model m;
    if (model_load(&m, SCRIPTS "bert.lua", params, 3))
        return;
    const graph *g = &m.g;
    int gelu = find_op(g, OP_GELU, 0), first = gelu - 2;
    CHECK(first >= 0 && g->ops[first].kind == OP_GEMM && g->ops[first + 1].kind == OP_BIAS);
    const uint64_t seed = 7;
    tune_reference ref;
    stof_error err = {0};
    int rc = tune_reference_compute(g, first, gelu, 0, seed, &ref, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc) {
        model_free(&m);
        return;
    }
    const graph_op *gemm = &g->ops[first];
    const graph_tensor *y = &g->tensors[g->ops[gelu].output];
    int64_t rows = graph_tensor_numel(y) / y->shape[y->ndim - 1];
    int64_t n = y->shape[y->ndim - 1];
    int64_t k = g->tensors[gemm->inputs[0]].shape[g->tensors[gemm->inputs[0]].ndim - 1];
    CHECK_EQ_INT(rows, 512);
    CHECK_EQ_INT(ref.n_rows, TUNE_CHECK_ROWS);
    CHECK_EQ_INT(ref.row_len, n);
    CHECK(ref.rows && ref.rows[0] == 0 && ref.rows[ref.n_rows - 1] == rows - 1);
    int sorted = 1;
    for (int64_t i = 1; ref.rows && i < ref.n_rows; i++)
        sorted &= ref.rows[i] > ref.rows[i - 1];
    CHECK(sorted);
    CHECK(ref.pre_norm == NULL);

    float *x = values_of(g, gemm->inputs[0], seed), *w = values_of(g, gemm->inputs[1], seed);
    float *b = values_of(g, g->ops[first + 1].inputs[1], seed);
    int weight_kn = gemm->attr.gemm.weight_kn;
    double worst = 0;
    for (int64_t i = 0; i < ref.n_rows; i += 37)
        for (int64_t j = 0; j < n; j += 13) {
            double acc = 0;
            for (int64_t q = 0; q < k; q++)
                acc += (double)x[ref.rows[i] * k + q] * (weight_kn ? w[q * n + j] : w[j * k + q]);
            float pre = (float)acc + b[j];
            float want = g->ops[gelu].attr.gelu.tanh ? op_gelu_tanh(pre) : op_gelu_erf(pre);
            double e = fabs(want - ref.out[i * n + j]);
            worst = e > worst ? e : worst;
        }
    CHECK_MSG(worst < 1e-3, "hand-made sums differ by %g", worst);

    /* the row check: the GPU's whole output with the checked rows right
     * passes; one checked row wrong, or a NaN in it, fails */
    float *full = malloc(sizeof *full * (size_t)(rows * n));
    for (int64_t i = 0; i < rows * n; i++)
        full[i] = 1e6f; /* rows that are not checked */
    for (int64_t i = 0; i < ref.n_rows; i++)
        memcpy(full + ref.rows[i] * n, ref.out + i * n, sizeof *full * (size_t)n);
    CHECK_EQ_INT(tune_reference_check(&ref, full, 0, STOF_F16, NULL, &err), STOF_OK);
    int64_t r = ref.rows[ref.n_rows / 2];
    for (int64_t j = 0; j < n; j++)
        full[r * n + j] = -full[r * n + j] * 3.0f;
    CHECK_EQ_INT(tune_reference_check(&ref, full, 0, STOF_F16, NULL, &err),
                 STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "wrong output");
    for (int64_t j = 0; j < n; j++)
        full[r * n + j] = ref.out[(ref.n_rows / 2) * n + j];
    full[r * n + 3] = NAN;
    CHECK_EQ_INT(tune_reference_check(&ref, full, 0, STOF_F16, NULL, &err),
                 STOF_ERR_UNSUPPORTED);
    CHECK_EQ_INT(tune_reference_check(&ref, full, 1, STOF_F16, NULL, &err), STOF_ERR_INVALID);
    free(full);
    free(x);
    free(w);
    free(b);
    tune_reference_free(&ref);

    /* attention is not row-wise: the whole output */
    int att = find_op(g, OP_ATTENTION, 0);
    rc = tune_reference_compute(g, att, att, 0, seed, &ref, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    const graph_tensor *ay = &g->tensors[g->ops[att].output];
    CHECK(ref.rows == NULL && ref.n_rows * ref.row_len == graph_tensor_numel(ay));
    int finite = 1;
    for (int64_t i = 0; ref.out && i < ref.n_rows * ref.row_len; i++)
        finite &= isfinite(ref.out[i]) != 0;
    CHECK(finite);
    tune_reference_free(&ref);

    /* not a segment */
    CHECK_EQ_INT(tune_reference_compute(g, 3, 2, 0, seed, &ref, &err), STOF_ERR_INVALID);
    model_free(&m);
}

/* The checked rows: increasing, the first and the last, and at every
 * position of a 128-row tile somewhere (not only each window's first). */
static void test_check_rows(void) {
    enum { M = 32768, N = TUNE_CHECK_ROWS };
    int64_t rows[N];
    tune_check_rows(M, N, rows);
    CHECK(rows[0] == 0 && rows[N - 1] == M - 1);
    int increasing = 1, seen[128] = {0}, positions = 0;
    for (int i = 1; i < N; i++)
        increasing &= rows[i] > rows[i - 1] && rows[i] < M;
    CHECK(increasing);
    for (int i = 0; i < N; i++)
        seen[rows[i] % 128] = 1;
    for (int p = 0; p < 128; p++)
        positions += seen[p];
    CHECK_MSG(positions == 128, "%d of 128 positions in a tile checked", positions);
    /* as many rows as there are: all of them */
    int64_t all[5];
    tune_check_rows(5, 5, all);
    for (int i = 0; i < 5; i++)
        CHECK_EQ_INT(all[i], i);
}

/* Attention over more query rows than TUNE_ATTENTION_CHECK_ROWS: the
 * reference holds that many of them (every key each), the same values as
 * the op's whole reference has in those rows. */
static void test_reference_attention_rows(void) {
    static const char *const params[] = {"preset=small", "batch=5", "seq=256", "layers=1"};
    model m;
    if (model_load(&m, SCRIPTS "bert.lua", params, 4))
        return;
    const graph *g = &m.g;
    const int att = find_op(g, OP_ATTENTION, 0);
    const graph_op *op = &g->ops[att];
    const graph_tensor *y = &g->tensors[op->output];
    const int64_t row_len = y->shape[y->ndim - 1], rows = graph_tensor_numel(y) / row_len;
    CHECK(rows > TUNE_ATTENTION_CHECK_ROWS);
    const uint64_t seed = 11;
    tune_reference ref;
    stof_error err = {0};
    int rc = tune_reference_compute(g, att, att, 0, seed, &ref, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc) {
        model_free(&m);
        return;
    }
    CHECK_EQ_INT(ref.n_rows, TUNE_ATTENTION_CHECK_ROWS);
    CHECK_EQ_INT(ref.row_len, row_len);
    CHECK(ref.rows && ref.rows[0] == 0 && ref.rows[ref.n_rows - 1] == rows - 1);

    float *in[GRAPH_MAX_INPUTS] = {0};
    for (int i = 0; i < op->n_inputs; i++)
        in[i] = values_of(g, op->inputs[i], seed);
    float *whole = malloc(sizeof *whole * (size_t)(rows * row_len));
    rc = op_describe(OP_ATTENTION)->ref(g, op, (const float *const *)in, whole, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    int64_t differ = 0;
    for (int64_t i = 0; !rc && ref.rows && i < ref.n_rows; i++)
        for (int64_t j = 0; j < row_len; j++)
            differ += ref.out[i * row_len + j] != whole[ref.rows[i] * row_len + j];
    CHECK_MSG(differ == 0, "%lld values differ from the whole reference", (long long)differ);
    /* the check takes the picked rows of a whole output */
    exec_diff d;
    CHECK_EQ_INT(tune_reference_check(&ref, whole, 0, STOF_F16, &d, &err), STOF_OK);
    CHECK(d.rel_error == 0);
    whole[ref.rows[ref.n_rows / 2] * row_len + 3] += 100.0f;
    CHECK_EQ_INT(tune_reference_check(&ref, whole, 0, STOF_F16, &d, &err), STOF_ERR_UNSUPPORTED);
    free(whole);
    for (int i = 0; i < op->n_inputs; i++)
        free(in[i]);
    tune_reference_free(&ref);
    model_free(&m);
}

/* GPT-2's residual stream: add then layernorm, the add's result written
 * too. The reference has both, the pre-norm values being the sum. */
static void test_reference_pre_norm(void) {
    static const char *const params[] = {"layers=2", "batch=1", "seq=32"};
    model m;
    if (model_load(&m, SCRIPTS "gpt2.lua", params, 3))
        return;
    const graph *g = &m.g;
    int found = -1;
    for (int i = 1; i < g->n_ops && found < 0; i++) {
        if (g->ops[i].kind != OP_LAYERNORM || g->ops[i - 1].kind != OP_ADD)
            continue;
        int ops[2] = {i - 1, i};
        fusion_match fm;
        if (fusion_match_segment(g, ops, 2, &fm, NULL) == STOF_OK && fm.store_pre_norm)
            found = i - 1;
    }
    CHECK(found >= 0);
    if (found < 0) {
        model_free(&m);
        return;
    }
    tune_reference ref;
    stof_error err = {0};
    int rc = tune_reference_compute(g, found, found + 1, 1, 3, &ref, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    CHECK(ref.pre_norm != NULL && ref.out != NULL);
    const graph_op *add = &g->ops[found];
    float *a = values_of(g, add->inputs[0], 3), *b = values_of(g, add->inputs[1], 3);
    double worst = 0;
    for (int64_t i = 0; ref.pre_norm && i < ref.n_rows * ref.row_len; i++)
        worst = fmax(worst, fabs(ref.pre_norm[i] - (a[i] + b[i])));
    CHECK_MSG(worst < 1e-6, "pre-norm values differ from the sum by %g", worst);
    free(a);
    free(b);
    tune_reference_free(&ref);
    model_free(&m);
}

/* ==== starting schemes ============================================================================ */

static void expect_initial_runs(const char *script, const char *const *params, int n) {
    model m;
    if (model_load(&m, script, params, n))
        return;
    search_sequence *seqs = NULL;
    int n_seqs = 0;
    stof_error err = {0};
    CHECK_EQ_INT(search_sequences_from_graph(&m.g, &seqs, &n_seqs, &err), STOF_OK);
    fusion_scheme *s = calloc((size_t)n_seqs, sizeof *s);
    int rc = tune_initial_schemes(&m.g, seqs, n_seqs, SEARCH_DEFAULT_SMEM, s, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", script, err.msg);
    for (int q = 0; !rc && q < n_seqs; q++) {
        exec_seq es = {seqs[q].layer, seqs[q].firsts[0], seqs[q].n, 0};
        rc = exec_scheme_check(&m.g, &es, &s[q], &err);
        CHECK_MSG(rc == STOF_OK, "%s sequence %d: %s", script, q, err.msg);
    }
    free(s);
    search_sequences_free(seqs, n_seqs);
    model_free(&m);
}

static void test_initial_schemes(void) {
    static const char *const bert[] = {"preset=small", "batch=1", "seq=64"};
    static const char *const gpt2[] = {"layers=2", "batch=1", "seq=32"};
    static const char *const t5[] = {"layers=1", "batch=1", "seq=32"};
    expect_initial_runs(SCRIPTS "bert.lua", bert, 3);
    expect_initial_runs(SCRIPTS "gpt2.lua", gpt2, 3);
    expect_initial_runs(SCRIPTS "t5.lua", t5, 3);
}

/* ==== offline tuning ================================================================================ */

static int count_cubins(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) != NULL;)
        n += strstr(e->d_name, ".cubin") != NULL;
    if (d)
        closedir(d);
    return n;
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    char path[1200];
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

static stof_device_info device_of(int major, int minor) {
    stof_device_info d;
    memset(&d, 0, sizeof d);
    snprintf(d.name, sizeof d.name, "NVIDIA H100 80GB HBM3");
    d.cc_major = major;
    d.cc_minor = minor;
    d.sm_count = 132;
    return d;
}

/* The executor plan of p has p's schemes and, segment by segment, its
 * templates and values. */
static void check_exec_plan(const plan *p, const graph *g) {
    exec_plan *xp = NULL;
    stof_error err = {0};
    int rc = exec_plan_from_plan(p, g, &xp, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc)
        return;
    int checked = 0;
    for (int q = 0; q < p->n_sequences; q++) {
        const plan_sequence *ps = &p->sequences[q];
        for (int s = 0; s < xp->n_segs; s++) {
            const exec_segment *sg = &xp->segs[s];
            if (xp->seqs[sg->seq].first != ps->instances[0])
                continue;
            CHECK(fusion_scheme_same_segments(&xp->schemes[sg->seq], &ps->scheme));
            const plan_segment *want = &ps->segments[sg->index];
            CHECK_EQ_INT(sg->tmpl, want->kernel.tmpl);
            CHECK(sg->has_values && !sg->auto_attention);
            CHECK(memcmp(sg->values, want->kernel.values,
                         sizeof *sg->values * (size_t)want->kernel.n_values) == 0);
            CHECK_EQ_INT(sg->first, ps->instances[0] + want->first);
            checked++;
        }
    }
    CHECK(checked > 0);
    exec_plan_free(xp);
}

static void test_offline(void) {
    static const char *const params[] = {"preset=small", "batch=1", "seq=64"};
    model m;
    if (model_load(&m, SCRIPTS "bert.lua", params, 3))
        return;
    char dir[] = "/tmp/stof-test-tune-XXXXXX", path[512];
    CHECK(mkdtemp(dir) != NULL);
    plan p, back;
    tune_offline_stats st;
    stof_error err = {0};
    int rc = tune_offline(&m.g, &m.script, "sm_90", dir, &p, &st, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc) {
        remove_dir(dir);
        model_free(&m);
        return;
    }
    CHECK(st.kernels > 0 && st.compiled > 0);
    CHECK_EQ_INT(st.kernels, st.compiled + st.disk_hits + st.memory_hits);
    CHECK_EQ_INT(count_cubins(dir), st.compiled);
    CHECK(!p.device.measured && strcmp(p.device.arch, "sm_90") == 0);
    CHECK(strcmp(p.device.name, PLAN_UNMEASURED) == 0);
    CHECK(p.latency_ms == 0 && !p.has_end_to_end && p.stats.settings_measured == 0);
    CHECK(strcmp(p.script_name, "bert.lua") == 0 && p.script_path[0] == '/');
    CHECK(p.n_sequences >= 2);

    snprintf(path, sizeof path, "%s/plan.json", dir);
    CHECK_EQ_INT(plan_write(&p, path, &err), STOF_OK);
    rc = plan_read(path, &back, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (!rc) {
        CHECK(!back.device.measured && strcmp(back.device.arch, "sm_90") == 0);
        CHECK(strcmp(back.script_path, p.script_path) == 0);
        CHECK_EQ_INT(back.n_sequences, p.n_sequences);
        stof_device_info h100 = device_of(9, 0), a100 = device_of(8, 0);
        rc = plan_check_fits(&back, &h100, &m.script, &m.g, &err);
        CHECK_MSG(rc == STOF_OK, "%s", err.msg);
        CHECK_EQ_INT(plan_check_fits(&back, &a100, NULL, NULL, &err), STOF_ERR_MISMATCH);
        CHECK_CONTAINS(err.msg, "made offline for sm_90");
        check_exec_plan(&back, &m.g);
        plan_free(&back);
    }
    unlink(path);

    /* the kernels are in the cache: a second offline tune compiles nothing */
    plan again;
    tune_offline_stats st2;
    rc = tune_offline(&m.g, &m.script, "sm_90", dir, &again, &st2, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    CHECK_EQ_INT(st2.compiled, 0);
    CHECK_EQ_INT(st2.kernels, st.kernels);
    CHECK_EQ_INT(st2.disk_hits, st.compiled);
    if (!rc)
        plan_free(&again);

    /* an architecture the planner does not know */
    rc = tune_offline(&m.g, &m.script, "sm_12", dir, &again, &st2, &err);
    CHECK_EQ_INT(rc, STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "sm_12");
    plan_free(&p);
    remove_dir(dir);
    model_free(&m);
}

/* fp32 models cannot be planned for the GPU kernels. */
static void test_offline_fp32(void) {
    static const char *const params[] = {"layers=1", "batch=1", "seq=32", "dtype=fp32"};
    model m;
    if (model_load(&m, SCRIPTS "gpt2.lua", params, 4))
        return;
    plan p;
    tune_offline_stats st;
    stof_error err = {0};
    CHECK_EQ_INT(tune_offline(&m.g, &m.script, "sm_90", "", &p, &st, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "f16 or bf16");
    model_free(&m);
}

/* ==== plan additions round-trip ===================================================================== */

/* The executor's default plan as a search result (what a tuned plan is timed against end to
 * end): each sequence's default scheme, each segment's template and default setting, times 0;
 * its plan runs exactly that, the segments of exec_plan_default. Returns the segments that run
 * on gemv with a norm ahead (a decode step's joins). */
static int expect_default_result(const graph *g, const graph_script *script, const char *what) {
    search_sequence *seqs = NULL;
    int n_seqs = 0, joined = 0;
    stof_error err = {0};
    mha_device_limits lim;
    search_result r;
    memset(&r, 0, sizeof r);
    exec_plan *dflt = NULL;
    int rc = search_sequences_from_graph(g, &seqs, &n_seqs, &err);
    if (!rc)
        rc = mha_limits_for_arch("sm_90", &lim, &err);
    if (!rc)
        rc = tune_default_result(g, seqs, n_seqs, &lim, &r, &err);
    if (!rc)
        rc = exec_plan_default(g, &dflt, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", what, err.msg);
    for (int q = 0; !rc && q < n_seqs; q++) {
        for (int k = 0; k < r.seqs[q].n_segs; k++) {
            const search_seg_result *sg = &r.seqs[q].segs[k];
            exec_segment s;
            exec_choice c;
            int got = 0;
            CHECK_EQ_INT(exec_segment_at(g, seqs[q].firsts[0] + sg->first,
                                         sg->last - sg->first + 1, &s, &err), STOF_OK);
            CHECK_EQ_INT(exec_segment_template(g, s.first, s.n, &s.match, &s.tmpl, &err),
                         STOF_OK);
            s.auto_attention =
                s.tmpl == FUSION_T_ATTENTION_ROW || s.tmpl == FUSION_T_ATTENTION_BLOCK;
            CHECK_EQ_INT(exec_segment_candidates(g, &s, &lim, 0, &c, 1, &got, &err), STOF_OK);
            CHECK(got == 1 && sg->tmpl == c.tmpl && sg->ms == 0.0 &&
                  sg->n_values == fusion_template_get(c.tmpl)->n_params &&
                  memcmp(sg->values, c.values, sizeof *c.values * (size_t)sg->n_values) == 0);
            joined += sg->tmpl == FUSION_T_GEMV && (g->ops[s.first].kind == OP_LAYERNORM ||
                                                    g->ops[s.first].kind == OP_RMSNORM);
        }
    }
    stof_device_info dev = device_of(9, 0);
    plan p;
    if (!rc && (rc = plan_from_search(&r, g, seqs, script, &dev, NULL, &p, &err)) == STOF_OK) {
        check_exec_plan(&p, g);
        exec_plan *xp = NULL;
        CHECK_EQ_INT(exec_plan_from_plan(&p, g, &xp, &err), STOF_OK);
        CHECK(xp && xp->n_segs == dflt->n_segs);
        for (int i = 0; xp && i < xp->n_segs && i < dflt->n_segs; i++)
            CHECK_MSG(xp->segs[i].first == dflt->segs[i].first &&
                          xp->segs[i].n == dflt->segs[i].n &&
                          (dflt->segs[i].auto_attention || xp->segs[i].tmpl == dflt->segs[i].tmpl),
                      "%s: segment %d: ops #%d+%d on %d, the default's #%d+%d on %d", what, i,
                      xp->segs[i].first, xp->segs[i].n, (int)xp->segs[i].tmpl,
                      dflt->segs[i].first, dflt->segs[i].n, (int)dflt->segs[i].tmpl);
        exec_plan_free(xp);
        plan_free(&p);
    }
    CHECK_MSG(rc == STOF_OK, "%s: %s", what, err.msg);
    exec_plan_free(dflt);
    search_result_free(&r);
    search_sequences_free(seqs, n_seqs);
    return joined;
}

/* A GEMM, bias and GELU outside the layers at 32 rows: the executor runs them unfused there
 * (its greedy rule would join them), and so does the default result. */
static void default_result_outside_layers(void) {
    static const char text[] =
        "local m = stof.model{name = \"outside\", dtype = \"fp16\"}\n"
        "local ids = m:input(\"input_ids\", {2, 16}, {dtype = \"int32\", high = 100})\n"
        "local x = m:embedding(ids, m:weight(\"wte\", {100, 64}))\n"
        "m:layer(function()\n"
        "  x = m:add(x, m:linear(x, m:weight(\"w0\", {64, 64}), m:weight(\"b0\", {64})))\n"
        "end)\n"
        "m:output(m:gelu(m:linear(x, m:weight(\"w1\", {64, 64}), m:weight(\"b1\", {64}))))\n"
        "return m\n";
    char path[] = "/tmp/stof-test-outside-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    CHECK(write(fd, text, sizeof text - 1) == (ssize_t)(sizeof text - 1));
    close(fd);
    model m;
    if (!model_load(&m, path, NULL, 0)) {
        expect_default_result(&m.g, &m.script, "a chain outside the layers");
        model_free(&m);
    }
    unlink(path);
}

static void test_default_result(void) {
    static const char *const bert[] = {"preset=small", "batch=1", "seq=64"};
    static const char *const gpt2[] = {"layers=2", "batch=1", "seq=32", "head=true"};
    model m;
    if (!model_load(&m, SCRIPTS "bert.lua", bert, 3)) {
        expect_default_result(&m.g, &m.script, "bert");
        model_free(&m);
    }
    if (model_load(&m, SCRIPTS "gpt2.lua", gpt2, 4))
        return;
    graph step;
    gen_decoder dec;
    memset(&dec, 0, sizeof dec);
    graph_init(&step);
    stof_error err = {0};
    int rc = lua_api_rebuild_at(&m.script, 1, 32, &step, &err);
    if (!rc)
        rc = gen_decoder_build(&step, &dec, &err);
    CHECK_MSG(rc == STOF_OK, "gpt2's decode step: %s", err.msg);
    default_result_outside_layers();
    /* a step of one row: the norms join gemv, two in the layers' class and the final norm
     * the head's */
    if (!rc)
        CHECK_EQ_INT(expect_default_result(&dec.g, &m.script, "gpt2's decode step"), 3);
    gen_decoder_free(&dec);
    graph_free(&step);
    model_free(&m);
}

static void test_plan_end_to_end(void) {
    static const char *const params[] = {"preset=small", "batch=1", "seq=64"};
    model m;
    if (model_load(&m, SCRIPTS "bert.lua", params, 3))
        return;
    plan p, back;
    tune_offline_stats st;
    stof_error err = {0};
    int rc = tune_offline(&m.g, &m.script, "sm_90", NULL, &p, &st, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc) {
        model_free(&m);
        return;
    }
    p.has_end_to_end = 1;
    p.end_to_end = (plan_end_to_end){1.25, 1.5, 2.0 / 3.0};
    char *text = NULL;
    CHECK_EQ_INT(plan_to_json(&p, &text, &err), STOF_OK);
    CHECK(text && strstr(text, "\"end_to_end\"") && strstr(text, "\"path\""));
    rc = text ? plan_from_json(text, strlen(text), "e2e.json", &back, &err) : STOF_ERR_NOMEM;
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (!rc) {
        CHECK(back.has_end_to_end && back.end_to_end.graph_ms == 1.25 &&
              back.end_to_end.eager_ms == 1.5 && back.end_to_end.unfused_ms == 2.0 / 3.0);
        plan_free(&back);
    }
    /* a bad key inside it names the field */
    char *bad = text ? strstr(text, "\"unfused_ms\"") : NULL;
    if (bad) {
        memcpy(bad, "\"unfused_xx\"", 12);
        CHECK_EQ_INT(plan_from_json(text, strlen(text), "e2e.json", &back, &err),
                     STOF_ERR_FORMAT);
        CHECK_CONTAINS(err.msg, "e2e.json: end_to_end.unfused_xx");
    }
    free(text);
    /* without either, a plan still reads (both are optional) */
    p.has_end_to_end = 0;
    p.script_path[0] = '\0';
    CHECK_EQ_INT(plan_to_json(&p, &text, &err), STOF_OK);
    CHECK(text && !strstr(text, "\"end_to_end\"") && !strstr(text, "\"path\""));
    rc = text ? plan_from_json(text, strlen(text), "plain.json", &back, &err) : STOF_ERR_NOMEM;
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (!rc) {
        CHECK(!back.has_end_to_end && back.script_path[0] == '\0');
        plan_free(&back);
    }
    free(text);
    plan_free(&p);
    model_free(&m);
}

/* ==== kernel builds without the GPU ============================================================ */

static int has_option(const nvrtc_request *r, const char *opt) {
    for (int i = 0; i < r->n_options; i++)
        if (strcmp(r->options[i], opt) == 0)
            return 1;
    return 0;
}

/* The executor segment of op i alone on template t with values v. */
static void lone_segment(const graph *g, int i, fusion_template_id t, const int *v, int nv,
                         exec_segment *s) {
    memset(s, 0, sizeof *s);
    s->first = i;
    s->n = 1;
    s->out = g->ops[i].output;
    s->pre_norm = -1;
    s->tmpl = t;
    s->has_values = 1;
    memcpy(s->values, v, sizeof *v * (size_t)nv);
    stof_error err = {0};
    CHECK_EQ_INT(fusion_match_segment(g, &i, 1, &s->match, &err), STOF_OK);
}

/* Whether the plan of a block-wise setting cuts rows, by the plan's own
 * functions. */
static int plan_would_split(const graph *g, int op, const int *v, const mha_device_limits *lim) {
    const op_attention *a = &g->ops[op].attr.attn;
    const graph_tensor *y = &g->tensors[g->ops[op].output];
    mha_exec_problem p = {.mask = g->masks[a->mask], .causal = a->causal,
                          .batch = (int)y->shape[0], .heads = a->heads, .head_dim = a->head_dim,
                          .q_len = (int)y->shape[1], .k_len = (int)y->shape[1],
                          .dtype = y->dtype, .scale = a->scale};
    mask *folded = NULL;
    mask_bsr *f = NULL;
    mha_exec_split *sp = NULL;
    stof_error err = {0};
    int split = -1;
    if (mha_exec_fold_mask(&p, &folded, &err) == STOF_OK &&
        mask_format_bsr_build(folded, v[0], v[1], &f, &err) == STOF_OK) {
        int stages = mha_exec_auto_stages(v[0], v[1], v[2], p.head_dim, 2, lim);
        int per_sm = mha_exec_block_ctas_per_sm(v[0], v[1], v[2], stages, p.head_dim, 2, lim);
        int chunk = mha_exec_split_chunk(f, p.batch, p.heads, (per_sm > 0 ? per_sm : 1) *
                                                                  lim->sm_count);
        if (mha_exec_split_build(f, chunk, &sp, &err) == STOF_OK)
            split = sp != NULL;
    }
    mha_exec_split_free(sp);
    mask_format_bsr_free(f);
    mask_free(folded);
    return split;
}

static void check_attention_builds(const char *pattern, int expect_split) {
    char mask_param[64];
    snprintf(mask_param, sizeof mask_param, "mask=%s", pattern);
    const char *const params[] = {"preset=small", "layers=1", "batch=2", "seq=2048", mask_param};
    model m;
    if (model_load(&m, SCRIPTS "bert.lua", params, 5))
        return;
    mha_device_limits lim;
    stof_device_info d = device_of(9, 0);
    d.smem_per_sm = 233472;
    d.smem_per_block_optin = 232448;
    d.max_warps_per_sm = 64;
    mha_exec_device_limits(&d, "sm_90", &lim);
    int op = find_op(&m.g, OP_ATTENTION, 0);
    static const int v[3] = {64, 64, 4};
    exec_segment s;
    lone_segment(&m.g, op, FUSION_T_ATTENTION_BLOCK, v, 3, &s);
    exec_build b[EXEC_MAX_BUILDS];
    int n = 0;
    stof_error err = {0};
    CHECK_EQ_INT(exec_segment_builds(&m.g, &s, &lim, EXEC_BUILDS_ALL, b, &n, &err), STOF_OK);
    CHECK_EQ_INT(n, 2);
    if (n == 2) {
        CHECK(!has_option(exec_build_request(&b[0]), "-DSPLIT=1"));
        CHECK(has_option(exec_build_request(&b[1]), "-DSPLIT=1"));
        CHECK(b[0].attention && b[1].attention);
    }
    int rc = exec_segment_builds(&m.g, &s, &lim, EXEC_BUILDS_PLANNED, b, &n, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    CHECK_EQ_INT(n, 1);
    int split = plan_would_split(&m.g, op, v, &lim);
    CHECK_EQ_INT(split, expect_split);
    if (!rc && n == 1)
        CHECK_EQ_INT(has_option(exec_build_request(&b[0]), "-DSPLIT=1"), split);
    /* a block the planner refuses: 3 warps cannot split 64 rows */
    static const int bad[3] = {64, 64, 3};
    lone_segment(&m.g, op, FUSION_T_ATTENTION_BLOCK, bad, 3, &s);
    CHECK(exec_segment_builds(&m.g, &s, &lim, EXEC_BUILDS_PLANNED, b, &n, &err) != STOF_OK);
    model_free(&m);
}

/* An attention with global tokens builds its kernel with the rows' log-sum-exp under a
 * window (not under a dense mask) and the global tokens' kernels beside it. */
static void check_global_builds(const char *pattern, int expect_lse) {
    char path[] = "/tmp/stof-test-global-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    FILE *f = fdopen(fd, "w");
    fprintf(f, "local m = stof.model{name = 'g'}\n"
               "local x = m:input('x', {2, 256, 384})\n"
               "local am = m:input('am', {2, 256}, {dtype = 'int32', attention_mask = true})\n"
               "local gm = m:input('gm', {2, 256}, {dtype = 'int32', high = 2})\n"
               "local y\n"
               "m:layer(function() y = m:attention(x, {heads = 2, head_dim = 64, mask = "
               "stof.mask.named('%s'), padding = am, global = gm, global_qkv = x}) end)\n"
               "m:output(y)\nreturn m\n", pattern);
    fclose(f);
    model m;
    int rc = model_load(&m, path, NULL, 0);
    remove(path);
    if (rc)
        return;
    mha_device_limits lim;
    stof_error err = {0};
    CHECK_EQ_INT(mha_limits_for_arch("sm_90", &lim, &err), STOF_OK);
    exec_segment s;
    static const int v[3] = {64, 64, 4};
    lone_segment(&m.g, find_op(&m.g, OP_ATTENTION, 0), FUSION_T_ATTENTION_BLOCK, v, 3, &s);
    exec_build b[EXEC_MAX_BUILDS];
    int n = 0;
    rc = exec_segment_builds(&m.g, &s, &lim, EXEC_BUILDS_PLANNED, b, &n, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", pattern, err.msg);
    CHECK_EQ_INT(n, 2);
    if (!rc && n == 2) {
        CHECK_EQ_INT(has_option(exec_build_request(&b[0]), "-DLSE=1"), expect_lse);
        CHECK(strcmp(exec_build_request(&b[1])->source, "attention_global.cu") == 0);
        CHECK(has_option(exec_build_request(&b[1]), "-DHEAD_DIM=64"));
    }
    CHECK_EQ_INT(exec_segment_builds(&m.g, &s, &lim, EXEC_BUILDS_ALL, b, &n, &err), STOF_OK);
    CHECK_EQ_INT(n, 3); /* plain, split, global */
    model_free(&m);
}

static void test_builds(void) {
    /* BigBird's global rows are far longer than the rest: cut; a sliding
     * window's rows are all alike: not */
    check_attention_builds("bigbird", 1);
    check_attention_builds("sliding_window", 0);
    check_global_builds("sliding_window{band=16}", 1);
    check_global_builds("none", 0);

    static const char *const params[] = {"preset=small", "layers=1", "batch=1", "seq=128"};
    model m;
    if (model_load(&m, SCRIPTS "bert.lua", params, 4))
        return;
    mha_device_limits lim;
    stof_error err = {0};
    CHECK_EQ_INT(mha_limits_for_arch("sm_90", &lim, &err), STOF_OK);
    int op = find_op(&m.g, OP_GEMM, 0);
    /* BLOCK_M, BLOCK_N, BLOCK_K, WARPS, STAGES, SPLIT_K: a default-like one,
     * and one far past the accumulator registers of a thread */
    static const int fits[6] = {64, 128, 32, 4, 3, 1}, too_big[6] = {128, 256, 64, 4, 4, 1};
    exec_segment s;
    exec_build b[EXEC_MAX_BUILDS], all[EXEC_MAX_BUILDS];
    int n = 0, n_all = 0;
    lone_segment(&m.g, op, FUSION_T_GEMM_EPILOGUE, fits, 6, &s);
    CHECK_EQ_INT(exec_segment_builds(&m.g, &s, &lim, EXEC_BUILDS_PLANNED, b, &n, &err), STOF_OK);
    CHECK_EQ_INT(exec_segment_builds(&m.g, &s, &lim, EXEC_BUILDS_ALL, all, &n_all, &err), STOF_OK);
    CHECK(n == 1 && n_all == 1 && !b[0].attention);
    if (n == 1 && n_all == 1)
        CHECK(nvrtc_key(exec_build_request(&b[0])) == nvrtc_key(exec_build_request(&all[0])));
    lone_segment(&m.g, op, FUSION_T_GEMM_EPILOGUE, too_big, 6, &s);
    CHECK_EQ_INT(exec_segment_builds(&m.g, &s, &lim, EXEC_BUILDS_PLANNED, b, &n, &err),
                 STOF_ERR_UNSUPPORTED);
    CHECK_EQ_INT(exec_segment_builds(&m.g, &s, &lim, EXEC_BUILDS_ALL, b, &n, &err), STOF_OK);
    /* cuBLASLt compiles nothing */
    static const int algo[1] = {0};
    lone_segment(&m.g, op, FUSION_T_CUBLASLT, algo, 1, &s);
    CHECK_EQ_INT(exec_segment_builds(&m.g, &s, &lim, EXEC_BUILDS_PLANNED, b, &n, &err), STOF_OK);
    CHECK_EQ_INT(n, 0);
    model_free(&m);
}

/* Measurements are keyed by the device and the build's kernels. */
static void test_cache_key(void) {
    stof_device_info d = device_of(9, 0);
    char key[512];
    tune_cache_device_key(&d, key, sizeof key);
    CHECK(strncmp(key, d.name, strlen(d.name)) == 0);
    CHECK_CONTAINS(key, "| kernels ");
    CHECK(strchr(key, '\t') == NULL && strchr(key, '\n') == NULL);
}

int main(void) {
    test_check_output();
    test_reference_rows();
    test_check_rows();
    test_reference_attention_rows();
    test_reference_pre_norm();
    test_initial_schemes();
    test_offline();
    test_offline_fp32();
    test_builds();
    test_plan_end_to_end();
    test_default_result();
    test_cache_key();
    return check_summary("test_tune");
}
