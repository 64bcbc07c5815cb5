// The gated unit of GeGLU / SwiGLU MLPs: y[r, j] = act(x[r, j]) * x[r, f + j],
// the first half of each row the input, the second the gate (as Hugging
// Face chunks the up-projection's output).
//
// The output is rows x (f / VEC) chunks of VEC elements, one chunk a thread
// in a grid-stride loop over that flat index space; consecutive threads take
// consecutive chunks of a row, so both halves are read coalesced.
#include "grid_stride.cuh"

#ifndef ACT
#define ACT STOF_ACT_GELU
#endif

static_assert(ACT == STOF_ACT_GELU || ACT == STOF_ACT_GELU_TANH || ACT == STOF_ACT_SILU,
              "ACT: gelu, gelu tanh or silu");

extern "C" __global__ void __launch_bounds__(THREADS) stof_glu(const stof_glu_args a) {
    stof::grid_dependency_begin();  // before any read (common.cuh)
    static_assert(sizeof(stof_glu_args) == STOF_GLU_ARGS_BYTES, "ABI mismatch");
    const int chunks = a.f / VEC;
    const long long total = a.rows * chunks;
    const elem_t *x = static_cast<const elem_t *>(a.x);
    elem_t *y = static_cast<elem_t *>(a.y);
    STOF_GRID_STRIDE(idx, total) {
        const long long r = idx / chunks;
        const int col = (int)(idx - r * chunks) * VEC;
        float in[VEC], gate[VEC];
        stof::load_chunk(in, x + r * 2 * a.f + col);
        stof::load_chunk(gate, x + r * 2 * a.f + a.f + col);
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            in[e] = stof_activate<ACT>(in[e]) * gate[e];
        stof::store_chunk(y + r * a.f + col, in);
    }
}
