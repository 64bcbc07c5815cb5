/* The text form of mask patterns, both ways:
 *
 *   spec   := name [ '{' [ key '=' value { ',' key '=' value } ] '}' ]
 *           | ( "union" | "intersect" | "per_batch" ) '(' spec { ',' spec } ')'
 *   value  := token | '[' token { ',' token } ']'
 *
 * One table (mask_keys) says which keys each pattern takes, in the order
 * describe writes them; parse and describe both read it. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "ops/mask.h"

typedef enum mask_field {
    MASK_F_BAND,
    MASK_F_DILATION,
    MASK_F_GLOBAL,
    MASK_F_BLOCK,
    MASK_F_RATE,
    MASK_F_SEED,
    MASK_F_LENGTHS
} mask_field;

typedef struct mask_key {
    mask_kind kind;
    const char *key;
    mask_field field;
} mask_key;

static const mask_key mask_keys[] = {
    {MASK_SLIDING, "band", MASK_F_BAND},
    {MASK_DILATED, "band", MASK_F_BAND},
    {MASK_DILATED, "dilation", MASK_F_DILATION},
    {MASK_GLOBAL, "width", MASK_F_GLOBAL},
    {MASK_RANDOM, "rate", MASK_F_RATE},
    {MASK_RANDOM, "block", MASK_F_BLOCK},
    {MASK_RANDOM, "seed", MASK_F_SEED},
    {MASK_LONGFORMER, "global", MASK_F_GLOBAL},
    {MASK_LONGFORMER, "band", MASK_F_BAND},
    {MASK_BIGBIRD, "global", MASK_F_GLOBAL},
    {MASK_BIGBIRD, "band", MASK_F_BAND},
    {MASK_BIGBIRD, "rate", MASK_F_RATE},
    {MASK_BIGBIRD, "block", MASK_F_BLOCK},
    {MASK_BIGBIRD, "seed", MASK_F_SEED},
    {MASK_KEY_PADDING, "lengths", MASK_F_LENGTHS},
};
#define MASK_N_KEYS ((int)(sizeof mask_keys / sizeof mask_keys[0]))

static int mask_is_combinator(mask_kind k) {
    return k == MASK_UNION || k == MASK_INTERSECT || k == MASK_PER_BATCH;
}

/* ---- a growing string ----------------------------------------------------- */

typedef struct mask_str {
    char *s;
    size_t len, cap;
    int oom;
} mask_str;

static void mask_str_addf(mask_str *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void mask_str_addf(mask_str *b, const char *fmt, ...) {
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 64;
        while (cap <= b->len + (size_t)n)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

/* ---- describe ------------------------------------------------------------- */

/* Shortest text that reads back to the same double. */
static void mask_str_add_double(mask_str *b, double v) {
    char text[40];
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, v);
        if (strtod(text, NULL) == v)
            break;
    }
    mask_str_addf(b, "%s", text);
}

static int mask_field_is_set(const mask_spec *s, mask_field f) {
    switch (f) {
    case MASK_F_BAND: return s->band != 0;
    case MASK_F_DILATION: return s->dilation != 0;
    case MASK_F_GLOBAL: return s->global != 0;
    case MASK_F_BLOCK: return s->block != 0;
    case MASK_F_RATE: return s->rate != 0.0;
    case MASK_F_SEED: return s->seed != 0;
    case MASK_F_LENGTHS: return s->n_lengths > 0 && s->lengths;
    }
    return 0;
}

static void mask_describe_field(mask_str *b, const mask_spec *s, mask_field f) {
    switch (f) {
    case MASK_F_BAND: mask_str_addf(b, "%d", s->band); break;
    case MASK_F_DILATION: mask_str_addf(b, "%d", s->dilation); break;
    case MASK_F_GLOBAL: mask_str_addf(b, "%d", s->global); break;
    case MASK_F_BLOCK: mask_str_addf(b, "%d", s->block); break;
    case MASK_F_RATE: mask_str_add_double(b, s->rate); break;
    case MASK_F_SEED: mask_str_addf(b, "%llu", (unsigned long long)s->seed); break;
    case MASK_F_LENGTHS:
        mask_str_addf(b, "[");
        for (int i = 0; i < s->n_lengths; i++)
            mask_str_addf(b, "%s%d", i ? "," : "", s->lengths[i]);
        mask_str_addf(b, "]");
        break;
    }
}

static void mask_describe_into(mask_str *b, const mask_spec *s) {
    if (!s) {
        mask_str_addf(b, "null");
        return;
    }
    mask_str_addf(b, "%s", mask_kind_name(s->kind));
    if (mask_is_combinator(s->kind)) {
        mask_str_addf(b, "(");
        for (int c = 0; c < s->n_children; c++) {
            mask_str_addf(b, "%s", c ? ", " : "");
            mask_describe_into(b, s->children[c]);
        }
        mask_str_addf(b, ")");
        return;
    }
    if (s->kind == MASK_PREDICATE) {
        mask_str_addf(b, "{name=%s}", s->pred_name ? s->pred_name : "?");
        return;
    }
    int written = 0;
    for (int k = 0; k < MASK_N_KEYS; k++) {
        if (mask_keys[k].kind != s->kind || !mask_field_is_set(s, mask_keys[k].field))
            continue;
        mask_str_addf(b, "%s%s=", written ? ", " : "{", mask_keys[k].key);
        mask_describe_field(b, s, mask_keys[k].field);
        written++;
    }
    if (written)
        mask_str_addf(b, "}");
}

char *mask_spec_describe(const mask_spec *s) {
    mask_str b = {0};
    mask_describe_into(&b, s);
    if (b.oom || !b.s) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

/* ---- parse ---------------------------------------------------------------- */

typedef struct mask_parser {
    const char *text;
    const char *p;
    stof_error *err;
} mask_parser;

static int mask_parse_fail(mask_parser *ps, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Every parse error says what is wrong, where, and quotes the text. */
static int mask_parse_fail(mask_parser *ps, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    size_t len = strlen(ps->text);
    return err_set(ps->err, STOF_ERR_INVALID, "mask pattern \"%.200s%s\": %s (at offset %d)",
                   ps->text, len > 200 ? "..." : "", what, (int)(ps->p - ps->text));
}

static void mask_skip_space(mask_parser *ps) {
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')
        ps->p++;
}

/* Skips spaces, then consumes c if it is next. */
static int mask_accept(mask_parser *ps, char c) {
    mask_skip_space(ps);
    if (*ps->p != c)
        return 0;
    ps->p++;
    return 1;
}

static int mask_is_word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '.' || c == '+' || c == '-';
}

/* A name or a value: a run of word characters, copied into buf. */
static int mask_read_word(mask_parser *ps, char *buf, size_t cap) {
    mask_skip_space(ps);
    size_t n = 0;
    while (mask_is_word_char(ps->p[n]))
        n++;
    if (n >= cap)
        return mask_parse_fail(ps, "'%.*s...' is too long", 20, ps->p);
    memcpy(buf, ps->p, n);
    buf[n] = '\0';
    ps->p += n;
    return STOF_OK;
}

static int mask_expect(mask_parser *ps, char c, const char *what) {
    if (mask_accept(ps, c))
        return STOF_OK;
    if (*ps->p == '\0')
        return mask_parse_fail(ps, "expected '%c' %s, but the text ended", c, what);
    return mask_parse_fail(ps, "expected '%c' %s, got '%c'", c, what, *ps->p);
}

static void mask_list_names(char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (int k = 0; k < MASK_KIND_COUNT && n < cap; k++)
        if (k != MASK_PREDICATE)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "",
                                  mask_kind_name((mask_kind)k));
}

static void mask_list_keys(mask_kind kind, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (int k = 0; k < MASK_N_KEYS && n < cap; k++)
        if (mask_keys[k].kind == kind)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", mask_keys[k].key);
}

/* Integers in [0, INT_MAX]; values are checked further by mask_spec_validate. */
static int mask_parse_int(mask_parser *ps, const char *pattern, const char *key,
                          const char *tok, int *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(tok, &end, 10);
    if (!*tok || *end || errno == ERANGE || v < INT_MIN || v > INT_MAX)
        return mask_parse_fail(ps, "%s: %s needs an integer, got '%s'", pattern, key, tok);
    *out = (int)v;
    return STOF_OK;
}

static int mask_parse_value(mask_parser *ps, mask_spec *s, const mask_key *k) {
    char tok[64];
    const char *name = mask_kind_name(s->kind);
    int rc = mask_read_word(ps, tok, sizeof tok);
    if (rc != STOF_OK)
        return rc;
    if (!tok[0])
        return mask_parse_fail(ps, "%s: %s needs a value", name, k->key);
    char *end = NULL;
    errno = 0;
    switch (k->field) {
    case MASK_F_BAND: return mask_parse_int(ps, name, k->key, tok, &s->band);
    case MASK_F_DILATION: return mask_parse_int(ps, name, k->key, tok, &s->dilation);
    case MASK_F_GLOBAL: return mask_parse_int(ps, name, k->key, tok, &s->global);
    case MASK_F_BLOCK: return mask_parse_int(ps, name, k->key, tok, &s->block);
    case MASK_F_RATE:
        s->rate = strtod(tok, &end);
        if (*end || errno == ERANGE)
            return mask_parse_fail(ps, "%s: rate needs a number, got '%s'", name, tok);
        return STOF_OK;
    case MASK_F_SEED:
        s->seed = strtoull(tok, &end, 10);
        if (*end || errno == ERANGE || tok[0] == '-' || tok[0] == '+')
            return mask_parse_fail(ps, "%s: seed needs an unsigned integer, got '%s'", name, tok);
        return STOF_OK;
    case MASK_F_LENGTHS: break;
    }
    return mask_parse_fail(ps, "%s: %s takes a list like [5, 7, 3]", name, k->key);
}

static int mask_parse_lengths(mask_parser *ps, mask_spec *s) {
    int cap = 0;
    for (;;) {
        char tok[64];
        int v = 0, rc = mask_read_word(ps, tok, sizeof tok);
        if (rc == STOF_OK && !tok[0])
            rc = mask_parse_fail(ps, "key_padding: lengths needs a number here");
        if (rc == STOF_OK)
            rc = mask_parse_int(ps, "key_padding", "lengths", tok, &v);
        if (rc == STOF_OK && s->n_lengths >= MASK_MAX_LEN)
            rc = mask_parse_fail(ps, "key_padding: more than %d lengths", MASK_MAX_LEN);
        if (rc != STOF_OK)
            return rc;
        if (s->n_lengths == cap) {
            cap = cap ? 2 * cap : 8;
            int *l = realloc(s->lengths, (size_t)cap * sizeof *l);
            if (!l)
                return err_set(ps->err, STOF_ERR_NOMEM, "out of host memory (mask lengths)");
            s->lengths = l;
        }
        s->lengths[s->n_lengths++] = v;
        if (!mask_accept(ps, ','))
            return mask_expect(ps, ']', "to close the lengths list");
    }
}

static const mask_key *mask_find_key(mask_kind kind, const char *key) {
    for (int k = 0; k < MASK_N_KEYS; k++)
        if (mask_keys[k].kind == kind && strcmp(mask_keys[k].key, key) == 0)
            return &mask_keys[k];
    return NULL;
}

static int mask_parse_param(mask_parser *ps, mask_spec *s, unsigned *seen) {
    char key[64];
    const char *name = mask_kind_name(s->kind);
    int rc = mask_read_word(ps, key, sizeof key);
    if (rc != STOF_OK)
        return rc;
    if (!key[0])
        return mask_parse_fail(ps, "%s: expected a key=value parameter", name);
    const mask_key *k = mask_find_key(s->kind, key);
    if (!k) {
        char keys[256];
        mask_list_keys(s->kind, keys, sizeof keys);
        if (!keys[0])
            return mask_parse_fail(ps, "%s: unknown key '%s' (%s takes no parameters)", name,
                                   key, name);
        return mask_parse_fail(ps, "%s: unknown key '%s' (accepted: %s)", name, key, keys);
    }
    if (*seen & (1u << k->field))
        return mask_parse_fail(ps, "%s: key '%s' given twice", name, key);
    *seen |= 1u << k->field;
    if ((rc = mask_expect(ps, '=', "after the key")) != STOF_OK)
        return rc;
    if (k->field == MASK_F_LENGTHS) {
        if ((rc = mask_expect(ps, '[', "to open the lengths list")) != STOF_OK)
            return rc;
        return mask_parse_lengths(ps, s);
    }
    return mask_parse_value(ps, s, k);
}

static int mask_parse_params(mask_parser *ps, mask_spec *s) {
    unsigned seen = 0;
    if (!mask_accept(ps, '{'))
        return STOF_OK;
    if (!mask_accept(ps, '}')) {
        do {
            int rc = mask_parse_param(ps, s, &seen);
            if (rc != STOF_OK)
                return rc;
        } while (mask_accept(ps, ','));
        int rc = mask_expect(ps, '}', "to close the parameters");
        if (rc != STOF_OK)
            return rc;
    }
    if (s->kind == MASK_KEY_PADDING && s->n_lengths == 0)
        return mask_parse_fail(ps, "key_padding needs lengths=[...]");
    return mask_spec_validate(s, ps->err);
}

static int mask_parse_spec(mask_parser *ps, int depth, mask_spec **out);

static int mask_parse_children(mask_parser *ps, mask_spec *s, int depth) {
    const char *name = mask_kind_name(s->kind);
    if (mask_accept(ps, ')'))
        return mask_parse_fail(ps, "%s() needs at least one pattern", name);
    int cap = 0;
    do {
        if (s->n_children == cap) {
            cap = cap ? 2 * cap : 4;
            mask_spec **c = realloc(s->children, (size_t)cap * sizeof *c);
            if (!c)
                return err_set(ps->err, STOF_ERR_NOMEM, "out of host memory (mask children)");
            s->children = c;
        }
        mask_spec *child = NULL;
        int rc = mask_parse_spec(ps, depth + 1, &child);
        if (rc != STOF_OK)
            return rc;
        s->children[s->n_children++] = child;
    } while (mask_accept(ps, ','));
    return mask_expect(ps, ')', "to close the list of patterns");
}

static int mask_kind_from_name(const char *name) {
    for (int k = 0; k < MASK_KIND_COUNT; k++)
        if (strcmp(name, mask_kind_name((mask_kind)k)) == 0)
            return k;
    return -1;
}

static int mask_parse_body(mask_parser *ps, mask_spec *s, int depth) {
    const char *name = mask_kind_name(s->kind);
    mask_skip_space(ps);
    if (mask_is_combinator(s->kind)) {
        if (*ps->p != '(')
            return mask_parse_fail(ps, "%s takes patterns in parentheses: %s(a, b, ...)", name,
                                   name);
        ps->p++;
        return mask_parse_children(ps, s, depth);
    }
    if (*ps->p == '(')
        return mask_parse_fail(ps, "%s takes {key=value} parameters, not (...)", name);
    return mask_parse_params(ps, s);
}

static int mask_parse_spec(mask_parser *ps, int depth, mask_spec **out) {
    if (depth > MASK_MAX_DEPTH)
        return mask_parse_fail(ps, "nested deeper than %d levels", MASK_MAX_DEPTH);
    char name[64];
    int rc = mask_read_word(ps, name, sizeof name);
    if (rc != STOF_OK)
        return rc;
    int kind = name[0] ? mask_kind_from_name(name) : -1;
    if (kind == MASK_PREDICATE)
        return mask_parse_fail(ps, "predicate masks have no text form: build them in code");
    if (kind < 0) {
        char names[512];
        mask_list_names(names, sizeof names);
        if (!name[0])
            return mask_parse_fail(ps, "expected a pattern name (one of: %s)", names);
        return mask_parse_fail(ps, "unknown mask pattern '%s' (accepted: %s)", name, names);
    }
    mask_spec *s = mask_spec_new((mask_kind)kind);
    if (!s)
        return err_set(ps->err, STOF_ERR_NOMEM, "out of host memory (mask pattern)");
    rc = mask_parse_body(ps, s, depth);
    if (rc != STOF_OK) {
        mask_spec_free(s);
        return rc;
    }
    *out = s;
    return STOF_OK;
}

int mask_spec_parse(const char *text, mask_spec **out, stof_error *err) {
    if (!text || !out)
        return err_set(err, STOF_ERR_INVALID, "mask_spec_parse: text and out must not be NULL");
    *out = NULL;
    mask_parser ps = {text, text, err};
    mask_spec *s = NULL;
    int rc = mask_parse_spec(&ps, 0, &s);
    if (rc != STOF_OK)
        return rc;
    mask_skip_space(&ps);
    if (*ps.p != '\0') {
        rc = mask_parse_fail(&ps, "unexpected '%c' after the pattern", *ps.p);
        mask_spec_free(s);
        return rc;
    }
    *out = s;
    return STOF_OK;
}
