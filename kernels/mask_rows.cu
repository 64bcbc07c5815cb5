// Zeros at padded positions: y[r, :] = mask[r] != 0 ? x[r, :] : 0, r a
// (batch, position) of an attention_mask [B, S] (1 = token, 0 = padding).
// Rows of n elements, rows x (n / VEC) chunks, one chunk a thread in a
// grid-stride loop; a padded row is written without reading x.
#include "grid_stride.cuh"

extern "C" __global__ void __launch_bounds__(THREADS) stof_mask_rows(const stof_mask_rows_args a) {
    stof::grid_dependency_begin();  // before any read (common.cuh)
    static_assert(sizeof(stof_mask_rows_args) == STOF_MASK_ROWS_ARGS_BYTES, "ABI mismatch");
    const int chunks = a.n / VEC;
    const long long total = a.rows * chunks;
    const elem_t *x = static_cast<const elem_t *>(a.x);
    elem_t *y = static_cast<elem_t *>(a.y);
    STOF_GRID_STRIDE(idx, total) {
        const long long r = idx / chunks;
        const long long at = r * a.n + (idx - r * chunks) * VEC;
        float v[VEC];
        if (__ldg(a.mask + r) != 0) {
            stof::load_chunk(v, x + at);
        } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) v[e] = 0.0f;
        }
        stof::store_chunk(y + at, v);
    }
}
