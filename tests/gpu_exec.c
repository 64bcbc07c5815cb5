/* Whole models on the GPU through the executor, against the fp32 CPU
 * reference on the same seed.
 *
 * Models: bert-small (batch 2, seq 128, bigbird mask), gpt2 with 2 layers
 * (batch 2, seq 128, causal), t5-small with 2 + 2 layers (batch 2, seq 64,
 * dec_seq 32: relative position bias, causal self-attention, cross-
 * attention). Each runs under several fusion schemes of its layer classes:
 * all unfused, the default (greedy) scheme, three more valid schemes that
 * run on implemented templates (picked from the enumeration of every valid
 * scheme), the default scheme with per-segment choices (attention
 * forced row-wise, forced block-wise, explicit GEMM tiles, every GEMM
 * segment cuBLASLt matches on cublaslt, and the same with ALGO 3: it runs,
 * or model creation says STOF_ERR_UNSUPPORTED when cuBLASLt's heuristic
 * offered fewer algorithms), and schemes fusing gemm [bias] add norm into
 * gemm_ln, the same on gemm_epilogue's norm build (sm_90 only: clusters
 * holding whole rows) and the FFN (gemm [bias] act gemm [bias] [add]) into
 * gemm_chain: each with at least one segment per layer on that template.
 *
 * Checked per run: the model builds and runs; the output has no NaN or
 * infinity and its relative error ||gpu - cpu|| / ||cpu|| is below 1e-2
 * (fp16); the CUDA graph replay gives bit-identical output to the eager
 * run. Printed: segments, peak activation memory, eager and graph-replay
 * latency (median of 20; argv[1] = "notime" skips the timing). Then an
 * arena too big for any GPU: STOF_ERR_DEVICE_OOM naming its size, and the
 * next model still runs. Last, bert-small and t5 with every weight from a
 * safetensors file (other values than the seed's, the fused QKV and KV
 * projections assembled from their parts): the GPU output matches the CPU
 * reference on the same file.
 *
 * Exit 77 with "SKIPPED: <reason>" when there is no GPU. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu_open.h"
#include "core/gpu/device.h"
#include "core/exec/exec.h"
#include "core/lua/lua_api.h"
#include "core/io/safetensors.h"
#include "core/base/util.h"
#include "core/io/weights.h"
#include "fusion/templates.h"
#include "gpu_recap.h"

#define SCRIPTS STOF_SOURCE_DIR "/scripts/"
#define TOL_F16 1e-2
#define REPS 20
#define SEED 1
#define MAX_PICKS 4096

static const weights_source seeded = {.seed = SEED};

typedef struct model_case {
    const char *label, *script;
    const char *params[6];
    int n_params;
} model_case;

static const model_case cases[] = {
    {"bert-small b2 s128 bigbird", SCRIPTS "bert.lua",
     {"preset=small", "batch=2", "seq=128", "mask=bigbird"}, 4},
    {"gpt2 2 layers b2 s128", SCRIPTS "gpt2.lua", {"layers=2", "batch=2", "seq=128"}, 3},
    {"t5-small 2+2 layers b2 s64/32", SCRIPTS "t5.lua",
     {"layers=2", "batch=2", "seq=64", "dec_seq=32"}, 4},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

/* ---- schemes ------------------------------------------------------------------------------- */

/* Per-segment choices applied after planning. */
typedef enum choice {
    CHOICE_NONE,
    CHOICE_ATTN_ROW,
    CHOICE_ATTN_BLOCK,
    CHOICE_GEMM_TILES,
    CHOICE_CUBLASLT,      /* every segment cuBLASLt matches and runs, its favourite algorithm */
    CHOICE_CUBLASLT_ALGO3, /* the same with ALGO 3: runs, or STOF_ERR_UNSUPPORTED when the
                              heuristic offered fewer than 4 algorithms */
    CHOICE_GEMM_NORM       /* every gemm_ln segment on gemm_epilogue's norm build (sm_90),
                              its default setting */
} choice;

typedef struct config {
    char name[64];
    fusion_scheme *schemes; /* per sequence (class representatives read) */
    choice choice;
    int expect;             /* a template that some segment must run on, or -1 */
} config;

typedef struct pick_state {
    const graph *g;
    const exec_seq *seq;
    fusion_scheme *found;
    int n;
} pick_state;

static int collect(const fusion_scheme *s, void *ud) {
    pick_state *st = ud;
    if (exec_scheme_check(st->g, st->seq, s, NULL) == STOF_OK && st->n < MAX_PICKS)
        st->found[st->n++] = *s;
    return st->n >= MAX_PICKS;
}

/* Every valid scheme of each layer class that runs on implemented
 * templates: found[c] (count n_found[c]) for the c-th class. */
static int enumerate_classes(const graph *g, const exec_seq *seqs, int n, fusion_scheme **found,
                             int *n_found, int *reps, int *n_classes) {
    stof_error err = {0};
    *n_classes = 0;
    for (int i = 0; i < n; i++) {
        if (seqs[i].layer < 0 || seqs[i].cls != i)
            continue;
        int c = (*n_classes)++;
        reps[c] = i;
        found[c] = calloc(MAX_PICKS, sizeof **found);
        pick_state st = {g, &seqs[i], found[c], 0};
        int ops[FUSION_MAX_OPS];
        for (int k = 0; k < seqs[i].n; k++)
            ops[k] = seqs[i].first + k;
        long long count = 0;
        int rc = fusion_enumerate_valid(g, ops, seqs[i].n, collect, &st, &count, &err);
        CHECK_MSG(rc == STOF_OK, "enumerating: %s", err.msg);
        n_found[c] = st.n;
        printf("  layer class %d (%d ops): %lld valid schemes, %d on implemented templates\n", c,
               seqs[i].n, count, st.n);
    }
    return STOF_OK;
}

static fusion_scheme *new_schemes(int n) {
    return calloc((size_t)n, sizeof(fusion_scheme));
}

/* A scheme of sequence q fusing, from each op on, the longest segment (up
 * to 6 ops) that matches template t and runs on it; other ops alone. */
static void fuse_into(const graph *g, const exec_seq *q, fusion_template_id t,
                      fusion_scheme *out) {
    fusion_segment segs[FUSION_MAX_OPS];
    int n_segs = 0;
    for (int i = 0; i < q->n;) {
        int len = 1;
        for (int l = q->n - i < 6 ? q->n - i : 6; l > 1 && len == 1; l--) {
            int ops[6];
            fusion_match m;
            for (int k = 0; k < l; k++)
                ops[k] = q->first + i + k;
            if (fusion_match_segment(g, ops, l, &m, NULL) == STOF_OK &&
                fusion_match_has(&m, t) &&
                exec_segment_supports(g, q->first + i, l, &m, t, NULL) == STOF_OK)
                len = l;
        }
        segs[n_segs++] = (fusion_segment){i, i + len - 1};
        i += len;
    }
    stof_error err = {0};
    CHECK_MSG(fusion_scheme_from_segments(segs, n_segs, q->n, out, &err) == STOF_OK, "%s",
              err.msg);
}

/* The configurations a model runs under. */
static int make_configs(const graph *g, const exec_seq *seqs, int n, config *out, int max) {
    fusion_scheme *found[8] = {0};
    int n_found[8] = {0}, reps[8], n_classes = 0, k = 0;
    enumerate_classes(g, seqs, n, found, n_found, reps, &n_classes);
    fusion_scheme def[8], unf[8];
    for (int c = 0; c < n_classes; c++) {
        exec_default_scheme(g, &seqs[reps[c]], &def[c], NULL);
        fusion_scheme_all_unfused(&unf[c], seqs[reps[c]].n, NULL);
    }
    /* unfused, default, default with choices */
    out[k] = (config){"unfused", new_schemes(n), CHOICE_NONE, -1};
    k++;
    static const struct { const char *name; choice ch; int expect; } with_def[] = {
        {"default", CHOICE_NONE, -1},
        {"default, attention row-wise", CHOICE_ATTN_ROW, -1},
        {"default, attention block-wise", CHOICE_ATTN_BLOCK, -1},
        {"default, GEMM tiles 64x64x64", CHOICE_GEMM_TILES, -1},
        {"default, cuBLASLt GEMMs", CHOICE_CUBLASLT, FUSION_T_CUBLASLT},
        {"default, cuBLASLt GEMMs ALGO 3", CHOICE_CUBLASLT_ALGO3, FUSION_T_CUBLASLT},
    };
    for (size_t d = 0; d < sizeof with_def / sizeof with_def[0] && k < max; d++, k++) {
        out[k] = (config){"", new_schemes(n), with_def[d].ch, with_def[d].expect};
        snprintf(out[k].name, sizeof out[k].name, "%s", with_def[d].name);
        for (int c = 0; c < n_classes; c++)
            out[k].schemes[reps[c]] = def[c];
    }
    /* gemm [bias] add norm as gemm_ln; the FFN as gemm_chain */
    static const struct {
        const char *name;
        fusion_template_id t;
        choice ch;
        fusion_template_id expect;
    } fused[] = {
        {"gemm_ln (gemm [bias] add norm)", FUSION_T_GEMM_LN, CHOICE_NONE, FUSION_T_GEMM_LN},
        {"gemm_epilogue's norm (gemm [bias] add norm)", FUSION_T_GEMM_LN, CHOICE_GEMM_NORM,
         FUSION_T_GEMM_EPILOGUE},
        {"gemm_chain (the FFN)", FUSION_T_GEMM_CHAIN, CHOICE_NONE, FUSION_T_GEMM_CHAIN},
    };
    for (size_t f = 0; f < sizeof fused / sizeof fused[0] && k < max; f++, k++) {
        out[k] = (config){"", new_schemes(n), fused[f].ch, (int)fused[f].expect};
        snprintf(out[k].name, sizeof out[k].name, "%s", fused[f].name);
        for (int c = 0; c < n_classes; c++)
            fuse_into(g, &seqs[reps[c]], fused[f].t, &out[k].schemes[reps[c]]);
    }
    /* three more from the enumeration, spread over it, none the default or unfused */
    for (int q = 1; q <= 3 && k < max; q++) {
        out[k] = (config){"", new_schemes(n), CHOICE_NONE, -1};
        snprintf(out[k].name, sizeof out[k].name, "enumerated %d/4", q);
        for (int c = 0; c < n_classes; c++) {
            int at = n_found[c] * q / 4, tries = 0;
            while (tries++ < n_found[c] &&
                   (fusion_scheme_same_segments(&found[c][at], &def[c]) ||
                    fusion_scheme_same_segments(&found[c][at], &unf[c])))
                at = (at + 1) % n_found[c];
            if (n_found[c] > 0)
                out[k].schemes[reps[c]] = found[c][at];
        }
        k++;
    }
    for (int c = 0; c < n_classes; c++)
        free(found[c]);
    return k;
}

/* ---- one run ------------------------------------------------------------------------------- */

typedef struct gpu {
    exec_ctx *ctx;
    int notime;
    int pdl;  /* kernels launched as programmatic dependent launches (sm_90, STOF_PDL unset) */
    int dead; /* a CUDA error left the context unusable */
} gpu;

static int apply_choice(exec_plan *p, choice ch, stof_error *err) {
    static const int tiles[] = {64, 64, 64, 4, 4, 1}, algo3[] = {3};
    for (int s = 0; s < p->n_segs; s++) {
        const exec_segment *sg = &p->segs[s];
        int rc = STOF_OK;
        /* a choice spreads to the segment's whole class; repeating it is harmless */
        if ((ch == CHOICE_ATTN_ROW || ch == CHOICE_ATTN_BLOCK) && sg->auto_attention)
            rc = exec_plan_set_choice(
                p, s, ch == CHOICE_ATTN_ROW ? FUSION_T_ATTENTION_ROW : FUSION_T_ATTENTION_BLOCK,
                NULL, err);
        else if (ch == CHOICE_GEMM_NORM && sg->tmpl == FUSION_T_GEMM_LN &&
                 exec_segment_supports(p->g, sg->first, sg->n, &sg->match,
                                       FUSION_T_GEMM_EPILOGUE, NULL) == STOF_OK)
            rc = exec_plan_set_choice(p, s, FUSION_T_GEMM_EPILOGUE, NULL, err);
        else if (ch == CHOICE_GEMM_TILES && sg->tmpl == FUSION_T_GEMM_EPILOGUE)
            rc = exec_plan_set_choice(p, s, FUSION_T_GEMM_EPILOGUE, tiles, err);
        else if ((ch == CHOICE_CUBLASLT || ch == CHOICE_CUBLASLT_ALGO3) &&
                 fusion_match_has(&sg->match, FUSION_T_CUBLASLT) &&
                 exec_segment_supports(p->g, sg->first, sg->n, &sg->match, FUSION_T_CUBLASLT,
                                       NULL) == STOF_OK)
            rc = exec_plan_set_choice(p, s, FUSION_T_CUBLASLT,
                                      ch == CHOICE_CUBLASLT_ALGO3 ? algo3 : NULL, err);
        if (rc)
            return rc;
    }
    return STOF_OK;
}

static void print_schemes(const exec_plan *p) {
    char hex[FUSION_SCHEME_HEX_MAX], bin[FUSION_SCHEME_BINARY_MAX];
    for (int i = 0; i < p->n_seqs; i++) {
        if (p->seqs[i].layer < 0 || p->seqs[i].cls != i)
            continue;
        fusion_scheme_format_hex(&p->schemes[i], hex, sizeof hex);
        fusion_scheme_format_binary(&p->schemes[i], bin, sizeof bin);
        printf("    layer %d class: %s %s\n", p->seqs[i].layer, hex, bin);
    }
}

/* exec_model_profile: a positive, finite time for every segment, adding up
 * to more than half the CUDA graph's pass (when it was timed: graph_ms > 0). */
static int check_profile(exec_model *m, const exec_plan *p, const model_case *mc,
                         const config *cf, double graph_ms) {
    stof_error err = {0};
    double *seg = calloc((size_t)p->n_segs, sizeof *seg);
    int ok = seg && exec_model_profile(m, 3, seg, &err) == STOF_OK;
    CHECK_MSG(ok, "%s / %s: profile: %s", mc->label, cf->name, seg ? err.msg : "out of memory");
    double sum = 0;
    for (int s = 0; ok && s < p->n_segs; s++) {
        CHECK_MSG(seg[s] > 0 && isfinite(seg[s]), "%s / %s: profile: segment %d took %g ms",
                  mc->label, cf->name, s, seg[s]);
        ok &= seg[s] > 0 && isfinite(seg[s]);
        sum += seg[s];
    }
    if (ok && graph_ms > 0) {
        CHECK_MSG(sum > 0.5 * graph_ms, "%s / %s: profile: segments add up to %.3f ms, the "
                  "graph's pass takes %.3f", mc->label, cf->name, sum, graph_ms);
        ok &= sum > 0.5 * graph_ms;
    }
    free(seg);
    return ok;
}

/* exec_model_graph_edges: one dependency at least, and with programmatic
 * dependent launch on (sm_90, STOF_PDL unset) some of them programmatic
 * unless every kernel is cuBLASLt's; with it off, none in a plan without
 * cuBLASLt (which may chain its own kernels programmatically, a GEMM and
 * its split-K reduction). */
static int check_graph_edges(const exec_model *m, const exec_plan *p, const model_case *mc,
                             const config *cf, int pdl) {
    stof_error err = {0};
    exec_graph_edges e;
    int ok = exec_model_graph_edges(m, &e, &err) == STOF_OK;
    CHECK_MSG(ok, "%s / %s: graph edges: %s", mc->label, cf->name, err.msg);
    int own = 0;
    for (int s = 0; s < p->n_segs; s++)
        own += exec_model_template(m, s) != FUSION_T_CUBLASLT;
    int want_some = pdl && own > 1, want_none = !pdl && own == p->n_segs;
    int good = ok && e.edges > 0 && e.programmatic <= e.edges &&
               (!want_some || e.programmatic > 0) && (!want_none || e.programmatic == 0);
    CHECK_MSG(!ok || good, "%s / %s: %zu dependencies, %zu programmatic (PDL %s)", mc->label,
              cf->name, e.edges, e.programmatic, pdl ? "on" : "off");
    return ok && good;
}

/* The segments of a plan that gemm_epilogue's norm build can take: a GEMM
 * closing with a norm, [N, K] weights. */
static int norm_eligible(const exec_plan *p) {
    int n = 0;
    for (int s = 0; s < p->n_segs; s++) {
        const exec_segment *sg = &p->segs[s];
        n += sg->match.epi[0].norm != FUSION_NORM_NONE && p->g->ops[sg->first].kind == OP_GEMM &&
             exec_segment_supports(p->g, sg->first, sg->n, &sg->match, FUSION_T_GEMM_EPILOGUE,
                                   NULL) == STOF_OK;
    }
    return n;
}

static void run_config(gpu *gp, const model_case *mc, const graph *g, const config *cf,
                       const float *ref) {
    if (cf->choice == CHOICE_GEMM_NORM && !device_wgmma_arch(exec_ctx_arch(gp->ctx))) {
        printf("  %s: skipped, the norm build runs on sm_90 (this is %s)\n", cf->name,
               exec_ctx_arch(gp->ctx));
        return;
    }
    n_runs++;
    stof_error err = {0};
    exec_plan *p = NULL;
    exec_model *m = NULL;
    int64_t n = graph_tensor_numel(&g->tensors[g->output]);
    float *eager = malloc(sizeof *eager * (size_t)n), *replay = malloc(sizeof *replay * (size_t)n);
    const char *stage = "plan";
    int rc = exec_plan_create(g, cf->schemes, &p, &err);
    if (!rc)
        rc = apply_choice(p, cf->choice, &err);
    if (!rc) {
        printf("  %s: %d segments, arena %.2f MB (live bound %.2f MB)\n", cf->name, p->n_segs,
               p->arena_bytes / 1e6, p->live_bound / 1e6);
        print_schemes(p);
        stage = "model";
        rc = exec_model_create(gp->ctx, p, &seeded, &m, &err);
    }
    if (!rc) {
        stage = "eager run";
        rc = exec_model_run(m, &err);
    }
    if (!rc)
        rc = exec_model_output(m, eager, &err);
    if (!rc) {
        stage = "capture";
        rc = exec_model_capture(m, &err);
    }
    if (!rc) {
        stage = "replay";
        rc = exec_model_replay(m, &err);
    }
    if (!rc)
        rc = exec_model_output(m, replay, &err);
    if (rc == STOF_ERR_UNSUPPORTED && cf->choice == CHOICE_CUBLASLT_ALGO3 &&
        strcmp(stage, "model") == 0 && strstr(err.msg, "ALGO")) {
        /* the heuristic offered fewer algorithms: infeasible, said so */
        printf("    not offered: %s\n", err.msg);
    } else if (rc) {
        CHECK_MSG(0, "%s / %s: %s: %s", mc->label, cf->name, stage, err.msg);
        recap_add("%s / %s: %s failed: %s", mc->label, cf->name, stage, err.msg);
        gp->dead |= rc == STOF_ERR_CUDA;
    } else {
        exec_diff d;
        exec_compare(eager, ref, n, &d);
        int same = memcmp(eager, replay, sizeof *eager * (size_t)n) == 0;
        int ok = d.n_nonfinite == 0 && d.rel_error < TOL_F16 && same;
        CHECK_MSG(d.n_nonfinite == 0, "%s / %s: %lld non-finite outputs", mc->label, cf->name,
                  (long long)d.n_nonfinite);
        CHECK_MSG(d.rel_error < TOL_F16, "%s / %s: relative error %.3e", mc->label, cf->name,
                  d.rel_error);
        CHECK_MSG(same, "%s / %s: graph replay differs from the eager run", mc->label,
                  cf->name);
        double eager_ms = 0, graph_ms = 0;
        if (!gp->notime && (exec_model_time(m, 0, REPS, &eager_ms, &err) ||
                            exec_model_time(m, 1, REPS, &graph_ms, &err))) {
            CHECK_MSG(0, "%s / %s: timing: %s", mc->label, cf->name, err.msg);
            ok = 0;
        }
        ok &= check_profile(m, p, mc, cf, graph_ms);
        ok &= check_graph_edges(m, p, mc, cf, gp->pdl);
        int attn_row = 0, attn_block = 0, expected = 0, need = g->n_layers;
        for (int s = 0; s < p->n_segs; s++) {
            fusion_template_id t = exec_model_template(m, s);
            attn_row += t == FUSION_T_ATTENTION_ROW;
            attn_block += t == FUSION_T_ATTENTION_BLOCK;
            expected += (int)t == cf->expect;
        }
        if (cf->choice == CHOICE_GEMM_NORM) /* [K, N] weights (kn = true) stay on gemm_ln */
            need = norm_eligible(p);
        if (cf->expect >= 0) {
            CHECK_MSG(expected >= need, "%s / %s: %d segments on %s, %d expected", mc->label,
                      cf->name, expected,
                      fusion_template_get((fusion_template_id)cf->expect)->name, need);
            ok &= expected >= need;
            printf("    %d segments on %s\n", expected,
                   fusion_template_get((fusion_template_id)cf->expect)->name);
        }
        if (cf->choice == CHOICE_ATTN_ROW)
            CHECK_MSG(attn_block == 0, "%s / %s: forced row-wise", mc->label, cf->name);
        if (cf->choice == CHOICE_ATTN_BLOCK)
            CHECK_MSG(attn_row == 0, "%s / %s: forced block-wise", mc->label, cf->name);
        printf("    %s rel error %.3e, max abs %.3e, replay %s; attention %d row-wise %d "
               "block-wise; eager %.3f ms, graph %.3f ms\n", ok ? "ok  " : "FAIL", d.rel_error,
               d.max_abs, same ? "identical" : "DIFFERS", attn_row, attn_block, eager_ms,
               graph_ms);
        if (!ok)
            recap_add("%s / %s: rel error %.3e, %lld non-finite, replay %s", mc->label, cf->name,
                      d.rel_error, (long long)d.n_nonfinite, same ? "identical" : "differs");
    }
    exec_model_free(m);
    exec_plan_free(p);
    free(eager);
    free(replay);
}

static void run_case(gpu *gp, const model_case *mc) {
    graph g;
    stof_error err = {0};
    graph_init(&g);
    int rc = lua_api_build(mc->script, mc->params, mc->n_params, &g, NULL, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", mc->label, err.msg);
    if (rc) {
        graph_free(&g);
        return;
    }
    printf("%s: %d ops, %d layers\n", mc->label, g.n_ops, g.n_layers);
    double t0 = util_now();
    float *ref = NULL;
    rc = exec_reference(&g, &seeded, &ref, &err);
    CHECK_MSG(rc == STOF_OK, "%s: CPU reference: %s", mc->label, err.msg);
    printf("  CPU reference: %.1f s\n", util_now() - t0);
    exec_seq *seqs = NULL;
    int n = 0;
    if (!rc)
        rc = fusion_sequences(&g, &seqs, &n, &err);
    config cf[16];
    int n_cf = rc ? 0 : make_configs(&g, seqs, n, cf, 16);
    CHECK_MSG(rc || n_cf >= 12, "%s: %d configurations", mc->label, n_cf);
    for (int c = 0; c < n_cf; c++) {
        if (!gp->dead)
            run_config(gp, mc, &g, &cf[c], ref);
        free(cf[c].schemes);
    }
    free(seqs);
    free(ref);
    graph_free(&g);
}

/* Out of device memory: a clear error naming the bytes, nothing left
 * behind, and the context still runs a model afterwards. */
static void test_oom(gpu *gp) {
    const model_case *mc = &cases[1];
    graph g;
    stof_error err = {0};
    graph_init(&g);
    exec_plan *p = NULL;
    exec_model *m = NULL;
    int rc = lua_api_build(mc->script, mc->params, mc->n_params, &g, NULL, &err);
    if (!rc)
        rc = exec_plan_create(&g, NULL, &p, &err);
    CHECK_MSG(rc == STOF_OK, "oom setup: %s", err.msg);
    if (!rc) {
        size_t real = p->arena_bytes;
        p->arena_bytes = (size_t)1 << 50; /* a pebibyte */
        rc = exec_model_create(gp->ctx, p, &seeded, &m, &err);
        CHECK_EQ_INT(rc, STOF_ERR_DEVICE_OOM);
        CHECK(m == NULL);
        CHECK_CONTAINS(err.msg, "the activation arena of 1125899906842624 bytes");
        printf("out of memory: %s\n", err.msg);
        p->arena_bytes = real;
        rc = exec_model_create(gp->ctx, p, &seeded, &m, &err);
        CHECK_MSG(rc == STOF_OK, "after the OOM: %s", err.msg);
        if (!rc)
            CHECK_MSG(exec_model_run(m, &err) == STOF_OK, "after the OOM: %s", err.msg);
        gp->dead |= rc == STOF_ERR_CUDA;
    }
    exec_model_free(m);
    exec_plan_free(p);
    graph_free(&g);
}

/* ---- weights from a file ------------------------------------------------------------------- */

/* Writes the weights of g drawn from seed as F32 checkpoint tensors: an
 * assembled weight as its parts (equal rows each, as the scripts' QKV and
 * KV projections are), a weight read transposed as its transpose [K, N]
 * (GPT-2's Conv1D). */
static int export_weights(const graph *g, uint64_t seed, const char *path, stof_error *err) {
    int n = 0, cap = g->n_tensors * 3;
    safetensors_entry *e = calloc((size_t)cap, sizeof *e);
    float **data = calloc((size_t)g->n_tensors, sizeof *data);
    for (int t = 0; e && data && t < g->n_tensors; t++) {
        const graph_tensor *x = &g->tensors[t];
        if (x->role != GRAPH_WEIGHT)
            continue;
        data[t] = malloc(sizeof *data[t] * (size_t)graph_tensor_numel(x));
        if (!data[t])
            break;
        weights_fill(x, seed, data[t]);
        const graph_source *s = graph_source_of(g, t);
        if (s && s->transposed) {
            float *kn = malloc(sizeof *kn * (size_t)graph_tensor_numel(x));
            if (!kn)
                break;
            for (int64_t r = 0; r < x->shape[0]; r++)
                for (int64_t c = 0; c < x->shape[1]; c++)
                    kn[c * x->shape[0] + r] = data[t][r * x->shape[1] + c];
            free(data[t]);
            data[t] = kn;
        }
        int parts = s ? s->n : 1;
        int64_t row = graph_tensor_numel(x) / x->shape[0], first = 0;
        for (int k = 0; k < parts && n < cap; k++, n++) {
            int64_t rows = s ? s->part_rows[k] : x->shape[0];
            e[n] = (safetensors_entry){s ? graph_source_part(g, s, k) : x->name,
                                       SAFETENSORS_F32, x->ndim, {0}, data[t] + first * row};
            for (int d = 0; d < x->ndim; d++)
                e[n].shape[d] = x->shape[d];
            e[n].shape[0] = rows;
            first += rows;
            if (s && s->transposed) {
                e[n].shape[0] = x->shape[1];
                e[n].shape[1] = x->shape[0];
            }
        }
    }
    int rc = e && data ? safetensors_write(path, e, n, err) : STOF_ERR_NOMEM;
    for (int t = 0; data && t < g->n_tensors; t++)
        free(data[t]);
    free(data);
    free(e);
    return rc;
}

/* The model of mc with every weight from a file of seed SEED + 1's values
 * (inputs drawn from that seed too): the GPU output against the CPU
 * reference with the same file, which equals the reference of seed
 * SEED + 1 exactly. */
static void test_weights_file(gpu *gp, const model_case *mc) {
    const char *path = STOF_BINARY_DIR "/tests/gpu_exec_weights.safetensors";
    graph g;
    stof_error err = {0};
    graph_init(&g);
    safetensors_file *f = NULL;
    exec_plan *p = NULL;
    exec_model *m = NULL;
    float *ref = NULL, *ref_seeded = NULL, *y = NULL;
    int64_t n = 0;
    int rc = lua_api_build(mc->script, mc->params, mc->n_params, &g, NULL, &err);
    if (!rc)
        rc = export_weights(&g, SEED + 1, path, &err);
    if (!rc)
        rc = safetensors_open(path, &f, &err);
    weights_source src = {.seed = SEED + 1, .weights = f};
    weights_source other = weights_source_seeded(SEED + 1);
    if (!rc)
        rc = exec_reference(&g, &src, &ref, &err);
    if (!rc)
        rc = exec_reference(&g, &other, &ref_seeded, &err);
    if (!rc) {
        n = graph_tensor_numel(&g.tensors[g.output]);
        CHECK_MSG(memcmp(ref, ref_seeded, sizeof *ref * (size_t)n) == 0,
                  "%s: the reference with the file differs from seed %d's", mc->label, SEED + 1);
        rc = exec_plan_create(&g, NULL, &p, &err);
    }
    if (!rc)
        rc = exec_model_create(gp->ctx, p, &src, &m, &err);
    if (!rc && !(y = malloc(sizeof *y * (size_t)n)))
        rc = STOF_ERR_NOMEM;
    if (!rc)
        rc = exec_model_run(m, &err);
    if (!rc)
        rc = exec_model_output(m, y, &err);
    CHECK_MSG(rc == STOF_OK, "%s with weights from a file: %s", mc->label, err.msg);
    if (!rc) {
        exec_diff d;
        exec_compare(y, ref, n, &d);
        char line[1024];
        weights_source_describe(&src, &g, line, sizeof line);
        printf("%s, %s: rel error %.3e, %lld non-finite\n", mc->label, line, d.rel_error,
               (long long)d.n_nonfinite);
        CHECK_MSG(d.n_nonfinite == 0 && d.rel_error < TOL_F16,
                  "%s with weights from a file: rel error %.3e", mc->label, d.rel_error);
    }
    gp->dead |= rc == STOF_ERR_CUDA;
    exec_model_free(m);
    exec_plan_free(p);
    safetensors_close(f);
    free(ref);
    free(ref_seeded);
    free(y);
    graph_free(&g);
}

int main(int argc, char **argv) {
    gpu gp = {0};
    GPU_TEST_OPEN(exec_ctx_create, gp.ctx, "gpu_exec");
    gp.notime = argc > 1 && strcmp(argv[1], "notime") == 0;
    const char *pdl = getenv("STOF_PDL");
    const stof_device_info *d = exec_ctx_device(gp.ctx);
    gp.pdl = d->cc_major >= 9 && !(pdl && strcmp(pdl, "0") == 0);
    printf("GPU: %s (%s, %d SMs)\n", d->name, exec_ctx_arch(gp.ctx), d->sm_count);
    for (int c = 0; c < N_CASES && !gp.dead; c++)
        run_case(&gp, &cases[c]);
    if (!gp.dead)
        test_oom(&gp);
    for (int c = 0; c < N_CASES && !gp.dead; c += 2)
        test_weights_file(&gp, &cases[c]); /* bert-small and t5: assembled QKV and KV */
    if (gp.dead)
        printf("STOPPED EARLY: a CUDA error left the context unusable (see above)\n");
    exec_ctx_free(gp.ctx);
    recap_print();
    return check_summary("gpu_exec");
}
