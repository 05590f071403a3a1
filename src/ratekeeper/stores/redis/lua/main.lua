-- ratekeeper: the dispatcher. Decides a list of operations in one call (wire.py).
--
-- KEYS[k]   the storage key of each distinct (rule, key) the call touches
-- ARGV[1]   now in µs, or "" for the server clock (Redis TIME)
-- ARGV[2]   "1": atomic (every decide op is charged or none); "0": each op on its own
-- ARGV[3]   n_ops
-- then per op: mode ("d" decide, "p" peek, "r" refund), key index (into KEYS),
--   algorithm name, n_limits, n_limits x arity spec fields, cost, max_wait ("" = none),
--   lease id ("" = none)
--
-- Returns a flat array: per "d"/"p" op allowed (1/0), denied index, retry_us, delay_us,
-- remaining x n, reset x n. Each key's state is read once (GET, cmsgpack) and written
-- once at the end: SET ... PX (the time until it is whole, plus a margin: a state that
-- is whole still tells where the clock was, should it step back; never 0 or less), or
-- DEL when the algorithm left no state or a refund left it whole (it is forgotten, as
-- MemoryStore.refund does). Ops on the same key see each other's effects in order.
-- An algorithm with open/flush (the sliding log) keeps its state in place instead: open
-- reads what the call needs, decide (with dry = true for a peek) changes the opened state,
-- and flush writes the changes once at the end (never when an atomic call was refused).
--
-- Cost per call matters (every decision runs this): no table beyond the ones the
-- algorithms need, the reply filled by index, and a key's state kept in plain arrays
-- indexed by its KEYS position (false = no state).

local tonumber = tonumber
local argv = ARGV
local call = redis.call

local now
local margin_ms
if argv[1] == "" then
  local t = call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  margin_ms = 1000
else
  now = tonumber(argv[1])
  margin_ms = 3600000 -- an explicit now (tests) runs on its own time: keep state an hour
end
local atomic = argv[2] == "1"
local n_ops = tonumber(argv[3])

local original = {} -- key index -> state as read (false: none); nil until read
local current = {} -- key index -> state after the ops so far (false: none)
local whole_in = {} -- key index -> µs until the written state is whole
local logs = {} -- key index -> the algorithm of a state kept in place (algo.open / flush)
local out = {}
local no = 0 -- entries in out
local refused = false
local pos = 4

local last_specs, last_algo, last_n, last_pos -- the specs parsed for the op before

-- whether argv[a .. a + width - 1] and argv[b .. b + width - 1] are the same strings
local function same_fields(a, b, width)
  for i = 0, width - 1 do
    if argv[a + i] ~= argv[b + i] then
      return false
    end
  end
  return true
end

local function longest(resets)
  local m = 0
  for i = 1, #resets do
    if resets[i] > m then
      m = resets[i]
    end
  end
  return m
end

for _ = 1, n_ops do
  local mode = argv[pos]
  local k = tonumber(argv[pos + 1])
  local algo = ALGORITHMS[argv[pos + 2]]
  if algo == nil then
    return redis.error_reply("ratekeeper: unknown algorithm " .. tostring(argv[pos + 2]))
  end
  local n = tonumber(argv[pos + 3])
  local width = n * algo.arity
  pos = pos + 4
  local specs = last_specs
  if algo ~= last_algo or n ~= last_n or not same_fields(pos, last_pos, width) then
    specs = {} -- else the op before had the same rule: its specs serve (coalesced calls)
    local at = pos
    for i = 1, n do
      local spec = {}
      for j = 1, algo.arity do
        spec[j] = tonumber(argv[at])
        at = at + 1
      end
      specs[i] = spec
    end
    last_specs, last_algo, last_n, last_pos = specs, algo, n, pos
  end
  pos = pos + width
  local cost = tonumber(argv[pos])
  local max_wait = argv[pos + 1]
  local lease = argv[pos + 2]
  pos = pos + 3
  if max_wait == "" then
    max_wait = nil
  else
    max_wait = tonumber(max_wait)
  end
  if lease == "" then
    lease = nil
  end

  local state = current[k]
  if state == nil then
    if algo.open then
      state = algo.open(KEYS[k])
      logs[k] = algo
    else
      local raw = call("GET", KEYS[k])
      state = raw and cmsgpack.unpack(raw) or false
    end
    original[k] = state
    current[k] = state
  end
  state = state or nil

  if algo.open then
    -- a state read and written in place (the sliding log): it changes as it decides
    if mode == "r" then
      algo.refund(specs, state, now, cost, lease)
    else
      local _, allowed, denied, retry, delay, remaining, resets =
        algo.decide(specs, state, now, cost, max_wait, lease, mode ~= "d")
      out[no + 1] = allowed and 1 or 0
      out[no + 2] = denied
      out[no + 3] = retry
      out[no + 4] = delay
      no = no + 4
      for i = 1, n do
        out[no + i] = remaining[i]
      end
      no = no + n
      for i = 1, n do
        out[no + i] = resets[i]
      end
      no = no + n
      if mode == "d" and not allowed then
        refused = true
      end
    end
  elseif mode == "r" then
    if state ~= nil then -- a state the refund leaves whole is forgotten (as MemoryStore.refund)
      local new = algo.refund(specs, state, now, cost, lease)
      local _, _, _, _, _, _, resets = algo.decide(specs, new, now, 0, nil, nil)
      local us = longest(resets)
      if us <= 0 or new == nil then
        current[k] = false
      else
        current[k] = new
        whole_in[k] = us
      end
    end
  else
    local new, allowed, denied, retry, delay, remaining, resets = algo.decide(specs, state, now, cost, max_wait, lease)
    out[no + 1] = allowed and 1 or 0
    out[no + 2] = denied
    out[no + 3] = retry
    out[no + 4] = delay
    no = no + 4
    for i = 1, n do
      out[no + i] = remaining[i]
    end
    no = no + n
    for i = 1, n do
      out[no + i] = resets[i]
    end
    no = no + n
    if mode == "d" then
      if not allowed then
        refused = true -- an atomic call then writes nothing
      end
      if new ~= state then -- a refusal may still tidy the state (expired leases dropped)
        current[k] = new or false
        whole_in[k] = longest(resets)
      end
    end
  end
end

if atomic and refused then
  return out
end
for k, state in pairs(current) do
  local algo = logs[k]
  if algo then
    if state.changed then
      algo.flush(state, now, margin_ms)
    end
  elseif state ~= original[k] then
    if state then
      call("SET", KEYS[k], cmsgpack.pack(state), "PX", math.ceil(whole_in[k] / 1000) + margin_ms)
    else
      call("DEL", KEYS[k])
    end
  end
end
return out
