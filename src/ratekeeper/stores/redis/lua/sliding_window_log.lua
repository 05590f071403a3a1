-- ratekeeper: sliding window log, the times and costs of admitted requests
-- (algorithms/sliding_window_log.py). One log serves every limit of the rule.
--
-- spec per limit (arity 2): count, period     -- at most count admitted in any period µs
--
-- Unlike the other algorithms, the log is not a msgpack state read whole and written
-- whole: that costs O(entries) per call. It is one Redis string of fixed-width binary
-- records, then a trailer, read and written in place (GETRANGE / SETRANGE), so that a
-- call costs the same whatever the log's length (amortised; a second limit adds a binary
-- search):
--
--   record k (0-based), at byte k * (tw + cw):  time_k - ref (tw bytes), total_k (cw bytes)
--     big-endian unsigned; total_k is the cost admitted by every entry up to k (strictly
--     increasing: every entry costs > 0). Only differences of totals are ever used.
--   trailer (at byte n * (tw + cw), to the end): ref (double, µs), exp (double, µs: until
--     when the key's TTL was last set to reach, on the same clock as now), start, n
--     (uint32: entries before start are expired, not yet cut away; n = records stored),
--     base (cw: the total before entry start), ft, fc (tw, cw: entry start's time - ref
--     and total), lt, lc (the newest entry's), then tw and cw (one byte each, last, so the
--     trailer's length is known from its end).
--
-- A call reads the last SWL_TAIL bytes (the trailer and the newest records) in one
-- GETRANGE; expired entries are skipped by moving start (reading the entries just after
-- it), and an admitted entry is one SETRANGE of the record and the new trailer. The value
-- is rewritten whole (SET) only when it is new or emptied, after a refund, when expired
-- entries make up more than a fifth of it (a copy of the live bytes), or when an offset
-- outgrows its width (a rebase to the first live entry with widths for 4x the current
-- spans). A clock that stepped back stamps the new entry with the newest time (it then
-- counts a little longer), as the reference does. Expired entries are those no limit
-- counts (times <= now - longest period), as in the reference.

-- bytes read from the end: the trailer (at most 65) and the newest records, as few as serve
-- (a longer string costs Redis's Lua more garbage collection per call), as a constant
-- string (a number turned into one costs a sprintf)
local SWL_TAIL = "-128"
local SWL_CHUNK = 16 -- records read at once when skipping expired entries
local SWL_EXACT = 2 ^ 52 -- stored totals are rebased before they reach this

-- The formats of a record and of the trailer for widths (tw, cw), the trailer's length,
-- and the format of one record then the trailer (the usual append). Built from constant
-- strings (a number turned into a string costs a sprintf), once per (tw, cw) a library
-- meets: it keeps them between calls (a script builds the one it needs on every call).
local SWL_I = { "I1", "I2", "I3", "I4", "I5", "I6", "I7" }
local SWL_FORMATS = {}
local function swl_format(tw, cw)
  local f = SWL_FORMATS[8 * tw + cw]
  if f == nil then
    local t, c = SWL_I[tw], SWL_I[cw]
    local trailer = "ddI4I4I4" .. c .. t .. c .. t .. c .. "BB"
    f = { ">" .. t .. c, ">" .. trailer, 30 + 3 * cw + 2 * tw, ">" .. t .. c .. trailer }
    SWL_FORMATS[8 * tw + cw] = f
  end
  return f
end

-- the fewest bytes (at most 7) that hold x (an integer >= 0) unsigned
local function swl_width(x)
  local w, cap = 1, 256
  while x >= cap and w < 7 do
    w, cap = w + 1, cap * 256
  end
  return w
end

-- The log stored at key: a table of the trailer's fields, plus
--   stored  records held by the Redis value (0 .. stored - 1)
--   at, ac  records stored .. n - 1 (times absolute, totals), not written yet
--   tail, tail_from  the last bytes of the value and the byte offset they start at
--   whole   true when the value must be rewritten whole (SET) at the end
local function swl_open(key)
  local raw = redis.call("GETRANGE", key, SWL_TAIL, "-1")
  if raw == "" then
    return { key = key, at = {}, ac = {}, changed = false, start = 0, n = 0, stored = 0, base = 0,
      whole = true, exp = 0, hint = 0, longest = 0, maxcount = 0 }
  end
  local size = #raw
  local tw, cw = raw:byte(size - 1), raw:byte(size)
  local f = swl_format(tw, cw)
  local ref, exp, start, n, hint, base, ft, fc, lt, lc = struct.unpack(f[2], raw, size - f[3] + 1)
  -- one constructor: the table is sized once
  return { key = key, at = {}, ac = {}, changed = false, start = start, n = n, stored = n, base = base,
    whole = false, exp = exp, hint = hint, longest = 0, maxcount = 0, tw = tw, cw = cw, rw = tw + cw, rfmt = f[1],
    tfmt = f[2], rtfmt = f[4], ref = ref, ft = ref + ft, fc = fc, lt = ref + lt, lc = lc, tail = raw,
    tail_from = n * (tw + cw) + f[3] - size }
end

-- time and total of record i (0-based, start <= i < n)
local function swl_rec(log, i)
  local stored = log.stored
  if i >= stored then
    local j = i - stored + 1
    return log.at[j], log.ac[j]
  end
  local off = i * log.rw
  local t, c
  if off >= log.tail_from then
    t, c = struct.unpack(log.rfmt, log.tail, off - log.tail_from + 1)
  else
    t, c = struct.unpack(log.rfmt, redis.call("GETRANGE", log.key, off, off + log.rw - 1))
  end
  return log.ref + t, c
end

-- the first record in lo..hi-1 whose time is after x (hi when none): bisect_right
local function swl_after(log, lo, hi, x)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if swl_rec(log, mid) > x then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end

-- the first record in lo..hi-1 whose total reaches target (hi when none): bisect_left
local function swl_reaching(log, lo, hi, target)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local _, c = swl_rec(log, mid)
    if c >= target then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end

-- The first record in i..j-1 (j <= n) whose time is after x (j when none), the total of
-- the record before it (nil when it is i), and that record's time and total (nil when
-- none). The stored ones are read in one GETRANGE at most, and unpacked only up to the
-- answer (usually the first or second).
local function swl_scan(log, i, j, x)
  local stored = log.stored
  local k, before = i, nil
  if k < stored and k * log.rw < log.tail_from then
    local top = j < stored and j or stored
    local raw = redis.call("GETRANGE", log.key, k * log.rw, top * log.rw - 1)
    local pos, rfmt, ref = 1, log.rfmt, log.ref
    while k < top do
      local t, c
      t, c, pos = struct.unpack(rfmt, raw, pos)
      if ref + t > x then
        return k, before, ref + t, c
      end
      before = c
      k = k + 1
    end
  end
  while k < j do
    local t, c = swl_rec(log, k)
    if t > x then
      return k, before, t, c
    end
    before = c
    k = k + 1
  end
  return j, before
end

-- The first record in lo..hi-1 whose time is after x (hi when none), and the total of the
-- record before it (nil when it is lo). Starts at the hint (where the window began at the
-- last call: it moves a little per call), scanning the records from it read in one
-- GETRANGE; a bisection when the answer is not there. The hint is only a guess: any value
-- is safe.
local function swl_window(log, lo, hi, x)
  -- the oldest or the newest entry answers without a read (a log younger than the window,
  -- or a window with nothing in it)
  if lo == log.start and log.ft > x then
    return lo, nil
  end
  if hi == log.n and log.lt <= x then
    return hi, log.lc
  end
  local h = log.hint
  if h > lo and h < hi then
    local last = h + SWL_CHUNK
    if last > hi then
      last = hi
    end
    local k, before = swl_scan(log, h - 1, last, x)
    if k > h - 1 then -- record h - 1 is in no window after x: the answer is k, or after last
      if k < last then
        return k, before
      end
      k = swl_after(log, last, hi, x)
      if k == last then
        return k, before
      end
      local _, c = swl_rec(log, k - 1)
      return k, c
    end
    hi = h - 1 -- the answer is at most h - 1
    if hi == lo or swl_rec(log, hi - 1) <= x then
      if hi == lo then
        return lo, nil
      end
      local _, c = swl_rec(log, hi - 1)
      return hi, c
    end
  end
  local k = swl_after(log, lo, hi, x)
  if k == lo then
    return k, nil
  end
  local _, c = swl_rec(log, k - 1)
  return k, c
end

-- an empty log, to be written whole
local function swl_empty(log)
  log.start, log.n, log.stored, log.base, log.at, log.ac, log.whole, log.hint = 0, 0, 0, 0, {}, {}, true, 0
end

-- Move start past the entries whose time is at most cutoff (no limit counts them).
local function swl_trim(log, cutoff)
  local start, n = log.start, log.n
  if start >= n or log.ft > cutoff then
    return
  end
  if log.lt <= cutoff then -- every entry expired
    swl_empty(log)
    return
  end
  -- the newest is live: scan a chunk of the entries after start, then bisect
  local last = start + SWL_CHUNK
  if last > n then
    last = n
  end
  local i, before, ft, fc = swl_scan(log, start, last, cutoff)
  if i < last then
    log.start, log.ft, log.fc = i, ft, fc
    if before ~= nil then
      log.base = before
    end
    return
  end
  i = swl_after(log, i, n, cutoff)
  local t, c = swl_rec(log, i)
  local _, prior = swl_rec(log, i - 1)
  log.start, log.ft, log.fc, log.base = i, t, c, prior
end

-- Load records start..last-1 into at/ac: the value is then rewritten whole.
local function swl_load(log, last)
  local at, ac = {}, {}
  local i, stored = log.start, log.stored
  if i < stored then
    local top = last < stored and last or stored
    local raw = redis.call("GETRANGE", log.key, i * log.rw, top * log.rw - 1)
    local pos, rfmt, ref = 1, log.rfmt, log.ref
    while i < top do
      local t, c
      t, c, pos = struct.unpack(rfmt, raw, pos)
      at[#at + 1], ac[#ac + 1] = ref + t, c
      i = i + 1
    end
  end
  while i < last do
    at[#at + 1], ac[#ac + 1] = swl_rec(log, i)
    i = i + 1
  end
  local hint = log.hint - log.start
  log.hint = hint > 0 and hint or 0
  log.at, log.ac, log.start, log.n, log.stored, log.whole = at, ac, 0, #at, 0, true
end

local function swl_append(log, stamp, total)
  local j = log.n - log.stored + 1
  log.at[j], log.ac[j] = stamp, total
  if log.start == log.n then
    log.ft, log.fc = stamp, total
  end
  log.n = log.n + 1
  log.lt, log.lc = stamp, total
  log.changed = true
end

-- Write the log back: SETRANGE of the new records and trailer, or the whole value.
-- whole_us: when the log is whole again (µs from now); the TTL then covers it plus
-- margin_ms, and is set again only once it falls short (it may run a quarter margin over).
local function swl_flush(log, now, margin_ms)
  local key = log.key
  if log.start >= log.n then
    redis.call("DEL", key)
    return
  end
  local whole_us = log.lt + log.longest - now
  local need = now + whole_us + margin_ms * 1000
  local ttl_ms
  if need > log.exp then
    ttl_ms = math.ceil(whole_us / 1000) + margin_ms + math.ceil(margin_ms / 4)
    log.exp = now + ttl_ms * 1000
  end
  local start, n, stored = log.start, log.n, log.stored
  local prefix = nil -- the live stored bytes kept by a compacting rewrite
  if not log.whole then
    -- do the new records fit the widths? (and totals stay far below 2^53, where doubles
    -- stop being exact: a rebase brings them back to the live costs, at most a count)
    local tcap, ccap = 256 ^ log.tw, 256 ^ log.cw
    if ccap > SWL_EXACT then
      ccap = SWL_EXACT
    end
    if log.lt - log.ref >= tcap or log.lc >= ccap then
      swl_load(log, n)
    elseif start >= SWL_CHUNK and 5 * start > n then
      local rw = log.rw
      prefix = start < stored and redis.call("GETRANGE", key, start * rw, stored * rw - 1) or ""
      if start >= stored then
        swl_load(log, n)
      end
    end
  end
  if log.whole then
    -- rebase to the first live entry, widths for 4x the spans of now
    start, n = log.start, log.n
    local ref = log.ft
    local base = log.base
    local at, ac = log.at, log.ac
    local span = log.lt - ref
    if log.longest > span then
      span = log.longest
    end
    local cspan = log.lc - base
    if log.maxcount > cspan then
      cspan = log.maxcount
    end
    local tw, cw = swl_width(4 * span), swl_width(4 * cspan)
    local f = swl_format(tw, cw)
    local parts = {}
    local rfmt = f[1]
    for j = start + 1, n do
      parts[#parts + 1] = struct.pack(rfmt, at[j] - ref, ac[j] - base)
    end
    local hint = log.hint > start and log.hint - start or 0
    parts[#parts + 1] = struct.pack(f[2], ref, log.exp, 0, n - start, hint, 0, 0, log.fc - base, log.lt - ref,
      log.lc - base, tw, cw)
    if ttl_ms == nil then
      ttl_ms = math.ceil((log.exp - now) / 1000)
    end
    redis.call("SET", key, table.concat(parts), "PX", ttl_ms)
    return
  end
  local ref, rfmt = log.ref, log.rfmt
  local at, ac = log.at, log.ac
  if prefix == nil and n - stored == 1 then
    -- the usual call: one record and the trailer, in one pack
    redis.call("SETRANGE", key, stored * log.rw, struct.pack(log.rtfmt, at[1] - ref, ac[1],
      ref, log.exp, start, n, log.hint, log.base, log.ft - ref, log.fc, log.lt - ref, log.lc, log.tw, log.cw))
    if ttl_ms ~= nil then
      redis.call("PEXPIRE", key, ttl_ms)
    end
    return
  end
  local parts = {}
  for j = 1, n - stored do
    parts[j] = struct.pack(rfmt, at[j] - ref, ac[j])
  end
  if prefix ~= nil then
    -- expired entries dropped: the live bytes, the new records, the trailer from 0
    local hint = log.hint > start and log.hint - start or 0
    parts[#parts + 1] = struct.pack(log.tfmt, ref, log.exp, 0, n - start, hint, log.base, log.ft - ref, log.fc,
      log.lt - ref, log.lc, log.tw, log.cw)
    if ttl_ms == nil then
      ttl_ms = math.ceil((log.exp - now) / 1000)
    end
    redis.call("SET", key, prefix .. table.concat(parts), "PX", ttl_ms)
    return
  end
  parts[#parts + 1] = struct.pack(log.tfmt, ref, log.exp, start, n, log.hint, log.base, log.ft - ref, log.fc,
    log.lt - ref, log.lc, log.tw, log.cw)
  redis.call("SETRANGE", key, stored * log.rw, table.concat(parts))
  if ttl_ms ~= nil then
    redis.call("PEXPIRE", key, ttl_ms)
  end
end

local function swl_longest(log, specs, n)
  local longest, maxcount = 0, 0
  for i = 1, n do
    if specs[2 * i] > longest then
      longest = specs[2 * i]
    end
    if specs[2 * i - 1] > maxcount then
      maxcount = specs[2 * i - 1]
    end
  end
  log.longest, log.maxcount = longest, maxcount
  return longest
end

ALGORITHMS["sliding_window_log"] = {
  arity = 2,
  open = swl_open,
  flush = swl_flush,
  -- dry: decide without charging (a peek); force: charge without a check (charge)
  decide = function(specs, nl, log, now, cost, max_wait, lease, out, at, dry, force)
    local longest = swl_longest(log, specs, nl)
    swl_trim(log, now - longest)
    local start, n = log.start, log.n
    local empty = start >= n
    local base = log.base
    local total = empty and base or log.lc
    local useds = { nil } -- sized for one limit (no rehash)
    local denied, retry = -1, 0
    local hinted = false
    for i = 1, nl do
      local limit, period = specs[2 * i - 1], specs[2 * i]
      local first, before = start, base
      if period < longest and not empty then
        local c
        first, c = swl_window(log, start, n, now - period) -- the oldest entry in this window
        if c ~= nil then
          before = c
        end
        if not hinted then
          log.hint, hinted = first, true
        end
      end
      local used = total - before
      useds[i] = used
      if used + cost > limit and not force then
        local r = INFINITE
        if cost <= limit then
          -- the entry whose expiry frees enough: its total reaches the excess
          local target = total + cost - limit
          local k = first
          local t
          if first == start and log.fc >= target then
            t = log.ft
          else
            k = swl_reaching(log, first, n, target)
            t = swl_rec(log, k)
          end
          r = t + period - now
        end
        if denied < 0 or later(r, retry) then
          denied, retry = i - 1, r
        end
      end
    end
    local newest = empty and now or log.lt
    local charged = denied < 0 and cost or 0
    if force then -- as much as keeps every window within twice its count
      for i = 1, nl do
        local limit = specs[2 * i - 1]
        local taken = debt_charge(cost, limit - useds[i], limit)
        if taken < charged then
          charged = taken
        end
      end
    end
    if charged > 0 then
      if now > newest then
        newest = now
      end
      if not dry then
        swl_append(log, newest, total + charged)
      end
    end
    for i = 1, nl do
      local in_window = useds[i] + charged
      local left = specs[2 * i - 1] - in_window -- below 0 under a limit lowered since, or in debt
      out[at + 4 + i] = (left > 0 or force) and left or 0
      out[at + 4 + nl + i] = in_window > 0 and newest + specs[2 * i] - now or 0
    end
    if denied >= 0 then
      out[at + 1], out[at + 2], out[at + 3], out[at + 4] = 0, denied, retry, 0
      return log, false
    end
    out[at + 1], out[at + 2], out[at + 3], out[at + 4] = 1, -1, 0, 0
    return log, true
  end,
  -- Append cost whatever the windows hold (a charge without a check): decide, forced.
  charge = function(specs, nl, log, now, cost, out, at)
    return ALGORITHMS["sliding_window_log"].decide(specs, nl, log, now, cost, nil, nil, out, at, false, true)
  end,
  -- Take cost back from the newest live entries (the log is emptied when nothing is left).
  refund = function(specs, nl, log, now, cost, lease)
    local had = log.n > log.start
    swl_trim(log, now - swl_longest(log, specs, nl))
    local start, n = log.start, log.n
    if start >= n then
      log.changed = had -- every entry expired: the log is forgotten, as the reference's None
      return log
    end
    log.changed = true
    local target = log.lc - cost
    if target <= log.base then
      swl_empty(log)
      return log
    end
    local k = swl_reaching(log, start, n, target) -- the first entry whose total reaches it
    swl_load(log, k + 1)
    log.ac[#log.ac] = target
    log.lt, log.lc, log.fc = log.at[#log.at], target, log.ac[1]
    return log
  end,
}
