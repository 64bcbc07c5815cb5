/* Measured choices remembered ("wisdom", as Kernel Tuner calls it): when a
 * plan is measured (mha_exec_force.measure > 0), its winning configuration
 * is written under the device and the problem into the kernel cache's
 * folder (attention-wisdom.txt); a later plan of the same problem on the
 * same kind of device with nothing forced takes it instead of the
 * analytical choice. measure < 0 asks for the analytical choice alone, and
 * STOF_ATTENTION_WISDOM=0 turns the file off.
 *
 * One line an entry: DEVICE \t PROBLEM \t k bm bn w rpw wpb st wg tma ms.
 * Lines that do not parse are skipped; a cache, never an error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/file.h"
#include "core/exec/attention/mha_exec_internal.h"

#define WISDOM_FILE "attention-wisdom.txt"
#define WISDOM_MAX_BYTES ((size_t)4 << 20)

static int wisdom_enabled(const mha_exec_ctx *c) {
    const char *env = getenv("STOF_ATTENTION_WISDOM");
    return c->nvrtc.dir[0] && !(env && strcmp(env, "0") == 0);
}

static void wisdom_path(const mha_exec_ctx *c, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", c->nvrtc.dir, WISDOM_FILE);
}

/* "NAME|sm_90|132": the kind of device a measurement holds for. Tabs and
 * newlines in a name would break a line: replaced. */
static void device_key(const mha_exec_ctx *c, char *out, size_t cap) {
    snprintf(out, cap, "%s|%s|%d", c->info.name, c->arch, c->info.sm_count);
    for (char *s = out; *s; s++)
        if (*s == '\t' || *s == '\n')
            *s = ' ';
}

/* Every field of the problem that changes the kernel's time, and the
 * folded mask's fingerprint. */
static void problem_key(const mha_exec_problem *p, const mask *folded, char *out, size_t cap) {
    snprintf(out, cap, "b%d h%d/%d d%d q%d k%d t%d c%d s%.6g r%d/%d/%d/%d p%d m%016llx",
             p->batch, p->heads, mha_exec_kv_heads(p), p->head_dim, p->q_len, p->k_len, (int)p->dtype, p->causal,
             (double)p->scale, p->relpos, p->relpos_buckets, p->relpos_max_distance,
             p->relpos_bidirectional, p->padded, (unsigned long long)folded->fingerprint);
}

/* The line of (device, problem) in text, or NULL; *len its length with the
 * newline. */
static const char *find_line(const char *text, const char *prefix, size_t *len) {
    size_t n = strlen(prefix);
    for (const char *s = text; s && *s;) {
        const char *nl = strchr(s, '\n');
        size_t l = nl ? (size_t)(nl - s) + 1 : strlen(s);
        if (strncmp(s, prefix, n) == 0) {
            *len = l;
            return s;
        }
        s += l;
    }
    return NULL;
}

int mha_wisdom_lookup(const mha_exec_ctx *c, const mha_exec_problem *p, const mask *folded,
                      mha_exec_force *f) {
    if (!wisdom_enabled(c))
        return 0;
    char path[1200], dev[320], prob[256], prefix[600];
    wisdom_path(c, path, sizeof path);
    if (!file_exists(path))
        return 0;
    device_key(c, dev, sizeof dev);
    problem_key(p, folded, prob, sizeof prob);
    snprintf(prefix, sizeof prefix, "%s\t%s\t", dev, prob);
    char *text = NULL;
    size_t n = 0;
    stof_error ignored = {0};
    if (file_read(path, "attention wisdom", WISDOM_MAX_BYTES, &text, &n, &ignored))
        return 0;
    size_t len = 0;
    const char *line = find_line(text, prefix, &len);
    int found = 0;
    mha_exec_force w = {0};
    if (line) {
        int wg = 0, tma = 0;
        float ms = 0;
        found = sscanf(line + strlen(prefix), "%d %d %d %d %d %d %d %d %d %f", &w.kernel,
                       &w.block_m, &w.block_n, &w.num_warps, &w.rows_per_warp,
                       &w.warps_per_block, &w.stages, &wg, &tma, &ms) == 10 &&
                (w.kernel == MHA_KERNEL_ROW_WISE || w.kernel == MHA_KERNEL_BLOCK_WISE);
        w.wgmma = wg ? 1 : -1;
        w.tma = tma ? 1 : -1;
    }
    free(text);
    if (found)
        *f = w;
    return found;
}

void mha_wisdom_record(const mha_exec_ctx *c, const mha_exec_problem *p, const mask *folded,
                       const mha_exec_config *cfg, float ms) {
    if (!wisdom_enabled(c))
        return;
    char path[1200], dev[320], prob[256], prefix[600], entry[800];
    wisdom_path(c, path, sizeof path);
    device_key(c, dev, sizeof dev);
    problem_key(p, folded, prob, sizeof prob);
    snprintf(prefix, sizeof prefix, "%s\t%s\t", dev, prob);
    snprintf(entry, sizeof entry, "%s%d %d %d %d %d %d %d %d %d %.4f\n", prefix, (int)cfg->kernel,
             cfg->block_m, cfg->block_n, cfg->num_warps, cfg->rows_per_warp,
             cfg->warps_per_block, cfg->stages, cfg->wgmma, cfg->tma, (double)ms);
    char *text = NULL;
    size_t n = 0;
    stof_error ignored = {0};
    if (file_exists(path) && file_read(path, "attention wisdom", WISDOM_MAX_BYTES, &text, &n,
                                       &ignored))
        return;
    /* the old entry of the problem goes; the new one is appended */
    size_t len = 0;
    const char *old = text ? find_line(text, prefix, &len) : NULL;
    size_t keep = n - (old ? len : 0), add = strlen(entry);
    char *out = malloc(keep + add + 1);
    if (out) {
        size_t at = 0;
        if (text && old) {
            memcpy(out, text, (size_t)(old - text));
            at = (size_t)(old - text);
            memcpy(out + at, old + len, n - (size_t)(old - text) - len);
            at += n - (size_t)(old - text) - len;
        } else if (text) {
            memcpy(out, text, n);
            at = n;
        }
        memcpy(out + at, entry, add);
        file_write(path, "attention wisdom", out, at + add, &ignored);
    }
    free(out);
    free(text);
}
