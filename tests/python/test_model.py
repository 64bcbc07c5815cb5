"""The Python package as a user calls it: a tiny BERT (heads of 32) model directory written here (config.json
and safetensors, no download), run on the CPU reference against a numpy BERT on the same
weights, a padded batch, errors, masks, the installed command; on a GPU (torch with CUDA), the
same model on torch tensors against the CPU reference, and a tuned plan saved and loaded.

Runs under pytest, or alone: python3 tests/python/test_model.py"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

import stof

CONFIG = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 64,
          "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 128,
          "vocab_size": 100, "max_position_embeddings": 16, "type_vocab_size": 2,
          "layer_norm_eps": 1e-12, "hidden_act": "gelu", "pad_token_id": 0}


def write_safetensors(path, tensors):
    """tensors: name -> array (float: F32, integer: I64), written as safetensors by hand."""
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        kind = "I64" if np.issubdtype(a.dtype, np.integer) else "F32"
        data = np.ascontiguousarray(a, dtype="<i8" if kind == "I64" else "<f4").tobytes()
        header[name] = {"dtype": kind, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def bert_weights(seed=3):
    rng = np.random.default_rng(seed)
    H, F, V, P = 64, 128, 100, 16
    w = {}

    def mat(name, *shape):
        w[name] = rng.uniform(-0.3, 0.3, shape).astype(np.float32)

    mat("embeddings.word_embeddings.weight", V, H)
    mat("embeddings.position_embeddings.weight", P, H)
    mat("embeddings.token_type_embeddings.weight", 2, H)
    pre = "encoder.layer.0."
    for n in ("attention.self.query", "attention.self.key", "attention.self.value",
              "attention.output.dense"):
        mat(pre + n + ".weight", H, H)
        mat(pre + n + ".bias", H)
    mat(pre + "intermediate.dense.weight", F, H)
    mat(pre + "intermediate.dense.bias", F)
    mat(pre + "output.dense.weight", H, F)
    mat(pre + "output.dense.bias", H)
    for n in ("embeddings.LayerNorm", pre + "attention.output.LayerNorm",
              pre + "output.LayerNorm"):
        w[n + ".weight"] = (1 + rng.uniform(-0.1, 0.1, H)).astype(np.float32)
        w[n + ".bias"] = rng.uniform(-0.1, 0.1, H).astype(np.float32)
    return w


def layer_norm(w, x, n, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w[n + ".weight"] + w[n + ".bias"]


def linear(w, x, n):
    return x @ w[n + ".weight"].T + w[n + ".bias"]


def gelu(h):
    return 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))


def attend(q, k, v, allowed, heads):
    """Softmax attention of [B, S, H] projections split into heads, where allowed [B, S, S]
    (query, key) is true; a row with nothing allowed gives zeros."""
    B, S, H = q.shape
    d = H // heads

    def split(t):
        return t.reshape(B, S, heads, d).transpose(0, 2, 1, 3)

    s = split(q) @ split(k).transpose(0, 1, 3, 2) / math.sqrt(d)
    s = np.where(allowed[:, None], s, -np.inf)
    mx = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(mx), mx, 0))
    p /= np.maximum(p.sum(-1, keepdims=True), 1e-300)
    return (p @ split(v)).transpose(0, 2, 1, 3).reshape(B, S, H)


def numpy_bert(w, ids, mask, types=None):
    """BertModel's last hidden state (one layer, 2 heads of 32), with transformers' masking: padded
    keys get -inf; the rows of padded positions are not compared."""
    B, S = ids.shape
    t = w["embeddings.token_type_embeddings.weight"][types if types is not None else 0]
    x = (w["embeddings.word_embeddings.weight"][ids] + t
         + w["embeddings.position_embeddings.weight"][np.arange(S)])
    x = layer_norm(w, x.astype(np.float64), "embeddings.LayerNorm", 1e-12)
    pre = "encoder.layer.0."
    q, k, v = (linear(w, x, pre + "attention.self." + n) for n in ("query", "key", "value"))
    a = attend(q, k, v, np.broadcast_to(mask[:, None, :] > 0, (B, S, S)), 2)
    x = layer_norm(w, linear(w, a, pre + "attention.output.dense") + x,
                   pre + "attention.output.LayerNorm", 1e-12)
    h = gelu(linear(w, x, pre + "intermediate.dense"))
    return layer_norm(w, linear(w, h, pre + "output.dense") + x, pre + "output.LayerNorm", 1e-12)


def read_safetensors(path):
    """The F32 tensors of a safetensors file, by hand."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name != "__metadata__" and t["dtype"] == "F32":
            a, b = t["data_offsets"]
            out[name] = np.frombuffer(data[a:b], dtype="<f4").reshape(t["shape"])
    return out


def write_model_dir(root, name, config, tensors):
    """A model directory root/name: config.json and model.safetensors of tensors."""
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    return d


def make_dir(root):
    w = bert_weights()
    return write_model_dir(root, "tiny-bert", CONFIG, {"bert." + k: v for k, v in w.items()}), w


def ids_and_mask():
    rng = np.random.default_rng(7)
    ids = rng.integers(1, 100, (2, 8)).astype(np.int64)
    mask = np.ones((2, 8), np.int64)
    mask[1, 5:] = 0
    ids[1, 5:] = 0
    return ids, mask


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_cpu_against_numpy():
    root = tempfile.mkdtemp()
    try:
        d, w = make_dir(root)
        m = stof.Model.from_pretrained(d, batch=2, seq=8, dtype="fp32")
        names = [(t.name, t.dtype, t.shape, t.optional) for t in m.inputs]
        assert names == [("input_ids", "int32", (2, 8), False),
                         ("attention_mask", "int32", (2, 8), True),
                         ("token_type_ids", "int32", (2, 8), True)], names
        assert m.output.shape == (2, 8, 64)
        ids, mask = ids_and_mask()
        full = m(ids)
        assert full.shape == (2, 8, 64) and full.dtype == np.float32
        assert rel(full, numpy_bert(w, ids, np.ones_like(mask))) < 1e-5
        padded = m(ids, attention_mask=mask)
        want = numpy_bert(w, ids, mask)
        real = mask.astype(bool)
        assert rel(padded[real], want[real]) < 1e-5
        assert np.all(padded[~real] == 0)
        # a sentence pair: the last three tokens of each row segment B
        types = np.zeros_like(ids)
        types[:, 5:] = 1
        pair = m(ids, token_type_ids=types)
        assert rel(pair, numpy_bert(w, ids, np.ones_like(mask), types)) < 1e-5
        assert rel(pair, full) > 1e-3  # the types change the output
        assert "bert.lua" in m.script and "input_ids" in repr(m)
    finally:
        shutil.rmtree(root)


def test_weights_in_memory():
    root = tempfile.mkdtemp()
    try:
        d, w = make_dir(root)
        os.remove(os.path.join(d, "model.safetensors"))  # config.json alone
        ids, mask = ids_and_mask()
        m = stof.Model.from_pretrained(d, batch=2, seq=8, dtype="fp32")
        expect_error(lambda: m(ids), "give the weights")
        m.set_weights(w)  # a dict of arrays, names without a prefix
        got = m(ids, attention_mask=mask)
        want = numpy_bert(w, ids, mask)
        real = mask.astype(bool)
        assert rel(got[real], want[real]) < 1e-5
        half = {k: v.astype(np.float16) for k, v in w.items()}
        m2 = stof.Model.from_pretrained(d, batch=2, seq=8, dtype="fp32", weights=half)
        rounded = {k: v.astype(np.float32) for k, v in half.items()}  # the same values
        assert rel(m2(ids)[0], numpy_bert(rounded, ids, np.ones_like(mask))[0]) < 1e-5
        expect_error(lambda: m.set_weights({k: v for k, v in w.items() if "query" not in k}),
                     "weights in memory")
    finally:
        shutil.rmtree(root)


def expect_error(fn, words):
    try:
        fn()
    except stof.StofError as e:
        assert words in str(e), str(e)
        return
    raise AssertionError(f"no error; expected one saying {words!r}")


def test_errors():
    root = tempfile.mkdtemp()
    try:
        d, _ = make_dir(root)
        m = stof.Model.from_pretrained(d, batch=2, seq=8, dtype="fp32")
        ids, mask = ids_and_mask()
        expect_error(lambda: m(ids, position_ids=ids), "'position_ids' is not an input")
        expect_error(lambda: m(ids, token_type_ids=ids), "input 'token_type_ids': 94 at index 0")
        expect_error(lambda: m(ids[:, :4]), "has shape [2, 4], the model takes [2, 8]")
        bad = ids.copy()
        bad[0, 2] = 100
        expect_error(lambda: m(bad), "100 at index 2 (row 0, position 2) is outside [0, 100)")
        left = mask[:, ::-1].copy()
        expect_error(lambda: m(ids, attention_mask=left), "stof takes right padding")
        expect_error(lambda: m.save_plan(os.path.join(root, "p.json")), "no plan to save")
        # a plan made without a GPU, for an architecture: saved, and it fits the model
        expect_error(lambda: m.plan_offline("sm_90"), "the GPU kernels run in f16 or bf16")
        half = stof.Model.from_pretrained(d, batch=2, seq=8, dtype="fp16")
        half.plan_offline("sm_90")
        plan = os.path.join(root, "offline.json")
        half.save_plan(plan)
        with open(plan) as f:
            saved = json.load(f)
        assert saved["device"]["arch"] == "sm_90" and not saved["device"].get("measured")
        again = stof.Model.from_plan(plan)
        assert again.output.shape == (2, 8, 64)
        expect_error(lambda: half.plan_offline("gfx90a"), "arch must be sm_XX")
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(dict(CONFIG, model_type="longt5"), f)
        expect_error(lambda: stof.Model.from_pretrained(d, batch=2, seq=8),
                     "model_type 'longt5' is not one stof has a script for")
        os.remove(os.path.join(d, "model.safetensors"))
        expect_error(lambda: stof.Model.from_pretrained(d), "tiny-bert")
    finally:
        shutil.rmtree(root)


LONGFORMER_CONFIG = {"model_type": "longformer", "architectures": ["LongformerModel"],
                     "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 12,
                     "type_vocab_size": 1, "layer_norm_eps": 1e-5, "hidden_act": "gelu",
                     "pad_token_id": 1, "attention_window": [4]}


def longformer_weights(seed=5):
    rng = np.random.default_rng(seed)
    w = {k: v for k, v in bert_weights(seed).items() if "token_type" not in k}
    w["embeddings.token_type_embeddings.weight"] = rng.uniform(-0.3, 0.3, (1, 64)).astype(
        np.float32)
    w["embeddings.position_embeddings.weight"] = rng.uniform(-0.3, 0.3, (12, 64)).astype(
        np.float32)
    for n in ("query_global", "key_global", "value_global"):
        w["encoder.layer.0.attention.self." + n + ".weight"] = rng.uniform(
            -0.3, 0.3, (64, 64)).astype(np.float32)
        w["encoder.layer.0.attention.self." + n + ".bias"] = rng.uniform(
            -0.3, 0.3, 64).astype(np.float32)
    return w


def numpy_longformer(w, ids, mask, glob):
    """LongformerModel's last hidden state as transformers computes it (one layer, windows of 2
    keys each side): a global token (glob and mask set) attends every real key with the
    *_global projections; another token attends its window's keys that are not global and
    every global key; positions start after the padding index (2 on)."""
    B, S = ids.shape
    x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][0]
         + w["embeddings.position_embeddings.weight"][np.arange(S) + 2])
    x = layer_norm(w, x.astype(np.float64), "embeddings.LayerNorm", 1e-5)
    pre = "encoder.layer.0.attention.self."
    real, g = mask > 0, (glob > 0) & (mask > 0)
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    window = (abs(i - j) <= 2)[None] & ~g[:, None, :]
    local = (window | g[:, None, :]) & real[:, None, :]
    q, k, v = (linear(w, x, pre + n) for n in ("query", "key", "value"))
    a = attend(q, k, v, local, 2)
    qg, kg, vg = (linear(w, x, pre + n + "_global") for n in ("query", "key", "value"))
    a_global = attend(qg, kg, vg, np.broadcast_to(real[:, None, :], (B, S, S)), 2)
    a = np.where(g[:, :, None], a_global, a)
    post = "encoder.layer.0."
    x = layer_norm(w, linear(w, a, post + "attention.output.dense") + x,
                   post + "attention.output.LayerNorm", 1e-5)
    h = gelu(linear(w, x, post + "intermediate.dense"))
    return layer_norm(w, linear(w, h, post + "output.dense") + x, post + "output.LayerNorm", 1e-5)


def test_longformer_global_tokens():
    """A Longformer directory's global_attention_mask on the CPU reference, against transformers'
    rule written in numpy: none, one, and several with a padded row (a global flag in the
    padding is padding)."""
    root = tempfile.mkdtemp()
    try:
        w = longformer_weights()
        d = write_model_dir(root, "tiny-longformer", LONGFORMER_CONFIG,
                            {"longformer." + k: v for k, v in w.items()})
        m = stof.Model.from_pretrained(d, batch=2, seq=8, dtype="fp32")
        assert "global_attention_mask" in [t.name for t in m.inputs]
        ids, mask = ids_and_mask()
        ids = np.where(mask > 0, np.maximum(ids, 2), 1)  # clear of the padding id (1)
        real = mask.astype(bool)
        none = np.zeros_like(mask)
        plain = m(ids, attention_mask=mask)
        assert rel(plain[real], numpy_longformer(w, ids, mask, none)[real]) < 1e-5
        assert np.array_equal(m(ids, attention_mask=mask, global_attention_mask=none), plain)
        for flags in ([(0, 0)], [(0, 0), (0, 6), (1, 3), (1, 7)]):
            glob = np.zeros_like(mask)
            for b, pos in flags:
                glob[b, pos] = 1
            got = m(ids, attention_mask=mask, global_attention_mask=glob)
            want = numpy_longformer(w, ids, mask, glob)
            assert rel(got[real], want[real]) < 1e-5, flags
            assert np.all(got[~real] == 0)
            assert rel(got[real], plain[real]) > 1e-3  # the global tokens change the output
        bad = np.zeros_like(mask)
        bad[0, 1] = 2
        expect_error(lambda: m(ids, global_attention_mask=bad),
                     "input 'global_attention_mask': 2 at index 1")
        local = stof.Model.from_pretrained(d, batch=2, seq=8, dtype="fp32", **{"global": False})
        expect_error(lambda: local(ids, global_attention_mask=bad),
                     "'global_attention_mask' is not an input")
    finally:
        shutil.rmtree(root)


# heads of 32: a size the GPU's decode kernels are built for
GPT2_CONFIG = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64,
               "n_layer": 2, "n_head": 2, "vocab_size": 50, "n_positions": 32,
               "layer_norm_epsilon": 1e-5, "eos_token_id": 49}


def gpt2_weights(seed=5):
    rng = np.random.default_rng(seed)
    H, V, P = 64, 50, 32
    w = {"wte.weight": rng.uniform(-0.5, 0.5, (V, H)), "wpe.weight": rng.uniform(-0.5, 0.5, (P, H)),
         "ln_f.weight": 1 + rng.uniform(-0.1, 0.1, H), "ln_f.bias": rng.uniform(-0.1, 0.1, H)}
    for n in range(2):
        pre = f"h.{n}."
        for name, shape in (("ln_1.weight", H), ("ln_1.bias", H), ("ln_2.weight", H),
                            ("ln_2.bias", H), ("attn.c_attn.weight", (H, 3 * H)),
                            ("attn.c_attn.bias", 3 * H), ("attn.c_proj.weight", (H, H)),
                            ("attn.c_proj.bias", H), ("mlp.c_fc.weight", (H, 4 * H)),
                            ("mlp.c_fc.bias", 4 * H), ("mlp.c_proj.weight", (4 * H, H)),
                            ("mlp.c_proj.bias", H)):
            scale = 0.1 if "bias" in name else 0.3
            w[pre + name] = rng.uniform(-scale, scale, shape) + (1 if name.endswith("ln_1.weight")
                                                                  or name.endswith("ln_2.weight")
                                                                  else 0)
    return {k: v.astype(np.float32) for k, v in w.items()}


def numpy_gpt2_logits(w, ids):
    """GPT2LMHeadModel's logits [S, V] for one sequence, in float64."""
    def ln(x, g, b):
        m = x.mean(-1, keepdims=True)
        return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b

    def gelu_new(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    W = {k: v.astype(np.float64) for k, v in w.items()}
    S, D, heads = len(ids), 32, 2
    x = W["wte.weight"][ids] + W["wpe.weight"][:S]
    for n in range(2):
        p = f"h.{n}."
        h = ln(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"])
        q, k, v = np.split(h @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"], 3, -1)
        out = np.zeros_like(x)
        for hd in range(heads):
            sl = slice(hd * D, hd * D + D)
            s = q[:, sl] @ k[:, sl].T / math.sqrt(D)
            s[np.triu_indices(S, 1)] = -np.inf
            pr = np.exp(s - s.max(-1, keepdims=True))
            out[:, sl] = pr / pr.sum(-1, keepdims=True) @ v[:, sl]
        x = x + out @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        h = ln(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"])
        x = x + gelu_new(h @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"]) \
            @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
    return ln(x, W["ln_f.weight"], W["ln_f.bias"]) @ W["wte.weight"].T


def numpy_greedy(w, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(np.argmax(numpy_gpt2_logits(w, np.array(ids))[-1])))
    return ids[len(prompt):]


def test_generate():
    root = tempfile.mkdtemp()
    try:
        w = gpt2_weights()
        d = write_model_dir(root, "tiny-gpt2", GPT2_CONFIG, w)
        m = stof.Model.from_pretrained(d, batch=1, seq=8, dtype="fp32")
        prompts = [[3, 14, 15, 9, 2, 6], [5, 35], [8]]
        got = m.generate(prompts, max_new_tokens=8, use_eos=False)
        want = [numpy_greedy(w, p, 8) for p in prompts]
        assert got == want, (got, want)
        assert m.generate(prompts, max_new_tokens=8, use_eos=False, recompute=True) == got
        assert m.generate(prompts[0], max_new_tokens=8, use_eos=False) == [got[0]]
        # sampling: the same seed, the same tokens
        a = m.generate(prompts, max_new_tokens=8, temperature=0.9, top_k=10, seed=4)
        assert a == m.generate(prompts, max_new_tokens=8, temperature=0.9, top_k=10, seed=4)
        # a stop token ends its sequence, the token included
        stop = got[1][2]
        cut = m.generate(prompts, max_new_tokens=8, stop_tokens=[stop], use_eos=False)
        assert cut[1] == got[1][:got[1].index(stop) + 1]
        # a tokenizer's padded batch: ids and attention_mask, left or right padded, as numpy
        # arrays or torch tensors; the padding is left out of each prompt
        pad = 0
        right = np.full((3, 6), pad, dtype=np.int64)
        left = np.full((3, 6), pad, dtype=np.int64)
        for b, p in enumerate(prompts):
            right[b, :len(p)] = p
            left[b, 6 - len(p):] = p
        assert m.generate(right, max_new_tokens=8, use_eos=False,
                          attention_mask=right != pad) == got
        mask_left = np.zeros((3, 6), dtype=np.int32)
        for b, p in enumerate(prompts):
            mask_left[b, 6 - len(p):] = 1
        assert m.generate(left, max_new_tokens=8, use_eos=False, attention_mask=mask_left) == got
        assert m.generate(np.array(prompts[0]), max_new_tokens=8, use_eos=False) == [got[0]]
        assert m.generate(np.array([prompts[0]]), max_new_tokens=8, use_eos=False) == [got[0]]
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            assert m.generate(torch.from_numpy(left), max_new_tokens=8, use_eos=False,
                              attention_mask=torch.from_numpy(mask_left)) == got
        holed = mask_left.copy()
        holed[0, 2] = 0
        expect_error(lambda: m.generate(left, attention_mask=holed), "row 0's tokens are not one")
        empty = mask_left.copy()
        empty[2] = 0
        expect_error(lambda: m.generate(left, attention_mask=empty), "row 2 has no token")
        expect_error(lambda: m.generate(left, attention_mask=mask_left[:2]),
                     "attention_mask: shape [2, 6], expected the prompts' [3, 6]")
        expect_error(lambda: m.generate(left, attention_mask=mask_left * 2), "other than 0")
        expect_error(lambda: m.generate(left.astype(np.float32), attention_mask=mask_left),
                     "integer token ids")
        expect_error(lambda: m.generate(prompts, attention_mask=mask_left), "not a rectangular")
        expect_error(lambda: m.generate(np.zeros((2, 2, 2), np.int64)), "[batch, seq] or [seq]")
        expect_error(lambda: m.generate(prompts, device="tpu"), "device 'tpu'")
        expect_error(lambda: m.generate(prompts, tune_step=5), "tunes the GPU's decode step")
        expect_error(lambda: m.generate(prompts, tune_step=-1), "tune_step_s: seconds from 0")
        half = stof.Model.from_pretrained(d, batch=1, seq=8, dtype="fp16")
        want16 = half.generate(prompts, max_new_tokens=8, use_eos=False)
        # a plan of `stof tune --decode-batch` (planned offline without a GPU): the model it
        # names generates the same tokens, on the GPU through the plan's decode step
        exe = os.environ.get("STOF_BIN") or shutil.which("stof")
        planned = None
        if exe:
            plan = os.path.join(root, "decode.json")
            subprocess.run([exe, "tune", d, "--set", "batch=1", "--set", "seq=8", "--set",
                            "dtype=fp16", "--decode-batch", "3", "--decode-context", "16",
                            "--time-limit", "5", "-o", plan], check=True, capture_output=True)
            planned = stof.Model.from_plan(plan)
            assert planned.generate(prompts, max_new_tokens=8, use_eos=False) == want16
        else:
            print("test_generate: the plan's decode step SKIPPED (no stof command)")
        if _cuda() is not None:
            # the GPU in fp16 against the CPU reference on the same fp16-rounded weights
            got16 = half.generate(prompts, max_new_tokens=8, use_eos=False, device="cuda")
            assert got16 == want16, (got16, want16)
            # the decode step tuned first: still the reference's tokens
            tuned = half.generate(prompts, max_new_tokens=8, use_eos=False, device="cuda",
                                  tune_step=3)
            assert tuned == want16, (tuned, want16)
            if planned is not None:
                from_plan = planned.generate(prompts, max_new_tokens=8, use_eos=False,
                                             device="cuda")
                assert from_plan == want16, (from_plan, want16)
            expect_error(lambda: m.generate(prompts, max_new_tokens=4, device="cuda"),
                         "fp16 or bf16")
        expect_error(lambda: m.generate([[3, 50]], max_new_tokens=4), "token 50 at 1 is outside")
        hidden = stof.Model.from_pretrained(d, batch=1, seq=8, dtype="fp32", head="false")
        expect_error(lambda: hidden.generate([[1, 2]], max_new_tokens=4), "--set head=true")
    finally:
        shutil.rmtree(root)


def test_masks_and_version():
    assert stof.__version__.count(".") == 2
    mk = stof.Mask.pattern("sliding_window{band=2}", q_len=10)
    assert mk.shape() == (1, 10, 10)
    assert abs(mk.density() - 44 / 100) < 1e-9
    assert int(mk.to_dense().sum()) == 44


def test_command():
    exe = shutil.which("stof")
    if exe is None:
        print("test_command: SKIPPED (no stof command on PATH: the package is not installed)")
        return
    out = subprocess.run([exe, "help", "run"], capture_output=True, text=True)
    assert out.returncode == 0 and "run" in out.stdout


def _cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def test_gpu():
    torch = _cuda()
    if torch is None:
        print("test_gpu: SKIPPED (no torch with a CUDA GPU)")
        return
    root = tempfile.mkdtemp()
    try:
        d, _ = make_dir(root)
        cpu = stof.Model.from_pretrained(d, batch=2, seq=8, dtype="fp32")
        gpu = stof.Model.from_pretrained(d, batch=2, seq=8, dtype="fp16")
        ids, mask = ids_and_mask()
        real = mask.astype(bool)
        want = cpu(ids, attention_mask=mask)
        got = gpu(torch.from_numpy(ids).cuda(), attention_mask=torch.from_numpy(mask).cuda())
        assert got.is_cuda and got.dtype == torch.float16 and tuple(got.shape) == (2, 8, 64)
        g = got.float().cpu().numpy()
        assert rel(g[real], want[real]) < 1e-2 and np.all(g[~real] == 0)
        # inside a CUDA graph of torch's: captured, then replayed on new ids
        ids_g = torch.from_numpy(ids).cuda().int()
        mask_g = torch.from_numpy(mask).cuda().int()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            gpu(ids_g, attention_mask=mask_g)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out_g = gpu(ids_g, attention_mask=mask_g)
        other = (ids + 11) % 100
        ids_g.copy_(torch.from_numpy(other))
        graph.replay()
        torch.cuda.synchronize()
        want_other = cpu(other, attention_mask=mask)
        e = rel(out_g.float().cpu().numpy()[real], want_other[real])
        print(f"test_gpu: replayed in torch's CUDA graph on new ids: rel {e:.2e}")
        assert e < 1e-2
        gpu.tune(time_limit=5, progress=False)
        plan = os.path.join(root, "plan.json")
        gpu.save_plan(plan)
        again = stof.Model.from_plan(plan)
        g2 = again(torch.from_numpy(ids).cuda(), attention_mask=torch.from_numpy(mask).cuda())
        assert rel(g2.float().cpu().numpy()[real], want[real]) < 1e-2
        print(f"test_gpu: fp16 rel {rel(g[real], want[real]):.2e}, the plan's "
              f"{rel(g2.float().cpu().numpy()[real], want[real]):.2e}")
        # the command on the same plan and inputs gives what the package gives
        exe = os.environ.get("STOF_BIN") or shutil.which("stof")
        if exe:
            inputs, out = os.path.join(root, "in.safetensors"), os.path.join(root, "out.safetensors")
            write_safetensors(inputs, {"input_ids": ids, "attention_mask": mask})
            subprocess.run([exe, "run", plan, "--inputs", inputs, "--save-output", out],
                           check=True, capture_output=True)
            cli = read_safetensors(out)["output"]
            mine = g2.float().cpu().numpy()
            e = rel(cli, mine)
            print(f"test_gpu: the command on the plan against the package: rel {e:.2e}, max "
                  f"{float(np.abs(cli - mine).max()):.2e}")
            assert e < 1e-3
        else:
            print("test_gpu: the command comparison SKIPPED (no stof command)")
        try:
            import transformers
        except ImportError:
            print("test_gpu: the transformers comparison SKIPPED (no transformers)")
            return
        hf = transformers.BertModel.from_pretrained(d, add_pooling_layer=False).eval()
        with torch.no_grad():
            ref = hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
        ref = ref.last_hidden_state.numpy()
        e = rel(g[real], ref[real])
        print(f"test_gpu: against transformers (fp32, attention_mask): rel {e:.2e}")
        assert e < 1e-2
        # the live transformers model's tensors as the weights: no file
        live = stof.Model.from_pretrained(d, batch=2, seq=8, dtype="fp16", weights=hf)
        g3 = live(torch.from_numpy(ids).cuda(), attention_mask=torch.from_numpy(mask).cuda())
        e = rel(g3.float().cpu().numpy()[real], ref[real])
        print(f"test_gpu: weights from the live transformers model: rel {e:.2e}")
        assert e < 1e-2
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            fn()
            print(f"{name}: ok")
    sys.exit(0)
