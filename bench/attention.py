"""Masked multi-head attention: stof against PyTorch, side by side, in one run.

For each mask (Table 2 parameters: band = global = sqrt(seq_len)) and (batch, seq_len):
  - torch-native : scores = q k^T, masked_fill(-inf), softmax, @ v (materialized)
  - sdpa-mask    : scaled_dot_product_attention with the boolean mask
  - flex         : FlexAttention (torch.compile), BlockMask built from the same mask
  - flash-dense  : scaled_dot_product_attention without a mask (dense FlashAttention)
  - stof         : stof's fused kernel chosen by the analytical selector
All on the same fp16 inputs (12 heads of 64), median of many runs after warm-up (CUDA
events), stof's output checked against sdpa-mask's. Writes a markdown table.

    python3 bench/attention.py [--quick] [--out bench/out/attention.md]
"""
import argparse
import datetime
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--check-only", action="store_true", help="correctness, no timing")
    ap.add_argument("--out", default="bench/out/attention.md")
    ap.add_argument("--measure", type=int, default=MEASURE,
                    help="candidates stof times when planning (0: analytical choice)")
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
