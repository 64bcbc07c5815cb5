/* The argument blocks of the GEMM-family and memory-intensive kernels
 * (gemm_epilogue.cu, gemm_ln.cu, gemm_chain.cu, mi_chain.cu, embedding.cu),
 * and the warp-grid rule of the tensor-core kernels, shared by the host (C11:
 * core/exec/gemm/ includes it as "kernels/gemm_abi.cuh") and the kernels
 * (CUDA C++ under NVRTC).
 *
 * As in attention_abi.cuh: each struct is passed BY VALUE as the single
 * kernel parameter, so host and device must agree on its layout byte for
 * byte: fixed-width types only, 8-byte fields first, then an even count of
 * 4-byte ones; the sizes are checked on both sides.
 *
 * All tensors are row-major in the model dtype (STOF_DTYPE) unless said
 * otherwise; row strides are in elements, multiples of 8, and base pointers
 * 16-byte aligned (16-byte vector loads and cp.async). The host checks. */
#ifndef STOF_KERNELS_GEMM_ABI_CUH
#define STOF_KERNELS_GEMM_ABI_CUH

#include "attention_abi.cuh" /* stof_attn_tmap */

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
typedef int stof_i32;
typedef long long stof_i64;
#define STOF_GEMM_ABI_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#include <stdint.h>
typedef int32_t stof_i32;
typedef int64_t stof_i64;
#define STOF_GEMM_ABI_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

/* gemm_epilogue.cu: y[m, n] = epilogue(sum_k x[m, k] w[n, k]).
 *   w is [N, K] (row n at w + n * w_row_stride), or with -DWEIGHT_KN=1
 *   [K, N] (row k at w + k * w_row_stride; a script's kn = true).
 *   The epilogue, in this order: + bias[n] (HAS_BIAS), the activation (ACT:
 *   0 none, 1 GELU erf, 2 GELU tanh, 3 ReLU), + residual[m, n]
 *   (HAS_RESIDUAL). residual must not overlap x or w; it may be y itself
 *   (every element is read and then written by the same thread).
 *   Rows m >= M are neither read nor written; N and K are multiples of 8.
 * The wgmma build (-DWGMMA=1) reads x and w by the tensor memory
 * accelerator: tmap_x and tmap_w are their tensor maps (16-bit elements,
 * dims (K, M) and (K, N), boxes 64 x BLOCK_M and 64 x BLOCK_N in the
 * 128-byte swizzle; gemm_exec encodes them at launch). Without a split of
 * K or a norm it also stores y by tmap_y (dims (N, M), boxes
 * stof_gemm_store_cols x 16, see stof_gemm_store_smem). Other builds ignore
 * them.
 * The wgmma build may close the epilogue with a row norm (NORM as in
 * gemm_ln: y = norm(s), s = residual + act(x w^T + bias), pre_norm = s with
 * STORE_PRE_NORM) when a cluster of SPLIT_K x NORM_TILES blocks holds whole
 * rows: N = NORM_TILES x BLOCK_N. gamma, beta, pre_norm, p_row_stride and
 * eps serve that build only; y and pre_norm may be residual itself. */
typedef struct stof_gemm_args {
    const void *x, *w, *bias, *residual, *gamma, *beta;
    void *y, *pre_norm;
    stof_i64 x_row_stride, w_row_stride, r_row_stride, y_row_stride, p_row_stride;
    stof_i32 m, n, k;
    float eps;
    stof_attn_tmap tmap_x, tmap_w; /* the same 128-byte maps as the attention's */
    stof_attn_tmap tmap_y;         /* the persistent wgmma build's stores */
} stof_gemm_args;

/* the fields above (120 bytes), padded to the maps' 64-byte alignment, then
 * the maps */
#define STOF_GEMM_ARGS_BYTES (128 + 3 * 128)

/* The norm build of gemm_epilogue: at most this many blocks a cluster (16
 * needs the non-portable cluster size sm_90 allows), and the static shared
 * memory it keeps beside the ring for the rows' statistics (at most 128
 * rows: two partial sums from each of two warpgroups, one pair to share). */
#define STOF_GEMM_MAX_CLUSTER 16
#define STOF_GEMM_NORM_SMEM (2 * 2 * 128 * 4 + 128 * 8)
STOF_GEMM_ABI_STATIC_ASSERT(sizeof(stof_gemm_args) == STOF_GEMM_ARGS_BYTES,
                            "stof_gemm_args layout changed: host and kernels must agree");

/* gemm_ln.cu: a GEMM whose epilogue closes with a row norm:
 *   s[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]) (+ residual[m, n])
 *   pre_norm[m] = s[m] (STORE_PRE_NORM), y[m] = norm(s[m]) (NORM: 1
 *   LayerNorm with gamma and beta, biased variance; 2 RMSNorm with gamma),
 * statistics in fp32 from the unrounded s. w as in stof_gemm_args (WEIGHT_KN
 * selects [K, N]). n is the row length the kernel was compiled for (ROW_N;
 * the host checks they agree). y and pre_norm may be residual itself (each
 * element is read before it is written, by the same thread); none of them
 * may overlap x or w. Rows m >= M are neither read nor written. */
typedef struct stof_gemm_ln_args {
    const void *x, *w, *bias, *residual, *gamma, *beta;
    void *y, *pre_norm;
    stof_i64 x_row_stride, w_row_stride, r_row_stride, y_row_stride, p_row_stride;
    float eps;
    stof_i32 m, n, k;
} stof_gemm_ln_args;

#define STOF_GEMM_LN_ARGS_BYTES (13 * 8 + 4 * 4)
STOF_GEMM_ABI_STATIC_ASSERT(sizeof(stof_gemm_ln_args) == STOF_GEMM_LN_ARGS_BYTES,
                            "stof_gemm_ln_args layout changed: host and kernels must agree");

/* gemm_chain.cu: two GEMMs through an activation, the intermediate never
 * leaving the chip (a transformer's FFN):
 *   h[m, f] = act(sum_k x[m, k] w1[f, k] (+ b1[f]))      (ACT, HAS_BIAS1)
 *   y[m, n] = sum_f h[m, f] w2[n, f] (+ b2[n]) (+ residual[m, n])
 *                                                       (HAS_BIAS2, HAS_RESIDUAL)
 * h is rounded to the model dtype, as the unfused pair would store it.
 * w1 is [F, K] and w2 [N, F], or with WEIGHT_KN=1 both transposed ([K, F],
 * [F, N]: kn = true). n is the output width the kernel was compiled
 * for (OUT_N; the host checks). y may be residual itself; neither may
 * overlap x, w1 or w2. Rows m >= M are neither read nor written. */
typedef struct stof_gemm_chain_args {
    const void *x, *w1, *b1, *w2, *b2, *residual;
    void *y;
    stof_i64 x_row_stride, w1_row_stride, w2_row_stride, r_row_stride, y_row_stride;
    stof_i32 m, k, f, n;
} stof_gemm_chain_args;

#define STOF_GEMM_CHAIN_ARGS_BYTES (12 * 8 + 4 * 4)
STOF_GEMM_ABI_STATIC_ASSERT(sizeof(stof_gemm_chain_args) == STOF_GEMM_CHAIN_ARGS_BYTES,
                            "stof_gemm_chain_args layout changed: host and kernels must agree");


/* The warp grid of a tensor-core tile: of the splits of `warps` warps into
 * wm x (warps / wm) (wm 1, 2 or 4) whose warp tiles are whole 16 x 16 mma
 * pairs, the one whose warp tile is closest to square (the first on a tie);
 * 0 when there is none. One definition for the kernels (a constant
 * expression there) and the host's feasibility checks. */
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define STOF_GEMM_ABI_FN constexpr
#else
#define STOF_GEMM_ABI_FN static inline
#endif
STOF_GEMM_ABI_FN int stof_gemm_warp_skew(int bm, int bn, int warps, int wm) {
    return bm / wm > bn / (warps / wm) ? bm / wm - bn / (warps / wm)
                                       : bn / (warps / wm) - bm / wm;
}
STOF_GEMM_ABI_FN int stof_gemm_warps_m(int bm, int bn, int warps) {
    int best = 0;
    for (int wm = 1; wm <= 4; wm *= 2)
        if (wm <= warps && warps % wm == 0 && bm % (wm * 16) == 0 &&
            bn % ((warps / wm) * 16) == 0 &&
            (best == 0 || stof_gemm_warp_skew(bm, bn, warps, wm) <
                              stof_gemm_warp_skew(bm, bn, warps, best)))
            best = wm;
    return best;
}

/* The settings (BLOCK_M, BLOCK_N, BLOCK_K, WARPS, STAGES) gemm_epilogue.cu
 * can build with Hopper's wgmma (-DWGMMA=1, sm_90a): whole warpgroups of 4
 * warps tiling the block in pieces of 64 rows, each piece's columns one
 * wgmma N (32, 64, 128 or 256), BLOCK_K 64 (rows of 128 bytes in the
 * 128-byte swizzle) and at least 3 stages (the ring holds STAGES - 1
 * slices ahead of the products). Its blocks have one warp more than
 * WARPS, which issues the copies (gemm_exec adds it to the launch). The
 * tiles start on a 1024-byte boundary, so such a setting needs
 * STOF_GEMM_WGMMA_SLACK bytes of shared memory beyond its ring, whichever
 * build runs. */
#define STOF_GEMM_WGMMA_SLACK 1024
STOF_GEMM_ABI_FN int stof_gemm_wgmma_cols(int bm, int bn, int warps) {
    return warps % 4 == 0 && bm % 64 == 0 && bm >= 64 && (warps / 4) % (bm / 64) == 0 &&
                   bn % ((warps / 4) / (bm / 64)) == 0
               ? bn / ((warps / 4) / (bm / 64))
               : 0;
}
STOF_GEMM_ABI_FN int stof_gemm_wgmma_shape(int bm, int bn, int bk, int warps, int stages) {
    return bk == 64 && stages >= 3 &&
           (stof_gemm_wgmma_cols(bm, bn, warps) == 32 ||
            stof_gemm_wgmma_cols(bm, bn, warps) == 64 ||
            stof_gemm_wgmma_cols(bm, bn, warps) == 128 ||
            stof_gemm_wgmma_cols(bm, bn, warps) == 256);
}

/* The wgmma build without a split of K or a norm (the persistent one)
 * stores its output through shared memory by the tensor memory
 * accelerator: each warp stages 16 rows x stof_gemm_store_cols columns at
 * a time (16-bit elements, in the 64-byte swizzle of tmap_y's box) in one
 * of its stof_gemm_store_bufs buffers, and one lane copies them out, so a
 * tile's stores are whole sectors written while the warp goes on. A buffer
 * is reused once its copy has read it. Its shared memory beyond the ring
 * and the slack: stof_gemm_store_smem. A block whose ring leaves room for
 * only one on an SM gets STOF_GEMM_STORE_BUFS buffers a warp; a smaller one
 * gets one, so that two such blocks (128 x 128 x 64 in 3 stages) still fit
 * an SM and cover each other's stores. */
#define STOF_GEMM_STORE_BUFS 2
/* gemm_epilogue's ring: STAGES x (BLOCK_M + BLOCK_N) x BLOCK_K elements. */
STOF_GEMM_ABI_FN long long stof_gemm_ring_bytes(int bm, int bn, int bk, int stages,
                                                int elem_bytes) {
    return (long long)stages * (bm + bn) * bk * elem_bytes;
}
STOF_GEMM_ABI_FN int stof_gemm_store_cols(int bm, int bn, int warps) {
    return stof_gemm_wgmma_cols(bm, bn, warps) ? 32 : 0;
}
STOF_GEMM_ABI_FN int stof_gemm_store_bufs(int bm, int bn, int bk, int stages) {
    return stof_gemm_ring_bytes(bm, bn, bk, stages, 2) > 112 * 1024 ? STOF_GEMM_STORE_BUFS : 1;
}
STOF_GEMM_ABI_FN int stof_gemm_store_smem(int bm, int bn, int bk, int warps, int stages,
                                          int split_k, int norm) {
    return stof_gemm_wgmma_shape(bm, bn, bk, warps, stages) && split_k <= 1 && !norm
               ? warps * stof_gemm_store_bufs(bm, bn, bk, stages) * 16 *
                     stof_gemm_store_cols(bm, bn, warps) * 2
               : 0;
}

/* gemm_epilogue's dynamic shared memory, the one model of the template's
 * check and of the launch: the ring, + STOF_GEMM_WGMMA_SLACK where the
 * setting could be the wgmma build (on any architecture), + the persistent
 * build's staging. */
STOF_GEMM_ABI_FN long long stof_gemm_epilogue_smem(int bm, int bn, int bk, int warps,
                                                   int stages, int split_k, int norm,
                                                   int elem_bytes) {
    return stof_gemm_ring_bytes(bm, bn, bk, stages, elem_bytes) +
           (stof_gemm_wgmma_shape(bm, bn, bk, warps, stages) ? STOF_GEMM_WGMMA_SLACK : 0) +
           stof_gemm_store_smem(bm, bn, bk, warps, stages, split_k, norm);
}

/* gemm_chain.cu streams w2 through shared memory in slabs of this many
 * output columns. */
#define STOF_CHAIN_W2_COLS 64

/* The dynamic shared memory of gemm_ln.cu and gemm_chain.cu, the one model
 * of the template's check (fusion/templates.c) and of the launch (gemm_exec):
 * gemm_ln's ring of STAGES x (ROWS + BLOCK_N) x BLOCK_K elements plus its
 * ROWS x ROW_N fp32 rows; gemm_chain's ring of STAGES x (BLOCK_M + BLOCK_F)
 * x BLOCK_K elements plus the activated BLOCK_M x BLOCK_F chunk and two
 * slabs of BLOCK_F x STOF_CHAIN_W2_COLS of w2. */
STOF_GEMM_ABI_FN long long stof_gemm_ln_smem(int rows, int bn, int bk, int stages,
                                             long long row_n, int elem_bytes) {
    return stof_gemm_ring_bytes(rows, bn, bk, stages, elem_bytes) + (long long)rows * row_n * 4;
}
STOF_GEMM_ABI_FN long long stof_gemm_chain_smem(int bm, int bf, int bk, int stages,
                                                int elem_bytes) {
    return stof_gemm_ring_bytes(bm, bf, bk, stages, elem_bytes) +
           (long long)bm * bf * elem_bytes + 2LL * bf * STOF_CHAIN_W2_COLS * elem_bytes;
}

/* mi_chain.cu: for every row r < rows of ROW_N elements,
 *   s = x[r] (+ bias) (+ residual[r]), then the activation (ACT), then
 *   pre_norm[r] = s (STORE_PRE_NORM), y[r] = norm(s) (NORM: 0 none,
 *   1 LayerNorm with gamma and beta, biased variance, 2 RMSNorm with gamma).
 * y may be x or residual (each element is read before it is written, by the
 * same thread); pre_norm must not overlap the inputs. */
/* A thread of mi_chain.cu holds its share of a row in registers, at most
 * this many elements (ceil(ROW_N / VEC / threads per row) * VEC); the host
 * rejects settings above it. */
#define STOF_MI_MAX_PER_THREAD 64

typedef struct stof_mi_args {
    const void *x, *bias, *residual, *gamma, *beta;
    void *y, *pre_norm;
    stof_i64 rows;
    stof_i64 x_row_stride, r_row_stride, y_row_stride, p_row_stride;
    float eps;
    stof_i32 pad_;
} stof_mi_args;

#define STOF_MI_ARGS_BYTES (12 * 8 + 2 * 4)
STOF_GEMM_ABI_STATIC_ASSERT(sizeof(stof_mi_args) == STOF_MI_ARGS_BYTES,
                            "stof_mi_args layout changed: host and kernels must agree");

/* embedding.cu: out[t, :] = word[ids[t]] (+ pos[t % seq_len]) (+ type[r]),
 * r = type_ids[t] with HAS_TYPE_IDS, else 0, for every token t < tokens
 * (ids and type_ids [B, S] flattened, int32). A type id outside
 * [0, type_vocab) is bad input as a bad id is.
 * An id outside [0, vocab) cannot be clamped silently: its output row is
 * written as zeros and *error (a device int32 the host zeroes beforehand)
 * gets t + 1 for one such token (the first to claim it), so the host can
 * name the token and its id when it reads the flag back. */
typedef struct stof_embed_args {
    const stof_i32 *ids;
    const void *word, *pos, *type;
    void *out;
    stof_i32 *error;
    const stof_i32 *type_ids;
    const stof_i32 *pos_ids;   /* HAS_POS_IDS builds: each token's position row (a decode
                                  step's), else t % seq_len */
    stof_i64 tokens;
    stof_i32 seq_len, hidden, vocab, type_vocab;
    stof_i32 pos_rows, pad_;   /* the position table's rows */
} stof_embed_args;

#define STOF_EMBED_ARGS_BYTES (9 * 8 + 6 * 4)
STOF_GEMM_ABI_STATIC_ASSERT(sizeof(stof_embed_args) == STOF_EMBED_ARGS_BYTES,
                            "stof_embed_args layout changed: host and kernels must agree");

/* glu.cu: y[r, j] = act(x[r, j]) * x[r, f + j] for rows r < rows, j < f;
 * x [rows, 2f] and y [rows, f] packed. act is the kernel's ACT (gelu erf,
 * gelu tanh or silu). */
typedef struct stof_glu_args {
    const void *x;
    void *y;
    stof_i64 rows;
    stof_i32 f, pad_;
} stof_glu_args;

#define STOF_GLU_ARGS_BYTES (3 * 8 + 2 * 4)
STOF_GEMM_ABI_STATIC_ASSERT(sizeof(stof_glu_args) == STOF_GLU_ARGS_BYTES,
                            "stof_glu_args layout changed: host and kernels must agree");

/* rotary.cu: x and y [rows, width] packed, rows = batch x seq_len, each row
 * Q | K | V heads of HEAD_DIM (a compile-time constant). The first `rotated`
 * heads (Q and K) have the pairs (j, j + HEAD_DIM / 2) of each head rotated
 * by the angle s x theta^(-2j / HEAD_DIM), s = row % seq_len; the rest is
 * copied. */
typedef struct stof_rotary_args {
    const void *x;
    void *y;
    const stof_i32 *positions; /* HAS_POSITIONS builds: each row's position (a decode step's),
                                  else row % seq_len */
    stof_i64 rows;
    stof_i32 seq_len, width, rotated;
    float theta;
} stof_rotary_args;

#define STOF_ROTARY_ARGS_BYTES (4 * 8 + 4 * 4)
STOF_GEMM_ABI_STATIC_ASSERT(sizeof(stof_rotary_args) == STOF_ROTARY_ARGS_BYTES,
                            "stof_rotary_args layout changed: host and kernels must agree");

/* mask_rows.cu: y[r, :] = mask[r] != 0 ? x[r, :] : 0 for rows r < rows of n
 * elements (r a (batch, position) of the [B, S] int32 mask), packed. */
typedef struct stof_mask_rows_args {
    const void *x;
    const stof_i32 *mask;
    void *y;
    stof_i64 rows;
    stof_i32 n, pad_;
} stof_mask_rows_args;

#define STOF_MASK_ROWS_ARGS_BYTES (4 * 8 + 2 * 4)
STOF_GEMM_ABI_STATIC_ASSERT(sizeof(stof_mask_rows_args) == STOF_MASK_ROWS_ARGS_BYTES,
                            "stof_mask_rows_args layout changed: host and kernels must agree");

/* gemv.cu: gemm_epilogue's product and epilogue (bias, ACT, residual; no norm) for a few rows,
 * as a matrix-vector product: y[m, n] = residual[m, n] + act(sum_k x[m, k] w[n, k] + bias[n]).
 * With PROLOGUE_NORM (STOF_NORM_LAYERNORM or _RMSNORM) x's rows are first normalized over K with
 * gamma (and beta) [K] and eps, each value rounded to the dtype as a norm op would store it.
 * w is [N, K], or with WEIGHT_KN=1 [K, N]. With [N, K] weights N may be any width and y's and
 * the residual's row strides any value (elements are stored one at a time); with [K, N] ones N
 * is a multiple of 8. K is a multiple of 8, x and w rows 16-byte aligned. residual may be y
 * itself; neither may overlap x or w. The template runs at most STOF_GEMV_MAX_M rows, at most
 * STOF_GEMV_MAX_ROWS a block. */
typedef struct stof_gemv_args {
    const void *x, *w, *bias, *residual;
    const void *gamma, *beta; /* PROLOGUE_NORM builds: the norm's gain (and LayerNorm's bias) */
    void *y;
    stof_i64 x_row_stride, w_row_stride, r_row_stride, y_row_stride;
    stof_i32 m, n, k;
    float eps;                /* PROLOGUE_NORM builds */
} stof_gemv_args;

#define STOF_GEMV_ARGS_BYTES (11 * 8 + 4 * 4)
#define STOF_GEMV_MAX_M 16
#define STOF_GEMV_MAX_ROWS 16
/* gemv.cu's dynamic shared memory with [N, K] weights: a row group's x rows (ROWS, or M if
 * fewer) of K elements. */
STOF_GEMM_ABI_FN long long stof_gemv_smem(int rows, long long m, long long k, int elem_bytes) {
    return (rows < m ? rows : m) * k * elem_bytes;
}
/* gemv.cu's stages of weights after them (STAGES > 0, [N, K]): STAGES buffers of BLOCK_N rows'
 * chunks of UNROLL * 256 elements (K's, if shorter). */
STOF_GEMM_ABI_FN long long stof_gemv_stages_smem(int stages, int block_n, int unroll, long long k,
                                                 int elem_bytes) {
    const long long chunk = 256LL * unroll < k ? 256LL * unroll : k;
    return (long long)stages * block_n * chunk * elem_bytes;
}
STOF_GEMM_ABI_STATIC_ASSERT(sizeof(stof_gemv_args) == STOF_GEMV_ARGS_BYTES,
                            "stof_gemv_args layout changed: host and kernels must agree");

/* Kernel names, for cuModuleGetFunction. */
#define STOF_GEMM_EPILOGUE_KERNEL "stof_gemm_epilogue"
#define STOF_GEMM_LN_KERNEL "stof_gemm_ln"
#define STOF_GEMM_CHAIN_KERNEL "stof_gemm_chain"
#define STOF_MI_CHAIN_KERNEL "stof_mi_chain"
#define STOF_EMBEDDING_KERNEL "stof_embedding"
#define STOF_GLU_KERNEL "stof_glu"
#define STOF_ROTARY_KERNEL "stof_rotary"
#define STOF_MASK_ROWS_KERNEL "stof_mask_rows"
#define STOF_GEMV_KERNEL "stof_gemv"

/* Activation codes (ACT) and norm codes (NORM), the values of fusion_act and
 * fusion_norm in fusion/match.h. */
#define STOF_ACT_NONE 0
#define STOF_ACT_GELU 1
#define STOF_ACT_GELU_TANH 2
#define STOF_ACT_RELU 3
#define STOF_ACT_SILU 4 /* the glu template's only (not a fusion_act) */
#define STOF_NORM_NONE 0
#define STOF_NORM_LAYERNORM 1
#define STOF_NORM_RMSNORM 2

/* The activations in fp32, one definition for every kernel that applies
 * them (device code only). */
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
template <int Act> __device__ __forceinline__ float stof_activate(float v) {
    if (Act == STOF_ACT_GELU)
        return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    if (Act == STOF_ACT_GELU_TANH)
        return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    if (Act == STOF_ACT_RELU)
        return v > 0.0f ? v : 0.0f;
    if (Act == STOF_ACT_SILU)
        return v / (1.0f + expf(-v));
    return v;
}
#endif

#endif
