-- A helper module for test_lua: require runs it once and caches the result.
local M = {}
tiny_helper_loads = (tiny_helper_loads or 0) + 1
M.loads = tiny_helper_loads

-- A two-layer perceptron: relu(x . W1 + b1) . W2 + b2.
function M.mlp(m, prefix, x, width, hidden)
  local h = m:linear(x, m:weight(prefix .. ".fc1.weight", {hidden, width}),
                     m:weight(prefix .. ".fc1.bias", {hidden}))
  h = m:relu(h)
  return m:linear(h, m:weight(prefix .. ".fc2.weight", {width, hidden}),
                  m:weight(prefix .. ".fc2.bias", {width}))
end

return M
