/* Run-time compilation of the embedded kernels through NVRTC, with a cache.
 *
 * A kernel is a source file of kernels/ plus options (template parameters as
 * -D constants) and a target architecture. The cubin is cached in memory and
 * on disk under a key that hashes the source, every embedded header, the
 * options, the architecture and the NVRTC version, so a second run compiles
 * nothing and any change to a kernel invalidates exactly its entries. */
#ifndef STOF_CORE_NVRTC_H
#define STOF_CORE_NVRTC_H

#include <stddef.h>
#include <stdint.h>

#include "stof.h"

#define NVRTC_MAX_OPTIONS 48

typedef struct nvrtc_request {
    const char *source;  /* file name under kernels/, e.g. "util.cu" */
    const char *arch;    /* "sm_80", "sm_90", "sm_90a" */
    const char *options[NVRTC_MAX_OPTIONS]; /* "-DBLOCK_M=64", ... */
    int n_options;
} nvrtc_request;

typedef struct nvrtc_entry {
    uint64_t key;
    void *cubin;
    size_t size;
} nvrtc_entry;

typedef struct nvrtc_cache {
    char dir[1024];      /* on-disk folder; empty = memory only */
    nvrtc_entry *entries;
    int n, cap;
    int compiled, memory_hits, disk_hits; /* statistics */
} nvrtc_cache;

/* dir NULL: $STOF_CACHE_DIR, else $XDG_CACHE_HOME/stof, else ~/.cache/stof;
 * "" disables the disk cache. The folder is created when first written. */
void nvrtc_cache_init(nvrtc_cache *c, const char *dir);
void nvrtc_cache_free(nvrtc_cache *c);

/* Compiles (or finds) the cubin; *cubin points into the cache. Errors carry
 * NVRTC's log. */
int nvrtc_get(nvrtc_cache *c, const nvrtc_request *req, const void **cubin, size_t *size,
              stof_error *err);

/* The cache key of a request (exposed for tests and plans). */
uint64_t nvrtc_key(const nvrtc_request *req);

/* "12.9" style NVRTC version, or an error when NVRTC cannot be loaded. */
int nvrtc_version(int *major, int *minor, stof_error *err);

#endif
