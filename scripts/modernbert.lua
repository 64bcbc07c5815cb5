-- ModernBERT encoder (Hugging Face ModernBertModel), pre-norm, built for stof.
--
-- Builds: word embeddings -> LayerNorm -> N layers of
--     x = x + Wo . attention(rotary(Wqkv . attn_norm(x)))     (no attn_norm in layer 0)
--     x = x + Wo . glu(Wi . mlp_norm(x))                       (GeGLU: act(first half) * second)
-- -> final_norm, and outputs the last hidden state [batch, seq, hidden].
-- Every global_attn_every_n_layers-th layer (0, 3, 6, ...) attends globally with rotary theta
-- global_rope_theta; the others attend a sliding window of local_attention / 2 keys each side
-- with local_rope_theta: other classes of layers for the fusion search, each tuned.
--
-- Run from a Hugging Face model directory (stof graph|run|tune DIR): stof.config is its
-- config.json. Without one, the sizes of answerdotai/ModernBERT-base. Norms and projections
-- without a bias (norm_bias, attention_bias, mlp_bias false, as ModernBERT ships) get none:
-- a norm's shift is a constant zero, read from no file.
--
-- Parameters (--set key=value):
--   batch   8
--   seq     512     at most max_position_embeddings
--   mask    "none"  the global layers' pattern (the model's own: dense); a local layer
--                   attends its window AND this pattern
--   dtype   "fp16"  fp16, bf16 or fp32
--   padding true    an input attention_mask [batch, seq] (optional at run time; see bert.lua)
--   residual "auto" the residual stream's dtype (x above): "fp32", or "dtype" (the model's);
--                   "auto" is fp32 in bf16 (bf16's 8-bit mantissa, rounded at each of the 44
--                   residual adds, put the last hidden state 1.0e-2 from an fp32 run; kept in
--                   fp32 the stream leaves 2.4e-3) and the dtype otherwise
local hf = require("hf")
local c = stof.config or {hidden_size = 768, num_hidden_layers = 22, num_attention_heads = 12,
                          intermediate_size = 1152, vocab_size = 50368,
                          max_position_embeddings = 8192}
local p = stof.params{batch = 8, seq = 512, mask = "none", dtype = "fp16", padding = true,
                      residual = "auto"}

local H, L = hf.need(c, "hidden_size", true), hf.need(c, "num_hidden_layers", true)
local heads, F = hf.need(c, "num_attention_heads", true), hf.need(c, "intermediate_size", true)
local vocab, max_pos = hf.need(c, "vocab_size", true), hf.need(c, "max_position_embeddings", true)
local eps = c.norm_eps or 1e-5
local act = hf.activation(c.hidden_activation or "gelu", "hidden_activation")
if act == "relu" then
  error("config.json: hidden_activation relu (stof's ModernBERT runs the gelu GLUs)")
end
if p.seq > max_pos then
  error(string.format("seq %d is longer than the model's %d positions", p.seq, max_pos))
end

-- Which layers are local, and their rotary thetas: the config's layer_types and
-- rope_parameters when it has them, else the older keys.
local every = c.global_attn_every_n_layers or 3
local function is_local(i)
  if c.layer_types then
    local t = c.layer_types[i + 1]
    if t ~= "sliding_attention" and t ~= "full_attention" then
      error("config.json: layer_types[" .. (i + 1) .. "] '" .. tostring(t) .. "'")
    end
    return t == "sliding_attention"
  end
  return i % every ~= 0
end
local function theta(kind, legacy, default)
  local rp = c.rope_parameters and c.rope_parameters[kind]
  return (rp and rp.rope_theta) or c[legacy] or default
end
local global_theta = theta("full_attention", "global_rope_theta", 160000.0)
local local_theta = theta("sliding_attention", "local_rope_theta", 10000.0)
local window = c.sliding_window or (c.local_attention or 128) // 2
if p.residual ~= "auto" and p.residual ~= "fp32" and p.residual ~= "dtype" then
  error("residual '" .. tostring(p.residual) .. "': auto, fp32 or dtype")
end
-- the adds' options: the stream's dtype where it is not the model's
local stream = (p.residual == "fp32" or (p.residual == "auto" and p.dtype == "bf16"))
               and p.dtype ~= "fp32" and {dtype = "fp32"} or nil

local m = stof.model{name = "modernbert", dtype = p.dtype}
local global_mask = stof.mask.named(p.mask)
local local_mask = stof.mask.sliding_window{band = window}
if global_mask then local_mask = local_mask * global_mask end

local function layernorm(name, x)
  local g = m:weight(name .. ".weight", {H}, {init = "ones"})
  local b = m:weight(name .. ".bias", {H}, c.norm_bias and {} or {init = "zeros",
                                                                 constant = true})
  return m:layernorm(x, g, b, {eps = eps, name = name})
end

local function linear(name, x, n_out, n_in, bias)
  local w = m:weight(name .. ".weight", {n_out, n_in})
  if bias then
    return m:linear(x, w, m:weight(name .. ".bias", {n_out}), {name = name})
  end
  return m:gemm(x, w, {name = name})
end

local ids = m:input("input_ids", {p.batch, p.seq}, {dtype = "int32", high = vocab})
local am = hf.attention_mask(m, p)
local x = m:embedding(ids, m:weight("embeddings.tok_embeddings.weight", {vocab, H}),
                      {name = "embeddings"})
x = layernorm("embeddings.norm", x)

local D = H // heads
for n = 0, L - 1 do
  m:layer(function()
    local pre = "layers." .. n
    local loc = is_local(n)
    local h = n == 0 and x or layernorm(pre .. ".attn_norm", x)
    local qkv = linear(pre .. ".attn.Wqkv", h, 3 * H, H, c.attention_bias)
    qkv = m:rotary(qkv, {heads = heads, head_dim = D, theta = loc and local_theta or global_theta,
                         name = pre .. ".attn.rotary"})
    local a = m:attention(qkv, {heads = heads, head_dim = D, padding = am,
                                mask = loc and local_mask or global_mask, name = pre .. ".attn"})
    x = m:add(x, linear(pre .. ".attn.Wo", a, H, H, c.attention_bias), stream)
    local u = linear(pre .. ".mlp.Wi", layernorm(pre .. ".mlp_norm", x), 2 * F, H, c.mlp_bias)
    local g = m:glu(u, {act = act and "gelu_tanh" or "gelu", name = pre .. ".mlp.glu"})
    x = m:add(x, linear(pre .. ".mlp.Wo", g, H, F, c.mlp_bias), stream)
  end)
end

m:output(hf.zero_padding(m, layernorm("final_norm", x), am))
return m
