/* The model and tensor objects a script builds a graph with: stof.model{},
 * its option readers and tensor objects, m:input and m:weight (one method per
 * operator, m:layer and m:output are lua_model_ops.c's).
 *
 * A tensor object is a graph tensor index in a userdata; the graph itself
 * lives in the run's luaapi_ctx. Every method reports mistakes at the
 * script's line (luaL_error / luaL_argerror from the method's own frame) and
 * stamps that line on what it adds to the graph. */
#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/lua/lua_model.h"
#include "ops/ops.h"

#define LUAAPI_TENSOR "stof.tensor"

typedef struct luaapi_tensor {
    int id;
} luaapi_tensor;

/* The graph the script builds; raises once the model was validated (the
 * script has returned: nothing may add to what was checked). */
graph *luaapi_graph(lua_State *L) {
    luaapi_ctx *c = luaapi_ctx_of(L);
    if (c->frozen)
        luaL_error(L, "the model was validated when the script returned: it can no longer "
                      "change");
    return c->g;
}

/* ---- option readers: opts is a stack index, or 0 for "no options" ---------- */

static int luaapi_opt_type(lua_State *L, int opts, const char *key, int type, const char *fname,
                           const char *what) {
    if (!opts || lua_getfield(L, opts, key) == LUA_TNIL) {
        if (opts)
            lua_pop(L, 1);
        return 0;
    }
    if (lua_type(L, -1) != type)
        luaL_error(L, "%s: option '%s' must be %s, got a %s", fname, key, what,
                   luaL_typename(L, -1));
    return 1;
}

int luaapi_opt_bool(lua_State *L, int opts, const char *key, int def, const char *fname) {
    if (!luaapi_opt_type(L, opts, key, LUA_TBOOLEAN, fname, "true or false"))
        return def;
    int v = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

double luaapi_opt_number(lua_State *L, int opts, const char *key, double def,
                                const char *fname) {
    if (!luaapi_opt_type(L, opts, key, LUA_TNUMBER, fname, "a number"))
        return def;
    double v = lua_tonumber(L, -1);
    lua_pop(L, 1);
    if (!isfinite(v))
        luaL_error(L, "%s: option '%s' must be finite", fname, key);
    return v;
}

/* An integer option in [lo, hi]; def when absent. */
int64_t luaapi_opt_int(lua_State *L, int opts, const char *key, int64_t def, int64_t lo,
                              int64_t hi, const char *fname) {
    if (!luaapi_opt_type(L, opts, key, LUA_TNUMBER, fname, "an integer"))
        return def;
    int ok;
    lua_Integer v = lua_tointegerx(L, -1, &ok);
    lua_pop(L, 1);
    if (!ok || v < lo || v > hi)
        luaL_error(L, "%s: option '%s' must be an integer in %I..%I", fname, key,
                   (lua_Integer)lo, (lua_Integer)hi);
    return v;
}

/* Copies a string option into buf (n bytes); returns 0 when absent. */
int luaapi_opt_string(lua_State *L, int opts, const char *key, char *buf, size_t n,
                             const char *fname) {
    if (!luaapi_opt_type(L, opts, key, LUA_TSTRING, fname, "a string"))
        return 0;
    size_t len;
    const char *s = lua_tolstring(L, -1, &len);
    if (len >= n)
        luaL_error(L, "%s: option '%s' is longer than %d characters", fname, key, (int)n - 1);
    memcpy(buf, s, len + 1);
    lua_pop(L, 1);
    return 1;
}

/* The options table at idx (none or nil: 0), checked against allowed. */
int luaapi_options(lua_State *L, int idx, const char *fname, const char *const *allowed) {
    if (lua_isnoneornil(L, idx))
        return 0;
    if (!lua_istable(L, idx))
        luaL_typeerror(L, idx, "table of options");
    luaapi_check_options(L, idx, fname, allowed);
    return lua_absindex(L, idx);
}

/* ---- tensors -------------------------------------------------------------- */

void luaapi_push_tensor(lua_State *L, int id) {
    luaapi_tensor *t = lua_newuserdatauv(L, sizeof *t, 0);
    t->id = id;
    luaL_setmetatable(L, LUAAPI_TENSOR);
}

int luaapi_is_tensor(lua_State *L, int idx) {
    return luaL_testudata(L, idx, LUAAPI_TENSOR) != NULL;
}

/* The graph tensor index of the tensor argument at idx. */
int luaapi_check_tensor(lua_State *L, int idx) {
    luaapi_tensor *t = luaL_testudata(L, idx, LUAAPI_TENSOR);
    if (!t)
        luaL_typeerror(L, idx, "tensor");
    return t->id;
}

/* A tensor option (nil when absent): its index, or -1. */
int luaapi_opt_tensor(lua_State *L, int opts, const char *key, const char *fname) {
    if (!opts || lua_getfield(L, opts, key) == LUA_TNIL) {
        if (opts)
            lua_pop(L, 1);
        return -1;
    }
    luaapi_tensor *t = luaL_testudata(L, -1, LUAAPI_TENSOR);
    if (!t)
        luaL_error(L, "%s: option '%s' must be a tensor, got a %s", fname, key,
                   luaL_typename(L, -1));
    lua_pop(L, 1);
    return t->id;
}

static const graph_tensor *luaapi_tensor_of(lua_State *L) {
    luaapi_tensor *t = luaL_checkudata(L, 1, LUAAPI_TENSOR);
    return &luaapi_graph(L)->tensors[t->id];
}

static int luaapi_tensor_index(lua_State *L) {
    const graph_tensor *t = luaapi_tensor_of(L);
    const char *key = luaL_checkstring(L, 2);
    if (strcmp(key, "name") == 0) {
        lua_pushstring(L, t->name);
    } else if (strcmp(key, "dtype") == 0) {
        lua_pushstring(L, stof_dtype_name(t->dtype));
    } else if (strcmp(key, "ndim") == 0) {
        lua_pushinteger(L, t->ndim);
    } else if (strcmp(key, "shape") == 0) {
        lua_createtable(L, t->ndim, 0);
        for (int d = 0; d < t->ndim; d++) {
            lua_pushinteger(L, t->shape[d]);
            lua_rawseti(L, -2, d + 1);
        }
    } else {
        return luaL_error(L, "a tensor has no field '%s' (name, shape, dtype, ndim)", key);
    }
    return 1;
}

static int luaapi_tensor_tostring(lua_State *L) {
    const graph_tensor *t = luaapi_tensor_of(L);
    char shape[160];
    lua_pushfstring(L, "tensor '%s' %s %s", t->name, graph_shape_str(t, shape, sizeof shape),
                    stof_dtype_name(t->dtype));
    return 1;
}

static int luaapi_tensor_eq(lua_State *L) {
    luaapi_tensor *a = luaL_testudata(L, 1, LUAAPI_TENSOR);
    luaapi_tensor *b = luaL_testudata(L, 2, LUAAPI_TENSOR);
    lua_pushboolean(L, a && b && a->id == b->id);
    return 1;
}

/* ---- declared tensors: inputs and weights ---------------------------------- */

stof_dtype luaapi_dtype(lua_State *L, const char *name, int allow_int, const char *fname) {
    static const char *const names[] = {"fp32", "fp16", "bf16", "int32"};
    static const stof_dtype types[] = {STOF_F32, STOF_F16, STOF_BF16, STOF_I32};
    for (int k = 0; k < 3 + allow_int; k++)
        if (strcmp(name, names[k]) == 0)
            return types[k];
    luaL_error(L, "%s: unknown dtype '%s' (fp16, bf16, fp32%s)", fname, name,
               allow_int ? ", int32" : "");
    return STOF_F32;
}

/* Fills name, shape and line of t from arguments 2 (name) and 3 (shape). */
static void luaapi_read_decl(lua_State *L, graph_tensor *t) {
    size_t len;
    const char *name = luaL_checklstring(L, 2, &len);
    if (len == 0 || len >= GRAPH_NAME_MAX)
        luaL_argerror(L, 2, lua_pushfstring(L, "a name of 1 to %d characters",
                                            GRAPH_NAME_MAX - 1));
    memcpy(t->name, name, len + 1);
    luaL_checktype(L, 3, LUA_TTABLE);
    lua_Integer n = luaL_len(L, 3);
    if (n < 1 || n > GRAPH_MAX_DIMS)
        luaL_argerror(L, 3, lua_pushfstring(L, "a shape has 1 to %d dimensions, got %I",
                                            GRAPH_MAX_DIMS, n));
    t->ndim = (int)n;
    for (int d = 0; d < t->ndim; d++) {
        lua_geti(L, 3, d + 1);
        int ok;
        lua_Integer v = lua_tointegerx(L, -1, &ok);
        if (!ok)
            luaL_argerror(L, 3, lua_pushfstring(L, "shape[%d] must be an integer, got %s",
                                                d + 1, luaL_tolstring(L, -1, NULL)));
        t->shape[d] = v;
        lua_pop(L, 1);
    }
    t->line = luaapi_line(L);
}

static int luaapi_declare(lua_State *L, const graph_tensor *t) {
    stof_error e;
    int id;
    if (graph_add_tensor(luaapi_graph(L), t, &id, &e) != STOF_OK)
        return luaL_error(L, "%s", e.msg);
    luaapi_push_tensor(L, id);
    return 1;
}

luaapi_model *luaapi_self(lua_State *L) {
    return luaL_checkudata(L, 1, LUAAPI_MODEL);
}

/* m:input(name, shape, {dtype =, high =, scale =, attention_mask =, optional =}) */
static int luaapi_input(lua_State *L) {
    static const char *const allowed[] = {"dtype", "high", "scale", "attention_mask", "optional",
                                          NULL};
    luaapi_model *m = luaapi_self(L);
    graph_tensor t;
    memset(&t, 0, sizeof t);
    luaapi_read_decl(L, &t);
    int opts = luaapi_options(L, 4, "input", allowed);
    char dtype[16];
    t.role = GRAPH_INPUT;
    t.dtype = luaapi_opt_string(L, opts, "dtype", dtype, sizeof dtype, "input")
                  ? luaapi_dtype(L, dtype, 1, "input")
                  : m->dtype;
    if (luaapi_opt_bool(L, opts, "attention_mask", 0, "input")) {
        if (t.dtype != STOF_I32 || t.ndim != 2)
            return luaL_error(L, "input '%s': an attention_mask is int32 [batch, seq]", t.name);
        t.init = GRAPH_INIT_PADDING;
        t.init_high = 2;
        return luaapi_declare(L, &t);
    }
    int64_t high = luaapi_opt_int(L, opts, "high", 0, 1, INT32_MAX, "input");
    if (t.dtype == STOF_I32 && high == 0)
        return luaL_error(L, "input '%s': int32 inputs need high = the vocabulary size", t.name);
    if (t.dtype != STOF_I32 && high != 0)
        return luaL_error(L, "input '%s': high applies to int32 inputs only", t.name);
    t.init = t.dtype == STOF_I32 ? GRAPH_INIT_TOKENS : GRAPH_INIT_UNIFORM;
    t.init_high = high;
    /* optional: a run may leave it out, and it is then zeros (token_type_ids) */
    t.optional = luaapi_opt_bool(L, opts, "optional", 0, "input");
    if (t.optional)
        t.init = GRAPH_INIT_ZEROS;
    t.init_scale = (float)luaapi_opt_number(L, opts, "scale", 1.0, "input");
    return luaapi_declare(L, &t);
}

/* The default init scale: fan-in scaled for matrices, small for vectors. */
static double luaapi_default_scale(const graph_tensor *t, graph_init_kind init) {
    if (init == GRAPH_INIT_ONES)
        return 0.1;
    if (init == GRAPH_INIT_ZEROS)
        return 0.0;
    return t->ndim >= 2 ? 1.0 / sqrt((double)t->shape[t->ndim - 1]) : 0.02;
}

/* from = {"a", "b", ...}: the checkpoint tensors a weight file assembles the
 * weight from (into parts); returns their count, 0 when absent. */
/* opts.from_rows: the rows of each of the n parts (a list of n integers), into rows; 0
 * when absent (equal parts). */
static int luaapi_weight_from_rows(lua_State *L, int opts, const char *weight, int n,
                                   int64_t *rows) {
    if (!opts || lua_getfield(L, opts, "from_rows") == LUA_TNIL) {
        if (opts)
            lua_pop(L, 1);
        return 0;
    }
    if (!lua_istable(L, -1) || luaL_len(L, -1) != n || n == 0)
        luaL_error(L, "weight '%s': from_rows must list the rows of each of the %d parts of "
                   "'from'", weight, n);
    for (int k = 0; k < n; k++) {
        int ok = 0;
        rows[k] = lua_geti(L, -1, k + 1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &ok) : 0;
        if (!ok || rows[k] < 1)
            luaL_error(L, "weight '%s': from_rows[%d] must be a positive integer", weight, k + 1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return 1;
}

static int luaapi_weight_from(lua_State *L, int opts, const char *weight,
                              char parts[][GRAPH_NAME_MAX]) {
    if (!opts || lua_getfield(L, opts, "from") == LUA_TNIL) {
        if (opts)
            lua_pop(L, 1);
        return 0;
    }
    lua_Integer n = lua_istable(L, -1) ? luaL_len(L, -1) : 0;
    if (n < 1 || n > GRAPH_MAX_SOURCE_PARTS)
        luaL_error(L, "weight '%s': option 'from' must be a list of 1 to %d tensor names",
                   weight, GRAPH_MAX_SOURCE_PARTS);
    for (int k = 0; k < (int)n; k++) {
        size_t len = 0;
        const char *s = lua_geti(L, -1, k + 1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
        if (!s || len == 0 || len >= GRAPH_NAME_MAX)
            luaL_error(L, "weight '%s': from[%d] must be a tensor name of 1 to %d characters",
                       weight, k + 1, GRAPH_NAME_MAX - 1);
        memcpy(parts[k], s, len + 1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    return (int)n;
}

/* opts.transposed: the weight [N, K] is the transpose of one checkpoint tensor [K, N], the
 * one of its own name or from's one name (GPT-2's Conv1D stores [in, out]). */
static int luaapi_weight_transposed(lua_State *L, int opts, const graph_tensor *t, int n_parts,
                                    int has_rows, double rows) {
    if (!luaapi_opt_bool(L, opts, "transposed", 0, "weight"))
        return 0;
    if (t->ndim != 2)
        luaL_error(L, "weight '%s': transposed takes a 2-D weight [N, K] (read from a [K, N] "
                   "checkpoint tensor), got %d-D", t->name, t->ndim);
    if (rows != 0)
        luaL_error(L, "weight '%s': transposed does not go with rows_from", t->name);
    if (n_parts > 1 || has_rows)
        luaL_error(L, "weight '%s': transposed reads one checkpoint tensor: from names at most "
                   "one (got %d), and from_rows does not go with it", t->name, n_parts);
    return 1;
}

/* m:weight(name, shape, {init =, scale =, dtype =, from =, from_rows =, rows_from =,
 *                        constant =, transposed =}) */
static int luaapi_weight(lua_State *L) {
    static const char *const allowed[] = {"init",      "scale",     "dtype",    "from",
                                          "from_rows", "rows_from", "constant", "transposed",
                                          NULL};
    static const char *const inits[] = {"uniform", "ones", "zeros", NULL};
    static const graph_init_kind init_of[] = {GRAPH_INIT_UNIFORM, GRAPH_INIT_ONES, GRAPH_INIT_ZEROS};
    luaapi_model *m = luaapi_self(L);
    graph_tensor t;
    memset(&t, 0, sizeof t);
    luaapi_read_decl(L, &t);
    int opts = luaapi_options(L, 4, "weight", allowed);
    char buf[16] = "uniform";
    t.role = GRAPH_WEIGHT;
    t.dtype = luaapi_opt_string(L, opts, "dtype", buf, sizeof buf, "weight")
                  ? luaapi_dtype(L, buf, 0, "weight")
                  : m->dtype;
    snprintf(buf, sizeof buf, "uniform");
    luaapi_opt_string(L, opts, "init", buf, sizeof buf, "weight");
    int k = 0;
    while (inits[k] && strcmp(inits[k], buf) != 0)
        k++;
    if (!inits[k])
        return luaL_error(L, "weight '%s': unknown init '%s' (uniform, ones, zeros)", t.name,
                          buf);
    t.init = init_of[k];
    double scale = luaapi_opt_number(L, opts, "scale", luaapi_default_scale(&t, t.init), "weight");
    if (scale < 0)
        return luaL_error(L, "weight '%s': scale must be >= 0", t.name);
    t.init_scale = (float)scale;
    /* a constant is exactly its init, never read from a file: zeros, or ones */
    t.constant = luaapi_opt_bool(L, opts, "constant", 0, "weight");
    if (t.constant && t.init == GRAPH_INIT_UNIFORM)
        return luaL_error(L, "weight '%s': a constant is init = \"zeros\" or \"ones\"", t.name);
    if (t.constant)
        t.init_scale = 0.0f;
    char parts[GRAPH_MAX_SOURCE_PARTS][GRAPH_NAME_MAX];
    const char *names[GRAPH_MAX_SOURCE_PARTS];
    int n_parts = luaapi_weight_from(L, opts, t.name, parts);
    int64_t part_rows[GRAPH_MAX_SOURCE_PARTS];
    int has_rows = luaapi_weight_from_rows(L, opts, t.name, n_parts, part_rows);
    double rows = luaapi_opt_number(L, opts, "rows_from", 0, "weight");
    int transposed = luaapi_weight_transposed(L, opts, &t, n_parts, has_rows, rows);
    if (t.constant && (n_parts > 0 || rows != 0 || transposed))
        return luaL_error(L, "weight '%s': a constant is read from no file (no from, rows_from, "
                          "transposed)", t.name);
    if (rows != 0 && (n_parts > 0 || rows < 1 || rows != (double)(int64_t)rows))
        return luaL_error(L, "weight '%s': rows_from must be a row index >= 1, and does not go "
                             "with from", t.name);
    luaapi_declare(L, &t);
    if (transposed) {
        stof_error e;
        const luaapi_tensor *w = lua_touserdata(L, -1);
        if (graph_set_source_transposed(luaapi_graph(L), w->id, n_parts ? parts[0] : NULL,
                                        &e) != STOF_OK)
            return luaL_error(L, "%s", e.msg);
        return 1;
    }
    if (rows > 0) {
        stof_error e;
        const luaapi_tensor *w = lua_touserdata(L, -1);
        if (graph_set_source_rows(luaapi_graph(L), w->id, (int64_t)rows, &e) != STOF_OK)
            return luaL_error(L, "%s", e.msg);
        return 1;
    }
    if (n_parts == 0)
        return 1;
    for (int i = 0; i < n_parts; i++)
        names[i] = parts[i];
    stof_error e;
    const luaapi_tensor *w = lua_touserdata(L, -1);
    if (graph_set_source(luaapi_graph(L), w->id, names, has_rows ? part_rows : NULL, n_parts,
                         &e) != STOF_OK)
        return luaL_error(L, "%s", e.msg);
    return 1;
}

/* ---- the model object ----------------------------------------------------- */

/* The declarations; the operators, m:layer and m:output are lua_model_ops.c's. */
static const luaL_Reg luaapi_model_methods[] = {
    {"input", luaapi_input},
    {"weight", luaapi_weight},
    {NULL, NULL}};

/* The methods table's __index: a method the model does not have. */
static int luaapi_model_unknown(lua_State *L) {
    const char *key = lua_tostring(L, 2);
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    const luaL_Reg *const tables[] = {luaapi_model_methods, luaapi_op_methods};
    int first = 1;
    for (int k = 0; k < 2; k++)
        for (const luaL_Reg *r = tables[k]; r->name; r++, first = 0) {
            luaL_addstring(&b, first ? "" : ", ");
            luaL_addstring(&b, r->name);
        }
    luaL_pushresult(&b);
    return luaL_error(L, "the model has no method or field '%s' (methods: %s)",
                      key ? key : luaL_typename(L, 2), lua_tostring(L, -1));
}

static int luaapi_model_tostring(lua_State *L) {
    luaapi_model *m = luaapi_self(L);
    const graph *g = luaapi_graph(L);
    lua_pushfstring(L, "model '%s' (%s, %d ops, %d tensors)", g->name, stof_dtype_name(m->dtype),
                    g->n_ops, g->n_tensors);
    return 1;
}

/* Metatables are hidden (__metatable) so a script cannot swap out __gc or
 * __index and reach behind the API. */
static void luaapi_hide_metatable(lua_State *L) {
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
}

static void luaapi_model_metatables(lua_State *L) {
    if (luaL_newmetatable(L, LUAAPI_TENSOR)) {
        static const luaL_Reg meta[] = {{"__index", luaapi_tensor_index},
                                        {"__tostring", luaapi_tensor_tostring},
                                        {"__eq", luaapi_tensor_eq},
                                        {NULL, NULL}};
        luaL_setfuncs(L, meta, 0);
        luaapi_hide_metatable(L);
    }
    lua_pop(L, 1);
    luaL_newmetatable(L, LUAAPI_MODEL);
    luaL_newlib(L, luaapi_model_methods);
    luaL_setfuncs(L, luaapi_op_methods, 0);
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, luaapi_model_unknown);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, -2);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, luaapi_model_tostring);
    lua_setfield(L, -2, "__tostring");
    luaapi_hide_metatable(L);
    lua_pop(L, 1);
}

/* stof.model{name =, dtype =} */
int luaapi_model_new(lua_State *L) {
    static const char *const allowed[] = {"name", "dtype", NULL};
    luaapi_ctx *c = luaapi_ctx_of(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    luaapi_check_options(L, 1, "stof.model", allowed);
    if (c->model_made)
        return luaL_error(L, "stof.model may be called only once per script");
    char name[GRAPH_NAME_MAX] = "model", dtype[16] = "fp16";
    luaapi_opt_string(L, 1, "name", name, sizeof name, "stof.model");
    luaapi_opt_string(L, 1, "dtype", dtype, sizeof dtype, "stof.model");
    stof_dtype t = luaapi_dtype(L, dtype, 0, "stof.model");
    luaapi_model_metatables(L);
    luaapi_model *m = lua_newuserdatauv(L, sizeof *m, 0);
    m->dtype = t;
    luaL_setmetatable(L, LUAAPI_MODEL);
    memcpy(c->g->name, name, sizeof name);
    c->model_made = 1;
    return 1;
}

int luaapi_is_model(lua_State *L, int idx) {
    return luaL_testudata(L, idx, LUAAPI_MODEL) != NULL;
}
