// Global tokens of a self-attention (Longformer's): the index of each
// sequence's global tokens, their keys merged into the other rows' window
// attention, and the global rows themselves. The steps, the grids and the
// argument block are in attention_global_abi.cuh.
//
// Every query attends the global keys: the window attention already did
// those its mask allows, so step 3 adds the others to O through the row's
// log-sum-exp L (base 2): with m = max(L, s_g), the merged row is
//   (O 2^(L - m) + sum_g 2^(s_g - m) v_g) / (2^(L - m) + sum_g 2^(s_g - m)),
// the online softmax of attention_row.cu started from (m = L, l = 1, O).
// A global query attends every key of its sequence (step 4), as the
// row-wise kernel walks a row, 32 keys a chunk.
#include "attention_common.cuh"
#include "attention_global_abi.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef STOF_DTYPE
#define STOF_DTYPE 1
#endif

using elem_t = typename stof::dtype_of<STOF_DTYPE>::type;
using namespace stof::attn;

constexpr int kPairs = HEAD_DIM / 2;
constexpr int kPairRounds = (kPairs + 31) / 32;
constexpr int kIndexThreads = STOF_ATTN_GLOBAL_INDEX_THREADS;
constexpr int kWarps = STOF_ATTN_GLOBAL_WARPS;
constexpr int kRowsPerWarp = STOF_ATTN_GLOBAL_ROWS / STOF_ATTN_GLOBAL_WARPS;

static_assert(STOF_DTYPE == 1 || STOF_DTYPE == 2, "attention runs in fp16 or bf16");
static_assert(HEAD_DIM % 8 == 0 && HEAD_DIM <= 256, "HEAD_DIM: a multiple of 8 up to 256");
static_assert(STOF_ATTN_GLOBAL_ROWS % STOF_ATTN_GLOBAL_WARPS == 0, "whole rows a warp");

#include "attention_chunk.cuh"

// The sequence's length: its attention_mask's ones, else every position.
__device__ __forceinline__ int sequence_length(const stof_attn_global_args &a, int b) {
    return a.pad_mask ? padded_length(a.pad_mask, b, a.q_len) : a.q_len;
}

// Inclusive sum over the block (blockDim.x a multiple of 32, at most 1024).
__device__ __forceinline__ int block_inclusive_sum(int x, int *s_warp) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) s_warp[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int t = lane < warps ? s_warp[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += y;
        }
        s_warp[lane] = t;
    }
    __syncthreads();
    return x + (warp ? s_warp[warp - 1] : 0);
}

// Step 1: thread t scans its own run of positions; their order is kept.
extern "C" __global__ void __launch_bounds__(kIndexThreads)
stof_attention_global_index(const stof_attn_global_args a) {
    stof::grid_dependency_begin();  // before any read (common.cuh)
    __shared__ int s_warp[32];
    const int b = blockIdx.x, len = sequence_length(a, b);
    const stof_i32 *gm = a.global_mask + (long long)b * a.q_len;
    stof_i32 *index = a.index + (long long)b * (a.q_len + 1);
    const int per = (len + kIndexThreads - 1) / kIndexThreads;
    const int lo = min(len, (int)threadIdx.x * per), hi = min(len, lo + per);
    int count = 0;
    for (int j = lo; j < hi; ++j) count += __ldg(gm + j) != 0;
    int at = block_inclusive_sum(count, s_warp) - count;
    for (int j = lo; j < hi; ++j)
        if (__ldg(gm + j) != 0) index[1 + at++] = j;
    if (threadIdx.x == kIndexThreads - 1) index[0] = at;  // the last run ends the list
}

// Step 3: warp w of block x takes rows (x kWarps + w) kRowsPerWarp + r of head h.
extern "C" __global__ void __launch_bounds__(kWarps * 32)
stof_attention_global_keys(const stof_attn_global_args a) {
    stof::grid_dependency_begin();
    __shared__ __align__(16) float s_query[kWarps][HEAD_DIM];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int h = blockIdx.y, b = blockIdx.z;
    const stof_i32 *index = a.index + (long long)b * (a.q_len + 1);
    const int n_global = __ldg(index);
    if (n_global == 0) return;
    const int len = sequence_length(a, b);
    const stof_i32 *gm = a.global_mask + (long long)b * a.q_len;
    const long long head = (long long)(h / a.kv_group) * HEAD_DIM;
    const elem_t *k = static_cast<const elem_t *>(a.k) + b * a.batch_stride + head;
    const elem_t *v = static_cast<const elem_t *>(a.v) + b * a.batch_stride + head;
    const float *lse = a.lse + ((long long)b * a.heads + h) * a.q_len;
    const stof_u64 *bits = a.mask_bits + (long long)(a.fmt_batch == 1 ? 0 : b) * a.q_len * a.words;
    float *sq = s_query[warp];
    for (int r = 0; r < kRowsPerWarp; ++r) {
        const int row = (blockIdx.x * kWarps + warp) * kRowsPerWarp + r;
        if (row >= len) break;                 // padded rows stay zeros (warp-uniform)
        if (__ldg(gm + row) != 0) continue;    // a global row: step 4 writes it
        const stof_u64 *allowed = bits + (long long)row * a.words;
        elem_t *out = static_cast<elem_t *>(a.o) + b * a.o_batch_stride + row * a.o_row_stride +
                      h * HEAD_DIM;
        float m = __ldg(lse + row), l = m == STOF_NEG_INF ? 0.0f : 1.0f;
        float2 acc[kPairRounds];
#pragma unroll
        for (int i = 0; i < kPairRounds; ++i) {
            const int pair = lane + 32 * i;
            acc[i] = pair < kPairs && l > 0.0f
                         ? unpack2<elem_t>(*reinterpret_cast<const unsigned *>(out + 2 * pair))
                         : make_float2(0.0f, 0.0f);
        }
        load_query(sq, static_cast<const elem_t *>(a.q) + b * a.batch_stride +
                           row * a.row_stride + h * HEAD_DIM, lane);
        bool added = false;
        for (int c0 = 0; c0 < n_global; c0 += 32) {
            const int n = min(32, n_global - c0);
            const int col = lane < n ? __ldg(index + 1 + c0 + lane) : 0;
            const bool take = lane < n && !((__ldg(allowed + (col >> 6)) >> (col & 63)) & 1ull);
            if (!__any_sync(0xffffffffu, take)) continue;  // the window had them all
            const float s = take ? dot_row(sq, k + col * a.row_stride) * a.scale_log2
                                 : STOF_NEG_INF;
            const float p = chunk_softmax(s, m, l, acc);
            chunk_pv(acc, v, a.row_stride, p, col, n, lane);
            added = true;
        }
        if (added) store_row(out, acc, l, lane);
        __syncwarp();  // the next row's query overwrites sq
    }
}

// Step 4: the warps of the grid's x blocks of (h, b) share out the global rows.
extern "C" __global__ void __launch_bounds__(kWarps * 32)
stof_attention_global_rows(const stof_attn_global_args a) {
    stof::grid_dependency_begin();
    __shared__ __align__(16) float s_query[kWarps][HEAD_DIM];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int h = blockIdx.y, b = blockIdx.z;
    const stof_i32 *index = a.index + (long long)b * (a.q_len + 1);
    const int n_global = __ldg(index);
    const int len = sequence_length(a, b);
    const long long head = (long long)(h / a.kv_group) * HEAD_DIM;
    const elem_t *k = static_cast<const elem_t *>(a.gk) + b * a.batch_stride + head;
    const elem_t *v = static_cast<const elem_t *>(a.gv) + b * a.batch_stride + head;
    float *sq = s_query[warp];
    for (int t = blockIdx.x * kWarps + warp; t < n_global; t += gridDim.x * kWarps) {
        const int row = __ldg(index + 1 + t);
        load_query(sq, static_cast<const elem_t *>(a.gq) + b * a.batch_stride +
                           row * a.row_stride + h * HEAD_DIM, lane);
        float m = STOF_NEG_INF, l = 0.0f;
        float2 acc[kPairRounds];
#pragma unroll
        for (int i = 0; i < kPairRounds; ++i) acc[i] = make_float2(0.0f, 0.0f);
        for (int c0 = 0; c0 < len; c0 += 32) {
            const int n = min(32, len - c0), col = c0 + (lane < n ? lane : 0);
            const float s = lane < n ? dot_row(sq, k + col * a.row_stride) * a.scale_log2
                                     : STOF_NEG_INF;
            const float p = chunk_softmax(s, m, l, acc);
            chunk_pv(acc, v, a.row_stride, p, col, n, lane);
        }
        store_row(static_cast<elem_t *>(a.o) + b * a.o_batch_stride + row * a.o_row_stride +
                      h * HEAD_DIM,
                  acc, l, lane);
        __syncwarp();
    }
}
