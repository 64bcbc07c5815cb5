/* The CPU reference's output of a graph with the values of src, for tests
 * that compare two ways of giving a model its values. */
#ifndef STOF_TESTS_REFERENCE_H
#define STOF_TESTS_REFERENCE_H

#include "core/io/weights.h"
#include "core/ref/ref.h"

/* The output tensor's values (malloc'd), or NULL with err set. */
static inline float *test_reference(const graph *g, const weights_source *src,
                                    stof_error *err) {
    ref_values rv;
    if (ref_values_init(g, src, &rv, err))
        return NULL;
    float *out = NULL;
    if (ref_execute(g, &rv, err) == STOF_OK) {
        out = rv.data[g->output];
        rv.data[g->output] = NULL;
    }
    ref_values_free(&rv);
    return out;
}

#endif
