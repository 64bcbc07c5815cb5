/* Running a model script: the Lua state's life, the `stof` table, script
 * parameters (stof.params) and turning whatever went wrong into one message.
 *
 * Everything that can raise a Lua error runs inside one protected call
 * (lua_api_main), so setup failures, script errors and budget overruns all
 * come back through the same path; lua_close then frees every object the
 * script made, masks included (their __gc). */
#include "core/lua/lua_api.h"

#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/file.h"
#include "core/base/util.h"

typedef struct luaapi_source {
    const char *text;
    size_t len;
} luaapi_source;

/* ---- stof.params ---------------------------------------------------------- */

static int luaapi_cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Copies the defaults (table at 1) into a new table (pushed at 2), checking
 * their types, and lists their keys sorted (pointers into the defaults
 * table's strings, alive while it is on the stack). */
static int luaapi_params_defaults(lua_State *L, const char **keys) {
    int n = 0;
    lua_newtable(L);
    lua_pushnil(L);
    while (lua_next(L, 1)) {
        if (lua_type(L, -2) != LUA_TSTRING)
            luaL_error(L, "stof.params: parameter names must be strings, got a %s",
                       luaL_typename(L, -2));
        const char *key = lua_tostring(L, -2);
        int t = lua_type(L, -1);
        if (t != LUA_TNUMBER && t != LUA_TBOOLEAN && t != LUA_TSTRING)
            luaL_error(L, "stof.params: the default of '%s' must be a number, boolean or "
                          "string, got a %s", key, luaL_typename(L, -1));
        if (n == GRAPH_SCRIPT_MAX_PARAMS)
            luaL_error(L, "stof.params: at most %d parameters", GRAPH_SCRIPT_MAX_PARAMS);
        if (strlen(key) >= sizeof ((graph_script_param *)0)->key)
            luaL_error(L, "stof.params: the name '%s' is too long", key);
        keys[n++] = key;
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_rawset(L, 2);
    }
    qsort(keys, (size_t)n, sizeof *keys, luaapi_cmp_str);
    return n;
}

static void luaapi_push_accepted(lua_State *L, const char **keys, int n) {
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int k = 0; k < n; k++) {
        luaL_addstring(&b, k ? ", " : "");
        luaL_addstring(&b, keys[k]);
    }
    if (n == 0)
        luaL_addstring(&b, "(none)");
    luaL_pushresult(&b);
}

/* Pushes value converted to the type of the default at the top of the
 * stack (which it replaces). */
static void luaapi_param_convert(lua_State *L, const char *key, const char *value) {
    int t = lua_type(L, -1);
    if (t == LUA_TSTRING) {
        lua_pop(L, 1);
        lua_pushstring(L, value);
    } else if (t == LUA_TBOOLEAN) {
        lua_pop(L, 1);
        if (strcmp(value, "true") != 0 && strcmp(value, "false") != 0)
            luaL_error(L, "parameter %s=%s: expected true or false", key, value);
        lua_pushboolean(L, value[0] == 't');
    } else {
        int want_int = lua_isinteger(L, -1);
        lua_pop(L, 1);
        if (lua_stringtonumber(L, value) == 0)
            luaL_error(L, "parameter %s=%s: expected a number", key, value);
        if (want_int) {
            int ok;
            lua_Integer v = lua_tointegerx(L, -1, &ok);
            if (!ok)
                luaL_error(L, "parameter %s=%s: expected an integer", key, value);
            lua_pop(L, 1);
            lua_pushinteger(L, v);
        }
    }
}

/* Applies the command line's key=value to the table at 2. */
static void luaapi_params_apply(lua_State *L, luaapi_ctx *c, const char **keys, int n) {
    for (int i = 0; i < c->n_params; i++) {
        const char *p = c->params[i] ? c->params[i] : "";
        const char *eq = strchr(p, '=');
        if (!eq || eq == p || (size_t)(eq - p) >= sizeof ((graph_script_param *)0)->key)
            luaL_error(L, "parameter '%s' is not key=value", p);
        char key[sizeof ((graph_script_param *)0)->key];
        memcpy(key, p, (size_t)(eq - p));
        key[eq - p] = '\0';
        if (lua_getfield(L, 1, key) == LUA_TNIL) {
            luaapi_push_accepted(L, keys, n);
            luaL_error(L, "unknown parameter '%s' (--set %s); %s accepts: %s", key, p,
                       c->chunkname, lua_tostring(L, -1));
        }
        luaapi_param_convert(L, key, eq + 1);
        lua_setfield(L, 2, key);
    }
}

/* Writes the resolved parameters (sorted by key) into info. */
static void luaapi_params_record(lua_State *L, luaapi_ctx *c, const char **keys, int n) {
    if (!c->info)
        return;
    for (int k = 0; k < n; k++) {
        graph_script_param *p = &c->info->params[k];
        lua_getfield(L, 2, keys[k]);
        size_t len;
        const char *v = luaL_tolstring(L, -1, &len);
        if (len >= sizeof p->value)
            luaL_error(L, "parameter %s: the value is longer than %d characters", keys[k],
                       (int)sizeof p->value - 1);
        snprintf(p->key, sizeof p->key, "%s", keys[k]);
        memcpy(p->value, v, len + 1);
        lua_pop(L, 2);
    }
    c->info->n_params = n;
}

/* stof.params{key = default, ...}: the defaults overridden by --set. */
static int luaapi_params(lua_State *L) {
    luaapi_ctx *c = luaapi_ctx_of(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    if (c->params_done)
        return luaL_error(L, "stof.params may be called only once");
    c->params_done = 1;
    const char *keys[GRAPH_SCRIPT_MAX_PARAMS];
    int n = luaapi_params_defaults(L, keys);
    luaapi_params_apply(L, c, keys, n);
    luaapi_params_record(L, c, keys, n);
    return 1;
}

/* ---- the stof table and the run ------------------------------------------- */

static void luaapi_open_stof(lua_State *L) {
    lua_newtable(L);
    lua_pushcfunction(L, luaapi_params);
    lua_setfield(L, -2, "params");
    lua_pushcfunction(L, luaapi_model_new);
    lua_setfield(L, -2, "model");
    luaapi_open_mask(L);
    lua_setfield(L, -2, "mask");
    lua_pushstring(L, STOF_VERSION_STRING);
    lua_setfield(L, -2, "version");
    const luaapi_ctx *c = luaapi_ctx_of(L);
    if (c->config) {
        luaapi_push_json(L, c->config);
        lua_setfield(L, -2, "config");
    }
    lua_setglobal(L, "stof");
}

/* The checks once the script has returned (its result at the top). */
static void luaapi_finish(lua_State *L, luaapi_ctx *c) {
    if (!luaapi_is_model(L, -1)) {
        lua_pushfstring(L, "%s: the script must return the model made by stof.model{...}",
                        c->chunkname);
        lua_error(L);
    }
    if (!c->params_done && c->n_params > 0) {
        lua_pushfstring(L, "%s: parameter '%s' given, but the script declares none "
                           "(it calls no stof.params)", c->chunkname, c->params[0]);
        lua_error(L);
    }
    stof_error e;
    if (graph_validate(c->g, &e) != STOF_OK) {
        lua_pushfstring(L, "%s: %s", c->chunkname, e.msg);
        lua_error(L);
    }
    c->frozen = 1;
}

/* The protected body of a run: argument 1 is the luaapi_source. */
static int luaapi_main(lua_State *L) {
    const luaapi_source *src = lua_touserdata(L, 1);
    luaapi_ctx *c = luaapi_ctx_of(L);
    luaapi_open_sandbox(L);
    luaapi_open_stof(L);
    char chunk[sizeof c->chunkname + 1];
    snprintf(chunk, sizeof chunk, "@%s", c->chunkname);
    if (luaL_loadbufferx(L, src->text, src->len, chunk, "t") != LUA_OK)
        return lua_error(L);
    lua_call(L, 0, 1);
    luaapi_finish(L, c);
    return 0;
}

/* The message for a failed run (the error object at the top). */
static void luaapi_report(lua_State *L, const luaapi_ctx *c, int status, stof_error *err) {
    const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    if (c->fatal == LUAAPI_FATAL_MEMORY && c->fatal_msg[0])
        err_set(err, STOF_ERR_SCRIPT, "%s", c->fatal_msg);
    else if (status == LUA_ERRMEM || c->fatal == LUAAPI_FATAL_MEMORY)
        err_set(err, STOF_ERR_SCRIPT, "%s: the script ran out of memory (it may use %zu MiB)",
                c->chunkname, c->mem_limit >> 20);
    else if (c->fatal == LUAAPI_FATAL_TIME && !(msg && strstr(msg, "ran too long")))
        err_set(err, STOF_ERR_SCRIPT, "%s", c->fatal_msg);
    else if (msg)
        err_set(err, STOF_ERR_SCRIPT, "%s", msg);
    else
        err_set(err, STOF_ERR_SCRIPT, "%s: the script raised an error that is a %s, not a message",
                c->chunkname, luaL_typename(L, -1));
}

static void luaapi_ctx_init(luaapi_ctx *c, const char *chunkname, const char *script_dir,
                            const char *search_dir, const lua_api_limits *limits) {
    memset(c, 0, sizeof *c);
    snprintf(c->chunkname, sizeof c->chunkname, "%s", chunkname ? chunkname : "script.lua");
    snprintf(c->script_dir, sizeof c->script_dir, "%s", script_dir ? script_dir : "");
    snprintf(c->search_dir, sizeof c->search_dir, "%s", search_dir ? search_dir : "");
    c->instructions = limits && limits->instructions ? limits->instructions
                                                     : LUA_API_DEFAULT_INSTRUCTIONS;
    c->mem_limit = limits && limits->memory ? limits->memory : LUA_API_DEFAULT_MEMORY;
}

static int luaapi_run(luaapi_ctx *c, const luaapi_source *src, graph *g, stof_error *err) {
    c->g = g;
    lua_State *L = lua_newstate(luaapi_alloc, c);
    if (!L) {
        graph_free(g);
        return err_set(err, STOF_ERR_NOMEM, "%s: cannot create a Lua state", c->chunkname);
    }
    c->main = L;
    lua_pushcfunction(L, luaapi_where_msgh);
    lua_pushcfunction(L, luaapi_main);
    lua_pushlightuserdata(L, (void *)src);
    int status = lua_pcall(L, 1, 0, 1);
    if (status != LUA_OK)
        luaapi_report(L, c, status, err);
    lua_close(L);
    if (status != LUA_OK) {
        graph_free(g);
        return STOF_ERR_SCRIPT;
    }
    return STOF_OK;
}

static void luaapi_info_init(graph_script *info, const char *path, const char *name,
                             const char *text, size_t len) {
    if (!info)
        return;
    memset(info, 0, sizeof *info);
    snprintf(info->path, sizeof info->path, "%s", path ? path : "");
    snprintf(info->name, sizeof info->name, "%s", name);
    info->content_hash = util_hash(UTIL_HASH_SEED, text, len);
}

int lua_api_build_string_limits(const char *source, const char *chunkname,
                                const char *search_dir, const char *const *params,
                                int n_params, const lua_api_limits *limits, graph *g,
                                graph_script *info, stof_error *err) {
    if (!source || !g || n_params < 0 || (n_params > 0 && !params))
        return err_set(err, STOF_ERR_INVALID, "lua_api_build_string: bad arguments");
    luaapi_ctx *c = malloc(sizeof *c);
    if (!c)
        return err_set(err, STOF_ERR_NOMEM, "out of host memory (Lua context)");
    luaapi_ctx_init(c, chunkname, NULL, search_dir, limits);
    c->params = params;
    c->n_params = n_params;
    c->info = info;
    luaapi_source src = {source, strlen(source)};
    luaapi_info_init(info, "", c->chunkname, src.text, src.len);
    int rc = luaapi_run(c, &src, g, err);
    free(c);
    return rc;
}

int lua_api_build_string(const char *source, const char *chunkname, const char *search_dir,
                         const char *const *params, int n_params, graph *g,
                         graph_script *info, stof_error *err) {
    return lua_api_build_string_limits(source, chunkname, search_dir, params, n_params, NULL, g,
                                       info, err);
}

int lua_api_build_config(const char *path, const char *const *params, int n_params,
                         const struct cJSON *config, graph *g, graph_script *info,
                         stof_error *err) {
    if (!path || !g || n_params < 0 || (n_params > 0 && !params))
        return err_set(err, STOF_ERR_INVALID, "lua_api_build: bad arguments");
    size_t len = 0;
    char *text = NULL;
    int rc = file_read(path, "script", FILE_LIMIT_SCRIPT, &text, &len, err);
    if (rc)
        return rc;
    luaapi_ctx *c = malloc(sizeof *c);
    if (!c) {
        free(text);
        return err_set(err, STOF_ERR_NOMEM, "out of host memory (Lua context)");
    }
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    char dir[sizeof c->script_dir];
    /* the script's folder, where `require` looks: never a cut path */
    if (slash && (size_t)(slash - path) >= sizeof dir) {
        free(text);
        free(c);
        return err_set(err, STOF_ERR_INVALID, "the script's folder is more than %zu characters: "
                       "%.60s...", sizeof dir - 1, path);
    }
    if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    luaapi_ctx_init(c, name, dir, NULL, NULL);
    c->params = params;
    c->n_params = n_params;
    c->info = info;
    c->config = config;
    luaapi_info_init(info, path, c->chunkname, text, len);
    luaapi_source src = {text, len};
    rc = luaapi_run(c, &src, g, err);
    free(c);
    free(text);
    return rc;
}

int lua_api_build(const char *path, const char *const *params, int n_params, graph *g,
                  graph_script *info, stof_error *err) {
    return lua_api_build_config(path, params, n_params, NULL, g, info, err);
}
