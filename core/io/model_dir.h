/* Hugging Face model directories: config.json and the safetensors weights,
 * in one file (model.safetensors) or in shards listed by
 * model.safetensors.index.json.
 *
 * Only the host reads files: the config is parsed here and handed to the
 * model's Lua script as a table (core/lua), which stays sandboxed. Every
 * error names the file and what was expected. */
#ifndef STOF_CORE_MODEL_DIR_H
#define STOF_CORE_MODEL_DIR_H

#include <stdint.h>

#include "stof.h"

struct cJSON;
struct safetensors_file;

#define MODEL_DIR_CONFIG "config.json"
#define MODEL_DIR_WEIGHTS "model.safetensors"
#define MODEL_DIR_INDEX "model.safetensors.index.json"

typedef struct model_dir {
    char *path;              /* the directory, as given */
    struct cJSON *config;    /* config.json, a JSON object */
    char model_type[64];     /* its "model_type" */
    char architecture[128];  /* its "architectures"[0], "" when absent */
    char *weights_label;     /* model.safetensors, or the index file, with the folder */
    int sharded;             /* 1: the weights are shards listed by the index */
    int n_shards;            /* weight files: 1 without an index */
    char **shards;           /* their paths */
} model_dir;

/* 1 when path is a directory holding config.json. */
int model_dir_detect(const char *path);

/* Reads path/config.json (an object with a string "model_type") and finds
 * the weights: model.safetensors, else the shards of
 * model.safetensors.index.json (its "weight_map" of tensor name -> shard
 * file; shard names are plain file names in the folder, and each exists).
 * STOF_ERR_IO for what cannot be read, STOF_ERR_FORMAT for what is
 * malformed, STOF_ERR_INVALID for a folder that is not a model directory.
 * On failure md holds nothing. */
int model_dir_open(const char *path, model_dir *md, stof_error *err);
/* The same without requiring weights: a folder of config.json alone opens
 * too (n_shards 0), for building the model's graph, or for weights given
 * another way (a live framework's tensors). */
int model_dir_open_config(const char *path, model_dir *md, stof_error *err);
void model_dir_free(model_dir *md);
/* 1 when the folder holds weights stof reads (model.safetensors, or the
 * index of shards). */
int model_dir_has_weights(const char *path);

/* Opens the weights (one file, or the shards as one) and checks the index's
 * weight_map against them: every name it lists is in the shard it names. */
int model_dir_open_weights(const model_dir *md, struct safetensors_file **out,
                           stof_error *err);

/* The config's eos_token_id (a number or a list of them) into out (at most cap); the count,
 * 0 when it has none. */
int model_dir_eos_tokens(const model_dir *md, int32_t *out, int cap);

/* The shipped script that builds md's architecture (by model_type), or
 * NULL with the supported model types in supported ("bert, roberta, ..."). */
const char *model_dir_script(const model_dir *md, char *supported, size_t cap);

/* Opens the weights of the model directory at path (model_dir_open, then
 * model_dir_open_weights). */
int model_dir_weights_at(const char *path, struct safetensors_file **out, stof_error *err);

#endif
