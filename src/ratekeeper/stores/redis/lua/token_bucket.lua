-- ratekeeper: token bucket, refilled continuously (algorithms/token_bucket.py).
--
-- spec per limit (arity 4): n, d, cap, full  -- n/d µs per token (reduced), cap = burst,
--                                            -- full = cap * n (a token is n units)
-- state: level_1, last_1, ..., level_n, last_n  -- the reference's layout: level in
--        units after the last refill at last (µs); below 0 only through reservations
--
-- Every quantity stays below 2^53 with epoch µs: levels are at most full = cap * n
-- (checked below 2^53 by the spec), times are µs, and the refill elapsed * d is computed
-- only when it is less than full - level (else the bucket is full), so no product with
-- now is ever formed. The decisions are the reference's, field by field.

-- the level of limit i at now (the reference's _level), exact
local function tb_level(state, i, now, d, full)
  if state == nil then
    return full
  end
  local level = state[2 * i - 1]
  local elapsed = now - state[2 * i]
  if elapsed <= 0 then
    return level
  end
  if elapsed >= ceil_div(full - level, d) then
    return full
  end
  return level + elapsed * d
end

-- the refill point after a write at now: never moved back by a clock that stepped back
local function tb_last(state, i, now)
  if state == nil then
    return now
  end
  local last = state[2 * i]
  if now > last then
    return now
  end
  return last
end

ALGORITHMS["token_bucket"] = {
  arity = 4,
  head = 0,
  per = 2,
  decide = function(specs, n, state, now, cost, max_wait, lease, out, at)
    local levels = { nil } -- sized for one limit (no rehash)
    local denied, wait, infinite = -1, 0, false
    for i = 1, n do
      local o = 4 * i - 4
      local d = specs[o + 2]
      local level = tb_level(state, i, now, d, specs[o + 4])
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
    local new = { nil, nil, nil } -- sized for one limit and exp (main.lua)
    for i = 1, n do
      new[2 * i - 1] = levels[i]
      new[2 * i] = tb_last(state, i, now)
    end
    return new, true, whole
  end,
  -- give back cost tokens, never above full
  refund = function(specs, n, state, now, cost, lease)
    if state == nil then
      return nil
    end
    local new = {}
    for i = 1, n do
      local o = 4 * i - 4
      local full = specs[o + 4]
      local level = tb_level(state, i, now, specs[o + 2], full) + cost * specs[o + 1]
      new[2 * i - 1] = level < full and level or full
      new[2 * i] = tb_last(state, i, now)
    end
    return new
  end,
}
