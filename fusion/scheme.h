/* Fusion schemes (paper §4.3, Figure 8): which neighbouring ops of a sequence
 * run as one kernel.
 *
 * A sequence is the ops of one layer in graph order, or a run of ops outside
 * layers (the embedding before the first layer, the final norm after the
 * last, the ops between T5's two stacks). A scheme gives each op of a
 * sequence one bit; neighbours with the same bit belong to one segment (one
 * kernel) and a change of bit marks a boundary:
 *
 *     ops      gemm bias | attention | gemm bias add layernorm | ...
 *     bits     0    0    | 1         | 0    0    0   0         | ...
 *
 * The bit values mean nothing by themselves (the paper: "the numbers are
 * unrelated to the operator characteristics"): a scheme and its complement
 * describe the same segmentation. fusion_scheme_canonical() picks the form
 * whose op 0 is 0, which is what fusion_scheme_from_segments() builds and
 * what a cache should key on.
 *
 * Text forms (fusion_scheme_format_*, fusion_scheme_parse):
 *   binary  one character per op, op 0 first: "0011100011".
 *   hex     "N:" then ceil(N/4) hex digits: the N bits packed most
 *           significant bit first starting from op 0, the last digit padded
 *           with zero bits. The length prefix keeps leading zeros and says
 *           how many bits of the last digit count. "0011100011" is "10:38c"
 *           (0011 1000 11|00). Parsing accepts upper- and lower-case digits;
 *           formatting writes lower case; padding bits must be zero.
 *
 * Identical layers (same op kinds, attributes, shapes and wiring) share one
 * scheme: fusion_layer_classes() maps each layer to the first layer it is
 * identical to, and fusion_sequences() gives every sequence its class. */
#ifndef STOF_FUSION_SCHEME_H
#define STOF_FUSION_SCHEME_H

#include <stddef.h>
#include <stdint.h>

#include "core/graph/graph.h"

#define FUSION_MAX_OPS 256
/* Longest text forms, terminating zero included. */
#define FUSION_SCHEME_BINARY_MAX (FUSION_MAX_OPS + 1)
#define FUSION_SCHEME_HEX_MAX (4 + FUSION_MAX_OPS / 4 + 1)

typedef struct fusion_scheme {
    int n;                                /* ops in the sequence, 0..FUSION_MAX_OPS */
    uint64_t bits[FUSION_MAX_OPS / 64];   /* op i is bit i % 64 of bits[i / 64]; bits >= n are 0 */
} fusion_scheme;

/* One segment: ops first..last (positions in the sequence, inclusive). */
typedef struct fusion_segment {
    int first, last;
} fusion_segment;

/* ---- bits --------------------------------------------------------------- */

/* n ops, all in one segment (every bit 0). n must be 0..FUSION_MAX_OPS. */
int fusion_scheme_init(fusion_scheme *s, int n, stof_error *err);
/* Every op its own segment: bits 0101... */
int fusion_scheme_all_unfused(fusion_scheme *s, int n, stof_error *err);

int fusion_scheme_get(const fusion_scheme *s, int i);
void fusion_scheme_set(fusion_scheme *s, int i, int bit);
/* Flips the bits of ops i..n-1: the boundary before op i appears or
 * disappears and every other boundary stays. The one primitive behind split,
 * merge and move. */
void fusion_scheme_flip_from(fusion_scheme *s, int i);
/* Complements the scheme when op 0 is 1 (same segmentation). */
void fusion_scheme_canonical(fusion_scheme *s);

/* Same length and bits. */
int fusion_scheme_equal(const fusion_scheme *a, const fusion_scheme *b);
/* Same length and boundaries (a scheme equals its complement here). */
int fusion_scheme_same_segments(const fusion_scheme *a, const fusion_scheme *b);

/* ---- boundaries and segments ---------------------------------------------- */

/* 1 when op i (1 <= i < n) starts a segment. */
int fusion_scheme_is_boundary(const fusion_scheme *s, int i);
int fusion_scheme_count_segments(const fusion_scheme *s);
/* The segment holding op i. */
fusion_segment fusion_scheme_segment_at(const fusion_scheme *s, int i);

/* Writes up to max segments in order; returns how many there are (like
 * snprintf, a result > max means out was too short). */
int fusion_scheme_segments(const fusion_scheme *s, fusion_segment *out, int max);
/* The canonical scheme of a segmentation: segments must be non-empty, in
 * order and cover 0..n-1 without gaps or overlaps. */
int fusion_scheme_from_segments(const fusion_segment *segs, int n_segs, int n, fusion_scheme *s,
                                stof_error *err);

/* Starts a new segment at op i (1 <= i < n); an error when one starts there. */
int fusion_scheme_split(fusion_scheme *s, int i, stof_error *err);
/* Joins the segment starting at op i with the one before it; an error when
 * no segment starts at i. */
int fusion_scheme_merge(fusion_scheme *s, int i, stof_error *err);
/* Moves the boundary at op `from` to op `to`, so one op (or several) passes
 * between the two neighbouring segments (the search's seize and compete).
 * No other boundary may lie between them and both segments keep at least
 * one op; to join them use fusion_scheme_merge. */
int fusion_scheme_move_boundary(fusion_scheme *s, int from, int to, stof_error *err);

/* ---- text ------------------------------------------------------------------- */

/* Both return the length the full text needs, like snprintf (buf may be
 * NULL when cap is 0). */
size_t fusion_scheme_format_binary(const fusion_scheme *s, char *buf, size_t cap);
size_t fusion_scheme_format_hex(const fusion_scheme *s, char *buf, size_t cap);

/* Reads either form (hex when it has a ':'). expect_n > 0 requires that many
 * ops; 0 accepts any length. On an error *s holds nothing useful. */
int fusion_scheme_parse(const char *text, int expect_n, fusion_scheme *s, stof_error *err);

/* ---- sequences of a graph (sequence.c) --------------------------------------- */

/* A layer, or a maximal run of ops outside layers (layer == -1). Ops of one
 * sequence are contiguous in graph order (m:layer cannot nest). */
typedef struct fusion_seq {
    int layer;    /* -1 for a run of ops outside layers */
    int first, n; /* graph ops first .. first + n - 1 */
    int cls;      /* index of the first sequence identical to this one (itself when
                     none is): the sequences of a class share one scheme */
} fusion_seq;

/* Writes the graph index of every op of layer `layer` (graph order), up to
 * max of them; returns how many there are. */
int fusion_layer_ops(const graph *g, int layer, int *idx, int max);
/* Cuts the graph into sequences in graph order, each its own class (cls is
 * its index); writes up to max, returns how many there are. */
int fusion_graph_sequences(const graph *g, fusion_seq *out, int max);
/* The sequences of g in graph order with their classes (malloc'd array in
 * *out, count in *n): a layer's class is the sequence of the first layer
 * identical to it (fusion_layer_classes); every run of ops outside layers
 * is a class of its own. STOF_ERR_INVALID when g has no ops. */
int fusion_sequences(const graph *g, fusion_seq **out, int *n, stof_error *err);

/* 1 when the two op sequences match position by position: kinds,
 * attributes, input and output shapes, dtypes and roles, and the same
 * wiring (an input made inside the sequence comes from the same position in
 * both; one made outside comes from outside in both), and the same ops'
 * results read outside the sequence (that decides which segments may fuse).
 * Names, and input/activation/output roles, do not count. */
int fusion_layers_identical(const graph *g, const int *a, int na, const int *b, int nb);
/* cls[L] = the first layer identical to layer L (L itself when none before
 * it is), for L < g->n_layers. */
int fusion_layer_classes(const graph *g, int *cls, stof_error *err);

#endif
