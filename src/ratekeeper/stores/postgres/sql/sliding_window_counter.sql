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
-- The estimate is prev * ((period - elapsed) / period) + curr in double precision, with
-- the same operations in the same order as the Python reference (IEEE doubles both), so
-- the decisions agree bit for bit.

-- _estimate
CREATE OR REPLACE FUNCTION @schema@.rk_swc_estimate(prev numeric, curr numeric, elapsed numeric, period numeric)
RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT prev::float8 * ((period - elapsed)::float8 / period::float8) + curr::float8 $$;

-- _first_admitting: the first µs t >= start where estimate + cost <= limit (one exists).
CREATE OR REPLACE FUNCTION @schema@.rk_swc_first(
    prev numeric, curr numeric, start numeric, period bigint, cost bigint, lim bigint)
RETURNS numeric LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    q float8;
    elapsed numeric;
BEGIN
    IF prev = 0 THEN
        RETURN start;
    END IF;
    -- Python's int / int is the correctly rounded quotient: numeric with 40 decimals, then
    -- rounded once to a double, gives that same double.
    q := (((lim - curr - cost) * period)::numeric(1000, 40) / prev)::float8;
    elapsed := greatest(0, ceil(period::float8 - q)::numeric);
    WHILE elapsed < period AND @schema@.rk_swc_estimate(prev, curr, elapsed, period) + cost::float8 > lim::float8 LOOP
        elapsed := elapsed + 1;
    END LOOP;
    RETURN start + elapsed;
END
$$;

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
    estimate float8;
    r numeric;
    denied int := -1;
    retry numeric := 0;
    charged bigint;
    current_ numeric;
    wins numeric[] := '{}';
    prevs numeric[] := '{}';
    currs numeric[] := '{}';
    estimates float8[] := '{}';
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
        estimate := @schema@.rk_swc_estimate(prev, curr, now_us - start, period);
        IF estimate + cost::float8 > lim::float8 THEN
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
        estimates[i] := estimate;
    END LOOP;
    IF refund THEN
        new_state := CASE WHEN st IS NULL THEN NULL ELSE built END;
        RETURN;
    END IF;
    charged := CASE WHEN denied < 0 THEN cost ELSE 0 END;
    FOR i IN 1..cnt LOOP
        period := spec[2 * i];
        remaining[i] := greatest(0, floor(spec[2 * i - 1]::float8 - (estimates[i] + charged::float8)));
        current_ := currs[i] + charged;
        -- _whole_after: the current count weighs until the end of the next window
        resets[i] := CASE WHEN current_ > 0 THEN (wins[i] + 2) * period - now_us
                          WHEN prevs[i] > 0 THEN (wins[i] + 1) * period - now_us
                          ELSE 0 END;
        built := built || wins[i] || prevs[i] || current_;
    END LOOP;
    reply := ARRAY[CASE WHEN denied < 0 THEN 1 ELSE 0 END, denied, retry, 0]::bigint[] || remaining || resets;
    new_state := CASE WHEN charged <> 0 THEN built ELSE st END;
END
$$;
