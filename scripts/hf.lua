-- Helpers for scripts that read a Hugging Face config.json (stof.config):
--   local hf = require("hf")
--   local H = hf.need(c, "hidden_size", true)       -- an integer, or an error naming the key
--   local tanh = hf.activation(c.hidden_act or "gelu", "hidden_act")
--   local am = hf.attention_mask(m, p)              -- the run-time padding input, or nil
--   local logits = hf.lm_head(m, c, x, wte, V, H)   -- tied or own language-modelling head
local hf = {}

-- The config's value of key: a number (an integer when whole), else an error that names it.
function hf.need(c, key, whole)
  local v = c[key]
  if type(v) ~= "number" or (whole and math.type(v) ~= "integer") then
    error(string.format("config.json: '%s' must be %s, got %s", key,
                        whole and "an integer" or "a number", tostring(v)), 2)
  end
  return v
end

-- An activation's name -> the gelu's tanh flag (false: erf, true: tanh), or "relu".
local acts = {gelu = false, gelu_new = true, gelu_pytorch_tanh = true, relu = "relu"}

function hf.activation(name, key)
  local a = acts[name]
  if a == nil then
    error(string.format("config.json: %s '%s' (stof runs gelu, gelu_new, gelu_pytorch_tanh, "
                        .. "relu)", key, tostring(name)), 2)
  end
  return a
end

-- The model's attention_mask input [batch, seq] (1 = token, 0 = padding, each row right
-- padded) when p.padding, else nil. Optional at run time: an inputs file without it means
-- no padding.
function hf.attention_mask(m, p)
  if not p.padding then return nil end
  return m:input("attention_mask", {p.batch, p.seq}, {dtype = "int32", attention_mask = true})
end

-- x with zeros at the padded positions of attention_mask am (nil: x as it is).
function hf.zero_padding(m, x, am)
  if not am then return x end
  return m:mask_rows(x, am, {name = "padding"})
end

-- The checkpoint names a stacked weight is read from (m:weight's `from`): prefix .. part ..
-- suffix for each of parts, or nil without parts.
function hf.parts(parts, suffix, prefix)
  if not parts then return nil end
  local names = {}
  for i, part in ipairs(parts) do names[i] = (prefix or "") .. part .. suffix end
  return names
end

-- stof.config, for a script that builds its model from a Hugging Face directory only: an
-- error naming `script` and how to run it when there is none.
function hf.config(script)
  if not stof.config then
    error(script .. " builds a model from a Hugging Face directory (its config.json); "
          .. "run it as: stof graph DIR", 2)
  end
  return stof.config
end

-- Whether the config describes a model with a language-modelling head (its architectures
-- end in LMHeadModel or ForCausalLM): the default of a decoder's `head` parameter.
function hf.has_lm_head(c)
  local a = c and c.architectures and c.architectures[1]
  return type(a) == "string" and (a:find("LMHeadModel$") ~= nil or a:find("ForCausalLM$") ~= nil)
end

-- The logits [batch, seq, vocab] of hidden states x [batch, seq, H]: the head is the word
-- embedding wte [vocab, H] when the config ties them (tie_word_embeddings; when the config
-- does not say, tied_default, the model class's default), else its own lm_head.weight.
function hf.lm_head(m, c, x, wte, vocab, H, tied_default)
  local tied = tied_default
  if c and c.tie_word_embeddings ~= nil then tied = c.tie_word_embeddings end
  local w = wte
  if not tied then
    w = m:weight("lm_head.weight", {vocab, H})
  end
  return m:gemm(x, w, {name = "lm_head"})
end

-- The rotary theta of a config: rope_parameters.rope_theta (transformers 5), else rope_theta,
-- else default. Scaled ropes (linear, dynamic, yarn, llama3) are refused, not approximated.
function hf.rope_theta(c, default)
  local rp = c.rope_parameters or c.rope_scaling
  local kind = rp and (rp.rope_type or rp.type)
  if kind and kind ~= "default" then
    error(string.format("config.json: rope type '%s' (stof runs the default rotary "
                        .. "embedding)", tostring(kind)), 2)
  end
  return (c.rope_parameters and c.rope_parameters.rope_theta) or c.rope_theta or default
end

-- x through the activation a (hf.activation's answer) in model m.
function hf.apply(m, a, x)
  if a == "relu" then return m:relu(x) end
  return m:gelu(x, {tanh = a})
end

return hf
