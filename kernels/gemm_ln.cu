// GEMM whose epilogue closes with a row norm, on tensor cores:
//
//   s = x w^T (+ bias) (+ residual),  pre_norm = s (STORE_PRE_NORM),
//   y = LayerNorm(s) | RMSNorm(s)     (NORM 1 | 2)
//
// A norm needs whole rows, so a thread block owns ROWS whole output rows
// (grid ceil(M / ROWS)) and walks their ROW_N columns in BLOCK_N-wide
// column tiles. Each tile is an ordinary GEMM tile (gemm_common.cuh: the
// cp.async ring, swizzled tiles, ldmatrix, mma.sync); its accumulators go
// to an fp32 row buffer in shared memory instead of memory. Once every
// tile is in, one warp a row adds bias and residual, takes the statistics
// in two passes (the mean, then the squared deviations from it: no
// cancellation) and writes the normalized row:
//
//   for each (column tile j, BLOCK_K slice kt), one flat sequence:
//       prefetch STAGES - 1 steps ahead (across tile boundaries: the ring
//       never drains between tiles)
//       mma the slice; after a tile's last slice: accumulators -> row buffer
//   per row (a warp): s = row + bias + residual (-> pre_norm), mean,
//       variance, y = (s - mean) * rstd * gamma (+ beta)
//
// The pipeline keeps gemm_epilogue.cu's invariant: step i lives in stage
// i % STAGES and travels in cp.async group i; every iteration commits
// exactly one group (empty past the end), so wait_group STAGES-2 at step i
// leaves only later groups in flight, and the stage refilled at step i is
// the one step i - 1 read, refilled after the barrier that every warp
// passes only once it has finished step i - 1.
//
// Shared memory: ROWS x ROW_N fp32 (the row buffer) + STAGES x (ROWS +
// BLOCK_N) x BLOCK_K elements, exactly the model of fusion/templates.c.
// The row buffer is swizzled too when ROW_N is a multiple of 64: column c
// of row r sits at c ^ ((r % 8) * 8), so the accumulator pairs a warp
// stores (8 rows x 4 pairs) hit every bank twice, and a warp reading 4
// floats a lane along one row stays conflict-free.
//
// Rows past M are zero-filled, never stored; columns past ROW_N (a partial
// last column tile) likewise. K is a multiple of 8 (16-byte chunks).
#include "gemm_common.cuh"

#ifndef STOF_DTYPE
#define STOF_DTYPE 1
#endif
#ifndef ROWS
#define ROWS 32
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef BLOCK_K
#define BLOCK_K 64
#endif
#ifndef WARPS
#define WARPS 8
#endif
#ifndef STAGES
#define STAGES 3
#endif
#ifndef ROW_N
#define ROW_N 768
#endif
#ifndef WEIGHT_KN
#define WEIGHT_KN 0
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif
#ifndef HAS_RESIDUAL
#define HAS_RESIDUAL 0
#endif
#ifndef NORM
#define NORM 1
#endif
#ifndef STORE_PRE_NORM
#define STORE_PRE_NORM 0
#endif

using elem_t = typename stof::dtype_of<STOF_DTYPE>::type;
using namespace stof::attn;
using namespace stof::gemm;

constexpr int kThreads = WARPS * 32;
using grid_t = warp_grid<ROWS, BLOCK_N, WARPS>;
constexpr int kMT = grid_t::kMT, kNT = grid_t::kNT;
constexpr int kTiles = (ROW_N + BLOCK_N - 1) / BLOCK_N;  // column tiles of a row
constexpr int kATile = ROWS * BLOCK_K;
constexpr int kBTile = BLOCK_N * BLOCK_K;
constexpr int kBCols = WEIGHT_KN ? BLOCK_N : BLOCK_K;  // columns of a w tile row

static_assert(BLOCK_K % 16 == 0, "BLOCK_K must be a multiple of 16");
static_assert(STAGES >= 2, "STAGES must be at least 2");
static_assert(ROW_N % 8 == 0, "ROW_N must be a multiple of 8");
static_assert(NORM == STOF_NORM_LAYERNORM || NORM == STOF_NORM_RMSNORM,
              "NORM is 1 (LayerNorm) or 2 (RMSNorm)");

// ---- the row buffer -------------------------------------------------------------

constexpr bool kSwizzleRows = ROW_N % 64 == 0;

// Index of (row r, column c) in the fp32 row buffer; c ^ mask keeps bits
// 0..2, so pairs and aligned quads stay together.
__device__ __forceinline__ int row_at(int r, int c) {
    return r * ROW_N + (kSwizzleRows ? (c ^ ((r & 7) << 3)) : c);
}

// A column tile's accumulators into the row buffer (c0 c1 at row g, c2 c3
// at row g + 8; columns 2t, 2t + 1).
__device__ __forceinline__ void stash_tile(float *rowbuf, const float (&acc)[kMT][kNT][4],
                                           int wm0, int col0, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
        const int col = col0 + nt * 8 + 2 * t;
        if (ROW_N % BLOCK_N != 0 && col >= ROW_N)
            continue;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = wm0 + mt * 16 + g + 8 * h;
                *reinterpret_cast<float2 *>(rowbuf + row_at(row, col)) =
                    make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
            }
    }
}

// ---- the GEMM ---------------------------------------------------------------------

// Step i of the flat sequence: slice kt of column tile j (cp.async, no commit).
__device__ __forceinline__ void load_step(const stof_gemm_ln_args &a, elem_t *sa, elem_t *sb,
                                          int m0, int step, int slices) {
    const int j = step / slices, k0 = (step - j * slices) * BLOCK_K, n0 = j * BLOCK_N;
    load_tile<ROWS, BLOCK_K, kThreads>(sa, static_cast<const elem_t *>(a.x), a.x_row_stride, m0,
                                       a.m, k0, a.k);
#if WEIGHT_KN
    load_tile<BLOCK_K, BLOCK_N, kThreads>(sb, static_cast<const elem_t *>(a.w), a.w_row_stride,
                                          k0, a.k, n0, ROW_N);
#else
    load_tile<BLOCK_N, BLOCK_K, kThreads>(sb, static_cast<const elem_t *>(a.w), a.w_row_stride,
                                          n0, ROW_N, k0, a.k);
#endif
}

// ---- the norm ---------------------------------------------------------------------

// Four consecutive elements (8 bytes) as floats, and back.
__device__ __forceinline__ float4 load4(const elem_t *p) {
    const uint2 r = *reinterpret_cast<const uint2 *>(p);
    const float2 lo = unpack2<elem_t>(r.x), hi = unpack2<elem_t>(r.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}

__device__ __forceinline__ void store4(elem_t *p, float4 v) {
    *reinterpret_cast<uint2 *>(p) = make_uint2(pack2<elem_t>(v.x, v.y), pack2<elem_t>(v.z, v.w));
}

constexpr int kQuads = ROW_N / 4;                // 4-column pieces of a row
constexpr int kPerLane = (kQuads + 31) / 32;     // pieces a lane handles

// Row r of the block (global row m), one warp: s = acc + bias + residual
// back into the row buffer (and pre_norm), the statistics, y.
__device__ __forceinline__ void norm_row(const stof_gemm_ln_args &a, float *rowbuf, int r,
                                         long long m, int lane) {
    float sum = 0.0f, sq = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
        const int q = lane + 32 * i;
        if (kQuads % 32 != 0 && q >= kQuads)
            break;
        const int col = 4 * q;
        float4 *p = reinterpret_cast<float4 *>(rowbuf + row_at(r, col));
        float4 v = *p;
#if HAS_BIAS
        const float4 b = load4(static_cast<const elem_t *>(a.bias) + col);
        v.x += b.x, v.y += b.y, v.z += b.z, v.w += b.w;
#endif
#if HAS_RESIDUAL
        const float4 res =
            load4(static_cast<const elem_t *>(a.residual) + m * a.r_row_stride + col);
        v.x += res.x, v.y += res.y, v.z += res.z, v.w += res.w;
#endif
#if HAS_BIAS || HAS_RESIDUAL
        *p = v;
#endif
#if STORE_PRE_NORM
        store4(static_cast<elem_t *>(a.pre_norm) + m * a.p_row_stride + col, v);
#endif
        sum += (v.x + v.y) + (v.z + v.w);
        sq += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
    }
#if NORM == STOF_NORM_LAYERNORM
    const float mean = stof::warp_sum(sum) * (1.0f / ROW_N);
    sq = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
        const int q = lane + 32 * i;
        if (kQuads % 32 != 0 && q >= kQuads)
            break;
        const float4 v = *reinterpret_cast<const float4 *>(rowbuf + row_at(r, 4 * q));
        const float dx = v.x - mean, dy = v.y - mean, dz = v.z - mean, dw = v.w - mean;
        sq += (dx * dx + dy * dy) + (dz * dz + dw * dw);
    }
#else
    const float mean = 0.0f;  // RMSNorm: the root mean square about 0
#endif
    const float rstd = rsqrtf(stof::warp_sum(sq) * (1.0f / ROW_N) + a.eps);
    elem_t *y = static_cast<elem_t *>(a.y) + m * a.y_row_stride;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
        const int q = lane + 32 * i;
        if (kQuads % 32 != 0 && q >= kQuads)
            break;
        const int col = 4 * q;
        float4 v = *reinterpret_cast<const float4 *>(rowbuf + row_at(r, col));
        const float4 gm = load4(static_cast<const elem_t *>(a.gamma) + col);
        v.x = (v.x - mean) * rstd * gm.x;
        v.y = (v.y - mean) * rstd * gm.y;
        v.z = (v.z - mean) * rstd * gm.z;
        v.w = (v.w - mean) * rstd * gm.w;
#if NORM == STOF_NORM_LAYERNORM
        const float4 bt = load4(static_cast<const elem_t *>(a.beta) + col);
        v.x += bt.x, v.y += bt.y, v.z += bt.z, v.w += bt.w;
#endif
        store4(y + col, v);
    }
}

// ---- the kernel ---------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(kThreads) stof_gemm_ln(const stof_gemm_ln_args a) {
    stof::grid_dependency_launch();  // common.cuh
    // Every block reads all of w: the first asks L2 for it before waiting
    // for the previous kernel (prefetch_l2).
    if (blockIdx.x == 0)
        stof::prefetch_l2(a.w, a.w_row_stride * (long long)sizeof(elem_t), WEIGHT_KN ? a.k : a.n,
                          (WEIGHT_KN ? a.n : a.k) * (int)sizeof(elem_t));
    stof::grid_dependency_wait();  // before any read
    static_assert(sizeof(stof_gemm_ln_args) == STOF_GEMM_LN_ARGS_BYTES, "ABI mismatch");
    extern __shared__ uint4 smem_raw[];
    float *rowbuf = reinterpret_cast<float *>(smem_raw);               // [ROWS][ROW_N]
    elem_t *sa = reinterpret_cast<elem_t *>(rowbuf + ROWS * ROW_N);    // [STAGES][kATile]
    elem_t *sb = sa + STAGES * kATile;                                 // [STAGES][kBTile]

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int m0 = blockIdx.x * ROWS;
    const int wm0 = (warp / grid_t::kWarpsN) * grid_t::kWarpM;
    const int wn0 = (warp % grid_t::kWarpsN) * grid_t::kWarpN;

    float acc[kMT][kNT][4];
    zero_acc(acc);

    const int slices = (a.k + BLOCK_K - 1) / BLOCK_K;
    const int steps = kTiles * slices;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < steps)
            load_step(a, sa + s * kATile, sb + s * kBTile, m0, s, slices);
        cp_async_commit();
    }
    for (int i = 0, j = 0, kt = 0; i < steps; ++i) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = i + STAGES - 1;
        if (next < steps) {
            const int st = next % STAGES;
            load_step(a, sa + st * kATile, sb + st * kBTile, m0, next, slices);
        }
        cp_async_commit();
        const int st = i % STAGES;
        mma_tile<kMT, kNT, BLOCK_K / 16, BLOCK_K / 8, kBCols / 8, WEIGHT_KN != 0>(
            acc, sa + st * kATile, sb + st * kBTile, wm0, wn0, lane);
        if (++kt == slices) {
            stash_tile(rowbuf, acc, wm0, j * BLOCK_N + wn0, lane);
            zero_acc(acc);
            kt = 0;
            ++j;
        }
    }
    cp_async_wait<0>();
    __syncthreads();

    for (int r = warp; r < ROWS; r += WARPS) {
        const long long m = (long long)m0 + r;
        if (m >= a.m)
            break;
        norm_row(a, rowbuf, r, m, lane);
    }
}
