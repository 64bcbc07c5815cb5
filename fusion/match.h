/* Matching segments to templates (paper §4.3 "graph matching"), scheme
 * validity and, for tests and the search, the enumeration of every valid
 * scheme of a sequence.
 *
 * A segment can be fused when, besides some template accepting its op kinds:
 *   - it holds at most two compute-intensive ops (paper §4.4);
 *   - its ops form a chain: each op after the first reads the output of the
 *     op before it (a GEMM as its activation operand, not its weight); other
 *     inputs come from outside the segment (weights, the residual);
 *   - a norm closes it (a norm needs whole rows: nothing can follow it in
 *     the same kernel);
 *   - no result but the last is read outside the segment, or is the model
 *     output: fusing keeps intermediates on chip and would drop it. The one
 *     exception is the input of a closing norm, which templates flagged
 *     FUSION_TF_STORES_PRE_NORM also write out (the residual stream of
 *     pre-norm models: GPT-2, T5).
 * Ops are named in messages by their graph index, "#12 (add)". */
#ifndef STOF_FUSION_MATCH_H
#define STOF_FUSION_MATCH_H

#include "fusion/scheme.h"
#include "fusion/templates.h"

typedef enum fusion_act {
    FUSION_ACT_NONE = 0,
    FUSION_ACT_GELU,      /* erf */
    FUSION_ACT_GELU_TANH,
    FUSION_ACT_RELU
} fusion_act;

typedef enum fusion_norm {
    FUSION_NORM_NONE = 0,
    FUSION_NORM_LAYERNORM,
    FUSION_NORM_RMSNORM
} fusion_norm;

/* The MI ops that follow a CI op (or open an MI chain). */
typedef struct fusion_epilogue {
    int has_bias;
    fusion_act act;
    int has_residual; /* an add of a tensor made outside the segment */
    fusion_norm norm;
} fusion_epilogue;

typedef struct fusion_match {
    unsigned templates;     /* bit t set: template t implements the segment */
    int n_ci;
    /* epi[0]: after the first CI op (an MI chain: its own ops); epi[1]: after
     * the second CI op. */
    fusion_epilogue epi[2];
    int store_pre_norm;     /* the closing norm's input must be written too */
    fusion_norm prologue;   /* a norm ahead of the GEMM (the segment's first op, its output
                               read by the GEMM alone): gemv normalizes each row of x itself */
    fusion_dims dims;
} fusion_match;

/* Matches the segment ops[0..n-1] (graph indices, in order). STOF_OK with
 * *out filled, or STOF_ERR_INVALID saying why it cannot be one kernel. */
int fusion_match_segment(const graph *g, const int *ops, int n, fusion_match *out,
                         stof_error *err);
int fusion_match_has(const fusion_match *m, fusion_template_id t);
int fusion_match_count(const fusion_match *m);

/* ---- schemes (validate.c) ------------------------------------------------------- */

typedef struct fusion_report {
    int n_segments;
    fusion_segment segs[FUSION_MAX_OPS];  /* positions in the sequence */
    fusion_match matches[FUSION_MAX_OPS];
} fusion_report;

/* Every segment of scheme s over the sequence ops[0..n-1] matches a template.
 * report (may be NULL) gets the segments and their matches; an invalid
 * scheme gives STOF_ERR_INVALID naming the segment, its ops and the reason. */
int fusion_scheme_validate(const graph *g, const int *ops, int n, const fusion_scheme *s,
                           fusion_report *report, stof_error *err);

/* Called with each valid scheme (canonical form); a non-zero return stops
 * the enumeration. */
typedef int (*fusion_scheme_cb)(const fusion_scheme *s, void *ud);

/* Calls cb (may be NULL) for every valid scheme of ops[0..n-1], in order of
 * increasing first-segment length, and counts them in *count. Every segment
 * is matched once, so a sequence of n ops costs n^2/2 matches however many
 * schemes it has; the number of schemes itself can grow as 2^(n-1), so long
 * sequences should stop through cb. */
int fusion_enumerate_valid(const graph *g, const int *ops, int n, fusion_scheme_cb cb, void *ud,
                           long long *count, stof_error *err);

#endif
