/* One NVRTC compile in this process: see nvrtc_compile.h. */
#include "core/gpu/nvrtc_compile.h"

#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/gpu/kernels.h"

#ifndef STOF_CUDA_INCLUDE_DIR
#define STOF_CUDA_INCLUDE_DIR "/usr/local/cuda/include"
#endif

int nvrtc_version(int *major, int *minor, stof_error *err) {
    if (nvrtcVersion(major, minor) != NVRTC_SUCCESS)
        return err_set(err, STOF_ERR_COMPILE, "NVRTC did not report its version");
    return STOF_OK;
}

/* Collects the embedded .cuh files as NVRTC headers. */
static int header_list(const char ***texts, const char ***names, int *n, stof_error *err) {
    int count = 0;
    for (int i = 0; i < kernel_source_count; i++)
        count += kernel_is_header(&kernel_sources[i]);
    *texts = err_calloc((size_t)count + 1, sizeof **texts, err);
    *names = err_calloc((size_t)count + 1, sizeof **names, err);
    if (!*texts || !*names) {
        free(*texts);
        free(*names);
        return STOF_ERR_NOMEM;
    }
    *n = 0;
    for (int i = 0; i < kernel_source_count; i++)
        if (kernel_is_header(&kernel_sources[i])) {
            (*texts)[*n] = kernel_sources[i].text;
            (*names)[*n] = kernel_sources[i].name;
            (*n)++;
        }
    return STOF_OK;
}

static int compile_error(nvrtcProgram prog, const nvrtc_request *req, nvrtcResult r,
                         stof_error *err) {
    size_t log_size = 0;
    char log[768] = "";
    if (nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 1) {
        char *full = malloc(log_size);
        if (full && nvrtcGetProgramLog(prog, full) == NVRTC_SUCCESS)
            snprintf(log, sizeof log, "%s", full);
        free(full);
    }
    err_set(err, STOF_ERR_COMPILE, "NVRTC could not compile %s for %s (%s):\n%s", req->source,
            req->arch, nvrtcGetErrorString(r), log);
    return STOF_ERR_COMPILE;
}

/* opts gets arch_opt (filled here, "-arch=sm_90"), the fixed options and
 * the request's. */
static void build_options(const nvrtc_request *req, char *arch_opt, size_t arch_cap,
                          const char **opts, int *n) {
    static const char *const fixed[] = {"-std=c++17", "-default-device", "--use_fast_math",
                                        "-I" STOF_CUDA_INCLUDE_DIR};
    snprintf(arch_opt, arch_cap, "-arch=%s", req->arch);
    int k = 0;
    opts[k++] = arch_opt;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        opts[k++] = fixed[i];
    for (int i = 0; i < req->n_options; i++)
        opts[k++] = req->options[i];
    *n = k;
}

int nvrtc_compile_in_process(const nvrtc_request *req, void **cubin, size_t *size,
                             stof_error *err) {
    const kernel_source *src = kernel_find(req->source);
    if (!src)
        return err_set(err, STOF_ERR_INVALID, "no kernel source named '%s' is built in",
                       req->source);
    const char **htexts, **hnames;
    int nh, rc = header_list(&htexts, &hnames, &nh, err);
    if (rc)
        return rc;
    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, src->text, src->name, nh, htexts, hnames);
    free(htexts);
    free(hnames);
    if (r != NVRTC_SUCCESS)
        return err_set(err, STOF_ERR_COMPILE, "nvrtcCreateProgram(%s): %s", req->source,
                       nvrtcGetErrorString(r));
    const char *opts[NVRTC_MAX_OPTIONS + 8];
    char arch_opt[64];
    int nopts;
    build_options(req, arch_opt, sizeof arch_opt, opts, &nopts);
    r = nvrtcCompileProgram(prog, nopts, opts);
    if (r != NVRTC_SUCCESS) {
        compile_error(prog, req, r, err);
        nvrtcDestroyProgram(&prog);
        return STOF_ERR_COMPILE;
    }
    r = nvrtcGetCUBINSize(prog, size);
    if (r == NVRTC_SUCCESS && (*cubin = err_malloc(*size, err)) != NULL)
        r = nvrtcGetCUBIN(prog, *cubin);
    nvrtcDestroyProgram(&prog);
    if (r != NVRTC_SUCCESS) {
        free(*cubin);
        *cubin = NULL;
        return err_set(err, STOF_ERR_COMPILE, "NVRTC gave no cubin for %s: %s", req->source,
                       nvrtcGetErrorString(r));
    }
    return *cubin ? STOF_OK : STOF_ERR_NOMEM;
}
