/* The CUDA sources of kernels/, embedded in the library at build time. */
#ifndef STOF_CORE_KERNELS_H
#define STOF_CORE_KERNELS_H

#include <stddef.h>

typedef struct kernel_source {
    const char *name; /* file name under kernels/, e.g. "attention_block.cu" */
    const char *text; /* NUL-terminated */
    size_t len;
} kernel_source;

extern const kernel_source kernel_sources[];
extern const int kernel_source_count;

/* NULL when there is no such file. */
const kernel_source *kernel_find(const char *name);

/* 1 for a header (.cuh): any kernel may include it. */
int kernel_is_header(const kernel_source *s);

#endif
