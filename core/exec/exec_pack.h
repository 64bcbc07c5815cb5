/* Padding-free runs of an encoder (exec_pack.c): a batch whose attention_mask pads its
 * sequences runs its token-wise segments (embedding, GEMMs, norms, GLU, rotary) on the real
 * tokens only, packed one after another, as ByteTransformer does. The attentions read and
 * write the packed rows in place, each sequence from its first row (the ragged layout of
 * kernels/attention_abi.cuh); the model's output is unpacked to [B, S, ...] with zeros at the
 * padded positions, as the padded run writes it.
 *
 * The packed rows are the tokens rounded up to a bucket (exec_pack_bucket), so that one
 * CUDA graph serves every batch with as many tokens within a bucket: a model keeps a few
 * of them (one per bucket seen lately), each with its kernel plans for that many rows.
 *
 * This header is the CPU half, which the tests reach: the row maps and whether a plan can run
 * packed. */
#ifndef STOF_CORE_EXEC_PACK_H
#define STOF_CORE_EXEC_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "core/exec/exec.h"

/* The packed rows' granularity for a batch of `padded_rows` = B x S rows: a multiple of 128
 * (a GEMM tile's rows), about 1/32 of the batch, so that at most 32 sizes of graph exist and
 * a bucket wastes under 1/32 of the padded batch's work. */
int64_t exec_pack_bucket(int64_t padded_rows);

/* Where each packed row comes from, for one batch's lengths. */
typedef struct exec_pack_map {
    int batch, seq;
    int64_t tokens;  /* real tokens: the lengths' sum */
    int64_t rows;    /* packed rows: tokens rounded up to the bucket, at most batch x seq */
    int32_t *src;    /* [rows]: packed row -> padded row b x seq + position; -1 past tokens */
    int32_t *dst;    /* [batch x seq]: padded row -> packed row; -1 at padding */
    int32_t *pos;    /* [rows]: a packed row's position in its sequence; 0 past tokens */
    int32_t *valid;  /* [rows]: 1 for a token, 0 past them */
    int32_t *start;  /* [batch + 1]: sequence b's first packed row; start[batch] = tokens */
} exec_pack_map;

/* The map of sequences of lengths[b] (0 .. seq) tokens, each packed after the one before.
 * STOF_ERR_INVALID naming the row for a length out of range. */
int exec_pack_map_build(const int32_t *lengths, int batch, int seq, exec_pack_map *out,
                        stof_error *err);
void exec_pack_map_free(exec_pack_map *m);

/* The lengths of an attention_mask's rows (right padding, as weights_check_input_mask
 * checks): each row's count of ones. */
void exec_pack_lengths(const int32_t *mask, int batch, int seq, int32_t *lengths);

/* Whether plan p can run packed: it has one attention_mask input [B, S]; every segment is
 * token-wise over B x S rows (the GEMM family but gemv, the embedding of ids [B, S], GLU,
 * rotary, mask_rows) or a self-attention padded by that mask with B sequences of S
 * (no cross-attention, no KV cache); every other input is int32 [B, S] (ids, type or
 * position ids), and the output has B x S rows. 1 with *mask_tensor set, or 0 with the first
 * reason in why (n bytes). */
int exec_pack_eligible(const exec_plan *p, int *mask_tensor, char *why, size_t n);

#endif
