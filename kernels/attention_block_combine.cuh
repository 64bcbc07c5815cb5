// The combine kernel of split block rows (SPLIT=1 builds): merges the
// slices' partial O and (m, l) of each split row into O. (Last in
// attention_block.cu.)
// Part of attention_block.cu, which includes it after the parts it names;
// it uses that kernel's build constants (attention_block_config.cuh).
#ifndef STOF_KERNELS_ATTENTION_BLOCK_COMBINE_CUH
#define STOF_KERNELS_ATTENTION_BLOCK_COMBINE_CUH

#if SPLIT
// ---- the combine kernel ------------------------------------------------------------------
//
// Grid (split rows, heads, batch), STOF_ATTN_COMBINE_THREADS threads. For
// each valid row of the split block row and each 8-dim chunk of it (one
// thread a (row, chunk) at a time):
//   M = max_s m_s;  w_s = exp2(m_s - M) (0 for a slice with no allowed key)
//   O = sum_s w_s O_s / sum_s w_s l_s   (zeros when that sum is 0)
// and one 16-byte store of the 8 output elements.
constexpr int kCombineThreads = STOF_ATTN_COMBINE_THREADS;

extern "C" __global__ void __launch_bounds__(kCombineThreads)
stof_attention_combine(const stof_attn_args a) {
    stof::grid_dependency_begin();  // before any read (common.cuh)
    const int h = blockIdx.y, b = blockIdx.z;
    const int wb = a.fmt_batch == 1 ? 0 : b;
    const int first = __ldg(a.split_ptr + wb);
    if ((int)blockIdx.x >= __ldg(a.split_ptr + wb + 1) - first) return;
    const int4 sr = __ldg(reinterpret_cast<const int4 *>(a.splits) + first + blockIdx.x);
    const int row_base = sr.x * BLOCK_M, first_slot = sr.y, n_slots = sr.z;
#if PADDING
    // padded rows: zeros in the padded layout, nothing in the ragged one
    const sequence_rows sq_rows = sequence_of(a.seq_start, a.pad_mask, b, a.q_len);
    const int live_rows = sq_rows.len - row_base, seq_first = sq_rows.first;
    const int valid_rows = min(BLOCK_M, a.seq_start ? live_rows : a.q_len - row_base);
#else
    constexpr int live_rows = BLOCK_M, seq_first = 0;
    const int valid_rows = min(BLOCK_M, a.q_len - row_base);
#endif
    elem_t *out = static_cast<elem_t *>(a.o) + b * a.o_batch_stride +
                  (seq_first + row_base) * a.o_row_stride + h * HEAD_DIM;
    const long long u0 = partial_unit(a, first_slot, b, h);
    const long long unit_stride = a.heads;  // consecutive slots: units a.heads apart
    for (int idx = threadIdx.x; idx < valid_rows * kDT; idx += kCombineThreads) {
        const int r = idx / kDT, c = idx % kDT;
        float mx = STOF_NEG_INF;
        for (int s = 0; s < n_slots; ++s)
            mx = fmaxf(mx, a.partial_ml[(u0 + s * unit_stride) * (2 * BLOCK_M) + 2 * r]);
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sum = 0.0f;
        if (mx != STOF_NEG_INF) {
            for (int s = 0; s < n_slots; ++s) {
                const long long u = u0 + s * unit_stride;
                const float2 ml =
                    *reinterpret_cast<const float2 *>(a.partial_ml + u * (2 * BLOCK_M) + 2 * r);
                if (ml.x == STOF_NEG_INF) continue;  // nothing allowed in this slice
                const float wgt = exp2f(ml.x - mx);
                sum += wgt * ml.y;
                const float4 *po = reinterpret_cast<const float4 *>(
                    a.partial_o + u * (BLOCK_M * HEAD_DIM) + r * HEAD_DIM + c * 8);
                const float4 x = po[0], y = po[1];
                const float part[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[e] += wgt * part[e];
            }
        }
#if LSE
        if (c == 0)
            a.lse[((long long)b * a.heads + h) * a.q_len + row_base + r] =
                sum > 0.0f ? mx + log2f(sum) : STOF_NEG_INF;
#endif
        const bool empty = !(sum > 0.0f) || r >= live_rows;  // padded rows: zeros
        const float inv = empty ? 0.0f : 1.0f / sum;
        const uint4 v = make_uint4(pack2<elem_t>(acc[0] * inv, acc[1] * inv),
                                   pack2<elem_t>(acc[2] * inv, acc[3] * inv),
                                   pack2<elem_t>(acc[4] * inv, acc[5] * inv),
                                   pack2<elem_t>(acc[6] * inv, acc[7] * inv));
        *reinterpret_cast<uint4 *>(out + r * a.o_row_stride + c * 8) = v;
    }
}
#endif

#endif  // STOF_KERNELS_ATTENTION_BLOCK_COMBINE_CUH
