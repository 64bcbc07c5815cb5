/* stof.config: a model's JSON configuration as a Lua value. The host read
 * and parsed the file (core/io/model_dir.c); the script only sees the
 * table, so it stays sandboxed. */
#include <cjson/cJSON.h>
#include <lauxlib.h>
#include <lua.h>
#include <math.h>

#include "core/lua/lua_api.h"

/* A JSON number: a Lua integer where it is integral and fits, else a float
 * (hidden_size is an integer to the script, layer_norm_eps a float). */
static void push_number(lua_State *L, double d) {
    if (d == floor(d) && fabs(d) < 9007199254740992.0)
        lua_pushinteger(L, (lua_Integer)d);
    else
        lua_pushnumber(L, d);
}

void luaapi_push_json(lua_State *L, const cJSON *v) {
    luaL_checkstack(L, 4, "config nested too deep");
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        lua_createtable(L, cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0,
                        cJSON_IsObject(v) ? cJSON_GetArraySize(v) : 0);
        lua_Integer i = 0;
        for (const cJSON *e = v->child; e; e = e->next) {
            i++; /* a null keeps its place in an array: a hole, as Lua has it */
            if (cJSON_IsNull(e))
                continue;
            luaapi_push_json(L, e);
            if (cJSON_IsArray(v))
                lua_rawseti(L, -2, i);
            else
                lua_setfield(L, -2, e->string);
        }
    } else if (cJSON_IsString(v)) {
        lua_pushstring(L, v->valuestring);
    } else if (cJSON_IsNumber(v)) {
        push_number(L, v->valuedouble);
    } else if (cJSON_IsBool(v)) {
        lua_pushboolean(L, cJSON_IsTrue(v));
    } else {
        lua_pushnil(L);
    }
}
