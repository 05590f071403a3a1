-- ratekeeper: sliding window counter, the previous and the current window's counts weighted
-- (algorithms/sliding_window_counter.py).
--
-- spec per limit (arity 2): count, period     -- about count per sliding period µs
-- state: { window_1, previous_1, current_1, ..., window_n, previous_n, current_n }
--                                             -- window = now // period (exact: idiv)
--
-- The estimate at now is previous * ((period - elapsed) / period) + current: the reference's
-- float operations, repeated here in the same order on the same doubles (every integer is
-- below 2^53, so Lua's doubles hold what Python's ints hold). One operation needs care: the
-- reference divides the exact integer product (limit - current - cost) * period by the
-- previous count (Python's int / int: the correctly rounded quotient), and that product can
-- pass 2^53 (a million a day): swc_ratio then divides bit by bit, exactly.

local SWC_2_52 = 4503599627370496
local SWC_2_53 = 9007199254740992

-- (r + a) mod v and the carry, for 0 <= r, a < v: never forms a sum above v.
local function swc_add_mod(r, a, v)
  if r >= v - a then
    return r - (v - a), 1
  end
  return r + a, 0
end

-- x * p / v correctly rounded to a double (as Python's int / int), for integers 0 <= x < v
-- and 0 < p, all below 2^53.
local function swc_ratio(x, p, v)
  local product = x * p
  if product < SWC_2_53 then
    return product / v -- the product is exact: one rounding, as in Python
  end
  -- Long division of x * p by v in binary: q the quotient so far, r the remainder (< v).
  local top = 1
  while top * 2 <= p do
    top = top * 2
  end
  local q, r, c = 0, 0, 0
  while top >= 1 do
    r, c = swc_add_mod(r, r, v)
    q = q * 2 + c
    if p >= top then
      p = p - top
      r, c = swc_add_mod(r, x, v)
      q = q + c
    end
    top = top / 2
  end
  -- q = floor(x * p / v) < p (as x < v) and q >= 1 (as x * p >= 2^53 > v): take fraction
  -- bits until q holds 53 significant bits, then round half to even on the remainder.
  local scale = 1
  while q < SWC_2_52 do
    r, c = swc_add_mod(r, r, v)
    q = q * 2 + c
    scale = scale * 2
  end
  if r > v - r or (r == v - r and q % 2 == 1) then
    q = q + 1
  end
  return q / scale -- exact: a power of two
end

local function swc_estimate(prev, curr, elapsed, period)
  return prev * ((period - elapsed) / period) + curr
end

-- µs until the estimate is 0: the current count weighs until the end of the next window.
local function swc_whole_after(window, period, now, prev, curr)
  if curr > 0 then
    return (window + 2) * period - now
  end
  if prev > 0 then
    return (window + 1) * period - now
  end
  return 0
end

-- The first µs t >= start (in the window beginning at start) where the estimate plus cost is
-- at most limit; the caller ensures one exists.
local function swc_first_admitting(prev, curr, start, period, cost, limit)
  if prev == 0 then
    return start
  end
  -- max(0, ceil(period - x * period / prev)); for x >= prev the quotient is >= period: 0.
  local x = limit - curr - cost
  local elapsed = 0
  if x < prev then
    local e = math.ceil(period - swc_ratio(x, period, prev))
    if e > 0 then
      elapsed = e
    end
  end
  while elapsed < period and swc_estimate(prev, curr, elapsed, period) + cost > limit do
    elapsed = elapsed + 1
  end
  return start + elapsed
end

local function swc_retry(prev, curr, start, period, cost, limit, now)
  if cost > limit then
    return INFINITE
  end
  if curr + cost <= limit then
    return swc_first_admitting(prev, curr, start, period, cost, limit) - now
  end
  return swc_first_admitting(curr, 0, start + period, period, cost, limit) - now
end

-- window, previous and current count of limit i at now (a clock that stepped back stays in
-- the newer stored window)
local function swc_read(state, i, now, period)
  local window = idiv(now, period)
  if state == nil then
    return window, 0, 0
  end
  local w = state[3 * i - 2]
  if w > window then
    window = w
  end
  if w == window then
    return window, state[3 * i - 1], state[3 * i]
  end
  if w == window - 1 then
    return window, state[3 * i], 0
  end
  return window, 0, 0
end

ALGORITHMS["sliding_window_counter"] = {
  arity = 2,
  decide = function(specs, state, now, cost, max_wait, lease)
    local n = #specs
    local windows, prevs, currs, estimates = {}, {}, {}, {}
    local denied, retry = -1, 0
    for i = 1, n do
      local limit, period = specs[i][1], specs[i][2]
      local window, prev, curr = swc_read(state, i, now, period)
      local start = window * period
      local estimate = swc_estimate(prev, curr, now - start, period)
      if estimate + cost > limit then
        local r = swc_retry(prev, curr, start, period, cost, limit, now)
        if denied < 0 or later(r, retry) then
          denied, retry = i - 1, r
        end
      end
      windows[i], prevs[i], currs[i], estimates[i] = window, prev, curr, estimate
    end
    local charged = denied < 0 and cost or 0
    local remaining, resets = {}, {}
    for i = 1, n do
      local left = math.floor(specs[i][1] - (estimates[i] + charged))
      remaining[i] = left > 0 and left or 0
      resets[i] = swc_whole_after(windows[i], specs[i][2], now, prevs[i], currs[i] + charged)
    end
    if denied >= 0 then
      return state, false, denied, retry, 0, remaining, resets
    end
    local new = state
    if charged > 0 then
      new = {}
      for i = 1, n do
        new[3 * i - 2], new[3 * i - 1], new[3 * i] = windows[i], prevs[i], currs[i] + charged
      end
    end
    return new, true, -1, 0, 0, remaining, resets
  end,
  -- Take cost back from each limit's current window (never below 0), the state rewritten in
  -- now's window, as the reference does.
  refund = function(specs, state, now, cost, lease)
    if state == nil then
      return nil
    end
    local new = {}
    for i = 1, #specs do
      local window, prev, curr = swc_read(state, i, now, specs[i][2])
      curr = curr - cost
      new[3 * i - 2], new[3 * i - 1], new[3 * i] = window, prev, curr > 0 and curr or 0
    end
    return new
  end,
}
