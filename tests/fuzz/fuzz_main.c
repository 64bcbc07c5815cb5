/* The fuzz driver without libFuzzer: mutations of the target's seeds from a
 * fixed random stream, so a failing input is found again by the same
 * command. Mutations: bit flips, random bytes, insertions, deletions,
 * repeats of a range, splices of the target's words, truncation.
 *
 *   fuzz_NAME [--iterations N] [--seed S] [FILE...]
 *
 * FILEs are run as they are (a crash reproducer, a corpus) before the
 * mutations; a failing input is written to fuzz-NAME-failure.bin. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

#define FUZZ_MAX 4096
#define FUZZ_MAX_SEEDS 64

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t next(rng *r) {
    uint64_t x = (r->s += 0x9e3779b97f4a7c15ULL);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static size_t below(rng *r, size_t n) {
    return n ? (size_t)(next(r) % n) : 0;
}

typedef struct input {
    uint8_t b[FUZZ_MAX];
    size_t n;
} input;

static void insert(input *in, size_t at, const uint8_t *src, size_t n) {
    if (in->n + n > FUZZ_MAX)
        n = FUZZ_MAX - in->n;
    memmove(in->b + at + n, in->b + at, in->n - at);
    memcpy(in->b + at, src, n);
    in->n += n;
}

static void mutate(input *in, rng *r) {
    int steps = 1 + (int)below(r, 8);
    for (int s = 0; s < steps; s++) {
        size_t at = below(r, in->n + 1);
        switch (below(r, 7)) {
        case 0: /* flip a bit */
            if (in->n)
                in->b[below(r, in->n)] ^= (uint8_t)(1u << below(r, 8));
            break;
        case 1: /* a random byte */
            if (in->n)
                in->b[below(r, in->n)] = (uint8_t)next(r);
            break;
        case 2: { /* insert random bytes */
            uint8_t tmp[8];
            size_t n = 1 + below(r, sizeof tmp);
            for (size_t k = 0; k < n; k++)
                tmp[k] = (uint8_t)next(r);
            insert(in, at, tmp, n);
            break;
        }
        case 3: { /* delete a range */
            size_t n = below(r, in->n - at + 1);
            memmove(in->b + at, in->b + at + n, in->n - at - n);
            in->n -= n;
            break;
        }
        case 4: { /* repeat a range */
            if (!in->n)
                break;
            size_t from = below(r, in->n), n = 1 + below(r, in->n - from);
            uint8_t tmp[FUZZ_MAX];
            memcpy(tmp, in->b + from, n);
            insert(in, at, tmp, n);
            break;
        }
        case 5: { /* a word of the target's */
            int count = 0;
            while (fuzz_words[count])
                count++;
            if (count) {
                const char *w = fuzz_words[below(r, (size_t)count)];
                insert(in, at, (const uint8_t *)w, strlen(w));
            }
            break;
        }
        default: /* truncate */
            in->n = at;
        }
    }
}

static int run(const char *name, const input *in) {
    /* A private copy, exactly the size: reads past the end are caught. */
    uint8_t *copy = malloc(in->n ? in->n : 1);
    if (!copy)
        return 1;
    memcpy(copy, in->b, in->n);
    int bad = fuzz_one(copy, in->n);
    free(copy);
    if (bad) {
        char path[128];
        snprintf(path, sizeof path, "fuzz-%s-failure.bin", name);
        FILE *f = fopen(path, "wb");
        if (f) {
            fwrite(in->b, 1, in->n, f);
            fclose(f);
        }
        fprintf(stderr, "%s: a failing input (%zu bytes) is in %s\n", name, in->n, path);
    }
    return bad;
}

static int load_seeds(input *seeds) {
    int n = 0;
    for (int k = 0; fuzz_seeds[k] && n < FUZZ_MAX_SEEDS; k++, n++) {
        seeds[n].n = strlen(fuzz_seeds[k]) < FUZZ_MAX ? strlen(fuzz_seeds[k]) : FUZZ_MAX;
        memcpy(seeds[n].b, fuzz_seeds[k], seeds[n].n);
    }
    for (int k = 0; n < FUZZ_MAX_SEEDS; k++, n++)
        if (!(seeds[n].n = fuzz_seed_bytes(k, seeds[n].b, FUZZ_MAX)))
            break;
    return n;
}

int main(int argc, char **argv) {
    const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    long iterations = 2000;
    uint64_t seed = 1;
    static input in, seeds[FUZZ_MAX_SEEDS];
    int failed = 0, ran = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
            iterations = strtol(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 10);
        } else {
            FILE *f = fopen(argv[i], "rb");
            if (!f) {
                fprintf(stderr, "%s: cannot read %s\n", name, argv[i]);
                return 2;
            }
            in.n = fread(in.b, 1, FUZZ_MAX, f);
            fclose(f);
            failed += run(name, &in);
            ran++;
        }
    }
    int n_seeds = load_seeds(seeds);
    for (int k = 0; k < n_seeds; k++, ran++)
        failed += run(name, &seeds[k]);
    rng r = {seed};
    for (long i = 0; i < iterations && n_seeds > 0 && failed == 0; i++, ran++) {
        in = seeds[below(&r, (size_t)n_seeds)];
        mutate(&in, &r);
        failed += run(name, &in);
    }
    printf("%s: %d passed, %d failed\n", name, ran - failed, failed);
    return failed ? 1 : 0;
}
