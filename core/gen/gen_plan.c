/* Which decode step of a plan a generation runs (gen.h): the one tuned for its batch, when
 * the plan's caches hold the positions it needs. Shared by `stof generate PLAN.json` and the
 * C API's generate on a model with a plan. */
#include <stdio.h>

#include "core/gen/gen.h"

const plan_decode *gen_plan_step(const plan *pl, int batch, int64_t needed, char *why,
                                 size_t n) {
    const plan_decode *d = pl ? plan_decode_find(pl, batch) : NULL;
    if (d && d->context >= needed)
        return d;
    if (!why || !n)
        return NULL;
    if (!pl || !pl->n_decode) {
        snprintf(why, n, "the plan holds no decode steps (stof tune --decode-batch %d makes "
                 "one)", batch);
    } else if (!d) {
        size_t len = (size_t)snprintf(why, n, "the plan holds no decode step for a batch of %d "
                                      "(batches", batch);
        for (int i = 0; i < pl->n_decode && len < n; i++)
            len += (size_t)snprintf(why + len, n - len, "%s %d", i ? "," : "",
                                    pl->decode[i].batch);
        if (len < n)
            snprintf(why + len, n - len, "; stof tune --decode-batch %d makes one)", batch);
    } else {
        snprintf(why, n, "the plan's decode step for a batch of %d has caches of %lld positions; "
                 "these prompts and new tokens need %lld", batch, (long long)d->context,
                 (long long)needed);
    }
    return NULL;
}
