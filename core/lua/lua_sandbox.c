/* The sandbox a model script runs in: which globals it sees, how much memory
 * and how many instructions it may use, and how `require`, `load`, `pcall`
 * and `print` behave there.
 *
 * A script is a description of a model, so it gets the pure libraries (base,
 * string, table, math, utf8) and nothing that touches the machine: no io, os,
 * debug or package, no dofile/loadfile, no binary chunks (their bytecode is
 * not verified and can crash the VM). The budgets turn runaway scripts into
 * ordinary script errors instead of hangs or host out-of-memory. */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/lua/lua_api.h"
#include "core/base/file.h"
#include "core/base/util.h"

/* The cache table of loaded helper modules, in the registry. */
#define LUAAPI_MODULES "stof.modules"

luaapi_ctx *luaapi_ctx_of(lua_State *L) {
    void *ud = NULL;
    lua_getallocf(L, &ud);
    return ud;
}

/* Work the libraries do in C (string.rep, concatenation, table.concat,
 * gsub's result...) runs no VM instruction; it is about as large as what it
 * allocates, so every LUAAPI_BYTES_PER_INSTRUCTION bytes allocated count as
 * one instruction of the budget (taken at the next count hook). */
#define LUAAPI_BYTES_PER_INSTRUCTION 2

static void luaapi_hook(lua_State *L, lua_Debug *ar);

static void luaapi_charge_alloc(luaapi_ctx *c, size_t bytes) {
    if (!c->hook_every)
        return; /* before the budget is set: the libraries opening */
    uint64_t per_call = (uint64_t)c->hook_every * LUAAPI_BYTES_PER_INSTRUCTION;
    c->alloc_work += bytes;
    if (c->alloc_work >= per_call) {
        c->hook_calls += c->alloc_work / per_call;
        c->alloc_work %= per_call;
    }
    /* Spent: the hook must come at the next instruction, not after the
     * million a count hook waits for (a loop of string.rep would allocate
     * gigabytes meanwhile). lua_sethook may be called at any point. */
    if (c->hook_calls >= c->hook_max && c->main)
        lua_sethook(c->main, luaapi_hook, LUA_MASKCOUNT, 1);
}

/* Lua's allocator contract (lua_Alloc), with a cap on the bytes held. Lua
 * retries a failed allocation after a full collection and raises a memory
 * error only when that fails too, so refusing here is always safe. */
void *luaapi_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    luaapi_ctx *c = ud;
    size_t old = ptr ? osize : 0; /* with ptr NULL, osize is a type tag */
    if (nsize == 0) {
        free(ptr);
        c->mem_used -= old;
        return NULL;
    }
    if (nsize > old && nsize - old > c->mem_limit - c->mem_used)
        return NULL;
    void *p = realloc(ptr, nsize);
    if (p)
        c->mem_used = c->mem_used - old + nsize;
    if (p && nsize > old)
        luaapi_charge_alloc(c, nsize - old);
    return p;
}

int luaapi_rethrow(lua_State *L, int status) {
    if (status == LUA_ERRMEM)
        luaapi_ctx_of(L)->fatal = LUAAPI_FATAL_MEMORY;
    return lua_error(L);
}

/* The nearest script frame above the running C function: level 1 is its
 * caller, unless a C function (a string metamethod forwarding `'x' * mask`,
 * say) stands between them. */
static int luaapi_script_frame(lua_State *L, lua_Debug *ar) {
    for (int level = 1; lua_getstack(L, level, ar); level++)
        if (lua_getinfo(L, "Sl", ar) && ar->currentline > 0)
            return 1;
    return 0;
}

int luaapi_line(lua_State *L) {
    lua_Debug ar;
    return luaapi_script_frame(L, &ar) ? ar.currentline : 0;
}

/* 1 when msg starts with a position, "name:LINE:". */
static int has_position(const char *msg) {
    const char *colon = strchr(msg, ':');
    if (!colon || colon == msg || colon[1] < '0' || colon[1] > '9')
        return 0;
    const char *p = colon + 1;
    while (*p >= '0' && *p <= '9')
        p++;
    return *p == ':';
}

int luaapi_where_msgh(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    lua_Debug ar;
    if (msg && !has_position(msg) && luaapi_script_frame(L, &ar)) {
        lua_pushfstring(L, "%s:%d: %s", ar.short_src, ar.currentline, msg);
        return 1;
    }
    lua_settop(L, 1);
    return 1;
}

int luaapi_error(lua_State *L, const char *fmt, ...) {
    lua_Debug ar;
    if (luaapi_script_frame(L, &ar))
        lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.currentline);
    else
        lua_pushfstring(L, "%s: ", luaapi_ctx_of(L)->chunkname);
    va_list ap;
    va_start(ap, fmt);
    lua_pushvfstring(L, fmt, ap);
    va_end(ap);
    lua_concat(L, 2);
    return lua_error(L);
}

void luaapi_check_options(lua_State *L, int idx, const char *fname, const char *const *allowed) {
    if (lua_isnoneornil(L, idx))
        return;
    idx = lua_absindex(L, idx);
    luaL_checktype(L, idx, LUA_TTABLE);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        const char *key = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        int known = 0;
        for (int k = 0; key && allowed[k] && !known; k++)
            known = strcmp(key, allowed[k]) == 0;
        if (known)
            continue;
        luaL_Buffer b;
        luaL_buffinit(L, &b);
        luaL_addstring(&b, allowed[0] ? "accepted: " : "it takes no options");
        for (int k = 0; allowed[k]; k++) {
            luaL_addstring(&b, k ? ", " : "");
            luaL_addstring(&b, allowed[k]);
        }
        luaL_pushresult(&b);
        if (!key)
            luaL_error(L, "%s: option names must be strings, got a %s key (%s)", fname,
                       luaL_typename(L, -2), lua_tostring(L, -1));
        luaL_error(L, "%s: unknown option '%s' (%s)", fname, key, lua_tostring(L, -1));
    }
}

/* ---- budgets -------------------------------------------------------------- */

/* Called every hook_every instructions. Once over budget it raises on every
 * call, so a script that catches the error with pcall is stopped again. */
static void luaapi_hook(lua_State *L, lua_Debug *ar) {
    luaapi_ctx *c = luaapi_ctx_of(L);
    if (++c->hook_calls <= c->hook_max)
        return;
    c->fatal = LUAAPI_FATAL_TIME;
    if (lua_getinfo(L, "Sl", ar) && ar->currentline > 0)
        lua_pushfstring(L, "%s:%d: ", ar->short_src, ar->currentline);
    else
        lua_pushfstring(L, "%s: ", c->chunkname);
    lua_pushfstring(L, "the script ran too long (more than %I instructions)",
                    (lua_Integer)c->instructions);
    lua_concat(L, 2);
    /* Kept for the report: a script's xpcall handler may rewrite the error. */
    snprintf(c->fatal_msg, sizeof c->fatal_msg, "%s", lua_tostring(L, -1));
    lua_error(L);
}

static void luaapi_set_budget(lua_State *L, luaapi_ctx *c) {
    uint64_t every = c->instructions < 1000000 ? c->instructions : 1000000;
    c->hook_every = (int)(every ? every : 1);
    c->hook_max = c->instructions / (uint64_t)c->hook_every;
    lua_sethook(L, luaapi_hook, LUA_MASKCOUNT, c->hook_every);
}

/* ---- replaced globals ---------------------------------------------------- */

/* pcall(f, ...) that never swallows a budget error. */
static int luaapi_pcall(lua_State *L) {
    luaL_checkany(L, 1);
    int status = lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0);
    if (status != LUA_OK && (status == LUA_ERRMEM || luaapi_ctx_of(L)->fatal))
        return luaapi_rethrow(L, status);
    lua_pushboolean(L, status == LUA_OK);
    lua_insert(L, 1);
    return lua_gettop(L);
}

/* The message handler xpcall hands to Lua: the script's handler, until a
 * budget is spent. When the count hook itself raises, the handler runs
 * inside the hook, where Lua turns hooks off: a handler that loops could
 * never be stopped. So once a budget is spent the message passes through
 * untouched. */
static int luaapi_msgh(lua_State *L) {
    if (luaapi_ctx_of(L)->fatal)
        return 1;
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

/* xpcall(f, handler, ...), likewise. */
static int luaapi_xpcall(lua_State *L) {
    int n = lua_gettop(L);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_pushvalue(L, 2);
    lua_pushcclosure(L, luaapi_msgh, 1);
    lua_replace(L, 2);
    lua_pushvalue(L, 1);
    lua_rotate(L, 3, 1); /* f, handler, f, args... */
    int status = lua_pcall(L, n - 2, LUA_MULTRET, 2);
    if (status != LUA_OK && (status == LUA_ERRMEM || luaapi_ctx_of(L)->fatal))
        return luaapi_rethrow(L, status);
    lua_pushboolean(L, status == LUA_OK);
    lua_replace(L, 2); /* f, ok, results... */
    return lua_gettop(L) - 1;
}

/* setmetatable(t, mt), without finalizers: Lua runs __gc metamethods with
 * hooks off (in collections, and at lua_close after the model was
 * validated), out of reach of both budgets. Lua marks an object for
 * finalization only when its metatable has __gc as it is set, so refusing
 * that here is enough. */
static int luaapi_setmetatable(lua_State *L) {
    int t = lua_type(L, 2);
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_argexpected(L, t == LUA_TNIL || t == LUA_TTABLE, 2, "nil or table");
    if (luaL_getmetafield(L, 1, "__metatable") != LUA_TNIL)
        return luaL_error(L, "cannot change a protected metatable");
    if (t == LUA_TTABLE) {
        lua_pushliteral(L, "__gc");
        int has_gc = lua_rawget(L, 2) != LUA_TNIL;
        lua_pop(L, 1);
        if (has_gc)
            return luaL_error(L, "setmetatable: __gc finalizers are not allowed in model "
                                 "scripts (they would run outside the script's budgets)");
    }
    lua_settop(L, 2);
    lua_setmetatable(L, 1);
    return 1;
}

/* ---- patterns -------------------------------------------------------------- */

/* Quantified items of a Lua pattern (*, +, - and ?): the pattern matcher
 * backtracks in C, where the count hook never fires, over the ways these
 * items can split the subject. */
static int luaapi_pattern_quantifiers(const char *p, size_t len) {
    int q = 0;
    for (size_t i = 0; i < len; i++) {
        if (p[i] == '%') {
            i += (i + 1 < len && p[i + 1] == 'b') ? 3 : 1; /* %b takes two characters */
        } else if (p[i] == '[') {
            size_t j = i + 1;
            if (j < len && p[j] == '^')
                j++;
            if (j < len && p[j] == ']')
                j++; /* a ] first is a member */
            for (; j < len && p[j] != ']'; j++)
                if (p[j] == '%')
                    j++;
            i = j;
        }
        if (i + 1 < len && strchr("*+-?", p[i + 1]) && p[i + 1] != '\0')
            q++, i++;
    }
    return q;
}

/* 1 when the pattern has items whose one match may scan the whole subject:
 * %b (balanced) and back-references %1..%9. */
static int luaapi_pattern_scans(const char *p, size_t len) {
    for (size_t i = 0; i + 1 < len; i++)
        if (p[i] == '%') {
            if (p[i + 1] == 'b' || (p[i + 1] >= '1' && p[i + 1] <= '9'))
                return 1;
            i++;
        }
    return 0;
}

/* The worst case of matching a pattern of plen characters with q quantified
 * items against n characters from every start (gsub and gmatch; find and
 * match stop at the first): (n + 1) C(n + q, q) ways to split the subject,
 * each compared over up to plen + 1 pattern items, times n again for items
 * that scan the subject; in floating point. */
static double luaapi_pattern_worst(size_t n, size_t plen, int q, int scans) {
    double c = 1;
    for (int k = 1; k <= q; k++)
        c = c * (double)(n + (size_t)k) / k;
    return c * (double)(n + 1) * (double)(plen + 1) * (scans ? (double)(n + 1) : 1.0);
}

/* Runs the string library's function in upvalue 1 once its worst case fits
 * the instructions left; the steps are charged at one per character. A
 * plain find (find's fourth argument) is linear and always runs. */
static int luaapi_pattern_call(lua_State *L) {
    luaapi_ctx *c = luaapi_ctx_of(L);
    size_t n = 0, plen = 0;
    luaL_checklstring(L, 1, &n);
    const char *p = luaL_checklstring(L, 2, &plen);
    const char *fname = lua_tostring(L, lua_upvalueindex(2));
    /* a plain find compares the pattern at every start: n m steps */
    int plain = strcmp(fname, "find") == 0 && lua_toboolean(L, 4);
    double worst = plain ? (double)(n + 1) * (double)(plen + 1)
                         : luaapi_pattern_worst(n, plen, luaapi_pattern_quantifiers(p, plen),
                                                luaapi_pattern_scans(p, plen));
    {
        double left = (double)(c->hook_max - (c->hook_calls < c->hook_max ? c->hook_calls
                                                                          : c->hook_max)) *
                      c->hook_every;
        if (worst > left) {
            char msg[256];
            snprintf(msg, sizeof msg, "string.%s: this pattern may take up to %.3g steps on a "
                     "string of %zu characters, more than the %.3g instructions the script has "
                     "left (use a simpler pattern, or a plain find)", fname, worst, n, left);
            return luaL_error(L, "%s", msg);
        }
    }
    /* charged as a scan of the subject per pattern item, what a pattern
     * that does not backtrack costs */
    c->hook_calls += (uint64_t)((double)(n + 1) * (double)(plen + 1) / c->hook_every);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* Wraps string.find, match, gmatch and gsub in luaapi_pattern_call. */
static void luaapi_guard_patterns(lua_State *L) {
    static const char *const names[] = {"find", "match", "gmatch", "gsub", NULL};
    lua_getglobal(L, LUA_STRLIBNAME);
    for (int k = 0; names[k]; k++) {
        lua_getfield(L, -1, names[k]);
        lua_pushstring(L, names[k]);
        lua_pushcclosure(L, luaapi_pattern_call, 2);
        lua_setfield(L, -2, names[k]);
    }
    lua_pop(L, 1);
}

/* ---- C-side work charged to the budgets ------------------------------------- */

int luaapi_charge(lua_State *L, size_t bytes, const char *what) {
    luaapi_ctx *c = luaapi_ctx_of(L);
    if (bytes > c->mem_limit - c->mem_used) {
        c->fatal = LUAAPI_FATAL_MEMORY;
        char msg[320];
        snprintf(msg, sizeof msg, "%s needs %.1f MiB, more than the script's memory budget has "
                 "left (%.1f of %zu MiB)", what, (double)bytes / (1 << 20),
                 (double)(c->mem_limit - c->mem_used) / (1 << 20), c->mem_limit >> 20);
        luaL_where(L, 1);
        lua_pushstring(L, msg);
        lua_concat(L, 2);
        /* Kept for the report, as the time budget's message is. */
        snprintf(c->fatal_msg, sizeof c->fatal_msg, "%s", lua_tostring(L, -1));
        return lua_error(L);
    }
    c->mem_used += bytes;
    return 0;
}

void luaapi_uncharge(luaapi_ctx *c, size_t bytes) {
    c->mem_used -= bytes < c->mem_used ? bytes : c->mem_used;
}

/* load(text [, chunkname [, mode [, env]]]): text chunks only; the mode
 * argument is ignored. The chunk's environment is the sandbox's globals
 * unless env is given. */
static int luaapi_load(lua_State *L) {
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    const char *chunkname = luaL_optstring(L, 2, "=(load)");
    int status = luaL_loadbufferx(L, s, len, chunkname, "t");
    if (status == LUA_ERRMEM)
        return luaapi_rethrow(L, status);
    if (status != LUA_OK) {
        lua_pushnil(L);
        lua_insert(L, -2);
        return 2;
    }
    if (!lua_isnone(L, 4)) {
        lua_pushvalue(L, 4);
        if (!lua_setupvalue(L, -2, 1))
            lua_pop(L, 1);
    }
    return 1;
}

/* print(...) writes to stderr: stdout belongs to the program's results. */
static int luaapi_print(lua_State *L) {
    int n = lua_gettop(L);
    for (int i = 1; i <= n; i++) {
        size_t len;
        const char *s = luaL_tolstring(L, i, &len);
        if (i > 1)
            fputc('\t', stderr);
        fwrite(s, 1, len, stderr);
        lua_pop(L, 1);
    }
    fputc('\n', stderr);
    return 0;
}

static int luaapi_module_name_ok(const char *name) {
    if (!((*name >= 'a' && *name <= 'z') || *name == '_'))
        return 0;
    for (const char *p = name + 1; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_'))
            return 0;
    return strlen(name) <= 64;
}

/* Reads name.lua from the script's folder, else from the search folder
 * (malloc'd into *text: free it before raising). STOF_OK with *text NULL
 * when neither folder has it; an error naming the file when one has it but
 * it cannot be read (a directory, unreadable, too large). */
static int luaapi_module_text(const luaapi_ctx *c, const char *name, char **text, size_t *len,
                              stof_error *err) {
    const char *dirs[2] = {c->script_dir, c->search_dir};
    *text = NULL;
    for (int k = 0; k < 2; k++) {
        if (!dirs[k][0])
            continue;
        char path[sizeof c->script_dir + 80];
        snprintf(path, sizeof path, "%s/%s.lua", dirs[k], name);
        if (file_exists(path))
            return file_read(path, "helper module", FILE_LIMIT_SCRIPT, text, len, err);
    }
    return STOF_OK;
}

/* require(name): a helper module beside the script, run once (sandboxed,
 * with the same globals) and cached; returns what the module returned. */
static int luaapi_require(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    lua_settop(L, 1);
    if (!luaapi_module_name_ok(name))
        return luaL_error(L, "require: '%s' is not a helper module name "
                             "(lowercase letters, digits and _)", name);
    lua_getfield(L, LUA_REGISTRYINDEX, LUAAPI_MODULES); /* 2 */
    if (lua_getfield(L, 2, name) != LUA_TNIL) {
        if (lua_islightuserdata(L, -1))
            return luaL_error(L, "require: '%s' requires itself (a loop of requires)", name);
        return 1;
    }
    luaapi_ctx *c = luaapi_ctx_of(L);
    size_t len = 0;
    char *text = NULL;
    stof_error e = {0};
    if (luaapi_module_text(c, name, &text, &len, &e) != STOF_OK)
        return luaL_error(L, "require: %s", e.msg);
    if (!text)
        return luaL_error(L, "require: no helper module '%s' (scripts may require only "
                             "%s.lua files in their own folder)", name, name);
    char chunkname[96];
    snprintf(chunkname, sizeof chunkname, "@%s.lua", name);
    int status = luaL_loadbufferx(L, text, len, chunkname, "t");
    free(text);
    if (status != LUA_OK)
        return luaapi_rethrow(L, status);
    lua_pushlightuserdata(L, (void *)luaapi_require); /* marks "loading" */
    lua_setfield(L, 2, name);
    lua_pushvalue(L, 1);
    status = lua_pcall(L, 1, 1, 0);
    if (status != LUA_OK) {
        lua_pushnil(L);
        lua_setfield(L, 2, name);
        return luaapi_rethrow(L, status);
    }
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_pushboolean(L, 1);
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, 2, name);
    return 1;
}

/* ---- opening ------------------------------------------------------------- */

static void luaapi_open_libs(lua_State *L) {
    static const luaL_Reg libs[] = {
        {LUA_GNAME, luaopen_base},         {LUA_STRLIBNAME, luaopen_string},
        {LUA_TABLIBNAME, luaopen_table},   {LUA_MATHLIBNAME, luaopen_math},
        {LUA_UTF8LIBNAME, luaopen_utf8},   {NULL, NULL}};
    for (const luaL_Reg *lib = libs; lib->func; lib++) {
        luaL_requiref(L, lib->name, lib->func, 1);
        lua_pop(L, 1);
    }
}

/* math.random is seeded from the clock at startup; a script's graph must be
 * the same on every run, so it starts from a fixed seed. */
static void luaapi_fix_random_seed(lua_State *L) {
    lua_getglobal(L, LUA_MATHLIBNAME);
    lua_getfield(L, -1, "randomseed");
    lua_pushinteger(L, 0);
    lua_call(L, 1, 0);
    lua_pop(L, 1);
}

void luaapi_open_sandbox(lua_State *L) {
    static const luaL_Reg replaced[] = {
        {"pcall", luaapi_pcall},   {"xpcall", luaapi_xpcall},
        {"load", luaapi_load},     {"print", luaapi_print},
        {"require", luaapi_require}, {"setmetatable", luaapi_setmetatable},
        {NULL, NULL}};
    static const char *const removed[] = {"dofile", "loadfile", NULL};
    luaapi_open_libs(L);
    lua_pushglobaltable(L);
    luaL_setfuncs(L, replaced, 0);
    for (int k = 0; removed[k]; k++) {
        lua_pushnil(L);
        lua_setfield(L, -2, removed[k]);
    }
    lua_pop(L, 1);
    luaapi_guard_patterns(L);
    /* string.dump makes bytecode, which nothing here may load. */
    lua_getglobal(L, LUA_STRLIBNAME);
    lua_pushnil(L);
    lua_setfield(L, -2, "dump");
    lua_pop(L, 1);
    luaapi_fix_random_seed(L);
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, LUAAPI_MODULES);
    luaapi_set_budget(L, luaapi_ctx_of(L));
}
