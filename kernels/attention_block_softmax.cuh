// The online softmax of the block-wise attention kernel: row maxima and
// sums, P = exp2(S c - m c), the rescale of O. (After attention_block_config.cuh.)
// Part of attention_block.cu, which includes it after the parts it names;
// it uses that kernel's build constants (attention_block_config.cuh).
#ifndef STOF_KERNELS_ATTENTION_BLOCK_SOFTMAX_CUH
#define STOF_KERNELS_ATTENTION_BLOCK_SOFTMAX_CUH

// ---- online softmax -------------------------------------------------------------

// Each thread holds two rows per m tile (g and g + 8), spread over the four
// threads of a quad: the row maximum is reduced across the quad; the row sum
// l stays a per-thread partial sum until the end. S becomes P in place;
// c > 0 is the scale still to apply (see above), m is in score units.
// softmax_step updates m, l and turns S into P; O still has to be scaled
// by alpha (rescale_o) when it returns true: the pipelined wgmma loop does
// that once the previous block's P V has landed in O. It returns false when
// no row of the warp has a new maximum (alpha = 1 for every row): the warp
// skips the rescale, one multiply per accumulator, and the alpha
// exponentials. That is the common case once the rows have seen their
// larger scores, and it changes no result. (Letting m lag behind by up to
// 8 in exp2 units, P <= 256, skipped more, but on an H200 it bought 2% on
// dense 64x64 wgmma tiles for 7% more error against an fp64 reference.)
// Pairwise reductions of n values (x is overwritten): log2(n) dependent
// steps instead of n, which is what the fixed-latency stalls of a 32-key
// block's softmax were made of.

template <int N>
__device__ __forceinline__ float pairwise_max(float (&x)[N]) {
#pragma unroll
    for (int w = 1; w < N; w *= 2)
#pragma unroll
        for (int i = 0; i + w < N; i += 2 * w) x[i] = fmaxf(x[i], x[i + w]);
    return x[0];
}

template <int N>
__device__ __forceinline__ float pairwise_sum(float (&x)[N]) {
#pragma unroll
    for (int w = 1; w < N; w *= 2)
#pragma unroll
        for (int i = 0; i + w < N; i += 2 * w) x[i] += x[i + w];
    return x[0];
}

// The maximum of the thread's scores of row `half` of tile mt.
__device__ __forceinline__ float row_max(const float (&s)[kMT][kNT][4], int mt, int half) {
    float part[kNT];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) part[nt] = fmaxf(s[mt][nt][half * 2], s[mt][nt][half * 2 + 1]);
    return pairwise_max(part);
}

// Row `half` of tile mt: scores to P = exp2(s c + neg_ref); their sum.
__device__ __forceinline__ float row_exp(float (&s)[kMT][kNT][4], int mt, int half, float c,
                                         float neg_ref) {
    float part[kNT];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e)
            s[mt][nt][half * 2 + e] = exp2f(fmaf(s[mt][nt][half * 2 + e], c, neg_ref));
        part[nt] = s[mt][nt][half * 2] + s[mt][nt][half * 2 + 1];
    }
    return pairwise_sum(part);
}

// nmc is -m c per row (0 while the row is empty: see softmax_ref), the
// exponent's offset; it changes only with m, so it is kept, not rebuilt.
__device__ __forceinline__ bool softmax_step(float (&s)[kMT][kNT][4], float (&m)[kMT][2],
                                             float (&l)[kMT][2], float (&nmc)[kMT][2],
                                             float (&alpha_out)[kMT][2], float c) {
    float m_new[kMT][2];
    bool move = false;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float mx = row_max(s, mt, half);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            m_new[mt][half] = fmaxf(m[mt][half], mx);
            move = move || m_new[mt][half] > m[mt][half];
        }
    }
    move = __any_sync(0xffffffffu, move);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float alpha = 1.0f;
            if (move) {
                nmc[mt][half] = -softmax_ref(m_new[mt][half]) * c;
                alpha = exp2f(fmaf(m[mt][half], c, nmc[mt][half]));  // 0 while the row was empty
                m[mt][half] = m_new[mt][half];
            }
            l[mt][half] = l[mt][half] * alpha + row_exp(s, mt, half, c, nmc[mt][half]);
            alpha_out[mt][half] = alpha;
        }
    }
    return move;
}

__device__ __forceinline__ void rescale_o(float (&o)[kMT][kDT][4], const float (&alpha)[kMT][2]) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mt][dt][e] *= alpha[mt][e >> 1];
}

__device__ __forceinline__ void online_softmax(float (&s)[kMT][kNT][4], float (&m)[kMT][2],
                                               float (&l)[kMT][2], float (&nmc)[kMT][2],
                                               float (&o)[kMT][kDT][4], float c) {
    float alpha[kMT][2];
    if (softmax_step(s, m, l, nmc, alpha, c))
        rescale_o(o, alpha);
}

#endif  // STOF_KERNELS_ATTENTION_BLOCK_SOFTMAX_CUH
