/* Hugging Face model directories (model_dir.h). */
#include "core/io/model_dir.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/base/error.h"
#include "core/base/file.h"
#include "core/io/safetensors.h"

/* "DIR/name", malloc'd. */
static char *dir_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + 1 + strlen(name) + 1;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

int model_dir_detect(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return 0;
    char *config = dir_join(path, MODEL_DIR_CONFIG);
    int found = config && file_exists(config);
    free(config);
    return found;
}

/* The JSON object in file `path` (what: for messages) into *out. */
static int read_json_object(const char *path, const char *what, cJSON **out, stof_error *err) {
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = file_read(path, what, FILE_LIMIT_PLAN, &text, &len, err);
    if (rc)
        return rc;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    size_t at = end && end >= text ? (size_t)(end - text) : 0;
    free(text);
    if (!root)
        return err_set(err, STOF_ERR_FORMAT, "%s: not valid JSON (near byte %zu of %zu)", path,
                       at, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return err_set(err, STOF_ERR_FORMAT, "%s: expected a JSON object", path);
    }
    *out = root;
    return STOF_OK;
}

/* model_type and architectures[0] of the config. */
static int read_identity(model_dir *md, const char *config_path, stof_error *err) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(md->config, "model_type");
    if (!cJSON_IsString(type) || !type->valuestring[0])
        return err_set(err, STOF_ERR_FORMAT, "%s: \"model_type\" must be a non-empty string "
                       "(it names the architecture: \"bert\", \"gpt2\"...)", config_path);
    if (strlen(type->valuestring) >= sizeof md->model_type)
        return err_set(err, STOF_ERR_FORMAT, "%s: \"model_type\" is %zu characters long",
                       config_path, strlen(type->valuestring));
    snprintf(md->model_type, sizeof md->model_type, "%s", type->valuestring);
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(md->config, "architectures");
    if (arch && !cJSON_IsArray(arch))
        return err_set(err, STOF_ERR_FORMAT, "%s: \"architectures\" must be a list of names",
                       config_path);
    const cJSON *first = arch ? arch->child : NULL;
    if (first && !cJSON_IsString(first))
        return err_set(err, STOF_ERR_FORMAT, "%s: \"architectures\" must be a list of names",
                       config_path);
    snprintf(md->architecture, sizeof md->architecture, "%s", first ? first->valuestring : "");
    return STOF_OK;
}

/* A shard's name from the index: a plain file name of this folder. */
static int shard_name_ok(const char *name) {
    return name[0] && name[0] != '.' && !strchr(name, '/') && strlen(name) < 256;
}

/* Adds shard `name` to md unless it is there already. */
static int add_shard(model_dir *md, const char *index_path, const char *name, stof_error *err) {
    if (!shard_name_ok(name))
        return err_set(err, STOF_ERR_FORMAT, "%s: shard '%s' is not a file name of this folder",
                       index_path, name);
    char *path = dir_join(md->path, name);
    if (!path)
        return err_set(err, STOF_ERR_NOMEM, "out of host memory");
    for (int k = 0; k < md->n_shards; k++)
        if (strcmp(md->shards[k], path) == 0) {
            free(path);
            return STOF_OK;
        }
    char **grown = realloc(md->shards, sizeof *grown * (size_t)(md->n_shards + 1));
    if (!grown) {
        free(path);
        return err_set(err, STOF_ERR_NOMEM, "out of host memory");
    }
    md->shards = grown;
    md->shards[md->n_shards++] = path;
    if (!file_exists(path))
        return err_set(err, STOF_ERR_IO, "%s: shard %s is missing", index_path, path);
    return STOF_OK;
}

/* The shards the index's weight_map names, in order of first mention. */
static int read_index(model_dir *md, const char *index_path, stof_error *err) {
    cJSON *index = NULL;
    int rc = read_json_object(index_path, "safetensors index", &index, err);
    if (rc)
        return rc;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
    if (!cJSON_IsObject(map) || !map->child)
        rc = err_set(err, STOF_ERR_FORMAT, "%s: \"weight_map\" must be an object of tensor name "
                     "-> shard file", index_path);
    for (const cJSON *e = rc ? NULL : map->child; e && !rc; e = e->next)
        rc = cJSON_IsString(e) ? add_shard(md, index_path, e->valuestring, err)
                               : err_set(err, STOF_ERR_FORMAT, "%s: weight_map['%s'] must be "
                                         "a shard's file name", index_path, e->string);
    cJSON_Delete(index);
    return rc;
}

/* model.safetensors, else the index; a folder of .bin checkpoints is told
 * what stof reads. */
static int find_weights(model_dir *md, stof_error *err) {
    char *single = dir_join(md->path, MODEL_DIR_WEIGHTS);
    char *index = dir_join(md->path, MODEL_DIR_INDEX);
    char *bin = dir_join(md->path, "pytorch_model.bin");
    int rc = STOF_OK;
    if (!single || !index || !bin) {
        rc = err_set(err, STOF_ERR_NOMEM, "out of host memory");
    } else if (file_exists(single)) {
        md->weights_label = single;
        single = NULL;
        md->shards = malloc(sizeof *md->shards);
        if (!md->shards || !(md->shards[0] = strdup(md->weights_label)))
            rc = err_set(err, STOF_ERR_NOMEM, "out of host memory");
        else
            md->n_shards = 1;
    } else if (file_exists(index)) {
        md->weights_label = index;
        md->sharded = 1;
        index = NULL;
        rc = read_index(md, md->weights_label, err);
    } else {
        rc = err_set(err, STOF_ERR_IO, "%s has no %s or %s%s", md->path, MODEL_DIR_WEIGHTS,
                     MODEL_DIR_INDEX, file_exists(bin) ? " (stof reads safetensors "
                     "checkpoints, not pytorch_model.bin: save the model with "
                     "safe_serialization=True)" : "");
    }
    free(single);
    free(index);
    free(bin);
    return rc;
}

int model_dir_has_weights(const char *path) {
    char *single = dir_join(path, MODEL_DIR_WEIGHTS), *index = dir_join(path, MODEL_DIR_INDEX);
    int yes = (single && file_exists(single)) || (index && file_exists(index));
    free(single);
    free(index);
    return yes;
}

static int open_dir(const char *path, model_dir *md, int need_weights, stof_error *err);

int model_dir_open(const char *path, model_dir *md, stof_error *err) {
    return open_dir(path, md, 1, err);
}

int model_dir_open_config(const char *path, model_dir *md, stof_error *err) {
    return open_dir(path, md, 0, err);
}

static int open_dir(const char *path, model_dir *md, int need_weights, stof_error *err) {
    memset(md, 0, sizeof *md);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return err_set(err, STOF_ERR_INVALID, "%s is not a model directory (a folder with "
                       "config.json and safetensors weights)", path);
    char *config = dir_join(path, MODEL_DIR_CONFIG);
    if (!(md->path = strdup(path)) || !config) {
        free(config);
        model_dir_free(md);
        return err_set(err, STOF_ERR_NOMEM, "out of host memory");
    }
    int rc = file_exists(config) ? STOF_OK
                                 : err_set(err, STOF_ERR_INVALID, "%s has no config.json: not a "
                                           "Hugging Face model directory", path);
    if (!rc)
        rc = read_json_object(config, "model config", &md->config, err);
    if (!rc)
        rc = read_identity(md, config, err);
    if (!rc && (need_weights || model_dir_has_weights(path)))
        rc = find_weights(md, err);
    free(config);
    if (rc)
        model_dir_free(md);
    return rc;
}

void model_dir_free(model_dir *md) {
    cJSON_Delete(md->config);
    for (int k = 0; k < md->n_shards; k++)
        free(md->shards[k]);
    free(md->shards);
    free(md->weights_label);
    free(md->path);
    memset(md, 0, sizeof *md);
}

/* Every name of the index's weight_map is in the shard it names. */
static int check_weight_map(const model_dir *md, const safetensors_file *f, stof_error *err) {
    cJSON *index = NULL;
    int rc = read_json_object(md->weights_label, "safetensors index", &index, err);
    const cJSON *map = rc ? NULL : cJSON_GetObjectItemCaseSensitive(index, "weight_map");
    if (!rc && !cJSON_IsObject(map)) /* read again: it may have changed since */
        rc = err_set(err, STOF_ERR_FORMAT, "%s: \"weight_map\" must be an object of tensor name "
                     "-> shard file", md->weights_label);
    for (const cJSON *e = map ? map->child : NULL; e && !rc; e = e->next) {
        if (!cJSON_IsString(e)) {
            rc = err_set(err, STOF_ERR_FORMAT, "%s: weight_map['%s'] must be a shard's file name",
                         md->weights_label, e->string);
            break;
        }
        int i = -1;
        for (int lo = 0, hi = f->n - 1; lo <= hi && i < 0;) {
            int mid = lo + (hi - lo) / 2, c = strcmp(f->tensors[mid].name, e->string);
            if (c == 0)
                i = mid;
            else if (c < 0)
                lo = mid + 1;
            else
                hi = mid - 1;
        }
        const char *shard = i >= 0 ? strrchr(safetensors_tensor_path(f, i), '/') : NULL;
        if (i < 0 || strcmp(shard ? shard + 1 : "", e->valuestring) != 0)
            rc = err_set(err, STOF_ERR_FORMAT, "%s: the index puts '%s' in %s, which does not "
                         "hold it", md->weights_label, e->string, e->valuestring);
    }
    cJSON_Delete(index);
    return rc;
}

int model_dir_open_weights(const model_dir *md, safetensors_file **out, stof_error *err) {
    *out = NULL;
    if (!md->sharded)
        return safetensors_open(md->weights_label, out, err);
    int rc = safetensors_open_shards(md->weights_label, (const char *const *)md->shards,
                                     md->n_shards, out, err);
    if (!rc && (rc = check_weight_map(md, *out, err))) {
        safetensors_close(*out);
        *out = NULL;
    }
    return rc;
}

static int eos_value(const cJSON *v, int32_t *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > INT32_MAX ||
        v->valuedouble != (double)(int32_t)v->valuedouble)
        return 0;
    *out = (int32_t)v->valuedouble;
    return 1;
}

int model_dir_eos_tokens(const model_dir *md, int32_t *out, int cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(md->config, "eos_token_id");
    if (!cJSON_IsArray(v))
        return cap > 0 && eos_value(v, out);
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (n < cap && eos_value(e, &out[n]))
            n++;
    }
    return n;
}

/* model_type -> the script that builds it (scripts/). */
static const struct {
    const char *model_type, *script;
} model_scripts[] = {
    {"bert", "bert.lua"},
    {"roberta", "bert.lua"},
    {"xlm-roberta", "bert.lua"},
    {"longformer", "bert.lua"},
    {"distilbert", "distilbert.lua"},
    {"gpt2", "gpt2.lua"},
    {"gpt_neo", "gpt_neo.lua"},
    {"mistral", "mistral.lua"},
    {"llama", "mistral.lua"},
    {"modernbert", "modernbert.lua"},
};

const char *model_dir_script(const model_dir *md, char *supported, size_t cap) {
    size_t used = 0;
    supported[0] = '\0';
    for (size_t k = 0; k < sizeof model_scripts / sizeof model_scripts[0]; k++) {
        if (strcmp(md->model_type, model_scripts[k].model_type) == 0)
            return model_scripts[k].script;
        if (used < cap)
            used += (size_t)snprintf(supported + used, cap - used, "%s%s", k ? ", " : "",
                                     model_scripts[k].model_type);
    }
    return NULL;
}

int model_dir_weights_at(const char *path, safetensors_file **out, stof_error *err) {
    model_dir md;
    int rc = model_dir_open(path, &md, err);
    if (!rc) {
        rc = model_dir_open_weights(&md, out, err);
        model_dir_free(&md);
    }
    return rc;
}
