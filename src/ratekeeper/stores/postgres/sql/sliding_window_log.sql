-- ratekeeper: sliding window log (ratekeeper/algorithms/sliding_window_log.py), as one
-- PL/pgSQL function.
--
-- Parameters (the same for every algorithm function, called by @table@_decide):
--   st        the stored state: the admitted requests (time_1, cost_1, time_2, cost_2, ...)
--             oldest first, times ascending; one log serves every limit; NULL when absent
--   ls        lease ids (unused here)
--   now_us    now in µs
--   spec      per limit (count, period_us), flattened
--   cost      the cost (>= 0)
--   max_wait  unused
--   lease     unused
--   refund    false: decide; true: take cost back from the newest entries (reply is NULL)
-- Returns new_state / new_leases (the state to keep) and reply (the wire format's fields:
-- allowed, denied_index, retry_us, delay_us, remaining_1..n, reset_1..n).
-- Same steps as SlidingWindowLog.decide / refund: an entry admitted at t counts while
-- t > now - period; entries no limit counts any more are dropped when the log is written.

CREATE OR REPLACE FUNCTION @schema@.rk_sliding_window_log(
    st numeric[], ls text[], now_us bigint, spec bigint[], cost bigint, max_wait bigint, lease text,
    refund boolean, OUT new_state numeric[], OUT new_leases text[], OUT reply bigint[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    cnt int := array_length(spec, 1) / 2;
    entries int := coalesce(array_length(st, 1), 0) / 2;
    longest bigint := 0;
    live int := 1;
    total numeric := 0;
    lim bigint;
    period bigint;
    first int;
    used numeric;
    useds numeric[] := '{}';
    excess numeric;
    acc numeric;
    k int;
    r numeric;
    denied int := -1;
    retry numeric := 0;
    newest numeric;
    charged bigint;
    target numeric;
    remaining bigint[] := '{}';
    resets bigint[] := '{}';
BEGIN
    new_leases := ls;
    FOR i IN 1..cnt LOOP
        longest := greatest(longest, spec[2 * i]);
    END LOOP;
    WHILE live <= entries AND st[2 * live - 1] <= now_us - longest LOOP
        live := live + 1;
    END LOOP;
    FOR j IN live..entries LOOP
        total := total + st[2 * j];
    END LOOP;
    IF refund THEN
        target := total - cost;
        IF live > entries OR target <= 0 THEN
            new_state := NULL;
            RETURN;
        END IF;
        acc := 0;
        k := live;
        WHILE acc + st[2 * k] < target LOOP
            acc := acc + st[2 * k];
            k := k + 1;
        END LOOP;
        new_state := st[2 * live - 1 : 2 * k - 2] || st[2 * k - 1] || (target - acc);
        RETURN;
    END IF;
    FOR i IN 1..cnt LOOP
        lim := spec[2 * i - 1];
        period := spec[2 * i];
        first := live;
        used := total;
        WHILE first <= entries AND st[2 * first - 1] <= now_us - period LOOP
            used := used - st[2 * first];
            first := first + 1;
        END LOOP;
        useds[i] := used;
        IF used + cost > lim THEN
            IF cost > lim THEN
                r := -1;
            ELSE
                -- The entry whose expiry frees enough: the cost from the window's oldest reaches the excess.
                excess := used + cost - lim;
                acc := 0;
                k := first;
                LOOP
                    acc := acc + st[2 * k];
                    EXIT WHEN acc >= excess;
                    k := k + 1;
                END LOOP;
                r := st[2 * k - 1] + period - now_us;
            END IF;
            IF denied < 0 OR @schema@.rk_later(r, retry) THEN
                denied := i - 1;
                retry := r;
            END IF;
        END IF;
    END LOOP;
    newest := CASE WHEN entries >= live THEN st[2 * entries - 1] ELSE now_us END;
    charged := CASE WHEN denied < 0 THEN cost ELSE 0 END;
    IF charged <> 0 THEN
        -- A clock that stepped back must not break the order: the entry then counts a little longer.
        IF now_us > newest OR entries < live THEN
            newest := now_us;
        END IF;
        new_state := CASE WHEN entries >= live THEN st[2 * live - 1 : 2 * entries] ELSE '{}'::numeric[] END
            || newest || charged::numeric;
    ELSE
        new_state := st;
    END IF;
    FOR i IN 1..cnt LOOP
        remaining[i] := spec[2 * i - 1] - (useds[i] + charged);
        resets[i] := CASE WHEN useds[i] + charged > 0 THEN newest + spec[2 * i] - now_us ELSE 0 END;
    END LOOP;
    reply := ARRAY[CASE WHEN denied < 0 THEN 1 ELSE 0 END, denied, retry, 0]::bigint[] || remaining || resets;
END
$$;
