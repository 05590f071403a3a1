-- ratekeeper: helpers shared by every algorithm (the library, or a script, is prelude.lua,
-- then each <algorithm>.lua, then main.lua; stores/redis/script.py composes them).
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

-- What a charge without a check takes from a limit with left remaining (below 0 in debt):
-- all of cost, but never past -deepest (the limit's count, or its burst), as
-- algorithms/base.py debt_charge().
local function debt_charge(cost, left, deepest)
  local room = deepest + left
  if cost <= room then
    return cost
  end
  return room > 0 and room or 0
end

-- The deepest debt of a bucket (n, cap, full): one capacity, never so deep that full +
-- debt * n reaches 2^53 (algorithms/bucket.py deepest_debt()). 2^53 - 1 - full is exact.
local function deepest_debt(n, cap, full)
  local room = idiv(9007199254740991 - full, n)
  return cap <= room and cap or room
end

-- Whether retry time a is later than b (INFINITE is latest), as algorithms/base.py later().
local function later(a, b)
  if a == INFINITE then
    return b ~= INFINITE
  end
  return b ~= INFINITE and a > b
end

-- The struct formats of a state of k doubles, little-endian (the stored encoding of the
-- algorithms whose state is a list of numbers: exact for every Lua number, and about a
-- quarter of cmsgpack's cost to write or read). Constant strings: Redis 7.0 loads a
-- library without string.rep.
local FORMATS = { "<d", "<dd", "<ddd", "<dddd", "<ddddd", "<dddddd", "<ddddddd", "<dddddddd",
  "<ddddddddd", "<dddddddddd", "<ddddddddddd", "<dddddddddddd", "<ddddddddddddd" }

local function doubles_format(k)
  return FORMATS[k] or "<" .. string.rep("d", k)
end

-- The same, after one tag byte (STATE_TAG) that the value starts with: with the length, it
-- tells a state of doubles apart from any other value the key may hold (whose call fails).
local STATE_TAG = 1
local TAGGED = { "<Bd", "<Bdd", "<Bddd", "<Bdddd", "<Bddddd", "<Bdddddd", "<Bddddddd", "<Bdddddddd",
  "<Bddddddddd", "<Bdddddddddd", "<Bddddddddddd", "<Bdddddddddddd", "<Bddddddddddddd" }

local function tagged_format(k)
  return TAGGED[k] or "<B" .. string.rep("d", k)
end

-- Redis forbids global variables in scripts: everything here and in the algorithm files
-- is a local of the one composed chunk, visible to the files after it (gcra.lua comes
-- before leaky_bucket.lua, which reuses its helpers). And a file's top level reaches no
-- global (math, string, struct...): Redis 7.0 loads a library without them.
