/* The model object's operator methods (m:gemm, m:linear, m:attention, ...), m:layer and
 * m:output: each reads its tensors and options, adds its op to the graph at the calling
 * script line and returns the op's output tensor (lua_model.c has the objects and the option
 * readers). Mistakes are reported at the script's line. */
#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/lua/lua_model.h"
#include "ops/ops.h"

/* ---- operators ------------------------------------------------------------ */

/* Starts an op of kind at the calling script line, named from opts. */
static void luaapi_op_begin(lua_State *L, graph_op *op, op_kind kind, int opts,
                            const char *fname) {
    memset(op, 0, sizeof *op);
    op->kind = kind;
    op->line = luaapi_line(L);
    luaapi_opt_string(L, opts, "name", op->name, sizeof op->name, fname);
}

/* Adds op and returns its output tensor index; graph errors become script
 * errors at the calling line. */
static int luaapi_op_add(lua_State *L, const graph_op *op) {
    stof_error e;
    int out;
    if (op_add(luaapi_graph(L), op, &out, &e) != STOF_OK)
        luaL_error(L, "%s", e.msg);
    return out;
}

static int luaapi_op_push(lua_State *L, const graph_op *op) {
    luaapi_push_tensor(L, luaapi_op_add(L, op));
    return 1;
}

static const char *const luaapi_opts_name[] = {"name", NULL};

/* m:gemm(x, w, {kn =, name =}) */
static int luaapi_gemm(lua_State *L) {
    static const char *const allowed[] = {"kn", "name", NULL};
    luaapi_self(L);
    graph_op op;
    int x = luaapi_check_tensor(L, 2), w = luaapi_check_tensor(L, 3);
    int opts = luaapi_options(L, 4, "gemm", allowed);
    luaapi_op_begin(L, &op, OP_GEMM, opts, "gemm");
    op.inputs[0] = x;
    op.inputs[1] = w;
    op.n_inputs = 2;
    op.attr.gemm.weight_kn = luaapi_opt_bool(L, opts, "kn", 0, "gemm");
    return luaapi_op_push(L, &op);
}

/* A two-input op's inputs and its options (allowed keys): returns the options' index. */
static int luaapi_binary_op(lua_State *L, op_kind kind, const char *fname,
                            const char *const *allowed, graph_op *op) {
    luaapi_self(L);
    int a = luaapi_check_tensor(L, 2), b = luaapi_check_tensor(L, 3);
    int opts = luaapi_options(L, 4, fname, allowed);
    luaapi_op_begin(L, op, kind, opts, fname);
    op->inputs[0] = a;
    op->inputs[1] = b;
    op->n_inputs = 2;
    return opts;
}

/* Two-input ops with only a name option: bias(x, b). */
static int luaapi_binary(lua_State *L, op_kind kind, const char *fname) {
    graph_op op;
    luaapi_binary_op(L, kind, fname, luaapi_opts_name, &op);
    return luaapi_op_push(L, &op);
}

static int luaapi_bias(lua_State *L) {
    return luaapi_binary(L, OP_BIAS, "bias");
}

/* m:add(a, b, {dtype =, name =}): with dtype, the sum is stored as that dtype whatever a's and
 * b's are (a residual stream in fp32 beside a model in f16 or bf16). */
static int luaapi_add(lua_State *L) {
    static const char *const allowed[] = {"dtype", "name", NULL};
    graph_op op;
    int opts = luaapi_binary_op(L, OP_ADD, "add", allowed, &op);
    char dtype[16];
    if (luaapi_opt_string(L, opts, "dtype", dtype, sizeof dtype, "add")) {
        op.attr.add.has_dtype = 1;
        op.attr.add.dtype = luaapi_dtype(L, dtype, 0, "add");
    }
    return luaapi_op_push(L, &op);
}

/* m:linear(x, w, b_or_nil, {kn =, name =}): gemm, then bias when b is given.
 * With a name, the gemm is "<name>.gemm" and the bias "<name>" (the name is
 * the linear's output either way). */
static int luaapi_linear(lua_State *L) {
    static const char *const allowed[] = {"kn", "name", NULL};
    luaapi_self(L);
    int x = luaapi_check_tensor(L, 2), w = luaapi_check_tensor(L, 3);
    int has_bias = !lua_isnoneornil(L, 4);
    int b = has_bias ? luaapi_check_tensor(L, 4) : -1;
    int opts = luaapi_options(L, 5, "linear", allowed);
    graph_op op;
    luaapi_op_begin(L, &op, OP_GEMM, opts, "linear");
    char name[GRAPH_NAME_MAX];
    memcpy(name, op.name, sizeof name);
    if (has_bias && name[0])
        snprintf(op.name, sizeof op.name, "%.*s.gemm", GRAPH_NAME_MAX - 6, name);
    op.inputs[0] = x;
    op.inputs[1] = w;
    op.n_inputs = 2;
    op.attr.gemm.weight_kn = luaapi_opt_bool(L, opts, "kn", 0, "linear");
    int y = luaapi_op_add(L, &op);
    if (!has_bias) {
        luaapi_push_tensor(L, y);
        return 1;
    }
    luaapi_op_begin(L, &op, OP_BIAS, 0, "linear");
    memcpy(op.name, name, sizeof op.name);
    op.inputs[0] = y;
    op.inputs[1] = b;
    op.n_inputs = 2;
    return luaapi_op_push(L, &op);
}

/* m:layernorm(x, gamma, beta, {eps =, name =}) */
static int luaapi_layernorm(lua_State *L) {
    static const char *const allowed[] = {"eps", "name", NULL};
    luaapi_self(L);
    graph_op op;
    int x = luaapi_check_tensor(L, 2), gamma = luaapi_check_tensor(L, 3);
    int beta = luaapi_check_tensor(L, 4);
    int opts = luaapi_options(L, 5, "layernorm", allowed);
    luaapi_op_begin(L, &op, OP_LAYERNORM, opts, "layernorm");
    op.inputs[0] = x;
    op.inputs[1] = gamma;
    op.inputs[2] = beta;
    op.n_inputs = 3;
    op.attr.norm.eps = (float)luaapi_opt_number(L, opts, "eps", 1e-5, "layernorm");
    return luaapi_op_push(L, &op);
}

/* m:rmsnorm(x, gamma, {eps =, name =}) */
static int luaapi_rmsnorm(lua_State *L) {
    static const char *const allowed[] = {"eps", "name", NULL};
    luaapi_self(L);
    graph_op op;
    int x = luaapi_check_tensor(L, 2), gamma = luaapi_check_tensor(L, 3);
    int opts = luaapi_options(L, 4, "rmsnorm", allowed);
    luaapi_op_begin(L, &op, OP_RMSNORM, opts, "rmsnorm");
    op.inputs[0] = x;
    op.inputs[1] = gamma;
    op.n_inputs = 2;
    op.attr.norm.eps = (float)luaapi_opt_number(L, opts, "eps", 1e-6, "rmsnorm");
    return luaapi_op_push(L, &op);
}

/* One-input ops: gelu(x, {tanh =, name =}), relu(x), softmax(x). */
static int luaapi_unary(lua_State *L, op_kind kind, const char *fname,
                        const char *const *allowed) {
    luaapi_self(L);
    graph_op op;
    int x = luaapi_check_tensor(L, 2);
    int opts = luaapi_options(L, 3, fname, allowed);
    luaapi_op_begin(L, &op, kind, opts, fname);
    op.inputs[0] = x;
    op.n_inputs = 1;
    if (kind == OP_GELU)
        op.attr.gelu.tanh = luaapi_opt_bool(L, opts, "tanh", 0, fname);
    return luaapi_op_push(L, &op);
}

static int luaapi_gelu(lua_State *L) {
    static const char *const allowed[] = {"tanh", "name", NULL};
    return luaapi_unary(L, OP_GELU, "gelu", allowed);
}

static int luaapi_relu(lua_State *L) {
    return luaapi_unary(L, OP_RELU, "relu", luaapi_opts_name);
}

/* m:glu(x, {act = "gelu" | "gelu_tanh" | "silu", name =}): act(x[..., :F]) * x[..., F:] */
static int luaapi_glu(lua_State *L) {
    static const char *const allowed[] = {"act", "name", NULL};
    static const char *const acts[] = {"gelu", "gelu_tanh", "silu", NULL};
    luaapi_self(L);
    graph_op op;
    int x = luaapi_check_tensor(L, 2);
    int opts = luaapi_options(L, 3, "glu", allowed);
    luaapi_op_begin(L, &op, OP_GLU, opts, "glu");
    char act[16] = "gelu";
    luaapi_opt_string(L, opts, "act", act, sizeof act, "glu");
    int k = 0;
    while (acts[k] && strcmp(acts[k], act) != 0)
        k++;
    if (!acts[k])
        return luaL_error(L, "glu: unknown act '%s' (gelu, gelu_tanh, silu)", act);
    op.attr.glu.act = k; /* OP_GLU_GELU, OP_GLU_GELU_TANH, OP_GLU_SILU in that order */
    op.inputs[0] = x;
    op.n_inputs = 1;
    return luaapi_op_push(L, &op);
}

/* m:mask_rows(x, mask, {name =}): x where mask[b, s] != 0, zeros elsewhere */
static int luaapi_mask_rows(lua_State *L) {
    return luaapi_binary(L, OP_MASK_ROWS, "mask_rows");
}

/* m:rotary(qkv, {heads =, head_dim =, theta =, kv_heads =, name =}): RoPE on Q and K */
static int luaapi_rotary(lua_State *L) {
    static const char *const allowed[] = {"heads", "head_dim", "theta", "kv_heads", "name",
                                          NULL};
    luaapi_self(L);
    graph_op op;
    int x = luaapi_check_tensor(L, 2);
    int opts = luaapi_options(L, 3, "rotary", allowed);
    luaapi_op_begin(L, &op, OP_ROTARY, opts, "rotary");
    int heads = (int)luaapi_opt_int(L, opts, "heads", 0, 1, 4096, "rotary");
    if (!heads)
        return luaL_error(L, "rotary: 'heads' is needed");
    op.attr.rotary.heads = heads;
    op.attr.rotary.kv_heads = (int)luaapi_opt_int(L, opts, "kv_heads", heads, 1, 4096, "rotary");
    op.attr.rotary.head_dim = (int)luaapi_opt_int(L, opts, "head_dim", 0, 2, 1024, "rotary");
    op.attr.rotary.theta = (float)luaapi_opt_number(L, opts, "theta", 10000.0, "rotary");
    op.inputs[0] = x;
    op.n_inputs = 1;
    return luaapi_op_push(L, &op);
}

static int luaapi_softmax(lua_State *L) {
    return luaapi_unary(L, OP_SOFTMAX, "softmax", luaapi_opts_name);
}

/* m:embedding(ids, word, {position =, token_type =, name =}) */
static int luaapi_embedding(lua_State *L) {
    static const char *const allowed[] = {"position", "token_type", "token_type_ids", "name",
                                          NULL};
    luaapi_self(L);
    graph_op op;
    int ids = luaapi_check_tensor(L, 2), word = luaapi_check_tensor(L, 3);
    int opts = luaapi_options(L, 4, "embedding", allowed);
    luaapi_op_begin(L, &op, OP_EMBEDDING, opts, "embedding");
    int pos = luaapi_opt_tensor(L, opts, "position", "embedding");
    int type = luaapi_opt_tensor(L, opts, "token_type", "embedding");
    int type_ids = luaapi_opt_tensor(L, opts, "token_type_ids", "embedding");
    if (type_ids >= 0 && type < 0)
        return luaL_error(L, "embedding: token_type_ids need the token_type table");
    op.inputs[op.n_inputs++] = ids;
    op.inputs[op.n_inputs++] = word;
    if (pos >= 0)
        op.inputs[op.n_inputs++] = pos;
    if (type >= 0)
        op.inputs[op.n_inputs++] = type;
    if (type_ids >= 0)
        op.inputs[op.n_inputs++] = type_ids;
    op.attr.embedding.has_position = pos >= 0;
    op.attr.embedding.has_type = type >= 0;
    op.attr.embedding.has_type_ids = type_ids >= 0;
    return luaapi_op_push(L, &op);
}

/* relpos = {table =, buckets =, max_distance =, bidirectional =} of the
 * attention options at opts; appends the table input. */
static void luaapi_relpos(lua_State *L, int opts, graph_op *op) {
    static const char *const allowed[] = {"table", "buckets", "max_distance", "bidirectional",
                                          NULL};
    if (lua_getfield(L, opts, "relpos") == LUA_TNIL) {
        lua_pop(L, 1);
        return;
    }
    if (!lua_istable(L, -1))
        luaL_error(L, "attention: option 'relpos' must be a table, got a %s",
                   luaL_typename(L, -1));
    int rp = lua_absindex(L, -1);
    luaapi_check_options(L, rp, "attention relpos", allowed);
    int table = luaapi_opt_tensor(L, rp, "table", "attention relpos");
    if (table < 0)
        luaL_error(L, "attention: relpos needs table = the [buckets, heads] bias tensor");
    op_attention *a = &op->attr.attn;
    a->relpos = 1;
    a->relpos_buckets = (int)luaapi_opt_int(L, rp, "buckets", 32, 1, 1 << 20, "attention relpos");
    a->relpos_max_distance =
        (int)luaapi_opt_int(L, rp, "max_distance", 128, 1, 1 << 30, "attention relpos");
    a->relpos_bidirectional = luaapi_opt_bool(L, rp, "bidirectional", 1, "attention relpos");
    op->inputs[op->n_inputs++] = table;
    lua_pop(L, 1);
}

/* The mask option: its graph mask index, or -1 for none. */
static int luaapi_attention_mask(lua_State *L, int opts, const graph_op *op) {
    if (lua_getfield(L, opts, "mask") == LUA_TNIL) {
        lua_pop(L, 1);
        return -1;
    }
    const graph *g = luaapi_graph(L);
    const graph_tensor *q = &g->tensors[op->inputs[0]];
    const graph_tensor *kv = &g->tensors[op->inputs[op->attr.attn.cross ? 1 : 0]];
    if (q->ndim != 3 || kv->ndim != 3)
        luaL_error(L, "attention: inputs must be [batch, seq, features], got %d and %d dims",
                   q->ndim, kv->ndim);
    int id = luaapi_mask_attach(L, -1, (int)q->shape[0], (int)q->shape[1], (int)kv->shape[1]);
    lua_pop(L, 1);
    return id;
}

/* global = the global_mask input, global_qkv = the global rows' projections (optional):
 * Longformer's global tokens. The op's checks say what may not go with them. */
static void luaapi_attention_global(lua_State *L, int opts, graph_op *op) {
    int global = luaapi_opt_tensor(L, opts, "global", "attention");
    int gqkv = luaapi_opt_tensor(L, opts, "global_qkv", "attention");
    if (gqkv >= 0 && global < 0)
        luaL_error(L, "attention: global_qkv needs global = the global_mask input");
    if (global < 0)
        return;
    op->attr.attn.global_keys = 1;
    op->inputs[op->n_inputs++] = global;
    if (gqkv >= 0) {
        op->attr.attn.global_qkv = 1;
        op->inputs[op->n_inputs++] = gqkv;
    }
}

/* m:attention(qkv, opts) or m:attention(q, kv, opts) (cross-attention). */
static int luaapi_attention(lua_State *L) {
    static const char *const allowed[] = {"heads", "head_dim", "kv_heads", "mask", "causal",
                                          "scale", "relpos", "padding", "global",
                                          "global_qkv", "name", NULL};
    luaapi_self(L);
    graph_op op;
    int cross = luaapi_is_tensor(L, 3);
    int first = luaapi_check_tensor(L, 2);
    int second = cross ? luaapi_check_tensor(L, 3) : -1;
    int opts_idx = cross ? 4 : 3;
    luaL_checktype(L, opts_idx, LUA_TTABLE);
    int opts = luaapi_options(L, opts_idx, "attention", allowed);
    luaapi_op_begin(L, &op, OP_ATTENTION, opts, "attention");
    op_attention *a = &op.attr.attn;
    a->heads = (int)luaapi_opt_int(L, opts, "heads", 0, 1, 1 << 16, "attention");
    a->head_dim = (int)luaapi_opt_int(L, opts, "head_dim", 0, 1, 1 << 16, "attention");
    if (!a->heads || !a->head_dim)
        return luaL_error(L, "attention: heads and head_dim are required");
    a->kv_heads = (int)luaapi_opt_int(L, opts, "kv_heads", a->heads, 1, 1 << 16, "attention");
    a->cross = cross;
    a->causal = luaapi_opt_bool(L, opts, "causal", 0, "attention");
    a->scale = (float)luaapi_opt_number(L, opts, "scale", 1.0 / sqrt((double)a->head_dim),
                                        "attention");
    op.inputs[op.n_inputs++] = first;
    if (cross)
        op.inputs[op.n_inputs++] = second;
    int padding = luaapi_opt_tensor(L, opts, "padding", "attention");
    if (padding >= 0 && cross)
        return luaL_error(L, "attention: padding applies to self-attention only");
    if (padding >= 0) {
        a->padded = 1;
        op.inputs[op.n_inputs++] = padding;
    }
    luaapi_attention_global(L, opts, &op);
    luaapi_relpos(L, opts, &op);
    a->mask = luaapi_attention_mask(L, opts, &op);
    return luaapi_op_push(L, &op);
}

/* m:layer(function(i) ... end): the function's ops form layer i. Returns
 * what the function returns. */
static int luaapi_layer(lua_State *L) {
    luaapi_self(L);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_settop(L, 2);
    graph *g = luaapi_graph(L);
    if (g->current_layer >= 0)
        return luaL_error(L, "m:layer calls cannot nest (layer %d is open)", g->current_layer);
    graph_begin_layer(g);
    lua_pushvalue(L, 2);
    lua_pushinteger(L, g->current_layer);
    int status = lua_pcall(L, 1, LUA_MULTRET, 0);
    graph_end_layer(g); /* also on error: a script may pcall m:layer */
    if (status != LUA_OK)
        return luaapi_rethrow(L, status);
    return lua_gettop(L) - 2;
}

/* m:output(t): marks t as the model's output; returns t. */
static int luaapi_output(lua_State *L) {
    luaapi_self(L);
    int t = luaapi_check_tensor(L, 2);
    stof_error e;
    if (graph_set_output(luaapi_graph(L), t, &e) != STOF_OK)
        return luaL_error(L, "%s", e.msg);
    lua_settop(L, 2);
    return 1;
}

const luaL_Reg luaapi_op_methods[] = {
    {"gemm", luaapi_gemm},
    {"bias", luaapi_bias},
    {"linear", luaapi_linear},
    {"add", luaapi_add},
    {"layernorm", luaapi_layernorm},
    {"rmsnorm", luaapi_rmsnorm},
    {"gelu", luaapi_gelu},
    {"relu", luaapi_relu},
    {"glu", luaapi_glu},
    {"mask_rows", luaapi_mask_rows},
    {"rotary", luaapi_rotary},
    {"softmax", luaapi_softmax},
    {"embedding", luaapi_embedding},
    {"attention", luaapi_attention},
    {"layer", luaapi_layer},
    {"output", luaapi_output},
    {NULL, NULL}};
