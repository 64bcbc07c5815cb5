/* The next token from a row of logits, and the options that choose it (gen.h).
 *
 * Sampling follows transformers' order: logits / temperature, keep the top_k
 * largest, softmax, keep the smallest set of most likely tokens whose
 * probability reaches top_p, draw. The draw's uniform number is a pure
 * function of (seed, sequence, step), so a sequence's tokens do not depend on
 * the others in its batch nor on how the steps were run. The draw walks the
 * kept tokens from the most likely (top_k, top_p) or in vocabulary order
 * (every token), and only the kept ones are ever ordered: a heap selects them
 * (top_k), or a selection by their mass (top_p), not a sort of the vocabulary. */
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

/* A binary heap of token indices over `key`: the root is the one that goes first (max = 1) or
 * last (max = 0) by `before`. */
typedef struct heap {
    const float *key;
    int32_t *at;
    int64_t n;
    int max;
} heap;

static int above(const heap *h, int32_t x, int32_t y) {
    return h->max ? before(h->key, x, y) : before(h->key, y, x);
}

static void sift_down(heap *h, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, top = i;
        if (l < h->n && above(h, h->at[l], h->at[top]))
            top = l;
        if (r < h->n && above(h, h->at[r], h->at[top]))
            top = r;
        if (top == i)
            return;
        int32_t t = h->at[i];
        h->at[i] = h->at[top];
        h->at[top] = t;
        i = top;
    }
}

static void sift_up(heap *h, int64_t i) {
    while (i > 0 && above(h, h->at[i], h->at[(i - 1) / 2])) {
        int32_t t = h->at[i];
        h->at[i] = h->at[(i - 1) / 2];
        h->at[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static int32_t heap_pop(heap *h) {
    int32_t top = h->at[0];
    h->at[0] = h->at[--h->n];
    sift_down(h, 0);
    return top;
}

/* The keep tokens that go first, in order, into out[0..keep): a heap of the keep best so far
 * (its root the worst of them), O(vocab log keep). heap_at: keep ints. */
static void top_sorted(const float *key, int64_t vocab, int64_t keep, int32_t *heap_at,
                       int32_t *out) {
    heap h = {key, heap_at, 0, 0};
    for (int64_t v = 0; v < vocab; v++) {
        if (h.n < keep) {
            h.at[h.n++] = (int32_t)v;
            sift_up(&h, h.n - 1);
        } else if (before(key, (int32_t)v, h.at[0])) {
            h.at[0] = (int32_t)v;
            sift_down(&h, 0);
        }
    }
    for (int64_t k = keep - 1; k >= 0; k--)
        out[k] = heap_pop(&h);
}

double gen_uniform(uint64_t seed, int b, int t) {
    util_rng r = {util_hash(util_hash(seed, &b, sizeof b), &t, sizeof t)};
    return util_rng_double(&r);
}

/* The token the draw u in [0, mass) lands on, walking tokens[0..n) with their weights:
 * weight[k] for the k-th (by_token 0), or weight[tokens[k]] (by_token 1). */
static int32_t walk(const int32_t *tokens, const float *weight, int by_token, int64_t n,
                    double u) {
    double acc = 0.0;
    for (int64_t k = 0; k < n; k++) {
        acc += weight[by_token ? tokens[k] : k];
        if (u < acc)
            return tokens[k];
    }
    return tokens[n - 1];
}

/* top_k: the k best sorted, their weights in that order; the top_p prefix of them. */
static int32_t sample_top_k(const gen_options *o, const float *scaled, int64_t vocab,
                            int64_t keep, double u01, float *prob, int32_t *order) {
    int32_t *sorted = order + vocab;
    top_sorted(scaled, vocab, keep, order, sorted);
    double sum = 0.0, max = scaled[sorted[0]];
    for (int64_t k = 0; k < keep; k++)
        sum += prob[k] = (float)exp((double)scaled[sorted[k]] - max);
    double mass = 0.0;
    int64_t n = 0;
    while (n < keep && (n == 0 || mass < (double)o->top_p * sum))
        mass += prob[n++];
    return walk(sorted, prob, 0, n, u01 * mass);
}

static void swap_at(int32_t *a, int64_t i, int64_t j) {
    int32_t t = a[i];
    a[i] = a[j];
    a[j] = t;
}

/* Partitions a[lo, hi) (hi - lo >= 1) around a pivot, the median of its first, middle and last
 * tokens: those that go before it first, then it (its place returned), then the rest. */
static int64_t partition(const float *key, int32_t *a, int64_t lo, int64_t hi) {
    int64_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (before(key, a[mid], a[lo]))
        swap_at(a, mid, lo);
    if (before(key, a[last], a[lo]))
        swap_at(a, last, lo);
    if (before(key, a[mid], a[last]))
        swap_at(a, mid, last); /* the median of the three now at last */
    int64_t store = lo;
    for (int64_t i = lo; i < last; i++)
        if (before(key, a[i], a[last]))
            swap_at(a, i, store++);
    swap_at(a, store, last);
    return store;
}

/* Moves into a[0, c) the fewest tokens that go first whose weights add up to at least goal
 * (<= the weights' sum), in no particular order, and returns c: a selection by mass, O(vocab)
 * expected (quickselect), so that only those c are ever ordered. */
static int64_t select_by_mass(const float *key, const float *prob, int32_t *a, int64_t n,
                              double goal) {
    int64_t lo = 0, hi = n;
    double ahead = 0.0; /* the weights of a[0, lo): all go before a[lo, hi) */
    /* a median of three keeps random-looking rows near two passes a halving; a row made to
     * defeat it gets every token instead (the caller orders them all) */
    for (int passes = 0; lo < hi; passes++) {
        if (passes > 128)
            return n;
        int64_t m = partition(key, a, lo, hi);
        double part = 0.0;
        for (int64_t i = lo; i < m; i++)
            part += prob[a[i]];
        if (ahead + part >= goal) {
            hi = m;
            continue;
        }
        ahead += part + prob[a[m]];
        lo = m + 1;
        if (ahead >= goal)
            break;
    }
    return lo;
}

/* Every token: the weights in vocabulary order; with top_p, the most likely ones until their
 * mass reaches it: selected by mass (with a margin past the rounding of a sum in another
 * order), then popped from a heap of those alone in order, so that the kept tokens and their
 * order are what popping every token would give. */
static int32_t sample_all(const gen_options *o, const float *scaled, int64_t vocab, double u01,
                          float *prob, int32_t *order) {
    float max = scaled[0];
    for (int64_t v = 1; v < vocab; v++)
        max = scaled[v] > max ? scaled[v] : max;
    double sum = 0.0;
    for (int64_t v = 0; v < vocab; v++)
        sum += prob[v] = (float)exp((double)scaled[v] - max);
    if (o->top_p >= 1.0f) {
        for (int64_t v = 0; v < vocab; v++)
            order[v] = (int32_t)v;
        return walk(order, prob, 1, vocab, u01 * sum);
    }
    const double target = (double)o->top_p * sum, goal = target + 1e-9 * sum;
    for (int64_t v = 0; v < vocab; v++)
        order[v] = (int32_t)v;
    int64_t candidates = goal < sum ? select_by_mass(scaled, prob, order, vocab, goal) : vocab;
    int32_t *taken = order + vocab;
    double mass = 0.0;
    int64_t n = 0;
    for (int pass = 0; pass < 2; pass++) {
        heap h = {scaled, order, candidates, 1};
        for (int64_t i = candidates / 2 - 1; i >= 0; i--)
            sift_down(&h, i);
        mass = 0.0;
        n = 0;
        while (h.n > 0 && (n == 0 || mass < target)) {
            taken[n] = heap_pop(&h);
            mass += prob[taken[n++]];
        }
        if (mass >= target || candidates == vocab)
            break;
        /* not reached within the selection (it cannot, by the margin): every token */
        for (int64_t v = 0; v < vocab; v++)
            order[v] = (int32_t)v;
        candidates = vocab;
    }
    return walk(taken, prob, 1, n, u01 * mass);
}

int32_t gen_sample(const gen_options *o, const float *row, int64_t vocab, int b, int t,
                   float *scratch, int32_t *order) {
    if (o->temperature == 0.0f)
        return argmax(row, vocab);
    return gen_sample_uniform(o, row, vocab, gen_uniform(o->seed, b, t), scratch, order);
}

int32_t gen_sample_uniform(const gen_options *o, const float *row, int64_t vocab, double u01,
                           float *scratch, int32_t *order) {
    float *scaled = scratch, *prob = scratch + vocab;
    for (int64_t v = 0; v < vocab; v++)
        scaled[v] = row[v] / o->temperature;
    if (o->top_k > 0 && o->top_k < vocab)
        return sample_top_k(o, scaled, vocab, o->top_k, u01, prob, order);
    return sample_all(o, scaled, vocab, u01, prob, order);
}
