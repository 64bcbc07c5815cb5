"""The package's fused attention on torch tensors (a GPU with torch; skipped, saying so,
without one): sequences of different lengths through one padded plan, given by an
attention_mask (the padded layout) and by seq_start (the ragged layout, FlashAttention's
varlen), with grouped-query heads, against an fp32 reference computed sequence by sequence.

Runs under pytest, or alone: python3 tests/python/test_attention.py"""
import math
import sys

import stof

B, H, KVH, D, S = 3, 4, 2, 64, 200
LENGTHS = [200, 77, 1]
TAIL = 37  # rows after the last sequence in the ragged layout: large values no query may weigh


def _cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def reference(torch, qkv, lengths):
    """Each sequence's own rows: softmax(q k^T / sqrt(D)) v in fp32, K/V heads shared by
    H / KVH query heads; [B, S, H*D] with zeros at padded rows."""
    out = torch.zeros(B, S, H * D)
    for b, n in enumerate(lengths):
        x = qkv[b, :n].float().cpu()
        q = x[:, :H * D].reshape(n, H, D).transpose(0, 1)
        k = x[:, H * D:(H + KVH) * D].reshape(n, KVH, D).transpose(0, 1)
        v = x[:, (H + KVH) * D:].reshape(n, KVH, D).transpose(0, 1)
        k, v = k.repeat_interleave(H // KVH, 0), v.repeat_interleave(H // KVH, 0)
        p = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(D), dim=-1)
        out[b, :n] = (p @ v).transpose(0, 1).reshape(n, H * D)
    return out


def rel(torch, got, want):
    return float(torch.linalg.norm(got - want) / torch.linalg.norm(want))


def test_attention_padded_and_ragged():
    torch = _cuda()
    if torch is None:
        print("test_attention_padded_and_ragged: SKIPPED (no torch with a CUDA GPU)")
        return
    torch.manual_seed(3)
    ctx = stof.Context()
    att = ctx.attention(batch=B, heads=H, head_dim=D, q_len=S, padded=True, kv_heads=KVH)
    qkv = (torch.rand(B, S, (H + 2 * KVH) * D) * 2 - 1).half().cuda()
    want = reference(torch, qkv, LENGTHS)
    mask = (torch.arange(S)[None, :] < torch.tensor(LENGTHS)[:, None]).int().cuda()
    real = mask.bool().cpu()

    # the padded layout: [B, S, ...], padded rows zeros
    out = torch.full((B, S, H * D), float("nan"), dtype=torch.half, device="cuda")
    att(qkv, out=out, attention_mask=mask)
    got = out.float().cpu()
    e = rel(torch, got[real], want[real])
    print(f"test_attention: padded layout ({att.describe()}): rel {e:.2e}")
    assert e < 5e-3 and torch.all(got[~real] == 0)

    # the ragged layout: the sequences one after another, then TAIL rows of +-512
    rows = sum(LENGTHS) + TAIL
    packed = torch.cat([qkv[b, :n] for b, n in enumerate(LENGTHS)] +
                       [torch.full((TAIL, qkv.shape[-1]), 512.0, dtype=torch.half,
                                   device="cuda")])
    packed[-TAIL:, 1::2] = -512.0
    starts = [0]
    for n in LENGTHS:
        starts.append(starts[-1] + n)
    seq_start = torch.tensor(starts, dtype=torch.int32, device="cuda")
    ragged = torch.full((rows, H * D), float("nan"), dtype=torch.half, device="cuda")
    att.varlen(packed, seq_start, out=ragged)
    got = ragged.float().cpu()
    e = max(rel(torch, got[starts[b]:starts[b + 1]], want[b, :n]) for b, n in enumerate(LENGTHS))
    print(f"test_attention: ragged layout: rel {e:.2e}, its {TAIL} rows past the sequences "
          f"untouched: {bool(torch.all(torch.isnan(got[-TAIL:])))}")
    assert e < 5e-3 and torch.all(torch.isnan(got[-TAIL:]))

    # errors, before any launch: a mask of the wrong dtype, a 3-D tensor in the ragged layout,
    # lengths for a plan made without padded=True
    for bad in (lambda: att(qkv, attention_mask=mask.long()),
                lambda: att.run(*att._split(qkv), out, seq_start=seq_start),
                lambda: ctx.attention(batch=B, heads=H, head_dim=D, q_len=S,
                                      kv_heads=KVH)(qkv, attention_mask=mask)):
        try:
            bad()
        except stof.StofError as err:
            print(f"test_attention: refused: {err}")
        else:
            raise AssertionError("accepted")


if __name__ == "__main__":
    test_attention_padded_and_ragged()
    print("test_attention_padded_and_ragged: ok")
    sys.exit(0)
