-- DistilBERT encoder (Hugging Face DistilBertModel), post-LayerNorm, built for stof.
--
-- Builds: word + position embeddings -> LayerNorm (eps 1e-12) -> N layers of
--     x = sa_layer_norm(x + out_lin . attention(q_lin, k_lin, v_lin . x))
--     x = output_layer_norm(x + lin2 . act(lin1 . x))
-- and outputs the last hidden state [batch, seq, dim].
--
-- Run from a Hugging Face model directory (stof graph|run|tune DIR): stof.config is its
-- config.json (dim, n_layers, n_heads, hidden_dim, vocab_size, max_position_embeddings,
-- activation). Without one, the sizes of distilbert-base-uncased.
--
-- Parameters (--set key=value):
--   batch   8
--   seq     512     at most max_position_embeddings
--   mask    "none"  dense, as the model was trained; a pattern name or text form
--   dtype   "fp16"  fp16, bf16 or fp32
--   padding true    an input attention_mask [batch, seq] (optional at run time; see bert.lua)
--
-- Weight names follow DistilBertModel (embeddings..., transformer.layer.N...); the fused QKV
-- projection transformer.layer.N.attention.qkv.{weight,bias} is stacked from q_lin, k_lin and
-- v_lin. A checkpoint's "distilbert." prefix is found by itself.
local c = stof.config or {dim = 768, n_layers = 6, n_heads = 12, hidden_dim = 3072,
                          vocab_size = 30522, max_position_embeddings = 512,
                          activation = "gelu"}
local p = stof.params{batch = 8, seq = 512, mask = "none", dtype = "fp16", padding = true}

local hf = require("hf")
local function need(key) return hf.need(c, key, true) end

local H, L, heads, F = need("dim"), need("n_layers"), need("n_heads"), need("hidden_dim")
local vocab, max_pos = need("vocab_size"), need("max_position_embeddings")
local act = hf.activation(c.activation or "gelu", "activation")
if p.seq > max_pos then
  error(string.format("seq %d is longer than the model's %d positions", p.seq, max_pos))
end
local eps = 1e-12

local m = stof.model{name = "distilbert", dtype = p.dtype}
local mask = stof.mask.named(p.mask)

local function layernorm(prefix, x)
  return m:layernorm(x, m:weight(prefix .. ".weight", {H}, {init = "ones"}),
                     m:weight(prefix .. ".bias", {H}), {eps = eps, name = prefix})
end

-- parts: the checkpoint's projections a fused weight is stacked from
local function linear(name, x, n_out, n_in, parts)
  return m:linear(x, m:weight(name .. ".weight", {n_out, n_in},
                              {from = hf.parts(parts, ".weight")}),
                  m:weight(name .. ".bias", {n_out}, {from = hf.parts(parts, ".bias")}),
                  {name = name})
end

local ids = m:input("input_ids", {p.batch, p.seq}, {dtype = "int32", high = vocab})
local am = hf.attention_mask(m, p)
local x = m:embedding(ids, m:weight("embeddings.word_embeddings.weight", {vocab, H}), {
  position = m:weight("embeddings.position_embeddings.weight", {max_pos, H}),
  name = "embeddings",
})
x = layernorm("embeddings.LayerNorm", x)

for n = 0, L - 1 do
  m:layer(function()
    local pre = "transformer.layer." .. n
    local a_pre = pre .. ".attention"
    local qkv = linear(a_pre .. ".qkv", x, 3 * H, H,
                       {a_pre .. ".q_lin", a_pre .. ".k_lin", a_pre .. ".v_lin"})
    local a = m:attention(qkv, {heads = heads, head_dim = H // heads, mask = mask,
                                padding = am, name = a_pre})
    x = layernorm(pre .. ".sa_layer_norm", m:add(linear(a_pre .. ".out_lin", a, H, H), x))
    local h = linear(pre .. ".ffn.lin1", x, F, H)
    h = hf.apply(m, act, h)
    x = layernorm(pre .. ".output_layer_norm", m:add(linear(pre .. ".ffn.lin2", h, H, F), x))
  end)
end

m:output(hf.zero_padding(m, x, am))
return m
