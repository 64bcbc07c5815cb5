// Device pieces of the tensor-core GEMM kernels (gemm_epilogue.cu,
// gemm_ln.cu, gemm_chain.cu), on top of attention_common.cuh's cp.async,
// ldmatrix and mma wrappers:
//
//   warp_grid      how WARPS warps split a BM x BN tile (gemm_abi.cuh's rule)
//   swizzle        the XOR layout of a tile's 16-byte chunks in shared memory
//   load_tile      a tile global -> shared by cp.async, zero-filled past the edges
//   load_a / load_b   mma fragments of a warp's rows / columns at one k step
//   mma_tile       a BLOCK_K slice of a tile into a warp's accumulators
//
// Tiles are row-major in shared memory with no padding: the 16-byte chunks
// of a row are XOR-swizzled instead, so that the eight row addresses of
// every ldmatrix (transposed or not) land in eight different bank groups.
// B operands come as [n][k] tiles (a weight [N, K]) or, with KN, as [k][n]
// tiles (a weight [K, N], read through the transposing ldmatrix).
#pragma once

#include "attention_common.cuh"
#include "gemm_abi.cuh"

namespace stof {
namespace gemm {

using attn::cp_async_16;
using attn::ldmatrix_x4;
using attn::ldmatrix_x4_trans;
using attn::mma_16816;
using attn::smem_addr;

// The warp grid of a BM x BN tile: kWarpsM x kWarpsN warps, each owning a
// kWarpM x kWarpN piece of kMT 16-row by kNT 8-column mma tiles (kNT even).
template <int BM, int BN, int Warps> struct warp_grid {
    static constexpr int kWarpsM = stof_gemm_warps_m(BM, BN, Warps);
    static_assert(kWarpsM > 0, "no split of WARPS tiles the block into 16x16 warp pieces");
    static constexpr int kWarpsN = Warps / kWarpsM;
    static constexpr int kWarpM = BM / kWarpsM;
    static constexpr int kWarpN = BN / kWarpsN;
    static constexpr int kMT = kWarpM / 16;
    static constexpr int kNT = kWarpN / 8;
};

// Element offset of chunk `chunk` (8 elements) of row `row` in a tile whose
// rows hold kChunks chunks. The chunk index is XORed with a few bits of the
// row so that any 8 consecutive rows at one logical chunk fall in 8
// distinct 16-byte groups of a 128-byte line: rows of 64 bytes (4 chunks)
// pair up in a line and take bits 1..2 of the row, rows of 128 bytes or
// more take bits 0..2.
template <int kChunks> __device__ __forceinline__ int swizzle(int row, int chunk) {
    constexpr int kRowsPerLine = kChunks >= 8 ? 1 : 8 / kChunks;
    constexpr int kMask = (kChunks >= 8 ? 8 : kChunks) - 1;
    return row * (kChunks * 8) + ((chunk ^ ((row / kRowsPerLine) & kMask)) * 8);
}

// Copies the kRows x kCols tile at (row0, col0) of a row-major matrix g
// (row stride `stride` elements) into the swizzled tile s (cp.async, no
// commit). Elements at rows >= row_end or columns >= col_end are
// zero-filled without being read; col_end is a multiple of 8, so a 16-byte
// chunk is wholly in or out.
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void load_tile(T *s, const T *g, long long stride, int row0,
                                          int row_end, int col0, int col_end) {
    static_assert(kCols % 8 == 0, "tile rows are whole 16-byte chunks");
    constexpr int kChunks = kCols / 8;
    constexpr int kTotal = kRows * kChunks;
#pragma unroll
    for (int i = 0; i < (kTotal + kThreads - 1) / kThreads; ++i) {
        const int c = threadIdx.x + i * kThreads;
        if (kTotal % kThreads != 0 && c >= kTotal)
            break;
        const int row = c / kChunks, ch = c % kChunks;
        const int gr = row0 + row, gc = col0 + ch * 8;
        const bool ok = gr < row_end && gc < col_end;
        const T *src = ok ? g + (long long)gr * stride + gc : g;
        cp_async_16(s + swizzle<kChunks>(row, ch), src, ok);
    }
}

// Two 8x8 b16 matrices (lanes 0-15 give the row addresses; the others'
// must still be valid shared addresses).
__device__ __forceinline__ void ldmatrix_x2(unsigned (&r)[2], const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(smem)));
}

__device__ __forceinline__ void ldmatrix_x2_trans(unsigned (&r)[2], const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(smem)));
}

// A fragments of kMT 16-row tiles from row wm0 at k step ks of an A tile
// whose rows hold kChunks chunks.
template <int kMT, int kChunks, typename T>
__device__ __forceinline__ void load_a(unsigned (&fa)[kMT][4], const T *sa, int wm0, int ks,
                                       int lane) {
    // lanes 0-15: rows 0-15 at k 0-7; lanes 16-31: rows 0-15 at k 8-15
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
        ldmatrix_x4(fa[mt], sa + swizzle<kChunks>(wm0 + mt * 16 + (lane & 15),
                                                  ks * 2 + (lane >> 4)));
}

// B fragments fb[nt][0..1] of kNT 8-column tiles from column wn0 at k step
// ks. KN = false: an [n][k] tile with rows of kChunks chunks (of k); KN =
// true: a [k][n] tile with rows of kChunks chunks (of n). Pairs of column
// tiles come from one ldmatrix_x4; an odd last one from an ldmatrix_x2.
template <int kNT, int kChunks, bool KN, typename T>
__device__ __forceinline__ void load_b(unsigned (&fb)[kNT][2], const T *sb, int wn0, int ks,
                                       int lane) {
#pragma unroll
    for (int np = 0; np < kNT / 2; ++np) {
        unsigned r[4];
        if constexpr (KN) {
            // [k][n] tile, transposed: matrices (k 0-7, n 0-7), (k 8-15, n 0-7),
            // (k 0-7, n 8-15), (k 8-15, n 8-15)
            ldmatrix_x4_trans(r, sb + swizzle<kChunks>(ks * 16 + (lane & 15),
                                                       (wn0 + np * 16) / 8 + (lane >> 4)));
        } else {
            // [n][k] tile: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
            // (n 8-15, k 8-15)
            ldmatrix_x4(r, sb + swizzle<kChunks>(wn0 + np * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                 ks * 2 + ((lane >> 3) & 1)));
        }
        fb[2 * np][0] = r[0];
        fb[2 * np][1] = r[1];
        fb[2 * np + 1][0] = r[2];
        fb[2 * np + 1][1] = r[3];
    }
    if constexpr (kNT % 2 != 0) {
        constexpr int nt = kNT - 1;
        unsigned r[2];
        if constexpr (KN)
            ldmatrix_x2_trans(r, sb + swizzle<kChunks>(ks * 16 + (lane & 15), (wn0 + nt * 8) / 8));
        else
            ldmatrix_x2(r, sb + swizzle<kChunks>(wn0 + nt * 8 + (lane & 7),
                                                 ks * 2 + ((lane >> 3) & 1)));
        fb[nt][0] = r[0];
        fb[nt][1] = r[1];
    }
}

// One slice of kKSteps 16-deep k steps into a warp's accumulators: A from an
// [m][k] tile with rows of kAChunks chunks, B as load_b reads it.
template <int kMT, int kNT, int kKSteps, int kAChunks, int kBChunks, bool KN, typename T>
__device__ __forceinline__ void mma_tile(float (&acc)[kMT][kNT][4], const T *sa, const T *sb,
                                         int wm0, int wn0, int lane) {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
        unsigned fa[kMT][4], fb[kNT][2];
        load_a<kMT, kAChunks>(fa, sa, wm0, ks, lane);
        load_b<kNT, kBChunks, KN>(fb, sb, wn0, ks, lane);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt)
                mma_16816<T>(acc[mt][nt], fa[mt], fb[nt][0], fb[nt][1]);
    }
}

template <int kMT, int kNT> __device__ __forceinline__ void zero_acc(float (&acc)[kMT][kNT][4]) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i)
                acc[mt][nt][i] = 0.0f;
}

}  // namespace gemm
}  // namespace stof
