/* Fusion schemes: the bit array, its segments and its two text forms. */
#include "fusion/scheme.h"

#include <stdio.h>
#include <string.h>

#include "core/base/error.h"

/* ---- bits --------------------------------------------------------------- */

static int scheme_check_length(int n, stof_error *err) {
    if (n < 0 || n > FUSION_MAX_OPS)
        return err_set(err, STOF_ERR_INVALID, "a scheme holds 0 to %d ops, not %d",
                       FUSION_MAX_OPS, n);
    return STOF_OK;
}

int fusion_scheme_init(fusion_scheme *s, int n, stof_error *err) {
    int rc = scheme_check_length(n, err);
    if (rc)
        return rc;
    memset(s, 0, sizeof *s);
    s->n = n;
    return STOF_OK;
}

int fusion_scheme_all_unfused(fusion_scheme *s, int n, stof_error *err) {
    int rc = fusion_scheme_init(s, n, err);
    for (int i = 1; rc == STOF_OK && i < n; i += 2)
        fusion_scheme_set(s, i, 1);
    return rc;
}

int fusion_scheme_get(const fusion_scheme *s, int i) {
    return (int)((s->bits[i / 64] >> (i % 64)) & 1u);
}

void fusion_scheme_set(fusion_scheme *s, int i, int bit) {
    uint64_t m = (uint64_t)1 << (i % 64);
    if (bit)
        s->bits[i / 64] |= m;
    else
        s->bits[i / 64] &= ~m;
}

/* Word-wise, keeping bits >= n zero so equal schemes compare equal. */
void fusion_scheme_flip_from(fusion_scheme *s, int i) {
    for (int w = 0; w < FUSION_MAX_OPS / 64; w++) {
        int lo = w * 64, hi = lo + 64;
        int from = i > lo ? i : lo, to = s->n < hi ? s->n : hi;
        if (from >= to)
            continue;
        int len = to - from;
        uint64_t m = (len == 64 ? ~(uint64_t)0 : (((uint64_t)1 << len) - 1)) << (from - lo);
        s->bits[w] ^= m;
    }
}

void fusion_scheme_canonical(fusion_scheme *s) {
    if (s->n > 0 && fusion_scheme_get(s, 0))
        fusion_scheme_flip_from(s, 0);
}

int fusion_scheme_equal(const fusion_scheme *a, const fusion_scheme *b) {
    return a->n == b->n && memcmp(a->bits, b->bits, sizeof a->bits) == 0;
}

int fusion_scheme_same_segments(const fusion_scheme *a, const fusion_scheme *b) {
    fusion_scheme ca = *a, cb = *b;
    fusion_scheme_canonical(&ca);
    fusion_scheme_canonical(&cb);
    return fusion_scheme_equal(&ca, &cb);
}

/* ---- boundaries and segments ---------------------------------------------- */

int fusion_scheme_is_boundary(const fusion_scheme *s, int i) {
    return i > 0 && i < s->n && fusion_scheme_get(s, i) != fusion_scheme_get(s, i - 1);
}

int fusion_scheme_count_segments(const fusion_scheme *s) {
    return fusion_scheme_segments(s, NULL, 0);
}

fusion_segment fusion_scheme_segment_at(const fusion_scheme *s, int i) {
    fusion_segment seg = {i, i};
    while (seg.first > 0 && !fusion_scheme_is_boundary(s, seg.first))
        seg.first--;
    while (seg.last + 1 < s->n && !fusion_scheme_is_boundary(s, seg.last + 1))
        seg.last++;
    return seg;
}

int fusion_scheme_segments(const fusion_scheme *s, fusion_segment *out, int max) {
    int count = 0, first = 0;
    for (int i = 1; i <= s->n; i++) {
        if (i < s->n && !fusion_scheme_is_boundary(s, i))
            continue;
        if (count < max)
            out[count] = (fusion_segment){first, i - 1};
        count++;
        first = i;
    }
    return count;
}

int fusion_scheme_from_segments(const fusion_segment *segs, int n_segs, int n, fusion_scheme *s,
                                stof_error *err) {
    int rc = fusion_scheme_init(s, n, err);
    if (rc)
        return rc;
    int next = 0; /* the op the next segment must start at */
    for (int k = 0; k < n_segs; k++) {
        if (segs[k].first != next || segs[k].last < segs[k].first || segs[k].last >= n)
            return err_set(err, STOF_ERR_INVALID,
                           "segment %d (%d-%d) does not continue the segmentation at op %d "
                           "of %d ops", k, segs[k].first, segs[k].last, next, n);
        for (int i = segs[k].first; i <= segs[k].last; i++)
            fusion_scheme_set(s, i, k & 1);
        next = segs[k].last + 1;
    }
    if (next != n)
        return err_set(err, STOF_ERR_INVALID, "the segments cover ops 0-%d of %d", next - 1, n);
    return STOF_OK;
}

static int scheme_check_inner(const fusion_scheme *s, int i, const char *what, stof_error *err) {
    if (i < 1 || i >= s->n)
        return err_set(err, STOF_ERR_INVALID, "%s at op %d: a boundary lies at ops 1 to %d",
                       what, i, s->n - 1);
    return STOF_OK;
}

int fusion_scheme_split(fusion_scheme *s, int i, stof_error *err) {
    int rc = scheme_check_inner(s, i, "split", err);
    if (rc)
        return rc;
    if (fusion_scheme_is_boundary(s, i))
        return err_set(err, STOF_ERR_INVALID, "split at op %d: a segment already starts there", i);
    fusion_scheme_flip_from(s, i);
    return STOF_OK;
}

int fusion_scheme_merge(fusion_scheme *s, int i, stof_error *err) {
    int rc = scheme_check_inner(s, i, "merge", err);
    if (rc)
        return rc;
    if (!fusion_scheme_is_boundary(s, i))
        return err_set(err, STOF_ERR_INVALID, "merge at op %d: no segment starts there", i);
    fusion_scheme_flip_from(s, i);
    return STOF_OK;
}

int fusion_scheme_move_boundary(fusion_scheme *s, int from, int to, stof_error *err) {
    int rc = scheme_check_inner(s, from, "move", err);
    if (!rc)
        rc = scheme_check_inner(s, to, "move", err);
    if (rc)
        return rc;
    if (!fusion_scheme_is_boundary(s, from))
        return err_set(err, STOF_ERR_INVALID, "move from op %d: no segment starts there", from);
    int lo = from < to ? from : to, hi = from < to ? to : from;
    for (int i = lo + 1; i <= hi; i++)
        if (fusion_scheme_is_boundary(s, i) && i != from)
            return err_set(err, STOF_ERR_INVALID,
                           "move from op %d to %d would cross the boundary at op %d (or empty "
                           "a segment): merge instead", from, to, i);
    if (to < from && fusion_scheme_is_boundary(s, lo))
        return err_set(err, STOF_ERR_INVALID,
                       "move from op %d to %d would empty the segment starting at op %d", from,
                       to, lo);
    /* Flipping at both ends moves the boundary and keeps the rest. */
    fusion_scheme_flip_from(s, from);
    fusion_scheme_flip_from(s, to);
    return STOF_OK;
}

/* ---- text ------------------------------------------------------------------- */

/* Writes c at position at when it fits, always keeping buf terminated. */
static void text_put(char *buf, size_t cap, size_t at, char c) {
    if (at + 1 < cap) {
        buf[at] = c;
        buf[at + 1] = '\0';
    }
}

size_t fusion_scheme_format_binary(const fusion_scheme *s, char *buf, size_t cap) {
    if (cap > 0)
        buf[0] = '\0';
    for (int i = 0; i < s->n; i++)
        text_put(buf, cap, (size_t)i, (char)('0' + fusion_scheme_get(s, i)));
    return (size_t)s->n;
}

/* The hex digit of ops 4d..4d+3, op 4d the most significant bit. */
static int hex_nibble(const fusion_scheme *s, int d) {
    int v = 0;
    for (int b = 0; b < 4; b++) {
        int i = 4 * d + b;
        v = (v << 1) | (i < s->n ? fusion_scheme_get(s, i) : 0);
    }
    return v;
}

size_t fusion_scheme_format_hex(const fusion_scheme *s, char *buf, size_t cap) {
    char prefix[16];
    int plen = snprintf(prefix, sizeof prefix, "%d:", s->n);
    if (cap > 0)
        buf[0] = '\0';
    for (int i = 0; i < plen; i++)
        text_put(buf, cap, (size_t)i, prefix[i]);
    int digits = (s->n + 3) / 4;
    for (int d = 0; d < digits; d++)
        text_put(buf, cap, (size_t)(plen + d), "0123456789abcdef"[hex_nibble(s, d)]);
    return (size_t)(plen + digits);
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int parse_check_count(const char *text, size_t n, int expect_n, stof_error *err) {
    if (n < 1 || n > FUSION_MAX_OPS)
        return err_set(err, STOF_ERR_INVALID, "scheme '%.300s': %zu ops (1 to %d allowed)", text,
                       n, FUSION_MAX_OPS);
    if (expect_n > 0 && n != (size_t)expect_n)
        return err_set(err, STOF_ERR_INVALID,
                       "scheme '%.300s' has %zu ops but the sequence has %d", text, n, expect_n);
    return STOF_OK;
}

static int parse_binary(const char *text, int expect_n, fusion_scheme *s, stof_error *err) {
    size_t len = strlen(text);
    int rc = parse_check_count(text, len, expect_n, err);
    if (rc)
        return rc;
    fusion_scheme_init(s, (int)len, NULL);
    for (size_t i = 0; i < len; i++) {
        if (text[i] != '0' && text[i] != '1')
            return err_set(err, STOF_ERR_INVALID,
                           "scheme '%.300s': '%c' at position %zu is not a binary digit (0 or 1)",
                           text, text[i], i);
        fusion_scheme_set(s, (int)i, text[i] == '1');
    }
    return STOF_OK;
}

/* "N:" with N decimal, no sign, at most 4 digits. */
static int parse_hex_prefix(const char *text, const char *colon, int *n, stof_error *err) {
    int v = 0;
    if (colon == text || colon - text > 4)
        return err_set(err, STOF_ERR_INVALID,
                       "scheme '%.300s': the hex form starts with the op count (\"14:21f0\")",
                       text);
    for (const char *p = text; p < colon; p++) {
        if (*p < '0' || *p > '9')
            return err_set(err, STOF_ERR_INVALID,
                           "scheme '%.300s': the op count before ':' must be decimal", text);
        v = v * 10 + (*p - '0');
    }
    *n = v;
    return STOF_OK;
}

static int parse_hex(const char *text, const char *colon, int expect_n, fusion_scheme *s,
                     stof_error *err) {
    int n = 0;
    int rc = parse_hex_prefix(text, colon, &n, err);
    if (!rc)
        rc = parse_check_count(text, (size_t)n, expect_n, err);
    if (rc)
        return rc;
    const char *digits = colon + 1;
    size_t have = strlen(digits), need = (size_t)(n + 3) / 4;
    if (have != need)
        return err_set(err, STOF_ERR_INVALID, "scheme '%.300s': %zu hex digits for %d ops "
                       "(needs %zu)", text, have, n, need);
    fusion_scheme_init(s, n, NULL);
    for (size_t d = 0; d < need; d++) {
        int v = hex_value(digits[d]);
        if (v < 0)
            return err_set(err, STOF_ERR_INVALID,
                           "scheme '%.300s': '%c' is not a hex digit", text, digits[d]);
        for (int b = 0; b < 4; b++) {
            int i = 4 * (int)d + b, bit = (v >> (3 - b)) & 1;
            if (i < n)
                fusion_scheme_set(s, i, bit);
            else if (bit)
                return err_set(err, STOF_ERR_INVALID,
                               "scheme '%.300s': the padding bits after op %d must be 0", text,
                               n - 1);
        }
    }
    return STOF_OK;
}

int fusion_scheme_parse(const char *text, int expect_n, fusion_scheme *s, stof_error *err) {
    if (!text || !*text)
        return err_set(err, STOF_ERR_INVALID, "empty fusion scheme");
    const char *colon = strchr(text, ':');
    return colon ? parse_hex(text, colon, expect_n, s, err)
                 : parse_binary(text, expect_n, s, err);
}
