#include "core/gpu/kernels.h"

#include <string.h>

const kernel_source *kernel_find(const char *name) {
    for (int i = 0; i < kernel_source_count; i++)
        if (strcmp(kernel_sources[i].name, name) == 0)
            return &kernel_sources[i];
    return NULL;
}

int kernel_is_header(const kernel_source *s) {
    size_t n = strlen(s->name);
    return n > 4 && strcmp(s->name + n - 4, ".cuh") == 0;
}
