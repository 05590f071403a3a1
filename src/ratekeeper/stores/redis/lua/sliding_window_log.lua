-- ratekeeper: sliding window log, the times and costs of admitted requests
-- (algorithms/sliding_window_log.py). One log serves every limit of the rule.
--
-- spec per limit (arity 2): count, period     -- at most count admitted in any period µs
-- state: { ref, offset_1, total_1, ..., offset_n, total_n }  -- nil when the log is empty
--   entry k was admitted at ref + offset_k (offsets ascending, offset_1 = 0) and total_k is
--   the cost admitted by entries 1..k (strictly increasing: every entry costs > 0).
--
-- Compact: two small integers per entry besides one absolute time. A decision is O(log n)
-- over the log (binary searches, as the reference's bisect); writing a new log is O(n):
-- it copies the entries still live (times > now - longest period) and appends, so expired
-- entries are dropped exactly where the reference drops them, and offsets and totals are
-- rebased to the first live entry. A clock that stepped back stamps the new entry with the
-- newest time (it then counts a little longer), as the reference does.

-- The first entry k in lo..hi whose time is after ref + x (hi + 1 when none): bisect_right.
local function swl_after(state, lo, hi, x)
  hi = hi + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if state[2 * mid] > x then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end

-- The first entry k in lo..hi whose total reaches target (hi + 1 when none): bisect_left.
local function swl_reaching(state, lo, hi, target)
  hi = hi + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if state[2 * mid + 1] >= target then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end

-- The live part of the log at now: ref, n (entries stored), live (the first entry any
-- limit still counts), base (the total before entry live) and total (of the whole log).
local function swl_live(specs, state, now)
  if state == nil then
    return 0, 0, 1, 0, 0
  end
  local longest = 0
  for i = 1, #specs do
    if specs[i][2] > longest then
      longest = specs[i][2]
    end
  end
  local ref, n = state[1], (#state - 1) / 2
  local live = swl_after(state, 1, n, now - longest - ref)
  local base = live > 1 and state[2 * live - 1] or 0
  local total = n >= live and state[2 * n + 1] or base
  return ref, n, live, base, total
end

-- A new log of entries live..last (the last one's total replaced by last_total), rebased to
-- the time of entry live, then (stamp, total) appended when stamp is given.
local function swl_copy(state, ref, live, last, base, last_total, stamp, total)
  local new = {}
  local shift = 0
  if live <= last then
    shift = state[2 * live]
    local j = 2
    for k = live, last do
      new[j] = state[2 * k] - shift
      new[j + 1] = state[2 * k + 1] - base
      j = j + 2
    end
    new[j - 1] = last_total - base
  elseif stamp ~= nil then
    shift = stamp - ref
  end
  new[1] = ref + shift
  if stamp ~= nil then
    local j = #new + 1
    new[j] = stamp - new[1]
    new[j + 1] = total - base
  end
  return new
end

ALGORITHMS["sliding_window_log"] = {
  arity = 2,
  decide = function(specs, state, now, cost, max_wait, lease)
    local ref, n, live, base, total = swl_live(specs, state, now)
    local useds = {}
    local denied, retry = -1, 0
    for i = 1, #specs do
      local limit, period = specs[i][1], specs[i][2]
      local first = swl_after(state, live, n, now - period - ref) -- the oldest entry in this window
      local before = first > live and state[2 * first - 1] or base
      local used = total - before
      useds[i] = used
      if used + cost > limit then
        local r = INFINITE
        if cost <= limit then
          -- the entry whose expiry frees enough: its total reaches the excess
          local k = swl_reaching(state, first, n, total + cost - limit)
          r = ref + state[2 * k] + period - now
        end
        if denied < 0 or later(r, retry) then
          denied, retry = i - 1, r
        end
      end
    end
    local newest = n >= live and ref + state[2 * n] or now
    local charged = denied < 0 and cost or 0
    local new = state
    if charged > 0 then
      if now > newest then
        newest = now
      end
      new = swl_copy(state, ref, live, n, base, total, newest, total + cost)
    end
    local remaining, resets = {}, {}
    for i = 1, #specs do
      local in_window = useds[i] + charged
      remaining[i] = specs[i][1] - in_window
      resets[i] = in_window > 0 and newest + specs[i][2] - now or 0
    end
    if denied >= 0 then
      return state, false, denied, retry, 0, remaining, resets
    end
    return new, true, -1, 0, 0, remaining, resets
  end,
  -- Take cost back from the newest live entries (nil when nothing is left).
  refund = function(specs, state, now, cost, lease)
    local ref, n, live, base, total = swl_live(specs, state, now)
    if n < live then
      return nil
    end
    local target = total - cost
    if target <= base then
      return nil
    end
    local k = swl_reaching(state, live, n, target) -- the first entry whose total reaches it
    return swl_copy(state, ref, live, k, base, target, nil, nil)
  end,
}
