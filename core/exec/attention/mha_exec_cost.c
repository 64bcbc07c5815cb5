/* The calibrated cost model of the attention kernels (see mha_exec_cost.h). */
#include "core/exec/attention/mha_exec_cost.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/exec/attention/mha_exec.h"
#include "core/gpu/kernels.h"

/* ---- the table ------------------------------------------------------------------------- */

static const char *const cost_fields[] = {"THR_TILE", "THR_FULL", "THR_PART",
                                          "LAT_TILE", "LAT_FULL", "LAT_PART"};
#define N_COSTS 6

static int same_setting(const mha_cost_entry *a, const mha_cost_entry *b) {
    return strcmp(a->arch, b->arch) == 0 && a->head_dim == b->head_dim &&
           a->kernel == b->kernel && a->block_m == b->block_m && a->block_n == b->block_n &&
           a->num_warps == b->num_warps && a->rows_per_warp == b->rows_per_warp &&
           a->warps_per_block == b->warps_per_block;
}

/* The sizes of one line: block-wise multiples of 16 and whole warps,
 * row-wise positive counts. */
static int check_sizes(const mha_cost_entry *e, int s[3], const char *name, int line,
                       stof_error *err) {
    if (e->head_dim < 1 || e->head_dim > 256)
        return err_set(err, STOF_ERR_FORMAT, "%s:%d: HEAD_DIM %d is not in 1..256", name, line,
                       e->head_dim);
    if (e->kernel == MHA_KERNEL_BLOCK_WISE &&
        (s[0] < 16 || s[0] % 16 || s[1] < 16 || s[1] % 16 || s[0] > MASK_FORMAT_MAX_BLOCK ||
         s[1] > MASK_FORMAT_MAX_BLOCK || s[2] < 1 || s[2] > 32))
        return err_set(err, STOF_ERR_FORMAT,
                       "%s:%d: block %dx%d with %d warps: sizes are multiples of 16 up to %d, "
                       "warps 1..32", name, line, s[0], s[1], s[2], MASK_FORMAT_MAX_BLOCK);
    if (e->kernel == MHA_KERNEL_ROW_WISE && (s[0] < 1 || s[1] < 1 || s[1] > 32 || s[2] != 0))
        return err_set(err, STOF_ERR_FORMAT,
                       "%s:%d: row-wise ROWS_PER_WARP %d, WARPS_PER_BLOCK %d, then 0 (got %d)",
                       name, line, s[0], s[1], s[2]);
    return STOF_OK;
}

/* One line that is not blank or a comment into *e. */
static int parse_line(const char *text, const char *name, int line, mha_cost_entry *e,
                      stof_error *err) {
    char kind[8];
    int s[3], used = 0;
    double c[N_COSTS];
    memset(e, 0, sizeof *e);
    int got = sscanf(text, "%15s %d %7s %d %d %d %lf %lf %lf %lf %lf %lf %n", e->arch,
                     &e->head_dim, kind, &s[0], &s[1], &s[2], &c[0], &c[1], &c[2], &c[3], &c[4],
                     &c[5], &used);
    if (got < 6 + N_COSTS)
        return err_set(err, STOF_ERR_FORMAT,
                       "%s:%d: expected ARCH HEAD_DIM block|row A B C THR_TILE THR_FULL "
                       "THR_PART LAT_TILE LAT_FULL LAT_PART (12 fields), read %d", name, line,
                       got < 0 ? 0 : got);
    if (text[used] != '\0' && text[used] != '#')
        return err_set(err, STOF_ERR_FORMAT, "%s:%d: text after the 12 fields: '%.20s'", name,
                       line, text + used);
    if (strncmp(e->arch, "sm_", 3) != 0)
        return err_set(err, STOF_ERR_FORMAT, "%s:%d: ARCH '%s' is not of the form sm_XY", name,
                       line, e->arch);
    if (strcmp(kind, "block") == 0)
        e->kernel = MHA_KERNEL_BLOCK_WISE;
    else if (strcmp(kind, "row") == 0)
        e->kernel = MHA_KERNEL_ROW_WISE;
    else
        return err_set(err, STOF_ERR_FORMAT, "%s:%d: kernel '%s' is not block or row", name,
                       line, kind);
    int rc = check_sizes(e, s, name, line, err);
    if (rc)
        return rc;
    for (int k = 0; k < N_COSTS; k++)
        if (!isfinite(c[k]) || c[k] < 0)
            return err_set(err, STOF_ERR_FORMAT,
                           "%s:%d: %s is %g: costs are finite and not negative", name, line,
                           cost_fields[k], c[k]);
    if (e->kernel == MHA_KERNEL_BLOCK_WISE) {
        e->block_m = s[0];
        e->block_n = s[1];
        e->num_warps = s[2];
    } else {
        e->rows_per_warp = s[0];
        e->warps_per_block = s[1];
    }
    e->thr_tile = c[0];
    e->thr_full = c[1];
    e->thr_part = c[2];
    e->lat_tile = c[3];
    e->lat_full = c[4];
    e->lat_part = c[5];
    return STOF_OK;
}

static int append(mha_cost_table *t, int *cap, const mha_cost_entry *e, stof_error *err) {
    if (t->n == *cap) {
        int want = *cap ? 2 * *cap : 64;
        mha_cost_entry *grown = realloc(t->entries, (size_t)want * sizeof *grown);
        if (!grown)
            return err_set(err, STOF_ERR_NOMEM, "out of memory reading the attention costs");
        t->entries = grown;
        *cap = want;
    }
    t->entries[t->n++] = *e;
    return STOF_OK;
}

/* Whether a line holds nothing but blanks and a comment. */
static int blank_line(const char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\r')
        s++;
    return *s == '\0' || *s == '#';
}

int mha_cost_parse(const char *text, const char *name, mha_cost_table *out, stof_error *err) {
    memset(out, 0, sizeof *out);
    int cap = 0, line = 0, rc = STOF_OK;
    char buf[512];
    for (const char *p = text; *p && !rc;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        line++;
        if (len >= sizeof buf) {
            rc = err_set(err, STOF_ERR_FORMAT, "%s:%d: line of %zu bytes (at most %zu)", name,
                         line, len, sizeof buf - 1);
            break;
        }
        memcpy(buf, p, len);
        buf[len] = '\0';
        p += len + (end ? 1 : 0);
        if (blank_line(buf))
            continue;
        mha_cost_entry e;
        if ((rc = parse_line(buf, name, line, &e, err)))
            break;
        for (int i = 0; i < out->n && !rc; i++)
            if (same_setting(&out->entries[i], &e))
                rc = err_set(err, STOF_ERR_FORMAT, "%s:%d: the setting of this line is given "
                             "twice (an earlier line has it)", name, line);
        if (!rc)
            rc = append(out, &cap, &e, err);
    }
    if (rc)
        mha_cost_table_free(out);
    return rc;
}

int mha_cost_builtin(mha_cost_table *out, stof_error *err) {
    const kernel_source *src = kernel_find(MHA_COST_FILE);
    if (!src) {
        memset(out, 0, sizeof *out);
        return err_set(err, STOF_ERR_INTERNAL, "kernels/%s is not built in", MHA_COST_FILE);
    }
    return mha_cost_parse(src->text, "kernels/" MHA_COST_FILE, out, err);
}

void mha_cost_table_free(mha_cost_table *t) {
    free(t->entries);
    t->entries = NULL;
    t->n = 0;
}

int mha_cost_has_arch(const mha_cost_table *t, const char *arch) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->entries[i].arch, arch) == 0)
            return 1;
    return 0;
}

int mha_cost_lookup(const mha_cost_table *t, const char *arch, int head_dim, mha_kernel kernel,
                    int a, int b, int c, mha_cost_entry *out) {
    const mha_cost_entry *best = NULL;
    const int row = kernel == MHA_KERNEL_ROW_WISE;
    for (int pass = 0; pass < 1 + row && !best; pass++)
        for (int i = 0; i < t->n; i++) {
            const mha_cost_entry *e = &t->entries[i];
            /* row-wise, second pass: any geometry */
            int same = !row ? e->block_m == a && e->block_n == b && e->num_warps == c
                            : pass == 1 || (e->rows_per_warp == a && e->warps_per_block == b);
            if (e->kernel != kernel || !same || strcmp(e->arch, arch) != 0)
                continue;
            /* the nearest head size; of two as near, the larger (costs scale down) */
            int d = abs(e->head_dim - head_dim), bd = best ? abs(best->head_dim - head_dim) : 0;
            if (!best || d < bd || (d == bd && e->head_dim > best->head_dim))
                best = e;
        }
    if (!best)
        return 0;
    *out = *best;
    if (row) {
        out->rows_per_warp = a;
        out->warps_per_block = b;
    }
    if (best->head_dim != head_dim) {
        /* the work of a block is q.k and p.v over the head: linear in it */
        double r = (double)head_dim / best->head_dim;
        out->thr_full *= r;
        out->thr_part *= r;
        out->lat_full *= r;
        out->lat_part *= r;
        out->head_dim = head_dim;
    }
    return 1;
}

/* ---- the mask at 16 x 16 ---------------------------------------------------------------- */

enum { CELL_EMPTY = 0, CELL_PARTIAL = 1, CELL_FULL = 2 };

int mha_cost_grid_build(const mask *folded, const mask_bsr *blocks16, mha_cost_grid *out,
                        stof_error *err) {
    memset(out, 0, sizeof *out);
    const mask_bsr *f = blocks16;
    size_t cells = (size_t)f->batch * f->n_block_rows * f->n_block_cols;
    out->state = err_calloc(cells ? cells : 1, 1, err);
    if (!out->state)
        return STOF_ERR_NOMEM;
    out->batch = f->batch;
    out->rows16 = f->n_block_rows;
    out->cols16 = f->n_block_cols;
    out->folded = folded;
    for (int b = 0; b < f->batch; b++) {
        const int64_t base = mask_format_bsr_row_base(f, b);
        for (int i = 0; i < f->n_block_rows; i++) {
            uint8_t *row = out->state + ((size_t)b * f->n_block_rows + i) * f->n_block_cols;
            for (int32_t k = f->full_row_ptr[base + i]; k < f->full_row_ptr[base + i + 1]; k++)
                row[f->full_col_idx[k]] = CELL_FULL;
            for (int32_t k = f->part_row_ptr[base + i]; k < f->part_row_ptr[base + i + 1]; k++)
                row[f->part_col_idx[k]] = CELL_PARTIAL;
        }
    }
    return STOF_OK;
}

void mha_cost_grid_free(mha_cost_grid *g) {
    free(g->state);
    free(g->merged);
    memset(g, 0, sizeof *g);
}

/* Two cells merged: empty when both are, full when both are, else partial. */
static uint8_t merge_cell(uint8_t a, uint8_t b) {
    return a == b ? a : CELL_PARTIAL;
}

/* g->merged for block_m (every stored batch), unless it holds it already. */
static int merge_rows(mha_cost_grid *g, int block_m, stof_error *err) {
    if (g->merged && g->merged_m == block_m)
        return STOF_OK;
    const int rm = block_m / 16, rows = (g->rows16 + rm - 1) / rm;
    uint8_t *m = realloc(g->merged, (size_t)g->batch * rows * g->cols16 + 1);
    if (!m)
        return err_set(err, STOF_ERR_NOMEM, "out of memory ranking attention settings");
    g->merged = m;
    g->merged_m = block_m;
    for (int b = 0; b < g->batch; b++)
        for (int i = 0; i < rows; i++) {
            uint8_t *out = m + ((size_t)b * rows + i) * g->cols16;
            const int r0 = i * rm, r1 = r0 + rm < g->rows16 ? r0 + rm : g->rows16;
            memcpy(out, g->state + ((size_t)b * g->rows16 + r0) * g->cols16, (size_t)g->cols16);
            for (int r = r0 + 1; r < r1; r++) {
                const uint8_t *row = g->state + ((size_t)b * g->rows16 + r) * g->cols16;
                for (int c = 0; c < g->cols16; c++)
                    out[c] = merge_cell(out[c], row[c]);
            }
        }
    return STOF_OK;
}

int mha_cost_grid_rows(mha_cost_grid *g, int b, int block_m, int block_n, int *loaded,
                       int *full, stof_error *err) {
    if (block_m < 16 || block_m % 16 || block_n < 16 || block_n % 16)
        return err_set(err, STOF_ERR_INVALID, "attention cost: block %dx%d is not made of "
                       "16 x 16 cells", block_m, block_n);
    int rc = merge_rows(g, block_m, err);
    if (rc)
        return rc;
    const int rn = block_n / 16, rows = (g->rows16 + block_m / 16 - 1) / (block_m / 16);
    for (int i = 0; i < rows; i++) {
        const uint8_t *row = g->merged + ((size_t)b * rows + i) * g->cols16;
        loaded[i] = full[i] = 0;
        for (int c0 = 0; c0 < g->cols16; c0 += rn) {
            const int c1 = c0 + rn < g->cols16 ? c0 + rn : g->cols16;
            uint8_t cell = row[c0];
            for (int c = c0 + 1; c < c1; c++)
                cell = merge_cell(cell, row[c]);
            loaded[i] += cell != CELL_EMPTY;
            full[i] += cell == CELL_FULL;
        }
    }
    return STOF_OK;
}

/* ---- the launch ------------------------------------------------------------------------- */

/* A tile's costs, and its length for the split plan's order. */
typedef struct tile {
    double thr, lat;
    int len, row; /* loaded blocks; block row */
} tile;

/* The tiles of each stored batch in launch order: tiles[ptr[b] .. ptr[b + 1]). */
typedef struct launch {
    tile *tiles;
    int *ptr;
    int fmt_batch;
} launch;

static void launch_free(launch *l) {
    free(l->tiles);
    free(l->ptr);
}

/* An SM of the list schedule: the SM-time of the tiles given to it, when
 * its last one can end, and the costs of the last one given. */
typedef struct sm_state {
    double load, finish, last_thr, last_lat;
} sm_state;

static void sift_down(sm_state *h, int n) {
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && h[l].load < h[m].load)
            m = l;
        if (r < n && h[r].load < h[m].load)
            m = r;
        if (m == i)
            return;
        sm_state t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* The launch's time on sm SMs: tiles in launch order (batch, then head, then
 * the stored batch's tiles), each to the least loaded SM. An SM ends after
 * its load, and after each tile's start plus its latency. A tile starts when
 * a slot frees: the SM's load before it less what its previous tile still
 * had to run alone (its latency less its throughput cost), so that equal
 * tiles end with the load and a long tile given late ends late. */
static double list_schedule(const launch *l, int batch, int heads, int sm) {
    sm_state *h = calloc((size_t)sm, sizeof *h);
    if (!h)
        return -1;
    for (int z = 0; z < batch; z++) {
        const int b = l->fmt_batch == 1 ? 0 : z;
        for (int y = 0; y < heads; y++)
            for (int x = l->ptr[b]; x < l->ptr[b + 1]; x++) {
                const tile *t = &l->tiles[x];
                sm_state *s = &h[0];
                double start = s->load - (s->last_lat - s->last_thr);
                start = start > 0 ? start : 0;
                s->finish = fmax(s->finish, start + t->lat);
                s->load += t->thr;
                s->last_thr = t->thr;
                s->last_lat = t->lat;
                sift_down(h, sm);
            }
    }
    double end = 0;
    for (int i = 0; i < sm; i++)
        end = fmax(end, fmax(h[i].load, h[i].finish));
    free(h);
    return end;
}

static tile block_tile(const mha_cost_entry *e, double loaded, double full, int row) {
    double part = loaded - full;
    return (tile){e->thr_tile + full * e->thr_full + part * e->thr_part,
                  e->lat_tile + full * e->lat_full + part * e->lat_part, (int)(loaded + 0.5),
                  row};
}

/* The split build's order within a batch: longest first, then by block row
 * (as mha_exec_split_build orders its work items). */
static int by_split_order(const void *pa, const void *pb) {
    const tile *a = pa, *b = pb;
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1;
    return (a->row > b->row) - (a->row < b->row);
}

/* The block-wise launch: every stored batch's block rows in order, or, where
 * the plan splits, its work items (rows cut into near-equal pieces). */
static int block_launch(const mha_cost_entry *e, mha_cost_grid *g, int batch, int heads,
                        int resident, int force_chunk, launch *out, int *split) {
    const int rows = (g->rows16 + e->block_m / 16 - 1) / (e->block_m / 16);
    const int n = g->batch * rows;
    int *loaded = malloc((size_t)n * sizeof *loaded), *full = malloc((size_t)n * sizeof *full);
    int *len = malloc((size_t)n * sizeof *len);
    out->ptr = malloc(((size_t)g->batch + 1) * sizeof *out->ptr);
    out->tiles = NULL;
    out->fmt_batch = g->batch;
    int rc = loaded && full && len && out->ptr ? STOF_OK : STOF_ERR_NOMEM;
    stof_error ignored = {0};
    for (int b = 0; !rc && b < g->batch; b++)
        rc = mha_cost_grid_rows(g, b, e->block_m, e->block_n, loaded + b * rows,
                                full + b * rows, &ignored);
    int64_t work = 0, items = 0;
    int chunk = 0;
    if (!rc) {
        for (int i = 0; i < n; i++)
            work += loaded[i];
        const int64_t copies = (int64_t)heads * (g->batch == 1 ? batch : 1);
        memcpy(len, loaded, (size_t)n * sizeof *len);
        chunk = force_chunk > 0 ? force_chunk
                : force_chunk == 0 && resident > 0
                    ? mha_exec_split_chunk_of(len, n, work * copies, resident)
                    : 0;
        for (int i = 0; i < n; i++)
            items += chunk > 0 && loaded[i] > chunk ? (loaded[i] + chunk - 1) / chunk : 1;
        out->tiles = malloc((size_t)items * sizeof *out->tiles);
        rc = out->tiles ? STOF_OK : STOF_ERR_NOMEM;
    }
    int k = 0;
    for (int b = 0; !rc && b < g->batch; b++) {
        out->ptr[b] = k;
        for (int i = b * rows; i < (b + 1) * rows; i++) {
            const int pieces =
                chunk > 0 && loaded[i] > chunk ? (loaded[i] + chunk - 1) / chunk : 1;
            *split |= pieces > 1;
            for (int q = 0; q < pieces; q++)
                out->tiles[k++] = block_tile(e, (double)loaded[i] / pieces,
                                             (double)full[i] / pieces, i - b * rows);
        }
        if (*split)
            qsort(out->tiles + out->ptr[b], (size_t)(k - out->ptr[b]), sizeof *out->tiles,
                  by_split_order);
    }
    if (!rc)
        out->ptr[g->batch] = k;
    free(loaded), free(full), free(len);
    if (rc)
        launch_free(out);
    return rc;
}

/* The row-wise launch: tiles of rows_per_warp x warps_per_block rows. */
static int row_launch(const mha_cost_entry *e, mha_cost_grid *g, launch *out) {
    const mask *m = g->folded;
    const int per_tile = e->rows_per_warp * e->warps_per_block;
    const int tiles = (m->q_len + per_tile - 1) / per_tile;
    out->fmt_batch = m->batch;
    out->tiles = malloc((size_t)m->batch * tiles * sizeof *out->tiles);
    out->ptr = malloc(((size_t)m->batch + 1) * sizeof *out->ptr);
    if (!out->tiles || !out->ptr) {
        launch_free(out);
        return STOF_ERR_NOMEM;
    }
    for (int b = 0; b <= m->batch; b++)
        out->ptr[b] = b * tiles;
    for (int b = 0; b < m->batch; b++)
        for (int t = 0; t < tiles; t++) {
            int64_t pairs = 0, longest = 0;
            for (int i = t * per_tile; i < (t + 1) * per_tile && i < m->q_len; i++) {
                int64_t keys = mask_row_count_range(mask_row(m, b, i), 0, m->k_len);
                pairs += keys;
                longest = keys > longest ? keys : longest;
            }
            out->tiles[b * tiles + t] =
                (tile){e->thr_tile + (double)pairs * e->thr_full,
                       e->lat_tile + (double)(longest * e->rows_per_warp) * e->lat_full, 0, t};
        }
    return STOF_OK;
}

double mha_cost_predict(const mha_cost_entry *e, mha_cost_grid *g, int batch, int heads,
                        int sm_count, int resident, int force_chunk) {
    launch l = {0};
    int split = 0;
    int rc = e->kernel == MHA_KERNEL_BLOCK_WISE
                 ? block_launch(e, g, batch, heads, resident, force_chunk, &l, &split)
                 : row_launch(e, g, &l);
    if (rc)
        return -1;
    double t = list_schedule(&l, batch, heads, sm_count > 0 ? sm_count : 1);
    launch_free(&l);
    /* a plan that splits rows runs a second kernel, the combine: at least one more tile's
     * fixed latency (on an H100, causal 1 x 12 x 128 at head size 128 split into 3 items
     * took 16 us against 4.4 for the best setting that does not split) */
    return t < 0 ? t : t + (split ? e->lat_tile : 0);
}
