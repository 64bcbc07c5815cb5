-- Helpers for scripts that read a Hugging Face config.json (stof.config):
--   local hf = require("hf")
--   local H = hf.need(c, "hidden_size", true)       -- an integer, or an error naming the key
--   local tanh = hf.activation(c.hidden_act or "gelu", "hidden_act")
--   local am = hf.attention_mask(m, p)              -- the run-time padding input, or nil
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

-- x through the activation a (hf.activation's answer) in model m.
function hf.apply(m, a, x)
  if a == "relu" then return m:relu(x) end
  return m:gelu(x, {tanh = a})
end

return hf
