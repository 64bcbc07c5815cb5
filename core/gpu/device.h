/* GPUs as stof sees them: properties for the selector and the plans. */
#ifndef STOF_CORE_DEVICE_H
#define STOF_CORE_DEVICE_H

#include "stof.h"

/* Number of GPUs; STOF_ERR_NO_DEVICE with the reason when there are none. */
int device_count(int *n, stof_error *err);
int device_query(int ordinal, stof_device_info *info, stof_error *err);
/* "sm_90" for compute capability 9.0. */
void device_arch_name(const stof_device_info *info, char *buf, size_t n);
/* Whether the wgmma builds (the attention kernel's and gemm_epilogue's) run
 * on a device of `arch`: "sm_90" only, as sm_90a code runs on no other
 * architecture. They compile for the architecture-specific target sm_90a. */
int device_wgmma_arch(const char *arch);
/* Whether a device of `arch` ("sm_NN") has the tensor memory accelerator:
 * sm_90 and later. */
int device_tma_arch(const char *arch);

#endif
