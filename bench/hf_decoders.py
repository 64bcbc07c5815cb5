"""Parity of decoders from Hugging Face model directories: logits and generated tokens.

For gpt2, gpt_neo (local layers of a 32-token window at seq 128), mistral (grouped-query
attention, 8 query / 2 K/V heads, a sliding window of 24 at seq 128: a generation's cache ring
wraps) and llama (4 query / 1 K/V
head, tied head): builds the *ForCausalLM model from a small config (random, seeded; vocabulary
1003, so the head's width is not a multiple of 8), saves it with `save_pretrained` (safetensors,
fp16), and checks

  - logits: `stof run DIR` (the default scheme on the GPU, fp16) on random ids, full and right
    padded (an `attention_mask`, lengths 25-100%), against transformers in fp32 on the same
    fp16-rounded weights: real tokens compared, padded positions exact zeros;
  - generation: `stof generate --cpu DIR` (the fp32 CPU reference with its KV cache) and
    `stof generate DIR` (the GPU in fp16, the prompts through its prefill pass), ragged
    prompts of 16, 9 and 5 tokens, 32 new tokens, greedy, against transformers' greedy
    `generate` on each prompt: the tokens must be identical wherever transformers' own margin
    between its best and second-best logit is above 1e-4 (CPU) or 2e-2 (GPU, fp16 logits); else
    the row says where the tie was.

Pass: logits relative error ||stof - ref|| / ||ref|| < 1e-2, no non-finite value; tokens as
above.

    python3 bench/hf_decoders.py [--stof build/stof] [--out bench/out/hf_decoders.md]
"""
import argparse
import datetime
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stof_cli as sc  # noqa: E402
from stof_cli import log  # noqa: E402
import torch_models as tm  # noqa: E402

TOL = 1e-2
MARGIN = 1e-4
GPU_MARGIN = 2e-2
VOCAB = 1003
PROMPTS = (16, 9, 5)


def hf_model(arch, max_seq, seed):
    """(transformers *ForCausalLM, config) of arch, random from seed, fp16 on the GPU."""
    import torch
    import transformers as tr
    common = dict(vocab_size=VOCAB, max_position_embeddings=max_seq)
    if arch == "gpt2":
        cfg = tr.GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=VOCAB,
                            n_positions=max_seq)
        cls = tr.GPT2LMHeadModel
    elif arch == "gpt_neo":
        cfg = tr.GPTNeoConfig(hidden_size=256, num_layers=4, num_heads=4, window_size=32,
                              attention_types=[[["global", "local"], 2]], **common)
        cls = tr.GPTNeoForCausalLM
    elif arch == "mistral":
        cfg = tr.MistralConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                               num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                               sliding_window=24, tie_word_embeddings=False, **common)
        cls = tr.MistralForCausalLM
    else:
        cfg = tr.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=1,
                             tie_word_embeddings=True, **common)
        cls = tr.LlamaForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg)
    tm.perturb_(model, seed)
    return model.eval().to(device="cuda", dtype=torch.float16), cfg


def logits_rows(args, stof, arch, d, model, work, rows):
    import torch
    ids = sc.random_ids(VOCAB, args.batch, args.seq, seed=5)
    pad_ids, mask, _ = sc.padded_batch(ids, 0, seed=9)
    sets = ["--set", f"batch={args.batch}", "--set", f"seq={args.seq}", "--set", "dtype=fp16"]
    log_path = os.path.join(work, "stof.log")
    for label, x, m in (("logits", ids, None), ("logits, padded", pad_ids, mask)):
        row = {"arch": arch, "run": label}
        inputs = os.path.join(work, f"{arch}-{label.replace(', ', '-')}.safetensors")
        sc.save_inputs(inputs, x, attention_mask=m)
        out = os.path.join(work, f"{arch}-out.safetensors")
        if os.path.exists(out):
            os.remove(out)
        with torch.no_grad():
            kw = {"attention_mask": m.cuda()} if m is not None else {}
            ref = model.float()(x.cuda(), **kw).logits.float().cpu()
        try:
            sc.run_cmd([stof, "run", d] + sets + sc.io_args(inputs=inputs, save_output=out)
                       + ["--reps", "3"], 600, log_path)
            got = sc.load_output(out)
            real = (m if m is not None else torch.ones_like(x)).bool()
            row["rel"], row["max_abs"], row["nonfinite"] = tm.rel_error(got[real], ref[real])
            row["pad_nonzero"] = int((got[~real] != 0).sum())
            row["ok"] = row["nonfinite"] == 0 and row["rel"] < TOL and row["pad_nonzero"] == 0
        except sc.CmdError as e:
            row.update(rel=None, ok=False, note=str(e))
        rows.append(row)
        log(f"  {arch:8s} {label:15s} " + (f"rel {row['rel']:.2e}" if row.get("rel") is not None
                                             else f"ERROR {row.get('note')}"))


def first_divergence(ours, theirs, scores):
    """(index of the first differing token or None, transformers' margin there)."""
    for t, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            top = scores[t].float().topk(2).values
            return t, float(top[0] - top[1])
    return None, None


def generation_row(args, stof, arch, d, model, cfg, work, rows, gpu=False):
    import torch
    g = torch.Generator().manual_seed(21)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in PROMPTS]
    where = "GPU fp16" if gpu else "--cpu"
    row = {"arch": arch, "run": f"generate {where}, greedy {args.new} tokens"}
    # fp16 logits carry ~1e-3 of error: closer margins than that are ties for the GPU run
    margin_tol = GPU_MARGIN if gpu else MARGIN
    cmd = [stof, "generate"] + ([] if gpu else ["--cpu"]) + [d, "--max-new-tokens",
                                                             str(args.new), "--ignore-eos"]
    for p in prompts:
        cmd += ["--prompt", ",".join(map(str, p))]
    try:
        out, wall = sc.run_cmd(cmd, 600, os.path.join(work, "stof.log"))
        ours = [list(map(int, m.split(","))) for m in
                re.findall(r"^sequence \d+: [\d,]+ \| ([\d,]+)$", out, re.M)]
        model = model.float()
        notes, ok = [], len(ours) == len(prompts)
        for k, p in enumerate(prompts):
            with torch.no_grad():
                res = model.generate(torch.tensor([p]).cuda(), max_new_tokens=args.new,
                                     do_sample=False, output_scores=True,
                                     return_dict_in_generate=True, eos_token_id=None,
                                     pad_token_id=0)
            theirs = res.sequences[0, len(p):].tolist()
            scores = [s[0] for s in res.scores]
            t, margin = first_divergence(ours[k] if k < len(ours) else [], theirs, scores)
            if t is None and k < len(ours) and len(ours[k]) == len(theirs):
                notes.append(f"{len(theirs)}/{len(theirs)} same")
            elif t is not None and margin < margin_tol:
                notes.append(f"same up to {t}, then a tie (margin {margin:.1e})")
            else:
                ok = False
                notes.append(f"differs at {t} (margin {margin})")
        row.update(ok=ok, note="; ".join(notes), wall=wall)
    except sc.CmdError as e:
        row.update(ok=False, note=str(e))
    rows.append(row)
    log(f"  {arch:8s} generate: {row['note']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stof", default="build/stof")
    ap.add_argument("--out", default=os.path.join(sc.ROOT, "bench", "out", "hf_decoders.md"))
    ap.add_argument("--work-dir", default=os.path.join(sc.ROOT, "build", "hf_decoders"))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--archs", default="gpt2,gpt_neo,mistral,llama")
    args = ap.parse_args()
    stof = sc.resolve_stof(args.stof)
    os.makedirs(args.work_dir, exist_ok=True)
    import torch
    import transformers
    rows = []
    for arch in args.archs.split(","):
        d = os.path.join(args.work_dir, arch)
        shutil.rmtree(d, ignore_errors=True)
        model, cfg = hf_model(arch, max(args.seq, max(PROMPTS) + args.new), seed=11)
        model.save_pretrained(d, safe_serialization=True)
        logits_rows(args, stof, arch, d, model, args.work_dir, rows)
        generation_row(args, stof, arch, d, model, cfg, args.work_dir, rows)
        generation_row(args, stof, arch, d, model, cfg, args.work_dir, rows, gpu=True)
    head = (f"Device: {torch.cuda.get_device_name()}; date {datetime.date.today()}; stof commit "
            f"{sc.stof_commit(stof)}; torch {torch.__version__}, transformers "
            f"{transformers.__version__}; checkpoints in fp16, vocabulary {VOCAB}; logits: batch "
            f"{args.batch}, seq {args.seq}, stof fp16 default scheme against transformers fp32 "
            f"on the same rounded weights; generation: the CPU reference against transformers "
            f"fp32 greedy generate, prompts of {', '.join(map(str, PROMPTS))} tokens.")
    lines = [head, "", "| model_type | run | rel error | max abs | non-finite | pad != 0 | "
             "tokens | ok |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("rel") is not None:
            lines.append(f"| {r['arch']} | {r['run']} | {r['rel']:.2e} | {r['max_abs']:.2e} | "
                         f"{r['nonfinite']} | {r['pad_nonzero']} | | "
                         f"{'yes' if r['ok'] else 'NO'} |")
        else:
            lines.append(f"| {r['arch']} | {r['run']} | | | | | {r.get('note')} | "
                         f"{'yes' if r['ok'] else 'NO'} |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    log("\n".join(lines))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
