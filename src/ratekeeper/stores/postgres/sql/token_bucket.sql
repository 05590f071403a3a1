-- ratekeeper: token bucket (ratekeeper/algorithms/token_bucket.py), as one PL/pgSQL function.
--
-- Parameters (the same for every algorithm function, called by @table@_decide):
--   st        the stored state: per limit (level, last, n, d, capacity), the level in
--             units (a token is n units, the bucket gains d units per µs) after the last
--             refill at last (µs), and the scale it was written at: read under another
--             scale, the level is carried (rk_token_level); NULL when absent (full)
--   ls        lease ids (unused here)
--   now_us    now in µs
--   spec      per limit (n, d, capacity, full) with n/d µs per token, full = capacity * n
--   cost      the cost (>= 0)
--   max_wait  NULL (try_acquire) or µs: a reservation may take tokens that arrive within it
--   lease     the lease id (unused here)
--   refund    false: decide; true: give back cost (reply is NULL)
-- Returns new_state / new_leases (the state to keep) and reply (the wire format's fields:
-- allowed, denied_index, retry_us, delay_us, remaining_1..n, reset_1..n).
-- Same arithmetic as TokenBucket.decide / TokenBucket.refund, step for step (exact integers).

-- How the arithmetic stays exact and cheap: levels are numeric (reservations take a level
-- below zero by up to max_wait * d units, which passes bigint); a quotient is div() of
-- numerics, which truncates: for a > 0, ceil(a / d) = div(a + d - 1, d), and for a >= 0,
-- floor(a / n) = div(a, n) (so max(0, a // n) = greatest(0, div(a, n)) for any a). The
-- refill elapsed >= ceil((full - level) / d) holds exactly when elapsed * d >= full - level,
-- so TokenBucket._level is least(full, level + elapsed * d) once elapsed > 0. A one-limit
-- call (the commonest) takes the fewest statements: each PL/pgSQL expression is prepared
-- again in every transaction, so their number is most of the function's cost.

-- The level of limit i of state st at now, in the units of the spec (n, d, cap): refilled
-- at the scale it was written at, then carried when that differs (TokenBucket._level,
-- carry.carried: the whole tokens still consumed, rounded up, at most cap). A NULL state is full.
CREATE OR REPLACE FUNCTION @schema@.rk_token_carry(st numeric[], i int, now_us bigint, n bigint, d bigint, cap bigint)
RETURNS numeric LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT CASE
    WHEN st[5 * i - 4] IS NULL THEN (cap * n)::numeric
    WHEN st[5 * i - 2] = n AND st[5 * i - 1] = d AND st[5 * i] = cap THEN lvl
    WHEN lvl >= full0 THEN (cap * n)::numeric
    ELSE cap * n - least(@schema@.rk_cdiv(full0 - lvl, st[5 * i - 2]), cap) * n
END
FROM (SELECT st[5 * i] * st[5 * i - 2] AS full0) f,
LATERAL (SELECT CASE WHEN now_us > st[5 * i - 3]
                     THEN least(f.full0, st[5 * i - 4] + (now_us - st[5 * i - 3]) * st[5 * i - 1])
                     ELSE st[5 * i - 4] END AS lvl) l $$;

CREATE OR REPLACE FUNCTION @schema@.rk_token_bucket(
    st numeric[], ls text[], now_us bigint, spec bigint[], cost bigint, max_wait bigint, lease text,
    refund boolean, OUT new_state numeric[], OUT new_leases text[], OUT reply bigint[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    n bigint;
    d bigint;
    full_ bigint;
    level numeric;
    need bigint;
    wait numeric;
BEGIN
    new_leases := ls;
    IF spec[5] IS NULL AND NOT refund THEN
        -- One limit: TokenBucket.compile_one's steps (proven equal to decide).
        n := spec[1];
        d := spec[2];
        full_ := spec[4];
        level := CASE WHEN st IS NULL THEN full_
                      WHEN st[3] <> n OR st[4] <> d OR st[5] <> spec[3]
                          THEN @schema@.rk_token_carry(st, 1, now_us, n, d, spec[3])  -- another scale's
                      WHEN now_us > st[2] THEN least(full_, st[1] + (now_us - st[2]) * d)
                      ELSE st[1] END;
        IF cost > spec[3] THEN
            reply := ARRAY[0, 0, -1, 0, greatest(0, div(level, n)),
                           CASE WHEN level < full_ THEN div(full_ - level + d - 1, d) ELSE 0 END];
            new_state := st;
            RETURN;
        END IF;
        need := cost * n;  -- cost <= capacity: below 2^53
        wait := CASE WHEN level >= need THEN 0 ELSE div(need - level + d - 1, d) END;
        IF wait = 0 OR wait <= max_wait THEN  -- (max_wait NULL: only no wait)
            level := level - need;
            reply := ARRAY[1, -1, 0, wait, greatest(0, div(level, n)),
                           CASE WHEN level < full_ THEN div(full_ - level + d - 1, d) ELSE 0 END];
            -- A clock that stepped back never moves the refill point back (no double refill).
            new_state := CASE WHEN cost = 0 THEN st ELSE ARRAY[level, greatest(now_us, st[2]), n, d, spec[3]] END;
        ELSE
            reply := ARRAY[0, 0, wait, 0, greatest(0, div(level, n)),
                           CASE WHEN level < full_ THEN div(full_ - level + d - 1, d) ELSE 0 END];
            new_state := st;
        END IF;
        RETURN;
    END IF;
    DECLARE
        cnt int := array_length(spec, 1) / 4;
        levels numeric[] := '{}';
        w numeric;
        denied int := -1;
        infinite boolean := false;
        allowed boolean;
        remaining bigint[] := '{}';
        resets bigint[] := '{}';
    BEGIN
        wait := 0;
        IF refund THEN
            IF st IS NULL THEN
                new_state := NULL;
                RETURN;
            END IF;
            new_state := '{}';
            FOR i IN 1..cnt LOOP
                n := spec[4 * i - 3];
                d := spec[4 * i - 2];
                full_ := spec[4 * i];
                level := @schema@.rk_token_carry(st, i, now_us, n, d, spec[4 * i - 1]);
                new_state := new_state || ARRAY[least(full_::numeric, level + cost::numeric * n),
                    greatest(now_us::numeric, st[5 * i - 3]), n, d, spec[4 * i - 1]];
            END LOOP;
            RETURN;
        END IF;
        FOR i IN 1..cnt LOOP
            n := spec[4 * i - 3];
            d := spec[4 * i - 2];
            full_ := spec[4 * i];
            level := @schema@.rk_token_carry(st, i, now_us, n, d, spec[4 * i - 1]);
            levels[i] := level;
            IF cost > spec[4 * i - 1] THEN
                IF NOT infinite THEN
                    infinite := true;
                    denied := i - 1;
                END IF;
                CONTINUE;
            END IF;
            need := cost * n;  -- cost <= capacity: below 2^53
            IF level < need THEN
                w := div(need - level + d - 1, d);
                IF w > wait THEN
                    wait := w;
                    IF NOT infinite THEN
                        denied := i - 1;
                    END IF;
                END IF;
            END IF;
        END LOOP;
        allowed := NOT infinite AND wait <= coalesce(max_wait, 0);
        IF allowed THEN
            denied := -1;
            IF cost <> 0 THEN
                FOR i IN 1..cnt LOOP
                    levels[i] := levels[i] - cost * spec[4 * i - 3];
                END LOOP;
            END IF;
        END IF;
        FOR i IN 1..cnt LOOP
            level := levels[i];
            full_ := spec[4 * i];
            remaining[i] := greatest(0, div(level, spec[4 * i - 3]));
            resets[i] := CASE WHEN level < full_ THEN div(full_ - level + spec[4 * i - 2] - 1, spec[4 * i - 2]) ELSE 0 END;
        END LOOP;
        IF allowed THEN
            reply := ARRAY[1, -1, 0, wait]::bigint[] || remaining || resets;
            IF cost = 0 THEN
                new_state := st;
            ELSE
                new_state := '{}';
                FOR i IN 1..cnt LOOP
                    new_state := new_state || ARRAY[levels[i], greatest(now_us::numeric, st[5 * i - 3]),
                        spec[4 * i - 3], spec[4 * i - 2], spec[4 * i - 1]];
                END LOOP;
            END IF;
        ELSE
            reply := ARRAY[0, denied, CASE WHEN infinite THEN -1 ELSE wait END, 0]::bigint[] || remaining || resets;
            new_state := st;
        END IF;
    END;
END
$$;

-- A charge without a check (TokenBucket.charge_one per limit): the level may go below
-- zero, never below -full. The reply as for an admission, without retry or delay, each
-- remaining below 0 while in debt.
CREATE OR REPLACE FUNCTION @schema@.rk_token_bucket_charge(
    st numeric[], now_us bigint, spec bigint[], cost bigint, OUT new_state numeric[], OUT reply bigint[])
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    cnt int := array_length(spec, 1) / 4;
    n bigint;
    d bigint;
    cap bigint;
    full_ bigint;
    level numeric;
    remaining bigint[] := '{}';
    resets bigint[] := '{}';
BEGIN
    new_state := CASE WHEN cost = 0 THEN st ELSE '{}' END;
    FOR i IN 1..cnt LOOP
        n := spec[4 * i - 3];
        d := spec[4 * i - 2];
        cap := spec[4 * i - 1];
        full_ := spec[4 * i];
        level := @schema@.rk_token_carry(st, i, now_us, n, d, cap);
        level := level - @schema@.rk_debt_charge(
            cost, @schema@.rk_fdiv(level, n), @schema@.rk_deepest_debt(n, cap, full_)) * n;
        remaining[i] := @schema@.rk_fdiv(level, n);
        resets[i] := CASE WHEN level < full_ THEN div(full_ - level + d - 1, d) ELSE 0 END;
        IF cost <> 0 THEN
            new_state := new_state || ARRAY[level, greatest(now_us::numeric, st[5 * i - 3]), n, d, cap];
        END IF;
    END LOOP;
    reply := ARRAY[1, -1, 0, 0]::bigint[] || remaining || resets;
END
$$;
