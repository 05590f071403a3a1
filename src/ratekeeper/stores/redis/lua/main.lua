-- ratekeeper: the dispatcher, rk_dispatch(KEYS, ARGV). Decides a list of operations in one
-- call (wire.py). The library registers it as its function (FCALL); a script ends with
-- `return rk_dispatch(KEYS, ARGV)` (EVALSHA).
--
-- KEYS[k]   the storage key of each distinct (rule, key) the call touches
-- ARGV[1]   now in µs, or "" for the server clock (Redis TIME)
-- ARGV[2]   "1": atomic (every decide op is charged or none); "0": each op on its own
-- ARGV[3]   n_ops (the ops run to the end of ARGV)
-- ARGV[4]   n_rules
-- then per rule: algorithm name, n_limits, n_limits x arity spec fields
-- then per op, to the end: mode ("d" decide, "p" peek, "r" refund, "c" charge without a
--   check, "D" decide with cost 1, no max_wait and no lease), key index (into KEYS), rule index (into the rules), and but
--   for "D": cost, max_wait ("" = none), lease id ("" = none)
--
-- Returns a flat array: per "d"/"p"/"c" op allowed (1/0), denied index, retry_us, delay_us,
-- remaining x n, reset x n; per "r" op 1, but 0 for a release of a lease this key did
-- not hold (expired, released, another key's or rule's).
--
-- An algorithm (ALGORITHMS[name], one file each) has
--   arity       its spec fields per limit; specs reach it flat: limit i's field j is
--               specs[(i - 1) * arity + j]
--   decide(specs, n, state, now, cost, max_wait, lease, out, at)
--               writes the op's reply at out[at + 1 ..] and returns the new state (the
--               same table when nothing changed), whether it admitted, and the µs until
--               the state is whole (the longest reset)
--   refund(specs, n, state, now, cost, lease)  the state after giving cost back (nil: none),
--               and, for leases, whether the lease was held
--   charge(specs, n, state, now, cost, out, at)  cost charged without a check (the key may
--               go into debt): writes the op's reply as decide does and returns the new
--               state and the µs until it is whole; none for concurrency (refused)
--   head, per   a state of numbers: head + per * n doubles, stored with struct after a tag
--               byte (TAGGED, STATE_TAG), followed by one more double, exp: the time (µs,
--               on the clock of now) until which the key's TTL was set to last
--   msgpack     instead: a state stored with cmsgpack (concurrency: its lease ids)
--   open/flush  instead: a state read and written in place (the sliding log): open reads
--               what the call needs, decide (with dry = true for a peek) changes the
--               opened state, flush writes the changes once at the end
--
-- Each key's state is read once (GET) and written once at the end, only when it changed
-- (never when an atomic call was refused). The TTL covers the time until the state is
-- whole plus a margin (a state that is whole still tells where the clock was, should it
-- step back; never 0 or less). It is set (SET ... PX) only when it must grow: a state of
-- numbers keeps exp, and while now + whole + margin stays within it the write is SET ...
-- KEEPTTL (cheaper, and no number to format); when it grows it is set a quarter margin
-- beyond. DEL when the algorithm left no state or a refund left it whole (it is
-- forgotten, as MemoryStore.refund does). Ops on the same key see each other's effects in
-- order.
--
-- Cost per call matters (every decision runs this): specs parsed once per rule (the ops
-- of a coalesced call usually share it), the reply written in place by the algorithms,
-- no table beyond the ones the algorithms need, and a key's state kept in plain arrays
-- indexed by its KEYS position (false = no state).

-- The state of numbers stored at key (nil: none) and its exp.
local function read_numbers(key, algo, n)
  local raw = redis.call("GET", key)
  if not raw then
    return nil, 0
  end
  local k = algo.head + algo.per * n + 1
  if #raw == 8 * k + 1 and raw:byte(1) == STATE_TAG then
    local state = { struct.unpack(FORMATS[k] or doubles_format(k), raw, 2) }
    return state, state[k]
  end
  error("ratekeeper: the value at " .. key .. " is not a state of this rule")
end

-- Write a state of numbers: its fields, then exp (the TTL's reach), SET ... KEEPTTL while
-- the TTL reaches far enough, else SET ... PX with a quarter margin more.
local function write_numbers(key, algo, n, state, exp, now, whole_us, margin_ms)
  local k = algo.head + algo.per * n + 1
  local need = now + whole_us + margin_ms * 1000
  if need <= exp then
    state[k] = exp
    return redis.call("SET", key, struct.pack(TAGGED[k] or tagged_format(k), STATE_TAG, unpack(state, 1, k)), "KEEPTTL")
  end
  local ttl_ms = math.ceil(whole_us / 1000) + margin_ms + math.ceil(margin_ms / 4)
  state[k] = now + ttl_ms * 1000
  return redis.call("SET", key, struct.pack(TAGGED[k] or tagged_format(k), STATE_TAG, unpack(state, 1, k)), "PX", ttl_ms)
end

-- The spec fields argv[at .. at + width - 1] as numbers, in a table made at its size
-- (appends would grow it step by step). `x + 0` converts as tonumber does, without the
-- function call.
local function parse_specs(argv, at, width)
  if width == 2 then
    return { argv[at] + 0, argv[at + 1] + 0 }
  elseif width == 4 then
    return { argv[at] + 0, argv[at + 1] + 0, argv[at + 2] + 0, argv[at + 3] + 0 }
  end
  local specs = {}
  for j = 1, width do
    specs[j] = argv[at + j - 1] + 0
  end
  return specs
end

-- The start of the error of a call that wrote nothing (sansio.applied_nothing reads it).
local NOT_APPLIED = "ratekeeper: nothing applied: "

local function rk_dispatch(KEYS, ARGV)
  local argv = ARGV

  local now
  local margin_ms
  if argv[1] == "" then
    local t = redis.call("TIME")
    now = t[1] * 1000000 + t[2]
    margin_ms = 1000
  else
    now = argv[1] + 0
    margin_ms = 3600000 -- an explicit now (tests) runs on its own time: keep state an hour
  end
  local atomic = argv[2] == "1"
  local last = #argv

  -- per key index: { algo, n (its rule's limits), original (the state as read; false:
  -- none), current (after the ops so far), whole (µs until the written state is whole),
  -- exp (of a state of numbers as read; 0: none) }; nil until read
  local keyed = {}
  local out = { nil, nil, nil, nil, nil, nil } -- made at the size of one one-limit reply
  local no = 0 -- entries in out
  local refused = false

  -- the rules: rules[3r - 2], rules[3r - 1], rules[3r] = rule r's algorithm, n, specs
  local n_rules = argv[4] + 0
  local rules = {}
  local pos = 5

  -- Everything up to the writes below runs under pcall: an error there (an op the
  -- store cannot decide, a key holding a value that is not this rule's state) has
  -- written nothing, and says so (NOT_APPLIED), so that the caller may decide the other
  -- ops of a coalesced call again without the guilty one.
  local function decide_all()
    for r = 1, n_rules do
      local algo = ALGORITHMS[argv[pos]]
      if algo == nil then
        error("ratekeeper: unknown algorithm " .. tostring(argv[pos]))
      end
      local n = argv[pos + 1] + 0
      local width = n * algo.arity
      rules[3 * r - 2], rules[3 * r - 1], rules[3 * r] = algo, n, parse_specs(argv, pos + 2, width)
      pos = pos + 2 + width
    end

    while pos <= last do
      local mode = argv[pos]
      local k = argv[pos + 1] + 0
      local r = 3 * argv[pos + 2]
      local algo, n, specs = rules[r - 2], rules[r - 1], rules[r]
      if specs == nil then
        error("ratekeeper: malformed call: rule " .. tostring(argv[pos + 2]) .. " of " .. n_rules)
      end
      local cost, max_wait, lease = 1, nil, nil
      if mode == "D" then
        mode = "d"
        pos = pos + 3
      else
        cost = argv[pos + 3] + 0
        max_wait = argv[pos + 4]
        lease = argv[pos + 5]
        pos = pos + 6
        if max_wait == "" then
          max_wait = nil
        else
          max_wait = max_wait + 0
        end
        if lease == "" then
          lease = nil
        end
      end

      local rec = keyed[k]
      if rec == nil then
        local key = KEYS[k]
        local state, exp = nil, 0
        if algo.open then
          state = algo.open(key)
        elseif algo.msgpack then
          local raw = redis.call("GET", key)
          state = raw and cmsgpack.unpack(raw)
        else
          state, exp = read_numbers(key, algo, n)
        end
        rec = { algo = algo, n = n, original = state or false, current = state or false, whole = 0, exp = exp }
        keyed[k] = rec
      end
      local state = rec.current or nil

      if mode == "c" then
        if algo.charge == nil then
          error("ratekeeper: this algorithm cannot charge without a check")
        end
        local new, whole = algo.charge(specs, n, state, now, cost, out, no)
        no = no + 4 + 2 * n
        if not algo.open and new ~= state then
          rec.current, rec.whole = new or false, whole
        end
      elseif algo.open then
        -- a state read and written in place (the sliding log): it changes as it decides
        if mode == "r" then
          no = no + 1
          out[no] = 1
          algo.refund(specs, n, state, now, cost, lease)
        else
          local _, allowed = algo.decide(specs, n, state, now, cost, max_wait, lease, out, no, mode ~= "d")
          no = no + 4 + 2 * n
          if mode == "d" and not allowed then
            refused = true
          end
        end
      elseif mode == "r" then
        no = no + 1
        out[no] = algo.msgpack and 0 or 1 -- a release finds no lease in no state
        if state ~= nil then -- a state the refund leaves whole is forgotten (as MemoryStore.refund)
          local new, held = algo.refund(specs, n, state, now, cost, lease)
          if held ~= false then
            out[no] = 1
          end
          local us = 0
          if new ~= nil then
            local _, _, whole = algo.decide(specs, n, new, now, 0, nil, nil, {}, 0)
            us = whole
          end
          if us <= 0 then
            rec.current = false
          else
            rec.current, rec.whole = new, us
          end
        end
      else
        local new, allowed, whole = algo.decide(specs, n, state, now, cost, max_wait, lease, out, no)
        no = no + 4 + 2 * n
        if mode == "d" then
          if not allowed then
            refused = true -- an atomic call then writes nothing
          end
          if new ~= state then -- a refusal may still tidy the state (expired leases dropped)
            rec.current, rec.whole = new or false, whole
          end
        end
      end
    end
  end
  local ok, err = pcall(decide_all)
  if not ok then
    if type(err) == "table" then -- a redis.call that failed raises its error reply
      err = err.err
    end
    return redis.error_reply(NOT_APPLIED .. tostring(err))
  end

  if atomic and refused then
    return out
  end
  for k = 1, #KEYS do -- every key is some op's
    local rec = keyed[k]
    local algo, state = rec.algo, rec.current
    if algo.open then
      if state.changed then
        algo.flush(state, now, margin_ms)
      end
    elseif state ~= rec.original then
      if not state then
        redis.call("DEL", KEYS[k])
      elseif algo.msgpack then
        redis.call("SET", KEYS[k], cmsgpack.pack(state), "PX", math.ceil(rec.whole / 1000) + margin_ms)
      else
        write_numbers(KEYS[k], algo, rec.n, state, rec.exp, now, rec.whole, margin_ms)
      end
    end
  end
  return out
end
