"""Where a decode step goes, kernel by kernel, timed by Nsight Compute.

`stof generate --profile` times a step's segments in place, with an event between them; this
script times each kernel of one step alone instead: `ncu --graph-profiling node` replays every
kernel of the step's CUDA graph by itself, caches flushed first (so the weights come from
memory, as they do in a step of a model larger than L2), and reads the bytes it took from
memory. Their sum is more than the graph's time (no overlap, no warm L2), but it says which
kernels move the weights near the memory's speed and which cost time for moving nothing.

For each model (the configs of bench/hf_generate.py, random weights): the model directory is
saved, `stof generate DIR` runs a prompt of --prompt tokens and 3 new ones under ncu, and the
last whole decode step (the kernels from an embedding launch to the next) is printed kernel by
kernel in launch order for its first --layers layers, then summed by kernel, with the time the
step's weights take at --bandwidth. (A step is told from the prefill by its decode attention
launches; the prefill runs the block attention.)

With --timeline the step is timed in place instead, as it runs: the Python package runs
the generation in this process under torch.profiler, whose CUPTI trace has each kernel of the
step's graph with its start and end. Beside each kernel's time it prints the time it added to
the step: how far its end moved past the ends of the kernels before it. Kernels that
programmatic dependent launch overlaps with the one before add only what runs past it, and a
gap before a kernel is added to it; the added times sum to the step's time.

    python3 bench/decode_kernels.py [--stof build/stof] [--models mistral-1b,gpt2] [--batch 1]
           [--prompt 128] [--layers 1] [--ncu ncu] [--out bench/out/decode_kernels.md]
    python3 bench/decode_kernels.py --csv ncu.csv [--batch 1]    # a saved ncu --csv report
    python3 bench/decode_kernels.py --timeline [--models ...] [--batch 1] [--prompt 128] [--new 6]
    python3 bench/decode_kernels.py --trace trace.json       # a saved torch.profiler trace
"""
import argparse
import collections
import csv
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stof_cli as sc  # noqa: E402
from stof_cli import log  # noqa: E402

METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum")
ATTENTION = "stof_attention_decode"  # one launch a layer


def read_report(text):
    """ncu --csv --print-units base: one dict a kernel launch, in launch order (the program's
    own output before the table is skipped)."""
    lines = text.splitlines()
    head = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if head is None:
        raise ValueError("no ncu table (a line starting with \"ID\") in the report")
    kernels = collections.OrderedDict()
    for row in csv.DictReader(lines[head:]):
        k = kernels.setdefault(row["ID"], {"name": row["Kernel Name"], "grid": row["Grid Size"]})
        k[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
    return list(kernels.values())


def last_step(kernels):
    """The kernels of the last whole decode step: the launches from an embedding launch to the
    next one that hold the decode attention (a prefill's hold the block attention instead), the
    last such run that another embedding launch closes."""
    starts = [i for i, k in enumerate(kernels) if k["name"] == "stof_embedding"]
    steps = [(a, b) for a, b in zip(starts, starts[1:])
             if any(k["name"] == ATTENTION for k in kernels[a:b])]
    if not steps:
        raise ValueError(f"fewer than two decode steps in the report ({len(starts)} embedding "
                         f"launches, none of them followed by a whole step's {ATTENTION})")
    a, b = steps[-1]
    return kernels[a:b]


def short_name(name):
    """cuBLASLt's kernels by what they are; ours by name."""
    if name.startswith("nvjet_"):  # its tile and layout in the rest of the name
        return "cuBLASLt GEMM " + name[len("nvjet_"):]
    if "splitKreduce" in name:
        return "cuBLASLt split-K reduce"
    return name.split("(")[0].split("<")[0].replace("void ", "")


def us(k):
    return k.get("gpu__time_duration.sum", 0.0) / 1e3


def mb(k):
    return k.get("dram__bytes_read.sum", 0.0) / 1e6


def gbs(megabytes, micros):
    return megabytes / micros * 1e3 if micros > 0 else 0.0


def first_layers(step, layers):
    """The step's embedding and its first `layers` layers: a layer is as many launches as lie
    between two attention launches."""
    at = [i for i, k in enumerate(step) if k["name"] == ATTENTION]
    if len(at) < 2:
        return step
    return step[:1 + layers * (at[1] - at[0])]


def kernel_sums(step, *values):
    """Per kernel (short name, in first-launch order): [launches, then the sum of each of
    `values` (a number of each launch, given the launch and its index in step)]."""
    by = collections.OrderedDict()
    for i, k in enumerate(step):
        a = by.setdefault(short_name(k["name"]), [0] + [0.0] * len(values))
        a[0] += 1
        for j, value in enumerate(values):
            a[1 + j] += value(k, i)
    return by


def weights_line(weight_mb, bandwidth, total_us, what):
    read_us = weight_mb / bandwidth * 1e3
    return ["", f"The step's weights: {weight_mb:.1f} MB, {read_us:.1f} us at {bandwidth:.0f} "
            f"GB/s; {what} {total_us / read_us:.1f}x that."]


def tables(step, layers, weight_mb, bandwidth):
    first = first_layers(step, layers)
    out = ["| # | kernel | grid | us | MB read | GB/s |", "|---|---|---|---|---|---|"]
    for i, k in enumerate(first):
        out.append(f"| {i} | {short_name(k['name'])} | {k['grid']} | {us(k):.2f} | "
                   f"{mb(k):.2f} | {gbs(mb(k), us(k)):.0f} |")
    by = kernel_sums(step, lambda k, i: us(k), lambda k, i: mb(k))
    total_us = sum(a[1] for a in by.values())
    total_mb = sum(a[2] for a in by.values())
    out += ["", "| kernel | launches | us | share | MB read | GB/s |", "|---|---|---|---|---|---|"]
    for name, (n, t, m) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        out.append(f"| {name} | {n} | {t:.1f} | {100 * t / total_us:.1f}% | {m:.1f} | "
                   f"{gbs(m, t):.0f} |")
    out.append(f"| all | {len(step)} | {total_us:.1f} | 100% | {total_mb:.1f} | "
               f"{gbs(total_mb, total_us):.0f} |")
    if weight_mb:
        out += weights_line(weight_mb, bandwidth, total_us, "the kernels alone add up to")
    return out


def read_trace(text):
    """A Chrome trace of torch.profiler: its GPU kernels as dicts of name, start and dur (us),
    in the order they started."""
    try:
        events = json.loads(text).get("traceEvents")
    except (ValueError, AttributeError) as e:
        raise ValueError(f"not a Chrome trace (JSON with traceEvents): {e}") from None
    if not isinstance(events, list):
        raise ValueError("not a Chrome trace: no list of traceEvents")
    try:
        kernels = [{"name": e["name"], "start": float(e["ts"]), "dur": float(e["dur"])}
                   for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"a kernel event without a name, a start (ts) or a duration (dur): "
                         f"{e!r}") from None
    if not kernels:
        raise ValueError("no GPU kernels in the trace (was it recorded with CUDA activity?)")
    return sorted(kernels, key=lambda k: k["start"])


def time_added(step):
    """For each kernel of a step, in start order, the microseconds its end moved the latest end
    of the kernels before it (0 for one that ends within them). They sum to the step's time
    from its first kernel's start."""
    latest = step[0]["start"]
    added = []
    for k in step:
        end = k["start"] + k["dur"]
        added.append(max(0.0, end - latest))
        latest = max(latest, end)
    return added


def timeline_tables(step, layers, weight_mb, bandwidth):
    added = time_added(step)
    wall = sum(added)
    t0 = step[0]["start"]
    first = first_layers(step, layers)
    out = ["| # | kernel | starts at (us) | us in the graph | us added to the step |",
           "|---|---|---|---|---|"]
    for i, k in enumerate(first):
        out.append(f"| {i} | {short_name(k['name'])} | {k['start'] - t0:.1f} | {k['dur']:.1f} | "
                   f"{added[i]:.1f} |")
    by = kernel_sums(step, lambda k, i: k["dur"], lambda k, i: added[i])
    out += ["", "| kernel | launches | us in the graph | us added | share of the step |",
            "|---|---|---|---|---|"]
    for name, (n, t, a) in sorted(by.items(), key=lambda kv: -kv[1][2]):
        out.append(f"| {name} | {n} | {t:.1f} | {a:.1f} | {100 * a / wall:.1f}% |")
    out.append(f"| all | {len(step)} | {sum(k['dur'] for k in step):.1f} | {wall:.1f} | 100% |")
    if weight_mb:
        out += weights_line(weight_mb, bandwidth, wall, "the step took")
    return out


def model_inputs(args, name, max_pos):
    """Model `name` saved with random weights under the work dir for max_pos positions: its
    directory, its weights' MB and the prompts' ids [batch, prompt]."""
    import hf_generate as hg
    d = os.path.join(args.work_dir, name)
    cfg, model = hg.save_model(name, max_pos, d, "cpu")
    weight_mb = hg.weight_bytes(model) / 1e6
    del model
    return d, weight_mb, sc.random_ids(cfg.vocab_size, args.batch, args.prompt, seed=5)


def trace_model(args, name, stof_bin):
    """The kernels of a generation of args.new tokens after a prompt, traced by torch.profiler
    (a first generation before it compiles the kernels and captures the step's graph), on the
    libstof.so beside stof_bin."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    stof = sc.binding(stof_bin)
    d, weight_mb, ids = model_inputs(args, name, args.prompt + args.new)
    prompts = ids.tolist()
    m = stof.Model.from_pretrained(d, batch=args.batch, seq=args.prompt + args.new)
    m.generate(prompts, max_new_tokens=args.new, use_eos=False, device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        m.generate(prompts, max_new_tokens=args.new, use_eos=False, device="cuda")
    torch.cuda.synchronize()
    path = os.path.join(args.work_dir, name + "-trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        return read_trace(f.read()), weight_mb


def step_layers(step):
    """Layers in a step: its decode-attention launches."""
    return sum(1 for k in step if k["name"] == ATTENTION)


def profile_model(args, name, stof):
    import hf_generate as hg
    d, weight_mb, ids = model_inputs(args, name, args.prompt + 8)
    prompts = os.path.join(args.work_dir, name + "-prompts.txt")
    hg.write_prompts(ids, prompts)
    out, _ = sc.run_cmd([args.ncu, "--clock-control", "none", "--graph-profiling", "node",
                         "--metrics", ",".join(METRICS), "--csv", "--print-units", "base",
                         stof, "generate", d, "--prompt-ids", prompts, "--max-new-tokens", "3",
                         "--ignore-eos"], args.timeout, os.path.join(args.work_dir, "ncu.log"))
    return read_report(out), weight_mb


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stof", default="build/stof")
    ap.add_argument("--models", default="mistral-1b,gpt2")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--layers", type=int, default=1, help="layers printed kernel by kernel")
    ap.add_argument("--bandwidth", type=float, default=4800.0, help="GB/s of the GPU's memory")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--timeout", type=int, default=600, help="seconds for one model under ncu")
    source = ap.add_mutually_exclusive_group()
    source.add_argument("--csv", help="analyse this saved report instead of running anything")
    source.add_argument("--timeline", action="store_true",
                        help="time the step in place (torch.profiler) instead of under ncu")
    source.add_argument("--trace", help="analyse this saved torch.profiler trace")
    ap.add_argument("--new", type=int, default=6,
                    help="tokens generated under --timeline (3 or more: a whole step between two)")
    ap.add_argument("--work-dir", default=os.path.join(sc.ROOT, "build", "decode_kernels"))
    ap.add_argument("--out", default=os.path.join(sc.ROOT, "bench", "out", "decode_kernels.md"))
    args = ap.parse_args()
    if args.timeline and args.new < 3:
        ap.error("--new: 3 or more (the prefill's token, then whole steps between two others)")
    lines = []
    try:
        in_place = args.timeline or args.trace
        if args.csv:
            with open(args.csv) as f:
                runs = [(os.path.basename(args.csv), read_report(f.read()), 0.0)]
            head = f"Report {args.csv}; batch {args.batch}."
        elif args.trace:
            with open(args.trace) as f:
                runs = [(os.path.basename(args.trace), read_trace(f.read()), 0.0)]
            head = f"Trace {args.trace}."
        elif args.timeline:
            stof = sc.resolve_stof(args.stof)
            os.makedirs(args.work_dir, exist_ok=True)
            runs = [(name,) + trace_model(args, name, stof) for name in args.models.split(",")]
            import torch
            head = (f"Device: {torch.cuda.get_device_name()}; date {datetime.date.today()}; stof "
                    f"commit {sc.stof_commit(stof)}; fp16, random weights; "
                    f"batch {args.batch}, a prompt of {args.prompt}; the last whole decode step "
                    f"as its CUDA graph ran, traced by torch.profiler.")
        else:
            stof = sc.resolve_stof(args.stof)
            os.makedirs(args.work_dir, exist_ok=True)
            runs = [(name,) + profile_model(args, name, stof) for name in args.models.split(",")]
            import torch
            head = (f"Device: {torch.cuda.get_device_name()}; date {datetime.date.today()}; stof "
                    f"commit {sc.stof_commit(stof)}; fp16, random weights; batch {args.batch}, "
                    f"a prompt of {args.prompt}; each kernel of the last whole decode step timed "
                    f"alone by ncu (caches flushed).")
        lines = [head]
        for name, kernels, weight_mb in runs:
            step = last_step(kernels)
            lines += ["", f"### {name}: {len(step)} kernels a step, {step_layers(step)} layers", ""]
            lines += (timeline_tables if in_place else tables)(step, args.layers, weight_mb,
                                                               args.bandwidth)
    except (ValueError, OSError, sc.CmdError) as e:
        log(f"decode_kernels: {e}")
        return 1
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
