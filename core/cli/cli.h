/* The `stof` command: shared argument handling for the subcommands. */
#ifndef STOF_CORE_CLI_H
#define STOF_CORE_CLI_H

#include <stdint.h>

#include "core/graph/graph.h"
#include "core/io/weights.h"
#include "core/lua/lua_api.h"
#include "core/plan/plan.h"

#define CLI_MAX_SCHEMES 16
#define CLI_MAX_PROMPTS 256
#define CLI_MAX_STOPS 8
#define CLI_MAX_DECODE 8

/* When `stof run` compares with the CPU reference. */
enum { CLI_CHECK_AUTO = 0, CLI_CHECK_ALWAYS, CLI_CHECK_NEVER };

typedef struct cli_args {
    const char *script;                        /* positional */
    const char *params[GRAPH_SCRIPT_MAX_PARAMS];    /* --set key=value */
    int n_params;
    int cpu;             /* --cpu */
    uint64_t seed;       /* --seed */
    const char *png;     /* --png FILE */
    int png_px;          /* --px N */
    int block;           /* --block N */
    int mask_index;      /* --mask-index N */
    const char *arch;    /* --arch sm_XX */
    const char *schemes[CLI_MAX_SCHEMES]; /* --scheme S, repeated: one per layer class */
    int n_schemes;
    int reps;            /* --reps N: timed runs (median) */
    int check;           /* CLI_CHECK_AUTO, or --check / --no-check */
    int profile;         /* --profile: stof run times every segment in the pass */
    const char *sub;     /* the subcommand word of `stof plan show` */
    const char *output;  /* -o FILE */
    long budget;         /* --budget N: most settings measured (0: no limit) */
    double time_limit;   /* --time-limit S: seconds of search (0: no limit) */
    const char *script_path; /* --script PATH: the script of a plan */
    const char *weights;     /* --weights FILE.safetensors: every weight from it */
    const char *inputs;      /* --inputs FILE.safetensors: the inputs it holds from it */
    const char *save_output; /* --save-output FILE.safetensors: the output, as "output" */
    /* stof generate */
    const char *prompts[CLI_MAX_PROMPTS]; /* --prompt "1,2,3", repeated */
    int n_prompts;
    const char *prompt_file;  /* --prompt-ids FILE: a prompt a line */
    int max_new_tokens;       /* --max-new-tokens N */
    double temperature;       /* --temperature T (0: greedy) */
    int top_k;                /* --top-k K */
    double top_p;             /* --top-p P */
    int32_t stops[CLI_MAX_STOPS]; /* --stop ID, repeated */
    int n_stops;
    int ignore_eos;           /* --ignore-eos: the config's eos_token_id does not stop */
    int recompute;            /* --recompute: no KV cache, the whole pass for every token */
    double tune_step;         /* --tune-step S: the decode step tuned for S seconds first */
    /* stof tune */
    int decode_batch[CLI_MAX_DECODE]; /* --decode-batch 1,8,64: decode steps tuned too */
    int n_decode;
    int decode_context;       /* --decode-context N: their caches' positions (0: the seq) */
} cli_args;


/* Parses argv[first..]; prints the problem and returns non-zero on bad
 * arguments. */
int cli_parse(int argc, char **argv, int first, cli_args *a);

/* Builds the graph of a->script; prints the error and returns non-zero. */
int cli_load_graph(const cli_args *a, graph *g, graph_script *info);

/* 1 (and says so) when a path the command writes is a file of the model
 * directory dir (its config, its weights): a plan's folder is known only
 * once the plan is read. */
int cli_check_outputs_dir(const cli_args *a, const char *dir);

/* One line saying which mask every attention of the model uses, layer by
 * layer (runs of layers with the same one merged): "attention masks:
 * layers 0-11 bigbird{...}; layer 12 causal". */
void cli_print_masks(const graph *g);

/* "stof: warning: WHAT: FIRST (and N-1 more)" on stderr when count > 0:
 * problems a cache met that the run went on past. */
void cli_warn_cache(const char *what, int count, const char *first);

/* The values of a run: weights from --weights, else from the model directory dir (the
 * command's, or the plan's; "" for none), else drawn from --seed; inputs from --inputs.
 * cli_values_open checks the files against g (every problem at once); prints the problems
 * and returns 1. */
typedef struct cli_values {
    struct safetensors_file *weights, *inputs;
    weights_source src;
} cli_values;
int cli_values_open(const cli_args *a, const graph *g, const char *dir, cli_values *v);
void cli_values_close(cli_values *v);

int cli_cmd_info(const cli_args *a);
int cli_cmd_graph(const cli_args *a);
int cli_cmd_run(const cli_args *a);
int cli_cmd_mask(const cli_args *a);
int cli_cmd_mha_select(const cli_args *a);
int cli_cmd_tune(const cli_args *a);
int cli_cmd_plan(const cli_args *a);
int cli_cmd_generate(const cli_args *a);

/* cli_run.c: `stof run PLAN.json`. */
int cli_run_plan(const cli_args *a);
/* 1 when the argument names a plan (ends in .json). */
int cli_is_plan(const char *arg);

/* cli_plan.c: a plan for a person, on stdout. */
void cli_plan_print(const plan *p);
/* The model of plan p: its script (--script, else where the plan recorded it, beside the plan,
 * in scripts/), whose bytes must hash to the plan's, built with the plan's parameters, those
 * named in extra ("key=value") replaced, and the plan's model directory's config. Says what
 * went wrong. */
int cli_plan_build(const cli_args *a, const plan *p, const char *const *extra, int n_extra,
                   graph *g, graph_script *info);

#endif
