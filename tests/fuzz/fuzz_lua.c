/* Fuzz target: the Lua sandbox (core/lua). Whatever the script, it builds a
 * valid graph or fails with a message and an empty graph, within small
 * budgets: nothing it does escapes them (hangs would time the test out). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/lua/lua_api.h"
#include "fuzz.h"

const char *const fuzz_seeds[] = {
    "local m = stof.model{name = 't'}\n"
    "local x = m:input('x', {2, 8, 48})\n"
    "local w = stof.mask.sliding_window{band = 2} + stof.mask.global{width = 1}\n"
    "x = m:attention(x, {heads = 2, head_dim = 8, mask = w})\n"
    "m:output(m:gelu(x))\n"
    "return m\n",
    "local p = stof.params{n = 2}\n"
    "local m = stof.model{name = 't', dtype = 'bf16'}\n"
    "local x = m:input('x', {1, 4, 8})\n"
    "m:layer(function(i) x = m:relu(m:linear(x, m:weight('w' .. i, {8, 8}))) end)\n"
    "m:output(x)\n"
    "return m\n",
    "local ok, e = pcall(error, 'x')\n"
    "local t = setmetatable({}, {__index = function(t, k) return k end})\n"
    "local s = ('a,b,c'):gsub('%a', string.upper)\n"
    "local p = stof.mask.predicate(function(i, j) return i >= j end)\n"
    "return nil\n",
    NULL};

const char *const fuzz_words[] = {"stof.model{name = 'z'}", "m:input('y', {1, 2, 8})",
                                  "stof.mask.causal()", " + ", " * ", "while true do end",
                                  "xpcall(error, function() end)", "setmetatable({}, {__gc = 1})",
                                  "string.rep('x', 1 << 24)", "(('a'):rep(20)):find('a*a*a*b')",
                                  "load('return 1')", "require('x')", "pcall(", "end", "(", ")",
                                  "{", "}", "local ", "function() ", "return m", "\n", NULL};

size_t fuzz_seed_bytes(int k, uint8_t *buf, size_t cap) {
    (void)k, (void)buf, (void)cap;
    return 0;
}

int fuzz_one(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    graph g;
    graph_init(&g);
    stof_error err = {0};
    lua_api_limits lim = {200000, (size_t)64 << 20};
    int rc = lua_api_build_string_limits(text, "fuzz.lua", NULL, NULL, 0, &lim, &g, NULL, &err);
    int bad = 0;
    if (rc == STOF_OK && (g.n_ops < 0 || g.output < 0)) {
        fprintf(stderr, "fuzz_lua: a graph without an output passed\n");
        bad = 1;
    }
    if (rc != STOF_OK && (!err.msg[0] || g.n_ops || g.n_tensors || g.n_masks)) {
        fprintf(stderr, "fuzz_lua: a failure without a message or with a graph left: '%s'\n",
                err.msg);
        bad = 1;
    }
    graph_free(&g);
    free(text);
    return bad;
}
