/* The library's one way to read and write files.
 *
 * Reading: regular files only, each kind with a size limit. A directory, a
 * FIFO or a device is refused by name before anything is read, and is
 * opened without blocking (a FIFO with no writer would otherwise hang the
 * open itself). Errors name the path and say what it is ("scripts/: a
 * directory, not a script file").
 *
 * Writing never destroys what was there: the bytes go to a temporary file
 * beside the target, which replaces the target by rename only once every
 * byte is written and synced. A failed write leaves the old file as it was;
 * a replaced file keeps its permissions. A target
 * that exists and is not a regular file (a device, a FIFO, a directory) is
 * refused: renaming over /dev/full would delete the device node. */
#ifndef STOF_CORE_FILE_H
#define STOF_CORE_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "stof.h"

/* Size limits per kind of file, in bytes. */
#define FILE_LIMIT_SCRIPT ((size_t)16 << 20) /* Lua scripts and helper modules */
#define FILE_LIMIT_PLAN ((size_t)64 << 20)   /* JSON plans, config.json */
#define FILE_LIMIT_CACHE ((size_t)256 << 20) /* the tuning cache, a cached kernel */

/* Opens path for reading (what: "script", "plan"... for messages): a
 * regular file of at most limit bytes (0: no limit). *fd and *size on
 * success; nothing left open on failure. */
int file_open_regular(const char *path, const char *what, uint64_t limit, int *fd,
                      uint64_t *size, stof_error *err);

/* The whole file as a NUL-terminated malloc'd buffer (*len bytes without
 * the NUL), under the rules of file_open_regular. A file that changes size
 * while it is read is an error. */
int file_read(const char *path, const char *what, size_t limit, char **text, size_t *len,
              stof_error *err);

/* 1 when path names an existing file system object (of any type). */
int file_exists(const char *path);

/* 1 when a and b are the same file (same device and inode; both exist). */
int file_same(const char *a, const char *b);

/* A file being written: f writes to a temporary file beside path. */
typedef struct file_out {
    FILE *f;
    char *path, *tmp;
    const char *what;
} file_out;

/* Starts writing path (what: for messages). STOF_ERR_IO when path exists and
 * is not a regular file, or when its folder takes no new file. */
int file_out_open(file_out *o, const char *path, const char *what, stof_error *err);
/* Flushes, checks every write and puts the file in place of path. On any
 * failure the temporary file is removed and path is left as it was. */
int file_out_commit(file_out *o, stof_error *err);
/* Drops what was written; path is left as it was. Safe on a zeroed file_out. */
void file_out_abort(file_out *o);

/* The whole of data (n bytes) as path, by file_out. */
int file_write(const char *path, const char *what, const void *data, size_t n, stof_error *err);

#endif
