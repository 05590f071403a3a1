-- ratekeeper: token bucket, refilled continuously (algorithms/token_bucket.py).
--
-- spec per limit (arity 4): n, d, cap, full  -- n/d µs per token (reduced), cap = burst,
--                                            -- full = cap * n (a token is n units)
-- state: per limit level, last, n, d, cap  -- the reference's layout: level in units
--        after the last refill at last (µs), below 0 only through reservations, and the
--        scale it was written at: read at another scale (other limits), the level is
--        carried as the reference's _level does (algorithms/carry.py)
--
-- Every quantity stays below 2^53 with epoch µs: levels are at most full = cap * n
-- (checked below 2^53 by the spec), times are µs, and the refill elapsed * d is computed
-- only when it is less than full - level (else the bucket is full), so no product with
-- now is ever formed. The decisions are the reference's, field by field.

-- the level of limit i at now in the units of its spec (at specs[o + 1 ..]): the
-- reference's _level, exact
local function tb_level(state, i, now, specs, o)
  local full = specs[o + 4]
  if state == nil then
    return full
  end
  local s = 5 * i - 4
  local level, n0, d0 = state[s], state[s + 2], state[s + 3]
  local full0 = state[s + 4] * n0
  local elapsed = now - state[s + 1]
  if elapsed > 0 then
    if elapsed >= ceil_div(full0 - level, d0) then
      level = full0
    else
      level = level + elapsed * d0
    end
  end
  local n, cap = specs[o + 1], specs[o + 3]
  if n0 == n and d0 == specs[o + 2] and full0 == full then
    return level
  end
  if level >= full0 then
    return full
  end
  local units = ceil_div(full0 - level, n0) -- carried: whole tokens still consumed, at most cap
  if units > cap then
    units = cap
  end
  return full - units * n
end

-- the refill point after a write at now: never moved back by a clock that stepped back
local function tb_last(state, i, now)
  if state == nil then
    return now
  end
  local last = state[5 * i - 3]
  if now > last then
    return now
  end
  return last
end

ALGORITHMS["token_bucket"] = {
  arity = 4,
  head = 0,
  per = 5,
  decide = function(specs, n, state, now, cost, max_wait, lease, out, at)
    local levels = { nil } -- sized for one limit (no rehash)
    local denied, wait, infinite = -1, 0, false
    for i = 1, n do
      local o = 4 * i - 4
      local d = specs[o + 2]
      local level = tb_level(state, i, now, specs, o)
      levels[i] = level
      if cost > specs[o + 3] then
        if not infinite then
          infinite, denied = true, i - 1
        end
      else
        local need = cost * specs[o + 1]
        if level < need then
          local w = ceil_div(need - level, d)
          if w > wait then
            wait = w
            if not infinite then
              denied = i - 1
            end
          end
        end
      end
    end
    local allowed = (not infinite) and wait <= (max_wait or 0)
    if allowed and cost > 0 then
      for i = 1, n do
        levels[i] = levels[i] - cost * specs[4 * i - 3]
      end
    end
    local whole = 0
    for i = 1, n do
      local o = 4 * i - 4
      local level, full = levels[i], specs[o + 4]
      local left = idiv(level, specs[o + 1])
      out[at + 4 + i] = left > 0 and left or 0
      local reset = level < full and ceil_div(full - level, specs[o + 2]) or 0
      out[at + 4 + n + i] = reset
      if reset > whole then
        whole = reset
      end
    end
    if not allowed then
      out[at + 1], out[at + 2], out[at + 3], out[at + 4] = 0, denied, infinite and INFINITE or wait, 0
      return state, false, whole
    end
    out[at + 1], out[at + 2], out[at + 3], out[at + 4] = 1, -1, 0, wait
    if cost == 0 then
      return state, true, whole
    end
    local new = { nil, nil, nil, nil, nil, nil } -- sized for one limit and exp (main.lua)
    for i = 1, n do
      local s, o = 5 * i - 4, 4 * i - 4
      new[s], new[s + 1] = levels[i], tb_last(state, i, now)
      new[s + 2], new[s + 3], new[s + 4] = specs[o + 1], specs[o + 2], specs[o + 3]
    end
    return new, true, whole
  end,
  -- charge cost without a check: the level may go below 0, never below -full (deepest_debt)
  charge = function(specs, n, state, now, cost, out, at)
    local new = state
    if cost > 0 then
      new = { nil, nil, nil, nil, nil, nil } -- sized for one limit and exp (main.lua)
    end
    local whole = 0
    for i = 1, n do
      local o = 4 * i - 4
      local nn, d, full = specs[o + 1], specs[o + 2], specs[o + 4]
      local level = tb_level(state, i, now, specs, o)
      level = level - debt_charge(cost, idiv(level, nn), deepest_debt(nn, specs[o + 3], full)) * nn
      out[at + 4 + i] = idiv(level, nn)
      local reset = level < full and ceil_div(full - level, d) or 0
      out[at + 4 + n + i] = reset
      if reset > whole then
        whole = reset
      end
      if cost > 0 then
        local s = 5 * i - 4
        new[s], new[s + 1] = level, tb_last(state, i, now)
        new[s + 2], new[s + 3], new[s + 4] = nn, d, specs[o + 3]
      end
    end
    out[at + 1], out[at + 2], out[at + 3], out[at + 4] = 1, -1, 0, 0
    return new, whole
  end,
  -- give back cost tokens, never above full
  refund = function(specs, n, state, now, cost, lease)
    if state == nil then
      return nil
    end
    local new = {}
    for i = 1, n do
      local s, o = 5 * i - 4, 4 * i - 4
      local full = specs[o + 4]
      local level = tb_level(state, i, now, specs, o) + cost * specs[o + 1]
      new[s] = level < full and level or full
      new[s + 1] = tb_last(state, i, now)
      new[s + 2], new[s + 3], new[s + 4] = specs[o + 1], specs[o + 2], specs[o + 3]
    end
    return new
  end,
}
