/* Plans: the tuned choice for one model on one GPU, as a JSON file a person
 * can read and a later run can load without tuning again.
 *
 * A plan records what it was made for (the stof build, the device, the
 * script with its parameters and content hash, the input shapes, each
 * mask's fingerprint) and what was chosen (per sequence class the fusion
 * scheme and per segment its ops, template, parameters and measured time),
 * with the forward latency, the tuning time and the search statistics.
 *
 *   {
 *     "format": "stof-plan", "version": 1,
 *     "stof": {"version": "0.1.0", "commit": "adbc9ec1f2a3"},
 *     "device": {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
 *                "sms": 132, "arch": "sm_90"},
 *            or {"name": "unmeasured", "arch": "sm_90"} for a plan made offline
 *     "script": {"name": "bert.lua", "hash": "0x1f2e3d4c5b6a7988",
 *                "params": {"batch": "8", "seq": "512", ...},
 *                "path": "/home/me/stof/scripts/bert.lua"},   (optional: a hint
 *                where to find the script again; the name and hash decide)
 *     "shapes": {"batch": 8, "seq": 512,
 *                "inputs": [{"name": "input_ids", "shape": [8, 512]}]},
 *     "masks": [{"description": "bigbird{...}", "fingerprint": "0x...",
 *                "batch": 1, "q_len": 512, "k_len": 512}],
 *     "sequences": [{"layer": 0, "ops": 14, "instances": [2, 16, 30, 44],
 *                    "scheme": {"binary": "00100001111100", "hex": "14:21f0"},
 *                    "ms": 1.3,
 *                    "segments": [{"first": 0, "last": 1, "ops": ["gemm", "bias"],
 *                                  "template": "cublaslt", "params": {"ALGO": 0},
 *                                  "kernel": "cublaslt", "ms": 0.1}, ...]}],
 *     "latency_ms": 5.2, "tuning_s": 41.7,
 *     "end_to_end": {"graph_ms": 5.0, "eager_ms": 5.9, "unfused_ms": 7.4},
 *            (optional: the whole forward pass timed after tuning, by CUDA
 *            graph replay and eagerly, and the all-unfused scheme's replay;
 *            latency_ms is the sum of the segments' times)
 *     "search": {"settings_measured": 812, "cache_hits": 97, "schemes_tried": 23,
 *                "schemes_kept": 6, "rounds": 9}
 *            (optional in "search": "measured_past_limit": N, when the time
 *            limit ran out before the initial scheme was measured)
 *     "decode": [{"batch": 8, "context": 512, "plan": {...}}, ...]
 *            (optional: a decoder's decode steps tuned with it, stof tune
 *            --decode-batch; each "plan" is the step's own plan, a plan as
 *            above of the step's graph at that batch, one token a sequence,
 *            with caches of `context` positions, and holds no "decode")
 *   }
 *
 * Reading is strict: every key must be there with the right type, no
 * unknown key may be, the scheme texts must agree with each other and with
 * the segments, templates and parameter values must exist, and the times
 * must add up. Anything else is STOF_ERR_FORMAT naming the field, such as
 * "plan.json: sequences[0].segments[2].params.BLOCK_M: expected one of 64,
 * 128, got 96". An unknown key says the plan must be made again: plans of
 * version 1 written before the "attention" list was dropped hold one, and
 * the reader names it rather than pass over it.
 *
 * Files: plan.c (what a plan owns), plan_write.c, plan_read.c, plan_fits.c,
 * plan_from_search.c. */
#ifndef STOF_CORE_PLAN_H
#define STOF_CORE_PLAN_H

#include <stdint.h>

#include "core/graph/graph.h"
#include "core/graph/script.h"
#include "fusion/scheme.h"
#include "fusion/templates.h"
#include "search/search.h"

#define PLAN_FORMAT_NAME "stof-plan"
#define PLAN_FORMAT_VERSION 1
#define PLAN_NAME_MAX 256
#define PLAN_MAX_PARAMS FUSION_MAX_PARAMS
#define PLAN_UNMEASURED "unmeasured"

typedef struct plan_device {
    int measured;            /* 0: planned offline for `arch` */
    char name[PLAN_NAME_MAX];
    int cc_major, cc_minor;  /* measured only */
    int sm_count;            /* measured only */
    char arch[16];           /* "sm_90" */
} plan_device;

typedef struct plan_input {
    char name[GRAPH_NAME_MAX];
    int ndim;
    int64_t shape[GRAPH_MAX_DIMS];
} plan_input;

typedef struct plan_mask {
    char *description;       /* owned */
    uint64_t fingerprint;
    int batch, q_len, k_len;
} plan_mask;

/* A kernel choice: a template and one value per parameter, in the
 * template's order (the JSON names them). */
typedef struct plan_kernel {
    fusion_template_id tmpl;
    int n_values;
    int values[PLAN_MAX_PARAMS];
} plan_kernel;

typedef struct plan_segment {
    int first, last;         /* positions in the sequence */
    op_kind kinds[FUSION_MAX_OPS]; /* of ops first..last */
    plan_kernel kernel;
    double ms;
} plan_segment;

typedef struct plan_sequence {
    int layer;               /* representative layer, -1 outside layers */
    int n_ops;
    int n_instances;
    int *instances;          /* graph index of each occurrence's first op (owned) */
    fusion_scheme scheme;
    int n_segments;
    plan_segment *segments;  /* owned */
    double ms;               /* one occurrence */
} plan_sequence;

/* The forward pass timed end to end after tuning (medians, ms). */
typedef struct plan_end_to_end {
    double graph_ms;   /* CUDA graph replay */
    double eager_ms;   /* kernel by kernel */
    double unfused_ms; /* the all-unfused scheme, graph replay */
} plan_end_to_end;

typedef struct plan_stats {
    long settings_measured, cache_hits, schemes_tried, schemes_kept;
    int rounds;
    /* settings measured after the time limit ran out, to finish the initial
     * scheme: > 0 means the limit was too short to search (JSON: written
     * only when > 0) */
    long measured_past_limit;
} plan_stats;

struct plan;

/* A decode step tuned with the model: its own plan, for `batch` sequences and caches of
 * `context` positions. */
typedef struct plan_decode {
    int batch;
    int64_t context;
    struct plan *step;       /* owned; holds no decode steps */
} plan_decode;

typedef struct plan {
    int version;
    char stof_version[32];
    char stof_commit[64];
    plan_device device;
    char script_name[PLAN_NAME_MAX];
    char script_path[1024];  /* "" when not recorded */
    char model_dir[1024];    /* the model directory the script was given, "" for none */
    uint64_t script_hash;
    int n_params;
    graph_script_param params[GRAPH_SCRIPT_MAX_PARAMS];
    int64_t batch, seq;
    int n_inputs;
    plan_input *inputs;      /* owned */
    int n_masks;
    plan_mask *masks;        /* owned */
    int n_sequences;
    plan_sequence *sequences;  /* owned */
    double latency_ms;
    double tuning_s;
    int has_end_to_end;
    plan_end_to_end end_to_end;
    plan_stats stats;
    int n_decode;
    plan_decode *decode;     /* owned; batches all different */
} plan;

/* Frees what the plan owns and zeroes it. */
void plan_free(plan *p);

/* The decode step the plan holds for `batch` sequences, or NULL. */
const plan_decode *plan_decode_find(const plan *p, int batch);
/* Adds the decode step *step (taken over: zeroed) for (batch, context); another batch than
 * those held. */
int plan_add_decode(plan *p, int batch, int64_t context, plan *step, stof_error *err);

/* The JSON text (malloc'd, cJSON_Print layout). */
int plan_to_json(const plan *p, char **text, stof_error *err);
/* Parses and validates text; `source` names it in messages ("plan.json").
 * On failure *p holds nothing to free. */
int plan_from_json(const char *text, size_t len, const char *source, plan *p, stof_error *err);

int plan_write(const plan *p, const char *path, stof_error *err);
int plan_read(const char *path, plan *p, stof_error *err);

/* Whether the plan fits this device (NULL: skip the device), script (NULL:
 * skip) and graph (NULL: skip): STOF_ERR_MISMATCH naming the first
 * difference. A plan made offline fits any device of its architecture. */
int plan_check_fits(const plan *p, const stof_device_info *dev, const graph_script *script,
                    const graph *g, stof_error *err);

/* The plan of a finished search over the sequences it was given
 * (search_run's result): the device dev (NULL: a plan made offline for
 * arch), the script (may be NULL for a graph built in code), shapes and
 * masks from g. On failure *p holds nothing to free. */
int plan_from_search(const search_result *r, const graph *g, const search_sequence *seqs,
                     const graph_script *script, const stof_device_info *dev,
                     const char *arch, plan *p, stof_error *err);

#endif
