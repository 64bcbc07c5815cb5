/* Padding-free runs, the CPU half (core/exec/exec_pack.h): the bucket of packed rows, the
 * lengths of an attention_mask, the row maps (every token once, in order, its position; the
 * rows past the tokens empty; the padded rows pointing nowhere) for fresh random lengths, the
 * errors, and which plans may run packed: the encoders with an attention_mask (bert, bert
 * with a sparse mask, ModernBERT with rotary, GLU and mask_rows, Longformer) under their
 * default and unfused schemes, not a model without one, not a decoder, not T5. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/exec/exec_pack.h"
#include "core/lua/lua_api.h"

#define SCRIPTS STOF_SOURCE_DIR "/scripts/"

static void test_bucket(void) {
    CHECK(exec_pack_bucket(1) == 128);
    CHECK(exec_pack_bucket(256) == 128);
    CHECK(exec_pack_bucket(4096) == 128);
    CHECK(exec_pack_bucket(4097) == 256);
    CHECK(exec_pack_bucket(16 * 2048) == 1024);
    CHECK(exec_pack_bucket(8 * 4096) == 1024);
    CHECK(exec_pack_bucket(16 * 8192) == 4096);
}

static void test_lengths(void) {
    const int32_t am[3 * 4] = {1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0};
    int32_t len[3];
    exec_pack_lengths(am, 3, 4, len);
    CHECK(len[0] == 4 && len[1] == 1 && len[2] == 0);
}

/* Every invariant of a map against the lengths it was made from. */
static void check_map(const exec_pack_map *m, const int32_t *lengths, int batch, int seq) {
    int64_t tokens = 0, padded = (int64_t)batch * seq, bucket = exec_pack_bucket(padded);
    for (int b = 0; b < batch; b++)
        tokens += lengths[b];
    CHECK(m->tokens == tokens);
    CHECK(m->rows >= tokens && m->rows <= padded);
    CHECK(m->rows == padded || m->rows % bucket == 0);
    CHECK(m->rows - tokens < bucket || m->rows == bucket);
    int64_t r = 0, bad = 0;
    for (int b = 0; b < batch; b++) {
        bad += m->start[b] != r; /* each sequence's first packed row */
        for (int j = 0; j < seq; j++) {
            int64_t at = (int64_t)b * seq + j;
            if (j >= lengths[b]) {
                bad += m->dst[at] != -1;
                continue;
            }
            /* packed in order: batch by batch, position by position */
            bad += m->dst[at] != r || m->src[r] != at || m->pos[r] != j || m->valid[r] != 1;
            r++;
        }
    }
    bad += m->start[batch] != tokens;
    for (; r < m->rows; r++)
        bad += m->src[r] != -1 || m->pos[r] != 0 || m->valid[r] != 0;
    CHECK_MSG(bad == 0, "%lld wrong map entries (batch %d, seq %d)", (long long)bad, batch, seq);
}

static void test_maps(void) {
    stof_error err = {0};
    exec_pack_map m;
    const int32_t a[4] = {256, 10, 0, 100};
    CHECK_EQ_INT(exec_pack_map_build(a, 4, 256, &m, &err), STOF_OK);
    CHECK(m.tokens == 366 && m.rows == 384);
    check_map(&m, a, 4, 256);
    exec_pack_map_free(&m);
    /* no token at all: one bucket of empty rows */
    const int32_t none[2] = {0, 0};
    CHECK_EQ_INT(exec_pack_map_build(none, 2, 512, &m, &err), STOF_OK);
    CHECK(m.tokens == 0 && m.rows == 128);
    check_map(&m, none, 2, 512);
    exec_pack_map_free(&m);
    /* a full batch: as many rows as the padded one */
    const int32_t full[2] = {300, 300};
    CHECK_EQ_INT(exec_pack_map_build(full, 2, 300, &m, &err), STOF_OK);
    CHECK(m.rows == 600);
    exec_pack_map_free(&m);
    /* fresh random lengths */
    srand(12345u);
    for (int trial = 0; trial < 50; trial++) {
        int batch = 1 + rand() % 16, seq = 1 + rand() % 700;
        int32_t len[16];
        for (int b = 0; b < batch; b++)
            len[b] = rand() % (seq + 1);
        CHECK_EQ_INT(exec_pack_map_build(len, batch, seq, &m, &err), STOF_OK);
        check_map(&m, len, batch, seq);
        exec_pack_map_free(&m);
    }
    const int32_t over[2] = {4, 9};
    CHECK_EQ_INT(exec_pack_map_build(over, 2, 8, &m, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "row 1 has length 9, outside 0..8");
    const int32_t neg[1] = {-1};
    CHECK_EQ_INT(exec_pack_map_build(neg, 1, 8, &m, &err), STOF_ERR_INVALID);
    CHECK_EQ_INT(exec_pack_map_build(neg, 0, 8, &m, &err), STOF_ERR_INVALID);
}

/* Whether g packs under its default scheme and unfused; want_why: the reason's text. */
static void check_eligible(graph *g, int want, const char *want_why, const char *label) {
    for (int variant = 0; variant < 3; variant++) {
        const int unfused = variant == 1, lt = variant == 2;
        stof_error err = {0};
        exec_seq *seqs;
        int n;
        CHECK_MSG(fusion_sequences(g, &seqs, &n, &err) == STOF_OK, "%s", err.msg);
        fusion_scheme *s = calloc((size_t)n, sizeof *s);
        for (int i = 0; !unfused && i < n; i++)
            if (seqs[i].layer >= 0 && seqs[i].cls == i)
                CHECK(exec_default_scheme(g, &seqs[i], &s[i], &err) == STOF_OK);
        exec_plan *p = NULL;
        CHECK_MSG(exec_plan_create(g, s, &p, &err) == STOF_OK, "%s: %s", label, err.msg);
        /* every GEMM segment cuBLASLt takes on cuBLASLt, as tuned plans often have them */
        int on_lt = 0;
        for (int k = 0; lt && p && k < p->n_segs; k++) {
            exec_segment *sg = &p->segs[k];
            if (exec_segment_supports(g, sg->first, sg->n, &sg->match, FUSION_T_CUBLASLT,
                                      &err) == STOF_OK) {
                sg->tmpl = FUSION_T_CUBLASLT;
                on_lt++;
            }
        }
        CHECK(!lt || !p || on_lt > 0);
        int mask_t = -2;
        char why[160];
        if (p) {
            int got = exec_pack_eligible(p, &mask_t, why, sizeof why);
            CHECK_MSG(got == want, "%s (%s): eligible %d, want %d (%s)", label,
                      unfused ? "unfused" : lt ? "cublaslt" : "default", got, want, why);
            if (want)
                CHECK(mask_t >= 0 && strcmp(g->tensors[mask_t].name, "attention_mask") == 0);
            else
                CHECK_MSG(mask_t == -1 && strstr(why, want_why), "%s: %s", label, why);
        }
        exec_plan_free(p);
        free(s);
        free(seqs);
    }
}

static void check_script(const char *script, const char *const *params, int n, int want,
                         const char *want_why) {
    stof_error err = {0};
    graph g;
    graph_init(&g);
    CHECK_MSG(lua_api_build(script, params, n, &g, NULL, &err) == STOF_OK, "%s: %s", script,
              err.msg);
    check_eligible(&g, want, want_why, script);
    graph_free(&g);
}

static void check_config(const char *script, const char *config, const char *const *params,
                         int n, int want, const char *label) {
    stof_error err = {0};
    graph g;
    graph_init(&g);
    cJSON *c = cJSON_Parse(config);
    CHECK(c != NULL);
    CHECK_MSG(lua_api_build_config(script, params, n, c, &g, NULL, &err) == STOF_OK, "%s: %s",
              label, err.msg);
    check_eligible(&g, want, "", label);
    cJSON_Delete(c);
    graph_free(&g);
}

static void test_eligible(void) {
    const char *bert_pad[] = {"preset=small", "layers=2", "batch=2", "seq=128", "padding=true",
                              "mask=none"};
    check_script(SCRIPTS "bert.lua", bert_pad, 6, 1, "");
    const char *bert_sparse[] = {"preset=small", "layers=2", "batch=2", "seq=128",
                                 "padding=true", "mask=bigbird"};
    check_script(SCRIPTS "bert.lua", bert_sparse, 6, 1, "");
    const char *bert_plain[] = {"preset=small", "layers=2", "batch=2", "seq=128"};
    check_script(SCRIPTS "bert.lua", bert_plain, 4, 0, "no attention_mask input");
    const char *gpt2[] = {"layers=2", "batch=2", "seq=128"};
    check_script(SCRIPTS "gpt2.lua", gpt2, 3, 0, "no attention_mask input");
    const char *t5[] = {"layers=2", "batch=2", "seq=64", "dec_seq=32"};
    check_script(SCRIPTS "t5.lua", t5, 4, 0, "no attention_mask input");
    const char *dir_params[] = {"batch=2", "seq=64"};
    check_config(SCRIPTS "modernbert.lua",
                 "{\"model_type\": \"modernbert\", \"hidden_size\": 64,"
                 " \"num_hidden_layers\": 3, \"num_attention_heads\": 2,"
                 " \"intermediate_size\": 96, \"vocab_size\": 50,"
                 " \"max_position_embeddings\": 64, \"norm_eps\": 1e-5, \"norm_bias\": false,"
                 " \"hidden_activation\": \"gelu\", \"global_attn_every_n_layers\": 3,"
                 " \"local_attention\": 8, \"global_rope_theta\": 160000.0,"
                 " \"local_rope_theta\": 10000.0}",
                 dir_params, 2, 1, "modernbert");
    check_config(SCRIPTS "bert.lua",
                 "{\"model_type\": \"longformer\", \"hidden_size\": 64,"
                 " \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
                 " \"intermediate_size\": 96, \"vocab_size\": 50, \"type_vocab_size\": 1,"
                 " \"max_position_embeddings\": 130, \"pad_token_id\": 1,"
                 " \"layer_norm_eps\": 1e-5, \"hidden_act\": \"gelu\","
                 " \"attention_window\": [6, 4]}",
                 dir_params, 2, 1, "longformer");
}

/* A script whose mask_rows reads the mask `rows_mask`: packs only when it is the
 * attention_mask itself. */
static void check_rows_mask(const char *rows_mask, int want, const char *want_why) {
    char src[1024];
    snprintf(src, sizeof src,
             "local m = stof.model{name = \"t\", dtype = \"fp16\"}\n"
             "local ids = m:input(\"input_ids\", {2, 128}, {dtype = \"int32\", high = 50})\n"
             "local am = m:input(\"attention_mask\", {2, 128}, {dtype = \"int32\", "
             "attention_mask = true})\n"
             "local special = m:input(\"special\", {2, 128}, {dtype = \"int32\", high = 2})\n"
             "local e = m:embedding(ids, m:weight(\"wte\", {50, 64}))\n"
             "local qkv = m:linear(e, m:weight(\"w\", {192, 64}), m:weight(\"b\", {192}))\n"
             "local a = m:attention(qkv, {heads = 2, head_dim = 32, padding = am})\n"
             "m:output(m:mask_rows(a, %s))\n"
             "return m\n", rows_mask);
    stof_error err = {0};
    graph g;
    graph_init(&g);
    CHECK_MSG(lua_api_build_string(src, "rows.lua", NULL, NULL, 0, &g, NULL, &err) == STOF_OK,
              "%s", err.msg);
    check_eligible(&g, want, want_why, rows_mask);
    graph_free(&g);
}

int main(void) {
    test_bucket();
    test_lengths();
    test_maps();
    test_eligible();
    check_rows_mask("am", 1, "");
    check_rows_mask("special", 0, "zeros rows by another mask than the attention_mask");
    return check_summary("test_pack");
}
