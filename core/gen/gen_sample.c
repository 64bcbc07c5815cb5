/* The next token from a row of logits, and the options that choose it (gen.h).
 *
 * Sampling follows transformers' order: logits / temperature, keep the top_k
 * largest, softmax, keep the smallest set of most likely tokens whose
 * probability reaches top_p, draw. The draw's uniform number is a pure
 * function of (seed, sequence, step), so a sequence's tokens do not depend on
 * the others in its batch nor on how the steps were run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/util.h"
#include "core/gen/gen.h"
#include "core/io/model_dir.h"

gen_options gen_options_default(int max_new_tokens) {
    gen_options o;
    memset(&o, 0, sizeof o);
    o.max_new_tokens = max_new_tokens;
    o.top_p = 1.0f;
    o.seed = 1;
    return o;
}

int gen_options_check(const gen_options *o, int64_t vocab, stof_error *err) {
    if (o->max_new_tokens < 1)
        return err_set(err, STOF_ERR_INVALID, "max_new_tokens must be at least 1, got %d",
                       o->max_new_tokens);
    if (!(o->temperature >= 0.0f) || !isfinite(o->temperature))
        return err_set(err, STOF_ERR_INVALID, "temperature must be >= 0 (0: greedy), got %g",
                       (double)o->temperature);
    if (o->top_k < 0)
        return err_set(err, STOF_ERR_INVALID, "top_k must be >= 0 (0: every token), got %d",
                       o->top_k);
    if (!(o->top_p > 0.0f && o->top_p <= 1.0f))
        return err_set(err, STOF_ERR_INVALID, "top_p must be in (0, 1], got %g",
                       (double)o->top_p);
    if (o->n_stop < 0 || o->n_stop > GEN_MAX_STOP)
        return err_set(err, STOF_ERR_INVALID, "at most %d stop tokens, got %d", GEN_MAX_STOP,
                       o->n_stop);
    for (int k = 0; k < o->n_stop; k++)
        if (o->stop[k] < 0 || o->stop[k] >= vocab)
            return err_set(err, STOF_ERR_INVALID, "stop token %d is outside the vocabulary "
                           "[0, %lld)", o->stop[k], (long long)vocab);
    return STOF_OK;
}

void gen_options_add_eos(gen_options *o, const char *dir) {
    model_dir md;
    stof_error err = {0};
    if (!dir[0] || model_dir_open_config(dir, &md, &err) != STOF_OK)
        return;
    o->n_stop += model_dir_eos_tokens(&md, o->stop + o->n_stop, GEN_MAX_STOP - o->n_stop);
    model_dir_free(&md);
}

static int32_t argmax(const float *row, int64_t vocab) {
    int64_t best = 0;
    for (int64_t v = 1; v < vocab; v++)
        if (row[v] > row[best])
            best = v;
    return (int32_t)best;
}

/* Whether index x goes before y: the larger key first, ties by index. */
static int before(const float *key, int32_t x, int32_t y) {
    return key[x] > key[y] || (key[x] == key[y] && x < y);
}

/* Sorts order[0..n) by decreasing key (merge sort, tmp of n ints): reentrant, unlike qsort
 * with a global key. */
static void sort_desc(const float *key, int32_t *order, int32_t *tmp, int64_t n) {
    for (int64_t width = 1; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            int64_t mid = lo + width < n ? lo + width : n;
            int64_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = before(key, order[j], order[i]) ? order[j++] : order[i++];
            while (i < mid)
                tmp[k++] = order[i++];
            while (j < hi)
                tmp[k++] = order[j++];
        }
        memcpy(order, tmp, sizeof *order * (size_t)n);
    }
}

/* The uniform number of (seed, b, t) in [0, 1). */
static double draw(uint64_t seed, int b, int t) {
    util_rng r = {util_hash(util_hash(seed, &b, sizeof b), &t, sizeof t)};
    return util_rng_double(&r);
}

int32_t gen_sample(const gen_options *o, const float *row, int64_t vocab, int b, int t,
                   float *scratch, int32_t *order) {
    if (o->temperature == 0.0f)
        return argmax(row, vocab);
    float *scaled = scratch, *prob = scratch + vocab;
    for (int64_t v = 0; v < vocab; v++) {
        scaled[v] = row[v] / o->temperature;
        order[v] = (int32_t)v;
    }
    sort_desc(scaled, order, order + vocab, vocab);
    int64_t keep = o->top_k > 0 && o->top_k < vocab ? o->top_k : vocab;
    double sum = 0.0, max = scaled[order[0]];
    for (int64_t k = 0; k < keep; k++)
        sum += prob[k] = (float)exp((double)scaled[order[k]] - max);
    /* top-p: the first tokens whose probability reaches top_p (at least one) */
    double mass = 0.0;
    int64_t n = 0;
    while (n < keep && (n == 0 || mass < (double)o->top_p * sum))
        mass += prob[n++];
    double u = draw(o->seed, b, t) * mass, acc = 0.0;
    for (int64_t k = 0; k < n; k++) {
        acc += prob[k];
        if (u < acc)
            return order[k];
    }
    return order[n - 1];
}
