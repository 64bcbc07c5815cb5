/* Inside core/lua: what the model object's two files share (lua_model.c: the objects, the
 * option readers, m:input and m:weight; lua_model_ops.c: the operator methods). */
#ifndef STOF_CORE_LUA_MODEL_H
#define STOF_CORE_LUA_MODEL_H

#include <lauxlib.h>
#include <stdint.h>

#include "core/lua/lua_api.h"

#define LUAAPI_MODEL "stof.model"

typedef struct luaapi_model {
    stof_dtype dtype;
} luaapi_model;

/* The graph the script builds; raises once the model was validated. */
graph *luaapi_graph(lua_State *L);
/* The model object at index 1 (raises otherwise). */
luaapi_model *luaapi_self(lua_State *L);

/* Options: opts is a stack index, or 0 for "no options"; fname names the function in
 * messages. A missing key gives def; a wrong type or a value out of range raises. */
int luaapi_opt_bool(lua_State *L, int opts, const char *key, int def, const char *fname);
double luaapi_opt_number(lua_State *L, int opts, const char *key, double def,
                         const char *fname);
int64_t luaapi_opt_int(lua_State *L, int opts, const char *key, int64_t def, int64_t lo,
                       int64_t hi, const char *fname);
/* The dtype named fp32, fp16, bf16 (or int32 when allow_int); a script error naming fname
 * otherwise. */
stof_dtype luaapi_dtype(lua_State *L, const char *name, int allow_int, const char *fname);
int luaapi_opt_string(lua_State *L, int opts, const char *key, char *buf, size_t n,
                      const char *fname);
/* The options table at idx (0 when absent), checked against allowed. */
int luaapi_options(lua_State *L, int idx, const char *fname, const char *const *allowed);

/* Tensor objects: a graph tensor index in a userdata. */
void luaapi_push_tensor(lua_State *L, int id);
int luaapi_is_tensor(lua_State *L, int idx);
int luaapi_check_tensor(lua_State *L, int idx);
/* The tensor option key, or -1 when absent. */
int luaapi_opt_tensor(lua_State *L, int opts, const char *key, const char *fname);

/* lua_model_ops.c: the operator methods of the model object. */
extern const luaL_Reg luaapi_op_methods[];

#endif
