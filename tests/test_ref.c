/* The reference executor on a tiny BERT (2 layers, hidden 16, 2 heads,
 * sliding-window mask, batch 2, seq 9) against an independent, naive
 * computation written here from the model's definition. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/base/error.h"
#include "core/graph/graph.h"
#include "core/ref/ref.h"
#include "core/io/weights.h"
#include "ops/mask.h"
#include "ops/ops.h"

enum { B = 2, S = 9, H = 16, NH = 2, D = 8, F = 32, V = 50, L = 2, BAND = 2 };

static int add_weight(graph *g, const char *name, int64_t d0, int64_t d1, graph_init_kind init) {
    graph_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.role = GRAPH_WEIGHT;
    t.dtype = STOF_F32;
    t.ndim = d1 ? 2 : 1;
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.init = init;
    t.init_scale = init == GRAPH_INIT_ONES ? 0.1f : 0.3f;
    int id;
    stof_error err = {0};
    CHECK_MSG(graph_add_tensor(g, &t, &id, &err) == STOF_OK, "%s", err.msg);
    return id;
}

static int add_op(graph *g, op_kind kind, int a, int b, int c) {
    graph_op op;
    memset(&op, 0, sizeof op);
    op.kind = kind;
    op.inputs[0] = a;
    op.inputs[1] = b;
    op.inputs[2] = c;
    op.n_inputs = c >= 0 ? 3 : b >= 0 ? 2 : 1;
    if (kind == OP_LAYERNORM)
        op.attr.norm.eps = 1e-5f;
    int out;
    stof_error err = {0};
    CHECK_MSG(op_add(g, &op, &out, &err) == STOF_OK, "%s", err.msg);
    return out;
}

static int linear(graph *g, int x, const char *name, int out_f, int in_f) {
    char w[64], b[64];
    snprintf(w, sizeof w, "%.56s.w", name);
    snprintf(b, sizeof b, "%.56s.b", name);
    int y = add_op(g, OP_GEMM, x, add_weight(g, w, out_f, in_f, GRAPH_INIT_UNIFORM), -1);
    return add_op(g, OP_BIAS, y, add_weight(g, b, out_f, 0, GRAPH_INIT_UNIFORM), -1);
}

static int layernorm(graph *g, int x, const char *name) {
    char gn[64], bn[64];
    snprintf(gn, sizeof gn, "%.56s.g", name);
    snprintf(bn, sizeof bn, "%.56s.b", name);
    return add_op(g, OP_LAYERNORM, x, add_weight(g, gn, H, 0, GRAPH_INIT_ONES),
                  add_weight(g, bn, H, 0, GRAPH_INIT_UNIFORM));
}

static void build_tiny_bert(graph *g) {
    stof_error err = {0};
    graph_init(g);
    graph_tensor ids;
    memset(&ids, 0, sizeof ids);
    snprintf(ids.name, sizeof ids.name, "ids");
    ids.role = GRAPH_INPUT;
    ids.dtype = STOF_I32;
    ids.ndim = 2;
    ids.shape[0] = B;
    ids.shape[1] = S;
    ids.init = GRAPH_INIT_TOKENS;
    ids.init_high = V;
    int ids_id;
    graph_add_tensor(g, &ids, &ids_id, &err);
    mask_spec *spec = mask_spec_new(MASK_SLIDING);
    spec->band = BAND;
    mask *m = NULL;
    CHECK_MSG(mask_build(spec, B, S, S, &m, &err) == STOF_OK, "%s", err.msg);
    mask_spec_free(spec);
    int mask_id;
    graph_add_mask(g, m, mask_free, &mask_id, &err);

    graph_op emb;
    memset(&emb, 0, sizeof emb);
    emb.kind = OP_EMBEDDING;
    emb.inputs[0] = ids_id;
    emb.inputs[1] = add_weight(g, "word", V, H, GRAPH_INIT_UNIFORM);
    emb.inputs[2] = add_weight(g, "pos", S + 3, H, GRAPH_INIT_UNIFORM);
    emb.n_inputs = 3;
    emb.attr.embedding.has_position = 1;
    int x;
    CHECK_MSG(op_add(g, &emb, &x, &err) == STOF_OK, "%s", err.msg);
    x = layernorm(g, x, "emb.ln");
    for (int l = 0; l < L; l++) {
        char n[64];
        graph_begin_layer(g);
        snprintf(n, sizeof n, "l%d.qkv", l);
        int qkv = linear(g, x, n, 3 * H, H);
        graph_op at;
        memset(&at, 0, sizeof at);
        at.kind = OP_ATTENTION;
        at.inputs[0] = qkv;
        at.n_inputs = 1;
        at.attr.attn.heads = NH;
        at.attr.attn.head_dim = D;
        at.attr.attn.mask = mask_id;
        at.attr.attn.scale = 1.0f / sqrtf((float)D);
        int a;
        CHECK_MSG(op_add(g, &at, &a, &err) == STOF_OK, "%s", err.msg);
        snprintf(n, sizeof n, "l%d.o", l);
        int o = linear(g, a, n, H, H);
        snprintf(n, sizeof n, "l%d.ln1", l);
        x = layernorm(g, add_op(g, OP_ADD, o, x, -1), n);
        snprintf(n, sizeof n, "l%d.fc1", l);
        int h = add_op(g, OP_GELU, linear(g, x, n, F, H), -1, -1);
        snprintf(n, sizeof n, "l%d.fc2", l);
        o = linear(g, h, n, H, F);
        snprintf(n, sizeof n, "l%d.ln2", l);
        x = layernorm(g, add_op(g, OP_ADD, o, x, -1), n);
        graph_end_layer(g);
    }
    CHECK_EQ_INT(graph_set_output(g, x, &err), STOF_OK);
    CHECK_MSG(graph_validate(g, &err) == STOF_OK, "%s", err.msg);
}

/* ---- the naive model, in double, straight from the definition ---------- */

static double *weight(const graph *g, uint64_t seed, const char *name) {
    const graph_tensor *t = &g->tensors[graph_find_tensor(g, name)];
    int64_t n = graph_tensor_numel(t);
    float *f = malloc((size_t)n * sizeof *f);
    double *d = malloc((size_t)n * sizeof *d);
    weights_fill(t, seed, f);
    for (int64_t i = 0; i < n; i++)
        d[i] = f[i];
    free(f);
    return d;
}

static void naive_linear(const graph *g, uint64_t seed, const char *name, const double *x,
                         int rows, int in_f, int out_f, double *y) {
    char wn[64], bn[64];
    snprintf(wn, sizeof wn, "%.56s.w", name);
    snprintf(bn, sizeof bn, "%.56s.b", name);
    double *w = weight(g, seed, wn), *b = weight(g, seed, bn);
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < out_f; o++) {
            double s = b[o];
            for (int i = 0; i < in_f; i++)
                s += x[r * in_f + i] * w[o * in_f + i];
            y[r * out_f + o] = s;
        }
    free(w);
    free(b);
}

static void naive_layernorm(const graph *g, uint64_t seed, const char *name, double *x) {
    char gn[64], bn[64];
    snprintf(gn, sizeof gn, "%.56s.g", name);
    snprintf(bn, sizeof bn, "%.56s.b", name);
    double *ga = weight(g, seed, gn), *be = weight(g, seed, bn);
    for (int r = 0; r < B * S; r++) {
        double mean = 0, var = 0;
        for (int i = 0; i < H; i++)
            mean += x[r * H + i] / H;
        for (int i = 0; i < H; i++)
            var += (x[r * H + i] - mean) * (x[r * H + i] - mean) / H;
        for (int i = 0; i < H; i++)
            x[r * H + i] = (x[r * H + i] - mean) / sqrt(var + 1e-5) * ga[i] + be[i];
    }
    free(ga);
    free(be);
}

static void naive_attention(const double *qkv, double *out) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < S; i++) {
                double p[S], mx = -1e300, den = 0;
                for (int j = 0; j < S; j++) {
                    if (abs(i - j) > BAND) {
                        p[j] = -INFINITY;
                        continue;
                    }
                    double s = 0;
                    for (int d = 0; d < D; d++)
                        s += qkv[(b * S + i) * 3 * H + h * D + d] *
                             qkv[(b * S + j) * 3 * H + H + h * D + d];
                    p[j] = s / sqrt((double)D);
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int j = 0; j < S; j++) {
                    p[j] = isinf(p[j]) ? 0 : exp(p[j] - mx);
                    den += p[j];
                }
                for (int d = 0; d < D; d++) {
                    double s = 0;
                    for (int j = 0; j < S; j++)
                        s += p[j] / den * qkv[(b * S + j) * 3 * H + 2 * H + h * D + d];
                    out[(b * S + i) * H + h * D + d] = s;
                }
            }
}

static void naive_bert(const graph *g, uint64_t seed, double *x) {
    double *ids = weight(g, seed, "ids"), *word = weight(g, seed, "word"),
           *pos = weight(g, seed, "pos");
    for (int r = 0; r < B * S; r++)
        for (int i = 0; i < H; i++)
            x[r * H + i] = word[(int)ids[r] * H + i] + pos[(r % S) * H + i];
    free(ids);
    free(word);
    free(pos);
    naive_layernorm(g, seed, "emb.ln", x);
    double *qkv = malloc(sizeof(double) * B * S * 3 * H), *a = malloc(sizeof(double) * B * S * H),
           *o = malloc(sizeof(double) * B * S * H), *h = malloc(sizeof(double) * B * S * F);
    for (int l = 0; l < L; l++) {
        char n[64];
        snprintf(n, sizeof n, "l%d.qkv", l);
        naive_linear(g, seed, n, x, B * S, H, 3 * H, qkv);
        naive_attention(qkv, a);
        snprintf(n, sizeof n, "l%d.o", l);
        naive_linear(g, seed, n, a, B * S, H, H, o);
        for (int i = 0; i < B * S * H; i++)
            x[i] += o[i];
        snprintf(n, sizeof n, "l%d.ln1", l);
        naive_layernorm(g, seed, n, x);
        snprintf(n, sizeof n, "l%d.fc1", l);
        naive_linear(g, seed, n, x, B * S, H, F, h);
        for (int i = 0; i < B * S * F; i++)
            h[i] = 0.5 * h[i] * (1 + erf(h[i] / sqrt(2.0)));
        snprintf(n, sizeof n, "l%d.fc2", l);
        naive_linear(g, seed, n, h, B * S, F, H, o);
        for (int i = 0; i < B * S * H; i++)
            x[i] += o[i];
        snprintf(n, sizeof n, "l%d.ln2", l);
        naive_layernorm(g, seed, n, x);
    }
    free(qkv);
    free(a);
    free(o);
    free(h);
}

int main(void) {
    graph g;
    build_tiny_bert(&g);
    for (uint64_t seed = 1; seed <= 3; seed++) {
        stof_error err = {0};
        ref_values rv;
        weights_source src = weights_source_seeded(seed);
        CHECK_EQ_INT(ref_values_init(&g, &src, &rv, &err), STOF_OK);
        int rc = ref_execute(&g, &rv, &err);
        CHECK_MSG(rc == STOF_OK, "%s", err.msg);
        if (rc == STOF_OK) {
            double *want = malloc(sizeof(double) * B * S * H);
            naive_bert(&g, seed, want);
            double num = 0, den = 0;
            int finite = 1;
            for (int i = 0; i < B * S * H; i++) {
                double d = rv.data[g.output][i] - want[i];
                finite &= isfinite(rv.data[g.output][i]);
                num += d * d;
                den += want[i] * want[i];
            }
            CHECK(finite);
            CHECK_MSG(sqrt(num / den) < 1e-5, "seed %llu: relative error %.3g",
                      (unsigned long long)seed, sqrt(num / den));
            free(want);
            /* only the output (and inputs/weights) stay live at the end */
            int live_activations = 0;
            for (int t = 0; t < g.n_tensors; t++)
                live_activations += rv.data[t] && g.tensors[t].role == GRAPH_ACTIVATION;
            CHECK_EQ_INT(live_activations, 0);
        }
        ref_values_free(&rv);
    }
    graph_free(&g);
    return check_summary("test_ref");
}
