-- A tiny model for test_lua: one layer made by a helper module beside it.
local helper = require("tiny_helper")
local m = stof.model{name = "tiny", dtype = "fp32"}
local x = m:input("x", {2, 4, 8})
local y = m:layer(function(i)
  assert(i == 0)
  return helper.mlp(m, "block0", x, 8, 16)
end)
m:output(y)
return m
