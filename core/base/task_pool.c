#include "core/base/task_pool.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/base/error.h"

/* The tag of parallel_for's helpers: never a caller's. */
#define TASK_TAG_LOOP INT_MIN

typedef struct task {
    struct task *prev, *next;
    task_fn run, drop;
    void *arg;
    int tag;
} task;

struct task_pool {
    pthread_mutex_t lock;
    pthread_cond_t work; /* a task was queued, or the pool stops */
    pthread_cond_t idle; /* a task or a loop iteration finished */
    task *head, *tail;
    int running, stop;
    int n_threads;
    pthread_t *threads;
};

int task_pool_default_threads(void) {
    const char *env = getenv(TASK_POOL_THREADS_ENV);
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 1 && v <= 256)
            return (int)v;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    return n > TASK_POOL_MAX_THREADS ? TASK_POOL_MAX_THREADS : (int)n;
}

/* ---- the queue (under the lock) --------------------------------------------------------- */

static void unlink_task(task_pool *p, task *t) {
    if (t->prev)
        t->prev->next = t->next;
    else
        p->head = t->next;
    if (t->next)
        t->next->prev = t->prev;
    else
        p->tail = t->prev;
    t->prev = t->next = NULL;
}

static void push_back(task_pool *p, task *t) {
    t->next = NULL;
    t->prev = p->tail;
    if (p->tail)
        p->tail->next = t;
    else
        p->head = t;
    p->tail = t;
}

static void push_front(task_pool *p, task *t) {
    t->prev = NULL;
    t->next = p->head;
    if (p->head)
        p->head->prev = t;
    else
        p->tail = t;
    p->head = t;
}

/* Unlinks the queued tasks that match (tag, and arg unless arg is NULL)
 * into a list of their own. */
static task *take_queued(task_pool *p, int tag, const void *arg) {
    task *taken = NULL;
    for (task *t = p->head, *next; t; t = next) {
        next = t->next;
        if (t->tag != tag || (arg && t->arg != arg))
            continue;
        unlink_task(p, t);
        t->next = taken;
        taken = t;
    }
    return taken;
}

static void drop_list(task *t) {
    while (t) {
        task *next = t->next;
        if (t->drop)
            t->drop(t->arg);
        free(t);
        t = next;
    }
}

/* ---- workers -------------------------------------------------------------------------------- */

static void *worker_main(void *arg) {
    task_pool *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->head && !p->stop)
            pthread_cond_wait(&p->work, &p->lock);
        if (!p->head)
            break;
        task *t = p->head;
        unlink_task(p, t);
        p->running++;
        pthread_mutex_unlock(&p->lock);
        t->run(t->arg);
        free(t);
        pthread_mutex_lock(&p->lock);
        p->running--;
        pthread_cond_broadcast(&p->idle);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

int task_pool_create(int threads, task_pool **out, stof_error *err) {
    *out = NULL;
    if (threads <= 0)
        threads = task_pool_default_threads();
    task_pool *p = err_calloc(1, sizeof *p, err);
    if (!p)
        return STOF_ERR_NOMEM;
    p->threads = err_calloc((size_t)threads, sizeof *p->threads, err);
    if (!p->threads) {
        free(p);
        return STOF_ERR_NOMEM;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->idle, NULL);
    for (int i = 0; i < threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
            task_pool_free(p);
            return err_set(err, STOF_ERR_NOMEM, "cannot start compile thread %d of %d", i + 1,
                           threads);
        }
        p->n_threads++;
    }
    *out = p;
    return STOF_OK;
}

void task_pool_free(task_pool *p) {
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    task *queued = p->head;
    p->head = p->tail = NULL;
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    drop_list(queued);
    for (int i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->idle);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->lock);
    free(p->threads);
    free(p);
}

int task_pool_threads(const task_pool *p) {
    return p ? p->n_threads : 1;
}

/* ---- tasks ----------------------------------------------------------------------------------- */

int task_pool_submit(task_pool *p, int tag, task_fn run, task_fn drop, void *arg,
                     stof_error *err) {
    if (!p) {
        run(arg);
        return STOF_OK;
    }
    task *t = err_calloc(1, sizeof *t, err);
    if (!t) {
        if (drop)
            drop(arg);
        return STOF_ERR_NOMEM;
    }
    *t = (task){NULL, NULL, run, drop, arg, tag};
    pthread_mutex_lock(&p->lock);
    push_back(p, t);
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->lock);
    return STOF_OK;
}

void task_pool_drop(task_pool *p, int tag) {
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    task *taken = take_queued(p, tag, NULL);
    pthread_mutex_unlock(&p->lock);
    drop_list(taken);
}

void task_pool_wait(task_pool *p) {
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    while (p->head || p->running)
        pthread_cond_wait(&p->idle, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

/* ---- loops ---------------------------------------------------------------------------------- */

/* One parallel_for: its iterations are handed out under the pool's lock.
 * `helpers` counts the helper tasks queued or running; the caller returns
 * only when it is 0, so no helper touches the loop after that. */
typedef struct loop {
    task_pool *pool;
    void (*body)(void *arg, int i);
    void *arg;
    int n, next;
    int helpers;
} loop;

/* Iterations until none is left (the lock is held on entry and exit). */
static void loop_work(loop *l) {
    while (l->next < l->n) {
        int i = l->next++;
        pthread_mutex_unlock(&l->pool->lock);
        l->body(l->arg, i);
        pthread_mutex_lock(&l->pool->lock);
    }
}

static void loop_help(void *arg) {
    loop *l = arg;
    task_pool *p = l->pool;
    pthread_mutex_lock(&p->lock);
    loop_work(l);
    l->helpers--; /* the last touch of l: its caller may return once the lock is free */
    pthread_cond_broadcast(&p->idle);
    pthread_mutex_unlock(&p->lock);
}

void task_pool_parallel_for(task_pool *p, int n, void (*body)(void *arg, int i), void *arg) {
    if (!p || n <= 1) {
        for (int i = 0; i < n; i++)
            body(arg, i);
        return;
    }
    loop l = {p, body, arg, n, 0, 0};
    int want = n - 1 < p->n_threads ? n - 1 : p->n_threads;
    pthread_mutex_lock(&p->lock);
    for (int k = 0; k < want; k++) {
        task *t = calloc(1, sizeof *t);
        if (!t)
            break; /* fewer helpers: the caller does more itself */
        *t = (task){NULL, NULL, loop_help, NULL, &l, TASK_TAG_LOOP};
        push_front(p, t);
        l.helpers++;
    }
    pthread_cond_broadcast(&p->work);
    loop_work(&l);
    /* helpers that never started are not needed any more */
    task *unused = take_queued(p, TASK_TAG_LOOP, &l);
    for (task *t = unused; t; t = t->next)
        l.helpers--;
    while (l.helpers > 0)
        pthread_cond_wait(&p->idle, &p->lock);
    pthread_mutex_unlock(&p->lock);
    drop_list(unused);
}
