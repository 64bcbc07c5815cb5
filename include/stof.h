/* stof: sparse transformers, fused and tuned for NVIDIA GPUs.
 *
 * The public C API. Every handle is opaque; every function that can fail
 * returns a stof_status and leaves a human-readable message behind
 * stof_last_error() (per thread). */
#ifndef STOF_H
#define STOF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What libstof.so exports: these functions, and nothing else of the
 * library (it is built with hidden visibility). */
#if defined(__GNUC__) || defined(__clang__)
#define STOF_API __attribute__((visibility("default")))
#else
#define STOF_API
#endif

#define STOF_VERSION_MAJOR 0
#define STOF_VERSION_MINOR 1
#define STOF_VERSION_PATCH 0
#define STOF_VERSION_STRING "0.1.0"

typedef enum stof_status {
    STOF_OK = 0,
    STOF_ERR_INVALID = -1,     /* bad argument or value */
    STOF_ERR_NOMEM = -2,       /* host allocation failed */
    STOF_ERR_IO = -3,          /* file could not be read or written */
    STOF_ERR_SCRIPT = -4,      /* a Lua model script failed */
    STOF_ERR_SHAPE = -5,       /* shapes do not fit together */
    STOF_ERR_UNSUPPORTED = -6, /* valid, but not something stof can run */
    STOF_ERR_NO_DEVICE = -7,   /* no usable GPU */
    STOF_ERR_CUDA = -8,        /* the CUDA driver reported an error */
    STOF_ERR_COMPILE = -9,     /* NVRTC could not compile a kernel */
    STOF_ERR_DEVICE_OOM = -10, /* out of GPU memory */
    STOF_ERR_FORMAT = -11,     /* malformed file (plan, weights) */
    STOF_ERR_MISMATCH = -12,   /* plan made for another device or script */
    STOF_ERR_INTERNAL = -13
} stof_status;

STOF_API const char *stof_status_name(int status);

/* The error record the library fills. Library entry points that take one
 * never print; the public wrappers below keep the last one per thread. */
typedef struct stof_error {
    int code;
    char msg[1024];
} stof_error;

STOF_API const char *stof_last_error(void);
STOF_API const char *stof_version(void);
STOF_API const char *stof_build_commit(void);

typedef enum stof_dtype {
    STOF_F32 = 0,
    STOF_F16 = 1,
    STOF_BF16 = 2,
    STOF_I32 = 3
} stof_dtype;

STOF_API const char *stof_dtype_name(stof_dtype t);
STOF_API size_t stof_dtype_size(stof_dtype t);

/* ---- models: open, inspect, run on the CPU or the GPU, tune ---------------- */

typedef struct stof_model stof_model;

/* Opens a model: PATH is a Lua model script, or a Hugging Face model
 * directory (config.json + model.safetensors or sharded safetensors with
 * their index: the shipped script for its model_type builds it, its
 * weights become the model's). Parameters "key=value" as `stof run --set`
 * takes them: batch, seq, dtype, mask, ... (params may be NULL when n == 0).
 * A checkpoint that does not fit is an error naming what is missing. */
STOF_API int stof_model_open(const char *path, const char *const *params, int n_params,
                             stof_model **out);
/* The same (the older name). */
STOF_API int stof_model_load(const char *script, const char *const *params, int n_params,
                             stof_model **out);
STOF_API void stof_model_free(stof_model *m);
STOF_API int stof_model_num_ops(const stof_model *m);
STOF_API int stof_model_num_tensors(const stof_model *m);
/* The path of the script that built the model. */
STOF_API const char *stof_model_script(const stof_model *m);

#define STOF_MAX_DIMS 8
typedef struct stof_tensor_info {
    char name[128];
    stof_dtype dtype;
    int ndim;
    int64_t shape[STOF_MAX_DIMS];
    int optional; /* an input a run may leave out: an attention_mask (then no padding) */
} stof_tensor_info;

/* The model's inputs (0 .. stof_model_num_inputs - 1) and its output. */
STOF_API int stof_model_num_inputs(const stof_model *m);
STOF_API int stof_model_input_info(const stof_model *m, int i, stof_tensor_info *info);
STOF_API int stof_model_output_info(const stof_model *m, stof_tensor_info *info);

/* Weights from a safetensors file instead, checked against the model first;
 * the model directory's by default. NULL drops the file: a script's model
 * then draws its weights from the seed, a model directory's asks for
 * weights again (or stof_model_set_seed for random ones). */
STOF_API int stof_model_set_weights(stof_model *m, const char *path);
/* Weights straight from host memory the caller owns (a live framework's
 * tensors: no file written): names as a checkpoint has them (a prefix such
 * as "bert." is found by itself), dtype "F32", "F16" or "BF16". Checked
 * against the model first. The memory is read again by every CPU run and
 * by the upload to the GPU: keep it alive and unchanged until the model is
 * freed or its weights are set again. */
typedef struct stof_weight {
    const char *name;
    const char *dtype;
    int ndim;
    int64_t shape[STOF_MAX_DIMS];
    const void *data;
} stof_weight;
STOF_API int stof_model_set_weights_memory(stof_model *m, const stof_weight *weights, int n);
/* The seed of whatever no file gives (1 by default). */
STOF_API void stof_model_set_seed(stof_model *m, uint64_t seed);

/* An input of a run by name: host memory for stof_model_run_cpu (int32 for
 * int32 inputs, float32 for the others), device memory in the input's own
 * dtype for stof_model_run. Contiguous, in the shape stof_model_input_info
 * gives. An input that is optional may be left out. */
typedef struct stof_tensor_ref {
    const char *name;
    const void *data;
} stof_tensor_ref;

/* Weights already on the GPU, used in place (no copy): every weight the
 * model reads from a checkpoint, under the model's own names and layout
 * (stof_model_num_weights / stof_model_weight_info: a fused QKV projection
 * is one tensor; GPT-2's Conv1D weights, [in, out] in its checkpoint, are
 * [out, in]), in its dtype, contiguous, 16-byte aligned device
 * pointers. Keep them alive and unchanged while the model runs. The CPU
 * reference cannot read them (stof_model_run_cpu says so). */
STOF_API int stof_model_num_weights(const stof_model *m);
STOF_API int stof_model_weight_info(const stof_model *m, int i, stof_tensor_info *info);
STOF_API int stof_model_set_weights_device(stof_model *m, const stof_tensor_ref *weights,
                                           int n);
/* The fp32 CPU reference on host inputs; output: host memory for the
 * output's elements as fp32. Token ids outside the vocabulary and an
 * attention_mask that is not right-padded are errors naming the element. */
STOF_API int stof_model_run_cpu(stof_model *m, const stof_tensor_ref *inputs, int n_inputs,
                                float *output);

/* Text generation with a decoder that outputs logits (a *ForCausalLM directory; a script with
 * head = true): each of n prompts (prompts[i], lens[i] >= 1 tokens) gets up to
 * max_new_tokens new ones, written to out_tokens [n][max_new_tokens] (-1 past a sequence's
 * end), their count to out_lens[n]. The prompts' prefill runs once, then one decode step a
 * token against a KV cache sized by each layer's mask (a sliding window keeps its window).
 * Greedy when temperature is 0, else sampled (top_k, top_p) from a stream of (seed,
 * sequence, step): the same tokens on every run. A sequence ends at one of stop_tokens, or
 * at the config's eos_token_id when use_eos. On the fp32 CPU reference, or on the GPU
 * (stof_model_generate). */
typedef struct stof_generate_options {
    int max_new_tokens;          /* >= 1 */
    float temperature;           /* 0: greedy */
    int top_k;                   /* 0: every token */
    float top_p;                 /* (0, 1]; 0 is taken as 1 */
    uint64_t seed;               /* 0: 1 */
    const int32_t *stop_tokens;  /* at most 16, with the eos ids */
    int n_stop_tokens;
    int use_eos;                 /* 1: the model directory's eos_token_id ends a sequence */
    int recompute;               /* 1: no cache, the whole pass again for every token (the
                                    ground truth the cached run agrees with) */
    double tune_step_s;          /* GPU: > 0 tunes the decode step first for at most this many
                                    seconds (measurements cached beside the kernel cache, as
                                    stof tune keeps them); 0: its default scheme */
} stof_generate_options;
STOF_API int stof_model_generate_cpu(stof_model *m, const int32_t *const *prompts,
                                     const int *lens, int n,
                                     const stof_generate_options *options, int32_t *out_tokens,
                                     int *out_lens);
/* The same on GPU `device` (an fp16 or bf16 model): a prefill pass of the prompts that fills
 * the KV caches on the device, then the decode step on the executor, one CUDA graph a step.
 * The tokens are drawn as stof_model_generate_cpu draws them (recompute is the CPU's). */
STOF_API int stof_model_generate(stof_model *m, int device, const int32_t *const *prompts,
                                 const int *lens, int n, const stof_generate_options *options,
                                 int32_t *out_tokens, int *out_lens);

/* Prepares the model on GPU `device`: its plan (tuned or loaded), else the
 * default scheme; compiles the kernels and uploads the weights. The first
 * stof_model_run does it on device 0 when not called. */
STOF_API int stof_model_to_device(stof_model *m, int device);
/* One forward pass on device tensors: inputs by name (device pointers),
 * output a device pointer to the output's elements in the model's dtype.
 * Ordered after the work queued on `stream` (a CUstream; NULL: the legacy
 * default stream) and before what is queued there next; the call returns
 * once the pass is done and its inputs checked (a token id outside the
 * vocabulary is an error naming it). Capture-safe: while `stream` is
 * being captured into a CUDA graph, the pass is captured into it (its
 * kernels on that stream, nothing waited for), and a bad token id of a
 * replay is reported by the next call outside a capture. The model must be
 * on the device beforehand (stof_model_to_device, or a first run).
 * An attention_mask with padding makes an encoder's pass padding-free (its
 * GEMMs, norms and embedding on the real tokens alone, packed), except
 * inside a capture, where the mask cannot be read: the padded pass is
 * captured. STOF_PACK=0 keeps the padded pass always. */
STOF_API int stof_model_run(stof_model *m, const stof_tensor_ref *inputs, int n_inputs,
                            void *output, void *stream);

/* Tuning, as `stof tune`: the fusion schemes and kernel settings measured on
 * GPU `device`, with the options of `stof tune` (NULL: its defaults).
 * progress (may be NULL) is called as it goes with the search's stage, the
 * settings measured and the best forward latency so far (ms, 0 before the
 * first). The plan is kept for the next runs and stof_model_save_plan. */
typedef struct stof_tune_options {
    double time_limit_s; /* --time-limit: 0 until the search ends */
    long budget;         /* --budget: settings measured at most, 0 no limit */
    uint64_t seed;       /* --seed: search order and input values (0: 1) */
    int reps;            /* --reps: end-to-end runs timed (0: 20) */
    int check;           /* the end-to-end CPU check: 0 when small enough, 1 always, -1 never */
} stof_tune_options;
typedef void (*stof_progress_fn)(const char *stage, long measured, double best_ms, void *ud);
STOF_API int stof_model_tune(stof_model *m, int device, const stof_tune_options *options,
                             stof_progress_fn progress, void *ud);
/* A plan made without a GPU (as `stof tune` on a machine without one): for
 * architecture arch ("sm_90", "sm_80", ...), every class of layers on its
 * default scheme and every segment on its default setting, marked
 * unmeasured, its kernels compiled into the kernel cache; saved with
 * stof_model_save_plan and run, or tuned, where that GPU is. */
STOF_API int stof_model_plan_offline(stof_model *m, const char *arch);
/* A plan file written by `stof tune` or stof_model_save_plan, checked
 * against the model (its script, parameters and graph). The decode steps a
 * plan of `stof tune --decode-batch` holds are kept with it (and saved
 * again): stof_model_generate runs the one for its prompts' batch when its
 * caches hold the prompts and new tokens (else, or with tune_step_s, it makes
 * its own step). */
STOF_API int stof_model_load_plan(stof_model *m, const char *path);
STOF_API int stof_model_save_plan(const stof_model *m, const char *path);

/* Runs the fp32 CPU reference with weights drawn from SEED; writes the
 * output's element count and a checksum (sum of values, sum of squares). */
STOF_API int stof_model_run_reference(stof_model *m, uint64_t seed, double *sum,
                                      double *sum_sq, int64_t *n_elements);

/* ---- masks ---------------------------------------------------------------- */

typedef struct stof_mask stof_mask;

/* A pattern from its text form, as the Lua API writes it:
 *   "sliding_window{band=32}", "bigbird{global=32, band=32, rate=0.1, block=32, seed=1}",
 *   "causal", "longformer{}" (defaults follow seq_len). */
STOF_API int stof_mask_from_pattern(const char *pattern, int batch, int q_len, int k_len,
                                    stof_mask **out);
/* A dense row-major uint8 array [batch][q_len][k_len] (non-zero = allowed);
 * batch == 1 means one mask shared by all batches. */
STOF_API int stof_mask_from_dense(const uint8_t *dense, int batch, int q_len, int k_len,
                                  stof_mask **out);
STOF_API void stof_mask_free(stof_mask *m);
/* Fraction of allowed (query, key) pairs over all batches. */
STOF_API double stof_mask_density(const stof_mask *m);

/* Copies batch b of the mask (b < the mask's stored batch count, 1 for a
 * shared mask) into dense[q_len][k_len] as 0/1 bytes. */
STOF_API int stof_mask_to_dense(const stof_mask *m, int b, uint8_t *dense);
STOF_API void stof_mask_shape(const stof_mask *m, int *batch, int *q_len, int *k_len);

/* ---- device --------------------------------------------------------------- */

typedef struct stof_device_info {
    char name[256];
    int ordinal;
    int cc_major, cc_minor;
    int sm_count;
    int smem_per_sm;       /* bytes */
    int smem_per_block_optin; /* bytes */
    int max_warps_per_sm;
    int regs_per_sm;
    int l2_bytes;
    size_t total_mem;
} stof_device_info;

/* STOF_ERR_NO_DEVICE (with the driver's reason in stof_last_error()) when
 * there is no GPU or no driver. */
STOF_API int stof_device_query(int ordinal, stof_device_info *info);

/* ---- GPU context and masked multi-head attention --------------------------- */

typedef struct stof_ctx stof_ctx;

/* Makes the device's primary context current on the calling thread. */
STOF_API int stof_ctx_create(int device, stof_ctx **out);
STOF_API void stof_ctx_free(stof_ctx *ctx);
STOF_API int stof_ctx_device(const stof_ctx *ctx, stof_device_info *info);

typedef enum stof_attention_kernel {
    STOF_ATTENTION_AUTO = -1,    /* the planner decides (see stof_attention_plan) */
    STOF_ATTENTION_ROW_WISE = 0,
    STOF_ATTENTION_BLOCK_WISE = 1
} stof_attention_kernel;

typedef struct stof_attention_desc {
    int batch, heads, head_dim;
    int q_len, k_len;
    stof_dtype dtype;           /* STOF_F16 or STOF_BF16 */
    int causal;                 /* combined with the mask */
    float scale;                /* 0: 1 / sqrt(head_dim) */
    const stof_mask *mask;      /* NULL: no mask; its batch is 1 or `batch` */
    int relpos_buckets;         /* > 0: T5 relative position bias table [buckets][heads] */
    int relpos_max_distance;
    int relpos_bidirectional;
    stof_attention_kernel kernel; /* AUTO, or force one */
    int block_m, block_n, num_warps; /* block-wise parameters when forced (0: the planner's) */
    int measure; /* N > 0: at plan time, time the analytical choice, Eq. 2's N best block-wise
                    settings and a few fixed ones on scratch buffers and keep the fastest,
                    remembered for this problem on this kind of GPU (the kernel cache's
                    attention-wisdom.txt); 0: that remembered choice when there is one, else
                    the analytical one; -1: the analytical choice only */
    int wgmma;   /* block-wise: 1 = the Hopper build (warpgroup MMA; sm_90 GPUs, BLOCK_M =
                    16 num_warps, a multiple of 64), -1 = the mma.sync build, 0 = automatic
                    (the Hopper build on sm_90 where the sizes allow it and head_dim is a
                    multiple of 64) */
    int tma;     /* block-wise: 1 = K and V tiles by the tensor memory accelerator (sm_90
                    and later, head_dim a multiple of 64; with wgmma, 64), -1 = by cp.async,
                    0 = automatic (TMA where the GPU and the shape allow it) */
    int padded;  /* 1: sequences of different lengths up to q_len (self-attention, q_len ==
                    k_len), given with every run by stof_attention_io's attention_mask or
                    seq_start: keys past a sequence's length are masked and not read, its
                    padded rows written as zeros (the padded layout) or not at all (the
                    ragged one); no work is spent on padding */
    int kv_heads; /* grouped-query attention: K and V have this many heads (dividing heads),
                    query head h reading K/V head h / (heads / kv_heads); 0: heads */
} stof_attention_desc;

typedef struct stof_attention stof_attention;

/* Plans attention for one shape: selects the kernel unless forced (the
 * analytical choice: the fastest setting by the cost model calibrated for
 * the GPU's architecture, kernels/attention_cost.txt; the paper's Eq. 1, 2
 * where it has no costs or STOF_ATTENTION_MODEL=paper), builds the mask's
 * storage format, uploads it, compiles the kernel (through the NVRTC
 * cache). */
STOF_API int stof_attention_plan(stof_ctx *ctx, const stof_attention_desc *desc, stof_attention **out);
STOF_API void stof_attention_free(stof_attention *a);
/* "block-wise BLOCK_M=64 BLOCK_N=64 num_warps=4" and the like. */
STOF_API int stof_attention_describe(const stof_attention *a, char *buf, size_t n);

/* Device pointers and strides in elements: [batch stride, row (token)
 * stride]; head h of q, k, v and o starts at column h * head_dim. For the
 * packed QKV output [B, S, 3, H, D]: q = qkv, k = qkv + H*D, v = qkv + 2*H*D,
 * all with strides {S*3*H*D, 3*H*D}. relpos_table: [buckets][heads] in the
 * model dtype, or NULL. stream: a CUstream (NULL: the default stream). */
typedef struct stof_attention_io {
    const void *q, *k, *v;
    void *o;
    int64_t q_stride[2], k_stride[2], v_stride[2], o_stride[2];
    const void *relpos_table;
    /* Padded plans (stof_attention_desc.padded), one of the two layouts:
     *  - padded: attention_mask, int32 [batch, q_len] on the device, 1 = token, each row
     *    ones then zeros; the tensors [batch, q_len, ...] with their strides;
     *  - ragged (variable length, FlashAttention's "varlen"): seq_start, int32 [batch + 1] on
     *    the device (cu_seqlens: 0, then each sequence's end), sequence b's rows being rows
     *    seq_start[b] .. seq_start[b + 1] - 1 of q, k, v and o (their batch strides are not
     *    read), rows the rows they hold. Rows outside every sequence must hold finite values
     *    (the TMA build may load them, never weighs them); they are not written.
     *    attention_mask may be NULL; when given, its lengths must be seq_start's. */
    const int32_t *attention_mask;
    const int32_t *seq_start;
    int64_t rows;
} stof_attention_io;

STOF_API int stof_attention_run(stof_attention *a, const stof_attention_io *io, void *stream);

#ifdef __cplusplus
}
#endif
#endif
