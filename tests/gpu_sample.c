/* The decode step's token choice on the GPU (kernels/sample.cu, exec_sample_rows) against the
 * host's draw (gen_sample_uniform, the CPU reference's), with the same uniform numbers.
 *
 * Rows of fp16 and bf16 logits, vocabularies of 1 to 128256, of several kinds: normal values at
 * two spreads, one token far above the rest, every logit equal, a few values repeated (ties
 * everywhere), sorted, zeros of both signs and minus infinities; temperatures 0.7 to 1.3,
 * top_k from 1 to past the vocabulary, top_p from 0.05 to 1; uniform numbers of (seed, row,
 * step) and the ends of [0, 1). Tokens poisoned before each launch, the sampling scratch
 * poisoned too. Every token must be the host's, or else one the host draws when its uniform
 * number or its top_p moves by a rounding (a draw on a boundary between two tokens, which
 * fixed-point masses may place on the other side), or one below the GPU's unit of mass that
 * the host's draw at an end of [0, 1) reaches: those are counted, and must stay rare.
 * A second launch gives the same tokens (integer sums: no order to depend on); rows marked
 * ended are skipped, their tokens left as poisoned.
 *
 * The greedy argmax against the host's (the first of equal values, NaNs never, token 0 for a
 * row of NaNs) over the same kinds of rows, one block a row and spread over blocks, two
 * launches each, the blocks' scratch left as zeros. A decode step's bookkeeping, for both:
 * tokens into host memory at each live row's position, positions moved on, ended rows left
 * alone.
 *
 * Then the timing (informational; "notime" skips it): a step's draw at a 50257-token
 * vocabulary, 1, 8 and 64 rows of normal logits of standard deviation 2 and 6, beside the
 * greedy argmax, each replayed from a CUDA graph. Exit 77 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu_open.h"
#include "core/base/util.h"
#include "core/exec/exec.h"
#include "core/gen/gen.h"
#include "core/gpu/cuda_driver.h"

#define GPU_CTX_TYPE exec_ctx
#include "gpu_common.h"

#define ROWS 6

enum { TIME_ROWS = 64, TIME_VOCAB = 50257, BIG_VOCAB = 128256 };
#define POISON_TOKEN (-7)

typedef enum row_kind {
    K_NORMAL,   /* normal, sd 1 */
    K_WIDE,     /* normal, sd 6 */
    K_SPIKE,    /* one token 20 above normal ones */
    K_FLAT,     /* every logit 0.5 */
    K_FEW,      /* the integers -3..3: ties everywhere */
    K_SORTED,   /* rising with the index */
    K_ZEROS,    /* zeros of both signs among a few others, and minus infinities */
    N_KINDS
} row_kind;

static const char *kind_name[N_KINDS] = {"normal", "wide", "spike", "flat", "few values",
                                         "sorted", "signed zeros, -inf"};

static double normal(util_rng *r) {
    double a = util_rng_double(r), b = util_rng_double(r);
    return sqrt(-2.0 * log(a + 1e-300)) * cos(6.283185307179586 * b);
}

static float logit_of(row_kind k, util_rng *r, int64_t v, int64_t vocab) {
    switch (k) {
    case K_NORMAL: return (float)normal(r);
    case K_WIDE: return (float)(6.0 * normal(r));
    case K_SPIKE: return v == vocab / 3 ? 20.0f : (float)normal(r);
    case K_FLAT: return 0.5f;
    case K_FEW: return (float)((int)(util_rng_double(r) * 7.0) - 3);
    case K_SORTED: return (float)(8.0 * (double)v / (double)vocab - 4.0);
    default: {
        double x = util_rng_double(r);
        return x < 0.3 ? 0.0f : x < 0.6 ? -0.0f : x < 0.7 ? -INFINITY : (float)normal(r);
    }
    }
}

typedef struct gpu_bufs {
    CUdeviceptr logits, u, live, prob, out, keys; /* keys: the argmax's scratch, zeros */
} gpu_bufs;

typedef struct tally {
    int draws, boundary, massless;
} tally;

/* The host's token for u and top_p given. */
static int32_t host_draw(const gen_options *o, const float *row, int64_t vocab, double u,
                         float *scratch, int32_t *order) {
    return gen_sample_uniform(o, row, vocab, u, scratch, order);
}

/* Whether token v has no mass on the GPU: its probability below half exec_sample_mass_unit's
 * unit (the host computes the same probability: exp(s - max) in fp64, rounded to fp32). */
static int massless(const gen_options *o, const float *row, int64_t vocab, int32_t v) {
    float max = row[0] / o->temperature;
    for (int64_t i = 1; i < vocab; i++)
        max = row[i] / o->temperature > max ? row[i] / o->temperature : max;
    float p = (float)exp((double)(row[v] / o->temperature) - max);
    return (double)p * (double)exec_sample_mass_unit(vocab) < 0.5;
}

/* Whether the host draws tok once u or top_p moves by a rounding: a boundary case. */
static int on_boundary(const gen_options *o, const float *row, int64_t vocab, double u,
                       int32_t tok, float *scratch, int32_t *order) {
    const double us[3] = {u, u > 1e-9 ? u - 1e-9 : 0.0, u + 1e-9 < 1.0 ? u + 1e-9 : u};
    const float ps[3] = {o->top_p, nextafterf(o->top_p, 0.0f),
                         o->top_p < 1.0f ? nextafterf(o->top_p, 2.0f) : o->top_p};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            gen_options m = *o;
            m.top_p = ps[j];
            if (host_draw(&m, row, vocab, us[i], scratch, order) == tok)
                return 1;
        }
    return 0;
}

static int launch(exec_ctx *ctx, const gpu_bufs *d, stof_dtype t, int rows, int64_t vocab,
                  const gen_options *o, int with_live, int32_t *out) {
    const cuda_driver *drv = exec_ctx_driver(ctx);
    stof_error err = {0};
    exec_sampling how = {o->temperature, o->top_k, o->top_p};
    int32_t poison[ROWS];
    for (int r = 0; r < ROWS; r++)
        poison[r] = POISON_TOKEN;
    int rc = drv->MemcpyHtoD(d->out, poison, sizeof poison) != CUDA_SUCCESS ||
             drv->MemsetD8Async(d->prob, 0xff, 4 * (size_t)rows * (size_t)vocab, NULL) != CUDA_SUCCESS;
    CHECK_MSG(!rc, "poisoning the outputs");
    const exec_tokens to = {.out = d->out, .live = with_live ? d->live : 0};
    if (!rc)
        rc = exec_sample_rows(ctx, d->logits, t, rows, vocab, &how, d->u, d->prob, &to, NULL,
                              &err);
    CHECK_MSG(rc == STOF_OK, "exec_sample_rows: %s", err.msg);
    if (!rc)
        rc = drv->StreamSynchronize(NULL) != CUDA_SUCCESS ||
             drv->MemcpyDtoH(out, d->out, sizeof *out * (size_t)rows) != CUDA_SUCCESS;
    CHECK_MSG(!rc, "the sampling kernel failed");
    return rc;
}

/* The host's greedy token: the first of the largest values, NaNs skipped, 0 if none. */
static int32_t host_argmax(const float *row, int64_t vocab) {
    int64_t best = -1;
    for (int64_t v = 0; v < vocab; v++)
        if (!isnan(row[v]) && (best < 0 || row[v] > row[best]))
            best = v;
    return best < 0 ? 0 : (int32_t)best;
}

/* The argmax of ROWS rows (spread: over blocks, with the scratch), poisoned before; 0 when it
 * ran and the scratch is zeros again. */
static int launch_argmax(exec_ctx *ctx, const gpu_bufs *d, stof_dtype t, int64_t vocab,
                         int spread, int32_t *out) {
    const cuda_driver *drv = exec_ctx_driver(ctx);
    stof_error err = {0};
    int32_t poison[ROWS];
    uint8_t keys[12 * ROWS];
    for (int r = 0; r < ROWS; r++)
        poison[r] = POISON_TOKEN;
    int rc = drv->MemcpyHtoD(d->out, poison, sizeof poison) != CUDA_SUCCESS;
    if (!rc)
        rc = exec_argmax_rows(ctx, d->logits, t, ROWS, vocab, spread ? d->keys : 0,
                              &(exec_tokens){.out = d->out}, NULL, &err);
    CHECK_MSG(rc == STOF_OK, "exec_argmax_rows: %s", err.msg);
    if (!rc)
        rc = drv->StreamSynchronize(NULL) != CUDA_SUCCESS ||
             drv->MemcpyDtoH(out, d->out, sizeof *out * ROWS) != CUDA_SUCCESS ||
             drv->MemcpyDtoH(keys, d->keys, exec_argmax_scratch_bytes(ROWS)) != CUDA_SUCCESS;
    CHECK_MSG(!rc, "the argmax kernel failed");
    for (size_t i = 0; !rc && i < exec_argmax_scratch_bytes(ROWS); i++)
        if (keys[i]) {
            CHECK_MSG(0, "vocab %lld: the argmax left its scratch byte %zu at %d",
                      (long long)vocab, i, keys[i]);
            return 1;
        }
    return rc;
}

/* Greedy tokens of every kind of row (with NaNs among the signed zeros' rows, and a row of
 * NaNs), fp16 and bf16, vocabularies around a block's part: the host's. */
static void check_argmax(exec_ctx *ctx, const gpu_bufs *d) {
    static const int64_t vocabs[] = {1, 7, 2048, 2049, 4099, 50257, BIG_VOCAB};
    int checked = 0;
    for (int t = 1; t <= 2; t++)
        for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++)
            for (int k = 0; k < N_KINDS; k++) {
                const int64_t vocab = vocabs[vi];
                const size_t n = (size_t)ROWS * (size_t)vocab;
                uint16_t *bits = malloc(sizeof *bits * n);
                float *rows = malloc(sizeof *rows * n);
                util_rng rng = {1000 + 31 * vi + 7 * (size_t)k + (size_t)t};
                for (size_t i = 0; bits && rows && i < n; i++) {
                    const int64_t v = (int64_t)(i % (size_t)vocab), r = (int64_t)(i / (size_t)vocab);
                    float x = logit_of((row_kind)k, &rng, v, vocab);
                    if (k == K_ZEROS && (r == ROWS - 1 || (r == ROWS - 2 && v % 3 == 1)))
                        x = NAN;
                    bits[i] = to_bits((stof_dtype)t, x);
                    rows[i] = from_bits((stof_dtype)t, bits[i]);
                }
                int rc = !bits || !rows ||
                         exec_ctx_driver(ctx)->MemcpyHtoD(d->logits, bits, sizeof *bits * n) !=
                             CUDA_SUCCESS;
                CHECK_MSG(!rc, "argmax inputs");
                for (int spread = 0; !rc && spread < 2; spread++)
                    for (int again = 0; !rc && again < 2; again++) {
                        int32_t got[ROWS];
                        rc = launch_argmax(ctx, d, (stof_dtype)t, vocab, spread, got);
                        for (int r = 0; !rc && r < ROWS; r++) {
                            const int32_t want = host_argmax(rows + (size_t)r * (size_t)vocab, vocab);
                            CHECK_MSG(got[r] == want, "argmax %s %s vocab %lld row %d (%s): token "
                                      "%d, the host's %d", t == STOF_BF16 ? "bf16" : "fp16",
                                      kind_name[k], (long long)vocab, r,
                                      spread ? "over blocks" : "a block", got[r], want);
                            checked++;
                        }
                    }
                free(bits);
                free(rows);
            }
    printf("greedy argmax: %d rows the host's (a block a row, and over blocks)\n", checked);
}

/* A decode step's bookkeeping (exec_tokens): the argmax (a block a row and over blocks) and
 * the draw, each with rows ended (live -1), a row whose position is past the host memory's
 * stride, and host memory the device writes. A live row's token goes to out and to host at
 * its position, its position and live entry move on by one; an ended row is left alone; no
 * other entry of host memory changes. Two launches in a row: the second's tokens go one
 * position further. */
static void check_moved_on(exec_ctx *ctx, const gpu_bufs *d) {
    enum { STRIDE = 5, VOCAB = 4099 };
    const cuda_driver *drv = exec_ctx_driver(ctx);
    /* row 1's position is not its attention's: both move on from the attention's */
    const int32_t live0[ROWS] = {0, 3, -1, 2, 4, -1}, pos0[ROWS] = {0, 7, 9, 2, 4, 11};
    uint16_t *bits = malloc(sizeof *bits * ROWS * VOCAB);
    float *rows = malloc(sizeof *rows * ROWS * VOCAB);
    int32_t *host = NULL;
    CUdeviceptr positions = 0, host_d = 0;
    int rc = !bits || !rows || drv->MemAlloc(&positions, sizeof pos0) != CUDA_SUCCESS ||
             drv->MemAllocHost((void **)&host, sizeof *host * ROWS * STRIDE) != CUDA_SUCCESS ||
             drv->MemHostGetDevicePointer(&host_d, host, 0) != CUDA_SUCCESS;
    CHECK_MSG(!rc, "buffers for the positions moved on");
    util_rng rng = {4242};
    for (size_t i = 0; !rc && i < (size_t)ROWS * VOCAB; i++) {
        bits[i] = to_bits(STOF_F16, (float)(3.0 * normal(&rng)));
        rows[i] = from_bits(STOF_F16, bits[i]);
    }
    double u[ROWS];
    for (int r = 0; r < ROWS; r++)
        u[r] = gen_uniform(17, r, 0);
    rc = rc || drv->MemcpyHtoD(d->logits, bits, sizeof *bits * ROWS * VOCAB) != CUDA_SUCCESS ||
         drv->MemcpyHtoD(d->u, u, sizeof u) != CUDA_SUCCESS;
    gen_options o = gen_options_default(1);
    o.temperature = 0.9f, o.top_k = 40, o.top_p = 0.9f;
    exec_sampling how = {o.temperature, o.top_k, o.top_p};
    float *scratch = malloc(sizeof *scratch * 2 * VOCAB);
    int32_t *order = malloc(sizeof *order * 2 * VOCAB);
    int checked = 0;
    for (int way = 0; way < 3 && !rc && scratch && order; way++) { /* argmax, spread, drawn */
        int32_t poison[ROWS];
        for (int r = 0; r < ROWS; r++)
            poison[r] = POISON_TOKEN;
        for (int i = 0; i < ROWS * STRIDE; i++)
            host[i] = POISON_TOKEN;
        rc = drv->MemcpyHtoD(d->out, poison, sizeof poison) != CUDA_SUCCESS ||
             drv->MemcpyHtoD(d->live, live0, sizeof live0) != CUDA_SUCCESS ||
             drv->MemcpyHtoD(positions, pos0, sizeof pos0) != CUDA_SUCCESS;
        const exec_tokens to = {.out = d->out, .live = d->live, .positions = positions,
                                .host = host_d, .host_stride = STRIDE};
        stof_error err = {0};
        for (int again = 0; again < 2 && !rc; again++)
            rc = way < 2 ? exec_argmax_rows(ctx, d->logits, STOF_F16, ROWS, VOCAB,
                                            way ? d->keys : 0, &to, NULL, &err)
                         : exec_sample_rows(ctx, d->logits, STOF_F16, ROWS, VOCAB, &how, d->u,
                                            d->prob, &to, NULL, &err);
        CHECK_MSG(!rc, "moved on (%d): %s", way, err.msg);
        int32_t out[ROWS], live[ROWS], pos[ROWS];
        rc = rc || drv->StreamSynchronize(NULL) != CUDA_SUCCESS ||
             drv->MemcpyDtoH(out, d->out, sizeof out) != CUDA_SUCCESS ||
             drv->MemcpyDtoH(live, d->live, sizeof live) != CUDA_SUCCESS ||
             drv->MemcpyDtoH(pos, positions, sizeof pos) != CUDA_SUCCESS;
        CHECK_MSG(!rc, "the moved-on launches failed");
        int32_t want_host[ROWS * STRIDE];
        for (int i = 0; i < ROWS * STRIDE; i++)
            want_host[i] = POISON_TOKEN;
        for (int r = 0; r < ROWS && !rc; r++) {
            const float *row = rows + (size_t)r * VOCAB;
            const int ended = live0[r] < 0;
            const int32_t want = ended ? POISON_TOKEN
                                 : way < 2 ? host_argmax(row, VOCAB)
                                           : host_draw(&o, row, VOCAB, u[r], scratch, order);
            CHECK_MSG(out[r] == want, "way %d row %d: token %d, want %d", way, r, out[r], want);
            CHECK_MSG(live[r] == (ended ? -1 : live0[r] + 2) && pos[r] == (ended ? pos0[r]
                                                                             : live0[r] + 2),
                      "way %d row %d: live %d position %d after two launches from %d, %d", way,
                      r, live[r], pos[r], live0[r], pos0[r]);
            for (int p = live0[r]; !ended && p < live0[r] + 2 && p < STRIDE; p++)
                want_host[r * STRIDE + p] = want;
            checked++;
        }
        for (int i = 0; i < ROWS * STRIDE && !rc; i++)
            CHECK_MSG(host[i] == want_host[i], "way %d: host memory [%d, %d] %d, want %d", way,
                      i / STRIDE, i % STRIDE, host[i], want_host[i]);
        uint8_t keys[12 * ROWS]; /* ended rows never touch theirs: all zeros again */
        rc = rc || drv->MemcpyDtoH(keys, d->keys, exec_argmax_scratch_bytes(ROWS)) != CUDA_SUCCESS;
        for (size_t i = 0; !rc && i < exec_argmax_scratch_bytes(ROWS); i++)
            CHECK_MSG(keys[i] == 0, "way %d: the argmax left its scratch byte %zu at %d", way, i,
                      keys[i]);
    }
    CHECK_MSG(checked == 3 * ROWS, "tokens with positions moved on: %d rows of %d checked",
              checked, 3 * ROWS);
    printf("tokens with positions moved on: %d rows (argmax, over blocks, drawn)\n", checked);
    free(bits);
    free(rows);
    free(scratch);
    free(order);
    if (host)
        drv->MemFreeHost(host);
    if (positions)
        drv->MemFree(positions);
}

/* One vocabulary, dtype and kind of row: ROWS rows, a few sets of options over them. */
static void run_case(exec_ctx *ctx, const gpu_bufs *d, stof_dtype t, int64_t vocab, row_kind k,
                     uint64_t seed, tally *tl) {
    const size_t n = (size_t)ROWS * (size_t)vocab;
    uint16_t *bits = malloc(sizeof *bits * n);
    float *rows = malloc(sizeof *rows * n);
    float *scratch = malloc(sizeof *scratch * 2 * (size_t)vocab);
    int32_t *order = malloc(sizeof *order * 2 * (size_t)vocab);
    if (!bits || !rows || !scratch || !order) {
        CHECK_MSG(0, "out of host memory");
        goto done;
    }
    util_rng rng = {seed};
    for (size_t i = 0; i < n; i++) {
        bits[i] = to_bits(t, logit_of(k, &rng, (int64_t)(i % (size_t)vocab), vocab));
        rows[i] = from_bits(t, bits[i]);
    }
    const cuda_driver *drv = exec_ctx_driver(ctx);
    if (drv->MemcpyHtoD(d->logits, bits, sizeof *bits * n) != CUDA_SUCCESS) {
        CHECK_MSG(0, "uploading logits");
        goto done;
    }
    static const float temps[] = {0.7f, 1.0f, 1.3f};
    static const float top_ps[] = {1.0f, 0.9f, 0.5f, 0.05f, 0.999f};
    const int top_ks[] = {0, 1, 3, 50, (int)vocab - 1, (int)vocab, (int)vocab + 3};
    for (int c = 0; c < 6; c++) {
        gen_options o = gen_options_default(1);
        o.temperature = temps[(c + k) % 3];
        o.top_k = top_ks[(c * 3 + k + (int)(seed % 7)) % 7];
        o.top_p = top_ps[(c + 2 * k + (int)(seed % 5)) % 5];
        if (o.top_k < 0)
            o.top_k = 0;
        double u[ROWS];
        int32_t live[ROWS];
        for (int r = 0; r < ROWS; r++) {
            u[r] = r == 0 ? 0.0 : r == 1 ? 1.0 - 1.0 / 9007199254740992.0
                                         : gen_uniform(seed, r, c);
            live[r] = r == 3 && c % 2 ? -1 : r;
        }
        int32_t got[ROWS], again[ROWS];
        if (drv->MemcpyHtoD(d->u, u, sizeof u) != CUDA_SUCCESS ||
            drv->MemcpyHtoD(d->live, live, sizeof live) != CUDA_SUCCESS) {
            CHECK_MSG(0, "uploading the uniforms");
            goto done;
        }
        if (launch(ctx, d, t, ROWS, vocab, &o, 1, got) || launch(ctx, d, t, ROWS, vocab, &o, 1, again))
            goto done;
        CHECK_MSG(memcmp(got, again, sizeof got) == 0, "%s, vocab %lld: two launches chose "
                  "different tokens", kind_name[k], (long long)vocab);
        for (int r = 0; r < ROWS; r++) {
            if (live[r] < 0) {
                CHECK_MSG(got[r] == POISON_TOKEN, "an ended row got token %d", got[r]);
                continue;
            }
            const float *row = rows + (size_t)r * (size_t)vocab;
            int32_t want = host_draw(&o, row, vocab, u[r], scratch, order);
            tl->draws++;
            if (got[r] == want) {
                check_passed++;
                continue;
            }
            int valid = got[r] >= 0 && got[r] < vocab;
            /* only a draw at an end of [0, 1) reaches a token without mass, and the GPU's
             * token must have some */
            int none = valid && r < 2 && massless(&o, row, vocab, want) &&
                       !massless(&o, row, vocab, got[r]);
            int edge = valid && !none && on_boundary(&o, row, vocab, u[r], got[r], scratch, order);
            tl->boundary += edge;
            tl->massless += none;
            CHECK_MSG(edge || none, "%s %s vocab %lld, T %g top_k %d top_p %g, u %.17g: token %d, the "
                      "host draws %d", t == STOF_BF16 ? "bf16" : "fp16", kind_name[k],
                      (long long)vocab, (double)o.temperature, o.top_k, (double)o.top_p, u[r],
                      got[r], want);
        }
    }
done:
    free(bits);
    free(rows);
    free(scratch);
    free(order);
}

/* The median time of a launch of exec_sample_rows (or the argmax), us, of 20 replays of a CUDA
 * graph that holds it (what a decode step's graph runs). */
static double time_rows(exec_ctx *ctx, const gpu_bufs *d, int rows, int64_t vocab,
                        const gen_options *o) {
    const cuda_driver *drv = exec_ctx_driver(ctx);
    CUstream st = NULL;
    CUgraph captured = NULL;
    CUgraphExec exec = NULL;
    CUevent e0 = NULL, e1 = NULL;
    stof_error err = {0};
    exec_sampling how = {o->temperature, o->top_k, o->top_p};
    const exec_tokens to = {.out = d->out};
    float ms[20];
    int rc = drv->StreamCreate(&st, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS;
    for (int pass = 0; !rc && pass < 2; pass++) { /* once to load the kernel, once captured */
        rc = pass && drv->StreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
        rc = rc || (o->temperature > 0.0f
                        ? exec_sample_rows(ctx, d->logits, STOF_F16, rows, vocab, &how, d->u,
                                           d->prob, &to, st, &err)
                        : exec_argmax_rows(ctx, d->logits, STOF_F16, rows, vocab, d->keys, &to,
                                           st, &err));
        if (pass)
            rc = drv->StreamEndCapture(st, &captured) != CUDA_SUCCESS || rc;
    }
    rc = rc || drv->GraphInstantiate(&exec, captured, 0) != CUDA_SUCCESS ||
         drv->EventCreate(&e0, 0) != CUDA_SUCCESS || drv->EventCreate(&e1, 0) != CUDA_SUCCESS;
    for (int i = 0; i < 20 && !rc; i++)
        rc = drv->EventRecord(e0, st) != CUDA_SUCCESS || drv->GraphLaunch(exec, st) != CUDA_SUCCESS ||
             drv->EventRecord(e1, st) != CUDA_SUCCESS || drv->EventSynchronize(e1) != CUDA_SUCCESS ||
             drv->EventElapsedTime(&ms[i], e0, e1) != CUDA_SUCCESS;
    CHECK_MSG(!rc, "timing %d rows: %s", rows, err.msg);
    if (e0)
        drv->EventDestroy(e0);
    if (e1)
        drv->EventDestroy(e1);
    if (exec)
        drv->GraphExecDestroy(exec);
    if (captured)
        drv->GraphDestroy(captured);
    if (st)
        drv->StreamDestroy(st);
    if (rc)
        return -1.0;
    qsort(ms, 20, sizeof *ms, cmp_float);
    return 1000.0 * ms[10];
}

static void timing(exec_ctx *ctx, const gpu_bufs *d) {
    const int64_t vocab = 50257;
    static const int batches[] = {1, 8, 64};
    printf("time of a step's token choice, vocabulary %lld, fp16, us (median of 20):\n",
           (long long)vocab);
    printf("  %-28s %8s %8s %8s\n", "choice", "rows 1", "rows 8", "rows 64");
    struct { const char *name; float t; int k; float p; } modes[] = {
        {"greedy (argmax)", 0.0f, 0, 1.0f},          {"T 0.8", 0.8f, 0, 1.0f},
        {"T 0.8, top-k 50", 0.8f, 50, 1.0f},         {"T 0.8, top-p 0.9", 0.8f, 0, 0.9f},
        {"T 0.8, top-k 50, top-p 0.9", 0.8f, 50, 0.9f}};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        gen_options o = gen_options_default(1);
        o.temperature = modes[m].t;
        o.top_k = modes[m].k;
        o.top_p = modes[m].p;
        printf("  %-28s", modes[m].name);
        for (int b = 0; b < 3; b++)
            printf(" %8.1f", time_rows(ctx, d, batches[b], vocab, &o));
        printf("\n");
    }
}


static int alloc_bufs(exec_ctx *ctx, gpu_bufs *d) {
    const cuda_driver *drv = exec_ctx_driver(ctx);
    size_t most = (size_t)TIME_ROWS * TIME_VOCAB > (size_t)ROWS * BIG_VOCAB
                      ? (size_t)TIME_ROWS * TIME_VOCAB
                      : (size_t)ROWS * BIG_VOCAB;
    memset(d, 0, sizeof *d);
    return drv->MemAlloc(&d->logits, 2 * most) != CUDA_SUCCESS ||
           drv->MemAlloc(&d->prob, 4 * most) != CUDA_SUCCESS ||
           drv->MemAlloc(&d->u, sizeof(double) * TIME_ROWS) != CUDA_SUCCESS ||
           drv->MemAlloc(&d->live, sizeof(int32_t) * TIME_ROWS) != CUDA_SUCCESS ||
           drv->MemAlloc(&d->out, sizeof(int32_t) * TIME_ROWS) != CUDA_SUCCESS ||
           drv->MemAlloc(&d->keys, exec_argmax_scratch_bytes(TIME_ROWS)) != CUDA_SUCCESS ||
           drv->MemsetD8Async(d->keys, 0, exec_argmax_scratch_bytes(TIME_ROWS), NULL) !=
               CUDA_SUCCESS ||
           drv->StreamSynchronize(NULL) != CUDA_SUCCESS;
}

static void free_bufs(exec_ctx *ctx, gpu_bufs *d) {
    const cuda_driver *drv = exec_ctx_driver(ctx);
    CUdeviceptr *all[] = {&d->logits, &d->prob, &d->u, &d->live, &d->out, &d->keys};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (*all[i])
            drv->MemFree(*all[i]);
}

/* Logits and uniforms for the timing: normal fp16 values of standard deviation sd, TIME_ROWS
 * rows. */
static int timing_inputs(exec_ctx *ctx, const gpu_bufs *d, double sd) {
    size_t n = (size_t)TIME_ROWS * TIME_VOCAB;
    uint16_t *bits = malloc(sizeof *bits * n);
    if (!bits)
        return -1;
    util_rng rng = {99};
    for (size_t i = 0; i < n; i++)
        bits[i] = util_f32_to_f16((float)(sd * normal(&rng)));
    double u[TIME_ROWS];
    for (int r = 0; r < TIME_ROWS; r++)
        u[r] = gen_uniform(99, r, 0);
    const cuda_driver *drv = exec_ctx_driver(ctx);
    int rc = drv->MemcpyHtoD(d->logits, bits, sizeof *bits * n) != CUDA_SUCCESS ||
             drv->MemcpyHtoD(d->u, u, sizeof u) != CUDA_SUCCESS;
    free(bits);
    return rc;
}

int main(int argc, char **argv) {
    exec_ctx *ctx = NULL;
    GPU_TEST_OPEN(exec_ctx_create, ctx, "gpu_sample");
    printf("GPU: %s\n", exec_ctx_device(ctx)->name);
    stof_error err = {0};
    gpu_bufs d;
    int rc = exec_ctx_make_current(ctx, &err);
    CHECK_MSG(rc == STOF_OK, "context: %s", err.msg);
    if (!rc)
        rc = alloc_bufs(ctx, &d);
    CHECK_MSG(rc == 0, "device buffers");
    static const int64_t vocabs[] = {1, 2, 7, 1000, 4099, 50257, BIG_VOCAB};
    tally tl = {0, 0, 0};
    uint64_t seed = 1;
    for (int t = 1; !rc && t <= 2; t++)
        for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++)
            for (int k = 0; k < N_KINDS; k++) {
                if (vocabs[v] == BIG_VOCAB && k != K_NORMAL && k != K_FEW)
                    continue;
                run_case(ctx, &d, (stof_dtype)t, vocabs[v], (row_kind)k, seed++, &tl);
            }
    printf("sampled tokens: %d draws, %d the host's, %d on a boundary the host's draw moves "
           "across by a rounding, %d where the host drew a token without mass on the GPU (below "
           "half a unit)\n", tl.draws, tl.draws - tl.boundary - tl.massless, tl.boundary,
           tl.massless);
    CHECK_MSG(tl.draws > 2000, "only %d draws", tl.draws);
    CHECK_MSG(tl.boundary * 200 <= tl.draws, "%d of %d draws on a boundary: more than rounding "
              "explains", tl.boundary, tl.draws);
    /* the massless ones come from the ends of [0, 1) alone (rows 0 and 1 of each case) */
    CHECK_MSG(tl.massless * 20 <= tl.draws, "%d of %d draws of a token without mass",
              tl.massless, tl.draws);
    /* rows without a finite largest logit (all -inf; a +inf): token 0, whatever the options */
    for (int k = 0; k < 2 && !rc; k++) {
        const int64_t vocab = 300;
        uint16_t bits[ROWS * 300];
        for (int i = 0; i < ROWS * 300; i++)
            bits[i] = k == 0 ? 0xfc00 : (i % 300 == 7 ? 0x7c00 : 0x3c00);
        double u[ROWS] = {0.0, 0.5, 0.25, 0.75, 0.9, 0.1};
        const cuda_driver *drv = exec_ctx_driver(ctx);
        rc = drv->MemcpyHtoD(d.logits, bits, sizeof bits) != CUDA_SUCCESS ||
             drv->MemcpyHtoD(d.u, u, sizeof u) != CUDA_SUCCESS;
        static const int ks[] = {0, 5, 0, 5};
        static const float ps[] = {1.0f, 1.0f, 0.5f, 0.5f};
        for (int c = 0; c < 4 && !rc; c++) {
            gen_options o = gen_options_default(1);
            o.temperature = 1.0f, o.top_k = ks[c], o.top_p = ps[c];
            int32_t got[ROWS];
            rc = launch(ctx, &d, STOF_F16, ROWS, vocab, &o, 0, got);
            for (int r = 0; r < ROWS && !rc; r++)
                CHECK_MSG(got[r] == 0, "%s, top_k %d top_p %g: token %d", k ? "a +inf" : "all -inf",
                          ks[c], (double)ps[c], got[r]);
        }
    }
    if (!rc)
        check_argmax(ctx, &d);
    if (!rc)
        check_moved_on(ctx, &d);
    /* bad requests: refused, saying what was expected */
    exec_sampling bad = {0.0f, 0, 1.0f};
    const exec_tokens to = {.out = d.out};
    if (!rc) {
        CHECK_EQ_INT(exec_sample_rows(ctx, d.logits, STOF_F16, 1, 10, &bad, d.u, d.prob, &to, NULL,
                                      &err), STOF_ERR_INVALID);
        CHECK_CONTAINS(err.msg, "temperature 0 (> 0)");
        bad.temperature = 1.0f;
        CHECK_EQ_INT(exec_sample_rows(ctx, d.logits, STOF_F32, 1, 10, &bad, d.u, d.prob, &to, NULL,
                                      &err), STOF_ERR_UNSUPPORTED);
        CHECK_CONTAINS(err.msg, "logits in fp16 or bf16, not fp32");
        CHECK_EQ_INT(exec_sample_rows(ctx, d.logits, STOF_F16, 1, (int64_t)1 << 31, &bad, d.u,
                                      d.prob, &to, NULL, &err), STOF_ERR_INVALID);
        CHECK_CONTAINS(err.msg, "sampling: 1 rows of 2147483648 logits");
    }
    int notime = argc > 1 && strcmp(argv[1], "notime") == 0;
    /* logits of sd 2: top-p 0.9 keeps thousands of tokens; of sd 6: tens */
    for (int k = 0; k < 2 && !rc && !notime; k++)
        if (timing_inputs(ctx, &d, k ? 6.0 : 2.0) == 0) {
            printf("logits of standard deviation %d:\n", k ? 6 : 2);
            timing(ctx, &d);
        }
    if (!rc)
        free_bufs(ctx, &d);
    exec_ctx_free(ctx);
    return check_summary("gpu_sample");
}
