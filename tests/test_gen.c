/* Generation on the CPU reference (core/gen): tiny decoders built from their
 * config.json by the shipped scripts (GPT-2 with its head, GPT-Neo's local and
 * global layers, Mistral's grouped-query attention and sliding window, Llama)
 * on random weights; the cached decode gives the tokens and logits of
 * re-running the whole forward pass for every token, for greedy and sampled
 * generation, ragged prompts, stop tokens; the caches follow the masks; every
 * error path. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "core/base/util.h"
#include "core/gen/gen.h"
#include "core/plan/plan.h"
#include "core/lua/lua_api.h"
#include "ops/kv_cache.h"
#include "ops/mask.h"
#include "stof.h"

#define SCRIPTS STOF_SOURCE_DIR "/scripts/"

enum { BATCH = 3, LONGEST = 6, NEW = 10, CONTEXT = LONGEST + NEW - 1 };
static const int LENS[BATCH] = {6, 3, 1};

typedef struct tiny {
    const char *name, *script, *config;
    int64_t caps[4]; /* the cache slots each attention layer should get */
    int n_layers;
} tiny;

static const tiny models[] = {
    {"gpt2", "gpt2.lua",
     "{\"model_type\": \"gpt2\", \"architectures\": [\"GPT2LMHeadModel\"], \"n_embd\": 32,"
     " \"n_layer\": 2, \"n_head\": 2, \"vocab_size\": 40, \"n_positions\": 32}",
     {CONTEXT, CONTEXT}, 2},
    {"gpt-neo", "gpt_neo.lua",
     "{\"model_type\": \"gpt_neo\", \"architectures\": [\"GPTNeoForCausalLM\"],"
     " \"hidden_size\": 32, \"num_layers\": 2, \"num_heads\": 2, \"vocab_size\": 40,"
     " \"max_position_embeddings\": 32, \"window_size\": 4,"
     " \"attention_types\": [[[\"global\", \"local\"], 1]]}",
     {CONTEXT, 4}, 2},
    {"mistral", "mistral.lua",
     "{\"model_type\": \"mistral\", \"architectures\": [\"MistralForCausalLM\"],"
     " \"hidden_size\": 32, \"intermediate_size\": 48, \"num_hidden_layers\": 2,"
     " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8,"
     " \"vocab_size\": 40, \"max_position_embeddings\": 64, \"sliding_window\": 5,"
     " \"tie_word_embeddings\": false}",
     {5, 5}, 2},
    {"llama", "mistral.lua",
     "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"],"
     " \"hidden_size\": 32, \"intermediate_size\": 48, \"num_hidden_layers\": 1,"
     " \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"vocab_size\": 40,"
     " \"max_position_embeddings\": 64, \"tie_word_embeddings\": true}",
     {CONTEXT}, 1},
};

/* The model at (batch, seq), fp32, from its config; extra: one more --set. */
static int build(const tiny *t, int batch, int seq, const char *extra, graph *g,
                 stof_error *err) {
    char b[32], s[32], path[512];
    snprintf(b, sizeof b, "batch=%d", batch);
    snprintf(s, sizeof s, "seq=%d", seq);
    snprintf(path, sizeof path, SCRIPTS "%s", t->script);
    const char *params[] = {b, s, "dtype=fp32", extra};
    cJSON *config = cJSON_Parse(t->config);
    graph_init(g);
    int rc = lua_api_build_config(path, params, extra ? 4 : 3, config, g, NULL, err);
    cJSON_Delete(config);
    return rc;
}

typedef struct fixture {
    graph prefill, context;
    gen_model m;
    int32_t ids[BATCH * LONGEST];
    gen_prompts p;
} fixture;

static int fixture_open(const tiny *t, fixture *f, stof_error *err) {
    memset(f, 0, sizeof *f);
    int rc = build(t, BATCH, LONGEST, NULL, &f->prefill, err);
    if (!rc)
        rc = build(t, BATCH, CONTEXT, NULL, &f->context, err);
    for (int k = 0; k < BATCH * LONGEST; k++)
        f->ids[k] = (k * 7 + 3) % 40;
    f->m = (gen_model){&f->prefill, &f->context, weights_source_seeded(11), NULL};
    f->p = (gen_prompts){BATCH, f->ids, LONGEST, LENS};
    return rc;
}

static void fixture_close(fixture *f) {
    graph_free(&f->prefill);
    graph_free(&f->context);
}

static double max_rel_diff(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return den > 0 ? num / den : num;
}

/* The cached run against recomputing everything: the same tokens, logits within fp32
 * rounding. */
static void check_against_recompute(const tiny *t, fixture *f, gen_options o) {
    stof_error err = {0};
    gen_result cached, full;
    o.recompute = 0;
    int rc = gen_run_cpu(&f->m, &f->p, &o, 1, &cached, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", t->name, err.msg);
    o.recompute = 1;
    int rc2 = gen_run_cpu(&f->m, &f->p, &o, 1, &full, &err);
    CHECK_MSG(rc2 == STOF_OK, "%s recompute: %s", t->name, err.msg);
    if (rc || rc2)
        return;
    CHECK_MSG(memcmp(cached.tokens, full.tokens, sizeof *full.tokens * BATCH * NEW) == 0,
              "%s (temperature %g): the cached tokens differ from recomputing", t->name,
              (double)o.temperature);
    double d = max_rel_diff(cached.logits, full.logits, (size_t)NEW * BATCH * 40);
    CHECK_MSG(d < 1e-4, "%s: logits differ by %g (relative to the largest)", t->name, d);
    CHECK_EQ_INT(cached.steps, NEW);   /* the prefill and NEW - 1 steps */
    CHECK(cached.cache_bytes > 0 && full.cache_bytes == 0);
    for (int b = 0; b < BATCH; b++)
        CHECK_EQ_INT(cached.n_new[b], NEW);
    gen_result_free(&cached);
    gen_result_free(&full);
}

/* The caches follow the masks: a window keeps its window, a dense layer the context. */
static void check_caches(const tiny *t, fixture *f) {
    gen_decoder d;
    stof_error err = {0};
    int rc = gen_decoder_build(&f->context, &d, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", t->name, err.msg);
    if (rc)
        return;
    CHECK_EQ_INT(d.n_layers, t->n_layers);
    for (int l = 0; l < d.n_layers && l < t->n_layers; l++)
        CHECK_MSG(d.layers[l].cap == t->caps[l], "%s layer %d: %lld slots, expected %lld",
                  t->name, l, (long long)d.layers[l].cap, (long long)t->caps[l]);
    CHECK_EQ_INT(d.context, CONTEXT);
    CHECK_EQ_INT(d.vocab, 40);
    /* every attention reads the attentions' positions; the embedding and rotary the others */
    CHECK(d.attn_positions >= 0 && d.attn_positions != d.positions &&
          strcmp(d.g.tensors[d.attn_positions].name, "attention_position_ids") == 0);
    int attn = 0, others = 0;
    for (int i = 0; i < d.g.n_ops; i++) {
        const graph_op *op = &d.g.ops[i];
        for (int k = 0; k < op->n_inputs; k++) {
            attn += op->inputs[k] == d.attn_positions && op->kind == OP_ATTENTION && k == 1;
            others += op->inputs[k] == d.positions && op->kind != OP_ATTENTION;
            CHECK(!(op->inputs[k] == d.positions && op->kind == OP_ATTENTION));
        }
    }
    CHECK_EQ_INT(attn, d.n_layers);
    CHECK(others >= 1);
    /* the step reads each weight from a file as the model does (GPT-2's Conv1D transposed) */
    int transposed = 0, same = 1;
    for (int w = 0; w < d.g.n_tensors; w++) {
        if (d.g.tensors[w].role != GRAPH_WEIGHT || d.g.tensors[w].constant)
            continue; /* the caches are the step's own */
        int mw = graph_find_tensor(&f->context, d.g.tensors[w].name);
        const graph_source *a = graph_source_of(&d.g, w);
        const graph_source *b = mw >= 0 ? graph_source_of(&f->context, mw) : NULL;
        same &= mw >= 0 && !a == !b;
        same &= !a || !b || (a->n == b->n && a->row_offset == b->row_offset &&
                             a->transposed == b->transposed &&
                             strcmp(graph_source_part(&d.g, a, 0),
                                    graph_source_part(&f->context, b, 0)) == 0);
        transposed += a && a->transposed;
    }
    CHECK_MSG(same, "%s: the step's weight sources differ from the model's", t->name);
    CHECK_EQ_INT(transposed, strcmp(t->script, "gpt2.lua") == 0 ? 4 * t->n_layers : 0);
    gen_decoder_free(&d);
}

/* Decoders whose heads the GPU kernels take (sizes 32): the executor's plans of them. */
static const tiny gpu_shaped[] = {
    {"gpt2 (heads of 32)", "gpt2.lua",
     "{\"model_type\": \"gpt2\", \"architectures\": [\"GPT2LMHeadModel\"], \"n_embd\": 64,"
     " \"n_layer\": 3, \"n_head\": 2, \"vocab_size\": 40, \"n_positions\": 32}",
     {CONTEXT, CONTEXT, CONTEXT}, 3},
    {"mistral (heads of 32)", "mistral.lua",
     "{\"model_type\": \"mistral\", \"architectures\": [\"MistralForCausalLM\"],"
     " \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2,"
     " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 32,"
     " \"vocab_size\": 40, \"max_position_embeddings\": 64, \"sliding_window\": 5,"
     " \"tie_word_embeddings\": false}",
     {5, 5}, 2},
};

/* A plan of the model at the prefill's shape whose every class of layers runs unfused
 * (unlike the default scheme); NULL-free on success. */
static int unfused_plan(const graph *g, plan *p, stof_error *err) {
    memset(p, 0, sizeof *p);
    fusion_seq *seqs = NULL;
    int n = 0, rc = fusion_sequences(g, &seqs, &n, err);
    p->sequences = rc ? NULL : calloc((size_t)n, sizeof *p->sequences);
    for (int i = 0; !rc && i < n; i++) {
        if (seqs[i].cls != i)
            continue;
        plan_sequence *ps = &p->sequences[p->n_sequences++];
        ps->layer = seqs[i].layer;
        ps->n_ops = seqs[i].n;
        ps->instances = calloc((size_t)n, sizeof *ps->instances);
        for (int j = 0; j < n; j++)
            if (seqs[j].cls == i)
                ps->instances[ps->n_instances++] = seqs[j].first;
        rc = fusion_scheme_all_unfused(&ps->scheme, seqs[i].n, err);
    }
    free(seqs);
    return rc;
}

/* The prefill pass on the forward plan's schemes (exec_plan_from_plan_prefix): each layer the
 * prefill has whole takes the plan's scheme, the layer it cuts (the last, up to its
 * attention) the default; a scheme that does not fit is an error. */
static void check_prefill_plan(const tiny *t) {
    plan p = {0};
    stof_error err = {0};
    graph fwd, ctx, pass;
    gen_decoder d;
    graph_init(&pass);
    int rc = build(t, BATCH, LONGEST, "dtype=fp16", &fwd, &err); /* the executor's dtypes */
    if (!rc && !(rc = build(t, BATCH, CONTEXT, "dtype=fp16", &ctx, &err))) {
        if (!(rc = gen_decoder_build(&ctx, &d, &err))) {
            rc = gen_prefill_build(&fwd, &d, &pass, &err);
            gen_decoder_free(&d);
        }
        graph_free(&ctx);
    }
    if (!rc)
        rc = unfused_plan(&fwd, &p, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", t->name, err.msg);
    const graph *pg = &pass;
    exec_plan *xp = NULL;
    int taken = 0;
    if (!rc)
        rc = exec_plan_from_plan_prefix(&p, pg, 1, &xp, &taken, &err);
    CHECK_MSG(rc == STOF_OK, "%s prefill on the plan: %s", t->name, err.msg);
    int unfused = 0, cut = 0;
    for (int i = 0; !rc && i < xp->n_seqs; i++) {
        const fusion_seq *q = &xp->seqs[i];
        int whole = 0;
        for (int k = 0; k < p.n_sequences; k++)
            for (int j = 0; j < p.sequences[k].n_instances; j++)
                whole |= p.sequences[k].instances[j] == q->first && p.sequences[k].n_ops == q->n;
        fusion_scheme def;
        CHECK_EQ_INT(exec_default_scheme(pg, q, &def, &err), STOF_OK);
        if (whole) {
            unfused++;
            CHECK_EQ_INT(fusion_scheme_count_segments(&xp->schemes[i]), q->n);
        } else {
            cut++;
            CHECK(fusion_scheme_same_segments(&xp->schemes[i], &def));
        }
    }
    CHECK_MSG(rc || (unfused > 0 && cut == 1 && taken >= 1), "%s: %d layers on the plan's "
              "scheme, %d cut, %d classes taken", t->name, unfused, cut, taken);
    exec_plan_free(xp);
    /* a scheme no template runs: the first layer's ops all in one segment */
    for (int k = 0; !rc && k < p.n_sequences; k++) {
        fusion_segment all = {0, p.sequences[k].n_ops - 1};
        CHECK_EQ_INT(fusion_scheme_from_segments(&all, 1, p.sequences[k].n_ops,
                                                 &p.sequences[k].scheme, &err), STOF_OK);
    }
    if (!rc) {
        CHECK(exec_plan_from_plan_prefix(&p, pg, 0, &xp, &taken, &err) != STOF_OK);
        CHECK(xp == NULL);
    }
    plan_free(&p);
    graph_free(&pass);
    graph_free(&fwd);
}

/* The segments of g's default plan (exec_default_schemes: a scheme a class of layers, and
 * outside the layers one where they run one row, else an op a segment), as (first op, ops)
 * pairs; returns how many (at most cap). */
static int default_segments(const graph *g, int (*spans)[2], int cap) {
    fusion_seq *seqs = NULL;
    int n = 0, found = 0;
    stof_error err = {0};
    CHECK_EQ_INT(fusion_sequences(g, &seqs, &n, &err), STOF_OK);
    fusion_scheme *schemes = calloc((size_t)n + 1, sizeof *schemes);
    CHECK(schemes != NULL);
    if (schemes)
        CHECK_EQ_INT(exec_default_schemes(g, seqs, n, schemes, &err), STOF_OK);
    for (int i = 0; schemes && i < n; i++) {
        const fusion_scheme *sc = &schemes[seqs[i].cls];
        fusion_segment segs[FUSION_MAX_OPS];
        int n_segs = sc->n ? fusion_scheme_segments(sc, segs, FUSION_MAX_OPS) : seqs[i].n;
        for (int k = 0; !sc->n && k < n_segs; k++)
            segs[k] = (fusion_segment){k, k};
        for (int k = 0; k < n_segs && found < cap; k++, found++) {
            spans[found][0] = seqs[i].first + segs[k].first;
            spans[found][1] = segs[k].last - segs[k].first + 1;
        }
    }
    free(schemes);
    free(seqs);
    return found;
}

#define MAX_SEGMENTS 4096

/* Rotary ops in graph g's default schemes: each joined to the decode attention after it
 * (decode 1: the segment runs on attention_decode) or left alone (decode 0: on rotary).
 * Returns how many there were. */
static int rotary_segments(const graph *g, int decode) {
    static int spans[MAX_SEGMENTS][2];
    const int n = default_segments(g, spans, MAX_SEGMENTS);
    int found = 0;
    stof_error err = {0};
    for (int k = 0; k < n; k++) {
        const int first = spans[k][0], len = spans[k][1];
        if (g->ops[first].kind != OP_ROTARY)
            continue;
        found++;
        int ops[2] = {first, first + 1};
        fusion_match m;
        fusion_template_id t = FUSION_T_COUNT;
        CHECK_EQ_INT(len, decode ? 2 : 1);
        CHECK_EQ_INT(fusion_match_segment(g, ops, len, &m, &err), STOF_OK);
        CHECK_EQ_INT(exec_segment_template(g, first, len, &m, &t, &err), STOF_OK);
        CHECK_EQ_INT(t, decode ? FUSION_T_ATTENTION_DECODE : FUSION_T_ROTARY);
    }
    return found;
}

/* The longest segment from op `first` that a template runs (0 when not even two ops do), and
 * that template. */
static int longest_segment(const graph *g, int first, fusion_template_id *t) {
    int ops[FUSION_MAX_OPS], best = 0;
    for (int len = 1; len <= FUSION_MAX_OPS && first + len <= g->n_ops; len++) {
        ops[len - 1] = first + len - 1;
        fusion_match m;
        fusion_template_id tt;
        if (fusion_match_segment(g, ops, len, &m, NULL) != STOF_OK ||
            exec_segment_template(g, first, len, &m, &tt, NULL) != STOF_OK)
            break;
        if (len >= 2) {
            best = len;
            *t = tt;
        }
    }
    return best;
}

/* A decode step's norms (its rows are few) can each join the GEMM after it and that GEMM's
 * epilogue or gated unit, on gemv (the norm its prologue): segments the search measures.
 * Returns how many norms did; *glus the segments that close with a gated unit. */
static int norm_prologues(const graph *g, int *glus) {
    int joined = 0, norms = 0, glu_ops = 0;
    *glus = 0;
    for (int i = 0; i < g->n_ops; i++)
        glu_ops += g->ops[i].kind == OP_GLU;
    for (int i = 0; i + 1 < g->n_ops; i++) {
        const op_kind kind = g->ops[i].kind;
        if ((kind != OP_LAYERNORM && kind != OP_RMSNORM) || g->ops[i + 1].kind != OP_GEMM)
            continue;
        norms++;
        fusion_template_id t = FUSION_T_COUNT;
        const int len = longest_segment(g, i, &t);
        CHECK_MSG(len >= 2 && t == FUSION_T_GEMV, "norm #%d: %d ops on template %d", i, len,
                  (int)t);
        joined += len >= 2 && t == FUSION_T_GEMV;
        *glus += len >= 2 && t == FUSION_T_GEMV && g->ops[i + len - 1].kind == OP_GLU;
    }
    CHECK_EQ_INT(joined, norms);
    CHECK_EQ_INT(*glus, glu_ops);
    return joined;
}

/* Segments of g's default schemes that open with a norm and hold more ops (gemv's prologue),
 * each checked to run on gemv; *glus those that close with a gated unit. The default joins
 * them for one row (a step at batch 1) and leaves them to the search at more. */
static int norm_led_segments(const graph *g, int *glus) {
    static int spans[MAX_SEGMENTS][2];
    const int n = default_segments(g, spans, MAX_SEGMENTS);
    int found = 0;
    *glus = 0;
    for (int k = 0; k < n; k++) {
        const int first = spans[k][0], len = spans[k][1];
        const op_kind kind = g->ops[first].kind;
        if ((kind != OP_LAYERNORM && kind != OP_RMSNORM) || len < 2)
            continue;
        found++;
        *glus += g->ops[first + len - 1].kind == OP_GLU;
        int ops[FUSION_MAX_OPS];
        for (int i = 0; i < len; i++)
            ops[i] = first + i;
        fusion_match m;
        fusion_template_id t = FUSION_T_COUNT;
        stof_error err = {0};
        CHECK_EQ_INT(fusion_match_segment(g, ops, len, &m, &err), STOF_OK);
        CHECK_EQ_INT(exec_segment_template(g, first, len, &m, &t, &err), STOF_OK);
        CHECK_MSG(t == FUSION_T_GEMV, "segment #%d of %d ops: template %d", first, len, (int)t);
    }
    return found;
}

/* A decode step at batch 1 by default: every norm joined to the GEMM after it and that GEMM's
 * epilogue or gated unit, on gemv. */
static void check_one_row_joins(const tiny *t, int glu_layers) {
    graph ctx;
    gen_decoder d;
    stof_error err = {0};
    int rc = build(t, 1, CONTEXT, "dtype=fp16", &ctx, &err);
    if (!rc && !(rc = gen_decoder_build(&ctx, &d, &err))) {
        int glus = 0;
        CHECK_EQ_INT(norm_led_segments(&d.g, &glus), 2 * t->n_layers + 1);
        CHECK_EQ_INT(glus, glu_layers);
        gen_decoder_free(&d);
    }
    if (!rc)
        graph_free(&ctx);
    CHECK_MSG(rc == STOF_OK, "%s at batch 1: %s", t->name, err.msg);
}

/* A rotary op that does not rotate what the decode attention after it reads, or not by a
 * step's positions, stays a segment of its own: the attention_decode template refuses the pair
 * and says why. (The op's attributes are changed in place for the check, then restored.) */
static void check_rotary_refused(graph *g) {
    int at = -1;
    for (int i = 0; i + 1 < g->n_ops && at < 0; i++)
        if (g->ops[i].kind == OP_ROTARY && g->ops[i + 1].kind == OP_ATTENTION)
            at = i;
    CHECK(at >= 0);
    if (at < 0)
        return;
    graph_op *r = &g->ops[at];
    const graph_op keep = *r;
    static const char *const why[] = {"rotates the attention's Q and K heads",
                                      "turns by a step's positions"};
    for (int k = 0; k < 2; k++) {
        if (k == 0)
            r->attr.rotary.kv_heads++;
        else
            r->attr.rotary.has_positions = 0;
        int ops[2] = {at, at + 1};
        fusion_match m;
        fusion_template_id t;
        stof_error err = {0};
        CHECK_EQ_INT(fusion_match_segment(g, ops, 2, &m, &err), STOF_OK);
        CHECK(exec_segment_template(g, at, 2, &m, &t, &err) != STOF_OK);
        CHECK_CONTAINS(err.msg, why[k]);
        *r = keep;
    }
}

/* A decode step's rotary op runs inside its attention (kernels/attention_decode.cu), a
 * prefill's on its own: the default schemes of both graphs. */
static void check_rotary_fused(const tiny *t) {
    graph fwd, ctx, pass;
    gen_decoder d;
    stof_error err = {0};
    const int rotary = strstr(t->script, "mistral") ? t->n_layers : 0;
    int rc = build(t, BATCH, LONGEST, "dtype=fp16", &fwd, &err);
    if (rc) {
        CHECK_MSG(0, "%s: %s", t->name, err.msg);
        return;
    }
    if (!(rc = build(t, BATCH, CONTEXT, "dtype=fp16", &ctx, &err))) {
        if (!(rc = gen_decoder_build(&ctx, &d, &err))) {
            if (!(rc = gen_prefill_build(&fwd, &d, &pass, &err))) {
                CHECK_EQ_INT(rotary_segments(&d.g, 1), rotary);
                CHECK_EQ_INT(rotary_segments(&pass, 0), rotary);
                if (rotary)
                    check_rotary_refused(&d.g);
                int glus = 0;
                CHECK_EQ_INT(norm_prologues(&d.g, &glus), 2 * t->n_layers + 1);
                CHECK_EQ_INT(glus, rotary ? t->n_layers : 0); /* mistral's SwiGLU */
                CHECK_EQ_INT(norm_led_segments(&d.g, &glus), 0);
                CHECK_EQ_INT(norm_led_segments(&pass, &glus), 0);
                graph_free(&pass);
            }
            gen_decoder_free(&d);
        }
        graph_free(&ctx);
    }
    CHECK_MSG(rc == STOF_OK, "%s: %s", t->name, err.msg);
    graph_free(&fwd);
    check_one_row_joins(t, rotary ? t->n_layers : 0);
}

/* The prefill pass: the model up to its last attention, each attention storing into caches
 * named and shaped as the decode step's, nothing after it, no weight it does not read. */
static void check_prefill(const tiny *t, fixture *f) {
    gen_decoder d;
    graph pg;
    stof_error err = {0};
    int rc = gen_decoder_build(&f->context, &d, &err);
    if (!rc)
        rc = gen_prefill_build(&f->prefill, &d, &pg, &err);
    CHECK_MSG(rc == STOF_OK, "%s prefill: %s", t->name, err.msg);
    if (rc) {
        gen_decoder_free(&d);
        return;
    }
    int stores = 0;
    for (int i = 0; i < pg.n_ops; i++) {
        const graph_op *op = &pg.ops[i];
        if (op->kind != OP_ATTENTION)
            continue;
        CHECK(op->attr.attn.store && !op->attr.attn.decode);
        for (int kv = 0; kv < 2; kv++) {
            const graph_tensor *c = &pg.tensors[op->inputs[op->n_inputs - 2 + kv]];
            int s = graph_find_tensor(&d.g, c->name);
            CHECK_MSG(s >= 0, "%s: cache '%s' is not the decode step's", t->name, c->name);
            if (s >= 0)
                CHECK(c->shape[1] == d.g.tensors[s].shape[1] &&
                      c->shape[2] == d.g.tensors[s].shape[2]);
        }
        stores++;
    }
    CHECK_EQ_INT(stores, d.n_layers);
    const graph_op *last = &pg.ops[pg.n_ops - 1];
    CHECK(last->kind == OP_ATTENTION && pg.output == last->output);
    CHECK(pg.tensors[pg.output].shape[0] == BATCH && pg.tensors[pg.output].shape[1] == LONGEST);
    for (int w = 0; w < pg.n_tensors; w++) { /* every weight and input is read */
        int read = pg.tensors[w].role == GRAPH_ACTIVATION || w == pg.output;
        for (int i = 0; !read && i < pg.n_ops; i++)
            for (int k = 0; k < pg.ops[i].n_inputs; k++)
                read |= pg.ops[i].inputs[k] == w;
        CHECK_MSG(read, "%s prefill: '%s' is read by no op", t->name, pg.tensors[w].name);
    }
    graph_free(&pg);
    /* a prefill at another batch is not this step's */
    graph other;
    rc = build(t, BATCH - 1, LONGEST, NULL, &other, &err);
    CHECK_EQ_INT(rc, STOF_OK);
    if (!rc)
        CHECK_EQ_INT(gen_prefill_build(&other, &d, &pg, &err), STOF_ERR_INVALID);
    graph_free(&other);
    gen_decoder_free(&d);
}

/* The decode step through the op table's reference (its caches as inputs, all zeros, every
 * position 0): the logits of the model run on one token. */
static void check_step_reference(const tiny *t, fixture *f) {
    gen_decoder d;
    graph one;
    graph_init(&one);
    stof_error err = {0};
    float *step = NULL, *full = NULL;
    int rc = gen_decoder_build(&f->context, &d, &err);
    if (!rc)
        rc = build(t, BATCH, 1, NULL, &one, &err);
    if (!rc)
        rc = exec_reference(&d.g, &f->m.weights, &step, &err);
    if (!rc)
        rc = exec_reference(&one, &f->m.weights, &full, &err);
    CHECK_MSG(rc == STOF_OK, "%s step reference: %s", t->name, err.msg);
    if (!rc) {
        double diff = max_rel_diff(step, full, (size_t)BATCH * 40);
        CHECK_MSG(diff < 1e-5, "%s: the step's reference differs from one token's by %g",
                  t->name, diff);
    }
    free(step);
    free(full);
    graph_free(&one);
    gen_decoder_free(&d);
}

static void test_models(void) {
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        const tiny *t = &models[k];
        fixture f;
        stof_error err = {0};
        int rc = fixture_open(t, &f, &err);
        CHECK_MSG(rc == STOF_OK, "%s: %s", t->name, err.msg);
        if (!rc) {
            check_caches(t, &f);
            check_prefill(t, &f);
            check_step_reference(t, &f);
            check_against_recompute(t, &f, gen_options_default(NEW));
            gen_options o = gen_options_default(NEW);
            o.temperature = 0.8f;
            o.top_k = 12;
            o.top_p = 0.9f;
            o.seed = 7;
            check_against_recompute(t, &f, o);
        }
        fixture_close(&f);
    }
}

/* Sampling is reproducible from its seed, and a stop token ends its sequence. */
static void test_seed_and_stop(void) {
    fixture f;
    stof_error err = {0};
    CHECK_EQ_INT(fixture_open(&models[2], &f, &err), STOF_OK);
    gen_options o = gen_options_default(NEW);
    o.temperature = 1.0f;
    o.seed = 3;
    gen_result a, b, c;
    CHECK_EQ_INT(gen_run_cpu(&f.m, &f.p, &o, 0, &a, &err), STOF_OK);
    CHECK_EQ_INT(gen_run_cpu(&f.m, &f.p, &o, 0, &b, &err), STOF_OK);
    o.seed = 4;
    CHECK_EQ_INT(gen_run_cpu(&f.m, &f.p, &o, 0, &c, &err), STOF_OK);
    CHECK(a.tokens && b.tokens && memcmp(a.tokens, b.tokens, sizeof *a.tokens * BATCH * NEW) == 0);
    CHECK(a.tokens && c.tokens && memcmp(a.tokens, c.tokens, sizeof *a.tokens * BATCH * NEW) != 0);
    /* stop at sequence 1's third token: it ends there, the others go on */
    o.seed = 3;
    o.stop[0] = a.tokens ? a.tokens[NEW + 2] : 0;
    o.n_stop = 1;
    gen_result s;
    CHECK_EQ_INT(gen_run_cpu(&f.m, &f.p, &o, 0, &s, &err), STOF_OK);
    if (s.tokens && a.tokens) {
        int first = 0;
        while (a.tokens[NEW + first] != o.stop[0])
            first++;
        CHECK_EQ_INT(s.n_new[1], first + 1);
        CHECK_EQ_INT(s.tokens[NEW + first], o.stop[0]);
        CHECK_EQ_INT(s.tokens[NEW + first + 1], -1);
        CHECK(memcmp(s.tokens + NEW, a.tokens + NEW, sizeof *a.tokens * (size_t)(first + 1)) == 0);
    }
    gen_result_free(&a);
    gen_result_free(&b);
    gen_result_free(&c);
    gen_result_free(&s);
    fixture_close(&f);
}

static void test_sample(void) {
    const float row[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, 0.0f};
    float scratch[12];
    int32_t order[12];
    gen_options o = gen_options_default(1);
    CHECK_EQ_INT(gen_sample(&o, row, 6, 0, 0, scratch, order), 1); /* the first of the ties */
    o.temperature = 5.0f;
    o.top_k = 1;
    for (int t = 0; t < 20; t++)
        CHECK_EQ_INT(gen_sample(&o, row, 6, 0, t, scratch, order), 1);
    o.top_k = 0;
    o.top_p = 1e-6f; /* the single most likely token */
    for (int t = 0; t < 20; t++)
        CHECK_EQ_INT(gen_sample(&o, row, 6, 1, t, scratch, order), 1);
    /* top_k 3: only tokens 1, 3 and 4 ever come */
    o.top_p = 1.0f;
    o.top_k = 3;
    int seen[6] = {0};
    for (int t = 0; t < 200; t++)
        seen[gen_sample(&o, row, 6, 2, t, scratch, order)]++;
    CHECK(seen[1] && seen[3] && seen[4] && !seen[0] && !seen[2] && !seen[5]);
    /* a draw is gen_sample_uniform's at the uniform number of (seed, sequence, step), which
     * the GPU's draws take from the step's inputs; the ends of [0, 1) take the first and the
     * last kept token (top_k 3: tokens 1, 3, 4 in rank order) */
    for (int t = 0; t < 50; t++) {
        double u = gen_uniform(o.seed, 2, t);
        CHECK(u >= 0.0 && u < 1.0);
        CHECK_EQ_INT(gen_sample(&o, row, 6, 2, t, scratch, order),
                     gen_sample_uniform(&o, row, 6, u, scratch, order));
    }
    CHECK(gen_uniform(o.seed, 2, 0) != gen_uniform(o.seed, 2, 1));
    CHECK(gen_uniform(o.seed, 2, 0) != gen_uniform(o.seed, 3, 0));
    CHECK_EQ_INT(gen_sample_uniform(&o, row, 6, 0.0, scratch, order), 1);
    CHECK_EQ_INT(gen_sample_uniform(&o, row, 6, 1.0 - 1.0 / 9007199254740992.0, scratch, order), 4);
}

static const float *g_key; /* the reference's sort key */

static int by_key_desc(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (g_key[x] != g_key[y])
        return g_key[x] > g_key[y] ? -1 : 1;
    return x < y ? -1 : 1;
}

/* Sampling against a reference written here: every token drawn under top-k and top-p is in
 * the set a full sort gives, and with every token kept the draws follow the softmax. */
static void test_sample_sets(void) {
    enum { V = 300, DRAWS = 400 };
    static float row[V], scaled[V], scratch[2 * V];
    static int32_t order[2 * V], sorted[V];
    util_rng r = {42};
    for (int v = 0; v < V; v++)
        row[v] = (float)(util_rng_double(&r) * 8.0);
    row[17] = row[18]; /* a tie */
    const int ks[] = {0, 1, 5, 40, V - 1};
    const float ps[] = {1.0f, 0.9f, 0.5f, 0.05f};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
        for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
            gen_options o = gen_options_default(1);
            o.temperature = 0.7f;
            o.top_k = ks[ki];
            o.top_p = ps[pi];
            for (int v = 0; v < V; v++) {
                scaled[v] = row[v] / o.temperature;
                sorted[v] = v;
            }
            g_key = scaled;
            qsort(sorted, V, sizeof *sorted, by_key_desc);
            int keep = o.top_k > 0 ? o.top_k : V;
            double sum = 0, mass = 0;
            for (int k = 0; k < keep; k++)
                sum += exp((double)scaled[sorted[k]] - scaled[sorted[0]]);
            int n = 0; /* the top-p prefix, one token of slack for the order of the sums */
            while (n < keep && (n == 0 || mass < (double)o.top_p * sum))
                mass += exp((double)scaled[sorted[n++]] - scaled[sorted[0]]);
            n = n < keep ? n + 1 : n;
            int outside = 0;
            for (int t = 0; t < DRAWS; t++) {
                int32_t tok = gen_sample(&o, row, V, 3, t, scratch, order);
                int in = 0;
                for (int k = 0; k < n && !in; k++)
                    in = sorted[k] == tok;
                outside += !in;
            }
            CHECK_MSG(outside == 0, "top_k %d, top_p %g: %d of %d draws outside the kept set",
                      o.top_k, (double)o.top_p, outside, DRAWS);
        }
    /* top_p alone in a vocabulary of 5000: ten tokens tied at the top hold 60% of the mass, so
     * 0.5 keeps exactly nine of them (8.3 tokens' worth), the ties broken by index: every one of
     * the nine drawn about equally often, the tenth and the rest never */
    enum { BIG = 5000, TIED = 10, KEPT = 9, MANY_TOP = 3600 };
    static float big[BIG], big_scratch[2 * BIG];
    static int32_t big_order[2 * BIG];
    int tied_at[TIED], count[TIED] = {0}, elsewhere = 0;
    for (int v = 0; v < BIG; v++)
        big[v] = 0.0f;
    for (int k = 0; k < TIED; k++) {
        tied_at[k] = 37 + k * 491; /* increasing: their order by index */
        big[tied_at[k]] = logf(1.5f * (BIG - TIED) / TIED);
    }
    gen_options op = gen_options_default(1);
    op.temperature = 1.0f;
    op.top_p = 0.5f;
    for (int t = 0; t < MANY_TOP; t++) {
        int32_t tok = gen_sample(&op, big, BIG, 6, t, big_scratch, big_order);
        int k = 0;
        while (k < TIED && tied_at[k] != tok)
            k++;
        if (k < TIED)
            count[k]++;
        else
            elsewhere++;
    }
    CHECK_MSG(elsewhere == 0 && count[TIED - 1] == 0, "top_p 0.5: %d draws outside the tied "
              "tokens, %d of the tenth", elsewhere, count[TIED - 1]);
    for (int k = 0; k < KEPT; k++)
        CHECK_MSG(abs(count[k] - MANY_TOP / KEPT) < MANY_TOP / KEPT / 4, "top_p 0.5: tied token "
                  "%d drawn %d times of %d (about %d expected)", k, count[k], MANY_TOP,
                  MANY_TOP / KEPT);
    /* every token kept: the draws follow the softmax */
    const float small[4] = {0.0f, 1.0f, 2.0f, 0.5f};
    gen_options o = gen_options_default(1);
    o.temperature = 1.0f;
    int seen[4] = {0};
    enum { MANY = 8000 };
    for (int t = 0; t < MANY; t++)
        seen[gen_sample(&o, small, 4, 5, t, scratch, order)]++;
    double z = 0;
    for (int v = 0; v < 4; v++)
        z += exp(small[v]);
    for (int v = 0; v < 4; v++)
        CHECK_MSG(fabs((double)seen[v] / MANY - exp(small[v]) / z) < 0.02,
                  "token %d drawn %d times of %d, its probability %.3f", v, seen[v], MANY,
                  exp(small[v]) / z);
}

/* Which of a plan's decode steps a generation runs: the one of its batch whose caches hold
 * what it needs; otherwise none, and a line that says why. */
static void test_plan_step(void) {
    plan pl, s1, s8;
    memset(&pl, 0, sizeof pl);
    memset(&s1, 0, sizeof s1);
    memset(&s8, 0, sizeof s8);
    char why[256] = "";
    CHECK(gen_plan_step(&pl, 1, 10, why, sizeof why) == NULL);
    CHECK_CONTAINS(why, "holds no decode steps (stof tune --decode-batch 1 makes one)");
    CHECK(gen_plan_step(NULL, 1, 10, NULL, 0) == NULL);
    stof_error err = {0};
    CHECK_EQ_INT(plan_add_decode(&pl, 1, 64, &s1, &err), STOF_OK);
    CHECK_EQ_INT(plan_add_decode(&pl, 8, 2048, &s8, &err), STOF_OK);
    const plan_decode *d = gen_plan_step(&pl, 8, 2048, why, sizeof why);
    CHECK(d && d->batch == 8 && d->context == 2048 && d->step == pl.decode[1].step);
    CHECK(gen_plan_step(&pl, 1, 64, NULL, 0) == &pl.decode[0]);
    CHECK(gen_plan_step(&pl, 1, 65, why, sizeof why) == NULL);
    CHECK_CONTAINS(why, "a batch of 1 has caches of 64 positions; these prompts and new tokens "
                        "need 65");
    CHECK(gen_plan_step(&pl, 3, 10, why, sizeof why) == NULL);
    CHECK_CONTAINS(why, "no decode step for a batch of 3 (batches 1, 8; stof tune "
                        "--decode-batch 3 makes one)");
    plan_free(&pl);
}

static void test_errors(void) {
    fixture f;
    stof_error err = {0};
    CHECK_EQ_INT(fixture_open(&models[0], &f, &err), STOF_OK);
    gen_result r;
    gen_options o = gen_options_default(NEW + 1); /* one more than the context holds */
    CHECK_EQ_INT(gen_run_cpu(&f.m, &f.p, &o, 0, &r, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "up to 16 tokens");
    o = gen_options_default(0);
    CHECK_EQ_INT(gen_run_cpu(&f.m, &f.p, &o, 0, &r, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "max_new_tokens");
    o = gen_options_default(2);
    o.top_p = 0.0f;
    CHECK_EQ_INT(gen_run_cpu(&f.m, &f.p, &o, 0, &r, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "top_p");
    o = gen_options_default(2);
    o.stop[0] = 40;
    o.n_stop = 1;
    CHECK_EQ_INT(gen_run_cpu(&f.m, &f.p, &o, 0, &r, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "stop token 40");
    o = gen_options_default(2);
    f.ids[1] = 40;
    CHECK_EQ_INT(gen_run_cpu(&f.m, &f.p, &o, 0, &r, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "prompt 0: token 40 at 1");
    f.ids[1] = 1;
    fixture_close(&f);

    /* no head: hidden states are not logits */
    graph g;
    CHECK_EQ_INT(build(&models[0], 1, 8, "head=false", &g, &err), STOF_OK);
    gen_decoder d;
    CHECK_EQ_INT(gen_decoder_build(&g, &d, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "head=true");
    graph_free(&g);
    /* ragged prompts without an attention_mask */
    CHECK_EQ_INT(fixture_open(&models[0], &f, &err), STOF_OK);
    graph_free(&f.prefill);
    CHECK_EQ_INT(build(&models[0], BATCH, LONGEST, "padding=false", &f.prefill, &err), STOF_OK);
    o = gen_options_default(2);
    CHECK_EQ_INT(gen_run_cpu(&f.m, &f.p, &o, 0, &r, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "attention_mask");
    fixture_close(&f);
}

/* Cache slots from masks: a window of 4 keys, a dense layer, a global first key. */
/* A decode step's attention for a sequence that has ended (position -1): zeros out, its cache
 * as it was, and the other sequences' outputs as without it. */
static void test_ended_sequence(void) {
    enum { B = 2, H = 2, KVH = 1, D = 8, CAP = 16 };
    const int64_t W = (H + 2 * KVH) * D;
    stof_error err = {0};
    ops_kv_cache c;
    CHECK_EQ_INT(ops_kv_cache_alloc(&c, B, CAP, KVH, D, &err), STOF_OK);
    float pre[B * 5 * W], step[B * W], out[B * H * D], alone[B * H * D];
    util_rng rng = {11};
    for (size_t i = 0; i < sizeof pre / sizeof pre[0]; i++)
        pre[i] = (float)util_rng_double(&rng) - 0.5f;
    for (size_t i = 0; i < sizeof step / sizeof step[0]; i++)
        step[i] = (float)util_rng_double(&rng) - 0.5f;
    const int64_t len[B] = {5, 3};
    ops_kv_cache_store_prefix(&c, pre, 5, H, len);
    size_t bytes = sizeof(float) * (size_t)B * CAP * KVH * D;
    float *k0 = malloc(bytes), *v0 = malloc(bytes);
    memcpy(k0, c.k, bytes);
    memcpy(v0, c.v, bytes);
    op_attention a = {.heads = H, .head_dim = D, .causal = 1, .kv_heads = KVH, .decode = 1,
                      .scale = 0.35f, .mask = -1};
    float ended[B] = {-1.0f, 3.0f};
    for (int i = 0; i < B * H * D; i++)
        out[i] = NAN;
    CHECK_EQ_INT(ops_attention_decode_ref(&a, NULL, step, ended, &c, out, &err), STOF_OK);
    int zeros = 1, same_cache = 1;
    for (int i = 0; i < H * D; i++)
        zeros &= out[i] == 0.0f;
    for (int s = 0; s < CAP * KVH * D; s++) /* sequence 0's slots */
        same_cache &= c.k[s] == k0[s] && c.v[s] == v0[s];
    CHECK(zeros && same_cache);
    /* sequence 1 as when sequence 0 goes on (from the same caches) */
    memcpy(c.k, k0, bytes);
    memcpy(c.v, v0, bytes);
    float both[B] = {5.0f, 3.0f};
    CHECK_EQ_INT(ops_attention_decode_ref(&a, NULL, step, both, &c, alone, &err), STOF_OK);
    CHECK(memcmp(out + H * D, alone + H * D, sizeof(float) * H * D) == 0);
    float bad[B] = {-2.0f, 3.0f};
    CHECK_EQ_INT(ops_attention_decode_ref(&a, NULL, step, bad, &c, out, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "position -2 of sequence 0 is outside the context");
    free(k0);
    free(v0);
    ops_kv_cache_free(&c);
}

static void test_span(void) {
    stof_error err = {0};
    mask_spec *spec = NULL;
    mask *m = NULL;
    CHECK_EQ_INT(mask_spec_parse("sliding_window{band=3}", &spec, &err), STOF_OK);
    CHECK_EQ_INT(mask_build(spec, 1, 100, 100, &m, &err), STOF_OK);
    CHECK_EQ_INT(ops_kv_cache_span(m, 100), 4);
    mask_free(m);
    mask_spec_free(spec);
    CHECK_EQ_INT(ops_kv_cache_span(NULL, 77), 77);
    CHECK_EQ_INT(mask_spec_parse("longformer{band=3, global=1}", &spec,
                                 &err), STOF_OK);
    if (spec) {
        CHECK_EQ_INT(mask_build(spec, 1, 100, 100, &m, &err), STOF_OK);
        CHECK_EQ_INT(ops_kv_cache_span(m, 100), 100);
        mask_free(m);
        mask_spec_free(spec);
    }
}

/* The public API: a config-only directory generates once random weights are asked for, the
 * tokens of the core loop on the same seed; eos from the config ends a sequence. */
static void test_api(void) {
    const char *dir = STOF_BINARY_DIR "/tests/gen-mistral";
    char cmd[512], path[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs(models[2].config, f);
    fclose(f);
    const char *params[] = {"dtype=fp32", "seq=8"};
    stof_model *m = NULL;
    CHECK_MSG(stof_model_open(dir, params, 2, &m) == STOF_OK, "%s", stof_last_error());
    if (!m)
        return;
    const int32_t p0[] = {1, 2, 3, 4, 5, 6}, p1[] = {7, 8, 9}, p2[] = {10};
    const int32_t *prompts[] = {p0, p1, p2};
    int32_t got[BATCH * NEW];
    int lens_out[BATCH];
    stof_generate_options o = {.max_new_tokens = NEW};
    CHECK_EQ_INT(stof_model_generate_cpu(m, prompts, LENS, BATCH, &o, got, lens_out),
                 STOF_ERR_INVALID);
    CHECK_CONTAINS(stof_last_error(), "has no model.safetensors");
    stof_model_set_seed(m, 11);
    CHECK_MSG(stof_model_generate_cpu(m, prompts, LENS, BATCH, &o, got, lens_out) == STOF_OK,
              "%s", stof_last_error());
    fixture fx;
    stof_error err = {0};
    CHECK_EQ_INT(fixture_open(&models[2], &fx, &err), STOF_OK);
    for (int b = 0; b < BATCH; b++)
        memcpy(fx.ids + b * LONGEST, prompts[b], sizeof *fx.ids * (size_t)LENS[b]);
    gen_options go = gen_options_default(NEW);
    gen_result r;
    CHECK_EQ_INT(gen_run_cpu(&fx.m, &fx.p, &go, 0, &r, &err), STOF_OK);
    CHECK(r.tokens && memcmp(r.tokens, got, sizeof got) == 0);
    for (int b = 0; b < BATCH; b++)
        CHECK_EQ_INT(lens_out[b], NEW);
    /* a stop token: the first token of sequence 0 */
    int32_t stop = got[0];
    o.stop_tokens = &stop;
    o.n_stop_tokens = 1;
    CHECK_EQ_INT(stof_model_generate_cpu(m, prompts, LENS, BATCH, &o, got, lens_out), STOF_OK);
    CHECK_EQ_INT(lens_out[0], 1);
    CHECK_EQ_INT(got[1], -1);
    o.n_stop_tokens = 0;
    o.tune_step_s = 5; /* tuning is the GPU's */
    CHECK_EQ_INT(stof_model_generate_cpu(m, prompts, LENS, BATCH, &o, got, lens_out),
                 STOF_ERR_INVALID);
    CHECK_CONTAINS(stof_last_error(), "tunes the GPU's decode step");
    o.tune_step_s = -1;
    CHECK_EQ_INT(stof_model_generate_cpu(m, prompts, LENS, BATCH, &o, got, lens_out),
                 STOF_ERR_INVALID);
    CHECK_CONTAINS(stof_last_error(), "tune_step_s: seconds from 0");
    o.tune_step_s = 0;
    o.max_new_tokens = 0;
    CHECK_EQ_INT(stof_model_generate_cpu(m, prompts, LENS, BATCH, &o, got, lens_out),
                 STOF_ERR_INVALID);
    CHECK_CONTAINS(stof_last_error(), "max_new_tokens");
    CHECK_EQ_INT(stof_model_generate_cpu(m, prompts, LENS, 0, &o, got, lens_out),
                 STOF_ERR_INVALID);
    gen_result_free(&r);
    fixture_close(&fx);
    stof_model_free(m);
}

int main(void) {
    test_sample();
    test_sample_sets();
    test_span();
    test_ended_sequence();
    test_models();
    test_seed_and_stop();
    test_plan_step();
    for (size_t i = 0; i < sizeof gpu_shaped / sizeof gpu_shaped[0]; i++) {
        check_prefill_plan(&gpu_shaped[i]);
        check_rotary_fused(&gpu_shaped[i]);
    }
    test_errors();
    test_api();
    return check_summary("test_gen");
}
