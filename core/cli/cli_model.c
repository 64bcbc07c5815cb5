/* `stof info`, `stof graph`, `stof mask`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cli/cli.h"
#include "core/exec/attention/mha_exec.h"
#include "core/gpu/device.h"
#include "ops/mask.h"
#include "ops/ops.h"

int cli_cmd_info(const cli_args *a) {
    stof_error err = {0};
    int n = 0;
    printf("stof %s (commit %s)\n", stof_version(), stof_build_commit());
    if (device_count(&n, &err)) {
        printf("GPU: none. %s.\n", err.msg);
        printf("Without a GPU, stof builds and checks graphs, runs the CPU reference and "
               "prints mask statistics; GPU runs and timings are skipped.\n");
        return 0;
    }
    for (int i = 0; i < n; i++) {
        stof_device_info d;
        if (device_query(i, &d, &err)) {
            fprintf(stderr, "stof: GPU %d: %s\n", i, err.msg);
            return 1;
        }
        char arch[16];
        device_arch_name(&d, arch, sizeof arch);
        printf("GPU %d: %s\n", i, d.name);
        printf("  compute capability   %d.%d (%s)\n", d.cc_major, d.cc_minor, arch);
        printf("  multiprocessors      %d\n", d.sm_count);
        printf("  shared memory / SM   %d KiB (%d KiB per block opt-in)\n", d.smem_per_sm / 1024,
               d.smem_per_block_optin / 1024);
        printf("  max warps / SM       %d\n", d.max_warps_per_sm);
        printf("  registers / SM       %d\n", d.regs_per_sm);
        printf("  L2 cache             %d MiB\n", d.l2_bytes >> 20);
        printf("  memory               %.1f GiB\n", (double)d.total_mem / (1 << 30));
    }
    return 0;
}

static void print_op(const graph *g, int i) {
    const graph_op *op = &g->ops[i];
    const op_desc *d = op_describe(op->kind);
    char in[160] = "", shape[64];
    size_t used = 0;
    for (int k = 0; k < op->n_inputs && used < sizeof in; k++)
        used += (size_t)snprintf(in + used, sizeof in - used, "%s%s", k ? " " : "",
                                 graph_shape_str(&g->tensors[op->inputs[k]], shape, sizeof shape));
    double flops, bytes;
    op_cost(g, op, &flops, &bytes);
    printf("#%-4d %-10s %-3s %-44.44s %-40s -> %-16s %10.3f %9.2f\n", i, d->name,
           op_class_name(d->cls), op->name, in,
           graph_shape_str(&g->tensors[op->output], shape, sizeof shape), flops * 1e-9,
           bytes / 1e6);
}

static void print_masks(const graph *g) {
    for (int i = 0; i < g->n_masks; i++) {
        mask_stats st;
        mask_compute_stats(g->masks[i], 0, 0, &st);
        printf("mask %d: %s  [%d x %d]%s  density %.2f%% (sparsity %.2f%%)\n", i,
               g->masks[i]->desc, g->masks[i]->q_len, g->masks[i]->k_len,
               g->masks[i]->batch > 1 ? "  per batch" : "  shared by all batches",
               100 * st.density, 100 * (1 - st.density));
    }
}

int cli_cmd_graph(const cli_args *a) {
    graph g;
    graph_script info;
    if (cli_load_graph(a, &g, &info))
        return 1;
    char shape[64];
    const graph_tensor *out = &g.tensors[g.output];
    printf("model %s (%s): %d layers, %d ops, %d tensors; output %s %s %s\n", g.name, info.name,
           g.n_layers, g.n_ops, g.n_tensors, out->name, graph_shape_str(out, shape, sizeof shape),
           stof_dtype_name(out->dtype));
    if (info.model_dir[0])
        printf("model directory %s, script %s\n", info.model_dir, info.path);
    cli_print_masks(&g);
    printf("%-5s %-10s %-3s %-44s %-40s    %-16s %10s %9s\n", "#", "kind", "cls", "name",
           "inputs", "output", "GFLOP", "MB");
    double total_flops[2] = {0, 0}, total_bytes = 0, weight_bytes = 0;
    for (int i = 0; i < g.n_ops; i++) {
        print_op(&g, i);
        double f, b;
        op_cost(&g, &g.ops[i], &f, &b);
        total_flops[op_describe(g.ops[i].kind)->cls] += f;
        total_bytes += b;
    }
    for (int t = 0; t < g.n_tensors; t++)
        if (g.tensors[t].role == GRAPH_WEIGHT)
            weight_bytes += (double)graph_tensor_bytes(&g.tensors[t]);
    printf("total: %.3f GFLOP (CI %.3f, MI %.3f), %.1f MB moved op by op, weights %.1f MB\n",
           (total_flops[0] + total_flops[1]) * 1e-9, total_flops[OP_CLASS_CI] * 1e-9,
           total_flops[OP_CLASS_MI] * 1e-9, total_bytes / 1e6, weight_bytes / 1e6);
    print_masks(&g);
    graph_free(&g);
    return 0;
}

static void print_block_stats(const mask *m, int bm, int bn) {
    mask_stats st;
    mask_compute_stats(m, bm, bn, &st);
    printf("  blocks %3dx%-3d  full %8lld  partial %8lld  empty %8lld\n", bm, bn,
           (long long)st.full_blocks, (long long)st.partial_blocks, (long long)st.empty_blocks);
}

/* Whether an attention op that uses mask id (-1: no mask) is causal too. */
static int used_causally(const graph *g, int id) {
    for (int i = 0; i < g->n_ops; i++)
        if (g->ops[i].kind == OP_ATTENTION && g->ops[i].attr.attn.mask == id &&
            g->ops[i].attr.attn.causal)
            return 1;
    return 0;
}

/* What a causal attention over m sees (m NULL: every pair), for the
 * picture: the executor's own fold of the causal rule into a mask. */
static int causal_picture(const mask *m, int q_len, int k_len, mask **out, stof_error *err) {
    mha_exec_problem p = {.mask = m, .causal = 1, .batch = m ? m->batch : 1, .heads = 1,
                          .head_dim = 64, .q_len = q_len, .k_len = k_len, .dtype = STOF_F16,
                          .scale = 1.0f};
    return mha_exec_fold_mask(&p, out, err);
}

/* A dense causal model (GPT-2 without a mask): its picture is the causal one. */
static int causal_only(const cli_args *a, const graph *g) {
    for (int i = 0; i < g->n_ops; i++) {
        const graph_op *op = &g->ops[i];
        if (op->kind != OP_ATTENTION || !op->attr.attn.causal)
            continue;
        const graph_tensor *out = &g->tensors[op->output];
        const graph_tensor *kv = &g->tensors[op->inputs[op->attr.attn.cross ? 1 : 0]];
        printf("model %s uses no attention mask: causal attention (%lld x %lld)\n", g->name,
               (long long)out->shape[1], (long long)kv->shape[1]);
        if (!a->png)
            return 0;
        mask *c = NULL;
        stof_error err = {0};
        int rc = causal_picture(NULL, (int)out->shape[1], (int)kv->shape[1], &c, &err);
        if (!rc)
            rc = mask_write_png(c, 0, a->png, a->png_px, a->block, &err);
        mask_free(c);
        if (rc) {
            fprintf(stderr, "stof: %s\n", err.msg);
            return 1;
        }
        printf("wrote %s (causal)\n", a->png);
        return 0;
    }
    return -1;
}

int cli_cmd_mask(const cli_args *a) {
    graph g;
    graph_script info;
    if (cli_load_graph(a, &g, &info))
        return 1;
    if (g.n_masks == 0) {
        int rc = causal_only(a, &g);
        if (rc < 0) {
            printf("model %s uses no attention mask (dense attention)\n", g.name);
            rc = a->png ? 1 : 0;
        }
        graph_free(&g);
        return rc;
    }
    int rc = 0;
    for (int i = 0; i < g.n_masks; i++) {
        const mask *m = g.masks[i];
        mask_stats st;
        mask_compute_stats(m, 0, 0, &st);
        printf("mask %d: %s\n  size %d x %d, %s, %lld allowed pairs, density %.3f%%, sparsity "
               "%.3f%%, %lld fully masked rows\n",
               i, m->desc, m->q_len, m->k_len,
               m->batch > 1 ? "one per batch" : "shared by all batches", (long long)st.nnz,
               100 * st.density, 100 * (1 - st.density), (long long)st.empty_rows);
        print_block_stats(m, 16, 16);
        if (a->block != 16)
            print_block_stats(m, a->block, a->block);
    }
    if (a->png) {
        if (a->mask_index >= g.n_masks) {
            fprintf(stderr, "stof: --mask-index %d: the model has %d masks\n", a->mask_index,
                    g.n_masks);
            rc = 1;
        } else {
            stof_error err = {0};
            const mask *m = g.masks[a->mask_index];
            mask *causal = NULL;
            int as_causal = used_causally(&g, a->mask_index);
            if (as_causal && causal_picture(m, m->q_len, m->k_len, &causal, &err) == STOF_OK)
                m = causal;
            if ((as_causal && !causal) || mask_write_png(m, 0, a->png, a->png_px, a->block, &err)) {
                fprintf(stderr, "stof: %s\n", err.msg);
                rc = 1;
            } else {
                printf("wrote %s (mask %d%s, batch 0, grid every %d)\n", a->png, a->mask_index,
                       as_causal ? " with the causal rule" : "", a->block);
            }
            mask_free(causal);
        }
    }
    graph_free(&g);
    return rc;
}
