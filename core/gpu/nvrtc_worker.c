#define _GNU_SOURCE /* MSG_NOSIGNAL, SOCK_CLOEXEC */
#include "core/gpu/nvrtc_worker.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/base/error.h"
#include "core/gpu/kernels.h"
#include "core/base/util.h"

extern char **environ;

#define MAX_STRING 4096
#define MAX_REPLY ((uint64_t)1 << 30)

typedef enum slot_state { SLOT_EMPTY = 0, SLOT_STARTING, SLOT_IDLE, SLOT_BUSY } slot_state;

typedef struct worker {
    slot_state state;
    pid_t pid;
    int fd;
} worker;

static struct {
    pthread_mutex_t lock;
    int on;
    int atexit_done;
    char exe[PATH_MAX];
    worker slots[NVRTC_WORKERS_MAX];
    long started, compiles;
    char why_off[256];
} W = {.lock = PTHREAD_MUTEX_INITIALIZER};

static pthread_once_t env_once = PTHREAD_ONCE_INIT;

/* ---- the sources both ends must share ------------------------------------------------- */

uint64_t nvrtc_sources_hash(void) {
    int major = 0, minor = 0;
    nvrtc_version(&major, &minor, NULL);
    uint64_t h = util_hash(UTIL_HASH_SEED, &major, sizeof major);
    h = util_hash(h, &minor, sizeof minor);
    for (int i = 0; i < kernel_source_count; i++) {
        h = util_hash_str(h, kernel_sources[i].name);
        h = util_hash(h, kernel_sources[i].text, kernel_sources[i].len);
    }
    return h;
}

/* ---- framing ---------------------------------------------------------------------------- */

/* send, not write: a worker gone makes it fail with EPIPE instead of
 * killing the caller with SIGPIPE. */
static int send_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int recv_all(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n > 0) {
        ssize_t k = recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1; /* closed or broken */
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int send_string(int fd, const char *s) {
    uint32_t n = (uint32_t)strlen(s);
    return send_all(fd, &n, sizeof n) || send_all(fd, s, n) ? -1 : 0;
}

static int send_request(int fd, const nvrtc_request *req) {
    uint32_t count = 2 + (uint32_t)req->n_options;
    if (send_all(fd, &count, sizeof count) || send_string(fd, req->source) ||
        send_string(fd, req->arch))
        return -1;
    for (int i = 0; i < req->n_options; i++)
        if (send_string(fd, req->options[i]))
            return -1;
    return 0;
}

static int send_reply(int fd, int32_t status, const void *data, uint64_t n) {
    return send_all(fd, &status, sizeof status) || send_all(fd, &n, sizeof n) ||
                   send_all(fd, data, (size_t)n)
               ? -1
               : 0;
}

/* ---- the worker's side ------------------------------------------------------------------- */

/* One request into req; its strings live in text (MAX_STRING + 1 bytes each). */
static int recv_request(int fd, nvrtc_request *req, char (*text)[MAX_STRING + 1]) {
    uint32_t count;
    if (recv_all(fd, &count, sizeof count) || count < 2 || count > 2 + NVRTC_MAX_OPTIONS)
        return -1;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t n;
        if (recv_all(fd, &n, sizeof n) || n > MAX_STRING || recv_all(fd, text[i], n))
            return -1;
        text[i][n] = '\0';
    }
    memset(req, 0, sizeof *req);
    req->source = text[0];
    req->arch = text[1];
    req->n_options = (int)count - 2;
    for (int i = 0; i < req->n_options; i++)
        req->options[i] = text[2 + i];
    return 0;
}

/* How long a worker waits for its next request before it ends
 * ($STOF_COMPILE_WORKER_IDLE_S, default 60 s): a long-lived program that
 * compiled once does not keep a dozen compiler processes (~80 MB each). */
static int idle_ms(void) {
    const char *env = getenv("STOF_COMPILE_WORKER_IDLE_S");
    double s = env && *env ? atof(env) : 60;
    return s > 0 && s < 86400 ? (int)(s * 1000) : 60000;
}

/* 1 when a request (or the end) arrived on fd within ms, 0 when it did not. */
static int wait_readable(int fd, int ms) {
    struct pollfd p = {fd, POLLIN, 0};
    int r;
    while ((r = poll(&p, 1, ms)) < 0 && errno == EINTR) {
    }
    return r != 0;
}

int nvrtc_worker_main(int fd) {
    static char text[2 + NVRTC_MAX_OPTIONS][MAX_STRING + 1];
    uint64_t hello = nvrtc_sources_hash();
    if (send_all(fd, &hello, sizeof hello))
        return 1;
    int idle = idle_ms();
    nvrtc_request req;
    /* ended idle, the caller finds it gone (or loses the request it sent
     * meanwhile, and sends it to a new worker) */
    while (wait_readable(fd, idle) && recv_request(fd, &req, text) == 0) {
        void *bin = NULL;
        size_t size = 0;
        stof_error err = {0};
        int rc = nvrtc_compile_in_process(&req, &bin, &size, &err);
        int sent = rc ? send_reply(fd, rc, err.msg, strlen(err.msg))
                      : send_reply(fd, STOF_OK, bin, size);
        free(bin);
        if (sent)
            return 1;
    }
    return 0; /* the caller closed the socket: done */
}

/* ---- the caller's side: starting and ending workers ------------------------------------ */

static void end_worker(worker *w) {
    if (w->fd >= 0)
        close(w->fd); /* the worker reads the end and exits */
    if (w->pid > 0) {
        int status;
        while (waitpid(w->pid, &status, 0) < 0 && errno == EINTR) {
        }
    }
    *w = (worker){SLOT_EMPTY, 0, -1};
}

/* Under W.lock. */
static void turn_off(const char *why) {
    if (W.on && !W.why_off[0])
        snprintf(W.why_off, sizeof W.why_off, "%.255s", why);
    W.on = 0;
}

/* Starts a worker and reads its hello; 0 on success, else -1 with why. */
static int start_worker(const char *exe, worker *w, char *why, size_t cap) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        snprintf(why, cap, "socketpair: %s", strerror(errno));
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, sv[1], 0); /* the worker talks on its fd 0 */
    char *argv[] = {(char *)exe, (char *)NVRTC_WORKER_ARG, NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(sv[1]);
    if (rc != 0) {
        close(sv[0]);
        snprintf(why, cap, "cannot start %.160s: %.60s", exe, strerror(rc));
        return -1;
    }
    *w = (worker){SLOT_STARTING, pid, sv[0]};
    uint64_t hello = 0;
    if (recv_all(w->fd, &hello, sizeof hello)) {
        snprintf(why, cap, "%.160s %s did not answer", exe, NVRTC_WORKER_ARG);
        end_worker(w);
        return -1;
    }
    if (hello != nvrtc_sources_hash()) {
        snprintf(why, cap, "%.160s was built from other kernel sources or another NVRTC", exe);
        end_worker(w);
        return -1;
    }
    return 0;
}

static void shutdown_at_exit(void) { nvrtc_workers_shutdown(); }

static void enable_locked(const char *exe) {
    char path[PATH_MAX];
    ssize_t n = readlink(exe, path, sizeof path - 1);
    if (n > 0)
        path[n] = '\0';
    else
        snprintf(path, sizeof path, "%s", exe);
    snprintf(W.exe, sizeof W.exe, "%s", path);
    W.on = 1;
    W.why_off[0] = '\0';
    for (int i = 0; i < NVRTC_WORKERS_MAX; i++)
        if (W.slots[i].state == SLOT_EMPTY)
            W.slots[i].fd = -1;
    if (!W.atexit_done)
        W.atexit_done = atexit(shutdown_at_exit) == 0;
}

static int env_says_off(void) {
    const char *env = getenv("STOF_COMPILE_WORKER");
    return env && (strcmp(env, "0") == 0 || strcmp(env, "off") == 0);
}

static void enable_from_env(void) {
    const char *env = getenv("STOF_COMPILE_WORKER");
    if (!env || !*env || env_says_off())
        return;
    pthread_mutex_lock(&W.lock);
    if (!W.on)
        enable_locked(env);
    pthread_mutex_unlock(&W.lock);
}

void nvrtc_workers_enable(const char *exe) {
    pthread_once(&env_once, enable_from_env);
    if (!exe || env_says_off())
        return;
    pthread_mutex_lock(&W.lock);
    enable_locked(exe);
    pthread_mutex_unlock(&W.lock);
}

void nvrtc_workers_shutdown(void) {
    pthread_mutex_lock(&W.lock);
    W.on = 0;
    for (int i = 0; i < NVRTC_WORKERS_MAX; i++)
        if (W.slots[i].state == SLOT_IDLE)
            end_worker(&W.slots[i]);
    pthread_mutex_unlock(&W.lock);
    /* busy ones end when their caller returns them (give_back sees W.on = 0) */
}

void nvrtc_workers_status(nvrtc_workers_info *out) {
    pthread_once(&env_once, enable_from_env);
    pthread_mutex_lock(&W.lock);
    memset(out, 0, sizeof *out);
    out->on = W.on;
    for (int i = 0; i < NVRTC_WORKERS_MAX; i++)
        out->running += W.slots[i].state == SLOT_IDLE || W.slots[i].state == SLOT_BUSY;
    out->started = W.started;
    out->compiles = W.compiles;
    snprintf(out->why_off, sizeof out->why_off, "%s", W.why_off);
    pthread_mutex_unlock(&W.lock);
}

/* ---- the caller's side: borrowing ------------------------------------------------------ */

/* An idle worker, or a new one (only a new one when fresh); NULL when off,
 * all busy, or it would not start. */
static worker *borrow(int fresh) {
    pthread_once(&env_once, enable_from_env);
    pthread_mutex_lock(&W.lock);
    worker *w = NULL, *empty = NULL;
    for (int i = 0; W.on && i < NVRTC_WORKERS_MAX && !w; i++) {
        if (W.slots[i].state == SLOT_IDLE && !fresh)
            w = &W.slots[i];
        else if (W.slots[i].state == SLOT_EMPTY && !empty)
            empty = &W.slots[i];
    }
    if (w) {
        w->state = SLOT_BUSY;
        pthread_mutex_unlock(&W.lock);
        return w;
    }
    if (!W.on || !empty) {
        pthread_mutex_unlock(&W.lock);
        return NULL;
    }
    empty->state = SLOT_STARTING; /* reserved: started outside the lock */
    char exe[PATH_MAX];
    snprintf(exe, sizeof exe, "%s", W.exe);
    pthread_mutex_unlock(&W.lock);

    char why[256];
    worker started;
    int rc = start_worker(exe, &started, why, sizeof why);
    pthread_mutex_lock(&W.lock);
    if (rc) {
        *empty = (worker){SLOT_EMPTY, 0, -1};
        turn_off(why);
        w = NULL;
    } else {
        *empty = started;
        empty->state = SLOT_BUSY;
        W.started++;
        w = empty;
    }
    pthread_mutex_unlock(&W.lock);
    return w;
}

/* Returns w: idle again, or ended (broken, or workers turned off meanwhile). */
static void give_back(worker *w, int broken, int answered) {
    pthread_mutex_lock(&W.lock);
    W.compiles += answered;
    if (broken || !W.on)
        end_worker(w);
    else
        w->state = SLOT_IDLE;
    pthread_mutex_unlock(&W.lock);
}

/* The reply to a request sent to w. -1: the worker broke (closed, or a
 * malformed reply); *why says how. */
static int read_reply(worker *w, int32_t *status, char **data, uint64_t *n, char *why,
                      size_t cap) {
    *data = NULL;
    if (recv_all(w->fd, status, sizeof *status) || recv_all(w->fd, n, sizeof *n)) {
        snprintf(why, cap, "the compiler process %d ended while compiling", (int)w->pid);
        return -1;
    }
    if (*n > MAX_REPLY || !(*data = malloc(*n ? *n + 1 : 1))) {
        snprintf(why, cap, "the compiler process %d sent a reply of %llu bytes", (int)w->pid,
                 (unsigned long long)*n);
        return -1;
    }
    if (recv_all(w->fd, *data, (size_t)*n)) {
        free(*data);
        *data = NULL;
        snprintf(why, cap, "the compiler process %d ended while replying", (int)w->pid);
        return -1;
    }
    (*data)[*n] = '\0';
    return 0;
}

/* A worker that ended while idle (killed, say) is not blamed for the
 * request it would have been given. */
static int worker_ended(const worker *w) {
    int status;
    return waitpid(w->pid, &status, WNOHANG) == w->pid;
}

/* A live worker, or NULL: idle ones found ended (idle too long, or
 * killed) are dropped, each once, until a live one or a new one answers. */
static worker *borrow_live(int fresh) {
    worker *w = borrow(fresh);
    for (int tries = 0; w && worker_ended(w); tries++) {
        w->pid = 0; /* reaped */
        give_back(w, 1, 0);
        w = tries <= NVRTC_WORKERS_MAX ? borrow(fresh) : NULL;
    }
    return w;
}

/* One request on one worker: 0 with the reply, -1 when the worker died
 * before answering (*why says how). */
static int ask(worker *w, const nvrtc_request *req, int32_t *status, char **data, uint64_t *n,
               char *why, size_t cap) {
    if (send_request(w->fd, req) || read_reply(w, status, data, n, why, cap)) {
        give_back(w, 1, 0);
        return -1;
    }
    give_back(w, 0, 1);
    return 0;
}

int nvrtc_worker_compile(const nvrtc_request *req, void **cubin, size_t *size, int *handled,
                         stof_error *err) {
    *handled = 0;
    char why[256] = "";
    int32_t status = 0;
    char *data = NULL;
    uint64_t n = 0;
    /* A worker that dies on a request may have been killed from outside, or
     * still be dying of a kill while it sat idle (as may the other idle
     * ones): the request goes once more, to a newly started worker. Dying
     * there too means the compiler crashes on it, which would take this
     * process down as well: a failed compile. */
    for (int attempt = 0;; attempt++) {
        worker *w = borrow_live(attempt > 0);
        if (!w)
            return STOF_OK; /* compile here */
        if (ask(w, req, &status, &data, &n, why, sizeof why) == 0)
            break;
        if (attempt == 1) {
            *handled = 1;
            return err_set(err, STOF_ERR_COMPILE, "compiling %s for %s: %s (twice)", req->source,
                           req->arch, why);
        }
    }
    *handled = 1;
    if (status != STOF_OK) {
        int rc = err_set(err, status, "%s", data);
        free(data);
        return rc;
    }
    *cubin = data;
    *size = (size_t)n;
    return STOF_OK;
}
