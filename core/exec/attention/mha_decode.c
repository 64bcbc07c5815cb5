/* Decode-step attention on the GPU: see mha_decode.h. */
#include "core/exec/attention/mha_decode.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"

int mha_decode_validate(const mha_decode_problem *p, stof_error *err) {
    if (p->batch < 1 || p->heads < 1 || p->kv_heads < 1 || p->heads % p->kv_heads)
        return err_set(err, STOF_ERR_INVALID, "decode attention: batch %d, heads %d and kv_heads "
                       "%d must be positive, kv_heads dividing heads", p->batch, p->heads,
                       p->kv_heads);
    if (p->batch > 65535 || p->heads > 65535)
        return err_set(err, STOF_ERR_UNSUPPORTED, "decode attention: batch %d and heads %d must "
                       "not exceed 65535 (grid limits)", p->batch, p->heads);
    if (p->heads / p->kv_heads > STOF_DECODE_MAX_GROUP)
        return err_set(err, STOF_ERR_UNSUPPORTED, "decode attention: %d query heads a K/V head "
                       "(at most %d)", p->heads / p->kv_heads, STOF_DECODE_MAX_GROUP);
    if (!mha_exec_head_dim_supported(p->head_dim))
        return err_set(err, STOF_ERR_UNSUPPORTED, "decode attention: head_dim %d (supported: "
                       MHA_EXEC_HEAD_DIMS ")", p->head_dim);
    if (p->dtype != STOF_F16 && p->dtype != STOF_BF16)
        return err_set(err, STOF_ERR_UNSUPPORTED, "decode attention: the GPU kernels run in f16 "
                       "or bf16, not %s", stof_dtype_name(p->dtype));
    if (p->cap < 1 || p->context < 1 || p->cap > p->context)
        return err_set(err, STOF_ERR_INVALID, "decode attention: %d cache slots for a context "
                       "of %d positions (1 .. context)", p->cap, p->context);
    if (!isfinite(p->scale))
        return err_set(err, STOF_ERR_INVALID, "decode attention: scale %g", (double)p->scale);
    if (!(p->rotary_theta == 0.0 || (p->rotary_theta > 0.0 && isfinite(p->rotary_theta))))
        return err_set(err, STOF_ERR_INVALID, "decode attention: a rotary theta of %g (0 for "
                       "none, else positive)", p->rotary_theta);
    const mask *m = p->mask;
    if (m && (m->q_len != p->context || m->k_len != p->context ||
              (m->batch != 1 && m->batch != p->batch)))
        return err_set(err, STOF_ERR_SHAPE, "decode attention: the mask is %d x %d (batch %d), "
                       "the context %d x %d (batch 1 or %d)", m->q_len, m->k_len, m->batch,
                       p->context, p->context, p->batch);
    return STOF_OK;
}

int mha_decode_default_splits(const mha_decode_problem *p, int sm_count) {
    int ctas = p->batch * p->kv_heads, splits = 1;
    /* A CTA holds one tile of keys a warp in flight, so the cache is read fast only with many
     * CTAs an SM (measured on an H200: at batch 64 and 4096 keys, 8 splits read twice as fast
     * as 1, though 512 CTAs already fill the SMs once); each split keeps two tiles a warp. */
    while (ctas * splits < MHA_DECODE_CTAS_PER_SM * sm_count &&
           p->cap / (2 * splits) >= 2 * 32 * STOF_DECODE_WARPS)
        splits *= 2;
    return splits;
}

int mha_decode_default_cta_heads(const mha_decode_problem *p, int splits, int sm_count) {
    /* A CTA's work is a chain: its keys' loads, then for each key and query head a dot
     * product and a share of the V sum. With fewer CTAs than SMs that chain is the step's
     * time, and a CTA for fewer query heads shortens it; the K/V head's keys are then read by
     * each of its CTAs, from L2 after the first. Measured on an H200, a step of 32 query and
     * 8 K/V heads at batch 1 and 192 keys: 5.1 us with a CTA a query head against 7.0 with a
     * CTA a K/V head; a Mistral-shaped 1B's decode step 0.974 -> 0.943 ms at batch 1 and
     * 0.994 -> 0.959 at batch 8 (two heads a CTA). */
    const int per_kv = p->heads / p->kv_heads;
    const long long ctas = (long long)p->batch * p->kv_heads * splits;
    int heads = per_kv;
    for (int d = per_kv - 1; d >= 1; d--) {
        if (per_kv % d)
            continue;
        if (ctas * (per_kv / d) > sm_count)
            break;
        heads = d;
    }
    return heads;
}

int mha_decode_default_v_read(const mha_decode_problem *p, int splits, int cta_heads,
                              int sm_count) {
    /* Wide reads take far fewer instructions a key, which is what a step of few CTAs waits
     * on; with several query heads a CTA they also hold more registers (heads of 64, 4 a CTA:
     * 136 against 116), which costs a grid of many CTAs a CTA an SM. Measured on an H200, us a
     * step, wide against pairs: 32/8 heads at batch 1 and 192 keys, a CTA a head, 4.5 against
     * 5.1; at batch 8, 128 CTAs of two heads, 6.4 against 8.4; batch 1 and 4096 keys in 16
     * splits (128 CTAs of 4), 9.9 against 12.5; 12/12 heads at batch 64 and 2048 keys, 141
     * against 156; but 32/8 at batch 64 and 4096 keys (8192 CTAs of 4), 301 against 268. */
    if (!STOF_DECODE_WIDE_V_BUILDS(p->head_dim, cta_heads))
        return MHA_DECODE_V_PAIRS;
    const long long ctas = (long long)p->batch * (p->heads / cta_heads) * splits;
    return cta_heads == 1 || ctas <= sm_count ? MHA_DECODE_V_WIDE : MHA_DECODE_V_PAIRS;
}

/* The default warps of a plan whose CTAs serve cta_heads query heads (see below). */
static int warps_for(const mha_decode_problem *p, int splits, int cta_heads, int sm_count) {
    /* A warp takes a tile of 32 keys at a time. With at most a CTA an SM and more tiles a CTA
     * than 4 warps take at once, 8 warps do the chunk in fewer rounds (an H200, one step, 8
     * K/V heads of 4 query heads: a 192-key cache 6.9 against 10.8 us at batch 1, 8.2 against
     * 11.3 at batch 8; 4096 keys in 16 splits at batch 1, 12.4 against 14.3); with more CTAs
     * the SMs are busy and 4 are as fast or faster (batch 8, 4096 keys: 44.7 against 46.1;
     * batch 64: 261 against 313 us). 8 only where they would fit a CTA of all of a K/V
     * head's query heads, as the template's check of a setting (which knows no SM count)
     * counts them. */
    const int chunk = (p->cap + splits - 1) / splits;
    const long long ctas = (long long)p->batch * (p->heads / cta_heads) * splits;
    if (ctas <= sm_count && chunk > 32 * STOF_DECODE_WARPS &&
        STOF_DECODE_SMEM_BYTES(8, p->heads / p->kv_heads, p->head_dim) <= STOF_DECODE_SMEM_LIMIT)
        return 8;
    return STOF_DECODE_WARPS;
}

int mha_decode_default_warps(const mha_decode_problem *p, int splits, int sm_count) {
    return warps_for(p, splits, mha_decode_default_cta_heads(p, splits, sm_count), sm_count);
}

static int load_kernels(mha_exec_ctx *c, mha_decode_plan *pl, stof_error *err) {
    const mha_decode_problem *p = &pl->problem;
    char o0[32], o1[32], o2[32], o3[32];
    snprintf(o0, sizeof o0, "-DHEAD_DIM=%d", p->head_dim);
    snprintf(o1, sizeof o1, "-DSTOF_DTYPE=%d", (int)p->dtype);
    snprintf(o2, sizeof o2, "-DGROUP=%d", pl->cta_heads);
    snprintf(o3, sizeof o3, "-DDECODE_WARPS=%d", pl->warps);
    nvrtc_request req = {.source = "attention_decode.cu", .arch = c->arch,
                         .options = {o0, o1, o2, o3}, .n_options = 4};
    if (p->rotary_theta > 0.0)
        req.options[req.n_options++] = "-DROTARY=1";
    if (pl->v_read == MHA_DECODE_V_WIDE)
        req.options[req.n_options++] = "-DWIDE_V=1";
    gpu_module *m;
    int rc = gpu_ctx_function(c, &req, STOF_DECODE_KERNEL, 0, &m, err);
    if (rc)
        return rc;
    pl->decode = m->func;
    if ((rc = cuda_check(c->drv, c->drv->ModuleGetFunction(&pl->combine, m->module,
                                                           STOF_DECODE_COMBINE_KERNEL),
                         "cuModuleGetFunction(decode combine)", err)))
        return rc;
    return cuda_check(c->drv, c->drv->ModuleGetFunction(&pl->store, m->module,
                                                       STOF_KV_STORE_KERNEL),
                      "cuModuleGetFunction(kv store)", err);
}

/* Whether mask m allows, at every position, every key the ring of cap slots holds there
 * (pos - cap + 1 .. pos): then the kernel's causal ring is the mask (a causal mask, a window
 * as wide as its cache) and its bits need not be read a key. */
static int mask_is_ring(const mask *m, int cap) {
    for (int b = 0; b < m->batch; b++)
        for (int pos = 0; pos < m->q_len; pos++) {
            int lo = pos - cap + 1 > 0 ? pos - cap + 1 : 0, hi = pos + 1;
            if (mask_row_count_range(mask_row(m, b, pos), lo, hi) != hi - lo)
                return 0;
        }
    return 1;
}

/* The mask's bits (unless the ring is the mask) and the split's workspace on the device. */
static int upload(mha_exec_ctx *c, mha_decode_plan *pl, stof_error *err) {
    const mha_decode_problem *p = &pl->problem;
    int rc = STOF_OK;
    if (p->mask && !mask_is_ring(p->mask, p->cap)) {
        size_t bytes = sizeof(uint64_t) * (size_t)p->mask->batch * (size_t)p->mask->q_len *
                       (size_t)p->mask->words;
        rc = cuda_check(c->drv, c->drv->MemAlloc(&pl->d_mask, bytes),
                        "cuMemAlloc(decode mask)", err);
        if (!rc)
            rc = cuda_check(c->drv, c->drv->MemcpyHtoD(pl->d_mask, p->mask->bits, bytes),
                            "cuMemcpyHtoD(decode mask)", err);
    }
    if (!rc && pl->splits > 1) {
        size_t units = (size_t)p->batch * (size_t)p->heads * (size_t)pl->splits;
        pl->workspace_ml_offset = units * (size_t)p->head_dim * sizeof(float);
        rc = cuda_check(c->drv, c->drv->MemAlloc(&pl->d_workspace, pl->workspace_ml_offset +
                                                                       units * 2 * sizeof(float)),
                        "cuMemAlloc(decode workspace)", err);
    }
    return rc;
}

/* What a CTA of `warps` warps serving `group` query heads must hold: a thread for each pair
 * of the new token's V, and every warp's O of those heads within the static shared memory. */
static int check_warps(const mha_decode_problem *p, int warps, int group, stof_error *err) {
    if (warps * 32 < p->head_dim / 2)
        return err_set(err, STOF_ERR_INVALID, "decode attention: %d warps for heads of %d (at "
                       "least a thread for each pair of dims: %d warps)", warps, p->head_dim,
                       (p->head_dim / 2 + 31) / 32);
    if (STOF_DECODE_SMEM_BYTES(warps, group, p->head_dim) > STOF_DECODE_SMEM_LIMIT)
        return err_set(err, STOF_ERR_UNSUPPORTED, "decode attention: %d warps of %d query heads "
                       "of %d need %d bytes of shared memory (at most %d)", warps, group,
                       p->head_dim, STOF_DECODE_SMEM_BYTES(warps, group, p->head_dim),
                       STOF_DECODE_SMEM_LIMIT);
    return STOF_OK;
}

/* The settings s asks for (NULL: none), each checked, with the defaults for the others. */
static int resolve_settings(const mha_exec_ctx *c, const mha_decode_problem *p,
                            const mha_decode_settings *s, mha_decode_settings *out,
                            stof_error *err) {
    static const mha_decode_settings none = {0};
    const int per_kv = p->heads / p->kv_heads, sms = c->info.sm_count;
    s = s ? s : &none;
    if (s->splits < 0 || s->splits > 1024)
        return err_set(err, STOF_ERR_INVALID, "decode attention: splits %d (0: chosen, up to "
                       "1024)", s->splits);
    if (s->warps < 0 || s->warps > 32)
        return err_set(err, STOF_ERR_INVALID, "decode attention: %d warps (0: chosen, up to 32)",
                       s->warps);
    if (s->cta_heads < 0 || (s->cta_heads && per_kv % s->cta_heads))
        return err_set(err, STOF_ERR_INVALID, "decode attention: %d query heads a CTA (0: "
                       "chosen, else a divisor of the %d query heads a K/V head)", s->cta_heads,
                       per_kv);
    if (s->v_read < MHA_DECODE_V_CHOSEN || s->v_read > MHA_DECODE_V_WIDE)
        return err_set(err, STOF_ERR_INVALID, "decode attention: a V read of %d", s->v_read);
    out->splits = s->splits ? s->splits : mha_decode_default_splits(p, sms);
    out->splits = out->splits < p->cap ? out->splits : p->cap;
    out->cta_heads = s->cta_heads ? s->cta_heads
                                  : mha_decode_default_cta_heads(p, out->splits, sms);
    out->warps = s->warps ? s->warps : warps_for(p, out->splits, out->cta_heads, sms);
    out->v_read = s->v_read ? s->v_read
                            : mha_decode_default_v_read(p, out->splits, out->cta_heads, sms);
    if (out->v_read == MHA_DECODE_V_WIDE &&
        !STOF_DECODE_WIDE_V_BUILDS(p->head_dim, out->cta_heads))
        return err_set(err, STOF_ERR_UNSUPPORTED, "decode attention: V read 16 bytes a lane "
                       "needs heads of 32, 64 or 128 and at most 4 query heads a CTA (heads of "
                       "%d, %d a CTA)", p->head_dim, out->cta_heads);
    return check_warps(p, out->warps, out->cta_heads, err);
}

int mha_decode_plan_create(mha_exec_ctx *c, const mha_decode_problem *p,
                           const mha_decode_settings *s, mha_decode_plan **out, stof_error *err) {
    *out = NULL;
    mha_decode_settings set;
    int rc = mha_decode_validate(p, err);
    if (!rc)
        rc = resolve_settings(c, p, s, &set, err);
    if (rc)
        return rc;
    mha_decode_plan *pl = err_calloc(1, sizeof *pl, err);
    if (!pl)
        return STOF_ERR_NOMEM;
    pl->problem = *p;
    pl->ctx = c;
    pl->splits = set.splits;
    pl->chunk = (p->cap + pl->splits - 1) / pl->splits;
    pl->warps = set.warps;
    pl->cta_heads = set.cta_heads;
    pl->v_read = set.v_read;
    rc = load_kernels(c, pl, err);
    if (!rc)
        rc = upload(c, pl, err);
    if (rc) {
        mha_decode_plan_free(pl);
        return rc;
    }
    *out = pl;
    return STOF_OK;
}

void mha_decode_plan_free(mha_decode_plan *pl) {
    if (!pl)
        return;
    if (pl->d_mask)
        pl->ctx->drv->MemFree(pl->d_mask);
    if (pl->d_workspace)
        pl->ctx->drv->MemFree(pl->d_workspace);
    free(pl);
}

static void fill_args(const mha_decode_plan *pl, stof_decode_args *a) {
    const mha_decode_problem *p = &pl->problem;
    memset(a, 0, sizeof *a);
    a->mask = (const stof_u64 *)(uintptr_t)pl->d_mask;
    a->partial_o = (float *)(uintptr_t)pl->d_workspace;
    a->partial_ml = pl->d_workspace
                        ? (float *)(uintptr_t)(pl->d_workspace + pl->workspace_ml_offset)
                        : NULL;
    a->heads = p->heads;
    a->kv_heads = p->kv_heads;
    a->cap = p->cap;
    a->context = p->context;
    a->words = p->mask ? p->mask->words : 0;
    a->mask_batch = p->mask ? p->mask->batch : 1;
    a->splits = pl->splits;
    a->chunk = pl->chunk;
    a->scale_log2 = p->scale * 1.4426950408889634f;
    a->theta = p->rotary_theta;
}

static int64_t packed_width(const mha_decode_problem *p) {
    return ((int64_t)p->heads + 2 * (int64_t)p->kv_heads) * p->head_dim;
}

static int check_ptr(const char *name, CUdeviceptr ptr, stof_error *err) {
    if (ptr && ptr % 16 == 0)
        return STOF_OK;
    return err_set(err, STOF_ERR_INVALID, "decode attention: %s must be a 16-byte aligned "
                   "device pointer (got 0x%llx)", name, (unsigned long long)ptr);
}

int mha_decode_run(const mha_decode_plan *pl, const mha_decode_tensors *t, CUstream s,
                   stof_error *err) {
    const mha_decode_problem *p = &pl->problem;
    int rc;
    if ((rc = check_ptr("qkv", t->qkv, err)) || (rc = check_ptr("positions", t->positions, err)) ||
        (rc = check_ptr("k_cache", t->k_cache, err)) ||
        (rc = check_ptr("v_cache", t->v_cache, err)) || (rc = check_ptr("o", t->o, err)) ||
        (p->rotary_theta > 0.0 && (rc = check_ptr("rotary_positions", t->rotary_positions, err))))
        return rc;
    stof_decode_args a;
    fill_args(pl, &a);
    a.rotary_positions = (const stof_i32 *)(uintptr_t)t->rotary_positions;
    a.qkv = (const void *)(uintptr_t)t->qkv;
    a.positions = (const stof_i32 *)(uintptr_t)t->positions;
    a.k_cache = (void *)(uintptr_t)t->k_cache;
    a.v_cache = (void *)(uintptr_t)t->v_cache;
    a.o = (void *)(uintptr_t)t->o;
    a.qkv_row_stride = t->qkv_row_stride ? t->qkv_row_stride : packed_width(p);
    if (a.qkv_row_stride < packed_width(p) || a.qkv_row_stride % 8)
        return err_set(err, STOF_ERR_INVALID, "decode attention: a qkv row stride of %lld "
                       "elements (at least the %lld of a row, a multiple of 8: rows 16-byte "
                       "aligned)", (long long)a.qkv_row_stride, (long long)packed_width(p));
    void *params[] = {&a};
    const unsigned grid[3] = {(unsigned)(p->heads / pl->cta_heads), (unsigned)p->batch,
                              (unsigned)pl->splits};
    const unsigned block[3] = {(unsigned)pl->warps * 32, 1, 1};
    const unsigned cgrid[3] = {(unsigned)p->heads, (unsigned)p->batch, 1};
    rc = cuda_launch(pl->ctx->drv, pl->decode, grid, block, 0, s, params, pl->ctx->pdl,
                     "cuLaunchKernel(decode attention)", err);
    if (rc || pl->splits == 1)
        return rc;
    return cuda_launch(pl->ctx->drv, pl->combine, cgrid, block, 0, s, params, pl->ctx->pdl,
                       "cuLaunchKernel(decode combine)", err);
}

int mha_decode_store(const mha_decode_plan *pl, CUdeviceptr qkv, int seq, CUdeviceptr pad_mask,
                     CUdeviceptr k_cache, CUdeviceptr v_cache, CUstream s, stof_error *err) {
    const mha_decode_problem *p = &pl->problem;
    int rc;
    if ((rc = check_ptr("qkv", qkv, err)) || (rc = check_ptr("k_cache", k_cache, err)) ||
        (rc = check_ptr("v_cache", v_cache, err)))
        return rc;
    if (seq < 1)
        return err_set(err, STOF_ERR_INVALID, "kv store: seq %d", seq);
    stof_decode_args a;
    fill_args(pl, &a);
    a.qkv = (const void *)(uintptr_t)qkv;
    a.pad_mask = (const stof_i32 *)(uintptr_t)pad_mask;
    a.k_cache = (void *)(uintptr_t)k_cache;
    a.v_cache = (void *)(uintptr_t)v_cache;
    a.qkv_row_stride = packed_width(p);
    a.seq = seq;
    void *params[] = {&a};
    const unsigned grid[3] = {(unsigned)seq, (unsigned)p->batch, 1};
    const unsigned block[3] = {(unsigned)pl->warps * 32, 1, 1};
    return cuda_launch(pl->ctx->drv, pl->store, grid, block, 0, s, params, pl->ctx->pdl,
                       "cuLaunchKernel(kv store)", err);
}
