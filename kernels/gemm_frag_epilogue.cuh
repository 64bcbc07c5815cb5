// gemm_epilogue's epilogue on accumulator fragments in the mma.sync C
// layout: + bias, the activation, + residual, rounded to the model dtype
// and stored as pairs. The wgmma build's accumulators have that layout
// too, so its split-K path runs the same code.
//
// Included by gemm_epilogue.cu only, after its parameters (BLOCK_M, ...,
// -D constants), elem_t and the tile constants it defines: the pieces
// read them as the kernel's own.
#ifndef STOF_KERNELS_GEMM_FRAG_EPILOGUE_CUH
#define STOF_KERNELS_GEMM_FRAG_EPILOGUE_CUH

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

#endif
