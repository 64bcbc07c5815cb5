/* PNG writing, self-contained: see png.h. The format pieces, in the order a
 * file is made: scanlines (filter byte 0 + pixels) -> zlib stream (header,
 * deflate blocks, Adler-32) -> chunks IHDR, IDAT, IEND, each with a CRC-32. */
#include "ops/png.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/file.h"

/* ---- a growing byte buffer; the first failed allocation sticks ---------- */

typedef struct png_buf {
    uint8_t *data;
    size_t len, cap;
    int oom;
} png_buf;

static void png_buf_put(png_buf *b, const void *p, size_t n) {
    if (b->oom || n == 0) /* n == 0: p may be NULL (IEND has no data) */
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *d = realloc(b->data, cap);
        if (!d) {
            b->oom = 1;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void png_buf_byte(png_buf *b, uint8_t v) {
    png_buf_put(b, &v, 1);
}

static void png_buf_u32be(png_buf *b, uint32_t v) {
    uint8_t be[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    png_buf_put(b, be, 4);
}

/* ---- checksums ------------------------------------------------------------ */

/* The CRC-32 table lives in the caller's frame: no hidden global state. */
typedef struct png_crc_table {
    uint32_t t[256];
} png_crc_table;

static void png_crc_init(png_crc_table *ct) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1u) ? 0xedb88320u ^ (c >> 1) : c >> 1;
        ct->t[n] = c;
    }
}

/* Continues crc (start with 0) over data, as PNG's chunk CRC wants. */
static uint32_t png_crc_update(const png_crc_table *ct, uint32_t crc, const uint8_t *data,
                               size_t n) {
    uint32_t c = crc ^ 0xffffffffu;
    for (size_t i = 0; i < n; i++)
        c = ct->t[(c ^ data[i]) & 0xffu] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

static uint32_t png_adler32(const uint8_t *data, size_t n) {
    const uint32_t mod = 65521u;
    uint32_t a = 1, b = 0;
    while (n > 0) {
        /* 5552 is the longest run before b can overflow 32 bits. */
        size_t run = n < 5552 ? n : 5552;
        for (size_t i = 0; i < run; i++) {
            a += data[i];
            b += a;
        }
        a %= mod;
        b %= mod;
        data += run;
        n -= run;
    }
    return (b << 16) | a;
}

/* ---- deflate -------------------------------------------------------------- */

typedef struct png_bits {
    png_buf *out;
    uint32_t acc; /* pending bits, least significant first */
    int n;
} png_bits;

static void png_bits_put(png_bits *w, uint32_t value, int nbits) {
    for (int i = 0; i < nbits; i++) {
        w->acc |= ((value >> i) & 1u) << w->n;
        if (++w->n == 8) {
            png_buf_byte(w->out, (uint8_t)w->acc);
            w->acc = 0;
            w->n = 0;
        }
    }
}

/* Huffman codes go out most significant bit first (RFC 1951, 3.1.1). */
static void png_bits_put_code(png_bits *w, uint32_t code, int len) {
    uint32_t rev = 0;
    for (int i = 0; i < len; i++)
        rev |= ((code >> i) & 1u) << (len - 1 - i);
    png_bits_put(w, rev, len);
}

static void png_bits_flush(png_bits *w) {
    if (w->n > 0)
        png_bits_put(w, 0, 8 - w->n);
}

/* The fixed literal/length code of RFC 1951, 3.2.6. */
static void png_put_litlen(png_bits *w, int sym) {
    if (sym < 144)
        png_bits_put_code(w, 0x30u + (uint32_t)sym, 8);
    else if (sym < 256)
        png_bits_put_code(w, 0x190u + (uint32_t)(sym - 144), 9);
    else if (sym < 280)
        png_bits_put_code(w, (uint32_t)(sym - 256), 7);
    else
        png_bits_put_code(w, 0xc0u + (uint32_t)(sym - 280), 8);
}

static const uint16_t png_len_base[29] = {3,  4,  5,  6,  7,  8,  9,  10,  11,  13,
                                          15, 17, 19, 23, 27, 31, 35, 43,  51,  59,
                                          67, 83, 99, 115, 131, 163, 195, 227, 258};
static const uint8_t png_len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                          2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
static const uint16_t png_dist_base[30] = {1,    2,    3,    4,    5,    7,     9,     13,
                                           17,   25,   33,   49,   65,   97,    129,   193,
                                           257,  385,  513,  769,  1025, 1537,  2049,  3073,
                                           4097, 6145, 8193, 12289, 16385, 24577};
static const uint8_t png_dist_extra[30] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                           6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

/* Index of the largest base <= value. */
static int png_find_code(const uint16_t *base, int count, int value) {
    int c = count - 1;
    while (base[c] > value)
        c--;
    return c;
}

static void png_put_match(png_bits *w, int len, int dist) {
    int lc = png_find_code(png_len_base, 29, len);
    png_put_litlen(w, 257 + lc);
    png_bits_put(w, (uint32_t)(len - png_len_base[lc]), png_len_extra[lc]);
    int dc = png_find_code(png_dist_base, 30, dist);
    png_bits_put_code(w, (uint32_t)dc, 5);
    png_bits_put(w, (uint32_t)(dist - png_dist_base[dc]), png_dist_extra[dc]);
}

static int png_match_len(const uint8_t *raw, size_t pos, size_t n, size_t dist) {
    size_t max = n - pos < 258 ? n - pos : 258;
    size_t len = 0;
    while (len < max && raw[pos + len] == raw[pos + len - dist])
        len++;
    return (int)len;
}

/* One fixed-Huffman block. Only two distances are tried, 1 (runs of a gray
 * level) and the scanline stride (a row like the one above): heatmaps are
 * made of little else, and it keeps the encoder short and obviously right. */
static void png_deflate_fixed(const uint8_t *raw, size_t n, size_t stride, png_bits *w) {
    png_bits_put(w, 1, 1); /* BFINAL */
    png_bits_put(w, 1, 2); /* BTYPE = 01, fixed Huffman */
    size_t pos = 0;
    while (pos < n) {
        int best = 0;
        size_t best_dist = 0;
        size_t dists[2] = {1, stride};
        for (int k = 0; k < 2; k++) {
            size_t d = dists[k];
            if (d == 0 || d > pos || d > 32768)
                continue;
            int len = png_match_len(raw, pos, n, d);
            if (len > best) {
                best = len;
                best_dist = d;
            }
        }
        if (best >= 3) {
            png_put_match(w, best, (int)best_dist);
            pos += (size_t)best;
        } else {
            png_put_litlen(w, raw[pos]);
            pos++;
        }
    }
    png_put_litlen(w, 256); /* end of block */
    png_bits_flush(w);
}

static void png_deflate_stored(const uint8_t *raw, size_t n, png_buf *out) {
    size_t pos = 0;
    do {
        size_t len = n - pos < 65535 ? n - pos : 65535;
        int final = pos + len == n;
        uint8_t head[5] = {(uint8_t)final, (uint8_t)len, (uint8_t)(len >> 8),
                           (uint8_t)~len, (uint8_t)(~len >> 8)};
        png_buf_put(out, head, sizeof head);
        png_buf_put(out, raw + pos, len);
        pos += len;
    } while (pos < n);
}

static void png_zlib(const uint8_t *raw, size_t n, size_t stride, png_deflate mode,
                     png_buf *out) {
    /* CMF 0x78: deflate, 32 KiB window; FLG 0x01 makes CMF*256+FLG a multiple of 31. */
    png_buf_byte(out, 0x78);
    png_buf_byte(out, 0x01);
    if (mode == PNG_DEFLATE_STORED) {
        png_deflate_stored(raw, n, out);
    } else {
        png_bits w = {out, 0, 0};
        png_deflate_fixed(raw, n, stride, &w);
    }
    png_buf_u32be(out, png_adler32(raw, n));
}

/* ---- the file ------------------------------------------------------------- */

static void png_put_chunk(png_buf *out, const png_crc_table *ct, const char type[4],
                          const uint8_t *data, size_t len) {
    png_buf_u32be(out, (uint32_t)len);
    png_buf_put(out, type, 4);
    png_buf_put(out, data, len);
    uint32_t crc = png_crc_update(ct, 0, (const uint8_t *)type, 4);
    crc = png_crc_update(ct, crc, data, len);
    png_buf_u32be(out, crc);
}

static void png_put_ihdr(png_buf *out, const png_crc_table *ct, int width, int height) {
    uint8_t ihdr[13] = {
        (uint8_t)(width >> 24),  (uint8_t)(width >> 16),  (uint8_t)(width >> 8),  (uint8_t)width,
        (uint8_t)(height >> 24), (uint8_t)(height >> 16), (uint8_t)(height >> 8), (uint8_t)height,
        8, /* bit depth */
        0, /* color type: grayscale */
        0, /* compression: deflate */
        0, /* filter method */
        0  /* no interlace */
    };
    png_put_chunk(out, ct, "IHDR", ihdr, sizeof ihdr);
}

/* Scanlines as PNG stores them: a filter byte (0, none) before each row. */
static uint8_t *png_scanlines(const uint8_t *pixels, int width, int height, size_t *n,
                              stof_error *err) {
    size_t stride = (size_t)width + 1;
    uint8_t *raw = err_malloc(stride * (size_t)height, err);
    if (!raw)
        return NULL;
    for (int y = 0; y < height; y++) {
        raw[(size_t)y * stride] = 0;
        memcpy(raw + (size_t)y * stride + 1, pixels + (size_t)y * (size_t)width, (size_t)width);
    }
    *n = stride * (size_t)height;
    return raw;
}

int png_encode_gray(const uint8_t *pixels, int width, int height, png_deflate mode,
                    uint8_t **out, size_t *out_len, stof_error *err) {
    if (!pixels || !out || !out_len)
        return err_set(err, STOF_ERR_INVALID, "png: pixels and output must not be NULL");
    if (width <= 0 || height <= 0 || width > PNG_MAX_SIDE || height > PNG_MAX_SIDE)
        return err_set(err, STOF_ERR_INVALID, "png: image size %d x %d is outside 1..%d a side",
                       width, height, PNG_MAX_SIDE);
    if (mode != PNG_DEFLATE_STORED && mode != PNG_DEFLATE_FIXED)
        return err_set(err, STOF_ERR_INVALID, "png: unknown deflate mode %d", (int)mode);
    size_t raw_len = 0;
    uint8_t *raw = png_scanlines(pixels, width, height, &raw_len, err);
    if (!raw)
        return STOF_ERR_NOMEM;
    png_crc_table ct;
    png_crc_init(&ct);
    png_buf z = {0}, file = {0};
    png_zlib(raw, raw_len, (size_t)width + 1, mode, &z);
    free(raw);
    static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    png_buf_put(&file, signature, sizeof signature);
    png_put_ihdr(&file, &ct, width, height);
    if (!z.oom)
        png_put_chunk(&file, &ct, "IDAT", z.data, z.len);
    png_put_chunk(&file, &ct, "IEND", NULL, 0);
    int oom = z.oom || file.oom;
    free(z.data);
    if (oom) {
        free(file.data);
        return err_set(err, STOF_ERR_NOMEM, "png: out of memory encoding %d x %d", width,
                       height);
    }
    *out = file.data;
    *out_len = file.len;
    return STOF_OK;
}

int png_write_gray(const char *path, const uint8_t *pixels, int width, int height,
                   stof_error *err) {
    if (!path)
        return err_set(err, STOF_ERR_INVALID, "png: path must not be NULL");
    uint8_t *data = NULL;
    size_t len = 0;
    int rc = png_encode_gray(pixels, width, height, PNG_DEFLATE_FIXED, &data, &len, err);
    if (rc != STOF_OK)
        return rc;
    rc = file_write(path, "PNG image", data, len, err);
    free(data);
    return rc;
}
