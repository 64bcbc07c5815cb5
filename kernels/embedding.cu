// The embedding gather: out[t, :] = word[ids[t]] (+ type[0]) (+ pos[t % seq_len]).
//
// The output is tokens x (hidden / VEC) chunks of VEC elements, one chunk a
// thread in a grid-stride loop over that flat index space, so that every
// thread has work whatever the hidden size (a block per token would leave
// threads idle at hidden / VEC < THREADS). Consecutive threads take
// consecutive chunks of one row: coalesced 16-byte loads at VEC = 8.
//
// With HAS_TYPE_IDS each token adds its own type row (a sentence pair's
// second segment), else row 0; with HAS_POS_IDS its own position row (a
// decode step's token sits past the cached ones), else t % seq_len. A type
// or position outside its table is bad input like a bad id.
//
// Ids are on the device, so the host cannot validate them before the
// launch, and clamping a bad id would silently embed the wrong token. An id
// outside [0, vocab) makes its row zeros and records t + 1 in *error (the
// first bad token to claim the flag); the host reads the flag back and
// fails with the token and its id (gemm_exec_embedding_status).
#include "grid_stride.cuh"

#ifndef HAS_POS
#define HAS_POS 1
#endif
#ifndef HAS_TYPE
#define HAS_TYPE 1
#endif
#ifndef HAS_TYPE_IDS  // the type row of each token (type_ids), else row 0
#define HAS_TYPE_IDS 0
#endif
#ifndef HAS_POS_IDS  // the position row of each token (pos_ids), else t % seq_len
#define HAS_POS_IDS 0
#endif

extern "C" __global__ void __launch_bounds__(THREADS) stof_embedding(const stof_embed_args a) {
    stof::grid_dependency_begin();  // before any read (common.cuh)
    static_assert(sizeof(stof_embed_args) == STOF_EMBED_ARGS_BYTES, "ABI mismatch");
    const int chunks = a.hidden / VEC;
    const long long total = a.tokens * chunks;
    const elem_t *word = static_cast<const elem_t *>(a.word);
    elem_t *out = static_cast<elem_t *>(a.out);
    STOF_GRID_STRIDE(idx, total) {
        const long long t = idx / chunks;
        const int col = (int)(idx - t * chunks) * VEC;
        const int id = __ldg(a.ids + t);
#if HAS_TYPE_IDS
        const int type_row = __ldg(a.type_ids + t);
        const bool bad_type = type_row < 0 || type_row >= a.type_vocab;
#else
        const int type_row = 0;
        const bool bad_type = false;
#endif
#if HAS_POS_IDS
        const long long pos_row = __ldg(a.pos_ids + t);
        const bool bad_pos = pos_row < 0 || pos_row >= a.pos_rows;
#else
        const long long pos_row = t % a.seq_len;
        const bool bad_pos = false;
#endif
        float f[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            f[e] = 0.0f;
        if (id < 0 || id >= a.vocab || bad_type || bad_pos) {
            if (col == 0)
                atomicCAS(a.error, 0, (int)(t + 1));
            stof::store_chunk(out + t * a.hidden + col, f);
            continue;
        }
        stof::add_chunk(f, word + (long long)id * a.hidden + col);
        // Hugging Face BERT's order, as the CPU reference: word + type, then + position
#if HAS_TYPE
        stof::add_chunk(f, static_cast<const elem_t *>(a.type) + (long long)type_row * a.hidden +
                               col);
#endif
#if HAS_POS
        stof::add_chunk(f, static_cast<const elem_t *>(a.pos) + pos_row * a.hidden + col);
#endif
        stof::store_chunk(out + t * a.hidden + col, f);
    }
}
