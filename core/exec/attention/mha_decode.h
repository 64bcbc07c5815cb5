/* Decode-step attention on the GPU (kernels/attention_decode.cu): one new token a sequence
 * against its layer's KV cache, and the prefill's store into that cache.
 *
 *   mha_decode_plan   a layer's step made ready: its mask's bits on the device, the split of
 *                     the keys over CTAs (flash-decoding) and its workspace, the kernels
 *                     compiled and loaded;
 *   mha_decode_run    one step: writes the new K and V into the cache, attends, writes O;
 *   mha_decode_store  after a prefill: the K and V of each sequence's last cap positions.
 *
 * The CPU reference of both is ops/kv_cache.h. */
#ifndef STOF_CORE_MHA_DECODE_H
#define STOF_CORE_MHA_DECODE_H

#include <cuda.h>
#include <stdint.h>

#include "core/exec/attention/mha_exec.h"
#include "kernels/attention_decode_abi.cuh"
#include "ops/mask.h"
#include "stof.h"

typedef struct mha_decode_problem {
    int batch, heads, kv_heads, head_dim;
    stof_dtype dtype;       /* STOF_F16 or STOF_BF16 */
    int cap;                /* cache slots a sequence (ops_kv_cache_span) */
    int context;            /* positions 0 .. context - 1 */
    float scale;
    const mask *mask;       /* context x context, batch 1 or `batch`; NULL: every earlier key */
    double rotary_theta;    /* > 0: a rotary op of this base fused in front (Q and the new K
                               rotated by its positions); 0: none */
} mha_decode_problem;

int mha_decode_validate(const mha_decode_problem *p, stof_error *err);

/* The split of a step's at most cap keys over CTAs (one a sequence and K/V head): doubled
 * until there are MHA_DECODE_CTAS_PER_SM CTAs an SM or a split would get fewer than 256 keys;
 * splits 0 asks for that. */
#define MHA_DECODE_CTAS_PER_SM 32
int mha_decode_default_splits(const mha_decode_problem *p, int sm_count);
/* The query heads a CTA of plan (p, splits) serves by default on sm_count SMs (0: unknown):
 * all of a K/V head's, or where the grid has fewer CTAs than SMs the fewest (a divisor of
 * them) that keep it so. */
int mha_decode_default_cta_heads(const mha_decode_problem *p, int splits, int sm_count);

/* How a lane reads the V rows (attention_decode.cu): pairs of dims of every key (4 bytes a
 * key), or 16 bytes of one key a load (heads of 32, 64 or 128, up to 4 query heads a CTA:
 * far fewer instructions a key, more registers). */
enum { MHA_DECODE_V_CHOSEN, MHA_DECODE_V_PAIRS, MHA_DECODE_V_WIDE };
/* The default: wide where a build can be, unless a CTA of several query heads would hold so
 * many registers that a grid of more CTAs than SMs loses CTAs an SM. */
int mha_decode_default_v_read(const mha_decode_problem *p, int splits, int cta_heads,
                              int sm_count);
/* The warps a CTA of plan (p, splits) takes by default on sm_count SMs, its heads a CTA the
 * default's: 4, or 8 where few CTAs each have many tiles of keys. */
int mha_decode_default_warps(const mha_decode_problem *p, int splits, int sm_count);

/* A plan's settings; a 0 is the default's (mha_decode_default_*). */
typedef struct mha_decode_settings {
    int splits, warps;
    int cta_heads; /* query heads a CTA (the build's GROUP): a divisor of heads / kv_heads */
    int v_read;    /* MHA_DECODE_V_* */
} mha_decode_settings;

typedef struct mha_decode_plan {
    mha_decode_problem problem;
    int splits, chunk, warps;
    int cta_heads;           /* grid x is heads / cta_heads */
    int v_read;              /* MHA_DECODE_V_PAIRS or _WIDE */
    CUdeviceptr d_mask;      /* the mask's bits, or 0: no mask, or one the ring of cap slots is */
    CUdeviceptr d_workspace; /* partial O and (m, l) when splits > 1 */
    size_t workspace_ml_offset;
    CUfunction decode, combine, store;
    mha_exec_ctx *ctx;
} mha_decode_plan;

/* s: NULL for every default. */
int mha_decode_plan_create(mha_exec_ctx *c, const mha_decode_problem *p,
                           const mha_decode_settings *s, mha_decode_plan **out, stof_error *err);
void mha_decode_plan_free(mha_decode_plan *plan);

/* The tensors of a step: qkv [batch] rows of (heads + 2 kv_heads) head_dim (row stride in
 * elements, 0: packed; else at least a row and a multiple of 8, rows 16-byte aligned), positions int32 [batch], the caches [batch][cap][kv_heads][head_dim],
 * o [batch][heads * head_dim]. */
typedef struct mha_decode_tensors {
    CUdeviceptr qkv, positions, k_cache, v_cache, o;
    int64_t qkv_row_stride;
    CUdeviceptr rotary_positions; /* int32 [batch]: the fused rotary's (rotary_theta > 0) */
} mha_decode_tensors;

int mha_decode_run(const mha_decode_plan *plan, const mha_decode_tensors *t, CUstream s,
                   stof_error *err);
/* A prefill's qkv [batch, seq, width] (pad_mask: its attention_mask [batch, seq], or 0) into
 * the caches. */
int mha_decode_store(const mha_decode_plan *plan, CUdeviceptr qkv, int seq, CUdeviceptr pad_mask,
                     CUdeviceptr k_cache, CUdeviceptr v_cache, CUstream s, stof_error *err);

#endif
