/* The GEMM-family and memory-intensive kernels on the GPU: plans and
 * launches the templates gemm_epilogue (kernels/gemm_epilogue.cu), gemm_ln
 * (kernels/gemm_ln.cu: a GEMM closed by LayerNorm/RMSNorm), gemm_chain
 * (kernels/gemm_chain.cu: two GEMMs through an activation, the FFN),
 * mi_chain (kernels/mi_chain.cu), embedding (kernels/embedding.cu), glu
 * (kernels/glu.cu), rotary (kernels/rotary.cu) and mask_rows
 * (kernels/mask_rows.cu) and gemv (kernels/gemv.cu: a GEMM of a few rows) of
 * fusion/templates.h.
 *
 *   gemm_exec_problem  what one kernel computes: the template, the sizes,
 *                      the epilogue a matched segment carries (fusion_match);
 *   values             one setting of the template's parameters, in the
 *                      registry's order (BLOCK_M, BLOCK_N, ... as -D constants);
 *   gemm_exec_ctx      the GPU side: driver, primary context, device
 *                      properties, NVRTC cache, loaded modules;
 *   gemm_exec_plan     a problem and a setting made ready: checked against
 *                      the template's constraints, compiled, loaded;
 *   gemm_exec_gemm / _gemm_ln / _gemm_chain / _mi_chain / _embedding / _xy
 *                      one launch on a CUstream (_gemm: gemm_epilogue and gemv; _xy: glu,
 *                      rotary, mask_rows).
 *
 * The CPU pieces (validation, feasibility, compile requests, argument
 * blocks) need no GPU and are exposed for tests and offline planning. */
#ifndef STOF_CORE_GEMM_EXEC_H
#define STOF_CORE_GEMM_EXEC_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#include "core/gpu/cuda_driver.h"
#include "core/gpu/gpu_ctx.h"
#include "core/gpu/nvrtc.h"
#include "fusion/match.h"
#include "fusion/templates.h"
#include "kernels/gemm_abi.cuh"
#include "stof.h"

/* ---- problems and settings (CPU only) ------------------------------------------ */

/* gemm_exec_problem.f32: which of an MI chain's tensors are fp32. */
enum {
    GEMM_F32_X = 1,        /* the chain's input */
    GEMM_F32_RESIDUAL = 2, /* the added tensor */
    GEMM_F32_PRE_NORM = 4, /* the norm's input, stored */
    GEMM_F32_Y = 8         /* the output */
};

typedef struct gemm_exec_problem {
    fusion_template_id tmpl; /* FUSION_T_GEMM_EPILOGUE, _GEMM_LN, _GEMM_CHAIN,
                                _MI_CHAIN, _EMBEDDING, _GLU, _ROTARY, _MASK_ROWS
                                or _GEMV */
    stof_dtype dtype;        /* STOF_F16 or STOF_BF16 */
    int64_t m;               /* rows (tokens); embedding: batch * seq_len */
    int64_t n;               /* GEMM output features (gemm_ln: the normalized
                                row; gemm_chain: the intermediate F); MI row
                                length; embedding width; glu: the output
                                width F (the input's is 2F); rotary: the
                                row (Q, K and V heads); mask_rows: the
                                elements of a (batch, position) */
    int64_t k;               /* GEMM reduction */
    int64_t n2;              /* gemm_chain: output features of the second GEMM */
    /* GEMM: bias, act, residual (in that order; no norm). gemm_ln: bias,
     * residual, then the norm (no act). gemm_chain: bias and act of the
     * first GEMM (no residual, no norm). MI chain: bias, residual, then act,
     * then the norm (see kernels/mi_chain.cu). */
    fusion_epilogue epi;
    /* gemm_chain: bias and residual of the second GEMM (no act, no norm);
     * fusion_match's epi[1]. Unused by the other templates. */
    fusion_epilogue epi2;
    int weight_kn;           /* GEMM, gemm_ln, gemm_chain (both weights): W
                                stored [K, N] instead of [N, K] */
    int store_pre_norm;      /* gemm_ln, MI chain with a norm: also write its input */
    unsigned f32;            /* MI chain: GEMM_F32_* of its tensors kept in fp32 (a residual
                                stream), the others in dtype; 0 elsewhere */
    float eps;               /* gemm_ln, MI chain norm; gemv: its prologue's */
    fusion_norm prologue;    /* gemv: each row of x normalized first (the tensors' gamma and
                                beta), as a norm op ahead of the GEMM would write it */
    int seq_len, vocab;      /* embedding, rotary: positions are row % seq_len */
    int has_position, has_type;
    int has_type_ids, type_vocab; /* embedding: a type row per token (of type_vocab rows) */
    int has_position_ids, pos_rows; /* embedding: a position row per token (of pos_rows);
                                       rotary: each row's position (in the xy tensors' mask) */
    int glu_act;             /* glu: STOF_ACT_GELU, STOF_ACT_GELU_TANH or STOF_ACT_SILU; gemv:
                                that or 0, a GLU after the GEMM (its n features, n / 2
                                outputs: act(first half) * second half) */
    int heads, kv_heads, head_dim; /* rotary: Q heads, K (and V) heads, their size */
    float theta;             /* rotary: the frequencies' base */
} gemm_exec_problem;

/* Sizes (GEMM, gemm_ln, gemm_chain: N, K, N2 multiples of 8, every size
 * within int32), dtype, flags that the template implements. */
int gemm_exec_validate(const gemm_exec_problem *p, stof_error *err);

/* The sizes the template's constraint function judges a setting by. */
void gemm_exec_dims(const gemm_exec_problem *p, fusion_dims *d);

/* A setting's feasibility: its values belong to the template's space and
 * pass the template's own check (shared memory within smem_limit bytes,
 * accumulator registers: fusion_template_check), and the kernel's limits
 * besides (mi_chain: at most STOF_MI_MAX_PER_THREAD elements a thread;
 * gemm_ln, gemm_chain: the warps must tile the block's GEMM tile in 16 x 16
 * pieces, stof_gemm_warps_m). STOF_ERR_INVALID / STOF_ERR_UNSUPPORTED with
 * the reason. */
int gemm_exec_check(const gemm_exec_problem *p, const int *values, int smem_limit,
                    stof_error *err);

/* Dynamic shared memory of a setting, bytes: the function the template's
 * check (fusion/templates.c) calls too (gemm_abi.cuh): gemm_epilogue
 * stof_gemm_epilogue_smem (the ring, the wgmma build's slack and staging);
 * gemm_ln stof_gemm_ln_smem (STAGES x (BLOCK_M + BLOCK_N) x BLOCK_K elements
 * plus ROWS x N fp32); gemm_chain stof_gemm_chain_smem (STAGES x (BLOCK_M +
 * BLOCK_F) x BLOCK_K + BLOCK_M x BLOCK_F + 2 x BLOCK_F x 64 elements); the
 * others use none. */
size_t gemm_exec_smem(const gemm_exec_problem *p, const int *values);

/* A setting that runs well for p without tuning on a device of `arch` (NULL:
 * any; only a wgmma-capable arch gets split-K defaults). It passes
 * gemm_exec_check at 227 KiB for every valid problem of the GPU test;
 * callers still check. */
void gemm_exec_default_values(const gemm_exec_problem *p, const char *arch, int *values);

/* Whether a setting of p builds with wgmma on a device of `arch`: a
 * gemm_epilogue of [N, K] weights whose setting is whole warpgroups
 * (gemm_abi.cuh's stof_gemm_wgmma_shape), on sm_90. There it always does:
 * the search measures the two builds as different settings (BLOCK_K 32 or
 * fewer than 3 stages keep mma.sync). */
int gemm_exec_wgmma(const gemm_exec_problem *p, const int *values, const char *arch);

/* Whether setting v's grid is persistent (the template's hook): as many
 * blocks as the GPU holds at once (plan creation asks the driver), each
 * looping over tiles. gemm_epilogue's wgmma build without a split of K or a
 * norm; gemv with [N, K] weights. */
int gemm_exec_persistent(const gemm_exec_problem *p, const int *values, const char *arch);

/* What gemm_exec_check cannot see: a split of K (SPLIT_K > 1) and a closing
 * norm run on the wgmma build only; STOF_ERR_UNSUPPORTED elsewhere. */
int gemm_exec_check_arch(const gemm_exec_problem *p, const int *values, const char *arch,
                         stof_error *err);

/* The blocks of a cluster a setting launches: gemm_epilogue's SPLIT_K, times
 * N / BLOCK_N with a norm (whole rows a cluster); 1 for the others. */
int gemm_exec_cluster(const gemm_exec_problem *p, const int *values);

/* The NVRTC request compiling a setting: the template's parameters as
 * -DNAME=value, then STOF_DTYPE and the flags (and -DWGMMA=1 for sm_90a where
 * gemm_exec_wgmma says so). It points into itself: keep
 * it in place (do not copy) while req is used. */
#define GEMM_EXEC_MAX_OPTS 16
typedef struct gemm_exec_request {
    nvrtc_request req;
    char arch[16];
    char opts[GEMM_EXEC_MAX_OPTS][40];
} gemm_exec_request;
void gemm_exec_request_init(gemm_exec_request *r, const gemm_exec_problem *p, const int *values,
                            const char *arch);

/* The extern "C" name of the template's kernel; NULL for other templates. */
const char *gemm_exec_kernel_name(fusion_template_id t);

/* ---- the GPU context ----------------------------------------------------------- */

/* The planner's context is the shared GPU context (core/gpu/gpu_ctx.h). */
typedef gpu_ctx gemm_exec_ctx;

/* Blocks of `threads` for a grid-stride kernel over `units` (at least 1, at most 16 a
 * multiprocessor: the loop strides over the rest). The memory-bound templates' grid
 * (gemm_grid_stride_shape) and the executor's own row kernels take it. */
unsigned gemm_grid_stride_blocks(const gemm_exec_ctx *c, int64_t units, int threads);

/* STOF_ERR_NO_DEVICE (with the driver's reason) when there is no GPU. */
int gemm_exec_ctx_create(int ordinal, gemm_exec_ctx **out, stof_error *err);
/* Unloads every module and releases the primary context. NULL is fine. */
void gemm_exec_ctx_free(gemm_exec_ctx *c);

/* ---- plans ------------------------------------------------------------------------ */

typedef struct gemm_exec_plan {
    gemm_exec_problem problem;
    int values[FUSION_MAX_PARAMS]; /* the setting, in the template's order */
    char arch[16];
    size_t smem;                   /* dynamic shared memory, bytes */
    unsigned grid[3], block[3];
    CUfunction func;               /* owned by the context's module cache */
    CUdeviceptr d_error;           /* embedding: the bad-id flag (owned) */
} gemm_exec_plan;

/* Validates p, checks the setting (values NULL: gemm_exec_default_values)
 * against the device's shared memory, compiles and loads the kernel, raises
 * its dynamic shared memory limit past 48 KiB when needed. On failure
 * nothing is left allocated. */
int gemm_exec_plan_create(gemm_exec_ctx *c, const gemm_exec_problem *p, const int *values,
                          gemm_exec_plan **out, stof_error *err);
void gemm_exec_plan_free(gemm_exec_ctx *c, gemm_exec_plan *plan);
/* One line: template, setting, flags, launch shape. snprintf's return. */
size_t gemm_exec_plan_describe(const gemm_exec_plan *plan, char *buf, size_t n);

/* ---- launching ------------------------------------------------------------------- */

/* Device tensors. A row stride of 0 means packed (the row length); strides
 * are in elements, multiples of 8, at least the row length; pointers
 * 16-byte aligned. Tensors the plan does not use are ignored. */
typedef struct gemm_exec_gemm_tensors {
    CUdeviceptr x, w, bias, residual, y; /* x [M,K], w [N,K] or [K,N], bias [N], r, y [M,N] */
    CUdeviceptr gamma, beta, pre_norm;   /* with a norm: gamma, beta [N], pre_norm [M,N] */
    int64_t x_row_stride, w_row_stride, r_row_stride, y_row_stride, p_row_stride;
} gemm_exec_gemm_tensors;

/* gemm_ln: x [M,K], w [N,K] or [K,N], bias, gamma, beta [N], residual,
 * y, pre_norm [M,N]. y and pre_norm may be the residual itself. */
typedef struct gemm_exec_ln_tensors {
    CUdeviceptr x, w, bias, residual, gamma, beta, y, pre_norm;
    int64_t x_row_stride, w_row_stride, r_row_stride, y_row_stride, p_row_stride;
} gemm_exec_ln_tensors;

/* gemm_chain (N = problem n2, F = problem n): x [M,K], w1 [F,K] or [K,F],
 * b1 [F], w2 [N,F] or [F,N], b2 [N], residual and y [M,N]. y may be the
 * residual itself. */
typedef struct gemm_exec_chain_tensors {
    CUdeviceptr x, w1, b1, w2, b2, residual, y;
    int64_t x_row_stride, w1_row_stride, w2_row_stride, r_row_stride, y_row_stride;
} gemm_exec_chain_tensors;

typedef struct gemm_exec_mi_tensors {
    CUdeviceptr x, bias, residual, gamma, beta, y, pre_norm; /* rows [M,N], vectors [N] */
    int64_t x_row_stride, r_row_stride, y_row_stride, p_row_stride;
} gemm_exec_mi_tensors;

typedef struct gemm_exec_embed_tensors {
    CUdeviceptr ids;               /* int32 [M] (= [B, S]) */
    CUdeviceptr type_ids;          /* int32 [M], with has_type_ids */
    CUdeviceptr pos_ids;           /* int32 [M], with has_position_ids */
    CUdeviceptr word, pos, type;   /* [vocab, N], [>= seq_len, N], [>= 1, N] */
    CUdeviceptr out;               /* [M, N] */
} gemm_exec_embed_tensors;

/* glu: x [M, 2F], y [M, F]; rotary: x, y [M, N] (and with positions, mask: int32 [M], each
 * row's position); mask_rows: x, y [M, N] and mask int32 [M]. Packed. */
typedef struct gemm_exec_xy_tensors {
    CUdeviceptr x, y, mask;
} gemm_exec_xy_tensors;

/* Fill the argument block (checking pointers and strides) and launch on
 * stream s (asynchronous). */
int gemm_exec_gemm(gemm_exec_ctx *c, const gemm_exec_plan *plan, const gemm_exec_gemm_tensors *t,
                   CUstream s, stof_error *err);
int gemm_exec_gemm_ln(gemm_exec_ctx *c, const gemm_exec_plan *plan,
                      const gemm_exec_ln_tensors *t, CUstream s, stof_error *err);
int gemm_exec_gemm_chain(gemm_exec_ctx *c, const gemm_exec_plan *plan,
                         const gemm_exec_chain_tensors *t, CUstream s, stof_error *err);
int gemm_exec_mi_chain(gemm_exec_ctx *c, const gemm_exec_plan *plan,
                       const gemm_exec_mi_tensors *t, CUstream s, stof_error *err);
int gemm_exec_embedding(gemm_exec_ctx *c, const gemm_exec_plan *plan,
                        const gemm_exec_embed_tensors *t, CUstream s, stof_error *err);
/* glu, rotary or mask_rows, as the plan's template says. */
int gemm_exec_xy(gemm_exec_ctx *c, const gemm_exec_plan *plan, const gemm_exec_xy_tensors *t,
                 CUstream s, stof_error *err);

/* The embedding's bad-id flag: synchronizes stream s, reads the flag and
 * clears it. STOF_OK when every id since the last call was in [0, vocab);
 * else STOF_ERR_INVALID naming one bad token and its id or its token type
 * (read back from ids and type_ids, which may be 0), and *bad_token (may be NULL) gets its index. Launches with bad ids
 * wrote zero rows for them. */
int gemm_exec_embedding_status(gemm_exec_ctx *c, const gemm_exec_plan *plan, CUdeviceptr ids,
                               CUdeviceptr type_ids, CUstream s, int64_t *bad_token,
                               stof_error *err);

/* The argument blocks the launches pass (exposed for tests); STOF_ERR_INVALID
 * for a missing, misaligned or short tensor. */
int gemm_exec_gemm_args(const gemm_exec_plan *plan, const gemm_exec_gemm_tensors *t,
                        stof_gemm_args *a, stof_error *err);
/* gemv's: the gemm tensors less the norm's (y, bias and residual may be any 16-bit aligned
 * pointers, their strides any width: stored an element at a time). */
int gemm_exec_gemv_args(const gemm_exec_plan *plan, const gemm_exec_gemm_tensors *t,
                        stof_gemv_args *a, stof_error *err);
int gemm_exec_ln_args(const gemm_exec_plan *plan, const gemm_exec_ln_tensors *t,
                      stof_gemm_ln_args *a, stof_error *err);
int gemm_exec_chain_args(const gemm_exec_plan *plan, const gemm_exec_chain_tensors *t,
                         stof_gemm_chain_args *a, stof_error *err);
int gemm_exec_mi_args(const gemm_exec_plan *plan, const gemm_exec_mi_tensors *t, stof_mi_args *a,
                      stof_error *err);
int gemm_exec_embed_args(const gemm_exec_plan *plan, const gemm_exec_embed_tensors *t,
                         stof_embed_args *a, stof_error *err);
int gemm_exec_glu_args(const gemm_exec_plan *plan, const gemm_exec_xy_tensors *t,
                       stof_glu_args *a, stof_error *err);
int gemm_exec_rotary_args(const gemm_exec_plan *plan, const gemm_exec_xy_tensors *t,
                          stof_rotary_args *a, stof_error *err);
int gemm_exec_mask_rows_args(const gemm_exec_plan *plan, const gemm_exec_xy_tensors *t,
                             stof_mask_rows_args *a, stof_error *err);

#endif
