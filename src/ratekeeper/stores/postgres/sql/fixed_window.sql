-- ratekeeper: fixed window (ratekeeper/algorithms/fixed_window.py), as one PL/pgSQL function.
--
-- Parameters (the same for every algorithm function, called by @table@_decide):
--   st        the stored state: (window_1, count_1, window_2, count_2, ...), NULL when absent
--   ls        lease ids (unused here)
--   now_us    now in µs
--   spec      per limit (count, period_us), flattened
--   cost      the cost (>= 0)
--   max_wait  NULL (try_acquire) or µs (unused here)
--   lease     the lease id (unused here)
--   refund    false: decide; true: give back cost (reply is NULL)
-- Returns new_state / new_leases (the state to keep) and reply (the wire format's fields:
-- allowed, denied_index, retry_us, delay_us, remaining_1..n, reset_1..n).
-- Same arithmetic as FixedWindow.decide / FixedWindow.refund, step for step.

-- A one-limit call (the commonest) takes the fewest statements: each PL/pgSQL expression is
-- prepared again in every transaction, so their number is most of the function's cost.
-- The arithmetic is bigint (stored as numeric): a window is now // period (a floor
-- division, also for a negative now), a count at most a limit (2^50) and a cost at most
-- 2^62 (the store's MAX_COST), so with |now| < 2^62 every value below stays within bigint
-- ((window + 1) * period is at most now + period, a period below 2^49).

CREATE OR REPLACE FUNCTION @schema@.rk_fixed_window(
    st numeric[], ls text[], now_us bigint, spec bigint[], cost bigint, max_wait bigint, lease text,
    refund boolean, OUT new_state numeric[], OUT new_leases text[], OUT reply bigint[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    lim bigint;
    period bigint;
    win bigint;
    cnt bigint;
    end_us bigint;
BEGIN
    new_leases := ls;
    IF spec[3] IS NULL AND NOT refund THEN
        -- One limit: FixedWindow.compile_one's steps (proven equal to decide). The stored
        -- window when it is now's or newer (the clock stepped back), else now's, empty.
        lim := spec[1];
        period := spec[2];
        win := greatest(st[1], (now_us - CASE WHEN now_us < 0 THEN period - 1 ELSE 0 END) / period);
        cnt := CASE WHEN st[1] = win THEN st[2] ELSE 0 END;
        end_us := (win + 1) * period - now_us;
        IF cnt + cost <= lim THEN
            reply := ARRAY[1, -1, 0, 0, lim - cnt - cost, CASE WHEN cnt + cost > 0 THEN end_us ELSE 0 END];
            new_state := CASE WHEN cost = 0 THEN st ELSE ARRAY[win, cnt + cost] END;
        ELSE
            reply := ARRAY[0, 0, CASE WHEN cost > lim THEN -1 ELSE end_us END, 0, greatest(0, lim - cnt),
                           CASE WHEN cnt > 0 THEN end_us ELSE 0 END];
            new_state := st;
        END IF;
        RETURN;
    END IF;
    DECLARE
        n int := array_length(spec, 1) / 2;
        counts numeric[] := '{}';
        ends numeric[] := '{}';
        wins numeric[] := '{}';
        denied int := -1;
        retry numeric := 0;
        r numeric;
        charged bigint;
        remaining bigint[] := '{}';
        resets bigint[] := '{}';
    BEGIN
        IF refund THEN
            IF st IS NULL THEN
                new_state := NULL;
                RETURN;
            END IF;
            new_state := st;
            FOR i IN 1..n LOOP
                period := spec[2 * i];
                IF st[2 * i - 1] >= (now_us - CASE WHEN now_us < 0 THEN period - 1 ELSE 0 END) / period THEN
                    new_state[2 * i] := greatest(0, st[2 * i] - cost);
                END IF;
            END LOOP;
            RETURN;
        END IF;
        FOR i IN 1..n LOOP
            lim := spec[2 * i - 1];
            period := spec[2 * i];
            -- now's window, or the stored one if the clock stepped back (the newer window)
            win := greatest(st[2 * i - 1], (now_us - CASE WHEN now_us < 0 THEN period - 1 ELSE 0 END) / period);
            cnt := CASE WHEN st[2 * i - 1] = win THEN st[2 * i] ELSE 0 END;
            end_us := (win + 1) * period - now_us;
            IF cnt + cost > lim THEN
                r := CASE WHEN cost > lim THEN -1 ELSE end_us END;
                IF denied < 0 OR @schema@.rk_later(r, retry) THEN
                    denied := i - 1;
                    retry := r;
                END IF;
            END IF;
            counts[i] := cnt;
            ends[i] := end_us;
            wins[i] := win;
        END LOOP;
        charged := CASE WHEN denied < 0 THEN cost ELSE 0 END;
        FOR i IN 1..n LOOP
            remaining[i] := greatest(0, spec[2 * i - 1] - counts[i] - charged);  -- a lowered limit: 0
            resets[i] := CASE WHEN counts[i] + charged > 0 THEN ends[i] ELSE 0 END;
        END LOOP;
        reply := ARRAY[CASE WHEN denied < 0 THEN 1 ELSE 0 END, denied, retry, 0]::bigint[] || remaining || resets;
        IF charged <> 0 THEN
            new_state := '{}';
            FOR i IN 1..n LOOP
                new_state := new_state || wins[i] || (counts[i] + charged);
            END LOOP;
        ELSE
            new_state := st;
        END IF;
    END;
END
$$;

-- A charge without a check (FixedWindow.charge_one per limit): the window's count may pass
-- the limit, never past twice it. The reply as for an admission, each remaining below 0
-- while in debt.
CREATE OR REPLACE FUNCTION @schema@.rk_fixed_window_charge(
    st numeric[], now_us bigint, spec bigint[], cost bigint, OUT new_state numeric[], OUT reply bigint[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    cnt int := array_length(spec, 1) / 2;
    lim bigint;
    period bigint;
    win numeric;
    count_ numeric;
    remaining bigint[] := '{}';
    resets bigint[] := '{}';
BEGIN
    new_state := CASE WHEN cost = 0 THEN st ELSE '{}' END;
    FOR i IN 1..cnt LOOP
        lim := spec[2 * i - 1];
        period := spec[2 * i];
        win := @schema@.rk_fdiv(now_us, period);
        count_ := 0;
        IF st IS NOT NULL AND st[2 * i - 1] >= win THEN
            win := st[2 * i - 1];
            count_ := st[2 * i];
        END IF;
        count_ := count_ + @schema@.rk_debt_charge(cost, lim - count_, lim);
        remaining[i] := lim - count_;
        resets[i] := CASE WHEN count_ > 0 THEN (win + 1) * period - now_us ELSE 0 END;
        IF cost <> 0 THEN
            new_state := new_state || ARRAY[win, count_];
        END IF;
    END LOOP;
    reply := ARRAY[1, -1, 0, 0]::bigint[] || remaining || resets;
END
$$;
