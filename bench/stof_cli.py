"""Driving the stof command from the benchmarks: runs, tunes, their printed numbers, masks.

Shared by bench/parity.py, bench/e2e.py and bench/attention.py. Pure Python; torch is imported only by the
functions that make tensors (inputs, masks, files).
"""
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LATENCY_RE = re.compile(r"latency: eager ([0-9.eE+-]+) ms, CUDA graph ([0-9.eE+-]+) ms")
TUNED_RE = re.compile(r"\(tuned in ([0-9.eE+-]+) s\)")
WEIGHTS_RE = re.compile(r"memory: weights ([0-9.eE+-]+) MB")
COMMIT_RE = re.compile(r"\(commit ([^)\s]+)\)")


class CmdError(RuntimeError):
    pass


def log(msg):
    print(msg, flush=True)


def resolve_stof(path):
    path = path if os.path.isabs(path) else os.path.join(ROOT, path)
    if not os.path.exists(path):
        raise SystemExit(f"stof binary not found at {path} (build it: bash bench/main.sh, or "
                         f"give --stof PATH)")
    return path


def run_cmd(cmd, timeout, log_path=None):
    """Runs cmd in the repository root; returns (stdout, wall seconds); CmdError on failure
    with the last lines it printed. Appends the command and its output to log_path."""
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        rc = None
    wall = time.time() - t0
    if log_path:
        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
        with open(log_path, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n# exit {rc}, {wall:.1f} s\n{out}")
            if err:
                f.write(f"# stderr\n{err}")
            f.write("\n")
    if rc is None:
        raise CmdError(f"timed out after {timeout} s")
    if rc != 0:
        lines = [l for l in (err.strip() or out.strip()).splitlines() if l.strip()]
        raise CmdError(f"exit {rc}: " + " | ".join(lines[-3:]))
    return out, wall


def script_args(spec, batch, seq, mask):
    """--set arguments of a benchmark case (spec: torch_models.SPECS entry)."""
    args = []
    for k, v in spec["sets"].items():
        args += ["--set", f"{k}={v}"]
    return args + ["--set", f"batch={batch}", "--set", f"seq={seq}", "--set", f"mask={mask}"]


def io_args(weights=None, inputs=None, save_output=None):
    args = []
    if weights:
        args += ["--weights", weights]
    if inputs:
        args += ["--inputs", inputs]
    if save_output:
        args += ["--save-output", save_output]
    return args


def parse_latency(stdout):
    """(eager ms, CUDA graph ms) from `stof run`'s output."""
    m = LATENCY_RE.search(stdout)
    if not m:
        raise CmdError("no 'latency: eager X ms, CUDA graph Y ms' line in stof's output")
    return float(m.group(1)), float(m.group(2))


def parse_weights_mb(stdout):
    m = WEIGHTS_RE.search(stdout)
    return float(m.group(1)) if m else None


def stof_run(stof, target, extra, reps, timeout, log_path=None):
    """`stof run TARGET EXTRA... --reps N --no-check`: {eager_ms, graph_ms, weights_mb, wall_s}.
    target: a script (extra carries --set/--scheme) or a plan .json."""
    cmd = [stof, "run", target] + list(extra) + ["--reps", str(reps), "--no-check"]
    out, wall = run_cmd(cmd, timeout, log_path)
    eager, graph = parse_latency(out)
    return {"eager_ms": eager, "graph_ms": graph, "weights_mb": parse_weights_mb(out),
            "wall_s": wall}


def stof_tune(stof, script, sets, plan_path, time_limit, timeout, log_path=None, retry=3.0):
    """`stof tune SCRIPT --set ... -o PLAN --time-limit S`: the wall time, the time stof printed,
    and the plan's numbers (tuning_s, latency_ms, end_to_end, schemes, settings measured).

    On a cold kernel cache the NVRTC compiles can eat the whole time limit, and stof then fails
    ("the time limit ran out before the initial scheme was measured"): tried once more with
    retry x the limit (the kernels compiled by the first try are cached by then). tune_wall_s
    counts both tries; tune_attempts says how many there were."""
    if os.path.exists(plan_path):
        os.remove(plan_path)
    limit, total, attempts = time_limit, 0.0, 0
    while True:
        cmd = [stof, "tune", script] + list(sets) + ["-o", plan_path]
        if limit:
            cmd += ["--time-limit", f"{limit:g}"]
        attempts += 1
        t0 = time.time()
        try:
            out, wall = run_cmd(cmd, timeout, log_path)
            total += wall
            break
        except CmdError as e:
            total += time.time() - t0
            if attempts > 1 or not limit or not retry or "time limit" not in str(e):
                raise
            limit = limit * retry
    m = TUNED_RE.search(out)
    res = {"tune_wall_s": total, "tune_printed_s": float(m.group(1)) if m else None,
           "tune_attempts": attempts, "tune_time_limit": limit}
    res.update(read_plan(plan_path))
    return res


def read_plan(path):
    with open(path) as f:
        p = json.load(f)
    e2e = p.get("end_to_end") or {}
    schemes = []
    for q in p.get("sequences") or []:
        hexs = (q.get("scheme") or {}).get("hex")
        if q.get("layer", -1) >= 0 and hexs and hexs not in schemes:
            schemes.append(hexs)
    return {"plan_tuning_s": p.get("tuning_s"), "plan_latency_ms": p.get("latency_ms"),
            "plan_graph_ms": e2e.get("graph_ms"), "plan_eager_ms": e2e.get("eager_ms"),
            "plan_unfused_ms": e2e.get("unfused_ms"),
            "plan_settings_measured": (p.get("search") or {}).get("settings_measured"),
            "plan_schemes": schemes, "plan_device": (p.get("device") or {}).get("name")}


def stof_commit(stof):
    c = os.environ.get("STOF_COMMIT")
    if c:
        return c
    try:
        out = subprocess.run([stof, "version"], capture_output=True, text=True, timeout=30).stdout
        m = COMMIT_RE.search(out)
        if m and m.group(1) not in ("", "unknown", "?"):
            return m.group(1)
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, timeout=30).stdout.strip()
        if out:
            return out
    except (OSError, subprocess.SubprocessError):
        pass
    return "?"


# ---- masks through libstof (python/stof) ------------------------------------------------------

_binding = None


def binding(stof):
    """python/stof, with $STOF_LIB pointing at the libstof.so beside the stof binary
    unless it is already set."""
    global _binding
    if _binding is None:
        if not os.environ.get("STOF_LIB"):
            lib = os.path.join(os.path.dirname(stof), "libstof.so")
            if os.path.exists(lib):
                os.environ["STOF_LIB"] = lib
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import stof as mod  # noqa: E402  (python/stof)
        _binding = mod
    return _binding


def dense_mask(stof, mask, seq, device="cuda"):
    """stof's own mask (the script's `mask` parameter, e.g. "bigbird") at [seq, seq] as a torch
    bool tensor, or None for "none" / "full"."""
    if mask in ("none", "", "full"):
        return None
    import torch
    m = binding(stof).Mask.pattern(mask, q_len=seq)
    return torch.from_numpy(m.to_dense(0)).bool().to(device)


# ---- files ------------------------------------------------------------------------------------

def save_safetensors(tensors, path):
    """safetensors.torch.save_file through a temporary name (a killed run leaves no half file)."""
    from safetensors.torch import save_file
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    save_file(tensors, tmp)
    os.replace(tmp, path)


def save_inputs(path, ids, dec_ids=None, dtype=None, attention_mask=None, token_type_ids=None,
                global_attention_mask=None):
    import torch
    dtype = dtype or torch.int32
    t = {"input_ids": ids}
    for name, x in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids),
                    ("decoder_input_ids", dec_ids),
                    ("global_attention_mask", global_attention_mask)):
        if x is not None:
            t[name] = x
    save_safetensors({k: v.detach().to("cpu", dtype).contiguous() for k, v in t.items()}, path)


def global_tokens(batch, seq, n, seed):
    """A global_attention_mask [batch, seq] (Longformer's): n global tokens a sequence, the
    first at position 0 (the classifier token) and the others drawn at distinct positions."""
    import torch
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(batch, seq, dtype=torch.long)
    for b in range(batch):
        mask[b, 0] = n > 0
        if n > 1:
            mask[b, 1 + torch.randperm(seq - 1, generator=g)[: n - 1]] = 1
    return mask


def load_output(path):
    """The F32 "output" tensor stof wrote (or the file's only tensor)."""
    from safetensors.torch import load_file
    t = load_file(path)
    if "output" in t:
        return t["output"]
    if len(t) == 1:
        return next(iter(t.values()))
    raise CmdError(f"{path}: no 'output' tensor (has {sorted(t)})")


def random_ids(vocab, batch, seq, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g, dtype=torch.long)


def padded_batch(ids, pad_id, seed, low=0.25):
    """ids right-padded to lengths drawn uniformly from low..100% of the sequence (the first
    row whole): (ids with pad_id at padded positions, attention_mask 1/0, lengths)."""
    import torch
    batch, seq = ids.shape
    g = torch.Generator().manual_seed(seed)
    lo = max(1, int(low * seq))
    lengths = torch.randint(lo, seq + 1, (batch,), generator=g)
    lengths[0] = seq
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    return torch.where(mask.bool(), ids, torch.full_like(ids, pad_id)), mask, lengths


def graph_time_ms(fn, budget_ms=3.0, reps=5):
    """Median over reps of the time of one fn() replayed from a CUDA graph that holds several
    of them back to back (ms): the GPU's time, without the host's launch overhead. Falls back
    to time_ms where fn cannot be captured."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    first = time_ms(fn, 0, 1)
    n = max(1, min(20, int(budget_ms / max(first, 1e-3))))
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(n):
                fn()
    except Exception:  # noqa: BLE001 - not capturable: timed call by call
        torch.cuda.synchronize()
        return time_ms(fn, 2, reps * 4)
    graph.replay()
    torch.cuda.synchronize()
    return statistics.median(event_times(graph.replay, reps)) / n


def event_times(fn, reps):
    """CUDA-event timings of reps calls of fn (ms each)."""
    import torch
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return times


def time_ms(fn, warmup, reps):
    """Median of reps CUDA-event timings of fn (ms), after warmup calls."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = event_times(fn, reps)
    return statistics.median(times)
