#!/usr/bin/env python3
"""Hand-edit a tuned plan: merge each GEMM segment with the norm segment after it.

    python3 bench/plan_merge.py plan.json out.json --params 64,32,64,4,6,2 [--params ...]

In every layer sequence of the plan, a segment that starts with a GEMM and whose ops with the
next segment's form gemm_epilogue's pattern `gemm [bias] [act] [add] norm` becomes one
gemm_epilogue segment (the norm closes the GEMM's epilogue). --params gives its BLOCK_M,
BLOCK_N, BLOCK_K, WARPS, STAGES, SPLIT_K: once for every merge, or once per merge in the order
they appear in a layer. The scheme bits are rewritten to match; a merged segment's time is
the sum of the two it replaces (the plan format wants one; `stof run` measures the edited
plan). `stof run` checks the edited plan as it checks
any plan, so a setting the kernel cannot take fails there, by name.

Used to measure fused settings that a search with a short time limit may not draw."""
import argparse
import json
import sys

NAMES = ["BLOCK_M", "BLOCK_N", "BLOCK_K", "WARPS", "STAGES", "SPLIT_K"]
EPILOGUE = {"bias", "gelu", "gelu_tanh", "relu", "add"}
NORMS = {"layernorm", "rmsnorm"}


def mergeable(a, b):
    """Whether segment a (starting with a GEMM) and segment b form gemm [epilogue] norm."""
    ops = a["ops"] + b["ops"]
    return (ops[0] == "gemm" and ops[-1] in NORMS and all(o in EPILOGUE for o in ops[1:-1])
            and "gemm" not in ops[1:])


def scheme_of(segments, n_ops):
    """The scheme's binary (a bit flip starts a segment) and hex ("n:digits", op 4d the most
    significant bit of digit d)."""
    bits, bit = [], 0
    for k, s in enumerate(segments):
        if k:
            bit ^= 1
        bits += [bit] * (s["last"] - s["first"] + 1)
    assert len(bits) == n_ops, (len(bits), n_ops)
    binary = "".join(map(str, bits))
    digits = ""
    for d in range(0, n_ops, 4):
        nib = bits[d:d + 4] + [0] * (4 - len(bits[d:d + 4]))
        digits += "0123456789abcdef"[nib[0] * 8 + nib[1] * 4 + nib[2] * 2 + nib[3]]
    return binary, f"{n_ops}:{digits}"


def merge_sequence(seq, params):
    out, merges, k = [], 0, 0
    segs = seq["segments"]
    while k < len(segs):
        a = segs[k]
        if k + 1 < len(segs) and mergeable(a, segs[k + 1]):
            b = segs[k + 1]
            p = params[min(merges, len(params) - 1)]
            out.append({"first": a["first"], "last": b["last"], "ops": a["ops"] + b["ops"],
                        "template": "gemm_epilogue", "params": dict(zip(NAMES, p)),
                        "kernel": "gemm_epilogue.cu", "ms": a["ms"] + b["ms"]})
            merges += 1
            k += 2
            continue
        out.append(a)
        k += 1
    seq["segments"] = out
    binary, hexa = scheme_of(out, seq["ops"])
    seq["scheme"] = {"binary": binary, "hex": hexa}
    seq["ms"] = sum(s["ms"] for s in out)
    return merges


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan")
    ap.add_argument("out")
    ap.add_argument("--params", action="append", required=True,
                    help="BLOCK_M,BLOCK_N,BLOCK_K,WARPS,STAGES,SPLIT_K (repeat: one per merge)")
    args = ap.parse_args()
    params = []
    for text in args.params:
        p = [int(x) for x in text.split(",")]
        if len(p) != len(NAMES):
            sys.exit(f"--params {text}: expected {len(NAMES)} integers ({','.join(NAMES)})")
        params.append(p)
    with open(args.plan) as f:
        plan = json.load(f)
    total = sum(merge_sequence(seq, params) for seq in plan["sequences"])
    with open(args.out, "w") as f:
        json.dump(plan, f, indent=2)
    print(f"{args.out}: {total} GEMM + norm segment pairs merged into gemm_epilogue")


if __name__ == "__main__":
    main()
