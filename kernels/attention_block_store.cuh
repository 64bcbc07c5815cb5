// The block-wise attention kernel's outputs: O / l to global memory, and in
// split builds a slice's partial O and (m, l). (After attention_block_loads.cuh.)
// Part of attention_block.cu, which includes it after the parts it names;
// it uses that kernel's build constants (attention_block_config.cuh).
#ifndef STOF_KERNELS_ATTENTION_BLOCK_STORE_CUH
#define STOF_KERNELS_ATTENTION_BLOCK_STORE_CUH

// ---- O / l -> global -----------------------------------------------------------------

// A row's l over the four threads that hold its columns.
__device__ __forceinline__ float row_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Normalizes the warp's rows, stages them in the warp's own rows of the Q
// tile and writes them out with 16-byte stores. A row with no allowed key
// (l == 0) and a padded row (live_rows on) write exact zeros.
__device__ __forceinline__ void store_output(const float (&o)[kMT][kDT][4], float (&l)[kMT][2],
                                             elem_t *sO, elem_t *out, long long out_stride,
                                             int valid_rows, int live_rows, const warp_pos &w) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float sum = row_sum(l[mt][half]);
            const int r = w.row0 + mt * 16 + w.g + half * 8;
            const bool empty = !(sum > 0.0f) || r >= live_rows;
            const float inv = empty ? 0.0f : 1.0f / sum;
#pragma unroll
            for (int dt = 0; dt < kDT; ++dt) {
                const float x = empty ? 0.0f : o[mt][dt][half * 2] * inv;
                const float y = empty ? 0.0f : o[mt][dt][half * 2 + 1] * inv;
                *reinterpret_cast<unsigned *>(sO + tile_off(r, dt * 8 + 2 * w.t)) =
                    pack2<elem_t>(x, y);
            }
        }
    }
    __syncwarp();
#pragma unroll 2
    for (int idx = w.lane; idx < kWarpRows * kDT; idx += 32) {
        const int r = w.row0 + idx / kDT, c = idx % kDT;
        if (r < valid_rows)
            *reinterpret_cast<uint4 *>(out + r * out_stride + c * 8) =
                *reinterpret_cast<const uint4 *>(sO + tile_off(r, c * 8));
    }
}

#if LSE
// Each valid row's log-sum-exp, base 2, of its scaled scores: m c + log2(l)
// (l reduced over the row's four threads as store_output does), -inf for a
// row with no allowed key.
__device__ __forceinline__ void store_lse(const float (&m)[kMT][2], const float (&l)[kMT][2],
                                          float *lse, int valid_rows, const warp_pos &w,
                                          float c) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float sum = row_sum(l[mt][half]);
            const int r = w.row0 + mt * 16 + w.g + half * 8;
            if (w.t == 0 && r < valid_rows)
                lse[r] = sum > 0.0f ? m[mt][half] * c + log2f(sum) : STOF_NEG_INF;
        }
    }
}
#endif

#if SPLIT
// ---- split rows: partials and their combination ---------------------------------------

// The workspace unit of (slot, batch, head): see attention_abi.cuh.
__device__ __forceinline__ long long partial_unit(const stof_attn_args &a, int slot, int b,
                                                  int h) {
    const long long per_batch = a.fmt_batch == 1 ? a.n_slots : 0;
    return ((long long)b * per_batch + slot) * a.heads + h;
}

// A slice of a block row: O unnormalized (fp32, relative to the row's
// maximum m) and the rows' m and l, straight from the fragments. Every
// BLOCK_M row is written (rows past q_len hold finite junk the combine
// never reads); a row that saw no allowed key has m = -inf, l = 0, O = 0.
__device__ __forceinline__ void store_partial(const float (&o)[kMT][kDT][4],
                                              const float (&m)[kMT][2], const float (&l)[kMT][2],
                                              float *po, float *pml, const warp_pos &w, float c) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float sum = row_sum(l[mt][half]);
            const int r = w.row0 + mt * 16 + w.g + half * 8;
#pragma unroll
            for (int dt = 0; dt < kDT; ++dt)
                *reinterpret_cast<float2 *>(po + r * HEAD_DIM + dt * 8 + 2 * w.t) =
                    make_float2(o[mt][dt][half * 2], o[mt][dt][half * 2 + 1]);
            if (w.t == 0)
                *reinterpret_cast<float2 *>(pml + 2 * r) = make_float2(m[mt][half] * c, sum);
        }
    }
}

#endif

#endif  // STOF_KERNELS_ATTENTION_BLOCK_STORE_CUH
