-- GPT-2 (Hugging Face GPT2Model, the 124M "gpt2" shape), pre-LayerNorm, causal.
--
-- Builds: token + position embeddings -> N blocks of
--     x = x + c_proj(attention(c_attn(ln_1(x))))       (causal, AND the mask if any)
--     x = x + mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x))))
-- -> ln_f, and outputs the last hidden state [batch, seq, 768], or with head = true the
-- logits [batch, seq, vocab] of the language-modelling head (tied to wte, as GPT2LMHeadModel).
--
-- From a Hugging Face model directory (stof graph|run|tune DIR), stof.config is its
-- config.json: n_embd, n_head, n_layer, n_inner, vocab_size, n_positions,
-- layer_norm_epsilon and activation_function come from it.
--
-- Parameters (--set key=value):
--   layers  0        more than 0: that many layers instead of the model's (12)
--   batch   8
--   seq     512      position table: max(1024, seq) rows
--   mask    "none"   a pattern name or text form (stof.mask.named), combined
--                    with causal: a pair is attended when both allow it
--   dtype   "fp16"   fp16, bf16 or fp32
--   head    false    (true from a directory of GPT2LMHeadModel) output the logits
--   padding false    (true from a model directory) an input attention_mask [batch, seq]
--                    (optional at run time; right padding); rows past a sequence's
--                    length are zeros before the head
--
-- GPT-2's Conv1D weights are stored [in, out]; they are declared [out, in] and read
-- transposed from a checkpoint (m:weight's transposed), so every projection is a GEMM
-- with [N, K] weights (nn.Linear's layout) as in the other models, and takes the same
-- kernels (the decode step's gemv among them). Weight names follow GPT2Model
-- (wte.weight, h.N.attn.c_attn.weight, ...).
local c = stof.config
local hf = require("hf")
local p = stof.params{layers = 0, batch = 8, seq = 512, mask = "none", dtype = "fp16",
                      head = hf.has_lm_head(c), padding = c ~= nil}

local H, heads, F, vocab, n_positions, eps, layers, tanh
if c then
  H, heads, layers = hf.need(c, "n_embd", true), hf.need(c, "n_head", true),
                     hf.need(c, "n_layer", true)
  F = c.n_inner and hf.need(c, "n_inner", true) or 4 * H
  vocab, n_positions = hf.need(c, "vocab_size", true), hf.need(c, "n_positions", true)
  eps = c.layer_norm_epsilon and hf.need(c, "layer_norm_epsilon") or 1e-5
  tanh = hf.activation(c.activation_function or "gelu_new", "activation_function")
  if tanh == "relu" then
    error("config.json: activation_function relu (stof's gpt2.lua runs gelu_new, "
          .. "gelu_pytorch_tanh, gelu)")
  end
  if p.seq > n_positions then
    error(string.format("seq %d is longer than the model's %d positions", p.seq, n_positions))
  end
else
  H, heads, F, vocab, layers, tanh = 768, 12, 3072, 50257, 12, true
  n_positions, eps = math.max(1024, p.seq), 1e-5
end
layers = p.layers > 0 and p.layers or layers

local m = stof.model{name = "gpt2", dtype = p.dtype}
local mask = stof.mask.named(p.mask)

local function layernorm(prefix, x)
  local g = m:weight(prefix .. ".weight", {H}, {init = "ones"})
  local b = m:weight(prefix .. ".bias", {H})
  return m:layernorm(x, g, b, {eps = eps, name = prefix})
end

-- A Conv1D: the checkpoint's weight [n_in, n_out], transposed as it is read into
-- [n_out, n_in] (nn.Linear's layout; the default scale follows the last dimension,
-- the fan-in).
local function conv1d(prefix, x, n_in, n_out)
  local w = m:weight(prefix .. ".weight", {n_out, n_in}, {transposed = true})
  local b = m:weight(prefix .. ".bias", {n_out})
  return m:linear(x, w, b, {name = prefix})
end

local ids = m:input("input_ids", {p.batch, p.seq}, {dtype = "int32", high = vocab})
local am = hf.attention_mask(m, p)
local wte = m:weight("wte.weight", {vocab, H})
local x = m:embedding(ids, wte,
                      {position = m:weight("wpe.weight", {n_positions, H}), name = "embeddings"})

for n = 0, layers - 1 do
  m:layer(function()
    local pre = "h." .. n
    local qkv = conv1d(pre .. ".attn.c_attn", layernorm(pre .. ".ln_1", x), H, 3 * H)
    local a = m:attention(qkv, {heads = heads, head_dim = H // heads, causal = true,
                                mask = mask, padding = am, name = pre .. ".attn"})
    x = m:add(x, conv1d(pre .. ".attn.c_proj", a, H, H))
    local h = conv1d(pre .. ".mlp.c_fc", layernorm(pre .. ".ln_2", x), H, F)
    x = m:add(x, conv1d(pre .. ".mlp.c_proj", m:gelu(h, {tanh = tanh}), F, H))
  end)
end

x = hf.zero_padding(m, layernorm("ln_f", x), am)
m:output(p.head and hf.lm_head(m, c, x, wte, vocab, H, true) or x)
return m
