/* A grayscale canvas for figures written as PNG (ops/png.h): filled
 * rectangles, lines and text in a 5 x 7 pixel font drawn at a whole-number
 * scale. ASCII only; capitals are drawn as small letters, and a character
 * the font lacks as '?'. Drawing is clipped to the canvas. */
#ifndef STOF_OPS_CANVAS_H
#define STOF_OPS_CANVAS_H

#include <stdint.h>

#include "stof.h"

typedef struct canvas {
    int w, h;
    uint8_t *px; /* w x h, row-major, 0 black, 255 white */
} canvas;

/* A white canvas; STOF_ERR_NOMEM. Free with canvas_free. */
int canvas_init(canvas *c, int w, int h, stof_error *err);
void canvas_free(canvas *c);

void canvas_rect(canvas *c, int x, int y, int w, int h, uint8_t v);
/* The outline of a rectangle, t pixels thick. */
void canvas_frame(canvas *c, int x, int y, int w, int h, int t, uint8_t v);

/* Text with its top-left corner at (x, y), each font pixel a scale x scale
 * square; vertical: written bottom to top (a y axis' label), (x, y) then
 * its bottom-left corner. */
void canvas_text(canvas *c, int x, int y, const char *s, int scale, int vertical, uint8_t v);
/* The width text takes at scale (6 x scale a character, its spacing included). */
int canvas_text_width(const char *s, int scale);
#define CANVAS_TEXT_HEIGHT 7

#endif
