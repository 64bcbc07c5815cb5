/* `stof`: entry point, argument parsing, dispatch. */
#include "core/cli/cli.h"

#include "core/base/file.h"
#include "core/gpu/nvrtc_worker.h"
#include "core/io/model_dir.h"
#include "ops/mask.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Each command's usage, in the order `stof help` lists them. */
static const struct {
    const char *command, *text;
} helps[] = {
    {"info",
     "  stof info                          the GPU stof would use, or why there is none\n"},
    {"graph",
     "  stof graph SCRIPT|DIR [--set k=v ...]\n"
     "                                     the model's operators: index, kind, class,\n"
     "                                     shapes, FLOPs and bytes, and each layer's mask\n"},
    {"run",
     "  stof run SCRIPT|DIR [--set k=v ...] [--scheme S ...] [--reps N] [--seed N]\n"
     "           [--check | --no-check] [--profile] [VALUES]\n"
     "                                     run the model on the GPU: its segments and\n"
     "                                     kernels, memory, latency (eager and CUDA graph),\n"
     "                                     checksum, error against the CPU reference\n"
     "                                     (--check: even for big models; --no-check: skip).\n"
     "                                     --scheme: the fusion scheme of the layers, hex\n"
     "                                     (\"14:2238\") or binary, or \"default\" or\n"
     "                                     \"unfused\"; once for every layer class, or\n"
     "                                     once per class in order (T5: encoder, decoder)\n"
     "                                     --profile: each segment's time inside the\n"
     "                                     forward pass, summed over its layers\n"
     "  stof run --cpu SCRIPT|DIR [--set k=v ...] [--seed N] [VALUES]\n"
     "                                     run the fp32 CPU reference, print a checksum\n"
     "  stof run PLAN.json [--script PATH] [--reps N] [--check | --no-check]\n"
     "           [--profile] [VALUES]\n"
     "                                     run a tuned plan (no tuning) and compare its\n"
     "                                     latency with the one it recorded (--profile:\n"
     "                                     segment by segment too)\n"
     "    VALUES: --weights FILE.safetensors  every weight from a checkpoint (Hugging\n"
     "                                     Face names; fused weights from their parts;\n"
     "                                     a model directory brings its own)\n"
     "            --inputs FILE.safetensors   every input of the model and nothing else\n"
     "                                     (token ids as int32 or int64); without\n"
     "                                     --weights the weights are drawn from --seed\n"
     "            --save-output FILE.safetensors\n"
     "                                     write the output as fp32 tensor \"output\"\n"},
    {"mask",
     "  stof mask SCRIPT|DIR [--set k=v ...] [--block N] [--png FILE] [--px N] [--mask-index I]\n"
     "                                     mask statistics, and a figure of it as PNG (axes,\n"
     "                                     legend, causal drawn; --px caps its side, default:\n"
     "                                     one pixel a token up to 4096)\n"},
    {"tune",
     "  stof tune SCRIPT|DIR [--set k=v ...] -o PLAN.json [--budget N] [--time-limit S]\n"
     "            [--seed N] [--arch sm_XX] [--reps N] [--check | --no-check]\n"
     "                                     tune the fusion scheme and kernel parameters\n"
     "                                     on the GPU (two-stage search, measurements\n"
     "                                     cached in tune-cache.txt beside the kernel\n"
     "                                     cache) and write the plan. Without a GPU:\n"
     "                                     an unmeasured plan of the initial scheme for\n"
     "                                     --arch (default sm_90), kernels precompiled\n"
     "            [--decode-batch 1,8,64 [--decode-context N]]\n"
     "                                     a decoder's decode steps too, one token a\n"
     "                                     sequence for each batch, caches of N positions\n"
     "                                     (default: the model's seq); the plan holds them\n"
     "                                     and stof generate PLAN.json runs them\n"},
    {"plan",
     "  stof plan show PLAN.json           a plan for a person: device, script, schemes,\n"
     "                                     segments, kernels, times, search statistics\n"},
    {"mha-select",
     "  stof mha-select SCRIPT|DIR [--set k=v ...] [--arch sm_XX]\n"
     "                                     the attention kernel the analytical model picks\n"
     "                                     (paper Eq. 1, 2) and its score table\n"},
    {"generate",
     "  stof generate [--cpu] SCRIPT|DIR|PLAN.json [--set k=v ...] (--prompt \"1,2,3\" ... |\n"
     "           --prompt-ids FILE) [--max-new-tokens N] [--temperature T] [--top-k K]\n"
     "           [--top-p P] [--seed N] [--stop ID ...] [--ignore-eos] [--recompute]\n"
     "           [--weights FILE] [--tune-step S] [--profile [--reps N]]\n"
     "                                     generate text token ids with a decoder (its\n"
     "                                     language-modelling head): the prompts' prefill,\n"
     "                                     then a decode step a token against a KV cache\n"
     "                                     sized by each layer's mask. Greedy by default;\n"
     "                                     --temperature > 0 samples (top-k, top-p) from\n"
     "                                     --seed, reproducibly. Stops at --stop tokens and\n"
     "                                     the config's eos_token_id (--ignore-eos: not).\n"
     "                                     --prompt-ids: a prompt a line, ids separated by\n"
     "                                     commas or spaces. --recompute: no cache, the\n"
     "                                     whole pass again for every token (the ground\n"
     "                                     truth, --cpu only). On the GPU (fp16, bf16) a\n"
     "                                     prefill pass fills the caches; --cpu: the fp32\n"
     "                                     CPU reference. --tune-step S: the decode step\n"
     "                                     tuned first (S seconds of search; measurements\n"
     "                                     cached as stof tune's). --profile: the GPU's\n"
     "                                     decode step timed, segment by segment.\n"
     "                                     PLAN.json: the model of a plan of stof tune\n"
     "                                     --decode-batch, its tuned decode step for the\n"
     "                                     prompts' batch (the default step when it holds\n"
     "                                     none for it, or for so long a context)\n"},
    {"version", "  stof version                       stof's version and commit\n"},
};
#define N_HELPS ((int)(sizeof helps / sizeof helps[0]))

static const char *usage_footer =
    "\n"
    "SCRIPT is a Lua model script (see scripts/ and docs/lua-api.md); --set passes\n"
    "its parameters, e.g. stof graph scripts/bert.lua --set preset=base --set seq=1024.\n"
    "DIR is a Hugging Face model directory (config.json and safetensors weights).\n"
    "stof help COMMAND, or stof COMMAND --help, shows one command's usage.\n";

static void usage(FILE *f) {
    fprintf(f, "stof %s - sparse transformers, fused and tuned for NVIDIA GPUs\n\nusage:\n",
            STOF_VERSION_STRING);
    for (int k = 0; k < N_HELPS; k++)
        fputs(helps[k].text, f);
    fputs(usage_footer, f);
}

/* One command's usage; 1 when there is no such command. */
static int command_usage(const char *command, FILE *f) {
    for (int k = 0; k < N_HELPS; k++)
        if (strcmp(helps[k].command, command) == 0) {
            fprintf(f, "usage:\n%s", helps[k].text);
            return 0;
        }
    return 1;
}

static int parse_int(const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "stof: %s expects an integer in [%ld, %ld], got '%s'\n", opt, lo, hi, s);
        return 1;
    }
    *out = v;
    return 0;
}

/* Options that take a value: returns the value or NULL (message printed). */
static const char *option_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "stof: %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

static const char *const option_names[] = {
    "--cpu",    "--set",    "--seed",   "--png",     "--px",     "--block",       "--mask-index",
    "--arch",   "--scheme", "--reps",   "--check",   "--no-check", "-o",          "--output",
    "--budget", "--time-limit", "--script", "--weights", "--inputs", "--save-output",
    "--profile", "--prompt", "--prompt-ids", "--max-new-tokens", "--temperature", "--top-k",
    "--top-p", "--stop", "--ignore-eos", "--recompute", "--tune-step", "--decode-batch",
    "--decode-context"};
#define N_OPTIONS ((int)(sizeof option_names / sizeof option_names[0]))

/* The index of opt in option_names (-o and --output, --check and --no-check
 * count as one), or -1. */
static int option_index(const char *opt) {
    for (int i = 0; i < N_OPTIONS; i++)
        if (strcmp(opt, option_names[i]) == 0) {
            if (strcmp(opt, "--output") == 0 || strcmp(opt, "--no-check") == 0)
                return i - 1;
            return i;
        }
    return -1;
}

/* Options that may be given many times; the others only once, since a
 * second --weights would silently win over the first. */
static int option_repeats(const char *opt) {
    return strcmp(opt, "--set") == 0 || strcmp(opt, "--scheme") == 0 ||
           strcmp(opt, "--prompt") == 0 || strcmp(opt, "--stop") == 0;
}

static int parse_double(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= lo && v <= hi)) {
        fprintf(stderr, "stof: %s expects a number in [%g, %g], got '%s'\n", opt, lo, hi, s);
        return 1;
    }
    *out = v;
    return 0;
}

/* A number of seconds above 0 (and at most 1e7) into *out. */
static int parse_seconds(const char *opt, const char *v, double *out) {
    char *end;
    errno = 0;
    double s = strtod(v, &end);
    if (errno || *end || end == v || !(s > 0) || s > 1e7) {
        fprintf(stderr, "stof: %s expects seconds above 0, got '%s'\n", opt, v);
        return 1;
    }
    *out = s;
    return 0;
}

/* --decode-batch "1,8,64": distinct batches of 1 to 65536, at most CLI_MAX_DECODE. */
static int parse_decode_batches(const char *opt, const char *v, cli_args *a) {
    const char *s = v;
    if (!*v) {
        fprintf(stderr, "stof: %s expects batch sizes (\"1,8,64\"), got nothing\n", opt);
        return 1;
    }
    while (*s) {
        char *end = (char *)s;
        errno = 0;
        long n = *s >= '0' && *s <= '9' ? strtol(s, &end, 10) : 0; /* no sign, no space */
        if (errno || n < 1 || n > 65536 || (*end && *end != ',')) {
            fprintf(stderr, "stof: %s expects batch sizes from 1 to 65536 separated by commas "
                    "(\"1,8,64\"), got '%s'\n", opt, v);
            return 1;
        }
        for (int k = 0; k < a->n_decode; k++)
            if (a->decode_batch[k] == n) {
                fprintf(stderr, "stof: %s names batch %ld twice\n", opt, n);
                return 1;
            }
        if (a->n_decode == CLI_MAX_DECODE) {
            fprintf(stderr, "stof: %s: at most %d batch sizes\n", opt, CLI_MAX_DECODE);
            return 1;
        }
        a->decode_batch[a->n_decode++] = (int)n;
        s = *end ? end + 1 : end;
        if (*end && !*s) {
            fprintf(stderr, "stof: %s ends with a comma: '%s'\n", opt, v);
            return 1;
        }
    }
    return 0;
}

static int is_generate_option(const char *opt) {
    static const char *const names[] = {"--prompt", "--prompt-ids", "--max-new-tokens",
                                        "--temperature", "--top-k", "--top-p", "--stop"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (strcmp(opt, names[k]) == 0)
            return 1;
    return 0;
}

/* The options of stof generate that take a value. */
static int parse_generate_option(const char *opt, const char *v, cli_args *a) {
    long n;
    if (strcmp(opt, "--prompt") == 0) {
        if (a->n_prompts == CLI_MAX_PROMPTS) {
            fprintf(stderr, "stof: at most %d --prompt options (--prompt-ids FILE takes "
                    "more)\n", CLI_MAX_PROMPTS);
            return 1;
        }
        a->prompts[a->n_prompts++] = v;
    } else if (strcmp(opt, "--prompt-ids") == 0) {
        a->prompt_file = v;
    } else if (strcmp(opt, "--max-new-tokens") == 0) {
        if (parse_int(opt, v, 1, 1 << 20, &n))
            return 1;
        a->max_new_tokens = (int)n;
    } else if (strcmp(opt, "--temperature") == 0) {
        return parse_double(opt, v, 0.0, 1e4, &a->temperature);
    } else if (strcmp(opt, "--top-k") == 0) {
        if (parse_int(opt, v, 0, 1L << 30, &n))
            return 1;
        a->top_k = (int)n;
    } else if (strcmp(opt, "--top-p") == 0) {
        if (parse_double(opt, v, 1e-9, 1.0, &a->top_p))
            return 1;
    } else {
        if (a->n_stops == CLI_MAX_STOPS) {
            fprintf(stderr, "stof: at most %d --stop tokens\n", CLI_MAX_STOPS);
            return 1;
        }
        if (parse_int(opt, v, 0, INT32_MAX, &n))
            return 1;
        a->stops[a->n_stops++] = (int32_t)n;
    }
    return 0;
}

static int parse_option(int argc, char **argv, int *i, cli_args *a, unsigned char *seen) {
    const char *opt = argv[*i];
    int k = option_index(opt);
    if (k < 0) {
        fprintf(stderr, "stof: unknown option '%s' (try stof help)\n", opt);
        return 1;
    }
    if (seen[k]++ && !option_repeats(opt)) {
        fprintf(stderr, "stof: %s given twice (it takes one value)\n", opt);
        return 1;
    }
    if (strcmp(opt, "--cpu") == 0) {
        a->cpu = 1;
        return 0;
    }
    if (strcmp(opt, "--profile") == 0) {
        a->profile = 1;
        return 0;
    }
    if (strcmp(opt, "--ignore-eos") == 0 || strcmp(opt, "--recompute") == 0) {
        *(opt[2] == 'i' ? &a->ignore_eos : &a->recompute) = 1;
        return 0;
    }
    if (strcmp(opt, "--check") == 0 || strcmp(opt, "--no-check") == 0) {
        a->check = opt[2] == 'c' ? CLI_CHECK_ALWAYS : CLI_CHECK_NEVER;
        return 0;
    }
    const char *v = option_value(argc, argv, i);
    if (!v)
        return 1;
    long n;
    if (strcmp(opt, "--set") == 0) {
        if (!strchr(v, '=')) {
            fprintf(stderr, "stof: --set expects key=value, got '%s'\n", v);
            return 1;
        }
        if (a->n_params == GRAPH_SCRIPT_MAX_PARAMS) {
            fprintf(stderr, "stof: at most %d --set parameters\n", GRAPH_SCRIPT_MAX_PARAMS);
            return 1;
        }
        a->params[a->n_params++] = v;
    } else if (strcmp(opt, "--seed") == 0) {
        char *end;
        errno = 0;
        a->seed = strtoull(v, &end, 10);
        /* strtoull reads "-1" as 2^64 - 1: a sign is refused before it */
        if (errno || *end || end == v || v[0] == '-' || v[0] == '+') {
            fprintf(stderr, "stof: --seed expects a non-negative integer, got '%s'\n", v);
            return 1;
        }
    } else if (strcmp(opt, "--scheme") == 0) {
        if (a->n_schemes == CLI_MAX_SCHEMES) {
            fprintf(stderr, "stof: at most %d --scheme options\n", CLI_MAX_SCHEMES);
            return 1;
        }
        a->schemes[a->n_schemes++] = v;
    } else if (strcmp(opt, "--reps") == 0) {
        if (parse_int(opt, v, 1, 100000, &n))
            return 1;
        a->reps = (int)n;
    } else if (strcmp(opt, "--png") == 0) {
        a->png = v;
    } else if (strcmp(opt, "--px") == 0) {
        if (parse_int(opt, v, 16, 8192, &n))
            return 1;
        a->png_px = (int)n;
    } else if (strcmp(opt, "--block") == 0) {
        if (parse_int(opt, v, 1, 4096, &n))
            return 1;
        a->block = (int)n;
    } else if (strcmp(opt, "--mask-index") == 0) {
        if (parse_int(opt, v, 0, 1 << 20, &n))
            return 1;
        a->mask_index = (int)n;
    } else if (strcmp(opt, "-o") == 0 || strcmp(opt, "--output") == 0) {
        a->output = v;
    } else if (strcmp(opt, "--script") == 0) {
        a->script_path = v;
    } else if (strcmp(opt, "--weights") == 0) {
        a->weights = v;
    } else if (strcmp(opt, "--inputs") == 0) {
        a->inputs = v;
    } else if (strcmp(opt, "--save-output") == 0) {
        a->save_output = v;
    } else if (strcmp(opt, "--budget") == 0) {
        if (parse_int(opt, v, 1, 1L << 40, &n))
            return 1;
        a->budget = n;
    } else if (strcmp(opt, "--tune-step") == 0 || strcmp(opt, "--time-limit") == 0) {
        return parse_seconds(opt, v, opt[2] == 't' && opt[3] == 'u' ? &a->tune_step
                                                                    : &a->time_limit);
    } else if (strcmp(opt, "--decode-batch") == 0) {
        return parse_decode_batches(opt, v, a);
    } else if (strcmp(opt, "--decode-context") == 0) {
        if (parse_int(opt, v, 1, INT32_MAX, &n))
            return 1;
        a->decode_context = (int)n;
    } else if (is_generate_option(opt)) {
        return parse_generate_option(opt, v, a);
    } else {
        a->arch = v;
    }
    return 0;
}

/* The paths the command writes (--save-output, -o, --png), NULL where not given. */
static void output_paths(const cli_args *a, const char *out[3][2]) {
    out[0][0] = "--save-output", out[0][1] = a->save_output;
    out[1][0] = "-o", out[1][1] = a->output;
    out[2][0] = "--png", out[2][1] = a->png;
}

/* 1 (and says so) when output path `out` is the file `in` (named for messages). */
static int writes_over(const char *opt, const char *out, const char *in, const char *what) {
    if (!out || !in || (strcmp(out, in) != 0 && !file_same(out, in)))
        return 0;
    fprintf(stderr, "stof: %s %s is the file of %s: stof does not write over what it reads\n",
            opt, out, what);
    return 1;
}

int cli_check_outputs_dir(const cli_args *a, const char *dir) {
    model_dir md;
    stof_error err = {0};
    if (!dir || !dir[0] || model_dir_open(dir, &md, &err))
        return 0; /* nothing to protect, or the run says what is wrong with it */
    char config[2048];
    snprintf(config, sizeof config, "%s/%s", dir, MODEL_DIR_CONFIG);
    const char *out[3][2];
    output_paths(a, out);
    int bad = 0;
    for (int o = 0; o < 3 && !bad; o++) {
        bad = writes_over(out[o][0], out[o][1], config, "the model directory's config") ||
              writes_over(out[o][0], out[o][1], md.weights_label, "the model directory");
        for (int k = 0; k < md.n_shards && !bad; k++)
            bad = writes_over(out[o][0], out[o][1], md.shards[k], "the model directory");
    }
    model_dir_free(&md);
    return bad;
}

/* No file the command writes is one it reads: --save-output naming the
 * --weights file (or a model directory's) would overwrite the checkpoint
 * with the output. */
static int check_outputs(const cli_args *a) {
    const char *out[3][2];
    output_paths(a, out);
    const char *ins[][2] = {{"the model", a->script}, {"--script", a->script_path},
                            {"--weights", a->weights}, {"--inputs", a->inputs}};
    for (size_t o = 0; o < 3; o++)
        for (size_t k = 0; k < sizeof ins / sizeof ins[0]; k++)
            if (writes_over(out[o][0], out[o][1], ins[k][1], ins[k][0]))
                return 1;
    return a->script && model_dir_detect(a->script) ? cli_check_outputs_dir(a, a->script) : 0;
}

int cli_parse(int argc, char **argv, int first, cli_args *a) {
    memset(a, 0, sizeof *a);
    a->seed = 1;
    a->png_px = 0; /* automatic: one pixel a token up to 4096 */
    a->block = 64;
    a->reps = 20;
    a->max_new_tokens = 32;
    a->top_p = 1.0;
    unsigned char seen[N_OPTIONS] = {0};
    for (int i = first; i < argc; i++) {
        if (strncmp(argv[i], "--", 2) == 0 || strcmp(argv[i], "-o") == 0) {
            if (parse_option(argc, argv, &i, a, seen))
                return 1;
        } else if (!a->script) {
            a->script = argv[i];
        } else {
            fprintf(stderr, "stof: unexpected argument '%s'\n", argv[i]);
            return 1;
        }
    }
    return check_outputs(a);
}

/* A Hugging Face model directory: its config to the script for its
 * model_type (or --script), which builds the graph. */
static int load_model_dir(const cli_args *a, graph *g, graph_script *info) {
    stof_error err = {0};
    if (lua_api_build_dir(a->script, a->script_path, a->params, a->n_params, g, info, &err)) {
        fprintf(stderr, "stof: %s\n", err.msg);
        return 1;
    }
    return 0;
}

int cli_load_graph(const cli_args *a, graph *g, graph_script *info) {
    if (!a->script) {
        fprintf(stderr, "stof: a model script is needed (e.g. scripts/bert.lua)\n");
        return 1;
    }
    graph_init(g);
    if (model_dir_detect(a->script))
        return load_model_dir(a, g, info);
    stof_error err = {0};
    int rc = lua_api_build(a->script, a->params, a->n_params, g, info, &err);
    if (rc) {
        fprintf(stderr, "stof: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* What attention op `op` attends: its mask's description, causal, or dense; and its global
 * tokens' input. */
static void attention_label(const graph *g, const graph_op *op, char *buf, size_t cap) {
    const op_attention *at = &op->attr.attn;
    const char *desc = at->mask >= 0 && g->masks[at->mask]->desc ? g->masks[at->mask]->desc : "";
    const int gk = at->global_keys;
    const char *global = gk ? " + global tokens (" : "", *close = gk ? ")" : "";
    const char *global_from = gk ? g->tensors[op->inputs[op_attention_global_input(at)]].name : "";
    if (at->mask >= 0)
        snprintf(buf, cap, "%s%s%s%s%s", at->causal ? "causal AND " : "",
                 desc[0] ? desc : "a mask", global, global_from, close);
    else
        snprintf(buf, cap, "%s%s%s%s", at->causal ? "causal" : "dense", global, global_from,
                 close);
}

/* Appends "; layers A-B LABEL" (or "layer A LABEL") to line. */
static void add_run(char *line, size_t cap, size_t *used, int first, int last,
                    const char *label) {
    char range[48];
    if (first == last)
        snprintf(range, sizeof range, "layer %d", first);
    else
        snprintf(range, sizeof range, "layers %d-%d", first, last);
    if (*used < cap)
        *used += (size_t)snprintf(line + *used, cap - *used, "%s%s %s", *used ? "; " : "", range,
                                  label);
}

/* What the attention ops of layer `layer` attend, in order ("bigbird", or
 * "causal, cross dense" for a decoder layer); "" when it has none. */
static void layer_label(const graph *g, int layer, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < g->n_ops && used < cap; i++) {
        const graph_op *op = &g->ops[i];
        if (op->kind != OP_ATTENTION || op->layer != layer)
            continue;
        char one[256];
        attention_label(g, op, one, sizeof one);
        used += (size_t)snprintf(buf + used, cap - used, "%s%s%s", used ? ", " : "",
                                 op->attr.attn.cross ? "cross " : "", one);
    }
}

void cli_print_masks(const graph *g) {
    char line[2048] = "", cur[512] = "", label[512];
    size_t used = 0;
    int first = -1;
    for (int layer = 0; layer <= g->n_layers; layer++) {
        if (layer < g->n_layers)
            layer_label(g, layer, label, sizeof label);
        if (first >= 0 && (layer == g->n_layers || strcmp(label, cur) != 0)) {
            add_run(line, sizeof line, &used, first, layer - 1, cur[0] ? cur : "no attention");
            first = -1;
        }
        if (first < 0 && layer < g->n_layers) {
            first = layer;
            snprintf(cur, sizeof cur, "%s", label);
        }
    }
    layer_label(g, -1, label, sizeof label);
    if (used || label[0])
        printf("attention masks: %s%s%s\n", line, label[0] && used ? "; outside layers " : "",
               label[0] ? label : "");
}

void cli_warn_cache(const char *what, int count, const char *first) {
    if (count <= 0)
        return;
    fprintf(stderr, "stof: warning: %s: %s", what, first);
    if (count > 1)
        fprintf(stderr, " (and %d more)", count - 1);
    fputc('\n', stderr);
}

typedef struct cli_command {
    const char *name;
    int (*run)(const cli_args *a);
    int has_sub; /* a subcommand word follows the command: `stof plan show` */
} cli_command;

static const cli_command commands[] = {
    {"info", cli_cmd_info, 0},
    {"graph", cli_cmd_graph, 0},
    {"run", cli_cmd_run, 0},
    {"tune", cli_cmd_tune, 0},
    {"plan", cli_cmd_plan, 1},
    {"mask", cli_cmd_mask, 0},
    {"mha-select", cli_cmd_mha_select, 0},
    {"generate", cli_cmd_generate, 0},
};

int main(int argc, char **argv) {
    /* a compile worker started by this program (core/gpu/nvrtc_worker.h) */
    if (argc == 2 && strcmp(argv[1], NVRTC_WORKER_ARG) == 0)
        return nvrtc_worker_main(0);
    nvrtc_workers_enable("/proc/self/exe");
    if (argc >= 3 && strcmp(argv[1], "help") == 0) {
        if (!command_usage(argv[2], stdout))
            return 0;
        fprintf(stderr, "stof: no command '%s' (stof help lists them)\n", argv[2]);
        return 2;
    }
    if (argc < 2 || strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (int k = 2; k < argc; k++) /* stof COMMAND --help */
        if ((strcmp(argv[k], "--help") == 0 || strcmp(argv[k], "-h") == 0) &&
            !command_usage(argv[1], stdout))
            return 0;
    if (strcmp(argv[1], "version") == 0 || strcmp(argv[1], "--version") == 0) {
        printf("stof %s (commit %s)\n", stof_version(), stof_build_commit());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name) == 0) {
            cli_args a;
            int sub = commands[i].has_sub && argc > 2 && argv[2][0] != '-';
            if (cli_parse(argc, argv, 2 + sub, &a))
                return 2;
            a.sub = sub ? argv[2] : NULL;
            return commands[i].run(&a);
        }
    }
    fprintf(stderr, "stof: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
