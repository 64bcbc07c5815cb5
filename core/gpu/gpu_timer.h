/* The one GPU timer: CUDA events recorded on a stream around a piece of
 * enqueued work, and the median of repeated runs. Every measurement of the
 * library (a model's forward pass, a tuned segment, an attention candidate)
 * goes through it, so that all of them mean the same thing: GPU time
 * between two events, the host waiting only after the second one. */
#ifndef STOF_CORE_GPU_TIMER_H
#define STOF_CORE_GPU_TIMER_H

#include <cuda.h>

#include "core/gpu/cuda_driver.h"
#include "stof.h"

/* Enqueues the work to time on st; returns a status. */
typedef int (*gpu_timer_work)(void *ud, CUstream st, stof_error *err);

typedef struct gpu_timer {
    const cuda_driver *drv;
    CUevent start, stop;
} gpu_timer;

/* Two events in the current context. On failure nothing is left. */
int gpu_timer_create(const cuda_driver *drv, gpu_timer *t, stof_error *err);
/* Destroys the events (a zeroed or freed timer is fine). */
void gpu_timer_free(gpu_timer *t);

/* Milliseconds between an event recorded on st before work(ud, st) and one
 * recorded after it; waits for the second. */
int gpu_timer_once(gpu_timer *t, CUstream st, gpu_timer_work work, void *ud, double *ms,
                   stof_error *err);

/* warmup untimed runs of work, then reps timed ones (gpu_timer_once); the
 * median into *median_ms, each run's time into runs[] when not NULL
 * (reps values). reps >= 1. */
int gpu_timer_median(gpu_timer *t, CUstream st, int warmup, int reps, gpu_timer_work work,
                     void *ud, double *median_ms, double *runs, stof_error *err);

#endif
