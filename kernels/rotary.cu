// Rotary position embedding of a fused QKV row: x [rows, width], rows =
// batch x seq_len, each row Q | K | V heads of HEAD_DIM. The first `rotated`
// heads (Q and K) get the pairs (j, j + HEAD_DIM / 2) rotated by the angle
// s x theta^(-2j / HEAD_DIM), s = row % seq_len (the halves as the pairs, as
// GPT-NeoX and Hugging Face do); the V heads are copied.
//
// A row is rotated x (HEAD_DIM / 2 / VEC) rotation units of VEC pairs plus
// (width - rotated x HEAD_DIM) / VEC copy units; every unit of every row is
// one index of a grid-stride loop.
//
// The rotation itself is rotary_angle.cuh's.
#include "grid_stride.cuh"
#include "rotary_angle.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef HAS_POSITIONS // each row's position from a.positions (a decode step's), else row % seq_len
#define HAS_POSITIONS 0
#endif

static_assert(HEAD_DIM % 2 == 0 && (HEAD_DIM / 2) % VEC == 0, "VEC divides half a head");

constexpr int kHalf = HEAD_DIM / 2;
constexpr int kUnitsPerHead = kHalf / VEC;

extern "C" __global__ void __launch_bounds__(THREADS) stof_rotary(const stof_rotary_args a) {
    stof::grid_dependency_begin();  // before any read (common.cuh)
    static_assert(sizeof(stof_rotary_args) == STOF_ROTARY_ARGS_BYTES, "ABI mismatch");
    const int rot_units = a.rotated * kUnitsPerHead;
    const int units = rot_units + (a.width - a.rotated * HEAD_DIM) / VEC;
    const long long total = a.rows * units;
    const double log2_theta = log2((double)a.theta);
    const elem_t *x = static_cast<const elem_t *>(a.x);
    elem_t *y = static_cast<elem_t *>(a.y);
    STOF_GRID_STRIDE(idx, total) {
        const long long r = idx / units;
        const int u = (int)(idx - r * units);
        const elem_t *xr = x + r * a.width;
        elem_t *yr = y + r * a.width;
        if (u >= rot_units) {  // a V chunk: copied
            const int col = a.rotated * HEAD_DIM + (u - rot_units) * VEC;
            float v[VEC];
            stof::load_chunk(v, xr + col);
            stof::store_chunk(yr + col, v);
            continue;
        }
        const int head = u / kUnitsPerHead, j0 = (u - head * kUnitsPerHead) * VEC;
        const int lo = head * HEAD_DIM + j0, hi = lo + kHalf;
        float p[VEC], q[VEC];
        stof::load_chunk(p, xr + lo);
        stof::load_chunk(q, xr + hi);
#if HAS_POSITIONS
        const long long s = __ldg(a.positions + r);
#else
        const long long s = r % a.seq_len;
#endif
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            float c, sn;
            stof::rotary_angle(s, j0 + e, HEAD_DIM, log2_theta, &c, &sn);
            stof::rotate_pair(p[e], q[e], c, sn);
        }
        stof::store_chunk(yr + lo, p);
        stof::store_chunk(yr + hi, q);
    }
}
