#include "core/io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base/error.h"
#include "core/base/file.h"
#include "core/base/util.h"

/* Bytes read per pread when converting a tensor. */
#define SAFETENSORS_CHUNK (1u << 20)
/* Largest integer a JSON number (a double) holds exactly. */
#define SAFETENSORS_MAX_INT 9007199254740992.0

/* ---- dtypes ------------------------------------------------------------------------------ */

typedef struct st_dtype_info {
    const char *name;
    safetensors_dtype dtype;
    size_t size;
} st_dtype_info;

/* Every dtype of the format: those stof reads, and the others by size so
 * that their byte counts are checked too. */
static const st_dtype_info st_dtypes[] = {
    {"F32", SAFETENSORS_F32, 4},       {"F16", SAFETENSORS_F16, 2},
    {"BF16", SAFETENSORS_BF16, 2},     {"I32", SAFETENSORS_I32, 4},
    {"I64", SAFETENSORS_I64, 8},       {"F64", SAFETENSORS_OTHER, 8},
    {"U64", SAFETENSORS_OTHER, 8},     {"U32", SAFETENSORS_OTHER, 4},
    {"I16", SAFETENSORS_OTHER, 2},     {"U16", SAFETENSORS_OTHER, 2},
    {"I8", SAFETENSORS_OTHER, 1},      {"U8", SAFETENSORS_OTHER, 1},
    {"BOOL", SAFETENSORS_OTHER, 1},    {"F8_E4M3", SAFETENSORS_OTHER, 1},
    {"F8_E5M2", SAFETENSORS_OTHER, 1}, {"F8_E8M0", SAFETENSORS_OTHER, 1},
    {"C64", SAFETENSORS_OTHER, 8},
};
#define ST_N_DTYPES (int)(sizeof st_dtypes / sizeof st_dtypes[0])

size_t safetensors_dtype_size(safetensors_dtype t) {
    for (int k = 0; k < ST_N_DTYPES; k++)
        if (st_dtypes[k].dtype == t && t != SAFETENSORS_OTHER)
            return st_dtypes[k].size;
    return 0;
}

const char *safetensors_dtype_name(safetensors_dtype t) {
    for (int k = 0; k < ST_N_DTYPES; k++)
        if (st_dtypes[k].dtype == t && t != SAFETENSORS_OTHER)
            return st_dtypes[k].name;
    return "?";
}

/* The table entry of a dtype string; NULL for one the format does not
 * define (kept as SAFETENSORS_OTHER of unknown size). */
static const st_dtype_info *st_dtype_lookup(const char *name) {
    for (int k = 0; k < ST_N_DTYPES; k++)
        if (strcmp(st_dtypes[k].name, name) == 0)
            return &st_dtypes[k];
    return NULL;
}

const char *safetensors_shape_str(const safetensors_tensor *t, char *buf, size_t n) {
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < t->ndim && used < n; d++)
        used += (size_t)snprintf(buf + used, n - used, "%s%" PRId64, d ? ", " : "", t->shape[d]);
    if (used < n)
        snprintf(buf + used, n - used, "]");
    return buf;
}

/* ---- little-endian decoding ---------------------------------------------------------------- */

static uint64_t st_le(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int k = bytes - 1; k >= 0; k--)
        v = v << 8 | p[k];
    return v;
}

static float st_f32_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- reading bytes --------------------------------------------------------------------------- */

/* n bytes at offset, all of them, or STOF_ERR_IO. */
static int st_pread(const safetensors_file *f, void *buf, size_t n, uint64_t offset,
                    const char *what, stof_error *err) {
    unsigned char *p = buf;
    if (f->in_memory) {
        memcpy(p, (const void *)(uintptr_t)offset, n);
        return STOF_OK;
    }
    while (n > 0) {
        ssize_t got = pread(f->fd, p, n, (off_t)offset);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return err_set(err, STOF_ERR_IO, "%s: reading %s: %s", f->path, what,
                           strerror(errno));
        if (got == 0)
            return err_set(err, STOF_ERR_IO, "%s: reading %s: the file ended early (was it "
                           "changed while stof read it?)", f->path, what);
        p += got;
        n -= (size_t)got;
        offset += (uint64_t)got;
    }
    return STOF_OK;
}

/* ---- the header -------------------------------------------------------------------------- */

/* A JSON number that is an integer in [0, 2^53]. */
static int st_json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v))
        return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= SAFETENSORS_MAX_INT) || d != floor(d))
        return 0;
    *out = (uint64_t)d;
    return 1;
}

static int st_bad(const safetensors_file *f, const char *name, stof_error *err, const char *fmt,
                  ...) __attribute__((format(printf, 4, 5)));
static int st_bad(const safetensors_file *f, const char *name, stof_error *err, const char *fmt,
                  ...) {
    va_list ap;
    va_start(ap, fmt);
    err_setv(err, STOF_ERR_FORMAT, fmt, ap);
    va_end(ap);
    return name ? err_prefix(err, "%s: tensor '%s': ", f->path, name)
                : err_prefix(err, "%s: ", f->path);
}

static int st_parse_dtype(const safetensors_file *f, const cJSON *e, safetensors_tensor *t,
                          size_t *elem, stof_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!cJSON_IsString(v) || !v->valuestring[0])
        return st_bad(f, t->name, err, "\"dtype\" must be a string such as \"F16\"");
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", v->valuestring);
    const st_dtype_info *info = st_dtype_lookup(v->valuestring);
    t->dtype = info ? info->dtype : SAFETENSORS_OTHER;
    *elem = info ? info->size : 0;
    return STOF_OK;
}

static int st_parse_shape(const safetensors_file *f, const cJSON *e, safetensors_tensor *t,
                          stof_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!cJSON_IsArray(v))
        return st_bad(f, t->name, err, "\"shape\" must be a list of sizes");
    int n = cJSON_GetArraySize(v);
    if (n > SAFETENSORS_MAX_DIMS)
        return st_bad(f, t->name, err, "%d dimensions; stof reads at most %d", n,
                      SAFETENSORS_MAX_DIMS);
    t->ndim = n;
    t->numel = 1;
    int d = 0;
    for (const cJSON *s = v->child; s; s = s->next, d++) {
        uint64_t size;
        if (!st_json_uint(s, &size))
            return st_bad(f, t->name, err, "shape[%d] must be a non-negative integer", d);
        t->shape[d] = (int64_t)size;
        if (size && (uint64_t)t->numel > (uint64_t)INT64_MAX / size)
            return st_bad(f, t->name, err, "the shape's element count overflows 64 bits");
        t->numel *= (int64_t)size;
    }
    return STOF_OK;
}

static int st_parse_offsets(const safetensors_file *f, const cJSON *e, safetensors_tensor *t,
                            size_t elem, stof_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    uint64_t data_bytes = f->file_bytes - f->data_start;
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2 || !st_json_uint(v->child, &t->begin) ||
        !st_json_uint(v->child->next, &t->end))
        return st_bad(f, t->name, err,
                      "\"data_offsets\" must be two non-negative integers [begin, end]");
    if (t->begin > t->end || t->end > data_bytes)
        return st_bad(f, t->name, err,
                      "data_offsets [%" PRIu64 ", %" PRIu64 "] are outside the data section "
                      "(%" PRIu64 " bytes)", t->begin, t->end, data_bytes);
    if (elem) {
        uint64_t bytes = t->end - t->begin;
        char shape[160];
        if ((uint64_t)t->numel > bytes / elem || (uint64_t)t->numel * elem != bytes)
            return st_bad(f, t->name, err,
                          "%s %s is %" PRId64 " elements of %zu bytes, but data_offsets "
                          "[%" PRIu64 ", %" PRIu64 "] hold %" PRIu64 " bytes", t->dtype_name,
                          safetensors_shape_str(t, shape, sizeof shape), t->numel, elem,
                          t->begin, t->end, bytes);
    }
    return STOF_OK;
}

static int st_parse_entry(safetensors_file *f, const cJSON *e, safetensors_tensor *t,
                          stof_error *err) {
    if (!e->string || !e->string[0])
        return st_bad(f, NULL, err, "a tensor has an empty name");
    t->name = strdup(e->string);
    if (!t->name)
        return err_set(err, STOF_ERR_NOMEM, "out of host memory");
    if (!cJSON_IsObject(e))
        return st_bad(f, t->name, err,
                      "expected an object {\"dtype\", \"shape\", \"data_offsets\"}");
    size_t elem = 0;
    int rc = st_parse_dtype(f, e, t, &elem, err);
    if (!rc)
        rc = st_parse_shape(f, e, t, err);
    if (!rc)
        rc = st_parse_offsets(f, e, t, elem, err);
    return rc;
}

static int st_cmp_name(const void *a, const void *b) {
    return strcmp(((const safetensors_tensor *)a)->name, ((const safetensors_tensor *)b)->name);
}

static int st_cmp_begin(const void *a, const void *b) {
    const safetensors_tensor *x = *(const safetensors_tensor *const *)a;
    const safetensors_tensor *y = *(const safetensors_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* The format indexes every byte of the data section, without holes: a
 * byte that belongs to no tensor means the header's length or offsets are
 * wrong (a length one short shifts every tensor by a byte and leaves one
 * byte over at the end), so nothing is read. by: the non-empty tensors in
 * order of their first byte, k of them. */
static int st_check_tiling(safetensors_file *f, const safetensors_tensor *const *by, int k,
                           stof_error *err) {
    uint64_t data_bytes = f->file_bytes - f->data_start, at = 0;
    for (int i = 0; i < k; i++) {
        if (by[i]->begin != at)
            return st_bad(f, by[i]->name, err,
                          "bytes %" PRIu64 "-%" PRIu64 " of the data section, before it, belong "
                          "to no tensor (a hole: is the header length right?)",
                          at, by[i]->begin);
        at = by[i]->end;
    }
    if (at != data_bytes)
        return st_bad(f, NULL, err,
                      "the data section has %" PRIu64 " bytes after the last tensor's end "
                      "(%" PRIu64 " of %" PRIu64 "): is the header length right?",
                      data_bytes - at, at, data_bytes);
    return STOF_OK;
}

/* Names unique (f->tensors sorted by name), no bytes shared, none unused. */
static int st_check_layout(safetensors_file *f, stof_error *err) {
    for (int i = 1; i < f->n; i++)
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0)
            return st_bad(f, f->tensors[i].name, err, "appears twice in the header");
    const safetensors_tensor **by = err_malloc(sizeof *by * (size_t)(f->n ? f->n : 1), err);
    if (!by)
        return STOF_ERR_NOMEM;
    int k = 0;
    for (int i = 0; i < f->n; i++)
        if (f->tensors[i].end > f->tensors[i].begin)
            by[k++] = &f->tensors[i];
    qsort(by, (size_t)k, sizeof *by, st_cmp_begin);
    int rc = STOF_OK;
    for (int i = 1; i < k && !rc; i++)
        if (by[i]->begin < by[i - 1]->end)
            rc = st_bad(f, NULL, err,
                        "tensors '%s' (bytes %" PRIu64 "-%" PRIu64 ") and '%s' (bytes %" PRIu64
                        "-%" PRIu64 ") overlap", by[i - 1]->name, by[i - 1]->begin,
                        by[i - 1]->end, by[i]->name, by[i]->begin, by[i]->end);
    if (!rc)
        rc = st_check_tiling(f, by, k, err);
    free(by);
    return rc;
}

static int st_parse_header(safetensors_file *f, const char *text, size_t len, stof_error *err) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        return st_bad(f, NULL, err, "the header is not valid JSON (near byte %zu of %zu)", at,
                      len);
    }
    int rc = STOF_OK;
    for (size_t i = (size_t)(end - text); i < len && !rc; i++)
        if (!strchr(" \t\r\n", text[i]) || !text[i])
            rc = st_bad(f, NULL, err, "text after the header's JSON object (byte %zu)", i);
    if (!rc && !cJSON_IsObject(root))
        rc = st_bad(f, NULL, err, "the header must be a JSON object of tensors");
    int n = rc ? 0 : cJSON_GetArraySize(root);
    if (!rc && !(f->tensors = err_calloc((size_t)(n ? n : 1), sizeof *f->tensors, err)))
        rc = STOF_ERR_NOMEM;
    for (const cJSON *e = rc ? NULL : root->child; e && !rc; e = e->next) {
        if (e->string && strcmp(e->string, "__metadata__") == 0)
            continue;
        rc = st_parse_entry(f, e, &f->tensors[f->n++], err);
    }
    cJSON_Delete(root);
    if (!rc) {
        qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, st_cmp_name);
        rc = st_check_layout(f, err);
    }
    return rc;
}

/* The header length and the header itself. */
static int st_read_header(safetensors_file *f, stof_error *err) {
    unsigned char len8[8];
    if (f->file_bytes < 8)
        return st_bad(f, NULL, err, "%" PRIu64 " bytes is too short for a safetensors file "
                      "(it starts with an 8-byte header length)", f->file_bytes);
    int rc = st_pread(f, len8, 8, 0, "the header length", err);
    if (rc)
        return rc;
    uint64_t len = st_le(len8, 8);
    if (len < 2 || len > SAFETENSORS_MAX_HEADER)
        return st_bad(f, NULL, err, "header length %" PRIu64 " is not in 2..%llu bytes (is this "
                      "a safetensors file?)", len, SAFETENSORS_MAX_HEADER);
    if (len > f->file_bytes - 8)
        return st_bad(f, NULL, err, "header length %" PRIu64 " runs past the end of the file "
                      "(%" PRIu64 " bytes)", len, f->file_bytes);
    char *text = err_malloc((size_t)len + 1, err);
    if (!text)
        return STOF_ERR_NOMEM;
    rc = st_pread(f, text, (size_t)len, 8, "the header", err);
    if (!rc) {
        text[len] = '\0';
        f->data_start = 8 + len;
        rc = st_parse_header(f, text, (size_t)len, err);
    }
    free(text);
    return rc;
}

int safetensors_open(const char *path, safetensors_file **out, stof_error *err) {
    *out = NULL;
    safetensors_file *f = err_calloc(1, sizeof *f, err);
    if (!f)
        return STOF_ERR_NOMEM;
    f->fd = -1;
    if (!(f->path = strdup(path))) {
        safetensors_close(f);
        return err_set(err, STOF_ERR_NOMEM, "out of host memory");
    }
    int rc = file_open_regular(path, "safetensors file", 0, &f->fd, &f->file_bytes, err);
    if (!rc)
        rc = st_read_header(f, err);
    if (rc) {
        safetensors_close(f);
        return rc;
    }
    *out = f;
    return STOF_OK;
}

/* The union of the shards' tensor tables, each entry naming its shard. */
static int st_merge_shards(safetensors_file *f, stof_error *err) {
    int total = 0;
    for (int k = 0; k < f->n_shards; k++)
        total += f->shards[k]->n;
    if (!(f->tensors = err_calloc((size_t)(total ? total : 1), sizeof *f->tensors, err)))
        return STOF_ERR_NOMEM;
    for (int k = 0; k < f->n_shards; k++)
        for (int i = 0; i < f->shards[k]->n; i++) {
            safetensors_tensor *t = &f->tensors[f->n];
            *t = f->shards[k]->tensors[i];
            t->shard = k;
            if (!(t->name = strdup(t->name)))
                return err_set(err, STOF_ERR_NOMEM, "out of host memory");
            f->n++;
        }
    qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, st_cmp_name);
    for (int i = 1; i < f->n; i++)
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0)
            return st_bad(f, f->tensors[i].name, err, "is in two shards, %s and %s",
                          f->shards[f->tensors[i - 1].shard]->path,
                          f->shards[f->tensors[i].shard]->path);
    return STOF_OK;
}

int safetensors_open_shards(const char *index, const char *const *paths, int n,
                            safetensors_file **out, stof_error *err) {
    *out = NULL;
    safetensors_file *f = err_calloc(1, sizeof *f, err);
    if (!f)
        return STOF_ERR_NOMEM;
    f->fd = -1;
    int rc = STOF_OK;
    if (!(f->path = strdup(index)) ||
        !(f->shards = calloc((size_t)(n > 0 ? n : 1), sizeof *f->shards)))
        rc = err_set(err, STOF_ERR_NOMEM, "out of host memory");
    for (int k = 0; k < n && !rc; k++) {
        rc = safetensors_open(paths[k], &f->shards[k], err);
        f->n_shards += !rc;
    }
    if (!rc)
        rc = st_merge_shards(f, err);
    if (rc) {
        safetensors_close(f);
        return rc;
    }
    *out = f;
    return STOF_OK;
}

void safetensors_close(safetensors_file *f) {
    if (!f)
        return;
    for (int i = 0; i < f->n; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    if (f->fd >= 0)
        close(f->fd);
    for (int k = 0; k < f->n_shards; k++)
        safetensors_close(f->shards[k]);
    free(f->shards);
    free(f->path);
    free(f);
}

/* ---- lookup ------------------------------------------------------------------------------- */

static int st_exact(const safetensors_file *f, const char *name) {
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(f->tensors[mid].name, name);
        if (c == 0)
            return mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

/* "<prefix>.<name>" with a non-empty prefix. */
static int st_has_prefix_of(const char *full, const char *name, size_t name_len) {
    size_t len = strlen(full);
    return len > name_len + 1 && full[len - name_len - 1] == '.' &&
           memcmp(full + len - name_len, name, name_len) == 0;
}

int safetensors_find(const safetensors_file *f, const char *name, stof_error *err) {
    int i = st_exact(f, name);
    if (i >= 0)
        return i;
    size_t name_len = strlen(name);
    int found = -1, count = 0;
    char list[512] = "";
    size_t used = 0;
    for (int k = 0; k < f->n; k++) {
        if (!st_has_prefix_of(f->tensors[k].name, name, name_len))
            continue;
        if (count < 4 && used < sizeof list)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s'%s'", count ? ", " : "",
                                     f->tensors[k].name);
        found = k;
        count++;
    }
    if (count <= 1)
        return found;
    err_set(err, STOF_ERR_FORMAT, "%s: tensor '%s' is ambiguous: %s%s", f->path, name, list,
            count > 4 ? ", ..." : "");
    return -2;
}

/* ---- reading tensors ---------------------------------------------------------------------------- */

/* The file tensor t's bytes are in: f, or its shard. */
static const safetensors_file *st_home(const safetensors_file *f, const safetensors_tensor *t) {
    return f->n_shards ? f->shards[t->shard] : f;
}

const char *safetensors_tensor_path(const safetensors_file *f, int i) {
    return st_home(f, &f->tensors[i])->path;
}

int safetensors_read(const safetensors_file *f, int i, void *buf, stof_error *err) {
    const safetensors_tensor *t = &f->tensors[i];
    const safetensors_file *home = st_home(f, t);
    char what[160];
    snprintf(what, sizeof what, "tensor '%.120s'", t->name);
    return st_pread(home, buf, (size_t)(t->end - t->begin), home->data_start + t->begin, what,
                    err);
}

static int st_unsupported(const safetensors_file *f, const safetensors_tensor *t,
                          const char *wanted, stof_error *err) {
    return err_set(err, STOF_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; stof reads %s",
                   st_home(f, t)->path, t->name, t->dtype_name, wanted);
}

/* One element of t's dtype at p, as a double (exact for every dtype read). */
static double st_value(safetensors_dtype dtype, const unsigned char *p) {
    switch (dtype) {
    case SAFETENSORS_F32: return st_f32_bits((uint32_t)st_le(p, 4));
    case SAFETENSORS_F16: return util_f16_to_f32((uint16_t)st_le(p, 2));
    case SAFETENSORS_BF16: return util_bf16_to_f32((uint16_t)st_le(p, 2));
    case SAFETENSORS_I32: return (double)(int32_t)(uint32_t)st_le(p, 4);
    case SAFETENSORS_I64: return (double)(int64_t)st_le(p, 8);
    default: return 0;
    }
}

static int64_t st_int(safetensors_dtype dtype, const unsigned char *p) {
    return dtype == SAFETENSORS_I32 ? (int64_t)(int32_t)(uint32_t)st_le(p, 4)
                                    : (int64_t)st_le(p, 8);
}

/* Reads tensor i chunk by chunk; float_out or int_out receives numel values. */
static int st_read_converted(const safetensors_file *f, int i, float *float_out,
                             int64_t *int_out, stof_error *err) {
    const safetensors_tensor *t = &f->tensors[i];
    const safetensors_file *home = st_home(f, t);
    size_t elem = safetensors_dtype_size(t->dtype);
    size_t per_chunk = SAFETENSORS_CHUNK / (elem ? elem : 1);
    unsigned char *chunk = err_malloc(SAFETENSORS_CHUNK, err);
    if (!chunk)
        return STOF_ERR_NOMEM;
    char what[160];
    snprintf(what, sizeof what, "tensor '%.120s'", t->name);
    int rc = STOF_OK;
    for (int64_t at = 0; at < t->numel && !rc; at += (int64_t)per_chunk) {
        size_t n = (size_t)(t->numel - at) < per_chunk ? (size_t)(t->numel - at) : per_chunk;
        rc = st_pread(home, chunk, n * elem, home->data_start + t->begin + (uint64_t)at * elem,
                      what, err);
        for (size_t k = 0; k < n && !rc; k++) {
            if (float_out)
                float_out[at + (int64_t)k] = (float)st_value(t->dtype, chunk + k * elem);
            else
                int_out[at + (int64_t)k] = st_int(t->dtype, chunk + k * elem);
        }
    }
    free(chunk);
    return rc;
}

int safetensors_read_f32(const safetensors_file *f, int i, float *out, stof_error *err) {
    if (f->tensors[i].dtype == SAFETENSORS_OTHER)
        return st_unsupported(f, &f->tensors[i], "F32, F16, BF16, I32 and I64", err);
    return st_read_converted(f, i, out, NULL, err);
}

int safetensors_read_i64(const safetensors_file *f, int i, int64_t *out, stof_error *err) {
    safetensors_dtype d = f->tensors[i].dtype;
    if (d != SAFETENSORS_I32 && d != SAFETENSORS_I64)
        return st_unsupported(f, &f->tensors[i], "integers as I32 or I64", err);
    return st_read_converted(f, i, NULL, out, err);
}

/* ---- writing ---------------------------------------------------------------------------------- */

typedef struct st_text {
    char *s;
    size_t len, cap;
    int failed;
} st_text;

static void st_append(st_text *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void st_append(st_text *b, const char *fmt, ...) {
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap + (size_t)n + 1) * 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->failed = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

/* A JSON string: quotes, backslashes and control characters escaped. */
static void st_append_string(st_text *b, const char *s) {
    st_append(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            st_append(b, "\\%c", *p);
        else if (*p < 0x20)
            st_append(b, "\\u%04x", *p);
        else
            st_append(b, "%c", *p);
    }
    st_append(b, "\"");
}

static int64_t st_entry_numel(const safetensors_entry *e) {
    int64_t n = 1;
    for (int d = 0; d < e->ndim; d++)
        n *= e->shape[d];
    return n;
}

static int st_check_entries(const char *path, const safetensors_entry *t, int n,
                            stof_error *err) {
    for (int i = 0; i < n; i++) {
        if (!t[i].name || !t[i].name[0] || strcmp(t[i].name, "__metadata__") == 0)
            return err_set(err, STOF_ERR_INVALID, "%s: tensor %d needs a name", path, i);
        if (t[i].dtype == SAFETENSORS_OTHER || !safetensors_dtype_size(t[i].dtype))
            return err_set(err, STOF_ERR_INVALID, "%s: tensor '%s': stof writes F32, F16, BF16, "
                           "I32 and I64", path, t[i].name);
        if (t[i].ndim < 0 || t[i].ndim > SAFETENSORS_MAX_DIMS)
            return err_set(err, STOF_ERR_INVALID, "%s: tensor '%s': %d dimensions", path,
                           t[i].name, t[i].ndim);
        for (int d = 0; d < t[i].ndim; d++)
            if (t[i].shape[d] < 0)
                return err_set(err, STOF_ERR_INVALID, "%s: tensor '%s': negative size", path,
                               t[i].name);
        for (int k = 0; k < i; k++)
            if (strcmp(t[k].name, t[i].name) == 0)
                return err_set(err, STOF_ERR_INVALID, "%s: tensor '%s' is given twice", path,
                               t[i].name);
    }
    return STOF_OK;
}

/* The header's JSON, padded with spaces to a multiple of 8 bytes. */
static int st_header_text(const safetensors_entry *t, int n, st_text *b, stof_error *err) {
    uint64_t at = 0;
    st_append(b, "{");
    for (int i = 0; i < n; i++) {
        uint64_t bytes = (uint64_t)st_entry_numel(&t[i]) * safetensors_dtype_size(t[i].dtype);
        st_append(b, "%s", i ? "," : "");
        st_append_string(b, t[i].name);
        st_append(b, ":{\"dtype\":\"%s\",\"shape\":[", safetensors_dtype_name(t[i].dtype));
        for (int d = 0; d < t[i].ndim; d++)
            st_append(b, "%s%" PRId64, d ? "," : "", t[i].shape[d]);
        st_append(b, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", at, at + bytes);
        at += bytes;
    }
    st_append(b, "}");
    while (!b->failed && b->len % 8)
        st_append(b, " ");
    return b->failed ? err_set(err, STOF_ERR_NOMEM, "out of host memory (safetensors header)")
                     : STOF_OK;
}

static int st_write_all(FILE *fp, const void *p, size_t n) {
    return n == 0 || fwrite(p, 1, n, fp) == n;
}

int safetensors_write(const char *path, const safetensors_entry *tensors, int n,
                      stof_error *err) {
    int rc = st_check_entries(path, tensors, n, err);
    st_text hdr = {0};
    if (!rc)
        rc = st_header_text(tensors, n, &hdr, err);
    file_out out = {0};
    if (!rc)
        rc = file_out_open(&out, path, "safetensors file", err);
    if (!rc) {
        unsigned char len8[8];
        for (int k = 0; k < 8; k++)
            len8[k] = (unsigned char)((uint64_t)hdr.len >> (8 * k));
        int ok = st_write_all(out.f, len8, 8) && st_write_all(out.f, hdr.s, hdr.len);
        for (int i = 0; i < n && ok; i++)
            ok = st_write_all(out.f, tensors[i].data,
                              (size_t)st_entry_numel(&tensors[i]) *
                                  safetensors_dtype_size(tensors[i].dtype));
        if (ok) {
            rc = file_out_commit(&out, err);
        } else {
            rc = err_set(err, STOF_ERR_IO, "writing %s failed: %s (it is left as it was)", path,
                         strerror(errno));
            file_out_abort(&out);
        }
    }
    free(hdr.s);
    return rc;
}

/* ---- tensors in memory ------------------------------------------------------------------------ */

static int st_by_name(const void *a, const void *b) {
    return strcmp(((const safetensors_tensor *)a)->name, ((const safetensors_tensor *)b)->name);
}

int safetensors_from_memory(const char *path, const safetensors_entry *tensors, int n,
                            safetensors_file **out, stof_error *err) {
    *out = NULL;
    safetensors_file *f = err_calloc(1, sizeof *f, err);
    if (!f)
        return STOF_ERR_NOMEM;
    f->fd = -1;
    f->in_memory = 1;
    f->path = strdup(path ? path : "(tensors in memory)");
    f->tensors = n > 0 ? err_calloc((size_t)n, sizeof *f->tensors, err) : NULL;
    int rc = !f->path || (n > 0 && !f->tensors) ? err_set(err, STOF_ERR_NOMEM, "out of memory")
                                                : STOF_OK;
    for (int i = 0; !rc && i < n; i++) {
        const safetensors_entry *e = &tensors[i];
        safetensors_tensor *t = &f->tensors[i];
        size_t elem = safetensors_dtype_size(e->dtype);
        if (!e->name || !e->data || !elem || e->ndim < 0 || e->ndim > SAFETENSORS_MAX_DIMS) {
            rc = err_set(err, STOF_ERR_INVALID, "%s: tensor %d ('%s'): a name, data, a dtype "
                         "stof reads and at most %d dims are needed", f->path, i,
                         e->name ? e->name : "?", SAFETENSORS_MAX_DIMS);
            break;
        }
        t->name = strdup(e->name);
        t->dtype = e->dtype;
        snprintf(t->dtype_name, sizeof t->dtype_name, "%s", safetensors_dtype_name(e->dtype));
        t->ndim = e->ndim;
        t->numel = 1;
        for (int d = 0; d < e->ndim; d++) {
            t->shape[d] = e->shape[d];
            t->numel *= e->shape[d] >= 0 ? e->shape[d] : 0;
        }
        t->begin = (uint64_t)(uintptr_t)e->data;
        t->end = t->begin + (uint64_t)t->numel * elem;
        f->n = i + 1;
        if (!t->name)
            rc = err_set(err, STOF_ERR_NOMEM, "out of memory");
    }
    if (!rc && n > 1) {
        qsort(f->tensors, (size_t)n, sizeof *f->tensors, st_by_name);
        for (int i = 1; !rc && i < n; i++)
            if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0)
                rc = err_set(err, STOF_ERR_INVALID, "%s: tensor '%s' given twice", f->path,
                             f->tensors[i].name);
    }
    if (rc) {
        safetensors_close(f);
        return rc;
    }
    *out = f;
    return STOF_OK;
}
