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
-- is whole still tells where the clock was, should it step back), or DEL when the
-- algorithm left no state. Ops on the same key see each other's effects in order.

local now
local margin_ms
if ARGV[1] == "" then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  margin_ms = 1000
else
  now = tonumber(ARGV[1])
  margin_ms = 3600000 -- an explicit now (tests) runs on its own time: keep state an hour
end
local atomic = ARGV[2] == "1"
local n_ops = tonumber(ARGV[3])

local NONE = {} -- "not loaded yet"
local original = {} -- key index -> state as read
local current = {} -- key index -> state after the ops so far
local whole_in = {} -- key index -> µs until the written state is whole
local out = {}
local refused = false
local pos = 4

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
  local mode = ARGV[pos]
  local k = tonumber(ARGV[pos + 1])
  local algo = ALGORITHMS[ARGV[pos + 2]]
  if algo == nil then
    return redis.error_reply("ratekeeper: unknown algorithm " .. tostring(ARGV[pos + 2]))
  end
  local n = tonumber(ARGV[pos + 3])
  pos = pos + 4
  local specs = {}
  for i = 1, n do
    local spec = {}
    for j = 1, algo.arity do
      spec[j] = tonumber(ARGV[pos])
      pos = pos + 1
    end
    specs[i] = spec
  end
  local cost = tonumber(ARGV[pos])
  local max_wait = ARGV[pos + 1]
  local lease = ARGV[pos + 2]
  pos = pos + 3
  if max_wait == "" then
    max_wait = nil
  else
    max_wait = tonumber(max_wait)
  end
  if lease == "" then
    lease = nil
  end

  if original[k] == nil then
    local raw = redis.call("GET", KEYS[k])
    if raw then
      original[k] = cmsgpack.unpack(raw)
    else
      original[k] = NONE
    end
    current[k] = original[k]
  end
  local state = current[k]
  if state == NONE then
    state = nil
  end

  if mode == "r" then
    if state ~= nil then -- a state the refund leaves whole is forgotten (as MemoryStore.refund)
      local new = algo.refund(specs, state, now, cost, lease)
      local _, _, _, _, _, _, resets = algo.decide(specs, new, now, 0, nil, nil)
      local us = longest(resets)
      if us <= 0 then
        current[k] = NONE
      else
        current[k] = new or NONE
        whole_in[k] = us
      end
    end
  else
    local new, allowed, denied, retry, delay, remaining, resets = algo.decide(specs, state, now, cost, max_wait, lease)
    out[#out + 1] = allowed and 1 or 0
    out[#out + 1] = denied
    out[#out + 1] = retry
    out[#out + 1] = delay
    for i = 1, n do
      out[#out + 1] = remaining[i]
    end
    for i = 1, n do
      out[#out + 1] = resets[i]
    end
    if mode == "d" then
      if not allowed then
        refused = true -- an atomic call then writes nothing
      end
      if new ~= state then -- a refusal may still tidy the state (expired leases dropped)
        current[k] = new or NONE
        whole_in[k] = longest(resets)
      end
    end
  end
end

if atomic and refused then
  return out
end
for k, state in pairs(current) do
  if state ~= original[k] then
    local us = whole_in[k]
    if state == NONE then
      redis.call("DEL", KEYS[k])
    else
      redis.call("SET", KEYS[k], cmsgpack.pack(state), "PX", math.ceil(us / 1000) + margin_ms)
    end
  end
end
return out
