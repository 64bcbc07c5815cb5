/* A fixed set of worker threads (pthreads) that run tasks in the order they
 * were given: the tuner compiles kernels and computes CPU references on it
 * ahead of the measurements that need them.
 *
 *   tasks          task_pool_submit queues run(arg) behind what is queued;
 *                  every task carries a tag, and task_pool_drop(tag) takes
 *                  back the ones of that tag not started yet (their `drop`
 *                  runs instead, to free arg): a caller can replace work it
 *                  no longer expects to need with the work it now expects.
 *   loops          task_pool_parallel_for runs a loop's iterations on the
 *                  caller and on the workers that become free, ahead of
 *                  every queued task; a task may run one itself.
 *
 * A task keeps its own result: the pool reports nothing about it. A NULL
 * pool runs everything on the caller, at once. */
#ifndef STOF_CORE_TASK_POOL_H
#define STOF_CORE_TASK_POOL_H

#include "stof.h"

/* Workers by default: the online CPUs, at most this many. */
#define TASK_POOL_MAX_THREADS 16
/* The environment variable that sets the number of workers (1 or more). */
#define TASK_POOL_THREADS_ENV "STOF_COMPILE_THREADS"

typedef struct task_pool task_pool;
typedef void (*task_fn)(void *arg);

/* $STOF_COMPILE_THREADS when it is a number from 1 to 256, else the online
 * CPUs capped at TASK_POOL_MAX_THREADS. */
int task_pool_default_threads(void);

/* threads <= 0: task_pool_default_threads(). */
int task_pool_create(int threads, task_pool **out, stof_error *err);
/* Drops the queued tasks, waits for the running ones, joins the workers.
 * NULL is fine. */
void task_pool_free(task_pool *p);
int task_pool_threads(const task_pool *p);

/* Queues run(arg). The pool owns arg from here on: exactly one of run(arg)
 * and drop(arg) (drop may be NULL) is called, drop when the task is taken
 * back or cannot be queued (STOF_ERR_NOMEM). A NULL pool runs it now. */
int task_pool_submit(task_pool *p, int tag, task_fn run, task_fn drop, void *arg,
                     stof_error *err);
/* Takes back the queued tasks of tag (calling their drop); running ones
 * finish. */
void task_pool_drop(task_pool *p, int tag);
/* Returns once nothing is queued and no worker runs a task. */
void task_pool_wait(task_pool *p);

/* body(arg, i) for every i in [0, n), on the caller and on free workers;
 * returns when all have run. */
void task_pool_parallel_for(task_pool *p, int n, void (*body)(void *arg, int i), void *arg);

#endif
