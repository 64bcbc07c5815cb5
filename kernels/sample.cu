// The index of the largest value of each row of logits [rows, vocab] (the first of equal
// ones, as the host's greedy choice): a decode step's greedy tokens without copying the logits
// back. Grid (rows), THREADS threads: each takes a strided slice of its row, then the warps
// and the block reduce (value, index) pairs.
#include "common.cuh"

#ifndef STOF_DTYPE
#define STOF_DTYPE 1
#endif
#ifndef THREADS
#define THREADS 256
#endif

using elem_t = typename stof::dtype_of<STOF_DTYPE>::type;

// Whether (v, i) goes before (w, j): the larger value, then the smaller index.
__device__ __forceinline__ bool better(float v, long long i, float w, long long j) {
    return v > w || (v == w && i < j);
}

extern "C" __global__ void __launch_bounds__(THREADS)
stof_argmax_rows(const elem_t *x, long long vocab, int *out) {
    stof::grid_dependency_begin(); // a programmatic dependent launch: before any read
    __shared__ float s_val[THREADS / 32];
    __shared__ long long s_idx[THREADS / 32];
    const elem_t *row = x + (long long)blockIdx.x * vocab;
    float best = __int_as_float(0xff800000u); // -inf
    long long idx = vocab;                     // none yet
    for (long long v = threadIdx.x; v < vocab; v += THREADS) {
        const float f = stof::to_float(row[v]);
        if (better(f, v, best, idx))
            best = f, idx = v;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, best, o);
        const long long j = __shfl_xor_sync(0xffffffffu, idx, o);
        if (better(w, j, best, idx))
            best = w, idx = j;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        s_val[warp] = best;
        s_idx[warp] = idx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < THREADS / 32; ++w)
            if (better(s_val[w], s_idx[w], best, idx))
                best = s_val[w], idx = s_idx[w];
        out[blockIdx.x] = idx < vocab ? (int)idx : 0; // no value above -inf: token 0
    }
}
