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
--
-- Weight names follow BertModel; the fused QKV projection is
-- encoder.layer.N.attention.self.qkv.{weight,bias} ([3H, H] and [3H]: query,
-- key and value stacked in that order), which a weight file supplies as the
-- checkpoint's attention.self.{query,key,value}.{weight,bias} (from = ...).
local p = stof.params{preset = "base", layers = 0, batch = 8, seq = 512, mask = "bigbird",
                      dtype = "fp16"}

local presets = {
  small = {layers = 4, hidden = 512, heads = 8, ffn = 2048},
  base = {layers = 12, hidden = 768, heads = 12, ffn = 3072},
  large = {layers = 24, hidden = 1024, heads = 16, ffn = 4096},
}
local cfg = presets[p.preset]
if not cfg then
  error("unknown preset '" .. p.preset .. "' (small, base, large)")
end
local L = p.layers > 0 and p.layers or cfg.layers
local H, heads, F = cfg.hidden, cfg.heads, cfg.ffn
local vocab, type_vocab = 30522, 2
local max_pos = math.max(512, p.seq)

local m = stof.model{name = "bert-" .. p.preset, dtype = p.dtype}
local mask = stof.mask.named(p.mask)

local function norm(prefix)
  return m:weight(prefix .. ".weight", {H}, {init = "ones"}), m:weight(prefix .. ".bias", {H})
end

local ids = m:input("input_ids", {p.batch, p.seq}, {dtype = "int32", high = vocab})
local x = m:embedding(ids, m:weight("embeddings.word_embeddings.weight", {vocab, H}), {
  position = m:weight("embeddings.position_embeddings.weight", {max_pos, H}),
  token_type = m:weight("embeddings.token_type_embeddings.weight", {type_vocab, H}),
  name = "embeddings",
})
local g, b = norm("embeddings.LayerNorm")
x = m:layernorm(x, g, b, {eps = 1e-12, name = "embeddings.LayerNorm"})

for n = 0, L - 1 do
  m:layer(function()
    local pre = "encoder.layer." .. n
    -- parts: the checkpoint's tensors the fused weight and bias are stacked from
    local function linear(name, x_in, n_out, n_in, parts)
      local function from(suffix)
        if not parts then return nil end
        local names = {}
        for i, part in ipairs(parts) do names[i] = pre .. part .. suffix end
        return names
      end
      local w = m:weight(pre .. name .. ".weight", {n_out, n_in}, {from = from(".weight")})
      local bias = m:weight(pre .. name .. ".bias", {n_out}, {from = from(".bias")})
      return m:linear(x_in, w, bias, {name = pre .. name})
    end
    local qkv = linear(".attention.self.qkv", x, 3 * H, H, {".attention.self.query",
                       ".attention.self.key", ".attention.self.value"})
    local a = m:attention(qkv, {heads = heads, head_dim = H // heads, mask = mask,
                                name = pre .. ".attention.self"})
    local g1, b1 = norm(pre .. ".attention.output.LayerNorm")
    x = m:layernorm(m:add(linear(".attention.output.dense", a, H, H), x), g1, b1,
                    {eps = 1e-12, name = pre .. ".attention.output.LayerNorm"})
    local h = m:gelu(linear(".intermediate.dense", x, F, H))
    local g2, b2 = norm(pre .. ".output.LayerNorm")
    x = m:layernorm(m:add(linear(".output.dense", h, H, F), x), g2, b2,
                    {eps = 1e-12, name = pre .. ".output.LayerNorm"})
  end)
end

m:output(x)
return m
