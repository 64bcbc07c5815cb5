// The index of the largest value of each row of logits [rows, vocab] (the first of equal
// ones, as the host's greedy choice; NaNs never chosen; a row without any other value: token
// 0): a decode step's greedy tokens without copying the logits back. Grid (rows, parts),
// THREADS threads: each block takes its part of the row (vocab / parts values, a strided slice
// a thread), its warps and then the block reduce (value, index) pairs. With one part the block
// writes the token; with more, each part's best goes to its row's 64-bit key by atomicMax
// (argmax_key: larger value first, then the smaller index), and the part that arrives last
// writes the token and sets the key and count back to zero for the next launch.
#include "common.cuh"

#ifndef STOF_DTYPE
#define STOF_DTYPE 1
#endif
#ifndef THREADS
#define THREADS 256
#endif

using elem_t = typename stof::dtype_of<STOF_DTYPE>::type;
using u64 = unsigned long long;

// Where a row's chosen token goes: exec.h's exec_tokens, field for field. out[row] the token;
// live (may be null): a row whose entry is negative is not chosen for. positions (with live):
// a decode step's bookkeeping, so that the next step needs no copy in and its tokens none
// out: a chosen row's live entry p becomes p + 1 in live and positions alike, and host (may be
// null: host memory mapped for the device, [rows, host_stride]) gets the token at [row, p].
struct tokens_out {
    int *out;
    int *live;
    int *positions;
    int *host;
    long long host_stride;
};

__device__ __forceinline__ bool chosen_for(const tokens_out &to, int row) {
    return !to.live || to.live[row] >= 0;
}

__device__ __forceinline__ void put_token(const tokens_out &to, int row, int token) {
    to.out[row] = token;
    if (!to.positions)
        return;
    const int p = to.live[row];
    if (to.host && p < to.host_stride)
        to.host[(long long)row * to.host_stride + p] = token;
    to.positions[row] = p + 1;
    to.live[row] = p + 1;
}

// Whether (v, i) goes before (w, j): the larger value, then the smaller index.
__device__ __forceinline__ bool better(float v, long long i, float w, long long j) {
    return v > w || (v == w && i < j);
}

// (v, i) as a key whose unsigned order is `better`'s: v's bits made monotonic (-0 as +0, so
// that equal values tie), then the complement of i. 0, below every key: no value.
__device__ __forceinline__ u64 argmax_key(float v, unsigned i) {
    const unsigned b = __float_as_uint(v + 0.0f);
    const unsigned ordered = b & 0x80000000u ? ~b : b | 0x80000000u;
    return (u64)ordered << 32 | (u64)(0xffffffffu - i);
}

extern "C" __global__ void __launch_bounds__(THREADS)
stof_argmax_rows(const elem_t *x, long long vocab, tokens_out sink, u64 *keys) {
    stof::grid_dependency_begin(); // a programmatic dependent launch: before any read
    if (!chosen_for(sink, blockIdx.x)) // no part of the row touches its key
        return;
    __shared__ float s_val[THREADS / 32];
    __shared__ long long s_idx[THREADS / 32];
    const elem_t *row = x + (long long)blockIdx.x * vocab;
    const long long per = (vocab + gridDim.y - 1) / gridDim.y;
    const long long from = blockIdx.y * per, to = min(vocab, from + per);
    float best = __int_as_float(0xff800000u); // -inf
    long long idx = vocab;                     // none yet
    for (long long v = from + threadIdx.x; v < to; v += THREADS) {
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
    if (threadIdx.x != 0)
        return;
    for (int w = 1; w < THREADS / 32; ++w)
        if (better(s_val[w], s_idx[w], best, idx))
            best = s_val[w], idx = s_idx[w];
    if (gridDim.y == 1) {
        put_token(sink, blockIdx.x, idx < vocab ? (int)idx : 0); // no value above -inf: token 0
        return;
    }
    u64 *key = keys + blockIdx.x;
    unsigned *arrived = reinterpret_cast<unsigned *>(keys + gridDim.x) + blockIdx.x;
    if (idx < vocab)
        atomicMax(key, argmax_key(best, (unsigned)idx));
    __threadfence(); // the key before the count: the last part sees every part's
    if (atomicAdd(arrived, 1u) != gridDim.y - 1)
        return;
    __threadfence();
    const u64 k = atomicExch(key, 0ull);
    *arrived = 0u;
    put_token(sink, blockIdx.x, k ? (int)(0xffffffffu - (unsigned)(k & 0xffffffffu)) : 0);
}

// ---- Sampled tokens ------------------------------------------------------------------------
//
// stof_sample_rows draws row r's token as the host's gen_sample does (core/gen/gen_sample.c),
// one block a row: logits / temperature (IEEE division), probabilities exp(s - max) computed in
// fp64 and rounded to fp32, then the kept tokens in rank order (larger scaled logit first,
// the smaller index first among equal ones): the top_k first, of those the fewest whose mass
// reaches top_p of theirs, and the draw u[r] * their mass walks them in rank order (or, with
// neither top_k nor top_p, every token in vocabulary order).
//
// Masses are fixed point, a probability times `unit` (a power of two, the largest that keeps
// vocab of them within 62 bits: 2^46 at 50257 tokens), rounded: integer sums do not depend on
// the order they are made in, so a row's token is the same on every run; a token below half a
// unit of the largest one's probability has no mass. The vocabulary is never sorted. When the
// kept tokens are few (top-k, or top-p over a peaked row), a histogram over 2048 bins of value
// finds the bin they end in, and the at most 2048 tokens up to it are gathered and sorted
// (sample_sorted). Otherwise each selection in rank order (the k-th token, the first whose
// running mass reaches a goal) is a radix select: a histogram of counts and masses over the
// value bins between the kept tokens' extremes (spread, so that few tokens of a warp add to
// the same bin), then three over the bits of the rank keys of the tokens left in the bin (11,
// 11 and 10 bits), then the tie at the selected value found in index order (rank_select).
// Without top-k and top-p the draw walks every token in vocabulary order (walk_in_order). A
// row without a finite largest logit draws token 0. prob: [rows, vocab] fp32 scratch. The
// token goes where `sink` says (put_token); a row it does not choose for is skipped.

#ifndef SAMPLE_THREADS
#define SAMPLE_THREADS 1024
#endif
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define SAMPLE_BINS 2048 // 11 bits, 2 a thread in the scans
#define SAMPLE_ILP 8     // loads a thread has in flight in a pass over the row

static_assert(2 * SAMPLE_THREADS == SAMPLE_BINS, "the scans take two bins a thread");

struct sample_smem {
    unsigned count[SAMPLE_BINS];
    u64 mass[SAMPLE_BINS];
    u64 warp_a[SAMPLE_WARPS], warp_b[SAMPLE_WARPS];
    float warp_f[SAMPLE_WARPS], warp_g[SAMPLE_WARPS];
    int first;
    int found;
};

// A row as the passes read it: logits, their probabilities, the scaling and the mass unit.
struct sample_row {
    const elem_t *x;
    float *prob;
    long long vocab;
    float temperature, unit;
};

// The kept tokens: those up to (key, idx) in rank order, scaled values in [lo, hi].
struct kept_set {
    unsigned key;
    long long idx;
    float hi, lo;
};

// A selected token: its rank key, index and scaled value, and the count and mass of the
// tokens up to it (itself included) in rank order.
struct selected {
    unsigned key;
    int idx;
    float value;
    u64 count, mass;
};

__device__ __forceinline__ float scaled_of(elem_t x, float temperature) {
    const float s = __fdiv_rn(stof::to_float(x), temperature);
    return s == 0.0f ? 0.0f : s; // -0 ranks as +0, as the host's comparisons do
}

// Smaller goes first: the larger value, by the order-preserving map of a float's bits.
__device__ __forceinline__ unsigned rank_key(float s) {
    const unsigned u = __float_as_uint(s);
    return (u & 0x80000000u) ? u : ~(u | 0x80000000u);
}

__device__ __forceinline__ float value_of_key(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? k : (~k & 0x7fffffffu));
}

// Bin of a kept value: 0 for hi, rising as it falls (so in rank order), by operations that are
// monotone in s whatever their rounding.
__device__ __forceinline__ unsigned value_bin(float s, const kept_set &k, float per_unit) {
    const float x = fminf(fmaxf(__fmul_rn(__fsub_rn(k.hi, s), per_unit), 0.0f),
                          (float)(SAMPLE_BINS - 1));
    return (unsigned)x;
}

__device__ __forceinline__ u64 fixed_mass(float p, float unit) {
    // exact: unit a power of two, p <= 1; a NaN (of a +inf or NaN logit) has no mass
    return p >= 0.0f ? __float2ull_rn(__fmul_rn(p, unit)) : 0ull;
}

// f(v, s) for every token v of this thread's stride (scaled value s), SAMPLE_ILP loads at once.
template <typename F>
__device__ __forceinline__ void for_each_scaled(const sample_row &r, F f) {
    for (long long base = threadIdx.x; base < r.vocab; base += SAMPLE_ILP * SAMPLE_THREADS) {
        elem_t raw[SAMPLE_ILP];
#pragma unroll
        for (int j = 0; j < SAMPLE_ILP; ++j) {
            const long long v = base + (long long)j * SAMPLE_THREADS;
            raw[j] = r.x[v < r.vocab ? v : 0];
        }
#pragma unroll
        for (int j = 0; j < SAMPLE_ILP; ++j) {
            const long long v = base + (long long)j * SAMPLE_THREADS;
            if (v < r.vocab)
                f(v, scaled_of(raw[j], r.temperature));
        }
    }
}

// The same with each token's probability too: f(v, s, p).
template <typename F>
__device__ __forceinline__ void for_each_scaled_prob(const sample_row &r, F f) {
    for (long long base = threadIdx.x; base < r.vocab; base += SAMPLE_ILP * SAMPLE_THREADS) {
        elem_t raw[SAMPLE_ILP];
        float p[SAMPLE_ILP];
#pragma unroll
        for (int j = 0; j < SAMPLE_ILP; ++j) {
            const long long v = base + (long long)j * SAMPLE_THREADS, at = v < r.vocab ? v : 0;
            raw[j] = r.x[at];
            p[j] = r.prob[at];
        }
#pragma unroll
        for (int j = 0; j < SAMPLE_ILP; ++j) {
            const long long v = base + (long long)j * SAMPLE_THREADS;
            if (v < r.vocab)
                f(v, scaled_of(raw[j], r.temperature), p[j]);
        }
    }
}

// This thread's run of consecutive tokens [lo, hi), for the walks in index order.
__device__ __forceinline__ void thread_chunk(long long vocab, long long *lo, long long *hi) {
    const long long chunk = (vocab + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    *lo = threadIdx.x * chunk;
    *hi = *lo + chunk < vocab ? *lo + chunk : vocab;
    *lo = *lo < vocab ? *lo : vocab;
}

// Exclusive scans of two values a thread over the block; the totals in *ta, *tb.
__device__ void block_scan2(sample_smem &s, u64 &a, u64 &b, u64 *ta, u64 *tb) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    u64 xa = a, xb = b;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 ya = __shfl_up_sync(0xffffffffu, xa, o), yb = __shfl_up_sync(0xffffffffu, xb, o);
        if (lane >= o)
            xa += ya, xb += yb;
    }
    if (lane == 31)
        s.warp_a[warp] = xa, s.warp_b[warp] = xb;
    __syncthreads();
    if (warp == 0) {
        u64 wa = lane < SAMPLE_WARPS ? s.warp_a[lane] : 0, wb = lane < SAMPLE_WARPS ? s.warp_b[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u64 ya = __shfl_up_sync(0xffffffffu, wa, o), yb = __shfl_up_sync(0xffffffffu, wb, o);
            if (lane >= o)
                wa += ya, wb += yb;
        }
        if (lane < SAMPLE_WARPS)
            s.warp_a[lane] = wa, s.warp_b[lane] = wb;
    }
    __syncthreads();
    a = xa - a + (warp ? s.warp_a[warp - 1] : 0);
    b = xb - b + (warp ? s.warp_b[warp - 1] : 0);
    *ta = s.warp_a[SAMPLE_WARPS - 1];
    *tb = s.warp_b[SAMPLE_WARPS - 1];
    __syncthreads(); // the warp totals are reused by the next scan
}

__device__ __forceinline__ bool reaches(u64 have, u64 want, bool strict) {
    return strict ? have > want : have >= want;
}

__device__ __forceinline__ bool in_kept(unsigned k, long long v, const kept_set &kept) {
    return k < kept.key || (k == kept.key && v <= kept.idx);
}

// One histogram pass: the bins of the tokens still in the running (kept, in value bin `vbin`
// unless vbin < 0, rank keys matching prefix under mask), by value (shift < 0) or by the
// rank key's bits from shift; then the first bin whose running count (or mass) from `before`
// reaches want. Returns it; before, ties get what precedes it and what it holds.
__device__ int histogram_pass(sample_smem &s, const sample_row &r, const kept_set &kept,
                              float per_unit, int vbin, unsigned prefix, unsigned mask, int shift,
                              unsigned digits, bool by_mass, u64 want, bool strict,
                              u64 *before_count, u64 *before_mass, u64 *tie_count,
                              u64 *tie_mass) {
    const int t = threadIdx.x;
    for (int i = t; i < SAMPLE_BINS; i += SAMPLE_THREADS)
        s.count[i] = 0, s.mass[i] = 0;
    if (t == 0)
        s.first = SAMPLE_BINS;
    __syncthreads();
    for_each_scaled_prob(r, [&](long long v, float sv, float p) {
        const unsigned k = rank_key(sv);
        if (!in_kept(k, v, kept) || (k & mask) != prefix)
            return;
        const unsigned b = value_bin(sv, kept, per_unit);
        if (vbin >= 0 && b != (unsigned)vbin)
            return;
        const unsigned d = shift < 0 ? b : (k >> shift) & digits;
        atomicAdd(&s.count[d], 1u);
        atomicAdd(&s.mass[d], fixed_mass(p, r.unit));
    });
    __syncthreads();
    const u64 c0 = s.count[2 * t], c1 = s.count[2 * t + 1];
    const u64 m0 = s.mass[2 * t], m1 = s.mass[2 * t + 1];
    u64 c = c0 + c1, m = m0 + m1, tc, tm;
    block_scan2(s, c, m, &tc, &tm); // c, m: the bins before 2t
    const u64 base = by_mass ? *before_mass + m : *before_count + c;
    const u64 v0 = by_mass ? m0 : c0, v1 = by_mass ? m1 : c1;
    if (reaches(base + v0, want, strict))
        atomicMin(&s.first, 2 * t);
    else if (reaches(base + v0 + v1, want, strict))
        atomicMin(&s.first, 2 * t + 1);
    __syncthreads();
    const int d = s.first < SAMPLE_BINS ? s.first : SAMPLE_BINS - 1; // always found
    __syncthreads();
    if (d / 2 == t) { // the owner of bin d hands out what comes before it
        s.warp_a[0] = c + (d & 1 ? c0 : 0);
        s.warp_b[0] = m + (d & 1 ? m0 : 0);
    }
    __syncthreads();
    *before_count += s.warp_a[0];
    *before_mass += s.warp_b[0];
    *tie_count = s.count[d];
    *tie_mass = s.mass[d];
    __syncthreads();
    return d;
}

// The first kept token in rank order whose running count (by_mass false) or mass reaches want
// (strict: exceeds it). The caller makes sure one does (want at most the kept tokens' total).
__device__ selected rank_select(sample_smem &s, const sample_row &r, const kept_set &kept,
                                bool by_mass, u64 want, bool strict) {
    const float span = __fsub_rn(kept.hi, kept.lo);
    const float per_unit = span > 0.0f ? __fdiv_rn((float)SAMPLE_BINS, span) : 0.0f;
    u64 before_count = 0, before_mass = 0, tie_count = 0, tie_mass = 0;
    const int vbin = histogram_pass(s, r, kept, per_unit, -1, 0, 0, -1, 0, by_mass, want, strict,
                                    &before_count, &before_mass, &tie_count, &tie_mass);
    unsigned prefix = 0, mask = 0;
    for (int pass = 0; pass < 3; ++pass) {
        const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0;
        const unsigned digits = pass < 2 ? 0x7ffu : 0x3ffu;
        u64 c = before_count, m = before_mass;
        const int d = histogram_pass(s, r, kept, per_unit, vbin, prefix, mask, shift, digits,
                                     by_mass, want, strict, &c, &m, &tie_count, &tie_mass);
        before_count = c, before_mass = m;
        prefix |= (unsigned)d << shift;
        mask |= digits << shift;
    }
    // The selected value's ties, each of the same mass: how many of them, in index order.
    const u64 each = tie_mass / tie_count;
    u64 j;
    if (!by_mass)
        j = want - before_count + (strict ? 1 : 0);
    else if (strict)
        j = (want - before_mass) / each + 1;
    else
        j = (want - before_mass + each - 1) / each;
    j = j < 1 ? 1 : j > tie_count ? tie_count : j;
    long long lo, hi;
    thread_chunk(r.vocab, &lo, &hi);
    u64 mine = 0, unused = 0, total, total_unused;
    for (long long v = lo; v < hi; ++v) {
        const unsigned k = rank_key(scaled_of(r.x[v], r.temperature));
        mine += k == prefix && in_kept(k, v, kept);
    }
    u64 ahead = mine;
    block_scan2(s, ahead, unused, &total, &total_unused);
    if (ahead < j && j <= ahead + mine) {
        u64 seen = ahead;
        for (long long v = lo; v < hi; ++v) {
            const unsigned k = rank_key(scaled_of(r.x[v], r.temperature));
            if (k == prefix && in_kept(k, v, kept) && ++seen == j) {
                s.found = (int)v;
                break;
            }
        }
    }
    __syncthreads();
    selected out = {prefix, s.found, value_of_key(prefix), before_count + j,
                    before_mass + j * each};
    __syncthreads();
    return out;
}

// The first token in vocabulary order whose running mass exceeds want (< the row's total).
__device__ int walk_in_order(sample_smem &s, const sample_row &r, u64 want) {
    long long lo, hi;
    thread_chunk(r.vocab, &lo, &hi);
    u64 mine = 0, unused = 0, total, total_unused;
    for (long long v = lo; v < hi; ++v)
        mine += fixed_mass(r.prob[v], r.unit);
    u64 ahead = mine;
    block_scan2(s, ahead, unused, &total, &total_unused);
    if (ahead <= want && want < ahead + mine) {
        u64 acc = ahead;
        for (long long v = lo; v < hi; ++v)
            if ((acc += fixed_mass(r.prob[v], r.unit)) > want) {
                s.found = (int)v;
                break;
            }
    }
    __syncthreads();
    return s.found;
}

// The row's largest scaled logit and its smallest finite one, into *hi and *lo.
__device__ void row_extremes(sample_smem &s, const sample_row &r, float *hi, float *lo) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float mx = __int_as_float(0xff800000u), mn = __int_as_float(0x7f800000u);
    for_each_scaled(r, [&](long long, float sv) {
        mx = fmaxf(mx, sv);
        if (sv > __int_as_float(0xff800000u))
            mn = fminf(mn, sv);
    });
    mx = stof::warp_max(mx);
    mn = -stof::warp_max(-mn);
    if (lane == 0)
        s.warp_f[warp] = mx, s.warp_g[warp] = mn;
    __syncthreads();
    mx = s.warp_f[0], mn = s.warp_g[0];
    for (int w = 1; w < SAMPLE_WARPS; ++w)
        mx = fmaxf(mx, s.warp_f[w]), mn = fminf(mn, s.warp_g[w]);
    *hi = mx, *lo = mn < mx ? mn : mx;
    __syncthreads(); // the warp extremes are read before anyone reuses them
}

__device__ __forceinline__ float probability(float sv, float hi) {
    return (float)exp((double)sv - (double)hi);
}

// The row's probabilities into prob (hi: its largest scaled logit); their total mass.
__device__ u64 row_probabilities(sample_smem &s, const sample_row &r, float hi) {
    u64 mine = 0, unused = 0, total, total_unused;
    for_each_scaled(r, [&](long long v, float sv) {
        const float p = probability(sv, hi);
        r.prob[v] = p;
        mine += fixed_mass(p, r.unit);
    });
    block_scan2(s, mine, unused, &total, &total_unused); // also makes prob visible to the block
    return total;
}

// The first of a thread's two positions 2t, 2t + 1 (below n, running values v0 <= v1) that
// reaches want, over the block: the position, or SAMPLE_BINS when none does.
__device__ int first_reaching(sample_smem &s, int n, u64 v0, u64 v1, u64 want, bool strict) {
    const int t = threadIdx.x;
    if (t == 0)
        s.first = SAMPLE_BINS;
    __syncthreads();
    if (2 * t < n && reaches(v0, want, strict))
        atomicMin(&s.first, 2 * t);
    else if (2 * t + 1 < n && reaches(v1, want, strict))
        atomicMin(&s.first, 2 * t + 1);
    __syncthreads();
    const int first = s.first;
    __syncthreads();
    return first;
}

#define SAMPLE_COARSE_SHIFT 31 // a mass >> 31: a vocabulary's sum within 32 bits

// The kept tokens when few (the common case): a histogram over value bins finds the bin where
// the kept tokens end (counts: the k-th token's, top_k > 0; else masses rounded down to
// 2^31 fine units, which can only place it later: the bin where top_p of the row's total
// mass is surely reached). The tokens of it and of the bins before (at most SAMPLE_BINS) are
// gathered and sorted by (rank key, index), and the top-k, top-p cut and the draw are made on
// them in rank order with their exact masses. Returns the token, or -1 when they do not fit
// (the caller then takes rank_select's passes). total: the row's mass (top_k 0 only, after
// row_probabilities).
__device__ int sample_sorted(sample_smem &s, const sample_row &r, const kept_set &all,
                             int top_k, float top_p, double u, u64 total) {
    const int t = threadIdx.x;
    const float span = __fsub_rn(all.hi, all.lo);
    const float per_unit = span > 0.0f ? __fdiv_rn((float)SAMPLE_BINS, span) : 0.0f;
    for (int i = t; i < SAMPLE_BINS; i += SAMPLE_THREADS)
        s.count[i] = 0;
    __syncthreads();
    u64 want;
    if (top_k > 0) {
        for_each_scaled(r, [&](long long, float sv) {
            atomicAdd(&s.count[value_bin(sv, all, per_unit)], 1u);
        });
        want = (u64)top_k;
    } else {
        for_each_scaled_prob(r, [&](long long, float sv, float p) {
            atomicAdd(&s.count[value_bin(sv, all, per_unit)],
                      (unsigned)(fixed_mass(p, r.unit) >> SAMPLE_COARSE_SHIFT));
        });
        const double goal = ceil((double)top_p * (double)total);
        const u64 fine = goal < 1.0 ? 1 : goal > (double)total ? total : (u64)goal;
        want = (fine + (1ull << SAMPLE_COARSE_SHIFT) - 1) >> SAMPLE_COARSE_SHIFT;
    }
    __syncthreads();
    u64 c0 = s.count[2 * t], c1 = s.count[2 * t + 1], c = c0 + c1, unused = 0, tc, tu;
    block_scan2(s, c, unused, &tc, &tu);
    const int d = first_reaching(s, SAMPLE_BINS, c + c0, c + c0 + c1, want, false);
    if (d >= SAMPLE_BINS)
        return -1;
    // gathered as (rank key << 32 | index), padded to a power of two with the largest key
    if (t == 0)
        s.first = 0;
    __syncthreads();
    for_each_scaled(r, [&](long long v, float sv) {
        if (value_bin(sv, all, per_unit) <= (unsigned)d) {
            const int at = atomicAdd(&s.first, 1);
            if (at < SAMPLE_BINS)
                s.mass[at] = (u64)rank_key(sv) << 32 | (u64)v;
        }
    });
    __syncthreads();
    const int n = s.first;
    __syncthreads();
    if (n > SAMPLE_BINS)
        return -1;
    int size = 2;
    while (size < (int)n)
        size *= 2;
    __syncthreads();
    for (int i = (int)n + t; i < size; i += SAMPLE_THREADS)
        s.mass[i] = ~0ull;
    __syncthreads();
    for (int k = 2; k <= size; k <<= 1) // bitonic sort, ascending
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = t; i < size / 2; i += SAMPLE_THREADS) {
                const int a = 2 * i - (i & (j - 1)), b = a + j;
                const u64 x = s.mass[a], y = s.mass[b];
                if ((x > y) == ((a & k) == 0))
                    s.mass[a] = y, s.mass[b] = x;
            }
            __syncthreads();
        }
    // masses of the candidates (the top_k) in rank order, running sums
    const int limit = top_k > 0 ? top_k : n;
    u64 m0 = 0, m1 = 0;
    if (2 * t < limit)
        m0 = fixed_mass(probability(value_of_key((unsigned)(s.mass[2 * t] >> 32)), all.hi), r.unit);
    if (2 * t + 1 < limit)
        m1 = fixed_mass(probability(value_of_key((unsigned)(s.mass[2 * t + 1] >> 32)), all.hi),
                        r.unit);
    u64 m = m0 + m1, kept_mass, tm;
    unused = 0;
    block_scan2(s, m, unused, &kept_mass, &tm);
    const u64 run0 = m + m0, run1 = m + m0 + m1;
    kept_mass = top_k > 0 ? kept_mass : total;
    if (kept_mass == 0) // no finite largest logit: the caller's passes say so
        return -1;
    int kept_n = limit;
    u64 mass = kept_mass;
    if (top_p < 1.0f) {
        const double goal = ceil((double)top_p * (double)kept_mass);
        const u64 want = goal < 1.0 ? 1 : goal > (double)kept_mass ? kept_mass : (u64)goal;
        int cut = first_reaching(s, limit, run0, run1, want, false);
        cut = cut < limit ? cut : limit - 1; // always found: want <= kept_mass
        if (cut / 2 == t)
            s.warp_b[0] = cut & 1 ? run1 : run0;
        __syncthreads();
        kept_n = cut + 1, mass = s.warp_b[0];
        __syncthreads();
    }
    const double w = u * (double)mass;
    const int at = first_reaching(s, kept_n, run0, run1, w < (double)(mass - 1) ? (u64)w : mass - 1,
                                  true);
    const int token = (int)(s.mass[at < kept_n ? at : kept_n - 1] & 0xffffffffu);
    __syncthreads();
    return token;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
stof_sample_rows(const elem_t *x, long long vocab, float temperature, int top_k, float top_p,
                 float unit, const double *u, float *prob_rows, tokens_out sink) {
    stof::grid_dependency_begin(); // a programmatic dependent launch: before any read
    __shared__ sample_smem s;
    const int row = blockIdx.x;
    if (!chosen_for(sink, row))
        return;
    const sample_row r = {x + (long long)row * vocab, prob_rows + (long long)row * vocab, vocab,
                          temperature, unit};
    if (threadIdx.x == 0)
        s.found = 0;
    kept_set kept = {0xffffffffu, vocab - 1, 0.0f, 0.0f};
    row_extremes(s, r, &kept.hi, &kept.lo);
    const bool with_k = top_k > 0 && top_k < vocab;
    int token = with_k && top_k <= SAMPLE_BINS ? sample_sorted(s, r, kept, top_k, top_p, u[row], 0)
                                               : -1;
    if (token >= 0) {
        if (threadIdx.x == 0)
            put_token(sink, row, token);
        return;
    }
    const u64 total = row_probabilities(s, r, kept.hi);
    if (total == 0) { // no finite largest logit (all -inf, a +inf or a NaN): token 0
        if (threadIdx.x == 0)
            put_token(sink, row, 0);
        return;
    }
    if (!with_k && top_p < 1.0f)
        token = sample_sorted(s, r, kept, 0, top_p, u[row], total);
    if (!with_k && top_p >= 1.0f) {
        const double w = u[row] * (double)total;
        token = walk_in_order(s, r, w < (double)(total - 1) ? (u64)w : total - 1);
    } else if (token < 0) {
        u64 mass = total;
        if (with_k) {
            const selected k = rank_select(s, r, kept, false, (u64)top_k, false);
            kept.key = k.key, kept.idx = k.idx, kept.lo = k.value, mass = k.mass;
        }
        if (top_p < 1.0f) {
            const double goal = ceil((double)top_p * (double)mass);
            const u64 want = goal < 1.0 ? 1 : goal > (double)mass ? mass : (u64)goal;
            const selected p = rank_select(s, r, kept, true, want, false);
            kept.key = p.key, kept.idx = p.idx, kept.lo = p.value, mass = p.mass;
        }
        const double w = u[row] * (double)mass;
        token = rank_select(s, r, kept, true, w < (double)(mass - 1) ? (u64)w : mass - 1, true).idx;
    }
    if (threadIdx.x == 0)
        put_token(sink, row, token);
}
