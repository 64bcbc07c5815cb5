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
};

/* Weights asked of L2 ahead of the segments that read them, in passes captured into the
 * caller's CUDA graph (exec_prefetch.c). create: nothing before sm_90 or with STOF_PREFETCH=0;
 * before: ahead of launching segment s on caller (capturing); join: after the last segment. */
int exec_prefetch_create(exec_model *m, stof_error *err);
void exec_prefetch_free(exec_model *m);
int exec_prefetch_before(exec_model *m, int s, CUstream caller, stof_error *err);
int exec_prefetch_join(exec_model *m, CUstream caller, stof_error *err);

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
/* A decode step's attention (attention_decode): its problem. */
void exec_launch_decode_problem(const graph *g, const exec_segment *s, mha_decode_problem *p);
void exec_launch_attention_problem(const graph *g, const exec_segment *s, mha_exec_problem *p,
                                   mha_exec_force *f);

/* "segment #5-#7 (gemm bias add)" into buf. */
const char *exec_segment_name(const graph *g, int first, int n, char *buf, size_t cap);

#endif
