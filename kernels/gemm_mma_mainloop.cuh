// gemm_epilogue's mma.sync main loop pieces: a K slice of x and w copied
// into a stage of the ring (cp.async), one stage's slice multiplied into
// the warp's accumulators (mma.sync), and the L2 prefetch of the weight
// the first row tile issues before the grid dependency wait.
//
// Included by gemm_epilogue.cu only, after its parameters (BLOCK_M, ...,
// -D constants), elem_t and the tile constants it defines: the pieces
// read them as the kernel's own.
#ifndef STOF_KERNELS_GEMM_MMA_MAINLOOP_CUH
#define STOF_KERNELS_GEMM_MMA_MAINLOOP_CUH

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

#endif
