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

-- How the arithmetic stays exact and cheap: products of a count and a period are numeric
-- (they pass bigint); a quotient is div() of numerics, which truncates: floor for a >= 0,
-- and ceil(a / b) = div(a + b - 1, b) for a > 0 (every quotient below is of such values).
-- The helpers are LANGUAGE sql, inlined into the expressions that call them. A one-limit
-- call (the commonest) takes the fewest statements: each PL/pgSQL expression is prepared
-- again in every transaction, so their number is most of the function's cost.

-- _counted (the previous count whole when the clock stepped back before the window); the
-- window never starts more than a period before now, so period - elapsed > 0.
CREATE OR REPLACE FUNCTION @schema@.rk_swc_counted(prev numeric, curr numeric, elapsed numeric, period numeric)
RETURNS numeric LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE WHEN elapsed <= 0 THEN curr + prev
               ELSE curr + div(prev * (period - elapsed), period) END $$;

-- _first_admitting: the first µs t >= start where count + cost <= limit (one exists, as
-- curr + cost <= limit): with x = limit - curr - cost, start + period + 1 -
-- ceil((x + 1) * period / prev), or start when x >= prev.
CREATE OR REPLACE FUNCTION @schema@.rk_swc_first(
    prev numeric, curr numeric, start numeric, period bigint, cost bigint, lim bigint)
RETURNS numeric LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE WHEN lim - curr - cost >= prev THEN start
               ELSE start + period + 1 - div((lim - curr - cost + 1) * period + prev - 1, prev) END $$;

-- _whole_after: µs until nothing is counted (a count c of the window before counts 0 from
-- period + 1 - ceil(period / c) into the window on).
CREATE OR REPLACE FUNCTION @schema@.rk_swc_whole_after(
    win numeric, period numeric, now_us numeric, prev numeric, curr numeric)
RETURNS numeric LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE WHEN curr > 0 THEN (win + 2) * period + 1 - div(period + curr - 1, curr) - now_us
               WHEN prev > 0 THEN greatest(0, (win + 1) * period + 1 - div(period + prev - 1, prev) - now_us)
               ELSE 0 END $$;

CREATE OR REPLACE FUNCTION @schema@.rk_sliding_window_counter(
    st numeric[], ls text[], now_us bigint, spec bigint[], cost bigint, max_wait bigint, lease text,
    refund boolean, OUT new_state numeric[], OUT new_leases text[], OUT reply bigint[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    lim bigint;
    period bigint;
    win numeric;
    prev numeric;
    curr numeric;
    start numeric;
    counted numeric;
BEGIN
    new_leases := ls;
    IF spec[3] IS NULL AND NOT refund THEN
        -- One limit: SlidingWindowCounter.compile_one's steps (proven equal to decide).
        lim := spec[1];
        period := spec[2];
        -- _window, _counts: now's window, or the stored one if the clock stepped back
        win := greatest(st[1], (now_us - CASE WHEN now_us < 0 THEN period - 1 ELSE 0 END) / period);
        prev := CASE WHEN st[1] = win THEN st[2] WHEN st[1] = win - 1 THEN st[3] ELSE 0 END;
        curr := CASE WHEN st[1] = win THEN st[3] ELSE 0 END;
        start := win * period;
        counted := @schema@.rk_swc_counted(prev, curr, now_us - start, period);
        IF counted + cost > lim THEN
            reply := ARRAY[0, 0,
                           CASE WHEN cost > lim THEN -1  -- _retry
                                WHEN curr + cost <= lim THEN @schema@.rk_swc_first(prev, curr, start, period, cost, lim) - now_us
                                ELSE @schema@.rk_swc_first(curr, 0, start + period, period, cost, lim) - now_us END,
                           0, greatest(0, lim - counted), @schema@.rk_swc_whole_after(win, period, now_us, prev, curr)];
            new_state := st;
        ELSE
            curr := curr + cost;
            reply := ARRAY[1, -1, 0, 0, greatest(0, lim - counted - cost),
                           @schema@.rk_swc_whole_after(win, period, now_us, prev, curr)];
            new_state := CASE WHEN cost = 0 THEN st ELSE ARRAY[win, prev, curr] END;
        END IF;
        RETURN;
    END IF;
    DECLARE
        cnt int := array_length(spec, 1) / 2;
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
        FOR i IN 1..cnt LOOP
            lim := spec[2 * i - 1];
            period := spec[2 * i];
            -- _window: now's window, or the stored one if the clock stepped back
            win := greatest(st[3 * i - 2], (now_us - CASE WHEN now_us < 0 THEN period - 1 ELSE 0 END) / period);
            -- _counts
            prev := CASE WHEN st[3 * i - 2] = win THEN st[3 * i - 1] WHEN st[3 * i - 2] = win - 1 THEN st[3 * i] ELSE 0 END;
            curr := CASE WHEN st[3 * i - 2] = win THEN st[3 * i] ELSE 0 END;
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
    END;
END
$$;

-- A charge without a check (SlidingWindowCounter.charge_one per limit): the current window's
-- count may bring what the windows count past the limit, never past twice it. The reply
-- as for an admission, each remaining below 0 while in debt.
CREATE OR REPLACE FUNCTION @schema@.rk_sliding_window_counter_charge(
    st numeric[], now_us bigint, spec bigint[], cost bigint, OUT new_state numeric[], OUT reply bigint[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    cnt int := array_length(spec, 1) / 2;
    lim bigint;
    period bigint;
    win numeric;
    prev numeric;
    curr numeric;
    counted numeric;
    taken numeric;
    remaining bigint[] := '{}';
    resets bigint[] := '{}';
BEGIN
    new_state := CASE WHEN cost = 0 THEN st ELSE '{}' END;
    FOR i IN 1..cnt LOOP
        lim := spec[2 * i - 1];
        period := spec[2 * i];
        win := greatest(st[3 * i - 2], @schema@.rk_fdiv(now_us, period));
        prev := CASE WHEN st[3 * i - 2] = win THEN st[3 * i - 1] WHEN st[3 * i - 2] = win - 1 THEN st[3 * i] ELSE 0 END;
        curr := CASE WHEN st[3 * i - 2] = win THEN st[3 * i] ELSE 0 END;
        counted := @schema@.rk_swc_counted(prev, curr, now_us - win * period, period);
        taken := @schema@.rk_debt_charge(cost, lim - counted, lim);
        curr := curr + taken;
        remaining[i] := lim - counted - taken;
        resets[i] := @schema@.rk_swc_whole_after(win, period, now_us, prev, curr);
        IF cost <> 0 THEN
            new_state := new_state || ARRAY[win, prev, curr];
        END IF;
    END LOOP;
    reply := ARRAY[1, -1, 0, 0]::bigint[] || remaining || resets;
END
$$;
