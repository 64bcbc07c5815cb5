"""Parity of Hugging Face model directories: `stof run DIR` against transformers.

For each architecture stof reads from a model directory (bert, roberta, distilbert, gpt2,
modernbert, longformer; Longformer also with 1 and 16 global tokens a sequence, given as a
global_attention_mask, unpadded and padded):
builds the transformers model from a small config (random, seeded; biases and norm gains moved
off 0/1), saves it with `save_pretrained` (safetensors, fp16; roberta and distilbert split into
shards), writes random token ids, and runs

  - `stof run DIR` (the default scheme on the GPU; stof checks it against its CPU reference),
  - `stof tune DIR -o plan.json` then `stof run plan.json` (the plan finds the folder again),

and ModernBERT also `stof run --cpu DIR` (the CPU reference on its own), each with
`--inputs ids.safetensors --save-output out.safetensors` (bert's inputs a sentence pair: the
second half of each sequence `token_type_ids` 1); then, for the encoders, both again
on a padded batch (lengths drawn from 25-100% of seq, an `attention_mask` in the inputs file,
the same tuned plan), against transformers given the same `attention_mask`: real tokens
compared, padded positions required to be exact zeros. It compares stof's output with the
last hidden state of transformers in fp32 on the same fp16-rounded weights.

Pass: relative error ||stof - ref|| / ||ref|| < 1e-2 and no non-finite value.

    python3 bench/hf_dirs.py [--stof build/stof] [--out bench/out/hf_dirs.md] [--batch 2]
           [--seq 128] [--tune-time 10]

Exit status 1 when a row fails.
"""
import argparse
import datetime
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stof_cli as sc  # noqa: E402
from stof_cli import log  # noqa: E402
import torch_models as tm  # noqa: E402

TOL = 1e-2
SIZES = dict(hidden=256, layers=4, heads=4, ffn=1024, vocab=1000)


def hf_model(arch, max_seq, seed, base=False):
    """(transformers model, config) of arch, random from seed, fp16 on the GPU: the small
    test sizes (SIZES), or the base checkpoint's."""
    import torch
    import transformers as tr
    s = SIZES
    if base:
        cfg, cls = tm.base_config(arch, max_seq)
        torch.manual_seed(seed)
        model = cls(cfg)
        tm.perturb_(model, seed)
        return model.eval().to(device="cuda", dtype=torch.float16), cfg
    if arch == "bert":
        cfg = tr.BertConfig(hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                            num_attention_heads=s["heads"], intermediate_size=s["ffn"],
                            vocab_size=s["vocab"], max_position_embeddings=max_seq)
        cls = tr.BertModel
    elif arch == "roberta":
        cfg = tr.RobertaConfig(hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                               num_attention_heads=s["heads"], intermediate_size=s["ffn"],
                               vocab_size=s["vocab"], max_position_embeddings=max_seq + 2,
                               type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5)
        cls = tr.RobertaModel
    elif arch == "longformer":
        # windows of 32 and 16 keys (16 and 8 each side): sparse at seq 128
        cfg = tr.LongformerConfig(hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                                  num_attention_heads=s["heads"], intermediate_size=s["ffn"],
                                  vocab_size=s["vocab"], max_position_embeddings=max_seq + 2,
                                  type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5,
                                  attention_window=[32, 16] * (s["layers"] // 2))
        cls = tr.LongformerModel
    elif arch == "distilbert":
        cfg = tr.DistilBertConfig(dim=s["hidden"], n_layers=s["layers"], n_heads=s["heads"],
                                  hidden_dim=s["ffn"], vocab_size=s["vocab"],
                                  max_position_embeddings=max_seq)
        cls = tr.DistilBertModel
    elif arch == "modernbert":
        # local layers attend 32 keys each side: sparse at seq 128
        cfg = tr.ModernBertConfig(hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                                  num_attention_heads=s["heads"], intermediate_size=s["ffn"] // 2,
                                  vocab_size=s["vocab"], max_position_embeddings=max_seq,
                                  local_attention=64, global_attn_every_n_layers=3,
                                  pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                  cls_token_id=1, sep_token_id=2)
        cls = tr.ModernBertModel
    else:
        cfg = tr.GPT2Config(n_embd=s["hidden"], n_layer=s["layers"], n_head=s["heads"],
                            vocab_size=s["vocab"], n_positions=max_seq)
        cls = tr.GPT2Model
    torch.manual_seed(seed)
    model = cls(cfg)
    tm.perturb_(model, seed)
    return model.eval().to(device="cuda", dtype=torch.float16), cfg


def run_case(args, stof, arch, work, rows):
    import torch
    d = os.path.join(work, arch)
    bf16 = args.dtype == "bf16"
    shutil.rmtree(d, ignore_errors=True)
    model, cfg = hf_model(arch, args.seq, seed=11, base=args.base)
    # shards for two of them: the index and the shards are read as one checkpoint
    shard = "300KB" if arch in ("roberta", "distilbert") and not args.base else "2GB"
    model.save_pretrained(d, safe_serialization=True, max_shard_size=shard)
    n_files = len([f for f in os.listdir(d) if f.endswith(".safetensors")])
    # token ids, clear of roberta's padding id (1): positions then start at 2 as in stof
    vocab = getattr(cfg, "vocab_size", SIZES["vocab"])
    ids = sc.random_ids(vocab - 3, args.batch, args.seq, seed=5) + 3
    ids_path = os.path.join(d, "..", f"{arch}-ids.safetensors")
    # BERT: a sentence pair, the second half of each sequence segment B (token_type_ids)
    types = None
    kw = {}
    if arch == "bert":
        types = (torch.arange(args.seq)[None, :] >= args.seq // 2).long().expand(args.batch, -1)
        kw["token_type_ids"] = types.cuda()
    sc.save_inputs(ids_path, ids, token_type_ids=types)
    with torch.no_grad():
        # stof rounds the checkpoint's fp16 values to the model's dtype: so does the reference
        ref_model = model.to(torch.bfloat16) if bf16 else model
        # transformers itself in that dtype: what the dtype alone costs against fp32
        same_dtype = ref_model(ids.cuda(), **kw).last_hidden_state.float()
        ref = ref_model.float()(ids.cuda(), **kw).last_hidden_state
    row = {"arch": arch, "files": n_files, "run": f"transformers in {args.dtype}",
           "dtype": args.dtype, "reference_only": True}
    row["rel"], row["max_abs"], row["nonfinite"] = tm.rel_error(same_dtype, ref)
    row["ok"] = True
    rows.append(row)
    sets = ["--set", f"batch={args.batch}", "--set", f"seq={args.seq}",
            "--set", f"dtype={args.dtype}"]
    log_path = os.path.join(work, "stof.log")
    out = os.path.join(work, f"{arch}-{args.dtype}-out.safetensors")
    plan = os.path.join(work, f"{arch}-{args.dtype}-plan.json")
    runs = [("default scheme", [stof, "run", d] + sets, None)]
    if not args.no_tune:
        runs.append(("tuned plan", None, None))
    if arch == "modernbert" and not args.base:
        runs.append(("CPU reference", [stof, "run", "--cpu", d] + sets, None))
    if arch != "gpt2":  # the encoders take an attention_mask; one plan serves both
        pad_ids, mask, _ = sc.padded_batch(ids, cfg.pad_token_id or 0, seed=9)
        pad_path = os.path.join(d, "..", f"{arch}-padded.safetensors")
        sc.save_inputs(pad_path, pad_ids, attention_mask=mask, token_type_ids=types)
        with torch.no_grad():
            pad_ref = ref_model(pad_ids.cuda(), attention_mask=mask.cuda(),
                                **kw).last_hidden_state
        padded = (pad_path, pad_ref.float().cpu(), mask.bool())
        runs.append(("default scheme, padded", [stof, "run", d] + sets, padded))
        if not args.no_tune:
            runs.append(("tuned plan, padded", [stof, "run", plan], padded))
    if arch == "longformer":  # global tokens (global_attention_mask): 1 and 16 a sequence
        for n_global in (1, 16):
            gm = sc.global_tokens(args.batch, args.seq, n_global, seed=13 + n_global)
            for pad in (False, True):
                am = mask if pad else torch.ones_like(ids)
                x = pad_ids if pad else ids
                path = os.path.join(d, "..", f"{arch}-global{n_global}-{int(pad)}.safetensors")
                sc.save_inputs(path, x, attention_mask=am, global_attention_mask=gm)
                with torch.no_grad():
                    g_ref = ref_model(x.cuda(), attention_mask=am.cuda(),
                                      global_attention_mask=gm.cuda()).last_hidden_state
                case = (path, g_ref.float().cpu(), am.bool())
                tag = f"{n_global} global" + (", padded" if pad else "")
                runs.append((f"default scheme, {tag}", [stof, "run", d] + sets, case))
                if not args.no_tune and pad:
                    runs.append((f"tuned plan, {tag}", [stof, "run", plan], case))
    for label, cmd, padded in runs:
        row = {"arch": arch, "files": n_files, "run": label, "dtype": args.dtype}
        try:
            if cmd is None:
                sc.stof_tune(stof, d, sets, plan, args.tune_time, 600, log_path)
                cmd = [stof, "run", plan]
            if os.path.exists(out):
                os.remove(out)
            reps = [] if "--cpu" in cmd else ["--reps", "5"]
            if args.base and "--cpu" not in cmd:
                reps.append("--no-check")  # transformers is the judge; the CPU would take long
            inputs = padded[0] if padded else ids_path
            sc.run_cmd(cmd + sc.io_args(inputs=inputs, save_output=out) + reps, 600, log_path)
            got = sc.load_output(out)
            if padded:
                real = padded[2]
                row["rel"], row["max_abs"], row["nonfinite"] = tm.rel_error(got[real], padded[1][real])
                row["pad_nonzero"] = int((got[~real] != 0).sum())
            else:
                row["rel"], row["max_abs"], row["nonfinite"] = tm.rel_error(got, ref)
            row["ok"] = (row["nonfinite"] == 0 and row["rel"] < TOL and
                         row.get("pad_nonzero", 0) == 0)
        except sc.CmdError as e:
            row.update(rel=None, ok=False, note=str(e))
        rows.append(row)
        log(f"  {arch:10s} {args.dtype} {n_files} file(s)  {label:15s} "
            + (f"rel {row['rel']:.2e} max {row['max_abs']:.2e} nonfinite {row['nonfinite']}"
               if row.get("rel") is not None else f"ERROR {row.get('note')}"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stof", default="build/stof")
    ap.add_argument("--out", default=os.path.join(sc.ROOT, "bench", "out", "hf_dirs.md"))
    ap.add_argument("--work-dir", default=os.path.join(sc.ROOT, "build", "hf_dirs"))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--tune-time", type=float, default=10)
    ap.add_argument("--dtypes", default="fp16,bf16", help="the model's dtype in stof, each a run")
    ap.add_argument("--archs", default="bert,roberta,distilbert,gpt2,modernbert,longformer")
    ap.add_argument("--base", action="store_true",
                    help="the base checkpoints' sizes (bert-base, ..., ModernBERT-base)")
    ap.add_argument("--no-tune", action="store_true", help="the default scheme only")
    args = ap.parse_args()
    stof = sc.resolve_stof(args.stof)
    os.makedirs(args.work_dir, exist_ok=True)
    import torch
    import transformers
    rows = []
    for dtype in args.dtypes.split(","):
        args.dtype = dtype
        for arch in args.archs.split(","):
            run_case(args, stof, arch, args.work_dir, rows)
    head = (f"Device: {torch.cuda.get_device_name()}; date {datetime.date.today()}; stof commit "
            f"{sc.stof_commit(stof)}; torch {torch.__version__}, transformers "
            f"{transformers.__version__}; checkpoints in fp16; "
            f"{'base sizes' if args.base else 'small sizes'}; batch {args.batch}, seq {args.seq}; "
            f"reference: transformers in fp32 on the weights rounded as stof rounds them.")
    lines = [head, "", "Padded rows: real tokens compared; `pad != 0` counts values at padded "
             "positions that are not exactly zero.", "",
             "| model_type | dtype | weight files | run | rel error | max abs | "
             "non-finite | pad != 0 | ok |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("rel") is None:
            lines.append(f"| {r['arch']} | {r['dtype']} | {r['files']} | {r['run']} | error: "
                         f"{r.get('note')} | | | | no |")
        else:
            ok = "(reference)" if r.get("reference_only") else "yes" if r["ok"] else "NO"
            lines.append(f"| {r['arch']} | {r['dtype']} | {r['files']} | {r['run']} | "
                         f"{r['rel']:.2e} | {r['max_abs']:.2e} | {r['nonfinite']} | "
                         f"{r.get('pad_nonzero', '')} | {ok} |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    log("\n".join(lines))
    return 0 if all(r["ok"] for r in rows if not r.get("reference_only")) else 1


if __name__ == "__main__":
    sys.exit(main())
