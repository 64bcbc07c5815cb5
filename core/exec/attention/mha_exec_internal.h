/* What the files of the attention planner share and mha_exec.h does not
 * export: limits of the kernels, the kernel loader, and the steps of a plan
 * that the analytic and the measured paths both take. */
#ifndef STOF_CORE_EXEC_ATTENTION_MHA_EXEC_INTERNAL_H
#define STOF_CORE_EXEC_ATTENTION_MHA_EXEC_INTERNAL_H

#include "core/exec/attention/mha_exec.h"
#include "ops/mask_format.h"

#define MHA_EXEC_MAX_THREADS 1024
#define MHA_EXEC_RELPOS_MID_MAX 2048     /* T5 biases the block-wise kernel keeps in shared memory */
#define MHA_EXEC_MAX_GRID_YZ 65535
#define MHA_EXEC_SMEM_PAD 8              /* elements of padding per shared row */
#define MHA_EXEC_FRAG_REGS 160           /* see mha_exec_block_regs_ok */
#define MHA_EXEC_SMEM_RESERVED 1024      /* shared memory the SM reserves per block (sm_80+) */
#define MHA_EXEC_MAX_CTAS_PER_SM 32      /* resident blocks per SM (sm_80, sm_90) */

/* The loaded kernel of a request (gpu_ctx_function); a SPLIT=1 build also
 * holds the combine kernel, looked up in the same module. */
int mha_get_function(mha_exec_ctx *c, const mha_exec_request *r, const char *name,
                     size_t smem, CUfunction *out, CUfunction *combine, stof_error *err);
/* The limits of the plan's device, and its arch into the plan. */
void mha_plan_device_limits(const mha_exec_ctx *c, mha_exec_plan *plan,
                            mha_device_limits *lim);
/* A new plan: a copy of base (problem, mask statistics, arch), no
 * configuration, no device arrays. */
mha_exec_plan *mha_plan_clone(const mha_exec_plan *base, stof_error *err);
/* Everything a plan needs once its configuration is set: the format on the
 * device, the relpos buckets, the launch shape, the loaded kernel. The one
 * path from a configuration to a runnable plan, analytical or measured. */
int mha_plan_finish(mha_exec_ctx *c, mha_exec_plan *plan, const mask *folded,
                    const mha_exec_force *force, stof_error *err);
/* The bucket of position r = j - i + q_len - 1, by op_relpos_bucket. */
int32_t mha_relpos_bucket_at(const mha_exec_problem *p, size_t r);
/* The last position of the first run of equal buckets and the first of the
 * last run: T5's far distances, one bucket a side (attention_abi.cuh). */
void mha_relpos_far_runs(const mha_exec_problem *p, size_t *first_end, size_t *last_start);
/* Builds and times every candidate, keeps the fastest (see mha_exec.h). */
int mha_plan_measured(mha_exec_ctx *c, const mha_exec_plan *base, const mask *folded,
                      const mha_device_limits *lim, const mha_exec_force *force,
                      mha_exec_plan **out, stof_error *err);
/* Measured choices remembered per device (mha_exec_wisdom.c): lookup fills
 * f with the configuration remembered for the problem (1) or leaves it
 * (0); record remembers one. Both ignore a missing or unreadable file. */
int mha_wisdom_lookup(const mha_exec_ctx *c, const mha_exec_problem *p, const mask *folded,
                      mha_exec_force *f);
void mha_wisdom_record(const mha_exec_ctx *c, const mha_exec_problem *p, const mask *folded,
                       const mha_exec_config *cfg, float ms);
/* The plan's own kernel (and its split rows' combine) on t: mha_exec_run without the
 * global tokens' kernels (what a measurement times). */
int mha_run_main(mha_exec_ctx *c, const mha_exec_plan *plan, const mha_exec_tensors *t,
                 CUstream s, stof_error *err);
/* Global tokens (mha_exec_global.c): the index and log-sum-exp workspace, the mask's bits
 * when config.lse, the kernels of attention_global.cu. After the main kernel's setup. */
int mha_global_prepare(mha_exec_ctx *c, mha_exec_plan *plan, const mask *folded,
                       stof_error *err);
/* The global tokens' tensors of t (before anything is launched). */
int mha_global_check(const mha_exec_plan *plan, const mha_exec_tensors *t, stof_error *err);
/* After the main kernel: the index of the global tokens, the merge of the global keys
 * (config.lse) and the global rows. */
int mha_global_launch(mha_exec_ctx *c, const mha_exec_plan *plan, const mha_exec_tensors *t,
                      CUstream s, stof_error *err);

/* Loaded blocks of block row i of batch b in the BSR load list. */
int mha_bsr_row_len(const mask_bsr *f, int b, int i);

#endif
