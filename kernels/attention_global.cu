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

// The sequence's rows: its first (ragged layout) and its length.
__device__ __forceinline__ sequence_rows sequence_at(const stof_attn_global_args &a, int b) {
    return sequence_of(a.seq_start, a.pad_mask, b, a.q_len);
}

// Sequence b of head h as steps 3 and 4 see it: its length, the offset of its first row in
// the inputs (q, k, v and their global projections share one layout), the offset of the
// head's K/V columns (grouped-query heads share them) and its first output row.
struct sequence_head {
    int len;
    long long in_base, kv_head;
    elem_t *o;
};

__device__ __forceinline__ sequence_head sequence_head_at(const stof_attn_global_args &a, int b,
                                                          int h) {
    const sequence_rows sr = sequence_at(a, b);
    sequence_head s;
    s.len = sr.len;
    s.in_base = b * a.batch_stride + sr.first * a.row_stride;
    s.kv_head = (long long)(h / a.kv_group) * HEAD_DIM;
    s.o = static_cast<elem_t *>(a.o) + b * a.o_batch_stride + sr.first * a.o_row_stride;
    return s;
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

// The online softmax of a chunk for G rows (queries consecutive in sq, D floats each): the
// lane's key row krow scored against every row at once (dot_key), -inf where take is false;
// p gets each row's weight of the lane's key.
template <int G>
__device__ __forceinline__ void chunk_softmax_rows(const float *sq, const elem_t *krow,
                                                   const bool (&take)[G], float scale_log2,
                                                   float (&m)[G], float (&l)[G],
                                                   float2 (&acc)[G][kPairRounds], float (&p)[G]) {
    float s[G];
#pragma unroll
    for (int g = 0; g < G; ++g) s[g] = 0.0f;
    dot_key<elem_t, HEAD_DIM, G>(sq, krow, s);
#pragma unroll
    for (int g = 0; g < G; ++g)
        p[g] = chunk_softmax(take[g] ? s[g] * scale_log2 : STOF_NEG_INF, m[g], l[g], acc[g]);
}

// acc[g] += sum over the chunk's n keys of p[g]_j v_j for each of G rows: chunk_pv with
// one V row load a key serving every row.
template <int G>
__device__ __forceinline__ void chunk_pv_rows(float2 (&acc)[G][kPairRounds], const elem_t *v,
                                              long long v_stride, const float (&p)[G], int col,
                                              int n, int lane) {
#pragma unroll 2
    for (int jj = 0; jj < n; ++jj) {
        const elem_t *vrow = v + __shfl_sync(0xffffffffu, col, jj) * v_stride;
#pragma unroll
        for (int i = 0; i < kPairRounds; ++i) {
            const int pair = lane + 32 * i;
            const unsigned *v_pair = reinterpret_cast<const unsigned *>(vrow + 2 * pair);
            const float2 x = pair < kPairs ? unpack2<elem_t>(__ldg(v_pair))
                                           : make_float2(0.0f, 0.0f);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float pj = __shfl_sync(0xffffffffu, p[g], jj);
                acc[g][i].x = fmaf(pj, x.x, acc[g][i].x);
                acc[g][i].y = fmaf(pj, x.y, acc[g][i].y);
            }
        }
    }
}

// Step 1: thread t scans its own run of positions; their order is kept.
extern "C" __global__ void __launch_bounds__(kIndexThreads)
stof_attention_global_index(const stof_attn_global_args a) {
    stof::grid_dependency_begin();  // before any read (common.cuh)
    __shared__ int s_warp[32];
    const int b = blockIdx.x, len = sequence_at(a, b).len;
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

// Step 3: warp w of block x takes the kRowsPerWarp consecutive rows from
// (x kWarps + w) kRowsPerWarp of head h, all at once: one K row a lane
// scores every row of the group (dot_key), and one V row load serves them
// all in the P V sum. A row past the sequence or of a global token is
// carried along but not stored (step 4 writes a global row).
extern "C" __global__ void __launch_bounds__(kWarps * 32)
stof_attention_global_keys(const stof_attn_global_args a) {
    stof::grid_dependency_begin();
    __shared__ __align__(16) float s_query[kWarps][kRowsPerWarp * HEAD_DIM];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int h = blockIdx.y, b = blockIdx.z;
    const stof_i32 *index = a.index + (long long)b * (a.q_len + 1);
    const int n_global = __ldg(index);
    const sequence_head sh = sequence_head_at(a, b, h);
    const int len = sh.len;
    const long long in_base = sh.in_base;
    const int row0 = (blockIdx.x * kWarps + warp) * kRowsPerWarp;
    if (n_global == 0 || row0 >= len) return;
    const stof_i32 *gm = a.global_mask + (long long)b * a.q_len;
    const elem_t *k = static_cast<const elem_t *>(a.k) + in_base + sh.kv_head;
    const elem_t *v = static_cast<const elem_t *>(a.v) + in_base + sh.kv_head;
    elem_t *o = sh.o;
    const float *lse = a.lse + ((long long)b * a.heads + h) * a.q_len;
    const stof_u64 *bits = a.mask_bits + (long long)(a.fmt_batch == 1 ? 0 : b) * a.q_len * a.words;
    float *sq = s_query[warp];
    elem_t *out[kRowsPerWarp];
    const stof_u64 *allowed[kRowsPerWarp];
    bool live[kRowsPerWarp], added[kRowsPerWarp];
    float m[kRowsPerWarp], l[kRowsPerWarp];
    float2 acc[kRowsPerWarp][kPairRounds];
    // each row starts from the window's softmax, as one chunk: (m = L, l = 1, O)
#pragma unroll
    for (int g = 0; g < kRowsPerWarp; ++g) {
        const int row = min(row0 + g, len - 1);  // rows past the sequence: a stand-in, not stored
        live[g] = row0 + g < len && __ldg(gm + row) == 0;
        added[g] = false;
        allowed[g] = bits + (long long)row * a.words;
        out[g] = o + row * a.o_row_stride + h * HEAD_DIM;
        m[g] = __ldg(lse + row);
        l[g] = m[g] == STOF_NEG_INF ? 0.0f : 1.0f;
#pragma unroll
        for (int i = 0; i < kPairRounds; ++i) {
            const int pair = lane + 32 * i;
            const unsigned *o_pair = reinterpret_cast<const unsigned *>(out[g] + 2 * pair);
            acc[g][i] = pair < kPairs && l[g] > 0.0f ? unpack2<elem_t>(*o_pair)
                                                     : make_float2(0.0f, 0.0f);
        }
        load_query(sq + g * HEAD_DIM, static_cast<const elem_t *>(a.q) + in_base +
                                          row * a.row_stride + h * HEAD_DIM, lane);
    }
    for (int c0 = 0; c0 < n_global; c0 += 32) {
        const int n = min(32, n_global - c0);
        const int col = lane < n ? __ldg(index + 1 + c0 + lane) : 0;
        bool take[kRowsPerWarp], any = false;
#pragma unroll
        for (int g = 0; g < kRowsPerWarp; ++g) {
            take[g] = live[g] && lane < n &&
                      !((__ldg(allowed[g] + (col >> 6)) >> (col & 63)) & 1ull);
            any = any || __any_sync(0xffffffffu, take[g]);
        }
        if (!any) continue;  // the windows had them all
        float p[kRowsPerWarp];
        chunk_softmax_rows(sq, k + col * a.row_stride, take, a.scale_log2, m, l, acc, p);
#pragma unroll
        for (int g = 0; g < kRowsPerWarp; ++g)
            added[g] = added[g] || __any_sync(0xffffffffu, take[g]);
        chunk_pv_rows(acc, v, a.row_stride, p, col, n, lane);
    }
#pragma unroll
    for (int g = 0; g < kRowsPerWarp; ++g)
        if (added[g]) store_row(out[g], acc[g], l[g], lane);
}

// Step 4: block x of (h, b) takes the groups of kGroup global rows x, x + gridDim.x, ...
// Its warps share out the keys (chunks of 32, warp w from 32 w on, kRowsWarps chunks apart);
// each scores a chunk against every row of the group from one K row load a lane (dot_key),
// and one V row load serves every row's P V, so that the group reads K and V once. The
// warps' online softmaxes are merged through shared memory.
constexpr int kRowsWarps = STOF_ATTN_GLOBAL_ROW_WARPS;
constexpr int kGroup = STOF_ATTN_GLOBAL_ROW_GROUP;

extern "C" __global__ void __launch_bounds__(kRowsWarps * 32)
stof_attention_global_rows(const stof_attn_global_args a) {
    stof::grid_dependency_begin();
    __shared__ __align__(16) float s_query[kGroup * HEAD_DIM];
    __shared__ __align__(16) float s_acc[kRowsWarps][kGroup][HEAD_DIM];
    __shared__ float s_m[kRowsWarps][kGroup], s_l[kRowsWarps][kGroup];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int h = blockIdx.y, b = blockIdx.z;
    const stof_i32 *index = a.index + (long long)b * (a.q_len + 1);
    const int n_global = __ldg(index);
    const sequence_head sh = sequence_head_at(a, b, h);
    const int len = sh.len;
    const long long in_base = sh.in_base;
    const elem_t *k = static_cast<const elem_t *>(a.gk) + in_base + sh.kv_head;
    const elem_t *v = static_cast<const elem_t *>(a.gv) + in_base + sh.kv_head;
    elem_t *o = sh.o;
    for (int t0 = blockIdx.x * kGroup; t0 < n_global; t0 += gridDim.x * kGroup) {
        const int rows = min(kGroup, n_global - t0);
        // the group's queries (rows past it: zeros, computed and dropped)
        for (int g = warp; g < kGroup; g += kRowsWarps) {
            if (g < rows)
                load_query(s_query + g * HEAD_DIM,
                           static_cast<const elem_t *>(a.gq) + in_base +
                               __ldg(index + 1 + t0 + g) * a.row_stride + h * HEAD_DIM,
                           lane);
            else
                for (int d = lane; d < HEAD_DIM; d += 32) s_query[g * HEAD_DIM + d] = 0.0f;
        }
        __syncthreads();
        float m[kGroup], l[kGroup];
        float2 acc[kGroup][kPairRounds];
#pragma unroll
        for (int g = 0; g < kGroup; ++g) {
            m[g] = STOF_NEG_INF;
            l[g] = 0.0f;
#pragma unroll
            for (int i = 0; i < kPairRounds; ++i) acc[g][i] = make_float2(0.0f, 0.0f);
        }
        for (int c0 = 32 * warp; c0 < len; c0 += 32 * kRowsWarps) {
            const int n = min(32, len - c0), col = c0 + (lane < n ? lane : 0);
            bool take[kGroup];
#pragma unroll
            for (int g = 0; g < kGroup; ++g) take[g] = lane < n;
            float p[kGroup];
            chunk_softmax_rows(s_query, k + col * a.row_stride, take, a.scale_log2, m, l, acc, p);
            chunk_pv_rows(acc, v, a.row_stride, p, col, n, lane);
        }
#pragma unroll
        for (int g = 0; g < kGroup; ++g) {
#pragma unroll
            for (int i = 0; i < kPairRounds; ++i) {
                const int pair = lane + 32 * i;
                if (pair < kPairs) {
                    s_acc[warp][g][2 * pair] = acc[g][i].x;
                    s_acc[warp][g][2 * pair + 1] = acc[g][i].y;
                }
            }
            if (lane == 0) {
                s_m[warp][g] = m[g];
                s_l[warp][g] = l[g];
            }
        }
        __syncthreads();
        // row g: O = sum_w 2^(m_w - M) acc_w / sum_w 2^(m_w - M) l_w
        for (int idx = threadIdx.x; idx < rows * kPairs; idx += blockDim.x) {
            const int g = idx / kPairs, pair = idx % kPairs;
            float mx = STOF_NEG_INF;
#pragma unroll
            for (int w = 0; w < kRowsWarps; ++w) mx = fmaxf(mx, s_m[w][g]);
            float x = 0.0f, y = 0.0f, sum = 0.0f;
#pragma unroll
            for (int w = 0; w < kRowsWarps; ++w) {
                const float wgt = s_m[w][g] == STOF_NEG_INF ? 0.0f : exp2f(s_m[w][g] - mx);
                sum = fmaf(wgt, s_l[w][g], sum);
                x = fmaf(wgt, s_acc[w][g][2 * pair], x);
                y = fmaf(wgt, s_acc[w][g][2 * pair + 1], y);
            }
            const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
            const int row = __ldg(index + 1 + t0 + g);
            *reinterpret_cast<unsigned *>(o + row * a.o_row_stride + h * HEAD_DIM + 2 * pair) =
                pack2<elem_t>(x * inv, y * inv);
        }
        __syncthreads();  // the next group's queries and partials overwrite these
    }
}
