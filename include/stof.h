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

const char *stof_status_name(int status);

/* The error record the library fills. Library entry points that take one
 * never print; the public wrappers below keep the last one per thread. */
typedef struct stof_error {
    int code;
    char msg[1024];
} stof_error;

const char *stof_last_error(void);
const char *stof_version(void);
const char *stof_build_commit(void);

typedef enum stof_dtype {
    STOF_F32 = 0,
    STOF_F16 = 1,
    STOF_BF16 = 2,
    STOF_I32 = 3
} stof_dtype;

const char *stof_dtype_name(stof_dtype t);
size_t stof_dtype_size(stof_dtype t);

/* ---- models: a Lua script turned into an operator graph ------------------ */

typedef struct stof_model stof_model;

/* Runs SCRIPT (a path) with parameters "key=value" (may be NULL when n == 0). */
int stof_model_load(const char *script, const char *const *params, int n_params,
                    stof_model **out);
void stof_model_free(stof_model *m);
int stof_model_num_ops(const stof_model *m);
int stof_model_num_tensors(const stof_model *m);

/* Runs the fp32 CPU reference with weights drawn from SEED; writes the
 * output's element count and a checksum (sum of values, sum of squares). */
int stof_model_run_reference(stof_model *m, uint64_t seed, double *sum, double *sum_sq,
                             int64_t *n_elements);

/* ---- masks ---------------------------------------------------------------- */

typedef struct stof_mask stof_mask;

/* A pattern from its text form, as the Lua API writes it:
 *   "sliding_window{band=32}", "bigbird{global=32, band=32, rate=0.1, block=32, seed=1}",
 *   "causal", "longformer{}" (defaults follow seq_len). */
int stof_mask_from_pattern(const char *pattern, int batch, int q_len, int k_len,
                           stof_mask **out);
/* A dense row-major uint8 array [batch][q_len][k_len] (non-zero = allowed);
 * batch == 1 means one mask shared by all batches. */
int stof_mask_from_dense(const uint8_t *dense, int batch, int q_len, int k_len,
                         stof_mask **out);
void stof_mask_free(stof_mask *m);
/* Fraction of allowed (query, key) pairs over all batches. */
double stof_mask_density(const stof_mask *m);

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
int stof_device_query(int ordinal, stof_device_info *info);

#ifdef __cplusplus
}
#endif
#endif
