-- T5 encoder-decoder (Hugging Face T5Model, v1.0 "t5-small" / "t5-base").
--
-- Builds: shared embedding -> encoder stack -> final RMSNorm; shared embedding
-- of the decoder ids -> decoder stack (causal self-attention, cross-attention
-- to the encoder output) -> final RMSNorm; outputs the decoder's last hidden
-- state [batch, dec_seq, d_model].
--   encoder block: x = x + o(attn(qkv(norm(x)), relpos bidirectional, mask))
--                  x = x + wo(relu(wi(norm(x))))
--   decoder block: x = x + o(attn(qkv(norm(x)), relpos unidirectional, causal))
--                  x = x + o(attn(q(norm(x)), kv(encoder output)))
--                  x = x + wo(relu(wi(norm(x))))
-- No biases; RMSNorm eps 1e-6, pre-norm; attention is not scaled (scale 1).
-- Each stack's relative position bias table [32 buckets, heads] (max
-- distance 128) belongs to its first block and is used by all its blocks.
--
-- Parameters (--set key=value):
--   preset   "t5-small"  t5-small (d_model 512, 6+6 layers, 8 heads, d_kv 64, d_ff 2048)
--                        t5-base  (768, 12+12, 12, 64, 3072)
--   layers   0           overrides the preset's layers per stack when > 0
--   batch    8
--   seq      512         encoder length
--   dec_seq  0           decoder length (0: the same as seq)
--   mask     "none"      encoder self-attention mask: a pattern name or text form
--   dtype    "fp16"      fp16, bf16 or fp32
--
-- Weight names follow T5Model; fused projections are
-- *.SelfAttention.qkv.weight [3 * inner, d_model] and *.EncDecAttention.kv.weight
-- [2 * inner, d_model] (inner = heads * d_kv), which a weight file supplies as
-- the checkpoint's SelfAttention.{q,k,v} and EncDecAttention.{k,v} (from = ...).
-- Both stacks embed with shared.weight (encoder.embed_tokens and
-- decoder.embed_tokens are tied to it and may be absent from a checkpoint).
local p = stof.params{preset = "t5-small", layers = 0, batch = 8, seq = 512, dec_seq = 0,
                      mask = "none", dtype = "fp16"}

local presets = {
  ["t5-small"] = {layers = 6, d_model = 512, heads = 8, d_kv = 64, d_ff = 2048},
  ["t5-base"] = {layers = 12, d_model = 768, heads = 12, d_kv = 64, d_ff = 3072},
}
local cfg = presets[p.preset]
if not cfg then
  error("unknown preset '" .. p.preset .. "' (t5-small, t5-base)")
end
local L = p.layers > 0 and p.layers or cfg.layers
local D, heads, dkv, F = cfg.d_model, cfg.heads, cfg.d_kv, cfg.d_ff
local inner = heads * dkv
local vocab, buckets, max_distance, eps = 32128, 32, 128, 1e-6
local dec_seq = p.dec_seq > 0 and p.dec_seq or p.seq

local m = stof.model{name = p.preset, dtype = p.dtype}
local enc_mask = stof.mask.named(p.mask)
local shared = m:weight("shared.weight", {vocab, D})

local function rmsnorm(prefix, x)
  return m:rmsnorm(x, m:weight(prefix .. ".weight", {D}, {init = "ones"}), {eps = eps,
                   name = prefix})
end

-- parts: the checkpoint's projections the fused weight is stacked from
local function proj(name, x, n_out, n_in, parts)
  local from
  if parts then
    from = {}
    for i, part in ipairs(parts) do from[i] = part .. ".weight" end
  end
  return m:gemm(x, m:weight(name .. ".weight", {n_out, n_in}, {from = from}), {name = name})
end

local function feed_forward(pre, x)
  local h = m:relu(proj(pre .. ".DenseReluDense.wi", rmsnorm(pre .. ".layer_norm", x), F, D))
  return m:add(x, proj(pre .. ".DenseReluDense.wo", h, D, F))
end

-- Self-attention sub-layer of block n of a stack ("encoder" or "decoder").
local function self_attention(stack, n, x, relpos, opts)
  local pre = stack .. ".block." .. n .. ".layer.0"
  local sa = pre .. ".SelfAttention"
  local qkv = proj(sa .. ".qkv", rmsnorm(pre .. ".layer_norm", x), 3 * inner, D,
                   {sa .. ".q", sa .. ".k", sa .. ".v"})
  local a = m:attention(qkv, {heads = heads, head_dim = dkv, scale = 1.0, relpos = relpos,
                              mask = opts.mask, causal = opts.causal,
                              name = pre .. ".SelfAttention"})
  return m:add(x, proj(pre .. ".SelfAttention.o", a, D, inner))
end

local function relpos_table(stack, bidirectional)
  local t = m:weight(stack .. ".block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                     {buckets, heads})
  return {table = t, buckets = buckets, max_distance = max_distance,
          bidirectional = bidirectional}
end

-- Encoder.
local enc_ids = m:input("input_ids", {p.batch, p.seq}, {dtype = "int32", high = vocab})
local x = m:embedding(enc_ids, shared, {name = "encoder.embed_tokens"})
local enc_relpos = relpos_table("encoder", true)
for n = 0, L - 1 do
  m:layer(function()
    x = self_attention("encoder", n, x, enc_relpos, {mask = enc_mask})
    x = feed_forward("encoder.block." .. n .. ".layer.1", x)
  end)
end
local enc_out = rmsnorm("encoder.final_layer_norm", x)

-- Decoder.
local dec_ids = m:input("decoder_input_ids", {p.batch, dec_seq}, {dtype = "int32", high = vocab})
local y = m:embedding(dec_ids, shared, {name = "decoder.embed_tokens"})
local dec_relpos = relpos_table("decoder", false)
for n = 0, L - 1 do
  m:layer(function()
    y = self_attention("decoder", n, y, dec_relpos, {causal = true})
    local pre = "decoder.block." .. n .. ".layer.1"
    local q = proj(pre .. ".EncDecAttention.q", rmsnorm(pre .. ".layer_norm", y), inner, D)
    local kv = proj(pre .. ".EncDecAttention.kv", enc_out, 2 * inner, D,
                    {pre .. ".EncDecAttention.k", pre .. ".EncDecAttention.v"})
    local a = m:attention(q, kv, {heads = heads, head_dim = dkv, scale = 1.0,
                                  name = pre .. ".EncDecAttention"})
    y = m:add(y, proj(pre .. ".EncDecAttention.o", a, D, inner))
    y = feed_forward("decoder.block." .. n .. ".layer.2", y)
  end)
end

m:output(rmsnorm("decoder.final_layer_norm", y))
return m
