/* Plans: a search result written as JSON and read back field for field, the
 * offline form, the mismatches plan_check_fits reports, strict reading of
 * hand-edited plans (each error names its field), and a fuzz of a few
 * hundred mutations of a valid plan that must each give an error or a valid
 * plan, never a crash. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/lua/lua_api.h"
#include "core/plan/plan.h"
#include "core/base/util.h"
#include "ops/ops.h"
#include "search/search.h"

#define SCRIPTS STOF_SOURCE_DIR "/scripts/"
#define WORK STOF_BINARY_DIR "/tests/"

/* ==== a plan to work on ====================================================================== */

/* A cost that depends on the ops and the setting, enough for a real search. */
static int toy_measure(void *ud, const search_segment *seg, const int *values, double *ms,
                       stof_error *err) {
    const fusion_template *t = fusion_template_get(seg->tmpl);
    double cost = 0.003;
    for (int i = seg->op_first; i <= seg->op_last; i++) {
        double flops, bytes;
        op_cost(seg->g, &seg->g->ops[i], &flops, &bytes);
        cost += flops / 2e11 + bytes / 2e9 * (i > seg->op_first ? 0.3 : 1.0);
    }
    uint64_t h = util_hash(UTIL_HASH_SEED, values, sizeof *values * (size_t)t->n_params);
    *ms = cost * (1 + util_uniform(h, (uint64_t)seg->tmpl));
    return STOF_OK;
}

static const stof_device_info h100 = {.name = "NVIDIA H100 80GB HBM3", .cc_major = 9,
                                      .cc_minor = 0, .sm_count = 132};

typedef struct fixture {
    graph g;
    graph_script script;
    search_sequence *seqs;
    int n_seqs;
    search_result result;
    int ok;
} fixture;

static void fixture_load(fixture *f, const char *script, const char *const *params, int n) {
    stof_error err = {0};
    memset(f, 0, sizeof *f);
    graph_init(&f->g);
    int rc = lua_api_build(script, params, n, &f->g, &f->script, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", script, err.msg);
    if (!rc)
        rc = search_sequences_from_graph(&f->g, &f->seqs, &f->n_seqs, &err);
    search_backend b = {.measure = toy_measure};
    search_options o = {.seed = 9, .budget = 400};
    if (!rc)
        rc = search_run(&f->g, f->seqs, f->n_seqs, &b, &o, &f->result, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    f->ok = rc == STOF_OK;
}

static void fixture_free(fixture *f) {
    if (f->ok)
        search_result_free(&f->result);
    search_sequences_free(f->seqs, f->n_seqs);
    graph_free(&f->g);
}

static int make_plan(const fixture *f, const stof_device_info *dev, const char *arch, plan *p) {
    stof_error err = {0};
    int rc = plan_from_search(&f->result, &f->g, f->seqs, &f->script, dev, arch, p, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    return rc;
}

static char *plan_text(const plan *p) {
    char *text = NULL;
    stof_error err = {0};
    CHECK_MSG(plan_to_json(p, &text, &err) == STOF_OK, "%s", err.msg);
    return text;
}

/* ==== comparing every field ===================================================================== */

static int kernels_equal(const plan_kernel *a, const plan_kernel *b) {
    return a->tmpl == b->tmpl && a->n_values == b->n_values &&
           memcmp(a->values, b->values, sizeof a->values[0] * (size_t)a->n_values) == 0;
}

static int segments_equal(const plan_segment *a, const plan_segment *b) {
    return a->first == b->first && a->last == b->last && kernels_equal(&a->kernel, &b->kernel) &&
           a->ms == b->ms &&
           memcmp(a->kinds, b->kinds, sizeof a->kinds[0] * (size_t)(a->last - a->first + 1)) == 0;
}

static int sequences_equal(const plan_sequence *a, const plan_sequence *b) {
    if (a->layer != b->layer || a->n_ops != b->n_ops || a->n_instances != b->n_instances ||
        !fusion_scheme_equal(&a->scheme, &b->scheme) || a->n_segments != b->n_segments ||
        a->ms != b->ms ||
        memcmp(a->instances, b->instances, sizeof *a->instances * (size_t)a->n_instances) != 0)
        return 0;
    for (int k = 0; k < a->n_segments; k++)
        if (!segments_equal(&a->segments[k], &b->segments[k]))
            return 0;
    return 1;
}

static int header_equal(const plan *a, const plan *b) {
    const plan_device *x = &a->device, *y = &b->device;
    int same = a->version == b->version && strcmp(a->stof_version, b->stof_version) == 0 &&
               strcmp(a->stof_commit, b->stof_commit) == 0 && x->measured == y->measured &&
               strcmp(x->name, y->name) == 0 && strcmp(x->arch, y->arch) == 0 &&
               (!x->measured || (x->cc_major == y->cc_major && x->cc_minor == y->cc_minor &&
                                 x->sm_count == y->sm_count)) &&
               strcmp(a->script_name, b->script_name) == 0 && a->script_hash == b->script_hash &&
               a->n_params == b->n_params && a->batch == b->batch && a->seq == b->seq &&
               a->latency_ms == b->latency_ms && a->tuning_s == b->tuning_s &&
               a->stats.settings_measured == b->stats.settings_measured &&
               a->stats.cache_hits == b->stats.cache_hits &&
               a->stats.schemes_tried == b->stats.schemes_tried &&
               a->stats.schemes_kept == b->stats.schemes_kept && a->stats.rounds == b->stats.rounds &&
               a->stats.measured_past_limit == b->stats.measured_past_limit;
    for (int i = 0; same && i < a->n_params; i++)
        same = strcmp(a->params[i].key, b->params[i].key) == 0 &&
               strcmp(a->params[i].value, b->params[i].value) == 0;
    return same;
}

static int plans_equal(const plan *a, const plan *b) {
    if (!header_equal(a, b) || a->n_inputs != b->n_inputs || a->n_masks != b->n_masks ||
        a->n_sequences != b->n_sequences)
        return 0;
    for (int i = 0; i < a->n_inputs; i++)
        if (strcmp(a->inputs[i].name, b->inputs[i].name) != 0 ||
            a->inputs[i].ndim != b->inputs[i].ndim ||
            memcmp(a->inputs[i].shape, b->inputs[i].shape,
                   sizeof a->inputs[i].shape[0] * (size_t)a->inputs[i].ndim) != 0)
            return 0;
    for (int i = 0; i < a->n_masks; i++)
        if (strcmp(a->masks[i].description, b->masks[i].description) != 0 ||
            a->masks[i].fingerprint != b->masks[i].fingerprint ||
            a->masks[i].batch != b->masks[i].batch || a->masks[i].q_len != b->masks[i].q_len ||
            a->masks[i].k_len != b->masks[i].k_len)
            return 0;
    for (int i = 0; i < a->n_sequences; i++)
        if (!sequences_equal(&a->sequences[i], &b->sequences[i]))
            return 0;
    return 1;
}

/* ==== round trips ================================================================================= */

static void test_roundtrip(const fixture *f) {
    plan p, back;
    if (make_plan(f, &h100, NULL, &p))
        return;
    /* what the plan holds, from the search and the script */
    CHECK_EQ_INT(p.n_sequences, f->n_seqs);
    CHECK_NEAR(p.latency_ms, f->result.total_ms, 0);
    CHECK(strcmp(p.script_name, "bert.lua") == 0 && p.script_hash == f->script.content_hash);
    CHECK(strcmp(p.device.arch, "sm_90") == 0 && p.device.measured);
    CHECK(p.batch == 2 && p.seq == 128 && p.n_inputs == 1);
    CHECK_EQ_INT(p.n_masks, 1);
    CHECK(strcmp(p.stof_version, stof_version()) == 0);

    stof_error err = {0};
    const char *path = WORK "plan_roundtrip.json";
    CHECK_EQ_INT(plan_write(&p, path, &err), STOF_OK);
    CHECK_MSG(plan_read(path, &back, &err) == STOF_OK, "%s", err.msg);
    CHECK(plans_equal(&p, &back));
    CHECK_EQ_INT(plan_check_fits(&back, &h100, &f->script, &f->g, &err), STOF_OK);
    /* writing what was read gives the same text */
    char *t1 = plan_text(&p), *t2 = plan_text(&back);
    CHECK(t1 && t2 && strcmp(t1, t2) == 0);
    /* human-readable: indented, one key a line */
    CHECK(t1 && strstr(t1, "\n\t\"sequences\":") != NULL);
    /* the optional "not searched" count: absent at 0, kept when set */
    CHECK(t1 && strstr(t1, "measured_past_limit") == NULL);
    free(t1);
    free(t2);
    plan_free(&back);
    p.stats.measured_past_limit = 7;
    CHECK_EQ_INT(plan_write(&p, path, &err), STOF_OK);
    CHECK_MSG(plan_read(path, &back, &err) == STOF_OK, "%s", err.msg);
    CHECK_EQ_INT(back.stats.measured_past_limit, 7);
    CHECK(plans_equal(&p, &back));
    plan_free(&back);
    plan_free(&p);

    /* planned offline: fits any GPU of its architecture */
    if (make_plan(f, NULL, "sm_90", &p))
        return;
    CHECK_EQ_INT(plan_write(&p, path, &err), STOF_OK);
    CHECK_MSG(plan_read(path, &back, &err) == STOF_OK, "%s", err.msg);
    CHECK(plans_equal(&p, &back) && !back.device.measured);
    CHECK(strcmp(back.device.name, PLAN_UNMEASURED) == 0);
    stof_device_info other_h100 = h100;
    snprintf(other_h100.name, sizeof other_h100.name, "NVIDIA H100 PCIe");
    other_h100.sm_count = 114;
    CHECK_EQ_INT(plan_check_fits(&back, &other_h100, &f->script, &f->g, &err), STOF_OK);
    stof_device_info a100 = {.name = "NVIDIA A100-SXM4-80GB", .cc_major = 8, .sm_count = 108};
    CHECK_EQ_INT(plan_check_fits(&back, &a100, NULL, NULL, &err), STOF_ERR_MISMATCH);
    CHECK_CONTAINS(err.msg, "made offline for sm_90");
    CHECK_CONTAINS(err.msg, "sm_80");
    plan_free(&back);
    plan_free(&p);
    CHECK_EQ_INT(plan_read(WORK "no_such_plan.json", &back, &err), STOF_ERR_IO);
}

/* ==== mismatches ===================================================================================== */

static void expect_mismatch(const plan *p, const stof_device_info *dev, const graph_script *s,
                            const graph *g, const char *needle) {
    stof_error err = {0};
    CHECK_EQ_INT(plan_check_fits(p, dev, s, g, &err), STOF_ERR_MISMATCH);
    CHECK_CONTAINS(err.msg, needle);
}

static void test_mismatch(const fixture *f) {
    plan p;
    if (make_plan(f, &h100, NULL, &p))
        return;
    stof_device_info other = h100;
    snprintf(other.name, sizeof other.name, "NVIDIA H200");
    expect_mismatch(&p, &other, NULL, NULL, "tuned on another GPU: 'NVIDIA H100 80GB HBM3'");
    expect_mismatch(&p, &other, NULL, NULL, "this one is 'NVIDIA H200'");

    graph_script s = f->script;
    s.content_hash ^= 1;
    expect_mismatch(&p, NULL, &s, NULL, "script bert.lua changed since the plan was made");
    s = f->script;
    snprintf(s.name, sizeof s.name, "gpt2.lua");
    expect_mismatch(&p, NULL, &s, NULL, "the plan is for script bert.lua, not gpt2.lua");

    /* the same script with other parameters */
    fixture g;
    const char *params[] = {"preset=small", "layers=3", "batch=2", "seq=128", "mask=bigbird"};
    fixture_load(&g, SCRIPTS "bert.lua", params, 5);
    if (g.ok) {
        expect_mismatch(&p, NULL, &g.script, NULL, "the plan was made with layers=2, the script "
                                                   "now has layers=3");
        /* its graph has a third layer the plan has no scheme for */
        expect_mismatch(&p, NULL, NULL, &g.g, "have no scheme in the plan");
    }
    fixture_free(&g);
    const char *longer[] = {"preset=small", "layers=2", "batch=2", "seq=256", "mask=bigbird"};
    fixture_load(&g, SCRIPTS "bert.lua", longer, 5);
    if (g.ok)
        expect_mismatch(&p, NULL, NULL, &g.g, "input input_ids is [2, 256]");
    fixture_free(&g);
    const char *dense[] = {"preset=small", "layers=2", "batch=2", "seq=128", "mask=none"};
    fixture_load(&g, SCRIPTS "bert.lua", dense, 5);
    if (g.ok)
        expect_mismatch(&p, NULL, NULL, &g.g, "the plan has 1 masks, the graph 0");
    fixture_free(&g);

    /* a scheme whose length is not the graph's sequence */
    plan_sequence *q = &p.sequences[1];
    q->n_ops--;
    expect_mismatch(&p, NULL, NULL, &f->g, "has a scheme of 13 ops, but the graph's sequence at "
                                           "#2 has 14");
    q->n_ops++;
    q->instances[0]++;
    expect_mismatch(&p, NULL, NULL, &f->g, "starts at op #3, where no sequence of the graph");
    q->instances[0]--;
    op_kind k = q->segments[0].kinds[0];
    q->segments[0].kinds[0] = OP_RELU;
    expect_mismatch(&p, NULL, NULL, &f->g, "op #2 is gemm in the graph but relu in the plan");
    q->segments[0].kinds[0] = k;
    /* a mask's recorded shape is checked too, not only its fingerprint */
    p.masks[0].q_len++;
    expect_mismatch(&p, NULL, NULL, &f->g, "the plan says batch 1, q_len 129, k_len 128");
    p.masks[0].q_len--;
    stof_error err = {0};
    CHECK_EQ_INT(plan_check_fits(&p, &h100, &f->script, &f->g, &err), STOF_OK);
    plan_free(&p);
}

/* ==== hand edits ===================================================================================== */

/* The item at "a/b/0/c" (array elements by index), or NULL. */
static cJSON *at_path(cJSON *root, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    cJSON *it = root;
    for (char *tok = strtok(buf, "/"); it && tok; tok = strtok(NULL, "/"))
        it = cJSON_IsArray(it) ? cJSON_GetArrayItem(it, atoi(tok))
                               : cJSON_GetObjectItemCaseSensitive(it, tok);
    return it;
}

typedef enum edit_kind { EDIT_SET, EDIT_DELETE, EDIT_ADD } edit_kind;

/* Splits "a/b/c" into the parent's path "a/b" and the last step "c". */
static cJSON *parent_of(cJSON *root, const char *path, char *last, size_t cap) {
    char parent[256];
    snprintf(parent, sizeof parent, "%s", path);
    char *slash = strrchr(parent, '/');
    snprintf(last, cap, "%s", slash ? slash + 1 : parent);
    if (!slash)
        return root;
    *slash = '\0';
    return at_path(root, parent);
}

/* Sets, deletes or (EDIT_ADD: key under the object at path) adds an item;
 * value is taken over. */
static void apply_edit(cJSON *root, edit_kind kind, const char *path, const char *key,
                       cJSON *value) {
    char last[256];
    cJSON *pa = parent_of(root, path, last, sizeof last);
    if (kind == EDIT_ADD)
        cJSON_AddItemToObject(at_path(root, path), key, value);
    else if (kind == EDIT_DELETE)
        cJSON_Delete(cJSON_DetachItemViaPointer(pa, at_path(root, path)));
    else if (cJSON_IsArray(pa))
        cJSON_ReplaceItemInArray(pa, atoi(last), value);
    else
        cJSON_ReplaceItemInObjectCaseSensitive(pa, last, value);
}

/* Applies one edit to the valid plan text and expects STOF_ERR_FORMAT with
 * needle in the message. */
static void expect_edit(const char *valid, edit_kind kind, const char *path, const char *key,
                        cJSON *value, const char *needle) {
    cJSON *root = cJSON_Parse(valid);
    CHECK_MSG(at_path(root, path) != NULL, "no item at %s", path);
    if (!at_path(root, path)) {
        cJSON_Delete(value);
        cJSON_Delete(root);
        return;
    }
    apply_edit(root, kind, path, key, value);
    char *text = cJSON_Print(root);
    plan p;
    stof_error err = {0};
    int rc = plan_from_json(text, strlen(text), "edited.json", &p, &err);
    CHECK_MSG(rc == STOF_ERR_FORMAT, "%s: rc %d, expected a format error", needle, rc);
    CHECK_CONTAINS(err.msg, needle);
    if (!rc)
        plan_free(&p);
    free(text);
    cJSON_Delete(root);
}

static void expect_text_error(const char *text, const char *needle) {
    plan p;
    stof_error err = {0};
    int rc = plan_from_json(text, strlen(text), "edited.json", &p, &err);
    CHECK_MSG(rc == STOF_ERR_FORMAT, "%s: rc %d", needle, rc);
    CHECK_CONTAINS(err.msg, needle);
    if (!rc)
        plan_free(&p);
}

/* ==== decode steps ===================================================================================== */

/* A plan holding decode steps (here the fixture's own plan stands in for a step's): written and
 * read back whole, found by batch; a second step for one batch, a step holding steps, and hand
 * edits of the "decode" list are refused with the field named. */
static void test_decode_steps(const fixture *f) {
    plan p, s1, s8, back;
    if (make_plan(f, &h100, NULL, &p) || make_plan(f, &h100, NULL, &s1) ||
        make_plan(f, NULL, "sm_90", &s8))
        return;
    stof_error err = {0};
    CHECK_EQ_INT(plan_add_decode(&p, 1, 2048, &s1, &err), STOF_OK);
    CHECK_EQ_INT(plan_add_decode(&p, 8, 512, &s8, &err), STOF_OK);
    CHECK(s1.n_sequences == 0 && s8.n_sequences == 0); /* taken over */
    plan dup;
    if (!make_plan(f, &h100, NULL, &dup)) {
        CHECK_EQ_INT(plan_add_decode(&p, 8, 512, &dup, &err), STOF_ERR_INVALID);
        CHECK_CONTAINS(err.msg, "already holds a decode step for batch 8");
        CHECK_EQ_INT(plan_add_decode(&dup, 2, 0, &dup, &err), STOF_ERR_INVALID);
        plan_free(&dup);
    }
    const char *path = WORK "plan_decode.json";
    CHECK_EQ_INT(plan_write(&p, path, &err), STOF_OK);
    CHECK_MSG(plan_read(path, &back, &err) == STOF_OK, "%s", err.msg);
    CHECK(plans_equal(&p, &back) && back.n_decode == 2);
    const plan_decode *d1 = plan_decode_find(&back, 1), *d8 = plan_decode_find(&back, 8);
    CHECK(d1 && d8 && !plan_decode_find(&back, 2));
    if (d1 && d8) {
        CHECK(d1->context == 2048 && d1->step->device.measured && plans_equal(d1->step, &p));
        CHECK(d8->context == 512 && !d8->step->device.measured);
    }
    char *text = plan_text(&back);
    plan_free(&back);
    plan_free(&p);
    if (!text)
        return;
    expect_edit(text, EDIT_SET, "decode/1/batch", NULL, cJSON_CreateNumber(1),
                "decode[1].batch: a second decode step for batch 1");
    expect_edit(text, EDIT_SET, "decode/0/context", NULL, cJSON_CreateNumber(0),
                "decode[0].context: expected an integer from 1");
    expect_edit(text, EDIT_DELETE, "decode/0/plan", NULL, NULL, "decode[0].plan: missing");
    expect_edit(text, EDIT_ADD, "decode/0", "extra", cJSON_CreateNumber(1),
                "decode[0].extra: unknown key");
    expect_edit(text, EDIT_SET, "decode/1/plan/latency_ms", NULL, cJSON_CreateNumber(-1),
                "edited.json: decode[1].plan: latency_ms: expected a time");
    expect_edit(text, EDIT_ADD, "decode/0/plan", "decode", cJSON_CreateArray(),
                "decode[0].plan: decode: unknown key");
    expect_edit(text, EDIT_SET, "decode", NULL, cJSON_CreateArray(),
                "decode: expected 1 to 64 elements, got 0");
    free(text);
}

/* A segment of sequence 1 (the layer) whose template has parameters with
 * more than one value; its path in pathbuf. */
static const plan_segment *tunable_segment(const plan *p, char *pathbuf, size_t cap) {
    for (int k = 0; k < p->sequences[1].n_segments; k++) {
        const plan_segment *s = &p->sequences[1].segments[k];
        if (fusion_template_get(s->kernel.tmpl)->params[0].n_values > 1) {
            snprintf(pathbuf, cap, "sequences/1/segments/%d", k);
            return s;
        }
    }
    return NULL;
}

/* SPLIT_K came after the first plans: a gemm_epilogue kernel without it
 * reads as SPLIT_K 1; with it, only values of its space are accepted. */
static void test_optional_param(const fixture *f) {
    plan p;
    if (make_plan(f, &h100, NULL, &p))
        return;
    char *valid = plan_text(&p);
    int k = -1;
    for (int i = 0; i < p.sequences[1].n_segments && k < 0; i++)
        if (p.sequences[1].segments[i].kernel.tmpl == FUSION_T_GEMM_EPILOGUE)
            k = i;
    plan_free(&p);
    CHECK_MSG(valid && k >= 0, "no gemm_epilogue segment in the plan");
    if (!valid || k < 0) {
        free(valid);
        return;
    }
    char path[96];
    snprintf(path, sizeof path, "sequences/1/segments/%d/params", k);
    cJSON *root = cJSON_Parse(valid);
    cJSON *params = at_path(root, path);
    CHECK(params && cJSON_GetObjectItemCaseSensitive(params, "SPLIT_K"));
    cJSON_DeleteItemFromObjectCaseSensitive(params, "SPLIT_K");
    char *text = cJSON_Print(root);
    stof_error err = {0};
    int rc = plan_from_json(text, strlen(text), "old.json", &p, &err);
    CHECK_MSG(rc == STOF_OK, "a plan without SPLIT_K: %s", err.msg);
    if (rc == STOF_OK) {
        const plan_kernel *kn = &p.sequences[1].segments[k].kernel;
        CHECK(kn->n_values == 6 && kn->values[5] == 1);
        plan_free(&p);
    }
    free(text);
    cJSON_Delete(root);
    snprintf(path, sizeof path, "sequences/1/segments/%d/params/SPLIT_K", k);
    expect_edit(valid, EDIT_SET, path, NULL, cJSON_CreateNumber(3),
                "3 is not in the space of gemm_epilogue");
    /* the others stay required */
    snprintf(path, sizeof path, "sequences/1/segments/%d/params/BLOCK_K", k);
    expect_edit(valid, EDIT_DELETE, path, NULL, NULL, "params.BLOCK_K: missing");
    free(valid);
}

static void test_format_errors(const fixture *f) {
    plan p;
    if (make_plan(f, &h100, NULL, &p))
        return;
    char *valid = plan_text(&p);
    if (!valid) {
        plan_free(&p);
        return;
    }
    char seg[96], path[160], bad_hex[64];
    const plan_segment *ts = tunable_segment(&p, seg, sizeof seg);
    const fusion_template *tt = ts ? fusion_template_get(ts->kernel.tmpl) : NULL;

    expect_edit(valid, EDIT_DELETE, "sequences/0/ms", NULL, NULL,
                "edited.json: sequences[0].ms: missing");
    expect_edit(valid, EDIT_SET, "shapes/batch", NULL, cJSON_CreateString("8"),
                "shapes.batch: expected an integer, got a string");
    expect_edit(valid, EDIT_SET, "shapes/seq", NULL, cJSON_CreateNumber(12.5),
                "shapes.seq: expected an integer from 1 to");
    expect_edit(valid, EDIT_ADD, "sequences/1/segments/0", "colour", cJSON_CreateString("red"),
                "sequences[1].segments[0].colour: unknown key");
    expect_edit(valid, EDIT_ADD, "", "latency_ms", cJSON_CreateNumber(1),
                "latency_ms: the key appears twice");
    expect_edit(valid, EDIT_SET, "version", NULL, cJSON_CreateNumber(2),
                "version: expected an integer from 1 to 1, got 2");
    expect_edit(valid, EDIT_SET, "format", NULL, cJSON_CreateString("onnx"),
                "format: expected \"stof-plan\"");
    expect_edit(valid, EDIT_SET, "sequences/1/segments/0/template", NULL,
                cJSON_CreateString("nope"), "\"nope\" is not a template here");
    expect_edit(valid, EDIT_SET, "sequences/1/segments/0/kernel", NULL,
                cJSON_CreateString("x.cu"), "sequences[1].segments[0].kernel: template");
    expect_edit(valid, EDIT_SET, "sequences/1/segments/0/ops/0", NULL, cJSON_CreateString("conv"),
                "sequences[1].segments[0].ops.0: expected an op kind");
    if (tt) {
        snprintf(path, sizeof path, "%s/params/%s", seg, tt->params[0].name);
        expect_edit(valid, EDIT_SET, path, NULL, cJSON_CreateNumber(12345),
                    "12345 is not in the space of");
        snprintf(path, sizeof path, "%s/params/%s", seg, tt->params[0].name);
        expect_edit(valid, EDIT_DELETE, path, NULL, NULL, tt->params[0].name);
    }
    snprintf(bad_hex, sizeof bad_hex, "%d:0000", p.sequences[1].n_ops);
    expect_edit(valid, EDIT_SET, "sequences/1/scheme/hex", NULL, cJSON_CreateString(bad_hex),
                "sequences[1].scheme.hex: \"14:0000\" is not the scheme");
    expect_edit(valid, EDIT_SET, "sequences/1/scheme/binary", NULL,
                cJSON_CreateString("01201010101010"), "sequences[1].scheme.binary: scheme '01201010101010': '2' at position 2");
    expect_edit(valid, EDIT_SET, "sequences/1/segments/0/ms", NULL,
                cJSON_CreateNumber(p.sequences[1].segments[0].ms + 1),
                "sequences[1].ms: ");
    expect_edit(valid, EDIT_SET, "sequences/1/segments/0/ms", NULL, cJSON_CreateNumber(-1),
                "sequences[1].segments[0].ms: expected a time of 0 or more");
    expect_edit(valid, EDIT_SET, "latency_ms", NULL, cJSON_CreateNumber(p.latency_ms * 2),
                "is not the sum of the sequences' times");
    expect_edit(valid, EDIT_DELETE, "sequences/1/segments/0", NULL, NULL,
                "sequences[1].segments: expected");
    expect_edit(valid, EDIT_SET, "sequences/1/segments/1/first", NULL, cJSON_CreateNumber(0),
                "sequences[1].segments[1].first: expected an integer from");
    expect_edit(valid, EDIT_SET, "device/arch", NULL, cJSON_CreateString("sm_80"),
                "does not go with compute capability 9.0");
    expect_edit(valid, EDIT_SET, "device/compute_capability", NULL, cJSON_CreateString("nine"),
                "device.compute_capability: expected \"MAJOR.MINOR\"");
    expect_edit(valid, EDIT_DELETE, "device/sms", NULL, NULL, "device.sms: missing");
    expect_edit(valid, EDIT_SET, "script/hash", NULL, cJSON_CreateString("0x12"),
                "script.hash: expected \"0x\" and 16 hex digits");
    expect_edit(valid, EDIT_SET, "script/params", NULL, cJSON_CreateArray(),
                "script.params: expected an object, got an array");
    /* plans written before the attention list was dropped hold one: named, not skipped */
    expect_edit(valid, EDIT_ADD, "", "attention", cJSON_CreateArray(),
                "edited.json: attention: unknown key (a plan of another stof version or edited "
                "by hand: tune again");
    expect_edit(valid, EDIT_SET, "sequences/1/instances/1", NULL, cJSON_CreateNumber(1),
                "sequences[1].instances.1: expected an op index above 2");
    expect_edit(valid, EDIT_SET, "masks/0/description", NULL, cJSON_CreateNull(),
                "masks[0].description: expected a string, got null");
    expect_edit(valid, EDIT_SET, "search", NULL, cJSON_CreateTrue(),
                "search: expected an object, got a boolean");
    expect_edit(valid, EDIT_SET, "shapes/inputs/0/shape/1", NULL, cJSON_CreateNumber(0),
                "shapes.inputs[0].shape.1: expected a size from 1");

    /* broken text */
    char *cut = strdup(valid);
    cut[strlen(cut) / 2] = '\0';
    expect_text_error(cut, "edited.json: not valid JSON (line");
    free(cut);
    size_t n = strlen(valid);
    char *tail = malloc(n + 8);
    snprintf(tail, n + 8, "%s\n{}", valid);
    expect_text_error(tail, "text after the plan");
    free(tail);
    expect_text_error("", "not valid JSON (line 1, column 1)");
    expect_text_error("[]", "the plan: expected an object, got an array");
    free(valid);
    plan_free(&p);
}

/* ==== the fuzz ============================================================================================= */

/* Every item of the tree, in document order. */
static int collect_items(cJSON *it, cJSON **out, int n, int max) {
    for (cJSON *c = it->child; c; c = c->next) {
        if (n < max)
            out[n++] = c;
        n = collect_items(c, out, n, max);
    }
    return n;
}

static cJSON *random_value(util_rng *r) {
    switch (util_rng_next(r) % 8) {
    case 0: return cJSON_CreateString("x");
    case 1: return cJSON_CreateNumber(-1);
    case 2: return cJSON_CreateNumber(1e300);
    case 3: return cJSON_CreateNumber(0.5);
    case 4: return cJSON_CreateTrue();
    case 5: return cJSON_CreateNull();
    case 6: return cJSON_CreateArray();
    default: return cJSON_CreateObject();
    }
}

/* One structural mutation through cJSON: delete, rename or retype an item. */
static char *mutate_tree(const char *valid, util_rng *r) {
    cJSON *root = cJSON_Parse(valid);
    int max = 20000;
    cJSON **items = malloc(sizeof *items * (size_t)max);
    int n = collect_items(root, items, 0, max);
    cJSON *it = items[util_rng_next(r) % (uint64_t)n];
    cJSON *parent = root;
    for (int i = 0; i < n; i++)
        for (cJSON *c = items[i]->child; c; c = c->next)
            if (c == it)
                parent = items[i];
    switch (util_rng_next(r) % 3) {
    case 0:
        cJSON_Delete(cJSON_DetachItemViaPointer(parent, it));
        break;
    case 1:
        if (it->string) {
            char name[128];
            snprintf(name, sizeof name, "%s_x", it->string);
            cJSON *v = cJSON_DetachItemViaPointer(parent, it);
            cJSON_AddItemToObject(parent, name, v);
        }
        break;
    default:
        cJSON_ReplaceItemViaPointer(parent, it, random_value(r));
        break;
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    free(items);
    return text;
}

/* One textual mutation: truncate, flip a character, or splice in junk. */
static char *mutate_text(const char *valid, util_rng *r, size_t *len) {
    size_t n = strlen(valid);
    char *t = malloc(n + 16);
    memcpy(t, valid, n + 1);
    size_t at = (size_t)(util_rng_next(r) % n);
    switch (util_rng_next(r) % 3) {
    case 0:
        *len = at; /* truncated: the parser gets the first `at` bytes */
        return t;
    case 1:
        t[at] = (char)(util_rng_next(r) & 0xff);
        break;
    default:
        t[at] = "{}[]\",:-0e"[util_rng_next(r) % 11];
        break;
    }
    *len = n;
    return t;
}

static void test_fuzz(const fixture *f) {
    plan p;
    if (make_plan(f, &h100, NULL, &p))
        return;
    char *valid = plan_text(&p);
    plan_free(&p);
    if (!valid)
        return;
    util_rng r = {20240611};
    int errors = 0, accepted = 0, unexpected = 0;
    for (int i = 0; i < 600; i++) {
        size_t len;
        char *text;
        if (i % 2) {
            text = mutate_tree(valid, &r);
            len = strlen(text);
        } else {
            text = mutate_text(valid, &r, &len);
        }
        stof_error err = {0};
        plan q;
        int rc = plan_from_json(text, len, "fuzz.json", &q, &err);
        if (rc == STOF_OK) {
            /* a mutation that still reads must be a whole, writable plan */
            char *again = NULL;
            accepted++;
            unexpected += plan_to_json(&q, &again, NULL) != STOF_OK;
            free(again);
            plan_free(&q);
        } else {
            errors++;
            unexpected += rc != STOF_ERR_FORMAT || strncmp(err.msg, "fuzz.json: ", 11) != 0;
        }
        free(text);
    }
    CHECK_EQ_INT(unexpected, 0);
    CHECK(errors > 400);
    printf("  fuzz: 600 mutations, %d rejected with a format error, %d still valid\n", errors,
           accepted);
    free(valid);
}

int main(void) {
    fixture f;
    const char *params[] = {"preset=small", "layers=2", "batch=2", "seq=128", "mask=bigbird"};
    fixture_load(&f, SCRIPTS "bert.lua", params, 5);
    if (f.ok) {
        test_roundtrip(&f);
        test_decode_steps(&f);
        test_mismatch(&f);
        test_format_errors(&f);
        test_optional_param(&f);
        test_fuzz(&f);
    }
    fixture_free(&f);
    return check_summary("test_plan");
}
