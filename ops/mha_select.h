/* The analytical selector of the attention kernel (paper §4.2, Eq. 1 and 2).
 *
 * Stage 1 (Eq. 1) picks the kernel from the share of loaded 16x16 blocks:
 *   threshold = loaded / (ceil(q_len/16) * ceil(k_len/16)) - tau / log2(ceil(k_len/16))^2
 * with tau = 1.2; threshold < 0 -> row-wise (CSR) kernel, else block-wise
 * (BSR). The paper writes it for a square mask (q_len = k_len = S: the
 * denominator is ceil(S/16)^2); for cross attention the denominator is the
 * block count, and the penalty follows k_len, since it models a mask of
 * unchanged width (in keys) over more keys. k_len <= 16 makes the log 0:
 * such a short row is row-wise. For per-batch masks, the loaded count is
 * averaged over the stored batches.
 *
 * Stage 2 (Eq. 2) scores every block-wise setting (BLOCK_M, BLOCK_N,
 * num_warps) and keeps the best one:
 *   req_SMEM = ((2 BLOCK_M + BLOCK_N)(w + 16) + BLOCK_M (BLOCK_N + 16)) x dtype bytes
 *   OCC      = num_warps x min(floor(SMEM_SIZE / req_SMEM),
 *                              floor(MAX_WARP / num_warps)) / MAX_WARP
 *   score    = OCC x sqrt(SM_NUM / (BLOCK_M BLOCK_N) x q_len h bs / BLOCK_M)
 * w = head_dim. The paper counts req_SMEM in elements; multiplied by the
 * element size it is bytes, which is what the device limits are in. Both
 * ratios in OCC are floored because an SM holds whole thread blocks.
 * SMEM_SIZE is the shared memory per SM; a setting whose req_SMEM exceeds the
 * per-block limit cannot launch. Each warp owns whole 16-row mma tiles of the
 * query block, so num_warps x 16 <= BLOCK_M. Ties (scores equal to 1e-9
 * relative) go to the larger BLOCK_N, then fewer warps, then the larger
 * BLOCK_M: see mha_candidate_compare. */
#ifndef STOF_OPS_MHA_SELECT_H
#define STOF_OPS_MHA_SELECT_H

#include <stddef.h>
#include <stdint.h>

#include "ops/mask_format.h"
#include "stof.h"

#define MHA_SELECT_TAU 1.2
#define MHA_SELECT_PADDING 16 /* elements, Eq. 2 */
#define MHA_SELECT_STAGE1_BLOCK 16
#define MHA_SELECT_ROWS_PER_WARP_TILE 16 /* query rows of one warp's mma tile */
/* The most query rows one warp of the block-wise kernel owns. Past 64 its
 * fp32 accumulators no longer fit in registers (at D = 64, 128 rows take
 * 256 registers for O alone) and the kernel spills: such settings are
 * refused. (128x16 with one warp also faulted once: the compiler issued a
 * full block's bitmap load through a null pointer ahead of the test that
 * skipped it; the kernel now never forms that pointer.) */
#define MHA_SELECT_MAX_ROWS_PER_WARP 64
/* The most score accumulators a thread of the kernel's mma.sync build
 * holds: its warp's rows x BLOCK_N / 32, and as many again for P. A warp of
 * 64 rows at BLOCK_N 128 holds 256: such a kernel spills, and NVRTC took
 * 19.8 s over one (128x128 on 2 warps with the T5 bias, against 2 s on
 * average), which one measurement of a tune had to wait for. Refused. */
#define MHA_SELECT_MAX_SCORES_PER_THREAD 128
/* 4 BLOCK_M x 4 BLOCK_N x 4 num_warps */
#define MHA_SELECT_MAX_CANDIDATES 64

typedef struct mha_device_limits {
    int sm_count;
    int smem_per_sm;           /* bytes */
    int smem_per_block;        /* bytes, the opt-in maximum of one thread block */
    int max_warps_per_sm;
    int max_threads_per_block;
    const char *arch;          /* "sm_80"...; not owned */
} mha_device_limits;

/* Limits of a named architecture, for planning without the GPU: "sm_80"
 * (A100), "sm_86" (RTX 3090), "sm_89" (RTX 4090), "sm_90" (H100 SXM).
 * STOF_ERR_INVALID listing the known names otherwise. */
int mha_limits_for_arch(const char *arch, mha_device_limits *out, stof_error *err);

typedef struct mha_problem {
    int batch, heads, head_dim;
    int q_len, k_len;
    int dtype_bytes; /* of Q, K, V in shared memory: 2 for fp16 / bf16 */
    /* The mask at 16x16 blocks (mask_format_bsr_build(m, 16, 16, ...)),
     * or NULL for attention without a mask (every block loaded). */
    const mask_bsr *blocks16;
} mha_problem;

typedef enum mha_kernel {
    MHA_KERNEL_ROW_WISE = 0,
    MHA_KERNEL_BLOCK_WISE
} mha_kernel;

typedef enum mha_verdict {
    MHA_FEASIBLE = 0,
    MHA_WARPS_EXCEED_ROWS,   /* num_warps x 16 > BLOCK_M */
    MHA_ROWS_EXCEED_WARPS,   /* BLOCK_M / num_warps > MHA_SELECT_MAX_ROWS_PER_WARP */
    MHA_THREADS_EXCEED_LIMIT,/* num_warps x 32 > max_threads_per_block */
    MHA_SMEM_EXCEEDS_BLOCK,  /* req_SMEM > smem_per_block */
    MHA_NO_OCCUPANCY,        /* not one block fits an SM */
    MHA_SCORES_EXCEED_REGS   /* BLOCK_M / num_warps x BLOCK_N / 32 >
                                MHA_SELECT_MAX_SCORES_PER_THREAD */
} mha_verdict;

typedef struct mha_candidate {
    int block_m, block_n, num_warps;
    int64_t req_smem;   /* bytes */
    int blocks_per_sm;  /* min(floor(SMEM_SIZE / req_SMEM), floor(MAX_WARP / num_warps)) */
    double occ, score;  /* computed for every candidate; only feasible ones compete */
    mha_verdict verdict;
} mha_candidate;

typedef struct mha_selection {
    mha_kernel kernel;
    const char *reason; /* why this kernel, one line (static text) */

    /* Stage 1, Eq. 1 */
    double loaded_blocks16; /* load_row_ptr[ceil(q_len/16)], averaged over stored batches */
    int n_block_rows16, n_block_cols16;
    double load_ratio, penalty, threshold; /* threshold = load_ratio - penalty */

    /* Stage 2, Eq. 2: the best feasible block-wise setting, filled whichever
     * kernel stage 1 chose (so a caller may force block-wise); best = -1 when
     * no setting is feasible. */
    int best;
    int block_m, block_n, num_warps;
    mha_candidate table[MHA_SELECT_MAX_CANDIDATES];
    int n_candidates;

    /* Row-wise launch defaults: one warp per query row, 4 warps a block. */
    int rows_per_warp, warps_per_block;

    mha_problem problem;       /* blocks16 is not kept: it belongs to the caller */
    mha_device_limits limits;
} mha_selection;

/* Runs both stages. STOF_ERR_INVALID for a malformed problem or limits (the
 * 16x16 format must match q_len, k_len and the batch). When stage 1 says
 * block-wise but no setting fits the device, the row-wise kernel is chosen
 * and reason says so. */
int mha_select(const mha_problem *p, const mha_device_limits *lim, mha_selection *out,
               stof_error *err);

/* Eq. 1 alone: fills the stage 1 fields of out and returns the kernel. */
mha_kernel mha_select_stage1(const mha_problem *p, mha_selection *out);
/* Eq. 2 for one setting, verdict included. */
void mha_score_candidate(const mha_problem *p, const mha_device_limits *lim, int block_m,
                         int block_n, int num_warps, mha_candidate *out);
/* > 0 when a is preferred to b, < 0 when b is, 0 when they are the same
 * setting. Feasible first, then score, then the tie-breaks above. */
int mha_candidate_compare(const mha_candidate *a, const mha_candidate *b);

const char *mha_kernel_name(mha_kernel k);
const char *mha_verdict_name(mha_verdict v);

/* Writes the decision and the score table as text a person can read (the CLI
 * prints it). Returns the length the full text needs, like snprintf: a
 * result >= n means buf was too small and holds a truncated text. */
size_t mha_selection_format(const mha_selection *s, char *buf, size_t n);

#endif
