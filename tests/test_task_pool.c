/* The thread pool, the memo table and compiling ahead (no GPU): tasks run
 * once each, dropped tasks free their argument, parallel loops cover every
 * index (nested in tasks too); a memo computes a key once however many
 * threads ask, keeps failures but not NOMEM, evicts past its budget but
 * never a pinned value; NVRTC kernels compiled on the pool for sm_90 land in
 * the memory and disk caches, a second request compiles nothing, and
 * concurrent requests for one key compile it once. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core/base/error.h"
#include "core/base/memo.h"
#include "core/gpu/nvrtc.h"
#include "core/base/task_pool.h"

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ==== the pool ================================================================================ */

typedef struct counter {
    atomic_int runs, drops;
} counter;

typedef struct counted {
    counter *c;
    int tag;
} counted;

static void counted_run(void *arg) {
    counted *t = arg;
    atomic_fetch_add(&t->c[t->tag].runs, 1);
    free(t);
}

static void counted_drop(void *arg) {
    counted *t = arg;
    atomic_fetch_add(&t->c[t->tag].drops, 1);
    free(t);
}

static void submit_counted(task_pool *p, counter *c, int tag) {
    counted *t = malloc(sizeof *t);
    *t = (counted){c, tag};
    stof_error err = {0};
    CHECK_EQ_INT(task_pool_submit(p, tag, counted_run, counted_drop, t, &err), STOF_OK);
}

/* A task that holds its worker until released. */
typedef struct gate {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int entered, open;
} gate;

static void gate_run(void *arg) {
    gate *g = arg;
    pthread_mutex_lock(&g->lock);
    g->entered = 1;
    pthread_cond_broadcast(&g->cond);
    while (!g->open)
        pthread_cond_wait(&g->cond, &g->lock);
    pthread_mutex_unlock(&g->lock);
}

static void test_pool_tasks(void) {
    task_pool *p;
    stof_error err = {0};
    CHECK_EQ_INT(task_pool_create(4, &p, &err), STOF_OK);
    CHECK_EQ_INT(task_pool_threads(p), 4);
    counter c[2] = {0};
    for (int i = 0; i < 200; i++)
        submit_counted(p, c, i % 2);
    task_pool_wait(p);
    CHECK_EQ_INT(atomic_load(&c[0].runs) + atomic_load(&c[1].runs), 200);
    CHECK_EQ_INT(atomic_load(&c[0].drops), 0);
    task_pool_free(p);

    /* one worker held by a gate: the queued tasks of tag 0 are taken back */
    CHECK_EQ_INT(task_pool_create(1, &p, &err), STOF_OK);
    gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    CHECK_EQ_INT(task_pool_submit(p, 9, gate_run, NULL, &g, &err), STOF_OK);
    pthread_mutex_lock(&g.lock);
    while (!g.entered)
        pthread_cond_wait(&g.cond, &g.lock);
    pthread_mutex_unlock(&g.lock);
    counter d[2] = {0};
    for (int i = 0; i < 10; i++)
        submit_counted(p, d, i % 2);
    task_pool_drop(p, 0);
    CHECK_EQ_INT(atomic_load(&d[0].drops), 5);
    pthread_mutex_lock(&g.lock);
    g.open = 1;
    pthread_cond_broadcast(&g.cond);
    pthread_mutex_unlock(&g.lock);
    task_pool_wait(p);
    CHECK_EQ_INT(atomic_load(&d[0].runs), 0);
    CHECK_EQ_INT(atomic_load(&d[1].runs), 5);

    /* freeing a pool with queued tasks drops them */
    g.open = 0;
    g.entered = 0;
    CHECK_EQ_INT(task_pool_submit(p, 9, gate_run, NULL, &g, &err), STOF_OK);
    pthread_mutex_lock(&g.lock);
    while (!g.entered)
        pthread_cond_wait(&g.cond, &g.lock);
    pthread_mutex_unlock(&g.lock);
    counter e[1] = {0};
    for (int i = 0; i < 3; i++)
        submit_counted(p, e, 0);
    pthread_mutex_lock(&g.lock);
    g.open = 1;
    pthread_cond_broadcast(&g.cond);
    pthread_mutex_unlock(&g.lock);
    task_pool_free(p);
    CHECK_EQ_INT(atomic_load(&e[0].runs) + atomic_load(&e[0].drops), 3);

    /* no pool: run at once */
    counter f[1] = {0};
    submit_counted(NULL, f, 0);
    CHECK_EQ_INT(atomic_load(&f[0].runs), 1);
}

typedef struct loop_arg {
    task_pool *p;
    int n;
    atomic_int *hits;
} loop_arg;

static void mark(void *arg, int i) {
    loop_arg *a = arg;
    atomic_fetch_add(&a->hits[i], 1);
}

/* A task whose body is a parallel loop on the same pool. */
typedef struct nested {
    task_pool *p;
    atomic_int hits[64];
} nested;

static void nested_run(void *arg) {
    nested *n = arg;
    loop_arg a = {n->p, 64, n->hits};
    task_pool_parallel_for(n->p, 64, mark, &a);
}

static void test_parallel_for(void) {
    task_pool *p;
    stof_error err = {0};
    CHECK_EQ_INT(task_pool_create(3, &p, &err), STOF_OK);
    enum { N = 5000 };
    atomic_int *hits = calloc(N, sizeof *hits);
    loop_arg a = {p, N, hits};
    task_pool_parallel_for(p, N, mark, &a);
    int once = 0;
    for (int i = 0; i < N; i++)
        once += atomic_load(&hits[i]) == 1;
    CHECK_EQ_INT(once, N);
    /* serial without a pool */
    memset(hits, 0, N * sizeof *hits);
    task_pool_parallel_for(NULL, 10, mark, &a);
    CHECK_EQ_INT(atomic_load(&hits[9]), 1);
    free(hits);

    /* loops inside tasks, more tasks than workers */
    nested *ns = calloc(6, sizeof *ns);
    for (int k = 0; k < 6; k++) {
        ns[k].p = p;
        CHECK_EQ_INT(task_pool_submit(p, 1, nested_run, NULL, &ns[k], &err), STOF_OK);
    }
    task_pool_wait(p);
    int all = 0;
    for (int k = 0; k < 6; k++)
        for (int i = 0; i < 64; i++)
            all += atomic_load(&ns[k].hits[i]) == 1;
    CHECK_EQ_INT(all, 6 * 64);
    free(ns);
    task_pool_free(p);
}

static void test_default_threads(void) {
    setenv(TASK_POOL_THREADS_ENV, "3", 1);
    CHECK_EQ_INT(task_pool_default_threads(), 3);
    setenv(TASK_POOL_THREADS_ENV, "zero", 1);
    int n = task_pool_default_threads();
    CHECK(n >= 1 && n <= TASK_POOL_MAX_THREADS);
    unsetenv(TASK_POOL_THREADS_ENV);
}

/* ==== the memo ================================================================================ */

typedef struct slow_value {
    atomic_int calls;
    int fail_code; /* 0: succeed */
    size_t bytes;
} slow_value;

static int make_slow(void *arg, void **value, size_t *bytes, stof_error *err) {
    slow_value *s = arg;
    atomic_fetch_add(&s->calls, 1);
    sleep_ms(20);
    if (s->fail_code)
        return err_set(err, s->fail_code, "made to fail (%d)", s->fail_code);
    int *v = malloc(sizeof *v);
    *v = 42;
    *value = v;
    *bytes = s->bytes;
    return STOF_OK;
}

typedef struct memo_loop {
    memo *m;
    slow_value *s;
    void *got[16];
    int rc[16];
} memo_loop;

static void memo_ask(void *arg, int i) {
    memo_loop *l = arg;
    stof_error err = {0};
    l->rc[i] = memo_get(l->m, 7, make_slow, l->s, &l->got[i], &err);
    if (!l->rc[i])
        memo_unpin(l->m, 7);
}

static void test_memo_once(void) {
    task_pool *p;
    memo *m;
    stof_error err = {0};
    CHECK_EQ_INT(task_pool_create(4, &p, &err), STOF_OK);
    CHECK_EQ_INT(memo_create(0, free, &m, &err), STOF_OK);
    slow_value s = {0, 0, 4};
    memo_loop l = {m, &s, {0}, {0}};
    task_pool_parallel_for(p, 16, memo_ask, &l);
    CHECK_EQ_INT(atomic_load(&s.calls), 1);
    int same = 0;
    for (int i = 0; i < 16; i++)
        same += l.rc[i] == STOF_OK && l.got[i] == l.got[0];
    CHECK_EQ_INT(same, 16);
    memo_stats st = memo_get_stats(m);
    CHECK_EQ_INT(st.computed, 1);
    CHECK_EQ_INT(st.hits, 15);
    CHECK(memo_known(m, 7));
    CHECK(!memo_known(m, 8));
    /* memo_fill skips what is there */
    CHECK_EQ_INT(memo_fill(m, 7, make_slow, &s, &err), STOF_OK);
    CHECK_EQ_INT(atomic_load(&s.calls), 1);
    memo_free(m);
    task_pool_free(p);
}

static void test_memo_failures(void) {
    memo *m;
    stof_error err = {0};
    void *v;
    CHECK_EQ_INT(memo_create(0, free, &m, &err), STOF_OK);
    slow_value bad = {0, STOF_ERR_COMPILE, 0};
    CHECK_EQ_INT(memo_get(m, 1, make_slow, &bad, &v, &err), STOF_ERR_COMPILE);
    CHECK_EQ_INT(memo_get(m, 1, make_slow, &bad, &v, &err), STOF_ERR_COMPILE);
    CHECK_CONTAINS(err.msg, "made to fail");
    CHECK_EQ_INT(atomic_load(&bad.calls), 1);
    /* out of memory is not kept: asked again, computed again */
    slow_value oom = {0, STOF_ERR_NOMEM, 0};
    CHECK_EQ_INT(memo_fill(m, 2, make_slow, &oom, &err), STOF_ERR_NOMEM);
    CHECK(!memo_known(m, 2));
    oom.fail_code = 0;
    oom.bytes = 4;
    CHECK_EQ_INT(memo_get(m, 2, make_slow, &oom, &v, &err), STOF_OK);
    CHECK_EQ_INT(atomic_load(&oom.calls), 2);
    CHECK(v && *(int *)v == 42);
    memo_unpin(m, 2);
    memo_free(m);
}

static void test_memo_budget(void) {
    memo *m;
    stof_error err = {0};
    void *v;
    CHECK_EQ_INT(memo_create(100, free, &m, &err), STOF_OK);
    slow_value s = {0, 0, 40};
    CHECK_EQ_INT(memo_get(m, 1, make_slow, &s, &v, &err), STOF_OK); /* pinned */
    for (uint64_t k = 2; k <= 5; k++)
        CHECK_EQ_INT(memo_fill(m, k, make_slow, &s, &err), STOF_OK);
    memo_stats st = memo_get_stats(m);
    CHECK(st.bytes <= 100);
    CHECK_EQ_INT(st.evicted, 3);
    CHECK(memo_known(m, 1)); /* pinned: kept although the oldest */
    CHECK(memo_known(m, 5)); /* the newest */
    CHECK(!memo_known(m, 2));
    memo_unpin(m, 1);
    CHECK_EQ_INT(memo_fill(m, 6, make_slow, &s, &err), STOF_OK);
    CHECK(!memo_known(m, 1)); /* now the least recently used */
    memo_free(m);
}

/* ==== compiling ahead ========================================================================= */

#define N_KERNELS 6

/* util.cu with a distinct unused define per variant: distinct keys. */
static void variant(nvrtc_request *req, char (*opts)[32], int k) {
    memset(req, 0, sizeof *req);
    req->source = "util.cu";
    req->arch = "sm_90";
    snprintf(opts[0], 32, "-DSTOF_DTYPE=1");
    snprintf(opts[1], 32, "-DSTOF_TEST_VARIANT=%d", k);
    req->options[0] = opts[0];
    req->options[1] = opts[1];
    req->n_options = 2;
}

static void test_compile_ahead(const char *dir) {
    task_pool *p;
    stof_error err = {0};
    CHECK_EQ_INT(task_pool_create(3, &p, &err), STOF_OK);
    nvrtc_cache c;
    nvrtc_cache_init(&c, dir);
    char opts[N_KERNELS][2][32];
    nvrtc_request req[N_KERNELS];
    for (int k = 0; k < N_KERNELS; k++) {
        variant(&req[k], opts[k], k);
        CHECK_EQ_INT(nvrtc_submit(p, 1, &c, &req[k], &err), STOF_OK);
    }
    task_pool_wait(p);
    CHECK_EQ_INT(c.compiled, N_KERNELS);
    CHECK_EQ_INT(c.ahead, N_KERNELS);
    CHECK(c.compile_s > 0);
    /* asked for now: every one is in memory, nothing compiles */
    for (int k = 0; k < N_KERNELS; k++) {
        const void *bin;
        size_t size;
        CHECK_EQ_INT(nvrtc_get(&c, &req[k], &bin, &size, &err), STOF_OK);
        CHECK(size > 4 && memcmp(bin, "\x7f" "ELF", 4) == 0);
    }
    CHECK_EQ_INT(c.compiled, N_KERNELS);
    CHECK_EQ_INT(c.memory_hits, N_KERNELS);
    CHECK_EQ_INT(c.ahead_used, N_KERNELS);
    /* submitted again: nothing is queued */
    for (int k = 0; k < N_KERNELS; k++)
        CHECK_EQ_INT(nvrtc_submit(p, 1, &c, &req[k], &err), STOF_OK);
    task_pool_wait(p);
    CHECK_EQ_INT(c.compiled, N_KERNELS);
    CHECK_EQ_INT(c.ahead, N_KERNELS);
    nvrtc_cache_free(&c);

    /* a fresh cache finds them on disk, ahead too */
    nvrtc_cache_init(&c, dir);
    for (int k = 0; k < N_KERNELS; k++)
        CHECK_EQ_INT(nvrtc_submit(p, 1, &c, &req[k], &err), STOF_OK);
    task_pool_wait(p);
    CHECK_EQ_INT(c.compiled, 0);
    CHECK_EQ_INT(c.disk_hits, N_KERNELS);
    nvrtc_cache_free(&c);

    /* a failing compile ahead is answered by nvrtc_get with its log, once */
    nvrtc_cache_init(&c, "");
    nvrtc_request bad = {.source = "util.cu", .arch = "sm_90", .n_options = 1};
    bad.options[0] = "-DSTOF_DTYPE=7";
    CHECK_EQ_INT(nvrtc_submit(p, 1, &c, &bad, &err), STOF_OK);
    task_pool_wait(p);
    const void *bin;
    size_t size;
    CHECK_EQ_INT(nvrtc_get(&c, &bad, &bin, &size, &err), STOF_ERR_COMPILE);
    CHECK_CONTAINS(err.msg, "util.cu");
    CHECK_EQ_INT(c.failed, 1);
    nvrtc_cache_free(&c);
    task_pool_free(p);
}

/* A compile queued behind a busy worker and dropped never runs; asked for
 * later, it compiles then. */
static void test_dropped_compile(void) {
    task_pool *p;
    stof_error err = {0};
    CHECK_EQ_INT(task_pool_create(1, &p, &err), STOF_OK);
    nvrtc_cache c;
    nvrtc_cache_init(&c, "");
    gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    CHECK_EQ_INT(task_pool_submit(p, 9, gate_run, NULL, &g, &err), STOF_OK);
    pthread_mutex_lock(&g.lock);
    while (!g.entered)
        pthread_cond_wait(&g.cond, &g.lock);
    pthread_mutex_unlock(&g.lock);
    char opts[2][32];
    nvrtc_request req;
    variant(&req, opts, 99);
    CHECK_EQ_INT(nvrtc_submit(p, 5, &c, &req, &err), STOF_OK);
    task_pool_drop(p, 5);
    pthread_mutex_lock(&g.lock);
    g.open = 1;
    pthread_cond_broadcast(&g.cond);
    pthread_mutex_unlock(&g.lock);
    task_pool_wait(p);
    CHECK_EQ_INT(c.compiled, 0);
    const void *bin;
    size_t size;
    CHECK_EQ_INT(nvrtc_get(&c, &req, &bin, &size, &err), STOF_OK);
    CHECK_EQ_INT(c.compiled, 1);
    CHECK_EQ_INT(c.ahead, 0);
    nvrtc_cache_free(&c);
    task_pool_free(p);
}

typedef struct same_key {
    nvrtc_cache *c;
    const nvrtc_request *req;
    const void *bin[8];
    int rc[8];
} same_key;

static void ask_same(void *arg, int i) {
    same_key *s = arg;
    size_t size;
    stof_error err = {0};
    s->rc[i] = nvrtc_get(s->c, s->req, &s->bin[i], &size, &err);
}

static void test_same_key(void) {
    task_pool *p;
    stof_error err = {0};
    CHECK_EQ_INT(task_pool_create(4, &p, &err), STOF_OK);
    nvrtc_cache c;
    nvrtc_cache_init(&c, "");
    char opts[2][32];
    nvrtc_request req;
    variant(&req, opts, 1234);
    /* ahead and asked for at once, from many threads */
    CHECK_EQ_INT(nvrtc_submit(p, 1, &c, &req, &err), STOF_OK);
    same_key s = {&c, &req, {0}, {0}};
    task_pool_parallel_for(p, 8, ask_same, &s);
    task_pool_wait(p);
    int same = 0;
    for (int i = 0; i < 8; i++)
        same += s.rc[i] == STOF_OK && s.bin[i] == s.bin[0];
    CHECK_EQ_INT(same, 8);
    CHECK_EQ_INT(c.compiled, 1);
    nvrtc_cache_free(&c);
    task_pool_free(p);
}

int main(void) {
    test_pool_tasks();
    test_parallel_for();
    test_default_threads();
    test_memo_once();
    test_memo_failures();
    test_memo_budget();
    char dir[] = "/tmp/stof-pool-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    test_compile_ahead(dir);
    test_same_key();
    test_dropped_compile();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return check_summary("test_task_pool");
}
