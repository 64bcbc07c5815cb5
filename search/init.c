/* The rule-based initial scheme (paper §4.4, "initialization"): expert
 * knowledge that starts stage 1 close to a good scheme instead of from all
 * 2^(n-1) segmentations.
 *
 * The rules run in priority order over the sequence; each takes only ops no
 * earlier rule took, and keeps a segment only when it matches a template and
 * some setting of it fits the device (search_match_feasible):
 *   1. CI+CI chains, gemm [bias] [act] gemm [bias], as one gemm_chain
 *      segment, when the GEMMs have at most chain_max_tokens rows (paper §3:
 *      the mix pays at small batch x sequence).
 *   2. A GEMM with its epilogue: the bias and activation after it.
 *   3. MI chains: runs of the remaining MI ops, longest valid first
 *      (bias + add + norm, the residual tail of a block).
 *   4. Everything else alone: attention, embeddings, GEMMs whose epilogue
 *      could not join them.
 * A bias followed by an add opens a residual chain: rules 1 and 2 leave it
 * to rule 3, so that "bias add layernorm" stays one MI kernel and stage 1's
 * seize decides whether the GEMM before it should take the bias. */
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "fusion/match.h"
#include "ops/ops.h"
#include "search/search_internal.h"

typedef struct init_state {
    const graph *g;
    const int *ops;
    int n;
    int chain_max_tokens;
    int smem;
    unsigned char taken[FUSION_MAX_OPS];
    fusion_segment segs[FUSION_MAX_OPS];
    int n_segs;
} init_state;

static op_kind kind_at(const init_state *st, int i) {
    return st->g->ops[st->ops[i]].kind;
}

static int is_ci_at(const init_state *st, int i) {
    return op_describe(kind_at(st, i))->cls == OP_CLASS_CI;
}

/* Positions first..last form a segment that can run: it matches (with
 * template `need` among its matches when need >= 0) and some setting fits. */
static int span_ok(const init_state *st, int first, int last, int need, fusion_match *m) {
    for (int i = first; i <= last; i++)
        if (st->taken[i])
            return 0;
    if (fusion_match_segment(st->g, st->ops + first, last - first + 1, m, NULL) != STOF_OK)
        return 0;
    if (need >= 0 && !fusion_match_has(m, (fusion_template_id)need))
        return 0;
    return search_match_feasible(m, st->smem);
}

static void take(init_state *st, int first, int last) {
    for (int i = first; i <= last; i++)
        st->taken[i] = 1;
    st->segs[st->n_segs++] = (fusion_segment){first, last};
}

/* The last position of the epilogue after the CI op at i: following bias and
 * activation ops, stopping before a bias that an add follows. */
static int epilogue_end(const init_state *st, int i) {
    int end = i;
    while (end + 1 < st->n && !st->taken[end + 1]) {
        op_kind k = kind_at(st, end + 1);
        int act = k == OP_GELU || k == OP_RELU;
        int residual_bias = k == OP_BIAS && end + 2 < st->n && kind_at(st, end + 2) == OP_ADD;
        if (!(act || (k == OP_BIAS && !residual_bias)))
            break;
        end++;
    }
    return end;
}

/* Rule 1 at the GEMM at position i. */
static void rule_chain(init_state *st, int i) {
    int second = epilogue_end(st, i) + 1;
    if (second >= st->n || st->taken[second] || kind_at(st, second) != OP_GEMM)
        return;
    fusion_match m;
    for (int end = epilogue_end(st, second); end >= second; end--) {
        if (span_ok(st, i, end, FUSION_T_GEMM_CHAIN, &m) && m.n_ci == 2 &&
            m.dims.m <= st->chain_max_tokens) {
            take(st, i, end);
            return;
        }
    }
}

/* Rule 2 at the GEMM at position i: the longest epilogue that still runs. */
static void rule_epilogue(init_state *st, int i) {
    fusion_match m;
    for (int end = epilogue_end(st, i); end > i; end--) {
        if (span_ok(st, i, end, -1, &m)) {
            take(st, i, end);
            return;
        }
    }
}

/* Rule 3 from position i: the longest valid run of untaken MI ops. */
static void rule_mi_chain(init_state *st, int i) {
    int end = i;
    while (end + 1 < st->n && !st->taken[end + 1] && !is_ci_at(st, end + 1))
        end++;
    fusion_match m;
    for (; end > i; end--) {
        if (span_ok(st, i, end, -1, &m)) {
            take(st, i, end);
            return;
        }
    }
}

static void apply_rules(init_state *st) {
    for (int i = 0; st->chain_max_tokens > 0 && i < st->n; i++)
        if (!st->taken[i] && kind_at(st, i) == OP_GEMM)
            rule_chain(st, i);
    for (int i = 0; i < st->n; i++)
        if (!st->taken[i] && kind_at(st, i) == OP_GEMM)
            rule_epilogue(st, i);
    for (int i = 0; i < st->n; i++)
        if (!st->taken[i] && !is_ci_at(st, i))
            rule_mi_chain(st, i);
    for (int i = 0; i < st->n; i++)
        if (!st->taken[i])
            take(st, i, i);
}

/* The rules find segments out of order; a scheme wants them sorted. */
static void sort_segments(fusion_segment *segs, int n) {
    for (int i = 1; i < n; i++) {
        fusion_segment s = segs[i];
        int j = i;
        for (; j > 0 && segs[j - 1].first > s.first; j--)
            segs[j] = segs[j - 1];
        segs[j] = s;
    }
}

int search_initial_scheme(const graph *g, const int *ops, int n, const search_rules *rules,
                          fusion_scheme *out, stof_error *err) {
    if (n < 1 || n > FUSION_MAX_OPS)
        return err_set(err, STOF_ERR_INVALID, "a sequence of %d ops (1 to %d allowed)", n,
                       FUSION_MAX_OPS);
    init_state *st = err_calloc(1, sizeof *st, err);
    if (!st)
        return STOF_ERR_NOMEM;
    int tokens = rules && rules->chain_max_tokens ? rules->chain_max_tokens
                                                   : SEARCH_CHAIN_MAX_TOKENS;
    st->g = g;
    st->ops = ops;
    st->n = n;
    st->chain_max_tokens = tokens;
    st->smem = rules && rules->smem_limit > 0 ? rules->smem_limit : SEARCH_DEFAULT_SMEM;
    apply_rules(st);
    sort_segments(st->segs, st->n_segs);
    int rc = fusion_scheme_from_segments(st->segs, st->n_segs, n, out, err);
    /* The rules only build matched segments, so this is a safety net: the
     * all-unfused scheme is always valid. */
    if (rc || fusion_scheme_validate(g, ops, n, out, NULL, NULL) != STOF_OK)
        rc = fusion_scheme_all_unfused(out, n, err);
    free(st);
    return rc;
}
