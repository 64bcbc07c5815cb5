/* Fuzz target: the mask text parser (ops/mask_parse.c). Whatever the text,
 * it parses or says why; what parses describes itself as text that parses
 * back to the same description, and builds at a small shape or says why. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "ops/mask.h"

const char *const fuzz_seeds[] = {
    "causal",
    "full",
    "sliding_window{band=3}",
    "dilated{band=2, dilation=1}",
    "global{width=4}",
    "random{rate=0.3, block=8, seed=7}",
    "longformer{global=2, band=5}",
    "bigbird{global=2, band=3, rate=0.2, block=4, seed=1}",
    "union(causal, global{width=1})",
    "intersect(sliding_window{band=8}, causal)",
    "per_batch(causal, full)",
    "key_padding{lengths=[5, 33]}",
    NULL};

const char *const fuzz_words[] = {"union(", "intersect(", "per_batch(", "key_padding{lengths=[",
                                  "{", "}", "(", ")", "[", "]", ",", "=", "band", "rate",
                                  "block", "seed", "global", "width", "dilation", "causal",
                                  "-1", "0", "1e308", "2147483648", "0.5", NULL};

size_t fuzz_seed_bytes(int k, uint8_t *buf, size_t cap) {
    (void)k, (void)buf, (void)cap;
    return 0;
}

static int fail(const char *what, const char *text, const char *detail) {
    fprintf(stderr, "fuzz_mask: %s for \"%s\": %s\n", what, text, detail);
    return 1;
}

int fuzz_one(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    mask_spec *s = NULL, *again = NULL;
    stof_error err = {0};
    int bad = 0;
    if (mask_spec_parse(text, &s, &err) != STOF_OK) {
        bad = err.msg[0] ? 0 : fail("an error without a message", text, "");
        bad |= s != NULL ? fail("a result left on failure", text, "") : 0;
        free(text);
        return bad;
    }
    char *d1 = mask_spec_describe(s), *d2 = NULL;
    if (d1 && mask_spec_parse(d1, &again, &err) != STOF_OK)
        bad = fail("its description does not parse", text, err.msg);
    else if (d1 && !(d2 = mask_spec_describe(again)))
        bad = 0; /* out of memory: nothing to compare */
    else if (d1 && strcmp(d1, d2) != 0)
        bad = fail("its description changes when read back", d1, d2);
    mask *m = NULL;
    if (mask_build(s, 2, 33, 47, &m, &err) == STOF_OK)
        mask_free(m);
    else if (!err.msg[0])
        bad = fail("a build error without a message", text, "");
    free(d1);
    free(d2);
    mask_spec_free(s);
    mask_spec_free(again);
    free(text);
    return bad;
}
