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

#if !WGMMA
constexpr int kBCols = WEIGHT_KN ? BLOCK_N : BLOCK_K;  // columns of a w tile row

// One stage's BLOCK_K slice into the accumulators.
__device__ __forceinline__ void mma_slice(float (&acc)[kMT][kNT][4], const elem_t *sa,
                                          const elem_t *sb, int wm0, int wn0, int lane) {
    mma_tile<kMT, kNT, kKSteps, BLOCK_K / 8, kBCols / 8, WEIGHT_KN != 0>(acc, sa, sb, wm0, wn0,
                                                                          lane);
}
#endif

// The blocks of the first row tile ask L2 for their column tile of w, over
// their range [k0, k1) of K, before waiting for the previous kernel:
// together the whole weight, once, while that kernel finishes.
__device__ __forceinline__ void prefetch_weight(const stof_gemm_args &a, int m0, int n0, int k0,
                                                int k1) {
    if (m0 != 0 || k0 >= k1)
        return;
    const int cols = a.n - n0 < BLOCK_N ? a.n - n0 : BLOCK_N;
    const long long stride = a.w_row_stride * (long long)sizeof(elem_t);
#if WEIGHT_KN
    stof::prefetch_l2(static_cast<const elem_t *>(a.w) + (long long)k0 * a.w_row_stride + n0,
                      stride, k1 - k0, cols * (int)sizeof(elem_t));
#else
    stof::prefetch_l2(static_cast<const elem_t *>(a.w) + (long long)n0 * a.w_row_stride + k0,
                      stride, cols, (k1 - k0) * (int)sizeof(elem_t));
#endif
}

// Elements at and at + 1 of a tensor in the model dtype, as floats.
__device__ __forceinline__ float2 load_pair(const void *base, long long at) {
    return unpack2<elem_t>(
        *reinterpret_cast<const unsigned *>(static_cast<const elem_t *>(base) + at));
}

// The bias of columns col and col + 1 (zeros without one).
__device__ __forceinline__ float2 bias_pair(const stof_gemm_args &a, int col) {
#if HAS_BIAS
    return load_pair(a.bias, col);
#else
    return make_float2(0.0f, 0.0f);
#endif
}

// The epilogue's value of the pair (c0, c1): act(c + bias) + residual (b:
// the pair's bias, 0 without one; r: the residual's pair, NULL for a row
// past M, ignored without a residual).
__device__ __forceinline__ float2 epilogue_pair(float c0, float c1, float2 b, const elem_t *r) {
    float2 v = make_float2(stof_activate<ACT>(c0 + b.x), stof_activate<ACT>(c1 + b.y));
#if HAS_RESIDUAL
    if (r) {
        const float2 rv = unpack2<elem_t>(*reinterpret_cast<const unsigned *>(r));
        v.x += rv.x;
        v.y += rv.y;
    }
#endif
    return v;
}

// Row `row`'s element at column col of a tensor with that row stride.
__device__ __forceinline__ const elem_t *row_at(const void *base, long long stride, int row,
                                                int col) {
    return static_cast<const elem_t *>(base) + (long long)row * stride + col;
}

// + bias, activation, + residual on the fragments, rounded and stored as
// pairs (c0 c1 at row g, c2 c3 at row g + 8; columns 2t, 2t + 1).
// Only the column tiles nt_begin <= nt < nt_end (all by default). A thread
// touches 2 MT rows: their addresses are computed once, the column tiles
// are offsets from them (the per-pair 64-bit arithmetic was most of the
// epilogue's instructions).
template <int MT, int NT>
__device__ __forceinline__ void epilogue(const stof_gemm_args &a, const float (&acc)[MT][NT][4],
                                         int row0, int col0, int lane, int nt_begin = 0,
                                         int nt_end = NT) {
    const int g = lane >> 2, t = lane & 3;
    const int c0 = col0 + 2 * t;  // the thread's first column
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + mt * 16 + g + 8 * h;
            if (row >= a.m)
                continue;
            elem_t *y = static_cast<elem_t *>(a.y) + (long long)row * a.y_row_stride + c0;
            const elem_t *r = row_at(a.residual, a.r_row_stride, row, c0);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                if (c0 + nt * 8 >= a.n || nt < nt_begin || nt >= nt_end)
                    continue;
                const float2 v = epilogue_pair(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1],
                                               bias_pair(a, c0 + nt * 8), r + nt * 8);
                *reinterpret_cast<unsigned *>(y + nt * 8) = pack2<elem_t>(v.x, v.y);
            }
        }
}

#if WGMMA
// ---- the wgmma build (sm_90a) ------------------------------------------------------
//
// The block's WARPS / 4 warpgroups tile it in pieces of 64 rows (kWgM of
// them along M, the rest along N) by kWgCols columns (gemm_abi.cuh's
// stof_gemm_wgmma_shape). Each piece is one m64nNk16 accumulator (N =
// kWgCols) whose per-thread layout is that of kWgCols / 8 mma.sync C
// fragments of the warp's 16 rows, so the epilogue above runs on it
// unchanged (kMT = 1).
//
// Both operands are K-major in shared memory, in the 128-byte swizzle
// wgmma reads (wgmma.cuh's desc_sw128: 64-wide rows of 8 chunks, chunk ^
// row % 8, 8-row atoms of 1024 bytes), so BLOCK_K is 64 and every tile
// starts on a 1024-byte boundary (the host allots 1024 bytes of slack,
// STOF_GEMM_WGMMA_SLACK, for aligning the base). The tensor memory
// accelerator writes the tiles in that layout: one thread issues a slice
// as two box copies (x and w, tensor maps in the argument block) counted on
// the stage's barrier, instead of every thread computing and issuing a few
// 16-byte copies. At small M the per-thread copies were most of the
// kernel's instructions. Rows and k past the tensors arrive as zeros.
//
// The block is warp-specialized: one producer warp beyond the WARPS that
// compute (kBlockThreads) issues every copy from one lane, so no compute
// warp ever waits for another or for a copy's issue. Each stage has two
// barriers: `full` completes when its slice has landed (the producer's one
// arrival with the slice's bytes), `empty` when every compute warp is done
// reading it (WARPS arrivals). A compute warpgroup waits for slice kt's
// full barrier, issues its products, waits until slice kt - 1's are done
// (one group of wgmma in flight) and hands slice kt - 1's stage back; the
// producer waits for a stage's empty barrier before refilling it, so
// slices land up to STAGES - 1 ahead of the products. Use u of a stage
// (slice st + u STAGES of the block's range) waits for full parity u & 1,
// and its refill for empty parity (u - 1) & 1.
//
// The weight does not depend on the previous kernel: the first STAGES w
// boxes are issued before griddepcontrol.wait, the x boxes after it.
#include "tma.cuh"
#include "wgmma.cuh"

static_assert(!WEIGHT_KN, "the wgmma build takes [N, K] weights (K-major B)");
static_assert(stof_gemm_wgmma_shape(BLOCK_M, BLOCK_N, BLOCK_K, WARPS, STAGES),
              "whole warpgroups of 64 rows, each one wgmma N of 32, 64, 128 or 256 columns");
constexpr int kWgM = BLOCK_M / 64;  // warpgroups along M (then along N)
constexpr int kWgCols = stof_gemm_wgmma_cols(BLOCK_M, BLOCK_N, WARPS);
constexpr unsigned kSliceBytes = (kATile + kBTile) * sizeof(elem_t);  // every box whole

// Slice kt into one stage, by one thread: tma_slice_w arms the stage's
// barrier for the whole slice and copies w's box, tma_slice_x copies x's
// box onto the same barrier (sa, sb, bar: shared-memory addresses).
__device__ __forceinline__ void tma_slice_w(const stof_gemm_args &a, unsigned sb, unsigned bar,
                                            int n0, int kt) {
    stof::tma::arrive_expect(bar, kSliceBytes);
    stof::tma::copy_2d(sb, &a.tmap_w, kt * BLOCK_K, n0, bar);
}
__device__ __forceinline__ void tma_slice_x(const stof_gemm_args &a, unsigned sa, unsigned bar,
                                            int m0, int kt) {
    stof::tma::copy_2d(sa, &a.tmap_x, kt * BLOCK_K, m0, bar);
}

// Slice st of the stage into the warpgroup's accumulators: 4 k steps of 16
// (32 bytes into the swizzled rows), issued and committed as one group.
__device__ __forceinline__ void issue_slice(float (&d)[kWgCols / 2], const elem_t *sa,
                                            const elem_t *sb, int wg_m, int wg_n) {
    const elem_t *ta = sa + wg_m * 64 * BLOCK_K;
    const elem_t *tb = sb + wg_n * kWgCols * BLOCK_K;
    stof::wg::fence();
#pragma unroll
    for (int ks = 0; ks < BLOCK_K / 16; ++ks)
        stof::wg::wg_mma<kWgCols>::ss(d, stof::wg::desc_sw128(ta + ks * 16, 16, 1024),
                                      stof::wg::desc_sw128(tb + ks * 16, 16, 1024), 1);
    stof::wg::commit();
}

// The compute warps only: a named barrier the producer warp takes no part in.
__device__ __forceinline__ void compute_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(kThreads) : "memory");
}

// The producer warp's lane 0: the slices [s0, s0 + slices) of one tile
// into the ring, g the block's count of slices before them (stage g %
// STAGES, use g / STAGES). In the block's first tile (first) the first
// STAGES slices' w boxes went out before the grid dependency wait: only
// their x boxes are left. Returns the count after the tile.
__device__ __forceinline__ int produce(const stof_gemm_args &a, unsigned sa0, unsigned sb0,
                                      unsigned full0, unsigned empty0, int m0, int n0, int s0,
                                      int slices, int g, bool first) {
    constexpr unsigned kA = kATile * sizeof(elem_t), kB = kBTile * sizeof(elem_t);
    for (int kt = 0; kt < slices; ++kt, ++g) {
        const int st = g % STAGES;
        if (!first || kt >= STAGES) {
            if (g >= STAGES)
                stof::tma::wait(empty0 + 8 * st, ((g / STAGES) - 1) & 1);
            tma_slice_w(a, sb0 + st * kB, full0 + 8 * st, n0, s0 + kt);
        }
        tma_slice_x(a, sa0 + st * kA, full0 + 8 * st, m0, s0 + kt);
    }
    return g;
}

// A compute warpgroup's products over one tile's slices into d (g as in
// produce), every stage handed back once read. Returns the count after it.
__device__ __forceinline__ int consume(float (&d)[kWgCols / 2], const elem_t *sa,
                                       const elem_t *sb, unsigned full0, unsigned empty0,
                                       int slices, int g, int wg_m, int wg_n, int lane) {
#pragma unroll
    for (int i = 0; i < kWgCols / 2; ++i)
        d[i] = 0.0f;
    for (int kt = 0; kt < slices; ++kt, ++g) {
        const int st = g % STAGES;
        stof::tma::wait(full0 + 8 * st, (g / STAGES) & 1);
        issue_slice(d, sa + st * kATile, sb + st * kBTile, wg_m, wg_n);
        stof::wg::wait<1>();
        if (kt > 0 && lane == 0)
            stof::tma::arrive(empty0 + 8 * ((g - 1) % STAGES));
    }
    stof::wg::wait<0>();
    stof::wg::wg_mma<kWgCols>::keep(d);
    if (slices > 0 && lane == 0)
        stof::tma::arrive(empty0 + 8 * ((g - 1) % STAGES));
    return g;
}

#if SPLIT_K == 1 && !NORM
// ---- the persistent build's stores ---------------------------------------------------
//
// (gemm_abi.cuh: stof_gemm_store_cols, _bufs, _smem.) A warp's 16 x
// kWgCols share of its warpgroup's tile leaves in chunks of 16 x 32: its
// threads write their epilogue values into one of the warp's staging
// buffers in the 64-byte swizzle of tmap_y's box, and lane 0 copies the
// chunk out as one bulk group. Stored straight from the fragments, each
// warp store wrote 16 bytes to each of 8 rows, and the stores took a third
// of the kernel's time at K = 768. The buffers go round; one is reused
// once its copy has read it, so a tile's copies run while the warp goes on
// to its next products, and no warp waits for another.
constexpr int kStoreCols = stof_gemm_store_cols(BLOCK_M, BLOCK_N, WARPS);
constexpr int kStoreBufs = stof_gemm_store_bufs(BLOCK_M, BLOCK_N, BLOCK_K, STAGES);
constexpr int kStoreTile = 16 * kStoreCols;  // elements a warp stages a chunk
static_assert(kStoreCols == 32, "rows of 64 bytes");
static_assert(stof_gemm_store_smem(BLOCK_M, BLOCK_N, BLOCK_K, WARPS, STAGES, SPLIT_K, NORM) ==
                  WARPS * kStoreBufs * kStoreTile * (int)sizeof(elem_t),
              "the host's staging model");

// Byte offset o of a buffer in the 64-byte swizzle (the 16-byte chunk index
// XOR bits 7-8 of the offset; buffers start on 512-byte boundaries). A warp
// store of the fragment layout then hits 32 distinct banks.
__device__ __forceinline__ unsigned store_swizzle(unsigned o) {
    return o ^ (((o >> 7) & 3u) << 4);
}

// The epilogue of a warp's 16 rows at (row0, col0) of the output through
// its staging buffers (stage, at shared address stage0; slot: the next
// one, carried from tile to tile). Rows past M and columns past N are
// computed from whatever the fragments hold and clipped by the copy; their
// residual is not read.
__device__ __forceinline__ void epilogue_store(const stof_gemm_args &a,
                                               const float (&d)[kWgCols / 2],
                                               unsigned char *stage, unsigned stage0, int row0,
                                               int col0, int lane, int &slot) {
    constexpr unsigned kBytes = kStoreTile * sizeof(elem_t);
    const int g = lane >> 2, t = lane & 3;
    const elem_t *r[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = row0 + g + 8 * h;
        r[h] = row < a.m ? row_at(a.residual, a.r_row_stride, row, col0 + 2 * t) : nullptr;
    }
#pragma unroll
    for (int ch = 0; ch < kWgCols / kStoreCols; ++ch) {
        if (lane == 0)
            stof::tma::store_wait_read<kStoreBufs - 1>();
        __syncwarp();  // the slot's last copy has read it
        unsigned char *buf = stage + slot * kBytes;
#pragma unroll
        for (int nt = 0; nt < kStoreCols / 8; ++nt) {
            const int j = ch * (kStoreCols / 8) + nt;  // the fragment's column tile
            if (col0 + j * 8 >= a.n)
                continue;
            const float2 b = bias_pair(a, col0 + j * 8 + 2 * t);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float2 v = epilogue_pair(d[4 * j + 2 * h], d[4 * j + 2 * h + 1], b,
                                               r[h] ? r[h] + j * 8 : nullptr);
                const unsigned o =
                    ((g + 8 * h) * kStoreCols + nt * 8 + 2 * t) * (unsigned)sizeof(elem_t);
                *reinterpret_cast<unsigned *>(buf + store_swizzle(o)) = pack2<elem_t>(v.x, v.y);
            }
        }
        stof::wg::fence_proxy_async();  // the writes, visible to the copy
        __syncwarp();
        if (lane == 0) {
            stof::tma::store_2d(&a.tmap_y, stage0 + slot * kBytes, col0 + ch * kStoreCols, row0);
            stof::tma::store_commit();
        }
        slot = slot + 1 == kStoreBufs ? 0 : slot + 1;
    }
}
#endif

#if SPLIT_K > 1 || NORM
// ---- clusters: split K, whole rows ---------------------------------------------------
//
// With SPLIT_K > 1 the host launches clusters of SPLIT_K consecutive blocks
// along x that share one output tile, block r of a cluster (its rank) taking
// the r-th share of the K slices. Few output tiles (small M) then still
// spread the weight's stream over SPLIT_K times as many SMs, and the partial
// sums meet in distributed shared memory instead of a second kernel: every
// block parks its fp32 accumulators in its own (drained) operand ring, the
// cluster synchronizes, and block r sums every block's partials of the r-th
// share of the warpgroup's column tiles and runs the epilogue on them. A
// last cluster barrier keeps every ring alive until its readers are done.
//
// With NORM a cluster is NORM_TILES such groups, one per column tile of
// the same rows: rank r takes column tile r / SPLIT_K and K share
// r % SPLIT_K, and the cluster holds whole rows for the norm (below).
static_assert((kWgCols / 8) % SPLIT_K == 0, "SPLIT_K divides a warpgroup's column tiles");
static_assert(SPLIT_K == 1 ||
                  BLOCK_M * BLOCK_N * 4 <= STAGES * (kATile + kBTile) * (int)sizeof(elem_t),
              "the partial sums fit the operand ring");
static_assert(SPLIT_K * NORM_TILES <= STOF_GEMM_MAX_CLUSTER, "blocks a cluster");

__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// Every thread of every block of the cluster; orders shared-memory writes
// before the barrier with reads after it, across the cluster.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The address of the same shared-memory offset as `local` in block `rank`
// of the cluster.
__device__ __forceinline__ unsigned cluster_addr(const void *local, unsigned rank) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote)
                 : "r"(smem_addr(local)), "r"(rank));
    return remote;
}

// 4 floats at the same shared-memory offset in block `rank` of the cluster.
__device__ __forceinline__ float4 ld_cluster4(const float4 *local, unsigned rank) {
    const unsigned remote = cluster_addr(local, rank);
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(remote)
                 : "memory");
    return v;
}
#endif

#if SPLIT_K > 1

// Parks d in part (float4 j of thread t at part[j * kThreads + t], so a
// warp's stores are contiguous), then sums the partials of the blocks
// group .. group + SPLIT_K - 1 (this one is group + rank) of this block's
// share of the column tiles into d. Returns that share's first tile.
__device__ __forceinline__ int reduce_cluster(float (&d)[kWgCols / 2], float4 *part,
                                              unsigned rank, unsigned group) {
    constexpr int kTiles = kWgCols / 8, kShare = kTiles / SPLIT_K;
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
        part[j * kThreads + threadIdx.x] =
            make_float4(d[4 * j], d[4 * j + 1], d[4 * j + 2], d[4 * j + 3]);
    cluster_sync();
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
        if (j / kShare != (int)rank)
            continue;
#pragma unroll
        for (int q = 1; q < SPLIT_K; ++q) {
            const float4 v =
                ld_cluster4(part + j * kThreads + threadIdx.x, group + (rank + q) % SPLIT_K);
            d[4 * j] += v.x;
            d[4 * j + 1] += v.y;
            d[4 * j + 2] += v.z;
            d[4 * j + 3] += v.w;
        }
    }
    return (int)rank * kShare;
}
#endif

#if NORM
// ---- a row norm over the cluster -----------------------------------------------------
//
// After the split's reduction each block owns kOwnCols = BLOCK_N / SPLIT_K
// columns of its rows, wholly summed: in a thread, the column tiles nt0 ..
// nt0 + kShare - 1 of its warpgroup's accumulator at rows g and g + 8 of
// its warp's 16. The block turns them into s (bias, activation, residual)
// in place, then takes per row the mean of its columns and the sum of the
// squared deviations from that mean (two passes over registers: no
// cancellation), shares the pair in shared memory and, after a cluster
// barrier, merges the pairs of all kBlocks blocks (Chan, Golub and LeVeque;
// every block owns as many columns: mean = the mean of the means, M2 =
// sum M2_b + kOwnCols sum (mean_b - mean)^2) into the row's statistics.
// RMSNorm takes the sum of squares about 0 the same way. The caller's last
// cluster barrier keeps the pairs alive until every block has read them.
static_assert(NORM == STOF_NORM_LAYERNORM || NORM == STOF_NORM_RMSNORM, "NORM is 1 or 2");
constexpr int kBlocks = SPLIT_K * NORM_TILES;  // a cluster: whole rows
constexpr int kWgN = WARPS / 4 / kWgM;         // warpgroups along N
constexpr int kOwnCols = BLOCK_N / SPLIT_K;
static_assert(BLOCK_M <= 128 && kWgN <= 2, "the statistics' arrays (STOF_GEMM_NORM_SMEM)");

// 2 floats at the same shared-memory offset in block `rank` of the cluster.
__device__ __forceinline__ float2 ld_cluster2(const float2 *local, unsigned rank) {
    const unsigned remote = cluster_addr(local, rank);
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];"
                 : "=f"(v.x), "=f"(v.y)
                 : "r"(remote)
                 : "memory");
    return v;
}

// v[h]: a thread's partial sums of rows r and r + 8 (block-local); returns
// in v the block's sums: over the quad of lanes sharing the rows, then over
// the warpgroups along N through red ([kWgN][BLOCK_M]).
__device__ __forceinline__ void block_row_sums(float (&v)[2], float (*red)[BLOCK_M], int wg_n,
                                               int r, int lane) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        v[h] += __shfl_xor_sync(0xffffffffu, v[h], 1);
        v[h] += __shfl_xor_sync(0xffffffffu, v[h], 2);
    }
    if ((lane & 3) == 0) {
        red[wg_n][r] = v[0];
        red[wg_n][r + 8] = v[1];
    }
    compute_sync();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kWgN; ++w)
            sum += red[w][r + 8 * h];
        v[h] = sum;
    }
}

// The epilogue with the norm: d's tiles nt0 .. nt0 + kShare - 1 at rows
// row0 + g (+ 8) (block-local r0 + g) and columns col0 + 8 j + 2 t (+ 1).
__device__ __forceinline__ void norm_epilogue(const stof_gemm_args &a, float (&d)[kWgCols / 2],
                                              int row0, int col0, int r0, int wg_n, int lane,
                                              int nt0) {
    __shared__ float red[2][kWgN][BLOCK_M];
    __shared__ float2 stat[BLOCK_M];
    constexpr int kShare = kWgCols / 8 / SPLIT_K;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < kWgCols / 8; ++j) {
        if (j < nt0 || j >= nt0 + kShare)
            continue;
        const int col = col0 + j * 8 + 2 * t;
        const float2 b = bias_pair(a, col);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + g + 8 * h;
            const float2 v =
                epilogue_pair(d[4 * j + 2 * h], d[4 * j + 2 * h + 1], b,
                              row < a.m ? row_at(a.residual, a.r_row_stride, row, col) : nullptr);
            d[4 * j + 2 * h] = v.x;
            d[4 * j + 2 * h + 1] = v.y;
#if STORE_PRE_NORM
            if (row < a.m)
                *reinterpret_cast<unsigned *>(static_cast<elem_t *>(a.pre_norm) +
                                              (long long)row * a.p_row_stride + col) =
                    pack2<elem_t>(v.x, v.y);
#endif
        }
    }
    float mean_b[2] = {0.0f, 0.0f};
#if NORM == STOF_NORM_LAYERNORM
#pragma unroll
    for (int j = 0; j < kWgCols / 8; ++j)
        if (j >= nt0 && j < nt0 + kShare)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                mean_b[h] += d[4 * j + 2 * h] + d[4 * j + 2 * h + 1];
    block_row_sums(mean_b, red[0], wg_n, r0 + g, lane);
    mean_b[0] *= 1.0f / kOwnCols;
    mean_b[1] *= 1.0f / kOwnCols;
#endif
    float sq[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kWgCols / 8; ++j)
        if (j >= nt0 && j < nt0 + kShare)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float dx = d[4 * j + e] - mean_b[e >> 1];
                sq[e >> 1] += dx * dx;
            }
    block_row_sums(sq, red[1], wg_n, r0 + g, lane);
    if (wg_n == 0 && t == 0) {
        stat[r0 + g] = make_float2(mean_b[0], sq[0]);
        stat[r0 + g + 8] = make_float2(mean_b[1], sq[1]);
    }
    cluster_sync();
    float mean[2], rstd[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float2 st[kBlocks];
        float sum = 0.0f;
#pragma unroll
        for (int q = 0; q < kBlocks; ++q) {
            st[q] = ld_cluster2(stat + r0 + g + 8 * h, q);
            sum += st[q].x;
        }
        const float mu = sum * (1.0f / kBlocks);
        float m2 = 0.0f;
#pragma unroll
        for (int q = 0; q < kBlocks; ++q) {
            const float dm = st[q].x - mu;
            m2 += st[q].y + kOwnCols * dm * dm;
        }
        mean[h] = mu;
        rstd[h] = rsqrtf(m2 * (1.0f / (NORM_TILES * BLOCK_N)) + a.eps);
    }
#pragma unroll
    for (int j = 0; j < kWgCols / 8; ++j) {
        if (j < nt0 || j >= nt0 + kShare)
            continue;
        const int col = col0 + j * 8 + 2 * t;
        const float2 gm = load_pair(a.gamma, col);
        float2 bt = make_float2(0.0f, 0.0f);
#if NORM == STOF_NORM_LAYERNORM
        bt = load_pair(a.beta, col);
#endif
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + g + 8 * h;
            if (row >= a.m)
                continue;
            const float y0 = (d[4 * j + 2 * h] - mean[h]) * rstd[h] * gm.x + bt.x;
            const float y1 = (d[4 * j + 2 * h + 1] - mean[h]) * rstd[h] * gm.y + bt.y;
            *reinterpret_cast<unsigned *>(static_cast<elem_t *>(a.y) +
                                          (long long)row * a.y_row_stride + col) =
                pack2<elem_t>(y0, y1);
        }
    }
}
#endif

#if SPLIT_K > 1 || NORM
// Cluster barriers the compute warps take after the mainloop (the split's
// reduction, the norm's statistics, the last one keeping the shared memory
// alive), which the producer warp takes too.
constexpr int kClusterSyncs = (SPLIT_K > 1) + (NORM != 0) + 1;
#endif

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
