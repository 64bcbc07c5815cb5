/* Fuzz target: the reader of Hugging Face model directories
 * (core/io/model_dir.c), given any bytes as config.json. It opens, or the
 * error names the folder or its config.json; an open directory has a model
 * type and its weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/io/model_dir.h"
#include "fuzz.h"

const char *const fuzz_seeds[] = {
    "{\"model_type\": \"bert\", \"architectures\": [\"BertModel\"], \"hidden_size\": 768,"
    " \"num_hidden_layers\": 12, \"num_attention_heads\": 12, \"intermediate_size\": 3072,"
    " \"layer_norm_eps\": 1e-12, \"hidden_act\": \"gelu\", \"vocab_size\": 30522}",
    "{\"model_type\": \"modernbert\", \"global_attn_every_n_layers\": 3, \"local_attention\": 128,"
    " \"global_rope_theta\": 160000.0, \"local_rope_theta\": 10000.0, \"norm_bias\": false}",
    "{\"model_type\": \"longformer\", \"attention_window\": [512, 512, 512]}",
    NULL};

const char *const fuzz_words[] = {"\"model_type\"", "\"architectures\"", "[", "]", "{", "}",
                                  ",", ":", "\"\"", "null", "true", "1e308", "-0", "\"\\u0000\"",
                                  NULL};

size_t fuzz_seed_bytes(int k, uint8_t *buf, size_t cap) {
    (void)k, (void)buf, (void)cap;
    return 0;
}

static char dir[64];

/* A folder with a weights file (not read by model_dir_open) and the bytes
 * as config.json. */
static int make_dir(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/stof-fuzz-dir-%ld", (long)getpid());
        mkdir(dir, 0755);
        char w[128];
        snprintf(w, sizeof w, "%s/model.safetensors", dir);
        FILE *f = fopen(w, "wb");
        if (f)
            fclose(f);
    }
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    return 1;
}

int fuzz_one(const uint8_t *data, size_t size) {
    if (!make_dir(data, size))
        return 0;
    model_dir md;
    stof_error err = {0};
    if (model_dir_open(dir, &md, &err) != STOF_OK) {
        if (!strstr(err.msg, dir)) {
            fprintf(stderr, "fuzz_config: an error that names neither the folder nor its "
                            "config: %s\n", err.msg);
            return 1;
        }
        return 0;
    }
    int bad = !md.model_type[0] || md.n_shards != 1;
    if (bad)
        fprintf(stderr, "fuzz_config: opened without a model type or weights\n");
    model_dir_free(&md);
    return bad;
}
