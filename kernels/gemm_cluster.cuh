// gemm_epilogue's clusters (wgmma build): rank, barrier and distributed
// shared-memory loads, and the split of K's reduction of the blocks'
// partial sums.
//
// Included by gemm_epilogue.cu only, after its parameters (BLOCK_M, ...,
// -D constants), elem_t and the tile constants it defines: the pieces
// read them as the kernel's own.
#ifndef STOF_KERNELS_GEMM_CLUSTER_CUH
#define STOF_KERNELS_GEMM_CLUSTER_CUH

#if SPLIT_K > 1 || NORM
// ---- clusters: split K, whole rows ---------------------------------------------------
//
// With SPLIT_K > 1 the host launches clusters of SPLIT_K consecutive blocks
// along x that share one output tile, block r of a cluster (its rank) taking
// the r-th share of the K slices. Few output tiles (small M) then still
// spread the weight's stream over SPLIT_K times as many SMs, and the partial
// sums meet in distributed shared memory instead of a second kernel: every
// block parks its fp32 accumulators in its own (drained) operand ring, the
// cluster synchronizes, and block r sums every block's partials of the r-th
// share of the warpgroup's column tiles and runs the epilogue on them. A
// last cluster barrier keeps every ring alive until its readers are done.
//
// With NORM a cluster is NORM_TILES such groups, one per column tile of
// the same rows: rank r takes column tile r / SPLIT_K and K share
// r % SPLIT_K, and the cluster holds whole rows for the norm (below).
static_assert((kWgCols / 8) % SPLIT_K == 0, "SPLIT_K divides a warpgroup's column tiles");
static_assert(SPLIT_K == 1 ||
                  BLOCK_M * BLOCK_N * 4 <= STAGES * (kATile + kBTile) * (int)sizeof(elem_t),
              "the partial sums fit the operand ring");
static_assert(SPLIT_K * NORM_TILES <= STOF_GEMM_MAX_CLUSTER, "blocks a cluster");

__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// Every thread of every block of the cluster; orders shared-memory writes
// before the barrier with reads after it, across the cluster.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The address of the same shared-memory offset as `local` in block `rank`
// of the cluster.
__device__ __forceinline__ unsigned cluster_addr(const void *local, unsigned rank) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote)
                 : "r"(smem_addr(local)), "r"(rank));
    return remote;
}

// 4 floats at the same shared-memory offset in block `rank` of the cluster.
__device__ __forceinline__ float4 ld_cluster4(const float4 *local, unsigned rank) {
    const unsigned remote = cluster_addr(local, rank);
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(remote)
                 : "memory");
    return v;
}
#endif

#if SPLIT_K > 1

// Parks d in part (float4 j of thread t at part[j * kThreads + t], so a
// warp's stores are contiguous), then sums the partials of the blocks
// group .. group + SPLIT_K - 1 (this one is group + rank) of this block's
// share of the column tiles into d. Returns that share's first tile.
__device__ __forceinline__ int reduce_cluster(float (&d)[kWgCols / 2], float4 *part,
                                              unsigned rank, unsigned group) {
    constexpr int kTiles = kWgCols / 8, kShare = kTiles / SPLIT_K;
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
        part[j * kThreads + threadIdx.x] =
            make_float4(d[4 * j], d[4 * j + 1], d[4 * j + 2], d[4 * j + 3]);
    cluster_sync();
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
        if (j / kShare != (int)rank)
            continue;
#pragma unroll
        for (int q = 1; q < SPLIT_K; ++q) {
            const float4 v =
                ld_cluster4(part + j * kThreads + threadIdx.x, group + (rank + q) % SPLIT_K);
            d[4 * j] += v.x;
            d[4 * j + 1] += v.y;
            d[4 * j + 2] += v.z;
            d[4 * j + 3] += v.w;
        }
    }
    return (int)rank * kShare;
}
#endif

#endif
