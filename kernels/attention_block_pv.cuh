// O += P V of the block-wise attention kernel: warpgroup MMAs with P from
// registers (wgmma build) or mma.sync. (After attention_block_loads.cuh.)
// Part of attention_block.cu, which includes it after the parts it names;
// it uses that kernel's build constants (attention_block_config.cuh).
#ifndef STOF_KERNELS_ATTENTION_BLOCK_PV_CUH
#define STOF_KERNELS_ATTENTION_BLOCK_PV_CUH

// ---- O += P V -----------------------------------------------------------------------

#if WGMMA
// P (fp32 C fragments) as the A fragments of P V, in the dtype.
__device__ __forceinline__ void pack_p(const float (&p)[kMT][kNT][4], unsigned (&a)[kKN][4]) {
#pragma unroll
    for (int kn = 0; kn < kKN; ++kn) {
        a[kn][0] = pack2<elem_t>(p[0][2 * kn][0], p[0][2 * kn][1]);
        a[kn][1] = pack2<elem_t>(p[0][2 * kn][2], p[0][2 * kn][3]);
        a[kn][2] = pack2<elem_t>(p[0][2 * kn + 1][0], p[0][2 * kn + 1][1]);
        a[kn][3] = pack2<elem_t>(p[0][2 * kn + 1][2], p[0][2 * kn + 1][3]);
    }
}

// O += P V for the warpgroup: P from registers, V MN-major from shared
// memory, BLOCK_N / 16 products, committed as one group and not waited for:
// O and the P fragments stay untouched until wg_wait, then keep_pv.
__device__ __forceinline__ void issue_pv(float (&o)[kMT][kDT][4], const unsigned (&a)[kKN][4],
                                         const elem_t *sV) {
    float(&d)[HEAD_DIM / 2] = reinterpret_cast<float(&)[HEAD_DIM / 2]>(o[0]);
#pragma unroll
    for (int kn = 0; kn < kKN; ++kn) {  // 16 keys = 2 row groups = 16 HEAD_DIM elements
        const elem_t *vk = sV + kn * 16 * HEAD_DIM;
        // MN-major: swizzled, LBO steps along N (64-column atoms) and SBO
        // along K (8 keys); unswizzled, the other way round
        const unsigned long long db =
            kSwizzle ? stof::wg::desc_sw128(vk, 1024, 1024 * (HEAD_DIM / 64))
                     : stof::wg::desc(vk, 16 * HEAD_DIM, 128);
        stof::wg::wg_mma<HEAD_DIM>::rs_tb(d, a[kn], db, 1);
    }
    stof::wg::commit();
}

__device__ __forceinline__ void keep_pv(float (&o)[kMT][kDT][4], unsigned (&a)[kKN][4]) {
    stof::wg::wg_mma<HEAD_DIM>::keep(reinterpret_cast<float(&)[HEAD_DIM / 2]>(o[0]));
#pragma unroll
    for (int kn = 0; kn < kKN; ++kn)
#pragma unroll
        for (int e = 0; e < 4; ++e) stof::wg::keep(a[kn][e]);
}
#else
__device__ __forceinline__ void compute_pv(float (&o)[kMT][kDT][4], const float (&p)[kMT][kNT][4],
                                           const kv_view &v, const warp_pos &w) {
#pragma unroll
    for (int kn = 0; kn < kKN; ++kn) {
        // P's C fragments of n tiles 2kn, 2kn+1 are the A fragment of k step kn
        unsigned a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
            a[mt][0] = pack2<elem_t>(p[mt][2 * kn][0], p[mt][2 * kn][1]);
            a[mt][1] = pack2<elem_t>(p[mt][2 * kn][2], p[mt][2 * kn][3]);
            a[mt][2] = pack2<elem_t>(p[mt][2 * kn + 1][0], p[mt][2 * kn + 1][1]);
            a[mt][3] = pack2<elem_t>(p[mt][2 * kn + 1][2], p[mt][2 * kn + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < kDT / 2; ++dp) {
            unsigned b[4];
            ldmatrix_x4_trans_s(b, v_frag(v, w, kn, dp));
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
                mma_16816<elem_t>(o[mt][2 * dp], a[mt], b[0], b[1]);
                mma_16816<elem_t>(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
            }
        }
    }
}
#endif

#endif  // STOF_KERNELS_ATTENTION_BLOCK_PV_CUH
