-- ratekeeper: leaky bucket as a queue (ratekeeper/algorithms/leaky_bucket.py), as one
-- PL/pgSQL function.
--
-- Parameters (the same for every algorithm function, called by @table@_decide):
--   st        the stored state: per limit the time the queue is empty, in units of 1/d µs
--             (numeric: now * d exceeds bigint), with the scale it was written at (n, d,
--             capacity: another scale's is carried, rk_gcra_tat); NULL when absent (GCRA's state)
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


-- How the arithmetic stays exact and cheap: times are numeric (now * d passes bigint); a
-- quotient is div() of numerics, which truncates: ceil(a / d) = div(a + d - 1, d) for
-- a > 0 and div(a, d) for a <= 0; for a >= 0, floor(a / n) = div(a, n), and
-- max(0, a // n) = greatest(0, div(a, n)) for any a. A one-limit call (the commonest)
-- takes the fewest statements: each PL/pgSQL expression is prepared again in every
-- transaction, so their number is most of the function's cost.

CREATE OR REPLACE FUNCTION @schema@.rk_leaky_bucket(
    st numeric[], ls text[], now_us bigint, spec bigint[], cost bigint, max_wait bigint, lease text,
    refund boolean, OUT new_state numeric[], OUT new_leases text[], OUT reply bigint[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    n bigint;
    d bigint;
    tau bigint;
    nd numeric;
    tat numeric;
    queued numeric;
    need numeric;
    ahead numeric;
BEGIN
    IF refund THEN
        SELECT * INTO new_state, new_leases, reply
        FROM @schema@.rk_gcra(st, ls, now_us, spec, cost, max_wait, lease, true);
        RETURN;
    END IF;
    new_leases := ls;
    IF spec[5] IS NULL THEN
        -- One limit: LeakyBucket.compile_one's steps (proven equal to decide).
        n := spec[1];
        d := spec[2];
        tau := spec[4];
        nd := now_us::numeric * d;
        IF st IS NULL OR (st[2] = n AND st[3] = d AND st[4] = spec[3]) THEN
            tat := greatest(st[1], nd);  -- greatest skips a NULL (no state: the queue is empty now)
        ELSE
            tat := @schema@.rk_gcra_tat(st, 1, now_us, n, d, spec[3]);  -- another scale's: carried
        END IF;
        queued := div(tat - nd + d - 1, d);
        IF cost > spec[3] THEN
            reply := ARRAY[0, 0, -1, 0, greatest(0, div(tau - tat + nd, n)), queued];
            new_state := st;
            RETURN;
        END IF;
        -- When the queue has room (<= 0: now), or later when it is longer than max_wait.
        need := tat + cost * n - nd - tau;  -- cost <= capacity: cost * n below 2^53
        need := greatest(div(need + CASE WHEN need > 0 THEN d - 1 ELSE 0 END, d), queued - max_wait);
        IF need > 0 THEN
            reply := ARRAY[0, 0, need, 0, greatest(0, div(tau - tat + nd, n)), queued];
            new_state := st;
        ELSE
            ahead := tat + cost * n - nd;
            reply := ARRAY[1, -1, 0, queued, div(tau - ahead, n), div(ahead + d - 1, d)];
            new_state := CASE WHEN cost = 0 THEN st ELSE ARRAY[tat + cost * n, n, d, spec[3]] END;
        END IF;
        RETURN;
    END IF;
    DECLARE
        cnt int := array_length(spec, 1) / 4;
        tats numeric[] := '{}';
        delay numeric := 0;
        retry numeric := 0;
        denied int := -1;
        infinite boolean := false;
        remaining bigint[] := '{}';
        resets bigint[] := '{}';
    BEGIN
        FOR i IN 1..cnt LOOP
            n := spec[4 * i - 3];
            d := spec[4 * i - 2];
            tau := spec[4 * i];
            nd := now_us::numeric * d;
            tat := @schema@.rk_gcra_tat(st, i, now_us, n, d, spec[4 * i - 1]);
            tats[i] := tat;
            queued := div(tat - nd + d - 1, d);
            IF queued > delay THEN
                delay := queued;
            END IF;
            IF cost > spec[4 * i - 1] THEN
                IF NOT infinite THEN
                    infinite := true;
                    denied := i - 1;
                    retry := -1;
                END IF;
                CONTINUE;
            END IF;
            -- The request needs room in the queue and, when the caller bounds its wait, a
            -- queue short enough: the later of the two is when it could be admitted.
            need := tat + cost * n - nd - tau;
            need := greatest(div(need + CASE WHEN need > 0 THEN d - 1 ELSE 0 END, d), queued - max_wait);
            IF need > 0 AND NOT infinite AND need > retry THEN
                denied := i - 1;
                retry := need;
            END IF;
        END LOOP;
        IF denied < 0 AND cost <> 0 THEN
            FOR i IN 1..cnt LOOP
                tats[i] := tats[i] + cost * spec[4 * i - 3];
            END LOOP;
        END IF;
        FOR i IN 1..cnt LOOP
            ahead := tats[i] - now_us::numeric * spec[4 * i - 2];
            remaining[i] := greatest(0, div(spec[4 * i] - ahead, spec[4 * i - 3]));
            resets[i] := div(ahead + spec[4 * i - 2] - 1, spec[4 * i - 2]);
        END LOOP;
        IF denied < 0 THEN
            reply := ARRAY[1, -1, 0, delay]::bigint[] || remaining || resets;
            new_state := st;
            IF cost <> 0 THEN
                new_state := '{}';
                FOR i IN 1..cnt LOOP
                    new_state := new_state || ARRAY[tats[i], spec[4 * i - 3], spec[4 * i - 2], spec[4 * i - 1]];
                END LOOP;
            END IF;
        ELSE
            reply := ARRAY[0, denied, retry, 0]::bigint[] || remaining || resets;
            new_state := st;
        END IF;
    END;
END
$$;
