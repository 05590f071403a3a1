-- ratekeeper: leaky bucket as a queue (ratekeeper/algorithms/leaky_bucket.py), as one
-- PL/pgSQL function.
--
-- Parameters (the same for every algorithm function, called by @table@_decide):
--   st        the stored state: per limit the time the queue is empty, in units of 1/d µs
--             (numeric: now * d exceeds bigint), NULL when absent (GCRA's state)
--   ls        lease ids (unused here)
--   now_us    now in µs
--   spec      per limit (n, d, capacity, tau) with n/d µs per unit of cost, tau = capacity * n
--   cost      the cost (>= 0)
--   max_wait  NULL (try_acquire: any delay that fits in the queue) or µs: the longest delay
--             the caller accepts
--   lease     the lease id (unused here)
--   refund    false: decide; true: give back cost (reply is NULL), as GCRA
-- Returns new_state / new_leases (the state to keep) and reply (the wire format's fields:
-- allowed, denied_index, retry_us, delay_us, remaining_1..n, reset_1..n).
-- Same arithmetic as LeakyBucket.decide (and Gcra.refund), step for step (exact integers).

CREATE OR REPLACE FUNCTION @schema@.rk_leaky_bucket(
    st numeric[], ls text[], now_us bigint, spec bigint[], cost bigint, max_wait bigint, lease text,
    refund boolean, OUT new_state numeric[], OUT new_leases text[], OUT reply bigint[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    cnt int := array_length(spec, 1) / 4;
    n bigint;
    d bigint;
    cap bigint;
    tau bigint;
    nd numeric;
    tat numeric;
    tats numeric[] := '{}';
    queued numeric;
    need numeric;
    delay numeric := 0;
    retry numeric := 0;
    denied int := -1;
    infinite boolean := false;
    ahead numeric;
    remaining bigint[] := '{}';
    resets bigint[] := '{}';
BEGIN
    IF refund THEN
        SELECT * INTO new_state, new_leases, reply
        FROM @schema@.rk_gcra(st, ls, now_us, spec, cost, max_wait, lease, true);
        RETURN;
    END IF;
    new_leases := ls;
    FOR i IN 1..cnt LOOP
        n := spec[4 * i - 3];
        d := spec[4 * i - 2];
        cap := spec[4 * i - 1];
        tau := spec[4 * i];
        nd := now_us::numeric * d;
        tat := CASE WHEN st IS NULL THEN nd ELSE st[i] END;
        IF tat < nd THEN
            tat := nd;
        END IF;
        tats[i] := tat;
        queued := @schema@.rk_cdiv(tat - nd, d);
        IF queued > delay THEN
            delay := queued;
        END IF;
        IF cost > cap THEN
            IF NOT infinite THEN
                infinite := true;
                denied := i - 1;
                retry := -1;
            END IF;
            CONTINUE;
        END IF;
        -- The request needs room in the queue and, when the caller bounds its wait, a
        -- queue short enough: the later of the two is when it could be admitted.
        need := @schema@.rk_cdiv(tat + cost::numeric * n - nd - tau, d);
        IF max_wait IS NOT NULL AND queued - max_wait > need THEN
            need := queued - max_wait;
        END IF;
        IF need > 0 AND NOT infinite AND need > retry THEN
            denied := i - 1;
            retry := need;
        END IF;
    END LOOP;
    IF denied < 0 AND cost <> 0 THEN
        FOR i IN 1..cnt LOOP
            tats[i] := tats[i] + cost::numeric * spec[4 * i - 3];
        END LOOP;
    END IF;
    FOR i IN 1..cnt LOOP
        ahead := tats[i] - now_us::numeric * spec[4 * i - 2];
        remaining[i] := greatest(0, @schema@.rk_fdiv(spec[4 * i] - ahead, spec[4 * i - 3]));
        resets[i] := @schema@.rk_cdiv(ahead, spec[4 * i - 2]);
    END LOOP;
    IF denied < 0 THEN
        reply := ARRAY[1, -1, 0, delay]::bigint[] || remaining || resets;
        new_state := CASE WHEN cost <> 0 THEN tats ELSE st END;
    ELSE
        reply := ARRAY[0, denied, retry, 0]::bigint[] || remaining || resets;
        new_state := st;
    END IF;
END
$$;
