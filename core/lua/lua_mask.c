/* stof.mask: attention mask patterns as Lua objects.
 *
 * A mask object is a userdata owning one mask_spec (freed by __gc); `+` is
 * union and `*` intersection. Patterns are unsized: m:attention builds one
 * for its (batch, q_len, k_len) through luaapi_mask_attach, which remembers
 * what it built so that twelve layers sharing a pattern share one mask.
 *
 * Predicates call back into Lua while mask_build runs. Their function and
 * its context live in a userdata anchored in the registry until the state
 * closes, because cloned specs (inside unions) point at it too. */
#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/lua/lua_api.h"
#include "ops/mask.h"

#define LUAAPI_MASK "stof.mask"
#define LUAAPI_MASK_CACHE 8

typedef struct luaapi_built {
    int batch, q_len, k_len, id;
} luaapi_built;

typedef struct luaapi_mask {
    mask_spec *spec;
    size_t nodes;    /* patterns in spec's tree (combinations copy their operands) */
    size_t charged;  /* bytes charged to the script's memory budget for spec */
    int batch_aware; /* holds a predicate that reads b: built per batch */
    luaapi_built built[LUAAPI_MASK_CACHE];
    int n_built;
} luaapi_mask;

typedef struct luaapi_pred {
    luaapi_ctx *ctx;
    int fn_ref;     /* the Lua function, in the registry */
    char where[80]; /* "bert.lua:12": where the function was written */
} luaapi_pred;

static luaapi_mask *luaapi_test_mask(lua_State *L, int idx) {
    return luaL_testudata(L, idx, LUAAPI_MASK);
}

static luaapi_mask *luaapi_check_mask(lua_State *L, int idx) {
    luaapi_mask *m = luaapi_test_mask(L, idx);
    if (!m)
        luaL_typeerror(L, idx, "mask");
    return m;
}

/* Pushes an empty mask object; the caller sets ->spec right after. The
 * userdata comes first so that a spec is never left unowned by an error. */
static luaapi_mask *luaapi_push_mask(lua_State *L) {
    luaapi_mask *m = lua_newuserdatauv(L, sizeof *m, 0);
    memset(m, 0, sizeof *m);
    m->nodes = 1;
    luaL_setmetatable(L, LUAAPI_MASK);
    return m;
}

static mask_spec *luaapi_spec_or_raise(lua_State *L, mask_spec *s) {
    if (!s)
        luaL_error(L, "out of host memory (mask pattern)");
    return s;
}

/* ---- atomic patterns: one constructor per kind, driven by a table ----------- */

typedef struct luaapi_pattern {
    const char *name;
    mask_kind kind;
    const char *keys[6];
} luaapi_pattern;

static const luaapi_pattern luaapi_patterns[] = {
    {"sliding_window", MASK_SLIDING, {"band"}},
    {"dilated", MASK_DILATED, {"band", "dilation"}},
    {"global", MASK_GLOBAL, {"width"}},
    {"random", MASK_RANDOM, {"rate", "block", "seed"}},
    {"longformer", MASK_LONGFORMER, {"global", "band"}},
    {"bigbird", MASK_BIGBIRD, {"global", "band", "rate", "block", "seed"}},
    {"causal", MASK_CAUSAL, {NULL}},
    {"full", MASK_DENSE_ALL, {NULL}},
};
#define LUAAPI_N_PATTERNS ((int)(sizeof luaapi_patterns / sizeof luaapi_patterns[0]))

/* Reads key of the options at 1 into the spec field it names. */
static void luaapi_pattern_field(lua_State *L, const char *fname, const char *key,
                                 mask_spec *s) {
    if (lua_getfield(L, 1, key) == LUA_TNIL) {
        lua_pop(L, 1);
        return;
    }
    if (lua_type(L, -1) != LUA_TNUMBER)
        luaL_error(L, "%s: '%s' must be a number, got a %s", fname, key, luaL_typename(L, -1));
    if (strcmp(key, "rate") == 0) {
        s->rate = lua_tonumber(L, -1);
        if (!(s->rate >= 0.0 && s->rate <= 1.0))
            luaL_error(L, "%s: rate must be in [0, 1] (0: the default 0.1)", fname);
    } else {
        int ok;
        lua_Integer v = lua_tointegerx(L, -1, &ok);
        lua_Integer hi = strcmp(key, "seed") == 0 ? LUA_MAXINTEGER : MASK_MAX_LEN;
        if (!ok || v < 0 || v > hi)
            luaL_error(L, "%s: '%s' must be an integer in 0..%I (0: the default)", fname, key,
                       hi);
        if (strcmp(key, "seed") == 0)
            s->seed = (uint64_t)v;
        else if (strcmp(key, "dilation") == 0)
            s->dilation = (int)v;
        else if (strcmp(key, "block") == 0)
            s->block = (int)v;
        else if (strcmp(key, "band") == 0)
            s->band = (int)v;
        else
            s->global = (int)v; /* "global" and global's "width" */
    }
    lua_pop(L, 1);
}

/* stof.mask.<pattern>{key = value, ...}: upvalue 1 indexes luaapi_patterns. */
static int luaapi_mask_pattern(lua_State *L) {
    const luaapi_pattern *p = &luaapi_patterns[lua_tointeger(L, lua_upvalueindex(1))];
    char fname[64];
    snprintf(fname, sizeof fname, "stof.mask.%s", p->name);
    if (!lua_isnoneornil(L, 1)) {
        luaL_checktype(L, 1, LUA_TTABLE);
        luaapi_check_options(L, 1, fname, p->keys);
    }
    luaapi_mask *m = luaapi_push_mask(L);
    m->spec = luaapi_spec_or_raise(L, mask_spec_new(p->kind));
    for (int k = 0; p->keys[k] && lua_istable(L, 1); k++)
        luaapi_pattern_field(L, fname, p->keys[k], m->spec);
    return 1;
}

/* ---- combinations ---------------------------------------------------------- */

/* What one pattern of a spec tree costs the memory budget: combinations
 * copy their operands, so `k = k + k` doubles the tree each time. */
#define LUAAPI_SPEC_BYTES (sizeof(mask_spec) + 2 * sizeof(mask_spec *))

/* Patterns one mask expression may hold: real masks have a few dozen; a
 * doubling loop reaches this in 16 steps instead of exhausting memory. */
#define LUAAPI_MAX_SPEC_NODES 65536

/* Charges m for a spec tree of nodes patterns (raises when over budget). */
static void luaapi_mask_charge(lua_State *L, luaapi_mask *m, size_t nodes) {
    if (nodes > LUAAPI_MAX_SPEC_NODES)
        luaL_error(L, "mask expression of %I patterns, more than %d (combining copies its "
                      "operands: build it from fewer pieces)", (lua_Integer)nodes,
                   LUAAPI_MAX_SPEC_NODES);
    size_t bytes = nodes > SIZE_MAX / LUAAPI_SPEC_BYTES ? SIZE_MAX : nodes * LUAAPI_SPEC_BYTES;
    luaapi_charge(L, bytes, "the mask expression");
    m->nodes = nodes;
    m->charged = bytes;
}

/* A new mask object of kind over clones of the mask objects at first..last. */
static int luaapi_combine(lua_State *L, mask_kind kind, int first, int last) {
    int n = last - first + 1;
    if (n < 1)
        return luaL_error(L, "stof.mask.%s needs at least one mask", mask_kind_name(kind));
    int aware = 0;
    size_t nodes = 1;
    for (int k = first; k <= last; k++) {
        const luaapi_mask *op = luaapi_check_mask(L, k);
        aware |= op->batch_aware;
        nodes += op->nodes > SIZE_MAX - nodes ? SIZE_MAX - nodes : op->nodes;
    }
    luaapi_mask *m = luaapi_push_mask(L);
    luaapi_mask_charge(L, m, nodes);
    mask_spec **kids = calloc((size_t)n, sizeof *kids);
    int ok = kids != NULL;
    for (int k = 0; ok && k < n; k++)
        ok = (kids[k] = mask_spec_clone(luaapi_test_mask(L, first + k)->spec)) != NULL;
    if (!ok) {
        for (int k = 0; kids && k < n; k++)
            mask_spec_free(kids[k]);
        free(kids);
        return luaL_error(L, "out of host memory (mask pattern)");
    }
    m->spec = mask_spec_combine(kind, kids, n); /* owns the clones, also on failure */
    free(kids);
    luaapi_spec_or_raise(L, m->spec);
    m->batch_aware = aware;
    return 1;
}

static int luaapi_mask_union(lua_State *L) {
    return luaapi_combine(L, MASK_UNION, 1, lua_gettop(L));
}

static int luaapi_mask_intersect(lua_State *L) {
    return luaapi_combine(L, MASK_INTERSECT, 1, lua_gettop(L));
}

/* a + b, a * b: both operands must be masks (a nil from named("none") is a
 * mistake worth naming). */
static int luaapi_mask_arith(lua_State *L, mask_kind kind, const char *op) {
    if (!luaapi_test_mask(L, 1) || !luaapi_test_mask(L, 2))
        return luaapi_error(L, "mask %s %s: both operands must be masks", op,
                            luaL_typename(L, luaapi_test_mask(L, 1) ? 2 : 1));
    return luaapi_combine(L, kind, 1, 2);
}

static int luaapi_mask_add(lua_State *L) {
    return luaapi_mask_arith(L, MASK_UNION, "+");
}

static int luaapi_mask_mul(lua_State *L) {
    return luaapi_mask_arith(L, MASK_INTERSECT, "*");
}

/* stof.mask.per_batch{m1, m2, ...}: mask b for batch b. */
static int luaapi_mask_per_batch(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    lua_Integer n = luaL_len(L, 1);
    if (n < 1 || n > MASK_MAX_LEN)
        return luaL_argerror(L, 1, "a list of one mask per batch");
    luaL_checkstack(L, (int)n + 2, "too many masks for per_batch");
    for (lua_Integer k = 1; k <= n; k++)
        if (lua_geti(L, 1, k) != LUA_TUSERDATA || !luaapi_test_mask(L, -1))
            return luaL_error(L, "stof.mask.per_batch: entry %I is a %s, not a mask", k,
                              luaL_typename(L, -1));
    return luaapi_combine(L, MASK_PER_BATCH, 2, (int)n + 1);
}

/* stof.mask.key_padding{lengths = {...}}: keys j < lengths[b] are valid. */
static int luaapi_mask_key_padding(lua_State *L) {
    static const char *const allowed[] = {"lengths", NULL};
    luaL_checktype(L, 1, LUA_TTABLE);
    luaapi_check_options(L, 1, "stof.mask.key_padding", allowed);
    lua_settop(L, 1);
    if (lua_getfield(L, 1, "lengths") != LUA_TTABLE)
        return luaL_error(L, "stof.mask.key_padding: lengths must be a list of integers");
    lua_Integer n = luaL_len(L, 2);
    if (n < 1 || n > MASK_MAX_LEN)
        return luaL_error(L, "stof.mask.key_padding: lengths needs 1 to %d entries", MASK_MAX_LEN);
    luaapi_mask *m = luaapi_push_mask(L);
    m->spec = luaapi_spec_or_raise(L, mask_spec_new(MASK_KEY_PADDING));
    m->spec->lengths = calloc((size_t)n, sizeof *m->spec->lengths);
    if (!m->spec->lengths)
        return luaL_error(L, "out of host memory (mask pattern)");
    m->spec->n_lengths = (int)n;
    for (lua_Integer k = 1; k <= n; k++) {
        lua_geti(L, 2, k);
        int ok;
        lua_Integer v = lua_tointegerx(L, -1, &ok);
        if (!ok || v < 0 || v > MASK_MAX_LEN)
            return luaL_error(L, "stof.mask.key_padding: lengths[%I] must be an integer in "
                                 "0..%d", k, MASK_MAX_LEN);
        m->spec->lengths[k - 1] = (int)v;
        lua_pop(L, 1);
    }
    return 1;
}

/* ---- predicates ------------------------------------------------------------ */

/* mask_predicate_fn: calls the Lua function with (i, j, b) on the thread that
 * is building the mask. Errors are caught here (a longjmp through
 * mask_build would leak its buffers) and come back as its error code. */
static int luaapi_pred_call(void *ud, int b, int i, int j, stof_error *err) {
    luaapi_pred *p = ud;
    luaapi_ctx *c = p->ctx;
    lua_State *L = c->active;
    if (!L)
        return err_set(err, STOF_ERR_INTERNAL, "a mask predicate ran outside its script");
    if (!lua_checkstack(L, 4))
        return err_set(err, STOF_ERR_NOMEM, "out of Lua stack in a mask predicate");
    lua_rawgeti(L, LUA_REGISTRYINDEX, p->fn_ref);
    lua_pushinteger(L, i);
    lua_pushinteger(L, j);
    lua_pushinteger(L, b);
    int status = lua_pcall(L, 3, 1, 0);
    if (status != LUA_OK) {
        if (status == LUA_ERRMEM)
            c->fatal = LUAAPI_FATAL_MEMORY;
        const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        if (msg)
            snprintf(c->pred_error, sizeof c->pred_error, "%s", msg);
        else
            snprintf(c->pred_error, sizeof c->pred_error,
                     "%s: the predicate raised an error that is a %s, not a message", p->where,
                     luaL_typename(L, -1));
        lua_pop(L, 1);
        return err_set(err, STOF_ERR_SCRIPT, "%s", c->pred_error);
    }
    int t = lua_type(L, -1), r = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (t != LUA_TBOOLEAN) {
        snprintf(c->pred_error, sizeof c->pred_error,
                 "%s: the predicate must return true or false, got a %s", p->where,
                 lua_typename(L, t));
        return err_set(err, STOF_ERR_SCRIPT, "%s", c->pred_error);
    }
    return r;
}

/* stof.mask.predicate(function(i, j [, b]) return bool end) */
static int luaapi_mask_predicate(lua_State *L) {
    luaL_checktype(L, 1, LUA_TFUNCTION);
    lua_settop(L, 1);
    lua_Debug ar;
    lua_pushvalue(L, 1);
    lua_getinfo(L, ">Su", &ar);
    luaapi_pred *p = lua_newuserdatauv(L, sizeof *p, 0); /* 2 */
    p->ctx = luaapi_ctx_of(L);
    snprintf(p->where, sizeof p->where, "%s:%d", ar.short_src, ar.linedefined);
    lua_pushvalue(L, 1);
    p->fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pushvalue(L, 2);
    luaL_ref(L, LUA_REGISTRYINDEX); /* p lives until lua_close */
    luaapi_mask *m = luaapi_push_mask(L);
    m->spec = luaapi_spec_or_raise(L, mask_spec_new(MASK_PREDICATE));
    m->spec->pred = luaapi_pred_call;
    m->spec->pred_ud = p;
    m->spec->pred_name = malloc(strlen(p->where) + 1);
    if (!m->spec->pred_name)
        return luaL_error(L, "out of host memory (mask pattern)");
    memcpy(m->spec->pred_name, p->where, strlen(p->where) + 1);
    m->batch_aware = ar.nparams >= 3 || ar.isvararg;
    return 1;
}

/* ---- text forms ------------------------------------------------------------ */

static int luaapi_push_parsed(lua_State *L, const char *text) {
    luaapi_mask *m = luaapi_push_mask(L);
    stof_error e;
    if (mask_spec_parse(text, &m->spec, &e) != STOF_OK)
        return luaL_error(L, "%s", e.msg); /* the message quotes the text */
    return 1;
}

/* stof.mask.parse("bigbird{band=64}") */
static int luaapi_mask_parse(lua_State *L) {
    return luaapi_push_parsed(L, luaL_checkstring(L, 1));
}

/* stof.mask.named(text): a pattern name or text form, as scripts take it
 * from a parameter; "none" means no mask (nil). */
static int luaapi_mask_named(lua_State *L) {
    const char *text = luaL_checkstring(L, 1);
    if (strcmp(text, "none") == 0 || text[0] == '\0') {
        lua_pushnil(L);
        return 1;
    }
    return luaapi_push_parsed(L, text);
}

/* ---- building for an attention op ------------------------------------------ */

/* The spec to build for batch: m's own, or, when a predicate reads b, one
 * copy per batch under per_batch (mask_build calls predicates outside
 * per_batch with b = 0). *owned says whether the caller frees it. */
static mask_spec *luaapi_spec_for(const luaapi_mask *m, int batch, int *owned) {
    *owned = m->batch_aware && batch > 1;
    if (!*owned)
        return m->spec;
    mask_spec **kids = calloc((size_t)batch, sizeof *kids);
    int ok = kids != NULL;
    for (int b = 0; ok && b < batch; b++)
        ok = (kids[b] = mask_spec_clone(m->spec)) != NULL;
    if (!ok) {
        for (int b = 0; kids && b < batch; b++)
            mask_spec_free(kids[b]);
        free(kids);
        return NULL;
    }
    mask_spec *s = mask_spec_combine(MASK_PER_BATCH, kids, batch);
    free(kids);
    return s;
}

/* Bytes the built mask's bits take: stored once, or once per batch (a
 * pattern whose predicate reads b is built per batch). */
static size_t luaapi_mask_bytes(const luaapi_mask *m, int batch, int q_len, int k_len) {
    int per_batch = (m->batch_aware && batch > 1) || mask_spec_is_per_batch(m->spec);
    size_t stored = per_batch ? (size_t)batch : 1;
    return stored * (size_t)q_len * (((size_t)k_len + 63) / 64) * sizeof(uint64_t);
}

/* Builds m for the shape; a failure raises at the calling script line, or
 * with the predicate's own message when a predicate failed. The mask's bits
 * (kept by the graph) and, while it is built, a per-batch copy of the
 * pattern are charged to the script's memory budget first. */
static mask *luaapi_build(lua_State *L, const luaapi_mask *m, int batch, int q_len, int k_len) {
    luaapi_ctx *c = luaapi_ctx_of(L);
    size_t bits = luaapi_mask_bytes(m, batch, q_len, k_len);
    char what[96];
    snprintf(what, sizeof what, "the attention mask for (%d, %d, %d)", batch, q_len, k_len);
    luaapi_charge(L, bits, what);
    /* a charge that raises ends the script (a fatal memory error): what was
     * charged before it needs no giving back */
    size_t copies = m->batch_aware && batch > 1 ? (size_t)batch * m->nodes : 0;
    luaapi_charge(L, copies * LUAAPI_SPEC_BYTES, "a copy of the mask pattern per batch");
    int owned;
    mask_spec *spec = luaapi_spec_for(m, batch, &owned);
    if (!spec) {
        luaapi_uncharge(c, copies * LUAAPI_SPEC_BYTES + bits);
        luaL_error(L, "out of host memory (mask pattern)");
    }
    lua_State *outer = c->active;
    c->active = L;
    c->pred_error[0] = '\0';
    mask *built = NULL;
    stof_error e;
    int rc = mask_build(spec, batch, q_len, k_len, &built, &e);
    c->active = outer;
    if (owned)
        mask_spec_free(spec);
    luaapi_uncharge(c, copies * LUAAPI_SPEC_BYTES);
    if (rc == STOF_OK)
        return built;
    luaapi_uncharge(c, bits);
    if (c->pred_error[0]) {
        lua_pushfstring(L, "%s (in a mask predicate, for the attention at line %d of %s)",
                        c->pred_error, luaapi_line(L), c->chunkname);
        lua_error(L);
    }
    luaL_error(L, "attention mask: %s", e.msg);
    return NULL;
}

int luaapi_mask_attach(lua_State *L, int idx, int batch, int q_len, int k_len) {
    luaapi_mask *m = luaapi_test_mask(L, idx);
    if (!m)
        luaL_error(L, "attention: option 'mask' must be a mask (stof.mask...), got a %s",
                   luaL_typename(L, idx));
    for (int k = 0; k < m->n_built; k++) {
        const luaapi_built *b = &m->built[k];
        if (b->batch == batch && b->q_len == q_len && b->k_len == k_len)
            return b->id;
    }
    if (luaapi_ctx_of(L)->frozen)
        luaL_error(L, "the model was validated when the script returned: it can no longer "
                      "change");
    mask *built = luaapi_build(L, m, batch, q_len, k_len);
    stof_error e;
    int id;
    if (graph_add_mask(luaapi_ctx_of(L)->g, built, mask_free, &id, &e) != STOF_OK)
        luaL_error(L, "%s", e.msg);
    if (m->n_built < LUAAPI_MASK_CACHE)
        m->built[m->n_built++] = (luaapi_built){batch, q_len, k_len, id};
    return id;
}

/* ---- metamethods and the table --------------------------------------------- */

static int luaapi_mask_gc(lua_State *L) {
    luaapi_mask *m = luaapi_test_mask(L, 1);
    if (m) {
        mask_spec_free(m->spec);
        m->spec = NULL;
        luaapi_uncharge(luaapi_ctx_of(L), m->charged);
        m->charged = 0;
    }
    return 0;
}

static int luaapi_mask_tostring(lua_State *L) {
    luaapi_mask *m = luaapi_check_mask(L, 1);
    char *text = m->spec ? mask_spec_describe(m->spec) : NULL;
    if (!text)
        return luaL_error(L, "out of host memory (mask description)");
    lua_pushstring(L, text); /* may raise on memory: free first */
    free(text);
    return 1;
}

static void luaapi_mask_metatable(lua_State *L) {
    static const luaL_Reg meta[] = {{"__gc", luaapi_mask_gc},
                                    {"__add", luaapi_mask_add},
                                    {"__mul", luaapi_mask_mul},
                                    {"__tostring", luaapi_mask_tostring},
                                    {NULL, NULL}};
    luaL_newmetatable(L, LUAAPI_MASK);
    luaL_setfuncs(L, meta, 0);
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
    lua_pop(L, 1);
}

void luaapi_open_mask(lua_State *L) {
    static const luaL_Reg fns[] = {{"union", luaapi_mask_union},
                                   {"intersect", luaapi_mask_intersect},
                                   {"per_batch", luaapi_mask_per_batch},
                                   {"key_padding", luaapi_mask_key_padding},
                                   {"predicate", luaapi_mask_predicate},
                                   {"parse", luaapi_mask_parse},
                                   {"named", luaapi_mask_named},
                                   {NULL, NULL}};
    luaapi_mask_metatable(L);
    luaL_newlib(L, fns);
    for (int k = 0; k < LUAAPI_N_PATTERNS; k++) {
        lua_pushinteger(L, k);
        lua_pushcclosure(L, luaapi_mask_pattern, 1);
        lua_setfield(L, -2, luaapi_patterns[k].name);
    }
}
