// Masking and scaling of the block-wise attention kernel's scores: bitmaps,
// the k_len edge, the T5 relative position bias, and each warp's view of a
// partial block. (After attention_block_loads.cuh.)
// Part of attention_block.cu, which includes it after the parts it names;
// it uses that kernel's build constants (attention_block_config.cuh).
#ifndef STOF_KERNELS_ATTENTION_BLOCK_MASK_CUH
#define STOF_KERNELS_ATTENTION_BLOCK_MASK_CUH

// ---- mask, scale and bias ------------------------------------------------------------
//
// Scores reach the softmax in one of two units. Without a bias and with a
// positive scale they stay raw dot products: the softmax folds the scale
// into its exponent (exp2(s c - m c), one FFMA) and takes maxima of raw
// scores, which order like scaled ones. A full block away from the k_len
// edge then needs no work at all here, which is most blocks: per score the
// loop body is the max, one FFMA, one exp2 and one add. With the T5 bias (or
// a scale <= 0) scores are scaled here, the bias added, and the softmax
// uses c = 1. Either way m is kept in the softmax's units and turned into
// base-2 units (m c) where it leaves the kernel (split rows' partials).

// Whether this launch pre-scales scores (uniform over the grid).
__device__ __forceinline__ bool prescaled(const stof_attn_args &a) {
    return HAS_RELPOS || !(a.scale_log2 > 0.0f);
}

// The T5 bias by distance. T5's buckets are logarithmic: every distance
// past max_distance shares one bucket (a side), so most blocks of a long
// sparse row (BigBird's random and global blocks) take one bias for all
// their scores. The host appends to the bucket table the last position of
// its first run of equal buckets and the first of its last run
// (attention_abi.cuh); each CTA reads the two runs' biases once, and with
// -DRELPOS_MID=C (the host's capacity, a power of two) the biases of the
// positions between them into a shared table. A block inside a far run
// then adds one number, the blocks near the diagonal one shared load a
// score. (Reading bucket and table from global memory, two dependent loads
// a score, made the T5 kernel 1.7x slower than without the bias on BigBird
// 16x12x2048 with 32x32 tiles: the L1 there is mostly shared memory.)
#ifndef RELPOS_MID
#define RELPOS_MID 0
#endif
static_assert(RELPOS_MID == 0 || (HAS_RELPOS && RELPOS_MID % 4 == 0),
              "RELPOS_MID: the relpos build's table capacity, a multiple of 4");

struct relpos_far {
#if HAS_RELPOS
    int first_end, last_start;  // positions j - i + q_len - 1
    float first, last;          // their biases, times log2(e)
    int mid_len;                // positions first_end + 1 .. in `mid` (0: none)
    bool complete;              // every position between the runs is in `mid`
    const float *mid;
#endif
};

// Called by every thread of the block before the first barrier of the loop
// (which publishes the shared table).
__device__ __forceinline__ relpos_far load_relpos_far(const stof_attn_args &a, int h,
                                                      float *shared_mid) {
    relpos_far f;
#if HAS_RELPOS
    const int n = a.q_len + a.k_len - 1;
    f.first_end = __ldg(a.relpos_bucket + n);
    f.last_start = __ldg(a.relpos_bucket + n + 1);
    f.first = relpos_bias_log2_at<elem_t>(a, 0, h);
    f.last = relpos_bias_log2_at<elem_t>(a, n - 1, h);
    const int mid = f.last_start - f.first_end - 1;
    f.mid_len = RELPOS_MID && mid > 0 && mid <= RELPOS_MID ? mid : 0;
    f.complete = RELPOS_MID && mid <= RELPOS_MID;
    f.mid = shared_mid;
#if RELPOS_MID
    // All buckets first, then all biases: two round trips to L2, not two an
    // entry (at (1, 128), where a call is a few microseconds, the serial
    // loop cost 2 us a CTA).
    constexpr int kFill = (RELPOS_MID + kThreads - 1) / kThreads;
    int bucket[kFill];
#pragma unroll
    for (int k = 0; k < kFill; ++k) {
        const int i = threadIdx.x + k * kThreads;
        bucket[k] = i < f.mid_len ? __ldg(a.relpos_bucket + f.first_end + 1 + i) : 0;
    }
    const elem_t *table = static_cast<const elem_t *>(a.relpos_table);
#pragma unroll
    for (int k = 0; k < kFill; ++k) {
        const int i = threadIdx.x + k * kThreads;
        if (i < f.mid_len) shared_mid[i] = stof::to_float(table[bucket[k] * a.heads + h]) * kLog2e;
    }
#endif
#else
    (void)a;
    (void)h;
    (void)shared_mid;
#endif
    return f;
}

#if HAS_RELPOS
// The bias of query row i, key j.
__device__ __forceinline__ float relpos_near_log2(const stof_attn_args &a, const relpos_far &far,
                                                  int i, int j, int h) {
    const int pos = j - i + a.q_len - 1;
    if (pos <= far.first_end) return far.first;
    if (pos >= far.last_start) return far.last;
    const int k = pos - far.first_end - 1;
    return k < far.mid_len ? far.mid[k] : relpos_bias_log2_at<elem_t>(a, pos, h);
}

// The bias at position pos when far.complete, without a branch: the runs'
// ends are selected, every other position read from the shared table (the
// clamped read stays inside it, and is discarded at the ends).
__device__ __forceinline__ float relpos_table_log2(const relpos_far &far, int pos) {
    const int k = pos - far.first_end - 1;
    float v = far.mid[min(max(k, 0), max(far.mid_len - 1, 0))];
    v = k >= far.mid_len ? far.last : v;
    return k < 0 ? far.first : v;
}

// Whether key block `col` (keys [0, lim) of it) lies inside one of the far
// runs for all the warp's rows, and then its bias.
__device__ __forceinline__ bool uniform_relpos_log2(const stof_attn_args &a, const warp_pos &w,
                                                    int row_base, int col, int lim,
                                                    const relpos_far &far, float &bias) {
    bias = 0.0f;
    if (col < 0 || lim <= 0) return false;
    const int i0 = row_base + w.row0, i1 = min(i0 + kWarpRows, a.q_len) - 1;
    if (i1 < i0) return false;  // rows past q_len only: never stored
    const int j0 = col * BLOCK_N, j1 = j0 + min(lim, BLOCK_N) - 1;
    const int lo = j0 - i1 + a.q_len - 1, hi = j1 - i0 + a.q_len - 1;
    bias = hi <= far.first_end ? far.first : far.last;
    return hi <= far.first_end || lo >= far.last_start;
}
#endif

// Disallowed pairs become -inf: a partial block's bitmap (mask >= 0; a
// full block skips the test) and keys past k_len (zero-filled rows that
// must not count) or, with padding, past kv_len. Pre-scaled launches also scale and add the bias here.
// Rows past q_len are computed on zero queries and never stored.
__device__ __forceinline__ void mask_and_scale(float (&s)[kMT][kNT][4], const stof_attn_args &a,
                                               const warp_pos &w, int row_base,
                                               const key_group &g, int h, bool prescale,
                                               const relpos_far &far, int kv_len) {
    // keys of the block that exist (and, with padding, are tokens)
    const int lim = keys_in(kv_len, g.col);  // kv_len <= k_len
    const bool work = prescale || g.mask >= 0 || lim < BLOCK_N;
    if (!work) return;  // full blocks away from the edge: nothing to mask
    const float mul = prescale ? a.scale_log2 : 1.0f;
#if HAS_RELPOS
    float bias;  // the block's bias where it is one number for the warp's rows
    const bool uniform = uniform_relpos_log2(a, w, row_base, g.col, lim, far, bias);
#endif
    // A full block (mask < 0) points at bitmap 0 and ignores it. Never
    // a null pointer: the compiler may issue the bitmap load before the
    // test that discards it (seen at 128x16 with one warp: a read of
    // address 0x20), and the host always uploads at least one bitmap.
    const bool partial = g.mask >= 0;
    const bool edge = lim < BLOCK_N;
#if HAS_RELPOS
    if (!partial && !edge && (uniform || far.complete)) {
        // A full block: scale and bias, none of the per-score tests
        // below. Inside a far run (most blocks of a long row) that is one
        // FFMA a score; near the diagonal one table read more. (With the
        // tests on every block, t5-base's BigBird encoder attention at
        // 16 x 12 x 2048 took 0.50 ms a layer, now 0.39; its causal
        // decoder self-attention 0.76, now 0.44.)
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int pos0 = g.col * BLOCK_N - (row_base + w.row0 + mt * 16 + w.g +
                                                    half * 8) + a.q_len - 1;
                if (uniform) {
#pragma unroll
                    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            float &x = s[mt][nt][half * 2 + e];
                            x = fmaf(x, mul, bias);
                        }
                } else {
#pragma unroll
                    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            float &x = s[mt][nt][half * 2 + e];
                            x = fmaf(x, mul, relpos_table_log2(far, pos0 + nt * 8 + 2 * w.t + e));
                        }
                }
            }
        return;
    }
#endif
    const stof_u32 *bitmap =
        a.part_masks + (long long)(partial ? g.mask : 0) * (BLOCK_M * kMaskWords);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = w.row0 + mt * 16 + w.g + half * 8;  // row within the block tile
            stof_u32 bits[kMaskWords];
#pragma unroll
            for (int k = 0; k < kMaskWords; ++k)
                bits[k] = partial ? __ldg(bitmap + r * kMaskWords + k) : 0xffffffffu;
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int c = nt * 8 + 2 * w.t + e;  // column within the key block
                    bool ok = (bits[c >> 5] >> (c & 31)) & 1u;
                    if (edge) ok = ok && c < lim;
                    float x = s[mt][nt][half * 2 + e] * mul;
#if HAS_RELPOS
                    if (uniform)
                        x += bias;
                    else if (far.complete)
                        x += relpos_table_log2(far, g.col * BLOCK_N + c - (row_base + r) +
                                                        a.q_len - 1);
                    else if (ok && row_base + r < a.q_len)
                        x += relpos_near_log2(a, far, row_base + r, g.col * BLOCK_N + c, h);
#endif
                    s[mt][nt][half * 2 + e] = ok ? x : STOF_NEG_INF;
                }
            }
        }
    }
}

// ---- the warp's view of a partial block ------------------------------------------------

// How the warp's own rows see partial block `mask` (>= 0): 0 no allowed
// key (the warp skips the block: its scores would all be -inf, which the
// online softmax leaves unchanged), 1 every key allowed (no mask pass), 2
// mixed. With BLOCK_M above the mask's structure (BigBird's 32-row random
// blocks in a 64-row tile) many blocks are partial only because of the
// other warps' rows: the block's K and V are loaded once for the rows that
// need them, and the warps that do not skip the math. Bitmap words are
// read again in the mask pass (L1 hits).
__device__ __forceinline__ int warp_view(const stof_attn_args &a, const warp_pos &w, int mask) {
    const stof_u32 *bitmap = a.part_masks + (long long)mask * (BLOCK_M * kMaskWords);
    stof_u32 any = 0, all = ~0u;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = w.row0 + mt * 16 + w.g + half * 8;
#pragma unroll
            for (int k = 0; k < kMaskWords; ++k) {
                const stof_u32 word = __ldg(bitmap + r * kMaskWords + k);
                // the bits of real columns: all 32 but in a last, short word
                const stof_u32 real = (k == kMaskWords - 1 && BLOCK_N % 32)
                                          ? (1u << (BLOCK_N % 32)) - 1u
                                          : ~0u;
                any |= word;
                all &= word | ~real;
            }
        }
    if (!__any_sync(0xffffffffu, any != 0)) return 0;
    return __all_sync(0xffffffffu, all == ~0u) ? 1 : 2;
}

// The block as this warp sees it: with no allowed key for its rows it
// becomes missing (col -1, all masked), all-allowed it becomes full. False
// when nothing is left: the warp skips the iteration's math. (The wgmma build,
// which computes a warpgroup's rows together, does not call it.)
__device__ __forceinline__ bool warp_group_view(const stof_attn_args &a, const warp_pos &w,
                                                key_group &g) {
#if !WARP_SKIP
    return true;
#else
    if (g.mask >= 0) {
        const int v = warp_view(a, w, g.mask);
        if (v == 0) g.col = -1;
        if (v == 1) g.mask = -1;
    }
    return g.col >= 0;
#endif
}

#endif  // STOF_KERNELS_ATTENTION_BLOCK_MASK_CUH
