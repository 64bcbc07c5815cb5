-- BERT encoder (Hugging Face BertModel), post-LayerNorm, built for stof.
--
-- Builds: word + position + token-type(0) embeddings -> LayerNorm (eps 1e-12)
-- -> N layers of
--     x = LN(x + Wo . attention(Wqkv . x + b))
--     x = LN(x + W2 . gelu(W1 . x + b1) + b2)
-- and outputs the last hidden state [batch, seq, hidden].
--
-- Parameters (--set key=value):
--   preset  "base"     small (4 layers, hidden 512, 8 heads, FFN 2048),
--                      base (12, 768, 12, 3072), large (24, 1024, 16, 4096)
--   layers  0          overrides the preset's layer count when > 0
--   batch   8
--   seq     512        position table: max(512, seq) rows
--   mask    "bigbird"  a pattern name or text form (stof.mask.named); "none" = dense
--   dtype   "fp16"     fp16, bf16 or fp32
--   padding false      (true from a model directory) an input attention_mask [batch, seq]:
--                      one plan runs any batch of sequences up to (batch, seq), padded keys
--                      and rows cost no attention work, padded outputs are zeros
--   global  false      (true from a Longformer directory) Longformer's global tokens, below
--
-- From a Hugging Face model directory (stof graph|run|tune DIR), stof.config is its
-- config.json: the sizes, eps and activation come from it (preset is not used), the mask
-- defaults to none (the model's own, dense), and RoBERTa / XLM-RoBERTa (model_type roberta,
-- xlm-roberta) take their position rows from padding_idx + 1 on, as transformers does for
-- sequences without padding. Longformer (model_type longformer) is RoBERTa whose layer n
-- attends a sliding window of attention_window[n] / 2 keys each side (AND `mask` when one
-- is given). With global = true (a Longformer's default) it also takes the optional input
-- global_attention_mask [batch, seq] (1 = a global token; left out, none): every token
-- attends the global tokens, and a global token attends every token with the layer's own
-- query_global / key_global / value_global projections, as transformers does. Those
-- projections run on every token of every layer whether or not a batch has global tokens:
-- --set global=false leaves them out (and the input with them). transformers pads a
-- Longformer input to a multiple of the window; the real tokens' outputs do not depend on
-- that padding, so stof runs the length it is given.
--
-- Weight names follow BertModel; the fused QKV projection is
-- encoder.layer.N.attention.self.qkv.{weight,bias} ([3H, H] and [3H]: query,
-- key and value stacked in that order), which a weight file supplies as the
-- checkpoint's attention.self.{query,key,value}.{weight,bias} (from = ...).
local c = stof.config
local longformer = c ~= nil and c.model_type == "longformer"
local p = stof.params{preset = "base", layers = 0, batch = 8, seq = 512,
                      mask = c and "none" or "bigbird", dtype = "fp16",
                      padding = c ~= nil, global = longformer}
if p.global and not longformer then
  error("global: global tokens are Longformer's (model_type longformer)")
end

local presets = {
  small = {layers = 4, hidden = 512, heads = 8, ffn = 2048},
  base = {layers = 12, hidden = 768, heads = 12, ffn = 3072},
  large = {layers = 24, hidden = 1024, heads = 16, ffn = 4096},
}

local hf = require("hf")
local function need(key, whole) return hf.need(c, key, whole) end

local cfg, vocab, type_vocab, max_pos, eps, act, pos_from, name
if c then
  if p.preset ~= "base" then
    error("preset: a model directory's config.json gives the sizes; leave preset out")
  end
  cfg = {layers = need("num_hidden_layers", true), hidden = need("hidden_size", true),
         heads = need("num_attention_heads", true), ffn = need("intermediate_size", true)}
  vocab, type_vocab = need("vocab_size", true), need("type_vocab_size", true)
  max_pos, eps = need("max_position_embeddings", true), need("layer_norm_eps")
  act = hf.activation(c.hidden_act or "gelu", "hidden_act")
  if c.model_type == "roberta" or c.model_type == "xlm-roberta" or
     c.model_type == "longformer" then
    pos_from = need("pad_token_id", true) + 1 -- positions start after the padding index
    max_pos = max_pos - pos_from
  end
  if c.position_embedding_type and c.position_embedding_type ~= "absolute" then
    error("config.json: position_embedding_type '" .. c.position_embedding_type
          .. "' (stof runs absolute)")
  end
  name = c.model_type
else
  cfg = presets[p.preset]
  if not cfg then
    error("unknown preset '" .. p.preset .. "' (small, base, large)")
  end
  vocab, type_vocab, max_pos, eps, act = 30522, 2, math.max(512, p.seq), 1e-12, false
  name = "bert-" .. p.preset
end
if p.seq > max_pos then
  error(string.format("seq %d is longer than the model's %d positions", p.seq, max_pos))
end
local L = p.layers > 0 and p.layers or cfg.layers
local H, heads, F = cfg.hidden, cfg.heads, cfg.ffn

local m = stof.model{name = name, dtype = p.dtype}
local mask = stof.mask.named(p.mask)

-- Longformer: layer n's sliding window (one mask object per distinct window)
local windows = {}
local function layer_mask(n)
  if not longformer then return mask end
  local w = c.attention_window
  if type(w) == "table" then w = w[n + 1] end
  if math.type(w) ~= "integer" or w < 2 or w % 2 ~= 0 then
    error(string.format("config.json: attention_window for layer %d must be an even integer "
                        .. "of at least 2, got %s", n, tostring(w)))
  end
  if not windows[w] then
    windows[w] = stof.mask.sliding_window{band = w // 2}
    if mask then windows[w] = windows[w] * mask end
  end
  return windows[w]
end

local function norm(prefix)
  return m:weight(prefix .. ".weight", {H}, {init = "ones"}), m:weight(prefix .. ".bias", {H})
end

local function activation(x) return hf.apply(m, act, x) end

local ids = m:input("input_ids", {p.batch, p.seq}, {dtype = "int32", high = vocab})
local am = hf.attention_mask(m, p)
-- from a model directory, a sentence pair's segments as transformers' tokenizers give them
-- (optional: without, every token is of type 0)
-- Longformer's global tokens (optional: without, none)
local gm = p.global and m:input("global_attention_mask", {p.batch, p.seq},
                                {dtype = "int32", high = 2, optional = true})
local types = c and m:input("token_type_ids", {p.batch, p.seq},
                            {dtype = "int32", high = type_vocab, optional = true})
local x = m:embedding(ids, m:weight("embeddings.word_embeddings.weight", {vocab, H}), {
  position = m:weight("embeddings.position_embeddings.weight", {max_pos, H},
                      {rows_from = pos_from}),
  token_type = m:weight("embeddings.token_type_embeddings.weight", {type_vocab, H}),
  token_type_ids = types or nil,
  name = "embeddings",
})
local g, b = norm("embeddings.LayerNorm")
x = m:layernorm(x, g, b, {eps = eps, name = "embeddings.LayerNorm"})

for n = 0, L - 1 do
  m:layer(function()
    local pre = "encoder.layer." .. n
    -- parts: the checkpoint's tensors the fused weight and bias are stacked from
    local function linear(name, x_in, n_out, n_in, parts)
      local w = m:weight(pre .. name .. ".weight", {n_out, n_in},
                         {from = hf.parts(parts, ".weight", pre)})
      local bias = m:weight(pre .. name .. ".bias", {n_out}, {from = hf.parts(parts, ".bias", pre)})
      return m:linear(x_in, w, bias, {name = pre .. name})
    end
    local qkv = linear(".attention.self.qkv", x, 3 * H, H, {".attention.self.query",
                       ".attention.self.key", ".attention.self.value"})
    local qkv_global = gm and linear(".attention.self.qkv_global", x, 3 * H, H,
                                     {".attention.self.query_global",
                                      ".attention.self.key_global",
                                      ".attention.self.value_global"})
    local a = m:attention(qkv, {heads = heads, head_dim = H // heads, mask = layer_mask(n),
                                padding = am, global = gm or nil, global_qkv = qkv_global or nil,
                                name = pre .. ".attention.self"})
    local g1, b1 = norm(pre .. ".attention.output.LayerNorm")
    x = m:layernorm(m:add(linear(".attention.output.dense", a, H, H), x), g1, b1,
                    {eps = eps, name = pre .. ".attention.output.LayerNorm"})
    local h = activation(linear(".intermediate.dense", x, F, H))
    local g2, b2 = norm(pre .. ".output.LayerNorm")
    x = m:layernorm(m:add(linear(".output.dense", h, H, F), x), g2, b2,
                    {eps = eps, name = pre .. ".output.LayerNorm"})
  end)
end

m:output(hf.zero_padding(m, x, am))
return m
