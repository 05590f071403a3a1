-- ratekeeper: sliding window log (ratekeeper/algorithms/sliding_window_log.py), in PL/pgSQL,
-- with a cost per call that does not grow with the log's length.
--
-- The log of one storage key: the admitted requests in order, each with its time and the
-- running total (the cost admitted since the log began, so totals increase strictly: only
-- positive costs are logged). The newest entries (the head) live in the state row; older
-- ones in sealed segments of at most SEGMENT entries, rows of @table@_log (schema.sql
-- documents its columns), inserted once when the head fills and deleted once every entry
-- in them is dropped. The state (numeric[], of odd length):
--   [1] base    running total before the first entry the log still keeps (entries at or
--               below it are dropped: the reference's moving start)
--   [2] hi      upto of the newest segment (0: none)
--   [3] hi_t    its last_t
--   [4] lo      upto of the oldest stored segment (0: none)
--   [5] flags   in a working copy, what writing it back must do to the segments: 0 nothing,
--               1 seal or delete (the head reached SEGMENT entries, or base passed lo), 2 a
--               refund pulled a segment back into the head: delete the segments above hi
--               too (stored: 0)
--   [6 .. 5+n]      the head's times, ascending
--   [6+n .. 5+2n]   the head's running totals
-- Any other array (an even length, or shorter than 5) is no state of this rule: the call
-- fails rather than misread it.
--
-- A limit of period p counts the kept entries with time > now - p: the cost admitted in
-- its window is total - before, where before is the running total before the first such
-- entry (the larger of base and the total of the last entry at or before now - p). That
-- entry is found in the head with one width_bucket (a binary search in C), or, when the
-- window starts before the head, by one index lookup of the first segment whose last_t is
-- after now - p and a width_bucket inside it. A denial's retry time needs the entry at
-- which the running total reaches total + cost - count: one lookup by upto. Reads only:
-- the writes (sealing, deleting dropped and pulled-back segments) wait for
-- @table@_log_flush, which the decide function runs when it writes the call's state back,
-- and never for an atomic call that was refused.

-- A segment's offsets and relative totals, packed: a bytea whose first byte is the width w
-- (1 to 4) and then each value, 0 to 2**32 - 1, in w bytes, least significant first; w is
-- the fewest bytes that hold the largest value (entries 1 ms apart over a segment: 2).
-- rk_pack(values) packs; rk_packed(b, j) is value j (1-based); rk_packed_len(b) the count;
-- rk_packed_last(b) the last value; rk_packed_count(b, v) how many values are <= v (the
-- values ascending: a binary search, as width_bucket does on an array).
CREATE OR REPLACE FUNCTION @schema@.rk_pack(vals bigint[]) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT decode(lpad(w::text, 2, '0') || string_agg(lpad(to_hex((v >> (8 * k)) & 255), 2, '0'), '' ORDER BY i, k),
                  'hex')
    FROM (SELECT CASE WHEN m < 256 THEN 1 WHEN m < 65536 THEN 2 WHEN m < 16777216 THEN 3 ELSE 4 END AS w
          FROM (SELECT max(x) AS m FROM unnest(vals) AS x) AS mx) AS width,
         unnest(vals) WITH ORDINALITY AS u (v, i), generate_series(0, w - 1) AS k
    GROUP BY w
$$;

CREATE OR REPLACE FUNCTION @schema@.rk_packed(b bytea, j int) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE get_byte(b, 0)
        WHEN 1 THEN get_byte(b, j)::bigint
        WHEN 2 THEN get_byte(b, 2 * j - 1) + (get_byte(b, 2 * j)::bigint << 8)
        WHEN 3 THEN get_byte(b, 3 * j - 2) + (get_byte(b, 3 * j - 1)::bigint << 8) + (get_byte(b, 3 * j)::bigint << 16)
        ELSE get_byte(b, 4 * j - 3) + (get_byte(b, 4 * j - 2)::bigint << 8) + (get_byte(b, 4 * j - 1)::bigint << 16)
             + (get_byte(b, 4 * j)::bigint << 24)
    END
$$;

CREATE OR REPLACE FUNCTION @schema@.rk_packed_len(b bytea) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT (octet_length(b) - 1) / get_byte(b, 0) $$;

CREATE OR REPLACE FUNCTION @schema@.rk_packed_last(b bytea) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT @schema@.rk_packed(b, @schema@.rk_packed_len(b)) $$;

CREATE OR REPLACE FUNCTION @schema@.rk_packed_count(b bytea, v bigint) RETURNS int
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    lo int := 0;  -- values 1..lo are <= v
    hi int := @schema@.rk_packed_len(b);  -- values hi + 1.. are > v
    mid int;
BEGIN
    WHILE lo < hi LOOP
        mid := (lo + hi + 1) / 2;
        IF @schema@.rk_packed(b, mid) <= v THEN
            lo := mid;
        ELSE
            hi := mid - 1;
        END IF;
    END LOOP;
    RETURN lo;
END
$$;

-- @schema@.@table@_sliding_window_log(lkey, st, ls, now_us, spec, cost, op_mode)
--   lkey      the storage key (its segments' key)
--   st        the state above (NULL when absent); ls the lease ids (unused)
--   now_us    now in µs; spec per limit (count, period_us), flattened; cost (>= 0)
--   op_mode   the op's mode (wire.py): 'd' or 'p' decide; 'r' take cost back from the
--             newest entries (reply is NULL), pulling the newest segment back into the
--             head when the cut lies in it; 'c' append cost without a check, as much of it
--             as keeps every limit's window within twice its count
-- Returns new_state / new_leases and reply (the wire format's fields: allowed,
-- denied_index, retry_us, delay_us, remaining_1..n, reset_1..n). Same steps as
-- SlidingWindowLog.decide / refund / charge.
CREATE OR REPLACE FUNCTION @schema@.@table@_sliding_window_log(
    lkey text, st numeric[], ls text[], now_us bigint, spec bigint[], cost bigint, op_mode text,
    OUT new_state numeric[], OUT new_leases text[], OUT reply bigint[])
LANGUAGE plpgsql STABLE AS $$
DECLARE
    refund boolean := op_mode = 'r';
    force boolean := op_mode = 'c';
    SEGMENT CONSTANT int := 64;  -- as in @table@_log_flush
    cnt int := array_length(spec, 1) / 2;
    len int := coalesce(array_length(st, 1), 0);
    n int;
    base numeric;
    hi numeric;
    hi_t bigint;
    lo numeric;
    flags numeric := 0;
    times numeric[];
    totals numeric[];
    total numeric;
    last_t numeric;
    longest bigint := 0;
    x bigint;
    j int;
    m int;
    lim bigint;
    period bigint;
    before numeric;
    live_before numeric;
    useds numeric[] := '{}';
    target numeric;
    r numeric;
    denied int := -1;
    retry numeric := 0;
    newest numeric;
    charged bigint;
    sb numeric;
    su numeric;
    sf bigint;
    so bytea;
    sr bytea;
    sm int;
    remaining bigint[] := '{}';
    resets bigint[] := '{}';
BEGIN
    new_leases := ls;
    IF len = 0 THEN  -- absent: an empty log
        n := 0;
        base := 0;
        hi := 0;
        hi_t := 0;
        lo := 0;
        times := '{}';
        totals := '{}';
    ELSIF len % 2 = 0 OR len < 5 THEN
        RAISE EXCEPTION 'ratekeeper: the state at % is not a sliding log state (% numbers: 5 and an even count expected)',
            lkey, len;
    ELSE
        base := st[1];
        hi := st[2];
        hi_t := st[3];
        lo := st[4];
        flags := st[5];
        n := (len - 5) / 2;
        times := st[6 : 5 + n];
        totals := st[6 + n : 5 + 2 * n];
    END IF;
    total := CASE WHEN n > 0 THEN totals[n] ELSE greatest(base, hi) END;
    last_t := CASE WHEN n > 0 THEN times[n] WHEN hi > base THEN hi_t END;
    FOR i IN 1..cnt LOOP
        longest := greatest(longest, spec[2 * i]);
    END LOOP;

    -- Per limit (and for the longest period: where the kept live entries start), the
    -- running total before the window.
    FOR i IN CASE WHEN refund THEN 0 ELSE 1 END .. CASE WHEN refund THEN 0 ELSE cnt END LOOP
        -- i = 0 (a refund): the longest period only
        x := now_us - CASE WHEN i = 0 THEN longest ELSE spec[2 * i] END;
        IF total <= base OR last_t <= x THEN
            before := total;  -- nothing kept is in the window
        ELSIF hi > base AND hi_t > x THEN  -- the window starts in a segment
            SELECT s.before, s.upto, s.first_t, s.offs, s.rels INTO sb, su, sf, so, sr
            FROM @schema@.@table@_log s WHERE s.key = lkey AND s.last_t > x ORDER BY s.last_t, s.upto LIMIT 1;
            j := @schema@.rk_packed_count(so, x - sf);  -- its entries at or before x
            before := greatest(base, CASE WHEN j = 0 THEN sb WHEN sr IS NULL THEN su - @schema@.rk_packed_len(so) + j
                                          ELSE su - @schema@.rk_packed_last(sr) + @schema@.rk_packed(sr, j) END);
        ELSE
            j := width_bucket(x::numeric, times);
            before := greatest(base, CASE WHEN j = 0 THEN hi ELSE totals[j] END);
        END IF;
        IF i = 0 THEN
            live_before := before;
        ELSE
            useds[i] := total - before;
            IF spec[2 * i] = longest THEN
                live_before := before;
            END IF;
        END IF;
    END LOOP;

    IF refund THEN
        target := total - cost;
        IF target <= live_before THEN
            new_state := NULL;  -- nothing live would be left
            RETURN;
        END IF;
        IF target > hi THEN  -- the cut lies in the head
            j := width_bucket(target - 1, totals) + 1;
            times := times[1 : j];
            totals := totals[1 : j - 1] || target;
        ELSE  -- in a segment: it becomes the head, the newer ones are deleted on write
            SELECT s.upto, s.first_t, s.offs, s.rels INTO su, sf, so, sr
            FROM @schema@.@table@_log s WHERE s.key = lkey AND s.upto >= target ORDER BY s.upto LIMIT 1;
            m := @schema@.rk_packed_len(so);
            times := ARRAY(SELECT sf + @schema@.rk_packed(so, i) FROM generate_series(1, m) AS i ORDER BY i);
            totals := ARRAY(SELECT su - m + i FROM generate_series(1, m) AS i ORDER BY i);
            IF sr IS NOT NULL THEN
                totals := ARRAY(SELECT su - @schema@.rk_packed(sr, m) + @schema@.rk_packed(sr, i)
                                FROM generate_series(1, m) AS i ORDER BY i);
            END IF;
            j := width_bucket(target - 1, totals) + 1;
            times := times[1 : j];
            totals := totals[1 : j - 1] || target;
            SELECT s.upto, s.last_t INTO hi, hi_t
            FROM @schema@.@table@_log s WHERE s.key = lkey AND s.upto < su ORDER BY s.upto DESC LIMIT 1;
            hi := coalesce(hi, 0);
            hi_t := coalesce(hi_t, 0);
            flags := 2;
        END IF;
        j := width_bucket(live_before, totals);  -- entries no limit counts any more are dropped
        n := coalesce(array_length(times, 1), 0);
        IF flags = 0 AND lo > 0 AND lo <= live_before THEN
            flags := 1;
        END IF;
        new_state := ARRAY[live_before, hi, hi_t, lo, flags] || times[j + 1 : n] || totals[j + 1 : n];
        RETURN;
    END IF;

    FOR i IN 1..cnt LOOP
        lim := spec[2 * i - 1];
        IF useds[i] + cost > lim AND NOT force THEN
            period := spec[2 * i];
            IF cost > lim THEN
                r := -1;
            ELSE
                -- The entry whose expiry frees enough: the running total reaches total + cost - count.
                target := total + cost - lim;
                IF target > hi THEN
                    r := times[width_bucket(target - 1, totals) + 1] + period - now_us;
                ELSE
                    SELECT s.upto, s.first_t, s.offs, s.rels INTO su, sf, so, sr
                    FROM @schema@.@table@_log s WHERE s.key = lkey AND s.upto >= target ORDER BY s.upto LIMIT 1;
                    sm := @schema@.rk_packed_len(so);
                    IF sr IS NULL THEN  -- unit costs: entry j's total is su - sm + j
                        j := greatest(target - su + sm, 1)::int;
                    ELSE
                        j := @schema@.rk_packed_count(sr, (target - 1 - (su - @schema@.rk_packed_last(sr)))::bigint) + 1;
                    END IF;
                    r := sf + @schema@.rk_packed(so, j) + period - now_us;
                END IF;
            END IF;
            IF denied < 0 OR @schema@.rk_later(r, retry) THEN
                denied := i - 1;
                retry := r;
            END IF;
        END IF;
    END LOOP;
    newest := CASE WHEN total > live_before THEN last_t ELSE now_us END;
    charged := CASE WHEN denied < 0 THEN cost ELSE 0 END;
    IF force THEN  -- as much as keeps every window within twice its count
        FOR i IN 1..cnt LOOP
            charged := least(charged, @schema@.rk_debt_charge(cost, spec[2 * i - 1] - useds[i], spec[2 * i - 1]));
        END LOOP;
    END IF;
    IF charged <> 0 THEN
        -- A clock that stepped back must not break the order: the entry then counts a little longer.
        IF now_us > newest OR total <= live_before THEN
            newest := now_us;
        END IF;
        j := width_bucket(live_before, totals);  -- entries no limit counts any more are dropped
        IF flags = 0 AND (n - j + 1 >= SEGMENT OR (lo > 0 AND lo <= live_before)) THEN
            flags := 1;
        END IF;
        new_state := ARRAY[live_before, hi, hi_t, lo, flags] || times[j + 1 : n] || newest
            || totals[j + 1 : n] || (total + charged);
    ELSE
        new_state := st;
    END IF;
    FOR i IN 1..cnt LOOP
        remaining[i] := spec[2 * i - 1] - (useds[i] + charged);  -- below 0: a lowered limit, or a debt
        IF remaining[i] < 0 AND NOT force THEN
            remaining[i] := 0;
        END IF;
        resets[i] := CASE WHEN useds[i] + charged > 0 THEN newest + spec[2 * i] - now_us ELSE 0 END;
    END LOOP;
    reply := ARRAY[CASE WHEN denied < 0 THEN 1 ELSE 0 END, denied, retry, 0]::bigint[] || remaining || resets;
END
$$;

-- @schema@.@table@_log_flush(lkey, st) RETURNS numeric[]
--   Writes what a sliding log's working state (above) implies for its segments, when the
--   decide function writes the state back: deletes the segments a refund pulled back, the
--   segments whose every entry is dropped, and seals the head's oldest entries into new
--   segments while it holds SEGMENT or more. Returns the state to store.
CREATE OR REPLACE FUNCTION @schema@.@table@_log_flush(lkey text, st numeric[]) RETURNS numeric[]
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    SEGMENT CONSTANT int := 64;  -- entries per sealed segment
    INT_MAX CONSTANT bigint := 2147483647;
    len int := coalesce(array_length(st, 1), 0);
    n int := (len - 5) / 2;
    base numeric;
    hi numeric;
    hi_t bigint;
    lo numeric;
    times numeric[];
    totals numeric[];
    first int := 1;
    m int;
BEGIN
    base := st[1];
    hi := st[2];
    hi_t := st[3];
    lo := st[4];
    IF st[5] = 2 THEN  -- a refund pulled the segment above hi back into the head
        DELETE FROM @schema@.@table@_log WHERE key = lkey AND upto > hi;
        IF hi = 0 THEN
            lo := 0;
        END IF;
    END IF;
    IF lo > 0 AND lo <= base THEN  -- segments whose every entry is dropped
        DELETE FROM @schema@.@table@_log WHERE key = lkey AND upto <= base;
        SELECT s.upto INTO lo FROM @schema@.@table@_log s WHERE s.key = lkey ORDER BY s.upto LIMIT 1;
        IF lo IS NULL THEN
            lo := 0;
            hi := 0;
            hi_t := 0;
        END IF;
    END IF;
    times := st[6 : 5 + n];
    totals := st[6 + n : 5 + 2 * n];
    WHILE n - first + 1 >= SEGMENT LOOP
        m := 1;  -- entries first .. first + m - 1 make the segment (cut early before an int4 overflows)
        WHILE m < SEGMENT AND times[first + m] - times[first] <= INT_MAX
              AND totals[first + m] - totals[first] <= INT_MAX LOOP
            m := m + 1;
        END LOOP;
        INSERT INTO @schema@.@table@_log (key, upto, before, first_t, last_t, offs, rels)
        VALUES (lkey, totals[first + m - 1], greatest(base, hi), times[first], times[first + m - 1],
                @schema@.rk_pack(ARRAY(SELECT (times[i] - times[first])::bigint
                                       FROM generate_series(first, first + m - 1) AS i ORDER BY i)),
                CASE WHEN totals[first + m - 1] - totals[first] = m - 1 THEN NULL  -- unit costs
                     ELSE @schema@.rk_pack(ARRAY(SELECT (totals[i] - totals[first])::bigint
                                                 FROM generate_series(first, first + m - 1) AS i ORDER BY i)) END);
        hi := totals[first + m - 1];
        hi_t := times[first + m - 1];
        IF lo = 0 THEN
            lo := hi;
        END IF;
        first := first + m;
    END LOOP;
    RETURN ARRAY[base, hi, hi_t, lo, 0] || times[first : n] || totals[first : n];
END
$$;
