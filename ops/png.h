/* A minimal PNG writer (8-bit grayscale) with no external library: its own
 * CRC-32, Adler-32 and deflate, for mask heatmaps and any later plots.
 *
 * Two deflate modes: PNG_DEFLATE_STORED writes uncompressed blocks (trivial
 * to check by hand); PNG_DEFLATE_FIXED writes one fixed-Huffman block whose
 * only back-references are runs (distance 1) and copies of the previous
 * scanline (distance width + 1), which is what heatmaps are made of: a
 * 512 x 512 mask image shrinks from 257 KiB to a few KiB. */
#ifndef STOF_OPS_PNG_H
#define STOF_OPS_PNG_H

#include <stddef.h>
#include <stdint.h>

#include "stof.h"

#define PNG_MAX_SIDE 32767 /* keeps the previous-scanline distance within deflate's 32 KiB */

typedef enum png_deflate {
    PNG_DEFLATE_STORED = 0,
    PNG_DEFLATE_FIXED = 1
} png_deflate;

/* Encodes pixels (row-major, width x height, 0 = black, 255 = white) into a
 * malloc'd PNG file image *out of *out_len bytes. */
int png_encode_gray(const uint8_t *pixels, int width, int height, png_deflate mode,
                    uint8_t **out, size_t *out_len, stof_error *err);

/* Encodes with PNG_DEFLATE_FIXED and writes the file (STOF_ERR_IO on failure). */
int png_write_gray(const char *path, const uint8_t *pixels, int width, int height,
                   stof_error *err);

#endif
