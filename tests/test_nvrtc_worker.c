/* Compiling in worker processes (core/gpu/nvrtc_worker.h): off by default, the
 * same cubins as compiling here, errors with NVRTC's log, many threads at
 * once, and every way a worker can fail falls back to compiling here. The
 * test program is its own worker. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/gpu/nvrtc.h"
#include "core/gpu/nvrtc_worker.h"

static nvrtc_request util_request(const char *salt) {
    nvrtc_request req = {.source = "util.cu", .arch = "sm_90"};
    req.options[req.n_options++] = "-DSTOF_DTYPE=1";
    if (salt)
        req.options[req.n_options++] = salt;
    return req;
}

/* util.cu with salt through nvrtc_worker_compile; the cubin is dropped. */
static int worker_compile_util(const char *salt, int *handled, stof_error *err) {
    nvrtc_request req = util_request(salt);
    void *bin = NULL;
    size_t size = 0;
    int rc = nvrtc_worker_compile(&req, &bin, &size, handled, err);
    free(bin);
    return rc;
}

static void test_off_by_default(void) {
    nvrtc_request req = util_request(NULL);
    void *bin = NULL;
    size_t size = 0;
    int handled = -1;
    stof_error err = {0};
    int rc = nvrtc_worker_compile(&req, &bin, &size, &handled, &err);
    CHECK(rc == STOF_OK && handled == 0 && bin == NULL);
    nvrtc_workers_info wi;
    nvrtc_workers_status(&wi);
    CHECK(!wi.on && wi.started == 0 && wi.running == 0);
}

/* The worker's cubin is the one compiled here, byte for byte. */
static void test_same_cubin(void) {
    nvrtc_request req = util_request("-DSTOF_TEST_SALT=1");
    void *here = NULL, *there = NULL;
    size_t here_size = 0, there_size = 0;
    int handled = 0;
    stof_error err = {0};
    CHECK(nvrtc_compile_in_process(&req, &here, &here_size, &err) == STOF_OK);
    int rc = nvrtc_worker_compile(&req, &there, &there_size, &handled, &err);
    CHECK_MSG(rc == STOF_OK && handled, "rc %d handled %d: %s", rc, handled, err.msg);
    CHECK(there && there_size == here_size && memcmp(here, there, here_size) == 0);
    free(here);
    free(there);
    nvrtc_workers_info wi;
    nvrtc_workers_status(&wi);
    CHECK(wi.on && wi.started == 1 && wi.running == 1 && wi.compiles == 1);
}

static void test_compile_error_has_log(void) {
    nvrtc_request req = {.source = "attention_block.cu", .arch = "sm_90"};
    req.options[req.n_options++] = "-DSTOF_DTYPE=7"; /* the kernel's static_assert */
    void *bin = NULL;
    size_t size = 0;
    int handled = 0;
    stof_error err = {0};
    int rc = nvrtc_worker_compile(&req, &bin, &size, &handled, &err);
    CHECK(handled && rc == STOF_ERR_COMPILE && bin == NULL);
    CHECK_MSG(strstr(err.msg, "NVRTC could not compile attention_block.cu") &&
                  strstr(err.msg, "fp16 or bf16"), "%s", err.msg);
}

/* Several threads through one cache: every kernel arrives, in workers. */
typedef struct job {
    nvrtc_cache *cache;
    int first, n, failed;
} job;

static void *compile_some(void *arg) {
    job *j = arg;
    for (int i = j->first; i < j->first + j->n; i++) {
        char salt[48];
        snprintf(salt, sizeof salt, "-DSTOF_TEST_SALT=%d", 100 + i);
        nvrtc_request req = util_request(salt);
        const void *bin;
        size_t size;
        stof_error err = {0};
        if (nvrtc_get(j->cache, &req, &bin, &size, &err) != STOF_OK || size < 4 ||
            memcmp(bin, "\x7f" "ELF", 4) != 0)
            j->failed++;
    }
    return NULL;
}

static void test_threads(void) {
    nvrtc_cache cache;
    nvrtc_cache_init(&cache, ""); /* memory only */
    nvrtc_workers_info before, after;
    nvrtc_workers_status(&before);
    enum { THREADS = 4, EACH = 3 };
    pthread_t t[THREADS];
    job jobs[THREADS];
    for (int i = 0; i < THREADS; i++) {
        jobs[i] = (job){&cache, i * EACH, EACH, 0};
        pthread_create(&t[i], NULL, compile_some, &jobs[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK(jobs[i].failed == 0);
    }
    nvrtc_workers_status(&after);
    CHECK(after.on && after.compiles - before.compiles == THREADS * EACH);
    CHECK(after.running >= 1 && after.running <= THREADS + 1);
    CHECK(cache.compiled == THREADS * EACH);
    nvrtc_cache_free(&cache);
}

/* Killed while idle, and asked at once: whether the next request finds it
 * dead (a new worker takes it) or sends it to the dying worker (it goes to
 * a new one once more), it succeeds in a new worker. */
static void test_killed_worker_replaced(void) {
    nvrtc_workers_info before, after;
    nvrtc_workers_status(&before);
    /* every worker is a child of this process: kill them all */
    char path[64], line[4096] = "";
    snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("(no %s: killed-worker case not run)\n", path);
        return;
    }
    if (!fgets(line, sizeof line, f))
        line[0] = '\0';
    fclose(f);
    int killed = 0;
    for (char *tok = strtok(line, " \n"); tok; tok = strtok(NULL, " \n"))
        killed += kill((pid_t)atoi(tok), SIGKILL) == 0;
    CHECK(killed >= 1);
    int handled = 0;
    stof_error err = {0};
    int rc = worker_compile_util("-DSTOF_TEST_SALT=2", &handled, &err);
    CHECK_MSG(rc == STOF_OK, "%s", err.msg);
    nvrtc_workers_status(&after);
    CHECK(handled && after.on && after.started > before.started);
}

/* Idle workers end by themselves ($STOF_COMPILE_WORKER_IDLE_S, set to 0.3 s
 * before the first worker started); the next request starts a new one. */
static void test_idle_workers_end(void) {
    nvrtc_workers_info before, after;
    nvrtc_workers_status(&before);
    usleep(800 * 1000);
    int handled = 0;
    stof_error err = {0};
    int rc = worker_compile_util("-DSTOF_TEST_SALT=4", &handled, &err);
    nvrtc_workers_status(&after);
    CHECK_MSG(rc == STOF_OK && handled, "%s", err.msg);
    /* the workers of before had ended (or were ending): a new one took it */
    CHECK(after.started > before.started);
}

/* A worker that will not talk, or talks for other sources, turns workers
 * off with a reason; compiling goes on here. */
static void test_broken_worker_turns_off(const char *exe, const char *env, const char *why) {
    nvrtc_workers_shutdown();
    if (env)
        setenv(env, "1", 1);
    nvrtc_workers_enable(exe);
    int handled = 1;
    stof_error err = {0};
    int rc = worker_compile_util("-DSTOF_TEST_SALT=3", &handled, &err);
    CHECK(rc == STOF_OK && handled == 0);
    nvrtc_workers_info wi;
    nvrtc_workers_status(&wi);
    CHECK_MSG(!wi.on && strstr(wi.why_off, why), "%s: on %d, why '%s'", exe, wi.on, wi.why_off);
    /* nvrtc_get still compiles, here */
    nvrtc_request req = util_request("-DSTOF_TEST_SALT=3");
    nvrtc_cache cache;
    nvrtc_cache_init(&cache, "");
    const void *cubin;
    size_t size;
    CHECK(nvrtc_get(&cache, &req, &cubin, &size, &err) == STOF_OK);
    nvrtc_cache_free(&cache);
    if (env)
        unsetenv(env);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], NVRTC_WORKER_ARG) == 0) {
        if (getenv("STOF_TEST_BAD_HELLO")) { /* a worker of another build */
            unsigned long long other = 12345;
            return write(0, &other, sizeof other) == sizeof other ? 0 : 1;
        }
        return nvrtc_worker_main(0);
    }
    unsetenv("STOF_COMPILE_WORKER");
    setenv("STOF_COMPILE_WORKER_IDLE_S", "0.3", 1);
    int major, minor;
    stof_error err = {0};
    if (nvrtc_version(&major, &minor, &err) != STOF_OK) {
        printf("SKIPPED: %s\n", err.msg);
        return 77;
    }
    test_off_by_default();
    nvrtc_workers_enable("/proc/self/exe");
    test_same_cubin();
    test_compile_error_has_log();
    test_threads();
    test_killed_worker_replaced();
    test_idle_workers_end();
    test_broken_worker_turns_off("/bin/true", NULL, "did not answer");
    test_broken_worker_turns_off("/nonexistent/stof", NULL, "cannot start");
    test_broken_worker_turns_off("/proc/self/exe", "STOF_TEST_BAD_HELLO",
                                 "other kernel sources");
    nvrtc_workers_shutdown();
    return check_summary("test_nvrtc_worker");
}
