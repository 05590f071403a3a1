-- ratekeeper: helpers shared by every algorithm (the composed script is
-- prelude.lua, then each <algorithm>.lua, then main.lua).
--
-- Lua numbers are IEEE doubles, like Python floats: integers are exact below 2^53.
-- The reference algorithms use Python integers; these helpers repeat their integer
-- operations exactly for operands below 2^53.

local ALGORITHMS = {}
local INFINITE = -1  -- retry_us meaning "never": the cost exceeds a capacity

-- floor(a / b) for integers a and b (b > 0), exact: the rounded double quotient can be
-- one off when the true quotient sits just below an integer, so correct it.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- ceil(a / b) for integers (b > 0): -floor(-a / b), as the Python -(-a // b).
local function ceil_div(a, b)
  return -idiv(-a, b)
end

-- Whether retry time a is later than b (INFINITE is latest), as algorithms/base.py later().
local function later(a, b)
  if a == INFINITE then
    return b ~= INFINITE
  end
  return b ~= INFINITE and a > b
end

-- Redis forbids global variables in scripts: everything here and in the algorithm files
-- is a local of the one composed chunk, visible to the files after it (gcra.lua comes
-- before leaky_bucket.lua, which reuses its helpers).
