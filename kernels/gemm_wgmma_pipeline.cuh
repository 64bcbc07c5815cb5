// gemm_epilogue's wgmma main loop (sm_90a): TMA loads of the slices by a
// producer warp, wgmma products by the compute warpgroups, the ring's
// full and empty barriers between them (warp specialization).
//
// Included by gemm_epilogue.cu only, after its parameters (BLOCK_M, ...,
// -D constants), elem_t and the tile constants it defines: the pieces
// read them as the kernel's own.
#ifndef STOF_KERNELS_GEMM_WGMMA_PIPELINE_CUH
#define STOF_KERNELS_GEMM_WGMMA_PIPELINE_CUH

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

#endif
