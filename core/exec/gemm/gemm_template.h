/* The GEMM-family templates as gemm_exec runs them: one row of functions a
 * template (validation, the kernel's own limits, default settings, NVRTC
 * defines, shared memory, launch shape, ...), so that the planner
 * (gemm_setting.c, gemm_plan.c) asks the row instead of switching on the
 * template id. Adding a template means writing its row and listing it in
 * gemm_setting.c's table. Also the small helpers the rows share.
 * Internal to core/exec/gemm. */
#ifndef STOF_CORE_EXEC_GEMM_TEMPLATE_H
#define STOF_CORE_EXEC_GEMM_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/exec/gemm/gemm_exec.h"

/* Where plan descriptions print the residual add among the epilogue's ops:
 * the order the kernel applies them in. */
typedef enum gemm_residual_at {
    GEMM_RESIDUAL_UNSHOWN,    /* the template has no epi residual (or shows it elsewhere) */
    GEMM_RESIDUAL_BEFORE_ACT, /* bias, add, act, norm */
    GEMM_RESIDUAL_AFTER_ACT   /* bias, act, add, norm */
} gemm_residual_at;

typedef struct gemm_template {
    fusion_template_id id;
    const char *kernel; /* the extern "C" name of the kernel */
    const char *n_name; /* what problem n is called in descriptions ("N", "F") */

    /* What the problem must be beyond the checks common to every template
     * (dtype, activation and norm codes). */
    int (*validate)(const gemm_exec_problem *p, stof_error *err);
    /* The kernel's limits beyond the registry's check (fusion/templates.c);
     * NULL: none. */
    int (*check)(const gemm_exec_problem *p, const int *v, stof_error *err);
    /* What only the device's architecture decides; NULL: nothing. */
    int (*check_arch)(const gemm_exec_problem *p, const int *v, const char *arch,
                      stof_error *err);
    /* Whether the template's row reduction (a norm) is in play: the
     * registry's fusion_dims.row_reduce. */
    int (*row_reduce)(const gemm_exec_problem *p);
    int uses_n2; /* fusion_dims.n2 is the problem's n2 */
    /* A setting that runs well without tuning (v is zeroed beforehand). */
    void (*defaults)(const gemm_exec_problem *p, const char *arch, int *v);
    /* The -D flags after the parameters and STOF_DTYPE. */
    void (*defines)(gemm_exec_request *r, const gemm_exec_problem *p, const int *v,
                    const char *arch);
    /* Dynamic shared memory, bytes; NULL: none. */
    size_t (*smem)(const gemm_exec_problem *p, const int *v);
    /* Grid and block x (y and z are 1 beforehand). */
    void (*launch_shape)(const gemm_exec_ctx *c, gemm_exec_plan *plan);
    /* Whether setting v's grid is persistent: as many blocks as the GPU holds, at most one a
     * tile of launch_shape's grid, each looping over its tiles; NULL: never. */
    int (*persistent)(const gemm_exec_problem *p, const int *v, const char *arch);
    /* Blocks a cluster; NULL: 1. */
    int (*cluster)(const gemm_exec_problem *p, const int *v);
    /* Whether setting v is a wgmma build (sm_90a, gemm_exec_wgmma); NULL: never. */
    int (*wgmma)(const gemm_exec_problem *p, const int *v, const char *arch);
    int error_flag; /* the plan owns a device int32 the kernel reports bad input through */

    gemm_residual_at residual_at;
    /* What a description adds after the epilogue's ops; NULL: nothing. */
    void (*describe_extra)(const gemm_exec_problem *p, char *buf, size_t n);
} gemm_template;

/* The rows (gemm_tmpl_*.c). */
extern const gemm_template gemm_template_epilogue;
extern const gemm_template gemm_template_ln;
extern const gemm_template gemm_template_chain;
extern const gemm_template gemm_template_mi_chain;
extern const gemm_template gemm_template_embedding;
extern const gemm_template gemm_template_glu;
extern const gemm_template gemm_template_rotary;
extern const gemm_template gemm_template_mask_rows;
extern const gemm_template gemm_template_gemv;

/* The row of template t; NULL when gemm_exec does not run it. */
const gemm_template *gemm_template_get(fusion_template_id t);

/* The registry's name of t ("?" when unknown), for messages. */
const char *gemm_template_name(fusion_template_id t);

/* ---- helpers the rows share ------------------------------------------------------ */

/* A GEMM's sizes: M in 1..2^31-1, N and K positive multiples of 8. */
int gemm_validate_sizes(const char *what, int64_t m, int64_t n, int64_t k, stof_error *err);
/* A norm's epsilon: finite and positive. */
int gemm_validate_eps(const char *what, float eps, stof_error *err);

/* The largest of 8, 4, 2, 1 dividing n. */
int gemm_widest_vec(int64_t n);

/* Default settings must fit an H100 / H200: 227 KiB of shared memory a block. */
#define GEMM_EXEC_DEFAULT_SMEM (227 * 1024)

/* The first of candidates[from..n-1] that passes gemm_exec_check at
 * GEMM_EXEC_DEFAULT_SMEM, else the last. */
void gemm_first_feasible(const gemm_exec_problem *p, const int (*candidates)[5], int n, int from,
                         int *v);

/* The memory-bound templates' grid-stride loops (embedding, glu, rotary,
 * mask_rows): THREADS, VEC by default 256 and the widest chunk dividing
 * `row`; a grid of enough THREADS-blocks for `units` chunks, at most 16 a
 * multiprocessor (the loop strides over the rest). */
void gemm_grid_stride_defaults(int64_t row, int *v);
void gemm_grid_stride_shape(const gemm_exec_ctx *c, gemm_exec_plan *plan, int64_t units);

/* A gated unit's activation (glu, and gemv's after its GEMM): its name as m:glu takes it
 * ("gelu", "gelu_tanh", "silu"), or NULL for any other. */
const char *gemm_glu_act_name(int act);

/* Appends -Dname=value to the request (up to GEMM_EXEC_MAX_OPTS). */
void gemm_request_define(gemm_exec_request *r, const char *name, long long value);

static inline int64_t gemm_ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

#endif
