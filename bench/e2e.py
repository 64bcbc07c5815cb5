"""End to end: stof (tuned and all-unfused) against PyTorch eager and torch.compile.

Models: bert-small (stof preset small), bert-base, bert-large (BigBird mask), gpt2 (causal, and
causal AND BigBird), t5-base (BigBird on the encoder; causal decoder); shapes (batch, seq) in
(1, 128), (8, 512), (16, 2048); fp16; the same seeded weights and token ids everywhere; the
BigBird mask is stof's default (python/stof builds it, so PyTorch gets exactly stof's mask).

Per case:
  stof tuned    `stof tune -o plan.json --time-limit T`, then `stof run plan.json` on the saved
                weights and ids: CUDA-graph latency (tuning wall time and the plan's tuning
                time go to the tuning table); its output is checked against PyTorch eager
  stof unfused  `stof run --scheme unfused`: every operator its own kernel, stof's sparse
                attention kernel included (the ablation: attention module only)
  stof fusion   the same model with the mask removed (dense attention through stof's
                kernel), tuned and run like stof tuned (the ablation: fusion module only;
                cases whose mask is already "none" have none)
  eager         bench/torch_models.py forward, SDPA with the dense boolean/additive mask
  compile-flex  torch.compile of the same forward with FlexAttention and a BlockMask of the mask
  compile-ro    torch.compile(mode="reduce-overhead") with SDPA + mask: the forward replayed as
                CUDA graphs. (--compile-scope layer, faster to compile: each layer compiled on
                its own, and compile-ro = the whole forward captured into one CUDA graph.)
PyTorch times: CUDA events, warm-up then the median of --reps runs. stof: its own median of
--reps CUDA-graph replays. speedup = min(compile-flex, compile-ro) / stof tuned.

    python3 bench/e2e.py --out bench/out/e2e.md --json bench/out/e2e.json --plot-dir bench/out
    python3 bench/e2e.py --quick ...             bert-base and gpt2 at (1, 128) and (8, 512)
    python3 bench/e2e.py --resume ...            continue a run stopped by --max-wall
    python3 bench/e2e.py --report-only --json bench/out/e2e.json --out ...   tables again

Every case is saved to --json as soon as it is done; a failure (say, an OOM) is recorded as
"error: ..." and the run goes on.
"""
import argparse
import datetime
import gc
import json
import math
import os
import sys
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stof_cli as sc  # noqa: E402
from stof_cli import log  # noqa: E402

DEFAULT_MODELS = ["bert-small", "bert-base", "bert-large", "gpt2", "t5-base"]
DEFAULT_SHAPES = [(1, 128), (8, 512), (16, 2048)]
QUICK_MODELS = ["bert-base", "gpt2"]
QUICK_SHAPES = [(1, 128), (8, 512)]
DEFAULT_MASKS = {"bert": ["bigbird"], "gpt2": ["none", "bigbird"], "t5": ["bigbird"]}
FAMILY = {"bert-small": "bert", "bert-base": "bert", "bert-large": "bert", "gpt2": "gpt2",
          "t5-small": "t5", "t5-base": "t5"}
VARIANTS = [("eager", "eager"), ("compile-flex", "flex"), ("compile-ro", "ro")]
ALL_RUNS = ["stof-tuned", "stof-unfused", "stof-fusion", "eager", "compile-flex", "compile-ro"]


def mask_label(model, mask):
    fam = FAMILY.get(model, "bert")
    if fam == "gpt2":
        return "causal" if mask == "none" else f"causal+{mask}"
    if fam == "t5":
        return "dense" if mask == "none" else f"{mask} (enc)"
    return "dense" if mask == "none" else mask


def case_key(model, mask, batch, seq):
    return f"{model}|{mask}|{batch}|{seq}"


def bandwidth_for(name):
    """HBM bandwidth (B/s) of a GPU by name; 0 when unknown."""
    n = name.upper()
    table = [("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100 PCIE", 2.0e12), ("H100", 3.35e12),
             ("H800", 3.35e12), ("GH200", 4.0e12), ("B200", 8.0e12), ("A100", 2.0e12)]
    for key, bw in table:
        if key in n:
            return bw
    return 0.0


def short_error(e, n=160):
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:n] if str(e).strip() else ''}"


# ---- timing ---------------------------------------------------------------------------------

def cuda_graph(fn):
    """fn captured once into a CUDA graph (after warm-up runs on a side stream, which is where
    torch.compile compiles); returns a replay function that returns the captured output."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()

    def replay():
        g.replay()
        return out

    replay.graph = g
    return replay


def cleanup():
    import torch
    gc.collect()
    try:
        torch._dynamo.reset()
    except Exception:
        pass
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def configure_dynamo():
    import torch
    cfg = torch._dynamo.config
    for key, value in (("cache_size_limit", 256), ("recompile_limit", 256),
                       ("accumulated_cache_size_limit", 4096),
                       ("accumulated_recompile_limit", 4096)):
        if hasattr(cfg, key):
            try:
                setattr(cfg, key, value)
            except Exception:
                pass


def torch_variant(variant, model, sd, ids, dec_ids, dense, seq, args):
    """(median ms, first-call seconds, output) of one PyTorch configuration."""
    import torch
    import torch_models as tm
    kind = "flex" if variant == "compile-flex" else "sdpa"
    net = tm.TorchModel(model, sd, kind=kind)
    aux = net.make_aux(seq, dense, seq)

    def call():
        return net(ids, dec_ids, aux)

    t0 = time.time()
    if variant == "eager":
        fn = call
    elif args.compile_scope == "model":
        if variant == "compile-flex":
            compiled = torch.compile(net, dynamic=False)

            def fn():
                return compiled(ids, dec_ids, aux)
        else:
            for t in net.aux_tensors(aux) + [ids] + ([dec_ids] if dec_ids is not None else []):
                try:
                    torch._dynamo.mark_static_address(t)
                except Exception:
                    pass
            compiled = torch.compile(net, mode="reduce-overhead", dynamic=False)

            def fn():
                torch.compiler.cudagraph_mark_step_begin()
                return compiled(ids, dec_ids, aux)
    else:
        net.compile_layers(dynamic=False)
        fn = call if variant == "compile-flex" else cuda_graph(call)
    out = fn().clone()
    torch.cuda.synchronize()
    first_s = time.time() - t0
    ms = sc.time_ms(fn, max(args.warmup, 3), args.reps)
    return ms, first_s, out


# ---- one case -------------------------------------------------------------------------------

class ModelState:
    """What a model's cases share: its weights (canonical state dict), weight files per
    position-table size, the weight bytes a forward streams."""

    def __init__(self, model, sd, args):
        import torch_models as tm
        self.model, self.sd, self.args = model, sd, args
        self.files = {}
        self.hf = None
        self.weight_bytes = tm.weight_bytes(model, sd)

    def weights_file(self, seq):
        import torch_models as tm
        rows = tm.position_rows(self.model, seq)
        if rows not in self.files:
            path = os.path.join(self.args.work_dir,
                                f"weights-{self.model}-seed{self.args.seed}-pos{rows}.safetensors")
            if not os.path.exists(path):
                sc.save_safetensors(tm.stof_weights(self.model, self.sd, seq), path)
            self.files[rows] = path
        return self.files[rows]


def run_stof(args, stof, st, spec, mask, batch, seq, ids, dec_ids, row, key):
    """Fills row with the stof tuned and unfused numbers; returns stof's output (CPU) or None."""
    import torch
    tag = key.replace("|", "-")
    lpath = os.path.join(args.work_dir, "logs", f"{tag}.log")
    script = os.path.join(sc.ROOT, spec["script"])
    sets = sc.script_args(spec, batch, seq, mask)
    io, out_path = [], None
    if args.stof_weights:
        ipath = os.path.join(args.work_dir, f"inputs-{tag}.safetensors")
        sc.save_inputs(ipath, ids, dec_ids)
        out_path = os.path.join(args.work_dir, f"output-{tag}.safetensors")
        if os.path.exists(out_path):
            os.remove(out_path)
        io = sc.io_args(st.weights_file(seq), ipath)
    torch.cuda.empty_cache()
    output = None
    if "stof-tuned" in args.runs:
        plan = os.path.join(args.work_dir, f"plan-{tag}.json")
        try:
            t = sc.stof_tune(stof, script, sets, plan, args.time_limit,
                             timeout=args.time_limit * 4 + 600, log_path=lpath)
            row.update(t)
            retried = (f"; {t['tune_attempts']} tries, the last with --time-limit "
                       f"{t['tune_time_limit']:g}" if t["tune_attempts"] > 1 else "")
            log(f"    stof tune: {t['tune_wall_s']:.1f} s wall (plan tuning_s "
                f"{fnum(t.get('plan_tuning_s'), 1)}), schemes {','.join(t['plan_schemes'])}{retried}")
            extra = io + (["--save-output", out_path] if out_path else [])
            r = sc.stof_run(stof, plan, extra, args.reps, timeout=900, log_path=lpath)
            row["stof_tuned_ms"], row["stof_tuned_eager_ms"] = r["graph_ms"], r["eager_ms"]
            row["stof_weights_mb"] = r["weights_mb"]
            log(f"    stof tuned: {r['graph_ms']:.3f} ms (CUDA graph), eager {r['eager_ms']:.3f} ms")
            if out_path and os.path.exists(out_path):
                output = sc.load_output(out_path)
        except Exception as e:
            row["stof_tuned_error"] = short_error(e)
            log(f"    stof tuned: error {row['stof_tuned_error']}")
    if "stof-fusion" in args.runs and mask != "none":
        dense_sets = sc.script_args(spec, batch, seq, "none")
        plan = os.path.join(args.work_dir, f"plan-{tag}-dense.json")
        try:
            t = sc.stof_tune(stof, script, dense_sets, plan, args.time_limit,
                             timeout=args.time_limit * 4 + 600, log_path=lpath)
            r = sc.stof_run(stof, plan, io, args.reps, timeout=900, log_path=lpath)
            row["stof_fusion_ms"] = r["graph_ms"]
            log(f"    stof fusion only (mask removed): {r['graph_ms']:.3f} ms (CUDA graph; tuned "
                f"in {t['tune_wall_s']:.1f} s)")
        except Exception as e:
            row["stof_fusion_error"] = short_error(e)
            log(f"    stof fusion only: error {row['stof_fusion_error']}")
    if "stof-unfused" in args.runs:
        try:
            r = sc.stof_run(stof, script, sets + ["--scheme", "unfused"] + io, args.reps,
                            timeout=900, log_path=lpath)
            row["stof_unfused_ms"], row["stof_unfused_eager_ms"] = r["graph_ms"], r["eager_ms"]
            log(f"    stof unfused: {r['graph_ms']:.3f} ms (CUDA graph)")
        except Exception as e:
            row["stof_unfused_error"] = short_error(e)
            log(f"    stof unfused: error {row['stof_unfused_error']}")
    return output


def run_case(args, stof, st, model, mask, batch, seq):
    import torch
    import torch_models as tm
    spec = tm.SPECS[model]
    fam = spec["family"]
    key = case_key(model, mask, batch, seq)
    row = {"model": model, "mask": mask, "mask_label": mask_label(model, mask), "batch": batch,
           "seq": seq, "weight_bytes": st.weight_bytes}
    if args.bandwidth > 0:
        row["bound_ms"] = st.weight_bytes / args.bandwidth * 1e3
    t0 = time.time()
    seed = args.seed + zlib.crc32(key.encode()) % 100000
    ids = sc.random_ids(tm.VOCAB[fam], batch, seq, seed)
    dec_ids = sc.random_ids(tm.VOCAB[fam], batch, seq, seed + 1) if fam == "t5" else None

    stof_out = run_stof(args, stof, st, spec, mask, batch, seq, ids, dec_ids, row, key)

    ids_d = ids.cuda()
    dec_d = dec_ids.cuda() if dec_ids is not None else None
    mask_error = None
    try:
        dense = sc.dense_mask(stof, mask, seq)
        if dense is not None:
            row["mask_density"] = dense.float().mean().item()
    except Exception as e:  # libstof not loadable: no PyTorch numbers for this case
        dense, mask_error = None, "mask: " + short_error(e)
        log(f"    stof's mask through python/stof: {mask_error}")
    ref = None
    for variant, short in VARIANTS:
        if variant not in args.runs:
            continue
        if mask_error:
            row[f"{short}_error"] = mask_error
            continue
        try:
            ms, first_s, out = torch_variant(variant, model, st.sd, ids_d, dec_d, dense, seq, args)
            row[f"{short}_ms"], row[f"{short}_first_s"] = ms, first_s
            if ref is None:
                ref = out
                row["ref_variant"] = variant
            else:
                row[f"{short}_err"] = tm.rel_error(out, ref)[0]
            err = f", rel err vs {row['ref_variant']} {row[f'{short}_err']:.1e}" \
                if f"{short}_err" in row else ""
            log(f"    {variant}: {ms:.3f} ms (first call {first_s:.1f} s{err})")
        except Exception as e:
            oom = isinstance(e, getattr(torch.cuda, "OutOfMemoryError", MemoryError))
            row[f"{short}_error"] = "OOM" if oom else short_error(e)
            log(f"    {variant}: error {row[f'{short}_error']}")
        finally:
            cleanup()
    if stof_out is not None and ref is not None:
        try:
            rel, max_abs, nonfinite = tm.rel_error(stof_out.to(ref.device), ref)
            row.update(stof_err=rel, stof_max_abs=max_abs, stof_nonfinite=nonfinite)
            log(f"    stof tuned output vs {row['ref_variant']}: rel err {rel:.2e}, max abs "
                f"{max_abs:.2e}, {nonfinite} non-finite")
        except Exception as e:
            row["stof_err_error"] = short_error(e)
    best = best_compile(row)
    if best and row.get("stof_tuned_ms"):
        row["speedup"] = best / row["stof_tuned_ms"]
    row["case_s"] = time.time() - t0
    del ref, stof_out
    cleanup()
    return row


def best_compile(row):
    vals = [row[k] for k in ("flex_ms", "ro_ms") if isinstance(row.get(k), (int, float))]
    return min(vals) if vals else None


def validate(model, st, args):
    """The plain-torch forward against the transformers model, fp16, dense, (1, 128)."""
    import torch
    import torch_models as tm
    hf = st.hf
    fam = FAMILY[model]
    ids = sc.random_ids(tm.VOCAB[fam], 1, 128, args.seed + 11).cuda()
    dec = sc.random_ids(tm.VOCAB[fam], 1, 128, args.seed + 12).cuda() if fam == "t5" else None
    with torch.no_grad():
        want = tm.hf_forward(model, hf, ids, dec)
        net = tm.TorchModel(model, st.sd, kind="sdpa")
        got = net(ids, dec, net.make_aux(128, None, 128))
    rel, max_abs, nonfinite = tm.rel_error(got, want)
    del net, got, want
    return {"rel_err": rel, "max_abs": max_abs, "nonfinite": nonfinite,
            "ok": rel < 1e-2 and nonfinite == 0, "shape": [1, 128],
            "mismatches": tm.config_mismatches(model, hf.config) +
            tm.script_mismatches(model, os.path.join(sc.ROOT, tm.SPECS[model]["script"]))}


# ---- the report -------------------------------------------------------------------------------

def fnum(v, digits=3):
    return f"{v:.{digits}f}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def cell_ms(row, prefix):
    if isinstance(row.get(f"{prefix}_ms"), (int, float)):
        return fnum(row[f"{prefix}_ms"])
    err = row.get(f"{prefix}_error")
    if err:
        err = str(err).replace("|", "/")
        return err if len(err) <= 24 else "error (below)"
    return "-"


def geomean(xs):
    xs = [x for x in xs if isinstance(x, (int, float)) and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def ordered_cases(data):
    order = {m: i for i, m in enumerate(DEFAULT_MODELS + ["t5-small"])}
    return sorted(data.get("cases", {}).values(),
                  key=lambda r: (order.get(r["model"], 99), r["mask"] != "none" and
                                 r["model"] == "gpt2", r["mask"], r["batch"], r["seq"]))


def report(data):
    meta = data.get("meta", {})
    rows = ordered_cases(data)
    bw = meta.get("bandwidth")
    lines = [
        f"Device: {meta.get('device', '?')}; date {meta.get('date', '?')}; stof commit "
        f"{meta.get('commit', '?')}; torch {meta.get('torch', '?')}, transformers "
        f"{meta.get('transformers', '?')}; fp16; median of {meta.get('reps', '?')} runs (ms); "
        f"stof tune --time-limit {meta.get('time_limit', '?')} s; torch.compile scope "
        f"{meta.get('compile_scope', '?')}; stof weights {meta.get('stof_weights_note', '?')}.",
        "",
        "| model | mask | batch | seq | stof tuned | stof unfused | stof fusion only | eager "
        "| compile-flex | compile-ro | speedup vs best compile | weight-read bound "
        "| tuned / bound | stof err vs eager |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        small = r["batch"] == 1 and r["seq"] == 128
        bound = r.get("bound_ms") if small else None
        ratio = (r["stof_tuned_ms"] / bound
                 if bound and isinstance(r.get("stof_tuned_ms"), (int, float)) else None)
        sp = r.get("speedup")
        err = r.get("stof_err")
        lines.append(
            f"| {r['model']} | {r.get('mask_label', r['mask'])} | {r['batch']} | {r['seq']} "
            f"| {cell_ms(r, 'stof_tuned')} | {cell_ms(r, 'stof_unfused')} "
            f"| {cell_ms(r, 'stof_fusion')} | {cell_ms(r, 'eager')} "
            f"| {cell_ms(r, 'flex')} | {cell_ms(r, 'ro')} "
            f"| {fnum(sp, 2) + 'x' if sp else '-'} | {fnum(bound, 4)} "
            f"| {fnum(ratio, 2) + 'x' if ratio else '-'} "
            f"| {f'{err:.1e}' if isinstance(err, (int, float)) else '-'} |")
    g = geomean([r.get("speedup") for r in rows])
    g_eager = geomean([r["eager_ms"] / r["stof_tuned_ms"] for r in rows
                       if isinstance(r.get("eager_ms"), (int, float))
                       and isinstance(r.get("stof_tuned_ms"), (int, float))])
    g_flex = geomean([r["flex_ms"] / r["stof_tuned_ms"] for r in rows
                      if isinstance(r.get("flex_ms"), (int, float))
                      and isinstance(r.get("stof_tuned_ms"), (int, float))])
    g_fuse = geomean([r["stof_unfused_ms"] / r["stof_tuned_ms"] for r in rows
                      if isinstance(r.get("stof_unfused_ms"), (int, float))
                      and isinstance(r.get("stof_tuned_ms"), (int, float))])
    n_sp = sum(1 for r in rows if r.get("speedup"))
    lines += ["", "Geometric-mean speedup of stof tuned: "
              f"over the better torch.compile variant {fnum(g, 2)}x ({n_sp} cases), "
              f"over compile-flex {fnum(g_flex, 2)}x, over eager {fnum(g_eager, 2)}x; "
              f"tuned over stof all-unfused {fnum(g_fuse, 2)}x."]
    lines += ["", "Columns: times in ms. stof tuned = `stof run plan.json` (CUDA graph) after "
              "`stof tune`; stof unfused = `stof run --scheme unfused` (CUDA graph; every "
              "operator its own kernel, stof's sparse attention kernel included); stof fusion "
              "only = the same model tuned and run with the mask removed (dense attention "
              "through stof's kernel; '-' where the mask is already none); eager = "
              "PyTorch SDPA with the dense mask; compile-flex = torch.compile with "
              "FlexAttention + BlockMask; compile-ro = torch.compile with SDPA + mask, one CUDA "
              "graph per forward. weight-read bound (at (1, 128) only) = bytes of the non-"
              f"embedding weights / HBM bandwidth ({bw / 1e12 if bw else 0:.2f} TB/s); stof err "
              "= relative error of stof's output against the first PyTorch variant's."]
    lines += ["", "Tuning time (paper Table 4 style):", "",
              "| model | mask | (batch, seq) | `stof tune` wall s | plan tuning_s | settings "
              "measured | tuned scheme(s) | compile-flex first call s | compile-ro first call s |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        schemes = ", ".join(r.get("plan_schemes") or []) or "-"
        tw = r.get("tune_wall_s")
        if tw and r.get("tune_attempts", 1) > 1:
            schemes += f" ({r['tune_attempts']} tries)"
        lines.append(
            f"| {r['model']} | {r.get('mask_label', r['mask'])} | ({r['batch']}, {r['seq']}) "
            f"| {fnum(tw, 1) if tw else ('error' if r.get('stof_tuned_error') else '-')} "
            f"| {fnum(r.get('plan_tuning_s'), 1)} | {r.get('plan_settings_measured', '-')} "
            f"| {schemes} | {fnum(r.get('flex_first_s'), 1)} | {fnum(r.get('ro_first_s'), 1)} |")
    val = data.get("validation", {})
    if val:
        lines += ["", "Plain-torch forward (bench/torch_models.py) against transformers, fp16, "
                  "dense, (1, 128):"]
        for m, v in val.items():
            if "error" in v:
                lines.append(f"- {m}: error {v['error']}")
            else:
                mm = "; mismatches: " + "; ".join(v["mismatches"]) if v.get("mismatches") else ""
                lines.append(f"- {m}: rel err {v['rel_err']:.1e}, max abs {v['max_abs']:.1e}, "
                             f"{'ok' if v['ok'] else 'DIFFERS'}{mm}")
    errors = [(r, k, v) for r in rows for k, v in r.items()
              if k.endswith("_error") and v and len(str(v)) > 24]
    if errors:
        lines += ["", "Errors in full:"]
        for r, k, v in errors:
            lines.append(f"- {r['model']} {r.get('mask_label', r['mask'])} ({r['batch']}, "
                         f"{r['seq']}) {k[:-6]}: {v}")
    return "\n".join(lines) + "\n"


# ---- main ---------------------------------------------------------------------------------------

def parse_shapes(text):
    out = []
    for part in text.split(","):
        b, s = part.lower().split("x")
        out.append((int(b), int(s)))
    return out


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def save_json(data, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True, default=str)
    os.replace(tmp, path)


def write_outputs(data, args):
    text = report(data)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    log("")
    log(text)
    log(f"wrote {args.out} and {args.json}")
    if args.plot_dir:
        try:
            import plot
            for p in plot.plot(data, args.plot_dir):
                log(f"wrote {p}")
        except Exception as e:
            log(f"plots: {short_error(e)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="bert-base and gpt2 at (1, 128) and (8, 512)")
    ap.add_argument("--models", default=None, help="comma list (default: " +
                    ",".join(DEFAULT_MODELS) + "; also t5-small)")
    ap.add_argument("--shapes", default=None, help="comma list of BxS (default "
                    "1x128,8x512,16x2048)")
    ap.add_argument("--masks", default=None, help="comma list of mask names for every model "
                    "(default: bert bigbird; gpt2 none,bigbird; t5 bigbird)")
    ap.add_argument("--runs", default=",".join(ALL_RUNS),
                    help="comma list of what to run: " + ",".join(ALL_RUNS))
    ap.add_argument("--time-limit", type=float, default=20, help="stof tune --time-limit in seconds (default 20)")
    ap.add_argument("--reps", type=int, default=20, help="timed runs (median)")
    ap.add_argument("--warmup", type=int, default=5, help="PyTorch warm-up runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile-scope", choices=["layer", "model"], default="model",
                    help="torch.compile the whole model (default; compile-ro = "
                         "mode='reduce-overhead') or each layer (faster to compile, but each "
                         "compiled call costs host time; compile-ro = one CUDA graph of the "
                         "forward)")
    ap.add_argument("--bandwidth", type=float, default=None,
                    help="HBM bytes/s for the weight-read bound (default: from the GPU name: "
                         "H200 4.8e12, H100 3.35e12)")
    ap.add_argument("--no-stof-weights", dest="stof_weights", action="store_false",
                    help="let stof draw its own weights (no --weights/--inputs/--save-output; "
                         "no output check)")
    ap.add_argument("--max-wall", type=float, default=540,
                    help="start no case after this many seconds (default 540, for a 10-minute command limit; 0: no limit); --resume goes on from there")
    ap.add_argument("--resume", action="store_true", help="keep the cases already in --json")
    ap.add_argument("--report-only", action="store_true",
                    help="write the tables (and plots) from --json and stop")
    ap.add_argument("--stof", default="build/stof")
    ap.add_argument("--work-dir", default=os.path.join(sc.ROOT, "build", "e2e"))
    ap.add_argument("--out", default=os.path.join(sc.ROOT, "bench", "out", "e2e.md"))
    ap.add_argument("--json", default=os.path.join(sc.ROOT, "bench", "out", "e2e.json"))
    ap.add_argument("--plot-dir", default=None)
    args = ap.parse_args()
    t_start = time.time()

    if args.report_only:
        data = load_json(args.json)
        if not data:
            raise SystemExit(f"--report-only: cannot read {args.json}")
        write_outputs(data, args)
        return

    models = (args.models.split(",") if args.models else
              (QUICK_MODELS if args.quick else DEFAULT_MODELS))
    shapes = parse_shapes(args.shapes) if args.shapes else (
        QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    args.runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    for r in args.runs:
        if r not in ALL_RUNS:
            raise SystemExit(f"--runs: unknown {r!r} (one of {', '.join(ALL_RUNS)})")
    for m in models:
        if m not in FAMILY:
            raise SystemExit(f"unknown model {m!r} (one of {', '.join(FAMILY)})")

    import torch
    import torch_models as tm
    if not torch.cuda.is_available():
        raise SystemExit("e2e.py needs a CUDA GPU")
    torch.set_grad_enabled(False)
    configure_dynamo()
    stof = sc.resolve_stof(args.stof)
    os.makedirs(args.work_dir, exist_ok=True)
    device = torch.cuda.get_device_name()
    if args.bandwidth is None:
        args.bandwidth = bandwidth_for(device)
        if not args.bandwidth:
            log(f"unknown HBM bandwidth for {device}: no weight-read bound (give --bandwidth)")
    try:
        import transformers
        tf_version = transformers.__version__
    except ImportError:
        tf_version = "missing"

    data = load_json(args.json) if args.resume else None
    meta = {"device": device, "date": str(datetime.date.today()), "commit": sc.stof_commit(stof),
            "torch": torch.__version__, "transformers": tf_version, "reps": args.reps,
            "time_limit": args.time_limit, "compile_scope": args.compile_scope,
            "bandwidth": args.bandwidth, "seed": args.seed,
            "stof_weights_note": "loaded from the transformers model (--weights)"
            if args.stof_weights else "stof's own random weights (--no-stof-weights)"}
    if data:
        old = data.get("meta", {})
        for k in ("commit", "device"):
            if old.get(k) != meta[k]:
                log(f"--resume: the saved cases were measured with {k} {old.get(k)}, this run "
                    f"has {meta[k]}")
    else:
        data = {"cases": {}, "validation": {}}
    data["meta"] = meta
    log(f"e2e: {device}; stof commit {meta['commit']}; torch {torch.__version__}, transformers "
        f"{tf_version}; models {','.join(models)}; shapes "
        f"{','.join(f'{b}x{s}' for b, s in shapes)}; runs {','.join(args.runs)}")

    todo = []
    for model in models:
        masks = args.masks.split(",") if args.masks else DEFAULT_MASKS[FAMILY[model]]
        for batch, seq in shapes:
            for mask in masks:
                if case_key(model, mask, batch, seq) not in data["cases"]:
                    todo.append((model, mask, batch, seq))
    log(f"{len(todo)} cases to run ({len(data['cases'])} already in {args.json})")

    durations, stopped = [], False
    for model in models:
        cases = [c for c in todo if c[0] == model]
        if not cases or stopped:
            continue
        try:
            log(f"== {model}: building the transformers model")
            max_seq = max(c[3] for c in cases)
            hf = tm.build_hf_model(model, max(max_seq, 128), seed=args.seed)
            st = ModelState(model, tm.canonical_state_dict(model, hf), args)
            st.hf = hf
            if model not in data["validation"]:
                try:
                    v = validate(model, st, args)
                except Exception as e:
                    v = {"error": short_error(e), "ok": False}
                data["validation"][model] = v
                log(f"  torch forward vs transformers (fp16, dense, 1x128): "
                    + (f"rel err {v['rel_err']:.1e} {'ok' if v['ok'] else 'DIFFERS'}"
                       if "rel_err" in v else v["error"]))
                for m in v.get("mismatches", []):
                    log(f"  MISMATCH {m}")
                save_json(data, args.json)
            st.hf = None
            del hf
            cleanup()
        except Exception as e:
            log(f"  {model}: cannot build: {short_error(e)}")
            for c in cases:
                data["cases"][case_key(*c)] = {
                    "model": c[0], "mask": c[1], "mask_label": mask_label(c[0], c[1]),
                    "batch": c[2], "seq": c[3], "eager_error": "model: " + short_error(e)}
            save_json(data, args.json)
            continue
        for model_, mask, batch, seq in cases:
            elapsed = time.time() - t_start
            estimate = max(durations + [60.0 if seq < 2048 else 100.0])
            if args.max_wall and elapsed + estimate > args.max_wall:
                left = sum(1 for c in todo if case_key(*c) not in data["cases"])
                log(f"stopping: {elapsed:.0f} s spent, --max-wall {args.max_wall:.0f} s; "
                    f"run again with --resume for the {left} cases left")
                stopped = True
                break
            log(f"-- {model} {mask_label(model, mask)} batch {batch} seq {seq} "
                f"[{elapsed:.0f} s]")
            t_case = time.time()
            try:
                row = run_case(args, stof, st, model, mask, batch, seq)
            except Exception as e:  # whatever went wrong: recorded, and on to the next case
                log(f"   case failed: {short_error(e)}")
                row = {"model": model, "mask": mask, "mask_label": mask_label(model, mask),
                       "batch": batch, "seq": seq, "eager_error": "case: " + short_error(e),
                       "case_s": time.time() - t_case}
                cleanup()
            durations.append(row["case_s"])
            data["cases"][case_key(model, mask, batch, seq)] = row
            save_json(data, args.json)
            sp = row.get("speedup")
            log(f"   -> {row['case_s']:.0f} s" + (f"; speedup vs best compile {sp:.2f}x"
                                                  if sp else ""))
        del st
        cleanup()
    left = sum(1 for c in todo if case_key(*c) not in data["cases"])
    write_outputs(data, args)
    log(f"done in {time.time() - t_start:.0f} s" +
        (f"; {left} cases not run (--max-wall): rerun with --resume" if left else ""))


if __name__ == "__main__":
    main()
