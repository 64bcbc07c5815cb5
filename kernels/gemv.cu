// A GEMM of a few rows (a decode step's one token a sequence) as a matrix-vector product:
// y[m, n] = epilogue(sum_k x[m, k] w[n, k]) for the ROWS rows of x a block takes at a time,
// every weight element read once from memory by one thread and used for all those
// rows. At one to sixteen rows the weights are nearly all the bytes moved, and tensor-core
// tiles made for hundreds of rows (gemm_epilogue.cu, cuBLASLt) leave most of a tile empty and
// too few blocks to keep the memory busy; here every thread has UNROLL weight loads of 16
// bytes in flight, and the block asks L2 for its (first) slice of the weights before it waits
// for the previous kernel (the weights do not depend on it). With [N, K] weights it also loads
// its first tile's first round into registers before the wait, and each tile loads the next
// one's first round before its sums meet: a warp's loads stay in flight across its tiles
// (the 1B's batch-1 decode step: 0.836 -> 0.780 ms on an H200).
//
// [N, K] weights (K contiguous): each warp owns OUTS = BLOCK_N / WARPS outputs; its lanes walk
//   K eight elements (16 bytes) at a time, then each output's partial sums meet by shuffles.
//   With a GLU (GLU = its activation) the OUTS are features of OUTS / 2 outputs: j and N/2 + j.
//   The grid is persistent (as many blocks as the GPU holds, at most one a tile; the host sizes
//   it): a block loops over tiles of BLOCK_N outputs (row group major), and x's rows of its row
//   group are staged once in dynamic shared memory (ROWS x K elements), normalized there where a
//   norm comes first. So a block's norm statistics and normalization are paid once, not once a
//   tile, and the loop reads x from shared memory without conversions of gains a weight.
//   With STAGES > 0 the weights come through shared memory instead: one more warp (the
//   producer) copies each tile's BLOCK_N rows, a chunk of UNROLL * 256 elements a row at a time,
//   into a ring of STAGES buffers by bulk copies (cp.async.bulk, counted on a barrier a buffer),
//   starting before the wait, and the computing warps take their rows of each chunk from there.
//   The copy engine keeps the chunks in flight without the computing warps' registers, and
//   without their stalls between a tile's rounds of loads: for a long K (a down projection's
//   8192) this reads the weights faster than the loads into registers (bench/RESULTS.md).
// [K, N] weights (WEIGHT_KN, N contiguous: a script's kn = true): the block owns BLOCK_N columns,
//   eight a lane; its threads are kColLanes = BLOCK_N / 8 column lanes times kKLanes lanes
//   over K; partial sums meet by shuffles within a warp, then across warps in shared memory.
//
// The epilogue is gemm_epilogue's: + bias[n] (HAS_BIAS), the activation (ACT), + residual[m, n]
// (HAS_RESIDUAL), rounded once. Sums are fp32. With PROLOGUE_NORM the block first finds its
// rows' statistics (a warp a row; two passes over x, as mi_chain.cu: the mean, then the squared
// deviations; RMSNorm the mean square), and every x value is normalized (gamma and beta applied,
// the result rounded to the dtype, as the norm op would have stored it): [N, K] once x is
// staged (the statistics from the staged copy, then normalized in place), [K, N] as it is read.
// [K, N] reads x through L1 (each block reads it whole); the weights bypass L1. With [N, K]
// weights N may be any width (a vocabulary), and y, the bias and the residual are accessed an
// element at a time; with [K, N] weights N is a multiple of 8. K is a multiple of 8; rows
// m >= M are neither read nor written.
#include "common.cuh"
#include "gemm_abi.cuh"
#include "tma.cuh"
#include "vec_chunk.cuh"

#ifndef STOF_DTYPE
#define STOF_DTYPE 1
#endif
#ifndef ROWS
#define ROWS 1
#endif
#ifndef BLOCK_N
#define BLOCK_N 8
#endif
#ifndef WARPS
#define WARPS 8
#endif
#ifndef UNROLL
#define UNROLL 4
#endif
#ifndef WEIGHT_KN
#define WEIGHT_KN 0
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif
#ifndef ACT
#define ACT 0
#endif
#ifndef HAS_RESIDUAL
#define HAS_RESIDUAL 0
#endif
#ifndef PROLOGUE_NORM // STOF_NORM_*: x's rows normalized first (a pre-norm model's norm)
#define PROLOGUE_NORM 0
#endif
#ifndef STAGES // [N, K]: weights through shared memory, STAGES buffers of BLOCK_N rows' chunks
#define STAGES 0  //   of UNROLL * 256 elements filled by bulk copies; 0: loaded into registers
#endif
#ifndef GLU // STOF_ACT_*: a gated unit after the GEMM, y[m, j] = act(s[m, j]) * s[m, N/2 + j]
#define GLU 0
#endif

using elem_t = typename stof::dtype_of<STOF_DTYPE>::type;

constexpr int kThreads = WARPS * 32; // the warps that compute
// With STAGES, one more warp issues the copies (the producer), ahead of the others by up to
// STAGES chunks.
constexpr int kBlockThreads = kThreads + (STAGES ? 32 : 0);
static_assert(ROWS >= 1 && ROWS <= STOF_GEMV_MAX_ROWS, "ROWS: 1 .. STOF_GEMV_MAX_ROWS");
static_assert(UNROLL >= 1 && UNROLL <= 16, "UNROLL: 1 .. 16");
static_assert(PROLOGUE_NORM == 0 || PROLOGUE_NORM == STOF_NORM_LAYERNORM ||
                  PROLOGUE_NORM == STOF_NORM_RMSNORM, "PROLOGUE_NORM: none, LayerNorm or RMSNorm");
#if WEIGHT_KN
constexpr int kColLanes = BLOCK_N / 8;
constexpr int kKLanes = kThreads / kColLanes;
static_assert(BLOCK_N % 8 == 0 && kColLanes <= 32 && 32 % kColLanes == 0,
              "[K, N]: BLOCK_N / 8 column lanes dividing a warp");
#else
constexpr int kOuts = BLOCK_N / WARPS;
static_assert(BLOCK_N % WARPS == 0 && kOuts >= 1 && kOuts <= 8, "[N, K]: 1 .. 8 outputs a warp");
static_assert(GLU == 0 || kOuts % 2 == 0, "GLU: an even count of features a warp");
#endif
static_assert(GLU == 0 || !WEIGHT_KN, "GLU: [N, K] weights");
static_assert(STAGES == 0 || (!WEIGHT_KN && STAGES >= 2 && STAGES <= 16 && BLOCK_N <= 32),
              "STAGES: 2 .. 16, [N, K] weights, a lane of the producer a row");
static_assert(GLU == 0 || (!HAS_RESIDUAL && ACT == 0), "GLU: no activation or residual first");

namespace {

// A barrier of the warps that compute (the producer warp does not take part).
__device__ __forceinline__ void consumers_sync() {
#if STAGES
    asm volatile("bar.sync 1, %0;" ::"n"(kThreads) : "memory");
#else
    __syncthreads();
#endif
}

// 16 bytes of weights, not kept in L1 (x is what L1 holds).
__device__ __forceinline__ uint4 load_weights(const elem_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ void unpack8(const uint4 &v, float (&f)[8]) {
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 t = stof::attn::unpack2<elem_t>(u[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

__device__ __forceinline__ const elem_t *row_of(const void *base, long long stride, int row) {
    return static_cast<const elem_t *>(base) + (long long)row * stride;
}

// The statistics of the block's rows for the prologue norm, row r at x + r * stride (x's rows
// in global memory, or staged in shared memory): s_mean[r] (LayerNorm; 0 for RMSNorm) and
// s_rstd[r]. Warp w takes rows w, w + WARPS, ...: its lanes read the row 16 bytes at a time (K
// is a multiple of 8) and sum by shuffles, so the warps work at once and the block meets at one
// barrier.
__device__ __forceinline__ void row_stats(const stof_gemv_args &a, const elem_t *rows_x,
                                          long long stride, int rows, float *s_mean,
                                          float *s_rstd) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float inv_k = 1.0f / (float)a.k;
    for (int r = warp; r < rows; r += WARPS) {
        const elem_t *x = rows_x + r * stride;
        float mean = 0.0f, sq = 0.0f;
#if PROLOGUE_NORM == STOF_NORM_LAYERNORM
        for (int k = lane * 8; k < a.k; k += 256) {
            float v[8];
            stof::load_chunk<8>(v, x + k);
#pragma unroll
            for (int e = 0; e < 8; ++e)
                mean += v[e];
        }
        mean = stof::warp_sum(mean) * inv_k;
#endif
        for (int k = lane * 8; k < a.k; k += 256) {
            float v[8];
            stof::load_chunk<8>(v, x + k);
#pragma unroll
            for (int e = 0; e < 8; ++e)
                sq += (v[e] - mean) * (v[e] - mean);
        }
        sq = stof::warp_sum(sq);
        if (lane == 0) {
            s_mean[r] = mean;
            s_rstd[r] = rsqrtf(sq * inv_k + a.eps);
        }
    }
    consumers_sync();
}

// An x value normalized with its row's (mean, rstd) and its column's gain g and bias b (b: 0
// for RMSNorm), rounded as the norm op's output.
__device__ __forceinline__ float norm_value(float v, float g, float b, float mean, float rstd) {
#if PROLOGUE_NORM == STOF_NORM_LAYERNORM
    v = (v - mean) * rstd * g + b;
#else
    (void)mean;
    (void)b;
    v = v * rstd * g;
#endif
    return stof::to_float(stof::from_float<elem_t>(v));
}

// The gain and bias of columns k .. k + V - 1 (bias 0 for RMSNorm).
template <int V>
__device__ __forceinline__ void norm_params(const stof_gemv_args &a, int k, float (&g)[V],
                                            float (&b)[V]) {
    stof::load_chunk<V>(g, static_cast<const elem_t *>(a.gamma) + k);
#if PROLOGUE_NORM == STOF_NORM_LAYERNORM
    stof::load_chunk<V>(b, static_cast<const elem_t *>(a.beta) + k);
#else
#pragma unroll
    for (int e = 0; e < V; ++e)
        b[e] = 0.0f;
#endif
}

#if !WEIGHT_KN
// x's rows m0 .. m0 + rows - 1 into xs (row r at xs + r * K), normalized and rounded as the norm
// op would store them where a norm comes first. x is read from global memory once: copied as
// it is, its statistics found from the copy, then normalized in place (a read of x after the
// wait queues behind the weights' loads, so each pass over global memory costs a round trip
// under full load). The caller holds the barriers around it.
__device__ __forceinline__ void stage_x(const stof_gemv_args &a, int m0, int rows, elem_t *xs,
                                        float *s_mean, float *s_rstd) {
    const int chunks = a.k / 8;
    for (int i = threadIdx.x; i < rows * chunks; i += kThreads) {
        const int r = i / chunks, k = (i - r * chunks) * 8;
        const uint4 *from =
            reinterpret_cast<const uint4 *>(row_of(a.x, a.x_row_stride, m0 + r) + k);
        uint4 *to = reinterpret_cast<uint4 *>(xs + (long long)r * a.k + k);
#pragma unroll
        for (int v = 0; v < (int)(8 * sizeof(elem_t) / 16); ++v) // eight elements: 16 or 32 bytes
            to[v] = from[v];
    }
#if PROLOGUE_NORM
    consumers_sync();
    row_stats(a, xs, a.k, rows, s_mean, s_rstd); // ends with a barrier
    for (int i = threadIdx.x; i < rows * chunks; i += kThreads) {
        const int r = i / chunks, k = (i - r * chunks) * 8;
        float v[8], gm[8], bt[8];
        stof::load_chunk<8>(v, xs + (long long)r * a.k + k);
        norm_params<8>(a, k, gm, bt);
#pragma unroll
        for (int e = 0; e < 8; ++e)
            v[e] = norm_value(v[e], gm[e], bt[e], s_mean[r], s_rstd[r]);
        stof::store_chunk<8>(xs + (long long)r * a.k + k, v);
    }
#else
    (void)s_mean;
    (void)s_rstd;
#endif
}
#endif

// A gated unit's output j from its two features' sums (g: feature j, u: feature N/2 + j): each
// with its bias and rounded as the GEMM's output would be stored, then act(g) * u.
__device__ __forceinline__ void finish_glu(const stof_gemv_args &a, int m, int j, float g,
                                           float u) {
#if HAS_BIAS
    g += stof::to_float(static_cast<const elem_t *>(a.bias)[j]);
    u += stof::to_float(static_cast<const elem_t *>(a.bias)[a.n / 2 + j]);
#endif
    g = stof::to_float(stof::from_float<elem_t>(g));
    u = stof::to_float(stof::from_float<elem_t>(u));
    static_cast<elem_t *>(a.y)[(long long)m * a.y_row_stride + j] =
        stof::from_float<elem_t>(stof_activate<GLU>(g) * u);
}

// The epilogue of one output, stored.
__device__ __forceinline__ void finish(const stof_gemv_args &a, int m, int n, float v) {
#if HAS_BIAS
    v += stof::to_float(static_cast<const elem_t *>(a.bias)[n]);
#endif
    v = stof_activate<ACT>(v);
#if HAS_RESIDUAL
    v += stof::to_float(row_of(a.residual, a.r_row_stride, m)[n]);
#endif
    static_cast<elem_t *>(a.y)[(long long)m * a.y_row_stride + n] = stof::from_float<elem_t>(v);
}

#if !WEIGHT_KN
// [N, K]: the first of warp w's outputs in column tile tn (with a GLU, of its kOuts / 2 outputs,
// each of two features).
__device__ __forceinline__ int first_output(int tn, int w) {
    return GLU ? tn * (BLOCK_N / 2) + w * (kOuts / 2) : tn * BLOCK_N + w * kOuts;
}

// The sums of a warp's outputs for x's rows, zeroed.
__device__ __forceinline__ void zero_sums(float (&acc)[ROWS][kOuts]) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int o = 0; o < kOuts; ++o)
            acc[r][o] = 0.0f;
}

// [N, K]: the weight row that output o of warp w reads in column tile tn (output n0 + o, or with
// a GLU feature j0 + o % kHalf of the first or the second half); rows past the last read it,
// and are not stored.
__device__ __forceinline__ const elem_t *tile_row(const stof_gemv_args &a, int tn, int w, int o) {
    const int n0 = first_output(tn, w);
#if GLU
    constexpr int kHalf = kOuts / 2;
    const int f = a.n / 2;
    return row_of(a.w, a.w_row_stride, min(n0 + o % kHalf, f - 1) + (o < kHalf ? 0 : f));
#else
    return row_of(a.w, a.w_row_stride, min(n0 + o, a.n - 1));
#endif
}

// The kOuts weight rows of column tile tn that this warp reads.
__device__ __forceinline__ void tile_rows(const stof_gemv_args &a, int tn,
                                          const elem_t *(&w)[kOuts]) {
    const int warp = threadIdx.x / 32;
#pragma unroll
    for (int o = 0; o < kOuts; ++o)
        w[o] = tile_row(a, tn, warp, o);
}

// One round of a lane's weight loads: UNROLL chunks of 16 bytes a row, from k0 on, 256 apart.
__device__ __forceinline__ void load_round(const stof_gemv_args &a, const elem_t *(&w)[kOuts],
                                           int k0, uint4 (&wv)[UNROLL][kOuts]) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int o = 0; o < kOuts; ++o)
            if (k0 + u * 256 < a.k)
                wv[u][o] = load_weights(w[o] + k0 + u * 256);
}

// One round's weights (load_round's, from k0 on) times x's rows from xs, into acc.
__device__ __forceinline__ void fma_round(const stof_gemv_args &a, const uint4 (&wv)[UNROLL][kOuts],
                                          int k0, int rows, const elem_t *xs,
                                          float (&acc)[ROWS][kOuts]) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int k = k0 + u * 256;
        if (k >= a.k)
            break;
        float wf[kOuts][8];
#pragma unroll
        for (int o = 0; o < kOuts; ++o)
            unpack8(wv[u][o], wf[o]);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (r >= rows)
                break;
            float xf[8];
            stof::load_chunk<8>(xf, xs + (long long)r * a.k + k);
#pragma unroll
            for (int o = 0; o < kOuts; ++o)
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    acc[r][o] = fmaf(xf[e], wf[o][e], acc[r][o]);
        }
    }
}

// [N, K]: this warp's sums of column tile tn (one a lane, for its outputs and x's rows) met by
// shuffles, and each output finished and stored by one lane.
__device__ __forceinline__ void store_tile(const stof_gemv_args &a, int tn, int m0, int rows,
                                           const float (&acc)[ROWS][kOuts]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#if GLU
    constexpr int kHalf = kOuts / 2;
    const int f = a.n / 2, j0 = first_output(tn, warp);
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int o = 0; o < kHalf; ++o) {
            const float g = stof::warp_sum(acc[r][o]), u = stof::warp_sum(acc[r][kHalf + o]);
            if (r < rows && j0 + o < f && lane == (r * kHalf + o) % 32)
                finish_glu(a, m0 + r, j0 + o, g, u);
        }
#else
    const int n0 = first_output(tn, warp);
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int o = 0; o < kOuts; ++o) {
            const float v = stof::warp_sum(acc[r][o]);
            // output (r, o) stored by lane (r * kOuts + o) % 32: the stores spread over lanes
            if (r < rows && n0 + o < a.n && lane == (r * kOuts + o) % 32)
                finish(a, m0 + r, n0 + o, v);
        }
#endif
}

// [N, K]: column tile tn's outputs for x's rows from xs (stage_x), lanes over K in 16-byte
// chunks. wv holds the tile's first round of weights on entry (load_round at k0 = lane * 8).
// With next >= 0, column tile next's first round is loaded into wv once this tile's last round
// is used, before the sums meet and are stored: one set of registers, and each warp's loads in
// flight across its tiles.
__device__ __forceinline__ void gemv_nk(const stof_gemv_args &a, int tn, int m0, int rows,
                                        const elem_t *xs, uint4 (&wv)[UNROLL][kOuts], int next) {
    const int lane = threadIdx.x % 32;
    const elem_t *w[kOuts];
    tile_rows(a, tn, w);
    float acc[ROWS][kOuts];
    zero_sums(acc);
    int k0 = lane * 8;
    for (;;) {
        fma_round(a, wv, k0, rows, xs, acc);
        k0 += 256 * UNROLL;
        if (k0 >= a.k)
            break;
        load_round(a, w, k0, wv);
    }
    if (next >= 0) {
        tile_rows(a, next, w);
        load_round(a, w, lane * 8, wv);
    }
    store_tile(a, tn, m0, rows, acc);
}

#if STAGES
constexpr int kChunk = UNROLL * 256; // elements of a weight row a stage holds (K's, if shorter)

// The stages in shared memory after x's staged rows: stage s holds chunk c of a column tile's
// BLOCK_N rows, row i at (s * BLOCK_N + i) * pitch elements (pitch: kChunk, or K if shorter).
// full[s] completes when its bytes have landed, empty[s] when every computing warp has taken
// its rows out (barrier addresses in shared memory, 8 bytes apart).
struct stages {
    elem_t *base;
    int pitch;
    unsigned full, empty;
};

__device__ __forceinline__ int chunk_elems(const stof_gemv_args &a, int c) {
    return min(kChunk, a.k - c * kChunk);
}

// The producer warp: the block's tiles in the order the computing warps take them, each chunk
// of K in turn. Lane 0 waits for the stage to be free and announces its bytes; lane i copies
// the tile's row i's chunk. Nothing here depends on the previous kernel, so it runs ahead of
// the wait (as far as the stages go).
__device__ __forceinline__ void produce(const stof_gemv_args &a, int tiles, int tiles_n,
                                        const stages &st) {
    const int lane = threadIdx.x % 32, chunks = (a.k + kChunk - 1) / kChunk;
    unsigned u = 0; // the block's chunks so far
    for (int t = blockIdx.x; t < tiles; t += gridDim.x)
        for (int c = 0; c < chunks; ++c, ++u) {
            const int s = u % STAGES;
            const unsigned bytes = chunk_elems(a, c) * (unsigned)sizeof(elem_t);
            if (lane == 0) {
                stof::tma::wait(st.empty + 8 * s, ((u / STAGES) & 1) ^ 1);
                stof::tma::arrive_expect(st.full + 8 * s, bytes * BLOCK_N);
            }
            __syncwarp();
            if (lane < BLOCK_N)
                stof::tma::copy_1d(
                    stof::tma::smem_u32(st.base + (long long)(s * BLOCK_N + lane) * st.pitch),
                    tile_row(a, t % tiles_n, lane / kOuts, lane % kOuts) + c * kChunk, bytes,
                    st.full + 8 * s);
        }
}

// [N, K] from the stages: column tile tn's outputs for x's rows from xs, chunk by chunk as the
// producer fills them (u: the block's chunks so far, advanced). A warp takes its rows of a
// chunk into registers, hands the stage back, then does its FMAs.
__device__ __forceinline__ void gemv_nk_staged(const stof_gemv_args &a, int tn, int m0, int rows,
                                               const elem_t *xs, const stages &st, unsigned &u) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float acc[ROWS][kOuts];
    zero_sums(acc);
    for (int c = 0; c * kChunk < a.k; ++c, ++u) {
        const int s = u % STAGES, k0 = c * kChunk + lane * 8;
        stof::tma::wait(st.full + 8 * s, (u / STAGES) & 1);
        const elem_t *ws = st.base + (long long)(s * BLOCK_N + warp * kOuts) * st.pitch + lane * 8;
        uint4 wv[UNROLL][kOuts];
#pragma unroll
        for (int v = 0; v < UNROLL; ++v)
#pragma unroll
            for (int o = 0; o < kOuts; ++o)
                if (k0 + v * 256 < a.k)
                    wv[v][o] = *reinterpret_cast<const uint4 *>(ws + o * st.pitch + v * 256);
        __syncwarp();
        if (lane == 0)
            stof::tma::arrive(st.empty + 8 * s);
        fma_round(a, wv, k0, rows, xs, acc);
    }
    store_tile(a, tn, m0, rows, acc);
}
#endif
#else
// [K, N]: column lane cl's eight columns, k lane kl's rows kl, kl + kKLanes, ...
__device__ __forceinline__ void gemv_kn(const stof_gemv_args &a, int m0, int rows,
                                        const float *s_mean, const float *s_rstd) {
    __shared__ float partial[WARPS][ROWS][BLOCK_N];
    const int cl = threadIdx.x % kColLanes, kl = threadIdx.x / kColLanes;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int n = blockIdx.x * BLOCK_N + cl * 8;
    const bool live = n < a.n;
    const elem_t *w = static_cast<const elem_t *>(a.w) + (live ? n : 0);
    float acc[ROWS][8];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int e = 0; e < 8; ++e)
            acc[r][e] = 0.0f;
    for (int k0 = kl; k0 < a.k; k0 += kKLanes * UNROLL) {
        uint4 wv[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (k0 + u * kKLanes < a.k && live)
                wv[u] = load_weights(w + (long long)(k0 + u * kKLanes) * a.w_row_stride);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int k = k0 + u * kKLanes;
            if (k >= a.k || !live)
                break;
            float wf[8];
            unpack8(wv[u], wf);
#if PROLOGUE_NORM
            float gm[1], bt[1];
            norm_params<1>(a, k, gm, bt);
#endif
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                if (r >= rows)
                    break;
                float xv = stof::to_float(row_of(a.x, a.x_row_stride, m0 + r)[k]);
#if PROLOGUE_NORM
                xv = norm_value(xv, gm[0], bt[0], s_mean[r], s_rstd[r]);
#endif
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    acc[r][e] = fmaf(xv, wf[e], acc[r][e]);
            }
        }
    }
    // the k lanes of a warp (lanes cl, cl + kColLanes, ...) first, then the warps
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            float v = acc[r][e];
#pragma unroll
            for (int o = 16; o >= kColLanes; o >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane < kColLanes)
                partial[warp][r][cl * 8 + e] = v;
        }
    __syncthreads();
    for (int i = threadIdx.x; i < rows * BLOCK_N; i += kThreads) {
        const int r = i / BLOCK_N, c = i % BLOCK_N;
        const int col = blockIdx.x * BLOCK_N + c;
        if (col >= a.n)
            continue;
        float v = 0.0f;
#pragma unroll
        for (int q = 0; q < WARPS; ++q)
            v += partial[q][r][c];
        finish(a, m0 + r, col, v);
    }
}
#endif

// Column tile t's weights asked of L2 before the wait: rows of [N, K] weights (with a GLU, the
// two halves' rows of its outputs), or the K rows' BLOCK_N columns of [K, N] ones.
__device__ __forceinline__ void prefetch_weights(const stof_gemv_args &a, int t) {
    const long long stride = a.w_row_stride * (long long)sizeof(elem_t);
#if GLU
    const int f = a.n / 2, j0 = t * (BLOCK_N / 2), outs = min(BLOCK_N / 2, f - j0);
    for (int half = 0; half < 2; ++half)
        stof::prefetch_l2(row_of(a.w, a.w_row_stride, j0 + half * f), stride, outs,
                          a.k * (int)sizeof(elem_t));
#elif WEIGHT_KN
    const int n0 = t * BLOCK_N, cols = min(BLOCK_N, a.n - n0);
    stof::prefetch_l2(static_cast<const elem_t *>(a.w) + n0, stride, a.k,
                      cols * (int)sizeof(elem_t));
#else
    const int n0 = t * BLOCK_N, outs = min(BLOCK_N, a.n - n0);
    stof::prefetch_l2(row_of(a.w, a.w_row_stride, n0), stride, outs,
                      a.k * (int)sizeof(elem_t));
#endif
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kBlockThreads) stof_gemv(const stof_gemv_args a) {
    static_assert(sizeof(stof_gemv_args) == STOF_GEMV_ARGS_BYTES, "ABI mismatch");
    __shared__ float s_mean[ROWS], s_rstd[ROWS];
    stof::grid_dependency_launch();
#if WEIGHT_KN
    if (blockIdx.y == 0) // one block of each column slice asks; the others find it in L2
        prefetch_weights(a, blockIdx.x);
    stof::grid_dependency_wait();
    const int m0 = blockIdx.y * ROWS, rows = min(ROWS, a.m - m0);
#if PROLOGUE_NORM
    row_stats(a, row_of(a.x, a.x_row_stride, m0), a.x_row_stride, rows, s_mean, s_rstd);
#endif
    gemv_kn(a, m0, rows, s_mean, s_rstd);
#else
    extern __shared__ __align__(16) unsigned char gemv_smem[];
    elem_t *xs = reinterpret_cast<elem_t *>(gemv_smem);
    const int tiles_n = GLU ? (a.n / 2 + BLOCK_N / 2 - 1) / (BLOCK_N / 2)
                            : (a.n + BLOCK_N - 1) / BLOCK_N;
    const int tiles = tiles_n * ((a.m + ROWS - 1) / ROWS);
#if STAGES
    // The stages follow x's staged rows (a multiple of 16 bytes: K is a multiple of 8).
    __shared__ __align__(8) unsigned long long bars[2 * STAGES];
    const stages st = {xs + (long long)min(ROWS, a.m) * a.k, min(kChunk, a.k),
                       stof::tma::smem_u32(bars), stof::tma::smem_u32(bars + STAGES)};
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            stof::tma::barrier_init(st.full + 8 * s);
            stof::tma::barrier_init(st.empty + 8 * s, WARPS);
        }
        stof::tma::fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x >= kThreads) {
        produce(a, tiles, tiles_n, st);
        return;
    }
    unsigned u = 0; // the block's chunks so far, as the producer counts them
#else
    if ((int)blockIdx.x < tiles && (int)blockIdx.x / tiles_n == 0) // the first row group's
        prefetch_weights(a, blockIdx.x);
    // The first tile's first round of weights in registers before the wait: they do not depend
    // on the previous kernel, so their latency overlaps its tail and x's staging. From then on
    // each tile loads the next one's first round (gemv_nk). (The grid is at most one block a
    // tile; the test is kept because without it ptxas schedules this kernel differently, and
    // the 1B's batch-1 step measured 0.86 ms against 0.78 with it.)
    uint4 wv[UNROLL][kOuts];
    if ((int)blockIdx.x < tiles) {
        const elem_t *w[kOuts];
        tile_rows(a, (int)blockIdx.x % tiles_n, w);
        load_round(a, w, threadIdx.x % 32 * 8, wv);
    }
#endif
    stof::grid_dependency_wait();
    int staged = -1; // the row group whose x is in xs
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int group = t / tiles_n, m0 = group * ROWS, rows = min(ROWS, a.m - m0);
        if (group != staged) {
            consumers_sync(); // every warp is done with the previous group's x
            stage_x(a, m0, rows, xs, s_mean, s_rstd);
            consumers_sync();
            staged = group;
        }
#if STAGES
        gemv_nk_staged(a, t - group * tiles_n, m0, rows, xs, st, u);
#else
        const int next = t + (int)gridDim.x < tiles ? (t + (int)gridDim.x) % tiles_n : -1;
        gemv_nk(a, t - group * tiles_n, m0, rows, xs, wv, next);
#endif
    }
#endif
}
