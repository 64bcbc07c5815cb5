"""Parity: stof's output against Hugging Face transformers on the same weights and inputs.

For bert-base, gpt2 and t5-small: builds the transformers model from its config (random,
seeded; biases and norm gains moved off 0/1), saves its fp16 weights and random token ids as
safetensors, runs `stof run` on them with the all-unfused scheme, the default scheme and a plan
from a short `stof tune`, and compares stof's output (--save-output) with the last hidden state
of a fp32 reference on the same fp16-rounded weights:

  - dense cases (mask=none; GPT-2 is causal, T5's decoder causal): the transformers model itself;
  - masked cases (BigBird; for GPT-2 causal AND BigBird; for T5 on the encoder): the plain-torch
    forward of bench/torch_models.py with SDPA and stof's own mask (python/stof), after that
    forward has been checked against transformers in dense mode (row "torch ref vs HF").

Pass: relative error ||a - b|| / ||b|| < 1e-2 and no non-finite value. Rows marked "context"
(transformers in fp16, transformers with a 4D mask) are printed for scale and do not count.

    python3 bench/parity.py [--quick] [--out bench/out/parity.md] [--stof build/stof]
           [--batch 2] [--seq 256] [--tune-time 15]

Exit status 1 when a counted row fails.
"""
import argparse
import copy
import datetime
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stof_cli as sc  # noqa: E402
from stof_cli import log  # noqa: E402

TOL = 1e-2
REF_TOL = 1e-4  # the torch reference against transformers, both fp32
CASES = [("bert-base", "none"), ("bert-base", "bigbird"), ("gpt2", "none"), ("t5-small", "none")]
EXTRA_CASES = [("gpt2", "bigbird"), ("t5-small", "bigbird")]


def mask_label(fam, mask):
    if fam == "gpt2":
        return "causal" if mask == "none" else f"causal+{mask}"
    if fam == "t5":
        return "none" if mask == "none" else f"{mask} (encoder)"
    return mask


def row(model, mask, scheme, err=None, counted=True, tol=TOL, note=""):
    r = {"model": model, "mask": mask, "scheme": scheme, "counted": counted, "note": note,
         "rel": None, "max_abs": None, "nonfinite": None, "ok": False}
    if err is not None:
        rel, max_abs, nonfinite = err
        r.update(rel=rel, max_abs=max_abs, nonfinite=nonfinite,
                 ok=nonfinite == 0 and rel < tol)
    return r


def print_row(r):
    if r["rel"] is None:
        log(f"  {r['model']:9s} {r['mask']:22s} {r['scheme']:28s} ERROR {r['note']}")
    else:
        state = "ok" if r["ok"] else "FAIL"
        if not r["counted"]:
            state += " (context)"
        log(f"  {r['model']:9s} {r['mask']:22s} {r['scheme']:28s} rel {r['rel']:.2e} "
            f"max abs {r['max_abs']:.2e} nonfinite {r['nonfinite']}  {state}")


def hf_4d_mask(fam, dense, batch, dtype):
    """An additive [B, 1, S, S] mask (0 allowed, dtype's minimum masked); GPT-2's includes
    causality."""
    import torch
    import torch_models as tm
    m = dense
    if fam == "gpt2":
        m = m & tm.causal_dense(m.shape[0], m.shape[1], m.device)
    add = torch.zeros(m.shape, dtype=dtype, device=m.device)
    add.masked_fill_(~m, torch.finfo(dtype).min)
    return add[None, None].expand(batch, 1, *m.shape).contiguous()


def run_model(args, stof, model, masks, rows, notes):
    import torch
    import torch_models as tm
    spec = tm.SPECS[model]
    fam = spec["family"]
    B, S = args.batch, args.seq
    script = os.path.join(sc.ROOT, spec["script"])
    work = args.work_dir

    log(f"== {model}: building the transformers model (seed {args.seed})")
    hf16 = tm.build_hf_model(model, S, seed=args.seed, dtype=torch.float16)
    for m in tm.config_mismatches(model, hf16.config) + tm.script_mismatches(model, script):
        notes.append(f"{model}: config/script mismatch: {m}")
        log(f"  MISMATCH {m}")
    hf32 = copy.deepcopy(hf16).float()
    sd = tm.canonical_state_dict(model, hf16)
    wpath = os.path.join(work, f"{model}-weights.safetensors")
    ipath = os.path.join(work, f"{model}-inputs.safetensors")
    sc.save_safetensors(tm.stof_weights(model, sd, S), wpath)
    ids = sc.random_ids(tm.VOCAB[fam], B, S, args.seed + 1)
    dec = sc.random_ids(tm.VOCAB[fam], B, S, args.seed + 2) if fam == "t5" else None
    sc.save_inputs(ipath, ids, dec, torch.int64 if args.ids_dtype == "int64" else torch.int32)
    ids = ids.cuda()
    dec = dec.cuda() if dec is not None else None

    with torch.no_grad():
        ref_dense = tm.hf_forward(model, hf32, ids, dec).float()
        hf_out16 = tm.hf_forward(model, hf16, ids, dec)
        ref_model = tm.TorchModel(model, sd, kind="sdpa", dtype=torch.float32)
        torch_dense = ref_model(ids, dec, ref_model.make_aux(S, None, S))
    dense_label = mask_label(fam, "none")
    r = row(model, dense_label, "torch ref vs HF (fp32)", tm.rel_error(torch_dense, ref_dense),
            tol=REF_TOL, note="checks the reference of the masked rows")
    rows.append(r)
    print_row(r)
    r = row(model, dense_label, "HF fp16 (context)", tm.rel_error(hf_out16, ref_dense),
            counted=False)
    rows.append(r)
    print_row(r)
    del hf_out16, torch_dense

    for mask in masks:
        label = mask_label(fam, mask)
        if mask == "none":
            ref = ref_dense
        else:
            dense = sc.dense_mask(stof, mask, S)
            with torch.no_grad():
                ref = ref_model(ids, dec, ref_model.make_aux(S, dense, S)).float()
            if fam in ("bert", "gpt2"):
                try:
                    add = hf_4d_mask(fam, dense, B, torch.float32)
                    got = tm.hf_forward(model, hf32, ids, dec, attention_mask=add)
                    r = row(model, label, "HF fp32 + 4D mask (context)", tm.rel_error(got, ref),
                            counted=False, tol=REF_TOL)
                except Exception as e:  # transformers may not take a 4D mask: only context
                    r = row(model, label, "HF fp32 + 4D mask (context)", counted=False,
                            note=f"{type(e).__name__}: {str(e)[:120]}")
                rows.append(r)
                print_row(r)
        sets = sc.script_args(spec, B, S, mask)
        for scheme in args.schemes:
            out_path = os.path.join(work, f"{model}-{mask}-{scheme}-output.safetensors")
            lpath = os.path.join(work, "logs", f"{model}-{mask}.log")
            io = sc.io_args(wpath, ipath, out_path)
            name = scheme
            try:
                if os.path.exists(out_path):
                    os.remove(out_path)
                if scheme == "tuned":
                    plan = os.path.join(work, f"{model}-{mask}-plan.json")
                    t = sc.stof_tune(stof, script, sets, plan, args.tune_time,
                                     timeout=args.tune_time * 4 + 600, log_path=lpath)
                    name = "tuned " + ",".join(t["plan_schemes"])
                    sc.stof_run(stof, plan, io, reps=3, timeout=900, log_path=lpath)
                else:
                    extra = sets + (["--scheme", "unfused"] if scheme == "unfused" else []) + io
                    sc.stof_run(stof, script, extra, reps=3, timeout=900, log_path=lpath)
                r = row(model, label, name, tm.rel_error(sc.load_output(out_path), ref))
            except Exception as e:
                r = row(model, label, name, note=f"{type(e).__name__}: {str(e)[:200]}")
            rows.append(r)
            print_row(r)
    del hf16, hf32, ref_model
    torch.cuda.empty_cache()


def markdown(rows, notes, header):
    lines = [header, "", "| model | mask | scheme | rel err | max abs | nonfinite | pass |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["rel"] is None:
            cells = ["-", "-", "-", f"ERROR: {r['note']}"]
        else:
            state = ("yes" if r["ok"] else "NO") + ("" if r["counted"] else " (context)")
            cells = [f"{r['rel']:.2e}", f"{r['max_abs']:.2e}", str(r["nonfinite"]), state]
        lines.append(f"| {r['model']} | {r['mask']} | {r['scheme']} | " + " | ".join(cells) + " |")
    counted = [r for r in rows if r["counted"]]
    failed = [r for r in counted if not r["ok"]]
    lines += ["", f"{len(counted) - len(failed)} of {len(counted)} counted rows passed "
              f"(relative error < {TOL:g} against the fp32 reference, no non-finite value; "
              f"the torch reference within {REF_TOL:g} of transformers)."]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stof", default="build/stof")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="the four required cases, unfused and tuned schemes, short tuning")
    ap.add_argument("--schemes", default=None,
                    help="comma list of unfused, default, tuned (default: all; --quick: "
                         "unfused,tuned)")
    ap.add_argument("--cases", default=None,
                    help="comma list of MODEL:MASK, e.g. bert-base:bigbird,gpt2:none")
    ap.add_argument("--tune-time", type=float, default=None,
                    help="stof tune --time-limit in seconds (default 20; --quick: 10); "
                         "tried once more with 3x the limit when it runs out before the "
                         "first scheme is measured (cold kernel cache)")
    ap.add_argument("--ids-dtype", choices=["int32", "int64"], default="int32")
    ap.add_argument("--work-dir", default=os.path.join(sc.ROOT, "build", "parity"))
    ap.add_argument("--out", default=os.path.join(sc.ROOT, "bench", "out", "parity.md"))
    args = ap.parse_args()
    args.schemes = (args.schemes or ("unfused,tuned" if args.quick else "unfused,default,tuned")
                    ).split(",")
    for s in args.schemes:
        if s not in ("unfused", "default", "tuned"):
            raise SystemExit(f"--schemes: unknown scheme {s!r}")
    if args.tune_time is None:
        args.tune_time = 10 if args.quick else 20
    if args.cases:
        cases = [tuple(c.split(":", 1)) if ":" in c else (c, "none")
                 for c in args.cases.split(",")]
    else:
        cases = CASES + ([] if args.quick else EXTRA_CASES)

    import torch
    import torch_models as tm
    for model, _ in cases:
        if model not in tm.SPECS:
            raise SystemExit(f"unknown model {model!r} (one of {', '.join(tm.SPECS)})")
    if not torch.cuda.is_available():
        raise SystemExit("parity.py needs a CUDA GPU (stof runs on it, the reference too)")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_grad_enabled(False)
    stof = sc.resolve_stof(args.stof)
    os.makedirs(args.work_dir, exist_ok=True)

    import transformers
    commit = sc.stof_commit(stof)
    header = (f"Parity with transformers: device {torch.cuda.get_device_name()}; date "
              f"{datetime.date.today()}; stof commit {commit}; torch {torch.__version__}, "
              f"transformers {transformers.__version__}; batch {args.batch}, seq {args.seq}, "
              f"seed {args.seed}; stof fp16 against a fp32 reference on the same fp16 weights; "
              f"tuned plans from `stof tune --time-limit {args.tune_time:g}`.")
    log(header)
    rows, notes = [], []
    t0 = time.time()
    by_model = {}
    for model, mask in cases:
        by_model.setdefault(model, []).append(mask)
    for model, masks in by_model.items():
        try:
            run_model(args, stof, model, masks, rows, notes)
        except Exception as e:  # the model could not even be built: one failed row for it
            r = row(model, "-", "setup", note=f"{type(e).__name__}: {str(e)[:200]}")
            rows.append(r)
            print_row(r)
            torch.cuda.empty_cache()
    text = markdown(rows, notes, header)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    log("")
    log(text)
    log(f"wrote {args.out} ({time.time() - t0:.0f} s)")
    failed = [r for r in rows if r["counted"] and not r["ok"]]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
