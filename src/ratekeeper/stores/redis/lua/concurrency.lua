-- ratekeeper: concurrency, at most `count` leases in flight (algorithms/concurrency.py).
--
-- spec per limit (arity 2): count, period     -- a lease counts for a limit until
--                                             -- acquired + period (µs)
-- state: { id_1, acquired_1, cost_1, ..., id_k, acquired_k, cost_k }  -- the reference's
--        layout: the leases in the order acquired (acquired never decreases, even when
--        the clock steps back); id a string ("" for a lease taken without an id)
--
-- decide takes a lease of `cost` under the id `lease` when every limit has room; refund
-- releases the lease `lease` (its cost is ignored: a lease is released whole). Leases
-- older than the longest period are dropped as the state is read. Times are µs, costs
-- small integers; the time until an expiry is (acquired - now) + period, so no time
-- past 2^53 is ever formed. The decisions are the reference's, field by field.

-- the leases still alive at now for some limit: `state` itself when none expired
local function cc_live(specs, n, state, now)
  if state == nil then
    return nil
  end
  local longest = 0
  for i = 1, n do
    if specs[2 * i] > longest then
      longest = specs[2 * i]
    end
  end
  local horizon = now - longest
  local k, n = 1, #state
  while k <= n and state[k + 1] <= horizon do
    k = k + 3
  end
  if k == 1 then
    return state
  end
  if k > n then
    return nil
  end
  local live = {}
  for j = k, n do
    live[#live + 1] = state[j]
  end
  return live
end

ALGORITHMS["concurrency"] = {
  arity = 2,
  msgpack = true, -- lease ids are strings: the state is stored with cmsgpack
  decide = function(specs, nl, state, now, cost, max_wait, lease, out, at)
    local leases = cc_live(specs, nl, state, now)
    local n = leases and #leases or 0
    local useds = {}
    local denied, retry = -1, 0
    for i = 1, nl do
      local limit, period = specs[2 * i - 1], specs[2 * i]
      local cutoff = now - period
      local used, first = 0, n + 1
      for j = n - 2, 1, -3 do
        if leases[j + 1] <= cutoff then
          break
        end
        used = used + leases[j + 2]
        first = j
      end
      useds[i] = used
      if used + cost > limit then
        local r
        if cost > limit then
          r = INFINITE
        else
          -- the lease whose expiry frees enough for cost
          local need = used + cost - limit
          local k = first
          while true do
            need = need - leases[k + 2]
            if need <= 0 then
              break
            end
            k = k + 3
          end
          r = (leases[k + 1] - now) + period -- never forms a time beyond 2^53
        end
        if denied < 0 or later(r, retry) then
          denied, retry = i - 1, r
        end
      end
    end
    local charged = 0
    if denied < 0 and cost > 0 then
      local acquired = now
      if n > 0 and leases[n - 1] > now then
        acquired = leases[n - 1] -- the clock stepped back: keep the leases in order
      end
      local new = {}
      for j = 1, n do
        new[j] = leases[j]
      end
      new[n + 1], new[n + 2], new[n + 3] = lease or "", acquired, cost
      leases, n, charged = new, n + 3, cost
    end
    local newest = n > 0 and leases[n - 1] or now
    local whole = 0
    for i = 1, nl do
      local total = useds[i] + charged
      local left = specs[2 * i - 1] - total -- more held than a count lowered since: 0
      out[at + 4 + i] = left > 0 and left or 0
      local reset = total > 0 and (newest - now) + specs[2 * i] or 0
      out[at + 4 + nl + i] = reset
      if reset > whole then
        whole = reset
      end
    end
    if denied < 0 then
      out[at + 1], out[at + 2], out[at + 3], out[at + 4] = 1, -1, 0, 0
    else
      out[at + 1], out[at + 2], out[at + 3], out[at + 4] = 0, denied, retry, 0
    end
    return leases, denied < 0, whole
  end,
  -- release the lease `lease` (and say whether it was held); the leases that expired are
  -- dropped too
  refund = function(specs, nl, state, now, cost, lease)
    if lease == nil then
      error("ratekeeper: releasing a concurrency lease needs its lease_id")
    end
    local leases = cc_live(specs, nl, state, now)
    if leases == nil then
      return nil, false
    end
    for j = 1, #leases, 3 do
      if leases[j] == lease then
        if #leases == 3 then
          return nil, true
        end
        local new = {}
        for m = 1, #leases do
          if m < j or m > j + 2 then
            new[#new + 1] = leases[m]
          end
        end
        return new, true
      end
    end
    return leases, false
  end,
}
