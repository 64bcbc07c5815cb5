"""Masked multi-head attention: stof against PyTorch, side by side, in one run.

Default: for each mask (Table 2 parameters: band = global = sqrt(seq_len)) and (batch, seq_len):
  - torch-native : scores = q k^T, masked_fill(-inf), softmax, @ v (materialized)
  - sdpa-mask    : scaled_dot_product_attention with the boolean mask
  - flex         : FlexAttention (torch.compile), BlockMask built from the same mask
  - flash-dense  : scaled_dot_product_attention without a mask (dense FlashAttention)
  - stof         : stof's fused kernel chosen by the analytical selector
All on the same fp16 inputs (12 heads of 64), median of many runs after warm-up (CUDA
events), stof's output checked against sdpa-mask's. Writes a markdown table.

--choice: the kernel choice over CASES (the paper's four masks, causal, causal + window,
documents, random blocks of 16/64/128 at several rates, key padding, per-batch masks; head
sizes 64 and 128; fp16 and bf16; (1, 128) to (16, 8192)). For each case: the planner's
analytical choice (measure=-1: the calibrated cost model), every setting the planner ranks
timed one by one (the measured best), the paper's Eq. 2 choice, dense SDPA (its own choice of
backend, and its FlashAttention backend) and FlexAttention; the summary counts the cases within
10% and 25% of the measured best.

    python3 bench/attention.py [--quick] [--out bench/out/attention.md]
    python3 bench/attention.py --choice [--part K/N] [--no-flex] [--out FILE]
"""
import argparse
import datetime
import json
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import stof  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stof_cli as sc  # noqa: E402

MASKS = ["sliding_window", "dilated", "longformer", "bigbird"]
SHAPES = [(1, 128), (1, 512), (8, 512), (8, 1024), (16, 2048), (1, 4096), (16, 4096)]
HEADS, HEAD_DIM = 12, 64
MEASURE = 6  # plan-time timing of the selector's best candidates (0: analytical only)


def median_ms(fn, warmup=5, reps=30):
    return sc.time_ms(fn, warmup, reps)


def flex_block_mask(dense, seq):
    from torch.nn.attention.flex_attention import create_block_mask
    dm = dense

    def mask_mod(b, h, q, kv):
        return dm[q, kv]

    return create_block_mask(mask_mod, None, None, seq, seq, device="cuda")


_flex = None


def flex_fn():
    global _flex
    if _flex is None:
        from torch.nn.attention.flex_attention import flex_attention
        _flex = torch.compile(flex_attention, dynamic=False)
    return _flex


def run_case(ctx, mask_name, batch, seq, check_only=False, measure=MEASURE):
    H, D = HEADS, HEAD_DIM
    mask = stof.Mask.pattern(mask_name, q_len=seq)
    dense = torch.from_numpy(mask.to_dense(0)).bool().cuda()
    nnz = int(dense.sum().item())
    qkv = torch.empty(batch, seq, 3 * H * D, dtype=torch.float16, device="cuda").uniform_(-1, 1)
    q, k, v = (qkv[..., i * H * D:(i + 1) * H * D].view(batch, seq, H, D).transpose(1, 2)
               for i in range(3))
    scale = 1.0 / math.sqrt(D)
    attn = ctx.attention(batch=batch, heads=H, head_dim=D, q_len=seq, mask=mask,
                         measure=measure)
    # the analytical choice alone (not a measured one remembered from an earlier run)
    analytical = ctx.attention(batch=batch, heads=H, head_dim=D, q_len=seq, mask=mask,
                               measure=-1)
    out = torch.empty(batch, seq, H * D, dtype=torch.float16, device="cuda")

    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=scale)
    ref = ref.transpose(1, 2).reshape(batch, seq, H * D)
    out.fill_(float("nan"))
    attn(qkv, out)
    torch.cuda.synchronize()
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    finite = bool(torch.isfinite(out).all().item())

    def native():
        s = (q @ k.transpose(-1, -2)) * scale
        s = s.masked_fill(~dense, float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    row = {"mask": mask_name, "batch": batch, "seq": seq, "density": nnz / seq / seq,
           "kernel": attn.describe(), "rel_err": err, "finite": finite}
    if check_only:
        return row
    row["stof"] = median_ms(attn.bind(qkv, out))
    row["stof-eq2"] = median_ms(analytical.bind(qkv, out))
    row["kernel-eq2"] = analytical.describe()
    row["flash-dense"] = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, scale=scale))
    row["sdpa-mask"] = median_ms(
        lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=scale))
    try:
        row["torch-native"] = median_ms(native, reps=10)
    except torch.OutOfMemoryError:
        row["torch-native"] = float("nan")
    torch.cuda.empty_cache()
    bm = flex_block_mask(dense, seq)
    flex = flex_fn()
    row["flex"] = median_ms(lambda: flex(q, k, v, block_mask=bm, scale=scale))
    row["tflops"] = 4.0 * batch * H * nnz * D / (row["stof"] * 1e-3) / 1e12
    return row


def short_kernel(describe):
    """'block-wise BLOCK_M=64 BLOCK_N=32 warps=4 ...' -> 'block 64x32 w4'
    (' wgmma' and ' tma' kept)."""
    import re
    m = re.search(r"block-wise( wgmma)? BLOCK_M=(\d+) BLOCK_N=(\d+) "
                  r"warps=(\d+)(?: stages=\d+( tma)?)?", describe)
    if m:
        return (f"block {m.group(2)}x{m.group(3)} w{m.group(4)}{m.group(1) or ''}"
                f"{m.group(5) or ''}")
    m = re.search(r"row-wise rows/warp=(\d+) warps=(\d+)", describe)
    return f"row {m.group(1)}x{m.group(2)}" if m else describe[:40]


def markdown(rows, device, commit):
    lines = [f"Device: {device}; date {datetime.date.today()}; commit {commit}; "
             f"{HEADS} heads x {HEAD_DIM}, fp16, median of 30 runs (ms).", "",
             "stof: plan measured among the selector's best candidates; stof-eq2: the "
             "analytical choice alone (paper Eq. 1, 2).", "",
             "| mask | B | S | density | stof kernel | stof | stof-eq2 | flex | sdpa-mask "
             "| torch-native | flash-dense | vs flex | vs dense | useful TFLOP/s | rel err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['mask']} | {r['batch']} | {r['seq']} | {r['density']:.3f} | {short_kernel(r['kernel'])} "
            f"| {r['stof']:.3f} | {r['stof-eq2']:.3f} | {r['flex']:.3f} | {r['sdpa-mask']:.3f} | "
            f"{r['torch-native']:.3f} | {r['flash-dense']:.3f} | {r['flex'] / r['stof']:.2f}x "
            f"| {r['flash-dense'] / r['stof']:.2f}x | {r['tflops']:.1f} | {r['rel_err']:.1e} |")
    speedups = [r["flex"] / r["stof"] for r in rows]
    geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
    slower_than_dense = sum(r["stof"] > r["flash-dense"] for r in rows)
    lines += ["", f"Geometric-mean speedup over FlexAttention: {geo:.2f}x; "
              f"cases slower than dense FlashAttention: {slower_than_dense} of {len(rows)}."]
    return "\n".join(lines)

# ---- --choice: the analytical choice against a measured sweep ---------------------------

PAPER = ["sliding_window", "dilated", "longformer", "bigbird"]


def _cases():
    """(label, mask kind, mask argument, batch, seq, head_dim, dtype): 42 cases."""
    c = []
    for m in PAPER:
        c += [(m, "text", m, 1, 128, 64, "fp16"), (m, "text", m, 8, 1024, 64, "bf16"),
              (m, "text", m, 16, 2048, 128, "fp16"), (m, "text", m, 4, 8192, 64, "fp16")]
    c += [("bigbird", "text", "bigbird", 16, 8192, 64, "fp16"),
          ("sliding_window", "text", "sliding_window", 16, 8192, 128, "bf16"),
          ("dilated", "text", "dilated", 1, 2048, 128, "bf16"),
          ("longformer", "text", "longformer", 2, 512, 128, "fp16")]
    for b, s, d, t in [(1, 128, 128, "fp16"), (1, 512, 64, "fp16"), (16, 2048, 64, "bf16"),
                       (2, 8192, 128, "fp16")]:
        c.append(("causal", "text", "causal", b, s, d, t))
    win = "intersect(causal, sliding_window{band=256})"
    for b, s, d, t in [(8, 2048, 64, "fp16"), (16, 4096, 128, "bf16"), (1, 8192, 64, "fp16")]:
        c.append(("causal+window 256", "text", win, b, s, d, t))
    for b, s, d, t in [(8, 1024, 64, "fp16"), (16, 4096, 64, "bf16"), (4, 8192, 128, "fp16")]:
        c.append(("documents", "documents", 7, b, s, d, t))
    for blk, rate, b, s, d, t in [(16, 0.05, 8, 2048, 64, "fp16"), (16, 0.2, 4, 4096, 128, "bf16"),
                                  (16, 0.5, 1, 1024, 64, "bf16"), (64, 0.1, 16, 2048, 64, "fp16"),
                                  (64, 0.3, 2, 8192, 64, "bf16"), (128, 0.2, 8, 4096, 128, "fp16"),
                                  (128, 0.5, 1, 8192, 64, "fp16")]:
        c.append((f"random {blk} @{rate}", "text",
                  f"random{{rate={rate},block={blk},seed=11}}", b, s, d, t))
    for b, s, d, t in [(16, 512, 64, "fp16"), (8, 2048, 128, "bf16"), (4, 4096, 64, "fp16")]:
        c.append(("key padding 25-100%", "padding", 3, b, s, d, t))
    for b, s, d, t in [(4, 1024, 64, "fp16"), (4, 4096, 128, "bf16")]:
        c.append(("per-batch (4 patterns)", "text",
                  "per_batch(sliding_window, bigbird, causal, longformer)", b, s, d, t))
    return c


CASES = _cases()


def case_mask(kind, arg, batch, seq):
    """The stof mask and its dense [stored batch, seq, seq] bool array."""
    import numpy as np
    if kind == "documents":  # packed documents of random lengths, different in each batch
        rng = np.random.default_rng(arg)
        dense = np.zeros((batch, seq, seq), dtype=np.uint8)
        for b in range(batch):
            start = 0
            while start < seq:
                n = int(rng.integers(seq // 16, seq // 3))
                dense[b, start:start + n, start:start + n] = 1
                start += n
        return stof.Mask.dense(dense), dense.astype(bool)
    if kind == "padding":  # key padding, lengths drawn from 25-100% of seq
        rng = np.random.default_rng(arg)
        lengths = [int(rng.integers(seq // 4, seq + 1)) for _ in range(batch)]
        arg = "key_padding{lengths=[" + ",".join(map(str, lengths)) + "]}"
    mask = stof.Mask.pattern(arg, q_len=seq, batch=batch)
    stored = mask.shape()[0]
    return mask, np.stack([mask.to_dense(b) for b in range(stored)]).astype(bool)


def _time_once_then(fn, best):
    """The GPU's time of fn (replayed from a CUDA graph), or a single run's when that is
    already 3x slower than best."""
    first = sc.time_ms(fn, 1, 1)
    if best is not None and first > 3 * best + 0.05:
        return first
    return sc.graph_time_ms(fn)


def sweep(ctx, mask, batch, seq, d, dtype, run_args):
    """Every setting the planner ranks, forced one by one: {short name: ms}."""
    import attention_calibrate as cal
    out, best = {}, None
    settings = [dict(kernel="block", block_m=bm, block_n=bn, num_warps=w)
                for bm, bn, w in cal.block_settings(d)] + [dict(kernel="row")]
    for kw in settings:
        try:
            a = ctx.attention(batch=batch, heads=HEADS, head_dim=d, q_len=seq, mask=mask,
                              dtype=dtype, measure=-1, **kw)
        except stof.StofError:
            continue
        t = _time_once_then(lambda: a.run(*run_args), best)
        out[short_kernel(a.describe())] = t
        best = t if best is None else min(best, t)
    return out


def choice_case(ctx, case, flex=True):
    label, kind, arg, batch, seq, d, dtype = case
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    mask, dense = case_mask(kind, arg, batch, seq)
    density = float(dense.mean())
    qkv = torch.empty(batch, seq, 3 * HEADS * d, dtype=tdt, device="cuda").uniform_(-1, 1)
    hd = HEADS * d
    q, k, v = qkv[..., :hd], qkv[..., hd:2 * hd], qkv[..., 2 * hd:]
    out = torch.empty(batch, seq, hd, dtype=tdt, device="cuda")
    args = (q, k, v, out)
    row = {"case": label, "batch": batch, "seq": seq, "d": d, "dtype": dtype,
           "density": density}
    a = ctx.attention(batch=batch, heads=HEADS, head_dim=d, q_len=seq, mask=mask, dtype=dtype,
                      measure=-1)
    row["choice"], row["reason"] = short_kernel(a.describe()), a.describe()
    # correctness of the choice on batch 0 against SDPA with the mask
    out.fill_(float("nan"))
    a.run(*args)
    qh, kh, vh = (t[:1].reshape(1, seq, HEADS, d).transpose(1, 2).float() for t in (q, k, v))
    dm = torch.from_numpy(dense[0]).cuda()
    ref = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=dm).transpose(1, 2)
    got = out[:1].float().reshape(1, seq, HEADS, d)
    ok_rows = dm.any(-1)[None, :, None, None]
    diff = torch.where(ok_rows, got - ref, torch.zeros_like(ref))
    row["rel_err"] = (diff.norm() / ref.where(ok_rows, torch.zeros_like(ref)).norm()).item()
    row["finite"] = bool(torch.isfinite(got.where(ok_rows, torch.zeros_like(got))).all())
    row["analytical"] = _time_once_then(lambda: a.run(*args), None)
    del a
    # the paper's model (Eq. 1, 2), what plans took before the cost model
    os.environ["STOF_ATTENTION_MODEL"] = "paper"
    try:
        e2 = ctx.attention(batch=batch, heads=HEADS, head_dim=d, q_len=seq, mask=mask,
                           dtype=dtype, measure=-1)
    finally:
        del os.environ["STOF_ATTENTION_MODEL"]
    row["eq2_kernel"] = short_kernel(e2.describe())
    row["eq2"] = _time_once_then(lambda: e2.run(*args), None)
    del e2
    times = sweep(ctx, mask, batch, seq, d, dtype, args)
    row["best_kernel"] = min(times, key=times.get)
    row["best"] = min(row["analytical"], times[row["best_kernel"]])
    row["swept"] = len(times)
    row["sweep"] = times
    qd, kd, vd = (t.reshape(batch, seq, HEADS, d).transpose(1, 2) for t in (q, k, v))
    row["flash-dense"] = sc.graph_time_ms(lambda: F.scaled_dot_product_attention(qd, kd, vd))
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # FlashAttention itself, not cuDNN's
        row["fa-dense"] = sc.graph_time_ms(lambda: F.scaled_dot_product_attention(qd, kd, vd))
    row["flex"] = float("nan")
    if flex:
        try:
            dmask = torch.from_numpy(dense).cuda()
            per_batch = dmask.shape[0] > 1

            def mask_mod(b, h, qi, ki):
                return dmask[b if per_batch else 0, qi, ki]

            from torch.nn.attention.flex_attention import create_block_mask
            bm = create_block_mask(mask_mod, batch if per_batch else None, None, seq, seq,
                                   device="cuda")
            fx = flex_fn()
            row["flex"] = sc.graph_time_ms(lambda: fx(qd, kd, vd, block_mask=bm))
        except Exception as e:  # noqa: BLE001 - the table says it failed
            print(f"  flex failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
    torch.cuda.empty_cache()
    return row


def choice_markdown(rows, device, commit):
    lines = [f"Device: {device}; date {datetime.date.today()}; commit {commit}; {HEADS} heads; "
             "ms: the GPU's time of one launch, replayed from a CUDA graph (FlexAttention call by "
             "call where it cannot be captured).", "",
             "analytical: the plan with nothing measured (measure=-1: the cost model); Eq. 2: "
             "the same with STOF_ATTENTION_MODEL=paper; best: the fastest of every setting the "
             "planner ranks, each forced and timed; sdpa-dense: SDPA without a mask (PyTorch's "
             "choice of backend); FA-dense: SDPA without a mask on its FlashAttention backend.",
             "",
             "| case | B | S | D | dtype | density | analytical | ms | best | ms | "
             "analytical / best | Eq. 2 | ms | sdpa-dense | FA-dense | flex | rel err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['batch']} | {r['seq']} | {r['d']} | {r['dtype']} "
            f"| {r['density']:.3f} | {r['choice']} | {r['analytical']:.3f} | {r['best_kernel']} "
            f"| {r['best']:.3f} | {r['analytical'] / r['best']:.2f} | {r['eq2_kernel']} "
            f"| {r['eq2']:.3f} | {r['flash-dense']:.3f} | {r['fa-dense']:.3f} | {r['flex']:.3f} "
            f"| {r['rel_err']:.1e} |")
    ratios = [r["analytical"] / r["best"] for r in rows]
    eq2 = [r["eq2"] / r["best"] for r in rows]
    lines += ["", f"Cases: {len(rows)}; analytical within 10% of the best: "
              f"{sum(x <= 1.10 for x in ratios)}; within 25%: {sum(x <= 1.25 for x in ratios)}; "
              f"worst {max(ratios):.2f}x (Eq. 2: {sum(x <= 1.10 for x in eq2)} within 10%, "
              f"{sum(x <= 1.25 for x in eq2)} within 25%, worst {max(eq2):.2f}x). "
              f"Analytical slower than dense SDPA: "
              f"{sum(r['analytical'] > r['flash-dense'] for r in rows)}; than dense "
              f"FlashAttention: {sum(r['analytical'] > r['fa-dense'] for r in rows)}."]
    return "\n".join(lines)


def choice_main(args, ctx, device, commit):
    import attention_calibrate as cal
    torch._dynamo.config.cache_size_limit = 256
    k, n = (int(x) for x in args.part.split("/"))
    cases = CASES[k::n]
    if args.quick:
        cases = cases[::4]
    settings = [("block", bm, bn, w, d) for d in (64, 128) for bm, bn, w in cal.block_settings(d)]
    cal.precompile([s + (t,) for s in settings for t in ("fp16", "bf16")], args.procs)
    rows = []
    for case in cases:
        r = choice_case(ctx, case, flex=not args.no_flex)
        status = "ok" if r["finite"] and r["rel_err"] < 1e-2 else "WRONG"
        print(f"{r['case']:24s} B={r['batch']:2d} S={r['seq']:5d} D={r['d']} {r['dtype']} "
              f"{r['choice']:22s} {r['analytical']:.3f} best {r['best_kernel']:22s} "
              f"{r['best']:.3f} ({r['analytical'] / r['best']:.2f}) eq2 {r['eq2']:.3f} dense "
              f"{r['flash-dense']:.3f} fa {r['fa-dense']:.3f} flex {r['flex']:.3f} {status}",
              flush=True)
        rows.append(r)
    text = choice_markdown(rows, device, commit)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    print(text)



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--check-only", action="store_true", help="correctness, no timing")
    ap.add_argument("--out", default="bench/out/attention.md")
    ap.add_argument("--measure", type=int, default=MEASURE,
                    help="candidates stof times when planning (0: analytical choice)")
    ap.add_argument("--choice", action="store_true",
                    help="the analytical choice against a measured sweep over CASES")
    ap.add_argument("--part", default="0/1", help="--choice: every N-th case from K (K/N)")
    ap.add_argument("--no-flex", action="store_true", help="--choice: skip FlexAttention")
    ap.add_argument("--procs", type=int, default=12, help="--choice: processes compiling ahead")
    args = ap.parse_args()
    ctx = stof.Context()
    dev = ctx.device()
    device = f"{dev.name.decode()} (sm_{dev.cc_major}{dev.cc_minor}, {dev.sm_count} SMs)"
    commit = os.environ.get("STOF_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"],
                                    capture_output=True, text=True).stdout.strip() or "?"
        except OSError:
            commit = "?"
    if args.choice:
        return choice_main(args, ctx, device, commit)
    shapes = SHAPES[:4] + SHAPES[-1:] if args.quick else SHAPES
    rows = []
    for mask_name in MASKS:
        for batch, seq in shapes:
            r = run_case(ctx, mask_name, batch, seq, args.check_only, args.measure)
            status = "ok" if r["finite"] and r["rel_err"] < 1e-2 else "WRONG"
            timing = "" if args.check_only else (
                f" stof {r['stof']:.3f} ms flex {r['flex']:.3f} dense {r['flash-dense']:.3f}")
            print(f"{mask_name:15s} B={batch:2d} S={seq:5d} {r['kernel']:45s} "
                  f"err {r['rel_err']:.1e} {status}{timing}", flush=True)
            rows.append(r)
    if not args.check_only:
        text = markdown(rows, device, commit)
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
        print(text)


if __name__ == "__main__":
    main()
