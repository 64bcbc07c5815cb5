/* Whole schemes: validity (every segment matches a template) and the
 * enumeration of every valid scheme of a sequence. */
#include "fusion/match.h"

#include <stdlib.h>

#include "core/base/error.h"

int fusion_scheme_validate(const graph *g, const int *ops, int n, const fusion_scheme *s,
                           fusion_report *report, stof_error *err) {
    if (s->n != n)
        return err_set(err, STOF_ERR_INVALID, "the scheme has %d ops but the sequence has %d",
                       s->n, n);
    fusion_segment segs[FUSION_MAX_OPS];
    int n_segs = fusion_scheme_segments(s, segs, FUSION_MAX_OPS);
    for (int k = 0; k < n_segs; k++) {
        fusion_match m;
        int rc = fusion_match_segment(g, ops + segs[k].first, segs[k].last - segs[k].first + 1,
                                      &m, err);
        if (rc && err)
            err_prefix(err, "scheme segment %d of %d (positions %d-%d): ", k + 1, n_segs,
                       segs[k].first, segs[k].last);
        if (rc)
            return rc;
        if (report) {
            report->segs[k] = segs[k];
            report->matches[k] = m;
        }
    }
    if (report)
        report->n_segments = n_segs;
    return STOF_OK;
}

/* ---- enumeration ----------------------------------------------------------------- */

typedef struct enum_state {
    int n;
    const unsigned char *ok; /* ok[i * n + j]: ops i..j form a valid segment */
    fusion_segment segs[FUSION_MAX_OPS];
    fusion_scheme_cb cb;
    void *ud;
    long long count;
    int stopped;
} enum_state;

/* Extends the segmentation of ops 0..from-1 (depth segments) in every valid
 * way; a complete one is reported. */
static void enum_from(enum_state *st, int from, int depth) {
    if (st->stopped)
        return;
    if (from == st->n) {
        st->count++;
        fusion_scheme s;
        fusion_scheme_from_segments(st->segs, depth, st->n, &s, NULL);
        if (st->cb && st->cb(&s, st->ud))
            st->stopped = 1;
        return;
    }
    for (int last = from; last < st->n && !st->stopped; last++) {
        if (!st->ok[from * st->n + last])
            continue;
        st->segs[depth] = (fusion_segment){from, last};
        enum_from(st, last + 1, depth + 1);
    }
}

int fusion_enumerate_valid(const graph *g, const int *ops, int n, fusion_scheme_cb cb, void *ud,
                           long long *count, stof_error *err) {
    *count = 0;
    if (n < 1 || n > FUSION_MAX_OPS)
        return err_set(err, STOF_ERR_INVALID, "a sequence holds 1 to %d ops, not %d",
                       FUSION_MAX_OPS, n);
    unsigned char *ok = err_calloc((size_t)n * (size_t)n, 1, err);
    if (!ok)
        return STOF_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        for (int j = i; j < n; j++) {
            fusion_match m;
            ok[i * n + j] = fusion_match_segment(g, ops + i, j - i + 1, &m, NULL) == STOF_OK;
        }
    }
    enum_state *st = err_malloc(sizeof *st, err);
    if (!st) {
        free(ok);
        return STOF_ERR_NOMEM;
    }
    *st = (enum_state){.n = n, .ok = ok, .cb = cb, .ud = ud};
    enum_from(st, 0, 0);
    *count = st->count;
    free(st);
    free(ok);
    return STOF_OK;
}
