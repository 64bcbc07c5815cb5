/* A Hugging Face model directory to a graph: its config.json picks the
 * shipped script for its model_type (or the caller's script runs instead),
 * and goes to the script as stof.config. The CLI and the C API both open
 * directories through here. */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/base/error.h"
#include "core/base/file.h"
#include "core/io/model_dir.h"
#include "core/lua/lua_api.h"

#ifndef STOF_SCRIPTS_INSTALL_DIR
#define STOF_SCRIPTS_INSTALL_DIR "/usr/local/share/stof/scripts"
#endif
#ifndef STOF_SCRIPTS_SOURCE_DIR
#define STOF_SCRIPTS_SOURCE_DIR "scripts"
#endif

/* dir/../share/stof/scripts for the folder of `file` (a program or a
 * library), "" when it has none. */
static void scripts_beside(const char *file, char *out, size_t cap) {
    out[0] = '\0';
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", file);
    char *slash = strrchr(copy, '/');
    if (!slash)
        return;
    *slash = '\0';
    snprintf(out, cap, "%s/../share/stof/scripts", copy);
}

int lua_api_find_script(const char *name, char *out, size_t cap, stof_error *err) {
    const char *env = getenv("STOF_SCRIPTS_DIR");
    /* installed, the scripts sit at ../share/stof/scripts from bin/ and from
     * lib/, wherever the prefix was moved */
    char exe[1024], beside_exe[1100] = "", beside_lib[1100] = "";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        scripts_beside(exe, beside_exe, sizeof beside_exe);
    }
    Dl_info di;
    if (dladdr((void *)lua_api_find_script, &di) && di.dli_fname)
        scripts_beside(di.dli_fname, beside_lib, sizeof beside_lib);
    const char *dirs[] = {env && env[0] ? env : NULL, beside_exe[0] ? beside_exe : NULL,
                          beside_lib[0] ? beside_lib : NULL, STOF_SCRIPTS_INSTALL_DIR,
                          STOF_SCRIPTS_SOURCE_DIR};
    for (size_t k = 0; k < sizeof dirs / sizeof dirs[0]; k++) {
        if (!dirs[k])
            continue;
        snprintf(out, cap, "%s/%s", dirs[k], name);
        if (file_exists(out))
            return STOF_OK;
    }
    return err_set(err, STOF_ERR_IO, "the script %s is in none of $STOF_SCRIPTS_DIR, "
                   "%s, %s", name, STOF_SCRIPTS_INSTALL_DIR, STOF_SCRIPTS_SOURCE_DIR);
}

int lua_api_build_dir(const char *dir, const char *script, const char *const *params,
                      int n_params, graph *g, graph_script *info, stof_error *err) {
    graph_script own;
    info = info ? info : &own;
    if (strlen(dir) >= sizeof info->model_dir) /* recorded whole, or not at all */
        return err_set(err, STOF_ERR_INVALID, "the model directory's path is more than %zu "
                       "characters", sizeof info->model_dir - 1);
    model_dir md;
    int rc = model_dir_open_config(dir, &md, err); /* the graph needs no weights */
    if (rc)
        return rc;
    char path[2048], supported[256];
    const char *name = script ? script : model_dir_script(&md, supported, sizeof supported);
    if (!name)
        rc = err_set(err, STOF_ERR_UNSUPPORTED, "%s: model_type '%s' is not one stof has a "
                     "script for (it has: %s); write one (docs/lua-api.md) and give it as the "
                     "script", dir, md.model_type, supported);
    else if (script)
        snprintf(path, sizeof path, "%s", script);
    else
        rc = lua_api_find_script(name, path, sizeof path, err);
    if (!rc) {
        rc = lua_api_build_config(path, params, n_params, md.config, g, info, err);
        if (rc) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err->msg);
            err_set(err, rc, "%.900s (the script for %.200s)", msg, dir);
        }
    }
    if (!rc)
        snprintf(info->model_dir, sizeof info->model_dir, "%s", dir);
    model_dir_free(&md);
    return rc;
}

/* Whether "key=value" text kv sets key. */
static int sets_key(const char *kv, const char *key) {
    size_t n = strlen(key);
    return strncmp(kv, key, n) == 0 && kv[n] == '=';
}

int lua_api_rebuild(const graph_script *info, const char *const *set, int n_set, graph *g,
                    graph_script *out_info, stof_error *err) {
    enum { TEXT = sizeof info->params[0].key + sizeof info->params[0].value + 2 };
    const char *params[2 * GRAPH_SCRIPT_MAX_PARAMS];
    int n = 0;
    char (*own)[TEXT] = calloc(GRAPH_SCRIPT_MAX_PARAMS, sizeof *own);
    if (!own)
        return err_set(err, STOF_ERR_NOMEM, "out of host memory");
    for (int k = 0; k < info->n_params && k < GRAPH_SCRIPT_MAX_PARAMS; k++) {
        int replaced = 0;
        for (int j = 0; j < n_set && !replaced; j++)
            replaced = sets_key(set[j], info->params[k].key);
        if (replaced)
            continue;
        snprintf(own[k], sizeof own[k], "%s=%s", info->params[k].key, info->params[k].value);
        params[n++] = own[k];
    }
    for (int j = 0; j < n_set && n < 2 * GRAPH_SCRIPT_MAX_PARAMS; j++)
        params[n++] = set[j];
    int rc = info->model_dir[0]
                 ? lua_api_build_dir(info->model_dir, info->path, params, n, g, out_info, err)
                 : lua_api_build(info->path, params, n, g, out_info, err);
    free(own);
    return rc;
}

int lua_api_rebuild_at(const graph_script *info, int batch, int seq, graph *g, stof_error *err) {
    char b[32], s[32];
    snprintf(b, sizeof b, "batch=%d", batch);
    snprintf(s, sizeof s, "seq=%d", seq);
    const char *set[] = {b, s};
    graph_init(g);
    return lua_api_rebuild(info, set, 2, g, NULL, err);
}
