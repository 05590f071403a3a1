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
--   refund    false: decide; true: release the lease (reply is NULL)
-- Returns new_state / new_leases (the leases still live, with the new one) and reply (the
-- wire format's fields: allowed, denied_index, retry_us, delay_us, remaining_1..n,
-- reset_1..n). Same steps as Concurrency.decide / Concurrency.refund; as there, leases
-- that no limit counts any more are dropped by every decide.

CREATE OR REPLACE FUNCTION @schema@.rk_concurrency(
    st numeric[], ls text[], now_us bigint, spec bigint[], cost bigint, max_wait bigint, lease text,
    refund boolean, OUT new_state numeric[], OUT new_leases text[], OUT reply bigint[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    cnt int := array_length(spec, 1) / 2;
    entries int := coalesce(array_length(st, 1), 0) / 2;
    longest bigint := 0;
    live int := 1;
    n int;
    times numeric[];
    costs numeric[];
    ids text[];
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
    FOR i IN 1..cnt LOOP
        longest := greatest(longest, spec[2 * i]);
    END LOOP;
    -- _live: drop the leading leases that no limit counts
    WHILE live <= entries AND st[2 * live - 1] <= now_us - longest LOOP
        live := live + 1;
    END LOOP;
    n := entries - live + 1;
    IF n > 0 THEN
        times := ARRAY(SELECT st[2 * j - 1] FROM generate_series(live, entries) AS j);
        costs := ARRAY(SELECT st[2 * j] FROM generate_series(live, entries) AS j);
        ids := ls[live : entries];
    ELSE
        times := '{}';
        costs := '{}';
        ids := '{}';
    END IF;
    IF refund THEN
        IF lease IS NULL THEN
            RAISE EXCEPTION 'ratekeeper: releasing a concurrency lease needs its lease_id';
        END IF;
        FOR j IN 1..n LOOP
            IF ids[j] = lease THEN
                times := times[1 : j - 1] || times[j + 1 : n];
                costs := costs[1 : j - 1] || costs[j + 1 : n];
                ids := ids[1 : j - 1] || ids[j + 1 : n];
                n := n - 1;
                EXIT;
            END IF;
        END LOOP;
    ELSE
        FOR i IN 1..cnt LOOP
            lim := spec[2 * i - 1];
            period := spec[2 * i];
            used := 0;
            first := n + 1;
            FOR j IN REVERSE n..1 LOOP
                EXIT WHEN times[j] <= now_us - period;
                used := used + costs[j];
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
                        need := need - costs[k];
                        EXIT WHEN need <= 0;
                        k := k + 1;
                    END LOOP;
                    r := times[k] + period - now_us;
                END IF;
                IF denied < 0 OR @schema@.rk_later(r, retry) THEN
                    denied := i - 1;
                    retry := r;
                END IF;
            END IF;
        END LOOP;
        IF denied < 0 AND cost > 0 THEN
            -- Leases stay in order of acquisition even if the clock stepped back.
            times := times || CASE WHEN n > 0 THEN greatest(now_us::numeric, times[n]) ELSE now_us::numeric END;
            costs := costs || cost::numeric;
            ids := ids || lease;
            n := n + 1;
            charged := cost;
        END IF;
        newest := CASE WHEN n > 0 THEN times[n] ELSE now_us END;
        FOR i IN 1..cnt LOOP
            remaining[i] := spec[2 * i - 1] - (useds[i] + charged);
            resets[i] := CASE WHEN useds[i] + charged > 0 THEN newest + spec[2 * i] - now_us ELSE 0 END;
        END LOOP;
        reply := ARRAY[CASE WHEN denied < 0 THEN 1 ELSE 0 END, denied, retry, 0]::bigint[] || remaining || resets;
    END IF;
    IF n = 0 THEN
        new_state := NULL;
        new_leases := NULL;
    ELSE
        new_state := '{}';
        FOR j IN 1..n LOOP
            new_state := new_state || times[j] || costs[j];
        END LOOP;
        new_leases := ids;
    END IF;
END
$$;
