-- Mistral and Llama (Hugging Face MistralModel / LlamaModel and their ForCausalLM), pre-RMSNorm,
-- causal, grouped-query attention with rotary position embeddings, SwiGLU MLP.
--
-- Builds: token embeddings -> N layers of
--     x = x + o_proj(attention(rotary(q_proj|k_proj|v_proj(input_layernorm(x)))))
--     x = x + down_proj(silu(gate_proj(h)) * up_proj(h)),  h = post_attention_layernorm(x)
-- -> norm, and the last hidden state [batch, seq, hidden] or, with head = true, the logits
-- [batch, seq, vocab] (lm_head, or the embedding when tie_word_embeddings).
-- Q has num_attention_heads heads, K and V num_key_value_heads (read in place by the
-- attention, no copies). With a sliding_window (Mistral), every layer attends the last
-- sliding_window tokens, the query's own included, as transformers does.
-- The q/k/v and the gate/up projections run as one GEMM each on weights stacked from the
-- checkpoint's tensors.
--
-- From a Hugging Face model directory only (stof.config is its config.json).
--
-- Parameters (--set key=value):
--   layers  0        more than 0: that many layers instead of the model's
--   batch   8
--   seq     512      at most max_position_embeddings
--   mask    "none"   a pattern name or text form (stof.mask.named), ANDed with the window
--   dtype   "fp16"   fp16, bf16 or fp32
--   head    (true for *ForCausalLM) output the logits
--   padding true     an input attention_mask [batch, seq] (optional at run time; right
--                    padding); rows past a sequence's length are zeros before the head
local hf = require("hf")
local c = hf.config("mistral.lua")
local p = stof.params{layers = 0, batch = 8, seq = 512, mask = "none", dtype = "fp16",
                      head = hf.has_lm_head(c), padding = true}

local H, F = hf.need(c, "hidden_size", true), hf.need(c, "intermediate_size", true)
local heads = hf.need(c, "num_attention_heads", true)
local kv_heads = c.num_key_value_heads and hf.need(c, "num_key_value_heads", true) or heads
local D = c.head_dim and hf.need(c, "head_dim", true) or H // heads
local L = p.layers > 0 and p.layers or hf.need(c, "num_hidden_layers", true)
local vocab, max_pos = hf.need(c, "vocab_size", true), hf.need(c, "max_position_embeddings", true)
local eps = c.rms_norm_eps and hf.need(c, "rms_norm_eps") or 1e-6
local theta = hf.rope_theta(c, 10000.0)
local window = c.sliding_window
if c.use_sliding_window == false then window = nil end
if c.hidden_act and c.hidden_act ~= "silu" then
  error(string.format("config.json: hidden_act '%s' (stof's mistral.lua runs silu)",
                      tostring(c.hidden_act)))
end
if p.seq > max_pos then
  error(string.format("seq %d is longer than the model's %d positions", p.seq, max_pos))
end
if heads % kv_heads ~= 0 then
  error(string.format("config.json: num_key_value_heads %d does not divide "
                      .. "num_attention_heads %d", kv_heads, heads))
end

local m = stof.model{name = c.model_type or "mistral", dtype = p.dtype}
local mask = stof.mask.named(p.mask)
if window then
  -- keys j with i - j < sliding_window (causal keeps j <= i)
  local w = stof.mask.sliding_window{band = hf.need(c, "sliding_window", true) - 1}
  mask = mask and w * mask or w
end

local function rmsnorm(name, x)
  return m:rmsnorm(x, m:weight(name .. ".weight", {H}, {init = "ones"}), {eps = eps, name = name})
end

-- A projection of the checkpoint's parts stacked along the output dim, with the bias when the
-- config says the model has one.
-- rows: each part's rows (nil: equal parts).
local function projection(name, x, n_out, n_in, parts, bias, rows)
  local w = m:weight(name .. ".weight", {n_out, n_in},
                     {from = hf.parts(parts, ".weight"), from_rows = rows})
  if bias then
    return m:linear(x, w, m:weight(name .. ".bias", {n_out}, {from = hf.parts(parts, ".bias"),
                                                            from_rows = rows}), {name = name})
  end
  return m:gemm(x, w, {name = name})
end

local ids = m:input("input_ids", {p.batch, p.seq}, {dtype = "int32", high = vocab})
local am = hf.attention_mask(m, p)
local wte = m:weight("embed_tokens.weight", {vocab, H})
local x = m:embedding(ids, wte, {name = "embed_tokens"})

for n = 0, L - 1 do
  m:layer(function()
    local pre = "layers." .. n
    local at = pre .. ".self_attn"
    local qkv = projection(at .. ".qkv", rmsnorm(pre .. ".input_layernorm", x),
                           (heads + 2 * kv_heads) * D, H,
                           {at .. ".q_proj", at .. ".k_proj", at .. ".v_proj"}, c.attention_bias,
                           {heads * D, kv_heads * D, kv_heads * D})
    qkv = m:rotary(qkv, {heads = heads, kv_heads = kv_heads, head_dim = D, theta = theta,
                         name = at .. ".rotary"})
    local a = m:attention(qkv, {heads = heads, kv_heads = kv_heads, head_dim = D, causal = true,
                                mask = mask, padding = am, name = at})
    x = m:add(x, projection(at .. ".o_proj", a, H, heads * D, nil, c.attention_bias))
    local h = rmsnorm(pre .. ".post_attention_layernorm", x)
    local u = projection(pre .. ".mlp.gate_up", h, 2 * F, H,
                         {pre .. ".mlp.gate_proj", pre .. ".mlp.up_proj"}, c.mlp_bias)
    local g = m:glu(u, {act = "silu", name = pre .. ".mlp.act"})
    x = m:add(x, projection(pre .. ".mlp.down_proj", g, H, F, nil, c.mlp_bias))
  end)
end

x = hf.zero_padding(m, rmsnorm("norm", x), am)
m:output(p.head and hf.lm_head(m, c, x, wte, vocab, H, false) or x)
return m
