/* The attention kernels without a GPU: every variant compiles through NVRTC
 * for sm_80 and sm_90 (the split-row builds with their combine kernel too),
 * the planner's choices for the GPU test's problems compile, and the host
 * planner's CPU pieces (validation, the causal fold, configurations, the
 * split-row work list, the argument block) do what they say. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <sys/stat.h>

#include "check.h"
#include "core/gpu/device.h"
#include "core/base/file.h"
#include "core/exec/attention/mha_exec.h"
#include "kernels/attention_global_abi.cuh"
#include "core/exec/attention/mha_exec_internal.h"
#include "core/gpu/nvrtc.h"
#include "core/exec/attention/mha_decode.h"
#include "ops/mask.h"
#include "ops/mask_format.h"

static const char *archs[] = {"sm_80", "sm_90"};
static const int head_dims[] = {32, 64, 80, 128};
static const stof_dtype dtypes[] = {STOF_F16, STOF_BF16};
/* BLOCK_M, BLOCK_N, NUM_WARPS: the GPU test's settings and the selector's
 * small ones */
static const int block_settings[][3] = {{64, 64, 4},  {128, 64, 4}, {64, 32, 4},
                                        {128, 128, 8}, {16, 16, 1}, {32, 16, 2},
                                        {64, 128, 4}, {32, 32, 1}};
#define N_SETTINGS ((int)(sizeof block_settings / sizeof block_settings[0]))
/* deeper K/V pipelines (STAGES 3, 4) at the settings the GPU test and the
 * measured plans time */
static const int deep_settings[][3] = {{16, 16, 1}, {64, 32, 4}, {64, 64, 4}};
#define N_DEEP ((int)(sizeof deep_settings / sizeof deep_settings[0]))
/* split-row builds (-DSPLIT=1): the GPU test's split settings */
static const int split_settings[][3] = {{64, 64, 4}, {64, 32, 4}, {16, 16, 1}, {128, 64, 4}};
#define N_SPLIT ((int)(sizeof split_settings / sizeof split_settings[0]))

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Whether the n bytes at bin contain the string s (a kernel's name). */
static int bytes_contain(const void *bin, size_t n, const char *s) {
    size_t k = strlen(s);
    const unsigned char *p = bin;
    for (size_t i = 0; i + k <= n; i++)
        if (p[i] == (unsigned char)s[0] && !memcmp(p + i, s, k))
            return 1;
    return 0;
}

/* Compiles one configuration; on failure writes the options and NVRTC's
 * log into msg. Thread-safe with one cache per thread. */
static int compile_one(nvrtc_cache *c, const mha_exec_config *cfg, const char *arch, char *msg,
                       size_t n) {
    mha_exec_request r;
    mha_exec_request_init(&r, cfg, arch);
    const void *bin = NULL;
    size_t size = 0;
    stof_error err = {0};
    int rc = nvrtc_get(c, &r.req, &bin, &size, &err);
    int len = snprintf(msg, n, "%s %s", r.req.source, arch);
    for (int i = 0; i < r.req.n_options && len > 0 && (size_t)len < n; i++)
        len += snprintf(msg + len, n - (size_t)len, " %s", r.req.options[i]);
    if (rc == STOF_OK && !(size > 4 && memcmp(bin, "\x7f" "ELF", 4) == 0)) {
        snprintf(err.msg, sizeof err.msg, "not a cubin");
        rc = STOF_ERR_COMPILE;
    }
    /* the combine kernel is in split builds of the block-wise kernel only */
    const char *combine = STOF_ATTN_COMBINE_KERNEL;
    int want_combine = cfg->kernel == MHA_KERNEL_BLOCK_WISE && cfg->split;
    if (rc == STOF_OK && bytes_contain(bin, size, combine) != want_combine) {
        snprintf(err.msg, sizeof err.msg, "the cubin %s %s", want_combine ? "lacks" : "has",
                 combine);
        rc = STOF_ERR_COMPILE;
    }
    if (rc != STOF_OK && len > 0 && (size_t)len < n)
        snprintf(msg + len, n - (size_t)len, ": %s", err.msg);
    return rc;
}

static int compile_config(nvrtc_cache *c, const mha_exec_config *cfg, const char *arch) {
    char msg[1400];
    int rc = compile_one(c, cfg, arch, msg, sizeof msg);
    CHECK_MSG(rc == STOF_OK, "%s", msg);
    return rc == STOF_OK;
}

typedef struct variant {
    mha_exec_config cfg;
    const char *arch;
    int rc;
    char msg[1400];
} variant;

/* Appends cfg for arch at v[n] when it passes its checks within an H100's
 * 227 KiB of shared memory and there is room; returns the new count. */
static int add_if_valid(variant *v, int n, int cap, mha_exec_config cfg, const char *arch) {
    stof_error err = {0};
    if (mha_exec_config_check(&cfg, 227 * 1024, &err) == STOF_OK && n < cap)
        v[n++] = (variant){.cfg = cfg, .arch = arch};
    return n;
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
        w->v[i].rc = compile_one(&c, &w->v[i].cfg, w->v[i].arch, w->v[i].msg, sizeof w->v[i].msg);
    nvrtc_cache_free(&c);
    return NULL;
}

/* Both archs x dtype x D 64, 128 x deep_settings at STAGES 3 and 4 (what
 * fits an H100), and one relpos variant at STAGES 3. */
static int list_deep_variants(variant *v, int cap) {
    int n = 0;
    for (int a = 0; a < 2; a++)
        for (int d = 0; d < 2; d++)
            for (int h = 1; h <= 3; h += 2) /* head_dims[1] = 64, [3] = 128 */
                for (int s = 0; s < N_DEEP; s++)
                    for (int st = 3; st <= MHA_EXEC_MAX_STAGES; st++) {
                        mha_exec_config cfg = {.kernel = MHA_KERNEL_BLOCK_WISE,
                                               .head_dim = head_dims[h], .dtype = dtypes[d],
                                               .block_m = deep_settings[s][0],
                                               .block_n = deep_settings[s][1],
                                               .num_warps = deep_settings[s][2], .stages = st};
                        n = add_if_valid(v, n, cap, cfg, archs[a]);
                    }
    mha_exec_config rp = {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_BF16,
                          .relpos = 1, .relpos_mid = 256, .block_m = 64, .block_n = 32,
                          .num_warps = 4, .stages = 3};
    if (n < cap)
        v[n++] = (variant){.cfg = rp, .arch = "sm_90"};
    return n;
}

/* Both archs x dtype x D 64, 128 with -DSPLIT=1 at STAGES 2: on sm_90
 * every split_settings entry, on sm_80 the first; then a relpos and a
 * deeper-ring split build on sm_90. */
static int list_split_variants(variant *v, int cap) {
    int n = 0;
    for (int a = 0; a < 2; a++)
        for (int d = 0; d < 2; d++)
            for (int h = 1; h <= 3; h += 2)
                for (int s = 0; s < (a == 0 ? 1 : N_SPLIT); s++) {
                    mha_exec_config cfg = {.kernel = MHA_KERNEL_BLOCK_WISE,
                                           .head_dim = head_dims[h], .dtype = dtypes[d],
                                           .block_m = split_settings[s][0],
                                           .block_n = split_settings[s][1],
                                           .num_warps = split_settings[s][2], .stages = 2,
                                           .split = 1};
                    n = add_if_valid(v, n, cap, cfg, archs[a]);
                }
    mha_exec_config rp = {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 128, .dtype = STOF_F16,
                          .relpos = 1, .relpos_mid = 512, .block_m = 64, .block_n = 64,
                          .num_warps = 4, .stages = 2, .split = 1};
    if (n < cap)
        v[n++] = (variant){.cfg = rp, .arch = "sm_90"};
    mha_exec_config deep = {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_BF16,
                            .block_m = 64, .block_n = 32, .num_warps = 4, .stages = 3,
                            .split = 1};
    if (n < cap)
        v[n++] = (variant){.cfg = deep, .arch = "sm_90"};
    return n;
}

/* The wgmma builds (sm_90 only, compiled for sm_90a): dtype x every head_dim
 * x wgmma_settings at STAGES 3, then relpos, split and deeper-ring ones. */
static const int wgmma_settings[][3] = {{64, 16, 4},  {64, 32, 4},   {64, 64, 4},
                                        {64, 128, 4}, {128, 64, 8}, {128, 128, 8}};
#define N_WGMMA ((int)(sizeof wgmma_settings / sizeof wgmma_settings[0]))

static int list_wgmma_variants(variant *v, int cap) {
    int n = 0;
    for (int d = 0; d < 2; d++)
        for (int h = 0; h < 4; h++)
            for (int s = 0; s < N_WGMMA; s++) {
                mha_exec_config cfg = {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = head_dims[h],
                                       .dtype = dtypes[d], .block_m = wgmma_settings[s][0],
                                       .block_n = wgmma_settings[s][1],
                                       .num_warps = wgmma_settings[s][2], .stages = 3,
                                       .wgmma = 1};
                n = add_if_valid(v, n, cap, cfg, "sm_90");
            }
    static const mha_exec_config extra[] = {
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_BF16, .relpos = 1,
         .relpos_mid = 256, .block_m = 64, .block_n = 64, .num_warps = 4, .stages = 3,
         .wgmma = 1},
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 128, .dtype = STOF_F16, .relpos = 1,
         .block_m = 128, .block_n = 32, .num_warps = 8, .stages = 3, .split = 1, .wgmma = 1},
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_F16, .block_m = 64,
         .block_n = 32, .num_warps = 4, .stages = 4, .split = 1, .wgmma = 1},
    };
    for (size_t i = 0; i < sizeof extra / sizeof extra[0] && n < cap; i++)
        v[n++] = (variant){.cfg = extra[i], .arch = "sm_90"};
    return n;
}

/* The TMA builds (sm_90, mma.sync): dtype x head_dim 64, 128 x
 * tma_settings at STAGES 2 and 3, then relpos and split ones. */
static const int tma_settings[][3] = {{32, 32, 2}, {32, 32, 1}, {64, 32, 4}, {64, 64, 4},
                                      {128, 64, 4}, {16, 16, 1}};
#define N_TMA ((int)(sizeof tma_settings / sizeof tma_settings[0]))

static int list_tma_variants(variant *v, int cap) {
    int n = 0;
    for (int d = 0; d < 2; d++)
        for (int h = 1; h <= 3; h += 2)
            for (int s = 0; s < N_TMA; s++) {
                mha_exec_config cfg = {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = head_dims[h],
                                       .dtype = dtypes[d], .block_m = tma_settings[s][0],
                                       .block_n = tma_settings[s][1],
                                       .num_warps = tma_settings[s][2], .stages = 2 + s % 2,
                                       .tma = 1};
                n = add_if_valid(v, n, cap, cfg, "sm_90");
            }
    static const mha_exec_config extra[] = {
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_BF16, .relpos = 1,
         .relpos_mid = 256, .block_m = 32, .block_n = 32, .num_warps = 2, .stages = 3,
         .tma = 1},
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 128, .dtype = STOF_F16, .relpos = 1,
         .block_m = 64, .block_n = 32, .num_warps = 4, .stages = 2, .split = 1, .tma = 1},
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_F16, .block_m = 32,
         .block_n = 32, .num_warps = 2, .stages = 4, .split = 1, .tma = 1},
        /* the wgmma build at head size 64 */
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_F16, .block_m = 64,
         .block_n = 64, .num_warps = 4, .stages = 3, .wgmma = 1, .tma = 1},
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_BF16, .block_m = 128,
         .block_n = 64, .num_warps = 8, .stages = 3, .wgmma = 1, .tma = 1},
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_F16, .block_m = 64,
         .block_n = 16, .num_warps = 4, .stages = 4, .wgmma = 1, .tma = 1},
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_BF16, .relpos = 1,
         .relpos_mid = 256, .block_m = 64, .block_n = 32, .num_warps = 4, .stages = 3,
         .split = 1, .wgmma = 1, .tma = 1},
        /* run-time padding (-DPADDING=1): every build kind */
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_F16, .padded = 1,
         .block_m = 64, .block_n = 128, .num_warps = 4, .stages = 3, .wgmma = 1, .tma = 1},
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_BF16, .padded = 1,
         .block_m = 32, .block_n = 32, .num_warps = 2, .stages = 2, .tma = 1},
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 128, .dtype = STOF_F16, .padded = 1,
         .relpos = 1, .block_m = 64, .block_n = 32, .num_warps = 4, .stages = 2, .split = 1,
         .tma = 1},
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_F16, .padded = 1,
         .block_m = 64, .block_n = 64, .num_warps = 4, .stages = 3, .split = 1, .wgmma = 1},
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_F16, .padded = 1,
         .block_m = 64, .block_n = 64, .num_warps = 4, .stages = 2},
        {.kernel = MHA_KERNEL_ROW_WISE, .head_dim = 64, .dtype = STOF_BF16, .padded = 1,
         .rows_per_warp = 2, .warps_per_block = 4},
        /* global tokens' log-sum-exp (-DLSE=1): every build kind */
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_F16, .padded = 1,
         .block_m = 64, .block_n = 128, .num_warps = 4, .stages = 3, .wgmma = 1, .tma = 1,
         .lse = 1},
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_BF16, .padded = 1,
         .block_m = 64, .block_n = 64, .num_warps = 4, .stages = 3, .split = 1, .wgmma = 1,
         .lse = 1},
        {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 128, .dtype = STOF_F16, .block_m = 64,
         .block_n = 32, .num_warps = 4, .stages = 2, .split = 1, .lse = 1},
        {.kernel = MHA_KERNEL_ROW_WISE, .head_dim = 80, .dtype = STOF_BF16, .padded = 1,
         .rows_per_warp = 1, .warps_per_block = 4, .lse = 1},
    };
    for (size_t i = 0; i < sizeof extra / sizeof extra[0] && n < cap; i++)
        v[n++] = (variant){.cfg = extra[i], .arch = "sm_90"};
    return n;
}

/* The variant list: on sm_90 both kernels x dtype x head_dim x relpos, the
 * block-wise kernel at every setting of block_settings (with relpos at the
 * first two); on sm_80 the row-wise kernel and the first block setting; all
 * at STAGES 2. Then the deep, wgmma and split lists. */
static int list_variants(variant *v, int cap) {
    int n = 0;
    for (int a = 0; a < 2; a++)
        for (int d = 0; d < 2; d++)
            for (int h = 0; h < 4; h++)
                for (int rp = 0; rp < 2; rp++) {
                    mha_exec_config cfg = {.kernel = MHA_KERNEL_ROW_WISE, .head_dim = head_dims[h],
                                           .dtype = dtypes[d], .relpos = rp,
                                           .rows_per_warp = 1, .warps_per_block = 4};
                    if (n < cap)
                        v[n++] = (variant){.cfg = cfg, .arch = archs[a]};
                    cfg.kernel = MHA_KERNEL_BLOCK_WISE;
                    cfg.stages = 2;
                    int settings = a == 0 ? 1 : rp ? 2 : N_SETTINGS;
                    for (int s = 0; s < settings; s++) {
                        cfg.block_m = block_settings[s][0];
                        cfg.block_n = block_settings[s][1];
                        cfg.num_warps = block_settings[s][2];
                        n = add_if_valid(v, n, cap, cfg, archs[a]);
                    }
                }
    mha_exec_config many = {.kernel = MHA_KERNEL_ROW_WISE, .head_dim = 64, .dtype = STOF_F16,
                            .rows_per_warp = 4, .warps_per_block = 8};
    if (n < cap)
        v[n++] = (variant){.cfg = many, .arch = "sm_90"};
    n += list_deep_variants(v + n, cap - n);
    n += list_wgmma_variants(v + n, cap - n);
    n += list_tma_variants(v + n, cap - n);
    return n + list_split_variants(v + n, cap - n);
}

#define N_WORKERS 8

/* Compiles v[0..n) on N_WORKERS threads; the number that compiled. */
static int compile_all(variant *v, int n) {
    pthread_t tid[N_WORKERS];
    worker w[N_WORKERS];
    int started = 0;
    for (int i = 0; i < N_WORKERS; i++) {
        w[i] = (worker){.v = v, .n = n, .stride = N_WORKERS, .first = i};
        if (pthread_create(&tid[i], NULL, compile_worker, &w[i]) != 0)
            compile_worker(&w[i]); /* no thread: do its share here */
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

static void test_variants_compile(void) {
    enum { CAP = 500 };
    variant *v = calloc(CAP, sizeof *v);
    CHECK(v != NULL);
    if (!v)
        return;
    int n = list_variants(v, CAP);
    double t0 = now_s();
    int ok = compile_all(v, n);
    printf("compiled %d of %d attention kernel variants in %.1f s (%d threads)\n", ok, n,
           now_s() - t0, N_WORKERS);
    CHECK(n >= 180);
    int splits = 0, wgmma = 0, tma = 0;
    for (int i = 0; i < n; i++) {
        splits += v[i].cfg.split;
        wgmma += v[i].cfg.wgmma;
        tma += v[i].cfg.tma;
    }
    printf("  of which %d split-row builds (kernel + %s), %d wgmma builds (sm_90a), %d TMA "
           "builds\n",
           splits, STOF_ATTN_COMBINE_KERNEL, wgmma, tma);
    CHECK(splits >= 20);
    CHECK(wgmma >= 40);
    CHECK(tma >= 24);
    free(v);
}

/* ---- problems and the causal fold ---------------------------------------------- */

static mha_exec_problem base_problem(int batch, int q_len, int k_len) {
    mha_exec_problem p = {.batch = batch, .heads = 2, .head_dim = 64, .q_len = q_len,
                          .k_len = k_len, .dtype = STOF_F16, .scale = 0.125f};
    return p;
}

static mask *build(const char *text, int batch, int q_len, int k_len) {
    stof_error err = {0};
    mask *m = NULL;
    int rc = mask_build_text(text, batch, q_len, k_len, &m, &err);
    CHECK_MSG(rc == STOF_OK, "%s: %s", text, err.msg);
    return m;
}

/* The folded mask is exactly mask AND (j <= i + k_len - q_len), batch by batch. */
static void check_fold(const char *text, int batch, int q_len, int k_len, int causal) {
    mask *m = text ? build(text, batch, q_len, k_len) : NULL;
    if (text && !m)
        return;
    mha_exec_problem p = base_problem(batch, q_len, k_len);
    p.mask = m;
    p.causal = causal;
    mask *f = NULL;
    stof_error err = {0};
    int rc = mha_exec_fold_mask(&p, &f, &err);
    CHECK_MSG(rc == STOF_OK, "fold %s: %s", text ? text : "(none)", err.msg);
    if (rc == STOF_OK) {
        CHECK_EQ_INT(f->batch, m ? m->batch : 1);
        CHECK_EQ_INT(f->q_len, q_len);
        CHECK_EQ_INT(f->k_len, k_len);
        CHECK(f->fingerprint == mask_compute_fingerprint(f));
        long bad = 0;
        for (int b = 0; b < batch; b++)
            for (int i = 0; i < q_len; i++)
                for (int j = 0; j < k_len; j++) {
                    int want = (m ? mask_get(m, b, i, j) : 1) &&
                               (!causal || j <= i + (k_len - q_len));
                    bad += mask_get(f, b, i, j) != want;
                }
        CHECK_MSG(bad == 0, "fold %s causal=%d %dx%d: %ld wrong bits", text ? text : "(none)",
                  causal, q_len, k_len, bad);
    }
    mask_free(f);
    mask_free(m);
}

static void test_fold(void) {
    check_fold(NULL, 2, 100, 100, 0);
    check_fold(NULL, 2, 100, 100, 1);
    check_fold(NULL, 1, 37, 100, 1);   /* cross: bottom-right aligned */
    check_fold(NULL, 1, 100, 37, 1);   /* more queries than keys: early rows empty */
    check_fold("sliding_window{band=5}", 2, 130, 130, 1);
    check_fold("bigbird{}", 1, 257, 257, 1);
    check_fold("key_padding{lengths=[3, 90, 0]}", 3, 70, 90, 1);
    check_fold("per_batch(sliding_window{band=3}, longformer{})", 2, 65, 65, 1);
    check_fold("union(random{rate=0.3, block=8}, sliding_window{})", 1, 100, 100, 0);
}

/* ---- validation ------------------------------------------------------------------- */

static void expect(int rc, int want, const stof_error *err, const char *needle) {
    CHECK_EQ_INT(rc, want);
    if (needle)
        CHECK_CONTAINS(err->msg, needle);
}

static void test_validate(void) {
    stof_error err = {0};
    mha_exec_problem p = base_problem(2, 64, 64);
    CHECK_EQ_INT(mha_exec_validate(&p, &err), STOF_OK);

    p.head_dim = 96;
    expect(mha_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED, &err, "32, 64, 80, 128");
    p = base_problem(2, 64, 64);
    p.dtype = STOF_F32;
    expect(mha_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED, &err, "fp32");
    p = base_problem(0, 64, 64);
    expect(mha_exec_validate(&p, &err), STOF_ERR_INVALID, &err, "positive");
    p = base_problem(2, 64, 64);
    p.scale = NAN;
    expect(mha_exec_validate(&p, &err), STOF_ERR_INVALID, &err, "scale");

    mask *m = build("sliding_window{band=4}", 1, 64, 80);
    p = base_problem(2, 64, 64);
    p.mask = m;
    expect(mha_exec_validate(&p, &err), STOF_ERR_SHAPE, &err, "64 x 80");
    mask_free(m);
    m = build("key_padding{lengths=[1, 2, 3]}", 3, 64, 64);
    p.mask = m;
    expect(mha_exec_validate(&p, &err), STOF_ERR_SHAPE, &err, "batch 3");
    mask *f = NULL;
    expect(mha_exec_fold_mask(&p, &f, &err), STOF_ERR_SHAPE, &err, "batch 3");
    CHECK(f == NULL);
    mask_free(m);

    p = base_problem(2, 64, 64);
    p.relpos = 1;
    p.relpos_buckets = 32;
    p.relpos_max_distance = 128;
    CHECK_EQ_INT(mha_exec_validate(&p, &err), STOF_OK);
    p.relpos_max_distance = 8;
    expect(mha_exec_validate(&p, &err), STOF_ERR_INVALID, &err, "relpos_max_distance");
    p.relpos_buckets = 1;
    expect(mha_exec_validate(&p, &err), STOF_ERR_INVALID, &err, "relpos_buckets");
}

static void test_configs(void) {
    stof_error err = {0};
    /* (BLOCK_M + 2 STAGES BLOCK_N) (HEAD_DIM + 8) element bytes */
    CHECK_EQ_INT(mha_exec_block_smem(64, 64, 2, 64, 2), (64 + 4 * 64) * 72 * 2);
    CHECK_EQ_INT(mha_exec_block_smem(64, 64, 4, 64, 2), (64 + 8 * 64) * 72 * 2);
    CHECK_EQ_INT(mha_exec_block_smem(16, 16, 3, 128, 2), (16 + 6 * 16) * 136 * 2);
    mha_exec_config c = {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 128, .dtype = STOF_F16,
                         .block_m = 128, .block_n = 128, .num_warps = 8, .stages = 2};
    CHECK_EQ_INT(mha_exec_config_check(&c, 227 * 1024, &err), STOF_OK);
    expect(mha_exec_config_check(&c, 164 * 1024, &err), STOF_ERR_UNSUPPORTED, &err,
           "shared memory");
    c.stages = 3; /* 243712 B */
    expect(mha_exec_config_check(&c, 227 * 1024, &err), STOF_ERR_UNSUPPORTED, &err, "3 stages");
    c.stages = 0;
    expect(mha_exec_config_check(&c, 0, &err), STOF_ERR_INVALID, &err, "K/V stages");
    c.stages = 5;
    expect(mha_exec_config_check(&c, 0, &err), STOF_ERR_INVALID, &err, "got 5");
    c.stages = 2;
    c.num_warps = 16; /* 128 / 16 = 8 rows a warp: not a whole tile */
    expect(mha_exec_config_check(&c, 0, &err), STOF_ERR_INVALID, &err, "16-row tiles");
    c.num_warps = 4;
    c.block_n = 40;
    expect(mha_exec_config_check(&c, 0, &err), STOF_ERR_INVALID, &err, "multiples of 16");
    c.block_n = 64;
    c.head_dim = 48;
    expect(mha_exec_config_check(&c, 0, &err), STOF_ERR_UNSUPPORTED, &err, "head_dim 48");
    c.head_dim = 64;
    c.kernel = MHA_KERNEL_ROW_WISE;
    c.rows_per_warp = 0;
    c.warps_per_block = 4;
    expect(mha_exec_config_check(&c, 0, &err), STOF_ERR_INVALID, &err, "row-wise");

    /* register budget: one 16-row tile of D=128 with BLOCK_N 128 fits, two do not */
    CHECK(mha_exec_block_regs_ok(128, 128, 8, 128));
    CHECK(mha_exec_block_regs_ok(128, 64, 4, 64));
    CHECK(!mha_exec_block_regs_ok(128, 64, 4, 128));
    CHECK(!mha_exec_block_regs_ok(128, 32, 1, 64));

    c = (mha_exec_config){.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_F16,
                          .block_m = 128, .block_n = 64, .num_warps = 4, .stages = 2};

    mha_exec_request r;
    c.kernel = MHA_KERNEL_BLOCK_WISE;
    c.relpos = 1;
    c.stages = 3;
    mha_exec_request_init(&r, &c, "sm_90");
    CHECK(strcmp(r.req.source, "attention_block.cu") == 0);
    CHECK(strcmp(r.req.arch, "sm_90") == 0);
    int seen = 0;
    for (int i = 0; i < r.req.n_options; i++)
        seen += !strcmp(r.req.options[i], "-DHAS_RELPOS=1") +
                !strcmp(r.req.options[i], "-DBLOCK_N=64") +
                !strcmp(r.req.options[i], "-DHEAD_DIM=64") + !strcmp(r.req.options[i], "-DSTAGES=3");
    CHECK_EQ_INT(seen, 4);
    /* the depth is part of the cache key; the row-wise kernel has none */
    mha_exec_request r2;
    c.stages = 4;
    mha_exec_request_init(&r2, &c, "sm_90");
    CHECK(nvrtc_key(&r.req) != nvrtc_key(&r2.req));
    /* the split build: -DSPLIT=1 and its own cache key; the plain one has no SPLIT */
    for (int i = 0; i < r2.req.n_options; i++)
        CHECK_MSG(strncmp(r2.req.options[i], "-DSPLIT", 7) != 0, "plain build got %s",
                  r2.req.options[i]);
    mha_exec_request r3;
    c.split = 1;
    mha_exec_request_init(&r3, &c, "sm_90");
    CHECK(nvrtc_key(&r3.req) != nvrtc_key(&r2.req));
    CHECK(!strcmp(r3.req.options[r3.req.n_options - 1], "-DSPLIT=1"));
    c.split = 0;
    c.kernel = MHA_KERNEL_ROW_WISE;
    mha_exec_request_init(&r2, &c, "sm_90");
    for (int i = 0; i < r2.req.n_options; i++)
        CHECK_MSG(strncmp(r2.req.options[i], "-DSTAGES", 8) != 0, "row-wise got %s",
                  r2.req.options[i]);
}

/* The wgmma build: its shapes, its target (sm_90a on an sm_90 device, never
 * elsewhere), its option and cache key. */
/* The TMA build: which configurations take it by default (sm_90+, mma.sync,
 * head sizes that are multiples of 64), its checks, option and shared
 * memory (unpadded K/V stages, 1024-byte alignment, a barrier a stage). */
static int tma_choice(const char *arch, int head_dim, int bm, int bn, int w, int force_tma,
                      int force_wgmma) {
    mha_device_limits lim;
    stof_error err = {0};
    CHECK_EQ_INT(mha_limits_for_arch(arch, &lim, &err), STOF_OK);
    mha_exec_problem p = {.batch = 2, .heads = 2, .head_dim = head_dim, .q_len = 256,
                          .k_len = 256, .dtype = STOF_F16, .scale = 0.125f};
    mha_exec_force f = {.kernel = MHA_KERNEL_BLOCK_WISE, .block_m = bm, .block_n = bn,
                        .num_warps = w, .tma = force_tma, .wgmma = force_wgmma};
    mha_exec_config c;
    char why[256];
    CHECK_EQ_INT(mha_exec_choose(&p, NULL, &lim, &f, &c, why, sizeof why, &err), STOF_OK);
    return c.tma;
}

static void test_tma_configs(void) {
    CHECK(tma_choice("sm_90", 64, 32, 32, 2, 0, 0));
    CHECK(tma_choice("sm_90", 128, 64, 32, 4, 0, -1));
    CHECK(tma_choice("sm_90", 64, 64, 32, 4, 0, 0));   /* wgmma at 64: its tiles are TMA's */
    CHECK(!tma_choice("sm_90", 128, 64, 32, 4, 0, 0)); /* wgmma at 128: cp.async */
    CHECK(!tma_choice("sm_90", 64, 32, 32, 2, -1, 0)); /* forced off */
    CHECK(!tma_choice("sm_90", 80, 32, 32, 2, 0, 0));  /* 160-byte rows: cp.async */
    CHECK(!tma_choice("sm_80", 64, 32, 32, 2, 0, 0));  /* no TMA before sm_90 */
    CHECK(tma_choice("sm_80", 64, 32, 32, 2, 1, 0));   /* forced: the plan refuses it */
    CHECK(device_tma_arch("sm_90") && device_tma_arch("sm_100") && device_tma_arch("sm_120"));
    CHECK(!device_tma_arch("sm_89") && !device_tma_arch("sm_90a") && !device_tma_arch(NULL));

    stof_error err = {0};
    mha_exec_config c = {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_F16,
                         .block_m = 32, .block_n = 32, .num_warps = 2, .stages = 3, .tma = 1};
    CHECK_EQ_INT(mha_exec_config_check(&c, 227 * 1024, &err), STOF_OK);
    CHECK_EQ_INT((int)mha_exec_config_smem(&c), 1024 + 2 * 3 * 32 * 64 * 2 + 32 * 72 * 2 + 8 * 3);
    c.relpos = 1;
    c.relpos_mid = 128;
    CHECK_EQ_INT((int)mha_exec_config_smem(&c),
                 1024 + 2 * 3 * 32 * 64 * 2 + 32 * 72 * 2 + 128 * 4 + 8 * 3);
    mha_exec_request r;
    mha_exec_request_init(&r, &c, "sm_90");
    CHECK(strcmp(r.req.arch, "sm_90") == 0); /* not the architecture-specific target */
    CHECK(!strcmp(r.req.options[r.req.n_options - 1], "-DTMA=1"));
    c.head_dim = 80;
    expect(mha_exec_config_check(&c, 0, &err), STOF_ERR_UNSUPPORTED, &err, "multiple of 64");
    c.head_dim = 64;
    c.block_m = 64;
    c.num_warps = 4;
    c.wgmma = 1;
    CHECK_EQ_INT(mha_exec_config_check(&c, 0, &err), STOF_OK);
    c.head_dim = 128;
    expect(mha_exec_config_check(&c, 0, &err), STOF_ERR_UNSUPPORTED, &err, "with wgmma");
}

static void test_wgmma_configs(void) {
    stof_error err = {0};
    mha_exec_config c = {.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_BF16,
                         .block_m = 128, .block_n = 64, .num_warps = 8, .stages = 3, .wgmma = 1};
    CHECK_EQ_INT(mha_exec_config_check(&c, 227 * 1024, &err), STOF_OK);
    c.num_warps = 4; /* 32 rows a warp: the build needs 16 */
    expect(mha_exec_config_check(&c, 0, &err), STOF_ERR_INVALID, &err, "16 rows a warp");
    c.block_m = 32;
    c.num_warps = 2; /* half a warpgroup */
    expect(mha_exec_config_check(&c, 0, &err), STOF_ERR_INVALID, &err, "multiple of 64");
    c.block_m = 64;
    c.num_warps = 4;
    c.block_n = 48; /* a multiple of 16, but no instruction shape of the build */
    expect(mha_exec_config_check(&c, 0, &err), STOF_ERR_INVALID, &err,
           "tiles of 16, 32, 64 or 128 keys");
    c.block_n = 32;
    CHECK_EQ_INT(mha_exec_config_check(&c, 0, &err), STOF_OK);
    c.block_n = 128; /* 128 keys a tile: an instruction shape */
    CHECK_EQ_INT(mha_exec_config_check(&c, 0, &err), STOF_OK);
    c.block_n = 256; /* none */
    expect(mha_exec_config_check(&c, 0, &err), STOF_ERR_INVALID, &err, "got 256");
    c.block_n = 32;
    c.stages = 2; /* the previous block's V stays while the next one loads */
    expect(mha_exec_config_check(&c, 0, &err), STOF_ERR_INVALID, &err, "at least 3 K/V stages");
    c.stages = 3;
    c.wgmma = 0; /* the mma.sync build takes 32 rows a warp and BLOCK_N 48 */
    c.num_warps = 2;
    c.block_n = 48;
    CHECK_EQ_INT(mha_exec_config_check(&c, 0, &err), STOF_OK);

    CHECK(device_wgmma_arch("sm_90"));
    CHECK(!device_wgmma_arch("sm_80"));
    CHECK(!device_wgmma_arch("sm_89"));
    CHECK(!device_wgmma_arch(NULL));
    c = (mha_exec_config){.kernel = MHA_KERNEL_BLOCK_WISE, .head_dim = 64, .dtype = STOF_F16,
                          .block_m = 64, .block_n = 64, .num_warps = 4, .stages = 3, .wgmma = 1};
    char arch[16];
    mha_exec_config_arch(&c, "sm_90", arch, sizeof arch);
    CHECK(strcmp(arch, "sm_90a") == 0);
    mha_exec_config_arch(&c, "sm_80", arch, sizeof arch);
    CHECK(strcmp(arch, "sm_80") == 0); /* the plan refuses it there (plan_finish) */
    mha_exec_request r, plain;
    mha_exec_request_init(&r, &c, "sm_90");
    CHECK(strcmp(r.req.arch, "sm_90a") == 0);
    CHECK(!strcmp(r.req.options[r.req.n_options - 1], "-DWGMMA=1"));
    c.wgmma = 0;
    mha_exec_request_init(&plain, &c, "sm_90");
    CHECK(strcmp(plain.req.arch, "sm_90") == 0);
    CHECK(nvrtc_key(&r.req) != nvrtc_key(&plain.req));
    for (int i = 0; i < plain.req.n_options; i++)
        CHECK_MSG(strncmp(plain.req.options[i], "-DWGMMA", 7) != 0, "mma.sync build got %s",
                  plain.req.options[i]);
    /* forced without a depth, the wgmma build gets at least 3 stages */
    {
        mha_device_limits lim;
        CHECK_EQ_INT(mha_limits_for_arch("sm_90", &lim, &err), STOF_OK);
        mha_exec_problem p = base_problem(2, 256, 256);
        mha_exec_force f = {.kernel = MHA_KERNEL_BLOCK_WISE, .block_m = 64, .block_n = 64,
                            .num_warps = 4, .wgmma = 1};
        mha_exec_config got;
        char reason[128];
        CHECK_EQ_INT(mha_exec_choose(&p, NULL, &lim, &f, &got, reason, sizeof reason, &err),
                     STOF_OK);
        CHECK(got.wgmma && got.stages >= MHA_EXEC_WGMMA_MIN_STAGES);
        CHECK_EQ_INT(mha_exec_config_check(&got, lim.smem_per_block, &err), STOF_OK);
    }
    /* a split wgmma build compiles through NVRTC (an sm_90a cubin) */
    nvrtc_cache cache;
    nvrtc_cache_init(&cache, "");
    c.wgmma = 1;
    c.split = 1;
    compile_config(&cache, &c, "sm_90");
    nvrtc_cache_free(&cache);
}

/* Blocks per SM and the automatic depth on an H100's limits (228 KiB an SM,
 * 227 KiB a block, 64 warps; 1 KiB reserved per block). */
static void test_stages(void) {
    mha_device_limits lim;
    stof_error err = {0};
    CHECK_EQ_INT(mha_limits_for_arch("sm_90", &lim, &err), STOF_OK);
    /* 16x16 w1 D=64: 11520 B + 1 KiB -> 18 blocks; STAGES 4: 21760 B -> 10 */
    CHECK_EQ_INT(mha_exec_block_ctas_per_sm(16, 16, 1, 2, 64, 2, &lim), 18);
    CHECK_EQ_INT(mha_exec_block_ctas_per_sm(16, 16, 1, 4, 64, 2, &lim), 10);
    CHECK_EQ_INT(mha_exec_block_ctas_per_sm(128, 128, 8, 3, 128, 2, &lim), 0); /* too big */
    /* 128x16 w8 D=32: 15360 B -> 14 by shared memory, 64 / 8 = 8 by warps */
    CHECK_EQ_INT(mha_exec_block_ctas_per_sm(128, 16, 8, 2, 32, 2, &lim), 8);
    /* resident blocks 18, 13, 10: deeper rings cost blocks -> 2 */
    CHECK_EQ_INT(mha_exec_auto_stages(16, 16, 1, 64, 2, &lim), 2);
    /* 8, 6, 4 -> 2 */
    CHECK_EQ_INT(mha_exec_auto_stages(64, 32, 4, 64, 2, &lim), 2);
    CHECK_EQ_INT(mha_exec_auto_stages(64, 64, 4, 64, 2, &lim), 2);
    /* 128x16 w8 D=32: 8 blocks by warps at every depth -> the deepest, 4 */
    CHECK_EQ_INT(mha_exec_auto_stages(128, 16, 8, 32, 2, &lim), 4);
    /* D=128: STAGES 3 leaves one block an SM -> 2 */
    CHECK_EQ_INT(mha_exec_auto_stages(64, 64, 4, 128, 2, &lim), 2);
    CHECK_EQ_INT(mha_exec_auto_stages(128, 128, 8, 128, 2, &lim), 2);
    /* whatever the setting, the choice fits and keeps 2 blocks an SM when deeper than 2 */
    static const char *arch_names[] = {"sm_80", "sm_86", "sm_89", "sm_90"};
    for (int a = 0; a < 4; a++) {
        CHECK_EQ_INT(mha_limits_for_arch(arch_names[a], &lim, &err), STOF_OK);
        for (int bm = 16; bm <= 128; bm *= 2)
            for (int bn = 16; bn <= 128; bn *= 2)
                for (int w = 1; w * 16 <= bm && w <= 8; w *= 2)
                    for (int h = 0; h < 4; h++) {
                        int st = mha_exec_auto_stages(bm, bn, w, head_dims[h], 2, &lim);
                        int ctas = mha_exec_block_ctas_per_sm(bm, bn, w, st, head_dims[h], 2,
                                                              &lim);
                        CHECK_MSG(st >= 2 && st <= 4 && (st == 2 || ctas >= 2),
                                  "%s %dx%d w%d D=%d: stages %d, %d blocks an SM",
                                  arch_names[a], bm, bn, w, head_dims[h], st, ctas);
                    }
    }
}

static void choose_offline(int paper) {
    mha_device_limits lim;
    stof_error err = {0};
    CHECK_EQ_INT(mha_limits_for_arch("sm_90", &lim, &err), STOF_OK);
    nvrtc_cache c;
    nvrtc_cache_init(&c, "");
    struct { const char *mask; int batch, s, d; } cases[] = {
        {NULL, 2, 257, 64}, {"bigbird{}", 2, 1024, 128}, {"sliding_window{}", 2, 1000, 64},
        {"bigbird{}", 16, 4096, 64}, {"dilated{}", 2, 512, 128},
        {"sliding_window{band=2}", 2, 4096, 64},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mask *m = cases[i].mask ? build(cases[i].mask, cases[i].batch, cases[i].s, cases[i].s)
                                : NULL;
        mha_exec_problem p = base_problem(cases[i].batch, cases[i].s, cases[i].s);
        p.heads = 12;
        p.head_dim = cases[i].d;
        p.mask = m;
        mask *f = NULL;
        mha_exec_config cfg;
        char reason[160];
        int rc = mha_exec_fold_mask(&p, &f, &err);
        if (!rc)
            rc = mha_exec_choose(&p, f, &lim, NULL, &cfg, reason, sizeof reason, &err);
        CHECK_MSG(rc == STOF_OK, "%s: %s", cases[i].mask ? cases[i].mask : "dense", err.msg);
        if (!rc) {
            printf("sm_90 %-24s B=%-2d S=%-4d D=%-3d -> %s", cases[i].mask ? cases[i].mask : "dense",
                   cases[i].batch, cases[i].s, cases[i].d, mha_kernel_name(cfg.kernel));
            if (cfg.kernel == MHA_KERNEL_BLOCK_WISE)
                printf(" (%d, %d, %d) stages %d", cfg.block_m, cfg.block_n, cfg.num_warps,
                       cfg.stages);
            printf(": %s\n", reason);
            CHECK_EQ_INT(mha_exec_config_check(&cfg, lim.smem_per_block, &err), STOF_OK);
            if (cfg.kernel == MHA_KERNEL_BLOCK_WISE)
                CHECK(mha_exec_block_regs_ok(cfg.block_m, cfg.block_n, cfg.num_warps, cfg.head_dim));
            compile_config(&c, &cfg, "sm_90");
            if (paper && i == sizeof cases / sizeof cases[0] - 1)
                CHECK_EQ_INT(cfg.kernel, MHA_KERNEL_ROW_WISE);
            if (!paper)
                CHECK_CONTAINS(reason, "cost model (sm_90");
        }
        /* forced block-wise without sizes takes Eq. 2's */
        mha_exec_force force = {.kernel = MHA_KERNEL_BLOCK_WISE};
        if (!rc && !mha_exec_choose(&p, f, &lim, &force, &cfg, reason, sizeof reason, &err))
            CHECK(cfg.kernel == MHA_KERNEL_BLOCK_WISE && cfg.block_m >= 16 && cfg.num_warps >= 1);
        mask_free(f);
        mask_free(m);
    }
    nvrtc_cache_free(&c);
}

/* ---- measured plans: the candidate list --------------------------------------------- */

static int count_kind(const mha_exec_config *c, int n, mha_kernel k) {
    int x = 0;
    for (int i = 0; i < n; i++)
        x += c[i].kernel == k;
    return x;
}

/* The candidates of one problem: the analytical choice first, distinct,
 * all valid for the device; returns the count (0 on error). */
static int candidates_of(const char *spec, int batch, int s, int d, const mha_exec_force *force,
                         const mha_device_limits *lim, mha_exec_config *out, int cap) {
    mask *m = build(spec, batch, s, s);
    if (!m)
        return 0;
    mha_exec_problem p = base_problem(batch, s, s);
    p.heads = 12;
    p.head_dim = d;
    p.mask = m;
    mask *f = NULL;
    stof_error err = {0};
    int n = 0, rc = mha_exec_fold_mask(&p, &f, &err);
    char reason[256], why[160];
    mha_exec_config analytic;
    if (!rc)
        rc = mha_exec_candidates(&p, f, lim, force, out, cap, &n, reason, sizeof reason, &err);
    if (!rc)
        rc = mha_exec_choose(&p, f, lim, force, &analytic, why, sizeof why, &err);
    CHECK_MSG(rc == STOF_OK, "candidates %s: %s", spec, err.msg);
    if (!rc) {
        CHECK(n >= 1 && !memcmp(&out[0], &analytic, sizeof analytic));
        CHECK(strcmp(reason, why) == 0);
        printf("candidates %s B=%d S=%d D=%d measure=%d:", spec, batch, s, d, force->measure);
        for (int i = 0; i < n; i++) {
            if (out[i].kernel == MHA_KERNEL_BLOCK_WISE)
                printf(" (%d,%d,%d,s%d)", out[i].block_m, out[i].block_n, out[i].num_warps,
                       out[i].stages);
            else
                printf(" row");
            CHECK_MSG(mha_exec_config_check(&out[i], lim->smem_per_block, &err) == STOF_OK,
                      "candidate %d: %s", i, err.msg);
            for (int j = 0; j < i; j++)
                CHECK_MSG(memcmp(&out[i], &out[j], sizeof out[i]) != 0, "candidates %d and %d "
                          "are the same", j, i);
        }
        printf("\n");
    }
    mask_free(f);
    mask_free(m);
    return rc ? 0 : n;
}


/* The planner's choices for the GPU test's problems on an H100 compile, by
 * the cost model and by the paper's Eq. 1 and 2 (STOF_ATTENTION_MODEL=paper),
 * where a very sparse mask goes row-wise. */
static void test_choose_offline(void) {
    for (int paper = 0; paper < 2; paper++) {
        if (paper)
            setenv("STOF_ATTENTION_MODEL", "paper", 1);
        choose_offline(paper);
    }
    unsetenv("STOF_ATTENTION_MODEL");
}
/* The build a forced size takes by default: wgmma on sm_90 for whole
 * warpgroups and head sizes that are multiples of 64, mma.sync otherwise or
 * when asked for. */
static int build_of(const char *arch, int bm, int bn, int w, int head_dim, int wgmma,
                    int stages) {
    mha_device_limits lim;
    stof_error err = {0};
    CHECK_EQ_INT(mha_limits_for_arch(arch, &lim, &err), STOF_OK);
    mha_exec_problem p = {.batch = 2, .heads = 2, .head_dim = head_dim, .q_len = 512,
                          .k_len = 512, .dtype = STOF_F16};
    mha_exec_force f = {.kernel = MHA_KERNEL_BLOCK_WISE, .block_m = bm, .block_n = bn,
                        .num_warps = w, .wgmma = wgmma, .stages = stages};
    mha_exec_config c;
    char why[256];
    CHECK_EQ_INT(mha_exec_choose(&p, NULL, &lim, &f, &c, why, sizeof why, &err), STOF_OK);
    if (c.wgmma)
        CHECK(c.stages >= MHA_EXEC_WGMMA_MIN_STAGES);
    return c.wgmma;
}

static void test_automatic_build(void) {
    CHECK_EQ_INT(build_of("sm_90", 128, 64, 8, 64, 0, 0), 1);
    CHECK_EQ_INT(build_of("sm_90", 64, 32, 4, 128, 0, 0), 1);
    CHECK_EQ_INT(build_of("sm_90", 128, 64, 4, 64, 0, 0), 0);  /* 32 rows a warp */
    CHECK_EQ_INT(build_of("sm_90", 32, 32, 2, 64, 0, 0), 0);   /* not a warpgroup */
    CHECK_EQ_INT(build_of("sm_90", 128, 64, 8, 80, 0, 0), 0);  /* unswizzled head size */
    CHECK_EQ_INT(build_of("sm_90", 128, 64, 8, 64, -1, 0), 0); /* mma.sync asked for */
    CHECK_EQ_INT(build_of("sm_90", 128, 64, 8, 64, 0, 2), 0);  /* a forced 2-stage ring */
    CHECK_EQ_INT(build_of("sm_90", 128, 64, 8, 80, 1, 0), 1);  /* asked for */
    CHECK_EQ_INT(build_of("sm_80", 128, 64, 8, 64, 0, 0), 0);
}

/* The T5 bias table of the block-wise kernel: T5's far runs (one bucket a
 * side past max_distance) leave 2 max_distance - 1 positions between them
 * when both sides reach that far, fewer on short sequences; none without
 * relpos or when the table would be too large. The shared memory and the
 * compile options carry it. */
static int relpos_mid_of(int q_len, int k_len, int relpos, int bidirectional, int max_distance,
                         size_t *smem_extra, int *has_opt) {
    mha_device_limits lim;
    stof_error err = {0};
    CHECK_EQ_INT(mha_limits_for_arch("sm_90", &lim, &err), STOF_OK);
    mha_exec_problem p = {.batch = 1, .heads = 2, .head_dim = 64, .q_len = q_len,
                          .k_len = k_len, .dtype = STOF_F16, .relpos = relpos,
                          .relpos_buckets = 32, .relpos_max_distance = max_distance,
                          .relpos_bidirectional = bidirectional};
    mha_exec_force f = {.kernel = MHA_KERNEL_BLOCK_WISE, .block_m = 32, .block_n = 32,
                        .num_warps = 2};
    mha_exec_config c;
    char why[256];
    CHECK_EQ_INT(mha_exec_choose(&p, NULL, &lim, &f, &c, why, sizeof why, &err), STOF_OK);
    mha_exec_config no_table = c;
    no_table.relpos_mid = 0;
    *smem_extra = mha_exec_config_smem(&c) - mha_exec_config_smem(&no_table);
    mha_exec_request r;
    mha_exec_request_init(&r, &c, "sm_90");
    *has_opt = 0;
    for (int i = 0; i < r.req.n_options; i++)
        *has_opt |= strncmp(r.req.options[i], "-DRELPOS_MID=", 13) == 0;
    return c.relpos_mid;
}

static void test_relpos_table(void) {
    size_t extra;
    int opt;
    /* bidirectional, 128: distances -127 .. 127 between the runs */
    CHECK_EQ_INT(relpos_mid_of(2048, 2048, 1, 1, 128, &extra, &opt), 256);
    CHECK(extra == 256 * sizeof(float) && opt);
    /* unidirectional: the future is one bucket, the past far run starts at -128 */
    CHECK_EQ_INT(relpos_mid_of(2048, 2048, 1, 0, 128, &extra, &opt), 128);
    CHECK(extra == 128 * sizeof(float) && opt);
    /* short sequences: fewer positions, a smaller power of two */
    CHECK_EQ_INT(relpos_mid_of(40, 40, 1, 1, 128, &extra, &opt), 64);
    /* too far apart for the table: read from global memory */
    CHECK_EQ_INT(relpos_mid_of(8192, 8192, 1, 1, 4096, &extra, &opt), 0);
    CHECK(extra == 0 && !opt);
    /* no bias, no table */
    CHECK_EQ_INT(relpos_mid_of(2048, 2048, 0, 1, 128, &extra, &opt), 0);
    CHECK(extra == 0 && !opt);
}

static void test_candidates(void) {
    mha_device_limits lim;
    stof_error err = {0};
    CHECK_EQ_INT(mha_limits_for_arch("sm_90", &lim, &err), STOF_OK);
    mha_exec_config c[MHA_EXEC_MAX_MEASURED];
    /* BigBird: block-wise; Eq. 2's 6 best plus the 5 fixed ones (some may coincide) */
    mha_exec_force force = {.kernel = -1, .measure = 6};
    int n = candidates_of("bigbird{}", 16, 4096, 64, &force, &lim, c, MHA_EXEC_MAX_MEASURED);
    CHECK(n >= 7 && n <= 11);
    CHECK_EQ_INT(count_kind(c, n, MHA_KERNEL_ROW_WISE), 0);
    int fixed_seen = 0;
    for (int i = 0; i < n; i++)
        fixed_seen += (c[i].block_m == 64 && c[i].block_n == 32 && c[i].num_warps == 4) +
                      (c[i].block_m == 128 && c[i].block_n == 64 && c[i].num_warps == 8);
    CHECK_EQ_INT(fixed_seen, 2);

    /* measure = 1 at D=128: (64, 32, 4) and (32, 32, 2) stay, all at the automatic depth
     * (raised to the wgmma build's least for its whole-warpgroup settings on sm_90) */
    force.measure = 1;
    n = candidates_of("bigbird{}", 2, 1024, 128, &force, &lim, c, MHA_EXEC_MAX_MEASURED);
    CHECK(n >= 2 && n <= 6);
    int wgmma_seen = 0;
    for (int i = 0; i < n; i++) {
        int depth = mha_exec_auto_stages(c[i].block_m, c[i].block_n, c[i].num_warps,
                                         128, 2, &lim);
        if (c[i].wgmma && depth < MHA_EXEC_WGMMA_MIN_STAGES)
            depth = MHA_EXEC_WGMMA_MIN_STAGES;
        CHECK_EQ_INT(c[i].stages, depth);
        CHECK_EQ_INT(c[i].wgmma, c[i].num_warps * 16 == c[i].block_m && c[i].block_m % 64 == 0);
        wgmma_seen += c[i].wgmma;
    }
    CHECK(wgmma_seen >= 2); /* (64, 32, 4) and (128, 64, 8) at least */

    /* a forced depth applies to every block-wise candidate */
    force.stages = 3;
    n = candidates_of("bigbird{}", 2, 1024, 64, &force, &lim, c, MHA_EXEC_MAX_MEASURED);
    for (int i = 0; i < n; i++)
        CHECK_EQ_INT(c[i].stages, 3);
    force.stages = 0;

    /* very sparse: Eq. 1 (the paper's model) says row-wise, which comes first, once;
     * block-wise ones follow */
    force.measure = 2;
    setenv("STOF_ATTENTION_MODEL", "paper", 1);
    n = candidates_of("sliding_window{band=2}", 2, 4096, 64, &force, &lim, c,
                      MHA_EXEC_MAX_MEASURED);
    unsetenv("STOF_ATTENTION_MODEL");
    CHECK(n >= 3 && c[0].kernel == MHA_KERNEL_ROW_WISE);
    CHECK_EQ_INT(count_kind(c, n, MHA_KERNEL_ROW_WISE), 1);

    /* forced block-wise without sizes: no row-wise candidate */
    force.kernel = MHA_KERNEL_BLOCK_WISE;
    n = candidates_of("sliding_window{band=2}", 2, 4096, 64, &force, &lim, c,
                      MHA_EXEC_MAX_MEASURED);
    CHECK(n >= 3);
    CHECK_EQ_INT(count_kind(c, n, MHA_KERNEL_ROW_WISE), 0);

    /* an explicit setting leaves nothing to choose */
    force = (mha_exec_force){.kernel = MHA_KERNEL_BLOCK_WISE, .block_m = 64, .block_n = 64,
                             .num_warps = 4, .stages = 4, .measure = 6};
    n = candidates_of("bigbird{}", 2, 1024, 64, &force, &lim, c, MHA_EXEC_MAX_MEASURED);
    CHECK_EQ_INT(n, 1);
    CHECK(c[0].block_m == 64 && c[0].stages == 4);
    force = (mha_exec_force){.kernel = MHA_KERNEL_ROW_WISE, .measure = 3};
    n = candidates_of("bigbird{}", 2, 1024, 64, &force, &lim, c, MHA_EXEC_MAX_MEASURED);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(c[0].kernel, MHA_KERNEL_ROW_WISE);

    /* a short list: cap respected */
    force = (mha_exec_force){.kernel = -1, .measure = 6};
    n = candidates_of("bigbird{}", 16, 4096, 64, &force, &lim, c, 3);
    CHECK_EQ_INT(n, 3);

    /* what the GPU test's measured plan at the timing shape compiles: every candidate */
    variant *v = calloc(MHA_EXEC_MAX_MEASURED, sizeof *v);
    n = candidates_of("bigbird{}", 16, 4096, 64, &force, &lim, c, MHA_EXEC_MAX_MEASURED);
    for (int i = 0; i < n && v; i++)
        v[i] = (variant){.cfg = c[i], .arch = "sm_90"};
    if (v)
        CHECK_EQ_INT(compile_all(v, n), n);
    free(v);
}

/* ---- split block rows: the work list ------------------------------------------------ */

/* Every property mha_exec_split_build promises, for one format and chunk:
 * each block row's load list covered exactly once by its items, in order
 * (pieces contiguous, near-equal, each <= chunk; a row of <= chunk blocks
 * one whole item with slot -1), slots consecutive per split row and unique,
 * items longest first within a batch, the per-batch pointers and grid sizes
 * right. Returns the number of split rows (-1: no list). */
static int check_split_list(const mask_bsr *f, int chunk, const char *what) {
    mha_exec_split *s = NULL;
    stof_error err = {0};
    int rc = mha_exec_split_build(f, chunk, &s, &err);
    CHECK_MSG(rc == STOF_OK, "%s chunk %d: %s", what, chunk, err.msg);
    int longest = 0;
    for (int b = 0; b < f->batch; b++)
        for (int i = 0; i < f->n_block_rows; i++) {
            int64_t base = mask_format_bsr_row_base(f, b);
            int len = f->load_row_ptr[base + i + 1] - f->load_row_ptr[base + i];
            longest = len > longest ? len : longest;
        }
    if (!s) {
        CHECK_MSG(chunk < 1 || longest <= chunk, "%s chunk %d: no list, longest row %d", what,
                  chunk, longest);
        return -1;
    }
    CHECK_MSG(chunk >= 1 && longest > chunk, "%s chunk %d: a list, longest row %d", what, chunk,
              longest);
    CHECK_EQ_INT(s->fmt_batch, f->batch);
    CHECK_EQ_INT(s->chunk, chunk);
    long bad = 0;
    int slots_seen = 0, max_items = 0, max_rows = 0, pieces_total = 0;
    unsigned char *slot_used = calloc((size_t)s->n_slots + 1, 1);
    for (int b = 0; b < f->batch; b++) {
        const int32_t *ptr = f->load_row_ptr + mask_format_bsr_row_base(f, b);
        int w0 = s->work_ptr[b], w1 = s->work_ptr[b + 1];
        int s0 = s->split_ptr[b], s1 = s->split_ptr[b + 1];
        bad += w1 < w0 || s1 < s0;
        max_items = w1 - w0 > max_items ? w1 - w0 : max_items;
        max_rows = s1 - s0 > max_rows ? s1 - s0 : max_rows;
        /* covered exactly once: walk each row's entries through its items */
        for (int i = 0; i < f->n_block_rows; i++) {
            int len = ptr[i + 1] - ptr[i], at = ptr[i], whole = 0, pieces = 0, lo = len, hi = 0;
            for (;;) { /* the item starting at `at` (pieces are contiguous) */
                const stof_attn_work *it = NULL;
                for (int k = w0; k < w1 && !it; k++)
                    if (s->work[k].block_row == i && s->work[k].start == at &&
                        (s->work[k].end > at || len == 0))
                        it = &s->work[k];
                if (!it)
                    break;
                int n = it->end - it->start;
                whole += it->slot < 0;
                pieces += it->slot >= 0;
                lo = n < lo ? n : lo;
                hi = n > hi ? n : hi;
                if (it->slot >= 0) {
                    bad += n < 1 || n > chunk || it->slot >= s->n_slots || slot_used[it->slot];
                    if (it->slot < s->n_slots)
                        slot_used[it->slot] = 1;
                }
                at = it->end;
                if (at == ptr[i + 1])
                    break;
            }
            int items_of_row = 0;
            for (int k = w0; k < w1; k++)
                items_of_row += s->work[k].block_row == i;
            if (len <= chunk) {
                /* untouched: one whole item, the row's exact range */
                bad += whole != 1 || pieces != 0 || items_of_row != 1 || at != ptr[i + 1];
            } else {
                bad += whole != 0 || at != ptr[i + 1] || pieces != (len + chunk - 1) / chunk ||
                       items_of_row != pieces || hi - lo > 1;
                pieces_total += pieces;
                /* its split row entry: the same slots, consecutive */
                int found = 0;
                for (int k = s0; k < s1; k++)
                    if (s->splits[k].block_row == i) {
                        found++;
                        const stof_attn_split *sr = &s->splits[k];
                        bad += sr->n_slots != pieces;
                        for (int q = w0; q < w1; q++)
                            if (s->work[q].block_row == i)
                                bad += s->work[q].slot < sr->first_slot ||
                                       s->work[q].slot >= sr->first_slot + sr->n_slots;
                    }
                bad += found != 1;
            }
        }
        /* longest first */
        for (int k = w0 + 1; k < w1; k++)
            bad += s->work[k].end - s->work[k].start > s->work[k - 1].end - s->work[k - 1].start;
        slots_seen += 0;
    }
    for (int k = 0; k < s->n_slots; k++)
        slots_seen += slot_used[k];
    free(slot_used);
    CHECK_MSG(bad == 0, "%s chunk %d: %ld violations", what, chunk, bad);
    CHECK_EQ_INT(slots_seen, s->n_slots);
    CHECK_EQ_INT(pieces_total, s->n_slots);
    CHECK_EQ_INT(s->max_items, max_items);
    CHECK_EQ_INT(s->max_split_rows, max_rows);
    CHECK_EQ_INT(s->work_ptr[f->batch], s->n_items);
    CHECK_EQ_INT(s->split_ptr[f->batch], s->n_split_rows);
    /* deterministic */
    mha_exec_split *t = NULL;
    CHECK_EQ_INT(mha_exec_split_build(f, chunk, &t, &err), STOF_OK);
    CHECK(t && t->n_items == s->n_items && t->n_split_rows == s->n_split_rows &&
          !memcmp(t->work, s->work, (size_t)s->n_items * sizeof *s->work) &&
          !memcmp(t->splits, s->splits, (size_t)s->n_split_rows * sizeof *s->splits));
    mha_exec_split_free(t);
    int rows = s->n_split_rows;
    mha_exec_split_free(s);
    return rows;
}

static mask_bsr *bsr_of(const char *spec, int batch, int q, int k, int bm, int bn) {
    mask *m = build(spec, batch, q, k);
    mask_bsr *f = NULL;
    stof_error err = {0};
    if (m)
        CHECK_EQ_INT(mask_format_bsr_build(m, bm, bn, &f, &err), STOF_OK);
    mask_free(m);
    return f;
}

static void test_split(void) {
    struct { const char *spec; int batch, q, k, bm, bn; } fmts[] = {
        {"longformer{}", 1, 4096, 4096, 64, 64},
        {"bigbird{}", 1, 4096, 4096, 64, 32},
        {"bigbird{}", 2, 1024, 1024, 16, 16},
        {"per_batch(sliding_window{band=8}, bigbird{})", 2, 257, 257, 64, 32},
        {"key_padding{lengths=[0, 77, 100]}", 3, 100, 100, 16, 16}, /* empty rows */
        {"bigbird{}", 1, 128, 512, 32, 64},                         /* cross */
    };
    static const int chunks[] = {-1, 0, 1, 2, 3, 4, 7, 1000};
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        mask_bsr *f = bsr_of(fmts[i].spec, fmts[i].batch, fmts[i].q, fmts[i].k, fmts[i].bm,
                             fmts[i].bn);
        if (!f)
            continue;
        printf("split %-44s B=%d %dx%d at %dx%d:", fmts[i].spec, fmts[i].batch, fmts[i].q,
               fmts[i].k, fmts[i].bm, fmts[i].bn);
        for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++)
            printf(" c%d:%d", chunks[c], check_split_list(f, chunks[c], fmts[i].spec));
        printf("\n");
        mask_format_bsr_free(f);
    }

    /* the automatic chunk: Longformer (1, 4096) 64x64 on 132 SMs x 4 blocks
     * splits its global row; (16, 4096) has work enough for every slot */
    mask_bsr *f = bsr_of("longformer{}", 1, 4096, 4096, 64, 64);
    if (f) {
        int chunk = mha_exec_split_chunk(f, 1, 12, 132 * 4);
        printf("longformer (1, 4096) 64x64: %d loaded blocks, chunk %d at 12 heads\n", f->n_load,
               chunk);
        CHECK(chunk >= MHA_EXEC_SPLIT_MIN_CHUNK && chunk <= 64 / 2);
        CHECK_EQ_INT(mha_exec_split_chunk(f, 16, 12, 132 * 4), 0);
        /* a tiny launch: the typical row (about 5 blocks) or the minimum */
        int tiny = mha_exec_split_chunk(f, 1, 1, 1 << 20);
        CHECK(tiny >= MHA_EXEC_SPLIT_MIN_CHUNK && tiny <= 8);
        mha_exec_split *s = NULL;
        stof_error err = {0};
        CHECK_EQ_INT(mha_exec_split_build(f, chunk, &s, &err), STOF_OK);
        CHECK(s && s->n_split_rows >= 1 && s->splits[0].block_row == 0);
        if (s) {
            /* shared format: a unit per (batch, slot, head) */
            CHECK_EQ_INT(mha_exec_split_workspace(s, 3, 12, 64, 64),
                         (size_t)3 * s->n_slots * 12 * 64 * 66 * 4);
            /* the first items are the global row's pieces (longest first) */
            CHECK_EQ_INT(s->work[0].block_row, 0);
            CHECK(s->work[0].slot >= 0);
        }
        mha_exec_split_free(s);
        mask_format_bsr_free(f);
    }
    /* what the automatic choice does at the GPU test's timing shapes (12
     * heads, D=64, fp16; 132 SMs, blocks per SM of an H100/H200) */
    mha_device_limits lim;
    stof_error lerr = {0};
    CHECK_EQ_INT(mha_limits_for_arch("sm_90", &lim, &lerr), STOF_OK);
    struct { const char *spec; int batch, s, bm, bn, w; } shapes[] = {
        {"longformer{}", 1, 4096, 64, 64, 4}, {"bigbird{}", 1, 4096, 64, 32, 4},
        {"longformer{}", 8, 1024, 64, 32, 4}, {"bigbird{}", 8, 1024, 64, 32, 4},
        {"bigbird{}", 16, 4096, 64, 32, 4},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        f = bsr_of(shapes[i].spec, 1, shapes[i].s, shapes[i].s, shapes[i].bm, shapes[i].bn);
        if (!f)
            continue;
        int per_sm = mha_exec_block_ctas_per_sm(shapes[i].bm, shapes[i].bn, shapes[i].w, 2, 64, 2,
                                                &lim);
        int chunk = mha_exec_split_chunk(f, shapes[i].batch, 12, per_sm * 132);
        mha_exec_split *s = NULL;
        stof_error err = {0};
        CHECK_EQ_INT(mha_exec_split_build(f, chunk, &s, &err), STOF_OK);
        printf("auto split %-12s (%2d, %d) %dx%d w%d: %d loaded blocks, chunk %d -> %d rows into "
               "%d items, %d work items\n",
               shapes[i].spec, shapes[i].batch, shapes[i].s, shapes[i].bm, shapes[i].bn,
               shapes[i].w, f->n_load, chunk, s ? s->n_split_rows : 0, s ? s->n_slots : 0,
               s ? s->n_items : f->n_block_rows);
        if (shapes[i].batch == 1) /* the global rows are cut, the others kept whole */
            CHECK(s != NULL && s->n_split_rows <= 4);
        if (shapes[i].batch == 16)
            CHECK(s == NULL); /* enough work for every slot */
        mha_exec_split_free(s);
        mask_format_bsr_free(f);
    }
    /* dense and sliding window: every row about as long, nothing to split */
    f = bsr_of("sliding_window{}", 1, 4096, 4096, 64, 64);
    if (f) {
        CHECK_EQ_INT(mha_exec_split_chunk(f, 1, 12, 132 * 4), 0);
        mask_format_bsr_free(f);
    }
    f = bsr_of("full{}", 1, 4096, 4096, 64, 64);
    if (f) {
        CHECK_EQ_INT(mha_exec_split_chunk(f, 1, 12, 132 * 4), 0);
        mask_format_bsr_free(f);
    }
    /* per-batch format: the workspace has no batch factor */
    f = bsr_of("per_batch(sliding_window{band=8}, bigbird{})", 2, 257, 257, 16, 16);
    if (f) {
        mha_exec_split *s = NULL;
        stof_error err = {0};
        CHECK_EQ_INT(mha_exec_split_build(f, 2, &s, &err), STOF_OK);
        CHECK(s != NULL);
        if (s)
            CHECK_EQ_INT(mha_exec_split_workspace(s, 2, 4, 16, 128),
                         (size_t)s->n_slots * 4 * 16 * 130 * 4);
        mha_exec_split_free(s);
        mask_format_bsr_free(f);
    }
}

/* ---- the argument block ---------------------------------------------------------------- */

static void test_args(void) {
    mha_exec_problem p = base_problem(3, 100, 100);
    p.heads = 4;
    mha_exec_tensors t;
    mha_exec_tensors_packed(&t, 0x10000, 0x90000, &p, 2);
    CHECK_EQ_INT(t.k - t.q, 4 * 64 * 2);
    CHECK_EQ_INT(t.v - t.q, 2 * 4 * 64 * 2);
    CHECK_EQ_INT(t.q_row_stride, 3 * 4 * 64);
    CHECK_EQ_INT(t.k_batch_stride, 3 * 4 * 64 * 100);
    CHECK_EQ_INT(t.o_row_stride, 4 * 64);
    mha_exec_problem x = base_problem(3, 100, 300);
    x.heads = 4;
    mha_exec_tensors_cross(&t, 0x10000, 0x20000, 0x90000, &x, 2);
    CHECK_EQ_INT(t.v - t.k, 4 * 64 * 2);
    CHECK_EQ_INT(t.k_row_stride, 2 * 4 * 64);
    CHECK_EQ_INT(t.k_batch_stride, 2 * 4 * 64 * 300);
    CHECK_EQ_INT(t.q_batch_stride, 4 * 64 * 100);

    mha_exec_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.problem = x;
    plan.config.kernel = MHA_KERNEL_BLOCK_WISE;
    plan.fmt_batch = 3;
    plan.d_row_ptr = 0x1000;
    plan.d_col_idx = 0x2000;
    plan.d_mask_idx = 0x3000;
    plan.d_bitmaps = 0x4000;
    stof_attn_args a;
    mha_exec_fill_args(&plan, &t, &a);
    CHECK((uintptr_t)a.load_row_ptr == 0x1000 && (uintptr_t)a.part_masks == 0x4000);
    CHECK(a.row_ptr == NULL && a.col_idx == NULL);
    CHECK_EQ_INT(a.q_len, 100);
    CHECK_EQ_INT(a.k_len, 300);
    CHECK_EQ_INT(a.fmt_batch, 3);
    CHECK_NEAR(a.scale_log2, 0.125 * 1.4426950408889634, 1e-6);
    CHECK_EQ_INT(sizeof a, STOF_ATTN_ARGS_BYTES);
    CHECK(a.work == NULL && a.partial_o == NULL && a.n_slots == 0);

    /* a split plan: the work list and the workspace, (m, l) after the partial O */
    plan.config.split = 1;
    plan.config.head_dim = 64;
    plan.d_work_ptr = 0x5000;
    plan.d_work = 0x6000;
    plan.d_split_ptr = 0x7000;
    plan.d_splits = 0x8000;
    plan.d_workspace = 0x100000;
    plan.split_slots = 5;
    plan.workspace_bytes = (size_t)5 * 64 * 66 * 4;
    plan.workspace_ml_offset = (size_t)5 * 64 * 64 * 4;
    mha_exec_fill_args(&plan, &t, &a);
    CHECK((uintptr_t)a.work_ptr == 0x5000 && (uintptr_t)a.work == 0x6000);
    CHECK((uintptr_t)a.split_ptr == 0x7000 && (uintptr_t)a.splits == 0x8000);
    CHECK((uintptr_t)a.partial_o == 0x100000);
    CHECK((uintptr_t)a.partial_ml == 0x100000 + (uintptr_t)5 * 64 * 64 * 4);
    CHECK_EQ_INT(a.n_slots, 5);
    CHECK((uintptr_t)a.load_row_ptr == 0x1000);
}

/* No GPU here: the context says so cleanly, and with a GPU it opens and closes. */
static void test_ctx(void) {
    mha_exec_ctx *c = NULL;
    stof_error err = {0};
    int rc = mha_exec_ctx_create(0, &c, &err);
    if (rc == STOF_OK) {
        printf("GPU present: %s (%s)\n", c->info.name, c->arch);
        mha_exec_ctx_free(c);
    } else {
        printf("no GPU: %s\n", err.msg);
        CHECK_EQ_INT(rc, STOF_ERR_NO_DEVICE);
        CHECK(c == NULL);
    }
}

/* The remembered measured choices (mha_exec_wisdom.c) without a GPU: a
 * context that only names a device and a cache folder. */
static void test_wisdom_file(void) {
    mha_exec_ctx c;
    memset(&c, 0, sizeof c);
    snprintf(c.nvrtc.dir, sizeof c.nvrtc.dir, "%s", STOF_BINARY_DIR "/tests/wisdom");
    mkdir(c.nvrtc.dir, 0755);
    char path[1200];
    snprintf(path, sizeof path, "%s/attention-wisdom.txt", c.nvrtc.dir);
    remove(path);
    snprintf(c.info.name, sizeof c.info.name, "A GPU\tnamed oddly");
    snprintf(c.arch, sizeof c.arch, "sm_90");
    c.info.sm_count = 132;
    mask *m = NULL;
    mask_spec *spec = NULL;
    stof_error err = {0};
    CHECK(mask_spec_parse("bigbird{seed=3}", &spec, &err) == STOF_OK &&
          mask_build(spec, 1, 256, 256, &m, &err) == STOF_OK);
    mha_exec_problem p = {.mask = m, .batch = 2, .heads = 4, .head_dim = 64, .q_len = 256,
                          .k_len = 256, .dtype = STOF_F16, .scale = 0.125f};
    mha_exec_force f = {0};
    CHECK_EQ_INT(mha_wisdom_lookup(&c, &p, m, &f), 0); /* no file yet */
    mha_exec_config cfg = {.kernel = MHA_KERNEL_BLOCK_WISE, .block_m = 64, .block_n = 128,
                           .num_warps = 4, .stages = 3, .wgmma = 1, .tma = 1};
    mha_wisdom_record(&c, &p, m, &cfg, 0.25f);
    CHECK_EQ_INT(mha_wisdom_lookup(&c, &p, m, &f), 1);
    CHECK(f.kernel == MHA_KERNEL_BLOCK_WISE && f.block_m == 64 && f.block_n == 128 &&
          f.num_warps == 4 && f.stages == 3 && f.wgmma == 1 && f.tma == 1 && f.measure == 0);
    /* a newer measurement replaces the entry; other problems keep theirs */
    mha_exec_problem q = p;
    q.batch = 8;
    mha_exec_config other = {.kernel = MHA_KERNEL_ROW_WISE, .rows_per_warp = 2,
                             .warps_per_block = 4};
    mha_wisdom_record(&c, &q, m, &other, 0.5f);
    cfg.block_n = 64;
    cfg.tma = 0;
    mha_wisdom_record(&c, &p, m, &cfg, 0.2f);
    CHECK_EQ_INT(mha_wisdom_lookup(&c, &p, m, &f), 1);
    CHECK(f.block_n == 64 && f.tma == -1 && f.wgmma == 1);
    CHECK_EQ_INT(mha_wisdom_lookup(&c, &q, m, &f), 1);
    CHECK(f.kernel == MHA_KERNEL_ROW_WISE && f.rows_per_warp == 2 && f.warps_per_block == 4);
    char *text = NULL;
    size_t n = 0;
    CHECK_EQ_INT(file_read(path, "wisdom", 0, &text, &n, &err), STOF_OK);
    int lines = 0;
    for (size_t i = 0; text && i < n; i++)
        lines += text[i] == '\n';
    CHECK_EQ_INT(lines, 2);
    free(text);
    /* another kind of GPU knows nothing of it; the switch turns it off */
    c.info.sm_count = 78;
    CHECK_EQ_INT(mha_wisdom_lookup(&c, &p, m, &f), 0);
    c.info.sm_count = 132;
    setenv("STOF_ATTENTION_WISDOM", "0", 1);
    CHECK_EQ_INT(mha_wisdom_lookup(&c, &p, m, &f), 0);
    unsetenv("STOF_ATTENTION_WISDOM");
    /* a damaged line is skipped, not an error */
    FILE *fp = fopen(path, "w");
    if (fp) {
        fputs("garbage without tabs\nA GPU named oddly|sm_90|132\tb2 junk\t1 2\n", fp);
        fclose(fp);
    }
    CHECK_EQ_INT(mha_wisdom_lookup(&c, &p, m, &f), 0);
    mask_free(m);
    mask_spec_free(spec);
}

/* The rows' log-sum-exp is built for global tokens under a mask that leaves keys out: not
 * without global tokens, not under a dense mask (every global key already attended). */
static void test_wants_lse(void) {
    mask *window = NULL, *full = NULL;
    stof_error err = {0};
    CHECK_EQ_INT(mask_build_text("sliding_window{band=4}", 1, 100, 100, &window, &err), STOF_OK);
    CHECK_EQ_INT(mask_build_text("full", 1, 100, 100, &full, &err), STOF_OK);
    mha_exec_problem p = {.batch = 2, .heads = 2, .head_dim = 64, .q_len = 100, .k_len = 100,
                          .dtype = STOF_F16, .scale = 0.125f, .global_keys = 1};
    CHECK(mha_exec_wants_lse(&p, window) == 1);
    CHECK(mha_exec_wants_lse(&p, full) == 0);
    p.global_keys = 0;
    CHECK(mha_exec_wants_lse(&p, window) == 0);
    p.global_keys = 1;
    p.causal = 1; /* the planner refuses what the global kernels do not apply */
    CHECK_EQ_INT(mha_exec_validate(&p, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "not causal, no relpos");
    mask_free(window);
    mask_free(full);
}

/* The decode-step kernels (attention_decode.cu): every head size and dtype compiles, with its
 * three entry points, with and without a rotary op fused in front, with 8 warps where they
 * fit; the planner's choice of splits and its refusals. */
static void test_decode(void) {
    nvrtc_cache c;
    nvrtc_cache_init(&c, "");
    static const int dims[] = {32, 64, 80, 128}, groups[] = {1, 4, 16};
    for (int d = 0; d < 4; d++)
        for (int t = 1; t <= 2; t++) {
            const int group = groups[(d + t) % 3];
            const int warps =
                STOF_DECODE_SMEM_BYTES(8, group, dims[d]) <= STOF_DECODE_SMEM_LIMIT ? 8 : 4;
            char o0[32], o1[32], o2[32], o3[32];
            snprintf(o0, sizeof o0, "-DHEAD_DIM=%d", dims[d]);
            snprintf(o1, sizeof o1, "-DSTOF_DTYPE=%d", t);
            snprintf(o2, sizeof o2, "-DGROUP=%d", group);
            snprintf(o3, sizeof o3, "-DDECODE_WARPS=%d", warps);
            nvrtc_request req = {.source = "attention_decode.cu", .arch = "sm_90",
                                 .options = {o0, o1, o2, o3, t == 1 ? "-DROTARY=1" : "-DROTARY=0"},
                                 .n_options = 5};
            const void *bin = NULL;
            size_t size = 0;
            stof_error err = {0};
            int rc = nvrtc_get(&c, &req, &bin, &size, &err);
            CHECK_MSG(rc == STOF_OK, "attention_decode.cu %s %s: %s", o0, o1, err.msg);
            CHECK(rc || (bytes_contain(bin, size, STOF_DECODE_KERNEL) &&
                         bytes_contain(bin, size, STOF_DECODE_COMBINE_KERNEL) &&
                         bytes_contain(bin, size, STOF_KV_STORE_KERNEL)));
        }
    /* V read 16 bytes a lane: heads of 32, 64 and 128 at 1, 2 and 4 query heads a CTA; a build
     * of more heads a CTA is refused by the kernel itself */
    static const int wide_dims[] = {32, 64, 128}, wide_groups[] = {1, 2, 4, 16};
    for (int d = 0; d < 3; d++)
        for (int gi = 0; gi < 4; gi++) {
            char o0[32], o1[32], o2[32];
            snprintf(o0, sizeof o0, "-DHEAD_DIM=%d", wide_dims[d]);
            snprintf(o1, sizeof o1, "-DSTOF_DTYPE=%d", 1 + (d + gi) % 2);
            snprintf(o2, sizeof o2, "-DGROUP=%d", wide_groups[gi]);
            nvrtc_request req = {.source = "attention_decode.cu", .arch = "sm_90",
                                 .options = {o0, o1, o2, "-DWIDE_V=1"}, .n_options = 4};
            const void *bin = NULL;
            size_t size = 0;
            stof_error err = {0};
            int rc = nvrtc_get(&c, &req, &bin, &size, &err);
            if (wide_groups[gi] > 4) {
                CHECK_EQ_INT(rc, STOF_ERR_COMPILE);
                CHECK_CONTAINS(err.msg, "WIDE_V: heads of 32, 64 or 128, up to 4 query heads");
                continue;
            }
            CHECK_MSG(rc == STOF_OK, "attention_decode.cu WIDE_V %s %s: %s", o0, o2, err.msg);
            CHECK(rc || bytes_contain(bin, size, STOF_DECODE_KERNEL));
        }
    /* the global tokens' kernels (attention_global.cu): every head size and dtype, by the
     * request the plans and the ahead-of-time builds use */
    for (int d = 0; d < 4; d++)
        for (int t = 1; t <= 2; t++) {
            mha_exec_problem gp = {.head_dim = dims[d], .dtype = (stof_dtype)t, .global_keys = 1};
            mha_exec_request r;
            mha_exec_global_request_init(&r, &gp, "sm_90");
            const void *bin = NULL;
            size_t size = 0;
            stof_error err = {0};
            int rc = nvrtc_get(&c, &r.req, &bin, &size, &err);
            CHECK_MSG(rc == STOF_OK, "attention_global.cu D=%d dtype %d: %s", dims[d], t, err.msg);
            CHECK(rc || (bytes_contain(bin, size, STOF_ATTN_GLOBAL_INDEX_KERNEL) &&
                         bytes_contain(bin, size, STOF_ATTN_GLOBAL_KEYS_KERNEL) &&
                         bytes_contain(bin, size, STOF_ATTN_GLOBAL_ROWS_KERNEL)));
        }
    /* the decode step's token choice: the greedy argmax and the sampled draw */
    for (int t = 1; t <= 2; t++) {
        char o0[32];
        snprintf(o0, sizeof o0, "-DSTOF_DTYPE=%d", t);
        nvrtc_request req = {.source = "sample.cu", .arch = "sm_90", .options = {o0},
                             .n_options = 1};
        const void *bin = NULL;
        size_t size = 0;
        stof_error err = {0};
        int rc = nvrtc_get(&c, &req, &bin, &size, &err);
        CHECK_MSG(rc == STOF_OK, "sample.cu: %s", err.msg);
        CHECK(rc || (bytes_contain(bin, size, "stof_argmax_rows") &&
                     bytes_contain(bin, size, "stof_sample_rows")));
    }
    nvrtc_cache_free(&c);
    stof_error err = {0};
    mha_decode_problem p = {1, 32, 8, 64, STOF_F16, 4096, 4096, 0.125f, NULL, 0.0};
    CHECK_EQ_INT(mha_decode_validate(&p, &err), STOF_OK);
    /* one sequence of 8 K/V heads on 132 SMs: split down to 256 keys a split */
    CHECK_EQ_INT(mha_decode_default_splits(&p, 132), 16);
    p.batch = 64; /* 512 CTAs: split until 32 an SM (4224) */
    CHECK_EQ_INT(mha_decode_default_splits(&p, 132), 16);
    p.kv_heads = 16, p.heads = 32; /* 1024 CTAs */
    CHECK_EQ_INT(mha_decode_default_splits(&p, 132), 8);
    p.kv_heads = 8, p.batch = 1;
    p.cap = 500; /* few keys: no split below 256 a chunk */
    CHECK_EQ_INT(mha_decode_default_splits(&p, 132), 1);
    p.cap = 5000;
    CHECK_EQ_INT(mha_decode_validate(&p, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "5000 cache slots for a context of 4096");
    p.cap = 4096;
    p.kv_heads = 1; /* 32 query heads a K/V head: more than a build holds */
    CHECK_EQ_INT(mha_decode_validate(&p, &err), STOF_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "32 query heads a K/V head (at most 16)");
    p.kv_heads = 8;
    p.rotary_theta = NAN; /* a fused rotary's base: positive and finite */
    CHECK_EQ_INT(mha_decode_validate(&p, &err), STOF_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "rotary theta");
    p.rotary_theta = 10000.0;
    CHECK_EQ_INT(mha_decode_validate(&p, &err), STOF_OK);
    /* 8 warps for few CTAs with many tiles each, where their shared memory fits */
    p.cap = 192;
    CHECK_EQ_INT(mha_decode_default_warps(&p, 1, 132), 8);
    CHECK_EQ_INT(mha_decode_default_warps(&p, 1, 0), STOF_DECODE_WARPS);
    p.cap = 128; /* 4 tiles: one a warp already */
    CHECK_EQ_INT(mha_decode_default_warps(&p, 1, 132), STOF_DECODE_WARPS);
    p.cap = 4096;
    CHECK_EQ_INT(mha_decode_default_warps(&p, 16, 132), 8); /* 128 CTAs on 132 SMs */
    CHECK_EQ_INT(mha_decode_default_warps(&p, 32, 132), STOF_DECODE_WARPS); /* 256 */
    p.kv_heads = 2, p.heads = 32, p.head_dim = 128; /* 8 CTAs of 16 heads: a CTA a head */
    CHECK_EQ_INT(mha_decode_default_cta_heads(&p, 4, 132), 1);
    /* 8 warps would fit a CTA of one head, not of the 16 the template's check counts */
    CHECK_EQ_INT(mha_decode_default_warps(&p, 4, 132), STOF_DECODE_WARPS);
    p.kv_heads = 8; /* 4 heads of 128 a K/V head: 8 warps fit all of them */
    CHECK_EQ_INT(mha_decode_default_warps(&p, 4, 132), 8);
}

/* The query heads a decode CTA serves: fewer than a K/V head's only while the grid stays
 * within the SMs, always a divisor of them. */
static void test_decode_cta_heads(void) {
    mha_decode_problem p = {1, 32, 8, 64, STOF_F16, 192, 192, 0.125f, NULL, 0.0};
    CHECK_EQ_INT(mha_decode_default_cta_heads(&p, 1, 132), 1);  /* 8 CTAs -> 32 */
    CHECK_EQ_INT(mha_decode_default_cta_heads(&p, 1, 0), 4);    /* SMs unknown */
    CHECK_EQ_INT(mha_decode_default_cta_heads(&p, 16, 132), 4); /* 128 CTAs already */
    p.batch = 8; /* 64 CTAs: 128 with two heads each, 256 with one */
    CHECK_EQ_INT(mha_decode_default_cta_heads(&p, 1, 132), 2);
    p.batch = 64;
    CHECK_EQ_INT(mha_decode_default_cta_heads(&p, 1, 132), 4);
    p.batch = 1, p.heads = 12, p.kv_heads = 12; /* no grouped heads */
    CHECK_EQ_INT(mha_decode_default_cta_heads(&p, 1, 132), 1);
    p.kv_heads = 2; /* 6 a K/V head: 3, 2 or 1 */
    CHECK_EQ_INT(mha_decode_default_cta_heads(&p, 1, 132), 1);
    CHECK_EQ_INT(mha_decode_default_cta_heads(&p, 1, 12), 1);
    CHECK_EQ_INT(mha_decode_default_cta_heads(&p, 1, 6), 2);
    CHECK_EQ_INT(mha_decode_default_cta_heads(&p, 1, 5), 3);
    CHECK_EQ_INT(mha_decode_default_cta_heads(&p, 1, 3), 6);
}

/* How a decode CTA reads V by default: 16 bytes a lane where a build can, unless several query
 * heads a CTA in a grid of more CTAs than SMs. */
static void test_decode_v_read(void) {
    mha_decode_problem p = {1, 32, 8, 64, STOF_F16, 4096, 4096, 0.125f, NULL, 0.0};
    CHECK_EQ_INT(mha_decode_default_v_read(&p, 1, 1, 132), MHA_DECODE_V_WIDE);
    CHECK_EQ_INT(mha_decode_default_v_read(&p, 16, 4, 132), MHA_DECODE_V_WIDE); /* 128 CTAs */
    p.batch = 64; /* 8192 CTAs of 4 heads: pairs; of one head: wide */
    CHECK_EQ_INT(mha_decode_default_v_read(&p, 16, 4, 132), MHA_DECODE_V_PAIRS);
    CHECK_EQ_INT(mha_decode_default_v_read(&p, 16, 1, 132), MHA_DECODE_V_WIDE);
    CHECK_EQ_INT(mha_decode_default_v_read(&p, 16, 2, 0), MHA_DECODE_V_PAIRS); /* SMs unknown */
    p.head_dim = 80; /* no wide build */
    CHECK_EQ_INT(mha_decode_default_v_read(&p, 1, 1, 132), MHA_DECODE_V_PAIRS);
    p.head_dim = 128, p.heads = 64; /* 8 query heads a CTA: no wide build */
    CHECK_EQ_INT(mha_decode_default_v_read(&p, 1, 8, 132), MHA_DECODE_V_PAIRS);
    p.head_dim = 32;
    CHECK_EQ_INT(mha_decode_default_v_read(&p, 1, 1, 132), MHA_DECODE_V_WIDE);
}

int main(void) {
    test_wants_lse();
    test_decode();
    test_decode_cta_heads();
    test_decode_v_read();
    test_wisdom_file();
    test_validate();
    test_fold();
    test_configs();
    test_wgmma_configs();
    test_tma_configs();
    test_stages();
    test_args();
    test_split();
    test_ctx();
    test_choose_offline();
    test_automatic_build();
    test_relpos_table();
    test_candidates();
    test_variants_compile();
    return check_summary("test_attention_compile");
}
