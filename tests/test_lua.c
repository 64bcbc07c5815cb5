/* The Lua model-script API: the shipped scripts build the graphs they
 * describe (op counts, shapes, FLOPs, parameters), masks made in Lua equal
 * the same masks made in C, and every way a script can go wrong comes back
 * as an error with the script's line, never a crash. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/lua/lua_api.h"
#include "ops/mask.h"
#include "ops/ops.h"

#define SCRIPTS STOF_SOURCE_DIR "/scripts/"
#define TEST_SCRIPTS STOF_SOURCE_DIR "/tests/scripts"

/* ---- helpers ---------------------------------------------------------------- */

static int build_inline(const char *src, const char *const *params, int n, graph *g,
                        stof_error *err) {
    graph_init(g);
    memset(err, 0, sizeof *err);
    return lua_api_build_string(src, "model.lua", TEST_SCRIPTS, params, n, g, NULL, err);
}

static int build_limited(const char *src, uint64_t instructions, size_t memory, graph *g,
                         stof_error *err) {
    lua_api_limits lim = {instructions, memory};
    graph_init(g);
    memset(err, 0, sizeof *err);
    return lua_api_build_string_limits(src, "model.lua", NULL, NULL, 0, &lim, g, NULL, err);
}

/* A script must fail, leave the graph empty and say each of the needles. */
static void expect_failure(int rc, const graph *g, const stof_error *err, const char *needle1,
                           const char *needle2, int line) {
    CHECK_MSG(rc != STOF_OK, "expected an error containing '%s' (test line %d)", needle1, line);
    CHECK_MSG(g->n_ops == 0 && g->n_tensors == 0 && g->n_masks == 0,
              "graph not emptied after a failure (test line %d)", line);
    if (needle1)
        CHECK_MSG(strstr(err->msg, needle1) != NULL, "'%s' lacks '%s' (test line %d)", err->msg,
                  needle1, line);
    if (needle2)
        CHECK_MSG(strstr(err->msg, needle2) != NULL, "'%s' lacks '%s' (test line %d)", err->msg,
                  needle2, line);
}

#define EXPECT_ERROR(src, needle1, needle2)                        \
    do {                                                           \
        graph g_;                                                  \
        stof_error e_;                                             \
        int rc_ = build_inline((src), NULL, 0, &g_, &e_);          \
        expect_failure(rc_, &g_, &e_, (needle1), (needle2), __LINE__); \
        graph_free(&g_);                                           \
    } while (0)

static void count_kinds(const graph *g, int *counts) {
    memset(counts, 0, OP_KIND_COUNT * sizeof *counts);
    for (int i = 0; i < g->n_ops; i++)
        counts[g->ops[i].kind]++;
}

static double ci_flops(const graph *g) {
    double total = 0;
    for (int i = 0; i < g->n_ops; i++) {
        if (op_describe(g->ops[i].kind)->cls != OP_CLASS_CI)
            continue;
        double f, b;
        op_cost(g, &g->ops[i], &f, &b);
        total += f;
    }
    return total;
}

static const graph_tensor *output_of(const graph *g) {
    return &g->tensors[g->output];
}

static void check_shape3(const graph_tensor *t, int64_t a, int64_t b, int64_t c) {
    CHECK_EQ_INT(t->ndim, 3);
    CHECK_EQ_INT(t->shape[0], a);
    CHECK_EQ_INT(t->shape[1], b);
    CHECK_EQ_INT(t->shape[2], c);
}

static const char *param_value(const graph_script *info, const char *key) {
    for (int i = 0; i < info->n_params; i++)
        if (strcmp(info->params[i].key, key) == 0)
            return info->params[i].value;
    return "";
}

/* Every op and declared tensor knows the script line that made it. */
static void check_lines(const graph *g) {
    int missing = 0;
    for (int i = 0; i < g->n_ops; i++)
        missing += g->ops[i].line <= 0;
    for (int i = 0; i < g->n_tensors; i++)
        missing += g->tensors[i].line <= 0;
    CHECK_EQ_INT(missing, 0);
}

/* ---- shipped scripts ----------------------------------------------------------- */

static void expect_counts(const graph *g, int gemm, int bias, int add, int layernorm,
                          int rmsnorm, int gelu, int relu, int embedding, int attention) {
    int c[OP_KIND_COUNT];
    count_kinds(g, c);
    CHECK_EQ_INT(c[OP_GEMM], gemm);
    CHECK_EQ_INT(c[OP_BIAS], bias);
    CHECK_EQ_INT(c[OP_ADD], add);
    CHECK_EQ_INT(c[OP_LAYERNORM], layernorm);
    CHECK_EQ_INT(c[OP_RMSNORM], rmsnorm);
    CHECK_EQ_INT(c[OP_GELU], gelu);
    CHECK_EQ_INT(c[OP_RELU], relu);
    CHECK_EQ_INT(c[OP_SOFTMAX], 0);
    CHECK_EQ_INT(c[OP_EMBEDDING], embedding);
    CHECK_EQ_INT(c[OP_ATTENTION], attention);
    CHECK_EQ_INT(g->n_ops, gemm + bias + add + layernorm + rmsnorm + gelu + relu + embedding +
                               attention);
}

static void test_bert_base(void) {
    graph g;
    graph_init(&g);
    stof_error err;
    graph_script info;
    int rc = lua_api_build(SCRIPTS "bert.lua", NULL, 0, &g, &info, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc != STOF_OK)
        return;
    /* 12 x (4 gemm + 4 bias + 1 attention + 2 add + 2 layernorm + 1 gelu),
     * plus the embedding and its layernorm. */
    expect_counts(&g, 48, 48, 24, 25, 0, 12, 0, 1, 12);
    CHECK_EQ_INT(g.n_layers, 12);
    check_shape3(output_of(&g), 8, 512, 768);
    CHECK_EQ_INT(g.n_masks, 1); /* one bigbird mask for all 12 layers */
    CHECK_EQ_INT(g.masks[0]->q_len, 512);
    CHECK_CONTAINS(g.masks[0]->desc, "bigbird");
    int attn = 0;
    for (int i = 0; i < g.n_ops; i++) {
        const graph_op *op = &g.ops[i];
        if (op->kind != OP_ATTENTION)
            continue;
        attn++;
        CHECK_EQ_INT(op->attr.attn.mask, 0);
        CHECK_EQ_INT(op->attr.attn.heads, 12);
        CHECK_EQ_INT(op->attr.attn.head_dim, 64);
        CHECK_EQ_INT(op->attr.attn.causal, 0);
        CHECK_NEAR(op->attr.attn.scale, 0.125, 1e-7);
        CHECK_EQ_INT(op->layer, attn - 1);
    }
    CHECK(strcmp(g.name, "bert-base") == 0);
    CHECK(graph_find_tensor(&g, "encoder.layer.11.attention.self.qkv.weight") >= 0);
    CHECK(graph_find_tensor(&g, "encoder.layer.0.attention.output.dense.weight") >= 0);
    CHECK(graph_find_tensor(&g, "embeddings.word_embeddings.weight") >= 0);
    int pos = graph_find_tensor(&g, "embeddings.position_embeddings.weight");
    CHECK(pos >= 0 && g.tensors[pos].shape[0] == 512);
    int ids = graph_find_tensor(&g, "input_ids");
    CHECK(ids >= 0 && g.tensors[ids].dtype == STOF_I32 &&
          g.tensors[ids].init == GRAPH_INIT_TOKENS && g.tensors[ids].init_high == 30522);
    check_lines(&g);
    /* Resolved parameters, sorted by key. */
    CHECK_EQ_INT(info.n_params, 8);
    CHECK(strcmp(info.params[0].key, "batch") == 0 && strcmp(info.params[0].value, "8") == 0);
    CHECK(strcmp(info.params[7].key, "seq") == 0 && strcmp(info.params[7].value, "512") == 0);
    CHECK(strcmp(param_value(&info, "global"), "false") == 0); /* Longformer's only */
    CHECK(strcmp(param_value(&info, "mask"), "bigbird") == 0);
    /* the script alone runs unpadded (the paper's shapes); a model directory pads */
    CHECK(strcmp(param_value(&info, "padding"), "false") == 0);
    CHECK(graph_find_tensor(&g, "attention_mask") < 0);
    CHECK(strcmp(info.name, "bert.lua") == 0);
    CHECK(info.content_hash != 0);
    graph_free(&g);
}

/* FLOPs of the CI ops against the formulas, with a full mask (S*S pairs). */
static void test_bert_flops(void) {
    const char *params[] = {"mask=full"};
    graph g;
    graph_init(&g);
    stof_error err;
    int rc = lua_api_build(SCRIPTS "bert.lua", params, 1, &g, NULL, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc != STOF_OK)
        return;
    const double B = 8, S = 512, H = 768, heads = 12, D = 64, layers = 12, M = B * S;
    double gemm = 2 * M * H * 3 * H + 2 * M * H * H + 2 * 2 * M * H * 4 * H;
    double attention = 4 * B * heads * S * S * D;
    double want = layers * (gemm + attention);
    CHECK_NEAR(ci_flops(&g), want, want * 1e-12);
    CHECK_EQ_INT(g.n_masks, 1);
    graph_free(&g);
}

static void test_bert_params(void) {
    const char *params[] = {"batch=2", "seq=128", "preset=small"};
    graph g;
    graph_init(&g);
    stof_error err;
    graph_script info;
    int rc = lua_api_build(SCRIPTS "bert.lua", params, 3, &g, &info, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc != STOF_OK)
        return;
    expect_counts(&g, 16, 16, 8, 9, 0, 4, 0, 1, 4);
    check_shape3(output_of(&g), 2, 128, 512);
    CHECK_EQ_INT(g.masks[0]->q_len, 128);
    CHECK(strcmp(param_value(&info, "batch"), "2") == 0);
    CHECK(strcmp(param_value(&info, "seq"), "128") == 0);
    CHECK(strcmp(param_value(&info, "preset"), "small") == 0);
    CHECK(strcmp(g.name, "bert-small") == 0);
    int pos = graph_find_tensor(&g, "embeddings.position_embeddings.weight");
    CHECK(pos >= 0 && g.tensors[pos].shape[0] == 512);
    graph_free(&g);

    /* Longer than 512: the position table grows with seq. */
    const char *longer[] = {"batch=1", "seq=1024", "preset=large", "layers=2", "mask=none"};
    graph_init(&g);
    rc = lua_api_build(SCRIPTS "bert.lua", longer, 5, &g, NULL, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc == STOF_OK) {
        pos = graph_find_tensor(&g, "embeddings.position_embeddings.weight");
        CHECK(pos >= 0 && g.tensors[pos].shape[0] == 1024 && g.tensors[pos].shape[1] == 1024);
        check_shape3(output_of(&g), 1, 1024, 1024);
        CHECK_EQ_INT(g.n_layers, 2);
        CHECK_EQ_INT(g.n_masks, 0);
    }
    graph_free(&g);

    /* A preset the script does not know is the script's own error. */
    const char *bad[] = {"preset=huge"};
    graph_init(&g);
    rc = lua_api_build(SCRIPTS "bert.lua", bad, 1, &g, NULL, &err);
    expect_failure(rc, &g, &err, "bert.lua:", "unknown preset 'huge'", __LINE__);
    graph_free(&g);
}

static void test_gpt2(void) {
    graph g;
    graph_init(&g);
    stof_error err;
    int rc = lua_api_build(SCRIPTS "gpt2.lua", NULL, 0, &g, NULL, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc != STOF_OK)
        return;
    /* 12 x (ln_1, c_attn, attn, c_proj, add, ln_2, c_fc, gelu, c_proj, add)
     * with a bias per projection, plus the embedding and ln_f. */
    expect_counts(&g, 48, 48, 24, 25, 0, 12, 0, 1, 12);
    check_shape3(output_of(&g), 8, 512, 768);
    CHECK_EQ_INT(g.n_masks, 0);
    for (int i = 0; i < g.n_ops; i++) {
        const graph_op *op = &g.ops[i];
        if (op->kind == OP_GEMM) /* Conv1D weights read transposed: [N, K] */
            CHECK_EQ_INT(op->attr.gemm.weight_kn, 0);
        if (op->kind == OP_GELU)
            CHECK_EQ_INT(op->attr.gelu.tanh, 1);
        if (op->kind == OP_ATTENTION) {
            CHECK_EQ_INT(op->attr.attn.causal, 1);
            CHECK_EQ_INT(op->attr.attn.mask, -1);
        }
        if (op->kind == OP_LAYERNORM)
            CHECK_NEAR(op->attr.norm.eps, 1e-5, 1e-12);
    }
    int w = graph_find_tensor(&g, "h.3.attn.c_attn.weight");
    CHECK(w >= 0 && g.tensors[w].shape[0] == 2304 && g.tensors[w].shape[1] == 768);
    const graph_source *ws = w >= 0 ? graph_source_of(&g, w) : NULL;
    CHECK(ws && ws->transposed && ws->n == 1 &&
          strcmp(graph_source_part(&g, ws, 0), "h.3.attn.c_attn.weight") == 0);
    /* the default scale follows the fan-in, the last dimension */
    CHECK(w >= 0 && fabsf(g.tensors[w].init_scale - 1.0f / sqrtf(768.0f)) < 1e-7f);
    int wpe = graph_find_tensor(&g, "wpe.weight");
    CHECK(wpe >= 0 && g.tensors[wpe].shape[0] == 1024);
    CHECK(graph_find_tensor(&g, "ln_f.weight") >= 0);
    check_lines(&g);
    graph_free(&g);

    /* A mask is combined with causal: the op carries both. */
    const char *params[] = {"mask=sliding_window{band=16}", "seq=128", "batch=2"};
    graph_init(&g);
    rc = lua_api_build(SCRIPTS "gpt2.lua", params, 3, &g, NULL, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc == STOF_OK) {
        CHECK_EQ_INT(g.n_masks, 1);
        for (int i = 0; i < g.n_ops; i++)
            if (g.ops[i].kind == OP_ATTENTION)
                CHECK(g.ops[i].attr.attn.causal == 1 && g.ops[i].attr.attn.mask == 0);
    }
    graph_free(&g);
}

static void check_t5_attention(const graph *g, int *self_enc, int *self_dec, int *cross) {
    int enc_table = graph_find_tensor(
        g, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
    int dec_table = graph_find_tensor(
        g, "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
    CHECK(enc_table >= 0 && dec_table >= 0);
    for (int i = 0; i < g->n_ops; i++) {
        const graph_op *op = &g->ops[i];
        if (op->kind != OP_ATTENTION)
            continue;
        const op_attention *a = &op->attr.attn;
        CHECK_NEAR(a->scale, 1.0, 0);
        if (a->cross) {
            (*cross)++;
            CHECK(a->relpos == 0 && a->causal == 0 && op->n_inputs == 2);
        } else if (a->causal) {
            (*self_dec)++;
            CHECK(a->relpos && !a->relpos_bidirectional && op->inputs[1] == dec_table);
        } else {
            (*self_enc)++;
            CHECK(a->relpos && a->relpos_bidirectional && op->inputs[1] == enc_table);
            CHECK(a->relpos_buckets == 32 && a->relpos_max_distance == 128);
        }
    }
}

static void test_t5(void) {
    graph g;
    graph_init(&g);
    stof_error err;
    int rc = lua_api_build(SCRIPTS "t5.lua", NULL, 0, &g, NULL, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc != STOF_OK)
        return;
    /* Encoder: 6 x (2 rmsnorm, qkv, attn, o, add, wi, relu, wo, add) + final norm.
     * Decoder: 6 x (3 rmsnorm, qkv, attn, o, add, q, kv, attn, o, add, wi,
     * relu, wo, add) + final norm. Two embeddings (shared table). */
    expect_counts(&g, 6 * 4 + 6 * 7, 0, 6 * 2 + 6 * 3, 0, 6 * 2 + 1 + 6 * 3 + 1, 0, 12, 2,
                  6 + 12);
    check_shape3(output_of(&g), 8, 512, 512);
    CHECK_EQ_INT(g.n_layers, 12);
    CHECK_EQ_INT(g.n_masks, 0);
    int enc = 0, dec = 0, cross = 0;
    check_t5_attention(&g, &enc, &dec, &cross);
    CHECK(enc == 6 && dec == 6 && cross == 6);
    int kv = graph_find_tensor(&g, "decoder.block.5.layer.1.EncDecAttention.kv.weight");
    CHECK(kv >= 0 && g.tensors[kv].shape[0] == 1024 && g.tensors[kv].shape[1] == 512);
    CHECK(graph_find_tensor(&g, "shared.weight") >= 0);
    CHECK(graph_find_tensor(&g, "encoder.block.1.layer.0.SelfAttention."
                                "relative_attention_bias.weight") < 0);
    for (int i = 0; i < g.n_ops; i++)
        if (g.ops[i].kind == OP_RMSNORM)
            CHECK_NEAR(g.ops[i].attr.norm.eps, 1e-6, 1e-12);
    check_lines(&g);
    graph_free(&g);

    /* t5-base with a shorter decoder and an encoder mask. */
    const char *params[] = {"preset=t5-base", "batch=2", "seq=256", "dec_seq=64",
                            "mask=longformer"};
    graph_init(&g);
    rc = lua_api_build(SCRIPTS "t5.lua", params, 5, &g, NULL, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc == STOF_OK) {
        expect_counts(&g, 12 * 4 + 12 * 7, 0, 12 * 5, 0, 12 * 5 + 2, 0, 24, 2, 36);
        check_shape3(output_of(&g), 2, 64, 768);
        CHECK_EQ_INT(g.n_masks, 1);
        CHECK_EQ_INT(g.masks[0]->q_len, 256);
    }
    graph_free(&g);
}

/* ---- masks built in Lua against the same masks built in C --------------------------- */

#define MB 2  /* batch */
#define MS 80 /* sequence length: more than one 64-bit word per row */

/* Builds a one-attention model whose mask is the Lua expression expr;
 * returns its graph mask (NULL for none) in g. */
static const mask *lua_mask(const char *expr, graph *g, stof_error *err) {
    char src[2048];
    snprintf(src, sizeof src,
             "local m = stof.model{name = 'masks'}\n"
             "local mask = %s\n"
             "local x = m:input('x', {%d, %d, 3 * 2 * 8})\n"
             "m:output(m:attention(x, {heads = 2, head_dim = 8, mask = mask}))\n"
             "return m\n",
             expr, MB, MS);
    if (build_inline(src, NULL, 0, g, err) != STOF_OK)
        return NULL;
    int id = g->ops[g->n_ops - 1].attr.attn.mask;
    return id >= 0 ? g->masks[id] : NULL;
}

static int masks_equal(const mask *a, const mask *b) {
    if (!a || !b || a->q_len != b->q_len || a->k_len != b->k_len)
        return 0;
    for (int bb = 0; bb < MB; bb++)
        for (int i = 0; i < a->q_len; i++)
            for (int j = 0; j < a->k_len; j++)
                if (mask_get(a, bb, i, j) != mask_get(b, bb, i, j))
                    return 0;
    return 1;
}

/* The Lua expression builds the same bits as the C spec (owned here). */
static void expect_same_mask(const char *expr, mask_spec *spec, int line) {
    graph g;
    stof_error err;
    const mask *from_lua = lua_mask(expr, &g, &err);
    CHECK_MSG(from_lua != NULL, "%s: %s (test line %d)", expr, err.msg, line);
    mask *from_c = NULL;
    int rc = mask_build(spec, MB, MS, MS, &from_c, &err);
    CHECK_MSG(rc == STOF_OK, "%s (test line %d)", err.msg, line);
    if (from_lua && from_c)
        CHECK_MSG(masks_equal(from_lua, from_c), "%s differs from the C mask (test line %d)",
                  expr, line);
    mask_free(from_c);
    mask_spec_free(spec);
    graph_free(&g);
}

static mask_spec *spec_of(mask_kind kind, int band, int global, int dilation) {
    mask_spec *s = mask_spec_new(kind);
    s->band = band;
    s->global = global;
    s->dilation = dilation;
    return s;
}

static mask_spec *spec_random(mask_kind kind, double rate, int block, uint64_t seed) {
    mask_spec *s = mask_spec_new(kind);
    s->rate = rate;
    s->block = block;
    s->seed = seed;
    return s;
}

static mask_spec *spec_pair(mask_kind kind, mask_spec *a, mask_spec *b) {
    mask_spec *kids[2] = {a, b};
    return mask_spec_combine(kind, kids, 2);
}

static mask_spec *spec_lengths(int a, int b) {
    mask_spec *s = mask_spec_new(MASK_KEY_PADDING);
    s->lengths = malloc(2 * sizeof *s->lengths);
    s->lengths[0] = a;
    s->lengths[1] = b;
    s->n_lengths = 2;
    return s;
}

static void test_mask_constructors(void) {
#define SAME(expr, spec) expect_same_mask(expr, spec, __LINE__)
    SAME("stof.mask.sliding_window{band = 5}", spec_of(MASK_SLIDING, 5, 0, 0));
    SAME("stof.mask.sliding_window()", spec_of(MASK_SLIDING, 0, 0, 0));
    SAME("stof.mask.dilated{band = 3, dilation = 2}", spec_of(MASK_DILATED, 3, 0, 2));
    SAME("stof.mask.global{width = 4}", spec_of(MASK_GLOBAL, 0, 4, 0));
    SAME("stof.mask.longformer{global = 3, band = 4}", spec_of(MASK_LONGFORMER, 4, 3, 0));
    SAME("stof.mask.random{rate = 0.3, block = 8, seed = 7}",
         spec_random(MASK_RANDOM, 0.3, 8, 7));
    mask_spec *bb = spec_random(MASK_BIGBIRD, 0.2, 16, 3);
    bb->band = 3;
    bb->global = 2;
    SAME("stof.mask.bigbird{global = 2, band = 3, rate = 0.2, block = 16, seed = 3}", bb);
    SAME("stof.mask.causal()", spec_of(MASK_CAUSAL, 0, 0, 0));
    SAME("stof.mask.full()", spec_of(MASK_DENSE_ALL, 0, 0, 0));
    SAME("stof.mask.key_padding{lengths = {10, 75}}", spec_lengths(10, 75));
    SAME("stof.mask.per_batch{stof.mask.causal(), stof.mask.sliding_window{band = 2}}",
         spec_pair(MASK_PER_BATCH, spec_of(MASK_CAUSAL, 0, 0, 0),
                   spec_of(MASK_SLIDING, 2, 0, 0)));
    SAME("stof.mask.union(stof.mask.global{width = 2}, stof.mask.sliding_window{band = 1})",
         spec_pair(MASK_UNION, spec_of(MASK_GLOBAL, 0, 2, 0), spec_of(MASK_SLIDING, 1, 0, 0)));
    SAME("stof.mask.intersect(stof.mask.causal(), stof.mask.sliding_window{band = 6})",
         spec_pair(MASK_INTERSECT, spec_of(MASK_CAUSAL, 0, 0, 0),
                   spec_of(MASK_SLIDING, 6, 0, 0)));
    SAME("stof.mask.global{width = 2} + stof.mask.sliding_window{band = 1}",
         spec_pair(MASK_UNION, spec_of(MASK_GLOBAL, 0, 2, 0), spec_of(MASK_SLIDING, 1, 0, 0)));
    SAME("stof.mask.causal() * stof.mask.sliding_window{band = 6}",
         spec_pair(MASK_INTERSECT, spec_of(MASK_CAUSAL, 0, 0, 0),
                   spec_of(MASK_SLIDING, 6, 0, 0)));
    SAME("stof.mask.parse('longformer{global=3, band=4}')", spec_of(MASK_LONGFORMER, 4, 3, 0));
    SAME("stof.mask.named('bigbird')", spec_of(MASK_BIGBIRD, 0, 0, 0));
    SAME("stof.mask.named('sliding_window{band=7}')", spec_of(MASK_SLIDING, 7, 0, 0));
    /* Predicates: the same bits as the structured pattern they spell out. */
    SAME("stof.mask.predicate(function(i, j) return math.abs(i - j) <= 5 end)",
         spec_of(MASK_SLIDING, 5, 0, 0));
    SAME("stof.mask.predicate(function(i, j) return j <= i end) + stof.mask.global{width = 3}",
         spec_pair(MASK_UNION, spec_of(MASK_CAUSAL, 0, 0, 0), spec_of(MASK_GLOBAL, 0, 3, 0)));
    /* A predicate that reads b is evaluated per batch. */
    SAME("stof.mask.predicate(function(i, j, b) return j < ({10, 75})[b + 1] end)",
         spec_lengths(10, 75));
#undef SAME
}

static void test_mask_objects(void) {
    graph g;
    stof_error err;
    /* named("none") is no mask at all. */
    CHECK(lua_mask("stof.mask.named('none')", &g, &err) == NULL);
    CHECK_MSG(g.n_ops == 1 && g.n_masks == 0, "%s", err.msg);
    graph_free(&g);

    /* tostring is the text form; a mask built for two shapes is built twice,
     * for one shape once. */
    const char *src =
        "local m = stof.model{name = tostring(stof.mask.sliding_window{band = 5})}\n"
        "local w = stof.mask.sliding_window{band = 3}\n"
        "local a = m:input('a', {2, 64, 48})\n"
        "local b = m:input('b', {2, 32, 48})\n"
        "local x = m:attention(a, {heads = 2, head_dim = 8, mask = w})\n"
        "x = m:attention(a, {heads = 2, head_dim = 8, mask = w})\n"
        "local y = m:attention(b, {heads = 2, head_dim = 8, mask = w})\n"
        "m:output(y)\n"
        "return m\n";
    int rc = build_inline(src, NULL, 0, &g, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc == STOF_OK) {
        CHECK(strcmp(g.name, "sliding_window{band=5}") == 0);
        CHECK_EQ_INT(g.n_masks, 2);
        CHECK_EQ_INT(g.ops[0].attr.attn.mask, g.ops[1].attr.attn.mask);
        CHECK(g.ops[2].attr.attn.mask != g.ops[0].attr.attn.mask);
        CHECK_EQ_INT(g.masks[g.ops[2].attr.attn.mask]->q_len, 32);
    }
    graph_free(&g);

    /* Cross-attention masks are built for (Sq, Sk). */
    const char *cross =
        "local m = stof.model{name = 'cross'}\n"
        "local q = m:input('q', {2, 16, 32})\n"
        "local kv = m:input('kv', {2, 48, 64})\n"
        "m:output(m:attention(q, kv, {heads = 4, head_dim = 8, causal = true,\n"
        "                              mask = stof.mask.global{width = 2}}))\n"
        "return m\n";
    rc = build_inline(cross, NULL, 0, &g, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc == STOF_OK) {
        CHECK(g.n_masks == 1 && g.masks[0]->q_len == 16 && g.masks[0]->k_len == 48);
        CHECK(g.ops[0].attr.attn.cross == 1 && g.ops[0].attr.attn.causal == 1);
        check_shape3(output_of(&g), 2, 16, 32);
    }
    graph_free(&g);
}

/* ---- errors ------------------------------------------------------------------ */

#define MODEL_PRELUDE                                 \
    "local m = stof.model{name = 't'}\n"              \
    "local x = m:input('x', {2, 16, 768})\n"         \
    "local w = m:weight('w', {1024, 1024})\n"

static void test_script_errors(void) {
    EXPECT_ERROR("local m = stof.model{name = 't'}\n\nlocal x = = 1\n", "model.lua:3:", "'='");
    EXPECT_ERROR(MODEL_PRELUDE "local y = m:gemm(x, 5)\n", "model.lua:4:",
                 "bad argument #2 to 'gemm' (tensor expected, got number)");
    EXPECT_ERROR(MODEL_PRELUDE "local y = m:gemm(x)\n", "model.lua:4:", "bad argument #2");
    EXPECT_ERROR(MODEL_PRELUDE "\nlocal y = m:nosuch(x)\n", "model.lua:5:", "'nosuch'");
    EXPECT_ERROR(MODEL_PRELUDE "local y = m:gemm(x, w)\n", "model.lua:4:", "768");
    EXPECT_ERROR(MODEL_PRELUDE "local y = m:gemm(x, w)\n", "model.lua:4:", "1024");
    EXPECT_ERROR("local m = stof.model{name = 't'}\nlocal t = m:weight('big', {1e12})\n",
                 "model.lua:2:", "1000000000000");
    EXPECT_ERROR("local m = stof.model{name = 't'}\nm:weight('big', {1e300})\n", "model.lua:2:",
                 "must be an integer");
    EXPECT_ERROR("local m = stof.model{name = 't'}\nm:weight('w', {1, 2, 3, 4, 5})\n",
                 "model.lua:2:", "1 to 4 dimensions");
    EXPECT_ERROR(MODEL_PRELUDE "m:weight('w', {4})\n", "model.lua:4:", "already defined");
    EXPECT_ERROR(MODEL_PRELUDE "m:weight('v', {4}, {init = 'gaussian'})\n", "model.lua:4:",
                 "unknown init 'gaussian'");
    EXPECT_ERROR(MODEL_PRELUDE "m:weight('v', {4}, {sclae = 1})\n", "model.lua:4:",
                 "unknown option 'sclae'");
    EXPECT_ERROR("local m = stof.model{name = 't', dtype = 'fp8'}\n", "model.lua:1:",
                 "unknown dtype 'fp8'");
    EXPECT_ERROR("local m = stof.model{name = 't'}\nm:input('ids', {2, 3}, {dtype = 'int32'})\n",
                 "model.lua:2:", "need high");
    EXPECT_ERROR(MODEL_PRELUDE "m:attention(x, {heads = 4})\n", "model.lua:4:",
                 "heads and head_dim are required");
    EXPECT_ERROR(MODEL_PRELUDE "m:attention(x, {heads = 4, head_dim = 32})\n", "model.lua:4:",
                 "768");
    EXPECT_ERROR(MODEL_PRELUDE "m:attention(x, {heads = 4, head_dim = 64, head = 1})\n",
                 "model.lua:4:", "unknown option 'head'");
    EXPECT_ERROR(MODEL_PRELUDE "m:attention(x, {heads = 4, head_dim = 64, mask = 'causal'})\n",
                 "model.lua:4:", "must be a mask");
    /* global tokens: global_qkv needs global; the op names what may not go with them */
    EXPECT_ERROR(MODEL_PRELUDE "m:attention(x, {heads = 4, head_dim = 64, global_qkv = x})\n",
                 "model.lua:4:", "global_qkv needs global");
    EXPECT_ERROR(MODEL_PRELUDE "local g = m:input('g', {2, 16}, {dtype = 'int32', high = 2})\n"
                 "m:attention(m:gemm(x, m:weight('q', {1536, 768})), {heads = 4, head_dim = 128,"
                 " global = g, causal = true})\n",
                 "model.lua:5:", "global tokens are an encoder's");
    EXPECT_ERROR(MODEL_PRELUDE "m:attention(x, {heads = 4, head_dim = 64, global = x})\n",
                 "model.lua:4:", "global_mask 'x' [2, 16, 768] must be int32 [2, 16]");
    EXPECT_ERROR(MODEL_PRELUDE "m:layer(function() m:layer(function() end) end)\n",
                 "model.lua:4:", "cannot nest");
    EXPECT_ERROR(MODEL_PRELUDE "print(x.nosuch)\n", "model.lua:4:", "no field 'nosuch'");
    EXPECT_ERROR(MODEL_PRELUDE "stof.model{name = 'again'}\n", "model.lua:4:", "only once");
    EXPECT_ERROR(MODEL_PRELUDE "m:output(w)\n", "model.lua:4:", "computed by an operator");
    EXPECT_ERROR(MODEL_PRELUDE "error('custom failure')\n", "model.lua:4:", "custom failure");
    EXPECT_ERROR(MODEL_PRELUDE "error({})\n", "model.lua:", "table");
    EXPECT_ERROR("local m = stof.model{name = 't'}\n", "model.lua:",
                 "must return the model made by stof.model{...}");
    EXPECT_ERROR("return 42\n", "model.lua:", "must return the model");
    EXPECT_ERROR("local m = stof.model{name = 't'}\nreturn m\n", "model.lua:", "no operators");
    EXPECT_ERROR(MODEL_PRELUDE "m:gelu(x)\nreturn m\n", "model.lua:", "sets no output");
    /* Mask mistakes. */
    EXPECT_ERROR("local a = stof.mask.sliding_window{band = -1}\n", "model.lua:1:", "band");
    EXPECT_ERROR("local a = stof.mask.random{rate = 2}\n", "model.lua:1:", "rate");
    EXPECT_ERROR("local a = stof.mask.bigbird{bnd = 2}\n", "model.lua:1:", "unknown option 'bnd'");
    EXPECT_ERROR("local a = stof.mask.causal() + nil\n", "model.lua:1:", "must be masks");
    EXPECT_ERROR("local a = stof.mask.parse('nonsense{')\n", "model.lua:1:", "nonsense");
    EXPECT_ERROR("local a = stof.mask.union()\n", "model.lua:1:", "at least one");
    EXPECT_ERROR(MODEL_PRELUDE "local q = m:input('q', {2, 16, 48})\n"
                 "m:attention(q, {heads = 2, head_dim = 8, "
                 "mask = stof.mask.key_padding{lengths = {1, 2, 3}}})\n",
                 "model.lua:5:", "3 lengths");
}

static void test_predicate_errors(void) {
    const char *src = "local m = stof.model{name = 't'}\n"
                      "local x = m:input('x', {2, 16, 48})\n"
                      "local p = stof.mask.predicate(function(i, j)\n"
                      "  if i == 3 then error('boom') end\n"
                      "  return true\n"
                      "end)\n"
                      "m:output(m:attention(x, {heads = 2, head_dim = 8, mask = p}))\n"
                      "return m\n";
    EXPECT_ERROR(src, "model.lua:4: boom", "line 7");
    const char *number = "local m = stof.model{name = 't'}\n"
                         "local x = m:input('x', {2, 16, 48})\n"
                         "local p = stof.mask.predicate(function(i, j) return 1 end)\n"
                         "m:output(m:attention(x, {heads = 2, head_dim = 8, mask = p}))\n"
                         "return m\n";
    EXPECT_ERROR(number, "model.lua:3:", "true or false, got a number");
    const char *nil_index = "local m = stof.model{name = 't'}\n"
                            "local x = m:input('x', {2, 16, 48})\n"
                            "local p = stof.mask.predicate(function(i, j)\n"
                            "  return nothing.here end)\n"
                            "m:output(m:attention(x, {heads = 2, head_dim = 8, mask = p}))\n"
                            "return m\n";
    EXPECT_ERROR(nil_index, "model.lua:4:", "nothing");
}

static void test_param_errors(void) {
    const char *src = "local p = stof.params{batch = 8, seq = 512, mask = 'none', causal = false,\n"
                      "                      rate = 0.5}\n"
                      "local m = stof.model{name = p.mask}\n"
                      "local x = m:input('x', {p.batch, p.seq, 48})\n"
                      "m:output(m:attention(x, {heads = 2, head_dim = 8, causal = p.causal}))\n"
                      "return m\n";
    graph g;
    stof_error err;
    const char *unknown[] = {"batch=2", "heads=4"};
    int rc = build_inline(src, unknown, 2, &g, &err);
    expect_failure(rc, &g, &err, "model.lua:1:", "unknown parameter 'heads'", __LINE__);
    CHECK_CONTAINS(err.msg, "batch, causal, mask, rate, seq");
    graph_free(&g);
    const char *cases[][2] = {
        {"batch=abc", "batch=abc"}, {"batch=2.5", "expected an integer"},
        {"causal=yes", "true or false"}, {"rate=x", "expected a number"},
        {"novalue", "not key=value"}, {"=3", "not key=value"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        rc = build_inline(src, &cases[k][0], 1, &g, &err);
        expect_failure(rc, &g, &err, "model.lua:1:", cases[k][1], __LINE__);
        graph_free(&g);
    }
    /* Conversions to the default's type. */
    graph_script info;
    const char *good[] = {"batch=3", "causal=true", "rate=0.25", "mask=full", "seq=2.0e1"};
    graph_init(&g);
    rc = lua_api_build_string(src, "model.lua", NULL, good, 5, &g, &info, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc == STOF_OK) {
        check_shape3(output_of(&g), 3, 20, 16);
        CHECK_EQ_INT(g.ops[0].attr.attn.causal, 1);
        CHECK(strcmp(g.name, "full") == 0);
        CHECK_EQ_INT(info.n_params, 5);
        CHECK(strcmp(param_value(&info, "rate"), "0.25") == 0);
        CHECK(strcmp(param_value(&info, "causal"), "true") == 0);
        CHECK(strcmp(param_value(&info, "seq"), "20") == 0);
    }
    graph_free(&g);
    /* --set for a script that declares no parameters. */
    const char *one[] = {"batch=2"};
    rc = build_inline(MODEL_PRELUDE "m:output(m:gelu(x))\nreturn m\n", one, 1, &g, &err);
    expect_failure(rc, &g, &err, "batch=2", "declares none", __LINE__);
    graph_free(&g);
}

/* ---- the sandbox --------------------------------------------------------------- */

static void test_sandbox(void) {
    EXPECT_ERROR("local f = io.open('/etc/passwd')\n", "model.lua:1:", "io");
    EXPECT_ERROR("\nos.execute('true')\n", "model.lua:2:", "os");
    EXPECT_ERROR("local os = require('os')\n", "model.lua:1:", "no helper module 'os'");
    EXPECT_ERROR("local x = require('../../etc/passwd')\n", "model.lua:1:",
                 "not a helper module name");
    EXPECT_ERROR("dofile('/etc/passwd')\n", "model.lua:1:", "dofile");
    EXPECT_ERROR("loadfile('/etc/passwd')\n", "model.lua:1:", "loadfile");
    EXPECT_ERROR("local f = assert(load(string.char(27) .. 'LuaT\\0'))\n", "model.lua:1:",
                 "binary chunk");
    EXPECT_ERROR("local d = string.dump(function() end)\n", "model.lua:1:", "dump");
    EXPECT_ERROR("debug.sethook()\n", "model.lua:1:", "debug");
    EXPECT_ERROR("package.loadlib('x', 'y')\n", "model.lua:1:", "package");
    EXPECT_ERROR("local f, e = load('local a = = 1', '=chunk')\nerror(e)\n", "model.lua:2:",
                 "chunk:1:");
    EXPECT_ERROR("local t = getmetatable(stof.mask.causal())\nt.__gc = nil\n", "model.lua:2:",
                 "boolean");
    EXPECT_ERROR("setmetatable(stof.mask.causal(), {})\n", "model.lua:1:", "");
    /* What is allowed works: text load in the sandbox, string/table/math/utf8,
     * print (to stderr), pcall of ordinary errors. */
    const char *ok = "local f = load('return 6 * 7')\n"
                     "assert(f() == 42)\n"
                     "assert(pcall(error, 'caught') == false)\n"
                     "assert(utf8.char(72) == 'H' and table.concat({1, 2}, ',') == '1,2')\n"
                     "assert(string.format('%d', math.floor(2.5)) == '2')\n"
                     "print('test_lua: print from a script goes to stderr')\n"
                     "local m = stof.model{name = 'ok-' .. math.random(1, 1000000)}\n"
                     "local x = m:input('x', {2, 3})\n"
                     "m:output(m:relu(x, {name = 'r'}))\n"
                     "return m\n";
    graph g1, g2;
    stof_error err;
    int rc = build_inline(ok, NULL, 0, &g1, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    rc = build_inline(ok, NULL, 0, &g2, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    /* math.random starts from a fixed seed: the same script, the same graph. */
    CHECK(strcmp(g1.name, g2.name) == 0);
    CHECK(g1.n_ops == 1 && strcmp(g1.ops[0].name, "r") == 0);
    graph_free(&g1);
    graph_free(&g2);
}

static void test_budgets(void) {
    graph g;
    stof_error err;
    int rc = build_limited("local n = 0\nwhile true do\n  n = n + 1\nend\n", 1000000, 0, &g,
                           &err);
    expect_failure(rc, &g, &err, "model.lua:", "ran too long", __LINE__);
    graph_free(&g);
    /* pcall cannot swallow the budget error. */
    rc = build_limited("while true do pcall(function() while true do end end) end\n", 1000000,
                       0, &g, &err);
    expect_failure(rc, &g, &err, "model.lua:1:", "ran too long", __LINE__);
    graph_free(&g);
    rc = build_limited("local function f() while true do end end\n"
                       "while true do xpcall(f, function(e) return 'hidden' end) end\n",
                       1000000, 0, &g, &err);
    expect_failure(rc, &g, &err, "model.lua:1:", "ran too long", __LINE__);
    graph_free(&g);
    /* A predicate counts too. */
    rc = build_limited("local m = stof.model{name = 't'}\n"
                       "local x = m:input('x', {2, 64, 48})\n"
                       "local p = stof.mask.predicate(function(i, j) while true do end end)\n"
                       "m:output(m:attention(x, {heads = 2, head_dim = 8, mask = p}))\n"
                       "return m\n",
                       1000000, 0, &g, &err);
    expect_failure(rc, &g, &err, "model.lua:3:", "ran too long", __LINE__);
    graph_free(&g);
    /* Memory: a hog stops cleanly at the cap, even under pcall. */
    rc = build_limited("local t = {}\nfor i = 1, 1e9 do t[i] = string.rep('x', 1 << 20) .. i end\n",
                       0, 64u << 20, &g, &err);
    expect_failure(rc, &g, &err, "model.lua", "ran out of memory", __LINE__);
    graph_free(&g);
    rc = build_limited("local t = {}\n"
                       "for i = 1, 1e9 do pcall(function() t[i] = string.rep('x', 1 << 20) .. i "
                       "end) end\n",
                       0, 64u << 20, &g, &err);
    expect_failure(rc, &g, &err, "model.lua", "ran out of memory", __LINE__);
    graph_free(&g);
    /* The default limits. */
    EXPECT_ERROR("local s = string.rep('x', (1 << 31) - 1)\n", "model.lua", "ran out of memory");
    rc = build_inline("while true do end\n", NULL, 0, &g, &err);
    expect_failure(rc, &g, &err, "model.lua:1:", "ran too long (more than 1000000000", __LINE__);
    graph_free(&g);
}

/* ---- what a probe of bad scripts found: each ends at once, with the line ------ */

static void test_sandbox_escapes(void) {
    graph g;
    stof_error err;
    /* A message handler that loops: the hook's own error reaches it with
     * hooks off, so it must not be run again once the budget is spent. */
    int rc = build_limited("xpcall(error, function() while true do end end)\n", 1000000, 0, &g,
                           &err);
    expect_failure(rc, &g, &err, "model.lua:1:", "ran too long", __LINE__);
    graph_free(&g);
    /* A handler still sees ordinary errors. */
    rc = build_inline("local ok, e = xpcall(error, function(m) return 'seen ' .. m end, 'x')\n"
                      "assert(not ok and e == 'seen x')\n"
                      "error('done')\n",
                      NULL, 0, &g, &err);
    expect_failure(rc, &g, &err, "model.lua:3:", "done", __LINE__);
    graph_free(&g);
    /* Finalizers run with hooks off (and at lua_close, after validation):
     * refused, whatever the __gc value. */
    EXPECT_ERROR("setmetatable({}, {__gc = function() while true do end end})\n",
                 "model.lua:1:", "__gc finalizers are not allowed");
    EXPECT_ERROR("setmetatable({}, {__gc = false})\n", "model.lua:1:", "__gc");
    EXPECT_ERROR("setmetatable({}, 5)\n", "model.lua:1:", "nil or table");
    /* Other metatables still work, and a protected one stays protected. */
    rc = build_inline("local t = setmetatable({}, {__index = function() return 7 end})\n"
                      "assert(t.x == 7)\n"
                      "setmetatable(t, {__metatable = 'locked'})\n"
                      "setmetatable(t, {})\n",
                      NULL, 0, &g, &err);
    expect_failure(rc, &g, &err, "model.lua:4:", "protected metatable", __LINE__);
    graph_free(&g);
}

static void test_pattern_budget(void) {
    graph g;
    stof_error err;
    /* Backtracking runs in C: refused by its worst case before it starts. */
    EXPECT_ERROR("local r = (('a'):rep(30) .. 'b'):find(('a*'):rep(12) .. 'c')\n",
                 "model.lua:1:", "string.find: this pattern may take up to");
    EXPECT_ERROR("for w in (('a'):rep(4000)):gmatch('a*a*a*a*a*b') do end\n", "model.lua:1:",
                 "string.gmatch");
    /* Ordinary patterns and plain finds run. */
    int rc = build_inline("assert(('64,128'):match('^(%d+),(%d+)$') == '64')\n"
                          "local n = 0\n"
                          "for d in ('1,2,3,4'):gmatch('%d+') do n = n + 1 end\n"
                          "assert(n == 4)\n"
                          "assert(('  pad  '):gsub('^%s*(.-)%s*$', '%1') == 'pad')\n"
                          "assert((('a*'):rep(12)):find('a*a*', 1, true) == 1)\n"
                          "assert(('[x]'):find('[]]') == 3)\n"
                          "error('patterns ran')\n",
                          NULL, 0, &g, &err);
    expect_failure(rc, &g, &err, "model.lua:8:", "patterns ran", __LINE__);
    graph_free(&g);
}

static void test_c_side_work(void) {
    graph g;
    stof_error err;
    /* Combining copies its operands: doubling stops long before memory. */
    EXPECT_ERROR("local k = stof.mask.causal()\nfor i = 1, 40 do k = k + k end\n", "model.lua:2:",
                 "mask expression of");
    /* The masks' bits count against the memory budget, before they are made. */
    const char *huge = "local m = stof.model{name = 't'}\n"
                       "local x = m:input('x', {1, 262144, 192})\n"
                       "local w = stof.mask.sliding_window{band = 128}\n"
                       "m:output(m:attention(x, {heads = 1, head_dim = 64, mask = w}))\n"
                       "return m\n";
    EXPECT_ERROR(huge, "model.lua:4:",
                 "the attention mask for (1, 262144, 262144) needs 8192.0 MiB");
    int rc = build_limited("local m = stof.model{name = 't'}\n"
                           "local x = m:input('x', {2, 1024, 192})\n"
                           "local p = stof.mask.key_padding{lengths = {1000, 500}}\n"
                           "m:output(m:attention(x, {heads = 1, head_dim = 64, mask = p}))\n"
                           "return m\n",
                           0, 16u << 20, &g, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg); /* 256 KiB of bits fit 16 MiB */
    graph_free(&g);
    /* Thousands of operators under one name: named apart, in linear time. */
    rc = build_inline("local m = stof.model{name = 't'}\n"
                      "local x = m:input('x', {1, 4, 8})\n"
                      "for i = 1, 4000 do x = m:gelu(x, {name = 'same'}) end\n"
                      "m:output(x)\n"
                      "return m\n",
                      NULL, 0, &g, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc == STOF_OK) {
        CHECK_EQ_INT(g.n_ops, 4000);
        CHECK(graph_find_tensor(&g, "same") == g.ops[0].output);
        CHECK(graph_find_tensor(&g, "same#3999") == g.ops[3999].output);
        CHECK(graph_find_tensor(&g, "same#4000") == -1);
    }
    graph_free(&g);
}

/* C work that allocates (string.rep in a loop) counts against the time
 * budget, and stops the script at once when it is spent. */
static void test_allocation_work(void) {
    graph g;
    stof_error err;
    int rc = build_limited("for i = 1, 1e8 do local s = string.rep('a', 1 << 20) end\n", 1000000,
                           0, &g, &err);
    expect_failure(rc, &g, &err, "model.lua:1:", "ran too long", __LINE__);
    graph_free(&g);
    /* costlier patterns: a plain-literal scan and balanced matches */
    EXPECT_ERROR("local r = string.rep('a', 2e5):find(string.rep('a', 1e4) .. '%d')\n",
                 "model.lua:1:", "string.find: this pattern may take up to");
    EXPECT_ERROR("local r = string.rep('(', 1e5):gsub('%b()', '')\n", "model.lua:1:",
                 "string.gsub: this pattern may take up to");
}

static void test_messages(void) {
    /* A C function between the script and the error (the string metatable
     * forwarding to the mask's) still gets the script's line. */
    EXPECT_ERROR("local k = 'x' * stof.mask.causal()\n", "model.lua:1:",
                 "both operands must be masks");
    /* A predicate that raises a table says where it was written. */
    EXPECT_ERROR("local m = stof.model{name = 't'}\n"
                 "local x = m:input('x', {1, 16, 192})\n"
                 "local p = stof.mask.predicate(function(i, j) error({}) end)\n"
                 "m:output(m:attention(x, {heads = 1, head_dim = 64, mask = p}))\n"
                 "return m\n",
                 "model.lua:3: the predicate raised an error that is a table",
                 "attention at line 4 of model.lua");
    /* Lua's own "C stack overflow", raised where no script frame is current
     * (inside tostring), still names the script line. */
    EXPECT_ERROR("local mt = {}\n"
                 "mt.__tostring = function(x) return tostring(x) end\n"
                 "local s = tostring(setmetatable({}, mt))\n",
                 "model.lua:2:", "C stack overflow");
    /* A helper module that exists but cannot be read says what it is. */
    char dir[] = "/tmp/stof-lua-test-XXXXXX";
    if (mkdtemp(dir)) {
        char sub[128], script[128];
        snprintf(sub, sizeof sub, "%s/helperx.lua", dir);
        snprintf(script, sizeof script, "%s/uses.lua", dir);
        FILE *f = fopen(script, "w");
        if (f) {
            fputs("local h = require('helperx')\n", f);
            fclose(f);
        }
        CHECK(mkdir(sub, 0755) == 0);
        graph g;
        graph_init(&g);
        stof_error err = {0};
        CHECK_EQ_INT(lua_api_build(script, NULL, 0, &g, NULL, &err), STOF_ERR_SCRIPT);
        CHECK_CONTAINS(err.msg, "uses.lua:1: require: ");
        CHECK_CONTAINS(err.msg, "helperx.lua: a directory, not a helper module");
        graph_free(&g);
        rmdir(sub);
        remove(script);
        rmdir(dir);
    }
    /* The newer operators' options. */
    EXPECT_ERROR("local m = stof.model{name = 't'}\n"
                 "local x = m:input('x', {1, 4, 48})\n"
                 "local y = m:rotary(x, {head_dim = 16})\n",
                 "model.lua:3:", "rotary: 'heads' is needed");
    EXPECT_ERROR("local m = stof.model{name = 't'}\n"
                 "local x = m:input('x', {1, 4, 8})\n"
                 "local y = m:glu(x, {act = 'swish'})\n",
                 "model.lua:3:", "glu: unknown act 'swish' (gelu, gelu_tanh, silu)");
    EXPECT_ERROR("local m = stof.model{name = 't'}\n"
                 "local b = m:weight('b', {8}, {constant = true})\n",
                 "model.lua:2:", "a constant is init = \"zeros\" or \"ones\"");
    EXPECT_ERROR("local m = stof.model{name = 't'}\n"
                 "local b = m:weight('b', {8}, {init = 'zeros', constant = true, rows_from = 2})\n",
                 "model.lua:2:", "a constant is read from no file");
    /* transposed: one 2-D checkpoint tensor, nothing else about the file */
    EXPECT_ERROR("local m = stof.model{name = 't'}\n"
                 "local w = m:weight('w', {8}, {transposed = true})\n",
                 "model.lua:2:", "weight 'w': transposed takes a 2-D weight [N, K] (read from a "
                 "[K, N] checkpoint tensor), got 1-D");
    EXPECT_ERROR("local m = stof.model{name = 't'}\n"
                 "local w = m:weight('w', {2, 4, 8}, {transposed = true})\n",
                 "model.lua:2:", "transposed takes a 2-D weight [N, K]");
    EXPECT_ERROR("local m = stof.model{name = 't'}\n"
                 "local w = m:weight('w', {4, 8}, {transposed = true, rows_from = 2})\n",
                 "model.lua:2:", "weight 'w': transposed does not go with rows_from");
    EXPECT_ERROR("local m = stof.model{name = 't'}\n"
                 "local w = m:weight('w', {4, 8}, {transposed = true, from = {'a', 'b'}})\n",
                 "model.lua:2:", "weight 'w': transposed reads one checkpoint tensor: from names "
                 "at most one (got 2)");
    EXPECT_ERROR("local m = stof.model{name = 't'}\n"
                 "local w = m:weight('w', {4, 8}, {transposed = true, from = {'a'},\n"
                 "                                 from_rows = {4}})\n",
                 "model.lua:2:", "from_rows does not go with it");
    EXPECT_ERROR("local m = stof.model{name = 't'}\n"
                 "local w = m:weight('w', {4, 8}, {init = 'zeros', constant = true,\n"
                 "                                 transposed = true})\n",
                 "model.lua:2:", "a constant is read from no file (no from, rows_from, "
                 "transposed)");
    EXPECT_ERROR("local m = stof.model{name = 't'}\n"
                 "local w = m:weight('w', {4, 8}, {transposed = 1})\n",
                 "model.lua:2:", "transposed");
    /* A function that takes no options says so. */
    EXPECT_ERROR("local c = stof.mask.causal{x = 1}\n", "model.lua:1:",
                 "unknown option 'x' (it takes no options)");
}

/* ---- helper modules ------------------------------------------------------------- */

static void test_require(void) {
    graph g;
    graph_init(&g);
    stof_error err;
    int rc = lua_api_build(TEST_SCRIPTS "/uses_helper.lua", NULL, 0, &g, NULL, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc == STOF_OK) {
        expect_counts(&g, 2, 2, 0, 0, 0, 0, 1, 0, 0);
        check_shape3(output_of(&g), 2, 4, 8);
        CHECK_EQ_INT(g.n_layers, 1);
    }
    graph_free(&g);
    /* build_string finds modules in its search folder. */
    rc = build_inline("local h = require('tiny_helper')\n"
                      "assert(h == require('tiny_helper'))\n"
                      "assert(h.loads == 1)\n"
                      "local m = stof.model{name = 't'}\n"
                      "local x = m:input('x', {2, 4, 8})\n"
                      "m:output(h.mlp(m, 'mlp', x, 8, 16))\n"
                      "return m\n",
                      NULL, 0, &g, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    graph_free(&g);
    EXPECT_ERROR("require('self_require')\n", "self_require.lua:2:", "requires itself");
    EXPECT_ERROR("require('bad_helper')\n", "bad_helper.lua:3:", "");
    /* The file is missing. */
    rc = lua_api_build(TEST_SCRIPTS "/no_such_script.lua", NULL, 0, &g, NULL, &err);
    CHECK(rc == STOF_ERR_IO);
    CHECK_CONTAINS(err.msg, "no_such_script.lua");
}

int main(void) {
    test_bert_base();
    test_bert_flops();
    test_bert_params();
    test_gpt2();
    test_t5();
    test_mask_constructors();
    test_mask_objects();
    test_script_errors();
    test_predicate_errors();
    test_param_errors();
    test_sandbox();
    test_budgets();
    test_sandbox_escapes();
    test_pattern_budget();
    test_c_side_work();
    test_messages();
    test_allocation_work();
    test_require();
    return check_summary("test_lua");
}
