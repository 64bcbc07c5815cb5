/* Decode-step attention on the GPU (core/exec/attention/mha_decode.h) against its CPU
 * reference (ops/kv_cache.h), on the same fp16/bf16-rounded values:
 *   - a prefill's store into the cache (right-padded lengths, a ring shorter than them);
 *   - steps at the positions each sequence reached: dense causal (the whole context), a
 *     sliding window whose ring wraps, grouped-query heads, a per-batch random mask; split
 *     over CTAs or not;
 *   - the cache after the step holds the new token's K and V in its slot;
 *   - a sequence that has ended (position -1): zeros out, its cache as the prefill left it;
 *   - a rotary op fused in front: Q and the new K rotated by the kernel, against the rotary
 *     reference applied first (op_rotary_head);
 *   - 4 and 8 warps a CTA;
 *   - a K/V head's query heads in one CTA or spread over several (each of its CTAs reads its
 *     keys; one writes the new token's K and V);
 *   - V read in pairs of dims of every key and 16 bytes of one key a lane (every case both
 *     ways where the head size allows).
 * Outputs are poisoned (NaN) before each launch. Exits 77 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu_open.h"
#include "core/base/util.h"
#include "core/exec/attention/mha_decode.h"
#include "ops/kv_cache.h"
#include "ops/mask.h"
#include "ops/ops.h"

#define GPU_CTX_TYPE mha_exec_ctx
#include "gpu_common.h"

typedef struct dcase {
    const char *name;
    int batch, heads, kv_heads, context;
    const char *mask;  /* text form, NULL: dense causal */
    int cap;           /* 0: the mask's span */
    int splits;        /* 0: chosen */
    int lens[4];       /* each sequence's prefill length; the step's position */
    int ended;         /* 1 + the sequence that has ended (its step's position -1: attention
                          skipped, zeros out, its cache untouched); 0: none */
    double theta;      /* > 0: a rotary op of this base fused in front */
    int warps;         /* 0: chosen */
    int cta_heads;     /* query heads a CTA; 0: chosen */
} dcase;

static const dcase cases[] = {
    {"dense", 2, 4, 4, 300, NULL, 0, 1, {257, 40}, 0, 0.0, 0, 0},
    {"dense, split", 2, 4, 4, 300, NULL, 0, 8, {257, 40}, 0, 0.0, 0, 0},
    {"dense GQA 8/2, split", 3, 8, 2, 1000, NULL, 0, 0, {999, 500, 1}, 0, 0.0, 0, 0},
    {"window 64 (ring wraps)", 2, 4, 2, 400, "sliding_window{band=63}", 0, 0, {300, 63}, 0, 0.0,
     0, 0},
    {"window 64 one split", 2, 4, 1, 400, "sliding_window{band=63}", 0, 1, {300, 10}, 0, 0.0,
     0, 0},
    {"random per batch", 2, 4, 4, 200,
     "per_batch(random{rate=0.5, block=4, seed=1}, random{rate=0.3, block=8, seed=2})", 0, 3,
     {150, 77}, 0, 0.0, 0, 0},
    {"longformer (global first key)", 4, 2, 2, 256, "longformer{band=16, global=2}", 0, 0,
     {255, 17, 100, 3}, 0, 0.0, 0, 0},
    {"dense, split, one ended", 2, 4, 4, 300, NULL, 0, 8, {257, 40}, 1, 0.0, 0, 0},
    {"window 64 (ring wraps), one ended", 2, 4, 2, 400, "sliding_window{band=63}", 0, 0,
     {300, 63}, 1, 0.0, 0, 0},
    {"GQA 8/2, the last ended", 3, 8, 2, 1000, NULL, 0, 0, {999, 500, 1}, 3, 0.0, 0, 0},
    {"dense, 8 warps", 2, 4, 4, 300, NULL, 0, 1, {257, 40}, 0, 0.0, 8, 0},
    {"GQA 8/2, rotary", 3, 8, 2, 1000, NULL, 0, 0, {999, 500, 1}, 0, 10000.0, 0, 0},
    {"window 64, rotary, one ended", 2, 4, 2, 400, "sliding_window{band=63}", 0, 0, {300, 63},
     2, 1000000.0, 0, 0},
    {"GQA 8/2, rotary, split, 8 warps", 3, 8, 2, 1000, NULL, 0, 4, {999, 500, 1}, 0, 500000.0,
     8, 0},
    {"GQA 8/2, a CTA a query head", 3, 8, 2, 1000, NULL, 0, 0, {999, 500, 1}, 0, 0.0, 0, 1},
    {"GQA 8/2, all four a CTA", 3, 8, 2, 1000, NULL, 0, 1, {999, 500, 1}, 0, 0.0, 0, 4},
    {"GQA 8/2, rotary, split, two a CTA, one ended", 3, 8, 2, 1000, NULL, 0, 4, {999, 500, 1}, 2,
     10000.0, 8, 2},
    {"window 64 (ring wraps), GQA 4/1, rotary, a CTA a head", 2, 4, 1, 400,
     "sliding_window{band=63}", 0, 0, {300, 63}, 0, 1000000.0, 0, 1},
};

/* The rotary's positions are the attentions' shifted by this much, so that a kernel rotating
 * by the wrong ones fails. */
#define ROTARY_SHIFT 5

/* The rotary op's output for a step's row: its Q and K heads rotated by the rotary's position
 * pos (the sequence's, also for one that has ended), rounded to the dtype as that op writes it. */
static void rotate_step(const dcase *c, float *row, int pos, int D, stof_dtype t) {
    float *y = malloc(sizeof *y * (size_t)D);
    for (int h = 0; h < c->heads + c->kv_heads; h++) {
        op_rotary_head(row + (size_t)h * D, y, D, pos, c->theta);
        for (int j = 0; j < D; j++)
            row[(size_t)h * D + j] = from_bits(t, to_bits(t, y[j]));
    }
    free(y);
}

/* Whether x is y to within the rounding of one value of dtype t (the GPU's sine is not the
 * reference's, so a rotated value may round the other way). */
static int near_rounding(float x, float y, stof_dtype t) {
    return fabsf(x - y) <= fabsf(y) * (t == STOF_BF16 ? 0x1p-7f : 0x1p-10f) + 1e-6f;
}

typedef struct host {
    float *qkv_prefill;  /* [B][seq][W] */
    float *qkv_step;     /* [B][W] */
    float out_ref[4 * 8 * 128];
} host;

static void fill(float *x, size_t n, stof_dtype t, util_rng *r) {
    for (size_t i = 0; i < n; i++)
        x[i] = from_bits(t, to_bits(t, (float)(2.0 * util_rng_double(r) - 1.0)));
}

static int upload_f(gpu *g, CUdeviceptr *d, const float *x, size_t n, stof_dtype t) {
    uint16_t *b = malloc(n * 2);
    for (size_t i = 0; i < n; i++)
        b[i] = to_bits(t, x[i]);
    int rc = upload(g, d, b, n * 2);
    free(b);
    return rc;
}

/* The case's mask (NULL: dense). */
static mask *case_mask(const dcase *c) {
    if (!c->mask)
        return NULL;
    mask_spec *s = NULL;
    mask *m = NULL;
    stof_error err = {0};
    CHECK_MSG(mask_spec_parse(c->mask, &s, &err) == STOF_OK, "%s", err.msg);
    CHECK_MSG(s && mask_build(s, c->batch, c->context, c->context, &m, &err) == STOF_OK, "%s",
              err.msg);
    mask_spec_free(s);
    return m;
}

static double rel_err(const uint16_t *got, const float *want, size_t n, stof_dtype t,
                      long *bad) {
    double num = 0, den = 0;
    *bad = 0;
    for (size_t i = 0; i < n; i++) {
        float y = from_bits(t, got[i]);
        if (!isfinite(y))
            (*bad)++;
        num += ((double)y - want[i]) * ((double)y - want[i]);
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#define V_NAME(v) ((v) == MHA_DECODE_V_WIDE ? "V wide" : "V in pairs")

static void run_case(gpu *g, const dcase *c, stof_dtype t, int D, int v_read, uint64_t seed) {
    mask *m = case_mask(c);
    int64_t span = ops_kv_cache_span(m, c->context);
    int cap = c->cap ? c->cap : (int)span;
    int B = c->batch, H = c->heads, KVH = c->kv_heads, seq = 0;
    for (int b = 0; b < B; b++)
        seq = c->lens[b] > seq ? c->lens[b] : seq;
    int64_t W = (int64_t)(H + 2 * KVH) * D;
    util_rng rng = {seed};
    float *pre = malloc(sizeof *pre * (size_t)(B * seq * W));
    float *step = malloc(sizeof *step * (size_t)(B * W));
    fill(pre, (size_t)(B * seq * W), t, &rng);
    fill(step, (size_t)(B * W), t, &rng);
    /* the reference: the store, then the step */
    ops_kv_cache ref;
    stof_error err = {0};
    CHECK_EQ_INT(ops_kv_cache_alloc(&ref, B, cap, KVH, D, &err), STOF_OK);
    int64_t lens[4];
    float pos[4];
    for (int b = 0; b < B; b++) {
        lens[b] = c->lens[b];
        pos[b] = b + 1 == c->ended ? -1.0f : (float)c->lens[b];
    }
    ops_kv_cache_store_prefix(&ref, pre, seq, H, lens);
    /* the reference steps on the rotary op's output; the GPU gets the step as it is */
    float *step_ref = malloc(sizeof *step_ref * (size_t)(B * W));
    memcpy(step_ref, step, sizeof *step * (size_t)(B * W));
    for (int b = 0; c->theta > 0 && b < B; b++)
        rotate_step(c, step_ref + (size_t)b * W, c->lens[b] + ROTARY_SHIFT, D, t);
    op_attention a = {.heads = H, .head_dim = D, .causal = 1, .kv_heads = KVH, .decode = 1,
                      .scale = 1.0f / sqrtf((float)D), .mask = m ? 0 : -1};
    float *want = malloc(sizeof *want * (size_t)(B * H * D));
    int rc = ops_attention_decode_ref(&a, m, step_ref, pos, &ref, want, &err);
    CHECK_MSG(rc == STOF_OK, "%s: reference: %s", c->name, err.msg);

    mha_decode_problem p = {B, H, KVH, D, t, cap, c->context, a.scale, m, c->theta};
    const mha_decode_settings set = {c->splits, c->warps, c->cta_heads, v_read};
    mha_decode_plan *pl = NULL;
    rc = rc ? rc : mha_decode_plan_create(g->ctx, &p, &set, &pl, &err);
    CHECK_MSG(rc == STOF_OK, "%s (%s): plan: %s", c->name, V_NAME(v_read), err.msg);
    CUdeviceptr d_pre = 0, d_step = 0, d_pos = 0, d_rpos = 0, d_pad = 0, d_k = 0, d_v = 0,
                d_o = 0;
    /* the attentions' positions (-1: ended) and the rotary's (a step's are the sequence's;
     * here shifted, to tell the two apart) */
    int32_t ipos[4], rpos[4], *am = calloc((size_t)(B * seq), sizeof *am);
    for (int b = 0; b < B; b++) {
        ipos[b] = b + 1 == c->ended ? -1 : c->lens[b];
        rpos[b] = c->lens[b] + ROTARY_SHIFT;
        for (int s = 0; s < c->lens[b]; s++)
            am[b * seq + s] = 1;
    }
    size_t cache_elems = (size_t)B * cap * KVH * D;
    if (!rc && !upload_f(g, &d_pre, pre, (size_t)(B * seq * W), t) &&
        !upload_f(g, &d_step, step, (size_t)(B * W), t) &&
        !upload(g, &d_pos, ipos, sizeof(int32_t) * (size_t)B) &&
        !upload(g, &d_rpos, rpos, sizeof(int32_t) * (size_t)B) &&
        !upload(g, &d_pad, am, sizeof(int32_t) * (size_t)(B * seq)) &&
        !dalloc(g, &d_k, cache_elems * 2) && !dalloc(g, &d_v, cache_elems * 2) &&
        !dalloc(g, &d_o, (size_t)(B * H * D) * 2) && !poison(g, d_k, cache_elems) &&
        !poison(g, d_v, cache_elems) && !poison(g, d_o, (size_t)(B * H * D))) {
        rc = mha_decode_store(pl, d_pre, seq, d_pad, d_k, d_v, 0, &err);
        mha_decode_tensors tt = {d_step, d_pos, d_k, d_v, d_o, 0, d_rpos};
        if (!rc)
            rc = mha_decode_run(pl, &tt, 0, &err);
        CHECK_MSG(rc == STOF_OK, "%s (%s): launch: %s", c->name, V_NAME(v_read), err.msg);
        uint16_t *o = malloc((size_t)(B * H * D) * 2), *kc = malloc(cache_elems * 2),
                 *vc = malloc(cache_elems * 2);
        if (!rc && !fetch(g, o, d_o, (size_t)(B * H * D)) && !fetch(g, kc, d_k, cache_elems) &&
            !fetch(g, vc, d_v, cache_elems)) {
            long bad;
            double e = rel_err(o, want, (size_t)(B * H * D), t, &bad);
            double tol = t == STOF_BF16 ? 2e-2 : 5e-3;
            CHECK_MSG(e < tol && bad == 0, "%s %s D=%d (%s): rel %.2e, %ld non-finite", c->name,
                      stof_dtype_name(t), D, V_NAME(v_read), e, bad);
            /* the caches: every slot a sequence can still read equals the reference's (its
             * new token's V as it came, its new key rotated within a rounding); an ended
             * one's still hold its prefix (the step wrote nothing) */
            long diff = 0;
            for (int b = 0; b < B; b++) {
                const int last = b + 1 == c->ended ? c->lens[b] - 1 : c->lens[b];
                for (int64_t j = last > cap - 1 ? last - cap + 1 : 0; j <= last; j++)
                    for (int x = 0; x < KVH * D; x++) {
                        size_t at = ((size_t)b * cap + (size_t)(j % cap)) * KVH * D + x;
                        const float got = from_bits(t, kc[at]);
                        const int rotated_new = c->theta > 0 && j == c->lens[b];
                        diff += rotated_new ? !near_rounding(got, ref.k[at], t)
                                            : got != ref.k[at];
                        diff += from_bits(t, vc[at]) != ref.v[at];
                    }
            }
            CHECK_MSG(diff == 0, "%s (%s): %ld cached key or value values differ", c->name,
                      V_NAME(v_read), diff);
            printf("%-34s %s D=%-3d B=%d H=%d/%d cap=%-4d splits=%d warps=%d heads a CTA=%d %s "
                   "rel=%.2e %s\n", c->name, stof_dtype_name(t), D, B, H, KVH, cap, pl->splits,
                   pl->warps, pl->cta_heads, V_NAME(v_read), e,
                   e < tol && bad == 0 && diff == 0 ? "PASS" : "FAIL");
        }
        free(o);
        free(kc);
        free(vc);
    }
    CUdeviceptr *all[] = {&d_pre, &d_step, &d_pos, &d_rpos, &d_pad, &d_k, &d_v, &d_o};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        dfree(g, all[k]);
    mha_decode_plan_free(pl);
    ops_kv_cache_free(&ref);
    free(am);
    free(want);
    free(pre);
    free(step);
    free(step_ref);
    mask_free(m);
}

/* Refusals before anything is launched. */
static void test_validation(gpu *g) {
    stof_error err = {0};
    mha_decode_plan *pl = NULL;
    mha_decode_problem p = {2, 4, 3, 64, STOF_F16, 10, 10, 0.125f, NULL, 0.0};
    CHECK_EQ_INT(mha_decode_plan_create(g->ctx, &p, NULL, &pl, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "kv_heads dividing heads");
    p.kv_heads = 2;
    p.cap = 11;
    CHECK_EQ_INT(mha_decode_plan_create(g->ctx, &p, NULL, &pl, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "11 cache slots for a context of 10");
    p.cap = 10;
    p.dtype = STOF_F32;
    CHECK_EQ_INT(mha_decode_plan_create(g->ctx, &p, NULL, &pl, &err), STOF_ERR_UNSUPPORTED);
    p.dtype = STOF_F16;
    p.head_dim = 48;
    CHECK_EQ_INT(mha_decode_plan_create(g->ctx, &p, NULL, &pl, &err), STOF_ERR_UNSUPPORTED);
    p.head_dim = 64;
    p.rotary_theta = -1.0;
    CHECK_EQ_INT(mha_decode_plan_create(g->ctx, &p, NULL, &pl, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "rotary theta of -1");
    p.rotary_theta = 0.0;
    mha_decode_settings set = {.warps = 33};
    CHECK_EQ_INT(mha_decode_plan_create(g->ctx, &p, &set, &pl, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "33 warps");
    set = (mha_decode_settings){.v_read = 3};
    CHECK_EQ_INT(mha_decode_plan_create(g->ctx, &p, &set, &pl, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "a V read of 3");
    p.head_dim = 80; /* wide V reads: heads of 32, 64 or 128 */
    set = (mha_decode_settings){.v_read = MHA_DECODE_V_WIDE};
    CHECK_EQ_INT(mha_decode_plan_create(g->ctx, &p, &set, &pl, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "needs heads of 32, 64 or 128 and at most 4 query heads a CTA");
    p.heads = 32;
    p.kv_heads = 2;
    p.head_dim = 128;
    set = (mha_decode_settings){.warps = 8, .cta_heads = 16};
    CHECK_EQ_INT(mha_decode_plan_create(g->ctx, &p, &set, &pl, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "8 warps of 16 query heads of 128 need");
    set.v_read = MHA_DECODE_V_WIDE; /* ... and at most 4 of them a CTA */
    CHECK_EQ_INT(mha_decode_plan_create(g->ctx, &p, &set, &pl, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "(heads of 128, 16 a CTA)");
    set = (mha_decode_settings){.warps = 8, .cta_heads = 3};
    CHECK_EQ_INT(mha_decode_plan_create(g->ctx, &p, &set, &pl, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "3 query heads a CTA (0: chosen, else a divisor of the 16");
    set.cta_heads = -1;
    CHECK_EQ_INT(mha_decode_plan_create(g->ctx, &p, &set, &pl, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "-1 query heads a CTA");
    /* few CTAs: the default serves fewer heads a CTA, and 8 warps of them fit */
    set.cta_heads = 0;
    CHECK_EQ_INT(mha_decode_plan_create(g->ctx, &p, &set, &pl, &err), STOF_OK);
    CHECK(pl && pl->cta_heads < 16 && 16 % pl->cta_heads == 0);
    mha_decode_plan_free(pl);
    pl = NULL;
    /* rows of qkv must be whole and 16-byte aligned: refused before anything is launched */
    CHECK_EQ_INT(mha_decode_plan_create(g->ctx, &p, NULL, &pl, &err), STOF_OK);
    const int64_t width = (int64_t)(p.heads + 2 * p.kv_heads) * p.head_dim;
    const int64_t strides[] = {width + 4, width - 8};
    for (int i = 0; pl && i < 2; i++) {
        mha_decode_tensors t = {0x1000, 0x1000, 0x1000, 0x1000, 0x1000, strides[i], 0};
        CHECK_EQ_INT(mha_decode_run(pl, &t, 0, &err), STOF_ERR_INVALID);
        CHECK_CONTAINS(err.msg, "qkv row stride");
    }
    mha_decode_plan_free(pl);
    pl = NULL;
    p.kv_heads = 8; /* heads of 128: 64 pairs, more than one warp's threads */
    set = (mha_decode_settings){.warps = 1};
    CHECK_EQ_INT(mha_decode_plan_create(g->ctx, &p, &set, &pl, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "at least a thread for each pair of dims: 2 warps");
    CHECK(pl == NULL);
}

/* One step's time (us) of plan pl with every sequence at the end of a full cache; -1 when it
 * could not run. */
static double time_step(gpu *g, const mha_decode_plan *pl) {
    const mha_decode_problem *p = &pl->problem;
    const int B = p->batch, H = p->heads, KVH = p->kv_heads, D = p->head_dim, cap = p->cap;
    size_t cache = (size_t)B * cap * KVH * D, W = (size_t)(H + 2 * KVH) * D;
    CUdeviceptr q = 0, pos = 0, k = 0, v = 0, o = 0;
    int32_t *ip = malloc(sizeof *ip * (size_t)B);
    for (int b = 0; ip && b < B; b++)
        ip[b] = cap - 1;
    CUevent e0 = NULL, e1 = NULL;
    double us = -1;
    stof_error err = {0};
    if (ip && !dalloc(g, &q, (size_t)B * W * 2) && !upload(g, &pos, ip, sizeof *ip * (size_t)B) &&
        !dalloc(g, &k, cache * 2) && !dalloc(g, &v, cache * 2) &&
        !dalloc(g, &o, (size_t)B * H * D * 2) && !poison(g, q, (size_t)B * W) &&
        !check_cu(g, g->drv->MemsetD16Async(q, 0x3c00, (size_t)B * W, 0), "memset") &&
        !check_cu(g, g->drv->MemsetD16Async(k, 0x3c00, cache, 0), "memset") &&
        !check_cu(g, g->drv->MemsetD16Async(v, 0x3c00, cache, 0), "memset") &&
        !check_cu(g, g->drv->EventCreate(&e0, 0), "event") &&
        !check_cu(g, g->drv->EventCreate(&e1, 0), "event")) {
        mha_decode_tensors t = {q, pos, k, v, o, 0, pos};
        enum { REPS = 50 };
        int rc = mha_decode_run(pl, &t, 0, &err);
        g->drv->EventRecord(e0, 0);
        for (int r = 0; r < REPS && !rc; r++)
            rc = mha_decode_run(pl, &t, 0, &err);
        g->drv->EventRecord(e1, 0);
        g->drv->EventSynchronize(e1);
        float ms = 0;
        g->drv->EventElapsedTime(&ms, e0, e1);
        CHECK_MSG(rc == STOF_OK, "timing: %s", err.msg);
        us = rc ? -1 : 1000.0 * ms / REPS;
    }
    if (e0)
        g->drv->EventDestroy(e0);
    if (e1)
        g->drv->EventDestroy(e1);
    CUdeviceptr *all[] = {&q, &pos, &k, &v, &o};
    for (size_t a = 0; a < 5; a++)
        dfree(g, all[a]);
    free(ip);
    return us;
}

/* Informational: one step's time with every sequence at the end of a full cache, and the
 * bandwidth of reading that cache once (K and V), with the planner's split of the keys and
 * with others beside it. */
static void timing(gpu *g) {
    static const int shapes[][5] = {/* batch, heads, kv_heads, head_dim, cap */
                                    {1, 32, 8, 64, 4096}, {8, 32, 8, 64, 4096},
                                    {64, 32, 8, 64, 4096}, {1, 12, 12, 64, 2048},
                                    {64, 12, 12, 64, 2048}, {64, 20, 20, 64, 2112},
                                    {1, 32, 8, 64, 192},    {1, 12, 12, 64, 192},
                                    {8, 32, 8, 64, 192},    {1, 32, 8, 64, 1024}};
    static const int splits[] = {0, 1, 2, 4, 8, 16};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0] && !g->dead; i++) {
        const int B = shapes[i][0], H = shapes[i][1], KVH = shapes[i][2], D = shapes[i][3];
        const int cap = shapes[i][4];
        mha_decode_problem p = {B, H, KVH, D, STOF_F16, cap, cap, 0.125f, NULL, 0.0};
        printf("time B=%-3d H=%d/%d D=%d cache %5d:", B, H, KVH, D, cap);
        for (size_t k = 0; k < sizeof splits / sizeof splits[0] && !g->dead; k++) {
            mha_decode_plan *pl = NULL;
            stof_error err = {0};
            const mha_decode_settings set = {.splits = splits[k]};
            if (mha_decode_plan_create(g->ctx, &p, &set, &pl, &err)) {
                CHECK_MSG(0, "timing plan: %s", err.msg);
                continue;
            }
            double us = time_step(g, pl);
            double gbs = 2.0 * (double)B * cap * KVH * D * 2 / (us * 1e3);
            if (k == 0)
                printf(" planner's split %d (%d heads a CTA, %s): %.1f us (%.0f GB/s of K and "
                       "V); others:", pl->splits, pl->cta_heads, V_NAME(pl->v_read), us, gbs);
            else
                printf(" %d: %.1f", splits[k], us);
            mha_decode_plan_free(pl);
        }
        /* the planner's split with each count of warps, fused with a rotary op, with a CTA for
         * all of a K/V head's query heads, and with V read in pairs */
        mha_decode_problem rot = p;
        rot.rotary_theta = 10000.0;
        const struct {
            const mha_decode_problem *p;
            mha_decode_settings set;
            const char *name;
        } alt[] = {{&p, {.warps = 4}, "4 warps"},
                   {&p, {.warps = 8}, "8 warps"},
                   {&rot, {0}, "rotary"},
                   {&p, {.cta_heads = H / KVH}, "a CTA a K/V head"},
                   {&p, {.v_read = MHA_DECODE_V_PAIRS}, "V in pairs"}};
        for (size_t k = 0; k < sizeof alt / sizeof alt[0] && !g->dead; k++) {
            mha_decode_plan *pl = NULL;
            stof_error err = {0};
            if (mha_decode_plan_create(g->ctx, alt[k].p, &alt[k].set, &pl, &err)) {
                CHECK_MSG(0, "timing plan: %s", err.msg);
                continue;
            }
            printf("; %s: %.1f", alt[k].name, time_step(g, pl));
            mha_decode_plan_free(pl);
        }
        printf("\n");
    }
}

int main(int argc, char **argv) {
    gpu g = {0};
    GPU_TEST_OPEN(mha_exec_ctx_create, g.ctx, "gpu_decode");
    g.drv = g.ctx->drv;
    printf("GPU: %s (%s, %d SMs)\n", g.ctx->info.name, g.ctx->arch, g.ctx->info.sm_count);
    int quick = argc > 1 && !strcmp(argv[1], "quick");
    static const stof_dtype dtypes[] = {STOF_F16, STOF_BF16};
    static const int dims[] = {64, 128, 80, 32};
    uint64_t seed = 1;
    test_validation(&g);
    for (int di = 0; di < 2 && !g.dead; di++)
        for (int hi = 0; hi < (quick ? 2 : 4) && !g.dead; hi++)
            for (size_t c = 0; c < sizeof cases / sizeof cases[0] && !g.dead; c++)
                for (int v = MHA_DECODE_V_PAIRS; v <= MHA_DECODE_V_WIDE; v++)
                    if (v == MHA_DECODE_V_PAIRS || dims[hi] != 80) /* wide: 32, 64, 128 */
                        run_case(&g, &cases[c], dtypes[di], dims[hi], v, seed++);
    if (!g.dead && !(argc > 1 && !strcmp(argv[1], "notime")))
        timing(&g);
    mha_exec_ctx_free(g.ctx);
    return check_summary("gpu_decode");
}
