// Device pieces shared by the attention kernels (attention_block.cu,
// attention_row.cu): inline-PTX wrappers for cp.async, ldmatrix and the
// m16n8k16 tensor-core mma, packing fp32 pairs into the model dtype, and the
// T5 relative position bias lookup. Everything works for fp16 and bf16.
#pragma once

#include "common.cuh"
#include "attention_abi.cuh"

namespace stof {
namespace attn {

// log2(e): softmax runs in base 2 (exp2f is one MUFU instruction).
constexpr float kLog2e = 1.4426950408889634f;
// -inf, the score of a masked pair (NVRTC has no <math.h> INFINITY).
#define STOF_NEG_INF __int_as_float(0xff800000u)

__device__ __forceinline__ unsigned smem_addr(const void *p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ---- cp.async (sm_80+) -------------------------------------------------------

// Copies 16 bytes global -> shared without going through registers. When
// valid is false nothing is read and the 16 bytes are zero-filled (src-size
// 0): rows past q_len / k_len come out as zeros. src must still be a legal
// address, so callers pass the tile's base for invalid rows.
__device__ __forceinline__ void cp_async_16(void *smem, const void *gmem, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
                 "l"(gmem), "r"(src_bytes)
                 : "memory");
}

// The same to a shared-window address (smem_addr), for callers that keep
// theirs in registers.
__device__ __forceinline__ void cp_async_16_s(unsigned smem, const void *gmem, bool valid) {
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
                 "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most N committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- ldmatrix ------------------------------------------------------------------

// Four 8x8 b16 matrices; lane l gives the row address (a shared-window
// address, smem_addr) of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4_s(unsigned (&r)[4], unsigned smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem));
}

// The same, each matrix transposed (V tiles as the B operand of P V).
__device__ __forceinline__ void ldmatrix_x4_trans_s(unsigned (&r)[4], unsigned smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem));
}

// The two from generic pointers into shared memory.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void *smem) {
    ldmatrix_x4_s(r, smem_addr(smem));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void *smem) {
    ldmatrix_x4_trans_s(r, smem_addr(smem));
}

// ---- mma.sync m16n8k16, fp32 accumulate --------------------------------------
//
// Fragments (g = lane / 4, t = lane % 4):
//   A 16x16 row-major: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B 16x8 "col":      b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
//   C 16x8:            c0 c1 (g, 2t..2t+1), c2 c3 (g+8, 2t..2t+1)
// A C fragment pair (n tiles 2k, 2k+1) is laid out like an A fragment for
// k step k: that is how P goes from the softmax to P V without shared memory.

template <typename T> struct mma_op;

template <> struct mma_op<__half> {
    static __device__ __forceinline__ void run(float (&c)[4], const unsigned (&a)[4],
                                               unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <> struct mma_op<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float (&c)[4], const unsigned (&a)[4],
                                               unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                          unsigned b1) {
    mma_op<T>::run(c, a, b0, b1);
}

// ---- pairs of elements -----------------------------------------------------------

// Two fp32 values rounded into one 32-bit register of two T (x in the low half).
template <typename T> __device__ __forceinline__ unsigned pack2(float x, float y);
template <> __device__ __forceinline__ unsigned pack2<__half>(float x, float y) {
    __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<unsigned *>(&v);
}
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float x, float y) {
    __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<unsigned *>(&v);
}

// The inverse: one 32-bit register of two T as two floats.
template <typename T> __device__ __forceinline__ float2 unpack2(unsigned u);
template <> __device__ __forceinline__ float2 unpack2<__half>(unsigned u) {
    return __half22float2(*reinterpret_cast<__half2 *>(&u));
}
template <> __device__ __forceinline__ float2 unpack2<__nv_bfloat16>(unsigned u) {
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u));
}

// s[g] += q_g . k over dims 8 vi .. 8 vi + 7 for G query rows (D floats each, consecutive from
// q: shared memory, read as broadcasts), u those dims of a key row.
template <typename T, int D, int G>
__device__ __forceinline__ void dot_key_vec(const float *q, int vi, uint4 u, float (&s)[G]) {
    const unsigned words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float2 x = unpack2<T>(words[e]);
#pragma unroll
        for (int g = 0; g < G; ++g) {
            s[g] = fmaf(q[g * D + vi * 8 + 2 * e], x.x, s[g]);
            s[g] = fmaf(q[g * D + vi * 8 + 2 * e + 1], x.y, s[g]);
        }
    }
}

// s[g] += q_g . k for one key row k of D elements (16-byte loads; D a multiple of 8).
template <typename T, int D, int G>
__device__ __forceinline__ void dot_key(const float *q, const T *krow, float (&s)[G]) {
#pragma unroll
    for (int vi = 0; vi < D / 8; ++vi)
        dot_key_vec<T, D, G>(q, vi, __ldg(reinterpret_cast<const uint4 *>(krow) + vi), s);
}

// A key row held in registers, loaded apart from its scoring where the loads go ahead (the
// decode step's, before its wait), and scored by dot_key_row.
template <int D> struct key_row {
    uint4 v[D / 8];
};

template <typename T, int D>
__device__ __forceinline__ void load_key_row(key_row<D> &k, const T *krow) {
#pragma unroll
    for (int vi = 0; vi < D / 8; ++vi)
        k.v[vi] = __ldg(reinterpret_cast<const uint4 *>(krow) + vi);
}

template <typename T, int D, int G>
__device__ __forceinline__ void dot_key_row(const float *q, const key_row<D> &k, float (&s)[G]) {
#pragma unroll
    for (int vi = 0; vi < D / 8; ++vi)
        dot_key_vec<T, D, G>(q, vi, k.v[vi], s);
}

// ---- T5 relative position bias -------------------------------------------------

// The bias of (query i, key j) in head h, already multiplied by log2(e) to
// join the base-2 scores. The bucket table is indexed by j - i + q_len - 1
// (see attention_abi.cuh); callers use it for in-range i and j only, but the
// index is clamped anyway: the compiler may issue the loads before the test
// that discards them (as it did with a partial-block bitmap), and they must
// not leave the table.
template <typename T>
__device__ __forceinline__ float relpos_bias_log2_at(const stof_attn_args &a, int pos, int h) {
    pos = min(max(pos, 0), a.q_len + a.k_len - 2);
    const int bucket = __ldg(a.relpos_bucket + pos);
    const T *table = static_cast<const T *>(a.relpos_table);
    return to_float(table[bucket * a.heads + h]) * kLog2e;
}

template <typename T>
__device__ __forceinline__ float relpos_bias_log2(const stof_attn_args &a, int i, int j, int h) {
    return relpos_bias_log2_at<T>(a, j - i + a.q_len - 1, h);
}

// ---- online softmax helpers --------------------------------------------------

// The reference point of a running maximum: a row that has seen only masked
// scores keeps m = -inf, and exp2(-inf - (-inf)) would be NaN; measured from
// 0 instead, every masked score gives exp2(-inf) = 0 and the row stays empty.
__device__ __forceinline__ float softmax_ref(float m) {
    return m == STOF_NEG_INF ? 0.0f : m;
}

// The length of row b of an attention_mask [batch, n] whose rows are ones,
// then zeros (right padding; the host checks that of masks it reads): a
// binary search, 1 + log2(n) reads that every thread of a block makes alike.
__device__ __forceinline__ int padded_length(const stof_i32 *mask, int b, int n) {
    const stof_i32 *row = mask + (long long)b * n;
    int lo = 0, hi = n;  // ones before lo, zeros from hi on
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (__ldg(row + mid) != 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

// Batch b's real rows: the ragged layout's (seq_start[b] .. seq_start[b + 1] - 1, see
// attention_abi.cuh), else the attention_mask's length (pad_mask), else all n.
struct sequence_rows {
    int first, len;
};

__device__ __forceinline__ sequence_rows sequence_of(const stof_i32 *seq_start,
                                                     const stof_i32 *pad_mask, int b, int n) {
    sequence_rows s;
    if (seq_start) {
        s.first = __ldg(seq_start + b);
        s.len = __ldg(seq_start + b + 1) - s.first;
    } else {
        s.first = 0;
        s.len = pad_mask ? padded_length(pad_mask, b, n) : n;
    }
    return s;
}

}  // namespace attn
}  // namespace stof
