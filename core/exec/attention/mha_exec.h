/* Masked multi-head attention on the GPU: plans and launches the row-wise
 * (kernels/attention_row.cu) and block-wise (kernels/attention_block.cu)
 * kernels of paper §4.2.
 *
 *   mha_exec_ctx   the GPU side of it: driver, primary context, device
 *                  properties, NVRTC cache, loaded modules;
 *   mha_exec_plan  one attention problem made ready: the mask folded with
 *                  causal, the kernel chosen (mha_select, or forced), the
 *                  mask format on the device, the kernel compiled and loaded;
 *   mha_exec_run   one launch on given Q, K, V, O with strides.
 *
 * The pure-CPU pieces (validation, the causal fold, kernel configurations,
 * their shared memory and compile options) need no GPU and are exposed for
 * tests and for planning offline. */
#ifndef STOF_CORE_MHA_EXEC_H
#define STOF_CORE_MHA_EXEC_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#include "core/gpu/cuda_driver.h"
#include "core/gpu/gpu_ctx.h"
#include "core/gpu/nvrtc.h"
#include "kernels/attention_abi.cuh"
#include "ops/mask.h"
#include "ops/mask_format.h"
#include "ops/mha_select.h"
#include "stof.h"

/* ---- problems and kernel configurations (CPU only) ------------------------ */

typedef struct mha_exec_problem {
    const mask *mask;    /* NULL: no mask (every pair allowed); else q_len x k_len,
                            batch 1 (shared) or `batch` */
    int causal;          /* ANDed with the mask: j <= i + (k_len - q_len) */
    int batch, heads, head_dim;
    int q_len, k_len;
    stof_dtype dtype;    /* STOF_F16 or STOF_BF16 */
    float scale;         /* applied to q.k, e.g. 1/sqrt(head_dim) */
    /* T5 relative position bias: the score of (i, j) in head h gets
     * table[bucket(j - i) * heads + h], table [buckets][heads] in dtype. */
    int relpos;
    int relpos_buckets, relpos_max_distance, relpos_bidirectional;
    /* Run-time padding (self-attention): an attention_mask [batch, q_len] int32
     * (1 = token, each row ones then zeros) comes with every run
     * (mha_exec_tensors.pad_mask); keys past a row's length are masked and its
     * padded rows are zeros. */
    int padded;
    /* Grouped-query attention: K and V have kv_heads heads (dividing heads), query head h
     * reads K/V head h / (heads / kv_heads). 0: heads. */
    int kv_heads;
    /* Global tokens (self-attention; Longformer's): a global_mask [batch, q_len] int32 comes
     * with every run (mha_exec_tensors.global_mask); every query also attends the global
     * keys, and a global query attends every key with the global projections
     * (mha_exec_tensors.gq, gk, gv): see kernels/attention_global_abi.cuh. */
    int global_keys;
} mha_exec_problem;

/* The problem's K/V head count (kv_heads, or heads when 0). */
static inline int mha_exec_kv_heads(const mha_exec_problem *p) {
    return p->kv_heads > 0 ? p->kv_heads : p->heads;
}

/* Head sizes the kernels are built and tested for. */
#define MHA_EXEC_HEAD_DIMS "32, 64, 80, 128"
int mha_exec_head_dim_supported(int head_dim);

/* Shapes, dtype, mask shape and batch, relpos parameters. */
int mha_exec_validate(const mha_exec_problem *p, stof_error *err);

/* The mask the kernels see: p->mask (or every pair, when NULL) AND the
 * causal rule when p->causal. Always a new mask (the caller frees it), with
 * the input's stored batch, a description and a fingerprint. The causal
 * rule comes from mask_build(MASK_CAUSAL), its one definition. */
int mha_exec_fold_mask(const mha_exec_problem *p, mask **out, stof_error *err);

typedef struct mha_exec_config {
    mha_kernel kernel;
    int head_dim;
    stof_dtype dtype;
    int relpos;
    int padded;                          /* the problem's: -DPADDING=1 */
    int relpos_mid;                      /* block-wise, relpos: the capacity of the shared
                                            table of biases between T5's far runs
                                            (-DRELPOS_MID; 0: none, read from global) */
    int block_m, block_n, num_warps;     /* block-wise */
    int stages;                          /* block-wise: K/V pipeline depth, 2..4 */
    int rows_per_warp, warps_per_block;  /* row-wise */
    int split;                           /* block-wise: the work-list build (-DSPLIT=1), set
                                            by the plan when it splits rows */
    int wgmma;                           /* block-wise: the Hopper build (-DWGMMA=1, warpgroup
                                            MMA, compiled for sm_90a): sm_90 devices only,
                                            BLOCK_M = 16 warps, a multiple of 64 */
    int tma;                             /* block-wise: K and V tiles by the tensor memory
                                            accelerator (-DTMA=1; sm_90 and later, head_dim a
                                            multiple of 64, with wgmma 64), one thread
                                            issuing each tile, instead of cp.async by all */
    int lse;                             /* -DLSE=1: each row's log-sum-exp too (set by the
                                            plan for global tokens under a mask) */
} mha_exec_config;

/* The arch a configuration compiles for on a device of `arch`: the wgmma
 * build needs the architecture-specific target (sm_90 -> sm_90a). */
void mha_exec_config_arch(const mha_exec_config *c, const char *arch, char *out, size_t n);

#define MHA_EXEC_MIN_STAGES 2
#define MHA_EXEC_MAX_STAGES 4
/* The wgmma build keeps the previous block's V stage while the next block
 * loads: at least 3 (the automatic depth is raised to it). */
#define MHA_EXEC_WGMMA_MIN_STAGES 3

/* Whether configuration c may take the TMA build: block-wise, a head size
 * that is a multiple of 64 (the wgmma build: 64, where its swizzled tiles
 * are the copies' layout), 16-bit elements. */
int mha_exec_tma_shape(const mha_exec_config *c);

/* Dynamic shared memory of the block-wise kernel: Q [block_m] and a ring of
 * `stages` K and V tiles [stages][tile_n], rows of head_dim + 8 elements:
 * (block_m + 2 stages tile_n) (head_dim + 8) dtype_bytes. (The wgmma build
 * keeps unpadded rows and uses 8 / (head_dim + 8) of it less.) tile_n is
 * BLOCK_N, the keys of one iteration; likewise below. */
size_t mha_exec_block_smem(int block_m, int tile_n, int stages, int head_dim, int dtype_bytes);
/* The same for a block-wise config, its relpos table included. The TMA
 * build's K and V rows are unpadded and 1024-byte aligned, and its stages
 * have a barrier each: 1024 + 2 stages tile_n head_dim + block_m (head_dim
 * + 8) element bytes, + 8 stages. */
size_t mha_exec_config_smem(const mha_exec_config *c);
/* Thread blocks of the block-wise kernel one SM holds (shared memory, with
 * the 1 KiB the hardware reserves per block on sm_80+, and warps), at most
 * 32; 0 when one does not fit smem_per_block. */
int mha_exec_block_ctas_per_sm(int block_m, int tile_n, int num_warps, int stages, int head_dim,
                               int dtype_bytes, const mha_device_limits *lim);
/* The CTA slots of the whole device for block-wise configuration c (at least one an SM):
 * what a plan splits long rows over. */
int mha_exec_resident_slots(const mha_exec_config *c, const mha_device_limits *lim);
/* The automatic pipeline depth of a block-wise setting: the deepest STAGES
 * in 2..4 that keeps as many resident blocks per SM as 2 stages do (and at
 * least 2 of them); measured on an H200, a deeper ring that costs resident
 * blocks is slower. A measured plan (force->measure) settles the rest. */
int mha_exec_auto_stages(int block_m, int tile_n, int num_warps, int head_dim, int dtype_bytes,
                         const mha_device_limits *lim);
/* Whether a block-wise setting keeps its accumulators in registers (no
 * spills in ptxas -v on sm_90): the automatic choice skips the others; a
 * forced setting still runs, only slower. */
int mha_exec_block_regs_ok(int block_m, int tile_n, int num_warps, int head_dim);
/* The configuration is well formed (sizes, divisibility, warps, head_dim,
 * dtype) and, when smem_limit > 0, its shared memory fits. */
int mha_exec_config_check(const mha_exec_config *c, int smem_limit, stof_error *err);

/* The NVRTC request that compiles a configuration. It points into itself:
 * keep it in place (do not copy) while req is used. */
typedef struct mha_exec_request {
    nvrtc_request req;
    char arch[16];
    char opts[14][48];
} mha_exec_request;
void mha_exec_request_init(mha_exec_request *r, const mha_exec_config *c, const char *arch);
/* Whether a plan of p with the folded mask builds its kernel with the rows' log-sum-exp
 * (config.lse): global tokens under a mask that leaves keys out (the global keys it left out
 * are merged in through it). */
int mha_exec_wants_lse(const mha_exec_problem *p, const mask *folded);
/* The NVRTC request of the global tokens' kernels (kernels/attention_global.cu) for p. */
void mha_exec_global_request_init(mha_exec_request *r, const mha_exec_problem *p,
                                  const char *arch);

/* ---- split block rows (CPU only) ---------------------------------------------------
 *
 * A block row whose load list is much longer than the others' (the global
 * rows of Longformer and BigBird) bounds the block-wise kernel's time: one
 * CTA walks it alone. The plan cuts such rows into work items of at most
 * `chunk` loaded blocks, run by separate CTAs of a -DSPLIT=1 build that
 * write fp32 partials; stof_attention_combine merges them (see
 * kernels/attention_abi.cuh). When no row is cut, the plan keeps the plain
 * launch over block rows. */

/* Work items never take fewer loaded blocks than this (automatic choice). */
#define MHA_EXEC_SPLIT_MIN_CHUNK 4
/* The "typical long row": this percentile of the block rows' lengths. */
#define MHA_EXEC_SPLIT_TYPICAL_PCT 90

/* The automatic chunk of a BSR format for a launch of batch x heads on
 * `resident` CTA slots (SMs x blocks per SM), or 0: do not split. The
 * launch cannot finish before its longest work item, nor before every slot
 * has done its share, so pieces shorter than either buy nothing but
 * partial traffic: chunk is the larger of the average load of one slot
 * (heads x the loaded blocks of every launched batch / resident) and the
 * typical long row (MHA_EXEC_SPLIT_TYPICAL_PCT-th percentile of the row
 * lengths: the outliers, global rows, are what is cut), at least
 * MHA_EXEC_SPLIT_MIN_CHUNK. It splits only when the longest row is at
 * least 1.5 chunks long (a second, small kernel is not free). */
int mha_exec_split_chunk(const mask_bsr *f, int batch, int heads, int resident);
/* The same rule on the n block rows' loaded lengths (sorted in place) and
 * the launch's work in loaded blocks (heads x every launched batch's). */
int mha_exec_split_chunk_of(int *len, int n, int64_t work, int resident);

/* The work list of a BSR format at a chunk size, per stored batch. */
typedef struct mha_exec_split {
    int fmt_batch, chunk;
    int n_items;            /* work items over every stored batch */
    int n_split_rows;       /* block rows cut in two or more */
    int n_slots;            /* their pieces (items with a workspace slot) */
    int max_items;          /* most items of one stored batch: the kernel's grid x */
    int max_split_rows;     /* most split rows of one stored batch: the combine's grid x */
    int32_t *work_ptr;      /* [fmt_batch + 1]: batch b's items are work[work_ptr[b] ..] */
    stof_attn_work *work;   /* [n_items] */
    int32_t *split_ptr;     /* [fmt_batch + 1] */
    stof_attn_split *splits; /* [n_split_rows] */
} mha_exec_split;

/* Builds the work list: every block row of every stored batch becomes
 * items covering its load list exactly once, in order; a row of L > chunk
 * blocks becomes ceil(L / chunk) contiguous pieces of near-equal size (each
 * <= chunk) with consecutive slots, a row of L <= chunk (empty rows too)
 * one whole item (slot -1). Within a batch, items are ordered longest
 * first (ties: block row, then piece order), so the long ones start
 * early. *out is NULL when no row is longer than chunk (nothing to split),
 * and always when chunk < 1. Deterministic. */
int mha_exec_split_build(const mask_bsr *f, int chunk, mha_exec_split **out, stof_error *err);
void mha_exec_split_free(mha_exec_split *s);

/* Bytes of the split launch's workspace for a problem of batch x heads:
 * units ((fmt_batch == 1 ? batch : 1) x n_slots x heads) of block_m rows of
 * head_dim + 2 floats (partial O, then m and l). */
size_t mha_exec_split_workspace(const mha_exec_split *s, int batch, int heads, int block_m,
                                int head_dim);

/* Whether a plan of configuration cfg cuts block rows into work items (and
 * so compiles the -DSPLIT=1 build) on a device with limits lim, as
 * mha_exec_plan_create decides it with force_chunk (mha_exec_force's
 * split_chunk; 0: automatic). folded is from mha_exec_fold_mask. CPU only:
 * it builds the BSR format. */
int mha_exec_plan_splits(const mha_exec_problem *p, const mask *folded,
                         const mha_exec_config *cfg, const mha_device_limits *lim,
                         int force_chunk, int *splits, stof_error *err);

/* ---- the GPU context ---------------------------------------------------------- */

/* The limits the planner uses for a device (info) of architecture arch
 * (not copied): the selector's and the split chunk's. */
void mha_exec_device_limits(const stof_device_info *info, const char *arch,
                            mha_device_limits *lim);

/* The planner's context is the shared GPU context (core/gpu/gpu_ctx.h). */
typedef gpu_ctx mha_exec_ctx;

/* STOF_ERR_NO_DEVICE (with the driver's reason) when there is no GPU. */
int mha_exec_ctx_create(int ordinal, mha_exec_ctx **out, stof_error *err);
/* Unloads every module and releases the primary context. NULL is fine. */
void mha_exec_ctx_free(mha_exec_ctx *c);

/* ---- plans -------------------------------------------------------------------- */

/* Forced choice (tests, the tuner). kernel -1 = automatic (the selector);
 * for block-wise, zero sizes take the selector's stage 2 choice; for
 * row-wise, zeros take the defaults (1 row a warp, 4 warps a block).
 * stages 0 = mha_exec_auto_stages. measure N > 0: mha_exec_plan_create
 * times the candidates of mha_exec_candidates on the GPU and keeps the
 * fastest (see there). */
typedef struct mha_exec_force {
    int kernel; /* -1, MHA_KERNEL_ROW_WISE or MHA_KERNEL_BLOCK_WISE */
    int block_m, block_n, num_warps;
    int rows_per_warp, warps_per_block;
    int stages;  /* block-wise K/V pipeline depth 2..4; 0 = automatic */
    int measure; /* 0 = a remembered measured choice, else the analytical one (see
                    mha_exec_wisdom.c); N > 0 = time N + a few candidates (and remember the
                    fastest when nothing else is forced); -1 = the analytical choice only */
    int split_chunk; /* block-wise rows cut into work items: 0 = automatic
                        (mha_exec_split_chunk), -1 = never, N > 0 = chunks of N
                        loaded blocks (every longer row is cut) */
    int wgmma;       /* block-wise: 1 = the wgmma build, -1 = the mma.sync one, 0 =
                        automatic (wgmma on sm_90 for whole warpgroups of 16-row
                        warps and head sizes that are multiples of 64) */
    int tma;         /* block-wise: 1 = K and V by the tensor memory accelerator, -1 = by
                        cp.async, 0 = automatic (TMA where the device and the shape allow
                        it) */
} mha_exec_force;

/* The kernel configuration for a problem on a device with limits lim (from
 * the GPU, or mha_limits_for_arch offline): forced; else the cost model's
 * fastest (mha_exec_model_rank; sizes forced to block-wise pick among
 * block-wise ones); else, without costs for the device, the selector's
 * (Eq. 1, then Eq. 2's best setting this kernel runs without spilling and
 * within the shared memory limit; row-wise when none). folded is the mask
 * from mha_exec_fold_mask. reason gets one line on why. */
int mha_exec_choose(const mha_exec_problem *p, const mask *folded, const mha_device_limits *lim,
                    const mha_exec_force *force, mha_exec_config *cfg, char *reason,
                    size_t reason_size, stof_error *err);

/* The calibrated cost model's ranking (core/exec/attention/mha_exec_cost.h)
 * of the settings a plan may take: every runnable setting of the
 * selector's table in its automatic build, and the row-wise kernel unless
 * force asks for block-wise; fastest first (the fastest cap of them), *n
 * of them, each predicted with the plan's split (force->split_chunk). *n
 * is 0 where the model has no costs for lim's architecture, where force
 * asks for a build or a pipeline depth (wgmma, tma, stages: the costs are
 * the automatic builds'), or where STOF_ATTENTION_MODEL=paper switches it
 * off; mha_exec_choose then keeps to Eq. 1 and 2. */
typedef struct mha_exec_ranked {
    mha_exec_config cfg;
    double us; /* predicted */
} mha_exec_ranked;
#define MHA_EXEC_MAX_RANKED (MHA_SELECT_MAX_CANDIDATES + 1)
int mha_exec_model_rank(const mha_exec_problem *p, const mask *folded,
                        const mha_device_limits *lim, const mha_exec_force *force,
                        mha_exec_ranked *out, int cap, int *n, stof_error *err);

/* The fixed block-wise settings (BLOCK_M, BLOCK_N, num_warps) a measured
 * plan always tries besides Eq. 2's best ones, when they fit, each in its
 * automatic build: on sm_90 the whole-warpgroup ones (64x64 with 4 warps,
 * 128x64 with 8) run the wgmma build, 128x64 with 4 warps stays mma.sync.
 */
#define MHA_EXEC_MEASURE_FIXED \
    {{64, 32, 4}, {64, 64, 4}, {128, 64, 8}, {32, 32, 2}, {128, 64, 4}}
#define MHA_EXEC_MEASURE_N_FIXED 5
/* Most candidates a measured plan times. */
#define MHA_EXEC_MAX_MEASURED (MHA_SELECT_MAX_CANDIDATES + MHA_EXEC_MEASURE_N_FIXED + 1)

/* The configurations a plan with force->measure = N > 0 times, distinct, in
 * this order: mha_exec_choose's (the analytical choice, so measuring never
 * loses to it by more than noise); when that is forced with explicit sizes
 * (or forced row-wise), nothing else. Otherwise the N best feasible
 * block-wise settings of Eq. 2 (no register spills, shared memory within
 * the device's limit), then the MHA_EXEC_MEASURE_FIXED settings that pass
 * mha_exec_config_check and mha_exec_block_regs_ok; the row-wise kernel only
 * when Eq. 1 chose it (and the choice was not forced block-wise). Every
 * block-wise candidate at force->stages, or mha_exec_auto_stages when 0.
 * At most cap; *n gets the count, reason the analytical choice's. */
int mha_exec_candidates(const mha_exec_problem *p, const mask *folded,
                        const mha_device_limits *lim, const mha_exec_force *force,
                        mha_exec_config *out, int cap, int *n, char *reason, size_t reason_size,
                        stof_error *err);

typedef struct mha_exec_plan {
    mha_exec_problem problem;  /* mask pointer not kept (set to NULL) */
    mha_exec_config config;
    char arch[16];
    char reason[256];          /* why this kernel and these sizes */
    char mask_desc[96];        /* of the folded mask, possibly cut short */
    int64_t allowed_pairs;     /* over all batches, one head: for FLOP counts */
    int fmt_batch;             /* stored batches of the format */
    int n_loaded_blocks;       /* block-wise: loaded blocks, partial ones */
    int n_partial_blocks, n_bitmaps;
    size_t smem;               /* dynamic shared memory, bytes */
    int n_measured;            /* measured plans: candidates timed (0: not measured) */
    float measured_ms;         /* and the chosen one's median time, ms (at
                                  measured_batch batches) */
    int measured_batch;
    unsigned grid[3], block[3];
    CUfunction func;           /* owned by the context's module cache */
    /* split rows (config.split): the work list's statistics, the combine launch */
    int split_chunk, split_rows, split_items, split_slots;
    unsigned combine_grid[3], combine_block[3];
    CUfunction combine;
    size_t workspace_bytes, workspace_ml_offset; /* (m, l) start after the partial O */
    /* device arrays (owned) */
    CUdeviceptr d_row_ptr, d_col_idx, d_mask_idx, d_bitmaps; /* BSR load list, or CSR */
    CUdeviceptr d_relpos_bucket;
    CUdeviceptr d_work_ptr, d_work, d_split_ptr, d_splits; /* the work list */
    CUdeviceptr d_workspace;   /* partial O, then (m, l): reused by every run */
    /* global tokens (problem.global_keys): attention_global.cu's kernels, the index of the
     * global tokens and the rows' log-sum-exp (one allocation), and, when the mask leaves
     * keys out (config.lse), its bits for the merge of the global keys */
    CUfunction global_index, global_merge, global_rows;
    CUdeviceptr d_global_index, d_lse, d_mask_bits;
    int mask_words;
} mha_exec_plan;

/* Validates, folds, selects (unless forced), builds and uploads the format,
 * compiles and loads the kernel. On failure nothing is left allocated.
 *
 * With force->measure > 0 it builds a plan for every configuration of
 * mha_exec_candidates and times it on scratch buffers of the problem's
 * shape (packed q/k/v in one [B, max(Sq, Sk), 3 H D] buffer, o [B, Sq, H D],
 * filled with random values; the batch is reduced until they fit
 * MHA_EXEC_MEASURE_BYTES): 2 warm-up launches, then the median of 5. It
 * keeps the fastest (n_measured, measured_ms; the reason starts with
 * "measured: fastest of N") and frees the others and the scratch. A
 * candidate that fails to build or launch is skipped; the plan fails only
 * when every candidate does (with the last one's error) or a CUDA error
 * leaves the context unusable. */
#define MHA_EXEC_MEASURE_BYTES ((size_t)1 << 30)
#define MHA_EXEC_MEASURE_WARMUP 2
#define MHA_EXEC_MEASURE_RUNS 5
int mha_exec_plan_create(mha_exec_ctx *c, const mha_exec_problem *p, const mha_exec_force *force,
                         mha_exec_plan **out, stof_error *err);
void mha_exec_plan_free(mha_exec_ctx *c, mha_exec_plan *plan);
/* One line: kernel, sizes, format statistics, reason. snprintf's return. */
size_t mha_exec_plan_describe(const mha_exec_plan *plan, char *buf, size_t n);

/* ---- launching ---------------------------------------------------------------- */

/* Device tensors with element strides; head h at column h * head_dim. */
typedef struct mha_exec_tensors {
    CUdeviceptr q, k, v, o;
    int64_t q_batch_stride, q_row_stride;
    int64_t k_batch_stride, k_row_stride;
    int64_t v_batch_stride, v_row_stride;
    int64_t o_batch_stride, o_row_stride;
    CUdeviceptr relpos_table; /* [buckets][heads] in the dtype, when relpos */
    CUdeviceptr pad_mask;     /* int32 [batch, q_len], when padded */
    CUdeviceptr global_mask;  /* int32 [batch, q_len], when global_keys */
    CUdeviceptr gq, gk, gv;   /* the global rows' Q, K, V (the strides of q, k, v): a
                                 global_qkv's, else q, k, v */
    /* The ragged layout (padded self-attention plans only; 0: the padded one): int32
     * [batch + 1] on the device, batch b's rows are rows seq_start[b] .. seq_start[b + 1] - 1
     * of q, k, v, o (and gq, gk, gv), the batch strides 0, ragged_rows the rows the tensors
     * hold. pad_mask may then be 0; when given, its lengths must be seq_start's. Rows outside
     * every sequence are neither weighed nor written but must hold finite values (a TMA plan
     * may load them). */
    CUdeviceptr seq_start;
    int64_t ragged_rows;
} mha_exec_tensors;

/* Self-attention on the QKV GEMM's output qkv [B, S, 3, H, D], o [B, S, H*D]. */
void mha_exec_tensors_packed(mha_exec_tensors *t, CUdeviceptr qkv, CUdeviceptr o,
                             const mha_exec_problem *p, size_t elem_bytes);
/* The same tensors as t, in the ragged layout: sequences one after another from row 0,
 * seq_start and rows as mha_exec_tensors says. */
void mha_exec_tensors_ragged(mha_exec_tensors *t, CUdeviceptr seq_start, int64_t rows);
/* Global tokens: the global_mask and the global rows' Q, K, V in gqkv, packed as qkv is. */
void mha_exec_tensors_global(mha_exec_tensors *t, CUdeviceptr global_mask, CUdeviceptr gqkv,
                             const mha_exec_problem *p, size_t elem_bytes);
/* Cross-attention: q [B, Sq, H*D], kv [B, Sk, 2, H, D], o [B, Sq, H*D]. */
void mha_exec_tensors_cross(mha_exec_tensors *t, CUdeviceptr q, CUdeviceptr kv, CUdeviceptr o,
                            const mha_exec_problem *p, size_t elem_bytes);

/* Fills the argument block and launches on stream s (asynchronous): the
 * kernel, then for a split plan the combine kernel on the same stream.
 * Checks alignment (16-byte pointers, strides multiples of 8 elements); a
 * TMA plan's tensor maps for K and V are encoded here, for these tensors. A
 * split plan's workspace is the plan's own: runs of one plan must not
 * overlap (one stream, or ordered by events). */
int mha_exec_run(mha_exec_ctx *c, const mha_exec_plan *plan, const mha_exec_tensors *t,
                 CUstream s, stof_error *err);
/* The argument block mha_exec_run passes (exposed for tests). */
void mha_exec_fill_args(const mha_exec_plan *plan, const mha_exec_tensors *t,
                        stof_attn_args *a);

#endif
