// Decode-step attention against a KV cache (attention_decode_abi.cuh): one query a sequence,
// its keys in the cache's ring of `cap` slots.
//
// Grid (heads, batch, splits), STOF_DECODE_WARPS warps. Each warp takes every
// STOF_DECODE_WARPS-th key of the CTA's chunk:
//
//   s_j = q . k_j            each lane holds pairs of q's dims, a warp reduction sums them
//   online softmax (base 2)  the warp's running maximum m and sum l
//   O += p_j v_j             the lane's pairs of dims
//
// then the warps merge through shared memory: O / l into the output (one split), or the
// partial (O, m, l) to the workspace that stof_attention_decode_combine merges. The CTA of
// split 0 and the first query head of each K/V head also writes the new token's K and V into
// its slot; every CTA reads the new key from qkv itself, so no CTA waits for another.
#include "attention_common.cuh"
#include "attention_decode_abi.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef STOF_DTYPE
#define STOF_DTYPE 1
#endif

using elem_t = typename stof::dtype_of<STOF_DTYPE>::type;
using namespace stof::attn;

constexpr int kWarps = STOF_DECODE_WARPS;
constexpr int kPairs = HEAD_DIM / 2;
constexpr int kRounds = (kPairs + 31) / 32; // pairs a lane holds (the last round may be short)

static_assert(STOF_DTYPE == 1 || STOF_DTYPE == 2, "attention runs in fp16 or bf16");
static_assert(HEAD_DIM % 8 == 0 && HEAD_DIM <= 256, "HEAD_DIM: a multiple of 8 up to 256");

__device__ __forceinline__ float2 load_pair(const elem_t *row, int p) {
    return unpack2<elem_t>(*reinterpret_cast<const unsigned *>(row + 2 * p));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Whether row pos of the mask allows key j (no mask: every key up to pos).
__device__ __forceinline__ bool allowed(const stof_decode_args &a, int b, int pos, int j) {
    if (!a.mask)
        return true;
    const int mb = a.mask_batch == 1 ? 0 : b;
    const stof_u64 w = a.mask[((long long)mb * a.context + pos) * a.words + (j >> 6)];
    return (w >> (j & 63)) & 1ull;
}

// The new token's K and V (head kvh) into slot pos % cap.
__device__ __forceinline__ void store_new(const stof_decode_args &a, const elem_t *krow,
                                          const elem_t *vrow, int b, int kvh, int pos) {
    const long long slot = ((long long)b * a.cap + pos % a.cap) * a.kv_heads + kvh;
    unsigned *kc = reinterpret_cast<unsigned *>(static_cast<elem_t *>(a.k_cache) + slot * HEAD_DIM);
    unsigned *vc = reinterpret_cast<unsigned *>(static_cast<elem_t *>(a.v_cache) + slot * HEAD_DIM);
    for (int p = threadIdx.x; p < kPairs; p += blockDim.x) {
        kc[p] = reinterpret_cast<const unsigned *>(krow)[p];
        vc[p] = reinterpret_cast<const unsigned *>(vrow)[p];
    }
}

struct warp_state {
    float m, l;
    float2 acc[kRounds];
};

// One key: its score, the online softmax, its value into the accumulator.
__device__ __forceinline__ void attend_key(warp_state &st, const float2 (&q)[kRounds],
                                           const elem_t *k, const elem_t *v, int lane) {
    float part = 0.0f;
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
        const int p = lane + 32 * r;
        if (p < kPairs) {
            const float2 x = load_pair(k, p);
            part = fmaf(q[r].x, x.x, fmaf(q[r].y, x.y, part));
        }
    }
    const float s = warp_sum(part); // already scaled by scale * log2(e) through q
    const float m = fmaxf(st.m, s);
    const float corr = exp2f(st.m - m), pj = exp2f(s - m);
    st.l = st.l * corr + pj;
    st.m = m;
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
        const int p = lane + 32 * r;
        if (p < kPairs) {
            const float2 x = load_pair(v, p);
            st.acc[r].x = st.acc[r].x * corr + pj * x.x;
            st.acc[r].y = st.acc[r].y * corr + pj * x.y;
        }
    }
}

struct merge_smem {
    float m[kWarps], l[kWarps];
    float o[kWarps][HEAD_DIM];
};

extern "C" __global__ void __launch_bounds__(kWarps * 32)
stof_attention_decode(const __grid_constant__ stof_decode_args a) {
    __shared__ merge_smem sm;
    const int h = blockIdx.x, b = blockIdx.y, z = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = a.heads / a.kv_heads, kvh = h / group;
    const int pos = a.positions[b];
    const elem_t *row = static_cast<const elem_t *>(a.qkv) + (long long)b * a.qkv_row_stride;
    const elem_t *qrow = row + h * HEAD_DIM;
    const elem_t *knew = row + (a.heads + kvh) * HEAD_DIM;
    const elem_t *vnew = row + (a.heads + a.kv_heads + kvh) * HEAD_DIM;
    if (z == 0 && h % group == 0)
        store_new(a, knew, vnew, b, kvh, pos);

    float2 q[kRounds];
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
        const int p = lane + 32 * r;
        const float2 x = p < kPairs ? load_pair(qrow, p) : make_float2(0.0f, 0.0f);
        q[r] = make_float2(x.x * a.scale_log2, x.y * a.scale_log2);
    }
    warp_state st;
    st.m = STOF_NEG_INF;
    st.l = 0.0f;
#pragma unroll
    for (int r = 0; r < kRounds; ++r)
        st.acc[r] = make_float2(0.0f, 0.0f);

    const int lo = max(0, pos - a.cap + 1);
    const int first = lo + z * a.chunk, last = min(pos + 1, first + a.chunk);
    const elem_t *kc = static_cast<const elem_t *>(a.k_cache);
    const elem_t *vc = static_cast<const elem_t *>(a.v_cache);
    for (int j = first + warp; j < last; j += kWarps) {
        if (!allowed(a, b, pos, j))
            continue;
        if (j == pos) {
            attend_key(st, q, knew, vnew, lane);
        } else {
            const long long slot = ((long long)b * a.cap + j % a.cap) * a.kv_heads + kvh;
            attend_key(st, q, kc + slot * HEAD_DIM, vc + slot * HEAD_DIM, lane);
        }
    }

    // merge the warps: each rescales to the CTA's maximum
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
        const int p = lane + 32 * r;
        if (p < kPairs) {
            sm.o[warp][2 * p] = st.acc[r].x;
            sm.o[warp][2 * p + 1] = st.acc[r].y;
        }
    }
    if (lane == 0) {
        sm.m[warp] = st.m;
        sm.l[warp] = st.l;
    }
    __syncthreads();
    float m = STOF_NEG_INF;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
        m = fmaxf(m, sm.m[w]);
    float l = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
        l += sm.m[w] == STOF_NEG_INF ? 0.0f : sm.l[w] * exp2f(sm.m[w] - m);
    const long long unit = ((long long)b * a.heads + h) * a.splits + z;
    for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w)
            o += sm.m[w] == STOF_NEG_INF ? 0.0f : sm.o[w][d] * exp2f(sm.m[w] - m);
        if (a.splits == 1)
            static_cast<elem_t *>(a.o)[((long long)b * a.heads + h) * HEAD_DIM + d] =
                stof::from_float<elem_t>(l > 0.0f ? o / l : 0.0f);
        else
            a.partial_o[unit * HEAD_DIM + d] = o;
    }
    if (a.splits > 1 && threadIdx.x == 0) {
        a.partial_ml[unit * 2] = m;
        a.partial_ml[unit * 2 + 1] = l;
    }
}

// Merges the splits of (head, sequence) = (blockIdx.x, blockIdx.y) into O.
extern "C" __global__ void __launch_bounds__(kWarps * 32)
stof_attention_decode_combine(const __grid_constant__ stof_decode_args a) {
    const int h = blockIdx.x, b = blockIdx.y;
    const long long base = ((long long)b * a.heads + h) * a.splits;
    float m = STOF_NEG_INF;
    for (int z = 0; z < a.splits; ++z)
        m = fmaxf(m, a.partial_ml[(base + z) * 2]);
    float l = 0.0f;
    for (int z = 0; z < a.splits; ++z) {
        const float mz = a.partial_ml[(base + z) * 2];
        l += mz == STOF_NEG_INF ? 0.0f : a.partial_ml[(base + z) * 2 + 1] * exp2f(mz - m);
    }
    for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) {
        float o = 0.0f;
        for (int z = 0; z < a.splits; ++z) {
            const float mz = a.partial_ml[(base + z) * 2];
            if (mz != STOF_NEG_INF)
                o += a.partial_o[(base + z) * HEAD_DIM + d] * exp2f(mz - m);
        }
        static_cast<elem_t *>(a.o)[((long long)b * a.heads + h) * HEAD_DIM + d] =
            stof::from_float<elem_t>(l > 0.0f ? o / l : 0.0f);
    }
}

// The length of sequence b in the prefill: its attention_mask row's ones (right padded).
__device__ __forceinline__ int prefill_length(const stof_decode_args &a, int b) {
    if (!a.pad_mask)
        return a.seq;
    const stof_i32 *row = a.pad_mask + (long long)b * a.seq;
    int lo = 0, hi = a.seq; // the first 0, by bisection
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (row[mid] != 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

// A prefill's K and V of row (s, b) = (blockIdx.x, blockIdx.y) into its slot, for the last
// cap positions of the sequence only (rows sharing a slot would race; the older is gone).
extern "C" __global__ void __launch_bounds__(kWarps * 32)
stof_kv_cache_store(const __grid_constant__ stof_decode_args a) {
    const int s = blockIdx.x, b = blockIdx.y;
    const int len = prefill_length(a, b);
    if (s >= len || s < len - a.cap)
        return;
    const elem_t *row = static_cast<const elem_t *>(a.qkv) +
                        ((long long)b * a.seq + s) * a.qkv_row_stride + a.heads * HEAD_DIM;
    const long long slot = ((long long)b * a.cap + s % a.cap) * a.kv_heads;
    const int pairs = a.kv_heads * kPairs;
    const unsigned *k = reinterpret_cast<const unsigned *>(row);
    const unsigned *v = reinterpret_cast<const unsigned *>(row + a.kv_heads * HEAD_DIM);
    unsigned *kc = reinterpret_cast<unsigned *>(static_cast<elem_t *>(a.k_cache) + slot * HEAD_DIM);
    unsigned *vc = reinterpret_cast<unsigned *>(static_cast<elem_t *>(a.v_cache) + slot * HEAD_DIM);
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        kc[p] = k[p];
        vc[p] = v[p];
    }
}
