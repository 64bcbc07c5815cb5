// gemm_epilogue's persistent wgmma build: the epilogue's stores staged in
// shared memory and copied out by the tensor memory accelerator.
//
// Included by gemm_epilogue.cu only, after its parameters (BLOCK_M, ...,
// -D constants), elem_t and the tile constants it defines: the pieces
// read them as the kernel's own.
#ifndef STOF_KERNELS_GEMM_TMA_STORE_CUH
#define STOF_KERNELS_GEMM_TMA_STORE_CUH

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

#endif
