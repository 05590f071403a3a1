-- ratekeeper: fixed window, a counter per aligned window of the period
-- (algorithms/fixed_window.py).
--
-- spec per limit (arity 2): count, period     -- at most count per window of period µs
-- state: window_1, count_1, ..., window_n, count_n  -- window = now // period
--
-- Windows and counts are integers below 2^53 (window * period <= now), so the doubles hold
-- them exactly; now // period is idiv (exact). A clock that stepped back stays in the newer
-- stored window, as the reference does. The decisions are the reference's, field by field.

ALGORITHMS["fixed_window"] = {
  arity = 2,
  head = 0,
  per = 2,
  decide = function(specs, n, state, now, cost, max_wait, lease, out, at)
    local windows, counts, ends = { nil }, { nil }, { nil } -- sized for one limit (no rehash)
    local denied, retry = -1, 0
    for i = 1, n do
      local limit, period = specs[2 * i - 1], specs[2 * i]
      local window = idiv(now, period)
      local count = 0
      if state ~= nil then
        local w = state[2 * i - 1]
        if w > window then
          window = w -- the clock stepped back: stay in the newer window
        end
        if w == window then
          count = state[2 * i]
        end
      end
      local finish = (window + 1) * period - now
      if count + cost > limit then
        local r = cost > limit and INFINITE or finish
        if denied < 0 or later(r, retry) then
          denied, retry = i - 1, r
        end
      end
      windows[i], counts[i], ends[i] = window, count, finish
    end
    local charged = denied < 0 and cost or 0
    local whole = 0
    for i = 1, n do
      local c = counts[i] + charged
      local left = specs[2 * i - 1] - c -- below 0 under a limit lowered since
      out[at + 4 + i] = left > 0 and left or 0
      local reset = c > 0 and ends[i] or 0
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
      new = { nil, nil, nil } -- sized for one limit and exp (main.lua)
      for i = 1, n do
        new[2 * i - 1] = windows[i]
        new[2 * i] = counts[i] + charged
      end
    end
    return new, true, whole
  end,
  -- Count cost in each limit's window whatever its count, never past twice the limit.
  charge = function(specs, n, state, now, cost, out, at)
    local new = state
    if cost > 0 then
      new = { nil, nil, nil } -- sized for one limit and exp (main.lua)
    end
    local whole = 0
    for i = 1, n do
      local limit, period = specs[2 * i - 1], specs[2 * i]
      local window = idiv(now, period)
      local count = 0
      if state ~= nil and state[2 * i - 1] >= window then
        window, count = state[2 * i - 1], state[2 * i]
      end
      count = count + debt_charge(cost, limit - count, limit)
      out[at + 4 + i] = limit - count
      local reset = count > 0 and (window + 1) * period - now or 0
      out[at + 4 + n + i] = reset
      if reset > whole then
        whole = reset
      end
      if cost > 0 then
        new[2 * i - 1], new[2 * i] = window, count
      end
    end
    out[at + 1], out[at + 2], out[at + 3], out[at + 4] = 1, -1, 0, 0
    return new, whole
  end,
  -- Give back cost in every limit whose stored window is now's (or newer: the clock stepped
  -- back); a limit in an older window has nothing left to refund.
  refund = function(specs, n, state, now, cost, lease)
    if state == nil then
      return nil
    end
    local new = {}
    for i = 1, n do
      local w, c = state[2 * i - 1], state[2 * i]
      if w >= idiv(now, specs[2 * i]) then
        c = c - cost
        if c < 0 then
          c = 0
        end
      end
      new[2 * i - 1], new[2 * i] = w, c
    end
    return new
  end,
}
