/* Inside the executor: the launcher table (exec_launch.c) that the planner
 * (exec_plan.c) and the model (exec.c) dispatch through, and the model's
 * state. Not for other modules. */
#ifndef STOF_CORE_EXEC_IMPL_H
#define STOF_CORE_EXEC_IMPL_H

#include <cuda.h>

#include "core/exec/cublaslt/cublaslt_exec.h"
#include "core/gpu/cuda_driver.h"
#include "core/gpu/gpu_timer.h"
#include "core/exec/exec.h"
#include "core/exec/gemm/gemm_exec.h"
#include "core/exec/attention/mha_decode.h"
#include "core/exec/attention/mha_exec.h"

struct exec_ctx {
    const cuda_driver *drv;
    int ordinal;
    gemm_exec_ctx *gemm; /* gemm_epilogue, gemm_ln, gemm_chain, mi_chain, embedding */
    mha_exec_ctx *mha;   /* attention_row, attention_block */
    cublaslt_exec_ctx *lt; /* cublaslt: made by its first plan (exec_launch.c), freed
                              with the context */
};

/* The device tensors of one segment's launch, resolved once. */
typedef union exec_tensors {
    gemm_exec_gemm_tensors gemm; /* gemm_epilogue, cublaslt */
    gemm_exec_ln_tensors ln;
    gemm_exec_chain_tensors chain;
    gemm_exec_mi_tensors mi;
    gemm_exec_embed_tensors embed;
    gemm_exec_xy_tensors xy;       /* glu, rotary */
    mha_exec_tensors attn;
    mha_decode_tensors decode;
} exec_tensors;

typedef struct exec_launcher exec_launcher;
typedef struct exec_prefetch exec_prefetch;
typedef struct exec_pack exec_pack;

/* A prefill attention's store into its KV cache (op_attention.store), after the attention. */
typedef struct exec_kv_store {
    mha_decode_plan *plan;
    CUdeviceptr qkv, pad_mask, k_cache, v_cache;
    int seq;
} exec_kv_store;

typedef struct exec_seg_rt {
    const exec_launcher *launcher;
    void *kplan;          /* gemm_exec_plan, cublaslt_exec_plan or mha_exec_plan */
    int owns_kplan;       /* 0: shared with an identical segment before it */
    exec_tensors t;
    exec_kv_store *store; /* attention that fills a KV cache, else NULL */
} exec_seg_rt;

/* What a segment's binding holds besides its kernel plan (a KV-cache store), freed. */
void exec_seg_rt_release(exec_seg_rt *rt);

struct exec_model {
    exec_ctx *ctx;
    const exec_plan *plan;
    CUdeviceptr consts;   /* weights and inputs */
    const CUdeviceptr *bound; /* per tensor: a weight the caller holds on the device (0:
                                 uploaded into consts); NULL: none */
    CUdeviceptr arena;    /* activations */
    CUdeviceptr *ptr;     /* per tensor: its address, 0 when it has none */
    CUstream stream;
    CUgraph graph;
    CUgraphExec graph_exec;
    gpu_timer timer;      /* exec_model_time */
    exec_seg_rt *rt;      /* per segment */
    exec_prefetch *prefetch; /* weights asked of L2 ahead in captured passes, or NULL */
    exec_pack *pack;      /* padding-free runs (exec_pack.c), or NULL when the model has none */
    char pack_refused[1152]; /* why not (exec_pack_eligible's reason, or STOF_PACK=0) */
};

/* Padding-free runs (exec_pack.c; the idea in exec_pack.h). create: nothing unless the plan
 * is eligible and STOF_PACK is not 0. select: after the inputs are on the device (m's stream
 * idle), reads the attention_mask back and makes the packed pass for its tokens the model's
 * pass (its kernel plans and graph made the first time such a size is seen), or the padded
 * pass when packing saves nothing; off: the padded pass (a run inside the caller's capture,
 * where the mask cannot be read). active: whether the packed pass is the model's pass. */
int exec_pack_create(exec_model *m, stof_error *err);
void exec_pack_free(exec_model *m);
int exec_pack_select(exec_model *m, stof_error *err);
void exec_pack_off(exec_model *m);
int exec_pack_active(const exec_model *m);
/* The packed pass's segment s on stream st: its packed inputs first (s = 0), an attention on
 * the packed rows in place (its output's rows past the tokens zeroed first), the output
 * unpacked after the last. */
int exec_pack_launch(exec_model *m, int s, CUstream st, stof_error *err);
/* After a packed pass: the errors its kernels flagged (a bad id named by batch and position). */
int exec_pack_status(exec_model *m, stof_error *err);
/* The packed pass's CUDA graph slots (the model's own when the padded pass is active). */
void exec_pack_graph_slots(exec_model *m, CUgraph **graph_at, CUgraphExec **exec);
/* The active pass's captured graph (NULL before exec_model_capture). */
CUgraph exec_pack_captured(const exec_model *m);
/* Where the active pass leaves the model's output [B, S, ...]. */
CUdeviceptr exec_pack_output(const exec_model *m);

/* Weights asked of L2 ahead of the segments that read them, in passes captured into the
 * caller's CUDA graph (exec_prefetch.c). create: nothing before sm_90 or with STOF_PREFETCH=0;
 * before: ahead of launching segment s on caller (capturing); join: after the last segment. */
int exec_prefetch_create(exec_model *m, stof_error *err);
void exec_prefetch_free(exec_model *m);
int exec_prefetch_before(exec_model *m, int s, CUstream caller, stof_error *err);
int exec_prefetch_join(exec_model *m, CUstream caller, stof_error *err);

/* cuMemAlloc of bytes (0: none, *d = 0), its failure saying what for, how much and how much
 * the GPU has free. */
int exec_device_alloc(exec_ctx *c, CUdeviceptr *d, size_t bytes, const char *what,
                      stof_error *err);
/* Input t, an attention_mask on the device, into host (its elements) and checked: right
 * padding, or an error naming the row (m's stream idle). */
int exec_read_input_mask(exec_model *m, int t, int32_t *host, stof_error *err);

/* An earlier segment of plan p at the same place of a sequence of the same class as segment
 * s (the same kernel problem, so it may share its kernel plan), or -1. */
int exec_segment_twin(const exec_plan *p, int s);

/* How one template is run. A template without a kernel yet has only
 * `missing` (the reason); to plug one in, fill the functions of its row in
 * exec_launch.c. */
struct exec_launcher {
    const char *missing;
    /* CPU: the launcher takes the segment (op order, shapes). */
    int (*supports)(const graph *g, int first, int n, const fusion_match *m, stof_error *err);
    /* GPU: the kernel plan of segment s (defaults unless s->has_values). */
    int (*plan)(exec_model *m, const exec_segment *s, void **kplan, stof_error *err);
    void (*free_plan)(exec_model *m, void *kplan);
    /* GPU: the segment's device tensors from m->ptr. */
    int (*bind)(exec_model *m, const exec_segment *s, exec_seg_rt *rt, stof_error *err);
    int (*launch)(exec_model *m, const exec_seg_rt *rt, CUstream st, stof_error *err);
    /* After an eager run: errors the kernel flags on the device (bad ids). */
    int (*status)(exec_model *m, const exec_seg_rt *rt, stof_error *err);
    size_t (*describe)(const void *kplan, char *buf, size_t n);
    /* The template the kernel plan runs (attention: the selector's kernel). */
    fusion_template_id (*actual)(const void *kplan, fusion_template_id planned);
};

/* The row of template t (never NULL for a valid id). */
const exec_launcher *exec_launcher_get(fusion_template_id t);

/* What exec_settings.c asks of the launchers (exec_launch.c): whether t runs
 * on gemm_exec (the GEMM family and the memory-bound templates) or on the
 * attention planner; the kernel problem of segment s; for attention also
 * what the plan forces (f may be NULL). */
int exec_launch_is_gemm_family(fusion_template_id t);
int exec_launch_is_attention(fusion_template_id t);
int exec_launch_gemm_problem(const graph *g, const exec_segment *s, gemm_exec_problem *p,
                             stof_error *err);
/* The kernel plan of token-wise segment s over `rows` packed rows instead of the graph's
 * (each row reading its position from an array); its tuned values when they take that many
 * rows, else the defaults. */
int exec_launch_plan_rows(exec_model *m, const exec_segment *s, int64_t rows, void **kplan,
                          stof_error *err);
/* A decode step's attention (attention_decode): its problem. */
void exec_launch_decode_problem(const graph *g, const exec_segment *s, mha_decode_problem *p);
void exec_launch_attention_problem(const graph *g, const exec_segment *s, mha_exec_problem *p,
                                   mha_exec_force *f);

/* "segment #5-#7 (gemm bias add)" into buf. */
const char *exec_segment_name(const graph *g, int first, int n, char *buf, size_t cap);

#endif
