// GEMM with a fused epilogue: y = residual + act(x w^T + bias) on tensor cores;
// the wgmma build may close it with a row norm over a cluster that holds
// whole rows (NORM, see "a row norm over the cluster" below).
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
// The pieces, one file each: gemm_mma_mainloop.cuh (the mma.sync main
// loop), gemm_frag_epilogue.cuh (bias, activation, residual, store on the
// fragments), and for the wgmma build gemm_wgmma_pipeline.cuh (TMA loads,
// producer warp and consumer warpgroups), gemm_tma_store.cuh (the
// persistent build's stores), gemm_cluster.cuh (clusters, the split of K)
// and gemm_cluster_norm.cuh (the closing row norm). This file holds the
// parameters and the kernels, which call them in the algorithm's order.
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
#ifndef WGMMA
#define WGMMA 0
#endif
#ifndef SPLIT_K
#define SPLIT_K 1
#endif
#ifndef NORM
#define NORM 0
#endif
#ifndef STORE_PRE_NORM
#define STORE_PRE_NORM 0
#endif
#ifndef NORM_TILES
#define NORM_TILES 1
#endif

using elem_t = typename stof::dtype_of<STOF_DTYPE>::type;
using namespace stof::attn;
using namespace stof::gemm;

constexpr int kThreads = WARPS * 32;  // the warps that compute
#if WGMMA
constexpr int kBlockThreads = kThreads + 32;  // + the wgmma build's producer warp
#else
constexpr int kBlockThreads = kThreads;
#endif

#if !WGMMA
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
#endif

static_assert(BLOCK_K % 16 == 0, "BLOCK_K must be a multiple of 16");
static_assert(STAGES >= 2, "STAGES must be at least 2");

// Tiles in shared memory, per stage: x as [BLOCK_M][BLOCK_K]; w as
// [BLOCK_N][BLOCK_K] (W [N, K]) or [BLOCK_K][BLOCK_N] (W [K, N]).
constexpr int kATile = BLOCK_M * BLOCK_K;
constexpr int kBTile = BLOCK_N * BLOCK_K;
static_assert((kATile / 8) % kThreads == 0 && (kBTile / 8) % kThreads == 0,
              "every thread copies the same number of 16-byte chunks");

#include "gemm_mma_mainloop.cuh"
#include "gemm_frag_epilogue.cuh"

#if WGMMA
#include "gemm_wgmma_pipeline.cuh"
#include "gemm_tma_store.cuh"
#include "gemm_cluster.cuh"
#include "gemm_cluster_norm.cuh"

#if SPLIT_K > 1 || NORM
// Cluster barriers the compute warps take after the mainloop (the split's
// reduction, the norm's statistics, the last one keeping the shared memory
// alive), which the producer warp takes too.
constexpr int kClusterSyncs = (SPLIT_K > 1) + (NORM != 0) + 1;
#endif

// The producer warp: its lane 0 fills the ring with the slices of the
// block's tiles tile, tile + step, ... below tiles (n_tiles column tiles a
// row tile); then the warp takes its part in the cluster barriers.
__device__ __forceinline__ void producer_warp(const stof_gemm_args &a, unsigned sa0,
                                              unsigned sb0, unsigned full0, unsigned empty0,
                                              int tile, int tiles, int step, int n_tiles, int s0,
                                              int slices, int lane) {
    if (lane == 0) {
        int g = 0;
        for (int t = tile; t < tiles; t += step)
            g = produce(a, sa0, sb0, full0, empty0, (t / n_tiles) * BLOCK_M,
                        (t % n_tiles) * BLOCK_N, s0, slices, g, t == tile);
    }
    __syncwarp();
#if SPLIT_K > 1 || NORM
#pragma unroll
    for (int i = 0; i < kClusterSyncs; ++i)
        cluster_sync();
#endif
}

extern "C" __global__ void __launch_bounds__(kBlockThreads)
    stof_gemm_epilogue(const __grid_constant__ stof_gemm_args a) {
    stof::grid_dependency_launch();  // common.cuh
    static_assert(sizeof(stof_gemm_args) == STOF_GEMM_ARGS_BYTES, "ABI mismatch");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long full_bar[STAGES], empty_bar[STAGES];
    elem_t *sa = reinterpret_cast<elem_t *>(
        smem_raw + ((1024 - (unsigned)__cvta_generic_to_shared(smem_raw)) & 1023));
    elem_t *sb = sa + STAGES * kATile;  // [STAGES][kBTile]
    const unsigned sa0 = smem_addr(sa), sb0 = smem_addr(sb);
    const unsigned full0 = smem_addr(full_bar), empty0 = smem_addr(empty_bar);

    // Column tiles vary fastest over the launch order, so a wave of blocks
    // shares a few row tiles of x and the weight stays in L2. A cluster
    // takes one tile (or one row tile's N); otherwise the grid is at most
    // the blocks the GPU holds at once and each takes tiles tile, tile +
    // step, ... (the host sizes it).
    const int n_tiles = (a.n + BLOCK_N - 1) / BLOCK_N;
#if SPLIT_K > 1 || NORM
    const int tile = blockIdx.x / SPLIT_K + blockIdx.y * (gridDim.x / SPLIT_K);
    const int tiles = tile + 1, step = 1;
#else
    const int tile = blockIdx.x, step = gridDim.x;
    const int tiles = (a.m + BLOCK_M - 1) / BLOCK_M * n_tiles;
#endif
    const int m0 = (tile / n_tiles) * BLOCK_M, n0 = (tile % n_tiles) * BLOCK_N;
    // This block's slices [s0, s1) of K (all of them without a split).
    const int total = (a.k + BLOCK_K - 1) / BLOCK_K;
#if SPLIT_K > 1
    const unsigned crank = cluster_rank(), rank = crank % SPLIT_K;  // rank: the K share
    const int per = (total + SPLIT_K - 1) / SPLIT_K;
    const int s0 = min(total, (int)rank * per), s1 = min(total, s0 + per);
#else
    const int s0 = 0, s1 = total;
#endif
    const int slices = s1 - s0;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == kThreads) {  // the producer's lane 0
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            stof::tma::barrier_init(full0 + 8 * s);
            stof::tma::barrier_init(empty0 + 8 * s, WARPS);
        }
        stof::tma::fence_barrier_init();
        for (int s = 0; s < STAGES && s < slices && tile < tiles; ++s)
            tma_slice_w(a, sb0 + s * (kBTile * (unsigned)sizeof(elem_t)), full0 + 8 * s, n0,
                        s0 + s);
    }
    if (tile < tiles)
        prefetch_weight(a, m0, n0, (s0 + STAGES) * BLOCK_K, min(a.k, s1 * BLOCK_K));
    stof::grid_dependency_wait();  // before reading x (and the epilogue's inputs)
    __syncthreads();               // the barriers are initialized before anyone waits on them

    if (warp == WARPS) {
        producer_warp(a, sa0, sb0, full0, empty0, tile, tiles, step, n_tiles, s0, slices, lane);
        return;
    }
    const int wg = warp >> 2, wg_m = wg % kWgM, wg_n = wg / kWgM;
    float d[kWgCols / 2];
#if SPLIT_K > 1 || NORM
    const int r0 = wg_m * 64 + (warp & 3) * 16;  // the warp's first row in the block
    consume(d, sa, sb, full0, empty0, slices, 0, wg_m, wg_n, lane);
    const int row0 = m0 + r0, col0 = n0 + wg_n * kWgCols;
#if SPLIT_K > 1
    compute_sync();  // every warpgroup's products are done with the ring
    const int nt0 = reduce_cluster(d, reinterpret_cast<float4 *>(sa), rank, crank - rank);
#else
    const int nt0 = 0;
#endif
#if NORM
    norm_epilogue(a, d, row0, col0, r0, wg_n, lane, nt0);
#else
    epilogue(a, reinterpret_cast<const float(&)[1][kWgCols / 8][4]>(d), row0, col0, lane, nt0,
             nt0 + kWgCols / 8 / SPLIT_K);
#endif
    cluster_sync();  // the other blocks may still read this one's partials and statistics
#else
    // Persistent: the block's tiles one after another; the producer fills
    // the ring with the next tile's slices while this one's epilogue runs.
    unsigned char *stage =
        reinterpret_cast<unsigned char *>(sb + STAGES * kBTile + warp * kStoreBufs * kStoreTile);
    const unsigned stage0 = smem_addr(stage);
    const int r0 = wg_m * 64 + (warp & 3) * 16;  // the warp's first row in the tile
    int g = 0, slot = 0;
    for (int t = tile; t < tiles; t += step) {
        g = consume(d, sa, sb, full0, empty0, slices, g, wg_m, wg_n, lane);
        epilogue_store(a, d, stage, stage0, (t / n_tiles) * BLOCK_M + r0,
                       (t % n_tiles) * BLOCK_N + wg_n * kWgCols, lane, slot);
    }
    if (lane == 0)
        stof::tma::store_wait_all();  // the buffer lives as long as the block
#endif
}
#else
static_assert(SPLIT_K == 1 && !NORM, "a split of K and a norm over a cluster are the wgmma "
                                     "build's");
extern "C" __global__ void __launch_bounds__(kBlockThreads)
    stof_gemm_epilogue(const stof_gemm_args a) {
    stof::grid_dependency_launch();  // common.cuh
    static_assert(sizeof(stof_gemm_args) == STOF_GEMM_ARGS_BYTES, "ABI mismatch");
    extern __shared__ uint4 smem_raw[];
    elem_t *smem = reinterpret_cast<elem_t *>(smem_raw);
    elem_t *sa = smem;                     // [STAGES][kATile]
    elem_t *sb = smem + STAGES * kATile;   // [STAGES][kBTile]

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int m0 = blockIdx.x * BLOCK_M, n0 = blockIdx.y * BLOCK_N;
    prefetch_weight(a, m0, n0, 0, a.k);
    stof::grid_dependency_wait();  // before any read
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
#endif
