-- ratekeeper: leaky bucket as a queue, admitting with a delay (algorithms/leaky_bucket.py).
-- requires: gcra
--
-- spec per limit (arity 4): n, d, cap, tau   -- as GCRA: n/d µs per unit of cost (reduced),
--                                            -- cap = burst, tau = cap * n
-- state: t0, then per limit ahead, n, d, cap  -- GCRA's (gcra.lua): written at t0 (µs);
--                                            -- ahead = (time the queue is empty) - t0, in 1/d µs,
--                                            -- with the scale (carried as GCRA's)
--
-- The state, its relative form (exact with epoch µs), the end of a decision, the stats and
-- the refund and the charge without a check are GCRA's (the helpers of gcra.lua); only when a request may leave differs.
-- An admitted request gets delay = the time until the queue ahead of it has drained; a
-- refused one gets retry = when the queue has room for it and (if the caller bounds its
-- wait by max_wait) is short enough. The decisions are the reference's, field by field.

ALGORITHMS["leaky_bucket"] = {
  arity = 4,
  head = 1,
  per = 4,
  decide = function(specs, n, state, now, cost, max_wait, lease, out, at)
    local aheads = { nil } -- sized for one limit (no rehash)
    local denied, retry, delay, infinite = -1, 0, 0, false
    for i = 1, n do
      local o = 4 * i - 4
      local nn, d, cap, tau = specs[o + 1], specs[o + 2], specs[o + 3], specs[o + 4]
      local a = gcra_ahead(state, i, now, specs, o)
      aheads[i] = a
      local queued = ceil_div(a, d)
      if queued > delay then
        delay = queued
      end
      if cost > cap then
        if not infinite then
          infinite, denied, retry = true, i - 1, INFINITE
        end
      else
        -- room in the queue, and a queue short enough for the caller: the later of the two
        local need = ceil_div(a + cost * nn - tau, d)
        if max_wait ~= nil and queued - max_wait > need then
          need = queued - max_wait
        end
        if need > 0 and not infinite and need > retry then
          denied, retry = i - 1, need
        end
      end
    end
    return gcra_finish(specs, n, state, now, cost, aheads, out, at, denied < 0, denied, retry, delay)
  end,
  charge = gcra_charge,
  refund = gcra_refund,
}
