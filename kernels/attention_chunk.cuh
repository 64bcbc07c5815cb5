// The row-wise pieces of an attention kernel that walks one query row with
// one warp, 32 keys a chunk (attention_row.cu, attention_global.cu): the
// query row in shared memory as fp32, one key's score, the online softmax
// of a chunk (base 2), p . V into the lane's pairs of output dims, and the
// normalized row out. The including file defines elem_t, HEAD_DIM, kPairs
// (HEAD_DIM / 2) and kPairRounds (pairs a lane owns, ceil(kPairs / 32)).
#ifndef STOF_KERNELS_ATTENTION_CHUNK_CUH
#define STOF_KERNELS_ATTENTION_CHUNK_CUH

// The query row, fp32, into the warp's shared slice.
__device__ __forceinline__ void load_query(float *sq, const elem_t *q, int lane) {
    for (int p = lane; p < kPairs; p += 32) {
        const float2 x = unpack2<elem_t>(*reinterpret_cast<const unsigned *>(q + 2 * p));
        sq[2 * p] = x.x;
        sq[2 * p + 1] = x.y;
    }
    __syncwarp();
}

// q . k for one key row: 16-byte loads of K, q broadcast from shared memory.
__device__ __forceinline__ float dot_row(const float *sq, const elem_t *krow) {
    float acc[1] = {0.0f};
    dot_key<elem_t, HEAD_DIM, 1>(sq, krow, acc);
    return acc[0];
}

// Online softmax over one chunk: returns p for the lane's key and rescales
// the running sum and the output accumulators.
__device__ __forceinline__ float chunk_softmax(float s, float &m, float &l,
                                               float2 (&acc)[kPairRounds]) {
    const float m_new = fmaxf(m, stof::warp_max(s));
    const float ref = softmax_ref(m_new);
    const float alpha = exp2f(m - ref);
    const float p = exp2f(s - ref);
    m = m_new;
    l = l * alpha + stof::warp_sum(p);
#pragma unroll
    for (int r = 0; r < kPairRounds; ++r) {
        acc[r].x *= alpha;
        acc[r].y *= alpha;
    }
    return p;
}

// acc += sum over the chunk's n keys of p_j v_j; lane owns pairs lane + 32 r.
__device__ __forceinline__ void chunk_pv(float2 (&acc)[kPairRounds], const elem_t *v,
                                         long long v_stride, float p, int col, int n, int lane) {
#pragma unroll 4
    for (int jj = 0; jj < n; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
        const int cj = __shfl_sync(0xffffffffu, col, jj);
        const elem_t *vrow = v + cj * v_stride;
#pragma unroll
        for (int r = 0; r < kPairRounds; ++r) {
            const int pair = lane + 32 * r;
            if (pair < kPairs) {
                const float2 x =
                    unpack2<elem_t>(__ldg(reinterpret_cast<const unsigned *>(vrow + 2 * pair)));
                acc[r].x = fmaf(pj, x.x, acc[r].x);
                acc[r].y = fmaf(pj, x.y, acc[r].y);
            }
        }
    }
}

// O / l to the row's output; a row with no allowed key (l == 0) writes zeros.
__device__ __forceinline__ void store_row(elem_t *out, const float2 (&acc)[kPairRounds], float l,
                                          int lane) {
    const bool empty = !(l > 0.0f);
    const float inv = empty ? 0.0f : 1.0f / l;
#pragma unroll
    for (int r = 0; r < kPairRounds; ++r) {
        const int pair = lane + 32 * r;
        if (pair < kPairs) {
            const float x = empty ? 0.0f : acc[r].x * inv;
            const float y = empty ? 0.0f : acc[r].y * inv;
            *reinterpret_cast<unsigned *>(out + 2 * pair) = pack2<elem_t>(x, y);
        }
    }
}

#endif  // STOF_KERNELS_ATTENTION_CHUNK_CUH
