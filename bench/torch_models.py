"""BERT, GPT-2 and T5 in plain PyTorch, on Hugging Face weights, with pluggable attention.

Shared by bench/parity.py and bench/e2e.py. Three things live here:

  - SPECS and build_hf_model(): the Hugging Face model of each benchmark name, built from its
    config (never downloaded), randomly initialised from a seed, with every bias and norm gain
    moved off its 0/1 init and T5's relative-position table widened, so that a tensor loaded in
    the wrong place shows up in the output;
  - canonical_state_dict(): that model's weights under the checkpoint names stof's scripts use
    (GPT-2 Conv1D weights [in, out]), and stof_weights(): the same, cut to the position-table
    size the script declares, ready for safetensors;
  - TorchModel: the same forward pass written with torch.nn.functional, whose self-attention is
    either SDPA with a dense mask ("sdpa") or FlexAttention with a BlockMask ("flex"), so that
    eager, torch.compile(FlexAttention) and torch.compile(reduce-overhead) all run the same
    weights and the same mask. validate it against the Hugging Face model with
    hf_forward() in dense mode (bench/e2e.py and bench/parity.py do).

Needs torch; transformers only for build_hf_model() and hf_forward().
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # FlexAttention missing: the "flex" kind fails when used, nothing else
    create_block_mask = flex_attention = None

# name -> family, stof script, its --set parameters, Hugging Face config overrides
SPECS = {
    "bert-small": {"family": "bert", "script": "scripts/bert.lua", "sets": {"preset": "small"},
                   "config": {"hidden_size": 512, "num_hidden_layers": 4,
                              "num_attention_heads": 8, "intermediate_size": 2048}},
    "bert-base": {"family": "bert", "script": "scripts/bert.lua", "sets": {"preset": "base"},
                  "config": {"hidden_size": 768, "num_hidden_layers": 12,
                             "num_attention_heads": 12, "intermediate_size": 3072}},
    "bert-large": {"family": "bert", "script": "scripts/bert.lua", "sets": {"preset": "large"},
                   "config": {"hidden_size": 1024, "num_hidden_layers": 24,
                              "num_attention_heads": 16, "intermediate_size": 4096}},
    "gpt2": {"family": "gpt2", "script": "scripts/gpt2.lua", "sets": {},
             "config": {"n_embd": 768, "n_layer": 12, "n_head": 12}},
    "t5-small": {"family": "t5", "script": "scripts/t5.lua", "sets": {"preset": "t5-small"},
                 "config": {"d_model": 512, "d_ff": 2048, "d_kv": 64, "num_heads": 8,
                            "num_layers": 6}},
    "t5-base": {"family": "t5", "script": "scripts/t5.lua", "sets": {"preset": "t5-base"},
                "config": {"d_model": 768, "d_ff": 3072, "d_kv": 64, "num_heads": 12,
                           "num_layers": 12}},
}

VOCAB = {"bert": 30522, "gpt2": 50257, "t5": 32128}

# Constants the stof scripts hard-code, for a plain check that they agree with the configs.
SCRIPT_MARKERS = {
    "bert": ["math.max(512, p.seq), 1e-12, false"],  # eps 1e-12, erf GELU
    "gpt2": ["768, 12, 3072, 50257, 12, true", "n_positions, eps = math.max(1024, p.seq), 1e-5"],
    "t5": ["max_distance, eps = 32128, 32, 128, 1e-6", "scale = 1.0", "m:relu("],
}

EMBEDDING_TABLES = {
    "bert": ("embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
             "embeddings.token_type_embeddings.weight"),
    "gpt2": ("wte.weight", "wpe.weight"),
    "t5": ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"),
}


def family(name):
    return SPECS[name]["family"]


def position_rows(name, seq):
    """Rows of the position table the stof script declares for this sequence length."""
    fam = family(name)
    if fam == "bert":
        return max(512, seq)
    if fam == "gpt2":
        return max(1024, seq)
    return 0


# ---- Hugging Face models ---------------------------------------------------------------------

def hf_config(name, max_seq):
    """The transformers config of a benchmark name, dropout off, positions for max_seq."""
    import transformers
    spec = SPECS[name]
    fam = spec["family"]
    kw = dict(spec["config"])
    if fam == "bert":
        kw.update(max_position_embeddings=position_rows(name, max_seq), hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0, hidden_act="gelu", layer_norm_eps=1e-12,
                  vocab_size=VOCAB["bert"], type_vocab_size=2)
        return transformers.BertConfig(**kw)
    if fam == "gpt2":
        kw.update(n_positions=position_rows(name, max_seq), resid_pdrop=0.0, embd_pdrop=0.0,
                  attn_pdrop=0.0, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                  vocab_size=VOCAB["gpt2"])
        return transformers.GPT2Config(**kw)
    kw.update(relative_attention_num_buckets=32, relative_attention_max_distance=128,
              feed_forward_proj="relu", dropout_rate=0.0, layer_norm_epsilon=1e-6,
              vocab_size=VOCAB["t5"], is_encoder_decoder=True)
    return transformers.T5Config(**kw)


def config_mismatches(name, cfg):
    """What in a transformers config differs from the constants of the stof script."""
    fam = family(name)
    want = {
        "bert": {"layer_norm_eps": 1e-12, "hidden_act": "gelu", "position_embedding_type":
                 "absolute"},
        "gpt2": {"layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
                 "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                 "reorder_and_upcast_attn": False},
        "t5": {"layer_norm_epsilon": 1e-6, "feed_forward_proj": "relu",
               "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128},
    }[fam]
    out = []
    for key, value in want.items():
        got = getattr(cfg, key, value)
        if got != value:
            out.append(f"{key} = {got!r} (stof script: {value!r})")
    return out


def script_mismatches(name, script_path):
    """Markers of the constants above that are missing from the stof script's text."""
    try:
        with open(script_path) as f:
            text = f.read()
    except OSError as e:
        return [f"cannot read {script_path}: {e}"]
    return [f"'{m}' not found in {script_path}" for m in SCRIPT_MARKERS[family(name)]
            if m not in text]


def base_config(arch, max_seq):
    """(config, model constructor) of the architecture's base checkpoint (transformers'
    defaults: bert-base (no pooler), roberta-base, distilbert-base-uncased, gpt2,
    ModernBERT-base, longformer-base-4096), positions for max_seq: bench/hf_dirs.py and
    bench/hf_speed.py build their models from it."""
    import transformers as tr
    if arch == "bert":
        return tr.BertConfig(max_position_embeddings=max(512, max_seq)), \
            lambda cfg: tr.BertModel(cfg, add_pooling_layer=False)
    if arch == "roberta":
        return tr.RobertaConfig(vocab_size=50265, max_position_embeddings=max(512, max_seq) + 2,
                                type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5), \
            tr.RobertaModel
    if arch == "distilbert":
        return tr.DistilBertConfig(max_position_embeddings=max(512, max_seq)), \
            tr.DistilBertModel
    if arch == "longformer":  # longformer-base-4096's sizes: windows of 512
        return tr.LongformerConfig(vocab_size=50265, max_position_embeddings=max(4096, max_seq) + 2,
                                   type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5,
                                   attention_window=512), tr.LongformerModel
    if arch == "modernbert":
        return tr.ModernBertConfig(max_position_embeddings=max(8192, max_seq), pad_token_id=0,
                                   bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                   sep_token_id=2), tr.ModernBertModel
    return tr.GPT2Config(n_positions=max(1024, max_seq)), tr.GPT2Model


def perturb_(model, seed):
    """Moves every 1-D parameter (biases, norm gains) off its 0 / 1 init and gives T5's
    relative-position tables unit scale: a weight loaded in the wrong place then changes the
    output instead of hiding behind a zero."""
    g = torch.Generator().manual_seed(seed + 7919)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.is_floating_point():
                continue
            if "relative_attention_bias" in name:
                p.copy_(torch.randn(p.shape, generator=g).to(p))
            elif p.ndim == 1:
                p.add_((0.05 * torch.randn(p.shape, generator=g)).to(p))


def build_hf_model(name, max_seq, seed=0, dtype=torch.float16, device="cuda", perturb=True):
    """The Hugging Face model (BertModel without pooler, GPT2Model, T5Model) of a benchmark name,
    random from seed, eval mode, on device in dtype."""
    import transformers
    cfg = hf_config(name, max_seq)
    torch.manual_seed(seed)
    fam = family(name)
    if fam == "bert":
        model = transformers.BertModel(cfg, add_pooling_layer=False)
    elif fam == "gpt2":
        model = transformers.GPT2Model(cfg)
    else:
        model = transformers.T5Model(cfg)
    if perturb:
        perturb_(model, seed)
    return model.eval().to(device=device, dtype=dtype)


def hf_forward(name, model, ids, dec_ids=None, attention_mask=None):
    """last_hidden_state of the Hugging Face model (T5: the decoder's)."""
    kw = {}
    if attention_mask is not None:
        kw["attention_mask"] = attention_mask
    fam = family(name)
    with torch.no_grad():
        if fam == "t5":
            out = model(input_ids=ids, decoder_input_ids=dec_ids, use_cache=False, **kw)
        elif fam == "gpt2":
            out = model(input_ids=ids, use_cache=False, **kw)
        else:
            out = model(input_ids=ids, **kw)
    return out.last_hidden_state


def _gpt2_uses_conv1d(model):
    mod = model.h[0].attn.c_attn
    return type(mod).__name__ == "Conv1D" or not isinstance(mod, nn.Linear)


def canonical_state_dict(name, model):
    """The model's tensors under checkpoint names, in checkpoint layout (GPT-2 projections as
    Conv1D [in, out], whatever class this transformers version uses), floating point only,
    detached, sharing storage with the model (tied tensors appear under each name)."""
    sd = {}
    for key, t in model.state_dict().items():
        if torch.is_tensor(t) and t.is_floating_point():
            sd[key] = t.detach()
    if family(name) == "gpt2" and not _gpt2_uses_conv1d(model):
        for key in list(sd):
            if key.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
                sd[key] = sd[key].t()
    if family(name) == "t5" and "shared.weight" not in sd:
        for alias in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
            if alias in sd:
                sd["shared.weight"] = sd[alias]
                break
    return sd


def stof_weights(name, sd, seq, dtype=torch.float16):
    """{name: CPU tensor} for safetensors.torch.save_file: every tensor cloned (no shared
    storage), contiguous, in dtype, the position table cut to the rows the stof script
    declares for seq."""
    rows = position_rows(name, seq)
    out = {}
    for key, t in sd.items():
        if rows and key in ("embeddings.position_embeddings.weight", "wpe.weight"):
            if t.shape[0] < rows:
                raise ValueError(f"{key} has {t.shape[0]} rows, the script needs {rows}")
            t = t[:rows]
        out[key] = t.detach().to(device="cpu", dtype=dtype).contiguous().clone()
    return out


def weight_bytes(name, sd, bytes_per_value=2):
    """Bytes of the weights a forward pass streams: everything but the embedding tables (of
    which it reads only the rows of its tokens)."""
    skip = set(EMBEDDING_TABLES[family(name)])
    return sum(t.numel() * bytes_per_value for k, t in sd.items() if k not in skip)


# ---- masks -----------------------------------------------------------------------------------

def causal_dense(q_len, k_len, device):
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    return j <= i + (k_len - q_len)


def block_mask_from_dense(dense):
    """A FlexAttention BlockMask equal to a dense bool mask [Sq, Sk] (CUDA)."""
    if create_block_mask is None:
        raise RuntimeError("torch.nn.attention.flex_attention is not available")
    dm = dense.contiguous()
    q_len, k_len = dm.shape

    def mask_mod(b, h, q_idx, kv_idx):
        return dm[q_idx, kv_idx]

    return create_block_mask(mask_mod, None, None, q_len, k_len, device=str(dm.device))


def t5_bucket(q_len, k_len, bidirectional, num_buckets=32, max_distance=128, device="cuda"):
    """Hugging Face T5's relative-position bucket of every (query i, key j), from j - i."""
    ctx = torch.arange(q_len, dtype=torch.long, device=device)[:, None]
    mem = torch.arange(k_len, dtype=torch.long, device=device)[None, :]
    rel = mem - ctx
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (rel > 0).long() * num_buckets
        rel = rel.abs()
    else:
        rel = -torch.min(rel, torch.zeros_like(rel))
    max_exact = num_buckets // 2
    is_small = rel < max_exact
    large = max_exact + (torch.log(rel.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, rel, large)


# ---- attention -------------------------------------------------------------------------------

def attend(kind, q, k, v, scale, mask=None, causal=False, bias=None):
    """q, k, v [B, H, S, D] -> [B, H, Sq, D].

    kind "sdpa": mask is None or a bool/additive tensor broadcastable to [B, H, Sq, Sk] (T5's
    position bias already folded in); causal without a mask uses is_causal.
    kind "flex": mask is None or a BlockMask (causality already in it), bias None or [H, Sq, Sk]
    added to the scores through a score_mod. Attention with neither falls back to SDPA (dense
    FlashAttention), which is what a user would run there."""
    if kind == "flex" and (mask is not None or bias is not None):
        score_mod = None
        if bias is not None:
            def score_mod(score, b, h, q_idx, kv_idx):
                return score + bias[h, q_idx, kv_idx]
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                          is_causal=bool(causal and mask is None), scale=scale)


def _heads(t, n, heads):
    """[B, S, n*H*D] -> n tensors [B, H, S, D] (views)."""
    b, s, w = t.shape
    d = w // (n * heads)
    return t.view(b, s, n, heads, d).permute(2, 0, 3, 1, 4).unbind(0)


def _merge(a):
    """[B, H, S, D] -> [B, S, H*D]."""
    b, h, s, d = a.shape
    return a.transpose(1, 2).reshape(b, s, h * d)


def _rms(x, w, eps):
    """Hugging Face T5LayerNorm."""
    var = x.float().pow(2).mean(-1, keepdim=True)
    y = x * torch.rsqrt(var + eps)
    if w.dtype in (torch.float16, torch.bfloat16):
        y = y.to(w.dtype)
    return w * y


def _param(t, dtype, device):
    return nn.Parameter(t.detach().to(device=device, dtype=dtype), requires_grad=False)


class _Layer(nn.Module):
    def _set(self, name, t, dtype, device):
        setattr(self, name, _param(t, dtype, device))


class BertLayer(_Layer):
    def __init__(self, sd, n, heads, kind, dtype, device):
        super().__init__()
        p = f"encoder.layer.{n}."
        a = p + "attention.self."
        self.heads, self.kind, self.eps = heads, kind, 1e-12
        self._set("wqkv", torch.cat([sd[a + "query.weight"], sd[a + "key.weight"],
                                     sd[a + "value.weight"]]), dtype, device)
        self._set("bqkv", torch.cat([sd[a + "query.bias"], sd[a + "key.bias"],
                                     sd[a + "value.bias"]]), dtype, device)
        for attr, key in (("wo", "attention.output.dense.weight"),
                          ("bo", "attention.output.dense.bias"),
                          ("g1", "attention.output.LayerNorm.weight"),
                          ("b1", "attention.output.LayerNorm.bias"),
                          ("wi", "intermediate.dense.weight"), ("bi", "intermediate.dense.bias"),
                          ("wo2", "output.dense.weight"), ("bo2", "output.dense.bias"),
                          ("g2", "output.LayerNorm.weight"), ("b2", "output.LayerNorm.bias")):
            self._set(attr, sd[p + key], dtype, device)

    def forward(self, x, aux):
        hidden = x.shape[-1]
        q, k, v = _heads(F.linear(x, self.wqkv, self.bqkv), 3, self.heads)
        a = attend(self.kind, q, k, v, 1.0 / math.sqrt(q.shape[-1]), mask=aux["mask"])
        x = F.layer_norm(x + F.linear(_merge(a), self.wo, self.bo), (hidden,), self.g1, self.b1,
                         self.eps)
        h = F.gelu(F.linear(x, self.wi, self.bi))
        return F.layer_norm(x + F.linear(h, self.wo2, self.bo2), (hidden,), self.g2, self.b2,
                            self.eps)


class GPT2Block(_Layer):
    def __init__(self, sd, n, heads, kind, dtype, device):
        super().__init__()
        p = f"h.{n}."
        self.heads, self.kind, self.eps = heads, kind, 1e-5
        for attr, key in (("g1", "ln_1.weight"), ("b1", "ln_1.bias"), ("g2", "ln_2.weight"),
                          ("b2", "ln_2.bias"), ("bqkv", "attn.c_attn.bias"),
                          ("bo", "attn.c_proj.bias"), ("bi", "mlp.c_fc.bias"),
                          ("bo2", "mlp.c_proj.bias")):
            self._set(attr, sd[p + key], dtype, device)
        # Conv1D [in, out] -> nn.Linear layout [out, in]
        for attr, key in (("wqkv", "attn.c_attn.weight"), ("wo", "attn.c_proj.weight"),
                          ("wi", "mlp.c_fc.weight"), ("wo2", "mlp.c_proj.weight")):
            self._set(attr, sd[p + key].t().contiguous(), dtype, device)

    def forward(self, x, aux):
        hidden = x.shape[-1]
        h = F.layer_norm(x, (hidden,), self.g1, self.b1, self.eps)
        q, k, v = _heads(F.linear(h, self.wqkv, self.bqkv), 3, self.heads)
        a = attend(self.kind, q, k, v, 1.0 / math.sqrt(q.shape[-1]), mask=aux["mask"],
                   causal=True)
        x = x + F.linear(_merge(a), self.wo, self.bo)
        h = F.layer_norm(x, (hidden,), self.g2, self.b2, self.eps)
        return x + F.linear(F.gelu(F.linear(h, self.wi, self.bi), approximate="tanh"), self.wo2,
                            self.bo2)


class T5EncoderBlock(_Layer):
    def __init__(self, sd, n, heads, kind, dtype, device):
        super().__init__()
        p = f"encoder.block.{n}.layer."
        a = p + "0.SelfAttention."
        self.heads, self.kind, self.eps = heads, kind, 1e-6
        self._set("wqkv", torch.cat([sd[a + "q.weight"], sd[a + "k.weight"], sd[a + "v.weight"]]),
                  dtype, device)
        for attr, key in (("wo", "0.SelfAttention.o.weight"), ("g0", "0.layer_norm.weight"),
                          ("g1", "1.layer_norm.weight"), ("wi", "1.DenseReluDense.wi.weight"),
                          ("wo2", "1.DenseReluDense.wo.weight")):
            self._set(attr, sd[p + key], dtype, device)

    def forward(self, x, aux):
        q, k, v = _heads(F.linear(_rms(x, self.g0, self.eps), self.wqkv), 3, self.heads)
        a = attend(self.kind, q, k, v, 1.0, mask=aux["mask"], bias=aux["bias"])
        x = x + F.linear(_merge(a), self.wo)
        h = F.relu(F.linear(_rms(x, self.g1, self.eps), self.wi))
        return x + F.linear(h, self.wo2)


class T5DecoderBlock(_Layer):
    def __init__(self, sd, n, heads, kind, dtype, device):
        super().__init__()
        p = f"decoder.block.{n}.layer."
        a = p + "0.SelfAttention."
        c = p + "1.EncDecAttention."
        self.heads, self.kind, self.eps = heads, kind, 1e-6
        self._set("wqkv", torch.cat([sd[a + "q.weight"], sd[a + "k.weight"], sd[a + "v.weight"]]),
                  dtype, device)
        self._set("wkv", torch.cat([sd[c + "k.weight"], sd[c + "v.weight"]]), dtype, device)
        for attr, key in (("wo", "0.SelfAttention.o.weight"), ("g0", "0.layer_norm.weight"),
                          ("wq_x", "1.EncDecAttention.q.weight"),
                          ("wo_x", "1.EncDecAttention.o.weight"), ("g1", "1.layer_norm.weight"),
                          ("g2", "2.layer_norm.weight"), ("wi", "2.DenseReluDense.wi.weight"),
                          ("wo2", "2.DenseReluDense.wo.weight")):
            self._set(attr, sd[p + key], dtype, device)

    def forward(self, y, enc, aux):
        q, k, v = _heads(F.linear(_rms(y, self.g0, self.eps), self.wqkv), 3, self.heads)
        a = attend(self.kind, q, k, v, 1.0, mask=aux["mask"], causal=True, bias=aux["bias"])
        y = y + F.linear(_merge(a), self.wo)
        (q,) = _heads(F.linear(_rms(y, self.g1, self.eps), self.wq_x), 1, self.heads)
        k, v = _heads(F.linear(enc, self.wkv), 2, self.heads)
        y = y + F.linear(_merge(attend(self.kind, q, k, v, 1.0)), self.wo_x)
        h = F.relu(F.linear(_rms(y, self.g2, self.eps), self.wi))
        return y + F.linear(h, self.wo2)


def _strip_prefix(sd, fam):
    """Accepts checkpoints saved from BertForX ("bert."), GPT2LMHeadModel ("transformer."), ..."""
    probe = {"bert": "embeddings.word_embeddings.weight", "gpt2": "wte.weight",
             "t5": "shared.weight"}[fam]
    if probe in sd:
        return sd
    for key in sd:
        if key.endswith("." + probe):
            prefix = key[: -len(probe)]
            return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    raise KeyError(f"{probe} not found in the state dict")


class TorchModel(nn.Module):
    """The forward pass of a benchmark model in plain PyTorch.

        tm = TorchModel("bert-base", sd, kind="sdpa")     # or "flex"
        aux = tm.make_aux(seq, dense_mask)                 # dense_mask: bool [S, S] CUDA or None
        out = tm(ids, None, aux)                           # T5: tm(ids, dec_ids, aux)

    For GPT-2 the model is always causal (dense_mask is ANDed with causal); for T5 the mask is
    the encoder's self-attention mask (the decoder is causal, cross-attention dense)."""

    def __init__(self, name, sd, kind="sdpa", dtype=torch.float16, device="cuda"):
        super().__init__()
        if kind not in ("sdpa", "flex"):
            raise ValueError(f"kind {kind!r}: sdpa or flex")
        self.name, self.fam, self.kind = name, family(name), kind
        self.dtype, self.device = dtype, torch.device(device)
        sd = _strip_prefix(sd, self.fam)
        cfg = SPECS[name]["config"]
        if self.fam == "bert":
            heads, n_layers = cfg["num_attention_heads"], cfg["num_hidden_layers"]
            self.word = _param(sd["embeddings.word_embeddings.weight"], dtype, device)
            self.pos = _param(sd["embeddings.position_embeddings.weight"], dtype, device)
            self.tok = _param(sd["embeddings.token_type_embeddings.weight"], dtype, device)
            self.emb_g = _param(sd["embeddings.LayerNorm.weight"], dtype, device)
            self.emb_b = _param(sd["embeddings.LayerNorm.bias"], dtype, device)
            self.layers = nn.ModuleList(BertLayer(sd, n, heads, kind, dtype, device)
                                        for n in range(n_layers))
        elif self.fam == "gpt2":
            heads, n_layers = cfg["n_head"], cfg["n_layer"]
            self.wte = _param(sd["wte.weight"], dtype, device)
            self.wpe = _param(sd["wpe.weight"], dtype, device)
            self.lnf_g = _param(sd["ln_f.weight"], dtype, device)
            self.lnf_b = _param(sd["ln_f.bias"], dtype, device)
            self.layers = nn.ModuleList(GPT2Block(sd, n, heads, kind, dtype, device)
                                        for n in range(n_layers))
        else:
            heads, n_layers = cfg["num_heads"], cfg["num_layers"]
            rel = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"
            self.shared = _param(sd["shared.weight"], dtype, device)
            self.enc_rel = _param(sd["encoder." + rel], dtype, device)
            self.dec_rel = _param(sd["decoder." + rel], dtype, device)
            self.enc_g = _param(sd["encoder.final_layer_norm.weight"], dtype, device)
            self.dec_g = _param(sd["decoder.final_layer_norm.weight"], dtype, device)
            self.layers = nn.ModuleList(T5EncoderBlock(sd, n, heads, kind, dtype, device)
                                        for n in range(n_layers))
            self.dec_layers = nn.ModuleList(T5DecoderBlock(sd, n, heads, kind, dtype, device)
                                            for n in range(n_layers))

    # -- per-shape constants (masks, BlockMasks, T5 buckets): made once, outside any timing --
    def make_aux(self, seq, dense_mask=None, dec_seq=None):
        dev = self.device
        if dense_mask is not None:
            dense_mask = dense_mask.to(device=dev, dtype=torch.bool)
            if tuple(dense_mask.shape) != (seq, seq):
                raise ValueError(f"mask {tuple(dense_mask.shape)} for seq {seq}")
        flex = self.kind == "flex"
        if self.fam in ("bert", "gpt2"):
            m = dense_mask
            if self.fam == "gpt2" and m is not None:
                m = m & causal_dense(seq, seq, dev)
            if flex:
                if m is None and self.fam == "gpt2":
                    m = causal_dense(seq, seq, dev)
                return {"mask": block_mask_from_dense(m) if m is not None else None}
            return {"mask": m[None, None] if m is not None else None}
        dec_seq = dec_seq or seq
        aux = {"enc_bucket": t5_bucket(seq, seq, True, device=dev),
               "dec_bucket": t5_bucket(dec_seq, dec_seq, False, device=dev)}
        if flex:
            aux["enc_mask"] = block_mask_from_dense(dense_mask) if dense_mask is not None else None
            aux["dec_mask"] = block_mask_from_dense(causal_dense(dec_seq, dec_seq, dev))
        else:
            zero = torch.zeros((), dtype=self.dtype, device=dev)
            ninf = torch.full((), float("-inf"), dtype=self.dtype, device=dev)
            aux["enc_add"] = (torch.where(dense_mask, zero, ninf) if dense_mask is not None
                              else torch.zeros(seq, seq, dtype=self.dtype, device=dev))
            aux["dec_add"] = torch.where(causal_dense(dec_seq, dec_seq, dev), zero, ninf)
        return aux

    def forward(self, ids, dec_ids=None, aux=None):
        s = ids.shape[1]
        if self.fam == "bert":
            x = F.embedding(ids, self.word) + self.pos[:s] + self.tok[0]
            x = F.layer_norm(x, (x.shape[-1],), self.emb_g, self.emb_b, 1e-12)
            for layer in self.layers:
                x = layer(x, aux)
            return x
        if self.fam == "gpt2":
            x = F.embedding(ids, self.wte) + self.wpe[:s]
            for layer in self.layers:
                x = layer(x, aux)
            return F.layer_norm(x, (x.shape[-1],), self.lnf_g, self.lnf_b, 1e-5)
        # T5: the position bias [H, Sq, Sk] of each stack, computed every forward as HF does.
        # Contiguous: a permuted view (last-dim stride H) would make the SDPA mask below strided,
        # and SDPA then falls back to its math kernel (measured: 8x slower at (16, 2048)).
        enc_bias = F.embedding(aux["enc_bucket"], self.enc_rel).permute(2, 0, 1).contiguous()
        dec_bias = F.embedding(aux["dec_bucket"], self.dec_rel).permute(2, 0, 1).contiguous()
        if self.kind == "flex":
            enc_aux = {"mask": aux["enc_mask"], "bias": enc_bias}
            dec_aux = {"mask": aux["dec_mask"], "bias": dec_bias}
        else:
            enc_aux = {"mask": (enc_bias + aux["enc_add"])[None], "bias": None}
            dec_aux = {"mask": (dec_bias + aux["dec_add"])[None], "bias": None}
        x = F.embedding(ids, self.shared)
        for layer in self.layers:
            x = layer(x, enc_aux)
        enc = _rms(x, self.enc_g, 1e-6)
        y = F.embedding(dec_ids, self.shared)
        for layer in self.dec_layers:
            y = layer(y, enc, dec_aux)
        return _rms(y, self.dec_g, 1e-6)

    def blocks(self):
        out = list(self.layers)
        if self.fam == "t5":
            out += list(self.dec_layers)
        return out

    def compile_layers(self, **kw):
        """Regional compilation: torch.compile on each layer (the same code, compiled once per
        shape and reused by every layer); embeddings and final norms stay eager."""
        for layer in self.blocks():
            layer.compile(**kw)

    def aux_tensors(self, aux):
        return [t for t in aux.values() if torch.is_tensor(t)]


def rel_error(out, ref):
    """(relative Frobenius error, max abs error, non-finite count) in fp32."""
    a = out.detach().float()
    b = ref.detach().float().to(a.device)
    if a.shape != b.shape:
        raise ValueError(f"output shape {tuple(a.shape)} != reference {tuple(b.shape)}")
    nonfinite = int((~torch.isfinite(a)).sum().item())
    diff = torch.nan_to_num(a - b, nan=float("inf"))
    denom = b.norm().item()
    rel = diff.norm().item() / denom if denom > 0 else float("inf")
    return rel, diff.abs().max().item(), nonfinite
