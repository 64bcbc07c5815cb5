"""Decode speed: `stof generate` beside transformers' `generate`, in one run.

For each model (random weights, seeded, fp16; saved once as a model directory) and each batch:
prompts of --prompt random tokens, --new tokens (no end-of-sequence stop), greedy or, with
--sample T,K,P, drawn at temperature T from the top K tokens and top P of the mass (both sides
with those settings), timed as

  - transformers `generate` with its static cache (which compiles the forward by itself), after
    a warm-up call of the same shape: the time a new token costs, (t(new tokens) - t(1 token))
    / (new - 1);
  - `stof generate DIR` on the GPU: the time a decode step costs as it reports it (setup and
    the prefill pass apart; every step is one token a sequence), and the prefill pass of the
    prompts that fills the caches.

It also gives the time to read the weights once at the GPU's bandwidth (--bandwidth GB/s) and
the live KV cache (the weights bound every step's time at batch 1). Speed is a benchmark: the
table, not a pass or fail.

    python3 bench/hf_generate.py [--stof build/stof] [--models gpt2,mistral-1b] [--batches 1,8,64]
           [--prompt 128] [--new 64] [--sample 0.8,50,0.9] [--tune-step S] [--profile]
           [--skip-hf]
           [--out bench/out/hf_generate.md]
"""
import argparse
import datetime
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stof_cli as sc  # noqa: E402
from stof_cli import log  # noqa: E402
import torch_models as tm  # noqa: E402


def config(name, max_pos):
    import transformers as tr
    if name == "gpt2":  # 124M
        return tr.GPT2Config(n_positions=max(1024, max_pos)), tr.GPT2LMHeadModel
    if name == "gpt2-large":  # 774M
        return tr.GPT2Config(n_embd=1280, n_layer=36, n_head=20,
                             n_positions=max(1024, max_pos)), tr.GPT2LMHeadModel
    # Mistral-shaped 1B: 16 layers, 2048 wide, 32 query / 8 K/V heads, a window of 4096
    return tr.MistralConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                            vocab_size=32000, max_position_embeddings=max(8192, max_pos),
                            sliding_window=4096, tie_word_embeddings=False), tr.MistralForCausalLM


def weight_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def save_model(name, max_pos, d, device):
    """Model `name` with seeded random weights (moved off 0/1), fp16 on device, saved as the
    model directory d; returns (config, model)."""
    import torch
    cfg, cls = config(name, max_pos)
    torch.manual_seed(3)
    model = cls(cfg)
    tm.perturb_(model, 3)
    model = model.eval().to(device=device, dtype=torch.float16)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, safe_serialization=True)
    return cfg, model


def write_prompts(ids, path):
    """Token ids [batch, len] as `stof generate --prompt-ids` reads them: a line a prompt."""
    with open(path, "w") as f:
        for row in ids.tolist():
            f.write(",".join(map(str, row)) + "\n")


def sampling(spec):
    """--sample T,K,P as (temperature, top_k, top_p) (argparse's type: a clear error else)."""
    try:
        t, k, p = spec.split(",")
        return float(t), int(k), float(p)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{spec}': T,K,P (a temperature, a top-k and a top-p, "
                                         f"e.g. 0.8,50,0.9)") from None


def hf_token_ms(model, ids, new, sample):
    import torch
    kw = dict(do_sample=False, cache_implementation="static", pad_token_id=0,
              eos_token_id=None)
    if sample:
        kw.update(do_sample=True, temperature=sample[0], top_k=sample[1], top_p=sample[2])

    def run(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        torch.cuda.synchronize()
        return time.perf_counter() - t0
    run(new)  # warm-up: compiles for this shape
    run(1)
    one, full = run(1), run(new)
    return 1e3 * (full - one) / (new - 1)


def stof_step_ms(stof, d, ids, new, work, log_path, profile, tune_step, sample):
    path = os.path.join(work, "prompts.txt")
    write_prompts(ids, path)
    drawn = ["--temperature", str(sample[0]), "--top-k", str(sample[1]), "--top-p",
             str(sample[2]), "--seed", "3"] if sample else []
    out, _ = sc.run_cmd([stof, "generate", d, "--prompt-ids", path, "--max-new-tokens",
                         str(new), "--ignore-eos"] + drawn + (["--profile"] if profile else []) +
                        (["--tune-step", str(tune_step)] if tune_step else []),
                        900, log_path)
    m = re.search(r"the steps [0-9.]+ s: ([0-9.]+) ms a step", out)
    kv = re.search(r"KV cache ([0-9.]+) KiB", out)
    if not m:
        raise sc.CmdError("no step time in: " + out[-300:])
    prof = out[out.find("profile:"):].strip() if profile and "profile:" in out else ""
    pre = re.search(r"the prefill pass ([0-9.]+) ms", out)
    return (float(m.group(1)), float(kv.group(1)) * 1024 if kv else 0.0,
            float(pre.group(1)) if pre else None, prof)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stof", default="build/stof")
    ap.add_argument("--models", default="gpt2,mistral-1b")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--sample", type=sampling, default=None,
                    help="T,K,P: tokens drawn at temperature T, top-k K, top-p P (default: greedy)")
    ap.add_argument("--profile", action="store_true",
                    help="stof's decode step segment by segment, after the table")
    ap.add_argument("--tune-step", type=float, default=0,
                    help="seconds of tuning the decode step first (stof generate --tune-step)")
    ap.add_argument("--skip-hf", action="store_true", help="stof alone (no transformers run)")
    ap.add_argument("--bandwidth", type=float, default=4800.0, help="GB/s of the GPU's memory")
    ap.add_argument("--work-dir", default=os.path.join(sc.ROOT, "build", "hf_generate"))
    ap.add_argument("--out", default=os.path.join(sc.ROOT, "bench", "out", "hf_generate.md"))
    args = ap.parse_args()
    stof = sc.resolve_stof(args.stof)
    sample = args.sample
    import torch
    import transformers
    os.makedirs(args.work_dir, exist_ok=True)
    log_path = os.path.join(args.work_dir, "stof.log")
    rows, profiles = [], []
    for name in args.models.split(","):
        d = os.path.join(args.work_dir, name)
        cfg, model = save_model(name, args.prompt + args.new, d, "cuda")
        wb = weight_bytes(model)
        for b in map(int, args.batches.split(",")):
            ids = sc.random_ids(cfg.vocab_size, b, args.prompt, seed=5)
            row = {"model": name, "batch": b, "weights_ms": wb / (args.bandwidth * 1e6)}
            try:
                if args.skip_hf:
                    raise RuntimeError("not run (--skip-hf)")
                with torch.no_grad():
                    row["hf"] = hf_token_ms(model, ids.cuda(), args.new, sample)
            except Exception as e:  # noqa: BLE001 -- the row says why
                row["hf_note"] = str(e).splitlines()[0][:120]
            try:
                row["stof"], row["cache"], row["prefill"], prof = stof_step_ms(
                    stof, d, ids, args.new, args.work_dir, log_path, args.profile,
                    args.tune_step, sample)
                if prof:
                    profiles.append(f"{name}, batch {b}:\n```\n{prof}\n```")
            except sc.CmdError as e:
                row["stof_note"] = str(e)[:200]
            rows.append(row)
            log(f"  {name:10s} batch {b:3d}: " + ", ".join(
                f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                if k not in ("model", "batch")))
        del model
        torch.cuda.empty_cache()
    head = (f"Device: {torch.cuda.get_device_name()}; date {datetime.date.today()}; stof commit "
            f"{sc.stof_commit(stof)}; torch {torch.__version__}, transformers "
            f"{transformers.__version__}; fp16, random weights; prompts of {args.prompt} tokens, "
            f"{args.new} new tokens, "
            + (f"drawn (temperature {sample[0]:g}, top-k {sample[1]}, top-p {sample[2]:g})"
               if sample else "greedy")
            + ". transformers: `generate` with its static cache "
            f"(compiled), per new token; stof: `stof generate` on the GPU, per decode step, and "
            f"its prefill pass of the prompts"
            + (f"; the step tuned for {args.tune_step:g} s first" if args.tune_step else "")
            + f". Weights read at {args.bandwidth:.0f} GB/s.")
    lines = [head, "", "| model | batch | weights + live cache read (ms) | transformers (ms/token) | "
             "stof (ms/step) | stof / read | speedup | KV cache (MiB) | stof prefill (ms) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        hf = f"{r['hf']:.3f}" if "hf" in r else f"error: {r.get('hf_note')}"
        st = f"{r['stof']:.3f}" if "stof" in r else f"error: {r.get('stof_note')}"
        # the live cache of an average step: the prompt and half the new tokens of the
        # cache's prompt + new - 1 slots
        live = r.get("cache", 0) * (args.prompt + args.new / 2) / (args.prompt + args.new - 1)
        read_ms = r["weights_ms"] + live / (args.bandwidth * 1e6)
        ratio = f"{r['stof'] / read_ms:.1f}x" if "stof" in r else ""
        sp = f"{r['hf'] / r['stof']:.2f}x" if "hf" in r and "stof" in r else ""
        kv = f"{r.get('cache', 0) / 2**20:.1f}"
        pre = f"{r['prefill']:.2f}" if r.get("prefill") is not None else "token by token"
        lines.append(f"| {r['model']} | {r['batch']} | {read_ms:.3f} | {hf} | {st} | "
                     f"{ratio} | {sp} | {kv} | {pre} |")
    lines += [""] + profiles if profiles else []
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    log("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
