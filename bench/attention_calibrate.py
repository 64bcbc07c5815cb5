"""Measures the costs of the attention kernels on this GPU: the data of the cost model.

For every setting the planner ranks (block-wise BLOCK_M x BLOCK_N with its warps, in the
automatic build; the row-wise kernel) at every head size the kernels are built for (32, 64, 80,
128), it times seven problems whose
work per tile is known exactly, and fits the six costs of core/exec/attention/mha_exec_cost.h:

  P1 dense, (8, 12 heads, 2048)      many tiles of 2048 keys       -> THR_TILE, THR_FULL
  P2 dense, (32, 12 heads, 256)      many tiles of 256 keys           (with P1)
  P3 every other key, (8, 12, 2048)  every block partial           -> THR_PART
  P4 dense, 8 tiles x 8192 keys      8 tiles, each alone on an SM  -> LAT_FULL
  P5 dense, 8 tiles x 1024 keys                                       (with P4)
  P6 dense, 8 tiles x one key block                                -> LAT_TILE
  P7 every other key, 8 tiles x 8192 keys                          -> LAT_PART

Times are the GPU's (launches replayed from a CUDA graph, as plans run them). A throughput
problem takes ceil(tiles / SMs) x (THR_TILE + blocks x THR_*), the model's
makespan of equal tiles. The lines of this GPU's architecture in kernels/attention_cost.txt
are replaced (other architectures' are kept), with a comment saying where and when they were
measured; --raw keeps every timing.

    python3 bench/attention_calibrate.py [--out kernels/attention_cost.txt] [--raw FILE]
"""
import argparse
import datetime
import json
import math
import multiprocessing
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

HEADS = 12
HEAD_DIMS = (32, 64, 80, 128)  # every head size the kernels are built for
SIZES = (16, 32, 64, 128)
WARPS = (1, 2, 4, 8)
ROW_SETTING = (1, 4)  # the row-wise kernel's default: 1 row a warp, 4 warps a block
FRAG_REGS = 160       # mha_exec_block_regs_ok
MAX_ROWS_PER_WARP = 64
MAX_SCORES_PER_THREAD = 128


def block_settings(head_dim):
    """The block-wise settings the planner ranks: the selector's table (ops/mha_select.h)
    without the ones that spill (mha_exec_block_regs_ok); shared memory is checked by planning."""
    out = []
    for bm in SIZES:
        for bn in SIZES:
            for w in WARPS:
                rows = bm // w
                if w * 16 > bm or rows > MAX_ROWS_PER_WARP or w * 32 > 1024:
                    continue
                if rows * bn // 32 > MAX_SCORES_PER_THREAD:
                    continue
                if rows // 16 * (head_dim // 2 + bn // 2) > FRAG_REGS:
                    continue
                out.append((bm, bn, w))
    return out


def problems(kind, a, b):
    """(name, batch, q_len, k_len, mask kind) of the seven problems of a setting; a = BLOCK_M
    (row-wise: rows a tile)."""
    one = b if kind == "block" else 16
    return [("P1", 8, 2048, 2048, "dense"), ("P2", 32, 256, 256, "dense"),
            ("P3", 8, 2048, 2048, "alternate"), ("P4", 1, 8 * a, 8192, "dense"),
            ("P5", 1, 8 * a, 1024, "dense"), ("P6", 1, 8 * a, one, "dense"),
            ("P7", 1, 8 * a, 8192, "alternate")]


def plan(ctx, stof, kind, a, b, c, head_dim, batch, heads, q_len, k_len, mask_kind,
         dtype="fp16"):
    import numpy as np
    mask = None
    if mask_kind not in ("dense", "alternate"):  # a pattern's text
        mask = stof.Mask.pattern(mask_kind, q_len=q_len, k_len=k_len)
    if mask_kind == "alternate":
        dense = np.zeros((q_len, k_len), dtype=np.uint8)
        dense[:, ::2] = 1
        mask = stof.Mask.dense(dense)
    kw = dict(batch=batch, heads=heads, head_dim=head_dim, q_len=q_len, k_len=k_len, mask=mask,
              dtype=dtype, measure=-1)
    if kind == "block":
        kw.update(kernel="block", block_m=a, block_n=b, num_warps=c)
    else:
        kw.update(kernel="row")
    return ctx.attention(**kw), mask


def compile_worker(jobs):
    """Plans each setting (kind, a, b, c, head_dim[, dtype]) once, its kernel into the disk
    cache; with a dtype, also a plan that splits its rows (Longformer's global rows), the
    other build. Returns the settings that fail."""
    import stof
    ctx = stof.Context()
    failed = []
    for job in jobs:
        kind, a, b, c, d, dtype = (tuple(job) + ("fp16",))[:6]
        try:
            plan(ctx, stof, kind, a, b, c, d, 1, 1, 256, 256, "dense", dtype)
            if len(job) > 5 and kind == "block":
                plan(ctx, stof, kind, a, b, c, d, 1, 1, 4096, 4096, "longformer", dtype)
        except stof.StofError as e:
            failed.append((tuple(job), str(e)))
    return failed


def precompile(settings, procs):
    jobs = [settings[i::procs] for i in range(procs)]
    with multiprocessing.get_context("spawn").Pool(procs) as pool:
        failed = [f for part in pool.map(compile_worker, jobs) for f in part]
    return dict(failed)


def time_problem(stof, sc, ctx, setting, p):
    import torch
    kind, a, b, c, d = setting
    name, batch, q_len, k_len, mask_kind = p
    heads = HEADS if name in ("P1", "P2", "P3") else 1
    attn, mask = plan(ctx, stof, kind, a, b, c, d, batch, heads, q_len, k_len, mask_kind)
    q = torch.empty(batch, q_len, heads * d, dtype=torch.float16, device="cuda").uniform_(-1, 1)
    kv = torch.empty(batch, k_len, 2 * heads * d, dtype=torch.float16,
                     device="cuda").uniform_(-1, 1)
    k, v = kv[..., :heads * d], kv[..., heads * d:]
    out = torch.empty_like(q)
    out.fill_(float("nan"))
    attn.run(q, k, v, out)
    torch.cuda.synchronize()
    if not bool(torch.isfinite(out).all().item()):
        raise RuntimeError(f"{setting} {name}: output not finite")
    return sc.graph_time_ms(lambda: attn.run(q, k, v, out)) * 1e3  # us


def tiles(kind, a, b, p, d):
    """(tiles, key blocks a tile) of a problem, as the model counts them."""
    name, batch, q_len, k_len, _ = p
    heads = HEADS if name in ("P1", "P2", "P3") else 1
    n_tiles = batch * heads * math.ceil(q_len / a)
    per_tile = math.ceil(k_len / b) if kind == "block" else a * k_len  # row-wise: pairs
    return n_tiles, per_tile


def fit_pair(x1, y1, x2, y2):
    """y = c0 + x c1 through two points, c0 >= 0 and c1 >= 0 (least squares through the
    origin when the intercept would be negative)."""
    c1 = (y1 - y2) / (x1 - x2)
    c0 = y2 - x2 * c1
    if c0 < 0 or c1 < 0:
        c0, c1 = 0.0, (x1 * y1 + x2 * y2) / (x1 * x1 + x2 * x2)
    return max(c0, 0.0), max(c1, 0.0)


def fit(setting, t, sms):
    kind, a, b, c, d = setting
    ps = {p[0]: p for p in problems(kind, a, b)}
    per = {}
    for name in ("P1", "P2", "P3"):
        n, blocks = tiles(kind, a, b, ps[name], d)
        per[name] = (t[name] / math.ceil(n / sms), blocks)
    thr_tile, thr_full = fit_pair(per["P1"][1], per["P1"][0], per["P2"][1], per["P2"][0])
    thr_part = max(0.0, (per["P3"][0] - thr_tile) / per["P3"][1]) if kind == "block" else thr_full
    if kind == "block":
        l4, l5, l6 = math.ceil(8192 / b), math.ceil(1024 / b), 1
    else:  # the longest row's keys x rows a warp
        l4, l5, l6 = 8192 * ROW_SETTING[0], 1024 * ROW_SETTING[0], 16 * ROW_SETTING[0]
    lat_full = max(0.0, (t["P4"] - t["P5"]) / (l4 - l5))
    lat_tile = max(0.0, t["P6"] - l6 * lat_full)
    lat_part = max(0.0, (t["P7"] - lat_tile) / l4) if kind == "block" else lat_full
    return thr_tile, thr_full, thr_part, lat_tile, lat_full, lat_part


def write_costs(path, arch, lines, header):
    """The file's general comments, then every other architecture's lines (and their
    comment), then this one's."""
    general, others = [], []
    if os.path.exists(path):
        with open(path) as f:
            for line in f.read().splitlines():
                words = line.lstrip("# ").split()
                line_arch = words[0].rstrip(":") if words and words[0].startswith("sm_") else None
                if line_arch is None and not others:
                    general.append(line)
                elif line_arch and line_arch != arch:
                    others.append(line)
    with open(path, "w") as f:
        f.write("\n".join(general + others + header + lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "..", "kernels", "attention_cost.txt"))
    ap.add_argument("--raw", default=None, help="JSON file of every timing")
    ap.add_argument("--procs", type=int, default=12, help="processes compiling ahead")
    args = ap.parse_args()
    import stof
    import stof_cli as sc
    ctx = stof.Context()
    dev = ctx.device()
    arch = f"sm_{dev.cc_major}{dev.cc_minor}"
    settings = [("block", bm, bn, w, d) for d in HEAD_DIMS for bm, bn, w in block_settings(d)]
    settings += [("row", ROW_SETTING[0] * ROW_SETTING[1], 1, 0, d) for d in HEAD_DIMS]
    failed = precompile(settings, args.procs)
    for s, why in failed.items():
        print(f"skipped {s}: {why}", flush=True)
    raw, lines = {}, []
    for s in settings:
        if s in failed:
            continue
        kind, a, b, c, d = s
        t = {p[0]: time_problem(stof, sc, ctx, s, p) for p in problems(kind, a, b)}
        raw[" ".join(map(str, s))] = t
        costs = fit(s, t, dev.sm_count)
        sizes = f"{a} {b} {c}" if kind == "block" else f"{ROW_SETTING[0]} {ROW_SETTING[1]} 0"
        lines.append(f"{arch} {d} {kind} {sizes} " + " ".join(f"{x:.6g}" for x in costs))
        print(lines[-1], " | ", " ".join(f"{k}={v:.1f}" for k, v in t.items()), flush=True)
    commit = os.environ.get("STOF_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    header = [f"# {arch}: measured on {dev.name.decode()} ({dev.sm_count} SMs), "
              f"{datetime.date.today()}, commit {commit or '?'}, fp16, {HEADS} heads, "
              f"by bench/attention_calibrate.py"]
    write_costs(args.out, arch, lines, header)
    if args.raw:
        with open(args.raw, "w") as f:
            json.dump({"device": dev.name.decode(), "sms": dev.sm_count, "times_us": raw}, f,
                      indent=1)
    print(f"wrote {len(lines)} settings of {arch} to {args.out}")


if __name__ == "__main__":
    main()
