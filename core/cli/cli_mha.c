/* `stof mha-select`: the analytical attention-kernel choice for every
 * distinct (mask, shape) of a model: the paper's Eq. 1 and Eq. 2 with the
 * score table, then the calibrated cost model's ranking (what plans take
 * where it has the GPU's costs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cli/cli.h"
#include "core/exec/attention/mha_exec.h"
#include "core/gpu/device.h"
#include "ops/mask.h"
#include "ops/mask_format.h"
#include "ops/mha_select.h"

/* Limits of this machine's GPU, or of --arch (default sm_90) without one. */
static int selection_limits(const cli_args *a, mha_device_limits *lim, char *arch, size_t n) {
    stof_error err = {0};
    stof_device_info d;
    if (!a->arch && device_query(0, &d, &err) == STOF_OK) {
        device_arch_name(&d, arch, n);
        *lim = (mha_device_limits){d.sm_count, d.smem_per_sm, d.smem_per_block_optin,
                                   d.max_warps_per_sm, 1024, arch};
        printf("limits of GPU 0: %s (%s)\n", d.name, arch);
        return 0;
    }
    snprintf(arch, n, "%s", a->arch ? a->arch : "sm_90");
    if (mha_limits_for_arch(arch, lim, &err)) {
        fprintf(stderr, "stof: %s\n", err.msg);
        return 1;
    }
    printf("limits of %s (%s)\n", arch, a->arch ? "--arch" : "no GPU here; use --arch to choose");
    return 0;
}

/* "block 64x64 w4 wgmma st3 tma" or "row 1x4". */
static void print_setting(const mha_exec_config *c) {
    if (c->kernel == MHA_KERNEL_BLOCK_WISE)
        printf("block %3dx%-3d w%d st%d%s%s", c->block_m, c->block_n, c->num_warps, c->stages,
               c->wgmma ? " wgmma" : "", c->tma ? " tma" : "");
    else
        printf("row %dx%d", c->rows_per_warp, c->warps_per_block);
}

/* The cost model's ranking of the op's settings (the first few). */
static int print_model_rank(const graph *g, const graph_op *op, const mha_device_limits *lim) {
    const op_attention *at = &op->attr.attn;
    const graph_tensor *q = &g->tensors[op->inputs[0]];
    const graph_tensor *kv = &g->tensors[op->inputs[at->cross ? 1 : 0]];
    mha_exec_problem p = {.mask = at->mask >= 0 ? g->masks[at->mask] : NULL,
                          .causal = at->causal, .batch = (int)q->shape[0], .heads = at->heads,
                          .head_dim = at->head_dim, .q_len = (int)q->shape[1],
                          .k_len = (int)kv->shape[1], .dtype = q->dtype, .scale = 1.0f,
                          .relpos = at->relpos, .relpos_buckets = at->relpos_buckets,
                          .relpos_max_distance = at->relpos_max_distance,
                          .relpos_bidirectional = at->relpos_bidirectional,
                          .padded = at->padded, .kv_heads = at->kv_heads};
    stof_error err = {0};
    mask *folded = NULL;
    mha_exec_ranked r[MHA_EXEC_MAX_RANKED];
    int n = 0;
    int rc = mha_exec_fold_mask(&p, &folded, &err);
    if (!rc)
        rc = mha_exec_model_rank(&p, folded, lim, NULL, r, MHA_EXEC_MAX_RANKED, &n, &err);
    mask_free(folded);
    if (rc) { /* e.g. an fp32 model: Eq. 1, 2 answer, the GPU kernels do not run it */
        printf("cost model: not for this problem (%s)\n", err.msg);
        return 0;
    }
    if (n == 0) {
        printf("cost model: no costs for %s in kernels/attention_cost.txt (or "
               "STOF_ATTENTION_MODEL=paper): plans take Eq. 1 and 2\n", lim->arch);
        return 0;
    }
    printf("cost model (%s, kernels/attention_cost.txt): what plans take, fastest first\n",
           lim->arch);
    for (int i = 0; i < n && i < 8; i++) {
        printf("  %s", i ? "  " : "->");
        print_setting(&r[i].cfg);
        printf("  %.1f us predicted\n", r[i].us);
    }
    return 0;
}

static int select_for_op(const graph *g, const graph_op *op, const mha_device_limits *lim) {
    const op_attention *at = &op->attr.attn;
    const graph_tensor *q = &g->tensors[op->inputs[0]];
    const graph_tensor *kv = &g->tensors[op->inputs[at->cross ? 1 : 0]];
    mha_problem p = {(int)q->shape[0], at->heads, at->head_dim, (int)q->shape[1],
                     (int)kv->shape[1], (int)stof_dtype_size(q->dtype), NULL};
    stof_error err = {0};
    mask_bsr *blocks = NULL;
    if (at->mask >= 0 && mask_format_bsr_build(g->masks[at->mask], 16, 16, &blocks, &err)) {
        fprintf(stderr, "stof: %s\n", err.msg);
        return 1;
    }
    p.blocks16 = blocks;
    mha_selection s;
    int rc = mha_select(&p, lim, &s, &err);
    mask_format_bsr_free(blocks);
    if (rc) {
        fprintf(stderr, "stof: %s\n", err.msg);
        return 1;
    }
    size_t need = mha_selection_format(&s, NULL, 0) + 1;
    char *text = malloc(need);
    if (!text)
        return 1;
    mha_selection_format(&s, text, need);
    printf("\nattention #%d %s: mask %s%s\n%s", (int)(op - g->ops), op->name,
           at->mask >= 0 ? g->masks[at->mask]->desc : "none (dense)",
           at->causal ? " (causal: folded into the mask by the kernels)" : "", text);
    free(text);
    return print_model_rank(g, op, lim);
}

/* Two attention ops with the same mask and shapes get the same answer: print
 * each distinct one once. */
static int same_problem(const graph *g, const graph_op *a, const graph_op *b) {
    return a->attr.attn.mask == b->attr.attn.mask && a->attr.attn.cross == b->attr.attn.cross &&
           a->attr.attn.heads == b->attr.attn.heads &&
           op_attention_kv_heads(&a->attr.attn) == op_attention_kv_heads(&b->attr.attn) &&
           a->attr.attn.head_dim == b->attr.attn.head_dim &&
           memcmp(g->tensors[a->inputs[0]].shape, g->tensors[b->inputs[0]].shape,
                  sizeof g->tensors[0].shape) == 0 &&
           memcmp(g->tensors[a->inputs[a->attr.attn.cross]].shape,
                  g->tensors[b->inputs[b->attr.attn.cross]].shape,
                  sizeof g->tensors[0].shape) == 0;
}

int cli_cmd_mha_select(const cli_args *a) {
    graph g;
    graph_script info;
    if (cli_load_graph(a, &g, &info))
        return 1;
    mha_device_limits lim;
    char arch[16];
    int rc = selection_limits(a, &lim, arch, sizeof arch);
    for (int i = 0; i < g.n_ops && rc == 0; i++) {
        if (g.ops[i].kind != OP_ATTENTION)
            continue;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = g.ops[j].kind == OP_ATTENTION && same_problem(&g, &g.ops[i], &g.ops[j]);
        if (!seen)
            rc = select_for_op(&g, &g.ops[i], &lim);
    }
    graph_free(&g);
    return rc;
}
