// Row-wise masked multi-head attention (paper §4.2, the CSR kernel): for
// very sparse masks, where a block-wise kernel would load mostly masked
// keys.
//
// Query rows are split across warps: each warp owns ROWS_PER_WARP rows of
// one (batch, head) and works alone (warp shuffles only, no __syncthreads).
// For its row it walks the CSR column list 32 keys at a time:
//
//   each lane takes one key j: s_j = q . k_j   (K row read as 16-byte vectors)
//   chunk max and sum by shuffles, online softmax across chunks (base 2)
//   O += sum_j p_j v_j: every lane owns pairs of output dims and receives
//                       p_j and j by __shfl_sync, key after key
//   O /= l; a row with no allowed key writes zeros
//
// With -DPADDING=1 an attention_mask (right padding) gives each sequence
// its length at run time: keys past it are masked, padded rows write zeros.
// With -DLSE=1 each row's log-sum-exp goes to stof_attn_args.lse as well.
//
// Grid (ceil(q_len / (WARPS_PER_BLOCK * ROWS_PER_WARP)), heads, batch); the
// query row lives in shared memory as fp32 (one slice per warp).
#include "attention_common.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef ROWS_PER_WARP
#define ROWS_PER_WARP 1
#endif
#ifndef WARPS_PER_BLOCK
#define WARPS_PER_BLOCK 4
#endif
#ifndef STOF_DTYPE
#define STOF_DTYPE 1
#endif
#ifndef HAS_RELPOS
#define HAS_RELPOS 0
#endif
#ifndef PADDING  // 1: a run-time attention_mask (stof_attn_args.pad_mask)
#define PADDING 0
#endif
#ifndef LSE  // 1: each row's log-sum-exp to stof_attn_args.lse
#define LSE 0
#endif

using elem_t = typename stof::dtype_of<STOF_DTYPE>::type;
using namespace stof::attn;

constexpr int kPairs = HEAD_DIM / 2;            // output dims go by pairs
constexpr int kPairRounds = (kPairs + 31) / 32; // pairs per lane (the last round may be short)

static_assert(STOF_DTYPE == 1 || STOF_DTYPE == 2, "attention runs in fp16 or bf16");
static_assert(HEAD_DIM % 8 == 0 && HEAD_DIM <= 256, "HEAD_DIM: a multiple of 8 up to 256");

#include "attention_chunk.cuh"

// The lane's score for its key of the chunk (-inf when the chunk is short).
__device__ __forceinline__ float chunk_score(const stof_attn_args &a, const float *sq,
                                             const elem_t *k, int row, int col, bool valid,
                                             int h) {
    if (!valid)
        return STOF_NEG_INF;
    float s = dot_row(sq, k + col * a.k_row_stride) * a.scale_log2;
#if HAS_RELPOS
    s += relpos_bias_log2<elem_t>(a, row, col, h);
#endif
    return s;
}

extern "C" __global__ void __launch_bounds__(WARPS_PER_BLOCK * 32)
stof_attention_row(const stof_attn_args a) {
    stof::grid_dependency_begin();  // before any read (common.cuh)
    __shared__ __align__(16) float s_query[WARPS_PER_BLOCK][HEAD_DIM];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int h = blockIdx.y, b = blockIdx.z;
    float *sq = s_query[warp];

#if PADDING
    // keys past the sequence's length are masked and not read; its padded rows write zeros
    // (the padded layout) or nothing (the ragged one, from its first row on)
    const sequence_rows sq_rows = sequence_of(a.seq_start, a.pad_mask, b, a.q_len);
    const int kv_len = sq_rows.len, first = sq_rows.first;
    const int rows = a.seq_start ? kv_len : a.q_len;
#else
    const int kv_len = a.k_len, first = 0, rows = a.q_len;
#endif
    const elem_t *k = static_cast<const elem_t *>(a.k) + b * a.k_batch_stride +
                      first * a.k_row_stride + (h / a.kv_group) * HEAD_DIM;
    const elem_t *v = static_cast<const elem_t *>(a.v) + b * a.v_batch_stride +
                      first * a.v_row_stride + (h / a.kv_group) * HEAD_DIM;
    const long long ptr_base = a.fmt_batch == 1 ? 0LL : (long long)b * (a.q_len + 1);

    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        const int row = (blockIdx.x * WARPS_PER_BLOCK + warp) * ROWS_PER_WARP + r;
        if (row >= rows)
            break;  // warp-uniform
        load_query(sq, static_cast<const elem_t *>(a.q) + b * a.q_batch_stride +
                           (first + row) * a.q_row_stride + h * HEAD_DIM,
                   lane);
        const long long start = __ldg(a.row_ptr + ptr_base + row);
        const long long end = PADDING && row >= kv_len ? start
                                                       : __ldg(a.row_ptr + ptr_base + row + 1);

        float m = STOF_NEG_INF, l = 0.0f;
        float2 acc[kPairRounds];
#pragma unroll
        for (int i = 0; i < kPairRounds; ++i) acc[i] = make_float2(0.0f, 0.0f);

        for (long long c0 = start; c0 < end; c0 += 32) {
            const int n = (int)(end - c0 < 32 ? end - c0 : 32);
            const int listed = lane < n ? __ldg(a.col_idx + c0 + lane) : -1;
            const bool take = listed >= 0 && (!PADDING || listed < kv_len);
            const int col = take ? listed : 0;  // (a key not taken: row 0's V, weight 0)
            const float s = chunk_score(a, sq, k, row, col, take, h);
            const float p = chunk_softmax(s, m, l, acc);
            chunk_pv(acc, v, a.v_row_stride, p, col, n, lane);
        }
#if LSE
        if (lane == 0)
            a.lse[((long long)b * a.heads + h) * a.q_len + row] =
                l > 0.0f ? m + log2f(l) : STOF_NEG_INF;
#endif
        store_row(static_cast<elem_t *>(a.o) + b * a.o_batch_stride +
                      (first + row) * a.o_row_stride +
                      h * HEAD_DIM,
                  acc, l, lane);
        __syncwarp();  // the next row's query overwrites sq
    }
}
