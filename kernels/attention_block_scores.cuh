// S = Q K^T of the block-wise attention kernel: warpgroup MMAs (wgmma build)
// or mma.sync. (After attention_block_loads.cuh.)
// Part of attention_block.cu, which includes it after the parts it names;
// it uses that kernel's build constants (attention_block_config.cuh).
#ifndef STOF_KERNELS_ATTENTION_BLOCK_SCORES_CUH
#define STOF_KERNELS_ATTENTION_BLOCK_SCORES_CUH

// ---- S = Q K^T -------------------------------------------------------------------

#if WGMMA
// The warpgroup's 64 rows of Q times the stage's BLOCK_N keys: HEAD_DIM / 16
// products into S, both operands K-major in shared memory. Issued and
// committed as one group, not waited for (the loop does: wg_wait, then
// keep_s before S is read).
__device__ __forceinline__ void issue_scores(float (&s)[kMT][kNT][4], const elem_t *sQ,
                                             const elem_t *sK, const warp_pos &w) {
    float(&d)[BLOCK_N / 2] = reinterpret_cast<float(&)[BLOCK_N / 2]>(s[0]);
    const elem_t *qa = sQ + (w.warp / 4) * 64 * HEAD_DIM;  // the warpgroup's row groups
#pragma unroll
    for (int kd = 0; kd < kKD; ++kd) {
        if (kSwizzle) {
            // 16 head-dim columns: 32 bytes into the rows of atom column kd / 4
            constexpr unsigned kSbo = 1024 * (HEAD_DIM / 64);  // 8-row step
            const int off = (kd >> 2) * 512 + (kd & 3) * 16;
            stof::wg::wg_mma<BLOCK_N>::ss(d, stof::wg::desc_sw128(qa + off, 16, kSbo),
                                          stof::wg::desc_sw128(sK + off, 16, kSbo), kd > 0);
        } else {
            // 16 head-dim columns = 2 core matrices = 128 elements
            constexpr unsigned kLbo = 128, kSbo = 16 * HEAD_DIM;
            stof::wg::wg_mma<BLOCK_N>::ss(d, stof::wg::desc(qa + kd * 128, kLbo, kSbo),
                                          stof::wg::desc(sK + kd * 128, kLbo, kSbo), kd > 0);
        }
    }
    stof::wg::commit();
}

__device__ __forceinline__ void keep_s(float (&s)[kMT][kNT][4]) {
    stof::wg::wg_mma<BLOCK_N>::keep(reinterpret_cast<float(&)[BLOCK_N / 2]>(s[0]));
}
#else
__device__ __forceinline__ void compute_scores(float (&s)[kMT][kNT][4],
                                               const unsigned (&qf)[kMT][kKD][4],
                                               const elem_t *sQ, const kv_view &k,
                                               const warp_pos &w) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
    for (int kd = 0; kd < kKD; ++kd) {
        unsigned a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
            if (kKeepQ) {
#pragma unroll
                for (int e = 0; e < 4; ++e) a[mt][e] = qf[mt][kd][e];
            } else {
                load_q_frag(a[mt], sQ, w, mt, kd);
            }
        }
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
            unsigned b[4];
            ldmatrix_x4_s(b, k_frag(k, w, kd, np));
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
                mma_16816<elem_t>(s[mt][2 * np], a[mt], b[0], b[1]);
                mma_16816<elem_t>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }
}
#endif

#endif  // STOF_KERNELS_ATTENTION_BLOCK_SCORES_CUH
