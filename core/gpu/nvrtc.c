#include "core/gpu/nvrtc.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base/error.h"
#include "core/base/file.h"
#include "core/gpu/kernels.h"
#include "core/base/memo.h"
#include "core/gpu/nvrtc_worker.h"
#include "core/base/util.h"

/* A cubin in the memory cache. */
typedef struct nvrtc_cubin {
    void *bin;
    size_t size;
    int ahead; /* made by a task of nvrtc_submit */
    int asked; /* nvrtc_get returned it */
} nvrtc_cubin;

static void cubin_free(void *value) {
    nvrtc_cubin *cb = value;
    free(cb->bin);
    free(cb);
}

/* Records a problem of the disk cache (counted; the first one's text kept
 * for nvrtc_cache_warning). Work goes on: the kernel is compiled anew. */
static void disk_warn(nvrtc_cache *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void disk_warn(nvrtc_cache *c, const char *fmt, ...) {
    pthread_mutex_lock(&c->lock);
    if (c->disk_problems++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->disk_problem, sizeof c->disk_problem, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&c->lock);
}

/* Room a cache path keeps for "/<16 hex digits>.cubin.tmp-XXXXXX". */
#define NVRTC_DIR_MAX (sizeof ((nvrtc_cache *)0)->dir - 48)

static void cache_dir_set(nvrtc_cache *c, const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b);
    if (n >= NVRTC_DIR_MAX) {
        c->dir[0] = '\0';
        disk_warn(c, "the kernel cache folder's path has %zu characters, more than %zu: "
                     "kernels are kept in memory only", n, (size_t)NVRTC_DIR_MAX - 1);
        return;
    }
    snprintf(c->dir, sizeof c->dir, "%s%s", a, b);
}

void nvrtc_cache_init(nvrtc_cache *c, const char *dir) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    memo_create(0, cubin_free, &c->mem, NULL); /* NULL on failure: nvrtc_get says so */
    if (dir) {
        cache_dir_set(c, dir, "");
        return;
    }
    const char *env = getenv("STOF_CACHE_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (env && *env)
        cache_dir_set(c, env, "");
    else if (xdg && *xdg)
        cache_dir_set(c, xdg, "/stof");
    else if (home && *home)
        cache_dir_set(c, home, "/.cache/stof");
}

const char *nvrtc_cache_warning(const nvrtc_cache *c, int *count) {
    if (count)
        *count = c->disk_problems;
    return c->disk_problems ? c->disk_problem : NULL;
}

void nvrtc_cache_free(nvrtc_cache *c) {
    memo_free(c->mem);
    pthread_mutex_destroy(&c->lock);
    memset(c, 0, sizeof *c);
}

uint64_t nvrtc_key(const nvrtc_request *req) {
    int major = 0, minor = 0;
    nvrtc_version(&major, &minor, NULL);
    uint64_t h = util_hash(UTIL_HASH_SEED, &major, sizeof major);
    h = util_hash(h, &minor, sizeof minor);
    h = util_hash_str(h, req->arch);
    h = util_hash_str(h, req->source);
    const kernel_source *src = kernel_find(req->source);
    if (src)
        h = util_hash(h, src->text, src->len);
    /* headers may be included by any kernel: all of them are part of the key */
    for (int i = 0; i < kernel_source_count; i++)
        if (kernel_is_header(&kernel_sources[i]))
            h = util_hash(h, kernel_sources[i].text, kernel_sources[i].len);
    for (int i = 0; i < req->n_options; i++) {
        h = util_hash_str(h, req->options[i]);
        h = util_hash(h, "\0", 1);
    }
    return h;
}

static void disk_path(const nvrtc_cache *c, uint64_t key, char *buf, size_t n) {
    snprintf(buf, n, "%s/%016llx.cubin", c->dir, (unsigned long long)key);
}

/* A cached kernel is its cubin and this trailer: a magic word and a hash of
 * the cache key and the cubin's bytes. A file that fails the check (cut
 * short, altered, not ours, or another key's copied to this name) is
 * reported and compiled anew, never loaded. */
typedef struct disk_trailer {
    char magic[8];
    uint64_t hash;
} disk_trailer;
static const char disk_magic[8] = {'s', 't', 'o', 'f', 'c', 'u', 'b', '2'};

static uint64_t disk_hash(uint64_t key, const void *cubin, size_t size) {
    return util_hash(util_hash(UTIL_HASH_SEED, &key, sizeof key), cubin, size);
}

static void *disk_load(nvrtc_cache *c, uint64_t key, size_t *size) {
    if (!c->dir[0])
        return NULL;
    char path[sizeof c->dir + 64];
    disk_path(c, key, path, sizeof path);
    if (!file_exists(path))
        return NULL;
    char *bin = NULL;
    size_t len = 0;
    stof_error err = {0};
    if (file_read(path, "cached kernel", FILE_LIMIT_CACHE, &bin, &len, &err) != STOF_OK) {
        disk_warn(c, "%s: compiled anew", err.msg);
        return NULL;
    }
    disk_trailer t;
    int ok = len > sizeof t;
    if (ok) {
        memcpy(&t, bin + len - sizeof t, sizeof t);
        ok = memcmp(t.magic, disk_magic, sizeof disk_magic) == 0 &&
             t.hash == disk_hash(key, bin, len - sizeof t);
    }
    if (!ok) {
        free(bin);
        disk_warn(c, "the cached kernel %s failed its check (cut short or altered): "
                     "compiled anew", path);
        return NULL;
    }
    *size = len - sizeof t;
    return bin;
}

int nvrtc_make_dirs(const char *dir) {
    char tmp[sizeof ((nvrtc_cache *)0)->dir];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* A cache that cannot be written costs a recompile later, and is reported
 * (nvrtc_cache_warning). Written beside its name and renamed (file.h), so
 * readers never see half a file. */
static void disk_store(nvrtc_cache *c, uint64_t key, const void *cubin, size_t size) {
    if (!c->dir[0])
        return;
    if (nvrtc_make_dirs(c->dir) != 0) {
        disk_warn(c, "cannot make the kernel cache folder %s: %s", c->dir, strerror(errno));
        return;
    }
    char path[sizeof c->dir + 64];
    disk_path(c, key, path, sizeof path);
    disk_trailer t;
    memcpy(t.magic, disk_magic, sizeof t.magic);
    t.hash = disk_hash(key, cubin, size);
    file_out o;
    stof_error err = {0};
    int rc = file_out_open(&o, path, "cached kernel", &err);
    if (!rc && (fwrite(cubin, 1, size, o.f) != size || fwrite(&t, sizeof t, 1, o.f) != 1)) {
        rc = err_set(&err, STOF_ERR_IO, "cannot write the cached kernel %s: %s", path,
                     strerror(errno));
        file_out_abort(&o);
    } else if (!rc) {
        rc = file_out_commit(&o, &err);
    }
    if (rc)
        disk_warn(c, "%s", err.msg);
}

/* ---- the memory cache ------------------------------------------------------------------ */

/* What computing one key needs (memo_compute's argument). */
typedef struct nvrtc_make {
    nvrtc_cache *c;
    const nvrtc_request *req;
    uint64_t key;
    int ahead; /* for nvrtc_submit */
    int ran;   /* set when the computation ran on this thread */
} nvrtc_make;

static void count_compile(nvrtc_cache *c, int *counter, double compile_s) {
    pthread_mutex_lock(&c->lock);
    if (counter)
        (*counter)++;
    c->compile_s += compile_s;
    pthread_mutex_unlock(&c->lock);
}

/* Adds one successful compile of source (a built-in name) to its line. */
static void count_source(nvrtc_cache *c, const char *source, double compile_s) {
    pthread_mutex_lock(&c->lock);
    int i = 0;
    while (i < c->n_sources && strcmp(c->by_source[i].source, source) != 0)
        i++;
    if (i == c->n_sources && i < NVRTC_MAX_SOURCES)
        c->by_source[c->n_sources++] = (nvrtc_source_stats){kernel_find(source)->name, 0, 0};
    if (i < c->n_sources) {
        c->by_source[i].compiled++;
        c->by_source[i].compile_s += compile_s;
    }
    pthread_mutex_unlock(&c->lock);
}

/* Remembers the compile of req that took s if it is the slowest so far. */
static void note_slowest(nvrtc_cache *c, const nvrtc_request *req, double s) {
    pthread_mutex_lock(&c->lock);
    if (s > c->slowest_s) {
        c->slowest_s = s;
        size_t n = (size_t)snprintf(c->slowest, sizeof c->slowest, "%s",
                                    kernel_find(req->source)->name);
        for (int i = 0; i < req->n_options && n < sizeof c->slowest; i++)
            if (strncmp(req->options[i], "-D", 2) == 0)
                n += (size_t)snprintf(c->slowest + n, sizeof c->slowest - n, " %s",
                                      req->options[i] + 2);
    }
    pthread_mutex_unlock(&c->lock);
}

/* From disk, else compiled (and written to disk). */
static int make_cubin(void *arg, void **value, size_t *bytes, stof_error *err) {
    nvrtc_make *mk = arg;
    nvrtc_cache *c = mk->c;
    mk->ran = 1;
    nvrtc_cubin *cb = err_calloc(1, sizeof *cb, err);
    if (!cb)
        return STOF_ERR_NOMEM;
    cb->ahead = mk->ahead;
    cb->bin = disk_load(c, mk->key, &cb->size);
    if (cb->bin) {
        count_compile(c, &c->disk_hits, 0);
    } else {
        double t0 = util_now();
        int handled;
        int rc = nvrtc_worker_compile(mk->req, &cb->bin, &cb->size, &handled, err);
        if (!handled)
            rc = nvrtc_compile_in_process(mk->req, &cb->bin, &cb->size, err);
        double dt = util_now() - t0;
        count_compile(c, rc ? &c->failed : &c->compiled, dt);
        if (!rc) {
            count_source(c, mk->req->source, dt);
            note_slowest(c, mk->req, dt);
        }
        if (rc) {
            free(cb);
            return rc;
        }
        disk_store(c, mk->key, cb->bin, cb->size);
    }
    if (mk->ahead)
        count_compile(c, &c->ahead, 0);
    *value = cb;
    *bytes = cb->size;
    return STOF_OK;
}

static int check_request(const nvrtc_cache *c, const nvrtc_request *req, stof_error *err) {
    if (req->n_options < 0 || req->n_options > NVRTC_MAX_OPTIONS)
        return err_set(err, STOF_ERR_INVALID, "too many compile options (%d)", req->n_options);
    if (!req->source || !req->arch)
        return err_set(err, STOF_ERR_INVALID, "a compile request without a source or an arch");
    if (!c->mem)
        return err_set(err, STOF_ERR_NOMEM, "the kernel cache could not be allocated");
    return STOF_OK;
}

int nvrtc_get(nvrtc_cache *c, const nvrtc_request *req, const void **cubin, size_t *size,
              stof_error *err) {
    int rc = check_request(c, req, err);
    if (rc)
        return rc;
    double t0 = util_now();
    nvrtc_make mk = {c, req, nvrtc_key(req), 0, 0};
    void *value;
    rc = memo_get(c->mem, mk.key, make_cubin, &mk, &value, err);
    pthread_mutex_lock(&c->lock);
    if (!rc) {
        nvrtc_cubin *cb = value;
        *cubin = cb->bin;
        *size = cb->size;
        c->memory_hits += !mk.ran;
        c->ahead_used += cb->ahead && !cb->asked;
        cb->asked = 1;
    }
    c->get_s += util_now() - t0;
    pthread_mutex_unlock(&c->lock);
    if (!rc) /* never evicted (no budget): the cubin stays valid */
        memo_unpin(c->mem, mk.key);
    return rc;
}

/* ---- compiling ahead ------------------------------------------------------------------------ */

/* A queued compile: the cache, the key, and a copy of the request whose
 * strings live in text. */
typedef struct nvrtc_job {
    nvrtc_cache *c;
    uint64_t key;
    nvrtc_request req;
    char text[];
} nvrtc_job;

static size_t request_text_bytes(const nvrtc_request *req) {
    size_t n = strlen(req->source) + 1 + strlen(req->arch) + 1;
    for (int i = 0; i < req->n_options; i++)
        n += strlen(req->options[i]) + 1;
    return n;
}

static const char *copy_text(char **at, const char *s) {
    size_t n = strlen(s) + 1;
    memcpy(*at, s, n);
    const char *copy = *at;
    *at += n;
    return copy;
}

static nvrtc_job *job_new(nvrtc_cache *c, uint64_t key, const nvrtc_request *req,
                          stof_error *err) {
    nvrtc_job *j = err_malloc(sizeof *j + request_text_bytes(req), err);
    if (!j)
        return NULL;
    j->c = c;
    j->key = key;
    memset(&j->req, 0, sizeof j->req);
    char *at = j->text;
    j->req.source = copy_text(&at, req->source);
    j->req.arch = copy_text(&at, req->arch);
    for (int i = 0; i < req->n_options; i++)
        j->req.options[i] = copy_text(&at, req->options[i]);
    j->req.n_options = req->n_options;
    return j;
}

static void job_run(void *arg) {
    nvrtc_job *j = arg;
    nvrtc_make mk = {j->c, &j->req, j->key, 1, 0};
    memo_fill(j->c->mem, j->key, make_cubin, &mk, NULL); /* a failure is kept for nvrtc_get */
    free(j);
}

int nvrtc_submit(task_pool *pool, int tag, nvrtc_cache *c, const nvrtc_request *req,
                 stof_error *err) {
    int rc = check_request(c, req, err);
    if (rc)
        return rc;
    uint64_t key = nvrtc_key(req);
    if (memo_known(c->mem, key))
        return STOF_OK;
    nvrtc_job *j = job_new(c, key, req, err);
    if (!j)
        return STOF_ERR_NOMEM;
    return task_pool_submit(pool, tag, job_run, free, j, err);
}
