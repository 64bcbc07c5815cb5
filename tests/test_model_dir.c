/* Hugging Face model directories (core/io/model_dir.h): config.json read,
 * weights found in one file or in shards, and every way a folder can be
 * wrong said with the file and what was expected. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "core/io/model_dir.h"
#include "core/io/safetensors.h"

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

int main(void) {
    test_single_file();
    test_shards();
    test_errors();
    return check_summary("test_model_dir");
}
