"""Plots of bench/e2e.py's JSON (matplotlib, Agg backend).

    python3 bench/plot.py bench/out/e2e.json --out-dir bench/out

Writes
  e2e-speedup.png   stof tuned over the better torch.compile variant, grouped bars per model and
                    mask, one bar per (batch, seq); log scale, a line at 1x
  e2e-ablation.png  speedup over PyTorch eager of stof all-unfused (stof's sparse attention
                    kernel alone), of stof fusion only (the mask removed: fusion and tuning
                    with dense attention) and of stof tuned (both), per case
"""
import argparse
import json
import math
import os

MODEL_ORDER = ["bert-small", "bert-base", "bert-large", "gpt2", "t5-small", "t5-base"]


def _num(v):
    return v if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else None


def _cases(data):
    cases = list(data.get("cases", {}).values())
    order = {m: i for i, m in enumerate(MODEL_ORDER)}
    cases.sort(key=lambda r: (order.get(r["model"], 99), str(r.get("mask_label", r["mask"])),
                              r["batch"], r["seq"]))
    return cases


def _groups(cases):
    """[(group label, [case, ...])] by model and mask, in order."""
    groups = []
    for r in cases:
        label = f"{r['model']}\n{r.get('mask_label', r['mask'])}"
        if not groups or groups[-1][0] != label:
            groups.append((label, []))
        groups[-1][1].append(r)
    return groups


def _speedup(r):
    tuned = _num(r.get("stof_tuned_ms"))
    best = [v for v in (_num(r.get("flex_ms")), _num(r.get("ro_ms"))) if v]
    return min(best) / tuned if tuned and best else None


def _title(data, what):
    meta = data.get("meta", {})
    return f"{what}\n{meta.get('device', '?')}, stof {meta.get('commit', '?')}, {meta.get('date', '')}"


def _finish(ax, fig, path, ylabel):
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter
    ax.set_yscale("log")
    ticks = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}x"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def plot(data, out_dir):
    """Writes the PNGs; returns their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    cases = _cases(data)
    written = []
    if not cases:
        return written

    # 1. speedup over the better torch.compile variant
    groups = _groups(cases)
    shapes = sorted({(r["batch"], r["seq"]) for r in cases}, key=lambda s: (s[0] * s[1], s))
    width = 0.8 / max(1, len(shapes))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups)), 4.5))
    for k, shape in enumerate(shapes):
        xs, ys = [], []
        for g, (_, rows) in enumerate(groups):
            for r in rows:
                if (r["batch"], r["seq"]) == shape and _speedup(r):
                    xs.append(g - 0.4 + width * (k + 0.5))
                    ys.append(_speedup(r))
        if xs:
            bars = ax.bar(xs, ys, width, label=f"({shape[0]}, {shape[1]})")
            for b, y in zip(bars, ys):
                ax.annotate(f"{y:.2f}", (b.get_x() + b.get_width() / 2, y), ha="center",
                            va="bottom", fontsize=7)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([g[0] for g in groups], fontsize=8)
    ax.set_xlabel("model and mask; one bar per (batch, seq)")
    ax.legend(title="(batch, seq)", fontsize=8)
    ax.set_title(_title(data, "stof tuned: speedup over the better torch.compile variant"),
                 fontsize=9)
    path = os.path.join(out_dir, "e2e-speedup.png")
    _finish(ax, fig, path, "speedup (x)")
    plt.close(fig)
    written.append(path)

    # 2. ablation relative to eager
    rows = [r for r in cases if _num(r.get("eager_ms"))]
    if rows:
        labels = [f"{r['model']}\n{r.get('mask_label', r['mask'])}\n({r['batch']},{r['seq']})"
                  for r in rows]
        series = [("stof all-unfused (sparse attention only)", "stof_unfused_ms"),
                  ("stof fusion only (mask removed: dense attention)", "stof_fusion_ms"),
                  ("stof tuned (both)", "stof_tuned_ms")]
        fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows)), 4.5))
        for k, (label, key) in enumerate(series):
            xs, ys = [], []
            for i, r in enumerate(rows):
                v = _num(r.get(key))
                if v:
                    xs.append(i - 0.27 + 0.27 * k)
                    ys.append(r["eager_ms"] / v)
            if xs:
                ax.bar(xs, ys, 0.27, label=label)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, fontsize=6)
        ax.set_xlabel("case: model, mask, (batch, seq)")
        ax.legend(fontsize=8)
        ax.set_title(_title(data, "ablation: speedup over PyTorch eager (SDPA + mask)"),
                     fontsize=9)
        path = os.path.join(out_dir, "e2e-ablation.png")
        _finish(ax, fig, path, "speedup over eager (x)")
        plt.close(fig)
        written.append(path)
    return written


def main():
    ap = argparse.ArgumentParser(description="plots of bench/e2e.py's JSON")
    ap.add_argument("json", nargs="?", default="bench/out/e2e.json")
    ap.add_argument("--out-dir", default="bench/out")
    args = ap.parse_args()
    with open(args.json) as f:
        data = json.load(f)
    for p in plot(data, args.out_dir):
        print(f"wrote {p}")


if __name__ == "__main__":
    main()
