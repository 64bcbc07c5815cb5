/* The executor's planning, without a GPU: sequences and classes, schemes
 * to segments to templates for bert, gpt2 and t5 (unfused, the default
 * scheme, fused ones; gemm_ln, gemm_chain and cublaslt segments), refusals,
 * the activation buffers (lifetimes, no two live ones sharing bytes, the
 * arena against the live-set bound), per-segment choices, and the error
 * paths that need no device. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/exec/exec.h"
#include "core/lua/lua_api.h"
#include "core/base/util.h"
#include "fusion/templates.h"
#include "ops/ops.h"

#define SCRIPTS STOF_SOURCE_DIR "/scripts/"

static const char *const bert_params[] = {"preset=small", "batch=2", "seq=128", "mask=bigbird"};
static const char *const gpt2_params[] = {"layers=2", "batch=2", "seq=128"};
static const char *const t5_params[] = {"layers=2", "batch=2", "seq=64", "dec_seq=32"};

/* ---- helpers --------------------------------------------------------------------------- */

static int build_script(const char *script, const char *const *params, int n, graph *g) {
    stof_error err = {0};
    graph_init(g);
    int rc = lua_api_build(script, params, n, g, NULL, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", script, err.msg);
    return rc;
}

static int build_inline(const char *src, graph *g) {
    stof_error err = {0};
    graph_init(g);
    int rc = lua_api_build_string(src, "model.lua", NULL, NULL, 0, g, NULL, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    return rc;
}

/* Schemes for every class representative: texts[c] for the c-th layer
 * class (binary or hex, "default", or NULL: unfused); sequences outside
 * layers unfused. n_texts 1 applies texts[0] to every layer class. */
static int make_schemes(const graph *g, const char *const *texts, int n_texts,
                        fusion_scheme **out, stof_error *err) {
    exec_seq *seqs;
    int n, rc = fusion_sequences(g, &seqs, &n, err);
    if (rc)
        return rc;
    fusion_scheme *s = calloc((size_t)n, sizeof *s);
    int c = 0;
    for (int i = 0; i < n && !rc; i++) {
        if (seqs[i].layer < 0 || seqs[i].cls != i)
            continue;
        const char *t = texts[n_texts > 1 ? c : 0];
        c++;
        if (!t)
            continue;
        rc = strcmp(t, "default") == 0 ? exec_default_scheme(g, &seqs[i], &s[i], err)
                                       : fusion_scheme_parse(t, seqs[i].n, &s[i], err);
    }
    free(seqs);
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return STOF_OK;
}

static int plan_with(const graph *g, const char *const *texts, int n_texts, exec_plan **p,
                     stof_error *err) {
    fusion_scheme *s = NULL;
    int rc = make_schemes(g, texts, n_texts, &s, err);
    if (!rc)
        rc = exec_plan_create(g, s, p, err);
    free(s);
    return rc;
}

static int ranges_overlap(const exec_buffer *a, const exec_buffer *b) {
    return a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
}

static int lives_overlap(const exec_buffer *a, const exec_buffer *b) {
    return a->first <= b->last && b->first <= a->last;
}

/* No two buffers live at once share a byte; all lie in the arena. */
static void check_arena(const exec_buffer *b, int n, size_t arena, size_t bound) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        bad += b[i].offset + b[i].bytes > arena;
        for (int j = i + 1; j < n; j++)
            bad += lives_overlap(&b[i], &b[j]) && ranges_overlap(&b[i], &b[j]);
    }
    CHECK_MSG(bad == 0, "%d buffer conflicts", bad);
    CHECK_MSG(arena >= bound, "arena %zu below the live bound %zu", arena, bound);
}

/* Everything a plan promises, checked against its graph. */
static void check_plan(const graph *g, const exec_plan *p) {
    int next = 0, bad = 0;
    for (int s = 0; s < p->n_segs; s++) {
        const exec_segment *sg = &p->segs[s];
        bad += sg->first != next;
        next = sg->first + sg->n;
        bad += !exec_template_implemented(sg->tmpl);
        bad += !fusion_match_has(&sg->match, sg->tmpl);
        /* its result has a buffer written here; what it reads from outside is live */
        int ob = p->buf_of[sg->out];
        bad += ob < 0 || p->bufs[ob].first != s;
        for (int o = sg->first; o < sg->first + sg->n; o++)
            for (int k = 0; k < g->ops[o].n_inputs; k++) {
                int t = g->ops[o].inputs[k], prod = g->tensors[t].producer;
                if (prod >= sg->first && prod < sg->first + sg->n)
                    continue;
                if (g->tensors[t].role == GRAPH_WEIGHT || g->tensors[t].role == GRAPH_INPUT) {
                    bad += p->buf_of[t] >= 0;
                    continue;
                }
                int b = p->buf_of[t];
                bad += b < 0 || p->bufs[b].first > s || p->bufs[b].last < s;
            }
        /* intermediates stay inside, unless stored as the pre-norm input */
        for (int o = sg->first; o + 1 < sg->first + sg->n; o++) {
            int t = g->ops[o].output;
            bad += (p->buf_of[t] >= 0) != (t == sg->pre_norm);
        }
    }
    CHECK_MSG(bad == 0 && next == g->n_ops, "%d plan inconsistencies (ops covered %d of %d)",
              bad, next, g->n_ops);
    CHECK_EQ_INT(p->bufs[p->buf_of[g->output]].last, p->n_segs);
    for (int b = 0; b < p->n_bufs; b++)
        CHECK(p->bufs[b].bytes % EXEC_ALIGN == 0 && p->bufs[b].offset % EXEC_ALIGN == 0);
    check_arena(p->bufs, p->n_bufs, p->arena_bytes, p->live_bound);
}

/* The segment holding graph op `op`. */
static const exec_segment *segment_of(const exec_plan *p, int op) {
    for (int s = 0; s < p->n_segs; s++)
        if (op >= p->segs[s].first && op < p->segs[s].first + p->segs[s].n)
            return &p->segs[s];
    return NULL;
}

static void scheme_bits(const fusion_scheme *s, char *buf) {
    fusion_scheme_format_binary(s, buf, FUSION_SCHEME_BINARY_MAX);
}

/* ---- the arena --------------------------------------------------------------------------- */

static void test_arena(void) {
    size_t arena, bound;
    exec_arena_assign(NULL, 0, &arena, &bound);
    CHECK_EQ_INT(arena, 0);

    /* a chain: each buffer read by the next step only; the best fit reaches
     * the bound (the largest neighbouring pair) */
    util_rng rng = {7};
    for (int trial = 0; trial < 50; trial++) {
        exec_buffer b[40];
        int n = 2 + (int)(util_rng_next(&rng) % 39);
        for (int i = 0; i < n; i++)
            b[i] = (exec_buffer){-1, i, i + 1, EXEC_ALIGN * (1 + util_rng_next(&rng) % 64), 0};
        exec_arena_assign(b, n, &arena, &bound);
        check_arena(b, n, arena, bound);
        size_t pair = 0;
        for (int i = 0; i + 1 < n; i++)
            if (b[i].bytes + b[i + 1].bytes > pair)
                pair = b[i].bytes + b[i + 1].bytes;
        CHECK_EQ_INT(bound, pair);
        CHECK_MSG(arena == bound, "chain of %d: arena %zu, bound %zu", n, arena, bound);
    }

    /* a residual stream: x lives across the block while others come and go */
    exec_buffer r[] = {{-1, 0, 4, 1024, 0}, {-1, 1, 2, 4096, 0}, {-1, 2, 3, 1024, 0},
                       {-1, 3, 4, 1024, 0}, {-1, 4, 5, 1024, 0}};
    exec_arena_assign(r, 5, &arena, &bound);
    check_arena(r, 5, arena, bound);
    CHECK_EQ_INT(bound, 6144);
    CHECK_EQ_INT(arena, 6144);

    /* random lifetimes: never a conflict, never below the bound */
    for (int trial = 0; trial < 200; trial++) {
        exec_buffer b[60];
        int n = 1 + (int)(util_rng_next(&rng) % 60);
        for (int i = 0; i < n; i++) {
            int first = (int)(util_rng_next(&rng) % 30);
            b[i] = (exec_buffer){-1, first, first + (int)(util_rng_next(&rng) % 8),
                                 EXEC_ALIGN * (1 + util_rng_next(&rng) % 100), 0};
        }
        exec_arena_assign(b, n, &arena, &bound);
        check_arena(b, n, arena, bound);
        size_t sum = 0;
        for (int i = 0; i < n; i++)
            sum += b[i].bytes;
        CHECK(arena <= sum);
    }
}

/* ---- sequences ------------------------------------------------------------------------------ */

static void test_sequences(void) {
    graph g;
    if (build_script(SCRIPTS "t5.lua", t5_params, 4, &g))
        return;
    exec_seq *s;
    int n;
    stof_error err = {0};
    CHECK_EQ_INT(fusion_sequences(&g, &s, &n, &err), STOF_OK);
    /* embedding | enc 0 | enc 1 | final norm, embedding | dec 0 | dec 1 | final norm */
    CHECK_EQ_INT(n, 7);
    if (n == 7) {
        int layer[] = {-1, 0, 1, -1, 2, 3, -1}, cls[] = {0, 1, 1, 3, 4, 4, 6};
        for (int i = 0; i < 7; i++) {
            CHECK_EQ_INT(s[i].layer, layer[i]);
            CHECK_EQ_INT(s[i].cls, cls[i]);
        }
        char buf[96];
        CHECK_CONTAINS(exec_seq_name(&s[3], buf, sizeof buf), "outside layers");
        CHECK_CONTAINS(exec_seq_name(&s[4], buf, sizeof buf), "layer 2");
    }
    free(s);
    graph_free(&g);
}

/* ---- plans of the shipped models ---------------------------------------------------------- */

/* Unfused: one segment per op, on the kernel of its kind. */
static void check_unfused(const char *script, const char *const *params, int n_params) {
    graph g;
    if (build_script(script, params, n_params, &g))
        return;
    exec_plan *p = NULL;
    stof_error err = {0};
    int rc = exec_plan_create(&g, NULL, &p, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", script, err.msg);
    if (rc) {
        graph_free(&g);
        return;
    }
    CHECK_EQ_INT(p->n_segs, g.n_ops);
    int bad = 0;
    for (int s = 0; s < p->n_segs; s++) {
        const exec_segment *sg = &p->segs[s];
        op_kind k = g.ops[sg->first].kind;
        fusion_template_id want = k == OP_GEMM        ? FUSION_T_GEMM_EPILOGUE
                                  : k == OP_ATTENTION ? FUSION_T_ATTENTION_ROW
                                  : k == OP_EMBEDDING ? FUSION_T_EMBEDDING
                                                      : FUSION_T_MI_CHAIN;
        bad += sg->n != 1 || sg->tmpl != want || sg->auto_attention != (k == OP_ATTENTION);
    }
    CHECK_MSG(bad == 0, "%s: %d segments on the wrong template", script, bad);
    /* every activation has its buffer */
    for (int t = 0; t < g.n_tensors; t++)
        if (g.tensors[t].role == GRAPH_ACTIVATION || g.tensors[t].role == GRAPH_OUTPUT)
            bad += p->buf_of[t] < 0;
    CHECK_EQ_INT(bad, 0);
    check_plan(&g, p);
    printf("%s unfused: %d segments, %d buffers, arena %.2f MB, live bound %.2f MB, weights "
           "%.1f MB\n", g.name, p->n_segs, p->n_bufs, p->arena_bytes / 1e6,
           p->live_bound / 1e6, p->weight_bytes / 1e6);
    exec_plan_free(p);
    graph_free(&g);
}

static void test_unfused(void) {
    check_unfused(SCRIPTS "bert.lua", bert_params, 4);
    check_unfused(SCRIPTS "gpt2.lua", gpt2_params, 3);
    check_unfused(SCRIPTS "t5.lua", t5_params, 4);
}

/* The greedy default scheme of each layer class, as bits. */
static void check_default(const char *script, const char *const *params, int n_params,
                          const char *const *want, int n_want) {
    graph g;
    if (build_script(script, params, n_params, &g))
        return;
    exec_seq *s;
    int n, c = 0;
    stof_error err = {0};
    CHECK_EQ_INT(fusion_sequences(&g, &s, &n, &err), STOF_OK);
    for (int i = 0; i < n; i++) {
        if (s[i].cls != i)
            continue;
        fusion_scheme sc;
        char bits[FUSION_SCHEME_BINARY_MAX];
        CHECK_EQ_INT(exec_default_scheme(&g, &s[i], &sc, &err), STOF_OK);
        CHECK_MSG(exec_scheme_check(&g, &s[i], &sc, &err) == STOF_OK, "%s", err.msg);
        scheme_bits(&sc, bits);
        if (s[i].layer < 0) {
            /* nothing outside the layers fuses in these models */
            fusion_scheme u;
            fusion_scheme_all_unfused(&u, s[i].n, NULL);
            CHECK_MSG(fusion_scheme_same_segments(&sc, &u), "%s: %s outside layers", g.name,
                      bits);
        } else if (c < n_want) {
            CHECK_MSG(strcmp(bits, want[c]) == 0, "%s layer class %d: %s, expected %s", g.name,
                      c, bits, want[c]);
            c++;
        }
    }
    CHECK_EQ_INT(c, n_want);
    free(s);
    graph_free(&g);
}

static void test_default_scheme(void) {
    /* gemm bias | attention | gemm bias | add layernorm | gemm bias gelu | gemm bias |
     * add layernorm: a post-norm layer's residual adds stay with their norms */
    static const char *const bert[] = {"00100110001100"};
    check_default(SCRIPTS "bert.lua", bert_params, 4, bert, 1);
    /* layernorm | gemm bias | attention | gemm bias add | layernorm | gemm bias gelu |
     * gemm bias add */
    static const char *const gpt2[] = {"01101110111000"};
    check_default(SCRIPTS "gpt2.lua", gpt2_params, 3, gpt2, 1);
    /* encoder: rmsnorm | gemm | attention | gemm add | rmsnorm | gemm relu | gemm add;
     * decoder: the same, then rmsnorm | gemm | gemm | attention | gemm add before the FFN */
    static const char *const t5[] = {"0101101100", "0101101010010011"};
    check_default(SCRIPTS "t5.lua", t5_params, 4, t5, 2);
}

/* The default scheme planned: fused segments, their epilogues, no buffer
 * for what stays on chip. */
static void test_fused_bert(void) {
    graph g;
    if (build_script(SCRIPTS "bert.lua", bert_params, 4, &g))
        return;
    static const char *const def[] = {"default"};
    exec_plan *p = NULL;
    stof_error err = {0};
    int rc = plan_with(&g, def, 1, &p, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc) {
        graph_free(&g);
        return;
    }
    /* embedding, layernorm, then 7 segments in each of 4 layers */
    CHECK_EQ_INT(p->n_segs, 2 + 4 * 7);
    check_plan(&g, p);
    /* layer 0: #2 gemm, #3 bias, #4 attention, #5-#6 gemm bias, #7-#8 add layernorm,
     * #9-#11 gemm bias gelu, #12-#13 gemm bias, #14-#15 add layernorm */
    const exec_segment *qkv = segment_of(p, 2), *proj = segment_of(p, 5),
                       *ffn = segment_of(p, 9), *ln = segment_of(p, 7);
    CHECK(qkv && qkv->n == 2 && qkv->tmpl == FUSION_T_GEMM_EPILOGUE &&
          qkv->match.epi[0].has_bias && !qkv->match.epi[0].has_residual);
    CHECK(proj && proj->n == 2 && proj->match.epi[0].has_bias &&
          !proj->match.epi[0].has_residual);
    CHECK(ffn && ffn->n == 3 && ffn->match.epi[0].act == FUSION_ACT_GELU);
    CHECK(ln && ln->n == 2 && ln->tmpl == FUSION_T_MI_CHAIN &&
          ln->match.epi[0].has_residual && ln->match.epi[0].norm == FUSION_NORM_LAYERNORM);
    CHECK_EQ_INT(p->buf_of[g.ops[2].output], -1); /* the QKV GEMM before its bias */
    CHECK(p->buf_of[g.ops[3].output] >= 0);
    /* fusing needs less activation memory than not fusing */
    exec_plan *u = NULL;
    if (exec_plan_create(&g, NULL, &u, &err) == STOF_OK) {
        CHECK_MSG(p->arena_bytes < u->arena_bytes, "fused %zu, unfused %zu", p->arena_bytes,
                  u->arena_bytes);
        CHECK_EQ_INT(p->weight_bytes, u->weight_bytes);
        CHECK_EQ_INT(p->input_bytes, 2 * 128 * 4); /* int32 ids */
    }
    exec_plan_free(u);
    exec_plan_free(p);
    graph_free(&g);
}

/* GPT-2 with the residual stream's add fused into the next LayerNorm: the
 * chain also writes the add's result (store_pre_norm), which the block's
 * last add reads. */
static void test_pre_norm(void) {
    graph g;
    if (build_script(SCRIPTS "gpt2.lua", gpt2_params, 3, &g))
        return;
    /* ln_1 | gemm bias | attention | gemm | bias add ln_2 | gemm bias gelu | gemm bias add */
    static const char *const s[] = {"01101000111000"};
    exec_plan *p = NULL;
    stof_error err = {0};
    int rc = plan_with(&g, s, 1, &p, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc) {
        graph_free(&g);
        return;
    }
    check_plan(&g, p);
    /* layer 0 is ops #1-#14: bias #6, add #7, ln_2 #8; the block's last add is #14 */
    const exec_segment *chain = segment_of(p, 6);
    CHECK(chain && chain->first == 6 && chain->n == 3 && chain->tmpl == FUSION_T_MI_CHAIN);
    if (chain) {
        CHECK_EQ_INT(chain->pre_norm, g.ops[7].output);
        CHECK(chain->match.store_pre_norm && chain->match.epi[0].has_bias &&
              chain->match.epi[0].has_residual);
        int b = p->buf_of[chain->pre_norm];
        CHECK(b >= 0);
        if (b >= 0) {
            const exec_segment *last = segment_of(p, 14);
            CHECK_EQ_INT(p->bufs[b].first, (int)(chain - p->segs));
            CHECK_EQ_INT(p->bufs[b].last, (int)(last - p->segs));
        }
    }
    exec_plan_free(p);
    graph_free(&g);
}

/* T5: the decoder's cross-attention K/V projection reads the encoder output
 * from outside its layer; that buffer lives until the last decoder layer. */
static void test_t5_plan(void) {
    graph g;
    if (build_script(SCRIPTS "t5.lua", t5_params, 4, &g))
        return;
    static const char *const s[] = {"default", "default"};
    exec_plan *p = NULL;
    stof_error err = {0};
    int rc = plan_with(&g, s, 2, &p, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc) {
        graph_free(&g);
        return;
    }
    check_plan(&g, p);
    int enc_out = g.ops[11].output; /* encoder.final_layer_norm */
    CHECK_EQ_INT(g.ops[11].kind, OP_RMSNORM);
    int b = p->buf_of[enc_out], last_kv = -1;
    for (int o = 0; o < g.n_ops; o++)
        if (g.ops[o].kind == OP_GEMM && g.ops[o].inputs[0] == enc_out)
            last_kv = o;
    CHECK(b >= 0 && last_kv > 0);
    if (b >= 0 && last_kv > 0)
        CHECK_EQ_INT(p->bufs[b].last, (int)(segment_of(p, last_kv) - p->segs));
    /* the cross-attention segment */
    int cross = 0;
    for (int s2 = 0; s2 < p->n_segs; s2++)
        cross += g.ops[p->segs[s2].first].kind == OP_ATTENTION &&
                 g.ops[p->segs[s2].first].attr.attn.cross;
    CHECK_EQ_INT(cross, 2);
    exec_plan_free(p);
    graph_free(&g);
}

/* ---- the GEMM templates beyond gemm_epilogue ------------------------------------------------ */

/* A scheme of sequence q fusing, from each op on, the longest segment (up
 * to 6 ops) that matches one of the templates in want and runs on it;
 * other ops alone. */
static int fuse_into(const graph *g, const exec_seq *q, const fusion_template_id *want,
                     int n_want, fusion_scheme *out) {
    fusion_segment segs[FUSION_MAX_OPS];
    int n_segs = 0;
    for (int i = 0; i < q->n;) {
        int len = 1;
        for (int l = q->n - i < 6 ? q->n - i : 6; l > 1 && len == 1; l--) {
            int ops[6];
            fusion_match m;
            for (int k = 0; k < l; k++)
                ops[k] = q->first + i + k;
            if (fusion_match_segment(g, ops, l, &m, NULL) != STOF_OK)
                continue;
            for (int w = 0; w < n_want && len == 1; w++)
                if (fusion_match_has(&m, want[w]) &&
                    exec_segment_supports(g, q->first + i, l, &m, want[w], NULL) == STOF_OK)
                    len = l;
        }
        segs[n_segs++] = (fusion_segment){i, i + len - 1};
        i += len;
    }
    return fusion_scheme_from_segments(segs, n_segs, q->n, out, NULL);
}

/* gemm_ln and gemm_chain segments planned (the plan's first-launcher rule
 * gives them the template: nothing else matches), then cuBLASLt chosen for
 * every segment it matches and runs. */
static void check_fused_templates(const char *script, const char *const *params, int n_params,
                                  int want_pre_norm) {
    graph g;
    if (build_script(script, params, n_params, &g))
        return;
    exec_seq *seqs = NULL;
    int n = 0;
    stof_error err = {0};
    CHECK_EQ_INT(fusion_sequences(&g, &seqs, &n, &err), STOF_OK);
    fusion_scheme *sc = calloc((size_t)n, sizeof *sc);
    static const fusion_template_id want[] = {FUSION_T_GEMM_LN, FUSION_T_GEMM_CHAIN};
    for (int i = 0; i < n; i++)
        if (seqs[i].layer >= 0 && seqs[i].cls == i)
            CHECK_EQ_INT(fuse_into(&g, &seqs[i], want, 2, &sc[i]), STOF_OK);
    exec_plan *p = NULL;
    int rc = exec_plan_create(&g, sc, &p, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", g.name, err.msg);
    if (!rc) {
        check_plan(&g, p);
        int ln = 0, chain = 0, pre = 0, chain_add = 0;
        for (int s = 0; s < p->n_segs; s++) {
            const exec_segment *sg = &p->segs[s];
            ln += sg->tmpl == FUSION_T_GEMM_LN;
            chain += sg->tmpl == FUSION_T_GEMM_CHAIN;
            pre += sg->tmpl == FUSION_T_GEMM_LN && sg->pre_norm >= 0;
            chain_add += sg->tmpl == FUSION_T_GEMM_CHAIN && sg->match.epi[1].has_residual;
            if (sg->tmpl == FUSION_T_GEMM_LN)
                CHECK(g.ops[sg->first].kind == OP_GEMM &&
                      sg->match.epi[0].norm != FUSION_NORM_NONE && sg->match.epi[0].has_residual);
            if (sg->tmpl == FUSION_T_GEMM_CHAIN)
                CHECK(g.ops[sg->first].kind == OP_GEMM && sg->match.n_ci == 2 &&
                      sg->match.epi[0].act != FUSION_ACT_NONE);
        }
        printf("%s: %d gemm_ln segments (%d storing the pre-norm sum), %d gemm_chain (%d with "
               "the residual)\n", g.name, ln, pre, chain, chain_add);
        CHECK_MSG(ln >= g.n_layers && chain >= g.n_layers, "%s: %d gemm_ln, %d gemm_chain",
                  g.name, ln, chain);
        CHECK_MSG((pre > 0) == want_pre_norm, "%s: %d gemm_ln store the pre-norm sum", g.name,
                  pre);
    }
    exec_plan_free(p);
    p = NULL;
    /* the default scheme with cuBLASLt wherever it matches and runs */
    for (int i = 0; i < n; i++)
        if (seqs[i].layer >= 0 && seqs[i].cls == i)
            CHECK_EQ_INT(exec_default_scheme(&g, &seqs[i], &sc[i], &err), STOF_OK);
    rc = exec_plan_create(&g, sc, &p, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", g.name, err.msg);
    int lt = 0;
    for (int s = 0; !rc && s < p->n_segs; s++) {
        const exec_segment *sg = &p->segs[s];
        if (!fusion_match_has(&sg->match, FUSION_T_CUBLASLT) ||
            exec_segment_supports(&g, sg->first, sg->n, &sg->match, FUSION_T_CUBLASLT, NULL))
            continue;
        rc = exec_plan_set_choice(p, s, FUSION_T_CUBLASLT, NULL, &err);
        CHECK_MSG(rc == STOF_OK, "%s: %s", g.name, err.msg);
    }
    for (int s = 0; !rc && s < p->n_segs; s++)
        lt += p->segs[s].tmpl == FUSION_T_CUBLASLT;
    if (!rc) {
        check_plan(&g, p);
        CHECK_MSG(lt >= 2 * g.n_layers, "%s: %d segments on cublaslt", g.name, lt);
    }
    exec_plan_free(p);
    free(sc);
    free(seqs);
    graph_free(&g);
}

static void test_fused_templates(void) {
    check_fused_templates(SCRIPTS "bert.lua", bert_params, 4, 0);
    check_fused_templates(SCRIPTS "gpt2.lua", gpt2_params, 3, 1);
    check_fused_templates(SCRIPTS "t5.lua", t5_params, 4, 1);

    /* bert's two fusions by their scheme text */
    graph g;
    if (build_script(SCRIPTS "bert.lua", bert_params, 4, &g))
        return;
    exec_plan *p = NULL;
    stof_error err = {0};
    static const char *const ln[] = {"00100001110000"};
    CHECK_EQ_INT(plan_with(&g, ln, 1, &p, &err), STOF_OK);
    const exec_segment *sg = p ? segment_of(p, 5) : NULL;
    CHECK(sg && sg->first == 5 && sg->n == 4 && sg->tmpl == FUSION_T_GEMM_LN &&
          sg->pre_norm < 0);
    exec_plan_free(p);
    p = NULL;
    static const char *const chain[] = {"00100010000011"};
    CHECK_EQ_INT(plan_with(&g, chain, 1, &p, &err), STOF_OK);
    sg = p ? segment_of(p, 9) : NULL;
    CHECK(sg && sg->first == 9 && sg->n == 5 && sg->tmpl == FUSION_T_GEMM_CHAIN &&
          sg->match.epi[0].act == FUSION_ACT_GELU && sg->match.epi[1].has_bias &&
          !sg->match.epi[1].has_residual);
    if (p)
        check_plan(&g, p);
    exec_plan_free(p);
    graph_free(&g);
}

/* ---- what cannot run yet, and other refusals ---------------------------------------------- */

static void test_rejections(void) {
    graph g;
    if (build_script(SCRIPTS "bert.lua", bert_params, 4, &g))
        return;
    exec_plan *p = NULL;
    stof_error err = {0};
    /* an invalid scheme: the validator's reason */
    static const char *const bad[] = {"00000000000000"};
    CHECK_EQ_INT(plan_with(&g, bad, 1, &p, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "compute-intensive");
    /* a scheme of the wrong length given directly */
    exec_seq *seqs;
    int n;
    CHECK_EQ_INT(fusion_sequences(&g, &seqs, &n, &err), STOF_OK);
    fusion_scheme *s = calloc((size_t)n, sizeof *s);
    fusion_scheme_all_unfused(&s[seqs[1].cls], 5, NULL);
    CHECK_EQ_INT(exec_plan_create(&g, s, &p, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "5 ops but the sequence has 14");
    CHECK(p == NULL);
    /* the per-segment support check names the template */
    fusion_match m;
    int ops[] = {5, 6, 7, 8};
    CHECK_EQ_INT(fusion_match_segment(&g, ops, 4, &m, &err), STOF_OK);
    /* every template has a launcher now */
    for (int t = 0; t < FUSION_T_COUNT; t++)
        CHECK_MSG(exec_template_implemented((fusion_template_id)t), "%s",
                  fusion_template_get((fusion_template_id)t)->name);
    CHECK(!exec_template_implemented(FUSION_T_COUNT));
    CHECK_EQ_INT(exec_segment_supports(&g, 5, 4, &m, FUSION_T_GEMM_LN, &err), STOF_OK);
    CHECK_EQ_INT(exec_segment_supports(&g, 5, 4, &m, FUSION_T_CUBLASLT, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "does not match template cublaslt");
    CHECK_EQ_INT(exec_segment_supports(&g, 5, 4, &m, FUSION_T_MI_CHAIN, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "does not match template mi_chain");
    free(s);
    free(seqs);
    graph_free(&g);
}

/* MI chains the kernel does not compute: an add after the activation, a
 * softmax; fp32 models; an add of a value to itself after a GEMM. */
static void test_kernel_limits(void) {
    const char *src =
        "local m = stof.model{name = 't', dtype = 'fp16'}\n"
        "local x = m:input('x', {2, 8, 16})\n"
        "local r = m:input('r', {2, 8, 16})\n"
        "local a = m:gelu(x)\n"   /* #0 */
        "local b = m:add(a, r)\n" /* #1 */
        "local c = m:softmax(b)\n" /* #2 */
        "m:output(c)\nreturn m\n";
    graph g;
    if (build_inline(src, &g))
        return;
    stof_error err = {0};
    exec_seq *seqs;
    int n;
    CHECK_EQ_INT(fusion_sequences(&g, &seqs, &n, &err), STOF_OK);
    CHECK_EQ_INT(n, 1);
    fusion_scheme s;
    CHECK_EQ_INT(fusion_scheme_parse("001", 3, &s, &err), STOF_OK);
    CHECK_EQ_INT(exec_scheme_check(&g, &seqs[0], &s, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "segment #0-#1 (gelu add)");
    CHECK_CONTAINS(err.msg, "adds bias and residual first");
    /* the default scheme keeps them apart; the softmax still has no kernel */
    CHECK_EQ_INT(exec_default_scheme(&g, &seqs[0], &s, &err), STOF_OK);
    char bits[FUSION_SCHEME_BINARY_MAX];
    scheme_bits(&s, bits);
    CHECK_MSG(strcmp(bits, "010") == 0, "%s", bits);
    exec_plan *p = NULL;
    CHECK_EQ_INT(exec_plan_create(&g, &s, &p, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "segment #2 (softmax)");
    CHECK_CONTAINS(err.msg, "the mi_chain kernel has no softmax");
    free(seqs);
    graph_free(&g);

    const char *self_add =
        "local m = stof.model{name = 't', dtype = 'bf16'}\n"
        "local x = m:input('x', {1, 8, 16})\n"
        "local y = m:gemm(x, m:weight('w', {16, 16}))\n"
        "m:output(m:add(y, y))\nreturn m\n";
    if (build_inline(self_add, &g))
        return;
    CHECK_EQ_INT(fusion_sequences(&g, &seqs, &n, &err), STOF_OK);
    CHECK_EQ_INT(fusion_scheme_parse("00", 2, &s, &err), STOF_OK);
    CHECK_EQ_INT(exec_scheme_check(&g, &seqs[0], &s, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "adds the GEMM's result to itself");
    /* unfused it runs: add(y, y) as an MI chain with y as its residual */
    CHECK_EQ_INT(exec_plan_create(&g, NULL, &p, &err), STOF_OK);
    if (p) {
        CHECK_EQ_INT(p->dtype, STOF_BF16);
        check_plan(&g, p);
    }
    exec_plan_free(p);
    free(seqs);
    graph_free(&g);

    const char *fp32 =
        "local m = stof.model{name = 't', dtype = 'fp32'}\n"
        "local x = m:input('x', {1, 8, 16})\n"
        "m:output(m:relu(x))\nreturn m\n";
    if (build_inline(fp32, &g))
        return;
    stof_dtype dt;
    CHECK_EQ_INT(exec_model_dtype(&g, &dt, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "f16 or bf16");
    p = NULL;
    CHECK_EQ_INT(exec_plan_create(&g, NULL, &p, &err), STOF_ERR_UNSUPPORTED);
    CHECK(p == NULL);
    graph_free(&g);

    /* a head size the attention kernels do not take */
    const char *odd_head =
        "local m = stof.model{name = 't', dtype = 'fp16'}\n"
        "local x = m:input('x', {1, 16, 144})\n"
        "m:output(m:attention(x, {heads = 3, head_dim = 16}))\nreturn m\n";
    if (build_inline(odd_head, &g))
        return;
    CHECK_EQ_INT(exec_plan_create(&g, NULL, &p, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "segment #0 (attention)");
    CHECK_CONTAINS(err.msg, "head_dim 16");
    graph_free(&g);
}

/* A GEMM's template by default: gemv at one row (a vocabulary's head too), cuBLASLt at more rows
 * of an odd width (the tensor-core template takes no such width), gemm_epilogue for a width of
 * whole tiles. */
static void test_default_head(void) {
    static const struct {
        int rows, width;
        fusion_template_id want;
    } cases[] = {{1, 50257, FUSION_T_GEMV}, {2, 50257, FUSION_T_CUBLASLT},
                 {1, 1024, FUSION_T_GEMV}, {2, 1024, FUSION_T_GEMM_EPILOGUE},
                 {17, 1001, FUSION_T_CUBLASLT}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char src[320];
        snprintf(src, sizeof src,
                 "local m = stof.model{name = 't', dtype = 'fp16'}\n"
                 "local x = m:input('x', {%d, 1, 64})\n"
                 "m:output(m:gemm(x, m:weight('w', {%d, 64})))\nreturn m\n",
                 cases[i].rows, cases[i].width);
        graph g;
        if (build_inline(src, &g))
            return;
        exec_plan *p = NULL;
        stof_error err = {0};
        CHECK_EQ_INT(exec_plan_create(&g, NULL, &p, &err), STOF_OK);
        if (p)
            CHECK_MSG(p->n_segs == 1 && p->segs[0].tmpl == cases[i].want,
                      "case %zu: template %s", i, fusion_template_get(p->segs[0].tmpl)->name);
        exec_plan_free(p);
        graph_free(&g);
    }
}

/* ---- per-segment choices ------------------------------------------------------------------ */

static void test_choices(void) {
    graph g;
    if (build_script(SCRIPTS "bert.lua", bert_params, 4, &g))
        return;
    static const char *const def[] = {"default"};
    exec_plan *p = NULL;
    stof_error err = {0};
    if (plan_with(&g, def, 1, &p, &err) != STOF_OK) {
        CHECK_MSG(0, "%s", err.msg);
        graph_free(&g);
        return;
    }
    int attn = (int)(segment_of(p, 4) - p->segs), qkv = (int)(segment_of(p, 2) - p->segs);
    int block[] = {64, 64, 4};
    CHECK_EQ_INT(exec_plan_set_choice(p, attn, FUSION_T_ATTENTION_BLOCK, block, &err), STOF_OK);
    int set = 0;
    for (int s = 0; s < p->n_segs; s++)
        if (g.ops[p->segs[s].first].kind == OP_ATTENTION)
            set += p->segs[s].tmpl == FUSION_T_ATTENTION_BLOCK && !p->segs[s].auto_attention &&
                   p->segs[s].has_values && p->segs[s].values[0] == 64;
    CHECK_EQ_INT(set, 4); /* every layer of the class */
    int gemm[] = {64, 128, 32, 4, 3, 1};
    CHECK_EQ_INT(exec_plan_set_choice(p, qkv, FUSION_T_GEMM_EPILOGUE, gemm, &err), STOF_OK);
    CHECK(p->segs[qkv].has_values && p->segs[qkv].values[1] == 128);
    CHECK_EQ_INT(exec_plan_set_choice(p, qkv, FUSION_T_GEMM_EPILOGUE, NULL, &err), STOF_OK);
    CHECK(!p->segs[qkv].has_values);
    int off[] = {64, 100, 32, 4, 3, 1};
    CHECK_EQ_INT(exec_plan_set_choice(p, qkv, FUSION_T_GEMM_EPILOGUE, off, &err),
                 STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "BLOCK_N = 100 is not in its space");
    /* cuBLASLt runs the QKV projection (gemm bias), ALGO in 0..3 */
    CHECK_EQ_INT(exec_plan_set_choice(p, qkv, FUSION_T_CUBLASLT, NULL, &err), STOF_OK);
    CHECK(p->segs[qkv].tmpl == FUSION_T_CUBLASLT && !p->segs[qkv].has_values);
    int algo[] = {2};
    CHECK_EQ_INT(exec_plan_set_choice(p, qkv, FUSION_T_CUBLASLT, algo, &err), STOF_OK);
    CHECK(p->segs[qkv].has_values && p->segs[qkv].values[0] == 2);
    int algo_off[] = {4};
    CHECK_EQ_INT(exec_plan_set_choice(p, qkv, FUSION_T_CUBLASLT, algo_off, &err),
                 STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "ALGO = 4 is not in its space");
    /* the FFN's erf GELU is not cuBLASLt's: it does not match */
    int ffn = (int)(segment_of(p, 9) - p->segs);
    CHECK_EQ_INT(exec_plan_set_choice(p, ffn, FUSION_T_CUBLASLT, NULL, &err), STOF_ERR_INVALID);
    CHECK_EQ_INT(exec_plan_set_choice(p, attn, FUSION_T_GEMM_EPILOGUE, NULL, &err),
                 STOF_ERR_INVALID);
    CHECK_EQ_INT(exec_plan_set_choice(p, p->n_segs, FUSION_T_MI_CHAIN, NULL, &err),
                 STOF_ERR_INVALID);
    CHECK_EQ_INT(exec_plan_set_choice(p, qkv, FUSION_T_COUNT, NULL, &err), STOF_ERR_INVALID);
    exec_plan_free(p);
    graph_free(&g);
}

/* ---- comparing, the reference, the device --------------------------------------------------- */

static void test_compare(void) {
    float ref[] = {3, 4, 0, 0}, got[] = {3, 4, 0, 0};
    exec_diff d;
    exec_compare(got, ref, 4, &d);
    CHECK_NEAR(d.rel_error, 0, 0);
    got[2] = 0.5f;
    exec_compare(got, ref, 4, &d);
    CHECK_NEAR(d.rel_error, 0.1, 1e-12);
    CHECK_NEAR(d.max_abs, 0.5, 0);
    got[3] = NAN;
    exec_compare(got, ref, 4, &d);
    CHECK_EQ_INT(d.n_nonfinite, 1);
    CHECK(isinf(d.rel_error));

    /* the reference's output is ref_execute's, handed over */
    const char *src =
        "local m = stof.model{name = 't', dtype = 'fp16'}\n"
        "local x = m:input('x', {1, 4, 16})\n"
        "m:output(m:relu(m:gemm(x, m:weight('w', {16, 16}))))\nreturn m\n";
    graph g;
    if (build_inline(src, &g))
        return;
    float *a = NULL, *b = NULL;
    stof_error err = {0};
    weights_source five = weights_source_seeded(5);
    CHECK_EQ_INT(exec_reference(&g, &five, &a, &err), STOF_OK);
    CHECK_EQ_INT(exec_reference(&g, &five, &b, &err), STOF_OK);
    if (a && b) {
        CHECK(memcmp(a, b, 64 * sizeof *a) == 0);
        int negative = 0;
        for (int i = 0; i < 64; i++)
            negative += a[i] < 0;
        CHECK_EQ_INT(negative, 0);
    }
    free(a);
    free(b);
    graph_free(&g);
}

static void test_no_device(void) {
    exec_ctx *c = NULL;
    stof_error err = {0};
    int rc = exec_ctx_create(0, &c, &err);
    /* here: no GPU, and a clear reason; on a GPU machine a context */
    CHECK_MSG(rc == STOF_OK || rc == STOF_ERR_NO_DEVICE, "%d: %s", rc, err.msg);
    if (rc == STOF_ERR_NO_DEVICE) {
        CHECK(c == NULL);
        CHECK(err.msg[0] != '\0');
    }
    exec_ctx_free(c);
    exec_ctx_free(NULL);
    exec_model_free(NULL);
    exec_plan_free(NULL);
}

/* The GPU's token choice refuses what it cannot draw from before it needs a device, and its
 * unit of mass keeps a vocabulary's worth of probabilities within 62 bits. */
static void test_sampling_checks(void) {
    stof_error err = {0};
    exec_sampling how = {0.8f, 0, 1.0f};
    const CUdeviceptr d = 256; /* never read: the checks come first */
    const exec_tokens to = {.out = d};
    CHECK_EQ_INT(exec_sample_rows(NULL, d, STOF_F16, 0, 10, &how, d, d, &to, NULL, &err),
                 STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "sampling: 0 rows of 10 logits");
    CHECK_EQ_INT(exec_sample_rows(NULL, d, STOF_F16, 2, 10, &how, 0, d, &to, NULL, &err),
                 STOF_ERR_INVALID);
    how.temperature = -1.0f;
    CHECK_EQ_INT(exec_sample_rows(NULL, d, STOF_F16, 2, 10, &how, d, d, &to, NULL, &err),
                 STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "temperature -1 (> 0)");
    how = (exec_sampling){0.8f, -2, 1.0f};
    CHECK_EQ_INT(exec_sample_rows(NULL, d, STOF_F16, 2, 10, &how, d, d, &to, NULL, &err),
                 STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "top_k -2 (>= 0)");
    how = (exec_sampling){0.8f, 0, 1.5f};
    CHECK_EQ_INT(exec_sample_rows(NULL, d, STOF_F16, 2, 10, &how, d, d, &to, NULL, &err),
                 STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "top_p 1.5 (in (0, 1])");
    /* where the tokens go: somewhere; positions moved on along live ones; host memory with
     * positions and a stride */
    how = (exec_sampling){0.8f, 0, 1.0f};
    const exec_tokens bad[] = {{0}, {.out = d, .positions = d},
                               {.out = d, .live = d, .host = d, .host_stride = 4},
                               {.out = d, .live = d, .positions = d, .host = d}};
    const char *why[] = {"no output for the tokens", "positions advanced without live",
                         "need positions and a stride of at least 1 (4)",
                         "need positions and a stride of at least 1 (0)"};
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(exec_sample_rows(NULL, d, STOF_F16, 2, 10, &how, d, d, &bad[i], NULL, &err),
                     STOF_ERR_INVALID);
        CHECK_CONTAINS(err.msg, why[i]);
        CHECK_EQ_INT(exec_argmax_rows(NULL, d, STOF_F16, 2, 10, 0, &bad[i], NULL, &err),
                     STOF_ERR_INVALID);
        CHECK_CONTAINS(err.msg, "argmax: ");
        CHECK_CONTAINS(err.msg, why[i]);
    }
    CHECK_EQ_INT(exec_sample_rows(NULL, d, STOF_F16, 2, 10, &how, d, d, NULL, NULL, &err),
                 STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "sampling: no output for the tokens");
    CHECK(exec_sample_mass_unit(1) == ldexpf(1.0f, 62));
    CHECK(exec_sample_mass_unit(2) == ldexpf(1.0f, 61));
    CHECK(exec_sample_mass_unit(50257) == ldexpf(1.0f, 46));
    CHECK(exec_sample_mass_unit(65536) == ldexpf(1.0f, 46));
    CHECK(exec_sample_mass_unit(128256) == ldexpf(1.0f, 45));
    CHECK(exec_sample_mass_unit(INT32_MAX) == ldexpf(1.0f, 31));
}

/* ---- an fp32 residual stream beside a bf16 model -------------------------------------- */

static const char *const tiny_modernbert =
    "{\"model_type\": \"modernbert\", \"hidden_size\": 64, \"num_hidden_layers\": 3,"
    " \"num_attention_heads\": 2, \"intermediate_size\": 96, \"vocab_size\": 50,"
    " \"max_position_embeddings\": 64, \"norm_eps\": 1e-5, \"norm_bias\": false,"
    " \"hidden_activation\": \"gelu\", \"global_attn_every_n_layers\": 3,"
    " \"local_attention\": 8, \"global_rope_theta\": 160000.0,"
    " \"local_rope_theta\": 10000.0}";

static int build_modernbert(const char *dtype, const char *residual, graph *g,
                            stof_error *err) {
    char d[32], r[32];
    snprintf(d, sizeof d, "dtype=%s", dtype);
    snprintf(r, sizeof r, "residual=%s", residual);
    const char *params[] = {"batch=2", "seq=64", d, r};
    cJSON *c = cJSON_Parse(tiny_modernbert);
    graph_init(g);
    int rc = lua_api_build_config(SCRIPTS "modernbert.lua", params, 4, c, g, NULL, err);
    cJSON_Delete(c);
    return rc;
}

static int count_dtype(const graph *g, stof_dtype dt) {
    int n = 0;
    for (int i = 0; i < g->n_tensors; i++)
        n += g->tensors[i].dtype == dt;
    return n;
}

static int touches_f32(const graph *g, int first, int n) {
    for (int i = first; i < first + n; i++) {
        if (g->tensors[g->ops[i].output].dtype == STOF_F32)
            return 1;
        for (int k = 0; k < g->ops[i].n_inputs; k++)
            if (g->tensors[g->ops[i].inputs[k]].dtype == STOF_F32)
                return 1;
    }
    return 0;
}

/* ModernBERT in bf16 keeps its residual stream in fp32 (residual=auto): every add's sum is
 * fp32, every norm's output bf16; the default plan puts every segment that touches the stream
 * on mi_chain and leaves the GEMMs without the add; a GEMM with the add is refused. */
static void test_fp32_stream(void) {
    graph g;
    stof_error err = {0};
    int rc = build_modernbert("bf16", "auto", &g, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc)
        return;
    int adds = 0, norms = 0;
    for (int i = 0; i < g.n_ops; i++) {
        const graph_op *op = &g.ops[i];
        if (op->kind == OP_ADD) {
            adds++;
            CHECK_EQ_INT(g.tensors[op->output].dtype, STOF_F32);
        } else if (op->kind == OP_LAYERNORM) {
            norms++;
            CHECK_EQ_INT(g.tensors[op->output].dtype, STOF_BF16);
        }
    }
    CHECK_EQ_INT(adds, 6);
    CHECK_EQ_INT(count_dtype(&g, STOF_F32), 6);
    CHECK_EQ_INT(g.tensors[g.output].dtype, STOF_BF16);
    stof_dtype dt;
    CHECK_EQ_INT(exec_model_dtype(&g, &dt, &err), STOF_OK);
    CHECK_EQ_INT(dt, STOF_BF16);

    static const char *const def[] = {"default"};
    exec_plan *p = NULL;
    rc = plan_with(&g, def, 1, &p, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    int on_stream = 0;
    for (int s = 0; !rc && s < p->n_segs; s++) {
        const exec_segment *x = &p->segs[s];
        if (!touches_f32(&g, x->first, x->n))
            continue;
        on_stream++;
        CHECK_MSG(x->tmpl == FUSION_T_MI_CHAIN, "segment #%d-#%d on template %d", x->first,
                  x->first + x->n - 1, (int)x->tmpl);
    }
    /* layer 0: add+mlp_norm, add; layers 1 and 2: attn_norm too; then the final norm */
    CHECK_EQ_INT(on_stream, 2 + 3 + 3 + 1);
    exec_plan_free(p);

    /* the attention's output projection with its add: refused, and saying why */
    for (int i = 0; i + 1 < g.n_ops; i++) {
        if (g.ops[i].kind != OP_GEMM || g.ops[i + 1].kind != OP_ADD)
            continue;
        int ops[2] = {i, i + 1};
        fusion_match m;
        CHECK_EQ_INT(fusion_match_segment(&g, ops, 2, &m, &err), STOF_OK);
        stof_error e = {0};
        CHECK_EQ_INT(exec_segment_supports(&g, i, 2, &m, FUSION_T_CUBLASLT, &e),
                     STOF_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(e.msg, "fp32") && strstr(e.msg, "mi_chain"), "%s", e.msg);
        break;
    }
    graph_free(&g);

    /* residual=dtype keeps one dtype; fp16's auto too; a bad value names the choices */
    CHECK_EQ_INT(build_modernbert("bf16", "dtype", &g, &err), STOF_OK);
    CHECK_EQ_INT(count_dtype(&g, STOF_F32), 0);
    graph_free(&g);
    CHECK_EQ_INT(build_modernbert("fp16", "auto", &g, &err), STOF_OK);
    CHECK_EQ_INT(count_dtype(&g, STOF_F32), 0);
    graph_free(&g);
    CHECK_EQ_INT(build_modernbert("fp16", "fp32", &g, &err), STOF_OK);
    CHECK_EQ_INT(count_dtype(&g, STOF_F32), 6);
    graph_free(&g);
    CHECK(build_modernbert("bf16", "half", &g, &err) != STOF_OK);
    CHECK_MSG(strstr(err.msg, "residual 'half'") && strstr(err.msg, "auto, fp32 or dtype"),
              "%s", err.msg);
    graph_free(&g);
}

/* m:add's dtype option and the norms over an fp32 input, from a script. */
static void test_add_dtype(void) {
    static const char *const head =
        "local m = stof.model{name = 't', dtype = 'bf16'}\n"
        "local a = m:input('a', {2, 8})\n"
        "local b = m:input('b', {2, 8})\n"
        "local g = m:weight('g', {8}, {init = 'ones'})\n";
    struct {
        const char *body, *error; /* error: NULL when the script must build */
        stof_dtype out;
    } cases[] = {
        {"local s = m:add(a, b, {dtype = 'fp32'})\nm:output(m:rmsnorm(s, g))\n", NULL,
         STOF_BF16},
        {"m:output(m:add(a, b, {dtype = 'fp32'}))\n", NULL, STOF_F32},
        {"local h = m:input('h', {2, 8}, {dtype = 'fp16'})\nm:output(m:add(a, h))\n",
         "they must match", STOF_BF16},
        {"m:output(m:add(a, b, {dtype = 'int32'}))\n", "unknown dtype 'int32'", STOF_BF16},
        {"m:output(m:add(a, b, {dtypes = 'fp32'}))\n", "dtypes", STOF_BF16},
        {"local s = m:add(a, b, {dtype = 'fp32'})\n"
         "local h = m:weight('h', {8}, {dtype = 'fp16', init = 'ones'})\n"
         "m:output(m:layernorm(s, g, h))\n", "must match", STOF_BF16},
    };
    /* a model whose output is the fp32 sum: refused by the executor, saying why */
    {
        char src[1024];
        snprintf(src, sizeof src, "%s%sreturn m\n", head, cases[1].body);
        graph g;
        stof_error err = {0};
        stof_dtype dt;
        graph_init(&g);
        if (lua_api_build_string(src, "model.lua", NULL, NULL, 0, &g, NULL, &err) == STOF_OK) {
            CHECK_EQ_INT(exec_model_dtype(&g, &dt, &err), STOF_ERR_UNSUPPORTED);
            CHECK_MSG(strstr(err.msg, "is fp32 but the weights are bf16"), "%s", err.msg);
        }
        graph_free(&g);
    }
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char src[1024];
        snprintf(src, sizeof src, "%s%sreturn m\n", head, cases[c].body);
        graph g;
        stof_error err = {0};
        graph_init(&g);
        int rc = lua_api_build_string(src, "model.lua", NULL, NULL, 0, &g, NULL, &err);
        if (!cases[c].error) {
            CHECK_MSG(rc == STOF_OK, "case %zu: %s", c, err.msg);
            if (!rc)
                CHECK_EQ_INT(g.tensors[g.output].dtype, cases[c].out);
        } else {
            CHECK_MSG(rc != STOF_OK && strstr(err.msg, cases[c].error), "case %zu: %s", c,
                      err.msg);
        }
        graph_free(&g);
    }
}

int main(void) {
    test_fp32_stream();
    test_add_dtype();
    test_arena();
    test_sequences();
    test_unfused();
    test_default_scheme();
    test_fused_bert();
    test_pre_norm();
    test_t5_plan();
    test_fused_templates();
    test_rejections();
    test_default_head();
    test_kernel_limits();
    test_choices();
    test_compare();
    test_no_device();
    test_sampling_checks();
    return check_summary("test_exec");
}
