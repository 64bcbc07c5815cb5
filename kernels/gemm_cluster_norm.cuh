// gemm_epilogue's closing row norm (wgmma build, NORM): the rows'
// statistics merged over a cluster that holds whole rows, then the norm
// applied in the epilogue.
//
// Included by gemm_epilogue.cu only, after its parameters (BLOCK_M, ...,
// -D constants), elem_t and the tile constants it defines: the pieces
// read them as the kernel's own.
#ifndef STOF_KERNELS_GEMM_CLUSTER_NORM_CUH
#define STOF_KERNELS_GEMM_CLUSTER_NORM_CUH

#if NORM
// ---- a row norm over the cluster -----------------------------------------------------
//
// After the split's reduction each block owns kOwnCols = BLOCK_N / SPLIT_K
// columns of its rows, wholly summed: in a thread, the column tiles nt0 ..
// nt0 + kShare - 1 of its warpgroup's accumulator at rows g and g + 8 of
// its warp's 16. The block turns them into s (bias, activation, residual)
// in place, then takes per row the mean of its columns and the sum of the
// squared deviations from that mean (two passes over registers: no
// cancellation), shares the pair in shared memory and, after a cluster
// barrier, merges the pairs of all kBlocks blocks (Chan, Golub and LeVeque;
// every block owns as many columns: mean = the mean of the means, M2 =
// sum M2_b + kOwnCols sum (mean_b - mean)^2) into the row's statistics.
// RMSNorm takes the sum of squares about 0 the same way. The caller's last
// cluster barrier keeps the pairs alive until every block has read them.
static_assert(NORM == STOF_NORM_LAYERNORM || NORM == STOF_NORM_RMSNORM, "NORM is 1 or 2");
constexpr int kBlocks = SPLIT_K * NORM_TILES;  // a cluster: whole rows
constexpr int kWgN = WARPS / 4 / kWgM;         // warpgroups along N
constexpr int kOwnCols = BLOCK_N / SPLIT_K;
static_assert(BLOCK_M <= 128 && kWgN <= 2, "the statistics' arrays (STOF_GEMM_NORM_SMEM)");

// 2 floats at the same shared-memory offset in block `rank` of the cluster.
__device__ __forceinline__ float2 ld_cluster2(const float2 *local, unsigned rank) {
    const unsigned remote = cluster_addr(local, rank);
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];"
                 : "=f"(v.x), "=f"(v.y)
                 : "r"(remote)
                 : "memory");
    return v;
}

// v[h]: a thread's partial sums of rows r and r + 8 (block-local); returns
// in v the block's sums: over the quad of lanes sharing the rows, then over
// the warpgroups along N through red ([kWgN][BLOCK_M]).
__device__ __forceinline__ void block_row_sums(float (&v)[2], float (*red)[BLOCK_M], int wg_n,
                                               int r, int lane) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        v[h] += __shfl_xor_sync(0xffffffffu, v[h], 1);
        v[h] += __shfl_xor_sync(0xffffffffu, v[h], 2);
    }
    if ((lane & 3) == 0) {
        red[wg_n][r] = v[0];
        red[wg_n][r + 8] = v[1];
    }
    compute_sync();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kWgN; ++w)
            sum += red[w][r + 8 * h];
        v[h] = sum;
    }
}

// The epilogue with the norm: d's tiles nt0 .. nt0 + kShare - 1 at rows
// row0 + g (+ 8) (block-local r0 + g) and columns col0 + 8 j + 2 t (+ 1).
__device__ __forceinline__ void norm_epilogue(const stof_gemm_args &a, float (&d)[kWgCols / 2],
                                              int row0, int col0, int r0, int wg_n, int lane,
                                              int nt0) {
    __shared__ float red[2][kWgN][BLOCK_M];
    __shared__ float2 stat[BLOCK_M];
    constexpr int kShare = kWgCols / 8 / SPLIT_K;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < kWgCols / 8; ++j) {
        if (j < nt0 || j >= nt0 + kShare)
            continue;
        const int col = col0 + j * 8 + 2 * t;
        const float2 b = bias_pair(a, col);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + g + 8 * h;
            const float2 v =
                epilogue_pair(d[4 * j + 2 * h], d[4 * j + 2 * h + 1], b,
                              row < a.m ? row_at(a.residual, a.r_row_stride, row, col) : nullptr);
            d[4 * j + 2 * h] = v.x;
            d[4 * j + 2 * h + 1] = v.y;
#if STORE_PRE_NORM
            if (row < a.m)
                *reinterpret_cast<unsigned *>(static_cast<elem_t *>(a.pre_norm) +
                                              (long long)row * a.p_row_stride + col) =
                    pack2<elem_t>(v.x, v.y);
#endif
        }
    }
    float mean_b[2] = {0.0f, 0.0f};
#if NORM == STOF_NORM_LAYERNORM
#pragma unroll
    for (int j = 0; j < kWgCols / 8; ++j)
        if (j >= nt0 && j < nt0 + kShare)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                mean_b[h] += d[4 * j + 2 * h] + d[4 * j + 2 * h + 1];
    block_row_sums(mean_b, red[0], wg_n, r0 + g, lane);
    mean_b[0] *= 1.0f / kOwnCols;
    mean_b[1] *= 1.0f / kOwnCols;
#endif
    float sq[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kWgCols / 8; ++j)
        if (j >= nt0 && j < nt0 + kShare)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float dx = d[4 * j + e] - mean_b[e >> 1];
                sq[e >> 1] += dx * dx;
            }
    block_row_sums(sq, red[1], wg_n, r0 + g, lane);
    if (wg_n == 0 && t == 0) {
        stat[r0 + g] = make_float2(mean_b[0], sq[0]);
        stat[r0 + g + 8] = make_float2(mean_b[1], sq[1]);
    }
    cluster_sync();
    float mean[2], rstd[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float2 st[kBlocks];
        float sum = 0.0f;
#pragma unroll
        for (int q = 0; q < kBlocks; ++q) {
            st[q] = ld_cluster2(stat + r0 + g + 8 * h, q);
            sum += st[q].x;
        }
        const float mu = sum * (1.0f / kBlocks);
        float m2 = 0.0f;
#pragma unroll
        for (int q = 0; q < kBlocks; ++q) {
            const float dm = st[q].x - mu;
            m2 += st[q].y + kOwnCols * dm * dm;
        }
        mean[h] = mu;
        rstd[h] = rsqrtf(m2 * (1.0f / (NORM_TILES * BLOCK_N)) + a.eps);
    }
#pragma unroll
    for (int j = 0; j < kWgCols / 8; ++j) {
        if (j < nt0 || j >= nt0 + kShare)
            continue;
        const int col = col0 + j * 8 + 2 * t;
        const float2 gm = load_pair(a.gamma, col);
        float2 bt = make_float2(0.0f, 0.0f);
#if NORM == STOF_NORM_LAYERNORM
        bt = load_pair(a.beta, col);
#endif
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = row0 + g + 8 * h;
            if (row >= a.m)
                continue;
            const float y0 = (d[4 * j + 2 * h] - mean[h]) * rstd[h] * gm.x + bt.x;
            const float y1 = (d[4 * j + 2 * h + 1] - mean[h]) * rstd[h] * gm.y + bt.y;
            *reinterpret_cast<unsigned *>(static_cast<elem_t *>(a.y) +
                                          (long long)row * a.y_row_stride + col) =
                pack2<elem_t>(y0, y1);
        }
    }
}
#endif

#endif
