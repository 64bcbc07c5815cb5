/* NVRTC: every embedded kernel compiles for sm_80 and sm_90 (no GPU needed),
 * the cache answers from memory and from disk, and errors carry the log. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/gpu/kernels.h"
#include "core/gpu/nvrtc.h"

static const char *archs[] = {"sm_80", "sm_90"};
static const char *dtypes[] = {"-DSTOF_DTYPE=1", "-DSTOF_DTYPE=2"};

static int is_kernel_file(const char *name) {
    size_t n = strlen(name);
    return n > 3 && strcmp(name + n - 3, ".cu") == 0;
}

static void test_every_kernel_compiles(nvrtc_cache *c) {
    int compiled = 0;
    for (int i = 0; i < kernel_source_count; i++) {
        if (!is_kernel_file(kernel_sources[i].name))
            continue;
        for (int a = 0; a < 2; a++) {
            for (int d = 0; d < 2; d++) {
                nvrtc_request req = {.source = kernel_sources[i].name, .arch = archs[a]};
                req.options[req.n_options++] = dtypes[d];
                const void *bin;
                size_t size;
                stof_error err = {0};
                int rc = nvrtc_get(c, &req, &bin, &size, &err);
                CHECK_MSG(rc == STOF_OK, "%s %s %s: %s", req.source, req.arch, dtypes[d],
                          err.msg);
                if (rc == STOF_OK) {
                    CHECK(size > 4 && memcmp(bin, "\x7f" "ELF", 4) == 0);
                    compiled++;
                }
            }
        }
    }
    CHECK(compiled >= 4);
    printf("compiled %d kernel variants\n", compiled);
}

static void test_cache(const char *dir) {
    nvrtc_cache c;
    nvrtc_cache_init(&c, dir);
    nvrtc_request req = {.source = "util.cu", .arch = "sm_90", .n_options = 1};
    req.options[0] = "-DSTOF_DTYPE=1";
    const void *b1, *b2;
    size_t s1, s2;
    stof_error err = {0};
    CHECK_EQ_INT(nvrtc_get(&c, &req, &b1, &s1, &err), STOF_OK);
    CHECK_EQ_INT(nvrtc_get(&c, &req, &b2, &s2, &err), STOF_OK);
    CHECK(b1 == b2 && s1 == s2);
    CHECK_EQ_INT(c.compiled, 1);
    CHECK_EQ_INT(c.memory_hits, 1);
    /* the slowest compile, named by source and constants */
    CHECK(c.slowest_s > 0);
    CHECK_MSG(strcmp(c.slowest, "util.cu STOF_DTYPE=1") == 0, "slowest: '%s'", c.slowest);
    nvrtc_cache_free(&c);

    /* a fresh process (fresh cache object) finds it on disk */
    nvrtc_cache_init(&c, dir);
    CHECK_EQ_INT(nvrtc_get(&c, &req, &b1, &s1, &err), STOF_OK);
    CHECK_EQ_INT(c.compiled, 0);
    CHECK_EQ_INT(c.disk_hits, 1);
    CHECK_EQ_INT(s1, s2);
    nvrtc_cache_free(&c);

    /* a corrupted file on disk is rebuilt, not trusted, and reported */
    char path[2048];
    snprintf(path, sizeof path, "%s/%016llx.cubin", dir, (unsigned long long)nvrtc_key(&req));
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs("garbage", f);
        fclose(f);
    }
    nvrtc_cache_init(&c, dir);
    CHECK_EQ_INT(nvrtc_get(&c, &req, &b1, &s1, &err), STOF_OK);
    CHECK_EQ_INT(c.compiled, 1);
    int problems = 0;
    const char *w = nvrtc_cache_warning(&c, &problems);
    CHECK_EQ_INT(problems, 1);
    CHECK(w && strstr(w, "failed its check"));
    nvrtc_cache_free(&c);

    /* a cubin cut short keeps its ELF magic: still refused */
    struct stat st;
    CHECK(stat(path, &st) == 0);
    CHECK(truncate(path, st.st_size / 2) == 0);
    nvrtc_cache_init(&c, dir);
    CHECK_EQ_INT(nvrtc_get(&c, &req, &b1, &s1, &err), STOF_OK);
    CHECK_EQ_INT(c.compiled, 1);
    CHECK_EQ_INT(c.disk_hits, 0);
    CHECK(nvrtc_cache_warning(&c, NULL) != NULL);
    nvrtc_cache_free(&c);
    /* ... and the fresh file written in its place is found next time */
    nvrtc_cache_init(&c, dir);
    CHECK_EQ_INT(nvrtc_get(&c, &req, &b1, &s1, &err), STOF_OK);
    CHECK_EQ_INT(c.disk_hits, 1);
    CHECK(nvrtc_cache_warning(&c, NULL) == NULL);
    nvrtc_cache_free(&c);

    /* a valid cubin copied to another key's name: not that key's, refused */
    {
        nvrtc_request other = req;
        other.options[0] = "-DSTOF_DTYPE=2";
        char other_path[2048], cmd[4200];
        snprintf(other_path, sizeof other_path, "%s/%016llx.cubin", dir,
                 (unsigned long long)nvrtc_key(&other));
        snprintf(cmd, sizeof cmd, "cp '%s' '%s'", path, other_path);
        CHECK(system(cmd) == 0);
        nvrtc_cache_init(&c, dir);
        CHECK_EQ_INT(nvrtc_get(&c, &other, &b1, &s1, &err), STOF_OK);
        CHECK_EQ_INT(c.disk_hits, 0);
        CHECK_EQ_INT(c.compiled, 1);
        w = nvrtc_cache_warning(&c, NULL);
        CHECK(w && strstr(w, "failed its check"));
        nvrtc_cache_free(&c);
    }

    /* a directory in the file's place: compiled, and said (read and write) */
    CHECK(remove(path) == 0 && mkdir(path, 0755) == 0);
    nvrtc_cache_init(&c, dir);
    CHECK_EQ_INT(nvrtc_get(&c, &req, &b1, &s1, &err), STOF_OK);
    CHECK_EQ_INT(c.compiled, 1);
    w = nvrtc_cache_warning(&c, &problems);
    CHECK_EQ_INT(problems, 2);
    CHECK(w && strstr(w, "a directory"));
    nvrtc_cache_free(&c);
    CHECK(rmdir(path) == 0);

    /* a cache folder that cannot be made: compiled, kept in memory, said */
    char blocked[2100];
    snprintf(blocked, sizeof blocked, "%s/file-not-folder", dir);
    f = fopen(blocked, "wb");
    if (f)
        fclose(f);
    snprintf(blocked + strlen(blocked), sizeof blocked - strlen(blocked), "/sub");
    nvrtc_cache_init(&c, blocked);
    CHECK_EQ_INT(nvrtc_get(&c, &req, &b1, &s1, &err), STOF_OK);
    w = nvrtc_cache_warning(&c, NULL);
    CHECK(w && strstr(w, "cannot make the kernel cache folder"));
    nvrtc_cache_free(&c);

    /* a path too long for the cache's file names: memory only, said, never cut */
    char longdir[1100];
    memset(longdir, 'a', sizeof longdir - 1);
    longdir[0] = '/';
    longdir[sizeof longdir - 1] = '\0';
    nvrtc_cache_init(&c, longdir);
    CHECK(c.dir[0] == '\0');
    w = nvrtc_cache_warning(&c, NULL);
    CHECK(w && strstr(w, "kept in memory only"));
    nvrtc_cache_free(&c);

    /* options and architecture are part of the key */
    nvrtc_request other = req;
    other.arch = "sm_80";
    CHECK(nvrtc_key(&other) != nvrtc_key(&req));
    other = req;
    other.options[0] = "-DSTOF_DTYPE=2";
    CHECK(nvrtc_key(&other) != nvrtc_key(&req));
}

static void test_errors(nvrtc_cache *c) {
    const void *bin;
    size_t size;
    stof_error err = {0};
    nvrtc_request bad = {.source = "util.cu", .arch = "sm_90", .n_options = 1};
    bad.options[0] = "-DSTOF_DTYPE=7"; /* no such element type: must not compile */
    CHECK_EQ_INT(nvrtc_get(c, &bad, &bin, &size, &err), STOF_ERR_COMPILE);
    CHECK_CONTAINS(err.msg, "util.cu");
    CHECK_CONTAINS(err.msg, "error"); /* the compiler's log comes with it */

    nvrtc_request missing = {.source = "nosuch.cu", .arch = "sm_90"};
    CHECK_EQ_INT(nvrtc_get(c, &missing, &bin, &size, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "nosuch.cu");
}

int main(void) {
    int major = 0, minor = 0;
    stof_error err = {0};
    CHECK_EQ_INT(nvrtc_version(&major, &minor, &err), STOF_OK);
    printf("NVRTC %d.%d\n", major, minor);
    CHECK(kernel_find("util.cu") != NULL);
    CHECK(kernel_find("common.cuh") != NULL);
    CHECK(kernel_find("nosuch.cu") == NULL);

    char dir[] = "/tmp/stof-nvrtc-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    nvrtc_cache c;
    nvrtc_cache_init(&c, "");
    test_every_kernel_compiles(&c);
    test_errors(&c);
    nvrtc_cache_free(&c);
    test_cache(dir);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return check_summary("test_nvrtc");
}
