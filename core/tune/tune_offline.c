/* The starting schemes of a tuning (tune_initial_schemes) and plans made
 * without a GPU (tune_offline): those schemes with every segment's default
 * setting for an architecture, their kernels compiled into the NVRTC
 * cache; and the executor's own default plan as a search result
 * (tune_default_result), which a tuned plan is timed against. */
#include "core/tune/tune_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/error.h"
#include "core/base/task_pool.h"
#include "core/base/util.h"
#include "core/tune/tune_impl.h"

static exec_seq exec_seq_of(const search_sequence *q) {
    return (exec_seq){q->layer, q->firsts[0], q->n, 0};
}

int tune_initial_schemes(const graph *g, const search_sequence *seqs, int n_seqs,
                         int smem_limit, fusion_scheme *out, stof_error *err) {
    for (int q = 0; q < n_seqs; q++) {
        int ops[FUSION_MAX_OPS];
        for (int k = 0; k < seqs[q].n; k++)
            ops[k] = seqs[q].firsts[0] + k;
        search_rules rules = {0, smem_limit};
        exec_seq es = exec_seq_of(&seqs[q]);
        int rc = search_initial_scheme(g, ops, seqs[q].n, &rules, &out[q], err);
        if (!rc && exec_scheme_check(g, &es, &out[q], NULL) != STOF_OK)
            rc = exec_default_scheme(g, &es, &out[q], err);
        if (rc)
            return rc;
    }
    return STOF_OK;
}

/* The starting schemes with every segment's default setting for lim. */
static int offline_result(const graph *g, const search_sequence *seqs, int n_seqs,
                          const fusion_scheme *schemes, const mha_device_limits *lim,
                          search_result *r, stof_error *err) {
    memset(r, 0, sizeof *r);
    r->seqs = err_calloc((size_t)n_seqs, sizeof *r->seqs, err);
    if (!r->seqs)
        return STOF_ERR_NOMEM;
    r->n_seqs = n_seqs;
    for (int q = 0; q < n_seqs; q++) {
        search_seq_result *sr = &r->seqs[q];
        fusion_segment spans[FUSION_MAX_OPS];
        int n = fusion_scheme_segments(&schemes[q], spans, FUSION_MAX_OPS);
        sr->scheme = schemes[q];
        fusion_scheme_canonical(&sr->scheme);
        if (!(sr->segs = err_calloc((size_t)n, sizeof *sr->segs, err)))
            return STOF_ERR_NOMEM;
        sr->n_segs = n;
        for (int k = 0; k < n; k++) {
            exec_segment s;
            exec_choice c;
            int got = 0;
            int rc = exec_segment_at(g, seqs[q].firsts[0] + spans[k].first,
                                     spans[k].last - spans[k].first + 1, &s, err);
            if (!rc)
                rc = exec_segment_template(g, s.first, s.n, &s.match, &s.tmpl, err);
            s.auto_attention = tune_is_attention(s.tmpl);
            if (!rc)
                rc = exec_segment_candidates(g, &s, lim, 0, &c, 1, &got, err);
            if (rc)
                return rc;
            const fusion_template *t = fusion_template_get(c.tmpl);
            sr->segs[k] = (search_seg_result){spans[k].first, spans[k].last, c.tmpl,
                                              t->n_params, {0}, 0.0};
            memcpy(sr->segs[k].values, c.values, sizeof c.values);
        }
    }
    return STOF_OK;
}

/* The executor segment of result segment k of sequence q, with its setting. */
static int offline_segment(const graph *g, const search_sequence *seqs, const search_result *r,
                           int q, int k, exec_segment *s, stof_error *err) {
    const search_seg_result *sg = &r->seqs[q].segs[k];
    int rc = exec_segment_at(g, seqs[q].firsts[0] + sg->first, sg->last - sg->first + 1, s, err);
    s->tmpl = sg->tmpl;
    s->has_values = 1;
    memcpy(s->values, sg->values, sizeof s->values);
    return rc;
}

int tune_default_result(const graph *g, const search_sequence *seqs, int n_seqs,
                        const mha_device_limits *lim, search_result *r, stof_error *err) {
    memset(r, 0, sizeof *r);
    fusion_scheme *schemes = err_calloc((size_t)n_seqs + 1, sizeof *schemes, err);
    exec_seq *es = err_calloc((size_t)n_seqs + 1, sizeof *es, err);
    int rc = schemes && es ? STOF_OK : STOF_ERR_NOMEM;
    for (int q = 0; !rc && q < n_seqs; q++) {
        es[q] = exec_seq_of(&seqs[q]);
        es[q].cls = q;
    }
    /* the executor's rule, ops outside the layers included (unfused unless they run one row),
     * where a scheme left empty runs unfused */
    if (!rc)
        rc = exec_default_schemes(g, es, n_seqs, schemes, err);
    for (int q = 0; !rc && q < n_seqs; q++)
        if (schemes[q].n == 0)
            rc = fusion_scheme_all_unfused(&schemes[q], seqs[q].n, err);
    free(es);
    if (!rc)
        rc = offline_result(g, seqs, n_seqs, schemes, lim, r, err);
    free(schemes);
    if (rc)
        search_result_free(r);
    return rc;
}

/* Every build of the result queued on a pool (*requests: how many). */
static int offline_ahead(const graph *g, const search_sequence *seqs, const search_result *r,
                         const mha_device_limits *lim, nvrtc_cache *cache, task_pool *pool,
                         int *requests, stof_error *err) {
    *requests = 0;
    for (int q = 0; q < r->n_seqs; q++)
        for (int k = 0; k < r->seqs[q].n_segs; k++) {
            exec_segment s;
            exec_build b[EXEC_MAX_BUILDS];
            int n = 0;
            int rc = offline_segment(g, seqs, r, q, k, &s, err);
            if (!rc)
                rc = exec_segment_builds(g, &s, lim, EXEC_BUILDS_ALL, b, &n, err);
            for (int i = 0; !rc && i < n; i++)
                rc = nvrtc_submit(pool, 0, cache, exec_build_request(&b[i]), err);
            if (rc)
                return rc;
            *requests += n;
        }
    return STOF_OK;
}

/* Every kernel of the result (one per segment of each class) into cache:
 * compiled on a pool, then asked for one by one (which reports errors). */
static int offline_compile(const graph *g, const search_sequence *seqs, const search_result *r,
                           const mha_device_limits *lim, nvrtc_cache *cache, int *requests,
                           stof_error *err) {
    task_pool *pool = NULL;
    int rc = task_pool_create(0, &pool, err);
    if (!rc)
        rc = offline_ahead(g, seqs, r, lim, cache, pool, requests, err);
    task_pool_free(pool); /* waits for the compiles under way, drops the rest on failure */
    for (int q = 0; !rc && q < r->n_seqs; q++)
        for (int k = 0; !rc && k < r->seqs[q].n_segs; k++) {
            exec_segment s;
            rc = offline_segment(g, seqs, r, q, k, &s, err);
            if (!rc)
                rc = exec_segment_compile(g, &s, lim, cache, err);
            if (rc)
                return err_prefix(err, "compiling ops #%d-#%d for %s: ", s.first,
                                  s.first + s.n - 1, lim->arch);
        }
    return rc;
}

int tune_offline(const graph *g, const graph_script *script, const char *arch,
                 const char *nvrtc_dir, plan *out, tune_offline_stats *st, stof_error *err) {
    memset(out, 0, sizeof *out);
    memset(st, 0, sizeof *st);
    double t0 = util_now();
    mha_device_limits lim;
    stof_dtype dtype;
    search_sequence *seqs = NULL;
    int n_seqs = 0;
    fusion_scheme *schemes = NULL;
    search_result r;
    memset(&r, 0, sizeof r);
    nvrtc_cache cache;
    nvrtc_cache_init(&cache, nvrtc_dir);
    int rc = mha_limits_for_arch(arch, &lim, err);
    if (!rc)
        rc = exec_model_dtype(g, &dtype, err);
    if (!rc)
        rc = search_sequences_from_graph(g, &seqs, &n_seqs, err);
    if (!rc && !(schemes = err_calloc((size_t)n_seqs, sizeof *schemes, err)))
        rc = STOF_ERR_NOMEM;
    if (!rc)
        rc = tune_initial_schemes(g, seqs, n_seqs, lim.smem_per_block, schemes, err);
    if (!rc)
        rc = offline_result(g, seqs, n_seqs, schemes, &lim, &r, err);
    if (!rc)
        rc = plan_from_search(&r, g, seqs, script, NULL, arch, out, err);
    int requests = 0;
    if (!rc)
        rc = offline_compile(g, seqs, &r, &lim, &cache, &requests, err);
    st->compiled = cache.compiled;
    st->disk_hits = cache.disk_hits;
    st->kernels = requests;
    st->memory_hits = requests - cache.compiled - cache.disk_hits; /* asked for again */
    st->seconds = util_now() - t0;
    const char *w = nvrtc_cache_warning(&cache, &st->cache_problems);
    snprintf(st->cache_problem, sizeof st->cache_problem, "%s", w ? w : "");
    nvrtc_cache_free(&cache);
    search_result_free(&r);
    free(schemes);
    search_sequences_free(seqs, n_seqs);
    if (rc)
        plan_free(out);
    return rc;
}
