-- GPT-Neo (Hugging Face GPTNeoModel / GPTNeoForCausalLM), pre-LayerNorm, causal.
--
-- Builds: token + position embeddings -> N blocks of
--     x = x + out_proj(attention(q_proj|k_proj|v_proj(ln_1(x))))
--     x = x + mlp.c_proj(act(mlp.c_fc(ln_2(x))))
-- -> ln_f, and the last hidden state [batch, seq, hidden] or, with head = true, the logits
-- [batch, seq, vocab] of the head tied to wte.
-- Layers alternate as the config's attention_types say: "global" layers attend every earlier
-- token, "local" ones the last window_size tokens (the query's own included), each a class
-- of layers of its own for the fusion search. GPT-Neo does not scale q.k (scale 1), and its
-- q, k and v projections have no bias: they run as one GEMM on the weights stacked from the
-- checkpoint's three.
--
-- From a Hugging Face model directory only (stof.config is its config.json).
--
-- Parameters (--set key=value):
--   layers  0        more than 0: that many layers instead of the model's
--   batch   8
--   seq     512      at most max_position_embeddings
--   mask    "none"   a pattern name or text form (stof.mask.named), ANDed with every layer's
--   dtype   "fp16"   fp16, bf16 or fp32
--   head    (true for GPTNeoForCausalLM) output the logits
--   padding true     an input attention_mask [batch, seq] (optional at run time; right
--                    padding); rows past a sequence's length are zeros before the head
local hf = require("hf")
local c = hf.config("gpt_neo.lua")
local p = stof.params{layers = 0, batch = 8, seq = 512, mask = "none", dtype = "fp16",
                      head = hf.has_lm_head(c), padding = true}

local H, heads = hf.need(c, "hidden_size", true), hf.need(c, "num_heads", true)
local L = p.layers > 0 and p.layers or hf.need(c, "num_layers", true)
local F = c.intermediate_size and hf.need(c, "intermediate_size", true) or 4 * H
local vocab, n_positions = hf.need(c, "vocab_size", true), hf.need(c, "max_position_embeddings", true)
local eps = c.layer_norm_epsilon and hf.need(c, "layer_norm_epsilon") or 1e-5
local window = c.window_size and hf.need(c, "window_size", true) or 256
local act = hf.activation(c.activation_function or "gelu_new", "activation_function")
if p.seq > n_positions then
  error(string.format("seq %d is longer than the model's %d positions", p.seq, n_positions))
end
if H % heads ~= 0 then
  error(string.format("config.json: hidden_size %d is not a multiple of num_heads %d", H, heads))
end

-- The kind of each layer: attention_types [[["global", "local"], 12]] repeats its patterns
-- the given times (as GPTNeoConfig expands it); else attention_layers lists them.
local function layer_kinds()
  local kinds = {}
  if c.attention_types then
    for _, item in ipairs(c.attention_types) do
      for _ = 1, item[2] do
        for _, kind in ipairs(item[1]) do kinds[#kinds + 1] = kind end
      end
    end
  else
    kinds = c.attention_layers or {}
  end
  return kinds
end
local kinds = layer_kinds()
local n_layers = hf.need(c, "num_layers", true)
if #kinds ~= n_layers then
  error(string.format("config.json: attention_types give %d layers, num_layers is %d", #kinds,
                      n_layers))
end

local m = stof.model{name = "gpt_neo", dtype = p.dtype}
local user = stof.mask.named(p.mask)
-- local layers: keys j with i - j < window (causal keeps j <= i)
local local_mask = stof.mask.sliding_window{band = window - 1}
if user then local_mask = local_mask * user end

local function layernorm(name, x)
  local g = m:weight(name .. ".weight", {H}, {init = "ones"})
  return m:layernorm(x, g, m:weight(name .. ".bias", {H}), {eps = eps, name = name})
end

local function linear(name, x, n_out, n_in)
  local w = m:weight(name .. ".weight", {n_out, n_in})
  return m:linear(x, w, m:weight(name .. ".bias", {n_out}), {name = name})
end

local ids = m:input("input_ids", {p.batch, p.seq}, {dtype = "int32", high = vocab})
local am = hf.attention_mask(m, p)
local wte = m:weight("wte.weight", {vocab, H})
local x = m:embedding(ids, wte, {position = m:weight("wpe.weight", {n_positions, H}),
                                 name = "embeddings"})

for n = 0, L - 1 do
  local kind = kinds[n + 1]
  if kind ~= "global" and kind ~= "local" then
    error(string.format("config.json: attention type '%s' of layer %d (global or local)",
                        tostring(kind), n))
  end
  m:layer(function()
    local pre = "h." .. n .. ".attn.attention"
    local parts = {pre .. ".q_proj.weight", pre .. ".k_proj.weight", pre .. ".v_proj.weight"}
    local w = m:weight(pre .. ".qkv.weight", {3 * H, H}, {from = parts})
    local qkv = m:gemm(layernorm("h." .. n .. ".ln_1", x), w, {name = pre .. ".qkv"})
    local a = m:attention(qkv, {heads = heads, head_dim = H // heads, causal = true, scale = 1.0,
                                mask = kind == "local" and local_mask or user, padding = am,
                                name = pre})
    x = m:add(x, linear(pre .. ".out_proj", a, H, H))
    local h = linear("h." .. n .. ".mlp.c_fc", layernorm("h." .. n .. ".ln_2", x), F, H)
    x = m:add(x, linear("h." .. n .. ".mlp.c_proj", hf.apply(m, act, h), H, F))
  end)
end

x = hf.zero_padding(m, layernorm("ln_f", x), am)
m:output(p.head and hf.lm_head(m, c, x, wte, vocab, H, true) or x)
return m
