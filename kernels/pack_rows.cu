// Rows gathered by an index, for padding-free runs (core/exec/exec_pack.c): a packed batch's
// rows from their padded (batch, position), and its int32 inputs packed.
//
//   gather:  out[r] = idx[r] >= 0 ? in[idx[r]] : zeros     for r < rows
//
// Rows of `units` units of UNIT bytes (16: rows of 8 fp16/bf16 values, 4: an int32 or
// rows of an even count of values), one unit a thread in the grid-stride loop of the memory
// kernels (THREADS threads a block), so that consecutive threads copy consecutive pieces of
// one row. Bytes only: the dtype does not matter.
#include "grid_stride.cuh"

template <typename U>
__device__ __forceinline__ void gather_rows(U *out, const U *in, const int *idx, long long rows,
                                            int units) {
    stof::grid_dependency_begin();  // before any read (common.cuh)
    STOF_GRID_STRIDE(i, rows * units) {
        const long long r = i / units;
        const int u = (int)(i - r * units);
        const int from = __ldg(idx + r);
        U v{};
        if (from >= 0)
            v = in[(long long)from * units + u];
        out[i] = v;
    }
}

extern "C" __global__ void stof_rows_gather16(uint4 *out, const uint4 *in, const int *idx,
                                              long long rows, int units) {
    gather_rows(out, in, idx, rows, units);
}

extern "C" __global__ void stof_rows_gather4(unsigned *out, const unsigned *in, const int *idx,
                                             long long rows, int units) {
    gather_rows(out, in, idx, rows, units);
}
