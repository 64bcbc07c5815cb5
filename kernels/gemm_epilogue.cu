// GEMM with a fused epilogue: y = residual + act(x w^T + bias) on tensor cores.
//
// One thread block computes a BLOCK_M x BLOCK_N tile of y; grid
// (ceil(M / BLOCK_M), N / BLOCK_N rounded up). Its WARPS warps form a
// kWarpsM x kWarpsN grid, each owning a (BLOCK_M / kWarpsM) x
// (BLOCK_N / kWarpsN) sub-tile of fp32 accumulators in registers:
//
//   for each BLOCK_K slice of K:
//       prefetch the x and w tiles STAGES - 1 slices ahead (cp.async)
//       for each 16-wide k step: ldmatrix the A and B fragments, mma.sync
//   epilogue on the fragments: + bias, activation, + residual, round, store
//
// The pipeline is attention_block.cu's: slice i lives in stage i % STAGES
// and travels in cp.async group i; the prologue commits groups
// 0 .. STAGES-2 and every iteration commits exactly one (empty past the
// end), so cp.async.wait_group STAGES-2 at iteration i leaves only groups
// i+1 .. in flight. The stage refilled in iteration i is the one slice i - 1
// was read from, and the refill is issued after the barrier every warp
// passes only once it has finished slice i - 1: one barrier per slice.
//
// Shared memory: STAGES x (BLOCK_M + BLOCK_N) x BLOCK_K elements, exactly
// the model of fusion/templates.c (no padding). Instead of padding rows,
// the 16-byte chunks of a row are XOR-swizzled (gemm_common.cuh's
// swizzle()): the eight row addresses of every ldmatrix, and of the
// transposed one for the [K, N] weight layout, land in eight different
// 16-byte bank groups. The tile loads, fragment loads and the mma loop are
// gemm_common.cuh's, shared with gemm_ln.cu and gemm_chain.cu.
//
// Rows of x past M are zero-filled by cp.async (src-size 0) and never
// stored; columns past N and k past K likewise (N and K are multiples of 8,
// so a 16-byte chunk is wholly in or out).
#include "gemm_common.cuh"

#ifndef STOF_DTYPE
#define STOF_DTYPE 1
#endif
#ifndef BLOCK_M
#define BLOCK_M 128
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef BLOCK_K
#define BLOCK_K 32
#endif
#ifndef WARPS
#define WARPS 8
#endif
#ifndef STAGES
#define STAGES 3
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

using elem_t = typename stof::dtype_of<STOF_DTYPE>::type;
using namespace stof::attn;
using namespace stof::gemm;

constexpr int kThreads = WARPS * 32;

// The warp grid (gemm_common.cuh): of the splits of WARPS into kWarpsM x
// kWarpsN (kWarpsM 1, 2 or 4), the one whose warp tile is closest to
// square, among those whose tiles are whole 16 x 16 mma pairs.
using grid_t = warp_grid<BLOCK_M, BLOCK_N, WARPS>;
constexpr int kWarpsN = grid_t::kWarpsN;
constexpr int kWarpM = grid_t::kWarpM;  // warp tile rows
constexpr int kWarpN = grid_t::kWarpN;  // warp tile columns
constexpr int kMT = grid_t::kMT;        // 16-row mma tiles per warp
constexpr int kNT = grid_t::kNT;        // 8-column mma tiles per warp (even)
constexpr int kKSteps = BLOCK_K / 16;

static_assert(BLOCK_K % 16 == 0, "BLOCK_K must be a multiple of 16");
static_assert(STAGES >= 2, "STAGES must be at least 2");

// Tiles in shared memory, per stage: x as [BLOCK_M][BLOCK_K]; w as
// [BLOCK_N][BLOCK_K] (W [N, K]) or [BLOCK_K][BLOCK_N] (W [K, N]).
constexpr int kATile = BLOCK_M * BLOCK_K;
constexpr int kBTile = BLOCK_N * BLOCK_K;
constexpr int kBCols = WEIGHT_KN ? BLOCK_N : BLOCK_K;  // columns of a w tile row
static_assert((kATile / 8) % kThreads == 0 && (kBTile / 8) % kThreads == 0,
              "every thread copies the same number of 16-byte chunks");

// Copies slice kt of x and w into one stage (cp.async, no commit).
__device__ __forceinline__ void load_slice(const stof_gemm_args &a, elem_t *sa, elem_t *sb,
                                           int m0, int n0, int kt) {
    const int k0 = kt * BLOCK_K;
    load_tile<BLOCK_M, BLOCK_K, kThreads>(sa, static_cast<const elem_t *>(a.x), a.x_row_stride,
                                          m0, a.m, k0, a.k);
#if WEIGHT_KN
    load_tile<BLOCK_K, BLOCK_N, kThreads>(sb, static_cast<const elem_t *>(a.w), a.w_row_stride,
                                          k0, a.k, n0, a.n);
#else
    load_tile<BLOCK_N, BLOCK_K, kThreads>(sb, static_cast<const elem_t *>(a.w), a.w_row_stride,
                                          n0, a.n, k0, a.k);
#endif
}

// One stage's BLOCK_K slice into the accumulators.
__device__ __forceinline__ void mma_slice(float (&acc)[kMT][kNT][4], const elem_t *sa,
                                          const elem_t *sb, int wm0, int wn0, int lane) {
    mma_tile<kMT, kNT, kKSteps, BLOCK_K / 8, kBCols / 8, WEIGHT_KN != 0>(acc, sa, sb, wm0, wn0,
                                                                          lane);
}

// + bias, activation, + residual on the fragments, rounded and stored as
// pairs (c0 c1 at row g, c2 c3 at row g + 8; columns 2t, 2t + 1).
__device__ __forceinline__ void epilogue(const stof_gemm_args &a, const float (&acc)[kMT][kNT][4],
                                         int row0, int col0, int lane) {
    elem_t *y = static_cast<elem_t *>(a.y);
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
        const int col = col0 + nt * 8 + 2 * t;
        if (col >= a.n)
            continue;
        float2 b = make_float2(0.0f, 0.0f);
#if HAS_BIAS
        b = unpack2<elem_t>(*reinterpret_cast<const unsigned *>(
            static_cast<const elem_t *>(a.bias) + col));
#endif
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + mt * 16 + g + 8 * h;
                if (row >= a.m)
                    continue;
                float v0 = stof_activate<ACT>(acc[mt][nt][2 * h] + b.x);
                float v1 = stof_activate<ACT>(acc[mt][nt][2 * h + 1] + b.y);
#if HAS_RESIDUAL
                const float2 r = unpack2<elem_t>(*reinterpret_cast<const unsigned *>(
                    static_cast<const elem_t *>(a.residual) + (long long)row * a.r_row_stride +
                    col));
                v0 += r.x;
                v1 += r.y;
#endif
                *reinterpret_cast<unsigned *>(y + (long long)row * a.y_row_stride + col) =
                    pack2<elem_t>(v0, v1);
            }
    }
}

extern "C" __global__ void __launch_bounds__(kThreads)
    stof_gemm_epilogue(const stof_gemm_args a) {
    stof::grid_dependency_begin();  // before any read (common.cuh)
    static_assert(sizeof(stof_gemm_args) == STOF_GEMM_ARGS_BYTES, "ABI mismatch");
    extern __shared__ uint4 smem_raw[];
    elem_t *smem = reinterpret_cast<elem_t *>(smem_raw);
    elem_t *sa = smem;                     // [STAGES][kATile]
    elem_t *sb = smem + STAGES * kATile;   // [STAGES][kBTile]

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int m0 = blockIdx.x * BLOCK_M, n0 = blockIdx.y * BLOCK_N;
    const int wm0 = (warp / kWarpsN) * kWarpM, wn0 = (warp % kWarpsN) * kWarpN;

    float acc[kMT][kNT][4];
    zero_acc(acc);

    const int slices = (a.k + BLOCK_K - 1) / BLOCK_K;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < slices)
            load_slice(a, sa + s * kATile, sb + s * kBTile, m0, n0, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < slices; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = kt + STAGES - 1;
        if (next < slices) {
            const int st = next % STAGES;
            load_slice(a, sa + st * kATile, sb + st * kBTile, m0, n0, next);
        }
        cp_async_commit();
        const int st = kt % STAGES;
        mma_slice(acc, sa + st * kATile, sb + st * kBTile, wm0, wn0, lane);
    }
    cp_async_wait<0>();

    epilogue(a, acc, m0 + wm0, n0 + wn0, lane);
}
