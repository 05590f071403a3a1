-- ratekeeper: GCRA, the generic cell rate algorithm (algorithms/gcra.py).
--
-- spec per limit (arity 4): n, d, cap, tau   -- n/d µs per unit of cost (reduced),
--                                            -- cap = burst, tau = cap * n
-- state: t0, then per limit ahead, n, d, cap  -- written at t0 (µs); ahead = tat - t0 * d,
--                                            -- with the scale it was written at
--
-- A state written at another scale (other limits: a reload, a quota's answer) is read as
-- the reference's gcra_tat reads it: what it still counts, in whole units of cost rounded
-- up, at most the new capacity (algorithms/carry.py).
-- The reference keeps the theoretical arrival time tat in units of 1/d µs, absolute. With
-- epoch µs from TIME, now * d would pass 2^53, so the state here is relative to the time
-- it was written, and every quantity the decision reads (tat - now * d) stays small and
-- exact. The decisions are the reference's, field by field.

-- tat - now * d for limit i (spec fields at specs[o + 1 ..]), clamped at 0 (tat =
-- max(tat, now * d)), in the units of the spec; exact.
local function gcra_ahead(state, i, now, specs, o)
  if state == nil then
    return 0
  end
  local s = 4 * i - 2
  local a, n0, d0 = state[s], state[s + 1], state[s + 2]
  local elapsed = now - state[1]
  if elapsed >= 0 then
    local gone = elapsed * d0 -- may round above 2^53 only when it is far beyond a
    if gone >= a then
      return 0
    end
    a = a - gone
  else
    a = a - elapsed * d0 -- the clock stepped back: tat is further ahead
  end
  local n, cap = specs[o + 1], specs[o + 3]
  if n0 == n and d0 == specs[o + 2] and state[s + 3] == cap then
    return a
  end
  local units = ceil_div(a, n0) -- carried: whole units of cost still counted, at most cap
  if units > cap then
    units = cap
  end
  return units * n
end

local function gcra_aheads(specs, n, state, now)
  local aheads = { nil } -- sized for one limit (no rehash)
  for i = 1, n do
    aheads[i] = gcra_ahead(state, i, now, specs, 4 * i - 4)
  end
  return aheads
end

local function gcra_state(now, aheads, n, specs)
  if n == 1 then
    return { now, aheads[1], specs[1], specs[2], specs[3], nil } -- sized for exp too (main.lua)
  end
  local new = { now }
  for i = 1, n do
    local s, o = 4 * i - 2, 4 * i - 4
    new[s], new[s + 1], new[s + 2], new[s + 3] = aheads[i], specs[o + 1], specs[o + 2], specs[o + 3]
  end
  return new
end

-- remaining and reset of each limit for the given aheads, into out after at + 4; the
-- longest reset
local function gcra_stats(specs, n, aheads, out, at)
  local whole = 0
  for i = 1, n do
    local o = 4 * i - 4
    local a = aheads[i]
    local left = idiv(specs[o + 4] - a, specs[o + 1])
    out[at + 4 + i] = left > 0 and left or 0
    local reset = ceil_div(a, specs[o + 2])
    out[at + 4 + n + i] = reset
    if reset > whole then
      whole = reset
    end
  end
  return whole
end

-- refund shared by GCRA and the leaky bucket: move tat back by cost, never before now
local function gcra_refund(specs, n, state, now, cost, lease)
  if state == nil then
    return nil
  end
  local aheads = gcra_aheads(specs, n, state, now)
  for i = 1, n do
    local a = aheads[i] - cost * specs[4 * i - 3]
    aheads[i] = a > 0 and a or 0
  end
  return gcra_state(now, aheads, n, specs)
end

-- The end of a decision shared by GCRA and the leaky bucket: when admitted, each limit's
-- ahead charged cost (the state rewritten only for a cost) and the reply's delay; else the
-- state as it was, the limit that denied and the retry. Then the stats (gcra_stats).
local function gcra_finish(specs, n, state, now, cost, aheads, out, at, admitted, denied, retry, delay)
  if admitted then
    local new = state
    if cost > 0 then
      for i = 1, n do
        aheads[i] = aheads[i] + cost * specs[4 * i - 3]
      end
      new = gcra_state(now, aheads, n, specs)
    end
    out[at + 1], out[at + 2], out[at + 3], out[at + 4] = 1, -1, 0, delay
    return new, true, gcra_stats(specs, n, aheads, out, at)
  end
  out[at + 1], out[at + 2], out[at + 3], out[at + 4] = 0, denied, retry, 0
  return state, false, gcra_stats(specs, n, aheads, out, at)
end

-- A charge without a check, shared by GCRA and the leaky bucket: each limit's ahead moved
-- by cost whatever it is, beyond tau but never beyond 2 * tau (one burst of debt, deepest_debt).
local function gcra_charge(specs, n, state, now, cost, out, at)
  local aheads = gcra_aheads(specs, n, state, now)
  local whole = 0
  for i = 1, n do
    local o = 4 * i - 4
    local nn, tau = specs[o + 1], specs[o + 4]
    local a = aheads[i]
    a = a + debt_charge(cost, idiv(tau - a, nn), deepest_debt(nn, specs[o + 3], tau)) * nn
    aheads[i] = a
    out[at + 4 + i] = idiv(tau - a, nn)
    local reset = ceil_div(a, specs[o + 2])
    out[at + 4 + n + i] = reset
    if reset > whole then
      whole = reset
    end
  end
  out[at + 1], out[at + 2], out[at + 3], out[at + 4] = 1, -1, 0, 0
  if cost == 0 then
    return state, whole
  end
  return gcra_state(now, aheads, n, specs), whole
end

ALGORITHMS["gcra"] = {
  arity = 4,
  head = 1,
  per = 4,
  decide = function(specs, n, state, now, cost, max_wait, lease, out, at)
    local aheads = { nil } -- sized for one limit (no rehash)
    local denied, wait, infinite = -1, 0, false
    for i = 1, n do
      local o = 4 * i - 4
      local a = gcra_ahead(state, i, now, specs, o)
      aheads[i] = a
      if cost > specs[o + 3] then
        if not infinite then
          infinite, denied = true, i - 1
        end
      else
        local over = a + cost * specs[o + 1] - specs[o + 4]
        if over > 0 then
          local w = ceil_div(over, specs[o + 2])
          if w > wait then
            wait = w
            if not infinite then
              denied = i - 1
            end
          end
        end
      end
    end
    local admitted = (not infinite) and wait <= (max_wait or 0)
    local retry = infinite and INFINITE or wait
    return gcra_finish(specs, n, state, now, cost, aheads, out, at, admitted, denied, retry, wait)
  end,
  charge = gcra_charge,
  refund = gcra_refund,
}
