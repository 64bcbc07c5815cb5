/* The two-stage search under a synthetic, deterministic cost model (no GPU):
 * the measurement cache (memory and file), sequence classes, the initial
 * rules, each stage-1 rule (expand, seize, compete) and rollback, that no
 * setting is measured twice, the reward shares of stage 2, seeds, the budget
 * and the time limit (one too short to search still gives the initial
 * scheme, finished past it with the backend's defaults), and that the result beats the all-unfused scheme on
 * the bert, gpt2 and t5 layers of the shipped scripts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/base/error.h"
#include "core/lua/lua_api.h"
#include "core/plan/plan.h"
#include "core/base/util.h"
#include "fusion/match.h"
#include "ops/ops.h"
#include "search/search.h"

#define SCRIPTS STOF_SOURCE_DIR "/scripts/"

/* ==== the synthetic backend ================================================================= */

typedef enum synth_mode {
    SYNTH_REAL = 0,   /* fusion saves launches and memory traffic; chains pay at few tokens */
    SYNTH_NO_FUSION,  /* every fused segment costs ten times more: nothing pays */
    SYNTH_CI_ALONE,   /* a CI op with anything fused to it costs ten times more */
    SYNTH_SPREAD      /* only the segment holding spread_op depends on its parameters */
} synth_mode;

typedef struct synth {
    synth_mode mode;
    int spread_op;
    double spread_scale; /* the spread segment costs base x (1 + scale x U[0,1)); 0: 9 */
    /* every key measured, with how often (the search must make it once) */
    char **keys;
    int *counts;
    int n_keys, cap_keys;
    long calls, bad_values;
    uint64_t trace;              /* hash of the order of the calls */
    search_stage stage;          /* from the progress callback */
    long calls_in_stage2_by_op[512];
    double spread_best[SEARCH_STAGE_DONE + 1]; /* fastest spread segment seen per stage */
    double now, per_call_s;      /* a fake clock */
    /* progress reports */
    int reports, reports_out_of_order;
    long last_measured;
    search_stage last_stage;
    /* stage-1 moves */
    search_move moves[4096];
    int n_moves;
    /* prepare calls (synth_prepare_backend): the last call's keys */
    uint64_t *prep_keys;
    int n_prep_keys;
    long prep_calls, prep_total, prep_max;
    long measured_unprepared; /* measured without being in the last prepare call */
    long prepared_measured;   /* named by prepare although measured already */
    long prep_over_budget;    /* calls naming more than the budget still allows */
    long budget;
    /* per segment signature, the templates of its measurements in order */
    struct sig_trace {
        char sig[SEARCH_SIG_MAX];
        int n;
        unsigned char tmpls[64];
        unsigned char is_default[64]; /* synth_template_default's values */
    } *sigs;
    int n_sigs;
    double clock_step_s;         /* the clock also moves this much at each reading */
    int defaults_fail;           /* synth_default's setting cannot run */
} synth;

static void synth_free(synth *s) {
    for (int i = 0; i < s->n_keys; i++)
        free(s->keys[i]);
    free(s->keys);
    free(s->counts);
    free(s->prep_keys);
    free(s->sigs);
    memset(s, 0, sizeof *s);
}

static void synth_count(synth *s, const char *key) {
    for (int i = 0; i < s->n_keys; i++)
        if (strcmp(s->keys[i], key) == 0) {
            s->counts[i]++;
            return;
        }
    if (s->n_keys == s->cap_keys) {
        s->cap_keys = s->cap_keys ? 2 * s->cap_keys : 256;
        s->keys = realloc(s->keys, sizeof *s->keys * (size_t)s->cap_keys);
        s->counts = realloc(s->counts, sizeof *s->counts * (size_t)s->cap_keys);
    }
    s->keys[s->n_keys] = strdup(key);
    s->counts[s->n_keys++] = 1;
}

static int is_template_default(const search_segment *seg, const int *values);

static void synth_trace_template(synth *s, const search_segment *seg, const int *values) {
    /* the signature names the template: under one fixed template it names
     * the segment alone */
    search_segment any = *seg;
    any.tmpl = FUSION_T_GEMM_EPILOGUE;
    char sig[SEARCH_SIG_MAX];
    search_segment_signature(&any, sig, sizeof sig);
    int i = 0;
    while (i < s->n_sigs && strcmp(s->sigs[i].sig, sig) != 0)
        i++;
    if (i == s->n_sigs) {
        s->sigs = realloc(s->sigs, sizeof *s->sigs * (size_t)(s->n_sigs + 1));
        memset(&s->sigs[i], 0, sizeof s->sigs[i]);
        snprintf(s->sigs[i].sig, sizeof s->sigs[i].sig, "%s", sig);
        s->n_sigs++;
    }
    struct sig_trace *t = &s->sigs[i];
    if (t->n < (int)sizeof t->tmpls) {
        t->is_default[t->n] = (unsigned char)is_template_default(seg, values);
        t->tmpls[t->n++] = (unsigned char)seg->tmpl;
    }
}

/* The first measurement of each template of every segment was that
 * template's default, or (want 0) at least one was not. */
static void check_defaults_first(const synth *s, int want) {
    int firsts = 0, defaults = 0;
    for (int i = 0; i < s->n_sigs; i++) {
        const struct sig_trace *t = &s->sigs[i];
        int seen[FUSION_T_COUNT] = {0};
        for (int k = 0; k < t->n; k++) {
            if (seen[t->tmpls[k]]++)
                continue;
            firsts++;
            defaults += t->is_default[k];
            CHECK_MSG(!want || t->is_default[k], "%s: template %d first measured off its default",
                      t->sig, t->tmpls[k]);
        }
    }
    CHECK(firsts > 0);
    if (!want)
        CHECK_MSG(defaults < firsts, "%d of %d first measurements were defaults unasked",
                  defaults, firsts);
}

/* Every segment tried each of its templates before it tried one twice: the
 * first D measurements of a signature are D distinct templates, D being
 * how many it measured in all. */
static void check_templates_first(const synth *s) {
    int multi = 0;
    for (int i = 0; i < s->n_sigs; i++) {
        const struct sig_trace *t = &s->sigs[i];
        int seen[FUSION_T_COUNT] = {0}, distinct = 0, first_distinct = 0;
        for (int k = 0; k < t->n; k++)
            distinct += !seen[t->tmpls[k]]++;
        memset(seen, 0, sizeof seen);
        for (int k = 0; k < distinct && k < t->n; k++)
            first_distinct += !seen[t->tmpls[k]]++;
        CHECK_MSG(first_distinct == distinct, "%s: %d templates, only %d in its first %d "
                  "measurements", t->sig, distinct, first_distinct, distinct);
        multi += distinct > 1;
    }
    CHECK(multi > 0);
}

static int synth_max_count(const synth *s) {
    int m = 0;
    for (int i = 0; i < s->n_keys; i++)
        m = s->counts[i] > m ? s->counts[i] : m;
    return m;
}

/* Each template has a sweet spot: parameter p's best value is its
 * ((t * 3 + p * 5) mod n)-th; every step away costs a share of the time. */
static double param_factor(const fusion_template *t, const int *values) {
    double f = 1;
    for (int p = 0; p < t->n_params; p++) {
        const fusion_param *q = &t->params[p];
        int idx = 0;
        while (idx < q->n_values && q->values[idx] != values[p])
            idx++;
        int sweet = ((int)t->id * 3 + p * 5) % q->n_values;
        f += 0.15 * abs(idx - sweet) / (q->n_values > 1 ? q->n_values - 1 : 1);
    }
    return f;
}

/* Launch, then per op its compute at 200 TFLOP/s and its memory traffic at
 * 2 TB/s; the traffic of ops after the first of a segment mostly stays on
 * chip. A GEMM chain's tiles get worse with more tokens, gemm_ln's with
 * longer rows. */
static double base_cost(const synth *s, const search_segment *seg) {
    double t = 0.004;
    int fused = seg->op_last > seg->op_first, has_ci = 0;
    for (int i = seg->op_first; i <= seg->op_last; i++) {
        double flops, bytes;
        const graph_op *op = &seg->g->ops[i];
        op_cost(seg->g, op, &flops, &bytes);
        has_ci |= op_describe(op->kind)->cls == OP_CLASS_CI;
        t += flops / 2e11 + bytes / 2e9 * (i > seg->op_first ? 0.3 : 1.0);
    }
    if (seg->tmpl == FUSION_T_GEMM_CHAIN)
        t *= 1 + (double)seg->dims.m / 256.0;
    if (seg->tmpl == FUSION_T_GEMM_LN)
        t *= 1 + (double)seg->dims.n / 2048.0;
    if ((s->mode == SYNTH_NO_FUSION && fused) || (s->mode == SYNTH_CI_ALONE && fused && has_ci))
        t *= 10;
    return t;
}

static double synth_cost(const synth *s, const search_segment *seg, const int *values) {
    const fusion_template *t = fusion_template_get(seg->tmpl);
    double base = base_cost(s, seg);
    if (s->mode != SYNTH_SPREAD)
        return base * param_factor(t, values);
    if (s->spread_op < seg->op_first || s->spread_op > seg->op_last)
        return base;
    uint64_t h = util_hash(UTIL_HASH_SEED, values, sizeof *values * (size_t)t->n_params);
    double scale = s->spread_scale > 0 ? s->spread_scale : 9;
    return base * (1 + scale * util_uniform(h, (uint64_t)seg->tmpl));
}

/* "signature|v1,v2,..." of a setting. */
static void synth_key(const search_segment *seg, const int *values, char *key, size_t cap) {
    const fusion_template *t = fusion_template_get(seg->tmpl);
    char sig[SEARCH_SIG_MAX];
    search_segment_signature(seg, sig, sizeof sig);
    size_t len = (size_t)snprintf(key, cap, "%s|", sig);
    for (int p = 0; t && p < t->n_params && len < cap; p++)
        len += (size_t)snprintf(key + len, cap - len, "%d,", values[p]);
}

static int synth_measured(const synth *s, const char *key) {
    for (int i = 0; i < s->n_keys; i++)
        if (strcmp(s->keys[i], key) == 0)
            return 1;
    return 0;
}

static int synth_prepared(const synth *s, uint64_t h) {
    for (int i = 0; i < s->n_prep_keys; i++)
        if (s->prep_keys[i] == h)
            return 1;
    return 0;
}

/* The default setting of the test backend: the last feasible setting of
 * the first template that matches (seldom the first of a shuffled order). */
/* A template's synthetic default: its last setting that passes its check. */
static int synth_template_default(void *ud, const search_segment *seg, int *values) {
    (void)ud;
    const fusion_template *tp = fusion_template_get(seg->tmpl);
    for (long i = fusion_template_settings(tp) - 1; i >= 0; i--) {
        fusion_template_setting(tp, i, values);
        if (fusion_template_check(tp, &seg->dims, values, SEARCH_DEFAULT_SMEM, NULL) == STOF_OK)
            return STOF_OK;
    }
    return STOF_ERR_UNSUPPORTED;
}

static int is_template_default(const search_segment *seg, const int *values) {
    int want[FUSION_MAX_PARAMS] = {0};
    const size_t n = (size_t)fusion_template_get(seg->tmpl)->n_params;
    return synth_template_default(NULL, seg, want) == STOF_OK &&
           memcmp(want, values, sizeof *values * n) == 0;
}

/* The segment's default: that of its first template that has one. */
static int synth_default(void *ud, const search_segment *seg, fusion_template_id *tmpl,
                         int *values) {
    for (int t = 0; t < FUSION_T_COUNT; t++) {
        search_segment view = *seg;
        view.tmpl = (fusion_template_id)t;
        if (fusion_match_has(seg->match, view.tmpl) &&
            synth_template_default(ud, &view, values) == STOF_OK) {
            *tmpl = view.tmpl;
            return STOF_OK;
        }
    }
    return STOF_ERR_UNSUPPORTED;
}

static int is_synth_default(const search_segment *seg, const int *values) {
    fusion_template_id t;
    int want[FUSION_MAX_PARAMS] = {0};
    return synth_default(NULL, seg, &t, want) == STOF_OK && t == seg->tmpl &&
           memcmp(want, values, sizeof *values * (size_t)fusion_template_get(t)->n_params) == 0;
}

static int synth_measure(void *ud, const search_segment *seg, const int *values, double *ms,
                         stof_error *err) {
    synth *s = ud;
    const fusion_template *t = fusion_template_get(seg->tmpl);
    if (!t || fusion_template_check(t, &seg->dims, values, SEARCH_DEFAULT_SMEM, NULL) != STOF_OK ||
        !fusion_match_has(seg->match, seg->tmpl))
        s->bad_values++;
    char key[SEARCH_KEY_MAX];
    synth_key(seg, values, key, sizeof key);
    s->measured_unprepared += !synth_prepared(s, util_hash_str(UTIL_HASH_SEED, key));
    synth_count(s, key);
    synth_trace_template(s, seg, values);
    s->trace = util_hash_str(s->trace ? s->trace : UTIL_HASH_SEED, key);
    s->calls++;
    s->now += s->per_call_s;
    if (s->stage == SEARCH_STAGE_SAMPLE && seg->op_first >= 0 && seg->op_first < 512)
        s->calls_in_stage2_by_op[seg->op_first]++;
    if (s->defaults_fail && is_synth_default(seg, values))
        return STOF_ERR_UNSUPPORTED;
    *ms = synth_cost(s, seg, values);
    if (s->mode == SYNTH_SPREAD && s->spread_op >= seg->op_first && s->spread_op <= seg->op_last &&
        (s->spread_best[s->stage] == 0 || *ms < s->spread_best[s->stage]))
        s->spread_best[s->stage] = *ms;
    return STOF_OK;
}

static double synth_clock(void *ud) {
    synth *s = ud;
    double now = s->now;
    s->now += s->clock_step_s;
    return now;
}

static void synth_progress(void *ud, const search_progress *p) {
    synth *s = ud;
    s->reports++;
    if (p->stage < s->last_stage || p->measured < s->last_measured || !(p->best_ms >= 0))
        s->reports_out_of_order++;
    s->last_stage = p->stage;
    s->last_measured = p->measured;
    s->stage = p->stage;
}

static void synth_move(void *ud, const search_move *m) {
    synth *s = ud;
    if (s->n_moves < (int)(sizeof s->moves / sizeof s->moves[0]))
        s->moves[s->n_moves++] = *m;
}

static search_backend synth_backend(synth *s) {
    return (search_backend){.ud = s, .measure = synth_measure};
}

/* Records what the search says it will measure next. */
static int synth_prepare(void *ud, const search_candidate *c, int n, stof_error *err) {
    synth *s = ud;
    free(s->prep_keys);
    s->prep_keys = malloc(sizeof *s->prep_keys * (size_t)(n ? n : 1));
    s->n_prep_keys = n;
    s->prep_calls++;
    s->prep_total += n;
    s->prep_max = n > s->prep_max ? n : s->prep_max;
    s->prep_over_budget += s->budget > 0 && n > s->budget - s->calls;
    for (int i = 0; i < n; i++) {
        char key[SEARCH_KEY_MAX];
        synth_key(&c[i].seg, c[i].values, key, sizeof key);
        s->prep_keys[i] = util_hash_str(UTIL_HASH_SEED, key);
        s->prepared_measured += synth_measured(s, key);
    }
    return STOF_OK;
}

static search_backend synth_prepare_backend(synth *s) {
    return (search_backend){.ud = s, .measure = synth_measure, .prepare = synth_prepare};
}

static search_options synth_options(synth *s, uint64_t seed) {
    search_options o = {0};
    o.seed = seed;
    o.clock = synth_clock;
    o.clock_ud = s;
    o.progress = synth_progress;
    o.on_move = synth_move;
    o.cb_ud = s;
    return o;
}

/* ==== models ================================================================================== */

typedef struct model {
    graph g;
    search_sequence *seqs;
    int n_seqs;
} model;

static int model_load(model *m, const char *script, const char *const *params, int n) {
    stof_error err = {0};
    memset(m, 0, sizeof *m);
    graph_init(&m->g);
    int rc = lua_api_build(script, params, n, &m->g, NULL, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", script, err.msg);
    if (!rc)
        rc = search_sequences_from_graph(&m->g, &m->seqs, &m->n_seqs, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", script, err.msg);
    return rc;
}

static void model_free(model *m) {
    search_sequences_free(m->seqs, m->n_seqs);
    graph_free(&m->g);
}

/* The sequence class of layer L. */
static int seq_of_layer(const model *m, int layer) {
    for (int q = 0; q < m->n_seqs; q++)
        if (m->seqs[q].layer == layer)
            return q;
    return -1;
}

static fusion_scheme scheme_of(const char *bits) {
    fusion_scheme s;
    stof_error err = {0};
    int rc = fusion_scheme_parse(bits, 0, &s, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", bits, err.msg);
    return s;
}

static void seq_ops(const model *m, int q, int *ops) {
    for (int k = 0; k < m->seqs[q].n; k++)
        ops[k] = m->seqs[q].firsts[0] + k;
}

/* Initial schemes for every sequence: all unfused, except `bits` for q. */
static fusion_scheme *initial_with(const model *m, int q, const char *bits) {
    fusion_scheme *init = calloc((size_t)m->n_seqs, sizeof *init);
    for (int i = 0; i < m->n_seqs; i++)
        fusion_scheme_all_unfused(&init[i], m->seqs[i].n, NULL);
    if (q >= 0 && bits)
        init[q] = scheme_of(bits);
    return init;
}

static void scheme_text(const fusion_scheme *s, char *buf, size_t cap) {
    fusion_scheme_format_binary(s, buf, cap);
}

static int has_segment(const fusion_scheme *s, int first, int last) {
    fusion_segment seg = fusion_scheme_segment_at(s, first);
    return seg.first == first && seg.last == last;
}

/* ==== the cache ================================================================================ */

static void test_cache_memory(void) {
    search_cache *c;
    stof_error err = {0};
    CHECK_EQ_INT(search_cache_open("GPU A", NULL, &c, &err), STOF_OK);
    int v[3] = {64, 128, 2}, w[3] = {64, 128, 4};
    double ms = -1;
    CHECK(!search_cache_lookup(c, "sig", v, 3, &ms));
    CHECK_EQ_INT(search_cache_store(c, "sig", v, 3, 0.25, &err), STOF_OK);
    CHECK(search_cache_lookup(c, "sig", v, 3, &ms) && ms == 0.25);
    CHECK(!search_cache_lookup(c, "sig", w, 3, &ms));
    CHECK(!search_cache_lookup(c, "other", v, 3, &ms));
    CHECK_EQ_INT(search_cache_store(c, "sig", v, 3, 0.5, &err), STOF_ERR_INTERNAL);
    CHECK_CONTAINS(err.msg, "measured twice");
    CHECK_EQ_INT(search_cache_store(c, "sig", w, 3, INFINITY, &err), STOF_OK);
    CHECK(search_cache_lookup(c, "sig", w, 3, &ms) && isinf(ms));
    /* many entries: the table grows and keeps them all */
    for (int i = 0; i < 3000; i++) {
        int x[1] = {i};
        CHECK_EQ_INT(search_cache_store(c, "grow", x, 1, i * 0.5, &err), STOF_OK);
    }
    int found = 0;
    for (int i = 0; i < 3000; i++) {
        int x[1] = {i};
        found += search_cache_lookup(c, "grow", x, 1, &ms) && ms == i * 0.5;
    }
    CHECK_EQ_INT(found, 3000);
    search_cache_stats st = search_cache_get_stats(c);
    CHECK_EQ_INT(st.entries, 3002);
    CHECK_EQ_INT(st.hits, 3002);
    CHECK_EQ_INT(st.misses, 3);
    search_cache_free(c);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_cache_file(void) {
    char path[] = STOF_BINARY_DIR "/tests/search_cache_test.txt";
    remove(path);
    search_cache *c;
    stof_error err = {0};
    int v[2] = {1, 2}, w[2] = {3, 4};
    double ms;
    CHECK_EQ_INT(search_cache_open("GPU\tA", path, &c, &err), STOF_OK);
    CHECK_EQ_INT(search_cache_store(c, "seg one", v, 2, 0.125, &err), STOF_OK);
    CHECK_EQ_INT(search_cache_store(c, "seg one", w, 2, 1.0 / 3.0, &err), STOF_OK);
    CHECK_EQ_INT(search_cache_store(c, "seg two", v, 2, INFINITY, &err), STOF_OK);
    search_cache_free(c);

    /* reopened: every entry back, exactly, for the same device only */
    CHECK_EQ_INT(search_cache_open("GPU\tA", path, &c, &err), STOF_OK);
    CHECK_EQ_INT(search_cache_get_stats(c).loaded, 3);
    CHECK(search_cache_lookup(c, "seg one", w, 2, &ms) && ms == 1.0 / 3.0);
    CHECK(search_cache_lookup(c, "seg two", v, 2, &ms) && isinf(ms));
    search_cache_free(c);
    CHECK_EQ_INT(search_cache_open("GPU B", path, &c, &err), STOF_OK);
    CHECK_EQ_INT(search_cache_get_stats(c).loaded, 0);
    CHECK(!search_cache_lookup(c, "seg one", v, 2, &ms));
    CHECK_EQ_INT(search_cache_store(c, "seg one", v, 2, 9.0, &err), STOF_OK);
    search_cache_free(c);
    CHECK_EQ_INT(search_cache_open("GPU\tA", path, &c, &err), STOF_OK);
    CHECK(search_cache_lookup(c, "seg one", v, 2, &ms) && ms == 0.125);
    search_cache_free(c);

    /* an append cut short is skipped; a broken line anywhere costs that line
     * alone, counted and said (its own device's or another's) */
    write_text(path, "# comment\nGPU\tsig\t1,2\t0.5\nGPU\tsig\t3,4\t0.");
    CHECK_EQ_INT(search_cache_open("GPU", path, &c, &err), STOF_OK);
    CHECK_EQ_INT(search_cache_get_stats(c).loaded, 1);
    CHECK_EQ_INT(search_cache_get_stats(c).skipped, 0);
    /* what is appended after the cut line stands on a line of its own */
    CHECK_EQ_INT(search_cache_store(c, "sig", w, 2, 0.75, &err), STOF_OK);
    search_cache_free(c);
    CHECK_EQ_INT(search_cache_open("GPU", path, &c, &err), STOF_OK);
    CHECK(search_cache_lookup(c, "sig", w, 2, &ms) && ms == 0.75);
    CHECK_EQ_INT(search_cache_get_stats(c).loaded, 2);
    search_cache_free(c);
    static const struct {
        const char *line, *why;
    } broken[] = {{"GPU\tsig\t3,4\n", ":2: expected 4 tab-separated fields"},
                  {"GPU\tsig\t3,4\tfast\n", ":2: 'fast' is not a time"},
                  {"GPU\tsig\t3,4\t-1\n", ":2: '-1' is not a time"},
                  {"GPU\tsig\t3,4\t0.5\textra\n", ":2: expected 4 tab-separated fields"},
                  {"Other GPU\tsig\t3,4\tslow\n", ":2: 'slow' is not a time"},
                  {"GPU\tsig\t3,\0004\t0.5\n", ":2: the line holds a NUL byte"}};
    for (size_t k = 0; k < sizeof broken / sizeof broken[0]; k++) {
        char text[256];
        int n = snprintf(text, sizeof text, "GPU\tsig\t1,2\t0.5\n");
        size_t len = strlen(broken[k].line) + (strstr(broken[k].why, "NUL") ? 7 : 0);
        memcpy(text + n, broken[k].line, len + 1);
        snprintf(text + n + len, sizeof text - (size_t)n - len, "GPU\tsig\t5,6\t0.25\n");
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL);
        if (f) {
            fwrite(text, 1, (size_t)n + len + strlen(text + n + len), f);
            fclose(f);
        }
        CHECK_EQ_INT(search_cache_open("GPU", path, &c, &err), STOF_OK);
        if (!c)
            continue;
        search_cache_stats st = search_cache_get_stats(c);
        CHECK_EQ_INT(st.loaded, 2);
        CHECK_EQ_INT(st.skipped, 1);
        CHECK_CONTAINS(st.skipped_first, broken[k].why);
        search_cache_free(c);
    }
    /* lines written on another system end in CR LF: read as they are */
    write_text(path, "GPU\tsig\t1,2\t0.5\r\nGPU\tsig\t3,4\t0.25\r\n");
    CHECK_EQ_INT(search_cache_open("GPU", path, &c, &err), STOF_OK);
    CHECK_EQ_INT(search_cache_get_stats(c).loaded, 2);
    CHECK(search_cache_lookup(c, "sig", w, 2, &ms) && ms == 0.25);
    search_cache_free(c);
    CHECK_EQ_INT(search_cache_open("GPU", STOF_BINARY_DIR "/no/such/dir/cache.txt", &c, &err),
                 STOF_ERR_IO);
    remove(path);
}

/* ==== sequences and the initial scheme ============================================================ */

static void test_sequences(void) {
    const char *bert[] = {"preset=small", "batch=1", "seq=64", "mask=none"};
    model m;
    if (model_load(&m, SCRIPTS "bert.lua", bert, 4) == STOF_OK) {
        CHECK_EQ_INT(m.n_seqs, 2);
        CHECK(m.seqs[0].layer == -1 && m.seqs[0].n == 2 && m.seqs[0].count == 1);
        CHECK(m.seqs[1].layer == 0 && m.seqs[1].n == 14 && m.seqs[1].count == 4);
        for (int i = 0; i < 4 && m.n_seqs == 2; i++)
            CHECK_EQ_INT(m.seqs[1].firsts[i], 2 + 14 * i);
    }
    model_free(&m);
    const char *t5[] = {"layers=2", "batch=1", "seq=64", "dec_seq=32"};
    if (model_load(&m, SCRIPTS "t5.lua", t5, 4) == STOF_OK) {
        int layers = 0, ops = 0;
        for (int q = 0; q < m.n_seqs; q++) {
            layers += m.seqs[q].layer >= 0 ? m.seqs[q].count : 0;
            ops += m.seqs[q].n * m.seqs[q].count;
        }
        CHECK_EQ_INT(layers, 4);
        CHECK_EQ_INT(ops, m.g.n_ops);
        CHECK(seq_of_layer(&m, 0) >= 0 && seq_of_layer(&m, 2) >= 0 && seq_of_layer(&m, 1) < 0);
    }
    model_free(&m);
}

static void expect_initial(const char *seq_param, int chain_tokens, const char *want) {
    const char *p[] = {"preset=small", "batch=1", seq_param, "mask=none"};
    model m;
    if (model_load(&m, SCRIPTS "bert.lua", p, 4) == STOF_OK) {
        int q = seq_of_layer(&m, 0), ops[FUSION_MAX_OPS];
        seq_ops(&m, q, ops);
        fusion_scheme s;
        search_rules rules = {chain_tokens, 0};
        stof_error err = {0};
        CHECK_EQ_INT(search_initial_scheme(&m.g, ops, m.seqs[q].n, &rules, &s, &err), STOF_OK);
        char got[FUSION_SCHEME_BINARY_MAX];
        scheme_text(&s, got, sizeof got);
        CHECK_MSG(strcmp(got, want) == 0, "%s: initial %s, expected %s", seq_param, got, want);
        CHECK_EQ_INT(fusion_scheme_validate(&m.g, ops, m.seqs[q].n, &s, NULL, NULL), STOF_OK);
    }
    model_free(&m);
}

static void test_initial(void) {
    /* gemm bias | attention | gemm | bias add layernorm | gemm bias gelu gemm | bias add
     * layernorm: the FFN's chain fused at 64 tokens, residual chains kept as MI chains */
    expect_initial("seq=64", 0, "00101110000111");
    /* 1024 tokens: above the threshold, so gemm bias gelu | gemm */
    expect_initial("seq=1024", 0, "00101110001000");
    expect_initial("seq=64", -1, "00101110001000");

    /* every shipped layer gets a valid initial scheme */
    const char *scripts[] = {"bert.lua", "gpt2.lua", "t5.lua"};
    const char *p[] = {"layers=2", "batch=2", "seq=128"};
    for (int i = 0; i < 3; i++) {
        char path[512];
        snprintf(path, sizeof path, SCRIPTS "%s", scripts[i]);
        model m;
        if (model_load(&m, path, p, 3) != STOF_OK) {
            model_free(&m);
            continue;
        }
        for (int q = 0; q < m.n_seqs; q++) {
            int ops[FUSION_MAX_OPS];
            seq_ops(&m, q, ops);
            fusion_scheme s;
            CHECK_EQ_INT(search_initial_scheme(&m.g, ops, m.seqs[q].n, NULL, &s, NULL), STOF_OK);
            CHECK_EQ_INT(fusion_scheme_validate(&m.g, ops, m.seqs[q].n, &s, NULL, NULL), STOF_OK);
            CHECK(fusion_scheme_count_segments(&s) < m.seqs[q].n || m.seqs[q].n <= 2);
        }
        model_free(&m);
    }
}

/* ==== stage 1 ========================================================================================= */

static int run(model *m, synth *s, search_options *o, search_result *r) {
    search_backend b = synth_backend(s);
    stof_error err = {0};
    int rc = search_run(&m->g, m->seqs, m->n_seqs, &b, o, r, &err);
    CHECK_MSG(rc == STOF_OK, "search_run: %s", err.msg);
    return rc;
}

/* The first move the search reported for sequence q. */
static const search_move *first_move(const synth *s, int q, int nth) {
    for (int i = 0; i < s->n_moves; i++)
        if (s->moves[i].seq == q && nth-- == 0)
            return &s->moves[i];
    return NULL;
}

static int bert_small(model *m, const char *seq) {
    const char *p[] = {"preset=small", "batch=1", seq, "mask=none"};
    return model_load(m, SCRIPTS "bert.lua", p, 4);
}

/* Compete on BERT's unfused layer: the bias after the output projection
 * (position 4) could join the GEMM (one CI op) or the add (none): the GEMM
 * extends first. When that does not pay, the other side is tried next, from
 * the very same scheme. */
static void test_compete(void) {
    model m;
    if (bert_small(&m, "seq=64") == STOF_OK) {
        int q = seq_of_layer(&m, 0);
        fusion_scheme *init = initial_with(&m, -1, NULL);
        synth s = {0};
        search_options o = synth_options(&s, 1);
        o.initial = init;
        search_result r;
        if (run(&m, &s, &o, &r) == STOF_OK) {
            const search_move *mv = first_move(&s, q, 0);
            CHECK(mv && mv->kind == SEARCH_MOVE_COMPETE && has_segment(&mv->after, 3, 4) &&
                  mv->kept);
            search_result_free(&r);
        }
        synth_free(&s);

        synth t = {.mode = SYNTH_CI_ALONE};
        o = synth_options(&t, 1);
        o.initial = init;
        if (run(&m, &t, &o, &r) == STOF_OK) {
            const search_move *a = first_move(&t, q, 0), *b = first_move(&t, q, 1);
            CHECK(a && a->kind == SEARCH_MOVE_COMPETE && has_segment(&a->after, 3, 4) && !a->kept);
            CHECK(b && b->kind == SEARCH_MOVE_COMPETE && has_segment(&b->after, 4, 5) && b->kept);
            CHECK(a && b && fusion_scheme_equal(&a->before, &b->before));
            search_result_free(&r);
        }
        synth_free(&t);

        /* the add after the FFN chain: the chain holds two CI ops, the norm
         * none, so the norm takes it first */
        free(init);
        init = initial_with(&m, q, "00101110000010");
        synth u = {0};
        o = synth_options(&u, 1);
        o.initial = init;
        if (run(&m, &u, &o, &r) == STOF_OK) {
            const search_move *mv = first_move(&u, q, 0);
            CHECK(mv && mv->kind == SEARCH_MOVE_COMPETE && has_segment(&mv->after, 12, 13));
            search_result_free(&r);
        }
        synth_free(&u);
        free(init);
    }
    model_free(&m);
}

/* Seize: from the rules' scheme, the lone output projection (one CI op)
 * takes the bias of the MI chain after it. */
static void test_seize(void) {
    model m;
    if (bert_small(&m, "seq=64") == STOF_OK) {
        int q = seq_of_layer(&m, 0);
        fusion_scheme *init = initial_with(&m, q, "00101110000111");
        synth s = {0};
        search_options o = synth_options(&s, 3);
        o.initial = init;
        search_result r;
        if (run(&m, &s, &o, &r) == STOF_OK) {
            const search_move *mv = first_move(&s, q, 0);
            CHECK(mv && mv->kind == SEARCH_MOVE_SEIZE && has_segment(&mv->after, 3, 4) &&
                  has_segment(&mv->after, 5, 6) && has_segment(&mv->before, 4, 6));
            search_result_free(&r);
        }
        synth_free(&s);
        free(init);
    }
    model_free(&m);
}

/* Expand: with neither a lone op two segments could take nor an MI chain to
 * seize from, the first move merges the lone norm into the GEMM before it. */
static void test_expand(void) {
    model m;
    if (bert_small(&m, "seq=64") == STOF_OK) {
        int q = seq_of_layer(&m, 0);
        fusion_scheme *init = initial_with(&m, q, "00100010000001");
        synth s = {0};
        search_options o = synth_options(&s, 5);
        o.initial = init;
        search_result r;
        if (run(&m, &s, &o, &r) == STOF_OK) {
            const search_move *mv = first_move(&s, q, 0);
            CHECK(mv && mv->kind == SEARCH_MOVE_EXPAND && has_segment(&mv->after, 3, 6));
            CHECK(mv && fusion_scheme_count_segments(&mv->after) ==
                            fusion_scheme_count_segments(&mv->before) - 1);
            search_result_free(&r);
        }
        synth_free(&s);
        free(init);
    }
    model_free(&m);
}

static int n_ci_of(const model *m, int q, fusion_segment seg) {
    int ci = 0;
    for (int i = seg.first; i <= seg.last; i++)
        ci += op_describe(m->g.ops[m->seqs[q].firsts[0] + i].kind)->cls == OP_CLASS_CI;
    return ci;
}

/* Split: when a GEMM with anything fused to it costs ten times more, the
 * rules' start (every GEMM with its epilogue) gives its epilogues up, and
 * every GEMM of the result stands alone. */
static void test_split(void) {
    model m;
    if (bert_small(&m, "seq=64") == STOF_OK) {
        int q = seq_of_layer(&m, 0);
        synth s = {.mode = SYNTH_CI_ALONE};
        search_options o = synth_options(&s, 2);
        o.chain_max_tokens = -1;
        search_result r;
        if (run(&m, &s, &o, &r) == STOF_OK) {
            int splits = 0;
            for (int i = 0; i < s.n_moves; i++)
                splits += s.moves[i].seq == q && s.moves[i].kind == SEARCH_MOVE_SPLIT &&
                          s.moves[i].kept;
            CHECK(splits >= 1);
            fusion_segment segs[FUSION_MAX_OPS];
            int n = fusion_scheme_segments(&r.seqs[q].scheme, segs, FUSION_MAX_OPS);
            for (int k = 0; k < n; k++)
                if (n_ci_of(&m, q, segs[k]) > 0)
                    CHECK_MSG(segs[k].first == segs[k].last, "ops %d-%d: a GEMM not alone",
                              segs[k].first, segs[k].last);
            search_result_free(&r);
        }
        synth_free(&s);
    }
    model_free(&m);
}

/* Nothing pays: every move is rolled back and the scheme comes out bit for
 * bit as it went in. */
static void test_rollback(void) {
    model m;
    if (bert_small(&m, "seq=64") == STOF_OK) {
        fusion_scheme *init = initial_with(&m, -1, NULL);
        synth s = {.mode = SYNTH_NO_FUSION};
        search_options o = synth_options(&s, 7);
        o.initial = init;
        search_result r;
        if (run(&m, &s, &o, &r) == STOF_OK) {
            CHECK(s.n_moves > 0);
            int kept = 0;
            for (int i = 0; i < s.n_moves; i++)
                kept += s.moves[i].kept;
            CHECK_EQ_INT(kept, 0);
            CHECK_EQ_INT(r.stats.schemes_kept, 0);
            for (int q = 0; q < m.n_seqs; q++)
                CHECK(fusion_scheme_equal(&r.seqs[q].scheme, &init[q]));
            for (int i = 0; i < s.n_moves; i++)
                CHECK(fusion_scheme_equal(&s.moves[i].before, &init[s.moves[i].seq]));
            search_result_free(&r);
        }
        synth_free(&s);
        free(init);
    }
    model_free(&m);
}

/* ---- properties of every move of a whole run ------------------------------------------------------------ */

static int boundary_count(const fusion_scheme *s) {
    return fusion_scheme_count_segments(s) - 1;
}

/* Positions where a and b differ in being a boundary. */
static int boundary_diff(const fusion_scheme *a, const fusion_scheme *b, int *where, int max) {
    int n = 0;
    for (int i = 1; i < a->n; i++)
        if (fusion_scheme_is_boundary(a, i) != fusion_scheme_is_boundary(b, i)) {
            if (n < max)
                where[n] = i;
            n++;
        }
    return n;
}

static void check_move(const model *m, const search_move *mv) {
    int where[4];
    int d = boundary_diff(&mv->before, &mv->after, where, 4);
    if (mv->kind == SEARCH_MOVE_SEIZE) {
        /* one boundary moved by one op, from an MI-only segment to one with CI */
        CHECK_EQ_INT(d, 2);
        CHECK_EQ_INT(boundary_count(&mv->before), boundary_count(&mv->after));
        if (d == 2) {
            CHECK_EQ_INT(where[1] - where[0], 1);
            int op = where[0]; /* the op that moved is at where[0] */
            fusion_segment from = fusion_scheme_segment_at(&mv->before, op);
            fusion_segment to = fusion_scheme_segment_at(&mv->after, op);
            CHECK_EQ_INT(n_ci_of(m, mv->seq, from), 0);
            CHECK(n_ci_of(m, mv->seq, to) >= 1);
        }
    } else if (mv->kind == SEARCH_MOVE_SPLIT) {
        /* one boundary added, after the one CI op of the segment it splits */
        CHECK_EQ_INT(d, 1);
        CHECK_EQ_INT(boundary_count(&mv->before) + 1, boundary_count(&mv->after));
        if (d == 1) {
            fusion_segment whole = fusion_scheme_segment_at(&mv->before, where[0]);
            fusion_segment head = fusion_scheme_segment_at(&mv->after, where[0] - 1);
            CHECK_EQ_INT(n_ci_of(m, mv->seq, whole), 1);
            CHECK_EQ_INT(n_ci_of(m, mv->seq, head), 1);
        }
    } else {
        /* expand and compete: one boundary gone, the others untouched */
        CHECK_EQ_INT(d, 1);
        CHECK_EQ_INT(boundary_count(&mv->before) - 1, boundary_count(&mv->after));
        if (mv->kind == SEARCH_MOVE_COMPETE && d == 1) {
            fusion_segment left = fusion_scheme_segment_at(&mv->before, where[0] - 1);
            fusion_segment right = fusion_scheme_segment_at(&mv->before, where[0]);
            CHECK(left.first == left.last || right.first == right.last);
        }
    }
    CHECK(mv->kept ? mv->after_ms < mv->before_ms : mv->after_ms >= mv->before_ms);
}

/* The rules' scheme without CI+CI chains: the search measures both starts
 * and begins from the faster. */
static void rules_initial_no_chains(const model *m, fusion_scheme *alt) {
    for (int q = 0; q < m->n_seqs; q++) {
        int ops[FUSION_MAX_OPS];
        seq_ops(m, q, ops);
        search_rules rules = {-1, 0};
        search_initial_scheme(&m->g, ops, m->seqs[q].n, &rules, &alt[q], NULL);
    }
}

/* The start of sequence q: the first move's scheme before it, which must be
 * one of the two rule candidates; with no move, whichever matches the result. */
static fusion_scheme start_of(const synth *s, int q, const fusion_scheme *init,
                              const fusion_scheme *alt, const search_result *r) {
    for (int i = 0; i < s->n_moves; i++)
        if (s->moves[i].seq == q) {
            const fusion_scheme *b = &s->moves[i].before;
            CHECK(fusion_scheme_equal(b, &init[q]) || fusion_scheme_equal(b, &alt[q]));
            return *b;
        }
    return fusion_scheme_same_segments(&alt[q], &r->seqs[q].scheme) ? alt[q] : init[q];
}

/* Every move keeps the rules; consecutive moves continue from the kept
 * scheme or, after a rollback, from the identical bits; no scheme twice. */
static void check_moves(const model *m, const synth *s, const fusion_scheme *init,
                        const search_result *r) {
    fusion_scheme *alt = malloc(sizeof *alt * (size_t)m->n_seqs);
    rules_initial_no_chains(m, alt);
    for (int q = 0; q < m->n_seqs; q++) {
        fusion_scheme cur = start_of(s, q, init, alt, r);
        fusion_scheme *seen = malloc(sizeof *seen * (size_t)(s->n_moves + 1));
        int n_seen = 0;
        seen[n_seen] = cur;
        fusion_scheme_canonical(&seen[n_seen++]);
        for (int i = 0; i < s->n_moves; i++) {
            const search_move *mv = &s->moves[i];
            if (mv->seq != q)
                continue;
            check_move(m, mv);
            CHECK(fusion_scheme_equal(&mv->before, &cur));
            fusion_scheme canon = mv->after;
            fusion_scheme_canonical(&canon);
            for (int k = 0; k < n_seen; k++)
                CHECK(!fusion_scheme_equal(&seen[k], &canon));
            seen[n_seen++] = canon;
            if (mv->kept)
                cur = mv->after;
        }
        CHECK(fusion_scheme_same_segments(&cur, &r->seqs[q].scheme));
        free(seen);
    }
    free(alt);
}

/* ==== whole runs ======================================================================================= */

/* The best the all-unfused scheme could do under the model: every op alone
 * with its best setting of every template, found exhaustively. */
static double best_unfused_ms(const model *m, const synth *s) {
    double total = 0;
    for (int q = 0; q < m->n_seqs; q++) {
        for (int k = 0; k < m->seqs[q].n; k++) {
            int op = m->seqs[q].firsts[0] + k;
            fusion_match match;
            if (fusion_match_segment(&m->g, &op, 1, &match, NULL) != STOF_OK)
                return NAN;
            double best = INFINITY;
            for (int t = 0; t < FUSION_T_COUNT; t++) {
                const fusion_template *tp = fusion_template_get((fusion_template_id)t);
                if (!fusion_match_has(&match, tp->id))
                    continue;
                search_segment seg = {&m->g, q, k, k, op, op, tp->id, &match, match.dims};
                for (long i = 0; i < fusion_template_settings(tp); i++) {
                    int v[FUSION_MAX_PARAMS];
                    fusion_template_setting(tp, i, v);
                    if (fusion_template_check(tp, &match.dims, v, SEARCH_DEFAULT_SMEM, NULL))
                        continue;
                    double ms = synth_cost(s, &seg, v);
                    best = ms < best ? ms : best;
                }
            }
            total += best * m->seqs[q].count;
        }
    }
    return total;
}

static void rules_initial(const model *m, fusion_scheme *init) {
    for (int q = 0; q < m->n_seqs; q++) {
        int ops[FUSION_MAX_OPS];
        seq_ops(m, q, ops);
        search_initial_scheme(&m->g, ops, m->seqs[q].n, NULL, &init[q], NULL);
    }
}

static int results_equal(const search_result *a, const search_result *b) {
    if (!search_result_same_choices(a, b) || a->total_ms != b->total_ms)
        return 0;
    for (int q = 0; q < a->n_seqs; q++)
        for (int k = 0; k < a->seqs[q].n_segs; k++)
            if (a->seqs[q].segs[k].ms != b->seqs[q].segs[k].ms)
                return 0;
    return 1;
}

static void check_result_sums(const model *m, const search_result *r) {
    double total = 0;
    for (int q = 0; q < r->n_seqs; q++) {
        double seq = 0;
        for (int k = 0; k < r->seqs[q].n_segs; k++)
            seq += r->seqs[q].segs[k].ms;
        CHECK_NEAR(seq, r->seqs[q].ms, 1e-12);
        CHECK_EQ_INT(r->seqs[q].n_segs, fusion_scheme_count_segments(&r->seqs[q].scheme));
        total += r->seqs[q].ms * m->seqs[q].count;
    }
    CHECK_NEAR(total, r->total_ms, 1e-12);
}

static void full_run(const char *script, const char *const *params, int n_params) {
    char path[512];
    snprintf(path, sizeof path, SCRIPTS "%s", script);
    model m;
    if (model_load(&m, path, params, n_params) != STOF_OK) {
        model_free(&m);
        return;
    }
    fusion_scheme *init = calloc((size_t)m.n_seqs, sizeof *init);
    rules_initial(&m, init);
    search_cache *cache;
    search_cache_open("synthetic", NULL, &cache, NULL);
    synth s = {0};
    search_options o = synth_options(&s, 42);
    o.cache = cache;
    search_result r, again;
    if (run(&m, &s, &o, &r) == STOF_OK) {
        CHECK_EQ_INT(s.bad_values, 0);
        CHECK_EQ_INT(synth_max_count(&s), 1);
        CHECK_EQ_INT(r.stats.measured, s.calls);
        CHECK_EQ_INT(r.stats.measured, r.stats.measured_stage1 + r.stats.measured_stage2);
        CHECK(r.stats.measured_stage2 > 0 && r.stats.rounds > 0);
        CHECK(r.stats.schemes_tried > m.n_seqs);
        CHECK_EQ_INT(s.reports_out_of_order, 0);
        CHECK_EQ_INT(s.last_stage, SEARCH_STAGE_DONE);
        check_moves(&m, &s, init, &r);
        check_result_sums(&m, &r);
        check_templates_first(&s);
        check_defaults_first(&s, 0);
        double unfused = best_unfused_ms(&m, &s);
        CHECK_MSG(r.total_ms < unfused, "%s: %.6f ms tuned, %.6f ms unfused at best", script,
                  r.total_ms, unfused);
        int kept = 0;
        for (int i = 0; i < s.n_moves; i++)
            kept += s.moves[i].kept;
        printf("  %-9s %d sequences, %3ld settings measured, %2ld schemes tried, %2d kept, "
               "%d rounds: %.4f ms (all unfused at best %.4f ms)\n",
               script, m.n_seqs, r.stats.measured, r.stats.schemes_tried, kept, r.stats.rounds,
               r.total_ms, unfused);

        /* the same search again over the same cache measures nothing */
        synth t = {0};
        search_options o2 = synth_options(&t, 42);
        o2.cache = cache;
        if (run(&m, &t, &o2, &again) == STOF_OK) {
            CHECK_EQ_INT(t.calls, 0);
            CHECK_EQ_INT(again.stats.cache_hits, r.stats.measured + r.stats.cache_hits);
            CHECK(results_equal(&r, &again));
            search_result_free(&again);
        }
        synth_free(&t);
        search_result_free(&r);
    }
    synth_free(&s);
    search_cache_free(cache);
    free(init);
    model_free(&m);
}

static void test_full_runs(void) {
    const char *bert[] = {"preset=small", "layers=2", "batch=1", "seq=128", "mask=none"};
    const char *gpt2[] = {"layers=2", "batch=1", "seq=128"};
    const char *t5[] = {"layers=2", "batch=1", "seq=64", "dec_seq=32"};
    full_run("bert.lua", bert, 5);
    full_run("gpt2.lua", gpt2, 3);
    full_run("t5.lua", t5, 4);
}

/* A file cache carries measurements from one search run to the next. */
static void test_cache_across_runs(void) {
    const char *path = STOF_BINARY_DIR "/tests/search_cache_runs.txt";
    remove(path);
    const char *p[] = {"preset=small", "layers=1", "batch=1", "seq=64", "mask=none"};
    model m;
    if (model_load(&m, SCRIPTS "bert.lua", p, 5) == STOF_OK) {
        search_result r1, r2;
        long first_calls = 0;
        for (int pass = 0; pass < 2; pass++) {
            search_cache *c = NULL;
            stof_error err = {0};
            CHECK_EQ_INT(search_cache_open("synthetic GPU", path, &c, &err), STOF_OK);
            synth s = {0};
            search_options o = synth_options(&s, 3);
            o.cache = c;
            if (run(&m, &s, &o, pass ? &r2 : &r1) == STOF_OK && pass == 1) {
                CHECK(first_calls > 0);
                CHECK_EQ_INT(s.calls, 0);
                CHECK_EQ_INT(search_cache_get_stats(c).loaded, first_calls);
                CHECK(results_equal(&r1, &r2));
                search_result_free(&r2);
            }
            first_calls = pass ? first_calls : s.calls;
            synth_free(&s);
            search_cache_free(c);
        }
        search_result_free(&r1);
    }
    model_free(&m);
    remove(path);
}

/* ==== seeds, budget, time ================================================================================ */

static void test_seeds(void) {
    model m;
    if (bert_small(&m, "seq=128") == STOF_OK) {
        synth a = {0}, b = {0}, c = {0};
        search_options oa = synth_options(&a, 11), ob = synth_options(&b, 11),
                       oc = synth_options(&c, 12);
        search_result ra, rb, rc;
        int ok = run(&m, &a, &oa, &ra) == STOF_OK;
        ok &= run(&m, &b, &ob, &rb) == STOF_OK;
        ok &= run(&m, &c, &oc, &rc) == STOF_OK;
        if (ok) {
            CHECK(a.trace == b.trace && a.calls == b.calls);
            CHECK(results_equal(&ra, &rb));
            CHECK(a.trace != c.trace);
        }
        search_result_free(&ra);
        search_result_free(&rb);
        search_result_free(&rc);
        synth_free(&a);
        synth_free(&b);
        synth_free(&c);
    }
    model_free(&m);
}

/* A backend that prepares: told every setting before it is measured, in
 * batches wider than one segment, never a setting measured already or more
 * than the budget allows; the search's choices and order are the same as
 * without the hook. */
static void prepared_run(model *m, uint64_t seed, long budget) {
    synth plain = {0}, prep = {0};
    search_options op = synth_options(&plain, seed), oq = synth_options(&prep, seed);
    op.budget = oq.budget = prep.budget = budget;
    search_backend b = synth_prepare_backend(&prep);
    search_result rp, rq;
    stof_error err = {0};
    int ok = run(m, &plain, &op, &rp) == STOF_OK;
    int rc = search_run(&m->g, m->seqs, m->n_seqs, &b, &oq, &rq, &err);
    CHECK_MSG(rc == STOF_OK, "search_run: %s", err.msg);
    if (ok && rc == STOF_OK) {
        CHECK(plain.trace == prep.trace && plain.calls == prep.calls);
        CHECK(results_equal(&rp, &rq));
        CHECK_EQ_INT(prep.measured_unprepared, 0);
        CHECK_EQ_INT(prep.prepared_measured, 0);
        CHECK_EQ_INT(prep.prep_over_budget, 0);
        CHECK_EQ_INT(synth_max_count(&prep), 1);
        CHECK_EQ_INT(rq.stats.prepare_calls, prep.prep_calls);
        CHECK_EQ_INT(rq.stats.prepared, prep.prep_total);
        CHECK_EQ_INT(rp.stats.prepare_calls, 0);
        /* wider than one segment's K samples: whole states, levels, rounds */
        CHECK(prep.prep_max > SEARCH_DEFAULT_K);
        CHECK(prep.prep_calls < prep.calls);
        CHECK(budget > 0 || prep.prep_total >= prep.calls);
        printf("  prepare: %ld calls naming %ld settings (at most %ld), %ld measured\n",
               prep.prep_calls, prep.prep_total, prep.prep_max, prep.calls);
    }
    if (ok)
        search_result_free(&rp);
    if (rc == STOF_OK)
        search_result_free(&rq);
    synth_free(&plain);
    synth_free(&prep);
}

static void test_prepare(void) {
    model m;
    if (bert_small(&m, "seq=128") == STOF_OK) {
        prepared_run(&m, 21, 0);
        prepared_run(&m, 22, 60);
    }
    model_free(&m);
    const char *t5[] = {"layers=2", "batch=1", "seq=64", "dec_seq=32"};
    if (model_load(&m, SCRIPTS "t5.lua", t5, 4) == STOF_OK)
        prepared_run(&m, 23, 0);
    model_free(&m);
}

static void test_budget_and_time(void) {
    model m;
    if (bert_small(&m, "seq=128") == STOF_OK) {
        synth s = {0};
        search_options o = synth_options(&s, 5);
        o.budget = 60;
        search_result r;
        if (run(&m, &s, &o, &r) == STOF_OK) {
            CHECK(s.calls <= 60 && r.stats.measured == s.calls);
            CHECK(r.stats.stopped_by_budget);
            CHECK_EQ_INT(synth_max_count(&s), 1);
            search_result_free(&r);
        }
        synth_free(&s);

        /* too small to measure the initial scheme: an error, not a half result */
        synth t = {0};
        o = synth_options(&t, 5);
        o.budget = 3;
        search_backend b = synth_backend(&t);
        stof_error err = {0};
        CHECK_EQ_INT(search_run(&m.g, m.seqs, m.n_seqs, &b, &o, &r, &err), STOF_ERR_INVALID);
        CHECK_CONTAINS(err.msg, "budget ran out before the initial scheme was measured");
        CHECK(t.calls <= 3 && r.seqs == NULL);
        synth_free(&t);

        /* the clock: one second a measurement, forty seconds allowed */
        synth u = {.per_call_s = 1.0};
        o = synth_options(&u, 5);
        o.time_limit_s = 40;
        if (run(&m, &u, &o, &r) == STOF_OK) {
            CHECK(u.calls <= 40 && u.calls >= 30);
            CHECK(r.stats.stopped_by_time && !r.stats.stopped_by_budget);
            CHECK(r.stats.seconds >= 40 && r.stats.seconds <= 41);
            search_result_free(&r);
        }
        synth_free(&u);

        /* bad arguments */
        search_backend none = {.measure = NULL};
        CHECK_EQ_INT(search_run(&m.g, m.seqs, m.n_seqs, &none, NULL, &r, &err), STOF_ERR_INVALID);
        fusion_scheme *bad = initial_with(&m, seq_of_layer(&m, 0), "00000000000000");
        synth v = {0};
        o = synth_options(&v, 5);
        o.initial = bad;
        b = synth_backend(&v);
        CHECK_EQ_INT(search_run(&m.g, m.seqs, m.n_seqs, &b, &o, &r, &err), STOF_ERR_INVALID);
        CHECK_CONTAINS(err.msg, "the initial scheme of sequence 1");
        CHECK_EQ_INT(v.calls, 0);
        synth_free(&v);
        free(bad);
    }
    model_free(&m);
}

/* The view of result segment k of sequence q under its chosen template. */
static search_segment result_view(const model *m, int q, const search_seg_result *sg,
                                  fusion_match *match) {
    int ops[FUSION_MAX_OPS];
    seq_ops(m, q, ops);
    fusion_match_segment(&m->g, ops + sg->first, sg->last - sg->first + 1, match, NULL);
    return (search_segment){&m->g, q, sg->first, sg->last, ops[sg->first], ops[sg->last],
                            sg->tmpl, match, match->dims};
}

/* Every segment of r has a setting that ran; how many are the backend's
 * default; the schemes are the rules' initial ones. */
static int check_initial_result(const model *m, const search_result *r, int *defaults) {
    fusion_scheme *init = calloc((size_t)m->n_seqs, sizeof *init);
    rules_initial(m, init);
    int segs = 0;
    *defaults = 0;
    check_result_sums(m, r);
    for (int q = 0; q < r->n_seqs; q++) {
        fusion_scheme_canonical(&init[q]);
        CHECK_MSG(fusion_scheme_equal(&init[q], &r->seqs[q].scheme), "sequence %d", q);
        for (int k = 0; k < r->seqs[q].n_segs; k++) {
            const search_seg_result *sg = &r->seqs[q].segs[k];
            fusion_match match;
            search_segment view = result_view(m, q, sg, &match);
            CHECK(isfinite(sg->ms) && sg->ms > 0);
            *defaults += is_synth_default(&view, sg->values);
            segs++;
        }
    }
    free(init);
    return segs;
}

/* A time limit that runs out before the initial scheme is measured: the
 * initial scheme is finished past it, the backend's default settings first
 * (prepared together), and a result and a plan come out. */
static void test_time_too_short(void) {
    model m;
    if (bert_small(&m, "seq=128") != STOF_OK) {
        model_free(&m);
        return;
    }
    /* the clock jumps past the limit at its first reading after the start:
     * not one setting is measured inside the limit */
    synth u = {.clock_step_s = 100};
    search_options o = synth_options(&u, 5);
    o.time_limit_s = 1;
    search_backend b = synth_prepare_backend(&u);
    b.default_setting = synth_default;
    search_result r;
    stof_error err = {0};
    int rc = search_run(&m.g, m.seqs, m.n_seqs, &b, &o, &r, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc == STOF_OK) {
        int defaults, segs = check_initial_result(&m, &r, &defaults);
        CHECK_EQ_INT(defaults, segs);
        CHECK(r.stats.stopped_by_time && !r.stats.stopped_by_budget);
        CHECK_EQ_INT(r.stats.measured_past_limit, u.calls);
        CHECK_EQ_INT(r.stats.measured, u.calls);
        CHECK(u.calls >= 1 && u.calls <= segs);
        CHECK_EQ_INT(synth_max_count(&u), 1);
        CHECK_EQ_INT(u.measured_unprepared, 0); /* prepared together, then measured */
        CHECK_EQ_INT(u.bad_values, 0);
        CHECK_EQ_INT(r.stats.rounds, 0);
        plan p, back;
        graph_script script = {.name = "bert.lua"};
        rc = plan_from_search(&r, &m.g, m.seqs, &script, NULL, "sm_90", &p, &err);
        CHECK_MSG(rc == STOF_OK, "%s", err.msg);
        char *text = NULL;
        if (rc == STOF_OK && plan_to_json(&p, &text, &err) == STOF_OK) {
            CHECK_EQ_INT(p.stats.settings_measured, u.calls);
            CHECK_EQ_INT(p.n_sequences, m.n_seqs);
            rc = plan_from_json(text, strlen(text), "cut.json", &back, &err);
            CHECK_MSG(rc == STOF_OK, "%s", err.msg);
            if (rc == STOF_OK)
                plan_free(&back);
        }
        free(text);
        plan_free(&p);
        search_result_free(&r);
    }
    synth_free(&u);

    /* the first measurement ran inside the limit, the rest past it; a
     * backend without defaults: each segment's first option */
    synth v = {.per_call_s = 1000};
    o = synth_options(&v, 5);
    o.time_limit_s = 1;
    b = synth_backend(&v);
    rc = search_run(&m.g, m.seqs, m.n_seqs, &b, &o, &r, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc == STOF_OK) {
        int defaults, segs = check_initial_result(&m, &r, &defaults);
        CHECK(r.stats.stopped_by_time);
        CHECK_EQ_INT(r.stats.measured_past_limit, v.calls - 1);
        CHECK(v.calls >= 2 && v.calls <= segs);
        CHECK_EQ_INT(synth_max_count(&v), 1);
        search_result_free(&r);
    }
    synth_free(&v);

    /* defaults that cannot run: the next settings of each segment's order
     * until one does */
    synth w = {.clock_step_s = 100, .defaults_fail = 1};
    o = synth_options(&w, 5);
    o.time_limit_s = 1;
    b = synth_prepare_backend(&w);
    b.default_setting = synth_default;
    rc = search_run(&m.g, m.seqs, m.n_seqs, &b, &o, &r, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc == STOF_OK) {
        int defaults, segs = check_initial_result(&m, &r, &defaults);
        CHECK_EQ_INT(defaults, 0);
        CHECK_EQ_INT(r.stats.measured_past_limit, w.calls);
        CHECK(w.calls > segs && w.calls <= 2 * segs);
        CHECK_EQ_INT(synth_max_count(&w), 1);
        search_result_free(&r);
    }
    synth_free(&w);
    model_free(&m);
}

/* A backend with template defaults: every segment measures each template's
 * default before any other setting of it, and the templates still come
 * first. */
static void test_template_defaults_first(void) {
    model m;
    if (bert_small(&m, "seq=128") != STOF_OK) {
        model_free(&m);
        return;
    }
    synth s = {0};
    search_options o = synth_options(&s, 42);
    search_backend b = synth_backend(&s);
    b.template_default = synth_template_default;
    search_result r;
    stof_error err = {0};
    int rc = search_run(&m.g, m.seqs, m.n_seqs, &b, &o, &r, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc == STOF_OK) {
        CHECK_EQ_INT(s.bad_values, 0);
        CHECK_EQ_INT(synth_max_count(&s), 1);
        check_templates_first(&s);
        check_defaults_first(&s, 1);
        check_result_sums(&m, &r);
        search_result_free(&r);
    }
    synth_free(&s);
    model_free(&m);
}

/* ==== stage 2 ================================================================================================ */

static void expect_shares(const double *reward, const int *room, int n, int total, int round,
                          const int *want) {
    int share[8];
    search_allocate(reward, room, n, total, round, share);
    int same = 1, sum = 0;
    for (int i = 0; i < n; i++) {
        same &= share[i] == want[i];
        sum += share[i];
    }
    CHECK_MSG(same, "shares %d %d %d %d, expected %d %d %d %d", share[0], share[1],
              n > 2 ? share[2] : 0, n > 3 ? share[3] : 0, want[0], want[1], n > 2 ? want[2] : 0,
              n > 3 ? want[3] : 0);
    (void)sum;
}

static void test_allocate(void) {
    const double none[4] = {0, 0, 0, 0}, some[4] = {0, 5, 1, 0};
    const int room[4] = {100, 100, 100, 100}, tight[4] = {100, 2, 100, 0};
    /* no reward: equal, the remainder rotating with the round */
    expect_shares(none, room, 4, 12, 0, (int[]){3, 3, 3, 3});
    expect_shares(none, room, 4, 6, 0, (int[]){2, 2, 1, 1});
    expect_shares(none, room, 4, 6, 1, (int[]){1, 2, 2, 1});
    /* rewards: half equal (6 = 2 + 2 + 1 + 1), half in proportion 5 : 1 */
    expect_shares(some, room, 4, 12, 0, (int[]){2, 7, 2, 1});
    /* no room: nothing given; what does not fit goes to the most rewarded */
    expect_shares(some, tight, 4, 12, 0, (int[]){2, 2, 8, 0});
    int share[4];
    search_allocate(none, (int[]){0, 0, 0, 0}, 4, 12, 0, share);
    CHECK(share[0] == 0 && share[1] == 0 && share[2] == 0 && share[3] == 0);
}

/* Only the attention's time depends on its parameters: after stage 1 it
 * is the one segment that can still improve, and once it does, the rewards
 * send it more of stage 2's samples than any other segment gets. */
static void test_rewards(void) {
    model m;
    if (bert_small(&m, "seq=128") != STOF_OK) {
        model_free(&m);
        return;
    }
    int q = seq_of_layer(&m, 0), attn = m.seqs[q].firsts[0] + 2, improved = 0;
    CHECK_EQ_INT(m.g.ops[attn].kind, OP_ATTENTION);
    for (uint64_t seed = 1; seed <= 8; seed++) {
        synth s = {.mode = SYNTH_SPREAD, .spread_op = attn};
        search_options o = synth_options(&s, seed);
        o.samples_per_candidate = 1;
        o.skip_expand = 1;
        search_result r;
        if (run(&m, &s, &o, &r) != STOF_OK)
            continue;
        long most_other = 0, mine = s.calls_in_stage2_by_op[attn];
        for (int i = 0; i < 512; i++)
            if (i != attn && s.calls_in_stage2_by_op[i] > most_other)
                most_other = s.calls_in_stage2_by_op[i];
        /* a gain in stage 2 means a reward, and a reward a larger share */
        int gained = s.spread_best[SEARCH_STAGE_SAMPLE] > 0 &&
                     s.spread_best[SEARCH_STAGE_SAMPLE] < s.spread_best[SEARCH_STAGE_INITIAL];
        improved += gained;
        if (gained)
            CHECK_MSG(mine > most_other, "seed %d: attention got %ld stage-2 samples, another "
                      "segment %ld", (int)seed, mine, most_other);
        else
            CHECK_EQ_INT(mine, most_other);
        search_result_free(&r);
        synth_free(&s);
    }
    CHECK(improved >= 4);
    /* savings under min_gain of the forward pass are no gain: with the
     * attention's settings 0.1% apart stage 2 stops after `patience` rounds,
     * while counting any saving it goes on */
    int longer = 0;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        int rounds[2] = {0, 0};
        for (int any = 0; any < 2; any++) {
            synth s = {.mode = SYNTH_SPREAD, .spread_op = attn, .spread_scale = 0.001};
            search_options o = synth_options(&s, seed);
            o.samples_per_candidate = 1;
            o.skip_expand = 1;
            o.patience = 2;
            o.min_gain = any ? -1 : 0;
            search_result r;
            if (run(&m, &s, &o, &r) == STOF_OK) {
                rounds[any] = r.stats.rounds;
                search_result_free(&r);
            }
            synth_free(&s);
        }
        CHECK_EQ_INT(rounds[0], 2);
        longer += rounds[1] > 2;
    }
    CHECK_MSG(longer >= 3, "counting any saving, only %d of 6 seeds went past 2 rounds", longer);
    /* nothing depends on parameters: stage 2 stops after `patience` idle rounds */
    synth s = {.mode = SYNTH_SPREAD, .spread_op = -1};
    search_options o = synth_options(&s, 1);
    o.patience = 2;
    search_result r;
    if (run(&m, &s, &o, &r) == STOF_OK) {
        CHECK_EQ_INT(r.stats.rounds, 2);
        search_result_free(&r);
    }
    synth_free(&s);
    model_free(&m);
}

int main(void) {
    test_cache_memory();
    test_cache_file();
    test_cache_across_runs();
    test_sequences();
    test_initial();
    test_compete();
    test_seize();
    test_expand();
    test_split();
    test_rollback();
    test_full_runs();
    test_seeds();
    test_prepare();
    test_budget_and_time();
    test_time_too_short();
    test_template_defaults_first();
    test_allocate();
    test_rewards();
    return check_summary("test_search");
}
