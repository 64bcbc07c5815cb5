/* Split block rows: the chunk size and the work list of the split build
 * of the block-wise kernel (see mha_exec.h and kernels/attention_abi.cuh). */
#include "core/exec/attention/mha_exec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/exec/attention/mha_exec_internal.h"
#include "core/gpu/device.h"
#include "core/base/error.h"
#include "core/base/util.h"
#include "ops/ops.h"

/* ---- split block rows ------------------------------------------------------------------ */

int mha_bsr_row_len(const mask_bsr *f, int b, int i) {
    const int64_t base = mask_format_bsr_row_base(f, b);
    return f->load_row_ptr[base + i + 1] - f->load_row_ptr[base + i];
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int mha_exec_split_chunk_of(int *len, int n, int64_t work, int resident) {
    if (n < 1)
        return 0;
    qsort(len, (size_t)n, sizeof *len, cmp_int);
    const int longest = len[n - 1];
    int64_t chunk = len[(int64_t)(n - 1) * MHA_EXEC_SPLIT_TYPICAL_PCT / 100];
    int64_t slots = resident > 0 ? resident : 1;
    int64_t per_slot = (work + slots - 1) / slots;
    chunk = chunk > per_slot ? chunk : per_slot;
    if (chunk < MHA_EXEC_SPLIT_MIN_CHUNK)
        chunk = MHA_EXEC_SPLIT_MIN_CHUNK;
    /* worth a second kernel only when the longest row shrinks by a third */
    return 2 * (int64_t)longest >= 3 * chunk ? (int)chunk : 0;
}

int mha_exec_split_chunk(const mask_bsr *f, int batch, int heads, int resident) {
    const int n = f->batch * f->n_block_rows;
    int *len = malloc((size_t)(n > 0 ? n : 1) * sizeof *len);
    if (!len || n < 1) {
        free(len);
        return 0; /* no memory: the plain launch is always right */
    }
    for (int b = 0; b < f->batch; b++)
        for (int i = 0; i < f->n_block_rows; i++)
            len[b * f->n_block_rows + i] = mha_bsr_row_len(f, b, i);
    /* heads x every launched batch's loaded blocks, shared over the slots */
    int64_t work = (int64_t)f->n_load * (f->batch == 1 ? batch : 1) * heads;
    int chunk = mha_exec_split_chunk_of(len, n, work, resident);
    free(len);
    return chunk;
}

void mha_exec_split_free(mha_exec_split *s) {
    if (!s)
        return;
    free(s->work_ptr);
    free(s->work);
    free(s->split_ptr);
    free(s->splits);
    free(s);
}

/* Longest first; then by block row and start: a total order (no two items
 * of a batch share both), so qsort's result is deterministic. */
static int cmp_work(const void *pa, const void *pb) {
    const stof_attn_work *a = pa, *b = pb;
    int la = a->end - a->start, lb = b->end - b->start;
    if (la != lb)
        return la > lb ? -1 : 1;
    if (a->block_row != b->block_row)
        return a->block_row < b->block_row ? -1 : 1;
    return (a->start > b->start) - (a->start < b->start);
}

/* The pieces of a row of len blocks at a chunk: ceil(len / chunk) when it
 * is longer, else 1. */
static int row_pieces(int len, int chunk) {
    return len > chunk ? (len + chunk - 1) / chunk : 1;
}

/* Batch b's items and split rows, appended at s->work[*n], s->splits[*ns]. */
static void split_batch(const mask_bsr *f, int b, int chunk, mha_exec_split *s, int *n, int *ns,
                        int *slot) {
    const int32_t *ptr = f->load_row_ptr + mask_format_bsr_row_base(f, b);
    const int first = *n;
    for (int i = 0; i < f->n_block_rows; i++) {
        const int start = ptr[i], len = ptr[i + 1] - ptr[i];
        const int pieces = row_pieces(len, chunk);
        if (pieces == 1) {
            s->work[(*n)++] = (stof_attn_work){i, start, start + len, -1};
            continue;
        }
        s->splits[(*ns)++] = (stof_attn_split){i, *slot, pieces, 0};
        /* near-equal pieces: sizes differ by at most one, none above chunk */
        for (int k = 0; k < pieces; k++) {
            int lo = start + (int)((int64_t)len * k / pieces);
            int hi = start + (int)((int64_t)len * (k + 1) / pieces);
            s->work[(*n)++] = (stof_attn_work){i, lo, hi, (*slot)++};
        }
    }
    qsort(s->work + first, (size_t)(*n - first), sizeof *s->work, cmp_work);
}

int mha_exec_split_build(const mask_bsr *f, int chunk, mha_exec_split **out, stof_error *err) {
    *out = NULL;
    if (chunk < 1)
        return STOF_OK;
    int64_t n_items = 0, n_split = 0;
    for (int b = 0; b < f->batch; b++)
        for (int i = 0; i < f->n_block_rows; i++) {
            int pieces = row_pieces(mha_bsr_row_len(f, b, i), chunk);
            n_items += pieces;
            n_split += pieces > 1;
        }
    if (!n_split)
        return STOF_OK;
    if (n_items > INT32_MAX)
        return err_set(err, STOF_ERR_UNSUPPORTED,
                       "attention: %lld work items at chunk %d are too many",
                       (long long)n_items, chunk);
    mha_exec_split *s = err_calloc(1, sizeof *s, err);
    if (!s)
        return STOF_ERR_NOMEM;
    s->fmt_batch = f->batch;
    s->chunk = chunk;
    s->work_ptr = err_malloc(((size_t)f->batch + 1) * sizeof *s->work_ptr, err);
    s->split_ptr = s->work_ptr ? err_malloc(((size_t)f->batch + 1) * sizeof *s->split_ptr, err)
                               : NULL;
    s->work = s->split_ptr ? err_malloc((size_t)n_items * sizeof *s->work, err) : NULL;
    s->splits = s->work ? err_malloc((size_t)n_split * sizeof *s->splits, err) : NULL;
    if (!s->splits) {
        mha_exec_split_free(s);
        return STOF_ERR_NOMEM;
    }
    int n = 0, ns = 0, slot = 0;
    for (int b = 0; b < f->batch; b++) {
        s->work_ptr[b] = n;
        s->split_ptr[b] = ns;
        split_batch(f, b, chunk, s, &n, &ns, &slot);
        if (n - s->work_ptr[b] > s->max_items)
            s->max_items = n - s->work_ptr[b];
        if (ns - s->split_ptr[b] > s->max_split_rows)
            s->max_split_rows = ns - s->split_ptr[b];
    }
    s->work_ptr[f->batch] = n;
    s->split_ptr[f->batch] = ns;
    s->n_items = n;
    s->n_split_rows = ns;
    s->n_slots = slot;
    *out = s;
    return STOF_OK;
}

size_t mha_exec_split_workspace(const mha_exec_split *s, int batch, int heads, int block_m,
                                int head_dim) {
    size_t units = (size_t)(s->fmt_batch == 1 ? batch : 1) * (size_t)s->n_slots * (size_t)heads;
    return units * (size_t)block_m * ((size_t)head_dim + 2) * sizeof(float);
}
