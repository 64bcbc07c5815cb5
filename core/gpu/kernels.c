#include "core/gpu/kernels.h"

#include <string.h>

const kernel_source *kernel_find(const char *name) {
    for (int i = 0; i < kernel_source_count; i++)
        if (strcmp(kernel_sources[i].name, name) == 0)
            return &kernel_sources[i];
    return NULL;
}
