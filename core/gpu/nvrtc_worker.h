/* Compiling kernels in helper processes.
 *
 * NVRTC serializes nvrtcCompileProgram within a process: 48 compiles of one
 * kernel take the same wall time on 1 thread and on 16 (measured on a
 * 16-core Xeon host, NVRTC 13.0), so threads alone never compile in
 * parallel. A worker is a process running `EXE __nvrtc-worker`, where EXE is
 * a program built from the same sources (the stof command itself), which
 * answers compile requests on a socket. A thread that compiles borrows an
 * idle worker, or starts one, so N threads compile in N processes at once;
 * a compiler crash takes down a worker, not the caller.
 *
 * A worker ends after a minute without requests
 * ($STOF_COMPILE_WORKER_IDLE_S), and a new one starts when needed.
 *
 * Workers are off until nvrtc_workers_enable names the executable (the
 * command-line tool does, with itself), or the environment does:
 * STOF_COMPILE_WORKER=/path/to/stof turns them on for any program using the
 * library, STOF_COMPILE_WORKER=0 keeps them off even for the tool. Whenever
 * they cannot be used (a worker does not start, or answers for other kernel
 * sources or another NVRTC), they turn themselves off, say why
 * (nvrtc_workers_status), and compiling goes on in this process.
 *
 * The protocol (both ends are the same build; host byte order):
 *   hello (worker, once):  u64 nvrtc_sources_hash()
 *   request:               u32 count, then count strings (u32 length, bytes):
 *                          source, arch, options...
 *   response:              i32 status (STOF_OK or an error code), u64 length,
 *                          bytes (the cubin, or the error text) */
#ifndef STOF_CORE_NVRTC_WORKER_H
#define STOF_CORE_NVRTC_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "core/gpu/nvrtc_compile.h"

/* argv[1] that makes a program serve as a worker (nvrtc_worker_main). */
#define NVRTC_WORKER_ARG "__nvrtc-worker"
/* The most workers at once; a thread finding all of them busy compiles in
 * its own process. */
#define NVRTC_WORKERS_MAX 64

/* Uses `exe` (resolved to an absolute path; "/proc/self/exe" for the running
 * program) for workers, unless STOF_COMPILE_WORKER is "0". Workers start
 * when first needed and end at exit (or nvrtc_workers_shutdown). */
void nvrtc_workers_enable(const char *exe);
/* Ends every worker and turns them off (nvrtc_workers_enable turns them on
 * again). */
void nvrtc_workers_shutdown(void);

typedef struct nvrtc_workers_info {
    int on;           /* compiles go to workers */
    int running;      /* processes now */
    long started;     /* processes started so far */
    long compiles;    /* requests they answered */
    char why_off[256]; /* why they turned themselves off ("" when they did not) */
} nvrtc_workers_info;

void nvrtc_workers_status(nvrtc_workers_info *out);

/* Compiles req in a worker: *handled is 0 when no worker could take it (off,
 * all busy, or broken just now: compile it here), else the result is the
 * worker's (*cubin malloc'ed, or an error with NVRTC's log). */
int nvrtc_worker_compile(const nvrtc_request *req, void **cubin, size_t *size, int *handled,
                         stof_error *err);

/* The worker's side: says hello on fd, then answers requests read from fd
 * until it closes. Returns the process's exit status. */
int nvrtc_worker_main(int fd);

/* What both ends must agree on: the NVRTC version and every embedded kernel
 * source. */
uint64_t nvrtc_sources_hash(void);

#endif
