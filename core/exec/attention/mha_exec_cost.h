/* The calibrated cost model of the attention kernels: what a launch of a
 * configuration takes on a mask, predicted from measured costs.
 *
 * A launch is tiles (the block-wise kernel: one block row of BLOCK_M query
 * rows of one head; the row-wise kernel: rows_per_warp x warps_per_block
 * rows) spread over the SMs. A tile costs
 *
 *   throughput: thr_tile + full x thr_full + partial x thr_part
 *               (us of an SM's time while the SM is full of tiles)
 *   latency:    lat_tile + full x lat_full + partial x lat_part
 *               (us of one tile alone on an SM: nothing hides its loads)
 *
 * where full / partial count the tile's loaded key blocks at the
 * configuration's BLOCK_M x BLOCK_N (row-wise: full is the tile's allowed
 * pairs for throughput, the longest row's keys times rows_per_warp for
 * latency; it has no partial blocks). The tiles go to the SMs in launch
 * order (batch, head, block row; a split plan's work items longest first,
 * as mha_exec_split_build orders them), each to the least loaded SM. An SM
 * ends after its load, and after each tile's start plus its latency, a tile
 * starting when its predecessor on the SM would run alone: so equal tiles
 * end with the load, and a long tile started late ends late (Longformer's
 * global rows). Rows the plan would split (mha_exec_split_chunk) count as
 * their pieces, and the combine kernel of a split plan as one more tile
 * latency. Tile work counts come from the mask's 16 x 16 blocks, so every
 * setting is ranked without building its own format.
 *
 * The costs are data: kernels/attention_cost.txt, one line a measured
 * setting (arch, head size, kernel, sizes, the six costs), written by
 * bench/attention_calibrate.py on the GPU it names (see there for the
 * problems each cost comes from). A head size without a line takes the
 * nearest measured one's, its block costs scaled by the ratio of head sizes;
 * an architecture without lines has no model (the caller keeps to the
 * paper's Eq. 1 and 2). */
#ifndef STOF_CORE_EXEC_ATTENTION_MHA_EXEC_COST_H
#define STOF_CORE_EXEC_ATTENTION_MHA_EXEC_COST_H

#include <stddef.h>
#include <stdint.h>

#include "ops/mask.h"
#include "ops/mask_format.h"
#include "ops/mha_select.h"
#include "stof.h"

#define MHA_COST_FILE "attention_cost.txt"

typedef struct mha_cost_entry {
    char arch[16];
    int head_dim;
    mha_kernel kernel;
    int block_m, block_n, num_warps;     /* block-wise */
    int rows_per_warp, warps_per_block;  /* row-wise */
    double thr_tile, thr_full, thr_part; /* us */
    double lat_tile, lat_full, lat_part; /* us */
} mha_cost_entry;

typedef struct mha_cost_table {
    mha_cost_entry *entries;
    int n;
} mha_cost_table;

/* Reads the text of a cost file (name for messages): '#' starts a comment;
 * each other line is
 *   ARCH HEAD_DIM block BLOCK_M BLOCK_N WARPS THR_TILE THR_FULL THR_PART LAT_TILE LAT_FULL LAT_PART
 *   ARCH HEAD_DIM row ROWS_PER_WARP WARPS_PER_BLOCK 0 THR_TILE THR_PAIR THR_PAIR LAT_TILE LAT_KEY LAT_KEY
 * STOF_ERR_FORMAT naming the file, the line and the field otherwise (a cost
 * that is negative or not finite, a size that is not a multiple of 16, a
 * setting given twice). */
int mha_cost_parse(const char *text, const char *name, mha_cost_table *out, stof_error *err);
/* The library's own table (kernels/attention_cost.txt, embedded). */
int mha_cost_builtin(mha_cost_table *out, stof_error *err);
void mha_cost_table_free(mha_cost_table *t);

/* The entry for a setting on arch at head_dim, into *out (head size scaled
 * as above): 1 when there is one, 0 otherwise. Block-wise settings look up
 * (block_m, block_n, num_warps). Row-wise ones look up (rows_per_warp,
 * warps_per_block), else take the arch's row-wise costs of another
 * geometry: they are a warp's per pair and per key. */
int mha_cost_lookup(const mha_cost_table *t, const char *arch, int head_dim, mha_kernel kernel,
                    int a, int b, int c, mha_cost_entry *out);
/* Whether arch has any line. */
int mha_cost_has_arch(const mha_cost_table *t, const char *arch);

/* The mask's 16 x 16 blocks, the input of every prediction: per stored
 * batch, a byte per block (0 empty, 1 partial, 2 full). */
typedef struct mha_cost_grid {
    int batch;            /* stored batches of the mask */
    int rows16, cols16;   /* ceil(q_len / 16), ceil(k_len / 16) */
    uint8_t *state;       /* [batch][rows16][cols16] */
    const mask *folded;   /* not owned: the row-wise counts read its rows */
    /* The cells of every block_m / 16 rows merged (empty, partial or full at
     * BLOCK_M x 16), for the last block_m asked: settings of one BLOCK_M
     * share it. */
    int merged_m;
    uint8_t *merged;      /* [batch][ceil(rows16 / (merged_m / 16))][cols16] */
} mha_cost_grid;

/* From the 16 x 16 format of folded (mask_format_bsr_build(folded, 16, 16)). */
int mha_cost_grid_build(const mask *folded, const mask_bsr *blocks16, mha_cost_grid *out,
                        stof_error *err);
void mha_cost_grid_free(mha_cost_grid *g);

/* The loaded and full blocks of every block row of stored batch b at
 * (block_m, block_n), multiples of 16, from the grid: loaded[i], full[i] for
 * each of ceil(q_len / block_m) rows. Equal to mask_format_bsr_build's
 * counts. STOF_ERR_NOMEM, or STOF_ERR_INVALID for a size that is not a
 * positive multiple of 16. */
int mha_cost_grid_rows(mha_cost_grid *g, int b, int block_m, int block_n, int *loaded,
                       int *full, stof_error *err);

/* What the launch of entry e takes on the grid's mask for batch x heads on
 * sm_count SMs, in us. Block rows are split as the plan splits them:
 * force_chunk > 0 at that chunk, < 0 never, 0 by mha_exec_split_chunk on
 * `resident` CTA slots (0 slots: never). -1 when out of memory. */
double mha_cost_predict(const mha_cost_entry *e, mha_cost_grid *g, int batch, int heads,
                        int sm_count, int resident, int force_chunk);

#endif
