#include "core/base/memo.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/util.h"

typedef enum memo_state { MEMO_BUSY = 0, MEMO_DONE, MEMO_FAILED } memo_state;

typedef struct memo_entry {
    struct memo_entry *next; /* in its bucket */
    uint64_t key;
    memo_state state;
    void *value;
    size_t bytes;
    int pins;
    uint64_t used;           /* the tick of its last use */
    int code;                /* MEMO_FAILED: the error */
    char *msg;
} memo_entry;

struct memo {
    pthread_mutex_t lock;
    pthread_cond_t done;     /* a computation finished */
    memo_entry **buckets;
    size_t n_buckets;        /* a power of two */
    size_t count;
    size_t budget;
    void (*free_value)(void *value);
    uint64_t tick;
    memo_stats stats;
};

#define MEMO_FIRST_BUCKETS 64

int memo_create(size_t budget, void (*free_value)(void *value), memo **out, stof_error *err) {
    *out = NULL;
    memo *m = err_calloc(1, sizeof *m, err);
    if (!m)
        return STOF_ERR_NOMEM;
    m->buckets = err_calloc(MEMO_FIRST_BUCKETS, sizeof *m->buckets, err);
    if (!m->buckets) {
        free(m);
        return STOF_ERR_NOMEM;
    }
    m->n_buckets = MEMO_FIRST_BUCKETS;
    m->budget = budget;
    m->free_value = free_value;
    pthread_mutex_init(&m->lock, NULL);
    pthread_cond_init(&m->done, NULL);
    *out = m;
    return STOF_OK;
}

static void entry_free(memo *m, memo_entry *e) {
    if (e->state == MEMO_DONE && m->free_value)
        m->free_value(e->value);
    free(e->msg);
    free(e);
}

void memo_free(memo *m) {
    if (!m)
        return;
    for (size_t b = 0; b < m->n_buckets; b++)
        for (memo_entry *e = m->buckets[b], *next; e; e = next) {
            next = e->next;
            entry_free(m, e);
        }
    free(m->buckets);
    pthread_cond_destroy(&m->done);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

/* ---- the table (under the lock) ---------------------------------------------------------- */

static size_t bucket_of(const memo *m, uint64_t key) {
    return (size_t)util_mix64(key) & (m->n_buckets - 1);
}

static memo_entry *find(const memo *m, uint64_t key) {
    for (memo_entry *e = m->buckets[bucket_of(m, key)]; e; e = e->next)
        if (e->key == key)
            return e;
    return NULL;
}

/* Twice the buckets once there are more entries than buckets; when that
 * allocation fails the chains just get longer. */
static void maybe_grow(memo *m) {
    if (m->count < m->n_buckets)
        return;
    size_t n = 2 * m->n_buckets;
    memo_entry **nb = calloc(n, sizeof *nb);
    if (!nb)
        return;
    memo_entry **old = m->buckets;
    size_t old_n = m->n_buckets;
    m->buckets = nb;
    m->n_buckets = n;
    for (size_t b = 0; b < old_n; b++)
        for (memo_entry *e = old[b], *next; e; e = next) {
            next = e->next;
            size_t i = bucket_of(m, e->key);
            e->next = m->buckets[i];
            m->buckets[i] = e;
        }
    free(old);
}

static memo_entry *insert_busy(memo *m, uint64_t key) {
    memo_entry *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    maybe_grow(m);
    e->key = key;
    e->state = MEMO_BUSY;
    size_t i = bucket_of(m, key);
    e->next = m->buckets[i];
    m->buckets[i] = e;
    m->count++;
    return e;
}

static void unlink_entry(memo *m, memo_entry *e) {
    memo_entry **p = &m->buckets[bucket_of(m, e->key)];
    while (*p != e)
        p = &(*p)->next;
    *p = e->next;
    m->count--;
}

/* The least recently used value that nobody holds. */
static memo_entry *eviction_victim(const memo *m) {
    memo_entry *victim = NULL;
    for (size_t b = 0; b < m->n_buckets; b++)
        for (memo_entry *e = m->buckets[b]; e; e = e->next)
            if (e->state == MEMO_DONE && e->pins == 0 && (!victim || e->used < victim->used))
                victim = e;
    return victim;
}

static void evict_over_budget(memo *m) {
    while (m->budget && m->stats.bytes > m->budget) {
        memo_entry *e = eviction_victim(m);
        if (!e)
            return;
        unlink_entry(m, e);
        m->stats.bytes -= e->bytes;
        m->stats.evicted++;
        entry_free(m, e);
    }
}

/* ---- computing ------------------------------------------------------------------------------- */

/* Runs compute for e (claimed busy by this thread; the lock is held on
 * entry and exit, released around compute) and records the outcome; e is
 * not used after (a NOMEM failure removes it). */
static int compute_entry(memo *m, memo_entry *e, memo_compute compute, void *arg, int pin,
                         void **value, stof_error *err) {
    uint64_t key = e->key;
    pthread_mutex_unlock(&m->lock);
    stof_error local = {0};
    void *v = NULL;
    size_t bytes = 0;
    double t0 = util_now();
    int rc = compute(arg, &v, &bytes, &local);
    double dt = util_now() - t0;
    pthread_mutex_lock(&m->lock);
    m->stats.compute_s += dt;
    e = find(m, key); /* busy entries are never removed by others */
    if (rc == STOF_OK) {
        e->state = MEMO_DONE;
        e->value = v;
        e->bytes = bytes;
        e->pins = pin;
        e->used = ++m->tick;
        m->stats.bytes += bytes;
        m->stats.computed++;
        if (value)
            *value = v;
        evict_over_budget(m);
    } else {
        m->stats.failed++;
        if (rc == STOF_ERR_NOMEM) {
            unlink_entry(m, e);
            free(e);
        } else {
            e->state = MEMO_FAILED;
            e->code = rc;
            size_t n = strlen(local.msg) + 1;
            if ((e->msg = malloc(n)) != NULL)
                memcpy(e->msg, local.msg, n);
        }
        if (err)
            *err = local;
    }
    pthread_cond_broadcast(&m->done);
    return rc;
}

static int failure_of(const memo_entry *e, stof_error *err) {
    return err_set(err, e->code, "%s", e->msg ? e->msg : "(the message was lost)");
}

int memo_get(memo *m, uint64_t key, memo_compute compute, void *arg, void **value,
             stof_error *err) {
    *value = NULL;
    pthread_mutex_lock(&m->lock);
    int rc;
    for (;;) {
        memo_entry *e = find(m, key);
        if (e && e->state == MEMO_DONE) {
            e->pins++;
            e->used = ++m->tick;
            m->stats.hits++;
            *value = e->value;
            rc = STOF_OK;
        } else if (e && e->state == MEMO_FAILED) {
            rc = failure_of(e, err);
        } else if (e) { /* another thread computes it: wait, then look again */
            double t0 = util_now();
            m->stats.waited++;
            pthread_cond_wait(&m->done, &m->lock);
            m->stats.wait_s += util_now() - t0;
            continue;
        } else if (!(e = insert_busy(m, key))) {
            rc = err_set(err, STOF_ERR_NOMEM, "out of memory");
        } else {
            rc = compute_entry(m, e, compute, arg, 1, value, err);
        }
        break;
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

void memo_unpin(memo *m, uint64_t key) {
    pthread_mutex_lock(&m->lock);
    memo_entry *e = find(m, key);
    if (e && e->state == MEMO_DONE && e->pins > 0) {
        e->pins--;
        evict_over_budget(m);
    }
    pthread_mutex_unlock(&m->lock);
}

int memo_fill(memo *m, uint64_t key, memo_compute compute, void *arg, stof_error *err) {
    pthread_mutex_lock(&m->lock);
    int rc = STOF_OK;
    memo_entry *e = find(m, key);
    if (!e) {
        if (!(e = insert_busy(m, key)))
            rc = err_set(err, STOF_ERR_NOMEM, "out of memory");
        else
            rc = compute_entry(m, e, compute, arg, 0, NULL, err);
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

int memo_known(memo *m, uint64_t key) {
    pthread_mutex_lock(&m->lock);
    int known = find(m, key) != NULL;
    pthread_mutex_unlock(&m->lock);
    return known;
}

memo_stats memo_get_stats(memo *m) {
    pthread_mutex_lock(&m->lock);
    memo_stats s = m->stats;
    pthread_mutex_unlock(&m->lock);
    return s;
}
