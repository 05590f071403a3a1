-- ratekeeper: GCRA, the generic cell rate algorithm (algorithms/gcra.py).
--
-- spec per limit (arity 4): n, d, cap, tau   -- n/d µs per unit of cost (reduced),
--                                            -- cap = burst, tau = cap * n
-- state: { t0, ahead_1, ..., ahead_n }        -- written at t0 (µs); ahead_i = tat_i - t0 * d_i
--
-- The reference keeps the theoretical arrival time tat in units of 1/d µs, absolute. With
-- epoch µs from TIME, now * d would pass 2^53, so the state here is relative to the time
-- it was written, and every quantity the decision reads (tat - now * d) stays small and
-- exact. The decisions are the reference's, field by field.

-- tat - now * d for limit i, clamped at 0 (tat = max(tat, now * d)), exact.
local function gcra_ahead(state, i, now, d)
  if state == nil then
    return 0
  end
  local a = state[i + 1]
  local elapsed = now - state[1]
  if elapsed >= 0 then
    local gone = elapsed * d -- may round above 2^53 only when it is far beyond a
    if gone >= a then
      return 0
    end
    return a - gone
  end
  return a - elapsed * d -- the clock stepped back: tat is further ahead
end

local function gcra_aheads(specs, state, now)
  local aheads = {}
  for i = 1, #specs do
    aheads[i] = gcra_ahead(state, i, now, specs[i][2])
  end
  return aheads
end

local function gcra_state(now, aheads)
  local new = { now }
  for i = 1, #aheads do
    new[i + 1] = aheads[i]
  end
  return new
end

-- remaining and reset of each limit for the given aheads
local function gcra_stats(specs, aheads)
  local remaining, resets = {}, {}
  for i = 1, #specs do
    local n, d, tau = specs[i][1], specs[i][2], specs[i][4]
    local left = idiv(tau - aheads[i], n)
    remaining[i] = left > 0 and left or 0
    resets[i] = ceil_div(aheads[i], d)
  end
  return remaining, resets
end

-- refund shared by GCRA and the leaky bucket: move tat back by cost, never before now
local function gcra_refund(specs, state, now, cost, lease)
  if state == nil then
    return nil
  end
  local aheads = gcra_aheads(specs, state, now)
  for i = 1, #specs do
    local a = aheads[i] - cost * specs[i][1]
    aheads[i] = a > 0 and a or 0
  end
  return gcra_state(now, aheads)
end

ALGORITHMS["gcra"] = {
  arity = 4,
  decide = function(specs, state, now, cost, max_wait, lease)
    local aheads = gcra_aheads(specs, state, now)
    local denied, wait, infinite = -1, 0, false
    for i = 1, #specs do
      local n, d, cap, tau = specs[i][1], specs[i][2], specs[i][3], specs[i][4]
      if cost > cap then
        if not infinite then
          infinite, denied = true, i - 1
        end
      else
        local over = aheads[i] + cost * n - tau
        if over > 0 then
          local w = ceil_div(over, d)
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
    if allowed then
      local new = state
      if cost > 0 then
        for i = 1, #specs do
          aheads[i] = aheads[i] + cost * specs[i][1]
        end
        new = gcra_state(now, aheads)
      end
      local remaining, resets = gcra_stats(specs, aheads)
      return new, true, -1, 0, wait, remaining, resets
    end
    local remaining, resets = gcra_stats(specs, aheads)
    return state, false, denied, infinite and INFINITE or wait, 0, remaining, resets
  end,
  refund = gcra_refund,
}
