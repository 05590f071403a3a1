-- ratekeeper: concurrency leases (ratekeeper/algorithms/concurrency.py), as one PL/pgSQL
-- function.
--
-- Parameters (the same for every algorithm function, called by @table@_decide):
--   st        the stored state: (acquired_1, cost_1, acquired_2, cost_2, ...) of the leases
--             in the order acquired; NULL when absent
--   ls        the lease ids, in the same order
--   now_us    now in µs
--   spec      per limit (count, period_us): a lease counts until acquired + period
--   cost      the cost (>= 0)
--   max_wait  unused
--   lease     the id of the lease to take (decide) or to release (refund; cost ignored)
--   refund    false: decide; true: release the lease (reply is {1} when it was held, else {0})
-- Returns new_state / new_leases (the leases still live, with the new one) and reply (the
-- wire format's fields: allowed, denied_index, retry_us, delay_us, remaining_1..n,
-- reset_1..n). Same steps as Concurrency.decide / Concurrency.refund; as there, leases
-- that no limit counts any more are dropped by every decide.

-- The leases are read where they are (a PL/pgSQL array argument is expanded: any element in
-- constant time) and the state to keep is one slice of the stored one plus, when admitted,
-- the new lease: no working copies, and no array rebuilt element by element (which copied
-- the whole array per lease: quadratic in the leases held).

CREATE OR REPLACE FUNCTION @schema@.rk_concurrency(
    st numeric[], ls text[], now_us bigint, spec bigint[], cost bigint, max_wait bigint, lease text,
    refund boolean, OUT new_state numeric[], OUT new_leases text[], OUT reply bigint[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    cnt int := array_length(spec, 1) / 2;
    entries int := coalesce(array_length(st, 1), 0) / 2;
    horizon bigint := now_us - spec[2];
    live int := 1;
    lim bigint;
    period bigint;
    used numeric;
    useds numeric[] := '{}';
    first int;
    need numeric;
    k int;
    r numeric;
    denied int := -1;
    retry numeric := 0;
    charged bigint := 0;
    newest numeric;
    remaining bigint[] := '{}';
    resets bigint[] := '{}';
BEGIN
    FOR i IN 2..cnt LOOP
        horizon := least(horizon, now_us - spec[2 * i]);
    END LOOP;
    -- _live: the leases from live on; the leading ones no limit counts any more are dropped
    WHILE live <= entries AND st[2 * live - 1] <= horizon LOOP
        live := live + 1;
    END LOOP;
    IF refund THEN
        IF lease IS NULL THEN
            RAISE EXCEPTION 'ratekeeper: releasing a concurrency lease needs its lease_id';
        END IF;
        k := array_position(ls, lease, live);
        reply := ARRAY[CASE WHEN k IS NULL THEN 0 ELSE 1 END]::bigint[];
        IF k IS NULL THEN
            new_state := st[2 * live - 1 : 2 * entries];
            new_leases := ls[live : entries];
        ELSE
            new_state := st[2 * live - 1 : 2 * k - 2] || st[2 * k + 1 : 2 * entries];
            new_leases := ls[live : k - 1] || ls[k + 1 : entries];
        END IF;
    ELSE
        FOR i IN 1..cnt LOOP
            lim := spec[2 * i - 1];
            period := spec[2 * i];
            used := 0;
            first := entries + 1;
            FOR j IN REVERSE entries..live LOOP
                EXIT WHEN st[2 * j - 1] <= now_us - period;
                used := used + st[2 * j];
                first := j;
            END LOOP;
            useds[i] := used;
            IF used + cost > lim THEN
                IF cost > lim THEN
                    r := -1;
                ELSE
                    need := used + cost - lim;
                    k := first;
                    LOOP
                        need := need - st[2 * k];
                        EXIT WHEN need <= 0;
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
        new_state := st[2 * live - 1 : 2 * entries];
        new_leases := ls[live : entries];
        IF denied < 0 AND cost > 0 THEN
            -- Leases stay in order of acquisition even if the clock stepped back.
            newest := CASE WHEN live <= entries THEN greatest(now_us::numeric, st[2 * entries - 1]) ELSE now_us END;
            new_state := new_state || ARRAY[newest, cost];
            new_leases := new_leases || lease;
            charged := cost;
        ELSE
            newest := CASE WHEN live <= entries THEN st[2 * entries - 1] ELSE now_us END;
        END IF;
        FOR i IN 1..cnt LOOP
            remaining[i] := greatest(0, spec[2 * i - 1] - (useds[i] + charged));  -- a lowered count: 0
            resets[i] := CASE WHEN useds[i] + charged > 0 THEN newest + spec[2 * i] - now_us ELSE 0 END;
        END LOOP;
        reply := ARRAY[CASE WHEN denied < 0 THEN 1 ELSE 0 END, denied, retry, 0]::bigint[] || remaining || resets;
    END IF;
    IF new_state = '{}' THEN
        new_state := NULL;
        new_leases := NULL;
    END IF;
END
$$;
