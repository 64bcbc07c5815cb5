/* The script a graph was built from: its file, content hash and the
 * parameters it resolved. The Lua room (core/lua) fills it while it builds
 * the graph; a plan records it and checks a script against it. */
#ifndef STOF_CORE_GRAPH_SCRIPT_H
#define STOF_CORE_GRAPH_SCRIPT_H

#include <stdint.h>

#define GRAPH_SCRIPT_MAX_PARAMS 64

/* One script parameter as the script resolved it (defaults merged with
 * --set values), in text form. */
typedef struct graph_script_param {
    char key[64];
    char value[256];
} graph_script_param;

typedef struct graph_script {
    char path[1024];
    char name[256];        /* file name without folders, e.g. "bert.lua" */
    uint64_t content_hash; /* util_hash of the file's bytes */
    graph_script_param params[GRAPH_SCRIPT_MAX_PARAMS];
    int n_params;
    char model_dir[1024];  /* the Hugging Face model directory whose config.json the script
                              was given ("" for none) */
} graph_script;

#endif
