/* Run-time compilation of the embedded kernels through NVRTC, with a cache.
 *
 * A kernel is a source file of kernels/ plus options (template parameters as
 * -D constants) and a target architecture. The cubin is cached in memory and
 * on disk under a key that hashes the source, every embedded header, the
 * options, the architecture and the NVRTC version, so a second run compiles
 * nothing and any change to a kernel invalidates exactly its entries.
 *
 * The cache may be used by several threads at once (NVRTC compiles distinct
 * programs concurrently): a key asked for while another thread compiles it
 * waits for that compile instead of starting its own, and files are written
 * under a temporary name and renamed. nvrtc_submit compiles ahead of need on
 * a task pool (core/base/task_pool.h); nvrtc_get later finds the cubin, or waits
 * for the compile still under way. A compile that failed is remembered with
 * its log, in memory only. */
#ifndef STOF_CORE_NVRTC_H
#define STOF_CORE_NVRTC_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "core/base/task_pool.h"
#include "core/gpu/nvrtc_compile.h"
#include "stof.h"

/* Compiles of one kernel source: how many, and NVRTC's time for them. */
typedef struct nvrtc_source_stats {
    const char *source; /* the built-in file name (static storage) */
    int compiled;
    double compile_s;
} nvrtc_source_stats;

#define NVRTC_MAX_SOURCES 24

typedef struct nvrtc_cache {
    char dir[1024];      /* on-disk folder; empty = memory only */
    struct memo *mem;    /* the cubins in memory (NULL: out of memory, said by nvrtc_get) */
    pthread_mutex_t lock; /* the statistics and the temporary file names */
    int compiled, memory_hits, disk_hits; /* statistics */
    int failed;          /* compilations that failed */
    int ahead, ahead_used; /* cubins made by nvrtc_submit's tasks; of them asked for since */
    double compile_s;    /* NVRTC's wall time, summed over the threads that compiled */
    double get_s;        /* wall time callers spent in nvrtc_get (their compiles, disk
                            reads and waits for another thread's compile of the same key) */
    int disk_problems;   /* cached kernels that failed their check, could not be read or
                            written, a folder that could not be made or used */
    char disk_problem[1400]; /* the first of them, said in full */
    nvrtc_source_stats by_source[NVRTC_MAX_SOURCES]; /* successful compiles, per source */
    int n_sources;
    double slowest_s;    /* the slowest successful compile, and what it was: the */
    char slowest[200];   /* source's name and its -D constants (cut to fit) */
} nvrtc_cache;

/* mkdir -p: 0 when dir exists afterwards (a folder of at most 1023 bytes). */
int nvrtc_make_dirs(const char *dir);

/* dir NULL: $STOF_CACHE_DIR, else $XDG_CACHE_HOME/stof, else ~/.cache/stof;
 * "" disables the disk cache. The folder is created when first written. A
 * path too long to hold the cache's file names disables it too, with a
 * warning. */
void nvrtc_cache_init(nvrtc_cache *c, const char *dir);

/* The first problem the disk cache met (NULL when none) and, in *count when
 * not NULL, how many: work went on each time (the kernel compiled anew, or
 * kept in memory only), and the caller says so to the user. */
const char *nvrtc_cache_warning(const nvrtc_cache *c, int *count);
void nvrtc_cache_free(nvrtc_cache *c);

/* Compiles (or finds) the cubin; *cubin points into the cache and stays
 * valid until nvrtc_cache_free. Errors carry NVRTC's log. */
int nvrtc_get(nvrtc_cache *c, const nvrtc_request *req, const void **cubin, size_t *size,
              stof_error *err);

/* Queues the compile of req (copied) on pool with tag (task_pool_submit),
 * unless the cache holds it or a compile of it is under way: it lands in the
 * memory and disk caches. Its failure is not reported here (nvrtc_get
 * answers it). The cache must outlive the queued task: drop or wait for the
 * pool's tasks before freeing it. Errors: STOF_ERR_INVALID for a malformed
 * request, STOF_ERR_NOMEM. */
int nvrtc_submit(task_pool *pool, int tag, nvrtc_cache *c, const nvrtc_request *req,
                 stof_error *err);

/* The cache key of a request (exposed for tests and plans). */
uint64_t nvrtc_key(const nvrtc_request *req);

#endif
