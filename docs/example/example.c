/* A program using the installed stof: builds BigBird's mask for 1024 tokens
 * and says how sparse it is, then which GPU stof would run on (or why there
 * is none); given a model (a script or a Hugging Face model directory, with
 * key=value parameters), opens it, lists its inputs and runs the CPU
 * reference on token ids 1, 2, 3, ...
 *   example [MODEL [key=value ...]]
 * Build it with find_package(stof) (CMakeLists.txt here) or with
 *   cc example.c $(pkg-config --cflags --libs stof)  */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stof.h>

static int64_t numel(const stof_tensor_info *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

/* Opens path, prints what it takes and gives, runs it on the CPU. */
static int run_model(const char *path, const char *const *params, int n_params) {
    stof_model *m = NULL;
    if (stof_model_open(path, params, n_params, &m) != STOF_OK) {
        fprintf(stderr, "example: %s\n", stof_last_error());
        return 1;
    }
    int n_in = stof_model_num_inputs(m), rc = 0, given = 0;
    stof_tensor_info in[8];
    stof_tensor_ref refs[8];
    void *bufs[8] = {0};
    for (int i = 0; i < n_in && i < 8; i++) {
        stof_tensor_info *t = &in[i];
        stof_model_input_info(m, i, t);
        printf("input %s: %s, %lld values%s\n", t->name, stof_dtype_name(t->dtype),
               (long long)numel(t), t->optional ? " (optional)" : "");
        if (t->optional)
            continue; /* an attention_mask left out: no padding */
        bufs[i] = calloc((size_t)numel(t), 4);
        for (int64_t k = 0; t->dtype == STOF_I32 && bufs[i] && k < numel(t); k++)
            ((int32_t *)bufs[i])[k] = (int32_t)(k % 100 + 1);
        refs[given++] = (stof_tensor_ref){t->name, bufs[i]};
    }
    stof_tensor_info out;
    stof_model_output_info(m, &out);
    float *y = malloc(sizeof *y * (size_t)numel(&out));
    if (!y || stof_model_run_cpu(m, refs, given, y) != STOF_OK) {
        fprintf(stderr, "example: %s\n", y ? stof_last_error() : "out of memory");
        rc = 1;
    } else {
        printf("output %s: %lld values, first %.5f %.5f %.5f\n", out.name,
               (long long)numel(&out), y[0], y[1], y[2]);
    }
    free(y);
    for (int i = 0; i < 8; i++)
        free(bufs[i]);
    stof_model_free(m);
    return rc;
}

int main(int argc, char **argv) {
    printf("stof %s\n", stof_version());
    stof_mask *mask = NULL;
    if (stof_mask_from_pattern("bigbird", 1, 1024, 1024, &mask) != STOF_OK) {
        fprintf(stderr, "example: %s\n", stof_last_error());
        return 1;
    }
    printf("bigbird at 1024 tokens: %.1f%% of the pairs attended\n",
           100.0 * stof_mask_density(mask));
    stof_mask_free(mask);
    stof_device_info dev;
    if (stof_device_query(0, &dev) == STOF_OK)
        printf("GPU 0: %s\n", dev.name);
    else
        printf("no GPU: %s\n", stof_last_error());
    return argc > 1 ? run_model(argv[1], (const char *const *)argv + 2, argc - 2) : 0;
}
