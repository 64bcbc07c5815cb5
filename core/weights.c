#include "core/weights.h"

#include "core/util.h"

float weights_round(stof_dtype dtype, float x) {
    switch (dtype) {
    case STOF_F16: return util_f16_to_f32(util_f32_to_f16(x));
    case STOF_BF16: return util_bf16_to_f32(util_f32_to_bf16(x));
    default: return x;
    }
}

void weights_fill(const graph_tensor *t, uint64_t seed, float *out) {
    uint64_t key = util_hash_str(util_mix64(seed), t->name);
    int64_t n = graph_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        float u = util_uniform(key, (uint64_t)i); /* [0, 1) */
        float v;
        switch (t->init) {
        case GRAPH_INIT_ZEROS: v = 0.0f; break;
        case GRAPH_INIT_ONES: v = 1.0f + t->init_scale * (2.0f * u - 1.0f); break;
        case GRAPH_INIT_TOKENS: {
            int64_t id = (int64_t)(u * (float)t->init_high);
            v = (float)(id < t->init_high ? id : t->init_high - 1);
            break;
        }
        case GRAPH_INIT_UNIFORM:
        default: v = t->init_scale * (2.0f * u - 1.0f); break;
        }
        out[i] = weights_round(t->dtype, v);
    }
}
