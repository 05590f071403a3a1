-- ratekeeper: sliding window counter (ratekeeper/algorithms/sliding_window_counter.py), as
-- PL/pgSQL functions.
--
-- Parameters (the same for every algorithm function, called by @table@_decide):
--   st        the stored state: (window_1, previous_1, current_1, ...), one triple per
--             limit, window = now // period; NULL when absent
--   ls        lease ids (unused here)
--   now_us    now in µs
--   spec      per limit (count, period_us), flattened
--   cost      the cost (>= 0)
--   max_wait  unused
--   lease     unused
--   refund    false: decide; true: give back cost to the current window (reply is NULL)
-- Returns new_state / new_leases (the state to keep) and reply (the wire format's fields:
-- allowed, denied_index, retry_us, delay_us, remaining_1..n, reset_1..n).
-- The count at now is curr + floor(prev * (period - elapsed) / period), rounded down as the
-- system-design chapter does (7 per minute, 5 before and 3 now, 30 % in: 3 + floor(3.5) = 6,
-- so one more is admitted); a request is admitted when count + cost <= limit. Exact
-- integer arithmetic in numeric, as the Python reference.

-- an earlier version's float estimate, no longer used
DROP FUNCTION IF EXISTS @schema@.rk_swc_estimate(numeric, numeric, numeric, numeric);

-- _counted (the previous count whole when the clock stepped back before the window)
CREATE OR REPLACE FUNCTION @schema@.rk_swc_counted(prev numeric, curr numeric, elapsed numeric, period numeric)
RETURNS numeric LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE WHEN elapsed <= 0 THEN curr + prev
               ELSE curr + @schema@.rk_fdiv(prev * (period - elapsed), period) END $$;

-- _first_admitting: the first µs t >= start where count + cost <= limit (one exists, as
-- curr + cost <= limit): with x = limit - curr - cost, start + period + 1 -
-- ceil((x + 1) * period / prev), or start when x >= prev.
CREATE OR REPLACE FUNCTION @schema@.rk_swc_first(
    prev numeric, curr numeric, start numeric, period bigint, cost bigint, lim bigint)
RETURNS numeric LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE WHEN lim - curr - cost >= prev THEN start
               ELSE start + period + 1 - @schema@.rk_cdiv((lim - curr - cost + 1) * period, prev) END $$;

-- _whole_after: µs until nothing is counted (a count c of the window before counts 0 from
-- period + 1 - ceil(period / c) into the window on).
CREATE OR REPLACE FUNCTION @schema@.rk_swc_whole_after(
    win numeric, period numeric, now_us numeric, prev numeric, curr numeric)
RETURNS numeric LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE WHEN curr > 0 THEN (win + 2) * period + 1 - @schema@.rk_cdiv(period, curr) - now_us
               WHEN prev > 0 THEN greatest(0, (win + 1) * period + 1 - @schema@.rk_cdiv(period, prev) - now_us)
               ELSE 0 END $$;

CREATE OR REPLACE FUNCTION @schema@.rk_sliding_window_counter(
    st numeric[], ls text[], now_us bigint, spec bigint[], cost bigint, max_wait bigint, lease text,
    refund boolean, OUT new_state numeric[], OUT new_leases text[], OUT reply bigint[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    cnt int := array_length(spec, 1) / 2;
    lim bigint;
    period bigint;
    win numeric;
    prev numeric;
    curr numeric;
    start numeric;
    counted numeric;
    r numeric;
    denied int := -1;
    retry numeric := 0;
    charged bigint;
    current_ numeric;
    wins numeric[] := '{}';
    prevs numeric[] := '{}';
    currs numeric[] := '{}';
    counts numeric[] := '{}';
    remaining bigint[] := '{}';
    resets bigint[] := '{}';
    built numeric[] := '{}';
BEGIN
    new_leases := ls;
    FOR i IN 1..cnt LOOP
        lim := spec[2 * i - 1];
        period := spec[2 * i];
        -- _window: now's window, or the stored one if the clock stepped back
        win := @schema@.rk_fdiv(now_us, period);
        IF st IS NOT NULL AND st[3 * i - 2] > win THEN
            win := st[3 * i - 2];
        END IF;
        -- _counts
        prev := 0;
        curr := 0;
        IF st IS NOT NULL THEN
            IF st[3 * i - 2] = win THEN
                prev := st[3 * i - 1];
                curr := st[3 * i];
            ELSIF st[3 * i - 2] = win - 1 THEN
                prev := st[3 * i];
            END IF;
        END IF;
        IF refund THEN
            built := built || win || prev || greatest(0, curr - cost);
            CONTINUE;
        END IF;
        start := win * period;
        counted := @schema@.rk_swc_counted(prev, curr, now_us - start, period);
        IF counted + cost > lim THEN
            -- _retry
            IF cost > lim THEN
                r := -1;
            ELSIF curr + cost <= lim THEN
                r := @schema@.rk_swc_first(prev, curr, start, period, cost, lim) - now_us;
            ELSE
                r := @schema@.rk_swc_first(curr, 0, start + period, period, cost, lim) - now_us;
            END IF;
            IF denied < 0 OR @schema@.rk_later(r, retry) THEN
                denied := i - 1;
                retry := r;
            END IF;
        END IF;
        wins[i] := win;
        prevs[i] := prev;
        currs[i] := curr;
        counts[i] := counted;
    END LOOP;
    IF refund THEN
        new_state := CASE WHEN st IS NULL THEN NULL ELSE built END;
        RETURN;
    END IF;
    charged := CASE WHEN denied < 0 THEN cost ELSE 0 END;
    FOR i IN 1..cnt LOOP
        period := spec[2 * i];
        remaining[i] := greatest(0, spec[2 * i - 1] - (counts[i] + charged));
        current_ := currs[i] + charged;
        resets[i] := @schema@.rk_swc_whole_after(wins[i], period, now_us, prevs[i], current_);
        built := built || wins[i] || prevs[i] || current_;
    END LOOP;
    reply := ARRAY[CASE WHEN denied < 0 THEN 1 ELSE 0 END, denied, retry, 0]::bigint[] || remaining || resets;
    new_state := CASE WHEN charged <> 0 THEN built ELSE st END;
END
$$;
