/* The public model API (include/stof.h): a model opened from a script or a
 * Hugging Face model directory, its inputs and output, the CPU reference on
 * host arrays, tuning, plans, and forward passes on the caller's device
 * tensors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/api/api_internal.h"
#include "core/base/error.h"
#include "core/base/file.h"
#include "core/exec/exec.h"
#include "core/gpu/cuda_driver.h"
#include "core/graph/graph.h"
#include "core/io/model_dir.h"
#include "core/io/safetensors.h"
#include "core/io/weights.h"
#include "core/lua/lua_api.h"
#include "core/plan/plan.h"
#include "core/ref/ref.h"
#include "core/tune/tune_backend.h"
#include "fusion/scheme.h"
#include "search/search.h"

/* ---- opening ----------------------------------------------------------------------------- */

int stof_model_open(const char *path, const char *const *params, int n_params,
                    stof_model **out) {
    stof_error err = {0};
    *out = NULL;
    if (!path)
        return api_remember(err_set(&err, STOF_ERR_INVALID, "no model path given"), &err);
    stof_model *m = err_calloc(1, sizeof *m, &err);
    if (!m)
        return api_remember(STOF_ERR_NOMEM, &err);
    graph_init(&m->g);
    m->seed = 1;
    int rc = model_dir_detect(path)
                 ? lua_api_build_dir(path, NULL, params, n_params, &m->g, &m->script, &err)
                 : lua_api_build(path, params, n_params, &m->g, &m->script, &err);
    /* a directory's weights, where it has them; without, a run asks for some */
    if (!rc && m->script.model_dir[0] && model_dir_has_weights(m->script.model_dir))
        rc = model_dir_weights_at(m->script.model_dir, &m->weights, &err);
    m->weights_missing = !rc && m->script.model_dir[0] && !m->weights;
    if (!rc) {
        weights_source src = {.seed = m->seed, .weights = m->weights};
        rc = weights_source_check(&src, &m->g, &err);
    }
    if (rc) {
        stof_model_free(m);
        return api_remember(rc, &err);
    }
    *out = m;
    return api_remember(STOF_OK, &err);
}

int stof_model_load(const char *script, const char *const *params, int n_params,
                    stof_model **out) {
    return stof_model_open(script, params, n_params, out);
}

/* Drops what runs on the GPU (a new plan or new weights remake it). */
static void drop_gpu_model(stof_model *m) {
    exec_model_free(m->xmodel);
    exec_plan_free(m->xplan);
    m->xmodel = NULL;
    m->xplan = NULL;
}

void stof_model_free(stof_model *m) {
    if (!m)
        return;
    drop_gpu_model(m);
    exec_ctx_free(m->ctx);
    if (m->has_plan)
        plan_free(&m->pl);
    safetensors_close(m->weights);
    free(m->bound);
    graph_free(&m->g);
    free(m);
}

int stof_model_num_ops(const stof_model *m) {
    return m->g.n_ops;
}

int stof_model_num_tensors(const stof_model *m) {
    return m->g.n_tensors;
}

/* ---- inputs and output ------------------------------------------------------------------- */

static void tensor_info(const graph_tensor *t, stof_tensor_info *info) {
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", t->name);
    info->dtype = t->dtype;
    info->ndim = t->ndim;
    for (int d = 0; d < t->ndim && d < STOF_MAX_DIMS; d++)
        info->shape[d] = t->shape[d];
    info->optional = graph_input_optional(t);
}

/* The tensors the API lists, each kind in graph order: the inputs, and the
 * weights a checkpoint gives (not the constants a script fixes). */
typedef int (*tensor_kind)(const graph_tensor *t);

static int is_input(const graph_tensor *t) {
    return t->role == GRAPH_INPUT;
}

static int is_checkpoint_weight(const graph_tensor *t) {
    return t->role == GRAPH_WEIGHT && !t->constant;
}

static int count_of(const graph *g, tensor_kind kind) {
    int n = 0;
    for (int t = 0; t < g->n_tensors; t++)
        n += kind(&g->tensors[t]);
    return n;
}

/* The graph index of the i-th tensor of the kind, or -1. */
static int nth_of(const graph *g, tensor_kind kind, int i) {
    for (int t = 0; t < g->n_tensors; t++)
        if (kind(&g->tensors[t]) && i-- == 0)
            return t;
    return -1;
}

static int nth_info(const stof_model *m, tensor_kind kind, const char *what, int i,
                    stof_tensor_info *info) {
    stof_error err = {0};
    int t = nth_of(&m->g, kind, i);
    if (t < 0)
        return api_remember(err_set(&err, STOF_ERR_INVALID, "%s %d: the model has %d", what, i,
                                    count_of(&m->g, kind)),
                            &err);
    tensor_info(&m->g.tensors[t], info);
    return api_remember(STOF_OK, &err);
}

int stof_model_num_inputs(const stof_model *m) {
    return count_of(&m->g, is_input);
}

int stof_model_input_info(const stof_model *m, int i, stof_tensor_info *info) {
    return nth_info(m, is_input, "input", i, info);
}

int stof_model_output_info(const stof_model *m, stof_tensor_info *info) {
    tensor_info(&m->g.tensors[m->g.output], info);
    return STOF_OK;
}

const char *stof_model_script(const stof_model *m) {
    return m->script.path;
}

/* ---- weights ----------------------------------------------------------------------------- */

/* Weights file f (rc: how opening it went) checked against the model and, when it fits, made
 * the model's (NULL: none, every weight from the seed); else closed. */
static int adopt_weights(stof_model *m, safetensors_file *f, int rc, stof_error *err) {
    weights_source src = {.seed = m->seed, .weights = f};
    if (!rc)
        rc = weights_source_check(&src, &m->g, err);
    if (rc) {
        safetensors_close(f);
        return api_remember(rc, err);
    }
    safetensors_close(m->weights);
    m->weights = f;
    m->weights_missing = !f && m->script.model_dir[0];
    free(m->bound);
    m->bound = NULL;
    drop_gpu_model(m);
    return api_remember(STOF_OK, err);
}

int stof_model_set_weights(stof_model *m, const char *path) {
    stof_error err = {0};
    safetensors_file *f = NULL;
    int rc = path ? safetensors_open(path, &f, &err) : STOF_OK;
    return adopt_weights(m, f, rc, &err);
}

int stof_model_num_weights(const stof_model *m) {
    return count_of(&m->g, is_checkpoint_weight);
}

int stof_model_weight_info(const stof_model *m, int i, stof_tensor_info *info) {
    return nth_info(m, is_checkpoint_weight, "weight", i, info);
}

int stof_model_set_weights_device(stof_model *m, const stof_tensor_ref *w, int n) {
    stof_error err = {0};
    const graph *g = &m->g;
    CUdeviceptr *bound = err_calloc((size_t)g->n_tensors, sizeof *bound, &err);
    int rc = bound ? STOF_OK : STOF_ERR_NOMEM;
    for (int i = 0; !rc && i < n; i++) {
        int t = w[i].name ? graph_find_tensor(g, w[i].name) : -1;
        CUdeviceptr p = (CUdeviceptr)(uintptr_t)w[i].data;
        if (t < 0 || !is_checkpoint_weight(&g->tensors[t]))
            rc = err_set(&err, STOF_ERR_INVALID, "'%s' is not a weight of the model (see "
                         "stof_model_weight_info for its names)", w[i].name ? w[i].name : "?");
        else if (bound[t])
            rc = err_set(&err, STOF_ERR_INVALID, "weight '%s' given twice", w[i].name);
        else if (!p || p % 16)
            rc = err_set(&err, STOF_ERR_INVALID, "weight '%s': a 16-byte aligned device pointer "
                         "is needed (got 0x%llx)", w[i].name, (unsigned long long)p);
        else
            bound[t] = p;
    }
    for (int t = 0; !rc && t < g->n_tensors; t++)
        if (is_checkpoint_weight(&g->tensors[t]) && !bound[t])
            rc = err_set(&err, STOF_ERR_MISMATCH, "weight '%s' was not given (every weight is "
                         "given on the device, or none)", g->tensors[t].name);
    if (rc) {
        free(bound);
        return api_remember(rc, &err);
    }
    free(m->bound);
    m->bound = bound;
    safetensors_close(m->weights);
    m->weights = NULL;
    m->weights_missing = 0;
    drop_gpu_model(m);
    return api_remember(STOF_OK, &err);
}

/* safetensors' dtype name -> its code; SAFETENSORS_OTHER for the rest. */
static safetensors_dtype weight_dtype(const char *name) {
    static const safetensors_dtype codes[] = {SAFETENSORS_F32, SAFETENSORS_F16,
                                              SAFETENSORS_BF16};
    for (size_t k = 0; name && k < sizeof codes / sizeof codes[0]; k++)
        if (strcmp(name, safetensors_dtype_name(codes[k])) == 0)
            return codes[k];
    return SAFETENSORS_OTHER;
}

int stof_model_set_weights_memory(stof_model *m, const stof_weight *w, int n) {
    stof_error err = {0};
    safetensors_entry *e = n > 0 ? err_calloc((size_t)n, sizeof *e, &err) : NULL;
    int rc = n > 0 && !e ? STOF_ERR_NOMEM : STOF_OK;
    for (int i = 0; !rc && i < n; i++) {
        e[i] = (safetensors_entry){.name = w[i].name, .dtype = weight_dtype(w[i].dtype),
                                   .ndim = w[i].ndim, .data = w[i].data};
        if (e[i].dtype == SAFETENSORS_OTHER || w[i].ndim < 0 || w[i].ndim > STOF_MAX_DIMS)
            rc = err_set(&err, STOF_ERR_INVALID, "weight %d ('%s'): dtype '%s' with %d dims "
                         "(F32, F16 or BF16, at most %d)", i, w[i].name ? w[i].name : "?",
                         w[i].dtype ? w[i].dtype : "(null)", w[i].ndim, STOF_MAX_DIMS);
        for (int d = 0; !rc && d < w[i].ndim; d++)
            e[i].shape[d] = w[i].shape[d];
    }
    safetensors_file *f = NULL;
    if (!rc)
        rc = safetensors_from_memory("weights in memory", e, n, &f, &err);
    free(e);
    return adopt_weights(m, f, rc, &err);
}

void stof_model_set_seed(stof_model *m, uint64_t seed) {
    m->seed = seed;
    m->weights_missing = 0; /* random weights, asked for */
    drop_gpu_model(m);
}

int api_check_weights(const stof_model *m, stof_error *err) {
    if (!m->weights_missing)
        return STOF_OK;
    return err_set(err, STOF_ERR_INVALID, "%s has no model.safetensors or "
                   "model.safetensors.index.json: give the weights (stof_model_set_weights, "
                   "stof_model_set_weights_memory), or ask for random ones "
                   "(stof_model_set_seed)", m->script.model_dir);
}

/* ---- the inputs a run is given -------------------------------------------------------------- */

/* The graph input named name, or -1. */
static int input_named(const graph *g, const char *name) {
    int t = name ? graph_find_tensor(g, name) : -1;
    return t >= 0 && g->tensors[t].role == GRAPH_INPUT ? t : -1;
}

/* The run's tensor for each graph input (in graph order): the one given,
 * or none for an optional input. Every given name must be an input, each
 * once; every input without a default must be given. */
static int match_inputs(const graph *g, const stof_tensor_ref *in, int n, const void **data,
                        stof_error *err) {
    memset(data, 0, sizeof *data * (size_t)g->n_tensors);
    for (int i = 0; i < n; i++) {
        int t = input_named(g, in[i].name);
        if (t < 0) {
            char names[256] = "";
            size_t used = 0;
            for (int k = 0; k < g->n_tensors && used < sizeof names; k++)
                if (g->tensors[k].role == GRAPH_INPUT)
                    used += (size_t)snprintf(names + used, sizeof names - used, "%s%s",
                                             used ? ", " : "", g->tensors[k].name);
            return err_set(err, STOF_ERR_INVALID, "'%s' is not an input of the model (its "
                           "inputs: %s)", in[i].name ? in[i].name : "(null)", names);
        }
        if (data[t])
            return err_set(err, STOF_ERR_INVALID, "input '%s' given twice", in[i].name);
        if (!in[i].data)
            return err_set(err, STOF_ERR_INVALID, "input '%s' has no data", in[i].name);
        data[t] = in[i].data;
    }
    for (int t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].role == GRAPH_INPUT && !data[t] &&
            !graph_input_optional(&g->tensors[t]))
            return err_set(err, STOF_ERR_INVALID, "input '%s' is missing (only an optional "
                           "input, such as an attention_mask, may be left out)",
                           g->tensors[t].name);
    return STOF_OK;
}

/* Host values of input t as the CPU reference takes them: ids checked
 * against the vocabulary, an attention_mask against right padding. */
static int host_input(const graph_tensor *t, const void *data, float *out, stof_error *err) {
    int64_t n = graph_tensor_numel(t);
    if (t->dtype != STOF_I32) {
        const float *x = data;
        for (int64_t i = 0; i < n; i++) {
            if (!isfinite(x[i]))
                return err_set(err, STOF_ERR_INVALID, "input '%s': element %lld is not finite",
                               t->name, (long long)i);
            out[i] = x[i];
        }
        return STOF_OK;
    }
    const int32_t *v = data;
    int64_t seq = t->shape[t->ndim - 1];
    int rc = t->init == GRAPH_INIT_PADDING ? weights_check_input_mask(t, v, err) : STOF_OK;
    for (int64_t i = 0; !rc && i < n; i++) {
        if (t->init != GRAPH_INIT_PADDING && (v[i] < 0 || v[i] >= t->init_high))
            return err_set(err, STOF_ERR_INVALID, "input '%s': %d at index %lld (row %lld, "
                           "position %lld) is outside [0, %lld)", t->name, (int)v[i],
                           (long long)i, (long long)(i / seq), (long long)(i % seq),
                           (long long)t->init_high);
        out[i] = (float)v[i];
    }
    return rc;
}

/* ---- the CPU reference ------------------------------------------------------------------- */

int stof_model_run_cpu(stof_model *m, const stof_tensor_ref *inputs, int n_inputs,
                       float *output) {
    stof_error err = {0};
    const void **data = err_calloc((size_t)m->g.n_tensors, sizeof *data, &err);
    if (!data)
        return api_remember(STOF_ERR_NOMEM, &err);
    int rc = api_check_weights(m, &err);
    if (!rc && m->bound)
        rc = err_set(&err, STOF_ERR_INVALID, "the model's weights are on the GPU "
                     "(stof_model_set_weights_device): the CPU reference reads host weights");
    if (!rc)
        rc = match_inputs(&m->g, inputs, n_inputs, data, &err);
    ref_values rv = {0};
    weights_source src = {.seed = m->seed, .weights = m->weights};
    if (!rc)
        rc = ref_values_init(&m->g, &src, &rv, &err);
    for (int t = 0; !rc && t < m->g.n_tensors; t++)
        if (data[t])
            rc = host_input(&m->g.tensors[t], data[t], rv.data[t], &err);
    if (!rc)
        rc = ref_execute(&m->g, &rv, &err);
    if (!rc)
        memcpy(output, rv.data[m->g.output],
               sizeof *output * (size_t)graph_tensor_numel(&m->g.tensors[m->g.output]));
    ref_values_free(&rv);
    free(data);
    return api_remember(rc, &err);
}

int stof_model_run_reference(stof_model *m, uint64_t seed, double *sum, double *sum_sq,
                             int64_t *n_elements) {
    stof_error err = {0};
    ref_values rv;
    weights_source src = weights_source_seeded(seed);
    int rc = ref_values_init(&m->g, &src, &rv, &err);
    if (rc == STOF_OK)
        rc = ref_execute(&m->g, &rv, &err);
    if (rc == STOF_OK) {
        const graph_tensor *out = &m->g.tensors[m->g.output];
        *n_elements = graph_tensor_numel(out);
        ref_checksum(rv.data[m->g.output], *n_elements, sum, sum_sq);
    }
    ref_values_free(&rv);
    return api_remember(rc, &err);
}

/* ---- plans --------------------------------------------------------------------------------- */

/* The model's GPU context, on `device`: made once; another device later is
 * an error rather than a silent change. */
int api_ensure_ctx(stof_model *m, int device, stof_error *err) {
    if (!m->ctx)
        return exec_ctx_create(device, &m->ctx, err);
    int on = exec_ctx_device(m->ctx)->ordinal;
    return on == device ? STOF_OK
                        : err_set(err, STOF_ERR_INVALID, "the model is on GPU %d already, not %d",
                                  on, device);
}

static void keep_plan(stof_model *m, plan *p) {
    if (m->has_plan)
        plan_free(&m->pl);
    m->pl = *p;
    m->has_plan = 1;
    drop_gpu_model(m);
}

typedef struct progress_relay {
    stof_progress_fn fn;
    void *ud;
} progress_relay;

static void relay_progress(void *ud, const search_progress *p) {
    const progress_relay *r = ud;
    r->fn(search_stage_name(p->stage), p->measured, isfinite(p->best_ms) ? p->best_ms : 0.0,
          r->ud);
}

int stof_model_tune(stof_model *m, int device, const stof_tune_options *options,
                    stof_progress_fn progress, void *ud) {
    stof_tune_options none = {0};
    const stof_tune_options *t = options ? options : &none;
    stof_error err = {0};
    int rc = api_check_weights(m, &err);
    if (!rc)
        rc = api_ensure_ctx(m, device, &err);
    if (rc)
        return api_remember(rc, &err);
    progress_relay relay = {progress, ud};
    tune_options o = {.time_limit_s = t->time_limit_s > 0 ? t->time_limit_s : 0,
                      .budget = t->budget > 0 ? t->budget : 0,
                      .seed = t->seed ? t->seed : m->seed, .reps = t->reps > 0 ? t->reps : 0,
                      .check = t->check,
                      .progress = progress ? relay_progress : NULL, .ud = &relay};
    plan p;
    tune_outcome res;
    rc = tune_gpu(m->ctx, &m->g, &m->script, &o, &p, &res, &err);
    if (!rc)
        keep_plan(m, &p);
    return api_remember(rc, &err);
}

int stof_model_plan_offline(stof_model *m, const char *arch) {
    stof_error err = {0};
    if (!arch || strncmp(arch, "sm_", 3) != 0)
        return api_remember(err_set(&err, STOF_ERR_INVALID, "arch must be sm_XX (sm_80, "
                                    "sm_90, ...), got '%s'", arch ? arch : "(null)"),
                            &err);
    plan p;
    tune_offline_stats st;
    int rc = tune_offline(&m->g, &m->script, arch, NULL, &p, &st, &err);
    if (!rc)
        keep_plan(m, &p);
    return api_remember(rc, &err);
}

int stof_model_load_plan(stof_model *m, const char *path) {
    stof_error err = {0};
    plan p;
    int rc = plan_read(path, &p, &err);
    if (rc)
        return api_remember(rc, &err);
    rc = plan_check_fits(&p, NULL, &m->script, &m->g, &err);
    if (rc) {
        plan_free(&p);
        return api_remember(rc, &err);
    }
    keep_plan(m, &p);
    return api_remember(STOF_OK, &err);
}

int stof_model_save_plan(const stof_model *m, const char *path) {
    stof_error err = {0};
    if (!m->has_plan)
        return api_remember(err_set(&err, STOF_ERR_INVALID, "the model has no plan to save: "
                                    "tune it (stof_model_tune) or load one first"),
                            &err);
    return api_remember(plan_write(&m->pl, path, &err), &err);
}

/* ---- forward passes on the GPU --------------------------------------------------------------- */

/* The executor: the plan's schemes and kernels, else the default scheme
 * (every sequence cut greedily, default settings). */
static int ensure_gpu_model(stof_model *m, int device, stof_error *err) {
    if (m->xmodel)
        return STOF_OK;
    int rc = api_check_weights(m, err);
    if (!rc)
        rc = api_ensure_ctx(m, device, err);
    if (!rc && m->has_plan)
        rc = plan_check_fits(&m->pl, exec_ctx_device(m->ctx), NULL, NULL, err);
    if (!rc)
        rc = m->has_plan ? exec_plan_from_plan(&m->pl, &m->g, &m->xplan, err)
                         : exec_plan_default(&m->g, &m->xplan, err);
    weights_source src = {.seed = m->seed, .weights = m->weights};
    if (!rc)
        rc = exec_model_create_bound(m->ctx, m->xplan, &src, m->bound, &m->xmodel, err);
    if (rc)
        drop_gpu_model(m);
    return rc;
}

int stof_model_to_device(stof_model *m, int device) {
    stof_error err = {0};
    return api_remember(ensure_gpu_model(m, device, &err), &err);
}

/* Whether `stream` is being captured into a CUDA graph (0 when the driver
 * cannot tell: the run then reports its own error). */
static int capturing(void *stream) {
    const cuda_driver *drv = NULL;
    stof_error ignored = {0};
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (cuda_driver_get(&drv, &ignored) || drv->StreamIsCapturing((CUstream)stream, &st))
        return 0;
    return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

int stof_model_run(stof_model *m, const stof_tensor_ref *inputs, int n_inputs, void *output,
                   void *stream) {
    stof_error err = {0};
    const graph *g = &m->g;
    const void **data = err_calloc((size_t)g->n_tensors, sizeof *data, &err);
    exec_io *io = err_calloc((size_t)g->n_tensors, sizeof *io, &err);
    int rc = data && io ? match_inputs(g, inputs, n_inputs, data, &err) : STOF_ERR_NOMEM;
    if (!rc && !output)
        rc = err_set(&err, STOF_ERR_INVALID, "no output tensor given");
    /* compiling and uploading would break the caller's capture: done before it */
    if (!rc && !m->xmodel && capturing(stream))
        rc = err_set(&err, STOF_ERR_INVALID, "the model is not on the GPU yet and the stream is "
                     "being captured: call stof_model_to_device (or run it once) before the "
                     "capture");
    if (!rc)
        rc = ensure_gpu_model(m, m->ctx ? exec_ctx_device(m->ctx)->ordinal : 0, &err);
    int n = 0;
    for (int t = 0; !rc && t < g->n_tensors; t++)
        if (g->tensors[t].role == GRAPH_INPUT)
            io[n++] = (exec_io){t, (CUdeviceptr)(uintptr_t)data[t]};
    if (!rc)
        rc = exec_model_run_io(m->xmodel, io, n, (CUdeviceptr)(uintptr_t)output,
                               (CUstream)stream, &err);
    free(io);
    free(data);
    return api_remember(rc, &err);
}
