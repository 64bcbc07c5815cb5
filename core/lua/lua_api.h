/* The Lua 5.4 API that turns a model script into a graph.
 *
 * A script runs sandboxed (no io, os, debug, package, dofile/loadfile, no
 * binary chunks; `require` only finds helper modules beside the script or in
 * the installed scripts folder), under an instruction and memory budget.
 * Every error comes back as "script.lua:LINE: what was wrong". The script's
 * file, hash and resolved parameters come back as a graph_script
 * (core/graph/script.h). */
#ifndef STOF_CORE_LUA_API_H
#define STOF_CORE_LUA_API_H

#include <stdint.h>

#include "core/graph/graph.h"
#include "core/graph/script.h"

/* Runs the script at path with "key=value" parameters and builds *g (which
 * must be graph_init'ed and empty). On failure g is left freed/empty and err
 * holds the message. info may be NULL. */
int lua_api_build(const char *path, const char *const *params, int n_params, graph *g,
                  graph_script *info, stof_error *err);

/* lua_api_build with a model's configuration (a Hugging Face config.json,
 * parsed by the host: core/io/model_dir.h) handed to the script as the
 * table stof.config: objects become tables, arrays sequences (from 1),
 * numbers integers where they are integral, null absent. config NULL: no
 * stof.config (as lua_api_build). */
struct cJSON;
int lua_api_build_config(const char *path, const char *const *params, int n_params,
                         const struct cJSON *config, graph *g, graph_script *info,
                         stof_error *err);

/* A Hugging Face model directory (config.json and its weights: core/io/
 * model_dir.h) to *g: script NULL runs the shipped script for its
 * model_type (lua_api_find_script), else the given one; either gets the
 * config as stof.config. info->model_dir records dir. An unsupported
 * model_type names the supported ones. */
int lua_api_build_dir(const char *dir, const char *script, const char *const *params,
                      int n_params, graph *g, graph_script *info, stof_error *err);

/* The model of info built again (its script, with its model directory's config when it has
 * one) with the parameters it resolved, `set` ("key=value") replacing theirs: the same model
 * at another shape. out_info may be NULL. */
int lua_api_rebuild(const graph_script *info, const char *const *set, int n_set, graph *g,
                    graph_script *out_info, stof_error *err);
/* lua_api_rebuild at (batch, seq), g graph_init'ed here. */
int lua_api_rebuild_at(const graph_script *info, int batch, int seq, graph *g, stof_error *err);

/* The path of the shipped script `name`: the first folder that holds it of
 * $STOF_SCRIPTS_DIR, ../share/stof/scripts beside the running program, the
 * same beside the library, the install prefix's, the source tree's. */
int lua_api_find_script(const char *name, char *out, size_t cap, stof_error *err);

/* Same, with the script text given (chunkname is used in messages, e.g.
 * "model.lua"). Helper modules for `require` are looked up in search_dir
 * (may be NULL). */
int lua_api_build_string(const char *source, const char *chunkname, const char *search_dir,
                         const char *const *params, int n_params, graph *g,
                         graph_script *info, stof_error *err);

/* Budgets a script runs under. A zero field takes the default. */
#define LUA_API_DEFAULT_INSTRUCTIONS 1000000000ULL
#define LUA_API_DEFAULT_MEMORY ((size_t)2 << 30)

typedef struct lua_api_limits {
    uint64_t instructions; /* Lua VM instructions, predicates and helper modules included */
    size_t memory;         /* bytes the Lua state may hold at once */
} lua_api_limits;

/* lua_api_build_string under explicit limits (NULL: the defaults); tests use
 * it to reach the budgets quickly. */
int lua_api_build_string_limits(const char *source, const char *chunkname,
                                const char *search_dir, const char *const *params,
                                int n_params, const lua_api_limits *limits, graph *g,
                                graph_script *info, stof_error *err);

/* ---- shared by core/lua_*.c only ------------------------------------------
 * lua_api.c runs the script and owns the `stof` table, lua_model.c the model
 * and tensor objects, lua_mask.c the `stof.mask` table, lua_sandbox.c the
 * restricted globals and budgets. One luaapi_ctx per run, reached from any
 * lua_State through its allocator's user data (lua_getallocf). */
struct lua_State;

typedef struct luaapi_ctx {
    graph *g;
    char chunkname[256];          /* "bert.lua": the name messages start with */
    char script_dir[1024];        /* where `require` looks first ("" for none) */
    char search_dir[1024];        /* where it looks next ("" for none) */
    const char *const *params;    /* the command line's "key=value" */
    const struct cJSON *config;   /* stof.config's source, or NULL */
    int n_params;
    int params_done;              /* stof.params ran */
    graph_script *info;         /* may be NULL */
    int model_made;               /* stof.model ran */
    int frozen;                   /* the model was validated: nothing may change it */
    size_t mem_used, mem_limit;
    uint64_t hook_calls, hook_max; /* count-hook calls so far, allowed */
    uint64_t alloc_work;          /* bytes allocated since the last instruction charged */
    struct lua_State *main;       /* the run's state, for the hook (lua_sandbox.c) */
    int hook_every;               /* instructions between hook calls */
    uint64_t instructions;        /* the budget, for the message */
    int fatal;                    /* LUAAPI_FATAL_*: no pcall may swallow it */
    char fatal_msg[320];          /* the budget message, with the line it stopped at */
    struct lua_State *active;     /* the thread running a mask build, for predicates */
    char pred_error[1024];        /* the Lua message of a predicate that failed */
} luaapi_ctx;

enum { LUAAPI_FATAL_NONE = 0, LUAAPI_FATAL_TIME, LUAAPI_FATAL_MEMORY };

/* lua_sandbox.c */
void *luaapi_alloc(void *ud, void *ptr, size_t osize, size_t nsize);
void luaapi_open_sandbox(struct lua_State *L);
luaapi_ctx *luaapi_ctx_of(struct lua_State *L);
/* Re-raises the error a lua_pcall left on the stack (status != LUA_OK),
 * noting out-of-memory so that no script pcall can swallow it later. */
int luaapi_rethrow(struct lua_State *L, int status);
/* Charges bytes of C-side memory a script's call makes (mask patterns,
 * built masks) to its memory budget; raises, as out of memory, when the
 * budget has not that much left (what names the work). */
int luaapi_charge(struct lua_State *L, size_t bytes, const char *what);
/* Gives back what luaapi_charge took (when that memory is freed). */
void luaapi_uncharge(luaapi_ctx *c, size_t bytes);
/* The line of the script that called the running C function (0 if none),
 * past C functions between them. */
int luaapi_line(struct lua_State *L);
/* The message handler of a whole run: a message raised where no script
 * frame is current (Lua's "C stack overflow" inside tostring or gsub) gets
 * the position of the nearest script line, as every other error has. */
int luaapi_where_msgh(struct lua_State *L);
/* Raises "script.lua:LINE: message" at that line (luaL_error names only the
 * direct caller, which may be a C function). */
int luaapi_error(struct lua_State *L, const char *fmt, ...);
/* Raises an error naming the first key of the options table at idx that is
 * not in allowed (NULL-terminated); fname names the function. */
void luaapi_check_options(struct lua_State *L, int idx, const char *fname,
                          const char *const *allowed);

/* lua_model.c: stof.model{name =, dtype =} (a lua_CFunction). */
int luaapi_model_new(struct lua_State *L);
/* 1 when the value at idx is a model object. */
int luaapi_is_model(struct lua_State *L, int idx);

/* lua_config.c: pushes JSON value v as a Lua value (stof.config). */
void luaapi_push_json(struct lua_State *L, const struct cJSON *v);

/* lua_mask.c: pushes the stof.mask table. */
void luaapi_open_mask(struct lua_State *L);
/* The graph mask for the mask object at idx built for (batch, q_len, k_len):
 * built and added to the graph on first use, then shared. Raises on error. */
int luaapi_mask_attach(struct lua_State *L, int idx, int batch, int q_len, int k_len);

#endif
