/* The one file reader and writer (core/base/file.h): regular files only,
 * size limits, no blocking on a FIFO, errors that say what the path is;
 * writes that never destroy what was there. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/base/file.h"

static char dir[] = "/tmp/stof-file-test-XXXXXX";

static const char *in_dir(const char *name) {
    static char path[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "%s/%s", dir, name);
    return path[k];
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_read_regular(void) {
    stof_error err = {0};
    const char *p = in_dir("a.lua");
    put(p, "return 1\n");
    char *text = NULL;
    size_t len = 0;
    CHECK_EQ_INT(file_read(p, "script", FILE_LIMIT_SCRIPT, &text, &len, &err), STOF_OK);
    CHECK_EQ_INT(len, 9);
    CHECK(text && strcmp(text, "return 1\n") == 0);
    free(text);
    /* Empty files are fine and NUL-terminated. */
    put(p, "");
    CHECK_EQ_INT(file_read(p, "script", FILE_LIMIT_SCRIPT, &text, &len, &err), STOF_OK);
    CHECK(text && text[0] == '\0' && len == 0);
    free(text);
}

static void test_read_refusals(void) {
    stof_error err = {0};
    char *text = NULL;
    size_t len = 0;
    CHECK_EQ_INT(file_read(dir, "script", FILE_LIMIT_SCRIPT, &text, &len, &err), STOF_ERR_IO);
    CHECK_CONTAINS(err.msg, "a directory, not a script");
    CHECK(text == NULL);
    CHECK_EQ_INT(file_read("/dev/zero", "plan", FILE_LIMIT_PLAN, &text, &len, &err), STOF_ERR_IO);
    CHECK_CONTAINS(err.msg, "/dev/zero: a character device, not a plan");
    /* A FIFO with no writer: refused at once, not waited on. */
    const char *fifo = in_dir("fifo");
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK_EQ_INT(file_read(fifo, "script", FILE_LIMIT_SCRIPT, &text, &len, &err), STOF_ERR_IO);
    CHECK_CONTAINS(err.msg, "a FIFO, not a script");
    int fd = -1;
    uint64_t size = 0;
    CHECK_EQ_INT(file_open_regular(fifo, "weights", 0, &fd, &size, &err), STOF_ERR_IO);
    CHECK(fd == -1);
    const char *missing = in_dir("missing.lua");
    CHECK_EQ_INT(file_read(missing, "script", FILE_LIMIT_SCRIPT, &text, &len, &err), STOF_ERR_IO);
    CHECK_CONTAINS(err.msg, "cannot read the script");
    CHECK_CONTAINS(err.msg, "No such file");
    /* Over the kind's limit: refused before it is read. */
    const char *big = in_dir("big.json");
    put(big, "0123456789");
    CHECK_EQ_INT(file_read(big, "plan", 9, &text, &len, &err), STOF_ERR_IO);
    CHECK_CONTAINS(err.msg, "10 bytes, more than a plan may have (9)");
    CHECK_EQ_INT(file_read(big, "plan", 10, &text, &len, &err), STOF_OK);
    free(text);
}

static void test_write(void) {
    stof_error err = {0};
    const char *p = in_dir("out.bin");
    CHECK_EQ_INT(file_write(p, "output", "new", 3, &err), STOF_OK);
    char *text = NULL;
    size_t len = 0;
    CHECK_EQ_INT(file_read(p, "output", 0, &text, &len, &err), STOF_OK);
    CHECK(text && strcmp(text, "new") == 0);
    free(text);
    struct stat st;
    CHECK(stat(p, &st) == 0 && (st.st_mode & 0400));
    /* An aborted write leaves the old file and no temporary beside it. */
    file_out o;
    CHECK_EQ_INT(file_out_open(&o, p, "output", &err), STOF_OK);
    fputs("half", o.f);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s", o.tmp);
    file_out_abort(&o);
    CHECK(!file_exists(tmp));
    CHECK_EQ_INT(file_read(p, "output", 0, &text, &len, &err), STOF_OK);
    CHECK(text && strcmp(text, "new") == 0);
    free(text);
    /* A file replaced keeps its permissions. */
    CHECK(chmod(p, 0600) == 0);
    CHECK_EQ_INT(file_write(p, "output", "newer", 5, &err), STOF_OK);
    CHECK(stat(p, &st) == 0 && (st.st_mode & 0777) == 0600);
    /* A device or a directory is never replaced. */
    CHECK_EQ_INT(file_write("/dev/full", "output", "x", 1, &err), STOF_ERR_IO);
    CHECK_CONTAINS(err.msg, "/dev/full: a character device, not a file stof may write");
    CHECK(stat("/dev/full", &st) == 0 && S_ISCHR(st.st_mode));
    CHECK_EQ_INT(file_write(dir, "plan", "x", 1, &err), STOF_ERR_IO);
    CHECK_CONTAINS(err.msg, "a directory");
    /* A folder that does not exist: nothing is made. */
    CHECK_EQ_INT(file_write(in_dir("no/such/dir/x"), "plan", "x", 1, &err), STOF_ERR_IO);
    CHECK_CONTAINS(err.msg, "cannot write the plan");
}

static void test_same(void) {
    const char *a = in_dir("same-a"), *b = in_dir("same-b"), *l = in_dir("same-link");
    put(a, "a");
    put(b, "b");
    CHECK(symlink(a, l) == 0);
    CHECK(file_same(a, a));
    CHECK(file_same(a, l));
    CHECK(!file_same(a, b));
    CHECK(!file_same(a, in_dir("nothing")));
}

int main(void) {
    CHECK(mkdtemp(dir) != NULL);
    test_read_regular();
    test_read_refusals();
    test_write();
    test_same();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return check_summary("test_file");
}
