/* Hugging Face model directories (core/io/model_dir.h): config.json read,
 * weights found in one file or in shards, and every way a folder can be
 * wrong said with the file and what was expected. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "reference.h"
#include "core/io/model_dir.h"
#include "core/io/safetensors.h"
#include "core/io/weights.h"
#include "core/lua/lua_api.h"
#include "core/ref/ref.h"
#include "ops/mask.h"
#include "stof.h"

#define WORK STOF_BINARY_DIR "/tests/model_dir/"

static void put(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f != NULL, "cannot write %s", path);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void fresh_dir(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    CHECK(system(cmd) == 0);
}

static void put_weights(const char *dir, const char *name, const char *const *tensors, int n) {
    static const float v[4] = {1, 2, 3, 4};
    safetensors_entry e[4];
    for (int k = 0; k < n; k++)
        e[k] = (safetensors_entry){tensors[k], SAFETENSORS_F32, 1, {2}, v + k % 3};
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    stof_error err = {0};
    CHECK_MSG(safetensors_write(path, e, n, &err) == STOF_OK, "%s", err.msg);
}

static const char *bert_config = "{\"model_type\": \"bert\", \"architectures\": [\"BertModel\"],"
                                 " \"hidden_size\": 32, \"num_hidden_layers\": 2}";

static void expect_error(const char *dir, int code, const char *what) {
    model_dir md;
    stof_error err = {0};
    CHECK_EQ_INT(model_dir_open(dir, &md, &err), code);
    CHECK_CONTAINS(err.msg, what);
    CHECK(md.config == NULL && md.n_shards == 0);
}

static void test_single_file(void) {
    const char *dir = WORK "single";
    fresh_dir(dir);
    put(dir, "config.json", bert_config);
    const char *names[] = {"a.weight", "b.weight"};
    put_weights(dir, "model.safetensors", names, 2);
    CHECK(model_dir_detect(dir));
    model_dir md;
    stof_error err = {0};
    CHECK_MSG(model_dir_open(dir, &md, &err) == STOF_OK, "%s", err.msg);
    CHECK(strcmp(md.model_type, "bert") == 0);
    CHECK(strcmp(md.architecture, "BertModel") == 0);
    CHECK_EQ_INT(md.n_shards, 1);
    CHECK_EQ_INT(md.sharded, 0);
    safetensors_file *f = NULL;
    CHECK_MSG(model_dir_open_weights(&md, &f, &err) == STOF_OK, "%s", err.msg);
    CHECK(f && f->n == 2);
    safetensors_close(f);
    model_dir_free(&md);
}

static void test_shards(void) {
    const char *dir = WORK "sharded";
    fresh_dir(dir);
    put(dir, "config.json", "{\"model_type\": \"gpt2\"}");
    const char *one[] = {"h.0.w", "h.1.w"}, *two[] = {"wte.weight"};
    put_weights(dir, "model-00001-of-00002.safetensors", one, 2);
    put_weights(dir, "model-00002-of-00002.safetensors", two, 1);
    put(dir, "model.safetensors.index.json",
        "{\"metadata\": {\"total_size\": 24}, \"weight_map\": {"
        "\"h.0.w\": \"model-00001-of-00002.safetensors\","
        "\"wte.weight\": \"model-00002-of-00002.safetensors\","
        "\"h.1.w\": \"model-00001-of-00002.safetensors\"}}");
    model_dir md;
    stof_error err = {0};
    CHECK_MSG(model_dir_open(dir, &md, &err) == STOF_OK, "%s", err.msg);
    CHECK_EQ_INT(md.sharded, 1);
    CHECK_EQ_INT(md.n_shards, 2);
    CHECK(strcmp(md.architecture, "") == 0);
    safetensors_file *f = NULL;
    CHECK_MSG(model_dir_open_weights(&md, &f, &err) == STOF_OK, "%s", err.msg);
    if (f) {
        CHECK_EQ_INT(f->n, 3);
        /* each tensor read from its own shard */
        float a[2], b[2];
        CHECK_EQ_INT(safetensors_read_f32(f, safetensors_find(f, "h.1.w", &err), a, &err), STOF_OK);
        CHECK_EQ_INT(safetensors_read_f32(f, safetensors_find(f, "wte.weight", &err), b, &err),
                     STOF_OK);
        CHECK(a[0] == 2 && a[1] == 3);
        CHECK(b[0] == 1 && b[1] == 2);
        CHECK(strstr(safetensors_tensor_path(f, safetensors_find(f, "wte.weight", &err)),
                     "model-00002-of-00002") != NULL);
        safetensors_close(f);
    }
    model_dir_free(&md);

    /* the index puts a tensor in a shard that does not hold it */
    put(dir, "model.safetensors.index.json",
        "{\"weight_map\": {\"h.0.w\": \"model-00002-of-00002.safetensors\","
        "\"wte.weight\": \"model-00001-of-00002.safetensors\"}}");
    CHECK_EQ_INT(model_dir_open(dir, &md, &err), STOF_OK);
    CHECK_EQ_INT(model_dir_open_weights(&md, &f, &err), STOF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "the index puts 'h.0.w' in model-00002-of-00002.safetensors, which "
                            "does not hold it");
    CHECK(f == NULL);
    model_dir_free(&md);

    /* one tensor in two shards */
    put_weights(dir, "model-00002-of-00002.safetensors", one, 1);
    put(dir, "model.safetensors.index.json",
        "{\"weight_map\": {\"h.0.w\": \"model-00001-of-00002.safetensors\","
        "\"h.1.w\": \"model-00002-of-00002.safetensors\"}}");
    CHECK_EQ_INT(model_dir_open(dir, &md, &err), STOF_OK);
    CHECK_EQ_INT(model_dir_open_weights(&md, &f, &err), STOF_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "tensor 'h.0.w': is in two shards");
    model_dir_free(&md);

    /* a missing shard, a shard outside the folder, a weight_map that is not one */
    put(dir, "model.safetensors.index.json",
        "{\"weight_map\": {\"h.0.w\": \"model-00003-of-00003.safetensors\"}}");
    expect_error(dir, STOF_ERR_IO, "shard " WORK "sharded/model-00003-of-00003.safetensors is "
                                   "missing");
    put(dir, "model.safetensors.index.json", "{\"weight_map\": {\"h.0.w\": \"../x.safetensors\"}}");
    expect_error(dir, STOF_ERR_FORMAT, "shard '../x.safetensors' is not a file name of this folder");
    put(dir, "model.safetensors.index.json", "{\"weight_map\": [1]}");
    expect_error(dir, STOF_ERR_FORMAT, "\"weight_map\" must be an object");
    put(dir, "model.safetensors.index.json", "{\"weight_map\": {\"h.0.w\": 3}}");
    expect_error(dir, STOF_ERR_FORMAT, "weight_map['h.0.w'] must be a shard's file name");
}

static void test_errors(void) {
    const char *dir = WORK "bad";
    fresh_dir(dir);
    expect_error(WORK "no-such-folder", STOF_ERR_INVALID, "is not a model directory");
    expect_error(dir, STOF_ERR_INVALID, "has no config.json: not a Hugging Face model directory");
    CHECK(!model_dir_detect(dir));
    put(dir, "config.json", "{\"model_type\": \"bert\",");
    expect_error(dir, STOF_ERR_FORMAT, "config.json: not valid JSON");
    put(dir, "config.json", "[\"bert\"]");
    expect_error(dir, STOF_ERR_FORMAT, "config.json: expected a JSON object");
    put(dir, "config.json", "{\"hidden_size\": 768}");
    expect_error(dir, STOF_ERR_FORMAT, "\"model_type\" must be a non-empty string");
    put(dir, "config.json", "{\"model_type\": \"bert\", \"architectures\": \"BertModel\"}");
    expect_error(dir, STOF_ERR_FORMAT, "\"architectures\" must be a list of names");
    put(dir, "config.json", bert_config);
    expect_error(dir, STOF_ERR_IO, "has no model.safetensors or model.safetensors.index.json");
    put(dir, "pytorch_model.bin", "not read");
    expect_error(dir, STOF_ERR_IO, "not pytorch_model.bin");
    char sub[256];
    snprintf(sub, sizeof sub, "%s/config.json", WORK "dir-config");
    fresh_dir(WORK "dir-config");
    CHECK(mkdir(sub, 0755) == 0);
    expect_error(WORK "dir-config", STOF_ERR_IO, "a directory, not a model config");
}

/* ---- a model directory end to end: config -> script -> graph -> weights ------------- */

#define SCRIPTS STOF_SOURCE_DIR "/scripts/"

/* v [rows, cols] transposed in place (a scratch copy). */
static void transpose_2d(float *v, int64_t rows, int64_t cols) {
    float *t = malloc(sizeof *t * (size_t)(rows * cols));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            t[c * rows + r] = v[r * cols + c];
    memcpy(v, t, sizeof *t * (size_t)(rows * cols));
    free(t);
}

/* The graph's weights as a checkpoint would store them, from the values
 * seeded with seed: a weight assembled from parts as its parts (equal rows
 * each), a weight that is rows R.. of a tensor with R rows of 7 before it,
 * a weight read transposed as its transpose (GPT-2's Conv1D [in, out]);
 * every name after prefix; into n_shards files (with an index) or one. */
static void export_dir(const graph *g, uint64_t seed, const char *dir, const char *prefix,
                       int n_shards) {
    safetensors_entry e[256];
    char names[256][GRAPH_NAME_MAX + 16];
    float *data[256];
    int n = 0;
    for (int t = 0; t < g->n_tensors; t++) {
        const graph_tensor *x = &g->tensors[t];
        if (x->role != GRAPH_WEIGHT || x->constant)
            continue; /* a constant (a norm without bias) is in no checkpoint */
        int64_t numel = graph_tensor_numel(x);
        float *v = malloc(sizeof *v * (size_t)numel);
        weights_fill(x, seed, v);
        const graph_source *src = graph_source_of(g, t);
        int parts = src && !src->row_offset ? src->n : 1;
        int64_t row = numel / x->shape[0], first = 0;
        for (int k = 0; k < parts && n < 256; k++, n++) {
            int64_t rows = parts > 1 ? src->part_rows[k] : x->shape[0];
            snprintf(names[n], sizeof names[n], "%s%s", prefix,
                     src && !src->row_offset ? graph_source_part(g, src, k) : x->name);
            e[n] = (safetensors_entry){names[n], SAFETENSORS_F32, x->ndim, {0}, NULL};
            memcpy(e[n].shape, x->shape, sizeof x->shape[0] * (size_t)x->ndim);
            e[n].shape[0] = rows;
            data[n] = malloc(sizeof(float) * (size_t)(rows * row));
            memcpy(data[n], v + first * row, sizeof(float) * (size_t)(rows * row));
            first += rows;
            if (src && src->transposed) {
                transpose_2d(data[n], rows, row);
                e[n].shape[0] = row;
                e[n].shape[1] = rows;
            }
            if (src && src->row_offset) {
                int64_t off = src->row_offset;
                float *wide = malloc(sizeof(float) * (size_t)((rows + off) * row));
                for (int64_t i = 0; i < off * row; i++)
                    wide[i] = 7;
                memcpy(wide + off * row, data[n], sizeof(float) * (size_t)(rows * row));
                free(data[n]);
                data[n] = wide;
                e[n].shape[0] = rows + off;
            }
            e[n].data = data[n];
        }
        free(v);
    }
    stof_error err = {0};
    char path[512];
    if (n_shards == 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        CHECK_MSG(safetensors_write(path, e, n, &err) == STOF_OK, "%s", err.msg);
    } else {
        cJSON *index = cJSON_CreateObject(), *map = cJSON_AddObjectToObject(index, "weight_map");
        int per = (n + n_shards - 1) / n_shards;
        for (int s = 0; s < n_shards; s++) {
            char shard[64];
            snprintf(shard, sizeof shard, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
            snprintf(path, sizeof path, "%s/%s", dir, shard);
            int first = s * per, count = first + per > n ? n - first : per;
            CHECK_MSG(safetensors_write(path, e + first, count, &err) == STOF_OK, "%s", err.msg);
            for (int k = first; k < first + count; k++)
                cJSON_AddStringToObject(map, names[k], shard);
        }
        char *text = cJSON_Print(index);
        put(dir, "model.safetensors.index.json", text);
        free(text);
        cJSON_Delete(index);
    }
    for (int k = 0; k < n; k++)
        free(data[k]);
}

/* The Longformer directory's layers attend their own windows; a window that
 * is not a positive even number is an error naming the layer. */
static void check_longformer_masks(void) {
    char dir[256];
    snprintf(dir, sizeof dir, WORK "longformer-tiny");
    const char *params[] = {"batch=1", "seq=16", "dtype=fp32"};
    graph g;
    graph_init(&g);
    stof_error err = {0};
    int rc = lua_api_build_dir(dir, NULL, params, 3, &g, NULL, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    if (rc)
        return;
    int seen = 0;
    for (int i = 0; i < g.n_ops; i++) {
        const graph_op *op = &g.ops[i];
        if (op->kind != OP_ATTENTION)
            continue;
        const mask *m = g.masks[op->attr.attn.mask];
        int band = seen == 0 ? 3 : 2;
        CHECK(mask_get(m, 0, 8, 8 + band) && !mask_get(m, 0, 8, 8 + band + 1) &&
              mask_get(m, 0, 8, 8 - band) && !mask_get(m, 0, 8, 8 - band - 1));
        CHECK(op->attr.attn.padded);
        CHECK(op->attr.attn.global_keys && op->attr.attn.global_qkv);
        seen++;
    }
    CHECK_EQ_INT(seen, 2);
    CHECK(graph_find_tensor(&g, "global_attention_mask") >= 0);
    CHECK(graph_find_tensor(&g, "encoder.layer.1.attention.self.qkv_global.weight") >= 0);
    graph_free(&g);
    /* global=false: no global tokens, no input, no projections */
    const char *local[] = {"batch=1", "seq=16", "dtype=fp32", "global=false"};
    graph_init(&g);
    rc = lua_api_build_dir(dir, NULL, local, 4, &g, NULL, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    for (int i = 0; !rc && i < g.n_ops; i++)
        CHECK(g.ops[i].kind != OP_ATTENTION || !g.ops[i].attr.attn.global_keys);
    CHECK(graph_find_tensor(&g, "global_attention_mask") < 0);
    graph_free(&g);
    char bad[256];
    snprintf(bad, sizeof bad, WORK "longformer-bad");
    fresh_dir(bad);
    put(bad, "config.json", "{\"model_type\": \"longformer\", \"hidden_size\": 64,"
        " \"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"intermediate_size\": 96,"
        " \"vocab_size\": 50, \"type_vocab_size\": 1, \"max_position_embeddings\": 34,"
        " \"pad_token_id\": 1, \"layer_norm_eps\": 1e-5, \"attention_window\": [6, 5]}");
    graph_init(&g);
    CHECK_EQ_INT(lua_api_build_dir(bad, NULL, params, 3, &g, NULL, &err), STOF_ERR_SCRIPT);
    CHECK_CONTAINS(err.msg, "attention_window for layer 1 must be an even integer");
}

/* Every tensor of f read into memory of its own (NULL when f is), for stof_weight or
 * safetensors_entry arrays over them; free_tensors frees them. */
static void **read_tensors(const safetensors_file *f) {
    void **data = f ? calloc((size_t)f->n, sizeof *data) : NULL;
    stof_error err = {0};
    for (int i = 0; data && i < f->n; i++) {
        const safetensors_tensor *t = &f->tensors[i];
        data[i] = malloc((size_t)(t->end - t->begin));
        CHECK_MSG(safetensors_read(f, i, data[i], &err) == STOF_OK, "%s", err.msg);
    }
    return data;
}

static void free_tensors(const safetensors_file *f, void **data) {
    for (int i = 0; data && f && i < f->n; i++)
        free(data[i]);
    free(data);
}

/* The public API opens the directory as the CLI does: the same output from
 * the same inputs (the ones seed 5 gives) and the directory's weights. */
static void check_api_open(const char *dir, const char *const *params, int n_params,
                           const graph *g, const float *want) {
    stof_model *m = NULL;
    int rc = stof_model_open(dir, params, n_params, &m);
    CHECK_MSG(rc == STOF_OK, "%s: %s", dir, stof_last_error());
    if (rc)
        return;
    stof_tensor_ref in[4];
    void *bufs[4] = {0};
    int n = 0;
    for (int t = 0; t < g->n_tensors && n < 4; t++) {
        const graph_tensor *x = &g->tensors[t];
        if (x->role != GRAPH_INPUT)
            continue;
        int64_t numel = graph_tensor_numel(x);
        float *v = malloc(sizeof *v * (size_t)numel);
        weights_fill(x, 5, v);
        if (x->dtype == STOF_I32) {
            int32_t *ids = malloc(sizeof *ids * (size_t)numel);
            for (int64_t i = 0; i < numel; i++)
                ids[i] = (int32_t)v[i];
            free(v);
            bufs[n] = ids;
        } else {
            bufs[n] = v;
        }
        in[n] = (stof_tensor_ref){x->name, bufs[n]};
        n++;
    }
    int64_t numel = graph_tensor_numel(&g->tensors[g->output]);
    float *got = malloc(sizeof *got * (size_t)numel);
    rc = stof_model_run_cpu(m, in, n, got);
    CHECK_MSG(rc == STOF_OK, "%s: %s", dir, stof_last_error());
    CHECK_MSG(rc || memcmp(got, want, sizeof *got * (size_t)numel) == 0,
              "%s: the API's output differs", dir);
    /* the same tensors from memory (as a live framework holds them): the same output */
    safetensors_file *f = NULL;
    stof_error err = {0};
    CHECK_MSG(model_dir_weights_at(dir, &f, &err) == STOF_OK, "%s", err.msg);
    stof_weight *w = f ? calloc((size_t)f->n, sizeof *w) : NULL;
    void **data = read_tensors(f);
    for (int i = 0; w && data && i < f->n; i++) {
        const safetensors_tensor *t = &f->tensors[i];
        w[i] = (stof_weight){t->name, t->dtype_name, t->ndim, {0}, data[i]};
        memcpy(w[i].shape, t->shape, sizeof t->shape[0] * (size_t)t->ndim);
    }
    if (w && data) {
        rc = stof_model_set_weights_memory(m, w, f->n);
        CHECK_MSG(rc == STOF_OK, "%s: %s", dir, stof_last_error());
        memset(got, 0, sizeof *got * (size_t)numel);
        CHECK_MSG(rc || stof_model_run_cpu(m, in, n, got) == STOF_OK, "%s", stof_last_error());
        CHECK_MSG(rc || memcmp(got, want, sizeof *got * (size_t)numel) == 0,
                  "%s: the weights from memory give another output", dir);
        /* one tensor short, one of a dtype stof does not read */
        CHECK_EQ_INT(stof_model_set_weights_memory(m, w, f->n - 1), STOF_ERR_MISMATCH);
        CHECK_CONTAINS(stof_last_error(), "weights in memory");
        w[0].dtype = "F64";
        CHECK_EQ_INT(stof_model_set_weights_memory(m, w, f->n), STOF_ERR_INVALID);
        CHECK_CONTAINS(stof_last_error(), "dtype 'F64'");
    }
    free_tensors(f, data);
    free(w);
    safetensors_close(f);
    free(got);
    for (int k = 0; k < n; k++)
        free(bufs[k]);
    stof_model_free(m);
}

/* The script of config's model_type builds the graph from config.json; the
 * directory's weights (sharded or not, under a prefix) give the same output
 * as the same values seeded. */
static void check_dir_model(const char *name, const char *config, const char *script,
                            const char *prefix, int shards, int n_layers) {
    char dir[256];
    snprintf(dir, sizeof dir, WORK "%s", name);
    fresh_dir(dir);
    put(dir, "config.json", config);
    model_dir md;
    stof_error err = {0};
    put(dir, "model.safetensors", ""); /* found, not read by model_dir_open */
    CHECK_MSG(model_dir_open(dir, &md, &err) == STOF_OK, "%s", err.msg);
    char supported[128];
    const char *s = model_dir_script(&md, supported, sizeof supported);
    CHECK_MSG(s && strcmp(s, script) == 0, "%s: script %s", name, s ? s : supported);
    char path[512];
    snprintf(path, sizeof path, SCRIPTS "%s", script);
    const char *params[] = {"batch=2", "seq=16", "dtype=fp32"};
    graph g;
    graph_init(&g);
    int rc = lua_api_build_config(path, params, 3, md.config, &g, NULL, &err);
    model_dir_free(&md);
    CHECK_MSG(rc == STOF_OK, "%s: %s", name, err.msg);
    if (rc)
        return;
    CHECK_EQ_INT(g.n_layers, n_layers);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    remove(path); /* the placeholder: export_dir writes the weights */
    export_dir(&g, 5, dir, prefix, shards);
    safetensors_file *f = NULL;
    CHECK_MSG(model_dir_weights_at(dir, &f, &err) == STOF_OK, "%s: %s", name, err.msg);
    /* the same seed for the inputs; every weight comes from the file (checked) */
    weights_source seeded = weights_source_seeded(5), from_dir = {.seed = 5, .weights = f};
    CHECK_MSG(f && weights_source_check(&from_dir, &g, &err) == STOF_OK, "%s: %s", name,
              err.msg);
    float *want = test_reference(&g, &seeded, &err);
    float *got = f ? test_reference(&g, &from_dir, &err) : NULL;
    CHECK_MSG(want && got, "%s: %s", name, err.msg);
    int64_t n = graph_tensor_numel(&g.tensors[g.output]);
    int same = want && got;
    for (int64_t i = 0; same && i < n; i++)
        same = want[i] == got[i];
    CHECK_MSG(same, "%s: the directory's weights give another output", name);
    if (got)
        check_api_open(dir, params, 3, &g, got);
    free(want);
    free(got);
    safetensors_close(f);
    graph_free(&g);
}

/* GPT-2's Conv1D weights are stored [in, out] (as transformers writes them, and export_dir
 * does) and read transposed into the graph's [out, in]; the model's weights (its device
 * layout) are [out, in]. A checkpoint that stores one [out, in] (nn.Linear's layout) is
 * refused by name, with the shape expected and the one found. */
static void check_gpt2_layout(void) {
    const char *dir = WORK "gpt2-lm-tiny";
    const char *params[] = {"batch=2", "seq=16", "dtype=fp32"};
    graph gr, *g = &gr;
    graph_init(g);
    stof_error err = {0};
    int rc = lua_api_build_dir(dir, NULL, params, 3, g, NULL, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    stof_model *m = NULL;
    if (!rc)
        rc = stof_model_open(dir, params, 3, &m);
    CHECK_MSG(rc == STOF_OK, "%s", stof_last_error());
    if (rc) {
        graph_free(g);
        return;
    }
    int transposed = 0;
    for (int t = 0; t < g->n_tensors; t++) {
        const graph_source *s = graph_source_of(g, t);
        transposed += s && s->transposed;
    }
    CHECK_EQ_INT(transposed, 8); /* c_attn, attn.c_proj, c_fc, mlp.c_proj of 2 layers */
    for (int i = 0; i < stof_model_num_weights(m); i++) {
        stof_tensor_info info;
        CHECK_EQ_INT(stof_model_weight_info(m, i, &info), STOF_OK);
        if (strcmp(info.name, "h.1.attn.c_attn.weight") == 0)
            CHECK(info.ndim == 2 && info.shape[0] == 192 && info.shape[1] == 64);
    }
    safetensors_file *f = NULL;
    CHECK_MSG(model_dir_weights_at(dir, &f, &err) == STOF_OK, "%s", err.msg);
    weights_source src = {.seed = 5, .weights = f};
    char line[1024];
    weights_source_describe(&src, g, line, sizeof line);
    CHECK_CONTAINS(line, ", 8 transposed");
    /* the same tensors, h.1.attn.c_attn.weight [192, 64] */
    safetensors_entry *e = f ? calloc((size_t)f->n, sizeof *e) : NULL;
    void **data = read_tensors(f);
    for (int i = 0; e && data && i < f->n; i++) {
        const safetensors_tensor *t = &f->tensors[i];
        e[i] = (safetensors_entry){t->name, t->dtype, t->ndim, {0}, data[i]};
        memcpy(e[i].shape, t->shape, sizeof t->shape[0] * (size_t)t->ndim);
        if (strcmp(t->name, "transformer.h.1.attn.c_attn.weight") == 0) {
            e[i].shape[0] = t->shape[1];
            e[i].shape[1] = t->shape[0];
        }
    }
    const char *path = WORK "gpt2-linear-layout.safetensors";
    if (e && data) {
        CHECK_MSG(safetensors_write(path, e, f->n, &err) == STOF_OK, "%s", err.msg);
        CHECK_EQ_INT(stof_model_set_weights(m, path), STOF_ERR_MISMATCH);
        char want[512];
        snprintf(want, sizeof want, "%s: tensor 'transformer.h.1.attn.c_attn.weight' is "
                 "[192, 64], expected [64, 192] (weight 'h.1.attn.c_attn.weight' [192, 64] is "
                 "its transpose)", path);
        CHECK_MSG(strcmp(stof_last_error(), want) == 0, "%s", stof_last_error());
    }
    free_tensors(f, data);
    free(e);
    safetensors_close(f);
    stof_model_free(m);
    graph_free(g);
}

/* The decoders with their language-modelling heads: GPT-2 tied, GPT-Neo's local and global
 * layers (a window of 4 in 16 tokens), Mistral's grouped-query attention with a sliding window
 * of 5 and its own head, Llama tied and dense. */
static void test_dir_decoders(void) {
    check_dir_model("gpt2-lm-tiny",
                    "{\"model_type\": \"gpt2\", \"architectures\": [\"GPT2LMHeadModel\"],"
                    " \"n_embd\": 64, \"n_layer\": 2, \"n_head\": 2, \"vocab_size\": 50,"
                    " \"n_positions\": 32, \"layer_norm_epsilon\": 1e-5}",
                    "gpt2.lua", "transformer.", 1, 2);
    check_gpt2_layout();
    check_dir_model("gpt-neo-tiny",
                    "{\"model_type\": \"gpt_neo\", \"architectures\": [\"GPTNeoForCausalLM\"],"
                    " \"hidden_size\": 64, \"num_layers\": 2, \"num_heads\": 2,"
                    " \"vocab_size\": 50, \"max_position_embeddings\": 32, \"window_size\": 4,"
                    " \"attention_types\": [[[\"global\", \"local\"], 1]],"
                    " \"layer_norm_epsilon\": 1e-5, \"activation_function\": \"gelu_new\"}",
                    "gpt_neo.lua", "transformer.", 1, 2);
    check_dir_model("mistral-tiny",
                    "{\"model_type\": \"mistral\", \"architectures\": [\"MistralForCausalLM\"],"
                    " \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2,"
                    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16,"
                    " \"vocab_size\": 50, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-6,"
                    " \"rope_theta\": 10000.0, \"sliding_window\": 5,"
                    " \"tie_word_embeddings\": false, \"hidden_act\": \"silu\"}",
                    "mistral.lua", "model.", 2, 2);
    check_dir_model("llama-tiny",
                    "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"],"
                    " \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 1,"
                    " \"num_attention_heads\": 4, \"num_key_value_heads\": 1,"
                    " \"vocab_size\": 50, \"max_position_embeddings\": 64,"
                    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500000.0},"
                    " \"tie_word_embeddings\": true}",
                    "mistral.lua", "model.", 1, 1);
}

static void test_dir_models(void) {
    check_dir_model("bert-tiny",
                    "{\"model_type\": \"bert\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
                    " \"num_attention_heads\": 2, \"intermediate_size\": 128, \"vocab_size\": 50,"
                    " \"type_vocab_size\": 2, \"max_position_embeddings\": 32,"
                    " \"layer_norm_eps\": 1e-12, \"hidden_act\": \"gelu\"}",
                    "bert.lua", "bert.", 1, 2);
    /* RoBERTa: the position table's rows from padding_idx + 1, three shards */
    check_dir_model("roberta-tiny",
                    "{\"model_type\": \"roberta\", \"hidden_size\": 64, \"num_hidden_layers\": 1,"
                    " \"num_attention_heads\": 2, \"intermediate_size\": 96, \"vocab_size\": 50,"
                    " \"type_vocab_size\": 1, \"max_position_embeddings\": 34,"
                    " \"pad_token_id\": 1, \"layer_norm_eps\": 1e-5, \"hidden_act\": \"gelu\"}",
                    "bert.lua", "roberta.", 3, 1);
    check_dir_model("distilbert-tiny",
                    "{\"model_type\": \"distilbert\", \"dim\": 64, \"n_layers\": 2, \"n_heads\": 2,"
                    " \"hidden_dim\": 128, \"vocab_size\": 50, \"max_position_embeddings\": 32,"
                    " \"activation\": \"gelu\"}",
                    "distilbert.lua", "distilbert.", 2, 2);
    check_dir_model("gpt2-tiny",
                    "{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_layer\": 3, \"n_head\": 2,"
                    " \"vocab_size\": 50, \"n_positions\": 32, \"layer_norm_epsilon\": 1e-5,"
                    " \"activation_function\": \"gelu_new\"}",
                    "gpt2.lua", "", 1, 3);
    /* ModernBERT: local and global layers, rotary, GeGLU, norms without bias */
    check_dir_model("modernbert-tiny",
                    "{\"model_type\": \"modernbert\", \"hidden_size\": 64,"
                    " \"num_hidden_layers\": 4, \"num_attention_heads\": 2,"
                    " \"intermediate_size\": 96, \"vocab_size\": 50,"
                    " \"max_position_embeddings\": 64, \"norm_eps\": 1e-5, \"norm_bias\": false,"
                    " \"hidden_activation\": \"gelu\", \"global_attn_every_n_layers\": 3,"
                    " \"local_attention\": 8, \"global_rope_theta\": 160000.0,"
                    " \"local_rope_theta\": 10000.0}",
                    "modernbert.lua", "model.", 1, 4);
    /* Longformer: RoBERTa's positions, a window per layer (6 and 4 keys: 3 and 2 each side) */
    check_dir_model("longformer-tiny",
                    "{\"model_type\": \"longformer\", \"hidden_size\": 64,"
                    " \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
                    " \"intermediate_size\": 96, \"vocab_size\": 50, \"type_vocab_size\": 1,"
                    " \"max_position_embeddings\": 34, \"pad_token_id\": 1,"
                    " \"layer_norm_eps\": 1e-5, \"hidden_act\": \"gelu\","
                    " \"attention_window\": [6, 4]}",
                    "bert.lua", "longformer.", 1, 2);
    check_longformer_masks();
    test_dir_decoders();
    /* a model type without a script says which ones have one */
    const char *dir = WORK "falcon";
    fresh_dir(dir);
    put(dir, "config.json", "{\"model_type\": \"falcon\"}");
    put(dir, "model.safetensors", "");
    model_dir md;
    stof_error err = {0};
    CHECK_EQ_INT(model_dir_open(dir, &md, &err), STOF_OK);
    char supported[128];
    CHECK(model_dir_script(&md, supported, sizeof supported) == NULL);
    CHECK(strcmp(supported, "bert, roberta, xlm-roberta, longformer, distilbert, gpt2, "
                            "gpt_neo, mistral, llama, modernbert") == 0);
    model_dir_free(&md);
}

/* A directory of config.json alone opens (its graph needs no weights), and
 * runs only once weights are given or random ones asked for. */
static void test_config_only(void) {
    const char *dir = WORK "config-only";
    fresh_dir(dir);
    put(dir, "config.json",
        "{\"model_type\": \"bert\", \"hidden_size\": 32, \"num_hidden_layers\": 1, "
        "\"num_attention_heads\": 2, \"intermediate_size\": 64, \"vocab_size\": 50, "
        "\"type_vocab_size\": 2, \"max_position_embeddings\": 16, \"layer_norm_eps\": 1e-12}");
    const char *params[] = {"batch=1", "seq=8", "dtype=fp32"};
    stof_model *m = NULL;
    int rc = stof_model_open(dir, params, 3, &m);
    CHECK_MSG(rc == STOF_OK, "%s", stof_last_error());
    if (rc)
        return;
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    stof_tensor_ref in[] = {{"input_ids", ids}};
    stof_tensor_info out;
    stof_model_output_info(m, &out);
    float *y = malloc(sizeof *y * (size_t)(out.shape[0] * out.shape[1] * out.shape[2]));
    CHECK_EQ_INT(stof_model_run_cpu(m, in, 1, y), STOF_ERR_INVALID);
    CHECK_CONTAINS(stof_last_error(), "has no model.safetensors or "
                                      "model.safetensors.index.json: give the weights");
    stof_model_set_seed(m, 3); /* random weights, asked for */
    CHECK_MSG(stof_model_run_cpu(m, in, 1, y) == STOF_OK, "%s", stof_last_error());
    free(y);
    stof_model_free(m);
}

int main(void) {
    test_single_file();
    test_shards();
    test_errors();
    test_dir_models();
    test_config_only();
    return check_summary("test_model_dir");
}
