/* The GPU executor: a whole model run by the fusion templates' kernels.
 *
 *   exec_seq      the op sequences of a graph (layers, and the runs of ops
 *                 outside layers) and their classes: identical layers form
 *                 one class and share one scheme;
 *   exec_plan     CPU only: one scheme per sequence class cut into
 *                 segments, each given a template that has a launcher (the
 *                 first of its matches, or the caller's choice) and its
 *                 parameters; the activation buffers' lifetimes at segment
 *                 granularity and their offsets in one arena;
 *   exec_ctx      the GPU: the GEMM-family and attention executors' contexts
 *                 (module caches shared by every model made on it);
 *   exec_model    a plan made real: weights and inputs uploaded once (the
 *                 CPU reference's values, in the model dtype), the arena,
 *                 a kernel plan per segment, one stream, and after
 *                 exec_model_capture a CUDA graph of the whole forward pass;
 *   exec_bench    one segment alone on scratch tensors the caller owns,
 *                 launched and timed (the tuner measures through it).
 *
 * A plan refers to its graph and a model to its plan: both must outlive
 * what refers to them. Nothing here prints. */
#ifndef STOF_CORE_EXEC_H
#define STOF_CORE_EXEC_H

#include <stddef.h>
#include <stdint.h>

#include "core/exec/attention/mha_exec.h"
#include "core/exec/gemm/gemm_exec.h"
#include "core/base/util.h"
#include "core/gpu/cuda_driver.h"
#include "core/gpu/gpu_timer.h"
#include "core/graph/graph.h"
#include "core/io/weights.h"
#include "fusion/match.h"
#include "fusion/scheme.h"
#include "stof.h"

/* ---- sequences (CPU) ------------------------------------------------------------ */

/* A layer, or a run of ops outside layers, with its class: the sequences
 * of a class share one scheme (fusion_sequences derives them). */
typedef fusion_seq exec_seq;

/* "layer 3" or "ops #12-#13 outside layers", for messages. */
const char *exec_seq_name(const exec_seq *s, char *buf, size_t n);

/* ---- templates that can run (CPU) ------------------------------------------------ */

/* 1 when template t has a launcher (a kernel and the code to start it). */
int exec_template_implemented(fusion_template_id t);

/* Whether template t runs the segment of graph ops first .. first + n - 1
 * matched as m: it has a launcher, the launcher takes the segment's op order
 * and its shapes (the kernels' own validation). STOF_ERR_UNSUPPORTED naming
 * the segment and the reason (the kernel's own validation) otherwise. */
int exec_segment_supports(const graph *g, int first, int n, const fusion_match *m,
                          fusion_template_id t, stof_error *err);

/* The first of m's templates that runs the segment; STOF_ERR_UNSUPPORTED
 * naming the segment and why each matching template cannot. */
int exec_segment_template(const graph *g, int first, int n, const fusion_match *m,
                          fusion_template_id *t, stof_error *err);

/* s is valid over the sequence (fusion_scheme_validate) and every segment
 * has a template that runs it. */
int exec_scheme_check(const graph *g, const exec_seq *seq, const fusion_scheme *s,
                      stof_error *err);

/* The greedy rule: a GEMM takes the bias, activation and residual add that
 * follow it, a run of bias/add/activation/norm ops is one chain, attention
 * and embedding stay alone; a segment grows only while the result still
 * runs on an implemented template. Canonical form. */
int exec_default_scheme(const graph *g, const exec_seq *seq, fusion_scheme *s, stof_error *err);
/* schemes[cls] for each class of layers among seqs[0..n-1] that has none yet (n == 0): its
 * default scheme. Ops outside the layers keep none (they run unfused), but where they run one
 * row (a decode step at batch 1: the final norm joins the head's gemv as its prologue, 3 us a
 * step on an H200). */
int exec_default_schemes(const graph *g, const exec_seq *seqs, int n, fusion_scheme *schemes,
                         stof_error *err);

/* ---- plans (CPU) --------------------------------------------------------------------- */

/* The dtype the model runs in (its output's): f16 or bf16, and every float
 * tensor in it; STOF_ERR_UNSUPPORTED naming the model's or a tensor's
 * dtype otherwise. */
int exec_model_dtype(const graph *g, stof_dtype *dtype, stof_error *err);

/* Activation buffers start at multiples of this many bytes. */
#define EXEC_ALIGN 256

/* The bytes tensor t takes in device memory: its own, up to a multiple of EXEC_ALIGN. */
static inline size_t exec_tensor_span(const graph_tensor *t) {
    return util_align_up(graph_tensor_bytes(t), EXEC_ALIGN);
}

typedef struct exec_segment {
    int seq;        /* index into the plan's sequences */
    int index;      /* position among the segments of its sequence */
    int first, n;   /* graph ops first .. first + n - 1 */
    fusion_match match;
    fusion_template_id tmpl; /* the template it runs on */
    int auto_attention; /* attention by the selector: row- or block-wise is decided
                           when the model is made (tmpl is its first candidate) */
    int has_values;     /* 0: defaults (gemm_exec_default_values, the selector's) */
    int values[FUSION_MAX_PARAMS];
    int out;            /* tensor: the segment's result */
    int pre_norm;       /* tensor the template writes besides (store_pre_norm), or -1 */
} exec_segment;

/* The segment of graph ops first .. first + n - 1 matched as m: its ops,
 * match, result and stored pre-norm tensor (seq, index, template and
 * values left zero). */
void exec_segment_init(const graph *g, int first, int n, const fusion_match *m,
                       exec_segment *s);
/* The same, the ops matched here (fusion_match_segment). */
int exec_segment_at(const graph *g, int first, int n, exec_segment *s, stof_error *err);

/* A tensor that needs device memory while segments first..last run. */
typedef struct exec_buffer {
    int tensor;       /* -1 in tests of exec_arena_assign */
    int first, last;  /* segment that writes it, last segment that reads it */
    size_t bytes;     /* a multiple of EXEC_ALIGN */
    size_t offset;    /* in the activation arena */
} exec_buffer;

typedef struct exec_plan {
    const graph *g;          /* borrowed */
    stof_dtype dtype;        /* of every activation and float weight */
    int n_seqs;
    exec_seq *seqs;
    fusion_scheme *schemes;  /* per sequence: its class's */
    int n_segs;
    exec_segment *segs;      /* in execution order */
    int n_bufs;
    exec_buffer *bufs;
    int *buf_of;             /* per tensor: index into bufs, -1 for weights, inputs and
                                intermediates kept inside a fused segment */
    size_t arena_bytes;      /* peak activation memory: the arena's size */
    size_t live_bound;       /* the most bytes live at one segment: no placement of
                                these buffers can need less */
    size_t weight_bytes, input_bytes; /* uploaded once */
} exec_plan;

/* Plans g with schemes[seqs[i].cls] for sequence i (one scheme per class:
 * entries of other sequences are not read); schemes NULL, or a scheme with
 * n == 0, runs that class unfused. Every scheme is validated and every
 * segment given a template (exec_segment_template); errors name the
 * sequence. Model dtypes other than f16 and bf16, or a float tensor in
 * another dtype, are STOF_ERR_UNSUPPORTED. */
int exec_plan_create(const graph *g, const fusion_scheme *schemes, exec_plan **out,
                     stof_error *err);
void exec_plan_free(exec_plan *p);
/* The default scheme of every class of layers (exec_default_scheme, as `stof run` without
 * --scheme), into a new plan. */
int exec_plan_default(const graph *g, exec_plan **out, stof_error *err);

/* The executor plan of a plan pl over g (which must fit it:
 * plan_check_fits): each sequence class's scheme, each segment's template
 * and parameters. */
struct plan;
int exec_plan_from_plan(const struct plan *pl, const graph *g, exec_plan **out,
                        stof_error *err);
/* The same for a graph g whose ops are a prefix of the plan's graph at any shape (the prompts'
 * prefill pass of a decoder: the model up to its last attention): each class of g's layers
 * takes the scheme of the plan's sequence that starts at the same op with as many ops, the
 * default scheme where none does (a layer the prefix cuts); with kernels (g at the plan's own
 * batch and length), those sequences' segments take the plan's templates and parameters too.
 * *n_taken: the classes that took the plan's scheme. A scheme that does not fit g is an
 * error, as in exec_plan_create. */
int exec_plan_from_plan_prefix(const struct plan *pl, const graph *g, int kernels,
                               exec_plan **out, int *n_taken, stof_error *err);

/* Runs segment seg (and the segment at the same position of every sequence
 * of its class: they are identical) on template t with values (one per
 * template parameter, each in its space; NULL for the defaults). t must be
 * one of the segment's matches and run it. Attention templates force the
 * row- or block-wise kernel. Feasibility on the device (shared memory) is
 * checked when the model is made. */
int exec_plan_set_choice(exec_plan *p, int seg, fusion_template_id t, const int *values,
                         stof_error *err);

/* ---- settings and kernels without the GPU (the tuner, offline plans) -------------------- */

struct mha_device_limits;
struct nvrtc_cache;

/* A template and one value per parameter, in the template's order. */
typedef struct exec_choice {
    fusion_template_id tmpl;
    int values[FUSION_MAX_PARAMS];
} exec_choice;

/* The settings segment s runs with when given none, for a device with
 * limits lim: the GEMM family's default values (one choice; cublaslt ALGO 0,
 * the heuristic's favourite); attention the selector's choice (row- or
 * block-wise), and with measure > 0 after it the candidates a measured plan
 * times (mha_exec_candidates), those that the templates' parameter spaces
 * hold. At most cap into out. */
int exec_segment_candidates(const graph *g, const exec_segment *s,
                            const struct mha_device_limits *lim, int measure, exec_choice *out,
                            int cap, int *n, stof_error *err);

/* Compiles segment s's kernel (s->tmpl, s->values when has_values, else the
 * defaults) for lim->arch into cache, as exec_model_create would: for
 * block-wise attention both the plain and the split build. Templates run by
 * a vendor library compile nothing. */
int exec_segment_compile(const graph *g, const exec_segment *s,
                         const struct mha_device_limits *lim, struct nvrtc_cache *cache,
                         stof_error *err);

/* One NVRTC build of a segment's kernel plan and the context whose cache
 * it belongs in. The request points into the struct: keep it in place. */
typedef struct exec_build {
    int attention; /* 1: the attention context's cache (exec_ctx.mha), else the GEMM
                      family's (exec_ctx.gemm) */
    union {
        gemm_exec_request gemm;
        mha_exec_request mha;
    } r;
} exec_build;

#define EXEC_MAX_BUILDS 3

const nvrtc_request *exec_build_request(const exec_build *b);

typedef enum exec_builds_mode {
    /* What the kernel plan of the segment compiles on a device with these
     * limits: a setting the plan would refuse (the template's constraints,
     * shared memory) is STOF_ERR_UNSUPPORTED, and block-wise attention
     * builds its split kernel only when the plan cuts rows. */
    EXEC_BUILDS_PLANNED = 0,
    /* Every build a model may need on some device of the architecture, no
     * feasibility check: block-wise attention both builds. (Either mode adds the global
     * tokens' kernels of an attention that takes them.) */
    EXEC_BUILDS_ALL
} exec_builds_mode;

/* The builds of segment s (s->tmpl, s->values when has_values, else the
 * defaults; attention by the selector when auto_attention) for lim: at
 * most EXEC_MAX_BUILDS into out, *n of them (0 for a template run by a
 * vendor library). CPU only. */
int exec_segment_builds(const graph *g, const exec_segment *s, const struct mha_device_limits *lim,
                        exec_builds_mode mode, exec_build *out, int *n, stof_error *err);

/* Offsets for buffers whose lifetimes overlap (first..last, inclusive) so
 * that no two overlapping ones share bytes: greedy by size, each at the
 * lowest-waste gap (best fit) among those already placed. *arena gets the
 * extent, *bound the largest sum of bytes live at one point. */
void exec_arena_assign(exec_buffer *b, int n, size_t *arena, size_t *bound);

/* ---- the GPU ------------------------------------------------------------------------- */

typedef struct exec_ctx exec_ctx;

/* STOF_ERR_NO_DEVICE (with the driver's reason) when there is no GPU. */
int exec_ctx_create(int ordinal, exec_ctx **out, stof_error *err);
void exec_ctx_free(exec_ctx *c);
const stof_device_info *exec_ctx_device(const exec_ctx *c);
const char *exec_ctx_arch(const exec_ctx *c);
/* The CUDA driver the context's GPU is reached through, and its CUDA
 * context made current on the calling thread (for memory the caller
 * manages itself: the tuner's scratch tensors). */
const cuda_driver *exec_ctx_driver(const exec_ctx *c);
int exec_ctx_make_current(exec_ctx *c, stof_error *err);
/* The device's limits the kernel plans are made for. */
void exec_ctx_limits(const exec_ctx *c, mha_device_limits *lim);
/* The NVRTC cache build b goes into (the attention or the GEMM family's). */
nvrtc_cache *exec_ctx_build_cache(exec_ctx *c, const exec_build *b);
/* Both NVRTC caches of the context, for their counters. */
#define EXEC_CTX_CACHES 2
void exec_ctx_caches(const exec_ctx *c, const nvrtc_cache *out[EXEC_CTX_CACHES]);
/* The first problem the context's kernel caches met on disk (NULL when
 * none) and, in *count, how many (nvrtc_cache_warning over both). */
const char *exec_ctx_cache_warning(const exec_ctx *c, int *count);

/* ---- one segment alone on scratch tensors (the tuner's measurements) --------------------- */

/* Segment s planned (its kernel compiled, or found compiled) and bound to
 * n_copies sets of device tensors that the caller owns: ptr holds n_copies
 * tables of g->n_tensors addresses, each with an address for every tensor
 * the segment reads or writes; both must outlive the bench. Launches go on
 * stream st, rotating over the copies (launch i runs on copy i % n_copies)
 * so that a kernel's inputs are not all in L2 from the launch before. */
typedef struct exec_bench exec_bench;

/* STOF_ERR_UNSUPPORTED when s's template has no launcher; the kernel plan's
 * own errors otherwise. On failure nothing is left. */
int exec_bench_create(exec_ctx *c, const graph *g, const exec_segment *s, const CUdeviceptr *ptr,
                      int n_copies, CUstream st, exec_bench **out, stof_error *err);
void exec_bench_free(exec_bench *b);
/* One launch on copy 0 after its outputs (the result, the stored pre-norm
 * values) were set to NaN, so that a kernel that writes nothing cannot pass
 * on an earlier one's values; waits for it and checks what the kernel flags
 * on the device. The output is then in copy 0's tensors. */
int exec_bench_check_run(exec_bench *b, stof_error *err);
/* n launches, not waited for. */
int exec_bench_launch(exec_bench *b, int n, stof_error *err);
/* Milliseconds of n launches timed once by t (gpu_timer_once). */
int exec_bench_time_once(exec_bench *b, gpu_timer *t, int n, double *ms, stof_error *err);
/* The n launches captured as one CUDA graph (back to back on the GPU,
 * without the host's launch rate in the way; launched eagerly when the
 * capture fails), one untimed run, then the median of reps runs timed by t
 * (gpu_timer_median): milliseconds per run of n launches. */
int exec_bench_time(exec_bench *b, gpu_timer *t, int n, int reps, double *median_ms,
                    stof_error *err);

typedef struct exec_model exec_model;

/* Checks src against the graph (weights_source_check) before anything is
 * allocated, then allocates and uploads the weights and inputs (their
 * values from src, as the CPU reference's; made on a pool of threads that
 * lives for the upload, a group of at most 64 MiB staged on the host at a
 * time), allocates the arena, plans every segment's kernel
 * (compiling through the NVRTC cache; identical segments of one class share
 * one kernel plan). STOF_ERR_DEVICE_OOM names the bytes asked for. On
 * failure nothing is left allocated. */
int exec_model_create(exec_ctx *c, const exec_plan *p, const weights_source *src,
                      exec_model **out, stof_error *err);
/* The same with some weights already on the device: bound[t] (per graph
 * tensor, 0: none) is used in place, not copied (16-byte aligned, the
 * tensor's dtype and size; the caller keeps it alive while m runs). */
int exec_model_create_bound(exec_ctx *c, const exec_plan *p, const weights_source *src,
                            const CUdeviceptr *bound, exec_model **out, stof_error *err);
void exec_model_free(exec_model *m);

/* One forward pass, kernel by kernel on the model's stream; waits for it and
 * checks the embeddings' token ids. */
int exec_model_run(exec_model *m, stof_error *err);
/* Captures one forward pass into a CUDA graph (once; later calls keep it). */
int exec_model_capture(exec_model *m, stof_error *err);
/* The captured graph's dependencies, and how many of them are programmatic
 * (a kernel launched as a programmatic dependent launch may start before
 * the one it depends on has finished; exec_model_capture first). */
typedef struct exec_graph_edges {
    size_t edges, programmatic;
} exec_graph_edges;
int exec_model_graph_edges(const exec_model *m, exec_graph_edges *out, stof_error *err);
/* Replays the captured graph and waits for it. */
int exec_model_replay(exec_model *m, stof_error *err);
/* Median over reps runs (eager launches, or graph replays when use_graph)
 * of the time between two events around one forward pass, after one
 * warm-up. */
int exec_model_time(exec_model *m, int use_graph, int reps, double *median_ms, stof_error *err);
/* Where the forward pass's time goes: each segment's time in place, the
 * median over reps replays (after one warm-up) of the forward pass captured
 * as a CUDA graph with an event node before every segment and one after
 * the last (seg_ms: plan->n_segs values, in execution order). Unlike a
 * segment timed alone, it runs on the inputs the previous segments just
 * wrote, with the L2 and clocks the pass leaves, and without host launch
 * costs. The event nodes cost the programmatic overlap of neighbours and a
 * few microseconds each, so the segments add up to more than the graph's
 * time: about the same at large shapes, far more at (1, 128). */
int exec_model_profile(exec_model *m, int reps, double *seg_ms, stof_error *err);
/* Makes a model of p (weights and inputs seeded with seed), runs it once
 * (its output into `output` when not NULL: graph_tensor_numel(output)
 * floats), and takes the median of reps runs eagerly (eager_ms, may be
 * NULL) and by CUDA graph replay (graph_ms, may be NULL). */
int exec_model_measure(exec_ctx *c, const exec_plan *p, uint64_t seed, int reps,
                       double *eager_ms, double *graph_ms, float *output, stof_error *err);
/* One forward pass on the caller's device tensors: inputs[i] (device
 * pointers in each input's dtype, contiguous) copied into the model's own
 * input buffers, the captured forward pass replayed, the output copied to
 * out (the model's dtype), all ordered after the work already on `caller`
 * and before what is queued there next (events, no host wait in between).
 * With out 0 the output is not copied. An input with no pointer (0) must be
 * one that can be left out (an attention_mask: then all ones, no padding).
 * Returns once the pass is done
 * and its inputs checked (a token id outside the vocabulary, an
 * attention_mask that is not right-padded: errors, and out is not written).
 * When `caller` is capturing (the caller's CUDA graph), the copies and the
 * kernels are captured on it instead, nothing waits, and the bad-id check
 * is left to the next run outside a capture. */
typedef struct exec_io {
    int tensor;       /* a graph input's index */
    CUdeviceptr data; /* 0: left out */
} exec_io;
int exec_model_run_io(exec_model *m, const exec_io *in, int n, CUdeviceptr out, CUstream caller,
                      stof_error *err);
/* Whether the model's pass is padding-free now (core/exec/exec_pack.h): 1 with the batch's
 * real tokens and the packed rows they run in (a bucket's multiple, under batch x seq), 0
 * when the padded pass runs (no padding to save, a model that cannot pack, STOF_PACK=0). */
int exec_model_packing(const exec_model *m, int64_t *tokens, int64_t *rows);
/* Why a padded batch runs the padded pass ("" when it packs): no attention_mask input, a
 * segment that is not token-wise, STOF_PACK=0; or why the last batch's packed pass could not
 * be made (out of GPU memory: that batch ran padded). */
const char *exec_model_pack_refused(const exec_model *m);

/* Where the tokens chosen for rows of logits go (exec_argmax_rows, exec_sample_rows): row r's
 * to out[r] (int32 [rows]). live (int32 [rows], may be 0): a row whose entry is negative (an
 * ended sequence) is not chosen for, its out left as it was. positions (int32 [rows], may be
 * 0; needs live): a decode step's bookkeeping, so that the next step needs no inputs copied in
 * and its tokens no copy out. A chosen row's live entry p (its position) becomes p + 1 in live
 * and positions alike, and host (may be 0; needs positions and a host_stride of at least 1:
 * int32 [rows, host_stride] of page-locked host memory the device can write) gets the token
 * at [r, p] where p < host_stride. */
typedef struct exec_tokens {
    CUdeviceptr out, live, positions, host;
    int64_t host_stride;
} exec_tokens;

/* Greedy tokens: row r's (int32) is the index of the largest of row r of logits [rows, vocab]
 * (the first of equal ones; NaNs never; 0 for a row of NaNs), gone where `to` says, launched
 * on stream st (captured when st is capturing). scratch: exec_argmax_scratch_bytes(rows)
 * bytes of zeros on the device, which each launch leaves as zeros, to spread a row over
 * several blocks (0: a block a row); launches sharing it must not overlap. */
size_t exec_argmax_scratch_bytes(int rows);
int exec_argmax_rows(exec_ctx *c, CUdeviceptr logits, stof_dtype dtype, int rows, int64_t vocab,
                     CUdeviceptr scratch, const exec_tokens *to, CUstream st, stof_error *err);

/* What a sampled token is drawn from (gen_options' fields of the same names): logits /
 * temperature (> 0), the top_k first in rank order (0: every token), of those the fewest whose
 * probability reaches top_p (1: all of them). */
typedef struct exec_sampling {
    float temperature;
    int top_k;
    float top_p;
} exec_sampling;

/* Sampled tokens: row r's (int32) drawn from row r of logits [rows, vocab] with the uniform
 * number u[r] (fp64, in [0, 1)) as the host's gen_sample draws it, up to masses in fixed point
 * (a probability relative to the row's largest, times exec_sample_mass_unit(vocab), rounded: a token
 * below half a unit has none), gone where `to` says. The kept tokens are walked in rank order,
 * larger logits first and the smaller index among equal ones. prob: [rows, vocab] fp32
 * scratch. Launched on st (captured when st is capturing). */
int exec_sample_rows(exec_ctx *c, CUdeviceptr logits, stof_dtype dtype, int rows, int64_t vocab,
                     const exec_sampling *how, CUdeviceptr u, CUdeviceptr prob,
                     const exec_tokens *to, CUstream st, stof_error *err);
/* The fixed-point unit of a probability in exec_sample_rows: the largest power of two that
 * keeps vocab of them within 62 bits (2^46 at 50257 tokens). */
float exec_sample_mass_unit(int64_t vocab);
/* Waits for the model's stream and reads what its kernels flagged (bad token or position
 * ids): the check exec_model_run_io leaves to a later call when it runs inside a capture. */
int exec_model_status(exec_model *m, stof_error *err);

/* The device address of tensor t (a weight, an input or an activation in the arena; 0 when
 * it has none): for binding it into another model (exec_model_create_bound). */
CUdeviceptr exec_model_tensor(const exec_model *m, int t);

/* Copies the output back as fp32: graph_tensor_numel(output) floats. */
int exec_model_output(exec_model *m, float *out, stof_error *err);

/* The template segment seg actually runs on (the selector's attention
 * kernel) and one line on its kernel plan. */
fusion_template_id exec_model_template(const exec_model *m, int seg);
size_t exec_model_describe(const exec_model *m, int seg, char *buf, size_t n);

/* ---- checking against the CPU reference (CPU) ---------------------------------------- */

/* The CPU reference's output with the values of src (ref_execute), malloc'd. */
int exec_reference(const graph *g, const weights_source *src, float **out, stof_error *err);

typedef struct exec_diff {
    double rel_error;  /* ||got - ref|| / ||ref|| (||got - ref|| when ref is 0) */
    double max_abs;    /* largest |got - ref| over finite values */
    int64_t n_nonfinite; /* NaN or infinity in got */
} exec_diff;

void exec_compare(const float *got, const float *ref, int64_t n, exec_diff *d);

#endif
