-- ratekeeper: sliding window counter, the previous and the current window's counts weighted
-- (algorithms/sliding_window_counter.py).
--
-- spec per limit (arity 2): count, period     -- about count per sliding period µs
-- state: window_1, previous_1, current_1, ..., window_n, previous_n, current_n
--                                             -- window = now // period (exact: idiv)
--
-- The count at now is current + floor(previous * (period - elapsed) / period), rounded down
-- as the system-design chapter does (7 per minute, 5 before and 3 now, 30 % in: 3 + floor(3.5)
-- = 6, so one more is admitted); a request is admitted when count + cost <= limit. Exact
-- integer arithmetic as in the reference: the products can pass 2^53 (a million a day), so
-- swc_muldiv divides them bit by bit.

local SWC_2_53 = 9007199254740992

-- (r + a) mod v and the carry, for 0 <= r, a < v: never forms a sum above v.
local function swc_add_mod(r, a, v)
  if r >= v - a then
    return r - (v - a), 1
  end
  return r + a, 0
end

-- floor(a * b / c) and its remainder, exactly, for integers 0 <= a < c and 0 <= b, all
-- below 2^53 (so the quotient, below b, is too).
local function swc_muldiv(a, b, c)
  local product = a * b
  if product < SWC_2_53 then -- exact
    local q = idiv(product, c)
    return q, product - q * c
  end
  -- Long division of a * b by c in binary: q the quotient so far, r the remainder (< c).
  local top = 1
  while top * 2 <= b do
    top = top * 2
  end
  local q, r, carry = 0, 0, 0
  while top >= 1 do
    r, carry = swc_add_mod(r, r, c)
    q = q * 2 + carry
    if b >= top then
      b = b - top
      r, carry = swc_add_mod(r, a, c)
      q = q + carry
    end
    top = top / 2
  end
  return q, r
end

-- curr + floor(prev * (period - elapsed) / period): what the window holds at elapsed.
local function swc_counted(prev, curr, elapsed, period)
  if elapsed <= 0 then
    return curr + prev
  end
  local q = swc_muldiv(period - elapsed, prev, period)
  return curr + q
end

-- µs until nothing is counted: a count c of the window before counts 0 from
-- e = period + 1 - ceil(period / c) on. (Times near 2^53: the differences from now are
-- formed first, so every intermediate stays exact.)
local function swc_whole_after(window, period, now, prev, curr)
  if curr > 0 then
    return (window * period - now) + (2 * period + 1 - ceil_div(period, curr))
  end
  if prev > 0 then
    local t = (window * period - now) + (period + 1 - ceil_div(period, prev))
    return t > 0 and t or 0
  end
  return 0
end

-- The first µs e >= 0 into a window where the count plus cost is at most limit; the caller
-- ensures one exists (curr + cost <= limit). With x = limit - curr - cost:
-- period + 1 - ceil((x + 1) * period / prev), unless x >= prev.
local function swc_first_admitting(prev, curr, period, cost, limit)
  local x = limit - curr - cost
  if x >= prev then
    return 0
  end
  local e
  if x + 1 == prev then
    e = period
  else
    local q, r = swc_muldiv(x + 1, period, prev)
    e = q + (r > 0 and 1 or 0)
  end
  return period + 1 - e
end

local function swc_retry(prev, curr, start, period, cost, limit, now)
  if cost > limit then
    return INFINITE
  end
  if curr + cost <= limit then
    return (start - now) + swc_first_admitting(prev, curr, period, cost, limit)
  end
  return (start - now) + (period + swc_first_admitting(curr, 0, period, cost, limit))
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
  head = 0,
  per = 3,
  decide = function(specs, n, state, now, cost, max_wait, lease, out, at)
    local windows, prevs, currs, counts = { nil }, { nil }, { nil }, { nil } -- sized for one limit
    local denied, retry = -1, 0
    for i = 1, n do
      local limit, period = specs[2 * i - 1], specs[2 * i]
      local window, prev, curr = swc_read(state, i, now, period)
      local start = window * period
      local counted = swc_counted(prev, curr, now - start, period)
      if counted + cost > limit then
        local r = swc_retry(prev, curr, start, period, cost, limit, now)
        if denied < 0 or later(r, retry) then
          denied, retry = i - 1, r
        end
      end
      windows[i], prevs[i], currs[i], counts[i] = window, prev, curr, counted
    end
    local charged = denied < 0 and cost or 0
    local whole = 0
    for i = 1, n do
      local left = specs[2 * i - 1] - (counts[i] + charged)
      out[at + 4 + i] = left > 0 and left or 0
      local reset = swc_whole_after(windows[i], specs[2 * i], now, prevs[i], currs[i] + charged)
      out[at + 4 + n + i] = reset
      if reset > whole then
        whole = reset
      end
    end
    if denied >= 0 then
      out[at + 1], out[at + 2], out[at + 3], out[at + 4] = 0, denied, retry, 0
      return state, false, whole
    end
    out[at + 1], out[at + 2], out[at + 3], out[at + 4] = 1, -1, 0, 0
    local new = state
    if charged > 0 then
      new = { nil, nil, nil, nil } -- sized for one limit and exp (main.lua)
      for i = 1, n do
        new[3 * i - 2], new[3 * i - 1], new[3 * i] = windows[i], prevs[i], currs[i] + charged
      end
    end
    return new, true, whole
  end,
  -- Count cost in each limit's current window whatever the count, never past twice the
  -- limit (of what the windows count).
  charge = function(specs, n, state, now, cost, out, at)
    local new = state
    if cost > 0 then
      new = { nil, nil, nil, nil } -- sized for one limit and exp (main.lua)
    end
    local whole = 0
    for i = 1, n do
      local limit, period = specs[2 * i - 1], specs[2 * i]
      local window, prev, curr = swc_read(state, i, now, period)
      local counted = swc_counted(prev, curr, now - window * period, period)
      local taken = debt_charge(cost, limit - counted, limit)
      curr = curr + taken
      out[at + 4 + i] = limit - counted - taken
      local reset = swc_whole_after(window, period, now, prev, curr)
      out[at + 4 + n + i] = reset
      if reset > whole then
        whole = reset
      end
      if cost > 0 then
        new[3 * i - 2], new[3 * i - 1], new[3 * i] = window, prev, curr
      end
    end
    out[at + 1], out[at + 2], out[at + 3], out[at + 4] = 1, -1, 0, 0
    return new, whole
  end,
  -- Take cost back from each limit's current window (never below 0), the state rewritten in
  -- now's window, as the reference does.
  refund = function(specs, n, state, now, cost, lease)
    if state == nil then
      return nil
    end
    local new = {}
    for i = 1, n do
      local window, prev, curr = swc_read(state, i, now, specs[2 * i])
      curr = curr - cost
      new[3 * i - 2], new[3 * i - 1], new[3 * i] = window, prev, curr > 0 and curr or 0
    end
    return new
  end,
}
