-- ratekeeper: GCRA (ratekeeper/algorithms/gcra.py), as one PL/pgSQL function.
--
-- Parameters (the same for every algorithm function, called by @table@_decide):
--   st        the stored state: per limit (tat, n, d, capacity), the theoretical arrival
--             time in units of 1/d µs (numeric: now * d exceeds bigint) and the scale it
--             was written at; NULL when absent
--   ls        lease ids (unused here)
--   now_us    now in µs
--   spec      per limit (n, d, capacity, tau) with n/d µs per unit of cost, tau = capacity * n
--   cost      the cost (>= 0)
--   max_wait  NULL (try_acquire) or µs: a reservation may wait up to that long
--   lease     the lease id (unused here)
--   refund    false: decide; true: give back cost (reply is NULL)
-- Returns new_state / new_leases (the state to keep) and reply (the wire format's fields:
-- allowed, denied_index, retry_us, delay_us, remaining_1..n, reset_1..n).
-- Same arithmetic as Gcra.decide / Gcra.refund, step for step (exact integers).

-- How the arithmetic stays exact and cheap: times are numeric (now * d passes bigint); a
-- quotient is div() of numerics, which truncates: ceil(a / d) = div(a + d - 1, d) for
-- a >= 0, floor(a / n) = div(a, n) for a >= 0, and max(0, a // n) = greatest(0, div(a, n))
-- for any a. cost * n is a bigint once cost <= capacity (below 2^53). A one-limit call
-- takes the fewest statements: each PL/pgSQL expression is prepared again in every
-- transaction, so their number is most of the function's cost.

-- The theoretical arrival time of limit i of state st, never before now, in the units of
-- the spec (n, d, cap): as stored when it was written at this scale, else what it still
-- counts carried over, in whole units of cost rounded up, at most cap (gcra.gcra_tat,
-- carry.carried). Shared with the leaky bucket.
CREATE OR REPLACE FUNCTION @schema@.rk_gcra_tat(st numeric[], i int, now_us bigint, n bigint, d bigint, cap bigint)
RETURNS numeric LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE
    WHEN st[4 * i - 3] IS NULL THEN now_us::numeric * d
    WHEN st[4 * i - 2] = n AND st[4 * i - 1] = d AND st[4 * i] = cap THEN greatest(st[4 * i - 3], now_us::numeric * d)
    WHEN st[4 * i - 3] - now_us::numeric * st[4 * i - 1] <= 0 THEN now_us::numeric * d
    ELSE now_us::numeric * d
         + least(@schema@.rk_cdiv(st[4 * i - 3] - now_us::numeric * st[4 * i - 1], st[4 * i - 2]), cap) * n
END $$;

CREATE OR REPLACE FUNCTION @schema@.rk_gcra(
    st numeric[], ls text[], now_us bigint, spec bigint[], cost bigint, max_wait bigint, lease text,
    refund boolean, OUT new_state numeric[], OUT new_leases text[], OUT reply bigint[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    n bigint;
    d bigint;
    tau bigint;
    nd numeric;
    tat numeric;
    over numeric;
    wait numeric;
BEGIN
    new_leases := ls;
    IF spec[5] IS NULL AND NOT refund THEN
        -- One limit: Gcra.compile_one's steps (proven equal to decide).
        n := spec[1];
        d := spec[2];
        tau := spec[4];
        nd := now_us::numeric * d;
        IF st IS NULL OR (st[2] = n AND st[3] = d AND st[4] = spec[3]) THEN
            tat := greatest(st[1], nd);  -- greatest skips a NULL (no state: tat = now)
        ELSE
            tat := @schema@.rk_gcra_tat(st, 1, now_us, n, d, spec[3]);
        END IF;
        IF cost > spec[3] THEN
            reply := ARRAY[0, 0, -1, 0, greatest(0, div(tau - tat + nd, n)), div(tat - nd + d - 1, d)];
            new_state := st;
            RETURN;
        END IF;
        over := tat + cost * n - nd - tau;
        IF over <= 0 THEN  -- admitted now: 0 <= tat + cost * n - nd = over + tau <= tau
            reply := ARRAY[1, -1, 0, 0, div(-over, n), div(over + tau + d - 1, d)];
            new_state := CASE WHEN cost <> 0 THEN ARRAY[tat + cost * n, n, d, spec[3]] ELSE st END;
            RETURN;
        END IF;
        wait := div(over + d - 1, d);
        IF wait <= max_wait THEN  -- a reservation (max_wait NULL: none)
            reply := ARRAY[1, -1, 0, wait, 0, div(over + tau + d - 1, d)];
            new_state := ARRAY[tat + cost * n, n, d, spec[3]];
            RETURN;
        END IF;
        reply := ARRAY[0, 0, wait, 0, greatest(0, div(tau - tat + nd, n)), div(tat - nd + d - 1, d)];
        new_state := st;
        RETURN;
    END IF;
    DECLARE
        cnt int := array_length(spec, 1) / 4;
        tats numeric[];
        w numeric;
        denied int := -1;
        infinite boolean := false;
        allowed boolean;
        ahead numeric;
        remaining bigint[];
        resets bigint[];
    BEGIN
        IF refund THEN
            IF st IS NULL THEN
                new_state := NULL;
                RETURN;
            END IF;
            new_state := '{}';
            FOR i IN 1..cnt LOOP
                n := spec[4 * i - 3];
                d := spec[4 * i - 2];
                new_state := new_state || ARRAY[greatest(now_us::numeric * d,
                    @schema@.rk_gcra_tat(st, i, now_us, n, d, spec[4 * i - 1]) - cost::numeric * n), n, d, spec[4 * i - 1]];
            END LOOP;
            RETURN;
        END IF;
        wait := 0;
        FOR i IN 1..cnt LOOP
            n := spec[4 * i - 3];
            d := spec[4 * i - 2];
            tau := spec[4 * i];
            nd := now_us::numeric * d;
            tat := @schema@.rk_gcra_tat(st, i, now_us, n, d, spec[4 * i - 1]);
            tats[i] := tat;
            IF cost > spec[4 * i - 1] THEN
                IF NOT infinite THEN
                    infinite := true;
                    denied := i - 1;
                END IF;
                CONTINUE;
            END IF;
            over := tat + cost * n - nd - tau;
            IF over > 0 THEN
                w := div(over + d - 1, d);
                IF w > wait THEN
                    wait := w;
                    IF NOT infinite THEN
                        denied := i - 1;
                    END IF;
                END IF;
            END IF;
        END LOOP;
        allowed := NOT infinite AND wait <= coalesce(max_wait, 0);
        IF allowed AND cost <> 0 THEN
            FOR i IN 1..cnt LOOP
                tats[i] := tats[i] + cost * spec[4 * i - 3];
            END LOOP;
        END IF;
        FOR i IN 1..cnt LOOP
            ahead := tats[i] - now_us::numeric * spec[4 * i - 2];
            remaining[i] := greatest(0, div(spec[4 * i] - ahead, spec[4 * i - 3]));
            resets[i] := div(ahead + spec[4 * i - 2] - 1, spec[4 * i - 2]);
        END LOOP;
        IF allowed THEN
            reply := ARRAY[1, -1, 0, wait]::bigint[] || remaining || resets;
            new_state := st;
            IF cost <> 0 THEN
                new_state := '{}';
                FOR i IN 1..cnt LOOP
                    new_state := new_state || ARRAY[tats[i], spec[4 * i - 3], spec[4 * i - 2], spec[4 * i - 1]];
                END LOOP;
            END IF;
        ELSE
            reply := ARRAY[0, denied, CASE WHEN infinite THEN -1 ELSE wait END, 0]::bigint[] || remaining || resets;
            new_state := st;
        END IF;
    END;
END
$$;

-- @schema@.@table@_gcra_one(k text, request text) RETURNS text: the fast path of the
-- commonest call, one GCRA op ("d" or "p") of a one-limit rule on one key: the same
-- decision and stored row as @table@_decide (which every other call takes), without its
-- parsing, slots and dispatch, and with the least arithmetic: it answers
-- "<allowed 1/0>,<ahead>" (ahead = the theoretical arrival time before the op minus now,
-- in 1/d µs: tat - now * d), from which the client computes the reply's other fields
-- with the reference's own integer steps (planner.gcra_reply).
--   request  given now ("" = clock_timestamp()), mode, n, d, capacity, tau, cost,
--            max_wait ("" = none), joined by commas
-- How it stays exact: a "d" op locks its row (SELECT ... FOR UPDATE: the latest version)
-- and reads the clock after the lock is held, then writes the admitted state back by ctid,
-- all in this one statement. A missing row is created by the INSERT of the admitted state
-- (ON CONFLICT DO NOTHING); one that lost the race to create it decides again on the
-- winner's row, with the clock read again. Nothing is written when the op is refused or
-- costs nothing, and a "p" op locks nothing. One new row in 8 also sweeps idle rows
-- (@table@_decide: one call in 64).
CREATE OR REPLACE FUNCTION @schema@.@table@_gcra_one(k text, request text) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    a text[] := string_to_array(request, ',');
    given bigint := nullif(a[1], '');
    commit_ boolean := a[2] = 'd';
    n bigint := a[3];
    d bigint := a[4];
    tau bigint := a[6];
    cost bigint := a[7];
    st numeric[];
    rid tid;
    old_expires bigint;
    wall bigint;
    nd numeric;
    ahead numeric;
    over numeric;
    expires bigint;
BEGIN
    IF array_length(a, 1) <> 8 THEN
        RAISE EXCEPTION 'ratekeeper: malformed gcra_one call: % fields, expected 8', array_length(a, 1);
    END IF;
    LOOP
        IF commit_ THEN
            SELECT t.ctid, t.state, t.expires_at INTO rid, st, old_expires
            FROM @schema@.@table@ t WHERE t.key = k FOR UPDATE;
        ELSE
            SELECT t.state INTO st FROM @schema@.@table@ t WHERE t.key = k;
        END IF;
        wall := floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
        nd := coalesce(given, wall)::numeric * d;
        IF st IS NULL OR (st[2] = n AND st[3] = d AND st[4] = a[5]::bigint) THEN
            ahead := greatest(st[1], nd) - nd;  -- greatest skips a NULL (no state: tat = now)
        ELSE
            ahead := @schema@.rk_gcra_tat(st, 1, coalesce(given, wall), n, d, a[5]::bigint) - nd;
        END IF;
        over := ahead + cost::numeric * n - tau;
        IF cost > a[5]::bigint OR (over > 0 AND (a[8] = '' OR div(over + d - 1, d) > nullif(a[8], '')::bigint)) THEN
            RETURN '0,' || ahead;
        END IF;
        IF NOT commit_ OR cost = 0 THEN
            RETURN '1,' || ahead;
        END IF;
        -- Admitted: write tat + cost * n, whole again after cdiv(over + tau, d) µs; the row
        -- lives a second longer (a day by the wall clock when the call gave its now).
        expires := CASE WHEN given IS NULL THEN wall + 1000000 ELSE wall + 86400000000 END
                   + div(over + tau + d - 1, d);  -- over + tau >= 0
        IF rid IS NULL THEN
            INSERT INTO @schema@.@table@ (key, state, leases, expires_at)
            VALUES (k, ARRAY[nd + ahead + cost::numeric * n, n, d, a[5]::numeric], NULL, (expires / 1000000 + 1) * 1000000 + 10000000)
            ON CONFLICT (key) DO NOTHING;
            IF FOUND THEN
                -- A new row: one in 8 also sweeps up to 100 idle ones, so the sweeping keeps
                -- pace with the rows created and a busy key's decisions never sweep.
                IF random() < 1.0 / 8 THEN
                    PERFORM @schema@.@table@_sweep(100);
                END IF;
                EXIT;
            END IF;
            CONTINUE;  -- another call created the row first: decide on it
        END IF;
        -- Never earlier than needed; when it must move, a step (10 s) further (HOT updates).
        UPDATE @schema@.@table@ SET state = ARRAY[nd + ahead + cost::numeric * n, n, d, a[5]::numeric],
            expires_at = CASE WHEN expires <= old_expires THEN old_expires
                              ELSE (expires / 1000000 + 1) * 1000000 + 10000000 END
        WHERE ctid = rid;
        EXIT;
    END LOOP;
    RETURN '1,' || ahead;
END
$$;

-- A charge without a check (Gcra.charge_one per limit), shared with the leaky bucket: tat
-- moves by cost whatever it is, past tau but never past 2 * tau. The reply as for an
-- admission, without retry or delay, each remaining below 0 while in debt.
CREATE OR REPLACE FUNCTION @schema@.rk_gcra_charge(
    st numeric[], now_us bigint, spec bigint[], cost bigint, OUT new_state numeric[], OUT reply bigint[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    cnt int := array_length(spec, 1) / 4;
    n bigint;
    d bigint;
    cap bigint;
    tau bigint;
    nd numeric;
    tat numeric;
    remaining bigint[] := '{}';
    resets bigint[] := '{}';
BEGIN
    new_state := CASE WHEN cost = 0 THEN st ELSE '{}' END;
    FOR i IN 1..cnt LOOP
        n := spec[4 * i - 3];
        d := spec[4 * i - 2];
        cap := spec[4 * i - 1];
        tau := spec[4 * i];
        nd := now_us::numeric * d;
        tat := @schema@.rk_gcra_tat(st, i, now_us, n, d, cap);
        tat := tat + @schema@.rk_debt_charge(
            cost, @schema@.rk_fdiv(tau - tat + nd, n), @schema@.rk_deepest_debt(n, cap, tau)) * n;
        remaining[i] := @schema@.rk_fdiv(tau - tat + nd, n);
        resets[i] := @schema@.rk_cdiv(tat - nd, d);
        IF cost <> 0 THEN
            new_state := new_state || ARRAY[tat, n, d, cap];
        END IF;
    END LOOP;
    reply := ARRAY[1, -1, 0, 0]::bigint[] || remaining || resets;
END
$$;
