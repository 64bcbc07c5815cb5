// Two GEMMs through an activation in one kernel (a transformer's FFN):
//
//   y = act(x w1^T (+ b1)) w2^T (+ b2) (+ residual)
//
// without the [M, F] intermediate ever leaving the chip. A thread block
// owns BLOCK_M rows (grid ceil(M / BLOCK_M)) and keeps their whole
// [BLOCK_M, OUT_N] output in fp32 registers. It walks the intermediate
// dimension F in chunks of BLOCK_F features:
//
//   for each chunk c of F:
//       GEMM 1: h = x w1[chunk]^T over K in BLOCK_K slices (the cp.async
//               ring of STAGES stages, gemm_common.cuh's tiles and mma)
//       h = act(h + b1[chunk]), rounded to the dtype, into shared memory
//       GEMM 2: for each slab of 64 output columns (two buffers):
//               y[:, slab] += h w2[slab, chunk]^T (h's fragments stay in
//               registers across the slabs)
//   epilogue on the fragments: + b2, + residual, round, store
//
// One load schedule serves both GEMMs: the loads of a chunk are its
// slices, then its slabs, each one cp.async group, issued in the order
// they are consumed (load g feeds step g). After the barrier of step g a
// thread issues, in order, every load up to g + STAGES - 1 whose buffer's
// previous user ran at step g - 1 or before (the barrier proves that user
// finished); slices reuse their ring stage STAGES slices later, slabs
// their buffer two slabs later. So the ring runs STAGES - 1 slices ahead,
// the slab stream one slab ahead, and each crossing between the GEMMs (and
// into the next chunk) is prefetched like any other step. Before step g
// the loads issued after g are at most STAGES - 2 groups, the argument of
// cp.async.wait_group.
//
// Warps: GEMM 1 splits the BLOCK_M x BLOCK_F tile like gemm_epilogue
// (gemm_abi.cuh's warp grid); GEMM 2 splits each BLOCK_M x 64 slab into
// kWarpsM2 x kWarpsN2 pieces (8, 16 or 32 columns a warp), so every warp
// owns BLOCK_M x OUT_N / WARPS accumulators: fusion/templates.c's register
// model.
//
// Shared memory: STAGES x (BLOCK_M + BLOCK_F) x BLOCK_K + BLOCK_M x BLOCK_F
// + 2 x BLOCK_F x 64 elements, exactly the model of fusion/templates.c; all
// tiles swizzled (no padding).
//
// Rows past M, features past F and output columns past OUT_N are
// zero-filled by the loads (their h is act(0), which meets only zero w2
// entries) and never stored. K, F and OUT_N are multiples of 8.
#include "gemm_common.cuh"

#ifndef STOF_DTYPE
#define STOF_DTYPE 1
#endif
#ifndef BLOCK_M
#define BLOCK_M 16
#endif
#ifndef BLOCK_F
#define BLOCK_F 128
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
#ifndef OUT_N
#define OUT_N 768
#endif
#ifndef WEIGHT_KN
#define WEIGHT_KN 0
#endif
#ifndef HAS_BIAS1
#define HAS_BIAS1 0
#endif
#ifndef ACT
#define ACT 0
#endif
#ifndef HAS_BIAS2
#define HAS_BIAS2 0
#endif
#ifndef HAS_RESIDUAL
#define HAS_RESIDUAL 0
#endif

using elem_t = typename stof::dtype_of<STOF_DTYPE>::type;
using namespace stof::attn;
using namespace stof::gemm;

constexpr int kThreads = WARPS * 32;
constexpr bool kKN = WEIGHT_KN != 0;

static_assert(BLOCK_K % 16 == 0 && BLOCK_F % 16 == 0, "BLOCK_K and BLOCK_F: multiples of 16");
static_assert(STAGES >= 2, "STAGES must be at least 2");
static_assert(OUT_N % 8 == 0, "OUT_N must be a multiple of 8");

// GEMM 1: [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_F] slices.
using grid1 = warp_grid<BLOCK_M, BLOCK_F, WARPS>;
constexpr int kATile = BLOCK_M * BLOCK_K;
constexpr int kBTile = BLOCK_F * BLOCK_K;
constexpr int kB1Cols = kKN ? BLOCK_F : BLOCK_K;  // columns of a w1 tile row

// GEMM 2: [BLOCK_M, BLOCK_F] (h) x [BLOCK_F, 64] slabs of w2: [64][BLOCK_F]
// (w2 [N, F]) or [BLOCK_F][64] (w2 [F, N]).
constexpr int kSlabN = STOF_CHAIN_W2_COLS;
constexpr int kSlab = kSlabN * BLOCK_F;
constexpr int kSlabCols = kKN ? kSlabN : BLOCK_F;  // columns of a slab row
constexpr int kSlabs = (OUT_N + kSlabN - 1) / kSlabN;
constexpr int kWarpsM2 = BLOCK_M / 16 < WARPS / 2 ? BLOCK_M / 16 : WARPS / 2;
constexpr int kWarpsN2 = WARPS / kWarpsM2;
constexpr int kMT2 = BLOCK_M / kWarpsM2 / 16;
constexpr int kNT2 = kSlabN / kWarpsN2 / 8;
constexpr int kHSteps = BLOCK_F / 16;  // k steps of GEMM 2 per chunk
static_assert(kWarpsM2 >= 1 && WARPS % kWarpsM2 == 0 && BLOCK_M % (kWarpsM2 * 16) == 0 &&
                  kSlabN % (kWarpsN2 * 8) == 0,
              "GEMM 2: no split of WARPS over a BLOCK_M x 64 slab");

// ---- the load schedule ----------------------------------------------------------------

// Loads (= steps) of one chunk: its slices, then its slabs.
struct schedule {
    int slices, per_chunk, total;
};

// The step whose load last used load h's buffer, or -1 for a first use.
__device__ __forceinline__ int previous_user(const schedule &s, int h) {
    const int c = h / s.per_chunk, j = h - c * s.per_chunk;
    if (j < s.slices) {
        const int slice = c * s.slices + j - STAGES;
        if (slice < 0)
            return -1;
        const int c2 = slice / s.slices;
        return c2 * s.per_chunk + (slice - c2 * s.slices);
    }
    const int slab = c * kSlabs + (j - s.slices) - 2;
    if (slab < 0)
        return -1;
    const int c2 = slab / kSlabs;
    return c2 * s.per_chunk + s.slices + (slab - c2 * kSlabs);
}

struct tiles {
    elem_t *sa, *sb;  // the ring: [STAGES][kATile], [STAGES][kBTile]
    elem_t *sh;       // h: [BLOCK_M][BLOCK_F]
    elem_t *slab;     // w2 slabs: [2][kSlab]
};

// Issues load h (cp.async, no commit): a slice of x and w1, or a slab of w2.
__device__ __forceinline__ void issue(const stof_gemm_chain_args &a, const tiles &t,
                                      const schedule &s, int h, int m0) {
    const int c = h / s.per_chunk, j = h - c * s.per_chunk, f0 = c * BLOCK_F;
    if (j < s.slices) {
        const int st = (c * s.slices + j) % STAGES, k0 = j * BLOCK_K;
        load_tile<BLOCK_M, BLOCK_K, kThreads>(t.sa + st * kATile,
                                              static_cast<const elem_t *>(a.x), a.x_row_stride,
                                              m0, a.m, k0, a.k);
        const elem_t *w1 = static_cast<const elem_t *>(a.w1);
        if constexpr (kKN)
            load_tile<BLOCK_K, BLOCK_F, kThreads>(t.sb + st * kBTile, w1, a.w1_row_stride, k0,
                                                  a.k, f0, a.f);
        else
            load_tile<BLOCK_F, BLOCK_K, kThreads>(t.sb + st * kBTile, w1, a.w1_row_stride, f0,
                                                  a.f, k0, a.k);
    } else {
        const int q = j - s.slices, n0 = q * kSlabN;
        elem_t *dst = t.slab + ((c * kSlabs + q) & 1) * kSlab;
        const elem_t *w2 = static_cast<const elem_t *>(a.w2);
        if constexpr (kKN)
            load_tile<BLOCK_F, kSlabN, kThreads>(dst, w2, a.w2_row_stride, f0, a.f, n0, OUT_N);
        else
            load_tile<kSlabN, BLOCK_F, kThreads>(dst, w2, a.w2_row_stride, n0, OUT_N, f0, a.f);
    }
}

// Issues, in order, the loads up to `last` whose buffers no step from
// `busy_from` on still uses; *issued counts the loads issued so far.
__device__ __forceinline__ void pump(const stof_gemm_chain_args &a, const tiles &t,
                                     const schedule &s, int *issued, int last, int busy_from,
                                     int m0) {
    while (*issued < s.total && *issued <= last && previous_user(s, *issued) < busy_from) {
        issue(a, t, s, *issued, m0);
        cp_async_commit();
        ++*issued;
    }
}

// Before step g: waits for load g, then the barrier that frees the buffers
// step g - 1 used; then refills them.
__device__ __forceinline__ void begin_step(const stof_gemm_chain_args &a, const tiles &t,
                                           const schedule &s, int *issued, int g, int m0) {
    if constexpr (STAGES > 2) {
        if (*issued - 1 - g >= 1)
            cp_async_wait<1>();
        else
            cp_async_wait<0>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
    pump(a, t, s, issued, g + STAGES - 1, g, m0);
}

// ---- GEMM 1's epilogue: h = act(acc + b1) into shared memory ----------------------------

using acc1_t = float[grid1::kMT][grid1::kNT][4];

__device__ __forceinline__ void stash_h(const stof_gemm_chain_args &a, elem_t *sh,
                                        const acc1_t &acc, int f0, int wm0, int wn0, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < grid1::kNT; ++nt) {
        const int col = wn0 + nt * 8 + 2 * t;  // within the chunk
        float2 b = make_float2(0.0f, 0.0f);
#if HAS_BIAS1
        if (f0 + col < a.f)
            b = unpack2<elem_t>(*reinterpret_cast<const unsigned *>(
                static_cast<const elem_t *>(a.b1) + f0 + col));
#endif
#pragma unroll
        for (int mt = 0; mt < grid1::kMT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = wm0 + mt * 16 + g + 8 * h;
                const float v0 = stof_activate<ACT>(acc[mt][nt][2 * h] + b.x);
                const float v1 = stof_activate<ACT>(acc[mt][nt][2 * h + 1] + b.y);
                *reinterpret_cast<unsigned *>(sh + swizzle<BLOCK_F / 8>(row, col / 8) +
                                              (col & 7)) = pack2<elem_t>(v0, v1);
            }
    }
}

// ---- GEMM 2 -------------------------------------------------------------------------------

using hfrag_t = unsigned[kHSteps][kMT2][4];
using acc2_t = float[kMT2][kNT2][4];

// One slab into its accumulators.
__device__ __forceinline__ void mma_slab(acc2_t &acc, const hfrag_t &hf, const elem_t *slab,
                                         int wn0, int lane) {
#pragma unroll
    for (int ks = 0; ks < kHSteps; ++ks) {
        unsigned fb[kNT2][2];
        load_b<kNT2, kSlabCols / 8, kKN>(fb, slab, wn0, ks, lane);
#pragma unroll
        for (int mt = 0; mt < kMT2; ++mt)
#pragma unroll
            for (int nt = 0; nt < kNT2; ++nt)
                mma_16816<elem_t>(acc[mt][nt], hf[ks][mt], fb[nt][0], fb[nt][1]);
    }
}

// + b2, + residual on the fragments of slab q, rounded and stored.
__device__ __forceinline__ void store_slab(const stof_gemm_chain_args &a, const acc2_t &acc,
                                           int q, int row0, int wn0, int lane) {
    elem_t *y = static_cast<elem_t *>(a.y);
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < kNT2; ++nt) {
        const int col = q * kSlabN + wn0 + nt * 8 + 2 * t;
        if (OUT_N % kSlabN != 0 && col >= OUT_N)
            continue;
        float2 b = make_float2(0.0f, 0.0f);
#if HAS_BIAS2
        b = unpack2<elem_t>(
            *reinterpret_cast<const unsigned *>(static_cast<const elem_t *>(a.b2) + col));
#endif
#pragma unroll
        for (int mt = 0; mt < kMT2; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + mt * 16 + g + 8 * h;
                if (row >= a.m)
                    continue;
                float v0 = acc[mt][nt][2 * h] + b.x, v1 = acc[mt][nt][2 * h + 1] + b.y;
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

// ---- the kernel -------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(kThreads)
    stof_gemm_chain(const stof_gemm_chain_args a) {
    stof::grid_dependency_launch();  // common.cuh
    // Every block reads all of w1 and w2: the first asks L2 for them before
    // waiting for the previous kernel (prefetch_l2).
    if (blockIdx.x == 0) {
        constexpr int e = (int)sizeof(elem_t);
        stof::prefetch_l2(a.w1, a.w1_row_stride * (long long)e, WEIGHT_KN ? a.k : a.f,
                          (WEIGHT_KN ? a.f : a.k) * e);
        stof::prefetch_l2(a.w2, a.w2_row_stride * (long long)e, WEIGHT_KN ? a.f : a.n,
                          (WEIGHT_KN ? a.n : a.f) * e);
    }
    stof::grid_dependency_wait();  // before any read
    static_assert(sizeof(stof_gemm_chain_args) == STOF_GEMM_CHAIN_ARGS_BYTES, "ABI mismatch");
    extern __shared__ uint4 smem_raw[];
    tiles t;
    t.sa = reinterpret_cast<elem_t *>(smem_raw);
    t.sb = t.sa + STAGES * kATile;
    t.sh = t.sb + STAGES * kBTile;
    t.slab = t.sh + BLOCK_M * BLOCK_F;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int m0 = blockIdx.x * BLOCK_M;
    const int wm1 = (warp / grid1::kWarpsN) * grid1::kWarpM;
    const int wn1 = (warp % grid1::kWarpsN) * grid1::kWarpN;
    const int wm2 = (warp / kWarpsN2) * (BLOCK_M / kWarpsM2);
    const int wn2 = (warp % kWarpsN2) * (kSlabN / kWarpsN2);

    schedule s;
    s.slices = (a.k + BLOCK_K - 1) / BLOCK_K;
    s.per_chunk = s.slices + kSlabs;
    const int chunks = (a.f + BLOCK_F - 1) / BLOCK_F;
    s.total = chunks * s.per_chunk;

    float yacc[kSlabs][kMT2][kNT2][4];
#pragma unroll
    for (int q = 0; q < kSlabs; ++q)
        zero_acc(yacc[q]);

    int issued = 0, g = 0, ring = 0;
    pump(a, t, s, &issued, STAGES - 2, 0, m0);
    for (int c = 0; c < chunks; ++c) {
        float hacc[grid1::kMT][grid1::kNT][4];
        zero_acc(hacc);
        for (int kt = 0; kt < s.slices; ++kt, ++g) {
            begin_step(a, t, s, &issued, g, m0);
            mma_tile<grid1::kMT, grid1::kNT, BLOCK_K / 16, BLOCK_K / 8, kB1Cols / 8, kKN>(
                hacc, t.sa + ring * kATile, t.sb + ring * kBTile, wm1, wn1, lane);
            ring = ring + 1 == STAGES ? 0 : ring + 1;
        }
        stash_h(a, t.sh, hacc, c * BLOCK_F, wm1, wn1, lane);

        hfrag_t hf;
#pragma unroll
        for (int q = 0; q < kSlabs; ++q, ++g) {
            begin_step(a, t, s, &issued, g, m0);
            if (q == 0) {  // the barrier above made every warp's h visible
#pragma unroll
                for (int ks = 0; ks < kHSteps; ++ks)
                    load_a<kMT2, BLOCK_F / 8>(hf[ks], t.sh, wm2, ks, lane);
            }
            mma_slab(yacc[q], hf, t.slab + ((c * kSlabs + q) & 1) * kSlab, wn2, lane);
        }
    }

#pragma unroll
    for (int q = 0; q < kSlabs; ++q)
        store_slab(a, yacc[q], q, m0 + wm2, wn2, lane);
}
