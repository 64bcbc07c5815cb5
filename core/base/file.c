/* Reading and writing files (file.h). */
#include "core/base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base/error.h"

/* "a directory", "a FIFO"...: what a non-regular file is. */
static const char *file_type_name(mode_t mode) {
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISSOCK(mode))
        return "a socket";
    return "not a regular file";
}

int file_open_regular(const char *path, const char *what, uint64_t limit, int *fd,
                      uint64_t *size, stof_error *err) {
    *fd = -1;
    *size = 0;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer. */
    int d = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (d < 0)
        return err_set(err, STOF_ERR_IO, "cannot read the %s %s: %s", what, path,
                       strerror(errno));
    struct stat st;
    if (fstat(d, &st) != 0) {
        int e = errno;
        close(d);
        return err_set(err, STOF_ERR_IO, "cannot read the %s %s: %s", what, path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(d);
        return err_set(err, STOF_ERR_IO, "%s: %s, not a %s", path,
                       file_type_name(st.st_mode), what);
    }
    if (limit && (uint64_t)st.st_size > limit) {
        close(d);
        return err_set(err, STOF_ERR_IO, "%s: %lld bytes, more than a %s may have (%llu)",
                       path, (long long)st.st_size, what, (unsigned long long)limit);
    }
    /* Regular files never block; reads go on in the ordinary mode. */
    int flags = fcntl(d, F_GETFL);
    if (flags >= 0)
        fcntl(d, F_SETFL, flags & ~O_NONBLOCK);
    *fd = d;
    *size = (uint64_t)st.st_size;
    return STOF_OK;
}

int file_read(const char *path, const char *what, size_t limit, char **text, size_t *len,
              stof_error *err) {
    *text = NULL;
    *len = 0;
    int fd;
    uint64_t size;
    int rc = file_open_regular(path, what, limit, &fd, &size, err);
    if (rc)
        return rc;
    char *buf = err_malloc((size_t)size + 2, err);
    if (!buf) {
        close(fd);
        return STOF_ERR_NOMEM;
    }
    /* One byte more than the size: a file that grew is noticed. */
    size_t want = (size_t)size + 1, got = 0;
    while (got < want) {
        ssize_t n = read(fd, buf + got, want - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = err_set(err, STOF_ERR_IO, "cannot read the %s %s: %s", what, path,
                         strerror(errno));
            break;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    if (!rc && got != (size_t)size)
        rc = err_set(err, STOF_ERR_IO, "the %s %s changed size while it was read", what, path);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[got] = '\0';
    *text = buf;
    *len = got;
    return STOF_OK;
}

int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int file_same(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* The process's umask, read without changing it (umask() sets it, and a
 * thread creating a file meanwhile would get the wrong mode); 022 when
 * /proc does not say. */
static mode_t process_umask(void) {
    FILE *f = fopen("/proc/self/status", "r");
    unsigned mask = 022;
    char line[128];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Umask: %o", &mask) == 1)
            break;
    if (f)
        fclose(f);
    return (mode_t)mask;
}

int file_out_open(file_out *o, const char *path, const char *what, stof_error *err) {
    *o = (file_out){.what = what};
    struct stat st;
    int exists = stat(path, &st) == 0;
    if (exists && !S_ISREG(st.st_mode))
        return err_set(err, STOF_ERR_IO, "%s: %s, not a file stof may write a %s to", path,
                       file_type_name(st.st_mode), what);
    size_t n = strlen(path);
    o->path = malloc(n + 1);
    o->tmp = malloc(n + sizeof ".tmp-XXXXXX");
    if (!o->path || !o->tmp) {
        file_out_abort(o);
        return err_set(err, STOF_ERR_NOMEM, "out of host memory");
    }
    memcpy(o->path, path, n + 1);
    memcpy(o->tmp, path, n);
    memcpy(o->tmp + n, ".tmp-XXXXXX", sizeof ".tmp-XXXXXX");
    int fd = mkstemp(o->tmp);
    if (fd < 0) {
        int e = errno;
        free(o->tmp);
        o->tmp = NULL;
        file_out_abort(o);
        return err_set(err, STOF_ERR_IO, "cannot write the %s %s: %s", what, path, strerror(e));
    }
    /* mkstemp makes 0600: a file written anew gets the usual mode, a file
     * replaced keeps its own */
    fchmod(fd, exists ? (st.st_mode & 07777) : (0666 & ~process_umask()));
    if (!(o->f = fdopen(fd, "wb"))) {
        int e = errno;
        close(fd);
        file_out_abort(o);
        return err_set(err, STOF_ERR_IO, "cannot write the %s %s: %s", what, path, strerror(e));
    }
    return STOF_OK;
}

int file_out_commit(file_out *o, stof_error *err) {
    /* on the disk before it takes the old file's place */
    int bad = fflush(o->f) != 0 || ferror(o->f) || fsync(fileno(o->f)) != 0;
    int e = errno;
    if (fclose(o->f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    o->f = NULL;
    if (!bad && rename(o->tmp, o->path) != 0) {
        bad = 1;
        e = errno;
    }
    if (bad) {
        int rc = err_set(err, STOF_ERR_IO, "cannot write the %s %s: %s (it is left as it was)",
                         o->what, o->path, strerror(e));
        file_out_abort(o);
        return rc;
    }
    free(o->tmp);
    free(o->path);
    *o = (file_out){0};
    return STOF_OK;
}

void file_out_abort(file_out *o) {
    if (o->f)
        fclose(o->f);
    if (o->tmp)
        unlink(o->tmp);
    free(o->tmp);
    free(o->path);
    *o = (file_out){0};
}

int file_write(const char *path, const char *what, const void *data, size_t n,
               stof_error *err) {
    file_out o;
    int rc = file_out_open(&o, path, what, err);
    if (rc)
        return rc;
    if (n && fwrite(data, 1, n, o.f) != n) {
        rc = err_set(err, STOF_ERR_IO, "cannot write the %s %s: %s (it is left as it was)", what,
                     path, strerror(errno));
        file_out_abort(&o);
        return rc;
    }
    return file_out_commit(&o, err);
}
