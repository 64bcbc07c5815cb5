// Decode-step attention against a KV cache (attention_decode_abi.cuh): one query a sequence,
// its keys in the cache's ring of `cap` slots.
//
// Grid (heads / GROUP, batch, splits), DECODE_WARPS warps: a CTA serves GROUP query heads
// that share one K/V head, so each key and value it reads serves all of them (GROUP is all of
// the K/V head's query heads, or a part of them when there are few CTAs: then each of its
// CTAs reads the K/V head's keys and each has less to do a key). It first puts
// the group's queries and the new token's key in shared memory (ROTARY: the rotary op fused in
// front, both rotated here by that op's positions, rounded as its output would be).
// Each warp takes tiles of 32 keys of the CTA's chunk:
//
//   lane l takes key j = tile + l: s_g = q_g . k_j for each head g of the group (its K row
//                                  read as 16-byte vectors, the q's from shared memory)
//   tile max and sum by shuffles, online softmax (base 2) per head
//   O_g += sum_j p_gj v_j:         lanes own pairs of dims of every key, or (WIDE_V) 8 dims
//                                  of every fourth key (heads of 64); p_gj comes by shuffle
//
// then the warps merge through shared memory: O / l into the output (one split), or the
// partial (O, m, l) to the workspace that stof_attention_decode_combine merges. One CTA of
// split 0 also writes the new token's K and V into its slot; every CTA makes the new key
// itself, so no CTA waits for another.
//
// Before it waits for the kernel ahead (which makes qkv), a CTA asks L2 for its chunk's cache
// rows and finds its rotary angles: both follow from the positions alone, which are the
// step's inputs (copied in before the step's graph, or moved on by the graph before it; no
// kernel of the step writes them), and the cache rows are earlier steps' (no kernel of this
// step writes them but this one, into the new token's slot, which no query of this step reads
// from the cache).
#include "attention_common.cuh"
#include "attention_decode_abi.cuh"
#include "rotary_angle.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef STOF_DTYPE
#define STOF_DTYPE 1
#endif
#ifndef GROUP // query heads a CTA (all those of a K/V head, or a divisor of them)
#define GROUP 1
#endif
#ifndef DECODE_WARPS // warps a CTA (the host launches as many)
#define DECODE_WARPS STOF_DECODE_WARPS
#endif
#ifndef ROTARY // the rotary op fused in front: Q and the new K rotated by a.theta
#define ROTARY 0
#endif
#ifndef WIDE_V // V read 16 bytes a lane (see kWideV below)
#define WIDE_V 0
#endif

using elem_t = typename stof::dtype_of<STOF_DTYPE>::type;
using namespace stof::attn;

constexpr int kWarps = DECODE_WARPS;
constexpr int kPairs = HEAD_DIM / 2; // pairs of adjacent dims; also the rotary's half head
constexpr int kRounds = (kPairs + 31) / 32; // pairs a lane holds (the last round may be short)

static_assert(STOF_DTYPE == 1 || STOF_DTYPE == 2, "attention runs in fp16 or bf16");
static_assert(HEAD_DIM % 8 == 0 && HEAD_DIM <= 256, "HEAD_DIM: a multiple of 8 up to 256");
static_assert(GROUP >= 1 && GROUP <= STOF_DECODE_MAX_GROUP, "GROUP: 1 to 16 query heads");
static_assert(kWarps >= 1 && kWarps <= 32, "DECODE_WARPS: 1 to 32");
static_assert(kWarps * 32 >= kPairs, "a thread for each pair of the new token's V");

// How a lane holds its share of O. Wide (WIDE_V: heads of 32, 64 or 128 dims, up to 4 query
// heads a CTA; the host chooses it, mha_decode_default_v_read): V rows are read 16 bytes a
// lane, kRowLanes lanes a row, so a load covers kKeysAtOnce keys and a tile of 32 keys takes
// kRowLanes loads a lane (against 32 of 4 bytes); the lane
// sums its 8 dims over the keys t with t % kKeysAtOnce == lane / kRowLanes, and the lanes of
// the same dims add up their sums once, at the end. Otherwise a lane holds pairs of dims
// (lane, lane + 32, ...) of every key.
constexpr int kRowLanes = HEAD_DIM / 8;
constexpr bool kWideV = WIDE_V;
static_assert(!WIDE_V || STOF_DECODE_WIDE_V_BUILDS(HEAD_DIM, GROUP),
              "WIDE_V: heads of 32, 64 or 128, up to 4 query heads a CTA");
constexpr int kKeysAtOnce = kWideV ? 32 / kRowLanes : 1;
constexpr int kAcc = kWideV ? 8 : 2 * kRounds; // the fp32 sums of O a lane holds a head

// Whether row pos of the mask allows key j (no mask: every key up to pos).
__device__ __forceinline__ bool allowed(const stof_decode_args &a, int b, int pos, int j) {
    if (!a.mask)
        return true;
    const int mb = a.mask_batch == 1 ? 0 : b;
    const stof_u64 w = a.mask[((long long)mb * a.context + pos) * a.words + (j >> 6)];
    return (w >> (j & 63)) & 1ull;
}

struct decode_smem {
    float q[GROUP][HEAD_DIM];   // scaled by scale * log2(e)
    float knew[HEAD_DIM];       // the new token's key, as its cache slot holds it
    float m[kWarps][GROUP], l[kWarps][GROUP];
    float o[kWarps][GROUP][HEAD_DIM];
};

static_assert(sizeof(decode_smem) == STOF_DECODE_SMEM_BYTES(kWarps, GROUP, HEAD_DIM),
              "decode_smem and STOF_DECODE_SMEM_BYTES must agree");
static_assert(sizeof(decode_smem) <= STOF_DECODE_SMEM_LIMIT,
              "DECODE_WARPS x GROUP x HEAD_DIM too large (STOF_DECODE_SMEM_BYTES)");

struct warp_state {
    float m[GROUP], l[GROUP];
    float acc[GROUP][kAcc];
};

// s_g = q_g . k for the lane's key row, from memory or (early) from registers.
__device__ __forceinline__ void scores(const decode_smem &sm, const elem_t *krow,
                                       float (&s)[GROUP]) {
#pragma unroll
    for (int g = 0; g < GROUP; ++g)
        s[g] = 0.0f;
    dot_key<elem_t, HEAD_DIM, GROUP>(&sm.q[0][0], krow, s);
}

__device__ __forceinline__ void scores(const decode_smem &sm, const key_row<HEAD_DIM> &k,
                                       float (&s)[GROUP]) {
#pragma unroll
    for (int g = 0; g < GROUP; ++g)
        s[g] = 0.0f;
    dot_key_row<elem_t, HEAD_DIM, GROUP>(&sm.q[0][0], k, s);
}

// The tile that holds the new token's key (tile <= pos < tile + 32, the same for the whole
// warp): s_g = q_g . k_new for the lane of that key, from shared memory, the warp's lanes
// sharing out the dims. (Summed in another order than dot_key's, so this step's score of the
// new key may differ in its last bits from a later step's score of it from the cache.)
__device__ __forceinline__ void scores_new(const decode_smem &sm, int lane, bool mine,
                                           float (&s)[GROUP]) {
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        float x = 0.0f;
        for (int d = lane; d < HEAD_DIM; d += 32)
            x = fmaf(sm.q[g][d], sm.knew[d], x);
        x = stof::warp_sum(x);
        if (mine)
            s[g] = x;
    }
}

// The rotary's turn of pair j at the sequence's position (ROTARY builds; else none).
struct pair_turn {
    float c, sn;
};

__device__ __forceinline__ pair_turn turn_of(const stof_decode_args &a, int b, int j) {
    pair_turn t = {1.0f, 0.0f};
#if ROTARY
    stof::rotary_angle(a.rotary_positions[b], j, HEAD_DIM, log2(a.theta), &t.c, &t.sn);
#else
    (void)a;
    (void)b;
    (void)j;
#endif
    return t;
}

// A thread's pairs j of the new token's heads are all threadIdx.x % kPairs when the block's
// threads are a multiple of kPairs: its one turn is then found before the wait.
constexpr bool kOneTurn = (kWarps * 32) % kPairs == 0;

// Pair j of a head (dims j and j + kPairs) from row x, turned by t under ROTARY and then
// rounded to elem_t, as the rotary op writes it.
__device__ __forceinline__ void head_pair(const elem_t *x, int j, pair_turn t, float &x0,
                                          float &x1) {
    x0 = stof::to_float(x[j]);
    x1 = stof::to_float(x[j + kPairs]);
#if ROTARY
    stof::rotate_pair(x0, x1, t.c, t.sn);
    x0 = stof::to_float(stof::from_float<elem_t>(x0));
    x1 = stof::to_float(stof::from_float<elem_t>(x1));
#else
    (void)t;
#endif
}

// The queries of heads q0 .. q0 + GROUP - 1, scaled, and the new token's key into shared
// memory; one CTA of the K/V head (write: split 0, its first query heads) also puts that key
// and its value into slot pos % cap, whose old key (pos - cap) no query of this step can see.
// The loads come before the stores. mine: the turn of the thread's pairs (kOneTurn).
__device__ __forceinline__ void load_new_token(const stof_decode_args &a, decode_smem &sm,
                                               const elem_t *row, int b, int kvh, int q0, int pos,
                                               bool write, pair_turn mine) {
    const elem_t *knew = row + (a.heads + kvh) * HEAD_DIM;
    const unsigned *vnew =
        reinterpret_cast<const unsigned *>(row + (a.heads + a.kv_heads + kvh) * HEAD_DIM);
    const long long slot = ((long long)b * a.cap + (write ? pos % a.cap : 0)) * a.kv_heads + kvh;
    elem_t *kc = static_cast<elem_t *>(a.k_cache) + slot * HEAD_DIM;
    unsigned *vc =
        reinterpret_cast<unsigned *>(static_cast<elem_t *>(a.v_cache) + slot * HEAD_DIM);
    const int p = threadIdx.x; // the V pair this thread copies
    const unsigned v = write && p < kPairs ? vnew[p] : 0u;
    for (int i = threadIdx.x; i < (GROUP + 1) * kPairs; i += blockDim.x) {
        const int g = i / kPairs, j = i % kPairs;
        float x0, x1;
        head_pair(g < GROUP ? row + (q0 + g) * HEAD_DIM : knew, j,
                  kOneTurn ? mine : turn_of(a, b, j), x0, x1);
        if (g < GROUP) {
            sm.q[g][j] = x0 * a.scale_log2;
            sm.q[g][j + kPairs] = x1 * a.scale_log2;
        } else {
            sm.knew[j] = x0;
            sm.knew[j + kPairs] = x1;
            if (write) {
                kc[j] = stof::from_float<elem_t>(x0);
                kc[j + kPairs] = stof::from_float<elem_t>(x1);
            }
        }
    }
    if (write && p < kPairs)
        vc[p] = v;
}

// The tile's online-softmax update: p_g of the lane's key, the state rescaled.
__device__ __forceinline__ void softmax_tile(warp_state &st, float (&s)[GROUP], bool valid) {
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        const float mt = stof::warp_max(valid ? s[g] : STOF_NEG_INF);
        const float m = fmaxf(st.m[g], mt);
        if (m == STOF_NEG_INF) { // nothing allowed yet: the state stays empty
            s[g] = 0.0f;
            continue;
        }
        const float corr = exp2f(st.m[g] - m); // 0 when st.m was -inf
        s[g] = valid ? exp2f(s[g] - m) : 0.0f;
        st.l[g] = st.l[g] * corr + stof::warp_sum(s[g]);
        st.m[g] = m;
#pragma unroll
        for (int i = 0; i < kAcc; ++i)
            st.acc[g][i] *= corr;
    }
}

// The ring slot of key tile + t (t < 32) from the tile's own, tile_slot = tile % cap: no
// division a key once the ring holds a tile.
__device__ __forceinline__ int ring_slot(int tile_slot, int t, int tile, int cap) {
    if (cap < 32)
        return (tile + t) % cap;
    const int s = tile_slot + t;
    return s >= cap ? s - cap : s;
}

// The V rows a lane holds at once, its pairs of each as the cache packs them. Heads of up to
// 128 dims with few query heads a K/V head hold the whole tile, loaded before its keys are
// scored, so that a tile costs one memory latency; the others hold kChunk keys at a time,
// loaded after (fewer registers, still independent loads in flight).
constexpr bool kPrefetchV = !kWideV && kRounds <= 2 && GROUP * kRounds <= 16;
constexpr int kChunk = kPrefetchV ? 32 : (kRounds >= 4 ? 2 : (kRounds == 2 ? 4 : 8));

struct v_chunk {
    unsigned raw[kChunk][kRounds];
};

// The V pairs of keys tile + t0 .. tile + t0 + kChunk - 1 (past the tile's n keys: its last
// again, never used). my_slot: the ring slot of the lane's key (tile + lane); vseq: the
// sequence's slot 0 of head kvh; the key at pos is vnew.
__device__ __forceinline__ void load_v_chunk(v_chunk &c, int t0, int n, int tile, int my_slot,
                                             int pos, const elem_t *vnew, const elem_t *vseq,
                                             int kv_heads) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
        const int t = min(t0 + u, n - 1);
        const int slot = __shfl_sync(0xffffffffu, my_slot, t);
        const elem_t *vrow =
            tile + t == pos ? vnew : vseq + (long long)slot * kv_heads * HEAD_DIM;
#pragma unroll
        for (int r = 0; r < kRounds; ++r) {
            const int p = lane + 32 * r;
            c.raw[u][r] = p < kPairs ? *reinterpret_cast<const unsigned *>(vrow + 2 * p) : 0u;
        }
    }
}

// O_g += p_gj v_j over the chunk's keys (p_gj: lane j's s[g], 0 for a key not allowed; the
// ballot ok_keys says which are, so a key the mask skips never reaches the sum, whatever its
// slot holds).
__device__ __forceinline__ void accumulate_v_chunk(warp_state &st, const float (&s)[GROUP],
                                                   unsigned ok_keys, int t0, int n,
                                                   const v_chunk &c) {
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
        const int t = t0 + u;
        const bool use = t < n && ((ok_keys >> (t & 31)) & 1u);
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            const float pg = __shfl_sync(0xffffffffu, s[g], t & 31);
            if (use) {
#pragma unroll
                for (int r = 0; r < kRounds; ++r) {
                    const float2 x = unpack2<elem_t>(c.raw[u][r]);
                    st.acc[g][2 * r] = fmaf(pg, x.x, st.acc[g][2 * r]);
                    st.acc[g][2 * r + 1] = fmaf(pg, x.y, st.acc[g][2 * r + 1]);
                }
            }
        }
    }
}

// Wide V (kWideV): the 8 dims at 8 * (lane % kRowLanes) of keys tile + t, t = i * kKeysAtOnce
// + lane / kRowLanes for i < kRowLanes, loaded before the tile's keys are scored (a key past
// the tile's n: zeros, never used). tile_slot = tile % cap; vseq: the sequence's slot 0 of
// head kvh; the key at pos is vnew.
struct v_wide {
    uint4 raw[kRowLanes];
};

__device__ __forceinline__ void load_v_wide(v_wide &c, int n, int tile, int tile_slot, int pos,
                                            const elem_t *vnew, const elem_t *vseq,
                                            int kv_heads, int cap) {
    const int lane = threadIdx.x % 32, col = 8 * (lane % kRowLanes);
#pragma unroll
    for (int i = 0; i < kRowLanes; ++i) {
        const int t = i * kKeysAtOnce + lane / kRowLanes;
        c.raw[i] = make_uint4(0u, 0u, 0u, 0u);
        if (t < n) {
            const elem_t *vrow =
                tile + t == pos
                    ? vnew
                    : vseq + (long long)ring_slot(tile_slot, t, tile, cap) * kv_heads * HEAD_DIM;
            c.raw[i] = *reinterpret_cast<const uint4 *>(vrow + col);
        }
    }
}

// O_g += p_gj v_j over the lane's keys of the tile (p_gj: lane j's s[g]; ok_keys as
// accumulate_v_chunk's).
__device__ __forceinline__ void accumulate_v_wide(warp_state &st, const float (&s)[GROUP],
                                                  unsigned ok_keys, int n, const v_wide &c) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int i = 0; i < kRowLanes; ++i) {
        const int t = i * kKeysAtOnce + lane / kRowLanes;
        const bool use = t < n && ((ok_keys >> t) & 1u);
        const unsigned words[4] = {c.raw[i].x, c.raw[i].y, c.raw[i].z, c.raw[i].w};
        float x[8];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float2 v = unpack2<elem_t>(words[e]);
            x[2 * e] = v.x;
            x[2 * e + 1] = v.y;
        }
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            const float pg = __shfl_sync(0xffffffffu, s[g], t);
            if (use) {
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    st.acc[g][e] = fmaf(pg, x[e], st.acc[g][e]);
            }
        }
    }
}

// What a warp loads of its tile of keys ahead of their scores: the tile's V rows where they
// come before the scores (wide, or the whole tile: kPrefetchV), and with kEarlyTile the lane's
// key's K row too (else scores reads it from memory).
struct tile_rows {
    key_row<HEAD_DIM> k;
    v_chunk whole;
    v_wide wide;
};

// Wide builds with heads of up to 64 dims (a small grid, where a CTA's chain of latencies is
// the step's time): each warp loads its first tile before the wait (the cache's rows are
// earlier steps'; see the top), all but the new token's V, which patch_new_v adds after it.
// (Pairs' builds run grids of many CTAs, where the K rows' registers would cost occupancy.)
constexpr bool kEarlyTile = kWideV && HEAD_DIM <= 64;

// Tile `tile` (n keys, last the chunk's end) of the sequence's head: kseq and vseq its slot 0
// in the K and V caches; vnew the new token's V row, or before the wait any row of the cache;
// with_k: the K row too.
__device__ __forceinline__ void load_tile(tile_rows &t, int tile, int n, int last, int pos,
                                          int cap, int kv_heads, const elem_t *kseq,
                                          const elem_t *vseq, const elem_t *vnew, bool with_k) {
    const int lane = threadIdx.x % 32, j = tile + lane;
    const int my_slot = ring_slot(tile % cap, lane, tile, cap);
    if (kWideV)
        load_v_wide(t.wide, n, tile, tile % cap, pos, vnew, vseq, kv_heads, cap);
    else if (kPrefetchV)
        load_v_chunk(t.whole, 0, n, tile, my_slot, pos, vnew, vseq, kv_heads);
    if (with_k && j < last && j != pos)
        load_key_row<elem_t, HEAD_DIM>(t.k, kseq + (long long)my_slot * kv_heads * HEAD_DIM);
}

// The new token's V into a tile loaded before the wait (where the tile holds it): the lanes'
// registers that load_tile filled from the cache instead (wide V: kEarlyTile's builds).
__device__ __forceinline__ void patch_new_v(tile_rows &t, int tile, int pos, const elem_t *vnew) {
    static_assert(!kEarlyTile || kWideV, "a tile loaded early holds its V wide");
    if (pos < tile || pos >= tile + 32)
        return;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int i = 0; i < kRowLanes; ++i)
        if (tile + i * kKeysAtOnce + lane / kRowLanes == pos)
            t.wide.raw[i] = *reinterpret_cast<const uint4 *>(vnew + 8 * (lane % kRowLanes));
}

// The warp's O of head g into shared memory: wide, the sums of the lanes holding the same
// dims added up first (lanes l, l + kRowLanes, ...).
__device__ __forceinline__ void store_warp_o(decode_smem &sm, warp_state &st, int warp, int lane,
                                             int g) {
    if (kWideV) {
#pragma unroll
        for (int e = 0; e < kAcc; ++e)
            for (int o = kRowLanes; o < 32; o <<= 1)
                st.acc[g][e] += __shfl_xor_sync(0xffffffffu, st.acc[g][e], o);
        if (lane < kRowLanes)
#pragma unroll
            for (int e = 0; e < kAcc; ++e)
                sm.o[warp][g][8 * lane + e] = st.acc[g][e];
    } else {
#pragma unroll
        for (int r = 0; r < kRounds; ++r) {
            const int p = lane + 32 * r;
            if (p < kPairs) {
                sm.o[warp][g][2 * p] = st.acc[g][2 * r];
                sm.o[warp][g][2 * p + 1] = st.acc[g][2 * r + 1];
            }
        }
    }
}

// The K and V rows of keys first .. last - 1 of sequence b's head kvh asked of L2 (the ring's
// slots from first % cap on, wrapping at most once; the new token's slot among them holds an
// older key, asked for nothing).
__device__ __forceinline__ void prefetch_chunk(const stof_decode_args &a, int b, int kvh,
                                               int first, int last) {
    const int n = last - first;
    if (n <= 0)
        return;
    const long long stride = (long long)a.kv_heads * HEAD_DIM * sizeof(elem_t);
    const int s0 = first % a.cap, before_wrap = min(n, a.cap - s0);
    const int starts[2] = {s0, 0}, rows[2] = {before_wrap, n - before_wrap};
#pragma unroll
    for (int part = 0; part < 2; ++part) {
        const long long at = ((long long)b * a.cap + starts[part]) * a.kv_heads + kvh;
        stof::prefetch_l2(static_cast<const elem_t *>(a.k_cache) + at * HEAD_DIM, stride,
                          rows[part], HEAD_DIM * sizeof(elem_t));
        stof::prefetch_l2(static_cast<const elem_t *>(a.v_cache) + at * HEAD_DIM, stride,
                          rows[part], HEAD_DIM * sizeof(elem_t));
    }
}

extern "C" __global__ void __launch_bounds__(kWarps * 32)
stof_attention_decode(const __grid_constant__ stof_decode_args a) {
    stof::grid_dependency_launch(); // a programmatic dependent launch (common.cuh)
    __shared__ decode_smem sm;
    const int q0 = blockIdx.x * GROUP, b = blockIdx.y, z = blockIdx.z; // q0: first query head
    const int per_kv = a.heads / a.kv_heads, kvh = q0 / per_kv;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // pos -1: an ended sequence. Its cache stays, no key is read (the loop below is empty:
    // last = 0) and its output is zeros.
    const int pos = a.positions[b];
    const int lo = max(0, pos - a.cap + 1);
    const int first = lo + z * a.chunk, last = min(pos + 1, first + a.chunk);
    // before the wait: what the positions alone give (see the top)
    prefetch_chunk(a, b, kvh, first, last);
    const pair_turn mine = kOneTurn && pos >= 0 ? turn_of(a, b, threadIdx.x % kPairs)
                                                : pair_turn{1.0f, 0.0f};
    const long long seq_head = ((long long)b * a.cap * a.kv_heads + kvh) * HEAD_DIM;
    const elem_t *kseq = static_cast<const elem_t *>(a.k_cache) + seq_head;
    const elem_t *vseq = static_cast<const elem_t *>(a.v_cache) + seq_head;
    const int tile0 = first + warp * 32;
    tile_rows rows;
    if (kEarlyTile && tile0 < last)
        load_tile(rows, tile0, min(32, last - tile0), last, pos, a.cap, a.kv_heads, kseq, vseq,
                  vseq, true);
    stof::grid_dependency_wait(); // qkv: the kernel ahead's
    const elem_t *row = static_cast<const elem_t *>(a.qkv) + (long long)b * a.qkv_row_stride;
    const elem_t *vnew = row + (a.heads + a.kv_heads + kvh) * HEAD_DIM;
    load_new_token(a, sm, row, b, kvh, q0, pos, z == 0 && q0 % per_kv == 0 && pos >= 0, mine);
    __syncthreads();

    warp_state st;
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        st.m[g] = STOF_NEG_INF;
        st.l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < kAcc; ++i)
            st.acc[g][i] = 0.0f;
    }
    for (int tile = tile0; tile < last; tile += kWarps * 32) {
        const int j = tile + lane, n = min(32, last - tile);
        const bool early = kEarlyTile && tile == tile0;
        const int my_slot = ring_slot(tile % a.cap, lane, tile, a.cap);
        if (early)
            patch_new_v(rows, tile, pos, vnew);
        else
            load_tile(rows, tile, n, last, pos, a.cap, a.kv_heads, kseq, vseq, vnew, kEarlyTile);
        // the key's scores and its mask bit are loaded side by side: neither waits for the other
        float s[GROUP];
#pragma unroll
        for (int g = 0; g < GROUP; ++g)
            s[g] = STOF_NEG_INF;
        if (j < last && j != pos && kEarlyTile)
            scores(sm, rows.k, s);
        else if (j < last && j != pos)
            scores(sm, kseq + (long long)my_slot * a.kv_heads * HEAD_DIM, s);
        if (tile <= pos && pos < tile + 32 && pos < last)
            scores_new(sm, lane, j == pos, s);
        const bool valid = j < last && allowed(a, b, pos, j);
#pragma unroll
        for (int g = 0; g < GROUP; ++g)
            s[g] = valid ? s[g] : STOF_NEG_INF;
        softmax_tile(st, s, valid);
        const unsigned ok_keys = __ballot_sync(0xffffffffu, valid);
        if (kWideV) {
            accumulate_v_wide(st, s, ok_keys, n, rows.wide);
        } else if (kPrefetchV) {
            accumulate_v_chunk(st, s, ok_keys, 0, n, rows.whole);
        } else {
            for (int t0 = 0; t0 < n; t0 += kChunk) {
                v_chunk part;
                load_v_chunk(part, t0, n, tile, my_slot, pos, vnew, vseq, a.kv_heads);
                accumulate_v_chunk(st, s, ok_keys, t0, n, part);
            }
        }
    }

    // merge the warps: each rescaled to the CTA's maximum, per head
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        store_warp_o(sm, st, warp, lane, g);
        if (lane == 0) {
            sm.m[warp][g] = st.m[g];
            sm.l[warp][g] = st.l[g];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < GROUP * HEAD_DIM; i += blockDim.x) {
        const int g = i / HEAD_DIM, d = i % HEAD_DIM, h = q0 + g;
        float m = STOF_NEG_INF;
#pragma unroll
        for (int w = 0; w < kWarps; ++w)
            m = fmaxf(m, sm.m[w][g]);
        float l = 0.0f, o = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w)
            if (sm.m[w][g] != STOF_NEG_INF) {
                const float f = exp2f(sm.m[w][g] - m);
                l += sm.l[w][g] * f;
                o += sm.o[w][g][d] * f;
            }
        const long long unit = ((long long)b * a.heads + h) * a.splits + z;
        if (a.splits == 1) {
            static_cast<elem_t *>(a.o)[((long long)b * a.heads + h) * HEAD_DIM + d] =
                stof::from_float<elem_t>(l > 0.0f ? o / l : 0.0f);
        } else {
            a.partial_o[unit * HEAD_DIM + d] = o;
            if (d == 0) {
                a.partial_ml[unit * 2] = m;
                a.partial_ml[unit * 2 + 1] = l;
            }
        }
    }
}

// Merges the splits of (head, sequence) = (blockIdx.x, blockIdx.y) into O.
extern "C" __global__ void __launch_bounds__(kWarps * 32)
stof_attention_decode_combine(const __grid_constant__ stof_decode_args a) {
    stof::grid_dependency_begin();
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
    stof::grid_dependency_begin();
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
