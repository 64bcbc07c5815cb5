"""Hardware floors that bound what any kernel can reach on this GPU, measured.

The attention and end-to-end targets are judged against these:
  - L2 read bandwidth: the rate at which all SMs together can read data that is
    already in L2 (16-byte loads that bypass L1, as cp.async.cg does), for a
    stream and for the block-wise attention kernel's access pattern: 32 keys x
    64 dims of K and of V, rows strided as in the packed [B, S, 3, H, D] QKV.
  - HBM read bandwidth (a buffer far larger than L2), for reference.
  - the time of one kernel node in a replayed CUDA graph, for an empty kernel
    and for a small one: the floor of every kernel a forward pass runs.
  - the cost of one grid-wide barrier in a persistent kernel (one program per
    SM, an atomic counter): the floor of every phase a single-kernel forward
    pass would need between operators that read each other's whole output.
  - cuBLAS (torch's F.linear) on every GEMM of a model's forward pass at 128
    tokens, in one replayed CUDA graph with each layer's own weights (so they
    stream from HBM as in the model), and its rate on a large GEMM: what a
    forward pass's projections alone take on the vendor's library, and what
    their FLOPs take at the best rate the GPU showed.

From these it derives the useful TFLOP/s a block-wise attention kernel can
reach on a mask when every tile reads its K and V from L2 (bytes per useful
FLOP at each tile height) and the least time a forward pass at (1, 128) can
take given how many global dependencies it has, set against the (1, 128)
target of 3x the weight-read time.

    python3 bench/bounds.py [--out bench/out/bounds.md]
"""
import argparse
import datetime
import os
import subprocess
import sys

import numpy as np
import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import stof  # noqa: E402
import torch_models  # noqa: E402


@triton.jit
def _stream_read(src, out, n_words, ITERS: tl.constexpr, BLOCK: tl.constexpr):
    """Program p reads ITERS chunks of BLOCK int32 words, strided over the buffer."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(ITERS):
        chunk = (pid + i * nprog) * BLOCK
        chunk = tl.multiple_of(chunk % n_words, BLOCK)  # n_words: whole chunks
        acc ^= tl.load(src + chunk + offs, cache_modifier=".cg")
    tl.store(out + pid * BLOCK + offs, acc)


@triton.jit
def _kv_block_read(qkv, out, seq_blocks, heads, row_words, head_words, kv_words,
                   ITERS: tl.constexpr, ROWS: tl.constexpr, DWORDS: tl.constexpr):
    """Program p reads ITERS (K, V) tile pairs of ROWS keys x DWORDS int32 words at
    pseudo-random (head, key block) positions of a packed [S, 3, H, D] buffer."""
    pid = tl.program_id(0)
    r = tl.arange(0, ROWS)
    c = tl.arange(0, DWORDS)
    acc = tl.zeros([ROWS, DWORDS], dtype=tl.int32)
    state = pid * 7919 + 12345
    for i in range(ITERS):
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        blk = state % seq_blocks
        h = (state // seq_blocks) % heads
        base = qkv + (blk * ROWS + r[:, None]) * row_words + h * head_words + c[None, :]
        acc ^= tl.load(base + kv_words, cache_modifier=".cg")       # K
        acc ^= tl.load(base + 2 * kv_words, cache_modifier=".cg")   # V
    tl.store(out + pid * ROWS * DWORDS + r[:, None] * DWORDS + c[None, :], acc)


@triton.jit
def _empty(out):
    pass


@triton.jit
def _grid_barriers(counter, out, N_BARRIERS: tl.constexpr):
    """One program per SM, N_BARRIERS grid-wide barriers on an atomic counter."""
    nprog = tl.num_programs(0)
    for b in range(N_BARRIERS):
        tl.atomic_add(counter, 1, sem="release", scope="gpu")
        target = (b + 1) * nprog
        seen = tl.load(counter, volatile=True)
        while seen < target:
            seen = tl.load(counter, volatile=True)
    tl.store(out + tl.program_id(0), 1)


def time_ms(fn, warmup=5, reps=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def stream_bandwidth(nbytes, programs, iters, block=2048):
    src = torch.randint(0, 1 << 30, (nbytes // 4,), dtype=torch.int32, device="cuda")
    out = torch.empty(programs * block, dtype=torch.int32, device="cuda")
    ms = time_ms(lambda: _stream_read[(programs,)](src, out, src.numel(), ITERS=iters,
                                                    BLOCK=block, num_warps=4))
    return programs * iters * block * 4 / (ms * 1e-3) / 1e12


def kv_block_bandwidth(seq, heads, head_dim, programs, iters, rows=32):
    words = head_dim // 2  # fp16 pairs as int32 words
    qkv = torch.randint(0, 1 << 30, (seq, 3, heads, words), dtype=torch.int32, device="cuda")
    out = torch.empty(programs * rows * words, dtype=torch.int32, device="cuda")
    row_words, head_words, kv_words = 3 * heads * words, words, heads * words
    ms = time_ms(lambda: _kv_block_read[(programs,)](qkv, out, seq // rows, heads, row_words,
                                                     head_words, kv_words, ITERS=iters,
                                                     ROWS=rows, DWORDS=words, num_warps=4))
    return programs * iters * 2 * rows * head_dim * 2 / (ms * 1e-3) / 1e12


def graph_replay_ms(fn, calls=1):
    """The time of one replay of a CUDA graph that captured `calls` calls of fn (after three
    calls outside it, so that whatever fn allocates or compiles on first use is done)."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(calls):
            fn()
    return time_ms(g.replay)


def graph_node_us(kernel_fn, nodes=200):
    """Per-node time of a CUDA graph of `nodes` launches, replayed."""
    return graph_replay_ms(kernel_fn, nodes) * 1e3 / nodes


def barrier_us(sms, n=2000):
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = torch.empty(sms, dtype=torch.int32, device="cuda")

    def run(k):
        counter.zero_()
        _grid_barriers[(sms,)](counter, out, N_BARRIERS=k, num_warps=4)

    return (time_ms(lambda: run(n)) - time_ms(lambda: run(1))) * 1e3 / (n - 1)


def attention_bytes_per_flop(mask_name, seq, head_dim, tiles):
    """Bytes each tile height reads from L2 (K/V of every non-empty block, Q once,
    O written once) per useful FLOP (4 nnz D), for one head."""
    dense = stof.Mask.pattern(mask_name, q_len=seq).to_dense(0).astype(bool)
    nnz = int(dense.sum())
    flops = 4.0 * nnz * head_dim
    rows = []
    for bm, bn in tiles:
        blocks = int(dense.reshape(seq // bm, bm, seq // bn, bn).any(axis=(1, 3)).sum())
        kv = blocks * 2 * bn * head_dim * 2
        qo = 2 * seq * head_dim * 2
        rows.append((bm, bn, nnz / (blocks * bm * bn), (kv + qo) / flops))
    return rows


def layer_stacks(name):
    """(stack, layers, the (N, K) of each projection of a layer, dependencies a layer).

    A dependency is a point where a layer waits for work spread over the whole
    GPU when every GEMM is: after the QKV projection (attention needs K and V
    of every row), after attention, after the output projection (the norm
    needs whole rows) and after each FFN GEMM. The T5 decoder adds the
    cross-attention block (its query projection, attention, output projection
    and norm); its K and V projections of the encoder's output wait for nothing
    new."""
    cfg = torch_models.SPECS[name]["config"]
    if torch_models.family(name) == "t5":
        h, f, n = cfg["d_model"], cfg["d_ff"], cfg["num_layers"]
        enc = [(3 * h, h), (h, h), (f, h), (h, f)]
        dec = enc[:2] + [(h, h), (2 * h, h), (h, h)] + enc[2:]
        return [("encoder", n, enc, 5), ("decoder", n, dec, 8)]
    if torch_models.family(name) == "gpt2":
        h, n = cfg["n_embd"], cfg["n_layer"]
        f = 4 * h
    else:
        h, f, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    return [("layer", n, [(3 * h, h), (h, h), (f, h), (h, f)], 5)]


def linear_graph_ms(stacks, tokens):
    """Every projection of every layer, F.linear on fp16, in one replayed CUDA graph."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    todo = []
    for _, n, shapes, _ in stacks:
        for _ in range(n):
            for nn, kk in shapes:
                todo.append((torch.randn(tokens, kk, device="cuda", dtype=torch.float16,
                                         generator=gen),
                             torch.randn(nn, kk, device="cuda", dtype=torch.float16,
                                         generator=gen) * kk ** -0.5))
    outs = [None] * len(todo)

    def forward():
        for i, (x, w) in enumerate(todo):
            outs[i] = torch.nn.functional.linear(x, w)

    return graph_replay_ms(forward)


def large_gemm_tflops(m=8192, n=3072, k=768):
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16)
    ms = time_ms(lambda: torch.nn.functional.linear(x, w))
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def small_m_rows(models, tokens, hbm_rate, barrier, large_rate):
    """One table row a model: the weight-read target and what its GEMMs and its
    dependencies alone take at `tokens` rows."""
    rows = []
    for name in models:
        stacks = layer_stacks(name)
        params = sum(n * sum(a * b for a, b in shapes) for _, n, shapes, _ in stacks)
        deps = sum(n * d for _, n, _, d in stacks)
        bound_us = params * 2 / hbm_rate * 1e6
        flop_us = 2.0 * tokens * params / (large_rate * 1e12) * 1e6
        cublas_us = linear_graph_ms(stacks, tokens) * 1e3
        rows.append((name, sum(n for _, n, _, _ in stacks), params * 2 / 1e6, bound_us,
                     3 * bound_us, flop_us, cublas_us, 2.0 * tokens * params / cublas_us / 1e6,
                     deps, deps * barrier))
        torch.cuda.empty_cache()
    return rows


def commit():
    if os.environ.get("STOF_COMMIT"):
        return os.environ["STOF_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"],
                                       stderr=subprocess.DEVNULL, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("STOF_COMMIT", "unknown")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="also write the markdown here")
    ap.add_argument("--models", default="bert-small,bert-base,bert-large,gpt2,t5-base",
                    help="models of the (1, 128) table (names of bench/torch_models.py)")
    ap.add_argument("--bandwidth", type=float, default=4.8e12,
                    help="HBM bytes/s of the weight-read target (bench/e2e.py's; H200: 4.8e12)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bounds: no CUDA GPU visible; nothing measured (skipped)")
        return 0
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    l2_mb = props.L2_cache_size / 2**20
    lines = [f"Device: {props.name} ({sms} SMs, L2 {l2_mb:.0f} MiB); date "
             f"{datetime.date.today()}; commit {commit()}; torch {torch.__version__}, "
             f"triton {triton.__version__}; medians of 20 runs.", ""]

    lines += ["| what | measured |", "|---|---|"]
    l2_set = int(l2_mb * 2**20 * 0.25) // (1 << 20) << 20
    best_stream = 0.0
    for programs in (sms * 8, sms * 32, sms * 128):
        bw = stream_bandwidth(l2_set, programs, iters=16)
        best_stream = max(best_stream, bw)
        lines.append(f"| L2 read, stream ({l2_set >> 20} MiB set, {programs} programs) | "
                     f"{bw:.2f} TB/s |")
    best_kv = 0.0
    for programs in (sms * 8, sms * 32, sms * 128):
        bw = kv_block_bandwidth(4096, 12, 64, programs, iters=16)
        best_kv = max(best_kv, bw)
        lines.append(f"| L2 read, attention K/V tiles 32x64 (S 4096, 12 heads, {programs} "
                     f"programs) | {bw:.2f} TB/s |")
    hbm = stream_bandwidth(4 << 30, sms * 256, iters=8)
    lines.append(f"| HBM read, stream (4 GiB set) | {hbm:.2f} TB/s |")

    dummy = torch.empty(sms, dtype=torch.int32, device="cuda")
    small = torch.zeros(128 * 768, dtype=torch.float16, device="cuda")
    node_empty = graph_node_us(lambda: _empty[(1,)](dummy))
    node_wide = graph_node_us(lambda: _empty[(sms * 4,)](dummy))
    node_torch = graph_node_us(lambda: small.add_(1.0))
    lines.append(f"| CUDA graph node, empty kernel, 1 program | {node_empty:.2f} us |")
    lines.append(f"| CUDA graph node, empty kernel, {sms * 4} programs | {node_wide:.2f} us |")
    lines.append(f"| CUDA graph node, torch add_ on 128 x 768 fp16 | {node_torch:.2f} us |")
    bar = barrier_us(sms)
    lines.append(f"| grid-wide barrier, persistent kernel of {sms} programs | {bar:.2f} us |")

    lines += ["", "Block-wise attention read from L2 (BigBird, S 4096, D 64): bytes per useful "
              "FLOP by tile, and the useful TFLOP/s that the measured L2 rate allows:", "",
              "| tile (rows x keys) | density | bytes / useful FLOP | L2-bound useful TFLOP/s |",
              "|---|---|---|---|"]
    l2_rate = max(best_stream, best_kv)
    for bm, bn, density, bpf in attention_bytes_per_flop(
            "bigbird", 4096, 64, [(32, 32), (64, 32), (128, 32), (64, 64), (128, 64)]):
        lines.append(f"| {bm}x{bn} | {density:.3f} | {bpf:.4f} | {l2_rate / bpf:.0f} |")
    lines.append("")
    lines.append(f"(Rate used: {l2_rate:.2f} TB/s, the best L2 read above. A 32-row tile that "
                 "shares no load with other rows is held to the first line; a kernel whose "
                 "rows of one tile share each K/V load, to the lines below it, but computes "
                 "the tile's empty part unless its warps skip it.)")
    large = large_gemm_tflops()
    lines += ["", f"At 128 tokens: the (1, 128) target (3x the weight-read time at "
              f"{args.bandwidth / 1e12:.2f} TB/s) against what the forward pass's projections "
              f"take. FLOP floor: their FLOPs at {large:.0f} TFLOP/s, what cuBLAS reached on "
              f"8192 x 3072 x 768. cuBLAS: every projection F.linear'd in one replayed CUDA "
              f"graph. Barriers: the dependencies across the GPU x {bar:.2f} us.", "",
              "| model | layers | weights MB | weight-read us | target (3x) us | FLOP floor us "
              "| cuBLAS, projections only, us | its TFLOP/s | dependencies | barriers us |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in small_m_rows(args.models.split(","), 128, args.bandwidth, bar, large):
        lines.append(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.1f} | {r[4]:.1f} | {r[5]:.1f} "
                     f"| {r[6]:.1f} | {r[7]:.0f} | {r[8]} | {r[9]:.1f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
