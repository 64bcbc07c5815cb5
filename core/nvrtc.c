#include "core/nvrtc.h"

#include <errno.h>
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/kernels.h"
#include "core/util.h"

#ifndef STOF_CUDA_INCLUDE_DIR
#define STOF_CUDA_INCLUDE_DIR "/usr/local/cuda/include"
#endif

void nvrtc_cache_init(nvrtc_cache *c, const char *dir) {
    memset(c, 0, sizeof *c);
    if (dir) {
        snprintf(c->dir, sizeof c->dir, "%s", dir);
        return;
    }
    const char *env = getenv("STOF_CACHE_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (env && *env)
        snprintf(c->dir, sizeof c->dir, "%s", env);
    else if (xdg && *xdg)
        snprintf(c->dir, sizeof c->dir, "%s/stof", xdg);
    else if (home && *home)
        snprintf(c->dir, sizeof c->dir, "%s/.cache/stof", home);
}

void nvrtc_cache_free(nvrtc_cache *c) {
    for (int i = 0; i < c->n; i++)
        free(c->entries[i].cubin);
    free(c->entries);
    memset(c, 0, sizeof *c);
}

int nvrtc_version(int *major, int *minor, stof_error *err) {
    if (nvrtcVersion(major, minor) != NVRTC_SUCCESS)
        return err_set(err, STOF_ERR_COMPILE, "NVRTC did not report its version");
    return STOF_OK;
}

uint64_t nvrtc_key(const nvrtc_request *req) {
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    uint64_t h = util_hash(UTIL_HASH_SEED, &major, sizeof major);
    h = util_hash(h, &minor, sizeof minor);
    h = util_hash_str(h, req->arch);
    h = util_hash_str(h, req->source);
    const kernel_source *src = kernel_find(req->source);
    if (src)
        h = util_hash(h, src->text, src->len);
    /* headers may be included by any kernel: all of them are part of the key */
    for (int i = 0; i < kernel_source_count; i++) {
        const char *name = kernel_sources[i].name;
        size_t n = strlen(name);
        if (n > 4 && strcmp(name + n - 4, ".cuh") == 0)
            h = util_hash(h, kernel_sources[i].text, kernel_sources[i].len);
    }
    for (int i = 0; i < req->n_options; i++) {
        h = util_hash_str(h, req->options[i]);
        h = util_hash(h, "\0", 1);
    }
    return h;
}

static nvrtc_entry *memory_lookup(nvrtc_cache *c, uint64_t key) {
    for (int i = 0; i < c->n; i++)
        if (c->entries[i].key == key)
            return &c->entries[i];
    return NULL;
}

static int memory_insert(nvrtc_cache *c, uint64_t key, void *cubin, size_t size,
                         nvrtc_entry **out, stof_error *err) {
    if (c->n == c->cap) {
        int ncap = c->cap ? 2 * c->cap : 16;
        nvrtc_entry *e = err_realloc(c->entries, (size_t)ncap * sizeof *e, err);
        if (!e) {
            free(cubin);
            return STOF_ERR_NOMEM;
        }
        c->entries = e;
        c->cap = ncap;
    }
    nvrtc_entry *e = &c->entries[c->n++];
    e->key = key;
    e->cubin = cubin;
    e->size = size;
    *out = e;
    return STOF_OK;
}

static void disk_path(const nvrtc_cache *c, uint64_t key, char *buf, size_t n) {
    snprintf(buf, n, "%s/%016llx.cubin", c->dir, (unsigned long long)key);
}

static void *disk_load(const nvrtc_cache *c, uint64_t key, size_t *size) {
    if (!c->dir[0])
        return NULL;
    char path[1200];
    disk_path(c, key, path, sizeof path);
    void *bin = util_read_file(path, size);
    /* a truncated or foreign file is ignored and rebuilt */
    if (bin && (*size < 4 || memcmp(bin, "\x7f" "ELF", 4) != 0)) {
        free(bin);
        bin = NULL;
    }
    return bin;
}

/* mkdir -p for the cache folder. */
static int make_dirs(const char *dir) {
    char tmp[1024];
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

/* Best effort: a cache that cannot be written only costs a recompile later.
 * Written to a temporary name and renamed so readers never see half a file. */
static void disk_store(const nvrtc_cache *c, uint64_t key, const void *cubin, size_t size) {
    if (!c->dir[0] || make_dirs(c->dir) != 0)
        return;
    char path[1200], tmp[1300];
    disk_path(c, key, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return;
    int ok = fwrite(cubin, 1, size, f) == size;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0)
        remove(tmp);
}

/* Collects the embedded .cuh files as NVRTC headers. */
static int header_list(const char ***texts, const char ***names, int *n, stof_error *err) {
    int count = 0;
    for (int i = 0; i < kernel_source_count; i++) {
        size_t len = strlen(kernel_sources[i].name);
        count += len > 4 && strcmp(kernel_sources[i].name + len - 4, ".cuh") == 0;
    }
    *texts = err_calloc((size_t)count + 1, sizeof **texts, err);
    *names = err_calloc((size_t)count + 1, sizeof **names, err);
    if (!*texts || !*names) {
        free(*texts);
        free(*names);
        return STOF_ERR_NOMEM;
    }
    *n = 0;
    for (int i = 0; i < kernel_source_count; i++) {
        size_t len = strlen(kernel_sources[i].name);
        if (len > 4 && strcmp(kernel_sources[i].name + len - 4, ".cuh") == 0) {
            (*texts)[*n] = kernel_sources[i].text;
            (*names)[*n] = kernel_sources[i].name;
            (*n)++;
        }
    }
    return STOF_OK;
}

static int compile_error(nvrtcProgram prog, const nvrtc_request *req, nvrtcResult r,
                         stof_error *err) {
    size_t log_size = 0;
    char log[768] = "";
    if (nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 1) {
        char *full = malloc(log_size);
        if (full && nvrtcGetProgramLog(prog, full) == NVRTC_SUCCESS)
            snprintf(log, sizeof log, "%s", full);
        free(full);
    }
    err_set(err, STOF_ERR_COMPILE, "NVRTC could not compile %s for %s (%s):\n%s", req->source,
            req->arch, nvrtcGetErrorString(r), log);
    return STOF_ERR_COMPILE;
}

static int build_options(const nvrtc_request *req, const char **opts, int *n) {
    static const char *fixed[] = {"-std=c++17", "-default-device", "--use_fast_math",
                                  "-I" STOF_CUDA_INCLUDE_DIR};
    static _Thread_local char arch_opt[64];
    snprintf(arch_opt, sizeof arch_opt, "-arch=%s", req->arch);
    int k = 0;
    opts[k++] = arch_opt;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        opts[k++] = fixed[i];
    for (int i = 0; i < req->n_options; i++)
        opts[k++] = req->options[i];
    *n = k;
    return STOF_OK;
}

static int compile_cubin(const nvrtc_request *req, void **cubin, size_t *size, stof_error *err) {
    const kernel_source *src = kernel_find(req->source);
    if (!src)
        return err_set(err, STOF_ERR_INVALID, "no kernel source named '%s' is built in",
                       req->source);
    const char **htexts, **hnames;
    int nh, rc = header_list(&htexts, &hnames, &nh, err);
    if (rc)
        return rc;
    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, src->text, src->name, nh, htexts, hnames);
    free(htexts);
    free(hnames);
    if (r != NVRTC_SUCCESS)
        return err_set(err, STOF_ERR_COMPILE, "nvrtcCreateProgram(%s): %s", req->source,
                       nvrtcGetErrorString(r));
    const char *opts[NVRTC_MAX_OPTIONS + 8];
    int nopts;
    build_options(req, opts, &nopts);
    r = nvrtcCompileProgram(prog, nopts, opts);
    if (r != NVRTC_SUCCESS) {
        compile_error(prog, req, r, err);
        nvrtcDestroyProgram(&prog);
        return STOF_ERR_COMPILE;
    }
    r = nvrtcGetCUBINSize(prog, size);
    if (r == NVRTC_SUCCESS && (*cubin = err_malloc(*size, err)) != NULL)
        r = nvrtcGetCUBIN(prog, *cubin);
    nvrtcDestroyProgram(&prog);
    if (r != NVRTC_SUCCESS)
        return err_set(err, STOF_ERR_COMPILE, "NVRTC gave no cubin for %s: %s", req->source,
                       nvrtcGetErrorString(r));
    return *cubin ? STOF_OK : STOF_ERR_NOMEM;
}

int nvrtc_get(nvrtc_cache *c, const nvrtc_request *req, const void **cubin, size_t *size,
              stof_error *err) {
    if (req->n_options < 0 || req->n_options > NVRTC_MAX_OPTIONS)
        return err_set(err, STOF_ERR_INVALID, "too many compile options (%d)", req->n_options);
    uint64_t key = nvrtc_key(req);
    nvrtc_entry *e = memory_lookup(c, key);
    if (e) {
        c->memory_hits++;
    } else {
        size_t n = 0;
        void *bin = disk_load(c, key, &n);
        int rc;
        if (bin) {
            c->disk_hits++;
        } else {
            if ((rc = compile_cubin(req, &bin, &n, err)))
                return rc;
            c->compiled++;
            disk_store(c, key, bin, n);
        }
        if ((rc = memory_insert(c, key, bin, n, &e, err)))
            return rc;
    }
    *cubin = e->cubin;
    *size = e->size;
    return STOF_OK;
}
