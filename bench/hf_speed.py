"""Speed of Hugging Face model directories: stof beside transformers, in one run.

For each model (ModernBERT-base's config, random weights, seeded) and each (batch, seq): saves the
model directory once (safetensors, fp16), then times

  - transformers eager (SDPA attention), fp16;
  - torch.compile of the same module, default mode and reduce-overhead (CUDA graphs);
  - `stof run DIR` (the default scheme) and `stof tune DIR` + `stof run plan.json` (the tuned
    plan), both replayed as one CUDA graph, fp16, as `stof run` reports it;

and checks stof's tuned output against transformers' eager output on the same ids (relative
error, a sanity check: bench/hf_dirs.py is the parity test). The table gives each in ms and the
tuned plan's speedup over the best of transformers. With --padded, the same tuned plan also
runs two padded batches (an attention_mask in the inputs): lengths drawn from 25-100% of seq
(`random`, seeded) and lengths at the batch's quantiles of that range (`quantiles`, what the
draw averages). Each runs padding-free (the default) and with STOF_PACK=0 (the padded pass):
their times, their ratios to the full batch, beside transformers eager on that batch. With
--draws N, N more seeded draws (the first row whole, as in `random`) run padding-free: their
mean token fraction and mean, lowest and highest ratio to the full batch.

    python3 bench/hf_speed.py [--stof build/stof] [--shapes 8x512,16x2048,4x8192]
           [--tune-time 60] [--variants eager,compile,compile-ro] [--out bench/out/hf_speed.md]
"""
import argparse
import datetime
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stof_cli as sc  # noqa: E402
from stof_cli import log  # noqa: E402

# the models by name: the architecture whose base sizes they have (torch_models.base_config)
MODELS = {"modernbert-base": "modernbert", "bert-base": "bert", "longformer-base": "longformer"}


def build(name, max_seq, work):
    import torch
    import torch_models as tm
    cfg, cls = tm.base_config(MODELS[name], max_seq)
    # SDPA where transformers has it (Longformer has its own attention only)
    cfg._attn_implementation = "eager" if name.startswith("longformer") else "sdpa"
    torch.manual_seed(0)
    model = cls(cfg)
    tm.perturb_(model, 0)
    model = model.eval().to(device="cuda", dtype=torch.float16)
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, safe_serialization=True)
    return model, cfg, d


def torch_ms(model, ids, variant, args, **inputs):
    import torch
    torch._dynamo.reset()

    def eager():
        return model(input_ids=ids, **inputs).last_hidden_state

    fn = eager
    if variant == "compile":
        fn = torch.compile(eager)
    elif variant == "compile-ro":
        compiled = torch.compile(eager, mode="reduce-overhead")

        def fn():
            torch.compiler.cudagraph_mark_step_begin()
            return compiled()
    t0 = time.time()
    with torch.no_grad():
        out = fn().clone()
        torch.cuda.synchronize()
        first = time.time() - t0
        ms = sc.time_ms(fn, 3, args.reps)
    return ms, first, out


def global_mask(args, name, batch, seq):
    """Longformer's global tokens (--global-tokens), given to both sides, or None."""
    if not (args.global_tokens and name.startswith("longformer")):
        return None
    return sc.global_tokens(batch, seq, args.global_tokens, seed=13)


def run_shape(args, stof, name, model, cfg, d, batch, seq, rows):
    import torch
    row = {"model": name, "batch": batch, "seq": seq}
    ids = sc.random_ids(cfg.vocab_size - 3, batch, seq, seed=5) + 3
    ids_path = os.path.join(args.work_dir, f"{name}-{batch}x{seq}-ids.safetensors")
    gm = global_mask(args, name, batch, seq)
    sc.save_inputs(ids_path, ids, global_attention_mask=gm)
    kw = {} if gm is None else {"global_attention_mask": gm.cuda()}
    ref = None
    for v in args.variants.split(","):
        try:
            ms, first, out = torch_ms(model, ids.cuda(), v, args, **kw)
            row[v] = ms
            row[v + "_first_s"] = first
            ref = out if v == "eager" else ref
            log(f"  {name} ({batch}, {seq}) {v:12s} {ms:8.3f} ms (first call {first:.1f} s)")
        except Exception as e:  # a variant that fails is a cell, not the end of the run
            row[v] = None
            log(f"  {name} ({batch}, {seq}) {v}: ERROR {str(e).splitlines()[0][:200]}")
        torch.cuda.empty_cache()
    sets = ["--set", f"batch={batch}", "--set", f"seq={seq}", "--set", "dtype=fp16"]
    for extra in args.stof_set:
        sets += ["--set", extra]
    log_path = os.path.join(args.work_dir, "stof.log")
    try:
        r = sc.stof_run(stof, d, sets + sc.io_args(inputs=ids_path), args.reps, 600, log_path)
        row["stof-default"] = r["graph_ms"]
        log(f"  {name} ({batch}, {seq}) stof default {r['graph_ms']:8.3f} ms")
        plan = os.path.join(args.work_dir, f"{name}-{batch}x{seq}-plan.json")
        t = sc.stof_tune(stof, d, sets, plan, args.tune_time, 900, log_path)
        row["tune_s"] = t["tune_wall_s"]
        out = os.path.join(args.work_dir, f"{name}-{batch}x{seq}-out.safetensors")
        r = sc.stof_run(stof, plan, sc.io_args(inputs=ids_path, save_output=out), args.reps, 600,
                        log_path)
        row["stof-tuned"] = r["graph_ms"]
        if ref is not None:
            got = sc.load_output(out).float().cpu()
            want = ref.float().cpu()
            row["rel"] = float((got - want).norm() / want.norm())
        log(f"  {name} ({batch}, {seq}) stof tuned   {r['graph_ms']:8.3f} ms "
            f"(tuned in {t['tune_wall_s']:.0f} s, rel {row.get('rel', float('nan')):.1e})")
        if args.padded:
            for draw in ("random", "quantiles"):
                padded_run(stof, plan, model, ids, gm, cfg, name, batch, seq, draw, row, args,
                           log_path)
            if args.draws:
                draws_run(stof, plan, ids, gm, cfg, name, batch, seq, row, args, log_path)
    except sc.CmdError as e:
        row["note"] = str(e).splitlines()[0][:200]
        log(f"  {name} ({batch}, {seq}) stof: ERROR {row['note']}")
    rows.append(row)


def padded_run(stof, plan, model, ids, gm, cfg, name, batch, seq, draw, row, args, log_path):
    """The tuned plan on a padded batch: lengths drawn from 25-100% of seq (`random`, seeded)
    or at the batch's quantiles of that range (`quantiles`: what the draw averages), the
    padding-free pass and the padded pass (STOF_PACK=0), beside transformers eager."""
    import torch
    if draw == "random":
        pad_ids, mask, lengths = sc.padded_batch(ids, cfg.pad_token_id or 0, seed=9)
    else:
        q = (torch.arange(batch, dtype=torch.float64) + 0.5) / batch
        lengths = (seq * (0.25 + 0.75 * q)).round().long()
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        pad_ids = torch.where(mask.bool(), ids, torch.full_like(ids, cfg.pad_token_id or 0))
    pad_path = os.path.join(args.work_dir, f"{name}-{batch}x{seq}-padded-{draw}.safetensors")
    sc.save_inputs(pad_path, pad_ids, attention_mask=mask, global_attention_mask=gm)
    kw = {} if gm is None else {"global_attention_mask": gm.cuda()}
    key = f"-{draw}"
    row["stof-padded" + key] = sc.stof_run(stof, plan, sc.io_args(inputs=pad_path), args.reps,
                                           600, log_path)["graph_ms"]
    os.environ["STOF_PACK"] = "0"
    try:
        row["stof-unpacked" + key] = sc.stof_run(stof, plan, sc.io_args(inputs=pad_path),
                                                 args.reps, 600, log_path)["graph_ms"]
    finally:
        del os.environ["STOF_PACK"]
    row["tokens" + key] = float(lengths.sum()) / (batch * seq)
    with torch.no_grad():
        am = mask.cuda()
        row["eager-padded" + key] = sc.time_ms(
            lambda: model(input_ids=pad_ids.cuda(), attention_mask=am, **kw).last_hidden_state,
            3, args.reps)
    full = row["stof-tuned"]
    log(f"  {name} ({batch}, {seq}) padded, {draw} lengths ({row['tokens' + key]:.0%} tokens): "
        f"stof {row['stof-padded' + key]:.3f} ms ({row['stof-padded' + key] / full:.2f}x the "
        f"full batch; padded pass {row['stof-unpacked' + key]:.3f} ms, "
        f"{row['stof-unpacked' + key] / full:.2f}x), transformers eager "
        f"{row['eager-padded' + key]:.3f} ms")


def draws_run(stof, plan, ids, gm, cfg, name, batch, seq, row, args, log_path):
    """args.draws seeded draws of lengths in 25-100% of seq, padding-free: the mean token
    fraction and the mean, lowest and highest time against the full batch."""
    tokens, ratios = [], []
    for d in range(args.draws):
        pad_ids, mask, lengths = sc.padded_batch(ids, cfg.pad_token_id or 0, seed=100 + d)
        path = os.path.join(args.work_dir, f"{name}-{batch}x{seq}-draw{d}.safetensors")
        sc.save_inputs(path, pad_ids, attention_mask=mask, global_attention_mask=gm)
        ms = sc.stof_run(stof, plan, sc.io_args(inputs=path), args.reps, 600, log_path)["graph_ms"]
        tokens.append(float(lengths.sum()) / (batch * seq))
        ratios.append(ms / row["stof-tuned"])
    row["draws"] = (sum(tokens) / len(tokens), sum(ratios) / len(ratios), min(ratios),
                    max(ratios))
    log(f"  {name} ({batch}, {seq}) padded, {args.draws} more draws: {row['draws'][0]:.0%} tokens "
        f"on average, {row['draws'][1]:.2f}x the full batch on average "
        f"({row['draws'][2]:.2f}-{row['draws'][3]:.2f})")


def fmt(v):
    return f"{v:.3f}" if isinstance(v, float) else "-"


def report(rows, args, stof):
    import torch
    import transformers
    variants = args.variants.split(",")
    head = (f"Device: {torch.cuda.get_device_name()}; date {datetime.date.today()}; stof commit "
            f"{sc.stof_commit(stof)}; torch {torch.__version__}, transformers "
            f"{transformers.__version__}; fp16, random weights, transformers with SDPA (Longformer: "
            f"its own attention, no SDPA there); "
            f"median of {args.reps} runs, ms; stof tuned for {args.tune_time:g} s a shape"
            + (f"; Longformer with {args.global_tokens} global tokens a sequence"
               if args.global_tokens else "")
            + (f"; stof with --set {', --set '.join(args.stof_set)}" if args.stof_set else "")
            + ".")
    pad = [f"{w} {d}" for d in ("random", "quantiles")
           for w in ("stof padded", "padded / full", "padded pass / full", "eager padded")
           ] if args.padded else []
    if args.draws:
        pad.append(f"{args.draws} draws: tokens, padded / full mean (range)")
    lines = [head, "", "| model | (batch, seq) | " + " | ".join(variants) +
             " | stof default | stof tuned | tuned vs best torch | rel error | " +
             "".join(p + " | " for p in pad),
             "|---|---|" + "---|" * (len(variants) + 4 + len(pad))]
    for r in rows:
        best = min([r[v] for v in variants if r.get(v)] or [0]) or None
        tuned = r.get("stof-tuned")
        speedup = f"{best / tuned:.2f}x" if best and tuned else "-"
        rel = f"{r['rel']:.1e}" if "rel" in r else r.get("note", "-")
        cells = ""
        for d in ("-random", "-quantiles") if args.padded else ():
            sp, su = r.get("stof-padded" + d), r.get("stof-unpacked" + d)
            ratio = f"{sp / tuned:.2f} ({r['tokens' + d]:.0%} tokens)" if sp and tuned else "-"
            unpacked = f"{su / tuned:.2f}" if su and tuned else "-"
            cells += f" {fmt(sp)} | {ratio} | {unpacked} | {fmt(r.get('eager-padded' + d))} |"
        if args.draws:
            dr = r.get("draws")
            cells += (f" {dr[0]:.0%}, {dr[1]:.2f} ({dr[2]:.2f}-{dr[3]:.2f}) |" if dr else " - |")
        lines.append(f"| {r['model']} | ({r['batch']}, {r['seq']}) | " +
                     " | ".join(fmt(r.get(v)) for v in variants) +
                     f" | {fmt(r.get('stof-default'))} | {fmt(tuned)} | {speedup} | {rel} |" +
                     cells)
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stof", default="build/stof")
    ap.add_argument("--models", default="modernbert-base")
    ap.add_argument("--shapes", default="8x512,16x2048,4x8192")
    ap.add_argument("--variants", default="eager,compile,compile-ro")
    ap.add_argument("--tune-time", type=float, default=60)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--padded", action="store_true",
                    help="also a padded batch through the same tuned plan")
    ap.add_argument("--draws", type=int, default=0,
                    help="with --padded: this many more seeded draws, padding-free only")
    ap.add_argument("--global-tokens", type=int, default=0,
                    help="Longformer: this many global tokens a sequence, given to both")
    ap.add_argument("--stof-set", action="append", default=[],
                    help="a further --set for stof's runs and tuning (e.g. global=false)")
    ap.add_argument("--out", default=os.path.join(sc.ROOT, "bench", "out", "hf_speed.md"))
    ap.add_argument("--work-dir", default=os.path.join(sc.ROOT, "build", "hf_speed"))
    args = ap.parse_args()
    stof = sc.resolve_stof(args.stof)
    os.makedirs(args.work_dir, exist_ok=True)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    rows = []
    for name in args.models.split(","):
        model, cfg, d = build(name, max(s for _, s in shapes), args.work_dir)
        for batch, seq in shapes:
            run_shape(args, stof, name, model, cfg, d, batch, seq, rows)
            text = report(rows, args, stof)  # written after every shape: a cut run keeps them
            os.makedirs(os.path.dirname(args.out), exist_ok=True)
            with open(args.out, "w") as f:
                f.write(text)
    log(report(rows, args, stof))
    return 0


if __name__ == "__main__":
    sys.exit(main())
