/* safetensors files (Hugging Face checkpoints): the header read and checked
 * when a file is opened, tensors read one at a time with pread (a file of
 * many GB is never held in memory at once), and a small writer.
 *
 * The format: an 8-byte little-endian header length N, N bytes of JSON
 *   {"__metadata__": {...}, "name": {"dtype": "F16", "shape": [768, 768],
 *                                    "data_offsets": [begin, end]}, ...}
 * and the data section; offsets are relative to its start. Every entry is
 * checked on open (dtype known, shape, offsets in range and matching
 * dtype x elements, no two tensors sharing bytes, names unique), so a
 * malformed file fails there, with its name and what was expected. Tensors
 * of dtypes stof does not read (F64, I8, F8_E4M3...) open fine and are
 * refused by name when read. Data is little-endian, as on every host stof
 * runs on. */
#ifndef STOF_CORE_SAFETENSORS_H
#define STOF_CORE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "stof.h"

#define SAFETENSORS_MAX_DIMS 8
/* The format's own limit on the header, which also bounds what we parse. */
#define SAFETENSORS_MAX_HEADER 100000000ULL

typedef enum safetensors_dtype {
    SAFETENSORS_F32 = 0,
    SAFETENSORS_F16,
    SAFETENSORS_BF16,
    SAFETENSORS_I32,
    SAFETENSORS_I64,
    SAFETENSORS_OTHER /* a dtype stof does not read; its text is in dtype_name */
} safetensors_dtype;

typedef struct safetensors_tensor {
    char *name;
    safetensors_dtype dtype;
    char dtype_name[16];  /* as in the file: "F16", "F64", ... */
    int ndim;             /* 0 for a scalar */
    int64_t shape[SAFETENSORS_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end;  /* data_offsets, relative to the data section */
    int shard;            /* of a sharded checkpoint: index into shards */
} safetensors_tensor;

typedef struct safetensors_file {
    char *path;           /* a sharded checkpoint: its index file */
    int fd;               /* -1 for a sharded checkpoint */
    uint64_t file_bytes;
    uint64_t data_start;  /* 8 + header length */
    int n;
    safetensors_tensor *tensors; /* in file order (sorted by name) */
    int n_shards;         /* 0: one file; else the shards the tensors live in */
    struct safetensors_file **shards;
    int in_memory;        /* safetensors_from_memory: begin is the address of the data */
} safetensors_file;

/* Opens path and checks its header; *out is freed with safetensors_close.
 * STOF_ERR_IO when it cannot be read, STOF_ERR_FORMAT (naming the file and
 * what was expected) when it is malformed. */
int safetensors_open(const char *path, safetensors_file **out, stof_error *err);
void safetensors_close(safetensors_file *f);

/* A checkpoint in n shard files read as one (index: the path messages name
 * it by, e.g. DIR/model.safetensors.index.json): every tensor of every shard
 * under its name, each read from its own shard. A name in two shards is
 * STOF_ERR_FORMAT naming both. */
int safetensors_open_shards(const char *index, const char *const *paths, int n,
                            safetensors_file **out, stof_error *err);

/* The path of the file tensor i lives in (its shard's, for a sharded
 * checkpoint). */
const char *safetensors_tensor_path(const safetensors_file *f, int i);

/* The tensor called name: the exact name first; otherwise the one tensor
 * named "<prefix>.<name>" (a checkpoint of a model with a head stores
 * "bert.embeddings...", "transformer.h.0...", "model.decoder..."). Returns
 * its index, or -1 when there is none. Several prefixed candidates are
 * STOF_ERR_FORMAT naming them, returned as -2. */
int safetensors_find(const safetensors_file *f, const char *name, stof_error *err);

/* Bytes of one element of dtype (0 for SAFETENSORS_OTHER). */
size_t safetensors_dtype_size(safetensors_dtype t);
/* "F32", "F16", "BF16", "I32", "I64". */
const char *safetensors_dtype_name(safetensors_dtype t);

/* "[768, 2304]" into buf. */
const char *safetensors_shape_str(const safetensors_tensor *t, char *buf, size_t n);

/* Reads tensor i's raw bytes (t->end - t->begin of them) into buf. */
int safetensors_read(const safetensors_file *f, int i, void *buf, stof_error *err);

/* Reads tensor i as numel floats: F32, F16 and BF16 converted exactly, I32
 * and I64 to the nearest float. Other dtypes are STOF_ERR_UNSUPPORTED
 * naming the tensor and its dtype. Reads in chunks: out is the only buffer
 * of the tensor's size. */
int safetensors_read_f32(const safetensors_file *f, int i, float *out, stof_error *err);

/* Reads an integer tensor (I32, I64) as int64 values; others are
 * STOF_ERR_UNSUPPORTED. */
int safetensors_read_i64(const safetensors_file *f, int i, int64_t *out, stof_error *err);

/* Tensors the caller holds in host memory (borrowed: they must outlive *out),
 * looked up and read as a file's are: a model's weights straight from a
 * live framework's tensors. Names unique, dtypes read by stof, shapes that
 * fit SAFETENSORS_MAX_DIMS; path names the set in messages. */
struct safetensors_entry;
int safetensors_from_memory(const char *path, const struct safetensors_entry *tensors, int n,
                            safetensors_file **out, stof_error *err);

/* ---- writing ----------------------------------------------------------------------------- */

typedef struct safetensors_entry {
    const char *name;
    safetensors_dtype dtype; /* not SAFETENSORS_OTHER */
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    const void *data;        /* numel x dtype size bytes, little-endian */
} safetensors_entry;

/* Writes the tensors (names unique) to path, the header padded with spaces
 * to a multiple of 8 bytes. A file left half-written is removed. */
int safetensors_write(const char *path, const safetensors_entry *tensors, int n,
                      stof_error *err);

#endif
