/* What the public API's handles hold (shared by the core/api*.c files). */
#ifndef STOF_CORE_API_INTERNAL_H
#define STOF_CORE_API_INTERNAL_H

#include "core/exec/exec.h"
#include "core/graph/graph.h"
#include "core/graph/script.h"
#include "core/gpu/cuda_driver.h"
#include "core/io/safetensors.h"
#include "core/plan/plan.h"
#include "ops/mask.h"
#include "stof.h"

struct stof_mask {
    mask *m;
};

/* A model (include/stof.h): its graph, weights, plan and, once run on the GPU, its
 * executor. */
struct stof_model {
    graph g;
    graph_script script;
    safetensors_file *weights; /* the model directory's, or stof_model_set_weights' */
    uint64_t seed;             /* for what no file gives */
    int weights_missing;       /* a model directory without weights, none given since */
    CUdeviceptr *bound;        /* per tensor: the caller's device weight (set_weights_device) */
    plan pl;                   /* tuned or loaded; has_plan */
    int has_plan;
    /* on the GPU, made at the first run (or after a new plan) */
    exec_ctx *ctx;
    exec_plan *xplan;
    exec_model *xmodel;
};

/* A model directory opened without weights runs only once some are given (or a seed asked
 * for explicitly): never on weights drawn at random unasked. */
int api_check_weights(const stof_model *m, stof_error *err);

/* The model's GPU context, on `device`: made once; another device later is an error rather
 * than a silent change. */
int api_ensure_ctx(stof_model *m, int device, stof_error *err);

/* Records err as the calling thread's last error (for stof_last_error) and
 * returns rc. */
int api_remember(int rc, const stof_error *err);

#endif
