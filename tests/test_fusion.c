/* Fusion schemes and template matching: the bit array and its text forms,
 * segments, the layer sequences of the shipped scripts, identical layers,
 * every valid scheme of the bert, gpt2 and t5 layers, the reasons invalid
 * segments are refused for, and the templates' parameter constraints. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/lua/lua_api.h"
#include "core/base/util.h"
#include "fusion/match.h"
#include "fusion/scheme.h"
#include "fusion/templates.h"
#include "ops/ops.h"

#define SCRIPTS STOF_SOURCE_DIR "/scripts/"
#define H100_SMEM 232448 /* opt-in shared memory of one block, bytes */

/* ---- helpers ----------------------------------------------------------------- */

static fusion_scheme parse_ok(const char *text) {
    fusion_scheme s;
    stof_error err = {0};
    int rc = fusion_scheme_parse(text, 0, &s, &err);
    CHECK_MSG(rc == STOF_OK, "'%s': %s", text, err.msg);
    return s;
}

static void random_scheme(util_rng *r, int n, fusion_scheme *s) {
    fusion_scheme_init(s, n, NULL);
    for (int i = 0; i < n; i++)
        fusion_scheme_set(s, i, (int)(util_rng_next(r) & 1));
}

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

/* "gemm bias attention ..." for the ops of a sequence. */
static void kinds_str(const graph *g, const int *ops, int n, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int k = 0; k < n && len < cap; k++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", k ? " " : "",
                                op_describe(g->ops[ops[k]].kind)->name);
}

/* Validates the scheme given in binary over the ops; expect_ok, or the
 * error contains needle. */
static void expect_scheme(const graph *g, const int *ops, int n, const char *bits, int expect_ok,
                          const char *needle, fusion_report *rep) {
    fusion_scheme s;
    stof_error err = {0};
    int rc = fusion_scheme_parse(bits, n, &s, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", bits, err.msg);
    if (rc)
        return;
    rc = fusion_scheme_validate(g, ops, n, &s, rep, &err);
    if (expect_ok) {
        CHECK_MSG(rc == STOF_OK, "%s: %s", bits, err.msg);
    } else {
        CHECK_MSG(rc == STOF_ERR_INVALID, "%s should be invalid", bits);
        if (needle)
            CHECK_CONTAINS(err.msg, needle);
    }
}

typedef struct enum_check {
    const graph *g;
    const int *ops;
    int n;
    long long bad;
    int saw_unfused;
} enum_check;

/* Every enumerated scheme must validate, and it comes canonical. */
static int enum_visit(const fusion_scheme *s, void *ud) {
    enum_check *c = ud;
    fusion_scheme u;
    fusion_scheme_all_unfused(&u, c->n, NULL);
    c->saw_unfused |= fusion_scheme_equal(s, &u);
    if (fusion_scheme_validate(c->g, c->ops, c->n, s, NULL, NULL) != STOF_OK ||
        fusion_scheme_get(s, 0) != 0)
        c->bad++;
    return 0;
}

static int stop_at_first(const fusion_scheme *s, void *ud) {
    return ++*(int *)ud == 1;
}

/* Counts, by brute force over all 2^(n-1) segmentations, the valid ones. */
static long long brute_force_valid(const graph *g, const int *ops, int n) {
    long long valid = 0;
    for (long long code = 0; code < (1LL << (n - 1)); code++) {
        fusion_scheme s;
        fusion_scheme_init(&s, n, NULL);
        for (int i = 1; i < n; i++)
            fusion_scheme_set(&s, i, fusion_scheme_get(&s, i - 1) ^ (int)((code >> (i - 1)) & 1));
        valid += fusion_scheme_validate(g, ops, n, &s, NULL, NULL) == STOF_OK;
    }
    return valid;
}

static long long enumerate_and_check(const graph *g, const int *ops, int n, const char *what) {
    enum_check c = {g, ops, n, 0, 0};
    long long count = -1;
    stof_error err = {0};
    int rc = fusion_enumerate_valid(g, ops, n, enum_visit, &c, &count, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", what, err.msg);
    CHECK_EQ_INT(c.bad, 0);
    CHECK_MSG(c.saw_unfused, "%s: the all-unfused scheme was not enumerated", what);
    if (n <= 16)
        CHECK_EQ_INT(count, brute_force_valid(g, ops, n));
    char kinds[512];
    kinds_str(g, ops, n, kinds, sizeof kinds);
    printf("  %-22s %2d ops, %6lld valid of %lld: %s\n", what, n, count, 1LL << (n - 1), kinds);
    return count;
}

/* ---- encoding ----------------------------------------------------------------- */

static void test_roundtrips(void) {
    util_rng r = {12345};
    for (int n = 1; n <= 200; n++) {
        for (int rep = 0; rep < 5; rep++) {
            fusion_scheme s, b, h;
            random_scheme(&r, n, &s);
            char bin[FUSION_SCHEME_BINARY_MAX], hex[FUSION_SCHEME_HEX_MAX];
            CHECK_EQ_INT(fusion_scheme_format_binary(&s, bin, sizeof bin), n);
            size_t hl = fusion_scheme_format_hex(&s, hex, sizeof hex);
            CHECK_EQ_INT(hl, strlen(hex));
            CHECK_EQ_INT(fusion_scheme_parse(bin, n, &b, NULL), STOF_OK);
            CHECK_EQ_INT(fusion_scheme_parse(hex, n, &h, NULL), STOF_OK);
            CHECK(fusion_scheme_equal(&s, &b));
            CHECK(fusion_scheme_equal(&s, &h));
            /* The complement is the same segmentation, not the same bits. */
            fusion_scheme c = s;
            fusion_scheme_flip_from(&c, 0);
            CHECK(fusion_scheme_same_segments(&s, &c));
            CHECK(!fusion_scheme_equal(&s, &c));
            fusion_scheme_canonical(&c);
            CHECK_EQ_INT(fusion_scheme_get(&c, 0), 0);
        }
    }
    /* Known texts: MSB first from op 0, the last digit padded with zeros. */
    char buf[FUSION_SCHEME_HEX_MAX];
    fusion_scheme s = parse_ok("0011100011");
    fusion_scheme_format_hex(&s, buf, sizeof buf);
    CHECK(strcmp(buf, "10:38c") == 0);
    s = parse_ok("00100001111100");
    fusion_scheme_format_hex(&s, buf, sizeof buf);
    CHECK(strcmp(buf, "14:21f0") == 0);
    s = parse_ok("14:21F0"); /* upper case is read, lower case written */
    fusion_scheme_format_binary(&s, buf, sizeof buf);
    CHECK(strcmp(buf, "00100001111100") == 0);
    s = parse_ok("1:8");
    CHECK(s.n == 1 && fusion_scheme_get(&s, 0) == 1);
    /* A short buffer is cut but says the full length. */
    char tiny[4];
    CHECK_EQ_INT(fusion_scheme_format_hex(&s, tiny, sizeof tiny), 3);
    s = parse_ok("0011100011");
    CHECK_EQ_INT(fusion_scheme_format_binary(&s, tiny, sizeof tiny), 10);
    CHECK(strcmp(tiny, "001") == 0);
}

static void expect_parse_error(const char *text, int expect_n, const char *needle) {
    fusion_scheme s;
    stof_error err = {0};
    int rc = fusion_scheme_parse(text, expect_n, &s, &err);
    CHECK_MSG(rc == STOF_ERR_INVALID, "'%s' parsed", text ? text : "(null)");
    CHECK_CONTAINS(err.msg, needle);
}

static void test_bad_texts(void) {
    char ones[300];
    memset(ones, '1', 299);
    ones[299] = '\0';
    expect_parse_error("", 0, "empty");
    expect_parse_error(NULL, 0, "empty");
    expect_parse_error("0012", 0, "'2' at position 3 is not a binary digit");
    expect_parse_error("01 1", 0, "not a binary digit");
    expect_parse_error("0011", 14, "has 4 ops but the sequence has 14");
    expect_parse_error(ones, 0, "299 ops (1 to 256 allowed)");
    expect_parse_error("14:21f", 0, "3 hex digits for 14 ops (needs 4)");
    expect_parse_error("14:21f00", 0, "5 hex digits for 14 ops (needs 4)");
    expect_parse_error("14:21f1", 0, "padding bits after op 13 must be 0");
    expect_parse_error("14:21g0", 0, "'g' is not a hex digit");
    expect_parse_error("0:", 0, "0 ops");
    expect_parse_error("300:00", 0, "300 ops");
    expect_parse_error(":21f0", 0, "starts with the op count");
    expect_parse_error("1x:21f0", 0, "must be decimal");
    expect_parse_error("-4:0", 0, "must be decimal");
    expect_parse_error("14:21f0", 10, "has 14 ops but the sequence has 10");
}

/* ---- segments ------------------------------------------------------------------ */

static void test_segments(void) {
    util_rng r = {777};
    fusion_segment segs[FUSION_MAX_OPS];
    for (int n = 1; n <= 200; n++) {
        fusion_scheme s, back;
        random_scheme(&r, n, &s);
        int k = fusion_scheme_segments(&s, segs, FUSION_MAX_OPS);
        CHECK_EQ_INT(k, fusion_scheme_count_segments(&s));
        int covered = 0, ok = 1;
        for (int i = 0; i < k; i++) {
            ok &= segs[i].first == covered && segs[i].last >= segs[i].first;
            covered = segs[i].last + 1;
            fusion_segment at = fusion_scheme_segment_at(&s, segs[i].last);
            ok &= at.first == segs[i].first && at.last == segs[i].last;
        }
        CHECK(ok && covered == n);
        CHECK_EQ_INT(fusion_scheme_from_segments(segs, k, n, &back, NULL), STOF_OK);
        CHECK(fusion_scheme_same_segments(&s, &back));
        CHECK_EQ_INT(fusion_scheme_get(&back, 0), 0);

        fusion_scheme u;
        fusion_scheme_all_unfused(&u, n, NULL);
        CHECK_EQ_INT(fusion_scheme_count_segments(&u), n);
    }
    /* Too short an output array still gives the count. */
    fusion_scheme s = parse_ok("0011100011");
    CHECK_EQ_INT(fusion_scheme_segments(&s, segs, 2), 4);
    CHECK(segs[1].first == 2 && segs[1].last == 4);

    stof_error err = {0};
    fusion_segment gap[] = {{0, 1}, {3, 4}}, overlap[] = {{0, 2}, {2, 4}}, shortc[] = {{0, 3}};
    CHECK_EQ_INT(fusion_scheme_from_segments(gap, 2, 5, &s, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "does not continue");
    CHECK_EQ_INT(fusion_scheme_from_segments(overlap, 2, 5, &s, &err), STOF_ERR_INVALID);
    CHECK_EQ_INT(fusion_scheme_from_segments(shortc, 1, 5, &s, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "cover ops 0-3 of 5");
    CHECK_EQ_INT(fusion_scheme_init(&s, 257, &err), STOF_ERR_INVALID);
}

static void expect_bits(const fusion_scheme *s, const char *want) {
    char buf[FUSION_SCHEME_BINARY_MAX];
    fusion_scheme w = parse_ok(want);
    fusion_scheme_format_binary(s, buf, sizeof buf);
    CHECK_MSG(fusion_scheme_same_segments(s, &w), "%s, expected %s", buf, want);
}

static void test_boundary_moves(void) {
    stof_error err = {0};
    fusion_scheme s = parse_ok("0011100011"); /* [0 1] [2 3 4] [5 6 7] [8 9] */
    CHECK(fusion_scheme_is_boundary(&s, 2) && !fusion_scheme_is_boundary(&s, 3));
    CHECK(!fusion_scheme_is_boundary(&s, 0) && !fusion_scheme_is_boundary(&s, 10));

    /* expand: merge [2 3 4] with [5 6 7] */
    CHECK_EQ_INT(fusion_scheme_merge(&s, 5, &err), STOF_OK);
    expect_bits(&s, "0011111100");
    CHECK_EQ_INT(fusion_scheme_merge(&s, 5, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "no segment starts there");
    CHECK_EQ_INT(fusion_scheme_split(&s, 5, &err), STOF_OK);
    expect_bits(&s, "0011100011");
    CHECK_EQ_INT(fusion_scheme_split(&s, 5, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "already starts there");
    CHECK_EQ_INT(fusion_scheme_split(&s, 0, &err), STOF_ERR_INVALID);
    CHECK_EQ_INT(fusion_scheme_split(&s, 10, &err), STOF_ERR_INVALID);

    /* seize: [2 3 4] takes op 5 from [5 6 7], then gives it back */
    CHECK_EQ_INT(fusion_scheme_move_boundary(&s, 5, 6, &err), STOF_OK);
    expect_bits(&s, "0011110011");
    CHECK_EQ_INT(fusion_scheme_move_boundary(&s, 6, 5, &err), STOF_OK);
    expect_bits(&s, "0011100011");
    /* moving over another boundary, or emptying a segment, is a merge */
    CHECK_EQ_INT(fusion_scheme_move_boundary(&s, 5, 8, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "merge instead");
    CHECK_EQ_INT(fusion_scheme_move_boundary(&s, 5, 2, &err), STOF_ERR_INVALID);
    CHECK_EQ_INT(fusion_scheme_move_boundary(&s, 4, 3, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "no segment starts there");
    expect_bits(&s, "0011100011");
}

/* ---- layer sequences ------------------------------------------------------------ */

static const op_kind bert_layer[14] = {
    OP_GEMM, OP_BIAS, OP_ATTENTION, OP_GEMM, OP_BIAS, OP_ADD, OP_LAYERNORM,
    OP_GEMM, OP_BIAS, OP_GELU, OP_GEMM, OP_BIAS, OP_ADD, OP_LAYERNORM};

static void check_kinds(const graph *g, const int *ops, int n, const op_kind *want, int n_want) {
    CHECK_EQ_INT(n, n_want);
    for (int k = 0; k < n && k < n_want; k++)
        CHECK_MSG(g->ops[ops[k]].kind == want[k], "op %d is %s, expected %s", k,
                  op_describe(g->ops[ops[k]].kind)->name, op_describe(want[k])->name);
}

/* fusion_sequences agrees with the cut (fusion_graph_sequences) and the
 * layers' classes: a layer's sequence is classed with the first sequence of
 * its class's layer, a run outside layers with itself. */
static void check_sequence_classes(const graph *g) {
    fusion_seq *seqs = NULL, cut[64];
    int n = 0, *cls = malloc(sizeof *cls * (size_t)(g->n_layers + 1));
    CHECK_EQ_INT(fusion_sequences(g, &seqs, &n, NULL), STOF_OK);
    CHECK_EQ_INT(fusion_graph_sequences(g, cut, 64), n);
    CHECK(cls && fusion_layer_classes(g, cls, NULL) == STOF_OK);
    for (int i = 0; seqs && cls && i < n && i < 64; i++) {
        CHECK(seqs[i].layer == cut[i].layer && seqs[i].first == cut[i].first &&
              seqs[i].n == cut[i].n);
        int want = i;
        for (int j = 0; seqs[i].layer >= 0 && j < i; j++)
            if (seqs[j].layer == cls[seqs[i].layer]) {
                want = j;
                break;
            }
        CHECK_EQ_INT(seqs[i].cls, want);
    }
    free(seqs);
    free(cls);
}

/* Enumerates each layer class and each run outside layers once. */
static void enumerate_graph(const graph *g, const char *model) {
    fusion_seq *seqs = NULL;
    int n_seqs = 0;
    CHECK_EQ_INT(fusion_sequences(g, &seqs, &n_seqs, NULL), STOF_OK);
    check_sequence_classes(g);
    printf("%s:\n", model);
    for (int q = 0; q < n_seqs; q++) {
        int ops[FUSION_MAX_OPS], layer = seqs[q].layer;
        if (seqs[q].cls != q)
            continue;
        for (int k = 0; k < seqs[q].n; k++)
            ops[k] = seqs[q].first + k;
        char what[64];
        if (layer >= 0)
            snprintf(what, sizeof what, "layer %d", layer);
        else
            snprintf(what, sizeof what, "outside, ops #%d-#%d", seqs[q].first,
                     seqs[q].first + seqs[q].n - 1);
        enumerate_and_check(g, ops, seqs[q].n, what);
    }
    free(seqs);
}

static void test_bert(void) {
    const char *params[] = {"preset=small", "batch=1", "seq=64", "mask=none"};
    graph g;
    if (build_script(SCRIPTS "bert.lua", params, 4, &g))
        return;
    int ops[FUSION_MAX_OPS];
    int n = fusion_layer_ops(&g, 0, ops, FUSION_MAX_OPS);
    check_kinds(&g, ops, n, bert_layer, 14);

    int cls[8];
    CHECK_EQ_INT(g.n_layers, 4);
    CHECK_EQ_INT(fusion_layer_classes(&g, cls, NULL), STOF_OK);
    for (int L = 0; L < 4; L++)
        CHECK_EQ_INT(cls[L], 0);

    /* embedding, layernorm | 4 layers; no final norm in BertModel */
    fusion_seq seqs[8];
    CHECK_EQ_INT(fusion_graph_sequences(&g, seqs, 8), 5);
    CHECK(seqs[0].layer == -1 && seqs[0].first == 0 && seqs[0].n == 2);
    CHECK(seqs[1].layer == 0 && seqs[1].first == 2 && seqs[1].n == 14);
    CHECK(seqs[4].layer == 3 && seqs[4].first + seqs[4].n == g.n_ops);
    /* one class for the four layers, the run before them its own */
    fusion_seq *classed = NULL;
    int n_classed = 0;
    CHECK_EQ_INT(fusion_sequences(&g, &classed, &n_classed, NULL), STOF_OK);
    CHECK_EQ_INT(n_classed, 5);
    for (int q = 0; classed && q < n_classed; q++)
        CHECK_EQ_INT(classed[q].cls, q == 0 ? 0 : 1);
    free(classed);

    fusion_report rep;
    expect_scheme(&g, ops, n, "01010101010101", 1, NULL, &rep);
    CHECK_EQ_INT(rep.n_segments, 14);
    /* The paper's shape: [gemm bias] [attention] [gemm bias add layernorm]
     * [gemm bias gelu gemm bias] [add layernorm] */
    expect_scheme(&g, ops, n, "00100001111100", 1, NULL, &rep);
    CHECK_EQ_INT(rep.n_segments, 5);
    if (rep.n_segments == 5) {
        const fusion_match *m = rep.matches;
        CHECK(fusion_match_has(&m[0], FUSION_T_GEMM_EPILOGUE) &&
              fusion_match_has(&m[0], FUSION_T_CUBLASLT) && m[0].epi[0].has_bias);
        CHECK_EQ_INT(m[0].dims.n, 3 * 512);
        CHECK_EQ_INT(m[0].dims.k, 512);
        CHECK_EQ_INT(m[0].dims.m, 64);
        CHECK(fusion_match_has(&m[1], FUSION_T_ATTENTION_ROW) &&
              fusion_match_has(&m[1], FUSION_T_ATTENTION_BLOCK));
        CHECK(m[1].dims.heads == 8 && m[1].dims.head_dim == 64 && m[1].dims.q_len == 64 &&
              m[1].dims.k_len == 64 && m[1].dims.batch == 1);
        /* a GEMM closing with a norm: gemm_ln, or gemm_epilogue's cluster build */
        CHECK_EQ_INT(m[2].templates, 1u << FUSION_T_GEMM_LN | 1u << FUSION_T_GEMM_EPILOGUE);
        CHECK(m[2].epi[0].has_bias && m[2].epi[0].has_residual &&
              m[2].epi[0].norm == FUSION_NORM_LAYERNORM && !m[2].store_pre_norm);
        CHECK_EQ_INT(m[3].templates, 1u << FUSION_T_GEMM_CHAIN);
        CHECK(m[3].n_ci == 2 && m[3].epi[0].has_bias && m[3].epi[0].act == FUSION_ACT_GELU &&
              m[3].epi[1].has_bias && !m[3].epi[1].has_residual);
        CHECK(m[3].dims.n == 2048 && m[3].dims.n2 == 512 && m[3].dims.k == 512);
        CHECK_EQ_INT(m[4].templates, 1u << FUSION_T_MI_CHAIN);
        CHECK(m[4].dims.row_reduce && m[4].dims.n == 512);
    }
    /* BERT's GELU is erf: cuBLASLt's epilogue (tanh) cannot stand in. */
    fusion_match m;
    CHECK_EQ_INT(fusion_match_segment(&g, ops + 7, 3, &m, NULL), STOF_OK);
    CHECK(fusion_match_has(&m, FUSION_T_GEMM_EPILOGUE) && !fusion_match_has(&m, FUSION_T_CUBLASLT));
    /* gemm bias add: gemm_epilogue, cuBLASLt through its C operand, and gemv (whose
     * settings then take only a few rows). */
    CHECK_EQ_INT(fusion_match_segment(&g, ops + 3, 3, &m, NULL), STOF_OK);
    CHECK_EQ_INT(fusion_match_count(&m), 3);
    CHECK(fusion_match_has(&m, FUSION_T_GEMV) && !m.dims.weight_kn);

    char msg[64];
    /* attention with the following gemm */
    snprintf(msg, sizeof msg, "segment #%d-#%d (attention gemm): no template", ops[2], ops[3]);
    expect_scheme(&g, ops, n, "01001010101010", 0, msg, NULL);
    /* three CI ops: attention gemm bias add layernorm gemm */
    expect_scheme(&g, ops, n, "01000000101010", 0, "holds 3 compute-intensive ops (at most 2)",
                  NULL);
    /* a layernorm in the middle: add layernorm gemm */
    snprintf(msg, sizeof msg, "layernorm #%d in the middle", ops[6]);
    expect_scheme(&g, ops, n, "01010111010101", 0, msg, NULL);
    expect_scheme(&g, ops, n, "01010111010101", 0, "scheme segment 6 of 12 (positions 5-7)", NULL);
    /* post-norm: the norm's output is the residual too, so it cannot open the GEMM's segment */
    stof_error e2 = {0};
    CHECK_EQ_INT(fusion_match_segment(&g, ops + 6, 2, &m, &e2), STOF_ERR_INVALID);
    CHECK_CONTAINS(e2.msg, "outside the segment reads");
    /* gemm bias attention: CI + CI but no template */
    expect_scheme(&g, ops, n, "00010101010101", 0, "no template implements it", NULL);
    /* the whole layer */
    expect_scheme(&g, ops, n, "00000000000000", 0, "compute-intensive", NULL);

    enumerate_graph(&g, "bert small (4 layers)");
    graph_free(&g);
}

static void test_gpt2(void) {
    const char *params[] = {"layers=2", "batch=1", "seq=64"};
    graph g;
    if (build_script(SCRIPTS "gpt2.lua", params, 3, &g))
        return;
    static const op_kind want[14] = {
        OP_LAYERNORM, OP_GEMM, OP_BIAS, OP_ATTENTION, OP_GEMM, OP_BIAS, OP_ADD,
        OP_LAYERNORM, OP_GEMM, OP_BIAS, OP_GELU, OP_GEMM, OP_BIAS, OP_ADD};
    int ops[FUSION_MAX_OPS], cls[2];
    int n = fusion_layer_ops(&g, 1, ops, FUSION_MAX_OPS);
    check_kinds(&g, ops, n, want, 14);
    CHECK_EQ_INT(fusion_layer_classes(&g, cls, NULL), STOF_OK);
    CHECK(cls[0] == 0 && cls[1] == 0);

    /* add + layernorm: the sum is read again by the next residual add, so
     * the template must write it out too. */
    fusion_match m;
    CHECK_EQ_INT(fusion_match_segment(&g, ops + 6, 2, &m, NULL), STOF_OK);
    CHECK(m.store_pre_norm && m.templates == 1u << FUSION_T_MI_CHAIN);
    CHECK_EQ_INT(fusion_match_segment(&g, ops + 4, 4, &m, NULL), STOF_OK);
    CHECK(m.store_pre_norm &&
          m.templates == (1u << FUSION_T_GEMM_LN | 1u << FUSION_T_GEMM_EPILOGUE));
    /* GPT-2's tanh GELU fits cuBLASLt's epilogue. */
    CHECK_EQ_INT(fusion_match_segment(&g, ops + 8, 3, &m, NULL), STOF_OK);
    CHECK(fusion_match_has(&m, FUSION_T_CUBLASLT) && m.epi[0].act == FUSION_ACT_GELU_TANH);
    /* pre-norm: the norm opens the GEMM's segment on gemv alone (its prologue; the GEMM reads
     * the norm's output and nothing else does), not in the middle of one */
    stof_error err = {0};
    CHECK_EQ_INT(fusion_match_segment(&g, ops, 3, &m, &err), STOF_OK);
    CHECK(m.templates == 1u << FUSION_T_GEMV && m.prologue == FUSION_NORM_LAYERNORM &&
          m.epi[0].has_bias && m.epi[0].norm == FUSION_NORM_NONE && m.dims.k == 64 * 12);
    CHECK_EQ_INT(fusion_match_segment(&g, ops + 6, 3, &m, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "in the middle of a segment");
    CHECK_EQ_INT(fusion_match_segment(&g, ops + 7, 5, &m, &err), STOF_ERR_INVALID); /* FFN */
    CHECK_CONTAINS(err.msg, "no template implements it");

    enumerate_graph(&g, "gpt2 (2 layers)");
    graph_free(&g);
}

static void test_t5(void) {
    const char *params[] = {"layers=2", "batch=1", "seq=64", "dec_seq=32"};
    graph g;
    if (build_script(SCRIPTS "t5.lua", params, 4, &g))
        return;
    int cls[4];
    CHECK_EQ_INT(g.n_layers, 4);
    CHECK_EQ_INT(fusion_layer_classes(&g, cls, NULL), STOF_OK);
    CHECK(cls[0] == 0 && cls[1] == 0 && cls[2] == 2 && cls[3] == 2);
    check_sequence_classes(&g);

    /* The relative position table is made before each stack's loop and read
     * by every block's self-attention: the first block is like the others. */
    int table = -1, readers = 0;
    for (int i = 0; i < g.n_ops; i++) {
        const graph_op *op = &g.ops[i];
        if (op->kind != OP_ATTENTION || op->layer < 0 || op->layer > 1)
            continue;
        CHECK(op->attr.attn.relpos);
        int t = op->inputs[op->n_inputs - 1];
        CHECK(table < 0 || t == table);
        CHECK_EQ_INT(g.tensors[t].producer, -1);
        table = t;
        readers++;
    }
    CHECK_EQ_INT(readers, 2);

    int enc[FUSION_MAX_OPS], dec[FUSION_MAX_OPS];
    int ne = fusion_layer_ops(&g, 0, enc, FUSION_MAX_OPS);
    int nd = fusion_layer_ops(&g, 2, dec, FUSION_MAX_OPS);
    static const op_kind want_enc[10] = {OP_RMSNORM, OP_GEMM, OP_ATTENTION, OP_GEMM, OP_ADD,
                                         OP_RMSNORM, OP_GEMM, OP_RELU, OP_GEMM, OP_ADD};
    check_kinds(&g, enc, ne, want_enc, 10);
    CHECK_EQ_INT(nd, 16);
    CHECK(!fusion_layers_identical(&g, enc, ne, dec, nd));

    /* gemm add (no bias) with rmsnorm after: gemm_ln with norm = rmsnorm */
    fusion_match m;
    CHECK_EQ_INT(fusion_match_segment(&g, enc + 3, 3, &m, NULL), STOF_OK);
    CHECK(m.templates == (1u << FUSION_T_GEMM_LN | 1u << FUSION_T_GEMM_EPILOGUE) &&
          !m.epi[0].has_bias &&
          m.epi[0].has_residual && m.epi[0].norm == FUSION_NORM_RMSNORM && m.store_pre_norm);
    /* gemm relu gemm add: the FFN with its residual */
    CHECK_EQ_INT(fusion_match_segment(&g, enc + 6, 4, &m, NULL), STOF_OK);
    CHECK(m.templates == 1u << FUSION_T_GEMM_CHAIN && m.epi[0].act == FUSION_ACT_RELU &&
          m.epi[1].has_residual);
    /* decoder: the cross-attention's q and kv projections are side by side */
    stof_error err = {0};
    CHECK_EQ_INT(fusion_match_segment(&g, dec + 6, 2, &m, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "must form a chain");
    CHECK_EQ_INT(fusion_match_segment(&g, dec + 8, 1, &m, NULL), STOF_OK);
    CHECK(m.dims.q_len == 32 && m.dims.k_len == 64);

    enumerate_graph(&g, "t5-small (2+2 layers)");
    graph_free(&g);
}

/* Identity looks at kinds, attributes, shapes and wiring, not names. */
static void test_identity(void) {
    const char *src =
        "local m = stof.model{name = 't', dtype = 'fp16'}\n"
        "local x = m:input('x', {1, 8, 16})\n"
        "for n = 0, 2 do m:layer(function() x = m:relu(m:gemm(x, m:weight('w' .. n, {16, 16}))) end) end\n"
        "m:layer(function() x = m:gelu(m:gemm(x, m:weight('w3', {16, 16}))) end)\n"
        "m:layer(function() x = m:relu(m:gemm(x, m:weight('w4', {16, 16}), {kn = true})) end)\n"
        "m:layer(function() x = m:add(m:gemm(x, m:weight('w5', {16, 16})), x) end)\n"
        "m:layer(function() local y = m:gemm(x, m:weight('w6', {16, 16})); x = m:add(y, y) end)\n"
        "m:layer(function() x = m:add(m:gemm(x, m:weight('w7', {16, 16})), x) end)\n"
        "m:output(x)\nreturn m\n";
    graph g;
    if (build_inline(src, &g))
        return;
    int cls[8], want[8] = {0, 0, 0, 3, 4, 5, 6, 5};
    CHECK_EQ_INT(g.n_layers, 8);
    CHECK_EQ_INT(fusion_layer_classes(&g, cls, NULL), STOF_OK);
    for (int L = 0; L < 8; L++)
        CHECK_MSG(cls[L] == want[L], "layer %d: class %d, expected %d", L, cls[L], want[L]);
    graph_free(&g);
}

/* The dependency rules, each on a graph made to break it. */
static void test_dependencies(void) {
    const char *src =
        "local m = stof.model{name = 't', dtype = 'fp16'}\n"
        "local x = m:input('x', {1, 8, 16})\n"
        "local h = m:gemm(x, m:weight('w', {16, 16}))\n" /* #0 */
        "local a = m:gelu(h)\n"                          /* #1 */
        "local b = m:add(a, h)\n"                        /* #2 reads #0 and #1 */
        "local r = m:relu(m:weight('v', {16, 16}))\n"    /* #3 an activation [16, 16] */
        "local y = m:gemm(b, m:weight('u', {16, 16}))\n" /* #4 reads #2, not #3 */
        "local z = m:softmax(y)\n"                       /* #5 */
        "m:output(y)\nreturn m\n";
    graph g;
    if (build_inline(src, &g))
        return;
    fusion_match m;
    stof_error err = {0};
    int s01[] = {0, 1}, s012[] = {0, 1, 2}, s34[] = {3, 4}, s23[] = {2, 3}, s12[] = {1, 2},
        s45[] = {4, 5}, s10[] = {1, 0};
    CHECK_EQ_INT(fusion_match_segment(&g, s01, 2, &m, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "segment #0-#1 (gemm gelu): op #2 (add) outside the segment reads "
                            "#0's output");
    CHECK_EQ_INT(fusion_match_segment(&g, s012, 3, &m, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "#2 (add) reads the output of #0 (gemm), which is inside");
    CHECK_EQ_INT(fusion_match_segment(&g, s34, 2, &m, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "#4 (gemm) does not read the output of #3 (relu)");
    CHECK_EQ_INT(fusion_match_segment(&g, s23, 2, &m, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "#3 (relu) does not read the output of #2 (add)");
    CHECK_EQ_INT(fusion_match_segment(&g, s45, 2, &m, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "the output of #4 (gemm) is the model output");
    CHECK_EQ_INT(fusion_match_segment(&g, s10, 2, &m, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "not a graph op after the one before it");
    CHECK_EQ_INT(fusion_match_segment(&g, s10, 0, &m, &err), STOF_ERR_INVALID);
    /* gelu + add with the residual from outside: an MI chain */
    CHECK_EQ_INT(fusion_match_segment(&g, s12, 2, &m, &err), STOF_OK);
    CHECK(m.templates == 1u << FUSION_T_MI_CHAIN && m.epi[0].act == FUSION_ACT_GELU &&
          m.epi[0].has_residual && !m.dims.row_reduce);
    /* every single op matches something */
    for (int i = 0; i < g.n_ops; i++) {
        CHECK_MSG(fusion_match_segment(&g, &i, 1, &m, &err) == STOF_OK, "#%d: %s", i, err.msg);
        CHECK(m.templates != 0);
    }
    /* two valid schemes: all unfused, and gelu + add fused; enumeration
     * stops when asked */
    int seen = 0, all[] = {0, 1, 2, 3, 4, 5};
    long long count = 0;
    CHECK_EQ_INT(fusion_enumerate_valid(&g, all, 6, NULL, NULL, &count, &err), STOF_OK);
    CHECK_EQ_INT(count, 2);
    CHECK_EQ_INT(fusion_enumerate_valid(&g, all, 6, stop_at_first, &seen, &count, &err),
                 STOF_OK);
    CHECK(seen == 1 && count == 1);
    CHECK_EQ_INT(fusion_enumerate_valid(&g, all, 0, NULL, NULL, &count, &err), STOF_ERR_INVALID);
    graph_free(&g);
}

/* ---- templates -------------------------------------------------------------------- */

static void expect_setting(fusion_template_id id, const fusion_dims *d, const int *v, int limit,
                           int want_rc, const char *needle) {
    stof_error err = {0};
    int rc = fusion_template_check(fusion_template_get(id), d, v, limit, &err);
    CHECK_MSG(rc == want_rc, "%s: rc %d, expected %d (%s)", fusion_template_get(id)->name, rc,
              want_rc, err.msg);
    if (needle)
        CHECK_CONTAINS(err.msg, needle);
}

/* The gated unit and rotary embeddings run alone (their own templates; a decode step's
 * rotary joins its attention, test_gen; a GEMM's GLU joins it on gemv), and carry the sizes
 * their settings are judged by. */
static void test_glu_rotary(void) {
    const char *src =
        "local m = stof.model{name = 't'}\n"
        "local x = m:input('x', {2, 8, 96})\n"
        "local r = m:rotary(x, {heads = 2, kv_heads = 1, head_dim = 24, theta = 1e4})\n" /* #0 */
        "local u = m:gemm(r, m:weight('w', {64, 96}))\n"                                 /* #1 */
        "local g = m:glu(u, {act = 'silu'})\n"                                           /* #2 */
        "m:output(m:gelu(g))\nreturn m\n";                                               /* #3 */
    graph g;
    if (build_inline(src, &g))
        return;
    fusion_match m;
    stof_error err = {0};
    int s0[] = {0}, s2[] = {2}, s12[] = {1, 2}, s23[] = {2, 3}, s01[] = {0, 1};
    CHECK_EQ_INT(fusion_match_segment(&g, s0, 1, &m, &err), STOF_OK);
    CHECK(m.templates == 1u << FUSION_T_ROTARY && m.dims.head_dim == 24 && m.dims.heads == 2 &&
          m.dims.n == 96 && m.dims.m == 16);
    CHECK_EQ_INT(fusion_match_segment(&g, s2, 1, &m, &err), STOF_OK);
    CHECK(m.templates == 1u << FUSION_T_GLU && m.dims.n == 32 && m.dims.m == 16);
    /* a gated unit after its GEMM: gemv alone (a few rows), each output's two features in a
     * warp: BLOCK_N / WARPS even */
    CHECK_EQ_INT(fusion_match_segment(&g, s12, 2, &m, &err), STOF_OK);
    CHECK(m.templates == 1u << FUSION_T_GEMV && m.dims.gated && m.dims.n == 64);
    m.dims.m = 16;
    const fusion_template *gv = fusion_template_get(FUSION_T_GEMV);
    CHECK_EQ_INT(fusion_template_check(gv, &m.dims, (int[]){16, 8, 4, 4, 0}, H100_SMEM, &err),
                 STOF_OK);
    CHECK_EQ_INT(fusion_template_check(gv, &m.dims, (int[]){16, 4, 4, 4, 0}, H100_SMEM, &err),
                 STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "an even count of features a warp");
    CHECK_EQ_INT(fusion_match_segment(&g, s23, 2, &m, &err), STOF_ERR_INVALID);
    CHECK_EQ_INT(fusion_match_segment(&g, s01, 2, &m, &err), STOF_ERR_INVALID);
    /* rotary's VEC divides half a head (12): 4 does, 8 does not */
    const fusion_template *t = fusion_template_get(FUSION_T_ROTARY);
    fusion_match_segment(&g, s0, 1, &m, &err);
    CHECK_EQ_INT(fusion_template_check(t, &m.dims, (int[]){128, 4}, H100_SMEM, &err), STOF_OK);
    CHECK_EQ_INT(fusion_template_check(t, &m.dims, (int[]){128, 8}, H100_SMEM, &err),
                 STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "VEC 8 does not divide half of head_dim 24");
    graph_free(&g);
}

static void test_templates(void) {
    for (int t = 0; t < FUSION_T_COUNT; t++) {
        const fusion_template *tp = fusion_template_get((fusion_template_id)t);
        CHECK(tp && tp->id == (fusion_template_id)t);
        CHECK(fusion_template_find(tp->name) == tp);
        CHECK(tp->n_params >= 1 && fusion_template_settings(tp) >= 1);
    }
    CHECK(fusion_template_find("nope") == NULL);
    CHECK(fusion_template_get(FUSION_T_COUNT) == NULL);
    char buf[128];
    fusion_template_pattern_str(fusion_template_get(FUSION_T_GEMM_EPILOGUE), buf, sizeof buf);
    CHECK(strcmp(buf, "gemm [bias] [gelu|relu|gelu_tanh] [add] [layernorm|rmsnorm]") == 0);
    fusion_template_pattern_str(fusion_template_get(FUSION_T_CUBLASLT), buf, sizeof buf);
    CHECK(strcmp(buf, "gemm [bias] [relu|gelu_tanh]; gemm [bias] add") == 0);
    size_t need = fusion_template_pattern_str(fusion_template_get(FUSION_T_MI_CHAIN), buf, 8);
    CHECK(need > 8 && strlen(buf) == 7);

    /* bert-base sizes, fp16, 512 tokens */
    fusion_dims d = {.m = 512, .n = 768, .k = 768, .n2 = 768, .elem_bytes = 2, .row_reduce = 1,
                     .batch = 1, .heads = 12, .head_dim = 64, .q_len = 512, .k_len = 512};
    int small[] = {64, 64, 32, 4, 2, 1}, big[] = {128, 256, 64, 8, 4, 1},
        regs[] = {128, 256, 32, 4, 2, 1};
    int odd[] = {96, 64, 32, 4, 2, 1};
    fusion_dims plain = d;
    plain.row_reduce = 0;
    expect_setting(FUSION_T_GEMM_EPILOGUE, &plain, small, 49152, STOF_OK, NULL);
    expect_setting(FUSION_T_GEMM_EPILOGUE, &plain, big, H100_SMEM, STOF_OK, NULL);
    /* the ring, the wgmma build's 1024 bytes of alignment and its 8 warps'
     * two 16 x 32 staging buffers each (the persistent build) */
    expect_setting(FUSION_T_GEMM_EPILOGUE, &plain, big, 49152, STOF_ERR_UNSUPPORTED,
                   "needs 214016 bytes of shared memory (limit 49152)");
    int big_split[] = {128, 256, 64, 8, 4, 2}; /* split K: no staging */
    expect_setting(FUSION_T_GEMM_EPILOGUE, &plain, big_split, 49152, STOF_ERR_UNSUPPORTED,
                   "needs 197632 bytes of shared memory (limit 49152)");
    expect_setting(FUSION_T_GEMM_EPILOGUE, &plain, regs, H100_SMEM, STOF_ERR_UNSUPPORTED,
                   "256 registers a thread");
    expect_setting(FUSION_T_GEMM_EPILOGUE, &plain, odd, H100_SMEM, STOF_ERR_INVALID,
                   "BLOCK_M = 96 is not in its space");
    /* gemm_epilogue closing with a norm: a cluster of N / BLOCK_N x SPLIT_K
     * blocks holds whole rows, on the wgmma build; the statistics' arrays
     * count beside the ring */
    int norm_ok[] = {64, 128, 64, 4, 6, 2}, norm_wide[] = {64, 64, 64, 4, 6, 2},
        norm_mma[] = {64, 128, 32, 4, 3, 1}, norm_odd[] = {64, 256, 64, 8, 3, 1};
    expect_setting(FUSION_T_GEMM_EPILOGUE, &d, norm_ok, H100_SMEM, STOF_OK, NULL);
    expect_setting(FUSION_T_GEMM_EPILOGUE, &d, big, 49152, STOF_ERR_UNSUPPORTED,
                   "needs 200704 bytes of shared memory (limit 49152)");
    expect_setting(FUSION_T_GEMM_EPILOGUE, &d, norm_wide, H100_SMEM, STOF_ERR_UNSUPPORTED,
                   "at most 16 blocks (N / BLOCK_N x SPLIT_K), not 64x64x64 on 4 warps with "
                   "SPLIT_K 2");
    expect_setting(FUSION_T_GEMM_EPILOGUE, &d, norm_mma, H100_SMEM, STOF_ERR_UNSUPPORTED,
                   "the wgmma build");
    fusion_dims rows1000 = d;
    rows1000.n = 1000;
    expect_setting(FUSION_T_GEMM_EPILOGUE, &rows1000, norm_odd, H100_SMEM, STOF_ERR_UNSUPPORTED,
                   "BLOCK_N dividing the row");
    /* gemm_ln keeps ROWS x 768 fp32 rows resident */
    int ln_small[] = {16, 64, 32, 4, 2}, ln_big[] = {64, 128, 64, 8, 3};
    expect_setting(FUSION_T_GEMM_LN, &d, ln_small, 100000, STOF_OK, NULL);
    expect_setting(FUSION_T_GEMM_LN, &d, ln_big, 100000, STOF_ERR_UNSUPPORTED,
                   "gemm_ln: 64 rows of 768");
    /* gemm_chain: the [BLOCK_M, 768] output lives in registers */
    int ch_ok[] = {32, 64, 32, 8, 2}, ch_regs[] = {64, 64, 32, 4, 2};
    expect_setting(FUSION_T_GEMM_CHAIN, &d, ch_ok, H100_SMEM, STOF_OK, NULL);
    expect_setting(FUSION_T_GEMM_CHAIN, &d, ch_regs, H100_SMEM, STOF_ERR_UNSUPPORTED,
                   "registers a thread");
    /* attention: Eq. 2's shared memory, and whole 16-row tiles per warp */
    int at_ok[] = {64, 64, 4}, at_big[] = {128, 128, 4}, at_warps[] = {32, 64, 4};
    expect_setting(FUSION_T_ATTENTION_BLOCK, &d, at_ok, 49152, STOF_OK, NULL);
    expect_setting(FUSION_T_ATTENTION_BLOCK, &d, at_big, 49152, STOF_ERR_UNSUPPORTED,
                   "needs 98304 bytes");
    expect_setting(FUSION_T_ATTENTION_BLOCK, &d, at_warps, 49152, STOF_ERR_UNSUPPORTED, NULL);
    /* MI chains: vectors must divide the row; rows of a reduction in smem */
    fusion_dims odd_row = d;
    odd_row.n = 770;
    int mi_vec[] = {1, 128, 8}, mi_ok[] = {8, 256, 4}, mi_big[] = {8, 256, 2};
    expect_setting(FUSION_T_MI_CHAIN, &odd_row, mi_vec, H100_SMEM, STOF_ERR_UNSUPPORTED,
                   "VEC 8 does not divide the row of 770");
    expect_setting(FUSION_T_MI_CHAIN, &d, mi_ok, H100_SMEM, STOF_OK, NULL);
    odd_row.n = 65536;
    expect_setting(FUSION_T_MI_CHAIN, &odd_row, mi_big, H100_SMEM, STOF_ERR_UNSUPPORTED,
                   "shared memory");
    /* gemv: a few rows; ROWS below twice M; [N, K]: 1 to 8 outputs a warp; [K, N]: column
     * lanes dividing a warp, partial sums within 48 KiB; registers */
    fusion_dims few = d;
    few.m = 8;
    int gv_ok[] = {8, 8, 4, 8, 0}, gv_rows[] = {16, 8, 4, 8, 0}, gv_outs[] = {8, 64, 4, 8, 0},
        gv_regs[] = {16, 32, 4, 8, 0}, gv_kn[] = {8, 64, 8, 8, 0}, gv_kn_lanes[] = {8, 4, 4, 8, 0};
    expect_setting(FUSION_T_GEMV, &d, gv_ok, H100_SMEM, STOF_ERR_UNSUPPORTED,
                   "rows (it runs up to 16)");
    expect_setting(FUSION_T_GEMV, &few, gv_ok, H100_SMEM, STOF_OK, NULL);
    expect_setting(FUSION_T_GEMV, &few, gv_rows, H100_SMEM, STOF_ERR_UNSUPPORTED,
                   "ROWS 16 for 8 rows");
    expect_setting(FUSION_T_GEMV, &few, gv_outs, H100_SMEM, STOF_ERR_UNSUPPORTED,
                   "1 to 8 outputs a warp");
    few.m = 16;
    expect_setting(FUSION_T_GEMV, &few, gv_regs, H100_SMEM, STOF_ERR_UNSUPPORTED,
                   "over 160 registers");
    few.weight_kn = 1;
    expect_setting(FUSION_T_GEMV, &few, gv_regs, H100_SMEM, STOF_OK, NULL);
    expect_setting(FUSION_T_GEMV, &few, gv_kn_lanes, H100_SMEM, STOF_ERR_UNSUPPORTED,
                   "column lanes dividing a warp");
    few.m = 8;
    expect_setting(FUSION_T_GEMV, &few, gv_kn, H100_SMEM, STOF_OK, NULL);
    int gv_kn_big[] = {16, 128, 8, 2, 0};
    few.m = 16;
    expect_setting(FUSION_T_GEMV, &few, gv_kn_big, H100_SMEM, STOF_ERR_UNSUPPORTED,
                   "gemv's partial sums needs 65536 bytes");
    /* STAGES: [N, K] weights, BLOCK_N up to 32 (a producer lane a row), the stages in shared
     * memory beside x's rows: 8 x 8 rows x 512 of 8192 (fp16) = 64 KiB and 16 KiB of x fit;
     * 8 x 32 rows x 2048 = 1 MiB do not */
    fusion_dims one = d;
    one.m = 1;
    one.k = 8192;
    int gv_st[] = {1, 8, 4, 2, 8}, gv_st_wide[] = {1, 64, 8, 2, 8}, gv_st_big[] = {1, 32, 16, 8, 8};
    expect_setting(FUSION_T_GEMV, &one, gv_st, H100_SMEM, STOF_OK, NULL);
    expect_setting(FUSION_T_GEMV, &one, gv_st, 65536, STOF_ERR_UNSUPPORTED,
                   "gemv's staged rows of x and stages of weights needs 82056 bytes");
    expect_setting(FUSION_T_GEMV, &one, gv_st_wide, H100_SMEM, STOF_ERR_UNSUPPORTED,
                   "STAGES 8: [N, K] weights and BLOCK_N up to 32 (BLOCK_N 64)");
    expect_setting(FUSION_T_GEMV, &one, gv_st_big, H100_SMEM, STOF_ERR_UNSUPPORTED,
                   "stages of weights needs");
    one.weight_kn = 1;
    expect_setting(FUSION_T_GEMV, &one, gv_st, H100_SMEM, STOF_ERR_UNSUPPORTED,
                   "(BLOCK_N 8, [K, N])");
    /* STAGES came after plans with gemv were written: one without it reads as its first
     * value, which must be the registers' build */
    const fusion_template *gvt = fusion_template_get(FUSION_T_GEMV);
    CHECK(gvt->n_params == 5 && gvt->plan_optional_from == 4 &&
          strcmp(gvt->params[4].name, "STAGES") == 0 && gvt->params[4].values[0] == 0);
    /* attention_decode: every warp's O of each query head of a K/V head in shared memory */
    fusion_dims dec = {.heads = 32, .kv_heads = 2, .head_dim = 128};
    expect_setting(FUSION_T_ATTENTION_DECODE, &dec, (int[]){1, 4}, H100_SMEM, STOF_OK, NULL);
    expect_setting(FUSION_T_ATTENTION_DECODE, &dec, (int[]){1, 8}, H100_SMEM,
                   STOF_ERR_UNSUPPORTED, "attention_decode's partial outputs needs 75264 bytes");
    dec.kv_heads = 8;
    expect_setting(FUSION_T_ATTENTION_DECODE, &dec, (int[]){16, 8}, H100_SMEM, STOF_OK, NULL);
    int algo[] = {2}, algo_bad[] = {9};
    expect_setting(FUSION_T_CUBLASLT, &d, algo, 0, STOF_OK, NULL);
    expect_setting(FUSION_T_CUBLASLT, &d, algo_bad, 0, STOF_ERR_INVALID, "ALGO = 9");

    /* How much of each space fits an H100 and the default 48 KiB. */
    printf("feasible settings (bert-base sizes, fp16): 227 KiB / 48 KiB of shared memory\n");
    for (int t = 0; t < FUSION_T_COUNT; t++) {
        const fusion_template *tp = fusion_template_get((fusion_template_id)t);
        long total = fusion_template_settings(tp), fit_big = 0, fit_small = 0;
        fusion_dims dt = d;
        if (t == FUSION_T_GEMV)
            dt.m = 8; /* a decode step's batch */
        for (long i = 0; i < total; i++) {
            int v[FUSION_MAX_PARAMS];
            fusion_template_setting(tp, i, v);
            fit_big += fusion_template_check(tp, &dt, v, H100_SMEM, NULL) == STOF_OK;
            fit_small += fusion_template_check(tp, &dt, v, 49152, NULL) == STOF_OK;
        }
        printf("  %-16s %-20s %4ld / %4ld / %4ld\n", tp->name, tp->kernel, fit_big, fit_small,
               total);
        CHECK_MSG(fit_big > 0, "%s: no setting fits", tp->name);
    }
    /* Settings decode in order, the last parameter fastest. */
    int v[FUSION_MAX_PARAMS];
    fusion_template_setting(fusion_template_get(FUSION_T_GEMM_EPILOGUE), 1, v);
    CHECK(v[0] == 64 && v[1] == 32 && v[2] == 32 && v[3] == 4 && v[4] == 2 && v[5] == 2);
}

int main(void) {
    test_roundtrips();
    test_bad_texts();
    test_segments();
    test_boundary_moves();
    test_identity();
    test_dependencies();
    test_bert();
    test_gpt2();
    test_t5();
    test_templates();
    test_glu_rotary();
    return check_summary("test_fusion");
}
