/* The GEMM-family kernels without a GPU: every template of gemm_exec
 * compiles through NVRTC for sm_80 and sm_90 at representative settings
 * (every epilogue of gemm_epilogue in both weight layouts at three tile
 * settings, fp16 and bf16; gemm_ln with each norm, bias, residual and
 * pre-norm store at three or four tile settings and rows of 512, 768, 1000
 * and 1024; gemm_chain with every activation, bias and residual at four
 * settings and outputs of 512, 768, 1000 and 1024; mi_chain with each
 * norm, with and without the pre-norm store; embedding with and without its
 * optional tables; glu with each activation; rotary at head sizes 64, 128
 * and 32 with grouped K/V heads; mask_rows), and the
 * CPU pieces of core/gemm_exec (validation, the parameter-space checks, the
 * shared memory model, requests, argument blocks) do what they say. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/exec/gemm/gemm_exec.h"
#include "core/exec/gemm/gemm_template.h"
#include "core/gpu/nvrtc.h"
#include "core/base/util.h"

#define SMEM_H100 (227 * 1024)
#define SMEM_A100 (163 * 1024)

static const char *archs[] = {"sm_80", "sm_90"};
static const stof_dtype dtypes[] = {STOF_F16, STOF_BF16};

/* BLOCK_M, BLOCK_N, BLOCK_K, WARPS, STAGES: the default, a small deep one,
 * the largest (192 KiB of shared memory, 128 accumulators a thread). */
static const int gemm_settings[][6] = {
    {128, 128, 32, 8, 3, 1}, {64, 64, 64, 4, 4, 1}, {128, 256, 64, 8, 4, 1},
    {64, 32, 64, 4, 6, 4}, {128, 64, 64, 8, 4, 2}};
#define N_GEMM_SETTINGS 5

/* ---- compiling ----------------------------------------------------------------------- */

typedef struct variant {
    gemm_exec_problem p;
    int values[FUSION_MAX_PARAMS];
    const char *arch;
    uint64_t key; /* nvrtc_key of its request: listed twice, compiled once */
    int rc;
    char msg[1400];
} variant;

static void compile_one(nvrtc_cache *c, variant *v) {
    gemm_exec_request r;
    gemm_exec_request_init(&r, &v->p, v->values, v->arch);
    const void *bin = NULL;
    size_t size = 0;
    stof_error err = {0};
    int rc = nvrtc_get(c, &r.req, &bin, &size, &err);
    int len = snprintf(v->msg, sizeof v->msg, "%s %s", r.req.source, v->arch);
    for (int i = 0; i < r.req.n_options && len > 0 && (size_t)len < sizeof v->msg; i++)
        len += snprintf(v->msg + len, sizeof v->msg - (size_t)len, " %s", r.req.options[i]);
    if (rc == STOF_OK && !(size > 4 && memcmp(bin, "\x7f" "ELF", 4) == 0)) {
        snprintf(err.msg, sizeof err.msg, "not a cubin");
        rc = STOF_ERR_COMPILE;
    }
    if (rc != STOF_OK && len > 0 && (size_t)len < sizeof v->msg)
        snprintf(v->msg + len, sizeof v->msg - (size_t)len, ": %s", err.msg);
    v->rc = rc;
}

typedef struct worker {
    variant *v;
    int n, stride, first;
} worker;

static void *compile_worker(void *arg) {
    worker *w = arg;
    nvrtc_cache c;
    nvrtc_cache_init(&c, "");
    for (int i = w->first; i < w->n; i += w->stride)
        compile_one(&c, &w->v[i]);
    nvrtc_cache_free(&c);
    return NULL;
}

#define N_WORKERS 8

static int compile_all(variant *v, int n) {
    pthread_t tid[N_WORKERS];
    worker w[N_WORKERS];
    int started = 0;
    for (int i = 0; i < N_WORKERS; i++) {
        w[i] = (worker){.v = v, .n = n, .stride = N_WORKERS, .first = i};
        if (pthread_create(&tid[i], NULL, compile_worker, &w[i]) != 0)
            compile_worker(&w[i]);
        else
            started |= 1 << i;
    }
    for (int i = 0; i < N_WORKERS; i++)
        if (started & (1 << i))
            pthread_join(tid[i], NULL);
    int ok = 0;
    for (int i = 0; i < n; i++) {
        CHECK_MSG(v[i].rc == STOF_OK, "%s", v[i].msg);
        ok += v[i].rc == STOF_OK;
    }
    return ok;
}

static gemm_exec_problem gemm_problem(stof_dtype dt, int weight_kn, int bias, fusion_act act,
                                      int residual) {
    gemm_exec_problem p = {.tmpl = FUSION_T_GEMM_EPILOGUE, .dtype = dt, .m = 1000, .n = 768,
                           .k = 768, .weight_kn = weight_kn};
    p.epi.has_bias = bias;
    p.epi.act = act;
    p.epi.has_residual = residual;
    return p;
}

/* Adds a variant after checking that its problem is valid and its setting
 * feasible on an H100 (a variant already listed is not added again). */
static void add(variant *v, int cap, int *n, const gemm_exec_problem *p, const int *values,
                const char *arch) {
    stof_error err = {0};
    int rc = gemm_exec_validate(p, &err);
    if (!rc)
        rc = gemm_exec_check(p, values, SMEM_H100, &err);
    CHECK_MSG(rc == STOF_OK, "a listed setting is infeasible: %s", err.msg);
    if (rc || *n >= cap)
        return;
    variant *x = &v[*n];
    memset(x, 0, sizeof *x);
    x->p = *p;
    memcpy(x->values, values, sizeof x->values);
    x->arch = arch;
    gemm_exec_request r;
    gemm_exec_request_init(&r, p, values, arch);
    x->key = nvrtc_key(&r.req);
    for (int i = 0; i < *n; i++)
        if (v[i].key == x->key)
            return;
    (*n)++;
}

/* gemm_epilogue: sm_90 every epilogue (bias x 4 activations x residual) in
 * both layouts, both dtypes, at every tile setting (a split of K: [N, K]
 * only, the plain and the full epilogue, which are the same code around
 * it); sm_80 the same at the first setting, the others with the plain and
 * the full epilogue (no split of K). */
static void list_gemm(variant *v, int cap, int *n) {
    for (int a = 0; a < 2; a++)
        for (int d = 0; d < 2; d++)
            for (int s = 0; s < N_GEMM_SETTINGS; s++)
                for (int kn = 0; kn < 2; kn++)
                    for (int bias = 0; bias < 2; bias++)
                        for (int act = FUSION_ACT_NONE; act <= FUSION_ACT_RELU; act++)
                            for (int res = 0; res < 2; res++) {
                                int full = bias && res && act == FUSION_ACT_GELU_TANH;
                                int plain = !bias && !res && act == FUSION_ACT_NONE;
                                if ((a == 0 && s > 0 && !full && !plain) ||
                                    (gemm_settings[s][5] > 1 && !full && !plain))
                                    continue;
                                int vals[FUSION_MAX_PARAMS] = {0};
                                memcpy(vals, gemm_settings[s], sizeof gemm_settings[s]);
                                gemm_exec_problem p =
                                    gemm_problem(dtypes[d], kn, bias, (fusion_act)act, res);
                                /* a split of K builds only as the wgmma kernel */
                                if (vals[5] > 1 && !gemm_exec_wgmma(&p, vals, archs[a]))
                                    continue;
                                add(v, cap, n, &p, vals, archs[a]);
                            }
}

/* gemm_ln: sm_90 at three settings (ROWS 32/16/16 with 8/4/8 warps) for
 * rows of 512, 768 and 1024 in both dtypes, the flags (bias, residual,
 * norm, pre-norm store, weight layout) rotating; every flag combination at
 * one setting; 64 rows of 768 and a row of 1000 (a partial column tile, an
 * unswizzled row buffer); sm_80 the full and the plain epilogue. */
static const int ln_settings[][5] = {{32, 128, 64, 8, 3}, {16, 64, 32, 4, 2}, {16, 128, 64, 8, 3}};

static gemm_exec_problem ln_problem(stof_dtype dt, int64_t n, int flags) {
    gemm_exec_problem p = {.tmpl = FUSION_T_GEMM_LN, .dtype = dt, .m = 1000, .n = n, .k = 768,
                           .eps = 1e-5f};
    p.epi.has_bias = flags & 1;
    p.epi.has_residual = (flags >> 1) & 1;
    p.epi.norm = (flags >> 2) & 1 ? FUSION_NORM_RMSNORM : FUSION_NORM_LAYERNORM;
    p.store_pre_norm = (flags >> 3) & 1;
    p.weight_kn = (flags >> 4) & 1;
    return p;
}

static void list_ln(variant *v, int cap, int *n) {
    static const int64_t widths[] = {512, 768, 1024};
    int turn = 0;
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < 3; s++)
            for (int w = 0; w < 3; w++, turn++) {
                gemm_exec_problem p = ln_problem(dtypes[d], widths[w], (turn * 7) % 32);
                int vals[FUSION_MAX_PARAMS] = {0};
                memcpy(vals, ln_settings[s], sizeof ln_settings[s]);
                add(v, cap, n, &p, vals, "sm_90");
            }
    for (int flags = 0; flags < 16; flags++) {
        gemm_exec_problem p = ln_problem(STOF_F16, 768, flags);
        int vals[FUSION_MAX_PARAMS] = {32, 128, 64, 8, 3};
        add(v, cap, n, &p, vals, "sm_90");
    }
    gemm_exec_problem p = ln_problem(STOF_BF16, 768, 31);
    int rows64[FUSION_MAX_PARAMS] = {64, 128, 32, 4, 2};
    add(v, cap, n, &p, rows64, "sm_90");
    p = ln_problem(STOF_F16, 1000, 11);
    int odd[FUSION_MAX_PARAMS] = {16, 128, 32, 4, 2};
    add(v, cap, n, &p, odd, "sm_90");
    for (int d = 0; d < 2; d++)
        for (int full = 0; full < 2; full++) {
            p = ln_problem(dtypes[d], 768, full ? 15 : 16);
            int vals[FUSION_MAX_PARAMS] = {32, 128, 64, 8, 3};
            add(v, cap, n, &p, vals, "sm_80");
        }
}

/* gemm_chain: sm_90 at three settings for outputs of 512 and 768 in both
 * dtypes, the flags (activation, biases, residual, weight layout) rotating;
 * every activation with and without the residual at one setting; 64-row
 * blocks (N 512), N 1024 and N 1000 (a partial slab); sm_80 the full and
 * the plain chain. */
static const int chain_settings[][5] = {
    {16, 128, 64, 8, 3}, {32, 64, 32, 8, 2}, {16, 64, 32, 4, 3}};

static gemm_exec_problem chain_problem(stof_dtype dt, int64_t n2, int flags) {
    gemm_exec_problem p = {.tmpl = FUSION_T_GEMM_CHAIN, .dtype = dt, .m = 128, .n = 3072,
                           .k = 768, .n2 = n2};
    p.epi.act = (fusion_act)(flags & 3);
    p.epi.has_bias = (flags >> 2) & 1;
    p.epi2.has_bias = (flags >> 3) & 1;
    p.epi2.has_residual = (flags >> 4) & 1;
    p.weight_kn = (flags >> 5) & 1;
    return p;
}

static void list_chain(variant *v, int cap, int *n) {
    static const int64_t widths[] = {512, 768};
    int turn = 0;
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < 3; s++)
            for (int w = 0; w < 2; w++, turn++) {
                gemm_exec_problem p = chain_problem(dtypes[d], widths[w], (turn * 11) % 64);
                int vals[FUSION_MAX_PARAMS] = {0};
                memcpy(vals, chain_settings[s], sizeof chain_settings[s]);
                add(v, cap, n, &p, vals, "sm_90");
            }
    for (int act = 0; act < 4; act++)
        for (int res = 0; res < 2; res++) {
            gemm_exec_problem p = chain_problem(STOF_F16, 768, act | 12 | res << 4);
            int vals[FUSION_MAX_PARAMS] = {16, 128, 64, 8, 3};
            add(v, cap, n, &p, vals, "sm_90");
        }
    gemm_exec_problem p = chain_problem(STOF_BF16, 512, 1 | 28 | 32);
    int rows64[FUSION_MAX_PARAMS] = {64, 128, 64, 8, 2};
    add(v, cap, n, &p, rows64, "sm_90");
    p = chain_problem(STOF_F16, 1024, 2 | 28);
    int wide[FUSION_MAX_PARAMS] = {16, 128, 64, 8, 3};
    add(v, cap, n, &p, wide, "sm_90");
    p = chain_problem(STOF_BF16, 1000, 3 | 20);
    int odd[FUSION_MAX_PARAMS] = {16, 64, 32, 4, 2};
    add(v, cap, n, &p, odd, "sm_90");
    for (int d = 0; d < 2; d++)
        for (int full = 0; full < 2; full++) {
            p = chain_problem(dtypes[d], 768, full ? 1 | 28 : 32);
            int vals[FUSION_MAX_PARAMS] = {16, 128, 64, 8, 3};
            add(v, cap, n, &p, vals, "sm_80");
        }
}

/* mi_chain: the GPU test's chains (bias+add+layernorm, add+layernorm,
 * add+rmsnorm, gelu) and the pre-norm store, at three thread layouts (a
 * warp a row, a block a row, a sub-warp a row), rows of 768 and 1000
 * (a partial last chunk), both dtypes and archs. */
static void list_mi(variant *v, int cap, int *n) {
    static const struct {
        int bias, res;
        fusion_act act;
        fusion_norm norm;
        int pre;
    } chains[] = {
        {1, 1, FUSION_ACT_NONE, FUSION_NORM_LAYERNORM, 0},
        {0, 1, FUSION_ACT_NONE, FUSION_NORM_LAYERNORM, 1},
        {0, 1, FUSION_ACT_NONE, FUSION_NORM_RMSNORM, 0},
        {0, 1, FUSION_ACT_NONE, FUSION_NORM_RMSNORM, 1},
        {0, 0, FUSION_ACT_GELU, FUSION_NORM_NONE, 0},
        {1, 0, FUSION_ACT_GELU_TANH, FUSION_NORM_NONE, 0},
        {1, 1, FUSION_ACT_RELU, FUSION_NORM_NONE, 0},
    };
    static const int layouts[][3] = {{4, 128, 8}, {1, 256, 4}, {8, 256, 2}};
    static const int widths[] = {768, 1000};
    for (int a = 0; a < 2; a++)
        for (int d = 0; d < 2; d++)
            for (size_t c = 0; c < sizeof chains / sizeof chains[0]; c++)
                for (int l = 0; l < 3; l++)
                    for (int w = 0; w < 2; w++) {
                        if (a == 0 && (l > 0 || w > 0))
                            continue;
                        gemm_exec_problem p = {.tmpl = FUSION_T_MI_CHAIN, .dtype = dtypes[d],
                                               .m = 1000, .n = widths[w], .eps = 1e-5f,
                                               .store_pre_norm = chains[c].pre};
                        p.epi = (fusion_epilogue){chains[c].bias, chains[c].act, chains[c].res,
                                                  chains[c].norm};
                        int vals[FUSION_MAX_PARAMS] = {layouts[l][0], layouts[l][1],
                                                       layouts[l][2]};
                        add(v, cap, n, &p, vals, archs[a]);
                    }
    /* an fp32 residual stream beside f16 / bf16: the stream read as x and stored as the
     * norm's input (add+layernorm), added and stored (add), started (add of two in the model's
     * dtype), normalized alone, and read as the residual (add+rmsnorm) */
    static const struct {
        int res;
        fusion_norm norm;
        int pre;
        unsigned f32;
    } streams[] = {
        {1, FUSION_NORM_LAYERNORM, 1, GEMM_F32_X | GEMM_F32_PRE_NORM},
        {1, FUSION_NORM_NONE, 0, GEMM_F32_X | GEMM_F32_Y},
        {1, FUSION_NORM_NONE, 0, GEMM_F32_Y},
        {0, FUSION_NORM_LAYERNORM, 0, GEMM_F32_X},
        {1, FUSION_NORM_RMSNORM, 1, GEMM_F32_RESIDUAL | GEMM_F32_PRE_NORM},
    };
    for (int d = 0; d < 2; d++)
        for (size_t c = 0; c < sizeof streams / sizeof streams[0]; c++)
            for (int l = 0; l < 3; l++)
                for (int w = 0; w < 2; w++) {
                    gemm_exec_problem p = {.tmpl = FUSION_T_MI_CHAIN, .dtype = dtypes[d],
                                           .m = 1000, .n = widths[w], .eps = 1e-5f,
                                           .store_pre_norm = streams[c].pre,
                                           .f32 = streams[c].f32};
                    p.epi = (fusion_epilogue){0, FUSION_ACT_NONE, streams[c].res,
                                              streams[c].norm};
                    int vals[FUSION_MAX_PARAMS] = {layouts[l][0], layouts[l][1], layouts[l][2]};
                    add(v, cap, n, &p, vals, archs[1]);
                }
}

/* embedding: with and without positions and types, VEC 8 and 1. */
static void list_embedding(variant *v, int cap, int *n) {
    for (int a = 0; a < 2; a++)
        for (int d = 0; d < 2; d++)
            for (int pos = 0; pos < 2; pos++)
                for (int type = 0; type < 3; type++)
                    for (int vec = 1; vec <= 8; vec *= 8) {
                        gemm_exec_problem p = {.tmpl = FUSION_T_EMBEDDING, .dtype = dtypes[d],
                                               .m = 512, .n = 768, .seq_len = 128,
                                               .vocab = 30522, .has_position = pos,
                                               .has_type = type != 0,
                                               .has_type_ids = type == 2, .type_vocab = 2};
                        int vals[FUSION_MAX_PARAMS] = {vec == 8 ? 256 : 128, vec};
                        add(v, cap, n, &p, vals, archs[a]);
                    }
}

/* glu: each activation, VEC 8 and 1; rotary: head sizes 64, 128 (grouped
 * K/V heads) and 32, VEC 8, 4 and 1. */
static void list_glu_rotary(variant *v, int cap, int *n) {
    static const int acts[] = {STOF_ACT_GELU, STOF_ACT_GELU_TANH, STOF_ACT_SILU};
    static const int heads[][3] = {{12, 12, 64}, {32, 8, 128}, {4, 4, 32}};
    for (int a = 0; a < 2; a++)
        for (int d = 0; d < 2; d++) {
            for (int k = 0; k < 3; k++)
                for (int vec = 1; vec <= 8; vec *= 8) {
                    gemm_exec_problem p = {.tmpl = FUSION_T_GLU, .dtype = dtypes[d], .m = 512,
                                           .n = 1152, .glu_act = acts[k]};
                    int vals[FUSION_MAX_PARAMS] = {vec == 8 ? 256 : 128, vec};
                    add(v, cap, n, &p, vals, archs[a]);
                }
            for (int h = 0; h < 3; h++) {
                gemm_exec_problem p = {.tmpl = FUSION_T_ROTARY, .dtype = dtypes[d], .m = 512,
                                       .seq_len = 128, .heads = heads[h][0],
                                       .kv_heads = heads[h][1], .head_dim = heads[h][2],
                                       .theta = 10000.0f};
                p.n = (int64_t)(p.heads + 2 * p.kv_heads) * p.head_dim;
                int vals[FUSION_MAX_PARAMS] = {256, h == 2 ? 1 : 8 >> h};
                add(v, cap, n, &p, vals, archs[a]);
            }
            gemm_exec_problem mr = {.tmpl = FUSION_T_MASK_ROWS, .dtype = dtypes[d], .m = 512,
                                    .n = 768};
            int mv[FUSION_MAX_PARAMS] = {256, 8};
            add(v, cap, n, &mr, mv, archs[a]);
        }
}

/* gemv: both layouts and dtypes, every epilogue flag, a LayerNorm or RMSNorm ahead or none, rows
 * of 1 to 16 in one block and split over blocks, the thread layouts of the search's extremes. */
static void list_gemv(variant *v, int cap, int *n) {
    static const int nk[][4] = {{1, 4, 4, 8}, {8, 8, 4, 8}, {16, 16, 8, 4}, {2, 64, 8, 2}};
    static const int kn[][4] = {{1, 16, 8, 8}, {8, 64, 8, 8}, {16, 8, 4, 4}, {4, 128, 4, 2}};
    for (int a = 0; a < 2; a++)
        for (int d = 0; d < 2; d++)
            for (int i = 0; i < 4; i++)
                for (int kn_ = 0; kn_ < 2; kn_++) {
                    const int *vals = kn_ ? kn[i] : nk[i];
                    gemm_exec_problem p = {.tmpl = FUSION_T_GEMV, .dtype = dtypes[d],
                                           .m = vals[0] == 2 ? 3 : vals[0], .n = 2304, .k = 768,
                                           .weight_kn = kn_};
                    p.epi.has_bias = (i + d) & 1;
                    p.epi.act = (fusion_act)((i + a) % 4);
                    p.epi.has_residual = i >= 2;
                    /* a norm ahead of the GEMM on every other variant, both kinds */
                    p.prologue = (i + kn_) & 1 ? (d ? FUSION_NORM_RMSNORM : FUSION_NORM_LAYERNORM)
                                               : FUSION_NORM_NONE;
                    p.eps = 1e-5f;
                    int full[FUSION_MAX_PARAMS] = {vals[0], vals[1], vals[2], vals[3]};
                    add(v, cap, n, &p, full, archs[a]);
                    /* [N, K] weights with an even count of features a warp: also a GLU after
                     * the GEMM (and its bias), each activation */
                    if (kn_ || (vals[1] / vals[2]) % 2)
                        continue;
                    static const int glus[] = {STOF_ACT_GELU, STOF_ACT_GELU_TANH, STOF_ACT_SILU};
                    p.epi.act = FUSION_ACT_NONE;
                    p.epi.has_residual = 0;
                    p.glu_act = glus[(i + a + d) % 3];
                    add(v, cap, n, &p, full, archs[a]);
                }
}

/* gemm_epilogue closing with a norm (sm_90 only, the wgmma build over
 * clusters holding whole rows): layernorm and rmsnorm, both dtypes, rows of
 * 512, 768 and 1024, the flags (bias, erf GELU, residual, pre-norm store)
 * rotating over five settings (one warpgroup or two, across or along N, K
 * whole or split). */
static const int norm_settings[][6] = {{64, 128, 64, 4, 6, 2}, {64, 64, 64, 4, 6, 1},
                                       {64, 256, 64, 8, 4, 4}, {128, 128, 64, 8, 4, 1},
                                       {64, 128, 64, 8, 6, 1}};

static gemm_exec_problem norm_problem(stof_dtype dt, int64_t n, int flags) {
    gemm_exec_problem p = gemm_problem(dt, 0, flags & 1, (flags >> 1) & 1 ? FUSION_ACT_GELU
                                                                          : FUSION_ACT_NONE,
                                       (flags >> 2) & 1);
    p.n = n;
    p.epi.norm = (flags >> 3) & 1 ? FUSION_NORM_RMSNORM : FUSION_NORM_LAYERNORM;
    p.store_pre_norm = (flags >> 4) & 1;
    p.eps = 1e-5f;
    return p;
}

static void list_norm(variant *v, int cap, int *n) {
    static const int64_t widths[] = {512, 768, 1024};
    int turn = 0;
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < 5; s++)
            for (int w = 0; w < 3; w++, turn++) {
                gemm_exec_problem p = norm_problem(dtypes[d], widths[w], (turn * 11) % 32);
                int vals[FUSION_MAX_PARAMS] = {0};
                memcpy(vals, norm_settings[s], sizeof norm_settings[s]);
                stof_error err = {0};
                if (gemm_exec_check(&p, vals, SMEM_H100, &err) == STOF_OK)
                    add(v, cap, n, &p, vals, "sm_90");
            }
}

static void test_variants_compile(void) {
    enum { CAP = 768 };
    variant *v = calloc(CAP, sizeof *v);
    CHECK(v != NULL);
    if (!v)
        return;
    int n = 0;
    list_gemm(v, CAP, &n);
    int n_gemm = n;
    list_ln(v, CAP, &n);
    int n_ln = n - n_gemm;
    list_norm(v, CAP, &n);
    int n_norm = n - n_gemm - n_ln;
    list_chain(v, CAP, &n);
    int n_chain = n - n_gemm - n_ln - n_norm;
    list_mi(v, CAP, &n);
    int n_mi = n - n_gemm - n_ln - n_norm - n_chain;
    list_embedding(v, CAP, &n);
    int n_embed = n - n_gemm - n_ln - n_norm - n_chain - n_mi;
    list_glu_rotary(v, CAP, &n);
    int n_glu = n - n_gemm - n_ln - n_norm - n_chain - n_mi - n_embed;
    list_gemv(v, CAP, &n);
    double t0 = util_now();
    int ok = compile_all(v, n);
    printf("compiled %d of %d variants (%d gemm_epilogue, %d gemm_ln, %d gemm_epilogue with a "
           "norm, %d gemm_chain, %d mi_chain, %d embedding, %d glu and rotary, %d gemv) in "
           "%.1f s\n", ok, n, n_gemm, n_ln, n_norm, n_chain, n_mi, n_embed, n_glu,
           n - n_gemm - n_ln - n_norm - n_chain - n_mi - n_embed - n_glu, util_now() - t0);
    CHECK(n_gemm >= 200);
    CHECK(n_ln >= 30);
    CHECK(n_norm >= 20);
    CHECK(n_chain >= 20);
    CHECK(n < CAP);
    free(v);
}

/* ---- validation -------------------------------------------------------------------------- */

static void expect(int rc, int want, const stof_error *err, const char *needle) {
    CHECK_EQ_INT(rc, want);
    if (needle && rc == want)
        CHECK_CONTAINS(err->msg, needle);
}

static void test_validate(void) {
    stof_error err = {0};
    gemm_exec_problem p = gemm_problem(STOF_F16, 0, 1, FUSION_ACT_GELU, 1);
    expect(gemm_exec_validate(&p, &err), STOF_OK, &err, NULL);
    p.n = 770;
    expect(gemm_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED, &err, "multiples of 8");
    p.n = 768;
    p.k = 12;
    expect(gemm_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED, &err, "multiples of 8");
    p.k = 768;
    p.m = 0;
    expect(gemm_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED, &err, "M = 0");
    p.m = 1;
    /* a closing norm: eps positive, [N, K] weights, and the pre-norm store
     * only with a norm; the wgmma build only (check_arch) */
    p.epi.norm = FUSION_NORM_LAYERNORM;
    expect(gemm_exec_validate(&p, &err), STOF_ERR_INVALID, &err, "eps must be positive");
    p.eps = 1e-5f;
    expect(gemm_exec_validate(&p, &err), STOF_OK, &err, NULL);
    p.weight_kn = 1;
    expect(gemm_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED, &err, "gemm_ln takes both");
    p.weight_kn = 0;
    const int norm_vals[6] = {64, 128, 64, 4, 6, 2}, mma_vals[6] = {64, 128, 32, 4, 3, 1};
    expect(gemm_exec_check_arch(&p, norm_vals, "sm_90", &err), STOF_OK, &err, NULL);
    expect(gemm_exec_check_arch(&p, norm_vals, "sm_80", &err), STOF_ERR_UNSUPPORTED, &err,
           "a norm runs on the wgmma build");
    expect(gemm_exec_check_arch(&p, mma_vals, "sm_90", &err), STOF_ERR_UNSUPPORTED, &err,
           "a norm runs on the wgmma build");
    expect(gemm_exec_check(&p, mma_vals, SMEM_H100, &err), STOF_ERR_UNSUPPORTED, &err,
           "cluster holding whole rows");
    CHECK_EQ_INT(gemm_exec_cluster(&p, norm_vals), 12); /* 768 / 128 column tiles x 2 */
    p.epi.norm = FUSION_NORM_NONE;
    CHECK_EQ_INT(gemm_exec_cluster(&p, norm_vals), 2);
    p.store_pre_norm = 1;
    expect(gemm_exec_validate(&p, &err), STOF_ERR_INVALID, &err, "store_pre_norm without");
    p.store_pre_norm = 0;
    p.dtype = STOF_F32;
    expect(gemm_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED, &err, "f16 or bf16");
    p.dtype = STOF_BF16;
    p.epi.act = (fusion_act)7;
    expect(gemm_exec_validate(&p, &err), STOF_ERR_INVALID, &err, "unknown activation");
    p.epi.act = FUSION_ACT_NONE;
    p.tmpl = FUSION_T_CUBLASLT;
    expect(gemm_exec_validate(&p, &err), STOF_ERR_INVALID, &err, "not template 1 (cublaslt)");

    /* gemm_ln: gemm [bias] [add] norm */
    gemm_exec_problem ln = ln_problem(STOF_F16, 768, 3);
    expect(gemm_exec_validate(&ln, &err), STOF_OK, &err, NULL);
    ln.epi.norm = FUSION_NORM_NONE;
    expect(gemm_exec_validate(&ln, &err), STOF_ERR_INVALID, &err, "layernorm or rmsnorm");
    ln.epi.norm = FUSION_NORM_RMSNORM;
    ln.epi.act = FUSION_ACT_GELU;
    expect(gemm_exec_validate(&ln, &err), STOF_ERR_INVALID, &err, "no activation");
    ln.epi.act = FUSION_ACT_NONE;
    ln.eps = -1.0f;
    expect(gemm_exec_validate(&ln, &err), STOF_ERR_INVALID, &err, "eps");
    ln.eps = 1e-6f;
    ln.n = 1004;
    expect(gemm_exec_validate(&ln, &err), STOF_ERR_UNSUPPORTED, &err, "gemm_ln: M = 1000, N = 1004");
    ln.n = 1000;
    expect(gemm_exec_validate(&ln, &err), STOF_OK, &err, NULL);
    ln.dtype = STOF_F32;
    expect(gemm_exec_validate(&ln, &err), STOF_ERR_UNSUPPORTED, &err, "f16 or bf16");

    /* gemm_chain: gemm [bias] [act] gemm [bias] [add] */
    gemm_exec_problem ch = chain_problem(STOF_BF16, 768, 1 | 28);
    expect(gemm_exec_validate(&ch, &err), STOF_OK, &err, NULL);
    ch.n2 = 0;
    expect(gemm_exec_validate(&ch, &err), STOF_ERR_UNSUPPORTED, &err, "N2 = 0");
    ch.n2 = 772;
    expect(gemm_exec_validate(&ch, &err), STOF_ERR_UNSUPPORTED, &err, "multiple of 8");
    ch.n2 = 768;
    ch.n = 3076;
    expect(gemm_exec_validate(&ch, &err), STOF_ERR_UNSUPPORTED, &err, "N = F");
    ch.n = 3072;
    ch.epi.has_residual = 1;
    expect(gemm_exec_validate(&ch, &err), STOF_ERR_INVALID, &err, "after the second GEMM");
    ch.epi.has_residual = 0;
    ch.epi2.act = FUSION_ACT_RELU;
    expect(gemm_exec_validate(&ch, &err), STOF_ERR_INVALID, &err, "between the GEMMs");
    ch.epi2.act = (fusion_act)9;
    expect(gemm_exec_validate(&ch, &err), STOF_ERR_INVALID, &err, "unknown activation 9");
    ch.epi2.act = FUSION_ACT_NONE;
    ch.epi2.norm = FUSION_NORM_LAYERNORM;
    expect(gemm_exec_validate(&ch, &err), STOF_ERR_INVALID, &err, "no norm");
    ch.epi2.norm = FUSION_NORM_NONE;
    ch.store_pre_norm = 1;
    expect(gemm_exec_validate(&ch, &err), STOF_ERR_INVALID, &err, "no norm");

    gemm_exec_problem mi = {.tmpl = FUSION_T_MI_CHAIN, .dtype = STOF_F16, .m = 4, .n = 768,
                            .eps = 1e-5f, .store_pre_norm = 1};
    expect(gemm_exec_validate(&mi, &err), STOF_ERR_INVALID, &err, "store_pre_norm");
    mi.epi.norm = FUSION_NORM_RMSNORM;
    expect(gemm_exec_validate(&mi, &err), STOF_OK, &err, NULL);
    mi.eps = 0.0f;
    expect(gemm_exec_validate(&mi, &err), STOF_ERR_INVALID, &err, "eps");

    gemm_exec_problem e = {.tmpl = FUSION_T_EMBEDDING, .dtype = STOF_BF16, .m = 300, .n = 768,
                           .seq_len = 128, .vocab = 100};
    expect(gemm_exec_validate(&e, &err), STOF_ERR_INVALID, &err, "multiple of seq_len");
    e.m = 256;
    expect(gemm_exec_validate(&e, &err), STOF_OK, &err, NULL);
}

/* ---- parameter spaces ----------------------------------------------------------------- */

/* Over the whole space of t for p: a feasible setting's shared memory is
 * the template's model exactly (one byte less fails); an infeasible one
 * says why, in one of the words of `reasons`. Returns the feasible count. */
static long check_space(const gemm_exec_problem *p, const char *const *reasons, int n_reasons) {
    const fusion_template *t = fusion_template_get(p->tmpl);
    stof_error err = {0};
    long ok = 0;
    for (long s = 0; s < fusion_template_settings(t); s++) {
        int vals[FUSION_MAX_PARAMS] = {0};
        fusion_template_setting(t, s, vals);
        size_t smem = gemm_exec_smem(p, vals);
        int rc = gemm_exec_check(p, vals, smem > SMEM_H100 ? SMEM_H100 : (int)smem, &err);
        if (rc == STOF_OK) {
            ok++;
            rc = gemm_exec_check(p, vals, (int)smem - 1, &err);
            CHECK_MSG(rc == STOF_ERR_UNSUPPORTED && strstr(err.msg, "shared memory"),
                      "%s setting %ld: %zu bytes pass with one byte less", t->name, s, smem);
        } else {
            int named = 0;
            for (int i = 0; i < n_reasons; i++)
                named |= strstr(err.msg, reasons[i]) != NULL;
            CHECK_MSG(named, "%s setting %ld: %s", t->name, s, err.msg);
        }
    }
    return ok;
}

/* gemm_ln and gemm_chain: the models, the warp grids, the register budget. */
static void test_check_fused(void) {
    static const char *const reasons[] = {"shared memory", "accumulators", "16x16 pieces"};
    stof_error err = {0};
    gemm_exec_problem ln = ln_problem(STOF_F16, 768, 3);
    CHECK(check_space(&ln, reasons, 3) >= 30);
    /* 32 x 128 x 64 in 3 stages (61440 B) + 32 rows of 768 fp32 (98304 B) */
    int v[FUSION_MAX_PARAMS] = {32, 128, 64, 8, 3};
    CHECK_EQ_INT(gemm_exec_smem(&ln, v), 159744);
    ln.n = 1024; /* 64 rows of 1024 fp32 are 256 KiB */
    int big[FUSION_MAX_PARAMS] = {64, 128, 32, 8, 2};
    expect(gemm_exec_check(&ln, big, SMEM_H100, &err), STOF_ERR_UNSUPPORTED, &err,
           "64 rows of 1024");
    ln.n = 768; /* fits an H100, not an A100 */
    expect(gemm_exec_check(&ln, big, SMEM_H100, &err), STOF_OK, &err, NULL);
    expect(gemm_exec_check(&ln, big, SMEM_A100, &err), STOF_ERR_UNSUPPORTED, &err,
           "shared memory");
    int thin[FUSION_MAX_PARAMS] = {16, 64, 32, 8, 2}; /* 8 warps, 4 16x16 pieces */
    expect(gemm_exec_check(&ln, thin, SMEM_H100, &err), STOF_ERR_UNSUPPORTED, &err,
           "8 warps cannot split a 16x64 tile");
    int off[FUSION_MAX_PARAMS] = {128, 64, 32, 4, 2};
    expect(gemm_exec_check(&ln, off, SMEM_H100, &err), STOF_ERR_INVALID, &err,
           "ROWS = 128 is not in its space");
    ln.n = 4096; /* no setting holds 16 rows of 4096 fp32 and its tiles in 227 KiB... */
    CHECK(check_space(&ln, reasons, 3) == 0);
    ln.n = 3072; /* ...of 3072 some do */
    CHECK(check_space(&ln, reasons, 3) > 0);

    gemm_exec_problem ch = chain_problem(STOF_F16, 768, 1 | 28);
    CHECK(check_space(&ch, reasons, 3) >= 20);
    /* 3 x (16 + 128) x 64 + 16 x 128 + 2 x 128 x 64 elements */
    int cv[FUSION_MAX_PARAMS] = {16, 128, 64, 8, 3};
    CHECK_EQ_INT(gemm_exec_smem(&ch, cv), 2 * (3 * 144 * 64 + 16 * 128 + 2 * 128 * 64));
    expect(gemm_exec_check(&ch, cv, SMEM_H100, &err), STOF_OK, &err, NULL);
    /* 64 x 768 outputs over 8 warps: 192 accumulators a thread */
    int tall[FUSION_MAX_PARAMS] = {64, 128, 64, 8, 2};
    expect(gemm_exec_check(&ch, tall, SMEM_H100, &err), STOF_ERR_UNSUPPORTED, &err,
           "registers a thread");
    ch.n2 = 512; /* 128: the budget exactly */
    expect(gemm_exec_check(&ch, tall, SMEM_H100, &err), STOF_OK, &err, NULL);
    int narrow[FUSION_MAX_PARAMS] = {16, 32, 32, 4, 2};
    expect(gemm_exec_check(&ch, narrow, SMEM_H100, &err), STOF_ERR_UNSUPPORTED, &err,
           "4 warps cannot split a 16x32 tile");
    int stages[FUSION_MAX_PARAMS] = {16, 64, 32, 4, 4};
    expect(gemm_exec_check(&ch, stages, SMEM_H100, &err), STOF_ERR_INVALID, &err,
           "STAGES = 4 is not in its space");
}

static void test_check(void) {
    stof_error err = {0};
    gemm_exec_problem g = gemm_problem(STOF_F16, 0, 1, FUSION_ACT_NONE, 0);
    int big[FUSION_MAX_PARAMS] = {128, 256, 64, 8, 4, 1};
    /* 4 x (128 + 256) x 64 x 2 = 196608 bytes, the 1024 of the wgmma
     * build's alignment and the persistent build's staging: a block that
     * has an SM to itself, so STOF_GEMM_STORE_BUFS buffers of 16 x 32
     * elements for each of 8 warps. An H100 but not an A100. */
    const int staging = 8 * STOF_GEMM_STORE_BUFS * 16 * 32 * 2;
    CHECK_EQ_INT(gemm_exec_smem(&g, big), 196608 + 1024 + staging);
    expect(gemm_exec_check(&g, big, SMEM_H100, &err), STOF_OK, &err, NULL);
    char needle[64];
    snprintf(needle, sizeof needle, "%d bytes of shared memory", 196608 + 1024 + staging);
    expect(gemm_exec_check(&g, big, SMEM_A100, &err), STOF_ERR_UNSUPPORTED, &err, needle);
    /* a split of K, or a norm, stores from the fragments: no staging */
    int big_split[FUSION_MAX_PARAMS] = {128, 256, 64, 8, 4, 2};
    CHECK_EQ_INT(gemm_exec_smem(&g, big_split), 196608 + 1024);
    gemm_exec_problem normed = g;
    normed.epi.norm = FUSION_NORM_LAYERNORM;
    CHECK_EQ_INT(gemm_exec_smem(&normed, big), 196608 + 1024);
    /* two blocks of the large-M default still fit an SM (2 x 105 KiB): one
     * buffer a warp */
    int dflt[FUSION_MAX_PARAMS] = {128, 128, 64, 8, 3, 1};
    CHECK_EQ_INT(gemm_exec_smem(&g, dflt), 3 * 256 * 64 * 2 + 1024 + 8 * 16 * 32 * 2);
    /* BLOCK_K 32: mma.sync only, no slack */
    int narrow_k[FUSION_MAX_PARAMS] = {128, 256, 32, 8, 4, 1};
    CHECK_EQ_INT(gemm_exec_smem(&g, narrow_k), 4 * 384 * 32 * 2);
    /* the kernel's dynamic shared memory is the template's model exactly */
    fusion_dims d;
    gemm_exec_dims(&g, &d);
    const fusion_template *t = fusion_template_get(FUSION_T_GEMM_EPILOGUE);
    long ok_settings = 0;
    for (long s = 0; s < fusion_template_settings(t); s++) {
        int vals[FUSION_MAX_PARAMS] = {0};
        fusion_template_setting(t, s, vals);
        size_t smem = gemm_exec_smem(&g, vals);
        int rc = gemm_exec_check(&g, vals, (int)smem, &err);
        if (rc == STOF_OK) {
            ok_settings++;
            CHECK_EQ_INT(gemm_exec_check(&g, vals, (int)smem - 1, &err), STOF_ERR_UNSUPPORTED);
        } else if (!strstr(err.msg, "a split of K")) {
            CHECK_CONTAINS(err.msg, "accumulators");
        }
    }
    CHECK(ok_settings > 40);
    /* 128 x 256 accumulators on 4 warps: 256 registers a thread */
    int regs[FUSION_MAX_PARAMS] = {128, 256, 32, 4, 2, 1};
    expect(gemm_exec_check(&g, regs, SMEM_H100, &err), STOF_ERR_UNSUPPORTED, &err,
           "registers a thread");
    int off[FUSION_MAX_PARAMS] = {32, 64, 32, 4, 2};
    expect(gemm_exec_check(&g, off, SMEM_H100, &err), STOF_ERR_INVALID, &err,
           "BLOCK_M = 32 is not in its space");
    int stages[FUSION_MAX_PARAMS] = {64, 64, 32, 4, 5, 1};
    expect(gemm_exec_check(&g, stages, SMEM_H100, &err), STOF_ERR_INVALID, &err, "STAGES = 5");
    /* a split of K: the wgmma build's, dividing a warpgroup's 8-column tiles */
    int split4[FUSION_MAX_PARAMS] = {64, 32, 64, 4, 6, 4};
    expect(gemm_exec_check(&g, split4, SMEM_H100, &err), STOF_OK, &err, NULL);
    int split_mma[FUSION_MAX_PARAMS] = {128, 256, 32, 8, 4, 2};
    expect(gemm_exec_check(&g, split_mma, SMEM_H100, &err), STOF_ERR_UNSUPPORTED, &err,
           "a split of K runs on the wgmma build");
    int split_two_stages[FUSION_MAX_PARAMS] = {64, 64, 64, 4, 2, 2};
    expect(gemm_exec_check(&g, split_two_stages, SMEM_H100, &err), STOF_ERR_UNSUPPORTED, &err,
           "a split of K");
    int split3[FUSION_MAX_PARAMS] = {64, 64, 64, 4, 3, 3};
    expect(gemm_exec_check(&g, split3, SMEM_H100, &err), STOF_ERR_INVALID, &err,
           "SPLIT_K = 3 is not in its space");

    test_check_fused();

    gemm_exec_problem mi = {.tmpl = FUSION_T_MI_CHAIN, .dtype = STOF_F16, .m = 4, .n = 1004,
                            .eps = 1e-5f};
    mi.epi.norm = FUSION_NORM_LAYERNORM;
    int v8[FUSION_MAX_PARAMS] = {4, 128, 8};
    expect(gemm_exec_check(&mi, v8, SMEM_H100, &err), STOF_ERR_UNSUPPORTED, &err,
           "VEC 8 does not divide");
    int v4[FUSION_MAX_PARAMS] = {4, 128, 4};
    expect(gemm_exec_check(&mi, v4, SMEM_H100, &err), STOF_OK, &err, NULL);
    mi.n = 1024;
    int many[FUSION_MAX_PARAMS] = {8, 64, 1}; /* 8 threads a row: 128 elements each */
    expect(gemm_exec_check(&mi, many, SMEM_H100, &err), STOF_ERR_UNSUPPORTED, &err,
           "keeps in registers");
    mi.n = 8192; /* the model: 8 rows of 8192 fp32 = 256 KiB */
    int rows8[FUSION_MAX_PARAMS] = {8, 512, 8};
    expect(gemm_exec_check(&mi, rows8, SMEM_H100, &err), STOF_ERR_UNSUPPORTED, &err,
           "shared memory");
    /* 8 rows of 4096 fp32 (128 KiB) over a 64 KiB limit; without a norm
     * nothing is held for a row reduction and the model does not apply */
    mi.n = 4096;
    expect(gemm_exec_check(&mi, rows8, 64 * 1024, &err), STOF_ERR_UNSUPPORTED, &err,
           "shared memory");
    mi.epi.norm = FUSION_NORM_NONE;
    expect(gemm_exec_check(&mi, rows8, 64 * 1024, &err), STOF_OK, &err, NULL);

    gemm_exec_problem e = {.tmpl = FUSION_T_EMBEDDING, .dtype = STOF_F16, .m = 128, .n = 100,
                           .seq_len = 128, .vocab = 10};
    int ev[FUSION_MAX_PARAMS] = {256, 8};
    expect(gemm_exec_check(&e, ev, SMEM_H100, &err), STOF_ERR_UNSUPPORTED, &err,
           "VEC 8 does not divide");
    int ev4[FUSION_MAX_PARAMS] = {256, 4};
    expect(gemm_exec_check(&e, ev4, SMEM_H100, &err), STOF_OK, &err, NULL);
}

/* The default settings pass the checks on the GPU test's problems. */
static void test_defaults_fused(void) {
    static const int64_t ms[] = {1, 7, 16, 100, 128, 512, 1000, 4096, 16384};
    static const int64_t ns[] = {512, 768, 1000, 1024, 1280, 1600, 2048};
    for (int i = 0; i < 9; i++)
        for (int j = 0; j < 7; j++) {
            gemm_exec_problem ln = ln_problem(STOF_BF16, ns[j], 15);
            ln.m = ms[i];
            gemm_exec_problem ch = chain_problem(STOF_F16, ns[j], 1 | 28);
            ch.m = ms[i];
            ch.n = 4 * ns[j];
            ch.k = ns[j];
            const gemm_exec_problem *ps[] = {&ln, &ch};
            for (int t = 0; t < 2; t++) {
                int vals[FUSION_MAX_PARAMS];
                gemm_exec_default_values(ps[t], "sm_90", vals);
                stof_error err = {0};
                int rc = gemm_exec_check(ps[t], vals, SMEM_H100, &err);
                CHECK_MSG(rc == STOF_OK, "default for %s M=%lld N=%lld: %s",
                          t ? "gemm_chain" : "gemm_ln", (long long)ms[i], (long long)ns[j],
                          err.msg);
            }
        }
}

/* At a few hundred rows on sm_90, gemm_epilogue's default is the wgmma
 * build's 64 x 32 tile with K split until about 192 blocks run (bert-base's
 * four GEMMs at M = 128), above them its persistent 128 x 128 x 64 tile;
 * elsewhere (sm_80, [K, N] weights) mma.sync's 128 x 128 x 32 tile. */
static void test_defaults_small_m(void) {
    static const struct {
        int64_t m, n, k;
        const char *arch;
        int weight_kn, want[6];
    } cases[] = {
        {128, 2304, 768, "sm_90", 0, {64, 32, 64, 4, 6, 2}},
        {128, 768, 768, "sm_90", 0, {64, 32, 64, 4, 6, 4}},
        {128, 3072, 768, "sm_90", 0, {64, 32, 64, 4, 6, 1}},
        {128, 768, 3072, "sm_90", 0, {64, 32, 64, 4, 6, 4}},
        {1, 768, 256, "sm_90", 0, {64, 32, 64, 4, 6, 2}}, /* 4 slices of K: 2 a block */
        {1, 768, 128, "sm_90", 0, {64, 32, 64, 4, 6, 1}},
        {128, 768, 768, "sm_80", 0, {128, 128, 32, 8, 3, 1}},
        {128, 768, 768, "sm_90", 1, {128, 128, 32, 8, 3, 1}}, /* [K, N]: no wgmma */
        {4096, 768, 768, "sm_90", 0, {128, 128, 64, 8, 3, 1}}, /* persistent wgmma */
        {4096, 768, 768, "sm_80", 0, {128, 128, 32, 8, 3, 1}},
        {4096, 768, 768, "sm_90", 1, {128, 128, 32, 8, 3, 1}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gemm_exec_problem p = {.tmpl = FUSION_T_GEMM_EPILOGUE, .dtype = STOF_F16,
                               .m = cases[i].m, .n = cases[i].n, .k = cases[i].k,
                               .weight_kn = cases[i].weight_kn};
        int vals[FUSION_MAX_PARAMS];
        gemm_exec_default_values(&p, cases[i].arch, vals);
        CHECK_MSG(memcmp(vals, cases[i].want, sizeof cases[i].want) == 0,
                  "case %zu: default %dx%dx%d w%d s%d split %d", i, vals[0], vals[1], vals[2],
                  vals[3], vals[4], vals[5]);
        stof_error err = {0};
        CHECK_EQ_INT(gemm_exec_check(&p, vals, SMEM_H100, &err), STOF_OK);
    }
}

/* gemm_epilogue with a norm: one warpgroup of 64 rows at a few hundred
 * rows (two of 128 above), 6 stages, 128 columns unless the row needs
 * another width, K split while the cluster has room; feasible at every
 * size the models have. */
static void test_defaults_norm(void) {
    static const struct {
        int64_t m, n, k;
        int want[6];
    } cases[] = {
        {128, 768, 768, {64, 128, 64, 4, 6, 2}},    /* 24 blocks, K in halves */
        {128, 768, 3072, {64, 128, 64, 4, 6, 2}},   /* cluster 12 */
        {128, 1024, 4096, {64, 128, 64, 4, 6, 2}},  /* cluster 16 */
        {128, 512, 2048, {64, 128, 64, 4, 6, 4}},   /* cluster 16 */
        {4096, 768, 768, {128, 128, 64, 8, 6, 1}},  /* 192 blocks already: K whole */
        {7, 1000, 768, {64, 0, 0, 0, 0, 0}},        /* no width divides 1000: none */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gemm_exec_problem p = {.tmpl = FUSION_T_GEMM_EPILOGUE, .dtype = STOF_F16,
                               .m = cases[i].m, .n = cases[i].n, .k = cases[i].k, .eps = 1e-5f};
        p.epi.norm = FUSION_NORM_LAYERNORM;
        p.epi.has_residual = 1;
        int vals[FUSION_MAX_PARAMS];
        gemm_exec_default_values(&p, "sm_90", vals);
        stof_error err = {0};
        int rc = gemm_exec_check(&p, vals, SMEM_H100, &err);
        if (cases[i].want[1] == 0) {
            CHECK_MSG(rc != STOF_OK, "case %zu: a default for rows of 1000", i);
            continue;
        }
        CHECK_MSG(memcmp(vals, cases[i].want, sizeof cases[i].want) == 0,
                  "case %zu: default %dx%dx%d w%d s%d split %d", i, vals[0], vals[1], vals[2],
                  vals[3], vals[4], vals[5]);
        CHECK_MSG(rc == STOF_OK, "case %zu: %s", i, err.msg);
        CHECK_EQ_INT(gemm_exec_check_arch(&p, vals, "sm_90", &err), STOF_OK);
    }
}

static void test_defaults(void) {
    test_defaults_fused();
    test_defaults_norm();
    static const int64_t ms[] = {1, 7, 64, 1000, 4096};
    static const int64_t ns[] = {512, 768, 1000, 1024, 2304, 3072, 4096, 8192};
    for (int a = 0; a < 2; a++)
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 8; j++)
                for (int t = 0; t < 3; t++) {
                    fusion_template_id id = t == 0 ? FUSION_T_GEMM_EPILOGUE
                                            : t == 1 ? FUSION_T_MI_CHAIN
                                                     : FUSION_T_EMBEDDING;
                    gemm_exec_problem p = {.tmpl = id, .dtype = STOF_BF16, .m = ms[i], .n = ns[j],
                                           .k = 1024, .eps = 1e-6f, .seq_len = 1, .vocab = 5};
                    p.epi.norm = t == 1 ? FUSION_NORM_LAYERNORM : FUSION_NORM_NONE;
                    int vals[FUSION_MAX_PARAMS];
                    gemm_exec_default_values(&p, archs[a], vals);
                    stof_error err = {0};
                    int rc = gemm_exec_check(&p, vals, SMEM_H100, &err);
                    if (rc == STOF_OK)
                        rc = gemm_exec_check_arch(&p, vals, archs[a], &err);
                    CHECK_MSG(rc == STOF_OK, "default for template %d M=%lld N=%lld on %s: %s", t,
                              (long long)ms[i], (long long)ns[j], archs[a], err.msg);
                }
    test_defaults_small_m();
}

/* ---- requests and argument blocks ---------------------------------------------------------- */

static int has_option(const gemm_exec_request *r, const char *opt) {
    for (int i = 0; i < r->req.n_options; i++)
        if (strcmp(r->req.options[i], opt) == 0)
            return 1;
    return 0;
}

/* gemm_epilogue builds with wgmma on sm_90 exactly when the setting is whole
 * warpgroups (BLOCK_K 64, 3 or more stages, 64-row pieces of one wgmma N)
 * and the weight is [N, K]; the request then targets sm_90a. */
static void test_request_wgmma(void) {
    gemm_exec_problem g = gemm_problem(STOF_F16, 0, 1, FUSION_ACT_GELU, 0);
    /* 2 x 1 warpgroups of 64 x 256; one of 64 x 64; 1 x 2 of 64 x 64; 2 x 1 of 64 x 128 */
    const int yes[][6] = {{128, 256, 64, 8, 4, 1}, {64, 64, 64, 4, 6, 1},
                          {64, 128, 64, 8, 3, 1}, {128, 128, 64, 8, 3, 2}};
    const int no[][6] = {{128, 256, 32, 8, 4, 1},  /* BLOCK_K 32 */
                         {64, 64, 64, 4, 2, 1},    /* two stages */
                         {128, 128, 64, 4, 3, 1}}; /* one warpgroup, 128 rows */
    for (int i = 0; i < 4; i++) {
        CHECK_MSG(gemm_exec_wgmma(&g, yes[i], "sm_90"), "setting %d", i);
        CHECK(!gemm_exec_wgmma(&g, yes[i], "sm_80"));
        gemm_exec_request r;
        gemm_exec_request_init(&r, &g, yes[i], "sm_90");
        CHECK(strcmp(r.req.arch, "sm_90a") == 0 && has_option(&r, "-DWGMMA=1"));
        gemm_exec_request_init(&r, &g, yes[i], "sm_80");
        CHECK(strcmp(r.req.arch, "sm_80") == 0 && !has_option(&r, "-DWGMMA=1"));
    }
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(!gemm_exec_wgmma(&g, no[i], "sm_90"), "setting %d", i);
        gemm_exec_request r;
        gemm_exec_request_init(&r, &g, no[i], "sm_90");
        CHECK(strcmp(r.req.arch, "sm_90") == 0 && !has_option(&r, "-DWGMMA=1"));
    }
    /* a [K, N] weight (kn = true) keeps mma.sync */
    gemm_exec_problem kn = gemm_problem(STOF_F16, 1, 1, FUSION_ACT_GELU, 0);
    CHECK(!gemm_exec_wgmma(&kn, yes[0], "sm_90"));
    /* the other templates never */
    gemm_exec_problem ln = {.tmpl = FUSION_T_GEMM_LN, .dtype = STOF_F16};
    CHECK(!gemm_exec_wgmma(&ln, yes[0], "sm_90"));
}

static void test_request(void) {
    gemm_exec_problem g = gemm_problem(STOF_BF16, 1, 1, FUSION_ACT_GELU_TANH, 1);
    int vals[FUSION_MAX_PARAMS] = {64, 128, 32, 4, 2, 1};
    gemm_exec_request r;
    gemm_exec_request_init(&r, &g, vals, "sm_90");
    CHECK(strcmp(r.req.source, "gemm_epilogue.cu") == 0);
    CHECK(strcmp(r.req.arch, "sm_90") == 0);
    const char *want[] = {"-DBLOCK_M=64", "-DBLOCK_N=128", "-DBLOCK_K=32", "-DWARPS=4",
                          "-DSTAGES=2", "-DSTOF_DTYPE=2", "-DWEIGHT_KN=1", "-DHAS_BIAS=1",
                          "-DACT=2", "-DHAS_RESIDUAL=1"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK_MSG(has_option(&r, want[i]), "missing %s", want[i]);
    /* a different epilogue is a different kernel */
    gemm_exec_request r2;
    g.epi.act = FUSION_ACT_GELU;
    gemm_exec_request_init(&r2, &g, vals, "sm_90");
    CHECK(nvrtc_key(&r.req) != nvrtc_key(&r2.req));

    gemm_exec_problem mi = {.tmpl = FUSION_T_MI_CHAIN, .dtype = STOF_F16, .m = 4, .n = 1000,
                            .eps = 1e-5f, .store_pre_norm = 1};
    mi.epi.norm = FUSION_NORM_RMSNORM;
    int mv[FUSION_MAX_PARAMS] = {2, 64, 4};
    gemm_exec_request_init(&r, &mi, mv, "sm_80");
    CHECK(strcmp(r.req.source, "mi_chain.cu") == 0);
    CHECK(has_option(&r, "-DROW_N=1000") && has_option(&r, "-DNORM=2") &&
          has_option(&r, "-DSTORE_PRE_NORM=1") && has_option(&r, "-DROWS=2") &&
          has_option(&r, "-DTHREADS=64") && has_option(&r, "-DVEC=4"));
    test_request_wgmma();
    CHECK(strcmp(gemm_exec_kernel_name(FUSION_T_EMBEDDING), "stof_embedding") == 0);
    CHECK(strcmp(gemm_exec_kernel_name(FUSION_T_GEMM_LN), "stof_gemm_ln") == 0);
    CHECK(strcmp(gemm_exec_kernel_name(FUSION_T_GEMM_CHAIN), "stof_gemm_chain") == 0);
    CHECK(gemm_exec_kernel_name(FUSION_T_CUBLASLT) == NULL);

    gemm_exec_problem ln = ln_problem(STOF_BF16, 1024, 1 | 4 | 8 | 16);
    int lv[FUSION_MAX_PARAMS] = {16, 64, 32, 4, 2};
    gemm_exec_request_init(&r, &ln, lv, "sm_90");
    CHECK(strcmp(r.req.source, "gemm_ln.cu") == 0);
    const char *want_ln[] = {"-DROWS=16", "-DBLOCK_N=64", "-DBLOCK_K=32", "-DWARPS=4",
                             "-DSTAGES=2", "-DSTOF_DTYPE=2", "-DROW_N=1024", "-DWEIGHT_KN=1",
                             "-DHAS_BIAS=1", "-DHAS_RESIDUAL=0", "-DNORM=2",
                             "-DSTORE_PRE_NORM=1"};
    for (size_t i = 0; i < sizeof want_ln / sizeof want_ln[0]; i++)
        CHECK_MSG(has_option(&r, want_ln[i]), "missing %s", want_ln[i]);

    gemm_exec_problem ch = chain_problem(STOF_F16, 512, 2 | 8 | 16);
    int cv[FUSION_MAX_PARAMS] = {32, 64, 32, 8, 3};
    gemm_exec_request_init(&r, &ch, cv, "sm_80");
    CHECK(strcmp(r.req.source, "gemm_chain.cu") == 0);
    const char *want_ch[] = {"-DBLOCK_M=32", "-DBLOCK_F=64", "-DBLOCK_K=32", "-DWARPS=8",
                             "-DSTAGES=3", "-DSTOF_DTYPE=1", "-DOUT_N=512", "-DWEIGHT_KN=0",
                             "-DHAS_BIAS1=0", "-DACT=2", "-DHAS_BIAS2=1", "-DHAS_RESIDUAL=1"};
    for (size_t i = 0; i < sizeof want_ch / sizeof want_ch[0]; i++)
        CHECK_MSG(has_option(&r, want_ch[i]), "missing %s", want_ch[i]);
}

/* gemv: what it refuses, its defaults (feasible, every row in one block), its defines and
 * launch shape, its arguments (y, bias and residual any width). */
static void test_gemv(void) {
    stof_error err = {0};
    gemm_exec_problem p = {.tmpl = FUSION_T_GEMV, .dtype = STOF_F16, .m = 17, .n = 50257,
                           .k = 768};
    expect(gemm_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED, &err, "M must be 1..16");
    p.m = 8;
    expect(gemm_exec_validate(&p, &err), STOF_OK, &err, NULL); /* a vocabulary, [N, K] */
    p.weight_kn = 1;
    expect(gemm_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED, &err, "[K, N] weights");
    p.weight_kn = 0;
    p.k = 770;
    expect(gemm_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED, &err, "K a positive multiple");
    p.k = 768;
    p.epi.norm = FUSION_NORM_RMSNORM;
    expect(gemm_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED, &err, "no closing norm");
    p.epi.norm = FUSION_NORM_NONE;
    p.prologue = FUSION_NORM_RMSNORM; /* a norm ahead: its eps must be usable */
    expect(gemm_exec_validate(&p, &err), STOF_ERR_INVALID, &err, "eps must be positive");
    p.eps = 1e-6f;
    expect(gemm_exec_validate(&p, &err), STOF_OK, &err, NULL);
    p.prologue = (fusion_norm)7;
    expect(gemm_exec_validate(&p, &err), STOF_ERR_INVALID, &err, "unknown norm 7 ahead");
    p.prologue = FUSION_NORM_NONE;
    p.glu_act = STOF_ACT_RELU; /* a gated unit after the GEMM: its activations, its layout */
    expect(gemm_exec_validate(&p, &err), STOF_ERR_INVALID, &err, "GLU activation 3");
    p.glu_act = STOF_ACT_SILU;
    p.n = 50257;
    expect(gemm_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED, &err, "an even N (50257)");
    p.n = 11264;
    p.epi.has_residual = 1; /* no residual before the gated unit */
    expect(gemm_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED, &err, "no activation or residual");
    p.epi.has_residual = 0;
    expect(gemm_exec_validate(&p, &err), STOF_OK, &err, NULL);
    int gv[FUSION_MAX_PARAMS] = {0};
    gemm_exec_default_values(&p, "sm_90", gv);
    CHECK_EQ_INT(gv[1] / gv[2] % 2, 0); /* the default: two features a warp at least */
    expect(gemm_exec_check(&p, gv, SMEM_H100, &err), STOF_OK, &err, NULL);
    {
        gemm_exec_request gr;
        gemm_exec_request_init(&gr, &p, gv, "sm_90");
        CHECK(has_option(&gr, "-DGLU=4")); /* STOF_ACT_SILU */
        gemm_exec_plan gp;
        memset(&gp, 0, sizeof gp);
        gp.problem = p;
        memcpy(gp.values, gv, sizeof gv);
        gemm_template_get(FUSION_T_GEMV)->launch_shape(NULL, &gp);
        CHECK_EQ_INT(gp.grid[0], (unsigned)((11264 / 2 + gv[1] / 2 - 1) / (gv[1] / 2)));
    }
    p.glu_act = 0;
    p.n = 50257;
    p.dtype = STOF_F32;
    expect(gemm_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED, &err, "f16 or bf16");
    p.dtype = STOF_F16;

    static const struct {
        int64_t m, n, k;
        int weight_kn, want[5];
    } cases[] = {
        {1, 2048, 2048, 0, {1, 16, 8, 8, 0}},   {1, 2048, 8192, 0, {1, 8, 4, 2, 8}},
        {1, 4096, 4096, 0, {1, 8, 4, 2, 8}},   {1, 768, 3072, 0, {1, 16, 8, 8, 0}},
        {2, 2048, 2048, 0, {2, 4, 4, 8, 0}},   {8, 3072, 2048, 0, {8, 8, 4, 8, 0}},
        {16, 2048, 8192, 0, {4, 8, 4, 8, 0}},  {16, 2048, 3072, 0, {16, 8, 4, 4, 0}},
        {16, 768, 768, 0, {16, 8, 4, 4, 0}},   {3, 50257, 768, 0, {4, 4, 4, 8, 0}},
        {1, 768, 768, 1, {1, 16, 8, 8, 0}},    {1, 768, 8192, 1, {1, 16, 8, 8, 0}},
        {8, 5120, 1280, 1, {8, 32, 8, 8, 0}},  {16, 12288, 768, 1, {16, 64, 8, 4, 0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gemm_exec_problem q = {.tmpl = FUSION_T_GEMV, .dtype = STOF_BF16, .m = cases[i].m,
                               .n = cases[i].n, .k = cases[i].k,
                               .weight_kn = cases[i].weight_kn};
        int vals[FUSION_MAX_PARAMS] = {0};
        gemm_exec_default_values(&q, "sm_90", vals);
        CHECK_MSG(memcmp(vals, cases[i].want, sizeof cases[i].want) == 0,
                  "gemv case %zu: default %d %d %d %d %d", i, vals[0], vals[1], vals[2], vals[3],
                  vals[4]);
        CHECK_EQ_INT(gemm_exec_check(&q, vals, SMEM_H100, &err), STOF_OK);
    }
    {
        /* the stages' build: one more warp (the producer), and the stages in shared memory
         * after x's row: 8 stages x 8 rows x 512 elements of 8192 */
        gemm_exec_problem q = {.tmpl = FUSION_T_GEMV, .dtype = STOF_F16, .m = 1, .n = 2048,
                               .k = 8192};
        int sv[FUSION_MAX_PARAMS] = {0};
        gemm_exec_default_values(&q, "sm_90", sv);
        gemm_exec_request sr;
        gemm_exec_request_init(&sr, &q, sv, "sm_90");
        CHECK(has_option(&sr, "-DSTAGES=8") && has_option(&sr, "-DWARPS=4") &&
              has_option(&sr, "-DUNROLL=2"));
        const gemm_template *gt = gemm_template_get(FUSION_T_GEMV);
        CHECK_EQ_INT((long long)gt->smem(&q, sv), 8192LL * 2 + 8LL * 8 * 512 * 2);
        gemm_exec_plan sp;
        memset(&sp, 0, sizeof sp);
        sp.problem = q;
        memcpy(sp.values, sv, sizeof sv);
        gt->launch_shape(NULL, &sp);
        CHECK_EQ_INT(sp.block[0], 5 * 32);
        CHECK_EQ_INT(sp.grid[0], 2048 / 8);
        expect(gemm_exec_check_arch(&q, sv, "sm_90", &err), STOF_OK, &err, NULL);
        expect(gemm_exec_check_arch(&q, sv, "sm_89", &err), STOF_ERR_UNSUPPORTED, &err,
               "gemv: STAGES 8 copies the weights by bulk copies, which need sm_90 or later "
               "(this is sm_89)");
        int pre[FUSION_MAX_PARAMS] = {0}; /* before sm_90 the default keeps the registers */
        gemm_exec_default_values(&q, "sm_89", pre);
        CHECK(pre[4] == 0 && pre[1] == 8 && pre[2] == 8 && pre[3] == 16);
        expect(gemm_exec_check_arch(&q, pre, "sm_89", &err), STOF_OK, &err, NULL);
        sv[4] = 0; /* the same without stages: the registers' build, no producer, x alone */
        gemm_exec_request_init(&sr, &q, sv, "sm_90");
        CHECK(has_option(&sr, "-DSTAGES=0"));
        CHECK_EQ_INT((long long)gt->smem(&q, sv), 8192LL * 2);
        memcpy(sp.values, sv, sizeof sv);
        gt->launch_shape(NULL, &sp);
        CHECK_EQ_INT(sp.block[0], 4 * 32);
    }

    int vals[FUSION_MAX_PARAMS] = {4, 64, 8, 2};
    p.m = 3;
    p.n = 2304;
    p.weight_kn = 1;
    p.epi = (fusion_epilogue){1, FUSION_ACT_GELU_TANH, 1, FUSION_NORM_NONE};
    gemm_exec_request r;
    gemm_exec_request_init(&r, &p, vals, "sm_90");
    CHECK(strcmp(r.req.source, "gemv.cu") == 0);
    const char *want[] = {"-DROWS=4", "-DBLOCK_N=64", "-DWARPS=8", "-DUNROLL=2",
                          "-DSTOF_DTYPE=1", "-DWEIGHT_KN=1", "-DHAS_BIAS=1", "-DACT=2",
                          "-DHAS_RESIDUAL=1", "-DPROLOGUE_NORM=0"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK_MSG(has_option(&r, want[i]), "missing %s", want[i]);
    CHECK(strcmp(gemm_exec_kernel_name(FUSION_T_GEMV), "stof_gemv") == 0);

    gemm_exec_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.problem = p;
    plan.problem.weight_kn = 0;
    plan.problem.n = 50257;
    gemm_exec_gemm_tensors t = {.x = 0x1000, .w = 0x2000, .bias = 0x3002, .residual = 0x4002,
                                .y = 0x5002};
    stof_gemv_args a;
    expect(gemm_exec_gemv_args(&plan, &t, &a, &err), STOF_OK, &err, NULL);
    CHECK(a.x_row_stride == 768 && a.w_row_stride == 768 && a.y_row_stride == 50257 &&
          a.r_row_stride == 50257 && a.m == 3 && a.n == 50257 && a.k == 768);
    t.y = 0x5001;
    expect(gemm_exec_gemv_args(&plan, &t, &a, &err), STOF_ERR_INVALID, &err, "gemv: y");
    t.y = 0x5002;
    t.x = 0x1008;
    expect(gemm_exec_gemv_args(&plan, &t, &a, &err), STOF_ERR_INVALID, &err, "16-byte aligned");
    t.x = 0x1000;
    t.residual = 0;
    expect(gemm_exec_gemv_args(&plan, &t, &a, &err), STOF_ERR_INVALID, &err, "residual");
    stof_gemm_args ga;
    expect(gemm_exec_gemm_args(&plan, &t, &ga, &err), STOF_ERR_INVALID, &err,
           "a gemv plan launched as gemm_epilogue");
    /* a LayerNorm ahead: its gain and bias, and eps, go to the kernel */
    t.residual = 0x4002;
    plan.problem.prologue = FUSION_NORM_LAYERNORM;
    plan.problem.eps = 1e-5f;
    expect(gemm_exec_gemv_args(&plan, &t, &a, &err), STOF_ERR_INVALID, &err, "gamma");
    t.gamma = 0x6000;
    expect(gemm_exec_gemv_args(&plan, &t, &a, &err), STOF_ERR_INVALID, &err, "beta");
    t.beta = 0x7000;
    expect(gemm_exec_gemv_args(&plan, &t, &a, &err), STOF_OK, &err, NULL);
    CHECK(a.gamma == (const void *)0x6000 && a.beta == (const void *)0x7000 && a.eps == 1e-5f);
    plan.problem.prologue = FUSION_NORM_RMSNORM; /* no bias */
    expect(gemm_exec_gemv_args(&plan, &t, &a, &err), STOF_OK, &err, NULL);
    CHECK(a.gamma == (const void *)0x6000 && a.beta == NULL);
}

static void test_args(void) {
    stof_error err = {0};
    gemm_exec_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.problem = gemm_problem(STOF_F16, 1, 1, FUSION_ACT_NONE, 1);
    plan.problem.n = 2304;
    gemm_exec_gemm_tensors t = {.x = 0x1000, .w = 0x2000, .bias = 0x3000, .residual = 0x4000,
                                .y = 0x5000};
    stof_gemm_args a;
    expect(gemm_exec_gemm_args(&plan, &t, &a, &err), STOF_OK, &err, NULL);
    CHECK_EQ_INT(a.x_row_stride, 768);
    CHECK_EQ_INT(a.w_row_stride, 2304); /* [K, N] */
    CHECK_EQ_INT(a.y_row_stride, 2304);
    CHECK_EQ_INT(a.r_row_stride, 2304);
    CHECK_EQ_INT(a.m, 1000);
    CHECK(a.bias == (const void *)0x3000);
    t.residual = 0;
    expect(gemm_exec_gemm_args(&plan, &t, &a, &err), STOF_ERR_INVALID, &err, "residual");
    t.residual = 0x4008;
    expect(gemm_exec_gemm_args(&plan, &t, &a, &err), STOF_ERR_INVALID, &err, "16-byte aligned");
    t.residual = 0x4000;
    t.y_row_stride = 2300;
    expect(gemm_exec_gemm_args(&plan, &t, &a, &err), STOF_ERR_INVALID, &err, "multiple of 8");
    t.y_row_stride = 3072; /* a wider output: writing a slice of it */
    expect(gemm_exec_gemm_args(&plan, &t, &a, &err), STOF_OK, &err, NULL);
    CHECK_EQ_INT(a.y_row_stride, 3072);
    gemm_exec_mi_tensors mt = {.x = 0x1000, .y = 0x2000};
    expect(gemm_exec_mi_args(&plan, &mt, &(stof_mi_args){0}, &err), STOF_ERR_INVALID, &err,
           "a gemm_epilogue plan launched as mi_chain");

    memset(&plan, 0, sizeof plan);
    plan.problem = (gemm_exec_problem){.tmpl = FUSION_T_MI_CHAIN, .dtype = STOF_F16, .m = 10,
                                       .n = 768, .eps = 1e-5f, .store_pre_norm = 1};
    plan.problem.epi.norm = FUSION_NORM_LAYERNORM;
    stof_mi_args ma;
    mt = (gemm_exec_mi_tensors){.x = 0x1000, .y = 0x2000, .gamma = 0x3000, .pre_norm = 0x5000};
    expect(gemm_exec_mi_args(&plan, &mt, &ma, &err), STOF_ERR_INVALID, &err, "beta");
    mt.beta = 0x4000;
    expect(gemm_exec_mi_args(&plan, &mt, &ma, &err), STOF_OK, &err, NULL);
    CHECK_EQ_INT(ma.rows, 10);
    CHECK(ma.pre_norm == (void *)0x5000 && ma.residual == NULL);

    memset(&plan, 0, sizeof plan);
    plan.problem = (gemm_exec_problem){.tmpl = FUSION_T_EMBEDDING, .dtype = STOF_F16, .m = 256,
                                       .n = 768, .seq_len = 128, .vocab = 100,
                                       .has_position = 1};
    gemm_exec_embed_tensors et = {.ids = 0x1000, .word = 0x2000, .out = 0x3000};
    stof_embed_args ea;
    expect(gemm_exec_embed_args(&plan, &et, &ea, &err), STOF_ERR_INVALID, &err, "pos");
    et.pos = 0x4000;
    expect(gemm_exec_embed_args(&plan, &et, &ea, &err), STOF_ERR_INVALID, &err, "error flag");
    plan.d_error = 0x6000;
    expect(gemm_exec_embed_args(&plan, &et, &ea, &err), STOF_OK, &err, NULL);
    CHECK_EQ_INT(ea.tokens, 256);
    CHECK_EQ_INT(ea.hidden, 768);
    CHECK(ea.type == NULL);

    char buf[512];
    gemm_exec_plan_describe(&plan, buf, sizeof buf);
    CHECK_CONTAINS(buf, "embedding");

    /* gemm_ln: gamma always, beta for LayerNorm, pre_norm when stored */
    memset(&plan, 0, sizeof plan);
    plan.problem = ln_problem(STOF_F16, 768, 1 | 2 | 8 | 16); /* bias add LN pre, w[K,N] */
    plan.problem.k = 3072;
    plan.values[0] = 32;
    gemm_exec_ln_tensors lt = {.x = 0x1000, .w = 0x2000, .bias = 0x3000, .residual = 0x4000,
                               .gamma = 0x5000, .y = 0x7000, .pre_norm = 0x8000};
    stof_gemm_ln_args la;
    expect(gemm_exec_ln_args(&plan, &lt, &la, &err), STOF_ERR_INVALID, &err, "beta");
    lt.beta = 0x6000;
    lt.pre_norm = 0;
    expect(gemm_exec_ln_args(&plan, &lt, &la, &err), STOF_ERR_INVALID, &err, "pre_norm");
    lt.pre_norm = 0x4000; /* the residual stream updated in place */
    lt.y = 0x4000;
    expect(gemm_exec_ln_args(&plan, &lt, &la, &err), STOF_OK, &err, NULL);
    CHECK_EQ_INT(la.x_row_stride, 3072);
    CHECK_EQ_INT(la.w_row_stride, 768); /* [K, N] */
    CHECK_EQ_INT(la.p_row_stride, 768);
    CHECK(la.m == 1000 && la.n == 768 && la.k == 3072 && la.eps == 1e-5f);
    CHECK(la.beta == (const void *)0x6000 && la.pre_norm == (void *)0x4000);
    plan.problem.epi.norm = FUSION_NORM_RMSNORM; /* no beta needed or passed */
    lt.beta = 0;
    expect(gemm_exec_ln_args(&plan, &lt, &la, &err), STOF_OK, &err, NULL);
    CHECK(la.beta == NULL);
    lt.gamma = 0;
    expect(gemm_exec_ln_args(&plan, &lt, &la, &err), STOF_ERR_INVALID, &err, "gamma");
    gemm_exec_plan_describe(&plan, buf, sizeof buf);
    CHECK_CONTAINS(buf, "gemm_ln fp16 M=1000 N=768 K=3072 w[K,N] bias add rmsnorm +pre_norm");
    expect(gemm_exec_chain_args(&plan, &(gemm_exec_chain_tensors){0}, &(stof_gemm_chain_args){0},
                                &err), STOF_ERR_INVALID, &err, "a gemm_ln plan launched as "
                                                               "gemm_chain");

    /* gemm_chain: w1 [F, K] and w2 [N, F], or both transposed */
    memset(&plan, 0, sizeof plan);
    plan.problem = chain_problem(STOF_BF16, 768, 1 | 4 | 16); /* gelu b1 | add */
    gemm_exec_chain_tensors ct = {.x = 0x1000, .w1 = 0x2000, .w2 = 0x3000, .residual = 0x4000,
                                  .y = 0x5000};
    stof_gemm_chain_args ca;
    expect(gemm_exec_chain_args(&plan, &ct, &ca, &err), STOF_ERR_INVALID, &err, "b1");
    ct.b1 = 0x6000;
    expect(gemm_exec_chain_args(&plan, &ct, &ca, &err), STOF_OK, &err, NULL);
    CHECK_EQ_INT(ca.x_row_stride, 768);
    CHECK_EQ_INT(ca.w1_row_stride, 768);
    CHECK_EQ_INT(ca.w2_row_stride, 3072);
    CHECK_EQ_INT(ca.y_row_stride, 768);
    CHECK(ca.m == 128 && ca.k == 768 && ca.f == 3072 && ca.n == 768);
    CHECK(ca.b2 == NULL && ca.residual == (const void *)0x4000);
    plan.problem.weight_kn = 1;
    expect(gemm_exec_chain_args(&plan, &ct, &ca, &err), STOF_OK, &err, NULL);
    CHECK_EQ_INT(ca.w1_row_stride, 3072); /* [K, F] */
    CHECK_EQ_INT(ca.w2_row_stride, 768);  /* [F, N] */
    ct.w2_row_stride = 700;
    expect(gemm_exec_chain_args(&plan, &ct, &ca, &err), STOF_ERR_INVALID, &err, "w2");
    ct.w2_row_stride = 0;
    plan.problem.epi2.has_bias = 1;
    expect(gemm_exec_chain_args(&plan, &ct, &ca, &err), STOF_ERR_INVALID, &err, "b2");
    gemm_exec_plan_describe(&plan, buf, sizeof buf);
    CHECK_CONTAINS(buf, "gemm_chain bf16 M=128 F=3072 K=768 w[K,N] bias gelu | gemm N2=768 "
                        "bias add");
}

/* glu and rotary: validation, feasibility, defaults, defines, argument
 * blocks. */
static void test_glu_rotary(void) {
    stof_error err = {0};
    gemm_exec_problem glu = {.tmpl = FUSION_T_GLU, .dtype = STOF_F16, .m = 100, .n = 1152,
                             .glu_act = STOF_ACT_GELU};
    expect(gemm_exec_validate(&glu, &err), STOF_OK, &err, NULL);
    glu.glu_act = STOF_ACT_RELU;
    expect(gemm_exec_validate(&glu, &err), STOF_ERR_INVALID, &err, "glu: activation 3");
    glu.glu_act = STOF_ACT_SILU;
    int vals[FUSION_MAX_PARAMS];
    gemm_exec_default_values(&glu, "sm_90", vals);
    CHECK(vals[0] == 256 && vals[1] == 8);
    glu.n = 1004; /* rows of 1004: VEC 4 at most */
    gemm_exec_default_values(&glu, "sm_90", vals);
    CHECK_EQ_INT(vals[1], 4);
    vals[1] = 8;
    expect(gemm_exec_check(&glu, vals, SMEM_H100, &err), STOF_ERR_UNSUPPORTED, &err,
           "VEC 8 does not divide");
    vals[1] = 3;
    expect(gemm_exec_check(&glu, vals, SMEM_H100, &err), STOF_ERR_INVALID, &err, "VEC");

    gemm_exec_problem rot = {.tmpl = FUSION_T_ROTARY, .dtype = STOF_BF16, .m = 256,
                             .seq_len = 128, .heads = 32, .kv_heads = 8, .head_dim = 128,
                             .theta = 10000.0f, .n = 48 * 128};
    expect(gemm_exec_validate(&rot, &err), STOF_OK, &err, NULL);
    rot.n = 36 * 128;
    expect(gemm_exec_validate(&rot, &err), STOF_ERR_INVALID, &err, "make 6144");
    rot.n = 48 * 128;
    rot.seq_len = 100;
    expect(gemm_exec_validate(&rot, &err), STOF_ERR_INVALID, &err, "whole sequences of 100");
    rot.seq_len = 128;
    rot.kv_heads = 5;
    expect(gemm_exec_validate(&rot, &err), STOF_ERR_INVALID, &err, "multiple of kv heads");
    rot.kv_heads = 8;
    rot.theta = 1.0f;
    expect(gemm_exec_validate(&rot, &err), STOF_ERR_INVALID, &err, "theta");
    rot.theta = 10000.0f;
    gemm_exec_default_values(&rot, "sm_80", vals);
    CHECK(vals[0] == 256 && vals[1] == 8);
    rot.head_dim = 12; /* half a head of 6: VEC 2 */
    rot.n = 48 * 12;
    gemm_exec_default_values(&rot, "sm_80", vals);
    CHECK_EQ_INT(vals[1], 2);
    vals[1] = 4;
    expect(gemm_exec_check(&rot, vals, SMEM_H100, &err), STOF_ERR_UNSUPPORTED, &err,
           "half of head_dim 12");
    rot.head_dim = 128;
    rot.n = 48 * 128;

    gemm_exec_request r;
    gemm_exec_default_values(&rot, "sm_90", vals);
    gemm_exec_request_init(&r, &rot, vals, "sm_90");
    CHECK(strcmp(r.req.source, "rotary.cu") == 0);
    int head_dim = 0;
    for (int i = 0; i < r.req.n_options; i++)
        head_dim |= strcmp(r.req.options[i], "-DHEAD_DIM=128") == 0;
    CHECK(head_dim);
    CHECK(strcmp(gemm_exec_kernel_name(FUSION_T_GLU), "stof_glu") == 0);

    gemm_exec_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.problem = rot;
    gemm_exec_xy_tensors t = {.x = 0x1000, .y = 0x2008};
    stof_rotary_args ra;
    expect(gemm_exec_rotary_args(&plan, &t, &ra, &err), STOF_ERR_INVALID, &err, "rotary: y");
    t.y = 0x2000;
    expect(gemm_exec_rotary_args(&plan, &t, &ra, &err), STOF_OK, &err, NULL);
    CHECK(ra.rows == 256 && ra.seq_len == 128 && ra.width == 6144 && ra.rotated == 40 &&
          ra.theta == 10000.0f);
    stof_glu_args ga;
    expect(gemm_exec_glu_args(&plan, &t, &ga, &err), STOF_ERR_INVALID, &err,
           "a rotary plan launched as glu");
    plan.problem = glu;
    expect(gemm_exec_glu_args(&plan, &t, &ga, &err), STOF_OK, &err, NULL);
    CHECK(ga.rows == 100 && ga.f == 1004);
    char buf[256];
    gemm_exec_plan_describe(&plan, buf, sizeof buf);
    CHECK_CONTAINS(buf, "silu");
}

int main(void) {
    int major = 0, minor = 0;
    stof_error err = {0};
    test_validate();
    test_check();
    test_defaults();
    test_request();
    test_args();
    test_gemv();
    test_glu_rotary();
    if (nvrtc_version(&major, &minor, &err) != STOF_OK) {
        printf("NVRTC unavailable (%s): compile checks skipped\n", err.msg);
    } else {
        test_variants_compile();
    }
    return check_summary("test_gemm_compile");
}
