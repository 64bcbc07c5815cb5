/* Gated units and rotary position embeddings: the operators of the newer
 * encoders and decoders (ModernBERT's GeGLU and RoPE, Llama's SwiGLU).
 *
 *   glu     x [..., 2F] -> act(x[..., :F]) * x[..., F:]: the first half is the
 *           input, the second the gate (as Hugging Face chunks Wi's output);
 *   rotary  x [B, S, (H + 2 KVH) D], Q | K | V: every head of Q and K has the
 *           pairs (j, j + D/2) rotated by s * theta^(-2j/D), position s the
 *           row's index in the sequence or given by a positions input (a
 *           decode step's); V is copied. The angles are computed
 *           in double, so the reference is not the weak link. */
#include <math.h>

#include "core/base/error.h"
#include "ops/ops_impl.h"

/* ---- glu ----------------------------------------------------------------- */

int ops_glu_infer(OPS_INFER_ARGS) {
    const graph_tensor *x = ops_input(g, op, 0);
    int rc = ops_require_float(op, x, "x", err);
    if (rc)
        return rc;
    int act = op->attr.glu.act;
    if (act != OP_GLU_GELU && act != OP_GLU_GELU_TANH && act != OP_GLU_SILU)
        return ops_fail(op, err, STOF_ERR_INVALID, "unknown activation %d", act);
    if (ops_last_dim(x) % 2)
        return ops_fail(op, err, STOF_ERR_SHAPE, "x's last dim (%lld) must be even: the input "
                        "and the gate halves", (long long)ops_last_dim(x));
    ops_copy_shape(out, x);
    out->shape[out->ndim - 1] /= 2;
    return STOF_OK;
}

void ops_glu_cost(OPS_COST_ARGS) {
    ops_mi_cost(g, op, 11.0, flops, bytes);
}

static float glu_act(int act, float v) {
    if (act == OP_GLU_GELU)
        return op_gelu_erf(v);
    if (act == OP_GLU_GELU_TANH)
        return op_gelu_tanh(v);
    return (float)((double)v / (1.0 + exp(-(double)v))); /* silu */
}

int ops_glu_ref(OPS_REF_ARGS) {
    const graph_tensor *x = ops_input(g, op, 0);
    int64_t rows = ops_rows(x), f = ops_last_dim(x) / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *in_row = in[0] + r * 2 * f;
        for (int64_t j = 0; j < f; j++)
            out[r * f + j] = glu_act(op->attr.glu.act, in_row[j]) * in_row[f + j];
    }
    return STOF_OK;
}

/* ---- rotary -------------------------------------------------------------- */

int ops_rotary_infer(OPS_INFER_ARGS) {
    const graph_tensor *x = ops_input(g, op, 0);
    int rc = ops_require_float(op, x, "x", err);
    if (!rc)
        rc = ops_require_rank(op, x, "x", 3, 3, err);
    if (rc)
        return rc;
    int h = op->attr.rotary.heads, kvh = op->attr.rotary.kv_heads, d = op->attr.rotary.head_dim;
    float theta = op->attr.rotary.theta;
    if (h < 1 || kvh < 1 || h % kvh)
        return ops_fail(op, err, STOF_ERR_INVALID, "heads %d and kv_heads %d: both positive, "
                        "heads a multiple of kv_heads", h, kvh);
    if (d < 2 || d % 2)
        return ops_fail(op, err, STOF_ERR_INVALID, "head_dim must be even, got %d", d);
    if (!(isfinite(theta) && theta > 1.0f))
        return ops_fail(op, err, STOF_ERR_INVALID, "theta must be above 1, got %g", (double)theta);
    if (op->n_inputs != 1 + (op->attr.rotary.has_positions != 0))
        return ops_fail(op, err, STOF_ERR_INVALID, "takes %d inputs (x%s), got %d",
                        1 + (op->attr.rotary.has_positions != 0),
                        op->attr.rotary.has_positions ? ", positions" : "", op->n_inputs);
    if (op->attr.rotary.has_positions) {
        const graph_tensor *p = ops_input(g, op, 1);
        char ps[OPS_TENSOR_STR_MAX];
        if (p->dtype != STOF_I32 || p->ndim != 2 || p->shape[0] != x->shape[0] ||
            p->shape[1] != x->shape[1])
            return ops_fail(op, err, STOF_ERR_SHAPE, "positions %s must be int32 [%lld, %lld]",
                            ops_tensor_str(p, ps, sizeof ps), (long long)x->shape[0],
                            (long long)x->shape[1]);
    }
    int64_t want = (int64_t)(h + 2 * kvh) * d;
    if (ops_last_dim(x) != want)
        return ops_fail(op, err, STOF_ERR_SHAPE, "x has %lld features, but Q, K and V of %d, %d "
                        "and %d heads of %d need %lld", (long long)ops_last_dim(x), h, kvh, kvh,
                        d, (long long)want);
    ops_copy_shape(out, x);
    return STOF_OK;
}

void ops_rotary_cost(OPS_COST_ARGS) {
    ops_mi_cost(g, op, 4.0, flops, bytes);
}

void op_rotary_head(const float *x, float *y, int d, int64_t s, double theta) {
    int half = d / 2;
    for (int j = 0; j < half; j++) {
        double angle = (double)s * pow(theta, -2.0 * j / d);
        double c = cos(angle), sn = sin(angle), a = x[j], b = x[j + half];
        y[j] = (float)(a * c - b * sn);
        y[j + half] = (float)(b * c + a * sn);
    }
}

int ops_rotary_ref(OPS_REF_ARGS) {
    const graph_tensor *x = ops_input(g, op, 0);
    int64_t batch = x->shape[0], seq = x->shape[1], n = ops_last_dim(x);
    int d = op->attr.rotary.head_dim;
    int rotated = op->attr.rotary.heads + op->attr.rotary.kv_heads; /* Q and K heads */
    const float *positions = op->attr.rotary.has_positions ? in[1] : NULL;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t s = 0; s < seq; s++) {
            const float *xr = in[0] + (b * seq + s) * n;
            float *yr = out + (b * seq + s) * n;
            float at = positions ? positions[b * seq + s] : (float)s;
            if (!(at >= 0.0f && at < 16777216.0f && at == floorf(at)))
                return ops_fail(op, err, STOF_ERR_INVALID, "position %g at [%lld, %lld] is not "
                                "a non-negative integer", (double)at, (long long)b,
                                (long long)s);
            for (int hd = 0; hd < rotated; hd++)
                op_rotary_head(xr + (int64_t)hd * d, yr + (int64_t)hd * d, d, (int64_t)at,
                               op->attr.rotary.theta);
            for (int64_t j = (int64_t)rotated * d; j < n; j++)
                yr[j] = xr[j];
        }
    return STOF_OK;
}
