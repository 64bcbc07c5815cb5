/* Fuzz target: the safetensors reader (core/io/safetensors.c). Whatever the
 * bytes, the file opens or the error names it; an open file's every tensor
 * reads as floats or is refused with a message, never out of bounds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/io/safetensors.h"
#include "fuzz.h"

const char *const fuzz_seeds[] = {NULL};

const char *const fuzz_words[] = {"\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"F32\"",
                                  "\"F16\"", "\"BF16\"", "\"I64\"", "\"I32\"", "\"F64\"",
                                  "\"__metadata__\"", "[0, 4]", "[4, 4]", "[2, 2]", "{", "}",
                                  ",", ":", " ", "-1", "18446744073709551615", NULL};

/* Valid files: a header of one to three tensors and their data. */
static size_t file_of(const char *header, size_t data, uint8_t *buf, size_t cap) {
    size_t h = strlen(header);
    if (8 + h + data > cap)
        return 0;
    for (int k = 0; k < 8; k++)
        buf[k] = (uint8_t)((uint64_t)h >> (8 * k));
    memcpy(buf + 8, header, h);
    for (size_t i = 0; i < data; i++)
        buf[8 + h + i] = (uint8_t)(i * 37 + 11);
    return 8 + h + data;
}

size_t fuzz_seed_bytes(int k, uint8_t *buf, size_t cap) {
    switch (k) {
    case 0:
        return file_of("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
                       buf, cap);
    case 1:
        return file_of("{\"__metadata__\": {\"format\": \"pt\"}, \"w\": {\"dtype\": \"F16\", "
                       "\"shape\": [2, 2], \"data_offsets\": [0, 8]}, \"b\": {\"dtype\": \"BF16\","
                       " \"shape\": [2], \"data_offsets\": [8, 12]}}   ",
                       12, buf, cap);
    case 2:
        return file_of("{\"ids\": {\"dtype\": \"I64\", \"shape\": [1, 3], \"data_offsets\": [0, 24]},"
                       " \"e\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [24, 24]}}",
                       24, buf, cap);
    default:
        return 0;
    }
}

static char path[64];

static int fail(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_safetensors: %s: %s\n", what, detail);
    return 1;
}

int fuzz_one(const uint8_t *data, size_t size) {
    if (!path[0])
        snprintf(path, sizeof path, "/tmp/stof-fuzz-st-%ld.safetensors", (long)getpid());
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    safetensors_file *st = NULL;
    stof_error err = {0};
    int bad = 0;
    if (safetensors_open(path, &st, &err) != STOF_OK) {
        bad = strstr(err.msg, path) ? 0 : fail("an error that does not name the file", err.msg);
        remove(path);
        return bad | (st != NULL ? fail("a file left open on failure", path) : 0);
    }
    for (int i = 0; i < st->n && !bad; i++) {
        const safetensors_tensor *t = &st->tensors[i];
        if (t->numel > (int64_t)size)
            continue; /* a dtype stof does not read: no size was checked, none is read */
        float *v = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *v);
        if (!v)
            break;
        if (safetensors_read_f32(st, i, v, &err) != STOF_OK && !err.msg[0])
            bad = fail("a read error without a message", t->name);
        free(v);
    }
    safetensors_close(st);
    remove(path);
    return bad;
}
